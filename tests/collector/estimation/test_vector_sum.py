"""Bucketized vector sums at the collector: exactness against the SDK, statistics, ingestion and storage.

* the vectorized signs and decodings equal the SDK's ``sign`` / ``decode`` / ``estimate`` bit for bit
  (64-bit buckets included), whatever the chunking;
* statistics, with devices randomized by the real SDK (seeded): every coordinate of every bucket's
  estimated sum -- nonempty and empty buckets -- lies within 4.5 standard errors of the truth, the
  standard error being the exact analytic one, sqrt(n M - sum_{i in c} v_ij^2); a chi-square check of
  the standardized errors over repeated runs (too small or too large a spread both fail); the
  signs of distinct buckets are uncorrelated over the seeds;
* bad payloads are ``ProtocolError``, bad bucket lists ``TypeError``/``ValueError``;
* a campaign whose round carries the mechanism: reports go through the collector's submit path
  (Report lists, protobuf columns and packed batches), bad ones are rejected with the reason, the
  stored reports decode to the same payloads and give the same sums, the accumulators equal a rebuild.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from ldp.v1 import campaigns_pb2
from ldp_client import serde
from ldp_client.encoders import BucketedVectorEncoder, NumericDomain, ShiftedGridEncoder, SimHashEncoder
from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import BucketizedVectorParams, GRRParams, VectorPrivUnitParams, VectorShape
from ldp_client.mechanisms.bucketized_vector import sign
from ldp_client.payload import Floats, HashedValue, SignedVector
from ldp_client.report import Report, pack_batch, unpack_batch_columns
from ldp_client.rng import SeededRng
from ldp_client.spec import Component, GroupTask, RoundSpec
from ldp_collector.core import Collector
from ldp_collector.estimation import vector_sum
from ldp_collector.estimation.accumulators import (
    component_params_from_spec,
    decode_report_payloads,
    make_accumulate_fn,
    rebuild,
)
from ldp_collector.estimation.olh_hash import hash_values
from ldp_collector.estimation.vector_sum import (
    BucketSumAccumulator,
    BucketSums,
    analytic_variance,
    bucket_sums,
    decode_signed,
)
from ldp_collector.ingest import pack_payloads
from ldp_collector.kinds import KINDS, CampaignEngine, RoundOutcome, RoundPlan, RoundReports
from ldp_collector.model import Result
from ldp_collector.serde import config_from_proto
from ldp_collector.storage.base import Outcome, StoredReport
from ldp_collector.storage.sqlite import SqliteReportStore
from support.stats import FALSE_FAILURE_RATE, chi2_sf

DOMAIN = NumericDomain.unit(2)
#: |estimate - truth| <= Z standard errors (6.8e-6 per check, two-sided).
Z = 4.5


def _params(shape: VectorShape, bucket_bits: int = 16, dimension: int = 3, epsilon: float = 2.0) -> BucketizedVectorParams:
    return BucketizedVectorParams(bucket_bits=bucket_bits, dimension=dimension, epsilon=epsilon, shape=shape)


def _random_payloads(params: BucketizedVectorParams, n: int, seed: int) -> tuple[list[SignedVector], list[int]]:
    """Real SDK reports of random box vectors in random buckets."""
    rng = SeededRng(seed)
    payloads, buckets = [], []
    for _ in range(n):
        bucket = rng.randbits(params.bucket_bits)
        vector = [2.0 * rng.uniform() - 1.0 for _ in range(params.dimension)]
        payloads.append(params.randomize((bucket, vector), rng=rng))
        buckets.append(bucket)
    return payloads, buckets


# ------------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("shape", list(VectorShape))
def test_sums_equal_the_sdk_estimates_bit_for_bit(shape: VectorShape) -> None:
    params = _params(shape, bucket_bits=64, dimension=5)
    payloads, own = _random_payloads(params, 40, seed=int(shape))
    rng = SeededRng(3)
    cells = own[:5] + [rng.randbits(64) for _ in range(20)] + [0, 2**64 - 1, 2**63]
    seeds, z = decode_signed(params, payloads)
    assert seeds.dtype == np.uint64 and seeds.tolist() == [p.seed for p in payloads]
    assert z.tolist() == [params.decode(p) for p in payloads]
    for k, payload in enumerate(payloads[:6]):  # one report: S_c is that report's estimate
        single = bucket_sums(params, [payload], cells)
        assert single.sums.tolist() == [params.estimate(payload, c) for c in cells], k
    total = bucket_sums(params, payloads, cells)
    expected = [[math.fsum(col) for col in zip(*(params.estimate(p, c) for p in payloads))] for c in cells]
    np.testing.assert_allclose(total.sums, expected, rtol=1e-12, atol=1e-9)
    assert total.buckets.tolist() == cells and total.reports == 40
    assert total.counts.tolist() == total.sums[:, -1].tolist()


def test_signs_are_the_sdk_signs_and_hash_values() -> None:
    rng = SeededRng(11)
    seeds = [rng.randbits(32) for _ in range(300)]
    buckets = [rng.randbits(64) for _ in range(300)]
    h = hash_values(np.array(seeds, dtype=np.uint64), np.array(buckets, dtype=np.uint64), 2)
    assert [1 - 2 * int(x) for x in h] == [sign(s, b) for s, b in zip(seeds, buckets)]


@pytest.mark.parametrize("shape", list(VectorShape))
def test_chunking_does_not_change_the_sums(shape: VectorShape, monkeypatch: pytest.MonkeyPatch) -> None:
    params = _params(shape, bucket_bits=10, dimension=4)
    payloads, own = _random_payloads(params, 300, seed=7)
    cells = np.array(sorted(set(own))[:40] + [1023, 0], dtype=np.int64)
    reference = bucket_sums(params, payloads, cells)
    monkeypatch.setattr(vector_sum, "_CHUNK_REPORTS", 7)
    monkeypatch.setattr(vector_sum, "_BLOCK_PAIRS", 16)
    monkeypatch.setattr(vector_sum, "_MIN_BLOCK_ROWS", 1)
    chunked = bucket_sums(params, tuple(payloads), cells)
    np.testing.assert_allclose(chunked.sums, reference.sums, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(chunked.variances, reference.variances, rtol=1e-12)
    monkeypatch.setattr(vector_sum, "_MAX_BLOCK_PAIRS", 8)  # fewer pairs than buckets: one report per block
    np.testing.assert_allclose(bucket_sums(params, payloads, cells).sums, reference.sums, rtol=1e-12, atol=1e-9)


def _stored(group: int, payloads: tuple[Any, ...], k: int) -> StoredReport:
    return StoredReport(report_id=k.to_bytes(16, "big"), campaign_id="c", round=1, group=group,
                        payloads=pack_payloads(payloads))


def _accumulator_state(acc: BucketSumAccumulator) -> tuple[Any, ...]:
    out = acc.finalize()
    return out.sums.tobytes(), out.variances.tobytes(), acc.abs_sums.tobytes(), acc.n


@pytest.mark.parametrize("shape", list(VectorShape))
def test_stored_reports_read_by_column_give_the_same_sums_bit_for_bit(shape: VectorShape,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Stored reports are read without payload objects; the accumulator's state is that of the
    per-payload path bit for bit, over two groups, chunks and a component beside the vector."""
    params = _params(shape, bucket_bits=10, dimension=4 if shape != VectorShape.BOX else 11)
    payloads, own = _random_payloads(params, 300, seed=11)
    cells = np.array(sorted(set(own))[:30] + [0], dtype=np.int64)
    by_group = {0: (params,), 1: (GRRParams(domain_size=6, epsilon=1.0), params)}
    keys = ("0:0", "1:1")
    reports = [_stored(0, (p,), k) if k % 3 else _stored(1, (k % 6, p), k) for k, p in enumerate(payloads)]
    monkeypatch.setattr(vector_sum, "_CHUNK_REPORTS", 37)
    fast = BucketSumAccumulator(params, cells, by_group, keys)
    fast.add(reports)
    slow = BucketSumAccumulator(params, cells, by_group, keys)
    decoded = decode_report_payloads(reports, by_group)
    for key in keys:
        slow.add_payloads(decoded[key])
    assert _accumulator_state(fast) == _accumulator_state(slow)
    calls: list[int] = []
    monkeypatch.setattr(vector_sum, "decode_report_payloads",
                        lambda r, g: calls.append(len(r)) or decode_report_payloads(r, g))
    fast.add(reports[:5])
    assert not calls  # the column path was taken


