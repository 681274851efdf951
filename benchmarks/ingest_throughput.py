"""End-to-end ingestion throughput of the collector over gRPC on loopback.

Starts a real server (the default SQLite store in a temporary directory), creates a categorical
histogram campaign (GRR by default), pre-generates randomized reports with the SDK, pre-serializes
the requests (batches of ``--batch`` reports, as ``SubmitPacked`` msgpack and as ``SubmitReports``
protobuf), then sends them from ``--clients`` concurrent client *processes*, each keeping
``--depth`` requests in flight, and counts the reports acknowledged as ACCEPTED -- acknowledged
only after the durable commit -- per second of wall-clock time. Each run uses a fresh campaign, so
every report is new, and by default a fresh server and store (``--shared-store`` keeps one, so the
report-id index grows from run to run; ``--prefill`` stores that many reports before each run).

Besides the rate, each run prints the CPU time per report of the server process (every server
thread: gRPC, event loop, handlers, the store's writer) and of the client processes. On a shared
machine CPU time varies much less than wall time, and server + client CPU against the cores
available bounds what the machine can do.

``--breakdown`` also times the server stages of one batch in-process (no gRPC), in CPU
microseconds per report, for the batch-wide path the service takes and for the per-report
reference path (one ``Report`` object per report, ``validate_report`` per report): protobuf
parsing, decoding, the collector's handler-thread work (validation, encoding for the store), the
store's writer thread (SQLite inserts, accumulators, commit) and the response encoding.

Usage::

    PYTHONPATH=packages/ldp-client/src:packages/ldp-proto/src:packages/ldp-collector/src \\
        python benchmarks/ingest_throughput.py --reports 200000 --clients 1,2,4 --depth 1,4 --breakdown
"""

from __future__ import annotations

import argparse
import collections
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
from typing import Any, TypeVar

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
from ldp_collector.server.lifecycle import RunningServer, start_server
from ldp_collector.server.wire import DEVICE_SERVICE

T = TypeVar("T")
ClientResult = tuple[int, list[float], float]  # accepted, latencies, CPU seconds

TOKEN = "benchmark-operator-token-0123456789"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
ORACLES = {"grr": campaigns_pb2.GRR, "oue": campaigns_pb2.OUE}


@dataclass(frozen=True)
class Run:
    mode: str
    clients: int
    depth: int
    reports: int
    seconds: float
    latencies: list[float]
    server_cpu_us: float  # server process CPU per acknowledged report
    client_cpu_us: float  # client processes' CPU per acknowledged report

    @property
    def rate(self) -> float:
        return self.reports / self.seconds

    def latency_ms(self, q: float) -> float:
        lat = sorted(self.latencies)
        return lat[min(len(lat) - 1, int(len(lat) * q))] * 1e3


def create_campaign(operator: service_pb2_grpc.OperatorServiceStub, domain: int, epsilon: float, oracle: str) -> str:
    config = campaigns_pb2.CampaignConfig(
        kind=campaigns_pb2.HISTOGRAM, epsilon=epsilon, domain=campaigns_pb2.Domain(categorical_size=domain),
        histogram=campaigns_pb2.HistogramParameters(oracle=ORACLES[oracle]))
    campaign = operator.CreateCampaign(service_pb2.CreateCampaignRequest(config=config), metadata=AUTH)
    return str(campaign.config.campaign_id)


def round_spec(channel: grpc.Channel, campaign_id: str) -> RoundSpec:
    device = service_pb2_grpc.DeviceServiceStub(channel)
    return serde.round_spec_from_proto(
        device.GetRoundSpec(service_pb2.GetRoundSpecRequest(campaign_id=campaign_id)).spec)


def randomized_values(spec: RoundSpec, n: int, domain: int, seed: int) -> list[Payload]:
    """Mechanism outputs of ``n`` devices with a skewed true distribution (the SDK's own randomizer)."""
    rng = SeededRng(seed)
    component = spec.tasks[0].components[0]
    return [component.run(min(domain - 1, i % 7 if i % 3 else i % domain), rng=rng) for i in range(n)]


