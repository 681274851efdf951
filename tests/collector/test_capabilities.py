"""Capability negotiation (docs/protocol.md §10) against the collector.

* Every round spec every kind produces (all their variants, every round of a simulated campaign)
  states the list the rule of §10 gives when it is applied to the *wire message* alone, by an
  independent reading of the proto (what an implementation in another language does).
* Over real gRPC: a device stating fewer capabilities than a round needs gets FAILED_PRECONDITION
  with the ErrorInfo reason MISSING_CAPABILITIES listing them, and the SDK raises
  :class:`~ldp_client.errors.MissingCapabilitiesError`; a device stating nothing (older than the
  field) gets the spec; a malformed list is INVALID_ARGUMENT on ``supported_capabilities``.
* A lying collector (a stub server) that sends the spec anyway, states a list that disagrees with
  the tasks, or sends a task this SDK cannot parse: the SDK refuses each before anything is released.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf.message import Message
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from ldp.v1 import campaigns_pb2, encoders_pb2, mechanisms_pb2, reports_pb2, service_pb2, service_pb2_grpc
from ldp_client.capabilities import MISSING_CAPABILITIES_REASON, SDK_CAPABILITIES
from ldp_client.device import Device
from ldp_client.errors import MissingCapabilitiesError, ProtocolError
from ldp_client.grpc import CollectorClient, RequestRejectedError
from ldp_client.rng import SeededRng
from ldp_client.serde import round_spec_to_proto
from ldp_client.spec import RoundSpec
from ldp_collector.config import CollectorConfig
from ldp_collector.core import Collector
from ldp_collector.errors import ErrorReason
from ldp_collector.kinds import KINDS
from ldp_collector.kinds.base import NUMERIC
from ldp_collector.serde import config_from_proto, kind_number
from ldp_collector.server.lifecycle import start_server
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.runner import run_campaign
from ldp_collector.storage import open_store
from support.recording import RecordingCollector

# -- the rule of §10, read off the wire ---------------------------------------------------------------

#: Message type -> capability, from the oneofs of EncoderSpec and MechanismSpec (member name = capability).
_BY_TYPE: dict[str, str] = {
    **{f.message_type.full_name: f"encoder.{f.name}" for f in encoders_pb2.EncoderSpec.DESCRIPTOR.fields},
    **{f.message_type.full_name: f"mechanism.{f.name}" for f in mechanisms_pb2.MechanismSpec.DESCRIPTOR.fields},
    encoders_pb2.RandomProjection.DESCRIPTOR.full_name: "encoder.random_projection",
}
_SHAPES = {mechanisms_pb2.BucketizedVector.L2_BALL: "mechanism.vector_l2_ball",
           mechanisms_pb2.BucketizedVector.BOX: "mechanism.vector_box",
           mechanisms_pb2.BucketizedVector.PRIVUNIT: "mechanism.vector_privunit"}


def wire_capabilities(message: Message) -> set[str]:
    """Every encoder, mechanism and projection message present anywhere in ``message``, a
    bucketized vector's inner randomizer (its ``shape``) and a local-hashing seed pool."""
    found: set[str] = set()
    name = _BY_TYPE.get(message.DESCRIPTOR.full_name)
    if name is not None:
        found.add(name)
    if isinstance(message, mechanisms_pb2.BucketizedVector):
        found.add(_SHAPES[message.shape])
    if isinstance(message, mechanisms_pb2.LocalHashing) and message.seed_pool_size:
        found.add("mechanism.local_hashing.seed_pool")
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        for item in (value if field.is_repeated else [value]):
            found |= wire_capabilities(item)
    return found


def _numeric(kind: str, params: dict[str, Any]) -> bool:
    return NUMERIC in KINDS[kind].domains and not params.get("categorical")


def _config(kind: str, x: np.ndarray, **params: Any) -> campaigns_pb2.CampaignConfig:
    config = campaigns_pb2.CampaignConfig(kind=kind_number(kind), epsilon=4.0, campaign_id=f"caps-{kind}")  # type: ignore[arg-type]
    if _numeric(kind, params):
        config.domain.numeric.lower.extend(x.min(axis=0).tolist())
        config.domain.numeric.upper.extend(x.max(axis=0).tolist())
    else:
        config.domain.categorical_size = 64
    message = getattr(config, kind)
    message.SetInParent()
    if "k" in message.DESCRIPTOR.fields_by_name:
        message.k = 3
    for key, value in params.items():
        if key != "categorical":
            setattr(message, key, value)
    return config


