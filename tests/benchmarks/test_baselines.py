"""The harness's baselines: mechanics, budgets, the no-noise bypass, and each paper's qualitative claim
on small instances of the paper's own kind of data (medians over a few seeds, fixed seeds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from harness.baselines import (
    Box,
    Clustering,
    dbscan_baseline,
    density_am_kmeans,
    discrete_laplace_kmeans,
    dp_quadtree_kmeans,
    dplloyd,
    improved_dp_kmeans,
    kmeans_plus_plus_baseline,
    oue_grid_kmeans,
    standard_kmeans,
)
from harness.baselines.dp_quadtree_kmeans import build_dp_quadtree, paper_parameters
from harness.baselines.dplloyd import budget_schedule, noisy_lloyd_step
from harness.baselines.improved_dp_kmeans import am_criterion, density_am_init, point_density
from harness.baselines.laplace_points import discrete_laplace_points
from harness.baselines.oue_grid import MAX_CELLS, cell_centers, grid_cells_per_dimension

from ldp_client.encoders.base import NumericDomain
from ldp_client.encoders.grid import UniformGridEncoder
from ldp_client.mechanisms import DiscreteLaplaceParams
from ldp_collector.estimation.kmeans import assign, lloyd
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.scores import cost_per_point, f_measure, kmeans_cost, reference_kmeans_cost

SEEDS = (0, 1, 2)


def blobs(n: int = 3000, seed: int = 0, k: int = 4) -> tuple[np.ndarray, np.ndarray]:
    x, y = make_dataset("blobs", n, d=2, k=k, seed=seed)
    return x, y


def s_like(n: int = 3000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """papers/003's S-sets kind: 15 equal 2-D Gaussian clusters (Google's generator, ratio 10)."""
    x, y = make_dataset("google", n, d=2, k=15, seed=seed, ratio=10.0)
    return x, y


def unbalance_like(n: int = 3000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    x, y = make_dataset("mixture", n, d=2, k=8, seed=seed, imbalance=20.0, separation=3.0)
    return x, y


# -- shared pieces ------------------------------------------------------------------------------------

def test_box_maps_to_the_unit_cube_and_back() -> None:
    x, _ = blobs(200)
    box = Box.of(x)
    unit = box.to_unit(x)
    assert unit.min() == 0.0 and unit.max() == 1.0
    np.testing.assert_allclose(box.from_unit(unit), x, atol=1e-9)
    flat = Box.of(np.zeros((5, 2)))
    assert (flat.width == 1.0).all()


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_epsilon_is_checked(bad: float) -> None:
    x, _ = blobs(200)
    with pytest.raises(ValueError, match="epsilon must be in"):
        dplloyd(x, 4, bad, seed=0)


def test_clustering_needs_centers_or_labels() -> None:
    with pytest.raises(ValueError):
        Clustering(centers=None, labels=None)


# -- non-private ----------------------------------------------------------------------------------------

def test_kmeans_plus_plus_matches_the_reference() -> None:
    x, _ = blobs()
    out = kmeans_plus_plus_baseline(x, 4, seed=1)
    assert out.centers is not None
    assert kmeans_cost(x, out.centers) <= 1.001 * reference_kmeans_cost(x, 4, 0)


def test_standard_kmeans_starts_from_data_points_and_converges() -> None:
    x, _ = blobs()
    out = standard_kmeans(x, 4, seed=3)
    assert out.centers is not None and out.centers.shape == (4, 2)
    assert out.diagnostics["iterations"] >= 1


def test_dbscan_separates_the_moons_kmeans_cannot() -> None:
    x, y = make_dataset("moons", 2000, seed=0)
    out = dbscan_baseline(x, seed=0)
    assert out.centers is None and out.labels is not None
    assert f_measure(y, out.labels) > 0.95
    km = kmeans_plus_plus_baseline(x, 2, seed=0)
    assert f_measure(y, assign(x, km.centers)[0]) < 0.9


def test_dbscan_subsample_labels_every_point() -> None:
    x, y = blobs(3000)
    out = dbscan_baseline(x, seed=0, sample=1000)
    assert out.labels is not None and out.labels.shape == (3000,)
    assert out.diagnostics["fit_points"] == 1000
    assert f_measure(y, out.labels) > 0.9


# -- DPLloyd --------------------------------------------------------------------------------------------

def test_budget_schedules_never_exceed_epsilon() -> None:
    assert budget_schedule(1.0, 4) == [0.25] * 4
    halving = budget_schedule(1.0, 5, "halving")
    assert halving[0] == 0.5 and math.fsum(halving) < 1.0
    with pytest.raises(ValueError):
        budget_schedule(1.0, 0)
    with pytest.raises(ValueError):
        budget_schedule(1.0, 3, "nope")  # type: ignore[arg-type]


def test_noiseless_lloyd_step_is_the_mean_update() -> None:
    rng = np.random.default_rng(0)
    unit = rng.uniform(size=(500, 2))
    centers = np.array([[0.25, 0.5], [0.75, 0.5]])
    moved, counts = noisy_lloyd_step(unit, centers, 0.0, rng)
    labels, _ = assign(unit, centers)
    for j in range(2):
        np.testing.assert_allclose(moved[j], unit[labels == j].mean(axis=0))
        assert counts[j] == (labels == j).sum()


def test_dplloyd_noise_scale_is_sensitivity_over_the_per_iteration_budget() -> None:
    # Empirical check of the count noise: one cluster, so the noisy count is n + Lap((d + 1) T / eps).
    rng = np.random.default_rng(1)
    unit = rng.uniform(size=(50, 2))
    scale = 3.0 * 5 / 1.0
    draws = np.array([noisy_lloyd_step(unit, np.array([[0.5, 0.5]]), scale, rng)[1][0] for _ in range(4000)])
    # Laplace(b): mean |X - n| = b; SE of the mean = b / sqrt(4000).
    assert abs(np.mean(np.abs(draws - 50)) - scale) < 5 * scale / math.sqrt(4000)
    out = dplloyd(unit, 1, 1.0, seed=0)
    assert out.diagnostics["sensitivity"] == 3.0
    assert out.diagnostics["epsilon_spent"] == pytest.approx(1.0)


def test_dplloyd_improves_with_n_as_su_et_al_report() -> None:
    """Su et al. (2016): at a fixed epsilon DPLloyd's relative error falls as the data grow (the noise
    on sums and counts is fixed while the clusters grow)."""
    def ratio(n: int) -> float:
        values = []
        for seed in SEEDS:
            x, _ = blobs(n, seed)
            values.append(kmeans_cost(x, dplloyd(x, 4, 0.5, seed=seed).centers) / reference_kmeans_cost(x, 4, seed))
        return float(np.median(values))

    assert ratio(20_000) < ratio(1000)


# -- DP quadtree (papers/001) ------------------------------------------------------------------------------

def test_paper_001_parameters() -> None:
    assert paper_parameters(10_000, 2) == (5, 10.0)  # maxH = ln(N)/d rounded, T = N/1000
    assert paper_parameters(3, 2) == (1, 0.003)


def test_noiseless_quadtree_partitions_the_box_and_follows_the_split_rule() -> None:
    x, _ = blobs(4000)
    unit = Box.of(x).to_unit(x)
    height, threshold = 4, 50.0
    tree = build_dp_quadtree(unit, math.inf, height, threshold, np.random.default_rng(0))
    assert tree.counts.sum() == 4000
    assert np.sum(tree.side**2) == pytest.approx(1.0)  # the leaves tile the unit square
    inner = tree.depth < height
    assert (tree.counts[inner] <= threshold).all()  # an internal-depth leaf is one that did not split
    assert (tree.depth == height).any()
    # Every point lies in exactly one leaf, and the leaf's count is the number of points in it.
    inside = ((unit[:, None, :] >= tree.lower[None]) & (unit[:, None, :] <= (tree.lower + tree.side[:, None])[None]))
    assert (inside.all(axis=2).sum(axis=1) >= 1).all()


def test_quadtree_child_order_is_algorithm_3() -> None:
    # One point in the upper half of dimension 0 and the lower half of dimension 1: child j = 1.
    unit = np.array([[0.9, 0.1]] * 10)
    tree = build_dp_quadtree(unit, math.inf, 1, 5.0, np.random.default_rng(0))
    full = tree.lower[tree.counts == 10][0]
    np.testing.assert_allclose(full, [0.5, 0.0])


def test_dpqt_budget_split_and_bypass() -> None:
    x, _ = blobs(2000)
    out = dp_quadtree_kmeans(x, 4, 0.5, seed=0)
    assert out.diagnostics["epsilon_tree"] + out.diagnostics["epsilon_leaves"] == pytest.approx(0.5)
    assert out.diagnostics["epsilon_tree"] == pytest.approx(0.15)  # gamma = 0.3
    exact = dp_quadtree_kmeans(x, 4, math.inf, seed=0)
    assert exact.centers is not None
    assert kmeans_cost(x, exact.centers) <= 1.02 * reference_kmeans_cost(x, 4, 0)


@pytest.mark.parametrize("epsilon", [0.1, 0.25, 0.5])
@pytest.mark.parametrize("make", [blobs, unbalance_like], ids=["blobs", "unbalance-like"])
def test_paper_001_claim_dpqt_beats_dplloyd_in_nicv_on_2d_data(make, epsilon: float) -> None:
    """papers/001 Fig. 2-5: lower NICV than DPk-means (DPLloyd) at every epsilon <= 0.5 on 2-D data."""
    ours, theirs = [], []
    for seed in SEEDS:
        x, _ = make(3000, seed)
        k = 4 if make is blobs else 8
        ours.append(cost_per_point(x, dp_quadtree_kmeans(x, k, epsilon, seed=seed).centers))
        theirs.append(cost_per_point(x, dplloyd(x, k, epsilon, seed=seed).centers))
    assert np.median(ours) < np.median(theirs)


# -- improved DP k-means (papers/003) ---------------------------------------------------------------------

def test_am_criterion_is_the_davies_bouldin_index() -> None:
    from sklearn.metrics import davies_bouldin_score

    x, _ = blobs(1500)
    labels = assign(x, lloyd(x, x[:4]).centers)[0]
    means = np.array([x[labels == j].mean(axis=0) for j in range(4)])
    assert am_criterion(x, means, labels) == pytest.approx(davies_bouldin_score(x, labels), rel=1e-9)
    halves = (np.arange(len(x)) % 2).astype(np.int64)
    assert am_criterion(x, np.zeros((2, 2)), halves) == math.inf  # coinciding centers
    assert am_criterion(x, means, np.zeros(len(x), dtype=np.int64)) == math.inf  # one non-empty cluster


def test_point_density_counts_neighbours_within_the_radius() -> None:
    points = np.array([[0.0, 0.0], [0.1, 0.0], [0.5, 0.0], [1.0, 0.0]])
    np.testing.assert_array_equal(point_density(points, points, 0.15), [2, 2, 1, 1])


def test_density_init_starts_from_the_two_densest_candidates_then_max_min() -> None:
    rng = np.random.default_rng(0)
    dense = rng.normal([0.2, 0.2], 0.01, size=(200, 2))
    middle = rng.normal([0.8, 0.2], 0.04, size=(200, 2))
    sparse = rng.normal([0.5, 0.9], 0.08, size=(200, 2))
    unit = np.clip(np.vstack([dense, middle, sparse]), 0, 1)
    init = density_am_init(unit, unit, 3, np.random.default_rng(0), radius=0.05)
    assert init.chosen_k == 3 and set(init.am_by_k) == {3}
    first_two = init.centers[:2]
    assert (np.linalg.norm(first_two - [0.2, 0.2], axis=1) < 0.1).all()  # the densest cluster
    # The candidates are the denser half (dense + middle); the third center is the one farthest from
    # the first two: in the middle cluster (the sparse one holds no candidate).
    assert np.linalg.norm(init.centers[2] - [0.8, 0.2]) < 0.1


def test_am_chooses_k_on_well_separated_blobs() -> None:
    x, _ = make_dataset("google", 3000, d=2, k=5, seed=0, ratio=20.0)
    out = density_am_kmeans(x, 10, seed=0, choose_k=True)
    assert out.centers is not None
    assert 3 <= len(out.centers) <= 10
    assert out.diagnostics["chosen_k"] == len(out.centers)


def test_improved_dp_kmeans_budget_is_eq_12() -> None:
    x, _ = blobs(1000)
    out = improved_dp_kmeans(x, 4, 1.5, seed=0, iterations=3)
    assert out.diagnostics["epsilon_per_iteration_prime"] == pytest.approx(1.5 / ((2 * 1 + 1) * 3))
    assert out.diagnostics["private_initialisation"] == 0.0  # as published: the init reads raw data


def test_paper_003_claims_on_s_like_data() -> None:
    """papers/003 Tables 2-3: Alg. 2 (density/AM start) beats standard random-start k-means in Dis and F;
    Alg. 3 keeps Alg. 2's F within 0.05 (at epsilon = 4, the paper states none)."""
    dis2, dis1, f2, f1, f3 = [], [], [], [], []
    for seed in range(5):
        x, y = s_like(5000, seed)  # the S-sets size
        alg2 = density_am_kmeans(x, 15, seed=seed).centers
        alg1 = standard_kmeans(x, 15, seed=seed).centers
        alg3 = improved_dp_kmeans(x, 15, 4.0, seed=seed).centers
        dis2.append(kmeans_cost(x, alg2))
        dis1.append(kmeans_cost(x, alg1))
        f2.append(f_measure(y, assign(x, alg2)[0]))
        f1.append(f_measure(y, assign(x, alg1)[0]))
        f3.append(f_measure(y, assign(x, alg3)[0]))
    assert np.median(dis2) < np.median(dis1)
    assert np.median(f2) > np.median(f1)
    assert np.median(f3) >= np.median(f2) - 0.05


