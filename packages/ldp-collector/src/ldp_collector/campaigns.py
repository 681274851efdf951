"""Campaign configuration: validation, defaults, and the record <-> ``ldp.v1`` message helpers.

:func:`prepare_campaign` is what ``CreateCampaign`` runs before anything is stored: it checks the
fields every kind shares (kind, domain, epsilon, thresholds, labels), fills the defaults, and has
the kind's parameters dataclass check and complete its own (``resolve``): the configuration it
stores carries them resolved, written back through :func:`ldp_collector.serde.params_to_proto`. The remaining functions convert the
storage records of :mod:`ldp_collector.storage.base` into ``ldp.v1`` messages; protobuf types stop
here and in the engines' result builders (STYLE.md §2).

This module may import the storage contract, the engines and the SDK's plain-data specs; it never
imports ``grpc``.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.message import DecodeError

from ldp.v1 import campaigns_pb2
from ldp_client.errors import InvalidParameterError
from ldp_client.serde import round_spec_to_proto
from ldp_client.spec import MAX_EPSILON_PER_CAMPAIGN, RoundSpec, check_campaign_id

from . import serde
from .errors import InvalidArgumentError
from .kinds import KINDS, CampaignEngine, kind_for
from .kinds.base import KindParams
from .kinds.common import numeric_domain
from .storage.base import CampaignRecord, RoundRecord

__all__ = [
    "COLLECTING",
    "DEFAULT_MIN_REPORTS_PER_ROUND",
    "FAILED",
    "FINISHED",
    "MAX_DESCRIPTION_CHARS",
    "MAX_LABELS",
    "PreparedCampaign",
    "campaign_to_proto",
    "duration_seconds",
    "kind_name",
    "make_engine",
    "new_campaign_id",
    "parse_config",
    "prepare_campaign",
    "resolve_params",
    "round_status",
    "state_to_proto",
    "timestamp",
]

#: Campaign states as the store keeps them (``CampaignRecord.state``).
COLLECTING, FINISHED, FAILED = "collecting", "finished", "failed"
_STATE_TO_PROTO = {
    COLLECTING: campaigns_pb2.COLLECTING,
    FINISHED: campaigns_pb2.FINISHED,
    FAILED: campaigns_pb2.FAILED,
}

DEFAULT_MIN_REPORTS_PER_ROUND = 1
MAX_DESCRIPTION_CHARS = 4096
MAX_LABELS = 64
MAX_LABEL_CHARS = 256
_MAX_CATEGORICAL_SIZE = 2**63


def kind_name(kind: int) -> str:
    """Lower-case display name of a ``CampaignKind`` (``"histogram"``), as in ``RoundSpec.kind``."""
    try:
        return campaigns_pb2.CampaignKind.Name(kind).lower()  # type: ignore[arg-type]
    except ValueError:
        return f"kind_{kind}"


def new_campaign_id() -> str:
    """A random, URL-safe campaign id (``c-`` + 16 bytes of OS randomness, 24 characters)."""
    return "c-" + secrets.token_urlsafe(16)


def duration_seconds(duration: duration_pb2.Duration) -> float:
    """A ``google.protobuf.Duration`` in seconds."""
    return duration.seconds + duration.nanos * 1e-9


def timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    """A ``google.protobuf.Timestamp`` for Unix ``seconds``."""
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(round(seconds * 1e9))
    return ts


def state_to_proto(state: str) -> campaigns_pb2.CampaignState.ValueType:
    """The ``CampaignState`` of a stored state string (unknown strings map to UNSPECIFIED)."""
    return _STATE_TO_PROTO.get(state, campaigns_pb2.CAMPAIGN_STATE_UNSPECIFIED)


def _check_common(config: campaigns_pb2.CampaignConfig) -> None:
    """Checks shared by every kind; raises :class:`InvalidArgumentError` naming the field."""
    kind = config.kind
    if kind == campaigns_pb2.CAMPAIGN_KIND_UNSPECIFIED:
        raise InvalidArgumentError(f"kind is required; known kinds: {sorted(KINDS)}")
    kind_for(kind)  # a known, implemented kind

    eps = config.epsilon
    if not math.isfinite(eps) or not 0.0 < eps <= MAX_EPSILON_PER_CAMPAIGN:
        raise InvalidArgumentError(f"epsilon must be in (0, {MAX_EPSILON_PER_CAMPAIGN:g}], got {eps:g}")

    if not config.HasField("domain") or config.domain.WhichOneof("domain") is None:
        raise InvalidArgumentError("domain is required: set categorical_size or numeric bounds")
    if config.domain.WhichOneof("domain") == "categorical_size":
        size = config.domain.categorical_size
        if not 2 <= size <= _MAX_CATEGORICAL_SIZE:
            raise InvalidArgumentError(
                f"domain.categorical_size must be in [2, 2^63], got {size}")
    else:
        numeric_domain(config.domain.numeric.lower, config.domain.numeric.upper)

    if config.budget_policy not in (campaigns_pb2.BUDGET_POLICY_UNSPECIFIED, campaigns_pb2.PARTITION,
                                    campaigns_pb2.SPLIT):
        raise InvalidArgumentError(f"budget_policy {config.budget_policy} is not a known budget policy")
    if 0 < config.close_after_reports < max(config.min_reports_per_round, DEFAULT_MIN_REPORTS_PER_ROUND):
        raise InvalidArgumentError(
            f"close_after_reports must be 0 (never) or at least min_reports_per_round "
            f"({config.min_reports_per_round}), got {config.close_after_reports}")
    if config.HasField("round_duration"):
        d = config.round_duration
        if d.seconds < 0 or d.nanos < 0 or not 0 <= d.nanos < 10**9 or duration_seconds(d) <= 0:
            raise InvalidArgumentError(
                f"round_duration must be positive, got {d.seconds}s {d.nanos}ns")
    if len(config.description) > MAX_DESCRIPTION_CHARS:
        raise InvalidArgumentError(
            f"description must be at most {MAX_DESCRIPTION_CHARS} characters, got {len(config.description)}")
    if len(config.labels) > MAX_LABELS:
        raise InvalidArgumentError(f"labels must hold at most {MAX_LABELS} entries, got {len(config.labels)}")
    for key, value in config.labels.items():
        if not key or len(key) > MAX_LABEL_CHARS or len(value) > MAX_LABEL_CHARS:
            raise InvalidArgumentError(
                f"label keys must be 1 to {MAX_LABEL_CHARS} characters and values at most {MAX_LABEL_CHARS}, "
                f"got {key[:40]!r}")


class PreparedCampaign:
    """A validated configuration with its defaults filled, and the engine built from it.

    Attributes
    ----------
    config : ldp.v1.CampaignConfig
        The configuration to store (campaign id assigned, defaults filled, including the engine's).
    engine : CampaignEngine
        The kind's engine for ``config``.
    """

    __slots__ = ("config", "engine")

    def __init__(self, config: campaigns_pb2.CampaignConfig, engine: CampaignEngine) -> None:
        self.config = config
        self.engine = engine


def prepare_campaign(config: campaigns_pb2.CampaignConfig) -> PreparedCampaign:
    """Validate ``config``, fill its defaults and build its engine; the input is not modified.

    Defaults: a random campaign id when empty, budget policy PARTITION, ``min_reports_per_round``
    1, and the kind's parameters as their ``resolve`` fills them (written into the stored
    configuration's ``parameters`` oneof).

    Raises
    ------
    InvalidArgumentError
        Naming the field at fault; an unknown kind, or a kind without an engine, included
        (``"campaign kind GRID is not implemented yet"``).
    """
    if not isinstance(config, campaigns_pb2.CampaignConfig):
        raise TypeError(f"config must be an ldp.v1.CampaignConfig, got {type(config).__name__}")
    _check_common(config)
    out = campaigns_pb2.CampaignConfig()
    out.CopyFrom(config)
    if not out.campaign_id:
        out.campaign_id = new_campaign_id()
    else:
        try:
            check_campaign_id(out.campaign_id)
        except InvalidParameterError as exc:
            raise InvalidArgumentError(str(exc)) from None
    if out.budget_policy == campaigns_pb2.BUDGET_POLICY_UNSPECIFIED:
        out.budget_policy = campaigns_pb2.PARTITION
    if out.min_reports_per_round == 0:
        out.min_reports_per_round = DEFAULT_MIN_REPORTS_PER_ROUND
    kind = kind_for(out.kind)
    params = resolve_params(out)
    serde.params_to_proto(kind.name, params, out)
    return PreparedCampaign(out, kind.engine(out.campaign_id, out, params))


def resolve_params(config: campaigns_pb2.CampaignConfig) -> KindParams:
    """The kind's parameters of ``config`` (all defaults when it sets none), resolved against it.

    Raises
    ------
    InvalidArgumentError
        Another kind's parameters, or parameters the kind refuses.
    """
    kind = kind_for(config.kind)
    return (serde.params_from_proto(kind.name, config) or kind.params()).resolve(config)


def make_engine(config: campaigns_pb2.CampaignConfig) -> CampaignEngine:
    """The engine of a (validated) configuration, on its resolved parameters.

    Raises
    ------
    InvalidArgumentError
        Parameters the kind refuses.
    """
    return kind_for(config.kind).engine(config.campaign_id, config, resolve_params(config))


def parse_config(record: CampaignRecord) -> campaigns_pb2.CampaignConfig:
    """The stored ``CampaignConfig`` of a campaign record."""
    config = campaigns_pb2.CampaignConfig()
    try:
        config.ParseFromString(record.config)
    except DecodeError as exc:
        raise RuntimeError(f"stored configuration of campaign {record.campaign_id} is unreadable: {exc}") from exc
    return config


def round_status(record: RoundRecord, report_count: int | None = None) -> campaigns_pb2.RoundStatus:
    """``RoundStatus`` of a round record; ``report_count`` overrides the record's (live count of an open round)."""
    status = campaigns_pb2.RoundStatus(
        round=record.round,
        open=record.open,
        reports=record.report_count if report_count is None else report_count,
    )
    status.opened_at.CopyFrom(timestamp(record.opened_at))
    if record.closed_at is not None:
        status.closed_at.CopyFrom(timestamp(record.closed_at))
    return status


def campaign_to_proto(record: CampaignRecord, rounds: Sequence[campaigns_pb2.RoundStatus],
                      current_spec: RoundSpec | None) -> campaigns_pb2.Campaign:
    """The ``ldp.v1.Campaign`` view of a campaign record.

    Parameters
    ----------
    record : CampaignRecord
    rounds : sequence of ldp.v1.RoundStatus
        Every round of the campaign, in order.
    current_spec : RoundSpec or None
        The open round's spec (``None`` once the campaign is finished or failed).
    """
    campaign = campaigns_pb2.Campaign(
        config=parse_config(record),
        state=state_to_proto(record.state),
        rounds=list(rounds),
        error=record.error,
    )
    campaign.created_at.CopyFrom(timestamp(record.created_at))
    if current_spec is not None:
        campaign.current_round.CopyFrom(round_spec_to_proto(current_spec))
    return campaign
