"""Bucketized vector sum (device side): the encoder, the mechanism and the SignedVector payload.

* privacy, exactly: with the 32-bit seed held fixed, every other coin of the real ``randomize`` is
  enumerated (box shape, D = d + 1 = 2 and 3); the largest ratio P[y | b, v] / P[y | b', v'] over
  encoder outputs in two buckets of opposite signs is exactly the inner box mechanism's r <= e^eps
  (tight), and each input's output distribution is the inner mechanism's on sigma v;
* unbiasedness for a fixed seed, exactly: sum_y P[y | b, v] sigma(c) z(y) == sigma(c) sigma(b) v;
* structure for both shapes: the report is (the seed drawn first, the inner report on sigma v or
  sigma v / sqrt(D)), bit for bit;
* wire round trips (msgpack payload and report, protobuf report and columns, round specs with the
  component through protobuf and msgpack), strict parsing of malformed payloads;
* clear errors for bad parameters, values and payloads.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from fractions import Fraction
from typing import Any

import msgpack
import pytest

pytest.importorskip("google.protobuf")
pytest.importorskip("ldp.v1")

from ldp.v1 import encoders_pb2 as enc
from ldp.v1 import mechanisms_pb2 as mech
from ldp.v1 import reports_pb2
from ldp_client import serde
from ldp_client.encoders import (
    BUCKET_VECTOR,
    ENCODERS,
    BucketedVectorEncoder,
    NearestCandidateEncoder,
    NumericDomain,
    RandomProjection,
    ShiftedGridEncoder,
    SimHashEncoder,
    SymmetricBoxEncoder,
)
from ldp_client.errors import EncodingError, InvalidParameterError, ProtocolError
from ldp_client.mechanisms import MECHANISMS, BucketizedVectorParams, VectorBoxParams, VectorPrivUnitParams, VectorShape
from ldp_client.mechanisms.bucketized_vector import sign
from ldp_client.mechanisms.local_hashing import hash_value
from ldp_client.payload import Floats, SignedVector, payload_from_wire, payload_to_wire, unpack_bits
from ldp_client.report import Report, pack_batch, unpack_batch, unpack_batch_columns
from ldp_client.rng import Rng, SeededRng, _RngBase
from ldp_client.spec import Component, GroupTask, RoundSpec
from support.exact import EnumeratingRng, max_privacy_ratio, output_distribution
from support.stats import assert_unbiased

DOMAIN = NumericDomain(lower=(0.0, -2.0), upper=(10.0, 2.0))
SIMHASH = SimHashEncoder(domain=DOMAIN, bits=5, seed=17)
GRID = ShiftedGridEncoder(domain=DOMAIN, level=3, seed=99)
NEAREST = NearestCandidateEncoder(domain=DOMAIN, dimension=2, centers=(1.0, 0.0, 5.0, 1.0, 9.0, -1.0))


def _box(bucket_bits: int = 8, dimension: int = 3, epsilon: float = 1.0) -> BucketizedVectorParams:
    return BucketizedVectorParams(bucket_bits=bucket_bits, dimension=dimension, epsilon=epsilon, shape=VectorShape.BOX)


def _ball(bucket_bits: int = 8, dimension: int = 3, epsilon: float = 1.0) -> BucketizedVectorParams:
    return BucketizedVectorParams(bucket_bits=bucket_bits, dimension=dimension, epsilon=epsilon,
                                  shape=VectorShape.L2_BALL)


def _privunit(bucket_bits: int = 8, dimension: int = 3, epsilon: float = 1.0) -> BucketizedVectorParams:
    return BucketizedVectorParams(bucket_bits=bucket_bits, dimension=dimension, epsilon=epsilon,
                                  shape=VectorShape.PRIVUNIT)


# ---------------------------------------------------------------------------------------------- encoder


@pytest.mark.parametrize("lsh", [SIMHASH, GRID], ids=["simhash", "shifted_grid"])
@pytest.mark.parametrize("point", [(3.0, 1.5), (-4.0, 7.0), (10.0, -2.0), (0.0, 0.0), (7.3, -0.1)])
def test_encoder_gives_the_lsh_bucket_and_the_centred_point_with_a_one(lsh: Any, point: tuple[float, float]) -> None:
    encoder = (BucketedVectorEncoder(domain=DOMAIN, simhash=lsh) if isinstance(lsh, SimHashEncoder)
               else BucketedVectorEncoder(domain=DOMAIN, shifted_grid=lsh))
    bucket, vector = encoder.encode(point)
    assert bucket == lsh.encode(point) and 0 <= bucket < 2**encoder.bucket_bits
    assert vector == (*SymmetricBoxEncoder(domain=DOMAIN).encode(point), 1.0)
    assert len(vector) == encoder.output_size == 3
    assert all(-1.0 <= v <= 1.0 for v in vector)
    assert encoder.VALUE_KIND == BUCKET_VECTOR and encoder.lsh is lsh


def test_encoder_bucket_bits() -> None:
    assert BucketedVectorEncoder(domain=DOMAIN, simhash=SIMHASH).bucket_bits == 5
    assert BucketedVectorEncoder(domain=DOMAIN, shifted_grid=GRID).bucket_bits == 6  # level 3 x k = 2
    projected = ShiftedGridEncoder(domain=DOMAIN, level=20, seed=1,
                                   projection=RandomProjection(input_dimension=2, output_dimension=3, seed=4))
    encoder = BucketedVectorEncoder(domain=DOMAIN, shifted_grid=projected)
    assert encoder.bucket_bits == 60 and projected.output_size == 2**60
    assert BucketedVectorEncoder(domain=DOMAIN, shifted_grid=ShiftedGridEncoder(domain=DOMAIN, level=0,
                                                                                seed=1)).bucket_bits == 0
    for point in ((1.0, 1.0), (9.0, -1.5)):
        assert 0 <= encoder.encode(point)[0] < 2**60


def test_encoder_refuses_bad_specs() -> None:
    with pytest.raises(InvalidParameterError, match="exactly one of simhash, shifted_grid and nearest"):
        BucketedVectorEncoder(domain=DOMAIN)
    with pytest.raises(InvalidParameterError, match="exactly one of simhash, shifted_grid and nearest"):
        BucketedVectorEncoder(domain=DOMAIN, simhash=SIMHASH, shifted_grid=GRID)
    with pytest.raises(InvalidParameterError, match="simhash domain must equal the encoder's domain"):
        BucketedVectorEncoder(domain=NumericDomain.unit(2), simhash=SIMHASH)
    with pytest.raises(TypeError, match="simhash must be a SimHashEncoder or None, got ShiftedGridEncoder"):
        BucketedVectorEncoder(domain=DOMAIN, simhash=GRID)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="shifted_grid must be a ShiftedGridEncoder"):
        BucketedVectorEncoder(domain=DOMAIN, shifted_grid=SIMHASH)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="domain must be a NumericDomain"):
        BucketedVectorEncoder(domain=(0.0, 1.0), simhash=SIMHASH)  # type: ignore[arg-type]
    wide = NumericDomain.unit(4096)
    with pytest.raises(InvalidParameterError, match="at most 4095"):
        BucketedVectorEncoder(domain=wide, simhash=SimHashEncoder(domain=wide, bits=3, seed=1))


def test_encoder_with_a_nearest_candidate_bucket() -> None:
    encoder = BucketedVectorEncoder(domain=DOMAIN, nearest=NEAREST)
    assert encoder.bucket_bits == 2 and encoder.output_size == 3
    for point in ([0.0, 0.0], [5.5, 1.5], [9.0, -2.0], [4.0, 0.0]):
        bucket, vector = encoder.encode(point)
        assert bucket == NEAREST.encode(point)
        assert vector == (*SymmetricBoxEncoder(domain=DOMAIN).encode(point), 1.0)
    one = NearestCandidateEncoder(domain=DOMAIN, dimension=2, centers=(1.0, 0.0))
    assert BucketedVectorEncoder(domain=DOMAIN, nearest=one).bucket_bits == 1
    with pytest.raises(InvalidParameterError, match="exactly one"):
        BucketedVectorEncoder(domain=DOMAIN, simhash=SIMHASH, nearest=NEAREST)
    with pytest.raises(TypeError, match="nearest must be a NearestCandidateEncoder"):
        BucketedVectorEncoder(domain=DOMAIN, nearest=SIMHASH)  # type: ignore[arg-type]
    message = serde.encoder_to_proto(encoder)
    assert message.bucketed_vector.HasField("nearest")
    assert serde.encoder_from_proto(message) == encoder
    assert ENCODERS.load(ENCODERS.dump(encoder)) == encoder


def test_encoder_refuses_bad_points() -> None:
    encoder = BucketedVectorEncoder(domain=DOMAIN, simhash=SIMHASH)
    for bad in ([math.nan, 0.0], [0.0], [0.0, math.inf], "ab", [0.0, "x"]):
        with pytest.raises(EncodingError):
            encoder.encode(bad)


@pytest.mark.parametrize("encoder", [
    BucketedVectorEncoder(domain=DOMAIN, simhash=SIMHASH),
    BucketedVectorEncoder(domain=DOMAIN, shifted_grid=GRID),
    BucketedVectorEncoder(domain=DOMAIN, simhash=SimHashEncoder(
        domain=DOMAIN, bits=64, seed=2**64 - 1, projection=RandomProjection(input_dimension=2, output_dimension=5,
                                                                            seed=3))),
], ids=["simhash", "shifted_grid", "projected_simhash"])
def test_encoder_round_trips_through_msgpack_dicts_and_protobuf(encoder: BucketedVectorEncoder) -> None:
    dumped = ENCODERS.dump(encoder)
    assert dumped["bucketed_vector"]["simhash" if encoder.simhash is None else "shifted_grid"] is None
    wire = msgpack.unpackb(msgpack.packb(dumped, use_bin_type=True), raw=False)
    assert ENCODERS.load(wire) == encoder
    message = serde.encoder_to_proto(encoder)
    assert message.WhichOneof("encoder") == "bucketed_vector"
    assert message.bucketed_vector.HasField("simhash") is (encoder.simhash is not None)
    assert message.bucketed_vector.HasField("shifted_grid") is (encoder.shifted_grid is not None)
    again = serde.encoder_from_proto(enc.EncoderSpec.FromString(message.SerializeToString()))
    assert again == encoder and type(again) is BucketedVectorEncoder


def test_encoder_from_proto_refuses_neither_or_both_lsh() -> None:
    domain = enc.NumericDomain(lower=[0.0, -2.0], upper=[10.0, 2.0])
    neither = enc.EncoderSpec(bucketed_vector=enc.BucketedVectorEncoder(domain=domain))
    with pytest.raises(ProtocolError, match=r"encoder\.bucketed_vector: .*exactly one of simhash, shifted_grid and nearest"):
        serde.encoder_from_proto(neither)
    both = enc.EncoderSpec(bucketed_vector=enc.BucketedVectorEncoder(
        domain=domain, simhash=enc.SimHashEncoder(domain=domain, bits=3, seed=1),
        shifted_grid=enc.ShiftedGridEncoder(domain=domain, level=2, seed=1)))
    with pytest.raises(ProtocolError, match="exactly one"):
        serde.encoder_from_proto(both)
    with pytest.raises(ProtocolError, match="exactly one"):
        ENCODERS.load({"bucketed_vector": {"domain": DOMAIN.to_dict(), "simhash": None}})
    with pytest.raises(ProtocolError):
        ENCODERS.load({"bucketed_vector": {"domain": DOMAIN.to_dict(), "simhash": "garbage"}})


# ---------------------------------------------------------------------------------------------- parameters


def test_parameters_round_trip_and_derived_constants() -> None:
    for params in (_box(), _ball(), _box(bucket_bits=0, dimension=1), _ball(bucket_bits=64, dimension=4096)):
        assert MECHANISMS.load(MECHANISMS.dump(params)) == params
        wire = msgpack.unpackb(msgpack.packb(MECHANISMS.dump(params), use_bin_type=True), raw=False)
        assert MECHANISMS.load(wire) == params
        message = serde.mechanism_to_proto(params)
        assert message.WhichOneof("mechanism") == "bucketized_vector"
        assert serde.mechanism_from_proto(mech.MechanismSpec.FromString(message.SerializeToString())) == params
        assert params.realized_epsilon == params.inner.realized_epsilon <= params.epsilon
        assert params.inner.dimension == params.dimension == params.input_size
    box, ball = _box(dimension=5), _ball(dimension=5)
    assert box.payload_bits == 32 + 5 and ball.payload_bits == 32 + 32 * 5
    assert box.report_second_moment == box.inner.scale**2 == box.decode_scale**2
    assert ball.report_second_moment == pytest.approx(ball.inner.scale**2, rel=1e-12)
    assert ball.decode_scale == pytest.approx(math.sqrt(5) * ball.inner.scale, rel=1e-15)
    assert box.sum_variance(100) == 100 * box.report_second_moment
    assert box.sum_variance(100, 7.5) == 100 * box.report_second_moment - 7.5
    message = mech.MechanismSpec(bucketized_vector=mech.BucketizedVector(
        bucket_bits=12, dimension=4, epsilon=2.0, shape=mech.BucketizedVector.BOX))
    assert serde.mechanism_from_proto(message) == _box(bucket_bits=12, dimension=4, epsilon=2.0)


def test_bad_parameters() -> None:
    with pytest.raises(InvalidParameterError, match=r"bucket_bits must be in \[0, 64\], got 65"):
        _box(bucket_bits=65)
    with pytest.raises(InvalidParameterError, match=r"dimension must be in \[1, 4096\], got 0"):
        _box(dimension=0)
    with pytest.raises(InvalidParameterError, match=r"dimension must be in \[1, 4096\], got 4097"):
        _ball(dimension=4097)
    with pytest.raises(InvalidParameterError, match="epsilon must be in"):
        _box(epsilon=0.0)
    with pytest.raises(InvalidParameterError, match="epsilon must be at least"):
        _box(epsilon=1e-15)
    for shape in (0, 4):
        with pytest.raises(InvalidParameterError,
                           match=rf"shape must be L2_BALL \(1\), BOX \(2\) or PRIVUNIT \(3\), got {shape}"):
            BucketizedVectorParams(bucket_bits=1, dimension=2, epsilon=1.0, shape=shape)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="shape must be a VectorShape, got bool"):
        BucketizedVectorParams(bucket_bits=1, dimension=2, epsilon=1.0, shape=True)  # type: ignore[arg-type]
    assert BucketizedVectorParams(bucket_bits=1, dimension=2, epsilon=1.0, shape=2).shape is VectorShape.BOX  # type: ignore[arg-type]
    unspecified = mech.MechanismSpec(bucketized_vector=mech.BucketizedVector(bucket_bits=3, dimension=2, epsilon=1.0))
    with pytest.raises(ProtocolError, match=r"mechanism\.bucketized_vector\.shape"):
        serde.mechanism_from_proto(unspecified)
    with pytest.raises(ProtocolError):
        MECHANISMS.load({"bucketized_vector": {"bucket_bits": 3, "dimension": 2, "epsilon": 1.0}})


def test_component_checks_kind_and_size() -> None:
    encoder = BucketedVectorEncoder(domain=DOMAIN, simhash=SIMHASH)
    component = Component(encoder=encoder, mechanism=_box(bucket_bits=5, dimension=3))
    payload = component.run((4.0, 0.5), rng=SeededRng(1))
    assert component.mechanism.check_payload(payload) == payload
    with pytest.raises(InvalidParameterError, match="output size 3 does not match"):
        Component(encoder=encoder, mechanism=_box(bucket_bits=5, dimension=4))
    with pytest.raises(InvalidParameterError, match="randomizes bucket_vector values"):
        Component(encoder=SymmetricBoxEncoder(domain=DOMAIN), mechanism=_box(bucket_bits=5, dimension=2))
    narrow = Component(encoder=encoder, mechanism=_box(bucket_bits=1, dimension=3))  # not checked by Component
    with pytest.raises(EncodingError, match=r"bucket must be in \[0, 2\^1\)"):
        for x in range(11):
            narrow.run((float(x), float(x) / 3 - 1.5), rng=SeededRng(x))


# ---------------------------------------------------------------------------------------------- exact privacy


class _FixedSeed(_RngBase):
    """The first 32-bit draw returns ``seed``; every other draw goes to ``inner`` (an enumerating rng)."""

    def __init__(self, seed: int, inner: Rng) -> None:
        self.seed: int | None = seed
        self.inner = inner

    def randbits(self, k: int) -> int:
        if self.seed is not None and k == 32:
            seed, self.seed = self.seed, None
            return seed
        return self.inner.randbits(k)

    def randbelow(self, n: int) -> int:
        return self.inner.randbelow(n)

    def bernoulli(self, num: int, den: int) -> bool:
        return self.inner.bernoulli(num, den)

    def token_bytes(self, n: int) -> bytes:
        return self.inner.token_bytes(n)


_CACHE: dict[tuple[Any, ...], dict[Hashable, Fraction]] = {}


def _distribution(params: BucketizedVectorParams, seed: int, bucket: int,
                  vector: Sequence[float]) -> dict[Hashable, Fraction]:
    """Exact output distribution of the real ``randomize`` with the seed held at ``seed``."""
    key = (params, seed, bucket, tuple(vector))
    if key not in _CACHE:
        def run(rng: EnumeratingRng) -> Hashable:
            payload = params.randomize((bucket, list(vector)), rng=_FixedSeed(seed, rng))
            assert payload.seed == seed
            return payload
        _CACHE[key] = output_distribution(run)
    return _CACHE[key]


def _inner_distribution(params: BucketizedVectorParams, x: Sequence[float]) -> dict[Hashable, Fraction]:
    key = ("inner", params, tuple(x))
    if key not in _CACHE:
        _CACHE[key] = output_distribution(lambda rng: params.inner.randomize(list(x), rng=rng))
    return _CACHE[key]


SEEDS = (0, 12345, 2**32 - 1)


def _buckets_of_both_signs(seed: int, bits: int) -> tuple[int, int]:
    plus = next(b for b in range(2**bits) if sign(seed, b) == 1)
    minus = next(b for b in range(2**bits) if sign(seed, b) == -1)
    return plus, minus


def _encoder_vectors(d: int) -> list[tuple[float, ...]]:
    """Box vectors (2t - 1, 1) the encoder can produce: corners and interior points of [-1, 1]^d."""
    corners = [(*c, 1.0) for c in itertools.product((-1.0, 1.0), repeat=d)]
    return corners + [(*[0.5, -0.25][:d], 1.0), (*[0.0] * d, 1.0)]


@pytest.mark.parametrize("dimension", [2, 3])  # D = d + 1
@pytest.mark.parametrize("epsilon", [0.5, 1.0, math.log(9)])
@pytest.mark.parametrize("seed", SEEDS)
def test_exact_privacy_ratio_for_a_fixed_seed(dimension: int, epsilon: float, seed: int) -> None:
    """max over outputs and inputs (b, v), (b', v') of P[y | b, v] / P[y | b', v'] is r <= e^eps, attained."""
    params = _box(bucket_bits=4, dimension=dimension, epsilon=epsilon)
    plus, minus = _buckets_of_both_signs(seed, 4)
    inputs = [(b, v) for b in (plus, minus) for v in _encoder_vectors(dimension - 1)]
    dists = [_distribution(params, seed, b, v) for b, v in inputs]
    ratio = max_privacy_ratio(dists)
    assert ratio == params.inner.ratio  # tight: (plus, v) against (minus, v) feeds the inner u and -u
    assert ratio <= Fraction(math.exp(epsilon))
    assert math.log(ratio) <= epsilon
    # Any box vector (not only encoder outputs) keeps the bound.
    extra = [(plus, c) for c in itertools.product((-1.0, 1.0), repeat=dimension)] + [(minus, (0.3,) * dimension)]
    assert max_privacy_ratio(dists + [_distribution(params, seed, b, v) for b, v in extra]) == params.inner.ratio


@pytest.mark.parametrize("dimension", [2, 3])
@pytest.mark.parametrize("seed", SEEDS)
def test_for_a_fixed_seed_the_report_is_the_inner_mechanism_on_the_signed_vector(dimension: int, seed: int) -> None:
    params = _box(bucket_bits=4, dimension=dimension, epsilon=1.0)
    for bucket in _buckets_of_both_signs(seed, 4):
        sigma = sign(seed, bucket)
        for v in _encoder_vectors(dimension - 1):
            dist = _distribution(params, seed, bucket, v)
            inner = _inner_distribution(params, [sigma * x for x in v])
            assert dist == {SignedVector(seed, y): p for y, p in inner.items()}  # type: ignore[arg-type]


@pytest.mark.parametrize("dimension", [2, 3])
def test_estimate_is_exactly_unbiased_for_a_fixed_seed(dimension: int) -> None:
    """sum_y P[y | b, v] sigma_s(c) z(y) == sigma_s(c) sigma_s(b) v in exact rationals, for every c."""
    params = _box(bucket_bits=4, dimension=dimension, epsilon=1.0)
    seed = 777
    assert isinstance(params.inner, VectorBoxParams)
    scale = params.inner.scale_exact
    for bucket in range(16):
        for v in _encoder_vectors(dimension - 1):
            dist = _distribution(params, seed, bucket, v)
            for c in (bucket, (bucket + 1) % 16, (bucket + 5) % 16):
                mean = [Fraction(0)] * dimension
                for y, p in dist.items():
                    assert isinstance(y, SignedVector) and isinstance(y.inner, bytes)
                    for j, bit in enumerate(unpack_bits(y.inner, dimension)):
                        mean[j] += p * sign(seed, c) * (scale if bit else -scale)
                assert mean == [sign(seed, c) * sign(seed, bucket) * Fraction(x) for x in v]


@pytest.mark.parametrize("make", [_box, _ball, _privunit], ids=["box", "ball", "privunit"])
@pytest.mark.parametrize("dimension", [1, 3, 8])
def test_report_is_seed_then_inner_report_of_the_signed_vector(make: Any, dimension: int) -> None:
    """Bit for bit, for both shapes: the first 32-bit draw is the seed, then the inner randomizer runs."""
    params = make(bucket_bits=16, dimension=dimension, epsilon=1.5)
    vector = [1.0 - 2.0 * j / max(1, dimension) for j in range(dimension)]
    for k in range(40):
        bucket = (k * 7919) % 2**16
        payload = params.randomize((bucket, vector), rng=SeededRng(k))
        replay = SeededRng(k)
        seed = replay.randbits(32)
        sigma = 1 - 2 * hash_value(seed, bucket, 2)
        factor = sigma if params.shape == VectorShape.BOX else sigma / math.sqrt(dimension)
        assert payload == SignedVector(seed, params.inner.randomize([factor * x for x in vector], rng=replay))
        assert params.check_payload(payload) == payload
        z = params.decode(payload)
        assert params.estimate(payload, bucket) == [sigma * x for x in z]
        if params.shape != VectorShape.BOX:
            assert isinstance(payload.inner, Floats)
            assert z == [params.decode_scale * w for w in payload.inner.values]
            assert math.fsum(x * x for x in z) == pytest.approx(params.decode_scale**2, rel=1e-5)


def test_sign_is_the_local_hashing_hash_with_two_buckets() -> None:
    rng = SeededRng(5)
    for _ in range(200):
        seed, bucket = rng.randbits(32), rng.randbits(64)
        assert sign(seed, bucket) == (1 if hash_value(seed, bucket, 2) == 0 else -1)
    with pytest.raises(InvalidParameterError):
        sign(2**32, 0)


# ---------------------------------------------------------------------------------------------- wire forms


def _payloads() -> list[SignedVector]:
    rng = SeededRng(9)
    box, ball = _box(bucket_bits=10, dimension=11), _ball(bucket_bits=10, dimension=4)
    out = [box.randomize((i, [0.25] * 10 + [1.0]), rng=rng) for i in range(3)]
    out += [ball.randomize((i, [-0.5, 0.0, 0.5, 1.0]), rng=rng) for i in range(3)]
    return out + [SignedVector(0, b""), SignedVector(2**32 - 1, Floats(()))]


def test_payload_msgpack_round_trip() -> None:
    for payload in _payloads():
        wire = payload_to_wire(payload)
        assert wire[0] == 6 and wire[1] == payload.seed
        assert wire[2] == payload_to_wire(payload.inner)
        again = payload_from_wire(msgpack.unpackb(msgpack.packb(wire, use_bin_type=True), raw=False))
        assert isinstance(again, SignedVector)
        assert again == payload and type(again.inner) is type(payload.inner)
    assert len(msgpack.packb(payload_to_wire(_payloads()[0]), use_bin_type=True)) <= 1 + 1 + 5 + 2 + 2


@pytest.mark.parametrize("wire", [
    [6, 2**32, b"\x00"], [6, -1, b"\x00"], [6, True, b"\x00"], [6, 1.0, b"\x00"], [6, 1], [6, 1, b"\x00", 0],
    [6, 1, 5], [6, 1, "ab"], [6, 1, [4, [1]]], [6, 1, [5, b"\x00"]], [6, 1, [5]], [6, 1, []], [6, 1, None],
    [6, 1, [6, 1, b"\x00"]], [6, 1, [3, 1, 2]],
])
def test_malformed_payload_wire_is_a_protocol_error(wire: list[Any]) -> None:
    with pytest.raises(ProtocolError):
        payload_from_wire(wire)


def test_payload_to_wire_refuses_an_unknown_inner() -> None:
    with pytest.raises(ProtocolError, match="inner payload must be bytes or Floats"):
        payload_to_wire(SignedVector(1, 5))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="inner payload must be bytes or Floats"):
        serde.report_to_proto(Report(report_id=bytes(16), campaign_id="c", round=1, group=0,
                                     payloads=(SignedVector(1, 5),)))  # type: ignore[arg-type]


def _report(payloads: tuple[Any, ...]) -> Report:
    return Report(report_id=bytes(range(16)), campaign_id="vec-1", round=2, group=3, payloads=payloads)


def test_report_round_trips_through_protobuf_and_msgpack() -> None:
    payloads = _payloads()
    report = _report((payloads[0], payloads[3], 7, payloads[-2]))
    message = serde.report_to_proto(report)
    assert [p.WhichOneof("value") for p in message.payloads] == ["signed_vector", "signed_vector", "index",
                                                                  "signed_vector"]
    assert message.payloads[0].signed_vector.WhichOneof("inner") == "bits"
    assert message.payloads[1].signed_vector.WhichOneof("inner") == "floats"
    assert message.payloads[3].signed_vector.WhichOneof("inner") == "bits"  # empty bits are still set
    parsed = serde.report_from_proto(reports_pb2.Report.FromString(message.SerializeToString()))
    assert parsed == report == Report.unpack(report.pack())
    columns = serde.report_columns_from_proto([message, serde.report_to_proto(_report((payloads[4],)))])
    assert not columns.errors and list(columns) == [report, _report((payloads[4],))]
    packed = pack_batch("req", [report, _report((payloads[5],))])
    assert unpack_batch(packed)[1] == [report, _report((payloads[5],))]
    assert list(unpack_batch_columns(packed)[1]) == [report, _report((payloads[5],))]


def test_protobuf_signed_vector_without_inner_is_a_protocol_error() -> None:
    message = serde.report_to_proto(_report((_payloads()[0],)))
    message.payloads[0].signed_vector.ClearField("bits")
    with pytest.raises(ProtocolError, match=r"report\.payloads\[0\]\.signed_vector: no inner value is set"):
        serde.report_from_proto(message)
    columns = serde.report_columns_from_proto([message])
    assert isinstance(columns.errors.get(0), ProtocolError)


def test_round_spec_with_the_component_round_trips() -> None:
    component = Component(encoder=BucketedVectorEncoder(domain=DOMAIN, shifted_grid=GRID),
                          mechanism=_ball(bucket_bits=6, dimension=3, epsilon=2.0))
    spec = RoundSpec(campaign_id="vec-1", round=1, group_weights=(1,), campaign_epsilon=2.0,
                     tasks=(GroupTask(groups=(0,), components=(component,)),))
    message = serde.round_spec_to_proto(spec)
    assert serde.round_spec_from_proto(reports_pb2.RoundSpec.FromString(message.SerializeToString())) == spec
    assert RoundSpec.unpack(spec.pack()) == spec


# ---------------------------------------------------------------------------------------------- bad values


@pytest.mark.parametrize("make", [_box, _ball], ids=["box", "ball"])
def test_bad_values_raise_clear_errors(make: Any) -> None:
    params = make(bucket_bits=4, dimension=3)
    good = [0.0, 0.5, 1.0]
    params.randomize((15, good), rng=SeededRng(1))
    params.randomize([0, tuple(good)], rng=SeededRng(1))
    cases: list[tuple[Any, type[Exception], str]] = [
        ((16, good), EncodingError, r"bucket must be in \[0, 2\^4\), got 16"),
        ((-1, good), EncodingError, r"bucket must be in \[0, 2\^4\), got -1"),
        ((True, good), TypeError, "bucket must be an int, got bool"),
        ((1.0, good), TypeError, "bucket must be an int, got float"),
        ((1, [0.0, 0.5]), EncodingError, "must have dimension 3, got 2"),
        ((1, [0.0, math.nan, 1.0]), EncodingError, "coordinate 1 must be finite"),
        ((1, [0.0, 0.5, math.inf]), EncodingError, "coordinate 2 must be finite"),
        ((1, [0.0, 1.5, 1.0]), EncodingError, r"coordinate 1 must be in \[-1, 1\], got 1.5"),
        ((1, [-1.0000001, 0.0, 1.0]), EncodingError, r"coordinate 0 must be in \[-1, 1\]"),
        ((1, [0.0, "a", 1.0]), TypeError, "coordinate 1 must be a real number"),
        ((1, "abc"), TypeError, "must be a list or tuple"),
        ((1, good, 3), TypeError, r"must be a pair \(bucket, vector\)"),
        (5, TypeError, r"must be a pair \(bucket, vector\)"),
    ]
    for value, error, message in cases:
        with pytest.raises(error, match=message):
            params.randomize(value, rng=SeededRng(1))


def test_bad_payloads_are_protocol_errors() -> None:
    box, ball = _box(bucket_bits=4, dimension=3), _ball(bucket_bits=4, dimension=2)
    good_box = box.randomize((1, [0.0, 0.0, 1.0]), rng=SeededRng(2))
    good_ball = ball.randomize((1, [0.6, 0.8]), rng=SeededRng(2))
    assert box.check_payload(good_box) == good_box and ball.check_payload(good_ball) == good_ball
    cases: list[tuple[BucketizedVectorParams, Any, str]] = [
        (box, (1, b"\x00"), "must be a SignedVector, got an array of 2 items"),
        (box, b"\x00", "must be a SignedVector, got 1 byte$"),
        (box, SignedVector(2**32, b"\x00"), r"seed must be in \[0, 2\^32\)"),
        (box, SignedVector(-1, b"\x00"), r"seed must be in \[0, 2\^32\)"),
        (box, SignedVector(True, b"\x00"), r"seed must be in \[0, 2\^32\)"),
        (box, SignedVector(1, b"\x08"), "inner payload: vector_box payload has bits set beyond the dimension 3"),
        (box, SignedVector(1, b"\x00\x00"), "inner payload: vector_box payload must be 1 bytes"),
        (box, SignedVector(1, Floats((1.0, 0.0, 0.0))), "inner payload: vector_box payload must be 1 bytes"),
        (ball, SignedVector(1, b"\x00"), "inner payload: vector_l2_ball payload must be Floats"),
        (ball, SignedVector(1, Floats((1.0,))), "must hold 2 floats"),
        (ball, SignedVector(1, Floats((0.5, 0.5))), "must be a unit vector"),
        (ball, SignedVector(1, Floats((math.nan, 1.0))), "must be finite floats"),
    ]
    for params, payload, message in cases:
        with pytest.raises(ProtocolError, match=message):
            params.check_payload(payload)
    with pytest.raises(ProtocolError):
        box.estimate(b"\x00", 1)
    with pytest.raises(InvalidParameterError, match=r"bucket must be in \[0, 15\]"):
        box.estimate(good_box, 16)


def test_privunit_bucket_sum_is_unbiased_within_its_second_moment() -> None:
    """E[sigma_s(b) z] = v for the reports' own bucket; the tolerance is 5.3 sigma of the mean (Bonferroni over 4)."""
    params = _privunit(bucket_bits=6, dimension=4, epsilon=2.0)
    assert isinstance(params.inner, VectorPrivUnitParams)
    assert params.decode_scale == pytest.approx(2.0 * params.inner.scale)
    v = [0.5, -1.0, 0.25, 1.0]
    n = 6000
    rng = SeededRng(31)
    sums = [0.0] * 4
    for _ in range(n):
        for j, x in enumerate(params.estimate(params.randomize((9, v), rng=rng), 9)):
            sums[j] += x
    for j in range(4):
        assert_unbiased(sums[j] / n, v[j], math.sqrt(params.report_second_moment / n), z=5.3)


def test_mean_second_moment_is_the_squared_norm_per_coordinate() -> None:
    """Ball and box: equal to M; PrivUnit: B'^2 exactly (unit reports), below its worst-coordinate M."""
    for make in (_box, _ball):
        params = make(dimension=11)
        assert params.report_mean_second_moment == pytest.approx(params.report_second_moment, rel=1e-12)
    params = _privunit(dimension=11)
    assert isinstance(params.inner, VectorPrivUnitParams)
    assert params.report_mean_second_moment == pytest.approx(params.inner.scale**2, rel=1e-12)
    assert params.report_mean_second_moment < params.report_second_moment
    rng = SeededRng(4)
    for _ in range(20):
        z = params.decode(params.randomize((3, [0.5] * 10 + [1.0]), rng=rng))
        assert math.fsum(v * v for v in z) / 11 == pytest.approx(params.report_mean_second_moment, rel=1e-5)
