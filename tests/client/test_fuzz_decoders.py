"""Property tests of every SDK decoder of untrusted bytes: hostile input raises only the documented
error, valid input round-trips, and no decoder allocates for lengths the input cannot back.

Decoders covered: packed report batches (:func:`~ldp_client.report.unpack_batch` and its column
form, which must agree position by position), single packed reports, wire payloads, packed round
specs (the server's broadcast is untrusted too) and, where protobuf is installed, the protobuf ->
SDK conversions of ``ldp_client.serde`` (round specs, reports, report columns, published
clusterings). Inputs are arbitrary bytes, arbitrary msgpack trees, and hostile mutations of valid
messages (``support.fuzz``).

The number of examples per property is ``LDP_TEST_FUZZ_EXAMPLES`` (a small CI default; the ``fuzz`` tox
environment runs the full count).
"""

from __future__ import annotations

import importlib.util
import math
import random
import struct
import tracemalloc
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ldp_client.errors import ProtocolError
from ldp_client.payload import Floats, HashedValue, Integers, Payload, SignedVector, payload_from_wire, payload_to_wire
from ldp_client.report import Report, ReportColumns, pack_batch, unpack_batch, unpack_batch_columns
from ldp_client.spec import RoundSpec
from support.fuzz import SPECS, Mutator, env_count, honest_reports, hostile_msgpack_bytes


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


HAVE_PROTO = _importable("google.protobuf") and _importable("ldp.v1")
needs_proto = pytest.mark.skipif(not HAVE_PROTO, reason="protobuf conversions need the [grpc] extra")

EXAMPLES = env_count("LDP_TEST_FUZZ_EXAMPLES", 200)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])

REPORTS = honest_reports(seed=7, n=40)
BATCH = pack_batch("batch-1", REPORTS)

# -- strategies ---------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40), st.binary(max_size=40),
    st.sampled_from([0, 1, 3, 4, 5, 6, 2**32 - 1, 2**32, 2**64 - 1, -1, "hist-grr", "grid.2d", b"\x00" * 16]))
trees = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=8), st.dictionaries(st.one_of(st.text(max_size=8), st.integers(0, 9)), inner,
                                                 max_size=4)), max_leaves=24)


def packable(value: Any) -> bytes | None:
    try:
        packed: bytes = msgpack.packb(value, use_bin_type=True)
    except (ValueError, OverflowError, TypeError):
        return None
    return packed


@st.composite
def mutated(draw: st.DrawFn, base: bytes) -> bytes:
    """A hostile mutation (one to three rounds) of the msgpack document ``base``."""
    mutator = Mutator(random.Random(draw(st.integers(0, 2**32 - 1))))
    data = base
    for _ in range(draw(st.integers(1, 3))):
        data = mutator.msgpack(data)
    return data


def batch_bytes() -> st.SearchStrategy[bytes]:
    """Arbitrary bytes, packed arbitrary trees, batches of arbitrary report-shaped items, mutated batches."""
    report_like = st.lists(trees, min_size=0, max_size=7).map(lambda items: [1, *items])
    shaped = st.tuples(st.one_of(st.just(1), scalars), st.one_of(st.text(min_size=1, max_size=9), scalars),
                       st.lists(st.one_of(report_like, trees), max_size=6)).map(list)
    return st.one_of(st.binary(max_size=300), trees.map(packable).filter(bool),  # type: ignore[arg-type]
                     shaped.map(packable).filter(bool), mutated(BATCH))  # type: ignore[arg-type]


# -- packed batches -----------------------------------------------------------------------------


def same_outcome(a: Report | ProtocolError, b: Report | ProtocolError) -> bool:
    if isinstance(a, ProtocolError) or isinstance(b, ProtocolError):
        return isinstance(a, ProtocolError) and isinstance(b, ProtocolError) and str(a) == str(b)
    return a == b


@FUZZ
@given(batch_bytes())
def test_unpack_batch_raises_only_protocol_error_and_both_forms_agree(data: bytes) -> None:
    try:
        request_id, reports = unpack_batch(data)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            unpack_batch_columns(data)
        return
    assert isinstance(request_id, str) and 1 <= len(request_id) <= 128
    assert all(isinstance(r, (Report, ProtocolError)) for r in reports)
    column_id, columns = unpack_batch_columns(data)
    assert column_id == request_id and isinstance(columns, ReportColumns)
    assert len(columns) == len(reports)
    for i, report in enumerate(reports):
        assert same_outcome(columns[i], report), (i, columns[i], report)
    # Decoded reports re-pack to a batch that decodes to the same reports.
    good = [r for r in reports if isinstance(r, Report)]
    assert unpack_batch(pack_batch(request_id, good)) == (request_id, good)


