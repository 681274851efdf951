"""The collector's domain model: plain frozen dataclasses that the kinds, ``core`` and storage work on.

Each class mirrors one ``ldp.v1`` message field for field (same names, same meaning), so code that
reads a result reads it the same way whether it holds a message or a model object
(``result.clustering.centers``, ``estimates.estimates[0].std_error``). Enums are ``IntEnum`` with
the proto's numbers. Only :mod:`ldp_collector.serde` converts between the two; everything inside
the collector (kinds, ``core``, the simulator, plotting) works on these.

What differs from the messages, on purpose:

* ``CampaignConfig.parameters`` is the kind's own parameters dataclass (the ``parameters`` oneof
  member named by the kind), or ``None`` for "all defaults"; the kind registry knows the classes.
* ``CampaignConfig.labels`` and ``Result.diagnostics`` are read-only mappings (proto maps).
* Timestamps are Unix seconds (float); a ``google.protobuf.Duration`` is :class:`Duration`.
* ``Clustering.cell_map`` is the SDK's :class:`~ldp_client.clusters.CellClusterModel` (the same
  message, validated: its cells partition the domain box).

Stdlib and the SDK only: no protobuf here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ldp_client.clusters import CellClusterModel, CenterModel, ClusterModel
from ldp_client.encoders.base import Encoder, NumericDomain
from ldp_client.errors import ProtocolError
from ldp_client.mechanisms.base import MechanismParams
from ldp_client.spec import RoundSpec, Spec

__all__ = [
    "BudgetPolicy",
    "Campaign",
    "CampaignConfig",
    "CampaignState",
    "Clustering",
    "Domain",
    "Duration",
    "Estimate",
    "Estimates",
    "HeavyHitter",
    "Result",
    "RoundStatus",
    "frozen_mapping",
]


class CampaignState(enum.IntEnum):
    """``ldp.v1.CampaignState``."""

    CAMPAIGN_STATE_UNSPECIFIED = 0
    COLLECTING = 1
    FINISHED = 2
    FAILED = 3


class BudgetPolicy(enum.IntEnum):
    """``ldp.v1.BudgetPolicy``: how a multi-round campaign spends a device's epsilon."""

    BUDGET_POLICY_UNSPECIFIED = 0
    PARTITION = 1
    SPLIT = 2


def frozen_mapping(items: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """A read-only copy of ``items`` (``MappingProxyType`` over a new dict)."""
    return MappingProxyType(dict(items or {}))


@dataclass(frozen=True, kw_only=True)
class Duration(Spec):
    """``google.protobuf.Duration``: ``seconds`` and ``nanos`` of the same sign."""

    seconds: int = 0
    nanos: int = 0

    @property
    def total_seconds(self) -> float:
        """The duration in seconds."""
        return self.seconds + self.nanos * 1e-9

    @classmethod
    def of_seconds(cls, seconds: float) -> Duration:
        """The duration of ``seconds`` (rounded to the nanosecond)."""
        total = round(seconds * 1e9)
        whole, nanos = divmod(abs(total), 10**9)
        sign = -1 if total < 0 else 1
        return cls(seconds=sign * whole, nanos=sign * nanos)


@dataclass(frozen=True, kw_only=True)
class Domain(Spec):
    """``ldp.v1.Domain``: a categorical size, or public numeric bounds (at most one is set)."""

    categorical_size: int = 0
    numeric: NumericDomain | None = None

    @property
    def which(self) -> str | None:
        """``"categorical_size"``, ``"numeric"`` or ``None`` (the proto oneof's ``WhichOneof``)."""
        if self.numeric is not None:
            return "numeric"
        return "categorical_size" if self.categorical_size else None


@dataclass(frozen=True, kw_only=True)
class CampaignConfig:
    """``ldp.v1.CampaignConfig``; ``kind`` is the kind's name (``"histogram"``: the lower-case
    ``CampaignKind`` value name, ``""`` when unset), ``parameters`` the kind's dataclass."""

    campaign_id: str = ""
    kind: str = ""
    domain: Domain = field(default_factory=Domain)
    epsilon: float = 0.0
    budget_policy: int = BudgetPolicy.BUDGET_POLICY_UNSPECIFIED
    min_reports_per_round: int = 0
    close_after_reports: int = 0
    round_duration: Duration | None = None
    description: str = ""
    labels: Mapping[str, str] = field(default_factory=frozen_mapping)
    #: The engine's public randomness; ``None``: drawn at creation (or, stored before the field, the campaign id's).
    seed: int | None = None
    #: The frequency oracles the engine may choose (``ldp.v1.FrequencyOracle`` numbers); empty: any.
    oracles: tuple[int, ...] = ()
    parameters: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.labels, MappingProxyType):
            object.__setattr__(self, "labels", frozen_mapping(self.labels))


