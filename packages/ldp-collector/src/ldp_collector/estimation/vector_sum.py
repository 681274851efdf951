"""Per-bucket vector sums from bucketized vector reports (numpy, vectorized, chunked).

Each report of :class:`~ldp_client.mechanisms.bucketized_vector.BucketizedVectorParams` is a
:class:`~ldp_client.payload.SignedVector` ``(s_i, y_i)``: a public sign seed and the inner vector
randomizer's output on ``sigma_{s_i}(b_i) v_i``. For ANY bucket c chosen after the fact, the
estimate of the sum of ``v`` over the devices in c is

    S_c = sum_i sigma_{s_i}(c) z_i,    sigma_s(c) = 1 - 2 H(s, c, 2),

with ``z_i`` the unbiased decoding of ``y_i`` in box units (:func:`decode_signed`) and H the
local-hashing hash (:func:`~ldp_collector.estimation.olh_hash.hash_values`, bit-identical to the
SDK). With vectors from :class:`~ldp_client.encoders.bucketed.BucketedVectorEncoder`,
``v = (2t - 1, 1)``: the first ``d`` coordinates sum the centred normalized points, the last one
counts the bucket's devices.

Variance
    With M = ``params.report_second_moment`` (B^2 for the box, B'^2 for the l2 ball; the SDK
    module docstring derives both), the exact variance of coordinate j of S_c over n reports is
    ``n M - sum_{i in c} v_ij^2`` (ideal sign hash), at most ``n M`` =
    :attr:`BucketSums.variance_bound`. :attr:`BucketSums.variances` holds the plug-in
    ``sum_i z_ij^2``, an unbiased estimate of ``n M`` (so of the bound; it overstates the exact
    variance by the bucket's ``sum v_ij^2``, at most its device count). For the box every
    ``z_ij^2`` is ``B^2``, so the plug-in equals the bound exactly; for the ball it is random.
    For PrivUnit a report's ``E[z_ij^2]`` depends on its input's direction and M is its largest
    value: ``n M`` is a bound, and the plug-in estimates the exact ``sum_i E[z_ij^2]`` below it.
Cost
    One hash and ``D`` multiply-adds per (report, bucket) pair, about 12 ns per pair on one core
    (1e6 box reports of D = 11 x 500 buckets: about 6 s). Reports are decoded in chunks of at most
    2^16 reports (and 2^22 floats), and their signs are computed in cache-sized blocks of about
    2^15 (report, bucket) pairs (at most 2^22 for huge bucket lists), so the scratch is a few MiB
    whatever n and m: 1e6 reports x 500 buckets stay far below 1 GiB. Stored reports in their usual
    form (box, l2 ball, PrivUnit) are read straight from their msgpack into seed and float32 (or
    packed sign) columns, without a payload object per report (the same sums bit for bit; anything
    unusual takes the per-payload path and its errors).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams, VectorShape
from ldp_client.mechanisms.local_hashing import SEED_BITS
from ldp_client.payload import Floats, SignedVector, payload_from_wire, payload_to_wire

from ..storage.base import StoredReport
from .accumulators import ComponentParams, decode_report_payloads
from .olh_hash import hash_values
from .report_accumulator import ReportAccumulator

__all__ = ["LLOYD_MIN_COUNT_Z", "BucketSumAccumulator", "BucketSums", "LloydMove", "analytic_variance", "bucket_sums", "decode_signed",
           "james_stein_shares", "lloyd_move", "shrink_toward_centroid"]

#: (reports x buckets) pairs per sign block: about 256 KiB of uint64, so a block stays in cache.
_BLOCK_PAIRS = 1 << 15
#: Fewest reports per sign block (amortizes the per-call overhead when there are many buckets) ...
_MIN_BLOCK_ROWS = 64
#: ... unless that exceeds this many pairs (32 MiB of uint64 per scratch array).
_MAX_BLOCK_PAIRS = 1 << 22
#: Reports decoded at once, and decoded floats per chunk (bound the chunk's n x D floats).
_CHUNK_REPORTS = 1 << 16
_CHUNK_FLOATS = 1 << 22
#: The bits of the float64 1.0; with bit 63 set they are -1.0.
_ONE_BITS = np.uint64(0x3FF0000000000000)
_SIGN_SHIFT = np.uint64(63)


@dataclass(frozen=True, kw_only=True, eq=False)
class BucketSums:
    """Estimated per-bucket vector sums, in box units.

    Attributes
    ----------
    buckets : numpy.ndarray of uint64, shape (m,)
        The buckets asked for, in order.
    sums : numpy.ndarray of float64, shape (m, D)
        Row k: the unbiased estimate of the sum of ``v`` over the devices in ``buckets[k]``.
    variances : numpy.ndarray of float64, shape (m, D)
        The plug-in variance ``sum_i z_ij^2`` of each entry of ``sums`` (the same for every bucket):
        an unbiased estimate of ``n M`` (module docstring), conservative by the bucket's
        ``sum v_ij^2``.
    variance_bound : float
        The analytic bound ``n M`` on the variance of every entry of ``sums``.
    reports : int
        n, the number of reports summed.
    """

    buckets: NDArray[np.uint64]
    sums: NDArray[np.float64]
    variances: NDArray[np.float64]
    variance_bound: float
    reports: int

    @property
    def std_errors(self) -> NDArray[np.float64]:
        """``sqrt(variances)``."""
        out: NDArray[np.float64] = np.sqrt(self.variances)
        return out

    @property
    def counts(self) -> NDArray[np.float64]:
        """The last coordinate of ``sums``: the bucket's device counts for ``(2t - 1, 1)`` vectors."""
        out: NDArray[np.float64] = self.sums[:, -1]
        return out


