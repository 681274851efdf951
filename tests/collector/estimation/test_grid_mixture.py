"""Gaussian components of density modes (``estimation/grid_mixture.py``): the cell integrals, the fit, the test.

Histograms here are built from a model's exact cell probabilities (the module's own integrals,
pinned first against closed forms) plus the two errors the module assumes: the oracle's
``N(0, s^2)`` and the sampling variance of the true counts. Seeded, so each case is one fixed draw.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldp_client.errors import InvalidParameterError
from ldp_collector.estimation.grid_mixture import (
    MIXTURE_TEST_LEVEL,
    GridMixture,
    cell_integrals,
    split_gaussian_modes,
)


def _phi_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * np.vectorize(math.erfc)(-x / math.sqrt(2.0))


def _grid_corners(shape: tuple[int, ...]) -> np.ndarray:
    return np.indices(shape).reshape(len(shape), -1).T.astype(np.float64)


@pytest.mark.parametrize("sds", [(0.3, 0.4), (1.0, 2.5), (4.0, 0.35), (0.5, 1.5, 0.8)])
def test_an_axis_aligned_gaussian_integrates_to_its_rectangle_probabilities(sds: tuple[float, ...]) -> None:
    """With a diagonal covariance the cell probability is a product of normal CDF differences; over a
    grid that holds all of the mass (7 deviations each way) the moments are the distribution's own."""
    d = len(sds)
    side = int(math.ceil(14.0 * max(sds))) + 2
    mean = side / 2.0 + np.linspace(0.3, -0.35, d)
    corners = _grid_corners((side,) * d)
    p, first, second = cell_integrals(corners, mean, np.diag(np.square(sds)))
    exact = np.ones(len(corners))
    for axis, sd in enumerate(sds):
        exact *= _phi_cdf((corners[:, axis] + 1.0 - mean[axis]) / sd) - _phi_cdf((corners[:, axis] - mean[axis]) / sd)
    assert np.abs(p - exact).max() < 2e-5
    assert first is not None and second is not None
    assert abs(p.sum() - 1.0) < 1e-5
    assert np.allclose(first.sum(axis=0), mean, atol=1e-4)
    assert np.allclose(second.sum(axis=0), np.diag(np.square(sds)) + np.outer(mean, mean), atol=1e-3)


@pytest.mark.parametrize("cov", [[[4.0, 3.0], [3.0, 4.0]], [[2.0, -1.9], [-1.9, 2.0]], [[0.09, 0.0], [0.0, 0.09]],
                                 [[0.5, 0.4, 0.1], [0.4, 0.5, 0.0], [0.1, 0.0, 0.3]]])
def test_a_correlated_gaussian_integrates_to_a_fine_midpoint_rule(cov: list[list[float]]) -> None:
    """Against a fine midpoint rule on the heaviest cells (its own error far below the tolerance:
    64 points per axis in 2-D, 24 in 3-D) and the exact moments over a grid holding all of the mass.
    In 3-D the node budget per cell caps the subdivisions, hence the looser bound there."""
    c = np.asarray(cov)
    d = len(c)
    tolerance = 2e-5 if d == 2 else 5e-4
    side = int(math.ceil(14.0 * math.sqrt(float(np.diag(c).max())))) + 2
    mean = np.full(d, side / 2.0 - 0.3)
    corners = _grid_corners((side,) * d)
    p, first, second = cell_integrals(corners, mean, c)
    assert first is not None and second is not None
    assert abs(p.sum() - 1.0) < tolerance
    assert np.allclose(first.sum(axis=0), mean, atol=10 * tolerance)
    assert np.allclose(second.sum(axis=0), c + np.outer(mean, mean), atol=100 * tolerance)
    fine = 64 if d == 2 else 24
    offsets = (np.indices((fine,) * d).reshape(d, -1).T + 0.5) / fine
    inv = np.linalg.inv(c)
    norm = 1.0 / math.sqrt((2.0 * math.pi) ** d * np.linalg.det(c))
    for j in np.argsort(-p)[:40]:
        x = corners[j] + offsets - mean
        midpoint = norm * np.exp(-0.5 * np.einsum("ni,ij,nj->n", x, inv, x)).mean()
        assert abs(p[j] - midpoint) < tolerance * max(1.0, 10 * p.max()), (j, p[j], midpoint)


def _expected_counts(shape: tuple[int, ...], masses: list[float], means: list[list[float]],
                     covs: list[list[list[float]]], background: float = 0.0) -> np.ndarray:
    corners = _grid_corners(shape)
    mu = np.full(len(corners), background)
    for m, mean, cov in zip(masses, means, covs, strict=True):
        mu += m * cell_integrals(corners, np.asarray(mean), np.asarray(cov), moments=False)[0]
    return mu.reshape(shape)


def _noisy(mu: np.ndarray, se: float, rng: np.random.Generator) -> np.ndarray:
    """Sampling variance of the true counts plus the oracle's additive error."""
    return mu + rng.normal(0.0, 1.0, mu.shape) * np.sqrt(se**2 + mu)


