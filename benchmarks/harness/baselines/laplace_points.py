"""LDP floor (a): every device sends its point with discrete-Laplace noise; k-means on the noisy points.

The simplest local protocol: one report per device, the SDK's own mechanism
(:class:`ldp_client.mechanisms.DiscreteLaplaceParams`: clamp to the public box, round to a
``2^grid_bits`` grid, add exact discrete-Laplace noise of scale ``d N / epsilon`` per coordinate,
``epsilon``-LDP), run per point with a seeded SDK generator exactly as a device runs it. The
server decodes (unbiased for the rounded point), maps back to the data's units and runs the same non-private k-means as the
harness's reference (:func:`ldp_collector.simulation.scores.reference_kmeans`: best of 10 k-means++
runs, fitted on at most 100 000 points) on the noisy points; the centers are clamped to the box
(post-processing).

Every private clustering protocol should beat this floor; at small ``epsilon`` the noise
(standard deviation about ``sqrt(2) d / epsilon`` box widths per coordinate) swamps the clusters.
There is no ``laplace`` campaign engine yet, so the reports do not pass through a collector here;
the adapter for the collector's ``laplace`` kind comes with its issue.

``epsilon = inf``
    The documented no-noise bypass: the points are rounded to the same grid (what the device
    would encode) and no noise is added; nothing else changes. This is *not* a mechanism with
    ``epsilon = inf`` (the SDK refuses one): it checks that the floor's server side reproduces
    non-private k-means when the noise is removed.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.mechanisms import DiscreteLaplaceParams
from ldp_client.rng import SeededRng
from ldp_collector.simulation.scores import reference_kmeans

from ._common import Box, Clustering, check_epsilon, check_k, check_points

__all__ = ["discrete_laplace_kmeans", "discrete_laplace_points"]


def discrete_laplace_points(unit: NDArray[np.float64], epsilon: float, *, seed: int,
                            grid_bits: int = 10) -> NDArray[np.float64]:
    """What the server decodes from every device's report, in unit-box coordinates.

    Parameters
    ----------
    unit : numpy.ndarray
        ``(n, d)`` points in ``[0, 1]^d``.
    epsilon : float
        Per-device budget, or ``inf`` for the no-noise bypass (rounding only).
    seed : int
        Seed of the SDK's :class:`~ldp_client.rng.SeededRng` (simulation only).
    grid_bits : int
    """
    n, d = unit.shape
    if math.isinf(epsilon):
        size = float(1 << grid_bits)
        out: NDArray[np.float64] = np.round(unit * size) / size  # round_to_grid: exact, ties to even
        return out
    params = DiscreteLaplaceParams(dimension=d, epsilon=epsilon, grid_bits=grid_bits)
    rng = SeededRng(seed)
    randomize, decode = params.randomize, params.decode
    return np.array([decode(randomize(row, rng=rng)) for row in unit.tolist()], dtype=np.float64).reshape(n, d)


def discrete_laplace_kmeans(x: ArrayLike, k: int, epsilon: float, *, seed: int, grid_bits: int = 10,
                            n_init: int = 10) -> Clustering:
    """LDP floor (a) (module docstring)."""
    points = check_points(x)
    k = check_k(k, len(points))
    epsilon = check_epsilon(epsilon)
    box = Box.of(points)
    noisy = discrete_laplace_points(box.to_unit(points), epsilon, seed=seed, grid_bits=grid_bits)
    result = reference_kmeans(box.from_unit(noisy), k, seed, n_init=n_init)  # k-means in the data's units
    centers = np.clip(result.centers, box.lower, box.upper)
    noise_sd = math.nan if math.isinf(epsilon) else math.sqrt(
        DiscreteLaplaceParams(dimension=box.dimension, epsilon=epsilon, grid_bits=grid_bits).noise_variance)
    return Clustering(centers=centers, diagnostics={
        "reports": float(len(points)), "noise_sd_unit": noise_sd, "grid_bits": float(grid_bits),
        "epsilon_per_device": epsilon})
