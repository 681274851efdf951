"""DPLloyd: Lloyd's iterations with Laplace noise on every cluster's count and coordinate sums.

Trusted-curator reference (it sees raw points). Blum, Dwork, McSherry and Nissim, "Practical
privacy: the SuLQ framework" (PODS 2005) introduced it; Su, Cao, Li, Bertino and Jin,
"Differentially private k-means clustering" (CODASPY 2016) named and tuned it ("DPLloyd"), and
``papers/001`` describes it as DPk-means.

Algorithm (points mapped to the public unit box ``[0, 1]^d``)
    Start from ``k`` centers drawn uniformly in the box (data-independent, so free). In each of
    ``T`` iterations assign every point to its nearest center (in the data's units) and release, per cluster, the count
    and the ``d`` coordinate sums plus ``Lap(Delta / epsilon_t)`` noise each; the new center is
    noisy sum / noisy count, clamped to the box (a cluster whose noisy count is below 1 keeps its
    center).
Privacy
    Adding or removing one point changes one cluster's (sums, count) vector by at most
    ``||x||_1 + 1 <= d + 1`` in L1 (coordinates in ``[0, 1]``), so ``Delta = d + 1`` and one
    iteration is ``epsilon_t``-DP (the clusters are disjoint: parallel composition). The
    iterations compose sequentially: ``sum_t epsilon_t <= epsilon``.
Budget schedule
    ``uniform`` (Su et al.): ``epsilon_t = epsilon / T``. ``halving`` (Blum et al. as described in
    ``papers/001``): ``epsilon / 2, epsilon / 4, ...`` (sums to less than ``epsilon``).
``epsilon = inf``
    The documented no-noise bypass: plain Lloyd from the same random start for ``T`` iterations.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_collector.estimation.kmeans import assign

from ._common import Box, Clustering, check_epsilon, check_k, check_points, laplace

__all__ = ["budget_schedule", "dplloyd", "noisy_lloyd_step"]

Schedule = Literal["uniform", "halving"]


def budget_schedule(epsilon: float, iterations: int, schedule: Schedule = "uniform") -> list[float]:
    """Per-iteration budgets ``epsilon_t`` (their sum is at most ``epsilon``)."""
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be a positive integer, got {iterations!r}")
    if schedule == "uniform":
        return [epsilon / iterations] * iterations
    if schedule == "halving":
        return [epsilon / 2.0 ** (t + 1) for t in range(iterations)]
    raise ValueError(f"schedule must be 'uniform' or 'halving', got {schedule!r}")


def noisy_lloyd_step(unit: NDArray[np.float64], centers: NDArray[np.float64], scale: float,
                     rng: np.random.Generator,
                     width: NDArray[np.float64] | None = None) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """One DP Lloyd step in unit-box coordinates.

    Parameters
    ----------
    unit : numpy.ndarray
        Points in ``[0, 1]^d``.
    centers : numpy.ndarray
        Current ``(k, d)`` centers.
    scale : float
        Laplace scale of every released count and sum (0: no noise).
    rng : numpy.random.Generator
    width : numpy.ndarray, optional
        The box's widths: points are assigned by distances in the data's units (unit coordinates
        times ``width``); ``None`` assigns in unit coordinates.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        The new centers and the noisy counts.
    """
    k, d = centers.shape
    labels, _ = assign(unit, centers) if width is None else assign(unit * width, centers * width)
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    sums = np.zeros((k, d))
    np.add.at(sums, labels, unit)
    noisy_counts = counts + laplace(scale, k, rng)
    noisy_sums = sums + laplace(scale, (k, d), rng)
    alive = noisy_counts >= 1.0
    moved = np.clip(noisy_sums / np.where(alive, noisy_counts, 1.0)[:, None], 0.0, 1.0)
    out: NDArray[np.float64] = np.where(alive[:, None], moved, centers)
    return out, noisy_counts


def dplloyd(x: ArrayLike, k: int, epsilon: float, *, seed: int, iterations: int = 5,
            schedule: Schedule = "uniform") -> Clustering:
    """DPLloyd (module docstring); ``iterations`` = T (Su et al. use 5 to 10; 5 here)."""
    points = check_points(x)
    k = check_k(k, len(points))
    epsilon = check_epsilon(epsilon)
    box = Box.of(points)
    unit = box.to_unit(points)
    d = box.dimension
    rng = np.random.default_rng(seed)
    centers = rng.uniform(0.0, 1.0, size=(k, d))
    budgets = budget_schedule(epsilon, iterations, schedule)
    sensitivity = d + 1.0
    for epsilon_t in budgets:
        scale = 0.0 if math.isinf(epsilon_t) else sensitivity / epsilon_t
        centers, _ = noisy_lloyd_step(unit, centers, scale, rng, box.width)
    return Clustering(centers=box.from_unit(centers), diagnostics={
        "iterations": float(iterations), "epsilon_per_iteration": budgets[0], "sensitivity": sensitivity,
        "epsilon_spent": float(math.fsum(budgets)) if not math.isinf(epsilon) else math.inf})
