"""Capabilities (docs/protocol.md §10): the rule deriving a round's required list, the SDK's own set,
the spec refusing a stated list that disagrees with its tasks, a restricted device declining before
anything is charged or stored, and the oracle choice within a campaign's allowed oracles.

Stdlib and msgpack only (the ``client`` tox env): the wire-level checks are in
``tests/collector/test_capabilities.py``.
"""

from __future__ import annotations

import pytest

from ldp_client.capabilities import (
    SDK_CAPABILITIES,
    check_capability_names,
    component_capabilities,
    missing_capabilities,
    required_capabilities,
    supported_capabilities,
)
from ldp_client.device import Device
from ldp_client.encoders.base import ENCODERS, NumericDomain
from ldp_client.encoders.bitvector import BitVectorEncoder
from ldp_client.encoders.bucketed import BucketedVectorEncoder
from ldp_client.encoders.categorical import CategoricalEncoder
from ldp_client.encoders.grid import GridTreeEncoder
from ldp_client.encoders.lsh import ShiftedGridEncoder, SimHashEncoder
from ldp_client.encoders.nearest import NearestCandidateEncoder
from ldp_client.encoders.projection import RandomProjection
from ldp_client.encoders.vectors import UnitCubeEncoder
from ldp_client.errors import InvalidParameterError, MissingCapabilitiesError, ProtocolError
from ldp_client.mechanisms import choose_frequency_oracle
from ldp_client.mechanisms.base import MECHANISMS
from ldp_client.mechanisms.bitwise_randomized_response import BitwiseRRParams
from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams, VectorShape
from ldp_client.mechanisms.discrete_laplace import DiscreteLaplaceParams
from ldp_client.mechanisms.local_hashing import LocalHashingParams
from ldp_client.mechanisms.oracle_choice import FREQUENCY_ORACLES, frequency_oracle_candidates, oracle_name
from ldp_client.mechanisms.randomized_response import GRRParams
from ldp_client.mechanisms.unary_encoding import oue, sue
from ldp_client.rng import SeededRng
from ldp_client.spec import Component, GroupTask, RoundSpec

BOX = NumericDomain(lower=(0.0, 0.0), upper=(1.0, 1.0))


def spec_of(*components: Component, stated: tuple[str, ...] = ()) -> RoundSpec:
    return RoundSpec(campaign_id="caps", round=1, group_weights=(1, 1),
                     tasks=(GroupTask(groups=(0,), components=components[:1]),
                            GroupTask(groups=(1,), components=components[1:] or components[:1])),
                     campaign_epsilon=4.0, required_capabilities=stated)


def categorical(mechanism: object) -> Component:
    return Component(encoder=CategoricalEncoder(domain_size=16), mechanism=mechanism)  # type: ignore[arg-type]


def bucketed(**bucket: object) -> BucketedVectorEncoder:
    return BucketedVectorEncoder(domain=BOX, **bucket)  # type: ignore[arg-type]


# -- the rule -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("component,expected", [
    (categorical(GRRParams(domain_size=16, epsilon=1.0)), {"encoder.categorical", "mechanism.grr"}),
    (categorical(oue(16, 1.0)), {"encoder.categorical", "mechanism.unary_encoding"}),
    (categorical(sue(16, 1.0)), {"encoder.categorical", "mechanism.unary_encoding"}),
    (categorical(LocalHashingParams(domain_size=16, epsilon=1.0)), {"encoder.categorical", "mechanism.local_hashing"}),
    (Component(encoder=GridTreeEncoder(domain=BOX, level=2), mechanism=GRRParams(domain_size=16, epsilon=1.0)),
     {"encoder.grid_tree", "mechanism.grr"}),
    (Component(encoder=UnitCubeEncoder(domain=BOX), mechanism=DiscreteLaplaceParams(dimension=2, epsilon=1.0, grid_bits=4)),
     {"encoder.unit_cube", "mechanism.discrete_laplace"}),
    (Component(encoder=BitVectorEncoder(domain=BOX, pivots=(0.5, 0.5), pivots_per_attribute=(1, 1),
                                        half_widths=(0.25, 0.25)),
               mechanism=BitwiseRRParams(length=2, epsilon=1.0, sensitivity=2)),
     {"encoder.bit_vector", "mechanism.bitwise_rr"}),
], ids=["grr", "oue", "sue", "olh", "grid-tree", "discrete-laplace", "bit-vector"])
def test_one_encoder_and_one_mechanism(component: Component, expected: set[str]) -> None:
    assert component_capabilities(component.encoder, component.mechanism) == expected
    assert spec_of(component).required_capabilities == tuple(sorted(expected))


