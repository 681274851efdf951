"""Property tests of the msgpack forms: reports, batches and round specs round-trip exactly, and any
malformed input raises ProtocolError, never another exception type."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ldp_client.encoders import CategoricalEncoder
from ldp_client.errors import ProtocolError
from ldp_client.mechanisms import GRRParams
from ldp_client.payload import Floats, HashedValue, Integers
from ldp_client.report import MAX_REQUEST_ID, REPORT_ID_BYTES, Report, new_report_id, pack_batch, unpack_batch
from ldp_client.rng import SeededRng
from ldp_client.spec import MAX_COMPONENTS, MAX_GROUPS, Component, GroupTask, RoundSpec

U64, U32, S64 = 2**64 - 1, 2**32 - 1, 2**63

campaign_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", fullmatch=True)
float32s = st.floats(width=32, allow_nan=False)
payloads = st.one_of(
    st.integers(0, U64),
    st.binary(max_size=64),
    st.builds(HashedValue, st.integers(0, U64), st.integers(0, U32)),
    st.builds(Integers, st.lists(st.integers(-S64, S64 - 1), max_size=16).map(tuple)),
    st.builds(Floats, st.lists(float32s, max_size=16).map(tuple)),
)
reports = st.builds(
    Report,
    report_id=st.binary(min_size=16, max_size=16),
    campaign_id=campaign_ids,
    round=st.integers(0, U32),
    group=st.integers(0, MAX_GROUPS - 1),
    payloads=st.lists(payloads, min_size=1, max_size=MAX_COMPONENTS).map(tuple),
)
request_ids = st.text(min_size=1, max_size=MAX_REQUEST_ID)
# Arbitrary msgpack-able structures: garbage that is valid msgpack reaches the structural checks.
msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-S64, U64) | st.floats() | st.text(max_size=8) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=7) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


def _equal_floats(a: Report, b: Report) -> bool:
    """Report equality, with -0.0/0.0 told apart in float payloads (the wire keeps the sign)."""
    def key(r: Report) -> Any:
        return [struct.pack(f"<{len(p.values)}f", *p.values) if isinstance(p, Floats) else p for p in r.payloads]
    return a == b and key(a) == key(b)


@given(reports)
def test_report_round_trip(report: Report) -> None:
    assert _equal_floats(Report.unpack(report.pack()), report)


@given(request_ids, st.lists(reports, max_size=8))
def test_batch_round_trip(request_id: str, batch: list[Report]) -> None:
    rid, unpacked = unpack_batch(pack_batch(request_id, batch))
    assert rid == request_id
    assert len(unpacked) == len(batch)
    assert all(isinstance(u, Report) and _equal_floats(u, r) for u, r in zip(unpacked, batch))


def _unpack_report(data: bytes) -> None:
    try:
        Report.unpack(data)
    except ProtocolError:
        pass


def _unpack_batch(data: bytes) -> None:
    try:
        _, items = unpack_batch(data)
    except ProtocolError:
        return
    assert all(isinstance(i, (Report, ProtocolError)) for i in items)


def _unpack_spec(data: bytes) -> None:
    try:
        RoundSpec.unpack(data)
    except ProtocolError:
        pass


@given(st.binary(max_size=256))
@example(b"")
@example(b"\xc1")
@example(b"\x96\x01\xc4\x10" + b"\x00" * 16)
def test_garbage_bytes_raise_protocol_error_only(data: bytes) -> None:
    _unpack_report(data)
    _unpack_batch(data)
    _unpack_spec(data)


@given(msgpack_values)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_garbage_structures_raise_protocol_error_only(value: Any) -> None:
    data = msgpack.packb(value, use_bin_type=True)
    for shape in (value, [1, value], [1, b"\x00" * 16, "c", 0, 0, value], [1, "req", [value]],
                  [1, b"\x00" * 16, "c", 0, 0, [value]], [1, b"\x00" * 16, value, value, value, [[1, 0]]]):
        data = msgpack.packb(shape, use_bin_type=True)
        _unpack_report(data)
        _unpack_batch(data)
        _unpack_spec(data)


mutations = st.lists(
    st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]), st.integers(0, 10_000),
              st.integers(0, 255)),
    min_size=1, max_size=4)


def _mutate(data: bytes, steps: list[tuple[str, int, int]]) -> bytes:
    buf = bytearray(data)
    for op, pos, value in steps:
        if not buf:
            break
        i = pos % len(buf)
        if op == "flip":
            buf[i] ^= 1 << (value % 8)
        elif op == "set":
            buf[i] = value
        elif op == "insert":
            buf.insert(i, value)
        elif op == "delete":
            del buf[i]
        else:
            del buf[i:]
    return bytes(buf)


@given(reports, mutations)
def test_mutated_report_raises_protocol_error_only(report: Report, steps: list[tuple[str, int, int]]) -> None:
    _unpack_report(_mutate(report.pack(), steps))


@given(request_ids, st.lists(reports, min_size=1, max_size=4), mutations)
def test_mutated_batch_raises_protocol_error_only(request_id: str, batch: list[Report],
                                                  steps: list[tuple[str, int, int]]) -> None:
    _unpack_batch(_mutate(pack_batch(request_id, batch), steps))


# ---------------------------------------------------------------------------- round specs


@st.composite
def round_specs(draw: st.DrawFn) -> RoundSpec:
    n_groups = draw(st.integers(1, 12))
    weights = draw(st.lists(st.integers(0, U32), min_size=n_groups, max_size=n_groups)
                   .filter(lambda w: sum(w) > 0))
    campaign_epsilon = draw(st.floats(0.01, 100.0))
    reporting = draw(st.permutations(range(n_groups)))[: draw(st.integers(0, n_groups))]
    tasks = []
    i = 0
    while i < len(reporting):
        size = draw(st.integers(1, len(reporting) - i))
        n_components = draw(st.integers(1, 3))
        per_component = min(20.0, campaign_epsilon / n_components)
        sizes = draw(st.lists(st.integers(2, 2**40), min_size=n_components, max_size=n_components))
        shares = draw(st.lists(st.floats(1e-3, 1.0), min_size=n_components, max_size=n_components))
        components = tuple(
            Component(encoder=CategoricalEncoder(domain_size=k),
                      mechanism=GRRParams(domain_size=k, epsilon=share * per_component))
            for k, share in zip(sizes, shares))
        tasks.append(GroupTask(groups=tuple(reporting[i:i + size]), components=components))
        i += size
    return RoundSpec(campaign_id=draw(campaign_ids), round=draw(st.integers(0, U32)), group_weights=tuple(weights),
                     tasks=tuple(tasks), campaign_epsilon=campaign_epsilon,
                     max_reports_per_device=draw(st.integers(1, 1024)),
                     deadline=draw(st.none() | st.floats(0.0, 1e11)), kind=draw(st.text(max_size=64)))


@given(round_specs())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_round_spec_round_trip(spec: RoundSpec) -> None:
    assert RoundSpec.unpack(spec.pack()) == spec


@given(round_specs(), mutations)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_mutated_round_spec_raises_protocol_error_only(spec: RoundSpec, steps: list[tuple[str, int, int]]) -> None:
    _unpack_spec(_mutate(spec.pack(), steps))


def _replace_somewhere(obj: Any, choice: int, value: Any) -> Any:
    """``obj`` with the ``choice``-th node (pre-order, modulo their number) replaced by ``value``."""
    nodes: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        children = list(node.items()) if isinstance(node, dict) else list(enumerate(node)) \
            if isinstance(node, list) else []
        for key, child in children:
            nodes.append((node, key))
            walk(child)

    walk(obj)
    if nodes:
        parent, key = nodes[choice % len(nodes)]
        parent[key] = value
    return obj


@given(round_specs(), st.integers(0, 10_000), msgpack_values)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_round_spec_with_a_wrong_field_raises_protocol_error_only(spec: RoundSpec, choice: int, value: Any) -> None:
    _unpack_spec(msgpack.packb(_replace_somewhere(spec.to_dict(), choice, value), use_bin_type=True))


@given(reports, st.integers(0, 10_000), msgpack_values)
def test_report_with_a_wrong_field_raises_protocol_error_only(report: Report, choice: int, value: Any) -> None:
    _unpack_report(msgpack.packb(_replace_somewhere(report.to_wire(), choice, value), use_bin_type=True))


def test_unpack_of_non_bytes_is_a_type_error() -> None:
    for unpack in (Report.unpack, unpack_batch, RoundSpec.unpack):
        with pytest.raises(TypeError):
            unpack("text")  # type: ignore[arg-type]


def test_new_report_ids_start_with_their_creation_second() -> None:
    ids = [new_report_id(SeededRng(s), now=1_700_000_000.9) for s in range(1000)]
    assert all(len(i) == REPORT_ID_BYTES and i[:4] == (1_700_000_000).to_bytes(4, "big") for i in ids)
    assert len(set(ids)) == 1000  # the 12 random bytes differ
    assert new_report_id(SeededRng(7), now=5.0) == new_report_id(SeededRng(7), now=5.0)  # seeded: reproducible
    assert new_report_id(SeededRng(7), now=2.0**32 + 3)[:4] == (3).to_bytes(4, "big")  # wraps, never overflows
    later = new_report_id(SeededRng(0), now=1_700_000_001.0)
    assert max(ids) < later  # a later second sorts after: new ids land together at the end of the index
