"""The contract every campaign kind implements: ``first_round`` and ``close_round``.

A kind's parameters are a frozen :class:`KindParams` dataclass that mirrors its ``ldp.v1.*Parameters``
message field for field; its one verb, ``resolve``, validates them against the campaign and fills
the collector's defaults. An engine is a pure, server-side state machine: it turns a validated
:class:`~ldp_collector.model.CampaignConfig` and the resolved parameters into the first :class:`~ldp_client.spec.RoundSpec`, and each closed round's reports into either
the next round's spec (the *feedback*) or the final :class:`~ldp_collector.model.Result`. It never touches gRPC or
the database directly, so it is unit-testable with the in-process simulator.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Self, TypeVar

import msgpack

from ldp_client.encoders.base import NumericDomain
from ldp_client.errors import ProtocolError
from ldp_client.spec import RoundSpec, Spec

from ..errors import InvalidArgumentError
from ..estimation.report_accumulator import DecodedPass, ReportAccumulator, combine_batches
from ..model import CampaignConfig, Estimates, Result
from ..storage.base import AccumulateFn, StoredReport

__all__ = ["CATEGORICAL", "NUMERIC", "CampaignEngine", "CliParam", "K_PARAM", "Kind", "KindCli", "KindParams", "RoundOutcome",
           "RoundPlan", "RoundReports", "load_state", "numeric_domain", "pack_state"]

_A = TypeVar("_A", bound=ReportAccumulator[object])


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

    Never silent: a final round publishes a result whenever any estimate exists. Where the
    engine's own tests found nothing significant, the result holds its best effort (a warning
    says what it is, and the diagnostic ``best_effort`` is 1) beside the diagnostics that explain
    why, such as the signal-to-noise ratio; only a round without reports publishes nothing, with a
    warning saying so.
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

    #: Decoded batches a reader keeps for the next passes of an iterative step (:class:`DecodedPass`):
    #: up to this many bytes; a round whose decoded reports are larger is read again for each pass.
    decoded_cache_bytes: int = 1 << 30

    def combine(self, accumulator: _A) -> _A:
        """``accumulator`` with every report of the round added (:mod:`~ldp_collector.estimation.report_accumulator`).

        The steps that read raw reports do it through here, so the round never sits in memory:
        in-process the batches stream through the accumulator; other readers (the Beam step)
        override this to combine the accumulator where the reports are.

        A :class:`DecodedPass` (one iteration of an iterative step) gets the decoded batches of
        the pass before it with the same decoding, kept while they fit in
        :attr:`decoded_cache_bytes` (one pass over the round is then read and decoded once);
        beyond that each pass reads the round again. The batches and their order are the same
        either way, so the pass's sums are too.
        """
        if not isinstance(accumulator, DecodedPass):
            return combine_batches(accumulator, self.batches())
        cache: dict[Hashable, list[Any]] = self.__dict__.setdefault("_decoded_cache", {})
        key = accumulator.decoding
        if key in cache:
            for decoded in cache[key]:
                accumulator.add_decoded(decoded)
            return accumulator
        kept: list[Any] | None = []
        size = 0
        for batch in self.batches():
            decoded = accumulator.decode(batch)
            accumulator.add_decoded(decoded)
            if kept is not None:
                size += int(getattr(decoded, "nbytes", 0))
                if size <= self.decoded_cache_bytes:
                    kept.append(decoded)
                else:
                    kept = None
        if kept is not None:
            cache.clear()  # one step's decoding at a time
            cache[key] = kept
        return accumulator


class KindParams(Spec, abc.ABC):
    """Base of a kind's parameters: a frozen ``kw_only`` dataclass mirroring its ``ldp.v1.*Parameters``.

    Field names, proto enums (as :class:`~ldp_collector.kinds.common.ProtoEnum`), tuples for
    repeated fields and defaults (0 / UNSPECIFIED: "the collector's default") are the message's,
    so :mod:`ldp_collector.serde` converts them generically.
    """

    @abc.abstractmethod
    def resolve(self, config: CampaignConfig) -> Self:
        """These parameters checked against the campaign, with every collector default filled in.

        The only place a kind validates its parameters and fills their defaults; the result is what
        the engine runs on and what the stored configuration records, and resolving it again gives
        it back unchanged.

        Parameters
        ----------
        config : CampaignConfig
            The campaign (epsilon, domain, budget policy), its shared fields already checked.

        Raises
        ------
        InvalidArgumentError
            Naming the field at fault and its allowed range.
        """


class CampaignEngine(abc.ABC):
    """Base of every campaign kind's engine (one module per kind under ``ldp_collector.kinds``).

    Parameters
    ----------
    campaign_id : str
    config : CampaignConfig
        The validated configuration (its kind parameters already resolved).
    params : KindParams
        The kind's parameters as returned by their ``resolve``; engines read these, never the
        configuration's ``parameters``.
    """

    def __init__(self, campaign_id: str, config: CampaignConfig, params: KindParams) -> None:
        self.campaign_id = campaign_id
        self.config = config
        self.params = params

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


#: Value types of a kind's command-line flag; the CLI maps each to its argument parser: an integer in
#: a ``uint32`` field's range (``"uint32"``), a positive number, cells per dimension (``M`` or
#: ``M1,M2,...``), an on/off switch, or one of the flag's ``choices``.
CliType = Literal["uint32", "uint64", "positive_float", "cells", "switch", "choice"]
#: How the simulator scores a kind's result: histogram estimates against the true counts, heavy
#: hitters against the true top values, or a clustering against the dataset's labels.
SimulatedResult = Literal["histogram", "heavy_hitters", "clustering"]


@dataclass(frozen=True, kw_only=True)
class CliParam:
    """One command-line flag of a kind: ``--k`` fills field ``k`` of the kind's parameters message.

    Several kinds may declare the same flag (``--k``, ``--cells``): the CLI offers it once, and it
    must then have the same ``type`` everywhere.

    Attributes
    ----------
    flag : str
        ``"--max-iterations"``; its argparse destination is :attr:`dest` (``max_iterations``).
    field : str
        The field of the kind's ``ldp.v1`` parameters message (``CampaignConfig.<kind>``) it fills.
    type : CliType
        The value's type (the field's: ``uint32``, ``double``, a ``bool`` switch, an enum choice;
        ``"cells"`` fills a repeated ``uint32`` or, given one value, a single one).
    help : str
        What the flag sets for this kind.
    choices : tuple of (str, int)
        A ``"choice"`` flag's lower-case names and the enum numbers of the field they stand for.
    metavar : str or None
        The value's name in the help.
    numeric_only : bool
        The flag applies to numeric domains only (``--cells``).
    """

    flag: str
    field: str
    type: CliType
    help: str
    choices: tuple[tuple[str, int], ...] = ()
    metavar: str | None = None
    numeric_only: bool = False

    def __post_init__(self) -> None:
        if not self.flag.startswith("--") or (self.type == "choice") != bool(self.choices):
            raise ValueError(f"{self.flag}: a flag starts with -- and has choices exactly when its type is choice")

    @property
    def dest(self) -> str:
        """The flag's argparse destination and ``build_campaign_config`` keyword (``max_iterations``)."""
        return self.flag.removeprefix("--").replace("-", "_")


