"""Grid clustering math (AGCluster, ``papers/002``): granularity, refinement and cell aggregation.

Everything here works on the normalized box [0, 1]^d and on dyadic cells
(:class:`~ldp_client.encoders.geometry.TreeCell`: level l has side 2^-l and volume 2^-(l d)); the
engine (:mod:`ldp_collector.kinds.grid`) feeds it frequency estimates and turns its decisions
into round specs. All functions are pure and deterministic.

Granularity (the side ``m`` of a uniform grid cell)
    :func:`paper_granularity` is Theorem 1 as printed,
    ``m_opt = (2 N^2 (e^eps - 1)^2 r^(-1/d))^(-1/(d + 1))``. Its two terms are in different units
    (a squared density error against a count), and it is absurd in practice: N = 15 000, eps = 5,
    d = 2, r = 1 gives m = 4e-5 (25 000 cells per dimension), and the paper's own credit-card
    example (N = 300 000, d = 24, eps = 1) gives 0.34 where the paper reports 0.014.

    :func:`consistent_granularity` is the unit-consistent rule used by default. Measure both
    losses in *points*: a frequency oracle's count error per cell has standard deviation
    ``sigma = sqrt(N v)`` whatever the cell size (``v`` = per-report variance, 4e^eps/(e^eps - 1)^2
    for OUE/OLH), and the data covers a share ``r`` of the box, i.e. ``r / m^d`` cells, so the
    expected absolute count error over the occupied cells is about ``r sigma m^-d``; the edge loss
    is the paper's own count, ``2 d N m r^(-1/d)`` points in the ``2 d r^((d-1)/d) / m^(d-1)`` edge
    cells. Minimizing ``L(m) = r sigma m^-d + 2 d N r^(-1/d) m`` gives

        ``m* = r^(1/d) (sigma / (2 N))^(1/(d + 1))``.

    Both rules are snapped to a dyadic level (:func:`level_for_side`): the result is a
    cell -> cluster map of tree cells, which devices can evaluate exactly.

Density and the dense filter
    A cell ``g`` of volume ``V`` with estimated count ``c`` (of the ``n`` reports of its group) is
    *dense* when ``c >= max(lambda n V, z sigma)``: above the uniform share (the paper's threshold
    ``D = N / (N_g V(g))``, Definition 2, times ``lambda = 1``) **and** significantly above zero (a
    one-sided test at ``z`` standard errors; without it, half of the empty small cells pass on
    noise alone). Reported densities are relative: ``c / (n V)`` (1 = the uniform density).

Aggregation (:func:`aggregate_cells`, the paper's Algorithm 4)
    Core cells are dense cells whose neighbourhood (the cell and every cell touching it, of any
    size) holds significantly more than its uniform share: ``sum c >= max(lambda n V_N,
    z_core sigma_N)`` with ``sigma_N`` the standard error of the sum. Clusters are the connected
    components of dense cells (touching, across sizes) that contain a core cell; then every
    non-clustered cell touching exactly one cluster joins it as a *border* cell (DBSCAN's border
    points; a cell touching two clusters stays noise, so borders never merge clusters). Everything
    else is noise, label ``-1``. Two guards against noise: a cluster whose total estimated count is
    not significant at a family-wise corrected level is dropped (``min_cluster_z``), and a refined
    cell inside a dense region of the granularity level counts as dense (``region_level``: a
    small cell's count is rarely significant on its own, because the oracle's noise per cell does
    not shrink with the cell). The paper's distance-based density connection with "child cell
    centres" (Definition 9) is, for dyadic cells, exactly "the cells touch": two cells of sides
    m_i > m_j are within m_j of each other's nearest children iff they share a boundary point.

Touching
    Cells touch when they share any boundary point (faces, edges, corners) up to
    :data:`CORNER_TOUCH_MAX_DIMENSION` dimensions; above it only cells sharing part of a face
    count (the 3^d neighbour probes would dominate the server step, and in high dimension corner
    contacts carry little mass).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.encoders.geometry import (
    TreeCell,
    cell_adjacency,
    max_tree_level,
    same_level_neighbors,
    tree_children,
    tree_parent,
)
from ldp_client.errors import InvalidParameterError

__all__ = [
    "CORNER_TOUCH_MAX_DIMENSION",
    "FINE_CELL_FALSE_POSITIVE_RATE",
    "CellAggregation",
    "IterationStep",
    "TreeLevelStep",
    "aggregate_cells",
    "cell_volumes",
    "consistent_granularity",
    "dense_fraction",
    "dense_mask",
    "iterate_cells",
    "level_for_side",
    "oracle_variance",
    "paper_granularity",
    "touching",
    "tree_height_range",
    "tree_level_step",
    "uniform_cells",
]

#: Family-wise false-positive rate of the own dense test of cells finer than the region level.
FINE_CELL_FALSE_POSITIVE_RATE = 0.05
#: Corner contacts count as touching up to this dimension; faces only above it (module docstring).
CORNER_TOUCH_MAX_DIMENSION = 3


def oracle_variance(epsilon: float) -> float:
    """Per-report count variance of OUE/OLH, ``4 e^eps / (e^eps - 1)^2`` (the large-domain optimum)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise InvalidParameterError(f"epsilon must be a positive number, got {epsilon!r}")
    return 4.0 * math.exp(epsilon) / math.expm1(epsilon) ** 2


