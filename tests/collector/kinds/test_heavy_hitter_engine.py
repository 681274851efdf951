"""The HEAVY_HITTERS engine without a server: configuration, the prefix encoding, the tree walk.

Reports come from the SDK's own mechanisms (seeded), pass the collector's ingestion checks and are
read through an in-memory ``RoundReports``. Tolerances: recovered heavy-hitter counts within 5 SE
(Bonferroni over at most 3 values: false failure < 2e-6); "no false positives" uses a family-wise
false-positive rate of 1e-6 in the engine's own thresholds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ldp.v1 import campaigns_pb2, encoders_pb2
from ldp_client.device import Device
from ldp_client.encoders.grid import GridTreeEncoder
from ldp_client.report import Report
from ldp_client.rng import SeededRng
from ldp_client.spec import RoundSpec
from ldp_collector.campaigns import prepare_campaign
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.estimation.heavy_hitters import level_params
from ldp_collector.ingest import RoundContext, validate_report
from ldp_collector.kinds import KINDS
from ldp_collector.kinds.heavy_hitters import HeavyHitterEngine, default_bits_per_level, prefix_domain
from ldp_collector.serde import config_from_proto
from support.round_reports import ListRoundReports


def config(size: int = 2**12, epsilon: float = 4.0, **params: Any) -> campaigns_pb2.CampaignConfig:
    c = campaigns_pb2.CampaignConfig(campaign_id="hh", kind=campaigns_pb2.HEAVY_HITTERS, epsilon=epsilon,
                                     domain=campaigns_pb2.Domain(categorical_size=size))
    for key, value in params.items():
        setattr(c.heavy_hitters, key, value)
    return c


def engine_for(c: campaigns_pb2.CampaignConfig) -> HeavyHitterEngine:
    engine = prepare_campaign(config_from_proto(c)).engine
    assert isinstance(engine, HeavyHitterEngine)
    return engine


def rows_for(engine: HeavyHitterEngine, spec: RoundSpec, values: Sequence[int], seed: int) -> ListRoundReports:
    """Device i joins group i mod L (equal groups) and reports its level prefix of (v,)."""
    rng = SeededRng(seed)
    context = RoundContext(campaign_id=spec.campaign_id, round=spec.round, spec=spec)
    levels = len(spec.group_weights)
    rows = []
    for i, v in enumerate(values):
        group = i % levels
        task = spec.task_for(group)
        assert task is not None
        payloads = tuple(c.run((v,), rng=rng) for c in task.components)
        rows.append(validate_report(Report(report_id=rng.token_bytes(16), campaign_id=spec.campaign_id,
                                           round=spec.round, group=group, payloads=payloads), context))
    accumulate = engine.accumulate_fn(spec)
    assert accumulate is not None
    return ListRoundReports(rows, dict(accumulate(rows, {})))


def population(n: int, heavy: dict[int, float], bits: int, seed: int) -> list[int]:
    rng = SeededRng(seed)
    values = [v for v, share in heavy.items() for _ in range(int(n * share))]
    values += [rng.randbelow(2**bits) for _ in range(n - len(values))]
    order = [(rng.randbits(32), v) for v in values]  # shuffle so every group sees the same mix
    return [v for _, v in sorted(order)]


# --------------------------------------------------------------------------------------------


def test_registered_for_heavy_hitter_kind() -> None:
    assert KINDS["heavy_hitters"].engine is HeavyHitterEngine


@pytest.mark.parametrize("size,bits,per_level,levels", [(2, 1, 1, 1), (200, 8, 8, 1), (2**12, 12, 4, 3),
                                                        (2**32, 32, 4, 8), (1000, 10, 4, 3)])
def test_defaults(size: int, bits: int, per_level: int, levels: int) -> None:
    engine = engine_for(config(size=size))
    params = engine.config.parameters
    assert (params.value_bits, params.bits_per_level, engine.tree.levels) == (bits, per_level, levels)
    assert params.false_positive_rate == pytest.approx(0.05) and params.max_candidates == 64
    assert default_bits_per_level(bits) == per_level


@pytest.mark.parametrize("mutate,message", [
    (lambda c: c.domain.numeric.CopyFrom(encoders_pb2.NumericDomain(lower=[0], upper=[1])), "categorical domain"),
    (lambda c: setattr(c, "budget_policy", campaigns_pb2.SPLIT), "PARTITION"),
    (lambda c: setattr(c, "epsilon", 30.0), r"\(0, 20\]"),
    (lambda c: setattr(c.heavy_hitters, "value_bits", 11), r"value_bits must be in \[12, 53\]"),
    (lambda c: setattr(c.heavy_hitters, "value_bits", 54), "value_bits"),
    (lambda c: setattr(c.domain, "categorical_size", 2**53 + 1), r"supports at most 2\^53 values .*got 9007199254740993$"),
    (lambda c: setattr(c.domain, "categorical_size", 2**63), r"supports at most 2\^53 values"),
    (lambda c: setattr(c.heavy_hitters, "bits_per_level", 13), r"bits_per_level must be in \[1, 12\]"),
    (lambda c: setattr(c.heavy_hitters, "false_positive_rate", 1.0), "false_positive_rate"),
    (lambda c: setattr(c.heavy_hitters, "max_candidates", 2**21), "max_candidates"),
    (lambda c: c.histogram.SetInParent(), "takes heavy_hitters parameters"),
])
def test_bad_parameters(mutate: Any, message: str) -> None:
    c = config()
    mutate(c)
    with pytest.raises(InvalidArgumentError, match=message):
        prepare_campaign(config_from_proto(c))


def test_first_round_has_one_group_per_level() -> None:
    engine = engine_for(config(size=2**12, bits_per_level=5))
    spec = engine.first_round().spec
    assert spec.round == 1 and spec.kind == "heavy_hitters" and spec.max_reports_per_device == 1
    assert spec.group_weights == (1, 1, 1)
    for level, task in enumerate(spec.tasks, start=1):
        assert task.groups == (level - 1,) and task.epsilon == 4.0
        (component,) = task.components
        assert component.encoder == GridTreeEncoder(domain=prefix_domain(12), level=min(5 * level, 12))
        assert component.mechanism == level_params(engine.tree, level)
    assert RoundSpec.unpack(spec.pack()) == spec


@pytest.mark.parametrize("bits", [1, 7, 12, 32, 53])
def test_grid_tree_encoder_computes_exact_prefixes(bits: int) -> None:
    rng = SeededRng(bits)
    values = [0, 1, 2**bits - 1, 2 ** (bits - 1)] + [rng.randbelow(2**bits) for _ in range(200)]
    domain = prefix_domain(bits)
    for m in sorted({1, bits // 2 or 1, bits}):
        encoder = GridTreeEncoder(domain=domain, level=m)
        for v in values:
            assert encoder.encode((v,)) == v >> (bits - m), (bits, m, v)


def test_finds_the_heavy_hitters_with_their_counts() -> None:
    engine = engine_for(config(size=2**12, epsilon=4.0, false_positive_rate=1e-6))
    spec = engine.first_round().spec
    heavy = {3001: 0.30, 77: 0.20, 2048: 0.12}
    values = population(12000, heavy, 12, seed=1)
    outcome = engine.close_round(spec, rows_for(engine, spec, values, seed=2), b"")
    result = outcome.result
    assert outcome.next_round is None and result is not None and result.state == campaigns_pb2.FINISHED
    found = {h.value: h for h in result.heavy_hitters}
    assert set(found) == set(heavy)  # nothing else passes a 1e-6 family-wise threshold
    for value in heavy:
        truth = values.count(value)
        assert abs(found[value].count - truth) <= 5 * found[value].std_error, (value, found[value], truth)
    counts = [h.count for h in result.heavy_hitters]
    assert counts == sorted(counts, reverse=True)
    assert outcome.estimates is not None and [e.value for e in outcome.estimates.estimates] == list(found)
    diag = outcome.diagnostics
    assert diag["levels"] == 3 and diag["reports"] == 12000 and diag["heavy_hitters"] == 3
    assert diag["level_1_tested"] == 16 and diag["level_1_reports"] == 4000
    assert diag["level_2_tested"] == 16 * diag["level_1_survivors"]
    assert diag["level_1_threshold"] > 0


def test_single_level_tree() -> None:
    engine = engine_for(config(size=64, epsilon=3.0, false_positive_rate=1e-6))
    assert engine.tree.levels == 1
    spec = engine.first_round().spec
    values = population(3000, {5: 0.5}, 6, seed=3)
    outcome = engine.close_round(spec, rows_for(engine, spec, values, seed=4), b"")
    assert outcome.result is not None
    assert [h.value for h in outcome.result.heavy_hitters] == [5]


def test_uniform_values_have_no_heavy_hitter() -> None:
    engine = engine_for(config(size=2**12, epsilon=2.0, false_positive_rate=1e-6))
    spec = engine.first_round().spec
    outcome = engine.close_round(spec, rows_for(engine, spec, population(3000, {}, 12, seed=5), seed=6), b"")
    assert outcome.result is not None and not outcome.result.heavy_hitters
    assert any("no prefix passed the threshold" in w for w in outcome.result.warnings)
    assert outcome.diagnostics["heavy_hitters"] == 0


def test_max_candidates_caps_the_survivors() -> None:
    engine = engine_for(config(size=2**8, epsilon=4.0, bits_per_level=4, max_candidates=1))
    spec = engine.first_round().spec
    values = population(6000, {0x12: 0.3, 0xA7: 0.3}, 8, seed=7)
    outcome = engine.close_round(spec, rows_for(engine, spec, values, seed=8), b"")
    assert outcome.result is not None
    assert len(outcome.result.heavy_hitters) == 1
    assert any("more than 1 prefixes passed" in w for w in outcome.result.warnings)


def test_a_level_without_reports_stops_the_walk() -> None:
    engine = engine_for(config(size=2**8, epsilon=4.0, bits_per_level=4))
    spec = engine.first_round().spec
    rows = rows_for(engine, spec, population(900, {9: 0.5}, 8, seed=9), seed=10)
    only_level_1 = ListRoundReports([r for r in rows.rows if r.group == 0])
    outcome = engine.close_round(spec, only_level_1, b"")
    assert outcome.result is not None and not outcome.result.heavy_hitters
    assert outcome.diagnostics["level_2_reports"] == 0


def test_sdk_device_reports_its_prefix() -> None:
    engine = engine_for(config(size=2**12))
    spec = engine.first_round().spec
    device = Device.in_memory(rng=SeededRng(11))
    report = device.participate(spec, (1234,))
    assert report is not None
    validate_report(report, RoundContext(campaign_id="hh", round=1, spec=spec))
    with pytest.raises(Exception, match="sequence"):
        Device.in_memory(rng=SeededRng(12)).participate(spec, 1234)
