"""The collector's protobuf boundary: :mod:`ldp_collector.model` <-> ``ldp.v1`` messages.

The SDK's :mod:`ldp_client.serde` converts specs, mechanisms, encoders and reports; this module
converts the collector's own messages (campaign configurations, estimates, results, campaigns) with
it. Together with the service and the operator client, it is the only collector code that imports
generated protobuf classes; kinds, ``core``, storage, the simulator and plotting work on the model.

Stored configurations, results and estimates are the serialized messages
(:func:`config_to_bytes` ...), so the database format is the wire format.
"""

from __future__ import annotations

from typing import cast

from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.message import DecodeError

from ldp.v1 import campaigns_pb2
from ldp_client.clusters import CellClusterModel
from ldp_client.errors import ProtocolError
from ldp_client.serde import (
    encoder_from_proto,
    encoder_to_proto,
    mechanism_from_proto,
    mechanism_to_proto,
    round_spec_from_proto,
    round_spec_to_proto,
    spec_from_proto,
    spec_to_proto,
)

from .errors import InvalidArgumentError
from .kinds import KINDS
from .kinds.base import KindParams
from .kinds.common import numeric_domain
from .model import (
    Campaign,
    CampaignConfig,
    Clustering,
    Domain,
    Duration,
    Estimate,
    Estimates,
    HeavyHitter,
    Result,
    RoundStatus,
)

__all__ = [
    "campaign_from_proto",
    "campaign_to_proto",
    "config_from_bytes",
    "config_from_proto",
    "config_to_bytes",
    "config_to_proto",
    "estimates_from_bytes",
    "estimates_from_proto",
    "estimates_to_bytes",
    "estimates_to_proto",
    "kind_name",
    "kind_number",
    "params_from_proto",
    "params_to_proto",
    "result_from_bytes",
    "result_from_proto",
    "result_to_bytes",
    "result_to_proto",
    "timestamp",
]

_KIND = campaigns_pb2.CampaignKind


def kind_name(number: int) -> str:
    """The kind name of a ``CampaignKind`` number (``"histogram"``; ``""`` for UNSPECIFIED).

    Raises
    ------
    InvalidArgumentError
        A number the proto does not define.
    """
    if number == campaigns_pb2.CAMPAIGN_KIND_UNSPECIFIED:
        return ""
    try:
        return _KIND.Name(number).lower()  # type: ignore[arg-type]
    except ValueError:
        raise InvalidArgumentError(f"kind {number} is not a known campaign kind") from None


def kind_number(name: str) -> int:
    """The ``CampaignKind`` number of a kind name (``0`` for ``""``)."""
    if not name:
        return campaigns_pb2.CAMPAIGN_KIND_UNSPECIFIED
    try:
        return int(_KIND.Value(name.upper()))
    except ValueError:
        raise InvalidArgumentError(f"kind {name!r} is not a known campaign kind") from None


def timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    """A ``google.protobuf.Timestamp`` for Unix ``seconds``."""
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(round(seconds * 1e9))
    return ts


def _seconds(ts: timestamp_pb2.Timestamp) -> float:
    return ts.seconds + ts.nanos * 1e-9


# -- kind parameters -----------------------------------------------------------------------------

def params_from_proto(kind_name: str, config: campaigns_pb2.CampaignConfig) -> KindParams | None:
    """The kind's parameters dataclass of ``config``'s ``parameters`` oneof; ``None`` when none is set.

    Raises
    ------
    InvalidArgumentError
        The oneof holds another kind's parameters (``"a histogram campaign takes histogram
        parameters, got grid"``).
    """
    chosen = config.WhichOneof("parameters")
    if chosen is None:
        return None
    if chosen != kind_name:
        raise InvalidArgumentError(f"a {kind_name} campaign takes {kind_name} parameters, got {chosen}")
    try:
        return cast(KindParams, spec_from_proto(KINDS[kind_name].params, getattr(config, chosen), where=chosen))
    except ProtocolError as exc:  # pragma: no cover - the dataclasses mirror the messages field for field
        raise InvalidArgumentError(str(exc)) from None


def params_to_proto(kind_name: str, params: KindParams, config: campaigns_pb2.CampaignConfig) -> None:
    """Write ``params`` into ``config``'s ``parameters`` oneof as its ``kind_name`` member (replacing any)."""
    message = getattr(config, kind_name)
    message.Clear()
    spec_to_proto(params, message, where=kind_name)


# -- configurations ------------------------------------------------------------------------------

