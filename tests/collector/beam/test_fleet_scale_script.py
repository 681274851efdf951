"""``benchmarks/fleet_scale.py`` at a small n: both engines run every case, and the state is bounded.

The accumulators' sizes are the claim behind the fleet-scale table (the Beam step holds its
accumulators, not the round): the same on both engines, and the same for twice the reports.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("apache_beam", reason="Apache Beam is not installed (python -m tox -e beam installs it)")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'ldp-collector[export]')")
pytest.importorskip("psutil", reason="the benchmark samples worker memory with psutil")

_SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "fleet_scale.py"
_CASES = "histogram-grr,histogram-olh,nettree"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fleet_scale", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fleet_scale"] = module
    spec.loader.exec_module(module)
    return module


def _rows(path: Path) -> dict[str, dict[str, object]]:
    return {row["case"]: row for row in json.loads(path.read_text())["rows"]}


def test_fleet_scale_runs_both_engines_with_bounded_accumulators(tmp_path: Path) -> None:
    fleet = _load()
    for n, name in ((1500, "small"), (3000, "large")):
        root = tmp_path / name
        assert fleet.main(["generate", "--reports", str(n), "--writers", "2", "--dir", str(root),
                           "--cases", _CASES]) == 0
        assert fleet.main(["run", "--engine", "in-process", "--dir", str(root), "--cases", _CASES,
                           "--json", str(tmp_path / f"{name}-in.json")]) == 0
    assert fleet.main(["run", "--engine", "beam", "--workers", "2", "--dir", str(tmp_path / "small"),
                       "--cases", _CASES, "--json", str(tmp_path / "small-beam.json")]) == 0
    small, large, beam = (_rows(tmp_path / f) for f in ("small-in.json", "large-in.json", "small-beam.json"))
    recorded = json.loads((tmp_path / "small-beam.json").read_text())["command"]
    assert str(tmp_path) not in " ".join(recorded) and "DIR" in recorded
    for case in _CASES.split(","):
        assert small[case]["reports"] == beam[case]["reports"] == 3000 and large[case]["reports"] == 6000
        passes = [p["pass"] for p in small[case]["passes"]]  # type: ignore[attr-defined]
        assert passes == [p["pass"] for p in beam[case]["passes"]]  # type: ignore[attr-defined]
        assert passes[0] == "counts" and (len(passes) == 2) == (case != "histogram-grr")
        # Bounded: the state does not grow with n, and Beam's equals the in-process one.
        assert small[case]["accumulator_bytes"] == large[case]["accumulator_bytes"] == beam[case]["accumulator_bytes"]
        assert 0 < int(small[case]["accumulator_bytes"]) < 64 * 1024  # type: ignore[call-overload]
    assert int(beam["nettree"]["worker_processes"]) > 0  # type: ignore[call-overload]
    lines = fleet.table([tmp_path / "small-in.json", tmp_path / "small-beam.json"]).splitlines()
    assert len(lines) == 2 + 2 * len(_CASES.split(","))
    assert lines[2].startswith("| histogram-grr | in-process | counts |")
    assert any(line.startswith("| nettree | Beam, 2 worker(s) | counts + vector sums |") for line in lines)
