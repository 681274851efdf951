"""Bitwise randomized response: every bit of a fixed-length bit vector is flipped independently.

Used for kCluster-style bit vectors (DESIGN section 7.5), where two encodable vectors differ in at
most ``sensitivity`` bits.

Privacy
    epsilon-LDP for inputs at Hamming distance <= ``sensitivity`` (s). Each bit is kept with
    probability p_keep = r_b / (1 + r_b) and flipped with p_flip = 1 / (1 + r_b), where r_b is the
    largest 48-bit dyadic rational <= e^(epsilon / s). For inputs x, x' differing in d <= s bits and
    any output y only those d bits matter, each contributing a factor r_b or 1/r_b, so
    P[y | x] / P[y | x'] <= r_b^d <= r_b^s <= e^epsilon. Equality holds for d = s when y = x, so the
    realized epsilon s ln r_b is tight. (Vectors farther apart than s get r_b^d: the encoder must
    guarantee the sensitivity.)
Parameters
    ``length`` L in [1, 2^20], ``epsilon`` in (0, 20], ``sensitivity`` s in [1, L].
Utility
    Per report and bit, (y_i - p_flip) / (p_keep - p_flip) is an unbiased estimate of x_i with
    variance p_keep p_flip / (p_keep - p_flip)^2 (the same for x_i = 0 and 1), so the estimated
    number of devices with bit i set has variance n p_keep p_flip / (p_keep - p_flip)^2.
Cost
    L bits (ceil(L/8) bytes). CPU: the L flips are drawn bit-parallel (see
    :func:`ldp_client.mechanisms.unary_encoding.bernoulli_mask`), about 30-40 us for 64 bits.
Reference
    Warner (1965); Erlingsson, Pihur and Korolova, "RAPPOR" (CCS 2014); Sun, Zhao and Ye,
    "Distributed clustering in the anonymized space with local differential privacy" (2019), kCluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar

from .._exact import log_fraction
from .._validation import check_epsilon, check_int, describe
from ..errors import InvalidParameterError, ProtocolError
from ..payload import MAX_BITS
from ..rng import Rng, resolve_rng
from .base import MECHANISMS, MechanismParams, privacy_ratio
from .unary_encoding import bernoulli_mask

__all__ = ["BitwiseRRParams", "randomize"]

#: Longest bit vector: the longest payload bit vector.
MAX_LENGTH = MAX_BITS


@MECHANISMS.register
@dataclass(frozen=True, kw_only=True)
class BitwiseRRParams(MechanismParams):
    """Parameters of bitwise randomized response (``ldp.v1.BitwiseRandomizedResponse``).

    Derived constants: ``r_b`` (per-bit ratio), ``ratio`` = r_b^sensitivity (the exact privacy
    ratio), ``p_keep``/``p_flip`` and their exact forms, and the server's debiasing constants
    ``debias_offset`` and ``debias_scale``: x_hat_i = (y_i - debias_offset) * debias_scale.
    """

    KIND: ClassVar[str] = "bitwise_rr"
    PAYLOAD_FIELD: ClassVar[str] = "bits"
    INPUT_KIND: ClassVar[str] = "bits"

    length: int
    epsilon: float
    sensitivity: int

    def __post_init__(self) -> None:
        check_int("length", self.length, 1, MAX_LENGTH)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        check_int("sensitivity", self.sensitivity, 1, self.length)
        _ = self.r_b  # refuses an epsilon whose per-bit ratio is 1

    @cached_property
    def r_b(self) -> Fraction:
        """Per-bit ratio: the exact rational stand-in for e^(epsilon / sensitivity), never above it."""
        return privacy_ratio(self.epsilon / self.sensitivity, "epsilon / sensitivity")

    @cached_property
    def ratio(self) -> Fraction:
        """The exact privacy ratio r_b^sensitivity between inputs within the sensitivity."""
        return self.r_b**self.sensitivity

    @cached_property
    def p_keep_exact(self) -> Fraction:
        """Probability that a bit is reported unchanged."""
        return self.r_b / (1 + self.r_b)

    @cached_property
    def p_flip_exact(self) -> Fraction:
        """Probability that a bit is flipped."""
        return 1 / (1 + self.r_b)

    @cached_property
    def p_keep(self) -> float:
        return float(self.p_keep_exact)

    @cached_property
    def p_flip(self) -> float:
        return float(self.p_flip_exact)

    @cached_property
    def debias_offset(self) -> float:
        """E[y_i | x_i = 0] = p_flip."""
        return self.p_flip

    @cached_property
    def debias_scale(self) -> float:
        """1 / (p_keep - p_flip), so that (y_i - p_flip) / (p_keep - p_flip) estimates x_i unbiasedly."""
        return float(1 / (self.p_keep_exact - self.p_flip_exact))

    @cached_property
    def bit_variance(self) -> float:
        """Variance of one report's debiased bit: p_keep p_flip / (p_keep - p_flip)^2."""
        return float(self.p_keep_exact * self.p_flip_exact / (self.p_keep_exact - self.p_flip_exact) ** 2)

    @property
    def realized_epsilon(self) -> float:
        return log_fraction(self.ratio)

    @property
    def input_size(self) -> int:
        return self.length

    @property
    def payload_bits(self) -> int:
        return self.length

    @property
    def payload_bytes(self) -> int:
        """Length of the packed report."""
        return (self.length + 7) // 8

    def count_variance(self, n: float, count: float = 0.0) -> float:
        """Variance of the debiased number of devices with a given bit set among ``n`` (any ``count``)."""
        return n * self.bit_variance

    def randomize(self, value: Any, *, rng: Rng | None = None) -> bytes:
        return randomize(value, self, rng=rng)

    def check_payload(self, payload: Any) -> bytes:
        if not isinstance(payload, bytes) or len(payload) != self.payload_bytes:
            raise ProtocolError(f"bitwise_rr payload must be {self.payload_bytes} bytes, got {describe(payload)}")
        if self.length % 8 and payload[-1] >> (self.length % 8):
            raise ProtocolError(f"bitwise_rr payload has bits set beyond length {self.length}")
        return payload


