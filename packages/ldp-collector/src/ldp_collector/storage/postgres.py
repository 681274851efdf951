"""The PostgreSQL report store: several collector processes, on one host or many, share one campaign state.

Requires the ``postgres`` extra (``pip install 'ldp-collector[postgres]'``, psycopg 3); the module
imports psycopg when a store is opened, so ``ldp_collector.storage`` works without it.

Schema
------
The tables mirror the SQLite schema (:mod:`ldp_collector.storage.migrations`), with ``BYTEA`` for
``BLOB`` and ids in the ``"C"`` collation (so ``list_campaigns`` orders them as Python compares
``str``). The schema is versioned in ``schema_migrations`` and migrated on open, in one transaction
that first takes a transaction-level advisory lock, so several processes opening one new database
at once apply each migration exactly once; a database written by a newer release is refused with
:class:`~ldp_collector.storage.migrations.SchemaVersionError`. Tables live in the connection's
``search_path`` schema: several deployments may share one database with
``?options=-csearch_path%3D<schema>`` in the URL (the schema must exist). ``reports`` has no
foreign key to ``rounds``: a per-row foreign-key check would cost more than the insert, and
reports are only ever inserted by a transaction that holds the round's row lock.

Consistency across processes
----------------------------
Everything ``add_reports`` decides is decided inside its transaction. It first locks the row of
every round its batch targets (``SELECT ... FOR UPDATE``, in key order, so two writers never wait on
each other in opposite orders), then reads ``is_open`` and ``report_count`` (the next ``seq``),
inserts the new ids into ``report_ids`` (``ON CONFLICT DO NOTHING RETURNING``: the ids not returned
are DUPLICATE; a conflicting id that another transaction has not committed yet makes PostgreSQL
wait for that transaction's outcome), inserts the new reports, updates the accumulators and
``report_count`` and records the answer under the request id; then commits with
``synchronous_commit = on`` (the commit is on disk when it returns). So writers of one round
serialize on its row, and ``close_round``'s ``UPDATE ... WHERE is_open = 1`` waits for in-flight
ingestion of the round to commit, while a writer that locks the row after a close commits sees the
round closed and answers REJECTED: no report lands in a round after ``close_round`` returned
``True``. A request id recorded by a concurrent transaction (another process answered the same
request) makes the group start over, and then it replays the recorded answer. A deadlock (two
batches of different rounds sharing report ids, written by two processes at once) or a lost
connection (a database restart) rolls the group back and it is retried, on a new connection if
needed (a lost COMMIT that did land is then found recorded and replayed). If the database stays
unreachable, the callers get :class:`~ldp_collector.errors.OverloadedError` (UNAVAILABLE) and
retry the same request, which is idempotent. A read on a lost connection fails the same way once,
and drops the idle connections, which the restart also ended.

Writes: one writer thread, group commit
---------------------------------------
Like the SQLite store, every write of one store object goes through one writer thread and one
connection: while a transaction commits, new requests queue up and the next transaction takes all
of them. Each round's reports go in with two statements (``INSERT ... SELECT FROM unnest(...)`` of
binary arrays of ids, groups and payloads), not one round trip per report. Because every writer of
a round must hold its row lock until its commit is durable, writers of one round serialize whatever
their number; a connection pool (one transaction per caller) therefore commits one batch per
``fsync``, while the writer thread commits a whole group per ``fsync``, and measured faster (see
:class:`PostgresReportStore`), so there is no pool for writes.

Reads and the step lock
-----------------------
Reads use a small pool of autocommit connections, each query its own snapshot. :meth:`step_lock`
holds a session-level ``pg_try_advisory_lock`` on a dedicated connection: PostgreSQL releases it
when that connection ends, also when the process holding it dies.
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import urlsplit, urlunsplit

import msgpack

from ..errors import AlreadyExistsError, CollectorError, InvalidArgumentError, NotFoundError, OverloadedError
from .base import AccumulateFn, CampaignRecord, Outcome, ReportStore, RoundRecord, StoreClosedError, StoredReport
from .migrations import Migration, SchemaVersionError
from .sqlite import _check_blobs, _columns, _take, _validate_round_key

if TYPE_CHECKING:
    import psycopg

__all__ = ["MAX_GROUP_REPORTS", "POSTGRES_MIGRATIONS", "PostgresReportStore", "redact_url"]

#: Most reports the writer puts into one transaction (bounds latency and memory).
MAX_GROUP_REPORTS = 100_000
#: Most requests in one transaction.
MAX_GROUP_REQUESTS = 256

_REPORT_ID_BYTES = 16
_MAX_U32 = 2**32 - 1
_MAX_IDLE_READERS = 8
#: Times a group is retried after a deadlock or a concurrent answer to one of its request ids.
_MAX_GROUP_ATTEMPTS = 5
_CONNECT_TIMEOUT_S = 10
#: Key of the transaction-level advisory lock held while migrating ("ldp-migr" as a big-endian int64).
_MIGRATION_LOCK_KEY = int.from_bytes(b"ldp-migr", "big", signed=True)

_SCHEMA_MIGRATIONS_DDL = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     BIGINT PRIMARY KEY,
    name        TEXT NOT NULL,
    applied_at  DOUBLE PRECISION NOT NULL
)"""

