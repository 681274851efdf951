"""Weighted k-means for everything server-side: k-means++ seeding, Lloyd iterations, best of n_init.

The clustering protocols run it on private coresets (weighted points); the simulation package
runs it on noised points or grid-cell histograms (the LDP floors) and on the raw data for the
non-private reference of the cost ratio (:mod:`ldp_collector.simulation.scores`). numpy only; every distance computation is chunked (about 32 MB of scratch
whatever n).

Negative weights
    An unbiased LDP estimate of a cell's count can be negative, so coreset weights can be. The
    choice made here, everywhere:

    * **seeding** samples with the positive part ``max(w, 0)`` (a point cannot be drawn with a
      negative probability; a point of weight <= 0 is never a seed);
    * **the mean update keeps the signed weights** (clipping would bias every center towards
      the noise), but a cluster whose total weight is not clearly positive
      (``<= 1e-9 * sum |w|``) has no meaningful mean: it is treated as empty and re-seeded;
    * **centers are clipped to the bounding box of the positive-weight points**, so a cluster
      whose positive and negative weights nearly cancel cannot throw its center far outside
      the data;
    * **the cost is the signed sum** ``sum_i w_i d(x_i, C)^2``, the unbiased estimate of the
      true cost, and is what ``n_init`` restarts are ranked by.

    With non-negative weights this is ordinary weighted k-means, and integer weights are the
    same as repeating the points.

Randomness
    ``rng`` is a ``numpy.random.Generator``, a seed, or ``None`` (fresh OS entropy). k-means runs
    on data already privatized (or, for the reference, on data the benchmark owns), so its
    randomness is post-processing and needs no cryptographic generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.errors import InvalidParameterError

__all__ = [
    "KMeansResult",
    "assign",
    "kmeans_plus_plus",
    "lloyd",
    "squared_distances",
    "weighted_kmeans",
]

#: A cluster whose total weight is at most this share of ``sum |w|`` is treated as empty.
_MIN_CLUSTER_WEIGHT = 1e-9
#: Number of distance entries (rows x centers) computed at once; bounds the scratch memory to
#: about 32 MB whatever n.
_CHUNK_ENTRIES = 1 << 22


# -- inputs and distances (shared with the clustering scores of the simulation package) --------------

def _points(name: str, x: ArrayLike) -> NDArray[np.float64]:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise InvalidParameterError(f"{name} must be a non-empty 2-D array (points x dimensions), got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise InvalidParameterError(f"{name} must be finite, got a NaN or infinite value")
    return arr


def _centers(x: NDArray[np.float64], centers: ArrayLike, name: str = "centers") -> NDArray[np.float64]:
    c = np.asarray(centers, dtype=np.float64)
    if c.ndim == 1 and x.shape[1] == 1:
        c = c[:, None]
    if c.ndim != 2 or c.shape[0] == 0 or c.shape[1] != x.shape[1]:
        raise InvalidParameterError(
            f"{name} must be a non-empty (k, {x.shape[1]}) array matching the points' dimension, got shape {c.shape}")
    if not np.isfinite(c).all():
        raise InvalidParameterError(f"{name} must be finite, got a NaN or infinite value")
    return c


def _weights(weights: ArrayLike | None, n: int) -> NDArray[np.float64] | None:
    if weights is None:
        return None
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape != (n,):
        raise InvalidParameterError(f"weights must hold one value per point ({n}), got {w.size}")
    if not np.isfinite(w).all():
        raise InvalidParameterError("weights must be finite, got a NaN or infinite value")
    return w


def squared_distances(x: NDArray[np.float64], centers: NDArray[np.float64]) -> NDArray[np.float64]:
    """``(len(x), len(centers))`` squared Euclidean distances, clipped at 0.

    Uses ``|x|^2 - 2 x.c + |c|^2`` after moving the origin to the centers' mean, which keeps the
    cancellation error small when the data sit far from the origin. The caller chunks ``x``.
    """
    origin = centers.mean(axis=0)
    xs = x - origin
    cs = centers - origin
    d2 = (xs * xs).sum(axis=1)[:, None] - 2.0 * (xs @ cs.T) + (cs * cs).sum(axis=1)[None, :]
    out: NDArray[np.float64] = np.maximum(d2, 0.0)
    return out


def _chunk_rows(k: int) -> int:
    return max(1024, _CHUNK_ENTRIES // max(k, 1))


@dataclass(frozen=True, kw_only=True, eq=False)
class KMeansResult:
    """One k-means fit.

    Attributes
    ----------
    centers : numpy.ndarray of shape (k, d)
    labels : numpy.ndarray of int64, shape (n,)
        Each point's nearest center.
    cost : float
        ``sum_i w_i * |x_i - centers[labels_i]|^2`` (signed with signed weights).
    iterations : int
        Lloyd iterations run (of the best restart for :func:`weighted_kmeans`).
    """

    centers: NDArray[np.float64]
    labels: NDArray[np.int64]
    cost: float
    iterations: int


def _generator(rng: np.random.Generator | int | None) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) and rng >= 0):
        return np.random.default_rng(rng)
    raise InvalidParameterError(f"rng must be a numpy.random.Generator, a non-negative seed or None, got {rng!r}")


def _check_k(k: object, n: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise InvalidParameterError(f"k must be an integer in [1, {n}] (the number of points), got {k!r}")
    return int(k)


def _check_positive_int(name: str, value: object, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= high:
        raise InvalidParameterError(f"{name} must be an integer in [1, {high}], got {value!r}")
    return int(value)


def _positive_part(w: NDArray[np.float64] | None, n: int) -> NDArray[np.float64]:
    if w is None:
        return np.ones(n)
    pos: NDArray[np.float64] = np.maximum(w, 0.0)
    if not pos.sum() > 0:
        raise InvalidParameterError("weights must include at least one positive weight")
    return pos


def assign(X: ArrayLike, centers: ArrayLike) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Nearest center of every point, chunked.

    Parameters
    ----------
    X : array-like of shape (n, d)
    centers : array-like of shape (k, d)

    Returns
    -------
    labels : numpy.ndarray of int64, shape (n,)
        Index of the nearest center (the lowest index on ties).
    sq_dists : numpy.ndarray of float64, shape (n,)
        Squared distance to it.
    """
    x = _points("X", X)
    c = _centers(x, centers)
    labels = np.empty(len(x), dtype=np.int64)
    sq = np.empty(len(x))
    rows = _chunk_rows(len(c))
    for start in range(0, len(x), rows):
        d2 = squared_distances(x[start:start + rows], c)
        best = d2.argmin(axis=1)
        labels[start:start + rows] = best
        sq[start:start + rows] = d2[np.arange(len(best)), best]
    return labels, sq


