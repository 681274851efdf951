#!/usr/bin/env python3
"""Time ``simulate --data``'s file loading: a CSV against the same points as ``.npy``.

Writes an ``N x 6`` file (five normal features and an integer label in the last column, as
``numpy.savetxt`` writes them, with a header row) to a temporary directory, then loads it with
:func:`ldp_collector.simulation.datasets.load_file` ``--runs`` times, with and without
``label_column="last"``, and prints the median and worst seconds as JSON. The ``.npy`` row is the
floor a binary file gives.

Usage: ``python benchmarks/load_csv.py [--n 500000] [--runs 3]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ldp_collector.simulation.datasets import load_file


def _write(directory: Path, n: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    data = np.column_stack([rng.normal(size=(n, 5)), rng.integers(0, 8, size=n)])
    csv_path, npy_path = directory / "points.csv", directory / "points.npy"
    np.savetxt(csv_path, data, delimiter=",", header="a,b,c,d,e,label", comments="",
               fmt=["%.17g"] * 5 + ["%d"])
    np.save(npy_path, data)
    return csv_path, npy_path


def _time(path: Path, label_column: str | None, runs: int, n: int) -> dict[str, float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        x, _ = load_file(path, label_column)
        times.append(time.perf_counter() - start)
        if len(x) != n:
            raise SystemExit(f"{path}: loaded {len(x)} points, expected {n}")
    return {"median_s": round(statistics.median(times), 3), "worst_s": round(max(times), 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500_000, help="rows (default 500000)")
    parser.add_argument("--runs", type=int, default=3, help="loads per case (default 3)")
    ns = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="load-csv-") as tmp:
        csv_path, npy_path = _write(Path(tmp), ns.n)
        results = {
            "n": ns.n, "columns": 6, "runs": ns.runs, "csv_bytes": csv_path.stat().st_size,
            "csv, label last": _time(csv_path, "last", ns.runs, ns.n),
            "csv, no label": _time(csv_path, None, ns.runs, ns.n),
            "npy, label last": _time(npy_path, "last", ns.runs, ns.n),
        }
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
