"""The device's durable outbox: reports waiting to be acknowledged by the collector.

One file per report in ``<state_dir>/outbox/``, named
``<sequence:012d>_<campaign_id>_<round>_<report_id hex>.ldpr`` (campaign ids cannot contain ``_``),
so pending reports list in creation order without being read. A file holds a 17-byte header and the
report's msgpack bytes (:meth:`ldp_client.report.Report.pack`)::

    b"LDPR" | version (1 byte) | CRC-32 of the rest (4 bytes, big-endian) | epsilon (float64, big-endian)
    | packed report

The epsilon is what the report charged (for inspection: a report is stored only after its charge,
and :class:`~ldp_client.device.Device` sends only reports whose campaign, round and id match a
charge in the ledger; see :mod:`ldp_client.device`).

Files are written with :func:`ldp_client.ledger.write_durably` (temporary file, fsync, rename, fsync
of the directory). A file that cannot be read back raises :class:`~ldp_client.errors.OutboxCorruptedError`
naming it; nothing is dropped silently (:meth:`Outbox.quarantine` moves such a file aside when an
operator decides to). Removing an acknowledged report does not fsync: if the removal is lost in a
crash, the report is sent again and the collector answers "duplicate".

The outbox does no cross-process locking of its own: :class:`ldp_client.device.Device` uses it under
the ledger lock and calls :meth:`Outbox.rescan` at the start of each locked section. :meth:`Outbox.in_memory` keeps the same semantics without files.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import struct
import threading
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from .errors import InvalidParameterError, OutboxCorruptedError, ProtocolError
from .ledger import remove_stale_temporary_files, write_durably
from .report import Report

__all__ = ["MAGIC", "Outbox", "OutboxEntry", "StoredReport"]

MAGIC = b"LDPR"
_VERSION = 1
_HEADER = struct.Struct(">4sBI")
_EPSILON = struct.Struct(">d")
_SUFFIX = ".ldpr"
_QUARANTINE = ".quarantine"
_NAME = re.compile(r"^(\d{12})_([A-Za-z0-9][A-Za-z0-9._-]{0,127})_(\d{1,10})_([0-9a-f]{32})\.ldpr$")


class OutboxEntry(NamedTuple):
    """A stored report as named on disk (known without reading the file)."""

    name: str
    sequence: int
    campaign_id: str
    round: int
    report_id: bytes


class StoredReport(NamedTuple):
    """A report read back from the outbox, with the epsilon it charges."""

    report: Report
    epsilon: float
    entry: OutboxEntry


def encode_record(report: Report, epsilon: float) -> bytes:
    """The file content of a stored report."""
    rest = _EPSILON.pack(epsilon) + report.pack()
    return _HEADER.pack(MAGIC, _VERSION, zlib.crc32(rest)) + rest


def decode_record(data: bytes) -> tuple[Report, float]:
    """Inverse of :func:`encode_record`; any problem raises :class:`ProtocolError` describing it."""
    if len(data) < _HEADER.size + _EPSILON.size:
        raise ProtocolError(f"{len(data)} bytes is shorter than the {_HEADER.size + _EPSILON.size}-byte header")
    magic, version, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r} (expected {MAGIC!r})")
    if version != _VERSION:
        raise ProtocolError(f"record version {version} is not supported (this SDK reads version {_VERSION})")
    rest = data[_HEADER.size:]
    if zlib.crc32(rest) != crc:
        raise ProtocolError("CRC-32 mismatch (the file was changed or damaged)")
    (epsilon,) = _EPSILON.unpack_from(rest)
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise ProtocolError(f"stored epsilon must be a finite number > 0, got {epsilon!r}")
    return Report.unpack(rest[_EPSILON.size:]), epsilon


class Outbox:
    """Reports stored until the collector acknowledges them.

    Parameters
    ----------
    directory : str or os.PathLike
        The outbox directory (created if missing).
    """

    _dir: Path | None

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._init_memory()
        self._dir = Path(directory)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._refresh()

    @classmethod
    def in_memory(cls) -> Outbox:
        """An outbox with identical semantics that keeps reports in memory (simulations, tests)."""
        self = cls.__new__(cls)
        self._init_memory()
        return self

    def _init_memory(self) -> None:
        self._lock = threading.RLock()
        self._dir = None
        self._mtime: int | None = None
        self._index: dict[bytes, OutboxEntry] = {}
        self._unknown: list[str] = []
        self._memory: dict[bytes, StoredReport] = {}
        self._next = 0

    @property
    def directory(self) -> Path | None:
        """The outbox directory, or ``None`` for an in-memory outbox."""
        return self._dir

    def rescan(self) -> None:
        """Re-read the directory listing now.

        Between rescans the listing is re-read only when the directory's modification time changes,
        which coarse file-system clocks can miss for changes a few milliseconds apart: a writer that
        shares the directory with other processes rescans once at the start of each locked section
        (as :class:`ldp_client.device.Device` does).
        """
        with self._lock:
            self._mtime = None
            self._refresh()

    def _refresh(self) -> None:
        """Re-scan the directory when its modification time says another writer changed it."""
        if self._dir is None:
            return
        mtime = os.stat(self._dir).st_mtime_ns
        if mtime == self._mtime:
            return
        index: dict[bytes, OutboxEntry] = {}
        unknown: list[str] = []
        for item in os.scandir(self._dir):
            if item.name.startswith("."):  # temporary files and the quarantine
                continue
            match = _NAME.match(item.name)
            if match is None or not item.is_file():
                unknown.append(item.name)
                continue
            seq, campaign, round_, rid = match.groups()
            entry = OutboxEntry(name=item.name, sequence=int(seq), campaign_id=campaign, round=int(round_),
                                report_id=bytes.fromhex(rid))
            if entry.report_id in index:
                unknown.append(item.name)
                continue
            index[entry.report_id] = entry
        self._index = index
        self._unknown = sorted(unknown)
        self._next = max((e.sequence for e in index.values()), default=-1) + 1
        self._mtime = mtime

    def _note_own_change(self) -> None:
        if self._dir is not None and self._mtime is not None:
            self._mtime = os.stat(self._dir).st_mtime_ns

    def _corrupted(self, name: str, problem: str) -> OutboxCorruptedError:
        where = self._dir / name if self._dir is not None else name
        return OutboxCorruptedError(f"outbox file {where} is corrupted: {problem}; it is kept for inspection "
                                    "(Device.quarantine_corrupted_reports moves it aside)")

    def __len__(self) -> int:
        with self._lock:
            self._refresh()
            return len(self._index)

    def entries(self) -> list[OutboxEntry]:
        """Every stored report's entry, in creation order (no file is read)."""
        with self._lock:
            self._refresh()
            return sorted(self._index.values(), key=lambda e: (e.sequence, e.name))

    def report_ids(self) -> list[bytes]:
        """Ids of the stored reports, in no particular order (cheaper than :meth:`entries`)."""
        with self._lock:
            self._refresh()
            return list(self._index)

    def unknown_files(self) -> list[str]:
        """Names in the outbox directory that are not stored reports (each counts as corrupted)."""
        with self._lock:
            self._refresh()
            return list(self._unknown)

    def find(self, campaign_id: str, round: int) -> list[OutboxEntry]:
        """The entries of ``campaign_id`` round ``round``, in creation order."""
        return [e for e in self.entries() if e.campaign_id == campaign_id and e.round == round]

    def put(self, report: Report, epsilon: float) -> OutboxEntry:
        """Durably store ``report``, which charges ``epsilon``.

        Raises
        ------
        InvalidParameterError
            A report with the same id is already stored, or ``epsilon`` is not a finite number > 0.
        """
        if not isinstance(report, Report):
            raise TypeError(f"report must be a Report, got {type(report).__name__}")
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 < epsilon < math.inf:
            raise InvalidParameterError(f"epsilon must be a finite number > 0, got {epsilon!r}")
        with self._lock:
            self._refresh()
            if report.report_id in self._index:
                raise InvalidParameterError(f"report {report.report_id.hex()} is already in the outbox")
            name = f"{self._next:012d}_{report.campaign_id}_{report.round}_{report.report_id.hex()}{_SUFFIX}"
            entry = OutboxEntry(name=name, sequence=self._next, campaign_id=report.campaign_id,
                                round=report.round, report_id=report.report_id)
            if self._dir is None:
                self._memory[report.report_id] = StoredReport(report=report, epsilon=float(epsilon), entry=entry)
            else:
                write_durably(self._dir / name, encode_record(report, float(epsilon)))
                self._note_own_change()
            self._index[report.report_id] = entry
            self._next += 1
            return entry

    def load(self, entry: OutboxEntry) -> StoredReport:
        """Read one stored report back.

        Raises
        ------
        OutboxCorruptedError
            The file is missing, unreadable, or does not hold the report its name says.
        """
        stored = self._load_or_none(entry)
        if stored is None:
            raise self._corrupted(entry.name, "missing")
        return stored

    def _load_or_none(self, entry: OutboxEntry) -> StoredReport | None:
        """:meth:`load`, but ``None`` when the file is gone (removed by another writer)."""
        if self._dir is None:
            with self._lock:
                return self._memory.get(entry.report_id)
        try:
            data = (self._dir / entry.name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._corrupted(entry.name, f"cannot be read ({exc})") from exc
        try:
            report, epsilon = decode_record(data)
        except ProtocolError as exc:
            raise self._corrupted(entry.name, str(exc)) from exc
        if (report.report_id, report.campaign_id, report.round) != (entry.report_id, entry.campaign_id, entry.round):
            raise self._corrupted(entry.name, f"holds report {report.report_id.hex()} of {report.campaign_id!r} "
                                              f"round {report.round}, not the one its name says")
        return StoredReport(report=report, epsilon=epsilon, entry=entry)

    def get(self, report_id: bytes) -> StoredReport | None:
        """The stored report ``report_id``, or ``None`` if the outbox does not hold it."""
        with self._lock:
            self._refresh()
            entry = self._index.get(report_id)
        stored = None if entry is None else self._load_or_none(entry)
        if entry is None or stored is not None:
            return stored
        self.rescan()  # the listing was stale: another writer removed the file
        with self._lock:
            entry = self._index.get(report_id)
        return None if entry is None else self.load(entry)

    def pending(self) -> list[StoredReport]:
        """Every stored report, in creation order.

        Raises
        ------
        OutboxCorruptedError
            Some file of the outbox is unreadable or is not a stored report.
        """
        for attempt in range(2):
            if attempt:
                self.rescan()  # the listing was stale: another writer removed a file
            unknown = self.unknown_files()
            if unknown:
                raise self._corrupted(unknown[0], "not a stored report (unexpected name or type)")
            entries = self.entries()
            loaded = [self._load_or_none(e) for e in entries]
            if all(s is not None for s in loaded):
                return [s for s in loaded if s is not None]
        missing = next(e for e, s in zip(entries, loaded) if s is None)
        raise self._corrupted(missing.name, "listed but missing")

    def remove(self, report_id: bytes) -> bool:
        """Remove the stored report ``report_id``; ``False`` if it was not there."""
        with self._lock:
            self._refresh()
            entry = self._index.pop(report_id, None)
            if entry is None:
                return False
            if self._dir is None:
                self._memory.pop(report_id, None)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._dir / entry.name)
                self._note_own_change()
            return True

    def remove_all(self, report_ids: Iterable[bytes]) -> int:
        """Remove several stored reports; returns how many were there."""
        return sum(1 for rid in report_ids if self.remove(rid))

    def corrupted_files(self) -> list[str]:
        """Names of the files that cannot be read back (reads every file)."""
        bad = self.unknown_files()
        for entry in self.entries():
            try:
                self.load(entry)
            except OutboxCorruptedError:
                bad.append(entry.name)
        return bad

    def quarantine(self, name: str) -> Path | None:
        """Move the file ``name`` to ``<outbox>/.quarantine/`` (in memory: forget it).

        Returns
        -------
        Path or None
            The new location (``None`` in memory).
        """
        with self._lock:
            self._refresh()
            entry = next((e for e in self._index.values() if e.name == name), None)
            if entry is None and name not in self._unknown:
                raise InvalidParameterError(f"the outbox holds no file named {name!r}")
            if entry is not None:
                self._index.pop(entry.report_id, None)
                self._memory.pop(entry.report_id, None)
            if name in self._unknown:
                self._unknown.remove(name)
            if self._dir is None:
                return None
            target_dir = self._dir / _QUARANTINE
            target_dir.mkdir(exist_ok=True)
            target = target_dir / name
            os.replace(self._dir / name, target)
            self._note_own_change()
            return target

    def remove_temporary_files(self) -> None:
        """Remove temporary files a crashed write left behind (call with writers locked out)."""
        if self._dir is not None:
            remove_stale_temporary_files(self._dir)
