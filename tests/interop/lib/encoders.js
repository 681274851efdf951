// Encoders: pure functions of the point and the public parameters (docs/protocol.md §11).
// `compileEncoder(spec)` validates an EncoderSpec once (an invalid one throws: the device declines
// the round) and returns the point -> value function.
import { doubleToRational, exactHypot, exactSquaredDistanceCompare, exactSumAtMostOne } from "./exact.js";
import { dot, projectionMatrix, PublicStream } from "./generators.js";

/** A part of a RoundSpec this client cannot run: the device declines the round. */
export class Unsupported extends Error {}

/** A RoundSpec or point the device MUST reject (docs/protocol.md §11.0). */
export class Rejected extends Error {}

function check(condition, message) {
  if (!condition) throw new Rejected(message);
}

/** A double of the proto or of a vector's JSON ("NaN", "Infinity", "-Infinity" as strings). */
export function double(value) {
  return typeof value === "string" ? Number(value) : value;
}

const TWO64 = 1n << 64n;

/** §11.2: the domain's bounds, checked. */
export function numericDomain(domain) {
  check(domain !== null && domain !== undefined, "a numeric encoder needs a domain");
  const lower = domain.lower.map(double);
  const upper = domain.upper.map(double);
  check(lower.length === upper.length, "lower and upper must have the same length");
  check(lower.length >= 1 && lower.length <= 4096, "a domain has 1 to 4096 dimensions");
  const extent = [];
  for (let j = 0; j < lower.length; j += 1) {
    check(Number.isFinite(lower[j]) && Number.isFinite(upper[j]), "domain bounds must be finite");
    check(lower[j] < upper[j], "every domain dimension needs lower < upper");
    extent.push(upper[j] - lower[j]);
    check(Number.isFinite(extent[j]), "upper - lower must be finite in binary64");
  }
  return { lower, upper, extent, d: lower.length };
}

/** §11.2: a point of d finite doubles. */
export function checkPoint(domain, point) {
  check(Array.isArray(point) && point.length === domain.d, "a point must have the domain's dimension");
  const x = point.map(double);
  for (const value of x) check(Number.isFinite(value), "a NaN or infinite coordinate is rejected, not clamped");
  return x;
}

/** §11.2: the clamped point in the domain's units. */
export function clamp(domain, x) {
  return x.map((v, j) => (v < domain.lower[j] ? domain.lower[j] : v > domain.upper[j] ? domain.upper[j] : v));
}

/** §11.2: t_j = fl(fl(x_j - lower_j) / fl(upper_j - lower_j)) on the unclamped x, then into [0, 1]. */
export function normalize(domain, x) {
  return x.map((v, j) => {
    const t = (v - domain.lower[j]) / domain.extent[j];
    return t < 0 ? 0 : t > 1 ? 1 : t;
  });
}

/** §11.3: min(floor(t * m), m - 1), the floor taken exactly on the double t. */
function exactCell(t, m) {
  const { numerator, exponent } = doubleToRational(t); // t = numerator / 2^exponent
  const cell = (numerator * m) >> exponent;
  return cell < m - 1n ? cell : m - 1n;
}

/** §11.4: Morton index; bit b of c_j is bit b * d + j. */
export function morton(coordinates, level) {
  const d = coordinates.length;
  let index = 0n;
  for (let b = 0; b < level; b += 1) {
    for (let j = 0; j < d; j += 1) {
      if ((coordinates[j] >> BigInt(b)) & 1n) index |= 1n << BigInt(b * d + j);
    }
  }
  return index;
}

function treeCoordinates(t, level) {
  const side = 1n << BigInt(level);
  return t.map((tj) => exactCell(tj, side));
}

function categorical(encoder) {
  const size = BigInt(encoder.domain_size);
  check(size >= 1n, "domain_size must be >= 1");
  check(size < TWO64, "domain_size must be < 2^64");
  return (point) => {
    const v = Array.isArray(point) ? point[0] : point;
    check(typeof v === "bigint" || Number.isInteger(typeof v === "string" ? Number(v) : v),
      "a category must be an integer");
    const value = BigInt(v);
    check(value >= 0n && value < size, "a category outside [0, domain_size) is rejected, not clamped");
    return value;
  };
}