def make_reports(spec: RoundSpec, payloads: Sequence[Payload]) -> list[Report]:
    group = spec.tasks[0].groups[0]
    return [Report(report_id=os.urandom(16), campaign_id=spec.campaign_id, round=spec.round, group=group,
                   payloads=(p,)) for p in payloads]


def build_requests(mode: str, spec: RoundSpec, payloads: Sequence[Payload], batch: int, run_tag: str) -> list[bytes]:
    requests = []
    for start in range(0, len(payloads), batch):
        reports = make_reports(spec, payloads[start:start + batch])
        request_id = f"{run_tag}-{start}"
        message: Message
        if mode == "packed":
            message = service_pb2.SubmitPackedRequest(packed=pack_batch(request_id, reports))
        else:
            message = service_pb2.SubmitReportsRequest(request_id=request_id,
                                                       reports=[serde.report_to_proto(r) for r in reports])
        requests.append(message.SerializeToString())
    return requests


def _client(address: str, method: str, requests: list[bytes], depth: int, ready: multiprocessing.synchronize.Event,
            start: multiprocessing.synchronize.Event, out: multiprocessing.queues.Queue[ClientResult]) -> None:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/{DEVICE_SERVICE}/{method}", request_serializer=None,
                                   response_deserializer=None)
        grpc.channel_ready_future(channel).result(timeout=30)
        ready.set()
        start.wait()
        cpu = time.process_time()
        accepted = 0
        latencies = []
        in_flight: collections.deque[tuple[float, Any]] = collections.deque()
        for data in [*requests, None]:
            while in_flight and (data is None or len(in_flight) >= depth):
                t0, future = in_flight.popleft()
                response = service_pb2.SubmitReportsResponse.FromString(future.result())
                latencies.append(time.perf_counter() - t0)
                accepted += response.accepted
            if data is not None:
                in_flight.append((time.perf_counter(), call.future(data, timeout=120)))
        out.put((accepted, latencies, time.process_time() - cpu))


def run_once(address: str, mode: str, clients: int, depth: int, requests: list[bytes]) -> Run:
    # "spawn", not "fork": the parent runs the server's gRPC threads, which must not be forked.
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    out: multiprocessing.queues.Queue[ClientResult] = ctx.Queue()
    method = "SubmitPacked" if mode == "packed" else "SubmitReports"
    shares = [requests[i::clients] for i in range(clients)]
    readies = [ctx.Event() for _ in shares]
    procs = [ctx.Process(target=_client, args=(address, method, share, depth, ready, start, out))
             for share, ready in zip(shares, readies)]
    for p in procs:
        p.start()
    for ready in readies:  # every client is connected before the clock starts
        if not ready.wait(timeout=120):
            raise RuntimeError("a client process did not connect")
    cpu0, t0 = time.process_time(), time.perf_counter()
    start.set()
    results = [out.get() for _ in procs]
    seconds, server_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    for p in procs:
        p.join()
    client_cpu = sum(r[2] for r in results)  # from the start signal to the last answer
    accepted = sum(r[0] for r in results)
    latencies = [x for r in results for x in r[1]]
    return Run(mode=mode, clients=clients, depth=depth, reports=accepted, seconds=seconds, latencies=latencies,
               server_cpu_us=server_cpu / max(accepted, 1) * 1e6, client_cpu_us=client_cpu / max(accepted, 1) * 1e6)


def prefill(server: RunningServer, channel: grpc.Channel, args: argparse.Namespace) -> None:
    """Store ``args.prefill`` reports in a campaign of their own (grows the global report-id index)."""
    if not args.prefill:
        return
    operator = service_pb2_grpc.OperatorServiceStub(channel)
    spec = round_spec(channel, create_campaign(operator, args.domain, args.epsilon, args.oracle))
    payloads = randomized_values(spec, min(args.prefill, 10_000), args.domain, seed=2)
    for start in range(0, args.prefill, 10_000):
        n = min(10_000, args.prefill - start)
        request_id, items = unpack_batch(pack_batch(f"prefill-{start}", make_reports(spec, payloads[:n])))
        server.collector.submit(request_id, items)


# -- in-process stage breakdown -----------------------------------------------------------------------

