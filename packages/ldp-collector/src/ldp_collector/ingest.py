"""Report validation before anything is stored (DESIGN.md §5, *Ingestion*).

Every report of a batch is checked against the open round of its campaign: the campaign exists
and is collecting, the report targets the open round, its group reports in that round, it carries
one payload per component of the group's task, and every payload is a possible output of its
mechanism (shape and range, via ``MechanismParams.check_payload``) and a *plausible* one
(:func:`check_plausible`). Valid reports become :class:`~ldp_collector.storage.base.StoredReport`
rows (payloads as msgpack); the others get a REJECTED outcome with a :class:`Rejection`: the
reason in words (no language-specific notation) carrying its
:class:`~ldp_client.errors.RejectionCode` (``docs/errors.md``, section 4). Nothing here
touches the store: :class:`~ldp_collector.core.Collector` stores the valid part and merges the
store's outcomes back in request order with :meth:`ValidatedBatch.merge`.

Enrolled devices
----------------
A batch sent with an enrolled device token is validated with ``assign`` (``(campaign_id, round) ->
RoundAssignment`` of that device): on top of the checks above, each report must carry exactly its
assigned report id and hash seeds (:func:`ldp_collector.defences.check_assignment`), else it is
rejected and stores nothing. Such batches are small (one report per round) and take the
per-report path.

Batch-wide fast path
--------------------
A batch decoded column by column (:class:`~ldp_client.report.ReportColumns`, what the service
decodes) is validated column by column too: the reports of the open round whose group's every
component has a batch check -- GRR, unary encoding, local hashing, bitwise RR, the box, l2-ball and
PrivUnit randomizers, discrete Laplace, the bucketized vector sum over any of the three -- are checked
together (one C-level pass per check; numpy for the bit and float payloads: a unit direction's norm
is accepted batch-wide only when clearly inside the tolerance, the edge decided per report) and
their stored rows come out as a
:class:`StoredReportColumns`, which carries the decoded payloads on to the accumulators. Every other
report -- and every report that fails a batch check -- goes through :func:`validate_report`, so the
outcomes, reasons and stored bytes are those of the per-report path by construction; the batch
checks only decide which reports may skip it, and accept exactly what :func:`validate_report`
accepts.

Plausibility of unary-encoding reports
--------------------------------------
An honest unary-encoding report over D values has W = B + X ones, with B the (0/1) true bit and
X ~ Binomial(D - 1, q) the other bits. A report with far more (or far fewer) ones than that is
not a possible *typical* output and would let one device move every count at once, so it is
rejected. With n = D - 1 and KL the binary Kullback-Leibler divergence, the Chernoff bounds
P[X >= k] <= exp(-n KL(k/n || q)) (k >= nq) and P[X <= k] <= exp(-n KL(k/n || q)) (k <= nq) give
the limits

* ``upper``: the smallest k > nq with exp(-n KL(k/n || q)) <= delta; reject when W >= upper + 1;
* ``lower``: the largest k < nq with exp(-n KL(k/n || q)) <= delta; reject when W <= lower;

so an honest report is falsely rejected with probability at most 2 delta = 2^-39 ~ 1.8e-12 (one in
500 billion), whatever D and q. In the Gaussian regime the upper limit is about
qD + 7.4 sqrt(D q (1 - q)) + 1, slightly tighter than the rule of thumb qD + 10 sqrt(Dq(1-q)) + 1;
for tiny qD (large epsilon) it stays correct where that rule would reject honest reports.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast, overload

import msgpack
import numpy as np

from ldp_client.device import RoundAssignment
from ldp_client.errors import ProtocolError, RejectionCode
from ldp_client.mechanisms.base import MechanismParams
from ldp_client.mechanisms.bitwise_randomized_response import BitwiseRRParams
from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams
from ldp_client.mechanisms.discrete_laplace import DiscreteLaplaceParams
from ldp_client.mechanisms.local_hashing import SEED_BITS, LocalHashingParams
from ldp_client.mechanisms.randomized_response import GRRParams
from ldp_client.mechanisms.unary_encoding import UnaryEncodingParams
from ldp_client.mechanisms.vector_box import VectorBoxParams
from ldp_client.mechanisms.vector_l2_ball import PAYLOAD_NORM_TOLERANCE, VectorL2BallParams
from ldp_client.mechanisms.vector_privunit import VectorPrivUnitParams
from ldp_client.payload import Floats, HashedValue, Integers, Payload, SignedVector, payload_to_wire
from ldp_client.report import MAX_BATCH_REPORTS, MAX_REQUEST_ID, Report, ReportColumns
from ldp_client.spec import RoundSpec

from .defences import check_assignment
from .errors import ErrorReason, InvalidArgumentError
from .storage.base import Outcome, StoredReport

__all__ = [
    "PLAUSIBILITY_DELTA",
    "Rejection",
    "ReportRejectedError",
    "RoundContext",
    "StoredReportColumns",
    "ValidatedBatch",
    "check_plausible",
    "check_request_id",
    "hamming_weight_limits",
    "pack_payloads",
    "validate_batch",
    "validate_report",
]

#: One-sided false-rejection bound of the plausibility checks (2^-40 ~ 9.1e-13 per tail).
PLAUSIBILITY_DELTA = 2.0**-40


@dataclass(frozen=True, kw_only=True)
class RoundContext:
    """The open round of a collecting campaign, as ingestion sees it."""

    campaign_id: str
    round: int
    spec: RoundSpec


class Rejection(str):
    """Why one report is rejected: the message for people (``ReportOutcome.reason``), carrying the
    code programs read (``code``, ``ReportOutcome.code``).

    A ``str`` so that everything that passes reasons on (outcome tuples, logs) keeps doing so; the
    response encoder reads the code (:func:`ldp_collector.server.wire.submit_response`).
    """

    code: RejectionCode

    def __new__(cls, code: RejectionCode, message: str) -> Rejection:
        self = super().__new__(cls, message)
        self.code = code
        return self

    @classmethod
    def of(cls, error: ProtocolError) -> Rejection:
        """The rejection of a report that failed with ``error``: its own code when it is a
        :class:`ReportRejectedError`, else ``MALFORMED_REPORT`` (the report did not decode)."""
        code = error.code if isinstance(error, ReportRejectedError) else RejectionCode.MALFORMED_REPORT
        return cls(code, str(error) or "malformed report")


class ReportRejectedError(ProtocolError):
    """A decoded report that does not fit the open round; ``code`` says which rule it broke."""

    def __init__(self, code: RejectionCode, message: str) -> None:
        super().__init__(message)
        self.code = code


#: Looks a campaign up: its open round, or the rejection of its reports
#: (``UNKNOWN_CAMPAIGN``, ``CAMPAIGN_NOT_COLLECTING``, ``ROUND_NOT_OPEN`` between two rounds).
Lookup = Callable[[str], "RoundContext | Rejection"]
#: The assignment of the sending device in a round: ``(campaign_id, round) -> RoundAssignment``.
Assign = Callable[[str, int], RoundAssignment]


def check_request_id(request_id: object) -> str:
    """Return ``request_id`` if it is a string of 1 to 128 characters, else raise ``InvalidArgumentError``."""
    if not isinstance(request_id, str) or not 1 <= len(request_id) <= MAX_REQUEST_ID:
        got = f"{len(request_id)} characters" if isinstance(request_id, str) else "no string"
        raise InvalidArgumentError(
            f"request_id must be a string of 1 to {MAX_REQUEST_ID} characters, got {got}", field="request_id")
    return request_id


def _kl(a: float, q: float) -> float:
    """Binary Kullback-Leibler divergence KL(a || q) for 0 <= a <= 1, 0 < q < 1."""
    out = 0.0
    if a > 0.0:
        out += a * math.log(a / q)
    if a < 1.0:
        out += (1.0 - a) * math.log((1.0 - a) / (1.0 - q))
    return out


@functools.lru_cache(maxsize=1024)
def hamming_weight_limits(domain_size: int, q: float, delta: float = PLAUSIBILITY_DELTA) -> tuple[int, int]:
    """Smallest and largest plausible number of ones in an honest unary-encoding report.

    Parameters
    ----------
    domain_size : int
        D, the report length in bits (>= 2).
    q : float
        Probability that a bit other than the true value's is 1, in (0, 1).
    delta : float
        Chernoff bound of each tail (module docstring).

    Returns
    -------
    (int, int)
        ``(low, high)``: a report is plausible when ``low <= W <= high``. Each tail rejects an
        honest report with probability at most ``delta``.
    """
    n = domain_size - 1
    log_delta = math.log(delta)
    mean = n * q

    def bound_ok(k: int) -> bool:
        return -n * _kl(k / n, q) <= log_delta

    # Upper tail: the smallest k > mean whose bound is <= delta (monotone in k); n + 1 if none.
    lo, hi = math.floor(mean) + 1, n + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if bound_ok(mid):
            hi = mid
        else:
            lo = mid + 1
    upper = lo  # X >= upper is rejected; W = X + B
    # Lower tail: the largest k < mean whose bound is <= delta; -1 if none.
    lo, hi = -1, math.ceil(mean) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if mid >= 0 and bound_ok(mid):
            lo = mid
        else:
            hi = mid - 1
    lower = lo  # X <= lower is rejected (W <= lower implies X <= lower)
    return lower + 1, min(upper, domain_size)


def check_plausible(mechanism: MechanismParams, payload: Payload) -> None:
    """Raise ``ProtocolError`` when a range-checked payload is implausible for an honest device.

    Only unary encodings have a check today: their Hamming weight must lie within
    :func:`hamming_weight_limits` (false rejection < 1.9e-12 per honest report).
    """
    if isinstance(mechanism, UnaryEncodingParams) and isinstance(payload, bytes):
        weight = int.from_bytes(payload, "little").bit_count()
        low, high = hamming_weight_limits(mechanism.domain_size, mechanism.q)
        if not low <= weight <= high:
            raise ReportRejectedError(
                RejectionCode.IMPLAUSIBLE_PAYLOAD,
                f"unary_encoding payload has {weight} bits set; an honest report over {mechanism.domain_size} "
                f"values has {low} to {high}")


def pack_payloads(payloads: Sequence[Payload]) -> bytes:
    """The stored form of a report's payloads: msgpack of ``[payload_to_wire(p), ...]``."""
    return msgpack.packb([payload_to_wire(p) for p in payloads], use_bin_type=True)  # type: ignore[no-any-return]


