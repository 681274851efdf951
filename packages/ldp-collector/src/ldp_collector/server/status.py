"""Errors -> ``google.rpc.Status``: the one mapping from domain errors to gRPC status codes and details.

Every refusal the server sends goes through :func:`status_for_error`, whether a servicer raised it,
a request did not parse or an interceptor refused the call; :func:`abort` sends it.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from ldp_client.errors import LdpError

from ..errors import CollectorError, InvalidArgumentError

__all__ = ["ERROR_DOMAIN", "Context", "FieldError", "abort", "code_name", "status_for_error"]

#: The ``ErrorInfo.domain`` of every error the collector sends.
ERROR_DOMAIN = "ldp.v1"
#: Longest status message sent; longer ones are cut (they may quote hostile input).
_MAX_MESSAGE = 1024

Context = grpc.aio.ServicerContext[Any, Any]


class FieldError(InvalidArgumentError):
    """A request-level INVALID_ARGUMENT naming the request field at fault (BadRequest detail)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field_name = field_name


def code_name(exc: BaseException) -> str:
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
    code = code_name(exc)
    message = str(exc) if code != "INTERNAL" or isinstance(exc, CollectorError) else "internal error"
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "..."
    status = status_pb2.Status(code=code_pb2.Code.Value(code), message=message)
    reason = (exc.reason if isinstance(exc, CollectorError) else None) or type(exc).__name__
    status.details.add().Pack(error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN))
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


async def abort(context: Context, status: status_pb2.Status) -> NoReturn:
    rich = rpc_status.to_status(status)
    await context.abort(rich.code, rich.details, rich.trailing_metadata)