@pytest.mark.parametrize("shape,odd,message", [
    (VectorShape.PRIVUNIT, (SignedVector(1, Floats((math.nan, 0.0, 0.0, 1.0))),), "must be finite"),
    (VectorShape.PRIVUNIT, (SignedVector(1, Floats((1.0, 0.0, 0.0))),), "Floats of 4 values"),
    (VectorShape.PRIVUNIT, (SignedVector(1, b"\x00"),), "Floats of 4 values"),
    (VectorShape.PRIVUNIT, (HashedValue(1, 2),), "must be SignedVector"),
    (VectorShape.PRIVUNIT, (3,), "must be SignedVector"),
    (VectorShape.BOX, (SignedVector(1, b"\x10"),), "bits set beyond the dimension 4"),
    (VectorShape.BOX, (SignedVector(1, b"\x00\x00"),), "1 bytes of packed signs"),
    (VectorShape.BOX, (SignedVector(1, Floats((1.0, 0.0, 0.0, 0.0))),), "1 bytes of packed signs"),
])
def test_odd_stored_reports_fail_as_on_the_per_payload_path(shape: VectorShape, odd: tuple[Any, ...],
                                                            message: str) -> None:
    params = _params(shape, bucket_bits=10, dimension=4)
    payloads, _ = _random_payloads(params, 20, seed=3)
    reports = [_stored(0, (p,), k) for k, p in enumerate(payloads)]
    reports[7] = _stored(0, odd, 7)
    acc = BucketSumAccumulator(params, [0, 1], {0: (params,)}, ("0:0",))
    with pytest.raises(ProtocolError, match=message):
        acc.add(reports)
    reports[7] = replace(reports[7], payloads=b"\xc1")  # not msgpack: the report is named
    with pytest.raises(ProtocolError, match="report 0+7 .*not valid msgpack"):
        BucketSumAccumulator(params, [0, 1], {0: (params,)}, ("0:0",)).add(reports)
    # A report of another group is read by the pass that sums that group's components, not by this one.
    by_group = {0: (params,), 1: (params,)}
    reports[7] = replace(reports[7], group=1)
    clean = [r for k, r in enumerate(reports) if k != 7]
    acc, reference = (BucketSumAccumulator(params, [0, 1], by_group, ("0:0",)) for _ in range(2))
    acc.add(reports)
    reference.add(clean)
    assert _accumulator_state(acc) == _accumulator_state(reference)
    with pytest.raises(ProtocolError, match="report 0+7 .*not valid msgpack"):
        BucketSumAccumulator(params, [0, 1], by_group, ("1:0",)).add(reports)


