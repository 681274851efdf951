"""The group-commit writer both stores share, against an in-memory dialect.

The store suites (``test_sqlite_store.py``, ``test_postgres_store.py``) test it through real
databases; here it is tested once, on its own: what goes into one transaction, the outcomes and
answers it computes, retries and failures as the dialect classifies them, back-pressure and
closing.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from ldp_collector.errors import OverloadedError
from ldp_collector.storage import AccumulateFn, StoreClosedError, StoredReport
from ldp_collector.storage.group_commit import Dialect, GroupCommitWriter, RoundState, take
from support.store_doubles import Columns, Gate, wait_until

from .store_contract import A, D, R, count_per_group, decoded_counts, make_report


@dataclass
class _Chunk:
    campaign_id: str
    round: int
    positions: Sequence[int]
    reports: Sequence[StoredReport]

    def subset(self, keep: Sequence[int]) -> _Chunk:
        return _Chunk(self.campaign_id, self.round, [self.positions[k] for k in keep], take(self.reports, keep))


@dataclass
class _State:
    """What the fake database holds; a transaction works on a copy and commits by replacing it."""

    rounds: dict[tuple[str, int], RoundState] = field(default_factory=lambda: {("camp", 1): RoundState(True, 0)})
    reports: list[tuple[str, int, int, bytes]] = field(default_factory=list)  # campaign, round, seq, id
    answers: dict[str, bytes] = field(default_factory=dict)
    accumulators: dict[tuple[str, int], dict[str, bytes]] = field(default_factory=dict)

    def ids(self) -> set[bytes]:
        return {rid for *_, rid in self.reports}


class Transient(Exception):
    """A failure the dialect retries."""


class Unreachable(Exception):
    """A failure that means the database is gone."""


class MemoryDialect(Dialect[_State, _Chunk]):
    max_group_reports = 1000
    retryable = (Transient,)
    unavailable = (Unreachable,)

    def __init__(self) -> None:
        self.state = _State()
        self.attempts = 0
        self.commits = 0
        #: The error a commit of this work raises instead of committing, if any.
        self.fail: Callable[[_State], BaseException | None] = lambda work: None
        self.answered_elsewhere: list[tuple[str, bytes]] = []  # recorded by "another process" at the next commit
        self.closed = False

    def encode(self, campaign_id: str, round: int, positions: Sequence[int],
               reports: Sequence[StoredReport]) -> _Chunk:
        return _Chunk(campaign_id, round, positions, reports)

    def fail_next(self, *errors: BaseException) -> None:
        """The next commits raise ``errors``, one each."""
        pending = list(errors)
        self.fail = lambda work: pending.pop(0) if pending else None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_State]:
        self.attempts += 1
        work = copy.deepcopy(self.state)
        yield work
        error = self.fail(work)
        if error is not None:
            raise error
        self.state = work
        self.commits += 1

    def storage_error(self, exc: BaseException) -> BaseException:
        return OverloadedError(f"unreachable: {exc}") if isinstance(exc, Unreachable) else exc

    def recorded_answers(self, conn: _State, request_ids: Sequence[str]) -> dict[str, bytes]:
        return {rid: conn.answers[rid] for rid in request_ids if rid in conn.answers}

    def read_rounds(self, conn: _State, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], RoundState]:
        assert list(keys) == sorted(keys)
        return {k: conn.rounds[k] for k in keys if k in conn.rounds}

    def existing(self, conn: _State, chunk: _Chunk) -> set[int]:
        stored = conn.ids()
        return {k for k, r in enumerate(chunk.reports) if r.report_id in stored}

    def insert_new(self, conn: _State, chunk: _Chunk, first_seq: int) -> _Chunk | None:
        existing = self.existing(conn, chunk)
        new = chunk if not existing else chunk.subset([k for k in range(len(chunk.positions)) if k not in existing])
        conn.reports += [(r.campaign_id, r.round, first_seq + k, r.report_id) for k, r in enumerate(new.reports)]
        return new if new.positions else None

    def load_accumulators(self, conn: _State, campaign_id: str, round: int) -> dict[str, bytes]:
        return dict(conn.accumulators.get((campaign_id, round), {}))

    def save_accumulators(self, conn: _State, campaign_id: str, round: int, blobs: Mapping[str, bytes]) -> None:
        assert blobs
        conn.accumulators.setdefault((campaign_id, round), {}).update(blobs)

    def set_report_count(self, conn: _State, campaign_id: str, round: int, count: int) -> None:
        conn.rounds[(campaign_id, round)].next_seq = count

    def record_answers(self, conn: _State, answers: Sequence[tuple[str, bytes]], now: float) -> bool:
        for rid, answer in self.answered_elsewhere:
            self.state.answers[rid] = answer
        self.answered_elsewhere = []
        if any(rid in self.state.answers for rid, _ in answers):
            return False
        conn.answers.update(answers)
        return True

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def dialect() -> MemoryDialect:
    return MemoryDialect()


@pytest.fixture
def writer(dialect: MemoryDialect) -> Iterator[GroupCommitWriter[_State, _Chunk]]:
    w = GroupCommitWriter(dialect, name="memory", max_pending_reports=100)
    try:
        yield w
    finally:
        w.close()


def _recorded(dialect: MemoryDialect) -> Callable[[str], bytes | None]:
    return lambda request_id: dialect.state.answers.get(request_id)


def _add(writer: GroupCommitWriter[_State, _Chunk], dialect: MemoryDialect, request_id: str,
         reports: Sequence[StoredReport], accumulate: AccumulateFn | None = None) -> list[object]:
    return list(writer.add(request_id, reports, accumulate, _recorded(dialect)))


def _queued(writer: GroupCommitWriter[_State, _Chunk], n: int) -> Callable[[], bool]:
    return lambda: writer.waiting() == n


def _in_background(writer: GroupCommitWriter[_State, _Chunk], dialect: MemoryDialect,
                   calls: Sequence[tuple[str, Sequence[StoredReport], AccumulateFn | None]]) -> list[object]:
    """Block the writer inside a first transaction, queue ``calls`` in order, release it; each
    call's answer or error, in order."""
    gate = Gate(count_per_group)
    results: list[object] = [None] * len(calls)

    def call(k: int, request_id: str, reports: Sequence[StoredReport], fn: AccumulateFn | None) -> None:
        try:
            results[k] = _add(writer, dialect, request_id, reports, fn)
        except Exception as exc:  # the answer under test
            results[k] = exc

    blocker = threading.Thread(target=_add, args=(writer, dialect, "blocker", [make_report()], gate))
    blocker.start()
    assert gate.entered.wait(10)
    threads = [threading.Thread(target=call, args=(k, *args)) for k, args in enumerate(calls)]
    for k, t in enumerate(threads, start=1):
        t.start()
        wait_until(_queued(writer, k))  # queued in this order
    gate.release.set()
    for t in [blocker, *threads]:
        t.join()
    return results


