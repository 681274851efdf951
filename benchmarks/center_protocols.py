"""Center protocols side by side: the product's clustering campaigns, the grid and the LDP floors on identical data.

Every cell (data set, n, seed) generates its points once (``ldp_collector.simulation.datasets.make_dataset``, data
seed ``s``) and every method runs on those same points with the method seed ``s + 100000`` (the harness's
convention, ``harness.runner.METHOD_SEED_OFFSET``):

* every center-publishing campaign of :data:`harness.baselines.center_campaigns.METHODS`, read at run
  time (today ``kcluster``, ``mnfcm``, ``fcm-laplace``, ``ldp-kmeans``; whatever is added there, e.g.
  ``nettree`` and ``stemmer``, is picked up): one campaign through the in-process collector (real engine
  and SQLite store, devices simulated with the SDK's code, ``mode="direct"``), engine defaults but ``k``;
* the grid protocol ``ugc`` (optionally ``agc-tree``, ``agc-iter``): a ``GRID`` campaign, labels only;
* the two LDP floors: ``ldp-laplace-points`` (the SDK's discrete-Laplace point per device, k-means on the
  noisy points) and ``ldp-oue-grid`` (one OUE grid ``HISTOGRAM`` campaign, weighted k-means);
* ``kmeans++``: non-private k-means++ (best of 5), the trusted-curator reference (no budget).

Scores, as the harness computes them (``ldp_collector.simulation.scores.evaluate_clustering``): each
point is labelled by its nearest published center (the grid: by its cell's cluster, ``-1`` = noise);
ARI against the generating classes; cost ratio = k-means cost of the published centers on the *true*
points / cost of the non-private reference k-means of the same points (best of 10,
``reference_kmeans_cost``; none for the grid, which publishes no centers). Per run also: wall time of
the method (device simulation + ingestion + server), the server step (time inside the engines'
``close_round``, summed over rounds; none for the Laplace floor, which runs without a collector, and
for k-means++), rounds, epsilon per device. A method that raises is recorded as failed with its error; with
``--timeout`` each run is a forked child process killed after that many seconds (recorded as
``timeout``; the method's remaining runs at that data set and n are then skipped).

Output: a Markdown table per data set and n (rows = methods, columns = epsilon, cells
``ARI median [min, max] / cost ratio median`` over seeds; the best LDP method of each column in bold:
highest median ARI to three decimals, ties broken by the lower median cost ratio), a timing table, and
a JSON file with every run, rewritten after each run. Rerunning with the same ``--out`` resumes: runs
already in the file are kept and skipped (``--retry-failed`` reruns failures and timeouts, ``--rerun
METHOD ...`` those methods' runs, e.g. after an engine change). Every invocation is recorded in the
JSON with the git commit and the locally modified files, and every run with its invocation.

Usage::

    PYTHONPATH=packages/ldp-client/src:packages/ldp-proto/src:packages/ldp-collector/src:. \\
        OPENBLAS_NUM_THREADS=1 python benchmarks/center_protocols.py --n 100000 --tag n1e5
    python benchmarks/center_protocols.py --n 1000000 --datasets google:d=10,k=8 --epsilons 2 --seeds 0 \\
        --timeout 1200 --tag n1e6
    python benchmarks/center_protocols.py --n 4000 --seeds 0 --epsilons 4 --datasets mixture   # smoke
    python benchmarks/center_protocols.py --tables-only --out benchmarks/results/center_protocols_n1e5.json

Data sets are ``name`` or ``name:d=10,k=8,option=value`` (``make_dataset``'s options: ``ratio``,
``separation``, ``imbalance``); a bare ``mixture`` means ``mixture:d=2,k=8``. Set
``OPENBLAS_NUM_THREADS=1`` on a shared box.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.adapters import collector_backend
from harness.baselines import (
    center_campaigns,
    discrete_laplace_kmeans,
    grid_clustering,
    kmeans_plus_plus_baseline,
    oue_grid_kmeans,
)
from harness.baselines._common import Clustering
from harness.suites import DatasetCase, epsilon_label

from ldp_collector.estimation.kmeans import assign
from ldp_collector.kinds import KINDS
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.scores import evaluate_clustering, reference_kmeans_cost

#: The harness's offset between the data seed and the method's seed.
METHOD_SEED_OFFSET = 100_000
#: Grid protocols: name -> engine variant (``harness.baselines.grid.VARIANTS``).
GRID_METHODS = {"ugc": "uniform", "agc-tree": "tree", "agc-iter": "iterative"}
FLOORS = ("ldp-laplace-points", "ldp-oue-grid")
REFERENCE = "kmeans++"
DEFAULT_DATASETS = ("google:d=10,k=8", "mixture:d=2,k=8", "moons")
_DEFAULT_SHAPE = {"mixture": {"d": 2, "k": 8}, "google": {"d": 10, "k": 8}, "blobs": {"d": 2, "k": 4}}


def center_methods() -> list[str]:
    """The center campaigns as :data:`center_campaigns.METHODS` holds them now (new methods included)."""
    return list(center_campaigns.METHODS)


def known_methods() -> list[str]:
    return [*center_methods(), *GRID_METHODS, *FLOORS, REFERENCE]


def default_methods() -> list[str]:
    return [*center_methods(), "ugc", *FLOORS, REFERENCE]


def parse_dataset(spec: str) -> DatasetCase:
    """``name`` or ``name:d=10,k=8,ratio=5`` as a :class:`harness.suites.DatasetCase`."""
    name, _, rest = spec.partition(":")
    values: dict[str, float] = dict(_DEFAULT_SHAPE.get(name, {})) if not rest else {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        values[key.strip()] = float(value)
    d = values.pop("d", None)
    k = values.pop("k", None)
    return DatasetCase(name=name, d=None if d is None else int(d), k=None if k is None else int(k),
                       options=tuple(sorted(values.items())))


# -- one run ---------------------------------------------------------------------------------------------

class _ServerTimer:
    """Seconds spent in ``close_round`` of every registered engine (the server step), while active."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._saved: list[tuple[type, Any]] = []

    def __enter__(self) -> _ServerTimer:
        timer = self
        for cls in {kind.engine for kind in KINDS.values()}:
            original = cls.__dict__.get("close_round")
            if original is None:
                continue

            def timed(engine: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return _original(engine, *args, **kwargs)
                finally:
                    timer.seconds += time.perf_counter() - started

            self._saved.append((cls, original))
            cls.close_round = timed  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, original in self._saved:
            cls.close_round = original  # type: ignore[attr-defined]
        self._saved.clear()


def run_method(method: str, x: NDArray[np.float64], k: int, epsilon: float | None, seed: int) -> Clustering:
    """One run of ``method`` (module docstring) through a fresh in-process collector when it needs one."""
    if method in center_campaigns.METHODS:
        assert epsilon is not None
        with collector_backend(False) as backend:
            return center_campaigns.center_campaign(x, k, epsilon, method=method, seed=seed, backend=backend)
    if method in GRID_METHODS:
        assert epsilon is not None
        with collector_backend(False) as backend:
            return grid_clustering(x, epsilon, variant=GRID_METHODS[method], seed=seed, backend=backend)
    if method == "ldp-laplace-points":
        assert epsilon is not None
        return discrete_laplace_kmeans(x, k, epsilon, seed=seed)
    if method == "ldp-oue-grid":
        assert epsilon is not None
        with collector_backend(False) as backend:
            return oue_grid_kmeans(x, k, epsilon, seed=seed, backend=backend)
    if method == REFERENCE:
        return kmeans_plus_plus_baseline(x, k, seed=seed)
    raise ValueError(f"unknown method {method!r}; known: {', '.join(known_methods())}")


def score_run(method: str, x: NDArray[np.float64], y: NDArray[np.int64] | None, k: int, epsilon: float | None,
              seed: int, reference: float) -> dict[str, Any]:
    """Run and score one method; exceptions become ``status = "failed"`` with the error."""
    out: dict[str, Any] = {"status": "ok", "error": None}
    started = time.perf_counter()
    try:
        with _ServerTimer() as timer:
            result = run_method(method, x, k, epsilon, seed + METHOD_SEED_OFFSET)
        out["wall_s"] = time.perf_counter() - started
        out["server_s"] = timer.seconds if method not in ("ldp-laplace-points", REFERENCE) else math.nan
        predicted = result.labels if result.labels is not None else assign(x, result.centers)[0]
        metrics = evaluate_clustering(x, y, predicted, centers=result.centers,
                                      reference_cost=reference if result.centers is not None else None)
        diag = {key: float(v) for key, v in result.diagnostics.items()}
        out.update({
            "ari": metrics.get("ari", math.nan), "cost_ratio": metrics.get("cost_ratio", math.nan),
            "nmi": metrics.get("nmi", math.nan), "clusters": metrics["clusters"],
            "noise_share": metrics["noise_share"],
            "rounds": diag.get("rounds", 0.0 if method == REFERENCE else 1.0),
            "epsilon_per_device": diag.get("epsilon_per_device", math.nan if epsilon is None else epsilon),
            "campaign_s": diag.get("campaign_seconds", math.nan),
            "metrics": metrics, "diagnostics": diag,
            "centers": (None if result.centers is None or result.centers.size > 4096
                        else np.asarray(result.centers).round(6).tolist()),
        })
    except Exception as exc:
        out.update({"status": "failed", "wall_s": time.perf_counter() - started,
                    "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
    return out


def _child(conn: Any, fn: Callable[[], dict[str, Any]]) -> None:
    try:
        conn.send(fn())
    finally:
        conn.close()


def call_with_timeout(fn: Callable[[], dict[str, Any]], timeout: float | None) -> dict[str, Any]:
    """``fn()`` in this process, or with a timeout in a forked child (killed when it runs over)."""
    if timeout is None:
        return fn()
    ctx = multiprocessing.get_context("fork")  # the child inherits the points; in-process collectors only
    receive, send = ctx.Pipe(duplex=False)
    started = time.perf_counter()
    process = ctx.Process(target=_child, args=(send, fn), daemon=True)
    process.start()
    send.close()
    try:
        if receive.poll(timeout):
            try:
                return dict(receive.recv())
            except EOFError:
                pass
            process.join()
            return {"status": "failed", "wall_s": time.perf_counter() - started,
                    "error": f"the run's process died (exit code {process.exitcode})"}
        return {"status": "timeout", "wall_s": time.perf_counter() - started,
                "error": f"no result within {timeout:g} s: stopped"}
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        receive.close()


# -- the matrix, incremental JSON ----------------------------------------------------------------------

def _key(run: dict[str, Any]) -> tuple[str, str, int, str, int]:
    return run["method"], run["dataset"], int(run["n"]), run["epsilon"], int(run["seed"])


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {key: _json_safe(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        return _json_safe(value.item())
    return value


def _write(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_json_safe(document), indent=1))
    os.replace(tmp, path)


def _git(*args: str) -> str | None:
    try:
        # Read-only, and without the index refresh ``git status`` may write (another process may be committing).
        return subprocess.run(["git", "--no-optional-locks", *args], cwd=Path(__file__).resolve().parent, capture_output=True, text=True,
                              timeout=10, check=True).stdout.rstrip()
    except (OSError, subprocess.SubprocessError):
        return None


def _environment() -> dict[str, Any]:
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"python": platform.python_version(), "numpy": np.__version__, "platform": platform.platform(),
            "cpus": os.cpu_count(), "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
            "git_head": (_git("rev-parse", "--short", "HEAD") or "").strip() or None,
            "git_modified": None if status is None else [line[3:] for line in status.splitlines()],
            "center_campaign_methods": center_methods()}


def run_matrix(args: argparse.Namespace, document: dict[str, Any], out: Path) -> None:
    methods: list[str] = args.methods
    runs: list[dict[str, Any]] = document["runs"]
    done = {_key(r): i for i, r in enumerate(runs)}
    cases = [parse_dataset(spec) for spec in args.datasets]
    epsilons = sorted(set(args.epsilons))
    total = sum(len(args.seeds) * sum(1 if m == REFERENCE else len(epsilons) for m in methods)
                for _ in cases for _ in args.n)
    count = 0
    for n in args.n:
        for case in cases:
            skipped: dict[str, str] = {}  # method -> why (a timeout at this data set and n)
            for seed in args.seeds:
                todo = [(m, e) for m in methods for e in ((None,) if m == REFERENCE else epsilons)]
                pending = []
                for m, e in todo:
                    key = (m, case.label, n, epsilon_label(e), seed)
                    previous = runs[done[key]] if key in done else None
                    if previous is not None and m not in args.rerun and (previous["status"] == "ok"
                                                                         or not args.retry_failed):
                        count += 1
                        if previous["status"] == "timeout":
                            skipped[m] = f"timed out at epsilon {previous['epsilon']}, seed {previous['seed']}"
                        continue
                    pending.append((m, e))
                if not pending:
                    continue
                started = time.perf_counter()
                x, y = make_dataset(case.name, n, d=case.d, k=case.k, seed=seed, **dict(case.options))
                k = case.k if case.k is not None else len(np.unique(y))
                ref_key = f"{case.label}|{n}|{seed}"
                reference = document["references"].get(ref_key)
                if reference is None:
                    reference = float(reference_kmeans_cost(x, k, seed, n_init=10))
                    document["references"][ref_key] = reference
                print(f"# {case.label}, n = {n}, seed {seed}: data + reference k-means {time.perf_counter() - started:.1f} s "
                      f"(d = {x.shape[1]}, k = {k})", flush=True)
                for m, e in pending:
                    count += 1
                    base = {"method": m, "dataset": case.label, "n": n, "d": int(x.shape[1]), "k": k,
                            "epsilon": epsilon_label(e), "seed": seed}
                    if m in skipped:
                        record = {**base, "status": "skipped", "error": skipped[m]}
                    else:
                        fn = functools.partial(score_run, m, x, y, k, e, seed, reference)
                        record = {**base, **call_with_timeout(fn, args.timeout)}
                        if record["status"] == "timeout":
                            skipped[m] = f"timed out at epsilon {base['epsilon']}, seed {seed}"
                    record["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
                    record["invocation"] = len(document["invocations"]) - 1
                    key = _key(record)
                    if key in done:
                        runs[done[key]] = record
                    else:
                        done[key] = len(runs)
                        runs.append(record)
                    _write(out, document)
                    print(f"[{count}/{total}] {_progress(record)}", flush=True)


def _progress(r: dict[str, Any]) -> str:
    head = f"{r['dataset']} n={r['n']} seed={r['seed']} eps={r['epsilon']} {r['method']}:"
    if r["status"] != "ok":
        return f"{head} {r['status'].upper()} {r.get('error')} ({r.get('wall_s', 0.0):.1f} s)"
    server = "" if r["server_s"] is None or math.isnan(r["server_s"]) else f", server {r['server_s']:.1f} s"
    return (f"{head} ARI {r['ari']:.3f}, cost ratio {_fmt(r['cost_ratio'], 2)}, rounds {r['rounds']:g}, "
            f"eps/device {_fmt_g(r['epsilon_per_device'])}, wall {r['wall_s']:.1f} s{server}")


# -- tables ------------------------------------------------------------------------------------------------

def _num(value: Any) -> float:
    return math.nan if value is None or isinstance(value, str) else float(value)


def _fmt(value: float, digits: int = 3) -> str:
    if math.isnan(value):
        return "–"
    return f"{value:.{digits}f}" if abs(value) < 10 else f"{value:.3g}"


def _cell(group: list[dict[str, Any]]) -> tuple[str, float, float]:
    """``(text, median ARI, median cost ratio)`` of one table cell."""
    ok = [r for r in group if r["status"] == "ok"]
    bad = [r for r in group if r["status"] != "ok"]
    if not ok:
        return (f"{bad[0]['status']} (below)" if bad else ""), math.nan, math.nan
    aris = [_num(r.get("ari")) for r in ok]
    costs = [c for c in (_num(r.get("cost_ratio")) for r in ok) if not math.isnan(c)]
    ari = statistics.median(aris)
    cost = statistics.median(costs) if costs else math.nan
    text = _fmt(ari) if len(ok) == 1 else f"{_fmt(ari)} [{_fmt(min(aris))}, {_fmt(max(aris))}]"
    text += f" / {_fmt(cost, 2) if costs else '–'}"
    if bad:
        text += f" ({len(bad)} {bad[0]['status']})"
    return text, ari, cost


def markdown(runs: list[dict[str, Any]], methods: list[str] | None = None) -> str:
    """The quality table and the timing table of every (data set, n) in ``runs``."""
    blocks: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in runs:
        blocks.setdefault((r["dataset"], int(r["n"])), []).append(r)
    out: list[str] = []
    for (dataset, n), rows in sorted(blocks.items(), key=lambda item: (item[0][1], item[0][0])):
        present = list(dict.fromkeys(r["method"] for r in rows))
        order = [m for m in (methods or []) if m in present] + [m for m in present if m not in (methods or [])]
        epsilons = sorted({r["epsilon"] for r in rows if r["epsilon"] != "-"}, key=float)
        has_reference = any(r["epsilon"] == "-" for r in rows)
        seeds = sorted({int(r["seed"]) for r in rows})
        columns = [*(f"ε = {e}" for e in epsilons), *(["no budget"] if has_reference else [])]
        out.append(f"#### {dataset}, n = {n:,}: ARI median [min, max] / cost ratio median "
                   f"(seeds {', '.join(map(str, seeds))})\n")
        out.append("| method | " + " | ".join(columns) + " |")
        out.append("|---|" + "---:|" * len(columns))
        cells: dict[tuple[str, str], tuple[str, float, float]] = {}
        for m in order:
            for e in [*epsilons, "-"]:
                group = [r for r in rows if r["method"] == m and r["epsilon"] == e]
                if group:
                    cells[(m, e)] = _cell(group)
        best: dict[str, set[str]] = {}
        for e in epsilons:
            scored = [(m, round(c[1], 3), c[2]) for (m, ee), c in cells.items()
                      if ee == e and m != REFERENCE and not math.isnan(c[1])]
            if scored:
                top = max(s[1] for s in scored)
                tied = [s for s in scored if s[1] == top]
                finite = [s[2] for s in tied if not math.isnan(s[2])]
                low = min(finite) if finite else math.nan
                best[e] = {s[0] for s in tied
                           if math.isnan(low) or math.isnan(s[2]) or round(s[2], 2) == round(low, 2)}
        for m in order:
            texts = []
            for e in epsilons:
                text = cells.get((m, e), ("", math.nan, math.nan))[0]
                if m in best.get(e, set()):
                    head, sep, tail = text.partition(" ")
                    text = f"**{head}**{sep}{tail}"
                texts.append(text)
            if has_reference:
                texts.append(cells.get((m, "-"), ("", math.nan, math.nan))[0])
            label = f"{m} (non-private)" if m == REFERENCE else m
            out.append(f"| {label} | " + " | ".join(texts) + " |")
        out.append("")
        out.append(f"Timing, {dataset}, n = {n:,} (median [min, max] over ε and seeds):\n")
        out.append("| method | runs ok | rounds | ε per device | wall s | server step s |")
        out.append("|---|---:|---:|---:|---:|---:|")
        for m in order:
            group = [r for r in rows if r["method"] == m]
            ok = [r for r in group if r["status"] == "ok"]
            if not ok:
                out.append(f"| {m} | 0 of {len(group)} | | | {_spread([_num(r.get('wall_s')) for r in group], 0)} | |")
                continue
            rounds = sorted({_fmt_g(_num(r.get('rounds'))) for r in ok}) if m != REFERENCE else ["–"]
            eps = sorted({_fmt_g(_num(r.get('epsilon_per_device'))) for r in ok})
            out.append(f"| {m} | {len(ok)} of {len(group)} | {', '.join(rounds)} | {', '.join(eps)} | "
                       f"{_spread([_num(r.get('wall_s')) for r in ok], 1)} | "
                       f"{_spread([_num(r.get('server_s')) for r in ok], 2)} |")
        out.append("")
        failures = [r for r in rows if r["status"] != "ok"]
        for r in failures:
            out.append(f"* {r['method']} ε = {r['epsilon']} seed {r['seed']}: {r['status']}: {r['error']}")
        if failures:
            out.append("")
    return "\n".join(out)


def _fmt_g(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:g}"


def _spread(values: list[float], digits: int) -> str:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "–"
    med = statistics.median(finite)
    if len(finite) == 1 or min(finite) == max(finite):
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} [{min(finite):.{digits}f}, {max(finite):.{digits}f}]"


# -- entry point -------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=None,
                        help=f"default: every center campaign, ugc, the floors, {REFERENCE} "
                             f"(known now: {', '.join(known_methods())})")
    parser.add_argument("--datasets", nargs="+", default=list(DEFAULT_DATASETS),
                        help="name or name:d=..,k=..,option=.. (default: %(default)s)")
    parser.add_argument("--n", type=int, nargs="+", default=[100_000])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per run (forked child, killed when over); later runs of the method at that "
                             "data set and n are skipped")
    parser.add_argument("--tag", default=None, help="output name: benchmarks/results/center_protocols_<tag>.json")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON file (default: benchmarks/results/center_protocols_<tag or UTC timestamp>.json); "
                             "an existing file is resumed; the tables go next to it (.md)")
    parser.add_argument("--retry-failed", action="store_true", help="rerun failed and timed-out runs of the file")
    parser.add_argument("--rerun", nargs="+", default=[], metavar="METHOD",
                        help="rerun these methods' runs already in the file (e.g. after an engine change)")
    parser.add_argument("--tables-only", action="store_true", help="print (and rewrite) the tables of --out; run nothing")
    args = parser.parse_args(argv)
    if args.methods is None:
        args.methods = default_methods()
    unknown = [m for m in args.methods if m not in known_methods()]
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(known_methods())}")
    out: Path = args.out or (Path(__file__).resolve().parent / "results" /
                             f"center_protocols_{args.tag or datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json")
    if out.exists():
        document = json.loads(out.read_text())
        print(f"{'reading' if args.tables_only else 'resuming'} {out}: {len(document['runs'])} runs recorded", flush=True)
    elif args.tables_only:
        parser.error(f"--tables-only needs an existing --out, {out} does not exist")
    else:
        document = {"script": "benchmarks/center_protocols.py", "references": {}, "runs": []}
    if not args.tables_only:
        document.setdefault("invocations", []).append({
            "argv": sys.argv[1:] if argv is None else argv, "methods": args.methods,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "environment": _environment()})
        print(f"methods: {', '.join(args.methods)}; center campaigns in METHODS: {', '.join(center_methods())}",
              flush=True)
        run_matrix(args, document, out)
        document["invocations"][-1]["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        _write(out, document)
    table = markdown(document["runs"], args.methods)
    out.with_suffix(".md").write_text(table + "\n")
    print()
    print(table)
    print(f"runs: {out}\ntables: {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
