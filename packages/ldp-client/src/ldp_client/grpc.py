"""Talking to the collector over gRPC (the ``[grpc]`` extra): fetch rounds, send reports, get results.

:class:`CollectorClient` wraps ``ldp.v1.DeviceService``. Every call is retried on ``UNAVAILABLE``,
``DEADLINE_EXCEEDED`` and ``RESOURCE_EXHAUSTED`` with full-jitter exponential backoff
(``uniform(0, min(backoff_max, backoff_base * 2**attempt))``, randomness from the injected ``rng``),
or after the server's ``google.rpc.RetryInfo`` delay when the status carries one. Submissions are
idempotent: each batch gets a random ``request_id`` that is reused on every retry of that batch, and
the collector deduplicates on it and on the report ids. Other status codes are not retried:
``INVALID_ARGUMENT``, ``NOT_FOUND``, ``FAILED_PRECONDITION``, ``OUT_OF_RANGE`` and ``ALREADY_EXISTS``
raise :class:`RequestRejectedError` (a :class:`~ldp_client.errors.ProtocolError`), everything else
(after the retries where they apply) :class:`RpcFailedError` (a
:class:`~ldp_client.errors.TransportError`); both carry the status code and message.

:class:`Sender` drains a :class:`~ldp_client.device.Device`'s outbox::

    outcome = Sender(device, client).drain()

Accepted and duplicate reports are acknowledged (removed from the outbox). A *rejected* report is
removed as well -- resending the same bytes cannot succeed, and the device never re-samples -- and
returned in :attr:`DrainResult.rejected` with the collector's :class:`~ldp_client.errors.RejectionCode`
(``code``, for programs) and reason (``reason``, words for people), so the app can log or surface
it. Its budget stays charged.

Between two rounds -- while the collector runs the server step that turns one round's reports into
the next round's spec, or resumes such a step after a restart -- there is no spec to fetch. That is
not an error: :meth:`CollectorClient.poll_round_spec` returns a :class:`~ldp_client.spec.RoundNotOpen`
saying how long to wait before asking again, and :meth:`CollectorClient.get_round_spec` does that
wait itself (within the client's retry budget)::

    answer = client.poll_round_spec("traffic-2026")
    if isinstance(answer, RoundNotOpen):
        schedule_next_check(answer.retry_after)                 # nothing to do until then
    elif answer is not None and not device.has_reported(answer.campaign_id, answer.round):
        device.participate(answer, value)

With enrolment on, a device first gets its identity, then reports with the collector's assigned
report id and hash seeds (one report per round; local-hashing seeds are not the device's choice)::

    client.enroll()                                            # token kept for later calls
    fetched = client.get_round("traffic-2026")                 # (spec, assignment) or None; poll_round too
    if fetched is not None:
        spec, assignment = fetched
        device.participate(spec, value, assignment=assignment)

Keep the token (:attr:`CollectorClient.device_token`) with the device's state: a new enrolment is
a new identity, and enrolment is rate limited.

A finished clustering campaign's result labels the device locally, at no privacy cost (public data
only: nothing is reported, no budget is charged)::

    label = client.cluster_label("traffic-2026", (latitude, longitude))

Importing this module without grpcio, grpcio-status or ldp-proto raises ``ImportError`` with the
install hint ``pip install "ldp-client[grpc]"``.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

try:
    import grpc
    from google.rpc import error_details_pb2  # type: ignore[import-untyped, unused-ignore]
    from grpc_status import rpc_status

    from ldp.v1 import campaigns_pb2, service_pb2, service_pb2_grpc
except ImportError as _exc:
    raise ImportError(
        f'ldp_client.grpc needs grpcio, grpcio-status and ldp-proto ({_exc}); install them with: '
        'pip install "ldp-client[grpc]"') from _exc

from ._validation import check_float, check_int
from .capabilities import (
    MISSING_CAPABILITIES_METADATA,
    MISSING_CAPABILITIES_REASON,
    check_capabilities,
    supported_capabilities,
)
from .clusters import ClusterModel
from .device import Device, RoundAssignment
from .errors import InvalidParameterError, MissingCapabilitiesError, ProtocolError, RejectionCode, TransportError
from .report import MAX_BATCH_BYTES, MAX_BATCH_REPORTS, REPORT_ID_BYTES, Report, _field_bytes, batch_slices, pack_batch
from .rng import Rng, resolve_rng
from .serde import cluster_model_from_proto, report_to_proto, round_spec_from_proto
from .spec import ERROR_DOMAIN, MAX_RETRY_AFTER, ROUND_NOT_OPEN_REASON, RoundNotOpen, RoundSpec, check_campaign_id

__all__ = [
    "CollectorClient",
    "DrainResult",
    "OutcomeStatus",
    "RejectedReport",
    "RejectionCode",
    "ReportOutcome",
    "RoundNotOpen",
    "RequestRejectedError",
    "RpcFailedError",
    "Sender",
    "call_error",
    "drain",
    "retry_delay",
]

_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.RESOURCE_EXHAUSTED})
_REJECTED = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                       grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE,
                       grpc.StatusCode.ALREADY_EXISTS})
#: Extra random delay on top of a server's RetryInfo delay, as a fraction of it (de-synchronizes devices).
_RETRY_INFO_JITTER = 0.2
#: Wait before asking again when a collector answers "no open round" without a delay (collectors
#: before the UNAVAILABLE + RetryInfo answer sent a response with neither a spec nor ``finished``).
_ROUND_NOT_OPEN_DEFAULT_WAIT = 1.0
#: Largest message received: a round spec, a result or the outcomes of a batch (64 MiB, plus room
#: for the envelope).
_RECEIVE_LIMIT = 64 * 1024 * 1024 + (1 << 20)
#: Bytes of a request id field (``_request_id``: 32 hex characters).
_REQUEST_ID_FIELD = 2 + 2 * REPORT_ID_BYTES
#: Bytes a batch's reports may take in a ``SubmitReportsRequest``, and in the packed batch of a
#: ``SubmitPackedRequest``: the collector's limit less the request id field and, for the packed
#: batch, the ``packed`` field's tag and length (3 bytes up to 2 MiB) and the batch's own header
#: ``[1, request_id, [...]]`` (array, version, the id as a msgpack string, a 16-bit array length).
_REPORTS_BYTES = MAX_BATCH_BYTES - _REQUEST_ID_FIELD
_PACKED_REPORTS_BYTES = MAX_BATCH_BYTES - _REQUEST_ID_FIELD - (1 + 3) - (1 + 1 + _REQUEST_ID_FIELD + 3)

Resp = TypeVar("Resp")


class RequestRejectedError(ProtocolError):
    """The collector refused the request itself (bad argument, unknown campaign, closed round ...).

    Attributes
    ----------
    method : str
        The RPC (``"SubmitReports"`` ...).
    code : grpc.StatusCode
    details : str
        The collector's message.
    """

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        self.method = method
        self.code = code
        self.details = details
        super().__init__(f"collector rejected {method}: {code.name}: {details}")


class RpcFailedError(TransportError):
    """A call failed for good: a non-retryable status, or retries exhausted.

    Attributes
    ----------
    method : str
    code : grpc.StatusCode
    details : str
    attempts : int
        Calls made.
    retry_after : float or None
        The server's RetryInfo delay when it asked for a longer wait than ``backoff_max``, or the
        wait the collector asked for when it still had no open round after the retries of
        :meth:`CollectorClient.get_round_spec`: try again (e.g. :meth:`Sender.drain`) no sooner
        than this many seconds from now.
    """

    def __init__(self, method: str, code: grpc.StatusCode, details: str, attempts: int,
                 retry_after: float | None = None) -> None:
        self.method = method
        self.code = code
        self.details = details
        self.attempts = attempts
        self.retry_after = retry_after
        hint = f"; the collector asks to retry after {retry_after:g} s" if retry_after is not None else ""
        super().__init__(f"{method} failed after {attempts} attempt(s): {code.name}: {details}{hint}")


class OutcomeStatus(enum.IntEnum):
    """What the collector did with one report (values equal ``ldp.v1.ReportOutcome.Status``)."""

    ACCEPTED = 1
    DUPLICATE = 2
    REJECTED = 3


@dataclass(frozen=True, slots=True)
class ReportOutcome:
    """The collector's answer for one report: for a rejected one, its ``code`` (what a program
    reads) and ``reason`` (words for people; a collector older than the codes sends only these)."""

    report_id: bytes
    status: OutcomeStatus
    reason: str = ""
    code: RejectionCode = RejectionCode.UNSPECIFIED


@dataclass(frozen=True, slots=True)
class RejectedReport:
    """A report the collector rejected for good, with its code and reason (already removed from the outbox)."""

    report: Report
    reason: str
    code: RejectionCode = RejectionCode.UNSPECIFIED


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What :meth:`Sender.drain` did."""

    accepted: int
    duplicates: int
    rejected: tuple[RejectedReport, ...]

    @property
    def sent(self) -> int:
        return self.accepted + self.duplicates + len(self.rejected)


