"""The collector's layers: the production path does not import the simulation package, and only the
proto-facing modules import generated ``ldp.v1`` code.

The service, its handlers, the campaign engines, the estimators and storage must run without
:mod:`ldp_collector.simulation` (simulated devices, datasets, scores, numpy-drawn reports): each is
imported in a fresh interpreter and ``sys.modules`` is checked afterwards. The protobuf boundary
is a static check over the package's sources.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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


# -- the protobuf boundary -----------------------------------------------------------------------

_PACKAGE = Path(__file__).resolve().parents[2] / "packages" / "ldp-collector" / "src" / "ldp_collector"

#: The collector modules that may import generated ``ldp.v1`` code: the service, the collector's
#: serde, the operator's gRPC client and the command line's operator commands, whose flags build
#: the wire's configuration message and whose output prints the operator client's answers.
_PROTO_FACING = frozenset({"serde.py", "operator.py", "cli.py", "cli_args.py", "cli_output.py"})


def _imports_generated_code(source: str) -> bool:
    """``source`` imports ``ldp.v1`` (``from ldp.v1 import ...``, ``import ldp.v1...``, ``from ldp import v1``),
    at module level or inside a function."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module == "ldp.v1" or node.module.startswith("ldp.v1."):
                return True
            if node.module == "ldp" and any(alias.name == "v1" for alias in node.names):
                return True
        elif isinstance(node, ast.Import) and any(
                alias.name == "ldp.v1" or alias.name.startswith("ldp.v1.") for alias in node.names):
            return True
    return False


def _allowed(path: str) -> bool:
    return path.startswith("server/") or path in _PROTO_FACING


def test_only_the_proto_facing_modules_import_generated_code() -> None:
    """Kinds, campaigns, storage, estimation and the simulator work on :mod:`ldp_collector.model`:
    the modules importing ``ldp.v1`` are exactly the allowed ones, so the set cannot grow back silently
    (and a module that stopped importing it leaves the list)."""
    importers = {path.relative_to(_PACKAGE).as_posix() for path in _PACKAGE.rglob("*.py")
                 if _imports_generated_code(path.read_text(encoding="utf-8"))}
    assert importers, "no module of the package was seen importing ldp.v1: the check reads the wrong folder"
    assert sorted(p for p in importers if not _allowed(p)) == [], "these modules must go through ldp_collector.serde"
    listed = _PROTO_FACING - importers
    assert sorted(listed) == [], "these modules no longer import ldp.v1: drop them from the allowed lists"


@pytest.mark.parametrize(("source", "imports"), [
    ("from ldp.v1 import campaigns_pb2", True),
    ("import ldp.v1.campaigns_pb2 as c", True),
    ("from ldp import v1", True),
    ("def f():\n    from ldp.v1.service_pb2 import Campaign\n", True),
    ("from ldp_client.serde import spec_to_proto", False),
    ("from .serde import config_to_proto", False),
    ("import ldp_collector.model", False),
])
def test_the_boundary_check_sees_every_import_form(source: str, imports: bool) -> None:
    """Negative and positive controls of :func:`_imports_generated_code`."""
    assert _imports_generated_code(source) is imports
