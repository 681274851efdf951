"""Grid clustering math (AGCluster, DESIGN.md §7.2): granularity, the tree walk, IterAdaptive, aggregation.

Everything here is deterministic: hand-built cells and counts with the expected decisions worked
out in the comments, closed forms recomputed independently of the module, and hypothesis for the
partition invariants (random counts on small uniform grids).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ldp_client.encoders.geometry import (
    TreeCell,
    cells_touch,
    check_partition,
    morton_encode,
    tree_cell_bounds,
    tree_children,
    tree_parent,
)
from ldp_client.errors import InvalidParameterError
from ldp_collector.estimation.grid_clustering import (
    CORNER_TOUCH_MAX_DIMENSION,
    CellAggregation,
    aggregate_cells,
    cell_volumes,
    consistent_granularity,
    dense_fraction,
    dense_mask,
    iterate_cells,
    level_for_side,
    oracle_variance,
    paper_granularity,
    touching,
    tree_height_range,
    tree_level_step,
    uniform_cells,
)

HYPOTHESIS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def cell(level: int, *coords: int) -> TreeCell:
    """The tree cell at integer coordinates ``coords`` of ``level``."""
    return TreeCell(level=level, morton_index=morton_encode(coords))


def grid_counts(level: int, dimension: int, values: Mapping[Any, float]) -> np.ndarray:
    """Counts of the uniform level in Morton order: ``values`` by coordinates, 0 elsewhere."""
    counts: np.ndarray = np.zeros(2 ** (level * dimension))
    for coords, value in values.items():
        counts[morton_encode(coords)] = value
    return counts


def volume(cells: Sequence[TreeCell], dimension: int) -> float:
    return math.fsum(math.ldexp(1.0, -c.level * dimension) for c in cells)


# -- granularity -----------------------------------------------------------------------------------


def theorem_1(n: float, epsilon: float, d: int, r: float) -> float:
    """Theorem 1 as printed, straight from the formula (small enough N not to overflow)."""
    return float((2.0 * n**2 * (math.exp(epsilon) - 1.0) ** 2 * r ** (-1.0 / d)) ** (-1.0 / (d + 1)))


def test_paper_granularity_reproduces_the_numbers_design_md_quotes() -> None:
    # N = 15 000, eps = 5, d = 2, r = 1: (2 * 2.25e8 * 147.41^2)^(-1/3) = 4.67e-5, "about 4e-5".
    m = paper_granularity(15_000, 5.0, 2, 1.0)
    assert m == pytest.approx(theorem_1(15_000, 5.0, 2, 1.0), rel=1e-12)
    assert 3.5e-5 < m < 5e-5
    assert 1.0 / m > 20_000  # "25 000 cells per dimension": absurdly fine
    # The credit-card example (N = 300 000, d = 24, eps = 1): about 0.34, not the paper's 0.014.
    m = paper_granularity(300_000, 1.0, 24, 1.0)
    assert m == pytest.approx(theorem_1(300_000, 1.0, 24, 1.0), rel=1e-12)
    assert m == pytest.approx(0.34, abs=0.005)
    # r enters as r^(-1/d) inside the base: a smaller occupied share makes m finer.
    assert paper_granularity(15_000, 5.0, 2, 0.1) == pytest.approx(theorem_1(15_000, 5.0, 2, 0.1), rel=1e-12)
    assert paper_granularity(15_000, 5.0, 2, 0.1) < paper_granularity(15_000, 5.0, 2, 1.0)


def test_paper_granularity_is_computed_in_logarithms() -> None:
    # The base 2 N^2 (e^eps - 1)^2 overflows a float for N = 1e160; the log form does not.
    n, eps, d = 1e160, 20.0, 3
    log_base = math.log(2.0) + 2 * math.log(n) + 2 * math.log(math.expm1(eps))
    assert paper_granularity(n, eps, d, 1.0) == pytest.approx(math.exp(-log_base / (d + 1)), rel=1e-12)


@pytest.mark.parametrize("args,match", [
    ((0.0, 1.0, 2, 0.5), "N must be positive"),
    ((100.0, 1.0, 2, 0.0), r"share r must be in \(0, 1\]"),
    ((100.0, 1.0, 2, 1.5), r"share r must be in \(0, 1\]"),
    ((100.0, 1.0, 2, math.nan), "share r"),
])
def test_paper_granularity_rejects_bad_arguments(args: tuple[float, float, int, float], match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        paper_granularity(*args)


def test_oracle_variance_is_the_oue_olh_variance() -> None:
    for eps in (0.1, 1.0, 4.0, 20.0):
        assert oracle_variance(eps) == pytest.approx(4 * math.exp(eps) / (math.exp(eps) - 1) ** 2, rel=1e-12)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(InvalidParameterError, match="epsilon"):
            oracle_variance(bad)


CONSISTENT_CASES = [(20_000, 4.0, 2, 0.2), (15_000, 5.0, 2, 1.0), (1e6, 1.0, 3, 0.05), (300_000, 1.0, 24, 0.5),
                    (500, 0.5, 1, 0.7)]


@pytest.mark.parametrize("n,eps,d,r", CONSISTENT_CASES)
def test_consistent_granularity_closed_form(n: float, eps: float, d: int, r: float) -> None:
    v = 4 * math.exp(eps) / math.expm1(eps) ** 2
    expected = r ** (1 / d) * (math.sqrt(n * v) / (2 * n)) ** (1 / (d + 1))
    assert consistent_granularity(n, v, d, r) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n,eps,d,r", CONSISTENT_CASES)
def test_consistent_granularity_minimizes_the_point_loss(n: float, eps: float, d: int, r: float) -> None:
    """m* is the argmin of L(m) = r sigma m^-d + 2 d N r^(-1/d) m, found on a fine log grid of m."""
    v = oracle_variance(eps)
    sigma = math.sqrt(n * v)
    m_star = consistent_granularity(n, v, d, r)
    m = np.logspace(-6, 1, 700_001)  # step 2.3e-5 in ln m

    def loss(x: np.ndarray) -> np.ndarray:
        out: np.ndarray = r * sigma * x ** (-float(d)) + 2 * d * n * r ** (-1 / d) * x
        return out

    grid_best = m[np.argmin(loss(m))]
    assert grid_best == pytest.approx(m_star, rel=1e-4)
    # And it is a strict minimum: 1 % away on either side costs more.
    at = float(loss(np.array([m_star]))[0])
    assert at < float(loss(np.array([0.99 * m_star]))[0]) and at < float(loss(np.array([1.01 * m_star]))[0])


def test_consistent_granularity_monotonicity_and_errors() -> None:
    base = consistent_granularity(20_000, oracle_variance(4.0), 2, 0.3)
    assert consistent_granularity(80_000, oracle_variance(4.0), 2, 0.3) < base  # more reports: finer
    assert consistent_granularity(20_000, oracle_variance(8.0), 2, 0.3) < base  # less noise: finer
    assert consistent_granularity(20_000, oracle_variance(4.0), 2, 0.1) < base  # data more concentrated: finer
    with pytest.raises(InvalidParameterError, match="N must be positive"):
        consistent_granularity(0, 1.0, 2, 0.5)
    with pytest.raises(InvalidParameterError, match="variance must be positive"):
        consistent_granularity(10, 0.0, 2, 0.5)
    with pytest.raises(InvalidParameterError, match="share r"):
        consistent_granularity(10, 1.0, 2, 0.0)


# -- levels and tree height --------------------------------------------------------------------------


@pytest.mark.parametrize("side,d,kwargs,level", [
    (0.25, 2, {}, 2),                    # exact power of two
    (0.3, 2, {}, 2),                     # -log2 = 1.74 -> 2
    (0.2, 2, {}, 2),                     # 2.32 -> 2
    (0.17, 2, {}, 3),                    # 2.56 -> 3
    (0.0535, 2, {}, 4),                  # 4.22 -> 4 (the consistent side of a moons run)
    (1.0, 2, {}, 1),                     # level 0 clamped to min_level 1
    (4.0, 2, {}, 1),                     # side above the box
    (1.0, 2, {"min_level": 0}, 0),
    (1e-6, 2, {"max_level": 3}, 3),      # clamped to max_level
    (1e-30, 2, {}, 32),                  # default max: 64-bit Morton indices (64 // d)
    (1e-30, 3, {}, 21),
    (1e-6, 2, {"max_cells": 4096}, 6),   # 2^(6 * 2) = 4096 cells
    (1e-6, 2, {"max_cells": 4095}, 5),   # one cell fewer: level 6 no longer fits
    (1e-6, 3, {"max_cells": 1000}, 3),   # 512 <= 1000 < 4096
    (1e-6, 2, {"max_cells": 4096, "max_level": 4}, 4),
    (0.5, 2, {"max_cells": 1 << 20}, 1),  # max_cells only caps, never raises
    (0.01, 2, {"max_cells": 3}, 0),      # max_cells wins over min_level: not even level 1 fits
])
def test_level_for_side(side: float, d: int, kwargs: dict[str, int], level: int) -> None:
    assert level_for_side(side, d, **kwargs) == level


@pytest.mark.parametrize("side", [0.0, -0.1, math.inf, math.nan])
def test_level_for_side_rejects_bad_sides(side: float) -> None:
    with pytest.raises(InvalidParameterError, match="cell side"):
        level_for_side(side, 2)


@pytest.mark.parametrize("side,r,d", [(0.05, 0.2, 2), (0.01, 0.5, 3), (0.3, 0.01, 1), (1e-3, 0.9, 5)])
def test_tree_height_range_is_theorem_3(side: float, r: float, d: int) -> None:
    low, high = tree_height_range(side, r, d)
    assert low == pytest.approx(math.log2(1 / side), rel=1e-12)
    assert high == pytest.approx(1 + math.log(1 / side) / (1 - r) + d * math.log(2), rel=1e-12)
    assert low < high


def test_tree_height_range_without_upper_bound_and_errors() -> None:
    low, high = tree_height_range(0.125, 1.0, 2)
    assert low == pytest.approx(3.0) and high == math.inf
    with pytest.raises(InvalidParameterError, match="share r"):
        tree_height_range(0.125, 0.0, 2)


# -- dense cells ---------------------------------------------------------------------------------------


def test_dense_mask_takes_the_larger_threshold() -> None:
    n, z = 1000.0, 2.0
    v = np.full(6, 1 / 16)  # uniform share n V = 62.5
    # Share branch (n V = 62.5 > z sigma = 20): 62.5 passes, 62.4 fails, whatever the SE.
    # SE branch (z sigma = 100 > 62.5): 100 passes, 99 fails although both are above the share.
    # A zero SE does not make an empty cell dense; a huge SE hides a huge count.
    counts = np.array([62.5, 62.4, 100.0, 99.0, 0.0, 1e9])
    se = np.array([10.0, 10.0, 50.0, 50.0, 0.0, 1e9])
    assert dense_mask(counts, se, v, n, z=z).tolist() == [True, False, True, False, False, False]
    # share_factor scales only the share branch.
    assert dense_mask([124.0, 126.0], [1.0, 1.0], [1 / 16, 1 / 16], n, z=z, share_factor=2.0).tolist() == [False, True]
    # Volumes per cell: a cell four times larger needs four times the count.
    assert dense_mask([100.0, 100.0], [1.0, 1.0], [1 / 16, 1 / 4], n, z=z).tolist() == [True, False]


def test_dense_fraction_is_one_when_nothing_is_dense() -> None:
    level, d, n = 2, 2, 1600.0  # 16 cells, share 100
    counts = grid_counts(level, d, {(0, 0): 500.0, (1, 0): 300.0, (3, 3): 150.0})
    se = np.full(16, 10.0)
    assert dense_fraction(counts, se, n, d, level, z=2.0) == pytest.approx(3 / 16)
    # Nothing dense (a very noisy estimate): r is 1 (the coarsest grid), never 0.
    assert dense_fraction(counts, np.full(16, 1000.0), n, d, level, z=2.0) == 1.0


# -- TreeAdaptive -----------------------------------------------------------------------------------------


def test_tree_level_step_hand_built_2d() -> None:
    """Level 2 of [0, 1]^2 (4 x 4): one dense cell at (1, 1); n = 1600 so the share is 100."""
    d, n = 2, 1600.0
    candidates = uniform_cells(2, d)
    counts = grid_counts(2, d, {(1, 1): 500.0, (3, 3): 90.0})  # (3, 3): above z sigma, below the share
    se = np.full(16, 10.0)
    step = tree_level_step(candidates, counts, se, n, d, z=2.0, last=False)
    assert step.dense == 1
    # The dense cell is final (dense); its 8 queen neighbours (which include its 3 siblings) are refined;
    # the 7 cells of the last row and column touch no dense cell and have no dense sibling: final, sparse.
    refined = {cell(2, x, y) for x in range(3) for y in range(3)} - {cell(2, 1, 1)}
    isolated = {cell(2, 3, y) for y in range(4)} | {cell(2, x, 3) for x in range(3)}
    assert dict(zip(step.final, step.final_dense)) == {cell(2, 1, 1): True, **dict.fromkeys(isolated, False)}
    assert set(step.refine) == {ch for c in refined for ch in tree_children(c, d)}
    assert len(step.refine) == 4 * len(refined)
    check_partition([*step.final, *step.refine], d)


def test_tree_level_step_sibling_rule_without_contact() -> None:
    """In d = 4 only faces touch: a sibling at the opposite corner of the parent is refined for being a sibling."""
    d, n = 4, 2560.0  # level 2: 256 cells, share 10
    assert d > CORNER_TOUCH_MAX_DIMENSION
    candidates = uniform_cells(2, d)
    counts = np.zeros(256)
    counts[cell(2, 0, 0, 0, 0).morton_index] = 400.0
    step = tree_level_step(candidates, counts, np.full(256, 5.0), n, d, z=2.0, last=False)
    refined = {tree_parent(ch, d) for ch in step.refine}
    assert cell(2, 1, 1, 1, 1) in refined  # sibling, no shared face
    assert cell(2, 1, 1, 0, 0) in refined  # sibling, shares only a 2-d face part
    assert cell(2, 2, 0, 0, 0) not in refined  # no contact, other parent
    assert cell(2, 1, 1, 1, 2) not in refined  # other parent, touches (1, 1, 1, 1) only
    # Refined: the 15 siblings; no face neighbour lies outside the parent (the dense cell is at the box corner).
    assert refined == set(tree_children(TreeCell(level=1, morton_index=0), d)) - {cell(2, 0, 0, 0, 0)}
    assert step.final_dense.count(True) == 1 and len(step.final) == 256 - 15


def test_tree_level_step_corner_contact_counts_in_low_dimension_only() -> None:
    # d = 4: a dense cell at (1, 1, 1, 1) (last child of parent 0); (2, 2, 2, 2) touches it at a corner only.
    d = 4
    counts = np.zeros(256)
    counts[cell(2, 1, 1, 1, 1).morton_index] = 400.0
    step = tree_level_step(uniform_cells(2, d), counts, np.full(256, 5.0), 2560.0, d, z=2.0, last=False)
    refined = {tree_parent(ch, d) for ch in step.refine}
    assert cell(2, 2, 1, 1, 1) in refined  # face neighbour in another parent
    assert cell(2, 2, 2, 2, 2) not in refined
    # d = 2: a corner contact across parents refines.
    counts2 = grid_counts(2, 2, {(1, 1): 500.0})
    step2 = tree_level_step(uniform_cells(2, 2), counts2, np.full(16, 10.0), 1600.0, 2, z=2.0, last=False)
    assert cell(2, 2, 2) in {tree_parent(ch, 2) for ch in step2.refine}


def test_tree_level_step_last_level_finalizes_everything() -> None:
    d, n = 2, 1600.0
    counts = grid_counts(2, d, {(1, 1): 500.0, (2, 2): 101.0})
    se = np.full(16, 10.0)
    step = tree_level_step(uniform_cells(2, d), counts, se, n, d, z=2.0, last=True)
    assert step.refine == () and step.final == uniform_cells(2, d)
    assert list(step.final_dense) == dense_mask(counts, se, np.full(16, 1 / 16), n, z=2.0).tolist()
    assert step.dense == 2


def test_tree_level_step_dense_above() -> None:
    """Level-2 children of the level-1 cell (1, 0), next to a dense final level-1 cell (0, 0)."""
    d, n = 2, 1600.0
    candidates = sorted(tree_children(cell(1, 1, 0), d))  # level-2 (2..3, 0..1)
    zeros, se = np.zeros(4), np.full(4, 10.0)
    alone = tree_level_step(candidates, zeros, se, n, d, z=2.0, last=False)
    assert alone.refine == () and set(alone.final) == set(candidates) and alone.dense == 0
    above = tree_level_step(candidates, zeros, se, n, d, z=2.0, last=False, dense_above=[cell(1, 0, 0)])
    # (2, 0) and (2, 1) share the face x = 1/2 with the dense level-1 cell; (3, *) do not touch it.
    assert {tree_parent(ch, d) for ch in above.refine} == {cell(2, 2, 0), cell(2, 2, 1)}
    assert set(above.final) == {cell(2, 3, 0), cell(2, 3, 1)} and not any(above.final_dense)
    # A dense cell two levels up works too: level-0 is the whole box (never a neighbour), level 1 (1, 1)
    # touches (2, 1) and (3, 1) through the face y = 1/2.
    above2 = tree_level_step(candidates, zeros, se, n, d, z=2.0, last=False, dense_above=[cell(1, 1, 1)])
    assert {tree_parent(ch, d) for ch in above2.refine} == {cell(2, 2, 1), cell(2, 3, 1)}


def test_tree_level_step_degenerate_inputs() -> None:
    empty = tree_level_step([], np.zeros(0), np.zeros(0), 10.0, 2, z=2.0, last=False)
    assert (empty.final, empty.refine, empty.dense) == ((), (), 0)
    with pytest.raises(InvalidParameterError, match="same level"):
        tree_level_step([cell(1, 0, 0), cell(2, 3, 3)], np.zeros(2), np.ones(2), 10.0, 2, z=2.0, last=False)


counts_16 = st.lists(st.sampled_from([0.0, 20.0, 60.0, 110.0, 400.0]), min_size=16, max_size=16)
counts_32 = st.lists(st.sampled_from([0.0, 10.0, 20.0, 30.0, 100.0]), min_size=32, max_size=32)


@HYPOTHESIS
@given(counts=counts_32, last=st.booleans(), use_above=st.booleans())
def test_tree_level_step_keeps_the_candidates_volume(counts: list[float], last: bool, use_above: bool) -> None:
    """Final cells plus refined children always tile exactly the candidates' region."""
    d, n = 2, 1600.0  # level 3: share 25
    # The candidates: the 32 level-3 cells inside level-1 cells (0, 0) and (1, 1); a dense level-1 cell (1, 0) above.
    candidates = sorted(grandchild for parent in (cell(1, 0, 0), cell(1, 1, 1))
                        for child in tree_children(parent, d) for grandchild in tree_children(child, d))
    step = tree_level_step(candidates, counts, np.full(32, 5.0), n, d, z=2.0, last=last,
                           dense_above=[cell(1, 1, 0)] if use_above else ())
    out = [*step.final, *step.refine]
    assert volume(out, d) == pytest.approx(volume(candidates, d), abs=0)
    assert len(set(out)) == len(out)
    # Every output cell lies in exactly one candidate, and refined cells are children of non-final candidates.
    assert set(step.final) <= set(candidates)
    assert {tree_parent(ch, d) for ch in step.refine} == set(candidates) - set(step.final)
    assert len(step.final_dense) == len(step.final) and sum(step.final_dense) == step.dense
    # Dense cells are always final (dense) and the complement of the region plus the output is a partition.
    rest = [c for c in uniform_cells(1, d) if c not in (cell(1, 0, 0), cell(1, 1, 1))]
    check_partition([*rest, *out], d)


