"""The center kinds against issue 18's acceptance, over seeds: medians with the worst seed.

Every run is a whole campaign through the in-process collector (real engine, real SQLite store),
the devices simulated as ``ldp-collector simulate`` does (``mode="auto"``: the SDK per device up to
50 000 devices, the distribution-pinned vectorized path above), the result scored on the true points
(``ldp_collector.simulation.evaluation.evaluate_clustering``: ARI, cost ratio against the best of
non-private k-means++, and the result's own noise floor: ``cost_over_floor``,
``center_error_over_floor``).

Experiments (``--experiment``)
    ``mixture``  Gaussian mixture d = 10, k = 8 (``make_dataset("mixture")``) at ``--n`` and ``--epsilon``:
                 ARI, cost ratio, cost / floor for ``--kinds``.
    ``floor``    every center kind on mixtures (d = 5, k = 6 and d = 10, k = 8): measured / floor.
    ``small``    a 5-D mixture of six clusters with shares 50/20/15/10/3/2 %, every mean at least
                 ``SEPARATION`` standard deviations from the others: does the 2 % cluster get its own
                 center (a published center whose nearest true mean is the 2 % cluster's)?
    ``small-bound``  no campaign: for the ``small`` data and each of ``--kinds`` (nettree, stemmer), the
                 chance that a center at the 2 % cluster's true mean plus the noise of the kind's
                 own vector sums (``sqrt(n' M) / c`` per coordinate: every report of the round adds its
                 second moment M to every bucket, c of them are the cluster's, n' report in the round
                 the centers come from) lies nearest that mean: the ceiling of any center those sums
                 give, even one that isolates the cluster's reports perfectly. Seconds.
    ``real``     PCA projections of scikit-learn's bundled real data (digits to 10-D: 10 overlapping
                 classes; breast cancer to 10-D; wine to 5-D), upsampled with jitter to ``--n``: each
                 kind's ARI over non-private k-means++'s on the same points.

``--seeds`` are the reporting seeds 100-109 unless ``--tuning`` (seeds 0-19, where defaults may be
chosen). Options are passed to the kinds as ``--param kind.field=value`` (e.g.
``nettree.refinement_share=0.3``, ``nettree.vector_shape=privunit``: a choice by its name).

Usage::

    python benchmarks/center_acceptance.py --experiment mixture --n 1000000 --kinds nettree stemmer \\
        --out benchmarks/results/center_acceptance_mixture.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ldp_collector.campaigns import prepare_campaign
from ldp_collector.cli_args import build_campaign_config
from ldp_collector.core import Collector
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.evaluation import evaluate_clustering
from ldp_collector.simulation.population import numeric_bounds
from ldp_collector.simulation.runner import run_campaign
from ldp_collector.simulation.scores import adjusted_rand_index, reference_kmeans
from ldp_collector.storage import open_store

REPORTING_SEEDS = tuple(range(100, 110))
TUNING_SEEDS = tuple(range(20))
CENTER_KINDS = ("nettree", "stemmer", "ldp_kmeans", "bitvector", "laplace")
#: The kinds whose vector sums the small-cluster bound models.
BOUND_KINDS = ("nettree", "stemmer")
#: The small-cluster experiment: shares and the separation of every mean from the others, in
#: standard deviations of the clusters (all spherical, equal spread).
SMALL_SHARES = (0.50, 0.20, 0.15, 0.10, 0.03, 0.02)
SEPARATION = 4.0
SCORES = ("ari", "cost_ratio", "cost_over_floor", "center_error_over_floor", "small_cluster_found",
          "found_probability", "noise_norm", "nearest_other_mean")


def small_cluster_data(n: int, seed: int, d: int = 5) -> tuple[NDArray[np.float64], NDArray[np.int64],
                                                                  NDArray[np.float64]]:
    """Points, labels and means of the ``small`` experiment: means drawn in a box and rejected until every
    pair is at least ``SEPARATION`` standard deviations apart (sigma = 1)."""
    rng = np.random.default_rng(seed)
    k = len(SMALL_SHARES)
    while True:
        means = rng.uniform(-SEPARATION * 1.5, SEPARATION * 1.5, size=(k, d))
        gaps = np.linalg.norm(means[:, None, :] - means[None, :, :], axis=2) + np.eye(k) * 1e9
        if gaps.min() >= SEPARATION:
            break
    labels = rng.choice(k, size=n, p=np.asarray(SMALL_SHARES))
    x = means[labels] + rng.standard_normal((n, d))
    return x, labels.astype(np.int64), means


def real_data(name: str, n: int, seed: int) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """A bundled real data set, standardized, projected on its leading principal components, upsampled
    with jitter to ``n`` points (``make_dataset``'s upsampling of the raw data first)."""
    source, dims = {"digits10": ("digits", 10), "cancer10": ("breast_cancer", 10), "wine5": ("wine", 5)}[name]
    x, labels = make_dataset(source, n, seed=seed)
    assert labels is not None
    z = (x - x.mean(axis=0)) / np.where(x.std(axis=0) > 0, x.std(axis=0), 1.0)
    _, _, vt = np.linalg.svd(z[: min(len(z), 50_000)] - z[: min(len(z), 50_000)].mean(axis=0), full_matrices=False)
    return z @ vt[:dims].T, labels


def run_kind(kind: str, x: NDArray[np.float64], labels: NDArray[np.int64], k: int, epsilon: float, seed: int,
             params: dict[str, Any]) -> dict[str, float]:
    """One whole campaign of ``kind`` on ``x``, scored as ``simulate`` scores it."""
    config = config_from_proto(build_campaign_config(kind, epsilon=epsilon, k=k, bounds=numeric_bounds(x), seed=seed,
                                                     **params))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        run = run_campaign(Collector(open_store(tmp)), config, x, seed=seed, mode="auto", quiet=True)
    seconds = time.perf_counter() - started
    out: dict[str, float] = {"seconds": seconds}
    clustering = run.result.clustering
    if clustering is None or not clustering.centers:
        out.update(ari=0.0, cost_ratio=math.inf)
        return out
    out.update(evaluate_clustering(run.result, x, labels, k=k, seed=seed))
    out["centers"] = float(len(clustering.centers) // x.shape[1])
    out["_centers"] = np.asarray(clustering.centers, dtype=np.float64).reshape(-1, x.shape[1])  # type: ignore[assignment]
    return out


def _small_found(centers: NDArray[np.float64], means: NDArray[np.float64]) -> float:
    """1 when some center's nearest true mean is the smallest cluster's (the last one), else 0."""
    nearest = np.argmin(((centers[:, None, :] - means[None]) ** 2).sum(axis=2), axis=1)
    return float(len(means) - 1 in set(nearest.tolist()))


def small_found_bound(kind: str, x: NDArray[np.float64], means: NDArray[np.float64], n: int, epsilon: float,
                      seed: int, params: dict[str, Any], draws: int = 200_000) -> dict[str, float]:
    """The ``small-bound`` experiment's figures for one seed and ``n`` devices (module docstring); ``x``
    (a sample of the points is enough) gives the campaign's box."""
    config = config_from_proto(build_campaign_config(kind, epsilon=epsilon, k=len(means), bounds=numeric_bounds(x),
                                                     seed=seed, **params))
    engine: Any = prepare_campaign(config).engine
    if kind == "nettree":
        mechanism, share = engine.vector.mechanism, 1.0 - float(engine.params.refinement_share)
    elif kind == "stemmer":
        mechanism, share = engine.vector_components[0].mechanism, engine.share("lloyd" if engine.lloyd else "means")
    else:
        raise ValueError(f"the small-cluster bound covers nettree and stemmer, not {kind}")
    reports = share * n
    lower, upper = (np.asarray(b, dtype=np.float64) for b in numeric_bounds(x))
    # Per coordinate in box units ([-1, 1]), then in the data's units (the clusters' sigma is 1).
    se = math.sqrt(reports * mechanism.report_mean_second_moment) / (SMALL_SHARES[-1] * reports) * (upper - lower) / 2
    centers = means[-1] + np.random.default_rng(seed).standard_normal((draws, means.shape[1])) * se
    found = np.argmin(((centers[:, None, :] - means[None]) ** 2).sum(axis=2), axis=1) == len(means) - 1
    return {"found_probability": float(found.mean()), "noise_norm": float(np.linalg.norm(se)),
            "nearest_other_mean": float(np.sort(np.linalg.norm(means[:-1] - means[-1], axis=1))[0]),
            "vector_epsilon": float(mechanism.epsilon), "reports": reports}


def _param_value(value: str) -> int | float | str:
    """A ``--param`` value: a number, or else a choice's name as the command line takes it (``privunit``)."""
    for parse in (int, float):
        try:
            return parse(value)
        except ValueError:
            pass
    return value


def _params(pairs: Sequence[str], kind: str, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        owner, _, field = key.partition(".")
        if owner == kind:
            out[field] = _param_value(value)
    if kind == "nettree":
        out.setdefault("expected_reports", n)  # as simulate does
    return out


def rows(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    seeds = TUNING_SEEDS[: args.seeds] if args.tuning else REPORTING_SEEDS[: args.seeds]
    for seed in seeds:
        if args.experiment == "mixture":
            cases = [("mixture d=10 k=8", *make_dataset("mixture", args.n, d=10, k=8, seed=seed), 8, None)]
        elif args.experiment == "floor":
            cases = [(f"mixture d={d} k={k}", *make_dataset("mixture", args.n, d=d, k=k, seed=seed), k, None)
                     for d, k in ((5, 6), (10, 8))]
        elif args.experiment == "small":
            x, y, means = small_cluster_data(args.n, seed)
            cases = [("small 2% d=5 k=6", x, y, len(SMALL_SHARES), means)]
        elif args.experiment == "small-bound":
            # The bounds need the points' box only: a sample of them gives it to well within the noise.
            x, _, means = small_cluster_data(min(args.n, 200_000), seed)
            for kind in args.kinds:
                row = {"data": "small 2% d=5 k=6 (bound)", "kind": kind, "seed": seed, "n": args.n,
                       "epsilon": args.epsilon, **small_found_bound(kind, x, means, args.n, args.epsilon, seed,
                                                                     _params(args.param, kind, args.n))}
                print(json.dumps(row), file=sys.stderr)
                yield row
            continue
        else:
            cases = [(name, *real_data(name, args.n, seed), 0, None) for name in args.datasets]
        for label, x, y, k, means in cases:
            assert y is not None
            k = k or int(y.max()) + 1
            if args.experiment in ("real", "small"):  # the trusted curator's figures on the same points
                reference = reference_kmeans(x, k, seed, 3).centers
                nonprivate: dict[str, Any] = {"data": label, "kind": "kmeans++ (non-private)", "seed": seed,
                                              "ari": adjusted_rand_index(y, np.argmin(
                                                  ((x[:, None, :] - reference[None]) ** 2).sum(axis=2), axis=1))}
                if means is not None:
                    nonprivate["small_cluster_found"] = _small_found(reference, means)
                yield nonprivate
            for kind in args.kinds:
                scores = run_kind(kind, x, y, k, args.epsilon, seed, _params(args.param, kind, len(x)))
                centers = scores.pop("_centers", None)
                if means is not None and centers is not None:
                    scores["small_cluster_found"] = _small_found(np.asarray(centers), means)
                row = {"data": label, "kind": kind, "seed": seed, "n": len(x), "epsilon": args.epsilon, **scores}
                print(json.dumps({key: row[key] for key in row if key in ("data", "kind", "seed", *SCORES,
                                                                           "seconds")}), file=sys.stderr)
                yield row


def summary(all_rows: list[dict[str, Any]]) -> str:
    """Median [worst seed] per (data, kind) and score."""
    keys = sorted({(r["data"], r["kind"]) for r in all_rows})
    lower = {"cost_ratio", "cost_over_floor", "center_error_over_floor", "noise_norm"}
    head = ["data", "kind", "seeds", *SCORES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for data, kind in keys:
        rs = [r for r in all_rows if r["data"] == data and r["kind"] == kind]
        cells = [data, kind, str(len(rs))]
        for score in SCORES:
            values = [float(r[score]) for r in rs if score in r]
            if not values:
                cells.append("")
                continue
            worst = max(values) if score in lower else min(values)
            cells.append(f"{statistics.median(values):.3g} [{worst:.3g}]")
        lines.append("| " + " | ".join(cells) + " |")
    for data, kind in keys:
        chances = [float(r["found_probability"]) for r in all_rows
                   if r["data"] == data and r["kind"] == kind and "found_probability" in r]
        if chances:
            # Poisson-binomial: the number of seeds (of these) on which the bound's center is found.
            law = np.array([1.0])
            for p in chances:
                law = np.convolve(law, [1.0 - p, p])
            need = math.ceil(0.9 * len(chances))
            lines.append(f"\n{kind}: expected {sum(chances):.2f} of {len(chances)} seeds; "
                         f"P(at least {need} of {len(chances)}) = {law[need:].sum():.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", choices=("mixture", "floor", "small", "small-bound", "real"), required=True)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--kinds", nargs="+", choices=CENTER_KINDS,
                        help="default: every center kind (small-bound: nettree and stemmer, the kinds it covers)")
    parser.add_argument("--datasets", nargs="+", default=["digits10", "cancer10", "wine5"])
    parser.add_argument("--seeds", type=int, default=10, help="the first N reporting (or tuning) seeds")
    parser.add_argument("--tuning", action="store_true", help="run on the tuning seeds 0-19")
    parser.add_argument("--param", action="append", default=[], metavar="KIND.FIELD=VALUE")
    parser.add_argument("--out", type=Path, help="JSON file of every run")
    args = parser.parse_args(argv)
    if args.experiment == "small-bound":
        args.kinds = args.kinds or list(BOUND_KINDS)
        if set(args.kinds) - set(BOUND_KINDS):
            parser.error(f"--experiment small-bound covers {' and '.join(BOUND_KINDS)}, not "
                         f"{', '.join(sorted(set(args.kinds) - set(BOUND_KINDS)))}")
    args.kinds = args.kinds or list(CENTER_KINDS)
    all_rows = list(rows(args))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"argv": sys.argv[1:], "rows": all_rows}, indent=1, default=float) + "\n")
    print(summary(all_rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
