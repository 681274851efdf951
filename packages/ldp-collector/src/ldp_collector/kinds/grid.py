"""GRID campaigns: grid clustering with server-device feedback (AGCluster, ``papers/002``).

Arbitrary-shape clusters from a dyadic grid the server refines between rounds. The math lives in
:mod:`ldp_collector.estimation.grid_clustering`; this module turns it into rounds.

Phases (each a round; every RoundSpec is computed from the previous round's reports)
    1. **Calibrate** (group A): devices report their cell in a coarse uniform grid (level
       ``L_cal``: ``initial_cells_per_dimension``, default the finest level with at most 256
       cells). The server estimates the dense share ``r`` and the granularity ``m`` of the grid the
       aggregation group can resolve (``granularity``: the paper's Theorem 1 or the
       unit-consistent rule, default), snapped to a dyadic level ``L0``.
    2. **Refine** (groups B), by ``variant``:

       * ``UNIFORM`` (UGC, no refinement): no B round; the grid is the uniform level ``L0``.
       * ``DENSITY`` (not in the paper; the default, :data:`DEFAULT_VARIANT`): no B round; the
         grid is the uniform level at which the typical occupied cell is resolved after smoothing
         (:func:`~ldp_collector.estimation.density_clustering.snr_level`), and the aggregation
         is :func:`~ldp_collector.estimation.density_clustering.cluster_density` (smoothing, a
         dense test with false-discovery-rate control, significant modes, border cells, and the
         modes' Gaussian components where a Gaussian mixture fits the counts within their
         standard errors, :func:`~ldp_collector.estimation.grid_mixture.split_gaussian_modes`)
         instead of the paper's Algorithm 4, on the aggregation counts made consistent with the
         calibration round's (:func:`~ldp_collector.estimation.density_clustering.pool_levels`):
         the calibration devices' reports inform the final grid too.
       * ``TREE`` (TreeAdaptive): one round in which subgroup ``i`` reports its cell at
         tree level ``L0 + i`` (levels ``L0 .. H``; ``H`` from Theorem 3's range, capped at
         :data:`MAX_TREE_LEVELS` levels), each with the variance-optimal frequency oracle for
         that level's ``2^(l d)`` cells. The server walks the tree top-down
         (:func:`~ldp_collector.estimation.grid_clustering.tree_level_step`).
       * ``ITERATIVE`` (IterAdaptive): up to ``max_iterations`` rounds; in round ``t`` subgroup
         ``t`` reports its cell in the current irregular cell list, and the server merges dense
         sibling families and splits sparse edge cells, keeping each cell's density history
         (:func:`~ldp_collector.estimation.grid_clustering.iterate_cells`). It stops early when
         the list is stable.
    3. **Aggregate** (group C): devices report their cell in the final irregular cell list; the
       server finds dense, core and border cells and the clusters
       (:func:`~ldp_collector.estimation.grid_clustering.aggregate_cells`), and publishes the
       cell -> cluster map with every cell's relative density and standard error. A device can
       label itself from it locally (``ldp_client``), spending nothing.

Budget policies
    ``PARTITION`` (default): every device is in exactly one group and reports once with the whole
    epsilon. Group weights (fixed for the campaign): A ``calibration_share`` (0.2), B
    ``refinement_share`` (0.4) split evenly over the tree levels or iterations, C the rest.
    Subgroups a shorter tree or an early-stopping iteration leaves unused report in the C round,
    so no device's report is wasted.
    ``SPLIT``: every device reports in every round with ``epsilon / R`` (``R`` = 2 for UNIFORM,
    3 for TREE, ``max_iterations + 2`` for ITERATIVE); in the TREE round the devices are split
    evenly over the levels. An early-stopping iteration, or a TREE campaign whose granularity is
    already the finest ``max_cells`` allows (the tree round is skipped), leaves the rest of the
    budget unspent.

Oracles
    Every round uses the variance-optimal frequency oracle for its grid that fits
    :data:`MAX_PAYLOAD_BITS` per report (GRR on small grids, OUE up to 1024 cells, local hashing
    beyond), so a device's cost per round stays within the SDK's per-report budget.

A public seed pool
    With ``seed_pool_size`` S > 0 every local-hashing round takes its seeds from a public pool of S
    seeds, a fresh pool each round (``docs/protocol.md`` §14; the key is the round's,
    :func:`~ldp_collector.kinds.common.seed_pool_key`). Its accumulators keep S x g counts at
    ingestion, and the round's step reads no report at close: every tree level's candidates, or
    the cell list's cells, cost S x D hashes from the counts instead of a support pass of
    n x D hashes per level. The standard errors the dense tests use include the pool's extra
    variance (§14.6), estimated from the same counts. Choose S with
    :func:`ldp_client.mechanisms.local_hashing.seed_pool_size_for` for a round's group size and the
    concentration of its cells (about the largest share of one cell). A campaign whose rounds
    never use local hashing (its finest grid fits OUE, or its oracles leave local hashing out)
    refuses a pool at creation.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any

import msgpack
import numpy as np
from numpy.typing import NDArray

from ldp_client.budget import MAX_MECHANISM_EPSILON, equal_share
from ldp_client.clusters import CellClusterModel
from ldp_client.encoders.geometry import TreeCell, max_tree_level, tree_coordinates
from ldp_client.encoders.grid import CellListEncoder, GridTreeEncoder
from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import LocalHashingParams, MechanismParams, choose_frequency_oracle
from ldp_client.spec import MAX_GROUPS, Component, GroupTask, RoundSpec

from ..errors import InvalidArgumentError
from ..estimation.accumulators import component_params_from_spec, make_accumulate_fn
from ..estimation.density_clustering import DensityClustering, cluster_density, pool_levels, snr_level
from ..estimation.frequency import FrequencyEstimate
from ..estimation.grid_clustering import (
    aggregate_cells,
    consistent_granularity,
    dense_fraction,
    iterate_cells,
    level_for_side,
    oracle_variance,
    paper_granularity,
    touching,
    tree_height_range,
    tree_level_step,
    uniform_cells,
)
from ..model import BudgetPolicy, CampaignConfig, CampaignState, Clustering, Result
from ..storage.base import AccumulateFn
from .base import (
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
    MAX_PAYLOAD_BITS,
    ProtoEnum,
    allowed_oracles,
    check_seed_pool_size,
    with_seed_pool,
)
from .histogram import aggregator_for, frequency_estimates, round_aggregators

__all__ = [
    "KIND",
    "CLUSTER_FALSE_POSITIVE_RATE",
    "DEFAULT_CALIBRATION_CELLS",
    "DEFAULT_CALIBRATION_SHARE",
    "DEFAULT_CORE_Z",
    "DEFAULT_DENSE_Z",
    "DEFAULT_MAX_CELLS",
    "DEFAULT_MAX_ITERATIONS",
    "DEFAULT_VARIANT",
    "MAX_GRID_CELLS",
    "MAX_GRID_DIMENSION",
    "DEFAULT_REFINEMENT_SHARE",
    "MAX_TREE_LEVELS",
    "GridEngine",
    "GridParams",
    "GridPlan",
    "GridVariant",
    "Granularity",
]

log = logging.getLogger(__name__)

DEFAULT_CALIBRATION_SHARE = 0.2
DEFAULT_REFINEMENT_SHARE = 0.4
DEFAULT_DENSE_Z = 2.0
DEFAULT_CORE_Z = 3.0
DEFAULT_MAX_CELLS = 4096
#: Largest grid, in cells. Its coarsest grid (2 cells per dimension) bounds the dimension a grid
#: campaign resolves: ``MAX_GRID_DIMENSION`` = log2 of it.
MAX_GRID_CELLS = 2**20
MAX_GRID_DIMENSION = MAX_GRID_CELLS.bit_length() - 1
DEFAULT_MAX_ITERATIONS = 3
#: Calibration grid: the finest level with at most this many cells.
DEFAULT_CALIBRATION_CELLS = 256
#: Family-wise rate of spurious clusters: a cluster's mass must pass the Bonferroni z over the cells.
CLUSTER_FALSE_POSITIVE_RATE = 0.05
#: Most tree levels reported in the TREE round (and subgroups of B).
MAX_TREE_LEVELS = 3
#: Largest payload per report the oracle choice allows (OUE up to 1024 cells, local hashing beyond).
#: Group weights are integers: shares are expressed in units of 1/_WEIGHT_SCALE.
_WEIGHT_SCALE = 10_000
_PHASE_CALIBRATE = "calibrate"
_PHASE_TREE = "tree"
_PHASE_ITERATE = "iterate"
_PHASE_AGGREGATE = "aggregate"


@dataclass(frozen=True)
class GridPlan:
    """The campaign's fixed group layout.

    ``calibrate``, ``refine`` (one entry per tree level or iteration) and ``aggregate`` hold group
    numbers; under SPLIT every phase uses every group (``refine`` lists the TREE round's level
    subgroups, or one entry per iteration holding every group).
    """

    weights: tuple[int, ...]
    calibrate: tuple[int, ...]
    refine: tuple[tuple[int, ...], ...]
    aggregate: tuple[int, ...]
    round_epsilon: float


class GridVariant(ProtoEnum):
    """``ldp.v1.GridParameters.Variant``."""

    VARIANT_UNSPECIFIED = 0
    UNIFORM = 1  # UGC: no feedback
    TREE = 2  # TreeAdaptive
    ITERATIVE = 3  # IterAdaptive
    DENSITY = 4  # not in the paper: noise-derived density modes on one uniform grid


#: The variant of a campaign that names none: the one that won most data set x (n, epsilon) cells of the
#: paired comparison over the reporting seeds (benchmarks/README.md, "Grid variants: the verdict").
DEFAULT_VARIANT = GridVariant.DENSITY


class Granularity(ProtoEnum):
    """``ldp.v1.GridParameters.Granularity``: the rule of the aggregation grid's side."""

    GRANULARITY_UNSPECIFIED = 0
    PAPER = 1  # Theorem 1 as printed
    CONSISTENT = 2  # unit-consistent rule


