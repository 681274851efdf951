"""Domain errors of the collector; the servicer maps each to one gRPC status code."""

from __future__ import annotations

__all__ = [
    "AlreadyExistsError",
    "CollectorError",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
    "OverloadedError",
    "UnauthenticatedError",
]


class CollectorError(Exception):
    """Base class; ``code`` names the gRPC status code the service answers with."""

    code = "INTERNAL"


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
