"""PNG plots of histogram estimates and grid clusterings (the ``[plot]`` extra: matplotlib).

Everything renders off-screen with matplotlib's Agg backend, so it works on servers without a
display. Estimates are unbiased and therefore sometimes negative; the density maps show them
clipped at zero (the raw values are in ``ldp-collector campaign show --json``).

A grid clustering (the :class:`~ldp_client.clusters.CellClusterModel` of a ``GRID`` campaign's result) is drawn as its final
irregular grid: every cell's rectangle in the data's units
(:func:`ldp_client.encoders.geometry.tree_cell_bounds`), filled with its cluster's colour, noise
cells left transparent with a grey outline, over a scatter of (a subsample of) the points when
they are known (simulations, benchmarks); with the points' true labels, beside a panel of the
same points coloured by them (the demo's picture).
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.clusters import CellClusterModel
from ldp_client.encoders.geometry import tree_cell_bounds
from ldp_client.errors import InvalidParameterError

from .model import CampaignConfig, Estimates

__all__ = [
    "MatplotlibMissingError",
    "check_plot_dimension",
    "draw_grid_clustering",
    "draw_labelled_points",
    "estimates_grid",
    "grid_cell_rectangles",
    "plot_density_comparison",
    "plot_estimates",
    "plot_grid_clustering",
    "require_matplotlib",
]

#: Most points a grid clustering's scatter shows (a seeded subsample above).
DEFAULT_MAX_POINTS = 5000
#: Clusters named in the legend (the colours repeat after 10).
_LEGEND_CLUSTERS = 10

_INSTALL_HINT = 'pip install "ldp-collector[plot]"'


class MatplotlibMissingError(ImportError):
    """matplotlib is not installed; the message carries the install hint."""


def require_matplotlib() -> Any:
    """Import matplotlib with the Agg backend and return ``matplotlib.pyplot``.

    Raises
    ------
    MatplotlibMissingError
        With the install hint ``pip install "ldp-collector[plot]"``.
    """
    try:
        import matplotlib
    except ImportError as exc:
        raise MatplotlibMissingError(f"plots need matplotlib ({exc}); install it with: {_INSTALL_HINT}") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


#: The numeric dimensions each plot draws: estimates as a bar chart (1-D) or an image (2-D), a grid
#: clustering's cell map in the plane.
PLOT_DIMENSIONS = {"estimates": (1, 2), "grid clustering": (2,)}


def check_plot_dimension(plot: str, dimension: int) -> None:
    """Raise ``InvalidParameterError`` unless ``plot`` (a key of :data:`PLOT_DIMENSIONS`) draws ``dimension``."""
    allowed = PLOT_DIMENSIONS[plot]
    if dimension not in allowed:
        raise InvalidParameterError(f"{plot} plots cover {' and '.join(f'{a}-D' for a in allowed)} numeric domains, "
                                    f"this one has {dimension} dimensions")


def estimates_grid(estimates: Estimates, cells_per_dimension: Sequence[int]) -> NDArray[np.float64]:
    """Estimated counts of a numeric histogram as an array of shape ``cells_per_dimension``.

    Cell indices are row-major with the last dimension fastest (the SDK's uniform-grid
    convention), so ``grid[i, j]`` is the cell ``i`` along dimension 0 and ``j`` along dimension 1.
    Cells without an estimate are 0.
    """
    shape = tuple(int(m) for m in cells_per_dimension)
    flat = np.zeros(int(np.prod(shape)))
    for e in estimates.estimates:
        if e.value >= flat.size:
            raise InvalidParameterError(f"estimate for cell {e.value} is outside the {flat.size}-cell grid")
        flat[e.value] = e.count
    return flat.reshape(shape)


def _titles(fig: Any) -> list[Any]:
    """The figure's title and its axes' titles (the texts a long campaign description goes into)."""
    texts = [ax.title for ax in fig.axes]
    if fig._suptitle is not None:  # matplotlib keeps the suptitle only here
        texts.append(fig._suptitle)
    return [text for text in texts if text.get_text()]


def _fit_titles(fig: Any) -> None:
    """Wrap every title of ``fig`` at spaces until it lies inside the figure.

    The constrained layout makes room for a title's lines but never breaks a line, so a long
    title (a simulation's parameters and clustering) runs off the right edge. Each pass lays the
    figure out again, since wrapping a title moves the axes under it.
    """
    for text in _titles(fig):
        full = text.get_text()
        width = max(len(line) for line in full.splitlines())
        while width > 20:
            fig.draw_without_rendering()
            extent = text.get_window_extent()
            if extent.x0 >= 0 and extent.x1 <= fig.bbox.width:
                break
            width = int(width * 0.85)
            text.set_text(textwrap.fill(full, width))


def _save(fig: Any, out: str | os.PathLike[str]) -> Path:
    path = Path(out)
    if path.parent and not path.parent.exists():
        raise FileNotFoundError(f"cannot write {str(path)!r}: directory {str(path.parent)!r} does not exist")
    _fit_titles(fig)
    fig.savefig(path, dpi=110)
    return path


def plot_density_comparison(truth: ArrayLike, estimate: ArrayLike, lower: Sequence[float], upper: Sequence[float],
                            out: str | os.PathLike[str], *, title: str = "",
                            std_errors: ArrayLike | None = None) -> Path:
    """Side-by-side heat maps of the true and the estimated counts of a 2-D grid; writes a PNG.

    Parameters
    ----------
    truth, estimate : array_like, shape (m0, m1)
        Counts per cell (``[i, j]``: cell i along x, j along y).
    lower, upper : sequence of float
        The domain bounds ``(x, y)``.
    out : path-like
        The PNG to write.
    title : str
    std_errors : array_like, shape (m0, m1), optional
        Adds a third panel with ``(estimate - truth) / std_error``.

    Returns
    -------
    pathlib.Path
    """
    plt = require_matplotlib()
    t = np.asarray(truth, dtype=np.float64)
    e = np.asarray(estimate, dtype=np.float64)
    if t.ndim != 2 or t.shape != e.shape:
        raise InvalidParameterError(f"truth and estimate must be 2-D grids of one shape, got {t.shape} and {e.shape}")
    extent = (float(lower[0]), float(upper[0]), float(lower[1]), float(upper[1]))
    panels = 3 if std_errors is not None else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.6), squeeze=False, layout="constrained")
    vmax = float(max(t.max(), np.clip(e, 0, None).max(), 1.0))
    for ax, grid, name in ((axes[0, 0], t, "true counts"), (axes[0, 1], np.clip(e, 0, None), "LDP estimate")):
        image = ax.imshow(grid.T, origin="lower", extent=extent, aspect="auto", cmap="viridis", vmin=0, vmax=vmax)
        ax.set_title(name)
        ax.set_xlabel("x")
        fig.colorbar(image, ax=ax, shrink=0.85, label="devices per cell")
    axes[0, 0].set_ylabel("y")
    if std_errors is not None:
        se = np.asarray(std_errors, dtype=np.float64)
        z = np.divide(e - t, se, out=np.zeros_like(e), where=se > 0)
        ax = axes[0, 2]
        image = ax.imshow(z.T, origin="lower", extent=extent, aspect="auto", cmap="coolwarm", vmin=-4, vmax=4)
        ax.set_title("(estimate - truth) / std. error")
        ax.set_xlabel("x")
        fig.colorbar(image, ax=ax, shrink=0.85)
    if title:
        fig.suptitle(title)
    try:
        return _save(fig, out)
    finally:
        plt.close(fig)


def plot_estimates(estimates: Estimates, config: CampaignConfig,
                   out: str | os.PathLike[str], *, title: str = "") -> Path:
    """Plot a histogram campaign's estimates: a heat map (2-D numeric), or bars with 95% intervals
    (1-D numeric, categorical); writes a PNG.

    Raises
    ------
    InvalidParameterError
        A numeric domain of more than two dimensions, or no estimates.
    """
    plt = require_matplotlib()
    if not estimates.estimates:
        raise InvalidParameterError("there are no estimates to plot")
    numeric = config.domain.numeric
    cells = list(config.parameters.cells_per_dimension) if numeric is not None else []
    if numeric is not None:
        check_plot_dimension("estimates", numeric.dimension)
    fig, ax = plt.subplots(figsize=(7.0, 4.8), layout="constrained")
    try:
        if numeric is not None and numeric.dimension == 2:
            grid = estimates_grid(estimates, cells)
            lower, upper = numeric.lower, numeric.upper
            image = ax.imshow(np.clip(grid, 0, None).T, origin="lower", aspect="auto", cmap="viridis",
                              extent=(lower[0], upper[0], lower[1], upper[1]))
            fig.colorbar(image, ax=ax, label="estimated devices per cell (clipped at 0)")
            ax.set_xlabel("x")
            ax.set_ylabel("y")
        else:
            values = np.array([e.value for e in estimates.estimates])
            counts = np.array([e.count for e in estimates.estimates])
            half = np.array([(e.ci_upper - e.ci_lower) / 2.0 for e in estimates.estimates])
            if numeric is not None:
                lo, hi = numeric.lower[0], numeric.upper[0]
                width = (hi - lo) / max(int(cells[0]), 1)
                x = lo + (values + 0.5) * width
                ax.set_xlabel("value")
            else:
                x, width = values.astype(np.float64), 0.8
                ax.set_xlabel("category")
            ax.bar(x, counts, width=width * 0.9, yerr=half, capsize=2, color="tab:blue", ecolor="gray")
            ax.set_ylabel(f"estimated count ({estimates.confidence:.0%} interval)")
        ax.set_title(title or f"campaign {estimates.campaign_id}, round {estimates.round}, n = {estimates.reports}")
        return _save(fig, out)
    finally:
        plt.close(fig)


def grid_cell_rectangles(cell_map: CellClusterModel) -> NDArray[np.float64]:
    """Every cell of a 2-D grid clustering as ``(x0, y0, width, height)`` in the domain's units.

    The model itself guarantees one label per cell and cells that partition the domain.

    Raises
    ------
    InvalidParameterError
        The map is not two-dimensional.
    """
    domain = cell_map.domain
    check_plot_dimension("grid clustering", domain.dimension)
    out = np.empty((len(cell_map.cells), 4))
    for i, cell in enumerate(cell_map.cells):
        (x0, y0), (x1, y1) = tree_cell_bounds(cell, 2, domain)
        out[i] = (x0, y0, x1 - x0, y1 - y0)
    return out


def _subsample(points: ArrayLike, labels: ArrayLike | None, max_points: int,
               seed: int) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    """At most ``max_points`` of the ``(n, 2)`` points (and their labels), a subsample seeded by ``seed``."""
    x = np.asarray(points, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != 2:
        raise InvalidParameterError(f"points must be an (n, 2) array, got shape {x.shape}")
    y = None if labels is None else np.asarray(labels, dtype=np.int64)
    if y is not None and y.shape != (len(x),):
        raise InvalidParameterError(f"labels must hold one label per point ({len(x)}), got shape {y.shape}")
    if len(x) > max_points:
        keep = np.random.default_rng(seed).choice(len(x), size=max_points, replace=False)
        x, y = x[keep], None if y is None else y[keep]
    return x, y


def draw_labelled_points(ax: Any, points: ArrayLike, labels: ArrayLike, *, max_points: int = DEFAULT_MAX_POINTS,
                         seed: int = 0) -> None:
    """Scatter 2-D points coloured by their (true) labels on matplotlib axes ``ax``.

    The same subsample (``max_points``, ``seed``) as :func:`draw_grid_clustering` draws, so the two
    panels of :func:`plot_grid_clustering` show the same points; ``-1`` (noise) is grey.
    """
    require_matplotlib()
    import matplotlib

    x, y = _subsample(points, labels, max_points, seed)
    assert y is not None
    palette = matplotlib.colormaps["tab10"]
    colours = [palette(label % 10) if label >= 0 else (0.6, 0.6, 0.6, 1.0) for label in y.tolist()]
    ax.scatter(x[:, 0], x[:, 1], s=3, c=colours, alpha=0.7, linewidths=0)
    ax.set_xlabel("x")
    ax.set_ylabel("y")


def draw_grid_clustering(ax: Any, cell_map: CellClusterModel, points: ArrayLike | None = None, *,
                         max_points: int = DEFAULT_MAX_POINTS, seed: int = 0, legend: bool = True) -> None:
    """Draw a 2-D grid clustering on matplotlib axes ``ax`` (module docstring).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    cell_map : CellClusterModel
        A grid campaign's ``result.clustering.cell_map``.
    points : array_like, shape (n, 2), optional
        The clustered points; at most ``max_points`` of them (a subsample seeded by ``seed``) are
        drawn under the cells.
    legend : bool
        Name the clusters (up to 10, one colour each) and the noise.
    """
    require_matplotlib()
    import matplotlib
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Patch, Rectangle

    rectangles = grid_cell_rectangles(cell_map)
    labels = np.asarray(cell_map.labels, dtype=np.int64)
    if points is not None:
        x, _ = _subsample(points, None, max_points, seed)
        ax.scatter(x[:, 0], x[:, 1], s=2, c="black", alpha=0.45, linewidths=0, zorder=1)
    palette = matplotlib.colormaps["tab10"]
    faces = np.array([(*palette(int(label) % 10)[:3], 0.5) if label >= 0 else (0.6, 0.6, 0.6, 0.0)
                      for label in labels.tolist()])
    patches = [Rectangle((x0, y0), w, h) for x0, y0, w, h in rectangles.tolist()]
    ax.add_collection(PatchCollection(patches, facecolors=faces, edgecolors=(0.45, 0.45, 0.45, 0.6),
                                      linewidths=0.3, zorder=2))
    lower, upper = cell_map.domain.lower, cell_map.domain.upper
    ax.set_xlim(lower[0], upper[0])
    ax.set_ylim(lower[1], upper[1])
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    if legend:
        clusters = sorted(set(labels.tolist()) - {-1})
        handles = [Patch(facecolor=(*palette(c % 10)[:3], 0.5), edgecolor="grey", label=f"cluster {c}")
                   for c in clusters[:_LEGEND_CLUSTERS]]
        if len(clusters) > _LEGEND_CLUSTERS:
            handles.append(Patch(facecolor="white", edgecolor="white",
                                 label=f"... {len(clusters) - _LEGEND_CLUSTERS} more"))
        handles.append(Patch(facecolor="none", edgecolor="grey", label="noise"))
        ax.legend(handles=handles, fontsize=7, loc="best", framealpha=0.8)


def plot_grid_clustering(cell_map: CellClusterModel, out: str | os.PathLike[str], *,
                         points: ArrayLike | None = None, title: str = "", max_points: int = DEFAULT_MAX_POINTS,
                         seed: int = 0, labels_true: ArrayLike | None = None) -> Path:
    """Plot a 2-D grid clustering (:func:`draw_grid_clustering`); writes a PNG.

    Parameters
    ----------
    cell_map : CellClusterModel
    out : path-like
        The PNG to write.
    points : array_like, shape (n, 2), optional
        The clustered points, drawn under the cells.
    title : str
    max_points, seed : int
        The points' subsample.
    labels_true : array_like, shape (n,), optional
        The points' true labels (simulations): a panel of the points coloured by them is drawn
        beside the clustering, over the same axes (needs ``points``).

    Raises
    ------
    InvalidParameterError
        Not a 2-D map, points of the wrong shape, or ``labels_true`` without one label per point.
    """
    plt = require_matplotlib()
    if labels_true is not None and points is None:
        raise InvalidParameterError("labels_true needs the points they label")
    panels = 1 if labels_true is None else 2
    fig, axes = plt.subplots(1, panels, figsize=(6.4 * panels, 5.4), squeeze=False, layout="constrained")
    try:
        ax = axes[0, -1]
        draw_grid_clustering(ax, cell_map, points, max_points=max_points, seed=seed)
        clusters = len(set(cell_map.labels) - {-1})
        summary = f"{clusters} clusters over {len(cell_map.cells)} cells"
        if labels_true is None:
            ax.set_title(title or summary, fontsize=9)
        else:
            assert points is not None
            truth = axes[0, 0]
            draw_labelled_points(truth, points, labels_true, max_points=max_points, seed=seed)
            truth.set_xlim(ax.get_xlim())
            truth.set_ylim(ax.get_ylim())
            truth.set_title(f"truth: {len(set(np.asarray(labels_true).tolist()) - {-1})} labelled groups", fontsize=9)
            ax.set_title(f"published cluster map: {summary}", fontsize=9)
            if title:
                fig.suptitle(title, fontsize=10)
        return _save(fig, out)
    finally:
        plt.close(fig)
