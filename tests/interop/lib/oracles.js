// Frequency oracles and the bit-vector randomizer, the device half (docs/protocol.md §7), and the
// payload checks a collector MUST make. Every privacy coin is exact: bernoulli(a, b) with a / b in
// lowest terms, over r = exp_below(x) (§7.1).
import { Unsupported } from "./encoders.js";
import { doubleToRational as rationalOf, expBelow, gcd, reduce } from "./exact.js";
import { PublicStream } from "./generators.js";

/** Bernoulli(P) of §7.1: the draw bernoulli(a, b) with a / b = P in lowest terms. */
function coin(stream, [num, den]) {
  const [a, b] = reduce(num, den);
  return stream.bernoulli(a, b);
}

const ratios = new Map();

/** [num, den] of r = exp_below(x) (cached: the same epsilon serves every report of a round). */
function ratio(x) {
  if (!ratios.has(x)) ratios.set(x, expBelow(x).r);
  return ratios.get(x);
}

function bitlen(w) {
  return w === 0n ? 0 : w.toString(2).length;
}

/** popcount(w) < 4, counting no further than needed (w may have a million bits). */
function fewerThanFourOnes(w) {
  let count = 0;
  for (; w > 0n && count < 4; w &= w - 1n) count += 1;
  return count < 4;
}

/** §7.7 BernoulliMask(n, num/den): an n-bit integer of independent Bernoulli(num/den) coins. */
export function bernoulliMask(stream, n, [num0, den0]) {
  const [num, den] = reduce(num0, den0);
  if (n === 0) return 0n;
  let ones = 0n;
  let undecided = (1n << BigInt(n)) - 1n;
  let rem = num;
  const rounds = bitlen(BigInt(n)) + 2;
  for (let round = 0; round < rounds; round += 1) {
    if (fewerThanFourOnes(undecided)) break;
    const low = BigInt(bitlen(undecided & -undecided) - 1);
    const digits = stream.randbits(bitlen(undecided) - Number(low)) << low;
    rem *= 2n;
    if (rem >= den) {
      rem -= den;
      ones |= undecided & ~digits;
      undecided &= digits;
    } else {
      undecided &= ~digits;
    }
  }
  for (let i = 0n; undecided >> i > 0n; i += 1n) {
    if ((undecided >> i) & 1n && stream.bernoulli(rem, den)) ones |= 1n << i;
  }
  return ones;
}

/** §7.1: bits i of the integer `word` packed little-endian, ceil(n / 8) bytes. */
export function packWord(word, n) {
  const out = Buffer.alloc(Math.ceil(n / 8));
  for (let i = 0; i < out.length; i += 1) out[i] = Number((word >> BigInt(8 * i)) & 0xffn);
  return out;
}

export function packBits(bits) {
  return packWord(bits.reduce((w, bit, i) => (bit ? w | (1n << BigInt(i)) : w), 0n), bits.length);
}

function unpackWord(bytes) {
  let word = 0n;
  for (let i = bytes.length - 1; i >= 0; i -= 1) word = (word << 8n) | BigInt(bytes[i]);
  return word;
}

/** §7.2 GRR: {p, q, index}. */
export function grr(value, domainSize, epsilon, stream) {
  const D = BigInt(domainSize);
  const v = BigInt(value);
  const [rn, rd] = ratio(epsilon);
  // r / (r + D - 1) = rn / (rn + (D - 1) rd)
  const p = reduce(rn, rn + (D - 1n) * rd);
  const q = reduce(rd, rn + (D - 1n) * rd);
  if (coin(stream, p)) return { p, q, index: v };
  const u = stream.randbelow(D - 1n);
  return { p, q, index: u < v ? u : u + 1n };
}

/** §7.3 unary encoding: {r, p, q, bits}. */
export function unaryEncoding(value, domainSize, epsilon, variant, stream) {
  const D = Number(domainSize);
  const v = BigInt(value);
  let r;
  let p;
  if (variant === "SYMMETRIC" || variant === 1) {
    r = ratio(epsilon / 2);
    p = reduce(r[0], r[0] + r[1]);
  } else if (variant === "OPTIMIZED" || variant === 2) {
    r = ratio(epsilon);
    p = [1n, 2n];
  } else {
    throw new Unsupported(`unary encoding variant ${variant}`); // §9.3: an enum value it does not know
  }
  const q = reduce(r[1], r[0] + r[1]);
  const mask = bernoulliMask(stream, D - 1, q);
  const truth = coin(stream, p) ? 1n : 0n;
  const below = mask & ((1n << v) - 1n);
  const word = below | (truth << v) | ((mask >> v) << (v + 1n));
  return { r, p, q, bits: packWord(word, D) };
}

const MASK64 = (1n << 64n) - 1n;