function uniformGrid(encoder) {
  const domain = numericDomain(encoder.domain);
  const cells = encoder.cells_per_dimension.map(BigInt);
  check(cells.length === domain.d, "one cells_per_dimension entry per domain dimension");
  for (const m of cells) check(m >= 1n && m < 1n << 32n, "cells_per_dimension entries must be >= 1");
  check(cells.reduce((a, m) => a * m, 1n) <= TWO64, "the product of cells_per_dimension must be at most 2^64");
  return (point) => {
    const t = normalize(domain, checkPoint(domain, point));
    return t.reduce((index, tj, j) => index * cells[j] + exactCell(tj, cells[j]), 0n);
  };
}

function gridTree(encoder) {
  const domain = numericDomain(encoder.domain);
  const level = Number(encoder.level);
  check(level * domain.d <= 64, "level * dimension must be at most 64");
  return (point) => morton(treeCoordinates(normalize(domain, checkPoint(domain, point)), level), level);
}

/**
 * The position in `cells` (valid TreeCells, none inside another) of the listed cell that holds a
 * point (§11.5's rule), or -1 where no listed cell holds it; and the list's level sizes.
 */
function cellLocator(domain, cells) {
  const d = BigInt(domain.d);
  const byLevel = new Map(); // level -> Map(morton index -> position)
  let deepest = 0;
  for (const [position, cell] of cells.entries()) {
    const level = Number(cell.level);
    const index = BigInt(cell.morton_index);
    check(BigInt(level) * d <= 64n, "level * dimension must be at most 64");
    check(index < 1n << (BigInt(level) * d), "a level-l cell's morton_index must be below 2^(l d)");
    if (!byLevel.has(level)) byLevel.set(level, new Map());
    check(!byLevel.get(level).has(index), "a cell must not repeat");
    byLevel.get(level).set(index, position);
    deepest = Math.max(deepest, level);
  }
  const levels = [...byLevel.keys()].sort((a, b) => a - b);
  const locate = (point) => {
    const c = morton(treeCoordinates(normalize(domain, checkPoint(domain, point)), deepest), deepest);
    for (const level of levels) {
      const position = byLevel.get(level).get(c >> (BigInt(deepest - level) * d));
      if (position !== undefined) return position;
    }
    return -1;
  };
  return { locate, byLevel, levels, deepest, d };
}

/**
 * §11.5: the position in `cells` of the listed cell holding a point, after checking that the cells
 * are 1 to 2^20 valid TreeCells that partition the normalized box (else Rejected).
 */
export function cellListLocator(domain, cells) {
  check(cells.length >= 1 && cells.length <= 1 << 20, "a cell list holds 1 to 2^20 cells");
  const { locate, byLevel, levels, deepest, d } = cellLocator(domain, cells);
  // A partition: no cell inside another, and the volumes 2^(-level d) sum to exactly 1.
  for (const [i, level] of levels.entries()) {
    for (const index of byLevel.get(level).keys()) {
      for (const coarser of levels.slice(0, i)) {
        check(!byLevel.get(coarser).has(index >> (BigInt(level - coarser) * d)),
          "cells must not overlap (a cell contains another)");
      }
    }
  }
  const volume = levels.reduce((sum, level) => sum + BigInt(byLevel.get(level).size)
    * (1n << (BigInt(deepest - level) * d)), 0n);
  check(volume === 1n << (BigInt(deepest) * d), "the cells must cover the normalized box");
  return locate;
}

function cellList(encoder) {
  const locate = cellListLocator(numericDomain(encoder.domain), encoder.cells);
  return (point) => BigInt(locate(point));
}

function bitVector(encoder) {
  const domain = numericDomain(encoder.domain);
  const pivots = encoder.pivots.map(double);
  const counts = encoder.pivots_per_attribute.map(Number);
  const halfWidths = encoder.half_widths.map(double);
  check(counts.length === domain.d && halfWidths.length === domain.d, "one count and half-width per dimension");
  for (const count of counts) check(count >= 0 && count <= 256, "at most 256 pivots per attribute");
  check(counts.reduce((a, b) => a + b, 0) === pivots.length, "pivots_per_attribute must sum to len(pivots)");
  check(pivots.length >= 1 && pivots.length <= 1 << 16, "the vector has 1 to 2^16 bits");
  for (const w of halfWidths) check(Number.isFinite(w) && w > 0, "half_widths must be > 0");
  for (const p of pivots) check(Number.isFinite(p), "pivots must be finite");
  const attribute = counts.flatMap((count, j) => Array(count).fill(j));
  return (point) => {
    const x = clamp(domain, checkPoint(domain, point));
    return pivots.map((p, i) => (Math.abs(x[attribute[i]] - p) <= halfWidths[attribute[i]] ? 1 : 0));
  };
}