def test_empty_inputs() -> None:
    params = _params(VectorShape.BOX)
    none = bucket_sums(params, [], [1, 2, 3])
    assert none.sums.shape == none.variances.shape == (3, 3) and not none.sums.any() and none.reports == 0
    assert none.variance_bound == 0.0
    payloads, _ = _random_payloads(params, 5, seed=1)
    no_buckets = bucket_sums(params, payloads, [])
    assert no_buckets.sums.shape == (0, 3) and no_buckets.reports == 5
    seeds, z = decode_signed(params, [])
    assert seeds.shape == (0,) and z.shape == (0, 3)


def test_variance_fields() -> None:
    box, ball = _params(VectorShape.BOX), _params(VectorShape.L2_BALL)
    for params in (box, ball):
        payloads, _ = _random_payloads(params, 2000, seed=5)
        result = bucket_sums(params, payloads, [1, 2])
        assert result.variance_bound == analytic_variance(params, 2000) == 2000 * params.report_second_moment
        assert (result.variances[0] == result.variances[1]).all()
        np.testing.assert_allclose(result.std_errors, np.sqrt(result.variances))
        if params is box:  # every z_ij^2 is B^2: the plug-in is the bound
            np.testing.assert_allclose(result.variances, result.variance_bound, rtol=1e-12)
        else:  # sum_i z_ij^2 has mean n M; its relative sd is about 0.9 / sqrt(n) = 2% here
            np.testing.assert_allclose(result.variances, result.variance_bound, rtol=0.12)
    with pytest.raises(TypeError, match="BucketizedVectorParams"):
        analytic_variance(HashedValue(1, 1), 3)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------- validation


def test_bad_payloads_are_protocol_errors() -> None:
    box, ball = _params(VectorShape.BOX), _params(VectorShape.L2_BALL, dimension=2)
    good_box = box.randomize((3, [0.0, 0.0, 1.0]), rng=SeededRng(1))
    good_ball = ball.randomize((3, [0.0, 1.0]), rng=SeededRng(1))
    cases: list[tuple[BucketizedVectorParams, Any, str]] = [
        (box, HashedValue(1, 2), "must be SignedVector"),
        (box, (1, b"\x00"), "must be SignedVector"),
        (box, SignedVector(2**32, b"\x00"), r"seeds must be in \[0, 2\^32\)"),
        (box, SignedVector(-1, b"\x00"), r"seeds must be in \[0, 2\^32\)"),
        (box, SignedVector(True, b"\x00"), "seeds must be ints"),
        (box, SignedVector(1.0, b"\x00"), "seeds must be ints"),
        (box, SignedVector(1, b"\x00\x00"), "1 bytes of packed signs"),
        (box, SignedVector(1, Floats((1.0, 0.0, 0.0))), "1 bytes of packed signs"),
        (box, SignedVector(1, b"\x08"), "bits set beyond the dimension 3"),
        (ball, SignedVector(1, b"\x00"), "Floats of 2 values"),
        (ball, SignedVector(1, Floats((1.0,))), "Floats of 2 values"),
        (ball, SignedVector(1, Floats((math.nan, 1.0))), "must be finite"),
        (ball, SignedVector(1, Floats(("a", 1.0))), "must hold floats"),  # type: ignore[arg-type]
    ]
    for params, bad, message in cases:
        good = good_box if params is box else good_ball
        with pytest.raises(ProtocolError, match=message):
            bucket_sums(params, [good, bad, good], [0, 3])
        with pytest.raises(ProtocolError, match=message):
            decode_signed(params, [bad])