PROJECTION = RandomProjection(input_dimension=2, output_dimension=2, seed=5)


@pytest.mark.parametrize("encoder,expected", [
    (bucketed(simhash=SimHashEncoder(domain=BOX, bits=3, seed=1)), {"encoder.bucketed_vector", "encoder.simhash"}),
    (bucketed(simhash=SimHashEncoder(domain=BOX, projection=PROJECTION, bits=3, seed=1)),
     {"encoder.bucketed_vector", "encoder.simhash", "encoder.random_projection"}),
    (bucketed(shifted_grid=ShiftedGridEncoder(domain=BOX, projection=PROJECTION, level=1, seed=1)),
     {"encoder.bucketed_vector", "encoder.shifted_grid", "encoder.random_projection"}),
    (bucketed(nearest=NearestCandidateEncoder(domain=BOX, dimension=2, centers=(0.1, 0.1, 0.9, 0.9, 0.5, 0.5))),
     {"encoder.bucketed_vector", "encoder.nearest_candidate"}),
], ids=["simhash", "simhash-projected", "shifted-grid-projected", "nearest"])
@pytest.mark.parametrize("shape,inner", [(VectorShape.BOX, "mechanism.vector_box"),
                                         (VectorShape.L2_BALL, "mechanism.vector_l2_ball"),
                                         (VectorShape.PRIVUNIT, "mechanism.vector_privunit")])
def test_nested_parts_are_required_too(encoder: BucketedVectorEncoder, expected: set[str], shape: VectorShape,
                                       inner: str) -> None:
    mechanism = BucketizedVectorParams(bucket_bits=encoder.bucket_bits, dimension=3, epsilon=4.0, shape=shape)
    component = Component(encoder=encoder, mechanism=mechanism)
    assert spec_of(component).required_capabilities == tuple(
        sorted(expected | {"mechanism.bucketized_vector", inner}))


def test_union_over_every_task_sorted_once() -> None:
    spec = spec_of(categorical(GRRParams(domain_size=16, epsilon=1.0)),
                   categorical(LocalHashingParams(domain_size=16, epsilon=1.0)))
    assert spec.required_capabilities == ("encoder.categorical", "mechanism.grr", "mechanism.local_hashing")
    assert required_capabilities(spec) == spec.required_capabilities


def test_the_sdk_states_every_encoder_and_mechanism_it_runs() -> None:
    expected = ({f"encoder.{k}" for k in ENCODERS.kinds()} | {f"mechanism.{k}" for k in MECHANISMS.kinds()}
                | {"encoder.random_projection", "mechanism.local_hashing.seed_pool"})
    assert SDK_CAPABILITIES == expected
    assert supported_capabilities() == SDK_CAPABILITIES
    assert supported_capabilities(["mechanism.grr"]) == {"mechanism.grr"}
    with pytest.raises(InvalidParameterError, match="subset of SDK_CAPABILITIES"):
        supported_capabilities(["mechanism.quantum"])


