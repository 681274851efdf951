"""The contract of a step that reads a round's raw reports: a mergeable accumulator (DESIGN §9).

A server step that needs more than the count accumulators kept at ingestion (local-hashing support
counts over candidates, per-bucket vector sums, ...) states what it needs as a
:class:`ReportAccumulator` and hands it to :meth:`~ldp_collector.kinds.base.RoundReports.combine`.
In-process the round's reports stream through it batch by batch; on Apache Beam every worker adds
its files to a :meth:`~ReportAccumulator.zero` copy and the copies are merged
(``ldp_collector.beam``). Either way the step holds the accumulator, never the round: memory is
the accumulator's size (:attr:`~ReportAccumulator.nbytes`) plus one batch, whatever n.

Order: integer accumulators give the same state whatever order the reports are added and merged
in. A float accumulator's state depends on that order at the last bits; each one states its
bound (two orders of summing the same n terms differ by at most ``2 (n - 1) u sum|x_i|``,
``u = 2^-53``: docs/beam.md).
"""

from __future__ import annotations

import abc
import hashlib
import heapq
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Generic, Self, TypeVar

from ..storage.base import StoredReport

__all__ = ["UNIT_ROUNDOFF", "DecodedPass", "ReportAccumulator", "ReportSample", "combine_batches", "sample_key",
           "summation_error_bound"]

#: u = 2^-53, the unit roundoff of float64.
UNIT_ROUNDOFF = 2.0**-53

_T_co = TypeVar("_T_co", covariant=True)


class ReportAccumulator(abc.ABC, Generic[_T_co]):
    """Mergeable state over a round's raw reports: ``zero / add / merge / finalize``.

    Subclasses must be picklable (Beam ships them to its workers) and must not keep the reports
    they were given: their size is bounded by their parameters, not by the number of reports.
    """

    @abc.abstractmethod
    def zero(self) -> Self:
        """A new, empty accumulator with the same parameters."""

    @abc.abstractmethod
    def add(self, reports: Sequence[StoredReport]) -> None:
        """Add a batch of stored reports (a malformed one raises ``ProtocolError``)."""

    @abc.abstractmethod
    def merge(self, other: Self) -> None:
        """Add ``other``'s state (an accumulator of the same parameters)."""

    @abc.abstractmethod
    def finalize(self) -> _T_co:
        """What the step reads: the accumulated counts or sums."""

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Size of the state in bytes (its arrays), independent of the number of reports."""


class DecodedPass(ReportAccumulator[_T_co]):
    """A pass of an iterative step over the round's reports, each batch decoded before it is added.

    An iterative step (a Lloyd or EM iteration over every report, a level of a tree) makes one
    such pass per iteration, each holding only its own state (the centers it was given and its
    sums), so the step's memory is bounded by its parameters on any engine. Every pass of one step
    decodes the reports the same way: passes with equal :attr:`decoding` keys produce equal
    :meth:`decode` output for the same batch, so a reader that can afford it keeps the decoded
    batches of the first pass and replays them to the next ones
    (:meth:`~ldp_collector.kinds.base.RoundReports.combine`) instead of reading and decoding the
    round again; the sums are the same, batch for batch.
    """

    @property
    @abc.abstractmethod
    def decoding(self) -> Hashable:
        """Key of the decoding: equal keys decode the same batch to the same rows."""

    @abc.abstractmethod
    def decode(self, reports: Sequence[StoredReport]) -> Any:
        """A batch of reports decoded (e.g. a numpy array of their points; its ``nbytes`` is its size)."""

    @abc.abstractmethod
    def add_decoded(self, decoded: Any) -> None:
        """Add a batch that :meth:`decode` produced."""

    def add(self, reports: Sequence[StoredReport]) -> None:
        self.add_decoded(self.decode(reports))


#: Reports a :class:`ReportSample` keeps unless told otherwise.
DEFAULT_SAMPLE_SIZE = 1 << 16


def sample_key(salt: bytes, report_id: bytes) -> int:
    """A report's key in a :class:`ReportSample` of ``salt``: ``BLAKE2b-64(report_id, key=salt)``, big-endian."""
    return int.from_bytes(hashlib.blake2b(report_id, digest_size=8, key=salt).digest(), "big")


