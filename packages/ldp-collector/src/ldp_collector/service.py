"""The collector's gRPC front end: a thin layer over :class:`~ldp_collector.core.Collector`.

Every RPC is *decode -> plain handler -> encode*: the request bytes are parsed here (a parse
failure is INVALID_ARGUMENT, never INTERNAL), request-level limits are checked (``request_id``,
batch size), and one blocking job (proto -> SDK objects, the collector call, which waits on the
durable group commit, and the response encoding) runs in a bounded worker pool so the event
loop stays free for other calls. Report batches are decoded column by column
(:class:`~ldp_client.report.ReportColumns`), never into one object per report. Domain errors map
to status codes with ``google.rpc.Status`` details (:func:`status_for_error`). This is the only
collector module that imports ``grpc``.

Security model
--------------
``OperatorService`` needs ``authorization: Bearer <operator_token>``. Without a configured token
the server only starts on a loopback address (anyone on this host may then act as operator), or
anywhere with ``allow_insecure_operator`` set -- :class:`~ldp_collector.config.CollectorConfig`
enforces this. ``DeviceService`` needs ``Bearer <device token>`` (the operator token also works)
only when ``device_tokens`` is configured. Health and reflection are always open. Tokens are
compared in constant time (hashes of equal length via :func:`hmac.compare_digest`); with TLS
off, tokens cross the network in clear text, so use TLS beyond loopback.

Running
-------
``asyncio.run(serve(config))`` serves until SIGTERM/SIGINT, then shuts down gracefully: health
NOT_SERVING -> stop accepting -> drain in-flight RPCs for ``grace_period_s`` -> close the store.
A second signal cuts the drain short. Tests and embedding use :func:`start_server`, which runs
the same server on an event loop in a background thread and returns a :class:`RunningServer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import signal
import threading
import time
from collections import Counter as _Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import grpc
import msgpack
from google.protobuf import duration_pb2
from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2, error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from ldp.v1 import campaigns_pb2, service_pb2, service_pb2_grpc
from ldp_client import serde
from ldp_client.errors import LdpError, ProtocolError
from ldp_client.report import MAX_REQUEST_ID, ReportColumns, unpack_batch_columns

from .config import CollectorConfig, split_listen
from .core import Collector
from .errors import CollectorError, InvalidArgumentError, OverloadedError
from .metrics import CollectorMetrics, MetricsServer, start_metrics_server
from .storage import open_store
from .storage.base import Outcome, ReportStore

__all__ = [
    "DEVICE_SERVICE",
    "OPERATOR_SERVICE",
    "BearerTokenInterceptor",
    "CollectorServicer",
    "OperatorServicer",
    "RunningServer",
    "serve",
    "start_server",
    "status_for_error",
]

log = logging.getLogger(__name__)

DEVICE_SERVICE: str = service_pb2.DESCRIPTOR.services_by_name["DeviceService"].full_name
OPERATOR_SERVICE: str = service_pb2.DESCRIPTOR.services_by_name["OperatorService"].full_name
_ERROR_DOMAIN = "ldp.v1"
_MAX_MESSAGE = 1024
_LOG_EVERY_S = 10.0
_FINAL_STATES = (campaigns_pb2.FINISHED, campaigns_pb2.FAILED)
_OUTCOME_NAMES = {Outcome.ACCEPTED: "accepted", Outcome.DUPLICATE: "duplicate", Outcome.REJECTED: "rejected"}

T = TypeVar("T")
Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)
Context = grpc.aio.ServicerContext[Any, Any]
if TYPE_CHECKING:
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:  # not subscriptable at run time
    _ServerInterceptor = grpc.aio.ServerInterceptor


# -- errors -> google.rpc.Status ----------------------------------------------------------------

class _FieldError(InvalidArgumentError):
    """A request-level INVALID_ARGUMENT naming the request field at fault (BadRequest detail)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field_name = field_name


def _code_name(exc: BaseException) -> str:
    if isinstance(exc, CollectorError):
        return exc.code
    if isinstance(exc, LdpError):  # SDK validation (bad spec, payload) reaching the service
        return "INVALID_ARGUMENT"
    return "INTERNAL"


