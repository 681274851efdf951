"""Density-mode clustering of a noisy uniform grid histogram (the grid kind's ``DENSITY`` variant).

Not in ``papers/002``: the paper's dense test, core cells and connectivity (Algorithm 4,
:mod:`~ldp_collector.estimation.grid_clustering`) judge every cell on its own count, so on data
they were not tuned on a few noisy cells bridge two clusters or one cluster breaks into many. Here
every threshold follows from the standard error of the estimate, and clusters are the significant
modes of a smoothed density. Everything is a post-processing of one round's unbiased counts.

Level (:func:`snr_level`)
    A frequency oracle's count error per cell has the same standard deviation ``sigma =
    sqrt(n v)`` whatever the cell size, so a grid twice as fine in each dimension has ``2^d``
    times less signal per cell and the same noise. The grid is the finest level at which the
    typical occupied cell, after smoothing, is still resolved: its expected smoothed count is at
    least ``z_dense + z_power`` smoothed standard errors, where ``z_dense`` is the Bonferroni
    z of the dense test over the level's cells (the dense test's worst case) and ``z_power =
    Phi^-1(0.9)`` (such a cell passes the test with probability about 0.9). The occupied cells
    are counted on the calibration round's coarser histogram (the cells that pass the dense test)
    and scaled by ``2^d`` per level, the refinement of an area.

Pooling the calibration round (:func:`pool_levels`)
    The calibration round's devices estimated the same population on a coarser grid of the same
    box (or, when the noise affords only a coarser level, a finer one). Its counts, scaled to the
    aggregation round's reports, are a second unbiased estimate of every coarse cell's total, so
    the two levels are made consistent by their best linear unbiased combination (constrained
    inference over a hierarchical histogram, Hay et al. 2010): each fine cell takes its share of
    the difference between the two estimates of its coarse cell, in proportion to its variance.
    This removes most of the coarse-scale error, the error smoothing cannot average out and the
    one that bridges two clusters or breaks one into arcs; a fine cell's variance falls from
    ``sigma^2`` to ``sigma^2 - sigma^4 / (K sigma^2 + tau^2)`` (``K`` fine cells per coarse cell,
    ``tau^2`` the scaled coarse variance). Everything stays a post-processing of the reports.

Smoothing (:func:`smooth_counts`)
    A separable Gaussian kernel of :data:`SMOOTHING_BANDWIDTH` cells, zero outside the box (no
    data lies there). The smoothed count of a cell is the kernel-weighted mean of its neighbours'
    counts; its standard error is ``sigma sqrt(sum w^2)``.

Dense cells (:func:`dense_threshold_z`)
    A cell is dense when its smoothed count is significantly above zero with the false discovery
    rate controlled at :data:`DENSE_FALSE_DISCOVERY_RATE` over all cells (Benjamini-Hochberg on
    one-sided normal p-values): when much of the grid is occupied the threshold falls to about
    2.5 standard errors, when little is it rises towards the Bonferroni z, so empty space stays
    empty.

Touching cells are those of :func:`~ldp_collector.estimation.grid_clustering.touching`: every
cell of the surrounding block up to :data:`~ldp_collector.estimation.grid_clustering.CORNER_TOUCH_MAX_DIMENSION`
dimensions, the face neighbours above.

Modes (:func:`mode_clusters`, persistence clustering after ToMATo, Chazal et al. 2013)
    Dense cells are visited from the highest smoothed count down; a cell joins the component of
    its highest touching neighbour, and when it touches two components the lower one is kept
    apart only if its height (the mean of its :data:`PEAK_CELLS` highest cells, which damps the
    upward bias of a lone noisy maximum) stands above the joining level by at least ``max(z_split
    sqrt(2) se, depth height)``: a valley both significant against the noise (``z_split``
    standard errors of a difference of two cells) and deep relative to the lower peak (so the
    density ripples a ring or an arm shows on a grid never split it). A single noisy cell can
    therefore neither bridge two clusters (it would have to be a whole path of dense cells) nor
    break one (the valley it digs is shallow next to the peaks).

Clusters and borders
    A component is a cluster when its total (unsmoothed) count passes the Bonferroni z over the
    cells (:data:`CLUSTER_FALSE_POSITIVE_RATE`). Then, up to :data:`BORDER_STEPS` times, every
    unlabelled cell touching exactly one cluster joins it (the tails of a cluster, whose cells are
    too thin to pass the dense test); a cell touching two stays noise, so borders never merge
    clusters.

Gaussian clusters in one mode (:mod:`~ldp_collector.estimation.grid_mixture`)
    Two Gaussian clusters that overlap without a valley are one mode. Last, the clusters are
    replaced by the components of a Gaussian mixture when, and only when, such a mixture (at most
    a few components per mode) fits the counts within their standard errors by a chi-square test;
    arbitrary shapes (rings, moons, arms) fail that test and keep their density clusters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.encoders.geometry import neighbor_offsets
from ldp_client.errors import InvalidParameterError

from .grid_clustering import CORNER_TOUCH_MAX_DIMENSION
from .grid_mixture import MixtureSplit, split_gaussian_modes

__all__ = [
    "BORDER_STEPS",
    "CLUSTER_FALSE_POSITIVE_RATE",
    "DENSE_FALSE_DISCOVERY_RATE",
    "PEAK_CELLS",
    "SMOOTHING_BANDWIDTH",
    "SPLIT_DEPTH",
    "SPLIT_Z",
    "DensityClustering",
    "cluster_density",
    "dense_threshold_z",
    "mode_clusters",
    "pool_levels",
    "smooth_counts",
    "snr_level",
]

#: Standard deviation of the smoothing kernel, in cells of the grid.
SMOOTHING_BANDWIDTH = 0.75
#: Benjamini-Hochberg false discovery rate of the dense test over all cells.
DENSE_FALSE_DISCOVERY_RATE = 0.05
#: Family-wise rate of spurious clusters (Bonferroni over the cells) in the cluster-mass test.
CLUSTER_FALSE_POSITIVE_RATE = 0.05
#: A valley separates two modes only when it is this many standard errors of a difference deep ...
SPLIT_Z = 2.0
#: ... and at least this share of the lower mode's height.
SPLIT_DEPTH = 0.5
#: A mode's height is the mean of its this many highest cells.
PEAK_CELLS = 3
#: Rounds of border attachment (each grows every cluster by one cell where unambiguous).
BORDER_STEPS = 2
#: Power of the level rule: a typical occupied cell passes the dense test with this probability.
LEVEL_POWER = 0.9

_KERNEL_REACH = 4.0  # the kernel is cut at this many bandwidths


def _kernel(bandwidth: float) -> NDArray[np.float64]:
    """The normalized 1-D Gaussian weights, odd length, centre in the middle."""
    if bandwidth <= 0:
        return np.ones(1)
    half = max(1, int(math.ceil(_KERNEL_REACH * bandwidth)))
    offsets = np.arange(-half, half + 1, dtype=np.float64)
    weights = np.exp(-0.5 * (offsets / bandwidth) ** 2)
    out: NDArray[np.float64] = weights / weights.sum()
    return out


def smooth_counts(counts: ArrayLike, std_error: float, bandwidth: float) -> tuple[NDArray[np.float64], float]:
    """Separable Gaussian smoothing of a ``(m,) * d`` grid of counts, zero outside the box.

    Parameters
    ----------
    counts : array_like, shape (m,) * d
        Unbiased counts of the cells of a uniform grid (Morton order is *not* this layout: see
        :func:`cluster_density`).
    std_error : float
        Standard error of every cell's count (the oracle's, the same for every cell).
    bandwidth : float
        Kernel standard deviation in cells (0: no smoothing).

    Returns
    -------
    smoothed : numpy.ndarray
        Kernel-weighted mean counts, same shape.
    smoothed_std_error : float
        Standard error of a smoothed count away from the box's faces, ``sigma sqrt(sum w^2)``
        (near a face fewer cells contribute, so its error is smaller: the interior value is the
        conservative one).
    """
    grid = np.asarray(counts, dtype=np.float64)
    kernel = _kernel(bandwidth)
    half = kernel.size // 2
    out = grid
    for axis in range(grid.ndim):
        # The full convolution's middle m values: numpy's mode="same" returns max(m, kernel) values, so a
        # grid narrower than the kernel (2 to 6 cells per side) would grow to the kernel's length.
        out = np.apply_along_axis(lambda row: np.convolve(row, kernel)[half:half + row.size], axis, out)
    factor = float((kernel**2).sum()) ** grid.ndim
    return out, float(std_error) * math.sqrt(factor)


def _block_sums(grid: NDArray[np.float64], factor: int) -> NDArray[np.float64]:
    """Sums of the ``factor^d`` blocks of a ``(m,) * d`` grid (``m`` a multiple of ``factor``)."""
    side = grid.shape[0] // factor
    shape = tuple(x for _ in range(grid.ndim) for x in (side, factor))
    out: NDArray[np.float64] = grid.reshape(shape).sum(axis=tuple(range(1, 2 * grid.ndim, 2)))
    return out


def _expand(grid: NDArray[np.float64], factor: int) -> NDArray[np.float64]:
    """Each cell of a ``(m,) * d`` grid repeated into its ``factor^d`` block."""
    out = grid
    for axis in range(grid.ndim):
        out = np.repeat(out, factor, axis=axis)
    return out


def pool_levels(counts: ArrayLike, std_errors: ArrayLike, other_counts: ArrayLike,
                other_std_errors: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Best linear unbiased counts of a uniform grid given a second, independent estimate of the same
    population on a grid of the same box at another level (module docstring).

    Parameters
    ----------
    counts, std_errors : array_like, shape (m,) * d
        Unbiased counts of the grid to estimate, and their standard errors (arrays or one value).
    other_counts, other_std_errors : array_like, shape (m2,) * d
        Independent unbiased counts of the same population *on the same scale* (the caller scales
        them to the reports of ``counts``), on a grid whose side ``m2`` divides ``m`` or is a
        multiple of it by a power of two.

    Returns
    -------
    counts : numpy.ndarray, shape (m,) * d
        Unbiased, and consistent with the combined estimate of every coarser cell.
    std_errors : numpy.ndarray, shape (m,) * d
        Their standard errors (each cell's; the small covariances between the cells of one
        coarse cell are left out).

    Raises
    ------
    InvalidParameterError
        Grids of different dimensions, sides that are not power-of-two multiples of each other,
        or standard errors that are not positive and finite.
    """
    x = np.asarray(counts, dtype=np.float64)
    other = np.asarray(other_counts, dtype=np.float64)
    var = np.broadcast_to(np.asarray(std_errors, dtype=np.float64), x.shape) ** 2
    other_var = np.broadcast_to(np.asarray(other_std_errors, dtype=np.float64), other.shape) ** 2
    if x.ndim == 0 or x.ndim != other.ndim or len(set(x.shape)) != 1 or len(set(other.shape)) != 1:
        raise InvalidParameterError(f"pooling needs two square grids of one dimension, got shapes {x.shape} and "
                                    f"{other.shape}")
    if not (np.isfinite(var).all() and np.isfinite(other_var).all() and (var > 0).all() and (other_var > 0).all()):
        raise InvalidParameterError("pooling needs positive, finite standard errors")
    m, m2 = x.shape[0], other.shape[0]
    ratio = max(m, m2) // min(m, m2)
    if max(m, m2) % min(m, m2) or ratio & (ratio - 1):
        raise InvalidParameterError(f"grid sides {m} and {m2} are not power-of-two multiples of each other")
    if m2 > m:
        # The other grid is finer: its block sums estimate these very cells; inverse-variance mean.
        total, total_var = _block_sums(other, ratio), _block_sums(other_var, ratio)
        pooled_var = 1.0 / (1.0 / var + 1.0 / total_var)
        return pooled_var * (x / var + total / total_var), np.sqrt(pooled_var)
    # Each cell of x takes its share of the gap between the two estimates of its coarse cell.
    gap = other - _block_sums(x, ratio)
    spread = _block_sums(var, ratio) + other_var
    pooled = x + var * _expand(gap / spread, ratio)
    pooled_var = var - var**2 / _expand(spread, ratio)
    return pooled, np.sqrt(pooled_var)