@dataclass(frozen=True, kw_only=True)
class GridParams(KindParams):
    """``ldp.v1.GridParameters``; :meth:`resolve` fills the variant, granularity, limits, thresholds and shares.

    Attributes
    ----------
    variant : GridVariant
        UNSPECIFIED: :data:`DEFAULT_VARIANT` (DENSITY).
    granularity : Granularity
        UNSPECIFIED: CONSISTENT.
    initial_cells_per_dimension : int
        Calibration grid, a power of two >= 2 (0 = about 256 cells in total).
    tree_height : int
        TREE: levels below the aggregation level (0 = from the data).
    max_iterations : int
        ITERATIVE: refinement rounds, in [1, 16] (0 = 3).
    core_threshold : float
        Significance of the core-cell test, in (0, 10] standard errors (0 = 3).
    calibration_share : float
        PARTITION: share of the devices in the calibration group (0 = 0.2).
    refinement_share : float
        PARTITION: share of the devices in the refinement groups (0 = 0.4; UNIFORM and DENSITY: 0).
    dense_threshold : float
        Significance of the dense-cell test, in (0, 10] standard errors (0 = 2).
    max_cells : int
        Largest number of cells in any reported grid, in [2^d, 2^20] (0 = 4096).
    no_border_cells : bool
        Leave cells next to exactly one cluster as noise.
    granularity_level : int
        Fixed dyadic level of the aggregation grid (0 = from the granularity rule).
    seed_pool_size : int
        The local-hashing rounds' public seed pool, a fresh one each round (``docs/protocol.md`` §14;
        0 = per-report seeds).
    """

    variant: GridVariant = GridVariant.VARIANT_UNSPECIFIED
    granularity: Granularity = Granularity.GRANULARITY_UNSPECIFIED
    initial_cells_per_dimension: int = 0
    tree_height: int = 0
    max_iterations: int = 0
    core_threshold: float = 0.0
    calibration_share: float = 0.0
    refinement_share: float = 0.0
    dense_threshold: float = 0.0
    max_cells: int = 0
    no_border_cells: bool = False
    granularity_level: int = 0
    seed_pool_size: int = 0

    def top_level(self, dimension: int) -> int:
        """The finest dyadic level whose grid fits ``max_cells`` (and the SDK's deepest tree level)."""
        return min(max_tree_level(dimension), int(math.floor(math.log2(self.max_cells) / dimension + 1e-12)))

    @property
    def calibration_level(self) -> int:
        """The dyadic level of the calibration grid (``initial_cells_per_dimension = 2^level``)."""
        return self.initial_cells_per_dimension.bit_length() - 1

    def resolve(self, config: CampaignConfig) -> GridParams:
        """The parameters with every default filled in (see :meth:`KindParams.resolve`).

        Raises
        ------
        InvalidArgumentError
            A categorical domain, shares outside (0, 1) or summing to 0.95 or more, a calibration
            grid that is not a power of two, or limits out of range.
        """
        d = numeric_domain(config, "grid").dimension
        variant = self.variant or DEFAULT_VARIANT
        granularity = self.granularity or Granularity.CONSISTENT
        if d > MAX_GRID_DIMENSION:
            raise InvalidArgumentError(
                f"a grid campaign resolves at most {MAX_GRID_DIMENSION} dimensions: its coarsest grid (2 cells per "
                f"dimension) has 2^{d} cells, more than the largest grid ({MAX_GRID_CELLS} cells); got d = {d} "
                f"(a nettree or stemmer campaign projects the points to fewer dimensions)")
        if not self.max_cells and 2**d > DEFAULT_MAX_CELLS:
            raise InvalidArgumentError(
                f"grid.max_cells (default {DEFAULT_MAX_CELLS}) is below the {2**d} cells of the coarsest grid in "
                f"dimension {d}: set grid.max_cells (--max-cells) in [{2**d}, {MAX_GRID_CELLS}]")
        max_cells = self.max_cells or DEFAULT_MAX_CELLS
        if not 2**d <= max_cells <= MAX_GRID_CELLS:
            raise InvalidArgumentError(
                f"grid.max_cells must be in [{2**d}, {MAX_GRID_CELLS}] in dimension {d}, got {max_cells}")
        top_level = replace(self, max_cells=max_cells).top_level(d)
        m0 = self.initial_cells_per_dimension or 2 ** max(1, int(math.floor(math.log2(DEFAULT_CALIBRATION_CELLS) / d
                                                                            + 1e-12)))
        if m0 < 2 or m0 & (m0 - 1) or m0 ** d > max_cells:
            raise InvalidArgumentError(
                f"grid.initial_cells_per_dimension must be a power of two >= 2 with at most max_cells "
                f"({max_cells}) cells, got {m0}")
        max_iterations = self.max_iterations or DEFAULT_MAX_ITERATIONS
        if not 1 <= max_iterations <= 16:
            raise InvalidArgumentError(f"grid.max_iterations must be in [1, 16], got {max_iterations}")
        if self.granularity_level and not 1 <= self.granularity_level <= top_level:
            raise InvalidArgumentError(
                f"grid.granularity_level must be in [1, {top_level}] (max_cells {max_cells} in dimension {d}), "
                f"got {self.granularity_level}")
        if self.tree_height and not 1 <= self.tree_height <= top_level:
            raise InvalidArgumentError(
                f"grid.tree_height must be in [1, {top_level}] (max_cells {max_cells} in dimension {d}), "
                f"got {self.tree_height}")
        check_seed_pool_size(self.seed_pool_size, config, "grid.seed_pool_size")
        core_threshold, dense_threshold = (
            self._threshold(name, value, default) for name, value, default in (
                ("core_threshold", self.core_threshold, DEFAULT_CORE_Z),
                ("dense_threshold", self.dense_threshold, DEFAULT_DENSE_Z)))
        calibration_share = self.calibration_share or DEFAULT_CALIBRATION_SHARE
        refinement_share = self.refinement_share
        if variant == GridVariant.DENSITY and granularity == Granularity.PAPER:
            raise InvalidArgumentError("grid.granularity PAPER does not apply to the DENSITY variant: it chooses its "
                                       "level from the noise (grid.granularity_level fixes one)")
        refines = variant in (GridVariant.TREE, GridVariant.ITERATIVE)
        if refinement_share == 0 and refines:
            refinement_share = DEFAULT_REFINEMENT_SHARE
        if not refines and refinement_share:
            raise InvalidArgumentError(f"grid.refinement_share must be 0 for the {variant.name} variant (no refinement)")
        for name, value in (("calibration_share", calibration_share), ("refinement_share", refinement_share)):
            if not (math.isfinite(value) and 0 <= value < 1):
                raise InvalidArgumentError(f"grid.{name} must be in (0, 1), got {value!r}")
        if calibration_share + refinement_share >= 0.95:
            raise InvalidArgumentError(
                f"grid.calibration_share + grid.refinement_share must leave at least 0.05 of the devices for the "
                f"aggregation group, got {calibration_share + refinement_share:g}")
        return replace(self, variant=variant, granularity=granularity, max_cells=max_cells,
                       initial_cells_per_dimension=m0, max_iterations=max_iterations, core_threshold=core_threshold,
                       dense_threshold=dense_threshold, calibration_share=calibration_share,
                       refinement_share=refinement_share)

    @staticmethod
    def _threshold(name: str, value: float, default: float) -> float:
        """A significance threshold (0: ``default``) in (0, 10] standard errors."""
        if value == 0:
            return default
        if not (math.isfinite(value) and 0 < value <= 10):
            raise InvalidArgumentError(f"grid.{name} must be in (0, 10] standard errors, got {value!r}")
        return value


