"""The embedded SQLite report store: zero configuration, durable, group-committed ingestion.

Layout and durability
---------------------
One database file, ``collector.sqlite3``, in the data directory (created if missing), in WAL mode
with ``synchronous=FULL`` (a commit is on disk when it returns) and foreign keys enforced. The
schema is versioned (:mod:`ldp_collector.storage.migrations`).

Writes: group commit
--------------------
Every write goes through the store's :class:`~ldp_collector.storage.group_commit.GroupCommitWriter`,
whose thread owns the only writing connection and commits each group of concurrent requests in
ONE ``BEGIN IMMEDIATE ... COMMIT`` transaction (the ``fsync`` of ``synchronous=FULL``) before it
acknowledges any of them; :class:`_SqliteDialect` is what it runs.

To keep the writer's share of the work small, a caller encodes its own batch before enqueueing it
(in its own thread, in parallel with the writer's SQLite work, which runs without the GIL): the
16-byte report ids concatenated into one blob, the payloads (stored exactly as given) into
another, and the per-report payload offsets, lengths and groups, so the writer inserts a whole
batch with one ``INSERT ... SELECT`` over ``json_each`` instead of one bound statement per report
(``executemany`` spends more time binding parameters in Python than SQLite spends inserting: for
1000 reports, 3.5 us per report against 1.0 us). A batch that offers its columns
(:class:`~ldp_collector.storage.group_commit.ColumnarReports`, e.g.
``ldp_collector.ingest.StoredReportColumns``) is encoded from them without touching one
``StoredReport`` per report, and reaches ``accumulate`` as it is.

Duplicates are found by the database, not by a pre-``SELECT``: the batch's ids go into the
``report_ids`` primary key in one statement; if that statement fails on a constraint (some id is
already stored, possibly by an earlier request of the same group), SQLite undoes just that
statement, the writer asks which ids exist, and inserts the rest. Batches without duplicates, the
common case, pay for nothing extra.

Reads
-----
Reads use a small pool of read-only connections; WAL lets them run concurrently with the writer
and they always see the last commit.

Several processes may open the same data directory: ``BEGIN IMMEDIATE`` serializes their
writers, and everything a transaction decides (is the round open, which ids exist, the next
``seq``) is read inside it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import (
    AlreadyExistsError,
    CollectorError,
    ErrorReason,
    InvalidArgumentError,
    NotFoundError,
    OverloadedError,
)
from .base import AccumulateFn, CampaignRecord, Outcome, ReportStore, RoundRecord, StoredReport
from .group_commit import (
    REPORT_ID_BYTES,
    Dialect,
    GroupCommitWriter,
    RoundState,
    check_blobs,
    columns_of,
    take,
    validate_round_key,
)
from .migrations import apply_migrations

__all__ = ["DATABASE_FILE", "MAX_GROUP_REPORTS", "STEP_LOCK_DIR", "SqliteReportStore"]

#: Name of the database file inside the data directory.
DATABASE_FILE = "collector.sqlite3"
#: Directory (inside the data directory) of the per-campaign step-lock files.
STEP_LOCK_DIR = "step-locks"
#: Most reports the writer puts into one group-commit transaction (bounds latency and memory).
MAX_GROUP_REPORTS = 200_000

_START_DIGITS, _LENGTH_DIGITS = 12, 10  # payload starts and lengths travel as fixed-width decimal ASCII
_LAYOUT_WIDTH = _START_DIGITS + _LENGTH_DIGITS
_LAYOUT_FORMAT = f"%0{_START_DIGITS}d%0{_LENGTH_DIGITS}d"
_MAX_BATCH_PAYLOAD_BYTES = 10**_LENGTH_DIGITS  # so every start and length fits its digits
_BUSY_TIMEOUT_S = 10.0
_WRITER_CACHE_KIB = 131072  # 128 MiB page cache: the random-key report_ids B-tree stays in memory
_MAX_IDLE_READERS = 8
# 16 KiB pages (a new database only): about 20% faster ingestion than 4 KiB on a fresh store (fewer WAL
# frames per commit, shallower trees) and about the same once the id index has grown to millions; and
# payloads up to ~4 KiB stay inside a WITHOUT ROWID row instead of spilling to overflow pages.
_PAGE_SIZE = 16384
_WAL_AUTOCHECKPOINT_PAGES = 2048  # 32 MiB of WAL between checkpoints (the default, 1000 pages, is every commit)

# One statement per batch: the row source is the JSON array of groups, whose keys 0..n-1 index the
# fixed-width id and layout blobs (SQLite slices them with substr() and CASTs the digits back).
_ROW_SOURCE = "json_each(?2) AS j"
_ID = f"substr(?1, j.key * {REPORT_ID_BYTES} + 1, {REPORT_ID_BYTES})"
_INSERT_IDS = f"INSERT INTO report_ids (report_id) SELECT {_ID} FROM {_ROW_SOURCE}"
_INSERT_REPORTS = (
    f"INSERT INTO reports (campaign_id, round, seq, report_id, group_index, payloads) SELECT ?3, ?4, ?5 + j.key, "
    f"{_ID}, j.value, substr(?6, CAST(substr(?7, j.key * {_LAYOUT_WIDTH} + 1, {_START_DIGITS}) AS INTEGER), "
    f"CAST(substr(?7, j.key * {_LAYOUT_WIDTH} + {_START_DIGITS + 1}, {_LENGTH_DIGITS}) AS INTEGER)) "
    f"FROM {_ROW_SOURCE}")
# The same when every payload has one length, ?7 (the common case): no layout to build or parse.
_INSERT_FIXED_WIDTH_REPORTS = (
    f"INSERT INTO reports (campaign_id, round, seq, report_id, group_index, payloads) SELECT ?3, ?4, ?5 + j.key, "
    f"{_ID}, j.value, substr(?6, j.key * ?7 + 1, ?7) FROM {_ROW_SOURCE}")
_EXISTING_POSITIONS = (f"SELECT j.key FROM {_ROW_SOURCE} "
                       f"WHERE EXISTS (SELECT 1 FROM report_ids AS r WHERE r.report_id = {_ID})")

_CAMPAIGN_COLUMNS = "campaign_id, config, state, current_round, created_at, engine_state, result, error"
_ROUND_COLUMNS = "campaign_id, round, spec, is_open, opened_at, closed_at, report_count, estimates"

T = TypeVar("T")


# -- the dialect the group-commit writer runs ---------------------------------------------------------

@dataclass(slots=True)
class _Chunk:
    """The reports of one request that target one round, encoded for the bulk INSERT."""

    campaign_id: str
    round: int
    positions: Sequence[int]  # index of each report in the request
    reports: Sequence[StoredReport]
    ids: bytes  # the 16-byte report ids, concatenated
    payloads: bytes  # the payloads, concatenated
    width: int  # the length of every payload, if they all have one (> 0); else 0 and:
    layout: bytes  # per report: its payload's 1-based start (12 digits) and length (10 digits), ASCII
    groups: str  # JSON array of the groups: the row source of the bulk INSERT

    @classmethod
    def encode(cls, campaign_id: str, round: int, positions: Sequence[int],
               reports: Sequence[StoredReport]) -> _Chunk:
        columns = columns_of(reports)
        if columns is not None:
            ids, groups, payloads = columns.report_ids, columns.groups, columns.payloads
        else:
            ids = [r.report_id for r in reports]
            groups = [r.group for r in reports]
            payloads = [r.payloads for r in reports]
        try:
            joined = b"".join(payloads)
        except TypeError as exc:
            raise InvalidArgumentError(f"payloads must be bytes: {exc}") from exc
        if len(joined) >= _MAX_BATCH_PAYLOAD_BYTES:
            raise InvalidArgumentError(f"a batch carries {len(joined)} payload bytes, more than the "
                                       f"{_MAX_BATCH_PAYLOAD_BYTES} one add_reports call may store")
        widths = set(map(len, payloads))
        width = widths.pop() if len(widths) == 1 else 0
        layout = b""
        if not width:
            lengths = list(map(len, payloads))
            starts = itertools.accumulate(lengths, initial=1)  # 1-based, as substr() counts
            # One C-level format call for the whole layout (a per-report f-string costs more than the insert).
            layout = ((_LAYOUT_FORMAT * len(lengths)) % tuple(itertools.chain.from_iterable(zip(starts, lengths)))
                      ).encode("ascii")
        return cls(campaign_id=campaign_id, round=round, positions=positions, reports=reports,
                   ids=b"".join(ids), payloads=joined, width=width, layout=layout,
                   groups=json.dumps(list(groups), separators=(",", ":")))

    def subset(self, keep: Sequence[int]) -> _Chunk:
        """The chunk restricted to the reports at ``keep`` (indexes into this chunk)."""
        return _Chunk.encode(self.campaign_id, self.round, [self.positions[k] for k in keep],
                             take(self.reports, keep))



def _storage_error(exc: BaseException) -> BaseException:
    """Map SQLite errors to the collector's domain errors (others pass through unchanged)."""
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return OverloadedError(f"the report store is busy (another process holds the write lock): {exc}")
    if isinstance(exc, sqlite3.Error):
        return CollectorError(f"report store failure: {type(exc).__name__}: {exc}")
    return exc


