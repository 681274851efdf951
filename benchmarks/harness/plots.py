"""PNG plots of a suite run: metric vs epsilon, metric vs n, 2-D clusters drawn over the points, and
the final grid of every drawn grid clustering run.

Small files on purpose (cheap to write and to look at): 80 dpi, a 64-colour palette,
at most 2500 points per scatter panel.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import adapters
from .suites import DatasetCase, Suite, epsilon_label

if TYPE_CHECKING:
    from ldp_client.clusters import CellClusterModel

    from .runner import Cell, RunRecord

__all__ = ["plot_clusters", "plot_grid", "plot_metric_vs_epsilon", "plot_metric_vs_n", "suite_plots"]

_DPI = 80
_MAX_SCATTER = 2500
_TITLES = {"cost_ratio": "cost / non-private k-means (log)", "ari": "adjusted Rand index",
           "f_measure": "F-measure", "cost_per_point": "NICV (cost per point)"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out: Path) -> None:
    """Write ``fig`` as a small PNG: rendered at :data:`_DPI`, then reduced to a 64-colour palette."""
    from PIL import Image  # matplotlib's own dependency

    fig.savefig(out, dpi=_DPI)
    with Image.open(out) as image:
        small = image.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    small.save(out, optimize=True)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def _style(protocol: str) -> dict[str, Any]:
    privacy = adapters.ADAPTERS[protocol].privacy if protocol in adapters.ADAPTERS else "ldp"
    return {"non-private": {"linestyle": "--"}, "central-dp": {"linestyle": "-", "marker": "o"},
            "ldp": {"linestyle": "-", "marker": "s"}}[privacy]


def plot_metric_vs_epsilon(cells: Sequence[Cell], metric: str, title: str, out: Path) -> Path | None:
    """Median and interquartile band of ``metric`` against epsilon; methods without a budget as lines,
    epsilon = inf at the right edge."""
    private = [c for c in cells if c.epsilon != "-" and metric in c.median]
    if not private:
        return None
    plt = _pyplot()
    finite = sorted({float(c.epsilon) for c in private if c.epsilon != "inf"})
    if not finite:
        return None
    inf_x = finite[-1] * 2.5
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for protocol in sorted({c.protocol for c in private}, key=list(adapters.ADAPTERS).index):
        mine = sorted((c for c in private if c.protocol == protocol),
                      key=lambda c: math.inf if c.epsilon == "inf" else float(c.epsilon))
        xs = [inf_x if c.epsilon == "inf" else float(c.epsilon) for c in mine]
        med = [c.median[metric] for c in mine]
        line = ax.plot(xs, med, label=protocol, **_style(protocol))[0]
        ax.fill_between(xs, [c.q1[metric] for c in mine], [c.q3[metric] for c in mine], alpha=0.15,
                        color=line.get_color())
    for c in cells:
        if c.epsilon == "-" and metric in c.median:
            ax.axhline(c.median[metric], label=c.protocol, **_style(c.protocol), color="grey", alpha=0.7)
    ax.set_xscale("log")
    ticks = finite + [inf_x]
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t:g}" for t in finite] + ["∞"])
    ax.minorticks_off()
    if metric == "cost_ratio":
        ax.set_yscale("log")
    ax.set_xlabel("ε (per device for LDP, total for central DP)")
    ax.set_ylabel(_TITLES.get(metric, metric))
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, out)
    plt.close(fig)
    return out


def plot_metric_vs_n(cells: Sequence[Cell], metric: str, epsilon: str, title: str, out: Path) -> Path | None:
    """Median and interquartile band of ``metric`` against n at one epsilon (and the methods without one)."""
    chosen = [c for c in cells if c.epsilon in (epsilon, "-") and metric in c.median]
    if len({c.n for c in chosen}) < 2:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for protocol in sorted({c.protocol for c in chosen}, key=list(adapters.ADAPTERS).index):
        mine = sorted((c for c in chosen if c.protocol == protocol), key=lambda c: c.n)
        if len(mine) < 2:
            continue
        xs = [c.n for c in mine]
        line = ax.plot(xs, [c.median[metric] for c in mine], label=protocol, **_style(protocol))[0]
        ax.fill_between(xs, [c.q1[metric] for c in mine], [c.q3[metric] for c in mine], alpha=0.15,
                        color=line.get_color())
    ax.set_xscale("log")
    if metric == "cost_ratio":
        ax.set_yscale("log")
    ax.set_xlabel("n (devices / points)")
    ax.set_ylabel(_TITLES.get(metric, metric))
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, out)
    plt.close(fig)
    return out


def plot_clusters(x: np.ndarray, panels: Sequence[tuple[str, np.ndarray, np.ndarray | None]], title: str,
                  out: Path) -> Path | None:
    """One scatter panel per method: points coloured by predicted cluster (grey = noise), centers as crosses."""
    if not panels or x.shape[1] != 2:
        return None
    plt = _pyplot()
    rng = np.random.default_rng(0)
    shown = rng.choice(len(x), size=min(len(x), _MAX_SCATTER), replace=False)
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.8 * rows), squeeze=False)
    for ax in axes.ravel()[len(panels):]:
        ax.axis("off")
    for ax, (name, labels, centers) in zip(axes.ravel(), panels):
        lab = labels[shown]
        noise = lab < 0
        ax.scatter(x[shown][noise, 0], x[shown][noise, 1], s=2, c="lightgrey", linewidths=0)
        ax.scatter(x[shown][~noise, 0], x[shown][~noise, 1], s=2, c=lab[~noise] % 20, cmap="tab20", vmin=0, vmax=19,
                   linewidths=0)
        if centers is not None:
            ax.scatter(centers[:, 0], centers[:, 1], s=40, marker="x", c="black", linewidths=1.5)
        ax.set_title(name, fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    _save(fig, out)
    plt.close(fig)
    return out


def plot_grid(x: np.ndarray, cell_map: CellClusterModel, title: str, out: Path) -> Path | None:
    """A grid clustering's final irregular grid, cells coloured by cluster (noise transparent), over the points.

    ``cell_map`` is the run's published cell map; drawn by
    :func:`ldp_collector.plotting.draw_grid_clustering` (2-D only).
    """
    from ldp_collector.plotting import draw_grid_clustering

    if x.shape[1] != 2:
        return None
    grid = cell_map
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 4.2))
    # A legend only while it stays small beside the map.
    draw_grid_clustering(ax, grid, x, max_points=_MAX_SCATTER, seed=0, legend=len(set(grid.labels) - {-1}) <= 5)
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    _save(fig, out)
    plt.close(fig)
    return out


def suite_plots(suite: Suite, cells: dict[tuple[str, str, int, str], Cell], records: Sequence[RunRecord],
                out_dir: Path) -> list[Path]:
    """Every plot of a run under ``out_dir / "plots"``; returns the files written."""
    from .runner import dataset

    plot_dir = out_dir / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    for old in plot_dir.glob("*.png"):
        old.unlink()
    written: list[Path] = []
    all_cells = list(cells.values())
    plot_eps = epsilon_label(suite.plot_epsilon)
    for dataset_label in sorted({c.dataset for c in all_cells}):
        subset = [c for c in all_cells if c.dataset == dataset_label]
        for metric in suite.plot_metrics:
            for n in sorted({c.n for c in subset}):
                at_n = [c for c in subset if c.n == n]
                if len({c.epsilon for c in at_n if c.epsilon != "-"}) >= 3:
                    path = plot_metric_vs_epsilon(at_n, metric, f"{dataset_label}, n = {n:,}",
                                                  plot_dir / f"{_slug(dataset_label)}_n{n}_{metric}_vs_eps.png")
                    written += [path] if path else []
            path = plot_metric_vs_n(subset, metric, plot_eps, f"{dataset_label}, ε = {plot_eps}",
                                    plot_dir / f"{_slug(dataset_label)}_{metric}_vs_n.png")
            written += [path] if path else []
    # Cluster drawings: the runs that kept their labels (2-D, first seed, smallest n, plot epsilon).
    drawn: dict[tuple[str, int, int], list[RunRecord]] = {}
    for r in records:
        if r.labels is not None and r.error is None:
            drawn.setdefault((r.dataset, r.n, r.seed), []).append(r)
    cases = {_case_label(c): c for c in _suite_cases(suite)}
    for (dataset_label, n, seed), runs in sorted(drawn.items()):
        case = cases.get(dataset_label)
        if case is None:
            continue
        x, truth, _ = dataset(case, n, seed)
        runs.sort(key=lambda r: list(adapters.ADAPTERS).index(r.protocol) if r.protocol in adapters.ADAPTERS else 99)
        panels: list[tuple[str, np.ndarray, np.ndarray | None]] = []
        if truth is not None:
            panels.append(("truth", truth, None))
        for r in runs:
            assert r.labels is not None
            eps = "" if r.epsilon == "-" else f", ε={r.epsilon}"
            centers = np.asarray(r.centers) if r.centers is not None else None
            panels.append((f"{r.protocol}{eps}", r.labels, centers))
        path = plot_clusters(x, panels, f"{dataset_label}, n = {n:,}, seed {seed}",
                             plot_dir / f"{_slug(dataset_label)}_n{n}_clusters.png")
        written += [path] if path else []
        for r in runs:
            if r.cell_map is None:
                continue
            title = (f"{r.protocol}, {dataset_label}, n = {n:,}, ε = {r.epsilon}: "
                     f"{int(r.diagnostics.get('clusters', 0))} clusters, {int(r.diagnostics.get('final_cells', 0)):,} cells")
            name = f"{_slug(dataset_label)}_n{n}_{_slug(r.protocol)}_eps{_slug(r.epsilon)}_grid.png"
            path = plot_grid(x, r.cell_map, title, plot_dir / name)
            written += [path] if path else []
    return written


def _suite_cases(suite: Suite) -> list[DatasetCase]:
    return [case for block in suite.blocks for case in block.datasets]


def _case_label(case: DatasetCase) -> str:
    return case.label
