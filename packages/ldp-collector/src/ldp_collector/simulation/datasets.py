"""Datasets for simulations, demos and benchmarks: generated in code, bundled with scikit-learn, or
read from a local file. Nothing is downloaded at run time.

Every dataset comes back as a :class:`DatasetArrays`: the pair ``(X, labels)``, ``X`` a float64
array of shape ``(n, d)`` and ``labels`` an int64 array of shape ``(n,)`` with each point's
generating cluster or true class (``None`` for an unlabelled file), so ``x, labels =
make_dataset(...)`` unpacks it; its ``meta`` mapping says what the data are (name, n, d, k, seed,
the parameters used and, for the real data sets, whether they were sub- or upsampled).

=============  ==============================================================  ===========  =========
name           what                                                            d, k         options
=============  ==============================================================  ===========  =========
blobs          isotropic Gaussian blobs, centers uniform in [-10, 10]^d        any, any
moons          two interleaving half circles, noise 0.05                       2, 2
circles        a small circle inside a large one (factor 0.5), noise 0.05     2, 2
aniso          three blobs sheared by [[0.6, -0.6], [-0.4, 0.8]]               2, 3
varied         three blobs with standard deviations 1.0, 2.5 and 0.5          2, 3
spirals        k interleaved Archimedean arms of 1.5 turns, noise 0.025       2, 2-8 (3)
rings          nested rings of radius 1 .. k, equal counts (outer sparser)     2, 2-6 (3)
sizes          k blobs of geometric sizes, the smallest 1 % of n               2, 2-8 (4)
background     k blobs (90 %) over uniform background (10 %, label k)          2, 1-8 (3)
mixture        Gaussian mixture with unequal weights and spreads              any, any     separation,
                                                                                                imbalance
google         Google's central DP clustering demo: clusters in the unit ball  any, any     ratio
iris           scikit-learn's bundled iris (150 points)                        4, 3         jitter
wine           scikit-learn's bundled wine (178 points)                        13, 3        jitter
digits         scikit-learn's bundled 8x8 digits (1797 points)                 64, 10       jitter
breast_cancer  scikit-learn's bundled Wisconsin breast cancer (569 points)    30, 2        jitter
digits2d       digits on their first 2 principal components (a projection)    2, 10        jitter
airports       airportsdata's ~28 000 airports, (longitude, latitude)          2, 10        jitter
=============  ==============================================================  ===========  =========

The 2-D shapes and ``blobs`` follow scikit-learn's generators and its clustering comparison
gallery (``make_moons``, ``make_circles``, ``make_blobs``, anisotropic and varied blobs),
reimplemented in numpy. ``spirals``, ``rings``, ``sizes`` and ``background`` are the hard 2-D
cases beyond them (arbitrary shapes, unequal densities, clusters down to 1 % of n, background
noise: ``background``'s labels run 0 .. k, label k the background); each generator's docstring
says exactly how its points are drawn. The real data sets need the optional extra ``datasets``
(``pip install "ldp-collector[datasets]"``, which installs scikit-learn and airportsdata);
``airports`` is a genuinely 2-D, strongly non-uniform real point set (45 % of its points in the
United States) labelled by time-zone area, ``digits2d`` a 2-D projection of ``digits``; asking for
more points than the data set holds upsamples it with Gaussian jitter, and says so in ``meta``.

Large n
    :func:`iter_chunks` yields the same points as :func:`make_dataset`, in chunks. For the
    streaming datasets (``Dataset.streaming``: ``mixture``, ``google`` and the real data sets)
    memory stays bounded by the chunk, whatever n; the others (exact cluster sizes, then one
    shuffle of the whole set, as scikit-learn's generators) are generated whole and then cut.

Randomness
    Everything comes from ``numpy.random`` seeded with ``seed``: the data are reproducible and say
    nothing about privacy (the devices' randomization is the SDK's business). A streaming dataset
    draws its parameters (centers, weights, spreads) from ``default_rng(seed)``; point ``i`` lies
    in block ``i // BLOCK`` and block ``b`` draws from its own stream
    ``SeedSequence(seed, spawn_key=(b,))``, so any chunking reproduces the same points.

:func:`load_file` reads a CSV or ``.npy`` file, optionally splitting off a label column.
"""

from __future__ import annotations

import abc
import csv
import importlib
import math
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, TextIO

import numpy as np
from numpy.typing import NDArray

from ldp_client.errors import InvalidParameterError, LdpError

__all__ = [
    "BLOCK",
    "DATASETS",
    "DEFAULT_CHUNK",
    "MAX_POINTS",
    "Dataset",
    "DatasetArrays",
    "DatasetsExtraMissingError",
    "LABEL_NAMES",
    "iter_chunks",
    "label_column_hint",
    "load_file",
    "make_dataset",
]

#: Largest number of points a dataset makes (8 GB of float64 at d = 100 in memory: use
#: :func:`iter_chunks` for large n and d).
MAX_POINTS = 10_000_000
#: Largest dimension of the generators that take ``d``.
MAX_DIMENSION = 1024
#: Largest number of clusters of the generators that take ``k``.
MAX_CLUSTERS = 4096
#: Points per random block of the streaming datasets (the unit of their seeding).
BLOCK = 65_536
#: Points per chunk of :func:`iter_chunks` unless told.
DEFAULT_CHUNK = 1_000_000

_INSTALL_HINT = 'pip install "ldp-collector[datasets]"'

_Arrays = tuple[NDArray[np.float64], NDArray[np.int64]]
_FileArrays = tuple[NDArray[np.float64], NDArray[np.int64] | None]
#: ``generate(n, d, k, rng) -> (X, labels)``: an in-memory generator.
Generator = Callable[[int, int, int, np.random.Generator], _Arrays]
#: ``draw(rng, size) -> (X, labels)``: ``size`` points of one block of a streaming dataset.
BlockDraw = Callable[[np.random.Generator, int], _Arrays]


class DatasetsExtraMissingError(LdpError, ImportError):
    """A real data set needs a package of the ``datasets`` extra that is not installed; the message
    has the install hint."""


class DatasetArrays(tuple[NDArray[np.float64], NDArray[np.int64] | None]):
    """``(X, labels)`` with a read-only ``meta`` mapping describing the data.

    A tuple, so that ``x, labels = make_dataset(...)`` keeps working, with the description
    riding along instead of a third element every caller would have to unpack.

    Attributes
    ----------
    x : numpy.ndarray of float64, shape (n, d)
    labels : numpy.ndarray of int64, shape (n,), or None
    meta : Mapping[str, Any]
        ``name``, ``n``, ``d``, ``k``, ``seed`` and the options used; ``background_label`` (= ``k``)
        when the labels mark uniform background noise; ``upsampled_from`` (the real
        data set's size) and ``jitter`` when the points were upsampled, ``subsampled_from`` when
        a subset; ``offset`` (index of the first point) for a chunk of :func:`iter_chunks`;
        ``source`` for a file. Values are plain numbers and strings (JSON-ready).
    """

    meta: Mapping[str, Any]

    def __new__(cls, x: NDArray[np.float64], labels: NDArray[np.int64] | None,
                meta: Mapping[str, Any] | None = None) -> DatasetArrays:
        self = super().__new__(cls, (x, labels))
        self.meta = MappingProxyType(dict(meta or {}))
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        # The mapping proxy does not pickle; rebuild from plain parts (the runner uses processes).
        return (DatasetArrays, (self[0], self[1], dict(self.meta)))

    @property
    def x(self) -> NDArray[np.float64]:
        return self[0]

    @property
    def labels(self) -> NDArray[np.int64] | None:
        return self[1]