/** §7.4 fmix64, the 64-bit finalizer of MurmurHash3. */
export function fmix64(k) {
  k ^= k >> 33n;
  k = (k * 0xff51afd7ed558ccdn) & MASK64;
  k ^= k >> 33n;
  k = (k * 0xc4ceb9fe1a85ec53n) & MASK64;
  return k ^ (k >> 33n);
}

/** §7.4 H(seed, v, g) with its intermediate words. */
export function localHash(seed, v, g) {
  const inner = fmix64((BigInt(v) + 0x9e3779b97f4a7c15n) & MASK64);
  const outer = fmix64(inner ^ BigInt(seed));
  return { inner, outer, bucket: outer % BigInt(g) };
}

/** §7.4 the number of buckets g and p. */
export function localHashingParameters(epsilon, hashRange) {
  const [rn, rd] = ratio(epsilon);
  let g = BigInt(hashRange);
  // floor(r + 1/2) = floor((2 rn + rd) / (2 rd))
  if (g === 0n) g = (2n * rn + rd) / (2n * rd) + 1n;
  if (g < 2n) g = 2n;
  return { r: [rn, rd], g, p: reduce(rn, rn + (g - 1n) * rd) };
}

const SEED_LIMIT = 1n << 32n; // §7.4: seeds are 32-bit
const POOL_LIMIT = 1n << 24n; // §14.1: the largest pool a device accepts
const POOL_PURPOSE = "ldp.pool"; // §14.2: the pool's purpose tag

/**
 * §14.1: the public seed pool {size, key} of a LocalHashing (size 0: no pool, §7's fresh seeds).
 * Throws (the device declines the round) on S above 2^24, a key outside [0, 2^64), or a key
 * without a pool.
 */
export function seedPool(m) {
  const size = BigInt(m.seed_pool_size ?? 0);
  const key = BigInt(m.seed_pool_key ?? 0);
  if (size < 0n || size > POOL_LIMIT) throw new RangeError(`seed_pool_size must be in [0, 2^24], got ${size}`);
  if (key < 0n || key >= 1n << 64n) throw new RangeError(`seed_pool_key must be in [0, 2^64), got ${key}`);
  if (size === 0n && key !== 0n) throw new RangeError(`seed_pool_key must be 0 without a pool, got ${key}`);
  return { size, key };
}

/**
 * §14.2: seed_j of the pool with key K, with the words it comes from: state = mix64(K XOR
 * "ldp.pool") and word_j are exactly §12's public stream (K, "ldp.pool"), seed_j its top 32 bits.
 */
export function poolSeed(key, index) {
  const stream = new PublicStream(key, POOL_PURPOSE);
  const word = stream.word(index);
  return { state: stream.key, word, seed: word >> 32n };
}

const poolSeedSets = new Map();

/** §14.5: the set of the S seeds of a pool (cached: one pool serves every report of a round). */
function poolSeeds({ size, key }) {
  const id = `${size}:${key}`;
  if (!poolSeedSets.has(id)) {
    const stream = new PublicStream(key, POOL_PURPOSE);
    const seeds = new Set();
    for (let j = 0; j < Number(size); j += 1) seeds.add(stream.word(j) >> 32n);
    poolSeedSets.set(id, seeds);
  }
  return poolSeedSets.get(id);
}

/**
 * §7.4 local hashing, and §14.3 with a seed pool {size, key} (size 0: none): {g, p, seed, bucket,
 * value}, and poolIndex j with a pool. An assigned seed a (enrolment) replaces the seed draw: the
 * seed itself without a pool, seed_(a mod S) with one.
 */
export function localHashing(value, epsilon, hashRange, stream, assignedSeed = null, pool = { size: 0n, key: 0n }) {
  const { r, g, p } = localHashingParameters(epsilon, hashRange);
  const assigned = assignedSeed === null ? null : BigInt(assignedSeed);
  if (assigned !== null && (assigned < 0n || assigned >= SEED_LIMIT)) {
    throw new RangeError(`an assigned hash seed must be in [0, 2^32), got ${assigned}`);
  }
  let seed;
  let poolIndex = null;
  if (pool.size === 0n) {
    seed = assigned ?? stream.randbits(32);
  } else {
    // §14.3 step 1: randbelow(S) in place of randbits(32); an assignment fixes j without a draw.
    poolIndex = assigned === null ? stream.randbelow(pool.size) : assigned % pool.size;
    seed = poolSeed(pool.key, poolIndex).seed;
  }
  const h = localHash(seed, value, g).bucket;
  let y = h;
  if (!coin(stream, p)) {
    const u = stream.randbelow(g - 1n);
    y = u < h ? u : u + 1n;
  }
  return { r, g, p, seed, poolIndex, bucket: h, value: y };
}

