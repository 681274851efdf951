"""``ldp-collector serve --workers N``: several server processes on one port, supervised.

The parent forks N workers sharing the port with SO_REUSEPORT and supervises them
(:class:`Supervisor`): signals are forwarded for a graceful drain, a worker that dies is restarted
with backoff, and worker ``i`` serves metrics on ``metrics_port + i``. Send the stop signal to the
supervisor only (systemd: ``KillMode=mixed``); a worker that gets it twice cuts its drain short.
Workers stop by themselves if the supervisor is killed.

This module imports no ``grpc``: each forked worker imports :mod:`ldp_collector.server.lifecycle`
and creates its own server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from ..binding import reserve_address
from ..config import CollectorConfig, split_listen
from ..errors import CollectorError

__all__ = ["Supervisor", "SupervisorError"]

class SupervisorError(CollectorError):
    """The worker processes of ``serve --workers N`` could not be kept running (never on the wire:
    ``serve`` exits with it)."""


#: A worker that dies within this long of serving counts as a failure in a row (a crash loop).
_STABLE_AFTER_S = 30.0
#: Failures in a row of one worker slot before the supervisor gives up.
_MAX_FAILURES_IN_A_ROW = 5
#: Restart delay after the k-th failure in a row: min(_RESTART_MAX_S, _RESTART_BASE_S * 2**(k - 1)).
_RESTART_BASE_S = 0.5
_RESTART_MAX_S = 30.0
#: How often the supervisor looks at its workers when no signal arrives.
_SUPERVISE_POLL_S = 0.2
#: Seconds beyond the grace period a stopping worker gets before it is killed.
_STOP_MARGIN_S = 10.0


class _Worker:
    """One worker slot: its current process and restart history."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.pid = 0
        self.ready_fd = -1
        self.ready_at: float | None = None
        self.failures = 0
        self.restart_at: float | None = None

    @property
    def alive(self) -> bool:
        return self.pid != 0


