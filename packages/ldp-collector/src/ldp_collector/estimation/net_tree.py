"""One-round net-tree k-means: the tree walk, the coreset and its centers (pure math; DESIGN.md §7.4).

The protocol (Chang, Ghazi, Kumar and Manurangsi, ICML 2021, as adapted for local privacy in
DESIGN.md §7.4) sends one message per device. A public node map nests: the level-``l`` node of
a point is a prefix of its level-``l + 1`` node (``parent = child >> b``, ``b`` =
:attr:`NetTreeLayout.child_bits`): SimHash prefixes (``b`` hyperplanes per level) or a randomly
shifted dyadic grid (``b`` = the grid's dimension). Device group ``l`` (one of ``T`` equal
groups) reports its level-``l`` node with a frequency oracle, and *every* device also reports the
bucketized vector ``(2t - 1, 1)`` into its depth-``T`` node (``ldp_collector.estimation.vector_sum``).

Tree growth (:func:`select_nodes`)
    Level 1 tests every node; level ``l + 1`` tests the children of the level-``l`` nodes that
    *branch*. A tested node is *kept* when its population-scaled count passes

        tau_l = max(z sigma_0,l, n_hat / (c k)),   z = Phi^-1(1 - alpha / (2 m_l))   (Bonferroni)

    with ``sigma_0,l`` the zero-count standard error of the level's estimate, ``m_l`` the number
    of nodes tested, ``alpha`` the family-wise false-positive rate, and ``c`` =
    :data:`MASS_FRACTION` (a kept node holds at least ``1/c`` of an average cluster). At most
    ``max_nodes`` nodes (the largest) are kept per level. Every kept node above depth ``T``
    branches: the paper lets light nodes stop as leaves higher up, but here the vector sums live
    at depth ``T`` (one bucket level for all devices, so each sum has noise ``n V`` instead of
    ``T n V``), and a leaf at level ``l < T`` would have to pool ``2^(b (T - l))`` bucket sums,
    each with its own noise. The keep threshold is therefore also the branching threshold.

Coreset (:func:`coreset_centers`)
    The kept depth-``T`` nodes are the leaves. Leaf ``u`` has the weight ``w_u`` = its count
    and the representative ``y_u = S_u / w_u`` with ``S_u`` the first ``d`` coordinates of its
    bucketized vector sum (unbiased for the sum of ``2t - 1`` over its devices). Weighted
    k-means++ and Lloyd on ``(y_u, w_u)`` give k centers; each final center is the pooled mean
    ``sum S_u / sum w_u`` of the leaves it owns (what Lloyd's last step computes). The
    paper-faithful variant clusters the leaves by their *positions in the projected node space*
    (:func:`grid_node_positions`, exact for a shifted grid) and pools the original-space sums per
    cluster, so the clustering does not see the vector noise at all.

Detectability (:func:`detection_sigma`)
    With ``T`` equal groups and the local-hashing oracle at the node epsilon, the standard error of
    a population-scaled node count is about ``sigma = 2 e^(eps/2) sqrt(n T) / (e^eps - 1)``; a
    cluster of ``n / k`` devices is found only when ``n / k`` is several times ``sigma``:
    :func:`signal_to_noise` is that ratio.

The vector-sum floor (:func:`center_error_floor`)
    Each coordinate of a bucket's sum carries noise of variance about ``n V`` (``V`` the vector
    randomizer's per-report variance in ``[-1, 1]`` units) whatever the bucket's size, so a
    center pooled over ``L`` leaves holding ``n / k`` devices has per-coordinate standard error
    ``k sqrt(L V / n)`` in ``[-1, 1]`` units: the one-round floor on the center error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.errors import InvalidParameterError

from .heavy_hitters import bonferroni_z
from .kmeans import kmeans_plus_plus, lloyd

__all__ = [
    "DETECTION_POWER",
    "MASS_FRACTION",
    "CoresetCenters",
    "LevelSelection",
    "TreeGrowth",
    "NetTreeLayout",
    "center_error_floor",
    "children",
    "coreset_centers",
    "detection_sigma",
    "node_epsilon_needed",
    "grid_node_positions",
    "grow_tree",
    "shifted_cell_centres",
    "combine_center_estimates",
    "select_nodes",
    "signal_to_noise",
]

#: A kept node holds at least 1 / MASS_FRACTION of an average cluster (n / k devices).
MASS_FRACTION = 4.0
#: Probability that the tree detects all its clusters' nodes together (:func:`node_epsilon_needed`).
DETECTION_POWER = 0.95


@dataclass(frozen=True)
class NetTreeLayout:
    """The public shape of the tree: ``levels`` (T) levels of ``child_bits`` index bits each."""

    levels: int
    child_bits: int

    def __post_init__(self) -> None:
        if not 1 <= self.levels <= 62 or not 1 <= self.child_bits <= 62 or self.levels * self.child_bits > 62:
            raise InvalidParameterError(
                f"a net tree needs 1 <= levels, 1 <= child_bits and levels * child_bits <= 62, got "
                f"{self.levels} x {self.child_bits}")

    def bits(self, level: int) -> int:
        """Index bits of a level-``level`` node."""
        return level * self.child_bits


def children(nodes: ArrayLike, child_bits: int) -> NDArray[np.uint64]:
    """Every child of every node: ``(node << b) | j`` for ``j < 2^b``, parents in order."""
    parents = np.asarray(nodes, dtype=np.uint64).reshape(-1)
    offsets = np.arange(1 << child_bits, dtype=np.uint64)
    out: NDArray[np.uint64] = ((parents[:, None] << np.uint64(child_bits)) | offsets[None, :]).reshape(-1)
    return out


def detection_sigma(n: float, epsilon: float, levels: int) -> float:
    """``2 e^(eps/2) sqrt(n T) / (e^eps - 1)``: a population-scaled node count's standard error."""
    if not (n >= 0 and epsilon > 0 and levels >= 1):
        raise InvalidParameterError(f"need n >= 0, epsilon > 0 and levels >= 1, got {n}, {epsilon}, {levels}")
    return 2.0 * math.exp(epsilon / 2.0) * math.sqrt(n * levels) / math.expm1(epsilon)


