"""``benchmarks/simulate_speed.py``: one row per kind and n, and the phase split of the same runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import simulate_speed


def test_prints_the_runs_and_their_phase_split(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert simulate_speed.main(["--ns", "3000", "--kinds", "laplace", "--mode", "vector", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| laplace | 3e+03 |")]
    assert len(rows) == 2, out  # the run, then its phases
    run, phases = (row.strip("|").split("|") for row in rows)
    assert run[7].strip() == "vector" and float(run[3]) > 0 and float(run[5]) > 0  # CPU s, peak GiB
    # Every phase as "wall / CPU" seconds, the campaign's and the command's own.
    assert len(phases) == 2 + len(simulate_speed.PHASES)
    assert all(len(cell.split(" / ")) == 2 and min(map(float, cell.split(" / "))) >= 0 for cell in phases[2:])
    assert out.startswith("load average ") and "\nload average " in out
    kept = json.loads((tmp_path / "laplace-3000-7.json").read_text())  # the run's whole output
    assert kept["parameters"]["n"] == 3000 and set(kept["stats"]["phase_cpu_s"]) == set(simulate_speed.PHASES)
