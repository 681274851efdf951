"""Bit-vector clustering on the server (kCluster, Sun-Zhao-Ye 2019; DESIGN.md section 7.5).

Every device encodes its point into ``B`` bits, ``b_(j,t)(x) = [|x_j - r_(j,t)| <= theta_j]``
(:class:`ldp_client.encoders.bitvector.BitVectorEncoder`), and flips every bit independently with
probability ``q = 1 / (1 + e^(epsilon / Delta))`` (:class:`ldp_client.mechanisms.
bitwise_randomized_response.BitwiseRRParams`; ``p = 1 - q`` keeps a bit). This module holds the
server half: unpacking, debiasing, distances in the encoded space, k-means and DBSCAN there, and
decoding encoded-space centers back to the original units.

Over a round (bounded memory)
    :func:`kmeans_encoded` and :func:`dbscan_cores` work on reports held in memory: a round step
    runs them on a sample, then makes its passes over the whole round with
    :class:`BitVectorPass`, a mergeable accumulator of ``k x B`` sums
    (:func:`refine_on_round`: one EM iteration per pass; :func:`dbscan_on_round`: one assignment),
    so the same step runs in-process and on Apache Beam.

Debiasing
    ``E[y] = q + (p - q) b``, so ``b_hat = (y - q) / (p - q)`` is unbiased for ``b``. Its noise
    ``e = b_hat - b`` has mean 0 and the same variance ``V = p q / (p - q)^2`` for ``b = 0`` and
    ``b = 1`` (``BitwiseRRParams.bit_variance``), independently across bits and reports.

Distances (the diagonal term)
    For a fixed vector ``c`` (not computed from the report), ``E ||b_hat - c||^2 = ||b - c||^2 + B V``:
    the squared noise of every bit adds up, so plain distances on noisy bits are inflated by
    ``B V`` -- and between two reports by ``2 B V``. ``||b_hat - c||^2 - B V`` is unbiased for the
    squared distance (the Hamming distance when ``c`` is a 0/1 vector), and
    ``||b_hat_i - b_hat_j||^2 - 2 B V`` for two reports ``i != j`` (0 on the diagonal).
    When ``c`` is the mean of the debiased reports of a set ``S`` of ``m`` reports (a k-means
    center), the report's own noise is inside ``c`` when ``i`` is in ``S``:
    ``b_hat_i - c = (b_i - mu) + (1 - 1/m) e_i - (1/m) sum_(j in S, j != i) e_j`` with
    ``mu`` the mean of the true bits of ``S``, so

    * ``i`` not in ``S``: ``E ||b_hat_i - c||^2 = ||b_i - mu||^2 + B V (1 + 1/m)``;
    * ``i`` in ``S``:     ``E ||b_hat_i - c||^2 = ||b_i - mu||^2 + B V (1 - 1/m)``.

    Subtracting the matching term gives :func:`report_center_sq_distances`. Without it the
    assignment step favours the center a report already belongs to (by ``2 B V / m``) and
    favours large clusters (``||c||^2`` is inflated by ``B V / m``).

The variance of a single report's distance is of order ``B V^2`` (at small ``epsilon / Delta``,
``V ~ (Delta / epsilon)^2``), far above the signal (at most ``Delta``), so one report is
assigned almost at random at small epsilon; the centers, means of thousands of reports, are what
carry the signal. That is also why DBSCAN, which decides on single pairwise distances, needs a
large ``epsilon / Delta``.

Decoding
    A center ``c_j`` (the attribute's ``T_j`` bit frequencies) is decoded to the coordinate ``z``
    whose *expected bit pattern* is closest to it in least squares. Model the members of a
    cluster along attribute ``j`` as spread uniformly over ``[z - h, z + h]``; then bit ``t`` is
    set with probability ``beta_t(z, h) = |[z - h, z + h] & [r_t - theta, r_t + theta]| / (2 h)``
    (the overlap of the two intervals), and ``beta_t(z, 0) = b_t(z)``, the point's own bit
    pattern. :func:`decode_centers` minimizes ``||beta(z, h) - c_j||^2`` over a grid of ``z``
    (:data:`DECODE_GRID` points across the attribute's range) and ``h`` (0 and multiples of the
    pivot spacing); exact frequencies of a point (``c_j = b(z0)``) reach loss 0 at ``h = 0`` on the
    whole interval of points sharing ``z0``'s pattern, and its midpoint is returned.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.errors import InvalidParameterError, ProtocolError

from ..storage.base import StoredReport
from .accumulators import ComponentParams, decode_report_payloads
from .report_accumulator import DecodedPass

__all__ = [
    "DBSCAN_SAMPLE",
    "DECODE_GRID",
    "KMEANS_SAMPLE",
    "MAX_ROUND_PASSES",
    "REFINE_STOP",
    "BitVectorClustering",
    "BitVectorLayout",
    "BitVectorMixture",
    "BitVectorPass",
    "BitVectorPassSums",
    "PassCombiner",
    "array_passes",
    "dbscan_cores",
    "dbscan_encoded",
    "dbscan_on_round",
    "debias_bits",
    "decode_centers",
    "decoded_center_variances",
    "expected_pattern",
    "kmeans_encoded",
    "moved_within_noise",
    "pairwise_sq_distances",
    "public_pivots",
    "refine_on_round",
    "report_center_sq_distances",
    "unpack_bit_payloads",
]

#: Reports of the sample a round step seeds and first refines k-means on (a
#: :class:`~ldp_collector.estimation.report_accumulator.ReportSample`); the last EM passes run on the whole round.
KMEANS_SAMPLE = 1 << 16
#: EM stops when every center moved by less than this fraction of its standard error
#: (:func:`moved_within_noise`).
REFINE_STOP = 0.1
#: EM passes over the whole round after the sample's fit, at most.
MAX_ROUND_PASSES = 100
#: DBSCAN runs on the debiased pairwise distances of at most this many reports (an O(m^2) float64
#: matrix: 4000^2 * 8 bytes = 128 MB); the other reports join the nearest cluster's core centroid.
DBSCAN_SAMPLE = 4000
#: Grid points per attribute in :func:`decode_centers`.
DECODE_GRID = 1025
#: Spread half-widths tried by :func:`decode_centers`, in pivot spacings: 0 (the point's own bits) to 8 by 1/8.
DECODE_SPREADS = tuple(i / 8 for i in range(65))
#: Centers :func:`decode_centers` decodes at once (its loss array: rows x spreads x grid floats, 34 MB).
_DECODE_ROWS = 64
#: Rows per chunk of the distance computations (bounds the float scratch to ~ rows x k or B floats).
_CHUNK = 16384
#: The float copies of the bits (12 bytes per bit) are kept between passes up to this size.
_FLOAT_CACHE_BYTES = 1 << 30


@dataclass(frozen=True, kw_only=True)
class BitVectorLayout:
    """The public geometry of a bit vector: per attribute its bounds, pivots and half-width.

    Attributes
    ----------
    lower, upper : tuple of float
        The domain bounds per attribute.
    pivots : tuple of tuple of float
        ``pivots[j]`` are attribute ``j``'s pivots, in bit order.
    half_widths : tuple of float
    """

    lower: tuple[float, ...]
    upper: tuple[float, ...]
    pivots: tuple[tuple[float, ...], ...]
    half_widths: tuple[float, ...]

    @property
    def dimension(self) -> int:
        return len(self.lower)

    @property
    def bits(self) -> int:
        return sum(len(p) for p in self.pivots)

    def columns(self, j: int) -> slice:
        """The bit columns of attribute ``j``."""
        start = sum(len(p) for p in self.pivots[:j])
        return slice(start, start + len(self.pivots[j]))

    def encode(self, points: ArrayLike) -> NDArray[np.uint8]:
        """The true bits of ``points`` (clamped to the domain), shape (n, B): the device encoding, vectorized."""
        x = np.clip(np.atleast_2d(np.asarray(points, dtype=np.float64)), self.lower, self.upper)
        out = np.empty((len(x), self.bits), dtype=np.uint8)
        for j, (pivots, width) in enumerate(zip(self.pivots, self.half_widths)):
            out[:, self.columns(j)] = np.abs(x[:, j:j + 1] - np.asarray(pivots)[None, :]) <= width
        return out


def public_pivots(lower: Sequence[float], upper: Sequence[float], pivots_per_attribute: int,
                  half_width_factor: float) -> BitVectorLayout:
    """Evenly spaced pivots: ``T`` bin centers ``r_t = lo + (t + 1/2) s``, ``s = (hi - lo) / T``, and
    half-width ``theta = half_width_factor * s`` per attribute.

    Data-independent (a function of the public bounds only), so publishing them costs nothing.
    """
    if pivots_per_attribute < 1:
        raise InvalidParameterError(f"pivots_per_attribute must be >= 1, got {pivots_per_attribute}")
    if not half_width_factor > 0:
        raise InvalidParameterError(f"half_width_factor must be > 0, got {half_width_factor}")
    pivots, widths = [], []
    for lo, hi in zip(lower, upper):
        step = (float(hi) - float(lo)) / pivots_per_attribute
        pivots.append(tuple(float(lo + (t + 0.5) * step) for t in range(pivots_per_attribute)))
        widths.append(half_width_factor * step)
    return BitVectorLayout(lower=tuple(float(v) for v in lower), upper=tuple(float(v) for v in upper),
                           pivots=tuple(pivots), half_widths=tuple(widths))


def unpack_bit_payloads(payloads: Sequence[bytes], length: int) -> NDArray[np.uint8]:
    """Packed bit payloads (little-endian within bytes, :func:`ldp_client.payload.pack_bits`) as an (n, length) 0/1 array.

    Raises
    ------
    ProtocolError
        A payload of the wrong size.
    """
    width = (length + 7) // 8
    if not payloads:
        return np.zeros((0, length), dtype=np.uint8)
    data = b"".join(payloads)
    if len(data) != width * len(payloads) or any(len(p) != width for p in payloads):
        raise ProtocolError(f"every bit payload must be {width} bytes for {length} bits")
    packed = np.frombuffer(data, dtype=np.uint8).reshape(len(payloads), width)
    return np.unpackbits(packed, axis=1, count=length, bitorder="little")


def debias_bits(y: ArrayLike, p_flip: float, p_keep: float) -> NDArray[np.float64]:
    """``(y - q) / (p - q)``: unbiased for the true bits (``E[y] = q + (p - q) b``)."""
    return (np.asarray(y, dtype=np.float64) - p_flip) / (p_keep - p_flip)


def report_center_sq_distances(debiased: ArrayLike, centers: ArrayLike, bit_variance: float, *,
                               sizes: ArrayLike | None = None,
                               labels: ArrayLike | None = None) -> NDArray[np.float64]:
    """Unbiased squared distances between every report's true bits and every center, shape (n, k).

    Parameters
    ----------
    debiased : array-like of shape (n, B)
        Debiased reports ``b_hat``.
    centers : array-like of shape (k, B)
    bit_variance : float
        ``V = p q / (p - q)^2``.
    sizes : array-like of shape (k,), optional
        When the centers are means of debiased reports: the number of reports ``m_k`` of each
        (module docstring). ``None``: fixed centers, independent of the reports.
    labels : array-like of shape (n,), optional
        With ``sizes``: the center whose mean includes each report (``-1``: none).

    Returns
    -------
    numpy.ndarray of float64
        ``||b_hat_i - c_k||^2 - B V (1 + 1/m_k)``, or ``- B V (1 - 1/m_k)`` when ``i`` is in
        ``k``'s set (``- B V`` for fixed centers). Unbiased; may be negative.
    """
    x = np.asarray(debiased, dtype=np.float64)
    c = np.asarray(centers, dtype=np.float64)
    total_var = x.shape[1] * float(bit_variance)
    d2 = (x * x).sum(axis=1)[:, None] - 2.0 * x @ c.T + (c * c).sum(axis=1)[None, :]
    if sizes is None:
        return np.asarray(d2 - total_var, dtype=np.float64)
    inv = 1.0 / np.maximum(np.asarray(sizes, dtype=np.float64), 1.0)
    d2 -= total_var * (1.0 + inv)[None, :]
    if labels is not None:
        lab = np.asarray(labels, dtype=np.int64)
        rows = np.flatnonzero(lab >= 0)
        d2[rows, lab[rows]] += 2.0 * total_var * inv[lab[rows]]
    return np.asarray(d2, dtype=np.float64)


def pairwise_sq_distances(debiased: ArrayLike, bit_variance: float) -> NDArray[np.float64]:
    """Unbiased squared distances between the true bits of every pair of reports, shape (m, m).

    ``||b_hat_i - b_hat_j||^2 - 2 B V`` off the diagonal (both reports carry independent noise),
    0 on it. O(m^2 B) time, O(m^2) memory.
    """
    x = np.asarray(debiased, dtype=np.float64)
    sq = (x * x).sum(axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (x @ x.T) - 2.0 * x.shape[1] * float(bit_variance)
    np.fill_diagonal(d2, 0.0)
    return np.asarray(d2, dtype=np.float64)


@dataclass(frozen=True, kw_only=True)
class BitVectorMixture:
    """An isotropic Gaussian mixture in the encoded space: the state of the EM refinement.

    Attributes
    ----------
    centers : numpy.ndarray of shape (k, B)
        The means (debiased bit frequencies).
    weights : numpy.ndarray of shape (k,)
        The mixing weights (sum 1).
    variance : float
        The shared per-bit variance ``sigma^2`` (at least the noise variance ``V``).
    loglik : float
        Mean log-likelihood per report (up to a constant) of the reports the mixture was fitted
        on, at its E-step.
    """

    centers: NDArray[np.float64]
    weights: NDArray[np.float64]
    variance: float
    loglik: float


@dataclass(frozen=True, kw_only=True)
class BitVectorClustering:
    """A clustering in the encoded space.

    Attributes
    ----------
    centers : numpy.ndarray of shape (k, B)
        Mean debiased bits of each cluster's reports (estimated bit frequencies).
    labels : numpy.ndarray of int64, shape (n,), or None
        Each report's cluster (None from a step over a round, which holds no per-report state).
    sizes : numpy.ndarray of int64, shape (k,)
    cost : float
        Unbiased estimate of the within-cluster sum of squared encoded-space distances.
    iterations : int
    mixture : BitVectorMixture or None
        The refined mixture the centers come from (k-means with refinement).
    """

    centers: NDArray[np.float64]
    labels: NDArray[np.int64] | None
    sizes: NDArray[np.int64]
    cost: float
    iterations: int
    mixture: BitVectorMixture | None = None


class _Bits:
    """The reports' 0/1 bits with their float copies per chunk, made once and reused by every pass.

    k-means++, Lloyd and the EM refinement read the bits hundreds of times; converting them to
    float on every pass cost more than the products themselves. The float blocks are cached while
    they fit :data:`_FLOAT_CACHE_BYTES` (else converted per pass, as before): either way every
    product sees the same chunk shapes and values, so the results are the same bit for bit.
    """

    def __init__(self, bits: NDArray[np.uint8]) -> None:
        self.bits = bits
        self.starts = range(0, len(bits), _CHUNK)
        self._cache = bits.size * (4 + 8) <= _FLOAT_CACHE_BYTES
        self._f32: list[NDArray[np.float32]] = []
        self._f64: list[NDArray[np.float64]] = []
        self._weights: NDArray[np.float64] | None = None

    def __len__(self) -> int:
        return len(self.bits)

    @property
    def weights(self) -> NDArray[np.float64]:
        """Each report's Hamming weight (as float64): every distance pass needs it, so it is counted once."""
        if self._weights is None:
            self._weights = self.bits.sum(axis=1, dtype=np.int64).astype(np.float64)
        return self._weights

    @property
    def width(self) -> int:
        return int(self.bits.shape[1])

    def float32(self, i: int) -> NDArray[np.float32]:
        """Chunk ``i`` (rows ``starts[i] ..`` + :data:`_CHUNK`) as float32."""
        if self._f32:
            return self._f32[i]
        if not self._cache:
            return self.bits[self.starts[i]:self.starts[i] + _CHUNK].astype(np.float32)
        self._f32 = [self.bits[s:s + _CHUNK].astype(np.float32) for s in self.starts]
        return self._f32[i]

    def float64(self, i: int) -> NDArray[np.float64]:
        """Chunk ``i`` as float64."""
        if self._f64:
            return self._f64[i]
        if not self._cache:
            return self.bits[self.starts[i]:self.starts[i] + _CHUNK].astype(np.float64)
        self._f64 = [self.bits[s:s + _CHUNK].astype(np.float64) for s in self.starts]
        return self._f64[i]


