"""The behaviour every :class:`~ldp_collector.storage.base.ReportStore` must have (STYLE.md §9).

A backend inherits the whole suite by subclassing :class:`ReportStoreContract` in a test module
and providing one fixture, ``store_location``: a location :func:`~ldp_collector.storage.open_store`
opens, fresh for each test. ``store_factory`` (a callable that opens a *new* store object on the
same backing storage each time it is called, as another process would) defaults to opening that
location; the reopen test closes one store and opens another on the same data, and the tests of
races between processes open several at once, in this process and in child processes. For
example::

    class TestSqliteReportStore(ReportStoreContract):
        @pytest.fixture
        def store_location(self, tmp_path: Path) -> str:
            return str(tmp_path / "data")

The class name does not start with ``Test``, so pytest collects the suite only through subclasses.
"""

from __future__ import annotations

import multiprocessing
import os
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence

import pytest

from ldp_collector.errors import AlreadyExistsError, NotFoundError
from ldp_collector.serde import config_from_proto
from ldp_collector.storage import open_store
from ldp_collector.storage.base import (
    CampaignRecord,
    Outcome,
    ReportStore,
    RoundRecord,
    StoreClosedError,
    StoredReport,
)

__all__ = ["ReportStoreContract", "StoreFactory", "count_per_group", "make_report"]

StoreFactory = Callable[[], ReportStore]

A, D, R = Outcome.ACCEPTED, Outcome.DUPLICATE, Outcome.REJECTED


def make_report(campaign_id: str = "camp", round: int = 1, *, report_id: bytes | None = None, group: int = 0,
                payloads: bytes | None = None) -> StoredReport:
    """A report with a fresh random id and payloads derived from it (so each report is distinct)."""
    rid = os.urandom(16) if report_id is None else report_id
    return StoredReport(report_id=rid, campaign_id=campaign_id, round=round, group=group,
                        payloads=b"\x91\x92\x02\xc4\x10" + rid if payloads is None else payloads)


def count_per_group(reports: Sequence[StoredReport], blobs: Mapping[str, bytes]) -> Mapping[str, bytes]:
    """A mergeable accumulator: an int64 count per group, one blob per group."""
    counts = Counter(r.group for r in reports)
    return {f"g{g}": struct.pack("<q", n + (struct.unpack("<q", blobs[f"g{g}"])[0] if f"g{g}" in blobs else 0))
            for g, n in counts.items()}


def decoded_counts(blobs: Mapping[str, bytes]) -> dict[int, int]:
    return {int(name[1:]): struct.unpack("<q", data)[0] for name, data in blobs.items()}


def campaign_record(campaign_id: str = "camp", **changes: object) -> CampaignRecord:
    fields: dict[str, object] = dict(campaign_id=campaign_id, config=b"\x08\x01cfg", state="collecting",
                                     current_round=1, created_at=1_700_000_000.25, engine_state=b"\x80",
                                     result=None, error="")
    fields.update(changes)
    return CampaignRecord(**fields)  # type: ignore[arg-type]


def all_reports(store: ReportStore, campaign_id: str = "camp", round: int = 1) -> list[StoredReport]:
    return [r for batch in store.iter_reports(campaign_id, round) for r in batch]


#: Rounds the two processes of the multi-process test race to close.
PROCESS_CLOSE_ROUNDS = 20


def _race_close_in_process(location: str, worker: int, barrier: object, results: object) -> None:
    """Child process: open the store and race the other child to close each round (spawn target)."""
    store = open_store(location)
    try:
        for round_ in range(1, PROCESS_CLOSE_ROUNDS + 1):
            barrier.wait()  # type: ignore[attr-defined]
            won = store.close_round("camp", round_, float(worker))
            results.put((worker, round_, won))  # type: ignore[attr-defined]
    finally:
        store.close()


def _hold_step_lock_in_process(location: str, held: object) -> None:
    """Child process: take the step lock of ``camp``, report it, and keep it until killed (spawn target)."""
    store = open_store(location)
    with store.step_lock("camp") as got:
        held.put(got)  # type: ignore[attr-defined]
        time.sleep(120)  # killed long before; nothing to wait on (a killed waiter would break it)