def _one_cluster_labels(mu: np.ndarray, floor: float) -> np.ndarray:
    return np.where(mu > floor, 0, -1).astype(np.int64)


# Two Gaussians of equal weight and spread whose means lie two standard deviations apart: their
# mixture is unimodal (no valley for a density test), yet each holds half the devices.
_PAIR_MASSES = [40_000.0, 40_000.0]
_PAIR_MEANS = [[12.0, 14.0], [20.0, 18.0]]
_PAIR_COVS = [[[9.0, 3.0], [3.0, 4.0]], [[9.0, 3.0], [3.0, 4.0]]]


def test_two_gaussians_in_one_mode_are_split_into_their_components() -> None:
    shape = (32, 32)
    mu = _expected_counts(shape, _PAIR_MASSES, _PAIR_MEANS, _PAIR_COVS)
    counts = _noisy(mu, 20.0, np.random.default_rng(3))
    labels = _one_cluster_labels(mu, 60.0)
    out = split_gaussian_modes(counts, 20.0, labels)
    assert out.split and out.modes_split == 1 and out.mixture is not None, out.reason
    assert out.mixture.components == 2
    # The components are the two Gaussians: each fitted mean within a tenth of a cell of a true one.
    fitted = out.mixture.means[np.argsort(out.mixture.means[:, 0])]
    assert np.abs(fitted - np.asarray(_PAIR_MEANS)).max() < 0.1, fitted
    # Every cell the density step labelled goes to its most likely true component.
    corners = _grid_corners(shape)
    truth = np.stack([m * cell_integrals(corners, np.asarray(a), np.asarray(c), moments=False)[0]
                      for m, a, c in zip(_PAIR_MASSES, _PAIR_MEANS, _PAIR_COVS, strict=True)], axis=1).argmax(axis=1)
    got = out.labels.ravel()
    kept = labels.ravel() >= 0
    agree = max(np.mean(got[kept] == truth[kept]), np.mean(got[kept] == 1 - truth[kept]))
    assert agree > 0.97, agree


def test_a_significant_split_is_taken_even_where_one_gaussian_fits_within_the_noise() -> None:
    """Two Gaussians 2 cells apart (their spread 1.1 cells) at an error of 10 per cell: one Gaussian per
    mode passes the goodness-of-fit test on this draw, but two components lower chi2 by more than the
    likelihood-ratio gate, so the mode is split (a mode whose one Gaussian fitted used to be left alone)."""
    shape = (16, 16)
    masses, means, covs = [5_000.0, 5_000.0], [[7.0, 8.0], [9.0, 8.0]], [[[1.2, 0.0], [0.0, 2.0]]] * 2
    mu = _expected_counts(shape, masses, means, covs)
    counts = _noisy(mu, 10.0, np.random.default_rng(3))
    labels = _one_cluster_labels(mu, 20.0)
    single = split_gaussian_modes(counts, 10.0, labels, max_components_per_mode=1)
    assert single.reason == "one Gaussian per density mode fits", single.reason
    out = split_gaussian_modes(counts, 10.0, labels)
    assert out.split and out.mixture is not None and out.mixture.components == 2, out.reason
    fitted = out.mixture.means[np.argsort(out.mixture.means[:, 0])]
    assert np.abs(fitted - np.asarray(means)).max() < 0.5, fitted


def test_one_gaussian_per_mode_is_left_alone() -> None:
    shape = (32, 32)
    mu = _expected_counts(shape, [30_000.0, 20_000.0], [[8.0, 9.0], [22.0, 21.0]],
                          [[[4.0, 1.0], [1.0, 3.0]], [[2.0, 0.0], [0.0, 5.0]]])
    labels = np.where(mu > 40.0, np.where(np.indices(shape)[0] < 15, 0, 1), -1)
    out = split_gaussian_modes(_noisy(mu, 20.0, np.random.default_rng(5)), 20.0, labels)
    assert not out.split and out.reason == "one Gaussian per density mode fits"
    assert np.array_equal(out.labels, labels)


@pytest.mark.statistical
def test_the_test_rejects_a_true_model_at_about_its_level() -> None:
    """Under the model (one Gaussian per mode, the errors as assumed) the one-Gaussian-per-mode fit is
    rejected, or a mode split, with probability at most about ``2 MIXTURE_TEST_LEVEL`` (the test at
    the level, and the split gate at level / 2 for each of the two modes; less: the fit absorbs some
    noise). Out of 50 draws at a rate of 0.02, 8 or more have probability below 1e-5 (binomial),
    at both a clear signal (error 10 per cell) and a faint one (40, where the split gate's null
    distribution matters most)."""
    shape = (16, 16)
    mu = _expected_counts(shape, [8_000.0, 5_000.0], [[4.0, 5.0], [11.5, 10.0]],
                          [[[2.0, 0.5], [0.5, 1.5]], [[1.5, 0.0], [0.0, 2.5]]])
    labels = np.where(mu > 20.0, np.where(np.indices(shape)[0] < 8, 0, 1), -1)
    assert MIXTURE_TEST_LEVEL == 0.01
    rng = np.random.default_rng(11)
    for se in (10.0, 40.0):
        rejected = sum(split_gaussian_modes(_noisy(mu, se, rng), se, labels).reason
                       != "one Gaussian per density mode fits" for _ in range(50))
        assert rejected <= 7, (se, rejected)


