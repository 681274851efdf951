"""The DENSITY grid aggregation: smoothing error, the dense test's error rates, modes that noise cannot bridge or break."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from ldp_client.errors import InvalidParameterError
from ldp_collector.estimation.density_clustering import (
    SPLIT_DEPTH,
    SPLIT_Z,
    cluster_density,
    dense_threshold_z,
    mode_clusters,
    pool_levels,
    smooth_counts,
    snr_level,
)


def test_smoothed_standard_error_matches_the_noise() -> None:
    """The returned SE is the standard deviation of an interior smoothed cell of pure noise.

    R independent 16 x 16 grids of N(0, sigma^2): the sample standard deviation of the centre cell has
    a relative standard error of about 1 / sqrt(2 (R - 1)); the band is 5 of those (two-sided rate ~6e-7).
    """
    rng = np.random.default_rng(7)
    sigma, replicates = 3.0, 2000
    centre = np.empty(replicates)
    for r in range(replicates):
        smoothed, se = smooth_counts(rng.normal(0.0, sigma, (16, 16)), sigma, 0.75)
        centre[r] = smoothed[8, 8]
    band = 5.0 / math.sqrt(2.0 * (replicates - 1))
    assert abs(float(centre.std(ddof=1)) / se - 1.0) < band


def test_smoothing_keeps_a_constant_interior_and_zero_outside() -> None:
    grid = np.zeros((32, 32))
    grid[8:24, 8:24] = 10.0
    smoothed, _ = smooth_counts(grid, 1.0, 0.75)
    assert smoothed[12:20, 12:20] == pytest.approx(np.full((8, 8), 10.0))
    assert np.all(smoothed[:3, :] < 1e-6)
    assert smooth_counts(grid, 1.0, 0.0)[0] == pytest.approx(grid)


@pytest.mark.parametrize("side", [1, 2, 3, 6, 7, 12])
def test_smoothing_keeps_the_grid_shape_and_equals_the_direct_sum(side: int) -> None:
    """Narrower grids than the kernel (7 taps at the default bandwidth) keep their shape: each smoothed
    cell is the kernel-weighted sum of the cells within reach, zero outside the box."""
    from ldp_collector.estimation.density_clustering import SMOOTHING_BANDWIDTH, _kernel

    rng = np.random.default_rng(side)
    grid = rng.normal(5.0, 2.0, (side, side))
    kernel = _kernel(SMOOTHING_BANDWIDTH)
    half = kernel.size // 2
    smoothed, _ = smooth_counts(grid, 1.0, SMOOTHING_BANDWIDTH)
    assert smoothed.shape == grid.shape
    weight = {o: kernel[o + half] for o in range(-half, half + 1)}
    direct = np.zeros_like(grid)
    for i in range(side):
        for j in range(side):
            direct[i, j] = sum(weight[a - i] * weight[b - j] * grid[a, b] for a in range(side) for b in range(side)
                               if abs(a - i) <= half and abs(b - j) <= half)
    assert smoothed == pytest.approx(direct)


@pytest.mark.parametrize("side", [2, 4, 6])
def test_a_grid_narrower_than_the_kernel_is_clustered(side: int) -> None:
    counts = np.zeros((side,) * 3)
    counts[(0,) * 3] = counts[(side - 1,) * 3] = 1000.0
    result = cluster_density(counts, 5.0, 2000.0)
    assert result.labels.shape == counts.shape and result.clusters >= 1


def _benjamini_hochberg(z: np.ndarray, rate: float) -> int:
    """Number of discoveries by the textbook BH step-up procedure."""
    p = np.array(sorted(1.0 - NormalDist().cdf(float(v)) for v in z))
    m = len(p)
    passing = [k for k in range(1, m + 1) if p[k - 1] <= rate * k / m]
    return max(passing) if passing else 0


@pytest.mark.parametrize("seed", range(5))
def test_dense_threshold_is_benjamini_hochberg(seed: int) -> None:
    rng = np.random.default_rng(seed)
    z = np.concatenate([rng.normal(0.0, 1.0, 900), rng.normal(4.0, 1.0, 100)])
    threshold = dense_threshold_z(z, 0.05)
    assert int((z >= threshold).sum()) == _benjamini_hochberg(z, 0.05)


def test_dense_threshold_without_discoveries_is_bonferroni() -> None:
    z = np.zeros(1000)
    assert dense_threshold_z(z, 0.05) == pytest.approx(NormalDist().inv_cdf(1 - 0.05 / 1000))
    with pytest.raises(InvalidParameterError, match="at least one cell"):
        dense_threshold_z(np.zeros(0))


def test_pure_noise_rarely_makes_a_cluster() -> None:
    """Under the global null BH's family-wise rate is its FDR (5 %); the mass test can only lower it.

    200 noise grids: the count of grids with any cluster is Binomial(200, <= 0.05); its 1 - 1e-6 quantile
    at 0.05 is 29.
    """
    rng = np.random.default_rng(11)
    with_clusters = sum(cluster_density(rng.normal(0.0, 50.0, (32, 32)), 50.0, 1e5).clusters > 0 for _ in range(200))
    assert with_clusters <= 29


def _plateaus(height: float) -> np.ndarray:
    grid = np.zeros((24, 24))
    grid[4:20, 3:9] = height
    grid[4:20, 12:18] = height
    return grid


def test_a_single_noisy_cell_does_not_bridge_two_clusters() -> None:
    """Two plateaus 3 empty cells apart, joined by a path of cells of 3 standard errors (a noise spike each)."""
    se = 1.0
    grid = _plateaus(12.0)
    grid[10, 9:12] = 3.0 * se
    dense = grid >= 2.5 * se
    labels = mode_clusters(grid, dense, SPLIT_Z * math.sqrt(2.0) * se)
    assert labels[10, 5] != labels[10, 15] and labels[10, 5] >= 0 and labels[10, 15] >= 0
    # Without the split rule the bridge joins them: the test is not vacuous.
    assert mode_clusters(grid, dense, 0.0, depth=1.0)[10, 5] == mode_clusters(grid, dense, 0.0, depth=1.0)[10, 15]


def test_a_single_noisy_dip_does_not_break_a_cluster() -> None:
    """A ring-like band with one cell dipping to 60 % of the band: still one cluster."""
    se = 1.0
    grid = np.zeros((24, 24))
    grid[5:7, 2:22] = 10.0
    grid[5:7, 11] = 10.0 * (1.0 - SPLIT_DEPTH + 0.1)
    grid[5, 16] = 13.0  # an upward spike on the other side does not matter either
    labels = mode_clusters(grid, grid > 2.5, SPLIT_Z * math.sqrt(2.0) * se)
    assert len(set(labels[grid > 0].tolist())) == 1


def test_two_noisy_blobs_are_found_with_their_mass() -> None:
    """Two Gaussian blobs in OUE-like noise: two clusters, each blob's centre labelled, masses near the truth."""
    rng = np.random.default_rng(3)
    m, n, se = 32, 200_000, 400.0
    yy, xx = np.mgrid[0:m, 0:m]
    shape = np.exp(-((xx - 9) ** 2 + (yy - 9) ** 2) / 8.0) + np.exp(-((xx - 22) ** 2 + (yy - 20) ** 2) / 8.0)
    truth = n * shape / shape.sum()
    found = cluster_density(truth + rng.normal(0.0, se, (m, m)), se, n)
    assert found.clusters == 2
    assert found.labels[9, 9] >= 0 and found.labels[20, 22] >= 0 and found.labels[9, 9] != found.labels[20, 22]
    assert sum(found.cluster_shares) == pytest.approx(1.0, abs=0.1)


