"""``ldp-collector demo``: the whole story on one machine, over real gRPC.

1. Start a collector on a free loopback port with a temporary data directory and a random
   operator token (:func:`ldp_collector.server.lifecycle.start_server`).
2. As the operator, create a HISTOGRAM campaign over a 2-D numeric domain cut into a grid
   (16 x 16 cells over the two moons by default).
3. Simulate the devices with the SDK (:mod:`ldp_collector.simulation`): each encodes its point into
   its grid cell, randomizes it with the campaign's frequency oracle, and the reports travel in
   batches of 1000 through ``SubmitPacked``.
4. Close the round; print the largest estimates beside the truth with their standard errors,
   the error summary, and write a PNG of the true and estimated densities side by side.

The points and the devices' randomness are seeded (simulation only: not privacy-preserving). The
grid bounds are taken from the generated data's range, a shortcut a real campaign must not take
(its bounds are public and fixed before any data is seen).
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from numpy.typing import NDArray

from ldp_client.encoders.base import NumericDomain

from .config import CollectorConfig
from .kinds.histogram import FrequencyOracle, HistogramParams
from .model import CampaignConfig, Domain
from .plotting import estimates_grid, plot_density_comparison, require_matplotlib
from .server.lifecycle import start_server
from .simulation.datasets import make_dataset
from .simulation.evaluation import evaluate_histogram, histogram_truth
from .simulation.population import numeric_bounds
from .simulation.runner import CampaignRun, RemoteCollector, run_campaign

__all__ = ["DEFAULT_DEVICES", "DemoSummary", "print_summary", "run_demo"]

DEFAULT_DEVICES = 200_000
_TOP_ROWS = 10


@dataclass(frozen=True)
class DemoSummary:
    """What :func:`run_demo` did and measured.

    Attributes
    ----------
    parameters : dict
        Dataset, devices, cells, epsilon, seed, the oracle the collector chose.
    run : CampaignRun
        The campaign, its result and the simulation statistics.
    errors : dict
        :func:`~ldp_collector.simulation.evaluation.evaluate_histogram` of the estimates.
    truth, estimate, std_errors : numpy.ndarray
        Per-cell true counts, estimates and standard errors on the grid (shape ``(m, m)``).
    lower, upper : tuple of float
        The grid's bounds.
    png : pathlib.Path or None
        The written heat map.
    """

    parameters: dict[str, Any]
    run: CampaignRun
    errors: dict[str, float]
    truth: NDArray[np.float64]
    estimate: NDArray[np.float64]
    std_errors: NDArray[np.float64]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    png: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (no per-cell arrays)."""
        return {"parameters": self.parameters, "stats": self.run.stats.to_dict(), "errors": self.errors,
                "campaign_id": self.run.campaign_id, "png": str(self.png) if self.png else None}


@contextlib.contextmanager
def _quiet_logs(level: int) -> Iterator[None]:
    """Raise the root logger's level for the duration (the embedded server logs every step)."""
    root = logging.getLogger()
    previous = root.level
    root.setLevel(max(previous, level))
    try:
        yield
    finally:
        root.setLevel(previous)


def _oracle_name(config: CampaignConfig) -> str:
    return FrequencyOracle(config.parameters.oracle).name


