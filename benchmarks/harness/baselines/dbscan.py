"""Non-private DBSCAN (scikit-learn): the density-based reference for arbitrary-shape clusters.

DBSCAN needs a radius and a core-point count. The harness picks them the usual data-driven way
(Ester et al. 1996; Schubert et al. 2017, "DBSCAN revisited"): ``min_samples = 2 d`` (at least 4),
and ``eps`` at a quantile of the distance to the ``min_samples``-th nearest neighbour (the "knee"
of the sorted k-distance plot sits in the upper quantiles; 0.9 by default), measured on the
points scaled to the unit box. Large inputs are clustered on a random subsample of at most
``sample`` points; every other point takes the label of its nearest core sample within ``eps``
(else noise, ``-1``), which is how DBSCAN labels a new point.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._common import Box, Clustering, check_points

__all__ = ["dbscan_baseline"]


def dbscan_baseline(x: ArrayLike, *, seed: int, quantile: float = 0.9, min_samples: int | None = None,
                    sample: int = 20_000) -> Clustering:
    """DBSCAN with data-driven ``eps`` (module docstring); no centers, labels with ``-1`` = noise."""
    from sklearn.cluster import DBSCAN  # type: ignore[import-untyped, unused-ignore]
    from sklearn.neighbors import NearestNeighbors  # type: ignore[import-untyped, unused-ignore]

    points = check_points(x)
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile!r}")
    unit = Box.of(points).to_unit(points)
    n, d = unit.shape
    m = max(4, 2 * d) if min_samples is None else int(min_samples)
    if not 2 <= m <= n:
        raise ValueError(f"min_samples must be in [2, {n}], got {m}")
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(n, size=sample, replace=False)) if n > sample else np.arange(n)
    fit = unit[chosen]
    distances, _ = NearestNeighbors(n_neighbors=m).fit(fit).kneighbors(fit)
    radius = float(np.quantile(distances[:, -1], quantile))
    model = DBSCAN(eps=radius, min_samples=m).fit(fit)
    labels = np.full(n, -1, dtype=np.int64)
    labels[chosen] = model.labels_
    if len(chosen) < n:
        core = model.core_sample_indices_
        rest = np.setdiff1d(np.arange(n), chosen, assume_unique=True)
        labels[rest] = _label_by_core(unit[rest], fit[core], model.labels_[core], radius)
    clusters = len(set(labels.tolist()) - {-1})
    return Clustering(centers=None, labels=labels,
                      diagnostics={"eps_unit": radius, "min_samples": float(m), "clusters": float(clusters),
                                   "noise_share": float(np.mean(labels < 0)), "fit_points": float(len(chosen))})


def _label_by_core(points: NDArray[np.float64], core: NDArray[np.float64], core_labels: NDArray[np.int64],
                   radius: float) -> NDArray[np.int64]:
    from sklearn.neighbors import NearestNeighbors  # type: ignore[import-untyped, unused-ignore]

    if len(core) == 0:
        return np.full(len(points), -1, dtype=np.int64)
    dist, idx = NearestNeighbors(n_neighbors=1).fit(core).kneighbors(points)
    out: NDArray[np.int64] = np.where(dist[:, 0] <= radius, core_labels[idx[:, 0]], -1).astype(np.int64)
    return out
