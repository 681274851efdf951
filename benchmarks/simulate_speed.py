#!/usr/bin/env python3
"""Wall time of ``ldp-collector simulate`` per center kind and population size.

Runs, for every kind and n, the command a user runs (a fresh process, the in-process collector, the
default ``auto`` mode: ``vector`` above 50 000 devices) on the public mixture,

    ldp-collector simulate --kind KIND --dataset mixture --d 5 --k 6 --n N --seed SEED --json --quiet

and prints one row per run: the process's wall time and CPU time (user + system; on a shared
machine the wall time mostly measures the other jobs), the campaign's own wall time (simulation,
ingestion and the server steps, without the evaluation against non-private k-means), the mode used,
any round that fell back to ``direct`` mode, and the ARI. Several seeds give the median and the
worst (slowest) seed.

Usage: ``python benchmarks/simulate_speed.py [--ns 100000,1000000] [--kinds nettree,...]
[--seeds 7] [--mode auto]``; add ``10000000`` to ``--ns`` for the 1e7 row (minutes per kind).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

KINDS = ("nettree", "stemmer", "bitvector", "laplace", "ldp_kmeans")


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes (a busy machine inflates wall time, not this)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(kind: str, n: int, seed: int, mode: str) -> dict[str, Any]:
    """One ``simulate`` run in a fresh interpreter: its timings, mode, fallbacks and ARI."""
    command = [sys.executable, "-m", "ldp_collector.cli", "simulate", "--kind", kind, "--dataset", "mixture",
               "--d", "5", "--k", "6", "--n", str(n), "--seed", str(seed), "--mode", mode, "--json", "--quiet"]
    started, cpu_before = time.perf_counter(), _children_cpu()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - started, _children_cpu() - cpu_before
    if done.returncode != 0:
        return {"kind": kind, "n": n, "seed": seed, "error": done.stderr.strip().splitlines()[-1:]}
    out = json.loads(done.stdout)
    return {"kind": kind, "n": n, "seed": seed, "wall_s": wall, "cpu_s": cpu, "campaign_s": out["wall_time_s"],
            "mode": out["stats"]["mode"], "fallbacks": out["stats"]["fallbacks"],
            "ari": out.get("clustering", {}).get("ari")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", default="100000,1000000", help="comma-separated population sizes")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds")
    parser.add_argument("--seeds", default="7", help="comma-separated seeds")
    parser.add_argument("--mode", default="auto", choices=("auto", "device", "direct", "vector"))
    ns = parser.parse_args(argv)
    seeds = [int(s) for s in ns.seeds.split(",")]
    print("| kind | n | wall s (median) | wall s (worst seed) | CPU s (median) | campaign s (median) | mode | "
          "fallbacks | ARI (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    failed = False
    for n in (int(v) for v in ns.ns.split(",")):
        for kind in ns.kinds.split(","):
            rows = [run(kind, n, seed, ns.mode) for seed in seeds]
            good = [r for r in rows if "error" not in r]
            if len(good) < len(rows):
                failed = True
                print(f"| {kind} | {n} | failed: {[r.get('error') for r in rows if 'error' in r]} |||||")
                continue
            walls = [r["wall_s"] for r in good]
            aris = [r["ari"] for r in good if r["ari"] is not None]
            ari = f"{statistics.median(aris):.3f}" if aris else "-"
            fallbacks = sum(len(r["fallbacks"]) for r in good)
            print(f"| {kind} | {n:.0e} | {statistics.median(walls):.1f} | {max(walls):.1f} | "
                  f"{statistics.median(r['cpu_s'] for r in good):.1f} | "
                  f"{statistics.median(r['campaign_s'] for r in good):.1f} | {good[0]['mode']} | {fallbacks} | "
                  f"{ari} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
