"""Campaign configuration: validation, defaults, and the storage records as model campaigns.

:func:`prepare_campaign` is what ``CreateCampaign`` runs before anything is stored: it checks the
fields every kind shares (kind, domain, epsilon, thresholds, labels), fills the defaults, and has
the kind's parameters dataclass check and complete its own (``resolve``): the configuration it
stores carries them resolved. :func:`campaign_of` and :func:`round_status` turn the storage
records of :mod:`ldp_collector.storage.base` into :class:`~ldp_collector.model.Campaign` values.
Everything here is the domain model; :mod:`ldp_collector.serde` converts it to ``ldp.v1`` messages.

This module may import the storage contract, the kinds and the SDK's plain-data specs; it never
imports ``grpc`` or generated protobuf code.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Sequence

from ldp_client.errors import InvalidParameterError
from ldp_client.spec import MAX_EPSILON_PER_CAMPAIGN, RoundSpec, check_campaign_id

from .errors import InvalidArgumentError
from .kinds import KINDS, CampaignEngine, kind_for
from .kinds.base import KindParams
from .kinds.histogram import FrequencyOracle
from .model import BudgetPolicy, Campaign, CampaignConfig, CampaignState, RoundStatus
from .storage.base import CampaignRecord, RoundRecord

__all__ = [
    "COLLECTING",
    "DEFAULT_MIN_REPORTS_PER_ROUND",
    "FAILED",
    "FINISHED",
    "MAX_DESCRIPTION_CHARS",
    "MAX_LABELS",
    "PreparedCampaign",
    "campaign_of",
    "make_engine",
    "new_campaign_id",
    "new_campaign_seed",
    "prepare_campaign",
    "resolve_params",
    "round_status",
]

#: Campaign states as the store keeps them (``CampaignRecord.state``).
COLLECTING, FINISHED, FAILED = "collecting", "finished", "failed"
_STATE_OF_RECORD = {
    COLLECTING: CampaignState.COLLECTING,
    FINISHED: CampaignState.FINISHED,
    FAILED: CampaignState.FAILED,
}

DEFAULT_MIN_REPORTS_PER_ROUND = 1
MAX_DESCRIPTION_CHARS = 4096
MAX_LABELS = 64
MAX_LABEL_CHARS = 256
_MAX_CATEGORICAL_SIZE = 2**63


def new_campaign_id() -> str:
    """A random, URL-safe campaign id (``c-`` + 16 bytes of OS randomness, 24 characters)."""
    return "c-" + secrets.token_urlsafe(16)


def new_campaign_seed() -> int:
    """A random campaign seed (64 bits of OS randomness): the engine's public randomness."""
    return secrets.randbits(64)


def _check_common(config: CampaignConfig) -> None:
    """Checks shared by every kind; raises :class:`InvalidArgumentError` naming the field."""
    if not config.kind:
        raise InvalidArgumentError(f"kind is required; known kinds: {', '.join(sorted(KINDS))}")
    kind_for(config.kind)  # a known, implemented kind

    eps = config.epsilon
    if not math.isfinite(eps) or not 0.0 < eps <= MAX_EPSILON_PER_CAMPAIGN:
        raise InvalidArgumentError(f"epsilon must be in (0, {MAX_EPSILON_PER_CAMPAIGN:g}], got {eps:g}")

    # Numeric bounds are checked when the domain is built (``Domain.numeric`` is the SDK's NumericDomain).
    if config.domain.which is None:
        raise InvalidArgumentError("domain is required: set categorical_size or numeric bounds")
    if config.domain.which == "categorical_size":
        size = config.domain.categorical_size
        if not 2 <= size <= _MAX_CATEGORICAL_SIZE:
            raise InvalidArgumentError(
                f"domain.categorical_size must be in [2, 2^63], got {size}")

    if config.budget_policy not in set(BudgetPolicy):
        raise InvalidArgumentError(f"budget_policy {config.budget_policy} is not a known budget policy")
    if 0 < config.close_after_reports < max(config.min_reports_per_round, DEFAULT_MIN_REPORTS_PER_ROUND):
        raise InvalidArgumentError(
            f"close_after_reports must be 0 (never) or at least min_reports_per_round "
            f"({config.min_reports_per_round}), got {config.close_after_reports}")
    if config.round_duration is not None:
        d = config.round_duration
        if d.seconds < 0 or d.nanos < 0 or not 0 <= d.nanos < 10**9 or d.total_seconds <= 0:
            raise InvalidArgumentError(
                f"round_duration must be positive, got {d.seconds}s {d.nanos}ns")
    if config.seed is not None and (isinstance(config.seed, bool) or not isinstance(config.seed, int)
                                    or not 0 <= config.seed < 2**64):
        raise InvalidArgumentError(f"seed must be an integer in [0, 2^64 - 1], got {config.seed!r}")
    _check_oracles(config.oracles)
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


