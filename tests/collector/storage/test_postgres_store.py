"""The PostgreSQL report store: the shared contract suite plus what is specific to PostgreSQL.

Runs against a throwaway server (``support.postgres``); skipped with an installation hint when
no PostgreSQL binaries exist and ``LDP_TEST_POSTGRES_URL`` is unset.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from ldp.v1 import campaigns_pb2
from ldp_collector.core import Collector
from ldp_collector.errors import InvalidArgumentError, OverloadedError
from ldp_collector.serde import config_from_proto
from ldp_collector.storage import Outcome, SchemaVersionError, StoredReport, open_store
from ldp_collector.storage.migrations import Migration
from ldp_collector.storage.postgres import (
    POSTGRES_MIGRATIONS,
    PostgresReportStore,
    apply_postgres_migrations,
    redact_url,
)
from support.postgres import postgres_server, postgres_url  # noqa: F401  (fixtures)
from support.store_doubles import Columns, Gate, open_concurrently

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

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'ldp-collector[postgres]'")


class TestPostgresReportStore(ReportStoreContract):
    @pytest.fixture
    def store_location(self, postgres_url: str) -> str:  # noqa: F811  (the fixture of that name)
        return postgres_url


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresReportStore]:  # noqa: F811
    s = PostgresReportStore(postgres_url)
    s.create_campaign(campaign_record())
    s.open_round("camp", 1, b"", 0.0)
    try:
        yield s
    finally:
        s.close()


# -- opening -------------------------------------------------------------------------------------------

def test_open_store_opens_postgres_urls(postgres_url: str) -> None:  # noqa: F811
    for url in (postgres_url, postgres_url.replace("postgresql://", "postgres://", 1),
                postgres_url.replace("postgresql://", "postgresql+psycopg://", 1)):
        store = open_store(url)
        try:
            assert isinstance(store, PostgresReportStore)
            store.list_campaigns(1)
        finally:
            store.close()


def test_missing_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now raises ImportError
    with pytest.raises(InvalidArgumentError, match=r"pip install 'ldp-collector\[postgres\]'"):
        open_store("postgresql://user:secret@127.0.0.1:1/ldp")


def test_unreachable_server_is_unavailable_and_hides_the_password() -> None:
    with pytest.raises(OverloadedError, match="cannot connect") as info:
        PostgresReportStore("postgresql://user:secret@127.0.0.1:1/ldp?connect_timeout=2")
    assert "secret" not in str(info.value) and "***" in str(info.value)


def test_redact_url() -> None:
    assert redact_url("postgresql://u:pw@h:5/db?x=1") == "postgresql://u:***@h:5/db?x=1"
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"


def test_newer_schema_is_refused(postgres_url: str) -> None:  # noqa: F811
    PostgresReportStore(postgres_url).close()
    latest = POSTGRES_MIGRATIONS[-1].version
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_migrations VALUES (%s, 'from the future', 0)", (latest + 1,))
    with pytest.raises(SchemaVersionError, match=rf"schema version {latest + 1}, newer than"):
        PostgresReportStore(postgres_url)


def test_migrations_are_transactional_and_each_applied_once(postgres_url: str) -> None:  # noqa: F811
    steps = (Migration(version=1, name="one", statements=("CREATE TABLE t (x BIGINT)",)),
             Migration(version=2, name="two", statements=("INSERT INTO t VALUES (1)",)))
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert apply_postgres_migrations(conn, steps[:1]) == 1
        assert apply_postgres_migrations(conn, steps) == 2
        assert apply_postgres_migrations(conn, steps) == 2
        assert conn.execute("SELECT COUNT(*) FROM t").fetchone() == (1,)
        with pytest.raises(ValueError, match="without gaps"):
            apply_postgres_migrations(conn, steps[1:])
        broken = (*steps, Migration(version=3, name="bad", statements=("CREATE TABLE u (y BIGINT)", "NOT SQL")))
        with pytest.raises(psycopg.errors.SyntaxError):
            apply_postgres_migrations(conn, broken)
        assert conn.execute("SELECT to_regclass('u')").fetchone() == (None,)  # rolled back
        assert conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone() == (2,)


def test_concurrent_openers_share_one_schema(postgres_url: str) -> None:  # noqa: F811
    for s in open_concurrently(lambda: PostgresReportStore(postgres_url)):
        s.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM schema_migrations").fetchall() == [(1,)]


# -- add_reports specifics -----------------------------------------------------------------------------

def test_add_reports_validates_its_input(store: PostgresReportStore) -> None:
    with pytest.raises(InvalidArgumentError, match="report_id must be 16 bytes"):
        store.add_reports("r", [make_report(), make_report(report_id=b"short")])
    with pytest.raises(InvalidArgumentError, match="group"):
        store.add_reports("r", [make_report(group=-1)])
    with pytest.raises(InvalidArgumentError, match="request_id"):
        store.add_reports("", [make_report()])
    with pytest.raises(InvalidArgumentError, match="payloads must be bytes"):
        store.add_reports("r", [make_report(payloads="text")])  # type: ignore[arg-type]
    assert store.count_reports("camp", 1) == 0


def test_large_and_empty_payloads_round_trip(store: PostgresReportStore) -> None:
    reports = [make_report(payloads=b""), make_report(payloads=bytes(range(256)) * 4096), make_report()]
    assert store.add_reports("r", reports) == [A, A, A]
    assert all_reports(store) == reports


def test_group_commit_merges_waiting_requests(store: PostgresReportStore) -> None:
    gate = Gate(count_per_group)
    blocker = threading.Thread(target=store.add_reports, args=("first", [make_report()], gate))
    blocker.start()
    assert gate.entered.wait(10)
    batches = [[make_report(group=g) for _ in range(3)] for g in range(6)]
    results: dict[int, list[Outcome]] = {}
    waiting = [threading.Thread(target=lambda i=i: results.__setitem__(
        i, store.add_reports(f"w{i}", batches[i], count_per_group))) for i in range(6)]
    for t in waiting:
        t.start()
    while store._writer.waiting() < 6:
        threading.Event().wait(0.002)
    gate.release.set()
    for t in (blocker, *waiting):
        t.join()
    assert all(results[i] == [A] * 3 for i in range(6))
    assert decoded_counts(store.load_accumulators("camp", 1)) == {**{g: 3 for g in range(6)}, 0: 4}


def test_a_failing_request_fails_alone(store: PostgresReportStore) -> None:
    gate = Gate(count_per_group)
    blocker = threading.Thread(target=store.add_reports, args=("first", [make_report()], gate))
    blocker.start()
    assert gate.entered.wait(10)

    def boom(reports: Sequence[StoredReport], blobs: Mapping[str, bytes]) -> Mapping[str, bytes]:
        raise ValueError("bad accumulator")

    outcomes: dict[str, object] = {}

    def submit(name: str, fn: object) -> None:
        try:
            outcomes[name] = store.add_reports(name, [make_report()], fn)  # type: ignore[arg-type]
        except ValueError as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=submit, args=(n, f)) for n, f in
               (("ok1", count_per_group), ("bad", boom), ("ok2", count_per_group))]
    for t in threads:
        t.start()
    while store._writer.waiting() < 3:
        threading.Event().wait(0.002)
    gate.release.set()
    for t in (blocker, *threads):
        t.join()
    assert outcomes["ok1"] == outcomes["ok2"] == [A]
    assert isinstance(outcomes["bad"], ValueError)
    assert store.count_reports("camp", 1) == 3


def test_backpressure_raises_overloaded(postgres_url: str) -> None:  # noqa: F811
    store = PostgresReportStore(postgres_url, max_pending_reports=10)
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


def test_two_stores_on_one_database_agree(postgres_url: str, store: PostgresReportStore) -> None:  # noqa: F811
    other = PostgresReportStore(postgres_url)  # as a second collector process would
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


def test_same_request_through_two_stores_at_once_has_one_answer(postgres_url: str,  # noqa: F811
                                                                 store: PostgresReportStore) -> None:
    """Two processes given the same request (a client retrying against another collector) agree."""
    other = PostgresReportStore(postgres_url)
    try:
        for k in range(20):
            batch = [make_report(group=i % 4) for i in range(50)]
            answers: list[object] = []
            barrier = threading.Barrier(2)

            def send(s: PostgresReportStore, b: list[StoredReport], name: str, gate: threading.Barrier,
                     out: list[object]) -> None:
                gate.wait()
                out.append(s.add_reports(name, b, count_per_group))

            threads = [threading.Thread(target=send, args=(s, batch, f"same-{k}", barrier, answers))
                       for s in (store, other)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert answers == [[A] * 50, [A] * 50]
        stored = all_reports(store)
        assert len(stored) == 20 * 50 == store.count_reports("camp", 1)
        assert decoded_counts(store.load_accumulators("camp", 1)) == dict(Counter(r.group for r in stored))
    finally:
        other.close()


def test_columnar_batches_are_stored_like_plain_ones(store: PostgresReportStore) -> None:
    store.open_round("camp", 2, b"", 0.0)
    old = make_report()
    assert store.add_reports("plain", [old]) == [A]
    fresh = [make_report(group=i % 3, round=1 + i % 2) for i in range(8)]
    batch = Columns.of([fresh[0], old, fresh[1], fresh[0], *fresh[2:]])
    seen: list[Sequence[StoredReport]] = []

    def spy(reports: Sequence[StoredReport], blobs: Mapping[str, bytes]) -> Mapping[str, bytes]:
        seen.append(reports)
        return count_per_group(reports, blobs)

    assert store.add_reports("columns", batch, spy) == [A, D, A, D, A, A, A, A, A, A]
    assert all(isinstance(r, Columns) for r in seen)
    assert sorted(len(r) for r in seen) == [4, 4]
    assert all_reports(store, "camp", 1) == [old, *fresh[0::2]]
    assert all_reports(store, "camp", 2) == fresh[1::2]


# -- several collectors over one database ----------------------------------------------------------------

def test_collectors_over_separate_stores_share_campaign_state(postgres_url: str) -> None:  # noqa: F811
    """Two Collector objects, each with its own store (as two processes or hosts), run one campaign."""
    from ldp_client.report import Report
    from ldp_client.rng import SeededRng

    first, second = PostgresReportStore(postgres_url), PostgresReportStore(postgres_url)
    try:
        a, b = Collector(first), Collector(second)
        config = campaigns_pb2.CampaignConfig(
            kind=campaigns_pb2.HISTOGRAM, domain=campaigns_pb2.Domain(categorical_size=8), epsilon=2.0,
            histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.GRR))
        created = a.create_campaign(config_from_proto(config))
        cid = created.config.campaign_id
        assert b.get_campaign(cid).config.campaign_id == cid
        spec, finished = b.get_round_spec(cid)
        assert spec is not None and not finished
        task = spec.tasks[0]
        rng = SeededRng(7)
        reports = [Report(report_id=rng.token_bytes(16), campaign_id=cid, round=spec.round, group=task.groups[0],
                          payloads=tuple(c.run(i % 8, rng=rng) for c in task.components)) for i in range(400)]
        half = len(reports) // 2
        outcomes_a = [o for o, _ in a.submit("from-a", reports[:half])]
        outcomes_b = [o for o, _ in b.submit("from-b", reports[half - 10:])]  # 10 already sent through a
        assert outcomes_a == [A] * half
        assert outcomes_b == [D] * 10 + [A] * (len(reports) - half)
        assert first.count_reports(cid, spec.round) == second.count_reports(cid, spec.round) == len(reports)
        b.close_round(cid, spec.round)
        assert a.get_campaign(cid).state == campaigns_pb2.FINISHED
        assert a.get_estimates(cid).reports == len(reports)
    finally:
        first.close()
        second.close()


@pytest.mark.integration
def test_two_server_processes_over_one_database(postgres_url: str, tmp_path: Path) -> None:  # noqa: F811
    """Two ``ldp-collector serve`` processes on one PostgreSQL URL serve one campaign over gRPC."""
    import grpc

    from ldp.v1 import service_pb2, service_pb2_grpc
    from ldp_client.grpc import CollectorClient
    from ldp_client.report import Report
    from ldp_client.rng import SeededRng

    from ..server.test_server_crash import AUTH, CHANNEL_OPTIONS, RPC_TIMEOUT_S, ServerProcess, histogram_config

    servers = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        servers.append(ServerProcess(tmp_path / name, postgres_url))
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_serving()
        with grpc.insecure_channel(servers[0].address) as channel:
            created = service_pb2_grpc.OperatorServiceStub(channel).CreateCampaign(
                service_pb2.CreateCampaignRequest(config=histogram_config()), metadata=AUTH, timeout=RPC_TIMEOUT_S)
        cid = created.config.campaign_id
        rng = SeededRng(11)
        sent: list[Report] = []
        for k, server in enumerate(servers * 3):
            with CollectorClient(server.address, options=CHANNEL_OPTIONS) as client:
                spec = client.get_round_spec(cid)  # the campaign created through the other server too
                assert spec is not None
                task = spec.tasks[0]
                batch = [Report(report_id=rng.token_bytes(16), campaign_id=cid, round=spec.round,
                                group=task.groups[0], payloads=tuple(c.run(i % 16, rng=rng) for c in task.components))
                         for i in range(100)]
                resent = sent[-5:]  # acknowledged by the other server: duplicates here
                outcomes = client.submit(resent + batch)
                assert [o.status.name for o in outcomes] == ["DUPLICATE"] * len(resent) + ["ACCEPTED"] * 100, k
                sent += batch
        assert spec is not None
        with grpc.insecure_channel(servers[1].address) as channel:
            operator = service_pb2_grpc.OperatorServiceStub(channel)
            closed = operator.CloseRound(service_pb2.CloseRoundRequest(campaign_id=cid, round=spec.round),
                                         metadata=AUTH, timeout=60)
        assert closed.state == campaigns_pb2.FINISHED
        with grpc.insecure_channel(servers[0].address) as channel:
            estimates = service_pb2_grpc.OperatorServiceStub(channel).GetEstimates(
                service_pb2.GetEstimatesRequest(campaign_id=cid), metadata=AUTH, timeout=RPC_TIMEOUT_S)
        assert estimates.reports == len(sent) == 600
        for server in servers:
            assert server.terminate() == 0, server.log_tail()
    finally:
        for server in servers:
            server.ensure_dead()


def test_lost_connections_are_replaced(store: PostgresReportStore, postgres_url: str) -> None:  # noqa: F811
    """After the server drops every session (a restart), calls fail retryably at most once, then work."""
    report = make_report()
    assert store.add_reports("before", [report]) == [A]
    with store.step_lock("camp") as held:
        assert held
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        killed = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE application_name = 'ldp-collector' AND pid <> pg_backend_pid()").fetchall()
    assert len(killed) >= 2  # the writer and at least one reader
    fresh = make_report()
    with pytest.raises(OverloadedError, match="unavailable"):  # the read of the replay check, once
        store.add_reports("after", [fresh, report])
    assert store.add_reports("after", [fresh, report]) == [A, D]  # the writer reconnects by itself
    assert store.add_reports("after", []) == [A, D]
    assert store.count_reports("camp", 1) == 2
    with store.step_lock("camp") as held:
        assert held