/**
 * §11.7's centers: n >= 1 rows of d finite doubles, row-major, at most 2^22 values (else
 * Rejected); the rows.
 */
export function centerRows(values, d) {
  check(Number.isInteger(d) && d >= 1 && d <= 4096, "a center has 1 to 4096 coordinates");
  check(values.length > 0, "at least one candidate");
  check(values.length <= 1 << 22, "at most 2^22 center coordinates");
  check(values.length % d === 0, "centers must hold a positive multiple of dimension values");
  const doubles = values.map(double);
  for (const v of doubles) check(Number.isFinite(v), "centers must be finite");
  return Array.from({ length: doubles.length / d }, (_, i) => doubles.slice(i * d, i * d + d));
}

/**
 * §11.7: the index of the center nearest to x (d doubles) by exact squared Euclidean distance,
 * the lowest index among exact ties.
 */
export function nearestIndex(centers, x) {
  // Rounded distances first; the candidates within a relative 2^-38 of the nearest (wider than
  // the rounding error of a d-term sum of squares) are decided exactly, as §11.7 allows.
  const rounded = centers.map((c) => c.reduce((sum, cj, j) => sum + (x[j] - cj) * (x[j] - cj), 0));
  // A loop, not Math.min(...rounded): 2^22 arguments overflow the call stack.
  const nearest = rounded.reduce((a, b) => (b < a ? b : a), Infinity);
  const close = rounded.flatMap((r, i) => (r <= nearest * (1 + 2 ** -38) || !Number.isFinite(r) ? [i] : []));
  let best = close[0];
  for (const i of close.slice(1)) {
    if (exactSquaredDistanceCompare(x, centers[i], centers[best]) < 0) best = i;
  }
  return best;
}

function nearestCandidate(encoder) {
  const domain = numericDomain(encoder.domain);
  const d = Number(encoder.dimension);
  check(d === domain.d, "dimension must equal the domain's dimension");
  const centers = centerRows(encoder.centers, d);
  return (point) => BigInt(nearestIndex(centers, clamp(domain, checkPoint(domain, point))));
}

function unitCube(encoder) {
  const domain = numericDomain(encoder.domain);
  return (point) => normalize(domain, checkPoint(domain, point));
}

function symmetricBox(encoder) {
  const domain = numericDomain(encoder.domain);
  return (point) => normalize(domain, checkPoint(domain, point)).map((t) => 2 * t - 1);
}

/**
 * §11.8: (2t - 1) * fl(1 / sqrt(d)), scaled by 1 - 2^-52 until all three measured norms are at most
 * 1: the correctly rounded norm, the correctly rounded sum of the rounded squares, and their
 * left-to-right sum.
 */
function unitBall(encoder) {
  const domain = numericDomain(encoder.domain);
  const s = 1 / Math.sqrt(domain.d);
  const inside = (u) => {
    const squares = u.map((c) => c * c);
    return exactHypot(u) <= 1 && exactSumAtMostOne(squares) && dot(u, u) <= 1;
  };
  return (point) => {
    let v = normalize(domain, checkPoint(domain, point)).map((t) => (2 * t - 1) * s);
    while (!inside(v)) v = v.map((c) => c * (1 - 2 ** -52));
    return v;
  };
}

/** §12.6: the centred point y, projected when the encoder has a projection; z and its k. */
function projected(encoder, domain) {
  const projection = encoder.projection ?? null;
  let P = null;
  if (projection !== null) {
    check(Number(projection.input_dimension) === domain.d, "the projection's input_dimension must be the domain's");
    P = projectionMatrix(projection);
  }
  const k = P === null ? domain.d : P.length;
  const z = (point) => {
    const y = normalize(domain, checkPoint(domain, point)).map((t) => 2 * t - 1);
    return P === null ? y : P.map((row) => dot(row, y));
  };
  return { z, k, d: domain.d, hasProjection: P !== null };
}

