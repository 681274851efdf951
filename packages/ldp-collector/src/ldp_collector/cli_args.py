"""The command line's arguments: value types, the kinds' flags read from the registry, campaign configs.

Every flag of a campaign kind is declared by the kind (:class:`~ldp_collector.kinds.base.CliParam`
in its module); :func:`add_kind_options` offers each flag once (a flag several kinds declare, such
as ``--k``, is one option whose help names them), and :func:`build_campaign_config` writes the
flags of the chosen kind into its ``ldp.v1`` parameters message by field name. That a flag does
not belong to a kind (``--oracle applies to histogram campaigns, not grid``) is derived from the
registry. The CLI is the collector's proto-facing edge: it builds ``ldp.v1`` messages.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.message import Message

from ldp.v1 import campaigns_pb2
from ldp_client.mechanisms.oracle_choice import FREQUENCY_ORACLES

from .kinds import KINDS
from .kinds.base import CliParam, Kind
from .operator import kind_value

__all__ = ["KIND_FLAGS", "POLICIES", "UsageError", "add_kind_options", "build_campaign_config", "kind_values", "nonempty",
           "oracle_list"]

POLICIES = {"partition": campaigns_pb2.PARTITION, "split": campaigns_pb2.SPLIT}
#: Largest values of the wire's unsigned fields: a flag beyond them is a usage error naming the flag,
#: not a protobuf ValueError when the request is built.
_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1


class UsageError(Exception):
    """Flags that parse but do not fit together (exit code 2)."""


def nonempty(text: str) -> str:
    """A value that must not be empty (an unset shell variable, most likely: ``--id "$ID"``)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a value, got an empty string (leave the flag out for the default)")
    return text


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argument type: an integer in ``[low, high]`` (the range of the wire field it fills)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in [{low}, {high}], got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer in [{low}, {high}], got {value}")
        return value

    return parse


uint32 = int_in(1, _UINT32_MAX)
uint64 = int_in(1, _UINT64_MAX)
#: A campaign seed (``CampaignConfig.seed``: any uint64, 0 included).
seed_uint64 = int_in(0, _UINT64_MAX)


def oracle_list(text: str) -> tuple[str, ...]:
    """``--oracles grr,oue``: the frequency oracles a campaign allows, each once."""
    names = tuple(part.strip().lower() for part in text.split(","))
    if not names or any(name not in FREQUENCY_ORACLES for name in names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of distinct oracles among {','.join(FREQUENCY_ORACLES)}, got {text!r}")
    return names


def positive_float(text: str, high: float = math.inf) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= high):
        limit = "" if high == math.inf else f" up to {high:.12g}"
        raise argparse.ArgumentTypeError(f"expected a positive number{limit}, got {text!r}")
    return value


def seconds_up_to(high: float) -> Callable[[str], float]:
    """An argument type: a positive number of seconds, at most ``high``."""
    def parse(text: str) -> float:
        return positive_float(text, high)

    return parse


