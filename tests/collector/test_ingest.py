"""Report validation before storage: reasons, order of outcomes, and the unary plausibility bound.

The plausibility bound is checked exactly: the binomial tail probability of rejecting an honest
report is computed in log space and must stay below 2 * PLAUSIBILITY_DELTA for every domain size
and epsilon tried (no randomness involved).
"""

from __future__ import annotations

import math

import msgpack
import pytest

from ldp_client.encoders.categorical import CategoricalEncoder
from ldp_client.errors import ProtocolError
from ldp_client.mechanisms import GRRParams, LocalHashingParams, oue, sue
from ldp_client.mechanisms.unary_encoding import UnaryEncodingParams
from ldp_client.payload import HashedValue, payload_from_wire
from ldp_client.report import MAX_BATCH_REPORTS, Report
from ldp_client.rng import SeededRng
from ldp_client.spec import Component, GroupTask, RoundSpec
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.ingest import (
    PLAUSIBILITY_DELTA,
    RoundContext,
    ValidatedBatch,
    check_plausible,
    check_request_id,
    hamming_weight_limits,
    pack_payloads,
    validate_batch,
    validate_report,
)
from ldp_collector.storage.base import Outcome, StoredReport


def _log_binomial_pmf(n: int, k: int, q: float) -> float:
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + k * math.log(q) + (n - k) * math.log1p(-q))


def _tail(n: int, q: float, ks: range) -> float:
    logs = [_log_binomial_pmf(n, k, q) for k in ks]
    if not logs:
        return 0.0
    top = max(logs)
    return math.exp(top) * math.fsum(math.exp(x - top) for x in logs)


@pytest.mark.parametrize("domain_size", [2, 3, 16, 100, 1024, 65536])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 4.0, 12.0, 20.0])
@pytest.mark.parametrize("make", [oue, sue])
def test_false_rejection_rate_is_below_the_bound(domain_size: int, epsilon: float, make: object) -> None:
    params = make(domain_size, epsilon)  # type: ignore[operator]
    low, high = hamming_weight_limits(domain_size, params.q)
    n, q = domain_size - 1, params.q
    assert 0 <= low <= high <= domain_size
    # W = X + B, X ~ Bin(D-1, q): W > high needs X >= high; W < low needs X <= low - 1.
    p_reject = _tail(n, q, range(high, n + 1)) + _tail(n, q, range(0, low))
    assert p_reject <= 2 * PLAUSIBILITY_DELTA, (domain_size, epsilon, low, high, p_reject)


@pytest.mark.parametrize("domain_size,epsilon", [(1024, 1.0), (1024, 4.0), (65536, 2.0)])
def test_bound_is_tight_in_the_gaussian_regime(domain_size: int, epsilon: float) -> None:
    q = oue(domain_size, epsilon).q
    low, high = hamming_weight_limits(domain_size, q)
    mean, sd = (domain_size - 1) * q, math.sqrt((domain_size - 1) * q * (1 - q))
    # Tighter than the rule of thumb qD + 10 sd + 1, but never below 7 sd (delta ~ 1e-12).
    assert mean + 7 * sd <= high <= mean + 10 * sd + 1
    assert max(0.0, mean - 10 * sd) <= low <= max(0.0, mean - 6 * sd)


def test_tiny_expected_weight_never_rejects_honest_reports() -> None:
    # epsilon = 20: q ~ 2e-9; the "10 sd" rule would reject a report with 2 bits set (prob ~ Dq).
    params = oue(2**20, 20.0)
    low, high = hamming_weight_limits(params.domain_size, params.q)
    assert low == 0 and 2 <= high <= 8


def test_honest_sdk_reports_are_plausible_and_forged_ones_are_not() -> None:
    rng = SeededRng(3)
    for params in (oue(512, 1.0), sue(512, 2.0), oue(8, 3.0)):
        for v in range(0, params.domain_size, 7):
            check_plausible(params, params.randomize(v, rng=rng))
    params = oue(512, 1.0)
    with pytest.raises(ProtocolError, match="512 bits set"):
        check_plausible(params, b"\xff" * 64)
    with pytest.raises(ProtocolError, match="0 bits set"):
        check_plausible(params, b"\x00" * 64)
    check_plausible(GRRParams(domain_size=4, epsilon=1.0), 3)  # no check for other mechanisms


# --------------------------------------------------------------------------------------------
# validate_report / validate_batch
# --------------------------------------------------------------------------------------------


def _spec() -> RoundSpec:
    grr = Component(encoder=CategoricalEncoder(domain_size=4), mechanism=GRRParams(domain_size=4, epsilon=1.0))
    ue = Component(encoder=CategoricalEncoder(domain_size=64), mechanism=oue(64, 1.0))
    lh = Component(encoder=CategoricalEncoder(domain_size=64), mechanism=LocalHashingParams(domain_size=64, epsilon=1.0))
    return RoundSpec(campaign_id="camp", round=3, group_weights=(1, 1, 1, 1),
                     tasks=(GroupTask(groups=(0,), components=(grr,)), GroupTask(groups=(1,), components=(ue, lh))),
                     campaign_epsilon=2.0)


