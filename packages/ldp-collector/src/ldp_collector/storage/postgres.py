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

Writes: group commit
--------------------
Like the SQLite store, every write of one store object goes through the shared
:class:`~ldp_collector.storage.group_commit.GroupCommitWriter` (one writer thread, one
connection; :class:`_PostgresDialect` is what it runs): while a transaction commits, new requests
queue up and the next transaction takes all of them. Each round's reports go in with two
statements (``INSERT ... SELECT FROM unnest(...)`` of binary arrays of ids, groups and payloads),
not one round trip per report. Because every writer of a round must hold its row lock until its
commit is durable, writers of one round serialize whatever their number; a connection pool (one
transaction per caller) therefore commits one batch per ``fsync``, while the writer thread commits
a whole group per ``fsync``, and measured faster (see :class:`PostgresReportStore`), so there is no
pool for writes.

Reads and the step lock
-----------------------
Reads use a small pool of autocommit connections, each query its own snapshot. :meth:`step_lock`
holds a session-level ``pg_try_advisory_lock`` on a dedicated connection: PostgreSQL releases it
when that connection ends, also when the process holding it dies.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import (
    AlreadyExistsError,
    CollectorError,
    ErrorReason,
    InvalidArgumentError,
    NotFoundError,
    OverloadedError,
)
from .base import AccumulateFn, CampaignRecord, Outcome, ReportStore, RoundRecord, StoredReport
from .group_commit import Dialect, GroupCommitWriter, RoundState, check_blobs, columns_of, take, validate_round_key
from .migrations import Migration, SchemaVersionError

if TYPE_CHECKING:
    import psycopg

__all__ = ["MAX_GROUP_REPORTS", "POSTGRES_MIGRATIONS", "PostgresReportStore", "redact_url"]

#: Most reports the writer puts into one transaction (bounds latency and memory).
MAX_GROUP_REPORTS = 100_000

_MAX_IDLE_READERS = 8
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


# -- the dialect the group-commit writer runs ---------------------------------------------------------

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
        columns = columns_of(reports)
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
                      reports=take(self.reports, keep), ids=[self.ids[k] for k in keep],
                      groups=[self.groups[k] for k in keep], payloads=[self.payloads[k] for k in keep])



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
        raise NotFoundError(f"round {round} of campaign {campaign_id!r} does not exist", reason=ErrorReason.ROUND_NOT_FOUND)


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


