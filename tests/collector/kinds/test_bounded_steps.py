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

import numpy as np
import pytest

from ldp.v1 import campaigns_pb2
from ldp_collector.core import Collector
from ldp_collector.estimation.report_accumulator import ReportAccumulator
from ldp_collector.kinds import KINDS, RoundReports
from ldp_collector.kinds.base import NUMERIC
from ldp_collector.serde import config_from_proto, kind_number
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.runner import InProcessCollector, run_campaign
from ldp_collector.storage import ReportStore, open_store
from ldp_collector.storage.base import StoredReport

_N = 3000
_K = 3
_CATEGORIES = 64
#: Kinds whose step still reads its whole round (docs/beam.md); each leaves this set when it stops.
WHOLE_ROUND: frozenset[str] = frozenset({"laplace", "ldp_kmeans", "stemmer"})


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


def _config(name: str, x: np.ndarray) -> campaigns_pb2.CampaignConfig:
    config = campaigns_pb2.CampaignConfig(kind=kind_number(name), epsilon=4.0, campaign_id=f"bounded-{name}")
    if NUMERIC in KINDS[name].domains:
        config.domain.numeric.lower.extend(x.min(axis=0).tolist())
        config.domain.numeric.upper.extend(x.max(axis=0).tolist())
    else:
        config.domain.categorical_size = _CATEGORIES
    params = getattr(config, name)
    params.SetInParent()
    if "k" in params.DESCRIPTOR.fields_by_name:
        params.k = _K
    return config


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.xfail(
    name in WHOLE_ROUND, reason="still reads its whole round", strict=True)) for name in KINDS])
def test_step_reads_reports_only_through_accumulators(name: str, tmp_path: Path) -> None:
    x, labels = make_dataset("blobs", _N, d=2, k=_K, seed=7)
    points: object = x if NUMERIC in KINDS[name].domains else [(int(v),) for v in np.asarray(labels) * 7 % _CATEGORIES]
    backend = _Backend(Collector(open_store(tmp_path / "ldp-data")))
    run = run_campaign(backend, config_from_proto(_config(name, x)), points, seed=3, mode="direct", quiet=True)
    assert run.result.state == campaigns_pb2.FINISHED
