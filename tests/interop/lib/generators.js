// Public generators (docs/protocol.md §12): SplitMix64 in counter mode, and the projections,
// SimHash hyperplanes and grid shifts drawn from it.
const MASK64 = (1n << 64n) - 1n;
const GOLDEN = 0x9e3779b97f4a7c15n;

/** §12.2 SplitMix64's finalizer. */
export function mix64(z) {
  z &= MASK64;
  z ^= z >> 30n;
  z = (z * 0xbf58476d1ce4e5b9n) & MASK64;
  z ^= z >> 27n;
  z = (z * 0x94d049bb133111ebn) & MASK64;
  return z ^ (z >> 31n);
}

/** The 8 ASCII bytes of a purpose tag as a big-endian integer. */
export function purposeValue(purpose) {
  return BigInt("0x" + Buffer.from(purpose, "ascii").toString("hex"));
}

/** §12.2-§12.4: the stream of (seed, purpose): words, uniforms, signs, Gaussians by index. */
export class PublicStream {
  constructor(seed, purpose) {
    this.key = mix64((BigInt(seed) ^ purposeValue(purpose)) & MASK64);
  }

  word(i) {
    return mix64((this.key + (BigInt(i) + 1n) * GOLDEN) & MASK64);
  }

  uniform(i) {
    return Number(this.word(i) >> 11n) * 2 ** -53;
  }

  sign(i) {
    return (this.word(Math.floor(i / 64)) >> BigInt(i % 64)) & 1n ? -1 : 1;
  }

  gaussian(i) {
    const u1 = 1 - this.uniform(2 * i);
    const u2 = this.uniform(2 * i + 1);
    return Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2);
  }

  /** §12.5: a rows x cols matrix, entry (r, c) the value number r * cols + c of `kind`. */
  matrix(rows, cols, kind) {
    return Array.from({ length: rows }, (_, r) => Array.from({ length: cols }, (_, c) => this[kind](r * cols + c)));
  }
}

/** §12.5 <a, b> left to right, one rounding per step. */
export function dot(a, b) {
  let acc = 0;
  for (let i = 0; i < a.length; i += 1) acc += a[i] * b[i];
  return acc;
}

/** §12.5 the k x d projection P of a RandomProjection, or null without one. */
export function projectionMatrix(projection) {
  const d = Number(projection.input_dimension);
  const k = Number(projection.output_dimension);
  if (!(d >= 1 && d <= 4096 && k >= 1 && k <= 4096 && d * k <= 2 ** 20)) {
    throw new RangeError("a projection needs 1 <= d, k <= 4096 and d * k <= 2^20");
  }
  const s = 1 / Math.sqrt(k);
  return new PublicStream(projection.seed, "ldp.proj").matrix(k, d, "sign").map((row) => row.map((x) => x * s));
}
