"""The fast-local-hashing benchmark (``benchmarks/local_hashing_pool.py``) builds its populations,
sizes the pool by the rule, and its pooled estimates are those of the per-report path's accuracy."""

from __future__ import annotations

import local_hashing_pool as bench
import numpy as np
import pytest

from ldp_client.mechanisms import LocalHashingParams
from ldp_client.mechanisms.local_hashing import seed_pool_size_for


@pytest.mark.parametrize("kind", bench.POPULATIONS)
def test_populations_have_n_devices_over_the_domain(kind: str) -> None:
    values = bench.population(kind, 10_007, 64)
    counts = np.bincount(values, minlength=64)
    assert values.size == 10_007 and counts.min() >= 1
    assert (counts.max() - counts.min() <= 1) if kind == "uniform" else counts[0] > 5 * counts[63]


def test_one_seed_measures_both_paths() -> None:
    result, size = bench.run_seed("zipf", 20_000, 256, 2.0, 0.1, seed=0)
    values = bench.population("zipf", 20_000, 256)
    kappa = float(np.sum((np.bincount(values) / 20_000) ** 2))
    assert size == seed_pool_size_for(LocalHashingParams(domain_size=256, epsilon=2.0), 20_000.0, kappa, 0.1)
    assert min(result.per_report_s, result.count_s, result.support_s) > 0
    # One round over 256 values: each MSE ratio within 6 sampling sd (sqrt(2 / 256) ~ 0.09) of 1
    # (the pooled one against its own variance), generous for the pool's heavier tails.
    for ratio in (result.per_report_ratio, result.pooled_ratio_own_var):
        assert abs(ratio - 1.0) < 6 * (2 / 256) ** 0.5


def test_markdown_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--reports", "5000", "--domain", "64", "--seeds", "2", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| uniform |" in out and "| zipf |" in out and "speedup" in out
