"""The collector's gRPC front end: a thin layer over :class:`~ldp_collector.core.Collector`.

Every RPC is *decode -> plain handler -> encode*: the request bytes are parsed here (a parse
failure is INVALID_ARGUMENT, never INTERNAL), request-level limits are checked (``request_id``,
batch size), and one blocking job (proto -> SDK objects, the collector call, which waits on the
durable group commit, and the response encoding) runs in a bounded worker pool so the event
loop stays free for other calls. Report batches are decoded column by column
(:class:`~ldp_client.report.ReportColumns`), never into one object per report, on one decoder
thread, and their size is known before: the transport refuses a request beyond
``max_receive_bytes`` (by default the largest legal batch), a packed batch's declared report count
and a ``SubmitReports`` request's count (read from the wire; the request is parsed in the pool)
are checked on the event loop. Domain errors map to status codes with ``google.rpc.Status``
details (:func:`status_for_error`). This is the only collector module that imports ``grpc``.

Security model
--------------
``OperatorService`` needs ``authorization: Bearer <operator_token>``. Without a configured token
the server only starts on a loopback address (anyone on this host may then act as operator), or
anywhere with ``allow_insecure_operator`` set -- :class:`~ldp_collector.config.CollectorConfig`
enforces this. ``DeviceService`` needs ``Bearer <device token>`` (the operator token also works)
only when ``device_tokens`` is configured. With ``enrolment`` on, ``DeviceService.Enroll`` is open
(rate limited globally and per peer address: UNAVAILABLE + RetryInfo beyond the limits) and hands
out device tokens that every process sharing ``enrolment_secret`` verifies without state; every
other ``DeviceService`` call then needs an enrolled token (or a static device token, or the
operator token), and an enrolled device gets its report id and hash seeds assigned with each round
spec and must report with exactly those (:mod:`ldp_collector.defences`). Health and reflection are
always open. Tokens are
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
import inspect
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
from ldp_client.report import MAX_REQUEST_ID, ReportColumns, declared_batch_size, unpack_batch_columns

from .binding import reserve_address
from .config import CollectorConfig, split_listen
from .core import Collector
from .defences import EnrolmentAuthority, EnrolmentLimiter, peer_address
from .errors import CollectorError, FailedPreconditionError, InvalidArgumentError, OverloadedError
from .ingest import Assign
from .metrics import CollectorMetrics, MetricsServer, start_metrics_server
from .ratelimit import RateLimitedError, RateLimiter
from .storage import open_store
from .storage.base import Outcome, ReportStore

__all__ = [
    "DEVICE_SERVICE",
    "OPERATOR_SERVICE",
    "BearerTokenInterceptor",
    "CollectorServicer",
    "OperatorServicer",
    "RateLimitInterceptor",
    "RunningServer",
    "UndecodableRequestInterceptor",
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
#: Bounds of the RetryInfo delay of a call shed by a full worker pool, and the weight of the
#: newest job in the pool's moving average of the job duration.
_MIN_RETRY_S = 0.05
_MAX_RETRY_S = 5.0
_JOB_TIME_WEIGHT = 0.1
_ENROLL_METHOD = f"/{DEVICE_SERVICE}/Enroll"
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

    Every status carries an ``ErrorInfo`` (``reason`` = the error's ``reason``, else the exception
    class; ``domain`` = ``ldp.v1``); INVALID_ARGUMENT adds ``BadRequest`` (the field, when known),
    FAILED_PRECONDITION adds ``PreconditionFailure``, UNAVAILABLE adds ``RetryInfo`` with the
    collector's ``retry_after``, RESOURCE_EXHAUSTED from a rate limit adds ``QuotaFailure`` (which
    limit) and ``RetryInfo`` (when the bucket holds enough again). Unexpected exceptions become
    INTERNAL without their text (it is logged instead).
    """
    code = _code_name(exc)
    message = str(exc) if code != "INTERNAL" or isinstance(exc, CollectorError) else "internal error"
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "..."
    status = status_pb2.Status(code=code_pb2.Code.Value(code), message=message)
    reason = (exc.reason if isinstance(exc, CollectorError) else None) or type(exc).__name__
    status.details.add().Pack(error_details_pb2.ErrorInfo(reason=reason, domain=_ERROR_DOMAIN))
    if code == "INVALID_ARGUMENT":
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=getattr(exc, "field_name", ""), description=message)
        status.details.add().Pack(error_details_pb2.BadRequest(field_violations=[violation]))
    elif code == "FAILED_PRECONDITION":
        precondition = error_details_pb2.PreconditionFailure.Violation(
            type="STATE", subject="campaign", description=message)
        status.details.add().Pack(error_details_pb2.PreconditionFailure(violations=[precondition]))
    elif code == "UNAVAILABLE" or (code == "RESOURCE_EXHAUSTED" and hasattr(exc, "retry_after")):
        if code == "RESOURCE_EXHAUSTED":
            quota = error_details_pb2.QuotaFailure.Violation(
                subject=f"{getattr(exc, 'limit', 'rate')}_rate_limit", description=message)
            status.details.add().Pack(error_details_pb2.QuotaFailure(violations=[quota]))
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
    """Runs blocking handler jobs on a thread pool, shedding load beyond ``max_queued`` jobs.

    A shed call's RetryInfo delay is the time the queue ahead of it needs to drain: the queued
    jobs, ``threads`` at a time, at the recent job duration (moving average), clamped to
    [:data:`_MIN_RETRY_S`, :data:`_MAX_RETRY_S`]. A fixed delay would either bring refused clients
    back into a still-full queue or leave the workers idle while every client waits.

    Jobs decode their request with :meth:`decode`, on one decoder thread shared by all of them:
    decoding holds the GIL, so a second decoder would add no throughput, only the memory of another
    half-decoded request (10 to 20 times its bytes for hostile ones) and one more thread for the
    event loop to share the GIL with; and a request decoded on any of the worker threads would
    leave its peak in that thread's malloc arena, so the process would hold the peak once a thread.
    """

    def __init__(self, threads: int, max_queued: int, metrics: CollectorMetrics, max_queued_bytes: int = 0) -> None:
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ldp-handler")
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ldp-decoder")
        self._threads = threads
        self._max_queued = max_queued
        self._max_bytes = max_queued_bytes
        self._metrics = metrics
        self._lock = threading.Lock()
        self._queued = 0
        self._queued_bytes = 0
        self._job_seconds = 0.05  # moving average of the job duration

    def decode(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the decoder thread (call it from a job: it waits for its turn)."""
        return self._decoder.submit(fn).result()

    def close(self) -> None:
        """Wait for the running and queued jobs, then stop the threads."""
        self.executor.shutdown(wait=True)
        self._decoder.shutdown(wait=True)  # after the jobs, which may still be waiting for it

    def retry_after(self) -> float:
        """Seconds until the current queue has drained (the RetryInfo of a shed call)."""
        rounds = -(-self._queued // self._threads)
        return min(_MAX_RETRY_S, max(_MIN_RETRY_S, rounds * self._job_seconds))

    async def run(self, fn: Callable[[], T], *, shed: bool = True, size: int = 0) -> T:
        """Run ``fn()`` in the pool; ``OverloadedError`` (UNAVAILABLE + RetryInfo) when full.

        ``size`` is the request's byte size, counted against ``max_queued_bytes`` while the job
        waits or runs.
        """
        with self._lock:
            if shed and ((self._max_queued and self._queued >= self._max_queued)
                         or (self._max_bytes and self._queued and self._queued_bytes + size > self._max_bytes)):
                self._metrics.calls_shed.inc()
                raise OverloadedError(f"the collector is busy ({self._queued} calls, {self._queued_bytes} bytes "
                                      "queued); retry later", retry_after=self.retry_after())
            self._queued += 1
            self._queued_bytes += size
        self._metrics.calls_in_flight.inc()

        def done(seconds: float) -> None:
            with self._lock:
                self._queued -= 1
                self._queued_bytes -= size
                self._job_seconds += _JOB_TIME_WEIGHT * (seconds - self._job_seconds)
            self._metrics.calls_in_flight.dec()

        def job() -> T:
            # The count drops when the job ends, not when its caller stops waiting (a cancelled RPC
            # does not stop a commit that is already under way).
            start = time.perf_counter()
            try:
                return fn()
            finally:
                done(time.perf_counter() - start)

        try:
            future = asyncio.get_running_loop().run_in_executor(self.executor, job)
        except RuntimeError:  # the pool is shut down: the job will never run
            with self._lock:
                self._queued -= 1
                self._queued_bytes -= size
            self._metrics.calls_in_flight.dec()
            raise OverloadedError("the collector is shutting down", retry_after=1.0) from None
        try:
            return await future
        finally:
            # A failed job's error is kept by the future, and its traceback holds this frame: without
            # this, frame -> future -> error -> frame is a cycle that keeps the job (and its request)
            # alive until the garbage collector runs.
            del future


# -- servicers ----------------------------------------------------------------------------------

def _check_request_id(request_id: str, field_name: str = "request_id") -> None:
    if not request_id:
        raise _FieldError(field_name, f"{field_name} must not be empty")
    if len(request_id) > MAX_REQUEST_ID:
        raise _FieldError(field_name, f"{field_name} must be at most {MAX_REQUEST_ID} characters, got {len(request_id)}")


def _check_batch_size(n: int, limit: int, field_name: str) -> None:
    if n > limit:
        raise _FieldError(field_name, f"a batch holds at most {limit} reports, got {n}")


#: Protobuf wire types a message may hold: varint, 64-bit, length-delimited, 32-bit (not the groups).
_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_I32 = 0, 1, 2, 5


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The protobuf varint at ``data[pos:]`` and the position after it (IndexError when truncated)."""
    value = data[pos]
    pos += 1
    if value < 0x80:
        return value, pos
    value &= 0x7F
    shift = 7
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _count_messages(data: bytes, field_number: int, limit: int) -> int:
    """How many entries of the repeated message field ``field_number`` the serialized message
    ``data`` holds at its top level, read from the tags and lengths without parsing any entry;
    counting stops at ``limit + 1``.

    A ``SubmitReportsRequest`` of millions of empty reports fits into a few megabytes and parses
    into gigabytes, so its report count is checked before it is parsed. Malformed wire data, and
    the obsolete group wire types (which protobuf would skip as unknown fields), are refused here.
    """
    wanted = (field_number << 3) | _WIRE_LEN
    count = pos = 0
    end = len(data)
    try:
        while pos < end:
            tag, pos = _read_varint(data, pos)
            wire = tag & 7
            if wire == _WIRE_LEN:
                length, pos = _read_varint(data, pos)
                pos += length
                if tag == wanted:
                    count += 1
                    if count > limit:
                        return count
            elif wire == _WIRE_VARINT:
                _, pos = _read_varint(data, pos)
            elif wire == _WIRE_I64:
                pos += 8
            elif wire == _WIRE_I32:
                pos += 4
            else:
                raise ValueError(f"wire type {wire}")
    except (IndexError, ValueError) as exc:
        raise _FieldError("", f"malformed request: {exc or 'truncated'}") from None
    if pos != end:
        raise _FieldError("", "malformed request: truncated")
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
    device_limiter : RateLimiter, optional
        Reports per second per device (RESOURCE_EXHAUSTED + RetryInfo beyond it), charged one
        token per report of a well-formed request before it queues for the worker pool.
    device_key_by_token : bool
        Key devices by their bearer token (when device tokens are verified); otherwise by the
        peer's IP address, since an unverified token would let a device pick a fresh bucket.
    """

    def __init__(self, collector: Collector, pool: _WorkerPool, metrics: CollectorMetrics, *,
                 max_batch_reports: int, device_limiter: RateLimiter | None = None,
                 device_key_by_token: bool = False, authority: EnrolmentAuthority | None = None,
                 enrolment_limiter: EnrolmentLimiter | None = None) -> None:
        self._collector = collector
        self._pool = pool
        self._metrics = metrics
        self._max_batch = max_batch_reports
        self._kinds: dict[str, str] = {}
        self._device_limiter = device_limiter
        self._device_key_by_token = device_key_by_token
        self._authority = authority
        self._enrolment_limiter = enrolment_limiter

    def _assign_for(self, context: Context) -> Assign | None:
        """The assignment function of the calling enrolled device, or ``None`` for other callers."""
        authority = self._authority
        if authority is None:
            return None
        token = _bearer_token(context.invocation_metadata())
        identity = authority.verify(token) if token is not None else None
        if identity is None:
            return None
        device_id = identity.device_id
        return lambda campaign_id, round: authority.assignment(device_id, campaign_id, round)

    async def Enroll(self, request: service_pb2.EnrollRequest, context: Context) -> service_pb2.EnrollResponse:
        authority, limiter = self._authority, self._enrolment_limiter
        if authority is None:
            raise FailedPreconditionError("device enrolment is off on this collector")
        if limiter is not None:
            wait = limiter.admit(peer_address(context.peer()))
            if wait is not None:
                raise OverloadedError(f"too many enrolments; retry in {wait:.3f} s", retry_after=wait)
        return service_pb2.EnrollResponse(device_token=authority.issue())

    async def _run_charged(self, context: Context, reports: int, size: int, job: Callable[[], T]) -> T:
        """Charge the device ``reports`` tokens, then run ``job`` in the pool (``size`` request
        bytes); a call the pool sheds gets its tokens back, so a retry is not charged twice."""
        key = self._charge_device(context, reports)
        try:
            return await self._pool.run(job, size=size)
        except OverloadedError:
            if key is not None and self._device_limiter is not None:
                self._device_limiter.refund(key, max(1, reports))
            raise

    def _charge_device(self, context: Context, reports: int) -> bytes | str | None:
        """Take ``reports`` tokens from the calling device's bucket (``RateLimitedError`` if short);
        the bucket's key, or ``None`` without a device limit."""
        limiter = self._device_limiter
        if limiter is None:
            return None
        digest = _bearer_digest(context.invocation_metadata()) if self._device_key_by_token else None
        key: bytes | str = peer_address(context.peer()) if digest is None else digest
        try:
            limiter.acquire(key, max(1, reports))
        except CollectorError:
            self._metrics.rate_limited.labels(limit=limiter.name).inc()
            raise
        finally:
            self._metrics.rate_limit_keys.labels(limit=limiter.name).set(len(limiter))
        return key

    async def GetRoundSpec(self, request: service_pb2.GetRoundSpecRequest,
                           context: Context) -> service_pb2.GetRoundSpecResponse:
        assign = self._assign_for(context)

        def job() -> service_pb2.GetRoundSpecResponse:
            spec, finished = self._collector.get_round_spec(request.campaign_id)
            response = service_pb2.GetRoundSpecResponse(finished=finished)
            if spec is not None:
                response.spec.CopyFrom(serde.round_spec_to_proto(spec))
                if assign is not None:
                    assignment = assign(spec.campaign_id, spec.round)
                    response.assignment.report_id = assignment.report_id
                    response.assignment.hash_seeds.extend(assignment.hash_seeds)
            return response

        return await self._pool.run(job)

    async def SubmitReports(self, data: bytes,  # type: ignore[override]  # the serialized request
                            context: Context) -> service_pb2.SubmitReportsResponse:
        """Takes the serialized request: its report count is read from the wire first (bounded, on
        the event loop) and it is parsed in the worker pool, never on the event loop."""
        count = _count_messages(data, service_pb2.SubmitReportsRequest.REPORTS_FIELD_NUMBER, self._max_batch)
        if count > self._max_batch:
            raise _FieldError("reports", f"a batch holds at most {self._max_batch} reports, got more")
        assign = self._assign_for(context)

        def decode() -> tuple[str, ReportColumns, Sequence[bytes]]:
            # The parsed message is dropped on return: it takes up to 10 times the request's bytes.
            request = _parse(service_pb2.SubmitReportsRequest, data)
            _check_request_id(request.request_id)
            items = serde.report_columns_from_proto(request.reports)
            # Outcomes echo the id each report was sent with, also for the malformed ones.
            ids = items.report_ids if not items.errors else [r.report_id for r in request.reports]
            return request.request_id, items, ids

        def job() -> service_pb2.SubmitReportsResponse:
            request_id, items, ids = self._pool.decode(decode)
            self._metrics.batch_reports.labels(api="reports").observe(len(items))
            return self._submit(request_id, items, ids, assign)

        return await self._run_charged(context, count, len(data), job)

    async def SubmitPacked(self, request: service_pb2.SubmitPackedRequest,
                           context: Context) -> service_pb2.SubmitReportsResponse:
        # The packed batch carries its own request_id; the outer one may be empty, else it must agree.
        if request.request_id:
            _check_request_id(request.request_id)

        packed = request.packed  # each read of the field copies it
        declared = declared_batch_size(packed)
        if declared is not None:  # refuse a huge batch before decoding any of it
            _check_batch_size(declared, self._max_batch, "packed")
        assign = self._assign_for(context)

        def job() -> service_pb2.SubmitReportsResponse:
            try:
                request_id, items = self._pool.decode(lambda: unpack_batch_columns(packed, max_reports=self._max_batch))
            except (ProtocolError, TypeError) as exc:
                raise _FieldError("packed", str(exc)) from exc
            if request.request_id and request.request_id != request_id:
                raise _FieldError("request_id", "request_id differs from the packed batch's request_id")
            _check_batch_size(len(items), self._max_batch, "packed")
            self._metrics.batch_reports.labels(api="packed").observe(len(items))
            return self._submit(request_id, items, items.report_ids, assign)  # b"" for a malformed report

        return await self._run_charged(context, declared or 1, len(packed), job)

    async def GetResult(self, request: service_pb2.GetResultRequest,
                        context: Context) -> service_pb2.GetResultResponse:
        def job() -> service_pb2.GetResultResponse:
            return service_pb2.GetResultResponse(result=self._collector.get_result(request.campaign_id))

        return await self._pool.run(job)

    # Runs in the worker pool.
    def _submit(self, request_id: str, items: ReportColumns, report_ids: Sequence[bytes],
                assign: Assign | None = None) -> service_pb2.SubmitReportsResponse:
        results = self._collector.submit(request_id, items, assign=assign)
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


def _failure(exc: BaseException, method: str) -> status_pb2.Status:
    """The status a failed call answers; unexpected errors are logged with their traceback."""
    if _code_name(exc) == "INTERNAL":
        log.error("%s failed", method, exc_info=exc, extra={"method": method})
    return status_for_error(exc)


# Aborting a call raises an AbortError that gRPC keeps in a reference cycle with the handler's
# frame until the garbage collector runs. The handlers below therefore abort outside their except
# block (so the error, whose traceback holds the frames that saw the request, is not chained to
# it) and after dropping the request's bytes: a flood of refused requests of megabytes each must
# not stay in memory until a collection.

def _unary_handler(method: str, behavior: Callable[[Any, Context], Awaitable[Resp]], request_type: type[Req] | None,
                   metrics: CollectorMetrics) -> grpc.RpcMethodHandler[Any, Any]:
    """``behavior`` gets the parsed request, or the request's bytes when ``request_type`` is None
    (it then parses them itself, in the worker pool)."""
    async def handle(data: bytes, context: Context) -> Resp:
        start = time.perf_counter()
        code = "OK"
        try:
            try:
                return await behavior(data if request_type is None else _parse(request_type, data), context)
            except Exception as exc:
                if isinstance(exc, grpc.aio.AbortError):
                    raise
                code = _code_name(exc)
                status = _failure(exc, method)
            del data
            await _abort(context, status)
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
            try:
                async for item in behavior(_parse(request_type, data), context):
                    yield item
                return
            except Exception as exc:
                if isinstance(exc, grpc.aio.AbortError):
                    raise
                code = _code_name(exc)
                status = _failure(exc, method)
            del data
            await _abort(context, status)
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
              request_type: type[Message] | None) -> tuple[str, grpc.RpcMethodHandler[Any, Any]]:
        return name, _unary_handler(f"{service.rsplit('.', 1)[-1]}/{name}", behavior, request_type, metrics)

    device_handlers = dict([
        unary(DEVICE_SERVICE, "Enroll", device.Enroll, service_pb2.EnrollRequest),
        unary(DEVICE_SERVICE, "GetRoundSpec", device.GetRoundSpec, service_pb2.GetRoundSpecRequest),
        unary(DEVICE_SERVICE, "SubmitReports", device.SubmitReports, None),  # parsed in the worker pool
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


# -- refusals and undecodable requests -----------------------------------------------------------

class _RefusalLog:
    """Logs refused calls at most once per ``_LOG_EVERY_S``, with the number refused since the last
    line: a flood of refused calls must not flood the logs too."""

    def __init__(self) -> None:
        self._refused = 0
        self._last_log = -_LOG_EVERY_S

    def note(self, method: str, problem: str) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY_S:
            log.warning("refused %s: %s", method, problem,
                        extra={"method": method, "refused_since_last_log": self._refused})
            self._refused = 0
            self._last_log = now


class UndecodableRequestInterceptor(_ServerInterceptor):
    """Answer INVALID_ARGUMENT to requests of the standard services (health, reflection) that do not
    parse, and log them as refusals.

    gRPC itself answers such a request UNKNOWN with the parser's text and logs a traceback per
    message, so garbage sent to the health check would fill the logs. This wraps every handler that
    has a request deserializer (the collector's own services parse their bytes themselves and answer
    INVALID_ARGUMENT already): the request's bytes are parsed in the wrapper, and a failure aborts
    the call and is noted in a :class:`_RefusalLog`.

    Parameters
    ----------
    metrics : CollectorMetrics
        Refused requests are counted as ``INVALID_ARGUMENT`` calls of their method.
    """

    def __init__(self, metrics: CollectorMetrics) -> None:
        self._metrics = metrics
        self._refusals = _RefusalLog()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method, parse = handler_call_details.method, handler.request_deserializer
        refusals, metrics = self._refusals, self._metrics

        def decode(data: bytes) -> tuple[Any, status_pb2.Status | None]:
            """The parsed request, or the status refusing it (the caller aborts: see ``_unary_handler``)."""
            try:
                return parse(data), None
            except Exception as exc:  # the protobuf parser's DecodeError, or whatever a custom one raises
                problem = f"malformed request: {exc}"
            refusals.note(method, problem)
            metrics.rpcs.labels(method=method.lstrip("/"), code="INVALID_ARGUMENT").inc()
            return None, status_for_error(_FieldError("", problem))

        async def decode_one(data: bytes, context: Context) -> Any:
            request, refused = decode(data)
            del data
            if refused is not None:
                await _abort(context, refused)
            return request

        async def decode_stream(raw: AsyncIterator[bytes], context: Context) -> AsyncIterator[Any]:
            async def requests() -> AsyncIterator[Any]:
                async for data in raw:
                    request, refused = decode(data)
                    del data
                    if refused is not None:
                        await _abort(context, refused)
                    yield request

            return requests()

        serialize = handler.response_serializer
        prepare: Callable[[Any, Context], Awaitable[Any]]
        if handler.request_streaming:
            inner, prepare = handler.stream_stream or handler.stream_unary, decode_stream
        else:
            inner, prepare = handler.unary_stream or handler.unary_unary, decode_one
        behavior = _with_request(inner, prepare)
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(behavior, response_serializer=serialize)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(behavior, response_serializer=serialize)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(behavior, response_serializer=serialize)
        return grpc.unary_unary_rpc_method_handler(behavior, response_serializer=serialize)


def _with_request(inner: Any, prepare: Callable[[Any, Context], Awaitable[Any]]) -> Callable[..., Any]:
    """A behavior calling ``inner(await prepare(request, context), context)``, of ``inner``'s kind:
    an async generator when it is one, else a coroutine (which may write with ``context.write``)."""
    if inspect.isasyncgenfunction(inner):
        async def generator(request: Any, context: Context) -> AsyncIterator[Any]:
            prepared = prepare(request, context)
            del request  # not held by this frame while ``prepare`` may abort the call
            async for item in inner(await prepared, context):
                yield item

        return generator

    async def coroutine(request: Any, context: Context) -> Any:
        prepared = prepare(request, context)
        del request  # not held by this frame while ``prepare`` may abort the call
        return await inner(await prepared, context)

    return coroutine


# -- authentication -----------------------------------------------------------------------------

def _digest(token: str | bytes) -> bytes:
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


class BearerTokenInterceptor(_ServerInterceptor):
    """Require ``authorization: Bearer <token>`` on the methods of the protected services.

    Parameters
    ----------
    tokens_by_service : mapping of str to sequence of str
        Fully qualified service name -> accepted tokens. Services not listed (health,
        reflection, and ``DeviceService`` without device tokens or enrolment) are open.
    metrics : CollectorMetrics
    device_authority : EnrolmentAuthority, optional
        With enrolment on: ``DeviceService`` also accepts the device tokens this authority
        verifies (and is protected even without static device tokens), and ``Enroll`` is open.
    """

    def __init__(self, tokens_by_service: dict[str, Sequence[str]], metrics: CollectorMetrics, *,
                 device_authority: EnrolmentAuthority | None = None) -> None:
        self._digests = {f"/{service}/": tuple(_digest(t) for t in tokens)
                         for service, tokens in tokens_by_service.items() if tokens}
        self._authority = device_authority
        if device_authority is not None:
            self._digests.setdefault(f"/{DEVICE_SERVICE}/", ())
        self._metrics = metrics
        self._refusals = _RefusalLog()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method = handler_call_details.method
        prefix = method[: method.rfind("/") + 1]
        accepted = self._digests.get(prefix)
        handler = await continuation(handler_call_details)
        if accepted is None or handler is None or method == _ENROLL_METHOD:
            return handler
        authority = self._authority if prefix == f"/{DEVICE_SERVICE}/" else None
        problem = self._check(handler_call_details.invocation_metadata, accepted, authority)
        if problem is None:
            return handler
        service = prefix.strip("/")
        self._metrics.auth_failures.labels(service=service).inc()
        self._refusals.note(method, problem)
        return _deny(handler, problem)

    @staticmethod
    def _check(metadata: Any, accepted: tuple[bytes, ...], authority: EnrolmentAuthority | None = None) -> str | None:
        """``None`` when the metadata carries an accepted bearer token (a configured one, or one
        ``authority`` issued), else what is wrong."""
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
        if not ok and authority is not None:
            ok = authority.verify(token.strip()) is not None  # constant-time MAC comparison
        return None if ok else "invalid bearer token"


def _bearer_token(metadata: Any) -> str | None:
    """The token of the one ``authorization: Bearer <token>`` header, or ``None`` without one."""
    values = [value for key, value in (metadata or ()) if key == "authorization"]
    if len(values) != 1 or not isinstance(values[0], str):
        return None
    scheme, _, token = values[0].partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _deny(handler: grpc.RpcMethodHandler[Any, Any], problem: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same streaming shape that answers UNAUTHENTICATED without reading the request."""
    status = status_pb2.Status(code=code_pb2.UNAUTHENTICATED, message=problem)
    status.details.add().Pack(error_details_pb2.ErrorInfo(reason="UNAUTHENTICATED", domain=_ERROR_DOMAIN))

    async def deny(request: bytes, context: Context) -> NoReturn:
        await _abort(context, status)

    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny)
    return grpc.unary_unary_rpc_method_handler(deny)


# -- rate limits --------------------------------------------------------------------------------

def _bearer_digest(metadata: Any) -> bytes | None:
    """The digest of the one ``authorization: Bearer <token>`` header, or ``None`` without one."""
    values = [value for key, value in (metadata or ()) if key == "authorization"]
    if len(values) != 1 or not isinstance(values[0], str):
        return None
    scheme, _, token = values[0].partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return _digest(token.strip())


class RateLimitInterceptor(_ServerInterceptor):
    """Limit the calls per bearer token (requests/s, the operator token included).

    Placed after :class:`BearerTokenInterceptor`, it wraps the handler, so a call refused for a
    wrong token never reaches the limiter and made-up tokens cannot fill its table (bounded
    anyway). Calls without a bearer token are not limited here (the per-device limit keys them by
    address). Only the collector's own services are limited; health and reflection stay open.

    Parameters
    ----------
    limiter : RateLimiter
    metrics : CollectorMetrics
    """

    def __init__(self, limiter: RateLimiter, metrics: CollectorMetrics) -> None:
        self._limiter = limiter
        self._metrics = metrics
        self._prefixes = (f"/{DEVICE_SERVICE}/", f"/{OPERATOR_SERVICE}/")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(self._prefixes):
            return handler
        key = _bearer_digest(handler_call_details.invocation_metadata)
        if key is None or handler.request_streaming:
            return handler
        limiter, metrics = self._limiter, self._metrics

        async def check(context: Context) -> None:
            wait = limiter.try_acquire(key)
            metrics.rate_limit_keys.labels(limit=limiter.name).set(len(limiter))
            if wait > 0.0:
                metrics.rate_limited.labels(limit=limiter.name).inc()
                await _abort(context, status_for_error(RateLimitedError(
                    f"token rate limit exceeded ({limiter.rate:g} requests/s, burst {limiter.capacity:g}); "
                    f"retry in {wait:.3f} s", limit=limiter.name, retry_after=wait)))

        if handler.response_streaming:
            inner_stream: Any = handler.unary_stream

            async def limited_stream(request: Any, context: Context) -> AsyncIterator[Any]:
                await check(context)
                async for item in inner_stream(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                limited_stream, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        inner: Any = handler.unary_unary

        async def limited(request: Any, context: Context) -> Any:
            await check(context)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            limited, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


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
    _pool: _WorkerPool | None = None
    _tick: asyncio.Task[None] | None = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _stop_requested: asyncio.Event = field(default_factory=asyncio.Event)
    _grace: float | None = None
    _closed: bool = False
    #: The start completed; a failed start's cleanup logs no "shutting down" for a server that never served.
    _serving: bool = False

    async def start(self) -> None:
        config = self.config
        self._pool = _WorkerPool(config.worker_threads, config.max_queued_calls, self.metrics,
                                 max_queued_bytes=config.max_queued_bytes)
        tokens: dict[str, Sequence[str]] = {OPERATOR_SERVICE: (config.operator_token,) if config.operator_token else ()}
        if config.device_tokens or config.enrolment:
            tokens[DEVICE_SERVICE] = config.device_tokens + ((config.operator_token,) if config.operator_token else ())
        authority = EnrolmentAuthority(config.enrolment_secret) if config.enrolment else None
        enrolment_limiter = EnrolmentLimiter(
            rate=config.enrolment_rate, burst=config.enrolment_burst, peer_rate=config.enrolment_peer_rate,
            peer_burst=config.enrolment_peer_burst) if config.enrolment else None
        interceptors: list[_ServerInterceptor] = [
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
        _add_services(server, device, operator, self.metrics)
        self._health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (DEVICE_SERVICE, OPERATOR_SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), server)

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