@HYPOTHESIS
@given(counts=counts_16)
def test_tree_level_step_on_a_full_grid_is_a_partition(counts: list[float]) -> None:
    d, n = 2, 1600.0
    step = tree_level_step(uniform_cells(2, d), counts, np.full(16, 10.0), n, d, z=2.0, last=False)
    check_partition([*step.final, *step.refine], d)
    dense = dense_mask(counts, np.full(16, 10.0), np.full(16, 1 / 16), n, z=2.0)
    dense_final = {c for c, b in zip(step.final, step.final_dense) if b}
    assert {c for c, b in zip(uniform_cells(2, d), dense) if b} == dense_final


# -- IterAdaptive -----------------------------------------------------------------------------------------


def test_iterate_cells_merges_a_dense_family_and_splits_its_sparse_edge() -> None:
    """Level 2 (4 x 4), n = 1600 (share 100): the family of level-1 (0, 0), i.e. (0..1, 0..1), is dense."""
    d, n = 2, 1600.0
    cells = uniform_cells(2, d)
    counts = grid_counts(2, d, {(x, y): 300.0 for x in (0, 1) for y in (0, 1)})
    step = iterate_cells(cells, counts, np.full(16, 10.0), n, d, z=2.0, max_level=3)
    assert (step.merged, step.dense) == (1, 4) and step.changed
    # The sparse cells touching the dense block: (2, 0..2) and (0..1, 2) split into their children.
    edge = [cell(2, 2, 0), cell(2, 2, 1), cell(2, 2, 2), cell(2, 0, 2), cell(2, 1, 2)]
    assert step.split == len(edge)
    untouched = [c for c in cells if c not in edge and tree_parent(c, d) != cell(1, 0, 0)]
    expected = sorted([cell(1, 0, 0), *untouched, *(ch for c in edge for ch in tree_children(c, d))])
    assert step.cells == tuple(expected)
    check_partition(step.cells, d)
    # History: the merged parent holds the mean of its children's densities (3.0) with variance sum / 4^2.
    rho_child, var_child = 300.0 / 100.0, (10.0 / 100.0) ** 2
    assert step.history[cell(1, 0, 0)] == pytest.approx((rho_child, 4 * var_child / 16))
    assert step.history[cell(2, 3, 3)] == pytest.approx((0.0, var_child))
    assert not any(ch in step.history for c in edge for ch in tree_children(c, d))  # split children start fresh


