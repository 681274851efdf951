"""An in-process collector backend that keeps every round spec it hands out (feedback tests)."""

from __future__ import annotations

from ldp_client.spec import RoundSpec
from ldp_collector.core import Collector
from ldp_collector.simulation.runner import InProcessCollector


class RecordingCollector(InProcessCollector):
    """Keeps every round spec the collector hands out."""

    def __init__(self, collector: Collector, *, seed: int) -> None:
        super().__init__(collector, seed=seed)
        self.specs: dict[int, RoundSpec] = {}

    def get_round_spec(self, campaign_id: str) -> tuple[RoundSpec | None, bool]:
        spec, finished = super().get_round_spec(campaign_id)
        if spec is not None:
            self.specs[spec.round] = spec
        return spec, finished
