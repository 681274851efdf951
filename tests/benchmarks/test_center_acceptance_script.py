"""The center-acceptance benchmark (``benchmarks/center_acceptance.py``) builds the data it says and scores every run."""

from __future__ import annotations

import json
from pathlib import Path

import center_acceptance as acceptance
import numpy as np
import pytest


def test_the_small_cluster_data_has_its_shares_and_separation() -> None:
    x, labels, means = acceptance.small_cluster_data(200_000, seed=3)
    k = len(acceptance.SMALL_SHARES)
    gaps = np.linalg.norm(means[:, None] - means[None], axis=2) + np.eye(k) * 1e9
    assert gaps.min() >= acceptance.SEPARATION
    shares = np.bincount(labels, minlength=k) / len(labels)
    # Multinomial shares: each within 5 standard errors.
    se = np.sqrt(np.asarray(acceptance.SMALL_SHARES) * (1 - np.asarray(acceptance.SMALL_SHARES)) / len(labels))
    assert np.all(np.abs(shares - acceptance.SMALL_SHARES) <= 5 * se)
    assert np.allclose(x[labels == 5].mean(axis=0), means[5], atol=5 * np.sqrt(1 / (0.02 * 200_000)))


def test_a_small_run_scores_every_kind_and_writes_its_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    code = acceptance.main(["--experiment", "small", "--n", "3000", "--seeds", "1", "--kinds", "stemmer", "laplace",
                            "--out", str(out)])
    assert code == 0
    table = capsys.readouterr().out
    assert "| small 2% d=5 k=6 | stemmer | 1 |" in table and "| small 2% d=5 k=6 | laplace | 1 |" in table
    rows = json.loads(out.read_text())["rows"]
    assert {r["kind"] for r in rows} == {"stemmer", "laplace", "kmeans++ (non-private)"}
    assert all(r["seed"] == 100 and "small_cluster_found" in r for r in rows)
    assert all("cost_over_floor" in r for r in rows if r["kind"] != "kmeans++ (non-private)")


