"""``ldp-collector simulate``: a campaign played by simulated SDK devices, scored against the dataset.

What differs between kinds is declared by the kind (:class:`~ldp_collector.kinds.base.KindCli`):
its flags, the cells per dimension when ``--cells`` is not given, the final parameters it reports,
whether ``--plot`` draws it, and how its result is scored (by
:func:`ldp_collector.simulation.evaluation.evaluate_run`). A kind whose domain is categorical only
(heavy hitters) gets each point's grid cell index as its device's value; the kinds with a ``--k``
flag take the dataset's number of labels when ``--k`` is not given.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from numpy.typing import NDArray

from ldp_client.encoders.base import NumericDomain
from ldp_client.encoders.grid import UniformGridEncoder
from ldp_client.errors import InvalidParameterError

from .cli_args import (
    POLICIES,
    UsageError,
    add_kind_options,
    build_campaign_config,
    cell_counts,
    kind_values,
    label_column,
    oracle_list,
    positive_float,
    positive_int,
    seed_uint64,
    uint32,
)
from .cli_output import (
    ResultFailedError,
    cell_map_of,
    clustering_text,
    estimates_of,
    finite,
    number_text,
    print_json,
    result_status,
)
from .kinds import KINDS, Kind
from .kinds.base import NUMERIC
from .model import CampaignConfig
from .serde import config_from_proto
from .simulation.datasets import DATASETS, label_column_hint, load_file, make_dataset
from .simulation.evaluation import CLUSTERING_KINDS, evaluate_run
from .simulation.population import AUTO_DEVICE_LIMIT, numeric_bounds
from .simulation.runner import CampaignRun, RemoteCollector, run_campaign
from .simulation.sizing import minimum_devices

__all__ = ["add_simulate_parser"]

#: Flags ``simulate`` declares itself: ``--k`` also sets a generated dataset's clusters, and
#: ``--cells`` also makes the values of a categorical kind.
_OWN_FLAGS = frozenset({"--k", "--cells"})
#: Kinds whose simulation ``--plot`` draws.
_PLOTTED_KINDS = tuple(sorted(name for name, kind in KINDS.items() if kind.cli.plotted))
#: Output parameters every simulation has; the others are the kind's report.
_COMMON_PARAMETERS = frozenset({"kind", "dataset", "data", "file_points", "resampled", "n", "d", "epsilon", "seed",
                                "collector", "mode", "lower", "upper"})


def add_simulate_parser(commands: Any, add_remote: Any) -> None:
    """The ``simulate`` command's parser, among ``commands`` (``add_remote`` adds ``--collector``)."""
    simulate = commands.add_parser(
        "simulate", help="play a campaign with simulated SDK devices",
        description="Simulate devices with the SDK (seeded: not privacy-preserving) against an in-process "
                    "collector with a temporary SQLite directory, or --collector.")
    simulate.add_argument("--kind", choices=tuple(KINDS), required=True)
    source = simulate.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset", choices=sorted(DATASETS), help="generated dataset")
    source.add_argument("--data", metavar="FILE", help="CSV or .npy file of points")
    simulate.add_argument("--label-column", metavar="INDEX|last", type=label_column,
                          help="label column of --data (counted from 0; a missing label is an error)")
    simulate.add_argument("--header", action=argparse.BooleanOptionalAction,
                          help="the first row of a --data CSV is (or is not) a header (default: it is exactly when "
                               "every cell of it is a name)")
    simulate.add_argument("--n", type=positive_int, help="devices (default 20000, or every point of --data)")
    simulate.add_argument("--d", type=positive_int, help="dimension (blobs, mixture)")
    simulate.add_argument("--k", type=uint32, help="clusters (datasets that take k; clustering kinds)")
    simulate.add_argument("--epsilon", type=positive_float, default=2.0, help="per-device budget (default 2)")
    simulate.add_argument("--cells", metavar="M[,M2...]", type=cell_counts,
                          help="grid cells per dimension (histogram: 16 in 2-D, else the collector's default; "
                               "grid: of the calibration round; heavy_hitters: the values' grid)")
    simulate.add_argument("--budget-policy", choices=tuple(POLICIES), help="default partition")
    simulate.add_argument("--plot", metavar="FILE",
                          help="write a PNG: a histogram's estimates or a grid clustering over the points "
                               "(needs the [plot] extra)")
    simulate.add_argument("--seed", type=seed_uint64, default=0,
                          help="seeds the data, the devices and the campaign seed (the engine's public "
                               "randomness): the same command gives the same result (default 0)")
    simulate.add_argument("--oracles", metavar="NAME,...", type=oracle_list,
                          help="the only frequency oracles the collector may choose, among grr,sue,oue,olh "
                               "(default: any)")
    add_remote(simulate, required=False)
    simulate.add_argument("--mode", choices=("auto", "device", "direct", "vector"), default="auto",
                          help="device: one SDK Device per simulated device; direct: the same steps without them; "
                               "vector: the same decisions, each round's reports drawn with numpy in bulk (cell "
                               "encoders with GRR, unary or local hashing; other rounds run direct, with a warning); "
                               f"auto (default): device up to {AUTO_DEVICE_LIMIT} devices, vector above")
    simulate.add_argument("--batch-size", type=positive_int, default=1000, help="reports per batch (default 1000)")
    simulate.add_argument("--json", action="store_true", help="print one JSON object")
    simulate.add_argument("--quiet", action="store_true", help="no progress bar")
    add_kind_options(simulate, skip=_OWN_FLAGS)
    simulate.set_defaults(handler=_cmd_simulate, status_json=True)


