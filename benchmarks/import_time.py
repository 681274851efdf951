#!/usr/bin/env python3
"""Cold import cost of the device SDK: median of N fresh interpreters.

Measures ``import ldp_client`` (what an app pays at start-up) and ``from ldp_client import Device``
followed by loading one GRR round's modules (what the first participation pays), and checks that
neither imports numpy, protobuf or grpc.

Usage: ``python benchmarks/import_time.py [--runs 10]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

SNIPPETS = {
    "import ldp_client": "import ldp_client",
    "first participation (Device + GRR + categorical)": (
        "from ldp_client import Device, RoundSpec\n"
        "from ldp_client.mechanisms import GRRParams\n"
        "from ldp_client.encoders import CategoricalEncoder"),
}

PROBE = """
import sys, time
t = time.perf_counter()
{code}
elapsed = (time.perf_counter() - t) * 1000
heavy = sorted(m for m in ("numpy", "google.protobuf", "grpc") if m in sys.modules)
print(elapsed, ",".join(heavy))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    ns = parser.parse_args(argv)
    results = {}
    for name, code in SNIPPETS.items():
        times, heavy = [], set()
        for _ in range(ns.runs):
            out = subprocess.run([sys.executable, "-c", PROBE.format(code=code)], check=True,
                                 capture_output=True, text=True).stdout.split()
            times.append(float(out[0]))
            heavy.update(x for x in (out[1:] or [""])[0].split(",") if x)
        results[name] = {"median_ms": round(statistics.median(times), 1), "min_ms": round(min(times), 1),
                         "max_ms": round(max(times), 1), "heavy_modules": sorted(heavy)}
    print(json.dumps(results, indent=2))
    return 1 if any(r["heavy_modules"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
