"""The server-side weighted k-means of ``ldp_collector.estimation.kmeans``.

It must reach scikit-learn's k-means cost (within 1 % on blobs), treat integer weights exactly as
repeated points, be deterministic under a seed, and stay sane with the negative weights an LDP
coreset can carry (seeding on the positive part, signed means, empty clusters re-seeded).
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.datasets import make_blobs

from ldp_client.errors import InvalidParameterError
from ldp_collector.estimation.kmeans import (
    InMemory,
    KMeansResult,
    LloydPass,
    Points,
    PointSample,
    PointStats,
    assign,
    kmeans_passes,
    kmeans_plus_plus,
    lloyd,
    plus_plus_starts,
    weighted_kmeans,
)
from ldp_collector.estimation.report_accumulator import summation_error_bound
from ldp_collector.simulation.scores import kmeans_cost, reference_kmeans, reference_kmeans_cost


@pytest.mark.parametrize(("n", "d", "k", "std"), [(5000, 2, 3, 1.0), (20_000, 5, 8, 2.0), (10_000, 20, 16, 1.5),
                                                   (8000, 2, 10, 3.0)])
def test_cost_matches_sklearn_kmeans_on_blobs(n: int, d: int, k: int, std: float) -> None:
    x, _ = make_blobs(n, n_features=d, centers=k, cluster_std=std, random_state=n + k)
    ours = weighted_kmeans(x, k, np.random.default_rng(0), n_init=5)
    theirs = KMeans(k, n_init=5, random_state=0).fit(x)
    assert ours.cost <= theirs.inertia_ * 1.01
    assert ours.cost == pytest.approx(kmeans_cost(x, ours.centers), rel=1e-9)
    labels, sq = assign(x, ours.centers)
    assert np.array_equal(labels, ours.labels) and sq.sum() == pytest.approx(ours.cost, rel=1e-9)
    assert 1 <= ours.iterations <= 100


def test_assign_is_the_nearest_center() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50_000, 3)) * 5
    centers = rng.normal(size=(7, 3)) * 5
    d2 = ((x[:, None, :] - centers[None]) ** 2).sum(axis=2)
    labels, sq = assign(x, centers)
    assert np.array_equal(labels, d2.argmin(axis=1))
    assert np.allclose(sq, d2.min(axis=1), rtol=1e-9, atol=1e-9)


def test_integer_weights_equal_repeated_points() -> None:
    rng = np.random.default_rng(2)
    unique = rng.normal(size=(300, 2)) * 4
    counts = rng.integers(1, 6, size=300)
    repeated = np.repeat(unique, counts, axis=0)
    start = unique[rng.choice(300, size=5, replace=False)]
    weighted = lloyd(unique, start, counts.astype(float), tol=0.0)
    plain = lloyd(repeated, start, tol=0.0)
    assert np.allclose(weighted.centers, plain.centers, rtol=1e-12, atol=1e-12)
    assert weighted.cost == pytest.approx(plain.cost, rel=1e-12)
    assert weighted.iterations == plain.iterations
    assert np.array_equal(np.repeat(weighted.labels, counts), plain.labels)
    # Through the seeding too: the best of several restarts lands on the same optimum's cost.
    assert weighted_kmeans(unique, 5, 3, counts, n_init=10).cost == pytest.approx(
        weighted_kmeans(repeated, 5, 3, n_init=10).cost, rel=1e-3)


def test_seeded_runs_are_deterministic() -> None:
    x, _ = make_blobs(3000, n_features=3, centers=5, random_state=4)
    a = weighted_kmeans(x, 5, np.random.default_rng(9))
    b = weighted_kmeans(x, 5, 9)
    assert np.array_equal(a.centers, b.centers) and a.cost == b.cost and np.array_equal(a.labels, b.labels)
    assert np.array_equal(kmeans_plus_plus(x, 5, 1), kmeans_plus_plus(x, 5, 1))
    assert reference_kmeans_cost(x, 5, seed=3) == reference_kmeans_cost(x, 5, seed=3)
    assert isinstance(weighted_kmeans(x, 5, None), KMeansResult)  # OS entropy: just runs


def test_kmeans_plus_plus_draws_only_positive_weight_points() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(400, 2))
    weights = np.where(np.arange(400) % 4 == 0, 1.0, rng.choice([0.0, -2.0], size=400))
    allowed = {tuple(p) for p in x[weights > 0]}
    for seed in range(20):
        centers = kmeans_plus_plus(x, 6, seed, weights)
        assert all(tuple(c) in allowed for c in centers)
    # Fewer distinct positive points than k: repeats, and Lloyd still returns k clusters' worth.
    few = np.array([[0.0, 0.0], [1.0, 0.0], [5.0, 5.0], [9.0, 9.0]])
    centers = kmeans_plus_plus(few, 4, 0, [1.0, 1.0, 0.0, 0.0])
    assert {tuple(c) for c in centers} <= {(0.0, 0.0), (1.0, 0.0)}


def test_negative_weights_keep_centers_inside_the_data() -> None:
    # An LDP coreset: true cells with positive weights, empty cells with noise around zero.
    rng = np.random.default_rng(6)
    cells = rng.uniform(0, 10, size=(200, 2))
    weights = rng.normal(0.0, 3.0, size=200)
    weights[:20] = 50.0 + rng.normal(size=20)
    fit = weighted_kmeans(cells, 5, 0, weights)
    positive = cells[weights > 0]
    assert np.isfinite(fit.centers).all()
    assert (fit.centers >= positive.min(axis=0) - 1e-12).all() and (fit.centers <= positive.max(axis=0) + 1e-12).all()
    assert fit.cost == pytest.approx(float(np.dot(weights, assign(cells, fit.centers)[1])), rel=1e-9)
    # A cluster whose weights sum to (almost) nothing is re-seeded, not divided by ~0.
    x = np.array([[0.0, 0.0], [0.1, 0.0], [10.0, 10.0], [10.2, 10.0], [5.0, 5.0]])
    w = np.array([1.0, 1.0, 1.0, -1.0, 1.0])
    fit = lloyd(x, np.array([[0.0, 0.0], [10.1, 10.0]]), w, max_iter=1)
    assert np.isfinite(fit.centers).all()
    assert tuple(fit.centers[1]) in {tuple(p) for p in x[w > 0]}
    with pytest.raises(InvalidParameterError, match="at least one positive weight"):
        kmeans_plus_plus(x, 2, 0, -np.ones(5))


def test_empty_clusters_are_reseeded_from_the_farthest_points() -> None:
    x = np.vstack([np.zeros((50, 2)), np.full((50, 2), 10.0), np.array([[100.0, 100.0]])])
    start = np.array([[0.0, 0.0], [1000.0, 1000.0], [2000.0, 2000.0]])  # two centers far away
    fit = lloyd(x, start)
    assert sorted(map(tuple, fit.centers)) == [(0.0, 0.0), (10.0, 10.0), (100.0, 100.0)]
    assert fit.cost == 0.0


def test_reference_kmeans_fits_on_a_sample_and_scores_on_all() -> None:
    x, _ = make_blobs(30_000, n_features=2, centers=4, random_state=7)
    full = reference_kmeans(x, 4, seed=1, n_init=3, sample=None)
    sampled = reference_kmeans(x, 4, seed=1, n_init=3, sample=2000)
    assert sampled.labels.shape == (30_000,)
    assert sampled.cost == pytest.approx(kmeans_cost(x, sampled.centers), rel=1e-9)
    assert sampled.cost <= full.cost * 1.01
    assert reference_kmeans_cost(x, 4, 1, 3) == pytest.approx(full.cost, rel=0.01)


def test_errors_are_clear() -> None:
    x = np.zeros((10, 2))
    with pytest.raises(InvalidParameterError, match=r"k must be an integer in \[1, 10\]"):
        weighted_kmeans(x, 11, 0)
    with pytest.raises(InvalidParameterError, match=r"n_init must be an integer in \[1, 1000\]"):
        weighted_kmeans(x, 2, 0, n_init=0)
    with pytest.raises(InvalidParameterError, match="tol must be a finite number"):
        lloyd(x, x[:2], tol=-1.0)
    with pytest.raises(InvalidParameterError, match="max_iter"):
        lloyd(x, x[:2], max_iter=0)
    with pytest.raises(InvalidParameterError, match="rng must be a numpy.random.Generator"):
        kmeans_plus_plus(x, 2, -3)
    with pytest.raises(InvalidParameterError, match="weights must hold one value per point"):
        lloyd(x, x[:2], np.ones(3))


# -- one pass per iteration ---------------------------------------------------------------------------

def _split(x: np.ndarray, w: np.ndarray | None, cuts: list[int]) -> list[Points]:
    edges = [0, *cuts, len(x)]
    return [Points(x[a:b], None if w is None else w[a:b]) for a, b in zip(edges, edges[1:])]


@pytest.mark.parametrize("weighted", [False, True])
def test_lloyd_pass_merged_from_parts_equals_one_pass_within_the_summation_bound(weighted: bool) -> None:
    """What Beam does (partial passes over parts of the round, merged) is the one pass up to summation order."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(5000, 3)) * 10 + 100
    w = rng.uniform(-0.5, 2.0, size=len(x)) if weighted else None
    centers = np.stack([x[:4], x[10:14]])  # two restarts of four centers
    whole = InMemory(Points(x, w)).combine(LloydPass(centers))
    parts = [InMemory(p).combine(LloydPass(centers)) for p in _split(x, w, [700, 701, 3900])]
    merged = parts[0].zero()
    for part in reversed(parts):
        merged.merge(part)
    ww = np.ones(len(x)) if w is None else w
    labels = np.stack([assign(x, c)[0] for c in centers])  # (R, n)
    for r in range(2):
        if w is None:  # counts: exact whatever the order
            assert np.array_equal(merged.mass[r], np.bincount(labels[r], minlength=4))
        mass_bound = summation_error_bound(len(x), float(np.abs(ww).sum()))
        assert np.abs(merged.mass[r] - whole.mass[r]).max() <= mass_bound
        for j in range(3):
            bound = summation_error_bound(len(x), float(np.abs(ww * x[:, j]).sum()))
            assert np.abs(merged.sums[r, :, j] - whole.sums[r, :, j]).max() <= bound
            expected = np.bincount(labels[r], weights=ww * x[:, j], minlength=4)
            assert np.abs(whole.sums[r, :, j] - expected).max() <= bound
    assert merged.nbytes == whole.nbytes == 8 * (2 * 4 * 3 + 2 * 4 * (3 + 2))  # centers and state: not n


