"""The batch-wide ingestion path gives exactly what the per-report path gives.

Each layer is checked against its per-report reference on mixed batches -- valid reports, invalid
ones (every rejection rule), malformed ones, duplicates within and across requests, replayed
request ids, unknown, finished and malformed campaign ids:

* decoding: ``unpack_batch_columns`` against ``unpack_batch``, ``report_columns_from_proto``
  against ``report_from_proto`` (same reports, same errors, position for position);
* validation: ``validate_batch`` on a ``ReportColumns`` against ``validate_batch`` on the
  ``Report`` objects (same rejections and reasons, same stored rows and bytes);
* whole collectors on SQLite stores, one fed ``ReportColumns`` and one fed lists: same outcomes
  and reasons, same stored reports (bytes and order), same accumulator blobs -- also equal to a
  rebuild from the raw reports, including under concurrent group commits;
* the service's response encoding against protobuf's own (byte for byte).

Further tests prove that the fast paths are taken (no per-report decoding, validation or msgpack
decoding for a normal batch).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ldp.v1 import campaigns_pb2, reports_pb2, service_pb2
from ldp_client import serde
from ldp_client.encoders import BitVectorEncoder, NumericDomain
from ldp_client.encoders.bucketed import BucketedVectorEncoder
from ldp_client.encoders.categorical import CategoricalEncoder
from ldp_client.encoders.lsh import ShiftedGridEncoder
from ldp_client.encoders.vectors import SymmetricBoxEncoder, UnitBallEncoder, UnitCubeEncoder
from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import BitwiseRRParams, GRRParams, LocalHashingParams, oue
from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams, VectorShape
from ldp_client.mechanisms.discrete_laplace import DiscreteLaplaceParams
from ldp_client.mechanisms.vector_box import VectorBoxParams
from ldp_client.mechanisms.vector_l2_ball import VectorL2BallParams
from ldp_client.payload import HashedValue, payload_from_wire, payload_to_wire
from ldp_client.report import MAX_CONTAINERS_PER_REPORT, Report, ReportColumns, unpack_batch, unpack_batch_columns
from ldp_client.rng import SeededRng
from ldp_client.spec import Component, GroupTask, RoundSpec
from ldp_collector import ingest
from ldp_collector.core import Collector
from ldp_collector.estimation import accumulators
from ldp_collector.estimation.accumulators import component_params_from_spec, make_accumulate_fn, rebuild
from ldp_collector.ingest import RoundContext, StoredReportColumns, validate_batch
from ldp_collector.kinds import KINDS, CampaignEngine, RoundOutcome, RoundPlan, RoundReports
from ldp_collector.model import Result
from ldp_collector.serde import config_from_proto
from ldp_collector.server.wire import submit_response
from ldp_collector.storage.base import AccumulateFn, CampaignRecord, Outcome, StoredReport
from ldp_collector.storage.sqlite import SqliteReportStore

ROUND = 3
U32, U64 = 2**32 - 1, 2**64 - 1

# -- the round every test campaign runs: every kind of group the fast path meets ---------------------

GRR6 = Component(encoder=CategoricalEncoder(domain_size=6), mechanism=GRRParams(domain_size=6, epsilon=1.0))
GRR300 = Component(encoder=CategoricalEncoder(domain_size=300), mechanism=GRRParams(domain_size=300, epsilon=1.0))
UE60 = Component(encoder=CategoricalEncoder(domain_size=60), mechanism=oue(60, 1.0))  # 4 spare bits
_PIVOTS = tuple(i / 10 for i in range(11))
BRR11 = Component(
    encoder=BitVectorEncoder(domain=NumericDomain(lower=(0.0,), upper=(1.0,)), pivots=_PIVOTS,
                             pivots_per_attribute=(11,), half_widths=(0.05,)),
    mechanism=BitwiseRRParams(length=11, epsilon=2.0, sensitivity=4))
_LH64 = LocalHashingParams(domain_size=64, epsilon=1.0)
LH64 = Component(encoder=CategoricalEncoder(domain_size=64), mechanism=_LH64)
# The center kinds' vectors: the box randomizer (3 signs in one byte), discrete Laplace, and the
# bucketized vector sum over the box beside a GRR cell (the net tree's group).
_SQUARE = NumericDomain(lower=(0.0, 0.0), upper=(1.0, 1.0))
BOX3 = Component(encoder=SymmetricBoxEncoder(domain=NumericDomain(lower=(0.0,) * 3, upper=(1.0,) * 3)),
                 mechanism=VectorBoxParams(dimension=3, epsilon=1.0))
LAP2 = Component(encoder=UnitCubeEncoder(domain=_SQUARE), mechanism=DiscreteLaplaceParams(dimension=2, epsilon=1.0))
_BUCKETED = BucketedVectorEncoder(domain=_SQUARE, shifted_grid=ShiftedGridEncoder(domain=_SQUARE, level=2, seed=10))
BVEC = Component(encoder=_BUCKETED, mechanism=BucketizedVectorParams(
    bucket_bits=_BUCKETED.bucket_bits, dimension=3, epsilon=1.0, shape=VectorShape.BOX))
# The unit-direction randomizers (float32 payloads): the l2 ball on its own, and PrivUnit inside the
# bucketized vector sum beside a unary-encoded cell (the LSH kinds' default group).
BALL2 = Component(encoder=UnitBallEncoder(domain=_SQUARE), mechanism=VectorL2BallParams(dimension=2, epsilon=1.0))
PVEC = Component(encoder=_BUCKETED, mechanism=BucketizedVectorParams(
    bucket_bits=_BUCKETED.bucket_bits, dimension=3, epsilon=1.0, shape=VectorShape.PRIVUNIT))
#: Group -> components (group 6 is a group that does not report; 13 and up are not groups).
TASKS: dict[int, tuple[Component, ...]] = {0: (GRR6,), 7: (GRR6,), 1: (GRR300,), 2: (UE60,), 3: (BRR11,),
                                           4: (LH64,), 5: (GRR6, UE60), 8: (BOX3,), 9: (LAP2,), 10: (GRR6, BVEC),
                                           11: (BALL2,), 12: (UE60, PVEC)}
#: The points of the components that take one.
_POINTS = {BRR11: 1, BOX3: 3, LAP2: 2, BVEC: 2, BALL2: 2, PVEC: 2}


def value_of(component: Component, u: int) -> Any:
    """A value ``component``'s encoder takes, made from ``u``: an index, or a point of its unit cube."""
    if component in _POINTS:
        return tuple(((u >> (4 * j)) % 11) / 10 for j in range(_POINTS[component]))
    return u % component.encoder.output_size


