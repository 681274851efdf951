"""Durable storage of campaigns, rounds and reports behind one interface, :class:`ReportStore`.

:func:`open_store` picks the backend from a location: a directory path (or ``sqlite:///path``)
opens the embedded :class:`SqliteReportStore`; a ``postgresql://`` URL opens
:class:`~ldp_collector.storage.postgres.PostgresReportStore` (the ``postgres`` extra; psycopg is
imported only then). This package never imports ``grpc``.
"""

from __future__ import annotations

import os

from ..errors import InvalidArgumentError, NotFoundError
from .base import (
    AccumulateFn,
    CampaignRecord,
    Outcome,
    ReportStore,
    RoundRecord,
    StoreClosedError,
    StoredReport,
)
from .migrations import SchemaVersionError
from .postgres import PostgresReportStore  # psycopg itself is imported only when one is opened
from .sqlite import DATABASE_FILE, SqliteReportStore

__all__ = [
    "AccumulateFn",
    "CampaignRecord",
    "Outcome",
    "PostgresReportStore",
    "ReportStore",
    "RoundRecord",
    "SchemaVersionError",
    "SqliteReportStore",
    "StoreClosedError",
    "StoredReport",
    "open_store",
]

_SQLITE_PREFIX = "sqlite:///"


def open_store(location: str | os.PathLike[str], *, create: bool = True) -> ReportStore:
    """Open the report store at ``location``.

    Parameters
    ----------
    location : str or os.PathLike
        A data directory path, or ``sqlite:///<path>`` with the data directory after the third
        slash (``sqlite:///ldp-data`` is relative, ``sqlite:////var/lib/ldp`` absolute, as in
        SQLAlchemy URLs). The directory is created if missing and holds ``collector.sqlite3``.
        Or a PostgreSQL URL, ``postgresql://[user[:password]@]host[:port]/database`` (also
        ``postgres://`` and ``postgresql+psycopg://``), shared by any number of collector
        processes.
    create : bool
        ``False``: an SQLite data directory must already hold ``collector.sqlite3`` (the batch commands,
        which read a store some server wrote: a mistyped path is an error, not a new empty store).

    Returns
    -------
    ReportStore
        An open store; the caller closes it.

    Raises
    ------
    InvalidArgumentError
        A ``postgresql://`` URL without psycopg installed (the message names
        ``pip install 'ldp-collector[postgres]'``), another URL scheme, or a path that exists and
        is not a directory.
    OverloadedError
        The PostgreSQL server cannot be reached.
    SchemaVersionError
        The database was written by a newer ldp-collector.
    CollectorError
        The SQLite database file cannot be opened (not a database, unreadable); the message names it.
    NotFoundError
        ``create=False`` and the SQLite data directory holds no database.
    """
    if not isinstance(location, str):
        return _sqlite(os.fspath(location), create)
    if location.startswith(_SQLITE_PREFIX):
        path = location[len(_SQLITE_PREFIX):]
        if not path:
            raise InvalidArgumentError(f"store URL {location!r} names no directory; use sqlite:///<data-dir>")
        return _sqlite(path, create)
    scheme = location.split("://", 1)[0].lower() if "://" in location else ""
    if scheme in ("postgresql", "postgres") or scheme.startswith("postgresql+"):
        return PostgresReportStore(location)  # imports psycopg now, with a clear error if it is missing
    if scheme:
        raise InvalidArgumentError(
            f"unsupported store URL scheme {scheme!r}; use a data directory path, sqlite:///<data-dir> "
            "or postgresql://host/database")
    if not location:
        raise InvalidArgumentError("the store location is empty; use a data directory path or sqlite:///<data-dir>")
    return _sqlite(location, create)


def _sqlite(path: str, create: bool) -> SqliteReportStore:
    if not create and not os.path.isfile(os.path.join(path, DATABASE_FILE)):
        raise NotFoundError(f"no store at {path!r} (no {DATABASE_FILE} there): check --data-dir or $LDP_DATA_DIR")
    return SqliteReportStore(path)
