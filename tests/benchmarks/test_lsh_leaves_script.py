"""The noiseless leaf study (``benchmarks/lsh_leaves.py``): its hashes, its pooled share and its table."""

from __future__ import annotations

import json
from pathlib import Path

import lsh_leaves as study
import numpy as np
import pytest

from ldp_collector.kinds.nettree import leaf_nodes
from ldp_collector.simulation.scores import reference_kmeans_cost


def _cone_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Four tight clusters in [-1, 1]^10 (two corner points fix the box): 0 and 1 on one ray from the centre."""
    rng = np.random.default_rng(seed)
    d = 10
    v = np.ones(d) / np.sqrt(d)
    w = np.r_[np.ones(d // 2), -np.ones(d // 2)] / np.sqrt(d)
    means = np.stack([0.3 * v, 0.8 * v, -0.6 * v, 0.7 * w])
    labels = rng.integers(0, 4, size=n)
    x = means[labels] + 0.001 * rng.standard_normal((n, d))
    x[:2] = [-np.ones(d), np.ones(d)]
    return x, labels


def test_offset_zero_is_the_engines_hash_and_offsets_cut_a_cone() -> None:
    x, _ = _cone_data(2000, seed=1)
    engine = study.engine_for(x, 4, seed=3, epsilon=2.0, node_map="origin")
    leaf = engine.node_encoders[-1]
    assert np.array_equal(study.offset_simhash(leaf, x, 0.0), leaf_nodes(engine, x))
    assert np.array_equal(study.study_leaves(engine, x, "origin"), leaf_nodes(engine, x))
    # Two points on one ray from the box centre share every centred bit, whatever the hyperplanes.
    ray = np.stack([0.3 * np.ones(10) / np.sqrt(10), 0.8 * np.ones(10) / np.sqrt(10)])
    centred = study.offset_simhash(leaf, ray, 0.0)
    assert centred[0] == centred[1]
    # Offsets: bit i is 1 iff <g_i, z> >= S r ||g_i|| (2 u_i - 1), with the study's public uniforms.
    g = np.asarray(leaf.hyperplanes)
    u = np.asarray(study.uniform_values(leaf.seed, study.OFFSET_PURPOSE, leaf.bits))
    offsets = 1.0 * np.sqrt(10 / (3 * 10)) * np.linalg.norm(g, axis=1) * (2 * u - 1)
    bits = ray @ g.T >= offsets  # the box is [-1, 1]^10: z = x
    expected = [int("".join("1" if b else "0" for b in row), 2) for row in bits]
    assert study.offset_simhash(leaf, ray, 1.0).tolist() == expected


def test_the_pooled_share_counts_the_leaf_of_two_clusters_in_one_cone() -> None:
    x, labels = _cone_data(40_000, seed=2)
    engine = study.engine_for(x, 4, seed=5, epsilon=2.0, node_map="origin")
    row = study.leaf_study(engine, x, labels, 4, reference_kmeans_cost(x, 4, 5), "origin")
    both = float(np.isin(labels, [0, 1]).mean())
    # Clusters 0 and 1 share one leaf (about half each: impure); the other two are pure wherever they fall.
    assert row["pooled"] == pytest.approx(both, abs=0.01)
    assert row["coverage"] == pytest.approx(1.0, abs=0.01)
    # One center between clusters 0 and 1: far from non-private k-means.
    assert row["cost_ratio"] > 10.0 and row["ari"] < 0.9
    # Grouped by the truth, the pooled leaf goes to its majority cluster and the other is lost: still
    # one center between them, so no grouping of these leaves does better.
    assert row["lost"] == 1.0
    assert row["truth_cost_ratio"] > 10.0


def test_grouping_by_the_truth_pools_each_clusters_leaves() -> None:
    x, labels = _cone_data(40_000, seed=2)
    keep = labels != 0  # no two clusters on one ray: every leaf is pure
    x, labels = x[keep], np.unique(labels[keep], return_inverse=True)[1]
    x[:2] = [-np.ones(10), np.ones(10)]
    engine = study.engine_for(x, 3, seed=5, epsilon=2.0, node_map="origin")
    row = study.leaf_study(engine, x, labels, 3, reference_kmeans_cost(x, 3, 5), "origin")
    assert row["pooled"] == pytest.approx(0.0, abs=1e-3) and row["lost"] == 0.0
    # Each cluster's leaves pooled into its own mean: k-means' own cost, up to the corner points.
    assert row["truth_cost_ratio"] == pytest.approx(1.0, abs=0.05)
    assert row["truth_cost_ratio"] <= row["cost_ratio"] + 1e-9


def test_a_small_study_writes_its_rows_and_the_paired_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    assert study.main(["--n", "20000", "--seeds", "2", "--data", "mixture:5:3", "--maps", "origin", "offset:0.5",
                       "bits:3", "origin+rest", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| mixture:5:3 | origin | 2 |" in table and "| mixture:5:3 | offset:0.5 | 2 |" in table
    rows = json.loads(out.read_text())
    maps = ("origin", "offset:0.5", "bits:3", "origin+rest")
    assert {(r["map"], r["seed"]) for r in rows} == {(m, s) for m in maps for s in (0, 1)}
    assert all(0.0 <= r["pooled"] <= r["coverage"] <= 1.0 for r in rows)
    by = {(r["map"], r["seed"]): r for r in rows}
    # Rest leaves only add devices to the coreset: the kept leaves stay as they were.
    assert all(by["origin+rest", s]["coverage"] >= by["origin", s]["coverage"] for s in (0, 1))
    assert all(by["origin+rest", s]["leaves"] >= by["origin", s]["leaves"] for s in (0, 1))
    assert {r["bits_per_level"] for r in rows if r["map"] == "bits:3"} == {3}


def test_seeds_outside_the_tuning_range_are_refused() -> None:
    with pytest.raises(SystemExit):
        study.main(["--seeds", "21"])
    with pytest.raises(SystemExit):
        study.main(["--seeds", "11", "--reporting"])


def test_reporting_runs_the_campaigns_reporting_seeds(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    assert study.main(["--n", "20000", "--seeds", "2", "--reporting", "--data", "mixture:5:3", "--maps", "origin",
                       "--out", str(out)]) == 0
    assert [r["seed"] for r in json.loads(out.read_text())] == [100, 101]


@pytest.mark.parametrize(("threshold", "rest_kept"), [(5.0, True), (6.0, False)])
def test_rest_leaves_gather_the_unkept_children_of_a_branching_node(threshold: float, rest_kept: bool) -> None:
    x, _ = _cone_data(2000, seed=1)
    engine = study.engine_for(x, 4, seed=3, epsilon=2.0, node_map="origin")
    assert engine.layout.child_bits == 2
    # Leaf 4 is kept (group 0); leaves 5 and 6 are its unkept siblings under parent 1 (branching);
    # leaf 9's parent 2 did not branch: it stays out.
    leaves = np.array([4] * 10 + [5] * 3 + [6] * 2 + [9], dtype=np.uint64)
    group = np.where(leaves == 4, 0, -1)
    y = np.zeros((leaves.size, 10))
    y[leaves == 4] = 0.5
    y[(leaves == 5) | (leaves == 6)] = -0.5
    assigned, centers = study._with_rest_leaves(engine, y, leaves, group, 1, np.array([1], dtype=np.uint64),
                                                threshold, 2, seed=0)
    lower, upper = (np.asarray(b) for b in (engine.domain.lower, engine.domain.upper))
    assert assigned[leaves == 4].tolist() == [0] * 10 and assigned[-1] == -1
    if rest_kept:  # the 5 devices of leaves 5 and 6 pass the threshold 5 as one rest leaf
        assert assigned[10:15].tolist() == [1] * 5
        expected = np.stack([lower + (v + 1) / 2 * (upper - lower) for v in (-0.5, 0.5)])
    else:
        assert (assigned[10:15] == -1).all()
        expected = (lower + 0.75 * (upper - lower))[None, :]
    assert np.allclose(centers[np.argsort(centers[:, 0])], expected)
