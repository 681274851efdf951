// Exact arithmetic (docs/protocol.md §7.1, §11.0): doubles as rationals n / 2^e, the stand-in r
// for e^x, fractions in lowest terms.

const view = new DataView(new ArrayBuffer(8));

/** A finite double as {numerator, exponent} with value = numerator / 2^exponent, exponent >= 0. */
export function doubleToRational(x) {
  if (!Number.isFinite(x)) throw new RangeError(`not a finite double: ${x}`);
  if (x === 0) return { numerator: 0n, exponent: 0n }; // 0 / 1 (and -0)
  view.setFloat64(0, x);
  const bits = view.getBigUint64(0);
  const negative = bits >> 63n === 1n;
  const biased = Number((bits >> 52n) & 0x7ffn);
  const fraction = bits & ((1n << 52n) - 1n);
  let mantissa = biased === 0 ? fraction : fraction | (1n << 52n);
  let exponent = (biased === 0 ? 1 : biased) - 1075; // value = mantissa * 2^exponent
  if (negative) mantissa = -mantissa;
  if (exponent >= 0) return { numerator: mantissa << BigInt(exponent), exponent: 0n };
  // Lowest terms: strip the common factors of two.
  while (exponent < 0 && (mantissa & 1n) === 0n && mantissa !== 0n) {
    mantissa >>= 1n;
    exponent += 1;
  }
  return { numerator: mantissa, exponent: BigInt(-exponent) };
}

/** A finite double as an integer multiple of 2^-1074 (exact for every finite double). */
function scaled(x) {
  const { numerator, exponent } = doubleToRational(x);
  return numerator << (1074n - exponent);
}

/** Sign of |x - a|^2 - |x - b|^2, exactly. */
export function exactSquaredDistanceCompare(x, a, b) {
  let da = 0n;
  let db = 0n;
  for (let j = 0; j < x.length; j += 1) {
    const xj = scaled(x[j]);
    const ea = xj - scaled(a[j]);
    const eb = xj - scaled(b[j]);
    da += ea * ea;
    db += eb * eb;
  }
  return da < db ? -1 : da > db ? 1 : 0;
}

export function gcd(a, b) {
  a = a < 0n ? -a : a;
  b = b < 0n ? -b : b;
  while (b !== 0n) [a, b] = [b, a % b];
  return a;
}

/** [num, den] in lowest terms. */
export function reduce(num, den) {
  const g = gcd(num, den);
  return g === 0n ? [num, den] : [num / g, den / g];
}

/**
 * floor(e^x * 2^s) for a double x >= 0, exactly: the Taylor series of e^x (x = n / 2^e) in integer
 * fixed point with P fractional bits, each term floored (so the sum is low by less than one unit
 * per term); P grows until the floor is decided.
 */
function floorExpScaled(x, s) {
  const { numerator: n, exponent: e } = doubleToRational(x);
  for (let extra = 128n; ; extra *= 2n) {
    const P = e + extra;
    const one = 1n << P;
    let term = one; // x^k / k! * 2^P, floored
    let sum = one;
    let terms = 1n;
    for (let k = 1n; term > 0n; k += 1n) {
      term = (term * n) / ((1n << e) * k);
      sum += term;
      terms += 1n;
    }
    // The true value lies in [sum, sum + terms] (floors lose < 1 each; the tail after the first
    // zero term is below 1 for these x since the terms decrease geometrically there).
    const shift = P - BigInt(s);
    const low = sum >> shift;
    const high = (sum + terms + 1n) >> shift;
    if (low === high) return low;
  }
}

const LN2 = Math.LN2; // the double nearest ln 2, 0x1.62e42fefa39efp-1

/** §7.1 exp_below(x) = m / 2^s for a double x in [0, 20]: {m, s, r: [num, den] in lowest terms}. */
export function expBelow(x) {
  if (!(x >= 0 && x <= 20)) throw new RangeError(`exp_below needs x in [0, 20], got ${x}`);
  const s = Math.max(0, 47 - Math.trunc(x / LN2));
  let m = floorExpScaled(x, s) - 1n;
  const floor = 1n << BigInt(s);
  if (m < floor) m = floor;
  return { m, s, r: reduce(m, floor) };
}

const bits64 = new DataView(new ArrayBuffer(8));

/** The next double above (step 1) or below (step -1) a finite double x >= 0. */
function adjacent(x, step) {
  if (x === 0) return step > 0 ? Number.MIN_VALUE : 0;
  bits64.setFloat64(0, x);
  bits64.setBigUint64(0, bits64.getBigUint64(0) + BigInt(step));
  return bits64.getFloat64(0);
}

/** A finite double as [numerator, exponent] over the common denominator 2^1074. */
function over1074(x) {
  const { numerator, exponent } = doubleToRational(x);
  return numerator << (1074n - exponent);
}

/**
 * The correctly rounded Euclidean norm (round to nearest, ties to even), as Python's math.hypot
 * gives it; JavaScript's Math.hypot is not correctly rounded (it can be one ulp off), and §13.0
 * takes a coin on the norm, whose denominator decides how many random bits it consumes.
 */
export function exactHypot(x) {
  // S = sum of the squares, exactly, over 2^2148.
  const S = x.reduce((sum, xj) => sum + over1074(xj) ** 2n, 0n);
  // q^2 compared with S for q a midpoint (a + b) / 2 of two doubles: ((a + b) 2^1074 / 2)^2 vs S,
  // both over 2^2148; multiply by 4 to stay in integers.
  const above = (a, b) => 4n * S > (over1074(a) + over1074(b)) ** 2n; // sqrt(S) beyond the midpoint
  const equal = (a, b) => 4n * S === (over1074(a) + over1074(b)) ** 2n;
  let q = Math.hypot(...x);
  while (above(q, adjacent(q, 1))) q = adjacent(q, 1);
  while (q > 0 && !above(adjacent(q, -1), q) && !equal(adjacent(q, -1), q)) q = adjacent(q, -1);
  // On an exact tie between q and the double below, ties go to the even mantissa.
  if (q > 0 && equal(adjacent(q, -1), q)) {
    bits64.setFloat64(0, q);
    if (bits64.getBigUint64(0) & 1n) q = adjacent(q, -1);
  }
  return q;
}

/**
 * Whether the correctly rounded sum of doubles is at most 1: the exact sum is at most
 * 1 + 2^-53 (the midpoint between 1 and the next double, which rounds to 1, the even one).
 */
export function exactSumAtMostOne(values) {
  const sum = values.reduce((acc, v) => acc + over1074(v), 0n);
  return sum <= (1n << 1074n) + (1n << 1021n);
}
