"""Unbiased randomizer for vectors of the box [-1, 1]^d (Duchi et al.'s l-infinity mechanism, exact for every d).

A device holding x in [-1, 1]^d reports one sign vector z in {-1, +1}^d (d bits); the collector's
estimate of x is B z, unbiased, with the public constant B = :attr:`VectorBoxParams.scale`.

Algorithm
    1. v_j = +1 with probability (1 + x_j) / 2, else -1 (an exact coin on the float x_j, which is
       a dyadic rational), so E[v] = x.
    2. With S+ = {z : <z, v> > 0} and S- = {z : <z, v> <= 0}, report z uniform on S+ with
       probability pi' = r |S+| / (r |S+| + |S-|), else z uniform on S-, where r is the largest
       48-bit dyadic rational <= e^epsilon.
    Uniform members of a hemisphere are drawn with a finite number of exact draws: a uniform
    sign vector is folded onto the wanted side by negation (z and -z lie on opposite sides unless
    <z, v> = 0); for even d the equator {<z, v> = 0} is handled by drawing the number of
    coordinates that agree with v (weights C(d, m)) and then a uniform set of that many agreeing
    coordinates (selection sampling), so every member comes out with exactly equal probability.
Privacy
    epsilon-LDP with realized epsilon ln r <= epsilon, tight. Every z of S+ has probability
    pi' / |S+| = r c and every z of S- has (1 - pi') / |S-| = c, c = 1 / (r |S+| + |S-|), so
    P[z | v] / P[z | v'] is r, 1 or 1 / r, and mixing over v (step 1) keeps every ratio <= r;
    x = v and x' = -v attain it. Note: the textbook coin pi = e^eps / (e^eps + 1) is right only
    for odd d, where |S+| = |S-| = 2^(d-1). For even d, |S-| = |S+| + C(d, d/2) and the textbook
    per-output ratio is e^eps |S-| / |S+| (3 e^eps for d = 2): it over-spends the budget.
Parameters
    ``dimension`` d in [1, 4096], ``epsilon`` in (0, 20] (at least about 1.5e-14, so that r > 1).
Utility
    E[z | v] = (pi' c+ - (1 - pi') c-) v with c+- = A / |S+-|,
    A = sum_{m > d/2} C(d, m) (2m - d) / d = ceil(d/2) C(d, ceil(d/2)) / d, so
    B = 1 / (pi' c+ - (1 - pi') c-) = (r |S+| + |S-|) / ((r - 1) A), an exact rational. Each
    coordinate of B z is +-B, so Var[B z_j] = B^2 - x_j^2 <= B^2
    (:attr:`VectorBoxParams.variance_bound`), O(d / epsilon^2) for small epsilon.
Cost
    d bits. CPU: d + 1 exact coins and one d-bit draw; for even d, with probability about
    C(d, d/2) / 2^d, up to d + 2 further draws. About 40 microseconds for d = 10.
Reference
    Duchi, Jordan and Wainwright, "Minimax optimal procedures for locally private estimation"
    (JASA 2018); Wang et al., "Collecting and analyzing multidimensional data with
    local differential privacy" (ICDE 2019), for the comparison with Piecewise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar

from .._validation import check_vector, describe
from ..encoders.base import BOX
from ..errors import EncodingError, ProtocolError
from ..payload import unpack_bits
from ..rng import Rng, resolve_rng
from .base import MECHANISMS, VectorParams

__all__ = ["VectorBoxParams", "randomize"]


@MECHANISMS.register
@dataclass(frozen=True, kw_only=True)
class VectorBoxParams(VectorParams):
    """Parameters of the box vector randomizer (``ldp.v1.VectorBox``).

    See the module docstring for the privacy argument, utility and cost. Sign vectors are held as
    int bit masks (bit j set: coordinate j is +1), which is also their packed wire form.
    """

    KIND: ClassVar[str] = "vector_box"
    PAYLOAD_FIELD: ClassVar[str] = "bits"
    INPUT_KIND: ClassVar[str] = BOX

    @cached_property
    def equator_size(self) -> int:
        """|{z : <z, v> = 0}| = C(d, d/2) for even d, 0 for odd d."""
        d = self.dimension
        return math.comb(d, d // 2) if d % 2 == 0 else 0

    @cached_property
    def upper_size(self) -> int:
        """|S+| = |{z : <z, v> > 0}| = (2^d - |equator|) / 2."""
        return ((1 << self.dimension) - self.equator_size) // 2

    @cached_property
    def lower_size(self) -> int:
        """|S-| = |{z : <z, v> <= 0}| = |S+| + |equator|."""
        return self.upper_size + self.equator_size

    @cached_property
    def upper_probability(self) -> Fraction:
        """pi' = r |S+| / (r |S+| + |S-|): the per-output ratio between the hemispheres is exactly r."""
        r = self.ratio
        return r * self.upper_size / (r * self.upper_size + self.lower_size)

    @cached_property
    def agreement_sum(self) -> Fraction:
        """A = sum_{m > d/2} C(d, m) (2m - d) / d = ceil(d/2) C(d, ceil(d/2)) / d."""
        d = self.dimension
        half_up = (d + 1) // 2
        return Fraction(half_up * math.comb(d, half_up), d)

    @cached_property
    def scale_exact(self) -> Fraction:
        """B = 1 / (pi' A / |S+| - (1 - pi') A / |S-|) = (r |S+| + |S-|) / ((r - 1) A)."""
        r = self.ratio
        return (r * self.upper_size + self.lower_size) / ((r - 1) * self.agreement_sum)

    @cached_property
    def scale(self) -> float:
        """B as a float: the estimate is B z."""
        return float(self.scale_exact)

    @cached_property
    def variance_bound(self) -> float:
        """B^2: bounds the variance of every coordinate of one estimate (exact at x_j = 0)."""
        return self.scale**2

    def coordinate_variance(self, true_value: float = 0.0) -> float:
        """Exact variance B^2 - x_j^2 of one coordinate of one estimate whose truth is ``true_value``."""
        return self.variance_bound - true_value * true_value

    @cached_property
    def _mask(self) -> int:
        return (1 << self.dimension) - 1

    @property
    def payload_bits(self) -> int:
        return self.dimension

    def randomize(self, value: Any, *, rng: Rng | None = None) -> bytes:
        return randomize(value, self, rng=rng)

    def check_payload(self, payload: Any) -> bytes:
        n_bytes = (self.dimension + 7) // 8
        if not isinstance(payload, bytes) or len(payload) != n_bytes:
            raise ProtocolError(f"vector_box payload must be {n_bytes} bytes of packed signs, got {describe(payload)}")
        if int.from_bytes(payload, "little") >> self.dimension:
            raise ProtocolError(f"vector_box payload has bits set beyond the dimension {self.dimension}")
        return payload

    def estimate(self, payload: Any) -> list[float]:
        """Unbiased estimate B z of the device's vector from its packed signs z (bit 1 = +1)."""
        b = self.scale
        return [b if bit else -b for bit in unpack_bits(self.check_payload(payload), self.dimension)]


