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
``export CAMPAIGN ROUND --out DIR``
    A closed round's raw reports as Parquet files with a manifest (:mod:`ldp_collector.columnar`;
    the ``export`` extra), read from the store (``--data-dir``, ``$LDP_DATA_DIR``); resumable and
    idempotent.
``close-round CAMPAIGN [--engine beam] [--runner R] [-- PIPELINE OPTIONS]``
    Close the open round on the store and run its server step here: in-process, or with
    ``--engine beam`` the round is exported (``--export-dir``) and its accumulators computed by an
    Apache Beam pipeline (:mod:`ldp_collector.beam`) on ``--runner`` (default the DirectRunner), with
    the options after ``--`` passed to Beam as they are.
``demo``
    Embedded end-to-end run over real gRPC (:mod:`ldp_collector.demo`): a histogram and a grid
    clustering, writes ``ldp-demo.png`` and ``ldp-demo-clusters.png``.
``plot``
    PNG of a histogram campaign's estimates, or of a grid campaign's published clustering (needs
    the ``[plot]`` extra).

Each campaign kind declares its own flags in its module (grid campaigns: ``--variant``,
``--granularity`` ..., clustering kinds: ``--k``, histograms: ``--oracle`` ...); ``campaign create``
and ``simulate`` offer them from the kind registry (:mod:`ldp_collector.cli_args`), and ``simulate``
takes the rest of what differs between kinds from their declarations too
(:mod:`ldp_collector.cli_simulate`). Unset, the collector's defaults apply.

Exit codes: 0 success, 2 usage error, 1 runtime error, 130 interrupted. Errors are one line on
stderr, never a traceback: usage errors name the flag and point at ``--help``; runtime errors cover
SDK, collector, configuration, gRPC, store and file errors.

The result commands (``simulate``, ``campaign show``) report the result's status, decided in one
place (:func:`ldp_collector.cli_output.result_status`): ``ok``; ``degraded``, a result the engine
explains with warnings (best-effort centers where the clusters were not detectable, fewer centers
than k, ...), exit 0; ``pending``, a campaign not finished yet, exit 0; ``failed``, nothing
published (a failed campaign or run, or a result without centers, cell map, estimates or heavy
hitters), exit 1 with the reason on stderr. With ``--json`` their JSON always comes, with the
top-level ``status`` and ``reason`` (empty when ``ok``), also when there is no result at all.

The simulator's randomness is seeded and therefore not privacy-preserving; it exists to measure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ldp.v1 import campaigns_pb2
from ldp_client.errors import LdpError

from . import __version__
from .cli_args import (
    POLICIES,
    UsageError,
    add_kind_options,
    build_campaign_config,
    dims,
    host_port,
    key_value,
    kind_values,
    non_negative_int,
    nonempty,
    oracle_list,
    positive_float,
    positive_int,
    seconds_up_to,
    seed_uint64,
    uint32,
    uint64,
)
from .cli_output import (
    ResultFailedError,
    cell_map_of,
    clustering_text,
    kind_name,
    print_campaign,
    print_estimates,
    print_json,
    result_status,
    state_name,
    timestamp_text,
    to_dict,
)
from .cli_simulate import add_simulate_parser
from .config import ConfigError, load_config
from .demo import DEFAULT_VARIANT as DEMO_VARIANT
from .demo import VARIANTS as DEMO_VARIANTS
from .errors import CollectorError, FailedPreconditionError
from .model import Result
from .operator import KINDS, CampaignStateError, OperatorClient
from .plotting import MatplotlibMissingError
from .serde import config_from_proto, estimates_from_proto, result_from_proto, result_to_proto
from .simulation.datasets import DATASETS
from .simulation.runner import SimulationError
from .storage.base import ReportStore

__all__ = ["DEFAULT_COLLECTOR", "UsageError", "build_campaign_config", "build_parser", "main"]

