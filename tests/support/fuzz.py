"""Mutation engines for the fuzz suites: hostile variants of valid protobuf and msgpack messages.

:class:`Mutator` turns a valid message into a malformed one at three levels:

* raw bytes -- random bytes, truncation, bit flips, byte insertions/deletions, splices;
* the protobuf wire format -- field-tag and wire-type confusion, length prefixes that lie (too
  short, too long, huge), duplicated, dropped and unknown fields, and the same recursively inside
  nested messages (:func:`parse_wire` / :func:`encode_wire`);
* msgpack values -- a node of the decoded tree replaced by a hostile value (wrong types, huge
  ints, NaN/inf, deep nesting, oversized strings), or raw msgpack headers declaring huge lengths.

Counts come from the environment so one test runs CI-sized by default and at full size in the
fuzz environment: :func:`env_count`.
"""

from __future__ import annotations

import math
import os
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from ldp_client.encoders import ENCODERS, CategoricalEncoder, Encoder, NumericDomain
from ldp_client.encoders.grid import UniformGridEncoder
from ldp_client.errors import ProtocolError
from ldp_client.mechanisms import GRRParams, LocalHashingParams, UnaryEncodingParams
from ldp_client.mechanisms.discrete_laplace import DiscreteLaplaceParams
from ldp_client.mechanisms.unary_encoding import UnaryVariant
from ldp_client.report import Report
from ldp_client.rng import SeededRng
from ldp_client.spec import Component, GroupTask, RoundSpec

__all__ = [
    "HOSTILE_SCALARS",
    "SPECS",
    "Mutator",
    "WireField",
    "encode_wire",
    "env_count",
    "honest_reports",
    "hostile_msgpack_bytes",
    "parse_wire",
]

#: Varint, 64-bit, length-delimited, start group, end group, 32-bit.
VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5


def env_count(name: str, default: int) -> int:
    """A positive count from the environment variable ``name`` (``default`` when unset)."""
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}")
    return value


# -- the protobuf wire format ---------------------------------------------------------------------

