"""BITVECTOR campaigns (kCluster, DESIGN.md §7.5): estimator, decoding, k-means, validation, end to end.

Statistical tolerances are 5 standard errors of the estimate (two-sided false-failure rate below
1e-6), with the standard error from the estimator's exact variance. The ARI floors of the
end-to-end runs come from measured runs (values in comments).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from ldp.v1 import campaigns_pb2, encoders_pb2
from ldp_client.encoders.base import NumericDomain
from ldp_client.encoders.bitvector import BitVectorEncoder
from ldp_client.mechanisms.bitwise_randomized_response import BitwiseRRParams
from ldp_client.payload import pack_bits
from ldp_client.rng import SeededRng
from ldp_collector.campaigns import make_engine, prepare_campaign
from ldp_collector.core import Collector
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.estimation import bitvector as bitvector_estimation
from ldp_collector.estimation.bitvector import (
    BitVectorPass,
    _Bits,
    array_passes,
    dbscan_encoded,
    dbscan_on_round,
    debias_bits,
    decode_centers,
    expected_pattern,
    kmeans_encoded,
    moved_within_noise,
    pairwise_sq_distances,
    public_pivots,
    refine_on_round,
    report_center_sq_distances,
    unpack_bit_payloads,
)
from ldp_collector.estimation.report_accumulator import summation_error_bound
from ldp_collector.kinds import bitvector as bitvector_engine
from ldp_collector.kinds.bitvector import HALF_WIDTH_FACTOR
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.evaluation import evaluate_clustering
from ldp_collector.simulation.population import numeric_bounds
from ldp_collector.simulation.runner import run_campaign
from ldp_collector.storage import open_store

Z = 5.0  # |error| <= 5 SE: P(false fail) < 6e-7 per check


def bv_config(lower: Any = (0.0, 0.0), upper: Any = (1.0, 1.0), *, epsilon: float = 4.0, k: int = 4,
              campaign_id: str = "", **params: Any) -> campaigns_pb2.CampaignConfig:
    config = campaigns_pb2.CampaignConfig(
        campaign_id=campaign_id, kind=campaigns_pb2.BITVECTOR, epsilon=epsilon,
        domain=campaigns_pb2.Domain(numeric=encoders_pb2.NumericDomain(lower=list(lower), upper=list(upper))))
    config.bitvector.k = k
    for key, value in params.items():
        setattr(config.bitvector, key, value)
    return config


def flip(bits: np.ndarray, params: BitwiseRRParams, rng: np.random.Generator) -> np.ndarray:
    """Simulated bitwise RR on many reports at once (the SDK's exact coins are tested client-side)."""
    return (bits ^ (rng.random(bits.shape) < params.p_flip)).astype(np.uint8)


# -- unpacking and debiasing ---------------------------------------------------------------------

def test_unpack_matches_the_sdk_packing() -> None:
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2, size=(50, 21)).astype(np.uint8)
    payloads = [pack_bits(row.tolist()) for row in bits]
    np.testing.assert_array_equal(unpack_bit_payloads(payloads, 21), bits)
    assert unpack_bit_payloads([], 21).shape == (0, 21)


def test_unpack_reads_the_mechanism_output() -> None:
    params = BitwiseRRParams(length=13, epsilon=2.0, sensitivity=4)
    rng = SeededRng(3)
    value = (1, 0) * 6 + (1,)
    payloads = [params.randomize(value, rng=rng) for _ in range(4000)]
    y = unpack_bit_payloads(payloads, 13)
    b_hat = debias_bits(y, params.p_flip, params.p_keep).mean(axis=0)
    se = np.sqrt(params.bit_variance / len(payloads))
    assert np.all(np.abs(b_hat - np.array(value)) <= Z * se)


# -- the unbiased distance estimators ------------------------------------------------------------

def _term_moments(a: np.ndarray, b: np.ndarray, params: BitwiseRRParams, shift: float) -> tuple[float, float]:
    """Exact mean and variance of sum_l (b_hat_l - c_l)^2 - shift for one report, b_l - c_l = a_l.

    Each bit's debiased value takes two values: enumerate them with their probabilities.
    """
    p, q, scale = params.p_keep, params.p_flip, params.debias_scale
    mean = var = 0.0
    for al, bl in zip(a, b):
        outcomes = [((y - q) * scale - bl, (p if y == bl else q)) for y in (0, 1)]  # noise e, probability
        values = [((al + e) ** 2, w) for e, w in outcomes]
        m = sum(v * w for v, w in values)
        mean += m
        var += sum((v - m) ** 2 * w for v, w in values)
    return mean - shift, var


