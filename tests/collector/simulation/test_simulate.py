"""The population simulator, the datasets and the evaluation helpers of ``ldp_collector``.

The simulator must drive the real SDK with Device semantics in both modes (group draw, one report
per round, budget caps, payload checks); the datasets must follow scikit-learn's generators; the
metrics must match their textbook values. One in-process histogram campaign checks the whole loop
against the analytic standard errors.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from ldp.v1 import campaigns_pb2
from ldp_client.clusters import CellClusterModel
from ldp_client.device import DevicePolicy
from ldp_client.encoders import CategoricalEncoder, NumericDomain, UniformGridEncoder
from ldp_client.encoders.geometry import TreeCell
from ldp_client.errors import InvalidParameterError, PolicyViolationError
from ldp_client.mechanisms import GRRParams, oue
from ldp_client.report import Report
from ldp_client.spec import Component, GroupTask, RoundSpec
from ldp_collector.core import Collector
from ldp_collector.model import Clustering, Estimate, Estimates, Result
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import DATASETS, load_file, make_dataset
from ldp_collector.simulation.evaluation import evaluate_clustering, evaluate_histogram, histogram_truth, kmeans
from ldp_collector.simulation.population import Population, numeric_bounds, simulate_round
from ldp_collector.simulation.runner import PHASES, InProcessCollector, run_campaign
from ldp_collector.simulation.scores import adjusted_rand_index, kmeans_cost, normalized_mutual_info
from ldp_collector.simulation.scores import hungarian_accuracy as clustering_accuracy
from ldp_collector.storage import open_store
from ldp_collector.storage.base import ReportStore
from support.stats import assert_chi2_fits

CATEGORIES = 6


def spec_with_groups(campaign_epsilon: float = 2.0, round: int = 1, epsilon: float = 1.0) -> RoundSpec:
    """Three groups weighted 1:2:1; groups 0 and 2 report, group 1 sits out."""
    component = Component(encoder=CategoricalEncoder(domain_size=CATEGORIES),
                          mechanism=GRRParams(domain_size=CATEGORIES, epsilon=epsilon))
    return RoundSpec(campaign_id="sim-test", round=round, group_weights=(1, 2, 1),
                     tasks=(GroupTask(groups=(0,), components=(component,)),
                            GroupTask(groups=(2,), components=(component,))),
                     campaign_epsilon=campaign_epsilon, max_reports_per_device=4, kind="histogram")


# -- datasets ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_dataset_has_the_documented_shape(name: str) -> None:
    x, labels = make_dataset(name, 1001, seed=3)
    assert x.dtype == np.float64 and x.shape == (1001, DATASETS[name].default_d)
    assert labels is not None and labels.dtype == np.int64 and labels.shape == (1001,)
    assert np.isfinite(x).all()
    # Background noise is one class more (label k); a 1001-point subset of the airports can miss
    # the rarest time-zone areas.
    classes = set(range(DATASETS[name].default_k + DATASETS[name].background))
    if name == "airports":
        assert set(np.unique(labels).tolist()) <= classes
    else:
        assert set(np.unique(labels).tolist()) == classes
    again, _ = make_dataset(name, 1001, seed=3)
    assert np.array_equal(x, again), "a seed must reproduce the data"


def test_moons_and_circles_follow_sklearn_geometry() -> None:
    x, labels = make_dataset("moons", 20_000, seed=1)
    assert labels is not None and np.bincount(labels).tolist() == [10_000, 10_000]
    outer = x[labels == 0]
    inner = x[labels == 1] - np.array([1.0, 0.5])
    # make_moons: the outer moon is the upper half of the unit circle, the inner one the lower half
    # shifted by (1, 0.5); noise 0.05.
    assert abs(np.hypot(*outer.T).mean() - 1.0) < 0.01
    assert abs(np.hypot(*inner.T).mean() - 1.0) < 0.01
    assert (outer[:, 1] > -0.2).all() and (inner[:, 1] < 0.2).all()
    x, labels = make_dataset("circles", 20_000, seed=1)
    radius = np.hypot(*x.T)
    assert abs(radius[labels == 0].mean() - 1.0) < 0.01
    assert abs(radius[labels == 1].mean() - 0.5) < 0.01


def test_blobs_and_mixture_take_d_and_k() -> None:
    x, labels = make_dataset("blobs", 1000, d=5, k=7, seed=0)
    assert x.shape == (1000, 5)
    assert labels is not None
    assert np.bincount(labels).tolist() == [143] * 6 + [142]  # make_blobs: the first n % k get one more
    x, labels = make_dataset("mixture", 5000, d=3, k=4, seed=0)
    assert x.shape == (5000, 3)
    assert labels is not None and len(np.unique(labels)) == 4


def test_dataset_errors_are_clear() -> None:
    with pytest.raises(InvalidParameterError, match="unknown dataset 'nope'; known datasets: airports, aniso, background, blobs"):
        make_dataset("nope", 10)
    with pytest.raises(InvalidParameterError, match="dataset 'moons' has d = 2 only, got d = 3"):
        make_dataset("moons", 10, d=3)
    with pytest.raises(InvalidParameterError, match=r"n must be an integer in \[1, "):
        make_dataset("blobs", 0)


def test_load_file_reads_csv_with_header_and_text_labels(tmp_path: Path) -> None:
    path = tmp_path / "points.csv"
    path.write_text("x,y,species\n1.5,2,setosa\n3,4,virginica\n5,-6e-1,setosa\n")
    x, labels = load_file(path, label_column="last")
    assert x.tolist() == [[1.5, 2.0], [3.0, 4.0], [5.0, -0.6]]
    assert labels is not None and labels.tolist() == [0, 1, 0]
    x, labels = load_file(path, label_column=-1)
    assert labels is not None and labels.tolist() == [0, 1, 0]
    spaces = tmp_path / "plain.txt"
    spaces.write_text("1 2\n3 4\n\n")
    x, labels = load_file(spaces)
    assert x.tolist() == [[1.0, 2.0], [3.0, 4.0]] and labels is None


def test_load_file_reads_npy(tmp_path: Path) -> None:
    path = tmp_path / "points.npy"
    np.save(path, np.array([[1.0, 2.0, 7.0], [3.0, 4.0, 9.0], [5.0, 6.0, 7.0]]))
    x, labels = load_file(path, label_column=2)
    assert x.tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    assert labels is not None and labels.tolist() == [0, 1, 0]
    x, labels = load_file(path)
    assert x.shape == (3, 3) and labels is None


@pytest.mark.parametrize(("name", "content", "label_column", "message"), [
    ("missing.csv", None, None, "does not exist"),
    ("ragged.csv", "1,2\n3\n", None, "row 2 has 1 columns, row 1 has 2"),
    ("nan.csv", "1,2\nnan,4\n", None, "row 2, column 1 is nan"),
    ("text.csv", "1,2\n3,abc\n", None, "not a number"),
    ("points.json", "[1, 2]", None, "unsupported format '.json'"),
    ("labels.csv", "1,2\n3,4\n", 5, "label_column 5 is outside the file's 2 columns"),
    ("labels2.csv", "1,2\n3,4\n", "first", "label_column must be None, an integer or 'last'"),
    ("empty.csv", "\n\n", None, "holds no data rows"),
    ("header.csv", "x,y\n", None, "holds a header but no data rows"),
])
def test_load_file_errors_name_the_problem(tmp_path: Path, name: str, content: str | None,
                                           label_column: int | str | None, message: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(InvalidParameterError, match=message):
        load_file(path, label_column)


def test_load_file_rejects_object_npy(tmp_path: Path) -> None:
    path = tmp_path / "objects.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InvalidParameterError, match="not a numeric .npy array"):
        load_file(path)


# -- the population ----------------------------------------------------------------------------------

def _spec(weights: tuple[int, ...], reporting: tuple[tuple[int, ...], ...], *, round: int, epsilon: float,
          max_reports: int, campaign_id: str = "same-decisions") -> RoundSpec:
    component = Component(encoder=CategoricalEncoder(domain_size=CATEGORIES),
                          mechanism=GRRParams(domain_size=CATEGORIES, epsilon=epsilon))
    return RoundSpec(campaign_id=campaign_id, round=round, group_weights=weights,
                     tasks=tuple(GroupTask(groups=g, components=(component,)) for g in reporting),
                     campaign_epsilon=2.0, max_reports_per_device=max_reports, kind="histogram")



def timeless(report: Report) -> bytes:
    """A report's wire bytes without its id's time prefix: ids start with the creation second
    (``ldp_client.report.new_report_id``), and two runs may fall on either side of a second's edge."""
    return replace(report, report_id=bytes(4) + report.report_id[4:]).pack()