#: Every kind at its defaults, and the variants that produce other encoders or mechanisms
#: (``categorical``: a categorical domain for a kind that takes both).
CASES: list[tuple[str, dict[str, Any]]] = [
    *((name, {}) for name in KINDS),
    ("histogram", {"categorical": True, "oracle": campaigns_pb2.OUE}),
    ("histogram", {"categorical": True, "oracle": campaigns_pb2.OLH}),
    ("histogram", {"categorical": True, "oracle": campaigns_pb2.OLH, "seed_pool_size": 16}),
    *(("grid", {"variant": v}) for v in (campaigns_pb2.GridParameters.UNIFORM, campaigns_pb2.GridParameters.TREE,
                                         campaigns_pb2.GridParameters.ITERATIVE)),
    ("nettree", {"node_map": campaigns_pb2.NetTreeParameters.SHIFTED_GRID, "refinement_share": 0.3}),
    ("nettree", {"node_map": campaigns_pb2.NetTreeParameters.SIMHASH, "vector_shape": mechanisms_pb2.BucketizedVector.PRIVUNIT,
                 "projection_dimension": 1}),
    ("stemmer", {"vector_shape": mechanisms_pb2.BucketizedVector.L2_BALL}),
    ("ldp_kmeans", {"privunit_vectors": True}),
    ("laplace", {}),
]
_SEEN: set[str] = set()


@pytest.mark.parametrize("kind,params", CASES, ids=[f"{k}-{'-'.join(map(str, p.values())) or 'default'}" for k, p in CASES])
def test_every_round_of_every_kind_states_the_list_its_wire_message_gives(kind: str, params: dict[str, Any]) -> None:
    x, labels = make_dataset("blobs", 3000, d=2, k=3, seed=11)
    values = [int(v) for v in np.asarray(labels) * 7 % 64]
    # A categorical point: the index itself where the kind takes numeric points too, as a 1-tuple otherwise.
    points: object = x if _numeric(kind, params) else values if NUMERIC in KINDS[kind].domains else [(v,) for v in values]
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(tmp)
        try:
            backend = RecordingCollector(Collector(store), seed=1)
            run_campaign(backend, config_from_proto(_config(kind, x, **params)), points, seed=2, mode="direct",
                         quiet=True)
        finally:
            store.close()
    assert backend.specs
    for spec in backend.specs.values():
        message = round_spec_to_proto(spec)
        derived = sorted(wire_capabilities(message))
        assert list(message.required_capabilities) == list(spec.required_capabilities) == derived
        assert set(derived) <= SDK_CAPABILITIES
        _SEEN.update(derived)


def test_the_kinds_together_need_every_capability_the_sdk_has() -> None:
    """Run after the cases above (file order): what no kind produces is named here, so a change shows."""
    if len(_SEEN) == 0:
        pytest.skip("runs after the per-kind cases")
    assert SDK_CAPABILITIES - _SEEN == set(), sorted(SDK_CAPABILITIES - _SEEN)


# -- negotiation over real gRPC ------------------------------------------------------------------------

CAMPAIGN = "caps-olh"


def _olh_histogram() -> campaigns_pb2.CampaignConfig:
    return campaigns_pb2.CampaignConfig(
        campaign_id=CAMPAIGN, kind=campaigns_pb2.HISTOGRAM, epsilon=2.0,
        domain=campaigns_pb2.Domain(categorical_size=64),
        histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.OLH))


@pytest.fixture(scope="module")
def collector_address() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp))
        Collector(store).create_campaign(config_from_proto(_olh_histogram()))
        store.close()
        with start_server(CollectorConfig(listen="127.0.0.1:0", data_dir=tmp, log_level="WARNING")) as server:
            yield server.address


def _error_info(error: grpc.RpcError) -> Any:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError("no ErrorInfo")


WITHOUT_OLH = SDK_CAPABILITIES - {"mechanism.local_hashing"}


@pytest.mark.integration
def test_the_collector_declines_a_round_the_device_cannot_run(collector_address: str) -> None:
    with grpc.insecure_channel(collector_address) as channel:
        stub = service_pb2_grpc.DeviceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.GetRoundSpec(service_pb2.GetRoundSpecRequest(campaign_id=CAMPAIGN,
                                                              supported_capabilities=sorted(WITHOUT_OLH)))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        error = _error_info(info.value)
        assert (error.domain, error.reason) == ("ldp.v1", MISSING_CAPABILITIES_REASON)
        assert ErrorReason.MISSING_CAPABILITIES.value == "MISSING_CAPABILITIES"
        assert dict(error.metadata) == {"missing_capabilities": "mechanism.local_hashing"}
        assert "mechanism.local_hashing" in (info.value.details() or "")
        # Not stated (a device older than the field): the spec, as before.
        response = stub.GetRoundSpec(service_pb2.GetRoundSpecRequest(campaign_id=CAMPAIGN))
        assert list(response.spec.required_capabilities) == ["encoder.categorical", "mechanism.local_hashing"]
        # A malformed list names its field.
        with pytest.raises(grpc.RpcError) as bad:
            stub.GetRoundSpec(service_pb2.GetRoundSpecRequest(campaign_id=CAMPAIGN,
                                                              supported_capabilities=["Not A Name"]))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert _error_info(bad.value).reason == "INVALID_ARGUMENT"


