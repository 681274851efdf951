"""Fuzzy c-means on noisy points: plain FCM, mnFCM (mixed-noise loss) and the distance ablation.

Server-side clustering of the Laplace path (DESIGN.md §7.6, ``papers/004``): every device sent its
point with Laplace noise, and the server clusters the noisy points. numpy only, vectorized and
chunked (no ``n x k`` array is kept: every iteration streams the points in blocks of 2^16
center-point entries, laid out centers x points), deterministic given a ``numpy.random.Generator``
or a seed. Cost: O(n k d) per iteration, about 10-30 ms per 10^5 points and 4 centers on one core.

Objective
    For points ``x_i``, centers ``p_c``, memberships ``u_ci`` (``sum_c u_ci = 1``) and fuzzifier
    ``m > 1`` (the paper's default 2), minimize ``J = sum_i sum_c u_ci^m D(x_i, p_c)``. The
    Lagrangian gives the memberships ``u_ci ∝ D_ci^(-1/(m-1))`` (eq. 18, correct as printed);
    a point sitting on a center (``D = 0``) belongs to it alone. Centers: ``p_c`` minimizes
    ``sum_i u_ci^m D(x_i, p)``; for ``D = f(|x - p|)`` its stationarity condition
    ``sum_i u_ci^m f'(l_i) / l_i (p - x_i) = 0`` is solved by iteratively reweighted means,
    ``p <- sum_i w_i x_i / sum_i w_i`` with ``w_i = u_ci^m f'(l_i) / l_i`` (one reweighting step per
    membership update, the usual alternating scheme). The weights floor ``l`` at 1e-3 (and
    ``|x_j - p_j|`` at 1e-3 times the data's spread): the linear terms' cusp at 0 is smoothed
    (Huber-like), so a center on a data point does not get stuck there.

Distances (``distance=``; the paper's §6.2.4 ablation)
    ``"euclidean"`` (EucDis)
        ``D = |x - p|^2``: plain FCM (Bezdek); ``w = u^m``, the center is the weighted mean.
    ``"absolute"`` (AbsDis)
        ``D = |x - p|_1``; per-coordinate reweighting ``w_ij = u^m / |x_ij - p_j|`` (Weiszfeld's
        scheme for the weighted median, one step per iteration).
    ``"laplace"`` (LapDis), ``"gaussian"`` (GauDis), ``"mixed"`` (MixDis, mnFCM)
        ``D = f(l)`` with ``l = |x - p| / (sqrt(d) sigma_0)``, the distance scaled so that the
        noise floor ``sigma_0`` becomes ``1 / sqrt(d)`` (the paper's rescaling after eq. 7). Each
        ``f`` is the negative log-likelihood of its noise model minimized over a per-point scale
        ``sigma_i >= sigma_0``, with constants dropped and divided by ``d / 2``:

        * gaussian: ``f(l) = l^2`` for ``l < 1``, ``ln l^2 + 1`` for ``l >= 1``
          (``f' = 2 l``, ``2 / l``; C^1);
        * laplace: ``f(l) = (2 / sqrt(d)) l`` for ``l < sqrt(d)``, ``2 ln(l / sqrt(d)) + 2`` beyond
          (``f' = 2 / sqrt(d)``, ``2 / l``; C^1; the Laplace scale's optimum is ``r / d``, so its
          break sits at ``l = sqrt(d)``);
        * mixed (mnFCM): ``f(l) = l^2 + (2 / sqrt(d)) l`` for ``l < 1``, ``2 ln l^2 + 1 + 2 / sqrt(d)``
          for ``l >= 1``, so ``f'(l) = 2 l + 2 / sqrt(d)`` below 1 and ``4 / l`` above.

        The gaussian and laplace branches meet with matching slopes (the per-point scale is
        their exact minimizer). The mixed loss follows the paper's Lemma 1, which takes the
        Gaussian minimizer ``sigma_i = max(sigma_0, r / sqrt(d))`` for the Gaussian-times-Laplace
        likelihood: the value is continuous but the slope jumps from ``2 + 2 / sqrt(d)`` to 4 at
        ``l = 1`` (equal only for ``d = 1``). Far points (``l >= 1``) get weight ``4 / l^2``:
        the loss grows like a logarithm, so Laplace outliers barely pull the centers.

Why not the printed formulas
    Eqs. 10-11 drop the constant ``1 + 2 / sqrt(d)`` of the ``l >= 1`` branch (eq. 8 still has it),
    so the printed ``f`` jumps down from ``1 + 2 / sqrt(d)`` to 0 at ``l = 1``: every point with
    ``1 <= l < exp((1 + 2 / sqrt(d)) / 4)`` costs less than a point just inside the break, and the
    loss is no longer increasing in the distance (:func:`printed_mixed_loss` keeps that form for the
    tests' negative control). Eq. 12 then *adds* both branches into one ``D = r^2 + (2 / sqrt(d)) r
    + 2 ln r^2`` that is ``-inf`` at ``r = 0`` and negative below ``r ~ 0.69`` (``d = 2``), which
    breaks the memberships ``D^(-1/(m-1))`` outright. The center update of eqs. 19-22
    differentiates ``ln |x - p|^2`` as ``4 / (x - p)`` and then expands it as if it were a function
    of ``x`` alone: it divides by the data's coordinates (undefined at 0, sign-dependent, not
    translation invariant), splits each sum on a per-point case ``x > p`` that the sum cannot
    honour, and drops an ``O(p)`` term. It is not a stationary point of the objective; the
    reweighted mean above is.

Convergence
    ``J`` is non-increasing under the membership step. Under the center step it is for the
    euclidean distance (exact minimizer) and for losses concave in ``l^2`` (gaussian, laplace,
    absolute: the reweighted mean is then a majorize-minimize step). The mixed loss is concave in
    ``l^2`` on each side of ``l = 1`` but its slope jumps *up* there for ``d > 1``, so monotone
    descent is not guaranteed across the kink; in practice the iteration settles (measured in the
    tests and ``benchmarks/laplace_clustering.py``). Iterations stop when no center moves by more
    than ``sqrt(tol)`` times the data's mean per-coordinate standard deviation, or after
    ``max_iter``; the result says whether it converged. Restarts (``n_init``) keep the lowest
    ``J``.

One pass per iteration
    Every iteration is one pass over the points (:class:`FuzzyPass`: given the centers, the sums of
    the next center update, the objective and the memberships' sums), and the restarts share each
    pass, every restart with its own centers and sums (:func:`fuzzy_passes`). The same passes run on
    an array (:class:`~ldp_collector.estimation.kmeans.InMemory`: :func:`fuzzy_c_means`) and on a
    round's reports through :meth:`~ldp_collector.kinds.base.RoundReports.combine`, in-process or on
    Apache Beam, without the points being held. A pass's state is ``R k (2 d + 2) + R`` float64
    (``R k (3 d + 1) + R`` for the absolute distance) for ``R`` restarts of ``k`` centers in ``d``
    dimensions, plus one batch and its blocks' scratch (2^16 entries per array); the statistics
    pass before the first iteration (:class:`~ldp_collector.estimation.kmeans.PointStats`) gives
    the data's spread.

Initialization
    k-means++ seeding (:func:`ldp_collector.estimation.kmeans.kmeans_plus_plus`, greedy D^2 sampling) on
    the points, then optionally clipped into ``bounds``. ``bounds`` (e.g. the unit cube the
    devices' points were normalized to) also clips the centers after every update: the true
    cluster means lie in the convex domain, the noisy points do not.

Randomness
    Post-processing of privatized data; ``rng`` is a ``numpy.random.Generator``, a seed or
    ``None`` (fresh OS entropy).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.errors import InvalidParameterError

from .kmeans import InMemory, PassSource, PointDecoder, PointPass, Points, PointStats, plus_plus_starts

__all__ = [
    "DEFAULT_FUZZIFIER",
    "DISTANCES",
    "Distance",
    "FuzzyPass",
    "FuzzyResult",
    "FuzzyRun",
    "center_step",
    "fcm",
    "fuzzy_c_means",
    "fuzzy_model",
    "fuzzy_passes",
    "gaussian_loss",
    "gaussian_loss_derivative",
    "laplace_loss",
    "laplace_loss_derivative",
    "loss",
    "loss_derivative",
    "memberships",
    "mixed_loss",
    "mixed_loss_derivative",
    "mnfcm",
    "printed_mixed_loss",
    "scaled_distance_factor",
]

Distance = Literal["euclidean", "absolute", "laplace", "gaussian", "mixed"]
#: Every distance of :func:`fuzzy_c_means` (the paper's EucDis, AbsDis, LapDis, GauDis, MixDis).
DISTANCES: tuple[Distance, ...] = get_args(Distance)
#: The paper's fuzzifier (its Experiment 2 finds m = 2 best).
DEFAULT_FUZZIFIER = 2.0
#: Largest fuzzifier accepted: beyond it every membership is ~1/k.
MAX_FUZZIFIER = 100.0
#: Entries (rows x centers) per block: small enough to stay in cache (measured fastest).
_CHUNK_ENTRIES = 1 << 16
#: Floor of the scaled distance ``l`` in the reweighting factor ``f'(l) / l`` (and, times the data's
#: mean per-coordinate standard deviation, of ``|x_j - p_j|`` in the absolute distance's weights).
#: The k-means++ seeds are data points: without a floor the point a center sits on gets an
#: unbounded weight and pins the center there for ever (Weiszfeld's singularity); with it the
#: cusp of the linear terms at 0 is smoothed over a thousandth of the noise scale (Huber-like).
_MIN_SCALED_DISTANCE = 1e-3
#: Floor of D in the memberships: D = 0 means "on the center" (membership 1 there).
_MIN_LOSS = 1e-300
#: Distances scaled by the noise floor sigma_0.
_NOISE_AWARE: frozenset[str] = frozenset({"laplace", "gaussian", "mixed"})

FloatArray = NDArray[np.float64]


# -- losses --------------------------------------------------------------------------------------------

def _check_dimension(dimension: int) -> float:
    if isinstance(dimension, bool) or not isinstance(dimension, (int, np.integer)) or dimension < 1:
        raise InvalidParameterError(f"dimension must be a positive integer, got {dimension!r}")
    return float(dimension)


def mixed_loss(ell: ArrayLike, dimension: int) -> FloatArray:
    """mnFCM's continuous mixed-noise loss (module docstring), elementwise.

    ``f(l) = l^2 + (2 / sqrt(d)) l`` for ``0 <= l < 1`` and ``2 ln l^2 + 1 + 2 / sqrt(d)`` for
    ``l >= 1``; continuous at 1 (both sides ``1 + 2 / sqrt(d)``).
    """
    d = _check_dimension(dimension)
    l_ = np.asarray(ell, dtype=np.float64)
    c = 2.0 / math.sqrt(d)
    far = np.maximum(l_, 1.0)  # the log branch is only evaluated where it applies (no log(0))
    out: FloatArray = np.where(l_ < 1.0, l_ * l_ + c * l_, 4.0 * np.log(far) + 1.0 + c)
    return out


def mixed_loss_derivative(ell: ArrayLike, dimension: int) -> FloatArray:
    """``f'(l)`` of :func:`mixed_loss`: ``2 l + 2 / sqrt(d)`` below 1, ``4 / l`` from 1 on (right derivative at 1)."""
    d = _check_dimension(dimension)
    l_ = np.asarray(ell, dtype=np.float64)
    out: FloatArray = np.where(l_ < 1.0, 2.0 * l_ + 2.0 / math.sqrt(d), 4.0 / np.maximum(l_, 1.0))
    return out


