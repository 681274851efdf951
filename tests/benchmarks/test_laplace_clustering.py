"""``benchmarks/laplace_clustering.py``: the configurations it runs, the default it chooses, the seeds it keeps apart."""

from __future__ import annotations

from typing import Any

import laplace_clustering as lc
import pytest


def test_run_job_scores_every_configuration_on_the_same_noisy_points() -> None:
    runs = lc.run_job("mixture2", 600, [0], [8.0], ablation=False)
    assert sorted(r["config"] for r in runs) == sorted(lc.CONFIGS)
    assert all(-1.0 <= r["ari"] <= 1.0 and 0.0 <= r["f_measure"] <= 1.0 for r in runs)
    again = lc.run_job("mixture2", 600, [0], [8.0], ablation=False)
    assert [r["ari"] for r in again] == [r["ari"] for r in runs]  # a seed fixes data, noise and starts


def _runs(medians: dict[tuple[str, float], dict[str, float]], seeds: range) -> list[dict[str, Any]]:
    return [{"dataset": ds, "n": 100, "epsilon": eps, "seed": s, "config": c, "ari": value + 0.001 * s}
            for (ds, eps), per_config in medians.items() for c, value in per_config.items() for s in seeds]


def test_the_default_wins_most_cells_on_the_tuning_seeds_only() -> None:
    base = dict.fromkeys(lc.CONFIGS, 0.5)
    tuning = _runs({("a", 1.0): {**base, "fcm-cube": 0.9}, ("a", 2.0): {**base, "fcm-cube": 0.9},
                    ("b", 1.0): {**base, "mnfcm-free": 0.9}}, range(10))
    # The reporting seeds favour another configuration everywhere: they must not decide.
    reporting = _runs({("a", 1.0): {**base, "kmeans-free": 0.99}, ("a", 2.0): {**base, "kmeans-free": 0.99},
                       ("b", 1.0): {**base, "kmeans-free": 0.99}}, range(100, 110))
    default, wins, cells = lc.choose_default(tuning + reporting, list(range(10)))
    assert (default, wins["fcm-cube"], wins["mnfcm-free"], wins["kmeans-free"], cells) == ("fcm-cube", 2, 1, 0, 3)


def test_equal_win_counts_go_to_the_higher_mean_median() -> None:
    base = dict.fromkeys(lc.CONFIGS, 0.5)
    runs = _runs({("a", 1.0): {**base, "mnfcm-free": 0.9}, ("b", 1.0): {**base, "fcm-cube": 0.6}}, range(10))
    assert lc.choose_default(runs, list(range(10)))[0] == "mnfcm-free"
    runs = _runs({("a", 1.0): {**base, "mnfcm-free": 0.6}, ("b", 1.0): {**base, "fcm-cube": 0.9}}, range(10))
    assert lc.choose_default(runs, list(range(10)))[0] == "fcm-cube"


def test_ties_win_the_cell_for_every_tied_configuration() -> None:
    assert lc.cell_winners({c: {0: 0.5, 1: 0.7} for c in lc.CONFIGS}) == list(lc.CONFIGS)


def test_tuning_and_reporting_seeds_must_differ() -> None:
    with pytest.raises(SystemExit):
        lc.main(["--tuning-seeds", "0-9", "--reporting-seeds", "9-18"])


def test_report_states_the_default_and_the_papers_claims(capsys: pytest.CaptureFixture[str]) -> None:
    base = dict.fromkeys(lc.CONFIGS, 0.5)
    runs = _runs({("mixture2", 1.0): {**base, "fcm-cube": 0.9, "mnfcm-cube": 0.8}}, range(10))
    runs += _runs({("mixture2", 1.0): {**base, "fcm-cube": 0.9, "mnfcm-cube": 0.8}}, range(100, 110))
    lc.report(runs, list(range(10)), list(range(100, 110)))
    out = capsys.readouterr().out
    assert "Default: **fcm-cube**." in out
    # mnFCM loses to FCM on every reporting seed (cube), wins against k-means; free: all equal.
    assert "| mixture2 | 100 | 1 | loses (-0.100) | no difference (+0.000) | wins (+0.300) |" in out


def test_a_box_case_leaves_a_margin_around_the_data() -> None:
    tight, _ = lc.unit_data(lc.DATASETS["mixture2"], 500, 0)
    wide, _ = lc.unit_data(lc.DATASETS["mixture2-box"], 500, 0)
    assert tight.min() == 0.0 and tight.max() == 1.0
    # margin 0.25 of the width per side: the data span the middle 1 / 1.5 of the domain.
    assert wide.min() == pytest.approx(0.25 / 1.5) and wide.max() == pytest.approx(1.25 / 1.5)
