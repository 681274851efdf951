"""STEMMER campaigns whose key round's local-hashing scales draw seeds from a public pool (docs/protocol.md §14)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from ldp.v1 import campaigns_pb2
from ldp_client.mechanisms import LocalHashingParams
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.estimation.accumulators import component_params_from_spec, decode_report_payloads
from ldp_collector.estimation.frequency import LocalHashingAggregator
from ldp_collector.kinds.common import seed_pool_key
from ldp_collector.kinds.histogram import round_aggregators
from ldp_collector.kinds.stemmer import StemmerEngine
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.storage.base import StoredReport
from support.round_reports import ListRoundReports

from .test_stemmer_engine import engine_for, key_round_rows, stemmer_config

_N = 12_000


def _points() -> np.ndarray:
    x, _ = make_dataset("mixture", _N, d=2, k=3, seed=5, separation=4.0)
    return np.asarray(x)


def _engine(**params: object) -> StemmerEngine:
    x = _points()
    return engine_for(stemmer_config((x.min(axis=0) - 1.0).tolist(), (x.max(axis=0) + 1.0).tolist(), epsilon=4.0,
                                     k=3, campaign_id="st-pool", **params))


class _CountsOnly(ListRoundReports):
    """A round whose raw reports must not be read: a pooled key round estimates from its counts."""

    def batches(self, batch_size: int = 65536) -> Iterator[list[StoredReport]]:
        raise AssertionError("a pooled key round read its raw reports")


def test_local_hashing_scales_use_the_pool() -> None:
    engine = _engine(seed_pool_size=512)
    plain = _engine()
    mechanisms = [task.components[0].mechanism for task in engine.first_round().spec.tasks]
    assert any(isinstance(m, LocalHashingParams) for m in mechanisms), "the deeper scales use local hashing"
    for m, p in zip(mechanisms, (task.components[0].mechanism for task in plain.first_round().spec.tasks)):
        if isinstance(m, LocalHashingParams):
            assert m.seed_pool_size == 512 and m.seed_pool_key == seed_pool_key(engine.config, 1)
            assert replace(m, seed_pool_size=0, seed_pool_key=0) == p
        else:  # scales on other oracles are unchanged
            assert m == p


def test_pooled_support_counts_are_the_per_report_ones() -> None:
    engine = _engine(seed_pool_size=256)
    spec = engine.first_round().spec
    rows = key_round_rows(spec, _points(), seed=2)
    accumulate = engine.accumulate_fn(spec)
    assert accumulate is not None
    reports = _CountsOnly(rows, dict(accumulate(rows, {})))
    found = round_aggregators(spec, reports)
    payloads = decode_report_payloads(rows, component_params_from_spec(spec))
    pooled_keys = [key for key, a in found.items() if isinstance(a.params, LocalHashingParams)]
    assert pooled_keys
    candidates = np.arange(256, dtype=np.int64)
    for key in pooled_keys:
        pooled = found[key]
        assert isinstance(pooled, LocalHashingAggregator) and pooled.pooled
        # The same reports counted one by one, their pool seeds taken as per-report seeds.
        per_report = LocalHashingAggregator(replace(pooled.params, seed_pool_size=0, seed_pool_key=0))
        per_report.add(payloads[key])
        assert np.array_equal(pooled.support(candidates), per_report.support(candidates)), key
        assert pooled.n == per_report.n


def test_the_pooled_key_round_reads_only_counts_and_finds_every_cluster() -> None:
    engine = _engine(seed_pool_size=1024)
    spec = engine.first_round().spec
    rows = key_round_rows(spec, _points(), seed=3)
    accumulate = engine.accumulate_fn(spec)
    assert accumulate is not None
    outcome = engine.close_round(spec, _CountsOnly(rows, dict(accumulate(rows, {}))), engine.first_round().engine_state)
    assert outcome.next_round is not None
    assert outcome.diagnostics["heavy_keys"] >= 3
    # The same outcome from the raw reports alone (the pooled counts are a cache of them).
    again = engine.close_round(spec, ListRoundReports(rows), engine.first_round().engine_state)
    assert again.next_round is not None and again.next_round.spec == outcome.next_round.spec
    assert again.next_round.engine_state == outcome.next_round.engine_state


@pytest.mark.parametrize("size,message", [(2**24 + 1, "at most"), (2**22, "seed_pool_size x g")])
def test_bad_pool_sizes(size: int, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        _engine(seed_pool_size=size)


def test_a_pool_is_refused_where_the_campaign_oracles_leave_out_local_hashing() -> None:
    x = _points()
    config = stemmer_config((x.min(axis=0) - 1.0).tolist(), (x.max(axis=0) + 1.0).tolist(), epsilon=4.0, k=3,
                            seed_pool_size=64)
    config.oracles.extend([campaigns_pb2.GRR, campaigns_pb2.OUE])
    with pytest.raises(InvalidArgumentError, match="seed pool needs local hashing"):
        engine_for(config)
    config.oracles.append(campaigns_pb2.OLH)
    assert engine_for(config).params.seed_pool_size == 64


def test_cli_flag() -> None:
    from ldp_collector.cli_args import build_campaign_config

    c = build_campaign_config("stemmer", epsilon=4.0, bounds=((0.0, 0.0), (1.0, 1.0)), k=3, seed_pool=256)
    assert c.stemmer.seed_pool_size == 256 and c.kind == campaigns_pb2.STEMMER