def _load_points(args: argparse.Namespace) -> tuple[NDArray[np.float64], NDArray[np.int64] | None, dict[str, Any]]:
    """The simulation's points and labels, and what describes them in the output."""
    if args.data is not None:
        if args.d is not None:
            raise UsageError("--d applies to generated datasets (--dataset), not to --data")
        data = load_file(args.data, args.label_column, header=args.header)
        x, labels = data
        if (hint := label_column_hint(data)) is not None:
            column, why = hint
            name = f" ({data.meta['columns'][column]!r})" if "columns" in data.meta else ""
            sys.stderr.write(f"ldp-collector: hint: column {column}{name} of {args.data} looks like labels ({why}); "
                             f"--label-column {column} scores against it instead of taking it as a feature\n")
        info: dict[str, Any] = {"data": str(args.data), "file_points": int(len(x))}
        if args.n is not None and args.n != len(x):
            rng = np.random.default_rng(args.seed)
            # Fewer: a random subset; more: resampled with replacement (duplicated points, said so).
            index = rng.choice(len(x), size=args.n, replace=args.n > len(x))
            x = x[index]
            labels = labels[index] if labels is not None else None
            info["resampled"] = "with replacement" if args.n > info["file_points"] else "random subset"
            sys.stderr.write(f"ldp-collector: note: --n {args.n} draws "
                             f"{'with replacement from' if args.n > len(data[0]) else 'a random subset of'} the "
                             f"{len(data[0])} points of {args.data}\n")
        return x, labels, info
    if args.label_column is not None:
        raise UsageError("--label-column applies to --data files")
    if args.header is not None:
        raise UsageError("--header and --no-header apply to --data files")
    # --k of a clustering kind is the algorithm's; a dataset with a fixed number of clusters keeps its own.
    k = None if DATASETS[args.dataset].fixed_k else args.k
    x, labels = make_dataset(args.dataset, args.n or 20_000, d=args.d, k=k, seed=args.seed)
    return x, labels, {"dataset": args.dataset}


def _value_points(x: NDArray[np.float64], lower: tuple[float, ...], upper: tuple[float, ...],
                  cells: tuple[int, ...]) -> tuple[list[tuple[int]], int]:
    """A categorical kind over a numeric dataset: each point's grid cell index as the device's value."""
    encoder = UniformGridEncoder(domain=NumericDomain(lower=lower, upper=upper), cells_per_dimension=cells)
    return [(encoder.encode(p),) for p in x.tolist()], encoder.output_size


