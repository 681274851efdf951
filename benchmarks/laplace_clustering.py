"""The Laplace path measured: k-means vs FCM vs mnFCM, centers kept in the unit cube or free.

Setting (DESIGN.md §7.6, ``papers/004``): every data set is normalized to its public domain (its
bounding box, or for the ``-box`` cases a box wider than the data), every point rounded to the 2^10 grid and noised with the SDK's discrete
Laplace distribution at scale ``d N / epsilon`` (epsilon / d per coordinate). The noise is drawn
with numpy as the difference of two geometric variables, which has exactly the SDK sampler's pmf
``P[k] ∝ exp(-|k| / scale)`` (the SDK's exact sampler is about 20 us per coordinate, too slow for
this sweep; the engine tests run it for real). Every configuration sees the same noisy points and
clusters them with the engine's own code (:func:`ldp_collector.kinds.laplace.cluster_points`:
best of 3 k-means++ starts, fuzzifier 2, mnFCM's sigma_0 = the Laplace scale); each point is then
labelled with its nearest published center using its *true* position (as
``ldp_collector.simulation.evaluation.evaluate_clustering`` does) and scored against the true
components with ARI and the F-measure (the paper's metric).

Configurations: {kmeans, fcm, mnfcm} x {cube (centers kept in the unit cube: the fuzzy algorithms
clip after every update, k-means at the end), free (the algorithms as published)}.

Seeds (the evaluation discipline of ``benchmarks/README.md``): the default is *chosen* on the
tuning seeds (0-9): in every (data set, n, epsilon) cell the configurations with the highest median
ARI win it, and the configuration that wins most cells is the default. The tables are *reported*
on the reporting seeds (100-109), never the same: median with the worst seed, and a paired
two-sided Wilcoxon signed-rank verdict (``harness.runner.paired_comparison``, alpha 0.05) of the
chosen default against every other configuration. A seed fixes the data set's draw, the noise and
the k-means++ starts.

Tables
    1. the tuning verdict: cells won per configuration on the tuning seeds.
    2. per data set: ARI median [worst] on the reporting seeds, the default's verdict against each.
    3. the paper's claims: mnFCM against FCM and against k-means (same centers rule), paired verdicts
       on the reporting seeds.
    4. distance ablation (the paper's §6.2.4): FCM with the absolute (l1), squared Euclidean,
       Laplace-only, Gaussian-only and mixed losses, free centers, on one data set.

Usage (from the repository root, with the collector installed)::

    python benchmarks/laplace_clustering.py [--datasets mixture2 mixture5 iris wine] [--n 10000]
        [--epsilons 1 2 4 8] [--tuning-seeds 0-9] [--reporting-seeds 100-109] [--jobs 2]
        [--json out.json] [--from-json out.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from harness.runner import VERDICT_ALPHA, paired_comparison
from numpy.typing import NDArray

from ldp_client.mechanisms.discrete_laplace import DiscreteLaplaceParams
from ldp_collector.estimation.fuzzy import DISTANCES, fuzzy_c_means
from ldp_collector.estimation.kmeans import assign
from ldp_collector.kinds.laplace import DEFAULT_GRID_BITS, N_INIT, LaplaceAlgorithm, cluster_points
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.scores import adjusted_rand_index, f_measure

ALGORITHMS = ("kmeans", "fcm", "mnfcm")
MODES = ("cube", "free")
CONFIGS = tuple(f"{alg}-{mode}" for alg in ALGORITHMS for mode in MODES)
_ENGINE_ALGORITHM = {"kmeans": LaplaceAlgorithm.KMEANS, "fcm": LaplaceAlgorithm.FCM,
                     "mnfcm": LaplaceAlgorithm.MNFCM}


@dataclass(frozen=True)
class DataCase:
    """One data set of the sweep: ``make_dataset(name, n, d=d, k=k, **options)``.

    ``margin``: the public domain is the data's bounding box widened by ``margin`` times its width on
    every side (a campaign's box is fixed before the data are seen, so it is rarely tight).
    """

    label: str
    name: str
    d: int
    k: int
    options: tuple[tuple[str, float], ...] = ()
    margin: float = 0.0


#: label -> data set. Mixtures with other k, d and separation; iris upsampled (4-D, 3 classes, two of
#: them overlapping); wine upsampled (13-D, 3 classes: epsilon / 13 per coordinate); ``-box``: the same
#: data in a public domain wider than the data (as a campaign's box usually is).
DATASETS = {c.label: c for c in (
    DataCase("mixture2", "mixture", 2, 4),
    DataCase("mixture5", "mixture", 5, 6, (("separation", 2.0),)),
    DataCase("mixture3-close", "mixture", 3, 3, (("separation", 1.0),)),
    DataCase("iris", "iris", 4, 3),
    DataCase("wine", "wine", 13, 3),
    DataCase("mixture2-box", "mixture", 2, 4, margin=0.25),
    DataCase("iris-box", "iris", 4, 3, margin=0.25),
)}


def noisy_points(t: NDArray[np.float64], epsilon: float, rng: np.random.Generator) -> tuple[NDArray[np.float64], float]:
    """The decoded reports of points ``t`` in [0, 1]^d, and sigma_0 (the Laplace scale per coordinate)."""
    params = DiscreteLaplaceParams(dimension=t.shape[1], epsilon=epsilon, grid_bits=DEFAULT_GRID_BITS)
    n_grid = params.grid_size
    z = np.rint(t * n_grid)  # round half to even, as the SDK's round()
    p = 1.0 - params.noise_decay
    noise = (rng.geometric(p, size=t.shape) - rng.geometric(p, size=t.shape)).astype(np.float64)
    return (z + noise) / n_grid, float(np.sqrt(params.noise_variance / 2.0))


def score(t: NDArray[np.float64], labels: NDArray[np.int64], centers: NDArray[np.float64]) -> tuple[float, float]:
    predicted = assign(t, centers)[0]
    return adjusted_rand_index(labels, predicted), f_measure(labels, predicted)


def unit_data(case: DataCase, n: int, seed: int) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """The data set's points normalized to their public domain (:class:`DataCase`), and their true labels."""
    x, labels = make_dataset(case.name, n, d=case.d, k=case.k, seed=seed, **dict(case.options))
    assert labels is not None
    lo, hi = x.min(axis=0), x.max(axis=0)
    lo, hi = lo - case.margin * (hi - lo), hi + case.margin * (hi - lo)
    return (x - lo) / np.where(hi > lo, hi - lo, 1.0), labels


def run_job(label: str, n: int, seeds: Sequence[int], epsilons: Sequence[float],
            ablation: bool) -> list[dict[str, Any]]:
    """Every configuration (or, ``ablation``, every FCM distance) on one data set and n, over ``seeds``."""
    case = DATASETS[label]
    runs: list[dict[str, Any]] = []
    for seed in seeds:
        t, labels = unit_data(case, n, seed)
        for epsilon in epsilons:
            noisy, sigma0 = noisy_points(t, epsilon, np.random.default_rng([seed, int(epsilon * 1000)]))
            base = {"dataset": label, "n": n, "epsilon": epsilon, "seed": seed}
            if ablation:
                for dist in DISTANCES:
                    tic = time.perf_counter()
                    fit = fuzzy_c_means(noisy, case.k, seed, distance=dist, noise_scale=sigma0, n_init=N_INIT)
                    ari, fm = score(t, labels, fit.centers)
                    runs.append({**base, "config": f"ablation-{dist}", "ari": ari, "f_measure": fm,
                                 "seconds": time.perf_counter() - tic})
                continue
            for alg in ALGORITHMS:
                tic = time.perf_counter()
                if alg == "kmeans":
                    # k-means keeps its centers free while it runs and is clipped at the end: one fit, two scores.
                    free = cluster_points(noisy, case.k, np.random.default_rng(seed), algorithm=LaplaceAlgorithm.KMEANS,
                                          fuzzifier=0.0, noise_scale=sigma0, in_cube=False).centers
                    fits = {"free": free, "cube": np.clip(free, 0.0, 1.0)}
                else:
                    fits = {mode: cluster_points(noisy, case.k, np.random.default_rng(seed),
                                                 algorithm=_ENGINE_ALGORITHM[alg], fuzzifier=2.0,
                                                 noise_scale=sigma0, in_cube=mode == "cube").centers
                            for mode in MODES}
                seconds = time.perf_counter() - tic
                for mode, centers in fits.items():
                    ari, fm = score(t, labels, centers)
                    runs.append({**base, "config": f"{alg}-{mode}", "ari": ari, "f_measure": fm,
                                 "seconds": seconds / len(fits)})
        print(f"{label} n={n} seed={seed} done", file=sys.stderr, flush=True)
    return runs


def seed_range(text: str) -> list[int]:
    """``"0-9"`` or ``"3"`` -> the seeds."""
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


Cell = tuple[str, int, float]


def per_cell(runs: Sequence[dict[str, Any]], seeds: Sequence[int]) -> dict[Cell, dict[str, dict[int, float]]]:
    """(dataset, n, epsilon) -> config -> seed -> ARI, over ``seeds`` only."""
    wanted = set(seeds)
    out: dict[Cell, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in runs:
        if r["seed"] in wanted:
            out[(r["dataset"], r["n"], r["epsilon"])][r["config"]][r["seed"]] = r["ari"]
    return out


def cell_winners(configs: dict[str, dict[int, float]]) -> list[str]:
    """The configurations of highest median ARI in one cell (ties all win)."""
    medians = {c: statistics.median(v.values()) for c, v in configs.items() if c in CONFIGS}
    best = max(medians.values())
    return [c for c, m in medians.items() if m == best]


def choose_default(runs: Sequence[dict[str, Any]], tuning: Sequence[int]) -> tuple[str, dict[str, int], int]:
    """The configuration winning most cells on the tuning seeds, the wins of every one, and the cells.

    Equal win counts are broken by the mean over the cells of the median ARI (tuning seeds).
    """
    cells = [configs for configs in per_cell(runs, tuning).values() if set(CONFIGS) <= set(configs)]
    wins = dict.fromkeys(CONFIGS, 0)
    for configs in cells:
        for c in cell_winners(configs):
            wins[c] += 1
    mean_median = {c: statistics.fmean(statistics.median(configs[c].values()) for configs in cells) if cells else 0.0
                   for c in CONFIGS}
    return max(CONFIGS, key=lambda c: (wins[c], mean_median[c])), wins, len(cells)


def verdict_mark(mine: dict[int, float], theirs: dict[int, float]) -> str:
    """The default's paired verdict against another configuration: ``+`` wins, ``-`` loses, ``=`` no difference."""
    common = sorted(set(mine) & set(theirs))
    _, verdict = paired_comparison([mine[s] for s in common], [theirs[s] for s in common])
    return {"wins": "+", "loses": "-", "no difference": "="}.get(verdict, "?")


def report(runs: Sequence[dict[str, Any]], tuning: Sequence[int], reporting: Sequence[int]) -> None:
    """Print the tables (module docstring) as Markdown."""
    default, wins, counted = choose_default(runs, tuning)
    print(f"### 1. Tuning verdict (seeds {tuning[0]}-{tuning[-1]}): cells of highest median ARI, of {counted}\n")
    print("| " + " | ".join(CONFIGS) + " |")
    print("|" + "---|" * len(CONFIGS))
    print("| " + " | ".join(str(wins[c]) for c in CONFIGS) + " |")
    print(f"\nDefault: **{default}**.\n")
    print("| data set | n | eps | highest median ARI (tuning seeds) |")
    print("|---|---|---|---|")
    for key, configs in sorted(per_cell(runs, tuning).items()):
        if set(CONFIGS) <= set(configs):
            best = cell_winners(configs)
            value = statistics.median(configs[best[0]].values())
            print(f"| {key[0]} | {key[1]:g} | {key[2]:g} | {', '.join(best)} ({value:.3f}) |")
    cells = per_cell(runs, reporting)
    print(f"\n### 2. Reporting seeds {reporting[0]}-{reporting[-1]}: ARI median [worst seed]; "
          f"the mark after a cell is {default}'s paired Wilcoxon verdict against it "
          f"(+ {default} wins, - loses, = no difference at alpha {VERDICT_ALPHA})\n")
    for label in DATASETS:
        mine = sorted(key for key in cells if key[0] == label and set(CONFIGS) <= set(cells[key]))
        if not mine:
            continue
        case = DATASETS[label]
        options = "".join(f", {k}={v:g}" for k, v in case.options)
        options += f"; domain: the bounding box widened by {case.margin:g} of its width per side" if case.margin else ""
        print(f"#### {label}: {case.name}(d={case.d}, k={case.k}{options})\n")
        print("| n | eps | " + " | ".join(CONFIGS) + " |")
        print("|" + "---|" * (2 + len(CONFIGS)))
        for key in mine:
            row = []
            for c in CONFIGS:
                values = list(cells[key][c].values())
                mark = "" if c == default else " " + verdict_mark(cells[key][default], cells[key][c])
                row.append(f"{statistics.median(values):.3f} [{min(values):.3f}]{mark}")
            print(f"| {key[1]:g} | {key[2]:g} | " + " | ".join(row) + " |")
        print()
    claims = [(f"mnfcm-{mode}", f"{other}-{mode}") for other in ("fcm", "kmeans") for mode in MODES]
    print(f"### 3. The paper's claims on the reporting seeds: mnFCM against FCM and k-means, same centers rule; "
          f"paired Wilcoxon verdict (alpha {VERDICT_ALPHA}) and the median ARI difference\n")
    print("| data set | n | eps | " + " | ".join(f"{a} vs {b}" for a, b in claims) + " |")
    print("|" + "---|" * (3 + len(claims)))
    for key, configs in sorted(cells.items()):
        if not set(CONFIGS) <= set(configs):
            continue
        row = []
        for a, b in claims:
            common = sorted(set(configs[a]) & set(configs[b]))
            _, verdict = paired_comparison([configs[a][s] for s in common], [configs[b][s] for s in common])
            diff = statistics.median(configs[a][s] - configs[b][s] for s in common)
            row.append(f"{verdict} ({diff:+.3f})")
        print(f"| {key[0]} | {key[1]:g} | {key[2]:g} | " + " | ".join(row) + " |")
    print()
    ablation = [r for r in runs if r["config"].startswith("ablation-") and r["seed"] in set(reporting)]
    if ablation:
        by: dict[tuple[str, float], list[float]] = defaultdict(list)
        for r in ablation:
            by[(r["config"].removeprefix("ablation-"), r["epsilon"])].append(r["ari"])
        epsilons = sorted({e for _, e in by})
        first = ablation[0]
        print(f"### 4. Distance ablation (FCM, free centers, {first['dataset']}, n = {first['n']:g}, "
              f"reporting seeds): ARI median [worst seed]\n")
        print("| distance | " + " | ".join(f"eps={e:g}" for e in epsilons) + " |")
        print("|" + "---|" * (1 + len(epsilons)))
        for dist in DISTANCES:
            print(f"| {dist} | " + " | ".join(f"{statistics.median(by[(dist, e)]):.3f} [{min(by[(dist, e)]):.3f}]"
                                              for e in epsilons) + " |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--datasets", nargs="+", choices=sorted(DATASETS), default=list(DATASETS))
    parser.add_argument("--n", type=int, nargs="+", default=[10_000])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--tuning-seeds", type=seed_range, default=seed_range("0-9"))
    parser.add_argument("--reporting-seeds", type=seed_range, default=seed_range("100-109"))
    parser.add_argument("--ablation", default="mixture2", choices=[*sorted(DATASETS), "none"],
                        help="data set of the distance ablation (first n, reporting seeds)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--json", default=None, help="write every run's scores here")
    parser.add_argument("--from-json", nargs="+", default=None, help="print the tables of earlier runs")
    args = parser.parse_args(argv)
    if set(args.tuning_seeds) & set(args.reporting_seeds):
        parser.error("the tuning and reporting seeds must differ")
    runs: list[dict[str, Any]] = []
    if args.from_json:
        for path in args.from_json:
            with open(path) as fh:
                runs += json.load(fh)
    else:
        seeds = [*args.tuning_seeds, *args.reporting_seeds]
        jobs = [(label, n, [s], args.epsilons, False) for n in args.n for label in args.datasets for s in seeds]
        if args.ablation != "none":
            jobs += [(args.ablation, args.n[0], [s], args.epsilons, True) for s in args.reporting_seeds]
        started = time.perf_counter()
        with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
            for out in pool.map(run_job, *zip(*jobs, strict=True)):
                runs += out
                if args.json:  # after every job: a long sweep cut short keeps what it measured
                    with open(args.json, "w") as fh:
                        json.dump(runs, fh, indent=1)
        print(f"total {time.perf_counter() - started:.0f} s", file=sys.stderr)
    report(runs, args.tuning_seeds, args.reporting_seeds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
