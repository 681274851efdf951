"""Report validation before anything is stored (DESIGN.md §5, *Ingestion*).

Every report of a batch is checked against the open round of its campaign: the campaign exists
and is collecting, the report targets the open round, its group reports in that round, it carries
one payload per component of the group's task, and every payload is a possible output of its
mechanism (shape and range, via ``MechanismParams.check_payload``) and a *plausible* one
(:func:`check_plausible`). Valid reports become :class:`~ldp_collector.storage.base.StoredReport`
rows (payloads as msgpack); the others get a REJECTED outcome with the reason. Nothing here
touches the store: :class:`~ldp_collector.core.Collector` stores the valid part and merges the
store's outcomes back in request order with :meth:`ValidatedBatch.merge`.

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
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgpack

from ldp_client.errors import ProtocolError
from ldp_client.mechanisms.base import MechanismParams
from ldp_client.mechanisms.unary_encoding import UnaryEncodingParams
from ldp_client.payload import Payload, payload_to_wire
from ldp_client.report import MAX_BATCH_REPORTS, MAX_REQUEST_ID, Report
from ldp_client.spec import RoundSpec

from .errors import InvalidArgumentError
from .storage.base import Outcome, StoredReport

__all__ = [
    "PLAUSIBILITY_DELTA",
    "RoundContext",
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


#: Looks a campaign up: its open round, or the reason its reports are rejected
#: (``"campaign x does not exist"``, ``"campaign x is finished"``).
Lookup = Callable[[str], "RoundContext | str"]


def check_request_id(request_id: object) -> str:
    """Return ``request_id`` if it is a string of 1 to 128 characters, else raise ``InvalidArgumentError``."""
    if not isinstance(request_id, str) or not 1 <= len(request_id) <= MAX_REQUEST_ID:
        raise InvalidArgumentError(
            f"request_id must be a string of 1 to {MAX_REQUEST_ID} characters, got {request_id!r:.60}")
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
            raise ProtocolError(
                f"unary_encoding payload has {weight} bits set; an honest report over {mechanism.domain_size} "
                f"values has {low} to {high}")


def pack_payloads(payloads: Sequence[Payload]) -> bytes:
    """The stored form of a report's payloads: msgpack of ``[payload_to_wire(p), ...]``."""
    return msgpack.packb([payload_to_wire(p) for p in payloads], use_bin_type=True)  # type: ignore[no-any-return]


def validate_report(report: Report, context: RoundContext) -> StoredReport:
    """Check one report against the open round of its campaign and build its stored row.

    Raises
    ------
    ProtocolError
        With the reason the report is rejected.
    """
    spec = context.spec
    if report.round != context.round:
        raise ProtocolError(f"round {report.round} is not open (the open round is {context.round})")
    if report.group >= len(spec.group_weights):
        raise ProtocolError(
            f"group {report.group} is not a group of campaign {context.campaign_id} "
            f"({len(spec.group_weights)} groups)")
    task = spec.task_for(report.group)
    if task is None:
        raise ProtocolError(f"group {report.group} does not report in round {context.round}")
    if len(report.payloads) != len(task.components):
        raise ProtocolError(
            f"group {report.group} reports {len(task.components)} payload(s) in round {context.round}, "
            f"got {len(report.payloads)}")
    for i, (component, payload) in enumerate(zip(task.components, report.payloads)):
        try:
            component.mechanism.check_payload(payload)
            check_plausible(component.mechanism, payload)
        except ProtocolError as exc:
            raise ProtocolError(f"payload {i}: {exc}") from None
    return StoredReport(report_id=report.report_id, campaign_id=report.campaign_id, round=report.round,
                        group=report.group, payloads=pack_payloads(report.payloads))


@dataclass(frozen=True, kw_only=True)
class ValidatedBatch:
    """A batch after validation.

    Attributes
    ----------
    rejected : dict of int to str
        Request position -> reason, for the reports rejected before storage.
    valid : list of StoredReport
        The reports to store, in request order.
    positions : list of int
        The request position of each entry of ``valid``.
    """

    rejected: dict[int, str]
    valid: list[StoredReport]
    positions: list[int]

    @property
    def size(self) -> int:
        return len(self.rejected) + len(self.valid)

    def merge(self, stored: Sequence[Outcome]) -> list[tuple[Outcome, str]]:
        """Outcomes of the whole batch in request order, given the store's outcomes of ``valid``."""
        if len(stored) != len(self.valid):
            raise RuntimeError(f"the store answered {len(stored)} outcomes for {len(self.valid)} reports")
        out: list[tuple[Outcome, str]] = [(Outcome.REJECTED, "")] * self.size
        for position, reason in self.rejected.items():
            out[position] = (Outcome.REJECTED, reason)
        for position, row, outcome in zip(self.positions, self.valid, stored):
            # The store rejects a report whose round closed between validation and commit.
            reason = f"round {row.round} closed before the report was stored" if outcome == Outcome.REJECTED else ""
            out[position] = (Outcome(outcome), reason)
        return out


def validate_batch(reports: Sequence[Report | ProtocolError], lookup: Lookup) -> ValidatedBatch:
    """Validate every report of a batch; ``lookup`` is called once per distinct campaign id.

    Entries that are already a :class:`ProtocolError` (a malformed report in a packed batch) are
    rejected with their message.

    Raises
    ------
    InvalidArgumentError
        If the batch holds more than ``ldp_client.report.MAX_BATCH_REPORTS`` reports.
    """
    if len(reports) > MAX_BATCH_REPORTS:
        raise InvalidArgumentError(f"a batch holds at most {MAX_BATCH_REPORTS} reports, got {len(reports)}")
    contexts: dict[str, RoundContext | str] = {}
    rejected: dict[int, str] = {}
    valid: list[StoredReport] = []
    positions: list[int] = []
    for position, report in enumerate(reports):
        if isinstance(report, ProtocolError):
            rejected[position] = str(report) or "malformed report"
            continue
        context = contexts.get(report.campaign_id)
        if context is None:
            context = contexts[report.campaign_id] = lookup(report.campaign_id)
        if isinstance(context, str):
            rejected[position] = context
            continue
        try:
            valid.append(validate_report(report, context))
        except ProtocolError as exc:
            rejected[position] = str(exc)
            continue
        positions.append(position)
    return ValidatedBatch(rejected=rejected, valid=valid, positions=positions)
