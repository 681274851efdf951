"""Grid clustering (campaign kind ``grid``, AGCluster) measured: quality, granularity, dimension, server time.

Every grid run is a whole campaign through the in-process collector (the real engine and store;
devices simulated with the SDK's code, ``mode="direct"``). The server step is the time spent in
the engine's ``close_round`` over all rounds (estimation, refinement, aggregation); ingestion is
not part of it (see ``ingest_throughput.py``). The LDP floors (discrete-Laplace points + k-means;
one OUE grid histogram + weighted k-means) and non-private k-means++ run on the same points.

Experiments (``--experiment``)
    ``acceptance``  moons, circles, anisotropic blobs at (n, epsilon) = (1e6, 2) and (1e5, 4): UGC,
                    AGC-tree, AGC-iter, the floors and k-means++ (ARI, noise share, clusters, server s).
    ``granularity`` the paper's Table 2 experiment: UGC at fixed levels around the rule's level,
                    and the paper's Theorem 1 against the unit-consistent rule.
    ``dimension``   Gaussian mixtures in d = 2, 4, 8 (k = 4): where the grid stops being useful.
    ``noise-limit`` the default (density) variant on ``--datasets`` (default rings) at the settings:
                    each campaign's published aggregation counts are split into the true counts
                    of the points (known to the simulation) and the estimation error, and clustered
                    again with that error scaled by f (as if the campaign had 1/f^2 times the
                    reports, at the level the rule chose): how far a data set is from its noise limit.
                    Seeds 0.. are tuning seeds (a diagnosis, not a reported figure).

Usage::

    PYTHONPATH=packages/ldp-client/src:packages/ldp-proto/src:packages/ldp-collector/src:. \\
        python benchmarks/grid_clustering.py --experiment acceptance --seeds 1 --out benchmarks/results/grid
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from numpy.typing import NDArray

from ldp.v1 import campaigns_pb2
from ldp_collector.core import Collector
from ldp_collector.kinds.grid import DEFAULT_MAX_CELLS, GridEngine
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import DATASETS as KNOWN_DATASETS
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.evaluation import evaluate_clustering
from ldp_collector.simulation.population import numeric_bounds
from ldp_collector.simulation.runner import run_campaign
from ldp_collector.simulation.scores import adjusted_rand_index
from ldp_collector.storage import open_store

VARIANTS = {"ugc": "UNIFORM", "agc-tree": "TREE", "agc-iter": "ITERATIVE"}


class _Timer:
    """Accumulates the time spent in ``GridEngine.close_round`` (the server step)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._original = GridEngine.close_round

    def __enter__(self) -> _Timer:
        timer = self
        original = self._original

        def timed(engine: GridEngine, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(engine, *args, **kwargs)
            finally:
                timer.seconds += time.perf_counter() - started

        GridEngine.close_round = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        GridEngine.close_round = self._original  # type: ignore[method-assign]


def grid_config(x: NDArray[np.float64], epsilon: float, variant: str, *, granularity: str = "CONSISTENT",
                level: int = 0, policy: int = campaigns_pb2.PARTITION) -> campaigns_pb2.CampaignConfig:
    lo, hi = numeric_bounds(x)
    config = campaigns_pb2.CampaignConfig(kind=campaigns_pb2.GRID, epsilon=epsilon, budget_policy=policy)  # type: ignore[arg-type]
    config.domain.numeric.lower.extend(lo)
    config.domain.numeric.upper.extend(hi)
    config.grid.variant = getattr(campaigns_pb2.GridParameters, VARIANTS.get(variant, variant))
    config.grid.granularity = getattr(campaigns_pb2.GridParameters, granularity)
    config.grid.granularity_level = level
    return config


def run_grid(x: NDArray[np.float64], y: NDArray[np.int64] | None, epsilon: float, variant: str, seed: int,
             **options: Any) -> dict[str, float]:
    """One grid campaign; scores, rounds, server-step seconds and the engine's diagnostics."""
    config = grid_config(x, epsilon, variant, **options)
    with tempfile.TemporaryDirectory(prefix="ldp-grid-bench-") as data_dir, _Timer() as timer:
        store = open_store(data_dir)
        try:
            started = time.perf_counter()
            run = run_campaign(Collector(store), config_from_proto(config), x, seed=seed, mode="direct", quiet=True)
            wall = time.perf_counter() - started
        finally:
            store.close()
    scores = evaluate_clustering(run.result, x, y)
    diag = dict(run.result.diagnostics)
    return {
        "ari": scores.get("ari", math.nan), "noise_share": scores["noise_share"], "clusters": scores["clusters"],
        "rounds": float(run.stats.rounds), "server_s": timer.seconds, "wall_s": wall,
        "epsilon_per_device": run.stats.epsilon_per_device,
        "level": diag.get("granularity_level", math.nan), "final_cells": diag.get("final_cells", math.nan),
        "dense_share": diag.get("dense_share", math.nan),
        "granularity_paper": diag.get("granularity_paper", math.nan),
        "granularity_consistent": diag.get("granularity_consistent", math.nan),
    }


def run_floor(name: str, x: NDArray[np.float64], y: NDArray[np.int64] | None, k: int, epsilon: float,
              seed: int) -> dict[str, float]:
    """An LDP floor or k-means++ from the harness, scored by ARI on nearest-center labels."""
    from benchmarks.harness.adapters import collector_backend
    from benchmarks.harness.baselines import discrete_laplace_kmeans, kmeans_plus_plus_baseline, oue_grid_kmeans

    started = time.perf_counter()
    if name == "ldp-laplace-points":
        out = discrete_laplace_kmeans(x, k, epsilon, seed=seed)
    elif name == "ldp-oue-grid":
        with collector_backend(False) as backend:
            out = oue_grid_kmeans(x, k, epsilon, seed=seed, backend=backend)
    else:
        out = kmeans_plus_plus_baseline(x, k, seed=seed)
    wall = time.perf_counter() - started
    assert out.centers is not None
    d2 = ((x[:, None, :] - out.centers[None, :, :]) ** 2).sum(axis=2) if len(x) <= 200_000 else None
    labels = d2.argmin(axis=1) if d2 is not None else _nearest(x, out.centers)
    ari = adjusted_rand_index(y, labels) if y is not None else math.nan
    return {"ari": ari, "noise_share": 0.0, "clusters": float(len(out.centers)), "wall_s": wall}


def _nearest(x: NDArray[np.float64], centers: NDArray[np.float64]) -> NDArray[np.int64]:
    out = np.empty(len(x), dtype=np.int64)
    for start in range(0, len(x), 100_000):
        chunk = x[start:start + 100_000]
        out[start:start + len(chunk)] = ((chunk[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2).argmin(axis=1)
    return out


SETTINGS: tuple[tuple[float, float], ...] = ((1e6, 2.0), (1e5, 4.0))


DATASETS: tuple[str, ...] = ("moons", "circles", "aniso")
_ACCEPTANCE_DATASETS = DATASETS
FLOORS: tuple[str, ...] = ("ldp-laplace-points", "ldp-oue-grid", "kmeans++")
_K = {"moons": 2, "circles": 2, "aniso": 3}


def _rows_acceptance(seeds: int, scale: float) -> Iterator[dict[str, Any]]:
    for n, epsilon in ((int(n_ * scale), eps_) for n_, eps_ in SETTINGS):
        for dataset, k in ((name, _K[name]) for name in DATASETS):
            for seed in range(seeds):
                x, y = make_dataset(dataset, n, seed=seed)
                for variant in VARIANTS:
                    yield {"dataset": dataset, "n": n, "epsilon": epsilon, "method": variant, "seed": seed,
                           **run_grid(x, y, epsilon, variant, seed)}
                for floor in FLOORS:
                    yield {"dataset": dataset, "n": n, "epsilon": epsilon, "method": floor, "seed": seed,
                           **run_floor(floor, x, y, k, epsilon, seed)}


GRANULARITY_EPSILONS: tuple[float, ...] = (4.0, 2.0, 1.0)


def _rows_granularity(seeds: int, scale: float) -> Iterator[dict[str, Any]]:
    for n, epsilon in ((int(1e5 * scale), eps) for eps in GRANULARITY_EPSILONS):
        for dataset in ("moons", "circles", "aniso"):
            for seed in range(seeds):
                x, y = make_dataset(dataset, n, seed=seed)
                rule = run_grid(x, y, epsilon, "ugc", seed)
                yield {"dataset": dataset, "n": n, "epsilon": epsilon, "method": "ugc consistent rule", "seed": seed,
                       **rule}
                yield {"dataset": dataset, "n": n, "epsilon": epsilon, "method": "ugc paper rule", "seed": seed,
                       **run_grid(x, y, epsilon, "ugc", seed, granularity="PAPER")}
                base = int(rule["level"])
                top = int(math.floor(math.log2(DEFAULT_MAX_CELLS) / x.shape[1] + 1e-12))
                for level in range(max(1, base - 2), min(base + 2, top) + 1):
                    if level == base:
                        continue
                    yield {"dataset": dataset, "n": n, "epsilon": epsilon, "method": f"ugc level {level}",
                           "seed": seed, **run_grid(x, y, epsilon, "ugc", seed, level=level)}


def _rows_dimension(seeds: int, scale: float) -> Iterator[dict[str, Any]]:
    for d in (2, 4, 8):
        for n, epsilon in ((int(1e6 * scale), 2.0), (int(1e5 * scale), 4.0)):
            for seed in range(seeds):
                x, y = make_dataset("mixture", n, d=d, k=4, seed=seed)
                for variant in ("ugc", "agc-tree"):
                    yield {"dataset": f"mixture d={d} k=4", "n": n, "epsilon": epsilon, "method": variant,
                           "seed": seed, **run_grid(x, y, epsilon, variant, seed)}
                yield {"dataset": f"mixture d={d} k=4", "n": n, "epsilon": epsilon, "method": "ldp-oue-grid",
                       "seed": seed, **run_floor("ldp-oue-grid", x, y, 4, epsilon, seed)}


def _rows_device(seeds: int, scale: float) -> Iterator[dict[str, Any]]:
    """Device cost of one grid report: encode against the round's grid, then randomize (OS CSPRNG).

    The grids are the ones a moons campaign at n = 1e5, epsilon = 4 actually publishes (the
    calibration grid, each tree level, the final irregular cell list).
    """
    from ldp_client.rng import SecureRng
    from ldp_client.spec import RoundSpec

    x, y = make_dataset("moons", int(1e5 * scale), seed=0)
    specs: list[RoundSpec] = []
    original = GridEngine.close_round

    def capture(engine: GridEngine, spec: RoundSpec, *args: Any, **kwargs: Any) -> Any:
        specs.append(spec)
        outcome = original(engine, spec, *args, **kwargs)
        if outcome.next_round is not None:
            specs.append(outcome.next_round.spec)
        return outcome

    GridEngine.close_round = capture  # type: ignore[method-assign]
    try:
        run_grid(x, y, 4.0, "agc-tree", 0)
    finally:
        GridEngine.close_round = original  # type: ignore[method-assign]
    seen: set[int] = set()
    points = [tuple(p) for p in x[:2000].tolist()]
    for spec in specs:
        if spec.round in seen:
            continue
        seen.add(spec.round)
        for task in spec.tasks:
            component = task.components[0]
            rng = SecureRng()
            times = []
            for point in points:
                started = time.perf_counter()
                payload = component.run(point, rng=rng)
                times.append(time.perf_counter() - started)
            size = len(msgpack.packb(component.mechanism.check_payload(payload), use_bin_type=True))
            yield {"dataset": "moons", "n": len(x), "epsilon": 4.0, "method": f"round {spec.round} groups {task.groups}",
                   "seed": 0, "encoder": type(component.encoder).__name__, "cells": float(component.encoder.output_size),
                   "mechanism": component.mechanism.KIND, "median_us": statistics.median(times) * 1e6,
                   "payload_bytes": float(size)}


NOISE_FACTORS: tuple[float, ...] = (1.0, 0.93, 0.87, 0.8, 0.7, 0.5, 0.1)


def _rows_noise_limit(seeds: int, scale: float) -> Iterator[dict[str, Any]]:
    from ldp_collector.kinds.grid import _density_aggregation
    from ldp_collector.simulation.vector import encode_cells

    names = DATASETS if DATASETS != _ACCEPTANCE_DATASETS else ("rings",)
    for n, epsilon in ((int(n_ * scale), eps_) for n_, eps_ in SETTINGS):
        for dataset in names:
            for seed in range(seeds):
                x, y = make_dataset(dataset, n, seed=seed)
                config = grid_config(x, epsilon, "DENSITY")
                with tempfile.TemporaryDirectory(prefix="ldp-grid-bench-") as data_dir:
                    store = open_store(data_dir)
                    try:
                        run = run_campaign(Collector(store), config_from_proto(config), x, seed=seed, quiet=True)
                    finally:
                        store.close()
                clustering, estimates = run.result.clustering, run.result.estimates
                assert clustering is not None and clustering.cell_map is not None and estimates is not None
                cell_map = clustering.cell_map
                cells = list(cell_map.cells)
                counts = np.zeros(len(cells))
                se = np.zeros(len(cells))
                for e in estimates.estimates:
                    counts[e.value], se[e.value] = e.count, e.std_error
                reports = int(estimates.reports)
                position = encode_cells(cell_map.encoder, x).astype(np.int64)
                truth = np.bincount(position, minlength=len(cells)) * (reports / len(x))
                for factor in NOISE_FACTORS:
                    noisy = truth + factor * (counts - truth)
                    labels = _density_aggregation(cells, noisy, factor * se, reports, x.shape[1])[0]
                    yield {"dataset": dataset, "n": n, "epsilon": epsilon, "seed": seed,
                           "method": f"error x {factor:g} (reports x {1 / factor**2:.3g})",
                           "ari": adjusted_rand_index(y, labels[position]), "final_cells": float(len(cells)),
                           "level": float(run.result.diagnostics.get("granularity_level", math.nan))}


EXPERIMENTS = {"acceptance": _rows_acceptance, "granularity": _rows_granularity, "dimension": _rows_dimension,
               "device": _rows_device, "noise-limit": _rows_noise_limit}


def _markdown(rows: list[dict[str, Any]]) -> str:
    keys: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        keys.setdefault((row["dataset"], row["n"], row["epsilon"], row["method"]), []).append(row)
    lines = ["| data | n | eps | method | ARI median [worst seed] | noise share | clusters | level | cells | server s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    def med(group: list[dict[str, Any]], key: str) -> str:
        values = [r[key] for r in group if key in r and not math.isnan(r[key])]
        return f"{statistics.median(values):.3g}" if values else "-"

    def worst(group: list[dict[str, Any]], key: str) -> str:
        values = [r[key] for r in group if key in r and not math.isnan(r[key])]
        return f" [{min(values):.3g}]" if len(values) > 1 else ""

    for (dataset, n, epsilon, method), group in keys.items():
        lines.append(f"| {dataset} | {n:.0e} | {epsilon:g} | {method} | {med(group, 'ari')}{worst(group, 'ari')} | "
                     f"{med(group, 'noise_share')} | "
                     f"{med(group, 'clusters')} | {med(group, 'level')} | {med(group, 'final_cells')} | "
                     f"{med(group, 'server_s')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), required=True)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every n (quick looks: 0.1)")
    parser.add_argument("--out", type=Path, default=None, help="directory for <experiment>.json and .md")
    parser.add_argument("--settings", default=None,
                        help="acceptance (n, epsilon) pairs, e.g. '1e6:2,1e5:4' (the default)")
    parser.add_argument("--datasets", default=None, help="acceptance data sets, e.g. 'moons,circles'")
    parser.add_argument("--no-floors", action="store_true", help="acceptance: the grid variants only")
    parser.add_argument("--epsilons", default=None, help="granularity: epsilons, e.g. '4,2,1' (the default)")
    args = parser.parse_args(argv)
    global DATASETS, FLOORS, GRANULARITY_EPSILONS
    if args.epsilons:
        GRANULARITY_EPSILONS = tuple(float(e) for e in args.epsilons.split(","))
    if args.datasets:
        DATASETS = tuple(args.datasets.split(","))
        unknown = [name for name in DATASETS if name not in KNOWN_DATASETS]
        if unknown:
            parser.error(f"--datasets: unknown data set {unknown[0]!r}; known: {', '.join(sorted(KNOWN_DATASETS))}")
    if args.no_floors:
        FLOORS = ()
    if args.settings:
        global SETTINGS
        try:
            SETTINGS = tuple((float(a), float(b)) for a, b in (item.split(":") for item in args.settings.split(",")))
        except ValueError:
            parser.error(f"--settings: expected n:epsilon pairs such as '1e6:2,1e5:4', got {args.settings!r}")
    rows: list[dict[str, Any]] = []
    for row in EXPERIMENTS[args.experiment](args.seeds, args.scale):
        rows.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    table = _markdown(rows)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.experiment}.json").write_text(json.dumps(rows, indent=1))
        (args.out / f"{args.experiment}.md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