def test_report_center_distance_is_unbiased() -> None:
    params = BitwiseRRParams(length=24, epsilon=2.0, sensitivity=8)
    rng = np.random.default_rng(7)
    b = rng.integers(0, 2, size=24).astype(np.uint8)
    center = rng.uniform(-0.2, 1.2, size=24)
    truth = float(((b - center) ** 2).sum())
    shift = 24 * params.bit_variance
    exact_mean, var = _term_moments(b - center, b.astype(float), params, shift)
    assert exact_mean == pytest.approx(truth, rel=1e-9, abs=1e-9)  # unbiased by construction
    reps = 40_000
    y = flip(np.tile(b, (reps, 1)), params, rng)
    d2 = report_center_sq_distances(debias_bits(y, params.p_flip, params.p_keep), center[None, :], params.bit_variance)
    se = np.sqrt(var / reps)
    assert abs(d2.mean() - truth) <= Z * se
    # Negative control: the plain distance on noisy bits is off by B V, far beyond the tolerance.
    plain = d2.mean() + shift
    assert abs(plain - truth) > 100 * se


def test_pairwise_distance_is_unbiased_and_zero_on_the_diagonal() -> None:
    params = BitwiseRRParams(length=16, epsilon=4.0, sensitivity=8)
    rng = np.random.default_rng(11)
    b1 = rng.integers(0, 2, size=16).astype(np.uint8)
    b2 = rng.integers(0, 2, size=16).astype(np.uint8)
    hamming = int((b1 != b2).sum())
    reps = 20_000
    y1 = debias_bits(flip(np.tile(b1, (reps, 1)), params, rng), params.p_flip, params.p_keep)
    y2 = debias_bits(flip(np.tile(b2, (reps, 1)), params, rng), params.p_flip, params.p_keep)
    est = np.array([pairwise_sq_distances(np.stack([u, v]), params.bit_variance)[0, 1] for u, v in
                    zip(y1[:2000], y2[:2000])])
    # Vectorized twin of the same estimator for the full sample.
    full = ((y1 - y2) ** 2).sum(axis=1) - 2 * 16 * params.bit_variance
    np.testing.assert_allclose(est, full[:2000], rtol=1e-9, atol=1e-9)
    se = full.std(ddof=1) / np.sqrt(reps)
    assert abs(full.mean() - hamming) <= Z * se
    assert np.all(np.diag(pairwise_sq_distances(y1[:5], params.bit_variance)) == 0)


def test_own_cluster_correction_is_unbiased() -> None:
    """Distance from a report to the mean of a set it belongs to: the diagonal term is B V (1 - 1/m)."""
    params = BitwiseRRParams(length=10, epsilon=2.0, sensitivity=4)
    rng = np.random.default_rng(5)
    members = rng.integers(0, 2, size=(6, 10)).astype(np.uint8)
    mu = members.mean(axis=0)
    truth = float(((members[0] - mu) ** 2).sum())
    reps = 40_000
    y = flip(np.tile(members, (reps, 1, 1)), params, rng)
    b_hat = debias_bits(y, params.p_flip, params.p_keep)
    centers = b_hat.mean(axis=1)  # (reps, B)
    x0 = b_hat[:, 0, :]
    est = np.array([report_center_sq_distances(x0[i:i + 1], centers[i:i + 1], params.bit_variance,
                                               sizes=[6], labels=[0])[0, 0] for i in range(0, reps, 20)])
    vec = ((x0 - centers) ** 2).sum(axis=1) - 10 * params.bit_variance * (1 - 1 / 6)
    np.testing.assert_allclose(est, vec[::20], rtol=1e-9, atol=1e-9)
    se = vec.std(ddof=1) / np.sqrt(reps)
    assert abs(vec.mean() - truth) <= Z * se
    # Negative control: the fixed-center correction (B V) is off by 2 B V / m.
    assert abs(vec.mean() - 2 * 10 * params.bit_variance / 6 - truth) > Z * se


# -- decoding ----------------------------------------------------------------------------------