# -- LDP floors ----------------------------------------------------------------------------------------------

def test_discrete_laplace_points_use_the_sdk_noise() -> None:
    rng = np.random.default_rng(0)
    unit = rng.uniform(size=(4000, 2))
    noisy = discrete_laplace_points(unit, 4.0, seed=1, grid_bits=6)
    rounded = np.round(unit * 64) / 64
    err = noisy - rounded
    variance = DiscreteLaplaceParams(dimension=2, epsilon=4.0, grid_bits=6).noise_variance
    # Unbiased, and the variance matches the SDK's analytic one (5 standard errors).
    assert abs(err.mean()) < 5 * math.sqrt(variance / err.size)
    sample_var = err.var()
    assert abs(sample_var / variance - 1) < 5 * math.sqrt(2 / err.size) * 3  # heavy-ish tails: kurtosis 6
    np.testing.assert_array_equal(discrete_laplace_points(unit, math.inf, seed=1, grid_bits=6), rounded)


def test_grid_rule() -> None:
    assert grid_cells_per_dimension(10_000, 2, math.inf) == 128
    assert grid_cells_per_dimension(10_000, 10, math.inf) == 2
    coarse = grid_cells_per_dimension(10_000, 2, 0.5, k=4)
    fine = grid_cells_per_dimension(10_000, 2, 4.0, k=4)
    assert 2 <= coarse < fine <= 128
    assert grid_cells_per_dimension(100, 2, 0.1, k=8) ** 2 >= 16  # at least 2k cells
    assert grid_cells_per_dimension(10**9, 3, 8.0) ** 3 <= MAX_CELLS


