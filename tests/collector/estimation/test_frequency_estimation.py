"""Frequency estimation: hash bit-identity, unbiasedness, intervals, consistency, accumulators, bad input.

Tolerances: an estimate is checked against the truth with |estimate - truth| <= z SE where z is
Bonferroni-corrected for the number of values checked at once, so that every test fails falsely
with probability below 1e-6 (normal approximation; n >= 5000 reports).
"""

from __future__ import annotations

import random
import time
from statistics import NormalDist

import msgpack
import numpy as np
import pytest
from numpy.typing import NDArray

from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import GRRParams, LocalHashingParams, oue, sue
from ldp_client.mechanisms.local_hashing import fmix64 as sdk_fmix64
from ldp_client.mechanisms.local_hashing import hash_value as sdk_hash_value
from ldp_client.payload import HashedValue, Payload, payload_to_wire
from ldp_client.rng import SeededRng
from ldp_collector.estimation import (
    CountAccumulator,
    FrequencyAggregator,
    FrequencyEstimate,
    GRRAggregator,
    LocalHashingAggregator,
    UnaryEncodingAggregator,
    aggregate_reports,
    estimate_from_support,
    make_accumulate_fn,
    make_aggregator,
    make_consistent,
    rebuild,
)
from ldp_collector.estimation.accumulators import KIND_REPORT_COUNT
from ldp_collector.estimation.frequency import FrequencyOracleParams
from ldp_collector.estimation.olh_hash import fmix64, hash_values, support_counts
from ldp_collector.simulation.reports import add_simulated_reports
from ldp_collector.storage.base import StoredReport

FALSE_FAILURE_RATE = 1e-6


def bonferroni(m: int, alpha: float = FALSE_FAILURE_RATE) -> float:
    """Two-sided z with P(any of m standard normals exceeds it) <= alpha."""
    return NormalDist().inv_cdf(1 - alpha / (2 * m))


def assert_unbiased(est: FrequencyEstimate, truth: NDArray[np.int64], alpha: float = FALSE_FAILURE_RATE) -> None:
    z = bonferroni(len(est), alpha)
    dev = np.abs(est.counts - truth[est.values]) / est.std_errors
    worst = int(np.argmax(dev))
    assert dev[worst] <= z, (
        f"value {int(est.values[worst])}: estimate {est.counts[worst]:.1f} vs truth {int(truth[est.values[worst]])} "
        f"is {dev[worst]:.2f} SE away (limit {z:.2f})")


def oracles(domain: int, epsilon: float) -> list[FrequencyOracleParams]:
    return [GRRParams(domain_size=domain, epsilon=epsilon), oue(domain, epsilon), sue(domain, epsilon),
            LocalHashingParams(domain_size=domain, epsilon=epsilon)]


def population(domain: int, n: int, rng: np.random.Generator) -> NDArray[np.int64]:
    """A skewed population (Zipf-like) that still holds every value."""
    weights = 1.0 / np.arange(1, domain + 1)
    values = rng.choice(domain, size=n - domain, p=weights / weights.sum())
    return rng.permutation(np.concatenate([np.arange(domain), values]))


# -- the local-hashing hash ----------------------------------------------------------------------


def test_hash_is_bit_identical_to_the_sdk() -> None:
    r = random.Random(20240611)
    seeds = [0, 1, 2**32 - 1] + [r.getrandbits(32) for _ in range(3000)]
    values = [0, 1, 2**63, 2**64 - 1, 2**64 - 0x9E3779B97F4A7C15] + [r.getrandbits(64) for _ in range(1500)] \
        + [r.randrange(1024) for _ in range(1500)]
    for g in (1, 2, 3, 55, 1024, 2**31 + 11, 2**32 - 1):
        s = np.array(seeds[: len(values)], dtype=np.uint64)
        v = np.array(values[: len(s)], dtype=np.uint64)
        ours = hash_values(s, v, g)
        assert ours.dtype == np.uint64
        assert ours.tolist() == [sdk_hash_value(int(a), int(b), g) for a, b in zip(s, v)]
    words = [0, 1, 2**64 - 1] + [r.getrandbits(64) for _ in range(1000)]
    assert fmix64(np.array(words, dtype=np.uint64)).tolist() == [sdk_fmix64(w) for w in words]