def test_layout_encode_matches_the_sdk_encoder() -> None:
    layout = public_pivots((-1.0, 0.0), (3.0, 10.0), 7, HALF_WIDTH_FACTOR)
    encoder = BitVectorEncoder(domain=NumericDomain(lower=(-1.0, 0.0), upper=(3.0, 10.0)),
                               pivots=tuple(p for ps in layout.pivots for p in ps), pivots_per_attribute=(7, 7),
                               half_widths=layout.half_widths)
    points = np.random.default_rng(2).uniform((-2, -1), (4, 11), size=(300, 2))
    expected = np.array([encoder.encode(tuple(p)) for p in points.tolist()])
    np.testing.assert_array_equal(layout.encode(points), expected)
    assert encoder.max_hamming_distance == 8  # 4 per attribute with the 63/64 half-width


@pytest.mark.parametrize("z0", [0.0, 0.37, 1.234, 2.5, 2.999, 3.0])
def test_decoding_recovers_a_point_from_its_exact_bits(z0: float) -> None:
    layout = public_pivots((0.0, -5.0), (3.0, 5.0), 8, HALF_WIDTH_FACTOR)
    point = np.array([z0, -5.0 + 10 * z0 / 3])
    bits = layout.encode(point[None, :]).astype(float)
    decoded = decode_centers(bits, layout)[0]
    # The decoded point has exactly the same bits, and lies within half a pivot spacing.
    np.testing.assert_array_equal(layout.encode(decoded[None, :]), bits.astype(np.uint8))
    steps = np.array([3.0 / 8, 10.0 / 8])
    assert np.all(np.abs(decoded - point) <= 0.5 * steps + 1e-12)


def test_decoding_recovers_the_center_of_a_spread_cluster() -> None:
    layout = public_pivots((0.0,), (10.0,), 10, HALF_WIDTH_FACTOR)
    rng = np.random.default_rng(3)
    members = rng.uniform(3.3, 5.7, size=(200_000, 1))  # center 4.5, spread 1.2 spacings
    frequencies = layout.encode(members).mean(axis=0)
    decoded = decode_centers(frequencies[None, :], layout)[0, 0]
    assert decoded == pytest.approx(4.5, abs=0.1)
    # The model pattern reproduces uniform members' frequencies.
    model = expected_pattern([4.5], 1.2, layout.pivots[0], layout.half_widths[0])[0]
    np.testing.assert_allclose(model, frequencies, atol=0.01)


# -- k-means in the encoded space ----------------------------------------------------------------

def test_kmeans_in_encoded_space_finds_separated_blobs() -> None:
    rng = np.random.default_rng(4)
    true_centers = np.array([[1.0, 1.0], [8.0, 2.0], [5.0, 8.5]])
    labels = rng.integers(0, 3, size=30_000)
    x = true_centers[labels] + rng.normal(0, 0.4, size=(30_000, 2))
    layout = public_pivots((0.0, 0.0), (10.0, 10.0), 8, HALF_WIDTH_FACTOR)
    params = BitwiseRRParams(length=layout.bits, epsilon=4.0, sensitivity=8)
    y = flip(layout.encode(x), params, rng)
    fit = kmeans_encoded(y, 3, p_flip=params.p_flip, p_keep=params.p_keep, rng=0)
    centers = decode_centers(fit.centers, layout)
    # Every true center has a decoded center within one pivot spacing (1.25).
    gaps = np.linalg.norm(true_centers[:, None, :] - centers[None, :, :], axis=2).min(axis=1)
    assert np.all(gaps < 1.25), centers
    assert sorted(np.round(fit.sizes / len(x), 1)) == pytest.approx([0.3, 0.3, 0.3], abs=0.1)


