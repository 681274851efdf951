"""PNG plots (:mod:`ldp_collector.plotting`): the grid clustering drawing and its cell geometry.

The drawing needs matplotlib (the ``[plot]`` extra) and skips without it; the geometry does not.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ldp_client.clusters import CellClusterModel
from ldp_client.encoders.base import NumericDomain
from ldp_client.encoders.geometry import TreeCell
from ldp_client.errors import InvalidParameterError
from ldp_collector.plotting import grid_cell_rectangles, plot_grid_clustering

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


_CELLS = (*(TreeCell(level=1, morton_index=i) for i in (0, 1, 2)), *(TreeCell(level=2, morton_index=i) for i in range(12, 16)))


def _irregular_map(labels: tuple[int, ...] = (0, -1, 0, 1, 1, -1, 1)) -> CellClusterModel:
    """[0, 4] x [10, 12]: three level-1 quadrants, the fourth (Morton 3) split into its four level-2 cells."""
    return CellClusterModel(domain=NumericDomain(lower=(0.0, 10.0), upper=(4.0, 12.0)), cells=_CELLS, labels=labels)


def test_grid_cells_are_rectangles_in_the_domain_units() -> None:
    rects = grid_cell_rectangles(_irregular_map())
    assert rects.shape == (7, 4)
    # Morton 0 of level 1 is the lower-left quadrant; level-2 cells are a quarter of its sides.
    assert rects[0].tolist() == [0.0, 10.0, 2.0, 1.0]
    assert np.allclose(rects[3:, 2:], [2.0 / 2, 1.0 / 2])
    # The cells partition the box: areas add up, every cell inside, the split quadrant is the upper right.
    assert np.sum(rects[:, 2] * rects[:, 3]) == pytest.approx(4.0 * 2.0)
    assert np.all(rects[:, 0] >= 0.0) and np.all(rects[:, 0] + rects[:, 2] <= 4.0)
    assert np.all(rects[:, 1] >= 10.0) and np.all(rects[:, 1] + rects[:, 3] <= 12.0)
    assert np.all(rects[3:, 0] >= 2.0) and np.all(rects[3:, 1] >= 11.0)


def test_grid_cells_refuse_what_cannot_be_drawn() -> None:
    three_d = CellClusterModel(domain=NumericDomain(lower=(0.0, 0.0, 0.0), upper=(1.0, 1.0, 1.0)),
                               cells=(TreeCell(level=0, morton_index=0),), labels=(0,))
    with pytest.raises(InvalidParameterError, match="grid clustering plots cover 2-D numeric domains, this one has 3 dimensions"):
        grid_cell_rectangles(three_d)
    # A map whose labels do not match its cells, or without cells, is refused by the model itself:
    # nothing that reaches the plots can be such a map.
    with pytest.raises(InvalidParameterError, match=r"one label per cell \(7\), got 6"):
        _irregular_map((0, -1, 0, 1, 1, -1))
    with pytest.raises(InvalidParameterError):
        CellClusterModel(domain=NumericDomain(lower=(0.0, 0.0), upper=(1.0, 1.0)), cells=(), labels=())


def test_plot_grid_clustering_renders_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(0)
    points = np.column_stack([rng.uniform(0.0, 4.0, 20_000), rng.uniform(10.0, 12.0, 20_000)])
    with_points = plot_grid_clustering(_irregular_map(), tmp_path / "grid.png", points=points, max_points=500,
                                       title="three clusters")
    assert with_points == tmp_path / "grid.png"
    assert with_points.read_bytes()[:8] == PNG_MAGIC
    alone = plot_grid_clustering(_irregular_map(), tmp_path / "alone.png")  # the published map only
    assert alone.read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(InvalidParameterError, match=r"points must be an \(n, 2\) array"):
        plot_grid_clustering(_irregular_map(), tmp_path / "bad.png", points=np.zeros((5, 3)))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plot_grid_clustering(_irregular_map(), tmp_path / "missing" / "grid.png")


def test_plot_grid_clustering_beside_the_truth(tmp_path: Path) -> None:
    """With the points' true labels (the demo's picture): two panels, the truth beside the map."""
    plt = pytest.importorskip("matplotlib.pyplot")
    rng = np.random.default_rng(1)
    points = np.column_stack([rng.uniform(0.0, 4.0, 2000), rng.uniform(10.0, 12.0, 2000)])
    labels = (points[:, 0] > 2.0).astype(np.int64)
    opened: list[object] = []
    original = plt.subplots

    def counting_subplots(*args: object, **kwargs: object) -> object:
        fig, axes = original(*args, **kwargs)
        opened.append(axes)
        return fig, axes

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt, "subplots", counting_subplots)
        path = plot_grid_clustering(_irregular_map(), tmp_path / "beside.png", points=points, labels_true=labels,
                                    max_points=500, title="truth beside the map")
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert np.shape(opened[0]) == (1, 2)
    with pytest.raises(InvalidParameterError, match="labels_true needs the points"):
        plot_grid_clustering(_irregular_map(), tmp_path / "bad.png", labels_true=labels)
    with pytest.raises(InvalidParameterError, match=r"one label per point \(2000\)"):
        plot_grid_clustering(_irregular_map(), tmp_path / "bad.png", points=points, labels_true=labels[:10])


_LONG_TITLE = ("grid on /data/fleet/points-2026-11-26.csv, n = 200,000, epsilon = 2 (uniform): "
               "7 clusters over 1,024 cells, 12 of them noise, ARI 0.873 against the file's labels, "
               "with the budget policy partition and the calibration round's 64 cells per dimension")


@pytest.mark.parametrize("beside_truth", [False, True])
def test_a_long_title_is_wrapped_inside_the_figure(tmp_path: Path, beside_truth: bool) -> None:
    """``simulate --plot`` titles name the file and the result: they must not run off the right edge."""
    plt = pytest.importorskip("matplotlib.pyplot")
    rng = np.random.default_rng(2)
    points = np.column_stack([rng.uniform(0.0, 4.0, 500), rng.uniform(10.0, 12.0, 500)])
    labels = (points[:, 0] > 2.0).astype(np.int64) if beside_truth else None
    figures: list[object] = []
    original = plt.subplots

    def keeping_subplots(*args: object, **kwargs: object) -> object:
        fig, axes = original(*args, **kwargs)
        figures.append(fig)
        return fig, axes

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt, "subplots", keeping_subplots)
        plot_grid_clustering(_irregular_map(), tmp_path / "long.png", points=points, labels_true=labels,
                             title=_LONG_TITLE)
    fig = figures[0]
    fig.draw_without_rendering()  # type: ignore[attr-defined]
    title = fig._suptitle if beside_truth else fig.axes[-1].title  # type: ignore[attr-defined]
    assert title.get_text().replace("\n", " ") == _LONG_TITLE and "\n" in title.get_text()
    extent = title.get_window_extent()
    width = fig.bbox.width  # type: ignore[attr-defined]
    assert 0 <= extent.x0 and extent.x1 <= width, (extent, width)
