"""Conversion between the SDK's plain-data objects and the ``ldp.v1`` protobuf messages.

The spec dataclasses (:class:`~ldp_client.spec.RoundSpec`, :class:`~ldp_client.spec.GroupTask`,
:class:`~ldp_client.spec.Component`, every registered encoder and mechanism, ``NumericDomain`` ...)
carry exactly the field names of their messages, so one generic walker converts them:

* a nested spec is a nested message; an encoder or mechanism inside ``EncoderSpec`` /
  ``MechanismSpec`` is the ``oneof`` member named by its ``KIND``;
* tuples are repeated fields, enums are their integer values;
* ``RoundSpec.deadline`` (Unix seconds, float, nanosecond precision) is a
  ``google.protobuf.Timestamp``, ``None`` leaves it unset; an unset optional message is ``None``.

Going to protobuf goes through :meth:`Spec.to_dict`, coming back through :meth:`Spec.from_dict`, so
the dataclasses validate what arrives; every problem raises
:class:`~ldp_client.errors.ProtocolError` naming the field path (``round_spec.tasks[0].components[1]
.mechanism.grr: epsilon must be in (0, 20], got 0``). A field this SDK does not know is accepted at
its default value and refused otherwise (the wire only grows; an old device must not silently
ignore a setting it cannot honour).

Reports map to ``ldp.v1.Report`` with one ``Payload`` per component (``index``, ``bits``,
``hashed``, ``integers``, ``floats``, ``signed_vector``; see :mod:`ldp_client.payload`). A collector
decodes the reports of a request with :func:`report_columns_from_proto`: the same reports as
:func:`report_from_proto`, in a :class:`~ldp_client.report.ReportColumns`.

A published clustering (``ldp.v1.Result.clustering``) becomes a local labelling model with
:func:`cluster_model_from_proto` (:mod:`ldp_client.clusters`); :func:`cluster_model_to_proto` writes
one back into an ``ldp.v1.Clustering``.

This module and :mod:`ldp_client.grpc` are the only ones that import protobuf.
"""

from __future__ import annotations

import itertools
import math
import operator
import types
import typing
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

try:
    from google.protobuf import timestamp_pb2
    from google.protobuf.message import Message

    from ldp.v1 import campaigns_pb2, encoders_pb2, mechanisms_pb2, reports_pb2
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        f'ldp_client.serde needs protobuf and the ldp-proto package ({_exc}); install them with: '
        'pip install "ldp-client[grpc]"') from _exc

from ._spec import Spec, SpecRegistry, _field_types
from .clusters import CellClusterModel, CenterModel, ClusterModel
from .encoders.base import ENCODERS, Encoder
from .errors import InvalidParameterError, ProtocolError
from .mechanisms.base import MECHANISMS, MechanismParams
from .payload import Floats, HashedValue, Integers, Payload, SignedVector
from .report import Report, ReportColumns
from .spec import MAX_COMPONENTS, RoundSpec

__all__ = [
    "cluster_model_from_proto",
    "cluster_model_to_proto",
    "encoder_from_proto",
    "encoder_to_proto",
    "mechanism_from_proto",
    "mechanism_to_proto",
    "report_columns_from_proto",
    "report_from_proto",
    "report_to_proto",
    "round_spec_from_proto",
    "round_spec_to_proto",
    "spec_from_proto",
    "spec_to_proto",
]

_TIMESTAMP = "google.protobuf.Timestamp"
#: ``oneof`` wrapper messages and the registries of their members.
_WRAPPERS: dict[str, SpecRegistry] = {
    "ldp.v1.EncoderSpec": ENCODERS,
    "ldp.v1.MechanismSpec": MECHANISMS,
}
_NANOS = 10**9
_REPORT_FIELDS = operator.attrgetter("__class__", "report_id", "campaign_id", "round", "group", "payloads")
#: Payload kinds whose protobuf value is already the SDK payload (``int`` and ``bytes``).
_PLAIN_PAYLOADS = ("index", "bits")
#: ``ldp.v1.CampaignState`` value -> name, for messages.
_CAMPAIGN_STATES = {v: k for k, v in campaigns_pb2.CampaignState.items()}
_PAYLOAD_HAS: Callable[[Any, str], bool] = reports_pb2.Payload.HasField  # type: ignore[assignment]


# ---------------------------------------------------------------------------- specs -> protobuf


def spec_to_proto(spec: Spec, message: Message, *, where: str = "") -> Message:
    """Fill ``message`` (an empty message of the matching type) from ``spec``; returns it."""
    if not isinstance(spec, Spec):
        raise TypeError(f"spec must be an ldp_client spec object, got {type(spec).__name__}")
    _fill(message, spec.to_dict(), where or type(spec).__name__)
    return message