def status_for_error(exc: BaseException) -> status_pb2.Status:
    """The ``google.rpc.Status`` the service answers ``exc`` with.

    Every status carries an ``ErrorInfo`` (``reason`` = the exception class, ``domain`` =
    ``ldp.v1``); INVALID_ARGUMENT adds ``BadRequest`` (the field, when known),
    FAILED_PRECONDITION adds ``PreconditionFailure``, UNAVAILABLE adds ``RetryInfo`` with the
    collector's ``retry_after``. Unexpected exceptions become INTERNAL without their text (it
    is logged instead).
    """
    code = _code_name(exc)
    message = str(exc) if code != "INTERNAL" or isinstance(exc, CollectorError) else "internal error"
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "..."
    status = status_pb2.Status(code=code_pb2.Code.Value(code), message=message)
    status.details.add().Pack(error_details_pb2.ErrorInfo(reason=type(exc).__name__, domain=_ERROR_DOMAIN))
    if code == "INVALID_ARGUMENT":
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=getattr(exc, "field_name", ""), description=message)
        status.details.add().Pack(error_details_pb2.BadRequest(field_violations=[violation]))
    elif code == "FAILED_PRECONDITION":
        precondition = error_details_pb2.PreconditionFailure.Violation(
            type="STATE", subject="campaign", description=message)
        status.details.add().Pack(error_details_pb2.PreconditionFailure(violations=[precondition]))
    elif code == "UNAVAILABLE":
        delay = max(0.0, float(getattr(exc, "retry_after", 1.0)))
        seconds = int(delay)
        status.details.add().Pack(error_details_pb2.RetryInfo(
            retry_delay=duration_pb2.Duration(seconds=seconds, nanos=int((delay - seconds) * 1e9))))
    return status


async def _abort(context: Context, status: status_pb2.Status) -> NoReturn:
    rich = rpc_status.to_status(status)
    await context.abort(rich.code, rich.details, rich.trailing_metadata)


# -- the worker pool ----------------------------------------------------------------------------

class _WorkerPool:
    """Runs blocking handler jobs on a thread pool, shedding load beyond ``max_queued`` jobs."""

    def __init__(self, threads: int, max_queued: int, metrics: CollectorMetrics) -> None:
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ldp-handler")
        self._max_queued = max_queued
        self._metrics = metrics
        self._lock = threading.Lock()
        self._queued = 0

    async def run(self, fn: Callable[[], T], *, shed: bool = True) -> T:
        """Run ``fn()`` in the pool; ``OverloadedError`` (UNAVAILABLE + RetryInfo) when full."""
        with self._lock:
            if shed and self._max_queued and self._queued >= self._max_queued:
                self._metrics.calls_shed.inc()
                raise OverloadedError(f"the collector is busy ({self._queued} calls queued); retry later",
                                      retry_after=1.0)
            self._queued += 1
        self._metrics.calls_in_flight.inc()

        def done() -> None:
            with self._lock:
                self._queued -= 1
            self._metrics.calls_in_flight.dec()

        def job() -> T:
            # The count drops when the job ends, not when its caller stops waiting (a cancelled RPC
            # does not stop a commit that is already under way).
            try:
                return fn()
            finally:
                done()

        try:
            future = asyncio.get_running_loop().run_in_executor(self.executor, job)
        except RuntimeError:  # the pool is shut down: the job will never run
            done()
            raise OverloadedError("the collector is shutting down", retry_after=1.0) from None
        return await future


# -- servicers ----------------------------------------------------------------------------------

def _check_request_id(request_id: str, field_name: str = "request_id") -> None:
    if not request_id:
        raise _FieldError(field_name, f"{field_name} must not be empty")
    if len(request_id) > MAX_REQUEST_ID:
        raise _FieldError(field_name, f"{field_name} must be at most {MAX_REQUEST_ID} characters, got {len(request_id)}")


def _check_batch_size(n: int, limit: int, field_name: str) -> None:
    if n > limit:
        raise _FieldError(field_name, f"a batch holds at most {limit} reports, got {n}")


