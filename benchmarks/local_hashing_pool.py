"""Fast local hashing: support counts from a public seed pool vs from per-report seeds.

Local-hashing support counts over D candidates cost n x D hash evaluations when every report
carries its own seed. With a public pool of S seeds (``docs/protocol.md`` §14) the collector keeps
the count of every (pool seed, bucket) -- O(n) to fill, once, at ingestion -- and the supports cost
S x D hashes. This script measures both at D = 4 096 and n = 1e6 (defaults), epsilon = 2, for two
populations:

* ``uniform``: every value held by n / D devices;
* ``zipf``: value v held in proportion to 1 / (v + 1) (the top value holds about 11 %).

S is the documented default rule (``ldp_client.mechanisms.local_hashing.seed_pool_size_for``): the
smallest pool whose extra variance is at most 10 % of the per-report variance, given n and the
population's concentration kappa = sum_x (n_x / n)^2 (here the true one; an operator gives a bound,
or a previous round's estimate).

For each of ``--seeds`` seeds (default 10: 0-9) the same population is randomized twice with the
numpy simulator (``ldp_collector.simulation.reports.draw_local_hashing``): once with fresh 32-bit
seeds, once from a pool with a key drawn from the seed. Timed, in seconds:

* per-report: ``support_counts`` over all n reports and D candidates (every core);
* pooled: filling the S x g counts from the n reports (``add_arrays``: what ingestion does batch by
  batch), the support counts from them (``support``), and deriving the pool's seeds (pure Python,
  once per round).

Accuracy, per seed: ``MSE / Var = mean_v (c_hat_v - c_v)^2 / mean_v Var_v`` against the per-report
analytic variance (``params.count_variance``) for both, and for the pooled one also against its own
variance (with the pool's extra term). One round over D = 4 096 values gives a ratio with a sampling
standard deviation of about sqrt(2 / D) = 0.022. Every figure is the median over the seeds with the
worst seed beside it.

Usage::

    PYTHONPATH=packages/ldp-client/src:packages/ldp-proto/src:packages/ldp-collector/src \\
        python benchmarks/local_hashing_pool.py [--reports 1000000] [--domain 4096] [--epsilon 2]
        [--seeds 10] [--share 0.1] [--population uniform zipf] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ldp_client.mechanisms import LocalHashingParams
from ldp_client.mechanisms.local_hashing import seed_pool_size_for
from ldp_collector.estimation import LocalHashingAggregator
from ldp_collector.estimation.frequency import estimate_from_support
from ldp_collector.estimation.olh_hash import support_counts
from ldp_collector.simulation.reports import draw_local_hashing

POPULATIONS = ("uniform", "zipf")


def population(kind: str, n: int, domain: int) -> NDArray[np.int64]:
    """The true values of the n devices, value by value (their order does not matter)."""
    weights = np.ones(domain) if kind == "uniform" else 1.0 / np.arange(1, domain + 1)
    counts = np.floor(n * weights / weights.sum()).astype(np.int64)
    counts[: n - int(counts.sum())] += 1
    return np.repeat(np.arange(domain), counts)


@dataclass
class SeedResult:
    per_report_s: float
    count_s: float
    support_s: float
    pool_s: float
    per_report_ratio: float
    pooled_ratio_per_report_var: float
    pooled_ratio_own_var: float


def run_seed(kind: str, n: int, domain: int, epsilon: float, share: float, seed: int) -> tuple[SeedResult, int]:
    rng = np.random.default_rng([seed, POPULATIONS.index(kind)])
    values = population(kind, n, domain)
    counts = np.bincount(values, minlength=domain).astype(np.float64)
    candidates = np.arange(domain)
    plain = LocalHashingParams(domain_size=domain, epsilon=epsilon)
    size = seed_pool_size_for(plain, float(n), float(np.sum((counts / n) ** 2)), share)
    pooled = LocalHashingParams(domain_size=domain, epsilon=epsilon, seed_pool_size=size,
                                seed_pool_key=int(rng.integers(0, 2**63)))
    base_var = np.array([plain.count_variance(float(n), c) for c in counts])
    pairs = counts * (counts - 1.0)
    pool_var = base_var + np.array([pooled.seed_pool_extra_variance(float(pairs.sum() - pairs[v]))
                                    for v in range(domain)])

    seeds, buckets = draw_local_hashing(plain, values, rng)
    t0 = time.perf_counter()
    support = support_counts(seeds, buckets, candidates, plain.g)
    per_report_s = time.perf_counter() - t0
    plain_est = estimate_from_support(plain, candidates, support, n).counts

    t0 = time.perf_counter()
    agg = LocalHashingAggregator(pooled)  # derives the pool's seeds (cached per parameters)
    pool_s = time.perf_counter() - t0
    seeds, buckets = draw_local_hashing(pooled, values, rng)
    t0 = time.perf_counter()
    agg.add_arrays(seeds, buckets)
    count_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pooled_support = agg.support(candidates)
    support_s = time.perf_counter() - t0
    pooled_est = estimate_from_support(pooled, candidates, pooled_support, n).counts

    def ratio(est: NDArray[np.float64], var: NDArray[np.float64]) -> float:
        return float(np.mean((est - counts) ** 2) / np.mean(var))

    return SeedResult(per_report_s=per_report_s, count_s=count_s, support_s=support_s, pool_s=pool_s,
                      per_report_ratio=ratio(plain_est, base_var),
                      pooled_ratio_per_report_var=ratio(pooled_est, base_var),
                      pooled_ratio_own_var=ratio(pooled_est, pool_var)), size


def median_worst(values: list[float], worst_is_max: bool = True) -> str:
    worst = max(values) if worst_is_max else min(values)
    return f"{statistics.median(values):.3g} ({worst:.3g})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--domain", type=int, default=4096)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--share", type=float, default=0.1, help="largest extra variance share (the rule for S)")
    parser.add_argument("--population", nargs="+", choices=POPULATIONS, default=list(POPULATIONS))
    parser.add_argument("--markdown", action="store_true", help="print the README table")
    args = parser.parse_args(argv)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"# n = {args.reports}, D = {args.domain}, epsilon = {args.epsilon}, seeds 0-{args.seeds - 1}, "
          f"{cpus} CPUs, numpy {np.__version__}, Python {platform.python_version()}")
    rows = []
    for kind in args.population:
        results, size = [], 0
        for seed in range(args.seeds):
            result, size = run_seed(kind, args.reports, args.domain, args.epsilon, args.share, seed)
            results.append(result)
            print(f"{kind} seed {seed}: S = {size}, {result}", flush=True)
        pooled_total = [r.count_s + r.support_s for r in results]
        speedups = [r.per_report_s / t for r, t in zip(results, pooled_total)]
        rows.append((kind, size, median_worst([r.per_report_s for r in results]),
                     median_worst([r.count_s for r in results]), median_worst([r.support_s for r in results]),
                     median_worst([r.pool_s for r in results]), median_worst(speedups, worst_is_max=False),
                     median_worst([r.per_report_ratio for r in results]),
                     median_worst([r.pooled_ratio_per_report_var for r in results]),
                     median_worst([r.pooled_ratio_own_var for r in results])))
    header = ("population", "S", "per-report support s", "pooled: fill counts s", "pooled: support s",
              "pool seeds s", "speedup", "MSE/Var per-report", "MSE/Var(per-report) pooled",
              "MSE/Var(own) pooled")
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(str(c) for c in row) + " |")
    else:
        for row in rows:
            print(dict(zip(header, row)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