/** §7.5 bitwise randomized response on L bits (an array of 0/1): {r_b, p_flip, bits}. */
export function bitwiseRR(bits, epsilon, sensitivity, stream) {
  const rb = ratio(epsilon / Number(sensitivity));
  const pFlip = reduce(rb[1], rb[0] + rb[1]);
  const x = bits.reduce((w, bit, i) => (bit ? w | (1n << BigInt(i)) : w), 0n);
  const flips = bernoulliMask(stream, bits.length, pFlip);
  return { rb, pFlip, bits: packWord(x ^ flips, bits.length) };
}

/** §7.6 BernExp(a, b): true with probability exp(-a / b). */
function bernExp(stream, a, b) {
  let k = 1n;
  for (;;) {
    if (a >= b * k) k += 1n;
    else if (a === 0n) break;
    else if (stream.bernoulli(a, b * k)) k += 1n;
    else break;
  }
  return k % 2n === 1n;
}

/** §7.6 DLap(t, s): Canonne, Kamath and Steinke's discrete Laplace sampler, exact coins. */
function discreteLaplaceNoise(stream, t, s) {
  for (;;) {
    const u = stream.randbelow(t);
    const g = u === 0n ? t : gcd(u, t);
    if (!bernExp(stream, u / g, t / g)) continue;
    let v = 0n;
    while (bernExp(stream, 1n, 1n)) v += 1n;
    const Y = (u + t * v) / s;
    const negative = stream.bernoulli(1n, 2n);
    if (negative && Y === 0n) continue;
    return negative ? -Y : Y;
  }
}

/** §7.6 discrete Laplace on a point of [0, 1]^d: {grid, scale, integers}. */
export function discreteLaplace(point, epsilon, gridBits, stream) {
  const d = BigInt(point.length);
  const N = 2 ** Number(gridBits);
  // round half to even of an exact product
  const grid = point.map((x) => {
    const y = x * N;
    const f = Math.floor(y);
    const diff = y - f;
    return BigInt(diff > 0.5 || (diff === 0.5 && f % 2 !== 0) ? f + 1 : f);
  });
  // lambda = d N / epsilon, epsilon = en / 2^ee exactly
  const { numerator: en, exponent: ee } = rationalOf(epsilon);
  const [t, s] = reduce(d * BigInt(N) * (1n << ee), en);
  const integers = grid.map((z) => z + discreteLaplaceNoise(stream, t, s));
  return { grid, scale: [t, s], integers };
}

/** The payload checks a collector MUST make (§7.2-§7.6); a message for the first rule broken. */
export function payloadError(mechanismSpec, payload) {
  const which = mechanismSpec.mechanism ?? Object.keys(mechanismSpec)[0];
  const m = mechanismSpec[which];
  const bytesOf = (hex) => (typeof hex === "string" ? Buffer.from(hex, "hex") : hex);
  const checkBits = (n) => {
    if (payload.bits === undefined || payload.bits === null) return "bits expected";
    const bytes = bytesOf(payload.bits);
    if (bytes.length !== Math.ceil(n / 8)) return `payload must be ${Math.ceil(n / 8)} bytes`;
    if (unpackWord(bytes) >> BigInt(n) !== 0n) return "padding bits must be zero";
    return null;
  };
  switch (which) {
    case "grr": {
      if (payload.index === undefined || payload.index === null) return "index expected";
      return BigInt(payload.index) < BigInt(m.domain_size) ? null : "index outside [0, D)";
    }
    case "unary_encoding":
      return checkBits(Number(m.domain_size));
    case "bitwise_rr":
      return checkBits(Number(m.length));
    case "local_hashing": {
      const h = payload.hashed;
      if (h === undefined || h === null) return "hashed expected";
      if (BigInt(h.seed) >= SEED_LIMIT) return "seed must be in [0, 2^32)";
      const { g } = localHashingParameters(m.epsilon, m.hash_range);
      if (BigInt(h.value) >= g) return "bucket outside [0, g)";
      // §14.5: a pooled round's report carries one of the pool's S seeds.
      const pool = seedPool(m);
      if (pool.size > 0n && !poolSeeds(pool).has(BigInt(h.seed))) return "seed is not one of the pool's seeds";
      return null;
    }
    case "discrete_laplace": {
      const values = Array.isArray(payload.integers) ? payload.integers : payload.integers?.values;
      if (!Array.isArray(values)) return "integers expected";
      if (values.length !== Number(m.dimension)) return "wrong number of integers";
      // §7.6: every value is a signed 64-bit integer.
      const outside = values.some((v) => BigInt(v) < -(2n ** 63n) || BigInt(v) >= 2n ** 63n);
      return outside ? "integer outside the signed 64-bit range" : null;
    }
    default:
      return `no payload check for ${which}`;
  }
}
