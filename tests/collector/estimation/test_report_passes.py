"""The pieces of iterative steps that never hold the round: report samples and decoded passes.

:class:`~ldp_collector.estimation.report_accumulator.ReportSample` must be a function of the set of
reports and its salt only (any order of adding and merging gives the same sample, exactly: the
Beam path's equals the in-process one), and uniform over the reports for a fixed salt.
:class:`~ldp_collector.estimation.report_accumulator.DecodedPass` passes must add the same decoded
batches in the same order whether a reader keeps them (within its byte budget) or reads the round
again.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import pytest
from scipy import stats

from ldp_collector.estimation.report_accumulator import DecodedPass, ReportSample, combine_batches
from ldp_collector.storage.base import StoredReport
from support.round_reports import ListRoundReports


def _reports(n: int, seed: int = 0) -> list[StoredReport]:
    rng = random.Random(seed)
    return [StoredReport(report_id=rng.randbytes(16), campaign_id="c", round=1, group=0,
                         payloads=i.to_bytes(4, "big")) for i in range(n)]


def test_sample_is_the_same_whatever_the_order_of_adding_and_merging() -> None:
    reports = _reports(5000)
    whole = combine_batches(ReportSample(b"salt", 300), [reports]).finalize()
    assert len(whole) == 300
    rng = random.Random(1)
    for _ in range(5):
        shuffled = reports[:]
        rng.shuffle(shuffled)
        cuts = sorted(rng.sample(range(1, len(shuffled)), 6))
        parts = [shuffled[a:b] for a, b in zip([0, *cuts], [*cuts, len(shuffled)])]
        partials = [combine_batches(ReportSample(b"salt", 300), [part[:len(part) // 2], part[len(part) // 2:]])
                    for part in parts]
        merged = partials[0]
        for p in partials[1:]:
            merged.merge(p)
        assert merged.finalize() == whole
    assert combine_batches(ReportSample(b"other", 300), [reports]).finalize() != whole


def test_sample_keeps_everything_below_its_size() -> None:
    reports = _reports(40)
    assert sorted(r.report_id for r in combine_batches(ReportSample(b"s", 64), [reports]).finalize()) == \
        sorted(r.report_id for r in reports)


def test_sample_is_uniform_over_the_reports() -> None:
    """Over 400 salts, every one of 50 reports is kept 400 * 10 / 50 = 80 times in expectation.

    The inclusion counts of a uniform 10-of-50 sample are each Binomial(400, 1/5); a chi-square
    test of the counts against 80 (49 degrees of freedom: the counts sum to 4000; the dependence
    between counts only makes the statistic smaller) fails by chance with probability 1e-6.
    """
    reports = _reports(50, seed=3)
    index = {r.report_id: i for i, r in enumerate(reports)}
    counts = np.zeros(50)
    for salt in range(400):
        for r in combine_batches(ReportSample(salt.to_bytes(4, "big"), 10), [reports]).finalize():
            counts[index[r.report_id]] += 1
    expected = 400 * 10 / 50
    chi2 = float(((counts - expected) ** 2 / (expected * (1 - 10 / 50))).sum())
    assert chi2 < stats.chi2.ppf(1 - 1e-6, 49)


@pytest.mark.parametrize(("salt", "size"), [(b"", 10), (b"s", 0), (b"x" * 65, 10)])
def test_sample_refuses_bad_parameters(salt: bytes, size: int) -> None:
    with pytest.raises(ValueError, match="report sample"):
        ReportSample(salt, size)


class _SumPass(DecodedPass[float]):
    """Sums the reports' integers times a factor, counting its decodes."""

    decodes = 0

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.total = 0.0

    @property
    def decoding(self) -> Hashable:
        return "ints"

    def decode(self, reports: Sequence[StoredReport]) -> Any:
        type(self).decodes += 1
        return np.array([int.from_bytes(r.payloads, "big") for r in reports], dtype=np.float64)

    def add_decoded(self, decoded: Any) -> None:
        self.total += float(decoded.sum()) * self.factor

    def zero(self) -> _SumPass:
        return _SumPass(self.factor)

    def merge(self, other: _SumPass) -> None:
        self.total += other.total

    def finalize(self) -> float:
        return self.total

    @property
    def nbytes(self) -> int:
        return 8


class _Batched(ListRoundReports):
    def __init__(self, rows: Sequence[StoredReport], budget: int) -> None:
        super().__init__(rows)
        self.decoded_cache_bytes = budget
        self.reads = 0

    def batches(self, batch_size: int = 65536):  # type: ignore[override]
        self.reads += 1
        return super().batches(100)


@pytest.mark.parametrize(("budget", "reads"), [(1 << 20, 1), (8 * 250, 3)])
def test_decoded_passes_are_replayed_within_the_budget(budget: int, reads: int) -> None:
    rows = _reports(1000)
    expected = sum(range(1000))
    round_reports = _Batched(rows, budget)
    _SumPass.decodes = 0
    for factor in (1.0, 2.0, 3.0):
        assert round_reports.combine(_SumPass(factor)).finalize() == expected * factor
    assert round_reports.reads == reads
    assert _SumPass.decodes == 10 * reads
    assert math.isclose(round_reports.combine(_SumPass(0.5)).finalize(), expected / 2)


def test_sample_is_listed_in_the_order_of_its_content_not_its_ids() -> None:
    """A round that fits in the sample gives the same list when its reports come under other ids."""
    reports = _reports(300, seed=1)
    renamed = [StoredReport(report_id=r.report_id[::-1], campaign_id=r.campaign_id, round=r.round, group=r.group,
                            payloads=r.payloads) for r in reversed(reports)]
    first = combine_batches(ReportSample(b"salt", 500), [reports]).finalize()
    second = combine_batches(ReportSample(b"salt", 500), [renamed]).finalize()
    assert [(r.group, r.payloads) for r in first] == [(r.group, r.payloads) for r in second] == \
        sorted((r.group, r.payloads) for r in reports)
