"""The device's durable privacy-budget ledger.

The ledger records every charge (one per report: campaign, round, group, epsilon, report id, time,
and the generator its coins came from when it was not the device's own) and the group the device
chose in each campaign. A charge is recorded *before* its report is stored for sending, so the
budget a device has spent can only be over-stated, never under-stated. Budget checks are exact
(:mod:`ldp_client.budget`): the exact sum of the charges never exceeds a cap.

On disk the ledger is one JSON file, ``<state_dir>/ledger.json``::

    {"format": "ldp-client-ledger", "version": 2, "device_id": "<32 hex>",
     "entries": [{"campaign_id": ..., "round": ..., "group": ..., "epsilon": ...,
                  "report_id": "<32 hex>", "time": <unix seconds>, "rng": null}, ...],
     "groups": {"<campaign_id>": <group>, ...},
     "checksum": "sha256:<hex of the canonical JSON of every other key>"}

``rng`` is ``null`` when the report's coins came from the device's memoized randomness or the OS
CSPRNG, else the class name of the generator that was injected (tests and simulations only: such
a report offers no privacy). Version 1 files (no ``rng``) are read and rewritten as version 2.

The device file ``<state_dir>/device.json`` holds the device id and the device's secret (32 bytes
from the OS CSPRNG, the key of its memoized randomness, :mod:`ldp_client.memo`; it never leaves
the device)::

    {"format": "ldp-client-device", "version": 2, "device_id": "<32 hex>", "secret": "<64 hex>"}

It is written once, right after the first (empty) ledger, and never changes.

Durability: every change rewrites the file through :func:`write_durably` (temporary file in the same
directory, flush, ``fsync``, ``os.replace``, ``fsync`` of the directory), so a crash leaves either
the old or the new ledger, never a torn one. A ledger that is missing beside anything else of a
device's state (the outbox, a ledger read before), unparseable, fails its checksum or holds
impossible values raises :class:`~ldp_client.errors.LedgerCorruptedError` naming the file and the
problem, and so does a ``device.json`` missing beside a ledger that was used: the budget is never
silently reset. A state directory that cannot be written (read-only, full) raises
:class:`~ldp_client.errors.StateDirectoryError` naming the path.

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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from ._validation import check_float, check_int
from .admission import Caps, check_budget
from .budget import UNIT, units
from .errors import InvalidParameterError, LedgerCorruptedError, StateDirectoryError
from .memo import SECRET_BYTES
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
_VERSION = 2
_READABLE_VERSIONS = (1, 2)
_DOC_KEYS = frozenset({"format", "version", "device_id", "entries", "groups", "checksum"})
_ENTRY_KEYS = {1: frozenset({"campaign_id", "round", "group", "epsilon", "report_id", "time"}),
               2: frozenset({"campaign_id", "round", "group", "epsilon", "report_id", "time", "rng"})}
_MARKER_KEYS = {1: frozenset({"format", "version", "device_id"}),
                2: frozenset({"format", "version", "device_id", "secret"})}
_MAX_RNG_NAME = 256


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Turn an operating-system error while changing ``path`` into a :class:`StateDirectoryError`."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise StateDirectoryError(
            f"cannot write the device state {path}: {reason}; the state directory must be writable and have "
            "free space", path=path) from exc


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
    with _writing(path):
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


def _is_temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def remove_stale_temporary_files(directory: Path) -> None:
    """Remove ``.*.tmp`` files a crashed :func:`write_durably` left behind (call with writers locked out)."""
    with contextlib.suppress(FileNotFoundError), _writing(directory):
        for entry in os.scandir(directory):
            if _is_temporary(entry.name) and entry.is_file():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def _new_secret() -> bytes:
    """A new device secret from the OS CSPRNG."""
    return os.urandom(SECRET_BYTES)


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def _checksum(doc: dict[str, Any]) -> str:
    rest = {k: v for k, v in doc.items() if k != "checksum"}
    return "sha256:" + hashlib.sha256(_canonical(rest)).hexdigest()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


class LedgerEntry(NamedTuple):
    """One charge: the report ``report_id`` of ``campaign_id``/``round`` cost ``epsilon``.

    ``rng`` names the injected generator the report's coins came from, or is ``None`` for the
    device's own randomness (memoized from its secret, or the OS CSPRNG).
    """

    campaign_id: str
    round: int
    group: int
    epsilon: float
    report_id: bytes
    time: float
    rng: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"campaign_id": self.campaign_id, "round": self.round, "group": self.group,
                "epsilon": self.epsilon, "report_id": self.report_id.hex(), "time": self.time, "rng": self.rng}


def _is_hex(value: Any, nbytes: int) -> bool:
    if not isinstance(value, str) or len(value) != 2 * nbytes:
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return value == value.lower()


def _is_hex_id(value: Any) -> bool:
    return _is_hex(value, REPORT_ID_BYTES)


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
        self._path = self._dir / LEDGER_FILE
        self._marker = self._dir / MARKER_FILE
        with _writing(self._dir):
            self._dir.mkdir(parents=True, exist_ok=True)
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
        self._secret = _new_secret()
        return self

    def _init_memory(self, device_id: str | None) -> None:
        self._guard = _LedgerLock(self)
        self._dir = None
        self._device_id = device_id or ""
        self._secret = b""
        self._signature: tuple[int, int, int] | None = None
        self._generation = 0
        self._set_state([], {})

    def _set_state(self, entries: list[LedgerEntry], groups: dict[str, int]) -> None:
        self._entries: list[LedgerEntry] = []
        self._groups = dict(groups)
        self._by_round: dict[tuple[str, int], LedgerEntry] = {}
        self._by_id: dict[bytes, LedgerEntry] = {}
        self._by_campaign: dict[str, list[LedgerEntry]] = {}
        self._spent: dict[str, int] = {}  # exact sums, in units of budget.UNIT
        self._total = 0
        for e in entries:
            self._add(e)

    def _add(self, entry: LedgerEntry) -> None:
        # Exact rational sums, independent of the order of the charges, kept up to date per charge.
        epsilon = units(entry.epsilon)
        self._total += epsilon
        self._entries.append(entry)
        self._by_round[(entry.campaign_id, entry.round)] = entry
        self._by_id[entry.report_id] = entry
        self._by_campaign.setdefault(entry.campaign_id, []).append(entry)
        self._spent[entry.campaign_id] = self._spent.get(entry.campaign_id, 0) + epsilon

    # ---------------------------------------------------------------- locking and persistence

    @property
    def device_id(self) -> str:
        """The device's random id (32 hex digits), fixed when the state directory was created."""
        return self._device_id

    @property
    def secret(self) -> bytes:
        """The device's secret, the key of its memoized randomness (:mod:`ldp_client.memo`).

        It never leaves the device: nothing in a report or a request is derived from it except
        through HMAC-SHA256.
        """
        with self.locked():
            return self._secret

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
            self._create()
            return
        signature = (st.st_ino, st.st_size, st.st_mtime_ns)
        if signature == self._signature:
            return
        try:
            data = self._path.read_bytes()
        except OSError as exc:
            raise self._corrupted(self._path, f"cannot be read ({exc})") from exc
        device_id, entries, groups, version = self._parse(data)
        marker = self._read_marker()
        if marker is None:
            if entries or groups:
                raise self._corrupted(self._marker, "missing beside a ledger that was used: the device's secret is "
                                                    "lost, and with it the memoized randomness of its reports")
            # An empty ledger without a device file: the first start was interrupted between the two
            # writes. No randomness was ever drawn from a secret, so a new one is safe.
            self._device_id, self._secret = device_id, _new_secret()
            self._write_marker()
        else:
            marker_id, secret, marker_version = marker
            if marker_id != device_id:
                raise self._corrupted(self._path, f"device id {device_id} differs from {marker_id} in {MARKER_FILE}")
            self._device_id, self._secret = device_id, secret
            if marker_version < _VERSION:
                self._write_marker()  # a version-1 device file gains the secret it was given on reading
        self._set_state(entries, groups)
        if version < _VERSION:
            self._save(entries, groups)  # rewritten in the current version, with the same content
        else:
            self._signature = signature
        self._generation += 1

    def _create(self) -> None:
        """Initialise a new state directory, or refuse: a ledger is missing only from a new one.

        The empty ledger is written first, then the device file: a device file without a ledger, or
        a ledger missing beside anything else of a device's state, is never a fresh start.
        """
        if self._signature is not None:
            raise self._corrupted(self._path, "missing although it was read before (deleted or replaced)")
        others = sorted(name for name in os.listdir(self._dir) if name != LOCK_FILE and not _is_temporary(name))
        if others:
            raise self._corrupted(self._path, f"missing beside the device state {', '.join(others[:3])}: a lost or "
                                              "deleted ledger is never a fresh start")
        self._device_id = self._rng.token_bytes(REPORT_ID_BYTES).hex()
        self._secret = _new_secret()
        self._save([], {})
        self._set_state([], {})
        self._write_marker()

    def _parse(self, data: bytes) -> tuple[str, list[LedgerEntry], dict[str, int], int]:
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
        version = doc.get("version")
        if isinstance(version, bool) or version not in _READABLE_VERSIONS:
            raise bad(path, f"version {version!r} is not supported (this SDK reads versions "
                            f"{', '.join(map(str, _READABLE_VERSIONS))})")
        entry_keys = _ENTRY_KEYS[version]
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
            if not isinstance(raw, dict) or set(raw) != entry_keys:
                raise bad(path, f"{where} must be an object with keys {sorted(entry_keys)}")
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
            rng = raw.get("rng")
            if rng is not None and (not isinstance(rng, str) or not 0 < len(rng) <= _MAX_RNG_NAME):
                raise bad(path, f"{where}: rng must be null or a generator's name, got {rng!r:.60}")
            entry = LedgerEntry(campaign_id=campaign, round=round_, group=group, epsilon=float(epsilon),
                                report_id=bytes.fromhex(raw["report_id"]), time=float(raw["time"]), rng=rng)
            if (campaign, round_) in seen_rounds:
                raise bad(path, f"{where}: campaign {campaign!r} round {round_} is charged twice")
            if entry.report_id in seen_ids:
                raise bad(path, f"{where}: report {raw['report_id']} is charged twice")
            seen_rounds.add((campaign, round_))
            seen_ids.add(entry.report_id)
            entries.append(entry)
        return device_id, entries, dict(groups), version

    def _read_marker(self) -> tuple[str, bytes, int] | None:
        """The device file's id, secret and version; ``None`` if there is none.

        A version-1 file (no secret, written by an older SDK) is given a new secret from the OS
        CSPRNG, which the caller writes back.
        """
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
        version = doc.get("version") if isinstance(doc, dict) else None
        secret = doc.get("secret") if isinstance(doc, dict) else None
        if (not isinstance(doc, dict) or doc.get("format") != _MARKER_FORMAT or isinstance(version, bool)
                or version not in _MARKER_KEYS or set(doc) != _MARKER_KEYS[version]
                or not _is_hex_id(doc.get("device_id"))
                or (version >= 2 and not (isinstance(secret, str) and _is_hex(secret, SECRET_BYTES)))):
            raise self._corrupted(self._marker, f"expected {{'format': {_MARKER_FORMAT!r}, 'version': {_VERSION}, "
                                                f"'device_id': <32 hex>, 'secret': <{2 * SECRET_BYTES} hex>}}")
        device_id: str = doc["device_id"]
        return device_id, bytes.fromhex(secret) if isinstance(secret, str) else _new_secret(), version

    def _write_marker(self) -> None:
        doc = {"format": _MARKER_FORMAT, "version": _VERSION, "device_id": self._device_id,
               "secret": self._secret.hex()}
        write_durably(self._marker, _canonical(doc) + b"\n")
        with contextlib.suppress(OSError):
            os.chmod(self._marker, 0o600)  # the secret is for this device's user alone

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
        """Epsilon charged so far in ``campaign_id`` (the exact sum of the charges, rounded to a float)."""
        with self.locked():
            return float(self._spent.get(campaign_id, 0) * UNIT)

    def spent_total(self) -> float:
        """Epsilon charged so far over all campaigns (the exact sum, rounded to a float)."""
        with self.locked():
            return float(self._total * UNIT)

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
        spent, spent_total, reports = self._usage_locked(campaign_id)
        check_budget(epsilon, Caps(campaign_epsilon=campaign_cap, total_epsilon=total_cap, reports=max_reports),
                     spent=spent, spent_total=spent_total, reports=reports)

    def _usage_locked(self, campaign_id: str) -> tuple[int, int, int]:
        """The exact spending in ``campaign_id`` and in total (units of ``budget.UNIT``), and its report count."""
        return self._spent.get(campaign_id, 0), self._total, len(self._by_campaign.get(campaign_id, ()))

    def charge(self, *, campaign_id: str, round: int, group: int, epsilon: float, report_id: bytes,
               campaign_cap: float, total_cap: float, max_reports: int, rng: str | None = None) -> LedgerEntry:
        """Check the caps and durably record one charge, atomically.

        Also records ``group`` as the device's group in the campaign if it had none. ``rng`` names
        an injected generator the report's coins came from (``None``: the device's own randomness).

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
        if rng is not None and (not isinstance(rng, str) or not 0 < len(rng) <= _MAX_RNG_NAME):
            raise InvalidParameterError(f"rng must be None or a generator's name of at most {_MAX_RNG_NAME} characters")
        with self.locked():
            return self._charge_locked(campaign_id, round, group, epsilon, report_id, campaign_cap, total_cap,
                                       max_reports, rng)

    def _charge_locked(self, campaign_id: str, round: int, group: int, epsilon: float, report_id: bytes,
                       campaign_cap: float, total_cap: float, max_reports: int, rng: str | None = None) -> LedgerEntry:
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
                            report_id=report_id, time=time.time(), rng=rng)
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
