"""Back-pressure and rate limits: bounded queues, per-device and per-token token buckets.

The token buckets are checked exactly with a fake clock (admission, refill time, debt of a batch
larger than the burst, a table bounded under 100,000 distinct keys). Through real gRPC on
127.0.0.1: a device beyond its rate gets RESOURCE_EXHAUSTED with QuotaFailure and RetryInfo, a
token beyond its rate likewise while wrong tokens never reach the limiter, and the SDK client,
honouring RetryInfo, lands every report exactly once. An overloaded worker pool answers
UNAVAILABLE with RetryInfo while the number of queued calls never exceeds its bound, and
clients that keep retrying still land every report exactly once.
"""

from __future__ import annotations

import re
import socket
import threading
import time
import tracemalloc
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from ldp.v1 import campaigns_pb2, service_pb2, service_pb2_grpc
from ldp_client import serde
from ldp_client.grpc import CollectorClient, OutcomeStatus
from ldp_client.report import Report, pack_batch
from ldp_client.rng import SeededRng
from ldp_client.spec import RoundSpec
from ldp_collector.config import CollectorConfig, ConfigError
from ldp_collector.ratelimit import RateLimitedError, RateLimiter
from ldp_collector.server.lifecycle import RunningServer, start_server

TOKEN = "backpressure-operator-token-0123456789"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the token buckets ------------------------------------------------------------------------------

def test_bucket_admits_the_burst_then_the_rate() -> None:
    clock = FakeClock()
    limiter = RateLimiter("device", rate=10.0, capacity=5.0, max_keys=10, clock=clock)
    for _ in range(5):
        assert limiter.try_acquire("a") == 0.0
    assert limiter.try_acquire("a") == pytest.approx(0.1)   # one token refills in 1 / rate
    assert limiter.try_acquire("b") == 0.0                   # other keys are independent
    clock.now += 0.05
    with pytest.raises(RateLimitedError) as info:
        limiter.acquire("a")
    assert info.value.retry_after == pytest.approx(0.05) and info.value.limit == "device"
    assert info.value.code == "RESOURCE_EXHAUSTED" and "10 requests/s, burst 5" in str(info.value)
    clock.now += 0.05
    assert limiter.try_acquire("a") == 0.0
    clock.now += 1000.0                                      # refills to the burst, not beyond
    for _ in range(5):
        assert limiter.try_acquire("a") == 0.0
    assert limiter.try_acquire("a") > 0.0


def test_a_batch_larger_than_the_burst_goes_into_debt() -> None:
    clock = FakeClock()
    limiter = RateLimiter("device", rate=100.0, capacity=50.0, max_keys=10, unit="reports", clock=clock)
    assert limiter.try_acquire("d", 200) == 0.0              # admitted from a full bucket ...
    assert limiter.try_acquire("d", 1) == pytest.approx(1.51)  # ... and paid for: -150 + 1 needed
    clock.now += 1.5
    assert limiter.try_acquire("d", 50) == pytest.approx(0.5)  # at 0 tokens; 50 more needs 0.5 s
    clock.now += 0.5
    assert limiter.try_acquire("d", 50) == 0.0
    # Long-run rate: 10 s of greedy 30-report batches admit 100/s * 10 s + the 50 burst.
    clock.now += 100.0
    admitted = 0
    start = clock.now
    while clock.now < start + 10.0:
        wait = limiter.try_acquire("e", 30)
        if wait == 0.0:
            admitted += 30
        else:
            clock.now += wait
    assert 1000 <= admitted <= 1000 + 50 + 30


def test_bucket_table_is_bounded_under_100k_distinct_keys() -> None:
    clock = FakeClock()
    limiter = RateLimiter("device", rate=1.0, capacity=1.0, max_keys=1000, clock=clock)
    tracemalloc.start()
    try:
        for i in range(1000):
            limiter.acquire(f"warm-{i}")
        baseline, _ = tracemalloc.get_traced_memory()
        for i in range(100_000):
            limiter.acquire(f"ipv4:10.{i >> 16}.{(i >> 8) & 255}.{i & 255}")
            assert len(limiter) <= 1000
        grown, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(limiter) == 1000
    assert grown - baseline < 64 * 1024, f"the table grew by {grown - baseline} bytes"
    # All 100k were active (just spent): each eviction is counted as one.
    assert limiter.evicted_active == 100_000
    # Keys idle long enough to refill are forgotten silently.
    clock.now += 10.0
    for i in range(1000):
        limiter.acquire(f"late-{i}")
    assert limiter.evicted_active == 100_000