def signal_to_noise(n: float, k: int, epsilon: float, levels: int) -> float:
    """``(n / k) / sigma``: an average cluster's count in units of :func:`detection_sigma`."""
    sigma = detection_sigma(n, epsilon, levels)
    return (n / k) / sigma if sigma > 0 else math.inf


def node_epsilon_needed(n: float, k: int, layout: NetTreeLayout, alpha: float, *, power: float = DETECTION_POWER) -> float:
    """The smallest node epsilon at which the tree finds every cluster: ``2 asinh(S k sqrt(n T) / n)``.

    A node holding ``1 / MASS_FRACTION`` of an average cluster (``n / (MASS_FRACTION k)`` devices)
    must pass the Bonferroni threshold ``z_alpha sigma`` of its level (``z_alpha`` over the
    ``k MASS_FRACTION 2^b`` children of such nodes) with probability ``power`` for all ``k T`` such
    detections together (``z_power = Phi^-1(1 - (1 - power) / (k T))``). So the average cluster's
    signal-to-noise ratio (:func:`signal_to_noise`) must reach ``S = MASS_FRACTION (z_alpha +
    z_power)``; with ``sigma = sqrt(n T) / sinh(eps / 2)`` (:func:`detection_sigma`) that is the
    epsilon above. Nothing here is fitted: at n = 1e6, k = 8, T = 4, b = 2, alpha = 0.05 it gives
    S = 26 and a node epsilon of 0.81 (the feasibility boundary measured SNR 25 for ARI >= 0.9).
    """
    if not (n > 0 and k >= 1 and 0.0 < alpha < 1.0 and 0.0 < power < 1.0):
        raise InvalidParameterError(f"need n > 0, k >= 1 and alpha, power in (0, 1), got {n}, {k}, {alpha}, {power}")
    tested = int(min(k * MASS_FRACTION * 2**layout.child_bits, 2**62))
    z = bonferroni_z(tested, alpha) + NormalDist().inv_cdf(1.0 - (1.0 - power) / (k * layout.levels))
    needed = MASS_FRACTION * z
    return 2.0 * math.asinh(needed * k * math.sqrt(n * layout.levels) / n)


def center_error_floor(n: float, k: int, variance: float, leaves_per_cluster: float = 1.0) -> float:
    """``k sqrt(L V / n)``: per-coordinate standard error of a pooled center (``[-1, 1]`` units)."""
    if not (n > 0 and k >= 1 and variance >= 0 and leaves_per_cluster > 0):
        raise InvalidParameterError("need n > 0, k >= 1, variance >= 0 and leaves_per_cluster > 0")
    return k * math.sqrt(leaves_per_cluster * variance / n)