def _cmd_simulate(args: argparse.Namespace) -> int:
    kind = KINDS[args.kind]
    takes_k = args.dataset is not None and not DATASETS[args.dataset].fixed_k
    if kind.name not in CLUSTERING_KINDS and args.k is not None and not takes_k:
        raise UsageError(f"--k sets the clusters of a dataset that takes k "
                         f"({', '.join(name for name, ds in DATASETS.items() if not ds.fixed_k)}) or of "
                         f"clustering kinds, not {kind.name}")
    if args.plot is not None:
        if not kind.cli.plotted:
            raise UsageError(f"--plot applies to {' and '.join(_PLOTTED_KINDS)} simulations, not {kind.name}")
        from .plotting import require_matplotlib

        require_matplotlib()  # before the campaign runs, not after
    started = time.perf_counter(), time.process_time()
    x, labels, data_info = _load_points(args)
    data_s = time.perf_counter() - started[0], time.process_time() - started[1]
    lower, upper = numeric_bounds(x)
    d = x.shape[1]
    if args.plot is not None:  # before the campaign runs, not after
        from .plotting import check_plot_dimension

        try:
            check_plot_dimension("grid clustering" if kind.cli.result == "clustering" else "estimates", d)
        except InvalidParameterError as exc:
            raise UsageError(f"--plot: {exc}") from None
    cells: tuple[int, ...] | None = args.cells
    if cells is not None and len(cells) == 1:
        cells = cells * d
    if cells is None and kind.cli.default_cells is not None:
        default = kind.cli.default_cells(d)
        cells = (default,) * d if default is not None else None
    declared = {param.dest for param in kind.cli.params}
    values = kind_values(args, skip=_OWN_FLAGS)
    if "cells" in declared:
        values["cells"] = cells
    if "k" in declared:
        values["k"] = args.k or (int(labels.max()) + 1 if labels is not None else None)
        if values["k"] is None:
            raise UsageError(f"a {kind.name} simulation needs --k: the data have no labels (--label-column) to take "
                             "it from")
        if not args.k and values["k"] < 2:
            raise UsageError(f"the labels hold {values['k']} class, so k taken from them is {values['k']}; "
                             "a clustering needs --k 2 or more")
    if "expected_reports" in declared:  # the simulation knows its population: the plan uses it
        values["expected_reports"] = values.get("expected_reports") or len(x)
    points: Any = x
    domain: dict[str, Any] = {"bounds": (lower, upper)}
    if NUMERIC not in kind.domains:
        if cells is None:
            raise UsageError(f"a {kind.name} simulation needs --cells (the grid whose cells are the values)")
        points, size = _value_points(x, lower, upper, cells)
        domain = {"categories": size}
    # The flags build the wire's message (as ``campaign create`` sends it); the run takes the model.
    # The campaign seed is --seed itself, so that the engine's public randomness repeats too.
    config = config_from_proto(build_campaign_config(kind.name, epsilon=args.epsilon, budget_policy=args.budget_policy,
                                                     seed=args.seed, oracles=args.oracles or (), **domain, **values))
    minimum = minimum_devices(config)  # before any device runs: "too small" rather than an empty round
    if len(x) < minimum.devices:
        raise InvalidParameterError(
            f"n = {len(x)} is too small for a {kind.name} campaign: it needs at least {minimum.devices} devices "
            f"({minimum.reason}); give more points or --n {minimum.devices}")
    run = _run_simulation(args, config, points)
    parameters: dict[str, Any] = {
        "kind": kind.name, **data_info, "n": int(len(x)), "d": int(d), "epsilon": args.epsilon, "seed": args.seed,
        "collector": args.collector or "in-process", "mode": run.stats.mode,
        "lower": list(lower), "upper": list(upper),
    }
    parameters.update(_reported_parameters(kind, run, cells if NUMERIC not in kind.domains else None))
    status = result_status(run.result)
    output: dict[str, Any] = {
        **status.to_dict(), "campaign_id": run.campaign_id, "parameters": parameters,
        "reports_sent": run.stats.reports_sent, "epsilon_per_device": run.stats.epsilon_per_device,
        "wall_time_s": run.stats.wall_time_s, "stats": run.stats.to_dict(),
    }
    output["stats"]["phase_s"]["data"], output["stats"]["phase_cpu_s"]["data"] = data_s
    if not status.failed:  # nothing published, nothing to score or draw: the output says why
        started = time.perf_counter(), time.process_time()
        for section, scores in evaluate_run(kind, run, points, x, labels, k=args.k, seed=args.seed).items():
            output[section] = {key: finite(value) for key, value in scores.items()}
        output["stats"]["phase_s"]["evaluation"] = time.perf_counter() - started[0]
        output["stats"]["phase_cpu_s"]["evaluation"] = time.process_time() - started[1]
    output["warnings"] = list(run.result.warnings)
    output["diagnostics"] = {key: finite(value) for key, value in run.result.diagnostics.items()}
    if args.plot is not None and not status.failed:
        output["plot"] = str(_plot_simulation(args.plot, kind, run, x, parameters))
    if args.json:
        print_json(output, sys.stdout)
    else:
        _print_simulation(output, sys.stdout)
    if status.failed:
        raise ResultFailedError(f"campaign {run.campaign_id} published nothing: {status.reason}")
    return 0


