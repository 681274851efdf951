"""The round diagnosis (``benchmarks/stemmer_rounds.py``): exact rounds are the noiseless steps, the patch is undone."""

from __future__ import annotations

import math

import center_acceptance
import numpy as np
import pytest
import stemmer_rounds as study

from ldp_collector.kinds.stemmer import StemmerEngine
from ldp_collector.simulation.datasets import make_dataset


def _mixture(n: int = 6_000, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    x, y = make_dataset("mixture", n, d=4, k=3, seed=seed)
    assert y is not None
    return x, y


def test_every_round_exact_is_the_noiseless_protocol() -> None:
    x, y = _mixture()
    seen: dict[str, object] = {}
    with study.exact_rounds("ABCD", x, seen):
        exact = center_acceptance.run_kind("stemmer", x, y, 3, center_acceptance.NOISELESS_PLAN_EPSILON, 5, {})
    noiseless = center_acceptance.run_kind("stemmer", x, y, 3, math.inf, 5, {})
    # The same plan and public randomness, every input exact: the noiseless server steps' centers.
    assert np.array_equal(exact["_centers"], noiseless["_centers"])  # type: ignore[arg-type]
    assert np.asarray(seen["centers"]).shape == (3, 4)


def test_no_round_exact_is_the_campaign_and_the_methods_come_back() -> None:
    x, y = _mixture()
    before = {name: getattr(StemmerEngine, name) for name in ("_close_keys", "_close_means", "_close_weights",
                                                              "_close_lloyd")}
    with study.exact_rounds("", x, {}):
        patched = center_acceptance.run_kind("stemmer", x, y, 3, 2.0, 5, {})
    plain = center_acceptance.run_kind("stemmer", x, y, 3, 2.0, 5, {})
    assert np.array_equal(patched["_centers"], plain["_centers"])  # type: ignore[arg-type]
    with pytest.raises(RuntimeError), study.exact_rounds("B", x, {}):
        raise RuntimeError("a failing campaign")
    assert {name: getattr(StemmerEngine, name) for name in before} == before


def test_the_table_and_its_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    assert study.main(["--dataset", "mixture", "--n", "4000", "--seeds", "1", "--epsilon", "2", "--exact", "-", "BC"]) == 0
    table = capsys.readouterr().out
    assert "| - | 1 |" in table and "| BC | 1 |" in table
    for bad in (["--exact", "E"], ["--exact", "-A"], ["--seeds", "21"], ["--n", "0"], ["--epsilon", "-1"],
                ["--epsilon", "inf"], ["--epsilon", "101"]):
        with pytest.raises(SystemExit) as exc:
            study.main(bad)
        assert exc.value.code == 2
    with pytest.raises(ValueError, match="rounds are letters"), study.exact_rounds("X", np.zeros((1, 2)), {}):
        pass