def _packed_batch_size(packed: bytes) -> int | None:
    """The report count a packed batch ``[1, request_id, [report, ...]]`` declares, read from the
    msgpack headers without decoding the reports; ``None`` if the prefix is not of that shape
    (``unpack_batch`` then explains what is wrong)."""
    unpacker = msgpack.Unpacker(max_buffer_size=len(packed) + 1, raw=False, max_str_len=1024, max_bin_len=1024)
    unpacker.feed(packed)
    try:
        if unpacker.read_array_header() != 3 or unpacker.unpack() != 1 or not isinstance(unpacker.unpack(), str):
            return None
        count: int = unpacker.read_array_header()
    except Exception:  # msgpack raises several unrelated types on garbage
        return None
    return count


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _outcome_field(report_id: bytes, outcome: Outcome, reason: str) -> bytes:
    """One ``ReportOutcome`` as field 1 of ``SubmitReportsResponse``, encoded as upb encodes it."""
    body = b"\x0a" + _varint(len(report_id)) + report_id if report_id else b""
    body += b"\x10" + _varint(int(outcome))
    if reason:
        text = reason.encode()
        body += b"\x1a" + _varint(len(text)) + text
    return b"\x0a" + _varint(len(body)) + body


def _submit_response(report_ids: Sequence[bytes],
                     results: Sequence[tuple[Outcome, str]]) -> service_pb2.SubmitReportsResponse:
    """The ``SubmitReportsResponse`` of a batch: one outcome per report, in request order, and the tallies.

    The outcomes are written in the protobuf wire format here and parsed once: adding 1000
    ``ReportOutcome`` messages one by one costs about 1 us per report, as much as decoding the batch.
    When every report has a 16-byte id and the same outcome without a reason (a normal batch), the
    whole field is one ``bytes.join``.
    """
    tally = _Counter([outcome for outcome, _ in results])
    common = set(results) if len(tally) == 1 else ()
    if len(common) == 1 and next(iter(common))[1] == "" and set(map(len, report_ids)) == {16}:
        # Each outcome is b"\x0a\x14\x0a\x10" + report_id + b"\x10" + status: a join with the end of one
        # outcome and the start of the next as the separator.
        status = bytes([int(next(iter(tally)))])
        outcomes = b"\x0a\x14\x0a\x10" + (b"\x10" + status + b"\x0a\x14\x0a\x10").join(report_ids) + b"\x10" + status
    else:
        outcomes = b"".join([_outcome_field(report_id, outcome, reason)
                             for report_id, (outcome, reason) in zip(report_ids, results)])
    response = service_pb2.SubmitReportsResponse.FromString(outcomes)
    response.accepted = tally[Outcome.ACCEPTED]
    response.duplicates = tally[Outcome.DUPLICATE]
    response.rejected = tally[Outcome.REJECTED]
    return response


