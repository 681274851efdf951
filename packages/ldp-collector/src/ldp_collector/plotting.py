"""PNG plots of histogram estimates (the ``[plot]`` extra: matplotlib).

Everything renders off-screen with matplotlib's Agg backend, so it works on servers without a
display. Estimates are unbiased and therefore sometimes negative; the density maps show them
clipped at zero (the raw values are in ``ldp-collector campaign show --json``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp.v1 import campaigns_pb2
from ldp_client.errors import InvalidParameterError

__all__ = [
    "MatplotlibMissingError",
    "estimates_grid",
    "plot_density_comparison",
    "plot_estimates",
    "require_matplotlib",
]

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


def estimates_grid(estimates: campaigns_pb2.Estimates, cells_per_dimension: Sequence[int]) -> NDArray[np.float64]:
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


def _save(fig: Any, out: str | os.PathLike[str]) -> Path:
    path = Path(out)
    if path.parent and not path.parent.exists():
        raise FileNotFoundError(f"cannot write {str(path)!r}: directory {str(path.parent)!r} does not exist")
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


def plot_estimates(estimates: campaigns_pb2.Estimates, config: campaigns_pb2.CampaignConfig,
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
    domain = config.domain
    fig, ax = plt.subplots(figsize=(7.0, 4.8), layout="constrained")
    try:
        if domain.WhichOneof("domain") == "numeric" and len(domain.numeric.lower) == 2:
            cells = list(config.histogram.cells_per_dimension)
            grid = estimates_grid(estimates, cells)
            lower, upper = domain.numeric.lower, domain.numeric.upper
            image = ax.imshow(np.clip(grid, 0, None).T, origin="lower", aspect="auto", cmap="viridis",
                              extent=(lower[0], upper[0], lower[1], upper[1]))
            fig.colorbar(image, ax=ax, label="estimated devices per cell (clipped at 0)")
            ax.set_xlabel("x")
            ax.set_ylabel("y")
        elif domain.WhichOneof("domain") == "numeric" and len(domain.numeric.lower) != 1:
            raise InvalidParameterError(f"plots cover 1-D and 2-D numeric domains, this one has {len(domain.numeric.lower)} "
                             "dimensions")
        else:
            values = np.array([e.value for e in estimates.estimates])
            counts = np.array([e.count for e in estimates.estimates])
            half = np.array([(e.ci_upper - e.ci_lower) / 2.0 for e in estimates.estimates])
            if domain.WhichOneof("domain") == "numeric":
                lo, hi = domain.numeric.lower[0], domain.numeric.upper[0]
                width = (hi - lo) / max(int(config.histogram.cells_per_dimension[0]), 1)
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