#: ``--k``, the number of clusters, as every kind with a ``k`` parameter declares it.
K_PARAM = CliParam(flag="--k", field="k", type="uint32", help="number of clusters")


@dataclass(frozen=True, kw_only=True)
class KindCli:
    """What the command line and the simulator know of a kind, declared in its module.

    Attributes
    ----------
    params : tuple of CliParam
        The kind's flags of ``campaign create`` and ``simulate``.
    check : callable or None
        Rules between the kind's given flags (``{dest: value}``, unset flags left out): raises
        ``ValueError`` with the message the CLI shows as a usage error.
    result : SimulatedResult
        How ``simulate`` scores the result (the simulation side keeps the scoring).
    default_cells : callable or None
        ``simulate``'s cells per dimension for ``d``-dimensional points when ``--cells`` is not
        given (``None``: the engine's default).
    report : callable or None
        The final campaign's parameters ``simulate`` prints, from its (resolved) configuration.
    plotted : bool
        ``simulate --plot`` draws the result (histogram estimates, or a clustering's cell map).
    """

    result: SimulatedResult
    params: tuple[CliParam, ...] = ()
    check: Callable[[Mapping[str, Any]], None] | None = None
    default_cells: Callable[[int], int | None] | None = None
    report: Callable[[CampaignConfig], dict[str, Any]] | None = None
    plotted: bool = False


@dataclass(frozen=True, kw_only=True)
class Kind:
    """Everything the rest of the collector knows about one campaign kind, declared in the kind's module.

    The registry (:data:`ldp_collector.kinds.KINDS`) holds one per kind module; ``campaigns``, the
    CLI, the simulator and the benchmarks read it instead of keeping their own lists of kinds.

    Attributes
    ----------
    name : str
        The lower-case ``ldp.v1.CampaignKind`` value name, which is also the kind's
        ``CampaignConfig.parameters`` oneof field and its ``RoundSpec.kind`` (``"heavy_hitters"``).
    engine : type[CampaignEngine]
        The kind's engine.
    params : type[KindParams]
        The kind's parameters (its ``CampaignConfig.parameters`` member); ``params()`` is the
        all-defaults value of a configuration that sets none.
    domains : frozenset of str
        The ``Domain`` shapes the kind takes: :data:`NUMERIC` points with public bounds and/or
        :data:`CATEGORICAL` values.
    clustering : bool
        The result is a clustering (centers or a cell map) by which points can be labelled.
    cli : KindCli
        Its command-line flags and simulation hooks.
    """

    name: str
    engine: type[CampaignEngine]
    params: type[KindParams]
    domains: frozenset[str]
    clustering: bool = False
    cli: KindCli

    def __post_init__(self) -> None:
        if not self.domains or not self.domains <= {NUMERIC, CATEGORICAL}:
            raise ValueError(f"kind {self.name}: domains must be a non-empty subset of {{{NUMERIC!r}, {CATEGORICAL!r}}}")
        if self.clustering != (self.cli.result == "clustering"):
            raise ValueError(f"kind {self.name}: a clustering kind's simulated result is a clustering, and only its")


def numeric_domain(config: CampaignConfig, kind: str) -> NumericDomain:
    """The campaign's numeric domain, for kinds whose devices hold points with public bounds.

    Raises
    ------
    InvalidArgumentError
        A categorical (or missing) domain.
    """
    if config.domain.numeric is None:
        raise InvalidArgumentError(f"a {kind} campaign needs a numeric domain (points with public bounds)")
    return config.domain.numeric


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