class GridEngine(CampaignEngine):
    """Engine of ``GRID`` campaigns (module docstring).

    Parameters
    ----------
    campaign_id : str
    config : ldp.v1.CampaignConfig
        Validated by :func:`ldp_collector.campaigns.prepare_campaign`: a numeric domain.
    params : GridParams
        Resolved (:meth:`GridParams.resolve`): variant DENSITY, granularity CONSISTENT, the shares,
        thresholds and limits of the module constants unless set.

    Raises
    ------
    InvalidArgumentError
        A per-round epsilon above 20, or more groups than a round can have.
    """

    params: GridParams

    def __init__(self, campaign_id: str, config: CampaignConfig, params: GridParams) -> None:
        super().__init__(campaign_id, config, params)
        self.domain = numeric_domain(config, "grid")
        self.dimension = self.domain.dimension
        self.top_level = params.top_level(self.dimension)
        self.calibration_level = params.calibration_level
        self.plan = self._plan(config)
        # No round reports over more cells than the finest grid, and an oracle that serves it serves
        # every smaller one (payloads only shrink): campaign oracles no round could use fail here, at
        # creation, not in a later round. The same holds for a seed pool: local hashing is the
        # oracle of the largest grids only, so a pool the finest grid cannot use no round can.
        finest = self._oracle(1 << (self.dimension * self.top_level), 1)
        if params.seed_pool_size and not isinstance(finest, LocalHashingParams):
            raise InvalidArgumentError(
                f"grid.seed_pool_size: no round of this campaign uses local hashing (its finest grid, "
                f"{1 << (self.dimension * self.top_level)} cells, takes {finest.KIND}); drop the seed pool")

    # -- layout ----------------------------------------------------------------------------------

    def _refine_slots(self) -> int:
        variant = self.params.variant
        if variant == GridVariant.TREE:
            return MAX_TREE_LEVELS
        if variant == GridVariant.ITERATIVE:
            return int(self.params.max_iterations)
        return 0

    def _plan(self, config: CampaignConfig) -> GridPlan:
        p = self.params
        slots = self._refine_slots()
        epsilon = config.epsilon
        if config.budget_policy == BudgetPolicy.SPLIT:
            variant = p.variant
            if variant == GridVariant.TREE:
                rounds, groups = 3, slots
            elif variant == GridVariant.ITERATIVE:
                rounds, groups = slots + 2, 1
            else:
                rounds, groups = 2, 1
            every = tuple(range(groups))
            refine: tuple[tuple[int, ...], ...]
            if variant == GridVariant.TREE:
                refine = tuple((g,) for g in every)
            else:
                refine = tuple(every for _ in range(slots))
            plan = GridPlan(weights=(1,) * groups, calibrate=every, refine=refine, aggregate=every,
                            round_epsilon=equal_share(epsilon, rounds))
        else:
            a = round(p.calibration_share * _WEIGHT_SCALE)
            b_total = round(p.refinement_share * _WEIGHT_SCALE)
            b = [b_total // slots + (1 if i < b_total % slots else 0) for i in range(slots)] if slots else []
            c = _WEIGHT_SCALE - a - sum(b)
            weights = (a, *b, c)
            plan = GridPlan(weights=weights, calibrate=(0,), refine=tuple((1 + i,) for i in range(slots)),
                            aggregate=(1 + slots,), round_epsilon=epsilon)
        if len(plan.weights) > MAX_GROUPS:
            raise InvalidArgumentError(f"grid: {len(plan.weights)} groups exceed {MAX_GROUPS}")
        if not 0.0 < plan.round_epsilon <= MAX_MECHANISM_EPSILON:
            raise InvalidArgumentError(
                f"grid: each report spends epsilon {plan.round_epsilon:g} under this budget policy; it must be in "
                f"(0, {MAX_MECHANISM_EPSILON:g}]")
        return plan

    def _oracle(self, cells: int, round_: int) -> MechanismParams:
        """The round's oracle for ``cells`` cells; local hashing with the round's seed pool, if any."""
        try:
            mechanism = choose_frequency_oracle(max(2, cells), self.plan.round_epsilon, MAX_PAYLOAD_BITS,
                                                oracles=allowed_oracles(self.config))
        except InvalidParameterError as exc:
            raise InvalidArgumentError(f"grid: {exc}") from None
        return with_seed_pool(mechanism, self.config, round_, self.params.seed_pool_size, "grid")

    def _tree_component(self, level: int, round_: int) -> Component:
        encoder = GridTreeEncoder(domain=self.domain, level=level)
        return Component(encoder=encoder, mechanism=self._oracle(encoder.output_size, round_))

    def _list_component(self, cells: Sequence[TreeCell], round_: int) -> Component:
        encoder = CellListEncoder(domain=self.domain, cells=tuple(cells))
        return Component(encoder=encoder, mechanism=self._oracle(encoder.output_size, round_))

    def _spec(self, round_: int, tasks: Sequence[GroupTask]) -> RoundSpec:
        return RoundSpec(campaign_id=self.campaign_id, round=round_, group_weights=self.plan.weights,
                         tasks=tuple(tasks), campaign_epsilon=self.config.epsilon,
                         max_reports_per_device=self._rounds_per_device(), kind="grid")

    def _rounds_per_device(self) -> int:
        if self.config.budget_policy == BudgetPolicy.SPLIT:
            slots = self._refine_slots()
            return 2 + (1 if self.params.variant == GridVariant.TREE else slots)
        return 1

    @staticmethod
    def _state(phase: str, **fields: Any) -> bytes:
        return pack_state(phase, **fields)

    @staticmethod
    def _load_state(blob: bytes) -> dict[str, Any]:
        return load_state(blob, "grid", None)

    # -- rounds ----------------------------------------------------------------------------------

    def first_round(self) -> RoundPlan:
        """Round 1: the calibration group reports its cell in the coarse uniform grid."""
        component = self._tree_component(self.calibration_level, 1)
        spec = self._spec(1, [GroupTask(groups=self.plan.calibrate, components=(component,))])
        return RoundPlan(spec=spec, engine_state=self._state(_PHASE_CALIBRATE, leftover=[]))

    def accumulate_fn(self, spec: RoundSpec) -> AccumulateFn | None:
        """Count accumulators of the GRR, OUE and pooled local-hashing rounds (a round of local hashing
        with per-report seeds counts its reports here and its candidates' supports at close)."""
        return make_accumulate_fn(component_params_from_spec(spec))

    def close_round(self, spec: RoundSpec, reports: RoundReports, engine_state: bytes) -> RoundOutcome:
        """Run the server step of the round's phase (module docstring)."""
        state = self._load_state(engine_state)
        phase = state["phase"]
        aggregators = round_aggregators(spec, reports)
        steps = {_PHASE_CALIBRATE: self._close_calibrate, _PHASE_TREE: self._close_tree,
                 _PHASE_ITERATE: self._close_iterate, _PHASE_AGGREGATE: self._close_aggregate}
        if phase not in steps:
            raise ProtocolError(f"unknown grid engine phase {phase!r}")
        try:
            outcome = steps[phase](spec, aggregators, state)
        except (KeyError, TypeError) as exc:
            raise ProtocolError(f"unreadable grid engine state for phase {phase!r}: {exc!r}") from None
        # Every round's diagnostics ride along in the engine state and end up in the result.
        carried = {str(k): float(v) for k, v in dict(state.get("diag", {})).items()}
        carried.update(outcome.diagnostics)
        carried[f"round_{spec.round}_reports"] = float(reports.count)
        if outcome.next_round is not None:
            next_state = self._load_state(outcome.next_round.engine_state)
            next_state["diag"] = carried
            plan = RoundPlan(spec=outcome.next_round.spec,
                             engine_state=msgpack.packb(next_state, use_bin_type=True))
            return replace(outcome, next_round=plan)
        return replace(outcome, diagnostics=carried)

    def _pooled(self, aggregators: dict[str, Any], spec: RoundSpec, groups: Sequence[int],
                candidates: NDArray[np.int64] | None = None) -> tuple[FrequencyEstimate, NDArray[np.float64],
                                                                       NDArray[np.float64], int]:
        """Sum of the groups' unbiased estimates (same oracle): counts, standard errors, reports."""
        first: FrequencyEstimate | None = None
        counts: NDArray[np.float64] | None = None
        var: NDArray[np.float64] | None = None
        n = 0
        for group in groups:
            est = aggregator_for(aggregators, spec, group=group).estimate(DEFAULT_CONFIDENCE, candidates=candidates)
            first = first or est
            counts = est.counts.copy() if counts is None else counts + est.counts
            var = est.std_errors**2 if var is None else var + est.std_errors**2
            n += est.n
        assert first is not None and counts is not None and var is not None
        return first, counts, np.sqrt(var), n

    def _close_calibrate(self, spec: RoundSpec, aggregators: dict[str, Any], state: dict[str, Any]) -> RoundOutcome:
        p, d, plan = self.params, self.dimension, self.plan
        level = self.calibration_level
        estimate, counts, se, n = self._pooled(aggregators, spec, plan.calibrate)
        warnings = list(estimate.warnings)
        z = float(p.dense_threshold)
        r = dense_fraction(counts, se, max(n, 1), d, level, z=z) if n else 1.0
        # The shares devices drew their groups from: the campaign's (its first spec's), not this release's plan.
        weights = spec.group_weights
        total_weight = sum(weights)
        if self.config.budget_policy == BudgetPolicy.SPLIT:
            population = float(n)
            aggregation_reports = float(n)
        else:
            calib_share = sum(weights[g] for g in plan.calibrate) / total_weight
            population = n / calib_share if n else 0.0
            aggregation_reports = population * sum(weights[g] for g in plan.aggregate) / total_weight
        aggregation_reports = max(aggregation_reports, 1.0)
        variance = oracle_variance(plan.round_epsilon)  # the aggregation grid is large: OUE/local hashing
        consistent_side = consistent_granularity(aggregation_reports, variance, d, r)
        paper_side = paper_granularity(max(population, 1.0), plan.round_epsilon, d, r)
        side = paper_side if p.granularity == Granularity.PAPER else consistent_side
        level0 = int(p.granularity_level) or level_for_side(side, d, max_level=self.top_level)
        if side < 2.0 ** -self.top_level:
            warnings.append(f"the {'paper' if p.granularity == Granularity.PAPER else 'consistent'} "
                            f"granularity {side:.3g} is finer than max_cells allows; using level {level0}")
        low, high = tree_height_range(side, r, d)
        diagnostics: dict[str, float] = {
            "calibration_reports": float(n), "calibration_level": float(level), "dense_share": float(r),
            "granularity_paper": float(paper_side), "granularity_consistent": float(consistent_side),
            "granularity_level": float(level0), "population_estimate": float(population),
            "epsilon_per_report": float(plan.round_epsilon),
            "tree_height_low": float(low), "tree_height_high": float(high) if math.isfinite(high) else -1.0,
        }
        variant = p.variant
        if variant == GridVariant.DENSITY:
            if not p.granularity_level:
                aggregation_se = math.sqrt(aggregation_reports * variance)
                calibration_se = float(np.median(se)) if n and len(se) else 0.0
                if calibration_se > 0:
                    level0, occupied = snr_level(counts, calibration_se, level, d, aggregation_reports, aggregation_se,
                                                 min_level=1, max_level=self.top_level)
                    diagnostics["occupied_calibration_cells"] = float(occupied)
                else:
                    level0 = level
                diagnostics["granularity_level"] = float(level0)
            cells = uniform_cells(level0, d)
            # The calibration counts (Morton order), pooled into the aggregation grid at its close.
            calibration = {"level": level, "reports": float(n), "counts": np.asarray(counts, dtype="<f8").tobytes(),
                           "std_errors": np.asarray(se, dtype="<f8").tobytes()} if n else None
            return self._to_aggregate(spec.round + 1, cells, leftover=[], level0=level0, diagnostics=diagnostics,
                                      warnings=warnings, estimate=estimate,
                                      calibrate_component=spec.tasks[0].components[0],
                                      state_extra={"calibration": calibration} if calibration else {})
        if variant == GridVariant.UNIFORM or level0 >= self.top_level and \
                variant == GridVariant.TREE:
            if variant != GridVariant.UNIFORM:
                warnings.append(f"the granularity level {level0} is the finest max_cells allows: no refinement")
            cells = uniform_cells(level0, d)
            return self._to_aggregate(spec.round + 1, cells, leftover=[g for gs in plan.refine for g in gs], level0=level0,
                                      diagnostics=diagnostics, warnings=warnings, estimate=estimate,
                                      calibrate_component=spec.tasks[0].components[0], state_extra={})
        if variant == GridVariant.TREE:
            height = int(p.tree_height) if p.tree_height else int(math.ceil(low - 1e-9)) + 1
            if math.isfinite(high):
                height = min(height, max(int(math.floor(high)), level0))
            height = max(level0, min(height, self.top_level, level0 + MAX_TREE_LEVELS - 1))
            levels = list(range(level0, height + 1))
            diagnostics["tree_height"] = float(height)
            tasks = []
            slots = plan.refine
            assignment: list[int] = []
            for i, groups in enumerate(slots):
                lv = levels[min(i, len(levels) - 1)]
                assignment.append(lv)
                tasks.append(GroupTask(groups=groups, components=(self._tree_component(lv, spec.round + 1),)))
            next_spec = self._spec(spec.round + 1, tasks)
            outcome_state = self._state(_PHASE_TREE, levels=levels, assignment=assignment)
            return RoundOutcome(estimates=frequency_estimates(estimate, spec.tasks[0].components[0]),
                                next_round=RoundPlan(spec=next_spec, engine_state=outcome_state),
                                diagnostics=diagnostics)
        cells = uniform_cells(level0, d)
        diagnostics["iteration_max_level"] = float(self._iteration_max_level(level0))
        return self._iterate_round(spec.round + 1, cells, iteration=0, history=[], level0=level0, diagnostics=diagnostics,
                                   estimate=estimate, component=spec.tasks[0].components[0],
                                   max_level=self._iteration_max_level(level0))

    def _iteration_max_level(self, level0: int) -> int:
        p = self.params
        if p.tree_height:
            return max(level0, min(int(p.tree_height), self.top_level))
        return min(self.top_level, level0 + MAX_TREE_LEVELS - 1)

    def _iterate_round(self, round_: int, cells: Sequence[TreeCell], *, iteration: int, history: list[Any], level0: int,
                       diagnostics: dict[str, float], estimate: FrequencyEstimate, component: Component,
                       max_level: int) -> RoundOutcome:
        groups = self.plan.refine[iteration]
        spec = self._spec(round_, [GroupTask(groups=groups, components=(self._list_component(cells, round_),))])
        state = self._state(_PHASE_ITERATE, iteration=iteration, cells=[[c.level, c.morton_index] for c in cells],
                            history=history, max_level=max_level, level0=level0)
        return RoundOutcome(estimates=frequency_estimates(estimate, component),
                            next_round=RoundPlan(spec=spec, engine_state=state), diagnostics=diagnostics)

    def _to_aggregate(self, round_: int, cells: Sequence[TreeCell], *, leftover: list[int], level0: int,
                      diagnostics: dict[str, float], warnings: list[str], estimate: FrequencyEstimate,
                      calibrate_component: Component, state_extra: dict[str, Any]) -> RoundOutcome:
        plan = self.plan
        if len(cells) > self.params.max_cells:
            raise ProtocolError(f"the refined grid has {len(cells)} cells, more than max_cells {self.params.max_cells}")
        if self.config.budget_policy == BudgetPolicy.SPLIT:
            groups = plan.aggregate
        else:
            groups = tuple(sorted({*plan.aggregate, *leftover}))
        component = self._list_component(cells, round_)
        spec = self._spec(round_, [GroupTask(groups=groups, components=(component,))])
        diagnostics["final_cells"] = float(len(cells))
        diagnostics["final_levels_min"] = float(min(c.level for c in cells))
        diagnostics["final_levels_max"] = float(max(c.level for c in cells))
        state = self._state(_PHASE_AGGREGATE, groups=list(groups), warnings=warnings, level0=level0, **state_extra)
        return RoundOutcome(estimates=frequency_estimates(estimate, calibrate_component),
                            next_round=RoundPlan(spec=spec, engine_state=state), diagnostics=diagnostics)

    def _close_tree(self, spec: RoundSpec, aggregators: dict[str, Any], state: dict[str, Any]) -> RoundOutcome:
        d, p = self.dimension, self.params
        levels: list[int] = [int(v) for v in state["levels"]]
        assignment: list[int] = [int(v) for v in state["assignment"]]
        z = float(p.dense_threshold)
        final: list[TreeCell] = []
        dense_final: list[TreeCell] = []
        candidates = list(uniform_cells(levels[0], d))
        diagnostics: dict[str, float] = {}
        warnings: list[str] = []
        first_estimate: FrequencyEstimate | None = None
        first_component: Component | None = None
        prior: list[list[float]] = []
        region_prior: list[list[float]] = []
        for depth, level in enumerate(levels):
            if not candidates:
                break
            slot_groups = [g for i, gs in enumerate(self.plan.refine) if assignment[i] == level for g in gs]
            values = np.array([c.morton_index for c in candidates], dtype=np.int64)
            estimate, counts, se, n = self._pooled(aggregators, spec, slot_groups, candidates=values)
            if first_estimate is None:
                first_estimate = estimate
                first_component = spec.task_for(slot_groups[0]).components[0]  # type: ignore[union-attr]
            warnings.extend(f"tree level {level}: {w}" for w in estimate.warnings)
            step = tree_level_step(candidates, counts, se, max(n, 1), d, z=z, last=depth == len(levels) - 1 or n == 0,
                                   dense_above=dense_final)
            if n:
                kept = set(step.final)
                for cell, c, s_ in zip(candidates, counts.tolist(), se.tolist()):
                    if cell in kept:
                        prior.append([cell.level, cell.morton_index, c / n, (s_ / n) ** 2])
                    elif depth == 0:  # refined at the granularity level: an estimate of the whole region
                        region_prior.append([cell.level, cell.morton_index, c / n, (s_ / n) ** 2])
            final.extend(step.final)
            dense_final.extend(c for c, dense in zip(step.final, step.final_dense) if dense)
            diagnostics[f"tree_level_{level}_reports"] = float(n)
            diagnostics[f"tree_level_{level}_candidates"] = float(len(candidates))
            diagnostics[f"tree_level_{level}_dense"] = float(step.dense)
            diagnostics[f"tree_level_{level}_refined"] = float(len(step.refine) // 2**d)
            candidates = list(step.refine)
        final.extend(candidates)  # unreachable in practice: the last level refines nothing
        cells = sorted(final)
        if len(cells) > p.max_cells:
            warnings.append(f"the tree produced {len(cells)} cells, more than max_cells {p.max_cells}; "
                            f"using the uniform grid at level {levels[0]}")
            cells = list(uniform_cells(levels[0], d))
            prior, region_prior = [], []
        assert first_estimate is not None and first_component is not None
        return self._to_aggregate(spec.round + 1, cells, leftover=[], level0=levels[0], diagnostics=diagnostics,
                                  warnings=warnings, estimate=first_estimate, calibrate_component=first_component,
                                  state_extra={"prior": prior, "region_prior": region_prior})

    def _close_iterate(self, spec: RoundSpec, aggregators: dict[str, Any], state: dict[str, Any]) -> RoundOutcome:
        d, p = self.dimension, self.params
        iteration = int(state["iteration"])
        cells = [TreeCell(level=int(lv), morton_index=int(ix)) for lv, ix in state["cells"]]
        history = {TreeCell(level=int(lv), morton_index=int(ix)): (float(rho), float(var))
                   for lv, ix, rho, var in state["history"]}
        max_level = int(state["max_level"])
        groups = self.plan.refine[iteration]
        estimate, counts, se, n = self._pooled(aggregators, spec, groups)
        component = spec.tasks[0].components[0]
        step = iterate_cells(cells, counts, se, max(n, 1), d, z=float(p.dense_threshold), max_level=max_level,
                             history=history)
        diagnostics = {
            f"iteration_{iteration + 1}_reports": float(n), f"iteration_{iteration + 1}_cells": float(len(cells)),
            f"iteration_{iteration + 1}_dense": float(step.dense), f"iteration_{iteration + 1}_merged": float(step.merged),
            f"iteration_{iteration + 1}_split": float(step.split),
        }
        new_cells = list(step.cells)
        warnings = list(estimate.warnings)
        if len(new_cells) > p.max_cells:
            warnings.append(f"iteration {iteration + 1} would make {len(new_cells)} cells, more than max_cells "
                            f"{p.max_cells}; stopping with the previous list")
            new_cells, changed = cells, False
        else:
            changed = step.changed
        last = iteration + 1 >= len(self.plan.refine)
        if changed and not last:
            packed_history = [[c.level, c.morton_index, rho, var] for c, (rho, var) in step.history.items()]
            out = self._iterate_round(spec.round + 1, new_cells, iteration=iteration + 1, history=packed_history,
                                      level0=int(state["level0"]),
                                      diagnostics=diagnostics, estimate=estimate, component=component,
                                      max_level=max_level)
            return out
        diagnostics["iterations"] = float(iteration + 1)
        if self.config.budget_policy == BudgetPolicy.SPLIT:
            leftover: list[int] = []
        else:
            leftover = [g for gs in self.plan.refine[iteration + 1:] for g in gs]
        final_set = set(new_cells)
        prior = [[c.level, c.morton_index, rho * math.ldexp(1.0, -c.level * d), var * math.ldexp(1.0, -2 * c.level * d)]
                 for c, (rho, var) in step.history.items() if c in final_set]
        return self._to_aggregate(spec.round + 1, new_cells, leftover=leftover, level0=int(state["level0"]),
                                  diagnostics=diagnostics,
                                  warnings=warnings, estimate=estimate, calibrate_component=component,
                                  state_extra={"prior": prior})

    def _close_aggregate(self, spec: RoundSpec, aggregators: dict[str, Any], state: dict[str, Any]) -> RoundOutcome:
        d, p = self.dimension, self.params
        groups = [int(g) for g in state["groups"]]
        task = spec.tasks[0]
        component = task.components[0]
        encoder = component.encoder
        assert isinstance(encoder, CellListEncoder)
        cells = list(encoder.cells)
        estimate, counts, se, n = self._pooled(aggregators, spec, groups)
        warnings = [str(w) for w in state.get("warnings", [])] + list(estimate.warnings)
        pooled_cells = 0
        calibration_gain = 1.0
        if n and state.get("prior"):
            counts, se, pooled_cells = _pool_prior(cells, counts, se, n, state["prior"])
        if n and state.get("calibration"):
            unpooled_se = float(se.max())
            counts, se = _pool_calibration(cells, counts, se, n, d, state["calibration"])
            # How much of the count error the calibration round removed (1 = none).
            calibration_gain = float(se.max()) / unpooled_se
        density_diagnostics: dict[str, float] = {}
        if n == 0:
            labels = np.full(len(cells), -1, dtype=np.int64)
            densities = np.zeros(len(cells))
            density_se = np.zeros(len(cells))
            clusters, borders, shares = 0, 0, tuple[float, ...]()
            dense_count = core_count = 0
            warnings.append("the aggregation round received no reports: every cell is noise")
        elif p.variant == GridVariant.DENSITY:
            labels, densities, density_se, dense, found = _density_aggregation(cells, counts, se, n, d)
            clusters, borders, shares = found.clusters, found.border_cells, found.cluster_shares
            dense_count, core_count = int(dense.sum()), 0
            density_diagnostics = {"dense_z": float(found.dense_z), "modes": float(found.modes),
                                   "calibration_pooled_std_error_ratio": calibration_gain,
                                   "smoothed_count_std_error": float(found.smoothed_std_error)}
            if found.mixture is not None:
                mixture = found.mixture
                density_diagnostics |= {
                    "gaussian_modes_split": float(mixture.modes_split),
                    "gaussian_mixture_components": float(mixture.mixture.components if mixture.mixture else 0),
                    "gaussian_mixture_chi2_excess_z": mixture.chi2_excess_z}
        else:
            agg = aggregate_cells(cells, counts, se, n, d, z_dense=float(p.dense_threshold),
                                  z_core=float(p.core_threshold), border=not p.no_border_cells,
                                  border_gap=math.ldexp(1.0, -int(state["level0"])) if "level0" in state else None,
                                  region_level=int(state["level0"]) if "level0" in state else None,
                                  region_priors={int(index): (float(p_) * n, float(v) * n * n)
                                                 for _, index, p_, v in state.get("region_prior", [])},
                                  min_cluster_z=NormalDist().inv_cdf(1.0 - CLUSTER_FALSE_POSITIVE_RATE / len(cells)),
                                  adjacency=touching(cells, d))
            labels, densities, density_se = agg.labels, agg.densities, agg.density_std_errors
            clusters, borders, shares = agg.clusters, agg.border_cells, agg.cluster_shares
            dense_count, core_count = int(agg.dense.sum()), int(agg.core.sum())
        if clusters == 0:
            warnings.append("no cluster was found: no cell is significantly denser than the uniform share")
        # The published estimates are the counts the densities come from (pooled over groups and priors).
        estimates = frequency_estimates(_with_counts(estimate, counts, se, n) if n else estimate, component)
        cell_map = CellClusterModel(domain=self.domain, cells=tuple(cells), labels=tuple(labels.tolist()),
                                    densities=tuple(densities.tolist()), density_std_errors=tuple(density_se.tolist()))
        result = Result(state=CampaignState.FINISHED, estimates=estimates, warnings=tuple(warnings),
                        clustering=Clustering(k=clusters, dimension=d, weights=tuple(shares), cell_map=cell_map))
        diagnostics = {
            "aggregation_reports": float(n), "final_cells": float(len(cells)), "clusters": float(clusters),
            "dense_cells": float(dense_count), "core_cells": float(core_count), "border_cells": float(borders),
            "noise_cells": float(int((labels < 0).sum())), "cells_pooled_with_refinement": float(pooled_cells),
            "count_std_error": float(se.max()) if len(se) else 0.0,
            "epsilon_per_report": float(self.plan.round_epsilon),
            "variant": float(p.variant), "granularity_rule": float(p.granularity), **density_diagnostics,
        }
        return RoundOutcome(estimates=estimates, result=result, diagnostics=diagnostics)


def _density_aggregation(cells: Sequence[TreeCell], counts: NDArray[np.float64], se: NDArray[np.float64], n: int,
                         d: int) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64],
                                          NDArray[np.bool_], DensityClustering]:
    """The DENSITY aggregation of a uniform grid's cells (in any order): labels, the smoothed relative
    densities and their standard errors, the dense cells, and the clustering."""
    level = cells[0].level
    position = _grid_position(cells, d)
    grid = np.zeros((1 << level,) * d, dtype=np.float64)
    grid[position] = counts
    grid_se = np.full_like(grid, float(se.max()))
    grid_se[position] = se
    # The oracle's count error is the same for every cell up to the small signal term: the
    # largest keeps every density test conservative; the mixture's chi-square uses each cell's own.
    found = cluster_density(grid, float(se.max()), float(n), std_errors=grid_se)
    volume = math.ldexp(1.0, -level * d)
    densities = found.smoothed[position] / (n * volume)
    density_se = np.full(len(cells), found.smoothed_std_error / (n * volume))
    return found.labels[position], densities, density_se, found.dense[position], found


