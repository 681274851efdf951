"""Every program in ``examples/`` runs as CI runs it: ``python examples/<name>.py`` in a subprocess.

Each must exit 0 well within 30 seconds and tell its story (the checks below look for the key
lines, not the exact numbers, which depend on the randomness of the run).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
#: Generous against slow CI machines; each example takes a few seconds on a 2-core box.
TIMEOUT_S = 120


def run_example(name: str, *args: str) -> tuple[str, float]:
    paths = [str(REPO / "packages" / p / "src") for p in ("ldp-client", "ldp-proto", "ldp-collector")]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("LDP_OPERATOR_TOKEN", None)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0, f"{name} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout, elapsed


def test_every_example_is_covered() -> None:
    assert {p.stem for p in EXAMPLES.glob("*.py")} >= {"edge_app", "campaign_operator", "simulate_devices",
                                                       "grid_clustering"}


def test_edge_app() -> None:
    out, elapsed = run_example("edge_app")
    for line in ("1. collector started on 127.0.0.1:", "2. operator created campaign battery-health-",
                 "3. the car fetched round 1", "4. the collector went down", "send failed:",
                 "the report is still in the outbox: 1 pending, same id True",
                 "5. the collector restarted", "the app reopened its state: 1 report(s) pending",
                 "drained: accepted 1, duplicates 0, rejected 0; outbox now 0",
                 "result FINISHED: 5,001 reports", "my bucket 7: estimated"):
        assert line in out, f"missing {line!r} in:\n{out}"
    assert elapsed < TIMEOUT_S


def test_operator() -> None:
    out, elapsed = run_example("campaign_operator", "--scooters", "8000")
    for line in ("2. created campaign", "3. watching the campaign", "COLLECTING round 1: 8,000 reports",
                 "4. all reports in: closed round 1", "FINISHED", "5. estimates of round 1 from 8,000 reports",
                 "intervals cover the true count"):
        assert line in out, f"missing {line!r} in:\n{out}"
    assert elapsed < TIMEOUT_S


def test_grid_clustering() -> None:
    out, elapsed = run_example("grid_clustering", "--n", "3000")
    for line in ("1. collector at 127.0.0.1:", "2. created campaign", "grid (iterative), epsilon 6 per rider",
                 "closes each round at 3,000 reports", "round 1: groups [0]: GridTreeEncoder",
                 "round 2: groups [0]: CellListEncoder", "round 3: groups [0]: CellListEncoder",
                 "3,000 reports accepted, 0 rejected", "the round closed itself", "campaign FINISHED: ",
                 "labels itself from the published clustering: cluster", "same from the kept model: True",
                 "epsilon spent before 6, after 6", "ARI ",
                 "every rider's ledger: epsilon spent in [6, 6] (budget 6); reports still in outboxes: 0"):
        assert line in out, f"missing {line!r} in:\n{out}"
    assert "round 4" not in out  # split, one merge/split round: calibrate, iterate, aggregate
    assert elapsed < 20


def test_simulate_devices() -> None:
    out, elapsed = run_example("simulate_devices", "--devices", "5000")
    for line in ("asking again returns the stored report (never re-sampled): True",
                 "ledger: campaign tiles-2026 round 1 group 0 epsilon 1", "AlreadyReportedError",
                 "PolicyViolationError", "5,000 simulated devices", " bytes packed, ",
                 "estimated tile counts (ldp_collector.estimation", "tiles within 3 standard errors"):
        assert line in out, f"missing {line!r} in:\n{out}"
    assert elapsed < TIMEOUT_S


def test_simulate_devices_without_the_collector(tmp_path: Path) -> None:
    """The SDK-only fallback estimator: hide ldp_collector (and numpy) behind a failing import hook."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import sys\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('ldp_collector', 'numpy'):\n"
        "            raise ImportError(f'{name} hidden by the test')\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Block())\n")
    paths = [str(tmp_path)] + [str(REPO / "packages" / p / "src") for p in ("ldp-client", "ldp-proto")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    proc = subprocess.run([sys.executable, str(EXAMPLES / "simulate_devices.py"), "--devices", "2000"], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert "estimated tile counts (pure Python" in proc.stdout
