"""Pivot-count sweep of BITVECTOR campaigns (kCluster, DESIGN.md section 7.5).

Runs whole campaigns through the in-process collector and the SDK simulator (``mode="direct"``) on
``make_dataset("mixture", n, d=..., k=4, seed=...)`` for several ``pivots_per_attribute`` and
epsilons, and prints ARI and the cost ratio to non-private k-means
(:func:`ldp_collector.simulation.evaluation.evaluate_clustering`), median over seeds. This is how
``DEFAULT_PIVOTS_PER_ATTRIBUTE`` of :mod:`ldp_collector.kinds.bitvector` was chosen.

    python benchmarks/bitvector_clustering.py --n 100000 --dims 2 10 --pivots 4 6 8 12 16 \
        --epsilons 1 2 4 --seeds 1 [--json out.json]

Set ``OPENBLAS_NUM_THREADS=1`` on a shared box: the small matrix products of the estimator run
slower with contended BLAS threads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any

from ldp.v1 import campaigns_pb2, encoders_pb2
from ldp_collector.core import Collector
from ldp_collector.kinds import bitvector  # noqa: F401  (registers the engine)
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.evaluation import evaluate_clustering
from ldp_collector.simulation.population import numeric_bounds
from ldp_collector.simulation.runner import run_campaign
from ldp_collector.storage import open_store


def config(lower: tuple[float, ...], upper: tuple[float, ...], *, k: int, pivots: int, epsilon: float,
           algorithm: int, campaign_id: str) -> campaigns_pb2.CampaignConfig:
    cfg = campaigns_pb2.CampaignConfig(
        campaign_id=campaign_id, kind=campaigns_pb2.BITVECTOR, epsilon=epsilon,
        domain=campaigns_pb2.Domain(numeric=encoders_pb2.NumericDomain(lower=list(lower), upper=list(upper))))
    cfg.bitvector.k = k
    cfg.bitvector.pivots_per_attribute = pivots
    cfg.bitvector.algorithm = algorithm  # type: ignore[assignment]
    return cfg


def run_one(n: int, d: int, k: int, pivots: int, epsilon: float, seed: int, algorithm: int) -> dict[str, Any]:
    x, labels = make_dataset("mixture", n, d=d, k=k, seed=seed)
    lower, upper = numeric_bounds(x)
    cfg = config(lower, upper, k=k, pivots=pivots, epsilon=epsilon, algorithm=algorithm,
                 campaign_id=f"bench-{d}-{pivots}-{epsilon:g}-{seed}")
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(tmp)
        try:
            started = time.perf_counter()
            run = run_campaign(Collector(store), config_from_proto(cfg), x, seed=seed, mode="direct", quiet=True, batch_size=5000)
            wall = time.perf_counter() - started
        finally:
            store.close()
    scores = evaluate_clustering(run.result, x, labels, k=k, seed=seed)
    diag = run.result.diagnostics
    return {"n": n, "d": d, "k": k, "pivots": pivots, "epsilon": epsilon, "seed": seed,
            "ari": scores["ari"], "cost_ratio": scores["cost_ratio"], "nmi": scores["nmi"],
            "delta": diag["hamming_sensitivity"], "flip": diag["flip_probability"],
            "bits": diag["bits_per_report"], "epsilon_per_device": run.stats.epsilon_per_device, "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 10])
    parser.add_argument("--pivots", type=int, nargs="+", default=[4, 6, 8, 12, 16])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    parser.add_argument("--seeds", type=int, default=1, help="seeds 1..S per setting (median reported)")
    parser.add_argument("--algorithm", choices=["kmeans", "dbscan"], default="kmeans")
    parser.add_argument("--json", help="write every run to this file")
    args = parser.parse_args(argv)
    algorithm = campaigns_pb2.BitVectorParameters.Algorithm.Value(args.algorithm.upper())
    runs: list[dict[str, Any]] = []
    print(f"{'d':>3} {'T':>3} {'eps':>4} {'Delta':>5} {'flip':>6} {'ARI':>6} {'cost ratio':>10} {'s/run':>6}")
    for d in args.dims:
        for pivots in args.pivots:
            for epsilon in args.epsilons:
                batch = [run_one(args.n, d, args.k, pivots, epsilon, seed, algorithm)
                         for seed in range(1, args.seeds + 1)]
                runs.extend(batch)
                ari = statistics.median(r["ari"] for r in batch)
                ratio = statistics.median(r["cost_ratio"] for r in batch)
                wall = statistics.mean(r["wall_s"] for r in batch)
                print(f"{d:>3} {pivots:>3} {epsilon:>4g} {batch[0]['delta']:>5g} {batch[0]['flip']:>6.3f} "
                      f"{ari:>6.3f} {ratio:>10.2f} {wall:>6.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(runs, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