def _ring_counts(shape: tuple[int, int], n: float, radius: float, width: float) -> np.ndarray:
    corners = _grid_corners(shape)
    offsets = (np.indices((8, 8)).reshape(2, -1).T + 0.5) / 8.0
    centre = np.array(shape) / 2.0
    r = np.linalg.norm(corners[:, None, :] + offsets[None] - centre, axis=2)
    density = np.exp(-0.5 * ((r - radius) / width) ** 2).mean(axis=1)
    return (n * density / density.sum()).reshape(shape)


@pytest.mark.parametrize("se", [30.0, 150.0])
def test_a_ring_keeps_its_density_cluster(se: float) -> None:
    """A ring is no mixture of a few Gaussians: its cells keep their density label, at a signal-to-noise
    where the ring is clear (se 30) and where it is barely resolved (se 150, about 3 per ring cell)."""
    shape = (32, 32)
    mu = _ring_counts(shape, 100_000.0, 11.0, 1.0)
    labels = _one_cluster_labels(mu, 3.0 * se)
    out = split_gaussian_modes(_noisy(mu, se, np.random.default_rng(2)), se, labels)
    assert not out.split, out.reason
    assert np.array_equal(out.labels, labels)


def test_a_uniform_background_is_part_of_the_model() -> None:
    """Blobs over a uniform background: the background term absorbs it, so nothing is split."""
    shape = (32, 32)
    mu = _expected_counts(shape, [20_000.0, 20_000.0], [[9.0, 9.0], [22.0, 23.0]],
                          [[[3.0, 0.0], [0.0, 3.0]], [[3.0, 0.0], [0.0, 3.0]]], background=8.0)
    labels = np.where(mu > 30.0, np.where(np.indices(shape)[0] < 16, 0, 1), -1)
    out = split_gaussian_modes(_noisy(mu, 15.0, np.random.default_rng(4)), 15.0, labels)
    assert not out.split, out.reason
    assert out.mixture is not None and out.mixture.background > 0.0


def test_three_dimensional_modes_are_split_too() -> None:
    shape = (14, 14, 14)
    cov = [[2.0, 0.5, 0.0], [0.5, 1.5, 0.2], [0.0, 0.2, 1.0]]
    mu = _expected_counts(shape, [30_000.0, 30_000.0], [[5.5, 6.0, 7.0], [8.0, 7.5, 7.0]], [cov, cov])
    labels = _one_cluster_labels(mu, 50.0)
    out = split_gaussian_modes(_noisy(mu, 10.0, np.random.default_rng(8)), 10.0, labels)
    assert out.split and out.mixture is not None and out.mixture.components == 2, out.reason


def test_more_dimensions_than_the_limit_are_not_tested() -> None:
    labels = np.zeros((3, 3, 3, 3), dtype=np.int64)
    out = split_gaussian_modes(np.ones((3, 3, 3, 3)), 1.0, labels)
    assert not out.split and "4 dimensions" in out.reason and out.mixture is None


def test_no_cluster_means_nothing_to_test() -> None:
    out = split_gaussian_modes(np.zeros((8, 8)), 1.0, np.full((8, 8), -1))
    assert not out.split and out.reason == "no density cluster to test"


@pytest.mark.parametrize("kwargs,message", [
    ({"labels": np.zeros((4, 5), dtype=np.int64)}, r"labels of shape \(4, 5\) do not match counts of shape \(4, 4\)"),
    ({"std_errors": 0.0}, "standard errors must be positive"),
    ({"std_errors": np.full((4, 4), np.nan)}, "standard errors must be positive"),
    ({"level": 1.0}, r"level must be in \(0, 1\), got 1.0"),
    ({"max_components_per_mode": 0}, "max_components_per_mode must be at least 1, got 0"),
])
def test_bad_input_is_refused_with_a_reason(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"counts": np.ones((4, 4)), "std_errors": 1.0, "labels": np.zeros((4, 4), dtype=np.int64)}
    args.update(kwargs)
    with pytest.raises(InvalidParameterError, match=message):
        split_gaussian_modes(**args)  # type: ignore[arg-type]


def test_parameter_count_and_excess_z() -> None:
    mix = GridMixture(np.ones(2), np.zeros((2, 3)), np.stack([np.eye(3)] * 2), (0, 0), 0.0)
    assert mix.parameter_count(True) == 2 * (1 + 3 + 6) + 1 and mix.dimension == 3 and mix.components == 2
