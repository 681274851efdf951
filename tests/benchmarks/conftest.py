"""Make ``benchmarks/`` importable (the ``harness`` package) and skip cleanly without its extras."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

pytest.importorskip("sklearn", reason="the benchmark harness needs scikit-learn (pip install scikit-learn)")
pytest.importorskip("scipy", reason="the benchmark harness needs scipy (installed with scikit-learn)")