def test_iterate_cells_max_level_stops_splitting() -> None:
    d, n = 2, 1600.0
    counts = grid_counts(2, d, {(x, y): 300.0 for x in (0, 1) for y in (0, 1)})
    step = iterate_cells(uniform_cells(2, d), counts, np.full(16, 10.0), n, d, z=2.0, max_level=2)
    assert step.split == 0 and step.merged == 1
    assert max(c.level for c in step.cells) == 2
    check_partition(step.cells, d)


def test_iterate_cells_sparse_sibling_of_dense_cells_splits() -> None:
    """Three dense cells of a family and a sparse fourth: no merge, the sparse sibling splits."""
    d, n = 2, 1600.0
    counts = grid_counts(2, d, {(2, 2): 300.0, (3, 2): 300.0, (2, 3): 300.0, (3, 3): 50.0})
    step = iterate_cells(uniform_cells(2, d), counts, np.full(16, 10.0), n, d, z=2.0, max_level=4)
    assert step.merged == 0 and step.dense == 3
    assert set(tree_children(cell(2, 3, 3), d)) <= set(step.cells)
    assert cell(2, 3, 3) not in step.cells and cell(1, 1, 1) not in step.cells
    check_partition(step.cells, d)


def test_iterate_cells_dense_needs_significance_too() -> None:
    # Relative density 3 but with a standard error of 2 (z = 2 needs 3 >= 4): not dense, nothing happens.
    d, n = 2, 1600.0
    counts = grid_counts(2, d, {(x, y): 300.0 for x in (0, 1) for y in (0, 1)})
    step = iterate_cells(uniform_cells(2, d), counts, np.full(16, 200.0), n, d, z=2.0, max_level=3)
    assert (step.dense, step.merged, step.split, step.changed) == (0, 0, 0, False)
    assert step.cells == uniform_cells(2, d)


