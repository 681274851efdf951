"""The net-tree math: node children, thresholds, the detection formula, grid positions, the coreset."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ldp_client.encoders.geometry import morton_decode
from ldp_client.errors import InvalidParameterError
from ldp_client.mechanisms import LocalHashingParams
from ldp_collector.estimation.heavy_hitters import bonferroni_z
from ldp_collector.estimation.net_tree import (
    MASS_FRACTION,
    NetTreeLayout,
    center_error_floor,
    children,
    combine_center_estimates,
    coreset_centers,
    detection_sigma,
    grid_node_positions,
    select_nodes,
    shifted_cell_centres,
    signal_to_noise,
)


def test_children_are_the_prefix_extensions_in_parent_order() -> None:
    out = children([0b10, 0b01], 2)
    assert out.tolist() == [0b1000, 0b1001, 0b1010, 0b1011, 0b0100, 0b0101, 0b0110, 0b0111]
    assert all(int(c) >> 2 in (0b10, 0b01) for c in out)


def test_layout_bounds() -> None:
    assert NetTreeLayout(levels=4, child_bits=2).bits(3) == 6
    with pytest.raises(InvalidParameterError):
        NetTreeLayout(levels=8, child_bits=8)  # 64 bits: beyond the oracles' 2^63 domain
    with pytest.raises(InvalidParameterError):
        NetTreeLayout(levels=0, child_bits=2)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("levels", [1, 4, 8])
def test_detection_sigma_matches_the_scaled_local_hashing_standard_error(epsilon: float, levels: int) -> None:
    # A group of n / T devices; its zero-count SE under local hashing with g buckets is
    # sqrt(n_g q (1 - q)) / (p - q), p = e^eps / (e^eps + g - 1), q = 1 / g; scaled by T.
    n = 1_000_000
    params = LocalHashingParams(domain_size=2**20, epsilon=epsilon)
    p, q = params.p, params.q
    exact = math.sqrt(n / levels * q * (1 - q)) / (p - q) * levels
    # The formula assumes the optimal real g = e^eps + 1; the integer g costs at most a few percent.
    assert detection_sigma(n, epsilon, levels) == pytest.approx(exact, rel=0.08)


def test_signal_to_noise_and_floor_formulas() -> None:
    sigma = 2 * math.exp(1.0) * math.sqrt(1e6 * 4) / math.expm1(2.0)
    assert detection_sigma(1e6, 2.0, 4) == pytest.approx(sigma)
    assert signal_to_noise(1e6, 8, 2.0, 4) == pytest.approx(1e6 / 8 / sigma)
    assert center_error_floor(1e6, 8, 81.0) == pytest.approx(8 * math.sqrt(81.0 / 1e6))
    assert center_error_floor(1e6, 8, 81.0, leaves_per_cluster=4) == pytest.approx(2 * 8 * math.sqrt(81.0 / 1e6))
    with pytest.raises(InvalidParameterError):
        detection_sigma(10, 0.0, 1)


def test_select_nodes_threshold_is_the_larger_of_noise_and_mass() -> None:
    counts = np.array([5000.0, 100.0, 40000.0, 3000.0, 2600.0])
    sel = select_nodes(counts, 100.0, n_hat=80000, k=8, alpha=0.05, max_nodes=10)
    z = bonferroni_z(5, 0.05)
    assert sel.z == pytest.approx(z)
    assert sel.noise_threshold == pytest.approx(z * 100.0)
    assert sel.mass_threshold == pytest.approx(80000 / (MASS_FRACTION * 8))
    assert sel.threshold == max(sel.noise_threshold, sel.mass_threshold) == 2500.0
    assert sel.kept.tolist() == [2, 0, 3, 4]  # largest first
    capped = select_nodes(counts, 100.0, n_hat=80000, k=8, alpha=0.05, max_nodes=2)
    assert capped.kept.tolist() == [2, 0] and capped.capped
    noisy = select_nodes(counts, 3000.0, n_hat=80000, k=8, alpha=0.05, max_nodes=10)
    assert noisy.threshold == pytest.approx(z * 3000.0)
    assert noisy.kept.tolist() == [2]


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.data())
def test_grid_positions_invert_the_morton_code(dimension: int, level: int, data: st.DataObject) -> None:
    if dimension * level > 62:
        return
    index = data.draw(st.integers(0, (1 << (dimension * level)) - 1))
    coords = morton_decode(index, dimension, level)
    expected = [(c + 0.5) / (1 << level) for c in coords]
    assert grid_node_positions([index], level, dimension)[0].tolist() == pytest.approx(expected)


def test_coreset_centers_pool_the_sums_of_each_cluster() -> None:
    rng = np.random.default_rng(0)
    means = np.array([[-0.5, -0.5], [0.5, 0.5]])
    # Six leaves, three per cluster, exact sums: the centers are the pooled means.
    weights = np.array([100.0, 300.0, 600.0, 200.0, 200.0, 100.0])
    offsets = np.array([[0.01, 0.0], [0.0, 0.02], [-0.01, 0.0], [0.0, -0.02], [0.02, 0.0], [0.0, 0.01]])
    reps = np.vstack([means[0] + offsets[:3], means[1] + offsets[3:]])
    sums = reps * weights[:, None]
    fit = coreset_centers(sums, weights, 2, rng)
    order = np.argsort(fit.centers[:, 0])
    expected = np.array([sums[:3].sum(0) / weights[:3].sum(), sums[3:].sum(0) / weights[3:].sum()])
    np.testing.assert_allclose(fit.centers[order], expected)
    np.testing.assert_allclose(np.sort(fit.weights), [500.0, 1000.0])
    # Clustering by other positions (the paper-faithful variant) pools by those labels.
    positions = np.array([[0.0], [0.0], [0.0], [1.0], [1.0], [1.0]])
    by_position = coreset_centers(sums, weights, 2, rng, positions=positions)
    np.testing.assert_allclose(np.sort(by_position.weights), [500.0, 1000.0])


def test_coreset_with_fewer_leaves_than_k_publishes_one_center_per_leaf() -> None:
    fit = coreset_centers(np.array([[1.0, 2.0], [3.0, 3.0]]), np.array([2.0, 3.0]), 5, np.random.default_rng(1))
    np.testing.assert_allclose(fit.centers, [[0.5, 1.0], [1.0, 1.0]])
    with pytest.raises(InvalidParameterError):
        coreset_centers(np.zeros((2, 2)), np.array([1.0, 0.0]), 2, np.random.default_rng(1))


@pytest.mark.parametrize(("dimension", "level"), [(2, 3), (3, 5), (4, 6)])
def test_shifted_cell_centres_contain_the_encoded_points(dimension: int, level: int) -> None:
    from ldp_client.encoders.base import NumericDomain
    from ldp_client.encoders.lsh import ShiftedGridEncoder

    encoder = ShiftedGridEncoder(domain=NumericDomain.unit(dimension), level=level, seed=17 + level)
    rng = np.random.default_rng(level)
    points = rng.uniform(0.0, 1.0, size=(300, dimension))
    nodes = np.array([encoder.encode(p) for p in points.tolist()], dtype=np.uint64)
    centres = shifted_cell_centres(nodes, level, encoder.shift, encoder.half_width)
    z = 2.0 * points - 1.0  # the encoder's centred point (no projection)
    half = encoder.cell_side() / 2.0
    assert np.all(np.abs(z - centres) <= half + 1e-12)


def test_combine_center_estimates_weights_by_inverse_mse() -> None:
    a = np.array([[0.0, 0.0], [1.0, 1.0]])
    b = np.array([[1.0, 2.0], [3.0, 3.0]])
    out = combine_center_estimates(a, [1.0, 0.0], b, [3.0, 1.0])
    np.testing.assert_allclose(out[0], 0.75 * a[0] + 0.25 * b[0])
    np.testing.assert_allclose(out[1], a[1])  # an exact estimate wins outright
    with pytest.raises(InvalidParameterError):
        combine_center_estimates(a, [1.0, 1.0], b, [0.0, 1.0])
