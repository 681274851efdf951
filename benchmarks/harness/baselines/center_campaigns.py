"""The collector's center-publishing clustering campaigns as harness methods.

Not baselines but the product's own protocols, each one campaign over the public box, run by the
in-process simulator (:func:`ldp_collector.simulation.runner.run_campaign`, the SDK's device code) against
an in-process collector or, over gRPC, a running one, exactly as a deployment runs it. Every
engine publishes ``Result.clustering.centers`` (row-major ``k x d``, original units); the harness
labels each point by its nearest center, as for the floors, so every metric applies.

=================  ============  ======================================================================
method             campaign      what
                   kind
=================  ============  ======================================================================
``kcluster``       bitvector     kCluster: public pivots, bitwise RR at the exact Hamming bound, k-means
                                 on the debiased bit vectors, centers decoded (one round)
``mnfcm``          laplace       discrete-Laplace points, mnFCM (fuzzy c-means with the mixed-noise
                                 loss) on the server (``papers/004``, one round)
``fcm-laplace``    laplace       the same reports, plain fuzzy c-means (the loss ablation)
``ldp-kmeans``     its own       Xia et al. 2020: perturbed vectors, then ``iterations`` rounds of
                                 broadcast centers and GRR labels with debiased updates
``nettree``        its own       one-round net-tree k-means: node reports at T levels (LSH prefix tree)
                                 and one bucketized vector sum per device, weighted coreset k-means
``stemmer``        its own       Stemmer-style: heavy LSH keys, bucket means, candidate weights, k-means
                                 on the private coreset, one Lloyd round (four rounds)
=================  ============  ======================================================================

A method named after its kind ("its own": the registered kind of the method's name, ``-`` read as
``_``) runs that kind's engine; the others choose an algorithm of their kind's engine. The config
comes from :func:`ldp_collector.cli.build_campaign_config` (the kind's own ``--k``) plus the
algorithm; every other parameter is left at the engine's default (pivots per attribute, fuzzifier,
grid bits, iterations, data share; the collector's budget policy PARTITION: every device reports
once with the whole epsilon).

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
from ldp_collector.cli import build_campaign_config
from ldp_collector.kinds import KINDS, Kind
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.runner import CollectorBackend, run_campaign

from ._common import Box, Clustering, check_epsilon, check_k, check_points
from .oue_grid import population_seed

__all__ = ["METHODS", "center_campaign", "center_campaign_config"]

_BV = campaigns_pb2.BitVectorParameters
_LAPLACE = campaigns_pb2.LaplaceParameters

#: Methods that choose an algorithm of their kind's engine: method -> (kind, {parameter field: value}).
_ALGORITHMS: dict[str, tuple[str, dict[str, int]]] = {
    "kcluster": ("bitvector", {"algorithm": _BV.KMEANS}),
    "mnfcm": ("laplace", {"algorithm": _LAPLACE.MNFCM}),
    "fcm-laplace": ("laplace", {"algorithm": _LAPLACE.FCM}),
}
#: Harness method -> population-seed tag. The tags differ from every OUE floor grid (``m >= 2``) and
#: grid variant (``-1 .. -3``): distinct report ids on a shared collector.
_SEED_TAGS: dict[str, int] = {"kcluster": -10, "mnfcm": -11, "fcm-laplace": -12, "ldp-kmeans": -13, "nettree": -14,
                              "stemmer": -15}


def _method_kind(method: str) -> Kind:
    """The registered kind a method runs: its algorithm table's, or the kind it is named after."""
    return KINDS[_ALGORITHMS[method][0] if method in _ALGORITHMS else method.replace("-", "_")]


#: Harness method -> (campaign kind, population-seed tag).
METHODS: dict[str, tuple[Kind, int]] = {method: (_method_kind(method), tag) for method, tag in _SEED_TAGS.items()}


def center_campaign_config(method: str, box: Box, k: int, epsilon: float) -> campaigns_pb2.CampaignConfig:
    """The campaign of ``method`` over the public box; everything but ``k`` and the algorithm at the default."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    kind, _ = METHODS[method]
    config = build_campaign_config(kind.name, epsilon=epsilon, bounds=(box.lower.tolist(), box.upper.tolist()), k=k,
                                   description=f"benchmark: {method}")
    parameters = getattr(config, kind.name)
    for field, value in _ALGORITHMS.get(method, ("", {}))[1].items():
        setattr(parameters, field, value)
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
    run = run_campaign(backend, config_from_proto(config), points, mode="direct", quiet=True,
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