def _fill(message: Message, data: dict[str, Any], where: str) -> None:
    descriptor = message.DESCRIPTOR
    message.SetInParent()
    for name, value in data.items():
        field = descriptor.fields_by_name.get(name)
        path = f"{where}.{name}"
        if field is None:
            raise ProtocolError(f"{path}: {descriptor.full_name} has no field {name!r}")
        if value is None:
            continue
        try:
            if field.message_type is not None:
                target = getattr(message, name)
                if field.is_repeated:
                    for i, item in enumerate(value):
                        _fill(target.add(), item, f"{path}[{i}]")
                elif field.message_type.full_name == _TIMESTAMP:
                    target.CopyFrom(_to_timestamp(value, path))
                else:
                    _fill(target, value, path)
            elif field.is_repeated:
                getattr(message, name).extend(value)
            else:
                setattr(message, name, value)
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"{path}: cannot be written to {descriptor.full_name}.{name} ({exc})") from exc


def _to_timestamp(value: Any, where: str) -> timestamp_pb2.Timestamp:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProtocolError(f"{where}: a timestamp must be finite Unix seconds, got {value!r}")
    exact = Fraction(value)
    seconds = math.floor(exact)
    nanos = round((exact - seconds) * _NANOS)
    if nanos == _NANOS:
        seconds, nanos = seconds + 1, 0
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)


# ---------------------------------------------------------------------------- protobuf -> specs


def spec_from_proto(cls: type[Spec], message: Message, *, where: str = "") -> Spec:
    """Build and validate a ``cls`` from ``message``; any problem raises :class:`ProtocolError`."""
    where = where or cls.__name__
    if not isinstance(message, Message):
        raise TypeError(f"{where}: expected a protobuf message, got {type(message).__name__}")
    return cls.from_dict(_to_dict(message, cls, where), where=where)


def _to_dict(message: Message, cls: type[Spec], where: str) -> dict[str, Any]:
    descriptor = message.DESCRIPTOR
    hints = _field_types(cls)
    for set_field, _ in message.ListFields():
        if set_field.name not in hints:
            raise ProtocolError(f"{where}.{set_field.name}: field is set, but this ldp-client version does not "
                                f"support it in {cls.__name__}")
    out: dict[str, Any] = {}
    for name, hint in hints.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:
            raise ProtocolError(f"{where}: {descriptor.full_name} has no field {name!r} for {cls.__name__}.{name}")
        if field.has_presence and not message.HasField(name):
            continue  # unset: the dataclass default (None for optional parts)
        value = getattr(message, name)
        path = f"{where}.{name}"
        message_type = field.message_type
        if message_type is None:
            out[name] = list(value) if field.is_repeated else value
        elif field.is_repeated:
            item_hint = _element_type(hint)
            out[name] = [_message_value(item, message_type, item_hint, f"{path}[{i}]")
                         for i, item in enumerate(value)]
        else:
            out[name] = _message_value(value, message_type, _element_type(hint), path)
    return out


