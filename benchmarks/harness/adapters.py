"""Protocol adapters: how a clustering method enters the harness.

A protocol enters by registering **one** adapter: a small class with a ``name``, the kinds of data
it supports, its privacy model, and ``run(X, k, epsilon, seed, via_grpc) -> Clustering`` (centers
and/or labels, plus diagnostics)::

    @register_adapter
    class MyProtocol(ProtocolAdapter):
        name = "my-protocol"
        description = "one line for the tables"
        privacy = "ldp"
        data_kinds = frozenset({"nd"})
        uses_collector = True

        def run(self, x, k, epsilon, seed, via_grpc=False):
            with collector_backend(via_grpc) as backend:
                run = run_campaign(backend, config_from_proto(my_config(x, k, epsilon)), x, seed=seed, mode="direct",
                                   quiet=True)
            return Clustering(centers=centers_of(run.result))

LDP protocols talk to a collector through :func:`collector_backend`: the in-process simulator's
collector (:class:`ldp_collector.simulation.runner.InProcessCollector` over a temporary SQLite store) by
default, or with ``via_grpc`` a real collector reached over gRPC
(:class:`~ldp_collector.simulation.runner.RemoteCollector`). The runner starts one collector
(:func:`ldp_collector.server.lifecycle.start_server` on ``127.0.0.1`` port 0) and hands its address to the
worker processes (:func:`configure_remote`); used alone, an adapter starts its own.

Collector-backed protocols: the OUE grid floor (a ``HISTOGRAM`` campaign), the grid clustering
campaigns (``GRID``, AGCluster): ``ugc``, ``agc-tree`` and ``agc-iter``, the non-paper ``grid-density``, and the center-publishing
campaigns (:mod:`harness.baselines.center_campaigns`): ``kcluster`` (``BITVECTOR``), ``mnfcm`` and
``fcm-laplace`` (``LAPLACE``), ``ldp-kmeans``, ``nettree`` and ``stemmer``
(each its own kind).

Data kinds
    ``"2d"``: two-dimensional points only (the quadtree of ``papers/001``); ``"nd"``: numeric
    points of any dimension.
``epsilon``
    ``None`` for methods without a budget (``uses_epsilon = False``); ``math.inf`` asks the
    private methods for their documented no-noise bypass. A method without one
    (``noiseless_bypass = False``: the grid clusterings, whose granularity follows the noise, and
    the center campaigns, whose engines refuse ``inf``) is left out of the suites' ``inf`` column
    and refuses ``inf``.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import logging
import math
import secrets
import tempfile
from collections.abc import Iterator
from typing import ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from ldp_collector.simulation.runner import CollectorBackend

from .baselines import (
    Clustering,
    center_campaign,
    dbscan_baseline,
    density_am_kmeans,
    discrete_laplace_kmeans,
    dp_quadtree_kmeans,
    dplloyd,
    grid_clustering,
    improved_dp_kmeans,
    kmeans_plus_plus_baseline,
    oue_grid_kmeans,
    standard_kmeans,
)
from .baselines.grid import MAX_DIMENSION as GRID_MAX_DIMENSION
from .baselines.oue_grid import MAX_CELLS

__all__ = [
    "ADAPTERS",
    "Privacy",
    "ProtocolAdapter",
    "collector_backend",
    "configure_remote",
    "data_kind",
    "get_adapter",
    "register_adapter",
    "start_collector",
]

Privacy = Literal["non-private", "central-dp", "ldp"]

#: Registered adapters by name.
ADAPTERS: dict[str, type[ProtocolAdapter]] = {}


class ProtocolAdapter(abc.ABC):
    """One clustering method as the harness drives it (module docstring)."""

    #: Unique name used on the command line, in suites and in the tables.
    name: ClassVar[str]
    #: One line for the README's list of protocols.
    description: ClassVar[str]
    privacy: ClassVar[Privacy]
    #: ``"2d"`` and/or ``"nd"``.
    data_kinds: ClassVar[frozenset[str]]
    #: Whether the method spends a privacy budget (``False``: run once per data set, ``epsilon=None``).
    uses_epsilon: ClassVar[bool] = True
    #: Whether the method's reports go through a collector (and so honour ``via_grpc``).
    uses_collector: ClassVar[bool] = False
    #: Whether the method's output is centers (cost metrics apply) rather than labels only.
    has_centers: ClassVar[bool] = True
    #: Largest dimension the method handles (``None``: any).
    max_dimension: ClassVar[int | None] = None
    #: Whether ``epsilon = inf`` has a documented no-noise bypass (``False``: the suites skip ``inf``
    #: for the method, see :func:`harness.runner.build_tasks`, and ``run`` refuses it).
    noiseless_bypass: ClassVar[bool] = True

    @classmethod
    def supports_dimension(cls, d: int) -> bool:
        """Whether the method runs on ``d``-dimensional points (data kind and :attr:`max_dimension`)."""
        kinds = frozenset({"2d", "nd"}) if d == 2 else frozenset({"nd"})
        return bool(kinds & cls.data_kinds) and (cls.max_dimension is None or d <= cls.max_dimension)

    def supports(self, x: NDArray[np.float64]) -> bool:
        """Whether the method runs on ``x`` (see :meth:`supports_dimension`)."""
        return self.supports_dimension(int(x.shape[1]))

    @abc.abstractmethod
    def run(self, x: NDArray[np.float64], k: int, epsilon: float | None, seed: int,
            via_grpc: bool = False) -> Clustering:
        """Cluster ``x`` into ``k`` clusters with budget ``epsilon`` (``inf``: no-noise bypass)."""


def data_kind(x: NDArray[np.float64]) -> frozenset[str]:
    """The data kinds ``x`` belongs to: always ``"nd"``, plus ``"2d"`` for two-dimensional points."""
    return frozenset({"2d", "nd"}) if x.shape[1] == 2 else frozenset({"nd"})


def register_adapter(cls: type[ProtocolAdapter]) -> type[ProtocolAdapter]:
    """Class decorator: add ``cls`` to :data:`ADAPTERS` (names must be unique)."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__name__} needs a non-empty class attribute 'name'")
    if name in ADAPTERS and ADAPTERS[name] is not cls:
        raise ValueError(f"two adapters named {name!r}: {ADAPTERS[name].__name__} and {cls.__name__}")
    if not cls.data_kinds or not cls.data_kinds <= {"2d", "nd"}:
        raise ValueError(f"{cls.__name__}.data_kinds must be a non-empty subset of {{'2d', 'nd'}}")
    ADAPTERS[name] = cls
    return cls