@pytest.mark.parametrize(("weights", "reporting", "epsilon", "max_reports"), [
    ((1,), ((0,),), 0.75, 4),               # round 3 exceeds the campaign budget, the second campaign the total
    ((1, 2, 1), ((0,), (2,)), 0.75, 4),     # the same, and group 1 sits out
    ((3, 1), ((0, 1),), 0.5, 2),            # round 3 exceeds the report cap
], ids=["one-group", "one-sits-out", "report-cap"])
def test_direct_and_device_modes_take_the_same_decisions(weights: tuple[int, ...], reporting: tuple[tuple[int, ...], ...],
                                                         epsilon: float, max_reports: int) -> None:
    """Both modes decide through the SDK (ldp_client.admission): for one seed, the same reports bit for bit."""
    points = [i % CATEGORIES for i in range(300)]
    policy = DevicePolicy(max_epsilon_per_campaign=2.0, max_epsilon_total=2.0)
    specs = [_spec(weights, reporting, round=r, epsilon=epsilon, max_reports=max_reports) for r in (1, 2, 3)]
    specs.append(_spec(weights, reporting, round=1, epsilon=epsilon, max_reports=max_reports, campaign_id="second"))
    sent: dict[str, list[list[bytes]]] = {}
    refused: dict[str, list[int]] = {}
    populations = {mode: Population(points, seed=11, policy=policy, mode=mode) for mode in ("device", "direct")}
    for mode, population in populations.items():
        sent[mode], refused[mode] = [], []
        for spec in specs:
            reports = population.participate(spec)
            population.acknowledge(reports)
            sent[mode].append([timeless(r) for r in reports])
            refused[mode].append(population.refused)
    assert sent["device"] == sent["direct"]
    assert refused["device"] == refused["direct"]
    assert all(sent["direct"][:2]), "the first two rounds must send reports"
    assert refused["direct"][2] > 0, "round 3 must be refused"
    if epsilon == 0.75:
        assert refused["direct"][3] > refused["direct"][2], "the total budget must refuse in the second campaign"
    for campaign in ("same-decisions", "second"):
        assert np.array_equal(populations["device"].epsilon_spent(campaign),
                              populations["direct"].epsilon_spent(campaign))