def test_iterate_cells_pools_history_by_inverse_variance() -> None:
    """Level 1 (2 x 2), n = 100, V = 1/4: count 25 with SE 5 is density 1.0 with variance (5/25)^2 = 0.04."""
    d, n = 2, 100.0
    cells = uniform_cells(1, d)
    target = cell(1, 0, 0)
    counts = np.array([25.0, 0.0, 0.0, 0.0])
    se = np.array([5.0, 5.0, 5.0, 5.0])
    history = {target: (2.0, 0.01)}  # weights 1/0.01 = 100 and 1/0.04 = 25
    step = iterate_cells(cells, counts, se, n, d, z=2.0, max_level=1, history=history)
    rho = (2.0 * 100 + 1.0 * 25) / 125
    assert step.history[target] == pytest.approx((rho, 1 / 125), rel=1e-12)
    assert step.dense == 1 and step.cells == cells  # max_level 1: the sparse siblings cannot split
    # The other cells had no history: their own estimate.
    assert step.history[cell(1, 1, 0)] == pytest.approx((0.0, 0.04))
    # History damps noise both ways: a dense-looking cell with a sparse past is not dense.
    step2 = iterate_cells(cells, np.array([40.0, 0.0, 0.0, 0.0]), se, n, d, z=2.0, max_level=1,
                          history={target: (0.2, 0.01)})
    assert step2.dense == 0 and step2.history[target][0] == pytest.approx((0.2 * 100 + 1.6 * 25) / 125)
    # Equal weights: the plain mean and half the variance.
    step3 = iterate_cells(cells, counts, se, n, d, z=2.0, max_level=1, history={target: (2.0, 0.04)})
    assert step3.history[target] == pytest.approx((1.5, 0.02), rel=1e-12)
    # A history without weight (variance 0) is ignored.
    step4 = iterate_cells(cells, counts, se, n, d, z=2.0, max_level=1, history={target: (9.0, 0.0)})
    assert step4.history[target] == pytest.approx((1.0, 0.04))


