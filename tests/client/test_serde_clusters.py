"""Published clusterings (ldp.v1.Result / Clustering) <-> local labelling models: conversions and clear errors."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("google.protobuf")
pytest.importorskip("ldp.v1")

from ldp.v1 import campaigns_pb2 as camp
from ldp.v1 import encoders_pb2 as enc
from ldp_client.clusters import CellClusterModel, CenterModel
from ldp_client.encoders import NumericDomain, TreeCell
from ldp_client.encoders.geometry import tree_children
from ldp_client.errors import ProtocolError
from ldp_client.serde import cluster_model_from_proto, cluster_model_to_proto

DOMAIN = NumericDomain(lower=(0.0, -1.0), upper=(1.0, 1.0))
#: Three level-1 quarters, then the four level-2 cells of quarter 0.
CELLS = (*tree_children(TreeCell(level=0, morton_index=0), 2)[1:],
         *tree_children(TreeCell(level=1, morton_index=0), 2))
LABELS = (0, 1, -1, 1, 0, -1, 0)


def _cell_map(**changes: Any) -> camp.CellClusterMap:
    fields: dict[str, Any] = {
        "domain": enc.NumericDomain(lower=DOMAIN.lower, upper=DOMAIN.upper),
        "cells": [enc.TreeCell(level=c.level, morton_index=c.morton_index) for c in CELLS],
        "labels": LABELS,
        "densities": [0.3, 0.2, 0.01, 0.1, 0.2, 0.0, 0.19],
        "density_std_errors": [0.01] * 7,
    }
    return camp.CellClusterMap(**{**fields, **changes})


def _result(clustering: camp.Clustering | None, state: int = camp.FINISHED) -> camp.Result:
    result = camp.Result(campaign_id="grid-1", state=state)  # type: ignore[arg-type]
    if clustering is not None:
        result.clustering.CopyFrom(clustering)
    return result


CENTERS = camp.Clustering(k=3, dimension=2, centers=[0.1, 0.2, 0.5, -0.5, 0.9, 0.8], weights=[10, 20, 30])


def test_cell_map_becomes_a_cell_cluster_model() -> None:
    model = cluster_model_from_proto(_result(camp.Clustering(k=2, dimension=2, cell_map=_cell_map())))
    assert isinstance(model, CellClusterModel)
    assert model == CellClusterModel(domain=DOMAIN, cells=CELLS, labels=LABELS,
                                     densities=(0.3, 0.2, 0.01, 0.1, 0.2, 0.0, 0.19), density_std_errors=(0.01,) * 7)
    assert model.cluster_count == 2
    assert model.label([0.9, -0.9]) == 0 and model.label([0.1, 0.9]) == 1 and model.label([0.9, 0.9]) == -1
    assert model.label([0.3, -0.9]) == 0 and model.label([0.1, -0.4]) == -1  # level-2 cells
    bare = cluster_model_from_proto(_result(camp.Clustering(cell_map=_cell_map(densities=[], density_std_errors=[]))))
    assert isinstance(bare, CellClusterModel) and bare.densities == () and bare.labels == LABELS


def test_centers_become_a_center_model() -> None:
    model = cluster_model_from_proto(_result(CENTERS))
    assert isinstance(model, CenterModel)
    assert model.centers == ((0.1, 0.2), (0.5, -0.5), (0.9, 0.8))
    assert model.label([0.0, 0.0]) == 0 and model.label([0.6, -0.6]) == 1 and model.label([5.0, 5.0]) == 2
    # dimension unset: inferred from k
    inferred = cluster_model_from_proto(_result(camp.Clustering(k=2, centers=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])))
    assert isinstance(inferred, CenterModel) and inferred.centers == ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))
    # the rows decide k, with the dimension given
    rows = cluster_model_from_proto(_result(camp.Clustering(k=5, dimension=1, centers=[1.0, 2.0])))
    assert isinstance(rows, CenterModel) and rows.cluster_count == 2


def test_centers_win_over_a_cell_map() -> None:
    both = camp.Clustering()
    both.CopyFrom(CENTERS)
    both.cell_map.CopyFrom(_cell_map())
    assert isinstance(cluster_model_from_proto(_result(both)), CenterModel)


@pytest.mark.parametrize("state,name", [(camp.COLLECTING, "COLLECTING"), (camp.FAILED, "FAILED"),
                                        (camp.CAMPAIGN_STATE_UNSPECIFIED, "CAMPAIGN_STATE_UNSPECIFIED"),
                                        (17, "17")])
def test_unfinished_results_are_refused(state: int, name: str) -> None:
    with pytest.raises(ProtocolError, match=rf"result.state: campaign 'grid-1' is {name}, not FINISHED"):
        cluster_model_from_proto(_result(CENTERS, state=state))


@pytest.mark.parametrize("clustering,where,problem", [
    (None, r"result\.clustering", "published no clustering"),
    (camp.Clustering(k=3, dimension=2), r"result\.clustering", "neither centers nor a cell map"),
    (camp.Clustering(cell_map=camp.CellClusterMap()), r"result\.clustering", "neither centers nor a cell map"),
    (camp.Clustering(dimension=2, centers=[1.0, 2.0, 3.0]), r"result\.clustering\.centers",
     "3 values are not a whole number of centers of dimension 2"),
    (camp.Clustering(k=2, centers=[1.0, 2.0, 3.0]), r"result\.clustering\.dimension", "unset"),
    (camp.Clustering(centers=[1.0, 2.0]), r"result\.clustering\.dimension", "k = 0"),
    (camp.Clustering(dimension=1, centers=[1.0, float("nan")]), r"result\.clustering\.centers",
     r"centers\[1\]\[0\] must be finite"),
    (camp.Clustering(cell_map=_cell_map(domain=None)), r"result\.clustering\.cell_map\.domain", "no domain"),
    (camp.Clustering(cell_map=_cell_map(labels=LABELS[:6])), r"result\.clustering\.cell_map",
     r"one label per cell \(7\), got 6"),
    (camp.Clustering(cell_map=_cell_map(labels=(*LABELS[:6], -2))), r"result\.clustering\.cell_map",
     r"labels\[6\] must be in \[-1, "),
    (camp.Clustering(cell_map=_cell_map(cells=_cell_map().cells[1:], labels=LABELS[1:], densities=[],
                                        density_std_errors=[])),
     r"result\.clustering\.cell_map", "cover the unit box exactly"),
    (camp.Clustering(cell_map=_cell_map(densities=[1.0])), r"result\.clustering\.cell_map",
     "densities must be empty or hold one value per cell"),
    (camp.Clustering(cell_map=_cell_map(density_std_errors=[-1.0] * 7)), r"result\.clustering\.cell_map",
     "must be >= 0"),
    (camp.Clustering(dimension=3, cell_map=_cell_map()), r"result\.clustering\.dimension",
     "3 differs from the cell map's domain dimension 2"),
    (camp.Clustering(cell_map=_cell_map(domain=enc.NumericDomain(lower=[0.0], upper=[1.0]))),
     r"result\.clustering\.cell_map", r"level-1 cell in dimension 1 must be in \[0, 2\^1\)"),
])
def test_bad_clusterings_raise_protocol_errors_naming_the_field(clustering: camp.Clustering | None, where: str,
                                                                problem: str) -> None:
    with pytest.raises(ProtocolError, match=rf"{where}.*{problem}"):
        cluster_model_from_proto(_result(clustering))


def test_wrong_message_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="expected an ldp.v1.Result message, got Clustering"):
        cluster_model_from_proto(CENTERS)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="CellClusterModel or a CenterModel"):
        cluster_model_to_proto(DOMAIN)  # type: ignore[arg-type]


def test_models_round_trip_through_clustering_messages() -> None:
    cell_model = CellClusterModel(domain=DOMAIN, cells=CELLS, labels=LABELS, densities=(0.5,) * 7)
    message = cluster_model_to_proto(cell_model)
    assert isinstance(message, camp.Clustering) and message.HasField("cell_map")
    assert (message.k, message.dimension, list(message.centers)) == (2, 2, [])
    assert list(message.cell_map.labels) == list(LABELS) and list(message.cell_map.density_std_errors) == []
    assert message.cell_map.cells[3] == enc.TreeCell(level=2, morton_index=0)
    assert cluster_model_from_proto(_result(message)) == cell_model

    center_model = CenterModel(centers=((0.1, 0.2, 0.3), (-1.0, 2.5, 1e300)))
    message = cluster_model_to_proto(center_model)
    assert (message.k, message.dimension, list(message.centers)) == (2, 3, [0.1, 0.2, 0.3, -1.0, 2.5, 1e300])
    assert not message.HasField("cell_map")
    assert cluster_model_from_proto(_result(message)) == center_model
    wire = camp.Result.FromString(_result(message).SerializeToString())
    assert cluster_model_from_proto(wire) == center_model
