"""``CampaignConfig.oracles``: the frequency oracles a campaign allows (docs/protocol.md §10).

Validated at creation (known values, each once; a kind the allowed oracles cannot serve is refused
then, not in a later round), kept by every kind's round planning -- the iterative grid, which on
its own switches to local hashing once its cell lists grow, included -- and checked once more by
the collector before any round is published.
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import numpy as np
import pytest

from ldp.v1 import campaigns_pb2
from ldp_client.mechanisms.oracle_choice import oracle_name
from ldp_client.spec import RoundSpec
from ldp_collector.campaigns import prepare_campaign
from ldp_collector.cli import build_parser
from ldp_collector.cli_args import build_campaign_config, oracle_list
from ldp_collector.core import Collector
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.kinds.common import check_allowed_oracles
from ldp_collector.kinds.histogram import FrequencyOracle
from ldp_collector.serde import config_from_proto, config_to_proto
from ldp_collector.server.status import field_path
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.runner import run_campaign
from ldp_collector.storage import open_store
from support.recording import RecordingCollector

GRR, SUE, OUE, OLH = campaigns_pb2.GRR, campaigns_pb2.SUE, campaigns_pb2.OUE, campaigns_pb2.OLH
ITERATIVE = campaigns_pb2.GridParameters.ITERATIVE


def config(kind: str, oracles: tuple[int, ...] = (), epsilon: float = 4.0, **params: Any) -> campaigns_pb2.CampaignConfig:
    message = campaigns_pb2.CampaignConfig(kind=getattr(campaigns_pb2, kind.upper()), epsilon=epsilon,
                                           oracles=list(oracles))
    if kind in ("histogram", "heavy_hitters"):
        message.domain.categorical_size = 1 << 12 if kind == "histogram" else 1 << 16
    else:
        message.domain.numeric.lower.extend([0.0, 0.0])
        message.domain.numeric.upper.extend([1.0, 1.0])
    getattr(message, kind).SetInParent()
    for key, value in params.items():
        setattr(getattr(message, kind), key, value)
    return message


def oracles_of(spec: RoundSpec) -> set[str]:
    return {str(oracle_name(c.mechanism)) for t in spec.tasks for c in t.components} - {"None"}


def refused(message: campaigns_pb2.CampaignConfig) -> tuple[str, str]:
    with pytest.raises(InvalidArgumentError) as info:
        prepare_campaign(config_from_proto(message))
    text = str(info.value)
    return text, field_path(text, campaigns_pb2.CampaignConfig, "config")


# -- validation and storage ----------------------------------------------------------------------------


@pytest.mark.parametrize("oracles,match", [((9,), "oracles must hold frequency oracles"),
                                           ((0,), "oracles must hold frequency oracles"),
                                           ((GRR, OUE, GRR), "oracles lists a frequency oracle twice")])
def test_bad_oracle_lists_are_refused_naming_the_field(oracles: tuple[int, ...], match: str) -> None:
    text, path = refused(config("histogram", oracles))
    assert match in text and path == "config.oracles"


def test_the_stored_configuration_lists_them_in_order_and_round_trips() -> None:
    prepared = prepare_campaign(config_from_proto(config("histogram", (OUE, GRR))))
    assert prepared.config.oracles == (GRR, OUE)
    assert list(config_to_proto(prepared.config).oracles) == [GRR, OUE]
    assert config_from_proto(config_to_proto(prepared.config)) == prepared.config
    assert prepare_campaign(config_from_proto(config("histogram"))).config.oracles == ()


# -- every kind plans within them ----------------------------------------------------------------------


def test_histogram_chooses_within_and_refuses_a_named_oracle_outside() -> None:
    def chosen(oracles: tuple[int, ...]) -> set[str]:
        return oracles_of(prepare_campaign(config_from_proto(config("histogram", oracles))).engine.first_round().spec)

    assert chosen(()) == chosen((GRR, OUE)) == {"oue"}  # 4096 values at epsilon 4: OUE has the least variance
    assert chosen((GRR, OLH)) == {"olh"}
    assert chosen((GRR,)) == {"grr"}
    text, path = refused(config("histogram", (GRR,), oracle=OLH))
    assert "histogram.oracle OLH is not one of the campaign's oracles (grr)" in text
    assert path == "config.histogram.oracle"


@pytest.mark.parametrize("kind,params,allowed", [
    ("heavy_hitters", {"value_bits": 16, "bits_per_level": 4}, (GRR, OUE)),
    ("heavy_hitters", {"value_bits": 16, "bits_per_level": 4}, (GRR,)),
    ("stemmer", {"k": 3}, (GRR,)),
    ("nettree", {"k": 3}, (GRR, SUE)),
    ("grid", {}, (GRR,)),
])
def test_first_rounds_stay_within_the_allowed_oracles(kind: str, params: dict[str, Any], allowed: tuple[int, ...]) -> None:
    names = {FrequencyOracle(o).name.lower() for o in allowed}
    spec = prepare_campaign(config_from_proto(config(kind, allowed, **params))).engine.first_round().spec
    assert oracles_of(spec) and oracles_of(spec) <= names


def test_kinds_the_allowed_oracles_cannot_serve_are_refused_at_creation() -> None:
    # The finest grid has 4096 cells: SUE would need 4096 bits, above the 1024 a grid report may take.
    text, _ = refused(config("grid", (SUE,)))
    assert "none of the allowed frequency oracles (sue)" in text
    text, path = refused(config("ldp_kmeans", (OUE, OLH), k=3))
    assert "oracles must include GRR for an ldp_kmeans campaign" in text and path == "config.oracles"


def _grid_rounds(oracles: tuple[int, ...]) -> dict[int, RoundSpec]:
    x, _ = make_dataset("moons", 20_000, seed=4)
    lower, upper = np.min(x, axis=0), np.max(x, axis=0)
    message = config("grid", oracles, variant=ITERATIVE)
    message.domain.numeric.ClearField("lower")
    message.domain.numeric.ClearField("upper")
    message.domain.numeric.lower.extend(lower.tolist())
    message.domain.numeric.upper.extend(upper.tolist())
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(tmp)
        try:
            backend = RecordingCollector(Collector(store), seed=4)
            run = run_campaign(backend, config_from_proto(message), x, seed=4, mode="direct", quiet=True)
        finally:
            store.close()
    assert run.result.state == campaigns_pb2.FINISHED
    return dict(backend.specs)


def test_the_iterative_grid_no_longer_switches_to_local_hashing_when_it_is_not_allowed() -> None:
    free = _grid_rounds(())
    used = [oracles_of(spec) for spec in free.values()]
    assert any("olh" in u for u in used), f"the unrestricted run is expected to switch to OLH: {used}"
    restricted = _grid_rounds((GRR, OUE))
    assert len(restricted) >= 3
    for spec in restricted.values():
        assert oracles_of(spec) <= {"grr", "oue"}
        assert "mechanism.local_hashing" not in spec.required_capabilities


def test_the_collector_never_publishes_a_round_outside_them() -> None:
    spec = prepare_campaign(config_from_proto(config("histogram", oracle=OLH))).engine.first_round().spec
    restricted = config_from_proto(config("histogram", (GRR,)))
    with pytest.raises(RuntimeError, match=r"frequency oracle\(s\) olh, outside the campaign's oracles grr"):
        check_allowed_oracles(spec, restricted)
    check_allowed_oracles(spec, config_from_proto(config("histogram")))  # any


# -- the flag ------------------------------------------------------------------------------------------


def test_the_oracles_flag() -> None:
    assert oracle_list("grr,OUE") == ("grr", "oue")
    for bad in ("grr,grr", "rappor", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            oracle_list(bad)
    message = build_campaign_config("grid", epsilon=2.0, bounds=((0.0, 0.0), (1.0, 1.0)), oracles=("oue", "grr"))
    assert list(message.oracles) == [OUE, GRR]
    args = build_parser().parse_args(["campaign", "create", "--kind", "grid", "--dims", "0:1,0:1", "--epsilon", "2",
                                      "--oracles", "grr,oue"])
    assert args.oracles == ("grr", "oue")