def dims(text: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``lo:hi,lo:hi,...`` -> (lower, upper)."""
    lower: list[float] = []
    upper: list[float] = []
    for part in text.split(","):
        lo_text, sep, hi_text = part.partition(":")
        try:
            lo, hi = float(lo_text), float(hi_text)
        except ValueError:
            lo = hi = math.nan
        if not sep or not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
            raise argparse.ArgumentTypeError(
                f"expected lo:hi,lo:hi,... with finite lo < hi in every dimension, got {part!r} in {text!r}")
        lower.append(lo)
        upper.append(hi)
    return tuple(lower), tuple(upper)


def cell_counts(text: str) -> tuple[int, ...]:
    """``M`` (every dimension) or ``M1,M2,...``."""
    try:
        cells = tuple(int(p) for p in text.split(","))
    except ValueError:
        cells = ()
    if not cells or any(not 1 <= c <= _UINT32_MAX for c in cells):
        raise argparse.ArgumentTypeError(
            f"expected M or M1,M2,... with integers in [1, {_UINT32_MAX}], got {text!r}")
    return cells


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def label_column(text: str) -> int | str:
    if text == "last":
        return "last"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a column index or 'last', got {text!r}") from None


def host_port(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return text



# -- the kinds' flags ------------------------------------------------------------------------------

#: Argument parsers of the kinds' value types (``"switch"`` and ``"choice"`` need none).
_VALUE_TYPES: dict[str, Callable[[str], Any]] = {"uint32": uint32, "uint64": uint64,
                                                 "positive_float": positive_float, "cells": cell_counts}


def _kind_flags() -> dict[str, tuple[tuple[Kind, CliParam], ...]]:
    """Every kind flag with the kinds that declare it, in registry order; one flag has one type."""
    flags: dict[str, list[tuple[Kind, CliParam]]] = {}
    for kind in KINDS.values():
        for param in kind.cli.params:
            flags.setdefault(param.flag, []).append((kind, param))
    for flag, declared in flags.items():
        first = declared[0][1]
        for kind, param in declared[1:]:
            if (param.type, dict(param.choices)) != (first.type, dict(first.choices)):
                raise RuntimeError(f"{flag} of {kind.name} differs in type or choices from {declared[0][0].name}'s")
    return {flag: tuple(declared) for flag, declared in flags.items()}


#: ``--flag`` -> the (kind, declaration) pairs of the kinds that take it.
KIND_FLAGS: dict[str, tuple[tuple[Kind, CliParam], ...]] = _kind_flags()
_BY_DEST: dict[str, str] = {declared[0][1].dest: flag for flag, declared in KIND_FLAGS.items()}


def _flag_help(declared: Sequence[tuple[Kind, CliParam]]) -> str:
    """The help of one kind's flag, or of a shared one naming its kinds (with each kind's own text if they differ)."""
    helps = {param.help for _, param in declared}
    if len(declared) == 1:
        return declared[0][1].help
    if len(helps) == 1:
        return f"{declared[0][1].help} ({', '.join(kind.name for kind, _ in declared)})"
    return "; ".join(f"{kind.name}: {param.help}" for kind, param in declared)


def add_kind_options(parser: argparse.ArgumentParser, *, skip: frozenset[str] = frozenset()) -> None:
    """Add every kind's flags but ``skip``: one group per kind, and one for the flags several kinds share."""
    groups: dict[str, Any] = {}
    for flag, declared in KIND_FLAGS.items():
        if flag in skip:
            continue
        owner = declared[0][0].name if len(declared) == 1 else ""
        if owner not in groups:
            title = (f"{owner} campaigns (--kind {owner}; unset: the collector's defaults)" if owner
                     else "options of several kinds (unset: the collector's defaults)")
            groups[owner] = parser.add_argument_group(title)
        param = declared[0][1]
        options: dict[str, Any]
        if param.type == "switch":
            options = {"action": "store_true", "default": None}
        elif param.type == "choice":
            options = {"choices": tuple(name for name, _ in param.choices)}
        else:
            options = {"type": _VALUE_TYPES[param.type]}
        if param.metavar is not None:
            options["metavar"] = param.metavar
        groups[owner].add_argument(flag, help=_flag_help(declared), **options)


