"""CollectorClient and Sender against a real gRPC server on 127.0.0.1 (port 0) with a fake collector."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc")
pytest.importorskip("ldp.v1")

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2  # type: ignore[import-untyped, unused-ignore]
from grpc_status import rpc_status

from ldp.v1 import campaigns_pb2, service_pb2, service_pb2_grpc
from ldp_client.clusters import CellClusterModel, CenterModel
from ldp_client.device import Device
from ldp_client.encoders import CategoricalEncoder, NumericDomain, TreeCell
from ldp_client.encoders.geometry import tree_children
from ldp_client.errors import EncodingError, InvalidParameterError, ProtocolError, TransportError
from ldp_client.grpc import (
    CollectorClient,
    OutcomeStatus,
    RequestRejectedError,
    RpcFailedError,
    Sender,
    drain,
)
from ldp_client.mechanisms import GRRParams
from ldp_client.report import Report, unpack_batch
from ldp_client.rng import SeededRng
from ldp_client.serde import cluster_model_to_proto, report_from_proto, round_spec_to_proto
from ldp_client.spec import ROUND_NOT_OPEN_REASON, Component, GroupTask, RoundNotOpen, RoundSpec

pytestmark = pytest.mark.integration

SPEC = RoundSpec(campaign_id="camp", round=0, group_weights=(1,),
                 tasks=(GroupTask(groups=(0,), components=(Component(
                     encoder=CategoricalEncoder(domain_size=4), mechanism=GRRParams(domain_size=4, epsilon=1.0)),)),),
                 campaign_epsilon=4.0, max_reports_per_device=4, kind="histogram")


def _status(code: int, message: str, retry_delay: float | None = None, reason: str | None = None) -> Any:
    details = []
    if reason is not None:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="ldp.v1"))
        details.append(detail)
    if retry_delay is not None:
        detail = any_pb2.Any()
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(retry_delay * 1e9))
        detail.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        details.append(detail)
    return rpc_status.to_status(status_pb2.Status(code=code, message=message, details=details))


class FakeCollector(service_pb2_grpc.DeviceServiceServicer):
    """Idempotent by request_id and report_id; fails on demand."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.failures: list[tuple[int, str, float | None]] = []  # popped one per submit call
        self.calls: list[tuple[str, str, int]] = []  # (method, request_id, number of reports)
        self.metadata: list[dict[str, Any]] = []
        self.stored: dict[bytes, Report] = {}
        self.answers: dict[str, service_pb2.SubmitReportsResponse] = {}
        self.reject: dict[bytes, str] = {}
        self.finished = False
        self.slow_first_call = 0.0
        self.results: dict[str, campaigns_pb2.Result] = {}  # published results by campaign id
        #: Answers of the next GetRoundSpec calls, one popped per call: "not-open" (UNAVAILABLE,
        #: RetryInfo 0.25 s, ErrorInfo ROUND_NOT_OPEN), "empty" (an older collector's between-rounds
        #: answer) or "busy" (overload: UNAVAILABLE, RetryInfo 0.01 s, no reason); then the spec.
        self.round_answers: list[str] = []
        self.round_calls = 0

    def _fail_if_asked(self, context: grpc.ServicerContext) -> None:
        with self.lock:
            failure = self.failures.pop(0) if self.failures else None
        if failure is not None:
            context.abort_with_status(_status(*failure))

    def _submit(self, method: str, request_id: str, reports: list[Report | ProtocolError],
                context: grpc.ServicerContext) -> service_pb2.SubmitReportsResponse:
        self.metadata.append(dict(context.invocation_metadata()))
        with self.lock:
            self.calls.append((method, request_id, len(reports)))
            delay, self.slow_first_call = self.slow_first_call, 0.0
        if delay:
            time.sleep(delay)
        self._fail_if_asked(context)
        with self.lock:
            if request_id in self.answers:  # a resent batch gets the first answer again
                return self.answers[request_id]
            response = service_pb2.SubmitReportsResponse()
            for r in reports:
                assert isinstance(r, Report)
                outcome = response.outcomes.add(report_id=r.report_id)
                if r.report_id in self.reject:
                    outcome.status, outcome.reason = service_pb2.ReportOutcome.REJECTED, self.reject[r.report_id]
                    response.rejected += 1
                elif r.report_id in self.stored:
                    outcome.status = service_pb2.ReportOutcome.DUPLICATE
                    response.duplicates += 1
                else:
                    self.stored[r.report_id] = r
                    outcome.status = service_pb2.ReportOutcome.ACCEPTED
                    response.accepted += 1
            self.answers[request_id] = response
            return response

    def SubmitReports(self, request: Any, context: grpc.ServicerContext) -> Any:
        reports: list[Report | ProtocolError] = [report_from_proto(r) for r in request.reports]
        return self._submit("SubmitReports", request.request_id, reports, context)

    def SubmitPacked(self, request: Any, context: grpc.ServicerContext) -> Any:
        inner_id, reports = unpack_batch(request.packed)
        assert inner_id == request.request_id
        return self._submit("SubmitPacked", request.request_id, reports, context)

    def GetRoundSpec(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.metadata.append(dict(context.invocation_metadata()))
        if request.campaign_id != "camp":
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown campaign {request.campaign_id}")
        with self.lock:
            self.round_calls += 1
            answer = self.round_answers.pop(0) if self.round_answers else None
        if answer == "not-open":
            context.abort_with_status(_status(code_pb2.UNAVAILABLE, "round 1 closed; the next is being prepared",
                                              0.25, reason=ROUND_NOT_OPEN_REASON))
        if answer == "busy":
            context.abort_with_status(_status(code_pb2.UNAVAILABLE, "busy", 0.01))
        if answer == "empty":
            return service_pb2.GetRoundSpecResponse()
        if self.finished:
            return service_pb2.GetRoundSpecResponse(finished=True)
        return service_pb2.GetRoundSpecResponse(spec=round_spec_to_proto(SPEC))

    def GetResult(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.lock:
            self.calls.append(("GetResult", request.campaign_id, 0))
            published = self.results.get(request.campaign_id)
        if published is not None:
            return service_pb2.GetResultResponse(result=published)
        return service_pb2.GetResultResponse(result=campaigns_pb2.Result(
            campaign_id=request.campaign_id, state=campaigns_pb2.FINISHED, warnings=["few reports"]))


@pytest.fixture
def collector() -> Iterator[tuple[FakeCollector, str]]:
    fake = FakeCollector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_pb2_grpc.add_DeviceServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield fake, f"127.0.0.1:{port}"
    finally:
        server.stop(0)


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        time.sleep(min(seconds, 0.05))


def make_reports(n: int, campaign: str = "camp") -> list[Report]:
    return [Report(report_id=i.to_bytes(16, "big"), campaign_id=campaign, round=0, group=0, payloads=(i % 4,))
            for i in range(1, n + 1)]


def test_get_round_spec_and_result(collector: tuple[FakeCollector, str]) -> None:
    fake, target = collector
    with CollectorClient(target, device_token="tok-1") as client:
        assert client.get_round_spec("camp") == SPEC
        result = client.get_result("camp")
        assert isinstance(result, campaigns_pb2.Result) and list(result.warnings) == ["few reports"]
        fake.finished = True
        assert client.get_round_spec("camp") is None
        with pytest.raises(RequestRejectedError) as info:
            client.get_round_spec("other")
        assert info.value.code == grpc.StatusCode.NOT_FOUND and "unknown campaign other" in str(info.value)
        assert isinstance(info.value, ProtocolError)
    assert fake.metadata[0]["authorization"] == "Bearer tok-1"


CELL_MODEL = CellClusterModel(
    domain=NumericDomain(lower=(0.0, 0.0), upper=(10.0, 10.0)),
    cells=(*tree_children(TreeCell(level=0, morton_index=0), 2)[1:], *tree_children(TreeCell(level=1, morton_index=0), 2)),
    labels=(0, 1, -1, 1, 0, -1, 0))
CENTER_MODEL = CenterModel(centers=((0.0, 0.0), (10.0, 10.0)))


def test_get_cluster_model_and_cluster_label(collector: tuple[FakeCollector, str]) -> None:
    fake, target = collector
    for campaign, model in (("grid", CELL_MODEL), ("kmeans", CENTER_MODEL)):
        fake.results[campaign] = campaigns_pb2.Result(campaign_id=campaign, state=campaigns_pb2.FINISHED,
                                                      clustering=cluster_model_to_proto(model))
    with CollectorClient(target) as client:
        assert client.get_cluster_model("grid") == CELL_MODEL
        assert client.get_cluster_model("kmeans") == CENTER_MODEL
        assert client.cluster_label("grid", (9.0, 1.0)) == 0 and client.cluster_label("grid", [9.0, 9.0]) == -1
        assert client.cluster_label("grid", (3.0, 1.0)) == 0 and client.cluster_label("grid", (-5.0, 50.0)) == 1
        assert client.cluster_label("kmeans", (4.9, 5.0)) == 0 and client.cluster_label("kmeans", (6.0, 6.0)) == 1
        with pytest.raises(EncodingError, match="dimension 2, got 3"):
            client.cluster_label("kmeans", (1.0, 2.0, 3.0))
        # "camp" has a finished result without a clustering
        with pytest.raises(ProtocolError, match="campaign 'camp' published no clustering"):
            client.get_cluster_model("camp")
        fake.results["open"] = campaigns_pb2.Result(campaign_id="open", state=campaigns_pb2.COLLECTING,
                                                    clustering=cluster_model_to_proto(CENTER_MODEL))
        with pytest.raises(ProtocolError, match="campaign 'open' is COLLECTING, not FINISHED"):
            client.cluster_label("open", (1.0, 1.0))
    # labelling reads public data only: nothing but GetResult calls, no report reached the collector
    assert {method for method, _, _ in fake.calls} == {"GetResult"} and fake.stored == {}


def test_retries_honour_retry_info_and_reuse_the_request_id(collector: tuple[FakeCollector, str]) -> None:
    fake, target = collector
    fake.failures = [(code_pb2.UNAVAILABLE, "overloaded", 0.03)] * 3
    sleeps = Sleeps()
    with CollectorClient(target, rng=SeededRng(1), sleep=sleeps) as client:
        outcomes = client.submit(make_reports(3))
    assert [o.status for o in outcomes] == [OutcomeStatus.ACCEPTED] * 3
    assert len(fake.calls) == 4 and len({request_id for _, request_id, _ in fake.calls}) == 1
    assert len(sleeps.delays) == 3 and all(0.03 <= d <= 0.03 * 1.2 for d in sleeps.delays)


def test_batches_get_their_own_request_ids_and_duplicates_are_reported(collector: tuple[FakeCollector, str]) -> None:
    fake, target = collector
    reports = make_reports(7)
    with CollectorClient(target, max_batch=3) as client:
        first = client.submit(reports)
        assert [o.report_id for o in first] == [r.report_id for r in reports]
        again = client.submit_packed(reports[:4] + make_reports(9)[7:])
    assert [n for _, _, n in fake.calls] == [3, 3, 1, 3, 3]
    assert len({request_id for _, request_id, _ in fake.calls}) == 5
    assert [o.status for o in again] == [OutcomeStatus.DUPLICATE] * 4 + [OutcomeStatus.ACCEPTED] * 2
    assert len(fake.stored) == 9


def test_batches_are_cut_by_bytes_as_well_as_by_count(collector: tuple[FakeCollector, str]) -> None:
    # 40 reports of 100 kB: 18 fit into the collector's receive limit (MAX_BATCH_BYTES), in either encoding.
    fake, target = collector
    reports = [dataclasses.replace(r, payloads=(bytes([i]) * 100_000,)) for i, r in enumerate(make_reports(40))]
    with CollectorClient(target) as client:
        assert [o.status for o in client.submit(reports)] == [OutcomeStatus.ACCEPTED] * 40
        assert [o.status for o in client.submit_packed(reports)] == [OutcomeStatus.DUPLICATE] * 40
    assert [(method, n) for method, _, n in fake.calls] == [("SubmitReports", 18), ("SubmitReports", 18),
                                                             ("SubmitReports", 4), ("SubmitPacked", 18),
                                                             ("SubmitPacked", 18), ("SubmitPacked", 4)]


def test_full_jitter_backoff_without_retry_info(collector: tuple[FakeCollector, str]) -> None:
    fake, target = collector
    fake.failures = [(code_pb2.RESOURCE_EXHAUSTED, "slow down", None)] * 4
    sleeps = Sleeps()
    with CollectorClient(target, rng=SeededRng(5), sleep=sleeps, backoff_base=0.01, backoff_max=0.025) as client:
        assert client.submit(make_reports(1))[0].status is OutcomeStatus.ACCEPTED
    caps = [0.01, 0.02, 0.025, 0.025]
    assert len(sleeps.delays) == 4 and all(0 <= d <= cap for d, cap in zip(sleeps.delays, caps))
    assert len(set(sleeps.delays)) == 4  # jittered


def test_a_message_size_refusal_is_not_retried(collector: tuple[FakeCollector, str]) -> None:
    fake, target = collector
    fake.failures = [(code_pb2.RESOURCE_EXHAUSTED, "Received message larger than max (40000000 vs. 33554432)", None)]
    sleeps = Sleeps()
    with CollectorClient(target, sleep=sleeps) as client:
        with pytest.raises(RpcFailedError) as info:
            client.submit(make_reports(1))
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and info.value.attempts == 1
    assert len(fake.calls) == 1 and sleeps.delays == []


def test_retries_are_exhausted(collector: tuple[FakeCollector, str]) -> None:
    fake, target = collector
    fake.failures = [(code_pb2.UNAVAILABLE, "down", None)] * 10
    with CollectorClient(target, max_attempts=3, sleep=Sleeps(), backoff_base=0.001) as client:
        with pytest.raises(RpcFailedError) as info:
            client.submit(make_reports(1))
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and info.value.attempts == 3
    assert isinstance(info.value, TransportError) and "after 3 attempt(s): UNAVAILABLE: down" in str(info.value)
    assert len(fake.calls) == 3


def test_long_retry_info_stops_with_retry_after(collector: tuple[FakeCollector, str]) -> None:
    fake, target = collector
    fake.failures = [(code_pb2.UNAVAILABLE, "maintenance", 120.0)]
    with CollectorClient(target, sleep=Sleeps(), backoff_max=10.0) as client:
        with pytest.raises(RpcFailedError) as info:
            client.submit(make_reports(1))
    assert info.value.retry_after == 120.0 and len(fake.calls) == 1
    assert "retry after 120 s" in str(info.value)


def test_invalid_argument_is_not_retried(collector: tuple[FakeCollector, str]) -> None:
    fake, target = collector
    fake.failures = [(code_pb2.INVALID_ARGUMENT, "payload out of range", None)]
    with CollectorClient(target, sleep=Sleeps()) as client:
        with pytest.raises(RequestRejectedError, match="INVALID_ARGUMENT: payload out of range"):
            client.submit(make_reports(1))
    assert len(fake.calls) == 1


def test_deadline_exceeded_is_retried(collector: tuple[FakeCollector, str]) -> None:
    fake, target = collector
    fake.slow_first_call = 1.0
    with CollectorClient(target, timeout=0.3, sleep=Sleeps(), backoff_base=0.001) as client:
        assert client.submit(make_reports(2))[1].status is OutcomeStatus.ACCEPTED
    assert len(fake.calls) == 2 and fake.calls[0][1] == fake.calls[1][1]


def test_unreachable_collector(tmp_path: Path) -> None:
    with CollectorClient("127.0.0.1:1", timeout=0.5, max_attempts=2, sleep=Sleeps(), backoff_base=0.001) as client:
        with pytest.raises(RpcFailedError, match="UNAVAILABLE"):
            client.get_round_spec("camp")


def test_client_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match="max_batch must be in"):
        CollectorClient("127.0.0.1:1", max_batch=0)
    with pytest.raises(ValueError, match="device_token"):
        CollectorClient("127.0.0.1:1", device_token="a\nb")
    with pytest.raises(ValueError, match="target"):
        CollectorClient("")


@pytest.mark.parametrize("packed", [False, True])
def test_sender_drains_the_outbox(collector: tuple[FakeCollector, str], tmp_path: Path, packed: bool) -> None:
    fake, target = collector
    device = Device(tmp_path / "state", rng=SeededRng(3))
    reports = [device.participate(dataclasses.replace(SPEC, campaign_id=f"c{i}"), i % 4) for i in range(5)]
    assert all(r is not None for r in reports)
    fake.reject[reports[2].report_id] = "round closed"  # type: ignore[union-attr]
    fake.failures = [(code_pb2.UNAVAILABLE, "busy", 0.01)]
    with CollectorClient(target, max_batch=2, sleep=Sleeps()) as client:
        outcome = Sender(device, client, packed=packed).drain()
        assert (outcome.accepted, outcome.duplicates, outcome.sent) == (4, 0, 5)
        assert [(r.report, r.reason) for r in outcome.rejected] == [(reports[2], "round closed")]
        assert device.pending_reports() == [] and len(device.outbox) == 0
        assert device.spent_total() == 5.0  # the rejected report's budget stays spent
        assert drain(device, client).sent == 0


def test_sender_keeps_unsent_batches_pending(collector: tuple[FakeCollector, str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _, target = collector
    device = Device.in_memory(rng=SeededRng(4))
    reports = [device.participate(dataclasses.replace(SPEC, campaign_id=f"c{i}"), 1) for i in range(4)]
    with CollectorClient(target, max_batch=2, sleep=Sleeps()) as client:
        real_submit = client.submit
        calls = [0]

        def flaky_submit(batch: list[Report]) -> Any:
            calls[0] += 1
            if calls[0] == 2:
                raise RpcFailedError("SubmitReports", grpc.StatusCode.UNAVAILABLE, "gone", 6)
            return real_submit(batch)

        monkeypatch.setattr(client, "submit", flaky_submit)
        with pytest.raises(RpcFailedError):
            Sender(device, client).drain()
        assert device.pending_reports() == reports[2:]
        monkeypatch.undo()
        assert Sender(device, client).drain().accepted == 2 and device.pending_reports() == []


# -- between two rounds: "not yet", never an error ------------------------------------------------


def test_poll_round_spec_between_rounds_answers_not_yet_at_once(collector: tuple[FakeCollector, str]) -> None:
    fake, target = collector
    fake.round_answers = ["not-open", "empty"]
    sleeps = Sleeps()
    with CollectorClient(target, rng=SeededRng(2), sleep=sleeps) as client:
        assert client.poll_round_spec("camp") == RoundNotOpen(campaign_id="camp", retry_after=0.25)
        # An older collector answered between two rounds with neither a spec nor finished.
        assert client.poll_round_spec("camp") == RoundNotOpen(campaign_id="camp", retry_after=1.0)
        assert client.poll_round_spec("camp") == SPEC
        fake.round_answers = ["not-open"]
        assert client.poll_round("camp") == RoundNotOpen(campaign_id="camp", retry_after=0.25)
        assert client.poll_round("camp") == (SPEC, None)
        fake.finished = True
        assert client.poll_round_spec("camp") is None and client.poll_round("camp") is None
    assert sleeps.delays == []  # polling never waits for the next round


def test_get_round_spec_waits_between_rounds_as_the_collector_says(collector: tuple[FakeCollector, str]) -> None:
    fake, target = collector
    fake.round_answers = ["not-open", "empty", "not-open"]
    sleeps = Sleeps()
    with CollectorClient(target, rng=SeededRng(3), sleep=sleeps) as client:
        assert client.get_round_spec("camp") == SPEC
        fake.round_answers = ["empty"]
        assert client.get_round("camp") == (SPEC, None)
    assert fake.round_calls == 6
    limits = [0.25, 1.0, 0.25, 1.0]
    assert len(sleeps.delays) == 4 and all(low <= d <= low * 1.2 for d, low in zip(sleeps.delays, limits))


def test_get_round_spec_between_rounds_gives_up_with_retry_after(collector: tuple[FakeCollector, str]) -> None:
    fake, target = collector
    fake.round_answers = ["not-open"] * 10
    with CollectorClient(target, max_attempts=3, sleep=Sleeps()) as client:
        with pytest.raises(RpcFailedError) as info:
            client.get_round_spec("camp")
    assert isinstance(info.value, TransportError) and not isinstance(info.value, ProtocolError)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and info.value.attempts == 3
    assert info.value.retry_after == 0.25 and "no open round yet" in str(info.value)
    assert fake.round_calls == 3


def test_overload_is_retried_not_taken_for_a_closed_round(collector: tuple[FakeCollector, str]) -> None:
    fake, target = collector
    fake.round_answers = ["busy", "busy"]
    sleeps = Sleeps()
    with CollectorClient(target, sleep=sleeps) as client:
        assert client.poll_round_spec("camp") == SPEC
    assert fake.round_calls == 3 and len(sleeps.delays) == 2


def test_round_not_open_is_checked() -> None:
    assert RoundNotOpen(campaign_id="camp", retry_after=0) == RoundNotOpen("camp", 0.0)
    with pytest.raises(InvalidParameterError):
        RoundNotOpen(campaign_id="camp", retry_after=-1.0)
    with pytest.raises(InvalidParameterError):
        RoundNotOpen(campaign_id="camp", retry_after=float("nan"))
    with pytest.raises(InvalidParameterError):
        RoundNotOpen(campaign_id="", retry_after=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        RoundNotOpen("camp", 1.0).retry_after = 2.0  # type: ignore[misc]
