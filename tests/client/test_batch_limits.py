"""The limits of a batch of reports (``ldp_client.report``): one report count and one byte size both
sides use, and decoding that is bounded before it allocates.

The byte limit is checked against the real encoders when protobuf is installed (``client-grpc``);
everything else runs with the SDK alone.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import msgpack
import pytest

from ldp_client.errors import ProtocolError
from ldp_client.payload import MAX_BITS, HashedValue
from ldp_client.report import (
    MAX_BATCH_BYTES,
    MAX_BATCH_REPORTS,
    MAX_REQUEST_ID,
    Report,
    batch_slices,
    pack_batch,
    unpack_batch,
    unpack_batch_columns,
)
from ldp_client.spec import MAX_COMPONENTS, MAX_GROUPS


def needs_protobuf() -> None:
    """Skip the calling test without the [grpc] extra (protobuf and ldp-proto)."""
    pytest.importorskip("google.protobuf")
    pytest.importorskip("ldp.v1")


DECODERS = [unpack_batch, unpack_batch_columns]


def report(i: int, payloads: tuple[Any, ...] = (1,), campaign_id: str = "camp") -> Report:
    return Report(report_id=i.to_bytes(16, "big"), campaign_id=campaign_id, round=1, group=0, payloads=payloads)


def header(request_id: str, reports: int) -> bytes:
    """``[1, request_id, [`` declaring ``reports`` items (the items follow)."""
    return b"\x93\x01" + msgpack.packb(request_id) + b"\xdc" + reports.to_bytes(2, "big")


def largest_scalar_report(i: int = 0) -> Report:
    return Report(report_id=i.to_bytes(16, "big"), campaign_id="c" * 128, round=2**32 - 1, group=MAX_GROUPS - 1,
                  payloads=(HashedValue(2**64 - 1, 2**32 - 1),))


def largest_report() -> Report:
    return Report(report_id=bytes(16), campaign_id="c" * 128, round=2**32 - 1, group=MAX_GROUPS - 1,
                  payloads=(b"\xff" * (MAX_BITS // 8),) * MAX_COMPONENTS)


# -- one count, one size -------------------------------------------------------------------------------

def test_a_batch_holds_at_most_ten_thousand_reports() -> None:
    assert MAX_BATCH_REPORTS == 10_000
    reports = [report(i) for i in range(MAX_BATCH_REPORTS + 1)]
    assert len(unpack_batch(pack_batch("full", reports[:-1]))[1]) == MAX_BATCH_REPORTS
    over = msgpack.packb([1, "over", [r.to_wire() for r in reports]], use_bin_type=True)
    for decode in DECODERS:
        with pytest.raises(ProtocolError, match="at most 10000 reports, got 10001"):
            decode(over)


def test_the_declared_count_is_refused_before_any_report_is_read() -> None:
    # A header declaring 60 000 reports, followed by nothing a decoder could read.
    data = header("huge", 60_000) + b"\xc1" * 100
    for decode in DECODERS:
        with pytest.raises(ProtocolError, match="at most 10000 reports, got 60000"):
            decode(data)
        with pytest.raises(ProtocolError, match="at most 5 reports, got 6"):
            decode(pack_batch("six", [report(i) for i in range(6)]), max_reports=5)


def test_max_batch_bytes_is_the_largest_batch_of_one_scalar_reports_in_either_encoding() -> None:
    needs_protobuf()
    from ldp.v1 import service_pb2
    from ldp_client.serde import report_to_proto

    request_id = "\U0010ffff" * MAX_REQUEST_ID  # the longest request id in UTF-8
    scalars = [largest_scalar_report(i) for i in range(MAX_BATCH_REPORTS)]
    as_proto = service_pb2.SubmitReportsRequest(request_id=request_id, reports=[report_to_proto(r) for r in scalars])
    assert as_proto.ByteSize() == MAX_BATCH_BYTES == 1_820_515  # the formula is exact
    as_packed = service_pb2.SubmitPackedRequest(request_id=request_id, packed=pack_batch(request_id, scalars))
    assert as_packed.ByteSize() <= MAX_BATCH_BYTES
    # Every legal report fits on its own, the largest of all (8 payloads of 2**20 bits) included.
    big = largest_report()
    assert service_pb2.SubmitReportsRequest(request_id=request_id, reports=[report_to_proto(big)]).ByteSize() \
        <= MAX_BATCH_BYTES
    assert service_pb2.SubmitPackedRequest(request_id=request_id, packed=pack_batch(request_id, [big])).ByteSize() \
        <= MAX_BATCH_BYTES
    assert unpack_batch(pack_batch(request_id, [big])) == (request_id, [big])


def test_batch_slices_cut_by_count_and_by_bytes() -> None:
    assert batch_slices([10] * 7, max_reports=3, max_bytes=1000) == [slice(0, 3), slice(3, 6), slice(6, 7)]
    assert batch_slices([40, 40, 40, 10, 100], max_bytes=100) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert batch_slices([], max_bytes=100) == []
    with pytest.raises(ValueError, match="report 1 takes 101 bytes"):
        batch_slices([1, 101], max_bytes=100)


# -- decoding is bounded ---------------------------------------------------------------------------------

def test_deep_nesting_is_refused_without_building_it() -> None:
    # 1 000 reports nested 1 000 arrays deep: 1 MB that msgpack alone turns into a million lists.
    data = header("deep", 1000) + (b"\x91" * 1000 + b"\x00") * 1000
    for decode in DECODERS:
        tracemalloc.start()
        try:
            with pytest.raises(ProtocolError, match="a report holds at most 18 arrays or maps"):
                decode(data)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 8 * 2**20, f"{decode.__name__} allocated {peak / 2**20:.0f} MiB"


def test_a_long_payload_list_is_refused_before_its_payloads_are_decoded() -> None:
    # 2 000 payloads that would each fail to decode: the count is what the reason names.
    item = [1, bytes(16), "camp", 1, 0, ["bad"] * 2000]
    data = msgpack.packb([1, "lists", [item, report(1).to_wire()]], use_bin_type=True)
    for decode in DECODERS:
        _, reports = decode(data)
        assert isinstance(reports[0], ProtocolError)
        assert str(reports[0]) == "reports[0]: payloads must be a list of 1 to 8 payloads, got 2000"
        assert reports[1] == report(1)


def test_a_long_payload_list_is_refused_before_its_payloads_are_converted() -> None:
    needs_protobuf()
    from ldp.v1 import reports_pb2
    from ldp_client.serde import report_columns_from_proto, report_from_proto

    message = reports_pb2.Report(report_id=bytes(16), campaign_id="camp", round=1, group=0,
                                 payloads=[reports_pb2.Payload()] * 2000)  # each one empty, so malformed
    with pytest.raises(ProtocolError, match="payloads must be a list of 1 to 8 payloads, got 2000"):
        report_from_proto(message)
    columns = report_columns_from_proto([message])
    assert str(columns.errors[0]) == "reports[0]: payloads must be a list of 1 to 8 payloads, got 2000"


def test_strings_binaries_and_extensions_beyond_a_legal_report_refuse_the_batch() -> None:
    too_long = [
        [1, "r", [[1, bytes(16), "x" * (4 * MAX_REQUEST_ID + 1), 1, 0, [1]]]],
        [1, "r", [[1, bytes(16), "camp", 1, 0, [b"\x00" * (MAX_BITS // 8 + 1)]]]],
        [1, "r", [[1, bytes(16), "camp", 1, 0, [msgpack.ExtType(1, b"x")]]]],
    ]
    for value in too_long:
        data = msgpack.packb(value, use_bin_type=True)
        for decode in DECODERS:
            with pytest.raises(ProtocolError, match="not valid msgpack"):
                decode(data)


def _cycles_left_by(decode: Any, *args: Any) -> int:
    """Objects only the cyclic garbage collector would free after ``decode(*args)`` and its result are gone."""
    gc.collect()
    gc.disable()
    try:
        result = decode(*args)
        del result
        return gc.collect()
    finally:
        gc.enable()


def test_decoding_malformed_reports_leaves_no_reference_cycle() -> None:
    # A kept exception's traceback holds the decoder's frames and so the whole decoded request:
    # without care that cycle lives until the garbage collector happens to run.
    items = [[1, bytes(16), "camp", 1, 0, [[99]] * 9]] * 50 + [report(1).to_wire()]
    data = msgpack.packb([1, "cycles", items], use_bin_type=True)
    for decode in DECODERS:
        assert _cycles_left_by(decode, data) == 0, decode.__name__


def test_converting_malformed_proto_reports_leaves_no_reference_cycle() -> None:
    needs_protobuf()
    from ldp.v1 import reports_pb2
    from ldp_client.serde import report_columns_from_proto

    messages = [reports_pb2.Report(report_id=bytes(16), campaign_id="camp", payloads=[reports_pb2.Payload()])] * 50
    assert _cycles_left_by(report_columns_from_proto, messages) == 0