def kind_values(args: argparse.Namespace, *, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The parsed kind flags (but ``skip``) as :func:`build_campaign_config` keywords (``None``: not given)."""
    return {declared[0][1].dest: getattr(args, declared[0][1].dest) for flag, declared in KIND_FLAGS.items()
            if flag not in skip}


# -- campaign configuration ------------------------------------------------------------------------

def build_campaign_config(kind: str, *, epsilon: float, categories: int | None = None,
                          bounds: tuple[Sequence[float], Sequence[float]] | None = None,
                          budget_policy: str | None = None, min_reports: int | None = None,
                          close_after: int | None = None, round_duration_s: float | None = None,
                          campaign_id: str = "", description: str = "",
                          labels: Sequence[tuple[str, str]] = (), seed: int | None = None,
                          oracles: Sequence[str] = (), **params: Any) -> campaigns_pb2.CampaignConfig:
    """An ``ldp.v1.CampaignConfig`` from plain values; the collector validates the ranges.

    Parameters
    ----------
    kind : str
        A registered kind (``"grid"``).
    epsilon, categories, bounds, budget_policy, min_reports, close_after, round_duration_s, campaign_id, description, labels
        The campaign's common fields (exactly one of ``categories`` and ``bounds``).
    seed : int, optional
        The campaign seed (the engine's public randomness); ``None`` lets the collector draw one.
    oracles : sequence of str
        The frequency oracles the campaign allows (``("grr", "oue")``, names of
        :data:`~ldp_client.mechanisms.oracle_choice.FREQUENCY_ORACLES`); empty for any.
    **params
        The kind's flags by argparse destination (``cells=(8, 8)``, ``variant="iterative"``, ``k=4``):
        each fills the field its :class:`~ldp_collector.kinds.base.CliParam` names; ``None`` (or
        ``False`` for a switch) leaves the collector's default.

    Raises
    ------
    UsageError
        A flag that does not belong to ``kind`` (``--oracle`` on a grid campaign ...) or to the domain
        (``--cells`` with ``--categories``), flags the kind's own rules refuse (``--max-iterations``
        without ``--variant iterative``), or neither or both domains.
    TypeError
        A keyword that no kind declares.
    """
    unknown = sorted(set(params) - set(_BY_DEST))
    if unknown:
        raise TypeError(f"build_campaign_config() got unexpected keyword arguments {', '.join(unknown)}")
    if (categories is None) == (bounds is None):
        raise UsageError("give exactly one domain: --categories N or --dims lo:hi,...")
    config = campaigns_pb2.CampaignConfig(kind=kind_value(kind), epsilon=epsilon, campaign_id=campaign_id,
                                          description=description)
    if categories is not None:
        config.domain.categorical_size = categories
    else:
        assert bounds is not None
        config.domain.numeric.lower.extend(bounds[0])
        config.domain.numeric.upper.extend(bounds[1])
    for key, value in labels:
        if key in config.labels and config.labels[key] != value:
            raise UsageError(f"--label {key} is given twice ({config.labels[key]!r} and {value!r})")
        config.labels[key] = value
    if budget_policy is not None:
        config.budget_policy = POLICIES[budget_policy]
    if min_reports is not None:
        config.min_reports_per_round = min_reports
    if close_after is not None:
        config.close_after_reports = close_after
    if seed is not None:
        config.seed = seed
    config.oracles.extend(campaigns_pb2.FrequencyOracle.Value(name.upper()) for name in oracles)
    if round_duration_s is not None:
        config.round_duration.FromNanoseconds(round(round_duration_s * 1e9))
    spec = KINDS[kind]
    declared = {param.dest: param for param in spec.cli.params}
    # In the order of the flags (not of the keywords), so that the first misfit named is stable.
    given = {dest: params[dest] for dest in _BY_DEST if params.get(dest) is not None and params[dest] is not False}
    for dest in given:
        if dest not in declared:
            flag = _BY_DEST[dest]
            owners = " and ".join(sorted(owner.name for owner, _ in KIND_FLAGS[flag]))
            raise UsageError(f"{flag} applies to {owners} campaigns, not {kind}")
    for dest in given:
        if declared[dest].numeric_only and categories is not None:
            raise UsageError(f"{declared[dest].flag} applies to numeric domains (--dims), not to --categories")
    if spec.cli.check is not None:
        try:
            spec.cli.check(given)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    message = getattr(config, kind)
    message.SetInParent()  # the kind's parameters, even if every field keeps its default
    for dest, value in given.items():
        _write_field(message, declared[dest], value, kind)
    return config


def _write_field(message: Message, param: CliParam, value: Any, kind: str) -> None:
    """Write one flag's value into its field: an enum by its choice's number, cells into a repeated or
    (one value for every dimension) a single field."""
    field = message.DESCRIPTOR.fields_by_name[param.field]
    if param.choices:
        value = dict(param.choices)[value]
    if field.is_repeated:
        getattr(message, param.field).extend(value)
    elif isinstance(value, tuple):
        if len(set(value)) > 1:
            raise UsageError(f"a {kind} campaign takes one {param.flag} value ({param.help})")
        setattr(message, param.field, value[0])
    else:
        setattr(message, param.field, value)
