"""The NETTREE engine (DESIGN.md §7.4): configuration, the one round, the server step, end to end.

End-to-end campaigns run through the in-process collector and the simulator (``mode="direct"``,
seeded), with fixed campaign ids so the public hyperplanes, shifts and k-means++ seeds are fixed
too. ARI floors come from measured runs (``ARI_FLOORS``).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest

from ldp.v1 import campaigns_pb2, encoders_pb2
from ldp_client.encoders.bucketed import BucketedVectorEncoder
from ldp_client.encoders.lsh import ShiftedGridEncoder, SimHashEncoder
from ldp_client.mechanisms import GRRParams, LocalHashingParams, UnaryEncodingParams
from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams, VectorShape
from ldp_collector.campaigns import prepare_campaign
from ldp_collector.core import Collector
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.estimation.heavy_hitters import bonferroni_z
from ldp_collector.estimation.net_tree import (
    DETECTION_POWER,
    MASS_FRACTION,
    NetTreeLayout,
    node_epsilon_needed,
    signal_to_noise,
)
from ldp_collector.kinds import KINDS
from ldp_collector.kinds._lsh import vector_shape
from ldp_collector.kinds.nettree import (
    DEFAULT_DEPTH,
    DEFAULT_NODE_SHARE,
    MIN_NODE_SHARE,
    NetTreeEngine,
    default_bits_per_level,
    leaf_nodes,
    noiseless_outcome,
)
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.evaluation import evaluate_clustering
from ldp_collector.simulation.runner import CampaignRun, run_campaign
from ldp_collector.simulation.scores import kmeans_cost, reference_kmeans_cost
from ldp_collector.storage import open_store

NT = campaigns_pb2.NetTreeParameters


def nettree_config(lower: Sequence[float], upper: Sequence[float], *, epsilon: float = 4.0, k: int = 4,
                   campaign_id: str = "", **params: Any) -> campaigns_pb2.CampaignConfig:
    config = campaigns_pb2.CampaignConfig(
        seed=0, campaign_id=campaign_id, kind=campaigns_pb2.NETTREE, epsilon=epsilon,
        domain=campaigns_pb2.Domain(numeric=encoders_pb2.NumericDomain(lower=list(lower), upper=list(upper))))
    config.nettree.k = k
    for key, value in params.items():
        setattr(config.nettree, key, value)
    return config


def engine_for(config: campaigns_pb2.CampaignConfig) -> NetTreeEngine:
    engine = prepare_campaign(config_from_proto(config)).engine
    assert isinstance(engine, NetTreeEngine)
    return engine


def test_registered() -> None:
    assert KINDS["nettree"].engine is NetTreeEngine


def test_defaults_are_filled_in() -> None:
    high = engine_for(nettree_config([0.0] * 10, [1.0] * 10, k=8, campaign_id="nt-d10"))
    p = high.config.parameters
    assert p.depth == DEFAULT_DEPTH and p.node_map == NT.SIMHASH and p.projection_dimension == 10
    assert p.bits_per_level == default_bits_per_level(8, DEFAULT_DEPTH) == 2
    assert p.max_nodes_per_level == 64 and p.node_share == DEFAULT_NODE_SHARE and p.false_positive_rate == 0.05
    assert high.projection is None  # d <= 16: no projection
    wide = engine_for(nettree_config([0.0] * 40, [1.0] * 40, k=8, campaign_id="nt-d40"))
    assert wide.config.parameters.projection_dimension == 16 and wide.projection is not None
    low = engine_for(nettree_config([0.0] * 2, [1.0] * 2, k=3, campaign_id="nt-d2"))
    assert low.config.parameters.node_map == NT.SHIFTED_GRID and low.config.parameters.bits_per_level == 2


def test_vector_shape_picks_the_bucketized_randomizer() -> None:
    """Unspecified: the least-error randomizer at d + 1 (:func:`vector_shape`); otherwise the shape asked for."""
    from ldp_client.mechanisms.bucketized_vector import VectorShape
    from ldp_client.mechanisms.vector_privunit import VectorPrivUnitParams

    default = engine_for(nettree_config([0.0] * 10, [1.0] * 10, k=8, campaign_id="nt-shape-default"))
    assert default.vector.mechanism.shape == vector_shape(11, default.vector_epsilon)
    for shape in (VectorShape.L2_BALL, VectorShape.BOX, VectorShape.PRIVUNIT):
        engine = engine_for(nettree_config([0.0] * 10, [1.0] * 10, k=8, vector_shape=int(shape),
                                           campaign_id=f"nt-shape-{int(shape)}"))
        assert engine.vector.mechanism.shape == shape
    assert isinstance(engine.vector.mechanism.inner, VectorPrivUnitParams)
    assert engine.vector.mechanism.inner.epsilon == engine.vector_epsilon


@pytest.mark.parametrize(("params", "message"), [
    ({"k": 1}, "nettree.k"),
    ({"k": 300}, "nettree.k"),
    ({"depth": 17}, "nettree.depth"),
    ({"node_map": 7}, "node_map"),
    ({"node_map": NT.SHIFTED_GRID, "projection_dimension": 9}, "projection_dimension"),
    ({"projection_dimension": 11}, "projection_dimension"),
    ({"node_map": NT.SHIFTED_GRID, "bits_per_level": 3}, "bits_per_level"),
    ({"bits_per_level": 20, "depth": 4}, "at most 62"),
    ({"max_nodes_per_level": 5000}, "max_nodes_per_level"),
    ({"node_share": 1.0}, "node_share"),
    ({"node_share": -0.5}, "node_share"),
    ({"false_positive_rate": 1.5}, "false_positive_rate"),
    ({"refinement_share": 0.95}, "refinement_share"),
    ({"refinement_share": -0.1}, "refinement_share"),
    ({"vector_shape": 9}, "nettree.vector_shape 9"),
])
def test_bad_parameters_name_the_field(params: dict[str, Any], message: str) -> None:
    k = params.pop("k", 4)
    with pytest.raises(InvalidArgumentError, match=message):
        engine_for(nettree_config([0.0] * 10, [1.0] * 10, k=k, **params))


def test_bad_domain_and_epsilon() -> None:
    config = nettree_config([0.0], [1.0])
    config.domain.categorical_size = 5
    with pytest.raises(InvalidArgumentError, match="numeric domain"):
        engine_for(config)
    for epsilon in (0.0, 25.0, math.inf):
        with pytest.raises(InvalidArgumentError, match="epsilon"):
            engine_for(nettree_config([0.0], [1.0], epsilon=epsilon))


@pytest.mark.parametrize("node_map", [NT.SIMHASH, NT.SHIFTED_GRID])
def test_one_round_one_message_of_two_components_spending_epsilon(node_map: int) -> None:
    engine = engine_for(nettree_config([0.0] * 6, [1.0] * 6, epsilon=3.0, k=4, node_map=node_map, depth=3,
                                       node_share=0.25, campaign_id=f"nt-round-{node_map}",
                                       projection_dimension=3 if node_map == NT.SHIFTED_GRID else 0))
    spec = engine.first_round().spec
    assert spec.round == 1 and spec.max_reports_per_device == 1 and spec.group_weights == (1, 1, 1)
    assert [t.groups for t in spec.tasks] == [(0,), (1,), (2,)]
    b = engine.layout.child_bits
    vector = spec.tasks[0].components[1]
    for level, task in enumerate(spec.tasks, start=1):
        node, vec = task.components
        assert vec == vector  # every device buckets its vector by its depth-T node
        assert isinstance(node.mechanism, (GRRParams, UnaryEncodingParams, LocalHashingParams))
        assert node.mechanism.domain_size == 1 << (level * b)
        assert node.mechanism.epsilon == pytest.approx(0.75)
        assert task.epsilon == pytest.approx(3.0)  # sequential composition within the one report
    assert isinstance(vector.mechanism, BucketizedVectorParams) and isinstance(vector.encoder, BucketedVectorEncoder)
    assert vector.mechanism.epsilon == pytest.approx(2.25) and vector.mechanism.dimension == 7
    assert vector.mechanism.bucket_bits == 3 * b == vector.encoder.bucket_bits
    assert vector.mechanism.shape == vector_shape(7, 2.25)
    # The node maps nest: a device's level-l node is the prefix of its depth-T node (its vector's bucket).
    rng = np.random.default_rng(3)
    for point in rng.uniform(0.0, 1.0, size=(200, 6)).tolist():
        leaf, _ = vector.encoder.encode(point)
        for level, task in enumerate(spec.tasks, start=1):
            assert task.components[0].encoder.encode(point) == leaf >> ((3 - level) * b)
    expected = ShiftedGridEncoder if node_map == NT.SHIFTED_GRID else SimHashEncoder
    assert all(isinstance(t.components[0].encoder, expected) for t in spec.tasks)


def test_vector_shape_picks_the_least_error() -> None:
    """The least per-report error E||z||^2 / D of box, l2 ball and PrivUnit; ties to the cheaper report."""
    from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams

    def error(d: int, eps: float, shape: VectorShape) -> float:
        return BucketizedVectorParams(bucket_bits=0, dimension=d, epsilon=eps, shape=shape).report_mean_second_moment

    for d, eps in [(2, 0.1), (2, 4.0), (3, 0.1), (3, 2.0), (6, 1.0), (10, 0.1), (10, 4.0), (11, 1.0), (11, 2.0), (30, 2.0)]:
        chosen = vector_shape(d, eps)
        assert all(error(d, eps, chosen) <= error(d, eps, s) * (1 + 1e-9) for s in VectorShape), (d, eps)
    # Odd dimension: box and l2 ball tie in the Duchi construction up to rounding, and PrivUnit's cap is
    # the ball's hemisphere at small epsilon: the box, the cheapest report. Even: the box pays for the
    # cube's equator at small epsilon (see ldp_collector.estimation.vectors).
    assert vector_shape(3, 0.1) == VectorShape.BOX
    assert vector_shape(10, 0.1) == VectorShape.L2_BALL
    assert vector_shape(2, 4.0) == VectorShape.BOX and vector_shape(6, 1.0) == VectorShape.BOX
    # PrivUnit from about epsilon 1 at D >= 3: 68.7 against 77.3 at D = 11, epsilon 1 (NETTREE's d = 10 at 2).
    assert vector_shape(11, 1.0) == vector_shape(10, 4.0) == vector_shape(11, 2.0) == VectorShape.PRIVUNIT


def run(config: campaigns_pb2.CampaignConfig, x: np.ndarray, seed: int = 1) -> CampaignRun:
    with tempfile.TemporaryDirectory() as tmp:
        return run_campaign(Collector(open_store(tmp)), config_from_proto(config), x, seed=seed, mode="direct", quiet=True)


#: Measured ARI (fixed campaign ids and seeds): see each test; floors sit below the measured values.
ARI_FLOORS = {"mixture-2d": 0.9, "google-10d": 0.9}


def test_end_to_end_recovers_a_separated_2d_mixture() -> None:
    x, truth = make_dataset("mixture", 20_000, d=2, k=4, seed=3, separation=4.0)
    lower, upper = x.min(axis=0) - 1.0, x.max(axis=0) + 1.0
    config = nettree_config(lower.tolist(), upper.tolist(), epsilon=4.0, k=4, campaign_id="nt-e2e-2d")
    outcome = run(config, x)
    result = outcome.result
    assert result.state == campaigns_pb2.FINISHED and not list(result.warnings)
    c = result.clustering
    assert c.k == 4 and c.dimension == 2
    centers = np.asarray(c.centers).reshape(4, 2)
    assert np.all(centers >= lower) and np.all(centers <= upper)  # original units, inside the box
    assert sum(c.weights) == pytest.approx(1.0)
    scores = evaluate_clustering(result, x, truth)
    assert scores["ari"] >= ARI_FLOORS["mixture-2d"], scores
    d = dict(result.diagnostics)
    assert d["reports"] == 20_000 and d["leaves"] >= 4 and 0.5 < d["coverage"] <= 1.2
    assert d["signal_to_noise"] > 5 and d["center_error_floor"] > 0
    assert outcome.stats.rounds == 1 and outcome.stats.reports_sent == 20_000


def test_too_few_reports_publish_no_centers() -> None:
    x, _ = make_dataset("mixture", 3, d=2, k=4, seed=0)
    config = nettree_config([-20.0, -20.0], [20.0, 20.0], k=4, campaign_id="nt-few")
    result = run(config, x).result
    assert result.state == campaigns_pb2.FINISHED and result.clustering.k == 0 and not result.clustering.centers
    assert any("fewer than the k" in w for w in result.warnings)


def test_undetectable_clusters_say_so_and_publish_best_effort_centers() -> None:
    """n = 2000 at epsilon 0.5: the node counts' noise (sigma ~ 500) swamps every cluster. The engine says
    so, and still publishes the centers of the heaviest leaves below what passed, marked best-effort."""
    x, _ = make_dataset("mixture", 2000, d=2, k=4, seed=0)
    config = nettree_config([-20.0, -20.0], [20.0, 20.0], epsilon=0.5, k=4, campaign_id="nt-weak")
    result = run(config, x).result
    assert result.state == campaigns_pb2.FINISHED and result.clustering.k == 4
    assert result.diagnostics["signal_to_noise"] < 2 and result.diagnostics["best_effort"] == 1
    (warning,) = [w for w in result.warnings if "not detectable" in w]
    assert "best-effort centers from the 4 nodes with the largest estimated counts at depth 4" in warning
    centers = np.asarray(result.clustering.centers).reshape(4, 2)
    assert np.all(centers >= -20.0) and np.all(centers <= 20.0)


def test_no_reports_publish_no_centers() -> None:
    engine = engine_for(nettree_config([0.0] * 3, [1.0] * 3, k=3, campaign_id="nt-none"))
    outcome = engine.server_step(0, lambda level, candidates: None, lambda nodes: np.zeros((nodes.size, 3)),
                                 vector_variance=1.0)
    assert outcome.result is not None and not outcome.result.clustering.centers
    assert outcome.result.warnings == ("the round received no reports: no centers published",)


@pytest.mark.parametrize("stop_at", [2, 3])
def test_best_effort_leaves_descend_from_the_deepest_nodes_that_passed(stop_at: int) -> None:
    """Level 1 holds two clear clusters (nodes 1 and 2), level 2 three (nodes 4, 5 and 8); from level
    ``stop_at`` on no count passes any threshold. The best-effort leaves are the heaviest descendants
    of the deepest nodes that passed, and every leaf's sum is asked for."""
    n, k = 10_000, 4
    engine = engine_for(nettree_config([0.0] * 6, [1.0] * 6, k=k, depth=3, node_map=NT.SIMHASH, bits_per_level=2,
                                       campaign_id="nt-best-effort"))
    passing = {1: {1: 5000.0, 2: 5000.0}, 2: {4: 2600.0, 5: 2400.0, 8: 5000.0}}

    def estimate(level: int, candidates: np.ndarray) -> tuple[np.ndarray, float]:
        # Below every threshold (z sigma >= 600, n / (64 k) = 39): small positive counts.
        counts = np.array([passing[level].get(int(c), 1.0 + int(c) % 7) if level < stop_at else 1.0 + int(c) % 7
                           for c in candidates])
        return counts, 200.0

    asked: list[np.ndarray] = []

    def leaf_sums(nodes: np.ndarray) -> np.ndarray:
        asked.append(nodes.copy())
        return np.tile(np.linspace(-0.5, 0.5, 6), (nodes.size, 1)) * 1000.0

    outcome = engine.server_step(n, estimate, leaf_sums, vector_variance=0.0)
    result, diagnostics = outcome.result, outcome.diagnostics
    deepest = stop_at - 1
    assert result is not None and diagnostics["best_effort"] == 1 and diagnostics["best_effort_from_level"] == deepest
    (leaves,) = asked
    assert leaves.size == k  # as many as k per level below the nodes that passed (fewer than k)
    allowed = {1, 2} if deepest == 1 else {4, 5, 8}
    assert {int(leaf) >> (2 * (3 - deepest)) for leaf in leaves} <= allowed
    (warning,) = [w for w in result.warnings if "best-effort" in w]
    assert "the tree did not reach depth 3" in warning and f"that passed level {deepest}" in warning
    assert result.clustering.centers