#: kmeans_encoded on the fixed input of the next test: per ``refine``, the iterations, the sizes,
#: the decoded centers and each center's sum of bit frequencies. ``refine=False`` (Lloyd) gives what
#: it gave before the float blocks were cached and each EM step's distances reused (a pure
#: speed-up). ``refine=True`` pins the EM refinement that stops when every mean moved by less than
#: REFINE_STOP of its standard error (63 iterations in all); the former rule (a change of the mean
#: log-likelihood below 1e-7) ran 339, to sizes 836/894/873/897 and decoded centers (5.62, 8.14),
#: (2.79, 6.50), (8.90, 3.13), (1.35, 0.71) for true means (5, 8.5), (2, 7), (8, 2), (1, 1).
KMEANS_BEFORE_THE_SPEED_UP = {
    True: (63, [803, 806, 952, 939],
           [[4.404296875, 8.06640625], [2.36328125, 6.30859375], [8.4765625, 3.125], [1.005859375, 0.673828125]],
           [4.511416992107004, 5.441354868932396, 1.6410767684784697, 4.2636430600078965]),
    False: (39, [835, 699, 1037, 929],
            [[4.375, 4.55078125], [0.673828125, 5.33203125], [9.98046875, 5.0], [0.615234375, 4.23828125]],
            [4.491187755243327, 9.528392121408956, -1.5113948440868126, 4.416427247188675]),
}