def make_spec(campaign_id: str, round: int = ROUND) -> RoundSpec:
    return RoundSpec(campaign_id=campaign_id, round=round, group_weights=(1,) * 13, campaign_epsilon=4.0, tasks=(
        GroupTask(groups=(0, 7), components=(GRR6,)), GroupTask(groups=(1,), components=(GRR300,)),
        GroupTask(groups=(2,), components=(UE60,)), GroupTask(groups=(3,), components=(BRR11,)),
        GroupTask(groups=(4,), components=(LH64,)), GroupTask(groups=(5,), components=(GRR6, UE60)),
        GroupTask(groups=(8,), components=(BOX3,)), GroupTask(groups=(9,), components=(LAP2,)),
        GroupTask(groups=(10,), components=(GRR6, BVEC)), GroupTask(groups=(11,), components=(BALL2,)),
        GroupTask(groups=(12,), components=(UE60, PVEC))))


CONTEXTS: dict[str, RoundContext | str] = {
    "camp": RoundContext(campaign_id="camp", round=ROUND, spec=make_spec("camp")),
    "other": RoundContext(campaign_id="other", round=ROUND, spec=make_spec("other")),
    "gone": "campaign gone is finished",
}


def lookup(campaign_id: str) -> RoundContext | str:
    return CONTEXTS.get(campaign_id, f"campaign {campaign_id} does not exist")


# -- strategies: wire reports, good and bad ------------------------------------------------------------

ID_POOL = [bytes([i]) * 16 for i in range(1, 7)]  # shared ids: duplicates within and across batches
report_ids = st.one_of(st.sampled_from(ID_POOL), st.binary(min_size=16, max_size=16),
                       st.binary(max_size=20))
campaign_ids = st.sampled_from(["camp", "camp", "camp", "other", "gone", "nope", "bad id"])
rounds = st.sampled_from([ROUND, ROUND, ROUND, 2, U32 + 1, -1])
groups = st.one_of(st.sampled_from([0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]), st.sampled_from([13, 4095, 4096]))
garbage = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), U64) | st.floats(allow_nan=False) | st.text(max_size=6)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=12)


#: Norms about the unit-vector check's tolerance (1e-5) and far from it.
_NORMS = (1.0, 1.0 + 9.99e-6, 1.0 + 1.0001e-5, 1.0 - 1e-5, 0.5, 2.0)


def floats_near_unit(k: int) -> list[Any]:
    """Float payloads of 2 and 3 coordinates with norm ``_NORMS[k]`` (as float32), alone or in a signed
    vector: some pass the unit check, some fail it by a hair, and one is not finite."""
    norm = _NORMS[k]
    if k == len(_NORMS) - 1:
        return [6, 9, [5, struct.pack("<3f", float("inf"), 0.0, 0.0)]]
    pair = [5, struct.pack("<2f", 0.6 * norm, 0.8 * norm)]
    return pair if k % 2 else [6, 2**32 - 1, [5, struct.pack("<3f", 0.48 * norm, 0.6 * norm, 0.64 * norm)]]