def validate_report(report: Report, context: RoundContext) -> StoredReport:
    """Check one report against the open round of its campaign and build its stored row.

    Raises
    ------
    ReportRejectedError
        With the code and reason the report is rejected.
    """
    spec = context.spec
    if report.round != context.round:
        raise ReportRejectedError(RejectionCode.ROUND_NOT_OPEN,
                                  f"round {report.round} is not open (the open round is {context.round})")
    if report.group >= len(spec.group_weights):
        raise ReportRejectedError(
            RejectionCode.UNKNOWN_GROUP,
            f"group {report.group} is not a group of campaign {context.campaign_id} "
            f"({len(spec.group_weights)} groups)")
    task = spec.task_for(report.group)
    if task is None:
        raise ReportRejectedError(RejectionCode.GROUP_NOT_REPORTING,
                                  f"group {report.group} does not report in round {context.round}")
    if len(report.payloads) != len(task.components):
        raise ReportRejectedError(
            RejectionCode.WRONG_PAYLOAD_COUNT,
            f"group {report.group} reports {len(task.components)} payload(s) in round {context.round}, "
            f"got {len(report.payloads)}")
    for i, (component, payload) in enumerate(zip(task.components, report.payloads)):
        try:
            component.mechanism.check_payload(payload)
            check_plausible(component.mechanism, payload)
        except ReportRejectedError as exc:
            raise ReportRejectedError(exc.code, f"payload {i}: {exc}") from None
        except ProtocolError as exc:
            raise ReportRejectedError(RejectionCode.INVALID_PAYLOAD, f"payload {i}: {exc}") from None
    return StoredReport(report_id=report.report_id, campaign_id=report.campaign_id, round=report.round,
                        group=report.group, payloads=pack_payloads(report.payloads))