class CollectorServicer(service_pb2_grpc.DeviceServiceServicer):
    """``ldp.v1.DeviceService``: round specs, report ingestion, results for devices.

    Parameters
    ----------
    collector : Collector
    pool : _WorkerPool
        Where the blocking collector calls run.
    metrics : CollectorMetrics
    max_batch_reports : int
        Largest batch accepted (INVALID_ARGUMENT above it).
    """

    def __init__(self, collector: Collector, pool: _WorkerPool, metrics: CollectorMetrics, *,
                 max_batch_reports: int) -> None:
        self._collector = collector
        self._pool = pool
        self._metrics = metrics
        self._max_batch = max_batch_reports
        self._kinds: dict[str, str] = {}

    async def GetRoundSpec(self, request: service_pb2.GetRoundSpecRequest,
                           context: Context) -> service_pb2.GetRoundSpecResponse:
        def job() -> service_pb2.GetRoundSpecResponse:
            spec, finished = self._collector.get_round_spec(request.campaign_id)
            response = service_pb2.GetRoundSpecResponse(finished=finished)
            if spec is not None:
                response.spec.CopyFrom(serde.round_spec_to_proto(spec))
            return response

        return await self._pool.run(job)

    async def SubmitReports(self, request: service_pb2.SubmitReportsRequest,
                            context: Context) -> service_pb2.SubmitReportsResponse:
        _check_request_id(request.request_id)
        _check_batch_size(len(request.reports), self._max_batch, "reports")
        self._metrics.batch_reports.labels(api="reports").observe(len(request.reports))

        def job() -> service_pb2.SubmitReportsResponse:
            items = serde.report_columns_from_proto(request.reports)
            # Outcomes echo the id each report was sent with, also for the malformed ones.
            ids = items.report_ids if not items.errors else [r.report_id for r in request.reports]
            return self._submit(request.request_id, items, ids)

        return await self._pool.run(job)

    async def SubmitPacked(self, request: service_pb2.SubmitPackedRequest,
                           context: Context) -> service_pb2.SubmitReportsResponse:
        # The packed batch carries its own request_id; the outer one may be empty, else it must agree.
        if request.request_id:
            _check_request_id(request.request_id)

        declared = _packed_batch_size(request.packed)
        if declared is not None:  # refuse a huge batch before decoding any of it
            _check_batch_size(declared, self._max_batch, "packed")

        def job() -> service_pb2.SubmitReportsResponse:
            try:
                request_id, items = unpack_batch_columns(request.packed)
            except (ProtocolError, TypeError) as exc:
                raise _FieldError("packed", str(exc)) from exc
            if request.request_id and request.request_id != request_id:
                raise _FieldError("request_id", "request_id differs from the packed batch's request_id")
            _check_batch_size(len(items), self._max_batch, "packed")
            self._metrics.batch_reports.labels(api="packed").observe(len(items))
            return self._submit(request_id, items, items.report_ids)  # b"" for a malformed report

        return await self._pool.run(job)

    async def GetResult(self, request: service_pb2.GetResultRequest,
                        context: Context) -> service_pb2.GetResultResponse:
        def job() -> service_pb2.GetResultResponse:
            return service_pb2.GetResultResponse(result=self._collector.get_result(request.campaign_id))

        return await self._pool.run(job)

    # Runs in the worker pool.
    def _submit(self, request_id: str, items: ReportColumns,
                report_ids: Sequence[bytes]) -> service_pb2.SubmitReportsResponse:
        results = self._collector.submit(request_id, items)
        if len(results) != len(items):
            raise RuntimeError(f"collector returned {len(results)} outcomes for {len(items)} reports")
        # items.campaign_ids holds "" for a malformed report.
        per_campaign = _Counter(zip(items.campaign_ids, [outcome for outcome, _ in results]))
        by_kind: _Counter[tuple[str, str]] = _Counter()
        for (campaign_id, outcome), n in per_campaign.items():
            by_kind[(self._kind_of(campaign_id, outcome), _OUTCOME_NAMES[outcome])] += n
        self._metrics.observe_outcomes(by_kind)
        return _submit_response(report_ids, results)

    def _kind_of(self, campaign_id: str, outcome: Outcome) -> str:
        """Campaign kind for the metrics label; looked up only for campaigns that stored a report,
        so a flood of made-up campaign ids costs no lookups."""
        kind = self._kinds.get(campaign_id)
        if kind is not None:
            return kind
        if outcome == Outcome.REJECTED or not campaign_id:
            return "unknown"
        try:
            campaign = self._collector.get_campaign(campaign_id)
        except CollectorError:
            return "unknown"
        kind = campaigns_pb2.CampaignKind.Name(campaign.config.kind).lower()
        self._kinds[campaign_id] = kind
        return kind


