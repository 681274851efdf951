"""Shared by the encoder and generator areas: JSON values of floats and big integers, and the
vector shapes ``{"encoder": ..., "points": ...} -> {"values": ...}`` and error cases.

JSON conventions (``docs/protocol.md`` §11): a binary64 value is a JSON number written as the
shortest decimal that reads back as the same double (every JSON parser that rounds correctly
recovers it exactly); a non-finite one is the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``;
an integer of magnitude ``2^53`` or more is a decimal string. An encoder is the ``EncoderSpec``
oneof as ``{kind: fields}`` with the ``.proto`` field names.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ldp_client.encoders.base import ENCODERS, Encoder
from ldp_client.errors import LdpError

_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def to_json(value: Any) -> Any:
    """``value`` with big integers as decimal strings, non-finite floats as strings, tuples as lists."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value) if abs(value) >= 2**53 else value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    raise TypeError(f"no JSON form for {type(value).__name__}")


def from_json(value: Any) -> Any:
    """Inverse of :func:`to_json` (decimal strings back to integers, lists stay lists)."""
    if isinstance(value, str):
        if value in _NON_FINITE:
            return _NON_FINITE[value]
        return int(value) if value.lstrip("-").isdigit() else value
    if isinstance(value, dict):
        return {k: from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value


def load_encoder(data: Any) -> Encoder:
    """The SDK encoder of an ``EncoderSpec`` in JSON form."""
    encoder = ENCODERS.load(from_json(data))
    assert isinstance(encoder, Encoder)
    return encoder


def encode_vector(name: str, encoder: Encoder, points: Sequence[Sequence[float] | int],
                  extra: Callable[[Encoder, Any], dict[str, Any]] | None = None) -> dict[str, Any]:
    """A vector: the encoder, its points and each point's encoded value (plus ``extra`` fields)."""
    outputs = [encoder.encode(p) for p in points]
    output: dict[str, Any] = {"values": to_json(outputs)}
    if extra is not None:
        for key, value in extra(encoder, points).items():
            output[key] = to_json(value)
    return {"name": name, "input": {"encoder": to_json(ENCODERS.dump(encoder)), "points": to_json(points)},
            "output": output}


def error_vector(name: str, encoder: dict[str, Any], error: str, point: Any = None) -> dict[str, Any]:
    """A case a device MUST reject: an invalid encoder, or (with ``point``) an invalid point."""
    data: dict[str, Any] = {"encoder": to_json(encoder)}
    if point is not None:
        data["point"] = to_json(point)
    return {"name": name, "input": data, "output": {"error": error}}


def verify_vector(vector: dict[str, Any],
                  extra: Callable[[Encoder, Any], dict[str, Any]] | None = None) -> None:
    """Recompute a vector of :func:`encode_vector` or :func:`error_vector` with the SDK."""
    name, data, output = vector["name"], vector["input"], vector["output"]
    if "error" in output:
        try:
            encoder = load_encoder(data["encoder"])
            if "point" in data:
                encoder.encode(from_json(data["point"]))
        except (LdpError, TypeError, ValueError):
            return
        raise AssertionError(f"{name}: accepted, but must be rejected: {output['error']}")
    encoder = load_encoder(data["encoder"])
    points = from_json(data["points"])
    got = to_json([encoder.encode(p) for p in points])
    assert got == output["values"], f"{name}: {got} != {output['values']}"
    if extra is not None:
        for key, value in extra(encoder, points).items():
            assert to_json(value) == output[key], f"{name}: {key}: {to_json(value)} != {output[key]}"
    assert set(output) == {"values", *(extra(encoder, points) if extra else {})}, f"{name}: unknown outputs"