def printed_mixed_loss(ell: ArrayLike, dimension: int) -> FloatArray:
    """The paper's eq. 11 as printed: ``l^2 + (2 sqrt(d) / d) l`` below 1, ``2 ln l^2`` from 1 on.

    Kept only as the negative control of the tests: it jumps from ``1 + 2 / sqrt(d)`` down to 0
    at ``l = 1``, so a point just beyond the break costs less than one just inside.
    """
    d = _check_dimension(dimension)
    l_ = np.asarray(ell, dtype=np.float64)
    out: FloatArray = np.where(l_ < 1.0, l_ * l_ + 2.0 * math.sqrt(d) / d * l_, 4.0 * np.log(np.maximum(l_, 1.0)))
    return out


def gaussian_loss(ell: ArrayLike, dimension: int) -> FloatArray:
    """Gaussian-only loss (GauDis): ``l^2`` below 1, ``ln l^2 + 1`` from 1 on (C^1)."""
    _check_dimension(dimension)
    l_ = np.asarray(ell, dtype=np.float64)
    out: FloatArray = np.where(l_ < 1.0, l_ * l_, 2.0 * np.log(np.maximum(l_, 1.0)) + 1.0)
    return out


def gaussian_loss_derivative(ell: ArrayLike, dimension: int) -> FloatArray:
    """``2 l`` below 1, ``2 / l`` from 1 on."""
    _check_dimension(dimension)
    l_ = np.asarray(ell, dtype=np.float64)
    out: FloatArray = np.where(l_ < 1.0, 2.0 * l_, 2.0 / np.maximum(l_, 1.0))
    return out


