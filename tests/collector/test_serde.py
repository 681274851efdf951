"""The collector's protobuf boundary for results (:mod:`ldp_collector.serde`) and the model's labelling helpers.

Round trips with every field set (a cell map and diagnostics included), the stored format (results
and estimates written by the code that built ``ldp.v1`` messages directly still read, and read back
to the same wire message), and :meth:`ldp_collector.model.Result.label_model`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ldp.v1 import campaigns_pb2, encoders_pb2
from ldp_client.clusters import CellClusterModel, CenterModel
from ldp_client.encoders import CategoricalEncoder, NumericDomain
from ldp_client.encoders.geometry import TreeCell
from ldp_client.errors import ProtocolError
from ldp_client.mechanisms import GRRParams
from ldp_client.serde import cluster_model_from_proto, encoder_to_proto, mechanism_to_proto
from ldp_collector.campaigns import FINISHED
from ldp_collector.core import Collector
from ldp_collector.model import CampaignState, Clustering, Estimate, Estimates, HeavyHitter, Result
from ldp_collector.serde import (
    config_from_proto,
    estimates_from_bytes,
    estimates_from_proto,
    estimates_to_bytes,
    estimates_to_proto,
    result_from_bytes,
    result_from_proto,
    result_to_bytes,
    result_to_proto,
    timestamp,
)
from ldp_collector.storage import open_store

#: A realistic finish time (Unix seconds with a fraction), as ``core`` takes it from its clock.
NOW = 1_767_225_600.123456

_MECHANISM = GRRParams(domain_size=4, epsilon=1.5)
_ENCODER = CategoricalEncoder(domain_size=4)


def _estimates() -> Estimates:
    return Estimates(
        campaign_id="c-1", round=3, reports=1200, mechanism=_MECHANISM, encoder=_ENCODER, confidence=0.95,
        estimates=tuple(Estimate(value=v, count=100.0 * v - 3.5, std_error=7.25, ci_lower=100.0 * v - 17.7,
                                 ci_upper=100.0 * v + 10.7) for v in range(4)),
        warnings=("anomaly: value 2 moved", "implausible weight 3"), consistent=True)


def _cell_map() -> CellClusterModel:
    cells = (*(TreeCell(level=1, morton_index=i) for i in (0, 1, 2)),
             *(TreeCell(level=2, morton_index=i) for i in range(12, 16)))
    return CellClusterModel(domain=NumericDomain(lower=(0.0, 10.0), upper=(4.0, 12.0)), cells=cells,
                            labels=(0, -1, 0, 1, 1, -1, 1), densities=(3.0, 0.5, 2.5, 4.0, 4.5, 0.25, 5.0),
                            density_std_errors=(0.5,) * 7)


def _full_result() -> Result:
    """A result with every field set (centers and a cell map at once, which no kind publishes)."""
    return Result(
        campaign_id="c-1", state=CampaignState.FINISHED, estimates=_estimates(),
        heavy_hitters=(HeavyHitter(value=7, count=310.5, std_error=12.0), HeavyHitter(value=2**40, count=99.0,
                                                                                     std_error=11.5)),
        clustering=Clustering(k=2, dimension=2, centers=(1.0, 10.5, 3.0, 11.5), weights=(0.4, 0.6),
                              cell_map=_cell_map(), fuzzifier=2.0),
        diagnostics={"reports": 1200, "epsilon": 1.5, "round_1_reports": 600.0},
        warnings=("only 1200 reports", "second warning"), finished_at=NOW)


def _old_style_message() -> campaigns_pb2.Result:
    """The same result built the way engines and ``core`` built it before results were model objects."""
    message = campaigns_pb2.Result(campaign_id="c-1", state=campaigns_pb2.FINISHED,
                                   warnings=["only 1200 reports", "second warning"])
    estimates = message.estimates
    estimates.campaign_id, estimates.round, estimates.reports = "c-1", 3, 1200
    estimates.confidence, estimates.consistent = 0.95, True
    estimates.mechanism.CopyFrom(mechanism_to_proto(_MECHANISM))
    estimates.encoder.CopyFrom(encoder_to_proto(_ENCODER))
    for v in range(4):
        estimates.estimates.add(value=v, count=100.0 * v - 3.5, std_error=7.25, ci_lower=100.0 * v - 17.7,
                                ci_upper=100.0 * v + 10.7)
    estimates.warnings.extend(["anomaly: value 2 moved", "implausible weight 3"])
    message.heavy_hitters.add(value=7, count=310.5, std_error=12.0)
    message.heavy_hitters.add(value=2**40, count=99.0, std_error=11.5)
    clustering = message.clustering
    clustering.k, clustering.dimension, clustering.fuzzifier = 2, 2, 2.0
    clustering.centers.extend([1.0, 10.5, 3.0, 11.5])
    clustering.weights.extend([0.4, 0.6])
    cell_map = clustering.cell_map
    cell_map.domain.CopyFrom(encoders_pb2.NumericDomain(lower=[0.0, 10.0], upper=[4.0, 12.0]))
    for i in (0, 1, 2):
        cell_map.cells.add(level=1, morton_index=i)
    for i in range(12, 16):
        cell_map.cells.add(level=2, morton_index=i)
    cell_map.labels.extend([0, -1, 0, 1, 1, -1, 1])
    cell_map.densities.extend([3.0, 0.5, 2.5, 4.0, 4.5, 0.25, 5.0])
    cell_map.density_std_errors.extend([0.5] * 7)
    message.finished_at.CopyFrom(timestamp(NOW))
    for key, value in {"reports": 1200.0, "epsilon": 1.5, "round_1_reports": 600.0}.items():
        message.diagnostics[key] = value
    return message


def test_result_round_trips_with_every_field_set() -> None:
    result = _full_result()
    message = result_to_proto(result)
    for field in ("estimates", "clustering", "finished_at"):
        assert message.HasField(field)
    assert message.clustering.HasField("cell_map") and len(message.clustering.cell_map.cells) == 7
    assert result_from_proto(message) == result
    assert result_from_bytes(result_to_bytes(result)) == result
    assert message == _old_style_message()  # field for field what the engines used to build


def test_estimates_round_trip_with_every_field_set() -> None:
    estimates = _estimates()
    message = estimates_to_proto(estimates)
    assert message.HasField("mechanism") and message.HasField("encoder") and len(message.estimates) == 4
    assert estimates_from_proto(message) == estimates
    assert estimates_from_bytes(estimates_to_bytes(estimates)) == estimates
    assert message == _old_style_message().estimates


def test_unset_parts_stay_unset() -> None:
    """A result without estimates or clustering (a collecting campaign) has none on the wire either."""
    for result in (Result(), Result(campaign_id="c", state=CampaignState.FAILED, warnings=("round 1: boom",))):
        message = result_to_proto(result)
        assert not any(message.HasField(f) for f in ("estimates", "clustering", "finished_at"))
        assert result_from_proto(message) == result
    assert result_to_bytes(Result()) == b""


def test_finish_times_from_the_clock_survive_the_round_trip() -> None:
    """``finished_at`` is float seconds in the model: a time that came from a float clock reads back
    to the same nanoseconds, so a stored result's wire form does not move."""
    rng = np.random.default_rng(0)
    for now in (rng.uniform(1.6e9, 2.2e9, 2000).tolist() + [0.0, 1.0, NOW]):
        blob = result_to_bytes(Result(finished_at=now))
        assert result_to_bytes(result_from_bytes(blob)) == blob