def _check_share(r: float) -> float:
    if not (math.isfinite(r) and 0.0 < r <= 1.0):
        raise InvalidParameterError(f"the occupied share r must be in (0, 1], got {r!r}")
    return float(r)


def paper_granularity(n: float, epsilon: float, dimension: int, r: float) -> float:
    """Theorem 1 of ``papers/002`` as printed: ``(2 N^2 (e^eps - 1)^2 r^(-1/d))^(-1/(d + 1))``.

    Computed in logarithms (the base overflows for large N). See the module docstring for why it
    is kept only as an option.
    """
    if not n > 0:
        raise InvalidParameterError(f"N must be positive, got {n!r}")
    r = _check_share(r)
    log_base = math.log(2.0) + 2.0 * math.log(n) + 2.0 * math.log(math.expm1(epsilon)) - math.log(r) / dimension
    return math.exp(-log_base / (dimension + 1))


def consistent_granularity(n: float, variance: float, dimension: int, r: float) -> float:
    """The unit-consistent side ``m* = r^(1/d) (sigma / (2 N))^(1/(d + 1))``, ``sigma = sqrt(N v)``.

    Parameters
    ----------
    n : float
        Reports that will estimate the cell counts.
    variance : float
        Per-report count variance ``v`` of the frequency oracle (:func:`oracle_variance`).
    dimension : int
    r : float
        Share of the box the data occupies, in (0, 1].
    """
    if not n > 0:
        raise InvalidParameterError(f"N must be positive, got {n!r}")
    if not (math.isfinite(variance) and variance > 0):
        raise InvalidParameterError(f"the per-report variance must be positive, got {variance!r}")
    r = _check_share(r)
    sigma = math.sqrt(n * variance)
    return float(r ** (1.0 / dimension) * (sigma / (2.0 * n)) ** (1.0 / (dimension + 1)))


def level_for_side(side: float, dimension: int, *, min_level: int = 1, max_level: int | None = None,
                   max_cells: int | None = None) -> int:
    """The dyadic level whose side ``2^-l`` is nearest to ``side`` in log scale, clamped.

    Clamped to ``[min_level, max_level]`` (default: the deepest level of 64-bit Morton indices)
    and, with ``max_cells``, to the deepest level with at most that many cells (``2^(l d)``).
    """
    if not (math.isfinite(side) and side > 0):
        raise InvalidParameterError(f"the cell side must be a positive number, got {side!r}")
    top = max_tree_level(dimension) if max_level is None else max_level
    if max_cells is not None:
        top = min(top, max(0, int(math.floor(math.log2(max_cells) / dimension + 1e-12))))
    level = int(round(-math.log2(side)))
    return max(min_level, min(top, level)) if top >= min_level else top