def test_iterate_cells_rejects_bad_shapes() -> None:
    with pytest.raises(InvalidParameterError, match="one entry per cell"):
        iterate_cells(uniform_cells(1, 2), np.zeros(3), np.ones(4), 10.0, 2, z=2.0, max_level=2)
    with pytest.raises(InvalidParameterError, match="n must be positive"):
        iterate_cells(uniform_cells(1, 2), np.zeros(4), np.ones(4), 0.0, 2, z=2.0, max_level=2)


@HYPOTHESIS
@given(first=counts_16, second=st.lists(st.sampled_from([0.0, 5.0, 30.0, 200.0]), min_size=64, max_size=64),
       max_level=st.integers(2, 4))
def test_iterate_cells_always_returns_a_partition(first: list[float], second: list[float], max_level: int) -> None:
    """Two chained rounds on random counts: partitions, levels within bounds, history only for listed cells."""
    d, n = 2, 1600.0
    step = iterate_cells(uniform_cells(2, d), first, np.full(16, 10.0), n, d, z=2.0, max_level=max_level)
    check_partition(step.cells, d)
    assert max(c.level for c in step.cells) <= max_level
    assert set(step.history) <= set(step.cells)
    assert step.changed == (step.cells != uniform_cells(2, d))
    cells = list(step.cells)
    counts = np.array(second[:len(cells)] + [0.0] * max(0, len(cells) - len(second)))
    step2 = iterate_cells(cells, counts, np.full(len(cells), 10.0), n, d, z=2.0, max_level=max_level,
                          history=step.history)
    check_partition(step2.cells, d)
    assert max(c.level for c in step2.cells) <= max_level
    assert min(c.level for c in step2.cells) >= 0
    assert set(step2.history) <= set(step2.cells)


