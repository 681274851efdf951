"""Reports (device -> collector) and their compact msgpack form.

Wire form of one report: ``[1, report_id, campaign_id, round, group, [payload, ...]]`` with each
payload as in :mod:`ldp_client.payload`; a batch is ``[1, request_id, [report, ...]]``. The
leading 1 is the format version.

A collector decodes batches with :func:`unpack_batch_columns`: the same reports as
:func:`unpack_batch`, held column by column in a :class:`ReportColumns` instead of one
:class:`Report` object each (a batch of index or bits payloads then costs one ``msgpack`` call and a
few C-level passes per column, not one validated object per report).
"""

from __future__ import annotations

import itertools
import operator
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import msgpack

from ._validation import check_int, check_msgpack_complete
from .errors import InvalidParameterError, ProtocolError
from .payload import Payload, payload_from_wire, payload_to_wire
from .rng import Rng
from .spec import MAX_COMPONENTS, MAX_GROUPS, check_campaign_id

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_REPORTS",
    "REPORT_ID_BYTES",
    "Report",
    "ReportColumns",
    "new_report_id",
    "pack_batch",
    "unpack_batch",
    "unpack_batch_columns",
]

REPORT_ID_BYTES = 16
MAX_BATCH_REPORTS = 100_000
MAX_BATCH_BYTES = 64 * 1024 * 1024
MAX_REQUEST_ID = 128
_FORMAT = 1
_MAX_ROUND = 2**32 - 1
_MAX_INDEX = 2**64 - 1  # payload_from_wire's range of an index
_TIME_PREFIX_BYTES = 4


def new_report_id(rng: Rng, now: float | None = None) -> bytes:
    """A fresh report id: the creation second, then 12 random bytes.

    The first 4 bytes are ``int(now) mod 2**32`` (Unix seconds, ``time.time()`` by default),
    big-endian, and the other 12 come from ``rng`` (the OS CSPRNG unless a seeded generator is
    injected; it is asked for 16 bytes, as before ids had a time prefix), as in a UUIDv7. The time prefix is what keeps the collector's duplicate index
    fast: ids made in the same second sort together, so a batch of new ids lands in a few hot
    index pages instead of one random page each (at 3 million stored reports, a single SQLite
    collector acknowledged 50 000 reports/s with a p99 of 56 ms with such ids and fell to
    31 000 reports/s, with seconds of latency, with 16 purely random bytes). The prefix tells the
    collector when the report was made, to the second -- metadata it mostly sees on arrival anyway
    and that says nothing of the private value -- and 96 random bits keep ids unique.
    """
    seconds = int(time.time() if now is None else now) % 2**32
    # 16 bytes are drawn and the first 4 replaced, so a seeded generator's stream (and every seeded
    # simulation after this call) is what it was with purely random ids.
    return seconds.to_bytes(_TIME_PREFIX_BYTES, "big") + rng.token_bytes(REPORT_ID_BYTES)[_TIME_PREFIX_BYTES:]


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
        check_msgpack_complete(bytes(data))
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


def _batch_items(obj: Any) -> tuple[str, Sequence[Any]]:
    """The request id and the report items of an unpacked ``[1, request_id, [report, ...]]``."""
    if not isinstance(obj, (list, tuple)) or len(obj) != 3 or obj[0] != _FORMAT:
        raise ProtocolError(f"packed batch: expected [{_FORMAT}, request_id, reports]")
    _, request_id, items = obj
    if not isinstance(request_id, str) or not 1 <= len(request_id) <= MAX_REQUEST_ID:
        raise ProtocolError(f"packed batch: request_id must be a string of 1 to {MAX_REQUEST_ID} characters")
    if not isinstance(items, (list, tuple)):
        raise ProtocolError("packed batch: reports must be a list")
    return request_id, items


def unpack_batch(data: bytes) -> tuple[str, list[Report | ProtocolError]]:
    """Unpack a batch; a malformed *report* comes back as its :class:`ProtocolError` (partial success),
    a malformed *batch* raises one."""
    request_id, items = _batch_items(_unpackb(data, "packed batch"))
    out: list[Report | ProtocolError] = []
    for i, item in enumerate(items):
        try:
            out.append(Report.from_wire(item, f"reports[{i}]"))
        except ProtocolError as exc:
            out.append(exc)
    return request_id, out


# ---------------------------------------------------------------------------- column form


def _is_campaign_id(value: str) -> bool:
    try:
        check_campaign_id(value)
    except (TypeError, InvalidParameterError):
        return False
    return True