def run_demo(*, n: int = DEFAULT_DEVICES, dataset: str = "moons", cells: int = 16, epsilon: float = 2.0,
             seed: int = 0, out: str | Path | None = "ldp-demo.png", quiet: bool = False, packed: bool = True,
             data_dir: str | Path | None = None) -> DemoSummary:
    """Run the demo (module docstring) and return what it measured.

    Parameters
    ----------
    n : int
        Number of simulated devices.
    dataset : str
        A 2-D dataset of :data:`ldp_collector.simulation.datasets.DATASETS`.
    cells : int
        Grid cells per dimension.
    epsilon : float
        Per-device budget.
    seed : int
        Seed of the data and of the devices' (simulation) randomness.
    out : path-like or None
        Where to write the PNG; ``None`` for no plot.
    quiet : bool
        No progress bar.
    packed : bool
        ``SubmitPacked`` (msgpack batches) rather than ``SubmitReports``.
    data_dir : path-like, optional
        The collector's data directory; a temporary one (removed afterwards) by default.

    Raises
    ------
    MatplotlibMissingError
        ``out`` is set and matplotlib is missing (checked before anything runs).
    InvalidParameterError
        A bad dataset or a dataset that is not 2-D.
    """
    if out is not None:
        require_matplotlib()
    x, _ = make_dataset(dataset, n, d=2 if dataset in ("blobs", "mixture") else None, seed=seed)
    lower, upper = numeric_bounds(x)
    config = CampaignConfig(kind="histogram", epsilon=epsilon, description=f"ldp-collector demo: {dataset}, {n} devices",
                            domain=Domain(numeric=NumericDomain(lower=lower, upper=upper)),
                            parameters=HistogramParams(cells_per_dimension=(cells, cells)))
    token = secrets.token_urlsafe(24)
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="ldp-demo-"))
        stack.enter_context(_quiet_logs(logging.WARNING))
        server = stack.enter_context(start_server(CollectorConfig(
            listen="127.0.0.1:0", data_dir=str(data_dir), operator_token=token, log_format="text",
            log_level="WARNING")))
        remote = stack.enter_context(RemoteCollector(server.address, operator_token=token, packed=packed))
        run = run_campaign(remote, config, x, seed=seed, mode="direct", batch_size=1000, quiet=quiet)
    spec = run.first_spec
    estimates = run.result.estimates
    if estimates is None:
        raise RuntimeError(f"the histogram campaign {run.campaign_id} published no estimates")
    truth = histogram_truth(spec, x).astype(np.float64).reshape(cells, cells)
    estimate = estimates_grid(estimates, (cells, cells))
    std_errors = np.zeros(cells * cells)
    for e in estimates.estimates:
        std_errors[e.value] = e.std_error
    errors = evaluate_histogram(estimates, truth.reshape(-1))
    final_config = run.campaign.config
    parameters = {
        "dataset": dataset, "devices": n, "cells": [cells, cells], "epsilon": epsilon, "seed": seed,
        "oracle": _oracle_name(final_config), "lower": list(lower), "upper": list(upper),
        "api": "SubmitPacked" if packed else "SubmitReports",
    }
    png = None
    if out is not None:
        png = plot_density_comparison(
            truth, estimate, lower, upper, out, std_errors=std_errors.reshape(cells, cells),
            title=f"{dataset}: {n:,} devices, epsilon = {epsilon:g}, {parameters['oracle']} over "
                  f"{cells} x {cells} cells")
    return DemoSummary(parameters=parameters, run=run, errors=errors, truth=truth, estimate=estimate,
                       std_errors=std_errors.reshape(cells, cells), lower=lower, upper=upper, png=png)


def _cell_range(index: int, cells: int, low: float, high: float) -> str:
    width = (high - low) / cells
    return f"[{low + index * width:6.2f}, {low + (index + 1) * width:6.2f})"


def print_summary(summary: DemoSummary, stream: TextIO) -> None:
    """The compact human-readable report: parameters, top estimates beside the truth, error summary."""
    p = summary.parameters
    stats = summary.run.stats
    cells = p["cells"][0]
    write = stream.write
    write(f"LDP histogram demo: {p['dataset']}, {p['devices']:,} devices, epsilon = {p['epsilon']:g} per device, "
          f"{cells} x {cells} grid, oracle {p['oracle']}\n")
    write(f"  {stats.reports_sent:,} reports over gRPC ({p['api']}, batches of 1000) in {stats.wall_time_s:.1f} s "
          f"({stats.reports_per_second:,.0f} reports/s); accepted {stats.accepted:,}, rejected {stats.rejected:,}; "
          f"epsilon spent per device {stats.epsilon_per_device:g}\n\n")
    flat_est = summary.estimate.reshape(-1)
    flat_true = summary.truth.reshape(-1)
    flat_se = summary.std_errors.reshape(-1)
    order = np.argsort(-flat_est, kind="stable")[:_TOP_ROWS]
    write(f"  top {len(order)} cells by estimate (of {flat_est.size})\n")
    write(f"  {'x range':>18} {'y range':>18} {'estimate':>10} {'+- SE':>8} {'truth':>8} {'z':>6}\n")
    for index in order.tolist():
        i, j = divmod(index, cells)
        se = flat_se[index]
        z = (flat_est[index] - flat_true[index]) / se if se > 0 else math.nan
        write(f"  {_cell_range(i, cells, summary.lower[0], summary.upper[0]):>18} "
              f"{_cell_range(j, cells, summary.lower[1], summary.upper[1]):>18} "
              f"{flat_est[index]:10.0f} {se:8.0f} {flat_true[index]:8.0f} {z:6.2f}\n")
    e = summary.errors
    write("\n  error over all cells: "
          f"max |freq error| {e['max_abs_freq_error']:.4f}, mean |freq error| {e['mean_abs_freq_error']:.4f}, "
          f"mean |error|/SE {e['mean_abs_z']:.2f} (0.80 expected), "
          f"{e['confidence']:.0%} interval coverage {e['ci_coverage']:.1%}\n")
    if summary.png is not None:
        write(f"  wrote {summary.png}\n")
