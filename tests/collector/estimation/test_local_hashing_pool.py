"""Local hashing with a public seed pool on the collector (docs/protocol.md §14): the per-seed
counts give exactly the per-report support counts, merge and serialize like the other
accumulators, refuse seeds outside the pool, and the ingestion check refuses them too."""

from __future__ import annotations

import numpy as np
import pytest

from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import LocalHashingParams
from ldp_client.payload import HashedValue
from ldp_client.rng import SeededRng
from ldp_collector.estimation import LocalHashingAggregator
from ldp_collector.estimation.accumulators import KIND_DENSE, CountAccumulator
from ldp_collector.estimation.frequency import MAX_POOL_CELLS, make_aggregator
from ldp_collector.estimation.olh_hash import pool_support_counts, support_counts
from ldp_collector.simulation.reports import add_simulated_reports, draw_local_hashing


def _pooled(size: int = 40, key: int = 7, domain: int = 300, epsilon: float = 1.0,
            hash_range: int = 0) -> LocalHashingParams:
    return LocalHashingParams(domain_size=domain, epsilon=epsilon, hash_range=hash_range,
                              seed_pool_size=size, seed_pool_key=key)


@pytest.mark.parametrize("g", [2, 3, 8, 1000, 65537])
def test_pool_support_counts_equal_the_per_report_counts(g: int) -> None:
    rng = np.random.default_rng(g % 1000)
    pool = np.unique(rng.integers(0, 2**32, size=50, dtype=np.uint64))
    seeds = pool[rng.integers(0, pool.size, size=5000)]
    buckets = rng.integers(0, min(g, 5), size=5000).astype(np.uint64)
    # Candidates across more than one block (64 Ki pairs) and beyond 2^63.
    candidates = np.concatenate([np.arange(1500, dtype=np.uint64), np.array([2**63, 2**64 - 1], dtype=np.uint64)])
    table = np.zeros((pool.size, g), dtype=np.int64)
    np.add.at(table, (np.searchsorted(pool, seeds), buckets.astype(np.int64)), 1)
    want = support_counts(seeds, buckets, candidates, g, workers=1)
    assert np.array_equal(pool_support_counts(pool, table, candidates, g), want)


def test_pool_support_counts_validate() -> None:
    pool = np.array([1, 2], dtype=np.uint64)
    with pytest.raises(ValueError, match="shape"):
        pool_support_counts(pool, np.zeros((2, 3), dtype=np.int64), np.arange(4), 4)
    with pytest.raises(ValueError, match="pool_seeds"):
        pool_support_counts(np.array([2**32]), np.zeros((1, 4), dtype=np.int64), np.arange(4), 4)
    with pytest.raises(TypeError, match="counts"):
        pool_support_counts(pool, np.zeros((2, 4)), np.arange(4), 4)
    assert pool_support_counts(pool, np.zeros((2, 4), dtype=np.int64), np.zeros(0, dtype=np.int64), 4).size == 0


@pytest.mark.parametrize("size,hash_range", [(1, 0), (40, 0), (40, 3), (500, 17)])
def test_pooled_aggregator_equals_the_raw_reports(size: int, hash_range: int) -> None:
    params = _pooled(size=size, hash_range=hash_range)
    raw_params = LocalHashingParams(domain_size=300, epsilon=1.0, hash_range=hash_range)
    sdk = SeededRng(size)
    values = [(i * 7919) % 300 for i in range(2000)]
    reports = [params.randomize(v, rng=sdk) for v in values]
    assert {r.seed for r in reports} <= set(params.pool_seeds)
    pooled = LocalHashingAggregator(params)
    pooled.add(reports[:700])
    other = pooled.zero()
    other.add(reports[700:])
    pooled.merge(other)
    assert pooled.pooled and pooled.n == 2000
    raw = LocalHashingAggregator(raw_params)
    raw.add(reports)
    candidates = np.arange(300)
    assert np.array_equal(pooled.support(candidates), raw.support(candidates))
    estimate, raw_estimate = pooled.estimate(), raw.estimate()
    assert np.array_equal(estimate.counts, raw_estimate.counts)
    # The pool's extra term only widens the standard errors.
    assert np.all(estimate.std_errors >= raw_estimate.std_errors)
    assert pooled.counts().shape == (np.unique(params.pool_seeds).size, params.g)
    assert int(pooled.counts().sum()) == 2000


