"""A round's raw reports as Parquet files: the export of a stored round and the landing path.

Beyond one database (DESIGN §9) a round's reports live in columnar files that a distributed engine
reads in parallel (:mod:`ldp_collector.beam`). Two writers produce the same layout:

* :func:`export_round` copies a closed round out of a :class:`~ldp_collector.storage.base.ReportStore`
  (``ldp-collector export CAMPAIGN ROUND --out DIR``); resumable and idempotent.
* :class:`ParquetLanding` lands reports directly in such files, without the SQL store: the
  object-store / queue landing path. It takes the reports the ingest path hands the store
  (validated :class:`~ldp_collector.storage.base.StoredReport` rows), buffers them in bounded
  batches and publishes each file by an atomic rename, so a reader never sees half a file.

Layout of a directory (schema version :data:`SCHEMA_VERSION`)::

    DIR/manifest.json
    DIR/group=<g>/bucket=<b>/part-<k>.parquet

Columns: ``seq`` (int64, the report's position in the round: the store's insertion order, or the
landing writer's arrival order), ``report_id`` (binary), ``group`` (int64) and ``payloads``
(binary, the stored msgpack of the report's payloads). Rows are split by group and by a hash bucket
of the report id (so a round of one group still reads in parallel) into files of at most
``max_rows_per_file`` rows. The manifest (JSON) names the campaign and round, the round's spec
(``RoundSpec.pack()`` bytes in base64, as the store keeps them), the report count per group, every
file with its rows and SHA-256, a content hash over the files, the schema version and whether the
directory is ``complete``.

pyarrow is imported here and nowhere in the serving path; it comes with the ``export`` extra
(``pip install 'ldp-collector[export]'``).
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError as exc:  # the extra is optional; say how to get it
    raise ImportError("Parquet export needs pyarrow: pip install 'ldp-collector[export]'") from exc

from ldp_client.spec import RoundSpec

from .errors import FailedPreconditionError, InvalidArgumentError
from .storage.base import ReportStore, StoredReport

__all__ = [
    "DEFAULT_BUCKETS",
    "DEFAULT_MAX_ROWS_PER_FILE",
    "MANIFEST",
    "SCHEMA",
    "SCHEMA_VERSION",
    "Manifest",
    "ParquetLanding",
    "SequencedReport",
    "export_round",
    "read_file",
    "read_manifest",
    "report_batches",
]

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
#: Hash buckets per group: enough files for a few workers to read a one-group round in parallel.
DEFAULT_BUCKETS = 8
#: Rows per file: about 50 MB of typical reports, a good Parquet file size for object stores.
DEFAULT_MAX_ROWS_PER_FILE = 1_000_000
_FORMAT = "ldp-collector round reports"

SCHEMA = pa.schema([
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("report_id", pa.binary(), nullable=False),
    pa.field("group", pa.int64(), nullable=False),
    pa.field("payloads", pa.binary(), nullable=False),
])


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """What ``manifest.json`` says about a directory of round reports.

    Attributes
    ----------
    campaign_id, round : str, int
    spec : bytes
        The round's ``RoundSpec.pack()`` bytes.
    reports : int
        Rows over all files.
    groups : dict of int to int
        Rows per group.
    files : tuple of dict
        ``{"path", "rows", "sha256"}`` per file, paths relative to the directory, sorted.
    content_sha256 : str
        SHA-256 over the files' paths and hashes (:func:`_content_hash`).
    complete : bool
        Every file is written; a reader may use the directory.
    source : str
        ``"export"`` or ``"landing"``.
    buckets, max_rows_per_file : int
        The layout the files were written with (a resumed export keeps it).
    """

    campaign_id: str
    round: int
    spec: bytes
    reports: int
    groups: dict[int, int]
    files: tuple[dict[str, Any], ...]
    content_sha256: str
    complete: bool
    source: str
    buckets: int
    max_rows_per_file: int

    @property
    def round_spec(self) -> RoundSpec:
        """The round's spec."""
        return RoundSpec.unpack(self.spec)

    def to_json(self) -> str:
        return json.dumps({
            "format": _FORMAT, "schema_version": SCHEMA_VERSION, "campaign_id": self.campaign_id,
            "round": self.round, "spec": base64.b64encode(self.spec).decode("ascii"), "reports": self.reports,
            "groups": {str(g): n for g, n in sorted(self.groups.items())}, "files": list(self.files),
            "content_sha256": self.content_sha256, "complete": self.complete, "source": self.source,
            "buckets": self.buckets, "max_rows_per_file": self.max_rows_per_file,
        }, indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True, kw_only=True)
