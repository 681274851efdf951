"""Local cluster labels from a published clustering (ldp_client.clusters): validation, exact cell semantics, round trips."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ldp_client
from ldp_client.clusters import (
    NOISE,
    CellClusterModel,
    CenterModel,
    ClusterModel,
    cluster_model_from_dict,
)
from ldp_client.encoders import CellListEncoder, NumericDomain, TreeCell
from ldp_client.encoders.geometry import morton_decode, tree_cell_bounds, tree_children
from ldp_client.errors import EncodingError, InvalidParameterError, ProtocolError

DOMAIN2 = NumericDomain(lower=(-2.0, 10.0), upper=(2.0, 30.0))
ROOT = TreeCell(level=0, morton_index=0)


def _quadtree_cells() -> tuple[TreeCell, ...]:
    """Three level-1 quarters (positions 0-2), then the four level-2 cells of quarter 0 (positions 3-6)."""
    cells = list(tree_children(ROOT, 2))
    first = cells.pop(0)
    return (*cells, *tree_children(first, 2))


CELLS = _quadtree_cells()
LABELS = (0, 1, NOISE, 2, 0, NOISE, 2)


def _model(**changes: Any) -> CellClusterModel:
    fields: dict[str, Any] = {"domain": DOMAIN2, "cells": CELLS, "labels": LABELS}
    return CellClusterModel(**{**fields, **changes})


def _holding_cell(cells: tuple[TreeCell, ...], domain: NumericDomain, point: list[float]) -> int:
    """Brute force: the one listed cell whose integer coordinates hold the normalized, clamped point."""
    unit = domain.normalize(point)
    holders = []
    for i, c in enumerate(cells):
        side = 2**c.level
        coords = morton_decode(c.morton_index, domain.dimension, c.level)
        if all(x == min(int(t * side), side - 1) for x, t in zip(coords, unit)):
            holders.append(i)
    assert len(holders) == 1
    return holders[0]


@st.composite
def partitions(draw: st.DrawFn, dimension: int, max_level: int) -> tuple[TreeCell, ...]:
    """A random partition of the unit box: split cells recursively (levels differ), in a random order."""
    out: list[TreeCell] = []
    stack = [ROOT]
    while stack:
        cell = stack.pop()
        if cell.level < max_level and draw(st.booleans()):
            stack.extend(tree_children(cell, dimension))
        else:
            out.append(cell)
    return tuple(draw(st.permutations(out)))


# ------------------------------------------------------------------------------------------------
# CellClusterModel: validation
# ------------------------------------------------------------------------------------------------


def test_valid_model_fields_and_counts() -> None:
    model = _model(labels=list(LABELS), densities=[1.0] * 7, density_std_errors=(0.0, 0.5, 1, 2, 3, 4, 5))
    assert model.cells == CELLS and model.labels == LABELS  # lists become tuples
    assert model.density_std_errors == (0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0)
    assert isinstance(model.density_std_errors[2], float)
    assert model.cluster_count == 3
    assert _model(labels=(NOISE,) * 7).cluster_count == 0
    assert _model(labels=(5,) * 7).cluster_count == 1
    assert model.encoder == CellListEncoder(domain=DOMAIN2, cells=CELLS)
    assert model.encoder is model.encoder  # built once
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.labels = (0,) * 7  # type: ignore[misc]


@pytest.mark.parametrize("changes,error,message", [
    ({"cells": CELLS[1:], "labels": LABELS[1:]}, InvalidParameterError, r"cover the unit box exactly.*gaps"),
    ({"cells": (ROOT, *CELLS[:3]), "labels": LABELS[:4]}, InvalidParameterError, r"overlaps.*contains"),
    ({"cells": (*CELLS, CELLS[0]), "labels": (*LABELS, 0)}, InvalidParameterError, "repeats"),
    ({"cells": (), "labels": ()}, InvalidParameterError, "1 to"),
    ({"cells": (TreeCell(level=33, morton_index=0),), "labels": (0,)}, InvalidParameterError, r"level must be in \[0, 32\]"),
    ({"cells": ((1, 0),) * 7}, TypeError, "TreeCell"),
    ({"cells": "cells"}, TypeError, "cells must be a sequence"),
    ({"domain": (0.0, 1.0)}, TypeError, "NumericDomain"),
    ({"labels": LABELS[:6]}, InvalidParameterError, r"one label per cell \(7\), got 6"),
    ({"labels": (*LABELS[:6], -2)}, InvalidParameterError, r"labels\[6\] must be in \[-1, 2147483647\], got -2"),
    ({"labels": (*LABELS[:6], 2**31)}, InvalidParameterError, r"labels\[6\] must be in"),
    ({"labels": (*LABELS[:6], 1.0)}, TypeError, r"labels\[6\] must be an int"),
    ({"labels": (*LABELS[:6], True)}, TypeError, r"labels\[6\] must be an int"),
    ({"labels": 7}, TypeError, "labels must be a sequence"),
    ({"densities": (1.0,) * 6}, InvalidParameterError, r"densities must be empty or hold one value per cell \(7\), got 6"),
    ({"densities": (1.0,) * 6 + (math.nan,)}, InvalidParameterError, r"densities\[6\] must be finite"),
    ({"densities": ("1",) * 7}, TypeError, r"densities\[0\] must be a real number"),
    ({"density_std_errors": (1.0,) * 8}, InvalidParameterError, "density_std_errors must be empty"),
    ({"density_std_errors": (1.0,) * 6 + (-0.5,)}, InvalidParameterError, r"density_std_errors\[6\] must be >= 0"),
    ({"density_std_errors": (math.inf,) * 7}, InvalidParameterError, r"density_std_errors\[0\] must be finite"),
])
def test_invalid_models_are_rejected_with_clear_errors(changes: dict[str, Any], error: type[Exception],
                                                       message: str) -> None:
    with pytest.raises(error, match=message):
        _model(**changes)


def test_partition_errors_name_the_cells() -> None:
    with pytest.raises(InvalidParameterError, match=r"covers volume 15/16"):
        _model(cells=CELLS[:-1], labels=LABELS[:-1])
    with pytest.raises(InvalidParameterError, match=r"TreeCell\(level=1, morton_index=0\) contains TreeCell\(level=2"):
        _model(cells=(*CELLS, TreeCell(level=1, morton_index=0)), labels=(*LABELS, 0))


# ------------------------------------------------------------------------------------------------
# CellClusterModel: labels
# ------------------------------------------------------------------------------------------------


def test_points_inside_each_cell_get_its_label() -> None:
    model = _model()
    for i, cell in enumerate(CELLS):
        (lo0, lo1), (hi0, hi1) = tree_cell_bounds(cell, 2, DOMAIN2)
        for f0, f1 in [(0.5, 0.5), (0.01, 0.99), (0.99, 0.01), (0.25, 0.75)]:
            point = [lo0 + f0 * (hi0 - lo0), lo1 + f1 * (hi1 - lo1)]
            assert model.cell_position(point) == i
            assert model.label(point) == LABELS[i], (cell, point)


def test_cells_of_different_sizes_hand_values() -> None:
    model = CellClusterModel(domain=NumericDomain.unit(2), cells=CELLS, labels=(10, 11, 12, 13, 14, 15, 16))
    assert model.label([0.9, 0.1]) == 10  # level-1 quarter (1, 0)
    assert model.label([0.1, 0.9]) == 11  # level-1 quarter (0, 1)
    assert model.label([0.9, 0.9]) == 12  # level-1 quarter (1, 1)
    assert model.label([0.1, 0.1]) == 13  # level-2 cells of quarter (0, 0)
    assert model.label([0.3, 0.1]) == 14
    assert model.label([0.1, 0.3]) == 15
    assert model.label([0.3, 0.3]) == 16


def test_shared_boundaries_follow_the_encoder() -> None:
    """Cells are half-open [lower, upper), the last cell along a dimension holds the upper face."""
    model = CellClusterModel(domain=NumericDomain.unit(2), cells=CELLS, labels=(10, 11, 12, 13, 14, 15, 16))
    assert model.label([0.25, 0.25]) == 16  # corner of four level-2 cells: the upper-right one
    assert model.label([0.5, 0.5]) == 12  # corner of three quarters and a level-2 cell: quarter (1, 1)
    assert model.label([0.5, 0.1]) == 10  # face between a level-2 cell and a quarter: the quarter
    assert model.label([0.1, 0.5]) == 11
    assert model.label([0.25, 0.0]) == 14  # face between two level-2 cells
    assert model.label([1.0, 1.0]) == 12 and model.label([1.0, 0.0]) == 10 and model.label([0.0, 1.0]) == 11
    assert model.label([0.0, 0.0]) == 13
    # every corner of every cell, in the domain's own units: the encoder's cell, the brute-force cell
    model = _model()
    for cell in CELLS:
        lower, upper = tree_cell_bounds(cell, 2, DOMAIN2)
        for x in (lower[0], upper[0]):
            for y in (lower[1], upper[1]):
                position = model.encoder.encode([x, y])
                assert position == _holding_cell(CELLS, DOMAIN2, [x, y])
                assert model.label([x, y]) == LABELS[position]


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=2))
def test_outside_points_are_clamped_like_the_encoder(point: list[float]) -> None:
    model = _model()
    clamped = [min(max(x, lo), hi) for x, lo, hi in zip(point, DOMAIN2.lower, DOMAIN2.upper)]
    assert model.label(point) == model.label(clamped) == LABELS[model.encoder.encode(point)]
    assert model.label(point) == LABELS[_holding_cell(CELLS, DOMAIN2, point)]


def test_clamping_hand_values() -> None:
    model = CellClusterModel(domain=NumericDomain.unit(2), cells=CELLS, labels=(10, 11, 12, 13, 14, 15, 16))
    assert model.label([5.0, -3.0]) == 10 and model.label([-1.0, 7.0]) == 11 and model.label([9.0, 9.0]) == 12
    assert model.label([-1e300, -1e300]) == 13 and model.label([0.3, -1.0]) == 14


@pytest.mark.parametrize("point,message", [
    ([0.0], "dimension 2, got 1"),
    ([0.0, 12.0, 1.0], "dimension 2, got 3"),
    ([math.nan, 12.0], "coordinate 0 must be finite"),
    ([0.0, math.inf], "coordinate 1 must be finite"),
    ([0.0, None], "coordinate 1 must be a real number"),
    ("ab", "sequence"),
    (3.0, "sequence"),
])
def test_bad_points_raise_the_encoders_error(point: Any, message: str) -> None:
    model = _model()
    with pytest.raises(EncodingError, match=message):
        model.label(point)
    with pytest.raises(EncodingError):
        model.encoder.encode(point)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_partitions_and_points_give_the_holding_cells_label(data: st.DataObject) -> None:
    dimension = data.draw(st.integers(1, 3))
    cells = data.draw(partitions(dimension, max_level={1: 5, 2: 3, 3: 2}[dimension]))
    labels = tuple(data.draw(st.lists(st.integers(NOISE, 4), min_size=len(cells), max_size=len(cells))))
    lower = tuple(data.draw(st.lists(st.floats(-100, 100), min_size=dimension, max_size=dimension)))
    domain = NumericDomain(lower=lower, upper=tuple(lo + data.draw(st.floats(0.5, 50)) for lo in lower))
    model = CellClusterModel(domain=domain, cells=cells, labels=labels)
    assert model.cluster_count == len(set(labels) - {NOISE})
    for _ in range(5):
        point = data.draw(st.lists(st.floats(-200, 200, allow_nan=False), min_size=dimension, max_size=dimension))
        label = model.label(point)
        assert label in labels
        assert label == labels[_holding_cell(cells, domain, point)] == labels[model.encoder.encode(point)]


# ------------------------------------------------------------------------------------------------
# CellClusterModel: plain-data form
# ------------------------------------------------------------------------------------------------


def test_cell_model_dict_round_trip() -> None:
    model = _model(densities=(0.1, 0.2, -0.05, 0.3, 0.2, 0.0, 0.25), density_std_errors=(0.01,) * 7)
    data = model.to_dict()
    assert data["labels"] == list(LABELS) and data["cells"][0] == {"level": 1, "morton_index": 1}
    assert data["domain"] == {"lower": [-2.0, 10.0], "upper": [2.0, 30.0]}
    again = CellClusterModel.from_dict(data)
    assert again == model and again.label([1.5, 12.0]) == model.label([1.5, 12.0])
    assert cluster_model_from_dict(data) == model
    unpacked = msgpack.unpackb(msgpack.packb(data), strict_map_key=False)
    assert CellClusterModel.from_dict(unpacked) == model and cluster_model_from_dict(unpacked) == model
    plain = _model()
    assert plain.to_dict()["densities"] == [] and CellClusterModel.from_dict(plain.to_dict()) == plain


def test_cell_model_from_bad_dict_is_a_protocol_error() -> None:
    data = _model().to_dict()
    with pytest.raises(ProtocolError, match="unknown field"):
        CellClusterModel.from_dict({**data, "colour": 1})
    with pytest.raises(ProtocolError, match=r"CellClusterModel: .*gaps"):
        CellClusterModel.from_dict({**data, "cells": data["cells"][1:], "labels": data["labels"][1:]})
    with pytest.raises(ProtocolError, match=r"CellClusterModel: .*labels\[0\] must be in"):
        CellClusterModel.from_dict({**data, "labels": [-7] + data["labels"][1:]})
    with pytest.raises(ProtocolError, match="expected a mapping"):
        CellClusterModel.from_dict([data])
    with pytest.raises(ProtocolError, match="domain"):
        CellClusterModel.from_dict({k: v for k, v in data.items() if k != "domain"})


# ------------------------------------------------------------------------------------------------
# CenterModel
# ------------------------------------------------------------------------------------------------

CENTERS = ((0.0, 0.0), (4.0, 0.0), (0.0, 3.0))


def test_center_model_nearest_and_ties() -> None:
    model = CenterModel(centers=CENTERS)
    assert (model.cluster_count, model.dimension) == (3, 2)
    assert model.label([0.1, -0.2]) == 0 and model.label((3.5, 0.4)) == 1 and model.label([-1.0, 2.9]) == 2
    assert model.label([2.0, 0.0]) == 0  # equidistant from centers 0 and 1: the lowest index
    assert model.label([2.0, 1.5]) == 0  # equidistant from all three
    assert model.label([5.0, 5.5]) == 1  # equidistant from centers 1 and 2 (squared distance 31.25), farther from 0
    assert model.label([1e6, -1e6]) == 1  # no domain, no clamping
    duplicated = CenterModel(centers=((1.0,), (1.0,), (0.0,)))
    assert duplicated.label([1.0]) == 0 and duplicated.label([5]) == 0 and duplicated.label([-5]) == 2


def test_center_model_extreme_coordinates_do_not_overflow() -> None:
    model = CenterModel(centers=((1e300, 1e300), (-1e300, -1e300)))
    assert model.label([9e299, 9e299]) == 0 and model.label([-9e299, -1e300]) == 1
    tiny = CenterModel(centers=((0.0,), (3e-320,)))
    assert tiny.label([2e-320]) == 1 and tiny.label([1e-320]) == 0


def test_center_model_decides_rounded_ties_exactly_like_the_nearest_candidate_encoder() -> None:
    # From 1 the centers -2^-60 and 2^-60 are 1 + 2^-60 and 1 - 2^-60 away: equal once rounded to
    # binary64 (math.dist gives 1.0 for both), but the second is nearer (docs/protocol.md §11.7, §15.3).
    model = CenterModel(centers=((-(2.0**-60),), (2.0**-60,)))
    assert math.dist([1.0], model.centers[0]) == math.dist([1.0], model.centers[1])
    assert model.label([1.0]) == 1 and model.label([-1.0]) == 0
    # Distances beyond the largest double are still compared exactly.
    assert CenterModel(centers=((-1.7e308,), (-1e308,))).label([8e307]) == 1


@given(st.lists(st.lists(st.integers(-20, 20), min_size=3, max_size=3), min_size=1, max_size=12),
       st.lists(st.integers(-30, 30), min_size=3, max_size=3))
def test_center_model_matches_brute_force_squared_distances(rows: list[list[int]], point: list[int]) -> None:
    model = CenterModel(centers=tuple(tuple(float(x) for x in row) for row in rows))
    squared = [sum((p - c) ** 2 for p, c in zip(point, row)) for row in rows]  # exact on integers
    assert model.label(point) == squared.index(min(squared))
    assert 0 <= model.label([float(x) for x in point]) < model.cluster_count


@pytest.mark.parametrize("centers,error,message", [
    ((), InvalidParameterError, "at least one center"),
    (((),), InvalidParameterError, r"dimension in \[1, 4096\], got 0"),
    (((0.0, 1.0), (2.0,)), InvalidParameterError, r"dimension 2 \(centers\[0\]\), got 1 in centers\[1\]"),
    (((0.0, math.nan),), InvalidParameterError, r"centers\[0\]\[1\] must be finite"),
    (((0.0, -math.inf),), InvalidParameterError, r"must be finite"),
    (((0.0, "1"),), TypeError, r"centers\[0\]\[1\] must be a real number"),
    (((True, 1.0),), TypeError, "must be a real number"),
    ((1.0, 2.0), TypeError, r"centers\[0\] must be a sequence"),
    ("centers", TypeError, "centers must be a sequence"),
    (((0.0,),) * (2**22 + 1), InvalidParameterError, "at most 4194304 coordinates"),
])
def test_invalid_center_models_are_rejected(centers: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        CenterModel(centers=centers)


@pytest.mark.parametrize("point,message", [
    ([0.0], "dimension 2, got 1"),
    ([0.0, 0.0, 0.0], "dimension 2, got 3"),
    ([math.nan, 0.0], "coordinate 0 must be finite"),
    ([0.0, -math.inf], "coordinate 1 must be finite"),
    ([0.0, None], "coordinate 1 must be a real number"),
    (b"xy", "sequence"),
])
def test_center_model_bad_points(point: Any, message: str) -> None:
    with pytest.raises(EncodingError, match=message):
        CenterModel(centers=CENTERS).label(point)


def test_center_model_dict_round_trip() -> None:
    model = CenterModel(centers=[[0, 0], (4.5, -1e-9), [0.0, 3.0]])  # type: ignore[arg-type]
    assert model.centers == ((0.0, 0.0), (4.5, -1e-9), (0.0, 3.0)) and isinstance(model.centers[0][0], float)
    data = model.to_dict()
    assert data == {"centers": [[0.0, 0.0], [4.5, -1e-9], [0.0, 3.0]]}
    assert CenterModel.from_dict(data) == model and cluster_model_from_dict(data) == model
    assert CenterModel.from_dict(msgpack.unpackb(msgpack.packb(data))) == model
    with pytest.raises(ProtocolError, match="unknown field"):
        CenterModel.from_dict({**data, "k": 3})
    with pytest.raises(ProtocolError, match="missing field 'centers'"):
        CenterModel.from_dict({})
    with pytest.raises(ProtocolError, match=r"CenterModel: .*must be finite"):
        CenterModel.from_dict({"centers": [[math.nan]]})
    with pytest.raises(ProtocolError, match="stored: expected a mapping"):
        CenterModel.from_dict("centers", where="stored")


def test_cluster_model_from_dict_dispatch_errors() -> None:
    with pytest.raises(ProtocolError, match="'centers'.*'cells'.*got keys \\['x'\\]"):
        cluster_model_from_dict({"x": 1})
    with pytest.raises(ProtocolError, match="cluster_model: expected a mapping"):
        cluster_model_from_dict([1, 2])
    with pytest.raises(ProtocolError, match=r"stored: .*at least one center"):
        cluster_model_from_dict({"centers": []}, where="stored")


def test_both_models_are_cluster_models() -> None:
    models: list[ClusterModel] = [_model(), CenterModel(centers=CENTERS)]
    for model in models:
        assert isinstance(model, (CellClusterModel, CenterModel))
        assert cluster_model_from_dict(model.to_dict()) == model
        assert isinstance(model.label([0.0, 11.0]), int)


# ------------------------------------------------------------------------------------------------
# Lazy exports
# ------------------------------------------------------------------------------------------------


def test_lazy_exports_from_the_package() -> None:
    assert ldp_client.CellClusterModel is CellClusterModel and ldp_client.CenterModel is CenterModel
    assert ldp_client.ClusterModel == ClusterModel and ldp_client.cluster_model_from_dict is cluster_model_from_dict
    assert {"CellClusterModel", "CenterModel", "ClusterModel", "cluster_model_from_dict"} <= set(dir(ldp_client))


def test_labelling_imports_neither_numpy_nor_protobuf_nor_grpc() -> None:
    code = ("import sys, ldp_client; ldp_client.CellClusterModel; ldp_client.CenterModel; "
            "import ldp_client.clusters; "
            "bad = [m for m in ('grpc', 'google.protobuf', 'numpy', 'ldp.v1') if sys.modules.get(m) is not None]; "
            "sys.exit(str(bad) if bad else 0)")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
