"""The SDK against the wire protocol's committed test vectors (``proto/vectors/``).

Both ways: every committed vector is recomputed from its input with the SDK (and, where the rule
is invertible, its input from its output), and regenerating the vectors from the SDK gives the
committed files, so neither the SDK nor the vectors can drift alone.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_vectors", ROOT / "scripts" / "generate_vectors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("generate_vectors", module)
    spec.loader.exec_module(module)
    return module


GEN = _generator()
AREAS = GEN.areas()
FILES = sorted(GEN.OUT.glob("*.json"))


def _committed() -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for path in FILES:
        doc = json.loads(path.read_text())
        cases += [(doc["area"], v) for v in doc["vectors"]]
    return cases


def test_every_area_has_a_committed_file() -> None:
    assert sorted(f"{name}.json" for name in AREAS) == [p.name for p in FILES]


@pytest.mark.parametrize(("area", "vector"), _committed(),
                         ids=[f"{a}/{v['name']}" for a, v in _committed()])
def test_sdk_reproduces_committed_vector(area: str, vector: dict[str, Any]) -> None:
    AREAS[area].verify(vector)


@pytest.mark.parametrize("name", sorted(AREAS))
def test_regenerating_gives_the_committed_file(name: str) -> None:
    path = GEN.OUT / f"{name}.json"
    assert path.read_text() == GEN.render(GEN.document(name, AREAS[name])), (
        f"{path.name} is out of date: run python scripts/generate_vectors.py")


def test_a_changed_output_fails_verification() -> None:
    area, vector = _committed()[0]
    bad = json.loads(json.dumps(vector))
    values = bad["output"][next(iter(bad["output"]))]
    bad["output"][next(iter(bad["output"]))] = values[::-1] if isinstance(values, list) else values
    if bad == vector:  # a palindrome or a scalar: perturb differently
        bad["output"] = {"tampered": True}
    with pytest.raises((AssertionError, KeyError)):
        AREAS[area].verify(bad)
