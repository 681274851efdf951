#!/usr/bin/env python3
"""Generate the Python code of the ``ldp.v1`` API from ``proto/`` into the ``ldp-proto`` package.

This script is the only producer of generated code. It pins its generators (see
``scripts/proto-requirements.txt``) and refuses to run with other versions, so regenerating on any
machine gives byte-identical files.

Usage::

    python scripts/generate_proto.py            # write packages/ldp-proto/src/ldp/v1/
    python scripts/generate_proto.py --check    # regenerate in a temporary folder, fail on any diff
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.metadata
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_SRC = ROOT / "packages" / "ldp-proto" / "src"
GENERATED = PACKAGE_SRC / "ldp" / "v1"
PINS = ROOT / "scripts" / "proto-requirements.txt"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def _check_pins() -> None:
    for line in PINS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, version = line.split("==")
        have = importlib.metadata.version(name)
        if have != version:
            sys.exit(f"generate_proto: {name}=={version} is pinned, found {have}; "
                     f"run: pip install -r {PINS.relative_to(ROOT)}")


def _generate(out: Path) -> None:
    from grpc_tools import protoc  # imported late: only this script needs it

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "ldp").rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    mypy_plugin = shutil.which("protoc-gen-mypy")
    mypy_grpc_plugin = shutil.which("protoc-gen-mypy_grpc")
    if not mypy_plugin or not mypy_grpc_plugin:
        sys.exit("generate_proto: protoc-gen-mypy not found on PATH (pip install mypy-protobuf)")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--plugin=protoc-gen-mypy={mypy_plugin}",
        f"--plugin=protoc-gen-mypy_grpc={mypy_grpc_plugin}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out=quiet:{out}",
        f"--mypy_grpc_out=quiet:{out}",
        *protos,
    ]
    if protoc.main(args) != 0:
        sys.exit("generate_proto: protoc failed")


def _generated_files(folder: Path) -> list[str]:
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if regenerating changes anything")
    ns = parser.parse_args()
    _check_pins()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        _generate(out)
        fresh = out / "ldp" / "v1"
        if ns.check:
            new, old = _generated_files(fresh), _generated_files(GENERATED)
            problems = [f"missing or extra files: {sorted(set(new) ^ set(old))}"] if new != old else []
            problems += [f"differs: {name}" for name in new
                         if name in old and not filecmp.cmp(fresh / name, GENERATED / name, shallow=False)]
            if problems:
                print("generated code is stale; run: python scripts/generate_proto.py", file=sys.stderr)
                print("\n".join(problems), file=sys.stderr)
                return 1
            print(f"generated code is up to date ({len(new)} files)")
            return 0
        for name in _generated_files(GENERATED):
            (GENERATED / name).unlink()
        for name in _generated_files(fresh):
            shutil.copy2(fresh / name, GENERATED / name)
        print(f"wrote {len(_generated_files(fresh))} files to {GENERATED.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
