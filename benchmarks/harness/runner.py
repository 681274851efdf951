"""Run a suite: the matrix in parallel processes, then results JSON, tables, plots and the checks.

Every run (protocol, dataset, n, epsilon, seed) generates its data set from the seed
(:func:`ldp_collector.simulation.datasets.make_dataset`), calls the protocol's adapter
(:mod:`harness.adapters`), labels every point by its nearest published center (or takes the
adapter's labels) and scores the clustering with the one shared metric implementation
(:func:`ldp_collector.simulation.scores.evaluate_clustering`). The cost ratio's denominator is
the non-private reference k-means of the same data (best of 10 k-means++ runs,
:func:`ldp_collector.simulation.scores.reference_kmeans_cost`), computed once per data set.

Seeds: the data set of seed ``s`` is ``make_dataset(..., seed=s)``; the protocol's randomness
(devices' coins, noise, k-means seeding) uses ``s + METHOD_SEED_OFFSET``. Runs are deterministic, but a change that draws the same
randomness in another order (the device SDK's, the simulator's) redraws every seed's outcome, so
``regressions.json`` records each cell over more seeds than the suite checks (all its
:attr:`~harness.suites.Suite.tuning_seeds`) with a tolerance reaching its worst seed. Tuning and
reporting seeds are disjoint, and :func:`plan_seeds` refuses a run that would report on a tuning seed
or tune (record regressions) on a reporting one.

Checks (any failure makes :func:`main` exit non-zero with a message saying what broke):
* every run completed (an exception in a run is a failure, reported with its traceback);
* the suite's bounds (e.g. the LDP floors reproduce k-means within 2% cost at epsilon = inf).
  That bound's ``cost_ratio_matched`` divides the cost by that of non-private k-means (Lloyd on the
  true points) started from the protocol's own centers: 1 exactly when the centers are a k-means
  solution of the true data. It measures what the floor's pipeline loses, not which local optimum
  a k-means++ restart happened to find (on the imbalanced mixture a single restart finds the best
  one about 15% of the time, so two best-of-10 runs on nearly identical data can differ by 4%);
  the plain ``cost_ratio`` against the best-of-10 reference is in the tables as always. A floor
  clusters its points snapped to its own grid (the OUE cell centres, the Laplace rounding), so the
  bound's ``cost_ratio_resolved`` also grants what that resolution costs (:func:`resolution_cost`);
* the suite's required paper claims;
* no recorded cell of ``regressions.json`` got worse than its tolerance.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import json
import math
import multiprocessing
import os
import platform
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

from ldp_client.clusters import CellClusterModel

from . import adapters
from .baselines import Box, Clustering
from .suites import GRID_PROTOCOLS, Bound, Claim, DatasetCase, Suite, epsilon_label, get_suite

__all__ = [
    "HEADLINE_SEEDS",
    "METHOD_SEED_OFFSET",
    "Cell",
    "CheckResult",
    "Comparison",
    "RunRecord",
    "Task",
    "aggregate",
    "build_tasks",
    "check_bounds",
    "check_claims",
    "check_densest_regions",
    "check_regressions",
    "paired_comparison",
    "variant_verdicts",
    "verdict_summary",
    "densest_region_clustered",
    "main",
    "plan_seeds",
    "record_regressions",
    "resolution_cost",
    "run_suite",
    "run_task",
]

#: Offset between the data seed and the protocol's seed.
METHOD_SEED_OFFSET = 100_000
#: Default location of the recorded tolerances.
REGRESSIONS_PATH = Path(__file__).with_name("regressions.json")
#: The header of ``regressions.json``.
_REGRESSIONS_DESCRIPTION = (
    "Recorded medians over seeds and their tolerances (the distance from the median to the worst of `seeds` seeds, "
    "at least 0.02 for scores or 5% for costs); `python benchmarks/run.py --suite NAME --tuning "
    "--record-regressions` rewrites NAME's entries over its tuning seeds. A cell whose median gets worse than the "
    "recorded one by more than the tolerance fails the suite. An entry with \"enforced\": false is compared and "
    "reported, never a failure; its \"reason\" says why.")
#: Bound metrics that need the matched non-private k-means (:attr:`Task.matched_reference`).
_MATCHED_METRICS = frozenset({"cost_ratio_matched", "cost_ratio_resolved"})
#: Tolerance floors when recording: absolute for scores in [0, 1], relative for costs and ratios.
_ABSOLUTE_TOLERANCE = 0.02
_RELATIVE_TOLERANCE = 0.05


@dataclass(frozen=True, kw_only=True)
class Task:
    """One run of the matrix."""

    protocol: str
    dataset: DatasetCase
    n: int
    epsilon: float | None
    seed: int
    via_grpc: bool = False
    #: Return the labels too (for the cluster drawings).
    keep_labels: bool = False
    #: Also score against non-private k-means (Lloyd on the true points) started from the protocol's own
    #: centers (``cost_ratio_matched``, ``cost_ratio_resolved``).
    matched_reference: bool = False

    @property
    def key(self) -> tuple[str, str, int, str, int]:
        return self.protocol, self.dataset.label, self.n, epsilon_label(self.epsilon), self.seed


@dataclass(kw_only=True)
class RunRecord:
    """The outcome of one task (JSON-ready apart from ``labels``)."""

    protocol: str
    dataset: str
    n: int
    d: int
    k: int
    epsilon: str
    seed: int
    via_grpc: bool
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    diagnostics: dict[str, float] = field(default_factory=dict)
    centers: list[list[float]] | None = None
    error: str | None = None
    labels: NDArray[np.int64] | None = None
    #: A grid clustering's published cell map, kept with the labels for the plots.
    cell_map: CellClusterModel | None = None
    #: 2-D runs: whether the densest cell of the true points' histogram is in a cluster, not noise
    #: (:func:`densest_region_clustered`); ``None`` for other data.
    densest_region_clustered: bool | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("labels")
        out.pop("cell_map")
        out["metrics"] = {key: _finite(v) for key, v in self.metrics.items()}
        out["diagnostics"] = {key: _finite(v) for key, v in self.diagnostics.items()}
        return out


def _finite(value: float) -> float | str | None:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


# -- data and references (cached per process) ----------------------------------------------------------

@functools.lru_cache(maxsize=6)
def dataset(case: DatasetCase, n: int, seed: int) -> tuple[NDArray[np.float64], NDArray[np.int64] | None, int]:
    """``(X, labels, k)`` of a data set instance; ``k`` from the case, else the number of classes."""
    from ldp_collector.simulation.datasets import make_dataset

    x, labels = make_dataset(case.name, n, d=case.d, k=case.k, seed=seed, **dict(case.options))
    if case.normalize:
        low, high = x.min(axis=0), x.max(axis=0)
        x = (x - low) / np.where(high > low, high - low, 1.0)
    if case.k is not None:
        k = case.k
    elif labels is not None:
        k = len(np.unique(labels))
    else:
        raise ValueError(f"dataset {case.label} has no labels: give its k")
    return x, labels, k


def reference_cost(case: DatasetCase, n: int, seed: int) -> float:
    """Non-private reference k-means cost (best of 10) of a data set instance."""
    from ldp_collector.simulation.scores import reference_kmeans_cost

    x, _, k = dataset(case, n, seed)
    return float(reference_kmeans_cost(x, k, seed, n_init=10))


def dimension_of(case: DatasetCase) -> int:
    """The dimension of ``case`` (from a tiny sample)."""
    return int(dataset(case, 64, 0)[0].shape[1])


# -- one run -------------------------------------------------------------------------------------------

#: Cells per axis of the histogram whose top cell :func:`densest_region_clustered` checks (runs without a cell map).
DENSEST_GRID = 32


def densest_region_clustered(x: NDArray[np.float64], out: Clustering) -> bool | None:
    """Whether the densest true region of 2-D data is labelled by the published clustering.

    The region is the top cell of the non-private histogram of ``x``: at the run's own grid when it
    published a cell map (the cell of highest point density, cells differing in size), else on a
    ``DENSEST_GRID`` x ``DENSEST_GRID`` grid over the data's bounding box. It is labelled when the
    cell map's label of that cell is not ``-1``, else when most of its points have a label other
    than ``-1`` (adapters publishing labels), else when there is a center to be nearest to. A
    private clustering that calls the densest region noise has failed where the signal is
    strongest: a sanity check, reported, never a failure of the suite. ``None`` unless ``x`` is 2-D.
    """
    if x.ndim != 2 or x.shape[1] != 2 or len(x) == 0:
        return None
    if out.cell_map is not None:
        from ldp_collector.plotting import grid_cell_rectangles

        positions = np.fromiter((out.cell_map.cell_position(p) for p in x.tolist()), dtype=np.int64, count=len(x))
        rectangles = grid_cell_rectangles(out.cell_map)
        density = np.bincount(positions, minlength=len(rectangles)) / (rectangles[:, 2] * rectangles[:, 3])
        return bool(out.cell_map.labels[int(np.argmax(density))] != -1)
    index = _grid_index(x, Box.of(x), DENSEST_GRID)
    flat = index[:, 0] * DENSEST_GRID + index[:, 1]
    top = flat == np.argmax(np.bincount(flat, minlength=DENSEST_GRID * DENSEST_GRID))
    if out.labels is not None:
        return bool(np.mean(np.asarray(out.labels)[top] != -1) > 0.5)
    return out.centers is not None and len(out.centers) > 0 and bool(np.isfinite(out.centers).all())


def _grid_index(x: NDArray[np.float64], box: Box, m: int) -> NDArray[np.int64]:
    """Per-dimension index of each point's cell in the ``m``-per-dimension grid over ``box`` (top edge in the last cell)."""
    index: NDArray[np.int64] = np.clip(((x - box.lower) / box.width * m).astype(np.int64), 0, m - 1)
    return index