def _check_params(params: Any) -> BucketizedVectorParams:
    if not isinstance(params, BucketizedVectorParams):
        raise TypeError(f"params must be BucketizedVectorParams, got {type(params).__name__}")
    return params


def _seeds(payloads: Sequence[Any]) -> NDArray[np.uint64]:
    """The seeds of checked-type payloads, as uint64; a seed out of [0, 2^32) raises ProtocolError."""
    seeds = [p.seed for p in payloads]
    if set(map(type, seeds)) - {int}:
        raise ProtocolError("bucketized_vector seeds must be ints")
    if seeds and (min(seeds) < 0 or max(seeds) >= 2**SEED_BITS):
        raise ProtocolError(f"bucketized_vector seeds must be in [0, 2^{SEED_BITS})")
    return np.array(seeds, dtype=np.uint64)


def decode_signed(params: BucketizedVectorParams,
                  payloads: Sequence[Any]) -> tuple[NDArray[np.uint64], NDArray[np.float64]]:
    """The seeds and unbiased decodings ``z_i`` (box units, sign not applied) of bucketized vector reports.

    Parameters
    ----------
    params : BucketizedVectorParams
    payloads : sequence of SignedVector
        Decoded payloads of that mechanism (already checked at ingestion; shapes are re-checked).

    Returns
    -------
    (numpy.ndarray of uint64, numpy.ndarray of float64)
        ``seeds`` of shape (n,) and ``z`` of shape (n, D), with ``E[z_i] = sigma_{s_i}(b_i) v_i``.

    Raises
    ------
    ProtocolError
        A payload that is not a SignedVector, a seed out of range, or an inner payload of the wrong
        type or shape (packed signs of the wrong length or with bits beyond D; floats of the wrong
        count or not finite).
    """
    params = _check_params(params)
    d = params.dimension
    n = len(payloads)
    if set(map(type, payloads)) - {SignedVector}:
        raise ProtocolError("bucketized_vector payloads must be SignedVector")
    seeds = _seeds(payloads)
    if n == 0:
        return seeds, np.zeros((0, d))
    inners = [p.inner for p in payloads]
    if params.shape == VectorShape.BOX:
        width = (d + 7) // 8
        if set(map(type, inners)) != {bytes} or set(map(len, inners)) != {width}:
            raise ProtocolError(f"bucketized_vector (box) inner payloads must be {width} bytes of packed signs")
        return seeds, _box_rows(params, np.frombuffer(b"".join(inners), dtype=np.uint8).reshape(n, width))
    if set(map(type, inners)) != {Floats} or set(map(len, (f.values for f in inners))) != {d}:
        raise ProtocolError(f"bucketized_vector (l2 ball) inner payloads must be Floats of {d} values")
    try:
        w = np.array([f.values for f in inners], dtype=np.float64).reshape(n, d)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"bucketized_vector (l2 ball) inner payloads must hold floats: {exc}") from None
    return seeds, _float_rows(params, w)