@st.composite
def wire_payload(draw: st.DrawFn, component: Component | None) -> Any:
    """The wire form of one payload: honest for ``component`` most of the time, else anything."""
    mechanism = component.mechanism if component is not None else GRR6.mechanism
    choice = draw(st.integers(0, 9))
    if choice <= 5:  # honest output (the fast path's bread and butter)
        if component is not None and component.mechanism.INPUT_KIND != GRR6.mechanism.INPUT_KIND:
            rng = SeededRng(draw(st.integers(0, 2**32)))
            return payload_to_wire(component.run(value_of(component, draw(st.integers(0, 2**20))), rng=rng))
        value: Any = draw(st.integers(0, (component.encoder.output_size if component else 6) - 1))
        return payload_to_wire(mechanism.randomize(value, rng=SeededRng(draw(st.integers(0, 2**32)))))
    if choice == 6:  # an index, in range or not
        return draw(st.integers(0, U64) | st.integers(0, 400))
    if choice == 7:  # bits: random contents, any length (implausible weights, spare bits set)
        return draw(st.binary(min_size=0, max_size=9))
    if choice == 8:  # the other payload kinds, well formed or not
        return draw(st.sampled_from([[3, 5, 1], [3, 5, 64], [4, [1, -2]], [4, [1, -2, 3]], [4, [1, 2**63 - 1]],
                                     [5, struct.pack("<2f", 0.6, 0.8)], [5, b"\x00"], [6, 7, b"\x01"],
                                     [6, 7, b"\x08"], [6, 2**32, b"\x01"], [6, 7, b"\x01\x00"],
                                     [6, 7, [5, struct.pack("<2f", 0.6, 0.8)]], [9, 1], True, -3,
                                     *(floats_near_unit(k) for k in range(len(_NORMS)))]))
    return draw(garbage)


def containers(obj: Any) -> int:
    """The arrays and maps a wire object holds, itself included."""
    if isinstance(obj, (list, tuple)):
        return 1 + sum(containers(x) for x in obj)
    if isinstance(obj, dict):
        return 1 + sum(containers(x) for x in obj.values())
    return 0


@st.composite
def wire_report(draw: st.DrawFn) -> Any:
    """One entry of a packed batch: mostly a report of the test round, sometimes anything at all.

    At most :data:`MAX_CONTAINERS_PER_REPORT` arrays or maps: a report beyond that refuses the whole
    batch in both decoders (``tests/client/test_batch_limits.py``), so it has no per-report outcome
    to compare here.
    """
    item = draw(_wire_report())
    assume(containers(item) <= MAX_CONTAINERS_PER_REPORT)
    return item


@st.composite
def _wire_report(draw: st.DrawFn) -> Any:
    kind = draw(st.integers(0, 19))
    if kind == 0:
        return draw(garbage)
    group = draw(groups)
    components = TASKS.get(group, (GRR6,))
    payloads = [draw(wire_payload(c)) for c in components]
    if kind == 1:  # the wrong number of payloads (none, or one too many)
        payloads = draw(st.sampled_from([[], [*payloads, payloads[0]]]))
    item = [1, draw(report_ids), draw(campaign_ids), draw(rounds), group, payloads]
    if kind == 2:  # one field of the wrong kind
        position = draw(st.integers(0, 5))
        item[position] = draw(garbage | st.sampled_from([True, 1.0, 2, "1"]))
    return item


@st.composite
def clean_batch(draw: st.DrawFn) -> list[Any]:
    """The common batch -- honest reports of one group (or of a few) of one campaign -- with at most
    a couple of odd entries: the batch-wide checks pass, or fail for just those."""
    chosen = draw(st.lists(st.sampled_from(sorted(TASKS)), min_size=1, max_size=2, unique=True))
    campaign_id = draw(st.sampled_from(["camp", "other"]))
    rng = SeededRng(draw(st.integers(0, 2**32)))
    items: list[Any] = []
    for k in range(draw(st.integers(1, 40))):
        group = chosen[k % len(chosen)]
        payloads = [c.run(value_of(c, rng.randbelow(2**20)), rng=rng) for c in TASKS[group]]
        items.append([1, draw(st.sampled_from(ID_POOL)) if k % 9 == 8 else rng.token_bytes(16), campaign_id,
                      ROUND, group, [payload_to_wire(p) for p in payloads]])
    for position, odd in draw(st.lists(st.tuples(st.integers(0, 39), wire_report()), max_size=2)):
        items[position % len(items)] = odd
    return items


batches = st.lists(wire_report(), max_size=40) | clean_batch()
request_ids = st.sampled_from(["r1", "r2", "r3", "r4"]) | st.text(min_size=1, max_size=8)


def pack(request_id: str, items: Sequence[Any]) -> bytes:
    packed: bytes = msgpack.packb([1, request_id, list(items)], use_bin_type=True)
    return packed


