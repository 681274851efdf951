// Encoders: pure functions of the point and the public parameters (docs/protocol.md §11).

/** The point clamped into the domain and normalized to [0, 1] per dimension. */
export function normalize(domain, point) {
  return domain.lower.map((lo, j) => {
    const hi = domain.upper[j];
    const x = Math.min(Math.max(point[j], lo), hi);
    return (x - lo) / (hi - lo);
  });
}

/** Cell of a normalized coordinate among `cells` equal cells; the upper bound is in the last one. */
function cellOf(t, cells) {
  return Math.min(Math.floor(t * cells), cells - 1);
}

/** UniformGridEncoder: row-major cell index, last dimension fastest. */
export function uniformGrid(encoder, point) {
  const t = normalize(encoder.domain, point);
  let index = 0n;
  encoder.cells_per_dimension.forEach((cells, j) => {
    index = index * BigInt(cells) + BigInt(cellOf(t[j], cells));
  });
  return index;
}

/** The encoders this client implements: EncoderSpec member name -> (encoder, point) -> value. */
export const ENCODERS = {
  categorical: (encoder, point) => BigInt(Array.isArray(point) ? point[0] : point),
  uniform_grid: uniformGrid,
};

export function encode(encoderSpec, point) {
  const which = encoderSpec.encoder;
  const implementation = ENCODERS[which];
  if (implementation === undefined) {
    throw new Unsupported(`encoder ${which}`);
  }
  return implementation(encoderSpec[which], point);
}

/** A part of a RoundSpec this client cannot run: the device declines the round. */
export class Unsupported extends Error {}
