// Labelling a point from a published clustering (docs/protocol.md §15): the one labelling rule of
// this client, used by the result_labels vectors and by the campaigns' comparisons.
import {
  cellListLocator, centerRows, checkPoint, double, nearestIndex, numericDomain, Rejected,
} from "./encoders.js";

/** The label of noise in a cell map (§15.2). */
export const NOISE = -1;

const MAX_LABEL = 2 ** 31 - 1;

function check(condition, message) {
  if (!condition) throw new Rejected(message);
}

/** §15.2: a CellClusterMap, validated whole; point -> {cell, label}. */
function cellMapLabeller(clustering) {
  const map = clustering.cell_map;
  const domain = numericDomain(map.domain);
  const locate = cellListLocator(domain, map.cells);
  const n = map.cells.length;
  check(map.labels.length === n, "one label per cell");
  const labels = map.labels.map(Number);
  for (const label of labels) {
    check(Number.isInteger(label) && label >= NOISE && label <= MAX_LABEL, "labels are in [-1, 2^31 - 1]");
  }
  for (const field of ["densities", "density_std_errors"]) {
    const values = (map[field] ?? []).map(double);
    check(values.length === 0 || values.length === n, `${field}: empty or one value per cell`);
    for (const v of values) check(Number.isFinite(v), `${field} are finite`);
    if (field === "density_std_errors") for (const v of values) check(v >= 0, "density_std_errors are >= 0");
  }
  const dimension = Number(clustering.dimension ?? 0);
  check(dimension === 0 || dimension === domain.d, "dimension is 0 or the cell map's domain dimension");
  return (point) => {
    // The point is checked (d finite doubles), then clamped and normalized as §11.5's encoder does.
    const cell = locate(point);
    return { cell, label: labels[cell] };
  };
}

/** §15.3: centers in the domain's units, validated whole; point -> {label} (no clamping, no noise). */
function centersLabeller(clustering) {
  const values = clustering.centers;
  let d = Number(clustering.dimension ?? 0);
  if (d === 0) {
    const k = Number(clustering.k ?? 0);
    check(k !== 0 && values.length % k === 0, "with dimension 0, k divides len(centers)");
    d = values.length / k;
  }
  const centers = centerRows(values, d);
  const shape = { d };
  return (point) => ({ label: nearestIndex(centers, checkPoint(shape, point)) });
}

/**
 * §15.1: a `Clustering`'s labelling function, point -> {label, cell (cell maps only)}; a
 * malformed clustering, or one with neither centers nor cells, throws Rejected before any point is
 * labelled, and so does a point that is not d finite doubles.
 */
export function clusteringLabeller(clustering) {
  check(clustering !== null && clustering !== undefined, "a result without a clustering has no labels");
  if ((clustering.centers ?? []).length > 0) return centersLabeller(clustering);
  if ((clustering.cell_map?.cells ?? []).length > 0) return cellMapLabeller(clustering);
  throw new Rejected("a clustering with neither centers nor cells has nothing to label with");
}

/**
 * §15.1: the labelling function of a `GetResult` answer's `Result`, or null where it gives no
 * labels (a state other than FINISHED, or no clustering).
 */
export function resultLabeller(result) {
  if (result.state !== "FINISHED" || result.clustering === null || result.clustering === undefined) return null;
  return clusteringLabeller(result.clustering);
}