@dataclass(frozen=True, kw_only=True)
class Estimate(Spec):
    """``ldp.v1.Estimate``: one value's estimated count with its standard error and interval."""

    value: int = 0
    count: float = 0.0
    std_error: float = 0.0
    ci_lower: float = 0.0
    ci_upper: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Estimates:
    """``ldp.v1.Estimates``: a round's frequency estimates."""

    campaign_id: str = ""
    round: int = 0
    reports: int = 0
    mechanism: MechanismParams | None = None
    encoder: Encoder | None = None
    confidence: float = 0.0
    estimates: tuple[Estimate, ...] = ()
    warnings: tuple[str, ...] = ()
    consistent: bool = False


@dataclass(frozen=True, kw_only=True)
class HeavyHitter(Spec):
    """``ldp.v1.HeavyHitter``."""

    value: int = 0
    count: float = 0.0
    std_error: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Clustering:
    """``ldp.v1.Clustering``: ``k`` centers (row-major, ``k * dimension`` values) or a cell map."""

    k: int = 0
    dimension: int = 0
    centers: tuple[float, ...] = ()
    weights: tuple[float, ...] = ()
    cell_map: CellClusterModel | None = None
    fuzzifier: float = 0.0

    def center_rows(self) -> tuple[tuple[float, ...], ...]:
        """The centers as ``k`` rows of ``dimension`` coordinates."""
        d = self.dimension
        if not d:
            return ()
        return tuple(self.centers[i:i + d] for i in range(0, len(self.centers), d))

    def label_model(self) -> ClusterModel:
        """The labelling model a device builds from this clustering (as
        :func:`ldp_client.serde.cluster_model_from_proto` does from the message).

        Centers give a :class:`~ldp_client.clusters.CenterModel`; otherwise the cell map is the
        :class:`~ldp_client.clusters.CellClusterModel`. When both are set, the centers win.

        Raises
        ------
        ProtocolError
            Neither centers nor a cell map (a clustering that published nothing), or centers that
            are not a whole number of ``dimension``-long rows.
        """
        if self.centers:
            if not self.dimension or len(self.centers) % self.dimension:
                raise ProtocolError(f"clustering.centers: {len(self.centers)} values are not a whole number of "
                                    f"centers of dimension {self.dimension}")
            return CenterModel(centers=self.center_rows())
        if self.cell_map is not None and self.cell_map.cells:
            return self.cell_map
        raise ProtocolError("clustering: holds neither centers nor a cell map")


@dataclass(frozen=True, kw_only=True)
class Result:
    """``ldp.v1.Result``: what a finished campaign publishes (or its state and error until then)."""

    campaign_id: str = ""
    state: int = CampaignState.CAMPAIGN_STATE_UNSPECIFIED
    estimates: Estimates | None = None
    heavy_hitters: tuple[HeavyHitter, ...] = ()
    clustering: Clustering | None = None
    diagnostics: Mapping[str, float] = field(default_factory=frozen_mapping)
    warnings: tuple[str, ...] = ()
    finished_at: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.diagnostics, MappingProxyType):
            object.__setattr__(self, "diagnostics", frozen_mapping(
                {key: float(value) for key, value in self.diagnostics.items()}))

    def label_model(self) -> ClusterModel:
        """The labelling model of a finished campaign's clustering (:meth:`Clustering.label_model`).

        Raises
        ------
        ProtocolError
            The campaign is not ``FINISHED``, or it published no clustering or an empty one.
        """
        campaign = f"campaign {self.campaign_id!r}" if self.campaign_id else "the campaign"
        if self.state != CampaignState.FINISHED:
            raise ProtocolError(f"result.state: {campaign} is {CampaignState(self.state).name}, not FINISHED; "
                                "only a finished campaign's clustering can label points")
        if self.clustering is None:
            raise ProtocolError(f"result.clustering: {campaign} published no clustering")
        return self.clustering.label_model()


@dataclass(frozen=True, kw_only=True)
class RoundStatus(Spec):
    """``ldp.v1.RoundStatus``: one round's state and report count (times in Unix seconds)."""

    round: int = 0
    open: bool = False
    reports: int = 0
    opened_at: float | None = None
    closed_at: float | None = None


@dataclass(frozen=True, kw_only=True)
class Campaign:
    """``ldp.v1.Campaign``: a campaign's configuration, state, open round and round history."""

    config: CampaignConfig
    state: int = CampaignState.CAMPAIGN_STATE_UNSPECIFIED
    current_round: RoundSpec | None = None
    rounds: tuple[RoundStatus, ...] = ()
    created_at: float | None = None
    error: str = ""

