"""The server's life cycle: options, TLS, binding, start, health, reflection, ticking, graceful stop.

``asyncio.run(serve(config))`` serves until SIGTERM/SIGINT, then shuts down gracefully: health
NOT_SERVING -> stop accepting -> drain in-flight RPCs for ``grace_period_s`` -> close the store.
A second signal cuts the drain short. Tests and embedding use :func:`start_server`, which runs
the same server on an event loop in a background thread and returns a :class:`RunningServer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]

from ..binding import reserve_address
from ..config import CollectorConfig, split_listen
from ..core import Collector
from ..defences import EnrolmentAuthority, EnrolmentLimiter
from ..ratelimit import RateLimiter
from ..storage import open_store
from ..storage.base import ReportStore
from ..telemetry import CollectorMetrics, MetricsServer, start_metrics_server
from .handlers import add_services
from .interceptors import (
    BearerTokenInterceptor,
    RateLimitInterceptor,
    ServerInterceptor,
    UndecodableRequestInterceptor,
)
from .reflection import enable_reflection
from .servicer import CollectorServicer, OperatorServicer
from .wire import DEVICE_SERVICE, OPERATOR_SERVICE
from .worker_pool import WorkerPool

__all__ = ["RunningServer", "serve", "start_server"]

log = logging.getLogger(__name__)


def _server_options(config: CollectorConfig) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", config.max_receive_bytes),
        ("grpc.max_send_message_length", config.max_send_bytes),
        ("grpc.keepalive_time_ms", int(config.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_s * 1000)),
        # Clients may ping every 10 s even between calls; faster pings are a misbehaving client.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.so_reuseport", 1 if config.reuse_port else 0),
        # gRPC buffers a whole message before it checks its size against the receive limit
        # (grpc/grpc#43012), and with bandwidth-delay probing a connection's flow-control windows
        # grow to megabytes, so a peer could park a message of tens of megabytes in memory on every
        # stream. Without probing, a stream's window is the message being read, at most the limit.
        ("grpc.http2.bdp_probe", 0),
    ]


def _read_file(key: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise OSError(f"cannot read {key} {path!r}: {exc}") from exc


def _credentials(config: CollectorConfig) -> grpc.ServerCredentials | None:
    if not config.tls:
        return None
    key = _read_file("tls_key", config.tls_key)
    cert = _read_file("tls_cert", config.tls_cert)
    ca = _read_file("tls_client_ca", config.tls_client_ca) if config.tls_client_ca else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


@dataclass
class _Runtime:
    """Everything one running server owns; lives on one event loop."""

    config: CollectorConfig
    store: ReportStore
    collector: Collector
    metrics: CollectorMetrics = field(default_factory=CollectorMetrics)
    port: int = 0
    metrics_server: MetricsServer | None = None
    #: Whether this server closes due rounds on the timer (one process per host is enough).
    run_tick: bool = True
    _server: grpc.aio.Server | None = None
    _health: health_aio.HealthServicer | None = None
    _pool: WorkerPool | None = None
    _tick: asyncio.Task[None] | None = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _stop_requested: asyncio.Event = field(default_factory=asyncio.Event)
    _grace: float | None = None
    _closed: bool = False
    #: The start completed; a failed start's cleanup logs no "shutting down" for a server that never served.
    _serving: bool = False

    async def start(self) -> None:
        config = self.config
        self._pool = WorkerPool(config.worker_threads, config.max_queued_calls, self.metrics,
                                 max_queued_bytes=config.max_queued_bytes)
        tokens: dict[str, Sequence[str]] = {OPERATOR_SERVICE: (config.operator_token,) if config.operator_token else ()}
        if config.device_tokens or config.enrolment:
            tokens[DEVICE_SERVICE] = config.device_tokens + ((config.operator_token,) if config.operator_token else ())
        authority = EnrolmentAuthority(config.enrolment_secret) if config.enrolment else None
        enrolment_limiter = EnrolmentLimiter(
            rate=config.enrolment_rate, burst=config.enrolment_burst, peer_rate=config.enrolment_peer_rate,
            peer_burst=config.enrolment_peer_burst) if config.enrolment else None
        interceptors: list[ServerInterceptor] = [
            BearerTokenInterceptor(tokens, self.metrics, device_authority=authority),
            UndecodableRequestInterceptor(self.metrics)]
        if config.token_rate_limit:
            interceptors.append(RateLimitInterceptor(RateLimiter(
                "token", rate=config.token_rate_limit,
                capacity=config.token_rate_burst or max(1.0, config.token_rate_limit),
                max_keys=config.rate_limit_max_keys), self.metrics))
        device_limiter = None
        if config.device_rate_limit:
            device_limiter = RateLimiter(
                "device", rate=config.device_rate_limit, unit="reports",
                capacity=config.device_rate_burst or max(float(config.max_batch_reports), config.device_rate_limit),
                max_keys=config.rate_limit_max_keys)
        server = grpc.aio.server(
            interceptors=interceptors,
            options=_server_options(config),
            maximum_concurrent_rpcs=config.max_concurrent_rpcs or None,
        )
        self._server = server
        device = CollectorServicer(self.collector, self._pool, self.metrics, max_batch_reports=config.max_batch_reports,
                                   device_limiter=device_limiter,
                                   device_key_by_token=bool(config.device_tokens) or config.enrolment,
                                   authority=authority, enrolment_limiter=enrolment_limiter)
        operator = OperatorServicer(self.collector, self._pool, self.metrics,
                                    poll_interval=config.watch_poll_interval_s, stopping=self._stopping)
        add_services(server, device, operator, self.metrics)
        self._health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        enable_reflection(server, (DEVICE_SERVICE, OPERATOR_SERVICE,
                                   health_pb2.DESCRIPTOR.services_by_name["Health"].full_name))

        host, listen_port = split_listen(config.listen)
        credentials = _credentials(config)
        if listen_port:  # a taken port, said in words before gRPC tries ("Failed to bind")
            reserve_address(config.listen, reuse_port=config.reuse_port).close()
        try:
            if credentials is None:
                port = server.add_insecure_port(config.listen)
            else:
                port = server.add_secure_port(config.listen, credentials)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {config.listen}: {exc}") from exc
        if port == 0:
            raise OSError(f"cannot listen on {config.listen}")
        self.port = port
        if config.metrics_port:  # before serving: a metrics port that cannot be bound stops the start
            self.metrics_server = start_metrics_server(self.metrics, config.metrics_port, config.metrics_host)
        await server.start()
        for service in ("", DEVICE_SERVICE, OPERATOR_SERVICE):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        if self.run_tick:
            self._tick = asyncio.create_task(self._tick_loop(), name="ldp-collector-tick")
        self._serving = True
        if not config.operator_token:
            log.warning("no operator token configured: operator calls are unauthenticated (listening on %s)",
                        config.listen)
        log.info("collector listening", extra={
            "listen": f"{host}:{port}", "tls": config.tls, "mtls": bool(config.tls_client_ca),
            "metrics_port": self.metrics_server.port if self.metrics_server else 0,
            "operator_auth": config.operator_auth, "device_auth": bool(config.device_tokens)})

    async def _tick_loop(self) -> None:
        assert self._pool is not None
        while True:
            # Tick first: a restarted collector resumes the server steps its predecessor left
            # interrupted at once, not one interval later.
            try:
                closed = await self._pool.run(self.collector.tick, shed=False)
            except Exception:
                log.exception("automatic round closing failed")
                closed = 0
            if closed:
                self.metrics.rounds_closed.labels(trigger="automatic").inc(closed)
            await asyncio.sleep(self.config.tick_interval_s)

    def request_stop(self, grace: float | None = None) -> None:
        """Begin a graceful shutdown (idempotent); a second request drains no longer."""
        if self._stop_requested.is_set():
            if self._server is not None:
                log.warning("second stop request: cancelling in-flight calls")
                asyncio.get_running_loop().create_task(self._server.stop(0))
            return
        self._grace = self.config.grace_period_s if grace is None else grace
        self._stop_requested.set()

    async def wait_and_shutdown(self) -> None:
        await self._stop_requested.wait()
        await self.shutdown(self._grace)

    async def shutdown(self, grace: float | None) -> None:
        """Health NOT_SERVING -> stop accepting -> drain (``grace`` s) -> stop ticking -> close the store."""
        if self._closed:
            return
        self._closed = True
        grace = self.config.grace_period_s if grace is None else grace
        if self._serving:
            log.info("collector shutting down", extra={"grace_s": grace})
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        self._stopping.set()
        if self._server is not None:
            await self._server.stop(grace)
        if self._tick is not None:
            self._tick.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tick
        if self._pool is not None:
            await asyncio.to_thread(self._pool.close)
        await asyncio.to_thread(self.store.close)
        if self.metrics_server is not None:
            self.metrics_server.close()
        if self._serving:
            log.info("collector stopped")


def _build(config: CollectorConfig, store: ReportStore | None, *, tick: bool = True) -> _Runtime:
    store = open_store(config.data_dir) if store is None else store
    return _Runtime(config=config, store=store, collector=Collector(store), run_tick=tick)


async def serve(config: CollectorConfig, *, store: ReportStore | None = None, tick: bool = True,
                on_ready: Callable[[int], None] | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully (module docstring).

    Parameters
    ----------
    config : CollectorConfig
    store : ReportStore, optional
        Default: ``open_store(config.data_dir)``. The server closes it on shutdown.
    tick : bool
        Close due rounds on the timer (``tick_interval_s``). Of several processes sharing a store on
        one host, one ticking is enough; closing is atomic in the store either way.
    on_ready : callable, optional
        Called with the bound port once the server is serving (a supervisor's readiness signal).
    """
    runtime = _build(config, store, tick=tick)
    loop = asyncio.get_running_loop()
    installed = []
    try:
        # Handlers first: a signal that arrives while starting still shuts down gracefully.
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, runtime.request_stop)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
                log.debug("cannot install a handler for %s", sig.name)
        await runtime.start()
        if on_ready is not None:
            on_ready(runtime.port)
        await runtime.wait_and_shutdown()
    finally:
        await runtime.shutdown(0)  # no-op after a graceful shutdown; cleans up after a failed start
        for sig in installed:
            loop.remove_signal_handler(sig)


