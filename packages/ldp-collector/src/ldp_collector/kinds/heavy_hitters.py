"""HEAVY_HITTERS campaigns: a prefix tree over integer values, all levels in one round.

Values are integers in [0, 2^value_bits) (the campaign's categorical domain [0, N) with
``value_bits`` >= log2 N). The prefix tree has L = ceil(value_bits / bits_per_level) levels; level
l holds the top m_l = min(l bits_per_level, value_bits) bits of a value. The budget policy is
PARTITION: the devices are split into L equally weighted groups, and group l - 1 reports, once and
with the whole epsilon, the level-l prefix of its value through the variance-optimal frequency
oracle over 2^(m_l) values (GRR on small top levels, local hashing below;
:func:`ldp_collector.estimation.heavy_hitters.level_params`). All groups report in the same
round, so the campaign needs one round and every device spends epsilon once.

At close the server walks the tree top-down (:func:`ldp_collector.estimation.heavy_hitters.
next_candidates`): level 1 tests every prefix, every further level tests the children of the
previous level's survivors (candidate-restricted estimation, O(n x candidates) hashes), keeping
those above the Bonferroni-corrected threshold tau = z sigma_0 with z = Phi^-1(1 - alpha / (2 m))
for m candidates and family-wise false-positive rate alpha, at most ``max_candidates`` per level.
The last level's survivors are the heavy hitters, with counts rescaled to the whole population
and standard errors that include the group-sampling variance.

Device encoding of a prefix
    The SDK has no encoder "top m bits of an integer" yet. The level-l prefix is computed exactly
    by the dyadic :class:`~ldp_client.encoders.grid.GridTreeEncoder` over the one-dimensional
    domain [0, 2^value_bits] at level m_l: the normalized point is v / 2^value_bits (exact, a
    power-of-two division) and its level-m cell is floor(v 2^(m - value_bits)) = v >> (value_bits
    - m). The device's point is therefore the one-element sequence ``(v,)``, not ``v``. Values
    travel as floats through that encoder, so ``value_bits`` is at most 53 (every integer below
    2^53 is exact).

A public seed pool
    With ``seed_pool_size`` S > 0 the local-hashing levels take their seeds from one public pool of
    S seeds (``docs/protocol.md`` §14; the key is the round's,
    :func:`~ldp_collector.kinds.common.seed_pool_key`): their accumulators keep S x g counts at
    ingestion and each level's candidate supports cost S x candidates hashes instead of
    n_l x candidates. Choose S with :func:`ldp_client.mechanisms.local_hashing.seed_pool_size_for`
    for a level's group size and the concentration of its prefixes.

SPLIT budget policy
    Not supported: with all levels in one round there is nothing to split, and a multi-round
    variant would need the candidate-restricted encoder above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ldp_client.encoders.base import NumericDomain
from ldp_client.encoders.grid import GridTreeEncoder
from ldp_client.errors import InvalidParameterError
from ldp_client.mechanisms import MechanismParams
from ldp_client.spec import MAX_GROUPS, Component, GroupTask, RoundSpec

from ..errors import InvalidArgumentError
from ..estimation.accumulators import component_params_from_spec, make_accumulate_fn
from ..estimation.heavy_hitters import (
    MAX_BITS_PER_LEVEL,
    MAX_CANDIDATES,
    HeavyHitterConfig,
    LevelOutcome,
    first_candidates,
    level_params,
    next_candidates,
)
from ..model import BudgetPolicy, CampaignConfig, CampaignState, Estimate, Estimates, HeavyHitter, Result
from ..storage.base import AccumulateFn
from .base import (
    CATEGORICAL,
    CampaignEngine,
    CliParam,
    Kind,
    KindCli,
    KindParams,
    RoundOutcome,
    RoundPlan,
    RoundReports,
)
from .common import DEFAULT_CONFIDENCE, allowed_oracles, check_report_epsilon, check_seed_pool_size, with_seed_pool
from .histogram import aggregator_for, round_aggregators

__all__ = [
    "KIND",
    "DEFAULT_FALSE_POSITIVE_RATE",
    "DEFAULT_MAX_CANDIDATES",
    "MAX_VALUE_BITS",
    "HeavyHitterEngine",
    "HeavyHitterParams",
    "default_bits_per_level",
    "prefix_domain",
]

#: Values pass through a float-valued encoder (module docstring), exact below 2^53.
MAX_VALUE_BITS = 53
DEFAULT_FALSE_POSITIVE_RATE = 0.05
DEFAULT_MAX_CANDIDATES = 64
#: Up to this many value bits the tree has a single level (the whole domain is tested at once).
_SINGLE_LEVEL_BITS = 8
_DEFAULT_BITS_PER_LEVEL = 4


def default_bits_per_level(value_bits: int) -> int:
    """``value_bits`` itself up to 8 bits (one level), else 4 bits per level.

    Fewer levels mean larger groups (less noise per level); more bits per level mean more
    candidates per level (server cost ``max_candidates * 2^bits_per_level`` hashes per report and
    a larger Bonferroni correction). Four bits keeps the candidate set at most 1024 by default.
    """
    return value_bits if value_bits <= _SINGLE_LEVEL_BITS else _DEFAULT_BITS_PER_LEVEL


def prefix_domain(value_bits: int) -> NumericDomain:
    """The one-dimensional domain [0, 2^value_bits] whose dyadic cells are the value prefixes."""
    return NumericDomain(lower=(0.0,), upper=(float(2**value_bits),))


@dataclass(frozen=True, kw_only=True)
class HeavyHitterParams(KindParams):
    """``ldp.v1.HeavyHitterParameters``; :meth:`resolve` fills every field.

    Attributes
    ----------
    value_bits : int
        Values are integers in [0, 2^value_bits) (0 = ceil(log2 N), at most 53).
    bits_per_level : int
        Bits added per level of the prefix tree (0 = :func:`default_bits_per_level`).
    false_positive_rate : float
        Family-wise false-positive rate of the thresholds, in (0, 1) (0 = 0.05).
    max_candidates : int
        Largest number of prefixes kept per level (0 = 64).
    seed_pool_size : int
        The local-hashing levels' public seed pool (``docs/protocol.md`` §14; 0 = per-report seeds).
    """

    value_bits: int = 0
    bits_per_level: int = 0
    false_positive_rate: float = 0.0
    max_candidates: int = 0
    seed_pool_size: int = 0

    def resolve(self, config: CampaignConfig) -> HeavyHitterParams:
        """The parameters with every default filled in (see :meth:`KindParams.resolve`).

        Raises
        ------
        InvalidArgumentError
            A numeric domain, the SPLIT budget policy, epsilon above 20, or parameters out of range.
        """
        if config.domain.which != "categorical_size":
            raise InvalidArgumentError(
                "a heavy-hitter campaign needs a categorical domain (values are integers in [0, categorical_size))")
        if config.budget_policy == BudgetPolicy.SPLIT:
            raise InvalidArgumentError(
                "heavy-hitter campaigns support the PARTITION budget policy only (all levels report in one round)")
        check_report_epsilon(config.epsilon, "a heavy-hitter device")
        size = config.domain.categorical_size
        needed = max(1, math.ceil(math.log2(size))) if size > 1 else 1
        while 2**needed < size:  # guard against log2 rounding for huge sizes
            needed += 1
        if needed > MAX_VALUE_BITS:
            raise InvalidArgumentError(
                f"heavy_hitters supports at most 2^{MAX_VALUE_BITS} values (values travel as exact floats), got {size}")
        value_bits = self.value_bits or needed
        if not needed <= value_bits <= MAX_VALUE_BITS:
            raise InvalidArgumentError(
                f"heavy_hitters.value_bits must be in [{needed}, {MAX_VALUE_BITS}] for {size} values, "
                f"got {value_bits}")
        bits_per_level = self.bits_per_level or default_bits_per_level(value_bits)
        if not 1 <= bits_per_level <= min(MAX_BITS_PER_LEVEL, value_bits):
            raise InvalidArgumentError(
                f"heavy_hitters.bits_per_level must be in [1, {min(MAX_BITS_PER_LEVEL, value_bits)}], "
                f"got {bits_per_level}")
        false_positive_rate = self.false_positive_rate or DEFAULT_FALSE_POSITIVE_RATE
        if not (math.isfinite(false_positive_rate) and 0.0 < false_positive_rate < 1.0):
            raise InvalidArgumentError(
                f"heavy_hitters.false_positive_rate must be in (0, 1), got {false_positive_rate!r}")
        max_candidates = self.max_candidates or DEFAULT_MAX_CANDIDATES
        if not 1 <= max_candidates <= MAX_CANDIDATES:
            raise InvalidArgumentError(
                f"heavy_hitters.max_candidates must be in [1, {MAX_CANDIDATES}], got {max_candidates}")
        check_seed_pool_size(self.seed_pool_size, config, "heavy_hitters.seed_pool_size")
        return replace(self, value_bits=value_bits, bits_per_level=bits_per_level,
                       false_positive_rate=false_positive_rate, max_candidates=max_candidates)


class HeavyHitterEngine(CampaignEngine):
    """Engine of ``HEAVY_HITTERS`` campaigns (module docstring).

    Parameters
    ----------
    campaign_id : str
    config : ldp.v1.CampaignConfig
        Validated by :func:`ldp_collector.campaigns.prepare_campaign`: a categorical domain.
    params : HeavyHitterParams
        Resolved (:meth:`HeavyHitterParams.resolve`): ``value_bits`` = ceil(log2 N),
        ``bits_per_level`` from :func:`default_bits_per_level`, ``false_positive_rate`` 0.05,
        ``max_candidates`` 64 unless set.

    Raises
    ------
    InvalidArgumentError
        A prefix tree the SDK refuses, or more levels than a round has groups.
    """

    params: HeavyHitterParams

    def __init__(self, campaign_id: str, config: CampaignConfig, params: HeavyHitterParams) -> None:
        super().__init__(campaign_id, config, params)
        try:
            self.tree = HeavyHitterConfig(
                value_bits=params.value_bits, bits_per_level=params.bits_per_level, epsilon=config.epsilon,
                false_positive_rate=params.false_positive_rate, max_candidates=params.max_candidates,
                oracles=allowed_oracles(config))
        except InvalidParameterError as exc:
            raise InvalidArgumentError(f"heavy_hitters: {exc}") from None
        if self.tree.levels > MAX_GROUPS:
            raise InvalidArgumentError(f"heavy_hitters: {self.tree.levels} levels exceed {MAX_GROUPS} groups")
        domain = prefix_domain(params.value_bits)
        try:
            self.components = tuple(
                Component(encoder=GridTreeEncoder(domain=domain, level=self.tree.prefix_bits(level)),
                          mechanism=self._pooled(level_params(self.tree, level)))
                for level in range(1, self.tree.levels + 1))
        except InvalidParameterError as exc:
            raise InvalidArgumentError(f"heavy_hitters: {exc}") from None

    def _pooled(self, mechanism: MechanismParams) -> MechanismParams:
        """A local-hashing level's mechanism with the campaign's seed pool (round 1's key)."""
        return with_seed_pool(mechanism, self.config, 1, self.params.seed_pool_size, "heavy_hitters")

    def first_round(self) -> RoundPlan:
        """Round 1: group l - 1 reports its level-l prefix, for every level l, all at once."""
        levels = self.tree.levels
        spec = RoundSpec(
            campaign_id=self.campaign_id, round=1, group_weights=(1,) * levels,
            tasks=tuple(GroupTask(groups=(level,), components=(self.components[level],)) for level in range(levels)),
            campaign_epsilon=self.config.epsilon, max_reports_per_device=1, kind="heavy_hitters")
        return RoundPlan(spec=spec)

    def accumulate_fn(self, spec: RoundSpec) -> AccumulateFn | None:
        """Per-level count accumulators (the top GRR/unary levels) and report counts (local hashing)."""
        return make_accumulate_fn(component_params_from_spec(spec))

    def close_round(self, spec: RoundSpec, reports: RoundReports, engine_state: bytes) -> RoundOutcome:
        """Walk the prefix tree top-down and finish with the heavy hitters."""
        tree = self.tree
        aggregators = round_aggregators(spec, reports)
        share = 1.0 / tree.levels  # equal group weights: each level's expected share of the devices
        warnings: list[str] = []
        diagnostics: dict[str, float] = {
            "reports": float(reports.count), "epsilon": float(tree.epsilon), "levels": float(tree.levels),
            "value_bits": float(tree.value_bits), "bits_per_level": float(tree.bits_per_level),
            "false_positive_rate": float(tree.false_positive_rate),
        }
        candidates = first_candidates(tree)
        prev: NDArray[np.int64] | None = None
        outcome: LevelOutcome | None = None
        for level in range(1, tree.levels + 1):
            aggregator = aggregator_for(aggregators, spec, group=level - 1)
            estimate = aggregator.estimate(DEFAULT_CONFIDENCE, candidates=candidates)
            warnings.extend(f"level {level}: {w}" for w in estimate.warnings)
            outcome = next_candidates(prev, estimate, config=tree, level=level, group_share=share)
            diagnostics[f"level_{level}_reports"] = float(estimate.n)
            diagnostics[f"level_{level}_tested"] = float(outcome.tested)
            diagnostics[f"level_{level}_z"] = float(outcome.z)
            diagnostics[f"level_{level}_threshold"] = float(outcome.threshold)
            diagnostics[f"level_{level}_survivors"] = float(outcome.survivors.size)
            if outcome.capped:
                warnings.append(f"level {level}: more than {tree.max_candidates} prefixes passed the threshold; "
                                "kept the largest")
            if not outcome.survivors.size:
                warnings.append(f"level {level}: no prefix passed the threshold {outcome.threshold:.4g} "
                                f"(on the group's count scale); no heavy hitter is detectable")
                break
            prev, candidates = outcome.survivors, outcome.next_candidates
        final = outcome if outcome is not None and outcome.level == tree.levels else None
        z = NormalDist().inv_cdf(0.5 + DEFAULT_CONFIDENCE / 2.0)
        last = self.components[-1]
        found = (list(zip(final.survivors.tolist(), final.counts.tolist(), final.std_errors.tolist()))
                 if final is not None else [])
        estimates = Estimates(
            reports=reports.count, mechanism=last.mechanism, encoder=last.encoder, confidence=DEFAULT_CONFIDENCE,
            estimates=tuple(Estimate(value=value, count=count, std_error=se, ci_lower=count - z * se,
                                     ci_upper=count + z * se) for value, count, se in found),
            warnings=tuple(warnings))
        result = Result(state=CampaignState.FINISHED, estimates=estimates, warnings=tuple(warnings),
                        heavy_hitters=tuple(HeavyHitter(value=value, count=count, std_error=se)
                                            for value, count, se in found))
        diagnostics["heavy_hitters"] = float(len(result.heavy_hitters))
        return RoundOutcome(estimates=estimates, result=result, diagnostics=diagnostics)


def _simulation_cells(d: int) -> int:
    """A simulation of numeric points: each point's grid cell is its value, 32 cells per dimension in 1-D
    and 2-D, 4 beyond."""
    return 32 if d <= 2 else 4


def _simulation_report(config: CampaignConfig) -> dict[str, Any]:
    params: HeavyHitterParams = config.parameters
    return {"value_bits": params.value_bits}


#: Command line: the value bits, the prefix bits per level, the false-positive rate and the candidates kept.
CLI = KindCli(
    result="heavy_hitters",
    params=(
        CliParam(flag="--value-bits", field="value_bits", type="uint32", help="values are in [0, 2^bits)"),
        CliParam(flag="--bits-per-level", field="bits_per_level", type="uint32", help="prefix bits per level"),
        CliParam(flag="--false-positive-rate", field="false_positive_rate", type="positive_float",
                 help="family-wise rate"),
        CliParam(flag="--max-candidates", field="max_candidates", type="uint32", help="prefixes kept per level"),
        CliParam(flag="--seed-pool", field="seed_pool_size", type="uint32", metavar="S",
                 help="local-hashing levels from a public pool of S seeds (docs/protocol.md §14; 0: per-report seeds)"),
    ),
    default_cells=_simulation_cells, report=_simulation_report)

#: The HEAVY_HITTERS campaign kind (registered by :mod:`ldp_collector.kinds.registry`).
KIND = Kind(name="heavy_hitters", engine=HeavyHitterEngine,
            params=HeavyHitterParams,
            domains=frozenset({CATEGORICAL}),
            cli=CLI)