def _one(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
    """The first row of a query (or None), without leaving the statement (and its snapshot) open."""
    cursor = conn.execute(sql, params)
    try:
        return cursor.fetchone()
    finally:
        cursor.close()


def _campaign(row: Sequence[Any]) -> CampaignRecord:
    return CampaignRecord(campaign_id=row[0], config=row[1], state=row[2], current_round=row[3],
                          created_at=row[4], engine_state=row[5], result=row[6], error=row[7])


def _round(row: Sequence[Any]) -> RoundRecord:
    return RoundRecord(campaign_id=row[0], round=row[1], spec=row[2], open=bool(row[3]), opened_at=row[4],
                       closed_at=row[5], report_count=row[6], estimates=row[7])


def _require_round(conn: sqlite3.Connection, campaign_id: str, round: int) -> None:
    if _one(conn, "SELECT 1 FROM rounds WHERE campaign_id = ? AND round = ?", (campaign_id, round)) is None:
        raise NotFoundError(f"round {round} of campaign {campaign_id!r} does not exist", reason=ErrorReason.ROUND_NOT_FOUND)


def _retry_when_locked(step: Callable[[], T]) -> T:
    """Run a start-up step, retrying while SQLite says "database is locked".

    Switching to WAL (and the first migration) while another process or thread opens the same new
    database can fail with SQLITE_BUSY at once, without SQLite's busy handler ever waiting (its
    deadlock avoidance); the step is idempotent, so it is retried for up to the busy timeout.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT_S
    delay = 0.005
    while True:
        try:
            return step()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


class _SqliteDialect(Dialect[sqlite3.Connection, _Chunk]):
    """The SQLite operations of the group-commit writer, on the store's one writing connection.

    ``BEGIN IMMEDIATE`` takes the database's write lock at once, so everything the transaction
    reads (is the round open, which ids exist, the next ``seq``) stays true until its commit, also
    against writers in other processes; no row locks are needed and no group is ever retried.
    """

    max_group_reports = MAX_GROUP_REPORTS

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def encode(self, campaign_id: str, round: int, positions: Sequence[int],
               reports: Sequence[StoredReport]) -> _Chunk:
        return _Chunk.encode(campaign_id, round, positions, reports)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # a failed COMMIT may have rolled back already
                    conn.execute("ROLLBACK")
            raise

    def storage_error(self, exc: BaseException) -> BaseException:
        return _storage_error(exc)

    def recorded_answers(self, conn: sqlite3.Connection, request_ids: Sequence[str]) -> dict[str, bytes]:
        marks = ",".join("?" * len(request_ids))
        return dict(conn.execute(f"SELECT request_id, response FROM request_ids WHERE request_id IN ({marks})",
                                 list(request_ids)).fetchall())

    def read_rounds(self, conn: sqlite3.Connection,
                    keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], RoundState]:
        rounds: dict[tuple[str, int], RoundState] = {}
        for key in keys:
            row = _one(conn, "SELECT is_open, report_count FROM rounds WHERE campaign_id = ? AND round = ?", key)
            if row is not None:
                rounds[key] = RoundState(is_open=bool(row[0]), next_seq=row[1])
        return rounds

    def existing(self, conn: sqlite3.Connection, chunk: _Chunk) -> set[int]:
        return {k for (k,) in conn.execute(_EXISTING_POSITIONS, (chunk.ids, chunk.groups)).fetchall()}

    def insert_new(self, conn: sqlite3.Connection, chunk: _Chunk, first_seq: int) -> _Chunk | None:
        try:
            conn.execute(_INSERT_IDS, (chunk.ids, chunk.groups))
            new = chunk
        except sqlite3.IntegrityError:  # some ids are stored already; SQLite undid this statement only
            existing = self.existing(conn, chunk)
            if len(existing) == len(chunk.positions):
                return None
            new = chunk.subset([k for k in range(len(chunk.positions)) if k not in existing])
            conn.execute(_INSERT_IDS, (new.ids, new.groups))
        conn.execute(_INSERT_FIXED_WIDTH_REPORTS if new.width else _INSERT_REPORTS,
                     (new.ids, new.groups, new.campaign_id, new.round, first_seq, new.payloads,
                      new.width or new.layout))
        return new

    def load_accumulators(self, conn: sqlite3.Connection, campaign_id: str, round: int) -> dict[str, bytes]:
        return dict(conn.execute("SELECT name, data FROM accumulators WHERE campaign_id = ? AND round = ?",
                                 (campaign_id, round)).fetchall())

    def save_accumulators(self, conn: sqlite3.Connection, campaign_id: str, round: int,
                          blobs: Mapping[str, bytes]) -> None:
        conn.executemany(
            "INSERT INTO accumulators (campaign_id, round, name, data) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (campaign_id, round, name) DO UPDATE SET data = excluded.data",
            [(campaign_id, round, name, data) for name, data in blobs.items()])

    def set_report_count(self, conn: sqlite3.Connection, campaign_id: str, round: int, count: int) -> None:
        conn.execute("UPDATE rounds SET report_count = ? WHERE campaign_id = ? AND round = ?",
                     (count, campaign_id, round))

    def record_answers(self, conn: sqlite3.Connection, answers: Sequence[tuple[str, bytes]], now: float) -> bool:
        # No other writer can record one meanwhile: BEGIN IMMEDIATE excludes them until our commit.
        conn.executemany("INSERT INTO request_ids (request_id, response, created_at) VALUES (?, ?, ?)",
                         [(request_id, answer, now) for request_id, answer in answers])
        return True

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.conn.close()


class SqliteReportStore(ReportStore):
    """The :class:`ReportStore` in one SQLite file; thread-safe, durable, group-committed.

    Parameters
    ----------
    data_dir : str or os.PathLike
        Directory holding ``collector.sqlite3`` (created, with its parents, if missing).
    max_pending_reports : int
        Reports that may wait for the writer at once; beyond that ``add_reports`` raises
        :class:`~ldp_collector.errors.OverloadedError` (the service answers UNAVAILABLE with a
        retry delay) instead of queueing without bound.

    Raises
    ------
    InvalidArgumentError
        ``data_dir`` exists and is not a directory.
    SchemaVersionError
        The database was written by a newer ldp-collector.
    CollectorError
        The database file cannot be opened as one: not an SQLite database, unreadable, or locked
        by another process beyond the busy timeout (the message names the file).

    Notes
    -----
    Throughput (``benchmarks/store_throughput.py``, 2-core VM shared with other jobs, batches of
    1000 reports, every commit durable): on a fresh store about 135-160k reports/s with 8 calling
    threads, 170k+ with 32 (larger groups), 75k with one caller (no group commit). Report ids are
    random, so each new id lands on an arbitrary page of the ``report_ids`` B-tree and every commit
    writes each page it touched to the WAL; once that index holds far more pages than a commit has
    reports, ingestion slows down (about 35-60k reports/s with a million reports already stored).
    """

    def __init__(self, data_dir: str | os.PathLike[str], *, max_pending_reports: int = 1_000_000) -> None:
        path = Path(data_dir)
        if path.exists() and not path.is_dir():
            raise InvalidArgumentError(f"data directory {str(path)!r} exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True)
        self._path = path / DATABASE_FILE
        self._lock = threading.Lock()  # guards the idle readers
        self._idle_readers: list[sqlite3.Connection] = []
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise self._open_error(exc) from exc
        try:
            conn.execute(f"PRAGMA page_size = {_PAGE_SIZE}")  # no effect on an existing database
            mode = _retry_when_locked(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            if str(mode).lower() != "wal":
                raise CollectorError(f"{self._path} cannot use WAL mode (journal_mode is {mode}); "
                                     "put the data directory on a local file system")
            conn.execute(f"PRAGMA cache_size = -{_WRITER_CACHE_KIB}")
            conn.execute(f"PRAGMA wal_autocheckpoint = {_WAL_AUTOCHECKPOINT_PAGES}")
            _retry_when_locked(lambda: apply_migrations(conn, where=str(self._path)))
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise self._open_error(exc) from exc
            raise
        self._writer = GroupCommitWriter(_SqliteDialect(conn), name=str(self._path),
                                         max_pending_reports=max_pending_reports)

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    def __enter__(self) -> SqliteReportStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqliteReportStore({str(self._path.parent)!r}{', closed' if self._writer.closed else ''})"

    def _open_error(self, exc: sqlite3.Error) -> CollectorError:
        """One line naming the database file: ``cannot open the report store '...': file is not a database``."""
        return CollectorError(f"cannot open the report store {str(self._path)!r}: {exc}")

    # -- connections ---------------------------------------------------------------------------------
    def _connect(self, *, read_only: bool = False) -> sqlite3.Connection:
        # Autocommit mode: transactions are explicit (BEGIN IMMEDIATE ... COMMIT).
        conn = sqlite3.connect(self._path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        if read_only:
            conn.execute("PRAGMA query_only = ON")
        return conn

    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._writer.check_open()
            conn = self._idle_readers.pop() if self._idle_readers else None
        if conn is None:
            conn = self._connect(read_only=True)
        try:
            yield conn
        except sqlite3.Error as exc:
            raise _storage_error(exc) from exc
        finally:
            with self._lock:
                if not self._writer.closed and len(self._idle_readers) < _MAX_IDLE_READERS:
                    self._idle_readers.append(conn)
                    conn = None
            if conn is not None:
                conn.close()

    # -- campaigns -----------------------------------------------------------------------------------
    def create_campaign(self, record: CampaignRecord) -> None:
        validate_round_key(record.campaign_id, 0)

        def run(conn: sqlite3.Connection) -> None:
            if _one(conn, "SELECT 1 FROM campaigns WHERE campaign_id = ?", (record.campaign_id,)) is not None:
                raise AlreadyExistsError(f"campaign {record.campaign_id!r} already exists")
            conn.execute(f"INSERT INTO campaigns ({_CAMPAIGN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (record.campaign_id, record.config, record.state, record.current_round, record.created_at,
                          record.engine_state, record.result, record.error))

        self._writer.write(run)

    def get_campaign(self, campaign_id: str) -> CampaignRecord:
        with self._reader() as conn:
            row = _one(conn, f"SELECT {_CAMPAIGN_COLUMNS} FROM campaigns WHERE campaign_id = ?", (campaign_id,))
        if row is None:
            raise NotFoundError(f"campaign {campaign_id!r} does not exist")
        return _campaign(row)

    def list_campaigns(self, limit: int, after: str = "") -> list[CampaignRecord]:
        if not isinstance(limit, int) or limit < 0:
            raise InvalidArgumentError(f"limit must be a non-negative int, got {limit!r}")
        with self._reader() as conn:
            # Ids compare as UTF-8 bytes (BINARY collation), the same order as Python str comparison.
            rows = conn.execute(f"SELECT {_CAMPAIGN_COLUMNS} FROM campaigns WHERE campaign_id > ? "
                                "ORDER BY campaign_id LIMIT ?", (after, limit)).fetchall()
        return [_campaign(row) for row in rows]

    def update_campaign(self, campaign_id: str, *, state: str | None = None, current_round: int | None = None,
                        engine_state: bytes | None = None, result: bytes | None = None,
                        error: str | None = None) -> None:
        changes = {name: value for name, value in (("state", state), ("current_round", current_round),
                                                   ("engine_state", engine_state), ("result", result),
                                                   ("error", error)) if value is not None}

        def run(conn: sqlite3.Connection) -> None:
            if changes:
                assignments = ", ".join(f"{name} = ?" for name in changes)
                cursor = conn.execute(f"UPDATE campaigns SET {assignments} WHERE campaign_id = ?",
                                      (*changes.values(), campaign_id))
                found = cursor.rowcount > 0
            else:
                found = _one(conn, "SELECT 1 FROM campaigns WHERE campaign_id = ?", (campaign_id,)) is not None
            if not found:
                raise NotFoundError(f"campaign {campaign_id!r} does not exist")

        self._writer.write(run)

    # -- rounds --------------------------------------------------------------------------------------
    def open_round(self, campaign_id: str, round: int, spec: bytes, opened_at: float) -> None:
        validate_round_key(campaign_id, round)

        def run(conn: sqlite3.Connection) -> None:
            if _one(conn, "SELECT 1 FROM campaigns WHERE campaign_id = ?", (campaign_id,)) is None:
                raise NotFoundError(f"campaign {campaign_id!r} does not exist")
            if _one(conn, "SELECT 1 FROM rounds WHERE campaign_id = ? AND round = ?", (campaign_id, round)):
                raise AlreadyExistsError(f"round {round} of campaign {campaign_id!r} already exists",
                                         reason=ErrorReason.ROUND_EXISTS)
            conn.execute(f"INSERT INTO rounds ({_ROUND_COLUMNS}) VALUES (?, ?, ?, 1, ?, NULL, 0, NULL)",
                         (campaign_id, round, spec, opened_at))

        self._writer.write(run)

    def get_round(self, campaign_id: str, round: int) -> RoundRecord:
        with self._reader() as conn:
            row = _one(conn, f"SELECT {_ROUND_COLUMNS} FROM rounds WHERE campaign_id = ? AND round = ?",
                       (campaign_id, round))
        if row is None:
            raise NotFoundError(f"round {round} of campaign {campaign_id!r} does not exist", reason=ErrorReason.ROUND_NOT_FOUND)
        return _round(row)

    def list_rounds(self, campaign_id: str) -> list[RoundRecord]:
        with self._reader() as conn:
            rows = conn.execute(f"SELECT {_ROUND_COLUMNS} FROM rounds WHERE campaign_id = ? ORDER BY round",
                                (campaign_id,)).fetchall()
        return [_round(row) for row in rows]

    def close_round(self, campaign_id: str, round: int, closed_at: float) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute("UPDATE rounds SET is_open = 0, closed_at = ? "
                                  "WHERE campaign_id = ? AND round = ? AND is_open = 1",
                                  (closed_at, campaign_id, round))
            if cursor.rowcount == 1:
                return True
            _require_round(conn, campaign_id, round)
            return False

        return self._writer.write(run)

    def set_round_estimates(self, campaign_id: str, round: int, estimates: bytes) -> None:
        def run(conn: sqlite3.Connection) -> None:
            cursor = conn.execute("UPDATE rounds SET estimates = ? WHERE campaign_id = ? AND round = ?",
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
            row = _one(conn, "SELECT response FROM request_ids WHERE request_id = ?", (request_id,))
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
            # Keyset pagination: each batch is its own short read, so an abandoned iterator holds
            # no connection and no WAL snapshot.
            with self._reader() as conn:
                rows = conn.execute("SELECT seq, report_id, group_index, payloads FROM reports "
                                    "WHERE campaign_id = ? AND round = ? AND seq >= ? ORDER BY seq LIMIT ?",
                                    (campaign_id, round, start, batch_size)).fetchall()
            if not rows:
                return
            yield [StoredReport(report_id=rid, campaign_id=campaign_id, round=round, group=group, payloads=payloads)
                   for _, rid, group, payloads in rows]
            if len(rows) < batch_size:
                return
            start = rows[-1][0] + 1

    def count_reports(self, campaign_id: str, round: int) -> int:
        with self._reader() as conn:
            row = _one(conn, "SELECT report_count FROM rounds WHERE campaign_id = ? AND round = ?",
                       (campaign_id, round))
        if row is None:
            raise NotFoundError(f"round {round} of campaign {campaign_id!r} does not exist", reason=ErrorReason.ROUND_NOT_FOUND)
        return int(row[0])

    def load_accumulators(self, campaign_id: str, round: int) -> dict[str, bytes]:
        with self._reader() as conn:
            _require_round(conn, campaign_id, round)
            rows = conn.execute("SELECT name, data FROM accumulators WHERE campaign_id = ? AND round = ?",
                                (campaign_id, round)).fetchall()
        return dict(rows)

    def replace_accumulators(self, campaign_id: str, round: int, blobs: Mapping[str, bytes]) -> None:
        items = check_blobs(blobs, "blobs")

        def run(conn: sqlite3.Connection) -> None:
            _require_round(conn, campaign_id, round)
            conn.execute("DELETE FROM accumulators WHERE campaign_id = ? AND round = ?", (campaign_id, round))
            conn.executemany("INSERT INTO accumulators (campaign_id, round, name, data) VALUES (?, ?, ?, ?)",
                             [(campaign_id, round, name, data) for name, data in items])

        self._writer.write(run)

    # -- the cross-process step lock ---------------------------------------------------------------
    @contextlib.contextmanager
    def step_lock(self, campaign_id: str) -> Iterator[bool]:
        """Try to take the campaign's server-step lock without waiting; yield whether it was taken.

        ``flock`` on a per-campaign file in ``step-locks/`` of the data directory (named by a hash
        of the campaign id), opened anew for each attempt: exclusive among every process and
        every store object on this directory, and released by the kernel when the holder's file
        is closed, also when its process dies. The files stay (one small file per campaign).
        """
        self._writer.check_open()
        directory = self._path.parent / STEP_LOCK_DIR
        directory.mkdir(exist_ok=True)
        name = hashlib.sha256(campaign_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        fd = os.open(directory / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                got = True
            except BlockingIOError:
                got = False
            yield got
        finally:
            os.close(fd)  # releases the lock

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
