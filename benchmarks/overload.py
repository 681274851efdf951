"""Overload suite: the collector at several times its capacity, on loopback, in bounded time.

One command::

    PYTHONPATH=packages/ldp-client/src:packages/ldp-proto/src:packages/ldp-collector/src \\
        python benchmarks/overload.py [--workers 1] [--factor 5] [--seconds 20]

What it does:

1. Starts ``ldp-collector serve`` as a separate process (``--workers`` processes sharing the port)
   on 127.0.0.1 with a fresh SQLite data directory, and creates a histogram campaign (GRR).
2. **Capacity**: ``--clients`` client processes send ``SubmitPacked`` batches of ``--batch``
   reports in a closed loop (``--depth`` requests in flight each) for ``--capacity-seconds``; the
   acknowledged reports per second are the capacity.
3. **Overload**: the same processes offer ``--factor`` times that rate in an open loop for
   ``--seconds`` (new batches on a fixed schedule, whatever the answers). A batch refused with
   UNAVAILABLE or RESOURCE_EXHAUSTED is sent again -- the same bytes, so the same request id and
   report ids -- after the status's RetryInfo delay plus up to 20% jitter (the SDK client's rule);
   one that hit its deadline is sent again too. After the overload window the clients stop making
   new batches and keep retrying until every batch is acknowledged or ``--drain-deadline`` passes.
4. Samples the resident memory of the server's process tree every 0.5 s throughout. (Part of
   the growth while the database grows is the SQLite writer's page cache filling up to its
   fixed size, 128 MiB per process; the growth over the second half of the run shows whether
   anything else keeps growing.)
5. Stops the server with SIGTERM (it must exit 0), opens the store and checks that the stored
   report ids are exactly the acknowledged ones: none lost, none twice, none unacknowledged.

Every report id is unique by construction (phase, client, batch, index), so "exactly once" is a
set comparison. The table shows, per phase: offered and acknowledged reports/s, the calls
answered UNAVAILABLE and RESOURCE_EXHAUSTED, call latency (p50/p99 of acknowledged calls), then
the peak RSS, the RSS growth from the end of the capacity phase to the end of the run, and
lost / duplicated / unacknowledged-but-stored / never-landed counts (all must be 0; the exit
code is 1 otherwise).
"""

from __future__ import annotations

import argparse
import functools
import heapq
import json
import multiprocessing as mp
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgpack

REPO = Path(__file__).resolve().parents[1]
_ID_MAGIC = b"ovld"
_RETRYABLE = ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")
_RETRY_JITTER = 0.2


def report_id(phase: int, client: int, batch: int, index: int) -> bytes:
    """The unique 16-byte id of one report."""
    return struct.pack(">4sBBHII", _ID_MAGIC, phase, 0, client, batch, index)


# -- client processes -------------------------------------------------------------------------------

@dataclass
class ClientStats:
    """What one client process saw in one phase."""

    client: int
    phase: int
    batches_made: int = 0
    calls: int = 0
    unavailable: int = 0
    resource_exhausted: int = 0
    deadline_exceeded: int = 0
    other_errors: list[str] = field(default_factory=list)
    acked_batches: list[int] = field(default_factory=list)
    duplicates_answered: int = 0
    latencies: list[float] = field(default_factory=list)
    unlanded_batches: list[int] = field(default_factory=list)
    first_ack_at: float = 0.0
    last_ack_at: float = 0.0



