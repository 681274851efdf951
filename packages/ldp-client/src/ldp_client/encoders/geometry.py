"""Cell geometry shared by the device and the collector: point <-> cell <-> index <-> bounds.

Every encoder that reports a cell and every server step that reasons about cells (density maps,
grid clustering, tree growth) uses these functions, so the two sides cannot disagree on which
index names which cell. Everything here is stdlib-only and deterministic.

Conventions
-----------
Normalized box
    A :class:`~ldp_client.encoders.base.NumericDomain` is mapped affinely onto ``[0, 1]^d``
    (points outside are clamped). Cells are half-open ``[lower, upper)`` along each dimension,
    except that the last cell along a dimension also holds the upper face ``t_j = 1``.
Uniform grid
    ``cells_per_dimension = (m_0, ..., m_{d-1})``. Cell ``(c_0, ..., c_{d-1})`` with
    ``0 <= c_j < m_j`` covers ``[c_j / m_j, (c_j + 1) / m_j)`` along dimension ``j``. Its index is
    row-major with the last dimension fastest:
    ``index = (...((c_0 * m_1 + c_1) * m_2 + c_2)...) * m_{d-1} + c_{d-1}``.
    A normalized coordinate ``t`` falls in ``c = floor(t * m)`` computed *exactly* with integers
    (``t`` is a binary float, so ``t = num / 2^e`` and ``c = num * m // 2^e``), clamped to ``m - 1``;
    therefore ``c / m <= t < (c + 1) / m`` holds exactly for every ``t < 1``.
Dyadic grid tree
    The cell of level ``l`` with integer coordinates ``(c_0, ..., c_{d-1})``, ``0 <= c_j < 2^l``,
    covers ``[c_j 2^-l, (c_j + 1) 2^-l)`` along dimension ``j``. Its Morton index interleaves the
    coordinate bits: **bit ``b`` of ``c_j`` is bit ``b * d + j`` of the index**, so the group of
    ``d`` bits ``[b d, (b + 1) d)`` holds bit ``b`` of every coordinate, with dimension 0 in the
    lowest bit of the group. Hence ``parent(c) = c >> d``, the children of ``c`` are
    ``(c << d) | j`` for ``j`` in ``[0, 2^d)`` (bit ``i`` of ``j`` is the new low bit of
    coordinate ``i``), and the level-``k`` ancestor of a level-``l`` cell is ``c >> ((l - k) d)``.
    The whole box is the level-0 cell 0. Indices travel as ``uint64``, so ``level * d <= 64``.
Touching
    Two cells *touch* when their closed boxes meet but their interiors do not (they share a face,
    an edge or a corner, whatever their sizes). :func:`contact_dimension` gives the dimension of
    the shared part, so ``faces_only`` adjacency is ``contact_dimension == d - 1``.

All exactness-critical tests (partition, touching, containment) are done on integers.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .._spec import Spec
from .._validation import check_int
from ..errors import InvalidParameterError
from .base import NumericDomain

__all__ = [
    "MAX_INDEX_BITS",
    "Bounds",
    "CellLocator",
    "TreeCell",
    "cell_adjacency",
    "cells_overlap",
    "cells_touch",
    "check_partition",
    "check_tree_cell",
    "clamp_point",
    "contact_dimension",
    "denormalize_bounds",
    "grid_cell_bounds",
    "grid_cell_of",
    "grid_index",
    "grid_multi_index",
    "grid_size",
    "max_tree_level",
    "morton_decode",
    "morton_encode",
    "neighbor_offsets",
    "same_level_neighbors",
    "tree_ancestor",
    "tree_cell_bounds",
    "tree_cell_of",
    "tree_children",
    "tree_coordinates",
    "tree_coordinates_of",
    "tree_index_of",
    "tree_integer_box",
    "tree_parent",
]

#: Cell indices travel as ``uint64``.
MAX_INDEX_BITS = 64

#: ``(lower, upper)`` corner pair of an axis-aligned box.
Bounds = tuple[tuple[float, ...], tuple[float, ...]]


@dataclass(frozen=True, kw_only=True, order=True)
class TreeCell(Spec):
    """One cell of the dyadic grid tree (``ldp.v1.TreeCell``); orders by ``(level, morton_index)``.

    Parameters
    ----------
    level : int
        Depth in the tree, ``0`` (the whole box) to ``64``; with ``d`` dimensions the cell is
        only valid when ``level * d <= 64`` (see :func:`check_tree_cell`).
    morton_index : int
        Morton index of the cell among the ``2^(level d)`` cells of its level.
    """

    level: int
    morton_index: int

    def __post_init__(self) -> None:
        check_int("level", self.level, 0, MAX_INDEX_BITS)
        check_int("morton_index", self.morton_index, 0, 2**MAX_INDEX_BITS - 1)


def max_tree_level(dimension: int) -> int:
    """Deepest tree level whose Morton indices fit in 64 bits: ``64 // dimension``."""
    return MAX_INDEX_BITS // check_int("dimension", dimension, 1, 2**31)


