"""``ldp-collector serve --workers N``: real worker processes sharing one port on 127.0.0.1.

Both workers serve calls (each worker's own metrics endpoint counts them), every acknowledged
report is stored exactly once in the shared SQLite store, a SIGKILLed worker is replaced and the
service keeps answering, SIGTERM drains every worker and exits 0, and a port that is already
taken ends the supervisor with exit code 1 and a clear message instead of a restart loop.
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ldp.v1 import campaigns_pb2, service_pb2, service_pb2_grpc
from ldp_client import serde
from ldp_client.report import Report, pack_batch
from ldp_client.rng import SeededRng
from ldp_collector.storage import open_store

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
WORKERS = 2
CHANNELS = 24
BATCH = 50
START_TIMEOUT_S = 60.0


def _env() -> dict[str, str]:
    paths = [str(REPO / "packages" / p / "src") for p in ("ldp-client", "ldp-proto", "ldp-collector")]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    for key in [k for k in env if k.startswith("LDP_")]:
        del env[key]
    return env


def _free_port_pair() -> int:
    """A port p with p and p + 1 free on 127.0.0.1 (the two workers' metrics endpoints), below the
    kernel's ephemeral range so no outgoing connection can take it before the workers bind it."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20_000, 32_000)
        sockets = []
        try:
            for p in (port, port + 1):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no two consecutive free ports found")


class Supervised:
    """A ``serve --workers N`` process and its JSON log lines (read by a background thread)."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ldp_collector.cli", "serve", "--data-dir", str(tmp / "data"),
             "--log-format", "json", *args],
            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.records: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_for(self, predicate: Any, timeout: float = START_TIMEOUT_S) -> dict[str, Any]:
        """The first JSON log record so far, or to come, satisfying ``predicate``."""
        for record in self.records:
            if predicate(record):
                return record
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            try:
                record = json.loads(line)
            except ValueError:
                continue
            self.records.append(record)
            if predicate(record):
                return record  # type: ignore[no-any-return]
        raise AssertionError("log record not seen; output so far:\n" + "".join(self.seen))

    def drain_output(self) -> str:
        self._reader.join(timeout=10)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return "".join(self.seen)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[tuple[Supervised, int]]:
    metrics_port = _free_port_pair()
    sup = Supervised(tmp_path, "--listen", "127.0.0.1:0", "--workers", str(WORKERS),
                     "--metrics-port", str(metrics_port))
    try:
        yield sup, metrics_port
    finally:
        if sup.proc.poll() is None:
            sup.proc.kill()
            sup.proc.wait()


def _channel(address: str) -> grpc.Channel:
    # A channel of its own (not the process-wide subchannel pool): its own TCP connection, which the
    # kernel's SO_REUSEPORT hash assigns to one of the workers.
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def _create_campaign(address: str) -> service_pb2.GetRoundSpecResponse:
    config = campaigns_pb2.CampaignConfig(
        kind=campaigns_pb2.HISTOGRAM, domain=campaigns_pb2.Domain(categorical_size=4), epsilon=2.0,
        histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.GRR))
    with _channel(address) as channel:
        campaign = service_pb2_grpc.OperatorServiceStub(channel).CreateCampaign(
            service_pb2.CreateCampaignRequest(config=config), timeout=30)
        spec: service_pb2.GetRoundSpecResponse = service_pb2_grpc.DeviceServiceStub(channel).GetRoundSpec(
            service_pb2.GetRoundSpecRequest(campaign_id=campaign.config.campaign_id), timeout=30)
    return spec


def _reports(spec_response: service_pb2.GetRoundSpecResponse, n: int, seed: int) -> list[Report]:
    spec = serde.round_spec_from_proto(spec_response.spec)
    rng = SeededRng(seed)
    task = spec.tasks[0]
    return [Report(report_id=rng.token_bytes(16), campaign_id=spec.campaign_id, round=spec.round,
                   group=task.groups[0], payloads=tuple(c.run(i % 4, rng=rng) for c in task.components))
            for i in range(n)]


def _submit_everywhere(address: str, spec: service_pb2.GetRoundSpecResponse, seed: int) -> set[bytes]:
    """One packed batch on each of CHANNELS fresh connections; the acknowledged report ids."""
    acknowledged: set[bytes] = set()
    for c in range(CHANNELS):
        batch = _reports(spec, BATCH, seed=seed * 1000 + c)
        request_id = f"batch-{seed}-{c}"
        with _channel(address) as channel:
            response = service_pb2_grpc.DeviceServiceStub(channel).SubmitPacked(
                service_pb2.SubmitPackedRequest(request_id=request_id, packed=pack_batch(request_id, batch)),
                timeout=30)
        assert response.accepted == BATCH, response
        acknowledged.update(r.report_id for r in batch)
    return acknowledged


def _submits_served(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    match = re.search(r'^ldp_rpcs_total\{code="OK",method="DeviceService/SubmitPacked"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def test_workers_share_the_port_restart_and_drain(supervised: tuple[Supervised, int], tmp_path: Path) -> None:
    sup, metrics_port = supervised
    started = sup.wait_for(lambda r: r.get("msg") == "collector workers started")
    address, pids = started["listen"], started["pids"]
    assert len(set(pids)) == WORKERS
    for pid in pids:
        sup.wait_for(lambda r, pid=pid: r.get("msg") == "collector listening" and r.get("pid") == pid)

    spec = _create_campaign(address)
    acknowledged = _submit_everywhere(address, spec, seed=1)
    served = [_submits_served(metrics_port + i) for i in range(WORKERS)]
    # Each connection lands on worker i with probability 1/2: all 24 on one worker has probability 2^-23.
    assert all(s > 0 for s in served) and sum(served) == CHANNELS, served

    # A worker killed outright is replaced, and the service keeps answering.
    os.kill(pids[1], signal.SIGKILL)
    sup.wait_for(lambda r: r.get("msg", "").startswith("worker was killed by SIGKILL") and r.get("worker") == 1)
    replaced = sup.wait_for(lambda r: r.get("msg") == "worker started" and r.get("worker") == 1
                            and r.get("pid") not in pids)
    sup.wait_for(lambda r: r.get("msg") == "collector listening" and r.get("pid") == replaced["pid"])
    acknowledged |= _submit_everywhere(address, spec, seed=2)
    assert _submits_served(metrics_port + 1) > 0  # the new worker 1 serves on the same metrics port

    assert sup.stop() == 0
    output = sup.drain_output()
    assert output.count('"msg":"collector stopped"') == WORKERS, output
    assert "collector workers stopped" in output

    store = open_store(str(tmp_path / "data"))
    try:
        campaign_id = spec.spec.campaign_id
        assert store.count_reports(campaign_id, 1) == len(acknowledged) == 2 * CHANNELS * BATCH
        stored: list[bytes] = [r.report_id for chunk in store.iter_reports(campaign_id, 1) for r in chunk]
    finally:
        store.close()
    assert len(stored) == len(set(stored)) and set(stored) == acknowledged


def _exit_code(sup: Supervised) -> int:
    """The supervisor's exit code (it must stop by itself within the start timeout; killed otherwise)."""
    try:
        return sup.proc.wait(timeout=START_TIMEOUT_S)
    finally:
        if sup.proc.poll() is None:
            sup.proc.kill()
            sup.proc.wait()


def test_port_in_use_ends_with_one_line_before_any_worker_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:  # no SO_REUSEPORT: nobody else may bind this port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sup = Supervised(tmp_path, "--listen", f"127.0.0.1:{port}", "--workers", str(WORKERS))
        code = _exit_code(sup)
    output = sup.drain_output()
    assert code == 1, output
    # The supervisor binds the port itself first (and holds it for restarts): no worker is forked.
    assert output.strip().splitlines() == [
        f"ldp-collector: error: cannot listen on 127.0.0.1:{port}: address already in use "
        "(another process is listening on that port)"], output


def test_a_worker_that_fails_before_serving_stops_everything(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    database = tmp_path / "data" / "collector.sqlite3"
    database.write_text("not a database\n" * 100)
    sup = Supervised(tmp_path, "--listen", "127.0.0.1:0", "--workers", str(WORKERS))
    code = _exit_code(sup)
    output = sup.drain_output()
    assert code == 1, output
    assert f"worker 0: cannot open the report store {str(database)!r}: file is not a database" in output
    assert output.rstrip().splitlines()[-1].startswith("ldp-collector: error: worker 0 exited with code 1 before serving")
    assert output.count('"msg":"worker started"') == 1, "the supervisor must not start the others or retry"


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_workers_stop_when_the_supervisor_is_killed(tmp_path: Path) -> None:
    sup = Supervised(tmp_path, "--listen", "127.0.0.1:0", "--workers", str(WORKERS))
    try:
        pids = sup.wait_for(lambda r: r.get("msg") == "collector workers started")["pids"]
        for pid in pids:
            sup.wait_for(lambda r, pid=pid: r.get("msg") == "collector listening" and r.get("pid") == pid)
        sup.proc.kill()
        sup.proc.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(_gone(pid) for pid in pids):
            time.sleep(0.1)
        assert all(_gone(pid) for pid in pids), "a worker outlived its supervisor"
        output = sup.drain_output()
        # Each worker got SIGTERM from the kernel and drained like on a normal stop.
        assert output.count('"msg":"collector stopped"') == WORKERS, output
    finally:
        if sup.proc.poll() is None:
            sup.proc.kill()
            sup.proc.wait()
