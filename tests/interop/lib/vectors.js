// One checker per vector area: (vector) => void, asserting that this client computes the vector's
// output from its input, or rejects what an error vector's output names.
import assert from "node:assert/strict";
import { compileEncoder } from "./encoders.js";
import { expBelow } from "./exact.js";
import {
  bitwiseRR, discreteLaplace, fmix64, grr, localHash, localHashing, payloadError, poolSeed, seedPool, unaryEncoding,
} from "./oracles.js";
import { packBatch, packPayload, readBatch } from "./packed.js";
import { ByteStream } from "./random.js";
import { encode as msgpack } from "@msgpack/msgpack";
import { drawGroup } from "./device.js";
import { mix64, projectionMatrix, PublicStream } from "./generators.js";
import { Rejected, Unsupported } from "./encoders.js";
import { bucketizedVector, vectorBox, vectorL2Ball, vectorPrivUnit } from "./vector_mechanisms.js";
import { checkedRequirements, missingCapabilities } from "./capabilities.js";
import { clusteringLabeller } from "./results.js";

/**
 * A vector's value in one representation, applied to both sides: integers (and integer strings,
 * bytes as hex included) as BigInt, non-finite doubles from their strings, recursively.
 */
function norm(value) {
  if (Array.isArray(value)) return value.map(norm);
  if (Buffer.isBuffer(value)) return norm(value.toString("hex"));
  if (typeof value === "string") {
    if (/^-?\d+$/.test(value)) return BigInt(value);
    if (["NaN", "Infinity", "-Infinity"].includes(value)) return Number(value);
    return value;
  }
  if (typeof value === "number" && Number.isInteger(value)) return BigInt(value);
  if (typeof value === "boolean") return value ? 1n : 0n;
  if (value !== null && typeof value === "object" && typeof value !== "bigint") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, norm(v)]));
  }
  return value;
}

function same(actual, expected, message) {
  assert.deepEqual(norm(actual), norm(expected), message);
}

/** Encoder areas (§11): input {encoder, points | point} -> output {values} or {error}. */
function encoderChecker({ input, output }) {
  if ("error" in output) {
    assert.throws(() => {
      const encode = compileEncoder(input.encoder);
      if ("point" in input) encode(input.point);
    }, undefined, `must be rejected: ${output.error}`);
    return;
  }
  const encode = compileEncoder(input.encoder);
  input.points.forEach((point, i) => same(encode(point), output.values[i], `point ${JSON.stringify(point)}`));
}

/** §6: the draws of the keyed stream. */
function keyedRngChecker({ input, output }) {
  const stream = ByteStream.keyed(Buffer.from(input.key, "hex"));
  const values = input.draws.map(([draw, arg]) => {
    switch (draw) {
      case "randbits": return stream.randbits(arg);
      case "randbelow": return stream.randbelow(BigInt(arg));
      case "token_bytes": return stream.tokenBytes(arg);
      case "bernoulli": return stream.bernoulli(BigInt(arg[0]), BigInt(arg[1]));
      case "uniform": return stream.uniform();
      default: throw new Error(`unknown draw ${draw}`);
    }
  });
  same(values, output.values);
}

function exactRatioChecker({ input, output }) {
  const { m, s, r } = expBelow(input.x);
  same({ m, s, r }, output);
}

function localHashChecker({ input, output }) {
  if ("fmix64" in input) {
    same(fmix64(BigInt("0x" + input.fmix64)).toString(16).padStart(16, "0"), output.fmix64);
    return;
  }
  const { inner, outer, bucket } = localHash(input.seed, input.value, input.g);
  same({ bucket, inner: inner.toString(16).padStart(16, "0"), outer: outer.toString(16).padStart(16, "0") },
    output);
}

/** An oracle vector: with a key, the mechanism's draws and outputs; with a payload, its rejection. */
function oracleChecker(mechanism, run) {
  return ({ input, output }) => {
    if ("error" in output) {
      const error = payloadError({ [mechanism]: input }, input.payload);
      assert.notEqual(error, null, `must be rejected: ${output.error}`);
      return;
    }
    const stream = ByteStream.keyed(Buffer.from(input.key, "hex"));
    stream.trace = [];
    const got = run(input, stream);
    const expected = { ...output };
    const actual = { draws: stream.trace };
    for (const key of Object.keys(expected)) if (key !== "draws") actual[key] = got[key];
    same(actual, expected);
  };
}