@pytest.mark.parametrize("cache", [True, False], ids=["cached-blocks", "blocks-per-pass"])
@pytest.mark.parametrize("refine", [True, False])
def test_kmeans_gives_the_result_it_gave_before_the_speed_up(refine: bool, cache: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Same input, same seed: the same iterations, sizes and decoded centers as pinned (before the speed-up for Lloyd).

    Chunks of 1000 rows make the 3500 reports span four chunks; the float blocks are either cached
    or converted on every pass. The centers' sums allow for a different BLAS (1e-9 relative).
    """
    monkeypatch.setattr(bitvector_estimation, "_CHUNK", 1000)
    if not cache:
        monkeypatch.setattr(bitvector_estimation, "_FLOAT_CACHE_BYTES", 0)
    rng = np.random.default_rng(18)
    true_centers = np.array([[1.0, 1.0], [8.0, 2.0], [5.0, 8.5], [2.0, 7.0]])
    x = true_centers[rng.integers(0, 4, size=3500)] + rng.normal(0, 0.8, size=(3500, 2))
    layout = public_pivots((0.0, 0.0), (10.0, 10.0), 8, HALF_WIDTH_FACTOR)
    params = BitwiseRRParams(length=layout.bits, epsilon=3.0, sensitivity=8)
    y = flip(layout.encode(x), params, rng)
    fit = kmeans_encoded(y, 4, p_flip=params.p_flip, p_keep=params.p_keep, rng=5, refine=refine)
    iterations, sizes, centers, sums = KMEANS_BEFORE_THE_SPEED_UP[refine]
    assert fit.iterations == iterations
    assert fit.sizes.tolist() == sizes and np.bincount(fit.labels, minlength=4).tolist() == sizes
    assert decode_centers(fit.centers, layout).tolist() == centers
    np.testing.assert_allclose(fit.centers.sum(axis=1), sums, rtol=1e-9)


def _noisy_mixture(n: int, seed: int, epsilon: float = 3.0) -> tuple[np.ndarray, BitwiseRRParams, Any]:
    rng = np.random.default_rng(seed)
    true_centers = np.array([[1.0, 1.0], [8.0, 2.0], [5.0, 8.5], [2.0, 7.0]])
    x = true_centers[rng.integers(0, 4, size=n)] + rng.normal(0, 0.8, size=(n, 2))
    layout = public_pivots((0.0, 0.0), (10.0, 10.0), 8, HALF_WIDTH_FACTOR)
    params = BitwiseRRParams(length=layout.bits, epsilon=epsilon, sensitivity=8)
    return flip(layout.encode(x), params, rng), params, layout


def test_an_em_pass_is_an_iteration_of_the_in_memory_refinement() -> None:
    """A soft pass's M-step (from the pass's sums alone) equals one EM iteration over the array in memory."""
    y, params, _ = _noisy_mixture(5000, 21)
    rng = np.random.default_rng(2)
    centers = rng.uniform(0.0, 1.0, size=(4, params.length))
    bits = bitvector_estimation._Bits(y)
    scale = params.debias_scale
    expected, _ = bitvector_estimation._soft_refine(bits, centers, params.p_flip, scale, params.bit_variance, 1, 0.0)
    # The in-memory refinement starts with equal weights and the noise variance.
    pass_ = BitVectorPass(centers, p_flip=params.p_flip, p_keep=params.p_keep, weights=np.full(4, 0.25),
                          variance=params.bit_variance)
    pass_.add_decoded(y)
    got = pass_.finalize().mixture()
    np.testing.assert_allclose(got.centers, expected.centers, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got.weights, expected.weights, rtol=1e-9)
    # The in-memory variance comes from distances with float32 products (relative error ~1e-7 of the
    # terms); the pass's from float64 sums of the same statistics.
    assert got.variance == pytest.approx(expected.variance, rel=1e-6)
    assert got.loglik == pytest.approx(expected.loglik, rel=1e-9)
    # The hard counts and the cost: the nearest center by the unbiased distance for fixed centers,
    # in the same arithmetic as the in-memory assignment (float32 products: equal, ties included).
    labels, dist = bitvector_estimation._assign(bits, centers, None, None, params.p_flip, scale, params.bit_variance)
    sums = pass_.finalize()
    assert sums.counts.tolist() == np.bincount(labels, minlength=4).tolist()
    assert sums.cost == pytest.approx(float(dist.sum()), rel=1e-9)
    assert sums.reports == len(y)
    d2 = report_center_sq_distances(debias_bits(y, params.p_flip, params.p_keep), centers, params.bit_variance)
    assert sums.cost == pytest.approx(float(d2.min(axis=1).sum()), rel=1e-6)


@pytest.mark.parametrize("soft", [True, False])
def test_passes_merge_to_the_whole(soft: bool) -> None:
    """Two halves added to zero() copies and merged give the whole pass: equal counts, sums within the order bound."""
    y, params, _ = _noisy_mixture(3000, 22)
    centers = debias_bits(y[:3], params.p_flip, params.p_keep)
    mixture = {"weights": [0.2, 0.3, 0.5], "variance": 2.0 * params.bit_variance} if soft else {}
    whole = BitVectorPass(centers, p_flip=params.p_flip, p_keep=params.p_keep, **mixture)
    whole.add_decoded(y)
    left, right = whole.zero(), whole.zero()
    left.add_decoded(y[1700:])
    right.add_decoded(y[:1700])
    left.merge(right)
    a, b = whole.finalize(), left.finalize()
    assert a.counts.tolist() == b.counts.tolist() and a.reports == b.reports == 3000
    # Non-negative terms: two orders differ by at most 2 (n - 1) u times the sum.
    for x, z in ((a.sums, b.sums), (a.totals, b.totals), (a.sq_norms, b.sq_norms)):
        assert np.all(np.abs(x - z) <= summation_error_bound(3000, 1.0) * np.abs(x) + 1e-12)
    # State: (2 B + 4) k + 3 floats, whatever the number of reports.
    assert whole.nbytes == left.nbytes == 8 * ((2 * params.length + 4) * 3 + 3)


def test_em_over_the_round_stops_at_once_from_its_own_fit() -> None:
    """Started at the in-memory fit of the same reports, the round's EM stops after one pass, with the same sizes."""
    y, params, _ = _noisy_mixture(6000, 23)
    start = kmeans_encoded(y, 4, p_flip=params.p_flip, p_keep=params.p_keep, rng=1)
    assert start.mixture is not None
    fit, converged = refine_on_round(start.mixture, array_passes(y), p_flip=params.p_flip, p_keep=params.p_keep)
    assert converged and fit.iterations == 1 and fit.labels is None
    np.testing.assert_array_equal(fit.centers, start.centers)
    assert fit.sizes.tolist() == start.sizes.tolist()
    assert fit.cost == pytest.approx(start.cost, rel=1e-9)
    # Negative control: a start one standard error off moves by more than the rule allows.
    se = np.sqrt(params.length * start.mixture.variance / start.sizes.max())
    shifted = replace(start.mixture, centers=start.mixture.centers + se)
    fit, converged = refine_on_round(shifted, array_passes(y), p_flip=params.p_flip, p_keep=params.p_keep,
                                     max_passes=1)
    assert not converged and fit.iterations == 1


def test_moved_within_noise_compares_with_each_centers_standard_error() -> None:
    previous = np.zeros((2, 4))
    # Standard errors sqrt(4 * 1 / m): 0.2 (m = 100) and 0.02 (m = 10000).
    moved = np.array([[0.019, 0, 0, 0], [0.0019, 0, 0, 0]])
    assert moved_within_noise(previous, moved, [100, 10_000], 1.0, 0.1)
    assert not moved_within_noise(previous, moved * 1.1, [100, 10_000], 1.0, 0.1)
    assert not moved_within_noise(previous, moved, [100, 10_000], 1.0, 0.09)