def test_cell_centers_follow_the_sdk_grid_order() -> None:
    box = Box(np.array([-1.0, 0.0, 2.0]), np.array([1.0, 3.0, 2.5]))
    m = 3
    encoder = UniformGridEncoder(domain=NumericDomain(lower=(-1.0, 0.0, 2.0), upper=(1.0, 3.0, 2.5)),
                                 cells_per_dimension=(m,) * 3)
    for index, centre in enumerate(cell_centers(box, m)):
        assert encoder.encode(tuple(centre)) == index


@pytest.mark.parametrize("make,k", [(blobs, 4), (unbalance_like, 8), (s_like, 15)],
                         ids=["blobs", "unbalance-like", "S-like"])
def test_floors_at_infinite_epsilon_reproduce_nonprivate_kmeans(make, k: int) -> None:
    """Acceptance: with the no-noise bypass each LDP floor's centers are k-means centers of the true points
    within 2% cost (against Lloyd on the true points from the floor's own centers)."""
    x, _ = make(3000, 0)
    for out in (discrete_laplace_kmeans(x, k, math.inf, seed=0), oue_grid_kmeans(x, k, math.inf, seed=0,
                                                                                   backend=None)):
        assert out.centers is not None
        cost = kmeans_cost(x, out.centers)
        assert cost <= 1.02 * lloyd(x, out.centers).cost


