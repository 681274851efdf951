"""The hand-written parts of the wire: request parsing, counting a request's reports from the
wire before it is parsed, and encoding a batch's outcomes without one message object per report.

Everything here works on serialized protobuf bytes; the formats are those of ``proto/ldp/v1``.
"""

from __future__ import annotations

from collections import Counter as _Counter
from collections.abc import Sequence
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from ldp.v1 import service_pb2
from ldp_client.errors import RejectionCode

from ..errors import ErrorReason, InvalidArgumentError
from ..ingest import Rejection
from ..storage.base import Outcome

__all__ = ["DEVICE_SERVICE", "OPERATOR_SERVICE", "count_messages", "parse_request", "submit_response"]

#: Fully qualified names of the collector's two services.
DEVICE_SERVICE: str = service_pb2.DESCRIPTOR.services_by_name["DeviceService"].full_name
OPERATOR_SERVICE: str = service_pb2.DESCRIPTOR.services_by_name["OperatorService"].full_name

Req = TypeVar("Req", bound=Message)


def parse_request(request_type: type[Req], data: bytes) -> Req:
    """``data`` parsed as ``request_type``; a parse failure is INVALID_ARGUMENT (``MALFORMED_REQUEST``)."""
    try:
        return request_type.FromString(data)
    except DecodeError as exc:
        raise InvalidArgumentError(f"malformed {request_type.DESCRIPTOR.full_name}: {exc}",
                                   reason=ErrorReason.MALFORMED_REQUEST) from exc


#: Protobuf wire types a message may hold: varint, 64-bit, length-delimited, 32-bit (not the groups).
_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_I32 = 0, 1, 2, 5


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The protobuf varint at ``data[pos:]`` and the position after it (IndexError when truncated)."""
    value = data[pos]
    pos += 1
    if value < 0x80:
        return value, pos
    value &= 0x7F
    shift = 7
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def count_messages(data: bytes, field_number: int, limit: int) -> int:
    """How many entries of the repeated message field ``field_number`` the serialized message
    ``data`` holds at its top level, read from the tags and lengths without parsing any entry;
    counting stops at ``limit + 1``.

    A ``SubmitReportsRequest`` of millions of empty reports fits into a few megabytes and parses
    into gigabytes, so its report count is checked before it is parsed. Malformed wire data, and
    the obsolete group wire types (which protobuf would skip as unknown fields), are refused here.
    """
    wanted = (field_number << 3) | _WIRE_LEN
    count = pos = 0
    end = len(data)
    try:
        while pos < end:
            tag, pos = _read_varint(data, pos)
            wire = tag & 7
            if wire == _WIRE_LEN:
                length, pos = _read_varint(data, pos)
                pos += length
                if tag == wanted:
                    count += 1
                    if count > limit:
                        return count
            elif wire == _WIRE_VARINT:
                _, pos = _read_varint(data, pos)
            elif wire == _WIRE_I64:
                pos += 8
            elif wire == _WIRE_I32:
                pos += 4
            else:
                raise ValueError(f"wire type {wire}")
    except (IndexError, ValueError) as exc:
        raise InvalidArgumentError(f"malformed request: {exc or 'truncated'}",
                                   reason=ErrorReason.MALFORMED_REQUEST) from None
    if pos != end:
        raise InvalidArgumentError("malformed request: truncated", reason=ErrorReason.MALFORMED_REQUEST)
    return count


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _outcome_field(report_id: bytes, outcome: Outcome, reason: str) -> bytes:
    """One ``ReportOutcome`` as field 1 of ``SubmitReportsResponse``, encoded as upb encodes it: the
    reason (field 3) and, for a :class:`~ldp_collector.ingest.Rejection`, its code (field 4)."""
    body = b"\x0a" + _varint(len(report_id)) + report_id if report_id else b""
    body += b"\x10" + _varint(int(outcome))
    if reason:
        text = reason.encode()
        body += b"\x1a" + _varint(len(text)) + text
    code = reason.code if isinstance(reason, Rejection) else RejectionCode.UNSPECIFIED
    if code:
        body += b"\x20" + _varint(int(code))
    return b"\x0a" + _varint(len(body)) + body


def submit_response(report_ids: Sequence[bytes],
                     results: Sequence[tuple[Outcome, str]]) -> service_pb2.SubmitReportsResponse:
    """The ``SubmitReportsResponse`` of a batch: one outcome per report, in request order, and the tallies.

    The outcomes are written in the protobuf wire format here and parsed once: adding 1000
    ``ReportOutcome`` messages one by one costs about 1 us per report, as much as decoding the batch.
    When every report has a 16-byte id and the same outcome without a reason (a normal batch), the
    whole field is one ``bytes.join``.
    """
    tally = _Counter([outcome for outcome, _ in results])
    common = set(results) if len(tally) == 1 else ()
    if len(common) == 1 and next(iter(common))[1] == "" and set(map(len, report_ids)) == {16}:
        # Each outcome is b"\x0a\x14\x0a\x10" + report_id + b"\x10" + status: a join with the end of one
        # outcome and the start of the next as the separator.
        status = bytes([int(next(iter(tally)))])
        outcomes = b"\x0a\x14\x0a\x10" + (b"\x10" + status + b"\x0a\x14\x0a\x10").join(report_ids) + b"\x10" + status
    else:
        outcomes = b"".join([_outcome_field(report_id, outcome, reason)
                             for report_id, (outcome, reason) in zip(report_ids, results)])
    response = service_pb2.SubmitReportsResponse.FromString(outcomes)
    response.accepted = tally[Outcome.ACCEPTED]
    response.duplicates = tally[Outcome.DUPLICATE]
    response.rejected = tally[Outcome.REJECTED]
    return response

