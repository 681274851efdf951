"""Sustained, paced, open-loop load test of ``ldp-collector serve`` processes on loopback.

What it does
------------
1. Starts the collector the way users run it: ``ldp-collector serve --config FILE`` subprocess(es)
   (the console script when it is on ``PATH``, else ``python -m ldp_collector.cli``), with a TOML
   file naming the port, the store and the operator token, in a fresh working directory:

   * ``--topology single``: one process over an SQLite store;
   * ``--topology workers2``: ``serve --workers 2`` (two processes sharing one port with
     SO_REUSEPORT, one SQLite store);
   * ``--topology pg2``: two separate ``serve`` processes on two ports over ONE PostgreSQL database
     (``--postgres-url``, or a throw-away server started from ``tests/support/postgres.py``);
     client ``k`` talks to server ``k mod 2``.

2. Creates a histogram campaign (GRR over 64 values by default, no automatic round closing) through
   the operator API.

3. Starts ``--clients`` client processes. Each fetches the round spec, randomizes a pool of
   reports with the SDK (``--pool`` per client), packs them into ``SubmitPacked`` request templates
   of ``--batch`` reports, and then sends requests *by the clock*: request ``j`` of client ``k`` is
   due at ``t0 + (j + k / clients) * batch * clients / rate``, whether or not earlier requests have
   been answered (open loop). Every request gets fresh report ids in the SDK's layout (the
   creation second, then 12 random bytes; ``--random-ids`` for 16 random bytes) and its own
   request id, patched into the template, so every report is new. Latency is measured from the
   *scheduled* send time to the final answer, so a server that falls behind shows it in the
   latency (coordinated omission is not hidden). A request answered UNAVAILABLE /
   RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED is sent again, byte for byte (same request id), after the
   server's ``google.rpc.RetryInfo`` delay (plus up to 20 % jitter), or an exponential backoff when
   the status carries none. ``--max-in-flight`` bounds the requests a client holds (sent, or
   waiting for a retry); a due send that finds the bound reached waits, and its wait counts in its
   latency. Each client uses ``--channels`` connections in turn (SO_REUSEPORT spreads connections,
   not requests, over ``workers2``'s processes).

4. Runs ``--duration`` seconds of sends, then lets the answers drain (at most ``--drain-timeout``
   seconds), sampling every second the resident memory (``VmRSS``) of every server process
   (children included) and printing a progress line every 10 s.

5. Stops the servers (SIGTERM: graceful drain) and checks for loss: the stored report count of the
   round, read by opening the store after the run, must equal the number of reports acknowledged
   as ACCEPTED (or DUPLICATE); an order-independent digest (the sum of the 128-bit report ids) of
   the stored reports must equal the digest of the acknowledged ids, and the stored ids must be
   distinct (duplicates = rows - distinct ids). Requests still unanswered when the drain ends, or
   failed for good, are counted as *unresolved*: their reports may or may not be stored, and the
   check then only bounds the count (acknowledged <= stored <= acknowledged + unresolved).

Output
------
A summary on stdout, a JSON file with every figure (``load_<topology>_<duration>s.json`` or
``load_<topology>_capacity.json``) and a markdown row appended to ``load_runs.md``, both in
``--out`` (default ``benchmarks/results``):

* offered rate (reports/s the clients were scheduled to send) and acknowledged rate (reports
  acknowledged after the durable commit per second: over the whole run, and per 10-s window of
  the send period, minimum and median);
* request latency (one request = ``--batch`` reports) p50 / p95 / p99 / max, from the scheduled time;
* server RSS: maximum of each process and of the sum over the processes (``VmRSS``; also the
  summed proportional set size, which counts pages shared between forked workers once), and its
  trend per minute with the acknowledged rate and the server CPU per report per minute, to see
  whether the store slows down or grows in memory as it fills; for ``pg2`` with a server this
  script started, the PostgreSQL processes' CPU and memory too;
* CPU seconds of the server processes and of the client processes, and per acknowledged report;
* errors by status code, retries, late sends, unresolved requests;
* the loss check (stored, acknowledged, lost, duplicates, digest match) and ``passed``.

The exit status is 0 when the loss check passes (nothing lost, no duplicate, digests equal), no
request failed for good, and -- when given -- the ``--max-p99-ms`` and ``--max-rss-mib`` bounds hold
(the latter on the summed ``VmRSS``, the conservative figure).

``--find-capacity`` ramps the rate instead: steps of ``--step-duration`` seconds starting at
``--rate``, each ``--ramp-factor`` times the previous, on the same servers (a fresh campaign per
step, so the store grows from step to step), until a step misses ``--target-p99-ms`` or
acknowledges less than 98 % of what it offered (when the first step misses already, the rate goes
down by the same factor until a step passes); the highest passing rate is the capacity to use as
the sustained ``--rate``. Each step's acknowledged count must equal the stored count the operator
API reports (``GetCampaign``); the store is not reopened between steps. On a machine shared with other work the capacity moves with that work:
the load average is printed and recorded, and the server CPU per report is the steadier figure.

Usage::

    PYTHONPATH=packages/ldp-client/src:packages/ldp-proto/src:packages/ldp-collector/src \\
        python benchmarks/load.py --topology single --rate 50000 --duration 600
    python benchmarks/load.py --topology single --find-capacity --rate 20000 --step-duration 20
    python benchmarks/load.py --topology pg2 --postgres-url postgresql://user@127.0.0.1:5432/ldp

At 50 000 reports/s a 10-minute run stores 30 million reports (about 3 GB of SQLite); the working
directory (``--workdir``, default a temporary directory) is removed afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import heapq
import json
import math
import multiprocessing as mp
import multiprocessing.queues
import multiprocessing.synchronize
import os
import queue
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ingest_throughput import AUTH, ORACLES, TOKEN, create_campaign, randomized_values, round_spec

from ldp.v1 import service_pb2, service_pb2_grpc
from ldp_client.grpc import retry_delay
from ldp_client.report import Report, pack_batch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "results"
TOPOLOGIES = ("single", "workers2", "pg2")
SUBMIT_PACKED = "/ldp.v1.DeviceService/SubmitPacked"
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                       grpc.StatusCode.DEADLINE_EXCEEDED})
#: Extra random delay on top of a RetryInfo delay, as a fraction of it (as the SDK does).
RETRY_JITTER = 0.2
#: Request ids are ``<run tag>-<client>-<sequence>`` with fixed widths, so they patch in place.
REQUEST_ID_WIDTH = 8 + 1 + 3 + 1 + 10
#: A report's id in a packed batch: msgpack ``bin 8`` of 16 bytes.
_ID_PREFIX = b"\xc4\x10"
_MIB = 1024 * 1024
#: A capacity step passes only when it acknowledges at least this share of the reports it offered.
CAPACITY_MIN_ACK_SHARE = 0.98


# -- request templates ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Template:
    """A serialized ``SubmitPackedRequest`` of ``n`` reports whose ids and request id patch in place."""

    data: bytes
    id_offsets: tuple[int, ...]
    request_id_offset: int

    @property
    def n(self) -> int:
        return len(self.id_offsets)

    def fill(self, request_id: str, ids: bytes) -> bytes:
        """The request with ``request_id`` (``REQUEST_ID_WIDTH`` ASCII characters) and ``n`` new ids."""
        rid = request_id.encode("ascii")
        if len(rid) != REQUEST_ID_WIDTH or len(ids) != 16 * self.n:
            raise ValueError(f"request_id must be {REQUEST_ID_WIDTH} ASCII characters and ids {16 * self.n} "
                             f"bytes, got {len(rid)} and {len(ids)}")
        buf = bytearray(self.data)
        buf[self.request_id_offset:self.request_id_offset + REQUEST_ID_WIDTH] = rid
        for k, offset in enumerate(self.id_offsets):
            buf[offset:offset + 16] = ids[16 * k:16 * k + 16]
        return bytes(buf)


def fresh_ids(n: int, *, random: bool = False) -> bytes:
    """``n`` new 16-byte report ids, concatenated: the SDK's layout (``ldp_client.report.new_report_id``:
    the creation second, big-endian, then 12 random bytes), or 16 random bytes each with ``random``
    (what an SDK before time-prefixed ids sent; measures the store's random-key index cost)."""
    if random:
        return os.urandom(16 * n)
    prefix = int(time.time()).to_bytes(4, "big")
    tails = os.urandom(12 * n)
    return b"".join(prefix + tails[12 * i:12 * i + 12] for i in range(n))


def build_templates(campaign_id: str, round: int, group: int, payloads: Sequence[Any], batch: int) -> list[Template]:
    """One template per ``batch`` payloads of the pool (the last, short one is dropped unless alone)."""
    chunks = [payloads[i:i + batch] for i in range(0, len(payloads), batch)]
    if len(chunks) > 1 and len(chunks[-1]) < batch:
        chunks.pop()
    placeholder = "#" * REQUEST_ID_WIDTH
    templates = []
    for chunk in chunks:
        ids = [os.urandom(16) for _ in chunk]
        reports = [Report(report_id=rid, campaign_id=campaign_id, round=round, group=group, payloads=(p,))
                   for rid, p in zip(ids, chunk)]
        data = service_pb2.SubmitPackedRequest(packed=pack_batch(placeholder, reports)).SerializeToString()
        offsets, start = [], 0
        for rid in ids:  # the reports are packed in order: search forward from the previous one
            start = data.index(_ID_PREFIX + rid, start) + len(_ID_PREFIX)
            offsets.append(start)
        templates.append(Template(data=data, id_offsets=tuple(offsets),
                                  request_id_offset=data.index(placeholder.encode("ascii"))))
    return templates


def id_digest(ids: bytes) -> int:
    """Order-independent digest of concatenated 16-byte ids: the sum of their big-endian values."""
    return sum(int.from_bytes(ids[i:i + 16], "big") for i in range(0, len(ids), 16))



# -- client processes -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ClientPlan:
    """What one client process sends (picklable: it crosses the spawn boundary)."""

    index: int
    clients: int
    address: str
    campaign_id: str
    rate: float  # aggregate reports/s of all clients
    batch: int
    duration: float
    run_tag: str
    pool: int
    seed: int
    domain: int
    max_in_flight: int
    channels: int
    request_timeout: float
    drain_timeout: float
    max_attempts: int
    random_ids: bool = False

    @property
    def interval(self) -> float:
        """Seconds between two sends of this client."""
        return self.batch * self.clients / self.rate

    @property
    def requests(self) -> int:
        return max(1, int(self.duration / self.interval))


@dataclass
class ClientResult:
    index: int
    requests: int = 0  # scheduled
    answered: int = 0  # requests with a response
    reports_sent: int = 0  # reports in the requests issued (first attempts)
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    digest: int = 0  # of the ids acknowledged ACCEPTED or DUPLICATE
    retries: int = 0
    retried_requests: int = 0
    late_sends: int = 0  # issued more than 10 ms after their scheduled time
    failed_requests: int = 0  # a non-retryable status, or out of attempts
    failed_reports: int = 0
    unresolved_requests: int = 0  # still unanswered when the drain ended
    unresolved_reports: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # failed attempts by status code
    latencies: list[float] = field(default_factory=list)  # per answered request, from its scheduled time
    scheduled: list[float] = field(default_factory=list)  # the scheduled send time of each, since t0
    acked_per_second: dict[int, int] = field(default_factory=dict)  # by second of the answer since t0
    cpu_s: float = 0.0
    error: str = ""


@dataclass
class _Pending:
    data: bytes
    scheduled: float
    digest: int
    n: int
    attempts: int = 0


def _client_main(plan: ClientPlan, start_at: Any, ready: multiprocessing.synchronize.Event,
                 go: multiprocessing.synchronize.Event, out: multiprocessing.queues.Queue[Any]) -> None:
    """One client process: build the templates, wait for ``go``, send by the clock, report."""
    try:
        result = _client_run(plan, start_at, ready, go, out)
    except BaseException as exc:  # the parent must always get an answer
        result = ClientResult(index=plan.index, error=f"{type(exc).__name__}: {exc}")
        ready.set()
    out.put(("result", plan.index, result))


def _client_run(plan: ClientPlan, start_at: Any, ready: multiprocessing.synchronize.Event,
                go: multiprocessing.synchronize.Event, out: multiprocessing.queues.Queue[Any]) -> ClientResult:
    # Each channel gets a connection of its own (no shared subchannel pool): with SO_REUSEPORT the
    # kernel spreads connections, not requests, over the worker processes.
    options = [("grpc.max_send_message_length", 64 * _MIB), ("grpc.max_receive_message_length", 64 * _MIB),
               ("grpc.use_local_subchannel_pool", 1)]
    rng = random.Random(plan.seed)  # jitter of retry delays only; report randomness is the SDK's
    with ExitStack() as stack:
        channels = [stack.enter_context(grpc.insecure_channel(plan.address, options=options))
                    for _ in range(plan.channels)]
        for channel in channels:
            grpc.channel_ready_future(channel).result(timeout=60)
        spec = round_spec(channels[0], plan.campaign_id)
        payloads = randomized_values(spec, plan.pool, plan.domain, seed=plan.seed)
        templates = build_templates(spec.campaign_id, spec.round, spec.tasks[0].groups[0], payloads, plan.batch)
        calls = [channel.unary_unary(SUBMIT_PACKED, request_serializer=None, response_deserializer=None)
                 for channel in channels]
        ready.set()
        go.wait()
        t0 = float(start_at.value)
        return _send_loop(plan, calls, templates, t0, rng, out)


def _send_loop(plan: ClientPlan, calls: Sequence[Any], templates: Sequence[Template], t0: float, rng: random.Random,
               out: multiprocessing.queues.Queue[Any]) -> ClientResult:
    res = ClientResult(index=plan.index, requests=plan.requests)
    interval = plan.interval
    offset = interval * plan.index / plan.clients
    done: queue.SimpleQueue[tuple[int, Any, float]] = queue.SimpleQueue()
    pending: dict[int, _Pending] = {}
    retry_heap: list[tuple[float, int]] = []
    acked = collections.Counter[int]()
    statuses = collections.Counter[str]()
    next_seq = 0
    drain_deadline = t0 + plan.duration + plan.drain_timeout
    next_progress = t0 + 1.0
    acked_total = 0

    while time.monotonic() < t0:
        time.sleep(min(0.05, max(0.0, t0 - time.monotonic())))
    cpu0 = time.process_time()

    def issue(seq: int) -> None:
        p = pending[seq]
        p.attempts += 1
        # Attempts rotate over the channels: a retry may reach another worker process.
        future = calls[(seq + p.attempts) % len(calls)].future(p.data, timeout=plan.request_timeout)
        future.add_done_callback(lambda f, s=seq: done.put((s, f, time.monotonic())))

    while True:
        now = time.monotonic()
        while next_seq < plan.requests and len(pending) < plan.max_in_flight:
            scheduled = t0 + offset + next_seq * interval
            if scheduled > now:
                break
            template = templates[next_seq % len(templates)]
            ids = fresh_ids(template.n, random=plan.random_ids)
            request_id = f"{plan.run_tag}-{plan.index:03d}-{next_seq:010d}"
            pending[next_seq] = _Pending(data=template.fill(request_id, ids), scheduled=scheduled,
                                         digest=id_digest(ids), n=template.n)
            res.reports_sent += template.n
            if now - scheduled > 0.010:
                res.late_sends += 1
            issue(next_seq)
            next_seq += 1
        while retry_heap and retry_heap[0][0] <= now:
            _, seq = heapq.heappop(retry_heap)
            issue(seq)
        if next_seq >= plan.requests and not pending:
            break
        if now >= drain_deadline:
            break
        wake = min(t0 + offset + next_seq * interval if next_seq < plan.requests else math.inf,
                   retry_heap[0][0] if retry_heap else math.inf, next_progress, drain_deadline)
        items: list[tuple[int, Any, float]] = []
        try:
            items.append(done.get(timeout=min(0.05, max(0.0, wake - now))))
            while True:
                items.append(done.get_nowait())
        except queue.Empty:
            pass
        for seq, future, t_done in items:
            p = pending[seq]
            try:
                raw = future.result()
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
                statuses[code.name] += 1
                if code in RETRYABLE and p.attempts < plan.max_attempts and t_done < drain_deadline:
                    server_delay = retry_delay(exc)
                    delay = (server_delay * (1.0 + RETRY_JITTER * rng.random()) if server_delay is not None
                             else min(2.0, 0.05 * 2.0 ** (p.attempts - 1)) * rng.random())
                    res.retries += 1
                    if p.attempts == 1:
                        res.retried_requests += 1
                    heapq.heappush(retry_heap, (t_done + delay, seq))
                else:
                    res.failed_requests += 1
                    res.failed_reports += p.n
                    del pending[seq]
                continue
            del pending[seq]
            response = service_pb2.SubmitReportsResponse.FromString(raw)
            stored = response.accepted + response.duplicates
            if response.accepted == p.n:
                res.digest += p.digest
            else:
                for outcome in response.outcomes:
                    if outcome.status in (service_pb2.ReportOutcome.ACCEPTED, service_pb2.ReportOutcome.DUPLICATE):
                        res.digest += int.from_bytes(outcome.report_id, "big")
            res.accepted += response.accepted
            res.duplicates += response.duplicates
            res.rejected += response.rejected
            res.answered += 1
            res.latencies.append(t_done - p.scheduled)
            res.scheduled.append(p.scheduled - t0)
            acked[int(t_done - t0)] += stored
            acked_total += stored
        if now >= next_progress:
            out.put(("progress", plan.index, acked_total, len(pending)))
            next_progress += 1.0

    res.unresolved_requests = len(pending)
    res.unresolved_reports = sum(p.n for p in pending.values())
    res.statuses = dict(statuses)
    res.acked_per_second = dict(acked)
    res.cpu_s = time.process_time() - cpu0
    return res


# -- server processes -----------------------------------------------------------------------------

def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def collector_command() -> list[str]:
    """``ldp-collector`` as installed, else the same CLI through the interpreter running this script."""
    exe = shutil.which("ldp-collector")
    return [exe] if exe else [sys.executable, "-m", "ldp_collector.cli"]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string for the plain ASCII values used here


@dataclass
class ServerProcess:
    name: str
    address: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def start_collector(name: str, workdir: Path, store: str, *, workers: int, batch: int,
                    options: Sequence[str]) -> ServerProcess:
    """Write ``<name>.toml`` and start ``ldp-collector serve`` on a free loopback port."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    settings: dict[str, Any] = {
        "listen": address, "data_dir": store, "operator_token": TOKEN, "log_format": "json",
        "max_batch_reports": max(batch, 1000), "max_receive_bytes": 64 * _MIB,
    }
    if workers > 1:
        settings["reuse_port"] = True
    lines = [f"{key} = {_toml_value(value)}" for key, value in settings.items()]
    for option in options:  # KEY=VALUE in TOML syntax, e.g. max_queued_calls=64
        key, sep, value = option.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--server-option must be KEY=VALUE (TOML value), got {option!r}")
        lines = [line for line in lines if not line.startswith(f"{key.strip()} =")]
        lines.append(f"{key.strip()} = {value.strip()}")
    config = workdir / f"{name}.toml"
    config.write_text("\n".join(lines) + "\n")
    command = [*collector_command(), "serve", "--config", str(config)]
    if workers > 1:
        command += ["--workers", str(workers)]
    log = workdir / f"{name}.log"
    env = dict(os.environ)
    if env.get("PYTHONPATH"):  # the server runs in the working directory: make relative entries absolute
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    with log.open("wb") as log_file:
        process = subprocess.Popen(command, cwd=workdir, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    return ServerProcess(name=name, address=address, process=process, log=log)


def wait_serving(server: ServerProcess, timeout: float = 60.0) -> None:
    """Block until the server's health check says SERVING; raise with its log when it dies or hangs."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            if server.process.poll() is not None:
                raise RuntimeError(f"{server.name} exited with status {server.process.returncode} while starting:\n"
                                   f"{server.log_tail()}")
            try:
                answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{server.name} is not serving after {timeout:.0f} s:\n{server.log_tail()}")
            time.sleep(0.2)


def stop_collector(server: ServerProcess, timeout: float = 60.0) -> int:
    """SIGTERM (graceful drain), then SIGKILL to the process group after ``timeout``; the exit status."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()
    return int(server.process.returncode)


# -- process sampling (Linux /proc) ---------------------------------------------------------------

def descendants(root: int) -> list[int]:
    """``root`` and every live descendant process."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        children[int(fields[1])].append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def memory_bytes(pid: int) -> tuple[int, int]:
    """``(RSS, PSS)`` of a live process from one read of ``smaps_rollup``: one walk of its pages, so
    PSS <= RSS holds within the pair (two separate reads, a moment apart, see a growing process at two
    sizes); ``(VmRSS, 0)`` where the kernel has no ``smaps_rollup``, ``(0, 0)`` for a process gone."""
    rss = pss = -1
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
    except OSError:
        pass
    if rss < 0 or pss < 0:
        return rss_bytes(pid), 0
    return rss, pss


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process (its threads included)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServerSampler:
    """RSS and CPU of a set of server process trees, sampled on demand."""

    def __init__(self, roots: Sequence[int]) -> None:
        self.roots = list(roots)
        self.pids: list[int] = []
        self.max_rss: dict[int, int] = {}
        self.samples: list[tuple[float, int]] = []  # (seconds since the start of the load, summed RSS)
        self.pss_samples: list[tuple[float, int]] = []  # (seconds since the start, summed PSS)
        self.cpu_samples: list[tuple[float, float]] = []  # (seconds since the start, summed CPU seconds)
        self._cpu_start: dict[int, float] = {}
        self.cpu_per_process: dict[int, float] = {}
        self.refresh()

    def refresh(self) -> None:
        self.pids = [pid for root in self.roots for pid in descendants(root)]

    def sample(self, t: float) -> int:
        """Record the summed RSS (returned) and the summed CPU seconds so far at ``t``."""
        total = total_pss = 0
        for pid in self.pids:
            rss, pss = memory_bytes(pid)  # one snapshot: the summed PSS never exceeds the summed RSS
            self.max_rss[pid] = max(self.max_rss.get(pid, 0), rss)
            total += rss
            total_pss += pss
        self.samples.append((t, total))
        self.pss_samples.append((t, total_pss))
        self.cpu_samples.append((t, sum(cpu_seconds(pid) for pid in self.pids)))
        return total

    def start_cpu(self) -> None:
        self.refresh()
        self._cpu_start = {pid: cpu_seconds(pid) for pid in self.pids}

    def cpu_since_start(self) -> float:
        self.refresh()
        self.cpu_per_process = {pid: cpu_seconds(pid) - self._cpu_start.get(pid, 0.0) for pid in self.pids}
        return sum(self.cpu_per_process.values())


# -- one load run ---------------------------------------------------------------------------------

def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (``nan`` when empty)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q * len(sorted_values)))
    return float(sorted_values[min(len(sorted_values), rank) - 1])