# -- aggregation ------------------------------------------------------------------------------------------


def agg(cells: Sequence[TreeCell], counts: np.ndarray, se: float, n: float, d: int = 2, *, z_dense: float = 2.0,
        z_core: float = 3.0, border: bool = True, border_gap: float | None = None) -> CellAggregation:
    """``aggregate_cells`` with one standard error for every cell and the engine's default thresholds."""
    return aggregate_cells(cells, counts, np.full(len(cells), se), n, d, z_dense=z_dense, z_core=z_core,
                           border=border, border_gap=border_gap)


def test_aggregate_two_blobs_ordered_by_mass() -> None:
    """Level 3 (8 x 8), n = 6400: share 100 per cell. A: 2 x 2 cells of 400; B: 3 x 3 cells of 300."""
    d, n = 2, 6400.0
    cells = uniform_cells(3, d)
    blob_a = {(x, y): 400.0 for x in (0, 1) for y in (0, 1)}
    blob_b = {(x, y): 300.0 for x in (5, 6, 7) for y in (5, 6, 7)}
    counts = grid_counts(3, d, {**blob_a, **blob_b})
    out = agg(cells, counts, 10.0, n, border=False)
    assert out.clusters == 2
    labels = {c: int(label) for c, label in zip(cells, out.labels)}
    assert {labels[cell(3, *xy)] for xy in blob_b} == {0}  # B: 2700 > A: 1600
    assert {labels[cell(3, *xy)] for xy in blob_a} == {1}
    assert sum(1 for v in labels.values() if v >= 0) == 13 and out.border_cells == 0
    assert out.cluster_shares == pytest.approx((2700 / 6400, 1600 / 6400))
    assert int(out.dense.sum()) == 13 and out.core[out.dense].any()
    np.testing.assert_allclose(out.densities, counts / (n / 64))
    np.testing.assert_allclose(out.density_std_errors, np.full(64, 10.0 / 100.0))
    # With border cells: the ring of cells touching each blob joins it; the ring of A has 5 cells, of B 7.
    bordered = agg(cells, counts, 10.0, n)
    assert bordered.border_cells == 5 + 7
    b_labels = {c: int(label) for c, label in zip(cells, bordered.labels)}
    assert b_labels[cell(3, 2, 2)] == 1 and b_labels[cell(3, 4, 4)] == 0 and b_labels[cell(3, 3, 3)] == -1
    assert bordered.clusters == 2 and bordered.cluster_shares == pytest.approx(out.cluster_shares)


def test_aggregate_dense_cell_without_a_core_is_noise() -> None:
    """An isolated dense cell of 150 (share 100): its neighbourhood (9 cells, share 900) is not a core."""
    d, n = 2, 6400.0
    cells = uniform_cells(3, d)
    counts = grid_counts(3, d, {(4, 4): 150.0})
    out = agg(cells, counts, 10.0, n)
    assert out.dense.sum() == 1 and out.core.sum() == 0
    assert out.clusters == 0 and (out.labels == -1).all() and out.border_cells == 0
    assert out.cluster_shares == ()
    # The same cell with dense neighbours around it becomes a core and a cluster.
    ring = {(x, y): 100.0 for x in (3, 4, 5) for y in (3, 4, 5)}
    out2 = agg(cells, grid_counts(3, d, {**ring, (4, 4): 150.0}), 10.0, n, border=False)
    assert out2.clusters == 1 and out2.core[cell(3, 4, 4).morton_index]


def test_aggregate_core_needs_significance() -> None:
    # Neighbourhood sum 1000 >= share 900 but the SE of the sum is 3 * 200 = 600: z_core 3 needs 1800.
    d, n = 2, 6400.0
    cells = uniform_cells(3, d)
    counts = grid_counts(3, d, {(x, y): 1000.0 / 9 for x in (3, 4, 5) for y in (3, 4, 5)})
    out = agg(cells, counts, 200.0, n, z_dense=0.1)
    assert out.dense.sum() == 9 and out.core.sum() == 0 and out.clusters == 0
    assert agg(cells, counts, 10.0, n, z_dense=0.1).clusters == 1