/** A payload of the vectors' JSON (bytes as hex) in the proto loader's form. */
function payloadOf(json) {
  const [which, v] = Object.entries(json)[0];
  const hex = (h) => Buffer.from(h, "hex");
  switch (which) {
    case "bits": return { bits: hex(v) };
    case "signed_vector": return { signed_vector: "bits" in v ? { seed: v.seed, bits: hex(v.bits) } : v };
    default: return { [which]: v };
  }
}

function reportOf(json) {
  return { ...json, report_id: Buffer.from(json.report_id, "hex"), payloads: json.payloads.map(payloadOf) };
}

/** §8.3: payloads and batches both ways, decode-only forms, refused batches, rejected reports. */
function packedChecker({ input, output }) {
  if ("payload" in input) {
    same(Buffer.from(msgpack(packPayload(payloadOf(input.payload)), { useBigInt64: true })), output.msgpack);
  } else if ("reports" in input) {
    const packed = packBatch(input.request_id, input.reports.map(reportOf));
    same(packed, output.packed);
    same(readBatch(packed), input);
  } else if ("error" in output) {
    assert.throws(() => readBatch(Buffer.from(input.packed, "hex")), undefined, `must be refused: ${output.error}`);
  } else {
    const got = readBatch(Buffer.from(input.packed, "hex"));
    assert.equal(got.reports.length, output.reports.length);
    got.reports.forEach((report, k) => {
      if ("error" in output.reports[k]) assert.ok("error" in report, `must be rejected: ${output.reports[k].error}`);
      else same(report, output.reports[k]);
    });
    same(got.request_id, output.request_id);
  }
}

/** §9.2: the group of a device. */
function groupChoiceChecker({ input, output }) {
  const stream = ByteStream.keyed(Buffer.from(input.key, "hex"));
  stream.trace = [];
  same({ draws: stream.trace, group: drawGroup(input.group_weights, stream) }, output);
}

/** §12.4's tolerance on a Gaussian (log and cos are not correctly rounded everywhere). */
const GAUSSIAN_TOLERANCE = 2 ** -44;

function close(actual, expected, tolerance, message) {
  assert.equal(actual.length, expected.length, message);
  actual.forEach((a, i) => assert.ok(Math.abs(a - expected[i]) <= tolerance, `${message}[${i}]: ${a} vs ${expected[i]}`));
}

/** §12.2-§12.5: SplitMix64 words, uniforms, signs, Gaussians and matrices. */
function splitmixChecker({ input, output }) {
  if ("mix64" in input) {
    same(mix64(BigInt(input.mix64)), output.value);
  } else if ("matrix" in input) {
    const rows = Number(input.rows);
    const cols = Number(input.columns);
    let entries;
    if (input.matrix === "projection") {
      entries = projectionMatrix({ input_dimension: cols, output_dimension: rows, seed: input.seed });
    } else {
      const purpose = { hyperplanes: "ldp.hypr", shift: "ldp.shft" }[input.matrix];
      assert.ok(purpose, `unknown matrix ${input.matrix}`);
      entries = new PublicStream(input.seed, purpose).matrix(rows, cols, input.matrix === "shift" ? "uniform" : "gaussian");
    }
    close(entries.flat(), output.entries.flat().map(Number), input.matrix === "hyperplanes" ? GAUSSIAN_TOLERANCE : 0,
      input.matrix);
  } else {
    const stream = new PublicStream(input.seed, input.purpose);
    const count = Number(input.count);
    same(stream.key, output.stream_key);
    same(Array.from({ length: count }, (_, i) => stream.word(i)), output.words);
    same(Array.from({ length: output.uniforms.length }, (_, i) => stream.uniform(i)), output.uniforms);
    same(Array.from({ length: output.signs.length }, (_, i) => stream.sign(i)), output.signs);
    close(Array.from({ length: output.gaussians.length }, (_, i) => stream.gaussian(i)), output.gaussians,
      GAUSSIAN_TOLERANCE, "gaussians");
  }
}