def tree_height_range(side: float, r: float, dimension: int) -> tuple[float, float]:
    """Theorem 3's range ``log2(1/m) <= H <= 1 + ln(1/m) / (1 - r) + d ln 2`` (``r = 1``: no upper bound)."""
    r = _check_share(r)
    low = math.log2(1.0 / side)
    high = math.inf if r >= 1.0 else 1.0 + math.log(1.0 / side) / (1.0 - r) + dimension * math.log(2.0)
    return low, high


def uniform_cells(level: int, dimension: int) -> tuple[TreeCell, ...]:
    """Every cell of one level, in Morton order."""
    return tuple(TreeCell(level=level, morton_index=i) for i in range(2 ** (level * dimension)))


def cell_volumes(cells: Sequence[TreeCell], dimension: int) -> NDArray[np.float64]:
    """Volume ``2^-(l d)`` of every cell of the normalized box."""
    return np.array([math.ldexp(1.0, -c.level * dimension) for c in cells], dtype=np.float64)


def touching(cells: Sequence[TreeCell], dimension: int) -> list[tuple[int, ...]]:
    """For each cell of a partition, the positions of the cells it touches (module docstring)."""
    return cell_adjacency(cells, dimension, faces_only=dimension > CORNER_TOUCH_MAX_DIMENSION)


def dense_mask(counts: ArrayLike, std_errors: ArrayLike, volumes: ArrayLike, n: float, *,
               z: float, share_factor: float = 1.0) -> NDArray[np.bool_]:
    """``count >= max(share_factor n V, z sigma)`` for every cell (module docstring)."""
    c = np.asarray(counts, dtype=np.float64)
    threshold = np.maximum(share_factor * float(n) * np.asarray(volumes, dtype=np.float64),
                           z * np.asarray(std_errors, dtype=np.float64))
    out: NDArray[np.bool_] = c >= threshold
    return out


def dense_fraction(counts: ArrayLike, std_errors: ArrayLike, n: float, dimension: int, level: int, *,
                   z: float) -> float:
    """The calibration's ``r``: the share of a uniform level's cells that are dense.

    When no cell is dense the data is either spread over the whole box or drowned in noise; both
    call for the coarsest grid, so the share is then 1 (not "one cell", which would ask for the
    finest grid exactly when nothing can be resolved).
    """
    c = np.asarray(counts, dtype=np.float64)
    cells = int(c.shape[0])
    volumes = np.full(cells, math.ldexp(1.0, -level * dimension))
    dense = int(dense_mask(c, std_errors, volumes, n, z=z).sum())
    return float(dense) / float(cells) if dense else 1.0


# -- TreeAdaptive --------------------------------------------------------------------------------

@dataclass(frozen=True)
class TreeLevelStep:
    """One level of the top-down tree walk: cells kept for good and cells refined to the next level."""

    final: tuple[TreeCell, ...]
    final_dense: tuple[bool, ...]
    refine: tuple[TreeCell, ...]
    dense: int


