"""The collector's plain handlers: campaigns, rounds, ingestion, estimates and results.

:class:`Collector` is everything the gRPC servicer does apart from decoding, encoding and mapping
errors to status codes (STYLE.md §10): it validates reports before storing them
(:mod:`ldp_collector.ingest`), stores them idempotently through the
:class:`~ldp_collector.storage.base.ReportStore`, runs the campaign engines when rounds close, and
answers with :mod:`ldp_collector.model` values (the servicer converts them through
:mod:`ldp_collector.serde`). Errors are the domain errors of :mod:`ldp_collector.errors`.

Concurrency
-----------
All methods are thread-safe. Per campaign, a reader-writer lock orders ingestion against the
closing of a round: a batch holds the read side from the moment it checks that a round is open
until its reports are committed, and closing takes the write side only for the atomic
``store.close_round`` (so no acknowledged report can land in a round after the engine started
reading it). A second, plain lock per campaign serializes the server steps (close, advance,
recovery) so one engine runs at a time. Across *processes* sharing one store, every server step
(creating a campaign's first round, closing, advancing, resuming) also holds the store's
cross-process :meth:`~ldp_collector.storage.base.ReportStore.step_lock`, and the store's
compare-and-set ``close_round`` decides who closes a round; a store shared by several processes
must also refuse reports to closed rounds inside ``add_reports``.

Between two rounds
------------------
While a server step runs, the campaign is ``collecting`` with a closed current round: there is no
spec to hand out, and :meth:`Collector.get_round_spec` raises :class:`RoundNotOpenError`
(UNAVAILABLE with ``RetryInfo``: ask again after :data:`ROUND_NOT_OPEN_RETRY_SECONDS`). Reports
that arrive then are for the closed round -- no device can hold the next round's spec before it is
opened -- so their answer does not depend on the step: they arrived after their round closed.

Crash recovery
--------------
Closing is: CAS-close the round, run the engine, store the estimates, open the next round (or
store the result). If the process dies in between, the campaign is left ``collecting`` with a
closed current round. Every server step holds the step lock from before the close until the next
round is open, and that lock dies with its process (``flock``, a PostgreSQL session lock); so
whoever takes the lock and finds the current round closed knows the step was interrupted and
resumes it at once: :meth:`Collector.tick` (which the service runs when it starts and then every
``tick_interval_s``) and an operator's :meth:`Collector.close_round` of that round. The raw
reports are the source of truth, so nothing is lost. A campaign whose first round was never
opened is repaired the same way.

Auto-closing
------------
A round closes automatically once it holds ``close_after_reports`` reports (checked after every
batch, inline in the submitting thread, *after* the batch is committed and its outcomes computed)
or once ``round_duration`` has elapsed (checked by :meth:`Collector.tick`, which the service calls
from a background thread). A round below ``min_reports_per_round`` stays open.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from statistics import NormalDist

from ldp_client.capabilities import check_capability_names, missing_capabilities
from ldp_client.errors import InvalidParameterError, ProtocolError, RejectionCode
from ldp_client.report import Report, ReportColumns
from ldp_client.spec import RoundSpec

from .campaigns import (
    COLLECTING,
    FAILED,
    FINISHED,
    campaign_of,
    make_engine,
    prepare_campaign,
    round_status,
)
from .errors import (
    DeviceLacksCapabilitiesError,
    ErrorReason,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OverloadedError,
    RoundNotOpenError,
)
from .ingest import Assign, Rejection, RoundContext, StoredReportColumns, check_request_id, validate_batch
from .kinds import CampaignEngine, RoundOutcome, RoundPlan, RoundReports
from .kinds.common import check_allowed_oracles
from .model import Campaign, CampaignConfig, CampaignState, Estimates, Result
from .serde import (
    config_from_bytes,
    config_to_bytes,
    estimates_from_bytes,
    estimates_to_bytes,
    result_from_bytes,
    result_to_bytes,
)
from .storage.base import AccumulateFn, CampaignRecord, Outcome, ReportStore, RoundRecord, StoredReport

__all__ = ["DEFAULT_CONFIDENCE", "DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "ROUND_NOT_OPEN_RETRY_SECONDS", "Collector"]

log = logging.getLogger(__name__)

DEFAULT_CONFIDENCE = 0.95
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
#: How long a device asking for the round spec between two rounds is told to wait before asking
#: again (the RetryInfo of :class:`RoundNotOpenError`): short against a typical server step, long
#: enough that a fleet polling through one does not flood the collector.
ROUND_NOT_OPEN_RETRY_SECONDS = 1.0
#: How long an operator's CloseRound waits for another process's server step of the campaign.
STEP_LOCK_WAIT_SECONDS = 30.0
_LIST_CHUNK = 500


class _ReadWriteLock:
    """Many readers or one writer; a waiting writer blocks new readers (no writer starvation)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class _CampaignLocks:
    __slots__ = ("ingest", "step")

    def __init__(self) -> None:
        #: Read: a batch between its open-round check and its commit. Write: the CAS close.
        self.ingest = _ReadWriteLock()
        #: Held for a whole server step (create, close + engine + advance, recovery).
        self.step = threading.Lock()