def same_items(a: Sequence[Report | ProtocolError], b: Sequence[Report | ProtocolError]) -> None:
    """Position for position the same report (same payload types too) or the same error."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert type(x) is type(y)
        if isinstance(x, Report):
            assert isinstance(y, Report)
            assert x == y and [type(p) for p in x.payloads] == [type(p) for p in y.payloads]
        else:
            assert str(x) == str(y)


# -- decoding --------------------------------------------------------------------------------------------

@given(request_ids, batches)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_unpack_batch_columns_equals_unpack_batch(request_id: str, items: list[Any]) -> None:
    data = pack(request_id, items)
    rid, columns = unpack_batch_columns(data)
    reference_rid, reference = unpack_batch(data)
    assert rid == reference_rid and isinstance(columns, ReportColumns)
    same_items(columns, reference)
    assert set(columns.errors) == {i for i, r in enumerate(reference) if isinstance(r, ProtocolError)}


@given(st.binary(max_size=200) | request_ids.flatmap(lambda r: batches.map(lambda b: pack(r, b))),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3))
def test_unpack_batch_columns_fails_like_unpack_batch(data: bytes, flips: list[tuple[int, int]]) -> None:
    buf = bytearray(data)
    for position, value in flips:
        if buf:
            buf[position % len(buf)] = value
    outcomes: list[Any] = []
    for unpack in (unpack_batch_columns, unpack_batch):
        try:
            outcomes.append(unpack(bytes(buf)))
        except ProtocolError as exc:
            outcomes.append(str(exc))
    if isinstance(outcomes[0], str) or isinstance(outcomes[1], str):
        assert outcomes[0] == outcomes[1]
    else:
        assert outcomes[0][0] == outcomes[1][0]
        same_items(outcomes[0][1], outcomes[1][1])


def proto_report(item: Any) -> reports_pb2.Report:
    """A protobuf ``Report`` as close to a wire item as protobuf can say it."""
    message = reports_pb2.Report()
    if not isinstance(item, list) or len(item) != 6:
        return message  # an empty message: no id, no campaign, no payload
    _, rid, cid, round_, group, payloads = item
    message.report_id = rid if isinstance(rid, bytes) else b""
    message.campaign_id = cid if isinstance(cid, str) else ""
    message.round = round_ if type(round_) is int and 0 <= round_ <= U32 else 0
    message.group = group if type(group) is int and 0 <= group <= U32 else 0
    for p in payloads if isinstance(payloads, list) else []:
        out = message.payloads.add()
        if isinstance(p, bool):
            continue  # a payload with no value set
        if isinstance(p, int) and 0 <= p <= U64:
            out.index = p
        elif isinstance(p, bytes):
            out.bits = p
        elif isinstance(p, list) and len(p) == 3 and all(type(v) is int and 0 <= v <= U32 for v in p[1:]):
            out.hashed.seed, out.hashed.value = p[1], p[2]
        elif isinstance(p, list) and len(p) == 2 and isinstance(p[1], list):
            out.integers.values.extend(v for v in p[1] if type(v) is int and -(2**63) <= v < 2**63)
        else:
            out.floats.values.extend([0.6, 0.8])
    return message


@given(batches)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_report_columns_from_proto_equals_report_from_proto(items: list[Any]) -> None:
    request = service_pb2.SubmitReportsRequest(request_id="r", reports=[proto_report(i) for i in items])
    columns = serde.report_columns_from_proto(request.reports)
    reference: list[Report | ProtocolError] = []
    for i, message in enumerate(request.reports):
        try:
            reference.append(serde.report_from_proto(message, where=f"reports[{i}]"))
        except ProtocolError as exc:
            reference.append(exc)
    same_items(columns, reference)


# -- validation -------------------------------------------------------------------------------------------

def recording(calls: list[str]) -> Any:
    def look(campaign_id: str) -> RoundContext | str:
        calls.append(campaign_id)
        return lookup(campaign_id)
    return look


@given(batches, st.lists(st.sampled_from(list(Outcome)), min_size=40, max_size=40))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_validate_columns_equals_validate_reports(items: list[Any], stored: list[Outcome]) -> None:
    _, columns = unpack_batch_columns(pack("r", items))
    fast_calls: list[str] = []
    slow_calls: list[str] = []
    fast = validate_batch(columns, recording(fast_calls))
    slow = validate_batch(list(columns), recording(slow_calls))
    assert fast_calls == slow_calls  # one lookup per campaign, in order of first appearance
    assert fast.rejected == slow.rejected
    assert list(fast.positions) == list(slow.positions)
    assert isinstance(fast.valid, StoredReportColumns)
    assert list(fast.valid) == list(slow.valid)  # the stored bytes included
    for row, decoded in zip(slow.valid, fast.valid.decoded_payloads):  # carried on to the accumulators
        assert [payload_from_wire(w) for w in msgpack.unpackb(row.payloads, raw=False)] == list(decoded)
    outcomes = stored[:len(slow.valid)]
    assert fast.merge(outcomes) == slow.merge(outcomes)


def test_normal_batches_skip_every_per_report_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Report object, no validate_report, no msgpack decoding of payloads: the batch-wide path.

    Indexes and bits decode column by column too; the tagged payloads (local hashing, discrete
    Laplace, the signed vector) decode per report on the wire, so their columns are built as a
    simulation builds them.
    """
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the per-report path was taken")

    rng = SeededRng(7)
    spec = CONTEXTS["camp"]
    assert isinstance(spec, RoundContext)
    for group in (0, 7, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12):
        payloads = [[c.run(value_of(c, 7 * i), rng=rng) for c in TASKS[group]] for i in range(200)]
        items = [[1, rng.token_bytes(16), "camp", ROUND, group, [payload_to_wire(p) for p in row]] for row in payloads]
        tagged = group in (4, 9, 10, 11, 12)
        if tagged:
            columns = ReportColumns(report_ids=[item[1] for item in items], campaign_ids=["camp"] * len(items),
                                    rounds=[ROUND] * len(items), groups=[group] * len(items), payloads=payloads)
        monkeypatch.setattr(Report, "from_wire", forbidden)
        monkeypatch.setattr(Report, "__init__", forbidden)
        monkeypatch.setattr(ingest, "validate_report", forbidden)
        monkeypatch.setattr(accumulators, "decode_report_payloads", forbidden)
        if not tagged:
            _, columns = unpack_batch_columns(pack("r", items))
        batch = validate_batch(columns, lookup)
        assert not batch.rejected and isinstance(batch.valid, StoredReportColumns)
        fn = make_accumulate_fn(component_params_from_spec(spec.spec))
        blobs = fn(batch.valid, {})
        monkeypatch.undo()
        assert blobs == fn(list(batch.valid), {})  # the same blobs as decoding the stored bytes
        assert list(batch.valid) == list(validate_batch(list(columns), lookup).valid)