#: ``--collector`` when neither the flag nor ``$LDP_COLLECTOR`` is given.
DEFAULT_COLLECTOR = "127.0.0.1:50051"
_PROG = "ldp-collector"
_RUNTIME_ERRORS = (LdpError, CollectorError, ConfigError, CampaignStateError, SimulationError, MatplotlibMissingError,
                   OSError)
#: ``google.protobuf.Duration``'s range (10 000 years), the bound of ``--round-duration``.
_MAX_DURATION_S = 315_576_000_000.0
#: Largest ``--timeout``: a gRPC deadline too far away (beyond about 1e10 s) overflows into an
#: immediate DEADLINE_EXCEEDED; a day is more than any call needs.
_MAX_TIMEOUT_S = 86_400.0


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line pointing at ``--help``, not the usage text (many lines for a
    command with many flags) above the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, _usage_error(self.prog, message))


def _usage_error(prog: str, message: str) -> str:
    return f"{prog}: error: {_one_line(message)} (see {prog} --help)\n"


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
        args.kind, epsilon=args.epsilon, categories=args.categories, bounds=args.dims,
        budget_policy=args.budget_policy, min_reports=args.min_reports, close_after=args.close_after,
        round_duration_s=args.round_duration, campaign_id=args.id or "", description=args.description or "",
        labels=args.label or (), seed=args.seed, oracles=args.oracles or (), **kind_values(args))
    with _operator(args) as operator:
        campaign = operator.create_campaign(config)
    if args.json:
        print_json(to_dict(campaign), sys.stdout)
    else:
        print_campaign(campaign, sys.stdout)
    return 0


def _cmd_campaign_list(args: argparse.Namespace) -> int:
    with _operator(args) as operator:
        campaigns = operator.list_campaigns()
    if args.json:
        print_json([to_dict(c) for c in campaigns], sys.stdout)
        return 0
    if not campaigns:
        sys.stdout.write("no campaigns\n")
        return 0
    sys.stdout.write(f"{'ID':<28} {'KIND':<14} {'STATE':<11} {'ROUND':>5} {'REPORTS':>10} {'EPSILON':>8}  CREATED\n")
    for c in campaigns:
        current = c.rounds[-1] if c.rounds else None
        sys.stdout.write(
            f"{c.config.campaign_id:<28} {kind_name(c.config.kind):<14} {state_name(c.state):<11} "
            f"{current.round if current else 0:>5} {current.reports if current else 0:>10,} "
            f"{c.config.epsilon:>8g}  {timestamp_text(c.created_at)}\n")
    return 0


def _cmd_campaign_show(args: argparse.Namespace) -> int:
    with _operator(args) as operator:
        campaign = operator.get_campaign(args.campaign_id)
        result = result_from_proto(operator.get_result(args.campaign_id))
    status = result_status(result, error=campaign.error if campaign.state == campaigns_pb2.FAILED else "")
    if args.json:
        print_json({**status.to_dict(), "campaign": to_dict(campaign), "result": to_dict(result_to_proto(result))},
                   sys.stdout)
    else:
        _print_shown(campaign, result, args.top)
        sys.stdout.write(f"  status       {status.status}\n")
    if status.failed:
        raise ResultFailedError(f"campaign {args.campaign_id} published nothing: {status.reason}")
    return 0