def _reported_parameters(kind: Kind, run: CampaignRun, value_cells: tuple[int, ...] | None) -> dict[str, Any]:
    """The final parameters the kind reports; the values' grid of a categorical kind; a cell-map
    clustering's final cells and rounds."""
    out: dict[str, Any] = {}
    if value_cells is not None:
        out["cells"] = list(value_cells)
    if kind.cli.report is not None:
        out.update(kind.cli.report(run.campaign.config))
    if run.result.clustering is not None and run.result.clustering.cell_map is not None:
        out["final_cells"] = len(run.result.clustering.cell_map.cells)
        out["rounds"] = run.stats.rounds
    return out


def _plot_simulation(out: str, kind: Kind, run: CampaignRun, x: NDArray[np.float64],
                     parameters: dict[str, Any]) -> Path:
    """``--plot``: a histogram's estimates, or a clustering's final cells over the points."""
    from .plotting import plot_estimates, plot_grid_clustering

    source = parameters.get("dataset") or parameters.get("data")
    title = f"{parameters['kind']} on {source}, n = {parameters['n']:,}, epsilon = {parameters['epsilon']:g}"
    if kind.cli.result == "clustering":
        variant = f" ({parameters['variant']})" if "variant" in parameters else ""
        return plot_grid_clustering(cell_map_of(run.result), out, points=x, seed=parameters["seed"],
                                    title=f"{title}{variant}: {clustering_text(run.result.clustering)}")
    return plot_estimates(estimates_of(run.result), run.campaign.config, out, title=title)


def _run_simulation(args: argparse.Namespace, config: CampaignConfig, points: Any) -> CampaignRun:
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


def _parameter_text(value: Any) -> str:
    if isinstance(value, list):
        return " x ".join(str(v) for v in value)
    return f"{value:,}" if isinstance(value, int) else str(value)


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
    reported = [key for key in p if key not in _COMMON_PARAMETERS]
    if reported:
        write(f"  {p['kind']}: " + ", ".join(f"{key.replace('_', ' ')} {_parameter_text(p[key])}" for key in reported)
              + "\n")
    for section in ("errors", "clustering"):
        for key, value in output.get(section, {}).items():
            write(f"  {key:<26} {number_text(value)}\n")
    for warning in output["warnings"]:
        write(f"  warning: {warning}\n")
    write(f"  status {output['status']}\n")
    if output.get("plot"):
        write(f"wrote {output['plot']}\n")