def _normal_sf(z: NDArray[np.float64]) -> NDArray[np.float64]:
    """One-sided normal tail ``P(Z > z)``, vectorized through ``erfc``."""
    out: NDArray[np.float64] = 0.5 * np.vectorize(math.erfc, otypes=[np.float64])(z / math.sqrt(2.0))
    return out


def dense_threshold_z(z_scores: ArrayLike, rate: float = DENSE_FALSE_DISCOVERY_RATE) -> float:
    """The Benjamini-Hochberg threshold, in standard errors, for "significantly above zero".

    The largest ``k`` with ``p_(k) <= rate k / m`` over the one-sided p-values sorted increasingly;
    the threshold is the ``k``-th largest z. Without any discovery it is the Bonferroni z
    ``Phi^-1(1 - rate / m)`` (nothing passes it).
    """
    z = np.sort(np.asarray(z_scores, dtype=np.float64).ravel())[::-1]
    m = int(z.size)
    if m == 0:
        raise InvalidParameterError("the dense test needs at least one cell")
    p = _normal_sf(z)
    passing = np.flatnonzero(p <= rate * np.arange(1, m + 1) / m)
    if not passing.size:
        return NormalDist().inv_cdf(1.0 - rate / m)
    return float(z[int(passing[-1])])


def _neighbour_table(shape: tuple[int, ...]) -> NDArray[np.int64]:
    """For every flat cell index, its touching cells' flat indices (``-1`` outside the box)."""
    d = len(shape)
    coords = np.indices(shape).reshape(d, -1).T
    offs = np.array(neighbor_offsets(d, d > CORNER_TOUCH_MAX_DIMENSION), dtype=np.int64).reshape(-1, d)
    table = np.full((coords.shape[0], offs.shape[0]), -1, dtype=np.int64)
    dims = np.array(shape, dtype=np.int64)
    for j, off in enumerate(offs):
        nb = coords + off
        inside = np.all((nb >= 0) & (nb < dims), axis=1)
        table[inside, j] = np.ravel_multi_index(tuple(nb[inside].T), shape)
    return table