def resolution_cost(protocol: str, x: NDArray[np.float64], diagnostics: dict[str, float]) -> float:
    """``Q``: the squared distance of the true points ``x`` to where the floor ``protocol`` snaps them.

    The OUE grid floor clusters the cell centres of its ``cells_per_dimension`` grid over the data's
    box, the discrete-Laplace floor the points rounded to its ``2^grid_bits`` grid; other protocols
    snap nothing (0). This is what the floor's resolution costs, whatever the data: for any centres
    ``C``, the cost on the true points and the cost on the snapped points differ by at most
    ``sqrt(Q)`` in square root (Minkowski's inequality, each point keeping its assignment), so
    centres ``C`` at least as good on the snapped points as the true points' k-means solution ``L``
    in their basin (what a working weighted k-means finds) cost ``cost(C) <= (sqrt(cost(L)) +
    2 sqrt(Q))^2`` on the true points. ``cost_ratio_resolved`` divides by that, and is the plain
    ``cost_ratio_matched`` when ``Q = 0``.
    """
    from .baselines.laplace_points import discrete_laplace_points
    from .baselines.oue_grid import cell_centers

    box = Box.of(x)
    if protocol == "ldp-oue-grid":
        m = int(diagnostics["cells_per_dimension"])
        flat = np.ravel_multi_index(tuple(_grid_index(x, box, m).T), (m,) * box.dimension)
        snapped = cell_centers(box, m)[flat]
    elif protocol == "ldp-laplace-points":
        # epsilon = inf: the floor's rounding only (no noise is drawn, the seed is unused).
        snapped = box.from_unit(discrete_laplace_points(box.to_unit(x), math.inf, seed=0,
                                                        grid_bits=int(diagnostics["grid_bits"])))
    else:
        return 0.0
    return float(np.sum((x - snapped) ** 2))