def test_floors_at_infinite_epsilon_match_the_reference_on_blobs() -> None:
    x, _ = blobs()
    reference = reference_kmeans_cost(x, 4, 0)
    for out in (discrete_laplace_kmeans(x, 4, math.inf, seed=0),
                oue_grid_kmeans(x, 4, math.inf, seed=0, backend=None)):
        assert kmeans_cost(x, out.centers) <= 1.02 * reference


def test_oue_floor_runs_a_histogram_campaign_through_the_collector() -> None:
    from harness.adapters import collector_backend

    x, y = blobs(3000)
    with collector_backend(False) as backend:
        out = oue_grid_kmeans(x, 4, 2.0, seed=0, backend=backend)
    assert out.diagnostics["reports"] == 3000 and out.diagnostics["rejected"] == 0
    assert out.diagnostics["epsilon_per_device"] == 2.0
    assert f_measure(y, assign(x, out.centers)[0]) > 0.6
    with pytest.raises(ValueError, match="collector backend"):
        oue_grid_kmeans(x, 4, 2.0, seed=0, backend=None)


def test_floor_ordering_at_small_epsilon() -> None:
    """Sanity of the floors as floors: at epsilon = 0.5 neither matches non-private k-means on blobs."""
    x, _ = blobs()
    reference = reference_kmeans_cost(x, 4, 0)
    out = discrete_laplace_kmeans(x, 4, 0.5, seed=0)
    assert kmeans_cost(x, out.centers) > 1.5 * reference