def get_adapter(name: str) -> ProtocolAdapter:
    """A fresh instance of the adapter ``name``."""
    try:
        return ADAPTERS[name]()
    except KeyError:
        raise ValueError(f"unknown protocol {name!r}; registered: {', '.join(sorted(ADAPTERS))}") from None


def _epsilon(epsilon: float | None, name: str) -> float:
    if epsilon is None:
        raise ValueError(f"{name} spends a privacy budget: epsilon must be a number or math.inf, got None")
    return float(epsilon)


# -- collectors --------------------------------------------------------------------------------------

_remote: tuple[str, str] | None = None
_own_server: list[object] = []


def configure_remote(address: str | None, token: str | None) -> None:
    """Route ``via_grpc`` runs of this process to the collector at ``address`` (``None``: start one on demand)."""
    global _remote
    _remote = None if address is None else (address, token or "")


@contextlib.contextmanager
def start_collector() -> Iterator[tuple[str, str]]:
    """Start a real collector on ``127.0.0.1`` port 0 with a fresh data directory and operator token.

    Yields ``(address, operator_token)``; the server and its directory are removed afterwards.
    """
    from ldp_collector.config import CollectorConfig
    from ldp_collector.server.lifecycle import start_server

    token = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="ldp-bench-collector-") as data_dir:
        logging.getLogger("ldp_collector").setLevel(logging.WARNING)
        config = CollectorConfig(listen="127.0.0.1:0", data_dir=data_dir, operator_token=token, log_format="text",
                                 log_level="WARNING")
        with start_server(config) as server:
            yield server.address, token


def _remote_target() -> tuple[str, str]:
    global _remote
    if _remote is None:
        stack = contextlib.ExitStack()
        _remote = stack.enter_context(start_collector())
        _own_server.append(stack)
        atexit.register(stack.close)
    return _remote


@contextlib.contextmanager
def collector_backend(via_grpc: bool) -> Iterator[CollectorBackend]:
    """A collector for one campaign run: in-process (fresh SQLite store) or over gRPC (module docstring)."""
    if via_grpc:
        from ldp_collector.simulation.runner import RemoteCollector

        address, token = _remote_target()
        with RemoteCollector(address, operator_token=token or None, packed=True) as remote:
            yield remote
        return
    from ldp_collector.core import Collector
    from ldp_collector.simulation.runner import InProcessCollector
    from ldp_collector.storage import open_store

    with tempfile.TemporaryDirectory(prefix="ldp-bench-") as data_dir:
        store = open_store(data_dir)
        try:
            yield InProcessCollector(Collector(store), seed=0)
        finally:
            store.close()


# -- the baselines ----------------------------------------------------------------------------------

@register_adapter
class KMeansPlusPlus(ProtocolAdapter):
    name = "kmeans++"
    description = "non-private k-means++ seeding + Lloyd, best of 5 (trusted curator, no noise)"
    privacy = "non-private"
    data_kinds = frozenset({"nd"})
    uses_epsilon = False

    def run(self, x: NDArray[np.float64], k: int, epsilon: float | None, seed: int,
            via_grpc: bool = False) -> Clustering:
        return kmeans_plus_plus_baseline(x, k, seed=seed)


