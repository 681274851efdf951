"""The HISTOGRAM engine without a server: configuration, the round it publishes, and its estimates.

Reports come from the SDK's own mechanisms (exact coins, seeded), pass the collector's ingestion
checks and are stored as rows; the engine sees them through an in-memory ``RoundReports``.
Tolerance: |estimate - truth| <= z SE with z = max(5, Bonferroni over the values checked), so each
test fails falsely with probability below 1e-6; one test runs unseeded on the OS CSPRNG.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import pytest

from ldp.v1 import campaigns_pb2, encoders_pb2
from ldp_client.encoders.categorical import CategoricalEncoder
from ldp_client.encoders.grid import UniformGridEncoder
from ldp_client.mechanisms import (
    GRRParams,
    LocalHashingParams,
    UnaryEncodingParams,
    UnaryVariant,
    choose_frequency_oracle,
)
from ldp_client.report import Report
from ldp_client.rng import SeededRng
from ldp_client.spec import RoundSpec
from ldp_collector.campaigns import make_engine, prepare_campaign
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.ingest import RoundContext, validate_report
from ldp_collector.kinds import KINDS
from ldp_collector.kinds.histogram import HistogramEngine, default_cells_per_dimension, round_aggregators
from ldp_collector.serde import config_from_proto
from support.round_reports import ListRoundReports


def config(size: int = 8, epsilon: float = 2.0, oracle: int = 0, **fields: Any) -> campaigns_pb2.CampaignConfig:
    c = campaigns_pb2.CampaignConfig(campaign_id="h", kind=campaigns_pb2.HISTOGRAM, epsilon=epsilon,
                                     domain=campaigns_pb2.Domain(categorical_size=size), **fields)
    if oracle:
        c.histogram.oracle = oracle  # type: ignore[assignment]
    return c


def engine_for(c: campaigns_pb2.CampaignConfig) -> HistogramEngine:
    engine = prepare_campaign(config_from_proto(c)).engine
    assert isinstance(engine, HistogramEngine)
    return engine


def rows_for(engine: HistogramEngine, spec: RoundSpec, points: Sequence[Any], seed: int | None,
             *, batch: int = 500) -> ListRoundReports:
    """Randomize with the SDK, validate like ingestion, accumulate in batches like the store."""
    rng = SeededRng(seed) if seed is not None else None
    context = RoundContext(campaign_id=spec.campaign_id, round=spec.round, spec=spec)
    component = spec.tasks[0].components[0]
    ids = SeededRng(10**6 + (seed or 0))
    rows = [validate_report(Report(report_id=ids.token_bytes(16), campaign_id=spec.campaign_id, round=spec.round,
                                   group=0, payloads=(component.run(p, rng=rng),)), context) for p in points]
    accumulate = engine.accumulate_fn(spec)
    assert accumulate is not None
    blobs: dict[str, bytes] = {}
    for i in range(0, len(rows), batch):
        blobs.update(accumulate(rows[i:i + batch], blobs))
    return ListRoundReports(rows, blobs)


def z_limit(m: int, alpha: float = 1e-6) -> float:
    return max(5.0, NormalDist().inv_cdf(1 - alpha / (2 * m)))


def assert_estimates_fit(estimates: campaigns_pb2.Estimates, truth: Counter[int]) -> None:
    z = z_limit(len(estimates.estimates))
    for e in estimates.estimates:
        assert abs(e.count - truth[e.value]) <= z * e.std_error, (e.value, e.count, truth[e.value], e.std_error)


def skewed_values(n: int, size: int) -> list[int]:
    # value v with weight proportional to (size - v): a clear, non-uniform histogram
    weights = [size - v for v in range(size)]
    total = sum(weights)
    out = [v for v, w in enumerate(weights) for _ in range(n * w // total)]
    return out + [0] * (n - len(out))


# --------------------------------------------------------------------------------------------


def test_registered_for_histogram_kind() -> None:
    assert KINDS["histogram"].engine is HistogramEngine


@pytest.mark.parametrize("size,epsilon,oracle", [(4, 2.0, campaigns_pb2.GRR), (1024, 1.0, campaigns_pb2.OUE),
                                                  (2**22, 1.0, campaigns_pb2.OLH)])
def test_oracle_chosen_by_variance_is_recorded(size: int, epsilon: float, oracle: int) -> None:
    engine = engine_for(config(size=size, epsilon=epsilon))
    assert engine.component.mechanism == choose_frequency_oracle(size, epsilon)
    assert engine.config.parameters.oracle == oracle


def test_explicit_oracles_and_payload_cap() -> None:
    assert isinstance(engine_for(config(oracle=campaigns_pb2.GRR)).component.mechanism, GRRParams)
    sue_engine = engine_for(config(oracle=campaigns_pb2.SUE))
    mech = sue_engine.component.mechanism
    assert isinstance(mech, UnaryEncodingParams) and mech.variant == UnaryVariant.SYMMETRIC
    assert sue_engine.config.parameters.oracle == campaigns_pb2.SUE
    assert isinstance(engine_for(config(oracle=campaigns_pb2.OLH)).component.mechanism, LocalHashingParams)
    capped = config(size=1024, epsilon=4.0)
    capped.histogram.max_payload_bits = 10
    assert isinstance(engine_for(capped).component.mechanism, GRRParams)  # OUE (1024 bits) and OLH do not fit
    too_small = config(size=1024, oracle=campaigns_pb2.OUE)
    too_small.histogram.max_payload_bits = 100
    with pytest.raises(InvalidArgumentError, match="needs 1024 bits per report"):
        engine_for(too_small)


def test_first_round_spec() -> None:
    engine = engine_for(config(size=8, epsilon=2.0, oracle=campaigns_pb2.GRR))
    spec = engine.first_round().spec
    assert (spec.campaign_id, spec.round, spec.group_weights, spec.kind) == ("h", 1, (1,), "histogram")
    assert spec.campaign_epsilon == 2.0 and spec.max_reports_per_device == 1
    (task,) = spec.tasks
    assert task.groups == (0,) and task.epsilon == 2.0
    (component,) = task.components
    assert component.encoder == CategoricalEncoder(domain_size=8)
    assert component.mechanism == GRRParams(domain_size=8, epsilon=2.0)
    assert RoundSpec.unpack(spec.pack()) == spec


@pytest.mark.parametrize("dimension,cells,expected", [(1, [], [32]), (2, [], [32, 32]), (3, [], [16, 16, 16]),
                                                      (2, [5], [5, 5]), (2, [3, 7], [3, 7])])
def test_numeric_grid_defaults(dimension: int, cells: list[int], expected: list[int]) -> None:
    c = campaigns_pb2.CampaignConfig(
        campaign_id="g", kind=campaigns_pb2.HISTOGRAM, epsilon=1.0,
        domain=campaigns_pb2.Domain(numeric=encoders_pb2.NumericDomain(lower=[0.0] * dimension,
                                                                       upper=[1.0] * dimension)))
    c.histogram.cells_per_dimension.extend(cells)
    engine = engine_for(c)
    assert list(engine.config.parameters.cells_per_dimension) == expected
    encoder = engine.component.encoder
    assert isinstance(encoder, UniformGridEncoder) and list(encoder.cells_per_dimension) == expected


def test_default_cells_per_dimension() -> None:
    assert [default_cells_per_dimension(d) for d in (1, 2, 3, 4, 6, 12, 20)] == [32, 32, 16, 8, 4, 2, 2]


@pytest.mark.parametrize("mutate,message", [
    (lambda c: setattr(c, "epsilon", 20.5), r"\(0, 20\]"),
    (lambda c: setattr(c.domain, "categorical_size", 2**24 + 1), "at most 16777216"),
    (lambda c: c.histogram.cells_per_dimension.append(2), "numeric domains only"),
    (lambda c: setattr(c.histogram, "oracle", 9), "not a known frequency oracle"),
])
def test_bad_parameters(mutate: Any, message: str) -> None:
    c = config()
    mutate(c)
    with pytest.raises(InvalidArgumentError, match=message):
        make_engine(config_from_proto(c))


def test_bad_numeric_grid() -> None:
    c = campaigns_pb2.CampaignConfig(
        campaign_id="g", kind=campaigns_pb2.HISTOGRAM, epsilon=1.0,
        domain=campaigns_pb2.Domain(numeric=encoders_pb2.NumericDomain(lower=[0, 0, 0], upper=[1, 1, 1])))
    c.histogram.cells_per_dimension.extend([2, 2])
    with pytest.raises(InvalidArgumentError, match="1 or 3 entries"):
        make_engine(config_from_proto(c))
    del c.histogram.cells_per_dimension[:]
    c.histogram.cells_per_dimension.append(300)
    with pytest.raises(InvalidArgumentError, match="at most"):
        make_engine(config_from_proto(c))


# --------------------------------------------------------------------------------------------
# Estimation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("oracle", [campaigns_pb2.GRR, campaigns_pb2.OUE, campaigns_pb2.SUE, campaigns_pb2.OLH])
def test_close_round_estimates_are_unbiased(oracle: int) -> None:
    engine = engine_for(config(size=16, epsilon=2.0, oracle=oracle))
    spec = engine.first_round().spec
    values = skewed_values(5000, 16)
    reports = rows_for(engine, spec, values, seed=oracle)
    outcome = engine.close_round(spec, reports, b"")
    assert outcome.next_round is None and outcome.result is not None and outcome.estimates is not None
    estimates = outcome.estimates
    assert estimates.reports == 5000 and estimates.confidence == pytest.approx(0.95) and not estimates.consistent
    assert [e.value for e in estimates.estimates] == list(range(16))
    assert estimates.mechanism == spec.tasks[0].components[0].mechanism
    assert estimates.encoder == spec.tasks[0].components[0].encoder
    assert_estimates_fit(estimates, Counter(values))
    result = outcome.result
    assert result.state == campaigns_pb2.FINISHED and result.estimates == estimates
    assert outcome.diagnostics["reports"] == 5000 and outcome.diagnostics["domain_size"] == 16
    assert outcome.diagnostics["realized_epsilon"] <= 2.0


@pytest.mark.parametrize("oracle", [campaigns_pb2.GRR, campaigns_pb2.OUE])
def test_accumulators_and_raw_reports_agree(oracle: int) -> None:
    engine = engine_for(config(size=16, epsilon=1.0, oracle=oracle))
    spec = engine.first_round().spec
    reports = rows_for(engine, spec, skewed_values(1500, 16), seed=4)
    from_accumulators = engine.close_round(spec, reports, b"").estimates
    raw_only = engine.close_round(spec, ListRoundReports(reports.rows), b"").estimates
    assert from_accumulators == raw_only
    # An accumulator behind the raw reports (rows stored without it) is not trusted.
    lagging = ListRoundReports(reports.rows, rows_for(engine, spec, skewed_values(100, 16), seed=5).blobs)
    assert engine.close_round(spec, lagging, b"").estimates == raw_only
    corrupted = ListRoundReports(reports.rows, {"0:0": b"garbage!"})
    assert engine.close_round(spec, corrupted, b"").estimates == raw_only
    aggregators = round_aggregators(spec, reports)
    assert set(aggregators) == {"0:0"} and aggregators["0:0"].n == 1500


def test_numeric_histogram_counts_cells() -> None:
    c = campaigns_pb2.CampaignConfig(
        campaign_id="g", kind=campaigns_pb2.HISTOGRAM, epsilon=4.0,
        domain=campaigns_pb2.Domain(numeric=encoders_pb2.NumericDomain(lower=[-1.0, 0.0], upper=[1.0, 100.0])))
    c.histogram.cells_per_dimension.extend([2, 4])
    engine = engine_for(c)
    spec = engine.first_round().spec
    # cell (row, col) = (x >= 0, floor(y / 25)); index = row * 4 + col; outside points are clamped.
    points = [(-0.5, 10.0)] * 2000 + [(0.5, 80.0)] * 1000 + [(5.0, 500.0)] * 500
    outcome = engine.close_round(spec, rows_for(engine, spec, points, seed=7), b"")
    assert outcome.estimates is not None
    assert_estimates_fit(outcome.estimates, Counter({0: 2000, 7: 1500}))


def test_consistency_projects_onto_the_simplex() -> None:
    c = config(size=32, epsilon=1.0, oracle=campaigns_pb2.OUE)
    c.histogram.consistency = True
    engine = engine_for(c)
    spec = engine.first_round().spec
    outcome = engine.close_round(spec, rows_for(engine, spec, [3] * 800 + [9] * 200, seed=8), b"")
    estimates = outcome.estimates
    assert estimates is not None and estimates.consistent
    counts = [e.count for e in estimates.estimates]
    assert min(counts) >= 0 and sum(counts) == pytest.approx(1000)
    # Intervals still describe the unbiased estimates (centered elsewhere than the projected counts).
    assert any(abs((e.ci_lower + e.ci_upper) / 2 - e.count) > 1e-6 for e in estimates.estimates)


def test_low_n_warnings_reach_the_result() -> None:
    engine = engine_for(config(size=8, epsilon=1.0, oracle=campaigns_pb2.GRR))
    spec = engine.first_round().spec
    outcome = engine.close_round(spec, rows_for(engine, spec, [1] * 20, seed=9), b"")
    assert outcome.result is not None
    assert any("only 20 reports" in w for w in outcome.result.warnings)


def test_unseeded_run_on_the_os_csprng() -> None:
    engine = engine_for(config(size=8, epsilon=3.0, oracle=campaigns_pb2.GRR))
    spec = engine.first_round().spec
    values = skewed_values(3000, 8)
    outcome = engine.close_round(spec, rows_for(engine, spec, values, seed=None), b"")
    assert outcome.estimates is not None
    assert_estimates_fit(outcome.estimates, Counter(values))
