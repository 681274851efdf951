"""Every kind's parameters dataclass: it mirrors its ``ldp.v1`` message, round-trips through serde,
and its ``resolve`` is the one place the kind's defaults are filled.

Run over the registry, so a new kind inherits these tests by registering itself (STYLE.md §9, §17).
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Any

import pytest

import ldp_client._spec
from ldp.v1 import campaigns_pb2
from ldp_client.mechanisms import LocalHashingParams, choose_frequency_oracle
from ldp_client.spec import Spec
from ldp_collector import serde
from ldp_collector.campaigns import make_engine, prepare_campaign, resolve_params
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.kinds import KINDS, Kind
from ldp_collector.kinds.base import NUMERIC, KindParams
from ldp_collector.kinds.histogram import HistogramEngine, HistogramParams
from ldp_collector.serde import config_from_proto, kind_number

_KINDS = list(KINDS)


def _message(kind: Kind) -> Any:
    return getattr(campaigns_pb2.CampaignConfig(), kind.name)


def _config(kind: Kind, **fields: Any) -> campaigns_pb2.CampaignConfig:
    """A valid configuration of ``kind`` that sets no parameter but ``k``."""
    config = campaigns_pb2.CampaignConfig(kind=kind_number(kind.name), epsilon=2.0, campaign_id=f"params-{kind.name}", **fields)
    if NUMERIC in kind.domains:
        config.domain.numeric.lower.extend([0.0, -1.0])
        config.domain.numeric.upper.extend([1.0, 1.0])
    else:
        config.domain.categorical_size = 64
    if "k" in _message(kind).DESCRIPTOR.fields_by_name:
        getattr(config, kind.name).k = 3
    return config


def _hints(cls: type) -> dict[str, Any]:
    """The dataclass fields' types."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def test_spec_is_public() -> None:
    assert Spec is ldp_client._spec.Spec


@pytest.mark.parametrize("name", _KINDS)
def test_mirrors_its_message(name: str) -> None:
    """Same field names in the same order; proto enums are IntEnums with the proto's names and numbers."""
    kind = KINDS[name]
    cls: Any = kind.params
    assert issubclass(cls, KindParams) and issubclass(cls, Spec)
    assert cls.__dataclass_params__.frozen
    assert all(f.kw_only for f in dataclasses.fields(cls))
    descriptor = _message(kind).DESCRIPTOR
    assert [f.name for f in dataclasses.fields(cls)] == [f.name for f in descriptor.fields]
    default = cls()
    hints = _hints(cls)
    for field in descriptor.fields:
        value = getattr(default, field.name)
        if field.enum_type is not None:
            enum_cls = hints[field.name]
            assert issubclass(enum_cls, enum.IntEnum)
            assert {m.name: m.value for m in enum_cls} == {v.name: v.number for v in field.enum_type.values}
            assert value == 0
        elif field.is_repeated:
            assert value == ()
        elif field.has_presence:
            assert value is None
        else:
            assert value == field.default_value


def _filled(cls: type[KindParams], enum_value: int = 1) -> KindParams:
    """An instance with a non-default value in every field (enums: member ``enum_value`` or the last)."""
    values: dict[str, Any] = {}
    for name, hint in _hints(cls).items():
        if isinstance(hint, type) and issubclass(hint, enum.IntEnum):
            members = list(hint)
            values[name] = members[min(enum_value, len(members) - 1)]
        elif typing.get_origin(hint) is tuple:
            values[name] = (2, 3)
        elif hint is bool or typing.get_args(hint) == (bool, type(None)):
            values[name] = True
        elif hint is int:
            values[name] = 7
        elif hint is float:
            values[name] = 0.25
        else:  # pragma: no cover - a new field type needs a value here
            raise AssertionError(f"{cls.__name__}.{name}: no test value for {hint}")
    return cls(**values)


def _round_trip(name: str, params: KindParams) -> KindParams | None:
    config = campaigns_pb2.CampaignConfig()
    serde.params_to_proto(name, params, config)
    assert config.WhichOneof("parameters") == name
    return serde.params_from_proto(name, config)