@dataclass(frozen=True, kw_only=True, eq=False)
class StoredReportColumns(Sequence[StoredReport]):
    """Validated reports ready for the store, column by column (what the fast path produces).

    Position ``i`` stands for ``StoredReport(report_id=report_ids[i], campaign_id=campaign_ids[i],
    round=rounds[i], group=groups[i], payloads=payloads[i])``; indexing builds it, so this is a
    drop-in ``Sequence[StoredReport]`` for any :class:`~ldp_collector.storage.base.ReportStore`.
    The SQLite store reads the columns instead, and the accumulators read ``decoded_payloads``
    (position ``i``: the payloads ``payloads[i]`` encodes) instead of decoding the msgpack again.
    """

    report_ids: Sequence[bytes]
    campaign_ids: Sequence[str]
    rounds: Sequence[int]
    groups: Sequence[int]
    #: The stored form, :func:`pack_payloads` of each report's payloads.
    payloads: Sequence[bytes]
    decoded_payloads: Sequence[Sequence[Payload]]

    def __post_init__(self) -> None:
        lengths = {len(c) for c in (self.report_ids, self.campaign_ids, self.rounds, self.groups, self.payloads,
                                    self.decoded_payloads)}
        if len(lengths) > 1:
            raise ValueError(f"stored report columns must all have the same length, got {sorted(lengths)}")

    def __len__(self) -> int:
        return len(self.report_ids)

    @overload
    def __getitem__(self, index: int) -> StoredReport: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[StoredReport]: ...

    def __getitem__(self, index: int | slice) -> StoredReport | Sequence[StoredReport]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = operator.index(index)
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"report index {index} out of range for {n} reports")
        return StoredReport(report_id=self.report_ids[i], campaign_id=self.campaign_ids[i], round=self.rounds[i],
                            group=self.groups[i], payloads=self.payloads[i])

    def take(self, indexes: Sequence[int]) -> StoredReportColumns:
        """The reports at ``indexes``, in that order."""
        return StoredReportColumns(
            report_ids=[self.report_ids[i] for i in indexes], campaign_ids=[self.campaign_ids[i] for i in indexes],
            rounds=[self.rounds[i] for i in indexes], groups=[self.groups[i] for i in indexes],
            payloads=[self.payloads[i] for i in indexes],
            decoded_payloads=[self.decoded_payloads[i] for i in indexes])


