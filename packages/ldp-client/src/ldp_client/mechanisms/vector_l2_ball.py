"""Unbiased randomizer for vectors of the unit l2 ball (Duchi, Jordan and Wainwright's l2 mechanism).

A device holding x with ||x||_2 <= 1 reports one unit direction w; the collector's estimate of x
is B w, unbiased, with the public constant B = :attr:`VectorL2BallParams.scale`.

Algorithm
    1. x~ = x / ||x|| with probability (1 + ||x||) / 2, else -x / ||x|| (so E[x~] = x); for x = 0,
       x~ is a uniform random direction.
    2. Draw a direction w from a sign-symmetric sampler: Gaussian coordinates normalized to unit
       length, then an explicit fair coin for the overall sign.
    3. Of the pair {w, -w}, call "near" the member with a positive float dot product with x~
       (IEEE negation is exact, so dot(-w, x~) = -dot(w, x~) bit for bit; a dot product of exactly
       0 is settled by a fixed rule on the pair alone: the member whose first nonzero coordinate
       is positive). An exact coin T with P[T] = pi = r / (r + 1), r = the largest 48-bit dyadic
       rational <= e^epsilon, reports the near member if T, else the far one.
    4. The report is rounded to float32 (the wire format) on the device, so the stored report is
       exactly what the collector receives; rounding is a sign-symmetric post-processing.
Privacy
    epsilon-LDP with realized epsilon ln r <= epsilon, tight. The pair {w, -w} is drawn
    independently of x, and given the pair, x only decides which member is near. So for every
    output u, P[u | x] = P[pair {u, -u}] * (pi or 1 - pi), mixed over x~ (step 1), and
    P[u | x] / P[u | x'] <= pi / (1 - pi) = r. Equality holds for x = e_1, x' = -e_1 and any u
    with u_1 != 0. No float comparison carries a probability: the only data-dependent step is the
    side assignment of a pair, which is a deterministic function of (pair, x~).
Parameters
    ``dimension`` d in [1, 4096], ``epsilon`` in (0, 20] (at least about 1.5e-14, so that r > 1).
Utility
    E[w | x] = x / B with B = (r + 1) / (r - 1) * sqrt(pi) * Gamma((d + 1) / 2) / Gamma(d / 2):
    the near hemisphere of a uniform direction has mean Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2))
    along x~, and the coin contributes pi - (1 - pi) = (r - 1) / (r + 1). The exact r replaces
    e^epsilon so the estimate is unbiased for the coin really used. Because the output density
    f satisfies f(w) + f(-w) = 2 (relative to the uniform), E[(B w_j)^2] = B^2 / d exactly, so
    Var[B w_j] = B^2 / d - x_j^2 <= B^2 / d (:attr:`VectorL2BallParams.variance_bound`),
    O(d / epsilon^2) for small epsilon.
Cost
    32 d bits (d float32). CPU: d Gaussians (2 CSPRNG draws each) and three exact coins.
Reference
    Duchi, Jordan and Wainwright, "Minimax optimal procedures for locally private estimation"
    (JASA 2018); Bhowmick et al., "Protection against reconstruction and its
    applications in private federated learning" (2018), for PrivUnit, the refined alternative.
"""

from __future__ import annotations

import abc
import math
import struct
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar

from .._validation import check_vector, describe
from ..encoders.base import BALL
from ..encoders.projection import dot
from ..errors import EncodingError, ProtocolError
from ..payload import Floats
from ..rng import Rng, resolve_rng
from .base import MECHANISMS, VectorParams

__all__ = ["NORM_SLACK", "PAYLOAD_NORM_TOLERANCE", "UnitDirectionParams", "ball_target", "VectorL2BallParams", "check_unit_payload", "randomize",
           "uniform_direction"]

#: Inputs with norm up to 1 + NORM_SLACK are accepted (float noise) and scaled onto the sphere.
NORM_SLACK = 1e-9
#: A checked payload's norm may differ from 1 by this much (float32 rounding of d coordinates).
PAYLOAD_NORM_TOLERANCE = 1e-5


class UnitDirectionParams(VectorParams):
    """Shared part of the randomizers that report a unit direction w as d float32 values and
    estimate the vector as B w (this one and PrivUnit): the payload, its check and the estimate."""

    PAYLOAD_FIELD: ClassVar[str] = "floats"
    INPUT_KIND: ClassVar[str] = BALL

    @property
    @abc.abstractmethod
    def scale(self) -> float:
        """B: the estimate of the device's vector is B w."""

    @property
    def payload_bits(self) -> int:
        return 32 * self.dimension

    def check_payload(self, payload: Any) -> Floats:
        return check_unit_payload(self.KIND, payload, self.dimension)

    def estimate(self, payload: Any) -> list[float]:
        """Unbiased estimate B w of the device's vector from its report w."""
        b = self.scale
        return [b * v for v in self.check_payload(payload).values]


