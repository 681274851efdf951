"""The noise floor every center result reports (``estimation/center_floor.py``) and the kinds' variances behind it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from ldp_client.errors import InvalidParameterError
from ldp_client.mechanisms import GRRParams
from ldp_collector.cli_args import build_campaign_config
from ldp_collector.core import Collector
from ldp_collector.estimation.center_floor import (
    FLOOR_CENTER_ERROR,
    FLOOR_EXCESS_COST,
    clipped_mse,
    expected_norm,
    floor_cost_ratio,
    floor_diagnostics,
    unit_to_data_variance,
)
from ldp_collector.kinds.ldp_kmeans import label_update
from ldp_collector.kinds.registry import KINDS
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.evaluation import evaluate_clustering, floor_scores
from ldp_collector.simulation.population import numeric_bounds
from ldp_collector.simulation.runner import run_campaign
from ldp_collector.storage.sqlite import SqliteReportStore
from support.stats import FALSE_FAILURE_RATE

CENTER_KINDS = sorted(name for name, kind in KINDS.items() if kind.clustering and name != "grid")


@pytest.mark.parametrize("d", [1, 2, 5, 10, 50])
def test_expected_norm_is_the_chi_mean_for_equal_variances(d: int) -> None:
    sigma = 0.3
    got = expected_norm(np.full((1, d), sigma**2))[0]
    assert got == pytest.approx(sigma * stats.chi(d).mean(), rel=1e-12)


def test_floor_weights_the_excess_cost_and_averages_the_error() -> None:
    v = np.array([[1.0, 1.0], [4.0, 4.0], [np.inf, 1.0]])
    floor = floor_diagnostics(v, [3.0, 1.0, 5.0])  # the third center has no finite variance: left out
    assert floor[FLOOR_EXCESS_COST] == pytest.approx((3 * 2.0 + 1 * 8.0) / 4)
    assert floor[FLOOR_CENTER_ERROR] == pytest.approx(expected_norm(v[:2]).mean())
    assert floor_diagnostics(np.full((1, 2), np.inf), [1.0]) == {}
    with pytest.raises(InvalidParameterError, match="one weight per center"):
        floor_diagnostics(v, [1.0])
    with pytest.raises(InvalidParameterError, match=">= 0"):
        floor_diagnostics([[-1.0]], [1.0])


def test_unit_variances_scale_to_the_domain_and_the_ratio_follows() -> None:
    out = unit_to_data_variance([1.0, 2.0], [0.0, -5.0], [2.0, 5.0], unit_width=2.0)
    assert out.tolist() == [[1.0, 25.0], [2.0, 50.0]]
    assert floor_cost_ratio(2.0, 4.0) == 1.5
    assert floor_cost_ratio(0.0, 0.0) == 1.0 and floor_cost_ratio(1.0, 0.0) == math.inf


def test_label_update_variance_matches_the_spread_of_its_centers() -> None:
    """The ldp_kmeans center variance (ratio-estimator linearization over GRR labels and noisy vectors)
    equals the variance of the centers over independent randomizations of the same devices.

    With R replicates the sample variance over the reported one is chi2(R - 1) / (R - 1) up to the
    linearization's O(1/n) error; the test accepts inside the two-sided 1e-6 quantiles, widened by 2 %
    for that error (n = 4000 per replicate keeps it below 1 %)."""
    rng = np.random.default_rng(0)
    k, d, n, replicates = 3, 2, 4000, 400
    truth = rng.integers(0, k, n)
    means = np.array([[0.2, 0.3], [0.5, 0.8], [0.8, 0.2]])
    points = means[truth] + 0.05 * rng.standard_normal((n, d))
    grr = GRRParams(domain_size=k, epsilon=2.0)
    p = float(grr.p)
    centers, variances = [], []
    for _ in range(replicates):
        keep = rng.random(n) < p
        other = (truth + rng.integers(1, k, n)) % k
        labels = np.where(keep, truth, other)
        vectors = points + 0.4 * rng.standard_normal((n, d))  # any unbiased noise
        update = label_update(labels, vectors, grr, means.copy())
        assert update.updated.all()
        centers.append(update.centers[0])
        variances.append(update.variances[0])
    empirical = np.var(np.array(centers), axis=0, ddof=1)
    reported = np.array(variances).mean(axis=0)
    alpha = FALSE_FAILURE_RATE / d
    lo = stats.chi2.ppf(alpha / 2, replicates - 1) / (replicates - 1) / 1.02
    hi = stats.chi2.isf(alpha / 2, replicates - 1) / (replicates - 1) * 1.02
    ratio = empirical / reported
    assert np.all((lo <= ratio) & (ratio <= hi)), (ratio, lo, hi)


@pytest.mark.parametrize("kind", CENTER_KINDS)
def test_every_center_kind_reports_its_floor(kind: str, tmp_path: Path) -> None:
    x, labels = make_dataset("mixture", n=3000, d=2, k=3, seed=3)
    config = config_from_proto(build_campaign_config(kind, epsilon=4.0, k=3, bounds=numeric_bounds(x), seed=3))
    collector = Collector(SqliteReportStore(tmp_path / "s.db"))
    run = run_campaign(collector, config, x, seed=3, quiet=True)
    diagnostics = run.result.diagnostics
    assert run.result.clustering is not None and run.result.clustering.centers
    assert diagnostics[FLOOR_CENTER_ERROR] > 0 and diagnostics[FLOOR_EXCESS_COST] > 0
    scores = evaluate_clustering(run.result, x, labels, k=3)
    assert scores["cost_over_floor"] == pytest.approx(scores["cost_ratio"] / scores["floor_cost_ratio"])
    assert scores["center_error_over_floor"] == pytest.approx(scores["center_error"] / scores["floor_center_error"])


def test_floor_scores_are_empty_without_a_floor() -> None:
    assert floor_scores({}, {"cost_ratio": 2.0, "center_error": 1.0}, 1.0) == {}
    out = floor_scores({FLOOR_EXCESS_COST: 1.0, FLOOR_CENTER_ERROR: 0.5}, {"cost_ratio": 3.0, "center_error": 1.0}, 1.0)
    assert out == {"floor_cost_ratio": 2.0, "cost_over_floor": 1.5, "floor_center_error": 0.5,
                   "center_error_over_floor": 2.0}


@pytest.mark.parametrize(("mu", "s", "a", "b"), [(0.5, 0.1, 0.0, 1.0), (0.9, 0.3, 0.0, 1.0), (0.2, 2.0, 0.0, 1.0),
                                                 (-1.0, 0.5, -1.0, 1.0)])
def test_clipped_mse_is_the_mean_square_of_a_clipped_normal(mu: float, s: float, a: float, b: float) -> None:
    """Against 400 000 draws: the sample mean of (clip(mu + s Z) - mu)^2 within 5.3 of its standard errors
    (two-sided 1e-7 each, four cases: family-wise below 1e-6)."""
    rng = np.random.default_rng(7)
    e = (np.clip(mu + s * rng.standard_normal(400_000), a, b) - mu) ** 2
    got = clipped_mse([[mu]], [[s * s]], [a], [b])[0, 0]
    assert abs(e.mean() - got) <= stats.norm.isf(FALSE_FAILURE_RATE / 8) * e.std() / np.sqrt(e.size)
    assert got <= s * s  # clipping never adds error


def test_a_clipped_floor_uses_the_centers_box() -> None:
    free = floor_diagnostics([[4.0]], [1.0])
    boxed = floor_diagnostics([[4.0]], [1.0], centers=[[0.5]], lower=[0.0], upper=[1.0])
    assert boxed[FLOOR_EXCESS_COST] < 0.25 < free[FLOOR_EXCESS_COST] == 4.0
    with pytest.raises(InvalidParameterError, match="box"):
        floor_diagnostics([[4.0]], [1.0], centers=[[0.5]])


def test_centers_no_better_than_a_guess_of_the_middle_are_flagged() -> None:
    from ldp_collector.estimation.center_floor import GUESS_ERROR, drowned_centers_warning

    lower, upper = (0.0, 10.0), (2.0, 30.0)  # widths 2 and 20
    at_guess = np.array([[(2 * GUESS_ERROR) ** 2, (20 * GUESS_ERROR) ** 2]])
    assert drowned_centers_warning(at_guess * 1.0001, lower, upper) is not None
    assert drowned_centers_warning(at_guess * 0.9999, lower, upper) is None
    # The best-determined center decides: one informative center is enough.
    assert drowned_centers_warning(np.vstack([at_guess * 100, at_guess * 0.5]), lower, upper) is None
    assert drowned_centers_warning(np.empty((0, 2)), lower, upper) is None