def mode_clusters(smoothed: ArrayLike, dense: ArrayLike, split_gap: float, *, depth: float = SPLIT_DEPTH,
                  peak_cells: int = PEAK_CELLS) -> NDArray[np.int64]:
    """Persistence clustering of the dense cells (module docstring); labels ``-1`` = not dense.

    Parameters
    ----------
    smoothed : array_like, shape (m,) * d
    dense : array_like of bool, same shape
    split_gap : float
        The least valley, in counts, that keeps two modes apart (``z_split sqrt(2) se``).
    depth : float
        The least valley as a share of the lower mode's height.
    peak_cells : int
        Cells averaged into a mode's height.
    """
    s = np.asarray(smoothed, dtype=np.float64)
    mask = np.asarray(dense, dtype=np.bool_)
    if s.shape != mask.shape:
        raise InvalidParameterError("smoothed and dense must have the same shape")
    flat = s.ravel()
    table = _neighbour_table(s.shape)
    order = [int(i) for i in np.argsort(-flat, kind="stable") if mask.flat[int(i)]]
    parent = np.full(flat.size, -1, dtype=np.int64)
    tops: dict[int, list[float]] = {}

    def find(a: int) -> int:
        root = a
        while parent[root] != root:
            root = int(parent[root])
        while parent[a] != root:
            parent[a], a = root, int(parent[a])
        return root

    def height(root: int) -> float:
        top = tops[root]
        return sum(top) / len(top)

    for i in order:
        value = float(flat[i])
        roots = {find(int(j)) for j in table[i] if j >= 0 and parent[j] >= 0}
        if not roots:
            parent[i] = i
            tops[i] = [value]
            continue
        best = max(roots, key=lambda r: (height(r), -r))
        parent[i] = best
        if len(tops[best]) < peak_cells:
            tops[best].append(value)
        for root in sorted(roots - {best}):
            h = height(root)
            if h - value < max(split_gap, depth * h):
                parent[root] = best
                tops[best] = sorted(tops[best] + tops.pop(root), reverse=True)[:peak_cells]
    labels = np.full(flat.size, -1, dtype=np.int64)
    numbering: dict[int, int] = {}
    for i in order:
        labels[i] = numbering.setdefault(find(i), len(numbering))
    return labels.reshape(s.shape)


