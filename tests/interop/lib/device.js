// A device: picks its group once per campaign, answers each round's task for its group with one
// payload per component, keeps its own budget, and builds the report (reports.proto).
import crypto from "node:crypto";
import { encode, Unsupported } from "./encoders.js";
import { bitwiseRR, discreteLaplace, grr, localHashing, seedPool, unaryEncoding } from "./oracles.js";
import { bucketizedVector, vectorBox, vectorL2Ball, vectorPrivUnit } from "./vector_mechanisms.js";
import { checkedRequirements, missingCapabilities, SUPPORTED } from "./capabilities.js";

const required = new WeakMap(); // spec -> the capabilities it requires

/**
 * §10.2-§10.3: throws Unsupported (the device declines, before anything is charged) when the spec
 * requires a capability the device lacks, and an Error when its stated list is not the derived one.
 */
export function checkCapabilities(spec, supported = SUPPORTED) {
  if (!required.has(spec)) required.set(spec, checkedRequirements(spec));
  const missing = missingCapabilities(required.get(spec), supported);
  if (missing.length > 0) throw new Unsupported(`capabilities ${missing.join(",")}`);
}

/** MechanismSpec member name -> (mechanism, encoded value, stream, assigned seed) -> Payload. */
export const MECHANISMS = {
  grr: (m, value, stream) => ({ index: grr(value, m.domain_size, m.epsilon, stream).index.toString() }),
  unary_encoding: (m, value, stream) => ({
    bits: unaryEncoding(value, m.domain_size, m.epsilon, m.variant, stream).bits,
  }),
  local_hashing: (m, value, stream, seed) => {
    // §14: a round's public seed pool (none when seed_pool_size is 0); an invalid one throws: declined.
    const o = localHashing(value, m.epsilon, m.hash_range, stream, seed, seedPool(m));
    return { hashed: { seed: o.seed.toString(), value: Number(o.value) } };
  },
  bitwise_rr: (m, bits, stream) => ({ bits: bitwiseRR(bits, m.epsilon, m.sensitivity, stream).bits }),
  vector_box: (m, x, stream) => ({ bits: vectorBox(x, m.epsilon, stream).bits }),
  vector_l2_ball: (m, x, stream) => ({ floats: { values: vectorL2Ball(x, m.epsilon, stream).floats } }),
  vector_privunit: (m, x, stream) => ({ floats: { values: vectorPrivUnit(x, m.epsilon, stream).floats } }),
  bucketized_vector: (m, value, stream, seed) => {
    const o = bucketizedVector(m, value, stream, seed);
    const inner = o.bits !== undefined ? { bits: o.bits } : { floats: { values: o.floats } };
    return { signed_vector: { seed: Number(o.seed), ...inner } };
  },
  discrete_laplace: (m, point, stream) => ({
    integers: { values: discreteLaplace(point, m.epsilon, m.grid_bits, stream).integers.map(String) },
  }),
};

function epsilonOf(mechanismSpec) {
  return mechanismSpec[mechanismSpec.mechanism].epsilon;
}

/**
 * §9.2: the group, drawn once per campaign: a single group is group 0 (nothing drawn); otherwise
 * u = randbelow(sum of weights) and the first g whose cumulative weight exceeds u.
 */
export function drawGroup(weights, stream) {
  if (weights.length <= 1) return 0;
  const u = stream.randbelow(weights.reduce((a, w) => a + BigInt(w), 0n));
  let cumulative = 0n;
  for (let g = 0; g < weights.length; g += 1) {
    cumulative += BigInt(weights[g]);
    if (u < cumulative) return g;
  }
  throw new Error("unreachable");
}

export class Device {
  /** A device holding `point`, drawing from `stream`, able to run the `capabilities` it states. */
  constructor(point, stream, capabilities = SUPPORTED) {
    this.point = point;
    this.stream = stream;
    this.capabilities = capabilities;
    this.groups = new Map(); // campaign id -> group
    this.spent = new Map(); // campaign id -> {epsilon, reports, rounds: Set}
  }

  /**
   * The report for `spec`, or null when the device's group has no task this round, the device
   * already answered it, or the round would exceed the campaign's budget. Throws Unsupported when
   * the task needs an encoder or mechanism this client does not implement.
   */
  participate(spec) {
    checkCapabilities(spec, this.capabilities);
    const campaign = spec.campaign_id;
    if (!this.groups.has(campaign)) this.groups.set(campaign, drawGroup(spec.group_weights, this.stream));
    const group = this.groups.get(campaign);
    const task = spec.tasks.find((t) => t.groups.includes(group));
    if (task === undefined) return null;
    const ledger = this.spent.get(campaign) ?? { epsilon: 0, reports: 0, rounds: new Set() };
    if (ledger.rounds.has(spec.round)) return null;
    const epsilon = task.components.reduce((sum, c) => sum + epsilonOf(c.mechanism), 0);
    // A small relative slack: the collector splits the budget in floating point.
    if (ledger.epsilon + epsilon > spec.campaign_epsilon * (1 + 1e-9)) return null;
    if (ledger.reports + 1 > spec.max_reports_per_device) return null;
    const payloads = task.components.map((component) => {
      const mechanism = component.mechanism.mechanism;
      const randomize = MECHANISMS[mechanism];
      if (randomize === undefined) throw new Unsupported(`mechanism ${mechanism}`);
      const value = encode(component.encoder, this.point);
      return randomize(component.mechanism[mechanism], value, this.stream, null);
    });
    ledger.epsilon += epsilon;
    ledger.reports += 1;
    ledger.rounds.add(spec.round);
    this.spent.set(campaign, ledger);
    return {
      // Report ids are deduplicated across all campaigns of a collector (docs/protocol.md §8): they
      // come from the OS CSPRNG, never from a seeded stream that another campaign may replay.
      report_id: crypto.randomBytes(16),
      campaign_id: campaign,
      round: spec.round,
      group,
      payloads,
    };
  }
}