@dataclass(frozen=True, kw_only=True, eq=False)
class LevelSelection:
    """One level's decision (:func:`select_nodes`)."""

    #: Population-scaled threshold tau_l and its two parts.
    threshold: float
    z: float
    noise_threshold: float
    mass_threshold: float
    #: Indices (into the tested arrays) of the kept nodes, largest count first.
    kept: NDArray[np.int64]
    #: Whether ``max_nodes`` cut the kept list.
    capped: bool


def select_nodes(counts: ArrayLike, zero_std_error: float, *, n_hat: float, k: int, alpha: float,
                 max_nodes: int, mass_fraction: float = MASS_FRACTION, z: float | None = None,
                 min_count: float = 0.0) -> LevelSelection:
    """Kept and branching nodes of one level from population-scaled counts (module docstring).

    Parameters
    ----------
    counts : array_like
        Population-scaled count estimates of the tested nodes.
    zero_std_error : float
        Their standard error under "nobody is here" (population scale).
    n_hat : float
        Estimated population size.
    k : int
        Number of clusters.
    alpha : float
        Family-wise false-positive rate, in (0, 1).
    max_nodes : int
        Most nodes kept.
    mass_fraction : float
        ``c`` of the mass threshold ``n_hat / (c k)``.
    min_count : float
        A further absolute floor on the kept counts (the engines' vector-noise floor).
    z : float, optional
        A fixed threshold multiplier instead of the Bonferroni quantile.
    """
    c = np.asarray(counts, dtype=np.float64).reshape(-1)
    if not 0.0 < alpha < 1.0 or max_nodes < 1 or k < 1:
        raise InvalidParameterError(f"need alpha in (0, 1), max_nodes >= 1 and k >= 1, got {alpha}, {max_nodes}, {k}")
    if z is None:
        z = bonferroni_z(max(1, c.size), alpha)
    elif not (math.isfinite(z) and z > 0):
        raise InvalidParameterError(f"z must be positive and finite, got {z}")
    noise = z * float(zero_std_error)
    mass = max(max(float(n_hat), 0.0) / (mass_fraction * k), float(min_count))
    threshold = max(noise, mass)
    passed = np.flatnonzero(c >= threshold)
    order = passed[np.argsort(-c[passed], kind="stable")]
    capped = order.size > max_nodes
    kept = order[:max_nodes].astype(np.int64)
    return LevelSelection(threshold=threshold, z=z, noise_threshold=noise, mass_threshold=mass, kept=kept,
                          capped=bool(capped))


#: ``estimate(level, candidates) -> (counts, zero_std_error)`` on the population scale, or ``None``
#: when the level's group sent no reports.
LevelEstimator = Callable[[int, NDArray[np.uint64]], "tuple[NDArray[np.float64], float] | None"]