@dataclass(frozen=True, kw_only=True)
class ValidatedBatch:
    """A batch after validation.

    Attributes
    ----------
    rejected : dict of int to Rejection
        Request position -> rejection, for the reports rejected before storage.
    valid : sequence of StoredReport
        The reports to store, in request order (a :class:`StoredReportColumns` from the fast path).
    positions : sequence of int
        The request position of each entry of ``valid``.
    """

    rejected: dict[int, Rejection]
    valid: Sequence[StoredReport]
    positions: Sequence[int]

    @property
    def size(self) -> int:
        return len(self.rejected) + len(self.valid)

    def merge(self, stored: Sequence[Outcome]) -> list[tuple[Outcome, str]]:
        """Outcomes of the whole batch in request order, given the store's outcomes of ``valid``."""
        if len(stored) != len(self.valid):
            raise RuntimeError(f"the store answered {len(stored)} outcomes for {len(self.valid)} reports")
        merged: list[tuple[Outcome, str] | None] = list(map(_STORED_OUTCOMES.get, stored))
        for k in [k for k, pair in enumerate(merged) if pair is None] if None in merged else ():
            # The store rejects a report whose round closed between validation and commit.
            outcome = Outcome(stored[k])
            merged[k] = (outcome, Rejection(RejectionCode.ROUND_NOT_OPEN,
                                            f"round {self.valid[k].round} closed before the report was stored")
                         if outcome == Outcome.REJECTED else "")
        if len(merged) == self.size:  # nothing rejected before storage: positions are 0 .. size - 1
            return merged  # type: ignore[return-value]  # every None was replaced above
        out: list[tuple[Outcome, str]] = [(Outcome.REJECTED, "")] * self.size
        for position, reason in self.rejected.items():
            out[position] = (Outcome.REJECTED, reason)
        for position, pair in zip(self.positions, merged):
            out[position] = pair  # type: ignore[assignment]  # every None was replaced above
        return out


#: The merged outcome of each stored outcome that needs no reason.
_STORED_OUTCOMES: dict[int, tuple[Outcome, str]] = {
    Outcome.ACCEPTED: (Outcome.ACCEPTED, ""), Outcome.DUPLICATE: (Outcome.DUPLICATE, "")}


def validate_batch(reports: Sequence[Report | ProtocolError], lookup: Lookup, *,
                   assign: Assign | None = None) -> ValidatedBatch:
    """Validate every report of a batch; ``lookup`` is called once per distinct campaign id.

    Entries that are already a :class:`ProtocolError` (a malformed report in a packed batch) are
    rejected with their message (``MALFORMED_REPORT``). A :class:`~ldp_client.report.ReportColumns` batch takes the
    batch-wide fast path (module docstring), with the same result. With ``assign`` (the batch of
    an enrolled device) every report must also carry its assigned report id and hash seeds.

    Raises
    ------
    InvalidArgumentError
        If the batch holds more than ``ldp_client.report.MAX_BATCH_REPORTS`` reports.
    """
    if len(reports) > MAX_BATCH_REPORTS:
        raise InvalidArgumentError(f"a batch holds at most {MAX_BATCH_REPORTS} reports, got {len(reports)}",
                                   field="reports", reason=ErrorReason.BATCH_TOO_LARGE)
    if isinstance(reports, ReportColumns) and assign is None:
        return _validate_columns(reports, lookup)
    contexts: dict[str, RoundContext | Rejection] = {}
    rejected: dict[int, Rejection] = {}
    valid: list[StoredReport] = []
    positions: list[int] = []
    for position, report in enumerate(reports):
        if isinstance(report, ProtocolError):
            rejected[position] = Rejection.of(report)
            continue
        context = contexts.get(report.campaign_id)
        if context is None:
            context = contexts[report.campaign_id] = lookup(report.campaign_id)
        if isinstance(context, str):
            rejected[position] = context
            continue
        try:
            row = validate_report(report, context)
        except ProtocolError as exc:
            rejected[position] = Rejection.of(exc)
            continue
        if assign is not None:
            try:
                check_assignment(report, context.spec, assign(context.campaign_id, context.round))
            except ProtocolError as exc:
                rejected[position] = Rejection(RejectionCode.ASSIGNMENT_MISMATCH, str(exc))
                continue
        valid.append(row)
        positions.append(position)
    return ValidatedBatch(rejected=rejected, valid=valid, positions=positions)


# -- the batch-wide fast path ---------------------------------------------------------------------

#: Number of set bits of every byte value.
_POPCOUNT = np.array([bin(b).count("1") for b in range(256)], dtype=np.uint8)
#: GRR domains up to this size keep a table of their stored payloads (one ``bytes`` per index).
_MAX_INDEX_TABLE = 1 << 16


@functools.lru_cache(maxsize=8)
def _stored_indexes(domain_size: int) -> list[bytes]:
    """``pack_payloads((i,))`` for every index of a GRR domain (the stored form of one-index reports)."""
    return [pack_payloads((i,)) for i in range(domain_size)]


