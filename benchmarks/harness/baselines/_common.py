"""What every baseline shares: its output, epsilon checks, the public box and Laplace noise.

The trusted-curator baselines add continuous Laplace noise with numpy. That is fine *for a
benchmark reference* (they are never shipped to devices and never see real data); the product's
mechanisms use the SDK's exact samplers (DESIGN.md section 4, Mironov 2012).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.clusters import CellClusterModel

__all__ = ["Box", "Clustering", "check_epsilon", "check_k", "check_points", "laplace", "noiseless"]


@dataclass(frozen=True, kw_only=True)
class Clustering:
    """What a baseline (and a protocol adapter) returns.

    Attributes
    ----------
    centers : numpy.ndarray or None
        ``(k', d)`` centers in the data's own units; ``None`` for methods without centers (DBSCAN).
    labels : numpy.ndarray or None
        One int label per input point (``-1`` = noise); ``None`` means "nearest center".
    diagnostics : dict of str to float
        Anything worth recording (budget split, tree size, rounds, reports ...).
    cell_map : CellClusterModel or None
        A grid clustering's published cell -> cluster map (drawn by the harness's plots).
    """

    centers: NDArray[np.float64] | None
    labels: NDArray[np.int64] | None = None
    diagnostics: dict[str, float] = field(default_factory=dict)
    cell_map: CellClusterModel | None = None

    def __post_init__(self) -> None:
        if self.centers is None and self.labels is None:
            raise ValueError("a clustering needs centers, labels or both")


def check_epsilon(epsilon: float) -> float:
    """``epsilon`` as a float in ``(0, inf]`` (``inf`` = the documented no-noise bypass)."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise TypeError(f"epsilon must be a number, got {type(epsilon).__name__}")
    value = float(epsilon)
    if math.isnan(value) or value <= 0.0:
        raise ValueError(f"epsilon must be in (0, inf], got {epsilon!r}")
    return value


def noiseless(epsilon: float) -> bool:
    """Whether ``epsilon`` asks for the no-noise bypass (``inf``)."""
    return math.isinf(epsilon)


def check_k(k: int, n: int) -> int:
    """``k`` as an int in ``[1, n]``."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise ValueError(f"k must be an integer in [1, {n}] (the number of points), got {k!r}")
    return int(k)


def check_points(x: ArrayLike) -> NDArray[np.float64]:
    """A finite, non-empty ``(n, d)`` float64 array."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"X must be a non-empty (n, d) array, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("X must hold finite numbers only")
    return arr


@dataclass(frozen=True)
class Box:
    """Public per-dimension bounds and the affine map to the unit cube ``[0, 1]^d``.

    A real deployment publishes the bounds before any data is seen; the harness derives them from
    the data (as :func:`ldp_collector.simulation.population.numeric_bounds` does), a simulation shortcut that
    every baseline shares, so none of them gains from it.

    The unit box calibrates noise (sensitivities), trees and grids; distances (assignments, k-means,
    max-min choices) are taken in the data's own units, the metric every score uses, since a
    per-dimension rescaling changes the k-means objective.
    """

    lower: NDArray[np.float64]
    upper: NDArray[np.float64]

    @classmethod
    def of(cls, x: NDArray[np.float64]) -> Box:
        lower = x.min(axis=0)
        upper = x.max(axis=0)
        flat = upper <= lower
        return cls(np.where(flat, lower - 0.5, lower), np.where(flat, upper + 0.5, upper))

    @property
    def dimension(self) -> int:
        return int(self.lower.shape[0])

    @property
    def width(self) -> NDArray[np.float64]:
        return self.upper - self.lower

    def to_unit(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Points in unit-cube coordinates, clamped to ``[0, 1]^d``."""
        out: NDArray[np.float64] = np.clip((x - self.lower) / self.width, 0.0, 1.0)
        return out

    def from_unit(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        out: NDArray[np.float64] = self.lower + u * self.width
        return out


def laplace(scale: float, size: int | tuple[int, ...], rng: np.random.Generator) -> NDArray[np.float64]:
    """Continuous Laplace noise (benchmark references only, see the module docstring); 0 when ``scale`` is 0."""
    if scale == 0.0:
        return np.zeros(size)
    out: NDArray[np.float64] = rng.laplace(0.0, scale, size=size)
    return out
