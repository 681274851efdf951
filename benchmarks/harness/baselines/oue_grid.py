"""LDP floor (b): one OUE histogram over a uniform grid, then weighted k-means on the cell centres.

The protocol runs through the real collector: a ``HISTOGRAM`` campaign over the public box with
``cells_per_dimension = m`` and the OUE oracle, played by the in-process simulator
(:func:`ldp_collector.simulation.runner.run_campaign`, the SDK's device code) against an in-process
collector or, over gRPC, a running one. The collector's estimates (made consistent by norm-sub:
non-negative, summing to n) weight the cell centres; the harness's non-private reference k-means
(:func:`ldp_collector.simulation.scores.reference_kmeans`, best of 10 k-means++ runs) on the
weighted centres gives the centers.

Grid rule (data-independent: n, d and epsilon are public)
    OUE's count standard error is ``sigma = sqrt(n 4 e^eps) / (e^eps - 1)`` per cell. A cell is
    informative when its share of a uniform spread, ``n / C``, is at least ``sigma``, so the grid
    has about ``C = max(n / sigma, 2 k)`` cells, ``m = ceil(C^(1/d))`` per dimension, clamped to
    ``[2, 128]`` and to at most 16384 cells in total (OUE sends one bit per cell).
``epsilon = inf``
    The documented no-noise bypass: the grid of the rule at ``epsilon = inf`` (the finest allowed)
    and the exact cell counts, computed with the SDK's own grid encoder; no campaign is run (the
    SDK has no mechanism with infinite epsilon, by design).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp.v1 import campaigns_pb2
from ldp_client.encoders.base import NumericDomain
from ldp_client.encoders.grid import UniformGridEncoder
from ldp_collector.cli import build_campaign_config
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.runner import CollectorBackend, run_campaign
from ldp_collector.simulation.scores import reference_kmeans

from ._common import Box, Clustering, check_epsilon, check_k, check_points

__all__ = ["MAX_CELLS", "MAX_CELLS_PER_DIMENSION", "cell_centers", "grid_cells_per_dimension", "histogram_config",
           "oue_grid_kmeans", "population_seed"]

#: Most cells in the grid (one OUE bit each per report: 2 kB). The noise keeps the rule far below it
#: (it needs n > 2e7 at epsilon = 4); it binds at epsilon = inf, where the grid's resolution is all
#: that separates the floor from k-means.
MAX_CELLS = 16384
#: Most cells per dimension.
MAX_CELLS_PER_DIMENSION = 128


def grid_cells_per_dimension(n: int, d: int, epsilon: float, k: int = 1) -> int:
    """Cells per dimension of the grid rule (module docstring); at least ``2 k`` cells in all."""
    if math.isinf(epsilon):
        cells = float(MAX_CELLS)
    else:
        sigma = math.sqrt(4.0 * n * math.exp(epsilon)) / math.expm1(epsilon)
        cells = max(n / sigma, 2.0 * k)
    m = max(2, min(MAX_CELLS_PER_DIMENSION, math.ceil(math.pow(cells, 1.0 / d) - 1e-9)))
    while m > 2 and m**d > MAX_CELLS:
        m -= 1
    return m


def cell_centers(box: Box, m: int) -> NDArray[np.float64]:
    """Centres of the ``m^d`` cells in the SDK's row-major order (last dimension fastest)."""
    d = box.dimension
    index = np.stack(np.unravel_index(np.arange(m**d), (m,) * d), axis=1).astype(np.float64)
    out: NDArray[np.float64] = box.lower + (index + 0.5) / m * box.width
    return out


def _exact_counts(points: NDArray[np.float64], box: Box, m: int) -> NDArray[np.float64]:
    domain = NumericDomain(lower=tuple(box.lower.tolist()), upper=tuple(box.upper.tolist()))
    encoder = UniformGridEncoder(domain=domain, cells_per_dimension=(m,) * box.dimension)
    cells = np.fromiter((encoder.encode(p) for p in points.tolist()), dtype=np.int64, count=len(points))
    out: NDArray[np.float64] = np.bincount(cells, minlength=m**box.dimension).astype(np.float64)
    return out