def _thread_cpu_ns(native_id: int) -> int:
    """CPU time of one thread of this process (Linux), in nanoseconds."""
    with open(f"/proc/self/task/{native_id}/schedstat") as f:
        return int(f.read().split()[0])


def _reports_one_by_one(messages: Sequence[Any]) -> list[Report]:
    return [serde.report_from_proto(r, where=f"reports[{j}]") for j, r in enumerate(messages)]


def _response_one_by_one(report_ids: Sequence[bytes], results: Sequence[Any]) -> bytes:
    """The response built one ``ReportOutcome`` message at a time (the per-report reference)."""
    response = service_pb2.SubmitReportsResponse()
    for report_id, (outcome, reason) in zip(report_ids, results):
        response.outcomes.add(report_id=report_id, status=int(outcome), reason=reason)
    response.accepted = sum(outcome == 1 for outcome, _ in results)
    return response.SerializeToString()


def breakdown(collector: Collector, make_spec: Callable[[], RoundSpec], payloads: Sequence[Payload],
              batch: int, repeats: int = 8) -> list[tuple[str, float, float]]:
    """Median CPU microseconds per report of each server stage, batch-wide path and per-report path."""
    from ldp_client.report import unpack_batch_columns
    from ldp_collector.server.wire import submit_response

    writer = getattr(getattr(collector.store, "_writer", None), "_thread", None)  # the store's group-commit thread
    stages: dict[tuple[str, str], list[float]] = {}

    def timed(path: str, name: str, fn: Callable[..., T], *fn_args: Any) -> T:
        c0 = time.thread_time()
        value = fn(*fn_args)
        stages.setdefault((name, path), []).append((time.thread_time() - c0) / batch * 1e6)
        return value

    def encode(report_ids: Sequence[bytes], results: Sequence[Any]) -> bytes:
        return submit_response(report_ids, results).SerializeToString()

    for i in range(repeats):
        for path in ("batch", "per-report"):
            for mode in ("packed", "reports"):
                spec = make_spec()  # a fresh round: every report is new
                data = build_requests(mode, spec, payloads[:batch], batch, f"bd-{mode}-{path}-{i}")[0]
                items: Any
                if mode == "packed":
                    packed = timed(path, "packed: parse SubmitPackedRequest",
                                   service_pb2.SubmitPackedRequest.FromString, data).packed
                    request_id, items = timed(path, "packed: decode the msgpack batch",
                                              unpack_batch_columns if path == "batch" else unpack_batch, packed)
                else:
                    request = timed(path, "reports: parse SubmitReportsRequest",
                                    service_pb2.SubmitReportsRequest.FromString, data)
                    request_id = request.request_id
                    items = timed(path, "reports: decode the Report messages",
                                  serde.report_columns_from_proto if path == "batch" else _reports_one_by_one,
                                  request.reports)
                w0 = _thread_cpu_ns(writer.native_id) if writer is not None and writer.native_id else None
                results = timed(path, f"collector.submit, handler thread ({mode})", collector.submit, request_id, items)
                if w0 is not None and writer is not None and writer.native_id:
                    stages.setdefault((f"store writer thread ({mode})", path), []).append(
                        (_thread_cpu_ns(writer.native_id) - w0) / 1e3 / batch)
                ids = items.report_ids if path == "batch" else [r.report_id for r in items]
                timed(path, "encode SubmitReportsResponse", encode if path == "batch" else _response_one_by_one,
                      ids, results)
    names = list(dict.fromkeys(name for name, _ in stages))
    return [(name, statistics.median(stages[(name, "batch")]), statistics.median(stages[(name, "per-report")]))
            for name in names]


# -- main ---------------------------------------------------------------------------------------------

