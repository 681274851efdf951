"""DPQTk-means: k-means on the leaves of a differentially private quadtree (``papers/001``).

Trusted-curator reference. Zhang and Cheng's Algorithms 1-3, level by level in numpy:

1. Split the budget: ``epsilon_1 = gamma * epsilon`` builds the tree, ``epsilon_2 = (1 - gamma) *
   epsilon`` releases the leaf counts (paper: ``gamma = 0.3``).
2. ``buildDPQuadTree`` (Algorithm 2): starting from the data box, a node at depth ``h < maxH``
   releases its count plus ``Lap(1 / (epsilon_1 / maxH))`` (the paper's uniform per-level
   allocation, refs. [18-20]); it splits into four equal children (Algorithm 3, child ``j`` takes
   the upper half of dimension ``b`` iff bit ``b`` of ``j`` is set) when ``h < maxH`` and the
   noisy count exceeds the threshold ``T``; otherwise it is a leaf. Nodes at depth ``maxH`` are
   leaves without a count of their own, so a root-to-leaf path spends at most ``maxH`` level
   budgets: ``epsilon_1`` in total.
3. Every leaf (bucket) is represented by its cell centre and released with ``count +
   Lap(1 / epsilon_2)`` (Algorithm 1, line 11; leaves are disjoint: parallel composition).
4. Weighted k-means on the buckets (noisy counts clipped at 0) gives the ``k`` centers (in the
   data's units).

Parameters as in the paper's section 3: ``maxH = ln(N) / d`` (rounded, at least 1) and ``T = N /
1000``, where ``N`` is the number of points (the paper treats the data size as public).

Choices the paper leaves open, made here and said so
    * The paper initialises the final k-means with "the result of k-means on the data set"; using
      the raw data there would spend budget the analysis does not account for, so the buckets'
      own weighted k-means++ (best of 5) is used.
    * The tree's box is the public box of the harness (the paper computes the data range, which is
      itself not private).
    * The quadtree generalizes to ``2^d`` children in ``d`` dimensions; the paper (and the harness
      adapter) uses ``d = 2`` only.
Privacy
    Sequential composition of the tree levels (``epsilon_1``) and the leaf counts
    (``epsilon_2``); within a level, and among the leaves, nodes are disjoint (parallel
    composition). Count sensitivity 1. Total ``epsilon``.
``epsilon = inf``
    The documented no-noise bypass: the tree splits on true counts and the leaf counts are exact.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_collector.estimation.kmeans import weighted_kmeans

from ._common import Box, Clustering, check_epsilon, check_k, check_points, laplace

__all__ = ["QuadTree", "build_dp_quadtree", "dp_quadtree_kmeans", "paper_parameters"]


def paper_parameters(n: int, d: int) -> tuple[int, float]:
    """``(maxH, T)`` of ``papers/001``: ``maxH = ln(N) / d`` (rounded, >= 1), ``T = N / 1000``."""
    return max(1, round(math.log(n) / d)), n / 1000.0


class QuadTree:
    """The leaves of a (DP) quadtree over the unit box.

    Attributes
    ----------
    lower : numpy.ndarray
        ``(leaves, d)`` lower corners.
    side : numpy.ndarray
        ``(leaves,)`` side lengths.
    depth : numpy.ndarray
        ``(leaves,)`` depths (root = 0).
    counts : numpy.ndarray
        ``(leaves,)`` true counts (kept for tests; never released).
    nodes : int
        Nodes that released a noisy count.
    """

    def __init__(self, lower: NDArray[np.float64], side: NDArray[np.float64], depth: NDArray[np.int64],
                 counts: NDArray[np.int64], nodes: int) -> None:
        self.lower = lower
        self.side = side
        self.depth = depth
        self.counts = counts
        self.nodes = nodes

    @property
    def centers(self) -> NDArray[np.float64]:
        """Leaf (bucket) centres."""
        out: NDArray[np.float64] = self.lower + self.side[:, None] / 2.0
        return out

    def __len__(self) -> int:
        return int(self.side.shape[0])


def build_dp_quadtree(unit: NDArray[np.float64], epsilon_tree: float, max_height: int, threshold: float,
                      rng: np.random.Generator) -> QuadTree:
    """Algorithms 2-3 of ``papers/001`` over points in ``[0, 1]^d`` (module docstring).

    ``epsilon_tree = inf`` splits on true counts.
    """
    n, d = unit.shape
    scale = 0.0 if math.isinf(epsilon_tree) else max_height / epsilon_tree
    node_lower = np.zeros((1, d))
    node_side = np.ones(1)
    node_of_point = np.zeros(n, dtype=np.int64)
    leaves_lower: list[NDArray[np.float64]] = []
    leaves_side: list[NDArray[np.float64]] = []
    leaves_depth: list[NDArray[np.int64]] = []
    leaves_count: list[NDArray[np.int64]] = []
    released = 0
    bits = 1 << np.arange(d)
    for h in range(max_height + 1):
        m = len(node_side)
        counts = np.bincount(node_of_point, minlength=m)
        if h == max_height:
            split = np.zeros(m, dtype=bool)
        else:
            noisy = counts + laplace(scale, m, rng)
            released += m
            split = noisy > threshold
        leaf = ~split
        leaves_lower.append(node_lower[leaf])
        leaves_side.append(node_side[leaf])
        leaves_depth.append(np.full(int(leaf.sum()), h, dtype=np.int64))
        leaves_count.append(counts[leaf])
        if not split.any():
            break
        # Children of the split nodes: 2^d each, child j in the upper half of dimension b iff bit b of j.
        parents = np.flatnonzero(split)
        half = node_side[parents] / 2.0
        child_bits = (np.arange(2**d)[:, None] & bits[None, :]) > 0  # (2^d, d)
        new_lower = (node_lower[parents][:, None, :] + child_bits[None, :, :] * half[:, None, None]).reshape(-1, d)
        new_side = np.repeat(half, 2**d)
        # Points of split nodes move to their child; the others are done (their node became a leaf).
        parent_rank = np.full(m, -1, dtype=np.int64)
        parent_rank[parents] = np.arange(len(parents))
        rank = parent_rank[node_of_point]
        keep = rank >= 0
        mid = node_lower[node_of_point[keep]] + node_side[node_of_point[keep]][:, None] / 2.0
        child = ((unit[keep] >= mid) * bits[None, :]).sum(axis=1)
        unit = unit[keep]
        node_of_point = rank[keep] * 2**d + child
        node_lower, node_side = new_lower, new_side
    return QuadTree(np.concatenate(leaves_lower), np.concatenate(leaves_side), np.concatenate(leaves_depth),
                    np.concatenate(leaves_count), released)


def dp_quadtree_kmeans(x: ArrayLike, k: int, epsilon: float, *, seed: int, gamma: float = 0.3,
                       max_height: int | None = None, threshold: float | None = None) -> Clustering:
    """DPQTk-means (module docstring); ``max_height`` and ``threshold`` default to the paper's rules."""
    points = check_points(x)
    k = check_k(k, len(points))
    epsilon = check_epsilon(epsilon)
    if not 0.0 < gamma < 1.0:
        raise ValueError(f"gamma must be in (0, 1), got {gamma!r}")
    n, d = points.shape
    default_height, default_threshold = paper_parameters(n, d)
    height = default_height if max_height is None else int(max_height)
    if height < 1:
        raise ValueError(f"max_height must be at least 1, got {max_height!r}")
    t = default_threshold if threshold is None else float(threshold)
    box = Box.of(points)
    rng = np.random.default_rng(seed)
    tree = build_dp_quadtree(box.to_unit(points), gamma * epsilon, height, t, rng)
    epsilon_leaves = (1.0 - gamma) * epsilon
    leaf_scale = 0.0 if math.isinf(epsilon_leaves) else 1.0 / epsilon_leaves
    noisy = np.maximum(tree.counts + laplace(leaf_scale, len(tree), rng), 0.0)
    buckets = box.from_unit(tree.centers)  # k-means in the data's units
    positive = noisy > 0
    centers = _weighted_centers(buckets[positive], noisy[positive], k, box, rng)
    return Clustering(centers=centers, diagnostics={
        "leaves": float(len(tree)), "released_nodes": float(tree.nodes), "max_height": float(height),
        "threshold": t, "max_leaf_depth": float(tree.depth.max()), "epsilon_tree": gamma * epsilon,
        "epsilon_leaves": epsilon_leaves})


def _weighted_centers(buckets: NDArray[np.float64], weights: NDArray[np.float64], k: int, box: Box,
                      rng: np.random.Generator) -> NDArray[np.float64]:
    """Weighted k-means++ (best of 5) on the buckets; with fewer than ``k`` buckets of positive weight,
    the missing centers are drawn uniformly in the box (data-independent)."""
    if len(buckets) >= k:
        out: NDArray[np.float64] = weighted_kmeans(buckets, k, rng, weights=weights, n_init=5).centers
        return out
    extra = box.from_unit(rng.uniform(0.0, 1.0, size=(k - len(buckets), box.dimension)))
    return np.vstack([buckets.reshape(-1, box.dimension), extra])
