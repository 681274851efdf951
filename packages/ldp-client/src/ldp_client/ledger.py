"""The device's durable privacy-budget ledger.

The ledger records every charge (one per report: campaign, round, group, epsilon, report id, time)
and the group the device chose in each campaign. A charge is recorded *before* its report may
leave the device, so the budget a device has spent can only be over-stated, never under-stated.

On disk the ledger is one JSON file, ``<state_dir>/ledger.json``::

    {"format": "ldp-client-ledger", "version": 1, "device_id": "<32 hex>",
     "entries": [{"campaign_id": ..., "round": ..., "group": ..., "epsilon": ...,
                  "report_id": "<32 hex>", "time": <unix seconds>}, ...],
     "groups": {"<campaign_id>": <group>, ...},
     "checksum": "sha256:<hex of the canonical JSON of every other key>"}

Durability: every change rewrites the file through :func:`write_durably` (temporary file in the same
directory, flush, ``fsync``, ``os.replace``, ``fsync`` of the directory), so a crash leaves either
the old or the new ledger, never a torn one. A marker file ``<state_dir>/device.json`` (written
after the first ledger) records that the directory was initialised: a ledger that is missing
afterwards, unparseable, fails its checksum or holds impossible values raises
:class:`~ldp_client.errors.LedgerCorruptedError` naming the file and the problem. The budget is
never silently reset.

Concurrency: a ``threading.RLock`` always, plus ``fcntl.flock`` on ``<state_dir>/lock`` where
``fcntl`` exists, so several threads and processes can share one state directory. Each locked
section re-reads the file when another process changed it.

:meth:`Ledger.in_memory` keeps the same semantics without files (for simulations).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from ._validation import check_float, check_int
from .errors import BudgetExhaustedError, InvalidParameterError, LedgerCorruptedError
from .report import REPORT_ID_BYTES
from .rng import Rng, resolve_rng
from .spec import MAX_GROUPS, check_campaign_id

try:
    import fcntl as _fcntl
except ImportError:  # pragma: no cover - Windows: the threading lock alone serializes one process
    _fcntl = None  # type: ignore[assignment]

__all__ = [
    "LEDGER_FILE",
    "LOCK_FILE",
    "MARKER_FILE",
    "Ledger",
    "LedgerEntry",
    "fsync_directory",
    "write_durably",
]

LEDGER_FILE = "ledger.json"
MARKER_FILE = "device.json"
LOCK_FILE = "lock"
_FORMAT = "ldp-client-ledger"
_MARKER_FORMAT = "ldp-client-device"
_VERSION = 1
_DOC_KEYS = frozenset({"format", "version", "device_id", "entries", "groups", "checksum"})
_ENTRY_KEYS = frozenset({"campaign_id", "round", "group", "epsilon", "report_id", "time"})
#: Relative slack of budget comparisons, so that e.g. ten charges of 0.1 fit a cap of 1.0. It is far
#: below the precision with which any epsilon is stated.
_TOLERANCE = 1e-12


def write_durably(path: Path, data: bytes) -> os.stat_result:
    """Atomically and durably replace ``path`` with ``data``.

    Writes a temporary file in the same directory, flushes and ``fsync``s it, renames it over
    ``path`` with ``os.replace`` and ``fsync``s the directory, so that after a crash ``path`` holds
    either its old or its new content. Callers serialize writers (the ledger lock); a temporary file
    left by a crash is removed by the next :class:`Ledger` or outbox that opens the directory.

    Returns
    -------
    os.stat_result
        The new file's status (inode, size, modification time), taken before the rename.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            status = os.fstat(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(path.parent)
    return status


def fsync_directory(path: Path) -> None:
    """Make the directory entries of ``path`` (creations, renames) durable."""
    if os.name == "nt":  # pragma: no cover - directories cannot be opened on Windows; NTFS journals renames
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temporary_files(directory: Path) -> None:
    """Remove ``.*.tmp`` files a crashed :func:`write_durably` left behind (call with writers locked out)."""
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            if entry.name.startswith(".") and entry.name.endswith(".tmp") and entry.is_file():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def _checksum(doc: dict[str, Any]) -> str:
    rest = {k: v for k, v in doc.items() if k != "checksum"}
    return "sha256:" + hashlib.sha256(_canonical(rest)).hexdigest()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


class LedgerEntry(NamedTuple):
    """One charge: the report ``report_id`` of ``campaign_id``/``round`` cost ``epsilon``."""

    campaign_id: str
    round: int
    group: int
    epsilon: float
    report_id: bytes
    time: float

    def to_json(self) -> dict[str, Any]:
        return {"campaign_id": self.campaign_id, "round": self.round, "group": self.group,
                "epsilon": self.epsilon, "report_id": self.report_id.hex(), "time": self.time}


