"""End-to-end ingestion throughput of the collector over gRPC on loopback.

Starts a real server (the default SQLite store in a temporary directory), creates a categorical
histogram campaign with GRR, pre-generates randomized reports with the SDK, pre-serializes the
requests (batches of ``--batch`` reports, as ``SubmitPacked`` msgpack and as ``SubmitReports``
protobuf), then sends them from ``--clients`` concurrent client *processes* and counts the
reports acknowledged as ACCEPTED -- acknowledged only after the durable commit -- per second
of wall-clock time. Each run uses a fresh campaign, so every report is new.

``--breakdown`` also times the stages of one batch in-process (no gRPC): protobuf parsing,
decoding to SDK reports, the collector's validation + durable store, and response encoding,
to show where the time goes.

Usage::

    PYTHONPATH=packages/ldp-client/src:packages/ldp-proto/src:packages/ldp-collector/src \\
        python benchmarks/ingest_throughput.py --reports 200000 --clients 1,2,4 --breakdown
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import multiprocessing.queues
import multiprocessing.synchronize
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from ldp.v1 import campaigns_pb2, service_pb2, service_pb2_grpc
from ldp_client import serde
from ldp_client.payload import Payload
from ldp_client.report import Report, pack_batch, unpack_batch
from ldp_client.rng import SeededRng
from ldp_client.spec import RoundSpec
from ldp_collector.config import CollectorConfig
from ldp_collector.core import Collector
from ldp_collector.service import DEVICE_SERVICE, start_server
from ldp_collector.storage.base import Outcome

T = TypeVar("T")
ClientResult = tuple[int, list[float]]

TOKEN = "benchmark-operator-token-0123456789"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


@dataclass(frozen=True)
class Run:
    mode: str
    clients: int
    reports: int
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.reports / self.seconds


def create_campaign(operator: service_pb2_grpc.OperatorServiceStub, domain: int, epsilon: float) -> str:
    config = campaigns_pb2.CampaignConfig(
        kind=campaigns_pb2.HISTOGRAM, epsilon=epsilon, domain=campaigns_pb2.Domain(categorical_size=domain),
        histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.GRR))
    campaign = operator.CreateCampaign(service_pb2.CreateCampaignRequest(config=config), metadata=AUTH)
    return str(campaign.config.campaign_id)


def randomized_values(spec: RoundSpec, n: int, domain: int, seed: int) -> list[Payload]:
    """GRR outputs of ``n`` devices with a skewed true distribution (the SDK's own randomizer)."""
    rng = SeededRng(seed)
    component = spec.tasks[0].components[0]
    return [component.run(min(domain - 1, i % 7 if i % 3 else i % domain), rng=rng) for i in range(n)]


def build_requests(mode: str, spec: RoundSpec, payloads: Sequence[Payload], batch: int, run_tag: str) -> list[bytes]:
    group = spec.tasks[0].groups[0]
    requests = []
    for start in range(0, len(payloads), batch):
        reports = [Report(report_id=os.urandom(16), campaign_id=spec.campaign_id, round=spec.round, group=group,
                          payloads=(p,))
                   for p in payloads[start:start + batch]]
        request_id = f"{run_tag}-{start}"
        message: Message
        if mode == "packed":
            message = service_pb2.SubmitPackedRequest(packed=pack_batch(request_id, reports))
        else:
            message = service_pb2.SubmitReportsRequest(request_id=request_id,
                                                       reports=[serde.report_to_proto(r) for r in reports])
        requests.append(message.SerializeToString())
    return requests


def _client(address: str, method: str, requests: list[bytes], ready: multiprocessing.synchronize.Event,
            start: multiprocessing.synchronize.Event, out: multiprocessing.queues.Queue[ClientResult]) -> None:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/{DEVICE_SERVICE}/{method}", request_serializer=None,
                                   response_deserializer=None)
        grpc.channel_ready_future(channel).result(timeout=30)
        ready.set()
        start.wait()
        accepted = 0
        latencies = []
        for data in requests:
            t0 = time.perf_counter()
            response = service_pb2.SubmitReportsResponse.FromString(call(data, timeout=120))
            latencies.append(time.perf_counter() - t0)
            accepted += response.accepted
        out.put((accepted, latencies))


def run_once(address: str, mode: str, clients: int, requests: list[bytes]) -> Run:
    # "spawn", not "fork": the parent runs the server's gRPC threads, which must not be forked.
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    out: multiprocessing.queues.Queue[ClientResult] = ctx.Queue()
    method = "SubmitPacked" if mode == "packed" else "SubmitReports"
    shares = [requests[i::clients] for i in range(clients)]
    readies = [ctx.Event() for _ in shares]
    procs = [ctx.Process(target=_client, args=(address, method, share, ready, start, out))
             for share, ready in zip(shares, readies)]
    for p in procs:
        p.start()
    for ready in readies:  # every client is connected before the clock starts
        if not ready.wait(timeout=120):
            raise RuntimeError("a client process did not connect")
    t0 = time.perf_counter()
    start.set()
    results = [out.get() for _ in procs]
    seconds = time.perf_counter() - t0
    for p in procs:
        p.join()
    accepted = sum(r[0] for r in results)
    latencies = [x for r in results for x in r[1]]
    return Run(mode=mode, clients=clients, reports=accepted, seconds=seconds, latencies=latencies)