@dataclass(frozen=True)
class _IndexCheck:
    """GRR's ``check_payload`` for a whole batch of one-index reports."""

    domain_size: int

    def failing(self, values: Sequence[Any]) -> list[int]:
        """Indexes (into ``values``) of the payloads ``GRRParams.check_payload`` would refuse."""
        size = self.domain_size
        if set(map(type, values)) == {int} and min(values) >= 0 and max(values) < size:
            return []
        return [k for k, v in enumerate(values) if type(v) is not int or not 0 <= v < size]

    def stored(self, values: Sequence[int]) -> list[bytes]:
        """The stored payloads of checked values: ``pack_payloads((v,))`` each."""
        if self.domain_size <= _MAX_INDEX_TABLE:
            return list(map(_stored_indexes(self.domain_size).__getitem__, values))
        return [pack_payloads((v,)) for v in values]


@dataclass(frozen=True)
class _BitsCheck:
    """``check_payload`` (and, for unary encoding, :func:`check_plausible`) of a bits mechanism
    for a whole batch of one-payload reports."""

    payload_bytes: int
    #: Bits used in the last byte (0: all 8); the others must be 0.
    used_bits: int
    #: Plausible Hamming weights ``(low, high)`` (unary encoding), or None.
    weights: tuple[int, int] | None

    def failing(self, values: Sequence[Any]) -> list[int]:
        """Indexes (into ``values``) of the payloads the mechanism's checks would refuse."""
        width = self.payload_bytes
        if set(map(type, values)) == {bytes} and set(map(len, values)) == {width}:
            rows: Sequence[int] = range(len(values))
            failing: list[int] = []
        else:
            rows = [k for k, v in enumerate(values) if type(v) is bytes and len(v) == width]
            failing = sorted(set(range(len(values))).difference(rows))
        if not rows:
            return failing
        bits = np.frombuffer(b"".join([values[k] for k in rows]), dtype=np.uint8).reshape(len(rows), width)
        bad = np.zeros(len(rows), dtype=bool)
        if self.used_bits:
            bad |= (bits[:, -1] >> self.used_bits) != 0
        if self.weights is not None:
            weight = _POPCOUNT[bits].sum(axis=1, dtype=np.int64)
            bad |= (weight < self.weights[0]) | (weight > self.weights[1])
        if bad.any():
            failing = sorted(failing + [rows[int(k)] for k in np.flatnonzero(bad)])
        return failing

    def stored(self, values: Sequence[bytes]) -> list[bytes]:
        """The stored payloads of checked values: ``pack_payloads((v,))`` each."""
        width = self.payload_bytes
        prefix = pack_payloads((bytes(width),))[:-width]  # msgpack's array and bin headers
        return [prefix + v for v in values]


@dataclass(frozen=True)
class _IntegersCheck:
    """``DiscreteLaplaceParams.check_payload`` for a whole batch."""

    dimension: int

    def failing(self, values: Sequence[Any]) -> list[int]:
        """Indexes (into ``values``) of the payloads it might refuse: anything but exactly
        :class:`Integers` of ``dimension`` exact ints (the per-report path decides those)."""
        width = self.dimension
        if (set(map(type, values)) == {Integers} and set(type(v.values) for v in values) == {tuple}
                and set(map(len, (v.values for v in values))) == {width}
                and set(map(type, itertools.chain.from_iterable(v.values for v in values))) <= {int}):
            return []
        return [k for k, v in enumerate(values) if type(v) is not Integers or type(v.values) is not tuple
                or len(v.values) != width or set(map(type, v.values)) - {int}]

    def stored(self, values: Sequence[Integers]) -> list[bytes]:
        """The stored payloads of checked values: ``pack_payloads((v,))`` each, packed from their wire
        form ``[tag, values]`` directly."""
        tag = _wire_tag(Integers((0,)))
        packb = msgpack.Packer(use_bin_type=True).pack
        return [packb([[tag, v.values]]) for v in values]


#: How far inside :data:`~ldp_client.mechanisms.vector_l2_ball.PAYLOAD_NORM_TOLERANCE` a norm computed
#: here must be for the batch check to accept it: numpy's sum of squares and ``math.hypot`` differ by
#: far less (under 1e-12 for the dimensions allowed), so a payload near the limit is decided by the
#: per-report check, and the batch never accepts what it would refuse. An honest report's norm is
#: within about 1e-7 of 1 (float32 rounding).
_NORM_MARGIN = 1e-9