@dataclass(frozen=True, kw_only=True, eq=False)
class TreeGrowth:
    """The result of :func:`grow_tree`."""

    #: Kept nodes of the deepest level reached (the leaves when it is the last level).
    nodes: NDArray[np.uint64]
    counts: NDArray[np.float64]
    #: Last level walked (``levels`` when the tree reached the bottom).
    level: int
    #: Kept nodes and their counts at every walked level (1-based level -> arrays).
    kept: dict[int, tuple[NDArray[np.uint64], NDArray[np.float64]]] = field(default_factory=dict)
    diagnostics: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def grow_tree(estimate: LevelEstimator, layout: NetTreeLayout, *, n_hat: float, k: int, alpha: float,
              max_nodes: int, mass_fraction: float = MASS_FRACTION, z: float | None = None,
              min_count: float = 0.0, prefix: str = "") -> TreeGrowth:
    """Walk the tree top-down (module docstring): test, keep, test the kept nodes' children.

    Parameters
    ----------
    estimate : callable
        ``estimate(level, candidates)``: population-scaled counts of the candidates and their
        zero-count standard error, or ``None`` when the level has no reports.
    layout : NetTreeLayout
    n_hat, k, alpha, max_nodes, mass_fraction, z, min_count
        As in :func:`select_nodes`.
    prefix : str
        Prefix of the diagnostics' keys.
    """
    candidates = np.arange(1 << layout.child_bits, dtype=np.uint64)
    nodes = np.zeros(0, dtype=np.uint64)
    counts = np.zeros(0, dtype=np.float64)
    growth = TreeGrowth(nodes=nodes, counts=counts, level=0)
    level = 0
    for level in range(1, layout.levels + 1):
        estimated = estimate(level, candidates)
        if estimated is None:
            growth.warnings.append(f"{prefix}level {level}: no reports; the tree stops")
            nodes, counts = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.float64)
            break
        level_counts, zero_se = estimated
        selection = select_nodes(level_counts, zero_se, n_hat=n_hat, k=k, alpha=alpha, max_nodes=max_nodes,
                                 mass_fraction=mass_fraction, z=z, min_count=min_count)
        nodes, counts = candidates[selection.kept], np.asarray(level_counts, dtype=np.float64)[selection.kept]
        growth.kept[level] = (nodes, counts)
        growth.diagnostics.update({f"{prefix}level_{level}_tested": float(candidates.size),
                                   f"{prefix}level_{level}_threshold": selection.threshold,
                                   f"{prefix}level_{level}_kept": float(nodes.size)})
        if selection.capped:
            growth.warnings.append(f"{prefix}level {level}: more than {max_nodes} nodes passed the threshold; "
                                   "kept the largest")
        if nodes.size == 0:
            growth.warnings.append(f"{prefix}level {level}: no node passed the threshold {selection.threshold:.4g}")
            break
        if level < layout.levels:
            candidates = children(nodes, layout.child_bits)
    return TreeGrowth(nodes=nodes, counts=counts, level=level, kept=growth.kept, diagnostics=growth.diagnostics,
                      warnings=growth.warnings)


def grid_node_positions(nodes: ArrayLike, level: int, dimension: int) -> NDArray[np.float64]:
    """Centres of shifted-grid nodes in the grid's own ``[0, 1)^k`` coordinates (Morton decoded).

    The Morton convention is :func:`ldp_client.encoders.geometry.morton_encode`'s: bit ``b`` of
    coordinate ``r`` sits at index bit ``b * k + r`` counted from the least significant end, with
    coordinate ``r = 0`` the least significant within each group of ``k`` bits.
    """
    idx = np.asarray(nodes, dtype=np.uint64).reshape(-1)
    coords = np.zeros((idx.size, dimension), dtype=np.float64)
    for bit in range(level):
        for r in range(dimension):
            coords[:, r] += ((idx >> np.uint64(bit * dimension + r)) & np.uint64(1)).astype(np.float64) * (1 << bit)
    out: NDArray[np.float64] = (coords + 0.5) / float(1 << level)
    return out


def shifted_cell_centres(nodes: ArrayLike, level: int, shift: ArrayLike, half_width: float) -> NDArray[np.float64]:
    """Centres of shifted-grid cells in the grid's ``z`` units (``ShiftedGridEncoder``'s construction inverted).

    Cell ``c`` (per coordinate) covers ``v`` in ``[c, c + 1) / 2^l`` with ``v = (u + s) / 2`` and
    ``u = (z + R) / (2 R)``, so its centre is ``z = R (2 (2 v_c - s) - 1)``, ``v_c = (c + 1/2) / 2^l``.
    """
    s = np.asarray(shift, dtype=np.float64).reshape(-1)
    v = grid_node_positions(nodes, level, s.size)
    out: NDArray[np.float64] = half_width * (2.0 * (2.0 * v - s[None, :]) - 1.0)
    return out


def combine_center_estimates(vector_centers: ArrayLike, vector_variance: ArrayLike, cell_centers: ArrayLike,
                             cell_mse: ArrayLike) -> NDArray[np.float64]:
    """Inverse-MSE combination, per center, of the pooled vector-sum means and the cell-centre means.

    Parameters
    ----------
    vector_centers, cell_centers : array_like, shape (k, d)
        Two estimates of each center: unbiased but noisy (vector sums), and nearly noise-free but
        quantized (count-weighted cell centres).
    vector_variance, cell_mse : array_like, shape (k,)
        Per-coordinate variance of the first and mean squared error bound of the second.
    """
    a = np.asarray(vector_centers, dtype=np.float64)
    b = np.asarray(cell_centers, dtype=np.float64)
    va = np.asarray(vector_variance, dtype=np.float64).reshape(-1, 1)
    vb = np.asarray(cell_mse, dtype=np.float64).reshape(-1, 1)
    if a.shape != b.shape or va.shape[0] != a.shape[0] or vb.shape[0] != a.shape[0]:
        raise InvalidParameterError(f"estimates must be (k, d) with (k,) variances, got {a.shape}, {b.shape}")
    if np.any(va < 0) or np.any(vb <= 0):
        raise InvalidParameterError("variances must be >= 0 and cell MSEs > 0")
    wa = np.where(va > 0, 1.0 / np.where(va > 0, va, 1.0), np.inf)
    wb = 1.0 / vb
    out: NDArray[np.float64] = np.where(np.isinf(wa), a, (a * np.where(np.isinf(wa), 0.0, wa) + b * wb)
                                        / (np.where(np.isinf(wa), 0.0, wa) + wb))
    return out