@FUZZ
@given(st.binary(max_size=200).map(lambda b: BATCH[: len(BATCH) * len(b) // 201] if b else BATCH[:0]) | mutated(BATCH))
def test_single_report_decoder_raises_only_protocol_error(data: bytes) -> None:
    for decode in (Report.unpack, unpack_batch):
        try:
            decode(data)
        except ProtocolError:
            pass


@FUZZ
@given(st.lists(st.sampled_from(REPORTS), min_size=0, max_size=30, unique_by=lambda r: r.report_id),
       st.text(min_size=1, max_size=128))
def test_valid_batches_round_trip(reports: list[Report], request_id: str) -> None:
    packed = pack_batch(request_id, reports)
    assert unpack_batch(packed) == (request_id, reports)
    column_id, columns = unpack_batch_columns(packed)
    assert column_id == request_id and list(columns) == reports
    for report in reports:
        assert Report.unpack(report.pack()) == report


# -- payloads -----------------------------------------------------------------------------------

payloads: st.SearchStrategy[Payload] = st.one_of(
    st.integers(0, 2**64 - 1), st.binary(max_size=64),
    st.builds(HashedValue, st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1)),
    st.builds(Integers, st.lists(st.integers(-(2**63), 2**63 - 1), max_size=8).map(tuple)),
    st.builds(Floats, st.lists(st.floats(width=32), max_size=8).map(tuple)),
    st.builds(SignedVector, st.integers(0, 2**32 - 1),
              st.one_of(st.binary(max_size=16), st.builds(Floats, st.lists(st.floats(width=32), max_size=4).map(tuple)))))


def same_payload(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to NaN (floats travel as IEEE float32)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_payload, a, b))
    return type(a) is type(b) and a == b


@FUZZ
@given(payloads)
def test_payloads_round_trip(payload: Payload) -> None:
    wire = payload_to_wire(payload)
    assert same_payload(payload_from_wire(wire), payload)
    assert same_payload(payload_from_wire(msgpack.unpackb(msgpack.packb(wire, use_bin_type=True), raw=False)), payload)


@FUZZ
@given(trees)
def test_payload_decoder_raises_only_protocol_error(value: Any) -> None:
    try:
        payload = payload_from_wire(value)
    except ProtocolError:
        return
    assert isinstance(payload, (int, bytes, HashedValue, Integers, Floats, SignedVector))
    assert not isinstance(payload, bool)


# -- round specs (the server's broadcast: untrusted on the device) ------------------------------


@FUZZ
@given(st.sampled_from(SPECS).flatmap(lambda spec: st.one_of(mutated(spec.pack()), st.just(spec.pack()))))
def test_round_spec_decoder_raises_only_protocol_error(data: bytes) -> None:
    try:
        spec = RoundSpec.unpack(data)
    except ProtocolError:
        return
    assert isinstance(spec, RoundSpec)
    assert RoundSpec.unpack(spec.pack()) == spec


@FUZZ
@given(st.binary(max_size=300) | trees.map(packable).filter(bool))  # type: ignore[arg-type]
def test_round_spec_decoder_on_arbitrary_input(data: bytes) -> None:
    try:
        RoundSpec.unpack(data)
    except ProtocolError:
        pass


def test_example_specs_round_trip() -> None:
    for spec in SPECS:
        assert RoundSpec.unpack(spec.pack()) == spec


# -- allocation bounded by the input ------------------------------------------------------------


def lying_document(rng: random.Random, base: bytes) -> bytes:
    """``base`` with hostile headers (huge declared lengths, deep nesting) spliced in."""
    depth = rng.choice([1, 8, 200, 1023, 1024, 5000])
    header = rng.choice([b"\xdd" + struct.pack(">I", rng.choice([100_000, 2**31, 2**32 - 1])),
                         b"\x91", b"\x9f", b"\xdc\xff\xff"])
    lie = header * depth + hostile_msgpack_bytes(rng)
    at = rng.randrange(len(base) + 1)
    return base[:at] + lie + base[at:]


@settings(max_examples=max(20, EXAMPLES // 20), deadline=None, database=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([BATCH, BATCH[:3] + b"\x91", *(s.pack() for s in SPECS)]))
def test_decoding_allocates_no_more_than_the_input_backs(seed: int, base: bytes) -> None:
    """A few kilobytes declaring 100 000-entry arrays a thousand levels deep must not cost megabytes."""
    data = lying_document(random.Random(seed), base)
    limit = 1024 * 1024 + 64 * len(data)  # interpreter noise plus what the bytes can really hold
    for decode in (unpack_batch, unpack_batch_columns, Report.unpack, RoundSpec.unpack):
        tracemalloc.start()
        try:
            decode(data)
        except ProtocolError:
            pass
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert peak <= limit, f"{decode.__qualname__}: {peak} bytes traced for {len(data)} input bytes"


def test_deeply_nested_lying_batch_is_refused_cheaply() -> None:
    """Regression: 1023 nested array32 headers each declaring 100 000 entries (5 KB of input)."""
    data = b"\x93\x01\xa1r" + (b"\xdd" + struct.pack(">I", 100_000)) * 1023
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError):
            unpack_batch(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024, peak


# -- protobuf -> SDK conversions ----------------------------------------------------------------


def _wire_mutations(base: bytes) -> st.SearchStrategy[bytes]:
    @st.composite
    def strategy(draw: st.DrawFn) -> bytes:
        mutator = Mutator(random.Random(draw(st.integers(0, 2**32 - 1))))
        data = base
        for _ in range(draw(st.integers(1, 4))):
            data = mutator.wire(data)
        return data

    return strategy()


if HAVE_PROTO:
    from google.protobuf.message import DecodeError

    from ldp.v1 import campaigns_pb2, reports_pb2
    from ldp_client import serde
    from ldp_client.clusters import CenterModel

    PROTO_SPECS = [serde.round_spec_to_proto(s).SerializeToString() for s in SPECS]
    PROTO_REPORTS = [serde.report_to_proto(r).SerializeToString() for r in REPORTS]
    CLUSTERING = campaigns_pb2.Result(campaign_id="c", state=campaigns_pb2.FINISHED,
                                      clustering=serde.cluster_model_to_proto(
                                          CenterModel(centers=((0.1, 0.2), (0.7, -0.5))))).SerializeToString()
else:  # the tests below are skipped
    PROTO_SPECS = PROTO_REPORTS = [b""]
    CLUSTERING = b""


def _parse(cls: Any, data: bytes) -> Any:
    try:
        return cls.FromString(data)
    except DecodeError:
        return None


@needs_proto
@FUZZ
@given(st.sampled_from(PROTO_SPECS).flatmap(_wire_mutations) | st.binary(max_size=200))
def test_round_spec_from_proto_raises_only_protocol_error(data: bytes) -> None:
    message = _parse(reports_pb2.RoundSpec, data)
    if message is None:
        return
    try:
        spec = serde.round_spec_from_proto(message)
    except ProtocolError:
        return
    assert serde.round_spec_from_proto(serde.round_spec_to_proto(spec)) == spec


@needs_proto
@FUZZ
@given(st.lists(st.sampled_from(PROTO_REPORTS).flatmap(_wire_mutations) | st.sampled_from(PROTO_REPORTS),
                min_size=1, max_size=6))
def test_report_conversions_raise_only_protocol_error_and_agree(items: list[bytes]) -> None:
    messages = [m for m in (_parse(reports_pb2.Report, d) for d in items) if m is not None]
    singles: list[Report | ProtocolError] = []
    for message in messages:
        try:
            singles.append(serde.report_from_proto(message))
        except ProtocolError as exc:
            singles.append(exc)
    columns = serde.report_columns_from_proto(messages)
    assert len(columns) == len(singles)
    for i, single in enumerate(singles):
        got = columns[i]
        assert isinstance(got, ProtocolError) == isinstance(single, ProtocolError), (i, got, single)
        if isinstance(single, Report):
            assert got == single
            assert serde.report_from_proto(serde.report_to_proto(single)) == single


@needs_proto
@FUZZ
@given(_wire_mutations(CLUSTERING) | st.binary(max_size=200))
def test_cluster_model_from_proto_raises_only_protocol_error(data: bytes) -> None:
    message = _parse(campaigns_pb2.Result, data)
    if message is None:
        return
    try:
        serde.cluster_model_from_proto(message)
    except ProtocolError:
        pass
