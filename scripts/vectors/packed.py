"""The packed batch of ``SubmitPacked`` (msgpack) and its fields, both ways, with every payload tag.

Payload vectors: a payload (JSON form keyed by its ``ldp.v1.Payload`` field) and its msgpack bytes.
Batch vectors: ``request_id`` and the reports (``report_id`` as hex, payloads in JSON form) and the
packed bytes (hex); both directions hold. ``decode_only`` vectors are valid non-shortest encodings a
collector MUST accept (a writer MUST NOT be checked against them). Error vectors hold bytes a
collector MUST refuse: ``error`` refuses the whole request (``INVALID_ARGUMENT``, field ``packed``);
``reports`` with an ``error`` entry rejects that report alone (``REJECTION_CODE_MALFORMED_REPORT``),
the others being decoded as usual. Error texts are informative only: a conforming implementation
refuses the same inputs, in any words.
"""

from __future__ import annotations

from typing import Any

import msgpack

from ldp_client.errors import ProtocolError
from ldp_client.payload import Floats, HashedValue, Integers, SignedVector, payload_from_wire, payload_to_wire
from ldp_client.report import MAX_BATCH_REPORTS, Report, pack_batch, unpack_batch

from ._common import check, payload_from_json, payload_json

SECTION = "§8.3"

_ID = bytes(range(16))
_ID2 = bytes.fromhex("6553f10012ab34cd56ef7890aabbccdd")

_PAYLOADS: list[tuple[str, Any]] = [
    ("index-0", 0), ("index-127", 127), ("index-128", 128), ("index-65536", 65536), ("index-2^32", 2**32),
    ("index-2^64-1", 2**64 - 1),
    ("bits-empty", b""), ("bits-1-byte", b"\x05"), ("bits-3-bytes", bytes([0xFF, 0x00, 0x01])),
    ("hashed-0-0", HashedValue(0, 0)), ("hashed-max", HashedValue(2**32 - 1, 2**32 - 1)),
    ("hashed-mid", HashedValue(123456789, 20)),
    ("integers-empty", Integers(())), ("integers-mixed", Integers((0, -1, 1, -33, 127, 128, -(2**31), 2**40))),
    ("integers-extremes", Integers((-(2**63), 2**63 - 1))),
    ("floats", Floats((0.0, -0.0, 1.0, -0.5, 0.1000000014901161193847656250, 3.4028234663852886e38))),
    ("signed-vector-bits", SignedVector(7, b"\x0b")),
    ("signed-vector-floats", SignedVector(2**32 - 1, Floats((0.6000000238418579, -0.800000011920929)))),
]


def _report_json(report: Report) -> dict[str, Any]:
    return {"report_id": report.report_id.hex(), "campaign_id": report.campaign_id, "round": report.round,
            "group": report.group, "payloads": [payload_json(p) for p in report.payloads]}


def _report_from_json(data: dict[str, Any]) -> Report:
    return Report(report_id=bytes.fromhex(data["report_id"]), campaign_id=data["campaign_id"],
                  round=int(data["round"]), group=int(data["group"]),
                  payloads=tuple(payload_from_json(p) for p in data["payloads"]))


def _batches() -> list[tuple[str, str, list[Report]]]:
    def report(payloads: tuple[Any, ...], **fields: Any) -> Report:
        base: dict[str, Any] = {"report_id": _ID, "campaign_id": "traffic-2026", "round": 0, "group": 0}
        return Report(**{**base, **fields}, payloads=payloads)

    every_tag = [report((p,), report_id=bytes([i]) * 16, group=i) for i, (_, p) in enumerate(_PAYLOADS)]
    return [
        ("empty", "a", []),
        ("one-index", "0123456789abcdef0123456789abcdef", [report((3,))]),
        ("every-tag", "every-tag", every_tag),
        ("eight-components", "components",
         [report((1, b"\x01", HashedValue(5, 1), Integers((2,)), Floats((0.25,)), SignedVector(1, b"\x01"),
                  2**40, b""), round=2**32 - 1, group=4095)]),
        ("two-campaigns", "x" * 128,
         [report((1,)), report((HashedValue(9, 3),), report_id=_ID2, campaign_id="A." + "z" * 126, round=7)]),
        ("unicode-request-id", "\u00e9\u4e2d\U0001f600", [report((0,))]),
        # 128 characters (code points, not UTF-16 units) of 4 UTF-8 bytes: the longest request id.
        ("request-id-128-emoji", "\U0001f600" * 128, [report((0,))]),
    ]


def _decoded(packed: bytes) -> dict[str, Any]:
    request_id, reports = unpack_batch(packed)
    return {"request_id": request_id,
            "reports": [{"error": str(r)} if isinstance(r, ProtocolError) else _report_json(r) for r in reports]}


def _refused(packed: bytes) -> str:
    try:
        unpack_batch(packed)
    except ProtocolError as exc:
        return str(exc)
    raise AssertionError("the packed batch was accepted, expected a refusal")