class ReportSample(ReportAccumulator[list[StoredReport]]):
    """A uniform sample of a round's reports, the same whatever order they come in (bottom-m).

    Keeps the ``size`` reports of smallest keyed hash ``BLAKE2b-64(report_id, key=salt)`` (ties by
    report id), so the sample depends only on the set of reports and the salt: the in-process and
    the Beam path draw the same one, exactly, and merging two samples keeps the bottom ``size`` of
    their union. Report ids are random (the devices draw them), so for a fixed salt the sample is a
    uniform draw without replacement; a step derives the salt from its campaign seed. Which reports
    a sample of a larger round keeps depends on their ids, so a repeated simulation (other ids)
    draws another sample there. Used where an
    iterative step needs a starting point drawn from the data (k-means++ seeding) without holding
    the round. Memory: ``size`` stored reports.
    """

    def __init__(self, salt: bytes, size: int = DEFAULT_SAMPLE_SIZE) -> None:
        if not 1 <= size <= 1 << 24:
            raise ValueError(f"a report sample holds between 1 and 2^24 reports, got {size}")
        if not 1 <= len(salt) <= 64:
            raise ValueError(f"a report sample's salt is 1 to 64 bytes, got {len(salt)}")
        self.salt = bytes(salt)
        self.size = int(size)
        # A max-heap of the kept keys (negated): its top is the largest kept, the next to evict.
        self._heap: list[tuple[int, bytes, StoredReport]] = []

    def zero(self) -> ReportSample:
        return ReportSample(self.salt, self.size)

    def _offer(self, key: int, report: StoredReport) -> None:
        item = (-key, _negated(report.report_id), report)
        if len(self._heap) < self.size:
            heapq.heappush(self._heap, item)
        elif item[:2] > self._heap[0][:2]:
            heapq.heapreplace(self._heap, item)

    def add(self, reports: Sequence[StoredReport]) -> None:
        for r in reports:
            self._offer(sample_key(self.salt, r.report_id), r)

    def merge(self, other: ReportSample) -> None:
        for neg_key, _, report in other._heap:
            self._offer(-neg_key, report)

    def finalize(self) -> list[StoredReport]:
        """The kept reports in the order of their content (group, payloads, then id).

        A fixed order whatever the engine, and one that does not depend on the ids: a round that
        fits in the sample gives the same list, in the same order, on a repeated run whose
        devices sent the same reports under other ids (a seeded simulation), so what a step seeds
        from it repeats too.
        """
        return sorted((r for _, _, r in self._heap), key=lambda r: (r.group, r.payloads, r.report_id))

    @property
    def nbytes(self) -> int:
        return sum(len(r.report_id) + len(r.payloads) + 64 for _, _, r in self._heap)


#: b -> 255 - b, for bytes.translate.
_NEGATION = bytes(range(255, -1, -1))


def _negated(report_id: bytes) -> bytes:
    # Orders report ids in reverse, so a larger id is evicted first on a key tie (an involution).
    # translate: one C call per id (a generator over the bytes cost a third of a 1e5-report sample).
    return report_id.translate(_NEGATION)


_A = TypeVar("_A", bound=ReportAccumulator[object])


def combine_batches(accumulator: _A, batches: Iterable[Sequence[StoredReport]]) -> _A:
    """Add every batch to ``accumulator`` in order and return it (the in-process ``combine``)."""
    for batch in batches:
        accumulator.add(batch)
    return accumulator


def summation_error_bound(terms: int, abs_sum: float) -> float:
    """Bound on the difference between two summation orders of the same ``terms`` floats.

    Each order errs by at most ``(terms - 1) u sum|x_i|`` (Higham, *Accuracy and Stability of
    Numerical Algorithms*, §4.2, any order of pairwise additions), so two orders differ by at
    most twice that.
    """
    return 2.0 * max(terms - 1, 0) * UNIT_ROUNDOFF * abs_sum
