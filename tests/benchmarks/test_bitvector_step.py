"""``benchmarks/bitvector_step.py``: both paths score the same noisy bits, and a seed repeats."""

from __future__ import annotations

import bitvector_step as bs
import pytest


@pytest.mark.parametrize("path", ["round", "whole"])
def test_a_seed_fixes_data_noise_and_clustering(path: str) -> None:
    first = bs.run(3000, 1, 4.0, path)
    again = bs.run(3000, 1, 4.0, path)
    assert {k: v for k, v in first.items() if k != "cpu_s"} == {k: v for k, v in again.items() if k != "cpu_s"}
    assert -1.0 <= first["ari"] <= 1.0 and first["cost_ratio"] >= 0.99  # k-means' own cost is the floor
    # The round path makes at least one pass over every report; the whole path none.
    assert (first["round_passes"] >= 1) == (path == "round")


def test_seed_ranges_and_lists() -> None:
    assert bs._seeds("100-103") == [100, 101, 102, 103]
    assert bs._seeds("3,5") == [3, 5]
