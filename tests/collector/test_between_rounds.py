"""Between two rounds over real gRPC: "ask again after ...", never an error, and no waiting out a
dead process's step.

A campaign is between two rounds while a server step runs (the current round is closed, the next
not yet open). ``GetRoundSpec`` then answers UNAVAILABLE with ``RetryInfo`` and the ``ErrorInfo``
reason ``ROUND_NOT_OPEN``, which the SDK turns into :class:`~ldp_client.spec.RoundNotOpen` (or waits
through, in ``get_round_spec``). A step is "running" exactly while some live process holds the
campaign's step lock; a collector that starts on a store whose step was interrupted resumes it at
once, not after a timeout. Real servers on 127.0.0.1 port 0, SQLite data directories; the process
running the step elsewhere is played by a second store object on the same directory holding the
step lock (the store contract tests show that is exclusive across processes too).
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from ldp.v1 import campaigns_pb2, service_pb2, service_pb2_grpc
from ldp_client.grpc import CollectorClient, OutcomeStatus
from ldp_client.report import Report
from ldp_client.rng import SeededRng
from ldp_client.spec import ROUND_NOT_OPEN_REASON, RoundNotOpen, RoundSpec
from ldp_collector.config import CollectorConfig
from ldp_collector.core import ROUND_NOT_OPEN_RETRY_SECONDS, Collector
from ldp_collector.serde import config_from_proto
from ldp_collector.server.lifecycle import start_server
from ldp_collector.storage import open_store

pytestmark = pytest.mark.integration

CAMPAIGN = "two-windows"
#: Liveness bound of the waits below (not a performance target: a resumed step takes well under a second).
WAIT_S = 30.0


def two_window_histogram() -> campaigns_pb2.CampaignConfig:
    config = campaigns_pb2.CampaignConfig(
        campaign_id=CAMPAIGN, kind=campaigns_pb2.HISTOGRAM, epsilon=2.0,
        domain=campaigns_pb2.Domain(categorical_size=8),
        histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.GRR, windows=2))
    return config


def reports_for(spec: RoundSpec, n: int, seed: int) -> list[Report]:
    rng = SeededRng(seed)
    task = spec.tasks[0]
    return [Report(report_id=rng.token_bytes(16), campaign_id=spec.campaign_id, round=spec.round,
                   group=task.groups[0], payloads=tuple(c.run(i % 8, rng=rng) for c in task.components))
            for i in range(n)]


def interrupted_campaign(data_dir: Path) -> RoundSpec:
    """A campaign whose round 1 (40 reports) was closed by a process that then died in its step;
    the spec of round 1."""
    store = open_store(data_dir)
    try:
        collector = Collector(store)
        collector.create_campaign(config_from_proto(two_window_histogram()))
        spec, _ = collector.get_round_spec(CAMPAIGN)
        assert spec is not None
        collector.submit("r1", reports_for(spec, 40, seed=1))
        assert store.close_round(CAMPAIGN, 1, time.time())
        return spec
    finally:
        store.close()


def status_details(error: grpc.RpcError) -> dict[str, Any]:
    call: Any = error  # an RpcError raised by a call is also its grpc.Call
    status = rpc_status.from_call(call)
    assert status is not None
    out: dict[str, Any] = {}
    for detail in status.details:
        for cls in (error_details_pb2.ErrorInfo, error_details_pb2.RetryInfo):
            if detail.Is(cls.DESCRIPTOR):
                message = cls()
                detail.Unpack(message)
                out[cls.DESCRIPTOR.name] = message
    return out


def test_between_rounds_devices_are_told_when_to_ask_again(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = interrupted_campaign(data_dir)
    other = open_store(data_dir)  # another collector process, in the middle of the step
    running = ExitStack()
    try:
        assert running.enter_context(other.step_lock(CAMPAIGN))
        with start_server(CollectorConfig(listen="127.0.0.1:0", data_dir=str(data_dir), tick_interval_s=0.05,
                                          log_level="WARNING")) as server:
            with grpc.insecure_channel(server.address) as channel:
                stub = service_pb2_grpc.DeviceServiceStub(channel)
                with pytest.raises(grpc.RpcError) as info:
                    stub.GetRoundSpec(service_pb2.GetRoundSpecRequest(campaign_id=CAMPAIGN))
            error = info.value
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert "no open round yet" in (error.details() or "")
            details = status_details(error)
            assert details["ErrorInfo"].reason == ROUND_NOT_OPEN_REASON == "ROUND_NOT_OPEN"
            assert details["ErrorInfo"].domain == "ldp.v1"
            delay = details["RetryInfo"].retry_delay
            assert delay.seconds + delay.nanos / 1e9 == ROUND_NOT_OPEN_RETRY_SECONDS

            not_yet = RoundNotOpen(campaign_id=CAMPAIGN, retry_after=ROUND_NOT_OPEN_RETRY_SECONDS)
            sleeps: list[float] = []

            def sleep(seconds: float) -> None:
                sleeps.append(seconds)
                running.close()  # the process running the step dies while the device waits
                time.sleep(seconds)

            with CollectorClient(server.address, sleep=sleep) as client:
                assert client.poll_round_spec(CAMPAIGN) == not_yet
                assert client.poll_round(CAMPAIGN) == not_yet
                # A report now is for round 1, which closed before it arrived: a final answer, whatever the step does.
                late = client.submit(reports_for(first, 1, seed=9))
                assert late[0].status is OutcomeStatus.REJECTED
                assert "round 1 of campaign two-windows closed before the report arrived" in late[0].reason
                # get_round_spec waits as told; the dead process's step is resumed by the server meanwhile.
                spec = client.get_round_spec(CAMPAIGN)
            assert spec is not None and spec.round == 2
            assert sleeps and all(ROUND_NOT_OPEN_RETRY_SECONDS <= s <= ROUND_NOT_OPEN_RETRY_SECONDS * 1.2
                                  for s in sleeps)
    finally:
        running.close()
        other.close()


def test_a_restarted_collector_resumes_an_interrupted_step_at_once(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    interrupted_campaign(data_dir)
    # The tick interval is an hour: only the tick every start runs first can resume the step in time.
    with start_server(CollectorConfig(listen="127.0.0.1:0", data_dir=str(data_dir), tick_interval_s=3600,
                                      log_level="WARNING")) as server:
        with grpc.insecure_channel(server.address) as channel:
            stub = service_pb2_grpc.DeviceServiceStub(channel)
            deadline = time.monotonic() + WAIT_S
            while True:
                try:
                    response = stub.GetRoundSpec(service_pb2.GetRoundSpecRequest(campaign_id=CAMPAIGN))
                    if response.HasField("spec"):
                        break
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                assert time.monotonic() < deadline, f"round 2 not opened within {WAIT_S} s of the start"
                time.sleep(0.02)
    assert response.spec.round == 2
