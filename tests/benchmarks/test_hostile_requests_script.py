"""The hostile-requests benchmark (``benchmarks/hostile_requests.py``) sends what it says it sends."""

from __future__ import annotations

import hostile_requests as hostile
import msgpack

from ldp.v1 import service_pb2
from ldp_client.report import MAX_BATCH_BYTES, declared_batch_size


def test_the_attacks_as_issued_have_the_sizes_of_issue_15() -> None:
    deep = service_pb2.SubmitPackedRequest.FromString(hostile.deep_request()).packed
    assert declared_batch_size(deep) == 9_999 and 10_000_000 < len(deep) < 10_100_000
    assert deep.endswith(b"\x91" * 1_000 + b"\x00")
    empty = hostile.empty_reports_request(10**9)
    assert len(empty) > 30_000_000 and len(service_pb2.SubmitReportsRequest.FromString(empty).reports) == 15_000_000
    packed, reports = hostile.payload_list_requests(hostile.PAYLOAD_LIST_BYTES, "c")
    items = msgpack.unpackb(service_pb2.SubmitPackedRequest.FromString(packed).packed)[2]
    assert {len(item[5]) for item in items} == {2_000}
    assert {len(r.payloads) for r in service_pb2.SubmitReportsRequest.FromString(reports).reports} == {2_000}
    assert max(len(packed), len(reports)) <= 10_000_000


def test_the_attacks_at_the_limit_fit_into_the_receive_limit() -> None:
    messages = hostile.attack_messages(hostile._PHASES[1], "c")
    sizes = [len(data) for attack in messages.values() for _, data in attack]
    assert all(MAX_BATCH_BYTES - 10_000 < size <= MAX_BATCH_BYTES for size in sizes), sizes
