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
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Generic, Self, TypeVar

import numpy as np
from numpy.typing import NDArray

from ..storage.base import StoredReport

__all__ = ["UNIT_ROUNDOFF", "AccumulatorGroup", "DecodedPass", "ReportAccumulator", "ReportSample", "check_sample", "combine_batches",
           "sample_draw", "sample_key", "summation_error_bound"]

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


class AccumulatorGroup(ReportAccumulator[tuple[Any, ...]]):
    """Several accumulators filled by one pass over the round: each part gets every batch, in order.

    A step that needs several independent accumulators of one round (stemmer's per-subgroup bucket
    sums) reads the round once instead of once per part. Each part's state is the one it would have
    from a pass of its own (the same batches in the same order), so its sums are the same bit for
    bit. :meth:`finalize` gives the parts' results in order.
    """

    def __init__(self, parts: Sequence[ReportAccumulator[Any]]) -> None:
        self._parts = tuple(parts)

    @property
    def parts(self) -> tuple[ReportAccumulator[Any], ...]:
        return self._parts

    def zero(self) -> AccumulatorGroup:
        return AccumulatorGroup([part.zero() for part in self._parts])

    def add(self, reports: Sequence[StoredReport]) -> None:
        for part in self._parts:
            part.add(reports)

    def merge(self, other: AccumulatorGroup) -> None:
        if len(other._parts) != len(self._parts):
            raise ValueError(f"cannot merge a group of {len(other._parts)} accumulators into one of "
                             f"{len(self._parts)}")
        for part, theirs in zip(self._parts, other._parts):
            part.merge(theirs)

    def finalize(self) -> tuple[Any, ...]:
        return tuple(part.finalize() for part in self._parts)

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self._parts)


#: Reports a :class:`ReportSample` keeps unless told otherwise.
DEFAULT_SAMPLE_SIZE = 1 << 16


def sample_key(salt: bytes, content: bytes | memoryview) -> int:
    """A content's key in a sample of ``salt``: ``BLAKE2b-64(content, key=salt)``, big-endian."""
    return int.from_bytes(hashlib.blake2b(content, digest_size=8, key=salt).digest(), "big")


def check_sample(salt: bytes, size: int) -> None:
    """Refuse a sample's salt or size with a one-line reason."""
    if not 1 <= size <= 1 << 24:
        raise ValueError(f"a report sample holds between 1 and 2^24 reports, got {size}")
    if not 1 <= len(salt) <= 64:
        raise ValueError(f"a report sample's salt is 1 to 64 bytes, got {len(salt)}")


def sample_draw(salt: bytes, counts: NDArray[np.int64], size: int) -> NDArray[np.int64]:
    """How many reports of each kept content (``counts`` of them, in content order) a sample lists.

    All of them when they number at most ``size``; otherwise ``size`` drawn without replacement
    (multivariate hypergeometric), from a generator seeded by the salt: a function of the kept
    contents, their counts and the salt only, so every engine draws the same.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if int(counts.sum()) <= size:
        return counts
    seed = int.from_bytes(hashlib.blake2b(b"sample draw", digest_size=8, key=salt).digest(), "big")
    taken: NDArray[np.int64] = np.random.default_rng(seed).multivariate_hypergeometric(counts, size)
    return taken


class ReportSample(ReportAccumulator[list[StoredReport]]):
    """A sample of a round's reports that depends only on their contents, whatever order they come in.

    Keeps the ``size`` distinct contents (group and payloads) of smallest keyed hash
    ``BLAKE2b-64(group as 4 bytes little-endian + payloads, key=salt)`` (ties by content) with
    their exact counts, then lists ``size`` of the reports of those contents (:func:`sample_draw`).
    A content kept in the whole round's sample is kept, with its count, in every part's
    (fewer contents lie below it there), so merging parts gives the whole round's sample exactly:
    the in-process and the Beam path draw the same one, and so does a repeated run whose devices
    sent the same reports under other ids (a seeded simulation). Report ids play no part.

    What it draws: a round with at most ``size`` distinct contents is listed exactly, or a uniform
    sample without replacement of ``size`` of its reports. With more, each content is kept with
    probability ``size / D`` (D distinct contents), then its reports are drawn with the others'; a
    report's chance of being listed is its share ``size / n`` when contents hold few reports each (the
    devices' randomizers make almost every report distinct), and a content holding ``c`` reports,
    against ``n / D`` on average, gets about ``1 / (1 + c D / (size n))`` of its share (no less than
    half until it holds ``size`` times the average). Used where an iterative step needs a starting
    point drawn from the data (k-means++ seeding) without holding the round. Memory: at most
    ``2 size`` distinct contents with one stored report each.
    """

    def __init__(self, salt: bytes, size: int = DEFAULT_SAMPLE_SIZE) -> None:
        check_sample(salt, size)
        self.salt = bytes(salt)
        self.size = int(size)
        # (key, group, payloads) -> [count, the report of least id]; contents above ``_bound`` are out.
        self._kept: dict[tuple[int, int, bytes], list[Any]] = {}
        self._bound: tuple[int, int, bytes] | None = None

    def zero(self) -> ReportSample:
        return ReportSample(self.salt, self.size)

    def _offer(self, entry: tuple[int, int, bytes], count: int, report: StoredReport) -> None:
        if self._bound is not None and entry > self._bound:
            return
        slot = self._kept.get(entry)
        if slot is None:
            self._kept[entry] = [count, report]
            if len(self._kept) >= 2 * self.size:
                self._compact()
        else:
            slot[0] += count
            if report.report_id < slot[1].report_id:
                slot[1] = report

    def _compact(self) -> None:
        # The bound only falls: a content above it is above the size-th of every later state too.
        if len(self._kept) <= self.size:
            return
        order = sorted(self._kept)
        self._bound = order[self.size - 1]
        for entry in order[self.size:]:
            del self._kept[entry]

    def add(self, reports: Sequence[StoredReport]) -> None:
        for r in reports:
            self._offer((sample_key(self.salt, r.group.to_bytes(4, "little") + r.payloads), r.group, r.payloads), 1, r)

    def merge(self, other: ReportSample) -> None:
        for entry, (count, report) in other._kept.items():
            self._offer(entry, count, report)

    def finalize(self) -> list[StoredReport]:
        """The listed reports in the order of their content (group, payloads), equal contents together.

        A fixed order whatever the engine and whatever the ids. Each listed report of a content is
        that content's report of least id.
        """
        self._compact()
        entries = sorted(self._kept, key=lambda e: (e[1], e[2]))
        taken = sample_draw(self.salt, np.array([self._kept[e][0] for e in entries], dtype=np.int64), self.size)
        return [self._kept[e][1] for e, t in zip(entries, taken.tolist()) for _ in range(t)]

    @property
    def nbytes(self) -> int:
        return sum(len(r.report_id) + 2 * len(r.payloads) + 128 for _, r in self._kept.values())


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
