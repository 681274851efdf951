"""Hostile traffic through real gRPC: the server keeps serving, answers every message with the
right status code, and nothing a rejected report carries reaches the stored state.

More than 10,000 messages: random bytes on every method path (with and without the operator
token), unknown methods, hand-built hostile reports (wrong campaign, round, group, payload kind,
out-of-range payloads, bad report ids, finished campaigns), hostile msgpack batches (garbage,
length bombs, deep nesting), duplicate floods and request replays, oversized batches, invalid
UTF-8, bad request ids, and messages beyond the receive limit. Afterwards the health check still
says SERVING, the report counts and stored estimates are unchanged, and an identical twin
campaign that received no hostile traffic produces exactly the same estimates.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import msgpack
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ldp.v1 import campaigns_pb2, reports_pb2, service_pb2, service_pb2_grpc
from ldp_client import serde
from ldp_client.report import Report, pack_batch
from ldp_client.rng import SeededRng
from ldp_client.spec import RoundSpec
from ldp_collector.config import CollectorConfig
from ldp_collector.server.lifecycle import RunningServer, start_server
from ldp_collector.server.wire import DEVICE_SERVICE, OPERATOR_SERVICE

pytestmark = pytest.mark.integration

TOKEN = "hostile-operator-token-0123456789"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
RECEIVE_LIMIT = 256 * 1024
MAX_BATCH = 200
DOMAIN = 5
WINDOW = 64
OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND

Check = Callable[[bytes], None]


@dataclass
class Probe:
    """One hostile message, the status codes it may get, and a check of an OK response."""

    path: str
    data: bytes
    allowed: frozenset[grpc.StatusCode]
    metadata: tuple[tuple[str, str], ...] = ()
    check: Check | None = None
    stream: bool = False


def nothing_stored(data: bytes) -> None:
    response = service_pb2.SubmitReportsResponse.FromString(data)
    assert response.accepted == 0, response
    assert all(o.status != service_pb2.ReportOutcome.ACCEPTED for o in response.outcomes)


def all_rejected(data: bytes) -> None:
    response = service_pb2.SubmitReportsResponse.FromString(data)
    assert response.accepted == response.duplicates == 0 and response.rejected == len(response.outcomes) > 0
    assert all(o.reason for o in response.outcomes)


def all_duplicates(data: bytes) -> None:
    response = service_pb2.SubmitReportsResponse.FromString(data)
    assert response.accepted == response.rejected == 0 and response.duplicates == len(response.outcomes) > 0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    config = CollectorConfig(listen="127.0.0.1:0", data_dir=str(tmp_path_factory.mktemp("hostile")),
                             operator_token=TOKEN, max_receive_bytes=RECEIVE_LIMIT, max_batch_reports=MAX_BATCH)
    srv = start_server(config)
    yield srv
    srv.stop(grace=1.0)


def create(operator: service_pb2_grpc.OperatorServiceStub, campaign_id: str) -> str:
    config = campaigns_pb2.CampaignConfig(
        campaign_id=campaign_id, kind=campaigns_pb2.HISTOGRAM, epsilon=1.5,
        domain=campaigns_pb2.Domain(categorical_size=DOMAIN),
        histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.GRR))
    operator.CreateCampaign(service_pb2.CreateCampaignRequest(config=config), metadata=AUTH)
    return campaign_id


def spec_of(device: service_pb2_grpc.DeviceServiceStub, campaign_id: str) -> RoundSpec:
    return serde.round_spec_from_proto(
        device.GetRoundSpec(service_pb2.GetRoundSpecRequest(campaign_id=campaign_id)).spec)


def honest_reports(spec: RoundSpec, n: int, seed: int) -> list[Report]:
    rng = SeededRng(seed)
    task = spec.tasks[0]
    return [Report(report_id=rng.token_bytes(16), campaign_id=spec.campaign_id, round=spec.round,
                   group=task.groups[0], payloads=(task.components[0].run(i % DOMAIN, rng=rng),))
            for i in range(n)]


def send(device: service_pb2_grpc.DeviceServiceStub, prefix: str, reports: list[Report]) -> int:
    """Submit honest reports in batches the server accepts; the number accepted."""
    accepted = 0
    for start in range(0, len(reports), MAX_BATCH):
        packed = pack_batch(f"{prefix}-{start}", reports[start:start + MAX_BATCH])
        accepted += device.SubmitPacked(service_pb2.SubmitPackedRequest(packed=packed)).accepted
    return accepted


def submit_request(request_id: str, reports: list[reports_pb2.Report]) -> bytes:
    return service_pb2.SubmitReportsRequest(request_id=request_id, reports=reports).SerializeToString()


def packed_request(request_id: str, packed: bytes) -> bytes:
    return service_pb2.SubmitPackedRequest(request_id=request_id, packed=packed).SerializeToString()


def snapshot(operator: service_pb2_grpc.OperatorServiceStub, open_id: str, finished_id: str) -> tuple[Any, ...]:
    open_campaign = operator.GetCampaign(service_pb2.GetCampaignRequest(campaign_id=open_id), metadata=AUTH)
    estimates = operator.GetEstimates(service_pb2.GetEstimatesRequest(campaign_id=finished_id), metadata=AUTH)
    result = operator.GetResult(service_pb2.GetResultRequest(campaign_id=finished_id), metadata=AUTH)
    counts = [(r.round, r.reports, r.open) for r in open_campaign.rounds]
    return counts, estimates.SerializeToString(deterministic=True), result.SerializeToString(deterministic=True)


def hostile_probes(rng: random.Random, open_spec: RoundSpec, finished_spec: RoundSpec,
                   accepted: list[Report]) -> list[Probe]:
    device = f"/{DEVICE_SERVICE}/"
    operator = f"/{OPERATOR_SERVICE}/"
    probes: list[Probe] = []

    # 1. Random bytes on every method path.
    any_submit = frozenset({OK, INVALID})
    lookup = frozenset({INVALID, NOT_FOUND})
    methods: list[tuple[str, frozenset[grpc.StatusCode], Check | None, bool]] = [
        (device + "GetRoundSpec", lookup, None, False),
        (device + "GetResult", lookup, None, False),
        (device + "SubmitReports", any_submit, nothing_stored, False),
        (device + "SubmitPacked", any_submit, nothing_stored, False),
        (operator + "CreateCampaign", frozenset({OK, INVALID, grpc.StatusCode.ALREADY_EXISTS}), None, False),
        (operator + "ListCampaigns", frozenset({OK, INVALID}), None, False),
        (operator + "GetCampaign", lookup, None, False),
        (operator + "CloseRound", lookup, None, False),
        (operator + "GetEstimates", lookup, None, False),
        (operator + "GetResult", lookup, None, False),
        (operator + "WatchCampaign", lookup, None, True),
    ]
    for path, allowed, check, stream in methods:
        for _ in range(60 if stream else 300):
            data = rng.randbytes(rng.randrange(0, 300))
            metadata = AUTH if path.startswith(operator) else ()
            probes.append(Probe(path, data, allowed, metadata, check, stream))
    for path, _, _, stream in methods[4:]:
        for _ in range(60):
            probes.append(Probe(path, rng.randbytes(rng.randrange(0, 100)),
                                frozenset({grpc.StatusCode.UNAUTHENTICATED}), stream=stream))
            bad_token = (("authorization", f"Bearer {rng.randbytes(12).hex()}"),)
            probes.append(Probe(path, b"", frozenset({grpc.StatusCode.UNAUTHENTICATED}), bad_token, stream=stream))

    # 2. Unknown methods and services.
    for i in range(100):
        path = rng.choice([f"{device}Nope{i}", f"/ldp.v1.Nope/X{i}", f"/x/{rng.randbytes(4).hex()}"])
        probes.append(Probe(path, rng.randbytes(10), frozenset({grpc.StatusCode.UNIMPLEMENTED})))

    # 3. Hand-built hostile reports, each a well-formed request: all rejected, the call succeeds.
    cid, rnd = open_spec.campaign_id, open_spec.round
    group = open_spec.tasks[0].groups[0]

    def report(**changes: Any) -> reports_pb2.Report:
        message = reports_pb2.Report(report_id=rng.randbytes(16), campaign_id=cid, round=rnd, group=group,
                                     payloads=[reports_pb2.Payload(index=rng.randrange(DOMAIN))])
        payloads = changes.pop("payloads", None)
        for key, value in changes.items():
            setattr(message, key, value)
        if payloads is not None:
            del message.payloads[:]
            message.payloads.extend(payloads)
        return message

    makers: list[Callable[[], reports_pb2.Report]] = [
        lambda: report(campaign_id="does-not-exist"),
        lambda: report(campaign_id=""),
        lambda: report(campaign_id="bad id with spaces"),
        lambda: report(campaign_id="x" * 300),
        lambda: report(campaign_id=finished_spec.campaign_id, round=finished_spec.round),
        lambda: report(round=rnd + 1),
        lambda: report(round=0),
        lambda: report(round=2**32 - 1),
        lambda: report(group=group + 1),
        lambda: report(group=4095),
        lambda: report(payloads=[reports_pb2.Payload(index=DOMAIN + rng.randrange(1000))]),
        lambda: report(payloads=[reports_pb2.Payload(index=2**64 - 1)]),
        lambda: report(payloads=[reports_pb2.Payload(bits=rng.randbytes(4))]),
        lambda: report(payloads=[reports_pb2.Payload(hashed=reports_pb2.HashedValue(seed=1, value=2))]),
        lambda: report(payloads=[reports_pb2.Payload(floats=reports_pb2.Floats(values=[0.5, float("nan")]))]),
        lambda: report(payloads=[reports_pb2.Payload(integers=reports_pb2.SignedIntegers(values=[-2**63]))]),
        lambda: report(payloads=[reports_pb2.Payload()]),
        lambda: report(payloads=[]),
        lambda: report(payloads=[reports_pb2.Payload(index=0)] * 2),
        lambda: report(payloads=[reports_pb2.Payload(index=0)] * 9),
        lambda: report(report_id=b""),
        lambda: report(report_id=rng.randbytes(15)),
        lambda: report(report_id=rng.randbytes(17)),
        lambda: report(report_id=rng.randbytes(4096)),
    ]
    for i in range(3000):
        batch = [rng.choice(makers)() for _ in range(rng.randrange(1, 4))]
        probes.append(Probe(device + "SubmitReports", submit_request(f"hostile-{i}", batch), frozenset({OK}),
                            check=all_rejected))

    # 4. Hostile msgpack batches.
    honest_wire = accepted[0].to_wire()

    def hostile_item() -> Any:
        kind = rng.randrange(8)
        if kind == 0:
            return rng.randbytes(rng.randrange(0, 40))
        if kind == 1:
            return [1, rng.randbytes(16), cid, rnd, group, [[1, DOMAIN + rng.randrange(100)]]]
        if kind == 2:
            return [2, *honest_wire[1:]]
        if kind == 3:
            return [1, rng.randbytes(16), cid, rnd, group, [[9, 1]]]
        if kind == 4:
            return [1, rng.randbytes(16), cid, -1, group, [[1, 0]]]
        if kind == 5:
            return {"report": 1}
        if kind == 6:
            return [1, rng.randbytes(16), cid, rnd, group, [[1, True]]]
        return [1, rng.randbytes(16), cid, rnd, 2**40, [[1, 0]]]

    for i in range(1000):
        items = [hostile_item() for _ in range(rng.randrange(1, 5))]
        packed = msgpack.packb([1, f"hp-{i}", items], use_bin_type=True)
        probes.append(Probe(device + "SubmitPacked", packed_request("", packed), frozenset({OK}), check=all_rejected))
    garbage: list[bytes] = [
        b"", b"\xc1", b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\x91" * 100_000,
        msgpack.packb([1, "", []]), msgpack.packb([2, "r", []]), msgpack.packb([1, "r"]), msgpack.packb({"a": 1}),
        msgpack.packb([1, "r", {"x": 1}]), msgpack.packb([1, 7, []]), msgpack.packb([1, "r" * 200, []]),
    ]
    for i in range(500):
        data = garbage[i % len(garbage)] if i < 120 else rng.randbytes(rng.randrange(1, 200))
        probes.append(Probe(device + "SubmitPacked", packed_request("", data), frozenset({INVALID})))

    # 5. Duplicate floods and replays: OK, nothing new is stored.
    wire_accepted = [serde.report_to_proto(r) for r in accepted]
    for i in range(1000):
        start = rng.randrange(len(wire_accepted) - 5)
        probes.append(Probe(device + "SubmitReports", submit_request(f"dup-{i}", wire_accepted[start:start + 5]),
                            frozenset({OK}), check=all_duplicates))
    for i in range(200):
        start = rng.randrange(len(accepted) - 5)
        packed = pack_batch(f"dup-packed-{i}", accepted[start:start + 5])
        probes.append(Probe(device + "SubmitPacked", packed_request("", packed), frozenset({OK}),
                            check=all_duplicates))

    # 6. Oversized batches, bad request ids, invalid UTF-8, messages beyond the receive limit.
    tiny = reports_pb2.Report(campaign_id=cid)
    for i in range(20):
        probes.append(Probe(device + "SubmitReports", submit_request(f"big-{i}", [tiny] * (MAX_BATCH + 1 + i)),
                            frozenset({INVALID})))
        packed = pack_batch(f"bigp-{i}", accepted[:1] * (MAX_BATCH + 1 + i))
        probes.append(Probe(device + "SubmitPacked", packed_request("", packed), frozenset({INVALID})))
    for i in range(100):
        request_id = "" if i % 2 else "r" * (129 + i)
        probes.append(Probe(device + "SubmitReports", submit_request(request_id, wire_accepted[:1]),
                            frozenset({INVALID})))
        probes.append(Probe(device + "SubmitPacked", packed_request(request_id or "r" * 200, b""),
                            frozenset({INVALID})))
    bad_utf8 = b"\x0a\x04\xff\xfe\xfd\xfc"  # field 1 (a string) holding invalid UTF-8
    for path in ("GetRoundSpec", "GetResult", "SubmitReports", "SubmitPacked"):
        for _ in range(30):
            probes.append(Probe(device + path, bad_utf8, frozenset({INVALID})))
    for _ in range(10):
        huge = service_pb2.SubmitPackedRequest(request_id="huge", packed=rng.randbytes(RECEIVE_LIMIT + 1024))
        probes.append(Probe(device + "SubmitPacked", huge.SerializeToString(),
                            frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED})))
    return probes


def run_probes(channel: grpc.Channel, probes: list[Probe]) -> list[str]:
    """Send every probe (unary ones WINDOW at a time); return the problems found."""
    problems: list[str] = []

    def judge(probe: Probe, code: grpc.StatusCode, data: bytes | None) -> None:
        if code not in probe.allowed:
            problems.append(f"{probe.path} {probe.data[:40]!r}: {code.name}, expected {sorted(c.name for c in probe.allowed)}")
        elif code == OK and probe.check is not None and data is not None:
            try:
                probe.check(data)
            except AssertionError as exc:
                problems.append(f"{probe.path} {probe.data[:40]!r}: {exc}")

    pending: list[tuple[Probe, Any]] = []

    def drain() -> None:
        for probe, future in pending:
            error = future.exception()
            judge(probe, future.code(), None if error is not None else future.result())
        pending.clear()

    for probe in probes:
        if probe.stream:
            call = channel.unary_stream(probe.path, request_serializer=None, response_deserializer=None)(probe.data, metadata=probe.metadata, timeout=30)
            try:
                for _ in call:
                    pass
                judge(probe, OK, None)
            except grpc.RpcError as exc:
                judge(probe, exc.code(), None)
            continue
        pending.append((probe, channel.unary_unary(probe.path, request_serializer=None, response_deserializer=None).future(probe.data, metadata=probe.metadata,
                                                                     timeout=30)))
        if len(pending) >= WINDOW:
            drain()
    drain()
    return problems


def test_hostile_traffic_changes_nothing(server: RunningServer) -> None:
    started = time.monotonic()
    options = [("grpc.max_send_message_length", 4 * RECEIVE_LIMIT)]
    with grpc.insecure_channel(server.address, options=options) as channel:
        operator = service_pb2_grpc.OperatorServiceStub(channel)
        device = service_pb2_grpc.DeviceServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)

        # A finished campaign with estimates, an open one, and the open one's untouched twin.
        finished_id = create(operator, "finished")
        finished_spec = spec_of(device, finished_id)
        assert send(device, "finished", honest_reports(finished_spec, 300, seed=1)) == 300
        operator.CloseRound(service_pb2.CloseRoundRequest(campaign_id=finished_id, round=finished_spec.round),
                            metadata=AUTH)
        open_id, twin_id = create(operator, "target"), create(operator, "twin")
        open_spec, twin_spec = spec_of(device, open_id), spec_of(device, twin_id)
        accepted = honest_reports(open_spec, 400, seed=2)
        twins = [Report(report_id=bytes(reversed(r.report_id)), campaign_id=twin_id, round=twin_spec.round,
                        group=r.group, payloads=r.payloads) for r in accepted]
        assert send(device, "target", accepted) == send(device, "twin", twins) == len(accepted)
        before = snapshot(operator, open_id, finished_id)

        probes = hostile_probes(random.Random(1234), open_spec, finished_spec, accepted)
        assert len(probes) >= 10_000
        problems = run_probes(channel, probes)
        assert not problems, f"{len(problems)} wrong answers, e.g. {problems[:5]}"

        status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        assert snapshot(operator, open_id, finished_id) == before

        # Still fully functional, and the attacked campaign estimates exactly like its twin.
        for cid, spec in ((open_id, open_spec), (twin_id, twin_spec)):
            operator.CloseRound(service_pb2.CloseRoundRequest(campaign_id=cid, round=spec.round), metadata=AUTH)
        attacked, twin = (operator.GetEstimates(service_pb2.GetEstimatesRequest(campaign_id=c), metadata=AUTH)
                          for c in (open_id, twin_id))
        assert attacked.reports == twin.reports == len(accepted)
        assert [(e.value, e.count, e.std_error) for e in attacked.estimates] == \
            [(e.value, e.count, e.std_error) for e in twin.estimates]
    assert time.monotonic() - started < 90


def test_concurrent_hostile_load_keeps_health_serving(server: RunningServer, tmp_path: Path) -> None:
    """Health answers promptly while the worker pool is busy with junk."""
    rng = random.Random(99)
    with grpc.insecure_channel(server.address) as channel:
        call = channel.unary_unary(f"/{DEVICE_SERVICE}/SubmitPacked", request_serializer=None,
                                   response_deserializer=None)
        futures = [call.future(packed_request("", rng.randbytes(2000)), timeout=30) for _ in range(300)]
        start = time.monotonic()
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        assert time.monotonic() - start < 5
        assert {f.code() for f in futures} <= {INVALID, grpc.StatusCode.UNAVAILABLE}