class ReportStoreContract:
    """Contract tests; subclasses provide the ``store_location`` fixture (see the module docstring)."""

    @pytest.fixture
    def store_factory(self, store_location: str) -> StoreFactory:
        return lambda: open_store(store_location)

    @pytest.fixture
    def store(self, store_factory: StoreFactory) -> Iterator[ReportStore]:
        s = store_factory()
        try:
            yield s
        finally:
            s.close()

    @pytest.fixture
    def open_round(self, store: ReportStore) -> ReportStore:
        """The store with campaign ``camp`` and its open round 1."""
        store.create_campaign(campaign_record())
        store.open_round("camp", 1, b"spec-1", 10.0)
        return store

    # -- campaigns -----------------------------------------------------------------------------------
    def test_campaign_round_trips_every_field(self, store: ReportStore) -> None:
        record = campaign_record(result=b"\x01result", error="boom", engine_state=b"\x00\xff")
        store.create_campaign(record)
        assert store.get_campaign("camp") == record
        minimal = CampaignRecord(campaign_id="min", config=b"", state="collecting", current_round=0,
                                 created_at=0.0)
        store.create_campaign(minimal)
        assert store.get_campaign("min") == minimal

    def test_campaign_ids_are_unique(self, store: ReportStore) -> None:
        store.create_campaign(campaign_record())
        with pytest.raises(AlreadyExistsError, match="camp"):
            store.create_campaign(campaign_record(state="finished"))
        assert store.get_campaign("camp").state == "collecting"

    def test_unknown_campaign_is_not_found(self, store: ReportStore) -> None:
        with pytest.raises(NotFoundError, match="nope"):
            store.get_campaign("nope")
        with pytest.raises(NotFoundError):
            store.update_campaign("nope", state="failed")
        with pytest.raises(NotFoundError):
            store.update_campaign("nope")

    def test_list_campaigns_pages_in_id_order(self, store: ReportStore) -> None:
        ids = ["b", "a", "c-2", "c-10", "Z", "d"]
        for cid in ids:
            store.create_campaign(campaign_record(cid))
        expected = sorted(ids)
        pages: list[list[str]] = []
        after = ""
        while True:
            page = [r.campaign_id for r in store.list_campaigns(limit=4, after=after)]
            if not page:
                break
            pages.append(page)
            after = page[-1]
        assert pages == [expected[:4], expected[4:]]
        assert [r.campaign_id for r in store.list_campaigns(limit=100)] == expected
        assert store.list_campaigns(limit=0) == []
        assert [r.campaign_id for r in store.list_campaigns(limit=2, after="c-10")] == ["c-2", "d"]
        assert store.list_campaigns(limit=2, after="zzz") == []

    def test_update_campaign_changes_only_given_fields(self, store: ReportStore) -> None:
        store.create_campaign(campaign_record())
        store.update_campaign("camp", current_round=3, engine_state=b"state-3")
        got = store.get_campaign("camp")
        assert (got.current_round, got.engine_state, got.state, got.result, got.error) == (3, b"state-3", "collecting",
                                                                                             None, "")
        store.update_campaign("camp", state="finished", result=b"res", error="note")
        got = store.get_campaign("camp")
        assert (got.state, got.result, got.error, got.current_round) == ("finished", b"res", "note", 3)
        store.update_campaign("camp")  # nothing to change: a no-op on an existing campaign
        assert store.get_campaign("camp") == got

    # -- rounds --------------------------------------------------------------------------------------
    def test_rounds_open_get_and_list(self, store: ReportStore) -> None:
        store.create_campaign(campaign_record())
        store.open_round("camp", 2, b"spec-2", 20.5)
        store.open_round("camp", 1, b"spec-1", 10.5)
        assert store.get_round("camp", 2) == RoundRecord(campaign_id="camp", round=2, spec=b"spec-2", open=True,
                                                         opened_at=20.5, closed_at=None, report_count=0,
                                                         estimates=None)
        assert [r.round for r in store.list_rounds("camp")] == [1, 2]
        assert store.list_rounds("other") == []

    def test_round_errors(self, store: ReportStore) -> None:
        with pytest.raises(NotFoundError):
            store.open_round("nope", 1, b"", 0.0)
        store.create_campaign(campaign_record())
        store.open_round("camp", 1, b"", 0.0)
        with pytest.raises(AlreadyExistsError):
            store.open_round("camp", 1, b"again", 1.0)
        assert store.get_round("camp", 1).spec == b""
        for call in (lambda: store.get_round("camp", 9), lambda: store.close_round("camp", 9, 1.0),
                     lambda: store.set_round_estimates("camp", 9, b"e"), lambda: store.count_reports("camp", 9),
                     lambda: store.load_accumulators("camp", 9), lambda: store.replace_accumulators("camp", 9, {}),
                     lambda: list(store.iter_reports("camp", 9))):
            with pytest.raises(NotFoundError):
                call()

    def test_close_round_is_compare_and_set(self, open_round: ReportStore) -> None:
        store = open_round
        assert store.close_round("camp", 1, 30.0) is True
        assert store.close_round("camp", 1, 40.0) is False
        got = store.get_round("camp", 1)
        assert (got.open, got.closed_at) == (False, 30.0)
        store.set_round_estimates("camp", 1, b"estimates")
        assert store.get_round("camp", 1).estimates == b"estimates"

    def test_concurrent_close_round_has_exactly_one_winner(self, store: ReportStore) -> None:
        store.create_campaign(campaign_record())
        threads = 8

        def close(i: int, round_: int, barrier: threading.Barrier, results: list[bool]) -> None:
            barrier.wait()
            results.append(store.close_round("camp", round_, float(i)))

        for round_ in range(1, 11):
            store.open_round("camp", round_, b"", 0.0)
            barrier = threading.Barrier(threads)
            results: list[bool] = []
            workers = [threading.Thread(target=close, args=(i, round_, barrier, results)) for i in range(threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            assert sorted(results) == [False] * (threads - 1) + [True]
            assert store.get_round("camp", round_).open is False

    # -- reports -------------------------------------------------------------------------------------
    def test_duplicates_within_and_across_batches(self, open_round: ReportStore) -> None:
        store = open_round
        a, b, c = make_report(), make_report(), make_report()
        assert store.add_reports("r1", [a, b, a, a]) == [A, A, D, D]
        assert store.add_reports("r2", [c, b, make_report(report_id=a.report_id, group=5)]) == [A, D, D]
        assert [r.report_id for r in all_reports(store)] == [a.report_id, b.report_id, c.report_id]
        assert all_reports(store)[0] == a  # the first copy is the one stored
        assert store.count_reports("camp", 1) == 3
        assert store.get_round("camp", 1).report_count == 3

    def test_report_ids_are_unique_across_rounds_and_campaigns(self, open_round: ReportStore) -> None:
        store = open_round
        store.open_round("camp", 2, b"", 0.0)
        store.create_campaign(campaign_record("other"))
        store.open_round("other", 1, b"", 0.0)
        first = make_report()
        assert store.add_reports("r1", [first]) == [A]
        again = [make_report("camp", 2, report_id=first.report_id), make_report("other", 1, report_id=first.report_id)]
        assert store.add_reports("r2", again) == [D, D]
        assert store.count_reports("camp", 2) == 0 and store.count_reports("other", 1) == 0

    def test_replayed_request_returns_first_answer_and_stores_nothing(self, open_round: ReportStore) -> None:
        store = open_round
        a, b = make_report(), make_report()
        first = store.add_reports("req", [a, a, b], count_per_group)
        calls: list[int] = []

        def spy(reports: Sequence[StoredReport], blobs: Mapping[str, bytes]) -> Mapping[str, bytes]:
            calls.append(len(reports))
            return count_per_group(reports, blobs)

        assert store.add_reports("req", [a, a, b], spy) == first == [A, D, A]
        assert store.add_reports("req", [make_report(), make_report()], spy) == first  # even with other content
        assert calls == []
        assert store.count_reports("camp", 1) == 2
        assert decoded_counts(store.load_accumulators("camp", 1)) == {0: 2}
        assert store.add_reports("empty", []) == []
        assert store.add_reports("empty", [make_report()]) == []

    def test_reports_to_closed_or_unknown_rounds_are_refused(self, open_round: ReportStore) -> None:
        store = open_round
        stored = make_report()
        assert store.add_reports("r1", [stored]) == [A]
        assert store.close_round("camp", 1, 5.0)
        late = [make_report(), stored, make_report("camp", 7), make_report("ghost", 1)]
        assert store.add_reports("r2", late) == [R, D, R, R]
        assert store.count_reports("camp", 1) == 1
        assert store.add_reports("r2", []) == [R, D, R, R]  # the refusal is the recorded answer

    def test_batch_spanning_rounds(self, open_round: ReportStore) -> None:
        store = open_round
        store.open_round("camp", 2, b"", 0.0)
        reports = [make_report("camp", 1 + i % 2, group=i % 3) for i in range(10)]
        calls: list[tuple[int, int]] = []

        def spy(batch: Sequence[StoredReport], blobs: Mapping[str, bytes]) -> Mapping[str, bytes]:
            assert len({(r.campaign_id, r.round) for r in batch}) == 1
            calls.append((batch[0].round, len(batch)))
            return count_per_group(batch, blobs)

        assert store.add_reports("r", reports, spy) == [A] * 10
        assert sorted(calls) == [(1, 5), (2, 5)]
        assert all_reports(store, "camp", 1) == reports[0::2]
        assert all_reports(store, "camp", 2) == reports[1::2]
        assert decoded_counts(store.load_accumulators("camp", 2)) == {0: 2, 1: 2, 2: 1}

    def test_accumulate_sees_only_new_reports_and_its_blobs_persist(self, open_round: ReportStore) -> None:
        store = open_round
        seen: list[list[bytes]] = []
        given: list[dict[str, bytes]] = []

        def spy(reports: Sequence[StoredReport], blobs: Mapping[str, bytes]) -> Mapping[str, bytes]:
            seen.append([r.report_id for r in reports])
            given.append(dict(blobs))
            return count_per_group(reports, blobs)

        old = [make_report(group=g) for g in (0, 1, 1)]
        store.add_reports("r1", old, spy)
        new = [make_report(group=2), make_report(group=1)]
        store.add_reports("r2", [old[0], new[0], old[1], new[1], new[0]], spy)
        store.add_reports("r3", old, spy)  # nothing new: no call
        assert seen == [[r.report_id for r in old], [r.report_id for r in new]]
        assert given[0] == {} and decoded_counts(given[1]) == {0: 1, 1: 2}
        assert decoded_counts(store.load_accumulators("camp", 1)) == {0: 1, 1: 3, 2: 1}

    def test_accumulate_may_return_a_subset_of_keys(self, open_round: ReportStore) -> None:
        store = open_round
        store.replace_accumulators("camp", 1, {"keep": b"k", "n": b"0"})

        def bump(reports: Sequence[StoredReport], blobs: Mapping[str, bytes]) -> Mapping[str, bytes]:
            return {"n": str(int(blobs["n"]) + len(reports)).encode()}

        store.add_reports("r1", [make_report(), make_report()], bump)
        assert store.load_accumulators("camp", 1) == {"keep": b"k", "n": b"2"}

    def test_failing_accumulate_stores_nothing(self, open_round: ReportStore) -> None:
        store = open_round

        def boom(reports: Sequence[StoredReport], blobs: Mapping[str, bytes]) -> Mapping[str, bytes]:
            raise ValueError("accumulator broke")

        batch = [make_report(), make_report()]
        with pytest.raises(ValueError, match="accumulator broke"):
            store.add_reports("r1", batch, boom)
        assert store.count_reports("camp", 1) == 0 and all_reports(store) == []
        assert store.add_reports("r1", batch) == [A, A]  # neither the ids nor the request id were kept

    def test_replace_accumulators(self, open_round: ReportStore) -> None:
        store = open_round
        assert store.load_accumulators("camp", 1) == {}
        store.add_reports("r1", [make_report(group=3)], count_per_group)
        store.replace_accumulators("camp", 1, {"x": b"1", "y": b""})
        assert store.load_accumulators("camp", 1) == {"x": b"1", "y": b""}
        store.replace_accumulators("camp", 1, {})
        assert store.load_accumulators("camp", 1) == {}

    def test_iter_reports_keeps_insertion_order_in_batches(self, open_round: ReportStore) -> None:
        store = open_round
        assert list(store.iter_reports("camp", 1)) == []
        reports = [make_report(group=i % 4, payloads=bytes([i % 256]) * (i % 7)) for i in range(23)]
        store.add_reports("r1", reports[:10])
        store.add_reports("r2", reports[10:])
        for size in (1, 5, 10, 23, 24, 1000):
            batches = list(store.iter_reports("camp", 1, batch_size=size))
            assert [len(b) for b in batches[:-1]] == [size] * (len(batches) - 1)
            assert 0 < len(batches[-1]) <= size
            assert [r for b in batches for r in b] == reports
        assert store.count_reports("camp", 1) == 23

    def test_concurrent_ingestion_stores_each_report_once(self, open_round: ReportStore) -> None:
        store = open_round
        threads, batches, per_batch = 8, 50, 40
        shared = [os.urandom(16) for _ in range(200)]  # each also submitted by other threads
        plans = [[[make_report(group=(t + b + i) % 5,
                               report_id=shared[(t * 7 + b * 3 + i) % len(shared)] if i % 4 == 0 else None)
                   for i in range(per_batch)] for b in range(batches)] for t in range(threads)]
        outcomes: dict[tuple[int, int], list[Outcome]] = {}
        errors: list[BaseException] = []
        barrier = threading.Barrier(threads)

        def ingest(t: int) -> None:
            try:
                barrier.wait()
                for b, batch in enumerate(plans[t]):
                    outcomes[(t, b)] = store.add_reports(f"t{t}-b{b}", batch, count_per_group)
            except BaseException as exc:  # reported below
                errors.append(exc)

        workers = [threading.Thread(target=ingest, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert errors == []
        accepted = Counter(r.report_id for (t, b), got in outcomes.items()
                           for r, o in zip(plans[t][b], got) if o == A)
        submitted = {r.report_id for plan in plans for batch in plan for r in batch}
        assert set(accepted) == submitted and set(accepted.values()) == {1}
        stored = all_reports(store)
        assert Counter(r.report_id for r in stored) == accepted
        assert store.count_reports("camp", 1) == len(submitted)
        assert decoded_counts(store.load_accumulators("camp", 1)) == dict(Counter(r.group for r in stored))

    def test_no_report_lands_after_close_round_returns(self, open_round: ReportStore) -> None:
        store = open_round
        stop = threading.Event()
        results: list[tuple[list[StoredReport], list[Outcome]]] = []

        def ingest(t: int) -> None:
            for b in range(10_000):
                if stop.is_set():
                    return
                batch = [make_report() for _ in range(20)]
                results.append((batch, store.add_reports(f"t{t}-{b}", batch)))

        workers = [threading.Thread(target=ingest, args=(t,)) for t in range(4)]
        for w in workers:
            w.start()
        while store.count_reports("camp", 1) < 200:
            time.sleep(0.005)
        assert store.close_round("camp", 1, 1.0)
        at_close = store.count_reports("camp", 1)
        stop.set()
        for w in workers:
            w.join()
        assert store.count_reports("camp", 1) == at_close
        accepted = {r.report_id for batch, got in results for r, o in zip(batch, got) if o == A}
        assert {r.report_id for r in all_reports(store)} == accepted and len(accepted) == at_close
        assert all(o in (A, R) for _, got in results for o in got)

    # -- several store objects on one storage (as several processes have) ---------------------------
    def test_close_round_race_between_store_objects_has_one_winner(self, open_round: ReportStore,
                                                                   store_factory: StoreFactory) -> None:
        others = [store_factory() for _ in range(2)]
        try:
            stores = [open_round, *others]
            for round_ in range(2, 12):
                open_round.open_round("camp", round_, b"", 0.0)
                barrier = threading.Barrier(len(stores) * 2)
                results: list[bool] = []

                def close(s: ReportStore, r: int, b: threading.Barrier, out: list[bool]) -> None:
                    b.wait()
                    out.append(s.close_round("camp", r, 1.0))

                workers = [threading.Thread(target=close, args=(s, round_, barrier, results))
                           for s in stores for _ in (0, 1)]
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
                assert sorted(results) == [False] * (len(workers) - 1) + [True]
                assert all(s.get_round("camp", round_).open is False for s in stores)
        finally:
            for other in others:
                other.close()

    def test_ingestion_racing_close_from_another_store_object(self, open_round: ReportStore,
                                                              store_factory: StoreFactory) -> None:
        store = open_round
        closer = store_factory()
        try:
            for round_ in (2, 3, 4):
                store.open_round("camp", round_, b"", 0.0)
                stop = threading.Event()
                results: list[tuple[list[StoredReport], list[Outcome]]] = []
                errors: list[BaseException] = []

                def ingest(t: int, r: int, done: threading.Event,
                           out: list[tuple[list[StoredReport], list[Outcome]]], failed: list[BaseException]) -> None:
                    try:
                        for b in range(10_000):
                            if done.is_set():
                                return
                            batch = [make_report("camp", r, group=i % 3) for i in range(25)]
                            out.append((batch, store.add_reports(f"r{r}-t{t}-{b}", batch, count_per_group)))
                    except BaseException as exc:  # reported below
                        failed.append(exc)

                workers = [threading.Thread(target=ingest, args=(t, round_, stop, results, errors)) for t in range(4)]
                for w in workers:
                    w.start()
                while closer.count_reports("camp", round_) < 100 * round_:
                    time.sleep(0.002)
                assert closer.close_round("camp", round_, 1.0)
                at_close = closer.count_reports("camp", round_)
                time.sleep(0.05)  # ingestion goes on against the closed round
                stop.set()
                for w in workers:
                    w.join()
                assert errors == []
                accepted = [r.report_id for batch, got in results for r, o in zip(batch, got) if o == A]
                stored = all_reports(store, "camp", round_)
                assert store.count_reports("camp", round_) == at_close == len(stored) == len(accepted)
                assert Counter(r.report_id for r in stored) == Counter(accepted)
                assert all(o in (A, R) for _, got in results for o in got)
                assert any(o == R for _, got in results for o in got), "no batch came after the close"
                assert decoded_counts(closer.load_accumulators("camp", round_)) == dict(
                    Counter(r.group for r in stored))
        finally:
            closer.close()

    def test_step_lock_is_exclusive_across_store_objects(self, store: ReportStore,
                                                         store_factory: StoreFactory) -> None:
        other = store_factory()
        try:
            with store.step_lock("camp") as got:
                assert got is True
                with other.step_lock("camp") as second:
                    assert second is False
                with store.step_lock("camp") as again:  # not re-entrant, also through the holder
                    assert again is False
                with other.step_lock("another campaign") as unrelated:
                    assert unrelated is True
            with other.step_lock("camp") as after_release:
                assert after_release is True
                with store.step_lock("camp") as blocked:
                    assert blocked is False
            results: list[bool] = []
            barrier = threading.Barrier(8)
            inside = threading.Lock()

            def contend(s: ReportStore) -> None:
                barrier.wait()
                with s.step_lock("camp") as got:
                    if got:
                        assert inside.acquire(blocking=False), "two holders at once"
                        time.sleep(0.05)
                        inside.release()
                    results.append(got)

            workers = [threading.Thread(target=contend, args=(s,)) for s in (store, other) * 4]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            assert len(results) == 8 and 1 <= results.count(True) < 8
        finally:
            other.close()

    def test_collector_resumes_a_step_at_once_unless_another_store_object_runs_it(
            self, store: ReportStore, store_factory: StoreFactory) -> None:
        from ldp.v1 import campaigns_pb2
        from ldp_collector.core import Collector

        now = [1_700_000_000.0]
        collector = Collector(store, clock=lambda: now[0])
        config = campaigns_pb2.CampaignConfig(
            kind=campaigns_pb2.HISTOGRAM, domain=campaigns_pb2.Domain(categorical_size=4), epsilon=1.0,
            histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.GRR))
        cid = collector.create_campaign(config_from_proto(config)).config.campaign_id
        first = store.get_campaign(cid).current_round
        assert store.close_round(cid, first, now[0])  # a process closed the round and is still advancing
        running_elsewhere = store_factory()
        try:
            with running_elsewhere.step_lock(cid) as held:
                assert held
                assert collector.tick() == 0
                assert store.get_campaign(cid).state == "collecting"  # not resumed meanwhile
            # That process died or finished without advancing: its lock is gone, so the very next
            # tick resumes the step -- no grace period, the clock has not moved.
            collector.tick()
            assert store.get_campaign(cid).state in ("finished", "failed")  # the one-round campaign's step ran
        finally:
            running_elsewhere.close()

    @pytest.mark.integration
    def test_close_round_race_between_processes(self, store_location: str, open_round: ReportStore) -> None:
        store = open_round
        for round_ in range(2, PROCESS_CLOSE_ROUNDS + 1):
            store.open_round("camp", round_, b"", 0.0)
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(2)
        results = context.Queue()
        children = [context.Process(target=_race_close_in_process, args=(store_location, w, barrier, results))
                    for w in range(2)]
        for child in children:
            child.start()
        got = [results.get(timeout=120) for _ in range(2 * PROCESS_CLOSE_ROUNDS)]
        for child in children:
            child.join(60)
            assert child.exitcode == 0
        for round_ in range(1, PROCESS_CLOSE_ROUNDS + 1):
            winners = [worker for worker, r, won in got if r == round_ and won]
            assert len(winners) == 1, (round_, got)
            assert store.get_round("camp", round_).closed_at == float(winners[0])

    @pytest.mark.integration
    def test_step_lock_held_by_another_process_and_released_when_it_dies(self, store_location: str,
                                                                         store: ReportStore) -> None:
        context = multiprocessing.get_context("spawn")
        held = context.Queue()
        child = context.Process(target=_hold_step_lock_in_process, args=(store_location, held))
        child.start()
        try:
            assert held.get(timeout=120) is True
            with store.step_lock("camp") as got:
                assert got is False
            child.kill()  # dies holding the lock: the storage must release it
            child.join(30)
            deadline = time.monotonic() + 30
            while True:
                with store.step_lock("camp") as got:
                    if got:
                        break
                assert time.monotonic() < deadline, "the lock of a dead process was never released"
                time.sleep(0.05)
        finally:
            if child.is_alive():
                child.kill()
            child.join(30)

    # -- lifecycle -----------------------------------------------------------------------------------
    def test_reopen_keeps_everything(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.create_campaign(campaign_record(engine_state=b"es"))
        store.open_round("camp", 1, b"spec", 1.0)
        store.open_round("camp", 2, b"spec2", 2.0)
        reports = [make_report(group=i % 3) for i in range(50)]
        answer = store.add_reports("req", reports + reports[:5], count_per_group)
        store.close_round("camp", 1, 3.0)
        store.set_round_estimates("camp", 1, b"est")
        store.replace_accumulators("camp", 2, {"k": b"v"})
        store.update_campaign("camp", current_round=2)
        before = (store.get_campaign("camp"), store.list_rounds("camp"), store.load_accumulators("camp", 1))
        store.close()

        reopened = store_factory()
        try:
            assert (reopened.get_campaign("camp"), reopened.list_rounds("camp"),
                    reopened.load_accumulators("camp", 1)) == before
            assert all_reports(reopened) == reports
            assert reopened.count_reports("camp", 1) == 50
            assert reopened.load_accumulators("camp", 2) == {"k": b"v"}
            assert reopened.add_reports("req", []) == answer  # replay survives the restart
            assert reopened.add_reports("new", [make_report("camp", 2, report_id=reports[0].report_id)]) == [D]
        finally:
            reopened.close()

    def test_closed_store_refuses_every_call(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.create_campaign(campaign_record())
        store.open_round("camp", 1, b"", 0.0)
        store.close()
        store.close()  # idempotent
        calls: list[Callable[[], object]] = [
            lambda: store.create_campaign(campaign_record("x")), lambda: store.get_campaign("camp"),
            lambda: store.list_campaigns(10), lambda: store.update_campaign("camp", state="s"),
            lambda: store.open_round("camp", 2, b"", 0.0), lambda: store.get_round("camp", 1),
            lambda: store.list_rounds("camp"), lambda: store.close_round("camp", 1, 0.0),
            lambda: store.set_round_estimates("camp", 1, b""), lambda: store.add_reports("r", [make_report()]),
            lambda: list(store.iter_reports("camp", 1)), lambda: store.count_reports("camp", 1),
            lambda: store.load_accumulators("camp", 1), lambda: store.replace_accumulators("camp", 1, {}),
            lambda: store.step_lock("camp").__enter__(),
        ]
        for call in calls:
            with pytest.raises(StoreClosedError, match="closed"):
                call()