@register_adapter
class StandardKMeans(ProtocolAdapter):
    name = "kmeans-random"
    description = "non-private Lloyd from k random data points, one run (papers/003's 'standard K-means')"
    privacy = "non-private"
    data_kinds = frozenset({"nd"})
    uses_epsilon = False

    def run(self, x: NDArray[np.float64], k: int, epsilon: float | None, seed: int,
            via_grpc: bool = False) -> Clustering:
        return standard_kmeans(x, k, seed=seed)


@register_adapter
class DBSCANBaseline(ProtocolAdapter):
    name = "dbscan"
    description = "non-private DBSCAN (scikit-learn), min_samples = 2d, eps at the 0.9 quantile of k-distances"
    privacy = "non-private"
    data_kinds = frozenset({"nd"})
    uses_epsilon = False
    has_centers = False

    def run(self, x: NDArray[np.float64], k: int, epsilon: float | None, seed: int,
            via_grpc: bool = False) -> Clustering:
        return dbscan_baseline(x, seed=seed)


@register_adapter
class DensityAMKMeans(ProtocolAdapter):
    name = "density-am-kmeans"
    description = "non-private density/AM-initialised k-means (papers/003 Algorithm 2)"
    privacy = "non-private"
    data_kinds = frozenset({"nd"})
    uses_epsilon = False

    def run(self, x: NDArray[np.float64], k: int, epsilon: float | None, seed: int,
            via_grpc: bool = False) -> Clustering:
        return density_am_kmeans(x, k, seed=seed)


@register_adapter
class DPLloyd(ProtocolAdapter):
    name = "dplloyd"
    description = "DPLloyd: Laplace on per-cluster counts and sums, 5 iterations, uniform budget (central DP)"
    privacy = "central-dp"
    data_kinds = frozenset({"nd"})

    def run(self, x: NDArray[np.float64], k: int, epsilon: float | None, seed: int,
            via_grpc: bool = False) -> Clustering:
        return dplloyd(x, k, _epsilon(epsilon, self.name), seed=seed)


@register_adapter
class DPQuadtreeKMeans(ProtocolAdapter):
    name = "dpqt-kmeans"
    description = "DP quadtree + weighted k-means on noisy leaf counts (papers/001, central DP, 2-D)"
    privacy = "central-dp"
    data_kinds = frozenset({"2d"})

    def run(self, x: NDArray[np.float64], k: int, epsilon: float | None, seed: int,
            via_grpc: bool = False) -> Clustering:
        return dp_quadtree_kmeans(x, k, _epsilon(epsilon, self.name), seed=seed)


@register_adapter
class ImprovedDPKMeans(ProtocolAdapter):
    name = "improved-dp-kmeans"
    description = ("density/AM initialisation + DP Lloyd with eq. 12 budget (papers/003 Algorithm 3; "
                   "its initialisation reads raw data, as published)")
    privacy = "central-dp"
    data_kinds = frozenset({"nd"})

    def run(self, x: NDArray[np.float64], k: int, epsilon: float | None, seed: int,
            via_grpc: bool = False) -> Clustering:
        return improved_dp_kmeans(x, k, _epsilon(epsilon, self.name), seed=seed)


@register_adapter
class DiscreteLaplaceFloor(ProtocolAdapter):
    name = "ldp-laplace-points"
    description = ("LDP floor: SDK discrete-Laplace point per device + k-means on the noisy points "
                   "(no collector: the laplace campaign kind is the collector-backed version)")
    privacy = "ldp"
    data_kinds = frozenset({"nd"})

    def run(self, x: NDArray[np.float64], k: int, epsilon: float | None, seed: int,
            via_grpc: bool = False) -> Clustering:
        return discrete_laplace_kmeans(x, k, _epsilon(epsilon, self.name), seed=seed)


@register_adapter
class OUEGridFloor(ProtocolAdapter):
    name = "ldp-oue-grid"
    description = "LDP floor: one OUE grid histogram campaign through the collector + weighted k-means"
    privacy = "ldp"
    data_kinds = frozenset({"nd"})
    uses_collector = True
    #: A grid of at least 2 cells per dimension within the floor's cell cap.
    max_dimension = int(math.log2(MAX_CELLS))

    def run(self, x: NDArray[np.float64], k: int, epsilon: float | None, seed: int,
            via_grpc: bool = False) -> Clustering:
        eps = _epsilon(epsilon, self.name)
        if math.isinf(eps):
            out = oue_grid_kmeans(x, k, eps, seed=seed, backend=None)
        else:
            with collector_backend(via_grpc) as backend:
                out = oue_grid_kmeans(x, k, eps, seed=seed, backend=backend)
        out.diagnostics["via_grpc"] = float(via_grpc and not math.isinf(eps))
        return out


