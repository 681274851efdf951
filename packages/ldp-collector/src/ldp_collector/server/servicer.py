"""The two servicers: *request -> plain handler (:class:`~ldp_collector.core.Collector`) -> response*.

``DeviceService`` (:class:`CollectorServicer`) and ``OperatorService`` (:class:`OperatorServicer`)
check request-level limits (``request_id``, batch size) on the event loop, then run one blocking
job (proto -> SDK objects, the collector call, which waits on the durable group commit, and the
response encoding) in the :class:`~ldp_collector.server.worker_pool.WorkerPool`. Report batches are
decoded column by column (:class:`~ldp_client.report.ReportColumns`), never into one object per
report, on the pool's one decoder thread, and their size is known first: a packed batch's
declared report count and a ``SubmitReports`` request's count (read from the wire by
:func:`~ldp_collector.server.wire.count_messages`; the request is parsed in the pool) are checked
on the event loop. Domain errors propagate as exceptions; :mod:`ldp_collector.server.handlers`
maps them to status codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter as _Counter
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

from ldp.v1 import campaigns_pb2, service_pb2, service_pb2_grpc
from ldp_client import serde
from ldp_client.errors import LdpError, ProtocolError
from ldp_client.report import MAX_REQUEST_ID, ReportColumns, declared_batch_size, unpack_batch_columns

from ..core import Collector
from ..defences import EnrolmentAuthority, EnrolmentLimiter, peer_address
from ..errors import CollectorError, ErrorReason, FailedPreconditionError, InvalidArgumentError, OverloadedError
from ..ingest import Assign
from ..model import CampaignState
from ..ratelimit import RateLimiter
from ..serde import campaign_to_proto, config_from_proto, estimates_to_proto, result_to_proto
from ..storage.base import Outcome
from ..telemetry import CollectorMetrics
from .interceptors import bearer_digest, bearer_token
from .status import Context, field_path
from .wire import count_messages, parse_request, submit_response
from .worker_pool import WorkerPool

__all__ = ["CollectorServicer", "FinishedResults", "OperatorServicer"]

_FINAL_STATES = (campaigns_pb2.FINISHED, campaigns_pb2.FAILED)
_OUTCOME_NAMES = {Outcome.ACCEPTED: "accepted", Outcome.DUPLICATE: "duplicate", Outcome.REJECTED: "rejected"}

T = TypeVar("T")


def _check_request_id(request_id: str, field_name: str = "request_id") -> None:
    if not request_id:
        raise InvalidArgumentError(f"{field_name} must not be empty", field=field_name)
    if len(request_id) > MAX_REQUEST_ID:
        raise InvalidArgumentError(f"{field_name} must be at most {MAX_REQUEST_ID} characters, got {len(request_id)}",
                                   field=field_name)


def _check_batch_size(n: int, limit: int, field_name: str) -> None:
    if n > limit:
        raise InvalidArgumentError(f"a batch holds at most {limit} reports, got {n}", field=field_name,
                                   reason=ErrorReason.BATCH_TOO_LARGE)


class FinishedResults:
    """``GetResult`` answers, converted to the wire once per finished campaign.

    A finished campaign's result never changes, and every device of a clustering campaign asks for
    it to label itself; reading it back from the store into the model (which validates a grid
    clustering's cell map) and converting it again would cost far more than the answer's bytes.
    The answers of finished campaigns are kept, least recently used first out, within
    ``max_bytes`` of serialized answers; other states are read afresh on every call.
    """

    def __init__(self, collector: Collector, *, max_bytes: int = 64 * 2**20) -> None:
        self._collector = collector
        self._max_bytes = max_bytes
        self._answers: OrderedDict[str, tuple[service_pb2.GetResultResponse, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def response(self, campaign_id: str) -> service_pb2.GetResultResponse:
        """The ``GetResultResponse`` of ``campaign_id`` (``NotFoundError`` for an unknown campaign)."""
        with self._lock:
            cached = self._answers.get(campaign_id)
            if cached is not None:
                self._answers.move_to_end(campaign_id)
                return cached[0]
        result = self._collector.get_result(campaign_id)
        answer = service_pb2.GetResultResponse(result=result_to_proto(result))
        size = answer.ByteSize()
        if result.state == CampaignState.FINISHED and size <= self._max_bytes:
            with self._lock:
                if campaign_id not in self._answers:
                    self._answers[campaign_id] = (answer, size)
                    self._bytes += size
                while self._bytes > self._max_bytes:
                    _, (_, dropped) = self._answers.popitem(last=False)
                    self._bytes -= dropped
        return answer


class CollectorServicer(service_pb2_grpc.DeviceServiceServicer):
    """``ldp.v1.DeviceService``: round specs, report ingestion, results for devices.

    Parameters
    ----------
    collector : Collector
    pool : WorkerPool
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

    def __init__(self, collector: Collector, pool: WorkerPool, metrics: CollectorMetrics, *,
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
        self._results = FinishedResults(collector)

    def _assign_for(self, context: Context) -> Assign | None:
        """The assignment function of the calling enrolled device, or ``None`` for other callers."""
        authority = self._authority
        if authority is None:
            return None
        token = bearer_token(context.invocation_metadata())
        identity = authority.verify(token) if token is not None else None
        if identity is None:
            return None
        device_id = identity.device_id
        return lambda campaign_id, round: authority.assignment(device_id, campaign_id, round)

    async def Enroll(self, request: service_pb2.EnrollRequest, context: Context) -> service_pb2.EnrollResponse:
        authority, limiter = self._authority, self._enrolment_limiter
        if authority is None:
            raise FailedPreconditionError("device enrolment is off on this collector", reason=ErrorReason.ENROLMENT_DISABLED)
        if limiter is not None:
            wait = limiter.admit(peer_address(context.peer()))
            if wait is not None:
                raise OverloadedError(f"too many enrolments; retry in {wait:.3f} s", retry_after=wait,
                                     reason=ErrorReason.ENROLMENT_RATE_LIMITED)
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
        digest = bearer_digest(context.invocation_metadata()) if self._device_key_by_token else None
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
            spec, finished = self._collector.get_round_spec(request.campaign_id, request.supported_capabilities)
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
        count = count_messages(data, service_pb2.SubmitReportsRequest.REPORTS_FIELD_NUMBER, self._max_batch)
        if count > self._max_batch:
            raise InvalidArgumentError(f"a batch holds at most {self._max_batch} reports, got more", field="reports",
                                       reason=ErrorReason.BATCH_TOO_LARGE)
        assign = self._assign_for(context)

        def decode() -> tuple[str, ReportColumns, Sequence[bytes]]:
            # The parsed message is dropped on return: it takes up to 10 times the request's bytes.
            request = parse_request(service_pb2.SubmitReportsRequest, data)
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
                raise InvalidArgumentError(str(exc), field="packed") from exc
            if request.request_id and request.request_id != request_id:
                raise InvalidArgumentError("request_id differs from the packed batch's request_id", field="request_id")
            _check_batch_size(len(items), self._max_batch, "packed")
            self._metrics.batch_reports.labels(api="packed").observe(len(items))
            return self._submit(request_id, items, items.report_ids, assign)  # b"" for a malformed report

        return await self._run_charged(context, declared or 1, len(packed), job)

    async def GetResult(self, request: service_pb2.GetResultRequest,
                        context: Context) -> service_pb2.GetResultResponse:
        def job() -> service_pb2.GetResultResponse:
            return self._results.response(request.campaign_id)

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
        return submit_response(report_ids, results)

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
        kind = campaign.config.kind
        self._kinds[campaign_id] = kind
        return kind


class OperatorServicer(service_pb2_grpc.OperatorServiceServicer):
    """``ldp.v1.OperatorService``: campaigns, rounds, estimates, results, progress.

    Parameters
    ----------
    collector : Collector
    pool : WorkerPool
    metrics : CollectorMetrics
    poll_interval : float
        Seconds between the checks of ``WatchCampaign``.
    stopping : asyncio.Event
        Set when the server shuts down; open ``WatchCampaign`` streams then end.
    """

    def __init__(self, collector: Collector, pool: WorkerPool, metrics: CollectorMetrics, *,
                 poll_interval: float, stopping: asyncio.Event) -> None:
        self._collector = collector
        self._pool = pool
        self._metrics = metrics
        self._poll = poll_interval
        self._stopping = stopping
        self._results = FinishedResults(collector)

    async def CreateCampaign(self, request: service_pb2.CreateCampaignRequest,
                             context: Context) -> campaigns_pb2.Campaign:
        if not request.HasField("config"):
            raise InvalidArgumentError("config is required", field="config", reason=ErrorReason.INVALID_CAMPAIGN_CONFIG)

        def job() -> campaigns_pb2.Campaign:
            try:
                return campaign_to_proto(self._collector.create_campaign(config_from_proto(request.config)))
            except (InvalidArgumentError, LdpError) as exc:
                # Configuration messages name their field relative to the configuration
                # ("grid.max_iterations must be ..."): the wire's path starts at the request.
                raise InvalidArgumentError(
                    str(exc), field=field_path(str(exc), campaigns_pb2.CampaignConfig, "config"),
                    reason=ErrorReason.INVALID_CAMPAIGN_CONFIG) from exc

        return await self._pool.run(job)

    async def ListCampaigns(self, request: service_pb2.ListCampaignsRequest,
                            context: Context) -> service_pb2.ListCampaignsResponse:
        def job() -> service_pb2.ListCampaignsResponse:
            campaigns, next_token = self._collector.list_campaigns(request.page_size, request.page_token)
            return service_pb2.ListCampaignsResponse(campaigns=[campaign_to_proto(c) for c in campaigns],
                                                     next_page_token=next_token)

        return await self._pool.run(job)

    async def GetCampaign(self, request: service_pb2.GetCampaignRequest,
                          context: Context) -> campaigns_pb2.Campaign:
        return await self._pool.run(lambda: campaign_to_proto(self._collector.get_campaign(request.campaign_id)))

    async def CloseRound(self, request: service_pb2.CloseRoundRequest, context: Context) -> campaigns_pb2.Campaign:
        campaign = await self._pool.run(
            lambda: campaign_to_proto(self._collector.close_round(request.campaign_id, request.round)))
        self._metrics.rounds_closed.labels(trigger="operator").inc()
        return campaign

    async def GetEstimates(self, request: service_pb2.GetEstimatesRequest,
                           context: Context) -> campaigns_pb2.Estimates:
        return await self._pool.run(
            lambda: estimates_to_proto(
                self._collector.get_estimates(request.campaign_id, request.round, request.confidence)))

    async def GetResult(self, request: service_pb2.GetResultRequest,
                        context: Context) -> service_pb2.GetResultResponse:
        def job() -> service_pb2.GetResultResponse:
            return self._results.response(request.campaign_id)

        return await self._pool.run(job)

    async def WatchCampaign(self, request: service_pb2.WatchCampaignRequest,
                            context: Context) -> AsyncIterator[service_pb2.CampaignEvent]:
        """Yield the campaign's state now and after every change (reports, rounds, state), until
        it finishes or fails, the client cancels, or the server shuts down."""
        last = b""
        self._metrics.watch_streams.inc()
        try:
            while True:
                event = await self._pool.run(lambda: self._campaign_event(request.campaign_id), shed=False)
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

    def _campaign_event(self, campaign_id: str) -> service_pb2.CampaignEvent:
        campaign, reports = self._collector.campaign_events(campaign_id)
        return service_pb2.CampaignEvent(campaign=campaign_to_proto(campaign), current_round_reports=reports)

