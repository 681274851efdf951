"""Unary encoding: symmetric (SUE, basic RAPPOR) and optimized (OUE).

The value v in [0, D) is one-hot encoded into D bits; the bit of v is reported as 1 with probability
p and every other bit, independently, as 1 with probability q.

Privacy
    Two inputs x != x' change only bits x and x', so for every output y
    P[y | x] / P[y | x'] <= p (1 - q) / (q (1 - p)), with equality when y has bit x set and bit
    x' clear. With r the largest 48-bit dyadic rational <= e^(epsilon/2) (SUE) or <= e^epsilon (OUE):

    * SUE: p = r / (r + 1), q = 1 / (r + 1): the ratio is r^2 <= e^epsilon, realized epsilon 2 ln r;
    * OUE: p = 1/2, q = 1 / (r + 1): the ratio is r <= e^epsilon, realized epsilon ln r.

    The bound is attained, so the stated realized epsilon is tight. All coins are exact rationals.
Parameters
    ``domain_size`` D in [2, 2^20], ``epsilon`` in (0, 20], ``variant`` SYMMETRIC or OPTIMIZED.
Utility
    The unbiased count estimate (C - n q) / (p - q) of a value held by ``count`` of n devices, with C
    the number of reports whose bit is set, has variance exactly
    n q (1 - q) / (p - q)^2 + count (1 - p - q) / (p - q); for OUE the first term is
    n 4 r / (r - 1)^2, the best of the pure-epsilon oracles for large D.
Cost
    D bits (ceil(D/8) bytes). CPU: the D - 1 independent Bernoulli(q) bits are drawn bit-parallel by
    :func:`bernoulli_mask`, about log2(D) + 2 draws of D random bits plus a handful of exact
    single coins; 30-60 us per report at D = 1024 with the OS CSPRNG (pure Python, 2-core box).
Reference
    Erlingsson, Pihur and Korolova, "RAPPOR" (CCS 2014); Wang, Blocki, Li and Jha, "Locally
    differentially private protocols for frequency estimation" (USENIX Security 2017).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar

from .._exact import log_fraction
from .._validation import check_epsilon, check_int, describe
from ..errors import InvalidParameterError, ProtocolError
from ..payload import MAX_BITS
from ..rng import Rng, resolve_rng
from .base import MECHANISMS, MechanismParams, check_index_value, count_estimate_variance, privacy_ratio

__all__ = ["UnaryEncodingParams", "UnaryVariant", "bernoulli_mask", "oue", "randomize", "sue"]

#: Largest domain: one bit a value, so a report is at most the longest payload bit vector.
MAX_DOMAIN = MAX_BITS
#: Below this many undecided positions, single exact coins beat another bit-parallel round.
_SERIAL_BELOW = 4


class UnaryVariant(enum.IntEnum):
    """Which unary encoding; values equal ``ldp.v1.UnaryEncoding.Variant``."""

    SYMMETRIC = 1
    OPTIMIZED = 2


def bernoulli_mask(n: int, num: int, den: int, rng: Rng) -> int:
    """Return an ``n``-bit integer whose bits are independent Bernoulli(``num/den``) coins, exactly.

    Every bit position i compares its own uniform real U_i in [0, 1) with c = num/den, digit by
    binary digit, lazily: one ``randbits`` call supplies the next digit of every still-undecided
    U_i at once (big-integer bit operations), and U_i < c is decided at the first digit where U_i
    and c differ. A position still undecided after k digits has U_i = c in those digits, so U_i < c
    then holds with probability exactly frac(2^k c) = rem / den: the last few undecided positions
    (fewer than four, or all of them after ``n.bit_length() + 2`` digits) are settled by one exact
    coin ``rng.bernoulli(rem, den)`` each, which is cheaper than another bit-parallel round. So
    P[bit i = 1] = c exactly and the bits are independent (each is a function of its own digits and
    its own coin). Only the digits between the lowest and the highest undecided position are drawn.

    Cost: about log2(n) draws of at most n random bits and, on average, fewer than four single coins.

    Parameters
    ----------
    n : int
        Number of coins (>= 0).
    num, den : int
        The probability ``num / den``, ``0 <= num <= den``, ``den >= 1``.
    rng : Rng
    """
    if den < 1 or not 0 <= num <= den:
        raise InvalidParameterError(f"bernoulli_mask needs 0 <= num <= den and den >= 1, got {num}/{den}")
    if n <= 0:
        return 0
    ones = 0
    undecided = (1 << n) - 1
    rem = num
    for _ in range(n.bit_length() + 2):
        if undecided.bit_count() < _SERIAL_BELOW:
            break
        low = (undecided & -undecided).bit_length() - 1
        digits = rng.randbits(undecided.bit_length() - low) << low
        rem <<= 1
        if rem >= den:  # digit of c is 1: U_i < c where U_i's digit is 0
            rem -= den
            ones |= undecided & ~digits
            undecided &= digits
        else:  # digit of c is 0: U_i > c where U_i's digit is 1
            undecided &= ~digits
    while undecided:
        lowest = undecided & -undecided
        if rng.bernoulli(rem, den):
            ones |= lowest
        undecided ^= lowest
    return ones


@MECHANISMS.register
@dataclass(frozen=True, kw_only=True)
class UnaryEncodingParams(MechanismParams):
    """Parameters of unary encoding (``ldp.v1.UnaryEncoding``); see the module docstring.

    Derived constants: ``r`` (the rational stand-in for e^(epsilon/2) or e^epsilon), ``ratio``
    (the exact privacy ratio, r^2 for SUE and r for OUE), ``p``/``q`` and their exact forms.
    """

    KIND: ClassVar[str] = "unary_encoding"
    PAYLOAD_FIELD: ClassVar[str] = "bits"
    INPUT_KIND: ClassVar[str] = "index"

    domain_size: int
    epsilon: float
    variant: UnaryVariant

    def __post_init__(self) -> None:
        check_int("domain_size", self.domain_size, 2, MAX_DOMAIN)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        variant: Any = self.variant  # may be a plain int (from_dict, callers)
        if isinstance(variant, bool) or not isinstance(variant, int):
            raise TypeError(f"variant must be a UnaryVariant, got {type(variant).__name__}")
        if variant not in (UnaryVariant.SYMMETRIC, UnaryVariant.OPTIMIZED):
            raise InvalidParameterError(
                f"variant must be SYMMETRIC (1) or OPTIMIZED (2), got {int(variant)}")
        object.__setattr__(self, "variant", UnaryVariant(variant))
        _ = self.r  # refuses an epsilon whose ratio is 1

    @cached_property
    def r(self) -> Fraction:
        """The rational stand-in for e^(epsilon/2) (SUE) or e^epsilon (OUE), never above it."""
        if self.variant == UnaryVariant.SYMMETRIC:
            return privacy_ratio(self.epsilon / 2, "epsilon / 2")
        return privacy_ratio(self.epsilon)

    @cached_property
    def ratio(self) -> Fraction:
        """The exact privacy ratio p (1 - q) / (q (1 - p)): r^2 for SUE, r for OUE."""
        return self.r**2 if self.variant == UnaryVariant.SYMMETRIC else self.r

    @cached_property
    def p_exact(self) -> Fraction:
        """Probability that the true value's bit is reported as 1."""
        return self.r / (self.r + 1) if self.variant == UnaryVariant.SYMMETRIC else Fraction(1, 2)

    @cached_property
    def q_exact(self) -> Fraction:
        """Probability that any other bit is reported as 1."""
        return 1 / (self.r + 1)

    @cached_property
    def p(self) -> float:
        return float(self.p_exact)

    @cached_property
    def q(self) -> float:
        return float(self.q_exact)

    @property
    def realized_epsilon(self) -> float:
        return log_fraction(self.ratio)

    @property
    def input_size(self) -> int:
        return self.domain_size

    @property
    def payload_bits(self) -> int:
        return self.domain_size

    @property
    def payload_bytes(self) -> int:
        """Length of the packed report."""
        return (self.domain_size + 7) // 8

    def count_variance(self, n: float, count: float = 0.0) -> float:
        """Exact variance of the unbiased estimate (C - n q) / (p - q) of a count ``count`` among ``n``."""
        return count_estimate_variance(self.p, self.q, n, count)

    def randomize(self, value: Any, *, rng: Rng | None = None) -> bytes:
        return randomize(value, self, rng=rng)

    def check_payload(self, payload: Any) -> bytes:
        if not isinstance(payload, bytes) or len(payload) != self.payload_bytes:
            raise ProtocolError(
                f"unary_encoding payload must be {self.payload_bytes} bytes, got {describe(payload)}")
        if self.domain_size % 8 and payload[-1] >> (self.domain_size % 8):
            raise ProtocolError(f"unary_encoding payload has bits set beyond domain_size {self.domain_size}")
        return payload