class _GridClustering(ProtocolAdapter):
    """The collector's ``GRID`` campaigns (:mod:`harness.baselines.grid`): labels, no centers, no ``inf`` bypass."""

    privacy = "ldp"
    data_kinds = frozenset({"nd"})
    uses_collector = True
    has_centers = False
    noiseless_bypass = False
    max_dimension = GRID_MAX_DIMENSION
    #: The engine's variant (:data:`harness.baselines.grid.VARIANTS`).
    variant: ClassVar[str]

    def run(self, x: NDArray[np.float64], k: int, epsilon: float | None, seed: int,
            via_grpc: bool = False) -> Clustering:
        eps = _epsilon(epsilon, self.name)
        if math.isinf(eps):
            raise ValueError(f"{self.name} has no no-noise bypass (epsilon = inf): its grid follows the noise")
        with collector_backend(via_grpc) as backend:
            out = grid_clustering(x, eps, variant=self.variant, seed=seed, backend=backend)
        out.diagnostics["via_grpc"] = float(via_grpc)
        return out


@register_adapter
class UniformGridClustering(_GridClustering):
    name = "ugc"
    description = "LDP grid clustering, uniform grid (UGC): calibrate, then one aggregation round (papers/002)"
    variant = "uniform"


@register_adapter
class TreeAdaptiveGridClustering(_GridClustering):
    name = "agc-tree"
    description = "LDP grid clustering with feedback, grid tree (AGCluster TreeAdaptive, papers/002)"
    variant = "tree"


@register_adapter
class IterativeAdaptiveGridClustering(_GridClustering):
    name = "agc-iter"
    description = "LDP grid clustering with feedback, merge/split rounds (AGCluster IterAdaptive, papers/002)"
    variant = "iterative"


@register_adapter
class DensityGridClustering(_GridClustering):
    name = "grid-density"
    description = ("LDP grid clustering, noise-derived density modes on one uniform grid (the grid kind's DENSITY "
                   "variant; not in papers/002)")
    variant = "density"


class _CenterCampaign(ProtocolAdapter):
    """A center-publishing campaign (:mod:`harness.baselines.center_campaigns`): centers, no ``inf`` bypass."""

    privacy = "ldp"
    data_kinds = frozenset({"nd"})
    uses_collector = True
    noiseless_bypass = False
    #: The harness method (:data:`harness.baselines.center_campaigns.METHODS`).
    method: ClassVar[str]

    def run(self, x: NDArray[np.float64], k: int, epsilon: float | None, seed: int,
            via_grpc: bool = False) -> Clustering:
        eps = _epsilon(epsilon, self.name)
        if math.isinf(eps):
            raise ValueError(f"{self.name} has no no-noise bypass (epsilon = inf): its engine refuses it")
        with collector_backend(via_grpc) as backend:
            out = center_campaign(x, k, eps, method=self.method, seed=seed, backend=backend)
        out.diagnostics["via_grpc"] = float(via_grpc)
        return out


@register_adapter
class KCluster(_CenterCampaign):
    name = "kcluster"
    description = ("LDP kCluster: one BITVECTOR campaign (public pivots, bitwise RR at the Hamming bound), "
                   "k-means on the debiased bit vectors, centers decoded")
    method = "kcluster"


@register_adapter
class MNFCMLaplace(_CenterCampaign):
    name = "mnfcm"
    description = "LDP discrete-Laplace points, one LAPLACE campaign, mnFCM (mixed-noise fuzzy c-means) on the server"
    method = "mnfcm"


@register_adapter
class FCMLaplace(_CenterCampaign):
    name = "fcm-laplace"
    description = "LDP discrete-Laplace points, one LAPLACE campaign, plain fuzzy c-means (mnFCM's loss ablation)"
    method = "fcm-laplace"


@register_adapter
class LDPKMeans(_CenterCampaign):
    name = "ldp-kmeans"
    description = ("LDP interactive k-means (Xia et al. 2020): one campaign of its kind, perturbed vectors, then "
                   "rounds of broadcast centers and GRR labels (default iterations)")
    method = "ldp-kmeans"


@register_adapter
class NetTree(_CenterCampaign):
    name = "nettree"
    description = ("LDP one-round net-tree k-means: one NETTREE campaign (node reports at T tree levels and one "
                   "bucketized vector sum per device), weighted coreset k-means")
    method = "nettree"


@register_adapter
class Stemmer(_CenterCampaign):
    name = "stemmer"
    description = ("LDP Stemmer-style k-means: one STEMMER campaign (heavy LSH keys, bucket means, candidate "
                   "weights, k-means on the private coreset, one Lloyd round)")
    method = "stemmer"