def tree_level_step(candidates: Sequence[TreeCell], counts: ArrayLike, std_errors: ArrayLike, n: float,
                    dimension: int, *, z: float, last: bool, dense_above: Sequence[TreeCell] = ()) -> TreeLevelStep:
    """Decide every candidate cell of one tree level (Algorithm 3, top-down).

    A dense cell is final (the region's cell). A sparse cell that may sit on a cluster edge — it
    touches a dense cell of this level, has a dense sibling, or touches a dense final cell of a
    coarser level (``dense_above``) — is replaced by its children; any other sparse cell is final.
    On the ``last`` level every cell is final.

    Parameters
    ----------
    candidates : sequence of TreeCell
        Cells of one level (all of ``level``), each estimated from that level's group.
    counts, std_errors : array_like
        Their estimated counts among the group's ``n`` reports.
    n : float
    dimension : int
    z : float
        Significance of the dense test (:func:`dense_mask`).
    last : bool
    dense_above : sequence of TreeCell
        Dense final cells of coarser levels.
    """
    cells = list(candidates)
    if not cells:
        return TreeLevelStep(final=(), final_dense=(), refine=(), dense=0)
    level = cells[0].level
    if any(c.level != level for c in cells):
        raise InvalidParameterError("the candidates of a tree level must all have the same level")
    volumes = np.full(len(cells), math.ldexp(1.0, -level * dimension))
    dense = dense_mask(counts, std_errors, volumes, n, z=z)
    if last:
        return TreeLevelStep(final=tuple(cells), final_dense=tuple(bool(b) for b in dense), refine=(),
                             dense=int(dense.sum()))
    dense_codes = {c.morton_index for c, b in zip(cells, dense) if b}
    dense_parents = {tree_parent(c, dimension).morton_index for c, b in zip(cells, dense) if b and c.level > 0}
    faces_only = dimension > CORNER_TOUCH_MAX_DIMENSION
    # Dense coarser cells, by level, to test "touches a dense final cell above".
    above: dict[int, set[int]] = {}
    for cell in dense_above:
        above.setdefault(cell.level, set()).add(cell.morton_index)
    final: list[TreeCell] = []
    final_dense: list[bool] = []
    refine: list[TreeCell] = []
    for cell, is_dense in zip(cells, dense):
        if is_dense:
            final.append(cell)
            final_dense.append(True)
            continue
        edge = level > 0 and tree_parent(cell, dimension).morton_index in dense_parents
        if not edge:
            for neighbor in same_level_neighbors(cell, dimension, faces_only=faces_only):
                if neighbor.morton_index in dense_codes or any(
                        (neighbor.morton_index >> ((level - lv) * dimension)) in codes
                        for lv, codes in above.items()):
                    edge = True
                    break
        if edge:
            refine.extend(tree_children(cell, dimension))
        else:
            final.append(cell)
            final_dense.append(False)
    return TreeLevelStep(final=tuple(final), final_dense=tuple(final_dense), refine=tuple(refine),
                         dense=int(dense.sum()))


# -- IterAdaptive --------------------------------------------------------------------------------

@dataclass(frozen=True)
class IterationStep:
    """One IterAdaptive round: the next cell list, what changed, and the carried density history."""

    cells: tuple[TreeCell, ...]
    merged: int
    split: int
    dense: int
    #: Per cell of ``cells``: pooled relative density and its variance (inverse-variance history).
    history: dict[TreeCell, tuple[float, float]] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        """Whether the cell list changed."""
        return bool(self.merged or self.split)


