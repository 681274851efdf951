"""Local hashing with a public seed pool (docs/protocol.md §14): the derived seeds, the order of
draws, the assigned seed's pool index, validation of hostile pool parameters, exact privacy for
any pool, the plain-data form, and the rule for the pool size."""

from __future__ import annotations

import math
from fractions import Fraction

import msgpack
import pytest

from ldp_client.encoders import CategoricalEncoder
from ldp_client.encoders.projection import mix64
from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import MECHANISMS, LocalHashingParams
from ldp_client.mechanisms.local_hashing import (
    MAX_SEED_POOL,
    PURPOSE_SEED_POOL,
    hash_value,
    pool_seed,
    seed_pool_size_for,
)
from ldp_client.memo import component_digest
from ldp_client.payload import HashedValue
from ldp_client.rng import KeyedRng
from ldp_client.spec import Component
from support.exact import max_privacy_ratio, output_distribution

_GOLDEN = 0x9E3779B97F4A7C15
_MASK = 2**64 - 1


def _reference_seed(key: int, j: int) -> int:
    """§14 written out from its primitives, independently of ``pool_seed``."""
    state = mix64(key ^ int.from_bytes(b"ldp.pool", "big"))
    return mix64((state + (j + 1) * _GOLDEN) & _MASK) >> 32


def test_pool_seeds_follow_the_spec() -> None:
    assert PURPOSE_SEED_POOL == 0x6C64702E706F6F6C
    for key in (0, 1, 12345, 2**63, _MASK):
        for j in (0, 1, 2, 1000, MAX_SEED_POOL - 1):
            seed = pool_seed(key, j)
            assert seed == _reference_seed(key, j)
            assert 0 <= seed < 2**32
    params = LocalHashingParams(domain_size=10, epsilon=1.0, seed_pool_size=5, seed_pool_key=77)
    assert params.pool_seeds == tuple(_reference_seed(77, j) for j in range(5))
    assert LocalHashingParams(domain_size=10, epsilon=1.0).pool_seeds == ()
    # A different key gives an unrelated pool.
    assert not set(params.pool_seeds) & set(LocalHashingParams(
        domain_size=10, epsilon=1.0, seed_pool_size=5, seed_pool_key=78).pool_seeds)


def test_pool_seed_validates() -> None:
    for key, j in ((-1, 0), (2**64, 0), (0, -1), (0, MAX_SEED_POOL)):
        with pytest.raises(InvalidParameterError):
            pool_seed(key, j)
    with pytest.raises(TypeError):
        pool_seed(True, 0)


def test_draw_order_with_a_pool() -> None:
    """The index replaces the 32-bit seed draw; the coin and the other bucket follow unchanged."""
    params = LocalHashingParams(domain_size=1000, epsilon=1.5, seed_pool_size=37, seed_pool_key=2**40 + 3)
    g = params.g
    for k in range(200):
        key = k.to_bytes(32, "big")
        got = params.randomize(k % 1000, rng=KeyedRng(key))
        rng = KeyedRng(key)
        seed = params.pool_seeds[rng.randbelow(37)]
        bucket = hash_value(seed, k % 1000, g)
        if rng.bernoulli(params.p_exact.numerator, params.p_exact.denominator):
            want = HashedValue(seed, bucket)
        else:
            other = rng.randbelow(g - 1)
            want = HashedValue(seed, other if other < bucket else other + 1)
        assert got == want
        assert got.seed in params.pool_seeds


def test_every_pool_index_is_used_uniformly() -> None:
    params = LocalHashingParams(domain_size=5, epsilon=1.0, seed_pool_size=3, seed_pool_key=9)
    dist = output_distribution(lambda rng: params.randomize(2, rng=rng).seed)
    assert dist == {seed: Fraction(1, 3) for seed in params.pool_seeds}


def test_assigned_seed_picks_its_pool_index() -> None:
    params = LocalHashingParams(domain_size=50, epsilon=1.0, seed_pool_size=7, seed_pool_key=5)
    for assigned in (0, 6, 7, 13, 2**32 - 1):
        report = params.randomize(3, rng=KeyedRng(bytes(32)), seed=assigned)
        assert report.seed == params.pool_seeds[assigned % 7]
    with pytest.raises(InvalidParameterError):
        params.randomize(3, rng=KeyedRng(bytes(32)), seed=2**32)