def laplace_loss(ell: ArrayLike, dimension: int) -> FloatArray:
    """Laplace-only loss (LapDis): ``(2 / sqrt(d)) l`` below ``sqrt(d)``, ``2 ln(l / sqrt(d)) + 2`` beyond (C^1)."""
    root = math.sqrt(_check_dimension(dimension))
    l_ = np.asarray(ell, dtype=np.float64)
    out: FloatArray = np.where(l_ < root, 2.0 / root * l_, 2.0 * np.log(np.maximum(l_, root) / root) + 2.0)
    return out


def laplace_loss_derivative(ell: ArrayLike, dimension: int) -> FloatArray:
    """``2 / sqrt(d)`` below ``sqrt(d)``, ``2 / l`` beyond."""
    root = math.sqrt(_check_dimension(dimension))
    l_ = np.asarray(ell, dtype=np.float64)
    out: FloatArray = np.where(l_ < root, 2.0 / root, 2.0 / np.maximum(l_, root))
    return out


_LOSSES: dict[str, tuple[Callable[[ArrayLike, int], FloatArray], Callable[[ArrayLike, int], FloatArray]]] = {
    "mixed": (mixed_loss, mixed_loss_derivative),
    "gaussian": (gaussian_loss, gaussian_loss_derivative),
    "laplace": (laplace_loss, laplace_loss_derivative),
}