def test_dbscan_cost_from_the_pass_sums_is_the_per_report_cost() -> None:
    """The round's DBSCAN cost from the pass's sums equals the per-report own-cluster-corrected distances."""
    y, params, _ = _noisy_mixture(4000, 24, epsilon=8.0)
    b_hat = debias_bits(y, params.p_flip, params.p_keep)
    cores = b_hat[:300].reshape(3, 100, -1).mean(axis=1)
    fit = dbscan_on_round(cores, array_passes(y), width=params.length, p_flip=params.p_flip, p_keep=params.p_keep)
    # The nearest core centroid in the in-memory assignment's arithmetic (float32 products).
    labels, _ = bitvector_estimation._assign(bitvector_estimation._Bits(y), cores, None, None, params.p_flip,
                                             params.debias_scale, params.bit_variance)
    sizes = np.bincount(labels, minlength=3)
    centers = np.stack([b_hat[labels == c].mean(axis=0) for c in range(3)])
    d2 = report_center_sq_distances(b_hat, centers, params.bit_variance, sizes=sizes, labels=labels)
    assert fit.sizes.tolist() == sizes.tolist()
    np.testing.assert_allclose(fit.centers, centers, rtol=1e-9, atol=1e-9)
    assert fit.cost == pytest.approx(float(d2[np.arange(len(y)), labels].sum()), rel=1e-9)


def test_dbscan_in_encoded_space_finds_separated_blobs_from_exact_bits() -> None:
    """The O(m^2) DBSCAN on a subsample, then assignment of the rest (noise-free: p_flip = 0)."""
    rng = np.random.default_rng(4)
    true_centers = np.array([[1.0, 1.0], [8.0, 2.0], [5.0, 8.5]])
    x = true_centers[rng.integers(0, 3, size=12_000)] + rng.normal(0, 0.4, size=(12_000, 2))
    layout = public_pivots((0.0, 0.0), (10.0, 10.0), 8, HALF_WIDTH_FACTOR)
    fit = dbscan_encoded(layout.encode(x), 3, p_flip=0.0, p_keep=1.0, rng=0, sample=3000)
    assert len(fit.centers) == 3 and fit.sizes.sum() == len(x)
    centers = decode_centers(fit.centers, layout)
    gaps = np.linalg.norm(true_centers[:, None, :] - centers[None, :, :], axis=2).min(axis=1)
    assert np.all(gaps < 1.25), centers


