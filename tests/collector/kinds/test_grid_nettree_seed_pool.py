"""GRID and NETTREE campaigns whose local-hashing rounds draw seeds from a public pool (docs/protocol.md §14).

The pool is a round option of both kinds (``seed_pool_size``, ``--seed-pool``), as for heavy
hitters: every local-hashing component of a round takes the round's pool, the rest is unchanged.
Checked here: the specs (a fresh key each round, the capability a device must state), the refusals
at creation (a pool no round can use), that a pooled step reads no report for its node or cell
counts (one pass at most, whatever its levels, against one support pass per local-hashing level
without a pool), that its estimates equal the per-report supports of the same reports, and that the
variance of a pooled grid round's counts is the derived one (§14.6).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from statistics import NormalDist

import numpy as np
import pytest
from numpy.typing import NDArray

from ldp.v1 import campaigns_pb2
from ldp_client.capabilities import SEED_POOL, required_capabilities
from ldp_client.mechanisms import LocalHashingParams
from ldp_client.payload import HashedValue
from ldp_client.spec import RoundSpec
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.estimation import LocalHashingAggregator
from ldp_collector.estimation.accumulators import component_params_from_spec, decode_report_payloads
from ldp_collector.estimation.frequency import estimate_from_support
from ldp_collector.estimation.olh_hash import support_counts
from ldp_collector.estimation.report_accumulator import ReportAccumulator
from ldp_collector.kinds.base import CampaignEngine, RoundOutcome, RoundPlan
from ldp_collector.kinds.common import seed_pool_key
from ldp_collector.kinds.grid import GridEngine
from ldp_collector.kinds.histogram import aggregator_for, round_aggregators
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.population import Population
from ldp_collector.simulation.reports import draw_local_hashing
from support.round_reports import ListRoundReports

from .test_grid_engine import TREE, blob_points, grid_config, play
from .test_grid_engine import engine_for as grid_engine
from .test_heavy_hitter_engine import config as hh_config
from .test_heavy_hitter_engine import engine_for as hh_engine
from .test_nettree_engine import engine_for as nettree_engine
from .test_nettree_engine import nettree_config

POOL = 256


class CountingReports(ListRoundReports):
    """A closed round in memory that records each pass over its reports (the accumulator's class)."""

    def __init__(self, rows: ListRoundReports, *, with_accumulators: bool = True) -> None:
        super().__init__(rows.rows, rows.blobs if with_accumulators else None)
        self.passes: list[str] = []

    def combine(self, accumulator: ReportAccumulator) -> ReportAccumulator:  # type: ignore[override]
        self.passes.append(type(accumulator).__name__)
        return super().combine(accumulator)


def pooled_components(spec: RoundSpec) -> list[LocalHashingParams]:
    return [c.mechanism for t in spec.tasks for c in t.components if isinstance(c.mechanism, LocalHashingParams)]


# -- grid ---------------------------------------------------------------------------------------------


def grid_tree_round(pool: int) -> tuple[GridEngine, RoundPlan, ListRoundReports]:
    """A TREE campaign's tree round (levels 4, 5, 6 of a 2-D grid: 6 is 4096 cells, local hashing)."""
    engine = grid_engine(grid_config(variant=TREE, campaign_id="grid-pool", granularity_level=4, tree_height=6,
                                     seed_pool_size=pool))
    population = Population(blob_points(30_000, 4, center=(0.4, 0.6), scale=0.08), seed=5, mode="direct")
    plan = engine.first_round()
    outcome = engine.close_round(plan.spec, play(engine, plan.spec, population), plan.engine_state)
    assert outcome.next_round is not None
    tree = outcome.next_round
    return engine, tree, play(engine, tree.spec, population)


def test_grid_local_hashing_rounds_take_a_fresh_pool_each_round() -> None:
    engine, tree, reports = grid_tree_round(POOL)
    assert tree.spec.round == 2
    pooled = pooled_components(tree.spec)
    assert pooled, "level 6 (4096 cells) is local hashing"
    assert all(m.seed_pool_size == POOL and m.seed_pool_key == seed_pool_key(engine.config, 2) for m in pooled)
    assert SEED_POOL in required_capabilities(tree.spec)
    # The calibration round (256 cells, unary encoding) is unchanged and needs no pool capability.
    first = engine.first_round().spec
    assert not pooled_components(first) and SEED_POOL not in required_capabilities(first)
    # The aggregation round's cell list gets round 3's pool, not round 2's.
    aggregate = engine.close_round(tree.spec, reports, tree.engine_state).next_round
    assert aggregate is not None
    assert all(m.seed_pool_key == seed_pool_key(engine.config, 3) for m in pooled_components(aggregate.spec))
    # Without a pool the same campaign sends per-report seeds, and needs no pool capability.
    plain, plain_tree, _ = grid_tree_round(0)
    assert [replace(m, seed_pool_size=0, seed_pool_key=0) for m in pooled] == pooled_components(plain_tree.spec)
    assert SEED_POOL not in required_capabilities(plain_tree.spec)


def test_pooled_grid_round_reads_no_report_for_its_counts() -> None:
    """Per-report seeds: one support pass per local-hashing level; a pool: none (the counts were kept at
    ingestion), or one count pass when the accumulators are missing, whatever the levels."""
    engine, tree, reports = grid_tree_round(POOL)
    plain_engine, plain_tree, plain_reports = grid_tree_round(0)
    pooled, plain = CountingReports(reports), CountingReports(plain_reports)
    tree_outcome = engine.close_round(tree.spec, pooled, tree.engine_state)
    plain_engine.close_round(plain_tree.spec, plain, plain_tree.engine_state)
    assert pooled.passes == []
    assert plain.passes == ["SupportCounts"] * len(pooled_components(plain_tree.spec))
    raw = CountingReports(reports, with_accumulators=False)
    assert engine.close_round(tree.spec, raw, tree.engine_state) == tree_outcome
    assert raw.passes == ["RoundCounts"]


def per_report_estimates(spec: RoundSpec, reports: ListRoundReports, group: int,
                         candidates: NDArray[np.int64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The group's local-hashing counts from each report's own (seed, bucket), hashed one report at a time."""
    mechanism = spec.task_for(group).components[0].mechanism  # type: ignore[union-attr]
    assert isinstance(mechanism, LocalHashingParams)
    payloads = decode_report_payloads((r for r in reports.rows if r.group == group),
                                      component_params_from_spec(spec))[f"{group}:0"]
    assert all(isinstance(p, HashedValue) for p in payloads)
    seeds = np.array([p.seed for p in payloads], dtype=np.uint64)
    buckets = np.array([p.value for p in payloads], dtype=np.uint64)
    support = support_counts(seeds, buckets, candidates, mechanism.g)
    pooled = aggregator_for(round_aggregators(spec, reports), spec, group=group)
    assert isinstance(pooled, LocalHashingAggregator) and pooled.pooled
    est = estimate_from_support(mechanism, candidates, support, len(payloads), value_pairs=pooled.value_pairs())
    return est.counts, est.std_errors


def test_pooled_grid_counts_equal_the_per_report_supports() -> None:
    _, tree, reports = grid_tree_round(POOL)
    candidates = np.arange(0, 4096, 3, dtype=np.int64)
    for group, task in zip([t.groups[0] for t in tree.spec.tasks], tree.spec.tasks):
        if not isinstance(task.components[0].mechanism, LocalHashingParams):
            continue
        pooled = aggregator_for(round_aggregators(tree.spec, reports), tree.spec, group=group).estimate(
            candidates=candidates)
        counts, se = per_report_estimates(tree.spec, reports, group, candidates)
        np.testing.assert_array_equal(pooled.counts, counts)
        np.testing.assert_array_equal(pooled.std_errors, se)


@pytest.mark.parametrize("fields,message", [
    ({"seed_pool_size": 2**24 + 1}, "at most"),
    ({"seed_pool_size": 2**22}, "seed_pool_size x g"),
    # The finest grid (64 cells) fits unary encoding: no round would use the pool.
    ({"seed_pool_size": 64, "max_cells": 64, "initial_cells_per_dimension": 4}, "no round of this campaign uses"),
])
def test_grid_refuses_a_pool_it_cannot_use(fields: dict[str, int], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        grid_engine(grid_config(**fields))


@pytest.mark.parametrize("kind", ["grid", "nettree", "heavy_hitters"])
def test_a_pool_is_refused_where_the_campaign_oracles_leave_out_local_hashing(kind: str) -> None:
    """The one check the kinds with a ``seed_pool_size`` share (heavy hitters too)."""
    config = {"grid": lambda: grid_config(seed_pool_size=64), "nettree": lambda: nettree_4d(64),
              "heavy_hitters": lambda: hh_config(seed_pool_size=64)}[kind]()
    config.oracles.extend([campaigns_pb2.GRR, campaigns_pb2.OUE])
    make: Callable[[campaigns_pb2.CampaignConfig], CampaignEngine] = {
        "grid": grid_engine, "nettree": nettree_engine, "heavy_hitters": hh_engine}[kind]
    with pytest.raises(InvalidArgumentError, match=f"{kind}.seed_pool_size: a seed pool needs local hashing, "
                                                   r"which the campaign's oracles leave out \(grr,oue\)"):
        make(config)
    config.oracles.append(campaigns_pb2.OLH)
    assert make(config).params.seed_pool_size == 64


@pytest.mark.parametrize("kind,args", [("grid", {"dims": 2}), ("nettree", {"dims": 4, "k": 3})])
def test_cli_flag_reaches_the_parameters(kind: str, args: dict[str, int]) -> None:
    from ldp_collector.cli_args import build_campaign_config

    dims = args.pop("dims")
    c = build_campaign_config(kind, epsilon=4.0, bounds=([0.0] * dims, [1.0] * dims), seed_pool=512, **args)
    assert getattr(c, kind).seed_pool_size == 512


# -- the derived variance of a pooled grid round -------------------------------------------------------

#: Reports, pool and rounds of the variance check: the grid's level-6 component (4096 cells, epsilon 4,
#: g = 56), a clustered population (30 % of the devices in 4 cells, the rest over 256), and a pool of
#: 32 seeds, so the pool's extra term is about 6 times the per-report variance: a check with power.
VAR_REPORTS, VAR_POOL, VAR_ROUNDS = 20_000, 32, 300
#: Two assertions at a family-wise false-failure rate of 1e-6 (normal approximation of a mean of R
#: i.i.d. rounds, Bonferroni).
VAR_Z = NormalDist().inv_cdf(1 - 1e-6 / 2 / 2)


def clustered_cells(rng: np.random.Generator) -> NDArray[np.int64]:
    dense = rng.choice(np.array([100, 1000, 2000, 3000]), size=int(0.3 * VAR_REPORTS))
    spread = rng.choice(np.arange(0, 4096, 16), size=VAR_REPORTS - dense.size)
    return np.concatenate([dense, spread]).astype(np.int64)


@pytest.mark.statistical
def test_pooled_grid_counts_have_the_derived_variance() -> None:
    """MSE / analytic variance = 1 over R rounds, each with a fresh pool key (the campaign's rounds
    each get their own), on the grid's own local-hashing component; and the per-report variance alone
    is rejected (negative control).

    Y_r = mean over the occupied cells of (c_hat - c)^2 / sigma^2 is one number per round, i.i.d.
    over rounds: mean(Y) is within z s_Y / sqrt(R) of 1 (s_Y absorbs the within-round correlation of
    the cells sharing a pool); the half-width is asserted below 0.2 so the check has power.
    """
    engine = grid_engine(grid_config(granularity_level=6, seed_pool_size=VAR_POOL))
    mechanism = engine._tree_component(6, 2).mechanism  # the kind's own level-6 oracle
    assert isinstance(mechanism, LocalHashingParams) and mechanism.seed_pool_size == VAR_POOL
    rng = np.random.default_rng(20)
    values = clustered_cells(rng)
    counts = np.bincount(values, minlength=4096)
    cells = np.flatnonzero(counts)
    pairs = counts.astype(np.float64) * (counts - 1.0)
    base = np.array([mechanism.count_variance(float(VAR_REPORTS), float(c)) for c in counts[cells]])
    variance = base + np.array([mechanism.seed_pool_extra_variance(float(pairs.sum() - pairs[v])) for v in cells])
    assert float(np.max(variance / base)) > 3.0  # the regime stated above
    ratios, wrong = np.empty(VAR_ROUNDS), np.empty(VAR_ROUNDS)
    for r in range(VAR_ROUNDS):
        params = replace(mechanism, seed_pool_key=int(rng.integers(0, 2**63)))
        agg = LocalHashingAggregator(params)
        agg.add_arrays(*draw_local_hashing(params, values, rng))
        error2 = (agg.estimate(candidates=cells).counts - counts[cells]) ** 2
        ratios[r], wrong[r] = float((error2 / variance).mean()), float((error2 / base).mean())
    half = VAR_Z * float(ratios.std(ddof=1)) / math.sqrt(VAR_ROUNDS)
    assert half <= 0.2, f"too few rounds for power: half-width {half:.3f}"
    assert abs(float(ratios.mean()) - 1.0) <= half, f"MSE / variance = {ratios.mean():.3f} +- {half:.3f}"
    wrong_half = VAR_Z * float(wrong.std(ddof=1)) / math.sqrt(VAR_ROUNDS)
    assert float(wrong.mean()) - wrong_half > 1.2, "the per-report variance alone should be rejected"


# -- nettree ------------------------------------------------------------------------------------------


def nettree_4d(pool: int) -> campaigns_pb2.CampaignConfig:
    """4-D shifted grid, depth 4: levels of 2^4, 2^8, 2^12 and 2^16 nodes (the last two local hashing)."""
    return nettree_config([-8.0] * 4, [8.0] * 4, epsilon=4.0, k=3, campaign_id="nt-pool", seed_pool_size=pool)


def nettree_round(pool: int) -> tuple[CampaignEngine, RoundPlan, ListRoundReports]:
    engine = nettree_engine(nettree_4d(pool))
    x, _ = make_dataset("mixture", 30_000, d=4, k=3, seed=7, separation=4.0)
    plan = engine.first_round()
    return engine, plan, play(engine, plan.spec, Population(np.asarray(x), seed=8, mode="direct"))


def test_nettree_local_hashing_levels_take_the_pool() -> None:
    engine, plan, _ = nettree_round(POOL)
    pooled = pooled_components(plan.spec)
    assert len(pooled) == 2
    assert all(m.seed_pool_size == POOL and m.seed_pool_key == seed_pool_key(engine.config, 1) for m in pooled)
    assert SEED_POOL in required_capabilities(plan.spec)
    with pytest.raises(InvalidArgumentError, match="no node level uses local hashing"):
        nettree_engine(nettree_config([0.0, 0.0], [1.0, 1.0], k=3, seed_pool_size=POOL))


def test_pooled_nettree_round_is_one_pass() -> None:
    """The leaf sums are the round's only pass with a pool; without one each local-hashing level adds a
    support pass per candidate set. The pooled step equals the step on the raw reports alone."""
    engine, plan, reports = nettree_round(POOL)
    plain_engine, plain_plan, plain_reports = nettree_round(0)
    pooled, plain = CountingReports(reports), CountingReports(plain_reports)
    outcome: RoundOutcome = engine.close_round(plan.spec, pooled, plan.engine_state)
    plain_engine.close_round(plain_plan.spec, plain, plain_plan.engine_state)
    assert pooled.passes == ["BucketSumAccumulator"]
    assert plain.passes.count("SupportCounts") == 2 and plain.passes[-1] == "BucketSumAccumulator"
    assert outcome.result is not None and outcome.result.clustering.k == 3
    raw = CountingReports(reports, with_accumulators=False)
    assert engine.close_round(plan.spec, raw, plan.engine_state) == outcome
    assert raw.passes == ["RoundCounts", "BucketSumAccumulator"]