def _check_oracles(oracles: Sequence[int]) -> None:
    """``CampaignConfig.oracles``: known ``FrequencyOracle`` values (not the unspecified 0), each once."""
    known = {int(o) for o in FrequencyOracle if o != FrequencyOracle.FREQUENCY_ORACLE_UNSPECIFIED}
    for number in oracles:
        if isinstance(number, bool) or not isinstance(number, int) or number not in known:
            raise InvalidArgumentError(
                f"oracles must hold frequency oracles ({', '.join(FrequencyOracle(o).name for o in sorted(known))}), "
                f"got {number!r}")
    if len(set(oracles)) != len(oracles):
        raise InvalidArgumentError("oracles lists a frequency oracle twice")


class PreparedCampaign:
    """A validated configuration with its defaults filled, and the engine built from it.

    Attributes
    ----------
    config : CampaignConfig
        The configuration to store (campaign id assigned, defaults filled, parameters resolved).
    engine : CampaignEngine
        The kind's engine for ``config``.
    """

    __slots__ = ("config", "engine")

    def __init__(self, config: CampaignConfig, engine: CampaignEngine) -> None:
        self.config = config
        self.engine = engine


def prepare_campaign(config: CampaignConfig) -> PreparedCampaign:
    """Validate ``config``, fill its defaults and build its engine (``config`` itself is frozen).

    Defaults: a random campaign id when empty, a random campaign seed when unset (so that the
    stored configuration always carries the seed its engine draws from), budget policy PARTITION,
    ``min_reports_per_round`` 1, and the kind's parameters as their ``resolve`` fills them. The
    allowed oracles are stored in ascending order; the engine built here plans within them, so a
    kind they cannot serve is refused now (``docs/protocol.md`` §10).

    Raises
    ------
    InvalidArgumentError
        Naming the field at fault; an unknown kind, or a kind without an engine, included
        (``"campaign kind GRID is not implemented yet"``).
    """
    if not isinstance(config, CampaignConfig):
        raise TypeError(f"config must be a CampaignConfig, got {type(config).__name__}")
    _check_common(config)
    campaign_id = config.campaign_id
    if not campaign_id:
        campaign_id = new_campaign_id()
    else:
        try:
            check_campaign_id(campaign_id)
        except InvalidParameterError as exc:
            raise InvalidArgumentError(str(exc)) from None
    out = dataclasses.replace(
        config, campaign_id=campaign_id, seed=new_campaign_seed() if config.seed is None else config.seed,
        budget_policy=config.budget_policy or BudgetPolicy.PARTITION,
        min_reports_per_round=config.min_reports_per_round or DEFAULT_MIN_REPORTS_PER_ROUND,
        oracles=tuple(sorted(int(o) for o in config.oracles)))
    params = resolve_params(out)
    out = dataclasses.replace(out, parameters=params)
    return PreparedCampaign(out, kind_for(out.kind).engine(out.campaign_id, out, params))


def resolve_params(config: CampaignConfig) -> KindParams:
    """The kind's parameters of ``config`` (all defaults when it sets none), resolved against it.

    Raises
    ------
    InvalidArgumentError
        Another kind's parameters, or parameters the kind refuses.
    """
    kind = kind_for(config.kind)
    params = config.parameters if config.parameters is not None else kind.params()
    if not isinstance(params, kind.params):  # a model built in-process (serde refuses these on the wire)
        got = next((other.name for other in KINDS.values() if isinstance(params, other.params)), type(params).__name__)
        raise InvalidArgumentError(f"a {kind.name} campaign takes {kind.name} parameters, got {got}")
    return params.resolve(config)


def make_engine(config: CampaignConfig) -> CampaignEngine:
    """The engine of a (validated) configuration, on its resolved parameters.

    Raises
    ------
    InvalidArgumentError
        Parameters the kind refuses.
    """
    return kind_for(config.kind).engine(config.campaign_id, config, resolve_params(config))


def round_status(record: RoundRecord, report_count: int | None = None) -> RoundStatus:
    """The status of a round record; ``report_count`` overrides the record's (live count of an open round)."""
    return RoundStatus(round=record.round, open=record.open,
                       reports=record.report_count if report_count is None else report_count,
                       opened_at=record.opened_at, closed_at=record.closed_at)


def campaign_of(record: CampaignRecord, config: CampaignConfig, rounds: Sequence[RoundStatus],
                current_spec: RoundSpec | None) -> Campaign:
    """The campaign of a campaign record.

    Parameters
    ----------
    record : CampaignRecord
    config : CampaignConfig
        The record's stored configuration.
    rounds : sequence of RoundStatus
        Every round of the campaign, in order.
    current_spec : RoundSpec or None
        The open round's spec (``None`` once the campaign is finished or failed).
    """
    return Campaign(config=config, state=_STATE_OF_RECORD.get(record.state, CampaignState.CAMPAIGN_STATE_UNSPECIFIED),
                    current_round=current_spec, rounds=tuple(rounds), created_at=record.created_at,
                    error=record.error)