def test_pooled_aggregator_refuses_seeds_outside_the_pool() -> None:
    params = _pooled()
    agg = LocalHashingAggregator(params)
    outsider = next(s for s in range(100) if s not in set(params.pool_seeds))
    good = params.pool_seeds[0]
    with pytest.raises(ProtocolError, match="not in the round's seed pool"):
        agg.add([HashedValue(good, 0), HashedValue(outsider, 1)])
    assert agg.n == 0 and int(agg.counts().sum()) == 0  # nothing added
    for seed in (max(params.pool_seeds) + 1, 0):
        if seed not in set(params.pool_seeds):
            with pytest.raises(ProtocolError):
                agg.add_arrays(np.array([seed]), np.array([0]))
    # The SDK's payload check (what ingestion calls per report) refuses it too.
    with pytest.raises(ProtocolError, match="not in the round's seed pool"):
        params.check_payload(HashedValue(outsider, 0))
    assert params.check_payload(HashedValue(good, 0)) == HashedValue(good, 0)


def test_pooled_aggregator_state_and_limits() -> None:
    params = _pooled(size=5)
    agg = LocalHashingAggregator(params)
    with pytest.raises(InvalidParameterError, match="keeps counts"):
        agg.reports()
    with pytest.raises(InvalidParameterError, match="no seed pool"):
        LocalHashingAggregator(LocalHashingParams(domain_size=9, epsilon=1.0)).counts()
    with pytest.raises(InvalidParameterError):
        LocalHashingAggregator.from_counts(params, np.zeros(3, dtype=np.int64), 0)
    with pytest.raises(InvalidParameterError, match="sum to n"):
        LocalHashingAggregator.from_counts(params, np.ones((5, params.g), dtype=np.int64), 3)
    with pytest.raises(InvalidParameterError, match=">= 0"):
        LocalHashingAggregator.from_counts(params, -np.ones((5, params.g), dtype=np.int64), -5 * params.g)
    too_big = LocalHashingParams(domain_size=9, epsilon=1.0, hash_range=2**10,
                                 seed_pool_size=MAX_POOL_CELLS // 2**10 + 1, seed_pool_key=1)
    with pytest.raises(InvalidParameterError, match="seed_pool_size x g"):
        LocalHashingAggregator(too_big)
    assert make_aggregator(params).pooled


def test_count_accumulator_keeps_the_pooled_counts() -> None:
    """Incremental blobs, a rebuild and merged halves all equal the aggregator over all reports."""
    params = _pooled(size=30, epsilon=2.0)
    rng = np.random.default_rng(3)
    values = rng.integers(0, 300, size=4000)
    seeds, buckets = draw_local_hashing(params, values, rng)
    payloads = [HashedValue(int(s), int(y)) for s, y in zip(seeds, buckets)]
    acc = CountAccumulator(params)
    assert acc.has_counts
    blob = acc.to_bytes()
    for start in range(0, 4000, 1000):
        acc = CountAccumulator.from_bytes(params, blob)
        acc.add(payloads[start:start + 1000])
        blob = acc.to_bytes()
    words = np.frombuffer(blob, dtype="<i8")
    assert int(words[1]) == KIND_DENSE and int(words[2]) == 4000
    half, rest = CountAccumulator(params), CountAccumulator(params)
    half.add(payloads[:1234])
    rest.add(payloads[1234:])
    half.merge(rest)
    assert half.to_bytes() == blob
    final = CountAccumulator.from_bytes(params, blob).finalize()
    assert isinstance(final, LocalHashingAggregator)
    direct = LocalHashingAggregator(params)
    direct.add_arrays(seeds, buckets)
    assert np.array_equal(final.support(np.arange(300)), direct.support(np.arange(300)))
    with pytest.raises(ProtocolError):
        CountAccumulator.from_bytes(params, blob[:-8])
    with pytest.raises(ProtocolError):
        CountAccumulator.from_bytes(params, CountAccumulator(LocalHashingParams(domain_size=300, epsilon=2.0)).to_bytes())


def test_simulated_pooled_reports_use_the_pool() -> None:
    params = _pooled(size=11)
    agg = LocalHashingAggregator(params)
    add_simulated_reports(agg, np.arange(300), np.random.default_rng(0))
    assert agg.n == 300
    seeds, _ = draw_local_hashing(params, np.arange(300), np.random.default_rng(1))
    assert set(seeds.tolist()) <= set(params.pool_seeds)


def test_value_pairs_of_one_value() -> None:
    """Everybody holds one value: the pair estimate is close to n (n - 1) (a loose sanity check;
    the statistical test checks unbiasedness)."""
    params = _pooled(size=16, epsilon=4.0)
    agg = LocalHashingAggregator(params)
    add_simulated_reports(agg, np.full(20_000, 5), np.random.default_rng(2))
    pairs = agg.value_pairs()
    assert 0.8 * 20_000**2 < pairs < 1.2 * 20_000**2
    assert LocalHashingAggregator(params).value_pairs() == 0.0