@pytest.mark.parametrize("name", _KINDS)
def test_serde_round_trip(name: str) -> None:
    cls = KINDS[name].params
    assert _round_trip(name, cls()) == cls()
    filled = _filled(cls)
    assert _round_trip(name, filled) == filled
    enum_fields = [n for n, h in _hints(cls).items() if isinstance(h, type) and issubclass(h, enum.IntEnum)]
    for field_name in enum_fields:
        for member in _hints(cls)[field_name]:
            params = dataclasses.replace(typing.cast(Any, filled), **{field_name: member})
            back = _round_trip(name, params)
            assert back == params and type(getattr(back, field_name)) is type(member)


@pytest.mark.parametrize("name", _KINDS)
def test_unset_parameters_read_as_none(name: str) -> None:
    assert serde.params_from_proto(name, campaigns_pb2.CampaignConfig()) is None


def test_other_kinds_parameters_are_refused() -> None:
    config = campaigns_pb2.CampaignConfig()
    config.grid.SetInParent()
    with pytest.raises(InvalidArgumentError, match="a histogram campaign takes histogram parameters, got grid"):
        serde.params_from_proto("histogram", config)


def test_unknown_enum_number_reaches_resolve() -> None:
    """A proto3 enum is open: the number survives the conversion and ``resolve`` names the field."""
    config = _config(KINDS["histogram"])
    config.histogram.oracle = 42  # type: ignore[assignment]
    params = serde.params_from_proto("histogram", config)
    assert isinstance(params, HistogramParams) and params.oracle == 42 and str(params.oracle) == "42"
    with pytest.raises(InvalidArgumentError, match="histogram.oracle 42 is not a known frequency oracle"):
        params.resolve(serde.config_from_proto(config))


@pytest.mark.parametrize("name", _KINDS)
def test_defaults_are_filled_in_one_place(name: str) -> None:
    """The stored configuration is exactly the input with ``resolve``'s parameters written back."""
    kind = KINDS[name]
    config = _config(kind)
    prepared = prepare_campaign(config_from_proto(config))
    resolved = (serde.params_from_proto(name, config) or kind.params()).resolve(prepared.config)
    expected = campaigns_pb2.CampaignConfig()
    expected.CopyFrom(config)
    expected.budget_policy = campaigns_pb2.PARTITION
    expected.min_reports_per_round = 1
    assert prepared.config.seed is not None  # drawn at creation: the stored configuration carries it
    expected.seed = prepared.config.seed
    serde.params_to_proto(name, resolved, expected)
    assert serde.config_to_bytes(prepared.config) == expected.SerializeToString()
    assert prepared.engine.params == resolved
    # Resolving the stored parameters again changes nothing: a restart rebuilds the same engine.
    assert resolve_params(prepared.config) == resolved
    assert resolved.resolve(prepared.config) == resolved


def test_capped_olh_survives_a_restart() -> None:
    """With a payload cap the automatic choice can be OLH with fewer buckets; the stored configuration
    records OLH and rebuilds that same mechanism."""
    config = campaigns_pb2.CampaignConfig(kind=campaigns_pb2.HISTOGRAM, epsilon=4.0, campaign_id="capped",
                                          domain=campaigns_pb2.Domain(categorical_size=1024))
    config.histogram.max_payload_bits = 37
    chosen = choose_frequency_oracle(1024, 4.0, 37)
    assert isinstance(chosen, LocalHashingParams) and chosen.hash_range == 32
    prepared = prepare_campaign(config_from_proto(config))
    assert prepared.config.parameters.oracle == campaigns_pb2.OLH
    stored = campaigns_pb2.CampaignConfig.FromString(serde.config_to_bytes(prepared.config))
    for engine in (prepared.engine, make_engine(config_from_proto(stored))):
        assert isinstance(engine, HistogramEngine)
        assert engine.component.mechanism == chosen