@pytest.mark.parametrize(("node_map", "d", "projection"), [(NT.SIMHASH, 6, 0), (NT.SIMHASH, 30, 8),
                                                          (NT.SHIFTED_GRID, 3, 0), (NT.SHIFTED_GRID, 8, 3)])
def test_vectorized_leaf_nodes_match_the_devices_encoder(node_map: int, d: int, projection: int) -> None:
    engine = engine_for(nettree_config([-1.0] * d, [2.0] * d, k=4, node_map=node_map, depth=3,
                                       projection_dimension=projection, campaign_id=f"nt-leaves-{node_map}-{d}"))
    points = np.random.default_rng(d).uniform(-1.5, 2.5, size=(300, d))  # some outside the box: clamped
    expected = [engine.node_encoders[-1].encode(p) for p in points.tolist()]
    assert leaf_nodes(engine, points).tolist() == expected


def test_noiseless_limit_matches_nonprivate_kmeans() -> None:
    """Epsilon = infinity: exact counts and sums leave only the coreset's approximation."""
    x, truth = make_dataset("google", 50_000, d=10, k=8, seed=2)
    engine = engine_for(nettree_config(x.min(axis=0).tolist(), x.max(axis=0).tolist(), k=8, campaign_id="nt-exact"))
    outcome = noiseless_outcome(engine, x)
    result = outcome.result
    assert result is not None and result.clustering.k == 8
    centers = np.asarray(result.clustering.centers).reshape(8, 10)
    ratio = kmeans_cost(x, centers) / reference_kmeans_cost(x, 8, 0, n_init=3)
    scores = evaluate_clustering(result, x, truth)
    # Measured: ARI 1.000 and cost ratio 1.01 (the leaves that miss the mass threshold are the only loss).
    assert scores["ari"] > 0.99 and ratio < 1.05, (scores, ratio)