def test_refund_gives_back_what_a_shed_call_took() -> None:
    clock = FakeClock()
    limiter = RateLimiter("device", rate=1.0, capacity=10.0, max_keys=10, clock=clock)
    assert limiter.try_acquire("a", 10) == 0.0
    limiter.refund("a", 10)
    assert limiter.try_acquire("a", 10) == 0.0              # the retry is not charged twice
    limiter.refund("a", 100)
    assert limiter.try_acquire("a", 10) == 0.0 and limiter.try_acquire("a", 1) > 0.0  # never above the burst
    limiter.refund("unknown", 5)                             # no bucket: nothing to give back
    assert len(limiter) == 1


def test_a_clock_stepping_back_takes_no_tokens() -> None:
    clock = FakeClock()
    limiter = RateLimiter("device", rate=1.0, capacity=4.0, max_keys=10, clock=clock)
    assert limiter.try_acquire("a", 2) == 0.0
    clock.now -= 50.0                                        # 2 tokens left, whatever the clock says
    assert limiter.try_acquire("a", 2) == 0.0 and limiter.try_acquire("a", 1) == pytest.approx(1.0)
    clock.now += 50.5                                        # refills from the latest time seen
    assert limiter.try_acquire("a", 1) == pytest.approx(0.5)


def test_wait_tells_without_taking() -> None:
    clock = FakeClock()
    limiter = RateLimiter("device", rate=2.0, capacity=3.0, max_keys=1, clock=clock)
    assert limiter.wait("a", 3) == 0.0 and len(limiter) == 1  # a new key's bucket is full
    assert limiter.wait("a", 3) == 0.0                       # nothing was taken
    assert limiter.try_acquire("a", 3) == 0.0
    assert limiter.wait("a") == pytest.approx(0.5) and limiter.wait("a", 10) == pytest.approx(1.5)
    assert limiter.wait("b") == 0.0 and len(limiter) == 1    # bounded like try_acquire


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rate": 0.0, "capacity": 1.0, "max_keys": 1}, "rate must be a finite number > 0, got 0.0"),
    ({"rate": 1.0, "capacity": 0.5, "max_keys": 1}, "capacity must be a finite number >= 1, got 0.5"),
    ({"rate": 1.0, "capacity": 1.0, "max_keys": 0}, "max_keys must be an integer >= 1, got 0"),
])
def test_limiter_parameters_are_checked(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        RateLimiter("x", **kwargs)


@pytest.mark.parametrize(("changes", "message"), [
    ({"device_rate_limit": -1.0}, "device_rate_limit must be a number in [0, 1e+09], got -1.0"),
    ({"token_rate_burst": -1}, "token_rate_burst must be an integer in [0, 1000000000], got -1"),
    ({"rate_limit_max_keys": 0}, "rate_limit_max_keys must be an integer in [1, 10000000], got 0"),
    ({"max_queued_bytes": -1}, "max_queued_bytes must be an integer in [0, 1099511627776], got -1"),
    ({"workers": 0}, "workers must be an integer in [1, 64], got 0"),
    ({"workers": 4, "metrics_port": 65534}, "metrics_port + workers - 1 must be at most 65535"),
])
def test_config_checks_the_limits(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        CollectorConfig(**changes)


# -- through real gRPC ----------------------------------------------------------------------------------

def make_config(tmp: Path, **changes: Any) -> CollectorConfig:
    values: dict[str, Any] = dict(listen="127.0.0.1:0", data_dir=str(tmp / "data"), operator_token=TOKEN,
                                  tick_interval_s=60.0, grace_period_s=2.0)
    values.update(changes)
    return CollectorConfig(**values)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def create_campaign(address: str) -> RoundSpec:
    config = campaigns_pb2.CampaignConfig(
        kind=campaigns_pb2.HISTOGRAM, domain=campaigns_pb2.Domain(categorical_size=4), epsilon=2.0,
        histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.GRR))
    with grpc.insecure_channel(address) as channel:
        campaign = service_pb2_grpc.OperatorServiceStub(channel).CreateCampaign(
            service_pb2.CreateCampaignRequest(config=config), metadata=AUTH, timeout=30)
        response = service_pb2_grpc.DeviceServiceStub(channel).GetRoundSpec(
            service_pb2.GetRoundSpecRequest(campaign_id=campaign.config.campaign_id), metadata=AUTH, timeout=30)
    return serde.round_spec_from_proto(response.spec)


def make_reports(spec: RoundSpec, n: int, seed: int) -> list[Report]:
    rng = SeededRng(seed)
    task = spec.tasks[0]
    return [Report(report_id=rng.token_bytes(16), campaign_id=spec.campaign_id, round=spec.round,
                   group=task.groups[0], payloads=tuple(c.run(i % 4, rng=rng) for c in task.components))
            for i in range(n)]


def rich_details(error: grpc.RpcError) -> dict[str, Any]:
    call: Any = error
    status = rpc_status.from_call(call)
    assert status is not None, "no google.rpc.Status in the trailers"
    out: dict[str, Any] = {}
    for detail in status.details:
        for cls in (error_details_pb2.RetryInfo, error_details_pb2.QuotaFailure, error_details_pb2.ErrorInfo):
            if detail.Is(cls.DESCRIPTOR):
                message = cls()
                detail.Unpack(message)
                out[cls.DESCRIPTOR.name] = message
    return out


def retry_seconds(details: dict[str, Any]) -> float:
    delay = details["RetryInfo"].retry_delay
    return float(delay.seconds + delay.nanos / 1e9)


def stored_ids(server: RunningServer, spec: RoundSpec) -> list[bytes]:
    store = server.collector._store  # what the store holds, not what the collector reports
    return [r.report_id for chunk in store.iter_reports(spec.campaign_id, spec.round) for r in chunk]


@pytest.fixture
def limited_server(tmp_path: Path) -> Iterator[RunningServer]:
    with start_server(make_config(tmp_path, device_rate_limit=400.0, device_rate_burst=100,
                                  token_rate_limit=4.0, token_rate_burst=2)) as server:
        yield server


@pytest.mark.integration
def test_device_rate_limit_answers_resource_exhausted_with_retry_info(limited_server: RunningServer) -> None:
    spec = create_campaign(limited_server.address)
    reports = make_reports(spec, 200, seed=1)
    with grpc.insecure_channel(limited_server.address) as channel:
        device = service_pb2_grpc.DeviceServiceStub(channel)
        first = service_pb2.SubmitPackedRequest(request_id="rl-1", packed=pack_batch("rl-1", reports[:100]))
        assert device.SubmitPacked(first, timeout=10).accepted == 100
        second = service_pb2.SubmitPackedRequest(request_id="rl-2", packed=pack_batch("rl-2", reports[100:]))
        with pytest.raises(grpc.RpcError) as info:
            device.SubmitPacked(second, timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = rich_details(info.value)
        # 100 reports at 400/s: the bucket is full again 0.25 s after the first batch.
        assert 0.0 < retry_seconds(details) <= 0.25
        assert details["QuotaFailure"].violations[0].subject == "device_rate_limit"
        assert details["ErrorInfo"].reason == "RATE_LIMITED" and details["ErrorInfo"].domain == "ldp.v1"
        time.sleep(retry_seconds(details) + 0.01)
        assert device.SubmitPacked(second, timeout=10).accepted == 100   # nothing of it was stored before
    assert sorted(stored_ids(limited_server, spec)) == sorted(r.report_id for r in reports)


@pytest.mark.integration
def test_device_limit_is_per_token_when_device_tokens_are_required(tmp_path: Path) -> None:
    tokens = ("device-token-a-0123456789abcdef", "device-token-b-0123456789abcdef")
    config = make_config(tmp_path, device_tokens=tokens, device_rate_limit=10.0, device_rate_burst=100)
    with start_server(config) as server:
        spec = create_campaign(server.address)
        reports = make_reports(spec, 300, seed=9)
        with grpc.insecure_channel(server.address) as channel:
            device = service_pb2_grpc.DeviceServiceStub(channel)

            def send(token: str, request_id: str, batch: list[Report]) -> service_pb2.SubmitReportsResponse:
                request = service_pb2.SubmitPackedRequest(request_id=request_id, packed=pack_batch(request_id, batch))
                response: service_pb2.SubmitReportsResponse = device.SubmitPacked(
                    request, metadata=(("authorization", f"Bearer {token}"),), timeout=10)
                return response

            assert send(tokens[0], "a-1", reports[:100]).accepted == 100
            with pytest.raises(grpc.RpcError) as info:
                send(tokens[0], "a-2", reports[100:200])
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert 9.0 < retry_seconds(rich_details(info.value)) <= 10.0    # 100 reports at 10/s
            # Same connection and address, another device: its own bucket.
            assert send(tokens[1], "b-1", reports[200:]).accepted == 100


@pytest.mark.integration
def test_client_honours_retry_info_and_lands_everything_exactly_once(limited_server: RunningServer) -> None:
    spec = create_campaign(limited_server.address)
    reports = make_reports(spec, 1000, seed=2)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(seconds)

    start = time.monotonic()
    with CollectorClient(limited_server.address, max_batch=100, max_attempts=20, sleep=sleep,
                         rng=SeededRng(3)) as client:
        outcomes = client.submit_packed(reports)
    elapsed = time.monotonic() - start
    assert [o.status for o in outcomes] == [OutcomeStatus.ACCEPTED] * 1000
    # 100 reports of burst, then 900 at 400 reports/s: at least 2.25 s, and the client waited for it
    # in RetryInfo-sized sleeps (at most one refill of a batch, 0.25 s, plus 20% jitter).
    assert elapsed >= 2.25
    assert sleeps and max(sleeps) <= 0.25 * 1.2 + 1e-6
    ids = stored_ids(limited_server, spec)
    assert len(ids) == len(set(ids)) == 1000 and set(ids) == {r.report_id for r in reports}


@pytest.mark.integration
def test_token_rate_limit_counts_only_accepted_tokens(limited_server: RunningServer) -> None:
    request = service_pb2.ListCampaignsRequest()
    wrong = (("authorization", "Bearer not-the-operator-token-000000"),)
    with grpc.insecure_channel(limited_server.address) as channel:
        operator = service_pb2_grpc.OperatorServiceStub(channel)
        time.sleep(0.6)  # the fixture's campaign creations are forgotten: a full bucket of 2
        operator.ListCampaigns(request, metadata=AUTH, timeout=10)
        operator.ListCampaigns(request, metadata=AUTH, timeout=10)
        with pytest.raises(grpc.RpcError) as info:
            operator.ListCampaigns(request, metadata=AUTH, timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = rich_details(info.value)
        assert 0.0 < retry_seconds(details) <= 0.25 and details["QuotaFailure"].violations[0].subject == "token_rate_limit"
        time.sleep(0.6)
        for _ in range(10):  # refused by authentication, never charged to anyone
            with pytest.raises(grpc.RpcError) as denied:
                operator.ListCampaigns(request, metadata=wrong, timeout=10)
            assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
        operator.ListCampaigns(request, metadata=AUTH, timeout=10)
        operator.ListCampaigns(request, metadata=AUTH, timeout=10)
        # Calls without a token are not limited per token (the device limit keys them by address).
        device = service_pb2_grpc.DeviceServiceStub(channel)
        for _ in range(5):
            with pytest.raises(grpc.RpcError) as missing:
                device.GetRoundSpec(service_pb2.GetRoundSpecRequest(campaign_id="no-such-campaign"), timeout=10)
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND


# -- overload: bounded queue, UNAVAILABLE + RetryInfo, nothing lost ------------------------------------

MAX_QUEUED = 4
SLOW_SUBMIT_S = 0.05


@pytest.mark.integration
def test_overload_sheds_with_retry_info_keeps_the_queue_bounded_and_loses_nothing(tmp_path: Path) -> None:
    metrics_port = free_port()
    config = make_config(tmp_path, worker_threads=1, max_queued_calls=MAX_QUEUED, metrics_port=metrics_port)
    with start_server(config) as server:
        spec = create_campaign(server.address)
        collector = server.collector
        real_submit = collector.submit

        def slow_submit(*args: Any, **kwargs: Any) -> Any:
            time.sleep(SLOW_SUBMIT_S)  # a slow disk: the pool drains 20 calls/s
            return real_submit(*args, **kwargs)

        collector.submit = slow_submit  # type: ignore[method-assign]

        # 1. Raw calls all at once: some are shed with UNAVAILABLE + RetryInfo.
        reports = make_reports(spec, 64 * 10, seed=4)
        with grpc.insecure_channel(server.address) as channel:
            device = service_pb2_grpc.DeviceServiceStub(channel)
            futures = []
            for i in range(64):
                rid = f"flood-{i}"
                futures.append(device.SubmitPacked.future(service_pb2.SubmitPackedRequest(
                    request_id=rid, packed=pack_batch(rid, reports[i * 10:(i + 1) * 10])), timeout=30))
            shed = []
            for future in futures:
                try:
                    future.result()
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                    shed.append(exc)
        assert len(shed) >= 64 - MAX_QUEUED - 20, "the pool took more calls than its queue bound allows"
        delay = retry_seconds(rich_details(shed[0]))
        assert 0.0 < delay <= 5.0

        # 2. Clients retrying after RetryInfo land everything exactly once; the queue never grows.
        peak = [0.0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
                match = re.search(r"^ldp_calls_in_flight (\S+)$", text, re.M)
                assert match is not None
                peak[0] = max(peak[0], float(match.group(1)))
                time.sleep(0.01)

        more = make_reports(spec, 16 * 50, seed=5)

        def client_run(i: int) -> list[OutcomeStatus]:
            with CollectorClient(server.address, max_batch=10, max_attempts=100, rng=SeededRng(100 + i),
                                 options=[("grpc.use_local_subchannel_pool", 1)]) as client:
                return [o.status for o in client.submit_packed(more[i * 50:(i + 1) * 50])]

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            with ThreadPoolExecutor(16) as pool:
                statuses = [s for part in pool.map(client_run, range(16)) for s in part]
        finally:
            done.set()
            sampler.join(timeout=10)
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        ids = stored_ids(server, spec)
    assert peak[0] <= MAX_QUEUED
    assert float(re.search(r"^ldp_calls_shed_total (\S+)$", text, re.M).group(1)) >= len(shed)  # type: ignore[union-attr]
    assert statuses.count(OutcomeStatus.ACCEPTED) == len(more)
    expected = {r.report_id for r in more} | {
        r.report_id for i, f in enumerate(futures) if f.exception() is None for r in reports[i * 10:(i + 1) * 10]}
    assert len(ids) == len(set(ids)) and set(ids) == expected


@pytest.mark.integration
def test_queued_bytes_are_bounded_whatever_the_call_count(tmp_path: Path) -> None:
    metrics_port = free_port()
    with start_server(make_config(tmp_path)) as first:  # the campaign, to size its batches
        spec = create_campaign(first.address)
    reports = make_reports(spec, 32 * 100, seed=7)
    size = max(len(pack_batch(f"bytes-{i:04d}", reports[i * 100:(i + 1) * 100])) for i in range(32))
    budget = 3 * size + size // 2      # room for three batches
    config = make_config(tmp_path, worker_threads=1, max_queued_calls=0, max_queued_bytes=budget,
                         metrics_port=metrics_port)
    with start_server(config) as server:
        real_submit = server.collector.submit

        def slow_submit(*args: Any, **kwargs: Any) -> Any:
            time.sleep(SLOW_SUBMIT_S)
            return real_submit(*args, **kwargs)

        server.collector.submit = slow_submit  # type: ignore[method-assign]
        peak = 0.0
        with grpc.insecure_channel(server.address) as channel:
            device = service_pb2_grpc.DeviceServiceStub(channel)
            futures = [device.SubmitPacked.future(service_pb2.SubmitPackedRequest(
                request_id=f"bytes-{i:04d}", packed=pack_batch(f"bytes-{i:04d}", reports[i * 100:(i + 1) * 100])),
                timeout=30) for i in range(32)]
            while not all(f.done() for f in futures):
                text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
                match = re.search(r"^ldp_calls_in_flight (\S+)$", text, re.M)
                assert match is not None
                peak = max(peak, float(match.group(1)))
            codes = [grpc.StatusCode.OK if f.exception() is None else f.code() for f in futures]
            # One batch larger than the whole budget is still admitted when nothing else is queued.
            big = make_reports(spec, 500, seed=8)
            request = service_pb2.SubmitPackedRequest(request_id="bytes-big", packed=pack_batch("bytes-big", big))
            assert len(request.packed) > budget
            server.collector.submit = real_submit  # type: ignore[method-assign]
            assert device.SubmitPacked(request, timeout=30).accepted == 500
    assert peak <= 3, f"{peak} calls queued with room for 3 batches"
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}
    assert codes.count(grpc.StatusCode.UNAVAILABLE) > 0 and codes.count(grpc.StatusCode.OK) >= 3

