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
    P[(s, y) | x] / P[(s, y) | x'] <= p / (1 / (r + g - 1)) = r <= e^epsilon, where r = exp_below(epsilon)
    (``docs/protocol.md`` §7.1), a dyadic rational just below e^epsilon. Equality holds whenever H(s, x) != H(s, x') and y = H(s, x),
    so the realized epsilon ``ln r`` is tight.
Parameters
    ``domain_size`` in [2, 2^63], ``epsilon`` in (0, 20], ``hash_range`` g: 0 (the
    variance-optimal g = floor(r + 1/2) + 1, at least 2) or in [2, 2^32 - 1];
    ``seed_pool_size`` S: 0 (every report draws a fresh 32-bit seed) or in [1, 2^24], and
    ``seed_pool_key`` in [0, 2^64).
A public seed pool (fast local hashing; ``docs/protocol.md`` §14)
    With S > 0 the seed is not drawn as 32 fresh bits but taken from a public pool of S seeds,
    ``pool_seed(key, j) = splitmix64(mix64(key XOR "ldp.pool"), j) >> 32`` for j in [0, S) (the
    SplitMix64 stream of :mod:`ldp_client.encoders.projection`); the device draws its index j
    uniformly with ``randbelow(S)`` in place of the 32-bit seed draw, or, when the collector
    assigned it a seed a, uses j = a mod S. The collector then keeps S x g counts instead of the
    raw reports, and the support of a candidate costs S hashes instead of n.
    A pool cannot weaken epsilon-LDP, whatever S and key a collector sends: the seed is still
    chosen independently of the value and published, and for every fixed seed the bucket is GRR
    over g values with ratio r, so every likelihood ratio stays <= r (a pool of one seed, or
    seeds chosen so that two values collide, only lowers the utility of the report).
Utility
    The support of value v counts the reports with H(seed, v) == y; a device not holding v
    supports it with probability q' = 1/g (over the random seed, for an ideal hash) and a holder
    with probability p. The estimate (support - n/g) / (p - 1/g) is unbiased and its variance is
    approximately n q'(1 - q') / (p - q')^2 + count (1 - p - q') / (p - q') (exact for an ideal hash
    family), which for the optimal g matches OUE's n 4 e^eps / (e^eps - 1)^2 to first order.
    With a pool of S seeds, devices sharing a seed and a value share the collision of that value
    with v, which adds sum_{x != v} n_x (n_x - 1) / ((g - 1) S) (exactly, for an ideal hash
    family; n_x devices hold x; :meth:`LocalHashingParams.seed_pool_extra_variance`).
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

from .._exact import log_fraction
from .._spec import grown_field
from .._validation import check_epsilon, check_int, describe
from ..encoders.projection import splitmix64, stream_key
from ..errors import InvalidParameterError, ProtocolError
from ..payload import HashedValue
from ..rng import Rng, resolve_rng
from .base import MECHANISMS, MechanismParams, bits_for, check_index_value, count_estimate_variance, privacy_ratio

__all__ = [
    "HASH_OFFSET",
    "MAX_SEED_POOL",
    "MIX_MULTIPLIER_1",
    "MIX_MULTIPLIER_2",
    "PURPOSE_SEED_POOL",
    "SEED_BITS",
    "LocalHashingParams",
    "fmix64",
    "hash_value",
    "optimal_hash_range",
    "pool_seed",
    "randomize",
    "seed_pool_size_for",
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
#: Largest public seed pool: 2^24 seeds (the collector keeps S x g counts; beyond this the pool
#: saves nothing over raw reports at any realistic n).
MAX_SEED_POOL = 2**24
#: Stream tag of the seed pool's SplitMix64 stream (8 ASCII bytes, big-endian): ``b"ldp.pool"``.
PURPOSE_SEED_POOL = int.from_bytes(b"ldp.pool", "big")


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


def pool_seed(key: int, index: int) -> int:
    """Seed ``index`` of the public pool of ``key``: the top 32 bits of a SplitMix64 word.

    ``splitmix64(stream_key(key, PURPOSE_SEED_POOL), index) >> 32``; see ``docs/protocol.md`` §14.
    The top bits are taken because H needs seeds below 2^32 and SplitMix64's high bits are its
    best mixed.

    Parameters
    ----------
    key : int
        The round's ``seed_pool_key``, in [0, 2^64).
    index : int
        In [0, 2^24).
    """
    check_int("seed_pool_key", key, 0, _MASK64)
    check_int("index", index, 0, MAX_SEED_POOL - 1)
    return splitmix64(stream_key(key, PURPOSE_SEED_POOL), index) >> SEED_BITS


def seed_pool_size_for(params: LocalHashingParams, reports: float, concentration: float,
                       share: float = 0.1) -> int:
    """The smallest pool whose extra variance is at most ``share`` of the per-report variance.

    With n reports of which n_x hold x, the extra term of a pool of S seeds is
    sum_{x != v} n_x (n_x - 1) / ((g - 1) S) <= n^2 kappa / ((g - 1) S), where
    kappa = sum_x (n_x / n)^2 (the ``concentration``: the chance that two devices hold the same
    value, 1/D for a uniform population, at most the largest share of one value), and the
    per-report variance of any count is at least n K with K = q (1 - q) / (p - q)^2. Their ratio
    n kappa / ((g - 1) S K) is at most ``share`` for

        S = ceil(n kappa / ((g - 1) K share)),

    at least 1 and at most :data:`MAX_SEED_POOL`.

    Parameters
    ----------
    params : LocalHashingParams
    reports : float
        Expected number of reports n of the round, >= 0.
    concentration : float
        kappa, or a bound on it, in [0, 1] (e.g. the largest expected share of one value, or a
        previous round's estimate: the collector's ``value_pairs() / n^2``).
    share : float
        Largest extra variance as a share of the per-report variance, in (0, 1]; default 0.1.
    """
    if not isinstance(params, LocalHashingParams):
        raise TypeError(f"params must be LocalHashingParams, got {type(params).__name__}")
    if not 0 <= reports < math.inf:
        raise InvalidParameterError(f"reports must be finite and >= 0, got {reports}")
    if not 0 <= concentration <= 1:
        raise InvalidParameterError(f"concentration must be in [0, 1], got {concentration}")
    if not 0 < share <= 1:
        raise InvalidParameterError(f"share must be in (0, 1], got {share}")
    k = params.count_variance(1.0)
    return max(1, min(MAX_SEED_POOL, math.ceil(reports * concentration / ((params.g - 1) * k * share))))


def optimal_hash_range(epsilon: float) -> int:
    """The variance-optimal number of buckets floor(r + 1/2) + 1 (at least 2), r = ``exp_below(epsilon)``.

    r is the exact rational stand-in for e^epsilon the mechanism's probabilities use, so every
    implementation derives the same g (``math.exp`` is not correctly rounded on every platform:
    near a tie, floor(e^epsilon + 1/2) could differ between two devices); see docs/protocol.md §7.4.
    """
    return max(2, math.floor(privacy_ratio(check_epsilon(epsilon)) + Fraction(1, 2)) + 1)


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
    seed_pool_size: int = grown_field(0)
    seed_pool_key: int = grown_field(0)

    def __post_init__(self) -> None:
        check_int("domain_size", self.domain_size, 2, _MAX_DOMAIN)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        check_int("hash_range", self.hash_range, 0, _MAX_HASH_RANGE)
        if self.hash_range == 1:
            raise InvalidParameterError(
                f"hash_range must be 0 (optimal) or in [2, {_MAX_HASH_RANGE}], got 1")
        check_int("seed_pool_size", self.seed_pool_size, 0, MAX_SEED_POOL)
        check_int("seed_pool_key", self.seed_pool_key, 0, _MASK64)
        _ = self.ratio  # refuses an epsilon whose ratio is 1
        if not self.seed_pool_size and self.seed_pool_key:
            # One meaning per message: a key without a pool would be silently ignored.
            raise InvalidParameterError(
                f"seed_pool_key must be 0 when seed_pool_size is 0, got {self.seed_pool_key}")

    @cached_property
    def g(self) -> int:
        """Number of hash buckets."""
        return self.hash_range or optimal_hash_range(self.epsilon)

    @cached_property
    def ratio(self) -> Fraction:
        """r: the exact rational stand-in for e^epsilon (r <= e^epsilon), the privacy ratio."""
        return privacy_ratio(self.epsilon)

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

    def seed_pool_extra_variance(self, sum_pairs: float) -> float:
        """Extra variance of a count estimate from a pool of ``seed_pool_size`` seeds (0 without one).

        ``sum_pairs`` is sum_{x != v} n_x (n_x - 1) over the values other than the estimated one;
        the term is ``sum_pairs / ((g - 1) S)``, exact for an ideal hash family (``docs/protocol.md``
        §14 derives it).
        """
        if not self.seed_pool_size:
            return 0.0
        return sum_pairs / ((self.g - 1) * self.seed_pool_size)

    def assigned_seed(self, assigned: int) -> int:
        """The seed a report carries when the collector assigned ``assigned`` in [0, 2^32).

        ``assigned`` itself without a pool; with one, the pool's seed ``assigned mod S``
        (``docs/protocol.md`` §14.3).
        """
        check_int("seed", assigned, 0, 2**SEED_BITS - 1)
        if not self.seed_pool_size:
            return assigned
        return pool_seed(self.seed_pool_key, assigned % self.seed_pool_size)

    @cached_property
    def pool_seeds(self) -> tuple[int, ...]:
        """The S public seeds of the pool (empty without a pool); a collector-side helper: O(S)."""
        key = stream_key(self.seed_pool_key, PURPOSE_SEED_POOL)
        return tuple(splitmix64(key, j) >> SEED_BITS for j in range(self.seed_pool_size))

    def supports(self, payload: HashedValue, value: int) -> bool:
        """Whether a report supports ``value`` (H(seed, value) equals the reported bucket)."""
        return _hash(payload.seed, value, self.g) == payload.value

    def randomize(self, value: Any, *, rng: Rng | None = None, seed: int | None = None) -> HashedValue:
        return randomize(value, self, rng=rng, seed=seed)

    @cached_property
    def pool_seed_set(self) -> frozenset[int]:
        """The pool's seeds as a set (empty without a pool), built once per parameter object (O(S)), so
        that a membership check (``check_payload``, the collector's batch check) is O(1) per report."""
        return frozenset(self.pool_seeds)

    def check_payload(self, payload: Any) -> HashedValue:
        """Check a report's shape and ranges; with a seed pool its seed must be one of the pool's."""
        if not isinstance(payload, HashedValue):
            raise ProtocolError(f"local_hashing payload must be a HashedValue, got {describe(payload)}")
        seed, value = payload
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**SEED_BITS:
            raise ProtocolError(f"local_hashing seed must be in [0, 2^{SEED_BITS}), got {describe(seed)}")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.g:
            raise ProtocolError(f"local_hashing bucket must be in [0, {self.g}), got {describe(value)}")
        if self.seed_pool_size and seed not in self.pool_seed_set:
            raise ProtocolError(f"local_hashing seed {seed} is not in the round's seed pool")
        return payload


def randomize(value: Any, params: LocalHashingParams, *, rng: Rng | None = None,
              seed: int | None = None) -> HashedValue:
    """Draw a 32-bit seed (or a pool index) and report (seed, GRR_g(H(seed, value))).

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
        of a poisoning device's hands. With a seed pool, the assigned value a picks the pool's
        seed a mod S.

    Notes
    -----
    Draws, in order: the seed (``randbits(32)``; with a pool ``randbelow(S)``; none when
    assigned), the exact coin ``bernoulli(p)``, and only when it fails ``randbelow(g - 1)``.
    """
    value = check_index_value("local_hashing", value, params.domain_size)
    rng = resolve_rng(rng)
    g = params.g
    pool = params.seed_pool_size
    if seed is None:
        seed = pool_seed(params.seed_pool_key, rng.randbelow(pool)) if pool else rng.randbits(SEED_BITS)
    else:
        seed = params.assigned_seed(seed)
    bucket = _hash(seed, value, g)
    p = params.p_exact
    if rng.bernoulli(p.numerator, p.denominator):
        return HashedValue(seed, bucket)
    other = rng.randbelow(g - 1)
    return HashedValue(seed, other if other < bucket else other + 1)