# -- validation ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("config", "message"), [
    (bv_config(k=1), "bitvector.k must be in [2, 256], got 1"),
    (bv_config(k=257), "bitvector.k must be in [2, 256], got 257"),
    (bv_config(k=0), "bitvector.k"),
    (bv_config(pivots_per_attribute=1), "bitvector.pivots_per_attribute must be in [2, 64]"),
    (bv_config(pivots_per_attribute=65), "bitvector.pivots_per_attribute must be in [2, 64]"),
    (bv_config(lower=(0.0,) * 100, upper=(1.0,) * 100, pivots_per_attribute=41),
     "bitvector.pivots_per_attribute must be in [2, 40]"),
    (bv_config(epsilon=20.5), "epsilon must be in (0, 20]"),
    (bv_config(algorithm=7), "bitvector.algorithm 7"),
])
def test_validation_names_the_field(config: campaigns_pb2.CampaignConfig, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        make_engine(config_from_proto(config))
    assert message in str(info.value)


def test_categorical_domain_is_rejected() -> None:
    config = campaigns_pb2.CampaignConfig(kind=campaigns_pb2.BITVECTOR, epsilon=1.0,
                                          domain=campaigns_pb2.Domain(categorical_size=10))
    config.bitvector.k = 3
    with pytest.raises(InvalidArgumentError, match="numeric domain"):
        make_engine(config_from_proto(config))


def test_defaults_and_round_spec() -> None:
    prepared = prepare_campaign(config_from_proto(bv_config(lower=(0.0, -1.0, 2.0), upper=(1.0, 1.0, 3.0), epsilon=3.0)))
    params = prepared.config.parameters
    assert params.pivots_per_attribute == bitvector_engine.DEFAULT_PIVOTS_PER_ATTRIBUTE
    assert params.algorithm == campaigns_pb2.BitVectorParameters.KMEANS
    spec = prepared.engine.first_round().spec
    component = spec.tasks[0].components[0]
    encoder, mechanism = component.encoder, component.mechanism
    assert isinstance(encoder, BitVectorEncoder) and isinstance(mechanism, BitwiseRRParams)
    assert mechanism.sensitivity == encoder.max_hamming_distance == 4 * 3
    assert mechanism.epsilon == 3.0 and spec.campaign_epsilon == 3.0 and spec.max_reports_per_device == 1
    t = params.pivots_per_attribute
    assert encoder.pivots[:t] == pytest.approx([(i + 0.5) / t for i in range(t)])
    assert encoder.half_widths[1] == pytest.approx(2.0 / t * HALF_WIDTH_FACTOR)


# -- end to end ------------------------------------------------------------------------------------

def _run(config: campaigns_pb2.CampaignConfig, x: np.ndarray, seed: int) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(tmp)
        try:
            return run_campaign(Collector(store), config_from_proto(config), x, seed=seed, mode="direct", quiet=True)
        finally:
            store.close()


# Measured (n = 20000, mixture d = 2, k = 4, default 8 pivots; dataset seeds 1-3 x population seeds 2, 5):
# epsilon 4: ARI 1.0, 1.0, 0.979, 0.975, 0.967, 0.969 (cost ratio 1.04-1.20);
# epsilon 2: ARI 0.998, 0.999, 0.982, 0.713, 0.641, 0.749 (cost ratio 1.35-8.2).
# The test runs dataset seed 1, population seed 2 (ARI 1.0 and 0.998); the floors sit below the
# smallest measured value over the seeds, so they catch a broken estimator, not seed luck.
ARI_FLOORS = {4.0: 0.9, 2.0: 0.55}


@pytest.mark.parametrize("epsilon", sorted(ARI_FLOORS))
def test_end_to_end_mixture(epsilon: float) -> None:
    x, labels = make_dataset("mixture", 20_000, d=2, k=4, seed=1)
    lower, upper = numeric_bounds(x)
    run = _run(bv_config(lower, upper, epsilon=epsilon, campaign_id=f"bv-e2e-{epsilon:g}"), x, seed=2)
    result = run.result
    assert result.state == campaigns_pb2.FINISHED
    assert result.clustering.k == 4 and result.clustering.dimension == 2
    assert len(result.clustering.centers) == 8
    assert sum(result.clustering.weights) == pytest.approx(1.0)
    assert result.diagnostics["hamming_sensitivity"] == 8
    assert result.diagnostics["bits_per_report"] == 2 * bitvector_engine.DEFAULT_PIVOTS_PER_ATTRIBUTE
    assert result.diagnostics["flip_probability"] == pytest.approx(1 / (1 + np.exp(epsilon / 8)), rel=1e-9)
    assert run.stats.epsilon_per_device == epsilon  # exactly epsilon, one report each
    assert run.stats.mean_epsilon_per_device == epsilon
    assert run.stats.accepted == len(x) and run.stats.rejected == 0
    scores = evaluate_clustering(result, x, labels, k=4)
    assert scores["ari"] >= ARI_FLOORS[epsilon], scores


def test_the_reports_hamming_weights_are_counted_once_and_exactly() -> None:
    """Every distance pass reads the weights: counted once, equal to the bits' row sums."""
    bits = (np.random.default_rng(2).random((40_000, 70)) < 0.4).astype(np.uint8)
    cached = _Bits(bits)
    assert np.array_equal(cached.weights, bits.sum(axis=1).astype(np.float64))
    assert cached.weights is cached.weights


def test_fewer_clusters_than_k_is_a_warning() -> None:
    """DBSCAN over noisy bits merges the mixture (its docstring's measurement); the result says so."""
    x, _ = make_dataset("mixture", 3000, d=2, k=4, seed=1)
    lower, upper = numeric_bounds(x)
    run = _run(bv_config(lower, upper, epsilon=2.0, campaign_id="bv-dbscan",
                         algorithm=campaigns_pb2.BitVectorParameters.DBSCAN), x, seed=2)
    assert run.result.clustering.k < 4
    assert [w for w in run.result.warnings if w.startswith(f"only {run.result.clustering.k} clusters found for k = 4: "
                                                            "DBSCAN's core links")]