def _all_exactly(values: Sequence[Any], kind: type) -> bool:
    """Every value is exactly of type ``kind`` (no subclasses: ``bool`` is not an ``int`` here)."""
    return not values or set(map(type, values)) == {kind}


def _ints_within(values: Sequence[int], high: int) -> bool:
    return not values or (min(values) >= 0 and max(values) <= high)


def _columns_hold_reports(report_ids: Sequence[Any], campaign_ids: Sequence[Any], rounds: Sequence[Any],
                          groups: Sequence[Any], payloads: Sequence[Any]) -> bool:
    """Whether every row is a valid :class:`Report` of exact built-in types: one C-level pass per check."""
    if not (_all_exactly(report_ids, bytes) and set(map(len, report_ids)) <= {REPORT_ID_BYTES}
            and _all_exactly(campaign_ids, str) and all(map(_is_campaign_id, set(campaign_ids)))
            and _all_exactly(rounds, int) and _ints_within(rounds, _MAX_ROUND)
            and _all_exactly(groups, int) and _ints_within(groups, MAX_GROUPS - 1)
            and set(map(type, payloads)) <= {list, tuple}):
        return False
    counts = set(map(len, payloads))
    return not counts or (min(counts) >= 1 and max(counts) <= MAX_COMPONENTS)


def _row_holds_report(report_id: Any, campaign_id: Any, round_: Any, group: Any, payloads: Any) -> bool:
    """:func:`_columns_hold_reports` for one row."""
    return (type(report_id) is bytes and len(report_id) == REPORT_ID_BYTES
            and type(campaign_id) is str and _is_campaign_id(campaign_id)
            and type(round_) is int and 0 <= round_ <= _MAX_ROUND
            and type(group) is int and 0 <= group < MAX_GROUPS
            and type(payloads) in (list, tuple) and 1 <= len(payloads) <= MAX_COMPONENTS)


@dataclass(frozen=True, kw_only=True, eq=False)
class ReportColumns(Sequence["Report | ProtocolError"]):
    """A batch of decoded reports held column by column (from :func:`unpack_batch_columns` or
    ``ldp_client.serde.report_columns_from_proto``).

    Position ``i`` stands for ``Report(report_id=report_ids[i], campaign_id=campaign_ids[i],
    round=rounds[i], group=groups[i], payloads=tuple(payloads[i]))``, or for ``errors[i]`` when that
    report could not be decoded (its columns then hold the placeholders ``b""``, ``""``, 0, 0,
    ``()``). Indexing builds that object, so this is a drop-in ``Sequence[Report | ProtocolError]``;
    a collector reads the columns instead and never builds the objects.

    Parameters
    ----------
    report_ids, campaign_ids, rounds, groups, payloads : sequences of equal length
        Exactly ``bytes``, ``str``, ``int``, ``int`` and a list or tuple of payloads per report.
    errors : mapping of int to ProtocolError
        Positions of the reports that could not be decoded.

    Raises
    ------
    InvalidParameterError
        When a column has another length, or a report outside ``errors`` is not a valid
        :class:`Report` (checked on construction with one pass per column).
    """

    report_ids: Sequence[bytes]
    campaign_ids: Sequence[str]
    rounds: Sequence[int]
    groups: Sequence[int]
    payloads: Sequence[Sequence[Payload]]
    errors: Mapping[int, ProtocolError] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.report_ids)
        columns = (self.campaign_ids, self.rounds, self.groups, self.payloads)
        if any(len(column) != n for column in columns):
            raise InvalidParameterError(
                f"report columns must all have the same length, got {[n, *(len(c) for c in columns)]}")
        if any(not (isinstance(i, int) and 0 <= i < n) or not isinstance(e, ProtocolError)
               for i, e in self.errors.items()):
            raise InvalidParameterError(f"errors must map positions in [0, {n}) to ProtocolError")
        rows = [i for i in range(n) if i not in self.errors] if self.errors else None
        if not _columns_hold_reports(*(column if rows is None else [column[i] for i in rows]
                                       for column in (self.report_ids, *columns))):
            self._raise_first_invalid(range(n) if rows is None else rows)

    def _raise_first_invalid(self, rows: Iterable[int]) -> None:
        for i in rows:
            row = (self.report_ids[i], self.campaign_ids[i], self.rounds[i], self.groups[i], self.payloads[i])
            if _row_holds_report(*row):
                continue
            try:
                self._report(i)
            except (TypeError, InvalidParameterError) as exc:
                raise InvalidParameterError(f"reports[{i}]: {exc}") from exc
            raise InvalidParameterError(
                f"reports[{i}]: report columns must hold exact bytes, str and int values and payload "
                f"lists or tuples, got {tuple(type(v).__name__ for v in row)}")

    def _report(self, i: int) -> Report:
        return Report(report_id=self.report_ids[i], campaign_id=self.campaign_ids[i], round=self.rounds[i],
                      group=self.groups[i], payloads=tuple(self.payloads[i]))

    def __len__(self) -> int:
        return len(self.report_ids)

    @overload
    def __getitem__(self, index: int) -> Report | ProtocolError: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Report | ProtocolError]: ...

    def __getitem__(self, index: int | slice) -> Report | ProtocolError | Sequence[Report | ProtocolError]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = operator.index(index)
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"report index {index} out of range for {n} reports")
        error = self.errors.get(i)
        return error if error is not None else self._report(i)

    def distinct_campaign_ids(self) -> set[str]:
        """The campaign ids of the decoded reports (the malformed ones have none)."""
        if not self.errors:
            return set(self.campaign_ids)
        return {c for i, c in enumerate(self.campaign_ids) if i not in self.errors}