def client_main(args: dict[str, Any], out: Any) -> None:
    """One client process: send batches on the phase's schedule, retry, report its stats."""
    import grpc

    from ldp.v1 import service_pb2, service_pb2_grpc
    from ldp_client.grpc import retry_delay

    client, phase, batch_size = args["client"], args["phase"], args["batch"]
    template: list[Any] = args["template"]
    rng = random.Random(client * 1000 + phase)
    stats = ClientStats(client=client, phase=phase)
    channel = grpc.insecure_channel(args["address"], options=[("grpc.use_local_subchannel_pool", 1),
                                                              ("grpc.max_send_message_length", 64 << 20)])
    stub = service_pb2_grpc.DeviceServiceStub(channel)
    # Reentrant: a call that fails at once runs its done-callback in the sending thread.
    lock = threading.RLock()
    wake = threading.Condition(lock)
    due: list[tuple[float, int]] = []          # (send time, batch) heap of sends and retries
    packed: dict[int, bytes] = {}              # unacknowledged batches
    sent_at: dict[int, float] = {}
    in_flight = 0

    def make(batch: int) -> None:
        rid = f"ovl-{phase}-{client}-{batch}"
        wires = []
        for i in range(batch_size):
            wire = list(template)
            wire[1] = report_id(phase, client, batch, i)
            wires.append(wire)
        packed[batch] = msgpack.packb([1, rid, wires], use_bin_type=True)
        stats.batches_made += 1

    def done(batch: int, future: Any) -> None:
        nonlocal in_flight
        now = time.monotonic()
        with lock:
            in_flight -= 1
            error = future.exception()
            if error is None:
                response = future.result()
                stats.acked_batches.append(batch)
                stats.duplicates_answered += response.duplicates
                if response.accepted + response.duplicates != batch_size:
                    stats.other_errors.append(f"batch {batch}: {response.rejected} rejected")
                stats.latencies.append(now - sent_at.pop(batch))
                stats.first_ack_at = stats.first_ack_at or now
                stats.last_ack_at = now
                del packed[batch]
            else:
                code = error.code().name
                sent_at.pop(batch, None)
                if code in _RETRYABLE:
                    if code == "UNAVAILABLE":
                        stats.unavailable += 1
                    elif code == "RESOURCE_EXHAUSTED":
                        stats.resource_exhausted += 1
                    else:
                        stats.deadline_exceeded += 1
                    delay = retry_delay(error)
                    delay = 0.5 * rng.random() if delay is None else delay * (1.0 + _RETRY_JITTER * rng.random())
                    heapq.heappush(due, (now + delay, batch))
                else:
                    stats.other_errors.append(f"batch {batch}: {code}: {error.details()}")
                    del packed[batch]
            wake.notify()

    start = time.monotonic()
    stop_new = start + args["seconds"]
    deadline = stop_new + args["drain_deadline"]
    interval = args["interval"]          # open loop: seconds between new batches; 0 = closed loop
    depth = args["depth"]
    next_new = start
    batch_no = 0
    with lock:
        while True:
            now = time.monotonic()
            if now >= deadline or (now >= stop_new and not packed):
                break
            # New batches: on schedule (open loop) or whenever fewer than `depth` are in flight (closed).
            if now < stop_new:
                if interval > 0:
                    while next_new <= now:
                        make(batch_no)
                        heapq.heappush(due, (next_new, batch_no))
                        batch_no += 1
                        next_new += interval
                elif in_flight + len(due) < depth:
                    make(batch_no)
                    heapq.heappush(due, (now, batch_no))
                    batch_no += 1
                    continue
            while due and due[0][0] <= now and in_flight < args["max_in_flight"]:
                _, batch = heapq.heappop(due)
                rid = f"ovl-{phase}-{client}-{batch}"
                in_flight += 1
                stats.calls += 1
                sent_at[batch] = time.monotonic()
                future = stub.SubmitPacked.future(
                    service_pb2.SubmitPackedRequest(request_id=rid, packed=packed[batch]), timeout=args["timeout"])
                future.add_done_callback(functools.partial(done, batch))
            wait = 0.05
            if due:
                wait = min(wait, max(0.0, due[0][0] - now))
            if interval > 0 and now < stop_new:
                wait = min(wait, max(0.0, next_new - now))
            wake.wait(timeout=max(wait, 0.0005))
        stats.unlanded_batches = sorted(packed)
    channel.close()
    out.put(asdict(stats))


