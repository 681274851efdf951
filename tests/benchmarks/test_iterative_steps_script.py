"""``benchmarks/iterative_steps.py``: every configuration scored on one played campaign, its steps replayed.

(Two runs of a seed need not agree exactly: the report ids carry their creation second, and the
steps draw their k-means++ seeds from a sample keyed by the report ids.)"""

from __future__ import annotations

import iterative_steps as its
import pytest


@pytest.mark.parametrize(("kind", "configs"), [("laplace", list(its.LAPLACE_ALGORITHMS)), ("ldp_kmeans", ["ldp_kmeans"])])
def test_run_seed_scores_every_configuration_and_times_its_step(kind: str, configs: list[str]) -> None:
    rows = its.run_seed(kind, 800, 2, 4.0, 100)
    assert [r["config"] for r in rows] == configs
    assert all(-1.0 <= r["ari"] <= 1.0 and r["cost_per_point"] > 0 and r["step_cpu_s"] > 0 for r in rows)
    table = its.summary(rows + rows)
    assert len(table) == 2 + len(configs) and all(line.startswith(f"| {c} |") for line, c in zip(table[2:], configs))
