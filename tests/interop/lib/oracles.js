// Frequency oracles and the bit-vector randomizer: the device half only (docs/protocol.md §7).
// Every privacy coin is an exact rational coin, randbelow(den) < num, over e^x taken as the
// largest 48-bit dyadic rational not above it (docs/protocol.md §5: "as for every mechanism").

const DYADIC_BITS = 48n;
const ONE = 1n << DYADIC_BITS;

/** floor(e^x * 2^48): e^x as the numerator of a 48-bit dyadic rational. */
export function expNumerator(x) {
  return BigInt(Math.floor(Math.exp(x) * Number(ONE)));
}

/** GRR over {0..k-1}: the true value with p = r / (r + k - 1), else one of the k - 1 others uniformly. */
export function grr(value, k, epsilon, stream) {
  k = BigInt(k);
  value = BigInt(value);
  const r = expNumerator(epsilon);
  if (stream.bernoulli(r, r + (k - 1n) * ONE)) return value;
  const other = stream.randbelow(k - 1n);
  return other >= value ? other + 1n : other;
}

/** Packed little-endian bits: bit i is (byte[i >> 3] >> (i & 7)) & 1 (reports.proto Payload.bits). */
export function packBits(bits) {
  const out = Buffer.alloc(Math.ceil(bits.length / 8));
  bits.forEach((bit, i) => {
    if (bit) out[i >> 3] |= 1 << (i & 7);
  });
  return out;
}

export function unpackBits(bytes, length) {
  return Array.from({ length }, (_, i) => (bytes[i >> 3] >> (i & 7)) & 1);
}

/**
 * Unary encoding over {0..k-1}: bit v kept at 1 with probability p, every other bit set with
 * probability q (mechanisms.proto UnaryEncoding: SYMMETRIC p = e^(eps/2)/(e^(eps/2)+1), q = 1 - p;
 * OPTIMIZED p = 1/2, q = 1/(e^eps + 1)).
 */
export function unaryEncoding(value, k, epsilon, variant, stream) {
  value = Number(value);
  let p;
  let q;
  if (variant === "SYMMETRIC") {
    const r = expNumerator(epsilon / 2);
    p = stream.coin(r, r + ONE);
    q = stream.coin(ONE, r + ONE);
  } else if (variant === "OPTIMIZED") {
    const r = expNumerator(epsilon);
    p = stream.coin(1n, 2n);
    q = stream.coin(ONE, r + ONE);
  } else {
    throw new Error(`unary encoding variant ${variant} is not known to this client`);
  }
  const out = Buffer.alloc(Math.ceil(Number(k) / 8));
  for (let i = 0; i < Number(k); i += 1) {
    if (i === value ? p() : q()) out[i >> 3] |= 1 << (i & 7);
  }
  return out;
}

/**
 * Bitwise randomized response: every bit flipped with probability 1 / (e^(eps / sensitivity) + 1),
 * so vectors at Hamming distance <= sensitivity are eps-indistinguishable.
 */
export function bitwiseRR(bits, epsilon, sensitivity, stream) {
  const r = expNumerator(epsilon / sensitivity);
  return packBits(bits.map((bit) => (stream.bernoulli(ONE, r + ONE) ? 1 - bit : bit)));
}
