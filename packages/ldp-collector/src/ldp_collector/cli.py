"""``ldp-collector``: run the collector, manage campaigns, simulate devices, run the demo, plot.

Commands
--------
``serve``
    Serve the gRPC API until SIGTERM/SIGINT (graceful drain). Configuration: ``--config`` TOML
    file, ``LDP_*`` environment variables (``LDP_OPERATOR_TOKEN``, ``LDP_DATA_DIR`` ...), then the
    flags; see :mod:`ldp_collector.config`. ``--workers N`` (``LDP_WORKERS``) forks N server
    processes sharing the port with SO_REUSEPORT and supervises them
    (:class:`~ldp_collector.server.supervisor.Supervisor`):
    signals are forwarded for a graceful drain, a worker that dies is restarted with backoff,
    and worker ``i`` serves metrics on ``--metrics-port + i``. Send the stop signal to the
    supervisor only (systemd: ``KillMode=mixed``); a worker that gets it twice cuts its drain
    short. Workers stop by themselves if the supervisor is killed.
``campaign create|list|show|close``
    Operator calls to a running collector (``--collector HOST:PORT``, default ``$LDP_COLLECTOR`` or
    127.0.0.1:50051) with the bearer token from ``$LDP_OPERATOR_TOKEN``. Human-readable output, or
    ``--json``.
``simulate``
    A campaign played by simulated devices built on the SDK (:mod:`ldp_collector.simulation`), on an
    in-process collector with a temporary SQLite directory, or on ``--collector``. ``--json``
    prints one JSON object with the parameters, the traffic, epsilon per device, wall time and the
    estimation error (histograms, heavy hitters) or the clustering scores (ARI, NMI ... against
    the dataset's labels; a grid clustering labels each point by its cell, ``-1`` = noise).
    ``--plot FILE`` draws the result: a histogram's estimates, or a grid clustering's final cells
    coloured by cluster over the points.
``demo``
    Embedded end-to-end run over real gRPC (:mod:`ldp_collector.demo`), writes ``ldp-demo.png``.
``plot``
    PNG of a histogram campaign's estimates, or of a grid campaign's published clustering (needs
    the ``[plot]`` extra).

Grid campaigns (``--kind grid``, AGCluster) take ``--variant uniform|tree|iterative``,
``--granularity paper|consistent`` (or a fixed ``--granularity-level``), ``--tree-height``,
``--max-iterations`` and ``--cells`` (the calibration grid's cells per dimension); unset, the
collector's defaults apply (tree, consistent).

Exit codes: 0 success, 2 usage error, 1 runtime error, 130 interrupted. Errors are one line on
stderr, never a traceback: usage errors name the flag and point at ``--help``; runtime errors cover
SDK, collector, configuration, gRPC, store and file errors.

The simulator's randomness is seeded and therefore not privacy-preserving; it exists to measure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from datetime import timezone
from pathlib import Path
from typing import Any, NoReturn, TextIO

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import Message
from numpy.typing import NDArray

from ldp.v1 import campaigns_pb2
from ldp_client.clusters import CellClusterModel
from ldp_client.encoders.base import NumericDomain
from ldp_client.encoders.grid import UniformGridEncoder
from ldp_client.errors import InvalidParameterError, LdpError

from . import __version__
from .campaigns import kind_name
from .config import ConfigError, load_config
from .errors import CollectorError
from .model import Clustering, Estimates, Result
from .operator import KINDS, CampaignStateError, OperatorClient, kind_value
from .plotting import MatplotlibMissingError
from .serde import estimates_from_proto, result_from_proto, result_to_proto
from .simulation.datasets import DATASETS, load_file, make_dataset
from .simulation.evaluation import CLUSTERING_KINDS, evaluate_clustering, evaluate_histogram, histogram_truth
from .simulation.population import numeric_bounds
from .simulation.runner import CampaignRun, RemoteCollector, SimulationError, run_campaign

__all__ = ["DEFAULT_COLLECTOR", "UsageError", "build_campaign_config", "build_parser", "main"]

#: ``--collector`` when neither the flag nor ``$LDP_COLLECTOR`` is given.
DEFAULT_COLLECTOR = "127.0.0.1:50051"
_PROG = "ldp-collector"
_ORACLES = {"auto": campaigns_pb2.FREQUENCY_ORACLE_UNSPECIFIED, "grr": campaigns_pb2.GRR, "sue": campaigns_pb2.SUE,
            "oue": campaigns_pb2.OUE, "olh": campaigns_pb2.OLH}
_POLICIES = {"partition": campaigns_pb2.PARTITION, "split": campaigns_pb2.SPLIT}
_GRID = campaigns_pb2.GridParameters
_VARIANTS = {"uniform": _GRID.UNIFORM, "tree": _GRID.TREE, "iterative": _GRID.ITERATIVE}
_GRANULARITIES = {"paper": _GRID.PAPER, "consistent": _GRID.CONSISTENT}
#: Kinds whose parameters take ``k``.
_K_KINDS = frozenset({"stemmer", "nettree", "bitvector", "laplace", "ldp_kmeans"})
_RUNTIME_ERRORS = (LdpError, CollectorError, ConfigError, CampaignStateError, SimulationError, MatplotlibMissingError,
                   OSError)
#: Heavy-hitter simulations over numeric data: grid cells per dimension (values) in one or two dimensions.
_HEAVY_HITTER_CELLS_2D = 32
#: Kinds whose simulation ``--plot`` draws.
_PLOTTED_KINDS = frozenset({"histogram", "grid"})
#: Largest values of the wire's unsigned fields: a flag beyond them is a usage error naming the flag,
#: not a protobuf ValueError when the request is built.
_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1
#: ``google.protobuf.Duration``'s range (10 000 years), the bound of ``--round-duration``.
_MAX_DURATION_S = 315_576_000_000.0
#: Largest ``--timeout``: a gRPC deadline too far away (beyond about 1e10 s) overflows into an
#: immediate DEADLINE_EXCEEDED; a day is more than any call needs.
_MAX_TIMEOUT_S = 86_400.0


class UsageError(Exception):
    """Flags that parse but do not fit together (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line pointing at ``--help``, not the usage text (many lines for a
    command with many flags) above the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, _usage_error(self.prog, message))