@dataclass(frozen=True)
class DensityClustering:
    """Cluster labels of a uniform grid's cells with the diagnostics of every step.

    Arrays are in the grid's C order (shape ``(m,) * d``, axis ``i`` = dimension ``i``).
    """

    labels: NDArray[np.int64]
    smoothed: NDArray[np.float64]
    smoothed_std_error: float
    dense: NDArray[np.bool_]
    dense_z: float
    clusters: int
    modes: int
    border_cells: int
    #: Estimated share of the population in each cluster (index = label), from the unsmoothed counts.
    cluster_shares: tuple[float, ...]
    #: The Gaussian-mixture test of the density clusters (None when it was not asked for).
    mixture: MixtureSplit | None = None


def cluster_density(counts: ArrayLike, std_error: float, n: float, *, bandwidth: float = SMOOTHING_BANDWIDTH,
                    fdr: float = DENSE_FALSE_DISCOVERY_RATE, split_z: float = SPLIT_Z, depth: float = SPLIT_DEPTH,
                    border_steps: int = BORDER_STEPS, std_errors: ArrayLike | None = None,
                    gaussian_components: bool = True) -> DensityClustering:
    """Smooth, test, find the modes, keep the significant ones, attach their borders, and test whether
    a Gaussian mixture describes them better (module docstring).

    Parameters
    ----------
    counts : array_like, shape (m,) * d
        Unbiased counts of a uniform grid's cells among ``n`` reports.
    std_error : float
        Standard error of one cell's count (the largest, when they differ: every density test
        stays conservative).
    n : float
    bandwidth, fdr, split_z, depth, border_steps
        The module constants unless set.
    std_errors : array_like, optional
        Each cell's own standard error, for the mixture's chi-square test (default ``std_error``).
    gaussian_components : bool
        Run the Gaussian-mixture step (:func:`~ldp_collector.estimation.grid_mixture.split_gaussian_modes`).

    Returns
    -------
    DensityClustering
        Labels ``0..clusters-1`` numbered by decreasing estimated mass; ``-1`` = noise.
    """
    c = np.asarray(counts, dtype=np.float64)
    if not (math.isfinite(std_error) and std_error > 0):
        raise InvalidParameterError(f"the standard error must be positive, got {std_error!r}")
    if not n > 0:
        raise InvalidParameterError(f"n must be positive, got {n!r}")
    smoothed, sse = smooth_counts(c, std_error, bandwidth)
    z = dense_threshold_z(smoothed / sse, fdr)
    dense = smoothed >= z * sse
    modes = mode_clusters(smoothed, dense, split_z * math.sqrt(2.0) * sse, depth=depth)
    found = int(modes.max()) + 1 if modes.size else 0
    z_mass = NormalDist().inv_cdf(1.0 - CLUSTER_FALSE_POSITIVE_RATE / c.size)
    masses = [float(c[modes == k].sum()) for k in range(found)]
    sizes = [int((modes == k).sum()) for k in range(found)]
    kept = [k for k in range(found) if masses[k] >= z_mass * std_error * math.sqrt(sizes[k])]
    kept.sort(key=lambda k: (-masses[k], k))
    relabel = np.full(found + 1, -1, dtype=np.int64)
    for new, old in enumerate(kept):
        relabel[old] = new
    labels = relabel[modes]  # -1 indexes the last entry, which is -1
    labels, borders = _attach_borders(labels, border_steps)
    clusters = len(kept)
    mixture = None
    if gaussian_components:
        mixture = split_gaussian_modes(c, std_error if std_errors is None else std_errors, labels)
        if mixture.split:
            labels, clusters = _by_mass(mixture.labels, c)
    shares = tuple(max(0.0, float(c[labels == k].sum())) / float(n) for k in range(clusters))
    return DensityClustering(labels=labels, smoothed=smoothed, smoothed_std_error=sse, dense=dense, dense_z=z,
                             clusters=clusters, modes=found, border_cells=borders, cluster_shares=shares,
                             mixture=mixture)


