"""Reports (device -> collector) and their compact msgpack form.

Wire form of one report: ``[1, report_id, campaign_id, round, group, [payload, ...]]`` with each
payload as in :mod:`ldp_client.payload`; a batch is ``[1, request_id, [report, ...]]``. The
leading 1 is the format version.

A collector decodes batches with :func:`unpack_batch_columns`: the same reports as
:func:`unpack_batch`, held column by column in a :class:`ReportColumns` instead of one
:class:`Report` object each (a batch of index or bits payloads then costs one ``msgpack`` call and a
few C-level passes per column, not one validated object per report).

Limits of a batch
-----------------
A batch holds at most :data:`MAX_BATCH_REPORTS` reports, and its request message (an
``ldp.v1.SubmitReportsRequest``, or the ``SubmitPackedRequest`` carrying the packed batch) is at
most :data:`MAX_BATCH_BYTES` bytes: :data:`MAX_BATCH_REPORTS` copies of the largest report whose
payload is one scalar (an index or a hashed value, what every frequency-oracle round sends), in the
larger of its two encodings, plus the longest request id::

    MAX_BATCH_BYTES = request_id field + MAX_BATCH_REPORTS * largest one-scalar report
                    = (1 + 2 + 4 * 128) + 10 000 * 182 = 1 820 515 bytes (1.74 MiB)

with the report as an element of ``SubmitReportsRequest.reports`` (:func:`_largest_scalar_report_bytes`
adds up its fields; its msgpack form is 175 bytes). The largest single report of all -- 8 payloads of
2**20 bits each -- is about 1.05 MB, so every legal report fits into a batch on its own; a batch of
reports with larger payloads holds fewer of them (:func:`batch_slices`, which the SDK's gRPC client
uses to cut its batches). A collector's default receive limit is :data:`MAX_BATCH_BYTES`.

Decoding is bounded before it allocates: the report count a packed batch declares in its header is
read first and refused beyond the caller's limit; then report by report, ``msgpack`` skips over the
report (which builds nothing, and fails on a report cut short) and decodes it, with limits on
string, binary, array and map lengths taken from the legal report, no extension types, and a budget
of :data:`MAX_CONTAINERS_PER_REPORT` arrays or maps -- which also bounds its nesting, since each
level costs one. A report's payload list longer than :data:`~ldp_client.spec.MAX_COMPONENTS` is
refused before any payload in it is decoded.
"""

from __future__ import annotations

import itertools
import operator
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import msgpack

from ._validation import check_int, check_msgpack_complete, describe
from .encoders.base import MAX_DIMENSION
from .errors import InvalidParameterError, ProtocolError
from .payload import MAX_BITS, Payload, payload_from_wire, payload_to_wire
from .rng import Rng
from .spec import MAX_COMPONENTS, MAX_GROUPS, check_campaign_id

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_REPORTS",
    "MAX_CONTAINERS_PER_REPORT",
    "REPORT_ID_BYTES",
    "Report",
    "ReportColumns",
    "batch_slices",
    "declared_batch_size",
    "new_report_id",
    "pack_batch",
    "unpack_batch",
    "unpack_batch_columns",
]