def test_point_stats_merge_as_numpy_computes_them() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3000, 2)) * [1.0, 1e-3] + [1e6, -5.0]  # far from the origin: no cancellation allowed
    w = rng.uniform(-1.0, 3.0, size=len(x))
    merged = PointStats(2)
    for part in _split(x, w, [1000, 1001, 2500]):
        partial = PointStats(2)
        partial.add_decoded(part)
        merged.merge(partial)
    pos = np.maximum(w, 0.0)
    mean = np.average(x, axis=0, weights=pos)
    assert merged.count == len(x) and merged.weight == pytest.approx(pos.sum(), rel=1e-12)
    assert merged.abs_weight == pytest.approx(np.abs(w).sum(), rel=1e-12)
    assert merged.mean == pytest.approx(mean, rel=1e-12)
    assert merged.variance == pytest.approx(np.average((x - mean) ** 2, axis=0, weights=pos), rel=1e-9)
    assert np.array_equal(merged.low, x[pos > 0].min(axis=0)) and np.array_equal(merged.high, x[pos > 0].max(axis=0))


def test_kmeans_passes_over_batches_follow_the_array_path() -> None:
    """A round read in batches runs the array path's iterations: the same centers up to summation order."""
    x, _ = make_blobs(n_samples=6000, centers=5, cluster_std=1.5, random_state=3)
    starts = plus_plus_starts(x, 5, 7, 3)
    reference = weighted_kmeans(x, 5, 7, n_init=3)
    batches = InMemory(*_split(x, None, [1000, 2000, 3500, 5999]))
    stats = batches.combine(PointStats(2))
    run = kmeans_passes(batches, starts, stats)
    assert run.centers == pytest.approx(reference.centers, rel=1e-12, abs=1e-12)
    assert run.cost == pytest.approx(reference.cost, rel=1e-12) and run.iterations == reference.iterations
    assert run.mass.sum() == len(x)
    assert np.array_equal(run.mass, np.bincount(reference.labels, minlength=5))