def check_tree_cell(cell: TreeCell, dimension: int) -> TreeCell:
    """Return ``cell`` if it is a valid cell of a ``dimension``-dimensional tree.

    Raises
    ------
    TypeError
        ``cell`` is not a :class:`TreeCell`.
    InvalidParameterError
        ``level * dimension > 64`` or the index is not below ``2^(level * dimension)``.
    """
    if not isinstance(cell, TreeCell):
        raise TypeError(f"cell must be a TreeCell, got {type(cell).__name__}")
    if cell.level * dimension > MAX_INDEX_BITS:
        raise InvalidParameterError(
            f"cell level must be in [0, {MAX_INDEX_BITS // dimension}] in dimension {dimension}, got {cell.level}")
    if cell.morton_index >> (cell.level * dimension):
        raise InvalidParameterError(
            f"morton_index of a level-{cell.level} cell in dimension {dimension} must be in "
            f"[0, 2^{cell.level * dimension}), got {cell.morton_index}")
    return cell


# --------------------------------------------------------------------------------------------
# Field checks shared by the encoder modules
# --------------------------------------------------------------------------------------------


def _require_domain(domain: Any) -> NumericDomain:
    if not isinstance(domain, NumericDomain):
        raise TypeError(f"domain must be a NumericDomain, got {type(domain).__name__}")
    return domain


def _tuple_field(name: str, value: Any) -> tuple[Any, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise TypeError(f"{name} must be a sequence, got {type(value).__name__}")
    return tuple(value)


def _float_field(name: str, values: tuple[Any, ...]) -> tuple[float, ...]:
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name}[{i}] must be a real number, got {type(v).__name__}")
        if not math.isfinite(v):
            raise InvalidParameterError(f"{name}[{i}] must be finite, got {v}")
        out.append(float(v))
    return tuple(out)


# --------------------------------------------------------------------------------------------
# Points and units
# --------------------------------------------------------------------------------------------


def clamp_point(point: Sequence[float], domain: NumericDomain) -> list[float]:
    """Clamp a validated point to the domain's box, in the domain's own units."""
    return [float(lo) if x < lo else float(hi) if x > hi else x for x, lo, hi in zip(point, domain.lower, domain.upper)]


def _denormalize(t: float, lo: float, hi: float) -> float:
    # Exact at both faces (lo + 1.0 * (hi - lo) may miss hi by an ulp).
    if t <= 0.0:
        return float(lo)
    if t >= 1.0:
        return float(hi)
    return lo + t * (hi - lo)


def denormalize_bounds(bounds: Bounds, domain: NumericDomain) -> Bounds:
    """Map normalized box bounds to the domain's units (the faces ``0`` and ``1`` map exactly)."""
    lower, upper = bounds
    return (
        tuple(_denormalize(t, lo, hi) for t, lo, hi in zip(lower, domain.lower, domain.upper)),
        tuple(_denormalize(t, lo, hi) for t, lo, hi in zip(upper, domain.lower, domain.upper)),
    )


# --------------------------------------------------------------------------------------------
# Uniform grid
# --------------------------------------------------------------------------------------------


