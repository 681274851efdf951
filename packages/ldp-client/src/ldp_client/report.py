"""Reports (device -> collector) and their compact msgpack form.

Wire form of one report: ``[1, report_id, campaign_id, round, group, [payload, ...]]`` with each
payload as in :mod:`ldp_client.payload`; a batch is ``[1, request_id, [report, ...]]``. The
leading 1 is the format version.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from ._validation import check_int
from .errors import InvalidParameterError, ProtocolError
from .payload import Payload, payload_from_wire, payload_to_wire
from .spec import MAX_COMPONENTS, MAX_GROUPS, check_campaign_id

__all__ = ["MAX_BATCH_BYTES", "MAX_BATCH_REPORTS", "REPORT_ID_BYTES", "Report", "pack_batch", "unpack_batch"]

REPORT_ID_BYTES = 16
MAX_BATCH_REPORTS = 100_000
MAX_BATCH_BYTES = 64 * 1024 * 1024
MAX_REQUEST_ID = 128
_FORMAT = 1


@dataclass(frozen=True, kw_only=True)
class Report:
    """One device report (``ldp.v1.Report``): identifiers plus mechanism outputs only."""

    report_id: bytes
    campaign_id: str
    round: int
    group: int
    payloads: tuple[Payload, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.report_id, bytes) or len(self.report_id) != REPORT_ID_BYTES:
            raise InvalidParameterError(f"report_id must be {REPORT_ID_BYTES} bytes, got {self.report_id!r:.40}")
        check_campaign_id(self.campaign_id)
        check_int("round", self.round, 0, 2**32 - 1)
        check_int("group", self.group, 0, MAX_GROUPS - 1)
        if not isinstance(self.payloads, tuple) or not 1 <= len(self.payloads) <= MAX_COMPONENTS:
            raise InvalidParameterError(f"payloads must be a tuple of 1 to {MAX_COMPONENTS} payloads")

    def to_wire(self) -> list[Any]:
        return [_FORMAT, self.report_id, self.campaign_id, self.round, self.group,
                [payload_to_wire(p) for p in self.payloads]]

    @classmethod
    def from_wire(cls, obj: Any, where: str = "report") -> Report:
        if not isinstance(obj, (list, tuple)) or len(obj) != 6 or obj[0] != _FORMAT:
            raise ProtocolError(f"{where}: expected [{_FORMAT}, report_id, campaign_id, round, group, payloads]")
        _, report_id, campaign_id, round_, group, payloads = obj
        if not isinstance(payloads, (list, tuple)):
            raise ProtocolError(f"{where}: payloads must be a list")
        try:
            return cls(report_id=report_id if isinstance(report_id, bytes) else b"", campaign_id=campaign_id,
                       round=round_, group=group,
                       payloads=tuple(payload_from_wire(p, f"{where}.payloads[{i}]") for i, p in enumerate(payloads)))
        except (TypeError, InvalidParameterError) as exc:
            raise ProtocolError(f"{where}: {exc}") from exc

    def pack(self) -> bytes:
        """Compact msgpack bytes."""
        packed: bytes = msgpack.packb(self.to_wire(), use_bin_type=True)
        return packed

    @classmethod
    def unpack(cls, data: bytes) -> Report:
        """Inverse of :meth:`pack`; malformed bytes raise :class:`ProtocolError`."""
        return cls.from_wire(_unpackb(data, "packed report"))


def _unpackb(data: Any, what: str) -> Any:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be bytes, got {type(data).__name__}")
    if len(data) > MAX_BATCH_BYTES:
        raise ProtocolError(f"{what} is {len(data)} bytes, more than {MAX_BATCH_BYTES}")
    try:
        return msgpack.unpackb(bytes(data), raw=False, strict_map_key=True,
                               max_array_len=MAX_BATCH_REPORTS, max_map_len=1024)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"{what} is not valid msgpack: {exc}") from exc


def pack_batch(request_id: str, reports: Sequence[Report]) -> bytes:
    """Pack a batch for ``SubmitPacked``: ``[1, request_id, [report, ...]]``."""
    if not isinstance(request_id, str) or not 1 <= len(request_id) <= MAX_REQUEST_ID:
        raise InvalidParameterError(f"request_id must be a string of 1 to {MAX_REQUEST_ID} characters")
    if len(reports) > MAX_BATCH_REPORTS:
        raise InvalidParameterError(f"a batch holds at most {MAX_BATCH_REPORTS} reports, got {len(reports)}")
    packed: bytes = msgpack.packb([_FORMAT, request_id, [r.to_wire() for r in reports]], use_bin_type=True)
    return packed


def unpack_batch(data: bytes) -> tuple[str, list[Report | ProtocolError]]:
    """Unpack a batch; a malformed *report* comes back as its :class:`ProtocolError` (partial success),
    a malformed *batch* raises one."""
    obj = _unpackb(data, "packed batch")
    if not isinstance(obj, (list, tuple)) or len(obj) != 3 or obj[0] != _FORMAT:
        raise ProtocolError(f"packed batch: expected [{_FORMAT}, request_id, reports]")
    _, request_id, items = obj
    if not isinstance(request_id, str) or not 1 <= len(request_id) <= MAX_REQUEST_ID:
        raise ProtocolError(f"packed batch: request_id must be a string of 1 to {MAX_REQUEST_ID} characters")
    if not isinstance(items, (list, tuple)):
        raise ProtocolError("packed batch: reports must be a list")
    out: list[Report | ProtocolError] = []
    for i, item in enumerate(items):
        try:
            out.append(Report.from_wire(item, f"reports[{i}]"))
        except ProtocolError as exc:
            out.append(exc)
    return request_id, out