def _check_distance(distance: object) -> Distance:
    if distance not in DISTANCES:
        raise InvalidParameterError(f"distance must be one of {', '.join(DISTANCES)}, got {distance!r}")
    return distance


def loss(distance: Distance, ell: ArrayLike, dimension: int) -> FloatArray:
    """``f(l)`` of a noise-aware distance (``"laplace"``, ``"gaussian"``, ``"mixed"``)."""
    name = _check_distance(distance)
    if name not in _LOSSES:
        raise InvalidParameterError(f"distance {name!r} is not a loss of a scaled distance")
    return _LOSSES[name][0](ell, dimension)


def loss_derivative(distance: Distance, ell: ArrayLike, dimension: int) -> FloatArray:
    """``f'(l)`` of a noise-aware distance."""
    name = _check_distance(distance)
    if name not in _LOSSES:
        raise InvalidParameterError(f"distance {name!r} is not a loss of a scaled distance")
    return _LOSSES[name][1](ell, dimension)


def scaled_distance_factor(noise_scale: float, dimension: int) -> float:
    """``1 / (sqrt(d) sigma_0)``: multiplies ``|x - p|`` into ``l``, making ``sigma_0`` equal ``1 / sqrt(d)``.

    Lemma 1's per-point scale is ``sigma_i = max(sigma_0, r / sqrt(d))``: the quadratic regime
    ends where ``r = sqrt(d) sigma_0``, which this scaling puts at ``l = 1``.
    """
    d = _check_dimension(dimension)
    if not (isinstance(noise_scale, (int, float, np.floating)) and math.isfinite(noise_scale) and noise_scale > 0):
        raise InvalidParameterError(f"noise_scale must be a finite number > 0, got {noise_scale!r}")
    return 1.0 / (math.sqrt(d) * float(noise_scale))


# -- one pass ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Model:
    distance: Distance
    fuzzifier: float
    dimension: int
    #: 1 / (sqrt(d) sigma_0) for the noise-aware distances, else 1.
    factor: float
    #: Floor of |x_j - p_j| in the absolute distance's weights (relative to the data's spread).
    gap_floor: float = _MIN_SCALED_DISTANCE

    def losses(self, xt: FloatArray, centers: FloatArray) -> tuple[FloatArray, FloatArray | None]:
        """``D`` (k, rows) and the reweighting factors ``f'(l) / l`` (k, rows; ``None``: constant).

        ``xt`` is a block of the points transposed, ``(d, rows)``: every array here is laid out
        centers x rows, so the reductions over the centers run along contiguous rows of memory
        (about ten times faster than over a short last axis).
        """
        if self.distance == "absolute":
            total = np.zeros((len(centers), xt.shape[1]))
            for j in range(xt.shape[0]):
                total += np.abs(centers[:, j, None] - xt[j][None, :])
            return total, None
        d2 = _squared_distances(xt, centers)
        if self.distance == "euclidean":
            return d2, None
        value, derivative = _LOSSES[self.distance]
        ell = np.sqrt(d2)
        ell *= self.factor
        weight = derivative(ell, self.dimension)
        weight /= np.maximum(ell, _MIN_SCALED_DISTANCE)
        return value(ell, self.dimension), weight