REPORT_ID_BYTES = 16
#: Most reports in one batch (``SubmitReports`` / ``SubmitPacked``); a collector's
#: ``max_batch_reports`` is at most this.
MAX_BATCH_REPORTS = 10_000
MAX_REQUEST_ID = 128
_FORMAT = 1
_MAX_ROUND = 2**32 - 1
_MAX_INDEX = 2**64 - 1  # payload_from_wire's range of an index
_MAX_HASHED_VALUE = 2**32 - 1
_MAX_CAMPAIGN_ID = 128  # check_campaign_id: ASCII, one byte a character
_TIME_PREFIX_BYTES = 4
#: Longest request id in UTF-8 bytes (4 bytes a character at most): the longest string in a batch.
_MAX_STRING_BYTES = 4 * MAX_REQUEST_ID
#: Longest binary string of a legal report: the longest payload bit vector, or float32 coordinates.
_MAX_BINARY_BYTES = max(MAX_BITS // 8, 4 * MAX_DIMENSION)
#: Longest array of a legal batch: its reports, or the coordinates of an integer payload.
_MAX_ARRAY = max(MAX_BATCH_REPORTS, MAX_DIMENSION)
#: Longest map: no legal batch holds one, but a small one decodes, so that only the report holding
#: it is rejected (partial success).
_MAX_MAP = MAX_COMPONENTS
#: Arrays (or maps) one report may hold: itself, its payload list, and two a payload (an integer
#: payload ``[4, [values]]``, a signed vector ``[6, seed, [5, floats]]``).
MAX_CONTAINERS_PER_REPORT = 2 + 2 * MAX_COMPONENTS


def _varint_bytes(value: int) -> int:
    """Bytes of ``value`` as a protobuf varint."""
    return max(1, -(-value.bit_length() // 7))


def _field_bytes(length: int) -> int:
    """Bytes of a length-delimited protobuf field (number < 16) holding ``length`` bytes."""
    return 1 + _varint_bytes(length) + length


def _largest_scalar_report_bytes() -> int:
    """Bytes of the largest report whose payload is one scalar, as an element of the repeated
    ``ldp.v1.SubmitReportsRequest.reports`` field (its larger encoding; msgpack takes 175 bytes).

    ``ldp.v1.Report``: the 16-byte report id, the longest campaign id, the largest round (a uint32)
    and group, and one ``Payload`` holding a ``HashedValue`` with the largest seed (a uint64) and
    bucket (a uint32) -- larger than the largest index (one uint64). Every field number is below 16,
    so every tag is one byte.
    """
    hashed = (1 + _varint_bytes(_MAX_INDEX)) + (1 + _varint_bytes(_MAX_HASHED_VALUE))
    payload = _field_bytes(hashed)
    report = (_field_bytes(REPORT_ID_BYTES) + _field_bytes(_MAX_CAMPAIGN_ID) + 1 + _varint_bytes(_MAX_ROUND)
              + 1 + _varint_bytes(MAX_GROUPS - 1) + _field_bytes(payload))
    return _field_bytes(report)


#: Largest request message of a legal batch (module docstring): the longest request id field plus
#: :data:`MAX_BATCH_REPORTS` of the largest one-scalar reports, 1 820 515 bytes.
MAX_BATCH_BYTES = _field_bytes(_MAX_STRING_BYTES) + MAX_BATCH_REPORTS * _largest_scalar_report_bytes()


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
            raise InvalidParameterError(f"report_id must be {REPORT_ID_BYTES} bytes, got {describe(self.report_id)}")
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
        if not 1 <= len(payloads) <= MAX_COMPONENTS:  # before decoding any: a long list costs nothing
            raise ProtocolError(f"{where}: payloads must be a list of 1 to {MAX_COMPONENTS} payloads, "
                                f"got {len(payloads)}")
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
        return cls.from_wire(_unpackb(_as_bytes(data, "packed report"), "packed report"))


class _ContainerBudget:
    """The ``list_hook``/``object_hook`` of a bounded decode: counts the arrays and maps built and
    stops the decode beyond ``left`` more (``msgpack`` builds each one before handing it over, so
    the count bounds what a hostile document makes it allocate, nesting included)."""

    __slots__ = ("left",)

    def __init__(self, limit: int) -> None:
        self.left = limit

    def __call__(self, container: Any) -> Any:
        self.left -= 1
        if self.left < 0:
            raise ProtocolError(f"a report holds at most {MAX_CONTAINERS_PER_REPORT} arrays or maps")
        return container


#: ``msgpack`` limits of every decode of reports: the longest string, binary string, array and map of
#: a legal batch, and no extension types.
_LIMITS: dict[str, Any] = {
    "raw": False, "strict_map_key": True, "max_str_len": _MAX_STRING_BYTES, "max_bin_len": _MAX_BINARY_BYTES,
    "max_array_len": _MAX_ARRAY, "max_map_len": _MAX_MAP, "max_ext_len": 0}


def _as_bytes(data: Any, what: str) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be bytes, got {type(data).__name__}")
    if len(data) > MAX_BATCH_BYTES:
        raise ProtocolError(f"{what} is {len(data)} bytes, more than {MAX_BATCH_BYTES}")
    return bytes(data)


def _msgpack_problem(exc: Exception) -> str:
    """What is wrong with bytes ``msgpack`` refused, in words any implementation can produce.

    ``msgpack``'s own messages name Python calls and types (``unpack(b) received extra data``), which
    a rejection reason must not (docs/errors.md, section 5).
    """
    if isinstance(exc, msgpack.ExtraData):
        return "bytes follow the end of the document"
    if isinstance(exc, msgpack.OutOfData) or "incomplete input" in str(exc):
        return "the document is cut short"
    if isinstance(exc, UnicodeDecodeError):
        return "a string is not valid UTF-8"
    if "exceeds max_ext_len" in str(exc):
        return "it holds an extension type"
    if "exceeds max_" in str(exc):
        return "a string, binary string, array or map is longer than any legal batch holds"
    return "the bytes are not a msgpack document"


def _unpackb(data: bytes, what: str) -> Any:
    """Decode a msgpack document holding one report's worth of arrays, within the module's limits."""
    budget = _ContainerBudget(2 + MAX_CONTAINERS_PER_REPORT)
    try:
        check_msgpack_complete(data)
        return msgpack.unpackb(data, list_hook=budget, object_hook=budget, **_LIMITS)
    except ProtocolError as exc:  # the budget ran out
        problem = f"{what}: {exc}"
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"{what} is not valid msgpack: {_msgpack_problem(exc)}") from exc
    # Raised outside the except block: chained to the budget's error, the new one would keep the
    # frames of the aborted decode, and the arrays they hold, alive as long as itself.
    raise ProtocolError(problem)


def declared_batch_size(data: bytes) -> int | None:
    """The report count a packed batch ``[1, request_id, [report, ...]]`` declares, read from its
    first few bytes without decoding any report; ``None`` when it does not start that way
    (:func:`unpack_batch` then says what is wrong).

    Nothing larger than a request id is built, whatever the bytes hold.
    """
    # Every container length 0: unpack() can only build a scalar or a string here. The header --
    # array, version, request id (a str32 at most) and the reports' array header -- is read from a
    # copy of the first bytes only.
    head = bytes(data[:1 + 1 + 5 + _MAX_STRING_BYTES + 5])
    unpacker = msgpack.Unpacker(max_buffer_size=max(1, len(head)), raw=False, max_str_len=_MAX_STRING_BYTES,
                                max_bin_len=0, max_array_len=0, max_map_len=0, max_ext_len=0)
    unpacker.feed(head)
    try:
        if unpacker.read_array_header() != 3 or unpacker.unpack() != _FORMAT or not isinstance(unpacker.unpack(), str):
            return None
        count: int = unpacker.read_array_header()
    except Exception:  # msgpack raises several unrelated types on garbage
        return None
    return count


def _unpack_batch_items(data: Any, max_reports: int) -> tuple[str, Sequence[Any]]:
    """The request id and the report items of a packed batch, decoded report by report.

    The declared report count is checked against ``max_reports`` before anything else. Each report
    is first skipped over (which builds nothing) and only then decoded, with its own budget of
    :data:`MAX_CONTAINERS_PER_REPORT` arrays: every array it declares is then backed by bytes, and
    a report nested a thousand deep is refused after a few dozen arrays. Report by report, no
    single ``msgpack`` call runs long, so the thread decoding gives up the GIL often.
    """
    packed = _as_bytes(data, "packed batch")
    declared = declared_batch_size(packed)
    if declared is None:  # not batch-shaped: decoded whole, with one report's budget, to say why
        return _batch_items(_unpackb(packed, "packed batch"))
    if declared > max_reports:
        raise ProtocolError(f"packed batch: a batch holds at most {max_reports} reports, got {declared}")
    budget = _ContainerBudget(0)
    checker = msgpack.Unpacker(max_buffer_size=len(packed))
    unpacker = msgpack.Unpacker(max_buffer_size=len(packed), list_hook=budget, object_hook=budget, **_LIMITS)
    try:
        checker.feed(packed)
        unpacker.feed(packed)
        for reader in (checker, unpacker):  # past the array header and the version
            reader.read_array_header()
            reader.skip()
        checker.skip()
        request_id = unpacker.unpack()  # a string: declared_batch_size read it
        for reader in (checker, unpacker):
            reader.read_array_header()
        items = []
        for _ in range(declared):
            checker.skip()  # raises OutOfData, without building anything, when the report is cut short
            budget.left = MAX_CONTAINERS_PER_REPORT
            items.append(unpacker.unpack())
        if unpacker.tell() != len(packed):
            raise msgpack.ExtraData(None, packed[unpacker.tell():])
    except ProtocolError as exc:  # a report's budget ran out
        problem = f"packed batch: {exc}"
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"packed batch is not valid msgpack: {_msgpack_problem(exc)}") from exc
    else:
        return _batch_items([_FORMAT, request_id, items])
    raise ProtocolError(problem)  # outside the except block: see _unpackb


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


def unpack_batch(data: bytes, *, max_reports: int = MAX_BATCH_REPORTS) -> tuple[str, list[Report | ProtocolError]]:
    """Unpack a batch; a malformed *report* comes back as its :class:`ProtocolError` (partial success),
    a malformed *batch* raises one, and so does a batch declaring more than ``max_reports`` reports
    (checked before any report is decoded)."""
    request_id, items = _unpack_batch_items(data, max_reports)
    out: list[Report | ProtocolError] = []
    for i, item in enumerate(items):
        try:
            out.append(Report.from_wire(item, f"reports[{i}]"))
        except ProtocolError as exc:
            out.append(exc.detached())
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
    """Whether every wire payload list holds 1 to ``MAX_COMPONENTS`` indexes and bits, which decode
    to themselves."""
    if set(map(type, payloads)) != {list}:
        return False
    counts = set(map(len, payloads))
    if min(counts) < 1 or max(counts) > MAX_COMPONENTS:  # checked before the payloads are looked at
        return False
    flat = [p[0] for p in payloads] if counts == {1} else list(itertools.chain.from_iterable(payloads))
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
                errors[i] = exc.detached()
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


def unpack_batch_columns(data: bytes, *, max_reports: int = MAX_BATCH_REPORTS) -> tuple[str, ReportColumns]:
    """:func:`unpack_batch` in column form: the same request id and, position for position, the same
    report (or :class:`ProtocolError`), without building the :class:`Report` objects.

    Cost: one ``msgpack.unpackb`` and a few C-level passes per column when every report is well
    formed and carries index or bits payloads; otherwise a quick check per report, and
    :meth:`Report.from_wire` for the reports it does not cover. A malformed *batch* raises
    :class:`ProtocolError`, as does one declaring more than ``max_reports`` reports.
    """
    request_id, items = _unpack_batch_items(data, max_reports)
    return request_id, _columns_of_items(items)


def batch_slices(sizes: Sequence[int], *, max_bytes: int, max_reports: int = MAX_BATCH_REPORTS) -> list[slice]:
    """Cut reports into consecutive batches of at most ``max_reports`` reports and ``max_bytes`` bytes.

    Parameters
    ----------
    sizes : sequence of int
        Bytes of each report in the encoding it is sent in.
    max_bytes : int
        Bytes the reports of one batch may take: :data:`MAX_BATCH_BYTES` less the rest of the
        request (its request id, and for a packed batch the batch's own header).
    max_reports : int
        Reports a batch may hold, at most :data:`MAX_BATCH_REPORTS`.

    Returns
    -------
    list of slice
        Covering ``range(len(sizes))`` in order; greedy, so every batch but the last is full by
        one of the two limits.

    Raises
    ------
    InvalidParameterError
        A single report is larger than ``max_bytes`` (no legal report is).
    """
    check_int("max_reports", max_reports, 1, MAX_BATCH_REPORTS)
    check_int("max_bytes", max_bytes, 1, MAX_BATCH_BYTES)
    out: list[slice] = []
    start = total = 0
    for i, size in enumerate(sizes):
        if size > max_bytes:
            raise InvalidParameterError(f"report {i} takes {size} bytes, more than a batch may hold ({max_bytes})")
        if i - start == max_reports or total + size > max_bytes:
            out.append(slice(start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        out.append(slice(start, len(sizes)))
    return out