def _bits_to_int(bits: Any, length: int) -> int:
    if isinstance(bits, (str, bytes, bytearray)) or not isinstance(bits, Sequence):
        raise TypeError(f"bitwise_rr value must be a sequence of 0/1 ints, got {type(bits).__name__}")
    if len(bits) != length:
        raise InvalidParameterError(f"bitwise_rr value must have length {length}, got {len(bits)}")
    x = 0
    for i, b in enumerate(bits):
        if not isinstance(b, int):
            raise TypeError(f"bitwise_rr value bits must be 0/1 ints, got {type(b).__name__} at position {i}")
        if b == 1:
            x |= 1 << i
        elif b != 0:
            raise InvalidParameterError(f"bitwise_rr value bits must be in [0, 1], got {b} at position {i}")
    return x


def randomize(value: Any, params: BitwiseRRParams, *, rng: Rng | None = None) -> bytes:
    """Flip every bit of ``value`` independently with probability ``params.p_flip``.

    Parameters
    ----------
    value : sequence of int
        ``params.length`` bits, each 0 or 1 (``bool`` accepted).
    params : BitwiseRRParams
    rng : Rng, optional
        Defaults to the OS CSPRNG.

    Returns
    -------
    bytes
        The randomized bits packed little-endian (:func:`ldp_client.payload.pack_bits`).
    """
    x = _bits_to_int(value, params.length)
    rng = resolve_rng(rng)
    flip = params.p_flip_exact
    flips = bernoulli_mask(params.length, flip.numerator, flip.denominator, rng)
    return (x ^ flips).to_bytes(params.payload_bytes, "little")
