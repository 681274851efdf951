"""Test doubles for the report stores' tests (both backends and the group-commit writer)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ldp_collector.storage import AccumulateFn, StoredReport

S = TypeVar("S")


def open_concurrently(open_one: Callable[[], S], n: int = 4) -> list[S]:
    """Open ``n`` stores at once from ``n`` threads released by one barrier (they race to create the
    schema); every open must succeed. The caller closes them."""
    stores: list[S] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def opener() -> None:
        try:
            barrier.wait()
            stores.append(open_one())
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=opener) for _ in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == [] and len(stores) == n, errors
    return stores


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


class Gate:
    """An accumulate callback that blocks the writer thread on its first call until opened.

    Parameters
    ----------
    accumulate : AccumulateFn
        What each call returns, computed from its arguments.
    """

    def __init__(self, accumulate: AccumulateFn) -> None:
        self.accumulate = accumulate
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls: list[int] = []

    def __call__(self, reports: Sequence[StoredReport], blobs: Mapping[str, bytes]) -> Mapping[str, bytes]:
        self.calls.append(len(reports))
        if len(self.calls) == 1:
            self.entered.set()
            assert self.release.wait(10)
        return self.accumulate(reports, blobs)


@dataclass(frozen=True)
class Columns(Sequence[StoredReport]):
    """A minimal :class:`~ldp_collector.storage.group_commit.ColumnarReports`."""

    report_ids: list[bytes]
    campaign_ids: list[str]
    rounds: list[int]
    groups: list[int]
    payloads: list[bytes]

    @classmethod
    def of(cls, reports: Sequence[StoredReport]) -> Columns:
        return cls([r.report_id for r in reports], [r.campaign_id for r in reports], [r.round for r in reports],
                   [r.group for r in reports], [r.payloads for r in reports])

    def __len__(self) -> int:
        return len(self.report_ids)

    def __getitem__(self, i: int) -> StoredReport:  # type: ignore[override]
        return StoredReport(report_id=self.report_ids[i], campaign_id=self.campaign_ids[i], round=self.rounds[i],
                            group=self.groups[i], payloads=self.payloads[i])

    def take(self, indexes: Sequence[int]) -> Columns:
        return Columns.of([self[i] for i in indexes])
