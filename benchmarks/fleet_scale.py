#!/usr/bin/env python3
"""Fleet-scale round steps: 10^7 reports in-process and on Beam's DirectRunner, per kind.

Two commands, run one configuration per process so each peak memory is that configuration's own:

``generate``
    Lands a round of W x N reports per case straight into Parquet files (``ParquetLanding``, the
    landing path: no SQL store), as W landing writers of N reports each (``writer-<i>``
    directories: a round landed by several writers, which the step reads like one export). The
    N reports are drawn with the vectorized simulator's report draws (``simulation.vector``): for
    each case the first round of a real campaign, reports spread evenly over its groups, every
    component's payload drawn from its mechanism. Landing costs tens of microseconds a report
    in Python, so writer 0 is drawn and the other writers' directories are hard links to its
    files: the round's reports repeat W times, which costs the step exactly what W distinct
    draws would (the step does not deduplicate across writers).
``run --engine in-process | beam [--workers W]``
    The round's server step over those files, through the step's own report accumulators:
    the count accumulators of every component (``RoundCounts``, what ``accumulate_rounds`` gives
    the engine) and, where the kind reads raw reports, its second pass (local-hashing support
    counts over every category, ``SupportCounts``; per-bucket vector sums, ``BucketSumAccumulator``).
    ``in-process`` streams the files through them in one process, file by file as a Beam worker
    reads them (``RoundReports.combine`` streams the store the same way); ``beam`` runs each pass as a pipeline
    (``combine_rounds``) on the DirectRunner in multi-process mode with W workers.

Printed and written (``--json``) per case: reports, wall time, reports/s and CPU time (this
process and its finished children: Beam's workers) of each pass and of the step, peak RSS of the step's process (``ru_maxrss``) and, for Beam, of every worker process
(sampled every 0.2 s with psutil), and the accumulator's size in bytes.

Usage::

    nice python benchmarks/fleet_scale.py generate --reports 1000000 --writers 10 --dir /data/fleet
    nice python benchmarks/fleet_scale.py run --dir /data/fleet --engine in-process --json in.json
    nice python benchmarks/fleet_scale.py run --dir /data/fleet --engine beam --workers 1 --json beam1.json
    nice python benchmarks/fleet_scale.py run --dir /data/fleet --engine beam --workers 2 --json beam2.json
    python benchmarks/fleet_scale.py table in.json beam1.json beam2.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import psutil

from ldp.v1 import campaigns_pb2
from ldp_client.mechanisms import BucketizedVectorParams, LocalHashingParams
from ldp_client.payload import payload_to_wire
from ldp_client.spec import RoundSpec
from ldp_collector.campaigns import make_engine
from ldp_collector.columnar import ParquetLanding, read_file, read_manifest
from ldp_collector.estimation.accumulators import RoundCounts, SupportCounts, component_params_from_spec
from ldp_collector.estimation.report_accumulator import ReportAccumulator, combine_batches
from ldp_collector.estimation.vector_sum import BucketSumAccumulator
from ldp_collector.serde import config_from_proto, kind_number
from ldp_collector.simulation.vector import draw_payloads, encode_points, unsupported
from ldp_collector.storage.base import StoredReport

#: case -> (kind, oracle or None, categories or None): histogram oracles over 1 024 categories (OUE over
#: 256 to keep its files at 32 bytes a report), the grid's first round, and net tree's first round
#: (node oracle plus bucketized vector: the vector-sum kind).
CASES: dict[str, tuple[str, int | None, int | None]] = {
    "histogram-grr": ("histogram", campaigns_pb2.GRR, 1024),
    "histogram-oue": ("histogram", campaigns_pb2.OUE, 256),
    "histogram-olh": ("histogram", campaigns_pb2.OLH, 1024),
    "grid": ("grid", None, None),
    "nettree": ("nettree", None, None),
}
#: Buckets the vector-sum pass sums into (net tree's round 1 asks for its leaves: tens to hundreds).
VECTOR_BUCKETS = 256
_CHUNK = 100_000


def _config(case: str) -> campaigns_pb2.CampaignConfig:
    kind, oracle, categories = CASES[case]
    config = campaigns_pb2.CampaignConfig(kind=kind_number(kind), epsilon=2.0, campaign_id=f"fleet-{case}")
    if categories is None:
        config.domain.numeric.lower.extend([0.0, 0.0])
        config.domain.numeric.upper.extend([1.0, 1.0])
    else:
        config.domain.categorical_size = categories
    params = getattr(config, kind)
    params.SetInParent()
    if oracle is not None:
        params.oracle = oracle
    if "k" in params.DESCRIPTOR.fields_by_name:
        params.k = 4
    return config


def _spec(case: str) -> RoundSpec:
    return make_engine(config_from_proto(_config(case))).first_round().spec


def generate(case: str, n: int, writers: int, root: Path, seed: int) -> dict[str, Any]:
    """Land ``n`` reports of ``case``'s first round in ``root/writer-0``, linked as ``writers`` writers."""
    directory = root / "writer-0"
    spec = _spec(case)
    tasks = [(group, task) for task in spec.tasks for group in task.groups]
    categories = CASES[case][2]
    for _, task in tasks:
        for component in task.components:
            # Categorical values are drawn as indices directly: only numeric encoders must be array-encodable.
            reason = unsupported(component) if categories is None else None
            if reason:
                raise SystemExit(f"{case}: {component.mechanism.KIND} cannot be drawn in vector mode: {reason}")
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    with ParquetLanding(directory, spec) as landing:
        for start in range(0, n, _CHUNK):
            size = min(_CHUNK, n - start)
            which = rng.integers(0, len(tasks), size=size)
            for t, (group, task) in enumerate(tasks):
                rows = np.flatnonzero(which == t)
                if not rows.size:
                    continue
                points = rng.random((rows.size, 2))
                columns = []
                for component in task.components:
                    values = (rng.integers(0, categories, size=rows.size) if categories is not None
                              else encode_points(component.encoder, points))
                    columns.append(draw_payloads(component, values, rng))
                landing.add(StoredReport(report_id=int(start + i).to_bytes(16, "big"), campaign_id=spec.campaign_id,
                                         round=spec.round, group=group,
                                         payloads=msgpack.packb([payload_to_wire(c[j]) for c in columns],
                                                                use_bin_type=True))
                            for j, i in enumerate(rows.tolist()))
    for i in range(1, writers):
        copy = root / f"writer-{i}"
        copy.mkdir(parents=True)
        for path in directory.rglob("*"):
            target = copy / path.relative_to(directory)
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                os.link(path, target)
    return {"case": case, "reports": n * writers, "writers": writers, "generate_s": time.perf_counter() - started}