def _row_max(a: NDArray[np.float64]) -> NDArray[np.float64]:
    """``a.max(axis=1)`` column by column: exact, and several times faster for few, long columns."""
    return np.asarray(np.maximum.reduce([a[:, j] for j in range(a.shape[1])]), dtype=np.float64)


def _scores(y: _Bits, centers: NDArray[np.float64], p_flip: float, scale: float) -> NDArray[np.float64]:
    """``<b_hat_i, c_k>`` for every report and center, from the raw bits in chunks (b_hat is never materialized)."""
    shift = p_flip * centers.sum(axis=1)
    out = np.empty((len(y), len(centers)))
    ct = centers.T.astype(np.float32)
    for i, start in enumerate(y.starts):
        out[start:start + _CHUNK] = (y.float32(i) @ ct).astype(np.float64)
    return np.asarray(scale * (out - shift[None, :]), dtype=np.float64)


def _cluster_means(y: _Bits, labels: NDArray[np.int64], k: int, p_flip: float,
                   scale: float) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    sums = np.zeros((k, y.width))
    for i, start in enumerate(y.starts):
        lab = labels[start:start + _CHUNK]
        onehot = np.zeros((len(lab), k), dtype=np.float32)
        onehot[np.arange(len(lab)), lab] = 1.0
        # Counts of set bits: float32 sums of 0/1 products are exact below 2^24 rows (a chunk has
        # _CHUNK), and twice as fast as float64.
        sums += (y.float32(i).T @ onehot).T.astype(np.float64)
    sizes = np.bincount(labels, minlength=k).astype(np.int64)
    means = scale * (sums / np.maximum(sizes, 1)[:, None] - p_flip)
    return means, sizes


