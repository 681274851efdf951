"""Optimized local hashing, OLH: report a fresh hash seed and the randomized hash of the value.

The device draws a uniform 32-bit ``seed``, hashes its value v into one of g buckets,
h = H(seed, v), and reports ``HashedValue(seed, y)`` where y is h with probability
p = r / (r + g - 1) and each other bucket with probability 1 / (r + g - 1) (GRR over g buckets).

The hash (bit-identical in pure Python and in numpy)
    With all arithmetic modulo 2^64 and ``fmix64`` the 64-bit finalizer of MurmurHash3::

        fmix64(k):  k ^= k >> 33;  k *= 0xFF51AFD7ED558CCD;  k ^= k >> 33;
                    k *= 0xC4CEB9FE1A85EC53;  k ^= k >> 33

        H(seed, v) = fmix64(fmix64(v + 0x9E3779B97F4A7C15) XOR seed) mod g

    for ``seed`` in [0, 2^32), ``v`` in [0, 2^64) and g in [2, 2^32). ``fmix64`` is a bijection
    of 64-bit words with full avalanche, so for a random seed the buckets of two distinct values
    collide with probability close to 1/g. In numpy: ``uint64`` arrays, whose ``+``, ``*``,
    ``^``, ``>>`` and ``%`` wrap modulo 2^64 exactly as above (see :func:`hash_value`).
Privacy
    epsilon-LDP. The seed is uniform and independent of the value, so it cancels from every
    likelihood ratio; for a fixed seed the bucket is GRR over g values:
    P[(s, y) | x] / P[(s, y) | x'] <= p / (1 / (r + g - 1)) = r <= e^epsilon, where r is the largest
    48-bit dyadic rational <= e^epsilon. Equality holds whenever H(s, x) != H(s, x') and y = H(s, x),
    so the realized epsilon ``ln r`` is tight.
Parameters
    ``domain_size`` in [2, 2^63], ``epsilon`` in (0, 20], ``hash_range`` g: 0 (the
    variance-optimal g = floor(r + 1/2) + 1, at least 2) or in [2, 2^32 - 1].
Utility
    The support of value v counts the reports with H(seed, v) == y; a device not holding v
    supports it with probability q' = 1/g (over the random seed, for an ideal hash) and a holder
    with probability p. The estimate (support - n/g) / (p - 1/g) is unbiased and its variance is
    approximately n q'(1 - q') / (p - q')^2 + count (1 - p - q') / (p - q') (exact for an ideal hash
    family), which for the optimal g matches OUE's n 4 e^eps / (e^eps - 1)^2 to first order.
Cost
    32 + ceil(log2 g) bits (8 msgpack bytes for g < 128); one 32-bit draw, one exact coin, at most
    one more uniform draw and two 64-bit mixes: 15-25 us per report with the OS CSPRNG (pure
    Python). The server's support count is O(n x candidates) hashes (vectorize it with numpy).
Reference
    Wang, Blocki, Li and Jha, "Locally differentially private protocols for frequency estimation"
    (USENIX Security 2017); Bassily and Smith, "Local, private, efficient protocols for succinct
    histograms" (STOC 2015). fmix64: Appleby, MurmurHash3 (public domain).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar

from .._exact import exp_below, log_fraction
from .._validation import check_epsilon, check_int, describe
from ..errors import InvalidParameterError, ProtocolError
from ..payload import HashedValue
from ..rng import Rng, resolve_rng
from .base import MECHANISMS, MechanismParams, bits_for, check_index_value, count_estimate_variance

__all__ = [
    "HASH_OFFSET",
    "MIX_MULTIPLIER_1",
    "MIX_MULTIPLIER_2",
    "SEED_BITS",
    "LocalHashingParams",
    "fmix64",
    "hash_value",
    "optimal_hash_range",
    "randomize",
]

_MAX_DOMAIN = 2**63
_MAX_HASH_RANGE = 2**32 - 1
_MASK64 = 2**64 - 1
#: Bits of the per-report hash seed.
SEED_BITS = 32
#: Offset added to the value before the first mix (the 64-bit golden-ratio constant).
HASH_OFFSET = 0x9E3779B97F4A7C15
#: The two multipliers of MurmurHash3's fmix64.
MIX_MULTIPLIER_1 = 0xFF51AFD7ED558CCD
MIX_MULTIPLIER_2 = 0xC4CEB9FE1A85EC53


def fmix64(k: int) -> int:
    """MurmurHash3's 64-bit finalizer of a word ``k`` in [0, 2^64)."""
    k ^= k >> 33
    k = (k * MIX_MULTIPLIER_1) & _MASK64
    k ^= k >> 33
    k = (k * MIX_MULTIPLIER_2) & _MASK64
    return k ^ (k >> 33)


def _hash(seed: int, value: int, g: int) -> int:
    # fmix64 inlined twice: this runs once per report on the device.
    k = (value + HASH_OFFSET) & _MASK64
    k ^= k >> 33
    k = (k * MIX_MULTIPLIER_1) & _MASK64
    k ^= k >> 33
    k = (k * MIX_MULTIPLIER_2) & _MASK64
    k ^= (k >> 33) ^ seed
    k ^= k >> 33
    k = (k * MIX_MULTIPLIER_1) & _MASK64
    k ^= k >> 33
    k = (k * MIX_MULTIPLIER_2) & _MASK64
    return (k ^ (k >> 33)) % g


