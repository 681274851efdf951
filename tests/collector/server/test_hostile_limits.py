"""Availability under hostile requests (issue 15, items 5 and 8), through a real server on loopback:

* the default receive limit is the largest legal batch (``ldp_client.report.MAX_BATCH_BYTES``), and
  the transport refuses a byte more;
* ``SubmitReports`` is counted from the wire before it is parsed, and parsed off the event loop;
* refused requests are not kept in memory until the garbage collector runs;
* garbage sent to the health and reflection services is answered INVALID_ARGUMENT and logged as
  aggregated refusals, without a traceback per message.

The time and memory figures under sustained attack are measured by ``benchmarks/hostile_requests.py``,
not here.
"""

from __future__ import annotations

import gc
import logging
import threading
import tracemalloc
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import ldp_collector.server.servicer as servicer_module
from ldp.v1 import reports_pb2, service_pb2
from ldp_client.report import MAX_BATCH_BYTES, MAX_BATCH_REPORTS
from ldp_collector.config import CollectorConfig, ConfigError
from ldp_collector.server.lifecycle import RunningServer, start_server
from ldp_collector.server.wire import DEVICE_SERVICE

pytestmark = pytest.mark.integration

OPTIONS = [("grpc.max_send_message_length", 8 * MAX_BATCH_BYTES)]
REPORTS = f"/{DEVICE_SERVICE}/SubmitReports"
PACKED = f"/{DEVICE_SERVICE}/SubmitPacked"
HEALTH = "/grpc.health.v1.Health/"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A collector with the default limits."""
    srv = start_server(CollectorConfig(listen="127.0.0.1:0", data_dir=str(tmp_path_factory.mktemp("limits"))))
    yield srv
    srv.stop(grace=1.0)


@pytest.fixture
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address, options=OPTIONS) as ch:
        yield ch


def raw(channel: grpc.Channel, path: str) -> Any:
    return channel.unary_unary(path, request_serializer=None, response_deserializer=None)


def code_of(call: Any, data: bytes) -> grpc.StatusCode:
    try:
        call(data, timeout=30)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def empty_reports(n: int) -> bytes:
    """A ``SubmitReportsRequest`` of ``n`` empty reports: 2 bytes each on the wire."""
    return service_pb2.SubmitReportsRequest(request_id="empty").SerializeToString() + b"\x12\x00" * n


# -- the default limits ------------------------------------------------------------------------------------

def test_the_default_limits_are_the_sdk_batch_limits() -> None:
    config = CollectorConfig()
    assert config.max_receive_bytes == MAX_BATCH_BYTES == 1_820_515
    assert config.max_batch_reports == MAX_BATCH_REPORTS == 10_000
    with pytest.raises(ConfigError, match="max_batch_reports"):
        CollectorConfig(max_batch_reports=MAX_BATCH_REPORTS + 1)


def test_the_transport_refuses_a_byte_more_than_the_largest_legal_batch(channel: grpc.Channel) -> None:
    report = reports_pb2.Report(report_id=bytes(16), campaign_id="c" * 128, round=2**32 - 1, group=4095,
                                payloads=[reports_pb2.Payload(hashed=reports_pb2.HashedValue(seed=2**64 - 1,
                                                                                            value=2**32 - 1))])
    largest = service_pb2.SubmitReportsRequest(request_id="\U0010ffff" * 128, reports=[report] * MAX_BATCH_REPORTS)
    data = largest.SerializeToString()
    assert len(data) == MAX_BATCH_BYTES
    response = service_pb2.SubmitReportsResponse.FromString(raw(channel, REPORTS)(data, timeout=60))
    assert response.rejected == MAX_BATCH_REPORTS  # read and answered: no such campaign
    too_big = service_pb2.SubmitPackedRequest(request_id="big", packed=b"\x00" * MAX_BATCH_BYTES).SerializeToString()
    assert code_of(raw(channel, PACKED), too_big) == grpc.StatusCode.RESOURCE_EXHAUSTED


# -- SubmitReports is counted first, and parsed in the worker pool -----------------------------------------

def test_submit_reports_is_counted_before_parsing_and_parsed_off_the_event_loop(
        server: RunningServer, channel: grpc.Channel, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[tuple[str, str]] = []
    real_parse = servicer_module.parse_request

    def recording_parse(request_type: Any, data: bytes) -> Any:
        parsed.append((request_type.__name__, threading.current_thread().name))
        return real_parse(request_type, data)

    monkeypatch.setattr(servicer_module, "parse_request", recording_parse)
    # 100 001 empty reports: refused from their count, never parsed.
    with pytest.raises(grpc.RpcError) as info:
        raw(channel, REPORTS)(empty_reports(100_001), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 10000 reports" in (info.value.details() or "")
    assert [name for name, _ in parsed] == []
    # A well-formed request is parsed on a worker thread, not on the event loop's.
    response = service_pb2.SubmitReportsResponse.FromString(raw(channel, REPORTS)(empty_reports(3), timeout=30))
    assert response.rejected == 3
    assert [name for name, _ in parsed] == ["SubmitReportsRequest"]
    assert parsed[0][1].startswith(("ldp-handler", "ldp-decoder")), parsed


@pytest.mark.parametrize("data", [
    b"\x0a\x05abc",                     # a length beyond the end
    b"\x12\x00\x0b\x12\x00",            # the group wire types, which protobuf would skip unread
    b"\x12\x00\x08" + b"\xff" * 11,     # a varint longer than 10 bytes
])
def test_malformed_wire_data_is_refused_before_parsing(channel: grpc.Channel, data: bytes) -> None:
    assert code_of(raw(channel, REPORTS), data) == grpc.StatusCode.INVALID_ARGUMENT


def test_the_report_count_skips_every_other_field(channel: grpc.Channel) -> None:
    # Unknown varint, 64-bit, 32-bit and length-delimited fields between the reports are not reports.
    extra = b"\x18\x01" + b"\x21" + bytes(8) + b"\x2d" + bytes(4) + b"\x32\x00"
    data = service_pb2.SubmitReportsRequest(request_id="mixed").SerializeToString() + (b"\x12\x00" + extra) * 5
    response = service_pb2.SubmitReportsResponse.FromString(raw(channel, REPORTS)(data, timeout=30))
    assert response.rejected == len(response.outcomes) == 5


# -- refused requests are freed at once ----------------------------------------------------------------

def test_refused_requests_are_not_kept_until_a_garbage_collection(channel: grpc.Channel) -> None:
    # Half a megabyte each: 262 000 empty reports, and 500 reports nested 1 000 arrays deep.
    counted = empty_reports(262_000)
    deep = service_pb2.SubmitPackedRequest(packed=b"\x93\x01\xa4deep\xcd\x01\xf4" + (b"\x91" * 1000 + b"\x00") * 500)
    cases = [(REPORTS, counted), (PACKED, deep.SerializeToString())]
    for path, data in cases:  # once first, so that whatever is created once is not counted
        assert code_of(raw(channel, path), data) == grpc.StatusCode.INVALID_ARGUMENT
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        for path, data in cases:
            for _ in range(10):
                assert code_of(raw(channel, path), data) == grpc.StatusCode.INVALID_ARGUMENT
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.enable()
    assert held < 2 * 2**20, f"{held / 2**20:.1f} MiB still held after 20 refused requests of 0.5 MB"


# -- garbage to health and reflection ------------------------------------------------------------------

def test_garbage_to_health_and_reflection_is_refused_and_logged_as_aggregated_refusals(
        channel: grpc.Channel, caplog: pytest.LogCaptureFixture) -> None:
    garbage = b"\xff\xff\xff\xff"
    with caplog.at_level(logging.INFO):
        codes = {code_of(raw(channel, HEALTH + "Check"), garbage) for _ in range(200)}
        watch = channel.unary_stream(HEALTH + "Watch", request_serializer=None, response_deserializer=None)
        reflect = channel.stream_stream(REFLECTION, request_serializer=None, response_deserializer=None)
        for _ in range(20):
            for call in (lambda: list(watch(garbage, timeout=30)), lambda: list(reflect(iter([garbage]), timeout=30))):
                with pytest.raises(grpc.RpcError) as info:
                    call()
                codes.add(info.value.code())
    assert codes == {grpc.StatusCode.INVALID_ARGUMENT}
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    refusals = [r for r in caplog.records if r.getMessage().startswith("refused /grpc.")]
    assert 1 <= len(refusals) <= 2, [r.getMessage() for r in caplog.records]  # one line per 10 s, counting
    assert "malformed request" in refusals[0].getMessage()

    # Well-formed requests are served as before.
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    stream = health.Watch(health_pb2.HealthCheckRequest(), timeout=10)
    assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
    stream.cancel()
    answers = list(reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10))
    assert DEVICE_SERVICE in {s.name for s in answers[0].list_services_response.service}