def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reports", type=int, default=200_000, help="reports per run (default 200000)")
    parser.add_argument("--batch", type=int, default=1000, help="reports per request (default 1000)")
    parser.add_argument("--clients", type=_ints, default=[1, 2, 4], help="comma-separated client process counts")
    parser.add_argument("--depth", type=_ints, default=[1], help="comma-separated requests in flight per client")
    parser.add_argument("--modes", default="packed,reports", help="packed and/or reports")
    parser.add_argument("--oracle", choices=sorted(ORACLES), default="grr")
    parser.add_argument("--domain", type=int, default=64)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each configuration (all are printed)")
    parser.add_argument("--shared-store", action="store_true",
                        help="one server and store for every run (the report-id index grows run by run)")
    parser.add_argument("--prefill", type=int, default=0, help="reports stored before each run (grows the index)")
    parser.add_argument("--data-dir", default="", help="parent of the store directories (default: a temporary one)")
    parser.add_argument("--workers", type=int, default=16, help="server worker threads")
    parser.add_argument("--breakdown", action="store_true", help="also time the server stages in-process")
    args = parser.parse_args(argv)

    parent = args.data_dir or tempfile.mkdtemp(prefix="ldp-bench-")
    configs = [(mode, clients, depth) for mode in args.modes.split(",") for clients in args.clients
               for depth in args.depth for _ in range(args.repeat)]
    print(f"# ingest throughput: {os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.2f} at start), "
          f"Python {sys.version.split()[0]}, grpcio {grpc.__version__}, stores under {parent}, "
          f"batch {args.batch}, {args.oracle.upper()} over {args.domain} values", flush=True)
    payloads: list[Payload] = []
    runs: list[Run] = []
    stages: list[tuple[str, float, float]] = []
    server: RunningServer | None = None
    try:
        for k, (mode, clients, depth) in enumerate([*configs, ("breakdown", 0, 0)]):
            if mode == "breakdown" and not args.breakdown:
                break
            if server is None or not args.shared_store:
                if server is not None:
                    server.stop(grace=5.0)
                config = CollectorConfig(listen="127.0.0.1:0", data_dir=os.path.join(parent, f"store-{k}"),
                                         operator_token=TOKEN, max_batch_reports=max(args.batch, 1),
                                         worker_threads=args.workers, max_receive_bytes=64 * 1024 * 1024)
                server = start_server(config)
            with grpc.insecure_channel(server.address) as channel:
                operator = service_pb2_grpc.OperatorServiceStub(channel)

                def new_spec() -> RoundSpec:
                    return round_spec(channel, create_campaign(operator, args.domain, args.epsilon,  # noqa: B023
                                                               args.oracle))

                if not payloads:
                    t0 = time.perf_counter()
                    payloads = randomized_values(new_spec(), args.reports, args.domain, seed=1)
                    print(f"# generated {len(payloads)} reports with the SDK in {time.perf_counter() - t0:.1f} s",
                          flush=True)
                if mode == "breakdown":
                    stages = breakdown(server.collector, new_spec, payloads, args.batch)
                    break
                prefill(server, channel, args)
                requests = build_requests(mode, new_spec(), payloads, args.batch, f"{mode}-{clients}-{depth}-{k}")
            run = run_once(server.address, mode, clients, depth, requests)
            runs.append(run)
            print(f"{mode:8s} clients={clients:<2d} depth={depth:<2d} {run.reports:>8d} reports in {run.seconds:6.2f} s "
                  f"= {run.rate:>9,.0f} reports/s  (server CPU {run.server_cpu_us:.1f} us/report, clients "
                  f"{run.client_cpu_us:.1f}; batch latency p50 {run.latency_ms(0.5):.0f} ms, "
                  f"p99 {run.latency_ms(0.99):.0f} ms; load {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        if server is not None:
            server.stop(grace=5.0)

    print()
    print("| mode | clients | depth | reports | seconds | reports/s | server CPU µs/report | client CPU µs/report "
          "| p50 batch ms | p99 batch ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        print(f"| {run.mode} | {run.clients} | {run.depth} | {run.reports} | {run.seconds:.2f} | {run.rate:,.0f} | "
              f"{run.server_cpu_us:.1f} | {run.client_cpu_us:.1f} | {run.latency_ms(0.5):.0f} | "
              f"{run.latency_ms(0.99):.0f} |")
    if stages:
        print()
        print("| server stage (in-process, one batch, CPU) | batch-wide path µs/report | per-report path µs/report |")
        print("|---|---:|---:|")
        for name, fast, slow in stages:
            print(f"| {name} | {fast:.2f} | {slow:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