def hash_value(seed: int, value: int, g: int) -> int:
    """H(seed, value) in [0, g), as specified in the module docstring.

    A numpy twin over ``uint64`` arrays (bit-identical; the collector's vectorized version)::

        def fmix64(k):
            k ^= k >> np.uint64(33); k *= np.uint64(0xFF51AFD7ED558CCD)
            k ^= k >> np.uint64(33); k *= np.uint64(0xC4CEB9FE1A85EC53)
            return k ^ (k >> np.uint64(33))
        h = fmix64(fmix64(values + np.uint64(0x9E3779B97F4A7C15)) ^ seeds) % np.uint64(g)

    Parameters
    ----------
    seed : int
        In [0, 2^32).
    value : int
        In [0, 2^64).
    g : int
        Number of buckets, in [1, 2^32).
    """
    check_int("seed", seed, 0, 2**SEED_BITS - 1)
    check_int("value", value, 0, _MASK64)
    check_int("g", g, 1, _MAX_HASH_RANGE)
    return _hash(seed, value, g)


def optimal_hash_range(epsilon: float) -> int:
    """The variance-optimal number of buckets floor(r + 1/2) + 1 (at least 2), r = ``exp_below(epsilon)``.

    r is the exact rational stand-in for e^epsilon the mechanism's probabilities use, so every
    implementation derives the same g (``math.exp`` is not correctly rounded on every platform:
    near a tie, floor(e^epsilon + 1/2) could differ between two devices); see docs/protocol.md §7.4.
    """
    return max(2, math.floor(exp_below(check_epsilon(epsilon)) + Fraction(1, 2)) + 1)


@MECHANISMS.register
@dataclass(frozen=True, kw_only=True)
class LocalHashingParams(MechanismParams):
    """Parameters of local hashing (``ldp.v1.LocalHashing``); see the module docstring.

    Derived constants: ``g`` (buckets), ``ratio`` (r, the exact privacy ratio), ``p`` (the
    reported bucket is the true one), ``q_other`` (one given other bucket) and ``q`` = 1/g (a
    non-holder supports a value), each with an exact form.
    """

    KIND: ClassVar[str] = "local_hashing"
    PAYLOAD_FIELD: ClassVar[str] = "hashed"
    INPUT_KIND: ClassVar[str] = "index"

    domain_size: int
    epsilon: float
    hash_range: int = 0

    def __post_init__(self) -> None:
        check_int("domain_size", self.domain_size, 2, _MAX_DOMAIN)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        check_int("hash_range", self.hash_range, 0, _MAX_HASH_RANGE)
        if self.hash_range == 1:
            raise InvalidParameterError(
                f"hash_range must be 0 (optimal) or in [2, {_MAX_HASH_RANGE}], got 1")

    @cached_property
    def g(self) -> int:
        """Number of hash buckets."""
        return self.hash_range or optimal_hash_range(self.epsilon)

    @cached_property
    def ratio(self) -> Fraction:
        """r: the exact rational stand-in for e^epsilon (r <= e^epsilon), the privacy ratio."""
        return exp_below(self.epsilon)

    @cached_property
    def p_exact(self) -> Fraction:
        """Probability of reporting the true bucket."""
        return self.ratio / (self.ratio + self.g - 1)

    @cached_property
    def q_other_exact(self) -> Fraction:
        """Probability of reporting one given other bucket."""
        return 1 / (self.ratio + self.g - 1)

    @cached_property
    def q_exact(self) -> Fraction:
        """1/g: probability that a device not holding v supports v (ideal hash, random seed)."""
        return Fraction(1, self.g)

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
        return SEED_BITS + bits_for(self.g)

    def count_variance(self, n: float, count: float = 0.0) -> float:
        """Approximate variance of (support - n/g) / (p - 1/g) for a count ``count`` among ``n``.

        Exact for an ideal hash family (collision probability 1/g over the seed).
        """
        return count_estimate_variance(self.p, self.q, n, count)

    def supports(self, payload: HashedValue, value: int) -> bool:
        """Whether a report supports ``value`` (H(seed, value) equals the reported bucket)."""
        return _hash(payload.seed, value, self.g) == payload.value

    def randomize(self, value: Any, *, rng: Rng | None = None, seed: int | None = None) -> HashedValue:
        return randomize(value, self, rng=rng, seed=seed)

    def check_payload(self, payload: Any) -> HashedValue:
        if not isinstance(payload, HashedValue):
            raise ProtocolError(f"local_hashing payload must be a HashedValue, got {describe(payload)}")
        seed, value = payload
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**SEED_BITS:
            raise ProtocolError(f"local_hashing seed must be in [0, 2^{SEED_BITS}), got {describe(seed)}")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.g:
            raise ProtocolError(f"local_hashing bucket must be in [0, {self.g}), got {describe(value)}")
        return payload


def randomize(value: Any, params: LocalHashingParams, *, rng: Rng | None = None,
              seed: int | None = None) -> HashedValue:
    """Draw a 32-bit seed and report (seed, GRR_g(H(seed, value))).

    Parameters
    ----------
    value : int
        The encoded value, in ``[0, params.domain_size)``.
    params : LocalHashingParams
    rng : Rng, optional
        Defaults to the OS CSPRNG.
    seed : int, optional
        A seed in [0, 2^32) assigned by the collector instead of drawn here. Privacy is unchanged
        as long as the seed is public randomness fixed independently of ``value`` (a server
        assignment derived from the device id, campaign and round is); it takes the hash seed out
        of a poisoning device's hands.
    """
    value = check_index_value("local_hashing", value, params.domain_size)
    rng = resolve_rng(rng)
    g = params.g
    if seed is None:
        seed = rng.randbits(SEED_BITS)
    else:
        check_int("seed", seed, 0, 2**SEED_BITS - 1)
    bucket = _hash(seed, value, g)
    p = params.p_exact
    if rng.bernoulli(p.numerator, p.denominator):
        return HashedValue(seed, bucket)
    other = rng.randbelow(g - 1)
    return HashedValue(seed, other if other < bucket else other + 1)