def test_unreadable_stored_results_and_estimates_are_runtime_errors() -> None:
    with pytest.raises(RuntimeError, match="stored result of campaign x is unreadable"):
        result_from_bytes(b"\xff\xff", where="result of campaign x")
    with pytest.raises(RuntimeError, match="stored estimates are unreadable"):
        estimates_from_bytes(b"\x22\x03\xff\xff\xff")


def test_results_and_estimates_stored_by_the_message_code_path_still_read(tmp_path: object) -> None:
    """The database holds serialized ``ldp.v1`` messages: what the previous code stored reads back,
    and the service's answer (the model converted at the edge) is the very message that was stored."""
    store = open_store(f"sqlite:///{tmp_path}/ldp.db")
    try:
        collector = Collector(store)
        config = campaigns_pb2.CampaignConfig(campaign_id="c-1", kind=campaigns_pb2.HISTOGRAM, epsilon=1.5,
                                              domain=campaigns_pb2.Domain(categorical_size=4))
        collector.create_campaign(config_from_proto(config))
        stored = _old_style_message()
        store.close_round("c-1", 1, NOW)
        store.set_round_estimates("c-1", 1, stored.estimates.SerializeToString())
        store.update_campaign("c-1", state=FINISHED, result=stored.SerializeToString())

        result = collector.get_result("c-1")
        assert isinstance(result, Result) and result == _full_result()
        assert result_to_proto(result) == stored
        estimates = collector.get_estimates("c-1", 1, confidence=0.95)
        assert isinstance(estimates, Estimates) and estimates_to_proto(estimates) == stored.estimates
    finally:
        store.close()