def config_to_proto(config: CampaignConfig) -> campaigns_pb2.CampaignConfig:
    """The ``ldp.v1.CampaignConfig`` of a model configuration.

    Raises
    ------
    InvalidArgumentError
        A kind name the proto does not define.
    """
    message = campaigns_pb2.CampaignConfig(
        campaign_id=config.campaign_id, kind=kind_number(config.kind),  # type: ignore[arg-type]
        epsilon=config.epsilon, budget_policy=int(config.budget_policy),  # type: ignore[arg-type]
        min_reports_per_round=config.min_reports_per_round, close_after_reports=config.close_after_reports,
        description=config.description, labels=dict(config.labels), seed=config.seed,
        oracles=[int(o) for o in config.oracles])  # type: ignore[misc]
    domain = config.domain
    if domain.numeric is not None:
        message.domain.numeric.lower.extend(domain.numeric.lower)
        message.domain.numeric.upper.extend(domain.numeric.upper)
    elif domain.categorical_size:
        message.domain.categorical_size = domain.categorical_size
    if config.round_duration is not None:
        message.round_duration.CopyFrom(duration_pb2.Duration(seconds=config.round_duration.seconds,
                                                              nanos=config.round_duration.nanos))
    if config.parameters is not None:
        params_to_proto(config.kind, config.parameters, message)
    return message


def config_from_proto(message: campaigns_pb2.CampaignConfig) -> CampaignConfig:
    """The model of an ``ldp.v1.CampaignConfig``.

    Only what the model cannot hold is checked here; :func:`ldp_collector.campaigns.prepare_campaign`
    checks the rest. A configuration without a kind carries no parameters (a kind's parameters
    are read as that kind's; ``prepare_campaign`` refuses a configuration without a kind first).

    Raises
    ------
    InvalidArgumentError
        Naming the field: a kind number the proto does not define, numeric bounds the SDK refuses
        (``"domain.numeric: ..."``), parameters of another kind than ``kind``.
    """
    kind = kind_name(message.kind)
    if message.domain.WhichOneof("domain") == "numeric":
        domain = Domain(numeric=numeric_domain(message.domain.numeric.lower, message.domain.numeric.upper))
    else:
        domain = Domain(categorical_size=message.domain.categorical_size)
    duration = None
    if message.HasField("round_duration"):
        duration = Duration(seconds=message.round_duration.seconds, nanos=message.round_duration.nanos)
    return CampaignConfig(
        campaign_id=message.campaign_id, kind=kind, domain=domain, epsilon=message.epsilon,
        budget_policy=message.budget_policy, min_reports_per_round=message.min_reports_per_round,
        close_after_reports=message.close_after_reports, round_duration=duration,
        description=message.description, labels=dict(message.labels),
        seed=message.seed if message.HasField("seed") else None, oracles=tuple(message.oracles),
        parameters=params_from_proto(kind, message) if kind in KINDS else None)


def config_to_bytes(config: CampaignConfig) -> bytes:
    """The stored form of a configuration: the serialized ``ldp.v1.CampaignConfig``."""
    return config_to_proto(config).SerializeToString()


def config_from_bytes(blob: bytes, *, where: str = "configuration") -> CampaignConfig:
    """A stored configuration; ``RuntimeError`` when it is unreadable (the store is damaged)."""
    message = campaigns_pb2.CampaignConfig()
    try:
        message.ParseFromString(blob)
        return config_from_proto(message)
    except (DecodeError, InvalidArgumentError) as exc:
        raise RuntimeError(f"stored {where} is unreadable: {exc}") from exc


# -- estimates and results -----------------------------------------------------------------------

def estimates_to_proto(estimates: Estimates) -> campaigns_pb2.Estimates:
    """The ``ldp.v1.Estimates`` of model estimates."""
    message = campaigns_pb2.Estimates(
        campaign_id=estimates.campaign_id, round=estimates.round, reports=estimates.reports,
        confidence=estimates.confidence, warnings=list(estimates.warnings), consistent=estimates.consistent)
    if estimates.mechanism is not None:
        message.mechanism.CopyFrom(mechanism_to_proto(estimates.mechanism))
    if estimates.encoder is not None:
        message.encoder.CopyFrom(encoder_to_proto(estimates.encoder))
    message.estimates.extend(
        campaigns_pb2.Estimate(value=e.value, count=e.count, std_error=e.std_error, ci_lower=e.ci_lower,
                               ci_upper=e.ci_upper)
        for e in estimates.estimates)
    return message


def estimates_from_proto(message: campaigns_pb2.Estimates) -> Estimates:
    """The model of an ``ldp.v1.Estimates`` (``ProtocolError`` on a mechanism or encoder the SDK refuses)."""
    return Estimates(
        campaign_id=message.campaign_id, round=message.round, reports=message.reports,
        mechanism=mechanism_from_proto(message.mechanism) if message.HasField("mechanism") else None,
        encoder=encoder_from_proto(message.encoder) if message.HasField("encoder") else None,
        confidence=message.confidence,
        estimates=tuple(Estimate(value=e.value, count=e.count, std_error=e.std_error, ci_lower=e.ci_lower,
                                 ci_upper=e.ci_upper) for e in message.estimates),
        warnings=tuple(message.warnings), consistent=message.consistent)


def estimates_to_bytes(estimates: Estimates) -> bytes:
    """The stored form of a round's estimates."""
    return estimates_to_proto(estimates).SerializeToString()


def estimates_from_bytes(blob: bytes, *, where: str = "estimates") -> Estimates:
    """Stored estimates; ``RuntimeError`` when unreadable."""
    message = campaigns_pb2.Estimates()
    try:
        message.ParseFromString(blob)
        return estimates_from_proto(message)
    except (DecodeError, ProtocolError) as exc:
        raise RuntimeError(f"stored {where} are unreadable: {exc}") from exc