def sue(domain_size: int, epsilon: float) -> UnaryEncodingParams:
    """Symmetric unary encoding (basic one-time RAPPOR)."""
    return UnaryEncodingParams(domain_size=domain_size, epsilon=epsilon, variant=UnaryVariant.SYMMETRIC)


def oue(domain_size: int, epsilon: float) -> UnaryEncodingParams:
    """Optimized unary encoding."""
    return UnaryEncodingParams(domain_size=domain_size, epsilon=epsilon, variant=UnaryVariant.OPTIMIZED)


def randomize(value: Any, params: UnaryEncodingParams, *, rng: Rng | None = None) -> bytes:
    """Report bit ``value`` as 1 with probability p and every other bit as 1 with probability q.

    Parameters
    ----------
    value : int
        The encoded value, in ``[0, params.domain_size)``.
    params : UnaryEncodingParams
    rng : Rng, optional
        Defaults to the OS CSPRNG.

    Returns
    -------
    bytes
        ``params.domain_size`` bits packed little-endian (:func:`ldp_client.payload.pack_bits`).
    """
    index = check_index_value("unary_encoding", value, params.domain_size)
    rng = resolve_rng(rng)
    q, p = params.q_exact, params.p_exact
    others = bernoulli_mask(params.domain_size - 1, q.numerator, q.denominator, rng)
    true_bit = 1 if rng.bernoulli(p.numerator, p.denominator) else 0
    # Insert the true bit at position `index`; bit i of an int is bit i of its little-endian bytes.
    bits = (others & ((1 << index) - 1)) | (true_bit << index) | ((others >> index) << (index + 1))
    return bits.to_bytes(params.payload_bytes, "little")