/** §12.6-§12.8 like the other encoders, plus the shift, half-width and bucket bits. */
function lshChecker(vector) {
  encoderChecker(vector);
  const { input, output } = vector;
  if ("error" in output) return;
  const fn = compileEncoder(input.encoder);
  if ("half_width" in output) same(fn.halfWidth, output.half_width);
  if ("shift" in output) same(fn.shift, output.shift);
  if ("bucket_bits" in output) same(fn.bucketBits, output.bucket_bits);
}

const rational = ([n, d]) => `${n}/${d}`;

/** Float reports match within 2^-21 per coordinate (§13.0: Gaussians within §12.4's tolerance). */
const DIRECTION_TOLERANCE = 2 ** -21;

/** §13: the box, l2-ball, PrivUnit and bucketized randomizers' constants and reports. */
function vectorMechanismChecker({ input, output }) {
  const [which, mechanism] = Object.entries(input.mechanism)[0];
  const stream = ByteStream.keyed(Buffer.from(input.key, "hex"));
  const run = () => {
    if (which === "vector_box") return vectorBox(input.value.map(Number), mechanism.epsilon, stream);
    if (which === "vector_l2_ball") return vectorL2Ball(input.value.map(Number), mechanism.epsilon, stream);
    if (which === "vector_privunit") return vectorPrivUnit(input.value.map(Number), mechanism.epsilon, stream);
    if (which === "bucketized_vector") {
      return bucketizedVector(mechanism, [BigInt(input.value[0]), input.value[1].map(Number)], stream);
    }
    throw new Unsupported(`mechanism.${which}`);
  };
  if ("error" in output) {
    let rejected = null;
    try {
      run();
    } catch (error) {
      if (error instanceof Unsupported) throw error;
      rejected = error;
    }
    assert.ok(rejected !== null, `must be rejected: ${output.error}`);
    return;
  }
  const got = run();
  const c = got.constants;
  const { scale, ...exact } = output.constants;
  if ("cap_size" in exact) {
    same({ r: rational(c.r), cap_probability: rational(c.capProbability), cap_size: c.capSize, members: c.members },
      exact);
    assert.ok(Math.abs(c.scale - scale) <= 1e-9 * scale, `scale ${c.scale} vs ${scale}`);
  } else if ("near_probability" in exact) {
    same({ r: rational(c.r), near_probability: rational(c.nearProbability) }, exact);
    assert.ok(Math.abs(c.scale - scale) <= 1e-9 * scale, `scale ${c.scale} vs ${scale}`);
  } else {
    same({ lower_size: c.lower, upper_size: c.upper, r: rational(c.r), upper_probability: rational(c.upperProbability),
      scale_exact: rational(c.scale) }, exact);
    assert.ok(Math.abs(Number(c.scale[0]) / Number(c.scale[1]) - scale) <= 1e-12 * scale);
  }
  if ("floats" in output.report) {
    close(got.floats, output.report.floats, DIRECTION_TOLERANCE, "floats");
    if ("seed" in output.report) same(got.seed, output.report.seed);
  } else {
    same({ bits_hex: got.bits, ...(which === "bucketized_vector" ? { seed: got.seed } : {}) }, output.report);
  }
}

/** §10: required lists derived from round specs, stated lists checked, missing names. */
function capabilitiesChecker({ input, output }) {
  if ("required" in input) {
    same(missingCapabilities(input.required, input.supported), output.missing);
  } else if ("error" in output) {
    assert.throws(() => checkedRequirements(input.round_spec), undefined, `must be refused: ${output.error}`);
  } else {
    same(checkedRequirements(input.round_spec), output.required_capabilities);
  }
}

/**
 * §14: a pool's seeds (with §12's stream state and word), a pooled device's index, seed and report
 * for a keyed stream (assigned seed or none), and what a device declines or a collector rejects.
 */
