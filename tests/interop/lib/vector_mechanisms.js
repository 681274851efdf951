// Vector mechanisms (docs/protocol.md §13): the box randomizer with its exact hemisphere coin, the
// l2-ball and PrivUnit randomizers, and the bucketized vector sum around them.
import { doubleToRational, exactHypot, expBelow, reduce } from "./exact.js";
import { Rejected, Unsupported } from "./encoders.js";
import { dot } from "./generators.js";
import { localHash, packWord } from "./oracles.js";

function binomial(n, k) {
  let result = 1n;
  for (let i = 0n; i < BigInt(k); i += 1n) result = (result * (BigInt(n) - i)) / (i + 1n);
  return result;
}

/** §13.1 the box randomizer's constants for dimension d and epsilon. */
export function boxConstants(d, epsilon) {
  const [rn, rd] = expBelow(epsilon).r;
  const E = d % 2 === 0 ? binomial(d, d / 2) : 0n;
  const upper = ((1n << BigInt(d)) - E) / 2n;
  const lower = upper + E;
  const half = Math.ceil(d / 2);
  // B = (r S+ + S-) / ((r - 1) A), A = ceil(d/2) C(d, ceil(d/2)) / d
  const scale = reduce((rn * upper + rd * lower) * BigInt(d), (rn - rd) * BigInt(half) * binomial(d, half));
  return { r: [rn, rd], upper, lower, upperProbability: reduce(rn * upper, rn * upper + rd * lower), scale };
}

function popcount(w) {
  let count = 0;
  for (; w > 0n; w &= w - 1n) count += 1;
  return count;
}

/** §13.1: d sign bits (bit j = coordinate j, 1 meaning +1) of the box randomizer on x. */
export function vectorBox(x, epsilon, stream) {
  const d = x.length;
  for (const xj of x) if (!(xj >= -1 && xj <= 1)) throw new Rejected("a box value must lie in [-1, 1]^d");
  const constants = boxConstants(d, epsilon);
  const { upper, lower, upperProbability } = constants;
  const mask = (1n << BigInt(d)) - 1n;
  let v = 0n;
  x.forEach((xj, j) => {
    let positive;
    if (xj === 1) positive = true;
    else if (xj === -1) positive = false;
    else {
      const { numerator: n, exponent } = doubleToRational(xj);
      const den = 1n << exponent;
      positive = stream.bernoulli(den + n, 2n * den); // the pair as written, unreduced
    }
    if (positive) v |= 1n << BigInt(j);
  });
  const twiceDot = (z) => d - 2 * popcount(z ^ v);
  const withAgreements = (m) => {
    let need = m;
    let z = 0n;
    for (let j = 0; j < d; j += 1) {
      const rem = d - j;
      const agree = need === rem || (need > 0 && stream.bernoulli(BigInt(need), BigInt(rem)));
      const bit = (v >> BigInt(j)) & 1n;
      if (agree) need -= 1;
      z |= (agree ? bit : 1n - bit) << BigInt(j);
    }
    return z;
  };
  let z;
  if (stream.bernoulli(...upperProbability)) {
    z = stream.randbits(d);
    const t = twiceDot(z);
    if (t < 0) z ^= mask;
    else if (t === 0) {
      let k = stream.randbelow(upper);
      let m = d / 2 + 1;
      while (k >= binomial(d, m)) {
        k -= binomial(d, m);
        m += 1;
      }
      z = withAgreements(m);
    }
  } else {
    z = stream.randbits(d);
    if (twiceDot(z) > 0) {
      if (d % 2 === 1) z ^= mask;
      else if (stream.bernoulli(upper, lower)) z ^= mask;
      else z = withAgreements(d / 2);
    }
  }
  return { constants, bits: packWord(z, d) };
}

/** A coin on a double p in [0, 1]: bernoulli(n, 2^e) with p = n / 2^e in lowest terms (§13.0). */
function doubleCoin(stream, p) {
  if (p === 0) return stream.bernoulli(0n, 1n);
  const { numerator, exponent } = doubleToRational(p);
  return stream.bernoulli(numerator, 1n << exponent);
}

/** §13.0 a uniform direction of dimension d: Gaussians, their norm, then a sign coin. */
function uniformDirection(d, stream) {
  for (;;) {
    const g = Array.from({ length: d }, () => stream.gauss());
    const n = exactHypot(g);
    if (n === 0 || !Number.isFinite(n)) continue;
    const flip = stream.bernoulli(1n, 2n);
    return g.map((gj) => (flip ? -(gj / n) : gj / n));
  }
}