@pytest.mark.parametrize("n", [1e4, 1e6, 1e8])
def test_the_needed_node_epsilon_gives_the_needed_signal_to_noise(n: float) -> None:
    """At ``node_epsilon_needed`` the average cluster's signal-to-noise is exactly MASS_FRACTION (z_alpha + z_power)."""
    layout = NetTreeLayout(levels=4, child_bits=2)
    k, alpha = 8, 0.05
    eps = node_epsilon_needed(n, k, layout, alpha)
    z = bonferroni_z(int(k * MASS_FRACTION * 4), alpha) + NormalDist().inv_cdf(1 - (1 - DETECTION_POWER) / (k * 4))
    assert signal_to_noise(n, k, eps, layout.levels) == pytest.approx(MASS_FRACTION * z, rel=1e-9)
    assert node_epsilon_needed(4 * n, k, layout, alpha) < eps  # more devices, less epsilon for the tree


def test_expected_reports_plans_the_node_share() -> None:
    """The tree gets what it needs for the expected population (at most half); unknown, half; a set share wins."""
    def share(**params: Any) -> float:
        engine = engine_for(nettree_config([0.0] * 10, [1.0] * 10, epsilon=2.0, k=8, **params))
        assert engine.node_epsilon + engine.vector_epsilon <= 2.0
        return float(engine.config.parameters.node_share)

    layout = NetTreeLayout(levels=DEFAULT_DEPTH, child_bits=default_bits_per_level(8, DEFAULT_DEPTH))
    assert share() == DEFAULT_NODE_SHARE
    assert share(expected_reports=10**6) == pytest.approx(node_epsilon_needed(1e6, 8, layout, 0.05) / 2.0)
    assert 0.3 < share(expected_reports=10**6) < 0.5
    assert share(expected_reports=10**4) == DEFAULT_NODE_SHARE  # the tree would need more than half: capped
    assert share(expected_reports=10**12) == MIN_NODE_SHARE
    assert share(expected_reports=10**6, node_share=0.7) == 0.7
    with pytest.raises(InvalidArgumentError, match="expected_reports"):
        share(expected_reports=10**13)