def test_waiting_requests_share_one_transaction_and_answer_after_it(writer: GroupCommitWriter[_State, _Chunk],
                                                                   dialect: MemoryDialect) -> None:
    batches = [[make_report(group=i) for _ in range(3)] for i in range(4)]
    results = _in_background(writer, dialect, [(f"w{i}", batches[i], count_per_group) for i in range(4)])
    assert dialect.commits == 2  # the blocker's, then the four waiting requests' together
    assert results == [[A] * 3] * 4
    assert decoded_counts(dialect.state.accumulators[("camp", 1)]) == {0: 4, 1: 3, 2: 3, 3: 3}
    assert dialect.state.rounds[("camp", 1)].next_seq == 13
    assert sorted(seq for _, _, seq, _ in dialect.state.reports) == list(range(13))


def test_outcomes_duplicates_rejections_and_replays(writer: GroupCommitWriter[_State, _Chunk],
                                                    dialect: MemoryDialect) -> None:
    dialect.state.rounds[("camp", 2)] = RoundState(False, 0)  # closed
    old, new = make_report(), make_report()
    assert _add(writer, dialect, "first", [old]) == [A]
    batch = [new, old, new, make_report(round=2), make_report(round=9), make_report(campaign_id="other")]
    assert _add(writer, dialect, "second", batch) == [A, D, D, R, R, R]
    assert _add(writer, dialect, "late", Columns.of([make_report(round=2), old])) == [R, D]
    assert _add(writer, dialect, "second", []) == [A, D, D, R, R, R]  # a replay: the recorded answer
    assert len(dialect.state.reports) == 2


