"""Grid encoders: uniform grid, dyadic grid-tree level, irregular cell list (adaptive grids).

All three report the index of the cell that holds the device's (clamped, normalized) point, with
the conventions of :mod:`ldp_client.encoders.geometry`, which the collector uses to turn indices
back into cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

from .._validation import check_int
from ..errors import InvalidParameterError
from .base import ENCODERS, INDEX, Encoder, NumericDomain, as_point
from .geometry import (
    MAX_INDEX_BITS,
    Bounds,
    CellLocator,
    TreeCell,
    _require_domain,
    _tuple_field,
    grid_cell_bounds,
    grid_size,
    tree_cell_bounds,
    tree_index_of,
)

__all__ = ["MAX_CELLS", "CellListEncoder", "GridTreeEncoder", "UniformGridEncoder"]

#: Largest number of cells in a :class:`CellListEncoder`.
MAX_CELLS = 2**20
_MAX_CELLS_PER_DIMENSION = 2**32 - 1


@ENCODERS.register
@dataclass(frozen=True, kw_only=True)
class UniformGridEncoder(Encoder):
    """Index of the uniform-grid cell holding the point (``ldp.v1.UniformGridEncoder``).

    Parameters
    ----------
    domain : NumericDomain
        Public bounds; points outside are clamped.
    cells_per_dimension : tuple of int
        ``m_j`` in ``[1, 2^32 - 1]`` per dimension, with ``prod(m_j) <= 2^64``.

    Notes
    -----
    The index is row-major, last dimension fastest; the normalized coordinate ``t`` falls in cell
    ``floor(t m)`` computed exactly on integers (see :mod:`~ldp_client.encoders.geometry`).
    Cost: ``O(d)``, a few microseconds for ``d <= 10``.
    """

    KIND: ClassVar[str] = "uniform_grid"
    VALUE_KIND: ClassVar[str] = INDEX

    domain: NumericDomain
    cells_per_dimension: tuple[int, ...]

    def __post_init__(self) -> None:
        _require_domain(self.domain)
        cells = _tuple_field("cells_per_dimension", self.cells_per_dimension)
        object.__setattr__(self, "cells_per_dimension", cells)
        if len(cells) != self.domain.dimension:
            raise InvalidParameterError(
                f"cells_per_dimension must have one entry per dimension ({self.domain.dimension}), got {len(cells)}")
        for m in cells:
            check_int("cells_per_dimension entry", m, 1, _MAX_CELLS_PER_DIMENSION)
        if grid_size(cells) > 2**MAX_INDEX_BITS:
            raise InvalidParameterError(f"the grid must have at most 2^64 cells, got {grid_size(cells)}")

    @property
    def output_size(self) -> int:
        return grid_size(self.cells_per_dimension)

    def encode(self, point: Any) -> int:
        """Row-major index of the cell holding the clamped point.

        Raises
        ------
        EncodingError
            Wrong dimension or type, NaN or infinite coordinate.
        """
        unit = self.domain.normalize(as_point(point, self.domain.dimension))
        index = 0
        for t, m in zip(unit, self.cells_per_dimension):
            num, den = t.as_integer_ratio()
            c = num * m // den
            index = index * m + (c if c < m else m - 1)
        return index

    def cell_bounds(self, index: int, *, normalized: bool = False) -> Bounds:
        """``(lower, upper)`` of cell ``index``, in the domain's units unless ``normalized``."""
        return grid_cell_bounds(index, self.cells_per_dimension, None if normalized else self.domain)


