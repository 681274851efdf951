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
