"""HISTOGRAM campaigns with local hashing from a public seed pool (docs/protocol.md §14): the
configuration (explicit size, the default rule, refusals), a fresh pool key per round, estimates
from the pooled accumulator equal to those from the raw reports, and the CLI flags."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from ldp.v1 import campaigns_pb2
from ldp_client.mechanisms import LocalHashingParams
from ldp_client.mechanisms.local_hashing import seed_pool_size_for
from ldp_client.payload import HashedValue
from ldp_client.report import Report
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.estimation import LocalHashingAggregator
from ldp_collector.ingest import ReportRejectedError, RoundContext, validate_report
from ldp_collector.kinds.common import seed_pool_key
from ldp_collector.kinds.histogram import round_aggregators
from support.round_reports import ListRoundReports

from .test_histogram_engine import assert_estimates_fit, config, engine_for, rows_for, skewed_values


def pooled_config(size: int = 16, epsilon: float = 2.0, **histogram: Any) -> campaigns_pb2.CampaignConfig:
    c = config(size=size, epsilon=epsilon)
    for name, value in histogram.items():
        setattr(c.histogram, name, value)
    return c


def test_explicit_pool_size_is_local_hashing_with_a_key_per_round() -> None:
    engine = engine_for(pooled_config(seed_pool_size=64))
    assert engine.params.seed_pool_size == 64 and engine.params.oracle == campaigns_pb2.OLH
    spec = engine.first_round().spec
    mechanism = spec.tasks[0].components[0].mechanism
    assert isinstance(mechanism, LocalHashingParams) and mechanism.seed_pool_size == 64
    assert mechanism.seed_pool_key == seed_pool_key(engine.config, 1)
    assert seed_pool_key(engine.config, 2) != mechanism.seed_pool_key
    # Another campaign seed gives another pool.
    other = pooled_config(seed_pool_size=64)
    other.seed = 12345
    assert seed_pool_key(engine_for(other).config, 1) != mechanism.seed_pool_key


def test_default_size_from_the_concentration_bound() -> None:
    engine = engine_for(_with_close(pooled_config(size=4096, seed_pool_concentration=0.01), 10**6))
    plain = LocalHashingParams(domain_size=4096, epsilon=2.0)
    assert engine.params.seed_pool_size == seed_pool_size_for(plain, 1e6, 0.01) > 1000
    # The stored configuration records the size, so it gives the same campaign back.
    assert engine_for(_with_close(pooled_config(size=4096, seed_pool_size=engine.params.seed_pool_size,
                                                seed_pool_concentration=0.01), 10**6)).params == engine.params


def _with_close(c: campaigns_pb2.CampaignConfig, reports: int) -> campaigns_pb2.CampaignConfig:
    c.close_after_reports = reports
    return c


@pytest.mark.parametrize("fields,message", [
    ({"seed_pool_concentration": 0.1}, "close_after_reports"),
    ({"seed_pool_concentration": 1.5}, "seed_pool_concentration must be in"),
    ({"seed_pool_concentration": float("nan")}, "seed_pool_concentration must be in"),
    ({"seed_pool_size": 2**24 + 1}, "at most"),
    ({"seed_pool_size": 2**22}, "seed_pool_size x g"),
    ({"seed_pool_size": 8, "oracle": campaigns_pb2.GRR}, "needs local hashing"),
])
def test_bad_pool_parameters(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        engine_for(pooled_config(**fields))


def test_a_pool_is_refused_where_the_campaign_oracles_leave_out_local_hashing() -> None:
    config = pooled_config(seed_pool_size=8)
    config.oracles.extend([campaigns_pb2.GRR, campaigns_pb2.OUE])
    with pytest.raises(InvalidArgumentError, match="leave out"):
        engine_for(config)
    config.oracles.append(campaigns_pb2.OLH)
    assert engine_for(config).params.seed_pool_size == 8


def test_pooled_round_estimates_from_the_accumulator() -> None:
    engine = engine_for(pooled_config(size=16, seed_pool_size=256))
    spec = engine.first_round().spec
    values = skewed_values(5000, 16)
    reports = rows_for(engine, spec, values, seed=21)
    aggregators = round_aggregators(spec, reports)
    assert isinstance(aggregators["0:0"], LocalHashingAggregator) and aggregators["0:0"].pooled
    from_counts = engine.close_round(spec, reports, b"").estimates
    raw_only = engine.close_round(spec, ListRoundReports(reports.rows), b"").estimates
    assert from_counts is not None and from_counts == raw_only
    assert_estimates_fit(from_counts, Counter(values))


def test_ingestion_rejects_a_seed_outside_the_pool() -> None:
    engine = engine_for(pooled_config(size=16, seed_pool_size=8))
    spec = engine.first_round().spec
    mechanism = spec.tasks[0].components[0].mechanism
    assert isinstance(mechanism, LocalHashingParams)
    outsider = next(s for s in range(100) if s not in set(mechanism.pool_seeds))
    context = RoundContext(campaign_id=spec.campaign_id, round=spec.round, spec=spec)
    report = Report(report_id=bytes(16), campaign_id=spec.campaign_id, round=1, group=0,
                    payloads=(HashedValue(outsider, 0),))
    with pytest.raises(ReportRejectedError, match="seed pool"):
        validate_report(report, context)
    good = Report(report_id=bytes(16), campaign_id=spec.campaign_id, round=1, group=0,
                  payloads=(HashedValue(mechanism.pool_seeds[3], 1),))
    assert validate_report(good, context).group == 0


def test_cli_flags_fill_the_parameters() -> None:
    from ldp_collector.cli_args import build_campaign_config

    c = build_campaign_config("histogram", epsilon=2.0, categories=16, seed_pool=64)
    assert c.histogram.seed_pool_size == 64
    c = build_campaign_config("histogram", epsilon=2.0, categories=16, seed_pool_concentration=0.05,
                              close_after=100_000)
    assert c.histogram.seed_pool_concentration == pytest.approx(0.05)


def test_enrolled_device_reports_the_pool_seed_of_its_assignment() -> None:
    """An assigned seed a picks pool index a mod S on the device, and the collector's assignment check
    expects exactly that pool seed (docs/protocol.md §14.3)."""
    from ldp_client.device import RoundAssignment, run_component
    from ldp_client.errors import ProtocolError
    from ldp_client.rng import SeededRng
    from ldp_collector.defences import check_assignment

    engine = engine_for(pooled_config(size=16, seed_pool_size=8))
    spec = engine.first_round().spec
    component = spec.tasks[0].components[0]
    mechanism = component.mechanism
    assert isinstance(mechanism, LocalHashingParams)
    assigned = 2**31 + 5
    payload = run_component(component, 3, rng=SeededRng(1), seed=assigned)
    assert isinstance(payload, HashedValue)
    assert payload.seed == mechanism.pool_seeds[assigned % 8] == mechanism.assigned_seed(assigned)
    assignment = RoundAssignment(report_id=bytes(16), hash_seeds=(assigned,))
    report = Report(report_id=bytes(16), campaign_id=spec.campaign_id, round=1, group=0, payloads=(payload,))
    check_assignment(report, spec, assignment)
    other = mechanism.pool_seeds[(assigned + 1) % 8]
    if other != payload.seed:
        wrong = Report(report_id=bytes(16), campaign_id=spec.campaign_id, round=1, group=0,
                       payloads=(HashedValue(other, payload.value),))
        with pytest.raises(ProtocolError, match="not the seed assigned"):
            check_assignment(wrong, spec, assignment)
    # The raw assigned value itself is not what a pooled report carries.
    raw = Report(report_id=bytes(16), campaign_id=spec.campaign_id, round=1, group=0,
                 payloads=(HashedValue(assigned, payload.value),))
    with pytest.raises(ProtocolError):
        check_assignment(raw, spec, assignment)
