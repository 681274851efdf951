"""Spec and report <-> ldp.v1 protobuf conversion: round trips for every registered kind, clear errors."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import pytest

pytest.importorskip("google.protobuf")
pytest.importorskip("ldp.v1")

import ldp_client.encoders
import ldp_client.mechanisms
from ldp.v1 import encoders_pb2 as enc
from ldp.v1 import mechanisms_pb2 as mech
from ldp.v1 import reports_pb2
from ldp_client.encoders import ENCODERS, CategoricalEncoder, NumericDomain
from ldp_client.errors import ProtocolError
from ldp_client.mechanisms import MECHANISMS, GRRParams
from ldp_client.payload import Floats, HashedValue, Integers
from ldp_client.report import Report
from ldp_client.serde import (
    encoder_from_proto,
    encoder_to_proto,
    mechanism_from_proto,
    mechanism_to_proto,
    report_from_proto,
    report_to_proto,
    round_spec_from_proto,
    round_spec_to_proto,
    spec_from_proto,
)
from ldp_client.spec import Component, GroupTask, RoundSpec

# Register every mechanism and encoder module that exists, so that new kinds are covered automatically.
for _package in (ldp_client.mechanisms, ldp_client.encoders):
    for _module in pkgutil.iter_modules(_package.__path__):
        importlib.import_module(f"{_package.__name__}.{_module.name}")

DOMAIN_2D = enc.NumericDomain(lower=[0.0, -1.0], upper=[1.0, 1.0])
DOMAIN_4D = enc.NumericDomain(lower=[0.0] * 4, upper=[1.0] * 4)

#: One valid example message per kind (the proto is the reference for field names and types).
MECHANISM_EXAMPLES: dict[str, Any] = {
    "grr": mech.GeneralizedRandomizedResponse(domain_size=5, epsilon=1.25),
    "unary_encoding": mech.UnaryEncoding(domain_size=16, epsilon=2.0, variant=mech.UnaryEncoding.OPTIMIZED),
    "local_hashing": mech.LocalHashing(domain_size=1000, epsilon=1.5, hash_range=5),
    "bitwise_rr": mech.BitwiseRandomizedResponse(length=12, epsilon=2.0, sensitivity=4),
    "discrete_laplace": mech.DiscreteLaplace(dimension=3, epsilon=3.0, grid_bits=8),
    "vector_l2_ball": mech.VectorL2Ball(dimension=4, epsilon=1.0),
    "vector_privunit": mech.VectorPrivUnit(dimension=4, epsilon=1.0),
    "vector_box": mech.VectorBox(dimension=4, epsilon=1.0),
    "bucketized_vector": mech.BucketizedVector(bucket_bits=6, dimension=3, epsilon=1.0,
                                               shape=mech.BucketizedVector.BOX),
}
ENCODER_EXAMPLES: dict[str, Any] = {
    "categorical": enc.CategoricalEncoder(domain_size=7),
    "uniform_grid": enc.UniformGridEncoder(domain=DOMAIN_2D, cells_per_dimension=[4, 3]),
    "grid_tree": enc.GridTreeEncoder(domain=DOMAIN_2D, level=3),
    "cell_list": enc.CellListEncoder(domain=DOMAIN_2D, cells=[
        enc.TreeCell(level=1, morton_index=0), enc.TreeCell(level=1, morton_index=1),
        enc.TreeCell(level=1, morton_index=2), enc.TreeCell(level=2, morton_index=12),
        enc.TreeCell(level=2, morton_index=13), enc.TreeCell(level=2, morton_index=14),
        enc.TreeCell(level=2, morton_index=15)]),
    "simhash": enc.SimHashEncoder(domain=DOMAIN_4D, projection=enc.RandomProjection(
        input_dimension=4, output_dimension=2, seed=7), bits=3, seed=11),
    "shifted_grid": enc.ShiftedGridEncoder(domain=DOMAIN_4D, level=2, seed=5),
    "nearest_candidate": enc.NearestCandidateEncoder(domain=DOMAIN_2D, dimension=2,
                                                     centers=[0.1, 0.2, 0.5, 0.5, 0.9, -0.8]),
    "bit_vector": enc.BitVectorEncoder(domain=DOMAIN_2D, pivots=[0.25, 0.75, 0.0], pivots_per_attribute=[2, 1],
                                       half_widths=[0.25, 0.5]),
    "unit_cube": enc.UnitCubeEncoder(domain=DOMAIN_2D),
    "symmetric_box": enc.SymmetricBoxEncoder(domain=DOMAIN_2D),
    "unit_ball": enc.UnitBallEncoder(domain=DOMAIN_2D),
    "bucketed_vector": enc.BucketedVectorEncoder(domain=DOMAIN_2D,
                                                 simhash=enc.SimHashEncoder(domain=DOMAIN_2D, bits=6, seed=3)),
}


@pytest.mark.parametrize("kind", sorted(MECHANISM_EXAMPLES))
def test_mechanism_round_trip(kind: str) -> None:
    if kind not in MECHANISMS.kinds():
        pytest.skip(f"mechanism {kind} is not registered yet")
    message = mech.MechanismSpec(**{kind: MECHANISM_EXAMPLES[kind]})
    params = mechanism_from_proto(message)
    assert params.KIND == kind and type(params) is MECHANISMS.get(kind)
    assert mechanism_to_proto(params) == message
    assert mechanism_from_proto(mechanism_to_proto(params)) == params


@pytest.mark.parametrize("kind", sorted(ENCODER_EXAMPLES))
def test_encoder_round_trip(kind: str) -> None:
    if kind not in ENCODERS.kinds():
        pytest.skip(f"encoder {kind} is not registered yet")
    message = enc.EncoderSpec(**{kind: ENCODER_EXAMPLES[kind]})
    encoder = encoder_from_proto(message)
    assert encoder.KIND == kind and type(encoder) is ENCODERS.get(kind)
    assert encoder_to_proto(encoder) == message
    assert encoder_from_proto(encoder_to_proto(encoder)) == encoder


def test_every_registered_kind_has_an_example() -> None:
    assert set(MECHANISMS.kinds()) <= set(MECHANISM_EXAMPLES), "add an example message for the new mechanism"
    assert set(ENCODERS.kinds()) <= set(ENCODER_EXAMPLES), "add an example message for the new encoder"


def _spec(deadline: float | None = 1_790_000_000.123456) -> RoundSpec:
    grr = Component(encoder=CategoricalEncoder(domain_size=5), mechanism=GRRParams(domain_size=5, epsilon=0.5))
    grr2 = Component(encoder=CategoricalEncoder(domain_size=3), mechanism=GRRParams(domain_size=3, epsilon=1.0))
    return RoundSpec(campaign_id="grid-2026.a", round=3, group_weights=(2, 1, 0, 5),
                     tasks=(GroupTask(groups=(0, 3), components=(grr, grr2)), GroupTask(groups=(1,), components=(grr,))),
                     campaign_epsilon=2.0, max_reports_per_device=3, deadline=deadline, kind="grid")


@pytest.mark.parametrize("deadline", [None, 0.0, 1_790_000_000.0, 1_790_000_000.123456, 1.5, 99_999_999_999.999])
def test_round_spec_round_trip(deadline: float | None) -> None:
    spec = _spec(deadline)
    message = round_spec_to_proto(spec)
    assert message.HasField("deadline") is (deadline is not None)
    assert round_spec_from_proto(reports_pb2.RoundSpec.FromString(message.SerializeToString())) == spec
    assert round_spec_from_proto(message) == RoundSpec.unpack(spec.pack())  # both wire forms agree


def test_deadline_is_a_timestamp() -> None:
    message = round_spec_to_proto(_spec(1_790_000_000.25))
    assert (message.deadline.seconds, message.deadline.nanos) == (1_790_000_000, 250_000_000)
    message.deadline.nanos = 1_000_000_000
    with pytest.raises(ProtocolError, match=r"round_spec\.deadline: timestamp nanos must be in"):
        round_spec_from_proto(message)


@pytest.mark.parametrize("mutate,path", [
    (lambda m: setattr(m.tasks[0].components[1].mechanism.grr, "epsilon", 0.0),
     r"round_spec\.tasks\[0\]\.components\[1\]\.mechanism\.grr: epsilon must be in \(0, 20\], got 0"),
    (lambda m: m.tasks[1].components[0].mechanism.ClearField("grr"),
     r"round_spec\.tasks\[1\]\.components\[0\]\.mechanism: no mechanism kind is set"),
    (lambda m: m.tasks[0].components[0].ClearField("encoder"), r"round_spec\.tasks\[0\]\.components\[0\]"),
    (lambda m: setattr(m, "campaign_id", "bad id"), r"round_spec: campaign_id"),
    (lambda m: setattr(m, "max_reports_per_device", 0), r"max_reports_per_device must be in \[1, 1024\]"),
    (lambda m: m.ClearField("group_weights"), r"group_weights must have 1 to"),
    (lambda m: m.tasks[0].groups.append(9), r"task group 9 is outside"),
    (lambda m: setattr(m.tasks[0].components[0].encoder.categorical, "domain_size", 4),
     r"round_spec\.tasks\[0\]\.components\[0\]: encoder categorical output size 4 does not match"),
])
def test_bad_round_spec_raises_protocol_error_with_path(mutate: Any, path: str) -> None:
    message = round_spec_to_proto(_spec())
    mutate(message)
    with pytest.raises(ProtocolError, match=path):
        round_spec_from_proto(message)


def test_field_unknown_to_the_sdk_is_refused_unless_default() -> None:
    message = enc.UniformGridEncoder(domain=DOMAIN_2D)
    assert spec_from_proto(NumericDomain, message.domain) == NumericDomain(lower=(0.0, -1.0), upper=(1.0, 1.0))
    # Read a UniformGridEncoder as a NumericDomain: 'domain' is set and NumericDomain has no such field.
    with pytest.raises(ProtocolError, match="domain: field is set, but this ldp-client version does not support it"):
        spec_from_proto(NumericDomain, message)


def test_wrong_message_types_are_type_errors() -> None:
    with pytest.raises(TypeError, match="expected an ldp.v1.RoundSpec message"):
        round_spec_from_proto(reports_pb2.Report())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="spec must be a RoundSpec"):
        round_spec_to_proto(GRRParams(domain_size=2, epsilon=1.0))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        mechanism_to_proto(CategoricalEncoder(domain_size=2))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encoder_to_proto(GRRParams(domain_size=2, epsilon=1.0))  # type: ignore[arg-type]


def _report() -> Report:
    return Report(report_id=bytes(range(16)), campaign_id="c-1", round=2, group=4095,
                  payloads=(2**64 - 1, b"\x00\xff", HashedValue(2**64 - 1, 2**32 - 1), Integers((-(2**63), 2**63 - 1)),
                            Floats((0.5, -1.25, 2.0**100))))


def test_report_round_trip() -> None:
    report = _report()
    message = report_to_proto(report)
    assert [p.WhichOneof("value") for p in message.payloads] == ["index", "bits", "hashed", "integers", "floats"]
    assert report_from_proto(reports_pb2.Report.FromString(message.SerializeToString())) == report
    assert report_from_proto(message) == Report.unpack(report.pack())


@pytest.mark.parametrize("mutate,problem", [
    (lambda m: m.payloads[2].ClearField("hashed"), r"report\.payloads\[2\]: no payload value is set"),
    (lambda m: setattr(m, "report_id", b"short"), r"report: report_id must be 16 bytes"),
    (lambda m: setattr(m, "group", 5000), r"report: group must be in"),
    (lambda m: m.ClearField("payloads"), r"report: payloads must be a list of 1 to"),
    (lambda m: setattr(m, "campaign_id", ""), r"report: campaign_id"),
])
def test_bad_report_raises_protocol_error(mutate: Any, problem: str) -> None:
    message = report_to_proto(_report())
    mutate(message)
    with pytest.raises(ProtocolError, match=problem):
        report_from_proto(message)
