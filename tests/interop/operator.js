// The operator and error-model checks against a live collector (docs/errors.md):
//   node operator.js ADDRESS OPERATOR_TOKEN   -> exits 0 when every check holds, prints what it saw
// Health, authentication, ErrorInfo reasons in the ldp.v1 domain, BadRequest field paths, the
// per-report rejection codes of SubmitReports and SubmitPacked, and idempotent resends.
import assert from "node:assert/strict";
import crypto from "node:crypto";
import { Collector, DOMAIN, RpcFailure } from "./lib/client.js";
import { packBatch } from "./lib/packed.js";

const [address, token] = process.argv.slice(2);
const operator = new Collector(address, { operatorToken: token });
const anonymous = new Collector(address);
const seen = {};

async function failure(call) {
  try {
    await call();
  } catch (error) {
    if (error instanceof RpcFailure) return error;
    throw error;
  }
  assert.fail("the call succeeded");
}

/** docs/errors.md §2: one ErrorInfo in the ldp.v1 domain with the reason, and the status code. */
function expectReason(error, codeName, reason) {
  assert.equal(error.codeName, codeName, error.message);
  assert.equal(error.errorInfos.filter((info) => info.domain === DOMAIN).length, 1);
  assert.equal(error.reason, reason);
  // §5: words any implementation can produce, no language's notation.
  assert.doesNotMatch(error.details, /b'|\\x|tuple|dict|NoneType|Error\b/);
  seen[reason] = error.details;
}

async function main() {
  const health = await operator.healthCheck("ldp.v1.DeviceService");
  assert.equal(health.status, "SERVING");

  expectReason(await failure(() => anonymous.getCampaign("nope")), "UNAUTHENTICATED", "UNAUTHENTICATED");
  expectReason(await failure(() => operator.getCampaign("no-such-campaign")), "NOT_FOUND", "CAMPAIGN_NOT_FOUND");

  // §3: a configuration error names the field under config.
  const bad = await failure(() => operator.createCampaign({ kind: "HISTOGRAM", domain: { categorical_size: "8" },
    epsilon: -1, histogram: {} }));
  expectReason(bad, "INVALID_ARGUMENT", "INVALID_CAMPAIGN_CONFIG");
  assert.equal(bad.fieldViolations.length, 1);
  assert.equal(bad.fieldViolations[0].field, "config.epsilon");

  const campaign = await operator.createCampaign({ kind: "HISTOGRAM", domain: { categorical_size: "8" }, epsilon: 1,
    histogram: { oracle: "GRR" } });
  const id = campaign.config.campaign_id;
  const { spec } = await operator.getRoundSpec(id);
  const report = (index, round = spec.round) => ({ report_id: crypto.randomBytes(16), campaign_id: id, round, group: 0,
    payloads: [{ index: String(index) }] });

  // §3: an empty request id is refused with its field path.
  const empty = await failure(() => operator.submitReports("", [report(1)]));
  expectReason(empty, "INVALID_ARGUMENT", "INVALID_ARGUMENT");
  assert.equal(empty.fieldViolations[0].field, "request_id");

  // §4: one outcome per report, a RejectionCode for each rejected one, over both encodings.
  const good = report(1);
  for (const [transport, submit] of [["reports", (r, b) => operator.submitReports(r, b)],
    ["packed", (r, b) => operator.submitPacked(r, packBatch(r, b))]]) {
    const batch = transport === "reports" ? [good, report(8), report(2, spec.round + 7)] : [report(3), report(9)];
    const requestId = `operator-checks-${transport}-${id}`;
    const response = await submit(requestId, batch);
    const codes = response.outcomes.map((o) => [o.status, o.code]);
    seen[`outcomes ${transport}`] = codes;
    assert.deepEqual(codes[0], ["ACCEPTED", "REJECTION_CODE_UNSPECIFIED"]);
    assert.deepEqual(codes[1], ["REJECTED", "REJECTION_CODE_INVALID_PAYLOAD"]);
    if (transport === "reports") assert.deepEqual(codes[2], ["REJECTED", "REJECTION_CODE_ROUND_NOT_OPEN"]);
    for (const outcome of response.outcomes) assert.doesNotMatch(outcome.reason, /b'|\\x|tuple/);
    // §8.6: the same batch again gets the first answer.
    const again = await submit(requestId, batch);
    assert.deepEqual(again.outcomes.map((o) => [o.status, o.code]), codes);
  }
  // §8.6: a report id seen before is a duplicate, in a new batch too.
  const dup = await operator.submitReports(`operator-checks-dup-${id}`, [good]);
  assert.equal(dup.outcomes[0].status, "DUPLICATE");

  expectReason(await failure(() => operator.closeRound(id, spec.round + 1)), "FAILED_PRECONDITION", "ROUND_MISMATCH");
  expectReason(await failure(() => operator.getEstimates(id)), "FAILED_PRECONDITION", "NO_ESTIMATES");
  await operator.closeRound(id, spec.round);
  const estimates = await operator.getEstimates(id);
  assert.equal(Number(estimates.reports), 2);
  return seen;
}

main()
  .then((result) => {
    process.stdout.write(JSON.stringify(result, null, 1));
    operator.close();
    anonymous.close();
  })
  .catch((error) => {
    process.stderr.write(`${error.stack}\n`);
    operator.close();
    anonymous.close();
    process.exit(1);
  });
