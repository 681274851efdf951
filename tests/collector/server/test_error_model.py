"""The error model of ``docs/errors.md``, and server reflection v1 and v1alpha.

* every ``ErrorInfo.reason`` the collector can send is in the documented table, with the status code
  the table gives it: the table in the document equals :class:`ErrorReason`, every error class and
  every raise site that names a reason (scanned from the sources) uses a documented pair, and no
  module but ``server/status.py`` builds an ``ErrorInfo``;
* ``BadRequest.field`` is a field path: campaign-configuration errors under ``config.``, request
  errors at the request's own fields, and it names real fields;
* per-report rejections carry a :class:`RejectionCode` (mirroring ``ldp.v1.RejectionCode``) and a
  message without reprs or Python type names, on both submit paths and through the SDK's client;
* reflection answers on ``grpc.reflection.v1`` and ``grpc.reflection.v1alpha``, each listing and
  describing every service (real clients on a real port).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status
from hypothesis import given, settings
from hypothesis import strategies as st

import ldp_collector
from ldp.v1 import campaigns_pb2, encoders_pb2, reports_pb2, service_pb2, service_pb2_grpc
from ldp_client import serde
from ldp_client.errors import InvalidParameterError, RejectionCode
from ldp_client.grpc import CollectorClient, OutcomeStatus
from ldp_client.report import Report, pack_batch, unpack_batch_columns
from ldp_client.rng import SeededRng
from ldp_client.spec import RoundSpec
from ldp_collector.config import CollectorConfig
from ldp_collector.errors import CollectorError, ErrorReason, InvalidArgumentError
from ldp_collector.ingest import Rejection, RoundContext, validate_batch
from ldp_collector.server.lifecycle import RunningServer, start_server
from ldp_collector.server.reflection import V1_SERVICE_NAME
from ldp_collector.server.status import status_for_error
from ldp_collector.server.wire import DEVICE_SERVICE, OPERATOR_SERVICE

from ..test_ingest_fast_path import CONTEXTS, pack, proto_report, wire_report

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "errors.md"
SOURCES = Path(ldp_collector.__file__).parent
TOKEN = "operator-token-for-error-model-0123456789"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
DOMAIN = 6
#: What a message that reaches a device must not hold: a bytes or string repr, an escape, a Python
#: type or literal name, a class name ending in Error.
REPR = re.compile(r"""b'|b"|\\x[0-9a-f]{2}|'[^'\s]*'|\b(tuple|dict|NoneType|str|int|float|bool|True|False|None)\b"""
                  r"|<class|[a-z]Error\b")


# -- the documented tables --------------------------------------------------------------------------

def documented_reasons() -> dict[str, str]:
    """``docs/errors.md`` section 2: reason -> status code."""
    rows = re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \| `([A-Z_]+)` \|", section(2), re.MULTILINE)
    assert len(rows) == len(dict(rows)), "a reason is documented twice"
    return dict(rows)


def documented_codes() -> dict[str, int]:
    """``docs/errors.md`` section 4: rejection code name -> number."""
    rows = re.findall(r"^\| `(REJECTION_CODE_[A-Z_]+)` \| (\d+) \|", section(4), re.MULTILINE)
    return {name: int(number) for name, number in rows}


def section(number: int) -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"^## {number}\. .*?(?=^## \d+\. |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"docs/errors.md has no section {number}"
    return match.group()


def test_the_documented_reasons_are_exactly_the_table_in_the_code() -> None:
    assert set(documented_reasons()) == {reason.value for reason in ErrorReason}
    assert all(re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)*", reason) for reason in documented_reasons())


#: Packages of the optional extras: a module that needs one of them is left out where it is not installed
#: (the ``beam`` env imports it).
_OPTIONAL_PACKAGES = frozenset({"apache_beam", "pyarrow"})


def _import_unless_extra_missing(name: str) -> None:
    try:
        importlib.import_module(name)
    except ImportError as exc:
        missing = {getattr(exc, "name", None), getattr(exc.__cause__, "name", None)}
        if not missing & _OPTIONAL_PACKAGES:
            raise


def _error_classes() -> list[type[CollectorError]]:
    for module in pkgutil.walk_packages(ldp_collector.__path__, "ldp_collector.", onerror=_import_unless_extra_missing):
        _import_unless_extra_missing(module.name)
    found, todo = [], [CollectorError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_error_class_sends_a_documented_reason_with_its_code() -> None:
    documented = documented_reasons()
    classes = _error_classes()
    assert len(classes) > 10
    for cls in classes:
        if cls is CollectorError:  # the base is never raised; its default is what INTERNAL sends
            assert cls.reason == ErrorReason.INTERNAL
            continue
        assert documented.get(cls.reason.value) == cls.code, (cls, cls.reason, cls.code)


def _raised_class(call: ast.Call, classes: dict[str, type[CollectorError]]) -> type[CollectorError] | None:
    name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
    return classes.get(name) if isinstance(name, str) else None


def test_every_reason_named_at_a_raise_site_is_documented_with_its_code() -> None:
    documented = documented_reasons()
    classes = {cls.__name__: cls for cls in _error_classes()}
    named = 0
    for path in sorted(SOURCES.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            assert func != "ErrorInfo" or path.name == "status.py", f"{path}: builds an ErrorInfo itself"
            for keyword in node.keywords:
                if keyword.arg != "reason" or (cls := _raised_class(node, classes)) is None:
                    continue
                value = keyword.value
                assert (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                        and value.value.id == "ErrorReason"), f"{path}:{node.lineno}: reason is not an ErrorReason"
                assert documented.get(value.attr) == cls.code, (f"{path}:{node.lineno}", cls.__name__, value.attr)
                named += 1
    assert named >= 15  # the scan sees the raise sites (a broken scan would pass vacuously)


@pytest.mark.parametrize("error,reason", [
    (ValueError("boom"), "INTERNAL"),
    (InvalidParameterError("epsilon must be in (0, 20], got 0"), "INVALID_ARGUMENT"),
    (InvalidArgumentError("round must be >= 0, got -1"), "INVALID_ARGUMENT"),
    (InvalidArgumentError("x", reason=ErrorReason.MALFORMED_REQUEST), "MALFORMED_REQUEST"),
])
def test_any_exception_maps_to_a_documented_reason_in_the_ldp_domain(error: BaseException, reason: str) -> None:
    status = status_for_error(error, service_pb2.GetEstimatesRequest)
    infos = [unpack(d, error_details_pb2.ErrorInfo) for d in status.details
             if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
    assert [(i.reason, i.domain) for i in infos] == [(reason, "ldp.v1")]
    assert reason in documented_reasons()


def test_request_errors_name_the_request_field_they_are_about() -> None:
    status = status_for_error(InvalidArgumentError("round must be >= 0, got -1"), service_pb2.GetEstimatesRequest)
    assert bad_request(status) == "round"
    # A message naming no field of the request names none (never a made-up path).
    status = status_for_error(InvalidArgumentError("rounds must be >= 0"), service_pb2.GetEstimatesRequest)
    assert bad_request(status) == ""


def unpack(detail: Any, cls: Any) -> Any:
    message = cls()
    detail.Unpack(message)
    return message


def bad_request(status: Any) -> str:
    [violations] = [unpack(d, error_details_pb2.BadRequest).field_violations for d in status.details
                    if d.Is(error_details_pb2.BadRequest.DESCRIPTOR)]
    assert len(violations) == 1
    return str(violations[0].field)


# -- rejection codes --------------------------------------------------------------------------------

def test_rejection_codes_mirror_the_proto_and_the_document() -> None:
    proto = {v.name: v.number for v in service_pb2.DESCRIPTOR.enum_types_by_name["RejectionCode"].values}
    assert {f"REJECTION_CODE_{c.name}": c.value for c in RejectionCode} == proto
    assert documented_codes() == proto
    assert RejectionCode.of(10_000) is RejectionCode.UNSPECIFIED  # a newer collector's code


def lookup(campaign_id: str) -> RoundContext | Rejection:
    context = CONTEXTS.get(campaign_id)
    if isinstance(context, RoundContext):
        return context
    if context is not None:
        return Rejection(RejectionCode.CAMPAIGN_NOT_COLLECTING, context)
    return Rejection(RejectionCode.UNKNOWN_CAMPAIGN, f"campaign {campaign_id} does not exist")


def check_rejections(rejected: dict[int, Rejection]) -> None:
    for rejection in rejected.values():
        assert isinstance(rejection, Rejection) and rejection.code != RejectionCode.UNSPECIFIED, rejection
        assert rejection and not REPR.search(rejection), rejection


@settings(max_examples=300)
@given(st.lists(wire_report(), min_size=1, max_size=12))
def test_every_rejection_has_a_code_and_a_message_without_reprs(items: list[Any]) -> None:
    try:
        _, columns = unpack_batch_columns(pack("r", items))
    except Exception:  # the whole batch refused (a request error, not per-report rejections)
        return
    check_rejections(validate_batch(columns, lookup).rejected)
    check_rejections(validate_batch(list(columns), lookup).rejected)  # the per-report path
    try:
        messages = [proto_report(item) for item in items]
    except Exception:  # not representable as a protobuf report
        return
    check_rejections(validate_batch(serde.report_columns_from_proto(messages), lookup).rejected)


# -- over the wire ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    config = CollectorConfig(listen="127.0.0.1:0", data_dir=str(tmp_path_factory.mktemp("errors") / "data"),
                             operator_token=TOKEN, tick_interval_s=0.1, grace_period_s=1.0)
    srv = start_server(config)
    yield srv
    srv.stop(grace=1.0)


@pytest.fixture(scope="module")
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as ch:
        yield ch


def config() -> campaigns_pb2.CampaignConfig:
    return campaigns_pb2.CampaignConfig(
        kind=campaigns_pb2.HISTOGRAM, domain=campaigns_pb2.Domain(categorical_size=DOMAIN), epsilon=2.0,
        histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.GRR))


def status_of(call: Any, *args: Any, **kwargs: Any) -> Any:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    error: Any = info.value
    status = rpc_status.from_call(error)
    assert status is not None
    [info_detail] = [unpack(d, error_details_pb2.ErrorInfo) for d in status.details
                     if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
    assert info_detail.domain == "ldp.v1" and info_detail.reason in documented_reasons()
    assert documented_reasons()[info_detail.reason] == error.code().name
    return status, info_detail.reason


def is_field_path(path: str, root: Any) -> bool:
    descriptor = root.DESCRIPTOR
    for part in path.split("."):
        field = descriptor.fields_by_name.get(part) if descriptor is not None else None
        if field is None:
            return False
        descriptor = field.message_type
    return True


@pytest.mark.integration
@pytest.mark.parametrize("changes,field", [
    ({"epsilon": 0.0}, "config.epsilon"),
    ({"kind": campaigns_pb2.GRID, "domain": campaigns_pb2.Domain(numeric=encoders_pb2.NumericDomain(
        lower=[0.0, 0.0], upper=[1.0, 1.0])), "histogram": None,
      "grid": campaigns_pb2.GridParameters(max_iterations=99)}, "config.grid.max_iterations"),
    ({"budget_policy": 9}, "config.budget_policy"),
    ({"campaign_id": "not an id"}, "config.campaign_id"),
    ({"kind": campaigns_pb2.CAMPAIGN_KIND_UNSPECIFIED}, "config.kind"),
])
def test_campaign_config_errors_carry_their_field_path(channel: grpc.Channel, changes: dict[str, Any],
                                                       field: str) -> None:
    message = config()
    for key, value in changes.items():
        if value is None:
            message.ClearField(key)
        elif isinstance(value, (campaigns_pb2.GridParameters, campaigns_pb2.Domain)):
            getattr(message, key).CopyFrom(value)
        else:
            setattr(message, key, value)
    operator = service_pb2_grpc.OperatorServiceStub(channel)
    status, reason = status_of(operator.CreateCampaign, service_pb2.CreateCampaignRequest(config=message),
                               metadata=AUTH)
    assert reason == "INVALID_CAMPAIGN_CONFIG"
    assert bad_request(status) == field and is_field_path(field, service_pb2.CreateCampaignRequest)
    assert not REPR.search(status.message), status.message


@pytest.mark.integration
def test_request_errors_over_the_wire(channel: grpc.Channel) -> None:
    operator = service_pb2_grpc.OperatorServiceStub(channel)
    device = service_pb2_grpc.DeviceServiceStub(channel)
    cases = [
        (operator.GetEstimates, service_pb2.GetEstimatesRequest(campaign_id="c", confidence=2.0), "confidence",
         "INVALID_ARGUMENT"),
        (operator.ListCampaigns, service_pb2.ListCampaignsRequest(page_token="not-a-token"), "page_token",
         "INVALID_ARGUMENT"),
        (device.SubmitReports, service_pb2.SubmitReportsRequest(request_id=""), "request_id", "INVALID_ARGUMENT"),
        (device.SubmitPacked, service_pb2.SubmitPackedRequest(request_id="a", packed=pack_batch("b", [])),
         "request_id", "INVALID_ARGUMENT"),
        (device.SubmitPacked, service_pb2.SubmitPackedRequest(request_id="a", packed=b"\x01"), "packed",
         "INVALID_ARGUMENT"),
    ]
    for call, request, field, reason in cases:
        status, got = status_of(call, request, metadata=AUTH)
        assert (got, bad_request(status)) == (reason, field), (request, status.message)
    garbage = channel.unary_unary(f"/{OPERATOR_SERVICE}/GetCampaign")
    status, reason = status_of(garbage, b"\xff\xff\xff", metadata=AUTH)
    assert reason == "MALFORMED_REQUEST" and bad_request(status) == ""
    status, reason = status_of(operator.GetCampaign, service_pb2.GetCampaignRequest(campaign_id="nope"),
                               metadata=AUTH)
    assert reason == "CAMPAIGN_NOT_FOUND"
    status, reason = status_of(operator.GetCampaign, service_pb2.GetCampaignRequest(campaign_id="nope"))
    assert reason == "UNAUTHENTICATED"


def round_spec(channel: grpc.Channel) -> RoundSpec:
    operator = service_pb2_grpc.OperatorServiceStub(channel)
    campaign = operator.CreateCampaign(service_pb2.CreateCampaignRequest(config=config()), metadata=AUTH)
    device = service_pb2_grpc.DeviceServiceStub(channel)
    response = device.GetRoundSpec(service_pb2.GetRoundSpecRequest(campaign_id=campaign.config.campaign_id))
    return serde.round_spec_from_proto(response.spec)


@pytest.mark.integration
def test_rejected_reports_carry_codes_on_both_submit_paths_and_in_the_sdk(server: RunningServer,
                                                                          channel: grpc.Channel) -> None:
    spec = round_spec(channel)
    rng = SeededRng(3)

    def report(**changes: Any) -> Report:
        task = spec.tasks[0]
        values: dict[str, Any] = dict(report_id=rng.token_bytes(16), campaign_id=spec.campaign_id, round=spec.round,
                                      group=task.groups[0], payloads=(task.components[0].run(1, rng=rng),))
        values.update(changes)
        return Report(**values)

    reports = [report(), report(campaign_id="no-such-campaign"), report(round=spec.round + 1),
               report(group=len(spec.group_weights)), report(payloads=(DOMAIN + 3,)),
               report(payloads=(b"\x01",)), report(payloads=(1, 2))]
    expected = [RejectionCode.UNSPECIFIED, RejectionCode.UNKNOWN_CAMPAIGN, RejectionCode.ROUND_NOT_OPEN,
                RejectionCode.UNKNOWN_GROUP, RejectionCode.INVALID_PAYLOAD, RejectionCode.INVALID_PAYLOAD,
                RejectionCode.WRONG_PAYLOAD_COUNT]
    device = service_pb2_grpc.DeviceServiceStub(channel)
    malformed = reports_pb2.Report(report_id=b"\x01", campaign_id=spec.campaign_id, round=spec.round,
                                   payloads=[reports_pb2.Payload(index=0)])
    by_proto = device.SubmitReports(service_pb2.SubmitReportsRequest(
        request_id="codes-proto", reports=[*map(serde.report_to_proto, reports), malformed]))
    fresh = [report(), *reports[1:]]
    by_packed = device.SubmitPacked(service_pb2.SubmitPackedRequest(request_id="codes-packed",
                                                                    packed=pack_batch("codes-packed", fresh)))
    for response, codes in ((by_proto, [*expected, RejectionCode.MALFORMED_REPORT]), (by_packed, expected)):
        assert [o.code for o in response.outcomes] == [int(c) for c in codes]
        for outcome in response.outcomes:
            rejected = outcome.status == service_pb2.ReportOutcome.REJECTED
            assert rejected == bool(outcome.code) == bool(outcome.reason)
            assert not REPR.search(outcome.reason), outcome.reason
    with CollectorClient(server.address) as client:
        outcomes = client.submit([report(), *reports[1:]])
    assert [o.code for o in outcomes] == expected
    assert [o.status for o in outcomes] == [OutcomeStatus.ACCEPTED] + [OutcomeStatus.REJECTED] * (len(expected) - 1)


# -- reflection -------------------------------------------------------------------------------------

V1_METHOD = f"/{V1_SERVICE_NAME}/ServerReflectionInfo"


def reflect(channel: grpc.Channel, version: str, requests: list[reflection_pb2.ServerReflectionRequest],
            ) -> list[reflection_pb2.ServerReflectionResponse]:
    """Ask the reflection service of ``version``: v1alpha through grpcio-reflection's generated stub,
    v1 on its own method path (its messages are v1alpha's field for field, so the same classes)."""
    if version == "v1alpha":
        return list(reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(iter(requests)))
    call = channel.stream_stream(V1_METHOD, request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                 response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
    return list(call(iter(requests)))


@pytest.mark.integration
@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_reflection_lists_and_describes_every_service(channel: grpc.Channel, version: str) -> None:
    [listing] = reflect(channel, version, [reflection_pb2.ServerReflectionRequest(list_services="")])
    names = {s.name for s in listing.list_services_response.service}
    assert names == {DEVICE_SERVICE, OPERATOR_SERVICE, "grpc.health.v1.Health", V1_SERVICE_NAME,
                     "grpc.reflection.v1alpha.ServerReflection"}
    answers = reflect(channel, version, [reflection_pb2.ServerReflectionRequest(file_containing_symbol=name)
                                         for name in sorted(names)])
    for name, answer in zip(sorted(names), answers):
        assert answer.WhichOneof("message_response") == "file_descriptor_response", (name, answer)
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in answer.file_descriptor_response.file_descriptor_proto]
        package, _, service = name.rpartition(".")
        assert any(f.package == package and service in {s.name for s in f.service} for f in files), name
    [missing] = reflect(channel, version, [reflection_pb2.ServerReflectionRequest(file_containing_symbol="no.Such")])
    assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


@pytest.mark.integration
@pytest.mark.parametrize("method", [V1_METHOD, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"])
def test_garbage_sent_to_either_reflection_service_is_a_malformed_request(channel: grpc.Channel, method: str) -> None:
    call = channel.stream_stream(method)
    status, reason = status_of(lambda: list(call(iter([b"\xff\xff\xff"]))))
    assert reason == "MALFORMED_REQUEST" and status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
