"""Non-private references: k-means++ (the cost-ratio denominator's method) and "standard" k-means.

``kmeans_plus_plus_baseline``
    Weighted k-means++ seeding + Lloyd, best of ``n_init`` runs
    (:func:`ldp_collector.estimation.kmeans.weighted_kmeans`): what a trusted curator without any
    privacy constraint gets. Every private protocol is judged against it.
``standard_kmeans``
    The "standard K-means" of ``papers/003`` (its Algorithm 1): ``k`` distinct data points drawn
    uniformly at random as the initial centers, one Lloyd run. The baseline that paper's
    density-based initialisation claims to beat.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ldp_collector.estimation.kmeans import lloyd, weighted_kmeans

from ._common import Clustering, check_k, check_points

__all__ = ["kmeans_plus_plus_baseline", "standard_kmeans"]


def kmeans_plus_plus_baseline(x: ArrayLike, k: int, *, seed: int, n_init: int = 5) -> Clustering:
    """Non-private k-means++ (best of ``n_init``) on the raw points."""
    points = check_points(x)
    k = check_k(k, len(points))
    result = weighted_kmeans(points, k, np.random.default_rng(seed), n_init=n_init)
    return Clustering(centers=result.centers, labels=result.labels,
                      diagnostics={"iterations": float(result.iterations), "n_init": float(n_init)})


def standard_kmeans(x: ArrayLike, k: int, *, seed: int, max_iter: int = 100) -> Clustering:
    """Random-initialised Lloyd (``papers/003`` Algorithm 1): one run from ``k`` random data points."""
    points = check_points(x)
    k = check_k(k, len(points))
    rng = np.random.default_rng(seed)
    start = points[rng.choice(len(points), size=k, replace=False)]
    result = lloyd(points, start, max_iter=max_iter)
    return Clustering(centers=result.centers, labels=result.labels,
                      diagnostics={"iterations": float(result.iterations)})
