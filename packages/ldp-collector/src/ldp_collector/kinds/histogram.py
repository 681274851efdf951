"""HISTOGRAM campaigns: one round, one group, one frequency oracle over the whole domain.

Every device reports once, with the campaign's whole epsilon (the budget policy makes no
difference with a single round), the randomized index of its value:

* a categorical domain of size D: the value itself (:class:`~ldp_client.encoders.categorical.
  CategoricalEncoder`);
* a numeric domain: the index of its cell in a uniform grid of ``cells_per_dimension`` cells
  (:class:`~ldp_client.encoders.grid.UniformGridEncoder`; row-major, last dimension fastest; the
  cell geometry is ``ldp_client.encoders.geometry``'s).

The oracle is ``HistogramParameters.oracle`` or, when unspecified, the variance-optimal one that
fits ``max_payload_bits`` (:func:`ldp_client.mechanisms.choose_frequency_oracle`). Closing the round
yields one unbiased count per domain value with its analytic standard error and normal interval
(:mod:`ldp_collector.estimation.frequency`), optionally made consistent (non-negative, summing to
n: ``HistogramParameters.consistency``), and finishes the campaign.

Cost: GRR and unary encoding are estimated from the per-round count accumulator maintained at
ingestion (O(D) at close); local hashing needs the raw reports (O(n D) hashes at close), unless
its seeds come from a public pool (``HistogramParameters.seed_pool_size``, or the default size from
``seed_pool_concentration``; ``docs/protocol.md`` §14): then the accumulator keeps the S x g counts
per (pool seed, bucket) and the supports cost O(S D) at close. Each round has its own pool key
(:func:`~ldp_collector.kinds.common.seed_pool_key`).

Hamming weights of unary-encoding rounds
----------------------------------------
Closing a unary-encoding round (up to :data:`MAX_WEIGHT_CHECK_REPORTS` reports) also counts the
reports of every Hamming weight and flags the weights that honest devices produce far less often
(:func:`ldp_collector.defences.weight_excess`, alpha = 0.01 over all weights): warnings
``"implausible: k reports have w bits set ..."`` and the ``implausible_weights`` diagnostic. It
reads the raw reports once (O(n) at close).

Windows and anomaly flags
-------------------------
With ``HistogramParameters.windows`` = W (2 to 64; 0 or 1 = one window) the campaign collects W
successive rounds ("windows") with the same oracle, each estimated on its own, and finishes after
the last; the result holds the last window's estimates. Budget: with the ``PARTITION`` policy every
window spends the whole epsilon and a device reports in one window only (``max_reports_per_device``
is 1, which the device's ledger enforces); with ``SPLIT`` each window spends epsilon / W and a device
may report in every window. Closing window k > 1 compares every value's estimated frequency with
window k - 1 (:func:`ldp_collector.defences.anomaly_flags`: ``|f_k - f_{k-1}| > z sqrt(SE_k^2 +
SE_{k-1}^2)``, z the normal quantile at alpha / (2 D), Bonferroni over the D values, alpha =
``HistogramParameters.anomaly_alpha``, default 0.01): flagged values become warnings of the window's
estimates (``"anomaly: value v: frequency moved from a to b (z = ...)"``), the
``anomaly_flags`` diagnostic and a log warning. Without a change in the population, a window
raises any flag with probability at most about alpha; a poisoning attack that starts in some
window shows as flags on its target values. Windows need a domain of at most 65536 values (the
previous window's estimates travel in the engine state).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgpack
import numpy as np
from numpy.typing import NDArray

from ldp_client.budget import equal_share
from ldp_client.encoders.base import Encoder
from ldp_client.encoders.categorical import CategoricalEncoder
from ldp_client.encoders.grid import UniformGridEncoder
from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import (
    GRRParams,
    LocalHashingParams,
    MechanismParams,
    UnaryEncodingParams,
    UnaryVariant,
    choose_frequency_oracle,
    oue,
    sue,
)
from ldp_client.mechanisms.local_hashing import MAX_SEED_POOL, seed_pool_size_for
from ldp_client.mechanisms.oracle_choice import FREQUENCY_ORACLES, frequency_oracle_candidates
from ldp_client.spec import Component, GroupTask, RoundSpec

from ..defences import DEFAULT_ANOMALY_ALPHA, anomaly_flags, weight_excess
from ..errors import InvalidArgumentError
from ..estimation.accumulators import (
    ComponentParams,
    CountAccumulator,
    RoundCounts,
    SupportCounts,
    accumulator_key,
    component_params_from_spec,
    keeps_counts,
    make_accumulate_fn,
)
from ..estimation.frequency import (
    MAX_DENSE_DOMAIN,
    MAX_POOL_CELLS,
    FrequencyAggregator,
    FrequencyEstimate,
    make_aggregator,
)
from ..estimation.report_accumulator import ReportAccumulator
from ..model import BudgetPolicy, CampaignConfig, CampaignState, Estimate, Estimates, Result
from ..storage.base import AccumulateFn, StoredReport
from .base import (
    CATEGORICAL,
    NUMERIC,
    CampaignEngine,
    CliParam,
    Kind,
    KindCli,
    KindParams,
    RoundOutcome,
    RoundPlan,
    RoundReports,
)
from .common import DEFAULT_CONFIDENCE, ProtoEnum, allowed_oracles, check_report_epsilon, seed_pool_key

__all__ = [
    "KIND",
    "MAX_WINDOWS",
    "MAX_HISTOGRAM_CELLS",
    "FrequencyOracle",
    "HistogramEngine",
    "HistogramParams",
    "RoundSupportAggregator",
    "aggregator_for",
    "default_cells_per_dimension",
    "frequency_estimates",
    "frequency_oracle",
    "histogram_encoder",
    "round_aggregators",
]

log = logging.getLogger(__name__)

#: Largest histogram: every value gets an estimate, so the domain must be enumerable.
MAX_HISTOGRAM_CELLS = MAX_DENSE_DOMAIN
#: Default grid: about this many cells in total, at most 32 per dimension, at least 2.
_DEFAULT_GRID_CELLS = 4096
_MAX_DEFAULT_PER_DIMENSION = 32
#: Most windows of one histogram campaign.
MAX_WINDOWS = 64
#: Largest domain of a windowed histogram (the previous window's estimates are engine state).
MAX_WINDOWED_DOMAIN = 1 << 16
#: Rounds with more reports skip the Hamming-weight count at close (it reads every raw report).
MAX_WEIGHT_CHECK_REPORTS = 4_000_000
#: Number of set bits of every byte value.
_POPCOUNT = np.array([bin(b).count("1") for b in range(256)], dtype=np.int64)


class FrequencyOracle(ProtoEnum):
    """``ldp.v1.FrequencyOracle``."""

    FREQUENCY_ORACLE_UNSPECIFIED = 0
    GRR = 1
    SUE = 2
    OUE = 3
    OLH = 4


def default_cells_per_dimension(dimension: int) -> int:
    """Cells per dimension of the default grid: the largest m <= 32 with m^d <= 4096 (at least 2)."""
    m = _MAX_DEFAULT_PER_DIMENSION
    while m > 2 and m**dimension > _DEFAULT_GRID_CELLS:
        m -= 1
    return m


def frequency_oracle(oracle: int, domain_size: int, epsilon: float, max_payload_bits: int,
                     oracles: frozenset[str] | None = None) -> MechanismParams:
    """The mechanism of a ``FrequencyOracle`` choice (``FREQUENCY_ORACLE_UNSPECIFIED``: chosen by variance).

    Parameters
    ----------
    oracle : int
        An ``ldp.v1.FrequencyOracle`` value. OLH under a cap its variance-optimal hash range does not
        fit takes the most buckets that fit, as :func:`~ldp_client.mechanisms.choose_frequency_oracle`
        does.
    domain_size : int
    epsilon : float
    max_payload_bits : int
        0 for no cap.
    oracles : frozenset of str, optional
        The campaign's allowed oracles (:func:`~ldp_collector.kinds.common.allowed_oracles`);
        ``None`` for any.

    Raises
    ------
    InvalidArgumentError
        Unknown oracle, one outside ``oracles``, parameters out of the oracle's range, or a payload
        above the cap.
    """
    cap = max_payload_bits or None
    # A named oracle (numbers 1.. are FREQUENCY_ORACLES in order) must be one the campaign allows.
    if oracles is not None and 1 <= int(oracle) <= len(FREQUENCY_ORACLES) and FREQUENCY_ORACLES[int(oracle) - 1] not in oracles:
        raise InvalidArgumentError(
            f"histogram.oracle {FrequencyOracle(oracle).name} is not one of the campaign's oracles "
            f"({', '.join(sorted(oracles))})")
    try:
        if oracle == FrequencyOracle.FREQUENCY_ORACLE_UNSPECIFIED:
            return choose_frequency_oracle(domain_size, epsilon, cap, oracles=oracles)
        params: MechanismParams
        if oracle == FrequencyOracle.GRR:
            params = GRRParams(domain_size=domain_size, epsilon=epsilon)
        elif oracle == FrequencyOracle.SUE:
            params = sue(domain_size, epsilon)
        elif oracle == FrequencyOracle.OUE:
            params = oue(domain_size, epsilon)
        elif oracle == FrequencyOracle.OLH:
            params = LocalHashingParams(domain_size=domain_size, epsilon=epsilon)
            if cap is not None and params.payload_bits > cap:
                # Under a cap the variance-optimal choice can be OLH with fewer buckets, which the resolved
                # parameters record as OLH: that same hash range must come back from them.
                params = next((c for c in frequency_oracle_candidates(domain_size, epsilon, cap)
                               if isinstance(c, LocalHashingParams)), params)
        else:
            raise InvalidArgumentError(f"histogram.oracle {oracle} is not a known frequency oracle")
    except InvalidParameterError as exc:
        raise InvalidArgumentError(f"histogram oracle: {exc}") from None
    if cap is not None and params.payload_bits > cap:
        raise InvalidArgumentError(
            f"histogram.oracle {params.KIND} needs {params.payload_bits} bits per report over {domain_size} values, "
            f"more than max_payload_bits {cap}")
    return params


def frequency_estimates(estimate: FrequencyEstimate, component: Component, *,
                        values_offset: int = 0) -> Estimates:
    """The published :class:`~ldp_collector.model.Estimates` of a frequency estimate (campaign id
    and round are set by the collector).

    Parameters
    ----------
    estimate : FrequencyEstimate
    component : Component
        The component whose reports were estimated (its mechanism and encoder are recorded).
    values_offset : int
        Added to every value (0: the values are the encoder's indices).
    """
    return Estimates(
        reports=estimate.n, mechanism=component.mechanism, encoder=component.encoder,
        confidence=estimate.confidence, warnings=tuple(estimate.warnings), consistent=estimate.consistent,
        estimates=tuple(Estimate(value=value + values_offset, count=count, std_error=se, ci_lower=low, ci_upper=high)
                        for value, count, se, low, high in zip(
                            estimate.values.tolist(), estimate.counts.tolist(), estimate.std_errors.tolist(),
                            estimate.ci_lower.tolist(), estimate.ci_upper.tolist())))


def round_aggregators(spec: RoundSpec, reports: RoundReports) -> dict[str, FrequencyAggregator]:
    """Frequency aggregators of every component of every group of a closed round.

    Keyed like the accumulators (``"<group>:<component>"``; components that are not frequency
    oracles are left out, groups without reports are absent). The count accumulators kept at
    ingestion give GRR, unary encoding and pooled local hashing (§14: counts per pool seed and
    bucket) their counts, and per-report local hashing its n (O(D) at close);
    where they are missing or do not cover every stored report, one pass over the raw reports,
    the source of truth, recomputes them (:class:`RoundCounts`). A local-hashing aggregator counts
    the support of the candidates a step asks about in a pass of its own
    (:class:`RoundSupportAggregator`), so the round's reports are never held in memory.
    """
    params_by_group = component_params_from_spec(spec)
    keys = {accumulator_key(g, i): p for g, ps in params_by_group.items() for i, p in enumerate(ps)}
    counts: dict[str, CountAccumulator] = {}
    blobs = reports.accumulators()
    try:
        for key, params in keys.items():
            if key in blobs:
                counts[key] = CountAccumulator.from_bytes(params, blobs[key], key=key)
    except ProtocolError:
        log.warning("unreadable accumulator; counting the raw reports",
                    extra={"campaign_id": spec.campaign_id, "round": spec.round})
        counts = {}
    # Every report adds exactly one payload to its group's component 0.
    if sum(a.n for k, a in counts.items() if k.endswith(":0")) != reports.count:
        blobs = reports.combine(RoundCounts(params_by_group)).finalize()
        counts = {key: CountAccumulator.from_bytes(keys[key], blob, key=key) for key, blob in blobs.items()}
    out: dict[str, FrequencyAggregator] = {}
    # Every support pass of the round decodes all its per-report local-hashing components, so the
    # passes share one decoding: in-process the round is decoded once, for all of them.
    per_report = tuple(key for key, acc in counts.items()
                       if isinstance(acc.params, LocalHashingParams) and not keeps_counts(acc.params))
    for key, acc in counts.items():
        params = acc.params
        if isinstance(params, LocalHashingParams) and not keeps_counts(params):  # pooled: counts suffice
            out[key] = RoundSupportAggregator(params, key, params_by_group, reports, acc.n, per_report)
        elif (aggregator := acc.finalize()) is not None:
            out[key] = aggregator
    return out


class HammingWeights(ReportAccumulator[NDArray[np.int64]]):
    """How many unary-encoding reports of a round have each Hamming weight (``domain_size + 1`` counts).

    Reads the stored rows' bytes (msgpack ``[bin(width)]`` with a fixed header: the bits are the
    last bytes), without decoding them; integers, so any order gives the same counts.
    """

    def __init__(self, mechanism: UnaryEncodingParams) -> None:
        self._mechanism = mechanism
        self._counts = np.zeros(mechanism.domain_size + 1, dtype=np.int64)

    def zero(self) -> HammingWeights:
        return HammingWeights(self._mechanism)

    def add(self, reports: Sequence[StoredReport]) -> None:
        if not reports:
            return
        width = self._mechanism.payload_bytes
        bits = np.frombuffer(b"".join([row.payloads[-width:] for row in reports]), dtype=np.uint8)
        weights = _POPCOUNT[bits.reshape(len(reports), width)].sum(axis=1)
        self._counts += np.bincount(weights, minlength=self._mechanism.domain_size + 1)

    def merge(self, other: HammingWeights) -> None:
        self._counts += other._counts

    def finalize(self) -> NDArray[np.int64]:
        return self._counts.copy()

    @property
    def nbytes(self) -> int:
        return int(self._counts.nbytes)


class RoundSupportAggregator(FrequencyAggregator):
    """A local-hashing component of a closed round whose support counts come from a pass over its reports.

    Each :meth:`support` (so each ``estimate``) streams the round through
    :class:`~ldp_collector.estimation.accumulators.SupportCounts` for the candidates asked
    (:meth:`RoundReports.combine`: in-process batch by batch, on Beam on its workers): memory is
    the candidates' counts, not the reports. Read-only: it cannot be added to or merged.

    Parameters
    ----------
    params : LocalHashingParams
    key : str
        The component, ``"<group>:<component>"``.
    component_params_by_group : Mapping[int, Sequence[MechanismParams]]
    reports : RoundReports
    n : int
        The component's report count (its count accumulator).
    decode_keys : sequence of str, optional
        The round's other per-report local-hashing components, decoded in the same pass
        (:class:`~ldp_collector.estimation.accumulators.SupportCounts`).
    """

    def __init__(self, params: LocalHashingParams, key: str, component_params_by_group: ComponentParams,
                 reports: RoundReports, n: int, decode_keys: Sequence[str] = ()) -> None:
        self._params = params
        self._key = key
        self._decode_keys = tuple(decode_keys)
        self._by_group = component_params_by_group
        self._reports = reports
        self._n = n

    @property
    def params(self) -> LocalHashingParams:
        return self._params

    @property
    def n(self) -> int:
        return self._n

    def zero(self) -> RoundSupportAggregator:
        raise TypeError("a round's support aggregator is read-only")

    def add(self, payloads: Sequence[Any]) -> None:
        raise TypeError("a round's support aggregator is read-only")

    def merge(self, other: RoundSupportAggregator) -> None:
        raise TypeError("a round's support aggregator is read-only")

    def support(self, values: NDArray[np.int64]) -> NDArray[np.int64]:
        counted = self._reports.combine(SupportCounts(self._by_group, self._key, values, self._decode_keys))
        if counted.n != self._n:
            raise ProtocolError(f"{self._key}: {counted.n} reports, but its accumulator counted {self._n}")
        return counted.finalize()


def aggregator_for(aggregators: dict[str, FrequencyAggregator], spec: RoundSpec, group: int,
                   component_index: int = 0) -> FrequencyAggregator:
    """The aggregator of one component of one group; an empty one when the group sent no reports."""
    key = accumulator_key(group, component_index)
    if key in aggregators:
        return aggregators[key]
    task = spec.task_for(group)
    if task is None:
        raise ValueError(f"group {group} does not report in round {spec.round}")
    params = task.components[component_index].mechanism
    if not isinstance(params, (GRRParams, UnaryEncodingParams, LocalHashingParams)):
        raise TypeError(f"{params.KIND} is not a frequency oracle")
    return make_aggregator(params)


@dataclass(frozen=True, kw_only=True)
class HistogramParams(KindParams):
    """``ldp.v1.HistogramParameters``; :meth:`resolve` fills the oracle and, for numeric domains, the grid.

    Attributes
    ----------
    oracle : FrequencyOracle
        UNSPECIFIED: the variance-optimal oracle that fits ``max_payload_bits``.
    cells_per_dimension : tuple of int
        Numeric domains: cells per dimension (one entry for all; empty: :func:`default_cells_per_dimension`).
    max_payload_bits : int
        Bits available per report for the oracle (0 = unlimited).
    consistency : bool
        Project the estimates onto non-negative counts with the right total.
    windows : int
        Successive rounds estimated on their own (0 or 1 = one window; at most 64).
    anomaly_alpha : float
        Family-wise false-flag rate of a window's anomaly flags, in (0, 1) (0 = 0.01).
    seed_pool_size : int
        Local hashing from a public pool of this many seeds (``docs/protocol.md`` §14; 0 = off
        unless ``seed_pool_concentration``); resolved to the size used.
    seed_pool_concentration : float
        With ``seed_pool_size`` 0, a bound in (0, 1] on sum_x (n_x / n)^2 turns the pool on with the
        default size (:func:`~ldp_client.mechanisms.local_hashing.seed_pool_size_for`, 10 % extra
        variance, n = ``close_after_reports``); 0 = off.
    """

    oracle: FrequencyOracle = FrequencyOracle.FREQUENCY_ORACLE_UNSPECIFIED
    cells_per_dimension: tuple[int, ...] = ()
    max_payload_bits: int = 0
    consistency: bool = False
    windows: int = 0
    anomaly_alpha: float = 0.0
    seed_pool_size: int = 0
    seed_pool_concentration: float = 0.0

    def resolve(self, config: CampaignConfig) -> HistogramParams:
        """The parameters with the chosen oracle and grid recorded (see :meth:`KindParams.resolve`).

        Raises
        ------
        InvalidArgumentError
            Epsilon above 20 (one report spends it all), a domain of more than 2^24 values or cells,
            cells given for a categorical domain, or an oracle that does not fit the domain or the
            payload cap.
        """
        check_report_epsilon(config.epsilon, "a histogram campaign")
        cells = self._grid_cells(config)
        encoder = histogram_encoder(config, cells)
        size = encoder.output_size
        if size > MAX_HISTOGRAM_CELLS:
            raise InvalidArgumentError(
                f"a histogram estimates every value, so it needs at most {MAX_HISTOGRAM_CELLS} values or cells, "
                f"got {size}; use a HEAVY_HITTERS campaign for larger domains")
        if size < 2:
            raise InvalidArgumentError("a histogram needs at least 2 values or cells")
        if self.windows > MAX_WINDOWS:
            raise InvalidArgumentError(f"histogram.windows must be at most {MAX_WINDOWS}, got {self.windows}")
        alpha = self.anomaly_alpha
        if not (alpha == 0.0 or 0.0 < alpha < 1.0):  # NaN fails both
            raise InvalidArgumentError(f"histogram.anomaly_alpha must be in (0, 1) (0 = {DEFAULT_ANOMALY_ALPHA:g}), "
                                       f"got {alpha!r}")
        if self.windows > 1 and size > MAX_WINDOWED_DOMAIN:
            raise InvalidArgumentError(
                f"a histogram with windows > 1 needs at most {MAX_WINDOWED_DOMAIN} values or cells, got {size}")
        resolved = replace(self, cells_per_dimension=cells, seed_pool_size=self._pool_size(config, size))
        mechanism = resolved.mechanism(config, size)
        try:
            Component(encoder=encoder, mechanism=mechanism)
        except InvalidParameterError as exc:
            raise InvalidArgumentError(f"histogram: {exc}") from None
        # The oracle and pool actually chosen, so that the stored configuration names them (and gives them back).
        return replace(resolved, oracle=_ORACLE_OF_MECHANISM[_mechanism_name(mechanism)])

    def _pool_size(self, config: CampaignConfig, size: int) -> int:
        """The seed pool's size S (0: none): given, or the default rule from the concentration bound."""
        kappa = self.seed_pool_concentration
        if not (kappa == 0.0 or 0.0 < kappa <= 1.0):  # NaN fails both
            raise InvalidArgumentError(f"histogram.seed_pool_concentration must be in (0, 1] (0 = off), got {kappa!r}")
        pool = self.seed_pool_size
        if not pool and not kappa:
            return 0
        if self.oracle not in (FrequencyOracle.FREQUENCY_ORACLE_UNSPECIFIED, FrequencyOracle.OLH):
            raise InvalidArgumentError(
                f"a histogram seed pool needs local hashing (oracle OLH or unspecified), got {FrequencyOracle(self.oracle).name}")
        allowed = allowed_oracles(config)
        if allowed is not None and "olh" not in allowed:
            raise InvalidArgumentError(
                f"a histogram seed pool needs local hashing, which the campaign's oracles leave out "
                f"({','.join(sorted(allowed))}); add olh to --oracles or drop the seed pool")
        if pool > MAX_SEED_POOL:
            raise InvalidArgumentError(f"histogram.seed_pool_size must be at most {MAX_SEED_POOL}, got {pool}")
        plain = self._olh(config, size)
        if not pool:
            if not config.close_after_reports:
                raise InvalidArgumentError(
                    "histogram.seed_pool_concentration sizes the pool for close_after_reports reports: set it, "
                    "or give seed_pool_size")
            pool = seed_pool_size_for(plain, float(config.close_after_reports), kappa)
        if pool * plain.g > MAX_POOL_CELLS:
            raise InvalidArgumentError(
                f"histogram seed pool: seed_pool_size x g must be at most {MAX_POOL_CELLS}, got {pool} x {plain.g}")
        return pool

    def _olh(self, config: CampaignConfig, size: int) -> LocalHashingParams:
        """Local hashing over ``size`` values at one window's epsilon (the oracle a pool needs)."""
        params = frequency_oracle(FrequencyOracle.OLH, size, self._window_epsilon(config), self.max_payload_bits)
        assert isinstance(params, LocalHashingParams)
        return params

    def _window_epsilon(self, config: CampaignConfig) -> float:
        return equal_share(config.epsilon, self.window_count) if self.split(config) else config.epsilon

    def _grid_cells(self, config: CampaignConfig) -> tuple[int, ...]:
        """The grid's cells per dimension, one entry per dimension (``()`` for a categorical domain)."""
        numeric = config.domain.numeric
        if numeric is None:
            if self.cells_per_dimension:
                raise InvalidArgumentError("histogram.cells_per_dimension applies to numeric domains only")
            return ()
        d = numeric.dimension
        cells = list(self.cells_per_dimension)
        if not cells:
            cells = [default_cells_per_dimension(d)] * d
        elif len(cells) == 1 and d > 1:
            cells = cells * d
        if len(cells) != d:
            raise InvalidArgumentError(
                f"histogram.cells_per_dimension must have 1 or {d} entries (one per dimension), got {len(cells)}")
        if any(m < 1 for m in cells) or math.prod(cells) > MAX_HISTOGRAM_CELLS:
            raise InvalidArgumentError(
                f"histogram.cells_per_dimension must be positive with at most {MAX_HISTOGRAM_CELLS} cells in "
                f"total, got {cells}")
        return tuple(cells)

    @property
    def window_count(self) -> int:
        """Windows of the campaign (``windows``, 0 meaning 1)."""
        return max(1, self.windows)

    def split(self, config: CampaignConfig) -> bool:
        """Each window spends epsilon / W (several windows under the SPLIT policy)."""
        return self.window_count > 1 and config.budget_policy == BudgetPolicy.SPLIT

    def mechanism(self, config: CampaignConfig, size: int) -> MechanismParams:
        """The oracle of one window over ``size`` values (:func:`frequency_oracle`); local hashing from a
        seed pool (key 0: each round sets its own, :meth:`HistogramEngine._spec`) when ``seed_pool_size``."""
        if self.seed_pool_size:
            return replace(self._olh(config, size), seed_pool_size=self.seed_pool_size)
        return frequency_oracle(self.oracle, size, self._window_epsilon(config), self.max_payload_bits,
                                allowed_oracles(config))