def _box_rows(params: BucketizedVectorParams, raw: NDArray[np.uint8]) -> NDArray[np.float64]:
    """``z`` of box reports from their packed signs, one row of ``ceil(D / 8)`` bytes per report."""
    d = params.dimension
    if d % 8 and bool((raw[:, -1] >> (d % 8)).any()):
        raise ProtocolError(f"bucketized_vector (box) inner payloads have bits set beyond the dimension {d}")
    bits = np.unpackbits(raw, axis=1, count=d, bitorder="little")
    z: NDArray[np.float64] = np.where(bits.astype(bool), params.decode_scale, -params.decode_scale)
    return z


def _float_rows(params: BucketizedVectorParams, w: NDArray[np.float64]) -> NDArray[np.float64]:
    """``z`` of l2-ball or PrivUnit reports from their floats, one row per report."""
    if not np.isfinite(w).all():
        raise ProtocolError("bucketized_vector (l2 ball) inner payloads must be finite")
    z: NDArray[np.float64] = params.decode_scale * w
    return z


def _bucket_array(params: BucketizedVectorParams, buckets: ArrayLike) -> NDArray[np.uint64]:
    """``buckets`` as a 1-D uint64 array of buckets in ``[0, 2^bucket_bits)``."""
    arr = np.asarray(buckets)
    if arr.dtype.kind == "f" and not isinstance(buckets, np.ndarray):
        # numpy turns Python ints below and above 2^63 mixed in one list into (inexact) floats.
        arr = np.asarray(buckets, dtype=object)
    if arr.ndim != 1:
        raise ValueError(f"buckets must be a 1-D array, got shape {arr.shape}")
    limit = 2**params.bucket_bits
    if arr.dtype == object:  # Python ints beyond int64
        values = arr.tolist()
        if any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) for b in values):
            raise TypeError("buckets must be integers")
        if values and not 0 <= min(values) <= max(values) < limit:
            raise ValueError(f"buckets must be in [0, 2^{params.bucket_bits})")
        return np.array(values, dtype=np.uint64)
    if arr.dtype.kind not in "iu":
        if arr.size == 0:
            return np.zeros(0, dtype=np.uint64)
        raise TypeError(f"buckets must be integers, got dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= limit):
        raise ValueError(f"buckets must be in [0, 2^{params.bucket_bits}), got {int(arr.min())} to {int(arr.max())}")
    return arr.astype(np.uint64)


def bucket_sums(params: BucketizedVectorParams, payloads: Sequence[SignedVector], buckets: ArrayLike) -> BucketSums:
    """Unbiased estimates of the per-bucket sums of the devices' vectors, for any buckets.

    Parameters
    ----------
    params : BucketizedVectorParams
        The mechanism of the reports.
    payloads : sequence of SignedVector
        The reports' decoded payloads.
    buckets : array_like of int, shape (m,)
        Buckets in ``[0, 2^params.bucket_bits)``; repeats are allowed.

    Returns
    -------
    BucketSums
        ``sums[k]`` estimates the sum of ``v`` over the devices in ``buckets[k]`` (box units:
        ``(2t - 1, 1)`` for :class:`~ldp_client.encoders.bucketed.BucketedVectorEncoder` vectors),
        with the plug-in and analytic variances (module docstring).

    Raises
    ------
    ProtocolError
        A malformed payload (:func:`decode_signed`).
    TypeError, ValueError
        ``params`` of another mechanism, or buckets that are not integers of the bucket range.

    Notes
    -----
    Memory: the decoded floats of one chunk of reports and a few (report, bucket) blocks of about
    2^15 entries (module docstring), besides the output.
    """
    accumulator = BucketSumAccumulator(params, buckets)
    accumulator.add_payloads(payloads)
    return accumulator.finalize()


class BucketSumAccumulator(ReportAccumulator[BucketSums]):
    """Per-bucket vector sums of a round's bucketized vector reports, as a mergeable accumulator.

    The state of :func:`bucket_sums`: the ``(m, D)`` signed sums, the ``D`` sums of squares and of
    absolute values of the decoded ``z_ij``, and n, so its size is ``(m + 2) D`` floats whatever n.
    :meth:`add` reads the components ``keys`` of stored reports (by column when they are in the usual
    stored form: module docstring, "Cost"); :meth:`add_payloads` takes decoded payloads.

    Float order: adding and merging in another order changes each sum by at most
    ``2 (n - 1) u sum_i |z_ij|`` (:func:`~.report_accumulator.summation_error_bound`, with
    :attr:`abs_sums`); every ``|sigma z_ij|`` is ``|z_ij|``, so one bound per coordinate holds
    for every bucket.

    Parameters
    ----------
    params : BucketizedVectorParams
        The reports' mechanism.
    buckets : array_like of int, shape (m,)
        Buckets in ``[0, 2^params.bucket_bits)``; repeats are allowed.
    component_params_by_group : Mapping[int, Sequence[MechanismParams]], optional
        The round's components (needed by :meth:`add`).
    keys : sequence of str, optional
        The components ``"<group>:<component>"`` whose reports :meth:`add` sums (all of ``params``).
    """

    def __init__(self, params: BucketizedVectorParams, buckets: ArrayLike,
                 component_params_by_group: ComponentParams | None = None, keys: Sequence[str] = ()) -> None:
        self._params = _check_params(params)
        self._cells = _bucket_array(self._params, buckets)
        self._by_group = {int(g): tuple(p) for g, p in (component_params_by_group or {}).items()}
        self._keys = tuple(keys)
        d = self._params.dimension
        self._sums = np.zeros((self._cells.shape[0], d))
        self._squares = np.zeros(d)
        self._abs = np.zeros(d)
        self._n = 0

    @property
    def n(self) -> int:
        """Number of reports added."""
        return self._n

    @property
    def abs_sums(self) -> NDArray[np.float64]:
        """``sum_i |z_ij|`` per coordinate: with n, the bound on the order's effect (class docstring)."""
        return self._abs.copy()

    def zero(self) -> BucketSumAccumulator:
        return BucketSumAccumulator(self._params, self._cells, self._by_group, self._keys)

    def add(self, reports: Sequence[StoredReport]) -> None:
        columns = _signed_columns(reports, self._params, self._by_group, self._keys)
        if columns is not None:  # the common stored form, read column by column: the same sums bit for bit
            box = self._params.shape == VectorShape.BOX
            for seeds, raw in columns:
                for r0 in range(0, len(seeds), self._chunk):
                    rows = raw[r0:r0 + self._chunk]
                    z = _box_rows(self._params, rows) if box else _float_rows(self._params, rows.astype(np.float64))
                    self._add_decoded(seeds[r0:r0 + self._chunk], z)
            return
        decoded = decode_report_payloads(reports, self._by_group)
        for key in self._keys:
            self.add_payloads(decoded.get(key, ()))

    @property
    def _chunk(self) -> int:
        """Reports decoded at once (module docstring, "Cost")."""
        return max(1, min(_CHUNK_REPORTS, _CHUNK_FLOATS // self._params.dimension))

    def add_payloads(self, payloads: Sequence[SignedVector]) -> None:
        """Add decoded payloads, in chunks (module docstring, "Cost")."""
        payloads = list(payloads)
        for r0 in range(0, len(payloads), self._chunk):
            self._add_decoded(*decode_signed(self._params, payloads[r0:r0 + self._chunk]))

    def _add_decoded(self, seeds: NDArray[np.uint64], z: NDArray[np.float64]) -> None:
        """Add one chunk of decoded reports: their seeds and ``z`` rows."""
        self._squares += np.einsum("ij,ij->j", z, z)
        self._abs += np.abs(z).sum(axis=0)
        if self._cells.shape[0]:
            _add_signed_sums(seeds, z, self._cells, self._sums)
        self._n += len(seeds)

    def merge(self, other: BucketSumAccumulator) -> None:
        if other._params != self._params or not np.array_equal(other._cells, self._cells):
            raise ProtocolError("cannot merge vector sums of different mechanisms or buckets")
        self._sums += other._sums
        self._squares += other._squares
        self._abs += other._abs
        self._n += other._n

    def finalize(self) -> BucketSums:
        m, d = self._sums.shape
        return BucketSums(buckets=self._cells.copy(), sums=self._sums.copy(),
                          variances=np.broadcast_to(self._squares, (m, d)).copy(),
                          variance_bound=self._n * self._params.report_second_moment, reports=self._n)

    @property
    def nbytes(self) -> int:
        return int(self._sums.nbytes + self._squares.nbytes + self._abs.nbytes + self._cells.nbytes) + 8


def _signed_columns(reports: Sequence[StoredReport], params: BucketizedVectorParams, by_group: ComponentParams,
                    keys: Sequence[str]) -> list[tuple[NDArray[np.uint64], NDArray[Any]]] | None:
    """The seeds and inner rows (float32 for the l2 ball and PrivUnit, the packed sign bytes for the
    box) of the components ``keys`` of stored reports, key by key in report order (as
    :func:`decode_report_payloads` lists them), read from their msgpack form without building a
    payload object: None unless every report is in the common form (its group reports in the round,
    and a report of a group with one of ``keys`` decodes whole, each of ``keys`` being ``[6, seed,
    [5, 4 D bytes]]``, or ``[6, seed, ceil(D / 8) bytes]`` for the box, with a seed in [0, 2^32)), so
    that anything else takes the per-payload path and its errors. The reports of the other groups
    are not decoded: the pass that sums their components reads them (a round whose groups each sum
    their own buckets, as stemmer's, is read once per group, not once per group and report)."""
    if not keys:
        return None
    box = params.shape == VectorShape.BOX
    # Per group, the slot (position in keys) of each of its components; -1: not one of keys.
    wanted: dict[int, list[int]] = {group: [-1] * len(components) for group, components in by_group.items()}
    for slot, key in enumerate(keys):
        group, _, index = key.partition(":")
        if int(index) < len(wanted.get(int(group), ())):
            wanted[int(group)][int(index)] = slot
    width = (params.dimension + 7) // 8 if box else 4 * params.dimension
    seeds: list[list[int]] = [[] for _ in keys]
    raws: list[list[bytes]] = [[] for _ in keys]
    limit = 2**SEED_BITS
    reading = {group for group, slots in wanted.items() if max(slots, default=-1) >= 0}
    for report in reports:
        components = by_group.get(report.group)
        if components is None:
            return None
        if report.group not in reading:  # none of keys: the pass that sums its components reads it
            continue
        try:
            wire = msgpack.unpackb(report.payloads, raw=False, strict_map_key=True)
        except Exception:  # msgpack raises several unrelated types on garbage; the slow path names it
            return None
        if type(wire) is not list or len(wire) != len(components):
            return None
        for slot, item in zip(wanted[report.group], wire):
            if slot < 0:
                try:
                    payload_from_wire(item)
                except ProtocolError:
                    return None
                continue
            if not (type(item) is list and len(item) == 3 and item[0] == _SIGNED_VECTOR_TAG and type(item[1]) is int
                    and 0 <= item[1] < limit):
                return None
            inner = item[2]
            if box:
                if type(inner) is not bytes or len(inner) != width:
                    return None
            elif (type(inner) is list and len(inner) == 2 and inner[0] == _FLOATS_TAG and type(inner[1]) is bytes
                    and len(inner[1]) == width):
                inner = inner[1]
            else:
                return None
            seeds[slot].append(item[1])
            raws[slot].append(inner)
    if box:
        return [(np.array(s, dtype=np.uint64), np.frombuffer(b"".join(r), dtype=np.uint8).reshape(len(s), width))
                for s, r in zip(seeds, raws)]
    return [(np.array(s, dtype=np.uint64),
             np.frombuffer(b"".join(r), dtype="<f4").reshape(len(s), params.dimension)) for s, r in zip(seeds, raws)]


#: The wire tags of a signed vector and of its float inner payload (:func:`~ldp_client.payload.payload_to_wire`).
_SIGNED_VECTOR_TAG = payload_to_wire(SignedVector(0, b""))[0]
_FLOATS_TAG = payload_to_wire(Floats((0.0,)))[0]


def _add_signed_sums(seeds: NDArray[np.uint64], z: NDArray[np.float64], cells: NDArray[np.uint64],
                     sums: NDArray[np.float64]) -> None:
    """Add ``sum_i sigma_{s_i}(c) z_i`` to ``sums[k]`` for every bucket ``c = cells[k]``, block by block."""
    m = cells.shape[0]
    rows = max(1, min(max(_MIN_BLOCK_ROWS, _BLOCK_PAIRS // m), _MAX_BLOCK_PAIRS // m))
    columns = cells[None, :]
    for r0 in range(0, seeds.shape[0], rows):
        # H(s, c, 2) in {0, 1}; sigma = 1 - 2 H is the float64 1.0 with H as its sign bit (exact).
        h = hash_values(seeds[r0:r0 + rows, None], columns, 2)
        h <<= _SIGN_SHIFT
        h |= _ONE_BITS
        sums += h.view(np.float64).T @ z[r0:r0 + rows]


def analytic_variance(params: BucketizedVectorParams, reports: int) -> float:
    """``n M``: the bound on the variance of every coordinate of a bucket's estimated sum (also
    :attr:`BucketSums.variance_bound`); its square root is the worst-case standard error."""
    return float(reports) * _check_params(params).report_second_moment



#: A Lloyd-round center moves only when its estimated count exceeds this many standard errors.
LLOYD_MIN_COUNT_Z = 3.0


@dataclass(frozen=True)
class LloydMove:
    """One Lloyd step from per-center bucket sums (:func:`lloyd_move`), in the sums' units."""

    centers: NDArray[np.float64]
    #: Per-coordinate noise variance of each moved center's plain mean (``variance / count^2``), a bound on
    #: the shrunk step's error; ``inf`` where it stayed.
    variances: NDArray[np.float64]
    moved: NDArray[np.bool_]
    #: The share of its step each center took (the James-Stein factor; 0 where it did not move).
    shrink: NDArray[np.float64]


def lloyd_move(previous: ArrayLike, sums: ArrayLike, variance: float, *, moment_ratio: float = 1.0,
               min_count_z: float = LLOYD_MIN_COUNT_Z) -> LloydMove:
    """Move each center toward the mean of the devices that chose it, from ``(m, d + 1)`` bucket sums of ``(v, 1)``.

    ``sums[:, d]`` is each center's estimated count, ``variance`` the per-coordinate variance of a
    bucket sum (:attr:`BucketSums.variance_bound`); a center whose count does not exceed
    ``min_count_z`` standard errors keeps its place (its mean would be mostly noise).

    The step from the previous center to that mean carries the noise of the mean, ``s^2 =
    moment_ratio x variance / count^2`` per coordinate on average (``moment_ratio``: the reports' mean
    second moment over the bound's, :attr:`~ldp_client.mechanisms.bucketized_vector.BucketizedVectorParams.
    report_mean_second_moment` / ``report_second_moment``). The center takes the share
    ``max(0, 1 - (d - 2) s^2 / |step|^2)`` of its step (positive-part James-Stein toward the previous
    center): a step no longer than its noise is mostly noise and is mostly not taken, a step far
    longer (a center far from its devices) is taken nearly whole. For d >= 3 and Gaussian noise this
    errs less in expectation than the plain mean, whatever the true mean (James and Stein 1961); at
    d <= 2 the step is the plain mean.
    """
    prev = np.asarray(previous, dtype=np.float64)
    s = np.asarray(sums, dtype=np.float64)
    d = prev.shape[1]
    if s.shape != (prev.shape[0], d + 1):
        raise InvalidParameterError(f"need ({prev.shape[0]}, {d + 1}) sums for {prev.shape[0]} centers, got {s.shape}")
    counts = s[:, d]
    moved = counts > min_count_z * np.sqrt(max(variance, 0.0))
    safe = np.where(moved, counts, 1.0)
    step = np.where(moved[:, None], s[:, :d] / safe[:, None] - prev, 0.0)
    variances = np.where(moved, max(variance, 0.0) / safe**2, np.inf)
    shrink = np.where(moved, james_stein_shares(step, moment_ratio * np.where(moved, variances, 0.0)), 0.0)
    centers = prev + shrink[:, None] * step
    return LloydMove(centers=centers, variances=variances, moved=moved, shrink=shrink)


def james_stein_shares(steps: ArrayLike, variances: ArrayLike) -> NDArray[np.float64]:
    """The positive-part James-Stein share ``max(0, 1 - (d - 2) s^2 / |step|^2)`` of each ``(m, d)`` step
    whose every coordinate carries independent noise of variance ``s^2`` (``variances``, one per step);
    1 for every step at ``d <= 2``, where the plain estimate is admissible, and for a step of no noise.

    Each estimate moves that share of the way from its anchor to its noisy target: for ``d >= 3`` and
    Gaussian noise this errs less in expectation than the whole step, whatever the truth (James and
    Stein 1961)."""
    step = np.asarray(steps, dtype=np.float64)
    var = np.asarray(variances, dtype=np.float64)
    noise2 = max(step.shape[1] - 2, 0) * var
    length2 = (step**2).sum(axis=1)
    ratio = np.divide(noise2, length2, out=np.where(noise2 > 0, np.inf, 0.0), where=length2 > 0)
    out: NDArray[np.float64] = np.clip(1.0 - ratio, 0.0, 1.0)
    return out


def shrink_toward_centroid(points: ArrayLike, variances: ArrayLike, shares: ArrayLike) -> NDArray[np.float64]:
    """Noisy estimates of ``m`` means, each pulled toward their ``shares``-weighted centroid by its own noise.

    ``points`` are ``(m, d)`` estimates whose coordinates carry independent noise of variance
    ``variances[i]`` (per coordinate, one per point); each keeps the :func:`james_stein_shares` share of
    its offset from the centroid. A point whose offset is within its noise lands near the centroid, one
    far beyond it stays put; with no noise, one point or ``d <= 2`` nothing moves.

    Raises
    ------
    ValueError
        Not one variance and one share per point.
    """
    x = np.asarray(points, dtype=np.float64)
    var = np.asarray(variances, dtype=np.float64)
    w = np.asarray(shares, dtype=np.float64)
    if x.ndim != 2 or var.shape != (x.shape[0],) or w.shape != (x.shape[0],):
        raise ValueError(f"need one variance and one share per point: points {x.shape}, variances {var.shape}, "
                         f"shares {w.shape}")
    if x.shape[0] < 2 or w.sum() <= 0:
        return x.copy()
    centroid = (w[:, None] * x).sum(axis=0) / w.sum()
    out: NDArray[np.float64] = centroid + james_stein_shares(x - centroid, var)[:, None] * (x - centroid)
    return out
