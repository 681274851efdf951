"""A real ``ldp-collector serve`` process for crash tests: started, SIGKILLed and restarted on one store.

``ServerProcess(tmp, store)`` runs ``python -m ldp_collector.cli serve`` on a fixed free loopback
port with ``store`` as its data directory or PostgreSQL URL, the operator token :data:`TOKEN`
(send :data:`AUTH` as metadata), JSON logs at WARNING in ``tmp/logs/server-<n>.log`` (one file per
incarnation) and no ``LDP_*`` variable of the caller's environment. Channels to it should use
:data:`CHANNEL_OPTIONS`, which reconnect within 250 ms after a restart.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ldp_collector.server.wire import DEVICE_SERVICE
from ldp_collector.storage.sqlite import DATABASE_FILE

__all__ = ["AUTH", "CHANNEL_OPTIONS", "READY_TIMEOUT_S", "TOKEN", "ServerProcess", "free_port", "read_round",
           "round_is_open"]

TOKEN = "operator-token-for-crash-tests-0123456789"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
READY_TIMEOUT_S = 30.0
# Reconnect fast after a restart (gRPC's default backoff grows to minutes).
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
                   ("grpc.max_reconnect_backoff_ms", 250)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerProcess:
    """``python -m ldp_collector.cli serve`` on a fixed port and store, restartable."""

    def __init__(self, tmp: Path, store: str) -> None:
        self.store = store  # a data directory or a postgresql:// URL
        self.log_dir = tmp / "logs"
        self.log_dir.mkdir()
        self.cwd = tmp  # no ./ldp-collector.toml of the caller's working directory is read
        self.address = f"127.0.0.1:{free_port()}"
        self.incarnations = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._log = self.log_dir / "server-0.log"
        env = {key: value for key, value in os.environ.items() if not key.startswith("LDP_")}
        env["LDP_OPERATOR_TOKEN"] = TOKEN
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._env = env

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, "the previous server still runs"
        self.incarnations += 1
        self._log = self.log_dir / f"server-{self.incarnations}.log"
        with self._log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ldp_collector.cli", "serve", "--listen", self.address,
                 "--data-dir", self.store, "--log-format", "json", "--log-level", "WARNING"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self._env, cwd=self.cwd)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self._log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_serving(self) -> float:
        """Wait until the health check of the device service says SERVING; the seconds it took."""
        assert self.process is not None
        started = time.monotonic()
        with grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                code = self.process.poll()
                if code is not None:
                    pytest.fail(f"server incarnation {self.incarnations} exited with {code} before serving:\n"
                                f"{self.log_tail()}")
                try:
                    response = health.Check(health_pb2.HealthCheckRequest(service=DEVICE_SERVICE), timeout=0.25,
                                            wait_for_ready=True)
                    if response.status == health_pb2.HealthCheckResponse.SERVING:
                        return time.monotonic() - started
                except grpc.RpcError:
                    pass
                if time.monotonic() - started > READY_TIMEOUT_S:
                    pytest.fail(f"server incarnation {self.incarnations} not SERVING after {READY_TIMEOUT_S} s:\n"
                                f"{self.log_tail()}")
                time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the server and reap it; it must not have exited on its own before."""
        assert self.process is not None
        code = self.process.poll()
        if code is None:
            self.process.send_signal(signal.SIGKILL)
            code = self.process.wait(timeout=30)
        assert code == -signal.SIGKILL, (f"server incarnation {self.incarnations} exited by itself with {code}:\n"
                                         f"{self.log_tail()}")

    def terminate(self) -> int:
        """SIGTERM (graceful shutdown) and the exit code."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def ensure_dead(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


# -- reading a store behind the server's back (read-only, one snapshot) ---------------------------

RoundContents = tuple[list[tuple[int, bytes, int, bytes]], int, int, dict[str, bytes]]


def read_round(store: str, campaign_id: str, round: int) -> RoundContents:
    """Rows (seq, report_id, group, payloads), the round's report_count, the report_ids count and
    the accumulator blobs, from one read-only snapshot of either backend."""
    if store.startswith("postgresql://"):
        return read_postgres_round(store, campaign_id, round)
    conn = sqlite3.connect(f"file:{Path(store) / DATABASE_FILE}?mode=ro", uri=True)
    try:
        conn.execute("BEGIN")  # one snapshot for every query
        rows = conn.execute("SELECT seq, report_id, group_index, payloads FROM reports "
                            "WHERE campaign_id = ? AND round = ? ORDER BY seq", (campaign_id, round)).fetchall()
        count = conn.execute("SELECT report_count FROM rounds WHERE campaign_id = ? AND round = ?",
                             (campaign_id, round)).fetchone()[0]
        ids = conn.execute("SELECT COUNT(*) FROM report_ids").fetchone()[0]
        blobs = dict(conn.execute("SELECT name, data FROM accumulators WHERE campaign_id = ? AND round = ?",
                                  (campaign_id, round)).fetchall())
        conn.execute("COMMIT")
    finally:
        conn.close()
    return rows, int(count), int(ids), blobs


def read_postgres_round(url: str, campaign_id: str, round: int) -> RoundContents:
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")  # one snapshot
        rows = [(seq, bytes(rid), group, bytes(payloads)) for seq, rid, group, payloads in conn.execute(
            "SELECT seq, report_id, group_index, payloads FROM reports WHERE campaign_id = %s AND round = %s "
            "ORDER BY seq", (campaign_id, round)).fetchall()]
        count = conn.execute("SELECT report_count FROM rounds WHERE campaign_id = %s AND round = %s",
                             (campaign_id, round)).fetchone()
        ids = conn.execute("SELECT COUNT(*) FROM report_ids").fetchone()
        blobs = {name: bytes(data) for name, data in conn.execute(
            "SELECT name, data FROM accumulators WHERE campaign_id = %s AND round = %s", (campaign_id, round))}
    assert count is not None and ids is not None
    return rows, int(count[0]), int(ids[0]), blobs


def round_is_open(store: str, campaign_id: str, round: int) -> bool | None:
    """Whether the round is open, closed (``False``) or not there at all (``None``), read from the store."""
    if store.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(store) as conn:
            row = conn.execute("SELECT is_open FROM rounds WHERE campaign_id = %s AND round = %s",
                               (campaign_id, round)).fetchone()
    else:
        conn = sqlite3.connect(f"file:{Path(store) / DATABASE_FILE}?mode=ro", uri=True)
        try:
            row = conn.execute("SELECT is_open FROM rounds WHERE campaign_id = ? AND round = ?",
                               (campaign_id, round)).fetchone()
        finally:
            conn.close()
    return None if row is None else bool(row[0])