def _clustering_to_proto(clustering: Clustering) -> campaigns_pb2.Clustering:
    message = campaigns_pb2.Clustering(k=clustering.k, dimension=clustering.dimension,
                                       centers=list(clustering.centers), weights=list(clustering.weights),
                                       fuzzifier=clustering.fuzzifier)
    if clustering.cell_map is not None:
        spec_to_proto(clustering.cell_map, message.cell_map, where="clustering.cell_map")
    return message


def _clustering_from_proto(message: campaigns_pb2.Clustering) -> Clustering:
    cell_map = None
    if message.HasField("cell_map"):
        cell_map = spec_from_proto(CellClusterModel, message.cell_map, where="clustering.cell_map")
    return Clustering(k=message.k, dimension=message.dimension, centers=tuple(message.centers),
                      weights=tuple(message.weights), cell_map=cell_map,  # type: ignore[arg-type]
                      fuzzifier=message.fuzzifier)


def result_to_proto(result: Result) -> campaigns_pb2.Result:
    """The ``ldp.v1.Result`` of a model result."""
    message = campaigns_pb2.Result(
        campaign_id=result.campaign_id, state=int(result.state),  # type: ignore[arg-type]
        heavy_hitters=[campaigns_pb2.HeavyHitter(value=h.value, count=h.count, std_error=h.std_error)
                       for h in result.heavy_hitters],
        diagnostics=dict(result.diagnostics), warnings=list(result.warnings))
    if result.estimates is not None:
        message.estimates.CopyFrom(estimates_to_proto(result.estimates))
    if result.clustering is not None:
        message.clustering.CopyFrom(_clustering_to_proto(result.clustering))
    if result.finished_at is not None:
        message.finished_at.CopyFrom(timestamp(result.finished_at))
    return message


def result_from_proto(message: campaigns_pb2.Result) -> Result:
    """The model of an ``ldp.v1.Result`` (``ProtocolError`` on parts the SDK refuses)."""
    return Result(
        campaign_id=message.campaign_id, state=message.state,
        estimates=estimates_from_proto(message.estimates) if message.HasField("estimates") else None,
        heavy_hitters=tuple(HeavyHitter(value=h.value, count=h.count, std_error=h.std_error)
                            for h in message.heavy_hitters),
        clustering=_clustering_from_proto(message.clustering) if message.HasField("clustering") else None,
        diagnostics=dict(message.diagnostics), warnings=tuple(message.warnings),
        finished_at=_seconds(message.finished_at) if message.HasField("finished_at") else None)


def result_to_bytes(result: Result) -> bytes:
    """The stored form of a result."""
    return result_to_proto(result).SerializeToString()


def result_from_bytes(blob: bytes, *, where: str = "result") -> Result:
    """A stored result; ``RuntimeError`` when unreadable."""
    message = campaigns_pb2.Result()
    try:
        message.ParseFromString(blob)
        return result_from_proto(message)
    except (DecodeError, ProtocolError) as exc:
        raise RuntimeError(f"stored {where} is unreadable: {exc}") from exc


# -- campaigns -----------------------------------------------------------------------------------

def _round_status_to_proto(status: RoundStatus) -> campaigns_pb2.RoundStatus:
    message = campaigns_pb2.RoundStatus(round=status.round, open=status.open, reports=status.reports)
    if status.opened_at is not None:
        message.opened_at.CopyFrom(timestamp(status.opened_at))
    if status.closed_at is not None:
        message.closed_at.CopyFrom(timestamp(status.closed_at))
    return message


def campaign_to_proto(campaign: Campaign) -> campaigns_pb2.Campaign:
    """The ``ldp.v1.Campaign`` of a model campaign."""
    message = campaigns_pb2.Campaign(
        config=config_to_proto(campaign.config), state=int(campaign.state),  # type: ignore[arg-type]
        rounds=[_round_status_to_proto(r) for r in campaign.rounds], error=campaign.error)
    if campaign.created_at is not None:
        message.created_at.CopyFrom(timestamp(campaign.created_at))
    if campaign.current_round is not None:
        message.current_round.CopyFrom(round_spec_to_proto(campaign.current_round))
    return message


def campaign_from_proto(message: campaigns_pb2.Campaign) -> Campaign:
    """The model of an ``ldp.v1.Campaign`` (what an operator client received).

    Raises
    ------
    InvalidArgumentError
        A configuration the model cannot hold (:func:`config_from_proto`).
    ProtocolError
        A current round spec the SDK refuses.
    """
    return Campaign(
        config=config_from_proto(message.config), state=message.state,
        current_round=round_spec_from_proto(message.current_round) if message.HasField("current_round") else None,
        rounds=tuple(RoundStatus(round=r.round, open=r.open, reports=r.reports,
                                 opened_at=_seconds(r.opened_at) if r.HasField("opened_at") else None,
                                 closed_at=_seconds(r.closed_at) if r.HasField("closed_at") else None)
                     for r in message.rounds),
        created_at=_seconds(message.created_at) if message.HasField("created_at") else None,
        error=message.error)