def run_task(task: Task, reference: float | None) -> RunRecord:
    """Run one task and score it; exceptions become ``error`` (with the traceback)."""
    from ldp_collector.estimation.kmeans import assign, lloyd
    from ldp_collector.simulation.evaluation import floor_scores
    from ldp_collector.simulation.scores import evaluate_clustering

    started = time.perf_counter()
    x, labels_true, k = dataset(task.dataset, task.n, task.seed)
    record = RunRecord(protocol=task.protocol, dataset=task.dataset.label, n=task.n, d=int(x.shape[1]), k=k,
                       epsilon=epsilon_label(task.epsilon), seed=task.seed, via_grpc=task.via_grpc, seconds=0.0)
    try:
        adapter = adapters.get_adapter(task.protocol)
        started = time.perf_counter()
        out = adapter.run(x, k, task.epsilon, task.seed + METHOD_SEED_OFFSET, task.via_grpc)
        record.seconds = time.perf_counter() - started
        if out.labels is not None:
            predicted = np.asarray(out.labels, dtype=np.int64)
        else:
            assert out.centers is not None
            predicted = assign(x, out.centers)[0]
        record.metrics = evaluate_clustering(x, labels_true, predicted, centers=out.centers,
                                             reference_cost=reference if out.centers is not None else None)
        record.diagnostics = {key: float(v) for key, v in out.diagnostics.items()}
        if out.centers is not None and reference is not None and len(x):
            # Measured / the result's own noise floor (the center kinds report one, the baselines do not).
            record.metrics.update(floor_scores(record.diagnostics, record.metrics, reference / len(x)))
        record.densest_region_clustered = densest_region_clustered(x, out)
        if out.centers is not None and out.centers.size <= 2048:
            record.centers = np.asarray(out.centers, dtype=np.float64).round(6).tolist()
        if task.matched_reference and out.centers is not None:
            matched = lloyd(x, out.centers).cost
            record.metrics["cost_ratio_matched"] = record.metrics["cost"] / matched if matched > 0 else math.nan
            # The cost a clustering of the snapped points is guaranteed to reach (resolution_cost).
            reachable = (math.sqrt(matched) + 2.0 * math.sqrt(resolution_cost(task.protocol, x, out.diagnostics))) ** 2
            record.metrics["cost_ratio_resolved"] = record.metrics["cost"] / reachable if reachable > 0 else math.nan
        if task.keep_labels:
            record.labels = predicted
            record.cell_map = out.cell_map
    except Exception:
        record.seconds = time.perf_counter() - started
        record.error = traceback.format_exc()
    return record


def _init_worker(address: str | None, token: str | None) -> None:
    adapters.configure_remote(address, token)


# -- the matrix ----------------------------------------------------------------------------------------

def build_tasks(suite: Suite, *, via_grpc: bool = False, protocols: Sequence[str] | None = None) -> list[Task]:
    """Every run of ``suite`` (deduplicated; methods without a budget run once per data set, methods
    without a no-noise bypass skip ``epsilon = inf``)."""
    chosen = set(protocols) if protocols else None
    matched = {(p, epsilon_label(b.epsilon), dataset_label) for b in suite.bounds if b.metric in _MATCHED_METRICS
               for p in b.protocols for dataset_label in b.datasets}
    tasks: dict[tuple[str, str, int, str, int], Task] = {}
    for block in suite.blocks:
        for case in block.datasets:
            d = dimension_of(case)
            for name in block.protocols:
                if chosen is not None and name not in chosen:
                    continue
                cls = adapters.ADAPTERS.get(name)
                if cls is None:
                    raise ValueError(f"suite {suite.name} names unknown protocol {name!r}; "
                                     f"registered: {', '.join(sorted(adapters.ADAPTERS))}")
                if not cls.supports_dimension(d):
                    continue
                epsilons: Iterable[float | None] = (
                    tuple(e for e in block.epsilons if cls.noiseless_bypass or math.isfinite(e))
                    if cls.uses_epsilon else (None,))
                for n in block.ns:
                    for epsilon in epsilons:
                        for seed in block.seeds:
                            draw = (d == 2 and seed == block.seeds[0] and n == min(block.ns)
                                    and epsilon in (None, _drawn_epsilon(block.epsilons, suite.plot_epsilon)))
                            task = Task(protocol=name, dataset=case, n=n, epsilon=epsilon, seed=seed,
                                        via_grpc=via_grpc and cls.uses_collector, keep_labels=draw,
                                        matched_reference=(name, epsilon_label(epsilon), case.label) in matched)
                            previous = tasks.get(task.key)
                            if previous is None or (draw and not previous.keep_labels):
                                tasks[task.key] = task
    return list(tasks.values())


def _drawn_epsilon(epsilons: Sequence[float], preferred: float) -> float:
    """The epsilon of a block's cluster drawings: the one closest to ``preferred`` (on a log scale)."""
    finite = [e for e in epsilons if math.isfinite(e)] or list(epsilons)
    return min(finite, key=lambda e: abs(math.log(e / preferred)) if math.isfinite(e) else math.inf)


def _executor(jobs: int, address: str | None, token: str | None) -> concurrent.futures.Executor:
    # spawn: the parent may run a gRPC server thread, and forking a process with gRPC threads is unsafe.
    return concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_init_worker, initargs=(address, token))


def _references(tasks: Sequence[Task], pool: concurrent.futures.Executor | None,
                quiet: bool) -> dict[tuple[str, int, int], float]:
    instances = {(t.dataset.label, t.n, t.seed): t for t in tasks}
    out: dict[tuple[str, int, int], float] = {}
    bar = tqdm(total=len(instances), desc="reference k-means", unit="set", disable=quiet, leave=False)
    if pool is None:
        for key, t in instances.items():
            out[key] = reference_cost(t.dataset, t.n, t.seed)
            bar.update()
    else:
        futures = {pool.submit(reference_cost, t.dataset, t.n, t.seed): key for key, t in instances.items()}
        for future in concurrent.futures.as_completed(futures):
            out[futures[future]] = future.result()
            bar.update()
    bar.close()
    return out