@pytest.mark.integration
def test_the_sdk_raises_a_typed_error_and_a_full_device_gets_the_spec(collector_address: str) -> None:
    with CollectorClient(collector_address, capabilities=WITHOUT_OLH) as client:
        for ask in (client.get_round_spec, client.poll_round_spec, client.get_round, client.poll_round):
            with pytest.raises(MissingCapabilitiesError) as info:
                ask(CAMPAIGN)
            assert info.value.missing == ("mechanism.local_hashing",)
            assert info.value.campaign_id == CAMPAIGN
    with CollectorClient(collector_address) as client:
        assert client.capabilities == SDK_CAPABILITIES
        spec = client.get_round_spec(CAMPAIGN)
    assert spec is not None and spec.required_capabilities == ("encoder.categorical", "mechanism.local_hashing")


# -- a lying collector ---------------------------------------------------------------------------------


class _Liar(service_pb2_grpc.DeviceServiceServicer):
    """Answers every GetRoundSpec with ``spec`` whatever the device states."""

    def __init__(self, spec: reports_pb2.RoundSpec) -> None:
        self.spec = spec
        self.asked: list[list[str]] = []

    def GetRoundSpec(self, request: service_pb2.GetRoundSpecRequest, context: Any) -> service_pb2.GetRoundSpecResponse:
        self.asked.append(list(request.supported_capabilities))
        return service_pb2.GetRoundSpecResponse(spec=self.spec)


@contextmanager
def _lying_collector(spec: reports_pb2.RoundSpec) -> Iterator[tuple[str, _Liar]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    liar = _Liar(spec)
    service_pb2_grpc.add_DeviceServiceServicer_to_server(liar, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", liar
    finally:
        server.stop(None)


def _olh_spec() -> RoundSpec:
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp))
        try:
            collector = Collector(store)
            collector.create_campaign(config_from_proto(_olh_histogram()))
            spec, _ = collector.get_round_spec(CAMPAIGN)
        finally:
            store.close()
    assert spec is not None
    return spec


def _tamper(change: Callable[[reports_pb2.RoundSpec], None]) -> reports_pb2.RoundSpec:
    message = round_spec_to_proto(_olh_spec())
    change(message)
    return message


def _unparseable_task(message: reports_pb2.RoundSpec) -> None:
    """An encoder this SDK does not know (an empty EncoderSpec oneof) under a capability it does not know."""
    message.tasks[0].components[0].encoder.Clear()
    message.required_capabilities.append("encoder.from_the_future")


@pytest.mark.integration
@pytest.mark.parametrize("change,error,match", [
    (lambda m: None, MissingCapabilitiesError, "mechanism.local_hashing"),
    (lambda m: m.ClearField("required_capabilities"), MissingCapabilitiesError, "mechanism.local_hashing"),
    (lambda m: m.required_capabilities.remove("mechanism.local_hashing"), ProtocolError, "disagree"),
    (_unparseable_task, MissingCapabilitiesError, "encoder.from_the_future"),
], ids=["sent-anyway", "list-dropped", "list-disagrees", "unknown-encoder"])
def test_the_sdk_refuses_what_a_lying_collector_sends(change: Callable[[reports_pb2.RoundSpec], None],
                                                      error: type[Exception], match: str) -> None:
    device = Device.in_memory(rng=SeededRng(3), capabilities=WITHOUT_OLH)
    with _lying_collector(_tamper(change)) as (address, liar):
        with CollectorClient(address, capabilities=WITHOUT_OLH) as client:
            with pytest.raises(error, match=match):
                client.get_round_spec(CAMPAIGN)
    assert liar.asked == [sorted(WITHOUT_OLH)]
    assert device.pending_reports() == [] and device.spent(CAMPAIGN) == 0.0


@pytest.mark.integration
def test_a_full_device_refuses_a_list_that_disagrees_with_the_tasks() -> None:
    message = _tamper(lambda m: m.required_capabilities.append("mechanism.grr"))
    with _lying_collector(message) as (address, _):
        with CollectorClient(address) as client:
            with pytest.raises(ProtocolError, match="disagree with the round's tasks") as info:
                client.get_round_spec(CAMPAIGN)
    assert not isinstance(info.value, (MissingCapabilitiesError, RequestRejectedError))


def test_a_device_given_the_spec_directly_declines_too() -> None:
    """What the app would do with a spec from a collector that ignores the stated list."""
    device = Device.in_memory(rng=SeededRng(4), capabilities=WITHOUT_OLH)
    with pytest.raises(MissingCapabilitiesError):
        device.participate(_olh_spec(), 5)
    assert device.pending_reports() == [] and device.spent(CAMPAIGN) == 0.0