def histogram_encoder(config: CampaignConfig, cells: Sequence[int]) -> Encoder:
    """The campaign's encoder: the value itself, or its cell of a uniform grid of ``cells`` per dimension."""
    numeric = config.domain.numeric
    if numeric is None:
        return CategoricalEncoder(domain_size=config.domain.categorical_size)
    try:
        return UniformGridEncoder(domain=numeric, cells_per_dimension=tuple(cells))
    except InvalidParameterError as exc:
        raise InvalidArgumentError(f"histogram grid: {exc}") from None


class HistogramEngine(CampaignEngine):
    """Engine of ``HISTOGRAM`` campaigns (module docstring).

    Parameters
    ----------
    campaign_id : str
    config : ldp.v1.CampaignConfig
        Validated by :func:`ldp_collector.campaigns.prepare_campaign`.
    params : HistogramParams
        Resolved (:meth:`HistogramParams.resolve`): the oracle and, for numeric domains, the grid
        are filled in.
    """

    params: HistogramParams

    def __init__(self, campaign_id: str, config: CampaignConfig, params: HistogramParams) -> None:
        super().__init__(campaign_id, config, params)
        self.windows = params.window_count
        self.anomaly_alpha = params.anomaly_alpha or DEFAULT_ANOMALY_ALPHA
        self._reports_per_device = self.windows if params.split(config) else 1
        encoder = histogram_encoder(config, params.cells_per_dimension)
        self.component = Component(encoder=encoder, mechanism=params.mechanism(config, encoder.output_size))

    def _spec(self, round: int) -> RoundSpec:
        component = self.component
        if isinstance(component.mechanism, LocalHashingParams) and component.mechanism.seed_pool_size:
            # A fresh public pool per round (docs/protocol.md §14.2).
            component = replace(component, mechanism=replace(
                component.mechanism, seed_pool_key=seed_pool_key(self.config, round)))
        return RoundSpec(
            campaign_id=self.campaign_id, round=round, group_weights=(1,),
            tasks=(GroupTask(groups=(0,), components=(component,)),),
            campaign_epsilon=self.config.epsilon, max_reports_per_device=self._reports_per_device, kind="histogram")

    def first_round(self) -> RoundPlan:
        """Round 1: group 0 (everyone) reports its value or cell (the whole epsilon, or epsilon / W
        per window with the SPLIT policy)."""
        return RoundPlan(spec=self._spec(1))

    def accumulate_fn(self, spec: RoundSpec) -> AccumulateFn | None:
        """Per-value counts (GRR, unary encoding) or the report count (local hashing)."""
        return make_accumulate_fn(component_params_from_spec(spec))

    def close_round(self, spec: RoundSpec, reports: RoundReports, engine_state: bytes) -> RoundOutcome:
        """Estimate every value's count; open the next window, or finish the campaign after the last."""
        component = spec.tasks[0].components[0]
        aggregator = aggregator_for(round_aggregators(spec, reports), spec, group=0)
        estimate = aggregator.estimate(DEFAULT_CONFIDENCE)
        flags: list[str] = []
        state = b""
        if self.windows > 1:
            n = max(estimate.n, 1)
            frequencies, std_errors = estimate.counts / n, estimate.std_errors / n
            previous = _unpack_window(engine_state, len(frequencies))
            if previous is not None and estimate.n > 0:
                found = anomaly_flags(previous[0], previous[1], frequencies.tolist(), std_errors.tolist(),
                                      alpha=self.anomaly_alpha)
                flags = [f"anomaly: {flag.describe()}" for flag in found]
                if flags:
                    log.warning("histogram window moved beyond chance", extra={
                        "campaign_id": spec.campaign_id, "round": spec.round, "anomaly_flags": len(flags),
                        "values": [flag.value for flag in found[:32]]})
            if estimate.n > 0:
                state = _pack_window(frequencies, std_errors)
            else:
                state = engine_state  # an empty window compares the next one with the last non-empty one
        implausible = self._weight_warnings(spec, reports)
        if self.params.consistency:
            estimate = estimate.with_consistency("norm_sub")
        estimates = frequency_estimates(estimate, component)
        estimates = replace(estimates, warnings=(*estimates.warnings, *implausible, *flags))
        mechanism = component.mechanism
        diagnostics = {
            "reports": float(estimate.n),
            "epsilon": float(mechanism.epsilon),
            "realized_epsilon": float(mechanism.realized_epsilon),
            "domain_size": float(mechanism.input_size),
            "payload_bits": float(mechanism.payload_bits),
            "zero_count_std_error": float(estimate.zero_std_error),
        }
        if isinstance(mechanism, UnaryEncodingParams):
            diagnostics["implausible_weights"] = float(len(implausible))
        if self.windows > 1:
            diagnostics["window"] = float(spec.round)
            diagnostics["anomaly_flags"] = float(len(flags))
            if spec.round < self.windows:
                return RoundOutcome(estimates=estimates, diagnostics=diagnostics,
                                    next_round=RoundPlan(spec=self._spec(spec.round + 1), engine_state=state))
        result = Result(state=CampaignState.FINISHED, estimates=estimates, warnings=estimates.warnings)
        return RoundOutcome(estimates=estimates, result=result, diagnostics=diagnostics)

    def _weight_warnings(self, spec: RoundSpec, reports: RoundReports) -> list[str]:
        """Warnings for over-represented Hamming weights of a unary-encoding round (module docstring)."""
        mechanism = spec.tasks[0].components[0].mechanism
        if not isinstance(mechanism, UnaryEncodingParams) or not 0 < reports.count <= MAX_WEIGHT_CHECK_REPORTS:
            return []
        counts = reports.combine(HammingWeights(mechanism)).finalize()
        found = weight_excess(counts.tolist(), mechanism.domain_size, mechanism.p, mechanism.q)
        if found:
            log.warning("implausible Hamming weights in a unary-encoding round", extra={
                "campaign_id": spec.campaign_id, "round": spec.round, "weights": [w for w, _, _ in found[:16]]})
        return [f"implausible: {observed} reports have {w} bits set; honest devices would send about {expected:.3g}"
                for w, observed, expected in found]