@pytest.mark.parametrize("mode", ["device", "direct"])
def test_groups_follow_the_weights_and_sitting_out_groups_send_nothing(mode: str) -> None:
    spec = spec_with_groups()
    n = 8000
    population = Population([i % CATEGORIES for i in range(n)], seed=5, mode=mode)  # type: ignore[arg-type]
    reports = population.participate(spec)
    assert population.mode == mode
    # Group 1 (half the devices) sits out; groups 0 and 2 report one quarter each.
    groups = [r.group for r in reports] + [1] * (n - len(reports))
    assert_chi2_fits(groups, {0: Fraction(1, 4), 1: Fraction(1, 2), 2: Fraction(1, 4)})
    for report in reports:
        assert report.campaign_id == "sim-test" and report.round == 1 and len(report.payloads) == 1
        assert GRRParams(domain_size=CATEGORIES, epsilon=1.0).check_payload(report.payloads[0]) is not None
    assert len({r.report_id for r in reports}) == len(reports)
    spent = population.epsilon_spent("sim-test")
    assert sorted(set(spent.tolist())) == [0.0, 1.0]
    assert int((spent == 1.0).sum()) == len(reports)


@pytest.mark.parametrize("mode", ["device", "direct"])
def test_devices_keep_their_group_report_once_per_round_and_respect_the_budget(mode: str) -> None:
    population = Population(list(range(CATEGORIES)) * 50, seed=9, mode=mode)  # type: ignore[arg-type]
    first = population.participate(spec_with_groups(campaign_epsilon=1.5, round=1))
    groups_first = {r.report_id: r.group for r in first}
    # Asking again in the same round produces no new report (device mode returns the stored one,
    # which the simulator has not acknowledged; direct mode skips devices already charged).
    again = population.participate(spec_with_groups(campaign_epsilon=1.5, round=1))
    if mode == "device":
        assert {r.report_id for r in again} == set(groups_first)
    else:
        assert again == []
    population.acknowledge(first)
    # Round 2 would bring the campaign's spending to 2 > 1.5: every reporting device refuses.
    second = population.participate(spec_with_groups(campaign_epsilon=1.5, round=2))
    assert second == []
    assert population.refused == len(first)
    assert population.epsilon_spent("sim-test").max() == 1.0
    # Every device stays in the group it picked first.
    third = Population(list(range(CATEGORIES)) * 50, seed=9, mode=mode)  # type: ignore[arg-type]
    round1 = third.participate(spec_with_groups(campaign_epsilon=4.0, round=1))
    third.acknowledge(round1)
    round2 = third.participate(spec_with_groups(campaign_epsilon=4.0, round=2))
    assert sorted(r.group for r in round1) == sorted(r.group for r in round2)


