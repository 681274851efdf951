"""NETTREE campaigns: one-round net-tree k-means (Chang, Ghazi, Kumar, Manurangsi 2021; DESIGN.md §7.4).

One message per device, no feedback round: the protocol for fleets where a second contact is
expensive. Where it is affordable, ``refinement_share`` holds a share of the devices back for one
Lloyd round (below). The math lives in :mod:`ldp_collector.estimation.net_tree`; this module turns a
campaign config into the round and the closed round into centers.

The round
    ``T = depth`` equal groups. The device of group ``l - 1`` sends one report of two components:

    1. its level-``l`` node (SimHash prefix of ``l b`` bits, or the level-``l`` cell of a
       randomly shifted dyadic grid, both over the optionally JL-projected centred point) with
       the variance-optimal frequency oracle for ``2^(l b)`` values at ``node_share * epsilon``;
    2. the bucketized vector ``(2t - 1, 1)`` of its point in the *original* space, bucketed by its
       depth-``T`` node, at the remaining epsilon, with the SDK's box, l2-ball or PrivUnit
       randomizer, whichever adds the least error per report at ``d + 1`` dimensions
       (:func:`~ldp_collector.kinds._lsh.vector_shape`), or the one ``vector_shape`` names.

    Sequential composition within the report: each device spends exactly epsilon, once.

The server step
    Grow the tree top-down (every tested node's count scaled to the population; keep the nodes
    above ``max(z sigma, n / (4 k))``; test the kept nodes' children at the next level), take the
    kept depth-``T`` nodes as leaves, estimate each leaf's vector sum, and cluster the weighted
    coreset (:func:`~ldp_collector.estimation.net_tree.coreset_centers`). With
    ``cluster_in_projected_space`` (the paper-faithful variant) the leaves are clustered by their
    positions in the node space (shifted-grid cell centres; for SimHash, which has no cell
    geometry, by their representatives projected with the public JL matrix) and the original-space
    sums pooled per cluster.

The refinement round (optional)
    With ``refinement_share = s``, a group of ``s n`` devices (group ``T``) skips round 1; round 2
    sends it the round-1 centers, and each of its devices reports, once and with the whole epsilon,
    the bucketized vector of its point bucketed by its nearest center. Each center moves toward the
    mean of the devices that chose it when their count is significant, by the James-Stein share of
    the step its noise allows (:func:`~ldp_collector.estimation.vector_sum.lloyd_move`). This removes what the tree's
    buckets get wrong (a leaf holding parts of two clusters drags both centers; a small cluster
    pooled with a large one) at the cost of the round-1 devices it takes: the center noise is
    about ``k^2 M(eps) / (s n)`` against ``k^2 M(eps_vector) / n`` for the one-round vector.

A public seed pool
    With ``seed_pool_size`` S > 0 the node levels whose oracle is local hashing (more than 1024
    nodes at that level) take their seeds from one public pool of S seeds (``docs/protocol.md``
    §14; round 1's key, :func:`~ldp_collector.kinds.common.seed_pool_key`). Their accumulators keep
    S x g counts at ingestion, so growing the tree reads no report: each level's candidate set
    costs S x candidates hashes from the counts instead of a support pass of n_l x candidates
    hashes, and the round's only pass over the reports is the leaf sums'. The pool adds
    ``sum_x n_x (n_x - 1) / ((g - 1) S)`` to a node count's variance (§14.6, x over the level's
    other nodes); the node thresholds use the level's zero-count standard error, which includes it
    (estimated from the same counts), so a small pool costs detection power, never false
    positives. The extra term is at most 10 % of the per-report variance for S from
    :func:`ldp_client.mechanisms.local_hashing.seed_pool_size_for` (the level's reports, and the
    concentration of its nodes: about the largest cluster's share). A campaign none of whose
    levels uses local hashing refuses a pool at creation.

Diagnostics
    Nodes tested / kept / threshold per level, the detection signal-to-noise ratio (DESIGN §7.4),
    the leaves (coreset size), the coverage (leaf mass / n), the vector randomizer's variance and
    the resulting center-error floor ``k sqrt(V / n)`` per coordinate (``[-1, 1]`` units), and the
    result's noise floor in the data's units (:mod:`ldp_collector.estimation.center_floor`): each
    center's vector noise ``L n V / w^2`` (``L`` leaves pooled, ``w`` their count).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.budget import split_epsilon
from ldp_client.encoders.base import Encoder
from ldp_client.encoders.bucketed import BucketedVectorEncoder
from ldp_client.encoders.lsh import ShiftedGridEncoder, SimHashEncoder
from ldp_client.encoders.nearest import NearestCandidateEncoder
from ldp_client.encoders.projection import RandomProjection
from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import LocalHashingParams, choose_frequency_oracle
from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams
from ldp_client.spec import Component, GroupTask, RoundSpec

from ..errors import InvalidArgumentError
from ..estimation.accumulators import component_params_from_spec, make_accumulate_fn
from ..estimation.center_floor import FLOOR_CENTER_ERROR, FLOOR_EXCESS_COST, floor_diagnostics, unit_to_data_variance
from ..estimation.net_tree import (
    LevelEstimator,
    NetTreeLayout,
    TreeGrowth,
    center_error_floor,
    combine_center_estimates,
    coreset_centers,
    detection_sigma,
    grid_node_positions,
    grow_tree,
    node_epsilon_needed,
    shifted_cell_centres,
    signal_to_noise,
)
from ..estimation.vector_sum import BucketSumAccumulator, lloyd_move
from ..model import BudgetPolicy, CampaignConfig, CampaignState, Clustering, Result
from ..storage.base import AccumulateFn
from ._lsh import (
    VECTOR_SHAPE_PARAM,
    VectorShapeParam,
    check_vector_shape,
    exact_counts,
    exact_sums,
    grow_best_effort,
    lsh_nodes,
    vector_shape,
)
from .base import (
    K_PARAM,
    NUMERIC,
    CampaignEngine,
    CliParam,
    Kind,
    KindCli,
    KindParams,
    RoundOutcome,
    RoundPlan,
    RoundReports,
    load_state,
    numeric_domain,
    pack_state,
)
from .common import (
    DEFAULT_CONFIDENCE,
    MAX_K,
    MAX_PAYLOAD_BITS,
    MIN_K,
    ProtoEnum,
    allowed_oracles,
    campaign_seed,
    check_report_epsilon,
    check_seed_pool_size,
    with_seed_pool,
)
from .histogram import aggregator_for, round_aggregators

__all__ = [
    "KIND",
    "DEFAULT_DEPTH",
    "DEFAULT_FALSE_POSITIVE_RATE",
    "DEFAULT_NODE_SHARE",
    "MAX_K",
    "NetTreeEngine",
    "NetTreeParams",
    "NodeMap",
    "default_bits_per_level",
    "leaf_nodes",
    "noiseless_outcome",
]

DEFAULT_DEPTH = 4
MAX_DEPTH = 16
DEFAULT_NODE_SHARE = 0.5
#: Smallest node share ``expected_reports`` may plan (a tree starved below it cannot be told from noise
#: by the population estimate the plan rests on).
MIN_NODE_SHARE = 0.05
MAX_EXPECTED_REPORTS = 10**12
MAX_REFINEMENT_SHARE = 0.9
#: Integer group weights are shares of this total (``RoundSpec.group_weights``).
_WEIGHT_TOTAL = 1_000_000
DEFAULT_FALSE_POSITIVE_RATE = 0.05
#: Largest projected dimension (DESIGN §7.4: d' <= 16); the shifted grid allows at most 8 (2^8 children).
MAX_PROJECTION = 16
MAX_GRID_DIMENSION = 8
DEFAULT_GRID_DIMENSION = 4
#: Default node map: a shifted grid over the unprojected space up to this dimension, SimHash above.
#: SimHash splits by angle about the box centre only, which cannot separate clusters lying in one
#: direction (in 2-D, a cluster behind another); a grid of 2^d children per node is cheap for small d.
GRID_DEFAULT_MAX_DIMENSION = 4
MAX_NODES = 4096
MAX_NODE_BITS = 62
#: The frequency oracle's payload limit (bits), as for the other tree protocols.
#: Keep threshold floors (``estimation.net_tree.select_nodes``): a node holds at least
#: ``n / (MASS_FRACTION k)`` devices and ``VECTOR_Z`` times its sum's noise ``sqrt(n M)``.
MASS_FRACTION = 64.0
VECTOR_Z = 2.0
#: Restarts of the coreset k-means.
CORESET_RESTARTS = 10


def default_bits_per_level(k: int, depth: int) -> int:
    """SimHash bits per level: ``ceil((log2 k + 5) / T)``, so depth-``T`` nodes number ``~32 k`` at most."""
    return max(1, math.ceil((math.log2(k) + 5.0) / depth))


class NodeMap(ProtoEnum):
    """``ldp.v1.NetTreeParameters.NodeMap``: how a point maps to its tree nodes."""

    NODE_MAP_UNSPECIFIED = 0
    SIMHASH = 1
    SHIFTED_GRID = 2


@dataclass(frozen=True, kw_only=True)
class NetTreeParams(KindParams):
    """``ldp.v1.NetTreeParameters``; :meth:`resolve` fills every field but ``cluster_in_projected_space``.

    Attributes
    ----------
    k : int
        Number of clusters, in [2, 256] (required).
    projection_dimension : int
        SimHash: ``min(d, 16)``; shifted grid: ``min(d, 4)``, at most 8 (0 = default).
    depth : int
        Tree depth, in [1, 16] (0 = 4).
    node_map : NodeMap
        UNSPECIFIED: SHIFTED_GRID for ``d <= 4``, else SIMHASH.
    max_nodes_per_level : int
        0 = ``max(64, 8 k)``.
    cluster_in_projected_space : bool
        Cluster the leaves in the projected space instead of the original one.
    bits_per_level : int
        SimHash hyperplanes per level (0 = :func:`default_bits_per_level`); the shifted grid's is
        ``projection_dimension``.
    node_share : float
        Share of epsilon spent on the node report, in (0, 1) (0 = from ``expected_reports``, else 0.5).
    false_positive_rate : float
        Family-wise false-positive rate of the node thresholds per level, in (0, 1) (0 = 0.05).
    expected_reports : int
        Devices the operator expects to report (0 = unknown). With ``node_share`` unset, the node
        share is the smallest at which the tree detects every cluster at that population
        (:func:`~ldp_collector.estimation.net_tree.node_epsilon_needed` over epsilon), between
        ``MIN_NODE_SHARE`` and 0.5: the vector, whose noise sets the centers' floor, gets the rest.
    refinement_share : float
        Share of the devices held back for a Lloyd refinement round, in [0, MAX_REFINEMENT_SHARE]
        (0 = no refinement: one round). They report once, in round 2, with the whole epsilon: their
        point's bucketized vector bucketed by its nearest round-1 center (PARTITION only).
    vector_shape : VectorShapeParam
        The bucketized vector's randomizer: L2_BALL, BOX or PRIVUNIT (UNSPECIFIED: the one of least
        error per report, :func:`~ldp_collector.kinds._lsh.vector_shape`, left unspecified by :meth:`resolve`).
    seed_pool_size : int
        The local-hashing node levels' public seed pool (``docs/protocol.md`` §14; 0 = per-report seeds).
    """

    k: int = 0
    projection_dimension: int = 0
    depth: int = 0
    node_map: NodeMap = NodeMap.NODE_MAP_UNSPECIFIED
    max_nodes_per_level: int = 0
    cluster_in_projected_space: bool = False
    bits_per_level: int = 0
    node_share: float = 0.0
    false_positive_rate: float = 0.0
    expected_reports: int = 0
    refinement_share: float = 0.0
    vector_shape: VectorShapeParam = VectorShapeParam.SHAPE_UNSPECIFIED
    seed_pool_size: int = 0

    def resolve(self, config: CampaignConfig) -> NetTreeParams:
        """The parameters with every default filled in (see :meth:`KindParams.resolve`).

        Raises
        ------
        InvalidArgumentError
            A categorical domain, epsilon outside (0, 20], or a parameter out of range.
        """
        d = numeric_domain(config, "nettree").dimension
        check_report_epsilon(config.epsilon, "a nettree campaign")
        k = self.k
        if not MIN_K <= k <= MAX_K:
            raise InvalidArgumentError(f"nettree.k must be in [{MIN_K}, {MAX_K}], got {k}")
        depth = self.depth or DEFAULT_DEPTH
        if not 1 <= depth <= MAX_DEPTH:
            raise InvalidArgumentError(f"nettree.depth must be in [1, {MAX_DEPTH}] (0 = {DEFAULT_DEPTH}), got {depth}")
        node_map = self.node_map or (NodeMap.SHIFTED_GRID if d <= GRID_DEFAULT_MAX_DIMENSION else NodeMap.SIMHASH)
        if node_map not in (NodeMap.SIMHASH, NodeMap.SHIFTED_GRID):
            raise InvalidArgumentError(f"nettree.node_map {node_map} is not SIMHASH or SHIFTED_GRID")
        grid = node_map == NodeMap.SHIFTED_GRID
        projection_dimension = self.projection_dimension or min(d, DEFAULT_GRID_DIMENSION if grid else MAX_PROJECTION)
        top = MAX_GRID_DIMENSION if grid else MAX_PROJECTION
        if not 1 <= projection_dimension <= min(d, top):
            raise InvalidArgumentError(
                f"nettree.projection_dimension must be in [1, min(d, {top})] = [1, {min(d, top)}] for "
                f"{'SHIFTED_GRID' if grid else 'SIMHASH'}, got {projection_dimension}")
        if grid:
            if self.bits_per_level not in (0, projection_dimension):
                raise InvalidArgumentError("nettree.bits_per_level applies to SIMHASH only (a shifted-grid node has "
                                           "2^projection_dimension children)")
            bits_per_level = projection_dimension
        else:
            bits_per_level = self.bits_per_level or default_bits_per_level(k, depth)
        if depth * bits_per_level > MAX_NODE_BITS:
            raise InvalidArgumentError(
                f"nettree: depth x bits per level must be at most {MAX_NODE_BITS} (the oracles' largest domain is "
                f"2^63), got "
                f"{depth} x {bits_per_level}")
        max_nodes_per_level = self.max_nodes_per_level or max(64, 8 * k)
        if not 1 <= max_nodes_per_level <= MAX_NODES:
            raise InvalidArgumentError(f"nettree.max_nodes_per_level must be in [1, {MAX_NODES}], got "
                                       f"{max_nodes_per_level}")
        false_positive_rate = self.false_positive_rate or DEFAULT_FALSE_POSITIVE_RATE
        if not (math.isfinite(false_positive_rate) and 0.0 < false_positive_rate < 1.0):
            raise InvalidArgumentError(f"nettree.false_positive_rate must be in (0, 1), got {false_positive_rate!r}")
        if not 0 <= self.expected_reports <= MAX_EXPECTED_REPORTS:
            raise InvalidArgumentError(f"nettree.expected_reports must be in [0, {MAX_EXPECTED_REPORTS}], got "
                                       f"{self.expected_reports}")
        refinement_share = self.refinement_share
        if not (math.isfinite(refinement_share) and 0.0 <= refinement_share <= MAX_REFINEMENT_SHARE):
            raise InvalidArgumentError(f"nettree.refinement_share must be in [0, {MAX_REFINEMENT_SHARE:g}] (0 = no "
                                       f"refinement round), got {refinement_share!r}")
        if refinement_share and config.budget_policy == BudgetPolicy.SPLIT:
            raise InvalidArgumentError("nettree.refinement_share needs the PARTITION budget policy: the refinement "
                                       "round's devices are fresh ones, each reporting once")
        node_share = self.node_share or self.planned_node_share(
            config.epsilon, k, NetTreeLayout(levels=depth, child_bits=bits_per_level), false_positive_rate)
        if not (math.isfinite(node_share) and 0.0 < node_share < 1.0):
            raise InvalidArgumentError(f"nettree.node_share must be in (0, 1), got {node_share!r}")
        check_vector_shape(self.vector_shape, "nettree")
        check_seed_pool_size(self.seed_pool_size, config, "nettree.seed_pool_size")
        return replace(self, depth=depth, node_map=node_map, projection_dimension=projection_dimension,
                       bits_per_level=bits_per_level, max_nodes_per_level=max_nodes_per_level,
                       node_share=node_share, false_positive_rate=false_positive_rate)

    def planned_node_share(self, epsilon: float, k: int, layout: NetTreeLayout, false_positive_rate: float) -> float:
        """The node share for ``expected_reports`` devices (0.5 when unknown): what the tree needs, capped at 0.5."""
        if not self.expected_reports:
            return DEFAULT_NODE_SHARE
        tree_reports = max(1.0, float(self.expected_reports) * (1.0 - self.refinement_share))
        needed = node_epsilon_needed(tree_reports, k, layout, false_positive_rate) / epsilon
        return min(DEFAULT_NODE_SHARE, max(MIN_NODE_SHARE, needed))


class NetTreeEngine(CampaignEngine):
    """Engine of ``NETTREE`` campaigns (module docstring).

    Parameters
    ----------
    campaign_id : str
    config : ldp.v1.CampaignConfig
        Validated by :func:`ldp_collector.campaigns.prepare_campaign`: a numeric domain.
    params : NetTreeParams
        Resolved (:meth:`NetTreeParams.resolve`): ``depth`` (4), ``node_map`` (SHIFTED_GRID for
        ``d <= 4``, else SIMHASH), ``projection_dimension``, ``bits_per_level``,
        ``max_nodes_per_level`` (``max(64, 8 k)``), ``node_share`` (0.5) and ``false_positive_rate``
        (0.05) filled in.

    Raises
    ------
    InvalidArgumentError
        An encoder or mechanism the SDK refuses.
    """

    params: NetTreeParams

    def __init__(self, campaign_id: str, config: CampaignConfig, params: NetTreeParams) -> None:
        super().__init__(campaign_id, config, params)
        self.domain = numeric_domain(config, "nettree")
        d = self.dimension = self.domain.dimension
        p = params
        self.layout = NetTreeLayout(levels=p.depth, child_bits=p.bits_per_level)
        # Shares whose exact sum is at most epsilon: the device's ledger compares exactly.
        self.node_epsilon, self.vector_epsilon = split_epsilon(config.epsilon, [p.node_share, 1.0 - p.node_share])
        seed = self._seed()
        self.projection = (None if p.projection_dimension == d
                           else RandomProjection(input_dimension=d, output_dimension=p.projection_dimension,
                                                 seed=seed ^ 0x5A5A))
        try:
            self.node_encoders = tuple(self._node_encoder(level, seed) for level in range(1, self.layout.levels + 1))
            leaf = self.node_encoders[-1]
            shape = vector_shape(d + 1, self.vector_epsilon, p.vector_shape)
            self.vector = Component(
                encoder=BucketedVectorEncoder(domain=self.domain,
                                              simhash=leaf if isinstance(leaf, SimHashEncoder) else None,
                                              shifted_grid=leaf if isinstance(leaf, ShiftedGridEncoder) else None),
                mechanism=BucketizedVectorParams(bucket_bits=self.layout.bits(self.layout.levels), dimension=d + 1,
                                                 epsilon=self.vector_epsilon, shape=shape))
            self.node_components = tuple(
                Component(encoder=enc, mechanism=with_seed_pool(
                    choose_frequency_oracle(1 << self.layout.bits(level), self.node_epsilon, MAX_PAYLOAD_BITS,
                                            oracles=allowed_oracles(config)),
                    config, 1, p.seed_pool_size, "nettree"))
                for level, enc in enumerate(self.node_encoders, start=1))
        except InvalidParameterError as exc:
            raise InvalidArgumentError(f"nettree: {exc}") from None
        if p.seed_pool_size and not any(isinstance(c.mechanism, LocalHashingParams) for c in self.node_components):
            raise InvalidArgumentError(
                f"nettree.seed_pool_size: no node level uses local hashing (the deepest has "
                f"{1 << self.layout.bits(self.layout.levels)} nodes, within the unary payload cap); drop the seed pool")

    def _seed(self) -> int:
        return campaign_seed(self.config, "nettree:")

    def _node_encoder(self, level: int, seed: int) -> Encoder:
        if self.params.node_map == NodeMap.SHIFTED_GRID:
            return ShiftedGridEncoder(domain=self.domain, projection=self.projection, level=level, seed=seed)
        return SimHashEncoder(domain=self.domain, projection=self.projection, bits=self.layout.bits(level), seed=seed)

    def _group_weights(self) -> tuple[int, ...]:
        """``T`` equal tree groups, plus the refinement group (group ``T``) when there is one."""
        levels = self.layout.levels
        share = float(self.params.refinement_share)
        if not share:
            return (1,) * levels
        per_level = max(1, round((1.0 - share) * _WEIGHT_TOTAL / levels))
        return (per_level,) * levels + (max(1, _WEIGHT_TOTAL - levels * per_level),)

    def first_round(self) -> RoundPlan:
        """Group ``l - 1`` reports its level-``l`` node and its bucketized vector (the refinement group waits)."""
        levels = self.layout.levels
        spec = RoundSpec(
            campaign_id=self.campaign_id, round=1, group_weights=self._group_weights(),
            tasks=tuple(GroupTask(groups=(g,), components=(self.node_components[g], self.vector))
                        for g in range(levels)),
            campaign_epsilon=self.config.epsilon, max_reports_per_device=1, kind="nettree")
        return RoundPlan(spec=spec, engine_state=pack_state("tree") if self.params.refinement_share else b"")

    def accumulate_fn(self, spec: RoundSpec) -> AccumulateFn | None:
        """Count accumulators of the node levels (GRR, unary encoding and pooled local hashing: their
        counts; per-report local hashing and the vectors: their report counts)."""
        return make_accumulate_fn(component_params_from_spec(spec))

    def close_round(self, spec: RoundSpec, reports: RoundReports, engine_state: bytes) -> RoundOutcome:
        """Round 1: grow the tree, build the coreset, cluster it and publish the centers (or, with a
        refinement round, send them to the refinement group); round 2: the Lloyd step."""
        if engine_state and load_state(engine_state, "nettree", ("tree", "refine"))["phase"] == "refine":
            return self._close_refinement(spec, reports, load_state(engine_state, "nettree"))
        outcome = self._close_tree(spec, reports)
        clustering = outcome.result.clustering if outcome.result is not None else None
        if not self.params.refinement_share or clustering is None or not clustering.centers:
            return outcome
        return self._refinement_round(outcome)

    def _refinement_round(self, outcome: RoundOutcome) -> RoundOutcome:
        """Round 2's plan: the refinement group reports its vector bucketed by its nearest round-1 center."""
        assert outcome.result is not None and outcome.result.clustering is not None
        d = self.dimension
        centers = np.asarray(outcome.result.clustering.centers, dtype=np.float64).reshape(-1, d)
        encoder = BucketedVectorEncoder(domain=self.domain, nearest=NearestCandidateEncoder(
            domain=self.domain, dimension=d, centers=tuple(centers.ravel().tolist())))
        epsilon = float(self.config.epsilon)
        mechanism = BucketizedVectorParams(bucket_bits=encoder.bucket_bits, dimension=d + 1, epsilon=epsilon,
                                           shape=vector_shape(d + 1, epsilon, self.params.vector_shape))
        levels = self.layout.levels
        spec = RoundSpec(campaign_id=self.campaign_id, round=2, group_weights=self._group_weights(),
                         tasks=(GroupTask(groups=(levels,), components=(Component(encoder=encoder, mechanism=mechanism),)),),
                         campaign_epsilon=self.config.epsilon, max_reports_per_device=1, kind="nettree")
        state = pack_state("refine", centers=centers.ravel().tolist(),
                           weights=list(outcome.result.clustering.weights), diagnostics=dict(outcome.diagnostics),
                           warnings=list(outcome.result.warnings))
        return RoundOutcome(next_round=RoundPlan(spec=spec, engine_state=state), diagnostics=outcome.diagnostics)

    def _close_refinement(self, spec: RoundSpec, reports: RoundReports, state: dict[str, Any]) -> RoundOutcome:
        """The Lloyd step (:func:`~ldp_collector.estimation.vector_sum.lloyd_move`) on the refinement group's sums."""
        d = self.dimension
        lower = np.asarray(self.domain.lower, dtype=np.float64)
        upper = np.asarray(self.domain.upper, dtype=np.float64)
        previous = np.asarray(state["centers"], dtype=np.float64).reshape(-1, d)
        weights = np.asarray(state["weights"], dtype=np.float64)
        diagnostics = {str(key): float(value) for key, value in dict(state["diagnostics"]).items()}
        warnings = [str(w) for w in state["warnings"]]
        (component,) = spec.tasks[0].components
        params = component.mechanism
        if not isinstance(params, BucketizedVectorParams):
            raise ProtocolError(f"a nettree refinement round must use bucketized_vector, got {params.KIND}")
        # One pass over the reports into the previous centers' sums: the round is never held in memory.
        sums = reports.combine(BucketSumAccumulator(params, np.arange(len(previous), dtype=np.uint64),
                                                    component_params_from_spec(spec),
                                                    (f"{self.layout.levels}:0",))).finalize()
        diagnostics["refinement_reports"] = float(sums.reports)
        for key in (FLOOR_CENTER_ERROR, FLOOR_EXCESS_COST):
            diagnostics.pop(key, None)  # round 1's floor; the published centers get their own below
        if not sums.reports:
            warnings.append("the refinement round received no reports: round 1's centers published")
            centers_unit = 2.0 * (previous - lower) / (upper - lower) - 1.0
            variances = np.full(len(previous), np.inf)
        else:
            start = 2.0 * (previous - lower) / (upper - lower) - 1.0
            ratio = params.report_mean_second_moment / params.report_second_moment
            move = lloyd_move(start, np.asarray(sums.sums, dtype=np.float64), float(sums.variance_bound),
                              moment_ratio=ratio)
            centers_unit = np.clip(move.centers, -1.0, 1.0)
            variances = move.variances * ratio
            diagnostics["refinement_centers_moved"] = float(move.moved.sum())
            if move.moved.any():
                diagnostics["refinement_step_taken_mean"] = float(move.shrink[move.moved].mean())
            if not move.moved.all():
                warnings.append(f"{int((~move.moved).sum())} of {len(previous)} centers kept their round-1 place: "
                                f"too few refinement reports chose them")
        original = lower + (centers_unit + 1.0) / 2.0 * (upper - lower)
        diagnostics.update(floor_diagnostics(
            unit_to_data_variance(np.repeat(variances[:, None], d, axis=1), lower, upper, unit_width=2.0), weights,
            centers=original, lower=lower, upper=upper))
        clustering = Clustering(k=int(original.shape[0]), dimension=d, centers=tuple(original.ravel().tolist()),
                                weights=tuple(weights.tolist()))
        result = Result(state=CampaignState.FINISHED, clustering=clustering, warnings=tuple(warnings))
        return RoundOutcome(result=result, diagnostics=diagnostics)

    def _close_tree(self, spec: RoundSpec, reports: RoundReports) -> RoundOutcome:
        """Round 1's server step on the reports (:meth:`server_step`)."""
        layout = self.layout
        d = self.dimension
        params_by_group = component_params_from_spec(spec)
        vector_params = spec.tasks[0].components[1].mechanism
        if not isinstance(vector_params, BucketizedVectorParams):
            raise ProtocolError(f"a nettree round's second component must be bucketized_vector, got {vector_params.KIND}")
        # The node counts come from the count accumulators (local hashing with per-report seeds: a
        # support pass per level; with a seed pool: the pool's counts) and the leaf sums from a pass
        # of their own: the round's reports are never held in memory.
        found = round_aggregators(spec, reports)
        aggregators = {g: aggregator_for(found, spec, group=g) for g in range(layout.levels)}
        n = sum(agg.n for agg in aggregators.values())  # every report carries a node and a vector
        vector_keys = tuple(f"{g}:1" for g in range(layout.levels))

        def estimate(level: int, candidates: NDArray[np.uint64]) -> tuple[NDArray[np.float64], float] | None:
            agg = aggregators[level - 1]
            if agg.n == 0:
                return None
            est = agg.estimate(DEFAULT_CONFIDENCE, candidates=candidates.astype(np.int64))
            scale = n / agg.n
            return np.asarray(est.counts, dtype=np.float64) * scale, est.zero_std_error * scale

        def leaf_sums(nodes: NDArray[np.uint64]) -> NDArray[np.float64]:
            sums = reports.combine(BucketSumAccumulator(vector_params, nodes, params_by_group, vector_keys)).finalize()
            out: NDArray[np.float64] = np.asarray(sums.sums, dtype=np.float64)[:, :d]
            return out

        outcome = self.server_step(n, estimate, leaf_sums, vector_variance=float(vector_params.report_second_moment),
                                   floor_variance=float(vector_params.report_mean_second_moment))
        for level in range(1, layout.levels + 1):
            outcome.diagnostics[f"level_{level}_reports"] = float(aggregators[level - 1].n)  # type: ignore[index]
        return outcome

    def server_step(self, n: int, estimate: LevelEstimator,
                    leaf_sums: Callable[[NDArray[np.uint64]], NDArray[np.float64]], *,
                    vector_variance: float, floor_variance: float | None = None) -> RoundOutcome:
        """The server step on any source of node counts and leaf sums.

        ``close_round`` passes the frequency-oracle estimates and the bucketized vector sums of the
        reports; the benchmarks pass exact counts and sums (the noiseless, epsilon = infinity limit
        of the same algorithm).

        Parameters
        ----------
        n : int
            Reports (devices).
        estimate : callable
            ``estimate(level, candidates) -> (population-scaled counts, zero-count standard error)``.
        leaf_sums : callable
            ``leaf_sums(nodes) -> (L, d)`` sums of ``2t - 1`` over each depth-``T`` node's devices.
        vector_variance : float
            Per-report second moment ``M`` of a vector coordinate (0 for exact sums).
        floor_variance : float, optional
            Its mean over the coordinates, for the noise floor (default ``vector_variance``; below it for PrivUnit).
        """
        layout = self.layout
        p = self.params
        k = int(p.k)
        d = self.dimension
        warnings: list[str] = []
        sigma = detection_sigma(max(n, 1), self.node_epsilon, layout.levels)
        inner_variance = vector_variance
        diagnostics: dict[str, float] = {
            "reports": float(n), "epsilon": float(self.config.epsilon), "node_epsilon": self.node_epsilon,
            "vector_epsilon": self.vector_epsilon, "depth": float(layout.levels),
            "bits_per_level": float(layout.child_bits), "projection_dimension": float(p.projection_dimension),
            "detection_sigma": sigma, "signal_to_noise": signal_to_noise(max(n, 1), k, self.node_epsilon, layout.levels),
            "vector_variance": inner_variance,
            "center_error_floor": center_error_floor(max(n, 1), k, inner_variance),
        }
        if n == 0:
            warnings.append("the round received no reports: no centers published")
            return RoundOutcome(result=self._no_centers(warnings), diagnostics=diagnostics)
        if n < k:
            warnings.append(f"the round received {n} reports, fewer than the k = {k} clusters")
        # A leaf's representative has per-coordinate noise sqrt(n M) / w: a node lighter than
        # VECTOR_Z sqrt(n M) would bring more noise than position; the mass floor n / (64 k) only
        # bounds the tree when the noise is small (the cap max_nodes_per_level bounds it anyway).
        vector_floor = VECTOR_Z * math.sqrt(n * inner_variance)
        diagnostics["vector_floor"] = vector_floor
        growth = grow_tree(estimate, layout, n_hat=float(n), k=k, alpha=float(p.false_positive_rate),
                           max_nodes=int(p.max_nodes_per_level), mass_fraction=MASS_FRACTION,
                           min_count=vector_floor)
        diagnostics.update(growth.diagnostics)
        warnings.extend(growth.warnings)
        if growth.level < layout.levels or growth.nodes.size == 0:
            explanation = (f"the tree did not reach depth {layout.levels}: the clusters are not detectable at this n "
                           f"and epsilon (signal-to-noise {diagnostics['signal_to_noise']:.2f})")
            growth, level = self._best_effort_growth(estimate, growth, n)
            if growth.nodes.size == 0:
                stops = "; ".join(w for w in growth.warnings if "no reports" in w)
                warnings.append(f"{explanation}; no centers published" + (f" ({stops})" if stops else ""))
                diagnostics["leaves"] = 0.0
                return RoundOutcome(result=self._no_centers(warnings), diagnostics=diagnostics)
            below = (f"below the {_nodes_text(growth.kept[level][0].size)} that passed level {level}" if level
                     else "of the whole tree")
            warnings.append(f"{explanation}; best-effort centers from the {_nodes_text(growth.nodes.size)} with the "
                            f"largest estimated counts at depth {layout.levels} {below}: they passed no threshold "
                            "and may be noise")
            diagnostics.update(growth.diagnostics)
            diagnostics.update(best_effort=1.0, best_effort_from_level=float(level))
        kept_nodes, kept_counts = growth.nodes, growth.counts
        diagnostics["leaves"] = float(kept_nodes.size)
        sums = leaf_sums(kept_nodes)
        weights = np.maximum(kept_counts, 1.0)
        diagnostics["coverage"] = float(kept_counts.sum() / n)
        grid = self.params.node_map == NodeMap.SHIFTED_GRID
        cells: NDArray[np.float64] | None = None
        if grid and self.projection is None:
            leaf = self.node_encoders[-1]
            assert isinstance(leaf, ShiftedGridEncoder)
            cells = shifted_cell_centres(kept_nodes, layout.levels, leaf.shift, leaf.half_width)
        positions = cells if cells is not None else (
            self._positions(kept_nodes, sums, weights) if p.cluster_in_projected_space else None)
        rng = np.random.default_rng(self._seed())
        fit = coreset_centers(sums, weights, k, rng, positions=positions, n_init=CORESET_RESTARTS)
        if fit.centers.shape[0] < k:
            warnings.append(f"only {fit.centers.shape[0]} leaves passed the thresholds for k = {k}: "
                            f"{fit.centers.shape[0]} centers published")
        leaves_per_center = np.bincount(fit.labels, minlength=fit.centers.shape[0]).astype(np.float64)
        center_variance = leaves_per_center * n * inner_variance / fit.weights**2
        # The floor adds the coordinates up: a report's mean second moment over them (PrivUnit's worst
        # coordinate, which the thresholds use, overstates it).
        floor_ratio = (floor_variance if floor_variance is not None else inner_variance) / inner_variance \
            if inner_variance > 0 else 1.0
        diagnostics["vector_center_se_mean"] = float(np.sqrt(center_variance).mean())
        centers = fit.centers
        if cells is not None:
            leaf = self.node_encoders[-1]
            assert isinstance(leaf, ShiftedGridEncoder)
            side = leaf.cell_side()
            cell_means = np.column_stack([
                np.bincount(fit.labels, weights=weights * cells[:, j], minlength=fit.centers.shape[0])
                for j in range(d)]) / fit.weights[:, None]
            cell_mse = np.full(fit.centers.shape[0], side * side / 12.0)
            centers = combine_center_estimates(fit.centers, center_variance, cell_means, cell_mse)
            diagnostics["cell_side"] = float(side)
            # The combination weighs the noisy vector mean by cell_mse / (variance + cell_mse): its noise shrinks by
            # that factor squared (the cell means carry no privacy noise, only their quantization).
            center_variance = center_variance * (cell_mse / (center_variance + cell_mse)) ** 2
        fit_weights = fit.weights
        unit = np.clip((centers + 1.0) / 2.0, 0.0, 1.0)
        lower = np.asarray(self.domain.lower, dtype=np.float64)
        upper = np.asarray(self.domain.upper, dtype=np.float64)
        original = lower + unit * (upper - lower)
        diagnostics.update(floor_diagnostics(
            unit_to_data_variance(np.repeat(floor_ratio * center_variance[:, None], d, axis=1), lower, upper,
                                  unit_width=2.0), fit_weights, centers=original, lower=lower, upper=upper))
        clustering = Clustering(k=int(original.shape[0]), dimension=d, centers=tuple(original.reshape(-1).tolist()),
                                weights=tuple((fit_weights / fit_weights.sum()).tolist()))
        diagnostics["published_centers"] = float(original.shape[0])
        result = Result(state=CampaignState.FINISHED, clustering=clustering, warnings=tuple(warnings))
        return RoundOutcome(result=result, diagnostics=diagnostics)

    def _best_effort_growth(self, estimate: LevelEstimator, growth: TreeGrowth, n: int) -> tuple[TreeGrowth, int]:
        """The tree regrown without significance below the deepest level it reached: best-effort leaves.

        Down to the deepest level where nodes passed the thresholds (0 when none did) the regrown
        tree keeps the same nodes; below, their descendants with the largest positive estimated
        counts, as many per level as the widest level kept or ``k`` (at most
        ``max_nodes_per_level``), so that the vector sums of the heaviest leaves under what was
        detected still give centers.

        Returns
        -------
        (TreeGrowth, int)
            The regrown tree, and the level it was relaxed below.
        """
        p = self.params
        kept = {level: nodes for level, (nodes, _) in growth.kept.items() if nodes.size}
        deepest = max(kept, default=0)

        def restricted(level: int, candidates: NDArray[np.uint64]) -> tuple[NDArray[np.float64], float] | None:
            estimated = estimate(level, candidates)
            if estimated is None or level not in kept:
                return estimated
            counts, zero_se = estimated
            return np.where(np.isin(candidates, kept[level]), counts, -np.inf), zero_se

        width = min(max([int(p.k), *(nodes.size for nodes in kept.values())]), int(p.max_nodes_per_level))
        relaxed = grow_best_effort(restricted, self.layout, n_hat=float(n), k=int(p.k), width=width,
                                   prefix="best_effort_")
        return relaxed, deepest

    def _no_centers(self, warnings: list[str]) -> Result:
        """A finished result that publishes no center (only the clustering's dimension)."""
        return Result(state=CampaignState.FINISHED, clustering=Clustering(dimension=self.dimension),
                      warnings=tuple(warnings))

    def _positions(self, nodes: NDArray[np.uint64], leaf_sums: NDArray[np.float64],
                   weights: NDArray[np.float64]) -> NDArray[np.float64]:
        """Where the paper-faithful variant clusters the leaves (module docstring)."""
        if self.params.node_map == NodeMap.SHIFTED_GRID:
            return grid_node_positions(nodes, self.layout.levels, int(self.params.projection_dimension))
        bits = self.layout.bits(self.layout.levels)
        codes = nodes.astype(np.uint64)
        out: NDArray[np.float64] = np.column_stack(
            [((codes >> np.uint64(bits - 1 - i)) & np.uint64(1)).astype(np.float64) for i in range(bits)])
        return out


