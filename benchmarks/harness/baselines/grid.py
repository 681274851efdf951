"""The collector's grid clustering (``GRID`` campaigns, AGCluster, ``papers/002``) as a harness method.

Not a baseline but the product's own protocol: one ``GRID`` campaign over the public box, run by
the in-process simulator (:func:`ldp_collector.simulation.runner.run_campaign`, the SDK's device code)
against an in-process collector or, over gRPC, a running one, exactly as a deployment runs it.
The engine (:mod:`ldp_collector.kinds.grid`) picks the granularity from a calibration round,
refines the grid (``variant``: none for UGC, the grid tree for TreeAdaptive, merge/split rounds
for IterAdaptive) and publishes a cell -> cluster map; every point is then labelled with its cell's
cluster exactly as a device labels itself (:meth:`ldp_client.clusters.CellClusterModel.label`,
``-1`` = noise). The engine's defaults apply (budget policy PARTITION: every device reports once
with the whole epsilon; granularity rule CONSISTENT; at most 4096 cells). ``k`` is not an input:
the grid finds its own number of clusters, and there are no centers, so the cost metrics do not
apply (ARI, NMI, F-measure ... do).

``epsilon = inf``
    No bypass: the granularity rule sets the cell side from the oracle's noise, which vanishes at
    epsilon = inf (the side goes to 0), and the SDK has no mechanism with infinite epsilon.
    :func:`grid_clustering` refuses it, and the harness leaves the grid protocols out of the
    suites' ``inf`` column (``ProtocolAdapter.noiseless_bypass``).
"""

from __future__ import annotations

import math

from numpy.typing import ArrayLike

from ldp.v1 import campaigns_pb2
from ldp_client.clusters import CellClusterModel
from ldp_collector.cli import build_campaign_config
from ldp_collector.kinds import KINDS
from ldp_collector.kinds.grid import DEFAULT_MAX_CELLS
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.evaluation import cell_labels
from ldp_collector.simulation.population import AUTO_DEVICE_LIMIT
from ldp_collector.simulation.runner import CollectorBackend, run_campaign

from ._common import Box, Clustering, check_epsilon, check_points
from .oue_grid import population_seed

__all__ = ["MAX_DIMENSION", "VARIANTS", "grid_clustering", "grid_config"]

#: Harness names of the engine's variants: the grid kind's ``--variant`` choices (name -> enum number).
VARIANTS: dict[str, int] = next(dict(param.choices) for param in KINDS["grid"].cli.params if param.flag == "--variant")
#: Largest dimension the engine's default cell cap allows (2 cells per dimension at least).
MAX_DIMENSION = int(math.log2(DEFAULT_MAX_CELLS))


def grid_config(box: Box, epsilon: float, variant: str) -> campaigns_pb2.CampaignConfig:
    """The ``GRID`` campaign over the public box; everything but the variant at the engine's default."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    return build_campaign_config("grid", epsilon=epsilon, bounds=(box.lower.tolist(), box.upper.tolist()),
                                 variant=variant, description=f"benchmark: grid clustering ({variant})")


def grid_clustering(x: ArrayLike, epsilon: float, *, variant: str, seed: int,
                    backend: CollectorBackend) -> Clustering:
    """One grid campaign through ``backend``; labels from the published cell map (module docstring).

    Returns
    -------
    Clustering
        ``labels`` (one per point, ``-1`` = noise), ``cell_map`` (the published
        :class:`~ldp_client.clusters.CellClusterModel`) and the campaign's diagnostics (every round's, from the result)
        plus its traffic.

    Raises
    ------
    ValueError
        ``epsilon = inf`` (no bypass), a dimension above :data:`MAX_DIMENSION`, or an unknown variant.
    RuntimeError
        The collector did not accept every report.
    """
    points = check_points(x)
    epsilon = check_epsilon(epsilon)
    if math.isinf(epsilon):
        raise ValueError("grid clustering has no no-noise bypass: its granularity rule derives the cell side from "
                         "the oracle's noise (epsilon = inf gives side 0); run it at a finite epsilon")
    d = points.shape[1]
    if d > MAX_DIMENSION:
        raise ValueError(f"a grid of 2 cells per dimension has 2^{d} cells, more than the engine's {DEFAULT_MAX_CELLS}: "
                         f"grid clustering handles d <= {MAX_DIMENSION}")
    box = Box.of(points)
    config = grid_config(box, epsilon, variant)
    # A tag no OUE floor grid uses (m >= 2): the grid campaigns' report ids differ from the floor's.
    # Direct (per-device SDK steps) up to the simulator's device limit, so the recorded smoke runs keep their
    # draws; the vectorized reports above it (same distribution, pinned by the simulator's two-sample tests).
    mode = "direct" if len(points) <= AUTO_DEVICE_LIMIT else "vector"
    run = run_campaign(backend, config_from_proto(config), points, mode=mode, quiet=True,
                       seed=population_seed(seed, points, epsilon, -int(VARIANTS[variant])))
    stats = run.stats
    if stats.accepted != stats.reports_sent:
        raise RuntimeError(
            f"the collector accepted {stats.accepted} of {stats.reports_sent} reports ({stats.duplicates} duplicates, "
            f"{stats.rejected} rejected: {stats.rejection_reasons}); the clustering would not be the protocol's")
    model = run.result.label_model()
    if not isinstance(model, CellClusterModel):
        raise RuntimeError("the grid campaign published centers, not a cell map")
    labels = cell_labels(model, points)  # the devices' own labelling, on arrays
    diagnostics = {key: float(value) for key, value in run.result.diagnostics.items()}
    diagnostics.update({"reports": float(stats.reports_sent), "accepted": float(stats.accepted),
                        "rounds": float(stats.rounds), "campaign_seconds": stats.wall_time_s,
                        "epsilon_per_device": stats.epsilon_per_device})
    return Clustering(centers=None, labels=labels, diagnostics=diagnostics, cell_map=model)