@ENCODERS.register
@dataclass(frozen=True, kw_only=True)
class GridTreeEncoder(Encoder):
    """Morton index of the level-``level`` dyadic cell holding the point (``ldp.v1.GridTreeEncoder``).

    Parameters
    ----------
    domain : NumericDomain
        Public bounds; points outside are clamped.
    level : int
        Tree level ``l`` in ``[0, 64 // d]``: ``2^(l d)`` cells of side ``2^-l`` of the
        normalized box.

    Notes
    -----
    ``parent = index >> d`` (see :mod:`~ldp_client.encoders.geometry` for the bit convention), so
    the reports of every level describe one nested tree. Cost: ``O(d + l d / 8)``.
    """

    KIND: ClassVar[str] = "grid_tree"
    VALUE_KIND: ClassVar[str] = INDEX

    domain: NumericDomain
    level: int

    def __post_init__(self) -> None:
        _require_domain(self.domain)
        check_int("level", self.level, 0, MAX_INDEX_BITS // self.domain.dimension)

    @property
    def output_size(self) -> int:
        return 1 << (self.level * self.domain.dimension)

    def encode(self, point: Any) -> int:
        """Morton index of the level-``level`` cell holding the clamped point.

        Raises
        ------
        EncodingError
            Wrong dimension or type, NaN or infinite coordinate.
        """
        return tree_index_of(self.domain.normalize(as_point(point, self.domain.dimension)), self.level)

    def cell(self, morton_index: int) -> TreeCell:
        """The :class:`TreeCell` of an index of this level."""
        check_int("morton_index", morton_index, 0, self.output_size - 1)
        return TreeCell(level=self.level, morton_index=morton_index)

    def cell_bounds(self, morton_index: int, *, normalized: bool = False) -> Bounds:
        """``(lower, upper)`` of a level cell, in the domain's units unless ``normalized``."""
        return tree_cell_bounds(self.cell(morton_index), self.domain.dimension,
                                None if normalized else self.domain)


@ENCODERS.register
@dataclass(frozen=True, kw_only=True)
class CellListEncoder(Encoder):
    """Position of the listed dyadic cell holding the point (``ldp.v1.CellListEncoder``).

    Parameters
    ----------
    domain : NumericDomain
        Public bounds; points outside are clamped.
    cells : tuple of TreeCell
        1 to 2^20 dyadic cells (levels may differ) that partition the normalized box exactly;
        checked on construction with integer arithmetic
        (:func:`~ldp_client.encoders.geometry.check_partition`).

    Notes
    -----
    Lookup is a Morton encoding at the deepest listed level plus one dict probe per distinct
    listed level (:class:`~ldp_client.encoders.geometry.CellLocator`), never a scan of the list.
    Building the locator costs ``O(n L)`` once per object.
    """

    KIND: ClassVar[str] = "cell_list"
    VALUE_KIND: ClassVar[str] = INDEX

    domain: NumericDomain
    cells: tuple[TreeCell, ...]

    def __post_init__(self) -> None:
        _require_domain(self.domain)
        cells = _tuple_field("cells", self.cells)
        object.__setattr__(self, "cells", cells)
        if not 1 <= len(cells) <= MAX_CELLS:
            raise InvalidParameterError(f"cells must hold 1 to {MAX_CELLS} cells, got {len(cells)}")
        _ = self.locator  # validates the partition eagerly

    @cached_property
    def locator(self) -> CellLocator:
        """The per-level lookup tables of :attr:`cells`."""
        return CellLocator(self.cells, self.domain.dimension)

    @property
    def output_size(self) -> int:
        return len(self.cells)

    def encode(self, point: Any) -> int:
        """Position in :attr:`cells` of the cell holding the clamped point.

        Raises
        ------
        EncodingError
            Wrong dimension or type, NaN or infinite coordinate.
        """
        return self.locator.locate(self.domain.normalize(as_point(point, self.domain.dimension)))

    def cell_bounds(self, position: int, *, normalized: bool = False) -> Bounds:
        """``(lower, upper)`` of ``cells[position]``, in the domain's units unless ``normalized``."""
        check_int("position", position, 0, len(self.cells) - 1)
        return tree_cell_bounds(self.cells[position], self.domain.dimension,
                                None if normalized else self.domain)