def _squared_distances(xt: FloatArray, centers: FloatArray) -> FloatArray:
    """``(k, rows)`` squared distances from direct differences, one coordinate at a time.

    Exact near a center, where the reweighting needs small distances (the expanded
    ``|x|^2 - 2 x.c + |c|^2`` form loses them to cancellation).
    """
    out = np.zeros((len(centers), xt.shape[1]))
    for j in range(xt.shape[0]):
        diff = centers[:, j, None] - xt[j][None, :]
        diff *= diff
        out += diff
    return out


def _membership_block(losses: FloatArray, fuzzifier: float) -> FloatArray:
    """``u_ci ∝ D_ci^(-1/(m-1))`` (``losses`` laid out (k, rows)), normalized over the centers.

    Computed as ``(D_min / D_ci)^(1/(m-1))`` (every ratio in (0, 1], no overflow); ``D`` is floored
    at 1e-300, so a point on a center shares its membership among the centers it sits on.
    """
    floored = np.maximum(losses, _MIN_LOSS)
    ratio: FloatArray = floored.min(axis=0) / floored
    if fuzzifier != 2.0:
        ratio **= 1.0 / (fuzzifier - 1.0)
    ratio /= ratio.sum(axis=0)
    return ratio


def _chunk_rows(k: int) -> int:
    return max(256, _CHUNK_ENTRIES // max(1, k))


class FuzzyPass(PointPass["FuzzyPass"]):
    """One fuzzy c-means iteration of ``R`` restarts at once, streamed over blocks of the points.

    Given ``centers`` of shape ``(R, k, d)``: per restart the memberships at its centers and the
    sums of its next center update (``numerator``, ``denominator``), the objective ``J`` and the
    memberships' sums (``shares``). Points carry no weights here.
    """

    def __init__(self, centers: FloatArray, model: _Model, decoder: PointDecoder | None = None) -> None:
        super().__init__(decoder)
        self.centers = np.asarray(centers, dtype=np.float64)
        self.model = model
        r, k, d = self.centers.shape
        self.count = 0
        self.numerator = np.zeros((r, k, d))
        self.denominator = np.zeros((r, k, d)) if model.distance == "absolute" else np.zeros((r, k))
        self.objective = np.zeros(r)
        self.shares = np.zeros((r, k))

    def zero(self) -> FuzzyPass:
        return FuzzyPass(self.centers, self.model, self.decoder)

    def add_decoded(self, decoded: Points) -> None:
        if decoded.weights is not None:
            raise InvalidParameterError("fuzzy c-means takes unweighted points")
        xt = np.ascontiguousarray(np.asarray(decoded.x, dtype=np.float64).T)
        self.count += xt.shape[1]
        for r in range(len(self.centers)):
            self._add(r, xt)

    def _add(self, r: int, xt: FloatArray) -> None:
        """Restart ``r``'s memberships and sums over the points ``xt`` (transposed, ``(d, rows)``)."""
        centers, model = self.centers[r], self.model
        k, d = centers.shape
        numerator, denominator = self.numerator[r], self.denominator[r]
        rows = _chunk_rows(k)
        m = model.fuzzifier
        for start in range(0, xt.shape[1], rows):
            block = xt[:, start:start + rows]
            losses, factors = model.losses(block, centers)
            u = _membership_block(losses, m)
            um = u * u if m == 2.0 else u**m
            self.objective[r] += float(np.einsum("ij,ij->", um, losses))
            self.shares[r] += u.sum(axis=1)
            if model.distance == "euclidean":
                w = um
            elif model.distance == "absolute":
                # Per coordinate: w_cij = u^m / |x_ij - p_cj| (Weiszfeld step towards the weighted median).
                for j in range(d):
                    wj = um / np.maximum(np.abs(centers[:, j, None] - block[j][None, :]), model.gap_floor)
                    numerator[:, j] += wj @ block[j]
                    denominator[:, j] += wj.sum(axis=1)
                continue
            else:
                assert factors is not None
                w = um * factors
            numerator += w @ block.T
            denominator += w.sum(axis=1)

    def merge(self, other: FuzzyPass) -> None:
        self.count += other.count
        self.numerator += other.numerator
        self.denominator += other.denominator
        self.objective += other.objective
        self.shares += other.shares

    def finalize(self) -> FuzzyPass:
        return self

    @property
    def nbytes(self) -> int:
        return int(self.centers.nbytes + self.numerator.nbytes + self.denominator.nbytes + self.objective.nbytes
                   + self.shares.nbytes)


def _labels(xt: FloatArray, centers: FloatArray, model: _Model) -> NDArray[np.int64]:
    """The center of smallest ``D`` of every point (``xt`` transposed, ``(d, n)``)."""
    rows = _chunk_rows(len(centers))
    return np.concatenate([model.losses(xt[:, s:s + rows], centers)[0].argmin(axis=0)
                           for s in range(0, xt.shape[1], rows)]).astype(np.int64)


def _next_centers(numerator: FloatArray, denominator: FloatArray, centers: FloatArray,
                  bounds: tuple[FloatArray, FloatArray] | None) -> FloatArray:
    den = denominator if denominator.ndim == 2 else denominator[:, None]
    ok = den > 0
    moved = np.where(ok, numerator / np.where(ok, den, 1.0), centers)
    if bounds is not None:
        moved = np.clip(moved, bounds[0], bounds[1])
    out: FloatArray = moved
    return out


# -- public API ------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True, eq=False)
class FuzzyResult:
    """One fuzzy c-means fit.

    Attributes
    ----------
    centers : numpy.ndarray of shape (k, d)
    labels : numpy.ndarray of int64, shape (n,)
        The center of largest membership (smallest ``D``) of every point.
    shares : numpy.ndarray of shape (k,)
        Mean membership of every cluster (sums to 1): the fuzzy estimate of the cluster shares.
    objective : float
        ``J = sum u^m D`` at the final centers.
    iterations : int
        Center updates of the best restart.
    converged : bool
        Whether the best restart stopped on the tolerance (not on ``max_iter``).
    distance : str
    fuzzifier : float
    noise_scale : float or None
        ``sigma_0`` of the noise-aware distances.
    """

    centers: FloatArray
    labels: NDArray[np.int64]
    shares: FloatArray
    objective: float
    iterations: int
    converged: bool
    distance: Distance
    fuzzifier: float
    noise_scale: float | None


def _stats(x: FloatArray) -> PointStats:
    return InMemory(Points(x)).combine(PointStats(x.shape[1]))


def _points(x: ArrayLike) -> FloatArray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise InvalidParameterError(f"X must be a non-empty 2-D array (points x dimensions), got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise InvalidParameterError("X must be finite, got a NaN or infinite value")
    return arr


def _model(distance: object, fuzzifier: object, stats: PointStats, noise_scale: float | None) -> _Model:
    """The distance's model; ``stats`` (the points' statistics pass) gives the dimension and the spread."""
    name = _check_distance(distance)
    if (isinstance(fuzzifier, bool) or not isinstance(fuzzifier, (int, float, np.floating))
            or not 1.0 < float(fuzzifier) <= MAX_FUZZIFIER):
        raise InvalidParameterError(f"fuzzifier must be in (1, {MAX_FUZZIFIER:g}], got {fuzzifier!r}")
    factor = 1.0
    if name in _NOISE_AWARE:
        if noise_scale is None:
            raise InvalidParameterError(f"the {name} distance needs noise_scale (sigma_0, in the points' units)")
        factor = scaled_distance_factor(noise_scale, stats.dimension)
    spread = float(np.sqrt(stats.variance).mean())
    return _Model(distance=name, fuzzifier=float(fuzzifier), dimension=stats.dimension, factor=factor,
                  gap_floor=_MIN_SCALED_DISTANCE * (spread if spread > 0 else 1.0))


def _bounds(bounds: tuple[ArrayLike, ArrayLike] | None, d: int) -> tuple[FloatArray, FloatArray] | None:
    if bounds is None:
        return None
    low = np.broadcast_to(np.asarray(bounds[0], dtype=np.float64), (d,)).copy()
    high = np.broadcast_to(np.asarray(bounds[1], dtype=np.float64), (d,)).copy()
    if not (np.isfinite(low).all() and np.isfinite(high).all() and (low <= high).all()):
        raise InvalidParameterError("bounds must be finite (lower, upper) with lower <= upper")
    return low, high


def memberships(X: ArrayLike, centers: ArrayLike, *, distance: Distance = "euclidean",
                fuzzifier: float = DEFAULT_FUZZIFIER, noise_scale: float | None = None) -> FloatArray:
    """The ``(n, k)`` membership matrix ``u_ci ∝ D_ci^(-1/(m-1))`` (rows sum to 1).

    Parameters
    ----------
    X : array-like of shape (n, d)
    centers : array-like of shape (k, d)
    distance : {"euclidean", "absolute", "laplace", "gaussian", "mixed"}
    fuzzifier : float
        ``m`` in ``(1, 100]``.
    noise_scale : float, optional
        ``sigma_0`` (required by the noise-aware distances).
    """
    x = _points(X)
    c = _points(centers)
    if c.shape[1] != x.shape[1]:
        raise InvalidParameterError(f"centers must have dimension {x.shape[1]}, got {c.shape[1]}")
    model = _model(distance, fuzzifier, _stats(x), noise_scale)
    rows = _chunk_rows(len(c))
    xt = np.ascontiguousarray(x.T)
    return np.concatenate([_membership_block(model.losses(xt[:, s:s + rows], c)[0], model.fuzzifier).T
                           for s in range(0, len(x), rows)])


def center_step(X: ArrayLike, centers: ArrayLike, *, distance: Distance = "euclidean",
                fuzzifier: float = DEFAULT_FUZZIFIER, noise_scale: float | None = None,
                bounds: tuple[ArrayLike, ArrayLike] | None = None) -> FloatArray:
    """One iteration: memberships at ``centers``, then the reweighted-mean center update."""
    x = _points(X)
    c = _points(centers)
    model = _model(distance, fuzzifier, _stats(x), noise_scale)
    step = InMemory(Points(x)).combine(FuzzyPass(c[None], model))
    return _next_centers(step.numerator[0], step.denominator[0], c, _bounds(bounds, x.shape[1]))


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise InvalidParameterError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def _generator(rng: np.random.Generator | int | None) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) and rng >= 0):
        return np.random.default_rng(rng)
    raise InvalidParameterError(f"rng must be a numpy.random.Generator, a non-negative seed or None, got {rng!r}")


