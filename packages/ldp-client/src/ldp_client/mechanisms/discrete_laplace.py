"""Discrete Laplace noise on a power-of-two grid of the unit cube.

Each coordinate of a point of [0, 1]^d (already clamped and normalized by the encoder) is rounded
to the nearest of the N + 1 grid points z in {0, 1, ..., N}, N = 2^grid_bits, and receives
independent integer noise with P[Y = z + k] proportional to exp(-|k| / scale),
scale = d N / epsilon (an exact rational).

Privacy
    epsilon-LDP, exactly. Two inputs round to grid vectors z, z' in {0..N}^d, so
    ||z - z'||_1 <= d N (the L1 sensitivity). The discrete Laplace pmf has the same normalizing
    constant for every centre, hence for every output y
    P[y | z] / P[y | z'] = exp(sum_j (|y_j - z'_j| - |y_j - z_j|) / scale) <= exp(d N / scale)
    = exp(epsilon), with equality for z = (0, ..., 0), z' = (N, ..., N) and every y_j <= 0.
    The sampler realizes that pmf exactly: it uses only exact Bernoulli coins with rational
    parameters (Canonne, Kamath and Steinke 2020), never a floating-point inverse CDF, so none of
    the attacks on floating-point Laplace (Mironov 2012) apply. The float ``epsilon`` is an exact
    dyadic rational and ``scale`` is computed from it in rationals, so the realized epsilon is
    ``epsilon`` itself.
No extra grid step is charged
    The usual recipe charges sensitivity + one grid step because rounding can move a value outside
    the clamped range (rounding *after* noise, or to a grid that does not contain the range's
    ends). Here rounding happens *after* clamping to [0, 1] and *before* noise, onto a grid whose
    end points are exactly 0 and 1: every rounded coordinate lies in {0..N}, so the integer
    sensitivity per coordinate is exactly N.
Parameters
    ``dimension`` d in [1, 4096], ``epsilon`` in (0, 20], ``grid_bits`` in [0, 30] (default 10), with
    the scale d 2^grid_bits / epsilon at most :data:`MAX_SCALE` (2^56): larger noise would not fit
    the payload's 64-bit integers.
Utility
    :func:`decode` is unbiased for the *rounded* point z / N (which is within 2^-(grid_bits+1) of
    the true point in every coordinate). Per coordinate its variance is
    2 a / (1 - a)^2 / 4^grid_bits with a = exp(-1 / scale), about 2 d^2 / epsilon^2 for large
    scales (:attr:`DiscreteLaplaceParams.noise_variance`).
Cost
    d signed integers (msgpack: 3-5 bytes each for typical scales); about ten exact coins per
    coordinate, roughly 20 microseconds per coordinate with the OS CSPRNG.
Reference
    Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020);
    Ghosh, Roughgarden and Sundararajan, "Universally utility-maximizing privacy mechanisms"
    (STOC 2009); Mironov, "On significance of the least significant bits for differential privacy"
    (CCS 2012).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar

from .._exact import discrete_laplace
from .._validation import check_epsilon, check_int, check_vector, describe
from ..encoders.base import MAX_DIMENSION, UNIT_CUBE
from ..errors import EncodingError, InvalidParameterError, ProtocolError
from ..payload import MAX_S64, Integers
from ..rng import Rng, resolve_rng
from .base import MECHANISMS, MechanismParams, bits_for

__all__ = ["DiscreteLaplaceParams", "MAX_GRID_BITS", "MAX_SCALE", "decode", "randomize"]

#: Largest ``grid_bits``: 2^30 grid steps are far below float resolution needs of any device.
MAX_GRID_BITS = 30
#: Tail probability used to size :attr:`DiscreteLaplaceParams.payload_bits`.
_TAIL = 1e-6
#: Largest noise scale: a coordinate's noise reaches 2^62 (near the 64-bit integers of the payload)
#: with probability about exp(-2^62 / scale) = e^-64 at this scale.
MAX_SCALE = 2**56


@MECHANISMS.register
@dataclass(frozen=True, kw_only=True)
class DiscreteLaplaceParams(MechanismParams):
    """Parameters of the grid discrete-Laplace mechanism (``ldp.v1.DiscreteLaplace``).

    See the module docstring for the privacy argument, utility and cost.
    """

    KIND: ClassVar[str] = "discrete_laplace"
    PAYLOAD_FIELD: ClassVar[str] = "integers"
    INPUT_KIND: ClassVar[str] = UNIT_CUBE

    dimension: int
    epsilon: float
    grid_bits: int = 10

    def __post_init__(self) -> None:
        check_int("dimension", self.dimension, 1, MAX_DIMENSION)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        check_int("grid_bits", self.grid_bits, 0, MAX_GRID_BITS)
        if self.scale > MAX_SCALE:
            raise InvalidParameterError(
                f"epsilon must be at least {float(Fraction(self.sensitivity) / MAX_SCALE):.3g} for dimension "
                f"{self.dimension} and grid_bits {self.grid_bits} (noise scale d 2^grid_bits / epsilon at most 2^56, "
                f"so that reports fit 64-bit integers), got {self.epsilon:g}")

    @cached_property
    def grid_size(self) -> int:
        """N = 2^grid_bits: grid steps per coordinate, and the per-coordinate integer sensitivity."""
        return 1 << self.grid_bits

    @cached_property
    def sensitivity(self) -> int:
        """L1 sensitivity of the rounded vector in grid units: d N."""
        return self.dimension * self.grid_size

    @cached_property
    def scale(self) -> Fraction:
        """The exact noise scale d N / epsilon (``Fraction(epsilon)`` is the float's exact value)."""
        return Fraction(self.sensitivity) / Fraction(self.epsilon)

    @cached_property
    def noise_decay(self) -> float:
        """a = exp(-1 / scale): P[noise = k] = (1 - a) / (1 + a) * a^|k|."""
        return math.exp(-1.0 / float(self.scale))

    @cached_property
    def noise_variance(self) -> float:
        """Variance of one decoded coordinate, in unit-cube units: 2 a / (1 - a)^2 / 4^grid_bits."""
        rate = 1.0 / float(self.scale)
        one_minus_a = -math.expm1(-rate)  # accurate 1 - a for large scales
        return 2.0 * self.noise_decay / one_minus_a**2 / float(self.grid_size) ** 2

    @property
    def realized_epsilon(self) -> float:
        return self.epsilon

    @property
    def input_size(self) -> int:
        return self.dimension

    @property
    def payload_bits(self) -> int:
        """Bits that hold every coordinate (sign included) except with probability about 1e-6."""
        tail = math.ceil(float(self.scale) * math.log(1.0 / _TAIL))
        return self.dimension * (1 + bits_for(self.grid_size + 1 + tail))

    def randomize(self, value: Any, *, rng: Rng | None = None) -> Integers:
        return randomize(value, self, rng=rng)

    def check_payload(self, payload: Any) -> Integers:
        if not isinstance(payload, Integers):
            raise ProtocolError(f"discrete_laplace payload must be Integers, got {describe(payload)}")
        if len(payload.values) != self.dimension:
            raise ProtocolError(
                f"discrete_laplace payload must hold {self.dimension} integers, got {len(payload.values)}")
        for v in payload.values:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ProtocolError(f"discrete_laplace payload values must be integers, got {describe(v)}")
            if not -MAX_S64 - 1 <= v <= MAX_S64:
                raise ProtocolError(f"discrete_laplace payload value {v} does not fit a signed 64-bit integer")
        return payload

    def round_to_grid(self, value: Any) -> list[int]:
        """Validate a point of [0, 1]^d and return its grid coordinates z in {0..N} (nearest, ties to even)."""
        point = check_vector("discrete_laplace value", value, self.dimension)
        for j, x in enumerate(point):
            if not 0.0 <= x <= 1.0:
                raise EncodingError(f"discrete_laplace value coordinate {j} must be in [0, 1], got {x}")
        n = self.grid_size
        # x * 2^k is exact in binary floating point, so round() sees the true value.
        return [round(x * n) for x in point]

    def decode(self, payload: Integers | Sequence[int]) -> list[float]:
        """Unbiased estimate of the rounded point z / N in unit-cube units."""
        values = payload if isinstance(payload, Integers) else Integers(tuple(payload))
        self.check_payload(values)
        n = float(self.grid_size)
        return [v / n for v in values.values]


def randomize(value: Any, params: DiscreteLaplaceParams, *, rng: Rng | None = None) -> Integers:
    """Round ``value`` to the grid and add exact discrete-Laplace noise to every coordinate.

    Parameters
    ----------
    value : sequence of float
        ``params.dimension`` finite coordinates in [0, 1].
    params : DiscreteLaplaceParams
    rng : Rng, optional
        Defaults to the OS CSPRNG.
    """
    grid = params.round_to_grid(value)
    rng = resolve_rng(rng)
    scale = params.scale
    return Integers(tuple(z + discrete_laplace(scale, rng) for z in grid))


def decode(payload: Integers | Sequence[int], params: DiscreteLaplaceParams) -> list[float]:
    """Module-level twin of :meth:`DiscreteLaplaceParams.decode`."""
    return params.decode(payload)