def test_oue_floor_population_seeds_differ_between_campaigns() -> None:
    from harness.baselines.oue_grid import population_seed

    x, _ = blobs(500)
    y, _ = blobs(500, seed=1)
    seeds = {population_seed(7, x, 1.0, 8), population_seed(7, y, 1.0, 8), population_seed(7, x, 2.0, 8),
             population_seed(7, x, 1.0, 9), population_seed(8, x, 1.0, 8)}
    assert len(seeds) == 5
    assert population_seed(7, x, 1.0, 8) == population_seed(7, x.copy(), 1.0, 8)


# -- the collector's grid clustering (papers/002) --------------------------------------------------------

def test_grid_clustering_runs_a_grid_campaign_and_labels_like_a_device() -> None:
    from harness.adapters import collector_backend
    from harness.baselines.grid import grid_clustering

    from ldp_client.clusters import CellClusterModel
    from ldp_client.encoders.geometry import TreeCell
    from ldp_collector.simulation.scores import adjusted_rand_index

    x, y = make_dataset("moons", 3000, seed=0)
    with collector_backend(False) as backend:
        out = grid_clustering(x, 8.0, variant="uniform", seed=1, backend=backend)
    assert out.centers is None and out.labels is not None and out.labels.shape == (3000,)
    assert out.cell_map is not None and len(out.cell_map.cells) == out.diagnostics["final_cells"]
    assert out.diagnostics["reports"] == out.diagnostics["accepted"] == 3000 and out.diagnostics["rounds"] == 2
    assert out.diagnostics["epsilon_per_device"] == 8.0
    # Every label is the one the device would give itself from the published map.
    model = CellClusterModel(domain=NumericDomain(lower=tuple(out.cell_map.domain.lower),
                                                  upper=tuple(out.cell_map.domain.upper)),
                             cells=tuple(TreeCell(level=c.level, morton_index=c.morton_index)
                                         for c in out.cell_map.cells),
                             labels=tuple(out.cell_map.labels))
    assert [model.label(p) for p in x[:200].tolist()] == out.labels[:200].tolist()
    assert out.diagnostics["clusters"] == len(set(out.cell_map.labels) - {-1})
    assert adjusted_rand_index(y, out.labels) > 0.9  # the uniform grid separates the moons at epsilon 8