def test_a_repeated_request_id_waits_for_the_first_to_commit(writer: GroupCommitWriter[_State, _Chunk],
                                                             dialect: MemoryDialect) -> None:
    first, second = [make_report()], [make_report()]
    results = _in_background(writer, dialect, [("same", first, None), ("other", [make_report()], None),
                                               ("same", second, None)])
    assert results == [[A], [A], [A]]
    assert dialect.commits == 3  # the blocker; "same" and "other"; the repeat, which replayed the answer
    assert second[0].report_id not in dialect.state.ids() and len(dialect.state.reports) == 3


def test_transient_failures_retry_the_group(writer: GroupCommitWriter[_State, _Chunk], dialect: MemoryDialect) -> None:
    dialect.fail_next(Transient("deadlock"), Transient("deadlock"))
    assert _add(writer, dialect, "r", [make_report()], count_per_group) == [A]
    assert dialect.attempts == 3
    assert decoded_counts(dialect.state.accumulators[("camp", 1)]) == {0: 1}  # counted once, after rollbacks
    dialect.answered_elsewhere = [("raced", b"\x91\x02")]  # another process answers it meanwhile
    assert _add(writer, dialect, "raced", [make_report()]) == [D]  # started over, and replayed that answer
    assert len(dialect.state.reports) == 1


def test_a_failing_request_fails_alone(writer: GroupCommitWriter[_State, _Chunk], dialect: MemoryDialect) -> None:
    def boom(reports: Sequence[StoredReport], blobs: Mapping[str, bytes]) -> Mapping[str, bytes]:
        raise ValueError("bad accumulator")

    results = _in_background(writer, dialect, [("ok1", [make_report()], count_per_group),
                                               ("bad", [make_report()], boom), ("ok2", [make_report()], None)])
    assert results[0] == results[2] == [A]
    assert isinstance(results[1], ValueError)
    assert len(dialect.state.reports) == 3 and "bad" not in dialect.state.answers
    assert dialect.attempts == 1 + 1 + 3  # the blocker; the group; each of its requests alone


def test_an_unreachable_database_fails_the_whole_group(writer: GroupCommitWriter[_State, _Chunk],
                                                       dialect: MemoryDialect) -> None:
    dialect.fail = lambda work: Unreachable("gone") if work.answers.keys() & {"a", "b"} else None
    results = _in_background(writer, dialect, [("a", [make_report()], None), ("b", [make_report()], None)])
    assert all(isinstance(r, OverloadedError) and "unreachable: gone" in str(r) for r in results)
    assert dialect.attempts == 2  # no retry, and not each request alone: their callers retry


def test_operations_run_alone_and_map_their_errors(writer: GroupCommitWriter[_State, _Chunk],
                                                   dialect: MemoryDialect) -> None:
    def open_round(state: _State) -> int:
        state.rounds[("camp", 2)] = RoundState(True, 0)
        return len(state.rounds)

    assert writer.write(open_round) == 2 and ("camp", 2) in dialect.state.rounds
    dialect.fail_next(Unreachable("down"))
    with pytest.raises(OverloadedError, match="unreachable: down"):
        writer.write(open_round)


def test_backpressure_and_closing(dialect: MemoryDialect) -> None:
    writer = GroupCommitWriter(dialect, name="memory", max_pending_reports=10)
    gate = Gate(count_per_group)
    blocker = threading.Thread(target=lambda: _add(writer, dialect, "first", [make_report() for _ in range(8)], gate))
    blocker.start()
    assert gate.entered.wait(10)
    with pytest.raises(OverloadedError, match="8 reports waiting to be written; retry later"):
        _add(writer, dialect, "second", [make_report() for _ in range(5)])
    results: list[object] = []
    queued = threading.Thread(target=lambda: results.append(_add(writer, dialect, "queued", [make_report()])))
    queued.start()
    wait_until(lambda: writer.waiting() == 1)
    closer = threading.Thread(target=writer.close)
    closer.start()
    wait_until(lambda: writer.closed)
    with pytest.raises(StoreClosedError, match="the report store 'memory' is closed"):
        _add(writer, dialect, "after", [make_report()])
    gate.release.set()
    for t in (blocker, queued, closer):
        t.join()
    assert results == [[A]] and len(dialect.state.reports) == 9  # what was queued before close was written
    assert dialect.closed
