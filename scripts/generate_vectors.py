#!/usr/bin/env python3
"""Generate the ``ldp.v1`` wire protocol's test vectors from the Python SDK.

The vectors pin, byte for byte, what ``docs/protocol.md`` specifies: encoder inputs and their
cells, keys or bits; hash and generator outputs; each mechanism's output for a given random-byte
stream; packed batches and their fields; error cases. They are versioned JSON files, one per area,
in ``proto/vectors/v<N>/`` (next to the ``.proto`` files, for implementations in any language), in
the style of the IETF privacy-preserving-measurement drafts' test vectors.

Each area is a module of ``scripts/vectors/`` (its name is the file's) with

* ``SECTION``: the section of ``docs/protocol.md`` the area's vectors pin, e.g. ``"§7"``;
* ``generate() -> list[dict]``: the vectors, each ``{"name": ..., "input": ..., "output": ...}``
  (JSON values only: bytes as lowercase hex strings, integers beyond 2^53 as decimal strings);
* ``verify(vector: dict) -> None``: recompute the vector's output from its input with the SDK,
  and, where the rule is invertible (a packed batch and its fields, a cell and its region), the
  input from the output; raise ``AssertionError`` on any difference.

``tests/client/test_vectors.py`` verifies every committed vector with the SDK and checks that
regenerating gives the committed files.

Usage::

    python scripts/generate_vectors.py            # write proto/vectors/v1/*.json
    python scripts/generate_vectors.py --check    # fail if a committed file differs
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VECTORS_VERSION = 1
OUT = ROOT / "proto" / "vectors" / f"v{VECTORS_VERSION}"

if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))


def areas() -> dict[str, ModuleType]:
    """The area modules of ``scripts/vectors/``, by name."""
    import vectors

    return {
        info.name: importlib.import_module(f"vectors.{info.name}")
        for info in pkgutil.iter_modules(vectors.__path__)
        if not info.name.startswith("_")
    }


def document(name: str, module: ModuleType) -> dict[str, Any]:
    """The JSON document of one area."""
    doc = (module.__doc__ or "").strip().splitlines()
    vectors = module.generate()
    names = [v["name"] for v in vectors]
    if len(set(names)) != len(names):
        raise SystemExit(f"generate_vectors: area {name!r} repeats a vector name")
    return {
        "protocol": "ldp.v1",
        "vectors_version": VECTORS_VERSION,
        "area": name,
        "section": f"docs/protocol.md {module.SECTION}",
        "description": doc[0] if doc else "",
        "vectors": vectors,
    }


def render(doc: dict[str, Any]) -> str:
    """The file's text: sorted keys, one-space indent, a final newline (stable across runs)."""
    return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a committed file differs")
    args = parser.parse_args(argv)
    wanted = {f"{name}.json": render(document(name, mod)) for name, mod in sorted(areas().items())}
    if args.check:
        have = {p.name for p in OUT.glob("*.json")}
        stale = sorted(have - wanted.keys())
        differ = sorted(n for n, text in wanted.items()
                        if not (OUT / n).exists() or (OUT / n).read_text() != text)
        if stale or differ:
            print(f"generate_vectors: out of date: {', '.join(differ + stale)}; "
                  "run python scripts/generate_vectors.py", file=sys.stderr)
            return 1
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for stale_file in OUT.glob("*.json"):
        if stale_file.name not in wanted:
            stale_file.unlink()
    for name, text in wanted.items():
        (OUT / name).write_text(text)
    print(f"generate_vectors: wrote {len(wanted)} files to {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