class RunningServer:
    """A server running on its own event loop in a background thread (from :func:`start_server`).

    Attributes
    ----------
    port : int
        The bound port (the real one when ``listen`` asked for port 0).
    address : str
        ``host:port`` for ``grpc.insecure_channel`` / ``grpc.secure_channel``.
    metrics_port : int
        Port of ``/metrics`` (0 when off).
    collector : Collector
        The in-process handlers (for inspection in tests).
    """

    def __init__(self, runtime: _Runtime, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self._runtime = runtime
        self._loop = loop
        self._thread = thread
        host, _ = split_listen(runtime.config.listen)
        self.port = runtime.port
        self.address = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        self.metrics_port = runtime.metrics_server.port if runtime.metrics_server else 0
        self.collector = runtime.collector
        self.config = runtime.config

    def stop(self, grace: float | None = None) -> None:
        """Shut down gracefully (``grace`` seconds of drain, default the config's) and wait for it."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._runtime.request_stop, grace)
            self._thread.join()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_server(config: CollectorConfig, *, store: ReportStore | None = None,
                 timeout: float = 30.0) -> RunningServer:
    """Start a server in a background thread and return once it is serving.

    Parameters
    ----------
    config : CollectorConfig
        ``listen="127.0.0.1:0"`` binds a free port (see ``RunningServer.port``).
    store : ReportStore, optional
        Default: ``open_store(config.data_dir)``. The server closes it on stop.
    timeout : float
        Seconds to wait for the server to come up.

    Returns
    -------
    RunningServer
        Call ``stop()`` (or use it as a context manager) to shut it down.
    """
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        asyncio.set_event_loop(loop)

        async def run() -> None:
            try:
                runtime = _build(config, store)
                box["runtime"] = runtime
                await runtime.start()
            except BaseException as exc:
                box["error"] = exc
                started.set()
                if "runtime" in box:
                    await box["runtime"].shutdown(0)
                return
            started.set()
            try:
                await runtime.wait_and_shutdown()
            finally:
                await runtime.shutdown(0)

        try:
            loop.run_until_complete(run())
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    thread = threading.Thread(target=main, name="ldp-collector-server", daemon=True)
    thread.start()
    if not started.wait(timeout):
        raise TimeoutError(f"the collector did not start within {timeout} s")
    if "error" in box:
        thread.join()
        raise box["error"]
    return RunningServer(box["runtime"], loop, thread)