@pytest.mark.parametrize("fields,error", [
    ({"seed_pool_size": -1}, InvalidParameterError),
    ({"seed_pool_size": MAX_SEED_POOL + 1}, InvalidParameterError),
    ({"seed_pool_size": 2**32}, InvalidParameterError),
    ({"seed_pool_size": True}, TypeError),
    ({"seed_pool_size": 4.0}, TypeError),
    ({"seed_pool_size": 4, "seed_pool_key": -1}, InvalidParameterError),
    ({"seed_pool_size": 4, "seed_pool_key": 2**64}, InvalidParameterError),
    ({"seed_pool_size": 4, "seed_pool_key": "1"}, TypeError),
    ({"seed_pool_key": 5}, InvalidParameterError),  # a key without a pool
])
def test_hostile_pool_parameters_are_refused(fields: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        LocalHashingParams(domain_size=10, epsilon=1.0, **fields)  # type: ignore[arg-type]
    # The same values arriving as a round spec's plain data are protocol errors.
    with pytest.raises(ProtocolError):
        LocalHashingParams.from_dict({"domain_size": 10, "epsilon": 1.0, **fields})


def test_pool_limits_are_accepted() -> None:
    for size, key in ((1, 0), (1, _MASK), (MAX_SEED_POOL, 2**63)):
        params = LocalHashingParams(domain_size=10, epsilon=1.0, seed_pool_size=size, seed_pool_key=key)
        index = KeyedRng(bytes(32)).randbelow(size)  # the first draw of the same stream
        assert params.randomize(4, rng=KeyedRng(bytes(32))).seed == pool_seed(key, index)


def _colliding_key(domain_size: int, g: int) -> int:
    """A hostile key whose one-seed pool makes values 0 and 1 collide (their reports identical)."""
    for key in range(10_000):
        if hash_value(pool_seed(key, 0), 0, g) == hash_value(pool_seed(key, 0), 1, g):
            return key
    raise AssertionError("no colliding key found")


@pytest.mark.parametrize("domain_size,epsilon,hash_range,size", [
    (3, 1.0, 0, 1), (4, math.log(9), 0, 2), (5, 3.7, 0, 3), (4, 1.0, 2, 4), (6, 2.0, 3, 5)])
def test_exact_privacy_holds_for_any_pool(domain_size: int, epsilon: float, hash_range: int, size: int) -> None:
    """Whatever pool a collector sends, every likelihood ratio stays <= r (and r is reached)."""
    g = LocalHashingParams(domain_size=domain_size, epsilon=epsilon, hash_range=hash_range).g
    for key in (0, 1, 2**64 - 1, _colliding_key(domain_size, g)):
        params = LocalHashingParams(domain_size=domain_size, epsilon=epsilon, hash_range=hash_range,
                                    seed_pool_size=size, seed_pool_key=key)
        dists = [output_distribution(lambda rng, x=x, p=params: p.randomize(x, rng=rng))
                 for x in range(domain_size)]
        ratio = max_privacy_ratio(dists)
        assert ratio <= params.ratio
        if any(len({hash_value(s, x, g) for x in range(domain_size)}) > 1 for s in params.pool_seeds):
            assert ratio == params.ratio  # tight as soon as one pool seed separates two values


def test_plain_data_form_is_unchanged_without_a_pool() -> None:
    """Old round specs, old devices and the memoized coins' digest see the same bytes as before §14."""
    params = LocalHashingParams(domain_size=7, epsilon=3.0, hash_range=9)
    assert params.to_dict() == {"domain_size": 7, "epsilon": 3.0, "hash_range": 9}
    pooled = LocalHashingParams(domain_size=7, epsilon=3.0, hash_range=9, seed_pool_size=4, seed_pool_key=11)
    assert pooled.to_dict() == {"domain_size": 7, "epsilon": 3.0, "hash_range": 9,
                                "seed_pool_size": 4, "seed_pool_key": 11}
    assert MECHANISMS.load(MECHANISMS.dump(pooled)) == pooled
    assert LocalHashingParams.from_dict(msgpack.unpackb(msgpack.packb(pooled.to_dict()))) == pooled
    # An explicit zero in the plain data reads back as the same (pool-less) parameters.
    assert LocalHashingParams.from_dict({**params.to_dict(), "seed_pool_size": 0, "seed_pool_key": 0}) == params
    plain = Component(encoder=CategoricalEncoder(domain_size=7), mechanism=params)
    assert plain.to_dict()["mechanism"] == {"local_hashing": {"domain_size": 7, "epsilon": 3.0, "hash_range": 9}}
    assert component_digest(plain) != component_digest(
        Component(encoder=CategoricalEncoder(domain_size=7), mechanism=pooled))


def test_extra_variance_and_the_rule_for_s() -> None:
    params = LocalHashingParams(domain_size=4096, epsilon=2.0, seed_pool_size=1000, seed_pool_key=1)
    assert params.seed_pool_extra_variance(7_000.0) == pytest.approx(7_000.0 / ((params.g - 1) * 1000))
    assert LocalHashingParams(domain_size=4096, epsilon=2.0).seed_pool_extra_variance(1e9) == 0.0
    per_report = params.count_variance(1.0)
    for reports in (0.0, 1.0, 1e4, 1e6, 1e9):
        for concentration in (0.0, 1 / 4096, 0.02, 1.0):
            for share in (0.01, 0.1, 1.0):
                s = seed_pool_size_for(params, reports, concentration, share)
                assert 1 <= s <= MAX_SEED_POOL
                bound = reports * concentration / ((params.g - 1) * per_report)  # extra / per-report x S
                # The bound on the extra term, over the per-report variance, is <= share ...
                assert bound / s <= share * (1 + 1e-12) or s == MAX_SEED_POOL
                # ... and S is the smallest such pool.
                if s > 1:
                    assert bound / (s - 1) > share
    # The bound holds for a real population: extra(v) / per-report(v) <= share for every v.
    counts = [5000, 3000, 1000, 500, 500]
    n = sum(counts)
    kappa = sum(c * c for c in counts) / n**2
    s = seed_pool_size_for(params, n, kappa)
    pooled = LocalHashingParams(domain_size=4096, epsilon=2.0, seed_pool_size=s, seed_pool_key=1)
    for v, c in enumerate(counts):
        pairs = sum(x * (x - 1) for i, x in enumerate(counts) if i != v)
        assert pooled.seed_pool_extra_variance(pairs) <= 0.1 * pooled.count_variance(n, c)
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(InvalidParameterError):
            seed_pool_size_for(params, bad, 0.5)
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(InvalidParameterError):
            seed_pool_size_for(params, 10.0, bad)
    for bad_share in (0.0, 1.5):
        with pytest.raises(InvalidParameterError):
            seed_pool_size_for(params, 10.0, 0.5, bad_share)