/** Gamma((d + 1) / 2) / Gamma(d / 2), by the recurrence R(d + 2) = R(d) (d + 1) / d. */
function gammaRatio(d) {
  let ratio = d % 2 === 1 ? 1 / Math.sqrt(Math.PI) : Math.sqrt(Math.PI) / 2;
  for (let k = d % 2 === 1 ? 1 : 2; k < d; k += 2) ratio *= (k + 1) / k;
  return ratio;
}

/** §13.0's norm-based coin for the ball randomizers: the unit direction the report leans to (x's,
 * or its opposite), or a uniform direction for x = 0. */
function ballTarget(x, stream, what) {
  let norm = exactHypot(x);
  if (!(norm <= 1 + 1e-9)) throw new Rejected(`${what} must have norm <= 1 (+ 1e-9)`);
  norm = Math.min(norm, 1);
  if (norm === 0) return uniformDirection(x.length, stream);
  const s = doubleCoin(stream, (1 + norm) / 2) ? 1 : -1;
  return x.map((xj) => (s * xj) / norm);
}

/** §13.2 the l2-ball randomizer: a unit direction as float32 values. */
export function vectorL2Ball(x, epsilon, stream) {
  const d = x.length;
  const [rn, rd] = expBelow(epsilon).r;
  const nearProbability = reduce(rn, rn + rd);
  const r = Number(rn) / Number(rd);
  const constants = { r: [rn, rd], nearProbability,
    scale: ((r + 1) / (r - 1)) * Math.sqrt(Math.PI) * gammaRatio(d) };
  const target = ballTarget(x, stream, "an l2-ball value");
  let w = uniformDirection(d, stream);
  const h = dot(w, target);
  const firstNonzero = w.find((wj) => wj !== 0);
  if (h < 0 || (h === 0 && firstNonzero < 0)) w = w.map((wj) => -wj);
  if (!stream.bernoulli(...nearProbability)) w = w.map((wj) => -wj);
  return { constants, floats: w.map(Math.fround) };
}

const PAIRS = 16;
const MEMBERS = 2 * PAIRS;

/** The 16-point Gauss-Legendre rule on [-1, 1]: nodes and weights (computed once by Newton). */
const LEGENDRE = (() => {
  const n = 16;
  const nodes = [];
  const weights = [];
  for (let i = 1; i <= n; i += 1) {
    let x = Math.cos((Math.PI * (i - 0.25)) / (n + 0.5));
    let dp = 0;
    for (let iteration = 0; iteration < 100; iteration += 1) {
      let p0 = 1;
      let p1 = x;
      for (let k = 2; k <= n; k += 1) [p0, p1] = [p1, ((2 * k - 1) * x * p1 - (k - 1) * p0) / k];
      dp = (n * (x * p1 - p0)) / (x * x - 1);
      const dx = p1 / dp;
      x -= dx;
      if (Math.abs(dx) < 1e-16) break;
    }
    nodes.push(x);
    weights.push(2 / ((1 - x * x) * dp * dp));
  }
  return { nodes, weights };
})();

/**
 * §5: A_j (j = 1..16), the expected sum of the j largest of 16 independent |t|, t the first
 * coordinate of a uniform direction of the d-sphere. With t = cos(phi) and S(phi) = P(|t| > cos phi)
 * = 2 J(phi) / W (J(phi) the integral of sin^(d-2) from 0 to phi, W its integral over [0, pi]),
 * A_j = integral over phi in [0, pi/2] of sin(phi) E[min(N, j)], N ~ Binomial(16, S(phi)):
 * a smooth integrand, taken by composite 16-point Gauss-Legendre.
 */
export function privunitSums(d) {
  if (d === 1) return Array.from({ length: PAIRS }, (_, i) => i + 1);
  const n = d - 2;
  // J_k(phi) by the recurrence J_k = -sin^(k-1) cos / k + (k - 1) / k J_(k-2), from J_0 = phi and
  // J_1 = 1 - cos.
  const J = (phi) => {
    const sin = Math.sin(phi);
    const cos = Math.cos(phi);
    let value = n % 2 === 0 ? phi : 1 - cos;
    for (let k = n % 2 === 0 ? 2 : 3; k <= n; k += 2) value = -(sin ** (k - 1) * cos) / k + ((k - 1) / k) * value;
    return value;
  };
  const W = 2 * J(Math.PI / 2);
  const binomials = Array.from({ length: PAIRS + 1 }, (_, m) => {
    let c = 1;
    for (let i = 0; i < m; i += 1) c = (c * (PAIRS - i)) / (i + 1);
    return c;
  });
  const sums = new Array(PAIRS).fill(0);
  const panels = 4096;
  const width = Math.PI / 2 / panels;
  for (let panel = 0; panel < panels; panel += 1) {
    const middle = (panel + 0.5) * width;
    LEGENDRE.nodes.forEach((node, q) => {
      const phi = middle + (node * width) / 2;
      const S = Math.min(1, Math.max(0, (2 * J(phi)) / W));
      const weight = (LEGENDRE.weights[q] * width) / 2 * Math.sin(phi);
      let tail = 0; // P(N >= m), from m = 16 down
      const pmf = binomials.map((c, m) => c * S ** m * (1 - S) ** (PAIRS - m));
      const atLeast = new Array(PAIRS + 2).fill(0);
      for (let m = PAIRS; m >= 0; m -= 1) {
        tail += pmf[m];
        atLeast[m] = tail;
      }
      // E[min(N, j)] = sum_{i=1..j} P(N >= i)
      let running = 0;
      for (let j = 1; j <= PAIRS; j += 1) {
        running += atLeast[j];
        sums[j - 1] += weight * running;
      }
    });
  }
  return sums;
}