def breakdown(collector: Collector, spec: RoundSpec, payloads: Sequence[Payload],
              batch: int) -> list[tuple[str, float]]:
    """Median microseconds per report of each server stage for one batch (in-process, no gRPC)."""
    from ldp_collector.service import _decode_report  # the servicer's own decoding step

    stages: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[[], T]) -> T:
        t0 = time.perf_counter()
        value = fn()
        stages.setdefault(name, []).append((time.perf_counter() - t0) / batch * 1e6)
        return value

    for i in range(5):
        proto_bytes = build_requests("reports", spec, payloads[:batch], batch, f"bd-proto-{i}")[0]
        packed_bytes = build_requests("packed", spec, payloads[:batch], batch, f"bd-packed-{i}")[0]
        request = timed("proto: parse SubmitReportsRequest", lambda: service_pb2.SubmitReportsRequest.FromString(
            proto_bytes))  # noqa: B023
        timed("proto: decode to SDK reports",
              lambda: [_decode_report(r, j) for j, r in enumerate(request.reports)])  # noqa: B023
        packed = service_pb2.SubmitPackedRequest.FromString(packed_bytes)
        request_id, items = timed("packed: unpack_batch", lambda: unpack_batch(packed.packed))  # noqa: B023
        results = timed("collector.submit (validate + durable store)",
                        lambda: collector.submit(request_id, items))  # noqa: B023

        def encode(results: list[tuple[Outcome, str]] = results,
                   items: Sequence[Report | Exception] = items) -> bytes:
            response = service_pb2.SubmitReportsResponse()
            add = response.outcomes.add
            for item, (outcome, reason) in zip(items, results):
                add(report_id=item.report_id if isinstance(item, Report) else b"", status=int(outcome), reason=reason)
            return response.SerializeToString()

        timed("encode SubmitReportsResponse", encode)
    return [(name, statistics.median(values)) for name, values in stages.items()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reports", type=int, default=200_000, help="reports per run (default 200000)")
    parser.add_argument("--batch", type=int, default=1000, help="reports per request (default 1000)")
    parser.add_argument("--clients", default="1,2,4", help="comma-separated client process counts")
    parser.add_argument("--modes", default="packed,reports", help="packed and/or reports")
    parser.add_argument("--domain", type=int, default=64)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--data-dir", default="", help="store directory (default: a temporary directory)")
    parser.add_argument("--workers", type=int, default=16, help="server worker threads")
    parser.add_argument("--breakdown", action="store_true", help="also time the server stages in-process")
    args = parser.parse_args(argv)

    data_dir = args.data_dir or tempfile.mkdtemp(prefix="ldp-bench-")
    config = CollectorConfig(listen="127.0.0.1:0", data_dir=data_dir, operator_token=TOKEN,
                             max_batch_reports=max(args.batch, 1), worker_threads=args.workers,
                             max_receive_bytes=64 * 1024 * 1024)
    print(f"# ingest throughput: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, grpcio {grpc.__version__}, "
          f"store in {data_dir}, batch {args.batch}, GRR over {args.domain} values", flush=True)
    server = start_server(config)
    runs: list[Run] = []
    stages: list[tuple[str, float]] = []
    try:
        with grpc.insecure_channel(server.address) as channel:
            operator = service_pb2_grpc.OperatorServiceStub(channel)
            device = service_pb2_grpc.DeviceServiceStub(channel)
            template_id = create_campaign(operator, args.domain, args.epsilon)
            template = serde.round_spec_from_proto(
                device.GetRoundSpec(service_pb2.GetRoundSpecRequest(campaign_id=template_id)).spec)
            t0 = time.perf_counter()
            payloads = randomized_values(template, args.reports, args.domain, seed=1)
            print(f"# generated {len(payloads)} GRR reports with the SDK in {time.perf_counter() - t0:.1f} s",
                  flush=True)
            for mode in args.modes.split(","):
                for clients in (int(c) for c in args.clients.split(",")):
                    cid = create_campaign(operator, args.domain, args.epsilon)
                    spec = serde.round_spec_from_proto(
                        device.GetRoundSpec(service_pb2.GetRoundSpecRequest(campaign_id=cid)).spec)
                    requests = build_requests(mode, spec, payloads, args.batch, f"{mode}-{clients}")
                    run = run_once(server.address, mode, clients, requests)
                    runs.append(run)
                    lat = sorted(run.latencies)
                    print(f"{mode:8s} clients={clients:<2d} {run.reports:>8d} reports in {run.seconds:6.2f} s = "
                          f"{run.rate:>9,.0f} reports/s  (batch latency p50 {lat[len(lat) // 2] * 1e3:.0f} ms, "
                          f"p99 {lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3:.0f} ms)", flush=True)
            if args.breakdown:
                cid = create_campaign(operator, args.domain, args.epsilon)
                spec = serde.round_spec_from_proto(
                    device.GetRoundSpec(service_pb2.GetRoundSpecRequest(campaign_id=cid)).spec)
                stages = breakdown(server.collector, spec, payloads, args.batch)
    finally:
        server.stop(grace=5.0)

    print()
    print("| mode | clients | reports | seconds | reports/s | p50 batch ms | p99 batch ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        lat = sorted(run.latencies)
        print(f"| {run.mode} | {run.clients} | {run.reports} | {run.seconds:.2f} | {run.rate:,.0f} | "
              f"{lat[len(lat) // 2] * 1e3:.0f} | {lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3:.0f} |")
    if args.breakdown:
        print()
        print("| server stage (in-process, one batch) | µs per report |")
        print("|---|---:|")
        for name, micros in stages:
            print(f"| {name} | {micros:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
