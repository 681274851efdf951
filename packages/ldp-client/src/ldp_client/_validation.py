"""Eager parameter checks shared by every module; messages name the parameter, range and value."""

from __future__ import annotations

import math
from typing import Any

import msgpack

from .budget import MAX_MECHANISM_EPSILON
from .errors import EncodingError, InvalidParameterError

#: Words for the SDK's payload types (their ``ldp.v1`` messages), for :func:`describe`.
_PAYLOAD_WORDS = {"HashedValue": "a hashed value", "SignedVector": "a signed vector", "Floats": "floats",
                  "Integers": "integers"}


def describe(value: object) -> str:
    """``value`` in words no programming language owns, for messages that may reach the wire.

    A collector sends these messages to devices written in any language (``ReportOutcome.reason``,
    ``docs/errors.md``): they name kinds and sizes -- "3 bytes", "a string of 6 characters",
    "a map of 2 entries" -- never a repr (``b'\x01'``) or a Python type name (``tuple``). Numbers
    are written as numbers.
    """
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return f"a string of {_count(len(value), 'character')}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _count(len(value), "byte")
    if isinstance(value, dict):
        return f"a map of {_count(len(value), 'entry', 'entries')}"
    words = _PAYLOAD_WORDS.get(type(value).__name__)
    if words is not None:
        return words
    if isinstance(value, (list, tuple)):
        return f"an array of {_count(len(value), 'item')}"
    return "a value of another kind"


def _count(n: int, one: str, many: str = "") -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def check_int(name: str, value: Any, low: int, high: int) -> int:
    """Return ``value`` if it is an ``int`` (not ``bool``) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {describe(value)}")
    if not low <= value <= high:
        raise InvalidParameterError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def check_float(name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> float:
    """Return ``value`` as a float if it is a finite real number in ``[low, high]`` (or ``(low, high]``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        raise InvalidParameterError(f"{name} must be finite, got {v}")
    if (v <= low if low_open else v < low) or v > high:
        bracket = "(" if low_open else "["
        raise InvalidParameterError(f"{name} must be in {bracket}{low:g}, {high:g}], got {v:g}")
    return v


def check_msgpack_complete(data: bytes) -> None:
    """Raise (a msgpack exception) unless ``data`` holds one complete msgpack document.

    ``msgpack.unpackb`` allocates every array for its declared length before reading the entries,
    so a few kilobytes of nested headers each declaring 100 000 entries would cost tens of
    megabytes. Skipping the document first builds no objects; once it passes, every declared entry
    is present in the bytes and decoding allocates in proportion to the input. It costs about 5%
    of the decode.
    """
    unpacker = msgpack.Unpacker(max_buffer_size=len(data))
    unpacker.feed(data)
    unpacker.skip()


def check_epsilon(value: Any, name: str = "epsilon") -> float:
    """Return a valid per-mechanism epsilon in ``(0, MAX_MECHANISM_EPSILON]``."""
    return check_float(name, value, 0.0, MAX_MECHANISM_EPSILON, low_open=True)


def check_vector(name: str, value: Any, dimension: int) -> list[float]:
    """Return ``value`` as a list of floats if it is a list or tuple of ``dimension`` finite reals.

    ``TypeError`` for a non-sequence or a non-real coordinate; :class:`EncodingError` for a wrong
    length or a NaN / infinite coordinate. Range checks are left to the caller.
    """
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list or tuple of {dimension} floats, got {type(value).__name__}")
    if len(value) != dimension:
        raise EncodingError(f"{name} must have dimension {dimension}, got {len(value)}")
    out = []
    for j, x in enumerate(value):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise TypeError(f"{name} coordinate {j} must be a real number, got {type(x).__name__}")
        try:
            v = float(x)
        except OverflowError:  # an int beyond the float range
            v = math.inf
        if not math.isfinite(v):
            raise EncodingError(f"{name} coordinate {j} must be finite, got {x!r:.40}")
        out.append(v)
    return out
