"""The versioned schema of the SQLite report store, and the code that brings a database up to date.

Every schema change is a new :class:`Migration` appended to :data:`SQLITE_MIGRATIONS`; a released
migration is never edited. Opening a store applies the pending migrations in order, each in its own
``BEGIN IMMEDIATE`` transaction that also records it in ``schema_migrations``, so a crash leaves the
database at a whole version and several processes opening one database at once apply each
migration exactly once. A database written by a newer release (a version this code does not know)
is refused with :class:`SchemaVersionError` rather than misread.

The DDL sticks to plain types so the PostgreSQL backend can mirror it table for table:

==========================  ==========================  ======================================
SQLite (here)               PostgreSQL                  note
==========================  ==========================  ======================================
``TEXT``                    ``TEXT``
``BLOB``                    ``BYTEA``
``BIGINT``                  ``BIGINT``                  SQLite stores any integer in 8 bytes
``SMALLINT`` 0/1            ``SMALLINT`` 0/1            ``rounds.is_open``
``DOUBLE PRECISION``        ``DOUBLE PRECISION``        Unix seconds
``WITHOUT ROWID``           (drop the clause)           SQLite-only storage layout
==========================  ==========================  ======================================

Tables
------
``campaigns``, ``rounds``
    One row per :class:`~ldp_collector.storage.base.CampaignRecord` /
    :class:`~ldp_collector.storage.base.RoundRecord`; ``rounds.report_count`` is the number of
    stored reports of the round and, because ``reports.seq`` runs densely from 0, also the next
    ``seq`` to hand out.
``reports``
    The raw reports, the source of truth, clustered by ``(campaign_id, round, seq)`` so a round
    reads back in insertion order with one range scan and a batch appends to one place.
``report_ids``
    The global idempotency index: every stored ``report_id`` once. It is a table of its own, holding
    nothing but the 16-byte key, because report ids are random: each new id lands on an arbitrary
    B-tree page, SQLite writes every page a transaction touches to the WAL, and narrow rows mean
    fewer pages (a ``UNIQUE`` index on ``reports`` would also carry the clustering key). PostgreSQL
    may use ``UNIQUE (report_id)`` on ``reports`` instead; the store's behaviour is the same.
``request_ids``
    The first answer to each ``add_reports`` request: msgpack of the list of outcome ints.
``accumulators``
    Per-round accumulator blobs, caches of the raw reports updated in the same transaction.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import CollectorError, ErrorReason

__all__ = [
    "LATEST_VERSION",
    "SQLITE_MIGRATIONS",
    "Migration",
    "SchemaVersionError",
    "apply_migrations",
    "schema_version",
]


class SchemaVersionError(CollectorError):
    """The database was written by a newer release (or its migration history is not ours)."""

    code = "FAILED_PRECONDITION"
    reason = ErrorReason.STORE_SCHEMA_TOO_NEW


@dataclass(frozen=True, kw_only=True)
class Migration:
    """One schema step: ``statements`` run in order inside one transaction."""

    version: int
    name: str
    statements: tuple[str, ...]


_SCHEMA_MIGRATIONS_DDL = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     BIGINT PRIMARY KEY,
    name        TEXT NOT NULL,
    applied_at  DOUBLE PRECISION NOT NULL
)"""

SQLITE_MIGRATIONS: tuple[Migration, ...] = (
    Migration(version=1, name="initial schema", statements=(
        """
        CREATE TABLE campaigns (
            campaign_id    TEXT PRIMARY KEY,
            config         BLOB NOT NULL,
            state          TEXT NOT NULL,
            current_round  BIGINT NOT NULL,
            created_at     DOUBLE PRECISION NOT NULL,
            engine_state   BLOB NOT NULL,
            result         BLOB,
            error          TEXT NOT NULL
        )""",
        """
        CREATE TABLE rounds (
            campaign_id   TEXT NOT NULL REFERENCES campaigns (campaign_id),
            round         BIGINT NOT NULL,
            spec          BLOB NOT NULL,
            is_open       SMALLINT NOT NULL CHECK (is_open IN (0, 1)),
            opened_at     DOUBLE PRECISION NOT NULL,
            closed_at     DOUBLE PRECISION,
            report_count  BIGINT NOT NULL DEFAULT 0,
            estimates     BLOB,
            PRIMARY KEY (campaign_id, round)
        )""",
        """
        CREATE TABLE reports (
            campaign_id  TEXT NOT NULL,
            round        BIGINT NOT NULL,
            seq          BIGINT NOT NULL,
            report_id    BLOB NOT NULL,
            group_index  BIGINT NOT NULL,
            payloads     BLOB NOT NULL,
            PRIMARY KEY (campaign_id, round, seq),
            FOREIGN KEY (campaign_id, round) REFERENCES rounds (campaign_id, round)
        ) WITHOUT ROWID""",
        """
        CREATE TABLE report_ids (
            report_id  BLOB PRIMARY KEY
        ) WITHOUT ROWID""",
        """
        CREATE TABLE request_ids (
            request_id  TEXT PRIMARY KEY,
            response    BLOB NOT NULL,
            created_at  DOUBLE PRECISION NOT NULL
        )""",
        """
        CREATE TABLE accumulators (
            campaign_id  TEXT NOT NULL,
            round        BIGINT NOT NULL,
            name         TEXT NOT NULL,
            data         BLOB NOT NULL,
            PRIMARY KEY (campaign_id, round, name),
            FOREIGN KEY (campaign_id, round) REFERENCES rounds (campaign_id, round)
        ) WITHOUT ROWID""",
    )),
)

#: The schema version this code writes and reads.
LATEST_VERSION = SQLITE_MIGRATIONS[-1].version


def _check_sequence(migrations: Sequence[Migration]) -> None:
    for expected, migration in enumerate(migrations, start=1):
        if migration.version != expected:
            raise ValueError(f"migration versions must run 1, 2, 3, ... without gaps; "
                             f"position {expected} holds version {migration.version}")


def schema_version(conn: sqlite3.Connection) -> int:
    """The highest applied migration version (0 for an empty database).

    Parameters
    ----------
    conn : sqlite3.Connection
        Any connection to the database.
    """
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'").fetchone()
    if exists is None:
        return 0
    row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
    return int(row[0])


def apply_migrations(conn: sqlite3.Connection, migrations: Sequence[Migration] = SQLITE_MIGRATIONS,
                     *, where: str = "the database") -> int:
    """Apply the pending migrations, one transaction each, and return the resulting version.

    Parameters
    ----------
    conn : sqlite3.Connection
        A connection in autocommit mode (``isolation_level=None``) with no open transaction.
    migrations : sequence of Migration
        Versions 1, 2, 3, ... in order.
    where : str
        How error messages name the database (its path).

    Returns
    -------
    int
        The schema version after migrating (the last version of ``migrations``).

    Raises
    ------
    SchemaVersionError
        The database holds a version newer than the last of ``migrations``.
    """
    _check_sequence(migrations)
    latest = migrations[-1].version if migrations else 0
    while True:
        # BEGIN IMMEDIATE takes the write lock before reading the version, so concurrent openers
        # (other processes) serialize and each migration is applied exactly once.
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(_SCHEMA_MIGRATIONS_DDL)
            current = schema_version(conn)
            if current > latest:
                raise SchemaVersionError(
                    f"{where} has schema version {current}, newer than the {latest} this ldp-collector "
                    f"understands; upgrade ldp-collector (or open a copy made by this version)")
            if current == latest:
                conn.execute("COMMIT")
                return latest
            migration = migrations[current]  # versions are 1-based and dense: this is version current + 1
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                         (migration.version, migration.name, time.time()))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