def grid_size(cells_per_dimension: Sequence[int]) -> int:
    """Number of cells of a uniform grid: the product of ``cells_per_dimension``."""
    size = 1
    for m in cells_per_dimension:
        size *= m
    return size


def grid_index(multi_index: Sequence[int], cells_per_dimension: Sequence[int]) -> int:
    """Row-major index (last dimension fastest) of the cell ``multi_index``.

    Raises
    ------
    InvalidParameterError
        Lengths differ or a coordinate is outside ``[0, m_j)``.
    """
    if len(multi_index) != len(cells_per_dimension):
        raise InvalidParameterError(
            f"multi_index must have {len(cells_per_dimension)} coordinates, got {len(multi_index)}")
    index = 0
    for j, (c, m) in enumerate(zip(multi_index, cells_per_dimension)):
        if not 0 <= c < m:
            raise InvalidParameterError(f"grid coordinate {j} must be in [0, {m}), got {c}")
        index = index * m + c
    return index


def grid_multi_index(index: int, cells_per_dimension: Sequence[int]) -> tuple[int, ...]:
    """Inverse of :func:`grid_index`.

    Raises
    ------
    InvalidParameterError
        ``index`` is outside ``[0, grid_size)``.
    """
    size = grid_size(cells_per_dimension)
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"index must be an int, got {type(index).__name__}")
    if not 0 <= index < size:
        raise InvalidParameterError(f"grid index must be in [0, {size}), got {index}")
    out = []
    for m in reversed(cells_per_dimension):
        index, c = divmod(index, m)
        out.append(c)
    return tuple(reversed(out))


def grid_cell_of(unit_point: Sequence[float], cells_per_dimension: Sequence[int]) -> tuple[int, ...]:
    """Multi-index of the uniform-grid cell holding a normalized point of ``[0, 1]^d``.

    ``c_j = min(floor(t_j * m_j), m_j - 1)``, with the floor computed exactly on integers.
    """
    out = []
    for t, m in zip(unit_point, cells_per_dimension):
        num, den = t.as_integer_ratio()
        c = num * m // den
        out.append(0 if c < 0 else m - 1 if c >= m else c)
    return tuple(out)


def grid_cell_bounds(index: int, cells_per_dimension: Sequence[int],
                     domain: NumericDomain | None = None) -> Bounds:
    """Bounds of a uniform-grid cell: normalized, or in the domain's units when ``domain`` is given.

    The normalized bounds ``c / m`` are correctly rounded quotients, so by monotonicity of rounding
    ``lower <= t <= upper`` holds in floating point for every ``t`` in the cell.
    """
    multi = grid_multi_index(index, cells_per_dimension)
    bounds = (tuple(c / m for c, m in zip(multi, cells_per_dimension)),
              tuple((c + 1) / m for c, m in zip(multi, cells_per_dimension)))
    return bounds if domain is None else denormalize_bounds(bounds, domain)


# --------------------------------------------------------------------------------------------
# Morton codes and the dyadic tree
# --------------------------------------------------------------------------------------------


@functools.cache
def _spread_table(dimension: int) -> tuple[int, ...]:
    """``table[v]`` = the 8 bits of ``v`` moved to positions ``0, d, 2d, ..., 7d``."""
    table = []
    for v in range(256):
        spread = 0
        for i in range(8):
            if (v >> i) & 1:
                spread |= 1 << (i * dimension)
        table.append(spread)
    return tuple(table)


def morton_encode(coordinates: Sequence[int]) -> int:
    """Interleave non-negative integer coordinates: bit ``b`` of ``c_j`` becomes bit ``b d + j``."""
    d = len(coordinates)
    table = _spread_table(d)
    code = 0
    for j, c in enumerate(coordinates):
        if c < 0:
            raise InvalidParameterError(f"Morton coordinate {j} must be >= 0, got {c}")
        shift = j
        while c:
            code |= table[c & 0xFF] << shift
            c >>= 8
            shift += 8 * d
    return code