def iterate_cells(cells: Sequence[TreeCell], counts: ArrayLike, std_errors: ArrayLike, n: float, dimension: int,
                  *, z: float, max_level: int,
                  history: dict[TreeCell, tuple[float, float]] | None = None) -> IterationStep:
    """One round of IterAdaptive (Algorithm 2) on the current partition.

    Every cell's relative density ``c / (n V)`` (1 = uniform) is pooled with the cell's earlier
    estimates by inverse variance (the "history of cell states" that damps noise; a merged cell's
    history is the sum of its children's, a split cell's children start fresh). A cell is dense
    when its pooled density is at least 1 and ``z`` standard errors above 0. Then 2^d sibling
    cells that are all present and all dense merge into their parent, and a sparse cell touching a
    dense cell or with a dense sibling splits into its children (not below ``max_level``).
    """
    cells = list(cells)
    c = np.asarray(counts, dtype=np.float64)
    se = np.asarray(std_errors, dtype=np.float64)
    if c.shape != (len(cells),) or se.shape != (len(cells),):
        raise InvalidParameterError("counts and std_errors must have one entry per cell")
    if not n > 0:
        raise InvalidParameterError(f"n must be positive, got {n!r}")
    volumes = cell_volumes(cells, dimension)
    density = c / (n * volumes)
    variance = (se / (n * volumes)) ** 2
    past = history or {}
    pooled: dict[TreeCell, tuple[float, float]] = {}
    for cell, rho, var in zip(cells, density.tolist(), variance.tolist()):
        prev = past.get(cell)
        if prev is not None and prev[1] > 0 and var > 0:
            w_old, w_new = 1.0 / prev[1], 1.0 / var
            rho = (prev[0] * w_old + rho * w_new) / (w_old + w_new)
            var = 1.0 / (w_old + w_new)
        pooled[cell] = (rho, var)
    dense = {cell for cell, (rho, var) in pooled.items() if rho >= 1.0 and rho >= z * math.sqrt(var)}
    present = set(cells)
    # Merge: complete families of dense siblings.
    families: dict[TreeCell, list[TreeCell]] = {}
    for cell in cells:
        if cell.level > 0:
            families.setdefault(tree_parent(cell, dimension), []).append(cell)
    merged_into: dict[TreeCell, TreeCell] = {}
    for parent, children in families.items():
        if len(children) == 2**dimension and all(ch in dense for ch in children):
            for ch in children:
                merged_into[ch] = parent
    # Split: sparse cells on a cluster edge.
    adjacency = touching(cells, dimension)
    position = {cell: i for i, cell in enumerate(cells)}
    split: set[TreeCell] = set()
    for cell in cells:
        if cell in dense or cell in merged_into or cell.level >= max_level:
            continue
        sibling_dense = cell.level > 0 and any(
            s in dense for s in families.get(tree_parent(cell, dimension), ()) if s != cell)
        if sibling_dense or any(cells[j] in dense for j in adjacency[position[cell]]):
            split.add(cell)
    out: list[TreeCell] = []
    new_history: dict[TreeCell, tuple[float, float]] = {}
    emitted: set[TreeCell] = set()
    for cell in cells:
        if cell in merged_into:
            parent = merged_into[cell]
            if parent not in emitted:
                emitted.add(parent)
                out.append(parent)
                kids = families[parent]
                # Density of the union: the mean of equal-volume children's densities.
                rho = sum(pooled[k][0] for k in kids) / len(kids)
                var = sum(pooled[k][1] for k in kids) / len(kids) ** 2
                new_history[parent] = (rho, var)
        elif cell in split:
            out.extend(tree_children(cell, dimension))
        else:
            out.append(cell)
            new_history[cell] = pooled[cell]
    assert present  # a partition is never empty
    return IterationStep(cells=tuple(sorted(out)), merged=len({merged_into[c] for c in merged_into}),
                         split=len(split), dense=len(dense), history=new_history)


# -- aggregation (Algorithm 4) --------------------------------------------------------------------

@dataclass(frozen=True)
class CellAggregation:
    """Cluster labels of a partition's cells, with relative densities and diagnostics."""

    labels: NDArray[np.int64]
    densities: NDArray[np.float64]
    density_std_errors: NDArray[np.float64]
    dense: NDArray[np.bool_]
    core: NDArray[np.bool_]
    clusters: int
    border_cells: int
    #: Estimated share of the population in each cluster (index = label).
    cluster_shares: tuple[float, ...]


