"""The GRID engine (AGCluster, DESIGN.md §7.2): configuration, budget layout, feedback, end-to-end quality.

Campaigns run through the in-process collector and the simulator (``mode="direct"``, seeded), or
through the engine directly with reports from a simulated population that pass the collector's
ingestion checks. Statistical tolerances state their false-failure probability (at most 1e-6);
the ARI floors of the end-to-end runs come from measured runs (see ``ARI_FLOORS``).
"""

from __future__ import annotations

import functools
import math
import tempfile
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np
import pytest

from ldp.v1 import campaigns_pb2, encoders_pb2
from ldp_client.encoders.base import NumericDomain
from ldp_client.encoders.geometry import TreeCell, check_partition, tree_cell_of
from ldp_client.encoders.grid import CellListEncoder, GridTreeEncoder
from ldp_client.errors import ProtocolError
from ldp_client.spec import RoundSpec
from ldp_collector.campaigns import prepare_campaign
from ldp_collector.core import Collector
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.estimation.grid_clustering import level_for_side
from ldp_collector.ingest import RoundContext, validate_report
from ldp_collector.kinds import KINDS
from ldp_collector.kinds.base import CampaignEngine, RoundOutcome
from ldp_collector.kinds.grid import (
    DEFAULT_CALIBRATION_SHARE,
    DEFAULT_CORE_Z,
    DEFAULT_DENSE_Z,
    DEFAULT_MAX_CELLS,
    DEFAULT_MAX_ITERATIONS,
    DEFAULT_REFINEMENT_SHARE,
    DEFAULT_VARIANT,
    GridEngine,
    _pool_prior,
)
from ldp_collector.model import Result
from ldp_collector.serde import config_from_proto, config_to_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.evaluation import evaluate_clustering
from ldp_collector.simulation.population import Population, numeric_bounds
from ldp_collector.simulation.runner import CampaignRun, run_campaign
from ldp_collector.storage import open_store
from support.recording import RecordingCollector
from support.round_reports import ListRoundReports
from support.stats import Z_UNBIASED, chi2_sf

GRID = campaigns_pb2.GridParameters
UNIFORM, TREE, ITERATIVE, DENSITY = int(GRID.UNIFORM), int(GRID.TREE), int(GRID.ITERATIVE), int(GRID.DENSITY)
PARTITION, SPLIT = int(campaigns_pb2.PARTITION), int(campaigns_pb2.SPLIT)
VARIANTS: dict[str, int] = {"uniform": UNIFORM, "tree": TREE, "iterative": ITERATIVE, "density": DENSITY}


def grid_config(lower: Sequence[float] = (0.0, 0.0), upper: Sequence[float] = (1.0, 1.0), *,
                variant: int = GRID.VARIANT_UNSPECIFIED, epsilon: float = 4.0, policy: int = PARTITION,
                campaign_id: str = "", **params: Any) -> campaigns_pb2.CampaignConfig:
    config = campaigns_pb2.CampaignConfig(
        campaign_id=campaign_id, kind=campaigns_pb2.GRID, epsilon=epsilon,
        budget_policy=policy,  # type: ignore[arg-type]
        domain=campaigns_pb2.Domain(numeric=encoders_pb2.NumericDomain(lower=list(lower), upper=list(upper))))
    config.grid.variant = variant  # type: ignore[assignment]
    for key, value in params.items():
        setattr(config.grid, key, value)
    return config


def config_for(x: np.ndarray, **kwargs: Any) -> campaigns_pb2.CampaignConfig:
    lower, upper = numeric_bounds(x)
    return grid_config(lower, upper, **kwargs)


def engine_for(config: campaigns_pb2.CampaignConfig) -> GridEngine:
    engine = prepare_campaign(config_from_proto(config)).engine
    assert isinstance(engine, GridEngine)
    return engine


# -- driving the engine directly -------------------------------------------------------------------


def play(engine: CampaignEngine, spec: RoundSpec, population: Population) -> ListRoundReports:
    """The population's reports for ``spec``, validated like ingestion, with the engine's accumulators."""
    context = RoundContext(campaign_id=spec.campaign_id, round=spec.round, spec=spec)
    rows = [validate_report(r, context) for r in population.participate(spec)]
    accumulate = engine.accumulate_fn(spec)
    blobs = dict(accumulate(rows, {})) if accumulate is not None and rows else {}
    return ListRoundReports(rows, blobs)


def blob_points(n: int, seed: int, center: tuple[float, float] = (0.2, 0.2), scale: float = 0.03) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(center, scale, size=(n, 2)), 0.0, 1.0)


def uniform_points(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.0, 1.0, size=(n, 2))


# -- campaigns through the in-process collector ------------------------------------------------------