def morton_decode(index: int, dimension: int, level: int) -> tuple[int, ...]:
    """Inverse of :func:`morton_encode` for a cell of ``level`` (``level`` bits per coordinate)."""
    coords = [0] * dimension
    for b in range(level):
        group = index >> (b * dimension)
        for j in range(dimension):
            coords[j] |= ((group >> j) & 1) << b
    return tuple(coords)


def tree_coordinates(cell: TreeCell, dimension: int) -> tuple[int, ...]:
    """Integer coordinates ``(c_0, ..., c_{d-1})`` of a tree cell at its own level."""
    return morton_decode(cell.morton_index, dimension, cell.level)


def tree_parent(cell: TreeCell, dimension: int) -> TreeCell:
    """The parent ``(level - 1, index >> d)``; the root has no parent."""
    if cell.level == 0:
        raise InvalidParameterError("the level-0 cell (the whole box) has no parent")
    return TreeCell(level=cell.level - 1, morton_index=cell.morton_index >> dimension)


def tree_ancestor(cell: TreeCell, dimension: int, level: int) -> TreeCell:
    """The ancestor of ``cell`` at ``level`` (``0 <= level <= cell.level``; the cell itself at its level)."""
    check_int("level", level, 0, cell.level)
    return TreeCell(level=level, morton_index=cell.morton_index >> ((cell.level - level) * dimension))


def tree_children(cell: TreeCell, dimension: int) -> tuple[TreeCell, ...]:
    """The ``2^d`` children ``(level + 1, (index << d) | j)``, in increasing ``j``."""
    if (cell.level + 1) * dimension > MAX_INDEX_BITS:
        raise InvalidParameterError(
            f"children of a level-{cell.level} cell in dimension {dimension} would need more than 64 index bits")
    base = cell.morton_index << dimension
    return tuple(TreeCell(level=cell.level + 1, morton_index=base | j) for j in range(1 << dimension))


def tree_coordinates_of(unit_point: Sequence[float], level: int) -> list[int]:
    """Integer coordinates of the level-``level`` cell holding a normalized point (exact floor)."""
    scale = float(1 << level)
    top = (1 << level) - 1
    out = []
    for t in unit_point:
        c = int(t * scale)  # multiplying by a power of two is exact
        out.append(0 if c < 0 else top if c > top else c)
    return out


def tree_index_of(unit_point: Sequence[float], level: int) -> int:
    """Morton index of the level-``level`` cell holding a normalized point of ``[0, 1]^d``."""
    return morton_encode(tree_coordinates_of(unit_point, level))


def tree_cell_of(unit_point: Sequence[float], level: int) -> TreeCell:
    """The level-``level`` :class:`TreeCell` holding a normalized point of ``[0, 1]^d``."""
    return TreeCell(level=level, morton_index=tree_index_of(unit_point, level))


def tree_cell_bounds(cell: TreeCell, dimension: int, domain: NumericDomain | None = None) -> Bounds:
    """Bounds of a tree cell: normalized (``c 2^-l``, exact below 2^53), or in the domain's units."""
    coords = tree_coordinates(cell, dimension)
    scale = 2.0 ** -cell.level
    bounds = (tuple(c * scale for c in coords), tuple((c + 1) * scale for c in coords))
    return bounds if domain is None else denormalize_bounds(bounds, domain)