# -- options ------------------------------------------------------------------------------------------

#: Option name -> (low, high, low included): every option is a real number in its range.
_OPTION_RANGES: dict[str, tuple[float, float, bool]] = {
    "separation": (0.0, 1000.0, False),
    "imbalance": (1.0, 1e6, True),
    "ratio": (1.0, 1e6, False),
    "jitter": (0.0, 10.0, True),
}


def _collect_options(separation: float | None, imbalance: float | None, ratio: float | None,
                     jitter: float | None) -> dict[str, float]:
    given = {"separation": separation, "imbalance": imbalance, "ratio": ratio, "jitter": jitter}
    out: dict[str, float] = {}
    for name, value in given.items():
        if value is None:
            continue
        low, high, closed = _OPTION_RANGES[name]
        ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) \
            and math.isfinite(value) and (low <= value if closed else low < value) and value <= high
        if not ok:
            bracket = "[" if closed else "("
            raise InvalidParameterError(f"{name} must be a number in {bracket}{low:g}, {high:g}], got {value!r}")
        out[name] = float(value)
    return out


# -- plans: how the points of one request are made ----------------------------------------------------

class _Plan(abc.ABC):
    """The points of one request, ``points(start, stop)`` in order, and their description."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self.meta = meta

    @abc.abstractmethod
    def points(self, start: int, stop: int) -> _Arrays:
        """Points ``start`` to ``stop`` (exclusive) of the request, with their labels."""


class _ArrayPlan(_Plan):
    """Points generated whole, cut on request."""

    def __init__(self, x: NDArray[np.float64], labels: NDArray[np.int64], meta: dict[str, Any]) -> None:
        super().__init__(meta)
        self.x = np.ascontiguousarray(x, dtype=np.float64)
        self.labels = labels.astype(np.int64, copy=False)

    def points(self, start: int, stop: int) -> _Arrays:
        return self.x[start:stop], self.labels[start:stop]


class _BlockPlan(_Plan):
    """Points drawn block by block, block ``b`` from ``SeedSequence(seed, spawn_key=(b,))``."""

    def __init__(self, n: int, d: int, seed: int, draw: BlockDraw, meta: dict[str, Any]) -> None:
        super().__init__(meta)
        self.n, self.d, self.seed, self.draw = n, d, seed, draw
        self._last: tuple[int, NDArray[np.float64], NDArray[np.int64]] | None = None

    def _block(self, b: int) -> _Arrays:
        # Keep the last block: a chunk boundary inside a block would otherwise draw it twice.
        if self._last is None or self._last[0] != b:
            size = min(BLOCK, self.n - b * BLOCK)
            rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(b,)))
            x, labels = self.draw(rng, size)
            self._last = (b, x, labels)
        return self._last[1], self._last[2]

    def points(self, start: int, stop: int) -> _Arrays:
        x = np.empty((stop - start, self.d))
        labels = np.empty(stop - start, dtype=np.int64)
        for b in range(start // BLOCK, (stop - 1) // BLOCK + 1):
            bx, bl = self._block(b)
            lo, hi = max(start, b * BLOCK), min(stop, (b + 1) * BLOCK)
            x[lo - start:hi - start] = bx[lo - b * BLOCK:hi - b * BLOCK]
            labels[lo - start:hi - start] = bl[lo - b * BLOCK:hi - b * BLOCK]
        return x, labels


#: ``sampler(n, d, k, seed, options) -> plan``.
Sampler = Callable[[int, int, int, int, Mapping[str, float]], _Plan]


def _in_memory(generate: Generator) -> Sampler:
    """A sampler for a whole-set generator seeded with ``default_rng(seed)``."""

    def sampler(n: int, d: int, k: int, seed: int, options: Mapping[str, float]) -> _Plan:
        x, labels = generate(n, d, k, np.random.default_rng(seed))
        return _ArrayPlan(x, labels, {})

    return sampler


# -- the registry ---------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Dataset:
    """One registered dataset.

    Attributes
    ----------
    name : str
    description : str
        One line, for ``--help`` and listings.
    sampler : callable
        ``sampler(n, d, k, seed, options) -> plan`` (internal protocol: a plan makes the points
        ``start:stop`` on request and holds the description).
    default_d, default_k : int
        Dimension and number of clusters used when the caller gives none.
    fixed_d, fixed_k : bool
        Whether the shape only exists with its defaults (moons is 2-D with 2 clusters).
    options : tuple of str
        The keyword options it takes (``separation``, ``imbalance``, ``ratio``, ``jitter``).
    streaming : bool
        Whether :func:`iter_chunks` runs in memory bounded by the chunk.
    extra : str or None
        The optional dependency extra it needs (``"datasets"``), if any.
    k_range : (int, int)
        The numbers of clusters it can make, both ends included.
    background : bool
        Whether label ``k`` marks uniform background noise (the labels then run ``0 .. k``, and a
        clustering that calls those points noise is right).
    """

    name: str
    description: str
    sampler: Sampler
    default_d: int = 2
    default_k: int = 3
    fixed_d: bool = False
    fixed_k: bool = False
    options: tuple[str, ...] = ()
    streaming: bool = False
    extra: str | None = None
    k_range: tuple[int, int] = (1, MAX_CLUSTERS)
    background: bool = False

    def __call__(self, n: int, *, d: int | None = None, k: int | None = None, seed: int = 0,
                 separation: float | None = None, imbalance: float | None = None, ratio: float | None = None,
                 jitter: float | None = None) -> DatasetArrays:
        """Generate ``n`` points; see :func:`make_dataset`."""
        plan = self._plan(n, d=d, k=k, seed=seed, options=_collect_options(separation, imbalance, ratio, jitter))
        x, labels = plan.points(0, n)
        return DatasetArrays(x, labels, plan.meta)

    def _plan(self, n: int, *, d: int | None, k: int | None, seed: int, options: Mapping[str, float]) -> _Plan:
        """Validate a request and prepare its points (nothing big is drawn yet for streaming data)."""
        n = _check_count("n", n, 1, MAX_POINTS)
        d = self._resolve("d", d, self.default_d, self.fixed_d, MAX_DIMENSION)
        k = self._resolve("k", k, self.default_k, self.fixed_k, MAX_CLUSTERS)
        if not self.k_range[0] <= k <= self.k_range[1]:
            raise InvalidParameterError(
                f"dataset {self.name!r} has k in [{self.k_range[0]}, {self.k_range[1]}], got k = {k}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise InvalidParameterError(f"seed must be a non-negative integer, got {seed!r}")
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            takes = f"it takes {', '.join(self.options)}" if self.options else "it takes none"
            raise InvalidParameterError(f"dataset {self.name!r} has no option {unknown[0]!r}; {takes}")
        plan = self.sampler(n, d, k, int(seed), options)
        plan.meta = {"name": self.name, "n": n, "d": d, "k": k, "seed": int(seed), **options, **plan.meta}
        if self.background:
            plan.meta["background_label"] = k
        return plan

    def _resolve(self, name: str, value: int | None, default: int, fixed: bool, high: int) -> int:
        if value is None:
            return default
        value = _check_count(name, value, 1, high)
        if fixed and value != default:
            raise InvalidParameterError(
                f"dataset {self.name!r} has {name} = {default} only, got {name} = {value}")
        return value


def _check_count(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise InvalidParameterError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


# -- the 2-D shapes and blobs (whole-set generators, as scikit-learn's) ---------------------------------

def _shuffle(x: NDArray[np.float64], labels: NDArray[np.int64], rng: np.random.Generator) -> _Arrays:
    order = rng.permutation(len(labels))
    return x[order], labels[order]


def _even_sizes(n: int, k: int) -> NDArray[np.int64]:
    """``n`` split into ``k`` sizes as evenly as possible (the first ``n % k`` one larger)."""
    sizes = np.full(k, n // k, dtype=np.int64)
    sizes[: n % k] += 1
    return sizes


def _gaussian_blobs(sizes: NDArray[np.int64], centers: NDArray[np.float64], stds: NDArray[np.float64],
                    rng: np.random.Generator) -> _Arrays:
    """``sizes[j]`` points from N(centers[j], stds[j]^2 I), labelled j (unshuffled)."""
    d = centers.shape[1]
    labels = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    x = rng.normal(size=(int(sizes.sum()), d)) * stds[labels, None] + centers[labels]
    return x, labels


def blobs(n: int, d: int, k: int, rng: np.random.Generator) -> _Arrays:
    """Like ``sklearn.datasets.make_blobs(n, n_features=d, centers=k, cluster_std=1.0)``.

    Centers uniform in ``[-10, 10]^d``; the first ``n % k`` blobs get one point more.
    """
    centers = rng.uniform(-10.0, 10.0, size=(k, d))
    x, labels = _gaussian_blobs(_even_sizes(n, k), centers, np.ones(k), rng)
    return _shuffle(x, labels, rng)


def moons(n: int, d: int, k: int, rng: np.random.Generator) -> _Arrays:
    """Like ``sklearn.datasets.make_moons(n, noise=0.05)``: two interleaving half circles."""
    n_out = n // 2
    n_in = n - n_out
    t_out = np.linspace(0.0, math.pi, n_out)
    t_in = np.linspace(0.0, math.pi, n_in)
    x = np.vstack([
        np.column_stack([np.cos(t_out), np.sin(t_out)]),
        np.column_stack([1.0 - np.cos(t_in), 1.0 - np.sin(t_in) - 0.5]),
    ])
    labels = np.concatenate([np.zeros(n_out, dtype=np.int64), np.ones(n_in, dtype=np.int64)])
    x, labels = _shuffle(x, labels, rng)
    return x + rng.normal(scale=0.05, size=x.shape), labels


def circles(n: int, d: int, k: int, rng: np.random.Generator) -> _Arrays:
    """Like ``sklearn.datasets.make_circles(n, noise=0.05, factor=0.5)``: label 0 outside, 1 inside."""
    n_out = n // 2
    n_in = n - n_out
    t_out = np.linspace(0.0, 2.0 * math.pi, n_out, endpoint=False)
    t_in = np.linspace(0.0, 2.0 * math.pi, n_in, endpoint=False)
    x = np.vstack([
        np.column_stack([np.cos(t_out), np.sin(t_out)]),
        0.5 * np.column_stack([np.cos(t_in), np.sin(t_in)]),
    ])
    labels = np.concatenate([np.zeros(n_out, dtype=np.int64), np.ones(n_in, dtype=np.int64)])
    x, labels = _shuffle(x, labels, rng)
    return x + rng.normal(scale=0.05, size=x.shape), labels


def aniso(n: int, d: int, k: int, rng: np.random.Generator) -> _Arrays:
    """Three blobs sheared by ``[[0.6, -0.6], [-0.4, 0.8]]`` (scikit-learn's clustering gallery)."""
    x, labels = blobs(n, 2, 3, rng)
    return x @ np.array([[0.6, -0.6], [-0.4, 0.8]]), labels


def varied(n: int, d: int, k: int, rng: np.random.Generator) -> _Arrays:
    """Three blobs with standard deviations 1.0, 2.5 and 0.5 (scikit-learn's clustering gallery)."""
    centers = rng.uniform(-10.0, 10.0, size=(3, 2))
    x, labels = _gaussian_blobs(_even_sizes(n, 3), centers, np.array([1.0, 2.5, 0.5]), rng)
    return _shuffle(x, labels, rng)


#: Spirals: inner radius (the outer is 1), turns of each arm, noise standard deviation.
SPIRAL_R0, SPIRAL_TURNS, SPIRAL_NOISE = 0.15, 1.5, 0.025


def spirals(n: int, d: int, k: int, rng: np.random.Generator) -> _Arrays:
    """``k`` interleaved Archimedean spiral arms (2-D, k in [2, 8], default 3), label = arm.

    Arm ``j`` is the curve ``r(t) = r0 + (1 - r0) t``, angle ``2 pi j / k + 2 pi * 1.5 t`` for
    ``t`` in [0, 1], with ``r0 = 0.15`` (:data:`SPIRAL_R0`): the outer radius is 1 and every arm
    makes 1.5 turns. Each arm gets ``n / k`` points (the first ``n % k`` arms one more); each
    point's ``t`` is the exact inverse of the arc length at a uniform fraction of the arm's length
    (the arc length tabulated on 4097 values of ``t``, linearly interpolated), so points are
    uniform along the arm; isotropic Gaussian noise of standard deviation 0.025
    (:data:`SPIRAL_NOISE`) is added to each point. The points come shuffled.

    Along any ray from the centre, neighbouring arms cross ``(1 - r0) / (1.5 k) = 0.57 / k``
    apart: 0.19 for k = 3, about 7.6 noise standard deviations, so density-based clustering
    (DBSCAN) of the noisy points separates the arms; at k = 8 the gap is 0.071 (2.8 standard
    deviations) and the arms begin to touch.
    """
    sizes = _even_sizes(n, k)
    labels = np.repeat(np.arange(k, dtype=np.int64), sizes)
    omega = 2.0 * math.pi * SPIRAL_TURNS
    grid = np.linspace(0.0, 1.0, 4097)
    speed = np.hypot(1.0 - SPIRAL_R0, (SPIRAL_R0 + (1.0 - SPIRAL_R0) * grid) * omega)  # |d(x, y) / dt|
    length = np.concatenate([[0.0], np.cumsum((speed[1:] + speed[:-1]) / 2.0 * np.diff(grid))])
    t = np.interp(rng.uniform(0.0, length[-1], size=n), length, grid)
    radius = SPIRAL_R0 + (1.0 - SPIRAL_R0) * t
    angle = 2.0 * math.pi * labels / k + omega * t
    x = np.column_stack([radius * np.cos(angle), radius * np.sin(angle)])
    x += rng.normal(scale=SPIRAL_NOISE, size=x.shape)
    return _shuffle(x, labels, rng)


def rings(n: int, d: int, k: int, rng: np.random.Generator) -> _Arrays:
    """``k`` nested rings of unequal density (2-D, k in [2, 6], default 3), label = ring.

    Ring ``j`` (0 = innermost) has radius ``j + 1``; each of its points lies at a uniform angle
    and at radius ``j + 1 + N(0, 0.1^2)``. Every ring holds ``n / k`` points (the first
    ``n % k`` rings one more), so the density along a ring falls as ``1 / radius``: the
    outermost ring is ``k`` times sparser than the innermost. The gap between neighbouring
    rings (1) is ten radial standard deviations. The points come shuffled.
    """
    labels = np.repeat(np.arange(k, dtype=np.int64), _even_sizes(n, k))
    angle = rng.uniform(0.0, 2.0 * math.pi, size=n)
    radius = labels + 1.0 + rng.normal(scale=0.1, size=n)
    x = np.column_stack([radius * np.cos(angle), radius * np.sin(angle)])
    return _shuffle(x, labels, rng)


#: Distance between neighbouring blob centres of ``sizes`` and ``background``, in blob standard deviations.
_CIRCLE_SPACING = 10.0


def _circle_centers(k: int, rng: np.random.Generator) -> NDArray[np.float64]:
    """``k`` centres evenly on a circle, neighbours ``_CIRCLE_SPACING`` apart, rotated by a
    uniform random angle (so that no grid is aligned with them on every seed)."""
    if k == 1:
        return np.zeros((1, 2))
    radius = _CIRCLE_SPACING / (2.0 * math.sin(math.pi / k))
    angle = rng.uniform(0.0, 2.0 * math.pi) + 2.0 * math.pi * np.arange(k) / k
    out: NDArray[np.float64] = radius * np.column_stack([np.cos(angle), np.sin(angle)])
    return out


def _largest_remainder(n: int, shares: NDArray[np.float64]) -> NDArray[np.int64]:
    """Integer sizes summing to ``n``, each ``n * share`` rounded down or up (largest remainders up)."""
    exact = n * shares
    sizes = np.floor(exact).astype(np.int64)
    sizes[np.argsort(-(exact - sizes), kind="stable")[: n - int(sizes.sum())]] += 1
    return sizes


#: Share of ``n`` in the smallest cluster of ``sizes``.
SMALLEST_SHARE = 0.01


def size_shares(k: int) -> NDArray[np.float64]:
    """The cluster shares of :func:`sized_blobs`: ``q^j / sum_i q^i`` with ``q`` in (0, 1] such that the
    last (smallest) is exactly :data:`SMALLEST_SHARE` (found by bisection)."""
    exponents = np.arange(k)

    def smallest(q: float) -> float:
        powers = q ** exponents
        return float(powers[-1] / powers.sum())

    low, high = 0.0, 1.0  # smallest(q) rises from 0 to 1 / k >= 0.01 on (0, 1]
    for _ in range(100):
        middle = (low + high) / 2.0
        low, high = (middle, high) if smallest(middle) < SMALLEST_SHARE else (low, middle)
    powers = ((low + high) / 2.0) ** exponents
    out: NDArray[np.float64] = powers / powers.sum()
    return out


def sized_blobs(n: int, d: int, k: int, rng: np.random.Generator) -> _Arrays:
    """``k`` Gaussian blobs of very different sizes, down to 1 % of n (2-D, k in [2, 8], default 4).

    Registered as ``sizes``. Blob ``j`` (the label) holds the share ``q^j / sum_i q^i`` of the
    points (:func:`size_shares`),
    ``q`` chosen so that the smallest holds exactly 1 %: 76.7 / 18.0 / 4.2 / 1.0 % for k = 4,
    99 / 1 % for k = 2; the counts are ``n`` times the shares, rounded by largest remainder (they
    sum to ``n``). Every blob is isotropic with standard deviation 1; the centres lie evenly on
    a circle rotated by a uniform random angle, neighbours 10 standard deviations apart. The
    points come shuffled.
    """
    x, labels = _gaussian_blobs(_largest_remainder(n, size_shares(k)), _circle_centers(k, rng), np.ones(k), rng)
    return _shuffle(x, labels, rng)


#: ``background`` draws ``n // BACKGROUND_PARTS`` points (10 %) uniformly as background.
BACKGROUND_PARTS = 10


def background(n: int, d: int, k: int, rng: np.random.Generator) -> _Arrays:
    """``k`` Gaussian blobs over uniform background noise (2-D, k in [1, 8], default 3).

    ``n - n // 10`` points form ``k`` equal blobs (labels ``0 .. k-1``, the first blobs one
    point larger when ``k`` does not divide the count), isotropic with standard deviation 1,
    centres evenly on a circle rotated by a uniform random angle, neighbours 10 standard
    deviations apart. The other ``n // 10`` points (10 %, :data:`BACKGROUND_PARTS`) are uniform
    over the box ``[min_j c_j - 6, max_j c_j + 6]`` per axis (the blobs' 3-standard-deviation
    extent widened by 3 more) and carry label ``k``: background is its own class, so a
    clustering that calls it noise is right (``meta["background_label"]`` is ``k``). The points
    come shuffled.
    """
    centers = _circle_centers(k, rng)
    count = n // BACKGROUND_PARTS
    blob_x, blob_labels = _gaussian_blobs(_even_sizes(n - count, k), centers, np.ones(k), rng)
    noise = rng.uniform(centers.min(axis=0) - 6.0, centers.max(axis=0) + 6.0, size=(count, 2))
    x = np.vstack([blob_x, noise])
    labels = np.concatenate([blob_labels, np.full(count, k, dtype=np.int64)])
    return _shuffle(x, labels, rng)


# -- Gaussian mixtures (streaming) ----------------------------------------------------------------------

def _separate(centers: NDArray[np.float64], stds: NDArray[np.float64], separation: float) -> NDArray[np.float64]:
    """Centers scaled about the origin so that ``min |c_a - c_b| / (s_a + s_b)`` over pairs equals
    ``separation``."""
    if len(centers) < 2:
        return centers
    gaps = np.sqrt(((centers[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2))
    ratios = gaps / (stds[:, None] + stds[None, :])
    smallest = float(ratios[np.triu_indices(len(centers), 1)].min())
    if smallest <= 0:  # two coinciding centers (probability 0): no scale can separate them
        raise InvalidParameterError("two mixture centers coincide; use another seed")
    out: NDArray[np.float64] = centers * (separation / smallest)
    return out


def mixture(n: int, d: int, k: int, seed: int, options: Mapping[str, float]) -> _Plan:
    """A Gaussian mixture, drawn point by point (streaming).

    Centers uniform in ``[-10, 10]^d``; standard deviations uniform in ``[0.5, 1.5]``; weights
    from a Dirichlet(4) draw (unequal but none negligible); each point's component drawn from
    the weights, so cluster sizes are multinomial.

    Options
    -------
    separation : float in (0, 1000]
        Scale the centers so that the closest pair sits ``separation * (s_a + s_b)`` apart
        (``s`` their standard deviations): about 1 overlaps visibly, 3 and more separates well.
    imbalance : float in [1, 1e6]
        Weights ``imbalance^(-j / (k - 1))`` for cluster ``j`` (normalized) instead of the
        Dirichlet draw: cluster 0 is ``imbalance`` times as likely as cluster ``k - 1``
        (1 = equal sizes).
    """
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-10.0, 10.0, size=(k, d))
    weights = rng.dirichlet(np.full(k, 4.0))
    stds = rng.uniform(0.5, 1.5, size=k)
    if "imbalance" in options:
        weights = options["imbalance"] ** (-np.arange(k) / max(k - 1, 1))
        weights /= weights.sum()
    if "separation" in options:
        centers = _separate(centers, stds, options["separation"])

    def draw(block: np.random.Generator, size: int) -> _Arrays:
        labels = block.choice(k, size=size, p=weights).astype(np.int64)
        x = centers[labels] + block.normal(size=(size, d)) * stds[labels, None]
        return x, labels

    return _BlockPlan(n, d, seed, draw, {})


def _uniform_ball(rng: np.random.Generator, count: int, d: int, radius: float) -> NDArray[np.float64]:
    """``count`` points uniform in the d-ball of ``radius`` (normal direction, radius ``u^(1/d)``)."""
    directions = rng.normal(size=(count, d))
    radii = radius * rng.uniform(0.0, 1.0, size=count) ** (1.0 / d)
    norms = np.linalg.norm(directions, axis=1)
    out: NDArray[np.float64] = directions * (radii / np.where(norms > 0, norms, 1.0))[:, None]
    return out


def google(n: int, d: int, k: int, seed: int, options: Mapping[str, float]) -> _Plan:
    """The generator of Google's central DP clustering demo (``learning/clustering/demo``).

    Centers uniform in the ball of radius ``1 - 1/ratio``; each point one center plus
    N(0, sigma^2 I) with ``sigma = 1 / (ratio * sqrt(d))``; points outside the unit ball scaled
    back onto it. ``ratio`` (default 10) is the ratio of inter- to intra-cluster distance.
    Unlike the demo, which makes equal clusters (the remainder in the last) in cluster order,
    each point's cluster is drawn uniformly, so the data come shuffled and can be streamed.
    """
    ratio = options.get("ratio", 10.0)
    rng = np.random.default_rng(seed)
    centers = _uniform_ball(rng, k, d, 1.0 - 1.0 / ratio)
    sigma = 1.0 / (ratio * math.sqrt(d))

    def draw(block: np.random.Generator, size: int) -> _Arrays:
        labels = block.integers(0, k, size=size, dtype=np.int64)
        x = centers[labels] + sigma * block.normal(size=(size, d))
        norms = np.linalg.norm(x, axis=1)
        outside = norms > 1.0
        x[outside] /= norms[outside, None]
        return x, labels

    return _BlockPlan(n, d, seed, draw, {"ratio": ratio, "sigma": sigma})


# -- real data sets shipped inside installable packages --------------------------------------------------

#: Default jitter of upsampled real data, in units of each feature's standard deviation.
_DEFAULT_JITTER = 0.1

#: ``read(module) -> (X, classes, source)``: a real data set from its imported module.
_Reader = Callable[[Any], tuple[Any, Any, str]]


@dataclass(frozen=True, kw_only=True)
class _RealSource:
    """A real data set read from the data bundled in an installed package (no download)."""

    #: Module imported to read it, and the distribution that installs it (named in errors).
    module: str
    package: str
    read: _Reader
    #: Points, or None when they depend on the installed release of the package.
    size: int | None
    d: int
    k: int
    description: str
    #: Default jitter when upsampling, in feature standard deviations.
    jitter: float = _DEFAULT_JITTER


def _sklearn(loader: str) -> _Reader:
    """Reader of ``sklearn.datasets.<loader>``: its points and classes as bundled."""

    def read(module: Any) -> tuple[Any, Any, str]:
        x, y = getattr(module, loader)(return_X_y=True)
        return x, y, f"sklearn.datasets.{loader}"

    return read


def _principal_components(x: NDArray[np.float64], count: int) -> NDArray[np.float64]:
    """``x`` centred and projected on its first ``count`` principal axes (SVD), each axis signed so
    that its largest loading is positive (the projection is then unique, whatever the LAPACK)."""
    centred = x - x.mean(axis=0)
    _, _, axes = np.linalg.svd(centred, full_matrices=False)
    axes = axes[:count]
    axes *= np.sign(axes[np.arange(count), np.abs(axes).argmax(axis=1)])[:, None]
    out: NDArray[np.float64] = centred @ axes.T
    return out


def _read_digits2d(module: Any) -> tuple[Any, Any, str]:
    """scikit-learn's 8x8 digits on their first two principal components, labelled by digit."""
    x, y = module.load_digits(return_X_y=True)
    return _principal_components(np.asarray(x, dtype=np.float64), 2), y, \
        "sklearn.datasets.load_digits, 2 principal components"


#: The time-zone areas (first part of an IANA zone name) that label ``airports``, in label order.
AIRPORT_REGIONS = ("Africa", "America", "Antarctica", "Arctic", "Asia", "Atlantic", "Australia", "Europe",
                   "Indian", "Pacific")


def _read_airports(module: Any) -> tuple[Any, Any, str]:
    """``airportsdata``'s airports as (longitude, latitude), labelled by time-zone area."""
    airports = list(module.load("ICAO").values())
    x = np.array([[float(a["lon"]), float(a["lat"])] for a in airports], dtype=np.float64)
    # The package leaves the zone empty in Antarctica (country AQ).
    areas = [a["tz"].split("/")[0] if a["tz"] else ("Antarctica" if a["country"] == "AQ" else "") for a in airports]
    unknown = sorted(set(areas) - set(AIRPORT_REGIONS))
    if unknown:
        raise InvalidParameterError(f"airportsdata {module.__version__} has airports in time-zone areas "
                                    f"{unknown} outside {AIRPORT_REGIONS}")
    labels = np.array([AIRPORT_REGIONS.index(area) for area in areas], dtype=np.int64)
    return x, labels, f"airportsdata {module.__version__}"


#: name -> where the real data set comes from and what it is.
_REAL_DATA: dict[str, _RealSource] = {
    **{
        name: _RealSource(module="sklearn.datasets", package="scikit-learn", read=_sklearn(f"load_{name}"),
                          size=size, d=d, k=k,
                          description=f"scikit-learn's {name.replace('_', ' ')} data ({d}-D, {k} classes)")
        for name, size, d, k in (("iris", 150, 4, 3), ("wine", 178, 13, 3), ("digits", 1797, 64, 10),
                                 ("breast_cancer", 569, 30, 2))
    },
    "digits2d": _RealSource(module="sklearn.datasets", package="scikit-learn", read=_read_digits2d, size=1797,
                            d=2, k=10, description="scikit-learn's digits projected on their first two principal "
                                                   "components (2-D, 10 digits)"),
    # Airfields at kilometre scale: the default jitter (6 degrees of longitude) would smear them.
    "airports": _RealSource(module="airportsdata", package="airportsdata", read=_read_airports, size=None, d=2,
                            k=len(AIRPORT_REGIONS), jitter=0.01,
                            description="the world's airports and airstrips, longitude and latitude "
                                        "(2-D, 10 time-zone areas)"),
}


@cache
def _real_data(name: str) -> tuple[NDArray[np.float64], NDArray[np.int64], str]:
    """The real data set and its source (read-only arrays, loaded once per process)."""
    real = _REAL_DATA[name]
    try:
        module = importlib.import_module(real.module)
    except ImportError as exc:
        raise DatasetsExtraMissingError(
            f"dataset {name!r} is read from {real.package}'s bundled data, and {real.package} is not installed "
            f"({exc}); install it with: {_INSTALL_HINT}") from None
    x_raw, y_raw, source = real.read(module)
    x = np.ascontiguousarray(x_raw, dtype=np.float64)
    labels = _factorize(np.asarray(y_raw))
    if x.ndim != 2 or x.shape[1] != real.d or (real.size is not None and len(x) != real.size) \
            or len(np.unique(labels)) != real.k or not np.isfinite(x).all():
        expected = f"{real.size} x {real.d}" if real.size is not None else f"points of dimension {real.d}"
        raise InvalidParameterError(
            f"{source} returned {x.shape[0]} points of dimension {x.shape[1]} with "
            f"{len(np.unique(labels))} classes; expected {expected} with {real.k} (and finite)")
    x.setflags(write=False)
    labels.setflags(write=False)
    return x, labels, source


def _real(name: str) -> Sampler:
    """Sampler of a real data set: a random subset when ``n`` is at most its size, else ``n``
    points drawn with replacement plus Gaussian jitter (a smoothed bootstrap, streamed)."""

    def sampler(n: int, d: int, k: int, seed: int, options: Mapping[str, float]) -> _Plan:
        real_x, real_labels, source = _real_data(name)
        size = len(real_x)
        if n <= size:
            index = np.random.default_rng(seed).permutation(size)[:n]
            meta: dict[str, Any] = {"source": source, "real_size": size}
            if n < size:
                meta["subsampled_from"] = size
            return _ArrayPlan(real_x[index], real_labels[index], meta)
        jitter = options.get("jitter", _REAL_DATA[name].jitter)
        scale = jitter * real_x.std(axis=0)

        def draw(block: np.random.Generator, count: int) -> _Arrays:
            index = block.integers(0, size, size=count)
            return real_x[index] + block.normal(size=(count, d)) * scale, real_labels[index]

        return _BlockPlan(n, d, seed, draw, {"source": source, "real_size": size, "upsampled_from": size,
                                              "jitter": jitter})

    return sampler


#: The datasets by name.
DATASETS: dict[str, Dataset] = {
    ds.name: ds
    for ds in (
        Dataset(name="blobs", description="isotropic Gaussian blobs (d, k)", sampler=_in_memory(blobs)),
        Dataset(name="moons", description="two interleaving half circles (2-D, 2 clusters)",
                sampler=_in_memory(moons), default_k=2, fixed_d=True, fixed_k=True),
        Dataset(name="circles", description="a circle inside a circle (2-D, 2 clusters)",
                sampler=_in_memory(circles), default_k=2, fixed_d=True, fixed_k=True),
        Dataset(name="aniso", description="three sheared blobs (2-D, 3 clusters)", sampler=_in_memory(aniso),
                fixed_d=True, fixed_k=True),
        Dataset(name="varied", description="three blobs of different spreads (2-D, 3 clusters)",
                sampler=_in_memory(varied), fixed_d=True, fixed_k=True),
        Dataset(name="mixture", description="Gaussian mixture with unequal weights and spreads (d, k)",
                sampler=mixture, default_k=4, options=("separation", "imbalance"), streaming=True),
        Dataset(name="google", description="Google's DP clustering demo data in the unit ball (d, k)",
                sampler=google, options=("ratio",), streaming=True),
        Dataset(name="spirals", description="interleaved Archimedean spiral arms (2-D, k in [2, 8], default 3)",
                sampler=_in_memory(spirals), fixed_d=True, k_range=(2, 8)),
        Dataset(name="rings", description="nested rings, equal counts so outer ones sparser (2-D, k in [2, 6])",
                sampler=_in_memory(rings), fixed_d=True, k_range=(2, 6)),
        Dataset(name="sizes", description="blobs of geometric sizes, the smallest 1 % (2-D, k in [2, 8], default 4)",
                sampler=_in_memory(sized_blobs), default_k=4, fixed_d=True, k_range=(2, 8)),
        Dataset(name="background", description="blobs over 10 % uniform background labelled k (2-D, k in [1, 8])",
                sampler=_in_memory(background), fixed_d=True, k_range=(1, 8), background=True),
        *(
            Dataset(name=name, description=real.description, sampler=_real(name), default_d=real.d,
                    default_k=real.k, fixed_d=True, fixed_k=True, options=("jitter",), streaming=True,
                    extra="datasets")
            for name, real in _REAL_DATA.items()
        ),
    )
}


def _dataset(name: str) -> Dataset:
    try:
        return DATASETS[name]
    except (KeyError, TypeError):
        raise InvalidParameterError(
            f"unknown dataset {name!r}; known datasets: {', '.join(sorted(DATASETS))}") from None


def make_dataset(name: str, n: int, *, d: int | None = None, k: int | None = None, seed: int = 0,
                 separation: float | None = None, imbalance: float | None = None, ratio: float | None = None,
                 jitter: float | None = None) -> DatasetArrays:
    """Make ``n`` points of the registered dataset ``name``, in memory.

    Parameters
    ----------
    name : str
        A key of :data:`DATASETS`.
    n : int
        Number of points, in ``[1, MAX_POINTS]``.
    d, k : int, optional
        Dimension and number of clusters; only ``blobs``, ``mixture`` and ``google`` accept a ``d``
        other than their default, and they and ``spirals``, ``rings``, ``sizes`` and
        ``background`` a ``k`` (each in its ``Dataset.k_range``).
    seed : int
        Seed of all the randomness (non-negative).
    separation, imbalance : float, optional
        ``mixture`` only: see :func:`mixture`.
    ratio : float, optional
        ``google`` only: inter- to intra-cluster distance, in ``(1, 1e6]`` (default 10).
    jitter : float, optional
        Real data sets only: the standard deviation of the jitter added when upsampling, in units
        of each feature's standard deviation, in ``[0, 10]`` (default 0.1; 0.01 for ``airports``).

    Returns
    -------
    DatasetArrays
        ``(X, labels)``: points ``(n, d)`` float64 and labels ``(n,)`` int64; ``.meta`` describes
        them (``meta["upsampled_from"]`` = the real size when a real data set was upsampled).

    Raises
    ------
    InvalidParameterError
        Unknown name (the message lists the known ones), an option the dataset does not take, or
        a parameter out of range.
    DatasetsExtraMissingError
        A real data set without the package that ships it (scikit-learn, airportsdata) installed.
    """
    return _dataset(name)(n, d=d, k=k, seed=seed, separation=separation, imbalance=imbalance, ratio=ratio,
                          jitter=jitter)


def iter_chunks(name: str, n: int, chunk: int = DEFAULT_CHUNK, *, d: int | None = None, k: int | None = None,
                seed: int = 0, separation: float | None = None, imbalance: float | None = None,
                ratio: float | None = None, jitter: float | None = None) -> Iterator[DatasetArrays]:
    """The points of :func:`make_dataset` with the same arguments, ``chunk`` at a time.

    Concatenated, the chunks equal ``make_dataset(name, n, ...)`` exactly. For streaming datasets
    (``DATASETS[name].streaming``) the memory is bounded by the chunk (plus one block of
    :data:`BLOCK` points); the others are generated whole first. Arguments are checked at once,
    not at the first chunk.

    Parameters
    ----------
    chunk : int
        Points per chunk (the last may be shorter), in ``[1, MAX_POINTS]``.
    name, n, d, k, seed, separation, imbalance, ratio, jitter
        As in :func:`make_dataset`.

    Yields
    ------
    DatasetArrays
        One chunk; ``meta`` is the dataset's plus ``offset``, the index of its first point.
    """
    chunk = _check_count("chunk", chunk, 1, MAX_POINTS)
    plan = _dataset(name)._plan(n, d=d, k=k, seed=seed, options=_collect_options(separation, imbalance, ratio, jitter))
    total = int(plan.meta["n"])

    def chunks() -> Iterator[DatasetArrays]:
        for start in range(0, total, chunk):
            x, labels = plan.points(start, min(total, start + chunk))
            yield DatasetArrays(x, labels, {**plan.meta, "offset": start})

    return chunks()

# -- files ------------------------------------------------------------------------------------------

#: Header names :func:`label_column_hint` takes for a label column (compared case-insensitively).
LABEL_NAMES = frozenset({"label", "labels", "class", "classes", "target", "y", "cluster", "species"})
#: At most this many distinct integer values in the last column make it look like labels.
_HINT_MAX_CLASSES = 20
#: Text a label cell must not hold: a missing label (compared case-insensitively).
_MISSING_LABELS = frozenset({"", "nan"})


@dataclass(frozen=True)
class _CsvLayout:
    """What the first content line of a CSV says about the rest: its delimiter and header."""

    delimiter: str | None  # None: runs of whitespace
    names: tuple[str, ...] | None  # the header's cells, or None when the file has no header
    columns: int
    header_line: int  # physical line (1-based) of the header, 0 without one


def _label_index(label_column: int | str | None, columns: int, path: Path) -> int | None:
    if label_column is None:
        return None
    if label_column == "last":
        index = columns - 1
    elif isinstance(label_column, (int, np.integer)) and not isinstance(label_column, bool):
        index = int(label_column) + columns if label_column < 0 else int(label_column)
    else:
        raise InvalidParameterError(f"label_column must be None, an integer or 'last', got {label_column!r}")
    if not 0 <= index < columns:
        raise InvalidParameterError(
            f"{path}: label_column {label_column!r} is outside the file's {columns} columns")
    if columns < 2:
        raise InvalidParameterError(f"{path}: a label column needs at least one more column for the features")
    return index


def _factorize(values: NDArray[np.generic] | list[str]) -> NDArray[np.int64]:
    """Labels as 0 .. m-1 in sorted order of the distinct values (integers keep their order)."""
    _, inverse = np.unique(np.asarray(values), return_inverse=True)
    out: NDArray[np.int64] = inverse.reshape(-1).astype(np.int64)
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _content(line: str) -> bool:
    """A line that holds data (or the header): neither blank nor a ``#`` comment."""
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _split(line: str, delimiter: str | None) -> list[str]:
    if delimiter is None:
        return line.split()
    return [cell.strip() for cell in next(csv.reader([line], delimiter=delimiter))]


def _open_text(path: Path) -> TextIO:
    # utf-8-sig: a byte-order mark (as spreadsheet programs write it) is not part of the first cell.
    return path.open(newline="", encoding="utf-8-sig")


def _csv_layout(path: Path, header: bool | None) -> _CsvLayout:
    """The delimiter (the first of ``,`` ``;`` tab in the first content line, else whitespace) and
    the header: with ``header=None`` the first content line is a header exactly when every cell of
    it is a name (not empty, not a number)."""
    with _open_text(path) as f:
        first = next(((number, line) for number, line in enumerate(f, start=1) if _content(line)), None)
    if first is None:
        raise InvalidParameterError(f"{path} holds no data rows")
    number, line = first
    delimiter = next((c for c in (",", ";", "\t") if c in line), None)
    cells = _split(line, delimiter)
    if header is None:
        header = all(cell and not _is_number(cell) for cell in cells)
    if header:
        return _CsvLayout(delimiter, tuple(cells), len(cells), number)
    return _CsvLayout(delimiter, None, len(cells), 0)


def _content_lines(f: TextIO, layout: _CsvLayout) -> Iterator[tuple[int, str]]:
    """``(physical line, text)`` of the data lines: after the header, neither blank nor comments."""
    return ((number, line) for number, line in enumerate(f, start=1)
            if number > layout.header_line and _content(line))


def _column_text(layout: _CsvLayout, j: int, *, label: bool = False) -> str:
    """``column 3 ('y')``: 1-based, as a spreadsheet counts, with the header's name."""
    name = f" ({layout.names[j]!r})" if layout.names is not None else ""
    return f"{'label column' if label else 'column'} {j + 1}{name}"


def _fast_csv(path: Path, layout: _CsvLayout, label_at: int | None) -> _FileArrays | None:
    """The file parsed by numpy's C reader, or ``None`` when it refuses anything (a bad or
    missing cell, a ragged row, a non-finite feature, a missing label): :func:`_precise_csv` then
    reads the file again and says where."""
    quote = '"' if layout.delimiter is not None else None

    def read(dtype: type[Any]) -> NDArray[Any]:
        with _open_text(path) as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "input contained no data": the precise path says so
            lines = (line for _, line in _content_lines(f, layout))
            out: NDArray[Any] = np.loadtxt(lines, dtype=dtype, delimiter=layout.delimiter, comments=None, ndmin=2,
                                           quotechar=quote)
        if out.shape[0] == 0 or out.shape[1] != layout.columns:  # no rows, or not as many columns as row 1
            raise ValueError("refused")
        return out

    features = [j for j in range(layout.columns) if j != label_at]
    labels: NDArray[np.int64] | None = None
    try:
        try:
            # Numeric labels (the common case): one pass over the file.
            data = read(np.float64)
            x = data[:, features]
            raw: NDArray[Any] | None = data[:, label_at] if label_at is not None else None
        except ValueError:
            if label_at is None:
                return None
            # Text labels: every cell as text (so that a ragged row is still refused), then the
            # features converted to numbers.
            text = read(str)
            x = text[:, features].astype(np.float64)
            raw = text[:, label_at]
    except ValueError:
        return None
    if not np.isfinite(x).all():
        return None
    if raw is not None:
        if raw.dtype.kind == "f":
            if np.isnan(raw).any():
                return None
        else:
            raw = np.char.strip(raw.astype(str))  # " a" and "a" are one class, as the precise path reads them
            if np.isin(np.char.lower(raw), list(_MISSING_LABELS)).any():
                return None
            numeric = _numeric_or_none(raw.tolist())
            raw = numeric if numeric is not None else raw
        labels = _factorize(raw)
    return np.ascontiguousarray(x, dtype=np.float64), labels


def _numeric_or_none(values: list[str]) -> NDArray[np.float64] | None:
    """Text labels as numbers when every one is a number (so ``2`` sorts before ``10``)."""
    try:
        return np.array([float(v) for v in values], dtype=np.float64)
    except ValueError:
        return None


def _precise_csv(path: Path, layout: _CsvLayout, label_at: int | None) -> _FileArrays:
    """The file parsed cell by cell in Python: slow, and every refusal names its row and column."""
    features = [j for j in range(layout.columns) if j != label_at]
    rows: list[list[float]] = []
    raw_labels: list[str] = []
    first_row: int | None = None
    with _open_text(path) as f:
        for number, line in _content_lines(f, layout):
            cells = _split(line, layout.delimiter)
            first_row = first_row or number
            if len(cells) != layout.columns:
                where = f"row {layout.header_line} (the header)" if layout.header_line else f"row {first_row}"
                raise InvalidParameterError(f"{path}: row {number} has {len(cells)} columns, {where} has "
                                            f"{layout.columns}")
            # A first row that mixes names and numbers is data by the header rule: say how to say otherwise.
            header_hint = number == first_row and not layout.header_line
            # pandas writes its index column's header as an empty cell: names beside empty cells are a header too.
            names = header_hint and any(cells) and all(not c or not _is_number(c) for c in cells)
            # A text cell below the first row: a column of text labels, most likely (0-based, as --label-column).
            rows.append([_cell_value(f"{path}: row {number}, {_column_text(layout, j)}", cells[j],
                                     " (if this row is a header, say so: --header)" if header_hint
                                     else f" (if column {j} holds labels, say so: --label-column {j})"
                                     if label_at is None else "",
                                     " (if this row is a header, say so: --header; pandas: to_csv(index=False))"
                                     if names else "")
                         for j in features])
            if label_at is not None:
                label = cells[label_at]
                if label.lower() in _MISSING_LABELS:
                    raise InvalidParameterError(
                        f"{path}: row {number}, {_column_text(layout, label_at, label=True)} is "
                        f"{'empty' if not label else repr(label)}; every point needs its label (fill it in "
                        "or remove the row)")
                raw_labels.append(label)
    if not rows:
        raise InvalidParameterError(f"{path} holds a header but no data rows" if layout.names is not None
                                    else f"{path} holds no data rows")
    labels = None
    if label_at is not None:
        numeric = _numeric_or_none(raw_labels)
        labels = _factorize(numeric if numeric is not None else raw_labels)
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(features)), labels


def _cell_value(where: str, cell: str, hint: str, empty_hint: str = "") -> float:
    if not cell:
        raise InvalidParameterError(f"{where} is empty; every feature of a data row needs a number{empty_hint}")
    try:
        value = float(cell)
    except ValueError:
        raise InvalidParameterError(f"{where}: {cell!r} is not a number{hint}") from None
    if not math.isfinite(value):
        raise InvalidParameterError(f"{where} is {value}; NaN and infinite values are not allowed")
    return value


def _load_csv(path: Path, label_column: int | str | None, header: bool | None) -> tuple[_FileArrays,
                                                                                        tuple[str, ...] | None]:
    layout = _csv_layout(path, header)
    label_at = _label_index(label_column, layout.columns, path)
    # Fast path first; the precise one only when the fast one refuses, to locate the error (or to
    # read what numpy's reader does not, such as a thousands separator Python's float() takes).
    arrays = _fast_csv(path, layout, label_at)
    if arrays is None:
        arrays = _precise_csv(path, layout, label_at)
    names = None
    if layout.names is not None:
        names = tuple(name for j, name in enumerate(layout.names) if j != label_at)
    return arrays, names


def _load_npy(path: Path, label_column: int | str | None) -> _FileArrays:
    try:
        data = np.load(path, allow_pickle=False)
    except ValueError as exc:  # object arrays, or not an .npy file at all
        raise InvalidParameterError(f"{path} is not a numeric .npy array: {exc}") from None
    if not isinstance(data, np.ndarray):
        raise InvalidParameterError(f"{path} is not a single .npy array")
    if data.ndim == 1 and label_column is None:
        data = data[:, None]
    if data.ndim != 2 or data.shape[0] == 0:
        raise InvalidParameterError(f"{path}: expected a non-empty 2-D array (points x columns), got shape {data.shape}")
    if not (np.issubdtype(data.dtype, np.number) or data.dtype == np.bool_):
        raise InvalidParameterError(f"{path}: expected a numeric array, got dtype {data.dtype}")
    label_at = _label_index(label_column, data.shape[1], path)
    labels = None
    if label_at is not None:
        raw = data[:, label_at]
        missing = np.flatnonzero(np.isnan(raw)) if np.issubdtype(raw.dtype, np.floating) else np.zeros(0, np.intp)
        if len(missing):
            raise InvalidParameterError(
                f"{path}: row {int(missing[0]) + 1}, label column {label_at + 1} is nan "
                f"({len(missing)} rows in all); every point needs its label (fill it in or remove the row)")
        labels = _factorize(raw)
        data = np.delete(data, label_at, axis=1)
    return data.astype(np.float64), labels


def load_file(path: str | os.PathLike[str], label_column: int | str | None = None, *,
              header: bool | None = None) -> DatasetArrays:
    """Read points (and optionally labels) from a CSV or ``.npy`` file.

    A CSV's rows are its lines that are neither blank nor comments (first non-blank character
    ``#``); a UTF-8 byte-order mark is ignored. The delimiter is the first of ``,`` ``;`` tab
    found in the first row, else runs of whitespace. Large files are parsed by numpy's C reader;
    a file it refuses is read again cell by cell, so that the error names the row (the line as
    an editor numbers it) and the column (counted from 1, with the header's name).

    Parameters
    ----------
    path : path-like
        ``.csv``, ``.tsv``, ``.txt`` or ``.npy`` (a 2-D numeric array; a 1-D array is one feature).
    label_column : None, int or "last"
        Column holding the labels (counted from 0; negative indices count from the end); ``None``
        when the file holds features only. Labels may be any values (text in CSV); they are
        mapped to ``0 .. m-1`` in sorted order. A missing label (an empty cell, ``nan``) is
        refused, never made a class of its own.
    header : bool or None
        CSV only. ``True``: the first row is a header; ``False``: it is data; ``None`` (default):
        it is a header exactly when every cell of it is a name (neither empty nor a number), so
        that a data row with an empty or bad cell is an error, not a header.

    Returns
    -------
    DatasetArrays
        Points ``(n, d)`` float64 and labels ``(n,)`` int64 (``None`` without a label column);
        ``meta`` holds ``name`` (``"file"``), ``source``, ``n``, ``d``, ``k`` with labels, and
        ``columns`` (the features' header names) when the CSV has a header.

    Raises
    ------
    InvalidParameterError
        The file is missing or unreadable, of another format, ragged, empty, holds an empty,
        non-numeric, NaN or infinite feature or a missing label, or ``label_column`` is outside
        its columns. The message names the file, and the row and column at fault.
    """
    p = Path(path)
    if not p.is_file():
        raise InvalidParameterError(f"data file {str(p)!r} does not exist or is not a file")
    suffix = p.suffix.lower()
    names: tuple[str, ...] | None = None
    try:
        if suffix == ".npy":
            if header is not None:
                raise InvalidParameterError(f"{p}: header applies to CSV files, not to .npy arrays")
            x, labels = _load_npy(p, label_column)
        elif suffix in (".csv", ".tsv", ".txt"):
            (x, labels), names = _load_csv(p, label_column, header)
        else:
            raise InvalidParameterError(f"data file {str(p)!r}: unsupported format {suffix or '(none)'!r}; "
                                        "use .csv (or .tsv/.txt) or .npy")
    except UnicodeDecodeError as exc:
        raise InvalidParameterError(f"{p} is not a UTF-8 text file: {exc}") from None
    except OSError as exc:
        raise InvalidParameterError(f"cannot read data file {str(p)!r}: {exc.strerror or exc}") from None
    if x.shape[1] == 0:
        raise InvalidParameterError(f"{p}: no feature columns")
    bad = ~np.isfinite(x)
    if bad.any():  # an .npy file's (a CSV's are refused where they are read)
        row, col = (int(v) for v in np.argwhere(bad)[0])
        raise InvalidParameterError(f"{p}: row {row + 1}, column {col + 1} is {float(x[row, col])}; "
                                    "NaN and infinite values are not allowed")
    meta: dict[str, Any] = {"name": "file", "source": str(p), "n": int(x.shape[0]), "d": int(x.shape[1])}
    if labels is not None:
        meta["k"] = int(labels.max()) + 1
    if names is not None:
        meta["columns"] = list(names)
    return DatasetArrays(np.ascontiguousarray(x), labels, meta)


def label_column_hint(data: DatasetArrays) -> tuple[int, str] | None:
    """The feature column of a file read without a label column that looks like labels, if any.

    A column looks like labels when its header name is one of :data:`LABEL_NAMES` (``y`` only when
    no column is named ``x``), or, the last
    column only, when it holds integers with at most 20 distinct values while the file has at
    least five times as many rows as values and at least one more column.

    Returns
    -------
    (int, str) or None
        The column's index (counted from 0, as ``label_column`` takes it) and why it looks like
        labels (``"its header is 'class'"``); ``None`` when no column does.
    """
    x, labels = data
    if labels is not None:
        return None
    names = data.meta.get("columns")
    if names is not None:
        lowered = [str(name).strip().lower() for name in names]
        for j, name in enumerate(lowered):
            # Beside an "x" column, "y" is a coordinate (the usual 2-D header), not a target.
            if name in LABEL_NAMES and not (name == "y" and "x" in lowered):
                return j, f"its header is {names[j]!r}"
    n, d = x.shape
    if d < 2:
        return None
    last = x[:, -1]
    if not np.array_equal(last, np.round(last)):
        return None
    distinct = len(np.unique(last))
    if distinct <= _HINT_MAX_CLASSES and n >= 5 * distinct:
        return d - 1, f"it holds {distinct} distinct integers"
    return None