@dataclass(frozen=True, kw_only=True, eq=False)
class CoresetCenters:
    """Centers from a weighted coreset (:func:`coreset_centers`)."""

    #: (k', d) centers in the sums' units; k' <= k (fewer leaves than k: one center per leaf).
    centers: NDArray[np.float64]
    #: Total leaf weight of each center.
    weights: NDArray[np.float64]
    #: Center of each leaf.
    labels: NDArray[np.int64]


def coreset_centers(sums: ArrayLike, weights: ArrayLike, k: int, rng: np.random.Generator, *,
                    positions: ArrayLike | None = None, n_init: int = 10) -> CoresetCenters:
    """Weighted k-means on the leaves, then pooled means ``sum S / sum w`` per cluster.

    Parameters
    ----------
    sums : array_like, shape (L, d)
        Each leaf's (noisy, unbiased) vector sum.
    weights : array_like, shape (L,)
        Each leaf's estimated count (positive).
    k : int
    rng : numpy.random.Generator
    positions : array_like, shape (L, d'), optional
        Where to cluster the leaves (the paper-faithful variant: node positions in the projected
        space); by default their representatives ``sums / weights``.
    n_init : int
        k-means++ restarts.
    """
    s = np.asarray(sums, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if s.ndim != 2 or s.shape[0] != w.size or s.shape[0] == 0:
        raise InvalidParameterError(f"need L >= 1 leaves with sums (L, d) and weights (L,), got {s.shape}, {w.shape}")
    if np.any(~np.isfinite(w)) or np.any(w <= 0):
        raise InvalidParameterError("leaf weights must be positive and finite")
    where = s / w[:, None] if positions is None else np.asarray(positions, dtype=np.float64)
    if where.shape[0] != w.size:
        raise InvalidParameterError(f"positions must have one row per leaf, got {where.shape}")
    leaves = w.size
    if leaves <= k:
        labels = np.arange(leaves, dtype=np.int64)
    else:
        labels = _precision_seeded_kmeans(where, w, k, rng, n_init)
    used = np.unique(labels)
    remap = np.full(int(labels.max()) + 1, -1, dtype=np.int64)
    remap[used] = np.arange(used.size)
    labels = remap[labels]
    pooled_w = np.bincount(labels, weights=w, minlength=used.size).astype(np.float64)
    pooled_s = np.column_stack([np.bincount(labels, weights=s[:, j], minlength=used.size) for j in range(s.shape[1])])
    centers: NDArray[np.float64] = pooled_s / pooled_w[:, None]
    return CoresetCenters(centers=centers, weights=pooled_w, labels=labels)


def _precision_seeded_kmeans(x: NDArray[np.float64], w: NDArray[np.float64], k: int, rng: np.random.Generator,
                             n_init: int) -> NDArray[np.int64]:
    """Best of ``n_init`` runs of k-means++ seeded with weights ``w^2``, then Lloyd with weights ``w``.

    A leaf's representative is a sum over its count, so its noise variance falls like ``1 / w^2``:
    seeding by ``w^2`` (its precision times its mass) keeps the light, noisy fragments from being
    picked as seeds far from every cluster, while Lloyd's pooled means stay mass-weighted.
    """
    best_cost, best = math.inf, np.zeros(x.shape[0], dtype=np.int64)
    for _ in range(n_init):
        fit = lloyd(x, kmeans_plus_plus(x, k, rng, w * w), w)
        if fit.cost < best_cost:
            best_cost, best = fit.cost, fit.labels.astype(np.int64)
    return best