const privunitCache = new Map();

/** §5: the cap size j, the cap probability (exact) and the scale B of PrivUnit. */
export function privunitConstants(d, epsilon) {
  const key = `${d} ${epsilon}`;
  if (!privunitCache.has(key)) privunitCache.set(key, computePrivunitConstants(d, epsilon));
  return privunitCache.get(key);
}

function computePrivunitConstants(d, epsilon) {
  const [rn, rd] = expBelow(epsilon).r;
  const r = Number(rn) / Number(rd);
  const A = privunitSums(d);
  let best = 1;
  let bestC = -Infinity;
  for (let j = 1; j <= PAIRS; j += 1) {
    const c = (A[j - 1] * (r - 1)) / (r * j + MEMBERS - j);
    if (c > bestC) {
      bestC = c;
      best = j;
    }
  }
  const j = BigInt(best);
  return { r: [rn, rd], capSize: best, members: MEMBERS,
    capProbability: reduce(rn * j, rn * j + rd * (BigInt(MEMBERS) - j)), scale: 1 / bestC };
}

/** §13.3 PrivUnit: a member of a random set of 16 antipodal pairs, as float32 values. */
export function vectorPrivUnit(x, epsilon, stream) {
  const d = x.length;
  const constants = privunitConstants(d, epsilon);
  const target = ballTarget(x, stream, "a PrivUnit value");
  const members = [];
  for (let i = 0; i < PAIRS; i += 1) {
    const V = uniformDirection(d, stream);
    const h = dot(V, target);
    members.push({ number: 2 * i, vector: V, key: h }, { number: 2 * i + 1, vector: V.map((v) => -v), key: -h });
  }
  members.sort((a, b) => (b.key - a.key) || (a.number - b.number));
  const cap = members.slice(0, constants.capSize);
  const rest = members.slice(constants.capSize);
  const side = stream.bernoulli(...constants.capProbability) ? cap : rest;
  const chosen = side[Number(stream.randbelow(BigInt(side.length)))];
  return { constants, floats: chosen.vector.map(Math.fround) };
}

/** §13.4 the bucketized vector on (bucket, v): {seed, bits} (box) or {seed, floats} (l2 ball). */
export function bucketizedVector(mechanism, [bucket, v], stream, assignedSeed = null) {
  const bits = Number(mechanism.bucket_bits);
  if (!(bits >= 0 && bits <= 64)) throw new Rejected("bucket_bits must be in [0, 64]");
  if (BigInt(bucket) >= 1n << BigInt(bits)) throw new Rejected("the bucket must be below 2^bucket_bits");
  const shape = { 1: "L2_BALL", 2: "BOX", 3: "PRIVUNIT" }[mechanism.shape] ?? mechanism.shape;
  if (!["BOX", "L2_BALL", "PRIVUNIT"].includes(shape)) throw new Unsupported(`bucketized vector shape ${shape}`);
  if (v.length !== Number(mechanism.dimension)) throw new Rejected("the vector must have the mechanism's dimension");
  const seed = assignedSeed === null ? stream.randbits(32) : BigInt(assignedSeed);
  const sigma = 1 - 2 * Number(localHash(seed, bucket, 2).bucket);
  if (shape === "BOX") {
    const inner = vectorBox(v.map((x) => sigma * x), mechanism.epsilon, stream);
    return { seed, bits: inner.bits, constants: inner.constants };
  }
  const f = sigma / Math.sqrt(v.length);
  const randomize = shape === "L2_BALL" ? vectorL2Ball : vectorPrivUnit;
  const inner = randomize(v.map((x) => f * x), mechanism.epsilon, stream);
  return { seed, floats: inner.floats, constants: inner.constants };
}