def test_restarts_sharing_a_pass_are_the_restarts_run_in_turn() -> None:
    x, _ = make_blobs(n_samples=4000, centers=6, cluster_std=2.5, random_state=11)
    gen = np.random.default_rng(5)
    starts = [kmeans_plus_plus(x, 6, gen) for _ in range(4)]
    alone = [lloyd(x, s) for s in starts]
    best = min(alone, key=lambda f: f.cost)
    together = weighted_kmeans(x, 6, 5, n_init=4)
    assert together.cost == pytest.approx(best.cost, rel=1e-12)
    # Restarts reaching the same partition tie to the last bits: the best is that partition, in either order.
    ties = [f for f in alone if f.cost == pytest.approx(best.cost, rel=1e-12)]
    assert any(np.array_equal(together.labels, f.labels) and together.iterations == f.iterations
               and together.centers == pytest.approx(f.centers, rel=1e-12) for f in ties)


def test_point_sample_is_a_function_of_the_points_whatever_the_order() -> None:
    """Any order of batches and merges gives the same sample, in point order; equal points are counted."""
    rng = np.random.default_rng(12)
    distinct = rng.normal(size=(2000, 2))
    x = distinct[rng.integers(0, 2000, size=6000)]  # about 1 900 distinct points, most repeated
    whole = InMemory(Points(x)).combine(PointSample(500, 2, salt=b"salt")).finalize()
    assert whole.shape == (500, 2) and np.array_equal(whole, whole[np.lexsort(whole.T[::-1])])
    assert len(np.unique(whole, axis=0)) < 500
    order = rng.permutation(6000)
    parts = [order[a:b] for a, b in [(0, 100), (100, 3700), (3700, 6000)]]
    partials = [InMemory(Points(x[p[: len(p) // 2]]), Points(x[p[len(p) // 2:]]))
                .combine(PointSample(500, 2, salt=b"salt")) for p in parts]
    merged = partials[2]
    merged.merge(partials[0])
    merged.merge(partials[1])
    assert np.array_equal(merged.finalize(), whole)
    assert not np.array_equal(InMemory(Points(x)).combine(PointSample(500, 2, salt=b"other")).finalize(), whole)
    few = InMemory(Points(x[:40])).combine(PointSample(500, 2, salt=b"salt")).finalize()
    assert np.array_equal(few, x[:40][np.lexsort(x[:40].T[::-1])])
    with pytest.raises(ValueError, match="salt"):
        PointSample(5, 2, salt=b"")


def test_point_sample_of_few_points_draws_them_as_often_as_they_occur() -> None:
    """Fewer distinct points than the sample: each listed a hypergeometric number of times, summing to the size."""
    x = np.repeat(np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]), [10, 30, 960], axis=0)
    sample = InMemory(Points(x)).combine(PointSample(100, 2, salt=b"s")).finalize()
    assert sample.shape == (100, 2)
    rows, counts = np.unique(sample, axis=0, return_counts=True)
    assert counts.sum() == 100 and len(rows) <= 3 and counts.max() > 80
