"""Labelling a point from a published clustering: the cell map's cell and label (-1 = noise), or the
exactly nearest published center; malformed results a device must refuse."""

from __future__ import annotations

from typing import Any

from ldp_client.clusters import CellClusterModel, CenterModel, ClusterModel
from ldp_client.encoders import NumericDomain, TreeCell
from ldp_client.encoders.geometry import tree_children
from ldp_client.errors import LdpError

from ._encoding import from_json, to_json

SECTION = "§15"

_SQUARE = NumericDomain(lower=(0.0, -1.0), upper=(1.0, 1.0))


def _cells(*pairs: tuple[int, int]) -> tuple[TreeCell, ...]:
    return tuple(TreeCell(level=level, morton_index=index) for level, index in pairs)


def _clustering(model: ClusterModel) -> dict[str, Any]:
    """The ``ldp.v1.Clustering`` of a model in JSON form (``.proto`` field names)."""
    if isinstance(model, CenterModel):
        return {"k": model.cluster_count, "dimension": model.dimension,
                "centers": [x for row in model.centers for x in row]}
    return {"dimension": model.domain.dimension, "cell_map": model.to_dict()}


def _model(clustering: dict[str, Any]) -> ClusterModel:
    """The SDK's model of a ``Clustering`` in JSON form, without protobuf: centers win over a cell map;
    ``dimension`` splits the centers into rows (the wire form, ``ldp_client.serde``, also infers an unset
    ``dimension`` from ``k``; every vector here sets it)."""
    data = from_json(clustering)
    if data.get("centers"):
        d = data["dimension"]
        values = data["centers"]
        if not d or len(values) % d:
            raise LdpError(f"{len(values)} center values are not rows of dimension {d}")
        return CenterModel(centers=tuple(tuple(values[i:i + d]) for i in range(0, len(values), d)))
    model = CellClusterModel.from_dict(data["cell_map"])
    if data.get("dimension", 0) not in (0, model.domain.dimension):
        raise LdpError("dimension differs from the cell map's domain dimension")
    return model


def _labels(model: ClusterModel, points: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"labels": [model.label(p) for p in points]}
    if isinstance(model, CellClusterModel):
        out["cells"] = [model.cell_position(p) for p in points]
    return out


def label_vector(name: str, model: ClusterModel, points: list[Any]) -> dict[str, Any]:
    """A vector: a published clustering, points and each point's label (and, for a cell map, its cell)."""
    return {"name": name, "input": {"clustering": to_json(_clustering(model)), "points": to_json(points)},
            "output": to_json(_labels(model, points))}


def error_vector(name: str, clustering: dict[str, Any], error: str, point: Any = None) -> dict[str, Any]:
    """A result a device MUST refuse, or (with ``point``) a point it MUST NOT label."""
    data: dict[str, Any] = {"clustering": to_json(clustering)}
    if point is not None:
        data["point"] = to_json(point)
    return {"name": name, "input": data, "output": {"error": error}}