POSTGRES_MIGRATIONS: tuple[Migration, ...] = (
    Migration(version=1, name="initial schema", statements=(
        """
        CREATE TABLE campaigns (
            campaign_id    TEXT COLLATE "C" PRIMARY KEY,
            config         BYTEA NOT NULL,
            state          TEXT NOT NULL,
            current_round  BIGINT NOT NULL,
            created_at     DOUBLE PRECISION NOT NULL,
            engine_state   BYTEA NOT NULL,
            result         BYTEA,
            error          TEXT NOT NULL
        )""",
        """
        CREATE TABLE rounds (
            campaign_id   TEXT COLLATE "C" NOT NULL REFERENCES campaigns (campaign_id),
            round         BIGINT NOT NULL,
            spec          BYTEA NOT NULL,
            is_open       SMALLINT NOT NULL CHECK (is_open IN (0, 1)),
            opened_at     DOUBLE PRECISION NOT NULL,
            closed_at     DOUBLE PRECISION,
            report_count  BIGINT NOT NULL DEFAULT 0,
            estimates     BYTEA,
            PRIMARY KEY (campaign_id, round)
        )""",
        """
        CREATE TABLE reports (
            campaign_id  TEXT COLLATE "C" NOT NULL,
            round        BIGINT NOT NULL,
            seq          BIGINT NOT NULL,
            report_id    BYTEA NOT NULL,
            group_index  BIGINT NOT NULL,
            payloads     BYTEA NOT NULL,
            PRIMARY KEY (campaign_id, round, seq)
        )""",
        """
        CREATE TABLE report_ids (
            report_id  BYTEA PRIMARY KEY
        )""",
        """
        CREATE TABLE request_ids (
            request_id  TEXT PRIMARY KEY,
            response    BYTEA NOT NULL,
            created_at  DOUBLE PRECISION NOT NULL
        )""",
        """
        CREATE TABLE accumulators (
            campaign_id  TEXT COLLATE "C" NOT NULL,
            round        BIGINT NOT NULL,
            name         TEXT NOT NULL,
            data         BYTEA NOT NULL,
            PRIMARY KEY (campaign_id, round, name),
            FOREIGN KEY (campaign_id, round) REFERENCES rounds (campaign_id, round)
        )""",
    )),
)

_CAMPAIGN_COLUMNS = "campaign_id, config, state, current_round, created_at, engine_state, result, error"
_ROUND_COLUMNS = "campaign_id, round, spec, is_open, opened_at, closed_at, report_count, estimates"

# The rounds a group writes, locked in key order (the sort runs below the row locking).
_LOCK_ROUNDS = ("SELECT r.campaign_id, r.round, r.is_open, r.report_count FROM rounds AS r "
                "JOIN unnest(%b::text[], %b::bigint[]) AS k (campaign_id, round) "
                "ON r.campaign_id = k.campaign_id AND r.round = k.round "
                "ORDER BY r.campaign_id, r.round FOR UPDATE OF r")
_INSERT_IDS = ("INSERT INTO report_ids (report_id) SELECT * FROM unnest(%b::bytea[]) "
               "ON CONFLICT DO NOTHING RETURNING report_id")
_EXISTING_IDS = "SELECT report_id FROM report_ids WHERE report_id = ANY(%b::bytea[])"
_INSERT_REPORTS = ("INSERT INTO reports (campaign_id, round, seq, report_id, group_index, payloads) "
                   "SELECT %b, %b, %b + t.n - 1, t.report_id, t.group_index, t.payloads "
                   "FROM unnest(%b::bytea[], %b::bigint[], %b::bytea[]) WITH ORDINALITY "
                   "AS t (report_id, group_index, payloads, n)")
_UPSERT_ACCUMULATORS = ("INSERT INTO accumulators (campaign_id, round, name, data) "
                        "SELECT %b, %b, t.name, t.data FROM unnest(%b::text[], %b::bytea[]) AS t (name, data) "
                        "ON CONFLICT (campaign_id, round, name) DO UPDATE SET data = excluded.data")
_INSERT_RESPONSES = ("INSERT INTO request_ids (request_id, response, created_at) "
                     "SELECT * FROM unnest(%b::text[], %b::bytea[], %b::float8[]) "
                     "ON CONFLICT DO NOTHING RETURNING request_id")

T = TypeVar("T")


def _psycopg() -> Any:
    """The psycopg module, or a clear error naming the extra that installs it."""
    try:
        import psycopg
    except ImportError as exc:
        raise InvalidArgumentError(
            "the PostgreSQL store needs psycopg 3: pip install 'ldp-collector[postgres]'") from exc
    return psycopg


def redact_url(url: str) -> str:
    """``url`` without its password, for messages and logs.

    Parameters
    ----------
    url : str
        A ``postgresql://`` URL.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _normalize_url(url: str) -> str:
    """``postgresql+<driver>://`` and ``postgres://`` as the plain ``postgresql://`` libpq reads."""
    scheme, sep, rest = url.partition("://")
    if not sep or not (scheme.lower() in ("postgresql", "postgres") or scheme.lower().startswith("postgresql+")):
        raise InvalidArgumentError(f"not a PostgreSQL URL: {redact_url(url)!r}; use postgresql://[user@]host/db")
    return f"postgresql://{rest}"


# -- requests to the writer thread ------------------------------------------------------------------

