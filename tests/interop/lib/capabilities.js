// Capabilities (docs/protocol.md §10): what a round requires, what this client supports, and the
// device's decision to decline a round before anything is charged or sent.
import { Unsupported } from "./encoders.js";

const SHAPES = { L2_BALL: "mechanism.vector_l2_ball", 1: "mechanism.vector_l2_ball", BOX: "mechanism.vector_box",
  2: "mechanism.vector_box", PRIVUNIT: "mechanism.vector_privunit", 3: "mechanism.vector_privunit" };
const BUCKET_ENCODERS = { simhash: "encoder.simhash", shifted_grid: "encoder.shifted_grid",
  nearest: "encoder.nearest_candidate" };
const NAME = /^[a-z][a-z0-9_]*\.[a-z][a-z0-9_.]*$/;

/** The capabilities this client implements (§10.1 names). */
export const SUPPORTED = [
  "encoder.categorical", "encoder.uniform_grid", "encoder.grid_tree", "encoder.cell_list", "encoder.simhash",
  "encoder.shifted_grid", "encoder.nearest_candidate", "encoder.bit_vector", "encoder.unit_cube",
  "encoder.symmetric_box", "encoder.unit_ball", "encoder.bucketed_vector", "encoder.random_projection",
  "mechanism.grr", "mechanism.unary_encoding", "mechanism.local_hashing", "mechanism.local_hashing.seed_pool",
  "mechanism.bitwise_rr",
  "mechanism.discrete_laplace", "mechanism.vector_l2_ball", "mechanism.vector_box", "mechanism.vector_privunit",
  "mechanism.bucketized_vector",
];

/** The oneof member set in a message as the proto loader gives it, or as plain JSON `{member: ...}`. */
function member(message, oneof) {
  const which = typeof message[oneof] === "string" ? message[oneof]
    : Object.keys(message).find((k) => message[k] !== null && message[k] !== undefined && k !== oneof);
  // §9.3: a oneof member added after this client does not parse: the spec cannot be run.
  if (which === undefined) throw new Unsupported(`an ${oneof} this client does not know`);
  return which;
}

const present = (value) => value !== null && value !== undefined;

/** §10.2: the sorted set of capabilities a RoundSpec requires. */
export function requiredCapabilities(spec) {
  const names = new Set();
  for (const task of spec.tasks ?? []) {
    for (const component of task.components) {
      const which = member(component.encoder, "encoder");
      const encoder = component.encoder[which];
      names.add(`encoder.${which}`);
      if (which === "bucketed_vector") {
        for (const [field, name] of Object.entries(BUCKET_ENCODERS)) if (present(encoder[field])) names.add(name);
      }
      const nested = which === "bucketed_vector"
        ? Object.keys(BUCKET_ENCODERS).map((field) => encoder[field]).filter(present) : [encoder];
      for (const inner of nested) if (present(inner.projection)) names.add("encoder.random_projection");
      const mechanism = member(component.mechanism, "mechanism");
      names.add(`mechanism.${mechanism}`);
      // §10.2 rule 5: local hashing from a public seed pool (§14).
      if (mechanism === "local_hashing" && Number(component.mechanism[mechanism].seed_pool_size ?? 0) > 0) {
        names.add("mechanism.local_hashing.seed_pool");
      }
      if (mechanism === "bucketized_vector") {
        const shape = SHAPES[component.mechanism[mechanism].shape];
        if (shape === undefined) throw new Unsupported(`bucketized vector shape ${component.mechanism[mechanism].shape}`);
        names.add(shape);
      }
    }
  }
  return [...names].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
}

/** §10.2: the spec's stated list, checked against the derived one; the required set. */
export function checkedRequirements(spec) {
  const stated = spec.required_capabilities ?? [];
  for (const name of stated) if (!NAME.test(name) || name.length > 64) throw new Error(`malformed capability ${name}`);
  if (new Set(stated).size !== stated.length) throw new Error("a capability is listed twice");
  const derived = requiredCapabilities(spec);
  if (stated.length > 0) {
    const same = stated.length === derived.length && derived.every((name) => stated.includes(name));
    if (!same) throw new Error("the stated list differs from the tasks'");
  }
  return derived;
}

/** §10.3: the required names a device with `supported` lacks, sorted. */
export function missingCapabilities(required, supported = SUPPORTED) {
  return required.filter((name) => !supported.includes(name)).sort();
}