def test_only_the_odd_reports_take_the_per_report_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Report] = []
    reference = ingest.validate_report

    def spy(report: Report, context: RoundContext) -> StoredReport:
        calls.append(report)
        return reference(report, context)

    monkeypatch.setattr(ingest, "validate_report", spy)
    items = [[1, bytes([i]) * 16, "camp", ROUND, 0, [i % 6]] for i in range(1, 50)]
    items[10][5] = [6]  # out of range
    items[20][3] = ROUND - 1  # another round
    items[30][4] = 4  # local hashing, its bucket out of range
    items[30][5] = [[3, 1, 2**20]]
    items[40][4] = 4  # a good local-hashing report beside the GRR reports: a batch check of its own
    items[40][5] = [[3, 1, 2]]
    _, columns = unpack_batch_columns(pack("r", items))
    batch = validate_batch(columns, lookup)
    assert [r.report_id[0] for r in calls] == [11, 21, 31]
    assert set(batch.rejected) == {10, 20, 30} and len(batch.valid) == 46
    assert "grr payload must be an index in [0, 6), got 6" in batch.rejected[10]
    assert "local_hashing bucket must be in" in batch.rejected[30]


#: A plausible unary-encoded cell of UE60 (15 of 60 bits set), for the odd reports of group 12.
_UE_CELL = b"\x11" * 7 + b"\x01"


@pytest.mark.parametrize("group,odd", [
    (0, [[1, 2], [], [b"\x01"], [True], [-1], [6], [2**64 - 1]]),  # GRR: counts, kinds, range
    (1, [[300], [299, 1], [b"\x00"]]),  # GRR over 300 values: stored payloads of 2 to 4 bytes
    (2, [[b"\x00" * 7], [b"\xff" * 7 + b"\x0f"], [b"\x00" * 7 + b"\x10"], [5], [b"\x01" + b"\x00" * 7, 1]]),  # UE
    (3, [[b"\x00"], [b"\x00\x08"], [b"\xff\x0f"], [7]]),  # bitwise RR: length, spare bits
    (4, [[[3, 2**32, 1]], [[3, 1, 2**20]], [[3, 1, _LH64.g]], [b"\x01"], [5], [[3, 1, 1], [3, 1, 1]],
         [[6, 7, b"\x01"]]]),  # local hashing: seed and bucket ranges, kinds, counts
    (8, [[b"\x08"], [b""], [b"\x01\x00"], [3]]),  # the box: spare bits, length, kind
    (9, [[[4, [1]]], [[4, [1, 2, 3]]], [[4, []]], [b"\x01"]]),  # discrete Laplace: length, kind
    (10, [[1, [6, 7, b"\x08"]], [1, [6, 2**32, b"\x01"]], [1, [6, 7, b""]], [1, b"\x01"], [6, [6, 7, b"\x01"]],
          [1, [6, 7, [5, struct.pack("<2f", 0.6, 0.8)]]], [1, [6, 7, b"\x01"], 1]]),  # GRR beside a signed box
    (11, [[[5, struct.pack("<2f", 0.6, 0.8001)]], [[5, struct.pack("<3f", 0.6, 0.8, 0.0)]], [b"\x01"],
          [[5, struct.pack("<2f", float("nan"), 1.0)]], [[5, struct.pack("<2f", 1.0, 1e-2)]], [[4, [1, 0]]]]),  # l2 ball
    (12, [[_UE_CELL, [6, 7, [5, struct.pack("<3f", 0.48, 0.6, 0.6401)]]], [_UE_CELL, [6, 7, b"\x01"]],
          [_UE_CELL, [6, 2**32, [5, struct.pack("<3f", 0.48, 0.6, 0.64)]]],
          [_UE_CELL, [6, 7, [5, struct.pack("<2f", 0.6, 0.8)]]],
          [b"\x00" * 7, [6, 7, [5, struct.pack("<3f", 0.48, 0.6, 0.64)]]]]),  # a unary cell beside a signed PrivUnit
])
def test_batch_checks_send_exactly_the_odd_reports_per_report(monkeypatch: pytest.MonkeyPatch, group: int,
                                                              odd: list[list[Any]]) -> None:
    calls: list[int] = []
    reference = ingest.validate_report

    def spy(report: Report, context: RoundContext) -> StoredReport:
        calls.append(report.report_id[0])
        return reference(report, context)

    rng = SeededRng(group)
    items = [[1, bytes([i]) * 16, "camp", ROUND, group, [payload_to_wire(c.run(value_of(c, 3 * i), rng=rng))
                                                         for c in TASKS[group]]] for i in range(1, 60)]
    for k, payloads in enumerate(odd):
        items[5 * k + 2][5] = payloads
    _, columns = unpack_batch_columns(pack("r", items))
    monkeypatch.setattr(ingest, "validate_report", spy)
    fast = validate_batch(columns, lookup)
    monkeypatch.undo()
    slow = validate_batch(list(columns), lookup)
    # Odd reports that decode reach validate_report (report ids start at 1); the others are decode errors.
    assert calls == [5 * k + 3 for k in range(len(odd)) if 5 * k + 2 not in columns.errors]
    assert len(calls) + len(columns.errors) == len(odd)
    assert fast.rejected == slow.rejected and list(fast.valid) == list(slow.valid)
    assert list(fast.positions) == list(slow.positions)


