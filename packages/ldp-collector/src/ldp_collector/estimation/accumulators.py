"""Mergeable per-round accumulators, serialized to bytes for the store's accumulate callback.

The store keeps raw reports (the source of truth) and, per round, accumulator blobs keyed
``f"{group}:{component_index}"`` that :func:`make_accumulate_fn` updates in the ingestion
transaction and :func:`rebuild` recomputes from the raw reports (the two must agree byte for byte).
In the ingestion transaction the new reports usually arrive with their payloads already decoded
(:class:`DecodedReports`, from the collector's validation): the callback then adds those instead of
decoding the stored msgpack again.

What an accumulator holds
    * GRR and unary encoding: the report count n and the per-value (per-bit) counts, which is all
      their estimators need (:meth:`CountAccumulator.finalize` returns a ready aggregator);
    * local hashing with a public seed pool (``docs/protocol.md`` §14): n and the count of every
      (pool seed, bucket), which is all its support counts need;
    * local hashing without a pool and every other mechanism: n only. Such a local-hashing report
      supports every value hashing to its bucket, so candidate support counts need the raw reports:
      a step streams them through :class:`SupportCounts` for the candidates it asks about (bounded
      by the candidates, not by n); :func:`aggregate_reports` builds whole aggregators from them.

Blob format (little-endian int64 words)
    ``[FORMAT_VERSION, kind, n, ...]`` then, by kind: ``KIND_DENSE`` -- one count per domain value
    (pooled local hashing: per (pool seed, bucket), row-major over the pool's sorted distinct seeds);
    ``KIND_SPARSE`` -- k reported values followed by their k counts (GRR over more than
    ``MAX_DENSE_DOMAIN`` values); ``KIND_REPORT_COUNT`` -- nothing more.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, Protocol, cast, runtime_checkable

import msgpack
import numpy as np
from numpy.typing import NDArray

from ldp_client.errors import ProtocolError
from ldp_client.mechanisms import GRRParams, LocalHashingParams, MechanismParams, UnaryEncodingParams
from ldp_client.payload import payload_from_wire
from ldp_client.spec import RoundSpec

from ..storage.base import AccumulateFn, StoredReport
from .frequency import (
    MAX_DENSE_DOMAIN,
    FrequencyAggregator,
    GRRAggregator,
    LocalHashingAggregator,
    UnaryEncodingAggregator,
)
from .report_accumulator import DecodedPass, ReportAccumulator, combine_batches

__all__ = [
    "FORMAT_VERSION",
    "KIND_DENSE",
    "KIND_REPORT_COUNT",
    "KIND_SPARSE",
    "ComponentParams",
    "CountAccumulator",
    "DecodedLocalHashing",
    "DecodedReports",
    "RoundCounts",
    "SupportCounts",
    "accumulator_key",
    "aggregate_reports",
    "component_params_from_spec",
    "decode_report_payloads",
    "keeps_counts",
    "make_accumulate_fn",
    "rebuild",
]

FORMAT_VERSION = 1
KIND_DENSE = 1
KIND_SPARSE = 2
KIND_REPORT_COUNT = 3
_HEADER_WORDS = 3

#: Mechanism parameters of every component, per group: ``{group: (params of component 0, ...)}``.
ComponentParams = Mapping[int, Sequence[MechanismParams]]


def accumulator_key(group: int, component_index: int) -> str:
    """The blob key of one component of one group: ``"<group>:<component_index>"``."""
    return f"{group}:{component_index}"


def component_params_from_spec(spec: RoundSpec) -> dict[int, tuple[MechanismParams, ...]]:
    """``{group: (mechanism of each component, ...)}`` for every group that reports in ``spec``."""
    out: dict[int, tuple[MechanismParams, ...]] = {}
    for task in spec.tasks:
        mechanisms = tuple(c.mechanism for c in task.components)
        for group in task.groups:
            out[group] = mechanisms
    return out


def keeps_counts(params: MechanismParams) -> bool:
    """Whether a :class:`CountAccumulator` of ``params`` suffices for estimation (no raw reports needed)."""
    return isinstance(params, (GRRParams, UnaryEncodingParams)) or (
        isinstance(params, LocalHashingParams) and params.seed_pool_size > 0)


class CountAccumulator:
    """Mergeable per-round state of one component (verbs: zero / add / merge / finalize).

    Parameters
    ----------
    params : MechanismParams
        The component's mechanism. GRR, unary encoding and local hashing with a seed pool keep
        counts; anything else only n.
    """

    def __init__(self, params: MechanismParams) -> None:
        if not isinstance(params, MechanismParams):
            raise TypeError(f"params must be mechanism parameters, got {type(params).__name__}")
        self._params = params
        self._counts: GRRAggregator | UnaryEncodingAggregator | LocalHashingAggregator | None
        if isinstance(params, GRRParams):
            self._counts = GRRAggregator(params)
        elif isinstance(params, UnaryEncodingParams):
            self._counts = UnaryEncodingAggregator(params)
        elif isinstance(params, LocalHashingParams) and keeps_counts(params):
            self._counts = LocalHashingAggregator(params)
        else:
            self._counts = None
        self._n = 0

    @property
    def params(self) -> MechanismParams:
        return self._params

    @property
    def n(self) -> int:
        """Number of reports accumulated."""
        return self._counts.n if self._counts is not None else self._n

    @property
    def has_counts(self) -> bool:
        """Whether the accumulator suffices for estimation (GRR, unary encoding, pooled local hashing)."""
        return self._counts is not None

    def zero(self) -> CountAccumulator:
        """A new empty accumulator for the same parameters."""
        return CountAccumulator(self._params)

    def add(self, payloads: Sequence[Any]) -> None:
        """Add a batch of decoded payloads (validated in bulk for the counting mechanisms)."""
        if self._counts is not None:
            self._counts.add(payloads)
        else:
            self._n += len(payloads)

    def merge(self, other: CountAccumulator) -> None:
        """Add ``other``'s state (same parameters)."""
        if not isinstance(other, CountAccumulator) or other._params != self._params:
            raise ProtocolError("cannot merge accumulators of different mechanisms or parameters")
        if self._counts is not None and other._counts is not None:
            # Both aggregators have the same class since the parameters are equal.
            if isinstance(self._counts, GRRAggregator) and isinstance(other._counts, GRRAggregator):
                self._counts.merge(other._counts)
            elif isinstance(self._counts, UnaryEncodingAggregator) and isinstance(other._counts, UnaryEncodingAggregator):
                self._counts.merge(other._counts)
            elif isinstance(self._counts, LocalHashingAggregator) and isinstance(other._counts, LocalHashingAggregator):
                self._counts.merge(other._counts)
        else:
            self._n += other._n

    def finalize(self) -> FrequencyAggregator | None:
        """A frequency aggregator holding the accumulated counts, or ``None`` when the raw
        reports are needed (local hashing without a seed pool and the non-counting mechanisms)."""
        counts = self._counts
        if isinstance(counts, GRRAggregator):
            grr = counts.zero()
            grr.merge(counts)
            return grr
        if isinstance(counts, UnaryEncodingAggregator):
            return UnaryEncodingAggregator.from_counts(counts.params, counts.counts(), counts.n)
        if isinstance(counts, LocalHashingAggregator):
            return LocalHashingAggregator.from_counts(counts.params, counts.counts(), counts.n)
        return None

    def to_bytes(self) -> bytes:
        """The blob (see the module docstring)."""
        counts = self._counts
        if counts is None:
            words = np.array([FORMAT_VERSION, KIND_REPORT_COUNT, self._n], dtype="<i8")
        elif isinstance(counts, LocalHashingAggregator):
            words = np.concatenate([np.array([FORMAT_VERSION, KIND_DENSE, counts.n], dtype="<i8"),
                                    counts.counts().ravel().astype("<i8")])
        elif isinstance(counts, UnaryEncodingAggregator) or counts.params.domain_size <= MAX_DENSE_DOMAIN:
            dense = counts.counts() if isinstance(counts, UnaryEncodingAggregator) else _dense_grr(counts)
            words = np.concatenate([np.array([FORMAT_VERSION, KIND_DENSE, counts.n], dtype="<i8"),
                                    dense.astype("<i8")])
        else:
            values, value_counts = counts.counts()
            words = np.concatenate([np.array([FORMAT_VERSION, KIND_SPARSE, counts.n], dtype="<i8"),
                                    values.astype("<i8"), value_counts.astype("<i8")])
        return words.tobytes()

    @classmethod
    def from_bytes(cls, params: MechanismParams, blob: bytes, *, key: str = "accumulator") -> CountAccumulator:
        """Inverse of :meth:`to_bytes`; a blob that does not fit ``params`` raises ``ProtocolError``."""
        acc = cls(params)
        if not isinstance(blob, (bytes, bytearray, memoryview)) or len(blob) % 8 or len(blob) < 8 * _HEADER_WORDS:
            raise ProtocolError(f"{key}: corrupted accumulator blob ({len(blob)} bytes)")
        words = np.frombuffer(bytes(blob), dtype="<i8")
        version, kind, n = (int(w) for w in words[:_HEADER_WORDS])
        body = words[_HEADER_WORDS:].astype(np.int64)
        if version != FORMAT_VERSION:
            raise ProtocolError(f"{key}: accumulator format {version}, expected {FORMAT_VERSION}")
        counts = acc._counts
        expected = (KIND_REPORT_COUNT if counts is None else
                    KIND_DENSE if isinstance(counts, (UnaryEncodingAggregator, LocalHashingAggregator))
                    or counts.params.domain_size <= MAX_DENSE_DOMAIN else KIND_SPARSE)
        if kind != expected or n < 0:
            raise ProtocolError(f"{key}: accumulator kind {kind} (n = {n}) does not fit {params.KIND}")
        try:
            if counts is None:
                if body.size:
                    raise ProtocolError(f"{key}: report-count accumulator has {body.size} extra words")
                acc._n = n
            elif isinstance(counts, UnaryEncodingAggregator):
                acc._counts = UnaryEncodingAggregator.from_counts(counts.params, body, n)
            elif isinstance(counts, LocalHashingAggregator):
                acc._counts = LocalHashingAggregator.from_counts(counts.params, body, n)
            elif kind == KIND_DENSE:
                acc._counts = GRRAggregator.from_counts(counts.params, body, n)
            else:
                if body.size % 2:
                    raise ProtocolError(f"{key}: sparse accumulator has an odd number of words")
                half = body.size // 2
                acc._counts = GRRAggregator.from_sparse(counts.params, body[:half], body[half:], n)
        except ValueError as exc:  # InvalidParameterError from from_counts
            raise ProtocolError(f"{key}: corrupted accumulator: {exc}") from exc
        return acc