def _print_shown(campaign: campaigns_pb2.Campaign, result: Result, top: int) -> None:
    """``campaign show``'s text: the campaign, then what its result holds and the engine's explanation."""
    print_campaign(campaign, sys.stdout)
    if result.estimates is not None and result.estimates.estimates:
        print_estimates(result.estimates, top, sys.stdout)
    for hh in result.heavy_hitters[:top]:
        sys.stdout.write(f"  heavy hitter {hh.value}: {hh.count:.1f} +- {hh.std_error:.1f}\n")
    if result.clustering is not None:
        sys.stdout.write(f"  clustering   {clustering_text(result.clustering)}\n")
        clustering = result.clustering
        if clustering.centers and clustering.dimension:
            rows = [clustering.centers[i:i + clustering.dimension]
                    for i in range(0, len(clustering.centers), clustering.dimension)]
            for i, (row, weight) in enumerate(zip(rows[:top], clustering.weights, strict=False)):
                sys.stdout.write(f"  center {i}     weight {weight:.3f}  ({', '.join(f'{v:.6g}' for v in row)})\n")
            if len(rows) > top:
                sys.stdout.write(f"  ... {len(rows) - top} more centers (--top, or --json for all)\n")
    for key, value in sorted(result.diagnostics.items()):
        sys.stdout.write(f"  {key} = {value:g}\n")
    if campaign.state != campaigns_pb2.FAILED:
        for warning in result.warnings:
            sys.stdout.write(f"  warning: {warning}\n")


def _cmd_campaign_close(args: argparse.Namespace) -> int:
    with _operator(args) as operator:
        round_ = args.round
        if round_ is None:
            campaign = operator.get_campaign(args.campaign_id)
            if campaign.state != campaigns_pb2.COLLECTING or not campaign.HasField("current_round"):
                raise CampaignStateError(f"campaign {args.campaign_id} is {state_name(campaign.state)}; "
                                         "it has no open round to close")
            round_ = campaign.current_round.round
        campaign = operator.close_round(args.campaign_id, round_)
    if args.json:
        print_json(to_dict(campaign), sys.stdout)
    else:
        sys.stdout.write(f"closed round {round_}\n")
        print_campaign(campaign, sys.stdout)
    _raise_if_failed(campaign, round_)
    return 0


def _raise_if_failed(campaign: campaigns_pb2.Campaign, round_: int) -> None:
    """A close whose server step failed the campaign exits 1 (``failed``), its error on stderr."""
    if campaign.state == campaigns_pb2.FAILED:
        raise ResultFailedError(f"campaign {campaign.config.campaign_id} failed closing round {round_}: {campaign.error}")


def _open_data_store(args: argparse.Namespace) -> ReportStore:
    """The store of ``--data-dir`` (or ``$LDP_DATA_DIR``, the configuration's) for the batch commands."""
    from .storage import open_store

    return open_store(load_config(args.config, overrides={"data_dir": args.data_dir}).data_dir, create=False)


def _cmd_export(args: argparse.Namespace) -> int:
    try:
        from .columnar import export_round
    except ImportError as exc:
        raise FailedPreconditionError(str(exc)) from None
    store = _open_data_store(args)
    try:
        manifest = export_round(store, args.campaign_id, args.round, args.out, buckets=args.buckets,
                                max_rows_per_file=args.max_rows_per_file)
    finally:
        store.close()
    summary = {"campaign_id": manifest.campaign_id, "round": manifest.round, "reports": manifest.reports,
               "files": len(manifest.files), "content_sha256": manifest.content_sha256, "out": str(args.out)}
    if args.json:
        print_json(summary, sys.stdout)
    else:
        sys.stdout.write(f"exported {manifest.reports} reports of round {manifest.round} of {manifest.campaign_id} "
                         f"to {args.out} ({len(manifest.files)} files, sha256 {manifest.content_sha256})\n")
    return 0