def _by_mass(labels: NDArray[np.int64], counts: NDArray[np.float64]) -> tuple[NDArray[np.int64], int]:
    """Labels renumbered ``0..K-1`` by decreasing total count (ties by the old label); ``-1`` stays."""
    present = sorted({int(v) for v in np.unique(labels) if v >= 0},
                     key=lambda k: (-float(counts[labels == k].sum()), k))
    relabel = np.full(int(labels.max()) + 2 if labels.size else 1, -1, dtype=np.int64)
    for new, old in enumerate(present):
        relabel[old] = new
    return relabel[labels], len(present)


def _attach_borders(labels: NDArray[np.int64], steps: int) -> tuple[NDArray[np.int64], int]:
    """Grow every cluster into unlabelled cells touching it and no other, ``steps`` times."""
    table = _neighbour_table(labels.shape)
    flat = labels.ravel().copy()
    attached = 0
    for _ in range(steps):
        nb = np.where(table >= 0, flat[np.maximum(table, 0)], -1)
        nb_masked = np.where(nb >= 0, nb, np.iinfo(np.int64).max)
        low = nb_masked.min(axis=1)
        high = np.where(nb >= 0, nb, -1).max(axis=1)
        grow = (flat < 0) & (high >= 0) & (low == high)
        if not grow.any():
            break
        flat[grow] = high[grow]
        attached += int(grow.sum())
    return flat.reshape(labels.shape), attached


