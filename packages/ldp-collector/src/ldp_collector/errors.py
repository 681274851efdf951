"""Domain errors of the collector and the wire's error vocabulary, in one place.

Each error class names the gRPC status code the service answers it with (``code``) and the
``google.rpc.ErrorInfo`` reason it carries (``reason``, domain ``ldp.v1``). :class:`ErrorReason` is
the one table of those reasons: ``docs/errors.md`` (section 2) documents exactly this set, and
``tests/collector/server/test_error_model.py`` checks that nothing else can reach the wire. The
per-report :class:`~ldp_client.errors.RejectionCode` lives in the SDK (the device reads it).
"""

from __future__ import annotations

import enum

from ldp_client.capabilities import MISSING_CAPABILITIES_REASON
from ldp_client.spec import ROUND_NOT_OPEN_REASON

__all__ = [
    "AlreadyExistsError",
    "CollectorError",
    "DeviceLacksCapabilitiesError",
    "ErrorReason",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
    "OverloadedError",
    "RoundNotOpenError",
    "UnauthenticatedError",
]


class ErrorReason(enum.StrEnum):
    """Every ``google.rpc.ErrorInfo.reason`` the collector sends, with the status code it goes with.

    The values are stable wire constants (UPPER_SNAKE_CASE, domain ``ldp.v1``): a client may act on
    them. A value may be added; none is ever renamed or given another meaning.
    """

    # INVALID_ARGUMENT (with google.rpc.BadRequest)
    MALFORMED_REQUEST = "MALFORMED_REQUEST"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    INVALID_CAMPAIGN_CONFIG = "INVALID_CAMPAIGN_CONFIG"
    BATCH_TOO_LARGE = "BATCH_TOO_LARGE"
    # NOT_FOUND
    CAMPAIGN_NOT_FOUND = "CAMPAIGN_NOT_FOUND"
    ROUND_NOT_FOUND = "ROUND_NOT_FOUND"
    # ALREADY_EXISTS
    CAMPAIGN_EXISTS = "CAMPAIGN_EXISTS"
    ROUND_EXISTS = "ROUND_EXISTS"
    # FAILED_PRECONDITION (with google.rpc.PreconditionFailure)
    CAMPAIGN_NOT_COLLECTING = "CAMPAIGN_NOT_COLLECTING"
    ROUND_MISMATCH = "ROUND_MISMATCH"
    ROUND_STILL_OPEN = "ROUND_STILL_OPEN"
    TOO_FEW_REPORTS = "TOO_FEW_REPORTS"
    NO_ESTIMATES = "NO_ESTIMATES"
    ENROLMENT_DISABLED = "ENROLMENT_DISABLED"
    STORE_CLOSED = "STORE_CLOSED"
    STORE_SCHEMA_TOO_NEW = "STORE_SCHEMA_TOO_NEW"
    MISSING_CAPABILITIES = MISSING_CAPABILITIES_REASON
    # UNAUTHENTICATED
    UNAUTHENTICATED = "UNAUTHENTICATED"
    # RESOURCE_EXHAUSTED (with google.rpc.QuotaFailure and RetryInfo)
    RATE_LIMITED = "RATE_LIMITED"
    # UNAVAILABLE (with google.rpc.RetryInfo)
    OVERLOADED = "OVERLOADED"
    ROUND_NOT_OPEN = ROUND_NOT_OPEN_REASON
    STEP_RUNNING = "STEP_RUNNING"
    ENROLMENT_RATE_LIMITED = "ENROLMENT_RATE_LIMITED"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    # INTERNAL (no text: the error is logged)
    INTERNAL = "INTERNAL"


class CollectorError(Exception):
    """Base class; ``code`` names the gRPC status code the service answers with and ``reason``
    the ``google.rpc.ErrorInfo`` reason (the class's own unless the raiser names a finer one)."""

    code = "INTERNAL"
    reason: ErrorReason = ErrorReason.INTERNAL

    def __init__(self, message: str, *, reason: ErrorReason | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class InvalidArgumentError(CollectorError):
    """A request breaks a rule; ``field`` is the path of the request field at fault (the
    ``google.rpc.BadRequest`` field path, ``docs/errors.md`` section 3), empty when the request did
    not parse at all (``MALFORMED_REQUEST``) or the service boundary names it."""

    code = "INVALID_ARGUMENT"
    reason = ErrorReason.INVALID_ARGUMENT

    def __init__(self, message: str, *, field: str = "", reason: ErrorReason | None = None) -> None:
        super().__init__(message, reason=reason)
        self.field = field


class NotFoundError(CollectorError):
    code = "NOT_FOUND"
    reason = ErrorReason.CAMPAIGN_NOT_FOUND


class AlreadyExistsError(CollectorError):
    code = "ALREADY_EXISTS"
    reason = ErrorReason.CAMPAIGN_EXISTS


class FailedPreconditionError(CollectorError):
    """Wrong or closed round, finished campaign."""

    code = "FAILED_PRECONDITION"
    reason = ErrorReason.CAMPAIGN_NOT_COLLECTING


class DeviceLacksCapabilitiesError(FailedPreconditionError):
    """``GetRoundSpec`` from a device whose stated capabilities do not cover the open round
    (``docs/protocol.md`` §10); ``missing`` (sorted) goes into the ``ErrorInfo`` metadata."""

    reason = ErrorReason.MISSING_CAPABILITIES

    def __init__(self, message: str, missing: tuple[str, ...]) -> None:
        super().__init__(message)
        self.missing = missing


class UnauthenticatedError(CollectorError):
    code = "UNAUTHENTICATED"
    reason = ErrorReason.UNAUTHENTICATED


class OverloadedError(CollectorError):
    """The collector sheds load; ``retry_after`` seconds go into google.rpc.RetryInfo."""

    code = "UNAVAILABLE"
    reason = ErrorReason.OVERLOADED

    def __init__(self, message: str, retry_after: float = 1.0, *, reason: ErrorReason | None = None) -> None:
        super().__init__(message, reason=reason)
        self.retry_after = retry_after


class RoundNotOpenError(CollectorError):
    """A collecting campaign has no open round: it is between two rounds (a server step runs, or
    resumes after a restart). Devices ask again after ``retry_after`` seconds (UNAVAILABLE with
    RetryInfo and the ErrorInfo reason :data:`ldp_client.spec.ROUND_NOT_OPEN_REASON`, which the SDK
    turns into :class:`ldp_client.spec.RoundNotOpen`)."""

    code = "UNAVAILABLE"
    reason = ErrorReason.ROUND_NOT_OPEN

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after