def _sample(rng: np.random.Generator, mass: NDArray[np.float64], size: int) -> NDArray[np.int64]:
    """``size`` indices drawn with replacement in proportion to ``mass`` (>= 0, positive sum)."""
    cumulative = np.cumsum(mass)
    draws = rng.uniform(0.0, cumulative[-1], size=size)
    idx = np.searchsorted(cumulative, draws, side="right")
    # A draw rounding up to the total lands past the end: take the last point with mass.
    last = int(np.flatnonzero(mass > 0)[-1])
    out: NDArray[np.int64] = np.minimum(idx, last).astype(np.int64)
    return out


def kmeans_plus_plus(X: ArrayLike, k: int, rng: np.random.Generator | int | None = None,
                     weights: ArrayLike | None = None, *, n_local_trials: int | None = None) -> NDArray[np.float64]:
    """k-means++ seeding (Arthur and Vassilvitskii 2007) with weighted D^2 sampling.

    The first center is drawn in proportion to ``max(w, 0)``, each next one in proportion to
    ``max(w, 0) * D(x)^2`` (``D`` the distance to the nearest center so far). Greedy variant, as
    scikit-learn's: each step draws ``n_local_trials`` candidates and keeps the one that lowers
    the weighted potential most.

    Parameters
    ----------
    X : array-like of shape (n, d)
    k : int
        In ``[1, n]``.
    rng : numpy.random.Generator, int or None
    weights : array-like of shape (n,), optional
        Point weights; only their positive part matters here.
    n_local_trials : int, optional
        Candidates per step; default ``2 + floor(ln k)``; 1 is plain k-means++.

    Returns
    -------
    numpy.ndarray of shape (k, d)
        Rows of ``X``. When fewer than ``k`` distinct points carry positive weight, some centers
        repeat (Lloyd then re-seeds the clusters left empty).
    """
    x = _points("X", X)
    n = len(x)
    k = _check_k(k, n)
    pos = _positive_part(_weights(weights, n), n)
    gen = _generator(rng)
    trials = 2 + int(math.log(k)) if n_local_trials is None else _check_positive_int("n_local_trials",
                                                                                     n_local_trials, 1000)
    geometry = _Shifted(x)
    centers = np.empty((k, x.shape[1]))
    first = int(_sample(gen, pos, 1)[0])
    centers[0] = x[first]
    closest = geometry.nearest(centers[:1])[1]
    for c in range(1, k):
        mass = pos * closest
        candidates = _sample(gen, mass if mass.sum() > 0 else pos, trials)
        potentials = np.zeros(trials)
        for start, stop in geometry.chunks(trials):
            d2 = np.minimum(geometry.sq(x[candidates], start, stop), closest[start:stop, None])
            potentials += pos[start:stop] @ d2
        best = int(candidates[int(np.argmin(potentials))])
        centers[c] = x[best]
        for start, stop in geometry.chunks(1):
            closest[start:stop] = np.minimum(closest[start:stop], geometry.sq(x[best:best + 1], start, stop)[:, 0])
    return centers


