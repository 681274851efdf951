"""The SQLite report store: the shared contract suite plus what is specific to SQLite."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from ldp_collector.errors import InvalidArgumentError, OverloadedError
from ldp_collector.storage import (
    ReportStore,
    SchemaVersionError,
    SqliteReportStore,
    StoredReport,
    open_store,
)
from ldp_collector.storage.group_commit import ColumnarReports
from ldp_collector.storage.migrations import LATEST_VERSION, SQLITE_MIGRATIONS, Migration, apply_migrations
from support.store_doubles import Columns, Gate, open_concurrently, wait_until

from .store_contract import (
    A,
    D,
    R,
    ReportStoreContract,
    all_reports,
    campaign_record,
    count_per_group,
    decoded_counts,
    make_report,
)


class TestSqliteReportStore(ReportStoreContract):
    @pytest.fixture
    def store_location(self, tmp_path: Path) -> str:
        return str(tmp_path / "data")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "ldp-data" / "nested"


@pytest.fixture
def store(data_dir: Path) -> Iterator[SqliteReportStore]:
    s = SqliteReportStore(data_dir)
    s.create_campaign(campaign_record())
    s.open_round("camp", 1, b"", 0.0)
    try:
        yield s
    finally:
        s.close()


# -- the file ----------------------------------------------------------------------------------------

def test_creates_the_directory_and_a_wal_database(store: SqliteReportStore, data_dir: Path) -> None:
    assert store.path == data_dir / "collector.sqlite3" and store.path.is_file()
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 16384
        assert conn.execute("SELECT version FROM schema_migrations").fetchall() == [(LATEST_VERSION,)]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"campaigns", "rounds", "reports", "report_ids", "request_ids", "accumulators",
            "schema_migrations"} <= tables
    conn = store._connect()  # every connection the store opens: durable commits, foreign keys
    try:
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    finally:
        conn.close()


def test_data_dir_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        SqliteReportStore(tmp_path / "file")


def test_newer_schema_is_refused(data_dir: Path) -> None:
    SqliteReportStore(data_dir).close()
    with sqlite3.connect(data_dir / "collector.sqlite3") as conn:
        conn.execute("INSERT INTO schema_migrations VALUES (?, 'from the future', 0)", (LATEST_VERSION + 1,))
    with pytest.raises(SchemaVersionError, match=rf"schema version {LATEST_VERSION + 1}, newer than"):
        SqliteReportStore(data_dir)


def test_migrations_are_dense_and_each_applied_once(tmp_path: Path) -> None:
    assert [m.version for m in SQLITE_MIGRATIONS] == list(range(1, LATEST_VERSION + 1))
    conn = sqlite3.connect(tmp_path / "m.sqlite3", isolation_level=None)
    steps = (Migration(version=1, name="one", statements=("CREATE TABLE t (x BIGINT)",)),
             Migration(version=2, name="two", statements=("INSERT INTO t VALUES (1)",)))
    assert apply_migrations(conn, steps[:1]) == 1
    assert apply_migrations(conn, steps) == 2
    assert apply_migrations(conn, steps) == 2
    assert conn.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 1
    assert conn.execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall() == [
        (1, "one"), (2, "two")]
    with pytest.raises(ValueError, match="without gaps"):
        apply_migrations(conn, steps[1:])
    broken = (*steps, Migration(version=3, name="bad", statements=("CREATE TABLE u (y)", "NOT SQL")))
    with pytest.raises(sqlite3.OperationalError):
        apply_migrations(conn, broken)
    assert conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'u'").fetchone()[0] == 0  # rolled back
    assert not conn.in_transaction
    conn.close()


def test_concurrent_openers_share_one_schema(data_dir: Path) -> None:
    for s in open_concurrently(lambda: SqliteReportStore(data_dir)):
        s.close()


# -- open_store ----------------------------------------------------------------------------------------

def test_open_store_locations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[ReportStore] = []
    try:
        opened.append(open_store(tmp_path / "a"))
        opened.append(open_store(str(tmp_path / "b")))
        opened.append(open_store(f"sqlite:///{tmp_path / 'c'}"))  # absolute: sqlite:////tmp/...
        monkeypatch.chdir(tmp_path)
        opened.append(open_store("sqlite:///relative/dir"))
        assert all(isinstance(s, SqliteReportStore) for s in opened)
        for name in ("a", "b", "c", "relative/dir"):
            assert (tmp_path / name / "collector.sqlite3").is_file()
    finally:
        for s in opened:
            s.close()


@pytest.mark.parametrize("location", ["mysql://db/ldp", "sqlite:///", ""])
def test_open_store_refuses_other_locations(location: str) -> None:
    with pytest.raises(InvalidArgumentError):
        open_store(location)


# -- add_reports specifics -----------------------------------------------------------------------------

def test_add_reports_validates_its_input(store: SqliteReportStore) -> None:
    with pytest.raises(InvalidArgumentError, match="report_id must be 16 bytes"):
        store.add_reports("r", [make_report(), make_report(report_id=b"short")])
    with pytest.raises(InvalidArgumentError, match="group"):
        store.add_reports("r", [make_report(group=-1)])
    with pytest.raises(InvalidArgumentError, match="request_id"):
        store.add_reports("", [make_report()])
    with pytest.raises(TypeError, match="StoredReport"):
        store.add_reports("r", [object()])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match="round"):
        store.add_reports("r", [make_report(round=-1)])
    assert store.count_reports("camp", 1) == 0
    assert store.add_reports("r", [make_report()]) == [A]  # no refused call recorded the request id


def test_large_and_empty_payloads_round_trip(store: SqliteReportStore) -> None:
    reports = [make_report(payloads=b""), make_report(payloads=bytes(range(256)) * 40), make_report(group=2**32 - 1)]
    assert store.add_reports("r", reports) == [A, A, A]
    assert all_reports(store) == reports


def test_group_commit_merges_waiting_requests(store: SqliteReportStore) -> None:
    gate = Gate(count_per_group)
    first = threading.Thread(target=store.add_reports, args=("first", [make_report()], gate))
    first.start()
    assert gate.entered.wait(10)  # the writer is inside the first transaction
    batches = [[make_report(group=i) for _ in range(3)] for i in range(5)]
    results: dict[int, list[object]] = {}

    def submit(i: int) -> None:
        results[i] = list(store.add_reports(f"waiting-{i}", batches[i], gate))

    waiting = [threading.Thread(target=submit, args=(i,)) for i in range(5)]
    for w in waiting:
        w.start()
    wait_until(lambda: store._writer.waiting() == 5)
    gate.release.set()
    for w in [first, *waiting]:
        w.join()
    assert gate.calls == [1, 15]  # the five waiting requests shared one transaction
    assert results == {i: [A, A, A] for i in range(5)}
    assert decoded_counts(store.load_accumulators("camp", 1)) == {0: 4, 1: 3, 2: 3, 3: 3, 4: 3}


def test_a_failing_request_fails_alone(store: SqliteReportStore) -> None:
    gate = Gate(count_per_group)
    blocker = threading.Thread(target=store.add_reports, args=("first", [make_report()], gate))
    blocker.start()
    assert gate.entered.wait(10)

    def boom(reports: Sequence[StoredReport], blobs: Mapping[str, bytes]) -> Mapping[str, bytes]:
        raise RuntimeError("bad accumulator")

    good = [make_report(), make_report()]
    outcome: dict[str, object] = {}

    def submit(name: str, batch: list[StoredReport], fn: object) -> None:
        try:
            outcome[name] = store.add_reports(name, batch, fn)  # type: ignore[arg-type]
        except RuntimeError as exc:
            outcome[name] = exc

    threads = [threading.Thread(target=submit, args=("good", good, count_per_group)),
               threading.Thread(target=submit, args=("bad", [make_report()], boom)),
               threading.Thread(target=submit, args=("dup", [good[0]], None))]
    for t in threads:
        t.start()
        wait_until(lambda n=threads.index(t) + 1: store._writer.waiting() == n)
    gate.release.set()
    for t in [blocker, *threads]:
        t.join()
    assert outcome["good"] == [A, A] and outcome["dup"] == [D]
    assert isinstance(outcome["bad"], RuntimeError)
    assert store.count_reports("camp", 1) == 3


def test_backpressure_raises_overloaded(data_dir: Path) -> None:
    store = SqliteReportStore(data_dir, max_pending_reports=10)
    try:
        store.create_campaign(campaign_record())
        store.open_round("camp", 1, b"", 0.0)
        gate = Gate(count_per_group)
        blocker = threading.Thread(target=store.add_reports, args=("first", [make_report()] * 8, gate))
        blocker.start()
        assert gate.entered.wait(10)
        with pytest.raises(OverloadedError, match="retry later"):
            store.add_reports("second", [make_report() for _ in range(5)])
        gate.release.set()
        blocker.join()
        assert store.add_reports("second", [make_report() for _ in range(5)]) == [A] * 5
    finally:
        store.close()


def test_two_stores_on_one_directory_agree(data_dir: Path, store: SqliteReportStore) -> None:
    other = SqliteReportStore(data_dir)  # as a second collector process would
    try:
        report = make_report()
        assert store.add_reports("a", [report]) == [A]
        assert other.add_reports("b", [report, make_report()]) == [D, A]
        assert other.add_reports("a", []) == [A]  # the request id too
        assert other.close_round("camp", 1, 1.0) is True
        assert store.close_round("camp", 1, 2.0) is False
        assert store.add_reports("c", [make_report()]) == [R]
        assert store.count_reports("camp", 1) == other.count_reports("camp", 1) == 2
    finally:
        other.close()


def test_close_flushes_queued_requests(data_dir: Path) -> None:
    store = SqliteReportStore(data_dir)
    store.create_campaign(campaign_record())
    store.open_round("camp", 1, b"", 0.0)
    gate = Gate(count_per_group)
    blocker = threading.Thread(target=store.add_reports, args=("first", [make_report()], gate))
    blocker.start()
    assert gate.entered.wait(10)
    results: list[object] = []
    queued = threading.Thread(target=lambda: results.append(store.add_reports("queued", [make_report()])))
    queued.start()
    wait_until(lambda: store._writer.waiting() == 1)
    closer = threading.Thread(target=store.close)
    closer.start()
    wait_until(lambda: store._writer.closed)
    gate.release.set()
    for t in (blocker, queued, closer):
        t.join()
    assert results == [[A]]
    reopened = SqliteReportStore(data_dir)
    try:
        assert reopened.count_reports("camp", 1) == 2
    finally:
        reopened.close()


# -- columnar batches ----------------------------------------------------------------------------------

def test_columnar_batches_are_stored_like_plain_ones(store: SqliteReportStore) -> None:
    store.open_round("camp", 2, b"", 0.0)
    old = make_report()
    assert store.add_reports("plain", [old]) == [A]
    fresh = [make_report(group=i % 3, round=1 + i % 2) for i in range(8)]
    batch = Columns.of([fresh[0], old, fresh[1], fresh[0], *fresh[2:]])
    assert isinstance(batch, ColumnarReports)
    seen: list[Sequence[StoredReport]] = []

    def spy(reports: Sequence[StoredReport], blobs: Mapping[str, bytes]) -> Mapping[str, bytes]:
        seen.append(reports)
        return count_per_group(reports, blobs)

    assert store.add_reports("columns", batch, spy) == [A, D, A, D, A, A, A, A, A, A]
    assert all(isinstance(r, Columns) for r in seen)  # the accumulator gets the columns, not copies
    assert sorted(len(r) for r in seen) == [4, 4]  # one call per round, new reports only
    assert all_reports(store, "camp", 1) == [old, *fresh[0::2]]
    assert all_reports(store, "camp", 2) == fresh[1::2]
    assert store.add_reports("columns", Columns.of([])) == [A, D, A, D, A, A, A, A, A, A]