def _cmd_close_round(args: argparse.Namespace) -> int:
    from .core import Collector
    from .serde import campaign_to_proto

    if args.engine != "beam" and (args.pipeline_options or args.runner or args.export_dir):
        raise UsageError("--runner, --export-dir and pipeline options after -- need --engine beam")
    store = _open_data_store(args)
    try:
        collector = Collector(store)
        round_ = args.round
        if round_ is None:
            round_ = store.get_campaign(args.campaign_id).current_round
        if args.engine == "beam":
            try:
                from .beam import close_round_on_beam, pipeline_args
            except ImportError as exc:
                raise FailedPreconditionError(str(exc)) from None
            export_dir = args.export_dir or f"{args.campaign_id}-round-{round_}"
            campaign = close_round_on_beam(collector, args.campaign_id, round_, export_dir,
                                           pipeline_args(args.runner, args.pipeline_options))
        else:
            campaign = collector.close_round(args.campaign_id, round_)
    finally:
        store.close()
    message = campaign_to_proto(campaign)
    if args.json:
        print_json(to_dict(message), sys.stdout)
    else:
        sys.stdout.write(f"closed round {round_} ({args.engine})\n")
        print_campaign(message, sys.stdout)
    _raise_if_failed(message, round_)
    return 0


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", metavar="DIR|URL",
                        help="the store: an SQLite data directory (default ./ldp-data, $LDP_DATA_DIR) or a "
                             "postgresql:// URL")
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file (default ./ldp-collector.toml)")


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
                raise CampaignStateError(f"campaign {args.campaign_id} is {state_name(campaign.state)}; a grid "
                                         "campaign's clustering is published when it finishes")
            result = result_from_proto(operator.get_result(args.campaign_id))
            path = plot_grid_clustering(cell_map_of(result), out,
                                        title=f"campaign {args.campaign_id}: {clustering_text(result.clustering)}")
        else:
            estimates = estimates_from_proto(operator.get_estimates(args.campaign_id, args.round or 0))
            path = plot_estimates(estimates, config_from_proto(campaign.config), out)
    sys.stdout.write(f"wrote {path}\n")
    return 0



def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import print_summary, run_demo

    summary = run_demo(n=args.n, dataset=args.dataset, cells=args.cells, epsilon=args.epsilon, seed=args.seed,
                       out=None if args.no_plot else args.out, quiet=args.quiet or args.json,
                       packed=args.submit == "packed", variant=args.variant)
    if args.json:
        print_json(summary.to_dict(), sys.stdout)
    else:
        print_summary(summary, sys.stdout)
    return 0


# -- parser ----------------------------------------------------------------------------------------