def _nodes_text(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def leaf_nodes(engine: NetTreeEngine, points: NDArray[np.float64]) -> NDArray[np.uint64]:
    """Every point's depth-``T`` node under the engine's public node map (:func:`lsh_nodes`)."""
    leaf = engine.node_encoders[-1]
    assert isinstance(leaf, (SimHashEncoder, ShiftedGridEncoder))
    return lsh_nodes(leaf, points)


def noiseless_outcome(engine: NetTreeEngine, points: ArrayLike) -> RoundOutcome:
    """The server step on exact node counts and exact leaf sums: the protocol at epsilon = infinity.

    What remains is the algorithm's own approximation (the tree's thresholds, the coreset of
    leaves, weighted k-means on it), which the benchmarks compare with non-private k-means.
    """
    x = np.asarray(points, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != engine.dimension:
        raise ValueError(f"points must be (n, {engine.dimension}), got {x.shape}")
    n = len(x)
    leaves = leaf_nodes(engine, x)
    b, depth = engine.layout.child_bits, engine.layout.levels
    lower = np.asarray(engine.domain.lower, dtype=np.float64)
    upper = np.asarray(engine.domain.upper, dtype=np.float64)
    y = 2.0 * np.clip((x - lower) / (upper - lower), 0.0, 1.0) - 1.0

    def estimate(level: int, candidates: NDArray[np.uint64]) -> tuple[NDArray[np.float64], float]:
        return exact_counts(leaves >> np.uint64(b * (depth - level)), candidates), 0.0

    def leaf_sums(nodes: NDArray[np.uint64]) -> NDArray[np.float64]:
        return exact_sums(leaves, nodes, y)

    return engine.server_step(n, estimate, leaf_sums, vector_variance=0.0)


#: Command line: ``--k`` (the dataset's number of labels in a simulation when not given),
#: ``--expected-reports`` (``simulate``: the simulated population when not given), ``--refinement-share`` and
#: ``--vector-shape``.
CLI = KindCli(result="clustering", params=(
    K_PARAM,
    CliParam(flag="--expected-reports", field="expected_reports", type="uint64", metavar="N",
             help="devices expected to report: the node share of epsilon is planned for them (nettree)"),
    CliParam(flag="--refinement-share", field="refinement_share", type="positive_float", metavar="SHARE",
             help="share of the devices held back for a Lloyd refinement round (nettree; default none)"),
    VECTOR_SHAPE_PARAM,
    CliParam(flag="--seed-pool", field="seed_pool_size", type="uint32", metavar="S",
             help="local-hashing node levels (above 1024 nodes) from a public pool of S seeds (docs/protocol.md §14; "
                  "0: per-report seeds)"),
))

#: The NETTREE campaign kind (registered by :mod:`ldp_collector.kinds.registry`).
KIND = Kind(name="nettree", engine=NetTreeEngine,
            params=NetTreeParams,
            domains=frozenset({NUMERIC}), clustering=True,
            cli=CLI)