class OperatorServicer(service_pb2_grpc.OperatorServiceServicer):
    """``ldp.v1.OperatorService``: campaigns, rounds, estimates, results, progress.

    Parameters
    ----------
    collector : Collector
    pool : _WorkerPool
    metrics : CollectorMetrics
    poll_interval : float
        Seconds between the checks of ``WatchCampaign``.
    stopping : asyncio.Event
        Set when the server shuts down; open ``WatchCampaign`` streams then end.
    """

    def __init__(self, collector: Collector, pool: _WorkerPool, metrics: CollectorMetrics, *,
                 poll_interval: float, stopping: asyncio.Event) -> None:
        self._collector = collector
        self._pool = pool
        self._metrics = metrics
        self._poll = poll_interval
        self._stopping = stopping

    async def CreateCampaign(self, request: service_pb2.CreateCampaignRequest,
                             context: Context) -> campaigns_pb2.Campaign:
        if not request.HasField("config"):
            raise _FieldError("config", "config is required")
        return await self._pool.run(lambda: self._collector.create_campaign(request.config))

    async def ListCampaigns(self, request: service_pb2.ListCampaignsRequest,
                            context: Context) -> service_pb2.ListCampaignsResponse:
        def job() -> service_pb2.ListCampaignsResponse:
            campaigns, next_token = self._collector.list_campaigns(request.page_size, request.page_token)
            return service_pb2.ListCampaignsResponse(campaigns=campaigns, next_page_token=next_token)

        return await self._pool.run(job)

    async def GetCampaign(self, request: service_pb2.GetCampaignRequest,
                          context: Context) -> campaigns_pb2.Campaign:
        return await self._pool.run(lambda: self._collector.get_campaign(request.campaign_id))

    async def CloseRound(self, request: service_pb2.CloseRoundRequest, context: Context) -> campaigns_pb2.Campaign:
        campaign = await self._pool.run(lambda: self._collector.close_round(request.campaign_id, request.round))
        self._metrics.rounds_closed.labels(trigger="operator").inc()
        return campaign

    async def GetEstimates(self, request: service_pb2.GetEstimatesRequest,
                           context: Context) -> campaigns_pb2.Estimates:
        return await self._pool.run(
            lambda: self._collector.get_estimates(request.campaign_id, request.round, request.confidence))

    async def GetResult(self, request: service_pb2.GetResultRequest,
                        context: Context) -> service_pb2.GetResultResponse:
        def job() -> service_pb2.GetResultResponse:
            return service_pb2.GetResultResponse(result=self._collector.get_result(request.campaign_id))

        return await self._pool.run(job)

    async def WatchCampaign(self, request: service_pb2.WatchCampaignRequest,
                            context: Context) -> AsyncIterator[service_pb2.CampaignEvent]:
        """Yield the campaign's state now and after every change (reports, rounds, state), until
        it finishes or fails, the client cancels, or the server shuts down."""
        last = b""
        self._metrics.watch_streams.inc()
        try:
            while True:
                event = await self._pool.run(lambda: self._collector.campaign_events(request.campaign_id),
                                             shed=False)
                key = event.SerializeToString(deterministic=True)
                if key != last:
                    last = key
                    yield event
                if event.campaign.state in _FINAL_STATES or self._stopping.is_set():
                    return
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=self._poll)
        finally:
            self._metrics.watch_streams.dec()


# -- handler registration: raw bytes in, error mapping, metrics -------------------------------

def _parse(request_type: type[Req], data: bytes) -> Req:
    try:
        return request_type.FromString(data)
    except DecodeError as exc:
        raise _FieldError("", f"malformed {request_type.DESCRIPTOR.full_name}: {exc}") from exc


async def _fail(context: Context, exc: BaseException, method: str) -> NoReturn:
    if _code_name(exc) == "INTERNAL":
        log.error("%s failed", method, exc_info=exc, extra={"method": method})
    await _abort(context, status_for_error(exc))


def _unary_handler(method: str, behavior: Callable[[Req, Context], Awaitable[Resp]], request_type: type[Req],
                   metrics: CollectorMetrics) -> grpc.RpcMethodHandler[Any, Any]:
    async def handle(data: bytes, context: Context) -> Resp:
        start = time.perf_counter()
        code = "OK"
        try:
            return await behavior(_parse(request_type, data), context)
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            code = _code_name(exc)
            await _fail(context, exc, method)
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        finally:
            metrics.observe_rpc(method, code, time.perf_counter() - start)

    return grpc.unary_unary_rpc_method_handler(handle, request_deserializer=None,
                                               response_serializer=_serialize)