class CollectorClient:
    """A client of the collector's ``ldp.v1.DeviceService``.

    Parameters
    ----------
    target : str
        ``host:port`` of the collector.
    credentials : grpc.ChannelCredentials, optional
        TLS (or mTLS) credentials; ``None`` opens an insecure channel (tests, local networks).
    device_token : str, optional
        Sent as ``authorization: Bearer <token>`` metadata on every call.
    timeout : float
        Deadline of each attempt, in seconds (0, 3600].
    max_batch : int
        Most reports per ``SubmitReports``/``SubmitPacked`` call, in [1, 10000]
        (:data:`~ldp_client.report.MAX_BATCH_REPORTS`); a call also holds at most
        :data:`~ldp_client.report.MAX_BATCH_BYTES` bytes, so batches of large reports hold fewer.
    max_attempts : int
        Calls per request including the first, in [1, 100].
    backoff_base, backoff_max : float
        Full-jitter backoff: attempt ``a`` (from 1) waits ``uniform(0, min(backoff_max,
        backoff_base * 2**(a - 1)))`` seconds. A RetryInfo delay from the server replaces it (plus up
        to 20% jitter); one longer than ``backoff_max`` stops the retries with
        :class:`RpcFailedError` carrying ``retry_after``.
    rng : Rng, optional
        Randomness of the jitter and the request ids; defaults to the OS CSPRNG.
    sleep : callable, optional
        Waits the given seconds (``time.sleep``); injectable for tests.
    options : sequence of (str, Any), optional
        Extra gRPC channel options.
    capabilities : iterable of str, optional
        The capabilities stated in every ``GetRoundSpec`` (``docs/protocol.md`` §10): by default
        everything this SDK runs; a restricted device passes the same subset as to its
        :class:`~ldp_client.device.Device`. A round that needs anything else raises
        :class:`~ldp_client.errors.MissingCapabilitiesError`, whether the collector declines to
        send it or sends it anyway.
    """

    def __init__(self, target: str, *, credentials: grpc.ChannelCredentials | None = None,
                 device_token: str | None = None, timeout: float = 10.0, max_batch: int = 1000,
                 max_attempts: int = 6, backoff_base: float = 0.2, backoff_max: float = 10.0,
                 rng: Rng | None = None, sleep: Callable[[float], None] = time.sleep,
                 options: Sequence[tuple[str, Any]] = (), capabilities: Iterable[str] | None = None) -> None:
        if not isinstance(target, str) or not target:
            raise InvalidParameterError(f"target must be a non-empty 'host:port' string, got {target!r}")
        if device_token is not None and (not isinstance(device_token, str) or not device_token
                                         or any(c in device_token for c in "\r\n")):
            raise InvalidParameterError("device_token must be a non-empty single-line string")
        self._timeout = check_float("timeout", timeout, 0.0, 3600.0, low_open=True)
        self._max_batch = check_int("max_batch", max_batch, 1, MAX_BATCH_REPORTS)
        self._max_attempts = check_int("max_attempts", max_attempts, 1, 100)
        self._backoff_base = check_float("backoff_base", backoff_base, 0.0, 3600.0)
        self._backoff_max = check_float("backoff_max", backoff_max, 0.0, 3600.0)
        self._rng = resolve_rng(rng)
        self._sleep = sleep
        self._capabilities = supported_capabilities(capabilities)
        self._device_token = device_token
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {device_token}"),) if device_token is not None else ())
        channel_options = [("grpc.max_send_message_length", MAX_BATCH_BYTES),
                           ("grpc.max_receive_message_length", _RECEIVE_LIMIT), *options]
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=channel_options)
        else:
            self._channel = grpc.secure_channel(target, credentials, options=channel_options)
        self._stub = service_pb2_grpc.DeviceServiceStub(self._channel)

    @property
    def max_batch(self) -> int:
        return self._max_batch

    @property
    def capabilities(self) -> frozenset[str]:
        """The capabilities this client states when it asks for a round."""
        return self._capabilities

    @property
    def device_token(self) -> str | None:
        """The bearer token sent with every call (given, or obtained by :meth:`enroll`)."""
        return self._device_token

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> CollectorClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ calls

    def get_round_spec(self, campaign_id: str) -> RoundSpec | None:
        """The campaign's current round, or ``None`` once the campaign is finished.

        Between two rounds (the collector is computing the next one) this waits and asks again
        after the delay the collector names, like any retried call: up to ``max_attempts`` asks,
        each wait at most ``backoff_max``. It keeps its contract of earlier releases -- a spec or
        ``None`` -- so existing callers need no change; an app that would rather not block uses
        :meth:`poll_round_spec`, which returns the "not yet" answer instead of waiting.

        Raises
        ------
        MissingCapabilitiesError
            The round needs capabilities the client did not state (the collector declined to send
            it, or sent it anyway).
        RequestRejectedError
            E.g. ``NOT_FOUND`` for an unknown campaign.
        ProtocolError
            The collector sent a spec that does not validate.
        RpcFailedError
            The collector could not be reached, or still had no open round after the retries
            (``retry_after`` then says when to ask again).
        """
        return self._round_spec_of(self._wait_for_round(campaign_id))

    def poll_round_spec(self, campaign_id: str) -> RoundSpec | RoundNotOpen | None:
        """The campaign's current round now: a spec, "not yet", or ``None`` once finished.

        Unlike :meth:`get_round_spec` this never waits for the next round: between two rounds it
        returns :class:`~ldp_client.spec.RoundNotOpen` at once, with the seconds to wait before
        asking again. (Transport failures and overload are still retried as for every call.)

        Returns
        -------
        RoundSpec, RoundNotOpen or None

        Raises
        ------
        RequestRejectedError, ProtocolError, RpcFailedError
            As for :meth:`get_round_spec`.
        """
        polled = self._poll_round(campaign_id)
        return polled if isinstance(polled, RoundNotOpen) else self._round_spec_of(polled)

    def get_round(self, campaign_id: str) -> tuple[RoundSpec, RoundAssignment | None] | None:
        """The campaign's current round and this device's assignment for it (enrolled devices).

        Waits between two rounds as :meth:`get_round_spec` does; :meth:`poll_round` does not.

        Returns
        -------
        (RoundSpec, RoundAssignment or None) or None
            ``None`` once the campaign is finished; the assignment is ``None`` when the collector
            sent none (the caller is not an enrolled device). Pass it to
            :meth:`Device.participate <ldp_client.device.Device.participate>`.

        Raises
        ------
        RequestRejectedError, ProtocolError, RpcFailedError
            As for :meth:`get_round_spec`; ``ProtocolError`` also for a malformed assignment.
        """
        return self._round_of(self._wait_for_round(campaign_id))

    def poll_round(self, campaign_id: str) -> tuple[RoundSpec, RoundAssignment | None] | RoundNotOpen | None:
        """:meth:`get_round` without waiting: :class:`~ldp_client.spec.RoundNotOpen` between two rounds."""
        polled = self._poll_round(campaign_id)
        return polled if isinstance(polled, RoundNotOpen) else self._round_of(polled)

    def enroll(self) -> str:
        """Obtain a new device identity from the collector and use its token for every later call.

        The call itself needs no token. It is rate limited: the collector answers UNAVAILABLE with
        RetryInfo when too many devices enrol, and the call is retried after that delay.

        Returns
        -------
        str
            The device token; store it with the device's state and pass it as ``device_token``
            next time (a new enrolment is a new identity).

        Raises
        ------
        RequestRejectedError, RpcFailedError
            Enrolment is off (UNIMPLEMENTED) or refused, or the collector could not be reached.
        """
        response = self._call("Enroll", self._stub.Enroll, service_pb2.EnrollRequest())
        token = response.device_token
        if not token or any(c in token for c in "\r\n") or not token.isascii():
            raise ProtocolError("Enroll: the collector returned an empty or malformed device token")
        self._device_token = token
        self._metadata = (("authorization", f"Bearer {token}"),)
        return token

    def get_result(self, campaign_id: str) -> campaigns_pb2.Result:
        """The campaign's published result (``ldp.v1.Result``); :meth:`get_cluster_model` labels the device with it."""
        check_campaign_id(campaign_id)
        response = self._call("GetResult", self._stub.GetResult,
                              service_pb2.GetResultRequest(campaign_id=campaign_id))
        return response.result

    def get_cluster_model(self, campaign_id: str) -> ClusterModel:
        """The published clustering of a finished campaign, as a local labelling model.

        Reads only public data (the campaign's ``GetResult``): nothing about the device is sent and
        no privacy budget is charged. Fetch the model once and keep it (its
        :meth:`~ldp_client.clusters.CellClusterModel.to_dict` form is msgpack-friendly) to label
        many points or to label offline.

        Returns
        -------
        CellClusterModel or CenterModel
            See :func:`ldp_client.serde.cluster_model_from_proto`.

        Raises
        ------
        RequestRejectedError
            E.g. ``NOT_FOUND`` for an unknown campaign.
        ProtocolError
            The campaign is not finished, published no clustering, or its clustering does not
            validate.
        RpcFailedError
            The collector could not be reached.
        """
        return cluster_model_from_proto(self.get_result(campaign_id))

    def cluster_label(self, campaign_id: str, point: Any) -> int:
        """The cluster the device's point belongs to in a finished campaign's published clustering.

        ``get_cluster_model(campaign_id).label(point)``: the model is fetched (public data only) and
        the point is labelled on the device -- it never leaves it, nothing is reported and no
        privacy budget is charged. ``-1`` means noise (grid clusterings). Each call fetches the
        result again; to label several points keep the model of :meth:`get_cluster_model`.

        Raises
        ------
        EncodingError
            The point has the wrong dimension or type, or a NaN or infinite coordinate.
        RequestRejectedError, ProtocolError, RpcFailedError
            As for :meth:`get_cluster_model`.
        """
        return self.get_cluster_model(campaign_id).label(point)

    def submit(self, reports: Sequence[Report]) -> list[ReportOutcome]:
        """Send reports with ``SubmitReports`` in batches of at most ``max_batch`` reports and
        :data:`~ldp_client.report.MAX_BATCH_BYTES` bytes; one outcome per report, in order.

        Raises
        ------
        RequestRejectedError, RpcFailedError
            A batch failed; the outcomes of earlier batches are lost to the caller but the collector
            kept them (resending is safe: it deduplicates). :class:`Sender` sends batch by batch.
        """
        outcomes: list[ReportOutcome] = []
        messages = [report_to_proto(r) for r in self._checked(reports)]
        sizes = [_field_bytes(m.ByteSize()) for m in messages]  # as elements of the repeated field
        for part in batch_slices(sizes, max_reports=self._max_batch, max_bytes=_REPORTS_BYTES):
            request = service_pb2.SubmitReportsRequest(request_id=self._request_id(), reports=messages[part])
            outcomes += self._outcomes(reports[part], self._call("SubmitReports", self._stub.SubmitReports, request))
        return outcomes

    def submit_packed(self, reports: Sequence[Report]) -> list[ReportOutcome]:
        """Like :meth:`submit`, with ``SubmitPacked`` and the msgpack batch of :func:`~ldp_client.report.pack_batch`."""
        outcomes: list[ReportOutcome] = []
        sizes = [len(r.pack()) for r in self._checked(reports)]
        for part in batch_slices(sizes, max_reports=self._max_batch, max_bytes=_PACKED_REPORTS_BYTES):
            batch = reports[part]
            request_id = self._request_id()
            request = service_pb2.SubmitPackedRequest(request_id=request_id, packed=pack_batch(request_id, batch))
            outcomes += self._outcomes(batch, self._call("SubmitPacked", self._stub.SubmitPacked, request))
        return outcomes

    # ------------------------------------------------------------------ internals

    def _poll_round(self, campaign_id: str) -> service_pb2.GetRoundSpecResponse | RoundNotOpen:
        """One ``GetRoundSpec`` ask: a response with a spec or ``finished``, or "not yet"."""
        check_campaign_id(campaign_id)
        request = service_pb2.GetRoundSpecRequest(campaign_id=campaign_id,
                                                  supported_capabilities=sorted(self._capabilities))
        try:
            response = self._call("GetRoundSpec", self._stub.GetRoundSpec, request, round_not_open=True)
        except _RoundNotOpenAnswer as answer:
            return RoundNotOpen(campaign_id=campaign_id, retry_after=answer.retry_after)
        if response.finished or response.HasField("spec"):
            return response
        # What collectors before the UNAVAILABLE + RetryInfo answer sent between two rounds.
        return RoundNotOpen(campaign_id=campaign_id, retry_after=_ROUND_NOT_OPEN_DEFAULT_WAIT)

    def _wait_for_round(self, campaign_id: str) -> service_pb2.GetRoundSpecResponse:
        """Ask until a round is open or the campaign finished, waiting as the collector says (retry budget)."""
        attempt = 0
        while True:
            attempt += 1
            polled = self._poll_round(campaign_id)
            if not isinstance(polled, RoundNotOpen):
                return polled
            if attempt >= self._max_attempts or polled.retry_after > self._backoff_max:
                raise RpcFailedError("GetRoundSpec", grpc.StatusCode.UNAVAILABLE,
                                     f"campaign {campaign_id} has no open round yet (the collector is "
                                     f"preparing the next one)", attempt, retry_after=polled.retry_after)
            self._sleep(self._backoff(attempt, polled.retry_after))

    def _round_spec_of(self, response: service_pb2.GetRoundSpecResponse) -> RoundSpec | None:
        return None if response.finished else self._spec_of(response)

    def _spec_of(self, response: service_pb2.GetRoundSpecResponse) -> RoundSpec:
        """The response's spec, if this client can run it (a collector may send it though it should not).

        The stated list is checked first, before any task is parsed: an encoder or mechanism added
        after this SDK would not parse. Parsing then checks that the list is the tasks' own.
        """
        campaign_id = response.spec.campaign_id
        check_capabilities(campaign_id, response.spec.required_capabilities, self._capabilities)
        spec = round_spec_from_proto(response.spec)
        check_capabilities(campaign_id, spec.required_capabilities, self._capabilities)
        return spec

    def _round_of(self, response: service_pb2.GetRoundSpecResponse) -> tuple[RoundSpec, RoundAssignment | None] | None:
        if response.finished:
            return None
        spec = self._spec_of(response)
        if not response.HasField("assignment"):
            return spec, None
        assignment = RoundAssignment(report_id=response.assignment.report_id,
                                     hash_seeds=tuple(response.assignment.hash_seeds))
        return spec, assignment

    @staticmethod
    def _checked(reports: Sequence[Report]) -> Sequence[Report]:
        for r in reports:
            if not isinstance(r, Report):
                raise TypeError(f"reports must be Report objects, got {type(r).__name__}")
        return reports

    def _request_id(self) -> str:
        return self._rng.token_bytes(REPORT_ID_BYTES).hex()

    @staticmethod
    def _outcomes(batch: Sequence[Report], response: service_pb2.SubmitReportsResponse) -> list[ReportOutcome]:
        if len(response.outcomes) != len(batch):
            raise ProtocolError(f"collector answered {len(response.outcomes)} outcomes for {len(batch)} reports")
        out = []
        for i, (report, outcome) in enumerate(zip(batch, response.outcomes)):
            if outcome.report_id != report.report_id:
                raise ProtocolError(f"outcome {i} is for report {outcome.report_id.hex()}, "
                                    f"not {report.report_id.hex()} (outcomes must follow request order)")
            try:
                status = OutcomeStatus(outcome.status)
            except ValueError:
                raise ProtocolError(f"outcome {i} has status {outcome.status}, not accepted/duplicate/rejected") from None
            out.append(ReportOutcome(report_id=report.report_id, status=status, reason=outcome.reason,
                                     code=RejectionCode.of(outcome.code)))
        return out

    def _call(self, method: str, rpc: Callable[..., Resp], request: Any, *, round_not_open: bool = False) -> Resp:
        """Call ``rpc(request)`` with retries; the same request object (same request_id) every time.

        With ``round_not_open`` (a ``GetRoundSpec``), the collector's "no open round yet" answer is
        not retried here but raised as :class:`_RoundNotOpenAnswer` (the caller decides whether to
        wait), and its ``MISSING_CAPABILITIES`` answer is raised as
        :class:`~ldp_client.errors.MissingCapabilitiesError` with the names it lists.
        """
        attempt = 0
        while True:
            attempt += 1
            try:
                return rpc(request, timeout=self._timeout, metadata=self._metadata)
            except grpc.RpcError as exc:
                code, details = _status_of(exc)
                if (round_not_open and code == grpc.StatusCode.FAILED_PRECONDITION
                        and _error_reason(exc) == MISSING_CAPABILITIES_REASON):
                    raise MissingCapabilitiesError(request.campaign_id, _missing_capabilities(exc)) from exc
                if code in _REJECTED:
                    raise call_error(method, exc) from exc
                server_delay = retry_delay(exc)
                if round_not_open and code == grpc.StatusCode.UNAVAILABLE and _error_reason(exc) == ROUND_NOT_OPEN_REASON:
                    wait = _ROUND_NOT_OPEN_DEFAULT_WAIT if server_delay is None else min(server_delay, MAX_RETRY_AFTER)
                    raise _RoundNotOpenAnswer(wait) from exc
                if (code not in _RETRYABLE or attempt >= self._max_attempts
                        or (server_delay is None and _message_too_large(code, details))):
                    raise RpcFailedError(method, code, details, attempt) from exc
                if server_delay is not None and server_delay > self._backoff_max:
                    raise RpcFailedError(method, code, details, attempt, retry_after=server_delay) from exc
                self._sleep(self._backoff(attempt, server_delay))

    def _backoff(self, attempt: int, server_delay: float | None) -> float:
        u = self._rng.uniform()
        if server_delay is not None:
            return server_delay * (1.0 + _RETRY_INFO_JITTER * u)
        return min(self._backoff_max, self._backoff_base * 2.0 ** (attempt - 1)) * u


