"""The center kinds against issue 18's acceptance, over seeds: medians with the worst seed.

Every run is a whole campaign through the in-process collector (real engine, real SQLite store),
the devices simulated as ``ldp-collector simulate`` does (``mode="auto"``: the SDK per device up to
50 000 devices, the distribution-pinned vectorized path above), the result scored on the true points
(``ldp_collector.simulation.evaluation.evaluate_clustering``: ARI, cost ratio against the best of
non-private k-means++, and the result's own noise floor: ``cost_over_floor``,
``center_error_over_floor``).

Experiments (``--experiment``)
    ``mixture``  Gaussian mixture d = 10, k = 8 (``make_dataset("mixture")``) at ``--n`` and ``--epsilon``:
                 ARI, cost ratio, cost / floor for ``--kinds``. ``--epsilon inf`` (stemmer only) runs every
                 round's server step on exact counts and sums instead of a campaign
                 (:func:`~ldp_collector.kinds.stemmer.noiseless_outcome`): the algorithm without its noise,
                 planned as at :data:`NOISELESS_PLAN_EPSILON`. Nettree's is ``benchmarks/lsh_leaves.py``.
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
    ``real-bound``  no campaign: for the real data (``--datasets``, default digits10) and each of ``--kinds``
                 (nettree, stemmer, ldp_kmeans, laplace), ideal centers: non-private k-means++'s centers
                 (their Voronoi cells the clusters) or the true class means (the classes), each plus
                 Gaussian noise of the variance the kind's own estimate of that cluster's mean carries
                 (:func:`ideal_center_variances`: the kind's plan, mechanism and pooling at ``--n`` and
                 ``--epsilon``); every point labelled by its nearest noisy center, the ARI against the
                 true labels, median over ``--draws`` noise draws, over non-private k-means++'s ARI. The
                 sweep ``--multipliers`` plans the kind for m times the devices (the noise variance
                 about 1 / m): where would 70 % of k-means' ARI become reachable? A minute per seed.

``--seeds`` are the reporting seeds 100-109 unless ``--tuning`` (seeds 0-19, where defaults may be
chosen). Options are passed to the kinds as ``--param kind.field=value`` (e.g.
``nettree.refinement_share=0.3``, ``nettree.vector_shape=privunit``: a choice by its name).
A long run splits over processes with ``--skip K`` (leave out the first K of the seeds) and its
parts join with ``--merge`` (the ``--out`` files of the other parts): e.g. ``--seeds 5 --out a.json``
beside ``--skip 5 --out b.json``, then ``--seeds 0 --merge a.json b.json``.

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
from harness.suites import REPORTING_SEEDS, TUNING_SEEDS
from numpy.typing import NDArray

from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams
from ldp_collector.campaigns import prepare_campaign
from ldp_collector.cli_args import build_campaign_config
from ldp_collector.core import Collector
from ldp_collector.estimation.center_floor import expected_norm, unit_to_data_variance
from ldp_collector.estimation.kmeans import assign
from ldp_collector.estimation.vectors import normalized_variance
from ldp_collector.kinds._lsh import exact_counts, exact_sums, vector_shape
from ldp_collector.kinds.nettree import leaf_nodes
from ldp_collector.kinds.stemmer import StemmerEngine
from ldp_collector.kinds.stemmer import noiseless_outcome as stemmer_noiseless
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.evaluation import evaluate_clustering
from ldp_collector.simulation.population import numeric_bounds
from ldp_collector.simulation.runner import run_campaign
from ldp_collector.simulation.scores import adjusted_rand_index, reference_kmeans
from ldp_collector.storage import open_store

CENTER_KINDS = ("nettree", "stemmer", "ldp_kmeans", "bitvector", "laplace")
#: The epsilon an ``--epsilon inf`` run is planned for (its config; the mixture acceptance's).
NOISELESS_PLAN_EPSILON = 2.0
#: The kinds whose vector sums the small-cluster bound models.
BOUND_KINDS = ("nettree", "stemmer")
#: The kinds whose center noise the real-data bound models (:func:`ideal_center_variances`).
REAL_BOUND_KINDS = ("nettree", "stemmer", "ldp_kmeans", "laplace")
#: The real-data bound's noise-scale sweep: the campaign as if ``m n`` devices reported (planned for them).
REPORT_MULTIPLIERS = (0.25, 0.5, 1.0, 2.0, 4.0, 10.0)
#: Noise draws per (seed, kind, centers, multiplier) of the real-data bound.
REAL_BOUND_DRAWS = 100
#: The share of non-private k-means' ARI issue 18 asks of the best LDP kind on real data.
REAL_TARGET = 0.7
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
    """One whole campaign of ``kind`` on ``x``, scored as ``simulate`` scores it (``epsilon`` inf: stemmer's
    server steps on exact counts and sums, module docstring)."""
    noiseless = math.isinf(epsilon)
    if noiseless and kind != "stemmer":
        raise ValueError(f"--epsilon inf runs stemmer's noiseless server steps, not {kind}'s "
                         "(nettree's: benchmarks/lsh_leaves.py)")
    config = config_from_proto(build_campaign_config(kind, epsilon=NOISELESS_PLAN_EPSILON if noiseless else epsilon,
                                                     k=k, bounds=numeric_bounds(x), seed=seed, **params))
    started = time.perf_counter()
    if noiseless:
        engine = prepare_campaign(config).engine
        assert isinstance(engine, StemmerEngine)
        result = stemmer_noiseless(engine, x).result
        assert result is not None
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = run_campaign(Collector(open_store(tmp)), config, x, seed=seed, mode="auto", quiet=True).result
    seconds = time.perf_counter() - started
    out: dict[str, float] = {"seconds": seconds}
    clustering = result.clustering
    if clustering is None or not clustering.centers:
        out.update(ari=0.0, cost_ratio=math.inf)
        return out
    out.update(evaluate_clustering(result, x, labels, k=k, seed=seed))
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


def ideal_center_variances(kind: str, x: NDArray[np.float64], partition: NDArray[np.int64],
                           centers: NDArray[np.float64], devices: float, epsilon: float, seed: int,
                           params: dict[str, Any]) -> tuple[NDArray[np.float64], dict[str, float]]:
    """Per-coordinate noise variance, in the data's units, of an ideal center for every cluster of
    ``partition``: the kind's own estimate of the cluster's mean from exactly its devices' reports.

    ``x`` stands for ``devices`` devices (every count scales by ``devices / len(x)``), the campaign's box
    is ``numeric_bounds(x)`` and the kind is planned as ``simulate`` plans it for ``devices``. With ``c_j``
    the devices of cluster ``j`` among the ``n'`` reports of the round the centers come from:

    ``stemmer``     the Lloyd round (its share of the devices, the round's epsilon): ``n' M / c_j^2`` in box
                    units (``[-1, 1]``), M the bucketized vector's per-report mean second moment
                    (``report_mean_second_moment``), as ``lloyd_move`` and the result's floor pool them.
    ``nettree``     round 1's leaf sums: ``L_j n' M / w_j^2``, the ``L_j`` leaves whose true mean is
                    nearest center ``j`` pooled (``w_j`` their devices), the leaves those the engine's own
                    server step keeps on exact counts with the campaign's thresholds (each level's oracle
                    at ``n' / T`` reports, the vector floor); with ``refinement_share``, its Lloyd round
                    as for stemmer at the whole epsilon.
    ``ldp_kmeans``  the last label round (GRR label ``p``, ``q`` and a fresh vector of per-coordinate
                    variance ``V``, ``normalized_variance``: the worst case, over by at most
                    ``(t - 1/2)^2``): the expected plug-in of ``label_update_passes``,
                    ``sum_i E[a_i^2] (V + (t_i - c_j)^2) / ((p - q) c_j)^2`` in ``[0, 1]`` units, with
                    ``E[a_i^2] = p (1 - q)^2 + (1 - p) q^2`` for the cluster's devices and ``q (1 - q)``
                    for every other device of the round.
    ``laplace``     the one round: ``Var / c_j`` in ``[0, 1]`` units (``noise_variance``), the cluster's
                    noisy points averaged, as the result's floor counts them.

    A center no leaf is pooled into gets an infinite variance (no center). Returns the ``(k, d)``
    variances and the plan's figures (the centers' vector epsilon and round reports; nettree: the
    leaves per center).
    """
    n, d = x.shape
    k = len(centers)
    lower, upper = (np.asarray(b, dtype=np.float64) for b in numeric_bounds(x))
    config = config_from_proto(build_campaign_config(kind, epsilon=epsilon, k=k, bounds=numeric_bounds(x), seed=seed,
                                                     **params))
    engine: Any = prepare_campaign(config).engine
    scale = devices / n
    counts = np.bincount(partition, minlength=k).astype(np.float64)
    info: dict[str, float] = {}
    if kind == "stemmer" or (kind == "nettree" and engine.params.refinement_share):
        if kind == "stemmer":
            if not engine.lloyd:
                raise ValueError("the real-data bound models stemmer's Lloyd round, not lloyd_refinement=0")
            share, mechanism = engine.share("lloyd"), engine.vector_components[0].mechanism
        else:
            share = float(engine.params.refinement_share)
            mechanism = BucketizedVectorParams(bucket_bits=0, dimension=d + 1, epsilon=epsilon,
                                               shape=vector_shape(d + 1, epsilon, engine.params.vector_shape))
        reports = share * devices
        unit = reports * mechanism.report_mean_second_moment / (share * scale * counts) ** 2
        variances = unit_to_data_variance(np.where(counts > 0, unit, np.inf), lower, upper, unit_width=2.0)
        info.update(vector_epsilon=float(mechanism.epsilon), round_reports=reports)
    elif kind == "nettree":
        variances, info = _nettree_leaf_variances(engine, x, centers, devices, lower, upper)
    elif kind == "ldp_kmeans":
        plan = engine.plan
        share = sum(plan.weights[g] for g in plan.round_groups[-1]) / sum(plan.weights)
        grr, vector = engine.label_mechanism, engine.label_vector_component.mechanism
        v = normalized_variance(vector)
        t = np.clip((x - lower) / (upper - lower), 0.0, 1.0)
        c = (centers - lower) / (upper - lower)
        inside1 = np.column_stack([np.bincount(partition, weights=t[:, j], minlength=k) for j in range(d)])
        inside2 = np.column_stack([np.bincount(partition, weights=t[:, j] ** 2, minlength=k) for j in range(d)])
        # sum_i (t_i - c_j)^2 per coordinate, over the cluster's points and over all of them.
        spread_in = inside2 - 2.0 * c * inside1 + counts[:, None] * c**2
        spread_all = (t**2).sum(axis=0)[None, :] - 2.0 * c * t.sum(axis=0)[None, :] + n * c**2
        p, q = grr.p, grr.q
        a_in, a_out = p * (1.0 - q) ** 2 + (1.0 - p) * q**2, q * (1.0 - q)
        per_point = share * scale  # the round's devices per point of x
        spread = per_point * (a_in * (counts[:, None] * v + spread_in)
                              + a_out * ((n - counts)[:, None] * v + spread_all - spread_in))
        with np.errstate(divide="ignore"):
            unit = spread / ((p - q) * per_point * counts[:, None]) ** 2
        variances = unit * (upper - lower)[None, :] ** 2
        info.update(vector_epsilon=float(vector.epsilon), label_epsilon=float(grr.epsilon),
                    round_reports=share * devices)
    elif kind == "laplace":
        mechanism = engine.mechanism
        with np.errstate(divide="ignore"):
            unit = mechanism.noise_variance / (scale * counts)
        variances = unit_to_data_variance(unit, lower, upper, unit_width=1.0)
        info.update(vector_epsilon=float(mechanism.epsilon), round_reports=float(devices))
    else:
        raise ValueError(f"the real-data bound covers {', '.join(REAL_BOUND_KINDS)}, not {kind}")
    return variances, info


def _nettree_leaf_variances(engine: Any, x: NDArray[np.float64], centers: NDArray[np.float64], devices: float,
                            lower: NDArray[np.float64], upper: NDArray[np.float64]
                            ) -> tuple[NDArray[np.float64], dict[str, float]]:
    """Nettree's round-1 center variances (:func:`ideal_center_variances`): its server step on exact counts
    and sums (scaled to ``devices``) keeps the leaves, each pooled into the center nearest its true mean."""
    n, d = x.shape
    layout = engine.layout
    levels, b = layout.levels, layout.child_bits
    scale = devices / n
    leaves = leaf_nodes(engine, x)
    y = 2.0 * np.clip((x - lower) / (upper - lower), 0.0, 1.0) - 1.0
    # Each level's oracle over its devices / T reports, scaled to the population as close_round scales it.
    zero_se = [math.sqrt(c.mechanism.count_variance(devices / levels)) * levels for c in engine.node_components]
    kept: list[NDArray[np.uint64]] = []

    def estimate(level: int, candidates: NDArray[np.uint64]) -> tuple[NDArray[np.float64], float]:
        return scale * exact_counts(leaves >> np.uint64(b * (levels - level)), candidates), zero_se[level - 1]

    def leaf_sums(nodes: NDArray[np.uint64]) -> NDArray[np.float64]:
        kept.append(nodes)
        out: NDArray[np.float64] = scale * exact_sums(leaves, nodes, y)
        return out

    vector = engine.vector.mechanism
    engine.server_step(round(devices), estimate, leaf_sums, vector_variance=float(vector.report_second_moment),
                       floor_variance=float(vector.report_mean_second_moment))
    k = len(centers)
    nodes = kept[0] if kept else np.zeros(0, dtype=np.uint64)
    sums = exact_sums(leaves, nodes, np.column_stack([x, np.ones(n)]))
    weights = sums[:, d]
    nearest = (assign(sums[:, :d] / np.maximum(weights, 1.0)[:, None], centers)[0] if nodes.size
               else np.zeros(0, dtype=np.int64))
    pooled = np.bincount(nearest, minlength=k).astype(np.float64)
    w = scale * np.bincount(nearest, weights=weights, minlength=k)
    with np.errstate(divide="ignore", invalid="ignore"):
        unit = np.where(w > 0, pooled * devices * vector.report_mean_second_moment / w**2, np.inf)
    info = {"vector_epsilon": float(vector.epsilon), "round_reports": float(devices),
            "leaves_per_center": float(nodes.size) / k, "coverage": float(weights.sum()) / n}
    return unit_to_data_variance(unit, lower, upper, unit_width=2.0), info


def bound_aris(x: NDArray[np.float64], labels: NDArray[np.int64], centers: NDArray[np.float64],
               variances: NDArray[np.float64], z: NDArray[np.float64]) -> NDArray[np.float64]:
    """ARI against ``labels`` of the points labelled by their nearest noisy center, one per draw: the centers
    plus ``sqrt(variances) z[r]`` (``z``: ``(draws, k, d)`` standard normals), clipped to the box as the kinds
    clip theirs; a center of infinite variance is left out (none left: every point in one cluster, ARI 0)."""
    lower, upper = (np.asarray(b, dtype=np.float64) for b in numeric_bounds(x))
    live = np.asarray(np.isfinite(variances).all(axis=1), dtype=np.bool_)
    if not live.any():
        return np.zeros(len(z))
    sd = np.sqrt(np.where(live[:, None], variances, 0.0))
    out = np.empty(len(z))
    for r, noise in enumerate(z):
        noisy = np.clip(centers + sd * noise, lower, upper)[live]
        out[r] = adjusted_rand_index(labels, assign(x, noisy)[0])
    return out


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


def real_bound_rows(name: str, args: argparse.Namespace, seed: int) -> Iterator[dict[str, Any]]:
    """The ``real-bound`` experiment's rows for one data set and seed (module docstring).

    Non-private k-means++ (the reference of every ratio) and, for its centers (their Voronoi cells the
    clusters) and the true class means (the classes the clusters), each kind's ideal centers at every
    multiplier of ``--multipliers`` and without noise: per row the median ARI over ``--draws`` noise
    draws (the same standard normals for every kind and multiplier), its Monte Carlo standard error
    (``1.2533 sd / sqrt(draws)``) and the ratio to k-means' ARI.
    """
    x, y = real_data(name, args.n, seed)
    k, d = int(y.max()) + 1, x.shape[1]
    reference = reference_kmeans(x, k, seed, 3).centers
    nearest = assign(x, reference)[0]
    reference_ari = adjusted_rand_index(y, nearest)
    yield {"data": name, "kind": "kmeans++ (non-private)", "seed": seed, "n": args.n, "ari": reference_ari}
    means = np.column_stack([np.bincount(y, weights=x[:, j], minlength=k) for j in range(d)]) / np.bincount(
        y, minlength=k)[:, None]
    z = np.random.default_rng(seed).standard_normal((args.draws, k, d))
    for centers_name, centers, partition in (("k-means++ centers", reference, nearest), ("class means", means, y)):
        between = np.linalg.norm(centers[:, None] - centers[None], axis=2) + np.diag(np.full(k, np.inf))
        cases: list[tuple[str, float]] = [("none (noise-free)", math.inf)]
        cases += [(kind, m) for kind in args.kinds for m in args.multipliers]
        for kind, m in cases:
            info: dict[str, float]
            if math.isinf(m):
                variances, info = np.zeros((k, d)), {}
            else:
                variances, info = ideal_center_variances(kind, x, partition, centers, m * args.n, args.epsilon, seed,
                                                         _params(args.param, kind, round(m * args.n)))
            aris = bound_aris(x, y, centers, variances, z[:1] if math.isinf(m) else z)
            live = np.isfinite(variances).all(axis=1)
            row = {"data": name, "kind": kind, "centers": centers_name, "multiplier": m, "seed": seed, "n": args.n,
                   "epsilon": args.epsilon, "draws": len(aris), "ari": float(np.median(aris)),
                   "ari_ratio": float(np.median(aris)) / reference_ari,
                   "mc_se": float(1.2533 * aris.std() / math.sqrt(len(aris))),
                   "noise_norm": float(expected_norm(variances[live]).mean()) if live.any() else math.inf,
                   "nearest_other_center": float(np.median(between.min(axis=1))), "centers_lost": float((~live).sum()),
                   **info}
            print(json.dumps({key: row[key] for key in ("data", "kind", "centers", "multiplier", "seed", "ari",
                                                         "ari_ratio", "mc_se", "noise_norm")}), file=sys.stderr)
            yield row


def rows(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    seeds = (TUNING_SEEDS[: args.seeds] if args.tuning else REPORTING_SEEDS[: args.seeds])[args.skip:]
    for seed in seeds:
        # (label, points, labels, k (0: the labels' count), the true means of the small-cluster data or None)
        cases: list[tuple[str, NDArray[np.float64], Any, int, Any]]
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
        elif args.experiment == "real-bound":
            for name in args.datasets:
                yield from real_bound_rows(name, args, seed)
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


def _crossing(multipliers: Sequence[float], ratios: Sequence[float]) -> str:
    """Where ``ratios`` (over increasing ``multipliers``) first reach ``REAL_TARGET``: log-linear between grid points."""
    for i, (m, r) in enumerate(zip(multipliers, ratios)):
        if r >= REAL_TARGET:
            if i == 0:
                return f"<= {m:g}x"
            m0, r0 = multipliers[i - 1], ratios[i - 1]
            return f"{math.exp(math.log(m0) + (REAL_TARGET - r0) / (r - r0) * math.log(m / m0)):.2g}x"
    return f"> {multipliers[-1]:g}x" if multipliers else ""


def real_bound_summary(all_rows: list[dict[str, Any]]) -> str:
    """The ``real-bound`` tables: per (data, centers, kind), the ratio of the ideal centers' ARI to non-private
    k-means' at every multiplier, median [worst seed] over the seeds, and where the median and the worst
    seed reach ``REAL_TARGET`` (log-linear between the multipliers)."""
    lines: list[str] = []
    for data in sorted({r["data"] for r in all_rows}):
        reference = [float(r["ari"]) for r in all_rows if r["data"] == data and "multiplier" not in r]
        lines.append(f"{data}: non-private k-means++ ARI {statistics.median(reference):.3g} [{min(reference):.3g}] "
                     f"over {len(reference)} seeds")
    bound = [r for r in all_rows if "multiplier" in r]
    multipliers = sorted({float(r["multiplier"]) for r in bound if math.isfinite(r["multiplier"])})
    head = ["data", "centers", "kind", "seeds", "ARI at 1x", "noise norm at 1x", "nearest other center",
            *(f"ratio {m:g}x" for m in multipliers), "ratio noise-free",
            f"{REAL_TARGET:.0%} reached: median", "every seed"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = sorted({(r["data"], r["centers"], r["kind"]) for r in bound},
                  key=lambda key: (key[0], key[1], key[2] != "none (noise-free)", key[2]))
    for data, centers, kind in keys:
        rs = [r for r in bound if (r["data"], r["centers"], r["kind"]) == (data, centers, kind)]

        def at(m: float, score: str, rs: list[dict[str, Any]] = rs) -> list[float]:
            return [float(r[score]) for r in rs if r["multiplier"] == m]

        def cell(values: list[float], worst: Any = min) -> str:
            return f"{statistics.median(values):.3g} [{worst(values):.3g}]" if values else ""

        cells = [data, centers, kind, str(len({r["seed"] for r in rs})), cell(at(1.0, "ari")),
                 cell(at(1.0, "noise_norm"), max), cell(at(rs[0]["multiplier"], "nearest_other_center")),
                 *(cell(at(m, "ari_ratio")) for m in multipliers), cell(at(math.inf, "ari_ratio"))]
        grid = [m for m in multipliers if at(m, "ari_ratio")]
        cells += [_crossing(grid, [statistics.median(at(m, "ari_ratio")) for m in grid]),
                  _crossing(grid, [min(at(m, "ari_ratio")) for m in grid])] if grid else ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    mc = [float(r["mc_se"]) for r in bound if r["draws"] > 1]
    if mc:
        lines.append(f"\nMonte Carlo standard error of a seed's median ARI: median {statistics.median(mc):.2g}, "
                     f"largest {max(mc):.2g} ({max(r['draws'] for r in bound)} draws)")
    return "\n".join(lines)


def summary(all_rows: list[dict[str, Any]]) -> str:
    """Median [worst seed] per (data, kind) and score."""
    if any("multiplier" in r for r in all_rows):
        return real_bound_summary(all_rows)
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
    parser.add_argument("--experiment", choices=("mixture", "floor", "small", "small-bound", "real", "real-bound"),
                        required=True)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--kinds", nargs="+", choices=CENTER_KINDS,
                        help="default: every center kind (small-bound, real-bound: the kinds they cover)")
    parser.add_argument("--datasets", nargs="+", choices=("digits10", "cancer10", "wine5"),
                        help="real data (default: all three; real-bound: digits10)")
    parser.add_argument("--multipliers", nargs="+", type=float, default=list(REPORT_MULTIPLIERS),
                        help="real-bound: the devices as multiples of --n (the noise scale sweep)")
    parser.add_argument("--draws", type=int, default=REAL_BOUND_DRAWS, help="real-bound: noise draws per figure")
    parser.add_argument("--seeds", type=int, default=10, help="the first N reporting (or tuning) seeds")
    parser.add_argument("--skip", type=int, default=0,
                        help="leave out the first K of those seeds (split a long run over processes; --merge joins them)")
    parser.add_argument("--merge", type=Path, nargs="+", default=[],
                        help="--out files of runs over other seeds: their rows join this run's in the summary and --out")
    parser.add_argument("--tuning", action="store_true", help="run on the tuning seeds 0-19")
    parser.add_argument("--param", action="append", default=[], metavar="KIND.FIELD=VALUE")
    parser.add_argument("--out", type=Path, help="JSON file of every run")
    args = parser.parse_args(argv)
    if args.experiment == "small-bound":
        args.kinds = args.kinds or list(BOUND_KINDS)
        if set(args.kinds) - set(BOUND_KINDS):
            parser.error(f"--experiment small-bound covers {' and '.join(BOUND_KINDS)}, not "
                         f"{', '.join(sorted(set(args.kinds) - set(BOUND_KINDS)))}")
    if args.experiment == "real-bound":
        args.kinds = args.kinds or list(REAL_BOUND_KINDS)
        if set(args.kinds) - set(REAL_BOUND_KINDS):
            parser.error(f"--experiment real-bound covers {', '.join(REAL_BOUND_KINDS)}, not "
                         f"{', '.join(sorted(set(args.kinds) - set(REAL_BOUND_KINDS)))}")
        if args.draws < 1 or not all(m > 0 and math.isfinite(m) for m in args.multipliers):
            parser.error("--draws must be at least 1 and every --multipliers value positive")
        args.multipliers = sorted(set(args.multipliers))
    args.datasets = args.datasets or (["digits10"] if args.experiment == "real-bound" else
                                      ["digits10", "cancer10", "wine5"])
    args.kinds = args.kinds or list(CENTER_KINDS)
    if math.isinf(args.epsilon) and (args.experiment != "mixture" or args.kinds != ["stemmer"]):
        parser.error("--epsilon inf runs stemmer's noiseless server steps: it needs --experiment mixture --kinds "
                     "stemmer (nettree's: benchmarks/lsh_leaves.py)")
    if args.skip < 0 or args.seeds < 0:
        parser.error("--seeds and --skip must not be negative")
    merged = [row for path in args.merge for row in _merged_rows(path, args)]
    all_rows = merged + list(rows(args))
    runs = [(r.get("data"), r.get("kind"), r.get("centers"), r.get("multiplier"), r.get("seed")) for r in all_rows]
    if len(set(runs)) != len(runs):
        parser.error("--merge: the parts hold the same run twice (overlapping seeds)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"argv": sys.argv[1:], "rows": all_rows}, indent=1, default=float) + "\n")
    print(summary(all_rows))
    return 0


def _merged_rows(path: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows of an earlier ``--out`` file of the same experiment at the same n and epsilon, or
    ``SystemExit`` with one line naming the file."""
    try:
        rows_ = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--merge {path}: not a results file of this script ({exc})") from None
    if not isinstance(rows_, list) or not all(isinstance(r, dict) for r in rows_):
        raise SystemExit(f"--merge {path}: its rows are not a list of runs")
    other = {(r.get("n"), r.get("epsilon")) for r in rows_ if "n" in r} - {(args.n, args.epsilon)}
    if other:
        n, eps = sorted(other, key=str)[0]
        raise SystemExit(f"--merge {path}: its runs are at n = {n}, epsilon = {eps}, not this run's n = {args.n}, "
                         f"epsilon = {args.epsilon:g}")
    return rows_


if __name__ == "__main__":
    raise SystemExit(main())