def _dense_grr(agg: GRRAggregator) -> NDArray[np.int64]:
    values, counts = agg.counts()
    dense = np.zeros(agg.params.domain_size, dtype=np.int64)
    dense[values] = counts
    return dense


def decode_report_payloads(reports: Iterable[StoredReport],
                           component_params_by_group: ComponentParams) -> dict[str, list[Any]]:
    """Decode stored reports into decoded payload lists keyed ``"<group>:<component_index>"``.

    Each report's ``payloads`` is msgpack of ``[payload_to_wire(p), ...]`` with one entry per
    component of its group. Malformed reports raise ``ProtocolError`` naming the report.
    """
    pending: dict[str, list[Any]] = {}
    # Per group, the lists its components' payloads go to (a round has few groups).
    lists: dict[int, list[list[Any]]] = {}
    for report in reports:
        params = component_params_by_group.get(report.group)
        if params is None:
            raise ProtocolError(f"{_where(report)}: the group does not report in this round")
        try:
            wire = msgpack.unpackb(report.payloads, raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise ProtocolError(f"{_where(report)}: payloads are not valid msgpack: {exc}") from exc
        if not isinstance(wire, list) or len(wire) != len(params):
            raise ProtocolError(f"{_where(report)}: expected a list of {len(params)} payloads")
        targets = lists.get(report.group)
        if targets is None:
            targets = lists[report.group] = [pending.setdefault(accumulator_key(report.group, index), [])
                                             for index in range(len(params))]
        for index, item in enumerate(wire):
            try:
                payload = payload_from_wire(item)
            except ProtocolError:  # decoded again, to raise the message naming the report (made only then)
                payload = payload_from_wire(item, where=f"{_where(report)} component {index}")
            targets[index].append(payload)
    return pending


def _where(report: StoredReport) -> str:
    """How :func:`decode_report_payloads`' errors name a report."""
    return f"report {report.report_id.hex()} (group {report.group})"


@runtime_checkable
class DecodedReports(Protocol):
    """Stored reports that also carry their decoded payloads (``ldp_collector.ingest.StoredReportColumns``):
    position ``i`` of ``decoded_payloads`` holds the payloads that report ``i``'s ``payloads`` bytes encode."""

    @property
    def groups(self) -> Sequence[int]: ...

    @property
    def decoded_payloads(self) -> Sequence[Sequence[Any]]: ...


_DECODED_TYPES: dict[type, bool] = {}


def _decoded(reports: Sequence[StoredReport]) -> DecodedReports | None:
    """``reports`` as :class:`DecodedReports` if it is one, else None (remembered per type: runtime
    protocol checks are slow)."""
    kind = type(reports)
    known = _DECODED_TYPES.get(kind)
    if known is None:
        known = _DECODED_TYPES[kind] = isinstance(reports, DecodedReports)
    return cast(DecodedReports, reports) if known else None


def _payloads_by_key(reports: Sequence[StoredReport],
                     component_params_by_group: ComponentParams) -> dict[str, list[Any]]:
    """:func:`decode_report_payloads`, reading the decoded payloads when the reports carry them.

    Reports with a group outside the round or the wrong number of payloads are decoded from their
    bytes, so the errors are those of :func:`decode_report_payloads`.
    """
    columns = _decoded(reports)
    if columns is None:
        return decode_report_payloads(reports, component_params_by_group)
    groups, decoded = columns.groups, columns.decoded_payloads
    distinct = set(groups)
    if not all(len(component_params_by_group.get(g, ())) > 0 for g in distinct):
        return decode_report_payloads(reports, component_params_by_group)
    if len(distinct) == 1:
        group = groups[0]
        count = len(component_params_by_group[group])
        if set(map(len, decoded)) != {count}:
            return decode_report_payloads(reports, component_params_by_group)
        return {accumulator_key(group, index): [p[index] for p in decoded] for index in range(count)}
    pending: dict[str, list[Any]] = {}
    for group, payloads in zip(groups, decoded):
        if len(payloads) != len(component_params_by_group[group]):
            return decode_report_payloads(reports, component_params_by_group)
        for index, payload in enumerate(payloads):
            pending.setdefault(accumulator_key(group, index), []).append(payload)
    return pending


def _params_for(key: str, component_params_by_group: ComponentParams) -> MechanismParams:
    group, index = (int(part) for part in key.split(":"))
    return component_params_by_group[group][index]


def make_accumulate_fn(component_params_by_group: ComponentParams) -> AccumulateFn:
    """The store's accumulate callback for one round.

    Parameters
    ----------
    component_params_by_group : Mapping[int, Sequence[MechanismParams]]
        The mechanism of every component of every reporting group
        (:func:`component_params_from_spec`).

    Returns
    -------
    AccumulateFn
        ``accumulate(new_reports, blobs) -> updated blobs``: decodes the newly accepted reports
        (or reads their decoded payloads, :class:`DecodedReports`), adds them to the blobs of their
        ``"<group>:<component_index>"`` keys (creating missing ones) and returns only the blobs it
        changed.
    """
    frozen = {int(g): tuple(p) for g, p in component_params_by_group.items()}

    def accumulate(reports: Sequence[StoredReport], blobs: Mapping[str, bytes]) -> Mapping[str, bytes]:
        updated: dict[str, bytes] = {}
        for key, payloads in _payloads_by_key(reports, frozen).items():
            params = _params_for(key, frozen)
            acc = (CountAccumulator.from_bytes(params, blobs[key], key=key) if key in blobs
                   else CountAccumulator(params))
            acc.add(payloads)
            updated[key] = acc.to_bytes()
        return updated

    return accumulate


def rebuild(reports: Iterable[StoredReport] | Iterable[Sequence[StoredReport]],
            component_params_by_group: ComponentParams) -> dict[str, bytes]:
    """Recompute every accumulator blob of a round from its raw reports.

    Parameters
    ----------
    reports : iterable of StoredReport, or of batches of them (``ReportStore.iter_reports``)
    component_params_by_group : Mapping[int, Sequence[MechanismParams]]

    Returns
    -------
    dict of str to bytes
        Equal to what :func:`make_accumulate_fn` produced incrementally for the same reports.
    """
    return combine_batches(RoundCounts(component_params_by_group), _batches(reports)).finalize()


class RoundCounts(ReportAccumulator[dict[str, bytes]]):
    """Every component's :class:`CountAccumulator` of a round, as one report accumulator.

    What :func:`rebuild` computes, for a step whose ingestion-time blobs are missing or behind
    the raw reports; integers only, so any order of adding and merging gives the same blobs.

    Parameters
    ----------
    component_params_by_group : Mapping[int, Sequence[MechanismParams]]
        (:func:`component_params_from_spec`).
    """

    def __init__(self, component_params_by_group: ComponentParams) -> None:
        self._params = {int(g): tuple(p) for g, p in component_params_by_group.items()}
        self._accumulators: dict[str, CountAccumulator] = {}

    def zero(self) -> RoundCounts:
        return RoundCounts(self._params)

    def add(self, reports: Sequence[StoredReport]) -> None:
        for key, payloads in decode_report_payloads(reports, self._params).items():
            if key not in self._accumulators:
                self._accumulators[key] = CountAccumulator(_params_for(key, self._params))
            self._accumulators[key].add(payloads)

    def merge(self, other: RoundCounts) -> None:
        for key, acc in other._accumulators.items():
            if key not in self._accumulators:
                self._accumulators[key] = acc.zero()
            self._accumulators[key].merge(acc)

    def finalize(self) -> dict[str, bytes]:
        """The blobs, keyed ``"<group>:<component>"`` (groups without reports are absent)."""
        return {key: acc.to_bytes() for key, acc in sorted(self._accumulators.items())}

    @property
    def nbytes(self) -> int:
        return sum(len(blob) for blob in self.finalize().values())


class DecodedLocalHashing(dict[str, LocalHashingAggregator]):
    """A batch's local-hashing reports, decoded and validated: one aggregator per component key.

    What :meth:`SupportCounts.decode` returns; :attr:`nbytes` is what a reader keeping it for the
    next pass holds (the reports' seeds and buckets, or a pooled component's counts).
    """

    @property
    def nbytes(self) -> int:
        size = 0
        for agg in self.values():
            if agg.pooled:
                size += agg.counts().nbytes
            else:
                seeds, buckets = agg.reports()
                size += seeds.nbytes + buckets.nbytes
        return size


class SupportCounts(DecodedPass[NDArray[np.int64]]):
    """Local-hashing support counts of one component over candidates fixed beforehand.

    ``finalize()[j]`` is the number of the component's reports ``(s, y)`` with ``H(s, v_j) = y``
    (:meth:`LocalHashingAggregator.support`), for the candidates ``v`` the step asked for; with
    :attr:`n` that is all the estimator needs (:func:`~.frequency.estimate_from_support`). The state
    is ``m + 1`` integers, so any order of adding and merging gives the same counts.

    A step that asks about several components (a tree's levels, each its own group) makes one such
    pass per candidate set; passing every one of those components as ``decode_keys`` gives all its
    passes the same :attr:`decoding`, so an in-process reader decodes the round once and replays
    the decoded batches to the later passes (:class:`DecodedPass`), which then cost only the hashes.

    Parameters
    ----------
    component_params_by_group : Mapping[int, Sequence[MechanismParams]]
        (:func:`component_params_from_spec`).
    key : str
        The component, ``"<group>:<component>"``; its mechanism must be local hashing.
    candidates : numpy.ndarray of int64, shape (m,)
        Validated domain values.
    decode_keys : sequence of str, optional
        Further local-hashing components to decode with ``key`` (the other passes of the same step).
    """

    def __init__(self, component_params_by_group: ComponentParams, key: str, candidates: NDArray[np.int64],
                 decode_keys: Sequence[str] = ()) -> None:
        self._params = {int(g): tuple(p) for g, p in component_params_by_group.items()}
        self._decode: dict[str, LocalHashingParams] = {}
        for name in sorted({key, *decode_keys}):
            mechanism = _params_for(name, self._params)
            if not isinstance(mechanism, LocalHashingParams):
                raise TypeError(f"{name}: support counts need local hashing, got {mechanism.KIND}")
            self._decode[name] = mechanism
        self._key = key
        self._candidates = np.asarray(candidates, dtype=np.int64)
        self._support = np.zeros(self._candidates.shape[0], dtype=np.int64)
        self._n = 0

    @property
    def n(self) -> int:
        """Number of the component's reports added."""
        return self._n

    @property
    def decoding(self) -> Hashable:
        return ("local_hashing", tuple(self._decode.items()))

    def zero(self) -> SupportCounts:
        return SupportCounts(self._params, self._key, self._candidates, tuple(self._decode))

    def decode(self, reports: Sequence[StoredReport]) -> DecodedLocalHashing:
        decoded = DecodedLocalHashing()
        for key, payloads in decode_report_payloads(reports, self._params).items():
            mechanism = self._decode.get(key)
            if mechanism is not None:
                batch = decoded[key] = LocalHashingAggregator(mechanism)
                batch.add(payloads)  # validates the payloads
        return decoded

    def add_decoded(self, decoded: DecodedLocalHashing) -> None:
        batch = decoded.get(self._key)
        if batch is None or not batch.n:
            return
        self._support += batch.support(self._candidates)
        self._n += batch.n

    def merge(self, other: SupportCounts) -> None:
        if other._key != self._key or not np.array_equal(other._candidates, self._candidates):
            raise ProtocolError("cannot merge support counts of different components or candidates")
        self._support += other._support
        self._n += other._n

    def finalize(self) -> NDArray[np.int64]:
        """The support count of every candidate (a copy)."""
        return self._support.copy()

    @property
    def nbytes(self) -> int:
        return int(self._support.nbytes + self._candidates.nbytes) + 8


def aggregate_reports(reports: Iterable[StoredReport] | Iterable[Sequence[StoredReport]],
                      component_params_by_group: ComponentParams) -> dict[str, FrequencyAggregator]:
    """Frequency aggregators (local hashing included) built from raw reports, keyed like the blobs.

    Components whose mechanism is not a frequency oracle (GRR, unary encoding, local hashing)
    are skipped.
    """
    frozen = {int(g): tuple(p) for g, p in component_params_by_group.items()}
    aggregators: dict[str, FrequencyAggregator] = {}
    for batch in _batches(reports):
        for key, payloads in decode_report_payloads(batch, frozen).items():
            params = _params_for(key, frozen)
            if key not in aggregators:
                if isinstance(params, GRRParams):
                    aggregators[key] = GRRAggregator(params)
                elif isinstance(params, UnaryEncodingParams):
                    aggregators[key] = UnaryEncodingAggregator(params)
                elif isinstance(params, LocalHashingParams):
                    aggregators[key] = LocalHashingAggregator(params)
                else:
                    continue
            aggregators[key].add(payloads)
    return aggregators


def _batches(reports: Iterable[StoredReport] | Iterable[Sequence[StoredReport]],
             size: int = 65536) -> Iterable[list[StoredReport]]:
    """Batches of reports from either a flat iterable or an iterable of batches."""
    batch: list[StoredReport] = []
    for item in reports:
        if isinstance(item, StoredReport):
            batch.append(item)
        else:
            batch.extend(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