def test_hash_broadcasts_and_accepts_scalars() -> None:
    assert int(hash_values(7, 11, 55)) == sdk_hash_value(7, 11, 55)
    table = hash_values(np.arange(5)[:, None], np.arange(3)[None, :], 9)
    assert table.shape == (5, 3)
    assert table.tolist() == [[sdk_hash_value(s, v, 9) for v in range(3)] for s in range(5)]


def test_support_counts_match_the_sdk_per_report() -> None:
    params = LocalHashingParams(domain_size=300, epsilon=1.5)
    rng = SeededRng(5)
    reports = [params.randomize(v % 300, rng=rng) for v in range(2000)]
    seeds = np.array([p.seed for p in reports])
    buckets = np.array([p.value for p in reports])
    candidates = np.arange(300)
    expected = [sum(params.supports(p, v) for p in reports) for v in range(0, 300, 7)]
    for workers in (1, 2, 3):
        got = support_counts(seeds, buckets, candidates, params.g, workers=workers)
        assert got[::7].tolist() == expected


def test_hash_rejects_bad_input() -> None:
    with pytest.raises(TypeError, match="integers"):
        hash_values(np.array([1.5]), 1, 5)
    with pytest.raises(ValueError, match=">= 0"):
        hash_values(np.array([-1]), 1, 5)
    with pytest.raises(ValueError, match="g must be in"):
        hash_values(1, 1, 0)
    with pytest.raises(ValueError, match="seeds must be in"):
        support_counts(np.array([2**32]), np.array([0]), np.arange(3), 5)
    with pytest.raises(ValueError, match="buckets must be in"):
        support_counts(np.array([1]), np.array([5]), np.arange(3), 5)
    with pytest.raises(ValueError, match="same length"):
        support_counts(np.array([1, 2]), np.array([0]), np.arange(3), 5)


def test_local_hashing_estimation_is_fast() -> None:
    """1e5 reports x 1024 candidates: budget 2 s of wall time on two idle cores.

    Measured as CPU time of this process (robust to other load on the machine), with a generous
    limit of 4 CPU-seconds (two cores' worth of the 2 s budget).
    """
    params = LocalHashingParams(domain_size=1024, epsilon=2.0)
    agg = LocalHashingAggregator(params)
    add_simulated_reports(agg, np.random.default_rng(0).integers(0, 1024, 100_000), np.random.default_rng(1))
    start = time.process_time()
    agg.estimate()
    assert time.process_time() - start < 4.0


# -- unbiasedness and intervals ------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
@pytest.mark.parametrize("domain", [2, 16, 100])
def test_simulated_reports_give_unbiased_estimates(domain: int, epsilon: float) -> None:
    rng = np.random.default_rng(1000 * domain + int(10 * epsilon))
    values = population(domain, 20_000, rng)
    truth = np.bincount(values, minlength=domain)
    for params in oracles(domain, epsilon):
        agg = make_aggregator(params)
        add_simulated_reports(agg, values, rng)
        est = agg.estimate()
        assert est.n == 20_000 and len(est) == domain
        assert_unbiased(est, truth, FALSE_FAILURE_RATE / 4)


@pytest.mark.parametrize("params", oracles(12, 1.0), ids=lambda p: f"{p.KIND}-{getattr(p, 'variant', '')}")
def test_reports_from_the_real_sdk_give_unbiased_estimates(params: FrequencyOracleParams) -> None:
    rng = SeededRng(77)
    values = population(12, 5000, np.random.default_rng(3))
    payloads = [params.randomize(int(v), rng=rng) for v in values]
    agg = make_aggregator(params)
    agg.add(payloads)
    assert_unbiased(agg.estimate(), np.bincount(values, minlength=12))


def test_negative_control_wrong_epsilon_is_caught() -> None:
    """Reports made with epsilon 2 but estimated as epsilon 1 must fail the unbiasedness check."""
    rng = np.random.default_rng(9)
    values = population(16, 20_000, rng)
    truth = np.bincount(values, minlength=16)
    made = GRRAggregator(GRRParams(domain_size=16, epsilon=2.0))
    add_simulated_reports(made, values, rng)
    indices = np.repeat(np.arange(16), made.support(np.arange(16)))
    wrong = GRRAggregator(GRRParams(domain_size=16, epsilon=1.0))
    wrong.add_indices(indices)
    with pytest.raises(AssertionError, match="standard errors|SE away"):
        assert_unbiased(wrong.estimate(), truth)