def _add_remote(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    default = os.environ.get("LDP_COLLECTOR") or DEFAULT_COLLECTOR
    help_text = (f"collector address (default $LDP_COLLECTOR or {DEFAULT_COLLECTOR}); the operator token comes "
                 "from $LDP_OPERATOR_TOKEN") if required else (
        "run against this collector instead of an in-process one (operator token from $LDP_OPERATOR_TOKEN)")
    parser.add_argument("--collector", metavar="HOST:PORT", type=host_port, default=default if required else None,
                        help=help_text)
    if required:
        parser.add_argument("--timeout", type=seconds_up_to(_MAX_TIMEOUT_S), default=30.0,
                            help=f"seconds per call (default 30, at most {_MAX_TIMEOUT_S:g})")


def build_parser() -> argparse.ArgumentParser:
    """The ``ldp-collector`` argument parser."""
    parser = _Parser(
        prog=_PROG, description="LDP collector: serve, manage campaigns, simulate devices, demo.",
        epilog="Exit codes: 0 ok (a result with status ok, degraded or pending), 1 runtime error or a result with "
               "status failed, 2 usage error, 130 interrupted.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser("serve", help="serve the gRPC API until SIGTERM/SIGINT",
                                description="Serve the gRPC API. Settings: --config TOML file, LDP_* environment "
                                            "variables (LDP_OPERATOR_TOKEN ...), then these flags.")
    serve.add_argument("--listen", metavar="HOST:PORT", type=host_port, help="address to bind (default 127.0.0.1:50051)")
    serve.add_argument("--data-dir", metavar="DIR|URL",
                       help="the store: an SQLite data directory (default ./ldp-data) or a postgresql:// URL "
                            "(pip install 'ldp-collector[postgres]'; several collectors may share one database)")
    serve.add_argument("--config", metavar="FILE", help="TOML configuration file (default ./ldp-collector.toml if present)")
    serve.add_argument("--metrics-port", metavar="PORT", type=non_negative_int,
                       help="Prometheus /metrics port (0 = off)")
    serve.add_argument("--log-format", choices=("auto", "json", "text"))
    serve.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
    serve.add_argument("--workers", metavar="N", type=positive_int,
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
    domain.add_argument("--categories", metavar="N", type=uint64, help="categorical domain {0, ..., N-1}")
    domain.add_argument("--dims", metavar="LO:HI,...", type=dims, help="numeric domain bounds per dimension")
    create.add_argument("--epsilon", type=positive_float, required=True, help="per-device budget")
    add_kind_options(create)
    create.add_argument("--budget-policy", choices=tuple(POLICIES), help="default partition")
    create.add_argument("--min-reports", type=uint64, help="reports a round needs before it can close")
    create.add_argument("--close-after", type=uint64, help="close a round automatically at this many reports")
    create.add_argument("--round-duration", metavar="SECONDS", type=seconds_up_to(_MAX_DURATION_S),
                        help="close a round automatically after this long")
    create.add_argument("--id", type=nonempty, help="campaign id (default: assigned by the collector)")
    create.add_argument("--seed", type=seed_uint64,
                        help="campaign seed: the engine's public randomness, so that a run can be repeated "
                             "(default: drawn by the collector; public, not a privacy parameter)")
    create.add_argument("--oracles", metavar="NAME,...", type=oracle_list,
                        help="the only frequency oracles the collector may choose for any round, among "
                             "grr,sue,oue,olh (default: any); e.g. grr,oue for devices without local hashing: it can "
                             "cost much accuracy where a round would have chosen olh (docs/protocol.md §10.4)")
    create.add_argument("--description")
    create.add_argument("--label", metavar="KEY=VALUE", type=key_value, action="append", help="repeatable")
    create.add_argument("--json", action="store_true", help="print the campaign as JSON")
    create.set_defaults(handler=_cmd_campaign_create)

    listing = campaign_commands.add_parser("list", help="list campaigns")
    _add_remote(listing)
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=_cmd_campaign_list)

    show = campaign_commands.add_parser("show", help="show a campaign and its result")
    _add_remote(show)
    show.add_argument("campaign_id", metavar="CAMPAIGN_ID")
    show.add_argument("--top", type=positive_int, default=10, help="estimates, heavy hitters or centers to list (default 10)")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=_cmd_campaign_show, status_json=True)

    close = campaign_commands.add_parser("close", help="close a round and run the server step")
    _add_remote(close)
    close.add_argument("campaign_id", metavar="CAMPAIGN_ID")
    close.add_argument("--round", type=uint32, help="the open round (default: the current one)")
    close.add_argument("--json", action="store_true")
    close.set_defaults(handler=_cmd_campaign_close)

    add_simulate_parser(commands, _add_remote)

    export = commands.add_parser("export", help="a closed round's reports as Parquet files with a manifest",
                                 description="Write a closed round's raw reports as Parquet files (by group and "
                                             "hash bucket) with manifest.json; a re-run finishes an interrupted "
                                             "export and changes nothing in a finished one. Needs "
                                             "'ldp-collector[export]'.")
    export.add_argument("campaign_id", metavar="CAMPAIGN_ID")
    export.add_argument("round", metavar="ROUND", type=uint32)
    export.add_argument("--out", metavar="DIR", required=True, help="the export's directory")
    export.add_argument("--buckets", type=positive_int, default=8, help="hash buckets per group (default 8)")
    export.add_argument("--max-rows-per-file", type=positive_int, default=1_000_000,
                        help="rows per Parquet file at most (default 1000000)")
    _add_data_dir(export)
    export.add_argument("--json", action="store_true")
    export.set_defaults(handler=_cmd_export)

    close_round = commands.add_parser(
        "close-round", help="close a round on the store and run its server step here (in-process or on Beam)",
        description="Close the open round and run the server step in this process, on the store. --engine beam "
                    "exports the round and computes its accumulators with Apache Beam; the options after -- go "
                    "to the Beam pipeline (--direct_num_workers=2, --project=..., --flink_master=...).")
    close_round.add_argument("campaign_id", metavar="CAMPAIGN_ID")
    close_round.add_argument("--round", type=uint32, help="the open round (default: the current one)")
    close_round.add_argument("--engine", choices=("inprocess", "beam"), default="inprocess",
                             help="where the accumulators are computed (default inprocess)")
    close_round.add_argument("--runner", help="Beam runner (default DirectRunner; DataflowRunner, FlinkRunner, "
                                              "SparkRunner ...)")
    close_round.add_argument("--export-dir", metavar="DIR",
                             help="where the round is exported for Beam (default ./CAMPAIGN_ID-round-N); "
                                  "a cluster's workers must be able to read it")
    _add_data_dir(close_round)
    close_round.add_argument("--json", action="store_true")
    close_round.set_defaults(handler=_cmd_close_round, pipeline_options=[])

    demo = commands.add_parser("demo", help="embedded end-to-end demo over real gRPC, writes a PNG")
    demo.add_argument("--n", type=positive_int, default=200_000, help="devices (default 200000)")
    demo.add_argument("--dataset", choices=sorted(DATASETS), default="moons")
    demo.add_argument("--cells", type=uint32, default=16, help="grid cells per dimension (default 16)")
    demo.add_argument("--epsilon", type=positive_float, default=2.0)
    demo.add_argument("--seed", type=non_negative_int, default=0)
    demo.add_argument("--out", metavar="FILE", default="ldp-demo.png",
                      help="PNG heat map (default ./ldp-demo.png); the clustering's PNG is FILE's name + '-clusters'")
    demo.add_argument("--variant", choices=DEMO_VARIANTS, default=DEMO_VARIANT,
                      help=f"grid clustering variant (default {DEMO_VARIANT})")
    demo.add_argument("--no-plot", action="store_true", help="skip the PNGs")
    demo.add_argument("--submit", choices=("packed", "reports"), default="packed",
                      help="SubmitPacked (msgpack) or SubmitReports (protobuf)")
    demo.add_argument("--json", action="store_true", help="print one JSON summary")
    demo.add_argument("--quiet", action="store_true", help="no progress bar")
    demo.set_defaults(handler=_cmd_demo)

    plot = commands.add_parser("plot", help="PNG of a histogram campaign's estimates or a grid campaign's clusters")
    _add_remote(plot)
    plot.add_argument("campaign_id", metavar="CAMPAIGN_ID")
    plot.add_argument("--round", type=uint32,
                      help="round (histogram; default: the latest with estimates)")
    plot.add_argument("--out", metavar="FILE", help="default CAMPAIGN_ID.png")
    plot.set_defaults(handler=_cmd_plot)
    return parser


def _one_line(error: BaseException | str) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 runtime error or failed result, 2 usage error, 130 interrupted,
    141 output pipe closed by its reader, as after SIGPIPE)."""
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    # Beam's pipeline options follow "--" and go to Beam untouched (argparse would mix them with
    # the positionals).
    passed = words[words.index("--") + 1:] if "--" in words else []
    args = parser.parse_args(words[:words.index("--")] if "--" in words else words)
    if passed:
        if args.command != "close-round":
            parser.error("only close-round takes options after --")
        args.pipeline_options = passed
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
    except BrokenPipeError:
        # The reader stopped early (``| head``): nothing to report. Point stdout at /dev/null so that the
        # interpreter's last flush does not fail again (the recipe of Python's signal documentation).
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except _RUNTIME_ERRORS as exc:
        if getattr(args, "status_json", False) and args.json and not isinstance(exc, ResultFailedError):
            # A result command's --json always answers with its status, even when there is no result.
            print_json(result_status(None, error=_one_line(exc)).to_dict(), sys.stdout)
        sys.stderr.write(f"{_PROG}: error: {_one_line(exc)}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
