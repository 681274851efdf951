#!/usr/bin/env python3
"""The BITVECTOR k-means step on its own: quality and CPU time per seed, median and worst seed.

For each seed, ``make_dataset("mixture", n, d=5, k=6, seed=SEED)`` is encoded against the kind's
public pivots (8 per attribute) and every bit flipped with the mechanism's probability at
``epsilon`` (numpy coins: the same distribution as the SDK's bitwise randomized response), and the
server's k-means runs on the bits:

* ``--path round`` (default): what the kind's step does -- k-means on a uniform sample of
  ``KMEANS_SAMPLE`` reports, then EM passes over every report (``refine_on_round``);
* ``--path whole``: ``kmeans_encoded`` on every report in memory (the step before it read its
  round through passes).

It prints, per seed, the ARI of the nearest-decoded-center labels against the true labels, the
cost ratio to non-private k-means, the CPU seconds of the clustering (process time, so a busy
machine inflates it little), and the iterations; then the median and the worst seed.

    OPENBLAS_NUM_THREADS=1 python benchmarks/bitvector_step.py --n 100000 --seeds 100-109
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ldp_client.mechanisms.bitwise_randomized_response import BitwiseRRParams
from ldp_collector.estimation.bitvector import (
    KMEANS_SAMPLE,
    array_passes,
    decode_centers,
    kmeans_encoded,
    public_pivots,
    refine_on_round,
)
from ldp_collector.kinds.bitvector import DEFAULT_PIVOTS_PER_ATTRIBUTE, HALF_WIDTH_FACTOR
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.population import numeric_bounds
from ldp_collector.simulation.scores import adjusted_rand_index, kmeans_cost, reference_kmeans_cost

D, K = 5, 6


def _seeds(text: str) -> list[int]:
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def run(n: int, seed: int, epsilon: float, path: str) -> dict[str, float]:
    """One seed: the data, its randomized bits, the clustering and its scores."""
    x, labels = make_dataset("mixture", n, d=D, k=K, seed=seed)
    assert labels is not None  # the mixture is labelled
    lower, upper = numeric_bounds(x)
    layout = public_pivots(lower, upper, DEFAULT_PIVOTS_PER_ATTRIBUTE, HALF_WIDTH_FACTOR)
    params = BitwiseRRParams(length=layout.bits, epsilon=epsilon, sensitivity=4 * D)
    rng = np.random.default_rng(seed + 1000)
    y = (layout.encode(x) ^ (rng.random((n, layout.bits)) < params.p_flip)).astype(np.uint8)
    started = time.process_time()
    if path == "whole":
        fit = kmeans_encoded(y, K, p_flip=params.p_flip, p_keep=params.p_keep, rng=seed)
        sample_iterations, passes = fit.iterations, 0
    else:
        m = min(n, KMEANS_SAMPLE)
        sample = y[np.sort(rng.choice(n, size=m, replace=False))]
        start = kmeans_encoded(sample, K, p_flip=params.p_flip, p_keep=params.p_keep, rng=seed)
        assert start.mixture is not None
        fit, _ = refine_on_round(start.mixture, array_passes(y), p_flip=params.p_flip, p_keep=params.p_keep)
        sample_iterations, passes = start.iterations, fit.iterations
    cpu = time.process_time() - started
    centers = decode_centers(fit.centers, layout)
    predicted = np.argmin(((x[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2), axis=1)
    return {"seed": seed, "ari": adjusted_rand_index(labels, predicted),
            "cost_ratio": kmeans_cost(x, centers) / reference_kmeans_cost(x, K, seed=0), "cpu_s": cpu,
            "iterations": float(sample_iterations), "round_passes": float(passes)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--seeds", default="100-109", help="a range (100-109) or a comma-separated list")
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--path", choices=("round", "whole"), default="round")
    ns = parser.parse_args(argv)
    rows = []
    print("| seed | ARI | cost ratio | CPU s | iterations | round passes |")
    print("|---|---|---|---|---|---|")
    for seed in _seeds(ns.seeds):
        row = run(ns.n, seed, ns.epsilon, ns.path)
        rows.append(row)
        print(f"| {seed} | {row['ari']:.3f} | {row['cost_ratio']:.2f} | {row['cpu_s']:.1f} | "
              f"{row['iterations']:.0f} | {row['round_passes']:.0f} |", flush=True)
    aris, ratios, cpus = ([r[key] for r in rows] for key in ("ari", "cost_ratio", "cpu_s"))
    print(f"median ARI {statistics.median(aris):.3f} (worst {min(aris):.3f}), cost ratio "
          f"{statistics.median(ratios):.2f} (worst {max(ratios):.2f}), CPU s {statistics.median(cpus):.1f} "
          f"(max {max(cpus):.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