@dataclass(slots=True)
class _Chunk:
    """The reports of one request that target one round, as the columns the bulk INSERT sends."""

    campaign_id: str
    round: int
    positions: Sequence[int]  # index of each report in the request
    reports: Sequence[StoredReport]
    ids: list[bytes]
    groups: list[int]
    payloads: list[bytes]

    @classmethod
    def encode(cls, campaign_id: str, round: int, positions: Sequence[int],
               reports: Sequence[StoredReport]) -> _Chunk:
        columns = _columns(reports)
        if columns is not None:
            ids, groups, payloads = list(columns.report_ids), list(columns.groups), list(columns.payloads)
        else:
            ids = [r.report_id for r in reports]
            groups = [r.group for r in reports]
            payloads = [r.payloads for r in reports]
        if not set(map(type, payloads)) <= {bytes}:
            bad = next(p for p in payloads if type(p) is not bytes)
            raise InvalidArgumentError(f"payloads must be bytes, got {type(bad).__name__}")
        return cls(campaign_id=campaign_id, round=round, positions=positions, reports=reports, ids=ids,
                   groups=groups, payloads=payloads)

    def subset(self, keep: Sequence[int]) -> _Chunk:
        """The chunk restricted to the reports at ``keep`` (indexes into this chunk)."""
        return _Chunk(campaign_id=self.campaign_id, round=self.round, positions=[self.positions[k] for k in keep],
                      reports=_take(self.reports, keep), ids=[self.ids[k] for k in keep],
                      groups=[self.groups[k] for k in keep], payloads=[self.payloads[k] for k in keep])


@dataclass(slots=True)
class _AddRequest:
    request_id: str
    size: int
    #: Pre-filled outcomes: DUPLICATE for ids repeated within the request, None for the rest.
    outcomes: list[Outcome | None]
    chunks: list[_Chunk]
    accumulate: AccumulateFn | None
    future: Future[list[Outcome]] = field(default_factory=Future)


@dataclass(slots=True)
class _Operation(Generic[T]):
    """A write other than ``add_reports``, run by the writer in a transaction of its own."""

    run: Callable[[Any], T]
    future: Future[T] = field(default_factory=Future)


_STOP = object()


class _Restart(Exception):
    """The group must start over: another transaction answered one of its request ids meanwhile."""


def _prepare(request_id: str, reports: Sequence[StoredReport], accumulate: AccumulateFn | None) -> _AddRequest:
    """Validate and split a batch by round in the caller's thread."""
    n = len(reports)
    columns = _columns(reports)
    ids: Sequence[bytes]
    groups: Sequence[int]
    if columns is not None:
        ids, groups = columns.report_ids, columns.groups
        cids, rounds = columns.campaign_ids, columns.rounds
    else:
        if not all(isinstance(r, StoredReport) for r in reports):
            bad = next(r for r in reports if not isinstance(r, StoredReport))
            raise TypeError(f"reports must be StoredReport objects, got {type(bad).__name__}")
        ids = [r.report_id for r in reports]
        groups = [r.group for r in reports]
        cids, rounds = [r.campaign_id for r in reports], [r.round for r in reports]
    if not (set(map(type, ids)) <= {bytes} and set(map(len, ids)) <= {_REPORT_ID_BYTES}):
        bad_id = next(rid for rid in ids if type(rid) is not bytes or len(rid) != _REPORT_ID_BYTES)
        raise InvalidArgumentError(f"report_id must be {_REPORT_ID_BYTES} bytes, got {bad_id!r:.60}")
    if not set(map(type, groups)) <= {int} or (groups and not 0 <= min(groups) <= max(groups) <= _MAX_U32):
        bad_group = next(g for g in groups if type(g) is not int or not 0 <= g <= _MAX_U32)
        raise InvalidArgumentError(f"group must be an int in [0, {_MAX_U32}], got {bad_group!r:.40}")
    outcomes: list[Outcome | None] = [None] * n
    if len(set(ids)) == n:
        kept: Sequence[int] = range(n)
    else:  # the first occurrence of an id counts; later ones are duplicates
        seen: set[bytes] = set()
        kept = []
        for i, rid in enumerate(ids):
            if rid in seen:
                outcomes[i] = Outcome.DUPLICATE
            else:
                seen.add(rid)
                kept.append(i)
    keys = set(zip(cids, rounds))
    for key in keys:
        _validate_round_key(*key)
    by_round: dict[tuple[str, int], Sequence[int]] = {}
    if len(keys) == 1:
        by_round[next(iter(keys))] = kept
    else:
        split: dict[tuple[str, int], list[int]] = {}
        for i in kept:
            split.setdefault((cids[i], rounds[i]), []).append(i)
        by_round.update(split)
    chunks = [_Chunk.encode(cid, rnd, positions, _take(reports, positions))
              for (cid, rnd), positions in by_round.items() if positions]
    return _AddRequest(request_id=request_id, size=n, outcomes=outcomes, chunks=chunks, accumulate=accumulate)


@dataclass(slots=True)
class _RoundState:
    is_open: bool
    next_seq: int
    added: int = 0


def _campaign(row: Sequence[Any]) -> CampaignRecord:
    return CampaignRecord(campaign_id=row[0], config=bytes(row[1]), state=row[2], current_round=row[3],
                          created_at=row[4], engine_state=bytes(row[5]),
                          result=None if row[6] is None else bytes(row[6]), error=row[7])


def _round(row: Sequence[Any]) -> RoundRecord:
    return RoundRecord(campaign_id=row[0], round=row[1], spec=bytes(row[2]), open=bool(row[3]), opened_at=row[4],
                       closed_at=row[5], report_count=row[6], estimates=None if row[7] is None else bytes(row[7]))


def _require_round(conn: psycopg.Connection[Any], campaign_id: str, round: int) -> None:
    row = conn.execute("SELECT 1 FROM rounds WHERE campaign_id = %s AND round = %s", (campaign_id, round)).fetchone()
    if row is None:
        raise NotFoundError(f"round {round} of campaign {campaign_id!r} does not exist")