def generate() -> list[dict[str, Any]]:
    quarters = (*tree_children(TreeCell(level=0, morton_index=0), 2)[1:],
                *tree_children(TreeCell(level=1, morton_index=0), 2))
    mixed = CellClusterModel(domain=_SQUARE, cells=quarters, labels=(0, 1, -1, 1, 0, -1, 0))
    good_map = mixed.to_dict()
    return [
        # Uniform level-2 map in Morton order (a uniform-variant grid result): boundaries go to the
        # upper cell, the upper face to the last one, outside points are clamped first.
        label_vector("uniform-level-2", CellClusterModel(
            domain=_SQUARE, cells=_cells(*((2, i) for i in range(16))),
            labels=(0, 0, 1, 1, 0, 0, 1, 1, -1, -1, 2, 2, -1, -1, 2, 2)),
            [[0.1, -0.9], [0.25, -1.0], [0.75, 0.5], [1.0, 1.0], [0.0, 0.0], [0.5, 0.0],
             [0.249, 0.49], [-3.0, 7.0], [2.0, -2.0], [0.6, -0.1]]),
        # Mixed levels (an adaptive or iterative-variant result): three level-1 quarters and the four
        # level-2 cells of the first; the list order is not Morton order.
        label_vector("mixed-levels-list-order", mixed,
                     [[0.9, -0.9], [0.1, 0.9], [0.9, 0.9], [0.3, -0.9], [0.1, -0.4], [0.25, -0.5],
                      [0.5, 0.0], [0.49999999999999994, -0.0000000000000001]]),
        # One dimension at level 3 with the §11.2 rounding: on [0.1, 0.7], 0.4 normalizes to 0.5 exactly.
        label_vector("one-dimension-level-3", CellClusterModel(
            domain=NumericDomain(lower=(0.1,), upper=(0.7,)),
            cells=_cells(*((3, i) for i in (7, 6, 5, 4, 3, 2, 1, 0))), labels=(3, 3, 2, -1, -1, 1, 0, 0)),
            [[0.1], [0.4], [0.325], [0.7], [0.69], [-1.0], [0.175]]),
        label_vector("whole-box-one-cell", CellClusterModel(
            domain=_SQUARE, cells=_cells((0, 0)), labels=(-1,)), [[0.5, 0.5], [9.0, -9.0]]),
        label_vector("all-noise-and-large-labels", CellClusterModel(
            domain=_SQUARE, cells=_cells((1, 0), (1, 1), (1, 2), (1, 3)), labels=(-1, 2**31 - 1, -1, 7)),
            [[0.1, -0.1], [0.9, -0.9], [0.1, 0.9], [0.9, 0.9]]),
        # Centers: domain units, no clamping; exact squared distances; exact ties to the lowest index.
        label_vector("centers-nearest-no-clamping", CenterModel(centers=((0.0, 0.0), (4.0, 0.0), (0.0, 3.0))),
                     [[0.1, -0.2], [3.5, 0.4], [-1.0, 2.9], [1e6, -1e6], [-1e6, 1e6]]),
        label_vector("centers-exact-ties-lowest-index", CenterModel(
            centers=((0.0, 0.0), (4.0, 0.0), (0.0, 3.0), (4.0, 0.0))),
            [[2.0, 0.0], [2.0, 1.5], [5.0, 5.5], [4.0, 0.0]]),
        label_vector("centers-rounded-distances-tie", CenterModel(centers=((-(2.0**-60),), (2.0**-60,))),
                     [[1.0], [-1.0], [0.0]]),
        label_vector("centers-beyond-the-largest-double", CenterModel(centers=((-1.7e308,), (-1e308,))),
                     [[8e307], [-1.5e308], [1.7e308]]),
        label_vector("one-center", CenterModel(centers=((7.0, 7.0, 7.0),)), [[0.0, 0.0, 0.0]]),
        error_vector("map-not-a-partition-gap", {"cell_map": {**good_map, "cells": good_map["cells"][1:],
                                                               "labels": good_map["labels"][1:]}},
                     "the cells do not partition the box"),
        error_vector("map-overlap", {"cell_map": {**good_map, "cells": [*good_map["cells"], {"level": 0,
                                                                                           "morton_index": 0}],
                                                   "labels": [*good_map["labels"], 0]}},
                     "the cells do not partition the box"),
        error_vector("map-labels-too-few", {"cell_map": {**good_map, "labels": good_map["labels"][:6]}},
                     "one label per cell"),
        error_vector("map-label-below-noise", {"cell_map": {**good_map, "labels": [*good_map["labels"][:6], -2]}},
                     "labels are in [-1, 2^31 - 1]"),
        error_vector("map-cell-outside-its-level", {"cell_map": {
            **good_map, "domain": {"lower": [0.0], "upper": [1.0]}}}, "morton_index < 2^(level d)"),
        error_vector("map-dimension-differs", {"dimension": 3, "cell_map": good_map},
                     "dimension differs from the cell map's domain dimension"),
        error_vector("centers-ragged", {"k": 2, "dimension": 2, "centers": [1.0, 2.0, 3.0]},
                     "centers are not whole rows of dimension"),
        error_vector("centers-not-finite", {"k": 2, "dimension": 1, "centers": [1.0, "NaN"]},
                     "center coordinates are finite"),
        error_vector("point-wrong-dimension", {"k": 1, "dimension": 2, "centers": [0.0, 0.0]},
                     "the point has the centers' dimension", point=[1.0]),
        error_vector("point-not-finite", {"cell_map": good_map}, "the point is finite", point=[0.5, "NaN"]),
    ]


def _wire_model(clustering: dict[str, Any]) -> ClusterModel | None:
    """The model ``ldp_client.serde`` reads from a finished ``Result`` carrying ``clustering``, where
    protobuf is installed (``None`` otherwise: the stdlib-only SDK checks the rest)."""
    try:
        from google.protobuf import json_format

        from ldp.v1 import campaigns_pb2
        from ldp_client.serde import cluster_model_from_proto
    except ImportError:
        return None
    result = campaigns_pb2.Result(campaign_id="vectors", state=campaigns_pb2.FINISHED)
    json_format.ParseDict(clustering, result.clustering)
    return cluster_model_from_proto(result)


def verify(vector: dict[str, Any]) -> None:
    name, data, output = vector["name"], vector["input"], vector["output"]
    if "error" in output:
        for build in (_model, _wire_model):
            _refused(name, data, output["error"], build)
        return
    model = _model(data["clustering"])
    got = to_json(_labels(model, from_json(data["points"])))
    assert got == output, f"{name}: {got} != {output}"
    wire = _wire_model(data["clustering"])
    if wire is not None:
        assert wire == model, f"{name}: the wire form reads another model"
    # Both ways: the model read back gives the published clustering of the input.
    assert to_json(_clustering(model)) == data["clustering"], f"{name}: the clustering does not round-trip"


def _refused(name: str, data: dict[str, Any], error: str, build: Any) -> None:
    try:
        model = build(data["clustering"])
        if model is None:
            return
        if "point" in data:
            model.label(from_json(data["point"]))
    except (LdpError, TypeError, ValueError):
        return
    raise AssertionError(f"{name}: accepted, but must be refused: {error}")
