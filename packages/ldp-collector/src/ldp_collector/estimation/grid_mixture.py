"""Gaussian clusters hidden in one density mode: a mixture fitted to a noisy grid histogram, and its test.

Density-mode clustering (:mod:`~ldp_collector.estimation.density_clustering`) finds clusters of any
shape, but two Gaussian clusters that overlap without a density valley between them (sheared blobs
side by side, a narrow blob inside a wide one) form a single mode, and no valley test can split
them. A Gaussian mixture separates exactly those. Which of the two descriptions a population
follows is decided from the noise, not from the data's look: the population is described by
Gaussian components only when a Gaussian mixture fits the published counts within their standard
errors; otherwise the density modes stand. Everything is a post-processing of one round's
unbiased counts.

The model (grid units: cell ``i`` spans ``[i, i + 1)`` on every axis)
    The expected count of cell ``j`` is ``mu_j = b + sum_k m_k P_k(j)``: ``m_k`` devices in
    component ``k``, ``P_k(j)`` the probability that ``N(mean_k, cov_k)`` gives to the cell, and
    ``b >= 0`` a uniform background per cell. Each published count ``c_j`` is the true count of
    its cell plus the frequency oracle's error, ``N(0, s_j^2)``; the true count varies about
    ``mu_j`` with the sampling variance ``mu_j``. So ``c_j ~ N(mu_j, s_j^2 + mu_j)``, and a model
    is judged by ``chi2 = sum_j (c_j - mu_j)^2 / (s_j^2 + mu_j)`` over the region it is fitted on.

Cell integrals (:func:`cell_integrals`)
    ``P_k(j)`` and the cell's first and second moments are integrated exactly along the axis of
    the narrowest marginal (the conditional normal truncated to the cell: ``Phi`` differences and
    the truncated-normal moments) and by Gauss-Legendre quadrature over the other axes, each cell
    cut into sub-intervals no wider than the marginal's standard deviation or the width over which
    the conditional crosses the cell's edge, so a component narrower than a cell still integrates
    to within about 1e-4.

The fit (:func:`fit_mixture`)
    The region is the density clusters' cells and the cells touching them. The counts there are
    observed; everything else (the rest of the grid and beyond the box) is filled with the
    model's own expectation, as the EM algorithm for truncated, binned data does (McLachlan and
    Jones 1988). The E-step replaces each count by its posterior mean true count under the
    additive noise, ``mu_j + mu_j (c_j - mu_j) / (mu_j + s_j^2)``, which stays finite where the
    model expects nothing (the Poisson weight ``c_j / mu_j`` would not). The M-step moves each
    component to the moments of its share. The iteration is accelerated by SQUAREM (Varadhan and
    Roland 2008) on the unconstrained parameters (log mass, mean, Cholesky factor with a log
    diagonal) and stops when a cycle changes ``chi2`` by less than :data:`_CHI2_RESOLUTION` of its
    standard deviation ``sqrt(2 cells)``.

The decision (:func:`split_gaussian_modes`)
    1. One Gaussian per density cluster and the background are fitted, and ``chi2`` is tested at
       level :data:`MIXTURE_TEST_LEVEL` (degrees of freedom: the region's cells less the
       parameters).
    2. Each cluster, worst excess first, is offered splits of its components (along the longest or
       shortest axis, into a core and a halo, or by 2-means on its cells; each refitted). The best
       one is taken only when it lowers the cluster's ``chi2`` by a significant amount: a
       likelihood-ratio test at level ``MIXTURE_TEST_LEVEL / clusters`` whose null distribution,
       as one more mixture component breaks the test's regularity conditions, is taken as
       chi-square with twice the parameters a component adds (McLachlan 1987). Every cluster has
       at most :data:`MAX_COMPONENTS_PER_MODE` components.
       - When step 1's test failed, a cluster is also judged on its own cells (those whose most
         likely component is the cluster's) at level ``MIXTURE_TEST_LEVEL / clusters``; while it
         fails it must split, and a cluster that cannot be brought within the noise this way is
         not a small Gaussian mixture (a ring, a moon, an arm): the whole population keeps its
         density clusters.
       - When step 1's test passed, a cluster splits only while a split is significant (two
         Gaussians that overlap so much that one Gaussian still fits within the noise, yet one
         more component explains the counts better than chance could).
    3. All parameters are refitted together and tested again at ``MIXTURE_TEST_LEVEL``. Only a
       mixture that passes replaces the density clusters: every cell the density step labelled
       takes its most likely component (noise where the background outweighs every component).

Only grids of at most :data:`MAX_MIXTURE_DIMENSION` dimensions are tested (the quadrature's cost
grows as ``4^(d - 1)`` nodes per cell); in more dimensions the density clusters stand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import ndtr
from scipy.stats import chi2 as chi2_distribution

from ldp_client.errors import InvalidParameterError

from .kmeans import lloyd

__all__ = [
    "MAX_COMPONENTS_PER_MODE",
    "MAX_MIXTURE_DIMENSION",
    "MIXTURE_TEST_LEVEL",
    "GridMixture",
    "MixtureSplit",
    "cell_integrals",
    "fit_mixture",
    "mixture_chi2",
    "split_gaussian_modes",
]

#: Level of every chi-square test of a mixture against the counts.
MIXTURE_TEST_LEVEL = 0.01
#: Most Gaussian components one density mode may be split into.
MAX_COMPONENTS_PER_MODE = 3
#: Grids of more dimensions keep their density clusters (module docstring).
MAX_MIXTURE_DIMENSION = 3

_REACH = 5.5  # a component's cells lie within this many marginal standard deviations of its mean
_QUADRATURE_NODES = 4
_MAX_SUBDIVISIONS = 8
_MAX_NODES_PER_CELL = 256
_MIN_VARIANCE = 1e-3  # cells^2: the smallest eigenvalue a covariance may shrink to
_CHI2_RESOLUTION = 1e-3  # of chi2's standard deviation: the fit's stopping rule
_MAX_EVALUATIONS = 400
_SCREEN_EVALUATIONS = 150  # every starting point of a split is fitted this far ...
_SCREEN_KEEP = 2  # ... and the best few of them to convergence
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@dataclass(frozen=True)
class GridMixture:
    """A Gaussian mixture over a grid, in grid units, with a uniform background per cell.

    ``masses[k]`` devices in ``N(means[k], covariances[k])``; ``owners[k]`` the density cluster
    the component was grown from; ``background`` the expected count of every cell from the
    uniform part.
    """

    masses: NDArray[np.float64]
    means: NDArray[np.float64]
    covariances: NDArray[np.float64]
    owners: tuple[int, ...]
    background: float

    @property
    def components(self) -> int:
        return int(self.masses.size)

    @property
    def dimension(self) -> int:
        return int(self.means.shape[1])

    def parameter_count(self, background: bool) -> int:
        """Free parameters: each component's mass, mean and covariance, and the background."""
        d = self.dimension
        return self.components * (1 + d + d * (d + 1) // 2) + int(background)


@dataclass(frozen=True)
class MixtureSplit:
    """The outcome of :func:`split_gaussian_modes`.

    ``labels`` are the grid's (same shape as the counts; ``-1`` = noise), renumbered by the caller
    only when ``split`` is true. ``reason`` says in a few words what decided: one Gaussian per
    mode fits, the modes were split, or why the density clusters stand.
    """

    labels: NDArray[np.int64]
    split: bool
    mixture: GridMixture | None
    chi2: float
    dof: int
    modes_split: int
    reason: str

    @property
    def chi2_excess_z(self) -> float:
        """How far ``chi2`` lies above its degrees of freedom, in standard deviations of the null."""
        if self.dof <= 0 or not math.isfinite(self.chi2):
            return math.nan
        return (self.chi2 - self.dof) / math.sqrt(2.0 * self.dof)


# --------------------------------------------------------------------------------------------- cell integrals


def _gauss_legendre(subdivisions: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Nodes in [0, 1) and weights of a composite Gauss-Legendre rule over ``subdivisions`` pieces."""
    x, w = np.polynomial.legendre.leggauss(_QUADRATURE_NODES)
    x, w = (x + 1.0) / 2.0, w / 2.0
    nodes = ((np.arange(subdivisions)[:, None] + x[None, :]) / subdivisions).ravel()
    weights = np.tile(w, subdivisions) / subdivisions
    return nodes, weights


_RULES = {p: _gauss_legendre(p) for p in range(1, _MAX_SUBDIVISIONS + 1)}


def cell_integrals(corners: ArrayLike, mean: ArrayLike, cov: ArrayLike, *,
                   moments: bool = True) -> tuple[NDArray[np.float64], NDArray[np.float64] | None,
                                                  NDArray[np.float64] | None]:
    """Integrals of the ``N(mean, cov)`` density over unit cells (module docstring).

    Parameters
    ----------
    corners : array_like, shape (n, d)
        Each cell's lower corner; the cell is ``[corner, corner + 1)`` on every axis.
    mean : array_like, shape (d,)
    cov : array_like, shape (d, d)
        Symmetric positive definite.
    moments : bool
        Also return the first and second moments.

    Returns
    -------
    probability : numpy.ndarray, shape (n,)
        ``int_cell phi``.
    first : numpy.ndarray, shape (n, d), or None
        ``int_cell x phi``.
    second : numpy.ndarray, shape (n, d, d), or None
        ``int_cell x x^T phi``.
    """
    c = np.asarray(corners, dtype=np.float64)
    m = np.asarray(mean, dtype=np.float64)
    s = np.asarray(cov, dtype=np.float64)
    n, d = c.shape
    a = int(np.argmin(np.diag(s)))
    rest = [i for i in range(d) if i != a]
    if rest:
        s_rr = s[np.asarray(rest)[:, None], np.asarray(rest)[None, :]]
        beta = np.linalg.solve(s_rr, s[a, rest])
        var = max(float(s[a, a] - s[a, rest] @ beta), 1e-12)
    else:
        s_rr, beta, var = np.zeros((0, 0)), np.zeros(0), float(s[a, a])
    sigma = math.sqrt(var)
    # Sub-intervals per other axis: no wider than its marginal deviation, nor than the width over
    # which the conditional mean crosses a cell of the analytic axis by one conditional deviation.
    pieces = []
    for j, r in enumerate(rest):
        width = math.sqrt(float(s[r, r]))
        if beta[j] != 0.0:
            width = min(width, sigma / abs(float(beta[j])))
        pieces.append(int(min(_MAX_SUBDIVISIONS, max(1, math.ceil(1.0 / width)))))
    while pieces and math.prod(p * _QUADRATURE_NODES for p in pieces) > _MAX_NODES_PER_CELL:
        pieces[int(np.argmax(pieces))] -= 1
    rules = [_RULES[p] for p in pieces]
    if rest:
        offsets = np.array(list(product(*(r[0] for r in rules))), dtype=np.float64).reshape(-1, len(rest))
        weights = np.prod(np.array(list(product(*(r[1] for r in rules))), dtype=np.float64), axis=1)
        t = c[:, None, rest] + offsets[None, :, :]  # (n, nodes, d - 1)
        diff = t - m[rest]
        inv = np.linalg.inv(s_rr)
        norm = _INV_SQRT_2PI ** len(rest) / math.sqrt(float(np.linalg.det(s_rr)))
        phi = np.exp(-0.5 * np.einsum("nki,ij,nkj->nk", diff, inv, diff)) * (norm * weights)  # (n, nodes)
        centre = m[a] + diff @ beta  # (n, nodes)
    else:
        t = np.zeros((n, 1, 0))
        phi = np.ones((n, 1))
        centre = np.full((n, 1), m[a])
    low = (c[:, a, None] - centre) / sigma
    high = low + 1.0 / sigma
    z = ndtr(high) - ndtr(low)
    probability: NDArray[np.float64] = (z * phi).sum(axis=1)
    if not moments:
        return probability, None, None
    pdf_low = np.exp(-0.5 * low * low) * _INV_SQRT_2PI
    pdf_high = np.exp(-0.5 * high * high) * _INV_SQRT_2PI
    edge = pdf_low - pdf_high
    e1 = centre * z + sigma * edge
    e2 = (centre * centre + var) * z + 2.0 * centre * sigma * edge + var * (low * pdf_low - high * pdf_high)
    first = np.empty((n, d))
    second = np.empty((n, d, d))
    first[:, a] = (e1 * phi).sum(axis=1)
    second[:, a, a] = (e2 * phi).sum(axis=1)
    if rest:
        zp, e1p = z * phi, e1 * phi
        first[:, rest] = np.einsum("nk,nki->ni", zp, t)
        cross = np.einsum("nk,nki->ni", e1p, t)
        second[:, a, rest] = cross
        second[:, rest, a] = cross
        idx = np.asarray(rest, dtype=np.intp)
        second[:, idx[:, None], idx[None, :]] = np.einsum("nk,nki,nkj->nij", zp, t, t)
    return probability, first, second


# --------------------------------------------------------------------------------------------- the fit


@dataclass(frozen=True)
class _Data:
    """The observed region: its cells' lower corners, counts and count variances, and the grid size."""

    corners: NDArray[np.float64]
    counts: NDArray[np.float64]
    variances: NDArray[np.float64]
    grid_cells: int


def _near(data: _Data, mean: NDArray[np.float64], cov: NDArray[np.float64]) -> NDArray[np.int64]:
    """Indices of the region's cells within :data:`_REACH` marginal deviations of a component."""
    reach = _REACH * np.sqrt(np.diag(cov)) + 1.0
    inside = np.all(np.abs(data.corners + 0.5 - mean) <= reach, axis=1)
    return np.flatnonzero(inside)


def _expected(data: _Data, mix: GridMixture, ks: Sequence[int]) -> NDArray[np.float64]:
    """``sum_k m_k P_k(j)`` over the components ``ks``, on the region's cells."""
    out = np.zeros(data.counts.size)
    for k in ks:
        near = _near(data, mix.means[k], mix.covariances[k])
        if near.size:
            out[near] += mix.masses[k] * cell_integrals(data.corners[near], mix.means[k], mix.covariances[k],
                                                        moments=False)[0]
    return out


def _chi2_terms(data: _Data, mu: NDArray[np.float64]) -> NDArray[np.float64]:
    out: NDArray[np.float64] = (data.counts - mu) ** 2 / (data.variances + np.maximum(mu, 0.0))
    return out


def _psd(cov: NDArray[np.float64]) -> NDArray[np.float64]:
    cov = (cov + cov.T) / 2.0
    values, vectors = np.linalg.eigh(cov)
    out: NDArray[np.float64] = (vectors * np.maximum(values, _MIN_VARIANCE)) @ vectors.T
    return out


class _Fitter:
    """EM for the free components of a mixture (the others and, unless fitted, the background fixed)."""

    def __init__(self, data: _Data, mix: GridMixture, free: Sequence[int], fit_background: bool,
                 region: NDArray[np.bool_]) -> None:
        self.data = data
        self.free = list(free)
        self.fit_background = fit_background
        self.region = region
        fixed = [k for k in range(mix.components) if k not in self.free]
        self.fixed_mu = _expected(data, mix, fixed) + (0.0 if fit_background else mix.background)

    def step(self, mix: GridMixture) -> tuple[GridMixture | None, float]:
        """One EM step from ``mix``, and ``mix``'s own ``chi2`` over the region."""
        data = self.data
        parts = []
        mu = self.fixed_mu + (mix.background if self.fit_background else 0.0)
        for k in self.free:
            near = _near(data, mix.means[k], mix.covariances[k])
            p, first, second = cell_integrals(data.corners[near], mix.means[k], mix.covariances[k])
            parts.append((k, near, p, first, second))
            mu[near] += mix.masses[k] * p
        chi2 = float(_chi2_terms(data, mu)[self.region].sum())
        # The posterior mean true count over the expected one, less 1 (0 where the model fills in).
        excess = (data.counts - mu) / (np.maximum(mu, 0.0) + data.variances)
        masses, means, covs = mix.masses.copy(), mix.means.copy(), mix.covariances.copy()
        for k, near, p, first, second in parts:
            w = excess[near]
            assert first is not None and second is not None
            s0 = 1.0 + float(w @ p)
            if not s0 > 1e-9:
                return None, chi2
            mean = (mix.means[k] + w @ first) / s0
            raw = mix.covariances[k] + np.outer(mix.means[k], mix.means[k]) + np.einsum("n,nij->ij", w, second)
            masses[k] = mix.masses[k] * s0
            means[k] = mean
            covs[k] = _psd(raw / s0 - np.outer(mean, mean))
        background = mix.background
        if self.fit_background and background > 0.0:
            background *= max(1.0 + float(excess.sum()) / data.grid_cells, 1e-3)
        return GridMixture(masses, means, covs, mix.owners, background), chi2

    def vector(self, mix: GridMixture) -> NDArray[np.float64]:
        out = [math.log(max(mix.background, 1e-300))] if self.fit_background else []
        d = mix.dimension
        rows, cols = np.tril_indices(d)
        for k in self.free:
            factor = np.linalg.cholesky(mix.covariances[k])
            factor[np.diag_indices(d)] = np.log(np.diag(factor))
            out += [math.log(mix.masses[k]), *mix.means[k], *factor[rows, cols]]
        return np.array(out)

    def from_vector(self, v: NDArray[np.float64], like: GridMixture) -> GridMixture:
        d = like.dimension
        rows, cols = np.tril_indices(d)
        masses, means, covs = like.masses.copy(), like.means.copy(), like.covariances.copy()
        background = like.background
        i = 0
        if self.fit_background:
            background, i = math.exp(v[0]), 1
        width = 1 + d + rows.size
        for k in self.free:
            block = v[i:i + width]
            i += width
            factor = np.zeros((d, d))
            factor[rows, cols] = block[1 + d:]
            factor[np.diag_indices(d)] = np.exp(np.diag(factor))
            masses[k], means[k], covs[k] = math.exp(block[0]), block[1:1 + d], factor @ factor.T
        return GridMixture(masses, means, covs, like.owners, background)


def fit_mixture(data: _Data, mix: GridMixture, free: Sequence[int], *, fit_background: bool,
                region: NDArray[np.bool_] | None = None,
                max_evaluations: int = _MAX_EVALUATIONS) -> tuple[GridMixture | None, float]:
    """SQUAREM-accelerated EM of the ``free`` components (module docstring).

    Returns the fitted mixture and its ``chi2`` over ``region`` (default: the whole observed
    region), or ``(None, inf)`` when a component lost all its mass.
    """
    fitter = _Fitter(data, mix, free, fit_background, np.ones(data.counts.size, bool) if region is None else region)
    # chi2's own spread is sqrt(2 cells): a cycle that moves it by a small fraction of that has converged.
    tolerance = _CHI2_RESOLUTION * math.sqrt(2.0 * max(int(fitter.region.sum()), 1))
    current = mix
    following, f_current = fitter.step(current)
    evaluations = 1
    while evaluations < max_evaluations:
        if following is None:
            return None, math.inf
        after, f_following = fitter.step(following)
        evaluations += 1
        if after is None:
            return following, f_following
        # SQUAREM: extrapolate from (current, following, after); keep the jump only if one EM step from
        # it has a chi2 no worse than the plain iterate's (the monotonicity safeguard).
        best, best_next, f_best = after, None, f_following
        t0, t1, t2 = fitter.vector(current), fitter.vector(following), fitter.vector(after)
        r = t1 - t0
        v = t2 - 2.0 * t1 + t0
        norm_v = float(np.linalg.norm(v))
        if norm_v > 0.0:
            step_length = -max(1.0, float(np.linalg.norm(r)) / norm_v)
            try:
                with np.errstate(over="raise", invalid="raise"):
                    jumped = fitter.from_vector(t0 - 2.0 * step_length * r + step_length**2 * v, current)
                    jumped_next, f_jumped = fitter.step(jumped)
                evaluations += 1
                if jumped_next is not None and f_jumped <= f_following:
                    best, best_next, f_best = jumped, jumped_next, f_jumped
            except (FloatingPointError, OverflowError, ValueError, np.linalg.LinAlgError):
                pass
        if best_next is None:
            best_next, f_best = fitter.step(best)
            evaluations += 1
        converged = abs(f_current - f_best) < tolerance
        current, f_current, following = best, f_best, best_next
        if converged or following is None:
            break
    return current, f_current


def mixture_chi2(data: _Data, mix: GridMixture) -> NDArray[np.float64]:
    """Each observed cell's ``chi2`` term under ``mix``."""
    return _chi2_terms(data, _expected(data, mix, range(mix.components)) + mix.background)


# --------------------------------------------------------------------------------------------- the decision


def _kmeans_parts(corners: NDArray[np.float64], weights: NDArray[np.float64], count: int,
                  dimension: int) -> list[tuple[float, NDArray[np.float64], NDArray[np.float64]]] | None:
    """Weighted k-means of cells into ``count`` parts (seeded at the heaviest cell, then each farthest
    weighted cell): each part's share of the weight, mean and covariance; None when a part is empty."""
    if weights.size < 2 * count or not weights.sum() > 0:
        return None
    points = corners + 0.5
    seeds = [int(np.argmax(weights))]
    while len(seeds) < count:
        far = ((points[:, None, :] - points[seeds][None]) ** 2).sum(axis=2).min(axis=1) * weights
        seeds.append(int(np.argmax(far)))
    fit = lloyd(points, points[seeds], weights=weights, max_iter=30)
    centres, nearest = fit.centers, fit.labels
    parts = []
    for j in range(count):
        w = weights * (nearest == j)
        share = float(w.sum() / weights.sum())
        if not share > 0.01:
            return None
        diff = points - centres[j]
        parts.append((share, centres[j], _psd(np.einsum("n,ni,nj->ij", w, diff, diff) / w.sum()
                                              + np.eye(dimension) / 12.0)))
    return parts


def _replace(mix: GridMixture, k: int,
             parts: Sequence[tuple[float, NDArray[np.float64], NDArray[np.float64]]]) -> GridMixture:
    """``mix`` with component ``k`` replaced by ``parts`` (share of its mass, mean, covariance): the
    first takes its place, the others are appended with the same owner."""
    masses, means, covs = mix.masses.copy(), mix.means.copy(), mix.covariances.copy()
    masses[k], means[k], covs[k] = mix.masses[k] * parts[0][0], parts[0][1], parts[0][2]
    rest = parts[1:]
    return GridMixture(np.append(masses, [mix.masses[k] * p[0] for p in rest]),
                       np.vstack([means, *[p[1][None] for p in rest]]),
                       np.concatenate([covs, *[p[2][None] for p in rest]]),
                       mix.owners + (mix.owners[k],) * len(rest), mix.background)


def _split(mix: GridMixture, k: int, how: str, corners: NDArray[np.float64],
           weights: NDArray[np.float64]) -> GridMixture | None:
    """``mix`` with component ``k`` replaced by two (the starting points of a split, module docstring)."""
    mean, cov = mix.means[k], mix.covariances[k]
    values, vectors = np.linalg.eigh(cov)
    if how in ("longest", "shortest"):
        j = -1 if how == "longest" else 0
        axis = vectors[:, j] * math.sqrt(values[j])
        shared = _psd(cov - 0.64 * np.outer(axis, axis))
        return _replace(mix, k, [(0.5, mean + 0.8 * axis, shared), (0.5, mean - 0.8 * axis, shared)])
    if how == "halo":
        return _replace(mix, k, [(0.5, mean, cov * 0.25), (0.5, mean, cov * 2.0)])
    parts = _kmeans_parts(corners, weights, 2, mix.dimension)  # 2-means over the component's own cells
    return None if parts is None else _replace(mix, k, parts)


def _most_likely(data: _Data, mix: GridMixture) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Each observed cell's most likely component and that component's expected count."""
    table = np.zeros((data.counts.size, mix.components))
    for k in range(mix.components):
        near = _near(data, mix.means[k], mix.covariances[k])
        if near.size:
            table[near, k] = mix.masses[k] * cell_integrals(data.corners[near], mix.means[k], mix.covariances[k],
                                                            moments=False)[0]
    best = table.argmax(axis=1)
    return best, table[np.arange(table.shape[0]), best]


def _touching(mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """``mask`` grown by every cell touching it (faces, edges and corners)."""
    out = mask.copy()
    for offset in product((-1, 0, 1), repeat=mask.ndim):
        shifted = mask
        for axis, o in enumerate(offset):
            if o:
                shifted = np.roll(shifted, o, axis=axis)
                edge = [slice(None)] * mask.ndim
                edge[axis] = slice(0, 1) if o > 0 else slice(-1, None)
                shifted[tuple(edge)] = False
        out |= shifted
    return out


def _no_split(labels: NDArray[np.int64], reason: str, mix: GridMixture | None = None, chi2: float = math.nan,
              dof: int = 0) -> MixtureSplit:
    return MixtureSplit(labels=labels, split=False, mixture=mix, chi2=chi2, dof=dof, modes_split=0, reason=reason)


def split_gaussian_modes(counts: ArrayLike, std_errors: ArrayLike, labels: ArrayLike, *,
                         level: float = MIXTURE_TEST_LEVEL,
                         max_components_per_mode: int = MAX_COMPONENTS_PER_MODE) -> MixtureSplit:
    """Replace the density clusters by Gaussian components where a Gaussian mixture fits (module docstring).

    Parameters
    ----------
    counts : array_like, shape (m,) * d
        Unbiased counts of a uniform grid's cells.
    std_errors : array_like
        Their standard errors (an array of the same shape, or one value).
    labels : array_like of int, shape (m,) * d
        The density clusters (``0..K-1``, ``-1`` = noise).
    level : float
        Level of the chi-square tests, in (0, 1).
    max_components_per_mode : int
        At least 1.

    Returns
    -------
    MixtureSplit
        When ``split`` is true, ``labels`` gives every cell the density step labelled its most
        likely component (``0..components-1``, not yet ordered) or ``-1`` where the background
        outweighs every component; otherwise the input labels.
    """
    c = np.asarray(counts, dtype=np.float64)
    lab = np.asarray(labels, dtype=np.int64)
    se = np.broadcast_to(np.asarray(std_errors, dtype=np.float64), c.shape)
    if lab.shape != c.shape:
        raise InvalidParameterError(f"labels of shape {lab.shape} do not match counts of shape {c.shape}")
    if not 0.0 < level < 1.0:
        raise InvalidParameterError(f"level must be in (0, 1), got {level!r}")
    if max_components_per_mode < 1:
        raise InvalidParameterError(f"max_components_per_mode must be at least 1, got {max_components_per_mode!r}")
    if not (np.isfinite(se).all() and (se > 0).all()):
        raise InvalidParameterError("the standard errors must be positive and finite")
    clusters = int(lab.max()) + 1 if lab.size else 0
    if clusters == 0:
        return _no_split(lab, "no density cluster to test")
    if c.ndim > MAX_MIXTURE_DIMENSION:
        return _no_split(lab, f"not tested in {c.ndim} dimensions (at most {MAX_MIXTURE_DIMENSION})")
    region = _touching(lab >= 0).ravel()
    corners = np.indices(c.shape).reshape(c.ndim, -1).T.astype(np.float64)
    flat_labels = lab.ravel()
    data = _Data(corners=corners[region], counts=c.ravel()[region], variances=se.ravel()[region] ** 2,
                 grid_cells=int(c.size))
    own_labels = flat_labels[region]
    # One Gaussian per density cluster, from its cells' positive counts, and the background outside.
    masses, means, covs = [], [], []
    points = data.corners + 0.5
    for k in range(clusters):
        mine = own_labels == k
        w = np.maximum(data.counts[mine], 0.0)
        if not w.sum() > 0:
            return _no_split(lab, f"density cluster {k} holds no positive count")
        mean = w @ points[mine] / w.sum()
        diff = points[mine] - mean
        covs.append(_psd(np.einsum("n,ni,nj->ij", w, diff, diff) / w.sum() + np.eye(c.ndim) / 12.0))
        masses.append(max(float(data.counts[mine].sum()), 1.0))
        means.append(mean)
    outside = c.ravel()[~region]
    background = max(float(outside.mean()) if outside.size else 0.0, 1e-3 * max(float(c.sum()), 1.0) / c.size)
    mix: GridMixture | None = GridMixture(np.array(masses), np.array(means), np.array(covs), tuple(range(clusters)),
                                          background)
    assert mix is not None
    mix, chi2 = fit_mixture(data, mix, range(clusters), fit_background=True)
    if mix is None:
        return _no_split(lab, "the one-Gaussian-per-mode fit lost a component")
    dof = data.counts.size - mix.parameter_count(True)
    if dof < 1:
        return _no_split(lab, "too few cells to test a mixture", mix, chi2, dof)
    fits = chi2 <= chi2_distribution.ppf(1.0 - level, dof)
    # The likelihood-ratio gate of one more component (module docstring: twice its parameters).
    gate = float(chi2_distribution.ppf(1.0 - level / clusters, 2 * (mix.parameter_count(False) // mix.components)))
    terms = mixture_chi2(data, mix)
    owner = np.asarray(mix.owners)[_most_likely(data, mix)[0]]
    excess = []
    for k in range(clusters):
        cells = owner == k
        excess.append(((terms[cells].sum() - cells.sum()) / math.sqrt(2.0 * max(int(cells.sum()), 1)), k))
    split_modes = 0
    for _, k in sorted(excess, reverse=True):
        cells = owner == k
        cells_level = level / clusters
        while True:
            free = [j for j in range(mix.components) if mix.owners[j] == k]
            cells_dof = int(cells.sum()) - mix.parameter_count(False) // mix.components * len(free)
            own_chi2 = float(mixture_chi2(data, mix)[cells].sum())
            if cells_dof < 1 or (not fits and own_chi2 <= chi2_distribution.ppf(1.0 - cells_level, cells_dof)):
                break
            if len(free) >= max_components_per_mode:
                if fits:
                    break
                return _no_split(lab, f"density cluster {k} is no mixture of {max_components_per_mode} Gaussians", mix,
                                 chi2, dof)
            screened: list[tuple[float, int, GridMixture]] = []
            likely = _most_likely(data, mix)[0]
            for j in free:
                mine = likely == j
                for how in ("longest", "shortest", "halo", "2-means"):
                    start = _split(mix, j, how, data.corners[mine], np.maximum(data.counts[mine], 0.0))
                    if start is None:
                        continue
                    fitted, fitted_chi2 = fit_mixture(data, start, [*free, start.components - 1], fit_background=False,
                                                      region=cells, max_evaluations=_SCREEN_EVALUATIONS)
                    if fitted is not None:
                        screened.append((fitted_chi2, len(screened), fitted))
            best: tuple[GridMixture, float] | None = None
            for _, _, start in sorted(screened, key=lambda t: t[:2])[:_SCREEN_KEEP]:
                fitted, fitted_chi2 = fit_mixture(data, start, [*free, start.components - 1], fit_background=False,
                                                  region=cells)
                if fitted is not None and (best is None or fitted_chi2 < best[1]):
                    best = (fitted, fitted_chi2)
            if best is None or own_chi2 - best[1] < gate:
                if fits:
                    break
                return _no_split(lab, f"no significant split of density cluster {k}", mix, chi2, dof)
            mix = best[0]
            cells = cells | (np.asarray(mix.owners)[_most_likely(data, mix)[0]] == k)
        split_modes += int(sum(1 for o in mix.owners if o == k) > 1)
    if split_modes == 0:
        return _no_split(lab, "one Gaussian per density mode fits" if fits
                         else "every density mode is one Gaussian on its own cells", mix, chi2, dof)
    refitted, chi2 = fit_mixture(data, mix, range(mix.components), fit_background=True)
    if refitted is None:
        return _no_split(lab, "the split mixture lost a component", mix, math.inf, dof)
    mix = refitted
    dof = data.counts.size - mix.parameter_count(True)
    if dof < 1 or chi2 > chi2_distribution.ppf(1.0 - level, dof):
        return _no_split(lab, "the split mixture does not fit the counts", mix, chi2, dof)
    likely, height = _most_likely(data, mix)
    new = np.full(c.size, -1, dtype=np.int64)
    observed = np.flatnonzero(region)
    keep = (own_labels >= 0) & (height >= mix.background)
    new[observed[keep]] = likely[keep]
    return MixtureSplit(labels=new.reshape(c.shape), split=True, mixture=mix, chi2=chi2, dof=dof,
                        modes_split=split_modes, reason=f"{split_modes} density mode(s) split into Gaussian components")