def _advisory_key(namespace: str, campaign_id: str) -> int:
    """A signed 64-bit advisory-lock key for a campaign's step lock in one schema."""
    digest = hashlib.blake2b(f"ldp-step\0{namespace}\0{campaign_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def apply_postgres_migrations(conn: psycopg.Connection[Any], migrations: Sequence[Migration] = POSTGRES_MIGRATIONS,
                              *, where: str = "the database") -> int:
    """Bring the schema up to date in one transaction under an advisory lock; the resulting version.

    Parameters
    ----------
    conn : psycopg.Connection
        An autocommit connection with no open transaction.
    migrations : sequence of Migration
        Versions 1, 2, 3, ... in order.
    where : str
        How error messages name the database (its URL without the password).

    Returns
    -------
    int
        The schema version after migrating.

    Raises
    ------
    SchemaVersionError
        The database holds a version newer than the last of ``migrations``.
    """
    for expected, migration in enumerate(migrations, start=1):
        if migration.version != expected:
            raise ValueError(f"migration versions must run 1, 2, 3, ... without gaps; "
                             f"position {expected} holds version {migration.version}")
    latest = migrations[-1].version if migrations else 0
    with conn.transaction():
        # Concurrent openers wait here; the second one then sees the first one's tables.
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_KEY,))
        conn.execute(_SCHEMA_MIGRATIONS_DDL)
        row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
        current = int(row[0]) if row is not None else 0
        if current > latest:
            raise SchemaVersionError(
                f"{where} has schema version {current}, newer than the {latest} this ldp-collector "
                f"understands; upgrade ldp-collector (or open a copy made by this version)")
        for migration in migrations[current:]:
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (%s, %s, %s)",
                         (migration.version, migration.name, time.time()))
    return latest


