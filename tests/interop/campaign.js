// Runs one whole campaign against a collector as an operator and a population of devices:
//   node campaign.js PLAN.json  ->  prints {campaign, rounds, outcomes, estimates, result} as JSON
// PLAN: {address, operator_token, config (a CampaignConfig as JSON), points (one per device),
//        seed, transports (["reports"] | ["packed"] | ["reports", "packed"], taken batch by batch), batch}
import crypto from "node:crypto";
import fs from "node:fs";
import { Collector } from "./lib/client.js";
import { Device } from "./lib/device.js";
import { Unsupported } from "./lib/encoders.js";
import { packBatch } from "./lib/packed.js";
import { ByteStream } from "./lib/random.js";

// Exit status when a round needs an encoder or mechanism the client does not implement.
const UNSUPPORTED_EXIT = 3;

const plan = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const collector = new Collector(plan.address, { operatorToken: plan.operator_token });
const batchSize = plan.batch ?? 2000;
const transports = plan.transports ?? ["reports"];

function deviceStream(seed, index) {
  const key = crypto.createHash("sha256").update(`interop device ${seed} ${index}`).digest();
  return ByteStream.keyed(key);
}

async function submit(requestId, reports, transport) {
  if (transport === "packed") return collector.submitPacked(requestId, packBatch(requestId, reports));
  return collector.submitReports(requestId, reports);
}

async function main() {
  const campaign = await collector.createCampaign(plan.config);
  const id = campaign.config.campaign_id;
  const devices = plan.points.map((point, i) => new Device(point, deviceStream(plan.seed, i)));
  const rounds = [];
  const totals = { ACCEPTED: 0, DUPLICATE: 0, REJECTED: 0 };
  const rejections = {};
  let batchNumber = 0;
  for (;;) {
    const { finished, spec } = await collector.getRoundSpec(id);
    if (finished) break;
    const reports = [];
    for (const device of devices) {
      const report = device.participate(spec);
      if (report !== null) reports.push(report);
    }
    for (let start = 0; start < reports.length; start += batchSize) {
      const transport = transports[batchNumber % transports.length];
      const requestId = `interop-${plan.seed}-${spec.round}-${batchNumber}`;
      batchNumber += 1;
      const response = await submit(requestId, reports.slice(start, start + batchSize), transport);
      for (const outcome of response.outcomes) {
        totals[outcome.status] += 1;
        if (outcome.status === "REJECTED") {
          const key = `${outcome.code}: ${outcome.reason}`;
          rejections[key] = (rejections[key] ?? 0) + 1;
        }
      }
    }
    rounds.push({ round: spec.round, kind: spec.kind, reports: reports.length, tasks: spec.tasks });
    await collector.closeRound(id, spec.round);
  }
  const { result } = await collector.getOperatorResult(id);
  let estimates = null;
  if (result.estimates === null && plan.config.kind === "HISTOGRAM") {
    estimates = await collector.getEstimates(id);
  }
  return { campaign_id: id, rounds, outcomes: totals, rejections, estimates, result };
}

main()
  .then((output) => {
    process.stdout.write(JSON.stringify(output, (key, value) => (value instanceof Buffer
      ? value.toString("hex") : typeof value === "bigint" ? value.toString() : value)));
    collector.close();
  })
  .catch((error) => {
    collector.close();
    if (error instanceof Unsupported) {
      // The device declines a round it cannot run; the driver reports the campaign as skipped.
      process.stderr.write(`unsupported by this client: ${error.message}\n`);
      process.exit(UNSUPPORTED_EXIT);
    }
    process.stderr.write(`${error.stack}\n${error.fieldViolations ? JSON.stringify(error.fieldViolations) : ""}\n`);
    process.exit(1);
  });