def _usage_error(prog: str, message: str) -> str:
    return f"{prog}: error: {_one_line(message)} (see {prog} --help)\n"


# -- argument types ----------------------------------------------------------------------------------

def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def _int_in(low: int, high: int) -> Callable[[str], int]:
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


_uint32 = _int_in(1, _UINT32_MAX)
_uint64 = _int_in(1, _UINT64_MAX)


def _positive_float(text: str, high: float = math.inf) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= high):
        limit = "" if high == math.inf else f" up to {high:.12g}"
        raise argparse.ArgumentTypeError(f"expected a positive number{limit}, got {text!r}")
    return value


def _seconds_up_to(high: float) -> Callable[[str], float]:
    """An argument type: a positive number of seconds, at most ``high``."""
    def parse(text: str) -> float:
        return _positive_float(text, high)

    return parse


def _dims(text: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
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


def _cells(text: str) -> tuple[int, ...]:
    """``M`` (every dimension) or ``M1,M2,...``."""
    try:
        cells = tuple(int(p) for p in text.split(","))
    except ValueError:
        cells = ()
    if not cells or any(not 1 <= c <= _UINT32_MAX for c in cells):
        raise argparse.ArgumentTypeError(
            f"expected M or M1,M2,... with integers in [1, {_UINT32_MAX}], got {text!r}")
    return cells


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _label_column(text: str) -> int | str:
    if text == "last":
        return "last"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a column index or 'last', got {text!r}") from None


def _host_port(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return text


# -- campaign configuration ------------------------------------------------------------------------

def build_campaign_config(kind: str, *, epsilon: float, categories: int | None = None,
                          bounds: tuple[Sequence[float], Sequence[float]] | None = None,
                          cells: Sequence[int] | None = None, oracle: str | None = None,
                          max_payload_bits: int | None = None, consistency: bool = False,
                          windows: int | None = None, anomaly_alpha: float | None = None, k: int | None = None,
                          value_bits: int | None = None, bits_per_level: int | None = None,
                          false_positive_rate: float | None = None, max_candidates: int | None = None,
                          variant: str | None = None, granularity: str | None = None,
                          granularity_level: int | None = None, tree_height: int | None = None,
                          max_iterations: int | None = None,
                          budget_policy: str | None = None, min_reports: int | None = None,
                          close_after: int | None = None, round_duration_s: float | None = None,
                          campaign_id: str = "", description: str = "",
                          labels: Sequence[tuple[str, str]] = ()) -> campaigns_pb2.CampaignConfig:
    """An ``ldp.v1.CampaignConfig`` from plain values; the collector validates the ranges.

    Grid campaigns: ``variant`` (``"uniform"``, ``"tree"``, ``"iterative"``), ``granularity``
    (``"paper"``, ``"consistent"``) or a fixed ``granularity_level``, ``tree_height`` (tree and
    iterative variants), ``max_iterations`` (iterative) and ``cells`` (the calibration grid's cells
    per dimension); ``None`` leaves the collector's default.

    Raises
    ------
    UsageError
        Options that do not belong to ``kind`` or to the domain (``--cells`` with ``--categories``,
        ``--oracle`` on a clustering campaign ...), grid options that do not belong to the variant
        (``--max-iterations`` without ``--variant iterative``), or neither or both domains.
    """
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
        config.labels[key] = value
    if budget_policy is not None:
        config.budget_policy = _POLICIES[budget_policy]
    if min_reports is not None:
        config.min_reports_per_round = min_reports
    if close_after is not None:
        config.close_after_reports = close_after
    if round_duration_s is not None:
        config.round_duration.FromNanoseconds(round(round_duration_s * 1e9))

    def only(kinds: set[str] | frozenset[str], **given: Any) -> None:
        for name, value in given.items():
            if value is not None and value is not False and kind not in kinds:
                flag = "--" + name.replace("_", "-")
                raise UsageError(f"{flag} applies to {' and '.join(sorted(kinds))} campaigns, not {kind}")

    only({"histogram"}, oracle=oracle, max_payload_bits=max_payload_bits, consistency=consistency, windows=windows,
         anomaly_alpha=anomaly_alpha)
    only({"histogram", "grid"}, cells=cells)
    only({"heavy_hitters"}, value_bits=value_bits, bits_per_level=bits_per_level,
         false_positive_rate=false_positive_rate, max_candidates=max_candidates)
    only(_K_KINDS, k=k)
    only({"grid"}, variant=variant, granularity=granularity, granularity_level=granularity_level,
         tree_height=tree_height, max_iterations=max_iterations)
    if cells is not None and categories is not None:
        raise UsageError("--cells applies to numeric domains (--dims), not to --categories")
    if kind == "histogram":
        config.histogram.SetInParent()
        params = config.histogram
        params.oracle = _ORACLES[oracle or "auto"]
        params.max_payload_bits = max_payload_bits or 0
        params.consistency = consistency
        params.cells_per_dimension.extend(cells or ())
        params.windows = windows or 0
        params.anomaly_alpha = anomaly_alpha or 0.0
    elif kind == "heavy_hitters":
        config.heavy_hitters.CopyFrom(campaigns_pb2.HeavyHitterParameters(
            value_bits=value_bits or 0, bits_per_level=bits_per_level or 0,
            false_positive_rate=false_positive_rate or 0.0, max_candidates=max_candidates or 0))
    elif kind == "grid":
        if cells is not None and len(set(cells)) > 1:
            raise UsageError("a grid campaign takes one --cells value (the initial cells per dimension)")
        # The engine's default variant is tree: say so when a flag needs another one.
        shown = variant or "tree (the default)"
        if max_iterations is not None and variant != "iterative":
            raise UsageError(f"--max-iterations applies to the iterative grid variant (--variant iterative), "
                             f"not {shown}")
        if tree_height is not None and variant == "uniform":
            raise UsageError("--tree-height applies to the tree and iterative grid variants, not uniform")
        config.grid.SetInParent()
        params_grid = config.grid
        params_grid.initial_cells_per_dimension = cells[0] if cells else 0
        params_grid.variant = _VARIANTS[variant] if variant else _GRID.VARIANT_UNSPECIFIED
        params_grid.granularity = _GRANULARITIES[granularity] if granularity else _GRID.GRANULARITY_UNSPECIFIED
        params_grid.granularity_level = granularity_level or 0
        params_grid.tree_height = tree_height or 0
        params_grid.max_iterations = max_iterations or 0
    elif kind in _K_KINDS:
        params_k = getattr(config, kind)
        params_k.SetInParent()
        params_k.k = k or 0
    return config


# -- output helpers --------------------------------------------------------------------------------

def _to_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _print_json(obj: Any, stream: TextIO) -> None:
    stream.write(json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _finite(value: float) -> float | None:
    """JSON has no NaN: ``None`` instead."""
    return value if math.isfinite(value) else None


def _domain_text(config: campaigns_pb2.CampaignConfig) -> str:
    domain = config.domain
    if domain.WhichOneof("domain") == "categorical_size":
        return f"categorical, {domain.categorical_size} values"
    if domain.WhichOneof("domain") == "numeric":
        ranges = " x ".join(f"[{lo:g}, {hi:g}]" for lo, hi in zip(domain.numeric.lower, domain.numeric.upper))
        return f"numeric {ranges}"
    return "unset"


def _parameters_text(config: campaigns_pb2.CampaignConfig) -> str:
    which = config.WhichOneof("parameters")
    if which is None:
        return ""
    params = getattr(config, which)
    if which == "histogram":
        parts = [f"oracle {campaigns_pb2.FrequencyOracle.Name(params.oracle)}"]
        if params.cells_per_dimension:
            parts.append(" x ".join(str(c) for c in params.cells_per_dimension) + " cells")
        if params.consistency:
            parts.append("consistent")
        return ", ".join(parts)
    return ", ".join(f"{f.name} {_field_value_text(f, v)}" for f, v in params.ListFields())


def _field_value_text(field: Any, value: Any) -> str:
    """An enum value by name (``TREE``), anything else as is."""
    if field.enum_type is not None:
        known = field.enum_type.values_by_number.get(value)
        return str(known.name) if known is not None else str(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _timestamp_text(ts: Any) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    return str(ts.ToDatetime(tzinfo=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))


def _state_name(state: int) -> str:
    return str(campaigns_pb2.CampaignState.Name(state))  # type: ignore[arg-type]


def _print_campaign(campaign: campaigns_pb2.Campaign, stream: TextIO) -> None:
    config = campaign.config
    write = stream.write
    write(f"campaign {config.campaign_id} ({kind_name(config.kind)})  state {_state_name(campaign.state)}\n")
    if config.description:
        write(f"  description  {config.description}\n")
    write(f"  epsilon      {config.epsilon:g} per device, budget policy "
          f"{campaigns_pb2.BudgetPolicy.Name(config.budget_policy)}\n")
    write(f"  domain       {_domain_text(config)}\n")
    params = _parameters_text(config)
    if params:
        write(f"  parameters   {params}\n")
    write(f"  created      {_timestamp_text(campaign.created_at)}\n")
    for r in campaign.rounds:
        status = "open" if r.open else f"closed {_timestamp_text(r.closed_at)}"
        write(f"  round {r.round:<6} {status}, {r.reports:,} reports\n")
    if campaign.error:
        write(f"  error        {campaign.error}\n")


def _print_estimates(estimates: Estimates, top: int, stream: TextIO) -> None:
    rows = sorted(estimates.estimates, key=lambda e: -e.count)[:top]
    write = stream.write
    write(f"  estimates of round {estimates.round} from {estimates.reports:,} reports "
          f"(top {len(rows)} of {len(estimates.estimates)}, {estimates.confidence:.0%} intervals"
          f"{', consistent' if estimates.consistent else ''})\n")
    write(f"  {'value':>10} {'count':>12} {'std error':>10} {'interval':>25}\n")
    for e in rows:
        write(f"  {e.value:>10} {e.count:12.1f} {e.std_error:10.1f}   [{e.ci_lower:10.1f}, {e.ci_upper:10.1f}]\n")
    for warning in estimates.warnings:
        write(f"  warning: {warning}\n")


# -- commands --------------------------------------------------------------------------------------

def _operator(args: argparse.Namespace) -> OperatorClient:
    return OperatorClient(args.collector, token=os.environ.get("LDP_OPERATOR_TOKEN") or None, timeout=args.timeout)


def _cmd_serve(args: argparse.Namespace) -> int:
    from .logging_setup import configure_logging

    overrides: dict[str, Any] = {"listen": args.listen, "data_dir": args.data_dir, "metrics_port": args.metrics_port,
                                 "log_format": args.log_format, "log_level": args.log_level, "workers": args.workers}
    config = load_config(args.config, overrides=overrides)
    configure_logging(config.log_format, config.log_level)
    if config.workers == 1:
        from .server.lifecycle import serve

        asyncio.run(serve(config))
        return 0
    from .server.supervisor import Supervisor

    return Supervisor(config, report_error=_report_worker_error).run()


def _report_worker_error(who: str, exc: BaseException) -> None:
    """A serving worker's last words: one line for an expected error, else the traceback."""
    if isinstance(exc, _RUNTIME_ERRORS):
        sys.stderr.write(f"{_PROG}: error: {who}: {_one_line(exc)}\n")
    else:
        sys.stderr.write(f"{_PROG}: error: {who} failed:\n{''.join(traceback.format_exception(exc))}")




def _cmd_campaign_create(args: argparse.Namespace) -> int:
    config = build_campaign_config(
        args.kind, epsilon=args.epsilon, categories=args.categories, bounds=args.dims, cells=args.cells,
        oracle=args.oracle, max_payload_bits=args.max_payload_bits, consistency=args.consistency or False,
        windows=args.windows, anomaly_alpha=args.anomaly_alpha,
        k=args.k, value_bits=args.value_bits, bits_per_level=args.bits_per_level,
        false_positive_rate=args.false_positive_rate, max_candidates=args.max_candidates,
        variant=args.variant, granularity=args.granularity, granularity_level=args.granularity_level,
        tree_height=args.tree_height, max_iterations=args.max_iterations,
        budget_policy=args.budget_policy, min_reports=args.min_reports, close_after=args.close_after,
        round_duration_s=args.round_duration, campaign_id=args.id or "", description=args.description or "",
        labels=args.label or ())
    with _operator(args) as operator:
        campaign = operator.create_campaign(config)
    if args.json:
        _print_json(_to_dict(campaign), sys.stdout)
    else:
        _print_campaign(campaign, sys.stdout)
    return 0


def _cmd_campaign_list(args: argparse.Namespace) -> int:
    with _operator(args) as operator:
        campaigns = operator.list_campaigns()
    if args.json:
        _print_json([_to_dict(c) for c in campaigns], sys.stdout)
        return 0
    if not campaigns:
        sys.stdout.write("no campaigns\n")
        return 0
    sys.stdout.write(f"{'ID':<28} {'KIND':<14} {'STATE':<11} {'ROUND':>5} {'REPORTS':>10} {'EPSILON':>8}  CREATED\n")
    for c in campaigns:
        current = c.rounds[-1] if c.rounds else None
        sys.stdout.write(
            f"{c.config.campaign_id:<28} {kind_name(c.config.kind):<14} {_state_name(c.state):<11} "
            f"{current.round if current else 0:>5} {current.reports if current else 0:>10,} "
            f"{c.config.epsilon:>8g}  {_timestamp_text(c.created_at)}\n")
    return 0


def _cmd_campaign_show(args: argparse.Namespace) -> int:
    with _operator(args) as operator:
        campaign = operator.get_campaign(args.campaign_id)
        result = result_from_proto(operator.get_result(args.campaign_id))
    if args.json:
        _print_json({"campaign": _to_dict(campaign), "result": _to_dict(result_to_proto(result))}, sys.stdout)
        return 0
    _print_campaign(campaign, sys.stdout)
    if result.estimates is not None and result.estimates.estimates:
        _print_estimates(result.estimates, args.top, sys.stdout)
    for hh in result.heavy_hitters[: args.top]:
        sys.stdout.write(f"  heavy hitter {hh.value}: {hh.count:.1f} +- {hh.std_error:.1f}\n")
    if result.clustering is not None:
        sys.stdout.write(f"  clustering   {_clustering_text(result.clustering)}\n")
    for key, value in sorted(result.diagnostics.items()):
        sys.stdout.write(f"  {key} = {value:g}\n")
    if campaign.state != campaigns_pb2.FAILED:
        for warning in result.warnings:
            sys.stdout.write(f"  warning: {warning}\n")
    return 0


def _cmd_campaign_close(args: argparse.Namespace) -> int:
    with _operator(args) as operator:
        round_ = args.round
        if round_ is None:
            campaign = operator.get_campaign(args.campaign_id)
            if campaign.state != campaigns_pb2.COLLECTING or not campaign.HasField("current_round"):
                raise CampaignStateError(f"campaign {args.campaign_id} is {_state_name(campaign.state)}; "
                                         "it has no open round to close")
            round_ = campaign.current_round.round
        campaign = operator.close_round(args.campaign_id, round_)
    if args.json:
        _print_json(_to_dict(campaign), sys.stdout)
    else:
        sys.stdout.write(f"closed round {round_}\n")
        _print_campaign(campaign, sys.stdout)
    return 0


def _clustering_text(clustering: Clustering | None) -> str:
    """``3 clusters over 412 cells (120 noise)`` or ``4 centers in 2-D``."""
    clustering = clustering or Clustering()
    if clustering.centers:
        return f"{clustering.k} centers in {clustering.dimension}-D"
    labels = clustering.cell_map.labels if clustering.cell_map is not None else ()
    noise = sum(1 for label in labels if label < 0)
    return f"{clustering.k} clusters over {len(labels):,} cells ({noise:,} noise)"


def _cell_map(result: Result) -> CellClusterModel:
    """A grid campaign's published cell map (``InvalidParameterError`` when the result has none)."""
    if result.clustering is None or result.clustering.cell_map is None:
        raise InvalidParameterError("the grid clustering has no cells to plot")
    return result.clustering.cell_map


def _estimates(result: Result) -> Estimates:
    """A histogram campaign's published estimates (``InvalidParameterError`` when the result has none)."""
    if result.estimates is None:
        raise InvalidParameterError("the result holds no estimates")
    return result.estimates


def _cmd_plot(args: argparse.Namespace) -> int:
    from .plotting import plot_estimates, plot_grid_clustering, require_matplotlib

    require_matplotlib()
    out = args.out or f"{args.campaign_id}.png"
    with _operator(args) as operator:
        campaign = operator.get_campaign(args.campaign_id)
        if campaign.config.kind == campaigns_pb2.GRID:
            if args.round is not None:
                raise UsageError("--round applies to histogram campaigns; a grid campaign's plot is its result")
            if campaign.state != campaigns_pb2.FINISHED:
                raise CampaignStateError(f"campaign {args.campaign_id} is {_state_name(campaign.state)}; a grid "
                                         "campaign's clustering is published when it finishes")
            result = result_from_proto(operator.get_result(args.campaign_id))
            path = plot_grid_clustering(_cell_map(result), out,
                                        title=f"campaign {args.campaign_id}: {_clustering_text(result.clustering)}")
        else:
            estimates = estimates_from_proto(operator.get_estimates(args.campaign_id, args.round or 0))
            path = plot_estimates(estimates, campaign.config, out)
    sys.stdout.write(f"wrote {path}\n")
    return 0


def _load_points(args: argparse.Namespace) -> tuple[NDArray[np.float64], NDArray[np.int64] | None, dict[str, Any]]:
    """The simulation's points and labels, and what describes them in the output."""
    if args.data is not None:
        if args.d is not None:
            raise UsageError("--d applies to generated datasets (--dataset), not to --data")
        x, labels = load_file(args.data, args.label_column)
        info: dict[str, Any] = {"data": str(args.data), "file_points": int(len(x))}
        if args.n is not None and args.n != len(x):
            rng = np.random.default_rng(args.seed)
            # Fewer: a random subset; more: resampled with replacement (duplicated points, said so).
            index = rng.choice(len(x), size=args.n, replace=args.n > len(x))
            x = x[index]
            labels = labels[index] if labels is not None else None
            info["resampled"] = "with replacement" if args.n > info["file_points"] else "random subset"
        return x, labels, info
    if args.label_column is not None:
        raise UsageError("--label-column applies to --data files")
    # --k of a clustering kind is the algorithm's; a dataset with a fixed number of clusters keeps its own.
    k = None if DATASETS[args.dataset].fixed_k else args.k
    x, labels = make_dataset(args.dataset, args.n or 20_000, d=args.d, k=k, seed=args.seed)
    return x, labels, {"dataset": args.dataset}


def _value_points(x: NDArray[np.float64], lower: tuple[float, ...], upper: tuple[float, ...],
                  cells: tuple[int, ...]) -> tuple[list[tuple[int]], int]:
    """Heavy hitters over a numeric dataset: each point's grid cell index as the device's value."""
    encoder = UniformGridEncoder(domain=NumericDomain(lower=lower, upper=upper), cells_per_dimension=cells)
    return [(encoder.encode(p),) for p in x.tolist()], encoder.output_size


def _heavy_hitter_errors(result: Result, truth: NDArray[np.int64], n: int) -> dict[str, Any]:
    found = list(result.heavy_hitters)
    out: dict[str, Any] = {"found": len(found)}
    if not found:
        return out
    values = np.array([h.value for h in found], dtype=np.int64)
    counts = np.array([h.count for h in found])
    se = np.array([h.std_error for h in found])
    true = truth[values].astype(np.float64)
    err = np.abs(counts - true)
    top = set(np.argsort(-truth, kind="stable")[: len(found)].tolist())
    out.update({
        "max_abs_freq_error": float(err.max() / n), "mean_abs_freq_error": float(err.mean() / n),
        "mean_abs_z": _finite(float(np.mean(err[se > 0] / se[se > 0]))) if np.any(se > 0) else None,
        "recall_of_true_top": len(top & set(values.tolist())) / len(found),
        "smallest_found_true_freq": float(true.min() / n),
    })
    return out


def _cmd_simulate(args: argparse.Namespace) -> int:
    kind = args.kind
    if kind not in CLUSTERING_KINDS and args.k is not None and args.dataset not in ("blobs", "mixture"):
        raise UsageError(f"--k sets the clusters of the blobs and mixture datasets or of clustering kinds, not {kind}")
    if args.plot is not None:
        if kind not in _PLOTTED_KINDS:
            raise UsageError(f"--plot applies to {' and '.join(sorted(_PLOTTED_KINDS))} simulations, not {kind}")
        from .plotting import require_matplotlib

        require_matplotlib()  # before the campaign runs, not after
    grid_options: dict[str, Any] = {"variant": args.variant, "granularity": args.granularity,
                                    "granularity_level": args.granularity_level, "tree_height": args.tree_height,
                                    "max_iterations": args.max_iterations}
    x, labels, data_info = _load_points(args)
    lower, upper = numeric_bounds(x)
    d = x.shape[1]
    cells = args.cells
    if cells is not None and len(cells) == 1:
        cells = cells * d
    points: Any = x
    if kind == "heavy_hitters":
        if cells is None:
            cells = (_HEAVY_HITTER_CELLS_2D if d <= 2 else 4,) * d
        points, size = _value_points(x, lower, upper, tuple(cells))
        config = build_campaign_config(kind, epsilon=args.epsilon, categories=size, oracle=args.oracle,
                                       budget_policy=args.budget_policy, **grid_options)
    elif kind == "histogram":
        if cells is None and d == 2:
            cells = (16, 16)
        config = build_campaign_config(kind, epsilon=args.epsilon, bounds=(lower, upper), cells=cells,
                                       oracle=args.oracle, budget_policy=args.budget_policy, **grid_options)
    else:
        k = args.k or (int(labels.max()) + 1 if labels is not None else None)
        config = build_campaign_config(kind, epsilon=args.epsilon, bounds=(lower, upper),
                                       cells=cells if kind == "grid" else None, oracle=args.oracle,
                                       k=k if kind in _K_KINDS else None, budget_policy=args.budget_policy,
                                       **grid_options)
    run = _run_simulation(args, config, points)
    parameters: dict[str, Any] = {
        "kind": kind, **data_info, "n": int(len(x)), "d": int(d), "epsilon": args.epsilon, "seed": args.seed,
        "collector": args.collector or "in-process", "mode": run.stats.mode,
        "lower": list(lower), "upper": list(upper),
    }
    final = run.campaign.config
    if kind == "histogram":
        parameters["cells"] = list(final.histogram.cells_per_dimension)
        parameters["oracle"] = campaigns_pb2.FrequencyOracle.Name(final.histogram.oracle)
    elif kind == "heavy_hitters":
        parameters["cells"] = list(cells or ())
        parameters["value_bits"] = final.heavy_hitters.value_bits
    elif kind == "grid":
        grid = final.grid
        parameters["variant"] = _GRID.Variant.Name(grid.variant).lower()
        parameters["granularity"] = _GRID.Granularity.Name(grid.granularity).lower()
        parameters["budget_policy"] = campaigns_pb2.BudgetPolicy.Name(final.budget_policy
                                                                      or campaigns_pb2.PARTITION).lower()
        parameters["initial_cells_per_dimension"] = grid.initial_cells_per_dimension
        parameters["final_cells"] = len(_cell_map(run.result).cells)
        parameters["rounds"] = run.stats.rounds
    output: dict[str, Any] = {
        "campaign_id": run.campaign_id, "parameters": parameters, "reports_sent": run.stats.reports_sent,
        "epsilon_per_device": run.stats.epsilon_per_device, "wall_time_s": run.stats.wall_time_s,
        "stats": run.stats.to_dict(),
    }
    if kind == "histogram":
        errors = evaluate_histogram(_estimates(run.result), histogram_truth(run.first_spec, points))
        output["errors"] = {key: _finite(value) for key, value in errors.items()}
    elif kind == "heavy_hitters":
        truth = np.bincount(np.array([p[0] for p in points], dtype=np.int64),
                            minlength=int(final.domain.categorical_size))
        output["errors"] = _heavy_hitter_errors(run.result, truth, len(points))
    else:
        scores = evaluate_clustering(run.result, x, labels, k=args.k, seed=args.seed)
        output["clustering"] = {key: _finite(value) for key, value in scores.items()}
    output["warnings"] = list(run.result.warnings)
    output["diagnostics"] = {key: _finite(value) for key, value in run.result.diagnostics.items()}
    if args.plot is not None:
        output["plot"] = str(_plot_simulation(args.plot, run, x, parameters))
    if args.json:
        _print_json(output, sys.stdout)
    else:
        _print_simulation(output, sys.stdout)
    return 0


def _plot_simulation(out: str, run: CampaignRun, x: NDArray[np.float64], parameters: dict[str, Any]) -> Path:
    """``--plot``: a histogram's estimates, or a grid clustering's final cells over the points."""
    from .plotting import plot_estimates, plot_grid_clustering

    source = parameters.get("dataset") or parameters.get("data")
    title = f"{parameters['kind']} on {source}, n = {parameters['n']:,}, epsilon = {parameters['epsilon']:g}"
    if parameters["kind"] == "grid":
        return plot_grid_clustering(_cell_map(run.result), out, points=x, seed=parameters["seed"],
                                    title=f"{title} ({parameters['variant']}): {_clustering_text(run.result.clustering)}")
    return plot_estimates(_estimates(run.result), run.campaign.config, out, title=title)


def _run_simulation(args: argparse.Namespace, config: campaigns_pb2.CampaignConfig, points: Any) -> CampaignRun:
    common: dict[str, Any] = {"seed": args.seed, "mode": args.mode, "batch_size": args.batch_size,
                              "quiet": args.quiet or args.json}
    if args.collector is not None:
        with RemoteCollector(args.collector, operator_token=os.environ.get("LDP_OPERATOR_TOKEN") or None,
                             packed=True) as remote:
            return run_campaign(remote, config, points, **common)
    from .core import Collector
    from .storage import open_store

    with tempfile.TemporaryDirectory(prefix="ldp-simulate-") as data_dir:
        store = open_store(data_dir)
        try:
            return run_campaign(Collector(store), config, points, **common)
        finally:
            store.close()


def _number_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _print_simulation(output: dict[str, Any], stream: TextIO) -> None:
    p = output["parameters"]
    stats = output["stats"]
    source = p.get("dataset") or p.get("data")
    write = stream.write
    write(f"simulated {p['kind']} campaign {output['campaign_id']} on {p['collector']}: {source}, "
          f"n = {p['n']:,}, d = {p['d']}, epsilon = {p['epsilon']:g}\n")
    write(f"  reports sent {output['reports_sent']:,} (accepted {stats['accepted']:,}, rejected {stats['rejected']:,}, "
          f"refused {stats['refused']:,}), epsilon per device {output['epsilon_per_device']:g}, "
          f"wall time {output['wall_time_s']:.2f} s ({stats['reports_per_second']:,.0f} reports/s)\n")
    if p["kind"] == "grid":
        write(f"  grid: variant {p['variant']}, granularity {p['granularity']}, budget policy {p['budget_policy']}, "
              f"{p['rounds']} rounds, {p['final_cells']:,} final cells\n")
    for section in ("errors", "clustering"):
        for key, value in output.get(section, {}).items():
            write(f"  {key:<26} {_number_text(value)}\n")
    for warning in output["warnings"]:
        write(f"  warning: {warning}\n")
    if output.get("plot"):
        write(f"wrote {output['plot']}\n")


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import print_summary, run_demo

    summary = run_demo(n=args.n, dataset=args.dataset, cells=args.cells, epsilon=args.epsilon, seed=args.seed,
                       out=None if args.no_plot else args.out, quiet=args.quiet or args.json,
                       packed=args.submit == "packed")
    if args.json:
        _print_json(summary.to_dict(), sys.stdout)
    else:
        print_summary(summary, sys.stdout)
    return 0


# -- parser ----------------------------------------------------------------------------------------

def _add_remote(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    default = os.environ.get("LDP_COLLECTOR") or DEFAULT_COLLECTOR
    help_text = (f"collector address (default $LDP_COLLECTOR or {DEFAULT_COLLECTOR}); the operator token comes "
                 "from $LDP_OPERATOR_TOKEN") if required else (
        "run against this collector instead of an in-process one (operator token from $LDP_OPERATOR_TOKEN)")
    parser.add_argument("--collector", metavar="HOST:PORT", type=_host_port, default=default if required else None,
                        help=help_text)
    if required:
        parser.add_argument("--timeout", type=_seconds_up_to(_MAX_TIMEOUT_S), default=30.0,
                            help=f"seconds per call (default 30, at most {_MAX_TIMEOUT_S:g})")


def _add_grid_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("grid campaigns (--kind grid; default: the collector's)")
    group.add_argument("--variant", choices=tuple(_VARIANTS),
                       help="uniform (UGC, no feedback), tree (TreeAdaptive, default) or iterative (IterAdaptive)")
    group.add_argument("--granularity", choices=tuple(_GRANULARITIES),
                       help="cell side rule: paper (Theorem 1 as printed) or consistent (default)")
    group.add_argument("--granularity-level", metavar="LEVEL", type=_uint32,
                       help="fix the grid's dyadic level (2^LEVEL cells per dimension) instead of the rule")
    group.add_argument("--tree-height", type=_uint32,
                       help="deepest tree level the refinement may reach (tree and iterative variants)")
    group.add_argument("--max-iterations", type=_uint32,
                       help="most merge/split rounds (iterative variant; default 3)")


def build_parser() -> argparse.ArgumentParser:
    """The ``ldp-collector`` argument parser."""
    parser = _Parser(
        prog=_PROG, description="LDP collector: serve, manage campaigns, simulate devices, demo.",
        epilog="Exit codes: 0 ok, 1 runtime error, 2 usage error.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser("serve", help="serve the gRPC API until SIGTERM/SIGINT",
                                description="Serve the gRPC API. Settings: --config TOML file, LDP_* environment "
                                            "variables (LDP_OPERATOR_TOKEN ...), then these flags.")
    serve.add_argument("--listen", metavar="HOST:PORT", type=_host_port, help="address to bind (default 127.0.0.1:50051)")
    serve.add_argument("--data-dir", metavar="DIR|URL",
                       help="the store: an SQLite data directory (default ./ldp-data) or a postgresql:// URL "
                            "(pip install 'ldp-collector[postgres]'; several collectors may share one database)")
    serve.add_argument("--config", metavar="FILE", help="TOML configuration file (default ./ldp-collector.toml if present)")
    serve.add_argument("--metrics-port", metavar="PORT", type=_non_negative_int,
                       help="Prometheus /metrics port (0 = off)")
    serve.add_argument("--log-format", choices=("auto", "json", "text"))
    serve.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
    serve.add_argument("--workers", metavar="N", type=_positive_int,
                       help="server processes sharing the port with SO_REUSEPORT (default 1; $LDP_WORKERS); "
                            "worker i serves metrics on --metrics-port + i")
    serve.set_defaults(handler=_cmd_serve)

    campaign = commands.add_parser("campaign", help="create, list, show or close campaigns on a running collector")
    campaign_commands = campaign.add_subparsers(dest="campaign_command", metavar="ACTION", required=True)

    create = campaign_commands.add_parser("create", help="create a campaign",
                                          description="Create a campaign. Negative bounds need the = form: "
                                                      "--dims=-10:10,-5:5.")
    _add_remote(create)
    create.add_argument("--kind", choices=KINDS, default="histogram", help="campaign kind (default histogram)")
    domain = create.add_mutually_exclusive_group(required=True)
    domain.add_argument("--categories", metavar="N", type=_uint64, help="categorical domain {0, ..., N-1}")
    domain.add_argument("--dims", metavar="LO:HI,...", type=_dims, help="numeric domain bounds per dimension")
    create.add_argument("--epsilon", type=_positive_float, required=True, help="per-device budget")
    create.add_argument("--cells", metavar="M[,M2...]", type=_cells,
                        help="grid cells per dimension (histogram; grid: of the calibration round)")
    create.add_argument("--oracle", choices=tuple(_ORACLES), help="frequency oracle (histogram; default auto)")
    create.add_argument("--max-payload-bits", type=_uint32, help="bit cap per report (histogram)")
    create.add_argument("--consistency", action="store_true", default=None,
                        help="non-negative estimates summing to n (histogram)")
    create.add_argument("--windows", type=_uint32,
                        help="successive rounds compared for anomaly flags (histogram; default 1)")
    create.add_argument("--anomaly-alpha", type=_positive_float,
                        help="family-wise false-flag rate of the anomaly flags, in (0, 1) (histogram; default 0.01)")
    create.add_argument("--k", type=_uint32, help="number of clusters (clustering kinds)")
    create.add_argument("--value-bits", type=_uint32, help="values are in [0, 2^bits) (heavy_hitters)")
    create.add_argument("--bits-per-level", type=_uint32, help="prefix bits per level (heavy_hitters)")
    create.add_argument("--false-positive-rate", type=_positive_float, help="family-wise rate (heavy_hitters)")
    create.add_argument("--max-candidates", type=_uint32, help="prefixes kept per level (heavy_hitters)")
    _add_grid_options(create)
    create.add_argument("--budget-policy", choices=tuple(_POLICIES), help="default partition")
    create.add_argument("--min-reports", type=_uint64, help="reports a round needs before it can close")
    create.add_argument("--close-after", type=_uint64, help="close a round automatically at this many reports")
    create.add_argument("--round-duration", metavar="SECONDS", type=_seconds_up_to(_MAX_DURATION_S),
                        help="close a round automatically after this long")
    create.add_argument("--id", help="campaign id (default: assigned by the collector)")
    create.add_argument("--description")
    create.add_argument("--label", metavar="KEY=VALUE", type=_label, action="append", help="repeatable")
    create.add_argument("--json", action="store_true", help="print the campaign as JSON")
    create.set_defaults(handler=_cmd_campaign_create)

    listing = campaign_commands.add_parser("list", help="list campaigns")
    _add_remote(listing)
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=_cmd_campaign_list)

    show = campaign_commands.add_parser("show", help="show a campaign and its result")
    _add_remote(show)
    show.add_argument("campaign_id", metavar="CAMPAIGN_ID")
    show.add_argument("--top", type=_positive_int, default=10, help="estimates to list (default 10)")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=_cmd_campaign_show)

    close = campaign_commands.add_parser("close", help="close a round and run the server step")
    _add_remote(close)
    close.add_argument("campaign_id", metavar="CAMPAIGN_ID")
    close.add_argument("--round", type=_uint32, help="the open round (default: the current one)")
    close.add_argument("--json", action="store_true")
    close.set_defaults(handler=_cmd_campaign_close)

    simulate = commands.add_parser(
        "simulate", help="play a campaign with simulated SDK devices",
        description="Simulate devices with the SDK (seeded: not privacy-preserving) against an in-process "
                    "collector with a temporary SQLite directory, or --collector.")
    simulate.add_argument("--kind", choices=KINDS, required=True)
    source = simulate.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset", choices=sorted(DATASETS), help="generated dataset")
    source.add_argument("--data", metavar="FILE", help="CSV or .npy file of points")
    simulate.add_argument("--label-column", metavar="INDEX|last", type=_label_column, help="label column of --data")
    simulate.add_argument("--n", type=_positive_int, help="devices (default 20000, or every point of --data)")
    simulate.add_argument("--d", type=_positive_int, help="dimension (blobs, mixture)")
    simulate.add_argument("--k", type=_uint32, help="clusters (blobs, mixture; clustering kinds)")
    simulate.add_argument("--epsilon", type=_positive_float, default=2.0, help="per-device budget (default 2)")
    simulate.add_argument("--cells", metavar="M[,M2...]", type=_cells,
                          help="grid cells per dimension (histogram: 16 in 2-D, else the collector's default; "
                               "grid: of the calibration round)")
    simulate.add_argument("--oracle", choices=tuple(_ORACLES), help="frequency oracle (histogram)")
    simulate.add_argument("--budget-policy", choices=tuple(_POLICIES), help="default partition")
    simulate.add_argument("--plot", metavar="FILE",
                          help="write a PNG: a histogram's estimates or a grid clustering over the points "
                               "(needs the [plot] extra)")
    _add_grid_options(simulate)
    simulate.add_argument("--seed", type=_non_negative_int, default=0)
    _add_remote(simulate, required=False)
    simulate.add_argument("--mode", choices=("auto", "device", "direct"), default="auto",
                          help="one SDK Device per simulated device, or the same steps without them (default auto)")
    simulate.add_argument("--batch-size", type=_positive_int, default=1000, help="reports per batch (default 1000)")
    simulate.add_argument("--json", action="store_true", help="print one JSON object")
    simulate.add_argument("--quiet", action="store_true", help="no progress bar")
    simulate.set_defaults(handler=_cmd_simulate)

    demo = commands.add_parser("demo", help="embedded end-to-end demo over real gRPC, writes a PNG")
    demo.add_argument("--n", type=_positive_int, default=200_000, help="devices (default 200000)")
    demo.add_argument("--dataset", choices=sorted(DATASETS), default="moons")
    demo.add_argument("--cells", type=_uint32, default=16, help="grid cells per dimension (default 16)")
    demo.add_argument("--epsilon", type=_positive_float, default=2.0)
    demo.add_argument("--seed", type=_non_negative_int, default=0)
    demo.add_argument("--out", metavar="FILE", default="ldp-demo.png", help="PNG heat map (default ./ldp-demo.png)")
    demo.add_argument("--no-plot", action="store_true", help="skip the PNG")
    demo.add_argument("--submit", choices=("packed", "reports"), default="packed",
                      help="SubmitPacked (msgpack) or SubmitReports (protobuf)")
    demo.add_argument("--json", action="store_true", help="print one JSON summary")
    demo.add_argument("--quiet", action="store_true", help="no progress bar")
    demo.set_defaults(handler=_cmd_demo)

    plot = commands.add_parser("plot", help="PNG of a histogram campaign's estimates or a grid campaign's clusters")
    _add_remote(plot)
    plot.add_argument("campaign_id", metavar="CAMPAIGN_ID")
    plot.add_argument("--round", type=_uint32,
                      help="round (histogram; default: the latest with estimates)")
    plot.add_argument("--out", metavar="FILE", help="default CAMPAIGN_ID.png")
    plot.set_defaults(handler=_cmd_plot)
    return parser


def _one_line(error: BaseException | str) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 runtime error, 2 usage error, 130 interrupted)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except UsageError as exc:
        command = [_PROG, args.command, getattr(args, "campaign_command", None)]
        sys.stderr.write(_usage_error(" ".join(c for c in command if c), str(exc)))
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{_PROG}: interrupted\n")
        return 130
    except _RUNTIME_ERRORS as exc:
        sys.stderr.write(f"{_PROG}: error: {_one_line(exc)}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
