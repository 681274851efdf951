"""No kind's server step holds a round: every read of the raw reports goes through a report accumulator.

A step that reads the raw reports does it with :meth:`RoundReports.combine` (a count, support-count,
sum or sample accumulator, or one :class:`~ldp_collector.estimation.report_accumulator.DecodedPass`
per iteration), which the Beam path runs where the reports are, so the step's memory is bounded by
its accumulators on any engine (docs/beam.md). Here every kind plays a campaign whose steps read
their rounds through a reader that refuses :meth:`RoundReports.batches` outside ``combine``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ldp.v1 import campaigns_pb2
from ldp_collector.core import Collector
from ldp_collector.estimation.report_accumulator import ReportAccumulator
from ldp_collector.kinds import KINDS, RoundReports
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.runner import InProcessCollector, run_campaign
from ldp_collector.storage import ReportStore, open_store
from ldp_collector.storage.base import StoredReport
from support.kind_configs import K, small_campaign, small_population

_N = 3000


class _CombineOnly(RoundReports):
    """A closed round of the store that hands its reports to accumulators only."""

    def __init__(self, store: ReportStore, campaign_id: str, round: int) -> None:
        self._store, self._campaign_id, self._round = store, campaign_id, round
        self._combining = False

    @property
    def count(self) -> int:
        return self._store.count_reports(self._campaign_id, self._round)

    def batches(self, batch_size: int = 65536) -> Iterator[list[StoredReport]]:
        if not self._combining:
            raise AssertionError("the step read the whole round outside a report accumulator")
        return self._store.iter_reports(self._campaign_id, self._round, batch_size)

    def accumulators(self) -> dict[str, bytes]:
        return self._store.load_accumulators(self._campaign_id, self._round)

    def combine(self, accumulator: ReportAccumulator) -> ReportAccumulator:  # type: ignore[override]
        self._combining = True
        try:
            return super().combine(accumulator)
        finally:
            self._combining = False


class _Backend(InProcessCollector):
    def close_round(self, campaign_id: str, round: int) -> campaigns_pb2.Campaign:
        store = self.collector.store
        return self.collector.close_round(campaign_id, round,
                                          reports=lambda cid, r: _CombineOnly(store, cid, r))


@pytest.mark.parametrize("name", list(KINDS))
def test_step_reads_reports_only_through_accumulators(name: str, tmp_path: Path) -> None:
    x, labels = make_dataset("blobs", _N, d=2, k=K, seed=7)
    backend = _Backend(Collector(open_store(tmp_path / "ldp-data")))
    run = run_campaign(backend, config_from_proto(small_campaign(name, x, campaign_id=f"bounded-{name}")),
                       small_population(name, x, labels), seed=3, mode="direct", quiet=True)
    assert run.result.state == campaigns_pb2.FINISHED
