"""Local-hashing support passes (:class:`~ldp_collector.estimation.accumulators.SupportCounts`).

A pass counts one component's support of the candidates it was given, exactly the per-report
support of the same reports; the passes of one step over several components share one decoding
(``decode_keys``), so a reader that keeps decoded batches reads the round once for all of them.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgpack
import numpy as np
import pytest

from ldp_client.mechanisms import GRRParams, LocalHashingParams
from ldp_client.payload import payload_to_wire
from ldp_client.rng import SeededRng
from ldp_collector.estimation.accumulators import SupportCounts
from ldp_collector.estimation.frequency import LocalHashingAggregator
from ldp_collector.estimation.report_accumulator import combine_batches
from ldp_collector.storage.base import StoredReport
from support.round_reports import ListRoundReports

_PARAMS = {0: (LocalHashingParams(domain_size=4096, epsilon=2.0),),
           1: (LocalHashingParams(domain_size=512, epsilon=2.0),),
           2: (GRRParams(domain_size=8, epsilon=2.0),)}
_CANDIDATES = np.arange(0, 512, 3, dtype=np.int64)


def _round(n: int, seed: int = 1) -> tuple[list[StoredReport], dict[int, list[object]]]:
    rng = SeededRng(seed)
    rows: list[StoredReport] = []
    payloads: dict[int, list[object]] = {0: [], 1: [], 2: []}
    for i in range(n):
        group = i % 3
        (params,) = _PARAMS[group]
        payload = params.randomize(rng.randbelow(params.domain_size) // 7, rng=rng)
        payloads[group].append(payload)
        rows.append(StoredReport(report_id=rng.token_bytes(16), campaign_id="c", round=1, group=group,
                                 payloads=msgpack.packb([payload_to_wire(payload)])))
    return rows, payloads


class _CountedReads(ListRoundReports):
    reads = 0

    def batches(self, batch_size: int = 65536) -> Iterator[list[StoredReport]]:
        self.reads += 1
        return super().batches(1000)


def test_support_is_the_per_report_support_whatever_the_batches() -> None:
    rows, payloads = _round(6000)
    for group in (0, 1):
        (params,) = _PARAMS[group]
        expected = LocalHashingAggregator(params)
        expected.add(payloads[group])
        key = f"{group}:0"
        whole = combine_batches(SupportCounts(_PARAMS, key, _CANDIDATES, ("0:0", "1:0")), [rows])
        assert np.array_equal(whole.finalize(), expected.support(_CANDIDATES)) and whole.n == expected.n
        # Merged partial passes (as Beam's workers combine them) give the same integers.
        parts = [combine_batches(SupportCounts(_PARAMS, key, _CANDIDATES), [rows[i:i + 700]])
                 for i in range(0, len(rows), 700)]
        merged = parts[0]
        for part in parts[1:]:
            merged.merge(part)
        assert np.array_equal(merged.finalize(), whole.finalize()) and merged.n == whole.n


def test_passes_sharing_a_decoding_read_the_round_once() -> None:
    rows, _ = _round(3000)
    keys = ("0:0", "1:0")
    shared = [SupportCounts(_PARAMS, key, _CANDIDATES, keys) for key in keys]
    assert shared[0].decoding == shared[1].decoding == shared[0].zero().decoding
    reports = _CountedReads(rows)
    counted = [reports.combine(p).finalize() for p in shared]
    assert reports.reads == 1
    # Without the shared keys each pass decodes only its own component: one read each, same counts.
    alone = _CountedReads(rows)
    assert all(np.array_equal(alone.combine(SupportCounts(_PARAMS, key, _CANDIDATES)).finalize(), c)
               for key, c in zip(keys, counted))
    assert alone.reads == 2


def test_only_local_hashing_components_are_decoded() -> None:
    with pytest.raises(TypeError, match="2:0: support counts need local hashing"):
        SupportCounts(_PARAMS, "0:0", _CANDIDATES, ("2:0",))
