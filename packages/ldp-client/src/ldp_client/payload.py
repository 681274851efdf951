"""Mechanism outputs ("payloads") as plain Python values, and their compact msgpack form.

========================  =============================  ==========================
mechanism                 Python value                   ``ldp.v1.Payload`` field
========================  =============================  ==========================
GRR                       ``int``                        ``index``
unary encoding, bitwise   ``bytes`` (packed bits)        ``bits``
RR, box vector
local hashing             :class:`HashedValue`           ``hashed``
discrete Laplace          :class:`Integers`              ``integers``
l2-ball vector            :class:`Floats`                ``floats``
bucketized vector         :class:`SignedVector`          ``signed_vector``
========================  =============================  ==========================

Bits are packed little-endian within bytes: bit ``i`` is ``(data[i // 8] >> (i % 8)) & 1``. A
:class:`SignedVector` wraps the output of the box (``bytes``) or l2-ball (:class:`Floats`)
randomizer with the report's 32-bit sign seed.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple, Union

from ._validation import describe
from .errors import ProtocolError

__all__ = [
    "MAX_BITS",
    "Floats",
    "HashedValue",
    "Integers",
    "Payload",
    "SignedVector",
    "get_bit",
    "pack_bits",
    "payload_from_wire",
    "payload_to_wire",
    "unpack_bits",
]


class HashedValue(NamedTuple):
    """Local hashing output: the hash seed and the randomized bucket."""

    seed: int
    value: int


class Integers(NamedTuple):
    """Noisy integer coordinates."""

    values: tuple[int, ...]


class Floats(NamedTuple):
    """Float coordinates (sent as IEEE float32)."""

    values: tuple[float, ...]


class SignedVector(NamedTuple):
    """Bucketized vector output: the 32-bit sign seed and the inner box (``bytes``) or l2-ball report."""

    seed: int
    inner: bytes | Floats


Payload = Union[int, bytes, HashedValue, Integers, Floats, SignedVector]

#: Longest bit vector a payload carries, in bits: the largest unary-encoding domain and the longest
#: bitwise randomized-response vector. With the float coordinates of the vector randomizers it
#: bounds the binary strings a report decoder accepts (:mod:`ldp_client.report`).
MAX_BITS = 2**20

_HASHED, _INTEGERS, _FLOATS, _SIGNED_VECTOR = 3, 4, 5, 6
_MAX_U64 = 2**64 - 1
_MAX_U32 = 2**32 - 1
#: Largest signed 64-bit integer: the range of the wire's integer payloads (sint64).
MAX_S64 = 2**63 - 1


def pack_bits(bits: list[int] | tuple[int, ...] | list[bool]) -> bytes:
    """Pack a 0/1 sequence little-endian within bytes."""
    out = bytearray((len(bits) + 7) // 8)
    for i, b in enumerate(bits):
        if b:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def unpack_bits(data: bytes, length: int) -> list[int]:
    """Inverse of :func:`pack_bits` for a vector of ``length`` bits."""
    return [(data[i >> 3] >> (i & 7)) & 1 for i in range(length)]


def get_bit(data: bytes, i: int) -> int:
    return (data[i >> 3] >> (i & 7)) & 1


def payload_to_wire(payload: Payload) -> Any:
    """Compact msgpack-ready form.

    An index travels as a bare msgpack integer and packed bits as a bare msgpack binary (the two
    most common payloads, kept minimal); the others as ``[tag, ...]`` with tag = the
    ``ldp.v1.Payload`` field number. A :class:`SignedVector` is ``[6, seed, inner]`` with ``inner``
    the wire form of its inner payload (bare binary for signs, ``[5, float32 bytes]`` for floats).
    """
    if isinstance(payload, bool):
        raise ProtocolError("payload must not be a bool")
    if isinstance(payload, int):
        return payload
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, HashedValue):
        return [_HASHED, payload.seed, payload.value]
    if isinstance(payload, Integers):
        return [_INTEGERS, list(payload.values)]
    if isinstance(payload, Floats):
        return [_FLOATS, struct.pack(f"<{len(payload.values)}f", *payload.values)]
    if isinstance(payload, SignedVector):
        if not isinstance(payload.inner, (bytes, Floats)):
            raise ProtocolError(f"signed vector inner payload must be bytes or Floats, got {type(payload.inner).__name__}")
        return [_SIGNED_VECTOR, payload.seed, payload_to_wire(payload.inner)]
    raise ProtocolError(f"unsupported payload type {type(payload).__name__}")


def _is_int(v: Any, low: int, high: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def payload_from_wire(data: Any, where: str = "payload") -> Payload:
    """Inverse of :func:`payload_to_wire`; malformed input raises :class:`ProtocolError`."""
    if _is_int(data, 0, _MAX_U64):
        return int(data)
    if isinstance(data, (bytes, bytearray)):
        return bytes(data)
    if not isinstance(data, (list, tuple)) or not data:
        raise ProtocolError(f"{where}: expected an index, bits or a non-empty list [tag, ...]")
    tag = data[0]
    if tag == _HASHED and len(data) == 3 and _is_int(data[1], 0, _MAX_U64) and _is_int(data[2], 0, _MAX_U32):
        return HashedValue(int(data[1]), int(data[2]))
    if tag == _INTEGERS and len(data) == 2 and isinstance(data[1], (list, tuple)):
        if all(_is_int(v, -MAX_S64 - 1, MAX_S64) for v in data[1]):
            return Integers(tuple(int(v) for v in data[1]))
    if tag == _FLOATS and len(data) == 2 and isinstance(data[1], (bytes, bytearray)) and len(data[1]) % 4 == 0:
        return Floats(struct.unpack(f"<{len(data[1]) // 4}f", data[1]))
    if tag == _SIGNED_VECTOR and len(data) == 3 and _is_int(data[1], 0, _MAX_U32):
        inner = data[2]
        if isinstance(inner, (bytes, bytearray)):
            return SignedVector(int(data[1]), bytes(inner))
        if isinstance(inner, (list, tuple)) and inner and inner[0] == _FLOATS:
            floats = payload_from_wire(inner, f"{where}.inner")
            assert isinstance(floats, Floats)
            return SignedVector(int(data[1]), floats)
    raise ProtocolError(f"{where}: malformed payload (tag {describe(tag)}, {len(data)} items)")