class PostgresReportStore(ReportStore):
    """The :class:`ReportStore` in a PostgreSQL database; thread-safe, durable, shared by processes.

    Parameters
    ----------
    url : str
        ``postgresql://[user[:password]@]host[:port]/database[?param=value...]`` (libpq URL;
        ``postgres://`` and ``postgresql+psycopg://`` are accepted too). The tables are created in
        the first schema of the connection's ``search_path``.
    max_pending_reports : int
        Reports that may wait for the writer at once; beyond that ``add_reports`` raises
        :class:`~ldp_collector.errors.OverloadedError` instead of queueing without bound.
    application_name : str
        Shown in ``pg_stat_activity``.

    Raises
    ------
    InvalidArgumentError
        psycopg is not installed, or ``url`` is not a PostgreSQL URL.
    CollectorError
        The server cannot be reached (the message names the URL without its password).
    SchemaVersionError
        The database was written by a newer ldp-collector.

    Notes
    -----
    Throughput with the workload of ``benchmarks/store_throughput.py`` (1000-report batches of
    16-byte payloads, a count-per-group accumulator, every commit durable; PostgreSQL 15 with
    ``fsync`` on, on the same 2-core machine as the client, shared with other jobs, so noisy):
    8 threads over one store object (group commit) 25-31k reports/s; the same 8 threads each
    with a store object of its own, i.e. one connection and one transaction per batch (what a
    connection pool gives), 20-23k reports/s, because writers of one round serialize on its row
    lock through their ``fsync``; 32 threads over one object 18-50k reports/s. Database time
    of one 1000-report transaction: about 20 ms (7.5 ms the ``report_ids`` insert, random keys
    into a B-tree; 6 ms the ``reports`` insert; 4 ms the commit's ``fsync``; 2 ms the rest), so
    a store object peaks near 50k reports/s and the Python side (the accumulate callback, the
    GIL shared with the callers) takes the rest. More collector processes over one database add
    throughput only across rounds or campaigns; within one round they serialize.
    """

    def __init__(self, url: str, *, max_pending_reports: int = 1_000_000,
                 application_name: str = "ldp-collector") -> None:
        if not isinstance(url, str):
            raise InvalidArgumentError(f"url must be a str, got {type(url).__name__}")
        if not isinstance(max_pending_reports, int) or max_pending_reports < 1:
            raise InvalidArgumentError(f"max_pending_reports must be a positive int, got {max_pending_reports!r}")
        self._psycopg = _psycopg()
        self._url = _normalize_url(url)
        self._where = redact_url(self._url)
        self._application_name = application_name
        self._max_pending = max_pending_reports
        self._lock = threading.Lock()
        self._closed = False
        self._pending = 0
        self._idle_readers: list[psycopg.Connection[Any]] = []
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        # The step lock: a dedicated session, the campaigns this object holds, and its own lock.
        self._step_guard = threading.Lock()
        self._step_conn: psycopg.Connection[Any] | None = None
        self._steps_held: set[str] = set()
        self._writer = self._connect()
        try:
            apply_postgres_migrations(self._writer, where=self._where)
            row = self._writer.execute("SELECT current_database() || '.' || current_schema()").fetchone()
            self._namespace = str(row[0]) if row is not None else ""
        except BaseException:
            self._writer.close()
            raise
        self._thread = threading.Thread(target=self._writer_main, name="ldp-store-writer", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The database URL without its password."""
        return self._where

    def __enter__(self) -> PostgresReportStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresReportStore({self._where!r}{', closed' if self._closed else ''})"

    # -- connections ---------------------------------------------------------------------------------
    def _connect(self) -> psycopg.Connection[Any]:
        pg = self._psycopg
        try:
            conn: psycopg.Connection[Any] = pg.connect(
                self._url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S,
                application_name=self._application_name)
        except pg.Error as exc:
            raise OverloadedError(f"cannot connect to the report store {self._where}: {exc}".strip(),
                                  retry_after=1.0) from exc
        # An acknowledgement promises durability, whatever the server's default.
        conn.execute("SET synchronous_commit = on")
        return conn

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the report store {self._where!r} is closed")

    def _storage_error(self, exc: BaseException) -> BaseException:
        """Map psycopg errors to the collector's domain errors (others pass through unchanged)."""
        pg = self._psycopg
        if isinstance(exc, pg.OperationalError):  # the server is down or the connection broke: retry
            return OverloadedError(f"the report store {self._where} is unavailable: {exc}".strip(), retry_after=1.0)
        if isinstance(exc, pg.Error):
            return CollectorError(f"report store failure: {type(exc).__name__}: {exc}")
        return exc

    @contextlib.contextmanager
    def _reader(self) -> Iterator[psycopg.Connection[Any]]:
        with self._lock:
            self._check_open()
            conn = self._idle_readers.pop() if self._idle_readers else None
        if conn is None:
            conn = self._connect()
        stale: list[psycopg.Connection[Any]] = []
        try:
            yield conn
        except self._psycopg.Error as exc:
            if isinstance(exc, self._psycopg.OperationalError):  # the server restarted: so did every idle session
                with self._lock:
                    stale, self._idle_readers = self._idle_readers, []
            raise self._storage_error(exc) from exc
        finally:
            with self._lock:
                if (not self._closed and not conn.closed and not conn.broken
                        and len(self._idle_readers) < _MAX_IDLE_READERS):
                    self._idle_readers.append(conn)
                    conn = None
            for dead in stale if conn is None else [*stale, conn]:
                dead.close()

    # -- the writer thread ---------------------------------------------------------------------------
    def _enqueue(self, item: _AddRequest | _Operation[Any], size: int = 0) -> None:
        with self._lock:
            self._check_open()
            if size and self._pending and self._pending + size > self._max_pending:
                raise OverloadedError(f"the report store has {self._pending} reports waiting to be written; "
                                      "retry later", retry_after=1.0)
            self._pending += size
            self._queue.put(item)

    def _write(self, run: Callable[[Any], T]) -> T:
        op: _Operation[T] = _Operation(run)
        self._enqueue(op)
        return op.future.result()

    def _writer_conn(self) -> psycopg.Connection[Any]:
        """The writing connection, reconnected if the last one broke (a database restart)."""
        if self._writer.closed or self._writer.broken:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = self._connect()
        return self._writer

    def _writer_main(self) -> None:
        stopping = False
        while not stopping:
            items = [self._queue.get()]
            size = getattr(items[0], "size", 0)
            while size < MAX_GROUP_REPORTS and len(items) < MAX_GROUP_REQUESTS:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                items.append(item)
                size += getattr(item, "size", 0)
            try:
                stopping = self._process(items)
            except BaseException as exc:  # never leave a caller waiting forever
                for item in items:
                    if isinstance(item, (_AddRequest, _Operation)) and not item.future.done():
                        item.future.set_exception(self._storage_error(exc))
        with contextlib.suppress(Exception):
            self._writer.close()

    def _process(self, items: list[object]) -> bool:
        """Run queued items in order, grouping consecutive ``add_reports``; True once told to stop."""
        stopping = False
        group: list[_AddRequest] = []
        request_ids: set[str] = set()
        for item in items:
            if isinstance(item, _AddRequest):
                if item.request_id in request_ids:  # a repeat must see the first one committed
                    self._commit_group(group)
                    group, request_ids = [], set()
                group.append(item)
                request_ids.add(item.request_id)
                continue
            self._commit_group(group)
            group, request_ids = [], set()
            if isinstance(item, _Operation):
                self._run_operation(item)
            else:
                stopping = True
        self._commit_group(group)
        return stopping

    def _run_operation(self, op: _Operation[Any]) -> None:
        try:
            conn = self._writer_conn()
            with conn.transaction():
                result = op.run(conn)
        except BaseException as exc:
            op.future.set_exception(self._storage_error(exc))
        else:
            op.future.set_result(result)

    def _commit_group(self, group: list[_AddRequest]) -> None:
        if not group:
            return
        pg = self._psycopg
        # A lost connection is retried too, on a new one: if the lost transaction did commit, the
        # retry finds its request ids recorded and answers with what it recorded.
        retryable = (pg.errors.DeadlockDetected, pg.errors.SerializationFailure, _Restart, pg.OperationalError)
        for attempt in range(_MAX_GROUP_ATTEMPTS):
            try:
                conn = self._writer_conn()
                with conn.transaction():
                    answers = self._apply_group(conn, group)
            except retryable as exc:
                if attempt + 1 < _MAX_GROUP_ATTEMPTS:
                    time.sleep(0.001 * 2**attempt)
                    continue
                failure: BaseException = exc
            except BaseException as exc:
                failure = exc
            else:
                for request, outcomes in zip(group, answers):
                    request.future.set_result(outcomes)
                return
            break
        if len(group) == 1 or isinstance(failure, (pg.OperationalError, OverloadedError)):
            for request in group:  # the database is unreachable: every caller retries its request
                request.future.set_exception(self._storage_error(failure))
        else:  # find the culprit: each request alone
            for request in group:
                self._commit_group([request])

    def _apply_group(self, conn: psycopg.Connection[Any], group: list[_AddRequest]) -> list[list[Outcome]]:
        """Insert a group's reports in the open transaction; return each request's outcomes."""
        replayed: dict[str, bytes] = {
            rid: bytes(resp) for rid, resp in conn.execute(
                "SELECT request_id, response FROM request_ids WHERE request_id = ANY(%b::text[])",
                ([r.request_id for r in group],)).fetchall()}
        keys = sorted({(c.campaign_id, c.round) for r in group if r.request_id not in replayed for c in r.chunks})
        rounds: dict[tuple[str, int], _RoundState] = {}
        if keys:
            for cid, rnd, is_open, count in conn.execute(
                    _LOCK_ROUNDS, ([k[0] for k in keys], [k[1] for k in keys])).fetchall():
                rounds[(cid, rnd)] = _RoundState(is_open=bool(is_open), next_seq=int(count))
        pending: dict[tuple[str, int, int], tuple[AccumulateFn, list[Sequence[StoredReport]]]] = {}
        answers: list[list[Outcome]] = []
        responses: list[tuple[str, bytes]] = []
        for request in group:
            if request.request_id in replayed:
                answers.append([Outcome(v) for v in msgpack.unpackb(replayed[request.request_id])])
                continue
            outcomes = list(request.outcomes)
            for chunk in request.chunks:
                key = (chunk.campaign_id, chunk.round)
                state = rounds.get(key)
                new = self._insert_chunk(conn, chunk, state, outcomes)
                if new is not None and request.accumulate is not None:
                    fn = request.accumulate
                    batches = pending.setdefault((*key, id(fn)), (fn, [[]]))[1]
                    if _columns(new.reports) is not None:  # kept as it is, for the accumulator
                        batches.append(new.reports)
                    else:  # plain reports of a round: one call for all of them
                        assert isinstance(batches[0], list)
                        batches[0].extend(new.reports)
            final = [Outcome.REJECTED if o is None else o for o in outcomes]
            answers.append(final)
            responses.append((request.request_id, msgpack.packb([int(o) for o in final])))
        self._accumulate(conn, pending)
        for (campaign_id, round), state in rounds.items():
            if state.added:
                conn.execute("UPDATE rounds SET report_count = %s WHERE campaign_id = %s AND round = %s",
                             (state.next_seq, campaign_id, round))
        if responses:
            now = time.time()
            recorded = conn.execute(_INSERT_RESPONSES, ([rid for rid, _ in responses], [resp for _, resp in responses],
                                                        [now] * len(responses))).fetchall()
            if len(recorded) != len(responses):  # another process answered one of these requests meanwhile
                raise _Restart
        return answers

    @staticmethod
    def _insert_chunk(conn: psycopg.Connection[Any], chunk: _Chunk, state: _RoundState | None,
                      outcomes: list[Outcome | None]) -> _Chunk | None:
        """Insert the chunk's new reports; fill ``outcomes``; return the inserted part (None if nothing)."""
        if state is None or not state.is_open:  # refused, unless already stored
            existing = {bytes(rid) for (rid,) in conn.execute(_EXISTING_IDS, (chunk.ids,)).fetchall()}
            for rid, position in zip(chunk.ids, chunk.positions):
                outcomes[position] = Outcome.DUPLICATE if rid in existing else Outcome.REJECTED
            return None
        inserted = conn.execute(_INSERT_IDS, (chunk.ids,)).fetchall()
        if len(inserted) == len(chunk.ids):
            new = chunk
        else:
            fresh = {bytes(rid) for (rid,) in inserted}
            keep = [k for k, rid in enumerate(chunk.ids) if rid in fresh]
            for k, rid in enumerate(chunk.ids):
                if rid not in fresh:
                    outcomes[chunk.positions[k]] = Outcome.DUPLICATE
            if not keep:
                return None
            new = chunk.subset(keep)
        conn.execute(_INSERT_REPORTS, (new.campaign_id, new.round, state.next_seq, new.ids, new.groups, new.payloads))
        state.next_seq += len(new.ids)
        state.added += len(new.ids)
        positions = new.positions
        if isinstance(positions, range) and positions.step == 1:  # the whole request: one slice
            outcomes[positions.start:positions.stop] = [Outcome.ACCEPTED] * len(positions)
        else:
            for position in positions:
                outcomes[position] = Outcome.ACCEPTED
        return new

    @staticmethod
    def _accumulate(conn: psycopg.Connection[Any],
                    pending: Mapping[tuple[str, int, int], tuple[AccumulateFn, list[Sequence[StoredReport]]]]) -> None:
        """Run each round's accumulate callback on its new reports (the round's row is locked), then
        upsert what changed."""
        cache: dict[tuple[str, int], dict[str, bytes]] = {}
        for (campaign_id, round, _), (fn, batches) in pending.items():
            key = (campaign_id, round)
            if key not in cache:
                cache[key] = {name: bytes(data) for name, data in conn.execute(
                    "SELECT name, data FROM accumulators WHERE campaign_id = %s AND round = %s", key).fetchall()}
            blobs = cache[key]
            changed: dict[str, bytes] = {}
            for reports in batches:
                if reports:
                    updated = _check_blobs(fn(reports, types.MappingProxyType(blobs)), "accumulate's result")
                    blobs.update(updated)
                    changed.update(updated)
            if changed:
                conn.execute(_UPSERT_ACCUMULATORS, (campaign_id, round, list(changed), list(changed.values())))

    # -- campaigns -----------------------------------------------------------------------------------
    def create_campaign(self, record: CampaignRecord) -> None:
        _validate_round_key(record.campaign_id, 0)

        def run(conn: psycopg.Connection[Any]) -> None:
            inserted = conn.execute(
                f"INSERT INTO campaigns ({_CAMPAIGN_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                (record.campaign_id, record.config, record.state, record.current_round, record.created_at,
                 record.engine_state, record.result, record.error))
            if inserted.rowcount == 0:
                raise AlreadyExistsError(f"campaign {record.campaign_id!r} already exists")

        self._write(run)

    def get_campaign(self, campaign_id: str) -> CampaignRecord:
        with self._reader() as conn:
            row = conn.execute(f"SELECT {_CAMPAIGN_COLUMNS} FROM campaigns WHERE campaign_id = %s",
                               (campaign_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"campaign {campaign_id!r} does not exist")
        return _campaign(row)

    def list_campaigns(self, limit: int, after: str = "") -> list[CampaignRecord]:
        if not isinstance(limit, int) or limit < 0:
            raise InvalidArgumentError(f"limit must be a non-negative int, got {limit!r}")
        with self._reader() as conn:
            # campaign_id has the "C" collation: byte order of UTF-8, the order of Python str comparison.
            rows = conn.execute(f"SELECT {_CAMPAIGN_COLUMNS} FROM campaigns WHERE campaign_id > %s "
                                "ORDER BY campaign_id LIMIT %s", (after, limit)).fetchall()
        return [_campaign(row) for row in rows]

    def update_campaign(self, campaign_id: str, *, state: str | None = None, current_round: int | None = None,
                        engine_state: bytes | None = None, result: bytes | None = None,
                        error: str | None = None) -> None:
        changes = {name: value for name, value in (("state", state), ("current_round", current_round),
                                                   ("engine_state", engine_state), ("result", result),
                                                   ("error", error)) if value is not None}

        def run(conn: psycopg.Connection[Any]) -> None:
            if changes:
                assignments = ", ".join(f"{name} = %s" for name in changes)
                found = conn.execute(f"UPDATE campaigns SET {assignments} WHERE campaign_id = %s",
                                     (*changes.values(), campaign_id)).rowcount > 0
            else:
                found = conn.execute("SELECT 1 FROM campaigns WHERE campaign_id = %s",
                                     (campaign_id,)).fetchone() is not None
            if not found:
                raise NotFoundError(f"campaign {campaign_id!r} does not exist")

        self._write(run)

    # -- rounds --------------------------------------------------------------------------------------
    def open_round(self, campaign_id: str, round: int, spec: bytes, opened_at: float) -> None:
        _validate_round_key(campaign_id, round)

        def run(conn: psycopg.Connection[Any]) -> None:
            # FOR KEY SHARE keeps the campaign from vanishing; ON CONFLICT makes a racing opener lose cleanly.
            if conn.execute("SELECT 1 FROM campaigns WHERE campaign_id = %s FOR KEY SHARE",
                            (campaign_id,)).fetchone() is None:
                raise NotFoundError(f"campaign {campaign_id!r} does not exist")
            inserted = conn.execute(
                f"INSERT INTO rounds ({_ROUND_COLUMNS}) VALUES (%s, %s, %s, 1, %s, NULL, 0, NULL) ON CONFLICT DO NOTHING",
                (campaign_id, round, spec, opened_at))
            if inserted.rowcount == 0:
                raise AlreadyExistsError(f"round {round} of campaign {campaign_id!r} already exists")

        self._write(run)

    def get_round(self, campaign_id: str, round: int) -> RoundRecord:
        with self._reader() as conn:
            row = conn.execute(f"SELECT {_ROUND_COLUMNS} FROM rounds WHERE campaign_id = %s AND round = %s",
                               (campaign_id, round)).fetchone()
        if row is None:
            raise NotFoundError(f"round {round} of campaign {campaign_id!r} does not exist")
        return _round(row)

    def list_rounds(self, campaign_id: str) -> list[RoundRecord]:
        with self._reader() as conn:
            rows = conn.execute(f"SELECT {_ROUND_COLUMNS} FROM rounds WHERE campaign_id = %s ORDER BY round",
                                (campaign_id,)).fetchall()
        return [_round(row) for row in rows]

    def close_round(self, campaign_id: str, round: int, closed_at: float) -> bool:
        def run(conn: psycopg.Connection[Any]) -> bool:
            # Waits for every in-flight ingestion transaction of the round (they hold its row lock),
            # then re-checks is_open on the row they left.
            row = conn.execute("UPDATE rounds SET is_open = 0, closed_at = %s "
                               "WHERE campaign_id = %s AND round = %s AND is_open = 1 RETURNING round",
                               (closed_at, campaign_id, round)).fetchone()
            if row is not None:
                return True
            _require_round(conn, campaign_id, round)
            return False

        return self._write(run)

    def set_round_estimates(self, campaign_id: str, round: int, estimates: bytes) -> None:
        def run(conn: psycopg.Connection[Any]) -> None:
            cursor = conn.execute("UPDATE rounds SET estimates = %s WHERE campaign_id = %s AND round = %s",
                                  (estimates, campaign_id, round))
            if cursor.rowcount == 0:
                raise NotFoundError(f"round {round} of campaign {campaign_id!r} does not exist")

        self._write(run)

    # -- reports -------------------------------------------------------------------------------------
    def add_reports(self, request_id: str, reports: Sequence[StoredReport],
                    accumulate: AccumulateFn | None = None) -> list[Outcome]:
        if not isinstance(request_id, str) or not request_id:
            raise InvalidArgumentError(f"request_id must be a non-empty str, got {request_id!r:.60}")
        with self._reader() as conn:  # a replay needs no encoding and no writer
            row = conn.execute("SELECT response FROM request_ids WHERE request_id = %s", (request_id,)).fetchone()
        if row is not None:
            return [Outcome(v) for v in msgpack.unpackb(bytes(row[0]))]
        request = _prepare(request_id, reports, accumulate)
        self._enqueue(request, max(request.size, 1))
        try:
            return request.future.result()
        finally:
            with self._lock:
                self._pending -= max(request.size, 1)

    def iter_reports(self, campaign_id: str, round: int, batch_size: int = 65536) -> Iterator[list[StoredReport]]:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be a positive int, got {batch_size!r}")
        return self._iter_reports(campaign_id, round, batch_size)

    def _iter_reports(self, campaign_id: str, round: int, batch_size: int) -> Iterator[list[StoredReport]]:
        with self._reader() as conn:
            _require_round(conn, campaign_id, round)
        start = 0
        while True:
            # Keyset pagination: each batch is its own short query, so an abandoned iterator holds nothing.
            with self._reader() as conn:
                rows = conn.execute("SELECT seq, report_id, group_index, payloads FROM reports "
                                    "WHERE campaign_id = %s AND round = %s AND seq >= %s ORDER BY seq LIMIT %s",
                                    (campaign_id, round, start, batch_size), binary=True).fetchall()
            if not rows:
                return
            yield [StoredReport(report_id=bytes(rid), campaign_id=campaign_id, round=round, group=group,
                                payloads=bytes(payloads)) for _, rid, group, payloads in rows]
            if len(rows) < batch_size:
                return
            start = rows[-1][0] + 1

    def count_reports(self, campaign_id: str, round: int) -> int:
        with self._reader() as conn:
            row = conn.execute("SELECT report_count FROM rounds WHERE campaign_id = %s AND round = %s",
                               (campaign_id, round)).fetchone()
        if row is None:
            raise NotFoundError(f"round {round} of campaign {campaign_id!r} does not exist")
        return int(row[0])

    def load_accumulators(self, campaign_id: str, round: int) -> dict[str, bytes]:
        with self._reader() as conn:
            _require_round(conn, campaign_id, round)
            rows = conn.execute("SELECT name, data FROM accumulators WHERE campaign_id = %s AND round = %s",
                                (campaign_id, round)).fetchall()
        return {name: bytes(data) for name, data in rows}

    def replace_accumulators(self, campaign_id: str, round: int, blobs: Mapping[str, bytes]) -> None:
        items = _check_blobs(blobs, "blobs")

        def run(conn: psycopg.Connection[Any]) -> None:
            # The round's row lock orders this against ingestion, which updates the same blobs.
            if conn.execute("SELECT 1 FROM rounds WHERE campaign_id = %s AND round = %s FOR UPDATE",
                            (campaign_id, round)).fetchone() is None:
                raise NotFoundError(f"round {round} of campaign {campaign_id!r} does not exist")
            conn.execute("DELETE FROM accumulators WHERE campaign_id = %s AND round = %s", (campaign_id, round))
            if items:
                conn.execute(_UPSERT_ACCUMULATORS, (campaign_id, round, [n for n, _ in items], [d for _, d in items]))

        self._write(run)

    # -- the cross-process step lock ---------------------------------------------------------------------
    @contextlib.contextmanager
    def step_lock(self, campaign_id: str) -> Iterator[bool]:
        """Try to take the campaign's server-step lock without waiting; yield whether it was taken.

        A session-level ``pg_try_advisory_lock`` on a connection of its own: exclusive among every
        store object on this database (and schema) in any process, and released by PostgreSQL when
        the process holding it dies. Within this object, a campaign whose lock is held yields
        ``False`` too (advisory locks are re-entrant per session).
        """
        with self._lock:
            self._check_open()
        key = _advisory_key(self._namespace, campaign_id)
        with self._step_guard:
            if campaign_id in self._steps_held:
                got = False
            else:
                row = self._try_advisory_lock(key)
                got = bool(row is not None and row[0])
                if got:
                    self._steps_held.add(campaign_id)
        try:
            yield got
        finally:
            if got:
                with self._step_guard:
                    self._steps_held.discard(campaign_id)
                    conn = self._step_conn
                    if conn is not None and not conn.closed and not conn.broken:
                        with contextlib.suppress(self._psycopg.Error):
                            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

    def _try_advisory_lock(self, key: int) -> Any:
        """``pg_try_advisory_lock(key)`` on the step-lock session (caller holds ``_step_guard``); a
        session lost meanwhile (a database restart, which released its locks) is replaced once."""
        for attempt in (1, 2):
            conn = self._step_conn
            try:
                if conn is None or conn.closed or conn.broken:
                    self._steps_held.clear()  # a lost session released its locks
                    if conn is not None:
                        conn.close()
                    conn = self._step_conn = self._connect()
                return conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            except self._psycopg.OperationalError as exc:
                if attempt == 2 or conn is None or not (conn.closed or conn.broken):
                    raise self._storage_error(exc) from exc
            except self._psycopg.Error as exc:
                raise self._storage_error(exc) from exc
        raise AssertionError("unreachable")

    # -- lifecycle -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Write everything already queued, stop the writer and close all connections.

        Idempotent; every other method raises :class:`StoreClosedError` afterwards.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)  # after every request enqueued before the flag was set
            idle, self._idle_readers = self._idle_readers, []
        self._thread.join()
        for conn in idle:
            conn.close()
        with self._step_guard:
            if self._step_conn is not None:
                self._step_conn.close()  # releases any advisory lock still held
                self._step_conn = None
