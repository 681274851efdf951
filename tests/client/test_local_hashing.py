"""Local hashing (OLH): the documented hash (pinned values, bit-identity with a numpy twin, quality),
exact privacy per fixed seed (ratio and tightness), negative control, goodness of fit, unbiasedness
of the support estimator, payload size, validation and serde."""

from __future__ import annotations

import decimal
import math
from collections.abc import Hashable
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from statistics import NormalDist
from typing import Any

import msgpack
import pytest

from ldp_client._exact import exp_below
from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import MECHANISMS, LocalHashingParams
from ldp_client.mechanisms.local_hashing import HASH_OFFSET, fmix64, hash_value, optimal_hash_range
from ldp_client.payload import HashedValue, payload_from_wire, payload_to_wire
from ldp_client.rng import Rng, SeededRng
from support.exact import EnumeratingRng, max_privacy_ratio, output_distribution
from support.stats import FALSE_FAILURE_RATE, Z_UNBIASED, assert_chi2_fits, assert_unbiased

try:
    import numpy as np
except ImportError:  # the device-only tox env has no numpy
    np = None  # type: ignore[assignment]

needs_numpy = pytest.mark.skipif(np is None, reason="numpy is not installed (device-only env)")


def _z(tests: int) -> float:
    """Bonferroni: ``tests`` simultaneous 2-sided checks with a total false-failure rate <= 1e-6."""
    return max(Z_UNBIASED, NormalDist().inv_cdf(1 - FALSE_FAILURE_RATE / (2 * tests)))


# --- the hash ------------------------------------------------------------------------------------

#: (seed, value, g, H(seed, value) mod g), computed once with the reference implementation.
PINNED = [
    (0, 0, 2, 0),
    (0, 0, 4294967295, 1784278520),
    (1, 0, 5, 2),
    (0, 1, 5, 2),
    (12345, 678, 1000, 287),
    (4294967295, 9223372036854775807, 4294967295, 1744006039),
    (3735928559, 4611686018427400249, 97, 58),
    (42, 18446744073709551615, 3, 2),
]
#: (seed, value, the full 64-bit fmix64(fmix64(value + C) ^ seed)).
PINNED_64 = [
    (0, 0, 0x6393D51C06C618DC),
    (1, 0, 0x8D82751399F55D54),
    (0, 1, 0xC6FFE416E9A5DFEE),
    (12345, 678, 0xC22A7C0E6D70EF17),
    (4294967295, 9223372036854775807, 0xAB326C48BCC0FF4E),
]


def _np_fmix64(k: Any) -> Any:
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(0xFF51AFD7ED558CCD)
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(0xC4CEB9FE1A85EC53)
    return k ^ (k >> np.uint64(33))