class SequencedReport:
    """One row of a file: a stored report and its position ``seq`` in the round."""

    seq: int
    report: StoredReport


def read_manifest(directory: str | os.PathLike[str]) -> Manifest | None:
    """The directory's manifest, or ``None`` when it has none yet.

    Raises
    ------
    InvalidArgumentError
        The manifest is unreadable or of another schema version.
    """
    path = Path(directory) / MANIFEST
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"{path}: unreadable manifest: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") != _FORMAT or raw.get("schema_version") != SCHEMA_VERSION:
        raise InvalidArgumentError(f"{path}: not a schema-version {SCHEMA_VERSION} manifest of round reports")
    try:
        return Manifest(campaign_id=str(raw["campaign_id"]), round=int(raw["round"]),
                        spec=base64.b64decode(raw["spec"]), reports=int(raw["reports"]),
                        groups={int(g): int(n) for g, n in raw["groups"].items()}, files=tuple(raw["files"]),
                        content_sha256=str(raw["content_sha256"]), complete=bool(raw["complete"]),
                        source=str(raw["source"]), buckets=int(raw["buckets"]),
                        max_rows_per_file=int(raw["max_rows_per_file"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{path}: malformed manifest: {exc}") from exc


def read_file(path: str | os.PathLike[str], batch_rows: int = 65536) -> Iterator[list[SequencedReport]]:
    """The rows of one report file, in their order (``seq`` ascending), in batches."""
    parquet = pq.ParquetFile(path)
    for batch in parquet.iter_batches(batch_size=batch_rows, columns=list(SCHEMA.names)):
        seqs, ids, groups, payloads = (batch.column(name).to_pylist() for name in SCHEMA.names)
        yield [SequencedReport(seq=seq, report=StoredReport(report_id=rid, campaign_id="", round=0, group=group,
                                                           payloads=data))
               for seq, rid, group, data in zip(seqs, ids, groups, payloads)]


def report_batches(directories: Sequence[str | os.PathLike[str]],
                   batch_size: int = 65536) -> Iterator[list[StoredReport]]:
    """Every report of complete directories of one round, in round order, in batches.

    Round order is each directory's ``seq`` order, directory after directory: for an export the
    store's insertion order, so a step that reads raw reports sums them in the order it would
    have over the store (float sums then agree bit for bit). A k-way merge over the files keeps
    memory at one batch per file.

    Raises
    ------
    FailedPreconditionError
        A directory without a complete manifest, or directories of different rounds.
    """
    manifests = [_complete_manifest(d) for d in directories]
    if len({(m.campaign_id, m.round) for m in manifests}) > 1:
        raise FailedPreconditionError("the directories hold reports of different rounds")
    batch: list[StoredReport] = []
    for directory, manifest in zip(directories, manifests):
        files = [_rows(Path(directory) / f["path"], batch_size) for f in manifest.files]
        for row in heapq.merge(*files, key=lambda r: r.seq):
            report = row.report
            batch.append(StoredReport(report_id=report.report_id, campaign_id=manifest.campaign_id,
                                      round=manifest.round, group=report.group, payloads=report.payloads))
            if len(batch) >= batch_size:
                yield batch
                batch = []
    if batch:
        yield batch


def _rows(path: Path, batch_rows: int) -> Iterator[SequencedReport]:
    for batch in read_file(path, batch_rows):
        yield from batch


def _complete_manifest(directory: str | os.PathLike[str]) -> Manifest:
    manifest = read_manifest(directory)
    if manifest is None or not manifest.complete:
        raise FailedPreconditionError(f"{directory}: no complete manifest (an export or landing still running, "
                                      "or one that stopped: run it again to finish it)")
    return manifest


def _bucket(report_id: bytes, buckets: int) -> int:
    """The report's hash bucket: stable across processes and versions (not Python's ``hash``)."""
    return int.from_bytes(hashlib.blake2b(report_id, digest_size=4).digest(), "little") % buckets


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _content_hash(files: Iterable[dict[str, Any]]) -> str:
    """SHA-256 over ``path NUL sha256 NL`` of every file, by path: one hash names the whole content."""
    digest = hashlib.sha256()
    for entry in sorted(files, key=lambda f: str(f["path"])):
        digest.update(f"{entry['path']}\0{entry['sha256']}\n".encode())
    return digest.hexdigest()


def _write_atomically(path: Path, rows: Sequence[SequencedReport]) -> None:
    """Write one Parquet file under a temporary name, fsync it, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({
        "seq": pa.array([r.seq for r in rows], pa.int64()),
        "report_id": pa.array([r.report.report_id for r in rows], pa.binary()),
        "group": pa.array([r.report.group for r in rows], pa.int64()),
        "payloads": pa.array([r.report.payloads for r in rows], pa.binary()),
    }, schema=SCHEMA)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_manifest(directory: Path, manifest: Manifest) -> None:
    tmp = directory / f".{MANIFEST}.tmp"
    tmp.write_text(manifest.to_json(), encoding="utf-8")
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, directory / MANIFEST)


class _PartitionedWriter:
    """Rows routed to ``group=<g>/bucket=<b>/<prefix>-<k>.parquet`` files of bounded size."""

    def __init__(self, directory: Path, *, buckets: int, max_rows_per_file: int, prefix: str,
                 skip_existing: bool) -> None:
        if buckets < 1 or max_rows_per_file < 1:
            raise InvalidArgumentError(f"buckets and max_rows_per_file must be >= 1, got {buckets} and "
                                       f"{max_rows_per_file}")
        self._directory = directory
        self._buckets = buckets
        self._max_rows = max_rows_per_file
        self._prefix = prefix
        self._skip_existing = skip_existing
        self._pending: dict[tuple[int, int], list[SequencedReport]] = {}
        self._parts: dict[tuple[int, int], int] = {}
        self.files: list[dict[str, Any]] = []
        self.groups: dict[int, int] = {}

    def add(self, row: SequencedReport) -> None:
        key = (row.report.group, _bucket(row.report.report_id, self._buckets))
        pending = self._pending.setdefault(key, [])
        pending.append(row)
        if len(pending) >= self._max_rows:
            self._flush(key)

    def flush(self) -> None:
        for key in list(self._pending):
            self._flush(key)

    def _flush(self, key: tuple[int, int]) -> None:
        rows = self._pending.pop(key, [])
        if not rows:
            return
        group, bucket = key
        part = self._parts.get(key, 0)
        self._parts[key] = part + 1
        relative = f"group={group}/bucket={bucket}/{self._prefix}-{part:05d}.parquet"
        path = self._directory / relative
        # A file already in place was renamed there complete by an earlier run over the same
        # rows in the same order (the export is deterministic): keep it, so a resumed export
        # only writes what is missing.
        if not (self._skip_existing and path.exists()):
            _write_atomically(path, rows)
        self.files.append({"path": relative, "rows": len(rows), "sha256": _file_sha256(path)})
        self.groups[group] = self.groups.get(group, 0) + len(rows)


def export_round(store: ReportStore, campaign_id: str, round: int, out: str | os.PathLike[str], *,
                 buckets: int = DEFAULT_BUCKETS, max_rows_per_file: int = DEFAULT_MAX_ROWS_PER_FILE,
                 batch_size: int = 65536) -> Manifest:
    """Write a closed round's raw reports to ``out`` as Parquet files with a manifest.

    Parameters
    ----------
    store : ReportStore
    campaign_id : str
    round : int
        A closed round (an open one still takes reports, so its export would not be final).
    out : path
        The directory (created if missing).
    buckets, max_rows_per_file : int
        Hash buckets per group, and the largest file.
    batch_size : int
        Reports read from the store at a time.

    Returns
    -------
    Manifest
        The complete manifest. Idempotent: when ``out`` already holds this round's complete export
        nothing is written and its manifest is returned. Resumable: after a crash, a new call
        writes only the files that are missing, then the manifest.

    Raises
    ------
    NotFoundError
        Unknown campaign or round.
    FailedPreconditionError
        The round is still open, or ``out`` holds another round's reports.
    """
    record = store.get_round(campaign_id, round)
    if record.open:
        raise FailedPreconditionError(f"round {round} of campaign {campaign_id} is open; close it first "
                                      "(close-round --engine beam closes, exports and runs the step)")
    directory = Path(out)
    existing = read_manifest(directory)
    if existing is not None:
        if (existing.campaign_id, existing.round, existing.source) != (campaign_id, round, "export"):
            raise FailedPreconditionError(f"{directory} holds reports of campaign {existing.campaign_id} round "
                                          f"{existing.round} ({existing.source}); export to another directory")
        if existing.complete:
            return existing
        buckets, max_rows_per_file = existing.buckets, existing.max_rows_per_file
    elif directory.exists() and any(directory.iterdir()):
        raise FailedPreconditionError(f"{directory} is not empty and holds no export; export to another directory")
    directory.mkdir(parents=True, exist_ok=True)
    writer = _PartitionedWriter(directory, buckets=buckets, max_rows_per_file=max_rows_per_file, prefix="part",
                                skip_existing=True)
    if existing is None:
        # Claim the directory first: a crashed export leaves this incomplete manifest, so a re-run
        # knows the files beside it are this round's and keeps them.
        _write_manifest(directory, Manifest(campaign_id=campaign_id, round=round, spec=record.spec, reports=0,
                                            groups={}, files=(), content_sha256="", complete=False,
                                            source="export", buckets=buckets,
                                            max_rows_per_file=max_rows_per_file))
    seq = 0
    for batch in store.iter_reports(campaign_id, round, batch_size):
        for report in batch:
            writer.add(SequencedReport(seq=seq, report=report))
            seq += 1
    writer.flush()
    files = tuple(sorted(writer.files, key=lambda f: str(f["path"])))
    manifest = Manifest(campaign_id=campaign_id, round=round, spec=record.spec, reports=seq, groups=writer.groups,
                        files=files, content_sha256=_content_hash(files), complete=True, source="export",
                        buckets=buckets, max_rows_per_file=max_rows_per_file)
    _write_manifest(directory, manifest)
    return manifest


class ParquetLanding:
    """Devices' reports landed directly in Parquet files: the object-store / queue landing path.

    One writer owns one directory of one round. :meth:`add` takes the reports the ingest path
    would hand the store (validated and decoded by :mod:`ldp_collector.ingest`), in arrival
    order; every ``max_rows_per_file`` reports of a (group, bucket) become one file, renamed into
    place atomically once written. :meth:`close` writes the remaining files and the complete
    manifest, after which :func:`report_batches` and the Beam pipeline read the directory exactly
    like an export. A report id seen before by this writer is dropped, as the store drops a
    resend (a round landed by several writers in several directories is deduplicated per writer
    only).

    Parameters
    ----------
    directory : path
        An empty or new directory.
    spec : RoundSpec
        The round the reports answer.
    buckets, max_rows_per_file : int
        As for :func:`export_round`; files are also the unit of durability here.
    """

    def __init__(self, directory: str | os.PathLike[str], spec: RoundSpec, *, buckets: int = DEFAULT_BUCKETS,
                 max_rows_per_file: int = 65536) -> None:
        self._directory = Path(directory)
        if read_manifest(self._directory) is not None or (self._directory.exists() and any(self._directory.iterdir())):
            raise FailedPreconditionError(f"{self._directory} is not empty; land each round in a new directory")
        self._directory.mkdir(parents=True, exist_ok=True)
        self._spec = spec
        self._buckets = buckets
        self._max_rows_per_file = max_rows_per_file
        self._writer = _PartitionedWriter(self._directory, buckets=buckets, max_rows_per_file=max_rows_per_file,
                                          prefix="land", skip_existing=False)
        self._seen: set[bytes] = set()
        self._seq = 0
        self._closed = False

    def add(self, reports: Iterable[StoredReport]) -> int:
        """Land reports of the writer's round; returns how many were new."""
        if self._closed:
            raise FailedPreconditionError("the landing writer is closed")
        added = 0
        for report in reports:
            if report.campaign_id != self._spec.campaign_id or report.round != self._spec.round:
                raise InvalidArgumentError(f"report of campaign {report.campaign_id} round {report.round} "
                                           f"landed in round {self._spec.round} of {self._spec.campaign_id}")
            if report.report_id in self._seen:
                continue
            self._seen.add(report.report_id)
            self._writer.add(SequencedReport(seq=self._seq, report=report))
            self._seq += 1
            added += 1
        return added

    def close(self) -> Manifest:
        """Write what is buffered and the complete manifest; the directory is then readable."""
        if not self._closed:
            self._writer.flush()
            self._closed = True
        files = tuple(sorted(self._writer.files, key=lambda f: str(f["path"])))
        manifest = Manifest(campaign_id=self._spec.campaign_id, round=self._spec.round, spec=self._spec.pack(),
                            reports=self._seq, groups=self._writer.groups, files=files,
                            content_sha256=_content_hash(files), complete=True, source="landing",
                            buckets=self._buckets, max_rows_per_file=self._max_rows_per_file)
        _write_manifest(self._directory, manifest)
        return manifest

    def __enter__(self) -> ParquetLanding:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
