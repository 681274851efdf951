"""A round's accumulators as an Apache Beam ``CombineFn`` (DESIGN §9).

:class:`ReportCombineFn` runs any of the collector's report accumulators
(:class:`~ldp_collector.estimation.report_accumulator.ReportAccumulator`: the count accumulators
of every component, :class:`~ldp_collector.estimation.accumulators.RoundCounts`; local-hashing
support counts; per-bucket vector sums; ...) on Beam. Its verbs map one to one:

=====================  ===========================================================
Beam                   accumulator
=====================  ===========================================================
``create_accumulator`` ``zero``
``add_input``          ``add``, batch by batch, of the reports of one file
``merge_accumulators`` ``merge``
``extract_output``     the accumulator itself (the step calls ``finalize``)
=====================  ===========================================================

Elements are report files (one Parquet file of an export or a landing): a worker reads one file
at a time, in batches, into its accumulator, so its memory is the accumulator plus one batch,
whatever the round's size. The in-process step runs the same accumulator over the store's
batches (:meth:`~ldp_collector.kinds.base.RoundReports.combine`).
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam

from ..columnar import read_file
from ..estimation.report_accumulator import ReportAccumulator

__all__ = ["READ_BATCH_ROWS", "ReportCombineFn"]

#: Rows of a file read and added at once: bounds a worker's scratch besides its accumulator.
READ_BATCH_ROWS = 65536


class ReportCombineFn(beam.CombineFn):  # type: ignore[misc]  # beam.CombineFn is Any to mypy
    """A :class:`ReportAccumulator` over report files, as a ``CombineFn`` (for ``CombineGlobally``).

    Parameters
    ----------
    prototype : ReportAccumulator
        An empty accumulator with the step's parameters; every partial result is a ``zero()`` of it.
    """

    def __init__(self, prototype: ReportAccumulator[Any]) -> None:
        super().__init__()
        self._prototype = prototype.zero()

    def create_accumulator(self) -> ReportAccumulator[Any]:
        return self._prototype.zero()

    def add_input(self, accumulator: ReportAccumulator[Any], path: str) -> ReportAccumulator[Any]:
        for rows in read_file(path, READ_BATCH_ROWS):
            accumulator.add([row.report for row in rows])
        return accumulator

    def merge_accumulators(self, accumulators: Any) -> ReportAccumulator[Any]:
        merged = self._prototype.zero()
        for accumulator in accumulators:
            merged.merge(accumulator)
        return merged

    def extract_output(self, accumulator: ReportAccumulator[Any]) -> ReportAccumulator[Any]:
        return accumulator
