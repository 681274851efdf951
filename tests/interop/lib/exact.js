// Exact arithmetic on doubles (docs/protocol.md §11.0): a finite double is a rational n / 2^e.

const view = new DataView(new ArrayBuffer(8));

/** A finite double as {numerator, exponent} with value = numerator / 2^exponent, exponent >= 0. */
export function doubleToRational(x) {
  if (!Number.isFinite(x)) throw new RangeError(`not a finite double: ${x}`);
  view.setFloat64(0, x);
  const bits = view.getBigUint64(0);
  const negative = bits >> 63n === 1n;
  const biased = Number((bits >> 52n) & 0x7ffn);
  const fraction = bits & ((1n << 52n) - 1n);
  let mantissa = biased === 0 ? fraction : fraction | (1n << 52n);
  let exponent = (biased === 0 ? 1 : biased) - 1075; // value = mantissa * 2^exponent
  if (negative) mantissa = -mantissa;
  if (exponent >= 0) return { numerator: mantissa << BigInt(exponent), exponent: 0n };
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
