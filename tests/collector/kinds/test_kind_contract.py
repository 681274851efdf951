"""The contract every registered campaign kind keeps, run over the registry (STYLE.md §9, §17).

A kind registered in :data:`ldp_collector.kinds.KINDS` inherits these tests: its name agrees with
the wire (the ``ldp.v1.CampaignKind`` value name and the ``CampaignConfig.parameters`` oneof field),
and its campaign goes through the whole life cycle with simulated SDK devices on an in-process
collector: create, every round, the result, the points labelled by a clustering result, and, for
the multi-round kinds, a restart (a new ``Collector`` on the same SQLite store) between two rounds
after which the campaign still finishes.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ldp.v1 import campaigns_pb2
from ldp_collector.core import Collector
from ldp_collector.kinds import KINDS, kind_for
from ldp_collector.kinds.base import CATEGORICAL, NUMERIC
from ldp_collector.serde import config_from_proto, config_to_proto, kind_name, kind_number
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.evaluation import evaluate_clustering
from ldp_collector.simulation.runner import InProcessCollector, run_campaign
from ldp_collector.storage import open_store
from support.kind_configs import K, small_campaign, small_population

_N = 6000


def test_registry_agrees_with_the_wire() -> None:
    """Registry names == lower-case CampaignKind value names == CampaignConfig.parameters oneof fields."""
    enum_names = {name.lower() for name in campaigns_pb2.CampaignKind.keys()} - {"campaign_kind_unspecified"}
    oneof = {f.name for f in campaigns_pb2.CampaignConfig.DESCRIPTOR.oneofs_by_name["parameters"].fields}
    assert set(KINDS) == enum_names == oneof
    for name, kind in KINDS.items():
        assert kind.name == name
        assert kind_for(name) is kind
        assert campaigns_pb2.CampaignKind.Name(kind_number(name)).lower() == kind_name(kind_number(name)) == name


class _RestartingCollector(InProcessCollector):
    """An in-process backend that replaces its ``Collector`` by a new one on the same store after round 1."""

    def __init__(self, location: Path) -> None:
        self.location = location
        self.restarts = 0
        super().__init__(Collector(open_store(location)))

    def close_round(self, campaign_id: str, round: int) -> campaigns_pb2.Campaign:
        campaign = super().close_round(campaign_id, round)
        if self.restarts == 0 and campaign.state == campaigns_pb2.COLLECTING:
            old = self.collector.store
            self.collector = Collector(open_store(self.location))
            old.close()
            self.restarts += 1
        return campaign


@pytest.mark.parametrize("name", list(KINDS))
def test_life_cycle(name: str, tmp_path: Path) -> None:
    kind = KINDS[name]
    assert NUMERIC in kind.domains or CATEGORICAL in kind.domains
    x, labels = make_dataset("blobs", _N, d=2, k=K, seed=7)
    backend = _RestartingCollector(tmp_path / "ldp-data")
    run = run_campaign(backend, config_from_proto(small_campaign(name, x, campaign_id=f"contract-{name}")),
                       small_population(name, x, labels), seed=3, mode="direct", quiet=True)

    assert run.result.state == campaigns_pb2.FINISHED
    stored = backend.collector.get_campaign(run.campaign_id)
    assert stored.state == campaigns_pb2.FINISHED
    assert config_to_proto(stored.config).WhichOneof("parameters") == kind.name
    if run.stats.rounds > 1:
        assert backend.restarts == 1, "a multi-round campaign restarts between its first two rounds"
    if kind.clustering:
        assert run.result.clustering is not None
        scores = evaluate_clustering(run.result, x, labels, k=K, seed=0)
        assert scores["clusters"] >= 1
        assert all(math.isfinite(v) or math.isnan(v) for v in scores.values())
    else:
        assert len(run.result.estimates.estimates) > 0
