"""The contract every campaign kind implements: ``first_round`` and ``close_round``.

An engine is a pure, server-side state machine: it turns a validated ``ldp.v1.CampaignConfig``
into the first :class:`~ldp_client.spec.RoundSpec`, and each closed round's reports into either
the next round's spec (the *feedback*) or the final :class:`~ldp_collector.model.Result`. It never touches gRPC or
the database directly, so it is unit-testable with the in-process simulator.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ldp.v1 import campaigns_pb2
from ldp_client.encoders.base import NumericDomain
from ldp_client.errors import ProtocolError
from ldp_client.spec import RoundSpec

from ..errors import InvalidArgumentError
from ..model import Estimates, Result
from ..storage.base import AccumulateFn, StoredReport
from .common import numeric_domain as checked_domain

__all__ = ["CATEGORICAL", "NUMERIC", "CampaignEngine", "Kind", "RoundOutcome", "RoundPlan", "RoundReports", "load_state",
           "numeric_domain", "pack_state"]


@dataclass(frozen=True, kw_only=True)
class RoundPlan:
    """A round to open: its spec and the engine state to carry to ``close_round``."""

    spec: RoundSpec
    engine_state: bytes = b""


@dataclass(frozen=True, kw_only=True)
class RoundOutcome:
    """What closing a round produced: estimates of the round, and either a next round or a result.

    The collector sets the ids, the finish time and the state of ``estimates`` and ``result``, and
    copies ``diagnostics`` into the result.
    """

    estimates: Estimates | None = None
    next_round: RoundPlan | None = None
    result: Result | None = None
    diagnostics: Mapping[str, float] = field(default_factory=dict)


class RoundReports(abc.ABC):
    """Read access to one closed round's stored reports and accumulators."""

    @property
    @abc.abstractmethod
    def count(self) -> int:
        """Number of stored reports."""

    @abc.abstractmethod
    def batches(self, batch_size: int = 65536) -> Iterator[list[StoredReport]]:
        """All reports in insertion order."""

    @abc.abstractmethod
    def accumulators(self) -> dict[str, bytes]:
        """The round's accumulator blobs (as kept by the engine's ``accumulate_fn``)."""


class CampaignEngine(abc.ABC):
    """Base of every campaign kind's engine (one module per kind under ``ldp_collector.kinds``)."""

    def __init__(self, campaign_id: str, config: campaigns_pb2.CampaignConfig) -> None:
        """Validate ``config`` (raise ``InvalidArgumentError`` naming the bad field)."""
        self.campaign_id = campaign_id
        self.config = config

    @abc.abstractmethod
    def first_round(self) -> RoundPlan:
        """The campaign's first round."""

    @abc.abstractmethod
    def close_round(self, spec: RoundSpec, reports: RoundReports, engine_state: bytes) -> RoundOutcome:
        """Run the server step on a closed round."""

    def accumulate_fn(self, spec: RoundSpec) -> AccumulateFn | None:
        """Incremental accumulator maintained at ingestion for ``spec`` (``None``: raw reports only)."""
        return None


#: The two shapes of ``ldp.v1.Domain`` (its oneof field names).
NUMERIC, CATEGORICAL = "numeric", "categorical_size"


@dataclass(frozen=True, kw_only=True)
class Kind:
    """Everything the rest of the collector knows about one campaign kind, declared in the kind's module.

    The registry (:data:`ldp_collector.kinds.KINDS`) holds one per kind module; ``campaigns``, the
    CLI, the simulator and the benchmarks read it instead of keeping their own lists of kinds.

    Attributes
    ----------
    name : str
        The lower-case ``ldp.v1.CampaignKind`` value name, which is also the kind's
        ``CampaignConfig.parameters`` oneof field and its ``RoundSpec.kind`` (``"ldp_kmeans"``).
    engine : type[CampaignEngine]
        The kind's engine.
    domains : frozenset of str
        The ``Domain`` shapes the kind takes: :data:`NUMERIC` points with public bounds and/or
        :data:`CATEGORICAL` values.
    clustering : bool
        The result is a clustering (centers or a cell map) by which points can be labelled.
    """

    name: str
    engine: type[CampaignEngine]
    domains: frozenset[str]
    clustering: bool = False

    def __post_init__(self) -> None:
        if not self.domains or not self.domains <= {NUMERIC, CATEGORICAL}:
            raise ValueError(f"kind {self.name}: domains must be a non-empty subset of {{{NUMERIC!r}, {CATEGORICAL!r}}}")

    @property
    def value(self) -> campaigns_pb2.CampaignKind.ValueType:
        """The kind's ``ldp.v1.CampaignKind`` value."""
        return campaigns_pb2.CampaignKind.Value(self.name.upper())


def numeric_domain(config: campaigns_pb2.CampaignConfig, kind: str) -> NumericDomain:
    """The campaign's numeric domain, for kinds whose devices hold points with public bounds.

    Raises
    ------
    InvalidArgumentError
        A categorical (or missing) domain, or bounds the SDK refuses (``domain.numeric: ...``).
    """
    if config.domain.WhichOneof("domain") != "numeric":
        raise InvalidArgumentError(f"a {kind} campaign needs a numeric domain (points with public bounds)")
    return checked_domain(config.domain.numeric.lower, config.domain.numeric.upper)


def pack_state(phase: str, **fields: Any) -> bytes:
    """A multi-round engine's state between rounds: msgpack of ``{"phase": phase, **fields}``."""
    packed: bytes = msgpack.packb({"phase": phase, **fields}, use_bin_type=True)
    return packed


def load_state(blob: bytes, kind: str, phases: Collection[str] | None = None) -> dict[str, Any]:
    """Read a :func:`pack_state` blob; ``ProtocolError`` when it is unreadable or its phase is not in ``phases``."""
    try:
        state = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several exception types on corrupt input
        raise ProtocolError(f"unreadable {kind} engine state: {exc}") from None
    if not isinstance(state, dict) or not isinstance(state.get("phase"), str):
        raise ProtocolError(f"unreadable {kind} engine state: no phase")
    if phases is not None and state["phase"] not in phases:
        raise ProtocolError(f"unreadable {kind} engine state: no known phase")
    return state
