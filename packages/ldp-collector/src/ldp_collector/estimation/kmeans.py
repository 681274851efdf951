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

One pass per iteration
    Every Lloyd iteration is one pass over the points (:class:`LloydPass`: given the centers, the
    weight, weighted coordinate sums and cost of every center's points), so the same iterations run
    on an array in memory (:class:`InMemory`, what :func:`lloyd` and :func:`weighted_kmeans` do) and
    on a round's reports through :meth:`~ldp_collector.kinds.base.RoundReports.combine`, in-process
    or on Apache Beam, without the points ever being held (:func:`kmeans_passes`). The restarts of
    one fit share each pass (every restart its own centers and sums). A pass's state is
    ``R k (d + 1) + R`` float64 for ``R`` restarts of ``k`` centers in ``d`` dimensions, plus one
    batch and about 32 MB of distance scratch; the statistics pass before the first iteration
    (:class:`PointStats`: weight, mean, spread and bounding box of the positive-weight points) is
    ``4 d + 3`` float64. A cluster left empty costs one more pass (:class:`FarthestPoints`, the
    points that re-seed it).

Randomness
    ``rng`` is a ``numpy.random.Generator``, a seed, or ``None`` (fresh OS entropy). k-means runs
    on data already privatized (or, for the reference, on data the benchmark owns), so its
    randomness is post-processing and needs no cryptographic generator.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.errors import InvalidParameterError

from ..storage.base import StoredReport
from .report_accumulator import DecodedPass, check_sample, sample_draw, sample_key

__all__ = [
    "FarthestPoints",
    "InMemory",
    "KMeansResult",
    "LloydPass",
    "LloydRun",
    "PassSource",
    "PointDecoder",
    "PointPass",
    "PointSample",
    "PointStats",
    "Points",
    "assign",
    "kmeans_passes",
    "kmeans_plus_plus",
    "lloyd",
    "plus_plus_starts",
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
    passes (the k-means++ steps): ``|x - c|^2 = |x|^2 - 2 x.c + |c|^2`` in the
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


# -- one pass over the points ------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Points:
    """A batch of decoded points, ``(rows, d)``, with optional signed weights: what a point pass adds."""

    x: NDArray[np.float64]
    weights: NDArray[np.float64] | None = None

    @property
    def nbytes(self) -> int:
        """Size of the batch (the decoded-batch budget of :meth:`~ldp_collector.kinds.base.RoundReports.combine`)."""
        return int(self.x.nbytes) + (0 if self.weights is None else int(self.weights.nbytes))


class PointDecoder(abc.ABC):
    """How a kind turns a batch of its stored reports into :class:`Points` (picklable, for Beam)."""

    @property
    @abc.abstractmethod
    def key(self) -> Hashable:
        """Equal keys decode the same batch to the same points (:attr:`DecodedPass.decoding`)."""

    @abc.abstractmethod
    def decode(self, reports: Sequence[StoredReport]) -> Points:
        """The batch's points (a malformed report raises ``ProtocolError``)."""


_T_co = TypeVar("_T_co", covariant=True)
_P = TypeVar("_P", bound=DecodedPass[Any])


class PointPass(DecodedPass[_T_co], Generic[_T_co]):
    """A pass over points: over a round's reports through its kind's ``decoder``, or over an array.

    Subclasses implement :meth:`add_decoded` on :class:`Points` (and ``zero``, ``merge``,
    ``finalize``, ``nbytes``); ``decoder`` is None for a pass that only ever sees arrays
    (:class:`InMemory`).
    """

    def __init__(self, decoder: PointDecoder | None) -> None:
        self.decoder = decoder

    @property
    def decoding(self) -> Hashable:
        return None if self.decoder is None else self.decoder.key

    def decode(self, reports: Sequence[StoredReport]) -> Points:
        if self.decoder is None:
            raise TypeError(f"{type(self).__name__} has no decoder: it adds arrays only")
        return self.decoder.decode(reports)


class PassSource(Protocol):
    """Where a pass's batches come from: a round (:class:`~ldp_collector.kinds.base.RoundReports`) or
    :class:`InMemory`."""

    def combine(self, accumulator: _P) -> _P:
        """``accumulator`` with every batch added."""
        ...


class InMemory:
    """Decoded batch(es) already in memory, as a pass source: the array path of an iterative step.

    ``combine`` adds them to the pass in one go, so an array runs the same passes, and the same
    arithmetic, as a round's reports.
    """

    def __init__(self, *decoded: Any) -> None:
        self.decoded = decoded

    def combine(self, accumulator: _P) -> _P:
        for batch in self.decoded:
            accumulator.add_decoded(batch)
        return accumulator


def _batch(points: Points) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
    x = np.asarray(points.x, dtype=np.float64)
    if x.ndim != 2:
        raise InvalidParameterError(f"a batch of points must be 2-D (rows x dimensions), got shape {x.shape}")
    return x, None if points.weights is None else np.asarray(points.weights, dtype=np.float64)


class PointStats(PointPass["PointStats"]):
    """Weight, mean, spread and bounding box of the positive-weight points (the pass before Lloyd's).

    Means and squared deviations are merged with Chan, Golub and LeVeque's pairwise update (no
    cancellation of ``E[x^2] - E[x]^2``). State: ``4 d + 3`` numbers.
    """

    def __init__(self, dimension: int, decoder: PointDecoder | None = None) -> None:
        super().__init__(decoder)
        self.dimension = int(dimension)
        #: Points added (whatever their weight).
        self.count = 0
        #: Sum of the positive parts of the weights (the points' count without weights).
        self.weight = 0.0
        #: Sum of |w| (the points' count without weights): the scale of an empty cluster's floor.
        self.abs_weight = 0.0
        self.mean = np.zeros(self.dimension)
        #: Weighted sum of squared deviations from the mean, per coordinate.
        self.m2 = np.zeros(self.dimension)
        self.low = np.full(self.dimension, np.inf)
        self.high = np.full(self.dimension, -np.inf)

    def zero(self) -> PointStats:
        return PointStats(self.dimension, self.decoder)

    def _fold(self, weight: float, mean: NDArray[np.float64], m2: NDArray[np.float64]) -> None:
        if weight <= 0:
            return
        total = self.weight + weight
        delta = mean - self.mean
        self.mean = self.mean + delta * (weight / total)
        self.m2 = self.m2 + m2 + delta * delta * (self.weight * weight / total)
        self.weight = total

    def add_decoded(self, decoded: Points) -> None:
        x, w = _batch(decoded)
        if not len(x):
            return
        self.count += len(x)
        pos = np.ones(len(x)) if w is None else np.maximum(w, 0.0)
        self.abs_weight += float(len(x) if w is None else np.abs(w).sum())
        support = pos > 0
        if not support.any():
            return
        xs, ps = x[support], pos[support]
        self.low = np.minimum(self.low, xs.min(axis=0))
        self.high = np.maximum(self.high, xs.max(axis=0))
        weight = float(ps.sum())
        mean = (ps @ xs) / weight
        self._fold(weight, mean, ps @ ((xs - mean) ** 2))

    def merge(self, other: PointStats) -> None:
        self.count += other.count
        self.abs_weight += other.abs_weight
        self.low = np.minimum(self.low, other.low)
        self.high = np.maximum(self.high, other.high)
        self._fold(other.weight, other.mean, other.m2)

    def finalize(self) -> PointStats:
        return self

    @property
    def variance(self) -> NDArray[np.float64]:
        """Per-coordinate weighted variance of the positive-weight points (0 without any)."""
        out: NDArray[np.float64] = self.m2 / self.weight if self.weight > 0 else np.zeros(self.dimension)
        return out

    @property
    def nbytes(self) -> int:
        return 4 * 8 * self.dimension + 3 * 8


def point_keys(salt: bytes, x: NDArray[np.float64]) -> NDArray[np.uint64]:
    """Each row's sample key: :func:`~ldp_collector.estimation.report_accumulator.sample_key` of its float64 bytes."""
    rows = np.ascontiguousarray(x, dtype=np.float64)
    width = rows.shape[1] * 8
    data = memoryview(rows.tobytes())
    return np.fromiter((sample_key(salt, data[i:i + width]) for i in range(0, len(rows) * width, width)),
                       dtype=np.uint64, count=len(rows))


class PointSample(PointPass[NDArray[np.float64]]):
    """A sample of a round's decoded points that depends only on the points, drawn from decoded batches.

    The points' counterpart of :class:`~ldp_collector.estimation.report_accumulator.ReportSample`,
    with a point's float64 coordinates as its content (:func:`point_keys`): keeps the ``size``
    distinct points of smallest key (ties by coordinates) with their exact counts, then lists
    ``size`` of them (:func:`~ldp_collector.estimation.report_accumulator.sample_draw`; what that
    draws is said there). The same whatever order batches come in and merge, and whatever the
    reports' ids. It shares its decoding with the passes that follow (the decoded batches are
    replayed in-process, no second reading of the round) and selects with numpy. Weights are not
    sampled. State: at most ``2 size (d + 2)`` numbers.
    """

    def __init__(self, size: int, dimension: int, decoder: PointDecoder | None = None, *, salt: bytes) -> None:
        super().__init__(decoder)
        check_sample(salt, size)
        self.size = int(size)
        self.salt = bytes(salt)
        self.keys = np.zeros(0, dtype=np.uint64)
        self.x = np.zeros((0, int(dimension)))
        self.counts = np.zeros(0, dtype=np.int64)
        #: The size-th (key, point) once that many are kept: rows of a larger key are out.
        self._bound: int | None = None

    def zero(self) -> PointSample:
        return PointSample(self.size, self.x.shape[1], self.decoder, salt=self.salt)

    def _keep(self, keys: NDArray[np.uint64], x: NDArray[np.float64], counts: NDArray[np.int64]) -> None:
        if self._bound is not None:
            # A key equal to the bound's may still be below it (by its coordinates): kept until the compaction.
            inside = keys <= np.uint64(self._bound)
            keys, x, counts = keys[inside], x[inside], counts[inside]
        if not len(keys):
            return
        self.keys = np.concatenate([self.keys, keys])
        self.x = np.concatenate([self.x, x])
        self.counts = np.concatenate([self.counts, counts])
        if len(self.keys) >= 2 * self.size:
            self._compact()

    def _compact(self) -> None:
        # The bound only falls: a point above it is above the size-th of every later state too.
        order = np.lexsort((*self.x.T[::-1], self.keys))
        keys, x, counts = self.keys[order], self.x[order], self.counts[order]
        if len(keys):
            same = (keys[1:] == keys[:-1]) & (x[1:] == x[:-1]).all(axis=1)
            starts = np.flatnonzero(np.concatenate([[True], ~same]))
            keys, x, counts = keys[starts], x[starts], np.add.reduceat(counts, starts)
        if len(keys) >= self.size:
            keys, x, counts = keys[: self.size], x[: self.size], counts[: self.size]
            self._bound = int(keys[-1])
        self.keys, self.x, self.counts = keys, x, counts

    def add_decoded(self, decoded: Points) -> None:
        x = _batch(decoded)[0]
        self._keep(point_keys(self.salt, x), x, np.ones(len(x), dtype=np.int64))

    def merge(self, other: PointSample) -> None:
        self._keep(other.keys, other.x, other.counts)

    def finalize(self) -> NDArray[np.float64]:
        """The listed points, ``(min(size, n), d)``, in lexicographic order of their coordinates.

        An order that does not depend on the report ids or the engine.
        """
        self._compact()
        order = np.lexsort(self.x.T[::-1])
        x, counts = self.x[order], self.counts[order]
        out: NDArray[np.float64] = np.repeat(x, sample_draw(self.salt, counts, self.size), axis=0)
        return out

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.x.nbytes + self.counts.nbytes)


class LloydPass(PointPass["LloydPass"]):
    """One Lloyd iteration of ``R`` restarts at once: each point's nearest center among its restart's ``k``.

    Given ``centers`` of shape ``(R, k, d)``, accumulates per restart and center the (signed)
    weight ``mass``, the weighted coordinate ``sums`` and the weighted squared distance ``cost``
    of the points nearest to it (the lowest index on ties). State: ``R k (d + 2)`` float64.
    """

    def __init__(self, centers: NDArray[np.float64], decoder: PointDecoder | None = None) -> None:
        super().__init__(decoder)
        self.centers = np.asarray(centers, dtype=np.float64)
        if self.centers.ndim != 3:
            raise InvalidParameterError(f"centers must be (restarts, k, d), got shape {self.centers.shape}")
        r, k, d = self.centers.shape
        self.mass = np.zeros((r, k))
        self.sums = np.zeros((r, k, d))
        self.cost = np.zeros((r, k))

    def zero(self) -> LloydPass:
        return LloydPass(self.centers, self.decoder)

    def add_decoded(self, decoded: Points) -> None:
        x, w = _batch(decoded)
        r, k, d = self.centers.shape
        flat_centers = self.centers.reshape(r * k, d)
        offsets = np.arange(r) * k
        for start in range(0, len(x), _chunk_rows(r * k)):
            xc = x[start:start + _chunk_rows(r * k)]
            wc = None if w is None else w[start:start + len(xc)]
            d2 = squared_distances(xc, flat_centers).reshape(len(xc), r, k)
            labels = d2.argmin(axis=2)
            sq = np.take_along_axis(d2, labels[:, :, None], axis=2)[:, :, 0]
            flat = (labels + offsets[None, :]).ravel()
            wr = None if wc is None else np.repeat(wc, r)
            self.mass += np.bincount(flat, weights=wr, minlength=r * k).reshape(r, k)
            self.cost += np.bincount(flat, weights=(sq if wc is None else sq * wc[:, None]).ravel(),
                                     minlength=r * k).reshape(r, k)
            for j in range(d):
                xj = np.repeat(xc[:, j], r)
                self.sums[:, :, j] += np.bincount(flat, weights=xj if wr is None else wr * xj,
                                                  minlength=r * k).reshape(r, k)

    def merge(self, other: LloydPass) -> None:
        self.mass += other.mass
        self.sums += other.sums
        self.cost += other.cost

    def finalize(self) -> LloydPass:
        return self

    @property
    def nbytes(self) -> int:
        return int(self.centers.nbytes + self.mass.nbytes + self.sums.nbytes + self.cost.nbytes)


class FarthestPoints(PointPass[NDArray[np.float64]]):
    """The ``size`` positive-weight points farthest from their nearest center (re-seeding empty clusters).

    Farthest first; on a tie the point added first. State: ``size (d + 1)`` float64.
    """

    def __init__(self, centers: NDArray[np.float64], size: int, decoder: PointDecoder | None = None) -> None:
        super().__init__(decoder)
        self.centers = np.asarray(centers, dtype=np.float64)
        self.size = int(size)
        self.x = np.zeros((0, self.centers.shape[1]))
        self.sq = np.zeros(0)

    def zero(self) -> FarthestPoints:
        return FarthestPoints(self.centers, self.size, self.decoder)

    def _keep(self, x: NDArray[np.float64], sq: NDArray[np.float64]) -> None:
        x, sq = np.concatenate([self.x, x]), np.concatenate([self.sq, sq])
        order = np.argsort(-sq, kind="stable")[: self.size]
        self.x, self.sq = x[order], sq[order]

    def add_decoded(self, decoded: Points) -> None:
        x, w = _batch(decoded)
        for start in range(0, len(x), _chunk_rows(len(self.centers))):
            xc = x[start:start + _chunk_rows(len(self.centers))]
            sq = squared_distances(xc, self.centers).min(axis=1)
            if w is not None:
                keep = w[start:start + len(xc)] > 0
                xc, sq = xc[keep], sq[keep]
            self._keep(xc, sq)

    def merge(self, other: FarthestPoints) -> None:
        self._keep(other.x, other.sq)

    def finalize(self) -> NDArray[np.float64]:
        return self.x

    @property
    def nbytes(self) -> int:
        return int(self.centers.nbytes + self.x.nbytes + self.sq.nbytes)


@dataclass(frozen=True, kw_only=True, eq=False)
class LloydRun:
    """One restart of :func:`kmeans_passes`: its centers and, at them, every cluster's weight and the cost."""

    centers: NDArray[np.float64]
    #: (Signed) weight of the points nearest to each center (their count without weights).
    mass: NDArray[np.float64]
    cost: float
    iterations: int


def _lloyd_runs(source: PassSource, starts: NDArray[np.float64], stats: PointStats, *,
                decoder: PointDecoder | None, max_iter: int, tol: float) -> list[LloydRun]:
    """Lloyd's iterations from every start ``(R, k, d)`` at once, one pass per iteration (see :func:`lloyd`)."""
    centers = np.array(starts, dtype=np.float64)
    threshold = tol * float(stats.variance.mean())
    floor = _MIN_CLUSTER_WEIGHT * stats.abs_weight
    iterations = np.zeros(len(centers), dtype=np.int64)
    running = list(range(len(centers)))
    while running:
        step = source.combine(LloydPass(centers[running], decoder))
        still: list[int] = []
        for a, r in enumerate(running):
            iterations[r] += 1
            c = centers[r]
            valid = step.mass[a] > floor
            moved = c.copy()
            moved[valid] = np.clip(step.sums[a][valid] / step.mass[a][valid, None], stats.low, stats.high)
            empty = np.flatnonzero(~valid)
            if empty.size:
                # Farthest positive-weight points first; distinct points for distinct clusters.
                far = source.combine(FarthestPoints(c, int(empty.size), decoder)).finalize()
                moved[empty[: len(far)]] = far
            shift = float(((moved - c) ** 2).sum())
            centers[r] = moved
            if shift > threshold and iterations[r] < max_iter:
                still.append(r)
        running = still
    final = source.combine(LloydPass(centers, decoder))
    return [LloydRun(centers=centers[r], mass=final.mass[r], cost=float(final.cost[r].sum()),
                     iterations=int(iterations[r])) for r in range(len(centers))]


def kmeans_passes(source: PassSource, starts: NDArray[np.float64], stats: PointStats, *,
                  decoder: PointDecoder | None = None, max_iter: int = 100, tol: float = 1e-6) -> LloydRun:
    """Lloyd's iterations from each start, one pass over ``source`` per iteration; the lowest cost wins.

    The k-means of :func:`weighted_kmeans` and :func:`lloyd` without holding the points: ``source``
    is a round's reports (:meth:`~ldp_collector.kinds.base.RoundReports.combine`, its kind's
    ``decoder``) or an array (:class:`InMemory`).

    Parameters
    ----------
    source : PassSource
    starts : numpy.ndarray of shape (R, k, d)
        One set of starting centers per restart (e.g. :func:`plus_plus_starts` on a sample).
    stats : PointStats
        The statistics pass over the same source (the centers' box, the tolerance's scale).
    decoder : PointDecoder, optional
        The kind's decoding of its reports (None for an array).
    max_iter, tol
        As in :func:`lloyd`.

    Returns
    -------
    LloydRun
        The restart of lowest cost (the first on a tie).
    """
    runs = _lloyd_runs(source, starts, stats, decoder=decoder, max_iter=max_iter, tol=tol)
    best = runs[0]
    for run in runs[1:]:
        if run.cost < best.cost:
            best = run
    return best


def plus_plus_starts(X: ArrayLike, k: int, rng: np.random.Generator | int | None, n_init: int,
                     weights: ArrayLike | None = None) -> NDArray[np.float64]:
    """``(n_init, k, d)``: ``n_init`` k-means++ seedings (:func:`kmeans_plus_plus`) from one generator, in turn."""
    gen = _generator(rng)
    return np.stack([kmeans_plus_plus(X, k, gen, weights) for _ in range(n_init)])


def lloyd(X: ArrayLike, centers: ArrayLike, weights: ArrayLike | None = None, max_iter: int = 100,
          tol: float = 1e-6) -> KMeansResult:
    """Lloyd's iterations from the given centers, with (signed) point weights.

    Each iteration assigns every point to its nearest center and moves each center to the
    weighted mean of its points. A cluster left empty, or whose total weight is not clearly
    positive, is re-seeded at the point (of positive weight) farthest from its center, the
    farthest first. Centers are clipped to the bounding box of the positive-weight points
    (see the module notes on negative weights). The iterations are :func:`kmeans_passes` over
    the array.

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
    w = _weights(weights, len(x))
    _positive_part(w, len(x))
    max_iter = _check_positive_int("max_iter", max_iter, 100_000)
    tol = _check_tol(tol)
    source = InMemory(Points(x, w))
    stats = source.combine(PointStats(x.shape[1]))
    run = kmeans_passes(source, c[None], stats, max_iter=max_iter, tol=tol)
    return KMeansResult(centers=run.centers, labels=assign(x, run.centers)[0], cost=run.cost,
                        iterations=run.iterations)


def _check_tol(tol: object) -> float:
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 <= tol < math.inf:
        raise InvalidParameterError(f"tol must be a finite number >= 0, got {tol!r}")
    return float(tol)


def weighted_kmeans(X: ArrayLike, k: int, rng: np.random.Generator | int | None = None,
                    weights: ArrayLike | None = None, n_init: int = 5, *, max_iter: int = 100,
                    tol: float = 1e-6) -> KMeansResult:
    """Best (lowest cost) of ``n_init`` runs of k-means++ seeding followed by :func:`lloyd`.

    The restarts share each pass over the points (:func:`kmeans_passes`).

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
    max_iter = _check_positive_int("max_iter", max_iter, 100_000)
    tol = _check_tol(tol)
    starts = plus_plus_starts(x, k, rng, n_init, w)
    source = InMemory(Points(x, w))
    stats = source.combine(PointStats(x.shape[1]))
    run = kmeans_passes(source, starts, stats, max_iter=max_iter, tol=tol)
    return KMeansResult(centers=run.centers, labels=assign(x, run.centers)[0], cost=run.cost,
                        iterations=run.iterations)