@MECHANISMS.register
@dataclass(frozen=True, kw_only=True)
class VectorL2BallParams(UnitDirectionParams):
    """Parameters of the l2-ball vector randomizer (``ldp.v1.VectorL2Ball``).

    See the module docstring for the privacy argument, utility and cost.
    """

    KIND: ClassVar[str] = "vector_l2_ball"

    @cached_property
    def near_probability(self) -> Fraction:
        """pi = r / (r + 1): probability of reporting the member of the pair on x~'s side."""
        return self.ratio / (self.ratio + 1)

    @cached_property
    def scale(self) -> float:
        """B = (r + 1) / (r - 1) * sqrt(pi) * Gamma((d + 1) / 2) / Gamma(d / 2): the estimate is B w."""
        d = self.dimension
        r = self.ratio
        coin = float((r + 1) / (r - 1))
        return coin * math.exp(0.5 * math.log(math.pi) + math.lgamma((d + 1) / 2) - math.lgamma(d / 2))

    @cached_property
    def variance_bound(self) -> float:
        """B^2 / d: bounds the variance of every coordinate of one estimate (exact at x_j = 0)."""
        return self.scale**2 / self.dimension

    def coordinate_variance(self, true_value: float = 0.0) -> float:
        """Exact variance B^2 / d - x_j^2 of one coordinate of one estimate whose truth is ``true_value``."""
        return self.variance_bound - true_value * true_value

    def randomize(self, value: Any, *, rng: Rng | None = None) -> Floats:
        return randomize(value, self, rng=rng)


def check_unit_payload(kind: str, payload: Any, dimension: int) -> Floats:
    """A report of ``dimension`` finite floats of norm 1 (up to float32 rounding), or ``ProtocolError`` naming ``kind``.

    The payload of every randomizer that reports a unit direction (this one and PrivUnit).
    """
    if not isinstance(payload, Floats):
        raise ProtocolError(f"{kind} payload must be Floats, got {describe(payload)}")
    values = payload.values
    if len(values) != dimension:
        raise ProtocolError(f"{kind} payload must hold {dimension} floats, got {len(values)}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, float) or not math.isfinite(v):
            raise ProtocolError(f"{kind} payload values must be finite floats, got {describe(v)}")
    norm = math.hypot(*values)
    if abs(norm - 1.0) > PAYLOAD_NORM_TOLERANCE:
        raise ProtocolError(f"{kind} payload must be a unit vector, got norm {norm:.9g}")
    return payload


def uniform_direction(dimension: int, rng: Rng) -> list[float]:
    """A uniform unit vector from a sign-symmetric sampler: w and -w are exactly equally likely.

    Gaussian coordinates give the direction up to sign; an explicit fair coin then picks the sign,
    so the symmetry does not rest on the symmetry of a floating-point Gaussian sampler.
    """
    while True:
        g = [rng.gauss() for _ in range(dimension)]
        norm = math.hypot(*g)
        if norm > 0.0 and math.isfinite(norm):
            break
    if rng.bernoulli(1, 2):
        return [-v / norm for v in g]
    return [v / norm for v in g]


def _positive_first(w: list[float]) -> bool:
    """Whether the first nonzero coordinate of ``w`` is positive (the tie rule; depends on the pair only)."""
    for v in w:
        if v != 0.0:
            return v > 0.0
    return True  # unreachable for a unit vector


def ball_target(kind: str, x: list[float], rng: Rng) -> list[float]:
    """The unit direction a ball randomizer's report leans to (docs/protocol.md §13.0): x / ||x||
    with probability (1 + ||x||) / 2 and its opposite otherwise (an exact coin on the float), or a
    uniform direction for x = 0. ``EncodingError`` naming ``kind`` when ||x|| > 1 + NORM_SLACK."""
    norm = math.hypot(*x)
    if norm > 1.0 + NORM_SLACK:
        raise EncodingError(f"{kind} value must have l2 norm <= 1, got {norm:.17g}")
    if norm == 0.0:
        return uniform_direction(len(x), rng)
    num, den = ((1.0 + min(norm, 1.0)) / 2.0).as_integer_ratio()
    sign = 1.0 if rng.bernoulli(num, den) else -1.0
    return [sign * v / norm for v in x]


def randomize(value: Any, params: VectorL2BallParams, *, rng: Rng | None = None) -> Floats:
    """Report a unit direction whose hemisphere relative to ``value`` is chosen by an exact coin.

    Parameters
    ----------
    value : sequence of float
        ``params.dimension`` finite coordinates with l2 norm <= 1 (+ 1e-9 float slack).
    params : VectorL2BallParams
    rng : Rng, optional
        Defaults to the OS CSPRNG.
    """
    d = params.dimension
    x = check_vector("vector_l2_ball value", value, d)
    rng = resolve_rng(rng)
    target = ball_target("vector_l2_ball", x, rng)
    w = uniform_direction(d, rng)
    side = dot(w, target)  # left to right, one rounding per step (docs/protocol.md §12.5)
    if side < 0.0 or (side == 0.0 and not _positive_first(w)):
        w = [-v for v in w]  # now w is the near member of the pair {w, -w}
    pi = params.near_probability
    if not rng.bernoulli(pi.numerator, pi.denominator):
        w = [-v for v in w]
    return Floats(struct.unpack(f"<{d}f", struct.pack(f"<{d}f", *w)))
