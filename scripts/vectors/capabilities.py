"""Capabilities: the list a round spec requires, derived from its tasks, and what a device lacks.

Three kinds of vectors. ``required``: the input ``round_spec`` is a ``RoundSpec`` in the proto3 JSON
form with the ``.proto`` field names (a oneof member is the key of its message: ``{"grid_tree":
{...}}``; enum values are numbers), without ``required_capabilities``; the output is the list a
collector states (sorted, each name once). ``stated``: the same spec with a stated list; the output is
that list as the device keeps it, or an error when it differs from the derived one. ``missing``:
required and supported names; the output is what the device lacks (sorted), which a collector
answers with ``MISSING_CAPABILITIES`` and a device declines by.
"""

from __future__ import annotations

from typing import Any

from ldp_client.capabilities import check_capability_names, missing_capabilities
from ldp_client.encoders.base import Encoder, NumericDomain
from ldp_client.encoders.bitvector import BitVectorEncoder
from ldp_client.encoders.bucketed import BucketedVectorEncoder
from ldp_client.encoders.categorical import CategoricalEncoder
from ldp_client.encoders.geometry import TreeCell
from ldp_client.encoders.grid import CellListEncoder, GridTreeEncoder, UniformGridEncoder
from ldp_client.encoders.lsh import ShiftedGridEncoder, SimHashEncoder
from ldp_client.encoders.nearest import NearestCandidateEncoder
from ldp_client.encoders.projection import RandomProjection
from ldp_client.encoders.vectors import SymmetricBoxEncoder, UnitBallEncoder, UnitCubeEncoder
from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms.base import MechanismParams
from ldp_client.mechanisms.bitwise_randomized_response import BitwiseRRParams
from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams, VectorShape
from ldp_client.mechanisms.discrete_laplace import DiscreteLaplaceParams
from ldp_client.mechanisms.local_hashing import LocalHashingParams
from ldp_client.mechanisms.randomized_response import GRRParams
from ldp_client.mechanisms.unary_encoding import oue, sue
from ldp_client.mechanisms.vector_box import VectorBoxParams
from ldp_client.mechanisms.vector_l2_ball import VectorL2BallParams
from ldp_client.mechanisms.vector_privunit import VectorPrivUnitParams
from ldp_client.spec import Component, GroupTask, RoundSpec

SECTION = "§10"

_BOX = NumericDomain(lower=(0.0, 0.0), upper=(1.0, 1.0))
_PROJECTION = RandomProjection(input_dimension=2, output_dimension=1, seed=7)


def _one(encoder: Encoder, mechanism: MechanismParams) -> list[Component]:
    return [Component(encoder=encoder, mechanism=mechanism)]


def _bucketized(encoder: BucketedVectorEncoder, shape: VectorShape) -> list[Component]:
    return _one(encoder, BucketizedVectorParams(bucket_bits=encoder.bucket_bits, dimension=3, epsilon=2.0, shape=shape))


def _cases() -> list[tuple[str, list[list[Component]]]]:
    """(name, the components of each task)."""
    grr16 = GRRParams(domain_size=16, epsilon=1.0)
    return [
        ("categorical-grr", [_one(CategoricalEncoder(domain_size=16), grr16)]),
        ("categorical-sue", [_one(CategoricalEncoder(domain_size=16), sue(16, 1.0))]),
        ("categorical-oue-and-olh-in-two-tasks", [_one(CategoricalEncoder(domain_size=16), oue(16, 1.0)),
                                                  _one(CategoricalEncoder(domain_size=16),
                                                       LocalHashingParams(domain_size=16, epsilon=1.0))]),
        ("categorical-olh-seed-pool", [_one(CategoricalEncoder(domain_size=16),
                                            LocalHashingParams(domain_size=16, epsilon=1.0, seed_pool_size=8,
                                                               seed_pool_key=5))]),
        ("uniform-grid", [_one(UniformGridEncoder(domain=_BOX, cells_per_dimension=(4, 4)), grr16)]),
        ("grid-tree", [_one(GridTreeEncoder(domain=_BOX, level=2), grr16)]),
        ("cell-list", [_one(CellListEncoder(domain=_BOX, cells=tuple(TreeCell(level=1, morton_index=i)
                                                                     for i in range(4))),
                            GRRParams(domain_size=4, epsilon=1.0))]),
        ("simhash-projected", [_one(SimHashEncoder(domain=_BOX, projection=_PROJECTION, bits=3, seed=1),
                                    GRRParams(domain_size=8, epsilon=1.0))]),
        ("shifted-grid", [_one(ShiftedGridEncoder(domain=_BOX, level=1, seed=2), GRRParams(domain_size=4, epsilon=1.0))]),
        ("nearest-candidate", [_one(NearestCandidateEncoder(domain=_BOX, dimension=2, centers=(0.2, 0.2, 0.8, 0.8)),
                                    GRRParams(domain_size=2, epsilon=1.0))]),
        ("bit-vector", [_one(BitVectorEncoder(domain=_BOX, pivots=(0.5, 0.5), pivots_per_attribute=(1, 1),
                                              half_widths=(0.25, 0.25)),
                             BitwiseRRParams(length=2, epsilon=1.0, sensitivity=2))]),
        ("discrete-laplace", [_one(UnitCubeEncoder(domain=_BOX), DiscreteLaplaceParams(dimension=2, epsilon=1.0,
                                                                                        grid_bits=4))]),
        ("vector-box", [_one(SymmetricBoxEncoder(domain=_BOX), VectorBoxParams(dimension=2, epsilon=1.0))]),
        ("vector-l2-ball", [_one(UnitBallEncoder(domain=_BOX), VectorL2BallParams(dimension=2, epsilon=1.0))]),
        ("vector-privunit", [_one(UnitBallEncoder(domain=_BOX), VectorPrivUnitParams(dimension=2, epsilon=1.0))]),
        ("bucketized-simhash-projected-box", [_bucketized(BucketedVectorEncoder(
            domain=_BOX, simhash=SimHashEncoder(domain=_BOX, projection=_PROJECTION, bits=2, seed=3)), VectorShape.BOX)]),
        ("bucketized-shifted-grid-l2-ball", [_bucketized(BucketedVectorEncoder(
            domain=_BOX, shifted_grid=ShiftedGridEncoder(domain=_BOX, level=1, seed=4)), VectorShape.L2_BALL)]),
        ("bucketized-nearest-privunit", [_bucketized(BucketedVectorEncoder(
            domain=_BOX, nearest=NearestCandidateEncoder(domain=_BOX, dimension=2, centers=(0.2, 0.2, 0.8, 0.8))),
            VectorShape.PRIVUNIT)]),
        ("two-components-one-task", [[*_one(GridTreeEncoder(domain=_BOX, level=1), GRRParams(domain_size=4, epsilon=1.0)),
                                      *_one(SymmetricBoxEncoder(domain=_BOX), VectorBoxParams(dimension=2, epsilon=1.0))]]),
    ]


