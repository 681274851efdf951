"""The production path does not import the simulation package.

The service, its handlers, the campaign engines, the estimators and storage must run without
:mod:`ldp_collector.simulation` (simulated devices, datasets, scores, numpy-drawn reports): each is
imported in a fresh interpreter and ``sys.modules`` is checked afterwards.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

PRODUCTION = ("ldp_collector.core", "ldp_collector.kinds", "ldp_collector.server.lifecycle", "ldp_collector.estimation",
              "ldp_collector.storage", "ldp_collector.operator")


@pytest.mark.parametrize("module", PRODUCTION)
def test_production_modules_do_not_import_the_simulation_package(module: str) -> None:
    code = (f"import sys, importlib; importlib.import_module({module!r}); "
            "print(sorted(m for m in sys.modules if m.startswith('ldp_collector.simulation')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", f"{module} imports {out.stdout.strip()}"


def test_the_check_sees_the_simulation_package() -> None:
    """Negative control: importing the simulator is seen."""
    code = ("import sys, ldp_collector.simulation.population; "
            "print(sorted(m for m in sys.modules if m.startswith('ldp_collector.simulation')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "ldp_collector.simulation.population" in out.stdout