@dataclass
class WireField:
    """One top-level field of a serialized protobuf message: number, wire type and raw value.

    ``value`` is the varint as an int (VARINT), the payload bytes (LEN) or the fixed-width bytes
    (I32, I64); groups are not produced by our messages and are kept as raw bytes.
    """

    number: int
    wire_type: int
    value: int | bytes


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def varint(value: int) -> bytes:
    """The protobuf varint of a non-negative int (negative ints as their 64-bit two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def parse_wire(data: bytes) -> list[WireField] | None:
    """The top-level fields of a serialized message, or ``None`` when it is not well formed."""
    fields: list[WireField] = []
    pos = 0
    try:
        while pos < len(data):
            key, pos = _read_varint(data, pos)
            number, wire_type = key >> 3, key & 7
            if wire_type == VARINT:
                value, pos = _read_varint(data, pos)
                fields.append(WireField(number, wire_type, value))
            elif wire_type == LEN:
                length, pos = _read_varint(data, pos)
                if pos + length > len(data):
                    return None
                fields.append(WireField(number, wire_type, data[pos:pos + length]))
                pos += length
            elif wire_type in (I32, I64):
                width = 4 if wire_type == I32 else 8
                if pos + width > len(data):
                    return None
                fields.append(WireField(number, wire_type, data[pos:pos + width]))
                pos += width
            else:
                return None
    except ValueError:
        return None
    return fields


def encode_wire(fields: list[WireField]) -> bytes:
    """Inverse of :func:`parse_wire` (any number and wire type, so hostile combinations too)."""
    out = bytearray()
    for f in fields:
        out += varint(f.number << 3 | f.wire_type)
        if isinstance(f.value, int):
            out += varint(f.value)
        elif f.wire_type == LEN:
            out += varint(len(f.value)) + f.value
        else:
            out += f.value
    return bytes(out)


# -- hostile msgpack ------------------------------------------------------------------------------

#: Values a hostile device may put anywhere in a msgpack tree.
HOSTILE_SCALARS: tuple[Any, ...] = (
    0, 1, -1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, -(2**63), 2**64 - 1, True, False, None,
    0.5, -0.0, math.nan, math.inf, -math.inf, 1e308, "", "x", "a" * 129, "\u00e9\u4e2d", "bad id",
    b"", b"\x00", b"\xff" * 15, b"\xff" * 16, b"\xff" * 17, b"\x00" * 4096, [], [1], {}, {"a": 1}, {1: 2},
)


def hostile_msgpack_bytes(rng: random.Random) -> bytes:
    """A msgpack fragment whose header lies or that the packer would refuse to produce."""
    choice = rng.randrange(10)
    if choice == 0:  # array32 / map32 declaring ~4 G entries, backed by a few bytes
        return rng.choice([b"\xdd", b"\xdf"]) + struct.pack(">I", rng.choice([2**32 - 1, 2**31, 10**6])) + b"\xc0" * 3
    if choice == 1:  # bin32 / str32 / ext32 declaring a huge length
        return rng.choice([b"\xc6", b"\xdb", b"\xc9"]) + struct.pack(">I", rng.choice([2**32 - 1, 2**24])) + b"ab"
    if choice == 2:  # nesting far deeper than any report
        depth = rng.choice([64, 600, 5000, 100_000])
        return b"\x91" * depth + b"\xc0"
    if choice == 3:  # invalid UTF-8 in a str
        return b"\xa4\xff\xfe\xfd\xfc"
    if choice == 4:  # the reserved byte, never valid
        return b"\xc1"
    if choice == 5:  # ext types (timestamps and unknown ones)
        return rng.choice([b"\xd6\xff\x00\x00\x00\x01", b"\xd4\x05\x00", b"\xc7\x03\x07abc"])
    if choice == 6:  # a map with a non-str key, and one with a huge key
        return rng.choice([b"\x81\x01\x02", b"\x81\xc4\x01a\x01", b"\x81\x90\x01"])
    if choice == 7:  # float32/float64 NaN and infinities
        return rng.choice([b"\xca\x7f\xc0\x00\x00", b"\xcb\x7f\xf0" + b"\x00" * 6, b"\xcb\xff\xf8" + b"\x00" * 6])
    if choice == 8:  # a uint64 beyond the int64 range, and the most negative int64
        return rng.choice([b"\xcf" + b"\xff" * 8, b"\xd3\x80" + b"\x00" * 7])
    return rng.randbytes(rng.randrange(1, 24))


def _nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


# -- the mutator ----------------------------------------------------------------------------------

class Mutator:
    """Seeded hostile variants of valid messages.

    Parameters
    ----------
    rng : random.Random
        Simulation randomness (seeded by the test for reproducibility).
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    # raw bytes
    def random_bytes(self, max_len: int = 300) -> bytes:
        return self.rng.randbytes(self.rng.randrange(0, max_len + 1))

    def truncate(self, data: bytes) -> bytes:
        return data[: self.rng.randrange(0, len(data))] if data else data

    def bit_flips(self, data: bytes) -> bytes:
        if not data:
            return b"\x00"
        out = bytearray(data)
        for _ in range(self.rng.choice([1, 1, 2, 3, 8])):
            i = self.rng.randrange(len(out) * 8)
            out[i >> 3] ^= 1 << (i & 7)
        return bytes(out)

    def byte_edits(self, data: bytes) -> bytes:
        out = bytearray(data)
        for _ in range(self.rng.randrange(1, 4)):
            at = self.rng.randrange(len(out) + 1)
            op = self.rng.randrange(4)
            if op == 0:
                out[at:at] = self.rng.randbytes(self.rng.randrange(1, 9))
            elif op == 1 and out:
                del out[at:at + self.rng.randrange(1, 9)]
            elif op == 2 and out:
                out[min(at, len(out) - 1)] = self.rng.choice([0x00, 0xFF, 0x7F, 0x80, 0xC1])
            else:  # duplicate a chunk somewhere else
                chunk = bytes(out[at:at + self.rng.randrange(1, 32)])
                where = self.rng.randrange(len(out) + 1)
                out[where:where] = chunk
        return bytes(out)

    def raw(self, data: bytes) -> bytes:
        """One raw-byte mutation of ``data``."""
        op: Callable[[bytes], bytes] = self.rng.choice([self.truncate, self.bit_flips, self.byte_edits])
        return op(data)

    # protobuf wire format
    def wire(self, data: bytes, depth: int = 0) -> bytes:
        """One wire-format mutation of a serialized message (recursing into nested messages)."""
        fields = parse_wire(data)
        if fields is None or not fields:
            return self.raw(data) if data else encode_wire([self._random_field()])
        rng = self.rng
        k = rng.randrange(len(fields))
        f = fields[k]
        op = rng.randrange(9)
        if op == 0:  # wire-type confusion: the same field number with another wire type
            wire_type = rng.choice([t for t in (VARINT, I64, LEN, I32) if t != f.wire_type])
            fields[k] = WireField(f.number, wire_type, self._value_of(wire_type))
        elif op == 1:  # field-tag confusion: the value under another (possibly unknown) number
            fields[k] = WireField(rng.choice([1, 2, 3, 4, 5, 6, 7, 15, 16, 100, 536870911]), f.wire_type, f.value)
        elif op == 2 and f.wire_type == LEN:  # a length prefix that lies
            assert isinstance(f.value, bytes)
            head = bytearray(encode_wire(fields[:k]))
            declared = rng.choice([len(f.value) + 1, len(f.value) + 1000, max(0, len(f.value) - 1), 2**31, 2**63])
            head += varint(f.number << 3 | LEN) + varint(declared) + f.value
            return bytes(head + encode_wire(fields[k + 1:]))
        elif op == 3 and f.wire_type == LEN and depth < 4 and f.value:  # recurse into a nested message
            assert isinstance(f.value, bytes)
            fields[k] = WireField(f.number, LEN, self.wire(f.value, depth + 1))
        elif op == 4:  # duplicate a field (last one wins for scalars, repeated fields grow)
            fields.insert(rng.randrange(len(fields) + 1), WireField(f.number, f.wire_type, f.value))
        elif op == 5:  # drop a field
            del fields[k]
        elif op == 6:  # an unknown field, or a known number with a random value
            fields.insert(rng.randrange(len(fields) + 1), self._random_field())
        elif op == 7 and f.wire_type == VARINT:  # extreme varints (bools, enums, uint32 overflow)
            fields[k] = WireField(f.number, VARINT, rng.choice([0, 1, 2, 2**31, 2**32, 2**32 - 1, 2**63, 2**64 - 1]))
        elif op == 8 and f.wire_type == LEN:  # replace a string/bytes value
            fields[k] = WireField(f.number, LEN, self._value_of(LEN))
        else:
            return self.raw(data)
        return encode_wire(fields)

    def _value_of(self, wire_type: int) -> int | bytes:
        rng = self.rng
        if wire_type == VARINT:
            return rng.choice([0, 1, 127, 128, 2**32 - 1, 2**63, 2**64 - 1, rng.getrandbits(64)])
        if wire_type == I64:
            return rng.randbytes(8)
        if wire_type == I32:
            return rng.randbytes(4)
        return rng.choice([b"", b"\xff\xfe", "é".encode() * 3, rng.randbytes(rng.randrange(0, 40)),
                           b"a" * rng.choice([129, 300, 5000]), b"\x00" * 16])

    def _random_field(self) -> WireField:
        wire_type = self.rng.choice([VARINT, I64, LEN, I32])
        return WireField(self.rng.choice([1, 2, 3, 4, 9, 99, 12345]), wire_type, self._value_of(wire_type))

    # msgpack values
    def hostile_value(self) -> Any:
        rng = self.rng
        if rng.random() < 0.15:
            return _nested(rng.choice([2, 10, 100, 400]), rng.choice(HOSTILE_SCALARS))
        return rng.choice(HOSTILE_SCALARS)

    def tree(self, value: Any) -> Any:
        """``value`` (a decoded msgpack tree) with one node replaced, dropped or duplicated."""
        rng = self.rng
        if not isinstance(value, (list, dict)) or not value or rng.random() < 0.2:
            return self.hostile_value()
        if isinstance(value, dict):
            key = rng.choice(list(value))
            out = dict(value)
            if rng.random() < 0.1:
                del out[key]
            else:
                out[key] = self.tree(out[key])
            return out
        items = list(value)
        k = rng.randrange(len(items))
        op = rng.random()
        if op < 0.7:
            items[k] = self.tree(items[k])
        elif op < 0.8:
            del items[k]
        elif op < 0.9:
            items.insert(k, items[k])
        else:
            items.append(self.hostile_value())
        return items

    def msgpack(self, packed: bytes) -> bytes:
        """A hostile variant of a msgpack document: a tree edit, a lying header, or raw bytes."""
        rng = self.rng
        op = rng.random()
        if op < 0.55:
            try:
                value = msgpack.unpackb(packed, raw=False, strict_map_key=False)
            except Exception:  # not msgpack (any more): mutate the bytes
                return self.raw(packed)
            try:
                mutated: bytes = msgpack.packb(self.tree(value), use_bin_type=True)
            except (ValueError, OverflowError, TypeError):  # too deep or too big to pack: a lying header
                return hostile_msgpack_bytes(rng)
            return mutated
        if op < 0.75:  # splice a hostile fragment in place of a random slice
            at = rng.randrange(len(packed) + 1)
            return packed[:at] + hostile_msgpack_bytes(rng) + packed[at + rng.randrange(0, 8):]
        if op < 0.85:
            return hostile_msgpack_bytes(rng)
        return self.raw(packed)


