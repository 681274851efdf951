"""Shared cell geometry: grid and Morton conventions, bounds, partitions, touching cells."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ldp_client.encoders.base import NumericDomain
from ldp_client.encoders.geometry import (
    CellLocator,
    TreeCell,
    cell_adjacency,
    cells_overlap,
    cells_touch,
    check_partition,
    check_tree_cell,
    clamp_point,
    contact_dimension,
    grid_cell_bounds,
    grid_cell_of,
    grid_index,
    grid_multi_index,
    grid_size,
    max_tree_level,
    morton_decode,
    morton_encode,
    same_level_neighbors,
    tree_ancestor,
    tree_cell_bounds,
    tree_cell_of,
    tree_children,
    tree_coordinates,
    tree_coordinates_of,
    tree_index_of,
    tree_integer_box,
    tree_parent,
)
from ldp_client.errors import InvalidParameterError

unit_floats = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


def cell(level: int, index: int) -> TreeCell:
    return TreeCell(level=level, morton_index=index)


def at(level: int, *coords: int) -> TreeCell:
    """The tree cell of ``level`` with integer coordinates ``coords``."""
    return cell(level, morton_encode(coords))


def exact_box(c: TreeCell, d: int) -> tuple[list[Fraction], list[Fraction]]:
    coords = tree_coordinates(c, d)
    side = Fraction(1, 2**c.level)
    return [x * side for x in coords], [(x + 1) * side for x in coords]


# ------------------------------------------------------------------------------------------------
# Uniform grid
# ------------------------------------------------------------------------------------------------


def test_grid_index_is_row_major_last_dimension_fastest() -> None:
    m = (2, 3)
    assert [grid_index(mi, m) for mi in itertools.product(range(2), range(3))] == list(range(6))
    assert grid_index((1, 2), m) == 5
    assert grid_multi_index(4, m) == (1, 1)
    assert grid_index((1, 0, 3), (2, 5, 4)) == 1 * 20 + 0 * 4 + 3


@given(st.lists(st.integers(1, 40), min_size=1, max_size=5), st.data())
def test_grid_index_round_trip(cells: list[int], data: st.DataObject) -> None:
    multi = tuple(data.draw(st.integers(0, m - 1)) for m in cells)
    index = grid_index(multi, cells)
    assert 0 <= index < grid_size(cells)
    assert grid_multi_index(index, cells) == multi


def test_grid_index_rejects_out_of_range() -> None:
    with pytest.raises(InvalidParameterError, match="coordinate 1"):
        grid_index((0, 3), (2, 3))
    with pytest.raises(InvalidParameterError, match=r"\[0, 6\)"):
        grid_multi_index(6, (2, 3))
    with pytest.raises(TypeError):
        grid_multi_index(1.0, (2, 3))  # type: ignore[arg-type]


@given(st.lists(st.tuples(unit_floats, st.integers(1, 1000)), min_size=1, max_size=4))
def test_point_to_grid_cell_is_exact_and_bounds_contain_it(pairs: list[tuple[float, int]]) -> None:
    unit = [t for t, _ in pairs]
    cells = [m for _, m in pairs]
    multi = grid_cell_of(unit, cells)
    for t, m, c in zip(unit, cells, multi):
        assert 0 <= c < m
        if t < 1.0:
            assert Fraction(c, m) <= Fraction(t) < Fraction(c + 1, m)
        else:
            assert c == m - 1
    lower, upper = grid_cell_bounds(grid_index(multi, cells), cells)
    assert all(lo <= t <= hi for lo, t, hi in zip(lower, unit, upper))


def test_grid_floor_is_exact_where_float_multiplication_is_not() -> None:
    # 0.7 * 10 == 7.000000000000001 in floats, but 0.7 (a float just below 7/10) is in cell 6.
    assert Fraction(0.7) < Fraction(7, 10)
    assert grid_cell_of([0.7], [10]) == (6,)
    lower, upper = grid_cell_bounds(6, [10])
    assert lower[0] <= 0.7 <= upper[0]


def test_grid_bounds_in_original_units() -> None:
    domain = NumericDomain(lower=(-1.0, 10.0), upper=(1.0, 20.0))
    lower, upper = grid_cell_bounds(grid_index((1, 4), (2, 5)), (2, 5), domain)
    assert lower == (0.0, 18.0)
    assert upper == (1.0, 20.0)


# ------------------------------------------------------------------------------------------------
# Morton codes and the dyadic tree
# ------------------------------------------------------------------------------------------------


def test_morton_convention_dimension_zero_is_the_low_bit_of_each_group() -> None:
    assert morton_encode((1, 0)) == 0b01
    assert morton_encode((0, 1)) == 0b10
    assert morton_encode((3, 0)) == 0b0101
    assert morton_encode((2, 3)) == 0b1110  # group 1: bits (1, 1); group 0: (c1=1, c0=0)
    assert morton_encode((1, 0, 0)) == 1 and morton_encode((0, 0, 1)) == 4
    assert morton_encode((0b100,)) == 0b100  # d = 1: the identity
    assert morton_decode(0b1110, 2, 2) == (2, 3)
    # Beyond one byte per coordinate (the table-driven path).
    assert morton_encode((0x1FF, 0)) == sum(1 << (2 * b) for b in range(9))


@given(st.integers(1, 6), st.data())
def test_morton_round_trip_and_bit_layout(d: int, data: st.DataObject) -> None:
    level = data.draw(st.integers(0, max_tree_level(d)))
    coords = tuple(data.draw(st.integers(0, 2**level - 1)) for _ in range(d))
    code = morton_encode(coords)
    assert code < 2 ** (level * d)
    assert morton_decode(code, d, level) == coords
    for j, c in enumerate(coords):
        for b in range(level):
            assert (code >> (b * d + j)) & 1 == (c >> b) & 1


@given(st.integers(1, 5), st.data())
def test_parent_and_children(d: int, data: st.DataObject) -> None:
    level = data.draw(st.integers(1, max_tree_level(d)))
    c = cell(level, data.draw(st.integers(0, 2 ** (level * d) - 1)))
    parent = tree_parent(c, d)
    assert parent == cell(level - 1, c.morton_index >> d)
    assert tree_coordinates(parent, d) == tuple(x >> 1 for x in tree_coordinates(c, d))
    assert tree_ancestor(c, d, level) == c
    assert tree_ancestor(c, d, 0) == cell(0, 0)
    if level < max_tree_level(d):
        children = tree_children(c, d)
        assert children == tuple(cell(level + 1, (c.morton_index << d) | j) for j in range(2**d))
        assert all(tree_parent(child, d) == c for child in children)
        # bit i of j is the new low bit of coordinate i
        for j, child in enumerate(children):
            assert tree_coordinates(child, d) == tuple(2 * x + ((j >> i) & 1)
                                                       for i, x in enumerate(tree_coordinates(c, d)))
        # children tile the parent exactly
        assert sum(Fraction(1, 2 ** ((level + 1) * d)) for _ in children) == Fraction(1, 2 ** (level * d))


def test_tree_edge_cases() -> None:
    with pytest.raises(InvalidParameterError, match="no parent"):
        tree_parent(cell(0, 0), 2)
    with pytest.raises(InvalidParameterError, match="64 index bits"):
        tree_children(cell(32, 0), 2)
    with pytest.raises(InvalidParameterError):
        check_tree_cell(cell(33, 0), 2)
    with pytest.raises(InvalidParameterError, match="morton_index"):
        check_tree_cell(cell(1, 4), 2)
    with pytest.raises(TypeError):
        check_tree_cell((1, 0), 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        TreeCell(level=1.0, morton_index=0)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError):
        TreeCell(level=-1, morton_index=0)
    assert max_tree_level(1) == 64 and max_tree_level(10) == 6 and max_tree_level(65) == 0


@given(st.lists(unit_floats, min_size=1, max_size=5), st.data())
def test_point_to_tree_cell_to_bounds_contains_the_point(point: list[float], data: st.DataObject) -> None:
    d = len(point)
    level = data.draw(st.integers(0, max_tree_level(d)))
    c = tree_cell_of(point, level)
    check_tree_cell(c, d)
    assert c.morton_index == tree_index_of(point, level) == morton_encode(tree_coordinates_of(point, level))
    lower, upper = exact_box(c, d)
    for t, lo, hi in zip(point, lower, upper):
        assert lo <= Fraction(t)
        assert Fraction(t) < hi or (t == 1.0 and hi == 1)
    flo, fhi = tree_cell_bounds(c, d)
    assert all(lo <= t <= hi for lo, t, hi in zip(flo, point, fhi))
    if level > 0:  # the cell of a point at level l - 1 is the parent of its level-l cell
        assert tree_cell_of(point, level - 1) == tree_parent(c, d)


def test_tree_bounds_in_original_units() -> None:
    domain = NumericDomain(lower=(0.0, -8.0), upper=(4.0, 8.0))
    c = at(2, 3, 1)  # [3/4, 1] x [1/4, 1/2]
    assert tree_cell_bounds(c, 2) == ((0.75, 0.25), (1.0, 0.5))
    assert tree_cell_bounds(c, 2, domain) == ((3.0, -4.0), (4.0, 0.0))
    assert tree_integer_box(c, 2, 3) == ((6, 2), (8, 4))


def test_clamp_point() -> None:
    domain = NumericDomain(lower=(0, -1.0), upper=(1, 1.0))
    assert clamp_point([-5.0, 3.0], domain) == [0.0, 1.0]
    assert all(isinstance(x, float) for x in clamp_point([-5.0, 3.0], domain))


# ------------------------------------------------------------------------------------------------
# Touching and overlapping cells
# ------------------------------------------------------------------------------------------------


def test_touching_hand_cases_in_two_dimensions() -> None:
    d = 2
    big = at(1, 0, 0)  # [0, 1/2]^2
    face = at(2, 2, 0)  # [1/2, 3/4] x [0, 1/4]: shares part of the face x = 1/2
    corner = at(2, 2, 2)  # [1/2, 3/4]^2: meets big only at the corner (1/2, 1/2)
    apart = at(2, 3, 0)  # [3/4, 1] x [0, 1/4]
    inner = at(2, 1, 1)  # inside big
    assert contact_dimension(big, face, d) == 1
    assert contact_dimension(big, corner, d) == 0
    assert contact_dimension(big, apart, d) == -1
    assert contact_dimension(big, inner, d) == 2
    assert cells_touch(big, face, d) and cells_touch(big, face, d, faces_only=True)
    assert cells_touch(big, corner, d) and not cells_touch(big, corner, d, faces_only=True)
    assert not cells_touch(big, apart, d)
    assert not cells_touch(big, inner, d) and cells_overlap(big, inner, d) and cells_overlap(big, big, d)
    assert not cells_touch(big, big, d)
    # same level, diagonal neighbours
    assert contact_dimension(at(1, 0, 0), at(1, 1, 1), d) == 0
    # very different sizes: a level-5 sliver against the far side of a level-1 cell
    assert cells_touch(at(1, 1, 0), at(5, 15, 3), d, faces_only=True)
    assert not cells_touch(at(1, 1, 0), at(5, 14, 3), d)
    # one dimension: intervals
    assert cells_touch(at(1, 0), at(3, 4), 1) and not cells_touch(at(1, 0), at(3, 5), 1)


def test_touching_in_three_dimensions_edge_contact() -> None:
    d = 3
    a = at(1, 0, 0, 0)
    edge = at(1, 1, 1, 0)  # shares the edge x = y = 1/2
    assert contact_dimension(a, edge, d) == 1
    assert cells_touch(a, edge, d) and not cells_touch(a, edge, d, faces_only=True)


def tree_cells(d: int, max_level: int) -> st.SearchStrategy[TreeCell]:
    return st.integers(0, max_level).flatmap(
        lambda level: st.builds(lambda i: cell(level, i), st.integers(0, 2 ** (level * d) - 1)))


@settings(max_examples=300)
@given(st.integers(1, 3).flatmap(lambda d: st.tuples(st.just(d), tree_cells(d, 4), tree_cells(d, 4))))
def test_touching_is_symmetric_and_matches_exact_boxes(args: tuple[int, TreeCell, TreeCell]) -> None:
    d, a, b = args
    k = contact_dimension(a, b, d)
    assert k == contact_dimension(b, a, d)
    assert cells_touch(a, b, d) == cells_touch(b, a, d)
    alo, ahi = exact_box(a, d)
    blo, bhi = exact_box(b, d)
    lengths = [min(ahi[j], bhi[j]) - max(alo[j], blo[j]) for j in range(d)]
    expected = -1 if any(x < 0 for x in lengths) else sum(1 for x in lengths if x > 0)
    assert k == expected
    if k == d:  # dyadic cells overlap only when nested
        low, high = sorted((a, b), key=lambda c: c.level)
        assert tree_ancestor(high, d, low.level) == low


def test_same_level_neighbors() -> None:
    assert len(same_level_neighbors(at(2, 1, 1), 2)) == 8
    assert len(same_level_neighbors(at(2, 0, 0), 2)) == 3
    assert len(same_level_neighbors(at(2, 1, 1), 2, faces_only=True)) == 4
    assert len(same_level_neighbors(at(2, 1, 1, 1), 3)) == 26
    assert same_level_neighbors(cell(0, 0), 2) == []
    for n in same_level_neighbors(at(3, 0, 5), 2):
        assert cells_touch(n, at(3, 0, 5), 2)


# ------------------------------------------------------------------------------------------------
# Cell lists
# ------------------------------------------------------------------------------------------------


@st.composite
def partitions(draw: st.DrawFn, d: int, max_level: int = 4) -> list[TreeCell]:
    """A random partition of the unit box by repeated splitting."""
    cells = [cell(0, 0)]
    for _ in range(draw(st.integers(0, 8))):
        candidates = [i for i, c in enumerate(cells) if c.level < max_level]
        if not candidates:
            break
        i = draw(st.sampled_from(candidates))
        cells[i:i + 1] = list(tree_children(cells[i], d))
    return draw(st.permutations(cells))


@settings(max_examples=100)
@given(st.integers(1, 3).flatmap(lambda d: st.tuples(st.just(d), partitions(d))))
def test_generated_partitions_are_accepted_and_defects_caught(args: tuple[int, list[TreeCell]]) -> None:
    d, cells = args
    assert check_partition(cells, d) == tuple(cells)
    if len(cells) > 1:
        with pytest.raises(InvalidParameterError, match="gaps"):
            check_partition(cells[1:], d)
    with pytest.raises(InvalidParameterError, match="repeats"):
        check_partition([*cells, cells[0]], d)
    deep = [c for c in cells if c.level < max_tree_level(d)]
    if deep:
        child = tree_children(deep[0], d)[-1]
        with pytest.raises(InvalidParameterError, match="overlaps"):
            check_partition([*cells, child], d)
    if cells[0].level > 0:  # adding an ancestor also overlaps
        with pytest.raises(InvalidParameterError, match="overlaps"):
            check_partition([*cells, tree_parent(cells[0], d)], d)


def test_partition_hand_cases() -> None:
    quarters = [at(1, 0, 0), at(1, 1, 0), at(1, 0, 1), at(1, 1, 1)]
    check_partition(quarters, 2)
    check_partition([cell(0, 0)], 2)
    with pytest.raises(InvalidParameterError, match="3/4"):
        check_partition(quarters[:3], 2)
    with pytest.raises(InvalidParameterError, match="overlaps"):
        # same total volume, but two small cells replace a quarter inside another quarter
        check_partition(quarters[:3] + [at(2, 0, 0), at(2, 1, 0), at(2, 0, 1), at(2, 1, 1)], 2)
    with pytest.raises(InvalidParameterError, match="at least one"):
        check_partition([], 2)
    with pytest.raises(InvalidParameterError):
        check_partition([cell(1, 4)], 2)


@settings(max_examples=60)
@given(st.integers(1, 3).flatmap(lambda d: st.tuples(st.just(d), partitions(d), st.lists(unit_floats, min_size=3,
                                                                                          max_size=3))))
def test_locator_finds_the_cell_holding_a_point(args: tuple[int, list[TreeCell], list[float]]) -> None:
    d, cells, coords = args
    point = coords[:d]
    locator = CellLocator(cells, d)
    position = locator.locate(point)
    holders = [i for i, c in enumerate(cells) if tree_cell_of(point, c.level) == c]
    assert holders == [position]
    assert locator.locate_index(locator.max_level, tree_index_of(point, locator.max_level)) == position


@settings(max_examples=60)
@given(st.integers(1, 3).flatmap(lambda d: st.tuples(st.just(d), partitions(d), st.booleans())))
def test_adjacency_matches_pairwise_touching(args: tuple[int, list[TreeCell], bool]) -> None:
    d, cells, faces_only = args
    assume(len(cells) <= 40)
    adjacency = cell_adjacency(cells, d, faces_only=faces_only)
    for i, a in enumerate(cells):
        expected = tuple(j for j, b in enumerate(cells) if j != i and cells_touch(a, b, d, faces_only=faces_only))
        assert adjacency[i] == expected


def test_adjacency_hand_case_different_sizes() -> None:
    # Left half split into quarters of quarters on the bottom-left; right half whole.
    cells = [at(1, 1, 0), at(1, 1, 1), at(1, 0, 1), at(2, 1, 0), at(2, 0, 1), at(2, 1, 1),
             at(3, 0, 0), at(3, 1, 0), at(3, 0, 1), at(3, 1, 1)]
    check_partition(cells, 2)
    adjacency = cell_adjacency(cells, 2, faces_only=True)
    # the right-bottom quarter [1/2,1]x[0,1/2] shares faces with the top-right quarter and the
    # level-2 cell (1, 0) = [1/4, 1/2] x [0, 1/4] and the level-2 cell (1, 1).
    assert adjacency[0] == (1, 3, 5)
    queen = cell_adjacency(cells, 2)
    assert 2 in queen[0]  # [0,1/2]x[1/2,1] meets [1/2,1]x[0,1/2] at the centre corner
    assert 9 not in queen[0]
