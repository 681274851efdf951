"""A closed round held in memory: the engine tests' :class:`~ldp_collector.kinds.base.RoundReports`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ldp_collector.kinds.base import RoundReports
from ldp_collector.storage.base import StoredReport

__all__ = ["ListRoundReports"]


class ListRoundReports(RoundReports):
    """A closed round's rows, with the accumulators an ingesting store would have kept (none by default)."""

    def __init__(self, rows: Sequence[StoredReport], accumulators: dict[str, bytes] | None = None) -> None:
        self.rows = list(rows)
        self.blobs = accumulators or {}

    @property
    def count(self) -> int:
        return len(self.rows)

    def batches(self, batch_size: int = 65536) -> Iterator[list[StoredReport]]:
        for i in range(0, len(self.rows), batch_size):
            yield self.rows[i:i + batch_size]

    def accumulators(self) -> dict[str, bytes]:
        return dict(self.blobs)
