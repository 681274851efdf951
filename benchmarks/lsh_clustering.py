"""LSH-tree k-means protocols measured: one-round net-tree (``nettree``) and Stemmer-style (``stemmer``).

Every run is a whole campaign through the in-process collector (the real engine and store;
devices simulated with the SDK's code, ``mode="direct"``). The server step is the time spent in the
engine's ``close_round`` over all rounds. The LDP floors (discrete-Laplace points + k-means; one
OUE grid histogram + weighted k-means) and non-private k-means run on the same points. Cost ratio =
k-means cost of the published centers on the true points / the best of 3 non-private k-means++
runs. ``epsilon = inf`` is the engine's own server step(s) on exact counts, sums and weights
(``noiseless_outcome`` in :mod:`ldp_collector.kinds.nettree` and :mod:`~ldp_collector.kinds.stemmer`):
the algorithm without noise.

Experiments (``--experiment``)
    ``nettree``   Google's demo generator, d in {10, 100}, k in {4, 8, 16} (``--dims``, ``--ks``),
                  epsilon in ``--epsilons`` (``inf`` allowed), n = ``--n``: ARI, cost ratio, server
                  seconds, the signal-to-noise diagnostic, leaves, coverage, the center-error floor.
    ``boundary``  nettree over n x epsilon x k at d = 10 (small n): ARI against the signal-to-noise
                  diagnostic; ``--plot`` draws it.
    ``stemmer``   Gaussian mixtures (``mixture``) d = 10, k = 8, epsilon in ``--epsilons``, with and
                  without the Lloyd round.
    ``scaling``   stemmer and nettree at ``--ns``: excess cost per point (cost - optimum) / n; ``--plot``
                  draws it on log-log axes beside an n^(-1/2) line.

Usage::

    PYTHONPATH=packages/ldp-client/src:packages/ldp-proto/src:packages/ldp-collector/src:. \\
        python benchmarks/lsh_clustering.py --experiment nettree --n 1000000 --dims 10 --ks 8 \\
        --epsilons 1 2 inf --out benchmarks/results/nettree_acceptance.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ldp.v1 import campaigns_pb2
from ldp_collector.campaigns import prepare_campaign
from ldp_collector.core import Collector
from ldp_collector.estimation.kmeans import assign
from ldp_collector.kinds.nettree import NetTreeEngine, noiseless_outcome
from ldp_collector.kinds.stemmer import StemmerEngine
from ldp_collector.kinds.stemmer import noiseless_outcome as stemmer_noiseless
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.population import numeric_bounds
from ldp_collector.simulation.runner import run_campaign
from ldp_collector.simulation.scores import adjusted_rand_index, kmeans_cost, reference_kmeans_cost
from ldp_collector.storage import open_store

FLOORS = ("ldp-laplace-points", "ldp-oue-grid")


class _Timer:
    """Accumulates the time spent in an engine class's ``close_round`` (the server step)."""

    def __init__(self, engine: type[Any]) -> None:
        self.engine = engine
        self.seconds = 0.0
        self._original = engine.close_round

    def __enter__(self) -> _Timer:
        timer, original = self, self._original

        def timed(engine: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(engine, *args, **kwargs)
            finally:
                timer.seconds += time.perf_counter() - started

        self.engine.close_round = timed
        return self

    def __exit__(self, *exc: object) -> None:
        self.engine.close_round = self._original


def config_for(kind: str, x: NDArray[np.float64], k: int, epsilon: float, campaign_id: str,
               **params: Any) -> campaigns_pb2.CampaignConfig:
    lo, hi = numeric_bounds(x)
    config = campaigns_pb2.CampaignConfig(kind=getattr(campaigns_pb2, kind.upper()), epsilon=epsilon,
                                          campaign_id=campaign_id)
    config.domain.numeric.lower.extend(lo)
    config.domain.numeric.upper.extend(hi)
    sub = getattr(config, kind)
    sub.k = k
    for key, value in params.items():
        setattr(sub, key, value)
    return config


def _scores(x: NDArray[np.float64], y: NDArray[np.int64], centers: NDArray[np.float64], reference: float) -> dict[str, float]:
    if centers.size == 0:
        return {"ari": math.nan, "cost_ratio": math.nan, "excess_cost_per_point": math.nan, "centers": 0.0}
    labels, _ = assign(x, centers)
    cost = kmeans_cost(x, centers)
    return {"ari": adjusted_rand_index(y, labels), "cost_ratio": cost / reference,
            "excess_cost_per_point": (cost - reference) / len(x), "centers": float(len(centers))}


def run_protocol(kind: str, x: NDArray[np.float64], y: NDArray[np.int64], k: int, epsilon: float, seed: int,
                 reference: float, **params: Any) -> dict[str, Any]:
    """One campaign (or, for nettree at epsilon = inf, the noiseless server step)."""
    campaign_id = f"bench-{kind}-{seed}-{epsilon:g}-{len(x)}-{k}"
    engine_cls = NetTreeEngine if kind == "nettree" else StemmerEngine
    started = time.perf_counter()
    if math.isinf(epsilon):
        engine = prepare_campaign(config_from_proto(config_for(kind, x, k, 1.0, campaign_id, **params))).engine
        if isinstance(engine, NetTreeEngine):
            outcome = noiseless_outcome(engine, x)
        else:
            assert isinstance(engine, StemmerEngine)
            outcome = stemmer_noiseless(engine, x)
        server = time.perf_counter() - started
        result, diagnostics = outcome.result, dict(outcome.diagnostics)
        rounds = 1.0
    else:
        config = config_for(kind, x, k, epsilon, campaign_id, **params)
        with tempfile.TemporaryDirectory(prefix=f"ldp-{kind}-bench-") as data_dir, _Timer(engine_cls) as timer:
            store = open_store(data_dir)
            try:
                run = run_campaign(Collector(store), config_from_proto(config), x, seed=seed, mode="direct", quiet=True)
            finally:
                store.close()
        server = timer.seconds
        result, diagnostics = run.result, dict(run.result.diagnostics)
        rounds = float(run.stats.rounds)
    assert result is not None
    centers = np.asarray(result.clustering.centers, dtype=np.float64).reshape(-1, x.shape[1])
    row: dict[str, Any] = {"method": kind, **_scores(x, y, centers, reference), "server_s": server,
                           "wall_s": time.perf_counter() - started, "rounds": rounds,
                           "warnings": list(result.warnings)}
    for key in ("signal_to_noise", "leaves", "coverage", "center_error_floor", "vector_center_se_mean",
                "heavy_keys", "candidates", "candidates_kept", "coreset_weight_error", "lloyd_center_se_mean",
                "vector_floor"):
        if key in diagnostics:
            row[key] = float(diagnostics[key])
    return row


def run_floor(name: str, x: NDArray[np.float64], y: NDArray[np.int64], k: int, epsilon: float, seed: int,
              reference: float) -> dict[str, Any]:
    from benchmarks.harness.adapters import collector_backend
    from benchmarks.harness.baselines import discrete_laplace_kmeans, oue_grid_kmeans

    started = time.perf_counter()
    if name == "ldp-laplace-points":
        out = discrete_laplace_kmeans(x, k, epsilon, seed=seed)
    else:
        with collector_backend(False) as backend:
            out = oue_grid_kmeans(x, k, epsilon, seed=seed, backend=backend)
    assert out.centers is not None
    return {"method": name, **_scores(x, y, np.asarray(out.centers), reference), "wall_s": time.perf_counter() - started}


def _data(name: str, n: int, d: int, k: int, seed: int) -> tuple[NDArray[np.float64], NDArray[np.int64], float]:
    x, y = make_dataset(name, n, d=d, k=k, seed=seed)
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.int64)
    return x, y, reference_kmeans_cost(x, k, seed, n_init=3)