def test_bad_arguments() -> None:
    params = _params(VectorShape.BOX, bucket_bits=4)
    payloads, _ = _random_payloads(params, 3, seed=2)
    with pytest.raises(ValueError, match=r"buckets must be in \[0, 2\^4\), got 0 to 16"):
        bucket_sums(params, payloads, [0, 16])
    with pytest.raises(ValueError, match=r"buckets must be in \[0, 2\^4\)"):
        bucket_sums(params, payloads, [-1, 3])
    with pytest.raises(ValueError, match="1-D"):
        bucket_sums(params, payloads, [[1, 2]])
    with pytest.raises(TypeError, match="buckets must be integers"):
        bucket_sums(params, payloads, [1.0, 2.0])
    with pytest.raises(TypeError, match="buckets must be integers"):
        bucket_sums(params, payloads, np.array([1, "a"], dtype=object))
    with pytest.raises(ValueError, match=r"buckets must be in \[0, 2\^4\)"):
        bucket_sums(params, payloads, np.array([2**70], dtype=object))
    with pytest.raises(TypeError, match="params must be BucketizedVectorParams"):
        bucket_sums(HashedValue(1, 2), payloads, [1])  # type: ignore[arg-type]
    assert bucket_sums(params, payloads, np.array([], dtype=np.float64)).sums.shape == (0, 3)


# ------------------------------------------------------------------------------------- statistics