def run_phase(ctx: Any, address: str, template: list[Any], phase: int, args: argparse.Namespace, *,
              seconds: float, interval: float, drain_deadline: float) -> list[ClientStats]:
    queue = ctx.Queue()
    procs = []
    for c in range(args.clients):
        spec = {"address": address, "template": template, "phase": phase, "client": c, "batch": args.batch,
                "seconds": seconds, "interval": interval, "depth": args.depth, "drain_deadline": drain_deadline,
                "max_in_flight": args.max_in_flight, "timeout": args.timeout}
        proc = ctx.Process(target=client_main, args=(spec, queue), daemon=True)
        proc.start()
        procs.append(proc)
    results = [ClientStats(**queue.get(timeout=seconds + drain_deadline + 120)) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    return sorted(results, key=lambda s: s.client)


# -- the server -------------------------------------------------------------------------------------

def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        stack.extend(children.get(p, ()))
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


class RssSampler(threading.Thread):
    def __init__(self, pid: int, period: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.samples: list[tuple[float, int, str]] = []
        self.phase = "start"
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.samples.append((time.monotonic(), tree_rss(self.pid), self.phase))
            self._halt.wait(self.period)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def stop_server(server: subprocess.Popen[bytes]) -> int:
    """SIGTERM (a graceful drain), then SIGKILL after 60 s; the exit code."""
    server.send_signal(signal.SIGTERM)
    try:
        return server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        return server.wait()


def start_server(data_dir: Path, args: argparse.Namespace, *,
                 stderr: Any = subprocess.PIPE) -> tuple[subprocess.Popen[bytes], str]:
    """``ldp-collector serve`` on a free loopback port with ``args.workers`` processes and, unless
    ``args.max_queued`` is None, that ``max_queued_calls``; its log (JSON, WARNING and up) goes to
    ``stderr`` (a pipe by default; pass a file when the server may log more than a pipe holds)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LDP_")}
    paths = [str(REPO / "packages" / p / "src") for p in ("ldp-client", "ldp-proto", "ldp-collector")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    env.update({"LDP_TICK_INTERVAL_S": "60", "LDP_GRACE_PERIOD_S": "10"})
    if args.max_queued is not None:
        env["LDP_MAX_QUEUED_CALLS"] = str(args.max_queued)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ldp_collector.cli", "serve", "--listen", f"127.0.0.1:{port}", "--data-dir",
         str(data_dir), "--workers", str(args.workers), "--log-format", "json", "--log-level", "WARNING"],
        env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    return proc, f"127.0.0.1:{port}"


def wait_serving(address: str, timeout: float = 60.0) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                time.sleep(0.2)
    raise RuntimeError(f"the collector at {address} did not start within {timeout} s")


def create_campaign(address: str) -> tuple[str, list[Any]]:
    """A GRR histogram campaign and the wire form of one valid report (the template)."""
    import grpc

    from ldp.v1 import campaigns_pb2, service_pb2, service_pb2_grpc
    from ldp_client import serde
    from ldp_client.report import Report
    from ldp_client.rng import SeededRng

    config = campaigns_pb2.CampaignConfig(
        kind=campaigns_pb2.HISTOGRAM, domain=campaigns_pb2.Domain(categorical_size=16), epsilon=2.0,
        histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.GRR))
    with grpc.insecure_channel(address) as channel:
        campaign = service_pb2_grpc.OperatorServiceStub(channel).CreateCampaign(
            service_pb2.CreateCampaignRequest(config=config), timeout=30)
        response = service_pb2_grpc.DeviceServiceStub(channel).GetRoundSpec(
            service_pb2.GetRoundSpecRequest(campaign_id=campaign.config.campaign_id), timeout=30)
    spec = serde.round_spec_from_proto(response.spec)
    task = spec.tasks[0]
    rng = SeededRng(0)
    report = Report(report_id=report_id(0, 0, 0, 0), campaign_id=spec.campaign_id, round=spec.round,
                    group=task.groups[0], payloads=tuple(c.run(3, rng=rng) for c in task.components))
    return spec.campaign_id, report.to_wire()


# -- the run ------------------------------------------------------------------------------------------

def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(stats: list[ClientStats], batch: int, seconds: float) -> dict[str, Any]:
    latencies = [x for s in stats for x in s.latencies]
    return {
        "offered_per_s": sum(s.batches_made for s in stats) * batch / seconds,
        "acknowledged_reports": sum(len(s.acked_batches) for s in stats) * batch,
        "calls": sum(s.calls for s in stats),
        "unavailable": sum(s.unavailable for s in stats),
        "resource_exhausted": sum(s.resource_exhausted for s in stats),
        "deadline_exceeded": sum(s.deadline_exceeded for s in stats),
        "duplicates_answered": sum(s.duplicates_answered for s in stats),
        "other_errors": [e for s in stats for e in s.other_errors][:10],
        "never_landed_batches": sum(len(s.unlanded_batches) for s in stats),
        "latency_p50_ms": 1e3 * _percentile(latencies, 0.50),
        "latency_p99_ms": 1e3 * _percentile(latencies, 0.99),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1, help="server processes (default 1)")
    parser.add_argument("--clients", type=int, default=4, help="client processes (default 4)")
    parser.add_argument("--batch", type=int, default=500, help="reports per SubmitPacked call (default 500)")
    parser.add_argument("--depth", type=int, default=4, help="calls in flight per client when measuring capacity")
    parser.add_argument("--capacity-seconds", type=float, default=5.0, help="length of the capacity phase (default 5 s)")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of the overload window (default 8 s)")
    parser.add_argument("--factor", type=float, default=5.0, help="offered load / capacity (default 5)")
    parser.add_argument("--drain-deadline", type=float, default=120.0,
                        help="seconds after the window for every batch to land (default 120)")
    parser.add_argument("--max-queued", type=int, default=64, help="the server's max_queued_calls (default 64)")
    parser.add_argument("--max-in-flight", type=int, default=64, help="calls in flight per client (default 64)")
    parser.add_argument("--timeout", type=float, default=10.0, help="deadline of each call (default 10 s)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)

    from ldp_collector.storage import open_store

    ctx = mp.get_context("spawn")  # the parent holds gRPC channels: never fork it
    with tempfile.TemporaryDirectory(prefix="ldp-overload-") as tmp:
        data_dir = Path(tmp) / "data"
        server, address = start_server(data_dir, args)
        sampler = RssSampler(server.pid)
        try:
            wait_serving(address)
            campaign_id, template = create_campaign(address)
            sampler.start()
            sampler.phase = "capacity"
            capacity_stats = run_phase(ctx, address, template, 1, args, seconds=args.capacity_seconds,
                                       interval=0.0, drain_deadline=args.timeout + 5)
            capacity = summarize(capacity_stats, args.batch, args.capacity_seconds)
            capacity_rate = capacity["acknowledged_reports"] / args.capacity_seconds
            rss_before = sampler.samples[-1][1] if sampler.samples else tree_rss(server.pid)
            sampler.phase = "overload"
            per_client = args.factor * capacity_rate / args.clients
            interval = args.batch / per_client
            t0 = time.monotonic()
            overload_stats = run_phase(ctx, address, template, 2, args, seconds=args.seconds, interval=interval,
                                       drain_deadline=args.drain_deadline)
            landed_after = time.monotonic() - t0
            overload = summarize(overload_stats, args.batch, args.seconds)
            rss_after = tree_rss(server.pid)
        finally:
            if sampler.is_alive():
                sampler.stop()
            exit_code = stop_server(server)
            stderr = server.stderr.read().decode() if server.stderr else ""

        expected: set[bytes] = set()
        for phase, stats in ((1, capacity_stats), (2, overload_stats)):
            for s in stats:
                for b in s.acked_batches:
                    expected.update(report_id(phase, s.client, b, i) for i in range(args.batch))
        store = open_store(str(data_dir))
        try:
            stored = [r.report_id for chunk in store.iter_reports(campaign_id, 1) for r in chunk]
        finally:
            store.close()
    unique = set(stored)
    peak = max(rss for _, rss, _ in sampler.samples)
    during = [rss for _, rss, phase in sampler.samples if phase == "overload"]
    half = during[len(during) // 2:] or [rss_after]
    result = {
        "workers": args.workers, "clients": args.clients, "batch": args.batch, "factor": args.factor,
        "capacity": capacity, "capacity_per_s": capacity_rate,
        "overload": overload, "overload_window_s": args.seconds, "all_landed_after_s": landed_after,
        "overload_acknowledged_per_s": overload["acknowledged_reports"] / landed_after,
        "rss_peak_mib": peak / 2**20, "rss_growth_mib": (rss_after - rss_before) / 2**20,
        "rss_growth_second_half_mib": (half[-1] - half[0]) / 2**20,
        "rss_samples": len(sampler.samples),
        "stored": len(stored), "acknowledged": len(expected),
        "lost": len(expected - unique), "duplicates": len(stored) - len(unique),
        "unacknowledged_stored": len(unique - expected), "server_exit_code": exit_code,
    }
    print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    ok = (result["lost"] == 0 and result["duplicates"] == 0 and result["unacknowledged_stored"] == 0
          and overload["never_landed_batches"] == 0 and not overload["other_errors"]
          and not capacity["other_errors"] and exit_code == 0)
    if not ok:
        sys.stderr.write(f"overload suite FAILED (server stderr tail: {stderr[-2000:]!r})\n")
    return 0 if ok else 1


def print_table(r: dict[str, Any]) -> None:
    c, o = r["capacity"], r["overload"]
    print(f"collector overload suite: {r['workers']} server process(es), {r['clients']} client processes, "
          f"SubmitPacked x {r['batch']} reports, loopback")
    print(f"{'phase':<10} {'offered/s':>11} {'acked/s':>10} {'calls':>8} {'UNAVAIL':>8} {'RES_EXH':>8} "
          f"{'DEADLINE':>8} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"{'capacity':<10} {'(closed)':>11} {r['capacity_per_s']:>10,.0f} {c['calls']:>8,} {c['unavailable']:>8,} "
          f"{c['resource_exhausted']:>8,} {c['deadline_exceeded']:>8,} {c['latency_p50_ms']:>8.1f} "
          f"{c['latency_p99_ms']:>8.1f}")
    print(f"{'overload':<10} {o['offered_per_s']:>11,.0f} {r['overload_acknowledged_per_s']:>10,.0f} {o['calls']:>8,} "
          f"{o['unavailable']:>8,} {o['resource_exhausted']:>8,} {o['deadline_exceeded']:>8,} "
          f"{o['latency_p50_ms']:>8.1f} {o['latency_p99_ms']:>8.1f}")
    print(f"offered {r['factor']:g}x capacity for {r['overload_window_s']:g} s; every batch landed after "
          f"{r['all_landed_after_s']:.1f} s (acked/s above is over that time)")
    print(f"server RSS: peak {r['rss_peak_mib']:.0f} MiB, growth over the overload run {r['rss_growth_mib']:+.1f} MiB, "
          f"over its second half {r['rss_growth_second_half_mib']:+.1f} MiB ({r['rss_samples']} samples every 0.5 s)")
    print(f"acknowledged {r['acknowledged']:,}, stored {r['stored']:,}: lost {r['lost']}, duplicates {r['duplicates']}, "
          f"unacknowledged stored {r['unacknowledged_stored']}, never landed {o['never_landed_batches']} batches, "
          f"duplicate answers to retries {o['duplicates_answered']:,}, server exit code {r['server_exit_code']}")


if __name__ == "__main__":
    sys.exit(main())