def test_epsilon_inf_runs_stemmers_noiseless_server_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    assert acceptance.main(["--experiment", "mixture", "--n", "20000", "--epsilon", "inf", "--seeds", "1",
                            "--kinds", "stemmer", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    # Without noise every round sees every device exactly: the well-separated mixture is found whole.
    assert row["kind"] == "stemmer" and row["ari"] == pytest.approx(1.0) and row["cost_ratio"] < 1.01
    for argv in (["--kinds", "nettree"], ["--kinds", "stemmer", "nettree"], ["--experiment", "small", "--kinds", "stemmer"]):
        with pytest.raises(SystemExit):
            acceptance.main(["--experiment", "mixture", "--epsilon", "inf", *argv])
    assert "--epsilon inf runs stemmer's noiseless server steps" in capsys.readouterr().err


def test_a_run_split_over_seeds_merges_into_the_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--skip leaves out the first seeds and --merge joins the parts: the rows of the one run, the same table."""
    common = ["--experiment", "small-bound", "--n", "1000000", "--kinds", "nettree"]
    whole, first, second = (tmp_path / f"{name}.json" for name in ("whole", "first", "second"))
    assert acceptance.main([*common, "--seeds", "3", "--out", str(whole)]) == 0
    table = capsys.readouterr().out
    assert acceptance.main([*common, "--seeds", "1", "--out", str(first)]) == 0
    assert acceptance.main([*common, "--seeds", "3", "--skip", "1", "--out", str(second)]) == 0
    assert [r["seed"] for r in json.loads(second.read_text())["rows"]] == [101, 102]
    capsys.readouterr()
    assert acceptance.main([*common, "--seeds", "0", "--merge", str(first), str(second)]) == 0
    assert capsys.readouterr().out == table
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(SystemExit, match="--merge .*bad.json: not a results file of this script"):
        acceptance.main([*common, "--seeds", "0", "--merge", str(tmp_path / "bad.json")])
    with pytest.raises(SystemExit, match="--merge .*first.json: its runs are at n = 1000000, epsilon = 2.0, not"):
        acceptance.main([*common[:3], "100000", *common[4:], "--seeds", "0", "--merge", str(first)])
    with pytest.raises(SystemExit) as twice:  # a part merged twice, or parts with overlapping seeds
        acceptance.main([*common, "--seeds", "0", "--merge", str(first), str(first)])
    assert twice.value.code == 2 and "the same run twice" in capsys.readouterr().err
    with pytest.raises(SystemExit) as negative:
        acceptance.main([*common, "--skip", "-2"])
    assert negative.value.code == 2 and "must not be negative" in capsys.readouterr().err


def test_params_take_numbers_and_choices_by_name() -> None:
    params = acceptance._params(["nettree.vector_shape=privunit", "nettree.refinement_share=0.3",
                                 "stemmer.vector_shape=box", "nettree.expected_reports=7"], "nettree", 1000)
    assert params == {"vector_shape": "privunit", "refinement_share": 0.3, "expected_reports": 7}
    # The choice's name is what the kind's flag takes: the campaign is built with PRIVUNIT (3).
    config = acceptance.build_campaign_config("nettree", epsilon=2.0, k=3, bounds=((0.0, 0.0), (1.0, 1.0)), **params)
    assert config.nettree.vector_shape == 3


def test_the_small_cluster_bound_scales_with_the_devices_not_the_sample(capsys: pytest.CaptureFixture[str]) -> None:
    """The ideal center's noise is sqrt(n' M) / c with c = 2 % of n': 1 / sqrt(n), whatever sample gave the box."""
    x, _, means = acceptance.small_cluster_data(20_000, seed=100)
    small = acceptance.small_found_bound("stemmer", x, means, 100_000, 2.0, 100, {})
    large = acceptance.small_found_bound("stemmer", x, means, 10_000_000, 2.0, 100, {})
    assert small["noise_norm"] / large["noise_norm"] == pytest.approx(10.0, rel=1e-12)
    assert large["reports"] == pytest.approx(0.35 * 10_000_000, rel=1e-4)  # the Lloyd round's share
    assert 0.0 <= small["found_probability"] < large["found_probability"] == 1.0
    with pytest.raises(ValueError, match="nettree and stemmer"):
        acceptance.small_found_bound("laplace", x, means, 100_000, 2.0, 100, {})
    assert acceptance.main(["--experiment", "small-bound", "--n", "1000000", "--seeds", "2",
                            "--kinds", "nettree", "stemmer"]) == 0
    out = capsys.readouterr().out
    assert "| small 2% d=5 k=6 (bound) | nettree | 2 |" in out and "P(at least 2 of 2)" in out
    with pytest.raises(SystemExit) as refused:
        acceptance.main(["--experiment", "small-bound", "--kinds", "laplace"])
    assert refused.value.code == 2
    assert "small-bound covers nettree and stemmer, not laplace" in capsys.readouterr().err


def test_the_real_bound_reproduces_k_means_without_noise_and_scales_with_the_devices(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every row is there; the noise-free k-means++ centers give k-means' own ARI (ratio 1); the noise of a kind
    whose plan does not depend on n falls as 1 / sqrt(m) with the devices."""
    out = tmp_path / "rows.json"
    assert acceptance.main(["--experiment", "real-bound", "--n", "4000", "--epsilon", "4", "--seeds", "2",
                            "--draws", "5", "--multipliers", "1", "10", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "digits10: non-private k-means++ ARI" in table
    for kind in (*acceptance.REAL_BOUND_KINDS, "none (noise-free)"):
        assert f"| digits10 | k-means++ centers | {kind} | 2 |" in table
        assert f"| digits10 | class means | {kind} | 2 |" in table
    rows = json.loads(out.read_text())["rows"]
    reference = {r["seed"]: r["ari"] for r in rows if r["kind"] == "kmeans++ (non-private)"}
    assert set(reference) == {100, 101} and all(0.0 < a < 1.0 for a in reference.values())
    bound = [r for r in rows if "multiplier" in r]
    # Per seed: 2 kinds of centers x (the noise-free row + 4 kinds x 2 multipliers).
    assert len(bound) == 2 * 2 * (1 + 4 * 2)
    free = [r for r in bound if r["kind"] == "none (noise-free)"]
    assert all(r["draws"] == 1 and r["noise_norm"] == 0.0 for r in free)
    assert [r["ari_ratio"] for r in free if r["centers"] == "k-means++ centers"] == [1.0, 1.0]
    assert all(r["ari"] == pytest.approx(reference[r["seed"]] * r["ari_ratio"], rel=1e-12) for r in bound)
    noisy = [r for r in bound if r["kind"] != "none (noise-free)"]
    assert all(r["draws"] == 5 and -1.0 <= r["ari"] <= 1.0 and r["noise_norm"] > 0 for r in noisy)
    for kind in ("stemmer", "ldp_kmeans", "laplace"):
        for centers in ("k-means++ centers", "class means"):
            one, ten = ([r["noise_norm"] for r in noisy if (r["kind"], r["centers"], r["seed"], r["multiplier"])
                         == (kind, centers, 100, m)] for m in (1.0, 10.0))
            assert one[0] / ten[0] == pytest.approx(10.0**0.5, rel=1e-9)
    with pytest.raises(SystemExit) as refused:
        acceptance.main(["--experiment", "real-bound", "--kinds", "bitvector"])
    assert refused.value.code == 2
    assert "real-bound covers nettree, stemmer, ldp_kmeans, laplace, not bitvector" in capsys.readouterr().err


def test_the_ideal_centers_ari_is_k_means_without_noise_and_falls_with_it() -> None:
    x, y = acceptance.real_data("digits10", 3000, seed=100)
    centers = acceptance.reference_kmeans(x, 10, 100, 3).centers
    z = np.random.default_rng(0).standard_normal((4, 10, x.shape[1]))
    exact = acceptance.adjusted_rand_index(y, acceptance.assign(x, centers)[0])
    assert np.all(acceptance.bound_aris(x, y, centers, np.zeros((10, x.shape[1])), z) == exact)
    noisy = acceptance.bound_aris(x, y, centers, np.full((10, x.shape[1]), 4.0), z)
    assert np.all(noisy < exact)
    # A center without an estimate is left out; none left: one cluster, ARI 0.
    lost = np.zeros((10, x.shape[1]))
    lost[3] = np.inf
    assert acceptance.bound_aris(x, y, centers, lost, z[:1])[0] == acceptance.adjusted_rand_index(
        y, acceptance.assign(x, np.delete(centers, 3, axis=0))[0])
    assert np.all(acceptance.bound_aris(x, y, centers, np.full((10, x.shape[1]), np.inf), z) == 0.0)


def test_the_ldp_kmeans_variance_is_what_its_label_round_reports() -> None:
    """The ideal variance (an expectation) against the kind's own plug-in (``label_update`` on simulated reports of
    the last label round: GRR labels of the true clusters, fresh box vectors)."""
    from ldp_collector.estimation.vectors import vector_estimates
    from ldp_collector.kinds.ldp_kmeans import label_update
    from ldp_collector.simulation.reports import draw_grr
    from ldp_collector.simulation.vector import draw_payloads, encode_points

    x, y = acceptance.real_data("digits10", 60_000, seed=3)
    k = 10
    means = np.column_stack([np.bincount(y, weights=x[:, j]) for j in range(x.shape[1])]) / np.bincount(y)[:, None]
    # Six equal groups (five label rounds): the last round's devices are x when there are 6 len(x) devices.
    variances, info = acceptance.ideal_center_variances("ldp_kmeans", x, y, means, 6 * len(x), 4.0, 3, {})
    assert info["round_reports"] == len(x) and info["label_epsilon"] == 2.0
    config = acceptance.config_from_proto(acceptance.build_campaign_config(
        "ldp_kmeans", epsilon=4.0, k=k, bounds=acceptance.numeric_bounds(x), seed=3))
    engine = acceptance.prepare_campaign(config).engine
    rng = np.random.default_rng(5)
    labels = draw_grr(engine.label_mechanism, y, rng)
    component = engine.label_vector_component
    vectors = vector_estimates(component.mechanism, draw_payloads(component, encode_points(component.encoder, x), rng))
    lower, upper = (np.asarray(b) for b in acceptance.numeric_bounds(x))
    update = label_update(labels, vectors, engine.label_mechanism, (means - lower) / (upper - lower))
    assert update.updated.all()
    measured = update.variances * (upper - lower) ** 2
    # The plug-in is itself noisy (and uses the noisy counts): within 10 % per center, 3 % on the whole.
    assert np.allclose(measured.sum(axis=1), variances.sum(axis=1), rtol=0.10)
    assert measured.sum() == pytest.approx(variances.sum(), rel=0.03)