def run_suite(suite: Suite, *, jobs: int = 1, via_grpc: bool = False, protocols: Sequence[str] | None = None,
              quiet: bool = False, done: Iterable[tuple[str, str, int, str, int]] = (),
              on_record: Callable[[RunRecord], None] | None = None) -> tuple[list[RunRecord], float]:
    """Run every task of ``suite`` whose key is not in ``done``; returns the records and the wall time.

    ``on_record`` sees each record as soon as its run finishes (the journal of :func:`main`).
    """
    skip = set(done)
    tasks = [t for t in build_tasks(suite, via_grpc=via_grpc, protocols=protocols) if t.key not in skip]
    # Big data sets first, so the long runs do not trail at the end.
    tasks.sort(key=lambda t: (-t.n, t.dataset.label, t.protocol, epsilon_label(t.epsilon), t.seed))
    started = time.perf_counter()
    collector: contextlib.AbstractContextManager[tuple[str | None, str | None]] = (
        adapters.start_collector() if via_grpc else contextlib.nullcontext((None, None)))
    with collector as (address, token):
        adapters.configure_remote(address, token)
        pool = _executor(jobs, address, token) if jobs > 1 else None
        try:
            refs = _references(tasks, pool, quiet)
            bar = tqdm(total=len(tasks), desc=f"suite {suite.name}", unit="run", disable=quiet)
            records: list[RunRecord] = []
            if pool is None:
                for t in tasks:
                    records.append(run_task(t, refs[(t.dataset.label, t.n, t.seed)]))
                    if on_record is not None:
                        on_record(records[-1])
                    bar.update()
            else:
                futures = [pool.submit(run_task, t, refs[(t.dataset.label, t.n, t.seed)]) for t in tasks]
                for future in concurrent.futures.as_completed(futures):
                    records.append(future.result())
                    if on_record is not None:
                        on_record(records[-1])
                    bar.update()
            bar.close()
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
    return records, time.perf_counter() - started


# -- aggregation and checks ----------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Cell:
    """Every seed of one (protocol, dataset, n, epsilon): per metric the median, quartiles and every seed's value."""

    protocol: str
    dataset: str
    n: int
    epsilon: str
    seeds: int
    median: dict[str, float]
    q1: dict[str, float]
    q3: dict[str, float]
    values: dict[str, list[float]]
    seconds: float

    @property
    def key(self) -> tuple[str, str, int, str]:
        return self.protocol, self.dataset, self.n, self.epsilon

    def tail(self, metric: str) -> tuple[str, float]:
        """The 10th-percentile seed on the bad side of ``metric``, as ``(percentile label, value)``.

        ``("p10", v)`` for scores (higher is better), ``("p90", v)`` for costs and ratios: the value of
        an observed seed (no interpolation), so a figure shows how bad one seed in ten gets, not only
        the median. Over fewer than 10 seeds it is the worst seed.
        """
        values = self.values[metric]
        if metric in _LOWER_IS_BETTER:
            return "p90", float(np.quantile(values, 0.9, method="higher"))
        return "p10", float(np.quantile(values, 0.1, method="lower"))


#: Seeds a headline figure needs (a median over at least this many, with its 10th-percentile seed).
HEADLINE_SEEDS = 10


def aggregate(records: Sequence[RunRecord]) -> dict[tuple[str, str, int, str], Cell]:
    """Cells of the successful records, keyed by (protocol, dataset, n, epsilon label)."""
    groups: dict[tuple[str, str, int, str], list[RunRecord]] = defaultdict(list)
    for r in records:
        if r.error is None:
            groups[(r.protocol, r.dataset, r.n, r.epsilon)].append(r)
    cells = {}
    for key, rs in groups.items():
        rs.sort(key=lambda r: r.seed)
        names = sorted({m for r in rs for m in r.metrics})
        values = {m: [r.metrics[m] for r in rs if m in r.metrics and not math.isnan(r.metrics[m])] for m in names}
        values = {m: v for m, v in values.items() if v}
        cells[key] = Cell(protocol=key[0], dataset=key[1], n=key[2], epsilon=key[3], seeds=len(rs),
                          median={m: float(np.median(v)) for m, v in values.items()},
                          q1={m: float(np.quantile(v, 0.25)) for m, v in values.items()},
                          q3={m: float(np.quantile(v, 0.75)) for m, v in values.items()},
                          values=values, seconds=float(np.median([r.seconds for r in rs])))
    return cells


@dataclass(kw_only=True)
class CheckResult:
    """One verified statement: a claim's cell, a bound, a regression entry or a failed run."""

    kind: str
    id: str
    statement: str
    passed: bool
    detail: str
    required: bool = True


def check_claims(claims: Sequence[Claim], cells: dict[tuple[str, str, int, str], Cell]) -> list[CheckResult]:
    """Every cell of every claim (missing cells are skipped: a protocol filter may have removed them)."""
    out = []
    for claim in claims:
        for dataset_label in claim.datasets:
            for n in claim.ns:
                for eps_better, eps_worse in claim.epsilon_pairs:
                    better = cells.get((claim.better, dataset_label, n, epsilon_label(eps_better)))
                    worse = cells.get((claim.worse, dataset_label, n, epsilon_label(eps_worse)))
                    if better is None or worse is None or claim.metric not in better.median \
                            or claim.metric not in worse.median:
                        continue
                    b, w = better.median[claim.metric], worse.median[claim.metric]
                    passed = b <= w + claim.margin if claim.lower_is_better else b >= w - claim.margin
                    relation = "<=" if claim.lower_is_better else ">="
                    margin = f" {'+' if claim.lower_is_better else '-'} {claim.margin:g}" if claim.margin else ""
                    detail = (f"{dataset_label}, n={n}: {claim.better}(eps={epsilon_label(eps_better)}) "
                              f"{claim.metric} {b:.4g} {relation} {claim.worse}(eps={epsilon_label(eps_worse)}) "
                              f"{w:.4g}{margin}")
                    out.append(CheckResult(kind="claim", id=claim.id, statement=claim.statement, passed=passed,
                                           detail=detail, required=claim.required))
    return out


