"""The STEMMER engine (DESIGN.md §7.3): configuration, the rounds and their groups, budgets, end to end.

End-to-end campaigns run through the in-process collector and the simulator (``mode="direct"``,
seeded), with fixed campaign ids so every public projection, shift and k-means++ seed is fixed.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from ldp.v1 import campaigns_pb2, encoders_pb2
from ldp_client.encoders.bucketed import BucketedVectorEncoder
from ldp_client.encoders.lsh import ShiftedGridEncoder
from ldp_client.encoders.nearest import NearestCandidateEncoder
from ldp_client.mechanisms import LocalHashingParams
from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams
from ldp_client.report import Report
from ldp_client.rng import SeededRng
from ldp_client.spec import RoundSpec
from ldp_collector.campaigns import prepare_campaign
from ldp_collector.core import Collector
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.estimation.vector_sum import shrink_toward_centroid
from ldp_collector.ingest import RoundContext, validate_report
from ldp_collector.kinds import KINDS
from ldp_collector.kinds.base import load_state
from ldp_collector.kinds.stemmer import (
    _PHASES,
    DEFAULT_REPETITIONS,
    DEFAULT_SCALES,
    SHARES_WITH_LLOYD,
    SHARES_WITHOUT_LLOYD,
    StemmerEngine,
    noiseless_outcome,
)
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.evaluation import evaluate_clustering
from ldp_collector.simulation.runner import CampaignRun, run_campaign
from ldp_collector.simulation.scores import kmeans_cost, reference_kmeans_cost
from ldp_collector.storage import open_store
from ldp_collector.storage.base import StoredReport
from support.recording import RecordingCollector
from support.round_reports import ListRoundReports


def stemmer_config(lower: Sequence[float], upper: Sequence[float], *, epsilon: float = 4.0, k: int = 4,
                   campaign_id: str = "", policy: int = campaigns_pb2.BUDGET_POLICY_UNSPECIFIED,
                   **params: Any) -> campaigns_pb2.CampaignConfig:
    config = campaigns_pb2.CampaignConfig(
        seed=0, campaign_id=campaign_id, kind=campaigns_pb2.STEMMER, epsilon=epsilon, budget_policy=policy,  # type: ignore[arg-type]
        domain=campaigns_pb2.Domain(numeric=encoders_pb2.NumericDomain(lower=list(lower), upper=list(upper))))
    config.stemmer.k = k
    for key, value in params.items():
        setattr(config.stemmer, key, value)
    return config


def engine_for(config: campaigns_pb2.CampaignConfig) -> StemmerEngine:
    engine = prepare_campaign(config_from_proto(config)).engine
    assert isinstance(engine, StemmerEngine)
    return engine


def test_registered_and_defaults() -> None:
    assert KINDS["stemmer"].engine is StemmerEngine
    engine = engine_for(stemmer_config([0.0] * 10, [1.0] * 10, k=8, campaign_id="st-def"))
    p = engine.config.parameters
    assert p.projection_dimension == 4 and p.scales == DEFAULT_SCALES and p.repetitions == DEFAULT_REPETITIONS
    assert engine.lloyd and engine.rounds == 4 and not engine.split and p.lloyd_refinement
    assert engine.subgroups == DEFAULT_SCALES * DEFAULT_REPETITIONS


def test_vector_shape_picks_the_bucketized_randomizer() -> None:
    """Unspecified: the least-error randomizer at d + 1 (nettree's rule); otherwise the shape asked for, everywhere."""
    from ldp_client.mechanisms.bucketized_vector import VectorShape
    from ldp_collector.kinds._lsh import vector_shape

    default = engine_for(stemmer_config([0.0] * 5, [1.0] * 5, k=3, campaign_id="st-shape-default"))
    assert default.vector_shape == vector_shape(6, default.vector_components[0].mechanism.epsilon)
    for shape in (VectorShape.L2_BALL, VectorShape.BOX, VectorShape.PRIVUNIT):
        engine = engine_for(stemmer_config([0.0] * 5, [1.0] * 5, k=3, vector_shape=int(shape),
                                           campaign_id=f"st-shape-{int(shape)}"))
        assert engine.vector_shape == shape
        assert {c.mechanism.shape for c in engine.vector_components} == {shape}


@pytest.mark.parametrize(("params", "message"), [
    ({"k": 1}, "stemmer.k"),
    ({"projection_dimension": 7}, "projection_dimension"),
    ({"scales": 17}, "scales"),
    ({"repetitions": 9}, "repetitions"),
    ({"threshold_z": -1.0}, "threshold_z"),
    ({"threshold_z": math.nan}, "threshold_z"),
    ({"vector_shape": 9}, "stemmer.vector_shape 9"),
])
def test_bad_parameters_name_the_field(params: dict[str, Any], message: str) -> None:
    k = params.pop("k", 4)
    with pytest.raises(InvalidArgumentError, match=message):
        engine_for(stemmer_config([0.0] * 10, [1.0] * 10, k=k, **params))


def test_bad_domain_and_epsilon() -> None:
    config = stemmer_config([0.0], [1.0])
    config.domain.categorical_size = 5
    with pytest.raises(InvalidArgumentError, match="numeric domain"):
        engine_for(config)
    with pytest.raises(InvalidArgumentError, match="epsilon"):
        engine_for(stemmer_config([0.0], [1.0], epsilon=25.0))
    # SPLIT spends epsilon / rounds per report: 60 over 3 rounds is 20 per report, allowed.
    engine_for(stemmer_config([0.0], [1.0], epsilon=60.0, policy=campaigns_pb2.SPLIT))


@pytest.mark.parametrize("lloyd", [False, True])
def test_partition_groups_and_the_first_round(lloyd: bool) -> None:
    engine = engine_for(stemmer_config([0.0] * 5, [1.0] * 5, k=3, scales=3, repetitions=2, projection_dimension=2,
                                       lloyd_refinement=lloyd, campaign_id=f"st-part-{lloyd}"))
    spec = engine.first_round().spec
    s = 6
    weights = spec.group_weights
    assert len(weights) == 2 * s + (2 if lloyd else 1)
    shares = SHARES_WITH_LLOYD if lloyd else SHARES_WITHOUT_LLOYD
    total = sum(weights)
    assert sum(weights[:s]) / total == pytest.approx(shares[0], abs=1e-5)
    assert sum(weights[s:2 * s]) / total == pytest.approx(shares[1], abs=1e-5)
    assert spec.max_reports_per_device == 1
    assert [t.groups for t in spec.tasks] == [(g,) for g in range(s)]
    for i, task in enumerate(spec.tasks):
        (component,) = task.components
        r, j = divmod(i, 3)
        encoder = component.encoder
        assert isinstance(encoder, ShiftedGridEncoder) and encoder.level == j + 1
        assert component.mechanism.domain_size == 1 << (2 * (j + 1))
        assert task.epsilon == pytest.approx(4.0)
    # The repetitions use different projections and shifts; the scales of one repetition nest.
    first, other = spec.tasks[0].components[0].encoder, spec.tasks[3].components[0].encoder
    assert isinstance(first, ShiftedGridEncoder) and isinstance(other, ShiftedGridEncoder)
    assert first.seed != other.seed and first.projection != other.projection
    rng = np.random.default_rng(0)
    for point in rng.uniform(0.0, 1.0, size=(100, 5)).tolist():
        deep = spec.tasks[2].components[0].encoder.encode(point)
        assert spec.tasks[0].components[0].encoder.encode(point) == deep >> 4


def test_split_every_device_reports_in_every_round() -> None:
    engine = engine_for(stemmer_config([0.0] * 3, [1.0] * 3, epsilon=6.0, k=3, scales=2, repetitions=1,
                                       lloyd_refinement=True, policy=campaigns_pb2.SPLIT, campaign_id="st-split"))
    spec = engine.first_round().spec
    assert spec.group_weights == (1, 1) and spec.max_reports_per_device == 4
    assert all(t.epsilon == pytest.approx(1.5) for t in spec.tasks)


def key_round_rows(spec: RoundSpec, points: np.ndarray, seed: int) -> list[StoredReport]:
    """Round A's reports: device i joins key subgroup i mod S and reports its cell there."""
    rng = SeededRng(seed)
    context = RoundContext(campaign_id=spec.campaign_id, round=spec.round, spec=spec)
    rows = []
    for i, point in enumerate(points):
        task = spec.tasks[i % len(spec.tasks)]
        payloads = tuple(c.run(tuple(point.tolist()), rng=rng) for c in task.components)
        rows.append(validate_report(Report(report_id=rng.token_bytes(16), campaign_id=spec.campaign_id,
                                           round=spec.round, group=task.groups[0], payloads=payloads), context))
    return rows


class _CountedReads(ListRoundReports):
    """A round held in memory that counts how often it is read."""

    reads = 0

    def batches(self, batch_size: int = 65536) -> Iterator[list[StoredReport]]:
        self.reads += 1
        return super().batches(batch_size)


def test_the_key_round_is_read_once_for_every_support_pass() -> None:
    # d' = 3: the scales of 2^9 cells and more use local hashing (unary encoding's payload cap).
    x, _ = make_dataset("mixture", 12_000, d=3, k=3, seed=5, separation=4.0)
    engine = engine_for(stemmer_config((x.min(axis=0) - 1.0).tolist(), (x.max(axis=0) + 1.0).tolist(), epsilon=4.0,
                                       k=3, campaign_id="st-keys-once"))
    plan = engine.first_round()
    spec = plan.spec
    assert sum(isinstance(t.components[0].mechanism, LocalHashingParams) for t in spec.tasks) >= 4
    rows = key_round_rows(spec, x, seed=2)
    accumulate = engine.accumulate_fn(spec)
    assert accumulate is not None
    once = _CountedReads(rows, dict(accumulate(rows, {})))
    outcome = engine.close_round(spec, once, plan.engine_state)
    # Every local-hashing (repetition, scale) grown is a support pass; the first decodes the round,
    # the others replay its decoded batches.
    assert once.reads == 1
    # Beyond the decoded-batch budget each pass reads the round again: the same outcome.
    again = _CountedReads(rows, dict(accumulate(rows, {})))
    again.decoded_cache_bytes = 0
    assert engine.close_round(spec, again, plan.engine_state) == outcome
    assert again.reads >= 4
    # And from the raw reports alone (no count blobs: one more pass recounts them).
    raw = _CountedReads(rows)
    assert engine.close_round(spec, raw, plan.engine_state) == outcome
    assert raw.reads == 2
    # Round B sums vectors at close: nothing to count at ingestion.
    assert outcome.next_round is not None and engine.accumulate_fn(outcome.next_round.spec) is None


def run(config: campaigns_pb2.CampaignConfig, x: np.ndarray, seed: int = 1) -> CampaignRun:
    with tempfile.TemporaryDirectory() as tmp:
        return run_campaign(Collector(open_store(tmp)), config_from_proto(config), x, seed=seed, mode="direct", quiet=True)


#: Measured ARI at these seeds (see the tests); the floors sit below.
ARI_FLOORS = {"partition": 0.9, "lloyd": 0.9}


@pytest.mark.parametrize("lloyd", [False, True])
def test_end_to_end_through_every_round(lloyd: bool) -> None:
    x, truth = make_dataset("mixture", 30_000, d=3, k=3, seed=4, separation=4.0)
    lower, upper = x.min(axis=0) - 1.0, x.max(axis=0) + 1.0
    config = stemmer_config(lower.tolist(), upper.tolist(), epsilon=6.0, k=3, lloyd_refinement=lloyd,
                            campaign_id=f"st-e2e-{lloyd}")
    outcome = run(config, x)
    result = outcome.result
    assert result.state == campaigns_pb2.FINISHED, list(result.warnings)
    assert outcome.stats.rounds == (4 if lloyd else 3)
    c = result.clustering
    assert c.k == 3 and c.dimension == 3 and sum(c.weights) == pytest.approx(1.0)
    centers = np.asarray(c.centers).reshape(3, 3)
    assert np.all(centers >= lower) and np.all(centers <= upper)
    d = dict(result.diagnostics)
    assert d["heavy_keys"] >= 3 and d["candidates"] >= 3 and d["candidates_kept"] >= 3
    assert d["coreset_weight_error"] < 0.5
    scores = evaluate_clustering(result, x, truth)
    assert scores["ari"] >= ARI_FLOORS["lloyd" if lloyd else "partition"], scores


def test_round_specs_carry_the_feedback() -> None:
    """Round B buckets by round A's keys, C broadcasts the candidates, D the coreset's centers."""
    x, _ = make_dataset("mixture", 20_000, d=2, k=3, seed=4, separation=4.0)
    config = stemmer_config((x.min(0) - 1).tolist(), (x.max(0) + 1).tolist(), epsilon=6.0, k=3,
                            lloyd_refinement=True, campaign_id="st-specs")
    engine = engine_for(config)
    with tempfile.TemporaryDirectory() as tmp:
        backend = RecordingCollector(Collector(open_store(tmp)), seed=1)
        outcome = run_campaign(backend, config_from_proto(config), x, seed=1, mode="direct", quiet=True)
    assert outcome.result.state == campaigns_pb2.FINISHED
    assert sorted(backend.specs) == [1, 2, 3, 4]
    b, c, d = backend.specs[2], backend.specs[3], backend.specs[4]
    assert all(isinstance(t.components[0].mechanism, BucketizedVectorParams) for t in b.tasks)
    assert all(isinstance(t.components[0].encoder, BucketedVectorEncoder) for t in b.tasks)
    assert [t.groups for t in b.tasks] == [(g,) for g in range(engine.subgroups, 2 * engine.subgroups)]
    (weights_task,) = c.tasks
    encoder = weights_task.components[0].encoder
    assert isinstance(encoder, NearestCandidateEncoder)
    assert len(encoder.centers) // 2 == outcome.result.diagnostics["candidates"]
    (lloyd_task,) = d.tasks
    (lloyd,) = lloyd_task.components  # one vector report bucketed by the nearest of the coreset's centers
    assert isinstance(lloyd.mechanism, BucketizedVectorParams) and isinstance(lloyd.encoder, BucketedVectorEncoder)
    assert lloyd.encoder.nearest is not None and len(lloyd.encoder.nearest.centers) == 3 * 2
    assert lloyd.mechanism.bucket_bits == 2


def test_undetectable_clusters_say_so() -> None:
    """n = 1500 at epsilon 0.3: only the coarsest keys (about everyone in one cell) can pass; fewer than
    k centers come out, with a warning, instead of k made-up ones."""
    x, _ = make_dataset("mixture", 1500, d=2, k=4, seed=0)
    config = stemmer_config([-20.0, -20.0], [20.0, 20.0], epsilon=0.3, k=4, campaign_id="st-weak")
    result = run(config, x).result
    assert result.state == campaigns_pb2.FINISHED and result.clustering.k < 4
    assert result.warnings


def test_round_a_without_a_heavy_key_measures_the_heaviest_keys_as_best_effort() -> None:
    """No key passes the threshold (counts of 3 against a zero-count error of 200): round B still
    measures the heaviest keys of every scale, at most k each, and says they passed no threshold."""
    engine = engine_for(stemmer_config([0.0] * 2, [1.0] * 2, k=3, campaign_id="st-best-effort"))
    outcome = engine.keys_step(1, 10_000, lambda r, level, candidates: (
        np.where(candidates % 2 == 0, 3.0, -3.0), 200.0))
    assert outcome.next_round is not None and outcome.result is None
    assert outcome.diagnostics["best_effort"] == 1
    heavy = int(outcome.diagnostics["heavy_keys"])
    assert 0 < heavy <= 3 * int(engine.params.scales) * int(engine.params.repetitions)
    state = load_state(outcome.next_round.engine_state, "stemmer", _PHASES)
    assert all(node % 2 == 0 for _, _, node, _ in state["heavy"])  # only positive counts
    (warning,) = state["warnings"]
    assert "round A found no heavy key" in warning and f"best-effort: rounds B and C measure the {heavy} keys" in warning


def test_round_a_without_reports_publishes_no_centers() -> None:
    engine = engine_for(stemmer_config([0.0] * 2, [1.0] * 2, k=3, campaign_id="st-none"))
    outcome = engine.keys_step(1, 0, lambda r, level, candidates: None)
    assert outcome.result is not None and not outcome.result.clustering.centers
    assert outcome.result.warnings[-1] == ("round A found no heavy key: the clusters are not detectable at this n "
                                           "and epsilon; no centers published")


@pytest.mark.parametrize(("weights", "reporters", "published", "message"), [
    ([0.0, 0.0, 0.0, 0.0], 0, 3, "round C received no reports: best-effort centers from round B's 4 candidates"),
    ([5.0, -2.0, 0.0, 7.0], 1000, 2, "no candidate has a significant weight in round C: best-effort centers from "
                                     "the 2 candidates with a positive weight estimate"),
    ([-5.0, -2.0, 0.0, -7.0], 1000, 0, "no candidate has a positive weight in round C: no centers published"),
])
def test_round_c_publishes_whatever_candidates_survived(weights: list[float], reporters: int, published: int,
                                                         message: str) -> None:
    engine = engine_for(stemmer_config([0.0] * 2, [1.0] * 2, k=3, lloyd_refinement=False, campaign_id="st-c"))
    state = {"candidates": [-0.5, -0.5, 0.5, 0.5, -0.5, 0.5, 0.5, -0.5], "diagnostics": {}, "warnings": []}
    outcome = engine.weights_step(3, state, np.asarray(weights), 100.0, reporters)
    result = outcome.result
    assert result is not None and result.clustering.k == published and result.warnings[0].startswith(message)
    assert len(result.clustering.centers) == 2 * published
    assert outcome.diagnostics.get("best_effort", 0) == (1 if published else 0)


@pytest.mark.parametrize(("lloyd", "bound"), [(True, 1.02), (False, 1.6)])
def test_noiseless_limit_against_nonprivate_kmeans(lloyd: bool, bound: float) -> None:
    """Epsilon = infinity: exact counts, sums and weights through the same round steps.

    Measured (mixture d = 10, k = 8, n = 50 000, seeds 0-3): with the Lloyd round 1.000 on every seed;
    without it 1.01-1.49 (the coreset's candidate means).
    """
    x, truth = make_dataset("mixture", 50_000, d=10, k=8, seed=1)
    engine = engine_for(stemmer_config(x.min(axis=0).tolist(), x.max(axis=0).tolist(), k=8,
                                       lloyd_refinement=lloyd, campaign_id="st-exact"))
    outcome = noiseless_outcome(engine, x)
    result = outcome.result
    assert result is not None and result.clustering.k == 8
    centers = np.asarray(result.clustering.centers).reshape(8, 10)
    ratio = kmeans_cost(x, centers) / reference_kmeans_cost(x, 8, 0, n_init=3)
    assert evaluate_clustering(result, x, truth)["ari"] > 0.99 and ratio < bound, ratio


def test_round_b_candidates_are_the_bucket_means_shrunk_by_their_noise() -> None:
    """Round B's candidates: each key's sum over (its share x the subgroup's reports), pulled toward the
    share-weighted centroid by ``shrink_toward_centroid`` at the bucket sums' per-report mean noise."""
    d = 5
    engine = engine_for(stemmer_config([0.0] * d, [1.0] * d, k=3, scales=1, repetitions=1, campaign_id="st-b"))
    heavy = [[0, 1, node, share] for node, share in ((0, 0.5), (3, 0.3), (9, 0.2))]
    state = {"heavy": heavy, "diagnostics": {}, "warnings": []}
    means = np.array([[0.6, 0.6, 0.0, 0.0, 0.0], [-0.6, 0.0, 0.6, 0.0, 0.0], [0.0, 0.1, 0.0, 0.0, 0.1]])
    reporters = 10_000
    variance = 2.0e5 / engine._floor_ratio  # per coordinate: 0.15 / 3 for the smallest key, 0.024 / 3 for the largest
    counts = np.array([h[3] for h in heavy]) * reporters
    sums = np.column_stack([means * counts[:, None], counts])
    outcome = engine.means_step(2, state, lambda i, keys: (sums, variance, reporters))
    assert outcome.next_round is not None
    got = np.asarray(load_state(outcome.next_round.engine_state, "stemmer", _PHASES)["candidates"]).reshape(-1, d)
    moment = engine._floor_ratio * variance / counts**2
    expected = shrink_toward_centroid(means, moment, counts / reporters)
    np.testing.assert_allclose(got, expected)
    # The smallest key's offset (0.32 from the centroid, squared 0.10) is within its noise (0.15 over the
    # d - 2 coordinates): it lands on the centroid; the largest keeps 93 % of its offset.
    centroid = (counts[:, None] * means).sum(axis=0) / counts.sum()
    np.testing.assert_allclose(got[2], centroid)
    assert np.linalg.norm(got[0] - means[0]) < 0.1 * np.linalg.norm(means[0] - centroid)
    # Without noise the candidates are the plain bucket means.
    exact = engine.means_step(2, state, lambda i, keys: (sums, 0.0, reporters))
    assert exact.next_round is not None
    np.testing.assert_allclose(np.asarray(load_state(exact.next_round.engine_state, "stemmer",
                                                     _PHASES)["candidates"]).reshape(-1, d), means)
