"""The Laplace path measured: k-means vs FCM vs mnFCM on the same discrete-Laplace-noised points.

Setting (DESIGN.md §7.6, ``papers/004``): a 2-D Gaussian mixture with k = 4 (``make_dataset("mixture")``),
normalized to its bounding box; every point rounded to the 2^10 grid and noised with the SDK's
discrete Laplace distribution at scale ``d N / epsilon`` (epsilon / d per coordinate). The noise is
drawn with numpy as the difference of two geometric variables, which has exactly the SDK
sampler's pmf ``P[k] ∝ exp(-|k| / scale)`` (the SDK's exact sampler is about 20 us per coordinate,
too slow for this sweep; the engine tests run it for real). Every algorithm sees the same noisy
points; each point is then labelled with its nearest published center using its *true* position
(as ``ldp_collector.simulation.evaluation.evaluate_clustering`` does) and scored against the true components with
ARI and the F-measure (the paper's metric).

Tables
    1. ``free``: the algorithms as published (k-means: best of 3 k-means++ + Lloyd; FCM and mnFCM:
       best of 3 k-means++ starts, m = 2; mnFCM's sigma_0 = the Laplace scale).
    2. ``cube``: the engine's setting, centers kept in the unit cube (clipped after every update;
       k-means clipped at the end).
    3. distance ablation (the paper's §6.2.4): FCM with the absolute (l1), squared Euclidean,
       Laplace-only, Gaussian-only and mixed losses, ``free``.

Cells are the median over seeds with [min, max].

Usage::

    PYTHONPATH=packages/ldp-client/src:packages/ldp-proto/src:packages/ldp-collector/src \\
        python benchmarks/laplace_clustering.py [--seeds 3] [--n 10000 100000] [--epsilons 1 2 4 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ldp_client.mechanisms.discrete_laplace import DiscreteLaplaceParams
from ldp_collector.estimation.fuzzy import DISTANCES, fuzzy_c_means
from ldp_collector.estimation.kmeans import assign, weighted_kmeans
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.scores import adjusted_rand_index, f_measure

K, D, GRID_BITS, N_INIT = 4, 2, 10, 3
ALGORITHMS = ("kmeans", "fcm", "mnfcm")


def noisy_points(t: NDArray[np.float64], epsilon: float, rng: np.random.Generator) -> tuple[NDArray[np.float64], float]:
    """The decoded reports of points ``t`` in [0, 1]^d, and sigma_0 (the Laplace scale per coordinate)."""
    params = DiscreteLaplaceParams(dimension=t.shape[1], epsilon=epsilon, grid_bits=GRID_BITS)
    n_grid = params.grid_size
    z = np.rint(t * n_grid)  # round half to even, as the SDK's round()
    p = 1.0 - params.noise_decay
    noise = (rng.geometric(p, size=t.shape) - rng.geometric(p, size=t.shape)).astype(np.float64)
    return (z + noise) / n_grid, float(np.sqrt(params.noise_variance / 2.0))


def fit(algorithm: str, noisy: NDArray[np.float64], sigma0: float, seed: int, cube: bool) -> NDArray[np.float64]:
    bounds = (0.0, 1.0) if cube else None
    if algorithm == "kmeans":
        centers = weighted_kmeans(noisy, K, seed, n_init=N_INIT, max_iter=300).centers
        return np.clip(centers, 0.0, 1.0) if cube else centers
    distance = {"fcm": "euclidean", "mnfcm": "mixed"}.get(algorithm, algorithm)
    return fuzzy_c_means(noisy, K, seed, distance=distance, noise_scale=sigma0,  # type: ignore[arg-type]
                         n_init=N_INIT, bounds=bounds).centers


def score(t: NDArray[np.float64], labels: NDArray[np.int64], centers: NDArray[np.float64]) -> tuple[float, float]:
    predicted = assign(t, centers)[0]
    return adjusted_rand_index(labels, predicted), f_measure(labels, predicted)


def cell(values: Sequence[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.median(values):.3f} [{min(values):.2f}, {max(values):.2f}]"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--n", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--ablation-n", type=int, default=10_000)
    parser.add_argument("--json", default=None, help="write every run's scores here")
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    settings = [(n, mode, alg) for n in args.n for mode in ("free", "cube") for alg in ALGORITHMS]
    settings += [(args.ablation_n, "ablation", dist) for dist in DISTANCES]
    for n in sorted({s[0] for s in settings}):
        for seed in range(args.seeds):
            x, maybe_labels = make_dataset("mixture", n, d=D, k=K, seed=seed)
            assert maybe_labels is not None
            labels = maybe_labels
            lo, hi = x.min(axis=0), x.max(axis=0)
            t = (x - lo) / (hi - lo)
            for epsilon in args.epsilons:
                noisy, sigma0 = noisy_points(t, epsilon, np.random.default_rng([seed, int(epsilon * 1000)]))
                for n_, mode, alg in settings:
                    if n_ != n:
                        continue
                    tic = time.perf_counter()
                    centers = fit(alg, noisy, sigma0, seed, cube=mode == "cube")
                    ari, fm = score(t, labels, centers)
                    runs.append({"n": n, "mode": mode, "algorithm": alg, "epsilon": epsilon, "seed": seed,
                                 "ari": ari, "f_measure": fm, "seconds": time.perf_counter() - tic})
                print(f"n={n} seed={seed} eps={epsilon:g} done ({time.perf_counter() - started:.0f} s)",
                      file=sys.stderr, flush=True)

    def table(mode: str, names: Sequence[str], ns: Sequence[int], title: str) -> None:
        print(f"\n### {title}\n")
        header = "| n | algorithm | " + " | ".join(f"eps={e:g} ARI | eps={e:g} F" for e in args.epsilons) + " |"
        print(header)
        print("|" + "---|" * (2 + 2 * len(args.epsilons)))
        for n in ns:
            for name in names:
                cells = []
                for e in args.epsilons:
                    sel = [r for r in runs if r["n"] == n and r["mode"] == mode and r["algorithm"] == name
                           and r["epsilon"] == e]
                    cells += [cell([r["ari"] for r in sel]), cell([r["f_measure"] for r in sel])]
                print(f"| {n:g} | {name} | " + " | ".join(cells) + " |")

    print(f"mixture d={D} k={K}, grid_bits={GRID_BITS}, {args.seeds} seeds; median [min, max]")
    table("free", ALGORITHMS, args.n, "1. free centers (the algorithms as published)")
    table("cube", ALGORITHMS, args.n, "2. centers kept in the unit cube (the engine's setting)")
    table("ablation", DISTANCES, [args.ablation_n], "3. distance ablation (FCM, m = 2, free centers)")
    print(f"\ntotal {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(runs, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