_EMPTY_COLUMNS = ReportColumns(report_ids=(), campaign_ids=(), rounds=(), groups=(), payloads=())


def _decoded_payload_lists(payloads: Sequence[Any]) -> bool:
    """Whether every wire payload list holds only indexes and bits, which decode to themselves."""
    if set(map(type, payloads)) != {list}:
        return False
    flat = [p[0] for p in payloads] if set(map(len, payloads)) == {1} else list(itertools.chain.from_iterable(payloads))
    kinds = set(map(type, flat))
    if not kinds <= {int, bytes}:
        return False
    if int not in kinds:
        return True
    return _ints_within(flat if kinds == {int} else [v for v in flat if type(v) is int], _MAX_INDEX)


def _plain_item(item: Any) -> bool:
    """Whether one wire report is a valid report whose payloads are indexes and bits (no decoding needed)."""
    if type(item) is not list or len(item) != 6 or item[0] != _FORMAT:
        return False
    payloads = item[5]
    return _row_holds_report(*item[1:]) and type(payloads) is list and all(
        (type(p) is int and 0 <= p <= _MAX_INDEX) or type(p) is bytes for p in payloads)


def _columns_of_items(items: Sequence[Any]) -> ReportColumns:
    """The column form of wire report items; every position as :meth:`Report.from_wire` decodes it."""
    if not items:
        return _EMPTY_COLUMNS
    # The common batch: every item a well-formed report of index or bits payloads. Transposed in C,
    # checked with one pass per column; anything else is decoded item by item below.
    if set(map(type, items)) == {list} and set(map(len, items)) == {6}:
        versions, report_ids, campaign_ids, rounds, groups, payloads = zip(*items)
        if versions.count(_FORMAT) == len(items) and _decoded_payload_lists(payloads):
            try:  # ReportColumns checks the rest, one pass per column
                return ReportColumns(report_ids=report_ids, campaign_ids=campaign_ids, rounds=rounds, groups=groups,
                                     payloads=payloads)
            except InvalidParameterError:
                pass
    ids: list[bytes] = []
    cids: list[str] = []
    round_column: list[int] = []
    group_column: list[int] = []
    payload_column: list[Sequence[Payload]] = []
    errors: dict[int, ProtocolError] = {}
    for i, item in enumerate(items):
        if _plain_item(item):
            _, report_id, campaign_id, round_, group, item_payloads = item
        else:
            try:
                report = Report.from_wire(item, f"reports[{i}]")
            except ProtocolError as exc:
                errors[i] = exc
                report_id, campaign_id, round_, group, item_payloads = b"", "", 0, 0, ()
            else:
                report_id, campaign_id, round_, group, item_payloads = (
                    report.report_id, report.campaign_id, report.round, report.group, report.payloads)
        ids.append(report_id)
        cids.append(campaign_id)
        round_column.append(round_)
        group_column.append(group)
        payload_column.append(item_payloads)
    return ReportColumns(report_ids=ids, campaign_ids=cids, rounds=round_column, groups=group_column,
                         payloads=payload_column, errors=errors)


def unpack_batch_columns(data: bytes) -> tuple[str, ReportColumns]:
    """:func:`unpack_batch` in column form: the same request id and, position for position, the same
    report (or :class:`ProtocolError`), without building the :class:`Report` objects.

    Cost: one ``msgpack.unpackb`` and a few C-level passes per column when every report is well
    formed and carries index or bits payloads; otherwise a quick check per report, and
    :meth:`Report.from_wire` for the reports it does not cover. A malformed *batch* raises
    :class:`ProtocolError`.
    """
    request_id, items = _batch_items(_unpackb(data, "packed batch"))
    return request_id, _columns_of_items(items)