@pytest.mark.parametrize("pool", [0, 16])
def test_the_local_hashing_batch_check_passes_exactly_what_check_payload_accepts(pool: int) -> None:
    """Seeds and buckets at and around every limit, with and without a seed pool (whose seeds only
    pass), and values of other kinds: the batch check passes exactly the payloads ``check_payload``
    accepts, and stores each as ``pack_payloads`` does."""
    params = LocalHashingParams(domain_size=64, epsilon=1.0, seed_pool_size=pool, seed_pool_key=99 if pool else 0)
    check = ingest._payload_check(params)
    assert isinstance(check, ingest._HashedCheck)
    seeds = [0, 1, 2**32 - 1, 2**32, 2**64 - 1, *params.pool_seeds[:3]]
    buckets = [0, 1, params.g - 1, params.g, 2**32 - 1]
    values: list[Any] = [HashedValue(seed, bucket) for seed in seeds for bucket in buckets]
    values += [HashedValue(True, 0), HashedValue(seeds[-1], False), (seeds[-1], 0), 5, b"\x01", None]
    failing = set(check.failing(values))

    def accepted(value: Any) -> bool:
        try:
            params.check_payload(value)
        except ProtocolError:
            return False
        return True

    assert [k not in failing for k in range(len(values))] == [accepted(v) for v in values]
    passed = [v for k, v in enumerate(values) if k not in failing]
    assert len(passed) == 3 * 3  # the pool's 3 seeds (without a pool: 0, 1, 2^32 - 1) x 3 good buckets
    assert check.stored(passed) == [ingest.pack_payloads((v,)) for v in passed]


def test_large_grr_domains_store_the_same_bytes() -> None:
    big = Component(encoder=CategoricalEncoder(domain_size=70_000),
                    mechanism=GRRParams(domain_size=70_000, epsilon=1.0))
    spec = RoundSpec(campaign_id="big", round=1, group_weights=(1,), campaign_epsilon=1.0,
                     tasks=(GroupTask(groups=(0,), components=(big,)),))
    context = RoundContext(campaign_id="big", round=1, spec=spec)
    items = [[1, bytes([i]) * 16, "big", 1, 0, [v]] for i, v in enumerate((0, 127, 128, 255, 256, 65_535, 69_999), 1)]
    _, columns = unpack_batch_columns(pack("r", items))
    fast = validate_batch(columns, lambda c: context)
    assert not fast.rejected and list(fast.valid) == list(validate_batch(list(columns), lambda c: context).valid)


# -- whole collectors -------------------------------------------------------------------------------------

class _MixedEngine(CampaignEngine):
    """Every campaign runs :func:`make_spec` with the real accumulators; closing finishes it."""

    KIND = campaigns_pb2.HISTOGRAM

    def first_round(self) -> RoundPlan:
        return RoundPlan(spec=make_spec(self.campaign_id))

    def close_round(self, spec: RoundSpec, reports: RoundReports, engine_state: bytes) -> RoundOutcome:
        return RoundOutcome(result=Result())

    def accumulate_fn(self, spec: RoundSpec) -> AccumulateFn | None:
        return make_accumulate_fn(component_params_from_spec(spec))


def _collector(path: Path) -> Collector:
    collector = Collector(SqliteReportStore(path))
    for campaign_id in ("camp", "other", "gone"):
        collector.create_campaign(config_from_proto(campaigns_pb2.CampaignConfig(
            campaign_id=campaign_id, kind=campaigns_pb2.HISTOGRAM, epsilon=4.0,
            domain=campaigns_pb2.Domain(categorical_size=6))))
    gone = Report(report_id=b"g" * 16, campaign_id="gone", round=ROUND, group=0, payloads=(1,))
    assert collector.submit("gone", [gone]) == [(Outcome.ACCEPTED, "")]
    collector.close_round("gone", ROUND)  # the engine finishes the campaign
    return collector


@pytest.fixture
def collectors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Collector, Collector]]:
    monkeypatch.setitem(KINDS, "histogram", replace(KINDS["histogram"], engine=_MixedEngine))
    pair = (_collector(tmp_path / "fast"), _collector(tmp_path / "slow"))
    try:
        yield pair
    finally:
        for collector in pair:
            collector.store.close()


def assert_same_stores(fast: Collector, slow: Collector) -> None:
    """Same reports (bytes and order) and accumulators, which also equal a rebuild from the reports."""
    for campaign_id in ("camp", "other", "gone"):
        stored = [list(c.store.iter_reports(campaign_id, ROUND)) for c in (fast, slow)]
        assert stored[0] == stored[1]
        blobs = fast.store.load_accumulators(campaign_id, ROUND)
        assert blobs == slow.store.load_accumulators(campaign_id, ROUND)
        assert blobs == rebuild(stored[0], component_params_from_spec(make_spec(campaign_id)))


def _submit(collector: Collector, request_id: str, batch: Sequence[Report | ProtocolError]) -> Any:
    """The outcomes, or the error (a request id replayed with another batch is refused)."""
    try:
        return collector.submit(request_id, batch)
    except Exception as exc:
        return type(exc), str(exc)


