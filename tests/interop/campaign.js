// Runs one whole campaign against a collector as an operator and a population of devices:
//   node campaign.js PLAN.json  ->  prints {campaign, rounds, outcomes, estimates, result} as JSON
// PLAN: {address, operator_token, config (a CampaignConfig as JSON) or config_from (the id of a
//        campaign whose stored configuration to copy), points (one per device), seed, transports
//        (["reports"] | ["packed"] | ["reports", "packed"], taken batch by batch), batch,
//        label_campaigns (ids of finished clustering campaigns to label the points with, too),
//        capabilities (what the devices state they run, docs/protocol.md §10; default: all the client has)}
// A clustering result labels every point as a device labels itself from the published result
// (docs/protocol.md §15: its cell map, or its nearest center, unclamped); "labels" maps each
// campaign id to the points' labels.
import crypto from "node:crypto";
import fs from "node:fs";
import { SUPPORTED } from "./lib/capabilities.js";
import { Collector } from "./lib/client.js";
import { Device } from "./lib/device.js";
import { Unsupported } from "./lib/encoders.js";
import { packBatch } from "./lib/packed.js";
import { ByteStream } from "./lib/random.js";
import { resultLabeller } from "./lib/results.js";

// Exit status when a round needs an encoder or mechanism the client does not implement.
const UNSUPPORTED_EXIT = 3;

const plan = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const capabilities = plan.capabilities ?? SUPPORTED;
const collector = new Collector(plan.address, { operatorToken: plan.operator_token, capabilities });
const batchSize = plan.batch ?? 2000;
const transports = plan.transports ?? ["reports"];

/** The population's random bytes: one seeded stream the devices draw from in turn (reproducible). */
function populationStream(seed) {
  return ByteStream.simulation(crypto.createHash("sha256").update(`interop population ${seed}`).digest());
}

async function submit(requestId, reports, transport) {
  if (transport === "packed") return collector.submitPacked(requestId, packBatch(requestId, reports));
  return collector.submitReports(requestId, reports);
}

/**
 * The cluster label of every point under a finished campaign's result, as a device labels itself
 * (docs/protocol.md §15; null: the result gives no labels).
 */
async function labelsOf(campaignId) {
  const { result } = await collector.getOperatorResult(campaignId);
  const label = resultLabeller(result);
  return label === null ? null : plan.points.map((point) => label(point).label);
}

/** A stored configuration as a new campaign's: the same everything but the id. */
async function configOf(campaignId) {
  const { config } = await collector.getCampaign(campaignId);
  return { ...config, campaign_id: "" };
}

async function main() {
  const config = plan.config_from ? await configOf(plan.config_from) : plan.config;
  const campaign = await collector.createCampaign(config);
  const id = campaign.config.campaign_id;
  const stream = populationStream(plan.seed);
  const devices = plan.points.map((point) => new Device(point, stream, capabilities));
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
      // A request id is the idempotency key of a batch across the collector (docs/protocol.md §8):
      // unique per campaign, round and batch.
      const requestId = `${id}-${spec.round}-${batchNumber}`;
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
  if (result.estimates === null && config.kind === "HISTOGRAM") {
    estimates = await collector.getEstimates(id);
  }
  const labels = {};
  for (const campaignId of [id, ...(plan.label_campaigns ?? [])]) labels[campaignId] = await labelsOf(campaignId);
  return { campaign_id: id, config, rounds, outcomes: totals, rejections, estimates, result, labels };
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
