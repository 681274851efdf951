"""The point kinds' bounds (``benchmarks/center_bound.py``): the report models, the known-label limit, overlap."""

from __future__ import annotations

import json
import math
from pathlib import Path

import center_bound as study
import numpy as np
import pytest


def test_the_convolved_density_integrates_to_one_and_its_score_is_its_derivative() -> None:
    b, s, mu = 0.7, 0.3, 0.2
    z = np.linspace(-20.0, 20.0, 400_001)
    log_g, score = study.convolved_logpdf(z, np.float64(mu), np.full(z.shape, s), b)
    assert np.trapezoid(np.exp(log_g), z) == pytest.approx(1.0, abs=1e-6)
    h = 1e-5
    up, _ = study.convolved_logpdf(z, np.float64(mu + h), np.full(z.shape, s), b)
    down, _ = study.convolved_logpdf(z, np.float64(mu - h), np.full(z.shape, s), b)
    assert np.allclose(score, (up - down) / (2 * h), atol=1e-5)
    # Far in the tails (|t| >> s) it is the Laplace density shifted by the Gaussian's moment factor.
    tail = np.abs(z - mu) > 10
    assert np.allclose(log_g[tail], (s * s / (2 * b * b)) - np.abs(z[tail] - mu) / b - math.log(2 * b), atol=1e-6)


def test_a_narrow_convolution_is_the_laplace_density() -> None:
    z = np.array([-3.0, -0.5, 0.4, 2.0])
    log_g, score = study.convolved_logpdf(z, np.float64(0.0), np.full(z.shape, 1e-6), 1.5)
    assert np.allclose(log_g, -np.abs(z) / 1.5 - math.log(3.0), atol=1e-9)
    assert np.allclose(score, np.sign(z) / 1.5)


def test_one_cluster_has_the_laplace_location_information() -> None:
    # Known labels, vanishing spread: the score is sign(t) / b, whose square is 1 / b^2 exactly.
    b = 0.4
    mu, s = np.array([[0.3, 0.6]]), np.full((1, 2), 1e-7)
    samples = 20_000
    info = study.mean_information(study.LaplaceReports(np.full(2, b)), mu, s, np.array([1.0]), samples,
                                  np.random.default_rng(1))
    assert np.allclose(np.diag(info), 1 / b**2, rtol=1e-6)
    # The coordinates' signs are independent: the cross term is a mean of +-1 / b^2, within 5 standard errors of 0.
    assert abs(info[0, 1]) < 5 / (b**2 * math.sqrt(samples))


def test_separated_clusters_bound_at_half_the_floor() -> None:
    # Clusters 40 b apart in every coordinate: every report's cluster is certain, so each mean's information
    # is pi_k / b^2 per coordinate and the CRB is b^2 / c = (Var / c) / 2, half the floor.
    b = 0.01
    mu = np.array([[0.1, 0.1], [0.5, 0.5], [0.9, 0.9]])
    s, pi = np.full((3, 2), 1e-7), np.array([0.5, 0.3, 0.2])
    info = study.mean_information(study.LaplaceReports(np.full(2, b)), mu, s, pi, 30_000, np.random.default_rng(2))
    figures = study.bound_figures(info, None, pi, np.full((3, 2), 0.01), 10_000, np.full(2, 2 * b * b))
    # The Monte Carlo cross terms (about 1 / sqrt(samples) each, relative) raise the inverse's diagonal by about
    # (k d - 1) / samples = 2e-4: 1e-3 is five times that.
    assert figures["excess_over_floor"] == pytest.approx(0.5, rel=1e-3)
    assert figures["error_over_floor"] == pytest.approx(math.sqrt(0.5), rel=1e-3)


def test_overlap_raises_the_crb_above_the_floor_and_a_prior_caps_it() -> None:
    mu = np.array([[0.3, 0.4], [0.6, 0.5]])
    s, pi = np.full((2, 2), 0.02), np.array([0.6, 0.4])
    crbs = []
    for b in (0.25, 1.0, 4.0):  # the same clusters under more and more noise
        info = study.mean_information(study.LaplaceReports(np.full(2, b)), mu, s, pi, 100_000,
                                      np.random.default_rng(3))
        floor = np.full(2, 2 * b * b)
        crbs.append(study.bound_figures(info, None, pi, s, 100_000, floor)["excess_over_floor"])
        prior = study.bound_figures(info, np.full(4, 4 * math.pi**2), pi, s, 100_000, floor)
        assert 0.0 < prior["excess_over_floor"] < crbs[-1]
    assert 0.5 < crbs[0] < crbs[1] < crbs[2] and crbs[2] > 10.0


def test_the_cos2_draws_have_their_moments() -> None:
    # Mean 1/2, variance 1/12 - 1/(2 pi^2) for the density 2 cos^2(pi (t - 1/2)) on [0, 1].
    t = study._cos2(np.random.default_rng(4), (200_000,))
    assert t.min() >= 0.0 and t.max() <= 1.0
    variance = 1 / 12 - 1 / (2 * math.pi**2)
    assert abs(t.mean() - 0.5) < 5 * math.sqrt(variance / t.size)
    assert t.var() == pytest.approx(variance, rel=0.02)