@dataclass(frozen=True)
class _UnitFloatsCheck:
    """:func:`~ldp_client.mechanisms.vector_l2_ball.check_unit_payload` (the l2-ball and PrivUnit
    randomizers) for a whole batch."""

    dimension: int

    def failing(self, values: Sequence[Any]) -> list[int]:
        """Indexes (into ``values``) of the payloads it might refuse: anything but exactly :class:`Floats`
        holding a tuple of ``dimension`` exact finite floats whose norm is clearly within the tolerance."""
        width = self.dimension
        shaped = [k for k, v in enumerate(values) if type(v) is Floats and type(v.values) is tuple
                  and len(v.values) == width]
        failing = sorted(set(range(len(values))).difference(shaped)) if len(shaped) != len(values) else []
        if not shaped:
            return failing
        flat = list(itertools.chain.from_iterable(values[k].values for k in shaped))
        if set(map(type, flat)) != {float}:  # a bool, an int, a float subclass: the per-report check decides
            odd = {k for k in shaped if set(map(type, values[k].values)) != {float}}
            failing = sorted(failing + list(odd))
            shaped = [k for k in shaped if k not in odd]
            flat = list(itertools.chain.from_iterable(values[k].values for k in shaped))
        w = np.array(flat, dtype=np.float64).reshape(len(shaped), width)
        with np.errstate(over="ignore", invalid="ignore"):
            norm = np.sqrt(np.einsum("ij,ij->i", w, w))
            bad = ~np.isfinite(w).all(axis=1) | ~(np.abs(norm - 1.0) <= PAYLOAD_NORM_TOLERANCE - _NORM_MARGIN)
        if bad.any():
            failing = sorted(failing + [shaped[int(k)] for k in np.flatnonzero(bad)])
        return failing

    def wire(self, values: Sequence[Floats]) -> list[list[Any]]:
        """The wire forms ``[tag, float32 bytes]`` of checked values (:func:`payload_to_wire`), the
        float32 rounding done once for the batch (IEEE round-to-nearest-even, as ``struct.pack``)."""
        if not values:
            return []
        tag = _wire_tag(Floats((0.0,)))
        raw = np.array([v.values for v in values], dtype=np.float64).astype("<f4").tobytes()
        step = 4 * self.dimension
        return [[tag, raw[i:i + step]] for i in range(0, len(raw), step)]

    def stored(self, values: Sequence[Floats]) -> list[bytes]:
        """The stored payloads of checked values: ``pack_payloads((v,))`` each."""
        packb = msgpack.Packer(use_bin_type=True).pack
        return [packb([item]) for item in self.wire(values)]


@dataclass(frozen=True)
class _HashedCheck:
    """``LocalHashingParams.check_payload`` for a whole batch of ``(seed, bucket)`` reports."""

    g: int
    #: The round's public seed pool, or None (any 32-bit seed).
    pool: frozenset[int] | None

    def failing(self, values: Sequence[Any]) -> list[int]:
        """Indexes (into ``values``) of the payloads ``check_payload`` would refuse (or that are of a
        subclass, which the per-report path decides)."""
        limit, g, pool = 1 << SEED_BITS, self.g, self.pool
        return [k for k, v in enumerate(values)
                if type(v) is not HashedValue or type(v.seed) is not int or type(v.value) is not int
                or not 0 <= v.seed < limit or not 0 <= v.value < g or (pool is not None and v.seed not in pool)]

    def stored(self, values: Sequence[HashedValue]) -> list[bytes]:
        """The stored payloads of checked values: ``pack_payloads((v,))`` each, from their wire form
        ``[tag, seed, bucket]``."""
        tag = _wire_tag(HashedValue(0, 0))
        packb = msgpack.Packer(use_bin_type=True).pack
        return [packb([[tag, v.seed, v.value]]) for v in values]


@dataclass(frozen=True)
class _SignedVectorCheck:
    """``BucketizedVectorParams.check_payload`` over a box, l2-ball or PrivUnit inner mechanism, for a
    whole batch."""

    inner: _BitsCheck | _UnitFloatsCheck

    def failing(self, values: Sequence[Any]) -> list[int]:
        """Indexes (into ``values``) of the payloads it might refuse: anything but exactly a
        :class:`SignedVector` with an exact int seed in range and an inner payload the inner check accepts."""
        limit = 1 << SEED_BITS
        bad = [k for k, v in enumerate(values)
               if type(v) is not SignedVector or type(v.seed) is not int or not 0 <= v.seed < limit]
        refused = set(bad)
        rows = [k for k in range(len(values)) if k not in refused] if bad else range(len(values))
        inner_bad = self.inner.failing([values[k].inner for k in rows])
        return sorted(bad + [rows[k] for k in inner_bad])

    def stored(self, values: Sequence[SignedVector]) -> list[bytes]:
        """The stored payloads of checked values: ``pack_payloads((v,))`` each, packed from their wire
        form ``[tag, seed, inner]`` directly (``inner``: the bits, or the floats' ``[tag, float32 bytes]``)."""
        tag = _wire_tag(SignedVector(0, b""))
        packb = msgpack.Packer(use_bin_type=True).pack
        if isinstance(self.inner, _UnitFloatsCheck):
            inners = self.inner.wire([cast(Floats, v.inner) for v in values])  # checked: Floats
            return [packb([[tag, v.seed, inner]]) for v, inner in zip(values, inners)]
        return [packb([[tag, v.seed, v.inner]]) for v in values]