def step_accumulators(spec: RoundSpec) -> list[tuple[str, ReportAccumulator[Any]]]:
    """The step's passes over the raw reports: the count accumulators, then the kind's own pass."""
    by_group = component_params_from_spec(spec)
    passes: list[tuple[str, ReportAccumulator[Any]]] = [("counts", RoundCounts(by_group))]
    for group, mechanisms in sorted(by_group.items()):
        for index, mechanism in enumerate(mechanisms):
            if isinstance(mechanism, LocalHashingParams) and mechanism.domain_size <= 1 << 16:
                candidates = np.arange(mechanism.domain_size, dtype=np.int64)
                passes.append((f"support {group}:{index}", SupportCounts(by_group, f"{group}:{index}", candidates)))
    vector_keys = sorted(f"{g}:{i}" for g, ms in by_group.items() for i, m in enumerate(ms)
                         if isinstance(m, BucketizedVectorParams))
    if vector_keys:
        group, index = (int(part) for part in vector_keys[0].split(":"))
        params = by_group[group][index]
        assert isinstance(params, BucketizedVectorParams)
        passes.append(("vector sums", BucketSumAccumulator(params, np.arange(VECTOR_BUCKETS, dtype=np.uint64),
                                                           by_group, vector_keys)))
    return passes


class _WorkerPeaks:
    """Peak RSS of every descendant process (Beam's workers), sampled until stopped."""

    def __init__(self, interval: float = 0.2) -> None:
        self.peaks: dict[int, int] = {}
        #: CPU seconds (user + system) of each descendant at its last sample: a check on
        #: RUSAGE_CHILDREN, which counts only the children that were waited for.
        self.cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval,), daemon=True)

    def _sample(self, interval: float) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            for child in me.children(recursive=True):
                try:
                    rss = child.memory_info().rss
                    times = child.cpu_times()
                except psutil.Error:
                    continue
                self.peaks[child.pid] = max(self.peaks.get(child.pid, 0), rss)
                self.cpu[child.pid] = times.user + times.system
            self._stop.wait(interval)

    def __enter__(self) -> _WorkerPeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _file_batches(path: Path) -> Iterator[list[StoredReport]]:
    for rows in read_file(path):  # the batch size the Beam workers read with (READ_BATCH_ROWS)
        yield [row.report for row in rows]