class _PostgresDialect(Dialect["psycopg.Connection[Any]", _Chunk]):
    """The PostgreSQL operations of the group-commit writer, on one connection, replaced when lost.

    A group locks the rows of its rounds (``FOR UPDATE``, in key order). A deadlock or a lost
    connection retries the group, on a new connection if needed: if the lost transaction did
    commit, the retry finds its request ids recorded and replays what they recorded. An
    unreachable database fails every request of the group with the retryable ``OverloadedError``.
    """

    max_group_reports = MAX_GROUP_REPORTS

    def __init__(self, pg: Any, conn: psycopg.Connection[Any], connect: Callable[[], psycopg.Connection[Any]],
                 where: str) -> None:
        self._pg = pg
        self.conn = conn
        self._connect = connect
        self._where = where
        self.retryable = (pg.errors.DeadlockDetected, pg.errors.SerializationFailure, pg.OperationalError)
        self.unavailable = (pg.OperationalError, OverloadedError)

    def encode(self, campaign_id: str, round: int, positions: Sequence[int],
               reports: Sequence[StoredReport]) -> _Chunk:
        return _Chunk.encode(campaign_id, round, positions, reports)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        if self.conn.closed or self.conn.broken:  # the last one broke (a database restart)
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = self._connect()
        with self.conn.transaction():
            yield self.conn

    def storage_error(self, exc: BaseException) -> BaseException:
        pg = self._pg
        if isinstance(exc, pg.OperationalError):  # the server is down or the connection broke: retry
            return OverloadedError(f"the report store {self._where} is unavailable: {exc}".strip(), retry_after=1.0)
        if isinstance(exc, pg.Error):
            return CollectorError(f"report store failure: {type(exc).__name__}: {exc}")
        return exc

    def recorded_answers(self, conn: psycopg.Connection[Any], request_ids: Sequence[str]) -> dict[str, bytes]:
        return {rid: bytes(answer) for rid, answer in conn.execute(
            "SELECT request_id, response FROM request_ids WHERE request_id = ANY(%b::text[])",
            (list(request_ids),)).fetchall()}

    def read_rounds(self, conn: psycopg.Connection[Any],
                    keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], RoundState]:
        rows = conn.execute(_LOCK_ROUNDS, ([k[0] for k in keys], [k[1] for k in keys])).fetchall()
        return {(cid, rnd): RoundState(is_open=bool(is_open), next_seq=int(count)) for cid, rnd, is_open, count in rows}

    def existing(self, conn: psycopg.Connection[Any], chunk: _Chunk) -> set[int]:
        stored = {bytes(rid) for (rid,) in conn.execute(_EXISTING_IDS, (chunk.ids,)).fetchall()}
        return {k for k, rid in enumerate(chunk.ids) if rid in stored}

    def insert_new(self, conn: psycopg.Connection[Any], chunk: _Chunk, first_seq: int) -> _Chunk | None:
        inserted = conn.execute(_INSERT_IDS, (chunk.ids,)).fetchall()
        if len(inserted) == len(chunk.ids):
            new = chunk
        else:
            fresh = {bytes(rid) for (rid,) in inserted}
            keep = [k for k, rid in enumerate(chunk.ids) if rid in fresh]
            if not keep:
                return None
            new = chunk.subset(keep)
        conn.execute(_INSERT_REPORTS, (new.campaign_id, new.round, first_seq, new.ids, new.groups, new.payloads))
        return new

    def load_accumulators(self, conn: psycopg.Connection[Any], campaign_id: str, round: int) -> dict[str, bytes]:
        return {name: bytes(data) for name, data in conn.execute(
            "SELECT name, data FROM accumulators WHERE campaign_id = %s AND round = %s",
            (campaign_id, round)).fetchall()}

    def save_accumulators(self, conn: psycopg.Connection[Any], campaign_id: str, round: int,
                          blobs: Mapping[str, bytes]) -> None:
        conn.execute(_UPSERT_ACCUMULATORS, (campaign_id, round, list(blobs), list(blobs.values())))

    def set_report_count(self, conn: psycopg.Connection[Any], campaign_id: str, round: int, count: int) -> None:
        conn.execute("UPDATE rounds SET report_count = %s WHERE campaign_id = %s AND round = %s",
                     (count, campaign_id, round))

    def record_answers(self, conn: psycopg.Connection[Any], answers: Sequence[tuple[str, bytes]], now: float) -> bool:
        recorded = conn.execute(_INSERT_RESPONSES, ([rid for rid, _ in answers], [answer for _, answer in answers],
                                                    [now] * len(answers))).fetchall()
        return len(recorded) == len(answers)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


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
        self._lock = threading.Lock()  # guards the idle readers
        self._idle_readers: list[psycopg.Connection[Any]] = []
        # The step lock: a dedicated session, the campaigns this object holds, and its own lock.
        self._step_guard = threading.Lock()
        self._step_conn: psycopg.Connection[Any] | None = None
        self._steps_held: set[str] = set()
        conn = self._connect()
        try:
            apply_postgres_migrations(conn, where=self._where)
            row = conn.execute("SELECT current_database() || '.' || current_schema()").fetchone()
            self._namespace = str(row[0]) if row is not None else ""
        except BaseException:
            conn.close()
            raise
        self._dialect = _PostgresDialect(self._psycopg, conn, self._connect, self._where)
        self._writer = GroupCommitWriter(self._dialect, name=self._where, max_pending_reports=max_pending_reports)

    @property
    def url(self) -> str:
        """The database URL without its password."""
        return self._where

    def __enter__(self) -> PostgresReportStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresReportStore({self._where!r}{', closed' if self._writer.closed else ''})"

    # -- connections ---------------------------------------------------------------------------------
    def _connect(self) -> psycopg.Connection[Any]:
        pg = self._psycopg
        try:
            conn: psycopg.Connection[Any] = pg.connect(
                self._url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S,
                application_name=self._application_name)
        except pg.Error as exc:
            raise OverloadedError(f"cannot connect to the report store {self._where}: {exc}".strip(),
                                  retry_after=1.0, reason=ErrorReason.STORE_UNAVAILABLE) from exc
        # An acknowledgement promises durability, whatever the server's default.
        conn.execute("SET synchronous_commit = on")
        return conn

    @contextlib.contextmanager
    def _reader(self) -> Iterator[psycopg.Connection[Any]]:
        with self._lock:
            self._writer.check_open()
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
            raise self._dialect.storage_error(exc) from exc
        finally:
            with self._lock:
                if (not self._writer.closed and not conn.closed and not conn.broken
                        and len(self._idle_readers) < _MAX_IDLE_READERS):
                    self._idle_readers.append(conn)
                    conn = None
            for dead in stale if conn is None else [*stale, conn]:
                dead.close()

    # -- campaigns -----------------------------------------------------------------------------------
    def create_campaign(self, record: CampaignRecord) -> None:
        validate_round_key(record.campaign_id, 0)

        def run(conn: psycopg.Connection[Any]) -> None:
            inserted = conn.execute(
                f"INSERT INTO campaigns ({_CAMPAIGN_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                (record.campaign_id, record.config, record.state, record.current_round, record.created_at,
                 record.engine_state, record.result, record.error))
            if inserted.rowcount == 0:
                raise AlreadyExistsError(f"campaign {record.campaign_id!r} already exists")

        self._writer.write(run)

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

        self._writer.write(run)

    # -- rounds --------------------------------------------------------------------------------------
    def open_round(self, campaign_id: str, round: int, spec: bytes, opened_at: float) -> None:
        validate_round_key(campaign_id, round)

        def run(conn: psycopg.Connection[Any]) -> None:
            # FOR KEY SHARE keeps the campaign from vanishing; ON CONFLICT makes a racing opener lose cleanly.
            if conn.execute("SELECT 1 FROM campaigns WHERE campaign_id = %s FOR KEY SHARE",
                            (campaign_id,)).fetchone() is None:
                raise NotFoundError(f"campaign {campaign_id!r} does not exist")
            inserted = conn.execute(
                f"INSERT INTO rounds ({_ROUND_COLUMNS}) VALUES (%s, %s, %s, 1, %s, NULL, 0, NULL) ON CONFLICT DO NOTHING",
                (campaign_id, round, spec, opened_at))
            if inserted.rowcount == 0:
                raise AlreadyExistsError(f"round {round} of campaign {campaign_id!r} already exists",
                                         reason=ErrorReason.ROUND_EXISTS)

        self._writer.write(run)

    def get_round(self, campaign_id: str, round: int) -> RoundRecord:
        with self._reader() as conn:
            row = conn.execute(f"SELECT {_ROUND_COLUMNS} FROM rounds WHERE campaign_id = %s AND round = %s",
                               (campaign_id, round)).fetchone()
        if row is None:
            raise NotFoundError(f"round {round} of campaign {campaign_id!r} does not exist", reason=ErrorReason.ROUND_NOT_FOUND)
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

        return self._writer.write(run)

    def set_round_estimates(self, campaign_id: str, round: int, estimates: bytes) -> None:
        def run(conn: psycopg.Connection[Any]) -> None:
            cursor = conn.execute("UPDATE rounds SET estimates = %s WHERE campaign_id = %s AND round = %s",
                                  (estimates, campaign_id, round))
            if cursor.rowcount == 0:
                raise NotFoundError(f"round {round} of campaign {campaign_id!r} does not exist", reason=ErrorReason.ROUND_NOT_FOUND)

        self._writer.write(run)

    # -- reports -------------------------------------------------------------------------------------
    def add_reports(self, request_id: str, reports: Sequence[StoredReport],
                    accumulate: AccumulateFn | None = None) -> list[Outcome]:
        return self._writer.add(request_id, reports, accumulate, self._recorded_answer)

    def _recorded_answer(self, request_id: str) -> bytes | None:
        with self._reader() as conn:
            row = conn.execute("SELECT response FROM request_ids WHERE request_id = %s", (request_id,)).fetchone()
        return None if row is None else bytes(row[0])

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
            raise NotFoundError(f"round {round} of campaign {campaign_id!r} does not exist", reason=ErrorReason.ROUND_NOT_FOUND)
        return int(row[0])

    def load_accumulators(self, campaign_id: str, round: int) -> dict[str, bytes]:
        with self._reader() as conn:
            _require_round(conn, campaign_id, round)
            rows = conn.execute("SELECT name, data FROM accumulators WHERE campaign_id = %s AND round = %s",
                                (campaign_id, round)).fetchall()
        return {name: bytes(data) for name, data in rows}

    def replace_accumulators(self, campaign_id: str, round: int, blobs: Mapping[str, bytes]) -> None:
        items = check_blobs(blobs, "blobs")

        def run(conn: psycopg.Connection[Any]) -> None:
            # The round's row lock orders this against ingestion, which updates the same blobs.
            if conn.execute("SELECT 1 FROM rounds WHERE campaign_id = %s AND round = %s FOR UPDATE",
                            (campaign_id, round)).fetchone() is None:
                raise NotFoundError(f"round {round} of campaign {campaign_id!r} does not exist", reason=ErrorReason.ROUND_NOT_FOUND)
            conn.execute("DELETE FROM accumulators WHERE campaign_id = %s AND round = %s", (campaign_id, round))
            if items:
                conn.execute(_UPSERT_ACCUMULATORS, (campaign_id, round, [n for n, _ in items], [d for _, d in items]))

        self._writer.write(run)

    # -- the cross-process step lock ---------------------------------------------------------------------
    @contextlib.contextmanager
    def step_lock(self, campaign_id: str) -> Iterator[bool]:
        """Try to take the campaign's server-step lock without waiting; yield whether it was taken.

        A session-level ``pg_try_advisory_lock`` on a connection of its own: exclusive among every
        store object on this database (and schema) in any process, and released by PostgreSQL when
        the process holding it dies. Within this object, a campaign whose lock is held yields
        ``False`` too (advisory locks are re-entrant per session).
        """
        self._writer.check_open()
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
                    raise self._dialect.storage_error(exc) from exc
            except self._psycopg.Error as exc:
                raise self._dialect.storage_error(exc) from exc
        raise AssertionError("unreachable")

    # -- lifecycle -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Write everything already queued, stop the writer and close all connections.

        Idempotent; every other method raises :class:`StoreClosedError` afterwards.
        """
        self._writer.close()
        with self._lock:  # a reader returned from now on is closed, not kept
            idle, self._idle_readers = self._idle_readers, []
        for conn in idle:
            conn.close()
        with self._step_guard:
            if self._step_conn is not None:
                self._step_conn.close()  # releases any advisory lock still held
                self._step_conn = None