def test_grid_clustering_has_no_infinite_epsilon_bypass() -> None:
    from harness.baselines.grid import MAX_DIMENSION, grid_clustering, grid_config

    x, _ = blobs(200)
    with pytest.raises(ValueError, match="no no-noise bypass"):
        grid_clustering(x, math.inf, variant="tree", seed=0, backend=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"d <= {MAX_DIMENSION}"):
        grid_clustering(np.zeros((10, MAX_DIMENSION + 1)), 1.0, variant="tree", seed=0, backend=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="variant must be one of uniform, density, tree, iterative"):
        grid_config(Box.of(x), 1.0, "quadtree")
    assert grid_config(Box.of(x), 1.0, "iterative").grid.variant == 3


# -- the collector's center-publishing campaigns ---------------------------------------------------------

def test_center_campaign_configs_set_the_kind_k_and_algorithm() -> None:
    from harness.baselines.center_campaigns import METHODS, center_campaign, center_campaign_config

    from ldp.v1 import campaigns_pb2

    x, _ = blobs(200)
    box = Box.of(x)
    kcluster = center_campaign_config("kcluster", box, 4, 1.0)
    assert kcluster.kind == campaigns_pb2.BITVECTOR and kcluster.bitvector.k == 4
    assert kcluster.bitvector.algorithm == campaigns_pb2.BitVectorParameters.KMEANS
    assert kcluster.bitvector.pivots_per_attribute == 0  # the engine's default
    mnfcm = center_campaign_config("mnfcm", box, 4, 1.0)
    assert mnfcm.kind == campaigns_pb2.LAPLACE and mnfcm.laplace.algorithm == campaigns_pb2.LaplaceParameters.MNFCM
    assert center_campaign_config("fcm-laplace", box, 4, 1.0).laplace.algorithm == campaigns_pb2.LaplaceParameters.FCM
    ldp_kmeans = center_campaign_config("ldp-kmeans", box, 4, 1.0)
    assert ldp_kmeans.kind == campaigns_pb2.LDP_KMEANS and ldp_kmeans.ldp_kmeans.k == 4
    assert ldp_kmeans.ldp_kmeans.iterations == 0  # the engine's default
    assert list(kcluster.domain.numeric.lower) == box.lower.tolist()
    assert len({tag for _, tag in METHODS.values()}) == len(METHODS)
    nettree = center_campaign_config("nettree", box, 4, 1.0)
    assert nettree.kind == campaigns_pb2.NETTREE and nettree.nettree.k == 4 and nettree.nettree.depth == 0
    stemmer = center_campaign_config("stemmer", box, 4, 1.0)
    assert stemmer.kind == campaigns_pb2.STEMMER and stemmer.stemmer.k == 4
    assert not stemmer.stemmer.HasField("lloyd_refinement")  # the engine's default: on
    with pytest.raises(ValueError, match="method must be one of"):
        center_campaign_config("grid", box, 4, 1.0)
    with pytest.raises(ValueError, match="no no-noise bypass"):
        center_campaign(x, 4, math.inf, method="mnfcm", seed=0, backend=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k >= 2"):
        center_campaign(x, 1, 1.0, method="kcluster", seed=0, backend=None)  # type: ignore[arg-type]