def fuzzy_c_means(X: ArrayLike, k: int, rng: np.random.Generator | int | None = None, *,
                  distance: Distance = "euclidean", fuzzifier: float = DEFAULT_FUZZIFIER,
                  noise_scale: float | None = None, max_iter: int = 300, tol: float = 1e-6, n_init: int = 1,
                  init: ArrayLike | None = None,
                  bounds: tuple[ArrayLike, ArrayLike] | None = None) -> FuzzyResult:
    """Fuzzy c-means with any of the :data:`DISTANCES` (module docstring): best of ``n_init`` runs.

    Parameters
    ----------
    X : array-like of shape (n, d)
    k : int
        Clusters, in ``[1, n]``.
    rng : numpy.random.Generator, int or None
        Seeding randomness; a seed makes the result deterministic.
    distance : {"euclidean", "absolute", "laplace", "gaussian", "mixed"}
        ``"euclidean"`` is plain FCM, ``"mixed"`` is mnFCM.
    fuzzifier : float
        ``m`` in ``(1, 100]``; default 2.
    noise_scale : float, optional
        ``sigma_0`` in the units of ``X`` (required by the noise-aware distances): the per-coordinate
        Laplace scale of the noise the points carry.
    max_iter : int
        Center updates per run, in ``[1, 100000]``.
    tol : float
        Stop when every center moves by at most ``sqrt(tol)`` times the mean per-coordinate
        standard deviation of ``X`` (0: run ``max_iter`` updates unless the centers stop moving).
    n_init : int
        Restarts from fresh k-means++ seeds, in ``[1, 1000]``; the lowest objective wins.
    init : array-like of shape (k, d), optional
        Starting centers (then ``n_init`` must be 1).
    bounds : (lower, upper), optional
        Box the centers are clipped into after every update (and at the start).

    Returns
    -------
    FuzzyResult
    """
    x = _points(X)
    n, d = x.shape
    k = _check_int("k", k, 1, n)
    source = InMemory(Points(x))
    stats = source.combine(PointStats(d))
    model = _model(distance, fuzzifier, stats, noise_scale)
    max_iter = _check_int("max_iter", max_iter, 1, 100_000)
    n_init = _check_int("n_init", n_init, 1, 1000)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 <= tol < math.inf:
        raise InvalidParameterError(f"tol must be a finite number >= 0, got {tol!r}")
    box = _bounds(bounds, d)
    if init is not None:
        if n_init != 1:
            raise InvalidParameterError("init gives the starting centers: n_init must be 1")
        start = _points(init)
        if start.shape != (k, d):
            raise InvalidParameterError(f"init must have shape ({k}, {d}), got {start.shape}")
        starts = start[None].copy()
    else:
        starts = plus_plus_starts(x, k, _generator(rng), n_init)
    run = fuzzy_passes(source, starts, stats, model=model, max_iter=max_iter, tol=float(tol), bounds=box)
    return FuzzyResult(centers=run.centers, labels=_labels(np.ascontiguousarray(x.T), run.centers, model),
                       shares=run.shares, objective=run.objective, iterations=run.iterations,
                       converged=run.converged, distance=model.distance, fuzzifier=model.fuzzifier,
                       noise_scale=noise_scale if model.distance in _NOISE_AWARE else None)