class _Shifted:
    """The points moved to their mean, with their squared norms cached, for repeated distance
    passes (k-means++ steps, Lloyd iterations): ``|x - c|^2 = |x|^2 - 2 x.c + |c|^2`` in the
    shifted frame keeps the cancellation error small when the data sit far from the origin."""

    def __init__(self, x: NDArray[np.float64]) -> None:
        self.origin = x.mean(axis=0)
        self.x = x - self.origin
        self.norms = np.einsum("ij,ij->i", self.x, self.x)

    def chunks(self, columns: int) -> list[tuple[int, int]]:
        rows = _chunk_rows(columns)
        return [(start, min(start + rows, len(self.x))) for start in range(0, len(self.x), rows)]

    def sq(self, centers: NDArray[np.float64], start: int, stop: int) -> NDArray[np.float64]:
        """Squared distances of points ``start:stop`` to ``centers`` (given in the data's frame)."""
        cs = centers - self.origin
        d2 = self.norms[start:stop, None] - 2.0 * (self.x[start:stop] @ cs.T) + np.einsum("ij,ij->i", cs, cs)[None, :]
        out: NDArray[np.float64] = np.maximum(d2, 0.0)
        return out

    def nearest(self, centers: NDArray[np.float64]) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        labels = np.empty(len(self.x), dtype=np.int64)
        sq = np.empty(len(self.x))
        for start, stop in self.chunks(len(centers)):
            d2 = self.sq(centers, start, stop)
            best = d2.argmin(axis=1)
            labels[start:stop] = best
            sq[start:stop] = d2[np.arange(len(best)), best]
        return labels, sq