def _is_hex_id(value: Any) -> bool:
    if not isinstance(value, str) or len(value) != 2 * REPORT_ID_BYTES:
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return value == value.lower()


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _LedgerLock:
    """Reentrant guard: a ``threading.RLock``, plus ``flock`` and a refresh on the outermost entry."""

    __slots__ = ("_depth", "_ledger", "_lock")

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._lock = threading.RLock()
        self._depth = 0

    def __enter__(self) -> None:
        self._lock.acquire()
        ledger = self._ledger
        if self._depth == 0 and ledger._dir is not None:
            try:
                if _fcntl is not None:
                    _fcntl.flock(ledger._lock_fd, _fcntl.LOCK_EX)
                try:
                    ledger._refresh()
                except BaseException:
                    if _fcntl is not None:
                        _fcntl.flock(ledger._lock_fd, _fcntl.LOCK_UN)
                    raise
            except BaseException:
                self._lock.release()
                raise
        self._depth += 1

    def __exit__(self, *exc_info: object) -> None:
        self._depth -= 1
        try:
            ledger = self._ledger
            if self._depth == 0 and ledger._dir is not None and _fcntl is not None:
                _fcntl.flock(ledger._lock_fd, _fcntl.LOCK_UN)
        finally:
            self._lock.release()


class Ledger:
    """The privacy-budget ledger of one device, durable in ``state_dir``.

    Parameters
    ----------
    state_dir : str or os.PathLike
        The device's state directory (created if missing). A new directory gets a fresh random
        device id from ``rng``.
    rng : Rng, optional
        Source of the device id of a new directory; defaults to the OS CSPRNG.

    Raises
    ------
    LedgerCorruptedError
        The ledger file is missing from an initialised directory, unreadable, fails its checksum,
        or holds impossible values.
    """

    _dir: Path | None

    def __init__(self, state_dir: str | os.PathLike[str], *, rng: Rng | None = None) -> None:
        self._init_memory(None)
        self._rng = resolve_rng(rng)
        self._dir = Path(state_dir)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._path = self._dir / LEDGER_FILE
        self._marker = self._dir / MARKER_FILE
        self._lock_fd = os.open(self._dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        self._finalizer = weakref.finalize(self, os.close, self._lock_fd)
        with self.locked():
            remove_stale_temporary_files(self._dir)

    @classmethod
    def in_memory(cls, *, device_id: str | None = None, rng: Rng | None = None) -> Ledger:
        """A ledger with identical semantics that keeps everything in memory (simulations, tests).

        Parameters
        ----------
        device_id : str, optional
            32 lowercase hex digits; by default drawn from ``rng``.
        rng : Rng, optional
            Defaults to the OS CSPRNG.
        """
        self = cls.__new__(cls)
        if device_id is None:
            device_id = resolve_rng(rng).token_bytes(REPORT_ID_BYTES).hex()
        elif not _is_hex_id(device_id):
            raise InvalidParameterError(f"device_id must be {2 * REPORT_ID_BYTES} lowercase hex digits, got {device_id!r}")
        self._init_memory(device_id)
        return self

    def _init_memory(self, device_id: str | None) -> None:
        self._guard = _LedgerLock(self)
        self._dir = None
        self._device_id = device_id or ""
        self._signature: tuple[int, int, int] | None = None
        self._generation = 0
        self._set_state([], {})

    def _set_state(self, entries: list[LedgerEntry], groups: dict[str, int]) -> None:
        self._entries: list[LedgerEntry] = []
        self._groups = dict(groups)
        self._by_round: dict[tuple[str, int], LedgerEntry] = {}
        self._by_id: dict[bytes, LedgerEntry] = {}
        self._by_campaign: dict[str, list[LedgerEntry]] = {}
        self._spent: dict[str, float] = {}
        self._epsilons: list[float] = []
        self._total = 0.0
        for e in entries:
            self._add(e)

    def _add(self, entry: LedgerEntry) -> None:
        # Exact sums (fsum), independent of the order of the charges, kept up to date per charge.
        self._epsilons.append(entry.epsilon)
        self._total = math.fsum(self._epsilons)
        self._entries.append(entry)
        self._by_round[(entry.campaign_id, entry.round)] = entry
        self._by_id[entry.report_id] = entry
        charges = self._by_campaign.setdefault(entry.campaign_id, [])
        charges.append(entry)
        self._spent[entry.campaign_id] = math.fsum(e.epsilon for e in charges)

    # ---------------------------------------------------------------- locking and persistence

    @property
    def device_id(self) -> str:
        """The device's random id (32 hex digits), fixed when the state directory was created."""
        return self._device_id

    @property
    def generation(self) -> int:
        """Counts the times the ledger was (re)read from disk, i.e. changed by another writer."""
        return self._generation

    @property
    def path(self) -> Path | None:
        """The ledger file, or ``None`` for an in-memory ledger."""
        return None if self._dir is None else self._path

    def close(self) -> None:
        """Release the lock file descriptor (the ledger is unusable afterwards)."""
        if self._dir is not None:
            self._finalizer()

    def locked(self) -> _LedgerLock:
        """The ledger lock (reentrant), for ``with``: a section that reads, decides and charges is atomic.

        On entry the ledger is re-read if another process changed the file.
        """
        return self._guard

    def _corrupted(self, path: Path, problem: str) -> LedgerCorruptedError:
        return LedgerCorruptedError(
            f"budget ledger {path} is corrupted: {problem}; the device refuses to report rather than "
            "reset its privacy budget")

    def _refresh(self) -> None:
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            if self._marker.exists() or self._signature is not None:
                raise self._corrupted(self._path, f"ledger missing although the state directory was initialised "
                                                  f"({MARKER_FILE} exists)") from None
            self._device_id = self._rng.token_bytes(REPORT_ID_BYTES).hex()
            self._save([], {})
            self._set_state([], {})
            self._write_marker()
            return
        signature = (st.st_ino, st.st_size, st.st_mtime_ns)
        if signature == self._signature:
            return
        try:
            data = self._path.read_bytes()
        except OSError as exc:
            raise self._corrupted(self._path, f"cannot be read ({exc})") from exc
        device_id, entries, groups = self._parse(data)
        marker_id = self._read_marker()
        if marker_id is None:
            self._device_id = device_id
            self._write_marker()  # the marker write of a new directory was interrupted
        elif marker_id != device_id:
            raise self._corrupted(self._path, f"device id {device_id} differs from {marker_id} in {MARKER_FILE}")
        self._device_id = device_id
        self._set_state(entries, groups)
        self._signature = signature
        self._generation += 1

    def _parse(self, data: bytes) -> tuple[str, list[LedgerEntry], dict[str, int]]:
        bad = self._corrupted
        path = self._path
        try:
            doc = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError) as exc:
            raise bad(path, f"not valid JSON ({exc})") from exc
        if not isinstance(doc, dict):
            raise bad(path, f"expected a JSON object, got {type(doc).__name__}")
        if doc.get("format") != _FORMAT:
            raise bad(path, f"format must be {_FORMAT!r}, got {doc.get('format')!r}")
        if doc.get("version") != _VERSION:
            raise bad(path, f"version {doc.get('version')!r} is not supported (this SDK reads version {_VERSION})")
        if set(doc) != _DOC_KEYS:
            raise bad(path, f"expected keys {sorted(_DOC_KEYS)}, got {sorted(doc)}")
        if doc["checksum"] != _checksum(doc):
            raise bad(path, "checksum mismatch (the file was changed or damaged)")
        device_id = doc["device_id"]
        if not _is_hex_id(device_id):
            raise bad(path, f"device_id must be {2 * REPORT_ID_BYTES} lowercase hex digits, got {device_id!r}")
        groups = doc["groups"]
        if not isinstance(groups, dict):
            raise bad(path, "groups must be an object")
        for campaign, group in groups.items():
            if isinstance(group, bool) or not isinstance(group, int) or not 0 <= group < MAX_GROUPS:
                raise bad(path, f"group of campaign {campaign!r} must be an int in [0, {MAX_GROUPS}), got {group!r}")
        if not isinstance(doc["entries"], list):
            raise bad(path, "entries must be a list")
        entries: list[LedgerEntry] = []
        seen_rounds: set[tuple[str, int]] = set()
        seen_ids: set[bytes] = set()
        for i, raw in enumerate(doc["entries"]):
            where = f"entries[{i}]"
            if not isinstance(raw, dict) or set(raw) != _ENTRY_KEYS:
                raise bad(path, f"{where} must be an object with keys {sorted(_ENTRY_KEYS)}")
            campaign, round_, group, epsilon = raw["campaign_id"], raw["round"], raw["group"], raw["epsilon"]
            try:
                check_campaign_id(campaign)
                check_int("round", round_, 0, 2**32 - 1)
                check_int("group", group, 0, MAX_GROUPS - 1)
            except (TypeError, InvalidParameterError) as exc:
                raise bad(path, f"{where}: {exc}") from exc
            if not _is_real(epsilon) or epsilon <= 0:
                raise bad(path, f"{where}: epsilon must be a finite number > 0, got {epsilon!r}")
            if not _is_hex_id(raw["report_id"]):
                raise bad(path, f"{where}: report_id must be {2 * REPORT_ID_BYTES} lowercase hex digits")
            if not _is_real(raw["time"]):
                raise bad(path, f"{where}: time must be a finite number, got {raw['time']!r}")
            if groups.get(campaign) != group:
                raise bad(path, f"{where}: group {group} differs from the campaign's group {groups.get(campaign)!r}")
            entry = LedgerEntry(campaign_id=campaign, round=round_, group=group, epsilon=float(epsilon),
                                report_id=bytes.fromhex(raw["report_id"]), time=float(raw["time"]))
            if (campaign, round_) in seen_rounds:
                raise bad(path, f"{where}: campaign {campaign!r} round {round_} is charged twice")
            if entry.report_id in seen_ids:
                raise bad(path, f"{where}: report {raw['report_id']} is charged twice")
            seen_rounds.add((campaign, round_))
            seen_ids.add(entry.report_id)
            entries.append(entry)
        return device_id, entries, dict(groups)

    def _read_marker(self) -> str | None:
        try:
            data = self._marker.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._corrupted(self._marker, f"cannot be read ({exc})") from exc
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise self._corrupted(self._marker, f"not valid JSON ({exc})") from exc
        if (not isinstance(doc, dict) or doc.get("format") != _MARKER_FORMAT or doc.get("version") != _VERSION
                or not _is_hex_id(doc.get("device_id"))):
            raise self._corrupted(self._marker, f"expected {{'format': {_MARKER_FORMAT!r}, 'version': {_VERSION}, "
                                                "'device_id': <32 hex>}")
        device_id: str = doc["device_id"]
        return device_id

    def _write_marker(self) -> None:
        doc = {"format": _MARKER_FORMAT, "version": _VERSION, "device_id": self._device_id}
        write_durably(self._marker, _canonical(doc) + b"\n")

    def _save(self, entries: list[LedgerEntry], groups: dict[str, int]) -> None:
        """Durably write a complete ledger state (file-backed ledgers only; memory is not touched)."""
        if self._dir is None:
            return
        doc: dict[str, Any] = {"format": _FORMAT, "version": _VERSION, "device_id": self._device_id,
                               "entries": [e.to_json() for e in entries], "groups": groups}
        doc["checksum"] = _checksum(doc)
        st = write_durably(self._path, _canonical(doc) + b"\n")
        self._signature = (st.st_ino, st.st_size, st.st_mtime_ns)

    # ---------------------------------------------------------------- queries

    def spent(self, campaign_id: str) -> float:
        """Epsilon charged so far in ``campaign_id`` (exact sum of the charges)."""
        with self.locked():
            return self._spent.get(campaign_id, 0.0)

    def spent_total(self) -> float:
        """Epsilon charged so far over all campaigns."""
        with self.locked():
            return self._total

    def group_of(self, campaign_id: str) -> int | None:
        """The device's group in ``campaign_id``, or ``None`` if it has not chosen one yet."""
        with self.locked():
            return self._groups.get(campaign_id)

    def reports_in(self, campaign_id: str) -> tuple[LedgerEntry, ...]:
        """The charges of ``campaign_id``, oldest first."""
        with self.locked():
            return tuple(self._by_campaign.get(campaign_id, ()))

    def has_charge(self, campaign_id: str, round: int) -> bool:
        """Whether a report of ``campaign_id`` round ``round`` was charged."""
        return self.charge_for(campaign_id, round) is not None

    def charge_for(self, campaign_id: str, round: int) -> LedgerEntry | None:
        """The charge of ``campaign_id`` round ``round``, if any."""
        with self.locked():
            return self._charge_for_locked(campaign_id, round)

    def _charge_for_locked(self, campaign_id: str, round: int) -> LedgerEntry | None:
        """:meth:`charge_for` for a caller that holds the lock (the device's hot path)."""
        return self._by_round.get((campaign_id, round))

    def _group_of_locked(self, campaign_id: str) -> int | None:
        """:meth:`group_of` for a caller that holds the lock."""
        return self._groups.get(campaign_id)

    def is_charged(self, report_id: bytes) -> bool:
        """Whether the report ``report_id`` was charged."""
        with self.locked():
            return report_id in self._by_id

    def uncharged(self, report_ids: Iterable[bytes]) -> list[bytes]:
        """Those of ``report_ids`` that were not charged (in their order)."""
        with self.locked():
            return [rid for rid in report_ids if rid not in self._by_id]

    def entries(self) -> tuple[LedgerEntry, ...]:
        """Every charge, oldest first."""
        with self.locked():
            return tuple(self._entries)

    # ---------------------------------------------------------------- changes

    def check_budget(self, campaign_id: str, epsilon: float, *, campaign_cap: float, total_cap: float,
                     max_reports: int) -> None:
        """Raise :class:`BudgetExhaustedError` unless one more report costing ``epsilon`` fits every cap.

        Parameters
        ----------
        campaign_id : str
        epsilon : float
            What the report would charge.
        campaign_cap, total_cap : float
            Caps of the campaign's and the device's total spending.
        max_reports : int
            Largest number of reports in the campaign.
        """
        with self.locked():
            self._check_budget(campaign_id, epsilon, campaign_cap, total_cap, max_reports)

    def _check_budget(self, campaign_id: str, epsilon: float, campaign_cap: float, total_cap: float,
                      max_reports: int) -> None:
        """:meth:`check_budget` for a caller that holds the lock."""
        # One rounding of a two-term sum is far inside the tolerance.
        spent = self._spent.get(campaign_id, 0.0)
        if spent + epsilon > campaign_cap * (1 + _TOLERANCE):
            raise BudgetExhaustedError("campaign", spent, epsilon, campaign_cap)
        if self._total + epsilon > total_cap * (1 + _TOLERANCE):
            raise BudgetExhaustedError("total", self._total, epsilon, total_cap)
        reports = len(self._by_campaign.get(campaign_id, ()))
        if reports >= max_reports:
            raise BudgetExhaustedError("campaign reports", reports, 1, max_reports)

    def charge(self, *, campaign_id: str, round: int, group: int, epsilon: float, report_id: bytes,
               campaign_cap: float, total_cap: float, max_reports: int) -> LedgerEntry:
        """Check the caps and durably record one charge, atomically.

        Also records ``group`` as the device's group in the campaign if it had none.

        Raises
        ------
        BudgetExhaustedError
            The charge would exceed a cap (see :meth:`check_budget`); nothing is recorded.
        InvalidParameterError
            The round is already charged, the report id is already used, or ``group`` differs from
            the campaign's recorded group.
        """
        check_campaign_id(campaign_id)
        check_int("round", round, 0, 2**32 - 1)
        check_int("group", group, 0, MAX_GROUPS - 1)
        epsilon = check_float("epsilon", epsilon, 0.0, math.inf, low_open=True)
        if not isinstance(report_id, bytes) or len(report_id) != REPORT_ID_BYTES:
            raise InvalidParameterError(f"report_id must be {REPORT_ID_BYTES} bytes, got {report_id!r:.40}")
        with self.locked():
            return self._charge_locked(campaign_id, round, group, epsilon, report_id, campaign_cap, total_cap,
                                       max_reports)

    def _charge_locked(self, campaign_id: str, round: int, group: int, epsilon: float, report_id: bytes,
                       campaign_cap: float, total_cap: float, max_reports: int) -> LedgerEntry:
        """:meth:`charge` for a caller that holds the lock and passes values it already validated."""
        previous = self._by_round.get((campaign_id, round))
        if previous is not None:
            raise InvalidParameterError(
                f"campaign {campaign_id!r} round {round} is already charged (report {previous.report_id.hex()})")
        if report_id in self._by_id:
            raise InvalidParameterError(f"report {report_id.hex()} is already charged")
        known = self._groups.get(campaign_id)
        if known is not None and known != group:
            raise InvalidParameterError(
                f"report group {group} differs from the device's group {known} in campaign {campaign_id!r}")
        self._check_budget(campaign_id, epsilon, campaign_cap, total_cap, max_reports)
        entry = LedgerEntry(campaign_id=campaign_id, round=round, group=group, epsilon=epsilon,
                            report_id=report_id, time=time.time())
        # Write first: if the write fails, memory still matches the file.
        if self._dir is not None:
            self._save([*self._entries, entry], {**self._groups, campaign_id: group})
        self._add(entry)
        self._groups[campaign_id] = group
        return entry

    def set_group(self, campaign_id: str, group: int) -> int:
        """Durably record the device's group in ``campaign_id``; an already recorded group wins.

        Returns
        -------
        int
            The campaign's group.
        """
        check_campaign_id(campaign_id)
        check_int("group", group, 0, MAX_GROUPS - 1)
        with self.locked():
            known = self._groups.get(campaign_id)
            if known is not None:
                return known
            if self._dir is not None:
                self._save(self._entries, {**self._groups, campaign_id: group})
            self._groups[campaign_id] = group
            return group
