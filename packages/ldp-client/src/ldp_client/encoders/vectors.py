"""Vector encoders: the clamped point mapped affinely into the set a vector randomizer expects.

- :class:`UnitCubeEncoder`: ``t`` in ``[0, 1]^d``, for discrete Laplace on a grid;
- :class:`SymmetricBoxEncoder`: ``2 t - 1`` in ``[-1, 1]^d``, for box (l-infinity) vector randomizers;
- :class:`UnitBallEncoder`: ``(2 t - 1) / sqrt(d)`` in the unit l2 ball, for Duchi's l2 mechanism
  or PrivUnit.

``t`` is the point clamped to the domain and normalized (``NumericDomain.normalize``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from .base import BALL, BOX, ENCODERS, UNIT_CUBE, Encoder, NumericDomain, as_point
from .geometry import _require_domain
from .projection import dot

__all__ = ["SymmetricBoxEncoder", "UnitBallEncoder", "UnitCubeEncoder"]

_SHRINK = 1.0 - 2.0**-52


@dataclass(frozen=True, kw_only=True)
class _AffineVectorEncoder(Encoder):
    """Shared part of the vector encoders: the public domain, its check and the output dimension."""

    domain: NumericDomain

    def __post_init__(self) -> None:
        _require_domain(self.domain)

    @property
    def output_size(self) -> int:
        return self.domain.dimension

    def _unit(self, point: Any) -> list[float]:
        """The validated point, clamped and normalized to ``[0, 1]^d``."""
        return self.domain.normalize(as_point(point, self.domain.dimension))


@ENCODERS.register
@dataclass(frozen=True, kw_only=True)
class UnitCubeEncoder(_AffineVectorEncoder):
    """The clamped point normalized to ``[0, 1]^d`` (``ldp.v1.UnitCubeEncoder``).

    Parameters
    ----------
    domain : NumericDomain
        Public bounds; points outside are clamped.

    Notes
    -----
    Every coordinate is in ``[0, 1]`` exactly (in floating point). Cost ``O(d)``.
    """

    KIND: ClassVar[str] = "unit_cube"
    VALUE_KIND: ClassVar[str] = UNIT_CUBE

    def encode(self, point: Any) -> tuple[float, ...]:
        """``t``: the clamped, normalized point.

        Raises
        ------
        EncodingError
            Wrong dimension or type, NaN or infinite coordinate.
        """
        return tuple(self._unit(point))


@ENCODERS.register
@dataclass(frozen=True, kw_only=True)
class SymmetricBoxEncoder(_AffineVectorEncoder):
    """The clamped point mapped to ``[-1, 1]^d`` as ``2 t - 1`` (``ldp.v1.SymmetricBoxEncoder``).

    Parameters
    ----------
    domain : NumericDomain
        Public bounds; points outside are clamped.

    Notes
    -----
    Every coordinate is in ``[-1, 1]`` exactly (rounding is monotone). Cost ``O(d)``.
    """

    KIND: ClassVar[str] = "symmetric_box"
    VALUE_KIND: ClassVar[str] = BOX

    def encode(self, point: Any) -> tuple[float, ...]:
        """``2 t - 1`` for the clamped, normalized point ``t``.

        Raises
        ------
        EncodingError
            Wrong dimension or type, NaN or infinite coordinate.
        """
        return tuple(2.0 * t - 1.0 for t in self._unit(point))


@ENCODERS.register
@dataclass(frozen=True, kw_only=True)
class UnitBallEncoder(_AffineVectorEncoder):
    """The clamped point mapped into the unit l2 ball as ``(2 t - 1) / sqrt(d)`` (``ldp.v1.UnitBallEncoder``).

    Parameters
    ----------
    domain : NumericDomain
        Public bounds; points outside are clamped.

    Notes
    -----
    The box ``[-1, 1]^d`` has circumradius ``sqrt(d)``, so the image lies in the ball. In
    floating point the norm of a corner can round to just above 1; the result is then shrunk by
    one ulp at a time until ``math.hypot(*v)``, ``math.fsum`` and the left-to-right sum
    (:func:`~ldp_client.encoders.projection.dot`) of the squares are all at most 1, so
    randomizers may rely on ``||v|| <= 1`` however they measure it (``docs/protocol.md`` §11.8).
    Cost ``O(d)``.
    """

    KIND: ClassVar[str] = "unit_ball"
    VALUE_KIND: ClassVar[str] = BALL

    def encode(self, point: Any) -> tuple[float, ...]:
        """``(2 t - 1) / sqrt(d)`` for the clamped, normalized point ``t``; norm at most 1.

        Raises
        ------
        EncodingError
            Wrong dimension or type, NaN or infinite coordinate.
        """
        scale = 1.0 / math.sqrt(self.domain.dimension)
        v = [(2.0 * t - 1.0) * scale for t in self._unit(point)]
        while math.hypot(*v) > 1.0 or math.fsum([x * x for x in v]) > 1.0 or dot(v, v) > 1.0:
            v = [x * _SHRINK for x in v]
        return tuple(v)