def check_bounds(bounds: Sequence[Bound], records: Sequence[RunRecord], *, complete: bool = True) -> list[CheckResult]:
    """Every bound against every matching successful run.

    A bound's (protocol, data set) cell without any successful run is a failed check, never a silent
    pass: required when the run was ``complete`` (the whole suite), reported when it was cut
    (``--protocols``, ``--ns``) and may have left the cell out on purpose.
    """
    out = []
    for bound in bounds:
        matching = [r for r in records if r.error is None and r.protocol in bound.protocols
                    and r.dataset in bound.datasets and r.epsilon == epsilon_label(bound.epsilon)
                    and (not bound.ns or r.n in bound.ns)]
        for protocol in bound.protocols:
            for dataset_label in bound.datasets:
                values = [r.metrics.get(bound.metric, math.nan) for r in matching
                          if r.protocol == protocol and r.dataset == dataset_label]
                where = f"{protocol} on {dataset_label} (eps={epsilon_label(bound.epsilon)}" + (
                    f", n={'/'.join(str(n) for n in bound.ns)})" if bound.ns else ")")
                if not values:
                    out.append(CheckResult(kind="bound", id=bound.id, statement=bound.statement, passed=False,
                                           required=complete, detail=f"{where}: no successful run to check"))
                    continue
                runs = len(values)
                if bound.over == "median":
                    values = [float(np.median(values))]
                worst_high, worst_low = max(values), min(values)
                passed = not any(math.isnan(v) for v in values)
                if bound.maximum is not None:
                    passed = passed and worst_high <= bound.maximum
                if bound.minimum is not None:
                    passed = passed and worst_low >= bound.minimum
                limits = " and ".join(s for s in (
                    f"<= {bound.maximum:g}" if bound.maximum is not None else "",
                    f">= {bound.minimum:g}" if bound.minimum is not None else "") if s)
                seen = (f"median {worst_low:.4f} over {runs} seeds" if bound.over == "median"
                        else f"in [{worst_low:.4f}, {worst_high:.4f}] over {runs} runs")
                detail = f"{where}: {bound.metric} {seen}, required {limits}"
                out.append(CheckResult(kind="bound", id=bound.id, statement=bound.statement, passed=passed,
                                       detail=detail))
    return out


def check_densest_regions(records: Sequence[RunRecord], required: Sequence[str] = ()) -> list[CheckResult]:
    """One check per 2-D run: its densest true cell is in a cluster (:func:`densest_region_clustered`);
    a failure fails the suite for the ``required`` protocols (:attr:`Suite.densest_required`), else it is reported."""
    return [CheckResult(kind="densest", id="densest-region",
                        statement="the densest cell of the true points' histogram is in a cluster, not noise",
                        passed=bool(r.densest_region_clustered), required=r.protocol in required,
                        detail=f"{r.protocol} / {r.dataset} / n={r.n} / eps={r.epsilon} / seed={r.seed}")
            for r in records if r.error is None and r.densest_region_clustered is not None]