class Supervisor:
    """``serve --workers N``: fork N servers sharing the port (SO_REUSEPORT) and keep them running.

    The parent never creates a gRPC object: it forks each worker, which opens its own store and
    its own ``grpc.aio`` server (gRPC's threads and sockets do not survive a fork, so they must
    be created after it). The port is bound first, by a socket with SO_REUSEPORT that the parent
    keeps (not listening) so the port stays reserved for restarts: a port in use is reported
    before any worker starts, and port 0 is resolved to a free one. Worker 0 starts
    first and alone -- it creates or migrates the store and proves the port can be bound -- then
    the others. Worker ``i`` serves metrics on ``metrics_port + i`` and only worker 0 closes
    rounds on the timer.

    Supervision: SIGTERM/SIGINT go to every worker (each drains gracefully; a second signal cuts
    the drains short), and the parent exits 0 once all exited cleanly. A worker that dies
    otherwise is restarted after a backoff (0.5 s doubling to 30 s); one that fails before
    serving during the start, or fails :data:`_MAX_FAILURES_IN_A_ROW` times in a row, stops
    everything with exit code 1.

    Parameters
    ----------
    config : CollectorConfig
        The configuration every worker serves (``workers`` of them; ``reuse_port`` is implied).
    report_error : callable
        ``report_error(who, exc)`` tells the operator why a worker could not serve (``who`` is
        ``"worker i"``); called in the worker, on stderr's behalf, just before it exits.
    """

    def __init__(self, config: CollectorConfig, *, report_error: Callable[[str, BaseException], None]) -> None:
        self._log = logging.getLogger("ldp_collector.supervisor")
        self._report_error = report_error
        self._config = config.replace(reuse_port=True)
        self._workers = [_Worker(i) for i in range(config.workers)]
        self._reservation: Any = None
        self._stopping = False
        self._stop_deadline = math.inf
        self._failed: str | None = None
        self._pid = os.getpid()
        #: Every worker has served once (until then any failure aborts: the setup is wrong).
        self._started_all = False

    def run(self) -> int:
        watched = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
        try:
            self._reserve_port()
            self._start(self._workers[0])
            while self._workers[0].ready_at is None and self._failed is None and not self._stopping:
                self._step(watched)
            for worker in self._workers[1:]:
                if self._failed is None and not self._stopping:
                    self._start(worker)
            if self._failed is None and not self._stopping:
                self._log.info("collector workers started", extra={
                    "listen": self._config.listen, "workers": len(self._workers),
                    "pids": [w.pid for w in self._workers]})
            while any(w.alive for w in self._workers) or (not self._stopping and self._failed is None):
                self._step(watched)
        finally:
            for worker in self._workers:
                if worker.alive:  # only after an unexpected error in the supervisor itself
                    self._kill(worker, signal.SIGKILL)
            if self._reservation is not None:
                self._reservation.close()
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        if self._failed is not None:
            raise SupervisorError(self._failed)
        self._log.info("collector workers stopped")
        return 0

    # -- the loop ------------------------------------------------------------------------------

    def _step(self, watched: set[signal.Signals]) -> None:
        """Wait for a signal (or the poll interval), then reap, check readiness and restart."""
        info = signal.sigtimedwait(watched, _SUPERVISE_POLL_S)
        if info is not None and info.si_signo in (signal.SIGTERM, signal.SIGINT):
            self._stop(info.si_signo, f"received {signal.Signals(info.si_signo).name}")
        self._reap()
        now = time.monotonic()
        for worker in self._workers:
            if worker.alive and worker.ready_at is None:
                self._check_ready(worker, now)
            if not worker.alive and worker.restart_at is not None and now >= worker.restart_at \
                    and not self._stopping:
                self._start(worker)
        if self._stopping and now >= self._stop_deadline:
            for worker in self._workers:
                if worker.alive:
                    self._log.warning("worker did not stop in time: killing it",
                                      extra={"worker": worker.index, "pid": worker.pid})
                    self._kill(worker, signal.SIGKILL)
            self._stop_deadline = math.inf

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker = next((w for w in self._workers if w.pid == pid), None)
            if worker is not None:
                self._exited(worker, status)

    def _exited(self, worker: _Worker, status: int) -> None:
        code = os.waitstatus_to_exitcode(status)
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        if worker.ready_at is None and worker.ready_fd >= 0:
            # It may have become ready since the last look (a SIGCHLD wakes the loop before the
            # periodic readiness check): its ready byte is still in the pipe.
            self._check_ready(worker, time.monotonic())
        was_ready, ready_at = worker.ready_at is not None, worker.ready_at
        worker.pid = 0
        worker.ready_at = None
        if worker.ready_fd >= 0:
            os.close(worker.ready_fd)
            worker.ready_fd = -1
        if self._stopping:
            if code != 0 and not (self._failed or code == -signal.SIGKILL):
                self._failed = f"worker {worker.index} {how} while stopping"
            self._log.info("worker stopped", extra={"worker": worker.index, "exit_code": code})
            return
        if not self._started_all:
            state = "while the others started" if was_ready else f"before serving on {self._config.listen}"
            self._fail(f"worker {worker.index} {how} {state} (its error is above)")
            return
        stable = was_ready and ready_at is not None and time.monotonic() - ready_at >= _STABLE_AFTER_S
        worker.failures = 1 if stable else worker.failures + 1
        if worker.failures >= _MAX_FAILURES_IN_A_ROW:
            self._fail(f"worker {worker.index} {how}; it failed {worker.failures} times in a row, giving up")
            return
        delay = min(_RESTART_MAX_S, _RESTART_BASE_S * 2.0 ** (worker.failures - 1))
        worker.restart_at = time.monotonic() + delay
        self._log.warning("worker %s; restarting it in %.1f s", how, delay,
                          extra={"worker": worker.index, "exit_code": code, "failures_in_a_row": worker.failures})

    def _check_ready(self, worker: _Worker, now: float) -> None:
        try:
            data = os.read(worker.ready_fd, 16)
        except BlockingIOError:
            return
        if data:
            worker.ready_at = now
            if all(w.ready_at is not None for w in self._workers):
                self._started_all = True

    # -- starting and stopping -----------------------------------------------------------------

    def _reserve_port(self) -> None:
        """Bind the port (SO_REUSEPORT, not listening) and keep it for the supervisor's lifetime.

        A port another process holds is reported here, in one line, before any worker starts;
        port 0 is resolved to the free port chosen.
        """
        host, port = split_listen(self._config.listen)
        self._reservation = reserve_address(self._config.listen, reuse_port=True)
        if port == 0:
            port = self._reservation.getsockname()[1]
            self._config = self._config.replace(listen=f"[{host}]:{port}" if ":" in host else f"{host}:{port}")

    def _start(self, worker: _Worker) -> None:
        worker.restart_at = None
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # or the child would write the parent's buffered output again
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            self._worker_main(worker.index, write_fd)
        os.close(write_fd)
        worker.pid = pid
        worker.ready_fd = read_fd
        worker.ready_at = None
        self._log.info("worker started", extra={"worker": worker.index, "pid": pid})

    def _worker_main(self, index: int, ready_fd: int) -> None:
        """The forked worker: serve until stopped, then ``os._exit`` (never returns)."""
        code = 1
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            # Its own process group: a Ctrl-C at the terminal reaches only the supervisor, which
            # forwards it once (twice would cut the drain short).
            os.setpgid(0, 0)
            _stop_with_parent(parent=self._pid)
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            if self._reservation is not None:
                self._reservation.close()
            for other in self._workers:
                if other.ready_fd >= 0:
                    os.close(other.ready_fd)
            _tag_log_records(index)
            from .lifecycle import serve  # after the fork: the parent never imports grpc

            config = self._config
            if config.metrics_port:
                config = config.replace(metrics_port=config.metrics_port + index)

            def ready(port: int) -> None:
                os.write(ready_fd, b"1")
                os.close(ready_fd)

            asyncio.run(serve(config, tick=index == 0, on_ready=ready))
            code = 0
        except KeyboardInterrupt:
            code = 130
        except BaseException as exc:
            self._report_error(f"worker {index}", exc)
        finally:
            logging.shutdown()
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)

    def _stop(self, signo: int, reason: str) -> None:
        first = not self._stopping
        self._stopping = True
        if first:
            self._log.info("stopping the collector workers: %s", reason)
            self._stop_deadline = time.monotonic() + self._config.grace_period_s + _STOP_MARGIN_S
        for worker in self._workers:
            worker.restart_at = None
            if worker.alive:
                self._kill(worker, signo)  # a second signal makes the workers cut their drains short

    def _fail(self, message: str) -> None:
        self._log.error(message)
        self._failed = message
        self._stop(signal.SIGTERM, message)

    @staticmethod
    def _kill(worker: _Worker, signo: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signo)


def _stop_with_parent(parent: int) -> None:
    """Ask the kernel for SIGTERM when the supervisor dies (Linux), so no worker outlives it."""
    import ctypes

    pr_set_pdeathsig = 1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: workers stop when told, not with the parent
        return
    if os.getppid() != parent:  # the supervisor died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _tag_log_records(index: int) -> None:
    """Add ``worker`` (the slot) and ``pid`` to every log record of this worker process."""
    factory = logging.getLogRecordFactory()
    pid = os.getpid()

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        record.worker = index
        record.pid = pid
        return record

    logging.setLogRecordFactory(make)