def test_a_small_run_writes_every_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    assert study.main(["--n", "2000", "--seeds", "1", "--samples", "2000", "--prior-draws", "1",
                       "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert sorted((r["kind"], r["data"], r["bound"].split(" ")[0]) for r in rows) == sorted(
        (kind, f"mixture d={d} k={k}", bound) for kind in study.KINDS for d, k in study.MIXTURES
        for bound in ("crb", "van_trees_local", "van_trees_prior"))
    assert all(r["cost_ratio"] > 1 for r in rows)
    assert all(r["excess_over_floor"] > 0 for r in rows if r["kind"] == "laplace")
    assert "| laplace | mixture d=5 k=6 | crb | 1 |" in capsys.readouterr().out


def test_floors_come_from_the_run_of_the_same_seed(tmp_path: Path) -> None:
    rows = [{"kind": "bitvector", "data": "mixture d=5 k=6", "seed": 100, "cost_ratio": 6.0},
            {"kind": "bitvector", "data": "mixture d=5 k=6", "seed": -1, "cost_ratio": 3.0}]
    runs = [{"kind": "bitvector", "data": "mixture d=5 k=6", "seed": 100, "floor_cost_ratio": 2.0},
            {"kind": "bitvector", "data": "mixture d=5 k=6", "seed": 101, "floor_cost_ratio": 4.0},
            {"kind": "laplace", "data": "mixture d=5 k=6", "seed": 100, "floor_cost_ratio": 9.0}]
    study.apply_floors(rows, runs)
    assert rows[0]["cost_over_floor"] == 3.0
    assert rows[1]["cost_over_floor"] == 1.0  # the median of the kind's runs, 3.0
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert study.main(["--floors", str(bad), "--seeds", "1"]) == 2


def _bitvector_reports(k: int = 3) -> study.BitVectorReports:
    lower, upper = np.array([-2.0, 0.0]), np.array([3.0, 10.0])
    model, variance = study.reports_for("bitvector", k, 2.0, lower, upper, seed=1)
    assert isinstance(model, study.BitVectorReports) and variance is None
    return model


def test_the_bit_pieces_are_the_encoders_own() -> None:
    from ldp_collector.campaigns import prepare_campaign
    from ldp_collector.cli_args import build_campaign_config
    from ldp_collector.serde import config_from_proto

    model = _bitvector_reports()
    encoder = prepare_campaign(config_from_proto(build_campaign_config(
        "bitvector", epsilon=2.0, k=3, seed=1, bounds=([-2.0, 0.0], [3.0, 10.0])))).engine.component.encoder
    rng = np.random.default_rng(5)
    points = np.column_stack([rng.uniform(-3.0, 4.0, 2000), rng.uniform(-1.0, 11.0, 2000)])
    widths = encoder.pivots_per_attribute
    for point in points:
        bits = encoder.encode(tuple(point))
        for j in range(2):
            clamped = min(max(point[j], encoder.domain.lower[j]), encoder.domain.upper[j])
            piece = np.searchsorted(model.edges[j], clamped, side="right") - 1
            start = sum(widths[:j])
            assert tuple(model.codes[j][piece].astype(int)) == bits[start:start + widths[j]]


def test_the_bit_likelihood_sums_to_one_and_its_score_is_its_derivative() -> None:
    model = _bitvector_reports()
    width = model.codes[0].shape[1]
    chunks = ((np.arange(2**width)[:, None] >> np.arange(width)) & 1).astype(np.float64)  # every report chunk
    log_p, score = model.log_and_score(0, chunks, 0.7, 0.9)
    assert np.exp(log_p).sum() == pytest.approx(1.0, abs=1e-12)
    h = 1e-6
    up, _ = model.log_and_score(0, chunks, 0.7 + h, 0.9)
    down, _ = model.log_and_score(0, chunks, 0.7 - h, 0.9)
    assert np.allclose(score, (up - down) / (2 * h), atol=1e-5)
    # The score has mean zero under the model: sum_r p(r) d log p(r) = d sum_r p(r) = 0.
    assert abs(float((np.exp(log_p) * score).sum())) < 1e-10


def test_bit_reports_are_drawn_with_the_flip_probability() -> None:
    model = _bitvector_reports()
    x = np.full(200_000, 0.5)
    bits = model.sample(0, x, np.random.default_rng(6))
    code = model.codes[0][np.searchsorted(model.edges[0], 0.5, side="right") - 1]
    flipped = (bits != code[None, :]).mean()
    samples = bits.size
    assert abs(flipped - model.p_flip) < 5 * math.sqrt(model.p_flip * (1 - model.p_flip) / samples)


@pytest.mark.parametrize("argv", [["--n", "10"], ["--epsilon", "0"], ["--seeds", "11"], ["--samples", "5"],
                                  ["--prior-draws", "-1"]])
def test_bad_arguments_get_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert study.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("center_bound: need") and "\n" not in err