@pytest.mark.parametrize("mode", ["device", "direct"])
def test_the_device_policy_is_checked(mode: str) -> None:
    strict = DevicePolicy(max_epsilon_per_campaign=1.0)
    with pytest.raises(PolicyViolationError, match="campaign_epsilon 2"):
        simulate_round(spec_with_groups(campaign_epsilon=2.0), [0, 1, 2], 1, policy=strict, mode=mode)  # type: ignore[arg-type]


def test_simulate_round_is_reproducible_and_rejects_bad_input() -> None:
    spec = spec_with_groups()
    points = [i % CATEGORIES for i in range(200)]
    a = simulate_round(spec, points, 42, mode="direct")
    b = simulate_round(spec, points, 42, mode="direct")
    assert [timeless(r) for r in a] == [timeless(r) for r in b]
    with pytest.raises(TypeError, match="spec must be a RoundSpec"):
        simulate_round("spec", points, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="mode must be"):
        Population(points, seed=1, mode="fast")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="at least one device"):
        Population([], seed=1)


def test_numeric_points_are_encoded_by_the_rounds_encoder() -> None:
    domain = NumericDomain(lower=(0.0, 0.0), upper=(1.0, 1.0))
    component = Component(encoder=UniformGridEncoder(domain=domain, cells_per_dimension=(4, 4)), mechanism=oue(16, 2.0))
    spec = RoundSpec(campaign_id="grid-test", round=1, group_weights=(1,),
                     tasks=(GroupTask(groups=(0,), components=(component,)),), campaign_epsilon=2.0)
    points = np.array([[0.1, 0.1], [0.9, 0.9], [0.6, 0.1]])
    assert histogram_truth(spec, points).tolist() == [1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1]
    reports = simulate_round(spec, points, 3)
    assert all(isinstance(r.payloads[0], bytes) and len(r.payloads[0]) == 2 for r in reports)  # 16 bits packed
    lower, upper = numeric_bounds(np.array([[1.0, 5.0], [3.0, 5.0]]))
    assert lower == (1.0, 4.5) and upper == (3.0, 5.5)


# -- a campaign in-process -----------------------------------------------------------------------------

@pytest.fixture
def store(tmp_path: Path) -> Iterator[ReportStore]:
    s: ReportStore = open_store(str(tmp_path / "ldp-data"))
    try:
        yield s
    finally:
        s.close()


def histogram_config(x: np.ndarray, cells: int, epsilon: float) -> campaigns_pb2.CampaignConfig:
    lower, upper = numeric_bounds(x)
    config = campaigns_pb2.CampaignConfig(kind=campaigns_pb2.HISTOGRAM, epsilon=epsilon)
    config.domain.numeric.lower.extend(lower)
    config.domain.numeric.upper.extend(upper)
    config.histogram.cells_per_dimension.extend([cells, cells])
    return config