def test_simulate_plans_for_its_own_population(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """``simulate`` sets expected_reports to the simulated n unless --expected-reports says otherwise."""
    from ldp_collector import cli, cli_simulate

    class Stop(BaseException):
        """Ends the command once the campaign is built (a BaseException: no handler of the CLI takes it)."""

    configs: list[Any] = []

    def built(args: Any, config: Any, points: Any) -> Any:
        configs.append(config)
        raise Stop

    monkeypatch.setattr(cli_simulate, "_run_simulation", built)
    for extra in ((), ("--expected-reports", "5000000")):
        with pytest.raises(Stop):
            cli.main(["simulate", "--kind", "nettree", "--dataset", "mixture", "--d", "2", "--k", "3", "--n", "300",
                      *extra])
    capsys.readouterr()
    assert [c.parameters.expected_reports for c in configs] == [300, 5_000_000]


def test_a_refinement_round_goes_to_fresh_devices_with_the_whole_epsilon() -> None:
    config = nettree_config([0.0] * 3, [1.0] * 3, epsilon=2.0, k=4, refinement_share=0.3)
    engine = engine_for(config)
    first = engine.first_round()
    weights = first.spec.group_weights
    levels = engine.layout.levels
    assert len(weights) == levels + 1 and weights[levels] / sum(weights) == pytest.approx(0.3, abs=1e-5)
    assert [t.groups for t in first.spec.tasks] == [(g,) for g in range(levels)]  # group T waits for round 2
    split = nettree_config([0.0] * 3, [1.0] * 3, epsilon=2.0, k=4, refinement_share=0.3)
    split.budget_policy = campaigns_pb2.SPLIT
    with pytest.raises(InvalidArgumentError, match="PARTITION"):
        engine_for(split)


def test_refinement_moves_the_centers_to_their_devices_means() -> None:
    """End to end: round 2 asks the held-back group only, each device reports once, the centers move."""
    x, truth = make_dataset("mixture", 20_000, d=2, k=4, seed=3, separation=4.0)
    lower, upper = x.min(axis=0) - 1.0, x.max(axis=0) + 1.0
    config = nettree_config(lower.tolist(), upper.tolist(), epsilon=4.0, k=4, campaign_id="nt-refine",
                            refinement_share=0.3)
    outcome = run(config, x)
    assert outcome.stats.rounds == 2 and outcome.stats.reports_sent == 20_000  # one report per device
    result = outcome.result
    d = dict(result.diagnostics)
    # The held-back group is a binomial share of the devices: within 5 standard deviations of 0.3 n.
    assert abs(d["refinement_reports"] - 6000) <= 5 * math.sqrt(20_000 * 0.3 * 0.7)
    assert d["refinement_centers_moved"] == 4 and d["floor_center_error"] > 0
    scores = evaluate_clustering(result, x, truth)
    assert scores["ari"] >= ARI_FLOORS["mixture-2d"], scores