def _wire_tag(payload: Payload) -> Any:
    """The tag of a tagged payload's wire form ``[tag, ...]`` (:func:`~ldp_client.payload.payload_to_wire`)."""
    return payload_to_wire(payload)[0]


_PayloadCheck = _IndexCheck | _BitsCheck | _HashedCheck | _IntegersCheck | _UnitFloatsCheck | _SignedVectorCheck
#: msgpack's fixarray header of a one-payload list, which :meth:`_TaskCheck.stored` replaces.
_ONE_PAYLOAD_HEADER = 0x91


@dataclass(frozen=True)
class _TaskCheck:
    """The batch check of a group task: one payload check per component, on reports with that many payloads."""

    checks: tuple[_PayloadCheck, ...]

    def failing(self, payloads: Sequence[Sequence[Any]]) -> list[int]:
        """Indexes (into ``payloads``, each holding one payload per component) of the reports a component refuses."""
        if len(self.checks) == 1:
            return self.checks[0].failing([p[0] for p in payloads])
        failing: set[int] = set()
        for c, check in enumerate(self.checks):
            failing.update(check.failing([p[c] for p in payloads]))
        return sorted(failing)

    def stored(self, payloads: Sequence[Sequence[Any]]) -> list[bytes]:
        """:func:`pack_payloads` of checked reports' payloads."""
        if len(self.checks) == 1:
            return self.checks[0].stored([p[0] for p in payloads])
        # msgpack of a list is its fixarray header (MAX_COMPONENTS < 16) and then its items packed
        # one after the other: each component's one-payload form without its own header.
        columns = [check.stored([p[c] for p in payloads]) for c, check in enumerate(self.checks)]
        assert all(row[0] == _ONE_PAYLOAD_HEADER for column in columns for row in column[:1])
        header = bytes([0x90 | len(self.checks)])
        return [header + b"".join(item[1:] for item in row) for row in zip(*columns)]