function simhash(encoder) {
  const domain = numericDomain(encoder.domain);
  const b = Number(encoder.bits);
  check(b >= 1 && b <= 64, "bits must be in [1, 64]");
  const { z, k } = projected(encoder, domain);
  const G = new PublicStream(encoder.seed, "ldp.hypr").matrix(b, k, "gaussian");
  return (point) => {
    const zz = z(point);
    return G.reduce((value, row) => (value << 1n) | (dot(row, zz) >= 0 ? 1n : 0n), 0n);
  };
}

function shiftedGrid(encoder) {
  const domain = numericDomain(encoder.domain);
  const level = Number(encoder.level);
  const { z, k, d, hasProjection } = projected(encoder, domain);
  check(level * k <= 64, "level * k must be at most 64");
  const R = hasProjection
    ? Math.min(d / Math.sqrt(k), Math.sqrt((2 * d * Math.log((2 * k) / 2 ** -20)) / k))
    : 1;
  const stream = new PublicStream(encoder.seed, "ldp.shft");
  const shift = Array.from({ length: k }, (_, r) => stream.uniform(r));
  const side = 2 ** level;
  const fn = (point) => {
    const coordinates = z(point).map((zr, r) => {
      let u = (zr + R) / (2 * R);
      u = u < 0 ? 0 : u > 1 ? 1 : u;
      return BigInt(Math.min(Math.floor((u + shift[r]) * 0.5 * side), side - 1));
    });
    return morton(coordinates, level);
  };
  fn.halfWidth = R;
  fn.shift = shift;
  return fn;
}

function sameDomain(a, b) {
  const same = (x, y) => x.length === y.length && x.every((v, i) => double(v) === double(y[i]));
  return a !== null && a !== undefined && same(a.lower, b.lower) && same(a.upper, b.upper);
}

/** §12.8: (bucket, v) with v = (2 t - 1, 1); the bucket from exactly one inner encoder. */
function bucketedVector(encoder) {
  const domain = numericDomain(encoder.domain);
  check(domain.d <= 4095, "a bucketed vector has at most 4095 dimensions");
  const inner = ["simhash", "shifted_grid", "nearest"].filter((key) => encoder[key] !== undefined && encoder[key] !== null);
  check(inner.length === 1, "exactly one of simhash, shifted_grid and nearest");
  const which = inner[0];
  check(sameDomain(encoder[which].domain, encoder.domain), "the bucket encoder's domain must equal the domain");
  const make = { simhash, shifted_grid: shiftedGrid, nearest: nearestCandidate }[which];
  const bucket = make(encoder[which]);
  let bits;
  if (which === "simhash") bits = Number(encoder.simhash.bits);
  else if (which === "shifted_grid") bits = Number(encoder.shifted_grid.level) * projected(encoder.shifted_grid, domain).k;
  else bits = Math.max(1, (encoder.nearest.centers.length / Number(encoder.nearest.dimension) - 1).toString(2).length);
  const fn = (point) => {
    const v = normalize(domain, checkPoint(domain, point)).map((t) => 2 * t - 1);
    return [bucket(point), [...v, 1]];
  };
  fn.bucketBits = bits;
  return fn;
}

/** The encoders this client implements: EncoderSpec member name -> compile(encoder). */
export const ENCODERS = {
  categorical,
  uniform_grid: uniformGrid,
  grid_tree: gridTree,
  cell_list: cellList,
  bit_vector: bitVector,
  nearest_candidate: nearestCandidate,
  unit_cube: unitCube,
  symmetric_box: symmetricBox,
  unit_ball: unitBall,
  simhash,
  shifted_grid: shiftedGrid,
  bucketed_vector: bucketedVector,
};

const compiled = new WeakMap();

/** The point -> value function of an EncoderSpec (`{encoder: name, [name]: fields}` or `{name: fields}`). */
export function compileEncoder(encoderSpec) {
  if (compiled.has(encoderSpec)) return compiled.get(encoderSpec);
  const which = encoderSpec.encoder ?? Object.keys(encoderSpec)[0];
  const make = ENCODERS[which];
  if (make === undefined) throw new Unsupported(`encoder ${which}`);
  const fn = make(encoderSpec[which]);
  compiled.set(encoderSpec, fn);
  return fn;
}

export function encode(encoderSpec, point) {
  return compileEncoder(encoderSpec)(point);
}