def _with_agreements(v: int, agree: int, d: int, rng: Rng) -> int:
    """Uniform z among the sign vectors that agree with ``v`` in exactly ``agree`` coordinates."""
    flips = 0
    need = agree
    for j in range(d):
        remaining = d - j
        # Selection sampling (Knuth's Algorithm S): keep coordinate j with probability need / remaining.
        if need == remaining or (need > 0 and rng.bernoulli(need, remaining)):
            need -= 1
        else:
            flips |= 1 << j
    return v ^ flips


def _uniform_upper(v: int, params: VectorBoxParams, rng: Rng) -> int:
    """Uniform z with <z, v> > 0."""
    d, mask = params.dimension, params._mask
    z = rng.randbits(d)
    twice_dot = d - 2 * (z ^ v).bit_count()
    if twice_dot > 0:
        return z
    if twice_dot < 0:
        return z ^ mask  # -z: negation is a bijection between the two strict hemispheres
    # Equator (even d only): draw the agreement count m > d/2 with weight C(d, m), then the set.
    k = rng.randbelow(params.upper_size)
    m = d // 2 + 1
    count = math.comb(d, m)
    while k >= count:
        k -= count
        count = count * (d - m) // (m + 1)
        m += 1
    return _with_agreements(v, m, d, rng)


def _uniform_lower(v: int, params: VectorBoxParams, rng: Rng) -> int:
    """Uniform z with <z, v> <= 0."""
    d, mask = params.dimension, params._mask
    z = rng.randbits(d)
    twice_dot = d - 2 * (z ^ v).bit_count()
    if twice_dot <= 0:
        return z
    if params.equator_size == 0:
        return z ^ mask  # odd d: -z is uniform on S- = the strict lower hemisphere
    # Even d: -z is uniform on the strict lower part N; share this draw's mass between N and the
    # equator E in proportion to their sizes, so that every member of S- = N + E is equally likely.
    if rng.bernoulli(params.upper_size, params.lower_size):
        return z ^ mask
    return _with_agreements(v, d // 2, d, rng)


def randomize(value: Any, params: VectorBoxParams, *, rng: Rng | None = None) -> bytes:
    """Round ``value`` to a random corner v, then report a sign vector from v's chosen hemisphere.

    Parameters
    ----------
    value : sequence of float
        ``params.dimension`` finite coordinates in [-1, 1].
    params : VectorBoxParams
    rng : Rng, optional
        Defaults to the OS CSPRNG.

    Returns
    -------
    bytes
        The signs of z packed little-endian (bit j = 1 means z_j = +1).
    """
    d = params.dimension
    x = check_vector("vector_box value", value, d)
    for j, xj in enumerate(x):
        if not -1.0 <= xj <= 1.0:
            raise EncodingError(f"vector_box value coordinate {j} must be in [-1, 1], got {xj}")
    rng = resolve_rng(rng)
    v = 0
    for j, xj in enumerate(x):
        # P[v_j = +1] = (1 + x_j) / 2 exactly: x_j = num / den with den a power of two.
        num, den = xj.as_integer_ratio()
        if num == den or (num != -den and rng.bernoulli(den + num, 2 * den)):
            v |= 1 << j
    pi = params.upper_probability
    if rng.bernoulli(pi.numerator, pi.denominator):
        z = _uniform_upper(v, params, rng)
    else:
        z = _uniform_lower(v, params, rng)
    return z.to_bytes((d + 7) // 8, "little")
