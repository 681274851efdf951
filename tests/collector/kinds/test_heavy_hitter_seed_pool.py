"""HEAVY_HITTERS campaigns whose local-hashing levels draw seeds from a public pool (docs/protocol.md §14)."""

from __future__ import annotations

import pytest

from ldp.v1 import campaigns_pb2
from ldp_client.mechanisms import LocalHashingParams
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.kinds.common import seed_pool_key
from ldp_collector.kinds.histogram import round_aggregators
from support.round_reports import ListRoundReports

from .test_heavy_hitter_engine import config, engine_for, population, rows_for


def test_local_hashing_levels_use_the_pool() -> None:
    engine = engine_for(config(size=2**12, epsilon=4.0, seed_pool_size=512))
    spec = engine.first_round().spec
    mechanisms = [task.components[0].mechanism for task in spec.tasks]
    pooled = [m for m in mechanisms if isinstance(m, LocalHashingParams)]
    assert pooled, "the default tree has local-hashing levels"
    for m in pooled:
        assert m.seed_pool_size == 512 and m.seed_pool_key == seed_pool_key(engine.config, 1)
    # Levels on other oracles are unchanged.
    assert all(not isinstance(m, LocalHashingParams) or m.seed_pool_size for m in mechanisms)


def test_finds_the_heavy_hitters_from_pooled_counts() -> None:
    engine = engine_for(config(size=2**12, epsilon=4.0, false_positive_rate=1e-6, seed_pool_size=1024))
    spec = engine.first_round().spec
    heavy = {3001: 0.30, 77: 0.20, 2048: 0.12}
    values = population(12000, heavy, 12, seed=1)
    reports = rows_for(engine, spec, values, seed=2)
    assert all(getattr(a, "pooled", True) for a in round_aggregators(spec, reports).values()
               if isinstance(a.params, LocalHashingParams))
    outcome = engine.close_round(spec, reports, b"")
    assert outcome.result is not None
    found = {h.value: h for h in outcome.result.heavy_hitters}
    assert set(found) == set(heavy)
    for value in heavy:
        truth = values.count(value)
        assert abs(found[value].count - truth) <= 5 * found[value].std_error, (value, found[value], truth)
    # The same result from the raw reports alone (the pooled counts are a cache of them).
    assert engine.close_round(spec, ListRoundReports(reports.rows), b"").result == outcome.result


@pytest.mark.parametrize("size,message", [(2**24 + 1, "at most"), (2**22, "seed_pool_size x g")])
def test_bad_pool_sizes(size: int, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        engine_for(config(size=2**12, epsilon=4.0, seed_pool_size=size))


def test_cli_flag() -> None:
    from ldp_collector.cli_args import build_campaign_config

    c = build_campaign_config("heavy_hitters", epsilon=4.0, categories=2**12, seed_pool=256)
    assert c.heavy_hitters.seed_pool_size == 256 and c.kind == campaigns_pb2.HEAVY_HITTERS