function localHashingPoolChecker({ input, output }) {
  const { error } = output;
  if (error !== undefined) {
    const m = input.local_hashing;
    assert.throws(() => {
      const pool = seedPool(m);
      if ("report" in input) {
        const rejection = payloadError({ local_hashing: m }, { hashed: input.report });
        if (rejection !== null) throw new Error(rejection);
      } else if ("assigned_seed" in input) {
        localHashing(input.value, m.epsilon, m.hash_range, ByteStream.keyed(Buffer.alloc(32)), input.assigned_seed,
          pool);
      }
    }, undefined, `must be rejected: ${error}`);
    return;
  }
  if ("index" in input) {
    const { state, word, seed } = poolSeed(BigInt(input.seed_pool_key), BigInt(input.index));
    same({ seed, stream_state: state, word }, output);
    return;
  }
  const m = input.local_hashing;
  const o = localHashing(input.value, m.epsilon, m.hash_range, ByteStream.keyed(Buffer.from(input.stream_key, "hex")),
    input.assigned_seed, seedPool(m));
  same({ g: o.g, pool_index: o.poolIndex, report: { seed: o.seed, value: o.value }, seed: o.seed,
    true_bucket: o.bucket }, output);
  // The report is valid for a collector of the same round (§14.5); checked up to 2^16 seeds, as
  // the set of a 2^24-seed pool costs half a minute of BigInt arithmetic here.
  if (BigInt(m.seed_pool_size) <= 1n << 16n) {
    assert.equal(payloadError({ local_hashing: m }, { hashed: { seed: o.seed, value: o.value } }), null);
  }
}

/**
 * §15: a published clustering's labels (and, for a cell map, each point's position in the cells),
 * or the clustering or point a device refuses.
 */
function resultLabelsChecker({ input, output }) {
  if ("error" in output) {
    assert.throws(() => {
      const label = clusteringLabeller(input.clustering);
      if ("point" in input) label(input.point);
    }, Rejected, `must be refused: ${output.error}`);
    return;
  }
  const got = input.points.map(clusteringLabeller(input.clustering));
  const actual = { labels: got.map((g) => g.label) };
  if ("cells" in output) actual.cells = got.map((g) => g.cell);
  same(actual, output);
}

export const CHECKERS = {
  result_labels: resultLabelsChecker,
  capabilities: capabilitiesChecker,
  generator_splitmix: splitmixChecker,
  encoder_lsh: lshChecker,
  mechanism_vector: vectorMechanismChecker,
  packed: packedChecker,
  group_choice: groupChoiceChecker,
  keyed_rng: keyedRngChecker,
  exact_ratio: exactRatioChecker,
  local_hash: localHashChecker,
  local_hashing_pool: localHashingPoolChecker,
  oracle_grr: oracleChecker("grr", (i, s) => {
    const o = grr(i.value, i.domain_size, i.epsilon, s);
    return { p: o.p, q: o.q, ratio: expBelow(i.epsilon).r, payload: { index: o.index } };
  }),
  oracle_unary_encoding: oracleChecker("unary_encoding", (i, s) => {
    const o = unaryEncoding(i.value, i.domain_size, i.epsilon, i.variant, s);
    return { r: o.r, p: o.p, q: o.q, payload: { bits: o.bits } };
  }),
  oracle_local_hashing: oracleChecker("local_hashing", (i, s) => {
    const o = localHashing(i.value, i.epsilon, i.hash_range, s, "seed" in i ? i.seed : null);
    return { g: o.g, p: o.p, ratio: o.r, hashed_bucket: o.bucket, payload: { hashed: { seed: o.seed, value: o.value } } };
  }),
  oracle_bitwise_rr: oracleChecker("bitwise_rr", (i, s) => {
    const o = bitwiseRR(i.bits, i.epsilon, i.sensitivity, s);
    // The whole vector's ratio: r_b to the power s (inputs at Hamming distance s).
    const k = BigInt(i.sensitivity);
    return { r_b: o.rb, ratio: [o.rb[0] ** k, o.rb[1] ** k], p_flip: o.pFlip, payload: { bits: o.bits } };
  }),
  oracle_discrete_laplace: oracleChecker("discrete_laplace", (i, s) => {
    const o = discreteLaplace(i.point, i.epsilon, i.grid_bits, s);
    return { grid: o.grid, scale: o.scale, payload: { integers: o.integers } };
  }),
  encoder_categorical: encoderChecker,
  encoder_uniform_grid: encoderChecker,
  encoder_grid_tree: encoderChecker,
  encoder_cell_list: encoderChecker,
  encoder_bit_vector: encoderChecker,
  encoder_nearest: encoderChecker,
  encoder_vector_maps: encoderChecker,
};