def _epsilons(values: list[str]) -> list[float]:
    return [math.inf if v in ("inf", "infinity") else float(v) for v in values]


def rows_nettree(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    for d in args.dims:
        for k in args.ks:
            for seed in range(args.seeds):
                x, y, ref = _data("google", args.n, d, k, seed)
                for eps in _epsilons(args.epsilons):
                    base = {"experiment": "nettree", "dataset": "google", "n": args.n, "d": d, "k": k, "seed": seed,
                            "epsilon": eps}
                    yield {**base, **run_protocol("nettree", x, y, k, eps, seed, ref)}
                    if not math.isinf(eps) and not args.no_floors:
                        for floor in FLOORS:
                            if floor == "ldp-oue-grid" and d > 10:
                                continue  # a grid in d = 100 has one cell per dimension pair at most: meaningless
                            yield {**base, **run_floor(floor, x, y, k, eps, seed, ref)}


def rows_boundary(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    for k in args.ks:
        for n in args.ns:
            for seed in range(args.seeds):
                x, y, ref = _data("google", n, 10, k, seed)
                for eps in _epsilons(args.epsilons):
                    base = {"experiment": "boundary", "dataset": "google", "n": n, "d": 10, "k": k, "seed": seed,
                            "epsilon": eps}
                    yield {**base, **run_protocol("nettree", x, y, k, eps, seed, ref)}


def rows_stemmer(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    for seed in range(args.seeds):
        x, y, ref = _data("mixture", args.n, 10, 8, seed)
        for eps in _epsilons(args.epsilons):
            base = {"experiment": "stemmer", "dataset": "mixture", "n": args.n, "d": 10, "k": 8, "seed": seed,
                    "epsilon": eps}
            for lloyd in (v == "lloyd" for v in args.variants):
                row = run_protocol("stemmer", x, y, 8, eps, seed, ref, lloyd_refinement=lloyd)
                yield {**base, **row, "method": "stemmer" + ("+lloyd" if lloyd else "")}
            if not args.no_floors:
                for floor in FLOORS:
                    yield {**base, **run_floor(floor, x, y, 8, eps, seed, ref)}


def rows_scaling(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    for n in args.ns:
        for seed in range(args.seeds):
            for kind, dataset in (("stemmer", "mixture"), ("nettree", "google")):
                x, y, ref = _data(dataset, n, 10, 8, seed)
                for eps in _epsilons(args.epsilons):
                    params = {"lloyd_refinement": True} if kind == "stemmer" else {}
                    yield {"experiment": "scaling", "dataset": dataset, "n": n, "d": 10, "k": 8, "seed": seed,
                           "epsilon": eps, **run_protocol(kind, x, y, 8, eps, seed, ref, **params)}


EXPERIMENTS = {"nettree": rows_nettree, "boundary": rows_boundary, "stemmer": rows_stemmer, "scaling": rows_scaling}


def plot(rows: list[dict[str, Any]], experiment: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    if experiment == "boundary":
        for k in sorted({r["k"] for r in rows}):
            pts = [(r["signal_to_noise"], r["ari"] if not math.isnan(r["ari"]) else 0.0) for r in rows if r["k"] == k]
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], label=f"k = {k}", s=18)
        ax.set_xscale("log")
        ax.set_xlabel("signal-to-noise (n / k) / sigma  (DESIGN 7.4)")
        ax.set_ylabel("ARI")
        ax.axhline(0.9, color="grey", lw=0.5)
        ax.set_title("net-tree: feasibility boundary (d = 10, Google generator)")
    else:
        for method in sorted({r["method"] for r in rows}):
            pts = sorted((r["n"], r["excess_cost_per_point"]) for r in rows
                         if r["method"] == method and r["excess_cost_per_point"] > 0)
            if pts:
                ax.loglog([p[0] for p in pts], [p[1] for p in pts], "o-", label=method)
                n0, c0 = pts[0]
                ns = np.array([p[0] for p in pts], dtype=float)
                ax.loglog(ns, c0 * np.sqrt(n0 / ns), ":", color="grey")
        ax.set_xlabel("n")
        ax.set_ylabel("excess cost per point")
        ax.set_title("excess k-means cost per point; dotted: n^(-1/2)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), required=True)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--ns", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    parser.add_argument("--dims", type=int, nargs="+", default=[10])
    parser.add_argument("--ks", type=int, nargs="+", default=[8])
    parser.add_argument("--epsilons", nargs="+", default=["1", "2"])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--no-floors", action="store_true")
    parser.add_argument("--variants", nargs="+", choices=("lloyd", "plain"), default=["lloyd", "plain"],
                        help="stemmer with and/or without the Lloyd round")
    parser.add_argument("--out", type=Path, required=True, help="JSON file (rows appended as they finish)")
    parser.add_argument("--plot", type=Path, help="PNG for the boundary or scaling experiment")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for row in EXPERIMENTS[args.experiment](args):
        rows.append(row)
        args.out.write_text(json.dumps(rows, indent=1, default=float))
        shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k != "warnings"}
        print(json.dumps(shown, default=str), flush=True)
    if args.plot is not None:
        plot(rows, args.experiment, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
