"""The pieces of iterative steps that never hold the round: report samples and decoded passes.

:class:`~ldp_collector.estimation.report_accumulator.ReportSample` must be a function of the reports'
contents and its salt only (any order of adding and merging gives the same sample, exactly: the
Beam path's equals the in-process one; other report ids give the same sample), and uniform over the
reports for a fixed salt.
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

from ldp_collector.estimation.report_accumulator import (
    AccumulatorGroup,
    DecodedPass,
    ReportSample,
    combine_batches,
    sample_draw,
)
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


def _with_counts(counts: Sequence[int], seed: int) -> list[StoredReport]:
    """``counts[i]`` reports of content ``i`` (group ``i % 3``), under random ids, shuffled."""
    rng = random.Random(seed)
    reports = [StoredReport(report_id=rng.randbytes(16), campaign_id="c", round=1, group=i % 3,
                            payloads=i.to_bytes(4, "big")) for i, c in enumerate(counts) for _ in range(c)]
    rng.shuffle(reports)
    return reports


def _contents(sample: Sequence[StoredReport]) -> list[tuple[int, bytes]]:
    return [(r.group, r.payloads) for r in sample]


def test_sample_of_repeated_contents_is_the_same_under_other_ids_and_any_merges() -> None:
    """Far more reports than the sample, many of equal content: ids, order and merges change nothing."""
    counts = [1 + (i * 7919) % 13 for i in range(3000)]  # 3 000 contents, 1 to 13 reports each
    first, second = _with_counts(counts, seed=1), _with_counts(counts, seed=2)
    assert {r.report_id for r in first}.isdisjoint(r.report_id for r in second)
    whole = combine_batches(ReportSample(b"salt", 400), [first]).finalize()
    assert len(whole) == 400 and len(set(_contents(whole))) < 400  # some contents listed more than once
    assert _contents(combine_batches(ReportSample(b"salt", 400), [second]).finalize()) == _contents(whole)
    parts = [combine_batches(ReportSample(b"salt", 400), [second[a:b]]) for a, b in
             [(0, 5), (5, 9000), (9000, len(second))]]
    parts[2].merge(parts[0])
    parts[2].merge(parts[1])
    assert _contents(parts[2].finalize()) == _contents(whole)
    assert whole == sorted(whole, key=lambda r: (r.group, r.payloads))


def test_sample_of_few_contents_is_a_uniform_draw_of_the_reports() -> None:
    """With no more distinct contents than its size, the sample is a uniform draw of the reports themselves.

    8 contents hold 1 to 312 of 500 reports; a sample of 100 lists every content a multivariate
    hypergeometric number of times (100 of 500 without replacement), so over 300 salts content
    ``c`` is listed ``300 * 100 * C_c / 500`` times in expectation, with the multinomial's covariance
    times the finite-population factor ``(500 - 100) / 499``. The Pearson statistic scaled by that
    factor is then chi-square with 7 degrees of freedom (the smallest expectation is 60); it fails by
    chance with probability 1e-6.
    """
    counts = [1, 2, 5, 10, 20, 50, 100, 312]
    reports = _with_counts(counts, seed=5)
    listed = np.zeros(len(counts))
    for salt in range(300):
        sample = combine_batches(ReportSample(salt.to_bytes(4, "big"), 100), [reports]).finalize()
        assert len(sample) == 100
        for r in sample:
            listed[int.from_bytes(r.payloads, "big")] += 1
    expected = 300 * 100 * np.array(counts) / 500
    chi2 = float(((listed - expected) ** 2 / expected).sum()) / ((500 - 100) / 499)
    assert chi2 < stats.chi2.ppf(1 - 1e-6, len(counts) - 1)


def test_sample_draw_lists_everything_it_can_and_refuses_nothing_else() -> None:
    counts = np.array([3, 0, 5], dtype=np.int64)
    assert sample_draw(b"s", counts, 8).tolist() == [3, 0, 5]
    taken = sample_draw(b"s", counts, 4)
    assert taken.sum() == 4 and (taken <= counts).all()
    assert np.array_equal(taken, sample_draw(b"s", counts, 4))


def test_an_accumulator_group_gives_each_part_the_state_of_its_own_pass() -> None:
    """One pass into a group of accumulators: each part equals a pass of its own, merges part by part,
    and a group merges only with a group of as many parts."""
    reports = _reports(3000)
    batches = [reports[:1000], reports[1000:2500], reports[2500:]]
    own = [combine_batches(ReportSample(salt, 200), batches).finalize() for salt in (b"a", b"b", b"c")]
    group = combine_batches(AccumulatorGroup([ReportSample(salt, 200) for salt in (b"a", b"b", b"c")]), batches)
    assert list(group.finalize()) == own
    halves = [combine_batches(group.zero(), [part]) for part in (reports[:1700], reports[1700:])]
    halves[0].merge(halves[1])
    assert list(halves[0].finalize()) == own
    assert group.nbytes == sum(part.nbytes for part in group.parts)
    with pytest.raises(ValueError, match="group of 1 accumulators into one of 3"):
        group.merge(AccumulatorGroup([ReportSample(b"a", 200)]))
