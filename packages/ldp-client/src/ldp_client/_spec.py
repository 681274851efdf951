"""Plain-data specification objects that map 1:1 to protobuf messages.

Mechanism parameters, encoders and round specs are frozen dataclasses whose field names equal the
fields of their ``ldp.v1`` message. This module converts them to and from plain dicts (the form
msgpack carries) generically; ``ldp_client.serde`` does the same for protobuf messages. Nested
specs, tuples of scalars and tuples of specs are supported; nothing else is allowed in a spec.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import typing
from typing import Any, ClassVar, TypeVar, get_args, get_origin

from .errors import InvalidParameterError, ProtocolError

__all__ = ["Spec", "SpecRegistry", "grown_field"]

S = TypeVar("S", bound="Spec")
T = TypeVar("T")

#: Field metadata key of :func:`grown_field`.
_GROWN = "ldp_grown"


def grown_field(default: T) -> T:
    """A field the wire grew after its message was released, with its proto3 ``default``.

    It is left out of :meth:`Spec.to_dict` while it holds the default, so a spec that does not
    use it keeps the plain-data (msgpack) form it had before the field existed: the same packed
    round specs, the same digests of a component (the memoized coins' context) and readable by
    devices that predate the field.
    """
    return dataclasses.field(default=default, metadata={_GROWN: True})


class Spec:
    """Mixin for frozen ``kw_only`` dataclasses that mirror a protobuf message."""

    #: Name of the field in the enclosing ``oneof`` (``MechanismSpec``/``EncoderSpec``), if any.
    KIND: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (dicts, lists, ints, floats, strings, bytes)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.metadata.get(_GROWN) and value == f.default:
                continue
            out[f.name] = _dump(value)
        return out

    @classmethod
    def from_dict(cls: type[S], data: Any, *, where: str = "") -> S:
        """Build and validate from :meth:`to_dict` output; any problem is a :class:`ProtocolError`."""
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise ProtocolError(f"{where}: expected a mapping, got {type(data).__name__}")
        hints = _field_types(cls)
        unknown = set(data) - set(hints)
        if unknown:
            raise ProtocolError(f"{where}: unknown field(s) {sorted(map(str, unknown))}")
        kwargs = {name: _load(hints[name], value, f"{where}.{name}") for name, value in data.items()}
        try:
            return cls(**kwargs)
        except (TypeError, InvalidParameterError) as exc:
            raise ProtocolError(f"{where}: {exc}") from exc


_FIELD_TYPES: dict[type, dict[str, Any]] = {}


def _field_types(cls: type) -> dict[str, Any]:
    cached = _FIELD_TYPES.get(cls)
    if cached is None:
        hints = typing.get_type_hints(cls)
        cached = _FIELD_TYPES[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    return cached


def _dump(value: Any) -> Any:
    if isinstance(value, Spec):
        return value.to_dict()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_dump(v) for v in value]
    return value


def _load(tp: Any, value: Any, where: str) -> Any:
    origin = get_origin(tp)
    if origin is tuple:
        item_tp = get_args(tp)[0]
        if not isinstance(value, (list, tuple)):
            raise ProtocolError(f"{where}: expected a list, got {type(value).__name__}")
        return tuple(_load(item_tp, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _load(args[0], value, where)
    if isinstance(tp, type) and issubclass(tp, Spec):
        return tp.from_dict(value, where=where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError as exc:
            raise ProtocolError(f"{where}: {exc}") from exc
    return value  # scalars are checked by the dataclass's own validation


class SpecRegistry:
    """Maps ``KIND`` names of a ``oneof`` to their spec classes (``{"grr": GRRParams, ...}``).

    ``modules`` names the module that defines each kind; it is imported on first use, so a device
    pays the import cost only of the mechanisms and encoders its rounds really use.
    """

    def __init__(self, what: str, package: str = "", modules: dict[str, str] | None = None) -> None:
        self.what = what
        self._package = package
        self._modules = dict(modules or {})
        self._classes: dict[str, type[Spec]] = {}

    def register(self, cls: type[S]) -> type[S]:
        if not cls.KIND or cls.KIND in self._classes:
            raise RuntimeError(f"{self.what}: bad or duplicate KIND {cls.KIND!r} on {cls.__name__}")
        self._classes[cls.KIND] = cls
        return cls

    def load_all(self) -> None:
        """Import every declared module (so that every kind is registered)."""
        for kind in self._modules:
            self.get(kind)

    def declared_kinds(self) -> tuple[str, ...]:
        """Every kind declared or registered, without importing the declaring modules."""
        return tuple(dict.fromkeys([*self._modules, *self._classes]))

    def kinds(self) -> tuple[str, ...]:
        self.load_all()
        return tuple(self._classes)

    def get(self, kind: str) -> type[Spec]:
        cls = self._classes.get(kind)
        if cls is None and kind in self._modules:
            importlib.import_module(f"{self._package}.{self._modules[kind]}")
            cls = self._classes.get(kind)
        if cls is None:
            known = sorted(set(self._classes) | set(self._modules))
            raise ProtocolError(f"unknown {self.what} {kind!r}; known: {known}")
        return cls

    def dump(self, spec: Spec) -> dict[str, Any]:
        """``{kind: fields}``, the plain-data form of the ``oneof``."""
        return {spec.KIND: spec.to_dict()}

    def load(self, data: Any, *, where: str = "") -> Spec:
        where = where or self.what
        if not isinstance(data, dict) or len(data) != 1:
            raise ProtocolError(f"{where}: expected a mapping with exactly one {self.what} kind")
        ((kind, fields),) = data.items()
        if not isinstance(kind, str):
            raise ProtocolError(f"{where}: {self.what} kind must be a string, got {type(kind).__name__}")
        return self.get(kind).from_dict(fields, where=f"{where}.{kind}")
