"""Domain errors of the collector; the servicer maps each to one gRPC status code."""

from __future__ import annotations

from ldp_client.spec import ROUND_NOT_OPEN_REASON

__all__ = [
    "AlreadyExistsError",
    "CollectorError",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
    "OverloadedError",
    "RoundNotOpenError",
    "UnauthenticatedError",
]


class CollectorError(Exception):
    """Base class; ``code`` names the gRPC status code the service answers with.

    ``reason`` is the ``google.rpc.ErrorInfo`` reason of the answer; ``None`` means the class name.
    """

    code = "INTERNAL"
    reason: str | None = None


class InvalidArgumentError(CollectorError):
    code = "INVALID_ARGUMENT"


class NotFoundError(CollectorError):
    code = "NOT_FOUND"


class AlreadyExistsError(CollectorError):
    code = "ALREADY_EXISTS"


class FailedPreconditionError(CollectorError):
    """Wrong or closed round, finished campaign."""

    code = "FAILED_PRECONDITION"


class UnauthenticatedError(CollectorError):
    code = "UNAUTHENTICATED"


class OverloadedError(CollectorError):
    """The collector sheds load; ``retry_after`` seconds go into google.rpc.RetryInfo."""

    code = "UNAVAILABLE"

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RoundNotOpenError(CollectorError):
    """A collecting campaign has no open round: it is between two rounds (a server step runs, or
    resumes after a restart). Devices ask again after ``retry_after`` seconds (UNAVAILABLE with
    RetryInfo and the ErrorInfo reason :data:`ldp_client.spec.ROUND_NOT_OPEN_REASON`, which the SDK
    turns into :class:`ldp_client.spec.RoundNotOpen`)."""

    code = "UNAVAILABLE"
    reason = ROUND_NOT_OPEN_REASON

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after