#: Significance level of the variant verdict's paired test.
VERDICT_ALPHA = 0.05
#: Fewest common seeds the verdict tests on: the two-sided exact Wilcoxon signed-rank test over ``m``
#: nonzero paired differences has smallest p-value ``2 / 2^m`` (every difference of one sign), 0.0625 at
#: m = 5 and 0.03125 at m = 6, so below 6 seeds no outcome could reach ``VERDICT_ALPHA``.
VERDICT_MIN_SEEDS = 6
#: The uniform grid every grid variant is judged against (papers/002's baseline).
VERDICT_BASELINE = "ugc"


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Whether ``protocol`` beats ``against`` on ``metric`` in one (dataset, n, epsilon) cell over their common seeds.

    ``verdict`` is ``"wins"``, ``"loses"``, ``"no difference"`` (two-sided Wilcoxon signed-rank test on the
    paired per-seed values, :data:`VERDICT_ALPHA`) or ``"too few seeds"`` (fewer than
    :data:`VERDICT_MIN_SEEDS` common seeds); ``median_difference`` is the median of ``protocol - against``
    over the common seeds.
    """

    dataset: str
    n: int
    epsilon: str
    protocol: str
    against: str
    metric: str
    seeds: int
    median_difference: float
    p_value: float | None
    verdict: str


def paired_comparison(a: Sequence[float], b: Sequence[float]) -> tuple[float | None, str]:
    """``(p, verdict)`` of ``a`` against ``b`` (paired by position, higher is better), see :class:`Comparison`."""
    from scipy.stats import wilcoxon  # type: ignore[import-untyped, unused-ignore]

    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if len(diff) < VERDICT_MIN_SEEDS:
        return None, "too few seeds"
    nonzero = diff[diff != 0]
    if len(nonzero) == 0:
        return 1.0, "no difference"
    p = float(wilcoxon(diff, zero_method="wilcox", alternative="two-sided").pvalue)
    if p >= VERDICT_ALPHA:
        return p, "no difference"
    # The direction of a significant test: the larger signed-rank sum.
    ranks = np.argsort(np.argsort(np.abs(nonzero))) + 1.0
    return p, "wins" if ranks[nonzero > 0].sum() > ranks[nonzero < 0].sum() else "loses"


def variant_verdicts(records: Sequence[RunRecord], protocols: Sequence[str], metric: str = "ari") -> list[Comparison]:
    """Every ordered pair of ``protocols`` in every (dataset, n, epsilon) cell where both ran, over their common seeds."""
    per_seed: dict[tuple[str, str, int, str], dict[int, float]] = defaultdict(dict)
    for r in records:
        value = r.metrics.get(metric, math.nan)
        if r.error is None and r.protocol in protocols and not math.isnan(value):
            per_seed[(r.protocol, r.dataset, r.n, r.epsilon)][r.seed] = value
    out = []
    for dataset_label, n, eps in sorted({key[1:] for key in per_seed}):
        for protocol in protocols:
            for against in protocols:
                mine, theirs = per_seed.get((protocol, dataset_label, n, eps)), per_seed.get((against, dataset_label, n, eps))
                if protocol == against or not mine or not theirs:
                    continue
                common = sorted(set(mine) & set(theirs))
                if not common:
                    continue
                a, b = [mine[s] for s in common], [theirs[s] for s in common]
                p, verdict = paired_comparison(a, b)
                out.append(Comparison(dataset=dataset_label, n=n, epsilon=eps, protocol=protocol, against=against,
                                      metric=metric, seeds=len(common),
                                      median_difference=float(np.median(np.subtract(a, b))), p_value=p,
                                      verdict=verdict))
    return out


def verdict_summary(comparisons: Sequence[Comparison]) -> dict[str, Any]:
    """Per protocol the cells it wins against each other one, and the protocol winning most cells.

    ``{"wins": {protocol: {against: cells}}, "cells": {protocol: cells won in total}, "default": [names]}``
    (``default``: every protocol with the most cells won, several on a tie; empty without comparisons).
    """
    protocols = sorted({c.protocol for c in comparisons} | {c.against for c in comparisons})
    wins = {p: {q: sum(c.protocol == p and c.against == q and c.verdict == "wins" for c in comparisons)
                for q in protocols if q != p} for p in protocols}
    cells = {p: sum(w.values()) for p, w in wins.items()}
    best = max(cells.values(), default=0)
    return {"wins": wins, "cells": cells, "default": [p for p in protocols if cells[p] == best] if comparisons else []}


def _load_regressions(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    entries = data.get("entries", [])
    if not isinstance(entries, list):
        raise ValueError(f"{path}: 'entries' must be a list")
    return entries


def check_regressions(suite: Suite, cells: dict[tuple[str, str, int, str], Cell], path: Path = REGRESSIONS_PATH,
                      *, complete: bool = True) -> list[CheckResult]:
    """Compare the suite's cells with ``path``; a recorded cell the run did not produce fails when ``complete``."""
    out = []
    for entry in _load_regressions(path):
        if entry.get("suite") != suite.name:
            continue
        key = (entry["protocol"], entry["dataset"], int(entry["n"]), str(entry["epsilon"]))
        metric = entry["metric"]
        name = f"{key[0]} / {key[1]} / n={key[2]} / eps={key[3]} / {metric}"
        cell = cells.get(key)
        if cell is None or metric not in cell.median:
            if complete:
                out.append(CheckResult(kind="regression", id="regressions.json", statement="recorded cell ran",
                                       passed=False, detail=f"{name}: recorded but not produced by this run"))
            continue
        now = cell.median[metric]
        recorded = float(entry["median"])
        tolerance = float(entry["tolerance"])
        worse_by = now - recorded if entry["lower_is_better"] else recorded - now
        passed = worse_by <= tolerance
        # An entry marked "enforced": false (with its "reason") is compared and reported, never a failure.
        enforced = bool(entry.get("enforced", True))
        reason = "" if enforced else f"; not enforced: {entry.get('reason', 'no reason given')}"
        out.append(CheckResult(kind="regression", id="regressions.json", statement="no regression beyond tolerance",
                               passed=passed, required=enforced,
                               detail=f"{name}: median {now:.4g}, recorded {recorded:.4g} +- {tolerance:.3g} "
                                      f"({'worse' if worse_by > 0 else 'better'} by {abs(worse_by):.3g}){reason}"))
    return out


def record_regressions(suite: Suite, cells: dict[tuple[str, str, int, str], Cell],
                       path: Path = REGRESSIONS_PATH) -> int:
    """Replace ``suite``'s entries of the protocols in ``cells`` with the current medians and tolerances.

    Tolerance = max(absolute floor 0.02 for scores in [0, 1] or 5% of the median for costs and
    ratios, the distance from the median to the worst seed). A check then fails only when the
    suite's median is worse than every recorded seed (beyond the floor): after a change that
    redraws the random streams but keeps the distributions, a median of ``s`` new seeds does that
    with probability ``C(s, h) / C(N + s, h)``, ``h = (s + 1) // 2``, over ``N`` recorded seeds
    (exchangeable draws, whatever their distribution), hence the 20 :attr:`Suite.tuning_seeds`.
    Entries of other suites, and of protocols this run left out (``--protocols``), are kept.
    Returns the number of entries written.
    """
    protocols = {c.protocol for c in cells.values()}
    kept = [e for e in _load_regressions(path) if e.get("suite") != suite.name or e.get("protocol") not in protocols]
    fresh = []
    for cell in sorted(cells.values(), key=lambda c: c.key):
        for metric in suite.regression_metrics:
            if metric not in cell.median:
                continue
            median = cell.median[metric]
            lower = metric in _LOWER_IS_BETTER
            floor = _RELATIVE_TOLERANCE * abs(median) if lower else _ABSOLUTE_TOLERANCE
            worst_gap = max(cell.values[metric]) - median if lower else median - min(cell.values[metric])
            tolerance = max(floor, _ABSOLUTE_TOLERANCE / 2, worst_gap)
            fresh.append({"suite": suite.name, "protocol": cell.protocol, "dataset": cell.dataset, "n": cell.n,
                          "epsilon": cell.epsilon, "metric": metric, "median": round(median, 6),
                          "tolerance": round(tolerance, 6), "lower_is_better": lower,
                          "seeds": len(cell.values[metric])})
    data = {
        "description": _REGRESSIONS_DESCRIPTION,
        "entries": kept + fresh,
    }
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return len(fresh)


#: Metrics where lower is better (everything else: higher is better).
_LOWER_IS_BETTER = frozenset({"cost_ratio", "cost", "cost_per_point", "nicv", "center_error", "noise_share",
                              "cost_over_floor", "center_error_over_floor"})


# -- entry point ---------------------------------------------------------------------------------------