def test_bad_inputs() -> None:
    with pytest.raises(InvalidParameterError, match="standard error"):
        cluster_density(np.zeros((4, 4)), 0.0, 10)
    with pytest.raises(InvalidParameterError, match="n must be positive"):
        cluster_density(np.zeros((4, 4)), 1.0, 0)
    with pytest.raises(InvalidParameterError, match="same shape"):
        mode_clusters(np.zeros((4, 4)), np.zeros((4, 5), dtype=bool), 1.0)


def test_snr_level_follows_the_noise() -> None:
    """More reports or fewer occupied cells afford a finer grid; the level stays in range."""
    calibration = np.zeros(256)
    calibration[:40] = 1000.0
    levels = [snr_level(calibration, 50.0, 4, 2, n, math.sqrt(n * 0.7), min_level=1, max_level=6)[0]
              for n in (1e3, 1e4, 1e5, 1e6, 1e7)]
    assert levels == sorted(levels) and levels[0] >= 1 and levels[-1] <= 6 and levels[-1] > levels[0]
    assert snr_level(calibration, 50.0, 4, 2, 1e6, 840.0, min_level=1, max_level=6)[1] == 40
    spread = np.full(256, 1000.0)
    assert snr_level(spread, 50.0, 4, 2, 1e6, 840.0, min_level=1, max_level=6)[0] <= \
        snr_level(calibration, 50.0, 4, 2, 1e6, 840.0, min_level=1, max_level=6)[0]



