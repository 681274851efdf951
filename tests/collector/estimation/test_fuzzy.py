"""Fuzzy c-means, mnFCM and the ablation distances (``ldp_collector.estimation.fuzzy``, DESIGN.md §7.6)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldp_client.errors import InvalidParameterError
from ldp_collector.estimation.fuzzy import (
    DISTANCES,
    FuzzyPass,
    center_step,
    fcm,
    fuzzy_c_means,
    fuzzy_model,
    fuzzy_passes,
    gaussian_loss,
    gaussian_loss_derivative,
    laplace_loss,
    laplace_loss_derivative,
    memberships,
    mixed_loss,
    mixed_loss_derivative,
    mnfcm,
    printed_mixed_loss,
    scaled_distance_factor,
)
from ldp_collector.estimation.kmeans import InMemory, Points, PointStats, plus_plus_starts
from ldp_collector.estimation.report_accumulator import summation_error_bound
from ldp_collector.simulation.scores import adjusted_rand_index

TRUE_CENTERS = np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0], [5.0, 5.0]])


def blobs(n_per: int = 500, scale: float = 0.3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(TRUE_CENTERS)), n_per)
    return TRUE_CENTERS[labels] + rng.normal(scale=scale, size=(len(labels), 2)), labels


def matched_error(found: np.ndarray, truth: np.ndarray) -> float:
    """Largest distance from a true center to its nearest found center."""
    return float(np.sqrt(((truth[:, None, :] - found[None, :, :]) ** 2).sum(axis=2)).min(axis=1).max())


# -- the losses --------------------------------------------------------------------------------------

@pytest.mark.parametrize("d", [1, 2, 3, 10])
def test_mixed_loss_is_continuous_at_one_with_the_corrected_constant(d: int) -> None:
    below = float(mixed_loss(np.nextafter(1.0, 0.0), d))
    at = float(mixed_loss(1.0, d))
    assert at == pytest.approx(1.0 + 2.0 / math.sqrt(d), abs=1e-12)
    assert below == pytest.approx(at, abs=1e-12)
    # Increasing everywhere (a farther point never costs less).
    grid = np.linspace(0.0, 20.0, 20001)
    assert np.all(np.diff(mixed_loss(grid, d)) > 0)


@pytest.mark.parametrize("d", [1, 2, 5])
def test_mixed_loss_derivative_matches_finite_differences(d: int) -> None:
    h = 1e-6
    ell = np.concatenate([np.linspace(0.01, 0.99, 50), np.linspace(1.01, 30.0, 50)])
    numeric = (mixed_loss(ell + h, d) - mixed_loss(ell - h, d)) / (2 * h)
    np.testing.assert_allclose(mixed_loss_derivative(ell, d), numeric, rtol=1e-6, atol=1e-6)
    # One-sided slopes at the break: 2 + 2/sqrt(d) from the left, 4 from the right (equal for d = 1 only).
    left = (mixed_loss(1.0, d) - mixed_loss(1.0 - h, d)) / h
    right = (mixed_loss(1.0 + h, d) - mixed_loss(1.0, d)) / h
    assert float(left) == pytest.approx(2.0 + 2.0 / math.sqrt(d), rel=1e-5)
    assert float(right) == pytest.approx(4.0, rel=1e-5)
    assert float(mixed_loss_derivative(1.0, d)) == pytest.approx(4.0)


@pytest.mark.parametrize("d", [1, 2, 5])
@pytest.mark.parametrize("value,derivative,brk", [(gaussian_loss, gaussian_loss_derivative, lambda d: 1.0),
                                                   (laplace_loss, laplace_loss_derivative, math.sqrt)],
                         ids=["gaussian", "laplace"])
def test_single_noise_losses_are_c1(d: int, value, derivative, brk) -> None:  # type: ignore[no-untyped-def]
    b = brk(d)
    h = 1e-7
    assert float(value(b - h, d)) == pytest.approx(float(value(b, d)), abs=1e-6)
    assert float(derivative(b - h, d)) == pytest.approx(float(derivative(b, d)), abs=1e-6)
    ell = np.concatenate([np.linspace(0.05, 0.95 * b, 20), np.linspace(1.05 * b, 20.0, 20)])
    numeric = (value(ell + 1e-6, d) - value(ell - 1e-6, d)) / 2e-6
    np.testing.assert_allclose(derivative(ell, d), numeric, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("d", [1, 2, 10])
def test_printed_loss_is_discontinuous_negative_control(d: int) -> None:
    """Eq. 11 as printed drops the branch constant: it jumps down by 1 + 2/sqrt(d) at l = 1."""
    jump = float(printed_mixed_loss(np.nextafter(1.0, 0.0), d) - printed_mixed_loss(1.0, d))
    assert jump == pytest.approx(1.0 + 2.0 / math.sqrt(d), abs=1e-9)
    # ... so the same continuity check that passes for the corrected loss fails here.
    assert abs(jump) > 0.5
    ell = np.linspace(0.0, 3.0, 3001)
    assert np.any(np.diff(printed_mixed_loss(ell, d)) < 0)  # not increasing: a farther point costs less


def test_scaled_distance_factor_puts_the_noise_floor_at_one_over_sqrt_d() -> None:
    sigma0, d = 0.37, 4
    factor = scaled_distance_factor(sigma0, d)
    assert sigma0 * factor == pytest.approx(1.0 / math.sqrt(d))
    # Lemma 1's break r = sqrt(d) sigma0 lands on l = 1.
    assert math.sqrt(d) * sigma0 * factor == pytest.approx(1.0)
    with pytest.raises(InvalidParameterError, match="noise_scale"):
        scaled_distance_factor(0.0, 2)


# -- memberships and fits ----------------------------------------------------------------------------

@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("m", [1.5, 2.0, 3.0])
def test_memberships_sum_to_one(distance: str, m: float) -> None:
    x, _ = blobs(50)
    u = memberships(x, TRUE_CENTERS + 0.1, distance=distance, fuzzifier=m, noise_scale=0.5)  # type: ignore[arg-type]
    assert u.shape == (len(x), 4)
    assert np.all(u >= 0)
    np.testing.assert_allclose(u.sum(axis=1), 1.0, atol=1e-12)
    # The largest membership goes to the nearest center.
    nearest = ((x[:, None] - (TRUE_CENTERS + 0.1)[None]) ** 2).sum(axis=2).argmin(axis=1)
    if distance != "absolute":
        np.testing.assert_array_equal(u.argmax(axis=1), nearest)


def test_memberships_follow_the_fcm_formula_and_a_point_on_a_center_belongs_to_it() -> None:
    x = np.array([[1.0, 0.0], [0.0, 0.0]])
    centers = np.array([[0.0, 0.0], [3.0, 0.0]])
    u = memberships(x, centers, fuzzifier=2.0)
    # D = squared distances 1 and 4: u proportional to 1/D.
    np.testing.assert_allclose(u[0], [0.8, 0.2])
    np.testing.assert_allclose(u[1], [1.0, 0.0], atol=1e-200)
    um = memberships(x, centers, distance="mixed", noise_scale=1.0)
    ell = np.array([1.0, 2.0]) * scaled_distance_factor(1.0, 2)
    f = mixed_loss(ell, 2)
    np.testing.assert_allclose(um[0], (1 / f) / (1 / f).sum())


def test_fcm_recovers_well_separated_centers() -> None:
    x, labels = blobs()
    fit = fcm(x, 4, rng=0, n_init=2)
    assert fit.converged
    assert matched_error(fit.centers, TRUE_CENTERS) < 0.05
    assert adjusted_rand_index(labels, fit.labels) == pytest.approx(1.0)
    np.testing.assert_allclose(fit.shares, 0.25, atol=0.02)
    assert fit.shares.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("distance", DISTANCES)
def test_every_distance_recovers_well_separated_centers(distance: str) -> None:
    x, labels = blobs()
    fit = fuzzy_c_means(x, 4, 1, distance=distance, noise_scale=0.3, n_init=2)  # type: ignore[arg-type]
    assert matched_error(fit.centers, TRUE_CENTERS) < 0.1
    assert adjusted_rand_index(labels, fit.labels) > 0.99


def test_mnfcm_resists_laplace_noise_better_than_fcm() -> None:
    """Heavy Laplace noise (std 2.8 against a separation of 5): FCM's centers are pulled outwards,
    mnFCM's log tail keeps them near the blobs.

    Measured (seeds 0, 1, 2): largest center error FCM 0.56, 0.53, 0.53; mnFCM 0.17, 0.23, 0.22. With
    noise scale 1 both are about 0.1 (no difference to claim); at scale 3 FCM 1.24-1.29, mnFCM 0.30-0.42.
    """
    rng = np.random.default_rng(0)
    x, _ = blobs(2000, seed=0)
    noisy = x + rng.laplace(scale=2.0, size=x.shape)
    plain = fcm(noisy, 4, rng=0, n_init=3)
    robust = mnfcm(noisy, 4, rng=0, noise_scale=2.0, n_init=3)
    assert matched_error(robust.centers, TRUE_CENTERS) < 0.35
    assert matched_error(robust.centers, TRUE_CENTERS) < 0.7 * matched_error(plain.centers, TRUE_CENTERS)


@pytest.mark.parametrize("distance", ["euclidean", "gaussian", "laplace", "mixed"])
def test_center_update_is_a_fixed_point_at_convergence(distance: str) -> None:
    rng = np.random.default_rng(7)
    x, _ = blobs(400, seed=7)
    noisy = x + rng.laplace(scale=0.5, size=x.shape)
    fit = fuzzy_c_means(noisy, 4, 8, distance=distance, noise_scale=0.5, tol=1e-20, max_iter=5000)  # type: ignore[arg-type]
    again = center_step(noisy, fit.centers, distance=distance, noise_scale=0.5)  # type: ignore[arg-type]
    assert np.abs(again - fit.centers).max() < 1e-6
    # And it is a stationary point of J for fixed memberships: the weighted gradient vanishes. The
    # linear term of the laplace and mixed losses has a cusp at l = 0 (a center may settle on a data
    # point, as a median does); the weights floor l at 1e-3 (the documented Huber-like smoothing).
    u = memberships(noisy, fit.centers, distance=distance, noise_scale=0.5)  # type: ignore[arg-type]
    factor = scaled_distance_factor(0.5, 2)
    for c in range(4):
        diff = fit.centers[c] - noisy
        if distance == "euclidean":
            w = u[:, c] ** 2
        else:
            ell = np.maximum(np.sqrt((diff**2).sum(axis=1)) * factor, 1e-3)
            deriv = {"gaussian": gaussian_loss_derivative, "laplace": laplace_loss_derivative,
                     "mixed": mixed_loss_derivative}[distance](ell, 2)
            w = u[:, c] ** 2 * deriv / ell
        grad = (w[:, None] * diff).sum(axis=0) / w.sum()
        assert np.abs(grad).max() < 1e-6


def test_fcm_objective_never_increases() -> None:
    rng = np.random.default_rng(11)
    x, _ = blobs(300, seed=11)
    noisy = x + rng.laplace(scale=1.0, size=x.shape)
    start = noisy[:4].copy()
    objectives = [fuzzy_c_means(noisy, 4, distance="euclidean", init=start, max_iter=t, tol=0).objective
                  for t in range(1, 30)]
    assert np.all(np.diff(objectives) <= 1e-9 * abs(objectives[0]))


def test_fits_are_deterministic_given_a_seed() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2000, 3))
    a = mnfcm(x, 5, rng=np.random.default_rng(9), noise_scale=0.3, n_init=2)
    b = mnfcm(x, 5, rng=9, noise_scale=0.3, n_init=2)
    np.testing.assert_array_equal(a.centers, b.centers)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert a.objective == b.objective


def test_bounds_clip_the_centers() -> None:
    rng = np.random.default_rng(2)
    x = rng.laplace(scale=3.0, size=(3000, 2)) + 0.5
    fit = fcm(x, 3, rng=1, bounds=(0.0, 1.0))
    assert np.all((fit.centers >= 0) & (fit.centers <= 1))


def test_invalid_arguments_are_named() -> None:
    x, _ = blobs(10)
    with pytest.raises(InvalidParameterError, match="distance must be one of"):
        fuzzy_c_means(x, 2, 0, distance="cosine")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="fuzzifier must be in"):
        fcm(x, 2, 0, fuzzifier=1.0)
    with pytest.raises(InvalidParameterError, match="needs noise_scale"):
        fuzzy_c_means(x, 2, 0, distance="mixed")
    with pytest.raises(InvalidParameterError, match="k must be an integer"):
        fcm(x, 0, 0)
    with pytest.raises(InvalidParameterError, match="k must be an integer"):
        fcm(x, len(x) + 1, 0)
    with pytest.raises(InvalidParameterError, match="X must be finite"):
        fcm(np.array([[np.nan, 0.0]]), 1, 0)
    with pytest.raises(InvalidParameterError, match="n_init must be 1"):
        fcm(x, 2, 0, init=x[:2], n_init=2)


# -- one pass per iteration ---------------------------------------------------------------------------

def _batches(x: np.ndarray, cuts: list[int]) -> InMemory:
    edges = [0, *cuts, len(x)]
    return InMemory(*(Points(x[a:b]) for a, b in zip(edges, edges[1:])))


@pytest.mark.parametrize("distance", ["euclidean", "mixed", "absolute"])
def test_fuzzy_pass_merged_from_parts_equals_one_pass_within_the_summation_bound(distance: str) -> None:
    rng = np.random.default_rng(6)
    x = TRUE_CENTERS[rng.integers(0, 4, 4000)] + rng.laplace(scale=0.7, size=(4000, 2))
    stats = InMemory(Points(x)).combine(PointStats(2))
    model = fuzzy_model(distance, 2.0, stats, 0.7)  # type: ignore[arg-type]
    centers = np.stack([TRUE_CENTERS + 0.3, TRUE_CENTERS[::-1] - 0.2])
    whole = InMemory(Points(x)).combine(FuzzyPass(centers, model))
    merged = FuzzyPass(centers, model)
    for part in _batches(x, [100, 2000, 2001]).decoded:
        partial = merged.zero()
        partial.add_decoded(part)
        merged.merge(partial)
    assert merged.count == whole.count == len(x)
    for got, want in ((merged.numerator, whole.numerator), (merged.denominator, whole.denominator),
                      (merged.objective, whole.objective), (merged.shares, whole.shares)):
        # Every term is a membership-weighted point or weight (|u| <= 1, |factor| bounded by the loss's floor):
        # the bound of summing the same n terms in two orders, with the terms' own magnitudes.
        bound = summation_error_bound(len(x), float(np.abs(want).max()) * 1e3 + 1.0)
        assert np.abs(got - want).max() <= bound
    assert merged.shares.sum(axis=1) == pytest.approx([len(x)] * 2)


@pytest.mark.parametrize("distance", ["euclidean", "mixed"])
def test_fuzzy_passes_over_batches_follow_the_array_path(distance: str) -> None:
    rng = np.random.default_rng(9)
    x = TRUE_CENTERS[rng.integers(0, 4, 5000)] + rng.laplace(scale=0.8, size=(5000, 2))
    reference = fuzzy_c_means(x, 4, 3, distance=distance, noise_scale=0.8, n_init=3)  # type: ignore[arg-type]
    source = _batches(x, [999, 3000, 4321])
    stats = source.combine(PointStats(2))
    model = fuzzy_model(distance, 2.0, stats, 0.8)  # type: ignore[arg-type]
    run = fuzzy_passes(source, plus_plus_starts(x, 4, 3, 3), stats, model=model, max_iter=300, tol=1e-6)
    assert run.centers == pytest.approx(reference.centers, rel=1e-9, abs=1e-9)
    assert run.objective == pytest.approx(reference.objective, rel=1e-9)
    assert run.shares == pytest.approx(reference.shares, rel=1e-9)
    assert (run.iterations, run.converged) == (reference.iterations, reference.converged)