def _stream_handler(method: str, behavior: Callable[[Req, Context], AsyncIterator[Resp]], request_type: type[Req],
                    metrics: CollectorMetrics) -> grpc.RpcMethodHandler[Any, Any]:
    async def handle(data: bytes, context: Context) -> AsyncIterator[Resp]:
        start = time.perf_counter()
        code = "OK"
        try:
            async for item in behavior(_parse(request_type, data), context):
                yield item
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            code = _code_name(exc)
            await _fail(context, exc, method)
        except (asyncio.CancelledError, GeneratorExit):
            code = "CANCELLED"
            raise
        finally:
            metrics.observe_rpc(method, code, time.perf_counter() - start)

    return grpc.unary_stream_rpc_method_handler(handle, request_deserializer=None,
                                                response_serializer=_serialize)


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def _add_services(server: grpc.aio.Server, device: CollectorServicer, operator: OperatorServicer,
                  metrics: CollectorMetrics) -> None:
    def unary(service: str, name: str, behavior: Callable[[Any, Context], Awaitable[Any]],
              request_type: type[Message]) -> tuple[str, grpc.RpcMethodHandler[Any, Any]]:
        return name, _unary_handler(f"{service.rsplit('.', 1)[-1]}/{name}", behavior, request_type, metrics)

    device_handlers = dict([
        unary(DEVICE_SERVICE, "GetRoundSpec", device.GetRoundSpec, service_pb2.GetRoundSpecRequest),
        unary(DEVICE_SERVICE, "SubmitReports", device.SubmitReports, service_pb2.SubmitReportsRequest),
        unary(DEVICE_SERVICE, "SubmitPacked", device.SubmitPacked, service_pb2.SubmitPackedRequest),
        unary(DEVICE_SERVICE, "GetResult", device.GetResult, service_pb2.GetResultRequest),
    ])
    operator_handlers = dict([
        unary(OPERATOR_SERVICE, "CreateCampaign", operator.CreateCampaign, service_pb2.CreateCampaignRequest),
        unary(OPERATOR_SERVICE, "ListCampaigns", operator.ListCampaigns, service_pb2.ListCampaignsRequest),
        unary(OPERATOR_SERVICE, "GetCampaign", operator.GetCampaign, service_pb2.GetCampaignRequest),
        unary(OPERATOR_SERVICE, "CloseRound", operator.CloseRound, service_pb2.CloseRoundRequest),
        unary(OPERATOR_SERVICE, "GetEstimates", operator.GetEstimates, service_pb2.GetEstimatesRequest),
        unary(OPERATOR_SERVICE, "GetResult", operator.GetResult, service_pb2.GetResultRequest),
    ])
    operator_handlers["WatchCampaign"] = _stream_handler(
        "OperatorService/WatchCampaign", operator.WatchCampaign, service_pb2.WatchCampaignRequest, metrics)
    server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler(DEVICE_SERVICE, device_handlers),
        grpc.method_handlers_generic_handler(OPERATOR_SERVICE, operator_handlers),
    ))


# -- authentication -----------------------------------------------------------------------------

def _digest(token: str | bytes) -> bytes:
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


class BearerTokenInterceptor(_ServerInterceptor):
    """Require ``authorization: Bearer <token>`` on the methods of the protected services.

    Parameters
    ----------
    tokens_by_service : mapping of str to sequence of str
        Fully qualified service name -> accepted tokens. Services not listed (health,
        reflection, and ``DeviceService`` without device tokens) are open.
    metrics : CollectorMetrics
    """

    def __init__(self, tokens_by_service: dict[str, Sequence[str]], metrics: CollectorMetrics) -> None:
        self._digests = {f"/{service}/": tuple(_digest(t) for t in tokens)
                         for service, tokens in tokens_by_service.items() if tokens}
        self._metrics = metrics
        self._refused = 0
        self._last_log = -_LOG_EVERY_S

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method = handler_call_details.method
        prefix = method[: method.rfind("/") + 1]
        accepted = self._digests.get(prefix)
        handler = await continuation(handler_call_details)
        if accepted is None or handler is None:
            return handler
        problem = self._check(handler_call_details.invocation_metadata, accepted)
        if problem is None:
            return handler
        service = prefix.strip("/")
        self._metrics.auth_failures.labels(service=service).inc()
        self._log_refusal(method, problem)
        return _deny(handler, problem)

    def _log_refusal(self, method: str, problem: str) -> None:
        """Log refused calls at most once per ``_LOG_EVERY_S`` (a flood must not flood the logs too)."""
        self._refused += 1
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY_S:
            log.warning("refused %s: %s", method, problem,
                        extra={"method": method, "refused_since_last_log": self._refused})
            self._refused = 0
            self._last_log = now

    @staticmethod
    def _check(metadata: Any, accepted: tuple[bytes, ...]) -> str | None:
        """``None`` when the metadata carries an accepted bearer token, else what is wrong."""
        values = [value for key, value in (metadata or ()) if key == "authorization"]
        if not values:
            return "missing authorization metadata (expected 'Bearer <token>')"
        if len(values) > 1:
            return "more than one authorization header"
        value = values[0]
        if isinstance(value, bytes):
            return "authorization must be text"
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return "authorization must be 'Bearer <token>'"
        presented = _digest(token.strip())
        ok = False
        for digest in accepted:  # no early exit: the time does not depend on which token matched
            ok |= hmac.compare_digest(presented, digest)
        return None if ok else "invalid bearer token"