def _cpu_seconds() -> float:
    """User + system CPU of this process and its finished children (Beam's workers): on a shared
    machine the wall time mostly measures the other jobs, this does not."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _peak_rss() -> int:
    """This process's peak RSS in bytes (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_case(case: str, root: Path, engine: str, workers: int, work_dir: Path) -> dict[str, Any]:
    directories = sorted(root.glob("writer-*"))
    manifests = [read_manifest(d) for d in directories]
    if not manifests or any(m is None or not m.complete for m in manifests):
        raise SystemExit(f"{root}: no complete landing (run generate first)")
    spec = manifests[0].round_spec  # type: ignore[union-attr]
    reports = sum(m.reports for m in manifests)  # type: ignore[union-attr]
    paths = [d / f["path"] for d, m in zip(directories, manifests) for f in m.files]  # type: ignore[union-attr]
    files = len(paths)
    passes = []
    combine: Callable[[ReportAccumulator[Any]], ReportAccumulator[Any]]
    if engine == "in-process":
        def combine(acc: ReportAccumulator[Any]) -> ReportAccumulator[Any]:
            # File by file, as each Beam worker reads (the accumulators do not depend on the order but
            # at a float sum's last bits; report_batches' seq-ordered merge costs a heap step a row).
            return combine_batches(acc, (batch for path in paths for batch in _file_batches(path)))
    else:
        from ldp_collector.beam import combine_rounds, pipeline_args

        args = pipeline_args(None, ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"])

        def combine(acc: ReportAccumulator[Any]) -> ReportAccumulator[Any]:
            return combine_rounds({"round": (directories, acc)}, args, work_dir=work_dir)["round"]
    total = total_cpu = 0.0
    with _WorkerPeaks() as peaks:
        for name, prototype in step_accumulators(spec):
            started, cpu_before = time.perf_counter(), _cpu_seconds()
            acc = combine(prototype)
            wall, cpu = time.perf_counter() - started, _cpu_seconds() - cpu_before
            total += wall
            total_cpu += cpu
            passes.append({"pass": name, "wall_s": wall, "reports_per_s": reports / wall, "cpu_s": cpu,
                           "cpu_us_per_report": 1e6 * cpu / reports, "accumulator_bytes": acc.nbytes})
    worker_peaks = sorted(peaks.peaks.values(), reverse=True)
    return {"case": case, "engine": engine, "workers": workers if engine == "beam" else None,
            "reports": reports, "files": files, "passes": passes, "step_wall_s": total,
            "step_reports_per_s": reports / total, "step_cpu_s": total_cpu,
            "step_cpu_us_per_report": 1e6 * total_cpu / reports,
            "accumulator_bytes": sum(p["accumulator_bytes"] for p in passes),
            "driver_peak_rss_bytes": _peak_rss(),
            "worker_peak_rss_bytes": worker_peaks[:8], "worker_processes": len(worker_peaks),
            "worker_cpu_s_sampled": sum(peaks.cpu.values())}


def table(paths: list[Path]) -> str:
    """The README table of result files (``run --json`` outputs, or their ``rows`` merged)."""
    rows = [row for path in paths for row in json.loads(path.read_text())["rows"]]
    order = {case: i for i, case in enumerate(CASES)}
    rows.sort(key=lambda r: (order.get(r["case"], 99), r["engine"] != "in-process", r["workers"] or 0))
    mib = 1 << 20
    lines = ["| case | engine | passes | wall s | reports/s | CPU µs/report | step process peak RSS MiB | "
             "worker peak RSS MiB | accumulator bytes | load avg (1 min) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        engine = "in-process" if r["engine"] == "in-process" else f"Beam, {r['workers']} worker(s)"
        cpu = r.get("step_cpu_us_per_report")
        workers = max((b for b in r["worker_peak_rss_bytes"]), default=0)
        lines.append(" | ".join([
            f"| {r['case']}", engine, " + ".join(p["pass"] for p in r["passes"]), f"{r['step_wall_s']:.0f}",
            f"{r['step_reports_per_s']:,.0f}", "not measured" if cpu is None else f"{cpu:.1f}",
            f"{r['driver_peak_rss_bytes'] / mib:.0f}", f"{workers / mib:.0f}" if workers else "-",
            f"{r['accumulator_bytes']:,}", f"{r['load_avg_before'][0]:.1f} |"]))
    return "\n".join(lines)


def _machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
            "memory_bytes": psutil.virtual_memory().total}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="land a round of N reports per case")
    gen.add_argument("--reports", type=int, default=1_000_000, help="reports per writer")
    gen.add_argument("--writers", type=int, default=10)
    gen.add_argument("--seed", type=int, default=7)
    run = sub.add_parser("run", help="the step over the landed round")
    run.add_argument("--engine", choices=("in-process", "beam"), required=True)
    run.add_argument("--workers", type=int, default=2)
    tab = sub.add_parser("table", help="the README table of result files")
    tab.add_argument("results", type=Path, nargs="+")
    for p in (gen, run):
        p.add_argument("--dir", type=Path, required=True)
        p.add_argument("--cases", default=",".join(CASES))
        p.add_argument("--json", type=Path, help="write the rows here")
    args = sys.argv[1:] if argv is None else list(argv)
    ns = parser.parse_args(args)
    if ns.command == "table":
        print(table(ns.results))
        return 0
    cases = [c for c in ns.cases.split(",") if c]
    rows = []
    for case in cases:
        before = _machine()["load_avg"]
        if ns.command == "generate":
            row = generate(case, ns.reports, ns.writers, ns.dir / case, ns.seed)
        else:
            row = run_case(case, ns.dir / case, ns.engine, ns.workers, ns.dir / f"beam-work-{case}")
        row["load_avg_before"] = before
        rows.append(row)
        print(json.dumps(row), flush=True)
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        # The paths are this machine's: the command is recorded with DIR and the output's file name.
        command = ["benchmarks/fleet_scale.py", *("DIR" if a == str(ns.dir) else ns.json.name if a == str(ns.json) else a
                                                  for a in args)]
        ns.json.write_text(json.dumps({"command": command, "machine": _machine(), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