class _StoredRoundReports(RoundReports):
    """:class:`RoundReports` of one closed round, read from the store."""

    def __init__(self, store: ReportStore, campaign_id: str, round: int) -> None:
        self._store = store
        self._campaign_id = campaign_id
        self._round = round

    @property
    def count(self) -> int:
        return self._store.count_reports(self._campaign_id, self._round)

    def batches(self, batch_size: int = 65536) -> Iterator[list[StoredReport]]:
        return self._store.iter_reports(self._campaign_id, self._round, batch_size)

    def accumulators(self) -> dict[str, bytes]:
        return self._store.load_accumulators(self._campaign_id, self._round)


def _store_request_id(request_id: str, reports: Sequence[StoredReport]) -> str:
    """The store's idempotency key of a batch: ``request_id`` bound to the ids of the reports to store.

    The store answers a replayed key with its first answer, one outcome per report it stored then.
    A retry of the same batch gets that answer; a request id reused for other reports (a hostile
    or confused client, or a retry after some of its reports became invalid) is a new request, so
    an answer never speaks for reports it did not store.
    """
    ids = reports.report_ids if isinstance(reports, StoredReportColumns) else [r.report_id for r in reports]
    digest = hashlib.blake2b(b"".join(ids), digest_size=12).hexdigest()
    return f"{request_id}#{digest}"


def _dispatch_accumulate(functions: Mapping[tuple[str, int], AccumulateFn]) -> AccumulateFn | None:
    """One ``AccumulateFn`` for a batch spanning several campaigns: route by the reports' round."""
    if not functions:
        return None

    def accumulate(reports: Sequence[StoredReport], blobs: Mapping[str, bytes]) -> Mapping[str, bytes]:
        if not reports:
            return {}
        fn = functions.get((reports[0].campaign_id, reports[0].round))
        return fn(reports, blobs) if fn is not None else {}

    return accumulate


def _encode_page_token(campaign_id: str) -> str:
    return base64.urlsafe_b64encode(campaign_id.encode()).decode().rstrip("=")


def _decode_page_token(token: str) -> str:
    try:
        campaign_id = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        campaign_id = ""
    if not campaign_id or _encode_page_token(campaign_id) != token:
        raise InvalidArgumentError("page_token is not a token this service issued")
    return campaign_id


