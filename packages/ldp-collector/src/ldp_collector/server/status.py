"""Errors -> ``google.rpc.Status``: the one mapping from domain errors to gRPC status codes and details.

Every refusal the server sends goes through :func:`status_for_error`, whether a servicer raised it,
a request did not parse or an interceptor refused the call; :func:`abort` sends it. The error model
it implements is normative in ``docs/errors.md``.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn, cast

import grpc
from google.protobuf import duration_pb2
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from ldp_client.capabilities import MISSING_CAPABILITIES_METADATA
from ldp_client.errors import LdpError
from ldp_client.spec import ERROR_DOMAIN

from ..errors import CollectorError, DeviceLacksCapabilitiesError, ErrorReason, InvalidArgumentError

__all__ = ["Context", "abort", "code_name", "field_path", "reason_of", "status_for_error"]

#: Longest status message sent; longer ones are cut (they may quote hostile input).
_MAX_MESSAGE = 1024
#: A dotted field path at the start of a message (``"grid.max_iterations must be ..."``).
_LEADING_PATH = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*")

Context = grpc.aio.ServicerContext[Any, Any]


def field_path(message: str, message_type: type[Message], prefix: str = "") -> str:
    """The field path a validation message names, checked against the message type it is about.

    Validation messages start with the path of the field at fault, relative to the message they
    check (``"epsilon must be in (0, 20], got 0"``, ``"grid.max_iterations must be ..."``): the
    longest leading part of that path that names real fields of ``message_type`` (descending into
    message fields), after ``prefix``. So a message never yields a path that is not a field, and a
    message naming none yields ``prefix``.
    """
    match = _LEADING_PATH.match(message)
    path = [prefix] if prefix else []
    current: Descriptor | None = cast(Descriptor, message_type.DESCRIPTOR)
    for part in match.group().split(".") if match else ():
        field = current.fields_by_name.get(part) if current is not None else None
        if field is None:
            break
        path.append(part)
        current = field.message_type
    return ".".join(path)


def reason_of(exc: BaseException) -> ErrorReason:
    """The ``ErrorInfo`` reason the service answers ``exc`` with (always one of :class:`ErrorReason`)."""
    if isinstance(exc, CollectorError):
        return exc.reason
    if isinstance(exc, LdpError):  # SDK validation (bad spec, payload) reaching the service
        return ErrorReason.INVALID_ARGUMENT
    return ErrorReason.INTERNAL


def code_name(exc: BaseException) -> str:
    if isinstance(exc, CollectorError):
        return exc.code
    if isinstance(exc, LdpError):  # SDK validation (bad spec, payload) reaching the service
        return "INVALID_ARGUMENT"
    return "INTERNAL"


def status_for_error(exc: BaseException, request: type[Message] | None = None) -> status_pb2.Status:
    """The ``google.rpc.Status`` the service answers ``exc`` with (``docs/errors.md``).

    Every status carries an ``ErrorInfo`` (``reason`` from :class:`ErrorReason`, :func:`reason_of`;
    ``domain`` = ``ldp.v1``); INVALID_ARGUMENT adds ``BadRequest`` (the path of the field at fault:
    the error's ``field``, else the one its message names in ``request``, the request's message
    type; empty only for ``MALFORMED_REQUEST``),
    FAILED_PRECONDITION adds ``PreconditionFailure``, UNAVAILABLE adds ``RetryInfo`` with the
    collector's ``retry_after``, RESOURCE_EXHAUSTED from a rate limit adds ``QuotaFailure`` (which
    limit) and ``RetryInfo`` (when the bucket holds enough again). Unexpected exceptions become
    INTERNAL without their text (it is logged instead).
    """
    code = code_name(exc)
    message = str(exc) if code != "INTERNAL" or isinstance(exc, CollectorError) else "internal error"
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "..."
    status = status_pb2.Status(code=code_pb2.Code.Value(code), message=message)
    reason = reason_of(exc)
    info = error_details_pb2.ErrorInfo(reason=reason.value, domain=ERROR_DOMAIN)
    if isinstance(exc, DeviceLacksCapabilitiesError):
        info.metadata[MISSING_CAPABILITIES_METADATA] = ",".join(exc.missing)
    status.details.add().Pack(info)
    if code == "INVALID_ARGUMENT":
        field = exc.field if isinstance(exc, InvalidArgumentError) else ""
        if not field and request is not None and reason != ErrorReason.MALFORMED_REQUEST:
            field = field_path(message, request)
        violation = error_details_pb2.BadRequest.FieldViolation(field=field, description=message)
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


async def abort(context: Context, status: status_pb2.Status) -> NoReturn:
    rich = rpc_status.to_status(status)
    await context.abort(rich.code, rich.details, rich.trailing_metadata)