def test_aggregate_border_cell_between_two_clusters_stays_noise() -> None:
    """A = (0..1, 3..4), B = (3..4, 3..4): column x = 2 touches both; cells beyond touch one."""
    d, n = 2, 6400.0
    cells = uniform_cells(3, d)
    counts = grid_counts(3, d, {**{(x, y): 500.0 for x in (0, 1) for y in (3, 4)},
                                **{(x, y): 400.0 for x in (3, 4) for y in (3, 4)}})
    out = agg(cells, counts, 10.0, n)
    labels = {c: int(label) for c, label in zip(cells, out.labels)}
    assert out.clusters == 2
    assert labels[cell(3, 0, 3)] == 0 and labels[cell(3, 3, 3)] == 1  # A: 2000 > B: 1600
    for y in (2, 3, 4, 5):
        assert labels[cell(3, 2, y)] == -1  # touches both
    assert labels[cell(3, 0, 2)] == 0 and labels[cell(3, 5, 5)] == 1 and labels[cell(3, 4, 5)] == 1
    assert labels[cell(3, 2, 1)] == -1 and labels[cell(3, 7, 7)] == -1  # touches neither
    # Every border cell touches exactly one cluster's dense cells, and takes its label.
    adjacency = touching(cells, d)
    for i in np.flatnonzero((out.labels >= 0) & ~out.dense).tolist():
        near = {int(out.labels[j]) for j in adjacency[i] if out.dense[j] and out.labels[j] >= 0}
        assert near == {int(out.labels[i])}
    # Borders never merge clusters, and border=False leaves them all noise.
    plain = agg(cells, counts, 10.0, n, border=False)
    assert plain.border_cells == 0 and int((plain.labels >= 0).sum()) == 8


def test_aggregate_cells_of_different_sizes_connect_when_they_touch() -> None:
    """Partition: level-1 cells (0, 0), (0, 1), (1, 1) and the four level-2 children of (1, 0)."""
    d, n = 2, 1000.0
    cells = sorted([cell(1, 0, 0), cell(1, 0, 1), cell(1, 1, 1), *tree_children(cell(1, 1, 0), d)])
    check_partition(cells, d)

    def counts(values: dict[TreeCell, float]) -> np.ndarray:
        return np.array([values.get(c, 0.0) for c in cells])

    # Big (0, 0) = 600 (share 250) and (0, 1) = 300 (share 250): dense; small (2, 0) = 100 (share 62.5): dense,
    # touching (0, 0) across the face x = 1/2. Core: (0, 0)'s neighbourhood holds 1000 >= 875.
    joined = agg(cells, counts({cell(1, 0, 0): 600.0, cell(1, 0, 1): 300.0, cell(2, 2, 0): 100.0}), 5.0, n,
                 border=False)
    labels = dict(zip(cells, joined.labels.tolist()))
    assert joined.clusters == 1
    assert labels[cell(1, 0, 0)] == labels[cell(1, 0, 1)] == labels[cell(2, 2, 0)] == 0
    assert sum(v == 0 for v in labels.values()) == 3
    # The same small dense cell at (3, 1) touches neither big dense cell: not connected, no core of its own.
    assert not cells_touch(cell(2, 3, 1), cell(1, 0, 0), d) and not cells_touch(cell(2, 3, 1), cell(1, 0, 1), d)
    apart = agg(cells, counts({cell(1, 0, 0): 600.0, cell(1, 0, 1): 300.0, cell(2, 3, 1): 100.0}), 5.0, n,
                border=False)
    assert apart.clusters == 1 and apart.dense[cells.index(cell(2, 3, 1))]
    assert apart.labels[cells.index(cell(2, 3, 1))] == -1
    # Borders do not chain: (1, 1) borders the cluster, (3, 1) only touches that border cell.
    chained = agg(cells, counts({cell(1, 0, 0): 600.0, cell(1, 0, 1): 300.0, cell(2, 3, 1): 10.0}), 5.0, n)
    assert chained.labels[cells.index(cell(1, 1, 1))] == 0 and chained.labels[cells.index(cell(2, 3, 1))] == -1


def test_aggregate_border_gap_selects_by_distance() -> None:
    """On a refined grid the gap attaches cells up to ``gap`` away, not only touching ones."""
    d, n = 2, 6400.0
    cells = uniform_cells(3, d)
    counts = grid_counts(3, d, {(x, y): 400.0 for x in (0, 1) for y in (0, 1)})
    gap_two = agg(cells, counts, 10.0, n, border_gap=2 / 8)  # cells at Chebyshev gap 0 or 1/8 join
    labels = dict(zip(cells, gap_two.labels.tolist()))
    assert labels[cell(3, 3, 3)] == 0 and labels[cell(3, 3, 0)] == 0 and labels[cell(3, 4, 0)] == -1
    assert gap_two.border_cells == (4 * 4 - 4)


@HYPOTHESIS
@given(counts=st.lists(st.sampled_from([0.0, 0.0, 50.0, 120.0, 300.0, 700.0]), min_size=64, max_size=64),
       se=st.sampled_from([5.0, 20.0, 60.0]))
def test_aggregate_invariants_and_border_gap_equals_touching_on_a_uniform_grid(counts: list[float], se: float) -> None:
    d, n = 2, 6400.0
    cells = uniform_cells(3, d)
    c = np.array(counts)
    touch = agg(cells, c, se, n)
    gap = agg(cells, c, se, n, border_gap=1 / 8)  # the side of the level: exactly the touching cells
    np.testing.assert_array_equal(touch.labels, gap.labels)
    assert touch.border_cells == gap.border_cells
    # Labels are -1 .. clusters - 1, each cluster holds a core cell, and masses decrease with the label.
    assert set(touch.labels.tolist()) <= set(range(-1, touch.clusters))
    assert set(touch.labels[touch.dense].tolist()) - {-1} == set(range(touch.clusters))
    masses = [float(c[(touch.labels == k) & touch.dense].sum()) for k in range(touch.clusters)]
    assert masses == sorted(masses, reverse=True)
    for k in range(touch.clusters):
        assert (touch.core & (touch.labels == k)).any()
    assert not (touch.core & ~touch.dense).any()
    assert len(touch.cluster_shares) == touch.clusters
    # Dense cells that touch share a label (components), unless both are noise.
    adjacency = touching(cells, d)
    for i in np.flatnonzero(touch.dense).tolist():
        for j in adjacency[i]:
            if touch.dense[j]:
                assert touch.labels[i] == touch.labels[j]