def _pack(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def _report_wire(**changes: Any) -> list[Any]:
    wire = [1, _ID, "traffic-2026", 0, 0, [3]]
    names = ["version", "report_id", "campaign_id", "round", "group", "payloads"]
    for name, value in changes.items():
        wire[names.index(name)] = value
    return wire


def _decode_only() -> list[tuple[str, bytes]]:
    shortest = _pack([1, "r", [_report_wire()]])
    # The same batch with its round, group and index written as 64-bit integers, and its request id
    # as a str8 instead of a fixstr.
    wide = (b"\x93\x01\xd9\x01r\x91\x96\x01\xc4\x10" + _ID + b"\xactraffic-2026"
            + b"\xcf" + bytes(8) + b"\xcf" + bytes(8) + b"\x91\xcf" + (3).to_bytes(8, "big"))
    assert _decoded(wide) == _decoded(shortest)
    return [("wide-integers-str8", wide),
            ("array16-headers", b"\xdc\x00\x03\x01\xa1r\xdc\x00\x01" + shortest[5:])]


def _batch_errors() -> list[tuple[str, bytes]]:
    nested: Any = 0
    for _ in range(17):  # with the report and its payload list: 19 arrays, one more than a report may hold
        nested = [nested]
    return [
        ("nineteen-arrays-in-a-report", _pack([1, "r", [_report_wire(payloads=[nested])]])),
        ("not-an-array", _pack({"a": 1})),
        ("version-2", _pack([2, "r", []])),
        ("empty-request-id", _pack([1, "", []])),
        ("request-id-129", _pack([1, "x" * 129, []])),
        ("request-id-129-emoji", _pack([1, "\U0001f600" * 129, []])),
        ("request-id-binary", _pack([1, b"r", []])),
        ("request-id-not-utf8", b"\x93\x01\xa2\xc3\x28\x90"),
        ("reports-not-array", _pack([1, "r", 5])),
        ("declares-10001", b"\x93\x01\xa1r\xdd" + (MAX_BATCH_REPORTS + 1).to_bytes(4, "big")),
        ("cut-short", _pack([1, "r", [_report_wire()]])[:-1]),
        ("trailing-byte", _pack([1, "r", []]) + b"\x00"),
        ("extension-type", b"\x93\x01\xa1r\x91\xd4\x01\x00"),
    ]


def _report_errors() -> list[tuple[str, Any]]:
    return [
        ("report-version-2", _report_wire(version=2)),
        ("report-id-15-bytes", _report_wire(report_id=_ID[:15])),
        ("report-id-as-string", _report_wire(report_id="0123456789abcdef")),
        ("campaign-id-bad", _report_wire(campaign_id="-starts-with-dash")),
        ("round-2^32", _report_wire(round=2**32)),
        ("group-4096", _report_wire(group=4096)),
        ("no-payloads", _report_wire(payloads=[])),
        ("nine-payloads", _report_wire(payloads=[0] * 9)),
        ("index-negative", _report_wire(payloads=[-1])),
        ("index-boolean", _report_wire(payloads=[True])),
        ("unknown-tag-7", _report_wire(payloads=[[7, 1]])),
        ("tag-1-as-list", _report_wire(payloads=[[1, 5]])),
        ("hashed-seed-2^64-over", _report_wire(payloads=[[3, -1, 0]])),
        ("hashed-value-2^32", _report_wire(payloads=[[3, 0, 2**32]])),
        ("hashed-two-items", _report_wire(payloads=[[3, 0]])),
        ("integers-not-list", _report_wire(payloads=[[4, 5]])),
        ("integers-2^63", _report_wire(payloads=[[4, [2**63]]])),
        ("floats-5-bytes", _report_wire(payloads=[[5, bytes(5)]])),
        ("signed-vector-seed-2^32", _report_wire(payloads=[[6, 2**32, b"\x01"]])),
        ("signed-vector-inner-index", _report_wire(payloads=[[6, 1, 5]])),
        ("payload-map", _report_wire(payloads=[{"a": 1}])),
        ("report-is-map", {"a": 1}),
    ]


def generate() -> list[dict[str, Any]]:
    vectors: list[dict[str, Any]] = []
    for name, payload in _PAYLOADS:
        vectors.append({"name": f"payload-{name}", "input": {"payload": payload_json(payload)},
                        "output": {"msgpack": _pack(payload_to_wire(payload)).hex()}})
    for name, request_id, reports in _batches():
        vectors.append({"name": f"batch-{name}",
                        "input": {"request_id": request_id, "reports": [_report_json(r) for r in reports]},
                        "output": {"packed": pack_batch(request_id, reports).hex()}})
    for name, packed in _decode_only():
        vectors.append({"name": f"decode-only-{name}", "input": {"packed": packed.hex(), "decode_only": True},
                        "output": _decoded(packed)})
    for name, packed in _batch_errors():
        vectors.append({"name": f"refuse-{name}", "input": {"packed": packed.hex()},
                        "output": {"error": _refused(packed)}})
    for name, wire in _report_errors():
        packed = _pack([1, "r", [wire, _report_wire(report_id=_ID2)]])
        vectors.append({"name": f"reject-{name}", "input": {"packed": packed.hex()}, "output": _decoded(packed)})
    return vectors


def verify(vector: dict[str, Any]) -> None:
    name, inp, out = vector["name"], vector["input"], vector["output"]
    if "payload" in inp:
        payload = payload_from_json(inp["payload"])
        check(name, _pack(payload_to_wire(payload)).hex(), out["msgpack"])
        check(name, payload_json(payload_from_wire(msgpack.unpackb(bytes.fromhex(out["msgpack"])))), inp["payload"])
        return
    if "reports" in inp:  # both ways
        reports = [_report_from_json(r) for r in inp["reports"]]
        check(name, pack_batch(inp["request_id"], reports).hex(), out["packed"])
        check(name, _decoded(bytes.fromhex(out["packed"])), inp)
        return
    packed = bytes.fromhex(inp["packed"])
    if "error" in out:
        check(name, _refused(packed), out["error"])
        return
    check(name, _decoded(packed), out)
