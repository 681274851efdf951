"""The bitvector likelihood probe (``benchmarks/bitvector_likelihood.py``): its likelihood, gradient and fit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import bitvector_likelihood as probe
import center_bound
import numpy as np
import pytest
from scipy.special import ndtr

LOWER, UPPER = np.array([-2.0, 0.0]), np.array([3.0, 10.0])


def _reports(epsilon: float, means: np.ndarray, spreads: np.ndarray, weights: np.ndarray, m: int,
             seed: int) -> tuple[center_bound.BitVectorReports, np.ndarray]:
    # The pieces depend on the box and epsilon only; the campaign needs k >= 2.
    model, _ = center_bound.reports_for("bitvector", max(2, len(means)), epsilon, LOWER, UPPER, seed=1)
    assert isinstance(model, center_bound.BitVectorReports)
    rng = np.random.default_rng(seed)
    labels = rng.choice(len(means), size=m, p=weights)
    x = np.clip(means[labels] + rng.standard_normal((m, 2)) * spreads[labels], LOWER, UPPER)
    bits = np.concatenate([model.sample(j, x[:, j], rng) for j in range(2)], axis=1).astype(np.uint8)
    return model, bits


def test_the_piece_likelihoods_give_the_bound_scripts_report_probabilities() -> None:
    # The probe slices the report into attributes: sum_t P(bits | piece t) w_t must be exp(log p) of center_bound.
    model, bits = _reports(2.0, np.array([[0.0, 4.0]]), np.array([[0.8, 2.0]]), np.array([1.0]), 300, 2)
    likelihoods = probe.piece_likelihoods(bits, model)
    start = 0
    for j, lik in enumerate(likelihoods):
        width = model.codes[j].shape[1]
        log_p, _ = model.log_and_score(j, bits[:, start:start + width].astype(np.float64), [0.0, 4.0][j],
                                       [0.8, 2.0][j])
        z = (model.edges[j] - [0.0, 4.0][j]) / [0.8, 2.0][j]
        assert np.allclose(lik @ (ndtr(z[1:]) - ndtr(z[:-1])), np.exp(log_p), rtol=1e-10)
        start += width


def test_the_gradient_is_the_derivative_of_the_likelihood() -> None:
    means, spreads = np.array([[-1.0, 2.0], [1.5, 7.0]]), np.array([[0.5, 1.0], [0.7, 1.5]])
    model, bits = _reports(2.0, means, spreads, np.array([0.6, 0.4]), 500, 3)
    likelihoods = probe.piece_likelihoods(bits, model)
    theta = np.concatenate([(means + 0.3).ravel(), np.log(spreads * 1.2).ravel(), [0.2]])
    _, gradient = probe.negative_log_likelihood(theta, likelihoods, model.edges, 2)
    h = 1e-6
    for i in range(theta.size):
        up, down = theta.copy(), theta.copy()
        up[i] += h
        down[i] -= h
        numeric = (probe.negative_log_likelihood(up, likelihoods, model.edges, 2)[0]
                   - probe.negative_log_likelihood(down, likelihoods, model.edges, 2)[0]) / (2 * h)
        assert gradient[i] == pytest.approx(numeric, rel=1e-4, abs=1e-4)


def test_the_fit_recovers_separated_clusters_from_a_shifted_start() -> None:
    # Little noise (epsilon 20: each bit flips with probability 1 / (1 + e^2.5) = 0.076) and 20 000 reports:
    # started a quarter of the way toward each other, the means come back to within a tenth of the shift.
    means, spreads = np.array([[-1.0, 2.0], [2.0, 8.0]]), np.array([[0.3, 0.6], [0.3, 0.6]])
    model, bits = _reports(20.0, means, spreads, np.array([0.5, 0.5]), 20_000, 4)
    shift = (means[::-1] - means) / 4
    fitted, log_likelihood, _ = probe.likelihood_fit(bits, model, means + shift, np.array([0.5, 0.5]), LOWER, UPPER)
    assert math.isfinite(log_likelihood)
    assert np.all(np.abs(fitted - means) < np.abs(shift) / 10)


def test_a_small_run_scores_both_centers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    assert probe.main(["--n", "3000", "--seeds", "1", "--tuning", "--sample", "3000", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["seed"] == 0 and row["kind_cost_ratio"] >= 1.0 and row["likelihood_cost_ratio"] >= 1.0
    assert -1.0 <= row["likelihood_ari"] <= 1.0
    assert "likelihood step lower cost on" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--n", "10"], ["--k", "1"], ["--epsilon", "0"], ["--seeds", "11"],
                                  ["--sample", "5"]])
def test_bad_arguments_get_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert probe.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bitvector_likelihood: need") and "\n" not in err
