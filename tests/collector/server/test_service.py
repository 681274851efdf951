"""The gRPC service end to end: real servers on 127.0.0.1 port 0, real channels.

Covers health and reflection, operator/device bearer tokens, a full histogram campaign through
both submit paths, the error mapping with ``google.rpc.Status`` details, WatchCampaign, graceful
shutdown, TLS/mTLS, the metrics endpoint, and the configuration and logging helpers.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import msgpack
import pytest
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from ldp.v1 import campaigns_pb2, reports_pb2, service_pb2, service_pb2_grpc
from ldp_client import serde
from ldp_client.report import Report, pack_batch
from ldp_client.rng import SeededRng
from ldp_client.spec import RoundSpec
from ldp_collector.config import CollectorConfig, ConfigError, load_config
from ldp_collector.errors import FailedPreconditionError, NotFoundError, OverloadedError
from ldp_collector.logging_setup import configure_logging
from ldp_collector.server.lifecycle import RunningServer, start_server
from ldp_collector.server.status import status_for_error
from ldp_collector.server.wire import DEVICE_SERVICE, OPERATOR_SERVICE

pytestmark = pytest.mark.integration

TOKEN = "operator-token-for-tests-0123456789"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
DOMAIN = 6
EPSILON = 2.0


# -- fixtures and helpers -----------------------------------------------------------------------

def make_config(tmp: Path, **changes: Any) -> CollectorConfig:
    values: dict[str, Any] = dict(listen="127.0.0.1:0", data_dir=str(tmp / "data"), operator_token=TOKEN,
                                  tick_interval_s=0.1, watch_poll_interval_s=0.05, grace_period_s=2.0)
    values.update(changes)
    return CollectorConfig(**values)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(make_config(tmp_path_factory.mktemp("service")))
    yield srv
    srv.stop(grace=1.0)


@pytest.fixture(scope="module")
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as ch:
        yield ch


@pytest.fixture(scope="module")
def device(channel: grpc.Channel) -> service_pb2_grpc.DeviceServiceStub:
    return service_pb2_grpc.DeviceServiceStub(channel)


@pytest.fixture(scope="module")
def operator(channel: grpc.Channel) -> service_pb2_grpc.OperatorServiceStub:
    return service_pb2_grpc.OperatorServiceStub(channel)


def histogram_config(**changes: Any) -> campaigns_pb2.CampaignConfig:
    config = campaigns_pb2.CampaignConfig(
        kind=campaigns_pb2.HISTOGRAM, domain=campaigns_pb2.Domain(categorical_size=DOMAIN), epsilon=EPSILON,
        histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.GRR))
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def create(operator: service_pb2_grpc.OperatorServiceStub, **changes: Any) -> campaigns_pb2.Campaign:
    request = service_pb2.CreateCampaignRequest(config=histogram_config(**changes))
    campaign: campaigns_pb2.Campaign = operator.CreateCampaign(request, metadata=AUTH)
    return campaign


def round_spec(device: service_pb2_grpc.DeviceServiceStub, campaign_id: str) -> RoundSpec:
    response = device.GetRoundSpec(service_pb2.GetRoundSpecRequest(campaign_id=campaign_id))
    assert response.HasField("spec") and not response.finished
    return serde.round_spec_from_proto(response.spec)


def make_reports(spec: RoundSpec, values: list[int], seed: int) -> list[Report]:
    rng = SeededRng(seed)
    task = spec.tasks[0]
    out = []
    for value in values:
        payloads = tuple(component.run(value, rng=rng) for component in task.components)
        out.append(Report(report_id=rng.token_bytes(16), campaign_id=spec.campaign_id, round=spec.round,
                          group=task.groups[0], payloads=payloads))
    return out


def submit(device: service_pb2_grpc.DeviceServiceStub, request_id: str,
           reports: list[Report]) -> service_pb2.SubmitReportsResponse:
    request = service_pb2.SubmitReportsRequest(request_id=request_id,
                                               reports=[serde.report_to_proto(r) for r in reports])
    response: service_pb2.SubmitReportsResponse = device.SubmitReports(request)
    return response


def submit_packed(device: service_pb2_grpc.DeviceServiceStub, request_id: str,
                  reports: list[Report]) -> service_pb2.SubmitReportsResponse:
    request = service_pb2.SubmitPackedRequest(request_id=request_id, packed=pack_batch(request_id, reports))
    response: service_pb2.SubmitReportsResponse = device.SubmitPacked(request)
    return response


def error_of(call: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        result = call(*args, **kwargs)
        if hasattr(result, "__next__"):  # a server stream fails when read
            list(result)
    return info.value


def details_of(error: grpc.RpcError) -> dict[str, Any]:
    """The unpacked google.rpc.Status details by type name."""
    call: Any = error  # an RpcError raised by a call is also its grpc.Call
    status = rpc_status.from_call(call)
    assert status is not None, "no google.rpc.Status in the trailers"
    assert status.code == error.code().value[0]
    out: dict[str, Any] = {}
    for detail in status.details:
        for cls in (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest, error_details_pb2.PreconditionFailure,
                    error_details_pb2.RetryInfo):
            if detail.Is(cls.DESCRIPTOR):
                message = cls()
                detail.Unpack(message)
                out[cls.DESCRIPTOR.name] = message
    return out


# -- health and reflection ----------------------------------------------------------------------

def test_health_reports_serving_for_every_service(server: RunningServer, channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", DEVICE_SERVICE, OPERATOR_SERVICE):
        response = health.Check(health_pb2.HealthCheckRequest(service=service))  # no token: health is open
        assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_both_services_and_health(channel: grpc.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    requests = [reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol=DEVICE_SERVICE)]
    responses = list(stub.ServerReflectionInfo(iter(requests)))
    names = {s.name for s in responses[0].list_services_response.service}
    assert {DEVICE_SERVICE, OPERATOR_SERVICE, "grpc.health.v1.Health"} <= names
    assert responses[1].file_descriptor_response.file_descriptor_proto


# -- authentication -----------------------------------------------------------------------------

@pytest.mark.parametrize("metadata", [
    (),
    (("authorization", "Bearer wrong-token-0123456789abcdef"),),
    (("authorization", f"Basic {TOKEN}"),),
    (("authorization", "Bearer "),),
    (("authorization", f"Bearer {TOKEN}x"),),
])
def test_operator_calls_need_the_token(operator: service_pb2_grpc.OperatorServiceStub,
                                       metadata: tuple[tuple[str, str], ...]) -> None:
    error = error_of(operator.ListCampaigns, service_pb2.ListCampaignsRequest(), metadata=metadata)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert details_of(error)["ErrorInfo"].reason == "UNAUTHENTICATED"
    stream_error = error_of(operator.WatchCampaign, service_pb2.WatchCampaignRequest(campaign_id="x"),
                            metadata=metadata)
    assert stream_error.code() == grpc.StatusCode.UNAUTHENTICATED


def test_operator_token_is_accepted_and_device_calls_are_open(
        operator: service_pb2_grpc.OperatorServiceStub, device: service_pb2_grpc.DeviceServiceStub) -> None:
    assert operator.ListCampaigns(service_pb2.ListCampaignsRequest(), metadata=AUTH) is not None
    lower = (("authorization", f"bearer {TOKEN}"),)  # the scheme is case-insensitive
    assert operator.ListCampaigns(service_pb2.ListCampaignsRequest(), metadata=lower) is not None
    error = error_of(device.GetRoundSpec, service_pb2.GetRoundSpecRequest(campaign_id="nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND  # not UNAUTHENTICATED: no device tokens configured


def test_device_tokens_protect_the_device_service(tmp_path: Path) -> None:
    device_token = "device-token-0123456789abcdef"
    with start_server(make_config(tmp_path, device_tokens=(device_token,))) as srv, \
            grpc.insecure_channel(srv.address) as ch:
        stub = service_pb2_grpc.DeviceServiceStub(ch)
        request = service_pb2.GetRoundSpecRequest(campaign_id="nope")
        assert error_of(stub.GetRoundSpec, request).code() == grpc.StatusCode.UNAUTHENTICATED
        bad = (("authorization", "Bearer another-token-0123456789"),)
        assert error_of(stub.GetRoundSpec, request, metadata=bad).code() == grpc.StatusCode.UNAUTHENTICATED
        good = (("authorization", f"Bearer {device_token}"),)
        assert error_of(stub.GetRoundSpec, request, metadata=good).code() == grpc.StatusCode.NOT_FOUND
        assert error_of(stub.GetRoundSpec, request, metadata=AUTH).code() == grpc.StatusCode.NOT_FOUND
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_no_operator_token_only_on_loopback(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="operator_token is required"):
        CollectorConfig(listen="0.0.0.0:0", data_dir=str(tmp_path))
    CollectorConfig(listen="0.0.0.0:0", data_dir=str(tmp_path), allow_insecure_operator=True)
    with start_server(make_config(tmp_path, operator_token="")) as srv, grpc.insecure_channel(srv.address) as ch:
        stub = service_pb2_grpc.OperatorServiceStub(ch)
        assert stub.ListCampaigns(service_pb2.ListCampaignsRequest()) is not None


# -- a whole histogram campaign -----------------------------------------------------------------

def test_histogram_campaign_end_to_end(operator: service_pb2_grpc.OperatorServiceStub,
                                       device: service_pb2_grpc.DeviceServiceStub) -> None:
    campaign = create(operator, description="end to end")
    cid = campaign.config.campaign_id
    assert campaign.state == campaigns_pb2.COLLECTING
    assert operator.GetCampaign(service_pb2.GetCampaignRequest(campaign_id=cid), metadata=AUTH).config.campaign_id == cid
    listed = operator.ListCampaigns(service_pb2.ListCampaignsRequest(page_size=1000), metadata=AUTH)
    assert cid in {c.config.campaign_id for c in listed.campaigns}

    events: list[service_pb2.CampaignEvent] = []
    stream = operator.WatchCampaign(service_pb2.WatchCampaignRequest(campaign_id=cid), metadata=AUTH)
    watcher = threading.Thread(target=lambda: events.extend(stream))
    watcher.start()

    spec = round_spec(device, cid)
    truth = [0.4, 0.25, 0.15, 0.1, 0.06, 0.04]
    n = 6000
    values = [v for v, share in enumerate(truth) for _ in range(round(share * n))]
    reports = make_reports(spec, values, seed=7)
    half = len(reports) // 2

    for start in range(0, half, 1000):
        response = submit(device, f"proto-{start}", reports[start:start + 1000])
        assert (response.accepted, response.duplicates, response.rejected) == (1000, 0, 0)
        assert [o.report_id for o in response.outcomes] == [r.report_id for r in reports[start:start + 1000]]
        assert all(o.status == service_pb2.ReportOutcome.ACCEPTED for o in response.outcomes)
    for start in range(half, len(reports), 1000):
        response = submit_packed(device, f"packed-{start}", reports[start:start + 1000])
        assert (response.accepted, response.duplicates, response.rejected) == (1000, 0, 0)

    # A replayed request gets its first answer; the same reports under a new request id are duplicates.
    replay = submit(device, "proto-0", reports[:1000])
    assert replay.accepted == 1000
    again = submit_packed(device, "dup-packed", reports[:10] + reports[-10:])
    assert (again.accepted, again.duplicates) == (0, 20)
    assert all(o.status == service_pb2.ReportOutcome.DUPLICATE for o in again.outcomes)

    # Undecodable reports are rejected one by one, the batch still succeeds.
    bad = reports_pb2.Report(report_id=b"short", campaign_id=cid, round=spec.round,
                             payloads=[reports_pb2.Payload(index=0)])
    out_of_range = serde.report_to_proto(reports[0])
    out_of_range.report_id = os.urandom(16)
    out_of_range.payloads[0].index = DOMAIN + 5
    mixed = device.SubmitReports(service_pb2.SubmitReportsRequest(request_id="mixed", reports=[bad, out_of_range]))
    assert (mixed.accepted, mixed.rejected) == (0, 2)
    assert mixed.outcomes[0].report_id == b"short" and "report_id" in mixed.outcomes[0].reason
    assert mixed.outcomes[1].reason

    snapshot = operator.GetCampaign(service_pb2.GetCampaignRequest(campaign_id=cid), metadata=AUTH)
    assert snapshot.rounds[-1].reports == n

    closed = operator.CloseRound(service_pb2.CloseRoundRequest(campaign_id=cid, round=spec.round), metadata=AUTH)
    assert closed.state == campaigns_pb2.FINISHED

    estimates = operator.GetEstimates(service_pb2.GetEstimatesRequest(campaign_id=cid), metadata=AUTH)
    assert estimates.reports == n and estimates.confidence == pytest.approx(0.95)
    assert len(estimates.estimates) == DOMAIN
    for e in estimates.estimates:
        expected = truth[e.value] * n
        assert e.std_error > 0 and e.ci_lower < e.count < e.ci_upper
        assert abs(e.count - expected) <= 5 * e.std_error, (e.value, e.count, expected, e.std_error)
    wider = operator.GetEstimates(service_pb2.GetEstimatesRequest(campaign_id=cid, confidence=0.99), metadata=AUTH)
    assert wider.estimates[0].ci_upper - wider.estimates[0].ci_lower > (
        estimates.estimates[0].ci_upper - estimates.estimates[0].ci_lower)

    for result in (device.GetResult(service_pb2.GetResultRequest(campaign_id=cid)).result,
                   operator.GetResult(service_pb2.GetResultRequest(campaign_id=cid), metadata=AUTH).result):
        assert result.state == campaigns_pb2.FINISHED and result.campaign_id == cid
        assert len(result.estimates.estimates) == DOMAIN
    finished = device.GetRoundSpec(service_pb2.GetRoundSpecRequest(campaign_id=cid))
    assert finished.finished and not finished.HasField("spec")

    # Late reports are rejected per report, not as a failed call.
    late = submit(device, "late", make_reports(spec, [1, 2], seed=8))
    assert late.rejected == 2 and all(o.reason for o in late.outcomes)

    watcher.join(timeout=10)
    assert not watcher.is_alive(), "WatchCampaign did not end when the campaign finished"
    assert events[0].campaign.config.campaign_id == cid
    assert events[-1].campaign.state == campaigns_pb2.FINISHED
    assert any(e.current_round_reports > 0 for e in events)
    counts = [e.current_round_reports for e in events if e.campaign.state == campaigns_pb2.COLLECTING]
    assert counts == sorted(counts)


def test_automatic_close_after_reports(operator: service_pb2_grpc.OperatorServiceStub,
                                       device: service_pb2_grpc.DeviceServiceStub) -> None:
    cid = create(operator, close_after_reports=50).config.campaign_id
    spec = round_spec(device, cid)
    assert submit(device, "auto-1", make_reports(spec, [i % DOMAIN for i in range(60)], seed=3)).accepted == 60
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = operator.GetCampaign(service_pb2.GetCampaignRequest(campaign_id=cid), metadata=AUTH).state
        if state == campaigns_pb2.FINISHED:
            break
        time.sleep(0.05)
    assert state == campaigns_pb2.FINISHED


# -- error mapping ------------------------------------------------------------------------------

def test_unknown_campaign_is_not_found(operator: service_pb2_grpc.OperatorServiceStub,
                                       device: service_pb2_grpc.DeviceServiceStub) -> None:
    for call, request, metadata in [
        (operator.GetCampaign, service_pb2.GetCampaignRequest(campaign_id="missing"), AUTH),
        (operator.CloseRound, service_pb2.CloseRoundRequest(campaign_id="missing", round=1), AUTH),
        (operator.GetEstimates, service_pb2.GetEstimatesRequest(campaign_id="missing"), AUTH),
        (operator.GetResult, service_pb2.GetResultRequest(campaign_id="missing"), AUTH),
        (operator.WatchCampaign, service_pb2.WatchCampaignRequest(campaign_id="missing"), AUTH),
        (device.GetRoundSpec, service_pb2.GetRoundSpecRequest(campaign_id="missing"), ()),
        (device.GetResult, service_pb2.GetResultRequest(campaign_id="missing"), ()),
    ]:
        error = error_of(call, request, metadata=metadata)
        assert error.code() == grpc.StatusCode.NOT_FOUND, call
        assert details_of(error)["ErrorInfo"].domain == "ldp.v1"


def test_wrong_or_closed_round_is_failed_precondition(operator: service_pb2_grpc.OperatorServiceStub,
                                                      device: service_pb2_grpc.DeviceServiceStub) -> None:
    cid = create(operator).config.campaign_id
    spec = round_spec(device, cid)
    wrong = error_of(operator.CloseRound, service_pb2.CloseRoundRequest(campaign_id=cid, round=spec.round + 1),
                     metadata=AUTH)
    assert wrong.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert details_of(wrong)["PreconditionFailure"].violations[0].description
    empty = error_of(operator.CloseRound, service_pb2.CloseRoundRequest(campaign_id=cid, round=spec.round),
                     metadata=AUTH)
    assert empty.code() == grpc.StatusCode.FAILED_PRECONDITION  # below min_reports_per_round
    open_estimates = error_of(operator.GetEstimates, service_pb2.GetEstimatesRequest(campaign_id=cid),
                              metadata=AUTH)
    assert open_estimates.code() == grpc.StatusCode.FAILED_PRECONDITION
    submit(device, "one", make_reports(spec, [0], seed=1))
    operator.CloseRound(service_pb2.CloseRoundRequest(campaign_id=cid, round=spec.round), metadata=AUTH)
    closed = error_of(operator.CloseRound, service_pb2.CloseRoundRequest(campaign_id=cid, round=spec.round),
                      metadata=AUTH)
    assert closed.code() == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize("request_id", ["", "x" * 129])
def test_bad_request_id_is_invalid_argument(device: service_pb2_grpc.DeviceServiceStub, request_id: str) -> None:
    error = error_of(device.SubmitReports, service_pb2.SubmitReportsRequest(request_id=request_id))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    violation = details_of(error)["BadRequest"].field_violations[0]
    assert violation.field == "request_id" and "request_id" in violation.description


def test_bad_requests_are_invalid_argument_with_bad_request_details(
        server: RunningServer, operator: service_pb2_grpc.OperatorServiceStub,
        device: service_pb2_grpc.DeviceServiceStub) -> None:
    cid = create(operator).config.campaign_id
    spec = round_spec(device, cid)
    limit = server.config.max_batch_reports
    too_many = service_pb2.SubmitReportsRequest(
        request_id="big", reports=[reports_pb2.Report(campaign_id=cid)] * (limit + 1))
    error = error_of(device.SubmitReports, too_many)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details_of(error)["BadRequest"].field_violations[0].field == "reports"

    # Packed by hand: pack_batch itself refuses more than MAX_BATCH_REPORTS.
    packed_too_many = msgpack.packb([1, "big-packed", [r.to_wire() for r in make_reports(spec, [0], seed=2)] * (limit + 1)])
    error = error_of(device.SubmitPacked, service_pb2.SubmitPackedRequest(packed=packed_too_many))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details_of(error)["BadRequest"].field_violations[0].field == "packed"

    for packed in (b"", b"\xc1garbage", pack_batch("r", [])[:-1]):
        error = error_of(device.SubmitPacked, service_pb2.SubmitPackedRequest(request_id="r", packed=packed))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert details_of(error)["BadRequest"].field_violations[0].field == "packed"

    mismatch = service_pb2.SubmitPackedRequest(request_id="outer", packed=pack_batch("inner", []))
    assert error_of(device.SubmitPacked, mismatch).code() == grpc.StatusCode.INVALID_ARGUMENT

    no_config = error_of(operator.CreateCampaign, service_pb2.CreateCampaignRequest(), metadata=AUTH)
    assert details_of(no_config)["BadRequest"].field_violations[0].field == "config"
    bad_epsilon = error_of(operator.CreateCampaign,
                           service_pb2.CreateCampaignRequest(config=histogram_config(epsilon=-1.0)), metadata=AUTH)
    assert bad_epsilon.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "epsilon" in details_of(bad_epsilon)["BadRequest"].field_violations[0].description

    bad_token = error_of(operator.ListCampaigns, service_pb2.ListCampaignsRequest(page_token="a"), metadata=AUTH)
    assert bad_token.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_undecodable_request_bytes_are_invalid_argument(channel: grpc.Channel) -> None:
    call = channel.unary_unary(f"/{DEVICE_SERVICE}/SubmitReports", request_serializer=None,
                               response_deserializer=None)
    with pytest.raises(grpc.RpcError) as info:
        call(b"\x0a\xff\xff\xff\xff\x0f")  # field 1 with an impossible length
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_duplicate_campaign_id_is_already_exists(operator: service_pb2_grpc.OperatorServiceStub) -> None:
    create(operator, campaign_id="fixed-id-1")
    error = error_of(operator.CreateCampaign,
                     service_pb2.CreateCampaignRequest(config=histogram_config(campaign_id="fixed-id-1")),
                     metadata=AUTH)
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS


def test_status_details_of_each_domain_error() -> None:
    overloaded = status_for_error(OverloadedError("busy", retry_after=2.5))
    assert overloaded.code == grpc.StatusCode.UNAVAILABLE.value[0]
    retry = error_details_pb2.RetryInfo()
    assert any(d.Unpack(retry) for d in overloaded.details if d.Is(retry.DESCRIPTOR))
    assert retry.retry_delay.seconds == 2 and retry.retry_delay.nanos == 500_000_000

    assert status_for_error(NotFoundError("gone")).code == grpc.StatusCode.NOT_FOUND.value[0]
    assert status_for_error(FailedPreconditionError("closed")).code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    internal = status_for_error(RuntimeError("secret path /etc/x"))
    assert internal.code == grpc.StatusCode.INTERNAL.value[0] and "secret" not in internal.message


# -- WatchCampaign, shutdown --------------------------------------------------------------------

def test_watch_stream_follows_reports_and_can_be_cancelled(operator: service_pb2_grpc.OperatorServiceStub,
                                                           device: service_pb2_grpc.DeviceServiceStub) -> None:
    cid = create(operator).config.campaign_id
    spec = round_spec(device, cid)
    stream: Any = operator.WatchCampaign(service_pb2.WatchCampaignRequest(campaign_id=cid), metadata=AUTH)
    first = next(stream)
    assert first.current_round_reports == 0
    submit(device, "watch-1", make_reports(spec, [1, 2, 3], seed=5))
    second = next(stream)
    assert second.current_round_reports == 3
    stream.cancel()
    with pytest.raises(grpc.RpcError) as info:
        next(stream)
    assert info.value.code() == grpc.StatusCode.CANCELLED


def test_graceful_shutdown_goes_not_serving_and_flushes(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    srv = start_server(config)
    with grpc.insecure_channel(srv.address) as ch:
        operator = service_pb2_grpc.OperatorServiceStub(ch)
        device = service_pb2_grpc.DeviceServiceStub(ch)
        cid = create(operator).config.campaign_id
        spec = round_spec(device, cid)
        assert submit(device, "before-stop", make_reports(spec, list(range(DOMAIN)), seed=9)).accepted == DOMAIN
        statuses: list[int] = []
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=DEVICE_SERVICE))

        def follow() -> None:
            with pytest.raises(grpc.RpcError):
                for response in watch:
                    statuses.append(response.status)

        follower = threading.Thread(target=follow)
        follower.start()
        time.sleep(0.2)
        srv.stop(grace=1.0)
        follower.join(timeout=10)
        assert statuses[0] == health_pb2.HealthCheckResponse.SERVING
        assert statuses[-1] == health_pb2.HealthCheckResponse.NOT_SERVING
        error = error_of(device.GetRoundSpec, service_pb2.GetRoundSpecRequest(campaign_id=cid), timeout=2)
        assert error.code() == grpc.StatusCode.UNAVAILABLE
    # The store was flushed and closed: a new server on the same directory sees the reports.
    with start_server(config) as again, grpc.insecure_channel(again.address) as ch:
        campaign = service_pb2_grpc.OperatorServiceStub(ch).GetCampaign(
            service_pb2.GetCampaignRequest(campaign_id=cid), metadata=AUTH)
        assert campaign.rounds[-1].reports == DOMAIN


def test_start_fails_clearly_when_the_port_is_taken(server: RunningServer, tmp_path: Path) -> None:
    with pytest.raises(OSError, match="cannot listen"):
        start_server(make_config(tmp_path, listen=server.address))


# -- TLS and mTLS -------------------------------------------------------------------------------

def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    ext = d / "ext.cnf"
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(d / f"{name}.key"),
                 "-out", str(d / f"{name}.csr"))
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
                 "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(d / f"{name}.pem"))
    return d


def test_tls_and_mtls(pki: Path, tmp_path: Path) -> None:
    ca = (pki / "ca.pem").read_bytes()
    tls = dict(tls_cert=str(pki / "server.pem"), tls_key=str(pki / "server.key"))
    with start_server(make_config(tmp_path / "tls", **tls)) as srv:
        creds = grpc.ssl_channel_credentials(root_certificates=ca)
        with grpc.secure_channel(srv.address, creds) as ch:
            health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
    with start_server(make_config(tmp_path / "mtls", tls_client_ca=str(pki / "ca.pem"), **tls)) as srv:
        anonymous = grpc.ssl_channel_credentials(root_certificates=ca)
        with grpc.secure_channel(srv.address, anonymous) as ch:
            error = error_of(health_pb2_grpc.HealthStub(ch).Check, health_pb2.HealthCheckRequest(), timeout=5)
            assert error.code() == grpc.StatusCode.UNAVAILABLE
        client = grpc.ssl_channel_credentials(root_certificates=ca, private_key=(pki / "client.key").read_bytes(),
                                              certificate_chain=(pki / "client.pem").read_bytes())
        with grpc.secure_channel(srv.address, client) as ch:
            health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING


# -- metrics ------------------------------------------------------------------------------------

def test_metrics_endpoint_counts_reports_by_kind_and_outcome(tmp_path: Path) -> None:
    with start_server(make_config(tmp_path, metrics_port=0)) as srv:
        assert srv.metrics_port == 0  # 0 = off
    # Port 0 means "off", so pick a free port for the endpoint.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with start_server(make_config(tmp_path, metrics_port=port)) as srv, grpc.insecure_channel(srv.address) as ch:
        operator = service_pb2_grpc.OperatorServiceStub(ch)
        device = service_pb2_grpc.DeviceServiceStub(ch)
        cid = create(operator).config.campaign_id
        spec = round_spec(device, cid)
        reports = make_reports(spec, [0, 1, 2], seed=4)
        submit(device, "m1", reports)
        submit(device, "m2", reports[:1])
        error_of(operator.ListCampaigns, service_pb2.ListCampaignsRequest())
        text = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5).read().decode()
    assert 'ldp_reports_total{kind="histogram",outcome="accepted"} 3.0' in text
    assert 'ldp_reports_total{kind="histogram",outcome="duplicate"} 1.0' in text
    assert 'ldp_rpcs_total{code="OK",method="DeviceService/SubmitReports"} 2.0' in text
    assert 'ldp_auth_failures_total{service="ldp.v1.OperatorService"} 1.0' in text
    assert "ldp_rpc_duration_seconds_bucket" in text and "ldp_submit_batch_reports_bucket" in text


# -- configuration and logging ------------------------------------------------------------------

def test_config_from_toml_with_env_overrides(tmp_path: Path) -> None:
    path = tmp_path / "ldp-collector.toml"
    path.write_text('listen = "127.0.0.1:6000"\nmax_batch_reports = 500\ndevice_tokens = ["d-token-0123456789ab"]\n'
                    '[collector]\nlog_format = "json"\n')
    env = {"LDP_LISTEN": "127.0.0.1:7000", "LDP_METRICS_PORT": "9100", "LDP_OPERATOR_TOKEN": TOKEN,
           "LDP_REUSE_PORT": "yes", "LDP_GRACE_PERIOD_S": "3"}
    config = load_config(path, env=env)
    assert config.listen == "127.0.0.1:7000" and config.metrics_port == 9100 and config.max_batch_reports == 500
    assert config.device_tokens == ("d-token-0123456789ab",) and config.log_format == "json"
    assert config.reuse_port is True and config.grace_period_s == 3.0 and config.operator_token == TOKEN
    assert TOKEN not in repr(config)
    assert load_config(path, env=env, overrides={"max_batch_reports": 7}).max_batch_reports == 7
    assert load_config(path, env={"LDP_DEVICE_TOKENS": "a-token-0123456789abcd, b-token-0123456789abcd"}
                       ).device_tokens == ("a-token-0123456789abcd", "b-token-0123456789abcd")


def test_config_token_files(tmp_path: Path) -> None:
    (tmp_path / "op").write_text(TOKEN + "\n")
    (tmp_path / "dev").write_text("# devices\nd1-token-0123456789ab\nd2-token-0123456789ab\n")
    config = load_config(None, env={"LDP_OPERATOR_TOKEN_FILE": str(tmp_path / "op"),
                                    "LDP_DEVICE_TOKENS_FILE": str(tmp_path / "dev")})
    assert config.operator_token == TOKEN and len(config.device_tokens) == 2


@pytest.mark.parametrize(("env", "message"), [
    ({"LDP_METRICS_PORT": "abc"}, "LDP_METRICS_PORT: metrics_port must be an integer"),
    ({"LDP_METRICS_PORT": "70000"}, "metrics_port must be an integer in"),
    ({"LDP_LISTEN": "nowhere"}, "listen must be host:port"),
    ({"LDP_LISTEN": "127.0.0.1:99999"}, "listen port"),
    ({"LDP_REUSE_PORT": "maybe"}, "LDP_REUSE_PORT: reuse_port must be true or false"),
    ({"LDP_LOG_FORMAT": "xml"}, "log_format must be one of"),
    ({"LDP_OPERATOR_TOKEN": "short"}, "operator_token must be 16"),
    ({"LDP_TLS_CERT": "/x.pem"}, "tls_cert and tls_key"),
    ({"LDP_MAX_BATCH_REPORTS": "0"}, "max_batch_reports"),
])
def test_bad_config_values_name_the_key(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, env=env)


def test_bad_config_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("listen = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, env={})
    bad.write_text('lisen = "127.0.0.1:1"\n')
    with pytest.raises(ConfigError, match="unknown configuration key.*lisen"):
        load_config(bad, env={})
    bad.write_text('max_batch_reports = "many"\n')
    with pytest.raises(ConfigError, match="max_batch_reports"):
        load_config(bad, env={})


def test_default_config_file_is_read_from_the_working_directory(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_config(env={}).listen == "127.0.0.1:50051"
    (tmp_path / "ldp-collector.toml").write_text('data_dir = "/srv/ldp"\n')
    assert load_config(env={}).data_dir == "/srv/ldp"


def test_json_logs_off_terminal_text_on_request() -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    stream = io.StringIO()
    try:
        configure_logging("auto", "INFO", stream=stream)  # a StringIO is not a TTY: JSON
        logging.getLogger("ldp_collector.test").info("round closed", extra={"campaign_id": "c1", "round": 2})
        line = json.loads(stream.getvalue().strip().splitlines()[-1])
        assert line["msg"] == "round closed" and line["campaign_id"] == "c1" and line["round"] == 2
        assert line["level"] == "INFO" and line["ts"].endswith("Z")
        text = io.StringIO()
        configure_logging("text", "INFO", stream=text)
        logging.getLogger("ldp_collector.test").warning("slow", extra={"ms": 5})
        assert "WARNING" in text.getvalue() and "slow ms=5" in text.getvalue()
        assert stream.getvalue().count("\n") == 1  # the first handler was replaced, not kept
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