def aggregate_cells(cells: Sequence[TreeCell], counts: ArrayLike, std_errors: ArrayLike, n: float, dimension: int,
                    *, z_dense: float, z_core: float, border: bool = True, border_gap: float | None = None,
                    region_level: int | None = None, region_priors: Mapping[int, tuple[float, float]] | None = None,
                    min_cluster_z: float | None = None,
                    adjacency: Sequence[Sequence[int]] | None = None) -> CellAggregation:
    """Dense filter, core cells, density-connected growth and border cells (module docstring).

    Parameters
    ----------
    cells : sequence of TreeCell
        A partition of the unit box.
    counts, std_errors : array_like
        Estimated counts among ``n`` reports and their standard errors, one per cell.
    n : float
    dimension : int
    z_dense, z_core : float
        Significance of the dense and core tests.
    border : bool
        Attach non-clustered cells near exactly one cluster to it.
    border_gap : float, optional
        "Near" means: touching (``None``), or closer than this gap (normalized units, Chebyshev
        distance between the cells' boxes) to a cell of the cluster. The grid engine passes the
        side of the granularity level, so that a refined grid labels the same band around a
        cluster as the uniform grid of that level, whose touching cells are exactly the cells at
        gap 0.
    region_level : int, optional
        Judge cells finer than this level by their region: such a cell is dense when the pooled
        count of all the partition's cells inside its level-``region_level`` ancestor passes the
        dense test for the ancestor's volume, or when its own count passes at a family-wise rate
        of 5% over all fine cells (:data:`FINE_CELL_FALSE_POSITIVE_RATE`).
    region_priors : mapping, optional
        Independent unbiased estimates ``(count, variance)`` of regions, by Morton index (the TREE
        round's estimate of each refined granularity-level cell), pooled into the region test. Refined cells are small, and a small
        cell's count is rarely significant on its own (the oracle's noise per cell does not
        shrink with the cell); without this, a refinement that splits cells inside a cluster by
        mistake would punch holes into it. The grid engine passes the granularity level.
    min_cluster_z : float, optional
        Drop clusters whose total estimated count is below this many standard errors (the grid
        engine passes the Bonferroni z for a family-wise rate of 5% over the cells:
        ``Phi^-1(1 - 0.05 / cells)``, so pure-noise clusters in empty space are rare).
    adjacency : sequence of sequences of int, optional
        :func:`touching` of ``cells`` when already computed.

    Returns
    -------
    CellAggregation
        Labels ``0..clusters-1`` numbered by decreasing estimated mass; ``-1`` = noise.
    """
    cells = list(cells)
    c = np.asarray(counts, dtype=np.float64)
    se = np.asarray(std_errors, dtype=np.float64)
    if c.shape != (len(cells),) or se.shape != (len(cells),):
        raise InvalidParameterError("counts and std_errors must have one entry per cell")
    if not n > 0:
        raise InvalidParameterError(f"n must be positive, got {n!r}")
    adj = [tuple(a) for a in (touching(cells, dimension) if adjacency is None else adjacency)]
    volumes = cell_volumes(cells, dimension)
    var = se**2
    if region_level is None:
        dense = dense_mask(c, se, volumes, n, z=z_dense)
    else:
        # Cells finer than the region level pass on their own only at a family-wise level over
        # all of them (there are many, each with the full noise and little signal: at z_dense
        # their false positives would bridge gaps between clusters); otherwise through their region.
        fine = np.array([cell.level > region_level for cell in cells], dtype=np.bool_)
        z_fine = NormalDist().inv_cdf(1.0 - FINE_CELL_FALSE_POSITIVE_RATE / max(1, int(fine.sum())))
        dense = dense_mask(c, se, volumes, n, z=z_dense) & ~fine | dense_mask(c, se, volumes, n, z=max(z_dense, z_fine)) & fine
        dense |= _dense_regions(cells, c, var, n, dimension, region_level, z_dense, region_priors)
    core = np.zeros(len(cells), dtype=np.bool_)
    for i in np.flatnonzero(dense).tolist():
        hood = (i, *adj[i])
        total = float(c[list(hood)].sum())
        total_se = math.sqrt(float(var[list(hood)].sum()))
        share = float(n) * float(volumes[list(hood)].sum())
        core[i] = total >= max(share, z_core * total_se)
    # Connected components of dense cells (union-find), kept when they hold a core cell.
    parent = list(range(len(cells)))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for i in np.flatnonzero(dense).tolist():
        for j in adj[i]:
            if j > i and dense[j]:
                ri, rj = find(i), find(j)
                if ri != rj:
                    parent[rj] = ri
    roots_with_core = {find(i) for i in np.flatnonzero(core).tolist()}
    mass: dict[int, float] = {}
    mass_var: dict[int, float] = {}
    for i in np.flatnonzero(dense).tolist():
        root = find(i)
        if root in roots_with_core:
            mass[root] = mass.get(root, 0.0) + float(c[i])
            mass_var[root] = mass_var.get(root, 0.0) + float(var[i])
    if min_cluster_z is not None:
        # A cluster must hold significantly more than nothing, at a level corrected for the many
        # cells that could have formed a spurious one (the caller's family-wise z).
        mass = {root: m for root, m in mass.items() if m >= min_cluster_z * math.sqrt(mass_var[root])}
    order = sorted(mass, key=lambda root: (-mass[root], root))
    label_of_root = {root: k for k, root in enumerate(order)}
    labels = np.full(len(cells), -1, dtype=np.int64)
    for i in np.flatnonzero(dense).tolist():
        labels[i] = label_of_root.get(find(i), -1)
    borders = 0
    if border:
        attached = labels.copy()
        if border_gap is None:
            for i in np.flatnonzero(labels < 0).tolist():
                near = {int(labels[j]) for j in adj[i] if labels[j] >= 0}
                if len(near) == 1:
                    attached[i] = near.pop()
                    borders += 1
        else:
            near_clusters = _clusters_within(cells, labels, dimension, border_gap)
            for i, near in near_clusters.items():
                if len(near) == 1:
                    attached[i] = near.pop()
                    borders += 1
        labels = attached
    densities = c / (float(n) * volumes)
    density_se = se / (float(n) * volumes)
    shares = tuple(float(np.clip(c[labels == k].sum(), 0.0, None)) / float(n) for k in range(len(order)))
    return CellAggregation(labels=labels, densities=densities, density_std_errors=density_se, dense=dense,
                           core=core, clusters=len(order), border_cells=borders, cluster_shares=shares)