def test_estimate_fields_and_intervals() -> None:
    params = oue(8, 1.0)
    est = estimate_from_support(params, np.arange(8), np.array([500, 300, 250, 250, 240, 260, 270, 230]), 1000,
                                confidence=0.9)
    z = NormalDist().inv_cdf(0.95)
    assert est.z == pytest.approx(z)
    np.testing.assert_allclose(est.counts, (np.array([500, 300, 250, 250, 240, 260, 270, 230]) - 1000 * params.q)
                               / (params.p - params.q))
    plug = np.clip(est.counts, 0, 1000)
    expected_se = np.sqrt([params.count_variance(1000.0, float(c)) for c in plug])
    np.testing.assert_allclose(est.std_errors, expected_se, rtol=1e-12)
    np.testing.assert_allclose(est.ci_lower, est.counts - z * est.std_errors)
    np.testing.assert_allclose(est.ci_upper, est.counts + z * est.std_errors)
    assert est.zero_std_error == pytest.approx(np.sqrt(params.count_variance(1000.0, 0.0)))
    assert est.warnings == []


def test_low_n_warnings() -> None:
    params = GRRParams(domain_size=64, epsilon=0.5)
    agg = GRRAggregator(params)
    assert agg.estimate().warnings == ["no reports: every estimate is 0 and carries no information"]
    agg.add([1, 2, 3] * 20)
    warnings = agg.estimate().warnings
    assert any("only 60 reports" in w for w in warnings)
    assert any("noise dominates" in w for w in warnings)
    big = GRRAggregator(GRRParams(domain_size=4, epsilon=4.0))
    big.add_indices(np.arange(100_000) % 4)
    assert big.estimate().warnings == []


def test_candidate_restricted_estimates_equal_the_full_ones() -> None:
    rng = np.random.default_rng(4)
    values = population(64, 20_000, rng)
    for params in oracles(64, 1.0):
        agg = make_aggregator(params)
        add_simulated_reports(agg, values, rng)
        full = agg.estimate()
        part = agg.estimate(candidates=np.array([63, 0, 17]))
        np.testing.assert_array_equal(part.values, [63, 0, 17])
        np.testing.assert_allclose(part.counts, full.counts[[63, 0, 17]])
        np.testing.assert_allclose(part.std_errors, full.std_errors[[63, 0, 17]])


def test_huge_grr_domain_is_kept_sparse() -> None:
    params = GRRParams(domain_size=2**40, epsilon=8.0)
    agg = GRRAggregator(params)
    agg.add([2**40 - 1, 5, 5, 7])
    agg.add_indices(np.array([5, 2**39]))
    other = GRRAggregator(params)
    other.add([7, 2**39])
    agg.merge(other)
    assert agg.n == 8
    values, counts = agg.counts()
    assert values.tolist() == [5, 7, 2**39, 2**40 - 1] and counts.tolist() == [3, 2, 2, 1]
    est = agg.estimate(candidates=[5, 6, 2**40 - 1])
    np.testing.assert_allclose(est.counts, (np.array([3, 0, 1]) - 8 * params.q) / (params.p - params.q))
    with pytest.raises(InvalidParameterError, match="too large to enumerate"):
        agg.estimate()


def test_merge_equals_adding_everything() -> None:
    rng = np.random.default_rng(8)
    values = population(40, 6000, rng)
    for params in oracles(40, 1.0):
        whole = make_aggregator(params)
        add_simulated_reports(whole, values, np.random.default_rng(1))
        # same reports, split in two halves: replay the simulation into one, then split by re-adding
        a, b = whole.zero(), whole.zero()
        assert a.n == 0 and a.params == params
        _replay(whole, a, b)
        a.merge(b)
        assert a.n == whole.n
        np.testing.assert_array_equal(a.support(np.arange(40)), whole.support(np.arange(40)))


