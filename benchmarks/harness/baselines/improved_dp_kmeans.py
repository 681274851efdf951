"""Improved DP k-means of ``papers/003`` (Wang, Wang and Yang 2023): density-based initialisation,
the AM criterion, then Lloyd iterations with Laplace noise.

Trusted-curator reference. The paper's Algorithm 2 (non-private "dynamic" k-means) and Algorithm 3
(its DP version) share the initialisation:

1. Point density (eq. 8): the number of points within radius ``R`` of a point. The ``N`` densest
   points form the candidate set ``B``.
2. The two densest candidates are the first two centers (removed from ``B``).
3. The candidate farthest from the current centers (max-min distance) is the next center.
4. Assign every point to its nearest center and compute AM (eq. 11).
5. While AM decreases: move the centers once by the mean update (eq. 6), add the candidate
   whose smallest distance to the moved centers is largest, and go to 4. The initial centers are
   those of the smallest AM.
6. Lloyd iterations from there: plain (Algorithm 2) or, in Algorithm 3, with ``Lap(1/epsilon')``
   on every cluster's count and coordinate sums, ``epsilon' = epsilon / ((d r + 1) t)`` (eq. 12:
   ``t`` iterations, data range ``r``; after the paper's normalization to ``[0, 1]``, ``r = 1``).

Formulas corrected, and why
    * Eq. 11 prints ``AM = 1/k sum_i sum_j max{(s_i + s_j) / d_ij}`` with ``d_ij = ||z_i - z_j||^2``
      (eq. 9): the inner sum over ``j`` around a ``max`` over nothing is a typesetting slip, and a
      squared distance under an unsquared spread (eq. 10) makes AM depend on the data's scale. The
      text ("each cluster's largest similarity to the others, averaged") is the Davies-Bouldin
      index: ``AM = 1/k sum_i max_{j != i} (s_i + s_j) / ||z_i - z_j||``, implemented here.
    * Eq. 12 read literally as noise added to the *centers* (step 9) would give a Laplace scale of
      ``(d r + 1) t / epsilon`` on coordinates in ``[0, 1]``, destroying any clustering; the
      denominator ``d r + 1`` is exactly the L1 sensitivity of one cluster's (coordinate sums,
      count) under adding or removing a point, so eq. 12 is the DPLloyd recipe: noise on sums and
      counts, center = noisy sum / noisy count (:func:`~harness.baselines.dplloyd.noisy_lloyd_step`).
Privacy, as published
    The noisy iterations are ``epsilon``-DP (sequential over ``t``, parallel over clusters). The
    initialisation reads the raw data (densities, distances, AM) **without noise**, as the paper
    does; the whole algorithm is therefore *not* end-to-end ``epsilon``-DP. The harness reports it
    as the paper's reference with that caveat (``diagnostics["private_initialisation"] = 0``).
Choices the paper leaves open
    ``R`` (default 5% of the unit box's diagonal), ``N`` (default the denser half of the density
    candidates, at least ``5 k``: a smaller set can miss whole sparse clusters, a larger one hands
    the max-min rule the outliers), ``t`` (default 5, as DPLloyd); densities are computed for at most
    ``density_sample`` random candidate points (counted against all points), since the exact
    computation is O(n^2), the paper's own stated limitation.
Units
    Densities use the unit box (``R`` is relative to it, as after the paper's normalization);
    distances, AM and centers use the data's own units (the harness scores every method there);
    the noise of step 6 is calibrated on the unit box.
``k``
    With ``choose_k=False`` (the harness, which compares methods at the true ``k``) the
    initialisation grows to exactly ``k`` centers and AM is recorded per K; with ``choose_k=True``
    AM picks K (at most ``k``) as in the paper.
``epsilon = inf``
    The documented no-noise bypass: Algorithm 2 with ``t`` iterations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_collector.estimation.kmeans import assign, lloyd

from ._common import Box, Clustering, check_epsilon, check_k, check_points
from .dplloyd import noisy_lloyd_step

__all__ = ["DensityInit", "am_criterion", "density_am_init", "density_am_kmeans", "improved_dp_kmeans",
           "point_density"]


def point_density(candidates: NDArray[np.float64], points: NDArray[np.float64], radius: float) -> NDArray[np.int64]:
    """Eq. 8: for every candidate, the number of points within ``radius`` (itself included)."""
    from scipy.spatial import cKDTree  # type: ignore[import-untyped, unused-ignore]

    counts = cKDTree(points).query_ball_point(candidates, radius, return_length=True)
    out: NDArray[np.int64] = np.asarray(counts, dtype=np.int64)
    return out


def am_criterion(points: NDArray[np.float64], centers: NDArray[np.float64], labels: NDArray[np.int64]) -> float:
    """Eq. 11 in its Davies-Bouldin form (module docstring); ``inf`` when two centers coincide.

    Empty clusters are left out (they have no spread and no similarity to report).
    """
    k = len(centers)
    present = np.flatnonzero(np.bincount(labels, minlength=k) > 0)
    if len(present) < 2:
        return math.inf
    distance = np.sqrt(((points - centers[labels]) ** 2).sum(axis=1))
    spread = np.bincount(labels, weights=distance, minlength=k)[present] / np.bincount(labels, minlength=k)[present]
    z = centers[present]
    between = np.sqrt(((z[:, None, :] - z[None, :, :]) ** 2).sum(axis=2))
    np.fill_diagonal(between, np.inf)
    if (between == 0.0).any():
        return math.inf
    ratio = (spread[:, None] + spread[None, :]) / between
    return float(ratio.max(axis=1).mean())


@dataclass(frozen=True)
class DensityInit:
    """Outcome of the initialisation: centers, the AM of every K tried, and the chosen K."""

    centers: NDArray[np.float64]
    am_by_k: dict[int, float]
    chosen_k: int


def density_am_init(points: NDArray[np.float64], unit: NDArray[np.float64], k: int, rng: np.random.Generator, *,
                    radius: float | None = None, candidates: int | None = None, density_sample: int = 5000,
                    choose_k: bool = False) -> DensityInit:
    """Steps 1-5 of Algorithms 2 and 3 (module docstring).

    Parameters
    ----------
    points : numpy.ndarray
        ``(n, d)`` points in the data's units: distances, assignments, AM and centers.
    unit : numpy.ndarray
        The same points in the unit box ``[0, 1]^d``: the densities (the radius is relative).
    k : int
        Number of centers (``choose_k``: the largest K tried).
    rng : numpy.random.Generator
        Draws the density subsample when ``n > density_sample``.
    radius : float, optional
        ``R``; default ``0.05 sqrt(d)``.
    candidates : int, optional
        ``N``; default ``max(5 k, m // 2)`` for ``m`` density-sampled points.
    density_sample : int
    choose_k : bool
    """
    n, d = unit.shape
    r = 0.05 * math.sqrt(d) if radius is None else float(radius)
    if not r > 0.0:
        raise ValueError(f"radius must be positive, got {radius!r}")
    sampled = rng.choice(n, size=density_sample, replace=False) if n > density_sample else np.arange(n)
    density = point_density(unit[sampled], unit, r)
    size = max(5 * k, len(sampled) // 2) if candidates is None else int(candidates)
    size = min(max(size, min(k, len(sampled))), len(sampled))
    order = np.argsort(-density, kind="stable")[:size]
    pool = points[sampled[order]]  # B, densest first
    available = np.ones(len(pool), dtype=bool)
    if k == 1 or len(pool) < 2:
        return DensityInit(centers=pool[:1].copy(), am_by_k={}, chosen_k=1)
    centers = pool[:2].copy()  # step 2: the two densest candidates
    available[:2] = False
    am_by_k: dict[int, float] = {}
    best_am = math.inf
    best = centers
    while len(centers) < k and available.any():
        nearest = _min_sq_distance(pool, centers)  # step 3 / 7: max-min distance from B
        nearest[~available] = -1.0
        pick = int(np.argmax(nearest))
        available[pick] = False
        centers = np.vstack([centers, pool[pick]])
        labels, _ = assign(points, centers)  # step 4
        am = am_criterion(points, centers, labels)  # step 5
        am_by_k[len(centers)] = am
        if choose_k and am >= best_am:  # step 6: AM stopped decreasing
            break
        if am < best_am:
            best_am, best = am, centers.copy()
        if len(centers) < k:
            centers = _mean_update(points, centers, labels)  # step 7
    final = best if choose_k else centers
    return DensityInit(centers=final, am_by_k=am_by_k, chosen_k=len(final))


def _min_sq_distance(points: NDArray[np.float64], centers: NDArray[np.float64]) -> NDArray[np.float64]:
    d2 = ((points[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2)
    out: NDArray[np.float64] = d2.min(axis=1)
    return out


def _mean_update(points: NDArray[np.float64], centers: NDArray[np.float64],
                 labels: NDArray[np.int64]) -> NDArray[np.float64]:
    k, d = centers.shape
    sums = np.zeros((k, d))
    np.add.at(sums, labels, points)
    sizes = np.bincount(labels, minlength=k)
    out: NDArray[np.float64] = np.where(sizes[:, None] > 0, sums / np.maximum(sizes, 1)[:, None], centers)
    return out


def _diagnostics(init: DensityInit) -> dict[str, float]:
    out = {"chosen_k": float(init.chosen_k), "private_initialisation": 0.0}
    out.update({f"am_k{k}": am for k, am in init.am_by_k.items()})
    return out


def density_am_kmeans(x: ArrayLike, k: int, *, seed: int, choose_k: bool = False, radius: float | None = None,
                      candidates: int | None = None, max_iter: int = 100) -> Clustering:
    """Algorithm 2 (non-private): the density/AM initialisation, then Lloyd to convergence."""
    points = check_points(x)
    k = check_k(k, len(points))
    unit = Box.of(points).to_unit(points)
    init = density_am_init(points, unit, k, np.random.default_rng(seed), radius=radius, candidates=candidates,
                           choose_k=choose_k)
    result = lloyd(points, init.centers, max_iter=max_iter)
    diagnostics = _diagnostics(init)
    diagnostics["iterations"] = float(result.iterations)
    return Clustering(centers=result.centers, diagnostics=diagnostics)


def improved_dp_kmeans(x: ArrayLike, k: int, epsilon: float, *, seed: int, iterations: int = 5,
                       choose_k: bool = False, radius: float | None = None,
                       candidates: int | None = None) -> Clustering:
    """Algorithm 3: the density/AM initialisation, then ``iterations`` noisy Lloyd steps (eq. 12)."""
    points = check_points(x)
    k = check_k(k, len(points))
    epsilon = check_epsilon(epsilon)
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be a positive integer, got {iterations!r}")
    box = Box.of(points)
    unit = box.to_unit(points)
    rng = np.random.default_rng(seed)
    init = density_am_init(points, unit, k, rng, radius=radius, candidates=candidates, choose_k=choose_k)
    d = box.dimension
    data_range = 1.0  # r after the paper's normalization to [0, 1]
    epsilon_prime = epsilon / ((d * data_range + 1.0) * iterations)
    scale = 0.0 if math.isinf(epsilon_prime) else 1.0 / epsilon_prime
    centers = box.to_unit(init.centers)
    for _ in range(iterations):
        centers, _ = noisy_lloyd_step(unit, centers, scale, rng, box.width)
    diagnostics = _diagnostics(init)
    diagnostics.update({"iterations": float(iterations), "epsilon_per_iteration_prime": epsilon_prime})
    return Clustering(centers=box.from_unit(centers), diagnostics=diagnostics)