def _clustered_points(rng: SeededRng, n: int) -> list[tuple[float, float]]:
    """n points in three tight clusters (sizes 1/2, 3/10, 1/5 of n), some clamped at the border."""
    centers = [(0.21, 0.33), (0.74, 0.52), (0.45, 0.88)]
    sizes = [n // 2, 3 * n // 10, n - n // 2 - 3 * n // 10]
    points = []
    for (cx, cy), size in zip(centers, sizes):
        for _ in range(size):
            points.append((cx + 0.01 * rng.gauss(), cy + 0.01 * rng.gauss()))
    return points


def _truth(encoder: BucketedVectorEncoder, points: list[tuple[float, float]]) -> dict[int, np.ndarray]:
    """Per bucket: the sum of v and the sum of v_j^2, from the encoder itself."""
    out: dict[int, np.ndarray] = {}
    for point in points:
        bucket, vector = encoder.encode(point)
        v = np.array(vector)
        acc = out.setdefault(bucket, np.zeros((2, v.size)))
        acc[0] += v
        acc[1] += v * v
    return out


def _moment_sums(params: BucketizedVectorParams, vectors: np.ndarray) -> np.ndarray:
    """sum_i E[z_ij^2] over the reports of ``vectors`` (rows): a bucket's exact variance is this minus its sum v_ij^2.

    Ball and box: n M (every report's E[z_j^2] is M, ``params.sum_variance``). PrivUnit: E[z_j^2]
    of a report depends on its input's direction c = v / ||v|| (D times the inner
    ``second_moment`` of c_j^2); n M is then a bound.
    """
    n = len(vectors)
    bound = np.full(params.dimension, params.sum_variance(n))
    if params.shape != VectorShape.PRIVUNIT:
        return bound
    inner = params.inner
    assert isinstance(inner, VectorPrivUnitParams)
    directions = vectors * vectors / np.sum(vectors * vectors, axis=1, keepdims=True)
    sums: np.ndarray = params.dimension * np.vectorize(inner.second_moment)(directions).sum(axis=0)
    assert np.all(sums <= bound * (1 + 1e-12))
    return sums


def _empty_buckets(params: BucketizedVectorParams, taken: set[int], count: int) -> list[int]:
    top = 2**params.bucket_bits
    return [b for b in (0, top - 1, top // 3, top // 2 + 1, 5) if b not in taken][:count]


@pytest.mark.parametrize("shape", list(VectorShape))
@pytest.mark.parametrize("lsh", ["simhash", "shifted_grid"])
def test_sums_are_within_their_analytic_standard_errors(shape: VectorShape, lsh: str) -> None:
    """20 000 devices in three clusters, real SDK randomization; nonempty and empty buckets."""
    n = 20_000
    if lsh == "simhash":
        encoder = BucketedVectorEncoder(domain=DOMAIN, simhash=SimHashEncoder(domain=DOMAIN, bits=12, seed=21))
    else:
        encoder = BucketedVectorEncoder(domain=DOMAIN, shifted_grid=ShiftedGridEncoder(domain=DOMAIN, level=4, seed=21))
    params = _params(shape, bucket_bits=encoder.bucket_bits, dimension=3, epsilon=2.0)
    component = Component(encoder=encoder, mechanism=params)
    rng = SeededRng(1000 + int(shape) + 10 * len(lsh))
    points = _clustered_points(rng, n)
    payloads = [component.run(p, rng=rng) for p in points]
    truth = _truth(encoder, points)
    moment_sums = _moment_sums(params, np.array([encoder.encode(p)[1] for p in points]))
    assert 3 <= len(truth) <= 8  # three clusters, a few of them cut by a bucket border
    cells = sorted(truth) + _empty_buckets(params, set(truth), 2)
    result = bucket_sums(params, payloads, cells)
    assert isinstance(result, BucketSums) and result.reports == n
    for k, cell in enumerate(cells):
        true_sum, true_squares = truth.get(cell, np.zeros((2, 3)))
        variances = moment_sums - true_squares
        for j in range(3):
            se = math.sqrt(variances[j])
            error = result.sums[k, j] - true_sum[j]
            assert abs(error) <= Z * se, (cell, j, result.sums[k, j], true_sum[j], error / se)
            assert se <= result.std_errors[k, j] * 1.15  # the plug-in is conservative (up to noise)
    # The counts really are resolved: the largest bucket's count is far above the noise.
    biggest = max(truth, key=lambda c: truth[c][0][-1])
    assert result.counts[cells.index(biggest)] > 5 * math.sqrt(result.variance_bound)


@pytest.mark.parametrize("shape", list(VectorShape))
def test_standardized_errors_have_unit_variance_over_repeated_runs(shape: VectorShape) -> None:
    """Chi-square of (S_cj - truth) / sd over 40 runs x 64 buckets (2 populated), per coordinate, both tails.

    Different buckets' sums are uncorrelated (sigma_s(c) sigma_s(c') has mean 0 over the seed and
    z_ij^2 does not depend on it), so the 2560 standardized errors of a coordinate are asymptotically
    independent standard normals: a variance off by 15% moves the statistic by about 5 of its sds.
    """
    params = _params(shape, bucket_bits=6, dimension=3, epsilon=1.0)
    runs, sizes = 40, {17: 300, 50: 200}
    vectors = {17: (0.5, -0.25, 1.0), 50: (-1.0, 0.75, 1.0)}
    cells = list(range(64))
    moment_sums = _moment_sums(params, np.array([vectors[c] for c, size in sizes.items() for _ in range(size)]))
    squares: list[list[float]] = [[], [], []]
    for run in range(runs):
        rng = SeededRng(50_000 + 100 * int(shape) + run)
        payloads = [params.randomize((c, list(vectors[c])), rng=rng) for c, size in sizes.items() for _ in range(size)]
        result = bucket_sums(params, payloads, cells)
        for k, cell in enumerate(cells):
            v = np.array(vectors.get(cell, (0.0, 0.0, 0.0)))
            size = sizes.get(cell, 0)
            variances = moment_sums - size * v**2
            for j in range(3):
                sd = math.sqrt(variances[j])
                squares[j].append(((result.sums[k, j] - size * v[j]) / sd) ** 2)
    for j in range(3):
        dof = len(squares[j])
        upper = chi2_sf(math.fsum(squares[j]), dof)
        alpha = FALSE_FAILURE_RATE / 6  # two tails x three coordinates
        assert alpha <= upper <= 1.0 - alpha, (j, math.fsum(squares[j]) / dof, dof, upper)


def test_signs_of_distinct_buckets_are_uncorrelated_over_the_seeds() -> None:
    """E_s[sigma_s(b) sigma_s(c)] ~ 0 for b != c (the unbiasedness assumption), over 2^20 seeds."""
    seeds = np.arange(2**20, dtype=np.uint64)
    buckets = np.array([0, 1, 2, 3, 255, 256, 2**32, 2**63, 2**64 - 1], dtype=np.uint64)
    signs = 1.0 - 2.0 * hash_values(seeds[:, None], buckets[None, :], 2).astype(np.float64)
    correlation = signs.T @ signs / seeds.size
    off = correlation[~np.eye(buckets.size, dtype=bool)]
    # Each mean of 2^20 independent +-1 has sd 2^-10; 72 entries (36 pairs), two-sided at 5.5 sd.
    assert np.abs(off).max() <= 5.5 * 2.0**-10
    assert np.abs(signs.mean(axis=0)).max() <= 5.5 * 2.0**-10


# ------------------------------------------------------------------------------------- collector path

ROUND = 1
BOX_ENCODER = BucketedVectorEncoder(domain=DOMAIN, shifted_grid=ShiftedGridEncoder(domain=DOMAIN, level=3, seed=8))
BALL_ENCODER = BucketedVectorEncoder(domain=DOMAIN, simhash=SimHashEncoder(domain=DOMAIN, bits=6, seed=8))
BOX = Component(encoder=BOX_ENCODER, mechanism=_params(VectorShape.BOX, bucket_bits=6, epsilon=1.5))
BALL = Component(encoder=BALL_ENCODER, mechanism=_params(VectorShape.L2_BALL, bucket_bits=6, epsilon=1.5))
CELLS = list(range(64))


def _spec(campaign_id: str) -> RoundSpec:
    return RoundSpec(campaign_id=campaign_id, round=ROUND, group_weights=(1, 1), campaign_epsilon=4.0,
                     tasks=(GroupTask(groups=(0,), components=(BOX,)), GroupTask(groups=(1,), components=(BALL,))))


class _VectorEngine(CampaignEngine):
    """One round of bucketized vectors (box in group 0, ball in group 1); closing sums every bucket."""

    KIND = campaigns_pb2.HISTOGRAM
    sums: ClassVar[dict[str, dict[int, BucketSums]]] = {}

    def first_round(self) -> RoundPlan:
        return RoundPlan(spec=_spec(self.campaign_id))

    def close_round(self, spec: RoundSpec, reports: RoundReports, engine_state: bytes) -> RoundOutcome:
        by_group = component_params_from_spec(spec)
        payloads: dict[str, list[Any]] = {}
        for batch in reports.batches(batch_size=50):
            for key, values in decode_report_payloads(batch, by_group).items():
                payloads.setdefault(key, []).extend(values)
        self.sums[self.campaign_id] = {
            group: bucket_sums(by_group[group][0], payloads.get(f"{group}:0", []), CELLS)  # type: ignore[arg-type]
            for group in (0, 1)}
        return RoundOutcome(result=Result())

    def accumulate_fn(self, spec: RoundSpec) -> Any:
        return make_accumulate_fn(component_params_from_spec(spec))


def _report(rng: SeededRng, group: int, payload: Any) -> Report:
    return Report(report_id=rng.token_bytes(16), campaign_id="vec", round=ROUND, group=group, payloads=(payload,))


def test_reports_go_through_submit_storage_and_estimation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KINDS, "histogram", replace(KINDS["histogram"], engine=_VectorEngine))
    collector = Collector(SqliteReportStore(tmp_path / "store"))
    try:
        collector.create_campaign(config_from_proto(campaigns_pb2.CampaignConfig(
            campaign_id="vec", kind=campaigns_pb2.HISTOGRAM, epsilon=4.0,
            domain=campaigns_pb2.Domain(categorical_size=6))))
        spec, _ = collector.get_round_spec("vec")
        assert spec == _spec("vec")
        rng = SeededRng(77)
        points = [(rng.uniform(), rng.uniform()) for _ in range(600)]
        good = [_report(rng, i % 2, (BOX if i % 2 == 0 else BALL).run(p, rng=rng)) for i, p in enumerate(points)]
        box_payload = good[0].payloads[0]
        ball_payload = good[1].payloads[0]
        bad = {
            0: _report(rng, 0, SignedVector(1, b"\x08")),  # a sign beyond D = 3
            1: _report(rng, 0, ball_payload),  # a ball report in the box group
            2: _report(rng, 1, SignedVector(2**32, ball_payload.inner)),  # type: ignore[union-attr]
            3: _report(rng, 1, box_payload.inner),  # a bare vector_box payload
            4: _report(rng, 1, SignedVector(3, Floats((0.5, 0.5, 0.5)))),  # not a unit direction
        }
        reasons = {0: "payload 0: bucketized_vector inner payload: vector_box payload has bits set beyond the dimension 3",
                   1: "payload 0: bucketized_vector inner payload: vector_box payload must be 1 bytes",
                   2: r"payload 0: bucketized_vector seed must be in [0, 2^32)",
                   3: "payload 0: bucketized_vector payload must be a SignedVector, got bytes",
                   4: "payload 0: bucketized_vector inner payload: vector_l2_ball payload must be a unit vector"}
        # Three request forms: Report objects, protobuf columns (the service), packed msgpack columns.
        first = [*good[:200], *bad.values()]
        outcomes = collector.submit("a", first)
        assert outcomes[:200] == [(Outcome.ACCEPTED, "")] * 200
        for k, reason in reasons.items():
            outcome, text = outcomes[200 + k]
            assert outcome == Outcome.REJECTED and text.startswith(reason.split(" got")[0]), text
        columns = serde.report_columns_from_proto([serde.report_to_proto(r) for r in good[200:400]])
        assert collector.submit("b", columns) == [(Outcome.ACCEPTED, "")] * 200
        _, packed = unpack_batch_columns(pack_batch("c", good[300:600]))  # 100 duplicates
        assert collector.submit("c", packed) == [(Outcome.DUPLICATE, "")] * 100 + [(Outcome.ACCEPTED, "")] * 200
        assert collector.store.count_reports("vec", ROUND) == 600
        stored = [r for batch in collector.store.iter_reports("vec", ROUND) for r in batch]
        by_group = component_params_from_spec(_spec("vec"))
        decoded = decode_report_payloads(stored, by_group)
        assert decoded["0:0"] == [r.payloads[0] for r in good if r.group == 0]
        assert decoded["1:0"] == [r.payloads[0] for r in good if r.group == 1]
        assert collector.store.load_accumulators("vec", ROUND) == rebuild(stored, by_group)
        collector.close_round("vec", ROUND)
        sums = _VectorEngine.sums["vec"]
        for group in (0, 1):
            direct = bucket_sums(by_group[group][0], [r.payloads[0] for r in good if r.group == group],  # type: ignore[arg-type]
                                 CELLS)
            assert sums[group].reports == 300
            np.testing.assert_array_equal(sums[group].sums, direct.sums)
            # 300 devices over 64 buckets: the total count over every bucket is unbiased for 300.
            sd = math.sqrt(64 * direct.variance_bound)
            assert abs(direct.counts.sum() - 300) <= Z * sd
    finally:
        collector.store.close()


def test_lloyd_move_goes_to_the_means_of_significant_buckets_only() -> None:
    from ldp_collector.estimation.vector_sum import LLOYD_MIN_COUNT_Z, lloyd_move

    previous = np.array([[0.0, 0.0], [0.5, 0.5], [-0.5, 0.2]])
    # Sums of (v, 1): 100 devices at (0.2, -0.4), 30 at (0.6, 0.6) and a count of 2 (not significant at variance 4).
    sums = np.array([[20.0, -40.0, 100.0], [18.0, 18.0, 30.0], [1.0, 1.0, 2.0]])
    move = lloyd_move(previous, sums, 4.0)
    assert move.moved.tolist() == [True, True, False] and 2.0 <= LLOYD_MIN_COUNT_Z * 2.0
    np.testing.assert_allclose(move.centers, [[0.2, -0.4], [0.6, 0.6], [-0.5, 0.2]])
    np.testing.assert_allclose(move.variances, [4.0 / 100**2, 4.0 / 30**2, np.inf])
    with pytest.raises(InvalidParameterError, match="sums"):
        lloyd_move(previous, sums[:, :2], 4.0)
    # In two dimensions the step is the plain mean: there is nothing to shrink (James-Stein needs d >= 3).
    np.testing.assert_array_equal(move.shrink, [1.0, 1.0, 0.0])


def test_lloyd_move_shrinks_a_step_by_its_noise_james_stein() -> None:
    from ldp_collector.estimation.vector_sum import lloyd_move

    d, count, variance = 10, 400.0, 1600.0  # the mean's noise: variance / count^2 = 0.01 per coordinate
    previous = np.zeros((3, d))
    steps = np.zeros((3, d))
    steps[0, 0] = 0.1  # |step|^2 = 0.01: shorter than (d - 2) x 0.01, so the center stays
    steps[1, :2] = 0.3  # |step|^2 = 0.18: the positive-part factor 1 - 0.08 / 0.18
    steps[2, 0] = 3.0  # far: nearly the whole step
    sums = np.column_stack([steps * count, np.full(3, count)])
    move = lloyd_move(previous, sums, variance)
    np.testing.assert_allclose(move.shrink, [0.0, 1 - 0.08 / 0.18, 1 - 0.08 / 9.0])
    np.testing.assert_allclose(move.centers, move.shrink[:, None] * steps)
    # Only the reports' mean second moment counts: half of it halves what is shrunk.
    half = lloyd_move(previous, sums, variance, moment_ratio=0.5)
    np.testing.assert_allclose(half.shrink, [0.0, 1 - 0.04 / 0.18, 1 - 0.04 / 9.0])
    # The reported variance stays the plain mean's, a bound on the shrunk step's error per coordinate.
    np.testing.assert_allclose(move.variances, 0.01)


@pytest.mark.parametrize("length", [0.0, 0.2, 0.5, 2.0])
def test_a_shrunk_lloyd_step_errs_less_than_the_plain_mean(length: float) -> None:
    """James-Stein dominance, on seeded Gaussian sums: whatever the true step, shrinking does not raise
    the expected squared error. The paired differences' mean must not exceed 4 of its standard errors
    (a false failure below 1e-4 where the means tie, at a true step much longer than the noise)."""
    from ldp_collector.estimation.vector_sum import lloyd_move

    rng = np.random.default_rng(20261129)
    d, draws, count, variance = 10, 4000, 100.0, 100.0  # noise 0.01 per coordinate, 0.1 in norm per coordinate
    truth = np.zeros(d)
    truth[0] = length
    noisy = truth + rng.normal(0.0, 0.1, (draws, d))
    sums = np.column_stack([noisy * count, np.full(draws, count)])
    move = lloyd_move(np.zeros((draws, d)), sums, variance)
    diff = ((move.centers - truth) ** 2).sum(axis=1) - ((noisy - truth) ** 2).sum(axis=1)
    assert diff.mean() <= 4 * diff.std(ddof=1) / math.sqrt(draws)
    if length <= 0.2:  # a step within the noise: the risk falls by a good part of d x 0.01
        assert diff.mean() < -0.02


def test_candidates_shrink_toward_their_share_weighted_centroid_by_their_noise() -> None:
    from ldp_collector.estimation.vector_sum import shrink_toward_centroid

    d = 10
    points = np.zeros((3, d))
    points[0, 0], points[1, 0], points[2, :2] = 1.0, -1.0, 0.5
    shares = np.array([0.5, 0.25, 0.25])
    centroid = (shares[:, None] * points).sum(axis=0) / shares.sum()
    variances = np.array([0.0, 0.01, 10.0])  # exact, a little noise, noise far beyond its distance
    out = shrink_toward_centroid(points, variances, shares)
    gap2 = ((points - centroid) ** 2).sum(axis=1)
    keep = np.clip(1 - (d - 2) * variances / gap2, 0, 1)
    np.testing.assert_allclose(out, centroid + keep[:, None] * (points - centroid))
    np.testing.assert_array_equal(out[0], points[0])  # no noise: left where it is
    np.testing.assert_allclose(out[2], centroid)  # all noise: the centroid
    # In two dimensions or fewer the plain means are admissible: nothing moves.
    np.testing.assert_array_equal(shrink_toward_centroid(points[:, :2], variances, shares), points[:, :2])
    np.testing.assert_array_equal(shrink_toward_centroid(points[:1], variances[:1], shares[:1]), points[:1])
    with pytest.raises(ValueError, match="one variance and one share per point"):
        shrink_toward_centroid(points, variances[:2], shares)


def test_shrunk_candidates_err_less_than_the_plain_means() -> None:
    """Noisy candidates around well-spread true means: the shrinkage lowers the summed squared error (mean
    over seeded draws, paired, at least 4 standard errors below zero: a false failure under 1e-4)."""
    from ldp_collector.estimation.vector_sum import shrink_toward_centroid

    rng = np.random.default_rng(20261130)
    d, m, draws = 10, 30, 400
    truth = rng.uniform(-0.5, 0.5, (m, d))
    shares = rng.uniform(0.01, 0.1, m)
    variances = 0.02 / (shares / shares.max()) ** 2 / 50  # smaller keys carry more noise, as 1 / share^2
    diffs = []
    for _ in range(draws):
        noisy = truth + rng.normal(0.0, 1.0, (m, d)) * np.sqrt(variances)[:, None]
        shrunk = shrink_toward_centroid(noisy, variances, shares)
        diffs.append(((shrunk - truth) ** 2).sum() - ((noisy - truth) ** 2).sum())
    diff = np.asarray(diffs)
    assert diff.mean() + 4 * diff.std(ddof=1) / math.sqrt(draws) < 0