def _payload_check(mechanism: MechanismParams) -> _PayloadCheck | None:
    """The batch check equivalent to the mechanism's payload checks, for the mechanisms that have one."""
    kind = type(mechanism)  # exactly these classes: a subclass may check more
    if kind is GRRParams:
        assert isinstance(mechanism, GRRParams)
        return _IndexCheck(mechanism.domain_size)
    if kind is UnaryEncodingParams:
        assert isinstance(mechanism, UnaryEncodingParams)
        return _BitsCheck(mechanism.payload_bytes, mechanism.domain_size % 8,
                          hamming_weight_limits(mechanism.domain_size, mechanism.q))
    if kind is LocalHashingParams:
        assert isinstance(mechanism, LocalHashingParams)
        return _HashedCheck(mechanism.g, mechanism.pool_seed_set if mechanism.seed_pool_size else None)
    if kind is BitwiseRRParams:
        assert isinstance(mechanism, BitwiseRRParams)
        return _BitsCheck(mechanism.payload_bytes, mechanism.length % 8, None)
    if kind is VectorBoxParams:
        assert isinstance(mechanism, VectorBoxParams)
        return _BitsCheck((mechanism.dimension + 7) // 8, mechanism.dimension % 8, None)
    if kind is DiscreteLaplaceParams:
        assert isinstance(mechanism, DiscreteLaplaceParams)
        return _IntegersCheck(mechanism.dimension)
    if kind is VectorL2BallParams or kind is VectorPrivUnitParams:
        assert isinstance(mechanism, (VectorL2BallParams, VectorPrivUnitParams))
        return _UnitFloatsCheck(mechanism.dimension)
    if kind is BucketizedVectorParams:
        assert isinstance(mechanism, BucketizedVectorParams)
        inner = _payload_check(mechanism.inner)
        return _SignedVectorCheck(inner) if isinstance(inner, (_BitsCheck, _UnitFloatsCheck)) else None
    return None


def _group_check(spec: RoundSpec, group: int) -> _TaskCheck | None:
    """The batch check of a group's reports: every component with a batch check, else None."""
    if group >= len(spec.group_weights):
        return None
    task = spec.task_for(group)
    if task is None:
        return None
    checks = [_payload_check(c.mechanism) for c in task.components]
    present = tuple(check for check in checks if check is not None)
    return _TaskCheck(present) if len(present) == len(checks) else None


@dataclass
class _Accepted:
    """Reports that passed validation: request positions, stored payloads, decoded payloads."""

    positions: list[int]
    payloads: list[bytes]
    decoded: list[Sequence[Payload]]
    #: Whether ``positions`` is increasing (each ``add`` brings increasing positions).
    ordered: bool = True

    def add(self, positions: Sequence[int], payloads: Sequence[bytes], decoded: Sequence[Sequence[Payload]]) -> None:
        if self.positions and positions and positions[0] < self.positions[-1]:
            self.ordered = False
        self.positions.extend(positions)
        self.payloads.extend(payloads)
        self.decoded.extend(decoded)


def _validate_columns(columns: ReportColumns, lookup: Lookup) -> ValidatedBatch:
    """:func:`validate_batch` of a column batch, checking the common reports batch-wide."""
    rejected = {position: Rejection.of(error) for position, error in columns.errors.items()}
    parts: dict[str, list[int] | None]
    if not columns.errors and len(set(columns.campaign_ids)) == 1:
        parts = {columns.campaign_ids[0]: None}  # None: every position
    else:
        parts = {}
        for position, campaign_id in enumerate(columns.campaign_ids):
            if position not in columns.errors:
                positions = parts.setdefault(campaign_id, [])
                assert positions is not None
                positions.append(position)
    accepted = _Accepted([], [], [])
    for campaign_id, positions in parts.items():
        context = lookup(campaign_id)
        if isinstance(context, str):
            rejected.update(dict.fromkeys(range(len(columns)) if positions is None else positions, context))
        else:
            _validate_part(columns, positions, context, accepted, rejected)
    positions, payloads, decoded = accepted.positions, accepted.payloads, accepted.decoded
    if not accepted.ordered:  # several campaigns or checks: back to request order
        order = sorted(range(len(positions)), key=positions.__getitem__)
        positions = [positions[k] for k in order]
        payloads = [payloads[k] for k in order]
        decoded = [decoded[k] for k in order]
    report_ids, campaign_ids, rounds, groups = columns.report_ids, columns.campaign_ids, columns.rounds, columns.groups
    if len(positions) != len(columns):  # some reports rejected: keep the others' columns
        report_ids = [report_ids[i] for i in positions]
        campaign_ids = [campaign_ids[i] for i in positions]
        rounds = [rounds[i] for i in positions]
        groups = [groups[i] for i in positions]
    valid = StoredReportColumns(report_ids=report_ids, campaign_ids=campaign_ids, rounds=rounds, groups=groups,
                                payloads=payloads, decoded_payloads=decoded)
    return ValidatedBatch(rejected=rejected, valid=valid, positions=positions)


def _validate_part(columns: ReportColumns, positions: list[int] | None, context: RoundContext,
                   accepted: _Accepted, rejected: dict[int, Rejection]) -> None:
    """Validate the reports of one campaign (``positions``; None: all) against its open round."""
    every = range(len(columns)) if positions is None else positions

    def column(values: Sequence[Any]) -> Sequence[Any]:
        return values if positions is None else [values[i] for i in positions]

    rounds, groups, payloads = column(columns.rounds), column(columns.groups), column(columns.payloads)
    checks = {group: _group_check(context.spec, group) for group in set(groups)}
    # Rows (indexes into this part) by batch check; None collects the rows for validate_report.
    by_check: dict[_TaskCheck | None, list[int] | range] = {}
    if len(set(checks.values())) == 1 and rounds.count(context.round) == len(rounds):
        by_check[next(iter(checks.values()))] = range(len(rounds))
    else:
        # Rows are first bucketed by the int index of their group's check (hashing a check per row,
        # a frozen dataclass of mechanism parameters, cost about 3 microseconds a report), in the
        # order the checks first appear, as by_check lists them.
        distinct = list(dict.fromkeys(checks.values()))
        slot_of = {group: distinct.index(check) for group, check in checks.items()}
        rows_by_slot: dict[int, list[int]] = {}
        current = context.round
        for k, (round_, group) in enumerate(zip(rounds, groups)):
            rows_by_slot.setdefault(slot_of[group] if round_ == current else -1, []).append(k)
        for slot, slot_rows in rows_by_slot.items():
            rows = by_check.setdefault(distinct[slot] if slot >= 0 else None, [])
            assert isinstance(rows, list)
            rows.extend(slot_rows)  # None's rows may interleave two slots: slow is sorted below
    slow: list[int] = list(by_check.pop(None, []))
    for check, rows in by_check.items():
        assert check is not None
        row_payloads = [payloads[k] for k in rows] if not isinstance(rows, range) else payloads
        count = len(check.checks)
        if set(map(len, row_payloads)) != {count}:  # the wrong number of payloads: validate_report says so
            slow.extend(k for k, p in zip(rows, row_payloads) if len(p) != count)
            rows = [k for k, p in zip(rows, row_payloads) if len(p) == count]
            row_payloads = [payloads[k] for k in rows]
        failing = check.failing(row_payloads)
        if failing:
            slow.extend(rows[k] for k in failing)
            keep = sorted(set(range(len(rows))).difference(failing))
            rows = [rows[k] for k in keep]
            row_payloads = [row_payloads[k] for k in keep]
        accepted.add(rows if positions is None else [positions[k] for k in rows], check.stored(row_payloads),
                     row_payloads)
    for k in sorted(slow):
        position = every[k]
        report = columns[position]
        assert isinstance(report, Report)  # errors are not part of any campaign
        try:
            row = validate_report(report, context)
        except ProtocolError as exc:
            rejected[position] = Rejection.of(exc)
        else:
            accepted.add([position], [row.payloads], [columns.payloads[position]])
