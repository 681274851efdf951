"""The storage contract every backend (SQLite, PostgreSQL) implements.

Raw reports are the source of truth. Per-round accumulators are caches that ``add_reports``
updates in the same transaction as the reports they summarize, so they always equal a
recomputation from the raw reports, and can be rebuilt from them.
"""

from __future__ import annotations

import abc
import contextlib
import enum
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from ..errors import ErrorReason, FailedPreconditionError

__all__ = [
    "AccumulateFn",
    "CampaignRecord",
    "Outcome",
    "ReportStore",
    "RoundRecord",
    "StoreClosedError",
    "StoredReport",
]


class StoreClosedError(FailedPreconditionError):
    """The store was closed; every call after :meth:`ReportStore.close` raises this."""

    reason = ErrorReason.STORE_CLOSED


class Outcome(enum.IntEnum):
    """Per-report outcome of ``add_reports`` (values equal ldp.v1.ReportOutcome.Status)."""

    ACCEPTED = 1
    DUPLICATE = 2
    REJECTED = 3


@dataclass(frozen=True, kw_only=True)
class CampaignRecord:
    campaign_id: str
    #: Serialized ``ldp.v1.CampaignConfig``.
    config: bytes
    #: ``"collecting"``, ``"finished"`` or ``"failed"``.
    state: str
    current_round: int
    created_at: float
    #: Engine-private state carried between rounds (msgpack bytes, engine-defined).
    engine_state: bytes = b""
    #: Serialized ``ldp.v1.Result`` once finished.
    result: bytes | None = None
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class RoundRecord:
    campaign_id: str
    round: int
    #: ``ldp_client.spec.RoundSpec.pack()`` bytes.
    spec: bytes
    open: bool
    opened_at: float
    closed_at: float | None = None
    report_count: int = 0
    #: Serialized ``ldp.v1.Estimates`` of the closed round, if the engine produced any.
    estimates: bytes | None = None


@dataclass(frozen=True, kw_only=True)
class StoredReport:
    report_id: bytes
    campaign_id: str
    round: int
    group: int
    #: msgpack of ``[payload_to_wire(p) for p in report.payloads]``.
    payloads: bytes


#: Called inside the ingestion transaction with the *newly accepted* reports of one round and the
#: round's current accumulator blobs (key -> bytes); returns the blobs to upsert.
AccumulateFn = Callable[[Sequence[StoredReport], Mapping[str, bytes]], Mapping[str, bytes]]


class ReportStore(abc.ABC):
    """Durable campaign, round and report storage. Implementations are thread-safe."""

    # -- campaigns ---------------------------------------------------------------------------
    @abc.abstractmethod
    def create_campaign(self, record: CampaignRecord) -> None:
        """Insert a campaign; ``AlreadyExistsError`` if the id is taken."""

    @abc.abstractmethod
    def get_campaign(self, campaign_id: str) -> CampaignRecord:
        """``NotFoundError`` if unknown."""

    @abc.abstractmethod
    def list_campaigns(self, limit: int, after: str = "") -> list[CampaignRecord]:
        """Campaigns ordered by id, strictly after ``after``."""

    @abc.abstractmethod
    def update_campaign(self, campaign_id: str, *, state: str | None = None, current_round: int | None = None,
                        engine_state: bytes | None = None, result: bytes | None = None,
                        error: str | None = None) -> None:
        """Update the given fields (``None`` = unchanged)."""

    # -- rounds ------------------------------------------------------------------------------
    @abc.abstractmethod
    def open_round(self, campaign_id: str, round: int, spec: bytes, opened_at: float) -> None:
        """Record a new open round."""

    @abc.abstractmethod
    def get_round(self, campaign_id: str, round: int) -> RoundRecord:
        """``NotFoundError`` if unknown."""

    @abc.abstractmethod
    def list_rounds(self, campaign_id: str) -> list[RoundRecord]:
        """All rounds of a campaign in order."""

    @abc.abstractmethod
    def close_round(self, campaign_id: str, round: int, closed_at: float) -> bool:
        """Atomically mark an open round closed; ``False`` if it was already closed (someone else won)."""

    @abc.abstractmethod
    def set_round_estimates(self, campaign_id: str, round: int, estimates: bytes) -> None:
        """Store the serialized ``ldp.v1.Estimates`` of a closed round."""

    # -- reports -----------------------------------------------------------------------------
    @abc.abstractmethod
    def add_reports(self, request_id: str, reports: Sequence[StoredReport],
                    accumulate: AccumulateFn | None = None) -> list[Outcome]:
        """Store a validated batch durably, then return one outcome per report.

        Idempotent by ``report_id`` (a stored id is DUPLICATE and changes nothing; so is an id
        repeated within the batch, after its first occurrence) and by ``request_id`` (a replayed
        request returns the first answer and changes nothing). Reports must target open rounds (the
        caller checked); the store checks again inside its transaction, so a report whose round is
        closed (or unknown) by commit time is REJECTED (DUPLICATE if its id is already stored) and
        no report can land in a round after ``close_round`` returned ``True``. All reports and
        accumulator updates commit in one durable transaction (group commit across concurrent
        callers is allowed) before this returns. ``accumulate`` is called inside that transaction
        with the newly accepted reports of one round at a time (never an empty list) and that
        round's current blobs; it must be a pure function of its arguments (after a rollback the
        store may call it again).
        """

    @abc.abstractmethod
    def iter_reports(self, campaign_id: str, round: int, batch_size: int = 65536) -> Iterator[list[StoredReport]]:
        """All stored reports of a round, in insertion order, in batches of at most ``batch_size``.

        ``NotFoundError`` (on first iteration) if the round is unknown.
        """

    @abc.abstractmethod
    def count_reports(self, campaign_id: str, round: int) -> int:
        """Number of stored reports of a round; ``NotFoundError`` if the round is unknown."""

    @abc.abstractmethod
    def load_accumulators(self, campaign_id: str, round: int) -> dict[str, bytes]:
        """The round's accumulator blobs; ``NotFoundError`` if the round is unknown."""

    @abc.abstractmethod
    def replace_accumulators(self, campaign_id: str, round: int, blobs: Mapping[str, bytes]) -> None:
        """Replace the round's accumulators (rebuild from raw reports)."""

    # -- coordination between processes ---------------------------------------------------------------
    @contextlib.contextmanager
    def step_lock(self, campaign_id: str) -> Iterator[bool]:
        """Try to take the campaign's server-step lock without waiting; yield whether it was taken.

        Only the holder runs the campaign's server step (closing a round, advancing to the next,
        resuming an interrupted step), so a process never resumes a step another live process is
        running. The lock is exclusive among all store objects on the same storage, in this process
        or any other (also between two objects of one process, and re-taking it through the object
        that holds it yields ``False``), and it is released when the ``with`` block ends or the
        holding process dies. Taking it never blocks: a ``False`` caller skips the step.

        This default, for stores no other process can open, always yields ``True``; the caller's
        own thread lock is then all the exclusion needed. Shared backends override it.

        Parameters
        ----------
        campaign_id : str
            The campaign whose step is to run (it need not exist).

        Yields
        ------
        bool
            Whether this caller holds the lock for the duration of the block.
        """
        yield True

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and release resources; further calls fail."""
