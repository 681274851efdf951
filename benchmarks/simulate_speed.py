#!/usr/bin/env python3
"""Wall time of ``ldp-collector simulate`` per center kind and population size.

Runs, for every kind and n, the command a user runs (a fresh process, the in-process collector, the
default ``auto`` mode: ``vector`` above 50 000 devices) on the public mixture,

    ldp-collector simulate --kind KIND --dataset mixture --d 5 --k 6 --n N --seed SEED --json --quiet

and prints one row per kind and n: the process's wall time and CPU time (user + system; on a shared
machine the wall time mostly measures the other jobs), its peak resident memory, the campaign's own
wall time (simulation, ingestion and the server steps, without the evaluation against non-private
k-means), the mode used, any round that fell back to ``direct`` mode, and the ARI; then a second
table of where the time went, wall / CPU seconds of each phase (the output's ``stats.phase_s`` and
``stats.phase_cpu_s``): ``data`` (the dataset's draw), ``devices`` (the population's setup),
``reports`` (the devices' report draws), ``ingest`` (validation and storage), ``steps`` (the server
steps), ``other`` (the rest of the campaign) and ``evaluation`` (the scores, with the reference
non-private k-means). Several seeds give the median and the worst (slowest) seed.

Usage: ``OPENBLAS_NUM_THREADS=1 python benchmarks/simulate_speed.py [--ns 100000,1000000]
[--kinds nettree,...] [--seeds 7] [--mode auto] [--out DIR]``; add ``10000000`` to ``--ns`` for the 1e7 row
(minutes per kind). The runs inherit the environment: on a shared box set ``OPENBLAS_NUM_THREADS=1``,
as for the other benchmarks (the estimators' small matrix products gain nothing from BLAS threads,
and contended threads spin: at 1e5 on a machine with load 5, bitvector took 27 CPU s with the
default threads and 7 with one; the estimator's output on a fixed input is the same bit for bit
either way). The load average is printed before and
after the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KINDS = ("nettree", "stemmer", "bitvector", "laplace", "ldp_kmeans")
#: The phases of the output's ``stats.phase_s``, in the order a simulation runs them.
PHASES = ("data", "devices", "reports", "ingest", "steps", "other", "evaluation")


def _run_child(command: list[str]) -> tuple[int, str, str, float, float]:
    """Run ``command``: its exit code, stdout, stderr, CPU seconds (user + system; a busy machine inflates
    wall time, not this) and peak resident memory in GiB, from the child's own resource usage."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(command, stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        out.seek(0)
        err.seek(0)
        # ru_maxrss is in kilobytes on Linux.
        return (child.returncode, out.read().decode(), err.read().decode(), usage.ru_utime + usage.ru_stime,
                usage.ru_maxrss / 2**20)


def run(kind: str, n: int, seed: int, mode: str, out_dir: Path | None = None) -> dict[str, Any]:
    """One ``simulate`` run in a fresh interpreter: its timings, memory, mode, fallbacks, phases and ARI."""
    command = [sys.executable, "-m", "ldp_collector.cli", "simulate", "--kind", kind, "--dataset", "mixture",
               "--d", "5", "--k", "6", "--n", str(n), "--seed", str(seed), "--mode", mode, "--json", "--quiet"]
    started = time.perf_counter()
    code, stdout, stderr, cpu, peak_gib = _run_child(command)
    wall = time.perf_counter() - started
    if code != 0:
        return {"kind": kind, "n": n, "seed": seed, "error": stderr.strip().splitlines()[-1:]}
    out = json.loads(stdout)
    if out_dir is not None:  # the whole output, to compare the results of two commits' seeded runs
        (out_dir / f"{kind}-{n}-{seed}.json").write_text(stdout)
    return {"kind": kind, "n": n, "seed": seed, "wall_s": wall, "cpu_s": cpu, "campaign_s": out["wall_time_s"],
            "peak_gib": peak_gib, "mode": out["stats"]["mode"], "fallbacks": out["stats"]["fallbacks"],
            # A commit from before the phase split has none (its phases print as "-").
            "phase_s": out["stats"].get("phase_s", {}), "phase_cpu_s": out["stats"].get("phase_cpu_s", {}),
            "ari": out.get("clustering", {}).get("ari")}


def _phase_table(rows: list[dict[str, Any]]) -> None:
    """The phase split: per kind and n, the median wall / CPU seconds of each phase over the seeds."""
    print("\n| kind | n | " + " | ".join(f"{phase} s (wall / CPU)" for phase in PHASES) + " |")
    print("|---|---|" + "---|" * len(PHASES))
    for row in rows:
        print(f"| {row['kind']} | {row['n']:.0e} | "
              + " | ".join(f"{_seconds(row['phase_s'].get(phase))} / {_seconds(row['phase_cpu_s'].get(phase))}"
                           for phase in PHASES) + " |")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", default="100000,1000000", help="comma-separated population sizes")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds")
    parser.add_argument("--seeds", default="7", help="comma-separated seeds")
    parser.add_argument("--mode", default="auto", choices=("auto", "device", "direct", "vector"))
    parser.add_argument("--out", type=Path, help="directory to keep each run's JSON output in (KIND-N-SEED.json)")
    ns = parser.parse_args(argv)
    seeds = [int(s) for s in ns.seeds.split(",")]
    if ns.out is not None:
        ns.out.mkdir(parents=True, exist_ok=True)
    print(f"load average {_load()}; OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}\n")
    print("| kind | n | wall s (median) | wall s (worst seed) | CPU s (median) | peak GiB (max) | campaign s (median) | "
          "mode | fallbacks | ARI (median) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    failed = False
    phases: list[dict[str, Any]] = []
    for n in (int(v) for v in ns.ns.split(",")):
        for kind in ns.kinds.split(","):
            rows = [run(kind, n, seed, ns.mode, ns.out) for seed in seeds]
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
                  f"{statistics.median(r['cpu_s'] for r in good):.1f} | {max(r['peak_gib'] for r in good):.2f} | "
                  f"{statistics.median(r['campaign_s'] for r in good):.1f} | {good[0]['mode']} | {fallbacks} | "
                  f"{ari} |", flush=True)
            phases.append({"kind": kind, "n": n, **{clock: {
                phase: statistics.median(r[clock][phase] for r in good) for phase in PHASES
                if all(phase in r[clock] for r in good)} for clock in ("phase_s", "phase_cpu_s")}})
    _phase_table(phases)
    print(f"\nload average {_load()}")
    return 1 if failed else 0


def _load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


if __name__ == "__main__":
    raise SystemExit(main())