def snr_level(calibration_counts: ArrayLike, calibration_std_error: float, calibration_level: int, dimension: int,
              reports: float, std_error: float, *, min_level: int, max_level: int,
              bandwidth: float = SMOOTHING_BANDWIDTH) -> tuple[int, float]:
    """The finest level whose typical occupied cell is resolved (module docstring).

    Parameters
    ----------
    calibration_counts : array_like
        The calibration round's counts (any order) at ``calibration_level``.
    calibration_std_error : float
        Standard error of one of those counts.
    calibration_level : int
    dimension : int
    reports : float
        Reports the chosen grid will be estimated from.
    std_error : float
        Standard error of one cell's count in that grid (``sqrt(reports v)``).
    min_level, max_level : int
        The allowed range.

    Returns
    -------
    level : int
    occupied_cells : float
        The calibration cells significantly above zero (the dense test of the module docstring,
        unsmoothed), at least 1.
    """
    c = np.asarray(calibration_counts, dtype=np.float64).ravel()
    if not (math.isfinite(calibration_std_error) and calibration_std_error > 0):
        raise InvalidParameterError(f"the standard error must be positive, got {calibration_std_error!r}")
    z = c / calibration_std_error
    occupied = float(max(1, int((z >= dense_threshold_z(z)).sum())))
    kernel_factor = float((_kernel(bandwidth) ** 2).sum()) ** dimension
    smoothed_se = std_error * math.sqrt(kernel_factor)
    level = min_level
    for candidate in range(min_level, max_level + 1):
        cells = occupied * 2.0 ** (dimension * (candidate - calibration_level))
        z_dense = NormalDist().inv_cdf(1.0 - DENSE_FALSE_DISCOVERY_RATE / 2.0 ** (dimension * candidate))
        needed = z_dense + NormalDist().inv_cdf(LEVEL_POWER)
        if reports / max(cells, 1.0) >= needed * smoothed_se:
            level = candidate
    return level, occupied