def window_rates(per_second: dict[int, int], seconds: int, window: int = 10) -> list[float]:
    """Acknowledged reports/s in consecutive ``window``-second windows of ``[0, seconds)`` (full ones only)."""
    return [sum(per_second.get(s, 0) for s in range(w, w + window)) / window
            for w in range(0, seconds - window + 1, window)]


@dataclass
class LoadRun:
    """The merged outcome of the client processes plus the server samples of one run."""

    rate: float
    duration: float
    clients: list[ClientResult]
    seconds: float  # from t0 to the last client's end
    rss: ServerSampler
    server_cpu_s: float
    campaign_id: str
    round: int
    database: ServerSampler | None = None  # the PostgreSQL server's processes, when sampled
    database_cpu_s: float = math.nan

    def total(self, name: str) -> int:
        return int(sum(getattr(c, name) for c in self.clients))

    @property
    def acknowledged(self) -> int:
        return self.total("accepted") + self.total("duplicates")

    @property
    def offered(self) -> int:
        return self.total("reports_sent")

    @property
    def latencies(self) -> list[float]:
        return sorted(x for c in self.clients for x in c.latencies)

    @property
    def per_second(self) -> dict[int, int]:
        merged = collections.Counter[int]()
        for c in self.clients:
            merged.update(c.acked_per_second)
        return dict(merged)

    def window_p99_ms(self, window: int = 10) -> list[float]:
        """p99 latency (ms) of the requests scheduled in each ``window``-second window of the send period."""
        by_window: dict[int, list[float]] = collections.defaultdict(list)
        for c in self.clients:
            for t, latency in zip(c.scheduled, c.latencies):
                by_window[int(t // window)].append(latency)
        return [percentile(sorted(by_window.get(w, [])), 0.99) * 1e3
                for w in range(max(1, math.ceil(self.duration / window)))]

    def summary(self) -> dict[str, Any]:
        lat = self.latencies
        windows = window_rates(self.per_second, int(self.duration))
        statuses = collections.Counter[str]()
        for c in self.clients:
            statuses.update(c.statuses)
        client_cpu = sum(c.cpu_s for c in self.clients)
        acked = self.acknowledged
        rss_sum = max((total for _, total in self.rss.samples), default=0)
        return {
            "offered_rate": self.offered / self.duration,
            "target_rate": self.rate,
            # Over the send period, or longer when the answers took longer than it (a server behind).
            "acknowledged_rate": acked / max(self.duration, self.seconds),
            "acknowledged_rate_send_period": sum(self.per_second.get(s, 0) for s in range(int(self.duration)))
            / max(1, int(self.duration)),
            "window_rate_min": min(windows) if windows else math.nan,
            "window_rate_median": statistics.median(windows) if windows else math.nan,
            "window_rates": windows,
            "window_p99_ms": self.window_p99_ms(),
            "requests": self.total("requests"),
            "answered_requests": self.total("answered"),
            "reports_offered": self.offered,
            "accepted": self.total("accepted"),
            "duplicates_answered": self.total("duplicates"),
            "rejected": self.total("rejected"),
            "latency_ms": {name: percentile(lat, q) * 1e3 for name, q in
                           (("p50", 0.50), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))},
            "server_rss_mib_max_total": rss_sum / _MIB,
            "server_pss_mib_max_total": max((total for _, total in self.rss.pss_samples), default=0) / _MIB,
            "server_rss_mib_max_per_process": {str(pid): v / _MIB for pid, v in self.rss.max_rss.items()},
            "server_rss_mib_max_process": max(self.rss.max_rss.values(), default=0) / _MIB,
            "server_processes": len(self.rss.max_rss),
            "server_cpu_s": self.server_cpu_s,
            "server_cpu_s_per_process": {str(pid): v for pid, v in self.rss.cpu_per_process.items()},
            "database_cpu_s": self.database_cpu_s,
            "database_rss_mib_max_total": (max((t for _, t in self.database.samples), default=0) / _MIB
                                           if self.database is not None else math.nan),
            "database_pss_mib_max_total": (max((t for _, t in self.database.pss_samples), default=0) / _MIB
                                           if self.database is not None else math.nan),
            "client_cpu_s": client_cpu,
            "server_cpu_us_per_report": self.server_cpu_s / acked * 1e6 if acked else math.nan,
            "client_cpu_us_per_report": client_cpu / acked * 1e6 if acked else math.nan,
            "errors_by_status": dict(statuses),
            "retries": self.total("retries"),
            "retried_requests": self.total("retried_requests"),
            "late_sends": self.total("late_sends"),
            "failed_requests": self.total("failed_requests"),
            "unresolved_requests": self.total("unresolved_requests"),
            "unresolved_reports": self.total("unresolved_reports") + self.total("failed_reports"),
            "client_errors": [c.error for c in self.clients if c.error],
            "seconds": self.seconds,
        }

    def per_minute(self) -> list[dict[str, float]]:
        """Acknowledged rate and server RSS per minute of the send period (the trend as the store grows)."""
        rows = []
        per_second = self.per_second
        for m in range(0, max(1, math.ceil(self.duration / 60))):
            lo, hi = 60 * m, min(60 * (m + 1), int(self.duration))
            if hi <= lo:
                break
            rss = [total for t, total in self.rss.samples if lo <= t < hi]
            acked = sum(per_second.get(second, 0) for second in range(lo, hi))
            cpu = [c for t, c in self.rss.cpu_samples if lo <= t < hi]  # one sample a second
            # Server CPU per report is the trend least disturbed by other load on the machine: the
            # CPU between the minute's first and last samples, per report acknowledged meanwhile.
            cpu_us = math.nan
            if len(cpu) > 1 and acked:
                cpu_us = (cpu[-1] - cpu[0]) / (len(cpu) - 1) * (hi - lo) / acked * 1e6
            rows.append({"minute": m + 1, "acknowledged_rate": acked / (hi - lo), "server_cpu_us_per_report": cpu_us,
                         "rss_mib_mean": statistics.fmean(rss) / _MIB if rss else math.nan,
                         "rss_mib_max": max(rss) / _MIB if rss else math.nan})
        return rows


def run_load(addresses: Sequence[str], campaign_id: str, round: int, server_pids: Sequence[int],
             args: argparse.Namespace, *, rate: float, duration: float, run_tag: str,
             label: str = "", db_pids: Sequence[int] = ()) -> LoadRun:
    """Spawn the clients, release them together, sample the servers every second, collect the results."""
    # "spawn": the parent holds gRPC channels (operator calls), whose threads must not be forked.
    ctx = mp.get_context("spawn")
    out: multiprocessing.queues.Queue[Any] = ctx.Queue()
    go = ctx.Event()
    start_at = ctx.Value("d", 0.0)
    plans = [ClientPlan(index=k, clients=args.clients, address=addresses[k % len(addresses)], campaign_id=campaign_id,
                        rate=rate, batch=args.batch, duration=duration, run_tag=run_tag, pool=args.pool,
                        seed=args.seed + k, domain=args.domain, max_in_flight=args.max_in_flight,
                        channels=args.channels,
                        request_timeout=args.request_timeout, drain_timeout=args.drain_timeout,
                        max_attempts=args.max_attempts, random_ids=args.random_ids)
             for k in range(args.clients)]
    readies = [ctx.Event() for _ in plans]
    procs = [ctx.Process(target=_client_main, args=(plan, start_at, ready, go, out), daemon=True)
             for plan, ready in zip(plans, readies)]
    for p in procs:
        p.start()
    for ready, p in zip(readies, procs):
        while not ready.wait(timeout=1.0):
            if not p.is_alive():
                raise RuntimeError("a client process died while preparing its reports")
    sampler = ServerSampler(server_pids)
    database = ServerSampler(db_pids)
    t0 = time.monotonic() + 0.5
    start_at.value = t0
    sampler.start_cpu()
    database.start_cpu()
    go.set()

    results: dict[int, ClientResult] = {}
    acked_now: dict[int, int] = {}
    in_flight: dict[int, int] = {}
    last_print, last_acked, next_sample = t0, 0, t0
    server_cpu = database_cpu = math.nan
    while len(results) < len(procs):
        now = time.monotonic()
        if now >= next_sample:
            if int(now - t0) % 5 == 0:
                sampler.refresh()
                database.refresh()
            rss = sampler.sample(now - t0)
            database.sample(now - t0)
            next_sample += 1.0
            if now - last_print >= 10.0:
                acked = sum(acked_now.values())
                print(f"  {label}t={now - t0:5.0f} s  acknowledged {acked:>11,}  last 10 s "
                      f"{(acked - last_acked) / (now - last_print):>9,.0f} reports/s  in flight "
                      f"{sum(in_flight.values()):>4}  server RSS {rss / _MIB:7.1f} MiB", flush=True)
                last_print, last_acked = now, acked
        if math.isnan(server_cpu) and now >= t0 + duration + 0.2:
            server_cpu = sampler.cpu_since_start()  # the send period; the drain adds little
            database_cpu = database.cpu_since_start()
        try:
            message = out.get(timeout=max(0.01, min(0.5, next_sample - time.monotonic())))
        except queue.Empty:
            if any(not p.is_alive() and p.exitcode not in (0, None) for p in procs) and out.empty():
                raise RuntimeError("a client process died") from None
            continue
        if message[0] == "progress":
            _, index, acked_total, pending = message
            acked_now[index], in_flight[index] = acked_total, pending
        else:
            results[message[1]] = message[2]
    seconds = time.monotonic() - t0
    if math.isnan(server_cpu):
        server_cpu = sampler.cpu_since_start()
        database_cpu = database.cpu_since_start()
    for p in procs:
        p.join(timeout=30)
    return LoadRun(rate=rate, duration=duration, clients=[results[k] for k in sorted(results)], seconds=seconds,
                   rss=sampler, server_cpu_s=server_cpu, campaign_id=campaign_id, round=round,
                   database=database if db_pids else None, database_cpu_s=database_cpu if db_pids else math.nan)


# -- the loss check -------------------------------------------------------------------------------

def check_store(location: str, campaign_id: str, round: int) -> dict[str, Any]:
    """Open the store after the servers stopped: count, digest and distinct ids of the round's reports."""
    import numpy as np

    from ldp_collector.storage import open_store

    t0 = time.perf_counter()
    store = open_store(location)
    try:
        counted = store.count_reports(campaign_id, round)
        rows, digest, prefixes = 0, 0, []
        for batch in store.iter_reports(campaign_id, round):
            ids = b"".join(r.report_id for r in batch)
            rows += len(batch)
            digest += id_digest(ids)
            # The first 8 bytes of each random id: distinct unless two ids share them (p ~ n^2 / 2^65).
            prefixes.append(np.frombuffer(ids, dtype=">u8").reshape(-1, 2)[:, 0].copy())
        keys = np.sort(np.concatenate(prefixes)) if prefixes else np.zeros(0, dtype=np.uint64)
        shared = np.unique(keys[1:][keys[1:] == keys[:-1]])
        duplicates = 0
        if shared.size:  # rare: compare the full ids of the reports whose prefixes collide
            suspects = set(int(x) for x in shared)
            seen: collections.Counter[bytes] = collections.Counter()
            for batch in store.iter_reports(campaign_id, round):
                seen.update(r.report_id for r in batch if int.from_bytes(r.report_id[:8], "big") in suspects)
            duplicates = sum(n - 1 for n in seen.values())
    finally:
        store.close()
    return {"stored_count": counted, "stored_rows": rows, "stored_digest": digest, "duplicates": duplicates,
            "check_seconds": time.perf_counter() - t0}


def loss_check(run: LoadRun, stored: dict[str, Any], api_count: int | None) -> dict[str, Any]:
    acked = run.acknowledged
    unresolved = run.total("unresolved_reports") + run.total("failed_reports")
    digest = sum(c.digest for c in run.clients)
    rows = stored["stored_rows"]
    exact = unresolved == 0
    ok = (stored["duplicates"] == 0 and stored["stored_count"] == rows
          and (rows == acked and stored["stored_digest"] == digest if exact else acked <= rows <= acked + unresolved))
    return {"acknowledged": acked, "stored": rows, "stored_count_column": stored["stored_count"],
            "api_count": api_count, "lost": max(0, acked - rows), "duplicates": stored["duplicates"],
            "unresolved_reports": unresolved, "digest_match": stored["stored_digest"] == digest,
            "check_seconds": stored["check_seconds"], "passed": bool(ok)}


# -- topologies -----------------------------------------------------------------------------------

@contextmanager
def postgres_location(args: argparse.Namespace, workdir: Path) -> Iterator[tuple[str, list[int]]]:
    """The PostgreSQL URL to use and, for a server this script started, its postmaster's pid (its
    CPU and memory are reported beside the collectors'): ``--postgres-url``, else a throw-away
    server started (and stopped) with the test support's helpers (``tests/support/postgres.py``,
    which also honours ``LDP_TEST_POSTGRES_URL``)."""
    if args.postgres_url:
        yield args.postgres_url, []
        return
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from support import postgres  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        raise SystemExit(f"--topology pg2 needs --postgres-url, or tests/support/postgres.py (and pytest) to start "
                         f"a server: {exc}") from None
    given = os.environ.get(postgres.URL_ENV)
    if given:
        yield given, []
        return
    bin_dir = postgres.find_postgres_bin()
    if bin_dir is None:
        raise SystemExit(f"--topology pg2 needs --postgres-url or a local PostgreSQL: {postgres.INSTALL_HINT}")
    root = Path(tempfile.mkdtemp(prefix="ldp-load-pg-"))
    try:
        server = postgres._start(bin_dir, root)
        print(f"# started PostgreSQL at {server.url} (data under {root})", flush=True)
        try:
            data_dir = Path(server.data_dir) if server.data_dir is not None else root / "data"
            postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
            yield str(server.url), [postmaster]
        finally:
            postgres._stop(bin_dir, server)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def store_location(args: argparse.Namespace, workdir: Path) -> Iterator[tuple[str, list[int]]]:
    """The store the topology's collectors share (an SQLite directory, or a PostgreSQL URL) and the
    pids of the database server processes to sample (none for SQLite: it runs inside the collector)."""
    if args.topology == "pg2":
        with postgres_location(args, workdir) as (url, pids):
            yield url, pids
    else:
        yield str(workdir / "store"), []


@contextmanager
def servers(args: argparse.Namespace, workdir: Path, store: str) -> Iterator[list[ServerProcess]]:
    """Start the topology's server processes over ``store``; stop them (gracefully) on exit."""
    if args.topology == "pg2":
        names_workers = [("collector-a", 1), ("collector-b", 1)]
    else:
        names_workers = [("collector", 2 if args.topology == "workers2" else 1)]
    started: list[ServerProcess] = []
    try:
        for name, workers in names_workers:
            started.append(start_collector(name, workdir, store, workers=workers, batch=args.batch,
                                           options=args.server_option))
        for server in started:
            wait_serving(server)
        yield started
    finally:
        for server in started:
            status = stop_collector(server)
            if status not in (0, -signal.SIGTERM):
                print(f"# {server.name} exited with status {status}; log tail:\n{server.log_tail()}",
                      file=sys.stderr)


def new_campaign(address: str, args: argparse.Namespace) -> tuple[str, int]:
    with grpc.insecure_channel(address) as channel:
        operator = service_pb2_grpc.OperatorServiceStub(channel)
        campaign_id = create_campaign(operator, args.domain, args.epsilon, args.oracle)
        spec = round_spec(channel, campaign_id)
    return campaign_id, spec.round


def api_report_count(address: str, campaign_id: str, round: int) -> int | None:
    with grpc.insecure_channel(address) as channel:
        operator = service_pb2_grpc.OperatorServiceStub(channel)
        campaign = operator.GetCampaign(service_pb2.GetCampaignRequest(campaign_id=campaign_id), metadata=AUTH,
                                        timeout=60)
    return next((int(r.reports) for r in campaign.rounds if r.round == round), None)


# -- reporting ------------------------------------------------------------------------------------

def environment() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()[0], "python": sys.version.split()[0],
            "grpcio": grpc.__version__, "collector_command": " ".join(Path(c).name if os.path.isabs(c) else c for c in collector_command()),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def print_summary(s: dict[str, Any], loss: dict[str, Any] | None) -> None:
    lat = s["latency_ms"]
    print(f"offered        {s['offered_rate']:>10,.0f} reports/s ({s['reports_offered']:,} reports, "
          f"{s['requests']:,} requests)")
    windows = (f"per 10-s window min {s['window_rate_min']:,.0f}, median {s['window_rate_median']:,.0f}"
               if s["window_rates"] else "no full 10-s window")
    print(f"acknowledged   {s['acknowledged_rate']:>10,.0f} reports/s ({s['accepted']:,} accepted, "
          f"{s['duplicates_answered']:,} duplicate, {s['rejected']:,} rejected; last answer after "
          f"{s['seconds']:.1f} s); {windows}")
    print(f"latency        p50 {lat['p50']:.1f} ms, p95 {lat['p95']:.1f} ms, p99 {lat['p99']:.1f} ms, "
          f"max {lat['max']:.1f} ms (per request of a batch, from its scheduled send time)")
    print("p99 per 10 s   " + ", ".join("n/a" if math.isnan(x) else f"{x:.0f}" for x in s["window_p99_ms"]) + " ms")
    print(f"server RSS     max total {s['server_rss_mib_max_total']:.1f} MiB, max per process "
          f"{s['server_rss_mib_max_process']:.1f} MiB ({s['server_processes']} processes; VmRSS summed counts "
          f"pages shared after fork once per process: PSS max total {s['server_pss_mib_max_total']:.1f} MiB)")
    print(f"CPU            server {s['server_cpu_s']:.1f} s ({s['server_cpu_us_per_report']:.1f} us/report), "
          f"clients {s['client_cpu_s']:.1f} s ({s['client_cpu_us_per_report']:.1f} us/report)")
    if len(s["server_cpu_s_per_process"]) > 1:
        print("               server CPU per process: " + ", ".join(
            f"pid {pid} {cpu:.1f} s" for pid, cpu in s["server_cpu_s_per_process"].items()))
    if math.isfinite(s["database_cpu_s"]):
        print(f"PostgreSQL     CPU {s['database_cpu_s']:.1f} s, RSS max total "
              f"{s['database_rss_mib_max_total']:.1f} MiB, PSS max total {s['database_pss_mib_max_total']:.1f} MiB "
              "(its processes, beside the collectors')")
    print(f"errors         {s['errors_by_status'] or 'none'}; retries {s['retries']} ({s['retried_requests']} "
          f"requests); late sends {s['late_sends']}; failed requests {s['failed_requests']}; "
          f"unresolved requests {s['unresolved_requests']}")
    for error in s["client_errors"]:
        print(f"client error   {error}")
    if loss is not None:
        print(f"loss check     stored {loss['stored']:,} vs acknowledged {loss['acknowledged']:,}: lost "
              f"{loss['lost']}, duplicates {loss['duplicates']}, "
              f"digest {'equal' if loss['digest_match'] else 'DIFFERENT'}"
              f"{', API count ' + format(loss['api_count'], ',') if loss['api_count'] is not None else ''} -> "
              f"{'PASS' if loss['passed'] else 'FAIL'} (checked in {loss['check_seconds']:.1f} s)")


MARKDOWN_HEADER = (
    "| date | topology | mode | s | clients | batch | offered/s | acked/s | 10-s window min / median | "
    "p50 / p95 / p99 / max ms | RSS max total / per process MiB | server CPU µs/report | client CPU µs/report | "
    "errors | loss check |\n"
    "|---|---|---|---:|---:|---:|---:|---:|---|---|---|---:|---:|---|---|\n")


def _n(value: float | None, spec: str = ",.0f") -> str:
    """A number for the table; ``—`` for a missing or undefined one."""
    return "—" if value is None or not math.isfinite(value) else format(value, spec)


def markdown_row(record: dict[str, Any]) -> str:
    s, loss, a = record["summary"], record.get("loss_check"), record["arguments"]
    lat = s["latency_ms"]
    errors = ", ".join(f"{k} {v}" for k, v in sorted(s["errors_by_status"].items())) or "0"
    check = ("—" if loss is None else
             f"{'pass' if loss['passed'] else 'FAIL'}: {loss['stored']:,} stored = {loss['acknowledged']:,} acked, "
             f"dup {loss['duplicates']}")
    mode = f"capacity {record['capacity_rate']:,.0f}/s" if record["mode"] == "capacity" else "sustained"
    seconds = a["step_duration"] if record["mode"] == "capacity" else a["duration"]
    return (f"| {record['environment']['date']} (load {record['environment']['load_average_at_start']:.1f}) | "
            f"{a['topology']} | {mode} | {seconds:.0f} | {a['clients']} | "
            f"{a['batch']} | {_n(s['offered_rate'])} | {_n(s['acknowledged_rate'])} | "
            f"{_n(s['window_rate_min'])} / {_n(s['window_rate_median'])} | "
            f"{_n(lat['p50'])} / {_n(lat['p95'])} / {_n(lat['p99'])} / {_n(lat['max'])} | "
            f"{_n(s['server_rss_mib_max_total'])} / {_n(s['server_rss_mib_max_process'])} | "
            f"{_n(s['server_cpu_us_per_report'], '.1f')} | {_n(s['client_cpu_us_per_report'], '.1f')} | {errors} | "
            f"{check} |\n")


def write_results(out: Path, name: str, record: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(_finite(record), indent=1, default=_json_default) + "\n")
    table = out / "load_runs.md"
    if not table.exists():
        table.write_text("# Load runs (`benchmarks/load.py`)\n\nOne row per run; the JSON files hold every "
                         "figure. Latency is per request of a batch, from its scheduled send time.\n\n"
                         + MARKDOWN_HEADER)
    with table.open("a") as f:
        f.write(markdown_row(record))
    return path


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by ``None`` (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"cannot serialize {type(value).__name__}")


# -- modes ----------------------------------------------------------------------------------------

def sustained(args: argparse.Namespace, workdir: Path, run_tag: str) -> tuple[dict[str, Any], bool]:
    with store_location(args, workdir) as (store, db_pids):
        with servers(args, workdir, store) as started:
            addresses = [server.address for server in started]
            campaign_id, round = new_campaign(addresses[0], args)
            print(f"# campaign {campaign_id} round {round} on {', '.join(addresses)} ({args.topology}), store "
                  f"{store}; {args.clients} clients at {args.rate:,.0f} reports/s for {args.duration:.0f} s",
                  flush=True)
            run = run_load(addresses, campaign_id, round, [server.process.pid for server in started], args,
                           rate=args.rate, duration=args.duration, run_tag=run_tag, db_pids=db_pids)
            api_count = api_report_count(addresses[-1], campaign_id, round)
        # After the collectors stopped: what is durably stored, read by a fresh store object.
        stored = check_store(store, campaign_id, round) if args.verify else None
    summary = run.summary()
    loss = loss_check(run, stored, api_count) if stored is not None else None
    print_summary(summary, loss)
    trend = run.per_minute()
    if len(trend) > 1:
        print("per minute     " + "; ".join(f"{r['minute']}: {r['acknowledged_rate']:,.0f}/s, RSS "
                                            f"{r['rss_mib_max']:.0f} MiB, server CPU "
                                            f"{r['server_cpu_us_per_report']:.1f} us/report" for r in trend))
    ok = (loss is None or loss["passed"]) and summary["failed_requests"] == 0 and not summary["client_errors"]
    if args.max_p99_ms and not summary["latency_ms"]["p99"] < args.max_p99_ms:
        print(f"FAIL: p99 {summary['latency_ms']['p99']:.1f} ms >= {args.max_p99_ms} ms")
        ok = False
    if args.max_rss_mib and not summary["server_rss_mib_max_total"] < args.max_rss_mib:
        print(f"FAIL: server RSS {summary['server_rss_mib_max_total']:.1f} MiB >= {args.max_rss_mib} MiB")
        ok = False
    record = {"mode": "sustained", "summary": summary, "loss_check": loss, "per_minute": trend,
              "campaign_id": campaign_id, "passed": ok}
    return record, ok


def find_capacity(args: argparse.Namespace, workdir: Path, run_tag: str) -> tuple[dict[str, Any], bool]:
    steps: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    upward = True
    with store_location(args, workdir) as (store, db_pids), servers(args, workdir, store) as started:
        addresses = [server.address for server in started]
        rate = args.rate
        for step in range(args.max_steps):
            campaign_id, round = new_campaign(addresses[0], args)
            print(f"# step {step + 1}: {rate:,.0f} reports/s for {args.step_duration:.0f} s", flush=True)
            run = run_load(addresses, campaign_id, round, [server.process.pid for server in started], args,
                           rate=rate, duration=args.step_duration, run_tag=f"{run_tag[:5]}s{step:02d}",
                           label=f"[{rate:,.0f}/s] ", db_pids=db_pids)
            s = run.summary()
            api_count = api_report_count(addresses[0], campaign_id, round)
            p99 = s["latency_ms"]["p99"]
            share = run.acknowledged / run.offered if run.offered else 0.0
            # The API's stored count must match what was acknowledged (no unresolved requests here).
            consistent = api_count == run.acknowledged or s["unresolved_reports"] > 0
            passed = (p99 < args.target_p99_ms and share >= CAPACITY_MIN_ACK_SHARE and s["failed_requests"] == 0
                      and s["unresolved_requests"] == 0 and consistent)
            steps.append({"rate": rate, "passed": passed, "api_count": api_count, "summary": s})
            print(f"  -> acknowledged {s['acknowledged_rate']:,.0f}/s ({share:.1%} of offered), p99 {p99:.0f} ms "
                  f"(per 10 s: {', '.join(f'{x:.0f}' for x in s['window_p99_ms'])}), "
                  f"RSS {s['server_rss_mib_max_total']:.0f} MiB, errors {s['errors_by_status'] or 'none'}, "
                  f"stored (API) {api_count} -> {'pass' if passed else 'FAIL'}", flush=True)
            if not consistent:
                print(f"  !! the API counts {api_count} stored reports, {run.acknowledged} were acknowledged")
            if passed and (best is None or rate > best["rate"]):
                best = steps[-1]
            if step == 0:
                upward = passed  # up until a step fails, or down until one passes
            if passed != upward:
                break
            rate = rate * args.ramp_factor if upward else rate / args.ramp_factor
            time.sleep(2.0)  # let the server settle (checkpoints, freed memory) between steps
    capacity = best["rate"] if best else 0.0
    print(f"capacity (highest rate with p99 < {args.target_p99_ms:g} ms and >= {CAPACITY_MIN_ACK_SHARE:.0%} "
          f"acknowledged): {capacity:,.0f} reports/s" if best else
          f"no step passed ({args.max_steps} steps down from {args.rate:,.0f} reports/s); start lower")
    record = {"mode": "capacity", "capacity_rate": capacity, "steps": steps,
              "summary": (best or steps[-1])["summary"], "loss_check": None, "passed": best is not None}
    return record, best is not None


# -- main -----------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", choices=TOPOLOGIES, default="single")
    parser.add_argument("--rate", type=float, default=50_000.0,
                        help="aggregate offered reports/s (default 50000); the first step of --find-capacity")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of sends (default 600)")
    parser.add_argument("--clients", type=int, default=2, help="client processes (default 2)")
    parser.add_argument("--batch", type=int, default=1000, help="reports per SubmitPacked request (default 1000)")
    parser.add_argument("--random-ids", action="store_true",
                        help="16 random bytes per report id instead of the SDK's time-prefixed ids")
    parser.add_argument("--pool", type=int, default=20_000, help="SDK-randomized reports per client (default 20000)")
    parser.add_argument("--oracle", choices=sorted(ORACLES), default="grr")
    parser.add_argument("--domain", type=int, default=64, help="categorical domain size (default 64)")
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--max-in-flight", type=int, default=256,
                        help="requests a client holds at once, sent or awaiting a retry (default 256)")
    parser.add_argument("--channels", type=int, default=4,
                        help="gRPC connections per client, used in turn (default 4): SO_REUSEPORT spreads "
                             "connections over worker processes")
    parser.add_argument("--request-timeout", type=float, default=30.0, help="deadline of one attempt, s (default 30)")
    parser.add_argument("--max-attempts", type=int, default=100, help="attempts per request (default 100)")
    parser.add_argument("--drain-timeout", type=float, default=120.0,
                        help="seconds after the send period to wait for answers and retries (default 120)")
    parser.add_argument("--postgres-url", default="", help="pg2: the database the two collectors share")
    parser.add_argument("--server-option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra collector configuration (TOML value), repeatable, e.g. max_queued_calls=64")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="skip opening the store after the run (the loss check)")
    parser.add_argument("--max-p99-ms", type=float, default=0.0, help="fail when p99 latency is not below this")
    parser.add_argument("--max-rss-mib", type=float, default=0.0, help="fail when the servers' total RSS is not below")
    parser.add_argument("--find-capacity", action="store_true", help="ramp the rate to find the capacity")
    parser.add_argument("--target-p99-ms", type=float, default=200.0, help="capacity criterion (default 200)")
    parser.add_argument("--step-duration", type=float, default=20.0, help="seconds per capacity step (default 20)")
    parser.add_argument("--ramp-factor", type=float, default=1.2, help="rate multiplier per step (default 1.2)")
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", default="", help="where stores and logs go (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="results directory (default benchmarks/results)")
    parser.add_argument("--name", default="", help="results file name without .json (default from the options)")
    return parser


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name, low in (("rate", 1.0), ("duration", 1.0), ("step_duration", 1.0), ("request_timeout", 0.1),
                      ("drain_timeout", 0.0)):
        value = getattr(args, name)
        if not (math.isfinite(value) and value >= low):
            parser.error(f"--{name.replace('_', '-')} must be >= {low:g}, got {value:g}")
    for name, low in (("clients", 1), ("channels", 1), ("batch", 1), ("max_in_flight", 1), ("max_attempts", 1),
                      ("max_steps", 1), ("domain", 2)):
        if getattr(args, name) < low:
            parser.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
    if args.pool < args.batch:
        parser.error(f"--pool must be at least --batch ({args.batch}), got {args.pool}")
    if args.ramp_factor <= 1.0:
        parser.error(f"--ramp-factor must be > 1, got {args.ramp_factor:g}")
    duration = args.step_duration if args.find_capacity else args.duration
    if args.batch * args.clients / args.rate > duration:
        parser.error(f"at {args.rate:g} reports/s in batches of {args.batch} from {args.clients} clients, a client "
                     f"sends less than one request in {duration:g} s; raise --rate or --duration")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ldp-load-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run_tag = os.urandom(4).hex()
    env = environment()
    print(f"# load test: {env['cpus']} CPUs (load average {env['load_average_at_start']:.2f}), Python "
          f"{env['python']}, grpcio {env['grpcio']}; server: {env['collector_command']} serve; workdir {workdir}",
          flush=True)
    try:
        if args.find_capacity:
            record, ok = find_capacity(args, workdir, run_tag)
        else:
            record, ok = sustained(args, workdir, run_tag)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    record["arguments"] = {**vars(args), "out": os.path.relpath(args.out)}  # no machine paths in results
    record["environment"] = {**env, "load_average_at_end": os.getloadavg()[0]}
    name = args.name or (f"load_{args.topology}_capacity" if args.find_capacity
                         else f"load_{args.topology}_{args.duration:.0f}s")
    path = write_results(Path(args.out), name, record)
    print(f"# results: {path} and {path.parent / 'load_runs.md'}; {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