def _cluster_sums(x: NDArray[np.float64], labels: NDArray[np.int64], w: NDArray[np.float64] | None,
                  k: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Total weight and weighted coordinate sums of every cluster."""
    mass: NDArray[np.float64] = np.bincount(labels, weights=w, minlength=k).astype(np.float64)
    sums: NDArray[np.float64] = np.column_stack([
        np.bincount(labels, weights=x[:, j] if w is None else w * x[:, j], minlength=k) for j in range(x.shape[1])])
    return mass, sums


def lloyd(X: ArrayLike, centers: ArrayLike, weights: ArrayLike | None = None, max_iter: int = 100,
          tol: float = 1e-6) -> KMeansResult:
    """Lloyd's iterations from the given centers, with (signed) point weights.

    Each iteration assigns every point to its nearest center and moves each center to the
    weighted mean of its points. A cluster left empty, or whose total weight is not clearly
    positive, is re-seeded at the point (of positive weight) farthest from its center, the
    farthest first. Centers are clipped to the bounding box of the positive-weight points
    (see the module notes on negative weights).

    Parameters
    ----------
    X : array-like of shape (n, d)
    centers : array-like of shape (k, d)
        Starting centers.
    weights : array-like of shape (n,), optional
    max_iter : int
        In ``[1, 100000]``.
    tol : float
        Stop when the centers move by at most ``tol`` times the mean per-dimension variance of
        the data (summed squared shift, scikit-learn's criterion); ``0`` stops when the
        assignment no longer changes.

    Returns
    -------
    KMeansResult
    """
    x = _points("X", X)
    c = _centers(x, centers).copy()
    n, k = len(x), len(c)
    w = _weights(weights, n)
    pos = _positive_part(w, n)
    max_iter = _check_positive_int("max_iter", max_iter, 100_000)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 <= tol < math.inf:
        raise InvalidParameterError(f"tol must be a finite number >= 0, got {tol!r}")
    support = x[pos > 0]
    low, high = support.min(axis=0), support.max(axis=0)
    mean = np.average(support, axis=0, weights=pos[pos > 0])
    variance = float(np.average((support - mean) ** 2, axis=0, weights=pos[pos > 0]).mean())
    threshold = tol * variance
    floor = _MIN_CLUSTER_WEIGHT * (float(np.abs(w).sum()) if w is not None else float(n))
    geometry = _Shifted(x)
    iterations = 0
    while iterations < max_iter:
        iterations += 1
        labels, sq = geometry.nearest(c)
        mass, sums = _cluster_sums(x, labels, w, k)
        valid = mass > floor
        moved = c.copy()
        moved[valid] = np.clip(sums[valid] / mass[valid, None], low, high)
        empty = np.flatnonzero(~valid)
        if empty.size:
            # Farthest positive-weight points first; distinct points for distinct clusters.
            far = np.argsort(-np.where(pos > 0, sq, -1.0), kind="stable")[: empty.size]
            moved[empty[: far.size]] = x[far]
        shift = float(((moved - c) ** 2).sum())
        c = moved
        if shift <= threshold:
            break
    labels, sq = geometry.nearest(c)
    cost = float(sq.sum() if w is None else np.dot(w, sq))
    return KMeansResult(centers=c, labels=labels, cost=cost, iterations=iterations)


def weighted_kmeans(X: ArrayLike, k: int, rng: np.random.Generator | int | None = None,
                    weights: ArrayLike | None = None, n_init: int = 5, *, max_iter: int = 100,
                    tol: float = 1e-6) -> KMeansResult:
    """Best (lowest cost) of ``n_init`` runs of k-means++ seeding followed by :func:`lloyd`.

    Parameters
    ----------
    X : array-like of shape (n, d)
    k : int
        In ``[1, n]``.
    rng : numpy.random.Generator, int or None
        A seed makes the result deterministic.
    weights : array-like of shape (n,), optional
        Signed point weights (see the module notes).
    n_init : int
        Restarts, in ``[1, 1000]``.
    max_iter, tol
        As in :func:`lloyd`.

    Returns
    -------
    KMeansResult
    """
    x = _points("X", X)
    k = _check_k(k, len(x))
    w = _weights(weights, len(x))
    n_init = _check_positive_int("n_init", n_init, 1000)
    gen = _generator(rng)
    best: KMeansResult | None = None
    for _ in range(n_init):
        fit = lloyd(x, kmeans_plus_plus(x, k, gen, w), w, max_iter=max_iter, tol=tol)
        if best is None or fit.cost < best.cost:
            best = fit
    assert best is not None  # n_init >= 1
    return best