def _pack_window(frequencies: NDArray[np.float64], std_errors: NDArray[np.float64]) -> bytes:
    """Engine state of a windowed histogram: the window's frequencies and their standard errors."""
    packed: bytes = msgpack.packb([1, frequencies.astype("<f8").tobytes(), std_errors.astype("<f8").tobytes()],
                                  use_bin_type=True)
    return packed


def _unpack_window(state: bytes, size: int) -> tuple[list[float], list[float]] | None:
    """Inverse of :func:`_pack_window`; ``None`` for the first window (empty state)."""
    if not state:
        return None
    try:
        version, frequencies, std_errors = msgpack.unpackb(state, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise RuntimeError(f"histogram engine state is unreadable: {exc}") from exc
    if version != 1 or len(frequencies) != 8 * size or len(std_errors) != 8 * size:
        raise RuntimeError(f"histogram engine state does not hold {size} frequencies")
    return (np.frombuffer(frequencies, dtype="<f8").tolist(), np.frombuffer(std_errors, dtype="<f8").tolist())



def _mechanism_name(mechanism: MechanismParams) -> str:
    if isinstance(mechanism, UnaryEncodingParams):
        return "sue" if mechanism.variant == UnaryVariant.SYMMETRIC else "oue"
    return mechanism.KIND


_ORACLE_OF_MECHANISM: dict[str, FrequencyOracle] = {
    "grr": FrequencyOracle.GRR,
    "sue": FrequencyOracle.SUE,
    "oue": FrequencyOracle.OUE,
    "local_hashing": FrequencyOracle.OLH,
}


def _simulation_cells(d: int) -> int | None:
    """A simulation's cells per dimension: 16 x 16 for 2-D points, else the engine's default."""
    return 16 if d == 2 else None


def _simulation_report(config: CampaignConfig) -> dict[str, Any]:
    params: HistogramParams = config.parameters
    return {"cells": list(params.cells_per_dimension), "oracle": FrequencyOracle(params.oracle).name}


#: Command line: the grid of a numeric domain, the frequency oracle, the payload cap, consistency
#: and the anomaly flags.
CLI = KindCli(
    result="histogram",
    params=(
        CliParam(flag="--cells", field="cells_per_dimension", type="cells", metavar="M[,M2...]", numeric_only=True,
                 help="grid cells per dimension"),
        CliParam(flag="--oracle", field="oracle", type="choice", help="frequency oracle (default auto)",
                 choices=(("auto", FrequencyOracle.FREQUENCY_ORACLE_UNSPECIFIED), ("grr", FrequencyOracle.GRR),
                          ("sue", FrequencyOracle.SUE), ("oue", FrequencyOracle.OUE), ("olh", FrequencyOracle.OLH))),
        CliParam(flag="--max-payload-bits", field="max_payload_bits", type="uint32", help="bit cap per report"),
        CliParam(flag="--consistency", field="consistency", type="switch", help="non-negative estimates summing to n"),
        CliParam(flag="--windows", field="windows", type="uint32",
                 help="successive rounds compared for anomaly flags (default 1)"),
        CliParam(flag="--anomaly-alpha", field="anomaly_alpha", type="positive_float",
                 help=f"family-wise false-flag rate of the anomaly flags, in (0, 1) (default {DEFAULT_ANOMALY_ALPHA:g})"),
        CliParam(flag="--seed-pool", field="seed_pool_size", type="uint32", metavar="S",
                 help="local hashing from a public pool of S seeds: support counts cost S x D hashes instead "
                      "of n x D (docs/protocol.md §14; default 0: per-report seeds)"),
        CliParam(flag="--seed-pool-concentration", field="seed_pool_concentration", type="positive_float",
                 metavar="KAPPA",
                 help="turn the seed pool on with the default size: the smallest S whose extra variance is at "
                      "most 10%% of the per-report variance, for a bound KAPPA in (0, 1] on sum_x (n_x/n)^2 "
                      "and n = --close-after"),
    ),
    default_cells=_simulation_cells, report=_simulation_report, plotted=True)

#: The HISTOGRAM campaign kind (registered by :mod:`ldp_collector.kinds.registry`).
KIND = Kind(name="histogram", engine=HistogramEngine,
            params=HistogramParams,
            domains=frozenset({NUMERIC, CATEGORICAL}),
            cli=CLI)
