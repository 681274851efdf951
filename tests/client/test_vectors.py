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


#: Relative tolerance for floats when regenerating: a few areas go through the platform's
#: ``log``, ``cos`` and ``lgamma`` (docs/protocol.md §12 allows 4 ulps there), so another C
#: library may move their last bits; every integer, byte string and name must match exactly.
REGENERATE_RTOL = 2.0**-40


def _same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), where
        assert a == b or abs(a - b) <= REGENERATE_RTOL * max(abs(a), abs(b)), f"{where}: {a} != {b}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.parametrize("name", sorted(AREAS))
def test_regenerating_gives_the_committed_file(name: str) -> None:
    path = GEN.OUT / f"{name}.json"
    committed = json.loads(path.read_text())
    regenerated = json.loads(GEN.render(GEN.document(name, AREAS[name])))
    try:
        _same(committed, regenerated, name)
    except AssertionError as exc:
        raise AssertionError(f"{path.name} is out of date ({exc}): run python scripts/generate_vectors.py") from None


def test_regeneration_tolerates_only_last_bits_of_floats() -> None:
    _same({"x": [1.0, 2]}, {"x": [1.0 + 2.0**-50, 2]}, "ok")
    for bad in ({"x": [1.0 + 2.0**-30, 2]}, {"x": [1.0, 3]}, {"y": [1.0, 2]}):
        with pytest.raises(AssertionError):
            _same({"x": [1.0, 2]}, bad, "bad")


def test_a_changed_output_fails_verification() -> None:
    area, vector = _committed()[0]
    bad = json.loads(json.dumps(vector))
    values = bad["output"][next(iter(bad["output"]))]
    bad["output"][next(iter(bad["output"]))] = values[::-1] if isinstance(values, list) else values
    if bad == vector:  # a palindrome or a scalar: perturb differently
        bad["output"] = {"tampered": True}
    with pytest.raises((AssertionError, KeyError)):
        AREAS[area].verify(bad)
