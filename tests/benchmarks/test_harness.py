"""The harness: adapter registry, the matrix, one run, the checks, regressions and the entry point."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from harness import adapters, runner
from harness.adapters import ADAPTERS, ProtocolAdapter, get_adapter, register_adapter
from harness.baselines import Clustering
from harness.runner import Cell, RunRecord, Task, aggregate, build_tasks, check_bounds, check_claims
from harness.suites import (
    CENTER_CAMPAIGNS,
    GRID_PROTOCOLS,
    SUITES,
    Block,
    Bound,
    Claim,
    DatasetCase,
    Suite,
    epsilon_label,
)

TINY = DatasetCase(name="blobs", d=2, k=3)
TINY_3D = DatasetCase(name="blobs", d=3, k=3)


@pytest.fixture
def in_process() -> Iterator[None]:
    adapters.configure_remote(None, None)
    yield
    adapters.configure_remote(None, None)


class _Broken(ProtocolAdapter):
    name = "test-broken"
    description = "raises"
    privacy = "ldp"
    data_kinds = frozenset({"nd"})

    def run(self, x: np.ndarray, k: int, epsilon: float | None, seed: int, via_grpc: bool = False) -> Clustering:
        raise RuntimeError("deliberately broken")


@pytest.fixture
def broken() -> Iterator[str]:
    register_adapter(_Broken)
    yield _Broken.name
    ADAPTERS.pop(_Broken.name)


def _suite(blocks: tuple[Block, ...], **kwargs: object) -> Suite:
    # The test blocks run seeds 0 .. 9: those are the reporting seeds here, unless a test says otherwise.
    kwargs.setdefault("tuning_seeds", tuple(range(50, 60)))
    kwargs.setdefault("reporting_seeds", tuple(range(10)))
    return Suite(name="tiny", description="test suite", blocks=blocks, **kwargs)  # type: ignore[arg-type]


# -- adapters -----------------------------------------------------------------------------------------

def test_every_baseline_is_registered_once_with_valid_metadata() -> None:
    expected = {"kmeans++", "kmeans-random", "dbscan", "density-am-kmeans", "dplloyd", "dpqt-kmeans",
                "improved-dp-kmeans", "ldp-laplace-points", "ldp-oue-grid", *GRID_PROTOCOLS,
                *CENTER_CAMPAIGNS}
    assert expected <= set(ADAPTERS)
    for name, cls in ADAPTERS.items():
        assert cls.name == name
        assert cls.privacy in ("non-private", "central-dp", "ldp")
        assert cls.description
    assert ADAPTERS["ldp-oue-grid"].uses_collector
    assert not ADAPTERS["dbscan"].has_centers
    for name in GRID_PROTOCOLS:
        grid = ADAPTERS[name]
        assert grid.privacy == "ldp" and grid.data_kinds == frozenset({"nd"}) and grid.uses_collector
        assert not grid.has_centers and not grid.noiseless_bypass and grid.max_dimension == 12
    for name in CENTER_CAMPAIGNS:
        campaign = ADAPTERS[name]
        assert campaign.privacy == "ldp" and campaign.data_kinds == frozenset({"nd"}) and campaign.uses_collector
        assert campaign.has_centers and not campaign.noiseless_bypass and campaign.max_dimension is None
    no_bypass = {*GRID_PROTOCOLS, *CENTER_CAMPAIGNS}
    assert all(cls.noiseless_bypass for name, cls in ADAPTERS.items() if name not in no_bypass)


@pytest.mark.parametrize("name", CENTER_CAMPAIGNS)
def test_center_campaign_adapters_run_through_the_in_process_collector(name: str, in_process: None) -> None:
    from ldp_collector.simulation.datasets import make_dataset

    # The LSH-tree protocols detect nothing at n = 300 (their node counts' noise exceeds a cluster): they
    # get the smallest setting where they find 3 clusters.
    n, epsilon = (6000, 8.0) if name in ("nettree", "stemmer") else (300, 2.0)
    x, _ = make_dataset("blobs", n, seed=0, d=2, k=3)
    out = get_adapter(name).run(x, 3, epsilon, seed=0)
    assert out.labels is None and out.centers is not None and out.centers.shape == (3, 2)
    assert np.isfinite(out.centers).all()
    lower, upper = x.min(axis=0), x.max(axis=0)
    assert ((out.centers >= lower - 1e-9) & (out.centers <= upper + 1e-9)).all()  # original units, in the box
    assert out.diagnostics["reports"] == out.diagnostics["accepted"] >= n
    assert out.diagnostics["epsilon_per_device"] == pytest.approx(epsilon)
    assert out.diagnostics["via_grpc"] == 0.0
    with pytest.raises(ValueError, match="no no-noise bypass"):
        get_adapter(name).run(x, 3, math.inf, seed=0)


def test_center_campaigns_are_in_standard_and_full_but_not_smoke() -> None:
    for suite, present in (("smoke", False), ("standard", True), ("full", True)):
        tasks = build_tasks(SUITES[suite])
        protocols = {t.protocol for t in tasks}
        assert set(CENTER_CAMPAIGNS) <= protocols if present else not set(CENTER_CAMPAIGNS) & protocols
        assert not any(t.protocol in CENTER_CAMPAIGNS and t.epsilon is not None and math.isinf(t.epsilon)
                       for t in tasks)
    standard = build_tasks(SUITES["standard"])
    for dataset in ("blobs(d=2,k=4)", "moons", "circles"):  # beside the grid protocols and, where centers apply, the floors
        cells = {t.protocol for t in standard if t.dataset.label == dataset and t.epsilon == 1.0 and t.n == 20_000}
        assert set(CENTER_CAMPAIGNS) | set(GRID_PROTOCOLS) <= cells, dataset


def test_registering_a_second_adapter_under_a_taken_name_fails() -> None:
    class Clash(_Broken):
        name = "dplloyd"

    with pytest.raises(ValueError, match="two adapters named 'dplloyd'"):
        register_adapter(Clash)

    class NoKinds(_Broken):
        name = "test-no-kinds"
        data_kinds = frozenset({"3d"})

    with pytest.raises(ValueError, match="data_kinds"):
        register_adapter(NoKinds)


def test_data_kinds_keep_the_quadtree_to_2d() -> None:
    quadtree = get_adapter("dpqt-kmeans")
    assert quadtree.supports(np.zeros((5, 2)))
    assert not quadtree.supports(np.zeros((5, 3)))
    assert get_adapter("dplloyd").supports(np.zeros((5, 7)))
    grid = get_adapter("ldp-oue-grid")
    assert grid.supports(np.zeros((5, 14))) and not grid.supports(np.zeros((5, 15)))  # 2^d cells at least
    with pytest.raises(ValueError, match="unknown protocol"):
        get_adapter("nope")


def test_private_adapters_refuse_a_missing_epsilon() -> None:
    x = np.random.default_rng(0).normal(size=(50, 2))
    with pytest.raises(ValueError, match="epsilon must be a number"):
        get_adapter("dplloyd").run(x, 2, None, 0)


# -- the matrix ---------------------------------------------------------------------------------------

def test_build_tasks_deduplicates_and_skips_unsupported_data() -> None:
    suite = _suite((
        Block(protocols=("kmeans++", "dplloyd", "dpqt-kmeans"), datasets=(TINY, TINY_3D), epsilons=(0.5, math.inf),
              ns=(300,), seeds=(0, 1)),
        Block(protocols=("dplloyd",), datasets=(TINY,), epsilons=(0.5,), ns=(300,), seeds=(0,)),  # duplicates
    ))
    tasks = build_tasks(suite)
    keys = [t.key for t in tasks]
    assert len(keys) == len(set(keys))
    # kmeans++: one task per data set and seed (no epsilon); dplloyd: 2 eps; dpqt: 2-D only.
    assert sum(t.protocol == "kmeans++" for t in tasks) == 4
    assert all(t.epsilon is None for t in tasks if t.protocol == "kmeans++")
    assert sum(t.protocol == "dplloyd" for t in tasks) == 8
    assert sum(t.protocol == "dpqt-kmeans" for t in tasks) == 4
    assert all(t.dataset == TINY for t in tasks if t.protocol == "dpqt-kmeans")
    assert build_tasks(suite, protocols=["dplloyd"]) and all(
        t.protocol == "dplloyd" for t in build_tasks(suite, protocols=["dplloyd"]))
    with pytest.raises(ValueError, match="unknown protocol"):
        build_tasks(_suite((Block(protocols=("nope",), datasets=(TINY,), epsilons=(1.0,), ns=(10,), seeds=(0,)),)))


def test_build_tasks_leaves_methods_without_a_bypass_out_of_the_inf_column() -> None:
    suite = _suite((Block(protocols=("ugc", "agc-tree", "ldp-oue-grid"), datasets=(TINY,), epsilons=(1.0, math.inf),
                          ns=(300,), seeds=(0,)),))
    tasks = build_tasks(suite)
    assert sorted((t.protocol, epsilon_label(t.epsilon)) for t in tasks) == [
        ("agc-tree", "1"), ("ldp-oue-grid", "1"), ("ldp-oue-grid", "inf"), ("ugc", "1")]


def test_grid_adapters_run_score_and_refuse_inf(in_process: None) -> None:
    moons = DatasetCase(name="moons")
    record = runner.run_task(Task(protocol="agc-iter", dataset=moons, n=1500, epsilon=8.0, seed=0, keep_labels=True),
                             reference=runner.reference_cost(moons, 1500, 0))
    assert record.error is None, record.error
    assert {"ari", "nmi", "f_measure", "noise_share"} <= set(record.metrics) and "cost_ratio" not in record.metrics
    assert record.centers is None and record.labels is not None and record.labels.shape == (1500,)
    assert record.cell_map is not None and record.diagnostics["via_grpc"] == 0.0
    assert record.diagnostics["rounds"] >= 3 and record.diagnostics["final_cells"] > 0
    assert "cell_map" not in record.to_json()
    json.dumps(record.to_json())
    x = runner.dataset(moons, 200, 0)[0]
    for name in ("ugc", "agc-tree", "agc-iter"):
        with pytest.raises(ValueError, match="no no-noise bypass"):
            get_adapter(name).run(x, 2, math.inf, 0)
    with pytest.raises(ValueError, match="epsilon must be a number"):
        get_adapter("ugc").run(x, 2, None, 0)


def test_run_task_scores_a_run_and_captures_errors(in_process: None, broken: str) -> None:
    ok = runner.run_task(Task(protocol="dpqt-kmeans", dataset=TINY, n=600, epsilon=1.0, seed=0, keep_labels=True),
                         reference=runner.reference_cost(TINY, 600, 0))
    assert ok.error is None
    assert {"ari", "nmi", "f_measure", "cost_ratio", "cost_per_point", "nicv"} <= set(ok.metrics)
    assert ok.labels is not None and ok.labels.shape == (600,)
    assert ok.centers is not None and len(ok.centers) == 3
    json.dumps(ok.to_json())  # JSON-ready
    failed = runner.run_task(Task(protocol=broken, dataset=TINY, n=600, epsilon=1.0, seed=0), reference=1.0)
    assert failed.error is not None and "deliberately broken" in failed.error
    labels_only = runner.run_task(Task(protocol="dbscan", dataset=TINY, n=600, epsilon=None, seed=0), reference=1.0)
    assert labels_only.error is None and "cost_ratio" not in labels_only.metrics


# -- checks -------------------------------------------------------------------------------------------

def _cell(protocol: str, epsilon: str, **metrics: float) -> Cell:
    return Cell(protocol=protocol, dataset="d", n=10, epsilon=epsilon, seeds=1, median=dict(metrics),
                q1=dict(metrics), q3=dict(metrics), values={k: [v] for k, v in metrics.items()}, seconds=0.0)


def test_claims_compare_medians_with_the_margin() -> None:
    cells = {c.key: c for c in (_cell("a", "0.5", cost=1.0, f=0.80), _cell("b", "0.5", cost=2.0, f=0.83),
                                _cell("c", "-", f=0.84))}
    lower = Claim(id="x", source="s", statement="a beats b", better="a", worse="b", metric="cost",
                  lower_is_better=True, datasets=("d",), ns=(10,), epsilon_pairs=((0.5, 0.5),))
    close = Claim(id="y", source="s", statement="a close to c", better="a", worse="c", metric="f",
                  lower_is_better=False, datasets=("d",), ns=(10,), epsilon_pairs=((0.5, None),), margin=0.05)
    strict = Claim(id="z", source="s", statement="a above b", better="a", worse="b", metric="f",
                   lower_is_better=False, datasets=("d",), ns=(10,), epsilon_pairs=((0.5, 0.5), (1.0, 1.0)))
    results = {r.id: r for r in check_claims([lower, close, strict], cells)}
    assert results["x"].passed and results["y"].passed and not results["z"].passed
    assert len(check_claims([strict], cells)) == 1  # the missing epsilon = 1 cell is skipped


def _record(protocol: str, epsilon: str, seed: int, **metrics: float) -> RunRecord:
    return RunRecord(protocol=protocol, dataset="d", n=10, d=2, k=2, epsilon=epsilon, seed=seed, via_grpc=False,
                     seconds=0.1, metrics=dict(metrics))


def test_bounds_apply_to_every_run() -> None:
    bound = Bound(id="b", statement="s", protocols=("p",), datasets=("d",), epsilon=math.inf, metric="m",
                  maximum=1.02)
    good = [_record("p", "inf", s, m=1.0 + s / 100) for s in range(3)]
    assert all(c.passed for c in check_bounds([bound], good))
    bad = good + [_record("p", "inf", 9, m=1.05)]
    assert not check_bounds([bound], bad)[0].passed
    cells = aggregate(good)
    assert cells[("p", "d", 10, "inf")].median["m"] == pytest.approx(1.01)


def test_a_bound_without_any_run_fails_instead_of_passing_silently() -> None:
    bound = Bound(id="b", statement="s", protocols=("p", "q"), datasets=("d",), epsilon=math.inf, metric="m",
                  maximum=1.02)
    runs = [_record("p", "inf", s, m=1.0) for s in range(3)]
    checks = check_bounds([bound], runs)
    missing = [c for c in checks if "q on d" in c.detail]
    assert len(missing) == 1 and not missing[0].passed and missing[0].required
    assert "no successful run to check" in missing[0].detail
    # A run cut by --protocols or --ns reports the missing cell without failing the suite.
    [cut] = [c for c in check_bounds([bound], runs, complete=False) if "q on d" in c.detail]
    assert not cut.passed and not cut.required


def test_regressions_record_and_detect(tmp_path: Path) -> None:
    suite = _suite((), regression_metrics=("cost_ratio", "ari"))
    cells = {c.key: c for c in (_cell("p", "1", cost_ratio=2.0, ari=0.8),)}
    path = tmp_path / "regressions.json"
    assert runner.record_regressions(suite, cells, path) == 2
    assert all(c.passed for c in runner.check_regressions(suite, cells, path))
    worse = {c.key: c for c in (_cell("p", "1", cost_ratio=2.5, ari=0.8),)}
    failed = [c for c in runner.check_regressions(suite, worse, path) if not c.passed]
    assert len(failed) == 1 and "cost_ratio" in failed[0].detail
    better = {c.key: c for c in (_cell("p", "1", cost_ratio=1.5, ari=0.95),)}
    assert all(c.passed for c in runner.check_regressions(suite, better, path))
    missing = runner.check_regressions(suite, {}, path)
    assert missing and not any(c.passed for c in missing)
    assert not runner.check_regressions(suite, {}, path, complete=False)


def _seeds_cell(protocol: str, **values: list[float]) -> Cell:
    return Cell(protocol=protocol, dataset="d", n=10, epsilon="8", seeds=len(next(iter(values.values()))),
                median={m: float(np.median(v)) for m, v in values.items()},
                q1={m: float(np.quantile(v, 0.25)) for m, v in values.items()},
                q3={m: float(np.quantile(v, 0.75)) for m, v in values.items()}, values=values, seconds=0.0)


def test_a_recorded_tolerance_reaches_the_worst_seed(tmp_path: Path) -> None:
    """Recorded over many seeds, a check fails only when the median is worse than every recorded seed."""
    ari = [0.31, 0.37, 0.37, 0.42, 0.43, 0.44, 0.57, 1.0, 1.0, 1.0]  # skewed, as agc-iter on the circles
    cost = [1.1, 1.2, 1.2, 1.3, 1.3, 1.4, 1.5, 1.6, 2.0, 4.0]
    suite = _suite((), regression_metrics=("cost_ratio", "ari"))
    path = tmp_path / "regressions.json"
    assert runner.record_regressions(suite, {("p", "d", 10, "8"): _seeds_cell("p", ari=ari, cost_ratio=cost)},
                                     path) == 2
    entries = {e["metric"]: e for e in json.loads(path.read_text())["entries"]}
    assert entries["ari"]["median"] == pytest.approx(0.435) and entries["ari"]["seeds"] == 10
    assert entries["ari"]["tolerance"] == pytest.approx(0.435 - 0.31)  # not the IQR (0.51: the good tail)
    assert entries["cost_ratio"]["tolerance"] == pytest.approx(4.0 - 1.35)
    at_worst = {("p", "d", 10, "8"): _seeds_cell("p", ari=[0.31, 0.31, 0.9], cost_ratio=[4.0, 4.0, 1.0])}
    assert all(c.passed for c in runner.check_regressions(suite, at_worst, path))
    beyond = {("p", "d", 10, "8"): _seeds_cell("p", ari=[0.30, 0.30, 0.9], cost_ratio=[4.1, 4.1, 1.0])}
    assert not any(c.passed for c in runner.check_regressions(suite, beyond, path))
    # A tight cell keeps the floor: 0.02 for scores, 5% of the median for costs.
    runner.record_regressions(suite, {("p", "d", 10, "8"): _seeds_cell("p", ari=[0.99] * 10, cost_ratio=[2.0] * 10)},
                              path)
    entries = {e["metric"]: e for e in json.loads(path.read_text())["entries"]}
    assert entries["ari"]["tolerance"] == pytest.approx(0.02)
    assert entries["cost_ratio"]["tolerance"] == pytest.approx(0.1)


def test_a_regression_entry_marked_not_enforced_is_reported_never_failed(tmp_path: Path) -> None:
    cell = Cell(protocol="ugc", dataset="moons", n=100, epsilon="8", seeds=3, median={"ari": 0.5}, q1={}, q3={},
                values={"ari": [0.4, 0.5, 0.6]}, seconds=0.0)
    entry = {"suite": "tiny", "protocol": "ugc", "dataset": "moons", "n": 100, "epsilon": "8", "metric": "ari",
             "median": 0.9, "tolerance": 0.02, "lower_is_better": False}
    path = tmp_path / "regressions.json"
    path.write_text(json.dumps({"entries": [entry]}))
    suite = _suite(())
    [enforced] = runner.check_regressions(suite, {cell.key: cell}, path)
    assert not enforced.passed and enforced.required
    path.write_text(json.dumps({"entries": [{**entry, "enforced": False, "reason": "algorithm being reworked"}]}))
    [reported] = runner.check_regressions(suite, {cell.key: cell}, path)
    assert not reported.passed and not reported.required and "not enforced: algorithm being reworked" in reported.detail
    from harness.tables import checks_table
    assert "failed (not enforced): ugc / moons" in checks_table([reported])


def test_the_floor_bound_grants_what_the_floors_resolution_costs(in_process: None) -> None:
    from harness.baselines import Box
    from harness.baselines.oue_grid import cell_centers
    from harness.suites import MIXTURE_2D

    from ldp_client.encoders.base import NumericDomain
    from ldp_client.encoders.grid import UniformGridEncoder

    x = np.random.default_rng(0).normal(size=(500, 2)) * (40.0, 10.0)
    box, m = Box.of(x), 7
    # The snapping cost with the SDK's own grid encoder (the one the floor's histogram uses).
    encoder = UniformGridEncoder(domain=NumericDomain(lower=tuple(box.lower), upper=tuple(box.upper)),
                                 cells_per_dimension=(m, m))
    snapped = cell_centers(box, m)[[encoder.encode(p) for p in x.tolist()]]
    assert runner.resolution_cost("ldp-oue-grid", x, {"cells_per_dimension": m}) == \
        pytest.approx(float(np.sum((x - snapped) ** 2)), rel=1e-12)
    laplace = runner.resolution_cost("ldp-laplace-points", x, {"grid_bits": 10})
    assert 0 < laplace < runner.resolution_cost("ldp-laplace-points", x, {"grid_bits": 4})
    assert runner.resolution_cost("kmeans++", x, {}) == 0.0
    # Seed 106 of the imbalanced mixture: a 460 x 230 span whose tight clusters fill only 74 of the
    # 128 x 128 cells; the grid alone costs the floor 4.8% over matched k-means, within what it may cost.
    task = Task(protocol="ldp-oue-grid", dataset=MIXTURE_2D, n=4000, epsilon=math.inf, seed=106,
                matched_reference=True)
    record = runner.run_task(task, None)
    assert record.error is None
    assert record.metrics["cost_ratio_matched"] > 1.02 >= record.metrics["cost_ratio_resolved"]
    exact = runner.run_task(Task(protocol="kmeans++", dataset=MIXTURE_2D, n=4000, epsilon=None, seed=106,
                                 matched_reference=True), None)
    assert exact.metrics["cost_ratio_resolved"] == pytest.approx(exact.metrics["cost_ratio_matched"], rel=1e-12)


def test_the_smoke_suite_records_over_more_seeds_than_it_checks() -> None:
    smoke = SUITES["smoke"]
    assert len(smoke.tuning_seeds) >= 10
    assert all(len(b.seeds) < len(smoke.tuning_seeds) for b in smoke.blocks)
    recording = runner.plan_seeds(smoke, tuning=True, count=None, record=True)
    assert all(b.seeds == smoke.tuning_seeds for b in recording.blocks)
    assert [(b.protocols, b.datasets, b.epsilons, b.ns) for b in recording.blocks] == \
        [(b.protocols, b.datasets, b.epsilons, b.ns) for b in smoke.blocks]
    with pytest.raises(ValueError, match="at least one seed"):
        smoke.with_seeds(())


@pytest.mark.parametrize("name", sorted(SUITES))
def test_every_suite_reports_only_on_reporting_seeds_disjoint_from_its_tuning_seeds(name: str) -> None:
    suite = SUITES[name]
    assert suite.tuning_seeds and suite.reporting_seeds
    assert not set(suite.tuning_seeds) & set(suite.reporting_seeds)
    assert all(set(b.seeds) <= set(suite.reporting_seeds) for b in suite.blocks)
    assert runner.plan_seeds(suite, tuning=False, count=None, record=False) == suite


def test_a_suite_with_shared_tuning_and_reporting_seeds_cannot_be_declared() -> None:
    with pytest.raises(ValueError, match=r"seeds \[3\] are both tuning and reporting seeds"):
        _suite((), tuning_seeds=(1, 2, 3), reporting_seeds=(3, 4))


def test_the_runner_refuses_to_report_on_tuning_seeds_or_tune_on_reporting_seeds() -> None:
    block = Block(protocols=("kmeans++",), datasets=(TINY,), epsilons=(1.0,), ns=(200,), seeds=(0, 1))
    leaking = _suite((block,), tuning_seeds=(1, 2), reporting_seeds=(0, 3))
    with pytest.raises(ValueError, match=r"would report on tuning seeds \[1\]"):
        runner.plan_seeds(leaking, tuning=False, count=None, record=False)
    undeclared = _suite((block,), tuning_seeds=(5,), reporting_seeds=(0,))
    with pytest.raises(ValueError, match=r"seeds \[1\], not declared reporting seeds"):
        runner.plan_seeds(undeclared, tuning=False, count=None, record=False)
    suite = _suite((block,), tuning_seeds=(5, 6, 7), reporting_seeds=(0, 1, 2))
    with pytest.raises(ValueError, match=r"--record-regressions tunes .* \(--tuning\)"):
        runner.plan_seeds(suite, tuning=False, count=None, record=True)
    with pytest.raises(ValueError, match="--record-regressions tunes"):
        runner.plan_seeds(suite, tuning=False, count=2, record=True)
    with pytest.raises(ValueError, match="declares only 3 reporting seeds"):
        runner.plan_seeds(suite, tuning=False, count=4, record=False)
    assert [b.seeds for b in runner.plan_seeds(suite, tuning=False, count=3, record=False).blocks] == [(0, 1, 2)]
    assert [b.seeds for b in runner.plan_seeds(suite, tuning=True, count=None, record=False).blocks] == [(5, 6, 7)]
    assert [b.seeds for b in runner.plan_seeds(suite, tuning=True, count=2, record=True).blocks] == [(5, 6)]


def test_the_shapes_suite_holds_the_engine_default_variant_to_the_acceptance() -> None:
    from harness.suites import DEFAULT_GRID_PROTOCOL

    from ldp_collector.kinds.grid import DEFAULT_VARIANT

    assert ADAPTERS[DEFAULT_GRID_PROTOCOL].variant == DEFAULT_VARIANT.name.lower()  # type: ignore[attr-defined]


def test_a_suite_cut_to_some_population_sizes_keeps_only_their_blocks_and_bounds() -> None:
    from harness.suites import SHAPES

    cut = SHAPES.with_ns((100_000,))
    assert {n for b in cut.blocks for n in b.ns} == {100_000}
    assert cut.bounds and all(100_000 in b.ns for b in cut.bounds)
    assert len(cut.bounds) < len(SHAPES.bounds)
    with pytest.raises(ValueError, match="runs no block at n = 7; its sizes are 100000, 1000000"):
        SHAPES.with_ns((7,))


def test_main_refuses_to_record_regressions_on_reporting_seeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "regressions.json"
    monkeypatch.setattr(runner, "REGRESSIONS_PATH", path)
    assert runner.main(["--suite", "smoke", "--record-regressions", "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "refused" in err and "--tuning" in err
    assert not path.exists() and not (tmp_path / "results.json").exists()


def test_a_table_cell_is_the_median_with_its_10th_percentile_seed() -> None:
    from harness import tables

    ari = [0.1, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.92, 0.95, 0.99, 1.0]  # 11 seeds: p10 is the 2nd lowest seed
    cost = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 9.0]  # p90: the 2nd highest
    many = _seeds_cell("p", ari=ari, cost_ratio=cost)
    assert many.tail("ari") == ("p10", 0.5) and many.tail("cost_ratio") == ("p90", 1.9)
    assert tables.cell_text(many, "ari") == "0.85 (p10 0.5)"
    assert tables.cell_text(many, "cost_ratio") == "1.5 (p90 1.9)"
    few = _seeds_cell("p", ari=[0.2, 0.9, 1.0])
    assert tables.cell_text(few, "ari") == "0.9 (p10 0.2) †"  # under 10 seeds: the worst seed, marked
    table = tables.pivot_table([few], "ari")
    assert "0.9 (p10 0.2) †" in table and "[" not in table
    assert "p10" in tables.CELL_LEGEND and "fewer than 10 seeds" in tables.CELL_LEGEND


def test_the_densest_true_region_must_be_in_a_cluster() -> None:
    from ldp_client.clusters import CellClusterModel
    from ldp_client.encoders import NumericDomain, TreeCell

    rng = np.random.default_rng(0)
    x = np.vstack([rng.uniform(0.0, 1.0, size=(200, 2)), rng.normal(0.8, 0.01, size=(300, 2))])
    dense = np.abs(x - 0.8).max(axis=1) < 0.05
    labels = np.zeros(len(x), dtype=np.int64)
    assert runner.densest_region_clustered(x, Clustering(centers=None, labels=labels)) is True
    labels[dense] = -1  # the densest region called noise
    assert runner.densest_region_clustered(x, Clustering(centers=None, labels=labels)) is False
    assert runner.densest_region_clustered(x, Clustering(centers=np.array([[0.1, 0.1]]))) is True
    assert runner.densest_region_clustered(np.zeros((5, 3)), Clustering(centers=np.zeros((1, 3)))) is None
    # A cell map: the top cell is the densest of its own cells (not the 32 x 32 grid's).
    cells = tuple(TreeCell(level=1, morton_index=i) for i in range(4))
    domain = NumericDomain(lower=(0.0, 0.0), upper=(1.0, 1.0))
    top = CellClusterModel(domain=domain, cells=cells, labels=(0, 0, 0, 0)).cell_position([0.8, 0.8])
    clustered = CellClusterModel(domain=domain, cells=cells, labels=tuple(1 if i == top else -1 for i in range(4)))
    noise = CellClusterModel(domain=domain, cells=cells, labels=tuple(-1 if i == top else 1 for i in range(4)))
    assert runner.densest_region_clustered(x, Clustering(centers=None, labels=labels, cell_map=clustered)) is True
    assert runner.densest_region_clustered(x, Clustering(centers=None, labels=labels, cell_map=noise)) is False


def test_densest_region_violations_are_reported_not_failed() -> None:
    from harness import tables

    def record(seed: int, clustered: bool | None) -> RunRecord:
        return RunRecord(protocol="ugc", dataset="moons", n=10, d=2, k=2, epsilon="8", seed=seed, via_grpc=False,
                         seconds=0.0, densest_region_clustered=clustered)

    checks = runner.check_densest_regions([record(0, True), record(1, False), record(2, None)])
    assert [(c.kind, c.passed, c.required) for c in checks] == [("densest", True, False), ("densest", False, False)]
    text = tables.checks_table(checks)
    assert "densest true cell in a cluster, 2-D runs (enforced for the suite's densest_required protocols, else " \
        "reported): 1 of 2 passed" in text
    assert "violated: ugc / moons / n=10 / eps=8 / seed=1" in text
    # A suite may enforce it for named protocols (the shapes suite: its default grid variant).
    enforced = runner.check_densest_regions([record(0, True), record(1, False)], required=("ugc",))
    assert [(c.passed, c.required) for c in enforced] == [(True, True), (False, True)]
    assert "FAILED: ugc / moons / n=10 / eps=8 / seed=1" in tables.checks_table(enforced)


def test_the_recorded_regressions_cover_the_smoke_suite() -> None:
    entries = json.loads(runner.REGRESSIONS_PATH.read_text())["entries"]
    smoke = {(e["protocol"], e["dataset"], e["n"], e["epsilon"], e["metric"]) for e in entries
             if e["suite"] == "smoke"}
    tasks = build_tasks(SUITES["smoke"])
    for t in tasks:
        if ADAPTERS[t.protocol].has_centers:
            assert (t.protocol, t.dataset.label, t.n, epsilon_label(t.epsilon), "cost_ratio") in smoke
        assert (t.protocol, t.dataset.label, t.n, epsilon_label(t.epsilon), "ari") in smoke
    assert all(e["tolerance"] > 0 for e in entries)
    assert {t.protocol for t in tasks} >= {"ugc", "agc-tree", "agc-iter"}


# -- entry point --------------------------------------------------------------------------------------

@pytest.fixture
def tiny_suite(monkeypatch: pytest.MonkeyPatch) -> Suite:
    suite = _suite(
        (Block(protocols=("kmeans++", "dpqt-kmeans", "ldp-oue-grid"), datasets=(TINY,), epsilons=(1.0, math.inf),
               ns=(800,), seeds=(0, 1)),),
        bounds=(Bound(id="floors-inf", statement="s", protocols=("ldp-oue-grid",), datasets=(TINY.label,),
                      epsilon=math.inf, metric="cost_ratio_resolved", maximum=1.02),),
        plot_epsilon=1.0)
    monkeypatch.setitem(SUITES, "tiny", suite)
    return suite


def test_main_writes_everything_and_passes(tiny_suite: Suite, tmp_path: Path, in_process: None,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(runner, "REGRESSIONS_PATH", tmp_path / "regressions.json")
    assert runner.main(["--suite", "tiny", "--jobs", "1", "--out", str(tmp_path / "out"), "--quiet",
                        "--tuning", "--seeds", "2", "--record-regressions"]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["runs"] == 2 + 4 + 4
    assert all(c["passed"] for c in results["checks"])
    assert any(c["kind"] == "regression" for c in results["checks"])
    assert sum(c["kind"] == "densest" for c in results["checks"]) == results["runs"]  # every run is 2-D
    assert all(isinstance(r["densest_region_clustered"], bool) for r in results["records"])
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| dpqt-kmeans | central-dp |" in table and "(p10 " in table and "(p90 " in table
    assert "† = fewer than 10 seeds" in table
    plots = sorted(p.name for p in (tmp_path / "out" / "plots").glob("*.png"))
    assert any(p.endswith("_clusters.png") for p in plots)


def test_main_fails_loudly_on_a_regression(tiny_suite: Suite, tmp_path: Path, in_process: None,
                                           monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "regressions.json"
    path.write_text(json.dumps({"entries": [
        {"suite": "tiny", "protocol": "dpqt-kmeans", "dataset": TINY.label, "n": 800, "epsilon": "1",
         "metric": "cost_ratio", "median": 0.5, "tolerance": 0.01, "lower_is_better": True}]}))
    monkeypatch.setattr(runner, "REGRESSIONS_PATH", path)
    assert runner.main(["--suite", "tiny", "--jobs", "1", "--out", str(tmp_path / "out"), "--quiet",
                        "--no-plots"]) == 1
    err = capsys.readouterr().err
    assert "SUITE TINY FAILED" in err and "dpqt-kmeans" in err and "cost_ratio" in err


def test_main_records_over_the_suites_tuning_seeds(tmp_path: Path, in_process: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "regressions.json"
    monkeypatch.setattr(runner, "REGRESSIONS_PATH", path)
    monkeypatch.setitem(SUITES, "tiny", _suite((Block(protocols=("kmeans++",), datasets=(TINY,), epsilons=(1.0,),
                                                      ns=(200,), seeds=(0,)),), tuning_seeds=(50, 51, 52, 53)))
    common = ["--suite", "tiny", "--jobs", "1", "--out", str(tmp_path / "out"), "--quiet", "--no-plots"]
    assert runner.main([*common, "--tuning", "--record-regressions"]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["runs"] == 4 and {r["seed"] for r in results["records"]} == {50, 51, 52, 53}
    assert {e["seeds"] for e in json.loads(path.read_text())["entries"]} == {4}
    assert runner.main([*common, "--tuning", "--record-regressions", "--seeds", "3"]) == 0
    assert {e["seeds"] for e in json.loads(path.read_text())["entries"]} == {3}
    assert runner.main(common) == 0  # checking runs the blocks' own (reporting) seeds
    assert json.loads((tmp_path / "out" / "results.json").read_text())["runs"] == 1
    assert runner.main([*common, "--record-regressions"]) == 2  # never on the reporting seeds


def test_main_fails_loudly_on_a_broken_run(tiny_suite: Suite, tmp_path: Path, in_process: None, broken: str,
                                           monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runner, "REGRESSIONS_PATH", tmp_path / "none.json")
    monkeypatch.setitem(SUITES, "tiny", _suite((Block(protocols=(broken,), datasets=(TINY,), epsilons=(1.0,),
                                                      ns=(200,), seeds=(0,)),)))
    assert runner.main(["--suite", "tiny", "--jobs", "1", "--out", str(tmp_path), "--quiet", "--no-plots"]) == 1
    assert "deliberately broken" in capsys.readouterr().err


def test_main_draws_the_grid_of_a_grid_run(tmp_path: Path, in_process: None, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(runner, "REGRESSIONS_PATH", tmp_path / "none.json")
    monkeypatch.setitem(SUITES, "tiny", _suite((Block(protocols=("ugc",), datasets=(DatasetCase(name="moons"),),
                                                      epsilons=(8.0, math.inf), ns=(1500,), seeds=(0,)),),
                                               plot_epsilon=8.0))
    assert runner.main(["--suite", "tiny", "--jobs", "1", "--out", str(tmp_path), "--quiet"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["runs"] == 1 and results["records"][0]["epsilon"] == "8"  # no inf run: no bypass
    plots = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert "moons_n1500_ugc_eps8_grid.png" in plots and "moons_n1500_clusters.png" in plots
    assert (tmp_path / "plots" / "moons_n1500_ugc_eps8_grid.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.integration
def test_grid_adapter_over_grpc_matches_in_process(in_process: None) -> None:
    """--via-grpc: the grid campaign through a real collector gives the same clustering as in-process."""
    pytest.importorskip("grpc")
    x = runner.dataset(DatasetCase(name="aniso"), 1500, 0)[0]
    adapter = get_adapter("agc-tree")
    local = adapter.run(x, 3, 8.0, 7, via_grpc=False)
    with adapters.start_collector() as (address, token):
        adapters.configure_remote(address, token)
        remote = adapter.run(x, 3, 8.0, 7, via_grpc=True)
        other = get_adapter("ugc").run(x, 3, 8.0, 7, via_grpc=True)  # same data and seed, another campaign
    assert remote.diagnostics["via_grpc"] == 1.0 and local.diagnostics["via_grpc"] == 0.0
    assert remote.diagnostics["accepted"] == remote.diagnostics["reports"] == 1500
    assert other.diagnostics["accepted"] == 1500  # distinct report ids per campaign: no duplicates
    assert remote.labels is not None and local.labels is not None
    assert remote.labels.tolist() == local.labels.tolist()
    assert remote.cell_map == local.cell_map


@pytest.mark.integration
def test_oue_floor_over_grpc_matches_in_process(in_process: None) -> None:
    """--via-grpc: the same campaign through a real collector (127.0.0.1, port 0) gives the same result."""
    pytest.importorskip("grpc")
    x, _ = runner.dataset(TINY, 1500, 0)[:2]
    adapter = get_adapter("ldp-oue-grid")
    local = adapter.run(x, 3, 1.0, 7, via_grpc=False)
    with adapters.start_collector() as (address, token):
        adapters.configure_remote(address, token)
        remote = adapter.run(x, 3, 1.0, 7, via_grpc=True)
    assert remote.diagnostics["via_grpc"] == 1.0 and local.diagnostics["via_grpc"] == 0.0
    assert remote.diagnostics["reports"] == 1500 and remote.diagnostics["rejected"] == 0
    np.testing.assert_allclose(remote.centers, local.centers)


def test_recording_a_protocol_subset_keeps_the_other_entries(tmp_path: Path) -> None:
    suite = _suite((), regression_metrics=("cost_ratio",))
    path = tmp_path / "regressions.json"
    runner.record_regressions(suite, {c.key: c for c in (_cell("p", "1", cost_ratio=2.0),
                                                          _cell("q", "1", cost_ratio=3.0))}, path)
    runner.record_regressions(suite, {c.key: c for c in (_cell("q", "1", cost_ratio=4.0),)}, path)
    entries = {(e["protocol"], e["median"]) for e in json.loads(path.read_text())["entries"]}
    assert entries == {("p", 2.0), ("q", 4.0)}


# -- the shapes suite and the variant verdict -----------------------------------------------------------

def _ari_records(protocol: str, values: list[float], *, dataset: str = "moons", n: int = 1000, epsilon: str = "4",
                 first_seed: int = 100) -> list[RunRecord]:
    return [RunRecord(protocol=protocol, dataset=dataset, n=n, d=2, k=2, epsilon=epsilon, seed=first_seed + i,
                      via_grpc=False, seconds=0.0, metrics={"ari": v}) for i, v in enumerate(values)]


def test_the_shapes_suite_bounds_the_default_grid_variant_on_the_issues_cells() -> None:
    from harness.suites import DEFAULT_GRID_PROTOCOL, SHAPES_DATASETS

    shapes = SUITES["shapes"]
    names = [d.name for d in SHAPES_DATASETS]
    assert names == ["spirals", "rings", "moons", "circles", "aniso", "varied", "sizes", "background"]
    assert {(b.ns, b.epsilons) for b in shapes.blocks} == {((1_000_000,), (2.0,)), ((100_000,), (4.0,))}
    for block in shapes.blocks:
        assert set(GRID_PROTOCOLS) | {"kmeans++", "dbscan"} <= set(block.protocols)
        assert block.seeds == shapes.reporting_seeds and len(block.seeds) >= 10
        assert [d.name for d in block.datasets] == names
    acceptance = {"spirals", "rings", "moons", "circles", "aniso", "varied"}
    limits = {(b.over, b.ns, b.epsilon, b.minimum) for b in shapes.bounds}
    assert limits == {("median", (1_000_000,), 2.0, 0.9), ("run", (1_000_000,), 2.0, 0.7),
                      ("median", (100_000,), 4.0, 0.85), ("run", (100_000,), 4.0, 0.6)}
    assert all(b.protocols == (DEFAULT_GRID_PROTOCOL,) and set(b.datasets) == acceptance and b.metric == "ari"
               for b in shapes.bounds)
    assert shapes.densest_required == (DEFAULT_GRID_PROTOCOL,)


def test_median_and_every_run_bounds_apply_at_their_n_only() -> None:
    runs = _ari_records("agc-tree", [0.95, 0.92, 0.91, 0.65, 0.99, 0.93], n=1000)
    runs += _ari_records("agc-tree", [0.1] * 6, n=50)  # another n: not bounded
    median = Bound(id="m", statement="s", protocols=("agc-tree",), datasets=("moons",), epsilon=4.0, metric="ari",
                   minimum=0.9, ns=(1000,), over="median")
    worst = Bound(id="w", statement="s", protocols=("agc-tree",), datasets=("moons",), epsilon=4.0, metric="ari",
                  minimum=0.7, ns=(1000,))
    [m], [w] = check_bounds([median], runs), check_bounds([worst], runs)
    assert m.passed and "median 0.9250 over 6 seeds" in m.detail and "n=1000" in m.detail
    assert not w.passed and "[0.6500, 0.9900] over 6 runs" in w.detail
    with pytest.raises(ValueError, match="over must be"):
        Bound(id="x", statement="s", protocols=(), datasets=(), epsilon=1.0, metric="ari", over="mean")


def test_the_paired_test_needs_six_seeds_to_reach_alpha() -> None:
    from scipy.stats import wilcoxon

    # The exact two-sided test's smallest p-value over m seeds is 2 / 2^m: above alpha at 5, below at 6.
    assert wilcoxon([1.0, 2, 3, 4, 5], [0.0] * 5).pvalue > runner.VERDICT_ALPHA
    assert wilcoxon([1.0, 2, 3, 4, 5, 6], [0.0] * 6).pvalue < runner.VERDICT_ALPHA
    assert runner.VERDICT_MIN_SEEDS == 6
    assert runner.paired_comparison([0.9] * 5, [0.1] * 5) == (None, "too few seeds")
    assert runner.paired_comparison([0.9] * 6, [0.1] * 6)[1] == "wins"


def test_the_variant_verdict_says_wins_loses_no_difference_or_too_few_seeds(tmp_path: Path) -> None:
    from harness import tables

    base = [0.50, 0.55, 0.60, 0.52, 0.58, 0.61, 0.49, 0.57, 0.53, 0.56]
    noise = [0.01, -0.02, 0.03, -0.01, 0.02, -0.03, 0.01, -0.01, 0.02, -0.02]
    records = (_ari_records("ugc", base) + _ari_records("agc-tree", [b + 0.3 for b in base])   # a clear win
               + _ari_records("agc-iter", [b - 0.2 + e for b, e in zip(base, noise, strict=True)])  # a clear loss
               + _ari_records("ugc", base, dataset="circles") + _ari_records("agc-tree", [
                   b + e for b, e in zip(base, noise, strict=True)], dataset="circles")  # a tie
               + _ari_records("ugc", base[:5], dataset="aniso") + _ari_records("agc-tree", base[:5], dataset="aniso"))
    records += _ari_records("agc-iter", [0.99] * 4, dataset="circles", first_seed=200)  # no common seeds with ugc
    comparisons = runner.variant_verdicts(records, GRID_PROTOCOLS)
    verdict = {(c.dataset, c.protocol, c.against): c for c in comparisons}
    win = verdict[("moons", "agc-tree", "ugc")]
    assert win.verdict == "wins" and win.seeds == 10 and win.median_difference == pytest.approx(0.3)
    assert win.p_value is not None and win.p_value < 0.05
    assert verdict[("moons", "ugc", "agc-tree")].verdict == "loses"
    loss = verdict[("moons", "agc-iter", "ugc")]
    assert loss.verdict == "loses" and loss.median_difference == pytest.approx(-0.2, abs=0.02)
    tie = verdict[("circles", "agc-tree", "ugc")]
    assert tie.verdict == "no difference" and tie.p_value is not None and tie.p_value >= 0.05
    few = verdict[("aniso", "agc-tree", "ugc")]
    assert few.verdict == "too few seeds" and few.seeds == 5 and few.p_value is None
    assert ("circles", "agc-iter", "ugc") not in verdict
    summary = runner.verdict_summary(comparisons)
    assert summary["wins"]["agc-tree"] == {"ugc": 1, "agc-iter": 1}
    assert summary["wins"]["ugc"] == {"agc-tree": 0, "agc-iter": 1}
    assert summary["cells"] == {"agc-iter": 0, "agc-tree": 2, "ugc": 1} and summary["default"] == ["agc-tree"]
    text = tables.verdict_report(comparisons)
    assert "| moons | 1,000 | 4 | 10 | agc-tree | +0.300 |" in text and "| wins |" in text
    assert "| aniso | 1,000 | 4 | 5 | agc-tree | +0.000 |  | too few seeds |" in text
    assert "| agc-tree | 1 |  | 1 | 2 |" in text
    assert "Default by the numbers: agc-tree (2 cells won)." in text and "Wilcoxon" in text


def test_main_writes_the_variant_verdict(tmp_path: Path, in_process: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # The shapes suite's machinery on data that exists everywhere, at a tiny n.
    monkeypatch.setattr(runner, "REGRESSIONS_PATH", tmp_path / "regressions.json")
    block = Block(protocols=GRID_PROTOCOLS + ("kmeans++",), datasets=(DatasetCase(name="moons"),), epsilons=(8.0,),
                  ns=(600,), seeds=tuple(range(6)))
    bound = Bound(id="shapes-median", statement="s", protocols=("agc-tree",), datasets=("moons",), epsilon=8.0,
                  metric="ari", minimum=0.0, ns=(600,), over="median")
    monkeypatch.setitem(SUITES, "tiny", _suite((block,), bounds=(bound,), densest_required=("agc-tree",)))
    assert runner.main(["--suite", "tiny", "--jobs", "1", "--out", str(tmp_path), "--quiet", "--no-plots"]) in (0, 1)
    results = json.loads((tmp_path / "results.json").read_text())
    comparisons = results["verdict"]["comparisons"]
    pairs = len(GRID_PROTOCOLS) * (len(GRID_PROTOCOLS) - 1)  # ordered pairs, one dataset x (n, epsilon) cell
    assert len(comparisons) == pairs and all(c["seeds"] == 6 for c in comparisons)
    assert {c["verdict"] for c in comparisons} <= {"wins", "loses", "no difference"}
    assert "Wilcoxon" in results["verdict"]["test"] and results["verdict"]["summary"]["default"]
    assert any(c["kind"] == "bound" and c["id"] == "shapes-median" and c["passed"] for c in results["checks"])
    assert all(c["required"] == c["detail"].startswith("agc-tree") for c in results["checks"] if c["kind"] == "densest")
    verdict = (tmp_path / "verdict.md").read_text()
    assert "Default by the numbers" in verdict and verdict in (tmp_path / "table.md").read_text()


def test_a_suite_run_in_pieces_merges_into_one_result(tiny_suite: Suite, tmp_path: Path, in_process: None,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runner, "REGRESSIONS_PATH", tmp_path / "none.json")
    common = ["--suite", "tiny", "--jobs", "1", "--quiet", "--no-plots"]
    assert runner.main([*common, "--out", str(tmp_path / "a"), "--protocols", "kmeans++", "dpqt-kmeans"]) == 0
    first = json.loads((tmp_path / "a" / "results.json").read_text())
    assert first["runs"] == 2 + 4
    assert runner.main([*common, "--out", str(tmp_path / "b"), "--protocols", "ldp-oue-grid", "kmeans++",
                        "--merge", str(tmp_path / "a" / "results.json")]) == 0
    merged = json.loads((tmp_path / "b" / "results.json").read_text())
    # kmeans++ ran again and replaced the earlier runs; dpqt-kmeans came from the first piece.
    assert merged["runs"] == 2 + 4 + 4
    keys = [(r["protocol"], r["dataset"], r["n"], r["epsilon"], r["seed"]) for r in merged["records"]]
    assert len(set(keys)) == len(keys)
    earlier = {(r["protocol"], r["epsilon"], r["seed"]): r["metrics"] for r in first["records"]}
    assert all(r["metrics"] == earlier[(r["protocol"], r["epsilon"], r["seed"])]
               for r in merged["records"] if r["protocol"] == "dpqt-kmeans")
    assert "| dpqt-kmeans | central-dp |" in (tmp_path / "b" / "table.md").read_text()
    # Another suite's file, or no results file at all, is refused with one line.
    (tmp_path / "other.json").write_text(json.dumps({**first, "suite": "smoke"}))
    assert runner.main([*common, "--out", str(tmp_path / "c"), "--merge", str(tmp_path / "other.json")]) == 2
    assert runner.main([*common, "--out", str(tmp_path / "c"), "--merge", str(tmp_path / "missing.json")]) == 2
    broken = {**first, "records": [{k: v for k, v in first["records"][0].items() if k != "seconds"}]}
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    assert runner.main([*common, "--out", str(tmp_path / "c"), "--merge", str(tmp_path / "broken.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "holds suite 'smoke'" in err[0] and "cannot read it" in err[1]
    assert "record 0 is not a run record" in err[2]


def test_an_interrupted_run_resumes_from_its_journal(tiny_suite: Suite, tmp_path: Path, in_process: None,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runner, "REGRESSIONS_PATH", tmp_path / "none.json")
    common = ["--suite", "tiny", "--jobs", "1", "--quiet", "--no-plots", "--out", str(tmp_path)]
    assert runner.main(common) == 0
    full = json.loads((tmp_path / "results.json").read_text())
    lines = (tmp_path / runner.JOURNAL).read_text().splitlines()
    # The journal holds every run as it finished, after a line naming the suite.
    assert json.loads(lines[0]) == {"suite": "tiny"} and len(lines) == 1 + full["runs"]
    # Interrupted after three runs, in the middle of writing the fourth; the third had failed.
    failed = {**json.loads(lines[3]), "error": "Traceback: boom"}
    (tmp_path / runner.JOURNAL).write_text("\n".join([*lines[:3], json.dumps(failed)]) + "\n" + lines[4][:40])
    (tmp_path / "results.json").unlink()
    ran: list[tuple[str, str, int, str, int]] = []
    run_task = runner.run_task
    monkeypatch.setattr(runner, "run_task", lambda task, ref: ran.append(task.key) or run_task(task, ref))
    assert runner.main([*common, "--resume"]) == 0
    resumed = json.loads((tmp_path / "results.json").read_text())
    assert len(ran) == full["runs"] - 2 and resumed["runs"] == full["runs"]
    done = {(r["protocol"], r["dataset"], r["n"], r["epsilon"], r["seed"]) for r in map(json.loads, lines[1:3])}
    assert done.isdisjoint(ran) and (failed["protocol"], failed["dataset"], failed["n"], failed["epsilon"],
                                     failed["seed"]) in ran
    assert not any(r["error"] for r in resumed["records"])
    assert sorted(r["metrics"]["ari"] for r in resumed["records"]) == sorted(r["metrics"]["ari"]
                                                                            for r in full["records"])
    assert len((tmp_path / runner.JOURNAL).read_text().splitlines()) == 1 + full["runs"]
    # A journal of another suite, or a broken line before the last, is refused with one line.
    ran.clear()
    (tmp_path / runner.JOURNAL).write_text(json.dumps({"suite": "smoke"}) + "\n")
    assert runner.main([*common, "--resume"]) == 2
    (tmp_path / runner.JOURNAL).write_text("\n".join([lines[0], "{", lines[1]]) + "\n")
    assert runner.main([*common, "--resume"]) == 2
    assert not ran
    err = capsys.readouterr().err.strip().splitlines()
    assert "is not a journal of suite 'tiny'" in err[-2] and "line 2 is not JSON" in err[-1]