def _coarse(grid: np.ndarray, factor: int) -> np.ndarray:
    side = grid.shape[0] // factor
    out: np.ndarray = grid.reshape(side, factor, side, factor).sum(axis=(1, 3))
    return out


@pytest.mark.parametrize("fine,coarse", [(8, 4), (8, 2), (4, 4), (4, 8)])
def test_pooled_levels_are_unbiased_with_the_stated_variance(fine: int, coarse: int) -> None:
    """R draws of two independent unbiased estimates of one population, on two levels of one grid.

    Per cell, the pooled mean's error is within 5.3 standard errors of the mean (two-sided ~1e-7 per cell,
    under 1e-5 over the cells) and the sample variance within 5.3 of its own standard errors
    (sqrt(2 / (R - 1)) relative) of the stated one; the stated one is below the unpooled variance.
    """
    rng = np.random.default_rng(11)
    truth = rng.uniform(0.0, 100.0, (max(fine, coarse),) * 2)
    fine_truth = truth if fine >= coarse else _coarse(truth, coarse // fine)
    coarse_truth = _coarse(truth, max(fine, coarse) // coarse) if coarse < max(fine, coarse) else truth
    fine_se = rng.uniform(2.0, 4.0, fine_truth.shape)  # heteroscedastic, as an oracle's counts are
    coarse_se = 6.0
    replicates = 4000
    draws = np.empty((replicates, *fine_truth.shape))
    for r in range(replicates):
        x = fine_truth + rng.normal(0.0, 1.0, fine_truth.shape) * fine_se
        other = coarse_truth + rng.normal(0.0, coarse_se, coarse_truth.shape)
        draws[r], stated = pool_levels(x, fine_se, other, coarse_se)
    z_mean = (draws.mean(axis=0) - fine_truth) / (stated / math.sqrt(replicates))
    assert float(np.abs(z_mean).max()) < 5.3
    ratio = draws.var(axis=0, ddof=1) / stated**2
    assert float(np.abs(ratio - 1.0).max()) < 5.3 * math.sqrt(2.0 / (replicates - 1))
    assert (stated < fine_se).all()


def test_pooled_levels_agree_with_the_combined_coarse_estimate() -> None:
    """Block sums of the pooled grid are the inverse-variance mean of the two coarse estimates (consistency)."""
    rng = np.random.default_rng(3)
    x = rng.normal(50.0, 10.0, (8, 8))
    se = rng.uniform(1.0, 3.0, (8, 8))
    other = rng.normal(800.0, 30.0, (2, 2))
    pooled, _ = pool_levels(x, se, other, 5.0)
    sums, sums_var = _coarse(x, 4), _coarse(se**2, 4)
    expected = (sums / sums_var + other / 25.0) / (1.0 / sums_var + 1.0 / 25.0)
    assert np.allclose(_coarse(pooled, 4), expected, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("counts,se,other,other_se,match", [
    (np.zeros((4, 4)), 1.0, np.zeros((3, 3)), 1.0, "power-of-two"),
    (np.zeros((4, 4)), 1.0, np.zeros((2, 2, 2)), 1.0, "square grids"),
    (np.zeros((4, 2)), 1.0, np.zeros((2, 2)), 1.0, "square grids"),
    (np.zeros((4, 4)), 0.0, np.zeros((2, 2)), 1.0, "positive, finite"),
    (np.zeros((4, 4)), 1.0, np.zeros((2, 2)), math.nan, "positive, finite"),
])
def test_pooled_levels_refuse_bad_grids(counts: np.ndarray, se: float, other: np.ndarray, other_se: float,
                                        match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        pool_levels(counts, se, other, other_se)