@dataclass(frozen=True, kw_only=True, eq=False)
class FuzzyRun:
    """The best restart of :func:`fuzzy_passes` (a :class:`FuzzyResult` without the points' labels)."""

    centers: FloatArray
    shares: FloatArray
    objective: float
    iterations: int
    converged: bool


def fuzzy_model(distance: Distance, fuzzifier: float, stats: PointStats, noise_scale: float | None) -> _Model:
    """The checked distance model of :func:`fuzzy_passes` (``stats``: the points' statistics pass)."""
    return _model(distance, fuzzifier, stats, noise_scale)


def fuzzy_passes(source: PassSource, starts: FloatArray, stats: PointStats, *, model: _Model, max_iter: int,
                 tol: float, bounds: tuple[FloatArray, FloatArray] | None = None,
                 decoder: PointDecoder | None = None) -> FuzzyRun:
    """Fuzzy c-means from every start ``(R, k, d)``, one pass over ``source`` per iteration; the lowest ``J`` wins.

    ``source`` is a round's reports (:meth:`~ldp_collector.kinds.base.RoundReports.combine`, its
    kind's ``decoder``) or an array (:class:`~ldp_collector.estimation.kmeans.InMemory`); ``stats``
    the statistics pass over it (:class:`~ldp_collector.estimation.kmeans.PointStats`); the other
    parameters as in :func:`fuzzy_c_means`. The starts are clipped into ``bounds`` first.
    """
    centers = np.array(starts, dtype=np.float64)
    if bounds is not None:
        centers = np.clip(centers, bounds[0], bounds[1])
    variance = float(stats.variance.mean())
    threshold = tol * (variance if variance > 0 else 1.0)
    iterations = np.zeros(len(centers), dtype=np.int64)
    converged = np.zeros(len(centers), dtype=np.bool_)
    running = list(range(len(centers)))
    while running:
        step = source.combine(FuzzyPass(centers[running], model, decoder))
        still: list[int] = []
        for a, r in enumerate(running):
            iterations[r] += 1
            moved = _next_centers(step.numerator[a], step.denominator[a], centers[r], bounds)
            shift = float(((moved - centers[r]) ** 2).sum(axis=1).max())
            centers[r] = moved
            if shift <= threshold:
                converged[r] = True
            elif iterations[r] < max_iter:
                still.append(r)
        running = still
    final = source.combine(FuzzyPass(centers, model, decoder))
    best = int(np.argmin(final.objective))  # the first of equal objectives, as restarts in turn
    return FuzzyRun(centers=centers[best], shares=final.shares[best] / max(final.count, 1),
                    objective=float(final.objective[best]), iterations=int(iterations[best]),
                    converged=bool(converged[best]))


def fcm(X: ArrayLike, k: int, rng: np.random.Generator | int | None = None, **kwargs: object) -> FuzzyResult:
    """Plain fuzzy c-means (squared Euclidean distance); keyword arguments as :func:`fuzzy_c_means`."""
    return fuzzy_c_means(X, k, rng, distance="euclidean", **kwargs)  # type: ignore[arg-type]


def mnfcm(X: ArrayLike, k: int, rng: np.random.Generator | int | None = None, *, noise_scale: float,
          **kwargs: object) -> FuzzyResult:
    """mnFCM: fuzzy c-means with the continuous mixed-noise loss; keyword arguments as :func:`fuzzy_c_means`."""
    return fuzzy_c_means(X, k, rng, distance="mixed", noise_scale=noise_scale, **kwargs)  # type: ignore[arg-type]
