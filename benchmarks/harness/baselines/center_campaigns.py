"""The collector's center-publishing clustering campaigns as harness methods.

Not baselines but the product's own protocols, each one campaign over the public box, run by the
in-process simulator (:func:`ldp_collector.simulation.runner.run_campaign`, the SDK's device code) against
an in-process collector or, over gRPC, a running one, exactly as a deployment runs it. Every
engine publishes ``Result.clustering.centers`` (row-major ``k x d``, original units); the harness
labels each point by its nearest center, as for the floors, so every metric applies.

=================  ============  ======================================================================
method             campaign      what
=================  ============  ======================================================================
``kcluster``       BITVECTOR     kCluster: public pivots, bitwise RR at the exact Hamming bound, k-means
                                 on the debiased bit vectors, centers decoded (one round)
``mnfcm``          LAPLACE       discrete-Laplace points, mnFCM (fuzzy c-means with the mixed-noise
                                 loss) on the server (``papers/004``, one round)
``fcm-laplace``    LAPLACE       the same reports, plain fuzzy c-means (the loss ablation)
``ldp-kmeans``     LDP_KMEANS    Xia et al. 2020: perturbed vectors, then ``iterations`` rounds of
                                 broadcast centers and GRR labels with debiased updates
``nettree``        NETTREE       one-round net-tree k-means: node reports at T levels (LSH prefix tree)
                                 and one bucketized vector sum per device, weighted coreset k-means
``stemmer``        STEMMER       Stemmer-style: heavy LSH keys, bucket means, candidate weights, k-means
                                 on the private coreset, one Lloyd round (four rounds)
=================  ============  ======================================================================

Every parameter but ``k`` and the algorithm is left at the engine's default (pivots per attribute,
fuzzifier, grid bits, iterations, data share; the collector's budget policy PARTITION: every
device reports once with the whole epsilon).

``epsilon = inf``
    No bypass: the engines refuse an infinite epsilon (the SDK has no mechanism with one), and a
    noise-free rerun of their rounds would be a second implementation of each engine. The harness
    leaves them out of the suites' ``inf`` column (``ProtocolAdapter.noiseless_bypass``) and
    :func:`center_campaign` refuses ``inf``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from ldp.v1 import campaigns_pb2
from ldp_collector.simulation.runner import CollectorBackend, run_campaign

from ._common import Box, Clustering, check_epsilon, check_k, check_points
from .oue_grid import population_seed

__all__ = ["METHODS", "center_campaign", "center_campaign_config"]

_BV = campaigns_pb2.BitVectorParameters
_LAPLACE = campaigns_pb2.LaplaceParameters

#: Harness method -> (campaign kind, population-seed tag). The tags differ from every OUE floor grid
#: (``m >= 2``) and grid variant (``-1 .. -3``): distinct report ids on a shared collector.
METHODS: dict[str, tuple[campaigns_pb2.CampaignKind.ValueType, int]] = {
    "kcluster": (campaigns_pb2.BITVECTOR, -10),
    "mnfcm": (campaigns_pb2.LAPLACE, -11),
    "fcm-laplace": (campaigns_pb2.LAPLACE, -12),
    "ldp-kmeans": (campaigns_pb2.LDP_KMEANS, -13),
    "nettree": (campaigns_pb2.NETTREE, -14),
    "stemmer": (campaigns_pb2.STEMMER, -15),
}


def center_campaign_config(method: str, box: Box, k: int, epsilon: float) -> campaigns_pb2.CampaignConfig:
    """The campaign of ``method`` over the public box; everything but ``k`` and the algorithm at the default."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    kind, _ = METHODS[method]
    config = campaigns_pb2.CampaignConfig(kind=kind, epsilon=epsilon, description=f"benchmark: {method}")
    config.domain.numeric.lower.extend(box.lower.tolist())
    config.domain.numeric.upper.extend(box.upper.tolist())
    if method == "kcluster":
        config.bitvector.k = k
        config.bitvector.algorithm = _BV.KMEANS
    elif method == "mnfcm":
        config.laplace.k = k
        config.laplace.algorithm = _LAPLACE.MNFCM
    elif method == "fcm-laplace":
        config.laplace.k = k
        config.laplace.algorithm = _LAPLACE.FCM
    elif method == "nettree":
        config.nettree.k = k
    elif method == "stemmer":
        config.stemmer.k = k
    else:
        config.ldp_kmeans.k = k
    return config


def center_campaign(x: ArrayLike, k: int, epsilon: float, *, method: str, seed: int,
                    backend: CollectorBackend) -> Clustering:
    """One campaign of ``method`` through ``backend``; its published centers (module docstring).

    Returns
    -------
    Clustering
        ``centers`` (``(k', d)``, original units; labels are the nearest center's) and the
        campaign's diagnostics (the result's) plus its traffic.

    Raises
    ------
    ValueError
        ``epsilon = inf`` (no bypass), ``k < 2`` or an unknown method.
    RuntimeError
        The collector did not accept every report, or the campaign published no centers.
    """
    points = check_points(x)
    k = check_k(k, len(points))
    epsilon = check_epsilon(epsilon)
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if math.isinf(epsilon):
        raise ValueError(f"{method} has no no-noise bypass: its engine refuses epsilon = inf; run it at a finite "
                         "epsilon")
    if k < 2:
        raise ValueError(f"{method} needs k >= 2 (the engines' lower bound), got {k}")
    d = points.shape[1]
    config = center_campaign_config(method, Box.of(points), k, epsilon)
    run = run_campaign(backend, config, points, mode="direct", quiet=True,
                       seed=population_seed(seed, points, epsilon, METHODS[method][1]))
    stats = run.stats
    if stats.accepted != stats.reports_sent:
        raise RuntimeError(
            f"the collector accepted {stats.accepted} of {stats.reports_sent} reports ({stats.duplicates} duplicates, "
            f"{stats.rejected} rejected: {stats.rejection_reasons}); the clustering would not be the protocol's")
    clustering = run.result.clustering
    flat = np.asarray(clustering.centers if clustering is not None else (), dtype=np.float64)
    if flat.size == 0 or flat.size % d:
        raise RuntimeError(f"{method}: the campaign published {flat.size} center coordinates for d = {d} "
                           f"(warnings: {list(run.result.warnings)})")
    centers = flat.reshape(-1, d)
    diagnostics = {key: float(value) for key, value in run.result.diagnostics.items()}
    diagnostics.update({"reports": float(stats.reports_sent), "accepted": float(stats.accepted),
                        "rounds": float(stats.rounds), "campaign_seconds": stats.wall_time_s,
                        "epsilon_per_device": stats.epsilon_per_device, "published_centers": float(len(centers))})
    return Clustering(centers=centers, diagnostics=diagnostics)
