"""The contract every encoder fulfils, and the public numeric domain they share."""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .._spec import Spec, SpecRegistry
from ..errors import EncodingError, InvalidParameterError

__all__ = ["ENCODERS", "Encoder", "NumericDomain", "as_point"]

#: Registry of the ``ldp.v1.EncoderSpec`` oneof: kind name -> encoder class.
ENCODERS = SpecRegistry("encoder", "ldp_client.encoders", {
    "categorical": "categorical",
    "uniform_grid": "grid",
    "grid_tree": "grid",
    "cell_list": "grid",
    "simhash": "lsh",
    "shifted_grid": "lsh",
    "nearest_candidate": "nearest",
    "bit_vector": "bitvector",
    "unit_cube": "vectors",
    "symmetric_box": "vectors",
    "unit_ball": "vectors",
    "bucketed_vector": "bucketed",
})

#: Kinds of encoded values, which decide the mechanisms an encoder can feed: an index in
#: [0, size), a 0/1 tuple of length size, or a float tuple of dimension size in [0,1]^d
#: (unit cube), [-1,1]^d (box) or the unit l2 ball (ball).
INDEX, BITS, UNIT_CUBE, BOX, BALL = "index", "bits", "unit_cube", "box", "ball"
#: A pair ``(bucket, vector)``: an LSH bucket index and a float tuple of dimension size in [-1,1]^d.
BUCKET_VECTOR = "bucket_vector"

MAX_DIMENSION = 4096


@dataclass(frozen=True, kw_only=True)
class NumericDomain(Spec):
    """Public per-dimension bounds ``lower[j] < upper[j]`` (``ldp.v1.NumericDomain``).

    Bounds are finite and ``upper[j] - lower[j]`` (rounded to binary64) is finite too.
    """

    lower: tuple[float, ...]
    upper: tuple[float, ...]

    def __post_init__(self) -> None:
        for name in ("lower", "upper"):
            value = getattr(self, name)
            if not isinstance(value, (tuple, list)):
                raise TypeError(f"{name} must be a sequence of numbers, got {type(value).__name__}")
            object.__setattr__(self, name, tuple(value))
        if not 1 <= len(self.lower) <= MAX_DIMENSION:
            raise InvalidParameterError(f"domain dimension must be in [1, {MAX_DIMENSION}], got {len(self.lower)}")
        if len(self.lower) != len(self.upper):
            raise InvalidParameterError(
                f"domain lower and upper must have equal lengths, got {len(self.lower)} and {len(self.upper)}")
        for j, (lo, hi) in enumerate(zip(self.lower, self.upper)):
            for v in (lo, hi):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise InvalidParameterError(f"domain bounds must be finite numbers, got {v!r} in dimension {j}")
            if not lo < hi:
                raise InvalidParameterError(f"domain needs lower < upper, got [{lo}, {hi}] in dimension {j}")
            # normalize divides by the binary64 difference: an infinite one would send every point
            # to 0 or NaN (docs/protocol.md §11.2).
            if not math.isfinite(float(hi) - float(lo)):
                raise InvalidParameterError(
                    f"domain upper - lower must be finite in binary64, got [{lo}, {hi}] in dimension {j}")

    @property
    def dimension(self) -> int:
        return len(self.lower)

    @classmethod
    def unit(cls, dimension: int) -> NumericDomain:
        """The box [0, 1]^dimension."""
        return cls(lower=(0.0,) * dimension, upper=(1.0,) * dimension)

    def normalize(self, point: Sequence[float]) -> list[float]:
        """Clamp a validated point to the box and map it to [0, 1]^d."""
        out = []
        for x, lo, hi in zip(point, self.lower, self.upper):
            t = (x - lo) / (hi - lo)
            out.append(0.0 if t < 0.0 else 1.0 if t > 1.0 else t)
        return out

    def denormalize(self, unit_point: Sequence[float]) -> list[float]:
        """Map a point of [0, 1]^d back to the domain's units."""
        return [lo + t * (hi - lo) for t, lo, hi in zip(unit_point, self.lower, self.upper)]


def as_point(point: Any, dimension: int) -> list[float]:
    """Validate a device's point: a sequence of ``dimension`` finite real numbers."""
    if isinstance(point, (str, bytes)) or not hasattr(point, "__len__"):
        raise EncodingError(f"point must be a sequence of {dimension} numbers, got {type(point).__name__}")
    if len(point) != dimension:
        raise EncodingError(f"point must have dimension {dimension}, got {len(point)}")
    out = []
    for j, x in enumerate(point):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            try:
                x = float(x)  # numpy scalars and Decimals
            except (TypeError, ValueError):
                raise EncodingError(f"point coordinate {j} must be a real number, got {type(x).__name__}") from None
        x = float(x)
        if not math.isfinite(x):
            raise EncodingError(f"point coordinate {j} must be finite, got {x}")
        out.append(x)
    return out


class Encoder(Spec, abc.ABC):
    """Base of every frozen encoder dataclass: a pure function of the point and public parameters."""

    #: What :meth:`encode` returns: one of ``index``, ``bits``, ``unit_cube``, ``box``, ``ball``,
    #: ``bucket_vector``.
    VALUE_KIND: ClassVar[str] = INDEX

    @abc.abstractmethod
    def encode(self, point: Any) -> Any:
        """Encode one (validated, clamped) point; bad points raise :class:`EncodingError`."""

    @property
    @abc.abstractmethod
    def output_size(self) -> int:
        """Domain size (index), vector length (bits) or dimension (the vector kinds, bucket_vector)."""
