"""The shared clustering metrics of ``ldp_collector.simulation.scores``.

Every score is pinned against scikit-learn's implementation (ARI, NMI and FMI to 1e-10 on random
labelings, including noise labels, gaps in the label values and many tiny clusters), the
assignment against ``scipy.optimize.linear_sum_assignment``, and the others against direct
textbook computations. scikit-learn and scipy are test dependencies only.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment as scipy_assignment
from sklearn import metrics as skm

from ldp_client.errors import InvalidParameterError
from ldp_collector.simulation.scores import (
    adjusted_rand_index,
    center_error,
    cost_per_point,
    evaluate_clustering,
    f_measure,
    fowlkes_mallows_index,
    hungarian_accuracy,
    kmeans_cost,
    linear_sum_assignment,
    nicv,
    normalized_mutual_info,
    purity,
)

Score = Callable[[Any, Any], float]

PAIRS: list[tuple[Score, Score]] = [
    (adjusted_rand_index, skm.adjusted_rand_score),
    (normalized_mutual_info, skm.normalized_mutual_info_score),
    (fowlkes_mallows_index, skm.fowlkes_mallows_score),
]


def random_labelings(seed: int, trials: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(trials):
        n = int(rng.integers(1, 400))
        a = rng.integers(0, int(rng.integers(1, 9)), size=n)
        b = rng.integers(-1, int(rng.integers(1, 13)), size=n)  # -1: noise
        if rng.random() < 0.3:
            b = np.where(rng.random(n) < 0.8, a, b)  # correlated: scores far from 0
        if rng.random() < 0.3:
            a = a * 7 + 100  # gaps and offsets in the label values
        out.append((a, b))
    return out


@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=["ari", "nmi", "fmi"])
def test_partition_scores_equal_sklearn_on_random_labelings(ours: Score, theirs: Score) -> None:
    for trial, (a, b) in enumerate(random_labelings(0, 300)):
        assert abs(ours(a, b) - theirs(a, b)) <= 1e-10, (trial, a, b)


@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=["ari", "nmi", "fmi"])
def test_partition_scores_equal_sklearn_in_the_limit_cases(ours: Score, theirs: Score) -> None:
    cases = [
        ([0], [0]), ([0, 0, 0], [5, 5, 5]), ([0, 0, 0, 0], [0, 1, 2, 3]), ([0, 1, 2, 3], [0, 0, 0, 0]),
        ([0, 1, 2, 3], [3, 2, 1, 0]), ([0, 0, 1, 1], [1, 1, 0, 0]), ([0, 0, 1, 1], [0, 0, 1, 2]),
        ([0, 1, 0, 1], [0, 0, 1, 1]), (["a", "b", "b"], ["x", "x", "y"]),
    ]
    for a, b in cases:
        assert abs(ours(a, b) - theirs(a, b)) <= 1e-12, (a, b)


def test_partition_scores_with_many_clusters_use_the_sparse_table() -> None:
    # 20k points, 6k predicted clusters: the dense table would be large; the scores must not move.
    rng = np.random.default_rng(3)
    a = rng.integers(0, 2000, size=20_000)
    b = rng.integers(0, 6000, size=20_000) * 1_000_003  # also beyond the bincount label span
    for ours, theirs in PAIRS:
        assert abs(ours(a, b) - theirs(a, b)) <= 1e-10
    assert hungarian_accuracy(a, b) == pytest.approx(matching_accuracy_with_scipy(a, b), abs=1e-12)


def test_ari_is_exact_for_large_n() -> None:
    rng = np.random.default_rng(4)
    a = rng.integers(0, 10, size=2_000_000)
    b = np.where(rng.random(len(a)) < 0.5, a, rng.integers(0, 12, size=len(a)))
    assert abs(adjusted_rand_index(a, b) - skm.adjusted_rand_score(a, b)) <= 1e-10
    noise = rng.integers(0, 3, size=len(a))
    assert abs(adjusted_rand_index(rng.integers(0, 3, size=len(a)), noise)) < 0.002


def test_label_errors_are_clear() -> None:
    with pytest.raises(InvalidParameterError, match="non-empty and of equal length, got 3 and 2"):
        adjusted_rand_index([0, 1, 1], [0, 1])
    with pytest.raises(InvalidParameterError, match="non-empty"):
        normalized_mutual_info([], [])
    with pytest.raises(InvalidParameterError, match="1-D array of labels"):
        purity(np.zeros((3, 2)), np.zeros((3, 2)))


# -- assignment --------------------------------------------------------------------------------------

@pytest.mark.parametrize("maximize", [False, True])
def test_linear_sum_assignment_matches_scipy(maximize: bool) -> None:
    rng = np.random.default_rng(5)
    for trial in range(300):
        rows, cols = (int(v) for v in rng.integers(1, 16, size=2))
        cost = rng.normal(size=(rows, cols))
        if trial % 3 == 0:
            cost = np.round(cost * 2)  # many ties
        r, c = linear_sum_assignment(cost, maximize=maximize)
        sr, sc = scipy_assignment(cost, maximize=maximize)
        assert len(r) == min(rows, cols) and np.all(np.diff(r) > 0)
        assert len(set(c.tolist())) == len(c)
        assert cost[r, c].sum() == pytest.approx(cost[sr, sc].sum(), abs=1e-9), trial
        if trial % 3:  # continuous costs: the optimum is unique
            assert np.array_equal(r, sr) and np.array_equal(c, sc)


def test_linear_sum_assignment_edges() -> None:
    r, c = linear_sum_assignment(np.zeros((0, 3)))
    assert r.size == 0 and c.size == 0
    r, c = linear_sum_assignment([[4.0, 1.0, 3.0], [2.0, 0.0, 5.0], [3.0, 2.0, 2.0]])
    assert r.tolist() == [0, 1, 2] and c.tolist() == [1, 0, 2]
    with pytest.raises(InvalidParameterError, match="cost must be finite"):
        linear_sum_assignment([[1.0, math.inf]])
    with pytest.raises(InvalidParameterError, match="2-D"):
        linear_sum_assignment([1.0, 2.0])


def matching_accuracy_with_scipy(a: np.ndarray, b: np.ndarray) -> float:
    keep = b != -1
    table = skm.cluster.contingency_matrix(a, b).astype(float)
    clusters = np.unique(b)
    table = table[:, clusters != -1] if (~keep).any() else table
    if table.shape[1] == 0:
        return 0.0
    r, c = scipy_assignment(table, maximize=True)
    return float(table[r, c].sum() / len(a))


def test_hungarian_accuracy_matches_scipy_and_counts_noise_as_wrong() -> None:
    for a, b in random_labelings(6, 200):
        assert hungarian_accuracy(a, b) == pytest.approx(matching_accuracy_with_scipy(a, b), abs=1e-12)
    assert hungarian_accuracy([0, 0, 1, 1], [7, 7, 3, 3]) == 1.0
    assert hungarian_accuracy([0, 0, 1, 1], [7, 7, -1, -1]) == 0.5
    assert hungarian_accuracy([0, 0, 1, 1], [-1, -1, -1, -1]) == 0.0
    # Three clusters for two classes: the smallest stays unmatched.
    assert hungarian_accuracy([0, 0, 0, 1, 1, 1], [0, 0, 2, 1, 1, 1]) == pytest.approx(5 / 6)


def test_hungarian_accuracy_matches_brute_force() -> None:
    rng = np.random.default_rng(7)
    for _ in range(30):
        a = rng.integers(0, int(rng.integers(1, 5)), size=40)
        b = rng.integers(0, int(rng.integers(1, 5)), size=40)
        ca, cb = np.unique(a).tolist(), np.unique(b).tolist()
        best = 0
        for perm in itertools.permutations(cb + [None] * len(ca), len(ca)):
            mapping = dict(zip(ca, perm))
            best = max(best, sum(mapping[x] == y for x, y in zip(a.tolist(), b.tolist())))
        assert hungarian_accuracy(a, b) == pytest.approx(best / 40)


# -- purity and F-measure ---------------------------------------------------------------------------

def test_purity_and_f_measure_by_hand() -> None:
    true = [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    pred = [5, 5, 5, 6, 6, 6, 6, -1, -1, 6]
    # purity: cluster 5 -> 3 (class 0), cluster 6 -> 3 (class 1); noise counts as wrong.
    assert purity(true, pred) == pytest.approx(6 / 10)
    # F(0, 5) = 2*3/(4+3); F(1, 6) = 2*3/(3+5); F(2, 6) = 2*1/(3+5); weighted by 4, 3, 3 of 10.
    expected = 0.4 * 6 / 7 + 0.3 * 6 / 8 + 0.3 * 2 / 8
    assert f_measure(true, pred) == pytest.approx(expected)
    assert purity([1, 1, 2], [0, 0, 0]) == pytest.approx(2 / 3)
    assert f_measure([0, 1, 2], [0, 1, 2]) == 1.0 and purity([0, 1, 2], [4, 5, 6]) == 1.0


def test_purity_and_f_measure_equal_direct_loops() -> None:
    for a, b in random_labelings(8, 100):
        classes, clusters = np.unique(a), [c for c in np.unique(b) if c != -1]
        direct_purity = sum(max(np.sum((b == c) & (a == k)) for k in classes) for c in clusters) / len(a)
        assert purity(a, b) == pytest.approx(direct_purity)
        f = 0.0
        for k in classes:
            in_class = a == k
            best = 0.0
            for c in clusters:
                both = np.sum(in_class & (b == c))
                if both:
                    p, r = both / np.sum(b == c), both / np.sum(in_class)
                    best = max(best, 2 * p * r / (p + r))
            f += np.sum(in_class) / len(a) * best
        assert f_measure(a, b) == pytest.approx(f)


# -- geometric metrics --------------------------------------------------------------------------------

def test_kmeans_cost_equals_brute_force_and_is_chunked() -> None:
    rng = np.random.default_rng(9)
    x = rng.normal(size=(70_000, 3)) + 1000.0  # far from the origin: the cancellation must not show
    centers = rng.normal(size=(5, 3)) + 1000.0
    weights = rng.uniform(-0.5, 2.0, size=len(x))
    d2 = ((x[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2).min(axis=1)
    assert kmeans_cost(x, centers) == pytest.approx(d2.sum(), rel=1e-9)
    assert kmeans_cost(x, centers, weights) == pytest.approx(np.dot(weights, d2), rel=1e-9)
    assert cost_per_point(x, centers) == pytest.approx(d2.mean(), rel=1e-9)
    assert kmeans_cost(x[:, 0], centers[:, 0]) == pytest.approx(
        ((x[:, :1] - centers[None, :, 0]) ** 2).min(axis=1).sum(), rel=1e-9)  # 1-D points
    with pytest.raises(InvalidParameterError, match=r"centers must be a non-empty \(k, 3\) array"):
        kmeans_cost(x, centers[:, :2])
    with pytest.raises(InvalidParameterError, match="weights must hold one value per point"):
        kmeans_cost(x, centers, weights[:5])
    with pytest.raises(InvalidParameterError, match="X must be finite"):
        kmeans_cost([[0.0, math.nan]], [[0.0, 0.0]])


def test_nicv_is_the_cost_of_the_cluster_means_per_point() -> None:
    rng = np.random.default_rng(10)
    x = rng.normal(size=(5000, 4))
    labels = rng.integers(-1, 6, size=5000)
    expected = sum(((x[labels == j] - x[labels == j].mean(axis=0)) ** 2).sum() for j in np.unique(labels))
    assert nicv(x, labels) == pytest.approx(expected / 5000, rel=1e-12)
    assert nicv(x, np.zeros(5000, dtype=int)) == pytest.approx(x.var(axis=0).sum(), rel=1e-12)
    assert nicv(x, np.arange(5000)) == 0.0
    with pytest.raises(InvalidParameterError, match="one label per point"):
        nicv(x, labels[:10])


def test_center_error_matches_optimally() -> None:
    rng = np.random.default_rng(11)
    true = rng.normal(size=(6, 3)) * 10
    found = true[rng.permutation(6)] + np.array([0.3, 0.0, 0.4])
    assert center_error(true, found) == pytest.approx(0.5)
    assert center_error(true, found[:4]) == pytest.approx(0.5)  # rectangular: matched pairs only
    dist = np.sqrt(((true[:, None] - found[None]) ** 2).sum(axis=2))
    r, c = scipy_assignment(dist)
    assert center_error(true, found) == pytest.approx(dist[r, c].mean())


def test_evaluate_clustering_returns_every_metric() -> None:
    rng = np.random.default_rng(12)
    centers = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    labels = rng.integers(0, 3, size=3000)
    x = centers[labels] + rng.normal(size=(3000, 2))
    pred = (labels + 1) % 3
    pred[:30] = -1
    scores = evaluate_clustering(x, labels, pred, centers=centers[[1, 2, 0]], reference_cost=2.0 * 3000)
    assert set(scores) == {"clusters", "noise_share", "nicv", "ari", "nmi", "fmi", "accuracy", "purity",
                           "f_measure", "cost", "cost_per_point", "center_error", "cost_ratio"}
    assert scores["clusters"] == 3 and scores["noise_share"] == pytest.approx(0.01)
    assert scores["accuracy"] == pytest.approx(0.99) and scores["purity"] == pytest.approx(0.99)
    assert scores["ari"] == pytest.approx(skm.adjusted_rand_score(labels, pred))
    assert scores["cost_per_point"] == pytest.approx(2.0, rel=0.1)
    assert scores["cost_ratio"] == pytest.approx(scores["cost"] / 6000)
    assert scores["center_error"] < 0.1
    bare = evaluate_clustering(x, None, pred)
    assert set(bare) == {"clusters", "noise_share", "nicv"}
    assert math.isnan(evaluate_clustering(x, None, pred, centers=centers, reference_cost=0.0)["cost_ratio"])
    with pytest.raises(InvalidParameterError, match="reference_cost needs the centers"):
        evaluate_clustering(x, labels, pred, reference_cost=1.0)
    with pytest.raises(InvalidParameterError, match="labels_pred must hold one label per point"):
        evaluate_clustering(x, labels, pred[:-1])
    with pytest.raises(InvalidParameterError, match="reference_cost must be a finite number"):
        evaluate_clustering(x, labels, pred, centers=centers, reference_cost=-1.0)


def test_heavy_hitters_are_scored_against_the_values_held_without_laying_out_the_domain() -> None:
    from ldp_collector.model import HeavyHitter, Result
    from ldp_collector.simulation.evaluation import evaluate_heavy_hitters

    big = 2**52 + 5  # a domain no dense count array could hold
    values = np.array([big] * 50 + [7] * 30 + [3] * 20, dtype=np.int64)
    found = (HeavyHitter(value=big, count=55.0, std_error=5.0), HeavyHitter(value=11, count=4.0, std_error=2.0))
    scores = evaluate_heavy_hitters(Result(heavy_hitters=found), values)
    assert scores["found"] == 2
    assert scores["max_abs_freq_error"] == pytest.approx(5 / 100) and scores["mean_abs_freq_error"] == pytest.approx(4.5 / 100)
    assert scores["mean_abs_z"] == pytest.approx((5 / 5 + 4 / 2) / 2)
    assert scores["recall_of_true_top"] == pytest.approx(1 / 2)  # the true top two are big and 7
    assert scores["smallest_found_true_freq"] == 0.0  # 11 is held by no device
    assert evaluate_heavy_hitters(Result(), values) == {"found": 0}