def test_run_campaign_in_process_estimates_within_their_standard_errors(store: ReportStore) -> None:
    x, _ = make_dataset("moons", 20_000, seed=4)
    run = run_campaign(Collector(store), config_from_proto(histogram_config(x, 16, 2.0)), x, seed=4, quiet=True)
    stats = run.stats
    assert (stats.devices, stats.rounds, stats.reports_sent, stats.accepted, stats.rejected) == (20_000, 1, 20_000,
                                                                                                 20_000, 0)
    assert stats.epsilon_per_device == 2.0 and stats.mean_epsilon_per_device == 2.0
    assert stats.mode == "device" and stats.wall_time_s > 0
    # The phases split the campaign's wall time (the population's setup comes before it).
    assert tuple(stats.phase_s) == tuple(stats.phase_cpu_s) == PHASES
    assert all(seconds >= 0 for seconds in (*stats.phase_s.values(), *stats.phase_cpu_s.values()))
    assert min(stats.phase_s["reports"], stats.phase_s["ingest"], stats.phase_s["steps"]) > 0
    assert min(stats.phase_cpu_s["reports"], stats.phase_cpu_s["ingest"], stats.phase_cpu_s["steps"]) > 0
    assert math.isclose(sum(stats.phase_s.values()) - stats.phase_s["devices"], stats.wall_time_s, rel_tol=1e-9)
    assert stats.to_dict()["phase_s"] == stats.phase_s and stats.to_dict()["phase_cpu_s"] == stats.phase_cpu_s
    assert run.campaign.state == campaigns_pb2.FINISHED
    errors = evaluate_histogram(run.result.estimates, histogram_truth(run.first_spec, x))
    assert errors["reports"] == 20_000 and errors["values"] == 256
    # 256 cells: a cell beyond 5 SE fails falsely with probability < 256 * 5.7e-7 = 1.5e-4; the mean
    # |z| of 256 half-normal values is 0.80 with standard deviation 0.6 / 16 = 0.04 (bounds at 4 SD).
    assert errors["max_abs_z"] < 5.0
    assert 0.64 < errors["mean_abs_z"] < 0.96
    assert errors["ci_coverage"] > 0.85
    # OUE at epsilon 2: the SE of a frequency is about sqrt(4 e^2 / (e^2 - 1)^2 / n) = 0.0060.
    assert errors["max_abs_freq_error"] < 5 * 0.0060


def test_run_campaign_direct_mode_and_small_batches(store: ReportStore) -> None:
    points = [i % CATEGORIES for i in range(3000)]
    config = campaigns_pb2.CampaignConfig(kind=campaigns_pb2.HISTOGRAM, epsilon=1.0)
    config.domain.categorical_size = CATEGORIES
    run = run_campaign(InProcessCollector(Collector(store)), config_from_proto(config), points, seed=2, mode="direct",
                       batch_size=250, quiet=True)
    assert run.stats.mode == "direct" and run.stats.accepted == 3000
    truth = histogram_truth(run.first_spec, points)
    assert truth.tolist() == [500] * CATEGORIES
    for e in run.result.estimates.estimates:
        assert abs(e.count - 500) <= 5 * e.std_error
    with pytest.raises(InvalidParameterError, match="batch_size"):
        run_campaign(Collector(store), config_from_proto(config), points, batch_size=0)


# -- evaluation ----------------------------------------------------------------------------------------