def tree_integer_box(cell: TreeCell, dimension: int, level: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Exact integer bounds of ``cell`` in units of ``2^-level`` (``level >= cell.level``).

    Returns ``(lower, upper)``: the cell is ``[lower_j, upper_j) * 2^-level`` along dimension ``j``.
    """
    if level < cell.level:
        raise InvalidParameterError(f"level must be >= the cell's level {cell.level}, got {level}")
    shift = level - cell.level
    coords = tree_coordinates(cell, dimension)
    return tuple(c << shift for c in coords), tuple((c + 1) << shift for c in coords)


def contact_dimension(a: TreeCell, b: TreeCell, dimension: int) -> int:
    """Dimension of the intersection of the *closed* cells ``a`` and ``b`` (any levels).

    Returns ``-1`` when they are disjoint, ``dimension`` when their interiors overlap (for dyadic
    cells: one contains the other), and otherwise ``k`` in ``[0, d)``: they touch along a shared
    ``k``-dimensional face part (``d - 1``: a face; ``0``: a corner).
    """
    level = max(a.level, b.level)
    a_lo, a_hi = tree_integer_box(a, dimension, level)
    b_lo, b_hi = tree_integer_box(b, dimension, level)
    shared = 0
    for j in range(dimension):
        length = min(a_hi[j], b_hi[j]) - max(a_lo[j], b_lo[j])
        if length < 0:
            return -1
        if length > 0:
            shared += 1
    return shared


def cells_touch(a: TreeCell, b: TreeCell, dimension: int, *, faces_only: bool = False) -> bool:
    """Whether two cells of any levels touch: closed boxes meet, interiors disjoint.

    With ``faces_only`` the shared part must be ``(d - 1)``-dimensional (part of a face);
    otherwise edges and corners count too (the "queen" neighbourhood).
    """
    k = contact_dimension(a, b, dimension)
    return k == dimension - 1 if faces_only else 0 <= k < dimension


def cells_overlap(a: TreeCell, b: TreeCell, dimension: int) -> bool:
    """Whether two cells' interiors intersect (for dyadic cells: one is an ancestor of the other)."""
    return contact_dimension(a, b, dimension) == dimension


def same_level_neighbors(cell: TreeCell, dimension: int, *, faces_only: bool = False) -> list[TreeCell]:
    """The cells of the same level that touch ``cell`` inside the unit box, in increasing offset order.

    At most ``3^d - 1`` cells (``2 d`` with ``faces_only``).
    """
    return [TreeCell(level=cell.level, morton_index=code)
            for code in _neighbor_indices(cell, dimension, faces_only)]


def _neighbor_indices(cell: TreeCell, dimension: int, faces_only: bool) -> list[int]:
    coords = tree_coordinates(cell, dimension)
    top = (1 << cell.level) - 1
    out = []
    for offset in neighbor_offsets(dimension, faces_only):
        moved = [c + o for c, o in zip(coords, offset)]
        if all(0 <= c <= top for c in moved):
            out.append(morton_encode(moved))
    return out


@functools.cache
def neighbor_offsets(dimension: int, faces_only: bool) -> tuple[tuple[int, ...], ...]:
    """Coordinate offsets of the touching cells of one level: the ``3^d - 1`` of the surrounding
    block, or the ``2 d`` face neighbours with ``faces_only``."""
    if faces_only:
        out = []
        for j in range(dimension):
            for step in (-1, 1):
                offset = [0] * dimension
                offset[j] = step
                out.append(tuple(offset))
        return tuple(out)
    return tuple(o for o in itertools.product((-1, 0, 1), repeat=dimension) if any(o))


# --------------------------------------------------------------------------------------------
# Cell lists (irregular partitions of the unit box)
# --------------------------------------------------------------------------------------------


def check_partition(cells: Iterable[TreeCell], dimension: int) -> tuple[TreeCell, ...]:
    """Return the cells if they partition ``[0, 1]^d`` exactly; otherwise raise.

    Dyadic cells are either nested or disjoint, so the list is a partition iff no cell repeats
    or contains another, and the volumes ``2^(-l d)`` sum to exactly 1 (checked on integers at
    the deepest level present).

    Raises
    ------
    TypeError
        A cell is not a :class:`TreeCell`.
    InvalidParameterError
        A cell is invalid for ``dimension``, two cells overlap (the message names them), or the
        cells leave gaps (the message gives the covered volume).
    """
    cells = tuple(cells)
    if not cells:
        raise InvalidParameterError("a cell list needs at least one cell")
    for cell in cells:
        check_tree_cell(cell, dimension)
    by_level: dict[int, set[int]] = {}
    for cell in sorted(cells):
        members = by_level.setdefault(cell.level, set())
        if cell.morton_index in members:
            raise InvalidParameterError(f"cell list repeats {cell}")
        for level, indices in by_level.items():
            if level < cell.level and cell.morton_index >> ((cell.level - level) * dimension) in indices:
                ancestor = TreeCell(level=level, morton_index=cell.morton_index >> ((cell.level - level) * dimension))
                raise InvalidParameterError(f"cell list overlaps: {ancestor} contains {cell}")
        members.add(cell.morton_index)
    deepest = max(by_level)
    covered = sum(len(indices) << ((deepest - level) * dimension) for level, indices in by_level.items())
    total = 1 << (deepest * dimension)
    if covered != total:
        raise InvalidParameterError(
            f"cell list must cover the unit box exactly, but covers volume {Fraction(covered, total)} (gaps)")
    return cells


class CellLocator:
    """Constant-time lookups in a cell list that partitions the unit box.

    One dict per level maps the Morton index of a listed cell to its position; a point (or any
    finer cell) is located by probing its ancestor at each listed level, so a lookup costs one
    Morton encoding plus at most one dict probe per distinct level, never a scan.

    Parameters
    ----------
    cells : sequence of TreeCell
        A partition of ``[0, 1]^d`` (validated with :func:`check_partition`).
    dimension : int
        ``d``.
    """

    __slots__ = ("_by_level", "_cells", "_dimension", "_levels", "_max_level")

    def __init__(self, cells: Sequence[TreeCell], dimension: int) -> None:
        self._cells = check_partition(cells, dimension)
        self._dimension = dimension
        by_level: dict[int, dict[int, int]] = {}
        for position, cell in enumerate(self._cells):
            by_level.setdefault(cell.level, {})[cell.morton_index] = position
        self._levels = tuple(sorted(by_level))
        self._by_level = tuple(by_level[level] for level in self._levels)
        self._max_level = self._levels[-1]

    @property
    def cells(self) -> tuple[TreeCell, ...]:
        """The listed cells, in their given order (positions are indices into this tuple)."""
        return self._cells

    @property
    def max_level(self) -> int:
        """Deepest level in the list."""
        return self._max_level

    def locate_index(self, level: int, morton_index: int) -> int | None:
        """Position of the listed cell containing the level-``level`` cell ``morton_index``.

        ``None`` when that cell is not inside one listed cell (it is split among finer ones).
        """
        d = self._dimension
        for listed_level, table in zip(self._levels, self._by_level):
            if listed_level > level:
                return None
            position = table.get(morton_index >> ((level - listed_level) * d))
            if position is not None:
                return position
        return None

    def locate(self, unit_point: Sequence[float]) -> int:
        """Position of the listed cell holding a normalized point of ``[0, 1]^d``."""
        level = self._max_level
        code = tree_index_of(unit_point, level)
        d = self._dimension
        for listed_level, table in zip(self._levels, self._by_level):
            position = table.get(code >> ((level - listed_level) * d))
            if position is not None:
                return position
        raise AssertionError("a validated partition holds every point")  # pragma: no cover


def cell_adjacency(cells: Sequence[TreeCell], dimension: int, *,
                   faces_only: bool = False) -> list[tuple[int, ...]]:
    """For each cell of a partition, the sorted positions of the cells that touch it.

    Works across levels. A finer-or-equal cell ``B`` touches a coarser-or-equal cell ``A`` iff
    one of ``B``'s same-level neighbours lies inside ``A`` (clamp ``B``'s coordinates into ``A``'s
    range: each moves by at most one), so probing the same-level neighbours of every cell through
    a :class:`CellLocator` finds every touching pair from its finer side. Cost
    ``O(n 3^d L)`` dict probes for ``n`` cells over ``L`` levels (``O(n 2 d L)`` with ``faces_only``).

    Parameters
    ----------
    cells : sequence of TreeCell
        A partition of the unit box.
    dimension : int
    faces_only : bool
        Count only cells sharing part of a ``(d - 1)``-dimensional face.
    """
    locator = CellLocator(cells, dimension)
    neighbors: list[set[int]] = [set() for _ in locator.cells]
    for i, cell in enumerate(locator.cells):
        for neighbor in _neighbor_indices(cell, dimension, faces_only):
            j = locator.locate_index(cell.level, neighbor)
            if j is not None and j != i:
                neighbors[i].add(j)
                neighbors[j].add(i)
    return [tuple(sorted(s)) for s in neighbors]
