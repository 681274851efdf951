"""Prometheus metrics of the collector and the HTTP ``/metrics`` endpoint.

Every server owns one :class:`CollectorMetrics` with its own registry, so several servers in one
process (tests) never collide. With ``ldp-collector serve --workers N`` every worker process is
such a server with its own endpoint, worker ``i`` on ``metrics_port + i``: scrape all N ports (a
scrape config with N targets, or one target per worker). Counters then add up across targets in
PromQL (``sum by (...)``) and every worker's latency histogram stays its own, without the shared
files and restrictions of prometheus_client's multiprocess mode (no live gauges, manual cleanup
of dead workers' files). Label values are bounded: campaign *kinds*, outcomes, method
names and status codes, never campaign ids or device data.

=================================  =========  ================================================
metric                             type       labels
=================================  =========  ================================================
``ldp_reports_total``              counter    ``kind``, ``outcome`` (accepted/duplicate/rejected)
``ldp_submit_batch_reports``       histogram  ``api`` (reports/packed)
``ldp_rpc_duration_seconds``       histogram  ``method``
``ldp_rpcs_total``                 counter    ``method``, ``code``
``ldp_rounds_closed_total``        counter    ``trigger`` (operator/automatic)
``ldp_auth_failures_total``        counter    ``service``
``ldp_calls_in_flight``            gauge      --
``ldp_calls_shed_total``           counter    --
``ldp_rate_limited_total``         counter    ``limit`` (device/token)
``ldp_rate_limit_keys``            gauge      ``limit`` (device/token)
``ldp_watch_streams``              gauge      --
=================================  =========  ================================================
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from .binding import bind_error

__all__ = ["CollectorMetrics", "MetricsServer", "start_metrics_server"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 10, 100, 500, 1000, 2000, 5000, 10_000, 50_000, 100_000)


class CollectorMetrics:
    """The collector's metrics, registered in a private :class:`CollectorRegistry`.

    Parameters
    ----------
    registry : CollectorRegistry, optional
        Where to register (default: a fresh registry that also carries the process, platform and
        GC collectors).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        if registry is None:
            registry = CollectorRegistry()
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
        self.registry = registry
        self.reports = Counter("ldp_reports", "Reports received, by campaign kind and outcome.",
                               ["kind", "outcome"], registry=registry)
        self.batch_reports = Histogram("ldp_submit_batch_reports", "Reports per submit request.", ["api"],
                                       buckets=_BATCH_BUCKETS, registry=registry)
        self.rpc_duration = Histogram("ldp_rpc_duration_seconds", "Server-side RPC latency.", ["method"],
                                      buckets=_LATENCY_BUCKETS, registry=registry)
        self.rpcs = Counter("ldp_rpcs", "Finished RPCs by method and status code.", ["method", "code"],
                            registry=registry)
        self.rounds_closed = Counter("ldp_rounds_closed", "Rounds closed, by trigger.", ["trigger"],
                                     registry=registry)
        self.auth_failures = Counter("ldp_auth_failures", "Calls refused for a missing or wrong bearer token.",
                                     ["service"], registry=registry)
        self.calls_in_flight = Gauge("ldp_calls_in_flight", "Handler calls queued for or running in the worker pool.",
                                     registry=registry)
        self.calls_shed = Counter("ldp_calls_shed", "Calls refused with UNAVAILABLE because the worker pool was full.",
                                  registry=registry)
        self.watch_streams = Gauge("ldp_watch_streams", "Open WatchCampaign streams.", registry=registry)
        self.rate_limited = Counter("ldp_rate_limited", "Calls refused with RESOURCE_EXHAUSTED by a rate limit.",
                                    ["limit"], registry=registry)
        self.rate_limit_keys = Gauge("ldp_rate_limit_keys", "Devices or tokens a rate limiter tracks.", ["limit"],
                                     registry=registry)

    def observe_outcomes(self, counts: Mapping[tuple[str, str], int]) -> None:
        """Add per-(kind, outcome) report counts of one batch."""
        for (kind, outcome), n in counts.items():
            if n:
                self.reports.labels(kind=kind, outcome=outcome).inc(n)

    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        """Record one finished RPC."""
        self.rpc_duration.labels(method=method).observe(seconds)
        self.rpcs.labels(method=method, code=code).inc()


@dataclass(frozen=True)
class MetricsServer:
    """A running ``/metrics`` HTTP endpoint (daemon thread)."""

    host: str
    port: int
    httpd: WSGIServer
    thread: threading.Thread

    def close(self) -> None:
        """Stop serving and release the port."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5.0)


def start_metrics_server(metrics: CollectorMetrics, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve ``metrics`` at ``http://host:port/metrics`` (port 0 picks a free port).

    Raises
    ------
    OSError
        The address cannot be bound; the message names it (``cannot serve metrics on ...``).
    """
    try:
        httpd, thread = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as exc:
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise bind_error("cannot serve metrics on", address, exc) from exc
    return MetricsServer(host=host, port=int(httpd.server_address[1]), httpd=httpd, thread=thread)