def _environment() -> dict[str, Any]:
    import importlib.metadata as md

    def version(dist: str) -> str:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return "missing"

    return {"python": platform.python_version(), "numpy": np.__version__, "scikit-learn": version("scikit-learn"),
            "cpus": os.cpu_count(), "platform": platform.platform(),
            "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from .suites import SUITES

    parser = argparse.ArgumentParser(prog="benchmarks/run.py",
                                     description="Run a clustering benchmark suite (see benchmarks/README.md).")
    parser.add_argument("--suite", required=True, choices=tuple(SUITES), help="which matrix to run")
    parser.add_argument("--via-grpc", action="store_true",
                        help="drive the collector-backed protocols through a real gRPC collector on 127.0.0.1")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default benchmarks/results/<suite>)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="parallel worker processes (default min(2, CPUs); 1 runs in this process)")
    parser.add_argument("--protocols", nargs="+", default=None, help="run only these protocols")
    parser.add_argument("--ns", nargs="+", type=int, default=None, metavar="N",
                        help="run only the blocks at these population sizes (their bounds only)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--record-regressions", action="store_true",
                        help="write this run's medians as the suite's entries of harness/regressions.json; "
                             "tuning: only with --tuning (over all the suite's tuning seeds unless --seeds says "
                             "otherwise)")
    parser.add_argument("--tuning", action="store_true",
                        help="run every block over the suite's tuning seeds instead of its reporting seeds")
    parser.add_argument("--seeds", type=int, default=None,
                        help="run every block over the first N reporting seeds (tuning seeds with --tuning)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--merge", nargs="+", type=Path, default=(), metavar="RESULTS_JSON",
                        help="also count the runs of these earlier results.json files of the same suite (a run of "
                             "this invocation replaces an earlier one of the same protocol, data, n, epsilon "
                             "and seed), so a suite can be run in pieces")
    parser.add_argument("--resume", action="store_true",
                        help=f"continue an interrupted run in the same --out directory: the finished runs its "
                             f"{JOURNAL} holds are counted, not run again (a failed one is run again)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    return args


def load_records(path: Path, suite: str) -> list[RunRecord]:
    """The runs of an earlier ``results.json`` of ``suite``; :class:`ValueError` (one line) when it is not one."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"--merge {path}: cannot read it as a results.json ({exc})") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("records"), list):
        raise ValueError(f"--merge {path}: not a results.json written by benchmarks/run.py (no records)")
    if saved.get("suite") != suite:
        raise ValueError(f"--merge {path}: holds suite {saved.get('suite')!r}, this run is suite {suite!r}")
    return [_record_from_json(raw, f"--merge {path}: record {i}") for i, raw in enumerate(saved["records"])]


def _record_from_json(raw: Any, where: str) -> RunRecord:
    """A :class:`RunRecord` from its :meth:`RunRecord.to_json`; :class:`ValueError` naming ``where`` otherwise."""
    if not isinstance(raw, dict) or not {"protocol", "dataset", "n", "epsilon", "seed"} <= set(raw):
        raise ValueError(f"{where} is not a run record")
    names = {f.name for f in fields(RunRecord)} - {"labels", "cell_map"}
    try:
        record = RunRecord(**{key: value for key, value in raw.items() if key in names})
    except TypeError as exc:  # a field missing
        raise ValueError(f"{where} is not a run record ({exc})") from None
    # JSON holds a non-finite metric as null or a string (:func:`_finite`); read it back as a float.
    record.metrics = {key: _unfinite(v) for key, v in record.metrics.items()}
    record.diagnostics = {key: _unfinite(v) for key, v in record.diagnostics.items()}
    return record


#: Each finished run of a suite, one JSON line apiece, written as it completes, so a stopped run can resume.
JOURNAL = "runs.jsonl"


def load_journal(path: Path, suite: str) -> list[RunRecord]:
    """The finished runs of an interrupted run of ``suite`` (none when there is no journal).

    The first line names the suite; a last line cut short by the interruption is dropped (that run is run
    again); any other unreadable line is a :class:`ValueError` (one line).
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ValueError(f"--resume: cannot read {path} ({exc})") from None
    if not lines:
        return []
    try:
        header = json.loads(lines[0])
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("suite") != suite:
        found = header.get("suite") if isinstance(header, dict) else None
        raise ValueError(f"--resume: {path} is not a journal of suite {suite!r} (its first line names {found!r})")
    records = []
    for number, line in enumerate(lines[1:], start=2):
        try:
            raw = json.loads(line)
        except ValueError:
            if number == len(lines):
                break  # the write the interruption cut short
            raise ValueError(f"--resume: {path} line {number} is not JSON") from None
        records.append(_record_from_json(raw, f"--resume: {path} line {number}"))
    return records


def _record_key(r: RunRecord) -> tuple[str, str, int, str, int]:
    return r.protocol, r.dataset, r.n, r.epsilon, r.seed


def _unfinite(value: float | str | None) -> float:
    return math.nan if value is None else float(value)


def merge_records(earlier: Sequence[RunRecord], records: Sequence[RunRecord]) -> list[RunRecord]:
    """``records`` and the ``earlier`` runs none of them repeats (same protocol, data, n, epsilon and seed)."""
    merged = {_record_key(r): r for r in earlier}
    merged.update((_record_key(r), r) for r in records)
    return list(merged.values())


def plan_seeds(suite: Suite, *, tuning: bool, count: int | None, record: bool) -> Suite:
    """``suite`` over the seeds this run may use; :class:`ValueError` (one line) for a run that breaks the split.

    A reporting run runs the blocks' own seeds (or the first ``count`` reporting seeds), all of them
    reporting seeds; a tuning run runs the tuning seeds (all, or the first ``count``). Recording
    regressions is tuning: it is refused on the reporting seeds.
    """
    if record and not tuning:
        raise ValueError(f"--record-regressions tunes the {suite.name} suite: run it on its tuning seeds (--tuning), "
                         "never on the reporting seeds")
    pool = suite.tuning_seeds if tuning else suite.reporting_seeds
    kind = "tuning" if tuning else "reporting"
    if count is not None:
        if count > len(pool):
            raise ValueError(f"--seeds {count}: the {suite.name} suite declares only {len(pool)} {kind} seeds")
        return suite.with_seeds(pool[:count])
    if tuning:
        return suite.with_seeds(pool)
    stray = sorted({s for b in suite.blocks for s in b.seeds} - set(pool))
    if stray:
        leaked = sorted(set(stray) & set(suite.tuning_seeds))
        what = f"tuning seeds {leaked}" if leaked else f"seeds {stray}, not declared reporting seeds"
        raise ValueError(f"the {suite.name} suite would report on {what}: its blocks must run reporting seeds only")
    return suite


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite, write everything, print the checks; 0 when every check passed, 1 otherwise (2: refused)."""
    from . import plots, tables

    args = parse_args(argv)
    try:
        suite = plan_seeds(get_suite(args.suite), tuning=args.tuning, count=args.seeds,
                           record=args.record_regressions)
        if args.ns:
            suite = suite.with_ns(tuple(args.ns))
        earlier = [r for path in args.merge for r in load_records(path, suite.name)]
        out_dir: Path = args.out or Path(__file__).resolve().parent.parent / "results" / suite.name
        # A run that failed is run again, not counted.
        resumed = [r for r in load_journal(out_dir / JOURNAL, suite.name) if r.error is None] if args.resume else []
    except ValueError as exc:
        print(f"benchmarks/run.py: refused: {exc}", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    if resumed:
        print(f"resuming: {len(resumed)} finished run(s) in {out_dir / JOURNAL}", file=sys.stderr)
    # The journal starts over with the resumed runs (written aside, then renamed over the old one, so an
    # interruption here loses nothing), which also drops a last line the interruption cut short.
    fresh_journal = out_dir / (JOURNAL + ".tmp")
    fresh_journal.write_text("".join(json.dumps(line) + "\n" for line in
                                     [{"suite": suite.name}, *(r.to_json() for r in resumed)]), encoding="utf-8")
    os.replace(fresh_journal, out_dir / JOURNAL)
    with (out_dir / JOURNAL).open("a", encoding="utf-8") as journal:
        def write(record: RunRecord) -> None:
            journal.write(json.dumps(record.to_json()) + "\n")
            journal.flush()

        fresh, wall = run_suite(suite, jobs=args.jobs, via_grpc=args.via_grpc, protocols=args.protocols,
                                quiet=args.quiet, done={_record_key(r) for r in resumed}, on_record=write)
    records = merge_records(earlier, merge_records(resumed, fresh))
    cells = aggregate(records)
    checks = [CheckResult(kind="run", id="run", statement="every run completes", passed=False,
                          detail=f"{r.protocol} / {r.dataset} / n={r.n} / eps={r.epsilon} / seed={r.seed}:\n{r.error}")
              for r in records if r.error is not None]
    checks += check_bounds(suite.bounds, records, complete=not (args.protocols or args.ns))
    checks += check_claims(suite.claims, cells)
    checks += check_densest_regions(records, suite.densest_required)
    if args.record_regressions:
        if any(not c.passed and c.required for c in checks):
            print("not recording regressions: the run has failures", file=sys.stderr)
        else:
            written = record_regressions(suite, cells, REGRESSIONS_PATH)
            print(f"recorded {written} regression entries for suite {suite.name} in {REGRESSIONS_PATH}")
    checks += check_regressions(suite, cells, REGRESSIONS_PATH, complete=not (args.protocols or args.ns))
    comparisons = variant_verdicts(records, GRID_PROTOCOLS)
    summary = {
        "suite": suite.name, "description": suite.description, "via_grpc": args.via_grpc, "jobs": args.jobs,
        "wall_seconds": round(wall, 2), "runs": len(records), "environment": _environment(),
        "checks": [asdict(c) for c in checks],
        "verdict": {"test": f"two-sided Wilcoxon signed-rank on the paired per-seed ARI, alpha = {VERDICT_ALPHA}, "
                            f"at least {VERDICT_MIN_SEEDS} common seeds",
                    "comparisons": [asdict(c) for c in comparisons], "summary": verdict_summary(comparisons)},
        "records": [r.to_json() for r in sorted(records, key=lambda r: (r.protocol, r.dataset, r.n, r.epsilon,
                                                                         r.seed))],
    }
    (out_dir / "results.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    verdict = tables.verdict_report(comparisons)
    table = tables.suite_report(suite, cells, checks, wall=wall, runs=len(records), jobs=args.jobs,
                                via_grpc=args.via_grpc) + (f"\n{verdict}" if comparisons else "")
    (out_dir / "table.md").write_text(table, encoding="utf-8")
    if comparisons:
        (out_dir / "verdict.md").write_text(verdict, encoding="utf-8")
    (out_dir / "summary.md").write_text(tables.summary_report(suite, cells, checks, wall=wall, runs=len(records),
                                                              jobs=args.jobs), encoding="utf-8")
    if not args.no_plots:
        written_plots = plots.suite_plots(suite, cells, records, out_dir)
        print(f"wrote {len(written_plots)} plots under {out_dir}")
    print(table)
    failed = [c for c in checks if not c.passed and c.required]
    print(f"suite {suite.name}: {len(records)} runs in {wall:.1f} s with {args.jobs} job(s); results in {out_dir}")
    if failed:
        lines = [f"SUITE {suite.name.upper()} FAILED: {len(failed)} check(s) did not pass"]
        lines += [f"  [{c.kind} {c.id}] {c.detail}" for c in failed]
        print("\n".join(lines), file=sys.stderr)
        return 1
    reported = sum(not c.passed for c in checks)
    print(f"suite {suite.name}: {len(checks) - reported} of {len(checks)} checks passed, every required one"
          + (f"; {reported} reported-only check(s) did not (the Checks section names them)" if reported else ""))
    return 0