def test_aggregate_rejects_bad_shapes() -> None:
    with pytest.raises(InvalidParameterError, match="one entry per cell"):
        aggregate_cells(uniform_cells(1, 2), np.zeros(4), np.ones(3), 10.0, 2, z_dense=2.0, z_core=3.0)
    with pytest.raises(InvalidParameterError, match="n must be positive"):
        aggregate_cells(uniform_cells(1, 2), np.zeros(4), np.ones(4), 0.0, 2, z_dense=2.0, z_core=3.0)


# -- touching and volumes ------------------------------------------------------------------------------------


def test_touching_uses_corners_up_to_dimension_three() -> None:
    for d in (1, 2, 3, 4):
        cells = uniform_cells(1, d)
        adjacency = touching(cells, d)
        origin = cells.index(cell(1, *([0] * d)))
        far = cells.index(cell(1, *([1] * d)))
        assert (far in adjacency[origin]) == (d <= CORNER_TOUCH_MAX_DIMENSION)
        assert len(adjacency[origin]) == (2**d - 1 if d <= CORNER_TOUCH_MAX_DIMENSION else d)


def test_uniform_cells_and_volumes() -> None:
    cells = uniform_cells(2, 3)
    assert len(cells) == 64 and cells == tuple(sorted(cells))
    check_partition(cells, 3)
    np.testing.assert_array_equal(cell_volumes(cells, 3), np.full(64, 1 / 64))
    assert cell_volumes([cell(1, 0, 0), cell(3, 7, 7)], 2).tolist() == [0.25, 1 / 64]
    assert tree_cell_bounds(cell(3, 7, 7), 2) == ((0.875, 0.875), (1.0, 1.0))


def test_aggregate_min_cluster_z_drops_clusters_without_significant_mass() -> None:
    """Blob A (2 x 2 cells of 400) and blob B (3 x 3 cells of 130): with SE 40 per cell, B's mass 1170
    is 9.75 SE; A's 1600 is 20 SE. A family-wise z of 10 drops B, of 9 keeps it; A is kept by both."""
    d, n = 2, 6400.0
    cells = uniform_cells(3, d)
    blob_a = {(x, y): 400.0 for x in (0, 1) for y in (0, 1)}
    blob_b = {(x, y): 130.0 for x in (5, 6, 7) for y in (5, 6, 7)}
    counts = grid_counts(3, d, {**blob_a, **blob_b})
    se = np.full(64, 40.0)
    kept = aggregate_cells(cells, counts, se, n, d, z_dense=0.5, z_core=0.5, border=False, min_cluster_z=9.0)
    dropped = aggregate_cells(cells, counts, se, n, d, z_dense=0.5, z_core=0.5, border=False, min_cluster_z=10.0)
    assert kept.clusters == 2 and dropped.clusters == 1
    labels = {c: int(label) for c, label in zip(cells, dropped.labels)}
    assert {labels[cell(3, *xy)] for xy in blob_a} == {0}
    assert {labels[cell(3, *xy)] for xy in blob_b} == {-1}
    assert dropped.cluster_shares == pytest.approx((1600 / 6400,))


def test_aggregate_region_level_judges_fine_cells_by_their_region() -> None:
    """Level-1 grid (4 cells) with cell 0 split into 4 level-2 cells. n = 400: a level-1 region's
    share is 100; each fine cell holds 30 (SE 20: 1.5 SE, below z_dense = 2 on its own)."""
    d, n = 2, 400.0
    fine = [TreeCell(level=2, morton_index=i) for i in range(4)]
    cells = fine + [TreeCell(level=1, morton_index=i) for i in (1, 2, 3)]
    counts = np.array([30.0] * 4 + [0.0, 0.0, 0.0])
    se = np.full(7, 20.0)
    alone = aggregate_cells(cells, counts, se, n, d, z_dense=2.0, z_core=0.1, border=False)
    assert not alone.dense[:4].any()
    # The region pools 120 with SE 40: 3 SE and above its share of 100 -> every fine cell is dense.
    pooled = aggregate_cells(cells, counts, se, n, d, z_dense=2.0, z_core=0.1, border=False, region_level=1)
    assert pooled.dense[:4].all() and not pooled.dense[4:].any()
    # A prior saying the region is empty (0 +- 10) outweighs the cells (120 +- 40): the pooled
    # estimate (0 / 100 + 120 / 1600) / (1 / 100 + 1 / 1600) = 7.06 is not dense.
    vetoed = aggregate_cells(cells, counts, se, n, d, z_dense=2.0, z_core=0.1, border=False, region_level=1,
                             region_priors={0: (0.0, 100.0)})
    assert not vetoed.dense[:4].any()
    # Fine cells on their own need the family-wise z over the 4 fine cells (Phi^-1(1 - 0.05 / 4) = 2.24):
    # 46 = 2.3 SE passes, 44 = 2.2 SE does not (without the region, which a zero prior vetoes).
    for value, expected in ((46.0, True), (44.0, False)):
        counts2 = np.array([value, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
        out = aggregate_cells(cells, counts2, se, 40.0, d, z_dense=2.0, z_core=0.1, border=False, region_level=1,
                              region_priors={0: (0.0, 1e-6)})
        assert bool(out.dense[0]) is expected, value