def test_adjusted_rand_index_and_nmi_textbook_values() -> None:
    assert adjusted_rand_index([0, 0, 1, 1], [1, 1, 0, 0]) == pytest.approx(1.0)
    assert adjusted_rand_index([0, 0, 1, 1], [0, 0, 1, 2]) == pytest.approx(0.5714285714285715)
    assert adjusted_rand_index([0, 0, 0, 0], [0, 0, 0, 0]) == 1.0
    assert normalized_mutual_info([0, 0, 1, 1], [1, 1, 0, 0]) == pytest.approx(1.0)
    assert normalized_mutual_info([0, 0, 1, 1], [0, 0, 1, 2]) == pytest.approx(0.8, abs=1e-12)
    assert normalized_mutual_info([0, 1, 0, 1], [0, 0, 1, 1]) == pytest.approx(0.0, abs=1e-12)
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 3, size=3000)
    assert abs(adjusted_rand_index(rng.integers(0, 3, size=3000), noise)) < 0.01


def test_hungarian_accuracy_matches_brute_force() -> None:
    rng = np.random.default_rng(1)
    for trial in range(20):
        k_true, k_pred = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        a = rng.integers(0, k_true, size=60)
        b = rng.integers(0, k_pred, size=60)
        values_a, values_b = np.unique(a), np.unique(b)
        best = 0
        small, large = (values_a, values_b) if len(values_a) <= len(values_b) else (values_b, values_a)
        for perm in itertools.permutations(large.tolist(), len(small)):
            mapping = dict(zip(small.tolist(), perm))
            if len(values_a) <= len(values_b):
                hits = sum(mapping[x] == y for x, y in zip(a.tolist(), b.tolist()))
            else:
                hits = sum(mapping[y] == x for x, y in zip(a.tolist(), b.tolist()))
            best = max(best, hits)
        assert clustering_accuracy(a, b) == pytest.approx(best / 60), trial


def test_evaluate_clustering_with_centers_and_with_a_cell_map() -> None:
    x, labels = make_dataset("blobs", 3000, k=3, seed=2)
    centers = kmeans(x, 3, seed=0)
    assert kmeans_cost(x, centers) <= kmeans_cost(x, centers + 0.5)
    result = Result(clustering=Clustering(k=3, dimension=2, centers=tuple(centers.reshape(-1).tolist())))
    scores = evaluate_clustering(result, x, labels, k=3)
    assert scores["cost_ratio"] == pytest.approx(1.0, abs=0.02)
    assert scores["ari"] > 0.9 and scores["accuracy"] > 0.95 and scores["nmi"] > 0.9

    # A grid clustering: the four level-1 cells of [0, 1]^2; left half cluster 0, right half 1.
    points = np.array([[0.1, 0.2], [0.2, 0.9], [0.8, 0.1], [0.9, 0.7]])
    # Morton index bit 0 is dimension 0: cells 0 and 2 are the left half.
    cell_map = CellClusterModel(domain=NumericDomain(lower=(0.0, 0.0), upper=(1.0, 1.0)),
                                cells=tuple(TreeCell(level=1, morton_index=m) for m in range(4)), labels=(0, 1, 0, 1))
    grid = Result(clustering=Clustering(dimension=2, cell_map=cell_map))
    scores = evaluate_clustering(grid, points, np.array([5, 5, 7, 7]))
    assert scores["accuracy"] == 1.0 and scores["ari"] == pytest.approx(1.0) and scores["noise_share"] == 0.0
    with pytest.raises(InvalidParameterError, match="no clustering"):
        evaluate_clustering(Result(), points, None)
    with pytest.raises(InvalidParameterError, match="no clustering"):
        evaluate_clustering(Result(clustering=Clustering(dimension=2)), points, None)


def test_evaluate_histogram_statistics() -> None:
    estimates = Estimates(reports=100, confidence=0.95, estimates=tuple(
        Estimate(value=value, count=count, std_error=se, ci_lower=count - 1.96 * se, ci_upper=count + 1.96 * se)
        for value, (count, se) in enumerate([(12.0, 2.0), (90.0, 5.0)])))
    errors = evaluate_histogram(estimates, [10, 90])
    assert errors["max_abs_freq_error"] == pytest.approx(0.02)
    assert errors["mean_abs_z"] == pytest.approx(0.5)
    assert errors["ci_coverage"] == 1.0
    assert math.isclose(errors["rmse_count"], math.sqrt(2.0))
    with pytest.raises(InvalidParameterError, match="outside the 1 true counts"):
        evaluate_histogram(estimates, [10])