def _element_type(hint: Any) -> Any:
    """The spec class behind ``X``, ``X | None`` or ``tuple[X, ...]``."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        return typing.get_args(hint)[0]
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _element_type(args[0]) if len(args) == 1 else hint
    return hint


def _message_value(message: Message, message_type: Any, hint: Any, where: str) -> Any:
    # message_type: a protobuf Descriptor (the pure-Python or the upb class, depending on the backend)
    if message_type.full_name == _TIMESTAMP:
        return _from_timestamp(message, where)
    registry = _WRAPPERS.get(message_type.full_name)
    if registry is not None:
        oneof = message_type.oneofs[0].name
        kind = message.WhichOneof(oneof)
        if kind is None:
            raise ProtocolError(f"{where}: no {registry.what} kind is set")
        kind_cls = registry.get(kind)
        return {kind: _to_dict(getattr(message, kind), kind_cls, f"{where}.{kind}")}
    if not (isinstance(hint, type) and issubclass(hint, Spec)):
        raise ProtocolError(f"{where}: cannot convert a {message_type.full_name} into {hint!r}")
    return _to_dict(message, hint, where)


def _from_timestamp(message: Message, where: str) -> float:
    seconds = getattr(message, "seconds")  # noqa: B009 - typed as a plain Message here
    nanos = getattr(message, "nanos")  # noqa: B009
    if not 0 <= nanos < _NANOS:
        raise ProtocolError(f"{where}: timestamp nanos must be in [0, {_NANOS}), got {nanos}")
    return float(Fraction(seconds) + Fraction(nanos, _NANOS))


# ---------------------------------------------------------------------------- public pairs


def round_spec_to_proto(spec: RoundSpec) -> reports_pb2.RoundSpec:
    """``RoundSpec`` -> ``ldp.v1.RoundSpec``."""
    if not isinstance(spec, RoundSpec):
        raise TypeError(f"spec must be a RoundSpec, got {type(spec).__name__}")
    message = reports_pb2.RoundSpec()
    spec_to_proto(spec, message, where="round_spec")
    return message


def round_spec_from_proto(message: reports_pb2.RoundSpec) -> RoundSpec:
    """``ldp.v1.RoundSpec`` -> validated ``RoundSpec``; problems raise :class:`ProtocolError`."""
    _expect(message, reports_pb2.RoundSpec, "round_spec")
    spec = spec_from_proto(RoundSpec, message, where="round_spec")
    assert isinstance(spec, RoundSpec)
    return spec


def mechanism_to_proto(params: MechanismParams) -> mechanisms_pb2.MechanismSpec:
    """Mechanism parameters -> ``ldp.v1.MechanismSpec`` (the ``oneof`` member named by ``KIND``)."""
    if not isinstance(params, MechanismParams):
        raise TypeError(f"params must be mechanism parameters, got {type(params).__name__}")
    message = mechanisms_pb2.MechanismSpec()
    _fill(message, MECHANISMS.dump(params), "mechanism")
    return message


def mechanism_from_proto(message: mechanisms_pb2.MechanismSpec) -> MechanismParams:
    """``ldp.v1.MechanismSpec`` -> validated mechanism parameters."""
    _expect(message, mechanisms_pb2.MechanismSpec, "mechanism")
    data = _message_value(message, message.DESCRIPTOR, None, "mechanism")
    params = MECHANISMS.load(data, where="mechanism")
    assert isinstance(params, MechanismParams)
    return params


def encoder_to_proto(encoder: Encoder) -> encoders_pb2.EncoderSpec:
    """Encoder -> ``ldp.v1.EncoderSpec`` (the ``oneof`` member named by ``KIND``)."""
    if not isinstance(encoder, Encoder):
        raise TypeError(f"encoder must be an ldp_client encoder, got {type(encoder).__name__}")
    message = encoders_pb2.EncoderSpec()
    _fill(message, ENCODERS.dump(encoder), "encoder")
    return message


def encoder_from_proto(message: encoders_pb2.EncoderSpec) -> Encoder:
    """``ldp.v1.EncoderSpec`` -> validated encoder."""
    _expect(message, encoders_pb2.EncoderSpec, "encoder")
    data = _message_value(message, message.DESCRIPTOR, None, "encoder")
    encoder = ENCODERS.load(data, where="encoder")
    assert isinstance(encoder, Encoder)
    return encoder


def report_to_proto(report: Report) -> reports_pb2.Report:
    """``Report`` -> ``ldp.v1.Report``."""
    if not isinstance(report, Report):
        raise TypeError(f"report must be a Report, got {type(report).__name__}")
    return reports_pb2.Report(report_id=report.report_id, campaign_id=report.campaign_id, round=report.round,
                              group=report.group, payloads=[_payload_to_proto(p) for p in report.payloads])


def _payload_to_proto(payload: Payload) -> reports_pb2.Payload:
    if isinstance(payload, bool):
        raise ProtocolError("payload must not be a bool")
    if isinstance(payload, int):
        return reports_pb2.Payload(index=payload)
    if isinstance(payload, bytes):
        return reports_pb2.Payload(bits=payload)
    if isinstance(payload, HashedValue):
        return reports_pb2.Payload(hashed=reports_pb2.HashedValue(seed=payload.seed, value=payload.value))
    if isinstance(payload, Integers):
        return reports_pb2.Payload(integers=reports_pb2.SignedIntegers(values=payload.values))
    if isinstance(payload, Floats):
        return reports_pb2.Payload(floats=reports_pb2.Floats(values=payload.values))
    if isinstance(payload, SignedVector):
        return reports_pb2.Payload(signed_vector=_signed_vector_to_proto(payload))
    raise ProtocolError(f"unsupported payload type {type(payload).__name__}")


def _signed_vector_to_proto(payload: SignedVector) -> reports_pb2.SignedVector:
    inner = payload.inner
    if isinstance(inner, bytes):
        return reports_pb2.SignedVector(seed=payload.seed, bits=inner)
    if isinstance(inner, Floats):
        return reports_pb2.SignedVector(seed=payload.seed, floats=reports_pb2.Floats(values=inner.values))
    raise ProtocolError(f"signed vector inner payload must be bytes or Floats, got {type(inner).__name__}")


def _signed_vector_from_proto(message: reports_pb2.SignedVector, where: str) -> SignedVector:
    kind = message.WhichOneof("inner")
    if kind == "bits":
        return SignedVector(message.seed, bytes(message.bits))
    if kind == "floats":
        return SignedVector(message.seed, Floats(tuple(message.floats.values)))
    raise ProtocolError(f"{where}.signed_vector: no inner value is set")


def report_from_proto(message: reports_pb2.Report, *, where: str = "report") -> Report:
    """``ldp.v1.Report`` -> validated ``Report``; problems raise :class:`ProtocolError`."""
    _expect(message, reports_pb2.Report, where)
    if not 1 <= len(message.payloads) <= MAX_COMPONENTS:  # before converting any: a long list costs nothing
        raise ProtocolError(f"{where}: payloads must be a list of 1 to {MAX_COMPONENTS} payloads, "
                            f"got {len(message.payloads)}")
    payloads: list[Payload] = []
    for i, p in enumerate(message.payloads):
        kind = p.WhichOneof("value")
        if kind == "index":
            payloads.append(p.index)
        elif kind == "bits":
            payloads.append(bytes(p.bits))
        elif kind == "hashed":
            payloads.append(HashedValue(p.hashed.seed, p.hashed.value))
        elif kind == "integers":
            payloads.append(Integers(tuple(p.integers.values)))
        elif kind == "floats":
            payloads.append(Floats(tuple(p.floats.values)))
        elif kind == "signed_vector":
            payloads.append(_signed_vector_from_proto(p.signed_vector, f"{where}.payloads[{i}]"))
        else:
            raise ProtocolError(f"{where}.payloads[{i}]: no payload value is set")
    try:
        return Report(report_id=bytes(message.report_id), campaign_id=message.campaign_id, round=message.round,
                      group=message.group, payloads=tuple(payloads))
    except (TypeError, InvalidParameterError) as exc:
        raise ProtocolError(f"{where}: {exc}") from exc


def report_columns_from_proto(messages: Sequence[reports_pb2.Report], *, where: str = "reports") -> ReportColumns:
    """``ldp.v1.Report`` messages -> :class:`~ldp_client.report.ReportColumns`.

    Position ``i`` holds what ``report_from_proto(messages[i], where=f"{where}[{i}]")`` returns, or
    the :class:`ProtocolError` it raises. A batch of one-component index (or bits) reports is read
    with one pass per field and checked with one pass per column; other batches go report by report.
    """
    columns = _plain_report_columns(messages)
    if columns is not None:
        return columns
    rows: list[tuple[bytes, str, int, int, tuple[Payload, ...]]] = []
    errors: dict[int, ProtocolError] = {}
    for i, message in enumerate(messages):
        try:
            report = report_from_proto(message, where=f"{where}[{i}]")
        except ProtocolError as exc:
            errors[i] = exc.detached()
            rows.append((b"", "", 0, 0, ()))  # ReportColumns' placeholders
        else:
            rows.append((report.report_id, report.campaign_id, report.round, report.group, report.payloads))
    return ReportColumns(report_ids=[r[0] for r in rows], campaign_ids=[r[1] for r in rows],
                         rounds=[r[2] for r in rows], groups=[r[3] for r in rows], payloads=[r[4] for r in rows],
                         errors=errors)


def _plain_report_columns(messages: Sequence[reports_pb2.Report]) -> ReportColumns | None:
    """The columns of a batch whose every report is valid with one index (or one bits) payload, else None."""
    if not messages:
        return None
    try:  # one pass over the messages (each access to an element of a repeated field builds a wrapper)
        classes, report_ids, campaign_ids, rounds, groups, payload_lists = zip(*map(_REPORT_FIELDS, messages))
    except AttributeError:  # not Report messages: report_from_proto says so
        return None
    if set(classes) != {reports_pb2.Report} or set(map(len, payload_lists)) != {1}:
        return None
    firsts = [p[0] for p in payload_lists]
    kind = next((k for k in _PLAIN_PAYLOADS if all(map(_PAYLOAD_HAS, firsts, itertools.repeat(k)))),
                None)
    if kind is None:
        return None
    try:
        return ReportColumns(report_ids=report_ids, campaign_ids=campaign_ids, rounds=rounds, groups=groups,
                             payloads=list(zip(map(operator.attrgetter(kind), firsts))))
    except InvalidParameterError:  # some report is invalid: report by report, for its message
        return None


def cluster_model_from_proto(result: campaigns_pb2.Result) -> ClusterModel:
    """The labelling model of a finished campaign's published clustering (``ldp.v1.Result``).

    Centers (``clustering.centers``, row-major ``k x dimension``) give a :class:`CenterModel`;
    otherwise a cell map (``clustering.cell_map``) gives a :class:`CellClusterModel`. When a result
    carries both, the centers win, as in the collector's own evaluation of clusterings. Everything
    read is public: labelling a point with the model sends nothing and spends no budget.

    Parameters
    ----------
    result : ldp.v1.Result
        From ``DeviceService.GetResult``
        (:meth:`ldp_client.grpc.CollectorClient.get_result`).

    Raises
    ------
    TypeError
        ``result`` is not an ``ldp.v1.Result``.
    ProtocolError
        The campaign is not ``FINISHED``, the result has no clustering (or one with neither
        centers nor a cell map), or the clustering does not validate; the message names the field.
    """
    _expect(result, campaigns_pb2.Result, "result")
    campaign = f"campaign {result.campaign_id!r}" if result.campaign_id else "the campaign"
    if result.state != campaigns_pb2.FINISHED:
        state = _CAMPAIGN_STATES.get(result.state, str(result.state))
        raise ProtocolError(f"result.state: {campaign} is {state}, not FINISHED; "
                            "only a finished campaign's clustering can label points")
    if not result.HasField("clustering"):
        raise ProtocolError(f"result.clustering: {campaign} published no clustering "
                            "(a clustering campaign's result is needed to label points)")
    clustering = result.clustering
    if clustering.centers:
        return _center_model_from_proto(clustering, "result.clustering")
    if clustering.HasField("cell_map") and clustering.cell_map.cells:
        model = _cell_model_from_proto(clustering.cell_map, "result.clustering.cell_map")
        if clustering.dimension not in (0, model.domain.dimension):
            raise ProtocolError(f"result.clustering.dimension: {clustering.dimension} differs from the cell map's "
                                f"domain dimension {model.domain.dimension}")
        return model
    raise ProtocolError(f"result.clustering: {campaign}'s clustering holds neither centers nor a cell map")


def _center_model_from_proto(clustering: campaigns_pb2.Clustering, where: str) -> CenterModel:
    values = list(clustering.centers)
    dimension = clustering.dimension
    if dimension == 0:  # unset: infer it from k
        if clustering.k == 0 or len(values) % clustering.k:
            raise ProtocolError(f"{where}.dimension: unset, and {len(values)} center values cannot be split "
                                f"into k = {clustering.k} centers")
        dimension = len(values) // clustering.k
    if len(values) % dimension:
        raise ProtocolError(f"{where}.centers: {len(values)} values are not a whole number of centers "
                            f"of dimension {dimension}")
    rows = tuple(tuple(values[i:i + dimension]) for i in range(0, len(values), dimension))
    try:
        return CenterModel(centers=rows)
    except (TypeError, InvalidParameterError) as exc:
        raise ProtocolError(f"{where}.centers: {exc}") from exc


def _cell_model_from_proto(cell_map: campaigns_pb2.CellClusterMap, where: str) -> CellClusterModel:
    if not cell_map.HasField("domain"):
        raise ProtocolError(f"{where}.domain: the cell map has no domain")
    model = spec_from_proto(CellClusterModel, cell_map, where=where)
    assert isinstance(model, CellClusterModel)
    return model


def cluster_model_to_proto(model: ClusterModel) -> campaigns_pb2.Clustering:
    """A labelling model -> ``ldp.v1.Clustering`` (the inverse of :func:`cluster_model_from_proto`).

    A :class:`CenterModel` fills ``k``, ``dimension`` and the row-major ``centers``; a
    :class:`CellClusterModel` fills ``cell_map``, ``dimension`` and ``k`` (its number of clusters).
    """
    if isinstance(model, CenterModel):
        return campaigns_pb2.Clustering(k=model.cluster_count, dimension=model.dimension,
                                        centers=[x for row in model.centers for x in row])
    if isinstance(model, CellClusterModel):
        message = campaigns_pb2.Clustering(k=model.cluster_count, dimension=model.domain.dimension)
        spec_to_proto(model, message.cell_map, where="clustering.cell_map")
        return message
    raise TypeError(f"model must be a CellClusterModel or a CenterModel, got {type(model).__name__}")


def _expect(message: Any, cls: type[Message], where: str) -> None:
    if not isinstance(message, cls):
        raise TypeError(f"{where}: expected an {cls.DESCRIPTOR.full_name} message, got {type(message).__name__}")