def _deny(handler: grpc.RpcMethodHandler[Any, Any], problem: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same streaming shape that answers UNAUTHENTICATED without reading the request."""
    status = status_pb2.Status(code=code_pb2.UNAUTHENTICATED, message=problem)
    status.details.add().Pack(error_details_pb2.ErrorInfo(reason="UNAUTHENTICATED", domain=_ERROR_DOMAIN))

    async def deny(request: bytes, context: Context) -> NoReturn:
        await _abort(context, status)

    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny)
    return grpc.unary_unary_rpc_method_handler(deny)


# -- the server ---------------------------------------------------------------------------------

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
    _server: grpc.aio.Server | None = None
    _health: health_aio.HealthServicer | None = None
    _pool: _WorkerPool | None = None
    _tick: asyncio.Task[None] | None = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _stop_requested: asyncio.Event = field(default_factory=asyncio.Event)
    _grace: float | None = None
    _closed: bool = False

    async def start(self) -> None:
        config = self.config
        self._pool = _WorkerPool(config.worker_threads, config.max_queued_calls, self.metrics)
        tokens: dict[str, Sequence[str]] = {OPERATOR_SERVICE: (config.operator_token,) if config.operator_token else ()}
        if config.device_tokens:
            tokens[DEVICE_SERVICE] = config.device_tokens + ((config.operator_token,) if config.operator_token else ())
        server = grpc.aio.server(
            interceptors=[BearerTokenInterceptor(tokens, self.metrics)],
            options=_server_options(config),
            maximum_concurrent_rpcs=config.max_concurrent_rpcs or None,
        )
        self._server = server
        device = CollectorServicer(self.collector, self._pool, self.metrics, max_batch_reports=config.max_batch_reports)
        operator = OperatorServicer(self.collector, self._pool, self.metrics,
                                    poll_interval=config.watch_poll_interval_s, stopping=self._stopping)
        _add_services(server, device, operator, self.metrics)
        self._health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (DEVICE_SERVICE, OPERATOR_SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), server)

        host, _ = split_listen(config.listen)
        credentials = _credentials(config)
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
        await server.start()
        for service in ("", DEVICE_SERVICE, OPERATOR_SERVICE):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._tick = asyncio.create_task(self._tick_loop(), name="ldp-collector-tick")
        if config.metrics_port:
            self.metrics_server = start_metrics_server(self.metrics, config.metrics_port, config.metrics_host)
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
            await asyncio.sleep(self.config.tick_interval_s)
            try:
                closed = await self._pool.run(self.collector.tick, shed=False)
            except Exception:
                log.exception("automatic round closing failed")
                continue
            if closed:
                self.metrics.rounds_closed.labels(trigger="automatic").inc(closed)

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
            await asyncio.to_thread(self._pool.executor.shutdown, True)
        await asyncio.to_thread(self.store.close)
        if self.metrics_server is not None:
            self.metrics_server.close()
        log.info("collector stopped")


def _build(config: CollectorConfig, store: ReportStore | None) -> _Runtime:
    store = open_store(config.data_dir) if store is None else store
    return _Runtime(config=config, store=store, collector=Collector(store))


async def serve(config: CollectorConfig, *, store: ReportStore | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully (module docstring).

    Parameters
    ----------
    config : CollectorConfig
    store : ReportStore, optional
        Default: ``open_store(config.data_dir)``. The server closes it on shutdown.
    """
    runtime = _build(config, store)
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