@functools.cache
def dataset(name: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    x, labels = make_dataset(name, n, seed=seed)
    return np.asarray(x), np.asarray(labels)


@functools.cache
def campaign(name: str, n: int, seed: int, variant: int, policy: int = PARTITION, epsilon: float = 4.0,
             extra: tuple[tuple[str, Any], ...] = ()) -> tuple[CampaignRun, dict[int, RoundSpec]]:
    """One seeded campaign (cached: several tests read the same run)."""
    x, _ = dataset(name, n, seed)
    config = config_for(x, variant=variant, policy=policy, epsilon=epsilon, **dict(extra))
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(tmp)
        try:
            backend = RecordingCollector(Collector(store), seed=seed)
            run = run_campaign(backend, config_from_proto(config), x, seed=seed, mode="direct", quiet=True)
        finally:
            store.close()
    return run, dict(backend.specs)


def cells_of(result: Result) -> list[TreeCell]:
    return [TreeCell(level=c.level, morton_index=c.morton_index) for c in result.clustering.cell_map.cells]


# --------------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------------


def test_registered_for_the_grid_kind() -> None:
    assert KINDS["grid"].engine is GridEngine


def categorical(c: campaigns_pb2.CampaignConfig) -> None:
    c.domain.categorical_size = 16  # replaces the numeric domain (a oneof)


@pytest.mark.parametrize("top,grid,message", [
    ({}, {"variant": ITERATIVE, "max_iterations": 17}, "max_iterations"),
    # PARTITION: each report spends the whole epsilon, at most 20.
    ({"epsilon": 25.0}, {}, r"epsilon 25 .*\(0, 20\]"),
    # SPLIT: epsilon / R per report, R = 3 rounds for TREE, 2 for UNIFORM, max_iterations + 2 for ITERATIVE.
    ({"budget_policy": SPLIT, "epsilon": 61.0}, {"variant": TREE}, r"epsilon 20\.3.*\(0, 20\]"),
    ({"budget_policy": SPLIT, "epsilon": 41.0}, {}, r"epsilon 20\.5"),  # the default, DENSITY: R = 2
    ({"budget_policy": SPLIT, "epsilon": 41.0}, {"variant": UNIFORM}, r"epsilon 20\.5"),
    ({"budget_policy": SPLIT, "epsilon": 85.0}, {"variant": ITERATIVE, "max_iterations": 2}, r"epsilon 21\.25"),
    ({}, {"calibration_share": 1.5}, "calibration_share"),
    ({}, {"calibration_share": -0.1}, "calibration_share"),
    ({}, {"calibration_share": math.nan}, "calibration_share"),
    ({}, {"refinement_share": 1.0}, "refinement_share"),
    ({}, {"variant": TREE, "calibration_share": 0.5, "refinement_share": 0.45},
     r"calibration_share \+ grid.refinement_share"),
    ({}, {"refinement_share": 0.3}, "refinement_share must be 0 for the DENSITY"),  # the default variant
    ({}, {"granularity": GRID.PAPER}, "granularity PAPER does not apply to the DENSITY variant"),
    ({}, {"variant": UNIFORM, "refinement_share": 0.3}, "refinement_share must be 0 for the UNIFORM"),
    ({}, {"variant": DENSITY, "refinement_share": 0.3}, "refinement_share must be 0 for the DENSITY"),
    ({}, {"initial_cells_per_dimension": 3}, "initial_cells_per_dimension"),
    ({}, {"initial_cells_per_dimension": 12}, "initial_cells_per_dimension"),
    ({}, {"initial_cells_per_dimension": 1}, "initial_cells_per_dimension"),
    ({}, {"initial_cells_per_dimension": 128}, r"initial_cells_per_dimension.*max_cells \(4096\)"),
    ({}, {"max_cells": 64, "initial_cells_per_dimension": 16}, r"initial_cells_per_dimension.*max_cells \(64\)"),
    ({}, {"dense_threshold": 11.0}, r"dense_threshold must be in \(0, 10\]"),
    ({}, {"dense_threshold": -1.0}, "dense_threshold"),
    ({}, {"dense_threshold": math.inf}, "dense_threshold"),
    ({}, {"core_threshold": 10.5}, "core_threshold"),
    ({}, {"core_threshold": math.nan}, "core_threshold"),
    ({}, {"max_cells": 3}, r"max_cells must be in \[4, 1048576\]"),
    ({}, {"max_cells": 2**20 + 1}, "max_cells"),
    ({}, {"tree_height": 7}, r"tree_height must be in \[1, 6\]"),
])
def test_bad_parameters(top: dict[str, Any], grid: dict[str, Any], message: str) -> None:
    c = grid_config()
    for key, value in top.items():
        setattr(c, key, value)
    for key, value in grid.items():
        setattr(c.grid, key, value)
    with pytest.raises(InvalidArgumentError, match=message):
        prepare_campaign(config_from_proto(c))



@pytest.mark.parametrize(("d", "max_cells", "message"), [
    # More dimensions than any grid resolves: the limit is named, not an empty interval.
    (30, 0, r"a grid campaign resolves at most 20 dimensions.*2\^30 cells.*got d = 30"),
    (21, 2**20, r"at most 20 dimensions"),
    # Within the limit but above the default: the message says it is the default and what to set.
    (13, 0, r"grid.max_cells \(default 4096\) is below the 8192 cells.*set grid.max_cells \(--max-cells\) in \[8192, 1048576\]"),
    (13, 4096, r"grid.max_cells must be in \[8192, 1048576\] in dimension 13, got 4096"),
])
def test_dimension_beyond_the_grid_names_the_limit(d: int, max_cells: int, message: str) -> None:
    c = grid_config((0.0,) * d, (1.0,) * d, max_cells=max_cells)
    with pytest.raises(InvalidArgumentError, match=message):
        prepare_campaign(config_from_proto(c))


def test_the_largest_dimension_the_grid_resolves_is_accepted() -> None:
    prepared = prepare_campaign(config_from_proto(grid_config((0.0,) * 20, (1.0,) * 20, max_cells=2**20)))
    assert prepared.config.parameters.max_cells == 2**20

def test_bad_domain_and_parameter_kind() -> None:
    c = grid_config()
    categorical(c)
    with pytest.raises(InvalidArgumentError, match="grid campaign needs a numeric domain"):
        prepare_campaign(config_from_proto(c))
    c = grid_config()
    c.histogram.SetInParent()
    with pytest.raises(InvalidArgumentError, match="takes grid parameters"):
        prepare_campaign(config_from_proto(c))


@pytest.mark.parametrize("policy,epsilon,variant,extra", [
    (PARTITION, 20.0, TREE, {}),
    (SPLIT, 60.0, TREE, {}),
    (SPLIT, 40.0, UNIFORM, {}),
    (SPLIT, 100.0, ITERATIVE, {"max_iterations": 3}),
])
def test_largest_epsilon_per_round_is_accepted(policy: int, epsilon: float, variant: int,
                                               extra: dict[str, Any]) -> None:
    engine = engine_for(grid_config(epsilon=epsilon, policy=policy, variant=variant, **extra))
    assert engine.plan.round_epsilon == pytest.approx(20.0)


def test_defaults_are_filled_in() -> None:
    original = grid_config()
    prepared = prepare_campaign(config_from_proto(original))
    p = prepared.config.parameters
    assert p.variant == DENSITY == DEFAULT_VARIANT and p.granularity == GRID.CONSISTENT
    assert p.max_cells == DEFAULT_MAX_CELLS == 4096
    assert p.initial_cells_per_dimension == 16  # finest level with at most 256 cells in 2-d
    assert p.max_iterations == DEFAULT_MAX_ITERATIONS
    assert p.dense_threshold == DEFAULT_DENSE_Z and p.core_threshold == DEFAULT_CORE_Z
    assert p.calibration_share == pytest.approx(DEFAULT_CALIBRATION_SHARE)
    assert p.refinement_share == 0  # DENSITY reports once, on one grid: no refinement groups
    tree = prepare_campaign(config_from_proto(grid_config(variant=TREE))).config.parameters
    assert tree.refinement_share == pytest.approx(DEFAULT_REFINEMENT_SHARE)
    assert prepared.config.budget_policy == PARTITION
    assert original.grid.variant == GRID.VARIANT_UNSPECIFIED  # the input is not modified
    # The stored config round-trips to the same engine layout.
    again = engine_for(config_to_proto(prepared.config))
    assert again.plan == engine_for(original).plan and again.config == prepared.config
    # UNIFORM keeps a zero refinement share; other dimensions get their own calibration grid.
    assert prepare_campaign(config_from_proto(grid_config(variant=UNIFORM))).config.parameters.refinement_share == 0
    assert prepare_campaign(config_from_proto(grid_config((0, 0, 0), (1, 1, 1)))).config.parameters.initial_cells_per_dimension == 4
    assert prepare_campaign(config_from_proto(grid_config((0,), (1,)))).config.parameters.initial_cells_per_dimension == 256


@pytest.mark.parametrize("variant,policy,weights,round_epsilon", [
    (TREE, PARTITION, (2000, 1334, 1333, 1333, 4000), 4.0),
    (ITERATIVE, PARTITION, (2000, 1334, 1333, 1333, 4000), 4.0),
    (UNIFORM, PARTITION, (2000, 8000), 4.0),
    (TREE, SPLIT, (1, 1, 1), 4.0 / 3),
    (ITERATIVE, SPLIT, (1,), 4.0 / 5),
    (UNIFORM, SPLIT, (1,), 2.0),
    (DENSITY, PARTITION, (2000, 8000), 4.0),
    (DENSITY, SPLIT, (1,), 2.0),
])
def test_group_layout(variant: int, policy: int, weights: tuple[int, ...], round_epsilon: float) -> None:
    engine = engine_for(grid_config(variant=variant, policy=policy))
    assert engine.plan.weights == weights
    assert engine.plan.round_epsilon == pytest.approx(round_epsilon)
    spec = engine.first_round().spec
    assert spec.round == 1 and spec.kind == "grid" and spec.group_weights == weights
    (task,) = spec.tasks
    assert task.epsilon == pytest.approx(round_epsilon)
    (component,) = task.components
    assert component.encoder == GridTreeEncoder(domain=engine.domain, level=4)
    assert RoundSpec.unpack(spec.pack()) == spec


# --------------------------------------------------------------------------------------------------
# budget and rounds through the collector
# --------------------------------------------------------------------------------------------------

ROUNDS: dict[int, tuple[int, int]] = {UNIFORM: (2, 2), TREE: (3, 3), ITERATIVE: (3, DEFAULT_MAX_ITERATIONS + 2),
                                      DENSITY: (2, 2)}


@pytest.mark.parametrize("variant", list(VARIANTS.values()), ids=list(VARIANTS))
def test_partition_every_device_reports_once_and_weights_never_change(variant: int) -> None:
    run, specs = campaign("moons", 6000, 5, variant)
    assert run.result.state == campaigns_pb2.FINISHED
    low, high = ROUNDS[variant]
    assert low <= run.stats.rounds <= high and sorted(specs) == list(range(1, run.stats.rounds + 1))
    first = specs[1].group_weights
    reporting_rounds: dict[int, list[int]] = {g: [] for g in range(len(first))}
    for number, spec in specs.items():
        assert spec.group_weights == first and spec.max_reports_per_device == 1
        assert spec.campaign_epsilon == 4.0
        for task in spec.tasks:
            assert task.epsilon == pytest.approx(4.0)
            for g in task.groups:
                reporting_rounds[g].append(number)
    # Every group reports in exactly one round (unused refinement groups join the aggregation).
    assert all(len(rounds) == 1 for rounds in reporting_rounds.values()), reporting_rounds
    assert run.stats.epsilon_per_device == pytest.approx(4.0)
    assert run.stats.reports_sent == run.stats.accepted == 6000
    assert run.stats.refused == run.stats.rejected == 0
    assert sum(run.result.diagnostics[f"round_{r}_reports"] for r in specs) == 6000


@pytest.mark.parametrize("variant", list(VARIANTS.values()), ids=list(VARIANTS))
def test_split_every_device_reports_every_round_with_epsilon_over_r(variant: int) -> None:
    run, specs = campaign("moons", 3000, 6, variant, SPLIT)
    r = {int(UNIFORM): 2, int(TREE): 3, int(ITERATIVE): DEFAULT_MAX_ITERATIONS + 2, int(DENSITY): 2}[variant]
    rounds = run.stats.rounds
    low, high = ROUNDS[variant]
    assert low <= rounds <= high
    first = specs[1].group_weights
    for spec in specs.values():
        assert spec.group_weights == first and spec.max_reports_per_device == r
        covered = sorted(g for task in spec.tasks for g in task.groups)
        assert covered == list(range(len(first)))  # every device reports in every round
        assert all(task.epsilon == pytest.approx(4.0 / r) for task in spec.tasks)
    # Sequential composition: epsilon / R per round played (an early stop leaves the rest unspent).
    assert run.stats.epsilon_per_device == pytest.approx(4.0 * rounds / r)
    assert run.stats.mean_epsilon_per_device == pytest.approx(4.0 * rounds / r)
    assert run.stats.reports_sent == run.stats.accepted == 3000 * rounds and run.stats.refused == 0
    assert run.result.diagnostics["epsilon_per_report"] == pytest.approx(4.0 / r)


def test_tree_round_assigns_one_level_per_subgroup() -> None:
    run, specs = campaign("moons", 6000, 5, TREE)
    tree = specs[2]
    levels = [task.components[0].encoder.level for task in tree.tasks]  # type: ignore[attr-defined]
    diag = run.result.diagnostics
    level0, height = int(diag["granularity_level"]), int(diag["tree_height"])
    assert [task.groups for task in tree.tasks] == [(1,), (2,), (3,)]
    expected = list(range(level0, height + 1))
    assert levels == [expected[min(i, len(expected) - 1)] for i in range(3)]
    assert all(isinstance(task.components[0].encoder, GridTreeEncoder) for task in tree.tasks)
    aggregation = specs[3]
    assert isinstance(aggregation.tasks[0].components[0].encoder, CellListEncoder)
    assert aggregation.tasks[0].groups == (4,)


# --------------------------------------------------------------------------------------------------
# feedback: the next spec is computed from the reports
# --------------------------------------------------------------------------------------------------


def second_round(points: np.ndarray, variant: int, seed: int = 11) -> RoundOutcome:
    """Round 1 of a campaign whose calibration is clear-cut: 4 x 4 cells, half of the devices (4000 reports)."""
    engine = engine_for(grid_config(variant=variant, campaign_id="grid-feedback", initial_cells_per_dimension=4,
                                    calibration_share=0.5))
    plan = engine.first_round()
    reports = play(engine, plan.spec, Population(points, seed=seed, mode="direct"))
    return engine.close_round(plan.spec, reports, plan.engine_state)


@pytest.mark.parametrize("variant", [UNIFORM, TREE, ITERATIVE], ids=["uniform", "tree", "iterative"])
def test_round_two_depends_on_round_one_reports(variant: int) -> None:
    """Same campaign, same population size and seed: a tight blob and uniform points give different grids.

    The blob fills one of the 16 calibration cells (r = 1/16); uniform points put about half of the cells
    above the uniform share of 250 (r ~ 0.5). m* ~ r^(1/2) (sigma / 2N)^(1/3): the blob's grid is about
    sqrt(8) = 2.8 times finer, i.e. 1.5 levels (measured: level 5 vs. 3 for seeds 1..3).
    """
    blob = second_round(blob_points(8000, 1), variant)
    flat = second_round(uniform_points(8000, 1), variant)
    assert blob.next_round is not None and flat.next_round is not None
    assert blob.diagnostics["dense_share"] == 1 / 16 and flat.diagnostics["dense_share"] > 0.3
    assert blob.diagnostics["granularity_level"] >= flat.diagnostics["granularity_level"] + 1
    spec_blob, spec_flat = blob.next_round.spec, flat.next_round.spec
    assert spec_blob.round == spec_flat.round == 2
    assert spec_blob != spec_flat

    def coarsest(spec: RoundSpec) -> int:
        """The coarsest level a device reports in (the tree's first level, or the cell list's)."""
        levels = []
        for task in spec.tasks:
            encoder = task.components[0].encoder
            assert isinstance(encoder, (GridTreeEncoder, CellListEncoder))
            levels.append(encoder.level if isinstance(encoder, GridTreeEncoder)
                          else min(c.level for c in encoder.cells))
        return min(levels)

    assert coarsest(spec_blob) == blob.diagnostics["granularity_level"]
    assert coarsest(spec_flat) == flat.diagnostics["granularity_level"]
    # The engine is a pure function of its inputs: the same reports give the same next round.
    again = second_round(blob_points(8000, 1), variant)
    assert again.next_round == blob.next_round


def test_iterative_rounds_refine_where_the_data_is() -> None:
    """Round 3's cell list is irregular, and finer around the blob than far from it."""
    engine = engine_for(grid_config(variant=ITERATIVE, campaign_id="grid-iterative"))
    population = Population(blob_points(12_000, 2, center=(0.3, 0.6), scale=0.05), seed=3, mode="direct")
    plan = engine.first_round()
    outcome = engine.close_round(plan.spec, play(engine, plan.spec, population), plan.engine_state)
    assert outcome.next_round is not None
    spec2 = outcome.next_round.spec
    outcome = engine.close_round(spec2, play(engine, spec2, population), outcome.next_round.engine_state)
    assert outcome.next_round is not None
    encoder = outcome.next_round.spec.tasks[0].components[0].encoder
    assert isinstance(encoder, CellListEncoder)
    cells = list(encoder.cells)
    check_partition(cells, 2)
    levels = {c.level for c in cells}
    assert len(levels) > 1
    # The listed cell holding a point of the blob's edge is at least as fine as the one in an empty corner.
    # (The domain is the unit box, so normalized and original coordinates coincide.)
    def holding(point: tuple[float, float]) -> TreeCell:
        return next(c for c in cells if c == tree_cell_of(point, c.level))

    assert holding((0.95, 0.05)).level <= holding((0.3, 0.72)).level


# --------------------------------------------------------------------------------------------------
# degenerate rounds and corrupt state
# --------------------------------------------------------------------------------------------------


def test_aggregation_round_without_reports_is_all_noise_with_a_warning() -> None:
    engine = engine_for(grid_config(variant=UNIFORM, campaign_id="grid-empty"))
    plan = engine.first_round()
    population = Population(blob_points(4000, 4), seed=4, mode="direct")
    outcome = engine.close_round(plan.spec, play(engine, plan.spec, population), plan.engine_state)
    assert outcome.next_round is not None
    last = engine.close_round(outcome.next_round.spec, ListRoundReports([]), outcome.next_round.engine_state)
    result = last.result
    assert last.next_round is None and result is not None and result.state == campaigns_pb2.FINISHED
    cell_map = result.clustering.cell_map
    assert len(cell_map.labels) == len(cell_map.cells) > 0 and set(cell_map.labels) == {-1}
    assert result.clustering.k == 0 and list(cell_map.densities) == [0.0] * len(cell_map.cells)
    assert any("no reports" in w for w in result.warnings)
    assert any("no cluster was found" in w for w in result.warnings)
    assert last.diagnostics["aggregation_reports"] == 0 and last.diagnostics["round_2_reports"] == 0


def test_empty_calibration_and_tree_rounds_do_not_crash() -> None:
    engine = engine_for(grid_config(variant=TREE, campaign_id="grid-empty-tree"))
    plan = engine.first_round()
    outcome = engine.close_round(plan.spec, ListRoundReports([]), plan.engine_state)
    assert outcome.next_round is not None and outcome.diagnostics["dense_share"] == 1.0
    level0 = int(outcome.diagnostics["granularity_level"])
    spec = outcome.next_round.spec
    outcome = engine.close_round(spec, ListRoundReports([]), outcome.next_round.engine_state)
    assert outcome.next_round is not None  # nothing refined: the aggregation grid is the uniform first level
    encoder = outcome.next_round.spec.tasks[0].components[0].encoder
    assert isinstance(encoder, CellListEncoder)
    assert {c.level for c in encoder.cells} == {level0}
    last = engine.close_round(outcome.next_round.spec, ListRoundReports([]), outcome.next_round.engine_state)
    assert last.result is not None and set(last.result.clustering.cell_map.labels) == {-1}


@pytest.mark.parametrize("state,match", [
    (b"\xc1", "unreadable grid engine state"),
    (b"", "unreadable grid engine state"),
    (msgpack.packb([1, 2, 3]), "no phase"),
    (msgpack.packb({"leftover": []}), "no phase"),
    (msgpack.packb({"phase": "bogus"}), "unknown grid engine phase 'bogus'"),
])
def test_corrupt_engine_state_raises_protocol_error(state: bytes, match: str) -> None:
    engine = engine_for(grid_config(campaign_id="grid-corrupt"))
    spec = engine.first_round().spec
    with pytest.raises(ProtocolError, match=match):
        engine.close_round(spec, ListRoundReports([]), state)


def test_truncated_engine_state_raises_protocol_error() -> None:
    engine = engine_for(grid_config(campaign_id="grid-truncated"))
    plan = engine.first_round()
    with pytest.raises(ProtocolError, match="unreadable grid engine state"):
        engine.close_round(plan.spec, ListRoundReports([]), plan.engine_state[:-2])


@pytest.mark.parametrize("phase", ["tree", "iterate", "aggregate"])
def test_engine_state_missing_fields_raises_protocol_error(phase: str) -> None:
    engine = engine_for(grid_config(campaign_id="grid-partial"))
    spec = engine.first_round().spec
    with pytest.raises(ProtocolError):
        engine.close_round(spec, ListRoundReports([]), msgpack.packb({"phase": phase}))


# --------------------------------------------------------------------------------------------------
# end to end: moons and circles, n = 20 000, epsilon = 4
# --------------------------------------------------------------------------------------------------

E2E_N, E2E_SEED = 20_000, 1
# ARI of the default configuration (PARTITION, epsilon 4, n = 20 000), measured with seeds 0..19 before
# writing this test (same code path as `campaign`):
#   seeds 0..9         0     1     2     3     4     5     6     7     8     9
#   moons   UNIFORM   1.000  .992 1.000 1.000  .999 1.000 1.000  .999  .998 1.000
#   moons   TREE       .308  .495  .771  .314  .530  .501  .617  .664  .502  .580
#   moons   ITERATIVE  .800  .521  .285  .753  .393  .444  .782  .412  .742  .953
#   circles UNIFORM    .811  .183  .353  .244  .392  .997  .186  .999  .997  .992
#   circles TREE       .636  .612  .170  .620  .205  .357  .256  .578  .289  .251
#   circles ITERATIVE  .364  .901  .110  .659  .412  .521  .719  .413  .402  .719
#   seeds 10..19      10    11    12    13    14    15    16    17    18    19
#   moons   UNIFORM   1.000 1.000  .999 1.000  .999  .999  .999  .999 1.000  .594
#   moons   TREE       .575  .634  .604  .344  .605  .489  .341  .656  .417  .716
#   moons   ITERATIVE  .497  .877  .632  .440  .486  .680  .489  .999  .706  .695
#   circles UNIFORM    .995  .654  .000  .999  .311  .998  .643  .000  .262  .176
#   circles TREE       .262  .198  .287  .773  .266  .661  .192  .628  .159  .365
#   circles ITERATIVE  .833  .686  .501  .711  .352  .679  .328  .282  .288  .367
# This test runs seed 1 (.992 .495 .521 / .183 .612 .901). The floors sit below the smallest value of the
# first ten seeds, so a change that only reshuffles the random draws rarely trips them; two failure modes
# still reach below them on other seeds: the consistent granularity level rounds to 5 (1024 cells) instead
# of 4 and the clusters fragment (moons seed 19, circles seeds 1, 2, 6, 14, 18, 19), and false-positive
# dense cells bridge the two rings into one cluster (circles seeds 12, 17: ARI 0). The refining variants
# are far from DESIGN.md's "must come out right" (see test_tree_refinement_does_not_lose_the_moons).
ARI_FLOORS: dict[tuple[str, int], float] = {
    ("moons", UNIFORM): 0.9, ("moons", TREE): 0.2, ("moons", ITERATIVE): 0.2,
    ("circles", UNIFORM): 0.1, ("circles", TREE): 0.1, ("circles", ITERATIVE): 0.05,
    # DENSITY, seeds 0..9: moons .972 .913 .986 1.000 .977 .996 .996 .787 1.000 .999,
    # circles .586 .594 .566 .686 .576 .569 .569 .632 .708 .592 (the outer ring is thin at this n).
    ("moons", DENSITY): 0.75, ("circles", DENSITY): 0.5,
}


@pytest.mark.parametrize("name,variant", list(ARI_FLOORS), ids=[f"{n}-{v}" for n, v in
                                                               (("moons", "uniform"), ("moons", "tree"),
                                                                ("moons", "iterative"), ("circles", "uniform"),
                                                                ("circles", "tree"), ("circles", "iterative"),
                                                                ("moons", "density"), ("circles", "density"))])
def test_end_to_end_clustering(name: str, variant: int) -> None:
    run, specs = campaign(name, E2E_N, E2E_SEED, variant)
    x, labels = dataset(name, E2E_N, E2E_SEED)
    result = run.result
    assert result.state == campaigns_pb2.FINISHED
    scores = evaluate_clustering(result, x, labels)
    assert scores["ari"] >= ARI_FLOORS[(name, variant)], scores
    low, high = ROUNDS[variant]
    assert low <= run.stats.rounds <= high

    # The cell map: a partition of the box, one label, density and SE per cell.
    clustering = result.clustering
    cell_map = clustering.cell_map
    cells = cells_of(result)
    check_partition(cells, 2)
    assert len(cells) <= DEFAULT_MAX_CELLS
    assert len(cell_map.labels) == len(cell_map.densities) == len(cell_map.density_std_errors) == len(cells)
    k = clustering.k
    assert k >= 1 and clustering.dimension == 2 and len(clustering.weights) == k
    assert set(cell_map.labels) - {-1} == set(range(k))
    assert all(math.isfinite(v) for v in cell_map.densities)
    assert all(se > 0 and math.isfinite(se) for se in cell_map.density_std_errors)
    assert 0 < sum(clustering.weights) <= 1.2
    lower, upper = numeric_bounds(x)
    assert tuple(cell_map.domain.lower) == lower and tuple(cell_map.domain.upper) == upper
    # The aggregation round's estimates: one per cell.
    assert [e.value for e in result.estimates.estimates] == list(range(len(cells)))

    # Diagnostics of every round.
    diag = result.diagnostics
    for key in ("calibration_reports", "calibration_level", "dense_share", "granularity_paper",
                "granularity_consistent", "granularity_level", "population_estimate", "aggregation_reports",
                "final_cells", "clusters", "dense_cells", "core_cells", "border_cells", "noise_cells",
                "epsilon_per_report", "variant", "granularity_rule"):
        assert key in diag, key
    for r in range(1, run.stats.rounds + 1):
        assert diag[f"round_{r}_reports"] > 0
    assert sum(diag[f"round_{r}_reports"] for r in range(1, run.stats.rounds + 1)) == E2E_N
    assert diag["calibration_level"] == 4 and diag["variant"] == variant
    assert diag["granularity_rule"] == GRID.CONSISTENT
    assert diag["final_cells"] == len(cells) and diag["clusters"] == k
    assert diag["aggregation_reports"] == result.estimates.reports
    assert 0 < diag["dense_share"] <= 1
    if variant == DENSITY:  # the level the noise affords, not the consistent side
        assert 1 <= diag["occupied_calibration_cells"] <= 256 and 1 <= diag["granularity_level"] <= 6
        assert diag["modes"] >= diag["clusters"] and diag["dense_z"] > 0
    else:
        assert diag["granularity_level"] == level_for_side(diag["granularity_consistent"], 2, max_level=6)
    assert diag["granularity_paper"] < 1e-3  # Theorem 1 as printed: absurdly fine, unused by default
    assert diag["population_estimate"] == pytest.approx(E2E_N, rel=0.1)
    if variant == TREE:
        assert "tree_height" in diag and f"tree_level_{int(diag['granularity_level'])}_candidates" in diag
    if variant == ITERATIVE:
        assert 1 <= diag["iterations"] <= DEFAULT_MAX_ITERATIONS and "iteration_1_cells" in diag
    if variant in (UNIFORM, DENSITY):
        assert {c.level for c in cells} == {int(diag["granularity_level"])}


@pytest.mark.parametrize("name,variant", [("moons", UNIFORM), ("moons", TREE), ("circles", ITERATIVE)],
                         ids=["moons-uniform", "moons-tree", "circles-iterative"])
def test_densities_estimate_the_true_cell_shares(name: str, variant: int) -> None:
    """Published densities, times the cell volume, against the true share of the points in each cell.

    z = (estimate - truth) / SE over the cells: a wrong scale in the pooling of the refinement estimates
    (share vs. relative density, the wrong report count) would shift or inflate z. The truth is the
    whole population's share while the estimate comes from a random part of it (sampling variance
    p (1 - p) / n_C not in the SE, up to ~15 % of the variance here): hence the loose RMS band.
    """
    run, _ = campaign(name, E2E_N, E2E_SEED, variant)
    x, _ = dataset(name, E2E_N, E2E_SEED)
    cell_map = run.result.clustering.cell_map
    domain = NumericDomain(lower=tuple(cell_map.domain.lower), upper=tuple(cell_map.domain.upper))
    encoder = CellListEncoder(domain=domain, cells=tuple(cells_of(run.result)))
    truth = np.bincount([encoder.encode(tuple(p)) for p in x.tolist()], minlength=len(cell_map.cells)) / len(x)
    volumes = np.array([2.0 ** (-2 * c.level) for c in cell_map.cells])
    shares = np.array(cell_map.densities) * volumes
    se = np.array(cell_map.density_std_errors) * volumes
    z = (shares - truth) / se
    # Measured at seed 1 (mean, RMS over 256..1861 cells): moons uniform .088 1.046, moons tree -.016 .984,
    # circles iterative -.011 .993. Bounds: 5.5 SE of the mean of independent unit z (5 SE, inflated for the
    # unmodelled sampling variance), and RMS^2 within about 5 of its standard deviations sqrt(2 / cells).
    cells = len(z)
    assert abs(float(z.mean())) <= 5.5 / math.sqrt(cells), float(z.mean())
    assert 0.75 < float(np.sqrt(np.mean(z**2))) < 1.35, float(np.sqrt(np.mean(z**2)))


@pytest.mark.parametrize("name", ["moons", "circles"])
def test_density_estimates_are_pooled_with_the_calibration_round(name: str) -> None:
    """DENSITY publishes the aggregation counts made consistent with the calibration round's: unbiased
    against the true cell counts (scaled to the aggregation's reports), with standard errors that say so,
    and smaller than the oracle's alone (the diagnostic ratio). Bounds as in the test above: 5.5 SE of
    the mean of the z, RMS within about 5 of its standard deviations (sampling variance not in the SE).
    """
    run, _ = campaign(name, E2E_N, E2E_SEED, DENSITY)
    x, _ = dataset(name, E2E_N, E2E_SEED)
    result = run.result
    cell_map = result.clustering.cell_map
    domain = NumericDomain(lower=tuple(cell_map.domain.lower), upper=tuple(cell_map.domain.upper))
    encoder = CellListEncoder(domain=domain, cells=tuple(cells_of(result)))
    reports = result.estimates.reports
    truth = np.bincount([encoder.encode(tuple(p)) for p in x.tolist()], minlength=len(cell_map.cells)) * (
        reports / len(x))
    counts = np.array([e.count for e in result.estimates.estimates])
    se = np.array([e.std_error for e in result.estimates.estimates])
    z = (counts - truth) / se
    assert abs(float(z.mean())) <= 5.5 / math.sqrt(len(z)), float(z.mean())
    assert 0.75 < float(np.sqrt(np.mean(z**2))) < 1.35, float(np.sqrt(np.mean(z**2)))
    # Level 4 or 5 from a level-4 calibration at n = 20 000: K = 1 or 4 fine cells per coarse cell and
    # tau^2 = 4 sigma^2, so the error falls to sqrt(4 / 5) or sqrt(7 / 8) of the oracle's.
    assert result.diagnostics["calibration_pooled_std_error_ratio"] < 0.95


def test_density_splits_a_mode_of_two_overlapping_gaussians() -> None:
    """Two of the sheared blobs of ``aniso`` (seed 3, n = 1e5, epsilon = 4) overlap without a density
    valley: the density step finds two modes, and the Gaussian-mixture test splits the larger into its
    two components (ARI 0.57 with the two modes alone)."""
    run, _ = campaign("aniso", 100_000, 3, DENSITY)
    x, labels = dataset("aniso", 100_000, 3)
    diag = run.result.diagnostics
    assert diag["modes"] == 2 and diag["gaussian_modes_split"] == 1 and diag["clusters"] == 3, diag
    assert diag["gaussian_mixture_components"] == 3
    assert math.isfinite(diag["gaussian_mixture_chi2_excess_z"])
    scores = evaluate_clustering(run.result, x, labels)
    assert scores["clusters"] == 3 and scores["ari"] >= 0.9, scores


@pytest.mark.xfail(strict=True, reason=(
    "QUALITY BUG vs DESIGN.md §7.2 ('moons, circles must come out right'): the TREE refinement starts at the "
    "granularity level L0 and refines sparse edge cells to L0+1, L0+2, which the aggregation group can never "
    "find dense (expected count ~10 per level-6 cell vs 2 SE ~ 50), so the moons break into pieces: default "
    "TREE on moons (n=20000, eps=4, seed 1) gives ARI 0.495 with 5 clusters, while the same config with "
    "tree_height = L0 (no refinement) gives ARI ~1.0 with 2"))
def test_tree_refinement_does_not_lose_the_moons() -> None:
    run, _ = campaign("moons", E2E_N, E2E_SEED, TREE)
    x, labels = dataset("moons", E2E_N, E2E_SEED)
    scores = evaluate_clustering(run.result, x, labels)
    assert scores["clusters"] == 2 and scores["ari"] >= 0.9, scores


def test_tree_without_refinement_finds_the_moons() -> None:
    """Control for the xfail above: tree_height = L0 (one level, nothing refined) clusters the moons."""
    run, _ = campaign("moons", E2E_N, E2E_SEED, TREE, extra=(("tree_height", 4),))
    assert run.result.diagnostics["granularity_level"] == 4 and run.result.diagnostics["tree_height"] == 4
    x, labels = dataset("moons", E2E_N, E2E_SEED)
    scores = evaluate_clustering(run.result, x, labels)
    assert scores["clusters"] == 2 and scores["ari"] >= 0.9, scores


# --------------------------------------------------------------------------------------------------
# pooling the refinement estimates into the aggregation
# --------------------------------------------------------------------------------------------------


def test_pool_prior_is_the_inverse_variance_mean() -> None:
    cells = [TreeCell(level=1, morton_index=i) for i in range(4)]
    n = 1000
    counts = np.array([100.0, 200.0, 300.0, 400.0])
    se = np.array([20.0, 25.0, 30.0, 35.0])
    prior = [
        [1, 0, 0.12, 1e-4],            # pooled
        [1, 2, 0.25, 4e-4],            # pooled
        [1, 3, 0.50, 0.0],             # no weight: ignored
        [2, 0, 0.99, 1e-4],            # not a listed cell: ignored
    ]
    pooled, pooled_se, count = _pool_prior(cells, counts, se, n, prior)
    assert count == 2
    for i, p, v in ((0, 0.12, 1e-4), (2, 0.25, 4e-4)):
        share, var = counts[i] / n, (se[i] / n) ** 2
        w_old, w_new = 1 / v, 1 / var
        assert pooled[i] == pytest.approx(n * (p * w_old + share * w_new) / (w_old + w_new), rel=1e-12)
        assert pooled_se[i] == pytest.approx(n / math.sqrt(w_old + w_new), rel=1e-12)
        assert pooled_se[i] < min(se[i], n * math.sqrt(v))
    for i in (1, 3):
        assert pooled[i] == pytest.approx(counts[i]) and pooled_se[i] == pytest.approx(se[i])
    # The inputs are not modified.
    assert counts.tolist() == [100.0, 200.0, 300.0, 400.0] and se.tolist() == [20.0, 25.0, 30.0, 35.0]


def test_pool_prior_is_unbiased_with_the_inverse_variance_variance() -> None:
    """4096 independent cells with the same true share; unbiased normal inputs with known variances.

    Mean: |mean - truth| <= 5 SE of the mean (false failure 5.7e-7). Variance: the sample variance
    against the pooled SE by a two-sided chi-square test at 1e-6 (4095 degrees of freedom).
    """
    rng = np.random.default_rng(20240607)
    cells = [TreeCell(level=6, morton_index=i) for i in range(4096)]
    n, p = 8000, 0.004  # true count 32
    sd_count = 25.0  # aggregation: count SE
    sd_share = 0.008  # refinement: share SE (a smaller group, noisier: 64 counts on this scale)
    counts = rng.normal(n * p, sd_count, size=len(cells))
    shares = rng.normal(p, sd_share, size=len(cells))
    prior = [[6, i, float(s), sd_share**2] for i, s in enumerate(shares)]
    pooled, pooled_se, count = _pool_prior(cells, counts, np.full(len(cells), sd_count), n, prior)
    assert count == len(cells)
    expected_se = n / math.sqrt(1 / sd_share**2 + n**2 / sd_count**2)
    np.testing.assert_allclose(pooled_se, expected_se, rtol=1e-12)
    assert abs(float(pooled.mean()) - n * p) <= Z_UNBIASED * expected_se / math.sqrt(len(cells))
    dof = len(cells) - 1
    stat = float(((pooled - pooled.mean()) ** 2).sum()) / expected_se**2
    assert chi2_sf(stat, dof) >= 0.5e-6 and 1 - chi2_sf(stat, dof) >= 0.5e-6, stat / dof
    # Negative control: the plain average of the two estimates is unbiased too but has a larger variance.
    # (variance (25^2 + 64^2) / 4 = 1180 against 1 / (1/25^2 + 1/64^2) = 542).
    plain = (counts + n * shares) / 2
    assert float(plain.var()) > 1.5 * expected_se**2


@pytest.mark.parametrize("variant,policy", [(TREE, PARTITION), (ITERATIVE, SPLIT)], ids=["tree-partition",
                                                                                        "iterative-split"])
def test_published_estimates_match_the_densities(variant: int, policy: int) -> None:
    # The same runs as the budget tests above.
    run, _ = campaign("moons", 6000, 5, variant) if policy == PARTITION else campaign("moons", 3000, 6, variant, SPLIT)
    check_estimates_match_densities(run.result)


@pytest.mark.parametrize("variant,policy", [(UNIFORM, PARTITION), (TREE, SPLIT)], ids=["uniform-partition",
                                                                                      "tree-split"])
def test_published_estimates_match_the_densities_when_consistent(variant: int, policy: int) -> None:
    run, _ = campaign("moons", 6000, 5, variant) if policy == PARTITION else campaign("moons", 3000, 6, variant, SPLIT)
    check_estimates_match_densities(run.result)


def check_estimates_match_densities(result: Result) -> None:
    cell_map = result.clustering.cell_map
    n = result.estimates.reports
    volumes = np.array([2.0 ** (-2 * c.level) for c in cell_map.cells])
    counts = np.array([e.count for e in result.estimates.estimates])
    se = np.array([e.std_error for e in result.estimates.estimates])
    np.testing.assert_allclose(counts, np.array(cell_map.densities) * n * volumes, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(se, np.array(cell_map.density_std_errors) * n * volumes, rtol=1e-9, atol=1e-9)


def test_a_corrupt_calibration_state_is_refused_with_a_reason() -> None:
    """A stored DENSITY state whose calibration grid does not match its level is a ProtocolError, not a crash."""
    from ldp_client.errors import ProtocolError
    from ldp_collector.estimation.grid_clustering import uniform_cells
    from ldp_collector.kinds.grid import _pool_calibration

    cells = uniform_cells(3, 2)
    state = {"level": 2, "reports": 10.0, "counts": np.ones(15).tobytes(), "std_errors": np.ones(16).tobytes()}
    with pytest.raises(ProtocolError, match="unreadable grid engine state: a calibration grid of 15 counts"):
        _pool_calibration(cells, np.ones(64), np.ones(64), 100, 2, state)
    good = {**state, "counts": np.full(16, 25.0).tobytes()}
    pooled, se = _pool_calibration(cells, np.ones(64), np.ones(64), 100, 2, good)
    assert pooled.shape == se.shape == (64,) and (se < 1.0).all()
