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
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.errors import InvalidParameterError

from ..evaluation.kmeans import weighted_kmeans
from .heavy_hitters import bonferroni_z

__all__ = [
    "MASS_FRACTION",
    "CoresetCenters",
    "LevelSelection",
    "NetTreeLayout",
    "center_error_floor",
    "children",
    "coreset_centers",
    "detection_sigma",
    "grid_node_positions",
    "select_nodes",
    "signal_to_noise",
]

#: A kept node holds at least 1 / MASS_FRACTION of an average cluster (n / k devices).
MASS_FRACTION = 4.0


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
                 max_nodes: int, mass_fraction: float = MASS_FRACTION) -> LevelSelection:
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
    """
    c = np.asarray(counts, dtype=np.float64).reshape(-1)
    if not 0.0 < alpha < 1.0 or max_nodes < 1 or k < 1:
        raise InvalidParameterError(f"need alpha in (0, 1), max_nodes >= 1 and k >= 1, got {alpha}, {max_nodes}, {k}")
    z = bonferroni_z(max(1, c.size), alpha)
    noise = z * float(zero_std_error)
    mass = max(float(n_hat), 0.0) / (mass_fraction * k)
    threshold = max(noise, mass)
    passed = np.flatnonzero(c >= threshold)
    order = passed[np.argsort(-c[passed], kind="stable")]
    capped = order.size > max_nodes
    kept = order[:max_nodes].astype(np.int64)
    return LevelSelection(threshold=threshold, z=z, noise_threshold=noise, mass_threshold=mass, kept=kept,
                          capped=bool(capped))


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
        labels = weighted_kmeans(where, k, rng, weights=w, n_init=n_init).labels.astype(np.int64)
    used = np.unique(labels)
    remap = np.full(int(labels.max()) + 1, -1, dtype=np.int64)
    remap[used] = np.arange(used.size)
    labels = remap[labels]
    pooled_w = np.bincount(labels, weights=w, minlength=used.size)
    pooled_s = np.column_stack([np.bincount(labels, weights=s[:, j], minlength=used.size) for j in range(s.shape[1])])
    centers: NDArray[np.float64] = pooled_s / pooled_w[:, None]
    return CoresetCenters(centers=centers, weights=pooled_w, labels=labels)