def population_seed(seed: int, points: NDArray[np.float64], epsilon: float, m: int) -> int:
    """The simulated devices' seed: ``seed`` mixed with the data and the campaign's parameters.

    The simulator draws report ids from the population's seeded generator, and a collector drops a
    report whose id it has already stored in *any* campaign as a duplicate. Two campaigns sharing
    one collector (``--via-grpc``) with equal seeds would therefore lose each other's reports, so
    every distinct campaign gets a distinct, still reproducible, stream.
    """
    digest = hashlib.blake2b(digest_size=8)
    digest.update(np.asarray([seed, m], dtype=np.int64).tobytes())
    digest.update(np.float64(epsilon).tobytes())
    digest.update(np.ascontiguousarray(points).tobytes())
    return int.from_bytes(digest.digest(), "big") >> 1


def histogram_config(box: Box, m: int, epsilon: float) -> campaigns_pb2.CampaignConfig:
    """The ``HISTOGRAM`` campaign of the floor: OUE over ``m^d`` cells, norm-sub consistency."""
    return build_campaign_config("histogram", epsilon=epsilon, bounds=(box.lower.tolist(), box.upper.tolist()),
                                 cells=(m,) * box.dimension, oracle="oue", consistency=True,
                                 description="benchmark LDP floor: OUE grid histogram + weighted k-means")


def oue_grid_kmeans(x: ArrayLike, k: int, epsilon: float, *, seed: int, backend: CollectorBackend | None,
                    cells_per_dimension: int | None = None, n_init: int = 10) -> Clustering:
    """LDP floor (b) (module docstring).

    Parameters
    ----------
    x : array_like
        ``(n, d)`` points, one per simulated device.
    k : int
    epsilon : float
        Per-device budget, or ``inf`` for the no-noise bypass.
    seed : int
        Seed of the devices' (simulation) randomness and of the k-means.
    backend : CollectorBackend or None
        The collector to run the campaign on; only ``epsilon = inf`` may pass ``None``.
    cells_per_dimension : int, optional
        Overrides the grid rule.
    n_init : int
    """
    points = check_points(x)
    k = check_k(k, len(points))
    epsilon = check_epsilon(epsilon)
    n, d = points.shape
    if 2**d > MAX_CELLS:
        raise ValueError(f"a grid of 2 cells per dimension has 2^{d} cells, more than the floor's {MAX_CELLS}: "
                         f"the OUE grid floor handles d <= {int(math.log2(MAX_CELLS))}")
    box = Box.of(points)
    m = grid_cells_per_dimension(n, d, epsilon, k) if cells_per_dimension is None else int(cells_per_dimension)
    diagnostics: dict[str, float] = {"cells_per_dimension": float(m), "cells": float(m**d)}
    if math.isinf(epsilon):
        weights = _exact_counts(points, box, m)
    else:
        if backend is None:
            raise ValueError("a finite epsilon runs a histogram campaign: pass a collector backend")
        run = run_campaign(backend, config_from_proto(histogram_config(box, m, epsilon)), points,
                           seed=population_seed(seed, points, epsilon, m), mode="direct", quiet=True)
        stats = run.stats
        if stats.accepted != stats.reports_sent:
            raise RuntimeError(
                f"the collector accepted {stats.accepted} of {stats.reports_sent} reports ({stats.duplicates} "
                f"duplicates, {stats.rejected} rejected: {stats.rejection_reasons}); the estimate would not be "
                "the floor's")
        weights = np.zeros(m**d)
        for e in run.result.estimates.estimates:
            weights[e.value] = e.count
        weights = np.maximum(weights, 0.0)
        diagnostics.update({"reports": float(run.stats.reports_sent), "accepted": float(run.stats.accepted),
                            "duplicates": float(run.stats.duplicates), "rejected": float(run.stats.rejected), "campaign_seconds": run.stats.wall_time_s,
                            "epsilon_per_device": run.stats.epsilon_per_device})
    centres = cell_centers(box, m)
    positive = weights > 0
    if int(positive.sum()) >= k:
        centers = reference_kmeans(centres[positive], k, seed, n_init, weights=weights[positive]).centers
    else:  # fewer informative cells than clusters: pad with other cell centres (data-independent draws)
        rng = np.random.default_rng(seed)
        spare = np.flatnonzero(~positive)
        pool = spare if len(spare) else np.arange(len(centres))
        missing = k - int(positive.sum())
        rest = rng.choice(pool, size=missing, replace=len(pool) < missing)
        centers = np.vstack([centres[positive], centres[rest]])
    diagnostics["positive_cells"] = float(positive.sum())
    return Clustering(centers=np.asarray(centers, dtype=np.float64), diagnostics=diagnostics)
