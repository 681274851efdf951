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
from collections.abc import Iterable, Sequence
from typing import Generic, Self, TypeVar

from ..storage.base import StoredReport

__all__ = ["UNIT_ROUNDOFF", "ReportAccumulator", "combine_batches", "summation_error_bound"]

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