def _spec(tasks: list[list[Component]]) -> RoundSpec:
    return RoundSpec(campaign_id="vectors", round=1, group_weights=(1,) * len(tasks),
                     tasks=tuple(GroupTask(groups=(g,), components=tuple(cs)) for g, cs in enumerate(tasks)),
                     campaign_epsilon=8.0)


def _wire(spec: RoundSpec, stated: list[str] | None) -> dict[str, Any]:
    data = spec.to_dict()
    data.pop("required_capabilities")
    if stated is not None:
        data["required_capabilities"] = stated
    return data


_MISSING = [
    ("full-device", ["encoder.grid_tree", "mechanism.local_hashing"], ["encoder.grid_tree", "mechanism.grr",
                                                                       "mechanism.local_hashing"]),
    ("no-local-hashing", ["encoder.grid_tree", "mechanism.local_hashing"], ["encoder.grid_tree", "mechanism.grr"]),
    ("unknown-future-encoder", ["encoder.from_the_future", "mechanism.grr", "encoder.categorical"],
     ["encoder.categorical", "mechanism.grr"]),
    ("nothing-supported", ["mechanism.grr", "encoder.categorical"], ["mechanism.unary_encoding"]),
]


def generate() -> list[dict[str, Any]]:
    vectors: list[dict[str, Any]] = []
    for name, tasks in _cases():
        spec = _spec(tasks)
        vectors.append({"name": f"required-{name}", "input": {"round_spec": _wire(spec, None)},
                        "output": {"required_capabilities": list(spec.required_capabilities)}})
    spec = _spec(_cases()[2][1])  # OUE and OLH in two tasks
    derived = list(spec.required_capabilities)
    for name, stated, output in [
        ("equal-in-another-order", list(reversed(derived)), {"required_capabilities": derived}),
        ("empty-means-derive", [], {"required_capabilities": derived}),
        ("one-task-only", derived[:2], {"error": "the stated list differs from the tasks' (a name is missing)"}),
        ("extra-name", [*derived, "mechanism.grr"], {"error": "the stated list differs from the tasks' (an extra name)"}),
        ("name-twice", [*derived, derived[0]], {"error": "a name is listed twice"}),
        ("malformed-name", [*derived[:-1], "Mechanism.Local_Hashing"], {"error": "a name breaks the name syntax"}),
    ]:
        vectors.append({"name": f"stated-{name}", "input": {"round_spec": _wire(spec, stated)}, "output": output})
    for name, required, supported in _MISSING:
        vectors.append({"name": f"missing-{name}", "input": {"required": required, "supported": supported},
                        "output": {"missing": list(missing_capabilities(required, supported))}})
    return vectors


def verify(vector: dict[str, Any]) -> None:
    name, given, expected = vector["name"], vector["input"], vector["output"]
    if "required" in given:
        check_capability_names(given["supported"])
        got = list(missing_capabilities(given["required"], given["supported"]))
        assert got == expected["missing"], f"{name}: {got} != {expected['missing']}"
        return
    try:
        spec = RoundSpec.from_dict(given["round_spec"])
    except (ProtocolError, InvalidParameterError) as exc:
        assert "error" in expected, f"{name}: refused ({exc}) but expected {expected}"
        return
    assert "error" not in expected, f"{name}: accepted but expected an error ({expected['error']})"
    assert list(spec.required_capabilities) == expected["required_capabilities"], (
        f"{name}: {list(spec.required_capabilities)} != {expected['required_capabilities']}")