_EXAMPLES = iter(range(10**9))


@given(st.lists(st.tuples(request_ids, batches), min_size=1, max_size=6), st.lists(st.integers(0, 5), max_size=3))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
def test_collectors_store_and_accumulate_the_same(collectors: tuple[Collector, Collector],
                                                   requests: list[tuple[str, list[Any]]], resend: list[int]) -> None:
    fast, slow = collectors
    example = next(_EXAMPLES)  # the stores outlive the example: its request ids are its own
    requests = [(f"{example}-{request_id}", items) for request_id, items in requests]
    requests += [requests[i % len(requests)] for i in resend]  # replays of a request, unchanged
    for n, (request_id, items) in enumerate(requests):
        data = pack(request_id, items)
        fast_answer = _submit(fast, request_id, unpack_batch_columns(data)[1])
        assert fast_answer == _submit(slow, request_id, unpack_batch(data)[1]), n
    assert_same_stores(fast, slow)


def test_a_large_mixed_batch_and_its_replays(collectors: tuple[Collector, Collector]) -> None:
    fast, slow = collectors
    rng = SeededRng(11)
    items: list[Any] = []
    for i in range(3000):
        group = [0, 7, 1, 2, 3, 4, 5][i % 7]
        payloads = [c.run(i % 6 if c is not BRR11 else (0.5,), rng=rng) for c in TASKS[group]]
        items.append([1, rng.token_bytes(16), ["camp", "other"][i % 2], ROUND, group,
                      [payload_to_wire(p) for p in payloads]])
    items[5][5] = [600]  # out of range
    items[6][5] = [b"\xff\xff\xff"]  # implausible unary encoding
    items[7] = items[3]  # a duplicate within the batch
    items[8] = "not a report"
    items[9][2] = "gone"
    for request_id, chunk in (("a", items[:1000]), ("b", items[500:2000]), ("a", items[:1000]), ("c", items)):
        data = pack(request_id, chunk)
        assert fast.submit(request_id, unpack_batch_columns(data)[1]) == slow.submit(request_id, unpack_batch(data)[1])
    assert_same_stores(fast, slow)