def _report_sq_norms(y: _Bits, p_flip: float, scale: float) -> NDArray[np.float64]:
    # ||b_hat||^2 = scale^2 * sum (y - q)^2 = scale^2 * (w (1 - 2q) + B q^2) with w the Hamming weight.
    w = y.weights
    return np.asarray(scale * scale * (w * (1.0 - 2.0 * p_flip) + y.width * p_flip * p_flip), dtype=np.float64)


def _assign(y: _Bits, centers: NDArray[np.float64], sizes: NDArray[np.int64] | None,
            labels: NDArray[np.int64] | None, p_flip: float, scale: float,
            bit_variance: float) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Nearest center by the unbiased distance; returns labels and the distances to them."""
    d2 = _report_sq_norms(y, p_flip, scale)[:, None] - 2.0 * _scores(y, centers, p_flip, scale) \
        + (centers * centers).sum(axis=1)[None, :]
    total_var = y.width * bit_variance
    if sizes is None:
        d2 -= total_var
    else:
        inv = 1.0 / np.maximum(sizes.astype(np.float64), 1.0)
        d2 -= total_var * (1.0 + inv)[None, :]
        if labels is not None:
            d2[np.arange(len(y)), labels] += 2.0 * total_var * inv[labels]
    best = np.argmin(d2, axis=1).astype(np.int64)
    return best, d2[np.arange(len(y)), best]


def _kmeans_plus_plus(y: _Bits, k: int, rng: np.random.Generator, p_flip: float, scale: float,
                      bit_variance: float) -> NDArray[np.float64]:
    """k-means++ seeds among the reports, D^2-sampled on unbiased report-to-report distances (clipped at 0)."""
    n = len(y)
    first = int(rng.integers(n))
    seeds = [first]
    centers = scale * (y.bits[[first]].astype(np.float64) - p_flip)
    # A seed is a report, so the distance to another report carries both reports' noise: 2 B V.
    _, d2 = _assign(y, centers, None, None, p_flip, scale, bit_variance)
    d2 = np.maximum(d2 - y.width * bit_variance, 0.0)
    d2[first] = 0.0
    for _ in range(1, k):
        total = d2.sum()
        nxt = int(rng.choice(n, p=d2 / total)) if total > 0 else int(rng.integers(n))
        seeds.append(nxt)
        c = scale * (y.bits[[nxt]].astype(np.float64) - p_flip)
        _, dn = _assign(y, c, None, None, p_flip, scale, bit_variance)
        dn = np.maximum(dn - y.width * bit_variance, 0.0)
        dn[seeds] = 0.0
        d2 = np.minimum(d2, dn)
        centers = np.vstack([centers, c])
    return centers


def _lloyd_plain(bits: _Bits, centers: NDArray[np.float64], k: int, p_flip: float, scale: float,
                 bit_variance: float, max_iter: int, tol: float) -> tuple[NDArray[np.float64], NDArray[np.int64], int]:
    labels, _ = _assign(bits, centers, None, None, p_flip, scale, bit_variance)
    iterations = 0
    while iterations < max_iter:
        iterations += 1
        centers, sizes = _cluster_means(bits, labels, k, p_flip, scale)
        new, dist = _assign(bits, centers, sizes, labels, p_flip, scale, bit_variance)
        _fill_empty(new, dist, k)
        changed = float(np.mean(new != labels))
        labels = new
        if changed < tol:
            break
    centers, _ = _cluster_means(bits, labels, k, p_flip, scale)
    return centers, labels, iterations


def _fill_empty(labels: NDArray[np.int64], dist: NDArray[np.float64], k: int) -> None:
    """Give every empty cluster the report farthest from its center (in place)."""
    for empty in np.flatnonzero(np.bincount(labels, minlength=k) == 0):
        far = int(np.argmax(dist))
        labels[far] = empty
        dist[far] = -np.inf


def _soft_refine(bits: _Bits, centers: NDArray[np.float64], p_flip: float, scale: float,
                 bit_variance: float, max_iter: int, stop: float) -> tuple[BitVectorMixture, int]:
    """EM for an isotropic mixture ``b_hat ~ sum_k pi_k N(mu_k, sigma^2 I)`` started at ``centers``.

    ``sigma^2`` is the shared per-bit residual variance, at least the noise variance ``V``.
    Stops when every mean moved by less than ``stop`` of its standard error
    (:func:`moved_within_noise`). Returns the mixture (means, mixing weights, ``sigma^2``, the mean
    log-likelihood per report up to a constant) and the iterations run.
    """
    n, width = len(bits), bits.width
    k = len(centers)
    mu = centers.copy()
    pi = np.full(k, 1.0 / k)
    s2 = bit_variance
    sq = _report_sq_norms(bits, p_flip, scale)
    loglik = -np.inf
    iterations = 0
    # d2 of the current means: computed once per mean (the end of an iteration's M-step gives the
    # next E-step's distances).
    d2 = sq[:, None] - 2.0 * _scores(bits, mu, p_flip, scale) + (mu * mu).sum(axis=1)[None, :]
    while iterations < max_iter:
        iterations += 1
        logit = -d2 / (2.0 * s2) + np.log(np.maximum(pi, 1e-300))[None, :]
        top = _row_max(logit)[:, None]
        resp = np.exp(logit - top)
        total = resp.sum(axis=1, keepdims=True)
        resp /= total
        loglik = float(np.mean(np.log(total[:, 0]) + top[:, 0])) - 0.5 * width * np.log(s2)
        nk = resp.sum(axis=0)
        pi = nk / n
        previous, mu = mu, _weighted_means(bits, resp, p_flip, scale)
        d2 = sq[:, None] - 2.0 * _scores(bits, mu, p_flip, scale) + (mu * mu).sum(axis=1)[None, :]
        s2 = max(bit_variance, float((resp * d2).sum()) / (n * width))
        if moved_within_noise(previous, mu, nk, s2, stop):
            break
    return BitVectorMixture(centers=mu, weights=pi, variance=s2, loglik=loglik), iterations


def moved_within_noise(previous: NDArray[np.float64], centers: NDArray[np.float64], members: ArrayLike,
                       variance: float, stop: float) -> bool:
    """Whether every center moved by less than ``stop`` of its own standard error.

    A center that averages ``m_k`` (soft) members, each with per-bit variance ``sigma^2`` about it
    (the noise ``V`` and the cluster's spread), has standard error ``sqrt(B sigma^2 / m_k)`` in
    the encoded space (the expected norm of its noise). EM along a flat likelihood moves the
    centers by ever smaller steps; once a step is a small fraction of that error, further steps
    change the centers by less than the data determine them (the flat directions are the ones the
    data determine least), so iterating on buys nothing.
    """
    m = np.maximum(np.asarray(members, dtype=np.float64), 1.0)
    se = np.sqrt(previous.shape[1] * variance / m)
    return bool(np.all(np.linalg.norm(centers - previous, axis=1) < stop * se))


def _weighted_means(bits: _Bits, resp: NDArray[np.float64], p_flip: float,
                    scale: float) -> NDArray[np.float64]:
    sums = np.zeros((resp.shape[1], bits.width))
    for i, start in enumerate(bits.starts):
        # (B x rows) @ (rows x k): the fast orientation for BLAS (rows x k transposed on the left is not).
        sums += (bits.float64(i).T @ resp[start:start + _CHUNK]).T
    return np.asarray(scale * (sums / np.maximum(resp.sum(axis=0), 1e-300)[:, None] - p_flip), dtype=np.float64)


def kmeans_encoded(y: ArrayLike, k: int, *, p_flip: float, p_keep: float, rng: np.random.Generator | int,
                   n_init: int = 3, max_iter: int = 50, tol: float = 1e-3, refine: bool = True,
                   refine_iter: int = 300, refine_stop: float = REFINE_STOP) -> BitVectorClustering:
    """k-means of the reports' true bit vectors from their randomized bits.

    1. **k-means++** seeding among the reports, D^2-sampled on unbiased report-to-report
       distances (clipped at 0).
    2. **Lloyd**: every report goes to the center at the smallest unbiased distance
       (:func:`report_center_sq_distances` with the own-cluster correction), every center
       becomes the mean of its reports' debiased bits; an empty cluster is re-seeded at the
       report farthest from its center; stops when fewer than ``tol`` of the reports change.
    3. **Soft refinement** (``refine``, default): EM for an isotropic mixture of ``k`` means with
       a shared per-bit variance no smaller than the noise variance ``V``, started at Lloyd's
       centers. Hard assignment of single reports whose noise dwarfs the signal is a selection:
       a report lands in the center its noise points to, so Lloyd's centers drift outwards along
       their differences by about a noise standard deviation (the winner's curse; measured on a
       4-blob mixture at n = 1e5, d = 2, epsilon = 2: the partition is right but the cost ratio
       is about 25). Responsibilities computed with the known noise level do not select, and
       the refined means estimate the clusters' mean bit patterns (cost ratio about 1.2 there).

       EM stops when every mean moved by less than ``refine_stop`` of its standard error
       (:func:`moved_within_noise`), or after ``refine_iter`` iterations.

    The best of ``n_init`` runs is kept (by the mixture log-likelihood when refining, else by
    the unbiased cost). Final labels: the nearest center by the unbiased distance.

    Parameters
    ----------
    y : array-like of shape (n, B)
        Randomized 0/1 bits (:func:`unpack_bit_payloads`); ``n >= k``.
    k : int
    p_flip, p_keep : float
        The mechanism's flip and keep probabilities.
    rng : numpy.random.Generator or int
        Post-processing randomness (seeding); needs no cryptographic generator.
    """
    raw = np.ascontiguousarray(np.asarray(y, dtype=np.uint8))
    n = len(raw)
    if not 1 <= k <= n:
        raise InvalidParameterError(f"k must be in [1, n = {n}], got {k}")
    bits = _Bits(raw)
    gen = np.random.default_rng(rng) if not isinstance(rng, np.random.Generator) else rng
    scale = 1.0 / (p_keep - p_flip)
    bit_variance = p_keep * p_flip * scale * scale
    best: BitVectorClustering | None = None
    best_score = np.inf
    for _ in range(max(1, n_init)):
        seeds = _kmeans_plus_plus(bits, k, gen, p_flip, scale, bit_variance)
        centers, labels, iterations = _lloyd_plain(bits, seeds, k, p_flip, scale, bit_variance, max_iter, tol)
        score = np.nan
        mixture = None
        if refine:
            mixture, extra = _soft_refine(bits, centers, p_flip, scale, bit_variance, refine_iter, refine_stop)
            centers = mixture.centers
            iterations += extra
            score = -mixture.loglik
        labels, dist = _assign(bits, centers, None, None, p_flip, scale, bit_variance)
        sizes = np.bincount(labels, minlength=k).astype(np.int64)
        cost = float(dist.sum())
        if not refine:
            score = cost
        if best is None or score < best_score:
            best_score = score
            best = BitVectorClustering(centers=centers, labels=labels, sizes=sizes, cost=cost, iterations=iterations,
                                       mixture=mixture)
    assert best is not None
    return best


@dataclass(frozen=True, kw_only=True)
class BitVectorPassSums:
    """What a :class:`BitVectorPass` summed over a round (attributes as its docstring names them)."""

    centers: NDArray[np.float64]
    reports: int
    counts: NDArray[np.int64]
    cost: float
    totals: NDArray[np.float64]
    sums: NDArray[np.float64]
    sq_norms: NDArray[np.float64]
    loglik: float
    soft: bool
    variance: float
    p_flip: float
    p_keep: float

    def means(self) -> NDArray[np.float64]:
        """Each center's members' (or responsibility-weighted) mean debiased bits (the M-step's means)."""
        scale = 1.0 / (self.p_keep - self.p_flip)
        return np.asarray(scale * (self.sums / np.maximum(self.totals, 1e-300)[:, None] - self.p_flip),
                          dtype=np.float64)

    def within_sums(self, means: NDArray[np.float64]) -> NDArray[np.float64]:
        """Per center, ``sum_i w_ik ||b_hat_i - m_k||^2`` for ``means`` ``m`` (from the sums, no report needed)."""
        scale = 1.0 / (self.p_keep - self.p_flip)
        debiased_sums = scale * (self.sums - self.p_flip * self.totals[:, None])
        return np.asarray(self.sq_norms - 2.0 * (means * debiased_sums).sum(axis=1)
                          + self.totals * (means * means).sum(axis=1), dtype=np.float64)

    def mixture(self) -> BitVectorMixture:
        """The M-step: the next mixture (a soft pass), as :func:`kmeans_encoded`'s refinement makes it."""
        if not self.soft:
            raise InvalidParameterError("a hard-assignment pass has no mixture to update")
        width = self.sums.shape[1]
        scale = 1.0 / (self.p_keep - self.p_flip)
        bit_variance = self.p_keep * self.p_flip * scale * scale
        mu = self.means()
        n = max(self.reports, 1)
        s2 = max(bit_variance, float(self.within_sums(mu).sum()) / (n * width))
        return BitVectorMixture(centers=mu, weights=self.totals / n, variance=s2,
                                loglik=self.loglik / n - 0.5 * width * float(np.log(self.variance)))


class BitVectorPass(DecodedPass[BitVectorPassSums]):
    """One pass over a round's bit-vector reports given ``k`` centers: an EM iteration, or a hard assignment.

    Every report goes to its nearest center by the unbiased distance for fixed centers
    (:func:`report_center_sq_distances`): the pass counts each center's reports and sums their
    distances (the unbiased cost). With a mixture (``weights`` and ``variance``), it also makes
    the E-step of :func:`kmeans_encoded`'s refinement and sums its M-step's statistics: per center
    the responsibilities, the responsibility-weighted sums of the raw bits and of the reports'
    squared norms, and the log-likelihood. Without one, those sums are over the hard assignment
    (the members' counts, bit sums and squared norms): the means of the assigned reports.

    State: the centers and the sums, ``(2 B + 4) k + 3`` floats whatever the number of reports.
    Float order: every sum is of non-negative terms (bits, responsibilities, squared norms) except
    the cost and the log-likelihood, so a sum added in another order differs by at most
    ``2 (n - 1) u`` times itself (:func:`~.report_accumulator.summation_error_bound`); the counts
    are integers (a report's nearest center can change only on an exact tie).

    Parameters
    ----------
    centers : array_like of shape (k, B)
        In the encoded space (debiased bit frequencies).
    p_flip, p_keep : float
        The mechanism's flip and keep probabilities.
    weights : array_like of shape (k,), optional
        The mixture's weights; with ``variance``, the pass is an EM iteration.
    variance : float, optional
        The mixture's shared per-bit variance.
    component_params_by_group : Mapping[int, Sequence[MechanismParams]], optional
        The round's components (needed by :meth:`decode`).
    key : str
        The bit-vector component ``"<group>:<component>"``.
    """

    def __init__(self, centers: ArrayLike, *, p_flip: float, p_keep: float, weights: ArrayLike | None = None,
                 variance: float | None = None, component_params_by_group: ComponentParams | None = None,
                 key: str = "0:0") -> None:
        self.centers = np.array(centers, dtype=np.float64, ndmin=2)
        self.p_flip, self.p_keep = float(p_flip), float(p_keep)
        self.scale = 1.0 / (self.p_keep - self.p_flip)
        self.bit_variance = self.p_keep * self.p_flip * self.scale * self.scale
        self.soft = weights is not None and variance is not None
        self.weights = (np.asarray(weights, dtype=np.float64).copy() if weights is not None
                        else np.full(len(self.centers), np.nan))
        self.variance = float(variance) if variance is not None else float("nan")
        self._by_group = {int(g): tuple(p) for g, p in (component_params_by_group or {}).items()}
        self._key = key
        k, width = self.centers.shape
        self._reports = 0
        self._counts = np.zeros(k, dtype=np.int64)
        self._cost = 0.0
        self._totals = np.zeros(k)
        self._sums = np.zeros((k, width))
        self._sq_norms = np.zeros(k)
        self._loglik = 0.0

    @property
    def decoding(self) -> Hashable:
        # Every pass of a step unpacks the same component's bits.
        return ("bitvector", self._key, self.centers.shape[1])

    def decode(self, reports: Sequence[StoredReport]) -> NDArray[np.uint8]:
        """The reports' randomized bits, shape (n, B) (:func:`unpack_bit_payloads`)."""
        payloads = decode_report_payloads(reports, self._by_group).get(self._key, [])
        return unpack_bit_payloads(payloads, self.centers.shape[1])

    def add_decoded(self, decoded: NDArray[np.uint8]) -> None:
        """Add randomized bits (shape (n, B)), in chunks of :data:`_CHUNK` rows."""
        bits = np.asarray(decoded, dtype=np.uint8)
        if bits.ndim != 2 or bits.shape[1] != self.centers.shape[1]:
            raise InvalidParameterError(f"bits must have shape (n, {self.centers.shape[1]}), got {bits.shape}")
        for start in range(0, len(bits), _CHUNK):
            self._add_chunk(bits[start:start + _CHUNK])

    def _add_chunk(self, y: NDArray[np.uint8]) -> None:
        mu, q, scale = self.centers, self.p_flip, self.scale
        rows, width = y.shape
        yf = y.astype(np.float64)
        # ||b_hat||^2 from the Hamming weight, <b_hat, mu> from the raw bits (as _report_sq_norms, _scores).
        sq = scale * scale * (yf.sum(axis=1) * (1.0 - 2.0 * q) + width * q * q)
        scores = scale * ((y.astype(np.float32) @ mu.T.astype(np.float32)).astype(np.float64)
                          - q * mu.sum(axis=1)[None, :])
        d2 = sq[:, None] - 2.0 * scores + (mu * mu).sum(axis=1)[None, :]
        nearest = np.argmin(d2, axis=1)
        self._counts += np.bincount(nearest, minlength=len(mu))
        self._cost += float((d2[np.arange(rows), nearest] - width * self.bit_variance).sum())
        if self.soft:
            logit = -d2 / (2.0 * self.variance) + np.log(np.maximum(self.weights, 1e-300))[None, :]
            top = _row_max(logit)[:, None]
            weight = np.exp(logit - top)
            total = weight.sum(axis=1, keepdims=True)
            weight /= total
            self._loglik += float((np.log(total[:, 0]) + top[:, 0]).sum())
        else:
            weight = np.zeros((rows, len(mu)))
            weight[np.arange(rows), nearest] = 1.0
        self._reports += rows
        self._totals += weight.sum(axis=0)
        # (B x rows) @ (rows x k): the fast orientation for BLAS (as _weighted_means).
        self._sums += (yf.T @ weight).T
        self._sq_norms += sq @ weight

    def zero(self) -> BitVectorPass:
        return BitVectorPass(self.centers, p_flip=self.p_flip, p_keep=self.p_keep,
                             weights=self.weights if self.soft else None,
                             variance=self.variance if self.soft else None,
                             component_params_by_group=self._by_group, key=self._key)

    def merge(self, other: BitVectorPass) -> None:
        if other.centers.shape != self.centers.shape or other.soft != self.soft:
            raise ProtocolError("cannot merge bit-vector passes over different centers")
        self._reports += other._reports
        self._counts += other._counts
        self._cost += other._cost
        self._totals += other._totals
        self._sums += other._sums
        self._sq_norms += other._sq_norms
        self._loglik += other._loglik

    def finalize(self) -> BitVectorPassSums:
        return BitVectorPassSums(centers=self.centers.copy(), reports=self._reports, counts=self._counts.copy(),
                                 cost=self._cost, totals=self._totals.copy(), sums=self._sums.copy(),
                                 sq_norms=self._sq_norms.copy(), loglik=self._loglik, soft=self.soft,
                                 variance=self.variance, p_flip=self.p_flip, p_keep=self.p_keep)

    @property
    def nbytes(self) -> int:
        return int(self.centers.nbytes + self.weights.nbytes + self._counts.nbytes + self._totals.nbytes
                   + self._sums.nbytes + self._sq_norms.nbytes) + 24


#: Runs a pass over every report of a round and returns its sums (``lambda p: reports.combine(p).finalize()``).
PassCombiner = Callable[[BitVectorPass], BitVectorPassSums]


def array_passes(y: ArrayLike) -> PassCombiner:
    """Runs passes over reports held in memory (randomized bits, shape (n, B)), in :data:`_CHUNK` rows."""
    bits = np.ascontiguousarray(np.asarray(y, dtype=np.uint8))

    def run(accumulator: BitVectorPass) -> BitVectorPassSums:
        accumulator.add_decoded(bits)
        return accumulator.finalize()
    return run


def refine_on_round(start: BitVectorMixture, passes: PassCombiner, *, p_flip: float, p_keep: float,
                    stop: float = REFINE_STOP, max_passes: int = MAX_ROUND_PASSES,
                    component_params_by_group: ComponentParams | None = None,
                    key: str = "0:0") -> tuple[BitVectorClustering, bool]:
    """EM over a whole round from ``start`` (a fit on a sample of it), one pass per iteration.

    Each pass (:class:`BitVectorPass`, run by ``passes``: ``RoundReports.combine`` in a step)
    makes one EM iteration of :func:`kmeans_encoded`'s refinement over every report and counts the
    reports nearest to each center. Stops when every mean moved by less than ``stop`` of its
    standard error on the whole round (:func:`moved_within_noise`), or after ``max_passes``
    passes. The published centers are the last pass's input (the M-step it made moved them by
    less than ``stop`` standard errors), so the sizes and the unbiased cost are those of the
    centers published, as :func:`kmeans_encoded`'s are.

    ``component_params_by_group`` and ``key`` say how a pass decodes stored reports
    (:class:`BitVectorPass`). Returns the clustering (no labels; ``iterations`` = passes made)
    and whether the rule stopped it (False: ``max_passes`` ran out).
    """
    mixture = start
    made = 0
    while True:
        made += 1
        sums = passes(BitVectorPass(mixture.centers, p_flip=p_flip, p_keep=p_keep, weights=mixture.weights,
                                    variance=mixture.variance, component_params_by_group=component_params_by_group,
                                    key=key))
        following = sums.mixture()
        converged = moved_within_noise(mixture.centers, following.centers, sums.totals, following.variance, stop)
        if converged or made >= max_passes:
            break
        mixture = following
    mixture = BitVectorMixture(centers=mixture.centers, weights=mixture.weights, variance=mixture.variance,
                               loglik=sums.loglik / max(sums.reports, 1)
                               - 0.5 * mixture.centers.shape[1] * float(np.log(mixture.variance)))
    fit = BitVectorClustering(centers=mixture.centers, labels=None, sizes=sums.counts, cost=sums.cost,
                              iterations=made, mixture=mixture)
    return fit, converged


def dbscan_encoded(y: ArrayLike, k: int, *, p_flip: float, p_keep: float, rng: np.random.Generator | int,
                   sample: int = DBSCAN_SAMPLE, min_samples: int | None = None,
                   radius: float | None = None) -> BitVectorClustering:
    """DBSCAN on unbiased pairwise encoded-space distances, for moderate n, on reports held in memory.

    Up to ``sample`` reports (a uniform subsample beyond) are clustered by :func:`dbscan_cores`;
    then :func:`dbscan_on_round` assigns every report (no labels are returned).
    """
    bits = np.ascontiguousarray(np.asarray(y, dtype=np.uint8))
    n = len(bits)
    if n == 0:
        raise InvalidParameterError("dbscan needs at least one report")
    gen = np.random.default_rng(rng) if not isinstance(rng, np.random.Generator) else rng
    m = min(n, sample)
    index = np.sort(gen.choice(n, size=m, replace=False)) if m < n else np.arange(n)
    cores = dbscan_cores(bits[index], k, p_flip=p_flip, p_keep=p_keep, min_samples=min_samples, radius=radius)
    return dbscan_on_round(cores, array_passes(bits), width=bits.shape[1], p_flip=p_flip, p_keep=p_keep)


def dbscan_cores(y: ArrayLike, k: int, *, p_flip: float, p_keep: float, min_samples: int | None = None,
                 radius: float | None = None) -> NDArray[np.float64] | None:
    """The core centroids of DBSCAN on a sample of reports, largest cluster first; None without a core.

    The sample's ``m`` reports (randomized bits) are clustered with plain O(m^2) DBSCAN on
    :func:`pairwise_sq_distances`: a report is a *core* when at least ``min_samples`` reports
    (itself included) lie within squared distance ``radius``; clusters are the connected
    components of cores. At most ``k`` clusters are kept (the largest); a cluster's core centroid
    is the mean debiased bits of its cores.

    Defaults: ``min_samples = max(5, m / (20 k))``; ``radius`` is the median over the cores'
    candidates of the unbiased squared distance to the ``min_samples``-th nearest report. On
    single reports the distance noise is of order ``sqrt(B) V``, and DBSCAN's transitive
    core links let a few noisy pairs bridge two clusters: measured on three blobs 7 apart in a
    10 x 10 box, 8 pivots per attribute, 30000 reports, the clusters are found from exact bits
    but merged into one already at epsilon = 16 (``V = 0.18``). Use k-means unless the noise is
    negligible.
    """
    bits = np.asarray(y, dtype=np.uint8)
    m = len(bits)
    if m == 0:
        raise InvalidParameterError("dbscan needs at least one report")
    scale = 1.0 / (p_keep - p_flip)
    bit_variance = p_keep * p_flip * scale * scale
    sub = scale * (bits.astype(np.float64) - p_flip)
    d2 = pairwise_sq_distances(sub, bit_variance)
    min_pts = min(m, min_samples if min_samples is not None else max(5, m // (20 * max(k, 1))))
    kth = np.partition(d2, min_pts - 1, axis=1)[:, min_pts - 1]
    eps2 = float(np.median(kth)) if radius is None else float(radius)
    neighbours = d2 <= eps2
    core = neighbours.sum(axis=1) >= min_pts
    labels_sub = np.full(m, -1, dtype=np.int64)
    cluster = 0
    for start in np.flatnonzero(core):
        if labels_sub[start] >= 0:
            continue
        labels_sub[start] = cluster
        frontier = [int(start)]
        while frontier:
            i = frontier.pop()
            for j in np.flatnonzero(neighbours[i] & core & (labels_sub < 0)):
                labels_sub[j] = cluster
                frontier.append(int(j))
        cluster += 1
    if cluster == 0:
        return None
    core_sizes = np.bincount(labels_sub[labels_sub >= 0], minlength=cluster)
    keep = np.argsort(-core_sizes, kind="stable")[:k]
    return np.stack([sub[(labels_sub == c) & core].mean(axis=0) for c in keep])


def dbscan_on_round(core_centroids: NDArray[np.float64] | None, passes: PassCombiner, *, width: int,
                    p_flip: float, p_keep: float, component_params_by_group: ComponentParams | None = None,
                    key: str = "0:0") -> BitVectorClustering:
    """DBSCAN's clusters over a whole round: one hard pass (:class:`BitVectorPass`) over every report.

    Every report joins the cluster whose core centroid (:func:`dbscan_cores`) is nearest by the
    unbiased distance (all one cluster when there is no core); the centers are the means of
    those assignments, and the cost the unbiased within-cluster sum, from the pass's sums: a
    member's squared distance to its own cluster's mean loses ``B V (1 - 1/m)`` (the module
    docstring), so the cost is ``sum_k (S_k - m_k ||c_k||^2 - m_k B V (1 - 1/m_k))`` with ``S_k``
    the members' summed squared norms. No labels (a round step holds no per-report state).
    """
    scale = 1.0 / (p_keep - p_flip)
    bit_variance = p_keep * p_flip * scale * scale
    start = core_centroids if core_centroids is not None else np.zeros((1, width))
    sums = passes(BitVectorPass(start, p_flip=p_flip, p_keep=p_keep, component_params_by_group=component_params_by_group,
                                key=key))
    centers = sums.means()
    sizes = sums.counts
    own = sizes * width * bit_variance * (1.0 - 1.0 / np.maximum(sizes, 1))
    cost = float((sums.within_sums(centers) - own).sum())
    return BitVectorClustering(centers=centers, labels=None, sizes=sizes, cost=cost,
                               iterations=0 if core_centroids is None else 1)


def expected_pattern(z: ArrayLike, spread: float, pivots: ArrayLike, half_width: float) -> NDArray[np.float64]:
    """``beta_t(z, h)``: the share of ``[z - h, z + h]`` inside ``[r_t - theta, r_t + theta]`` (module docstring).

    ``spread`` ``h = 0`` gives the bits of the points ``z`` themselves. Shape ``(len(z), T)``.
    """
    zz = np.atleast_1d(np.asarray(z, dtype=np.float64))[:, None]
    r = np.asarray(pivots, dtype=np.float64)[None, :]
    if spread <= 0:
        return (np.abs(zz - r) <= half_width).astype(np.float64)
    overlap = np.minimum(zz + spread, r + half_width) - np.maximum(zz - spread, r - half_width)
    return np.asarray(np.clip(overlap, 0.0, None) / (2.0 * spread), dtype=np.float64)


def decode_centers(centers: ArrayLike, layout: BitVectorLayout, *, grid: int = DECODE_GRID,
                   spreads: Sequence[float] = DECODE_SPREADS) -> NDArray[np.float64]:
    """Encoded-space centers (bit frequencies) -> points in the original units, shape (k, d).

    Per attribute, the grid point ``z`` (``grid`` points across ``[lo, hi]``) and spread ``h``
    (``spreads`` times the pivot spacing) minimizing ``||beta(z, h) - c_j||^2``; ties go to the
    smallest spread and, within it, to the median of the tied grid points (the middle of a
    plateau of equal patterns). Cost O(k * grid * len(spreads) * T_j) per attribute.
    """
    c = np.atleast_2d(np.asarray(centers, dtype=np.float64))
    if c.shape[1] != layout.bits:
        raise InvalidParameterError(f"centers must have {layout.bits} columns (bits), got {c.shape[1]}")
    out = np.empty((len(c), layout.dimension))
    for j in range(layout.dimension):
        lo, hi = layout.lower[j], layout.upper[j]
        pivots = np.asarray(layout.pivots[j])
        zs = np.linspace(lo, hi, grid)
        if len(pivots) == 0:
            out[:, j] = 0.5 * (lo + hi)
            continue
        step = (hi - lo) / len(pivots)
        # The model patterns depend on the layout only: made once per attribute for every center.
        betas = [expected_pattern(zs, h * step, pivots, layout.half_widths[j]) for h in spreads]  # (G, T) each
        norms = [(beta * beta).sum(axis=1)[None, :] for beta in betas]
        for r0 in range(0, len(c), _DECODE_ROWS):
            cj = c[r0:r0 + _DECODE_ROWS, layout.columns(j)]
            cn = (cj * cj).sum(axis=1)[:, None]
            # loss[:, h] = nb - 2 cj beta^T + cn, the same operations in the same order as one
            # expression per spread, written in place (no temporaries, no stacking copy).
            loss = np.empty((len(cj), len(betas), len(zs)))  # (rows, H, G)
            product = np.empty((len(cj), len(zs)))
            for h, (beta, nb) in enumerate(zip(betas, norms)):
                np.matmul(cj, beta.T, out=product)
                product *= 2.0
                np.subtract(nb, product, out=loss[:, h])
                loss[:, h] += cn
            for i in range(len(cj)):
                li = loss[i]
                low = li.min()
                tied = li <= low + 1e-9 * max(1.0, abs(low))
                h_best = int(np.flatnonzero(tied.any(axis=1))[0])
                out[r0 + i, j] = float(np.median(zs[tied[h_best]]))
    return out


def decoded_center_variances(centers: ArrayLike, sizes: ArrayLike, layout: BitVectorLayout, bit_variance: float,
                             rng: np.random.Generator, *, replicates: int = 32) -> NDArray[np.float64]:
    """Per-coordinate noise variance of each decoded center (original units), shape (k, d).

    A center's debiased bit means carry independent noise of variance ``bit_variance / size`` per bit;
    :func:`decode_centers` is a nonlinear fit (plateaus, a spread), so the variance it passes on is
    measured by a parametric bootstrap: ``replicates`` draws of that noise added to the bit means,
    each decoded, the mean squared distance to the decoded center per coordinate. Deterministic for
    a seeded ``rng``; ``inf`` for an empty cluster.
    """
    c = np.atleast_2d(np.asarray(centers, dtype=np.float64))
    m = np.asarray(sizes, dtype=np.float64).reshape(-1)
    out = np.full((len(c), layout.dimension), np.inf)
    live = m > 0
    if not live.any() or replicates < 2:
        return out
    base = decode_centers(c[live], layout)
    sd = np.sqrt(bit_variance / m[live])[:, None]
    # One draw and one decode for every replicate (the same normals, in the same order, as one draw per replicate).
    noise = rng.standard_normal((replicates, *c[live].shape))
    decoded = decode_centers((c[live][None, :, :] + sd[None, :, :] * noise).reshape(-1, c.shape[1]),
                             layout).reshape(replicates, len(base), layout.dimension)
    total = np.zeros_like(base)
    for r in range(replicates):
        total += (decoded[r] - base) ** 2
    out[live] = total / replicates
    return out