def _grid_position(cells: Sequence[TreeCell], d: int) -> tuple[NDArray[np.int64], ...]:
    """Where each cell of a whole uniform grid (any order) sits in its ``(2^level,) * d`` array."""
    level = cells[0].level
    if len(cells) != (1 << level) ** d or any(c.level != level for c in cells):
        raise ProtocolError("the DENSITY aggregation needs the whole uniform grid of one level")
    coords = np.array([tree_coordinates(c, d) for c in cells], dtype=np.int64).reshape(len(cells), d)
    return tuple(coords.T)


def _pool_calibration(cells: Sequence[TreeCell], counts: NDArray[np.float64], se: NDArray[np.float64], n: int, d: int,
                      calibration: Mapping[str, Any]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The aggregation counts made consistent with the calibration round's counts of the same population
    (:func:`~ldp_collector.estimation.density_clustering.pool_levels`), in the order of ``cells``.

    ``calibration`` holds the calibration grid's level, its report count and its counts and
    standard errors (float64, Morton order); they are scaled to the aggregation's ``n`` reports.
    """
    level = int(calibration["level"])
    other = np.frombuffer(calibration["counts"], dtype="<f8")
    other_se = np.frombuffer(calibration["std_errors"], dtype="<f8")
    if not other.size == other_se.size == (1 << level) ** d or not float(calibration["reports"]) > 0:
        raise ProtocolError(f"unreadable grid engine state: a calibration grid of {other.size} counts and "
                            f"{other_se.size} standard errors at level {level} in {d} dimensions")
    scale = n / float(calibration["reports"])
    position = _grid_position(cells, d)
    grid = np.zeros((1 << cells[0].level,) * d)
    grid_se = np.ones_like(grid)
    grid[position], grid_se[position] = counts, se
    calibration_cells = uniform_cells(level, d)
    other_position = _grid_position(calibration_cells, d)
    other_grid = np.zeros((1 << level,) * d)
    other_se_grid = np.ones_like(other_grid)
    other_grid[other_position], other_se_grid[other_position] = other * scale, other_se * scale
    pooled, pooled_se = pool_levels(grid, grid_se, other_grid, other_se_grid)
    return pooled[position], pooled_se[position]


def _with_counts(estimate: FrequencyEstimate, counts: NDArray[np.float64], se: NDArray[np.float64],
                 n: int) -> FrequencyEstimate:
    """``estimate`` with pooled counts, standard errors and report count (intervals recomputed)."""
    z = estimate.z
    return replace(estimate, counts=counts, std_errors=se, n=n, ci_lower=counts - z * se, ci_upper=counts + z * se)


def _pool_prior(cells: Sequence[TreeCell], counts: NDArray[np.float64], se: NDArray[np.float64], n: int,
                prior: Sequence[Sequence[float]]) -> tuple[NDArray[np.float64], NDArray[np.float64], int]:
    """Combine the aggregation group's counts with the refinement groups' estimates of the same cells.

    ``prior`` rows are ``(level, morton_index, share, variance of the share)``: unbiased estimates
    of the share of the population in a cell, from reports of other devices (the tree level or
    the iterations that estimated exactly that cell). Each cell's share is the inverse-variance
    weighted mean of the two independent unbiased estimates; returned on the aggregation group's
    count scale (``n`` reports), so every report of the campaign informs the final densities.
    """
    position = {cell: i for i, cell in enumerate(cells)}
    share = counts / n
    var = (se / n) ** 2
    pooled = 0
    for level, index, p, v in prior:
        i = position.get(TreeCell(level=int(level), morton_index=int(index)))
        if i is None or not (v > 0 and var[i] > 0):
            continue
        w_old, w_new = 1.0 / float(v), 1.0 / float(var[i])
        share[i] = (float(p) * w_old + share[i] * w_new) / (w_old + w_new)
        var[i] = 1.0 / (w_old + w_new)
        pooled += 1
    return share * n, np.sqrt(var) * n, pooled


def _check_cli(given: Mapping[str, Any]) -> None:
    """The flags a variant takes (say so, naming the default variant, when a flag needs another)."""
    variant = given.get("variant")
    default = DEFAULT_VARIANT.name.lower()
    named = variant or f"{default} (the default)"
    if "max_iterations" in given and variant != "iterative":
        raise ValueError(f"--max-iterations applies to the iterative grid variant (--variant iterative), not {named}")
    if "tree_height" in given and (variant or default) in ("uniform", "density"):
        raise ValueError(f"--tree-height applies to the tree and iterative grid variants, not {named}")
    if "granularity" in given and (variant or default) == "density":
        raise ValueError(f"--granularity applies to the uniform, tree and iterative grid variants, not {named}: it "
                         f"chooses its level from the noise (--granularity-level fixes one)")


def _simulation_report(config: CampaignConfig) -> dict[str, Any]:
    params: GridParams = config.parameters
    return {"variant": GridVariant(params.variant).name.lower(),
            "granularity": Granularity(params.granularity).name.lower(),
            "budget_policy": BudgetPolicy(config.budget_policy or BudgetPolicy.PARTITION).name.lower(),
            "initial_cells_per_dimension": params.initial_cells_per_dimension}


#: Command line: the initial grid, the variant, the granularity rule or level, the tree height and
#: the iterations (unset: the engine's defaults).
CLI = KindCli(
    result="clustering",
    params=(
        CliParam(flag="--cells", field="initial_cells_per_dimension", type="cells", metavar="M[,M2...]",
                 numeric_only=True, help="the initial cells per dimension"),
        CliParam(flag="--variant", field="variant", type="choice",
                 choices=(("uniform", GridVariant.UNIFORM), ("density", GridVariant.DENSITY),
                          ("tree", GridVariant.TREE), ("iterative", GridVariant.ITERATIVE)),
                 help="uniform (UGC, no feedback), density (noise-derived density modes, not in the paper; "
                      "default), tree (TreeAdaptive) or iterative (IterAdaptive)"),
        CliParam(flag="--granularity", field="granularity", type="choice",
                 choices=(("paper", Granularity.PAPER), ("consistent", Granularity.CONSISTENT)),
                 help="cell side rule: paper (Theorem 1 as printed) or consistent (default)"),
        CliParam(flag="--granularity-level", field="granularity_level", type="uint32", metavar="LEVEL",
                 help="fix the grid's dyadic level (2^LEVEL cells per dimension) instead of the rule"),
        CliParam(flag="--tree-height", field="tree_height", type="uint32",
                 help="deepest tree level the refinement may reach (tree and iterative variants)"),
        CliParam(flag="--max-cells", field="max_cells", type="uint32", metavar="C",
                 help=f"largest number of cells in any reported grid, in [2^d, {MAX_GRID_CELLS}] "
                      f"(default {DEFAULT_MAX_CELLS}, enough for 12 dimensions; each one more needs twice the cells)"),
        CliParam(flag="--max-iterations", field="max_iterations", type="uint32",
                 help=f"most merge/split rounds (iterative variant; default {DEFAULT_MAX_ITERATIONS})"),
        CliParam(flag="--seed-pool", field="seed_pool_size", type="uint32", metavar="S",
                 help="local-hashing rounds (grids above 1024 cells) from a public pool of S seeds, a fresh pool "
                      "each round (docs/protocol.md §14; 0: per-report seeds)"),
    ),
    check=_check_cli, report=_simulation_report, plotted=True)

#: The GRID campaign kind (registered by :mod:`ldp_collector.kinds.registry`).
KIND = Kind(name="grid", engine=GridEngine,
            params=GridParams,
            domains=frozenset({NUMERIC}), clustering=True,
            cli=CLI)