def test_concurrent_batches_share_group_commits(collectors: tuple[Collector, Collector]) -> None:
    fast, slow = collectors
    rng = SeededRng(5)
    requests = []
    for k in range(24):
        group = (0, 7, 1, 2)[k % 4]
        component = TASKS[group][0]
        items = [[1, rng.token_bytes(16) if i % 10 else ID_POOL[i % 6], "camp", ROUND, group,
                  [component.run(i % 6, rng=rng)]] for i in range(300)]
        requests.append((f"req-{k}", pack(f"req-{k}", items)))
    answers: dict[str, list[tuple[Outcome, str]]] = {}

    def send(share: list[tuple[str, bytes]]) -> None:
        for request_id, data in share:
            answers[request_id] = fast.submit(request_id, unpack_batch_columns(data)[1])

    threads = [threading.Thread(target=send, args=(requests[i::6],)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for request_id, data in requests:  # the same requests one by one, per-report path
        slow.submit(request_id, unpack_batch(data)[1])
    # Which request stored a shared id first depends on timing; everything else does not.
    accepted = sum(o == Outcome.ACCEPTED for a in answers.values() for o, _ in a)
    assert accepted == fast.store.count_reports("camp", ROUND) == slow.store.count_reports("camp", ROUND)
    rows = [sorted((r for b in c.store.iter_reports("camp", ROUND) for r in b), key=lambda r: r.report_id)
            for c in (fast, slow)]
    assert [r.report_id for r in rows[0]] == [r.report_id for r in rows[1]]
    assert [r for r in rows[0] if r.report_id not in ID_POOL] == [r for r in rows[1] if r.report_id not in ID_POOL]
    params = component_params_from_spec(make_spec("camp"))
    for collector, raw in zip((fast, slow), rows):
        assert collector.store.load_accumulators("camp", ROUND) == rebuild(raw, params)


# -- the store ------------------------------------------------------------------------------------------

def _columns_of(rows: Sequence[StoredReport]) -> StoredReportColumns:
    return StoredReportColumns(
        report_ids=[r.report_id for r in rows], campaign_ids=[r.campaign_id for r in rows],
        rounds=[r.round for r in rows], groups=[r.group for r in rows], payloads=[r.payloads for r in rows],
        decoded_payloads=[tuple(payload_from_wire(w) for w in msgpack.unpackb(r.payloads)) for r in rows])


@pytest.mark.parametrize("width", ["fixed", "variable"])
def test_store_takes_columns_like_reports(tmp_path: Path, width: str) -> None:
    stores = [SqliteReportStore(tmp_path / name) for name in ("columns", "rows")]
    seen: list[list[type]] = [[], []]
    try:
        for store in stores:
            for campaign_id in ("camp", "other"):
                store.create_campaign(CampaignRecord(campaign_id=campaign_id, config=b"", state="collecting",
                                                     current_round=1, created_at=0.0))
                store.open_round(campaign_id, 1, b"", 0.0)
            store.open_round("camp", 2, b"", 0.0)
            store.close_round("camp", 2, 1.0)

        def spy(index: int) -> AccumulateFn:
            inner = make_accumulate_fn({0: (GRR300.mechanism,), 1: (GRR300.mechanism,)})

            def accumulate(reports: Sequence[StoredReport], blobs: Any) -> Any:
                seen[index].append(type(reports))
                return inner(reports, blobs)
            return accumulate

        def row(i: int, campaign_id: str = "camp", round: int = 1) -> StoredReport:
            value = 7 if width == "fixed" else (7, 200, 299)[i % 3]
            return StoredReport(report_id=bytes([i]) * 16, campaign_id=campaign_id, round=round, group=i % 2,
                                payloads=msgpack.packb([value]))

        requests = [
            ("r1", [row(i) for i in range(1, 9)]),
            ("r2", [row(3), row(9), row(9), row(10, "other"), row(11, "camp", 2), row(1, "camp", 2)]),
            ("r1", [row(20)]),  # a replay: the first answer
        ]
        for request_id, rows in requests:
            outcomes = [store.add_reports(request_id, batch, spy(k))
                        for k, (store, batch) in enumerate(zip(stores, (_columns_of(rows), rows)))]
            assert outcomes[0] == outcomes[1]
        assert outcomes[0] == [Outcome.ACCEPTED] * 8
        for campaign_id, round in (("camp", 1), ("camp", 2), ("other", 1)):
            assert [list(s.iter_reports(campaign_id, round)) for s in stores][0] == \
                [list(s.iter_reports(campaign_id, round)) for s in stores][1]
            assert stores[0].load_accumulators(campaign_id, round) == stores[1].load_accumulators(campaign_id, round)
        assert seen[0] and all(t is StoredReportColumns for t in seen[0])  # columns reach the accumulator
        assert all(t is list for t in seen[1])
    finally:
        for store in stores:
            store.close()


# -- the column types ------------------------------------------------------------------------------------

def test_report_columns_is_a_sequence_of_reports() -> None:
    error = ProtocolError("reports[1]: broken")
    columns = ReportColumns(report_ids=[b"a" * 16, b"", b"b" * 16], campaign_ids=["c", "", "d"], rounds=[1, 0, 2],
                            groups=[0, 0, 3], payloads=[[5], (), (b"\x01", 2)], errors={1: error})
    first = Report(report_id=b"a" * 16, campaign_id="c", round=1, group=0, payloads=(5,))
    last = Report(report_id=b"b" * 16, campaign_id="d", round=2, group=3, payloads=(b"\x01", 2))
    assert len(columns) == 3 and list(columns) == [first, error, last]
    assert columns[-1] == last and columns[0:2] == [first, error] and columns.distinct_campaign_ids() == {"c", "d"}
    with pytest.raises(IndexError):
        columns[3]


@pytest.mark.parametrize("change,message", [
    ({"rounds": [1, 2]}, "same length"),
    ({"report_ids": [b"short"]}, r"reports\[0\]: report_id must be 16 bytes"),
    ({"campaign_ids": ["bad id"]}, r"reports\[0\]: campaign_id must be"),
    ({"rounds": [U32 + 1]}, r"reports\[0\]: round must be in"),
    ({"groups": [True]}, r"reports\[0\]: group must be an integer, got a boolean"),
    ({"groups": [Outcome.ACCEPTED]}, r"reports\[0\]: report columns must hold exact"),  # an int subclass
    ({"payloads": [()]}, r"reports\[0\]: payloads must be a tuple of 1 to 8"),
    ({"errors": {1: ProtocolError("x")}}, "errors must map positions"),
])
def test_report_columns_refuse_what_report_refuses(change: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"report_ids": [b"a" * 16], "campaign_ids": ["c"], "rounds": [1], "groups": [0],
                              "payloads": [(1,)], **change}
    with pytest.raises(InvalidParameterError, match=message):
        ReportColumns(**fields)


# -- the response -----------------------------------------------------------------------------------------

def _reference_response(report_ids: Sequence[bytes],
                        results: Sequence[tuple[Outcome, str]]) -> service_pb2.SubmitReportsResponse:
    response = service_pb2.SubmitReportsResponse()
    for report_id, (outcome, reason) in zip(report_ids, results):
        response.outcomes.add(report_id=report_id, status=int(outcome), reason=reason)
    response.accepted = sum(o == Outcome.ACCEPTED for o, _ in results)
    response.duplicates = sum(o == Outcome.DUPLICATE for o, _ in results)
    response.rejected = sum(o == Outcome.REJECTED for o, _ in results)
    return response


@given(st.lists(st.tuples(st.binary(min_size=16, max_size=16) | st.binary(max_size=300),
                          st.sampled_from(list(Outcome)), st.sampled_from(["", ""]) | st.text(max_size=200)),
                max_size=30)
       | st.lists(st.binary(min_size=16, max_size=16), max_size=30).map(
           lambda ids: [(i, Outcome.ACCEPTED, "") for i in ids]))
def test_response_encoding_equals_protobuf(rows: list[tuple[bytes, Outcome, str]]) -> None:
    ids = [r[0] for r in rows]
    results = [(r[1], r[2]) for r in rows]
    response = submit_response(ids, results)
    reference = _reference_response(ids, results)
    assert response == reference
    assert response.SerializeToString() == reference.SerializeToString()
