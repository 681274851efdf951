"""The SDK's error hierarchy.

Every error the SDK raises on bad input is an :class:`LdpError`; the message names the parameter
or file at fault, the allowed range and the value received.
"""

from __future__ import annotations

import enum

__all__ = [
    "AlreadyReportedError",
    "BudgetExhaustedError",
    "EncodingError",
    "InvalidParameterError",
    "LdpError",
    "LedgerCorruptedError",
    "MissingCapabilitiesError",
    "OutboxCorruptedError",
    "PolicyViolationError",
    "ProtocolError",
    "RejectionCode",
    "StateCorruptedError",
    "StateDirectoryError",
    "TransportError",
]


class RejectionCode(enum.IntEnum):
    """Why a collector rejected one report of a batch: ``ldp.v1.RejectionCode`` without its
    ``REJECTION_CODE_`` prefix, value for value (``docs/errors.md``, section 4).

    The collector sends these and the device reads them, so they live here, beside the device's
    own errors. A code this SDK does not know reads as ``UNSPECIFIED`` (the list may grow).
    """

    UNSPECIFIED = 0
    MALFORMED_REPORT = 1
    UNKNOWN_CAMPAIGN = 2
    CAMPAIGN_NOT_COLLECTING = 3
    ROUND_NOT_OPEN = 4
    UNKNOWN_GROUP = 5
    GROUP_NOT_REPORTING = 6
    WRONG_PAYLOAD_COUNT = 7
    INVALID_PAYLOAD = 8
    IMPLAUSIBLE_PAYLOAD = 9
    ASSIGNMENT_MISMATCH = 10

    @classmethod
    def of(cls, value: int) -> RejectionCode:
        """The code numbered ``value``; ``UNSPECIFIED`` for a number this SDK does not know."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNSPECIFIED


class LdpError(Exception):
    """Base class of every error raised by ``ldp_client``."""


class InvalidParameterError(LdpError, ValueError):
    """A parameter or input value is out of its allowed range."""


class EncodingError(InvalidParameterError):
    """A point cannot be encoded (wrong dimension, NaN or infinite coordinate, wrong type)."""


class ProtocolError(LdpError):
    """A message (round spec, report, packed batch) is malformed or inconsistent."""

    def detached(self) -> ProtocolError:
        """This error without its traceback and causes, to be kept as a value (the outcome of one
        report of a batch) rather than raised.

        A caught exception's traceback holds the frame that caught it, whose locals hold where it
        is kept: a reference cycle that keeps every frame's locals -- a whole decoded request --
        alive until the cyclic garbage collector happens to run.
        """
        self.__traceback__ = None
        self.__cause__ = self.__context__ = None
        return self


class PolicyViolationError(ProtocolError):
    """A round spec asks for more than the device's own policy allows."""


class MissingCapabilitiesError(ProtocolError):
    """A round needs capabilities the device does not support (``docs/protocol.md`` §10).

    Raised before anything is charged or released: by the device when a spec requires more than
    it states, and by the gRPC client when the collector declines to send the spec
    (``FAILED_PRECONDITION``, reason ``MISSING_CAPABILITIES``) or sends it anyway.

    Attributes
    ----------
    campaign_id : str
    missing : tuple of str
        The required capability names the device lacks, sorted.
    """

    def __init__(self, campaign_id: str, missing: tuple[str, ...]) -> None:
        self.campaign_id = campaign_id
        self.missing = tuple(missing)
        super().__init__(
            f"campaign {campaign_id!r}: the round needs capabilities this device does not support: "
            f"{', '.join(self.missing)}")


class BudgetExhaustedError(LdpError):
    """Participating would exceed the device's privacy budget.

    Attributes
    ----------
    scope : str
        ``"campaign"`` or ``"total"``.
    spent, requested, cap : float
        The budget already spent in the scope, the epsilon the report would charge, and the cap.
    """

    def __init__(self, scope: str, spent: float, requested: float, cap: float) -> None:
        self.scope = scope
        self.spent = spent
        self.requested = requested
        self.cap = cap
        super().__init__(
            f"{scope} privacy budget exhausted: spent {spent:.6g} + requested {requested:.6g} "
            f"> cap {cap:.6g}"
        )


class AlreadyReportedError(LdpError):
    """The device is charged for this round and its report is no longer stored.

    Usually the collector acknowledged the report; otherwise the device stopped between the charge
    and the outbox write (device.py, "Crash safety"), and the report was never sent. Either way a
    device never reports twice in one round (that would spend the budget twice), so there is
    nothing to return or resend.

    Attributes
    ----------
    campaign_id : str
    round : int
    report_id : bytes
        The acknowledged report.
    """

    def __init__(self, campaign_id: str, round: int, report_id: bytes) -> None:
        self.campaign_id = campaign_id
        self.round = round
        self.report_id = report_id
        super().__init__(
            f"already reported in campaign {campaign_id!r} round {round} (report {report_id.hex()} is charged and no "
            "longer stored: acknowledged by the collector, or lost before it was stored); a device reports at most "
            "once per round")


class StateCorruptedError(LdpError):
    """A durable state file of the device cannot be read back; nothing is reset silently."""


class LedgerCorruptedError(StateCorruptedError):
    """The budget ledger is unreadable; the device refuses to report until an operator acts."""


class OutboxCorruptedError(StateCorruptedError):
    """A stored report in the outbox is unreadable."""


class StateDirectoryError(LdpError):
    """The device's state directory cannot be written (read-only, full, no permission).

    Nothing was charged or stored by the operation that raised it, unless its message says so.

    Attributes
    ----------
    path : pathlib.Path
        The file or directory that could not be written.
    """

    def __init__(self, message: str, *, path: object) -> None:
        self.path = path
        super().__init__(message)


class TransportError(LdpError):
    """Sending reports to the collector failed (after retries where they apply)."""