# -- valid messages to start from ---------------------------------------------------------------

DOMAIN = NumericDomain(lower=(0.0, -1.0), upper=(1.0, 1.0))


def _encoder_for(mechanism: DiscreteLaplaceParams) -> Encoder:
    """A registered numeric encoder whose output feeds ``mechanism``."""
    for kind in ENCODERS.kinds():
        cls = ENCODERS.get(kind)
        if getattr(cls, "VALUE_KIND", None) != mechanism.INPUT_KIND:
            continue
        try:
            encoder = cls.from_dict({"domain": DOMAIN.to_dict()})
        except ProtocolError:
            continue
        assert isinstance(encoder, Encoder)
        if encoder.output_size == mechanism.input_size:
            return encoder
    raise LookupError("no registered encoder feeds the discrete Laplace mechanism")


def example_specs() -> list[RoundSpec]:
    """Round specs covering the payload families of histogram, grid and Laplace rounds: GRR,
    optimized unary encoding, local hashing, a two-component group and discrete Laplace."""
    grr = Component(encoder=CategoricalEncoder(domain_size=5), mechanism=GRRParams(domain_size=5, epsilon=1.0))
    oue = Component(encoder=CategoricalEncoder(domain_size=20),
                    mechanism=UnaryEncodingParams(domain_size=20, epsilon=1.0, variant=UnaryVariant.OPTIMIZED))
    olh = Component(encoder=CategoricalEncoder(domain_size=300),
                    mechanism=LocalHashingParams(domain_size=300, epsilon=2.0))
    grid = Component(encoder=UniformGridEncoder(domain=DOMAIN, cells_per_dimension=(4, 3)),
                     mechanism=GRRParams(domain_size=12, epsilon=1.0))
    second = Component(encoder=UniformGridEncoder(domain=DOMAIN, cells_per_dimension=(2, 2)),
                       mechanism=GRRParams(domain_size=4, epsilon=0.5))
    integers = DiscreteLaplaceParams(dimension=2, epsilon=1.0, grid_bits=6)
    return [
        RoundSpec(campaign_id="hist-grr", round=1, group_weights=(1,),
                  tasks=(GroupTask(groups=(0,), components=(grr,)),), campaign_epsilon=1.0),
        RoundSpec(campaign_id="hist-oue", round=3, group_weights=(1, 1),
                  tasks=(GroupTask(groups=(0,), components=(oue,)), GroupTask(groups=(1,), components=(olh,))),
                  campaign_epsilon=2.0, deadline=1.9e9, kind="histogram"),
        RoundSpec(campaign_id="grid.2d", round=2, group_weights=(3, 1),
                  tasks=(GroupTask(groups=(0, 1), components=(grid, second)),), campaign_epsilon=1.5,
                  max_reports_per_device=2, kind="grid"),
        RoundSpec(campaign_id="laplace", round=1, group_weights=(1,),
                  tasks=(GroupTask(groups=(0,), components=(Component(encoder=_encoder_for(integers),
                                                                       mechanism=integers),)),),
                  campaign_epsilon=1.0),
    ]


SPECS = example_specs()
#: A point each spec's encoders accept.
_POINTS: list[Any] = [3, 7, (0.3, -0.2), (0.5, 0.5)]


def honest_reports(seed: int, n: int, specs: list[RoundSpec] | None = None) -> list[Report]:
    """``n`` reports of the example specs (every task of each in turn), as devices would send them."""
    rng = SeededRng(seed)
    specs = SPECS if specs is None else specs
    out = []
    for i in range(n):
        k = i % len(specs)
        spec, point = specs[k], _POINTS[k % len(_POINTS)]
        task = spec.tasks[(i // len(specs)) % len(spec.tasks)]
        out.append(Report(report_id=rng.token_bytes(16), campaign_id=spec.campaign_id, round=spec.round,
                          group=task.groups[0], payloads=tuple(c.run(point, rng=rng) for c in task.components)))
    return out
