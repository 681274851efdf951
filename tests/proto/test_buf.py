"""The protos under Buf: lint, the breaking-change check against the released wire, and proof that the
check catches what it is for.

``proto/baseline.binpb`` is the Buf image of the last released ``proto/`` (a committed file, so the
check needs no git tags and no network on a clean clone; ``proto/third_party/README.md`` says how to
renew it at a release). The Buf CLI is pinned by ``tools/buf/package-lock.json`` and installed with
``npm ci`` by the first test that needs it; without ``node`` and ``npm`` every test here is skipped
with a message saying so (``python -m tox -e buf``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools" / "buf"
BUF = TOOLS / "node_modules" / ".bin" / "buf"
BASELINE = ROOT / "proto" / "baseline.binpb"


@pytest.fixture(scope="session")
def buf() -> Path:
    """The pinned Buf CLI, installed from the committed lockfile on first use."""
    if not BUF.exists():
        npm = shutil.which("npm")
        if shutil.which("node") is None or npm is None:
            pytest.skip("node and npm are needed to install the Buf CLI (tools/buf): the proto lint and "
                        "breaking-change checks did not run")
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--prefix", str(TOOLS)], check=True)
    return BUF


def run(buf: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(buf), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_protos_pass_lint(buf: Path) -> None:
    result = run(buf, ROOT, "lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_protos_keep_the_released_wire(buf: Path) -> None:
    result = run(buf, ROOT, "breaking", "--against", str(BASELINE))
    assert result.returncode == 0, result.stdout + result.stderr


def copy_of_the_protos(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "proto", tmp_path / "proto", ignore=shutil.ignore_patterns("*.binpb"))
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    return tmp_path


def edit(path: Path, pattern: str, replacement: str) -> None:
    text = path.read_text(encoding="utf-8")
    changed, n = re.subn(pattern, replacement, text, count=1, flags=re.MULTILINE)
    assert n == 1, f"{pattern!r} not found in {path.name}"
    path.write_text(changed, encoding="utf-8")


SERVICE = Path("proto/ldp/v1/service.proto")
CAMPAIGNS = Path("proto/ldp/v1/campaigns.proto")

#: Changes that break released clients, each with the rules of the check (regex) that must name it.
BREAKING: dict[str, tuple[Callable[[Path], None], str]] = {
    # SubmitReportsRequest.request_id = 1 -> 9: old clients' request ids land in an unknown field.
    "renumbered field": (lambda root: edit(root / SERVICE, r"^  string request_id = 1;", "  string request_id = 9;"),
                         r"FIELD_NO_DELETE\w*|FIELD_SAME_NUMBER"),
    # Reserving the old number does not make a renumbering safe: the name still moved.
    "renumbered field, old number reserved": (
        lambda root: edit(root / SERVICE, r"^  string request_id = 1;", "  reserved 1;\n  string request_id = 9;"),
        r"FIELD_NO_DELETE_UNLESS_NAME_RESERVED|FIELD_SAME_NUMBER"),
    "deleted field": (lambda root: edit(root / SERVICE, r"^  bytes packed = 2;\n", ""), r"FIELD_NO_DELETE\w*"),
    "retyped field": (lambda root: edit(root / CAMPAIGNS, r"^  double epsilon = 4;", "  float epsilon = 4;"),
                      r"FIELD_SAME_TYPE|FIELD_WIRE_JSON_COMPATIBLE_TYPE"),
    "renumbered enum value": (lambda root: edit(root / SERVICE, r"^    REJECTED = 3;", "    REJECTED = 4;"),
                              r"ENUM_VALUE_\w+"),
}


@pytest.mark.parametrize("change", sorted(BREAKING))
def test_a_change_that_breaks_released_clients_fails_the_check(buf: Path, tmp_path: Path, change: str) -> None:
    apply, rules = BREAKING[change]
    root = copy_of_the_protos(tmp_path)
    apply(root)
    result = run(buf, root, "breaking", "--against", str(BASELINE), "--error-format=json")
    assert result.returncode != 0, f"the {change} passed the breaking check"
    found = {json.loads(line)["type"] for line in result.stdout.splitlines() if line.strip()}
    assert any(re.fullmatch(rules, rule) for rule in found), (found, result.stderr)


def test_growing_the_wire_passes_the_check(buf: Path, tmp_path: Path) -> None:
    # The negative control: a new field with a new number is what the wire allows.
    root = copy_of_the_protos(tmp_path)
    edit(root / SERVICE, r"^  bytes packed = 2;", "  bytes packed = 2;\n  uint32 retries = 3;")
    result = run(buf, root, "breaking", "--against", str(BASELINE))
    assert result.returncode == 0, result.stdout + result.stderr