class Collector:
    """Campaigns, rounds and reports over one :class:`ReportStore`; thread-safe.

    Parameters
    ----------
    store : ReportStore
        Durable storage; the collector does not close it.
    clock : callable, optional
        Unix time in seconds (``time.time``); injectable for tests.

    Notes
    -----
    Device side: :meth:`get_round_spec`, :meth:`submit`, :meth:`get_result`. Operator side:
    :meth:`create_campaign`, :meth:`list_campaigns`, :meth:`get_campaign`, :meth:`close_round`,
    :meth:`get_estimates`, :meth:`campaign_events`, :meth:`tick`.
    """

    def __init__(self, store: ReportStore, *, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock
        self._lock = threading.Lock()
        self._locks: dict[str, _CampaignLocks] = {}
        self._configs: dict[str, CampaignConfig] = {}
        self._engines: dict[str, CampaignEngine] = {}
        self._specs: dict[tuple[str, int], RoundSpec] = {}
        self._accumulate: dict[tuple[str, int], AccumulateFn | None] = {}

    @property
    def store(self) -> ReportStore:
        """The underlying store."""
        return self._store

    # -- caches (configs, specs and engines never change once stored) ---------------------------
    def _campaign_locks(self, campaign_id: str) -> _CampaignLocks:
        with self._lock:
            locks = self._locks.get(campaign_id)
            if locks is None:
                locks = self._locks[campaign_id] = _CampaignLocks()
            return locks

    def _exists(self, campaign_id: str) -> bool:
        """Whether the campaign exists (campaigns are never deleted, so a yes is cached)."""
        with self._lock:
            if campaign_id in self._configs:
                return True
        try:
            self._config(self._store.get_campaign(campaign_id))
        except NotFoundError:
            return False
        return True

    def _config(self, record: CampaignRecord) -> CampaignConfig:
        with self._lock:
            config = self._configs.get(record.campaign_id)
        if config is None:
            config = config_from_bytes(record.config, where=f"configuration of campaign {record.campaign_id}")
            with self._lock:
                self._configs[record.campaign_id] = config
        return config

    def _engine(self, record: CampaignRecord) -> CampaignEngine:
        with self._lock:
            engine = self._engines.get(record.campaign_id)
        if engine is None:
            engine = make_engine(self._config(record))
            with self._lock:
                engine = self._engines.setdefault(record.campaign_id, engine)
        return engine

    def _spec(self, campaign_id: str, round_record: RoundRecord) -> RoundSpec:
        key = (campaign_id, round_record.round)
        with self._lock:
            spec = self._specs.get(key)
        if spec is None:
            try:
                spec = RoundSpec.unpack(round_record.spec)
            except ProtocolError as exc:
                raise RuntimeError(f"stored spec of round {round_record.round} of campaign {campaign_id} "
                                   f"is unreadable: {exc}") from exc
            with self._lock:
                self._specs[key] = spec
        return spec

    def _accumulate_fn(self, record: CampaignRecord, spec: RoundSpec) -> AccumulateFn | None:
        key = (record.campaign_id, spec.round)
        with self._lock:
            if key in self._accumulate:
                return self._accumulate[key]
        fn = self._engine(record).accumulate_fn(spec)
        with self._lock:
            self._accumulate[key] = fn
        return fn

    def _open_round_record(self, record: CampaignRecord) -> RoundRecord | None:
        """The current round of a collecting campaign if it is open, else ``None``."""
        if record.state != COLLECTING:
            return None
        try:
            round_record = self._store.get_round(record.campaign_id, record.current_round)
        except NotFoundError:
            return None
        return round_record if round_record.open else None

    # -- device side -----------------------------------------------------------------------------
    def get_round_spec(self, campaign_id: str, supported_capabilities: Collection[str] = ()
                       ) -> tuple[RoundSpec | None, bool]:
        """The open round's spec of a campaign, and whether the campaign is finished.

        Parameters
        ----------
        campaign_id : str
        supported_capabilities : collection of str
            What the asking device states it runs (``docs/protocol.md`` §10); empty: not stated.

        Returns
        -------
        (RoundSpec or None, bool)
            ``(spec, False)`` while a round is open; ``(None, True)`` once the campaign is
            finished or failed (nothing more to report).

        Raises
        ------
        NotFoundError
            Unknown campaign.
        RoundNotOpenError
            Between two rounds (a server step is running, or is about to be resumed): not an
            error of the caller, who asks again after the error's ``retry_after`` seconds.
        DeviceLacksCapabilitiesError
            The device stated capabilities that do not cover the open round.
        InvalidArgumentError
            A malformed capability name, or one listed twice.
        """
        try:
            supported = check_capability_names(supported_capabilities, what="supported_capabilities")
        except InvalidParameterError as exc:
            raise InvalidArgumentError(str(exc), field="supported_capabilities") from None
        record = self._store.get_campaign(campaign_id)
        if record.state != COLLECTING:
            return None, True
        round_record = self._open_round_record(record)
        if round_record is None:
            raise RoundNotOpenError(
                f"campaign {campaign_id} has no open round yet: round {record.current_round} closed and the "
                f"next round is being prepared; ask again in {ROUND_NOT_OPEN_RETRY_SECONDS:g} s",
                retry_after=ROUND_NOT_OPEN_RETRY_SECONDS)
        spec = self._spec(campaign_id, round_record)
        missing = missing_capabilities(spec.required_capabilities, supported) if supported else ()
        if missing:
            raise DeviceLacksCapabilitiesError(
                f"campaign {campaign_id} round {spec.round} needs capabilities the device does not support: "
                f"{', '.join(missing)}", missing)
        return spec, False

    def _round_context(self, campaign_id: str) -> tuple[RoundContext | Rejection, AccumulateFn | None]:
        """The open round of a campaign (or why its reports are rejected) and its accumulator."""
        try:
            record = self._store.get_campaign(campaign_id)
        except NotFoundError:
            return Rejection(RejectionCode.UNKNOWN_CAMPAIGN, f"campaign {campaign_id} does not exist"), None
        if record.state != COLLECTING:
            return Rejection(RejectionCode.CAMPAIGN_NOT_COLLECTING, f"campaign {campaign_id} is {record.state}"), None
        round_record = self._open_round_record(record)
        if round_record is None:  # between two rounds: a report now is for a round that closed (module docstring)
            return Rejection(RejectionCode.ROUND_NOT_OPEN,
                             f"round {record.current_round} of campaign {campaign_id} closed before the report "
                             f"arrived (the next round is being prepared)"), None
        spec = self._spec(campaign_id, round_record)
        context = RoundContext(campaign_id=campaign_id, round=round_record.round, spec=spec)
        return context, self._accumulate_fn(record, spec)

    def submit(self, request_id: str, reports: Sequence[Report | ProtocolError], *,
               assign: Assign | None = None) -> list[tuple[Outcome, str]]:
        """Validate, store and acknowledge a batch of reports (partial success).

        Parameters
        ----------
        request_id : str
            Idempotency key of the batch (1 to 128 characters): a replayed request gets the first
            answer for the reports it stored.
        reports : sequence of Report or ProtocolError
            The batch in request order; a :class:`ProtocolError` stands for a report that could
            not be decoded (``ldp_client.report.unpack_batch``) and is rejected with its message.
            A :class:`~ldp_client.report.ReportColumns` (what the service decodes) is validated,
            stored and accumulated column by column, with the same outcomes.
        assign : callable, optional
            For the batch of an enrolled device: ``(campaign_id, round) -> RoundAssignment`` of that
            device (:meth:`ldp_collector.defences.EnrolmentAuthority.assignment`); a report without
            exactly its assigned id and hash seeds is rejected.

        Returns
        -------
        list of (Outcome, str)
            One ``(outcome, reason)`` per report, in request order; the reason is empty unless the
            report was rejected, and then a :class:`~ldp_collector.ingest.Rejection` (with its code). ACCEPTED and DUPLICATE reports are durably stored when this
            returns; rejected ones changed nothing, and a batch rejected entirely records nothing.

        Raises
        ------
        InvalidArgumentError
            Bad ``request_id`` or an oversized batch.
        """
        check_request_id(request_id)
        campaign_ids = sorted(reports.distinct_campaign_ids() if isinstance(reports, ReportColumns)
                              else {r.campaign_id for r in reports if isinstance(r, Report)})
        contexts: dict[str, RoundContext | Rejection] = {}
        functions: dict[tuple[str, int], AccumulateFn] = {}
        # Locks exist only for real campaigns, so made-up campaign ids cost no memory.
        existing = [cid for cid in campaign_ids if self._exists(cid)]
        for cid in set(campaign_ids).difference(existing):
            contexts[cid] = Rejection(RejectionCode.UNKNOWN_CAMPAIGN, f"campaign {cid} does not exist")
        with contextlib.ExitStack() as held:
            # Sorted acquisition: a batch never waits for a lock while holding a later one.
            for cid in existing:
                held.enter_context(self._campaign_locks(cid).ingest.read())
            for cid in existing:
                context, fn = self._round_context(cid)
                contexts[cid] = context
                if isinstance(context, RoundContext) and fn is not None:
                    functions[(cid, context.round)] = fn
            batch = validate_batch(reports, contexts.__getitem__, assign=assign)
            stored = (self._store.add_reports(_store_request_id(request_id, batch.valid),
                                              batch.valid, accumulate=_dispatch_accumulate(functions))
                      if batch.valid else [])
            outcomes = batch.merge(stored)
        if any(outcome == Outcome.ACCEPTED for outcome, _ in outcomes):
            for context in contexts.values():
                if isinstance(context, RoundContext):
                    self._auto_close_if_full(context.campaign_id, context.round)
        return outcomes

    def get_result(self, campaign_id: str) -> Result:
        """The campaign's result: complete once FINISHED; state only (and the error) otherwise.

        Raises
        ------
        NotFoundError
            Unknown campaign.
        """
        record = self._store.get_campaign(campaign_id)
        if record.state == FINISHED and record.result:
            return result_from_bytes(record.result, where=f"result of campaign {campaign_id}")
        if record.state == FAILED:
            return Result(campaign_id=campaign_id, state=CampaignState.FAILED, warnings=(record.error,))
        return Result(campaign_id=campaign_id, state=CampaignState.COLLECTING)

    # -- operator side ---------------------------------------------------------------------------
    def create_campaign(self, config: CampaignConfig) -> Campaign:
        """Validate a configuration, store the campaign and open its first round.

        Raises
        ------
        InvalidArgumentError
            A bad field, or a kind that is not implemented yet.
        AlreadyExistsError
            The campaign id is taken.
        OverloadedError
            Another collector process held the id's step lock for ``STEP_LOCK_WAIT_SECONDS``
            (it runs a step of an existing campaign of that id): retry later.
        """
        prepared = prepare_campaign(config)
        cid = prepared.config.campaign_id
        plan = prepared.engine.first_round()
        # The store's step lock too: another process's tick must not take this campaign, seen
        # between its creation and its first round, for an interrupted creation and open that round.
        with self._campaign_locks(cid).step, self._wait_for_store_step_lock(cid):
            now = self._clock()
            spec = self._checked_plan_spec(cid, plan, prepared.config, now, after_round=0)
            self._store.create_campaign(CampaignRecord(
                campaign_id=cid, config=config_to_bytes(prepared.config), state=COLLECTING,
                current_round=spec.round, created_at=now, engine_state=plan.engine_state))
            with self._lock:
                self._configs[cid] = prepared.config
                self._engines[cid] = prepared.engine
            self._store.open_round(cid, spec.round, spec.pack(), now)
        log.info("campaign created", extra={"campaign_id": cid, "kind": prepared.config.kind, "round": spec.round})
        return self.get_campaign(cid)

    def list_campaigns(self, page_size: int = 0, page_token: str = "") -> tuple[list[Campaign], str]:
        """One page of campaigns ordered by id.

        Parameters
        ----------
        page_size : int
            Campaigns per page (0: 50; at most 1000).
        page_token : str
            ``next_page_token`` of the previous page, empty for the first.

        Returns
        -------
        (list of Campaign, str)
            The page and the token of the next one (empty on the last page).
        """
        if page_size < 0:
            raise InvalidArgumentError(f"page_size must be >= 0, got {page_size}")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        after = _decode_page_token(page_token) if page_token else ""
        records = self._store.list_campaigns(size + 1, after)
        campaigns = [self._campaign(r) for r in records[:size]]
        next_token = _encode_page_token(records[size - 1].campaign_id) if len(records) > size else ""
        return campaigns, next_token

    def get_campaign(self, campaign_id: str) -> Campaign:
        """The campaign with its current round spec and the status of every round.

        Raises
        ------
        NotFoundError
            Unknown campaign.
        """
        return self._campaign(self._store.get_campaign(campaign_id))

    def _campaign(self, record: CampaignRecord) -> Campaign:
        statuses = []
        current: RoundSpec | None = None
        for rr in self._store.list_rounds(record.campaign_id):
            # Open rounds grow; a closed round's count is the store's (counted when it reports 0).
            live = self._store.count_reports(record.campaign_id, rr.round) if rr.open or not rr.report_count else None
            statuses.append(round_status(rr, live))
            if rr.open and record.state == COLLECTING and rr.round == record.current_round:
                current = self._spec(record.campaign_id, rr)
        return campaign_of(record, self._config(record), statuses, current)

    def campaign_events(self, campaign_id: str) -> tuple[Campaign, int]:
        """A progress snapshot (what ``WatchCampaign`` streams): the campaign and its current round's reports.

        Returns
        -------
        (Campaign, int)
            The campaign, and the reports of its current round (0 once it is not collecting).
        """
        record = self._store.get_campaign(campaign_id)
        campaign = self._campaign(record)
        reports = 0
        if record.state == COLLECTING:
            with contextlib.suppress(NotFoundError):
                reports = self._store.count_reports(campaign_id, record.current_round)
        return campaign, reports

    def close_round(self, campaign_id: str, round: int, *,
                    reports: Callable[[str, int], RoundReports] | None = None) -> Campaign:
        """Close the open round ``round`` now and run the server step.

        ``reports(campaign_id, round)``, called once the round is closed, gives the engine the
        round's reports and accumulators from elsewhere than the store (the Beam step of
        :mod:`ldp_collector.beam`: accumulators computed on a distributed engine from the round's
        export); its errors propagate and leave the round closed for :meth:`tick` to resume
        in-process.

        Returns the campaign afterwards: in its next round, FINISHED with a result, or FAILED with
        the engine's error (the reports are kept). If the round is already closed and its server
        step was interrupted (the process running it died), this resumes the step and returns the
        campaign after it.

        Raises
        ------
        NotFoundError
            Unknown campaign.
        FailedPreconditionError
            The campaign is not collecting, ``round`` is not its open round, or the round holds
            fewer than ``min_reports_per_round`` reports.
        """
        with self._campaign_locks(campaign_id).step, self._wait_for_store_step_lock(campaign_id):
            self._close_locked(campaign_id, round, reports=reports)
        return self.get_campaign(campaign_id)

    def get_estimates(self, campaign_id: str, round: int = 0,
                      confidence: float = DEFAULT_CONFIDENCE) -> Estimates:
        """The estimates of a closed round.

        Parameters
        ----------
        campaign_id : str
        round : int
            The round; 0 for the latest closed round with estimates.
        confidence : float
            Level of the normal intervals ``estimate +- z std_error`` around the unbiased estimate,
            in (0, 1) (0 means 0.95).

        Raises
        ------
        NotFoundError
            Unknown campaign or round.
        FailedPreconditionError
            The round is still open or produced no estimates (or, for ``round=0``, none has yet).
        InvalidArgumentError
            ``confidence`` outside (0, 1).
        """
        if confidence == 0:
            confidence = DEFAULT_CONFIDENCE
        # 0.5 + confidence / 2 must stay below 1 in floating point for the normal quantile: at most 1 - 2^-52.
        if not (math.isfinite(confidence) and 0.0 < confidence < 1.0 and 0.5 + confidence / 2.0 < 1.0):
            raise InvalidArgumentError(f"confidence must be in (0, 1), at most 1 - 2^-52, got {confidence!r}")
        if round < 0:
            raise InvalidArgumentError(f"round must be >= 0, got {round}")
        record = self._store.get_campaign(campaign_id)
        if round == 0:
            with_estimates = [r for r in self._store.list_rounds(campaign_id) if r.estimates is not None]
            if not with_estimates:
                never = f" (it failed: {record.error})" if record.state == FAILED else " yet"
                raise FailedPreconditionError(f"campaign {campaign_id} has no closed round with estimates{never}",
                                              reason=ErrorReason.NO_ESTIMATES)
            rr = with_estimates[-1]
        else:
            rr = self._store.get_round(campaign_id, round)
            if rr.open:
                raise FailedPreconditionError(f"round {round} of campaign {campaign_id} is still open",
                                              reason=ErrorReason.ROUND_STILL_OPEN)
            if rr.estimates is None:
                raise FailedPreconditionError(f"round {round} of campaign {campaign_id} produced no estimates",
                                              reason=ErrorReason.NO_ESTIMATES)
        estimates = estimates_from_bytes(rr.estimates or b"", where=f"estimates of round {rr.round} of {campaign_id}")
        if abs(estimates.confidence - confidence) > 1e-12:
            z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
            # Intervals are centred on the unbiased estimate, which differs from ``count`` once
            # consistency post-processing moved it.
            centers = [(e.ci_lower + e.ci_upper) / 2.0 if e.std_error > 0 else e.count for e in estimates.estimates]
            estimates = dataclasses.replace(estimates, confidence=confidence, estimates=tuple(
                dataclasses.replace(e, ci_lower=center - z * e.std_error, ci_upper=center + z * e.std_error)
                for e, center in zip(estimates.estimates, centers)))
        return estimates

    def tick(self) -> int:
        """Close every round that is due and resume interrupted server steps at once.

        A step is interrupted when its campaign's current round is closed (or its first round was
        never opened) and no live process holds the campaign's step lock.

        A round is due when its ``round_duration`` has elapsed or it holds ``close_after_reports``
        reports, and it holds at least ``min_reports_per_round``. Errors of one campaign are
        logged and do not stop the others.

        Returns
        -------
        int
            Number of rounds this call closed.
        """
        closed = 0
        after = ""
        while True:
            records = self._store.list_campaigns(_LIST_CHUNK, after)
            for record in records:
                if record.state != COLLECTING:
                    continue
                try:
                    if self._tick_campaign(record):
                        closed += 1
                except Exception:  # one broken campaign must not stop the others
                    log.exception("tick failed", extra={"campaign_id": record.campaign_id})
            if len(records) < _LIST_CHUNK:
                return closed
            after = records[-1].campaign_id

    # -- server steps ----------------------------------------------------------------------------
    def _tick_campaign(self, record: CampaignRecord) -> bool:
        now = self._clock()
        cid = record.campaign_id
        try:
            rr = self._store.get_round(cid, record.current_round)
        except NotFoundError:
            self._with_step_lock(cid, self._reopen_first_round)
            return False
        if not rr.open:  # a step runs (its holder keeps the lock: skipped) or was interrupted: resume it
            self._with_step_lock(cid, self._resume_step)
            return False
        config = self._config(record)
        count = self._store.count_reports(cid, rr.round)
        if count < config.min_reports_per_round:
            return False
        expired = (config.round_duration is not None
                   and now >= rr.opened_at + config.round_duration.total_seconds)
        full = 0 < config.close_after_reports <= count
        if not (expired or full):
            return False
        return self._with_step_lock(cid, lambda c: self._close_locked(c, rr.round, auto=True))

    def _with_step_lock(self, campaign_id: str, step: Callable[[str], bool | None]) -> bool:
        """Run ``step`` under the campaign's step lock unless another step holds it (then skip).

        Two locks: this process's thread lock, then the store's cross-process
        :meth:`~ldp_collector.storage.base.ReportStore.step_lock`, so a collector process never
        resumes (or runs) a step another live process is running; a dead process's lock is gone,
        so its interrupted step is resumed by the next ``tick`` -- the first one of a restarted
        collector.
        """
        lock = self._campaign_locks(campaign_id).step
        if not lock.acquire(blocking=False):
            return False
        try:
            with self._store.step_lock(campaign_id) as held:
                return bool(step(campaign_id)) if held else False
        finally:
            lock.release()

    @contextlib.contextmanager
    def _wait_for_store_step_lock(self, campaign_id: str) -> Iterator[None]:
        """Hold the store's cross-process step lock, waiting up to :data:`STEP_LOCK_WAIT_SECONDS`
        while another collector process runs a step of the campaign (an operator's close waits
        instead of skipping); ``OverloadedError`` (retry later) if it is still busy then."""
        deadline = time.monotonic() + STEP_LOCK_WAIT_SECONDS
        while True:
            with self._store.step_lock(campaign_id) as held:
                if held:
                    yield
                    return
            if time.monotonic() >= deadline:
                raise OverloadedError(f"another collector process is running a server step of campaign "
                                      f"{campaign_id}; retry later", retry_after=1.0, reason=ErrorReason.STEP_RUNNING)
            time.sleep(0.05)

    def _auto_close_if_full(self, campaign_id: str, round: int) -> None:
        with self._lock:
            cached = self._configs.get(campaign_id)
        if cached is not None and cached.close_after_reports <= 0:  # configs never change: no read needed
            return
        try:
            record = self._store.get_campaign(campaign_id)
            config = self._config(record)
            if config.close_after_reports <= 0 or record.current_round != round or record.state != COLLECTING:
                return
            if self._store.count_reports(campaign_id, round) < config.close_after_reports:
                return
            self._with_step_lock(campaign_id, lambda c: self._close_locked(c, round, auto=True))
        except Exception:  # the batch is committed and acknowledged; tick() retries the close
            log.exception("automatic close failed", extra={"campaign_id": campaign_id, "round": round})

    def _close_locked(self, campaign_id: str, round: int, *, auto: bool = False,
                      reports: Callable[[str, int], RoundReports] | None = None) -> bool:
        """Close ``round`` and run the server step; the caller holds both step locks.

        Returns whether this call closed the round. With ``auto`` a round that is no longer open
        or below its minimum is left alone instead of raising; without it, a closed current round
        has its interrupted step resumed.
        """
        record = self._store.get_campaign(campaign_id)
        if record.state != COLLECTING:
            if auto:
                return False
            raise FailedPreconditionError(f"campaign {campaign_id} is {record.state}; it has no open round")
        if round != record.current_round:
            if auto:
                return False
            raise FailedPreconditionError(
                f"round {round} is not open; the open round of campaign {campaign_id} is {record.current_round}",
                reason=ErrorReason.ROUND_MISMATCH)
        rr = self._store.get_round(campaign_id, round)
        if not rr.open:
            # Closed, still current, and we hold the step lock: the step that closed it was
            # interrupted (a live process would still hold the lock). An operator's close resumes it
            # rather than answer OK over a campaign stuck between rounds; an automatic one leaves
            # that to tick().
            if not auto:
                self._resume_step(campaign_id, reports=reports)
            return False
        minimum = self._config(record).min_reports_per_round
        with self._campaign_locks(campaign_id).ingest.write():
            count = self._store.count_reports(campaign_id, round)
            if count < minimum:
                if auto:
                    return False
                raise FailedPreconditionError(
                    f"round {round} of campaign {campaign_id} holds {count} reports; "
                    f"min_reports_per_round is {minimum}", reason=ErrorReason.TOO_FEW_REPORTS)
            won = self._store.close_round(campaign_id, round, self._clock())
        if not won:
            return False
        log.info("round closed", extra={"campaign_id": campaign_id, "round": round, "reports": count})
        self._advance(record, rr, reports=reports)
        return True

    def _resume_step(self, campaign_id: str, *, reports: Callable[[str, int], RoundReports] | None = None) -> bool:
        """Finish an interrupted server step (caller holds the step lock)."""
        record = self._store.get_campaign(campaign_id)
        if record.state != COLLECTING:
            return False
        rr = self._store.get_round(campaign_id, record.current_round)
        if rr.open:
            return False
        later = [r for r in self._store.list_rounds(campaign_id) if r.round > rr.round]
        if later:  # the next round was opened but the campaign record not updated
            self._store.update_campaign(campaign_id, current_round=later[-1].round)
            log.warning("resumed campaign at its next round", extra={"campaign_id": campaign_id,
                                                                     "round": later[-1].round})
            return False
        log.warning("resuming interrupted server step", extra={"campaign_id": campaign_id, "round": rr.round})
        self._advance(record, rr, reports=reports)
        return False

    def _reopen_first_round(self, campaign_id: str) -> bool:
        """Open the first round of a campaign whose creation was interrupted (caller holds the step lock)."""
        record = self._store.get_campaign(campaign_id)
        if record.state != COLLECTING or self._store.list_rounds(campaign_id):
            return False
        engine = self._engine(record)
        plan = engine.first_round()
        now = self._clock()
        spec = self._checked_plan_spec(campaign_id, plan, self._config(record), now, after_round=0)
        self._store.open_round(campaign_id, spec.round, spec.pack(), now)
        self._store.update_campaign(campaign_id, current_round=spec.round, engine_state=plan.engine_state)
        log.warning("opened the first round of an interrupted campaign", extra={"campaign_id": campaign_id})
        return False

    def _checked_plan_spec(self, campaign_id: str, plan: RoundPlan, config: CampaignConfig,
                           now: float, *, after_round: int, closing: RoundSpec | None = None) -> RoundSpec:
        """The plan's spec with the round deadline set; engine mistakes raise ``RuntimeError``.

        After the first round (``closing``: the round just closed) the spec carries the campaign's
        group weights, those of its first round (docs/protocol.md section 9.2: a device draws its
        group once and keeps it). Engines derive their weights from their parameters and module
        constants; a release that changes a constant while a campaign is in flight must not change
        the shares late devices draw from, nor what the engine plans from them. A plan with another
        number of groups is an engine mistake.
        """
        spec = plan.spec
        if not isinstance(spec, RoundSpec) or spec.campaign_id != campaign_id or spec.round <= after_round:
            raise RuntimeError(
                f"engine planned an invalid round for campaign {campaign_id}: it must be a RoundSpec of this "
                f"campaign with a round number above {after_round}")
        if closing is not None and spec.group_weights != closing.group_weights:
            if len(spec.group_weights) != len(closing.group_weights):
                raise RuntimeError(
                    f"engine planned round {spec.round} with {len(spec.group_weights)} groups, but the campaign "
                    f"has {len(closing.group_weights)}: group weights never change within a campaign")
            log.info("round %d keeps the campaign's group weights (the engine planned others)", spec.round,
                     extra={"campaign_id": campaign_id, "round": spec.round})
            spec = dataclasses.replace(spec, group_weights=closing.group_weights)
        check_allowed_oracles(spec, config)
        if config.round_duration is not None:
            spec = dataclasses.replace(spec, deadline=now + config.round_duration.total_seconds)
        return spec

    def _advance(self, record: CampaignRecord, rr: RoundRecord, *,
                 reports: Callable[[str, int], RoundReports] | None = None) -> None:
        """Run the engine on the closed round ``rr`` and store what it produced.

        An engine failure marks the campaign FAILED with the error (the reports stay stored);
        storage failures, and those of ``reports`` (:meth:`close_round`), propagate, leaving a
        closed round that :meth:`tick` resumes.
        """
        cid = record.campaign_id
        config = self._config(record)
        round_reports = (reports(cid, rr.round) if reports is not None
                         else _StoredRoundReports(self._store, cid, rr.round))
        try:
            engine = self._engine(record)
            closing = self._spec(cid, rr)
            outcome = engine.close_round(closing, round_reports, record.engine_state)
            if not isinstance(outcome, RoundOutcome):
                raise TypeError(f"close_round returned {type(outcome).__name__}, not a RoundOutcome")
            if outcome.next_round is None and outcome.result is None:
                raise RuntimeError("the engine produced neither a next round nor a result")
            now = self._clock()
            next_spec = (self._checked_plan_spec(cid, outcome.next_round, config, now, after_round=rr.round,
                                                 closing=closing)
                         if outcome.next_round is not None else None)
        except Exception as exc:  # an engine bug or a degenerate round: fail the campaign, keep the reports
            log.exception("server step failed", extra={"campaign_id": cid, "round": rr.round})
            self._store.update_campaign(cid, state=FAILED, error=f"round {rr.round}: {type(exc).__name__}: {exc}")
            return
        if outcome.estimates is not None:
            estimates = dataclasses.replace(outcome.estimates, campaign_id=cid, round=rr.round)
            self._store.set_round_estimates(cid, rr.round, estimates_to_bytes(estimates))
        if next_spec is not None and outcome.next_round is not None:
            self._store.open_round(cid, next_spec.round, next_spec.pack(), now)
            self._store.update_campaign(cid, current_round=next_spec.round,
                                        engine_state=outcome.next_round.engine_state)
            log.info("round opened", extra={"campaign_id": cid, "round": next_spec.round,
                                            **{f"diag_{k}": v for k, v in outcome.diagnostics.items()}})
            return
        if outcome.result is not None:
            self._store.update_campaign(cid, state=FINISHED, result=result_to_bytes(self._final_result(
                cid, rr.round, outcome.result, outcome.diagnostics, now)))
        log.info("campaign finished", extra={"campaign_id": cid, "round": rr.round})

    @staticmethod
    def _final_result(campaign_id: str, round: int, result: Result, diagnostics: Mapping[str, float],
                      now: float) -> Result:
        """The engine's result with the collector's fields set: ids, state, finish time, diagnostics."""
        estimates = result.estimates
        if estimates is not None:
            estimates = dataclasses.replace(estimates, campaign_id=campaign_id, round=round)
        return dataclasses.replace(result, campaign_id=campaign_id, state=CampaignState.FINISHED, finished_at=now,
                                   estimates=estimates, diagnostics={**result.diagnostics, **diagnostics})