def call_error(method: str, exc: grpc.RpcError, attempts: int = 1) -> RequestRejectedError | RpcFailedError:
    """The SDK's error for a call that failed and is not retried (any client of the collector's services).

    :class:`RequestRejectedError` for the statuses that reject the request itself
    (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, OUT_OF_RANGE, ALREADY_EXISTS),
    :class:`RpcFailedError` for every other status (UNAUTHENTICATED, UNAVAILABLE ...).

    Parameters
    ----------
    method : str
        The RPC (``"CreateCampaign"`` ...).
    exc : grpc.RpcError
    attempts : int
        Calls made.
    """
    code, details = _status_of(exc)
    if code in _REJECTED:
        return RequestRejectedError(method, code, details)
    return RpcFailedError(method, code, details, attempts)


def _status_of(exc: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    # The RpcError of a unary call is also its grpc.Call (code, details, trailing metadata).
    if not hasattr(exc, "code"):
        return grpc.StatusCode.UNKNOWN, str(exc)
    call = cast(grpc.Call, exc)
    return call.code(), call.details() or ""


def _message_too_large(code: grpc.StatusCode, details: str) -> bool:
    """Whether a RESOURCE_EXHAUSTED is gRPC refusing the message size: resending cannot help.

    A quota or a full server answers RESOURCE_EXHAUSTED too, and is worth retrying; gRPC's own
    size refusal carries no RetryInfo and says "larger than max" in its details.
    """
    return code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details.lower()


class _RoundNotOpenAnswer(Exception):
    """Internal: the collector answered "no open round yet, ask again after ``retry_after`` s"."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(retry_after)
        self.retry_after = retry_after


def _status_details(exc: grpc.RpcError) -> list[Any]:
    """The ``google.rpc.Status`` details (``Any`` messages) of a failed call; empty if it has none."""
    if not hasattr(exc, "trailing_metadata"):
        return []
    try:
        status = rpc_status.from_call(cast(grpc.Call, exc))
    except ValueError:  # details inconsistent with the call's code/message: ignore them
        return []
    return list(status.details) if status is not None else []


def retry_delay(exc: grpc.RpcError) -> float | None:
    """The ``google.rpc.RetryInfo`` delay in the call's status details, if any (seconds)."""
    for detail in _status_details(exc):
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            delay = info.retry_delay.seconds + info.retry_delay.nanos / 1e9
            return max(0.0, float(delay))
    return None


def _error_info(exc: grpc.RpcError) -> Any:
    """The ``google.rpc.ErrorInfo`` of the ``ldp.v1`` domain in the call's status details, if any."""
    for detail in _status_details(exc):
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == ERROR_DOMAIN:
                return info
    return None


def _error_reason(exc: grpc.RpcError) -> str | None:
    """The ``google.rpc.ErrorInfo`` reason of the ``ldp.v1`` domain in the call's status details, if
    any (a reason names a cause only within its domain: ``docs/errors.md``, section 2)."""
    info = _error_info(exc)
    return None if info is None else str(info.reason)


def _missing_capabilities(exc: grpc.RpcError) -> tuple[str, ...]:
    """The capability names a ``MISSING_CAPABILITIES`` answer lists (its ``ErrorInfo`` metadata)."""
    info = _error_info(exc)
    listed = "" if info is None else str(info.metadata.get(MISSING_CAPABILITIES_METADATA, ""))
    return tuple(sorted({name for name in listed.split(",") if name}))


class Sender:
    """Drains a device's outbox to a collector.

    Parameters
    ----------
    device : Device
    client : CollectorClient
    packed : bool
        Use ``SubmitPacked`` (msgpack batch) instead of ``SubmitReports``.
    """

    def __init__(self, device: Device, client: CollectorClient, *, packed: bool = False) -> None:
        if not isinstance(device, Device):
            raise TypeError(f"device must be a Device, got {type(device).__name__}")
        if not isinstance(client, CollectorClient):
            raise TypeError(f"client must be a CollectorClient, got {type(client).__name__}")
        self._device = device
        self._client = client
        self._packed = packed

    def drain(self) -> DrainResult:
        """Send every pending report, batch by batch, acknowledging each batch's outcomes.

        Accepted and duplicate reports are removed from the outbox; rejected ones too, and they are
        returned with the collector's code and reason. A failure (:class:`RpcFailedError`,
        :class:`RequestRejectedError`) stops the drain; batches sent before it stay acknowledged and
        the rest stays pending for the next drain.
        """
        pending = self._device.pending_reports()
        submit = self._client.submit_packed if self._packed else self._client.submit
        accepted = duplicates = 0
        rejected: list[RejectedReport] = []
        step = self._client.max_batch
        for start in range(0, len(pending), step):
            batch = pending[start:start + step]
            outcomes = submit(batch)
            for report, outcome in zip(batch, outcomes):
                if outcome.status is OutcomeStatus.ACCEPTED:
                    accepted += 1
                elif outcome.status is OutcomeStatus.DUPLICATE:
                    duplicates += 1
                else:
                    rejected.append(RejectedReport(report=report, reason=outcome.reason, code=outcome.code))
            self._device.acknowledge(r.report_id for r in batch)
        return DrainResult(accepted=accepted, duplicates=duplicates, rejected=tuple(rejected))


def drain(device: Device, client: CollectorClient, *, packed: bool = False) -> DrainResult:
    """``Sender(device, client, packed=packed).drain()``."""
    return Sender(device, client, packed=packed).drain()