def _clusters_within(cells: Sequence[TreeCell], labels: NDArray[np.int64], dimension: int,
                     gap: float) -> dict[int, set[int]]:
    """For every unlabelled cell, the labels of the clusters with a cell closer than ``gap`` (Chebyshev)."""
    from ldp_client.encoders.geometry import tree_cell_bounds

    bounds = [tree_cell_bounds(c, dimension) for c in cells]
    lo = np.array([b[0] for b in bounds], dtype=np.float64).reshape(len(cells), dimension)
    hi = np.array([b[1] for b in bounds], dtype=np.float64).reshape(len(cells), dimension)
    clustered = np.flatnonzero(labels >= 0)
    out: dict[int, set[int]] = {}
    if not clustered.size:
        return out
    c_lo, c_hi, c_lab = lo[clustered], hi[clustered], labels[clustered]
    for i in np.flatnonzero(labels < 0).tolist():
        # Per-dimension gap between boxes: max(0, lo_b - hi_a, lo_a - hi_b); Chebyshev = max over dimensions.
        per_dim = np.maximum(0.0, np.maximum(c_lo - hi[i], lo[i] - c_hi))
        close = per_dim.max(axis=1) < gap - 1e-12
        if close.any():
            out[i] = set(np.unique(c_lab[close]).tolist())
    return out


def _dense_regions(cells: Sequence[TreeCell], counts: NDArray[np.float64], variances: NDArray[np.float64], n: float,
                   dimension: int, level: int, z: float,
                   priors: Mapping[int, tuple[float, float]] | None = None) -> NDArray[np.bool_]:
    """Cells finer than ``level`` whose level-``level`` region (all cells inside it pooled) is dense.

    ``priors`` maps a region's Morton index to an independent unbiased estimate of its count (on
    the same scale) and that estimate's variance; it is combined with the pooled cells by inverse
    variance.
    """
    region_of = [c.morton_index >> ((c.level - level) * dimension) if c.level > level else -1 for c in cells]
    totals: dict[int, list[float]] = {}
    for i, region in enumerate(region_of):
        if region >= 0:
            entry = totals.setdefault(region, [0.0, 0.0])
            entry[0] += float(counts[i])
            entry[1] += float(variances[i])
    for region, (prior_count, prior_var) in (priors or {}).items():
        pooled = totals.get(region)
        if pooled is not None and prior_var > 0 and pooled[1] > 0:
            w_old, w_new = 1.0 / prior_var, 1.0 / pooled[1]
            pooled[0] = (prior_count * w_old + pooled[0] * w_new) / (w_old + w_new)
            pooled[1] = 1.0 / (w_old + w_new)
    volume = math.ldexp(1.0, -level * dimension)
    dense_regions = {r for r, (total, var) in totals.items()
                     if total >= max(float(n) * volume, z * math.sqrt(var))}
    return np.array([r >= 0 and r in dense_regions for r in region_of], dtype=np.bool_)