@pytest.mark.parametrize("names,error", [
    ("encoder.grid_tree", TypeError), (["Encoder.grid_tree"], InvalidParameterError), (["grid_tree"], InvalidParameterError),
    (["encoder.grid_tree", "encoder.grid_tree"], InvalidParameterError), ([7], TypeError),
    (["encoder." + "x" * 60], InvalidParameterError), ([f"encoder.e{i}" for i in range(257)], InvalidParameterError),
])
def test_malformed_capability_lists_are_refused(names: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        check_capability_names(names)  # type: ignore[arg-type]


def test_missing_is_the_sorted_difference() -> None:
    assert missing_capabilities(["b.x", "a.y", "c.z"], ["c.z"]) == ("a.y", "b.x")
    assert missing_capabilities(["a.y"], ["a.y", "b.x"]) == ()


# -- the spec checks a stated list ---------------------------------------------------------------------


GRR = categorical(GRRParams(domain_size=16, epsilon=1.0))


def test_a_stated_list_equal_to_the_tasks_is_kept_in_order() -> None:
    assert spec_of(GRR, stated=("mechanism.grr", "encoder.categorical")).required_capabilities == (
        "encoder.categorical", "mechanism.grr")


@pytest.mark.parametrize("stated", [("encoder.categorical",), ("encoder.categorical", "mechanism.grr", "mechanism.local_hashing"),
                                    ("encoder.categorical", "mechanism.local_hashing")],
                         ids=["too-few", "too-many", "other"])
def test_a_stated_list_that_disagrees_with_the_tasks_is_refused(stated: tuple[str, ...]) -> None:
    with pytest.raises(InvalidParameterError, match="disagree with the round's tasks"):
        spec_of(GRR, stated=stated)
    # ... also when it arrives packed (the collector is not trusted).
    data = spec_of(GRR).to_dict()
    data["required_capabilities"] = list(stated)
    with pytest.raises(ProtocolError, match="disagree"):
        RoundSpec.from_dict(data)


def test_a_spec_from_before_the_field_derives_its_list() -> None:
    data = spec_of(GRR).to_dict()
    del data["required_capabilities"]
    assert RoundSpec.from_dict(data).required_capabilities == ("encoder.categorical", "mechanism.grr")


# -- a restricted device declines --------------------------------------------------------------------


def test_a_restricted_device_declines_before_anything_is_charged_or_stored() -> None:
    spec = spec_of(categorical(LocalHashingParams(domain_size=16, epsilon=1.0)))
    device = Device.in_memory(rng=SeededRng(1), capabilities=SDK_CAPABILITIES - {"mechanism.local_hashing"})
    with pytest.raises(MissingCapabilitiesError) as info:
        device.participate(spec, 3)
    assert info.value.missing == ("mechanism.local_hashing",)
    assert info.value.campaign_id == "caps"
    assert device.pending_reports() == [] and device.spent("caps") == 0.0
    assert not device.has_reported("caps", 1)
    # The same device takes part in a round it can run.
    assert device.participate(spec_of(GRR), 3) is not None
    assert Device.in_memory(rng=SeededRng(1)).capabilities == SDK_CAPABILITIES


# -- the oracle choice within the allowed oracles -------------------------------------------------------


@pytest.mark.parametrize("domain,epsilon,cap", [(4, 1.0, None), (4096, 4.0, 1024), (2**20, 2.0, None), (300, 0.5, 64)])
def test_the_oracle_choice_stays_within_the_allowed_oracles(domain: int, epsilon: float, cap: int | None) -> None:
    free = choose_frequency_oracle(domain, epsilon, cap)
    assert choose_frequency_oracle(domain, epsilon, cap, oracles=FREQUENCY_ORACLES) == free
    for allowed in ({"grr"}, {"grr", "oue"}, {"olh"}, {"sue", "oue", "grr"}):
        candidates = frequency_oracle_candidates(domain, epsilon, cap, oracles=allowed)
        assert {oracle_name(c) for c in candidates} <= allowed
        if candidates:
            chosen = choose_frequency_oracle(domain, epsilon, cap, oracles=allowed)
            assert oracle_name(chosen) in allowed
            if oracle_name(free) in allowed:
                assert chosen == free  # restricting to a set holding the best changes nothing


def test_no_allowed_oracle_fits_is_an_error_naming_them() -> None:
    with pytest.raises(InvalidParameterError, match=r"none of the allowed frequency oracles \(sue\)"):
        choose_frequency_oracle(4096, 4.0, 1024, oracles={"sue"})
    for bad in (set(), {"rappor"}):
        with pytest.raises(InvalidParameterError, match="non-empty subset"):
            choose_frequency_oracle(16, 1.0, oracles=bad)
    with pytest.raises(TypeError):
        choose_frequency_oracle(16, 1.0, oracles="grr")


def test_oracle_names() -> None:
    assert [oracle_name(m) for m in (GRRParams(domain_size=4, epsilon=1.0), sue(4, 1.0), oue(4, 1.0),
                                     LocalHashingParams(domain_size=4, epsilon=1.0))] == list(FREQUENCY_ORACLES)
    assert oracle_name(DiscreteLaplaceParams(dimension=2, epsilon=1.0, grid_bits=4)) is None


def test_a_pooled_local_hashing_round_requires_the_seed_pool() -> None:
    from ldp_client.capabilities import SEED_POOL, component_capabilities
    from ldp_client.encoders.categorical import CategoricalEncoder
    from ldp_client.mechanisms.local_hashing import LocalHashingParams

    encoder = CategoricalEncoder(domain_size=16)
    plain = component_capabilities(encoder, LocalHashingParams(domain_size=16, epsilon=1.0))
    pooled = component_capabilities(encoder, LocalHashingParams(domain_size=16, epsilon=1.0, seed_pool_size=4))
    assert SEED_POOL not in plain
    assert pooled == plain | {SEED_POOL}