def test_label_model_matches_the_devices_model() -> None:
    centers = Result(state=CampaignState.FINISHED,
                     clustering=Clustering(k=2, dimension=2, centers=(1.0, 10.5, 3.0, 11.5), weights=(0.4, 0.6)))
    model = centers.label_model()
    assert isinstance(model, CenterModel) and model == cluster_model_from_proto(result_to_proto(centers))
    cells = Result(state=CampaignState.FINISHED, clustering=Clustering(k=2, dimension=2, cell_map=_cell_map()))
    assert cells.label_model() == _cell_map() == cluster_model_from_proto(result_to_proto(cells))
    both = _full_result()  # centers win, as on the device
    assert isinstance(both.label_model(), CenterModel)


def test_label_model_refuses_what_cannot_label() -> None:
    with pytest.raises(ProtocolError, match="COLLECTING, not FINISHED"):
        Result(campaign_id="c", state=CampaignState.COLLECTING).label_model()
    with pytest.raises(ProtocolError, match="published no clustering"):
        Result(state=CampaignState.FINISHED).label_model()
    with pytest.raises(ProtocolError, match="neither centers nor a cell map"):
        Result(state=CampaignState.FINISHED, clustering=Clustering(dimension=2)).label_model()
    with pytest.raises(ProtocolError, match="not a whole number of centers"):
        Clustering(k=1, dimension=2, centers=(1.0, 2.0, 3.0)).label_model()


class _CountingCollector:
    """Stands in for ``Collector.get_result`` and counts the calls."""

    def __init__(self, results: dict[str, Result]) -> None:
        self.results, self.calls = results, 0

    def get_result(self, campaign_id: str) -> Result:
        self.calls += 1
        return self.results[campaign_id]


def test_finished_answers_are_converted_once_within_their_byte_budget() -> None:
    from ldp_collector.server.servicer import FinishedResults

    finished, collecting = _full_result(), Result(campaign_id="c-2", state=CampaignState.COLLECTING)
    other = replace(finished, campaign_id="c-3")
    collector = _CountingCollector({"c-1": finished, "c-2": collecting, "c-3": other})
    size = result_to_proto(finished).ByteSize() + 8  # the answer wraps the result in one field
    answers = FinishedResults(collector, max_bytes=size)  # type: ignore[arg-type]
    first = answers.response("c-1")
    assert first.result == result_to_proto(finished)
    assert answers.response("c-1") is first and collector.calls == 1  # a finished result never changes
    for _ in range(2):  # a collecting campaign's state is read afresh
        assert answers.response("c-2").result == result_to_proto(collecting)
    assert collector.calls == 3
    assert answers.response("c-3").result.campaign_id == "c-3"  # evicts c-1: one answer fits the budget
    assert answers.response("c-1") == first and collector.calls == 5