def _replay(source: FrequencyAggregator, first: FrequencyAggregator, second: FrequencyAggregator) -> None:
    """Split ``source``'s reports between ``first`` and ``second`` through the fast paths."""
    if isinstance(source, LocalHashingAggregator):
        assert isinstance(first, LocalHashingAggregator) and isinstance(second, LocalHashingAggregator)
        seeds, buckets = source.reports()
        cut = seeds.size // 2
        first.add_arrays(seeds[:cut], buckets[:cut])
        second.add_arrays(seeds[cut:], buckets[cut:])
    elif isinstance(source, GRRAggregator):
        assert isinstance(first, GRRAggregator) and isinstance(second, GRRAggregator)
        values, counts = source.counts()
        indices = np.repeat(values, counts)
        first.add_indices(indices[::2])
        second.add_indices(indices[1::2])
    else:
        assert isinstance(source, UnaryEncodingAggregator) and isinstance(first, UnaryEncodingAggregator)
        assert isinstance(second, UnaryEncodingAggregator)
        half = UnaryEncodingAggregator.from_counts(source.params, source.counts() // 2, source.n // 2)
        rest = UnaryEncodingAggregator.from_counts(source.params, source.counts() - source.counts() // 2,
                                                   source.n - source.n // 2)
        first.merge(half)
        second.merge(rest)


def test_unary_payload_path_equals_packed_path() -> None:
    params = oue(13, 1.0)
    rng = SeededRng(2)
    payloads = [params.randomize(v % 13, rng=rng) for v in range(500)]
    a = UnaryEncodingAggregator(params)
    a.add(payloads)
    b = UnaryEncodingAggregator(params)
    b.add_packed(np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(500, 2))
    bits = np.array([[(p[i // 8] >> (i % 8)) & 1 for i in range(13)] for p in payloads])
    np.testing.assert_array_equal(a.counts(), bits.sum(axis=0))
    np.testing.assert_array_equal(b.counts(), a.counts())


# -- consistency ---------------------------------------------------------------------------------


def _projection_by_bisection(c: NDArray[np.float64], n: int) -> NDArray[np.float64]:
    x = np.maximum(c, 0)
    lo, hi = x.min() - n, x.max()
    for _ in range(200):
        mid = (lo + hi) / 2
        if np.maximum(x - mid, 0).sum() > n:
            lo = mid
        else:
            hi = mid
    return np.asarray(np.maximum(x - (lo + hi) / 2, 0), dtype=np.float64)


def test_norm_sub_is_non_negative_sums_to_n_and_is_the_projection() -> None:
    rng = np.random.default_rng(12)
    for _ in range(50):
        m = int(rng.integers(1, 60))
        n = int(rng.integers(0, 10_000))
        c = rng.normal(n / m, 3 * np.sqrt(n + 1), size=m)
        out = make_consistent(c, n)
        assert np.all(out >= 0)
        assert out.sum() == pytest.approx(n, abs=1e-6 * max(n, 1))
        np.testing.assert_allclose(out, _projection_by_bisection(c, n), atol=1e-6 * max(n, 1))
        np.testing.assert_allclose(make_consistent(out, n), out, atol=1e-9 * max(n, 1))  # idempotent


def test_norm_sub_lowers_the_error_on_a_sparse_histogram() -> None:
    rng = np.random.default_rng(13)
    values = rng.choice(4, size=20_000)  # 4 of 256 values held
    truth = np.bincount(values, minlength=256)
    agg = make_aggregator(oue(256, 1.0))
    add_simulated_reports(agg, values, rng)
    est = agg.estimate()
    consistent = est.with_consistency("norm_sub")
    assert consistent.consistent and not est.consistent
    assert consistent.counts.sum() == pytest.approx(20_000)
    assert np.sum((consistent.counts - truth) ** 2) < np.sum((est.counts - truth) ** 2)
    np.testing.assert_array_equal(consistent.std_errors, est.std_errors)


def test_clip_and_bad_consistency_requests() -> None:
    np.testing.assert_array_equal(make_consistent([-5.0, 3.0, 200.0], 100, "clip"), [0.0, 3.0, 100.0])
    with pytest.raises(InvalidParameterError, match="method"):
        make_consistent([1.0], 1, "bogus")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="finite"):
        make_consistent([np.nan], 1)
    agg = LocalHashingAggregator(LocalHashingParams(domain_size=100, epsilon=1.0))
    agg.add_arrays(np.arange(10), np.arange(10) % agg.params.g)
    with pytest.raises(InvalidParameterError, match="clip"):
        agg.estimate(candidates=[3, 5]).with_consistency("norm_sub")
    with pytest.raises(InvalidParameterError, match="clip"):
        agg.estimate(candidates=[0, 1, 2]).with_consistency("norm_sub")  # a prefix, not the whole domain
    assert agg.estimate(candidates=[3, 5]).with_consistency("clip").consistent


# -- bad input -----------------------------------------------------------------------------------


def test_grr_rejects_bad_payloads() -> None:
    agg = GRRAggregator(GRRParams(domain_size=5, epsilon=1.0))
    with pytest.raises(ProtocolError, match="grr payloads must be int, got float"):
        agg.add([1, 2.0])
    with pytest.raises(ProtocolError, match="got bool"):
        agg.add([True])
    with pytest.raises(ProtocolError, match="HashedValue"):
        agg.add([HashedValue(1, 2)])
    with pytest.raises(ProtocolError, match=r"in \[0, 5\), got 5 \(position 1\)"):
        agg.add([0, 5])
    with pytest.raises(ProtocolError, match="got -1"):
        agg.add([-1])
    with pytest.raises(ProtocolError, match="out of range"):
        agg.add([2**64])
    with pytest.raises(TypeError, match="integers"):
        agg.add_indices(np.array([1.0]))
    with pytest.raises(TypeError, match="sequence"):
        agg.add(b"\x01")
    assert agg.n == 0  # nothing half-added


def test_unary_encoding_rejects_bad_payloads() -> None:
    agg = UnaryEncodingAggregator(oue(12, 1.0))
    with pytest.raises(ProtocolError, match="must be 2 bytes, got 3 bytes|must be 2 bytes, got 3"):
        agg.add([b"\x00\x00", b"\x00\x00\x00"])
    with pytest.raises(ProtocolError, match="must be bytes, got int"):
        agg.add([5])
    with pytest.raises(ProtocolError, match="beyond domain_size 12"):
        agg.add([b"\x00\x10"])
    with pytest.raises(TypeError, match="uint8"):
        agg.add_packed(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ProtocolError, match="shape"):
        agg.add_packed(np.zeros((2, 3), dtype=np.uint8))
    assert agg.n == 0


def test_local_hashing_rejects_bad_payloads() -> None:
    params = LocalHashingParams(domain_size=50, epsilon=1.0)
    agg = LocalHashingAggregator(params)
    with pytest.raises(ProtocolError, match="must be HashedValue, got tuple"):
        agg.add([(1, 2)])
    with pytest.raises(ProtocolError, match="seed must be in"):
        agg.add([HashedValue(2**32, 0)])
    with pytest.raises(ProtocolError, match=f"bucket must be in \\[0, {params.g}\\)"):
        agg.add([HashedValue(1, params.g)])
    with pytest.raises(ProtocolError, match="seed must be an int, got float"):
        agg.add([HashedValue(1.5, 0)])  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="out of range"):
        agg.add([HashedValue(2**64, 0)])
    with pytest.raises(ProtocolError, match="same length"):
        agg.add_arrays(np.arange(3), np.arange(2))
    with pytest.raises(InvalidParameterError, match=r"candidates must be in \[0, 50\)"):
        agg.estimate(candidates=[50])
    with pytest.raises(InvalidParameterError, match=r"candidates must be in \[0, 50\)"):
        LocalHashingAggregator(params, candidates=[-1])
    assert agg.n == 0


def test_bad_parameters_and_merges() -> None:
    with pytest.raises(TypeError, match="GRRParams"):
        GRRAggregator(oue(4, 1.0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no frequency aggregator"):
        make_aggregator(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="local hashing only"):
        make_aggregator(oue(4, 1.0), candidates=[1])
    a = GRRAggregator(GRRParams(domain_size=4, epsilon=1.0))
    with pytest.raises(InvalidParameterError, match="different parameters"):
        a.merge(GRRAggregator(GRRParams(domain_size=4, epsilon=2.0)))
    with pytest.raises(TypeError, match="cannot merge"):
        a.merge(UnaryEncodingAggregator(oue(4, 1.0)))  # type: ignore[arg-type]
    for confidence in (0.0, 1.0, 1.5):
        with pytest.raises(InvalidParameterError, match="confidence must be in"):
            a.estimate(confidence)
    with pytest.raises(InvalidParameterError, match="sum to n"):
        GRRAggregator.from_counts(a.params, [1, 2, 3, 4], 11)


# -- accumulators --------------------------------------------------------------------------------


def _stored(reports: list[tuple[int, list[Payload]]]) -> list[StoredReport]:
    return [StoredReport(report_id=i.to_bytes(16, "big"), campaign_id="c", round=0, group=group,
                         payloads=msgpack.packb([payload_to_wire(p) for p in payloads], use_bin_type=True))
            for i, (group, payloads) in enumerate(reports)]


def _component_reports() -> tuple[dict[int, tuple[FrequencyOracleParams, ...]], list[StoredReport]]:
    grr, ue, lh = GRRParams(domain_size=6, epsilon=1.0), oue(10, 1.0), LocalHashingParams(domain_size=99, epsilon=1.0)
    big = GRRParams(domain_size=2**30, epsilon=12.0)
    params: dict[int, tuple[FrequencyOracleParams, ...]] = {0: (grr, ue), 1: (lh,), 2: (big,)}
    rng = SeededRng(11)
    reports: list[tuple[int, list[Payload]]] = []
    for i in range(900):
        group = i % 3
        payloads = [p.randomize(i % p.domain_size, rng=rng) for p in params[group]]
        reports.append((group, payloads))
    return params, _stored(reports)


def test_incremental_accumulation_equals_rebuild() -> None:
    params, reports = _component_reports()
    accumulate = make_accumulate_fn(params)
    blobs: dict[str, bytes] = {}
    for start in range(0, len(reports), 97):
        blobs.update(accumulate(reports[start:start + 97], blobs))
    assert set(blobs) == {"0:0", "0:1", "1:0", "2:0"}
    assert blobs == rebuild(reports, params)
    assert blobs == rebuild([reports[:400], reports[400:]], params)  # batches, as iter_reports yields


def test_accumulators_finalize_to_the_direct_estimates() -> None:
    params, reports = _component_reports()
    blobs = rebuild(reports, params)
    direct = aggregate_reports(reports, params)
    for key in ("0:0", "0:1", "2:0"):
        group, index = map(int, key.split(":"))
        acc = CountAccumulator.from_bytes(params[group][index], blobs[key], key=key)
        assert acc.has_counts and acc.n == 300
        agg = acc.finalize()
        assert agg is not None
        candidates = np.arange(min(agg.params.domain_size, 10))
        np.testing.assert_array_equal(agg.estimate(candidates=candidates).counts,
                                      direct[key].estimate(candidates=candidates).counts)
    lh = CountAccumulator.from_bytes(params[1][0], blobs["1:0"])
    assert not lh.has_counts and lh.n == 300 and lh.finalize() is None
    assert np.frombuffer(blobs["1:0"], dtype="<i8").tolist() == [1, KIND_REPORT_COUNT, 300]
    assert isinstance(direct["1:0"], LocalHashingAggregator) and direct["1:0"].n == 300


def test_accumulator_merge_and_zero() -> None:
    params, reports = _component_reports()
    a = CountAccumulator.from_bytes(params[0][1], rebuild(reports[:450], params)["0:1"])
    b = CountAccumulator.from_bytes(params[0][1], rebuild(reports[450:], params)["0:1"])
    a.merge(b)
    assert a.to_bytes() == rebuild(reports, params)["0:1"]
    assert a.zero().n == 0
    with pytest.raises(ProtocolError, match="cannot merge"):
        a.merge(CountAccumulator(params[0][0]))


def test_accumulators_reject_corruption_and_unknown_groups() -> None:
    params, reports = _component_reports()
    blobs = rebuild(reports, params)
    with pytest.raises(ProtocolError, match="corrupted"):
        CountAccumulator.from_bytes(params[0][0], blobs["0:0"][:-3])
    with pytest.raises(ProtocolError, match="does not fit"):
        CountAccumulator.from_bytes(params[0][0], blobs["1:0"])
    bad = bytearray(blobs["0:0"])
    bad[16] ^= 1  # n no longer matches the counts
    with pytest.raises(ProtocolError, match="corrupted accumulator"):
        CountAccumulator.from_bytes(params[0][0], bytes(bad))
    stray = _stored([(7, [1])])
    with pytest.raises(ProtocolError, match="group 7"):
        make_accumulate_fn(params)(stray, {})
    wrong_count = _stored([(1, [HashedValue(1, 1), HashedValue(2, 2)])])
    with pytest.raises(ProtocolError, match="expected a list of 1 payloads"):
        rebuild(wrong_count, params)
    garbage = [StoredReport(report_id=b"x" * 16, campaign_id="c", round=0, group=0, payloads=b"\xc1")]
    with pytest.raises(ProtocolError, match="msgpack"):
        rebuild(garbage, params)
    wrong_type = _stored([(0, [HashedValue(1, 1), b"\x00\x00"])])
    with pytest.raises(ProtocolError, match="grr payloads must be int"):
        rebuild(wrong_type, params)