def np_hash(seeds: Any, values: Any, g: Any) -> Any:
    """The collector's vectorized H(seed, value) mod g over uint64 arrays (wrapping arithmetic)."""
    seeds = np.asarray(seeds, dtype=np.uint64)
    values = np.asarray(values, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _np_fmix64(_np_fmix64(values + np.uint64(HASH_OFFSET)) ^ seeds) % np.asarray(g, dtype=np.uint64)


def test_pinned_hash_values() -> None:
    assert fmix64(0) == 0  # why the offset C is added before the first mix
    assert fmix64(1) == 0xB456BCFC34C2CB2C
    for seed, value, g, expected in PINNED:
        assert hash_value(seed, value, g) == expected
    for seed, value, full in PINNED_64:
        assert fmix64(fmix64((value + HASH_OFFSET) % 2**64) ^ seed) == full
        assert hash_value(seed, value, 2**32 - 1) == full % (2**32 - 1)


@needs_numpy
def test_numpy_twin_is_bit_identical() -> None:
    gen = np.random.default_rng(2024)
    n = 20_000
    seeds = gen.integers(0, 2**32, n, dtype=np.uint64)
    values = gen.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + gen.integers(0, 2, n, dtype=np.uint64)
    gs = gen.integers(2, 2**32, n, dtype=np.uint64)
    gs[: n // 4] = gen.integers(2, 300, n // 4, dtype=np.uint64)  # small g, the common case
    got = np_hash(seeds, values, gs)
    for s, v, g, h in zip(seeds.tolist(), values.tolist(), gs.tolist(), got.tolist()):
        assert hash_value(s, v, g) == h
    pinned = np.array(PINNED, dtype=np.uint64)
    assert np_hash(pinned[:, 0], pinned[:, 1], pinned[:, 2]).tolist() == pinned[:, 3].tolist()
    p64 = np.array(PINNED_64, dtype=np.uint64)
    with np.errstate(over="ignore"):
        full = _np_fmix64(_np_fmix64(p64[:, 1] + np.uint64(HASH_OFFSET)) ^ p64[:, 0])
    assert full.tolist() == p64[:, 2].tolist()


@pytest.mark.parametrize("g", [2, 5, 56])
def test_hash_buckets_are_uniform_and_collide_at_rate_one_over_g(g: int) -> None:
    rng = SeededRng(g)
    n = 20_000
    # uniform over seeds for a fixed value, and over values for a fixed seed
    assert_chi2_fits([hash_value(rng.randbits(32), 12345, g) for _ in range(n)], {k: Fraction(1, g) for k in range(g)})
    assert_chi2_fits([hash_value(777, v, g) for v in range(n)], {k: Fraction(1, g) for k in range(g)})
    # two distinct values share a bucket with probability 1/g over the random seed
    collisions = 0
    for _ in range(n):
        a = rng.randbits(63)
        b = a + 1 + rng.randbelow(1000)
        seed = rng.randbits(32)
        collisions += hash_value(seed, a, g) == hash_value(seed, b, g)
    assert_unbiased(collisions, n / g, math.sqrt(n * (1 / g) * (1 - 1 / g)))


def test_hash_value_validates() -> None:
    with pytest.raises(InvalidParameterError, match=r"seed must be in \[0, 4294967295\], got 4294967296"):
        hash_value(2**32, 0, 5)
    with pytest.raises(InvalidParameterError, match="value must be in"):
        hash_value(0, -1, 5)
    with pytest.raises(InvalidParameterError, match="g must be in"):
        hash_value(0, 0, 0)
    with pytest.raises(TypeError, match="seed must be an int"):
        hash_value(True, 0, 5)


# --- exact privacy, conditioned on the seed ------------------------------------------------------

class _SeedFromSet:
    """Wraps the enumerating rng: the 32-bit seed draw picks one of a few seeds (an enumerable branch).

    The seed is data-independent, so checking the ratio for every fixed seed (and for the uniform
    mixture over a set of seeds) checks the mechanism's ratio.
    """

    def __init__(self, inner: EnumeratingRng, seeds: tuple[int, ...]) -> None:
        self.inner = inner
        self.seeds = seeds

    def randbits(self, k: int) -> int:
        assert k == 32
        return self.seeds[self.inner.randbelow(len(self.seeds))] if len(self.seeds) > 1 else self.seeds[0]

    def randbelow(self, n: int) -> int:
        return self.inner.randbelow(n)

    def bernoulli(self, num: int, den: int) -> bool:
        return self.inner.bernoulli(num, den)

    def uniform(self) -> float:
        return self.inner.uniform()

    def gauss(self) -> float:
        return self.inner.gauss()

    def token_bytes(self, n: int) -> bytes:
        return self.inner.token_bytes(n)


_SEEDS = (0, 1, 2, 3, 12345, 2**31, 2**32 - 1, 0xDEADBEEF)


def _dists(params: LocalHashingParams, seeds: tuple[int, ...]) -> list[dict[Hashable, Fraction]]:
    def dist(x: int) -> dict[Hashable, Fraction]:
        return output_distribution(lambda rng: params.randomize(x, rng=_SeedFromSet(rng, seeds)))

    return [dist(x) for x in range(params.domain_size)]


@pytest.mark.parametrize("domain_size,epsilon,hash_range", [
    (3, 0.1, 0), (3, 1.0, 0), (4, math.log(9), 0), (5, 3.7, 0), (4, 1.0, 2), (6, 2.0, 3), (4, 20.0, 3)])
def test_exact_privacy_ratio_is_tight_for_every_seed(domain_size: int, epsilon: float, hash_range: int) -> None:
    params = LocalHashingParams(domain_size=domain_size, epsilon=epsilon, hash_range=hash_range)
    assert isinstance(_SeedFromSet(EnumeratingRng([]), (0,)), Rng)
    per_seed = [max_privacy_ratio(_dists(params, (seed,))) for seed in _SEEDS]
    assert all(ratio <= params.ratio for ratio in per_seed)
    mixture = max_privacy_ratio(_dists(params, _SEEDS))  # the seed drawn uniformly from the set
    assert mixture == max(per_seed) == params.ratio  # tight
    assert params.ratio <= Fraction(math.exp(epsilon))
    assert params.realized_epsilon <= epsilon
    assert epsilon - params.realized_epsilon < 1e-12


def test_ln9_passes_and_ln8_999_fails() -> None:
    params = LocalHashingParams(domain_size=4, epsilon=math.log(9), hash_range=3)
    ratio = max_privacy_ratio(_dists(params, _SEEDS))
    assert math.log(ratio) <= math.log(9)
    assert math.log(ratio) > math.log(8.999)


@dataclass(frozen=True, kw_only=True)
class _OverconfidentOLH(LocalHashingParams):
    """Negative control: keeps the true bucket with the probability meant for 2 * epsilon."""

    @cached_property
    def p_exact(self) -> Fraction:
        r = self.ratio**2
        return r / (r + self.g - 1)


def test_negative_control_is_caught() -> None:
    params = _OverconfidentOLH(domain_size=4, epsilon=1.0)
    ratio = max_privacy_ratio(_dists(params, _SEEDS))
    assert ratio > params.ratio
    assert ratio > Fraction(math.exp(1.0))


# --- statistics --------------------------------------------------------------------------------

def test_reports_fit_exact_distribution() -> None:
    """(bucket - H(seed, x)) mod g is seed-independent: its exact law comes from the real code with any
    fixed seed; the sampled seeds are uniform 32-bit words."""
    params = LocalHashingParams(domain_size=100, epsilon=1.0, hash_range=5)
    x, g = 42, params.g

    def shift(report: HashedValue) -> int:
        return (report.value - hash_value(report.seed, x, g)) % g

    exact = output_distribution(lambda r: shift(params.randomize(x, rng=_SeedFromSet(r, (987654321,)))))
    assert exact == {0: params.p_exact, **{k: params.q_other_exact for k in range(1, g)}}
    rng = SeededRng(1234)
    reports = [params.randomize(x, rng=rng) for _ in range(20_000)]
    assert_chi2_fits([shift(y) for y in reports], exact, alpha=FALSE_FAILURE_RATE / 2)
    assert_chi2_fits([y.seed >> 28 for y in reports], {k: Fraction(1, 16) for k in range(16)},
                     alpha=FALSE_FAILURE_RATE / 2)


@pytest.mark.parametrize("seeded", [True, False])
def test_reference_estimator_is_unbiased(seeded: bool) -> None:
    """The support estimator (support - n/g) / (p - 1/g), counted in pure Python; one run unseeded."""
    params = LocalHashingParams(domain_size=2**40, epsilon=2.0)
    assert params.g == 8
    rng: Rng | None = SeededRng(99) if seeded else None
    truth = [0] * 3000 + [2**39 + 5] * 1000 + [9] * 1000
    reports = [params.randomize(v, rng=rng) for v in truth]
    n = len(reports)
    checks = [(0, 3000), (2**39 + 5, 1000), (9, 1000), (31, 0)]
    for value, true_count in checks:
        support = sum(params.supports(y, value) for y in reports)
        estimate = (support - n * params.q) / (params.p - params.q)
        assert_unbiased(estimate, true_count, math.sqrt(params.count_variance(n, true_count)), z=_z(len(checks)))


@needs_numpy
def test_vectorized_support_counts_match() -> None:
    params = LocalHashingParams(domain_size=1000, epsilon=1.0)
    rng = SeededRng(5)
    reports = [params.randomize(v % 1000, rng=rng) for v in range(3000)]
    seeds = np.array([y.seed for y in reports], dtype=np.uint64)
    buckets = np.array([y.value for y in reports], dtype=np.uint64)
    for value in (0, 1, 999):
        vectorized = int((np_hash(seeds, np.full(len(reports), value, dtype=np.uint64), params.g) == buckets).sum())
        assert vectorized == sum(params.supports(y, value) for y in reports)


def test_count_variance_matches_oue_to_first_order() -> None:
    params = LocalHashingParams(domain_size=1024, epsilon=4.0)
    r = math.exp(4.0)
    assert math.isclose(params.count_variance(1, 0), 4 * r / (r - 1) ** 2, rel_tol=1e-4)
    p, q = params.p, params.q
    assert math.isclose(params.count_variance(100, 10),
                        (10 * p * (1 - p) + 90 * q * (1 - q)) / (p - q) ** 2, rel_tol=1e-12)


# --- payload, parameters, serde ----------------------------------------------------------------

def test_payload_is_at_most_8_msgpack_bytes_for_small_g() -> None:
    rng = SeededRng(8)
    for g in (2, 5, 127):
        params = LocalHashingParams(domain_size=2**63, epsilon=1.0, hash_range=g)
        worst = HashedValue(2**32 - 1, g - 1)
        assert len(msgpack.packb(payload_to_wire(worst))) <= 8
        for _ in range(500):
            y = params.randomize(rng.randbits(63), rng=rng)
            assert isinstance(y, HashedValue)
            wire = msgpack.packb(payload_to_wire(y))
            assert len(wire) <= 8
            assert params.check_payload(payload_from_wire(msgpack.unpackb(wire))) == y
        assert params.payload_bits == 32 + max(1, math.ceil(math.log2(g)))


def test_hash_range_and_optimal_g() -> None:
    assert LocalHashingParams(domain_size=10, epsilon=1.0).g == 4  # round(2.718) + 1
    assert LocalHashingParams(domain_size=10, epsilon=0.1).g == 2
    assert LocalHashingParams(domain_size=10, epsilon=4.0).g == 56  # round(54.6) + 1
    assert LocalHashingParams(domain_size=10, epsilon=20.0).g == round(math.exp(20)) + 1
    assert LocalHashingParams(domain_size=10, epsilon=1.0, hash_range=7).g == 7
    assert optimal_hash_range(3.0) == 21
    params = LocalHashingParams(domain_size=10, epsilon=1.0)
    assert params.p_exact == params.ratio / (params.ratio + 3)
    assert params.q_other_exact == 1 / (params.ratio + 3) and params.q_exact == Fraction(1, 4)


def test_optimal_g_is_computed_from_the_exact_ratio() -> None:
    # docs/protocol.md §7.4: g = floor(r + 1/2) + 1 with r the exact stand-in for e^epsilon, so that
    # every implementation derives the same g. At epsilon = ln(20.5) (the double), e^epsilon is just
    # above 20.5 while r is below it: a float exp (20.5 here, 20.500000000000004 on other
    # platforms) would give 22.
    eps = math.log(20.5)
    with decimal.localcontext() as ctx:
        ctx.prec = 40
        assert decimal.Decimal(eps).exp() > decimal.Decimal("20.5") > exp_below(eps)
    assert optimal_hash_range(eps) == 21
    for eps in (0.01, 0.5, 1.0, 2.5, 7.0, 13.0, 20.0):
        assert optimal_hash_range(eps) == max(2, math.floor(exp_below(eps) + Fraction(1, 2)) + 1)


def test_check_payload() -> None:
    params = LocalHashingParams(domain_size=10, epsilon=1.0, hash_range=5)
    assert params.check_payload(HashedValue(2**32 - 1, 4)) == HashedValue(2**32 - 1, 4)
    for bad in (HashedValue(0, 5), HashedValue(2**32, 0), HashedValue(-1, 0), HashedValue(0, True),
                (0, 1), 3, b"\x00"):
        with pytest.raises(ProtocolError):
            params.check_payload(bad)


def test_bad_parameters_and_values() -> None:
    with pytest.raises(InvalidParameterError, match="epsilon must be in"):
        LocalHashingParams(domain_size=4, epsilon=-1.0)
    with pytest.raises(InvalidParameterError, match="epsilon must be finite"):
        LocalHashingParams(domain_size=4, epsilon=float("nan"))
    with pytest.raises(InvalidParameterError, match=r"domain_size must be in \[2, 9223372036854775808\], got 1"):
        LocalHashingParams(domain_size=1, epsilon=1.0)
    with pytest.raises(InvalidParameterError, match="domain_size must be in"):
        LocalHashingParams(domain_size=2**63 + 1, epsilon=1.0)
    with pytest.raises(InvalidParameterError, match=r"hash_range must be 0 \(optimal\) or in \[2, 4294967295\], got 1"):
        LocalHashingParams(domain_size=4, epsilon=1.0, hash_range=1)
    with pytest.raises(InvalidParameterError, match="hash_range must be in"):
        LocalHashingParams(domain_size=4, epsilon=1.0, hash_range=2**32)
    with pytest.raises(TypeError, match="hash_range must be an int"):
        LocalHashingParams(domain_size=4, epsilon=1.0, hash_range=2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="domain_size must be an int"):
        LocalHashingParams(domain_size="4", epsilon=1.0)  # type: ignore[arg-type]
    params = LocalHashingParams(domain_size=4, epsilon=1.0)
    with pytest.raises(InvalidParameterError, match=r"local_hashing value must be in \[0, 4\), got 4"):
        params.randomize(4)
    for bad in ("1", 1.5, False, None):
        with pytest.raises(TypeError, match="local_hashing value must be an int"):
            params.randomize(bad)


def test_from_dict_round_trip() -> None:
    for params in (LocalHashingParams(domain_size=2**63, epsilon=0.5),
                   LocalHashingParams(domain_size=7, epsilon=3.0, hash_range=9)):
        data = params.to_dict()
        assert data == {"domain_size": params.domain_size, "epsilon": params.epsilon, "hash_range": params.hash_range}
        assert LocalHashingParams.from_dict(data) == params
        assert MECHANISMS.load(MECHANISMS.dump(params)) == params
    assert LocalHashingParams.from_dict({"domain_size": 5, "epsilon": 1.0}).hash_range == 0
    with pytest.raises(ProtocolError):
        LocalHashingParams.from_dict({"domain_size": 5, "epsilon": 1.0, "hash_range": 1})
    with pytest.raises(ProtocolError):
        LocalHashingParams.from_dict({"domain_size": 5, "epsilon": 1.0, "g": 4})


def test_matches_the_proto_message() -> None:
    mechanisms_pb2 = pytest.importorskip("ldp.v1.mechanisms_pb2")
    fields = [f.name for f in mechanisms_pb2.LocalHashing.DESCRIPTOR.fields]
    assert fields == ["domain_size", "epsilon", "hash_range", "seed_pool_size", "seed_pool_key"]
    assert LocalHashingParams.KIND in mechanisms_pb2.MechanismSpec.DESCRIPTOR.fields_by_name
    reports_pb2 = pytest.importorskip("ldp.v1.reports_pb2")
    assert LocalHashingParams.PAYLOAD_FIELD in reports_pb2.Payload.DESCRIPTOR.fields_by_name