CONTEXT = RoundContext(campaign_id="camp", round=3, spec=_spec())


def _report(group: int = 0, round: int = 3, payloads: tuple[object, ...] = (2,), rid: int = 1,
            campaign_id: str = "camp") -> Report:
    return Report(report_id=rid.to_bytes(16, "big"), campaign_id=campaign_id, round=round, group=group,
                  payloads=payloads)  # type: ignore[arg-type]


def test_valid_report_becomes_a_stored_row() -> None:
    ue_payload = oue(64, 1.0).randomize(5, rng=SeededRng(1))
    report = _report(group=1, payloads=(ue_payload, HashedValue(7, 1)))
    row = validate_report(report, CONTEXT)
    assert row == StoredReport(report_id=report.report_id, campaign_id="camp", round=3, group=1,
                               payloads=pack_payloads(report.payloads))
    wire = msgpack.unpackb(row.payloads, raw=False)
    assert [payload_from_wire(w) for w in wire] == [ue_payload, HashedValue(7, 1)]


@pytest.mark.parametrize("report,reason", [
    (_report(round=2), "round 2 is not open (the open round is 3)"),
    (_report(group=4), "group 4 is not a group of campaign camp (4 groups)"),
    (_report(group=2), "group 2 does not report in round 3"),
    (_report(payloads=(2, 2)), "group 0 reports 1 payload(s) in round 3, got 2"),
    (_report(payloads=(4,)), "payload 0: grr payload must be an index in [0, 4), got 4"),
    (_report(payloads=(b"\x01",)), "payload 0: grr payload"),
    (_report(group=1, payloads=(b"\xff" * 8, HashedValue(1, 0))), "payload 0: unary_encoding payload has 64 bits set"),
    (_report(group=1, payloads=(b"\x00" * 7, HashedValue(1, 0))), "payload 0: unary_encoding payload must be 8 bytes"),
    (_report(group=1, payloads=(oue(64, 1.0).randomize(1, rng=SeededRng(2)), HashedValue(1, 99))),
     "payload 1: local_hashing"),
])
def test_invalid_reports_name_the_reason(report: Report, reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        validate_report(report, CONTEXT)
    assert str(info.value).startswith(reason)


def test_batch_outcomes_merge_in_request_order() -> None:
    lookups: list[str] = []

    def lookup(campaign_id: str) -> RoundContext | str:
        lookups.append(campaign_id)
        return CONTEXT if campaign_id == "camp" else f"campaign {campaign_id} does not exist"

    batch = validate_batch([
        _report(rid=1),
        ProtocolError("reports[1]: malformed"),
        _report(rid=3, campaign_id="other"),
        _report(rid=4, round=1),
        _report(rid=5, payloads=(0,)),
        _report(rid=6, campaign_id="other"),
    ], lookup)
    assert lookups == ["camp", "other"]  # one lookup per campaign
    assert [r.report_id[-1] for r in batch.valid] == [1, 5] and batch.positions == [0, 4]
    merged = batch.merge([Outcome.ACCEPTED, Outcome.DUPLICATE])
    assert merged == [
        (Outcome.ACCEPTED, ""),
        (Outcome.REJECTED, "reports[1]: malformed"),
        (Outcome.REJECTED, "campaign other does not exist"),
        (Outcome.REJECTED, "round 1 is not open (the open round is 3)"),
        (Outcome.DUPLICATE, ""),
        (Outcome.REJECTED, "campaign other does not exist"),
    ]
    # A round that closed between validation and commit: the store rejects, the reason says why.
    assert batch.merge([Outcome.REJECTED, Outcome.ACCEPTED])[0] == (
        Outcome.REJECTED, "round 3 closed before the report was stored")
    with pytest.raises(RuntimeError, match="1 outcomes for 2 reports"):
        batch.merge([Outcome.ACCEPTED])


def test_empty_and_all_rejected_batches() -> None:
    assert validate_batch([], lambda c: CONTEXT).merge([]) == []
    batch = validate_batch([_report(round=9)], lambda c: CONTEXT)
    assert batch.valid == [] and batch.merge([]) == [(Outcome.REJECTED, "round 9 is not open (the open round is 3)")]
    assert isinstance(batch, ValidatedBatch) and batch.size == 1


def test_request_id_and_batch_size_checks() -> None:
    assert check_request_id("abc") == "abc"
    for bad in ("", "x" * 129, None, 5):
        with pytest.raises(InvalidArgumentError, match="request_id"):
            check_request_id(bad)

    class Huge(list[Report]):
        def __len__(self) -> int:
            return MAX_BATCH_REPORTS + 1

    with pytest.raises(InvalidArgumentError, match="at most"):
        validate_batch(Huge(), lambda c: CONTEXT)


def test_unary_params_type_is_checked_by_isinstance() -> None:
    # A subclass of UnaryEncodingParams gets the same plausibility check.
    params = oue(256, 2.0)
    assert isinstance(params, UnaryEncodingParams)
    with pytest.raises(ProtocolError):
        check_plausible(params, b"\xff" * 32)
