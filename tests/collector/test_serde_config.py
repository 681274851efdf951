"""serde of campaign configurations and campaigns: round trips, the stored bytes, the wire-level refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from google.protobuf import duration_pb2

from ldp.v1 import campaigns_pb2
from ldp_collector import serde
from ldp_collector.campaigns import prepare_campaign
from ldp_collector.core import Collector
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.kinds.histogram import FrequencyOracle, HistogramParams
from ldp_collector.model import BudgetPolicy, CampaignConfig, CampaignState, Domain, Duration
from ldp_collector.storage import open_store


def _numeric_message() -> campaigns_pb2.CampaignConfig:
    """A configuration with every field set."""
    config = campaigns_pb2.CampaignConfig(
        campaign_id="serde-1", kind=campaigns_pb2.HISTOGRAM, epsilon=2.5, budget_policy=campaigns_pb2.SPLIT,
        min_reports_per_round=7, close_after_reports=70, description="every field",
        labels={"team": "geo", "run": "3"}, round_duration=duration_pb2.Duration(seconds=90, nanos=5), seed=0)
    config.domain.numeric.lower.extend([0.0, -1.5])
    config.domain.numeric.upper.extend([1.0, 2.5])
    config.histogram.cells_per_dimension.extend([4, 3])
    config.histogram.oracle = campaigns_pb2.OUE
    config.histogram.windows = 2
    return config


def test_config_round_trips_field_for_field() -> None:
    message = _numeric_message()
    config = serde.config_from_proto(message)
    assert config.kind == "histogram" and config.budget_policy == BudgetPolicy.SPLIT
    assert config.domain.numeric is not None and config.domain.numeric.upper == (1.0, 2.5)
    assert config.round_duration == Duration(seconds=90, nanos=5) and dict(config.labels) == {"team": "geo", "run": "3"}
    assert config.parameters == HistogramParams(cells_per_dimension=(4, 3), oracle=FrequencyOracle.OUE, windows=2)
    assert config.seed == 0  # set to 0, not unset: presence is kept
    assert serde.config_to_proto(config) == message
    assert serde.config_from_bytes(serde.config_to_bytes(config)) == config
    categorical = campaigns_pb2.CampaignConfig(kind=campaigns_pb2.HEAVY_HITTERS, epsilon=1.0,
                                               domain=campaigns_pb2.Domain(categorical_size=64))
    model = serde.config_from_proto(categorical)
    assert model.domain == Domain(categorical_size=64) and model.parameters is None and model.round_duration is None
    assert model.seed is None
    assert serde.config_to_proto(model) == categorical and not serde.config_to_proto(model).HasField("seed")


def test_stored_configuration_is_the_input_with_defaults_and_resolved_parameters() -> None:
    """The bytes stored for a campaign are the message today's wire sends back (``GetCampaign.config``)."""
    message = _numeric_message()
    prepared = prepare_campaign(serde.config_from_proto(message))
    expected = campaigns_pb2.CampaignConfig()
    expected.CopyFrom(message)
    serde.params_to_proto("histogram", prepared.engine.params, expected)
    assert serde.config_to_bytes(prepared.config) == expected.SerializeToString()


def test_an_unset_campaign_seed_is_drawn_at_creation_and_stored() -> None:
    """The stored configuration always carries the seed its engine's public randomness comes from."""
    message = _numeric_message()
    message.ClearField("seed")
    seeds = {prepare_campaign(serde.config_from_proto(message)).config.seed for _ in range(2)}
    assert None not in seeds and len(seeds) == 2  # 64 random bits: a repeat has probability 2^-64
    stored = serde.config_from_bytes(serde.config_to_bytes(prepare_campaign(serde.config_from_proto(message)).config))
    assert stored.seed is not None
    message.seed = 2**64 - 1
    assert prepare_campaign(serde.config_from_proto(message)).config.seed == 2**64 - 1


@pytest.mark.parametrize("seed", [-1, 2**64, True])
def test_a_campaign_seed_outside_uint64_is_refused(seed: int) -> None:
    config = serde.config_from_proto(_numeric_message())
    with pytest.raises(InvalidArgumentError, match=r"seed must be an integer in \[0, 2\^64 - 1\]"):
        prepare_campaign(dataclasses.replace(config, seed=seed))


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda c: setattr(c, "kind", 99), "kind 99 is not a known campaign kind"),
    (lambda c: c.domain.numeric.upper.__setitem__(0, -5.0), "domain.numeric: "),
    (lambda c: c.grid.SetInParent(), "a histogram campaign takes histogram parameters, got grid"),
])
def test_what_the_model_cannot_hold_is_refused_at_conversion(mutate: object, message: str) -> None:
    config = _numeric_message()
    mutate(config)  # type: ignore[operator]
    with pytest.raises(InvalidArgumentError, match=message):
        serde.config_from_proto(config)


def test_refusals_the_model_can_hold_stay_with_the_common_checks() -> None:
    """No kind, or an unknown budget policy number, convert; ``prepare_campaign`` names the field."""
    no_kind = _numeric_message()
    no_kind.kind = campaigns_pb2.CAMPAIGN_KIND_UNSPECIFIED
    # The kinds in words, not a language's list notation (docs/errors.md, section 5).
    with pytest.raises(InvalidArgumentError, match=r"kind is required; known kinds: bitvector, grid, heavy_hitters, "):
        prepare_campaign(serde.config_from_proto(no_kind))
    policy = _numeric_message()
    policy.budget_policy = 7  # type: ignore[assignment]
    with pytest.raises(InvalidArgumentError, match="budget_policy 7 is not a known budget policy"):
        prepare_campaign(serde.config_from_proto(policy))
    with pytest.raises(InvalidArgumentError, match="campaign kind NOPE is not implemented yet"):
        prepare_campaign(CampaignConfig(kind="nope", epsilon=1.0, domain=Domain(categorical_size=4)))
    with pytest.raises(InvalidArgumentError, match="a heavy_hitters campaign takes heavy_hitters parameters, got histogram"):
        prepare_campaign(CampaignConfig(kind="heavy_hitters", epsilon=1.0, domain=Domain(categorical_size=4),
                                        parameters=HistogramParams()))


def test_campaign_round_trips(tmp_path: Path) -> None:
    collector = Collector(open_store(tmp_path))
    campaign = collector.create_campaign(serde.config_from_proto(_numeric_message()))
    assert campaign.state == CampaignState.COLLECTING and campaign.current_round is not None
    assert campaign.rounds[0].open and campaign.rounds[0].opened_at == campaign.created_at
    message = serde.campaign_to_proto(campaign)
    assert message.state == campaigns_pb2.COLLECTING and message.current_round.round == campaign.current_round.round
    assert message.created_at.ToNanoseconds() == round(campaign.created_at * 1e9)  # type: ignore[operator]
    assert not message.rounds[0].HasField("closed_at")
    assert serde.campaign_from_proto(message) == campaign
