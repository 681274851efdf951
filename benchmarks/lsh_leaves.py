"""Do the net-tree's SimHash leaves pool clusters? The leaves the engine builds, measured without noise.

No campaign and no privacy noise: for each seed the script draws the points, builds the nettree
engine the collector would build for them (``prepare_campaign``: its depth, bits per level,
projection, node epsilon, vector randomizer and thresholds, planned for ``expected_reports = n``),
hashes every point to its depth-``T`` node, and runs the engine's own server step
(:meth:`~ldp_collector.kinds.nettree.NetTreeEngine.server_step`) on *exact* node counts and *exact*
leaf sums, with the thresholds of the real campaign: each level's noise threshold uses the
zero-count standard error the level's frequency oracle would have at ``n / T`` reports, and the
vector floor the real randomizer's second moment. So the kept leaves are those a noisy campaign
keeps when its counts are right, and their centers are those of weighted k-means on the *true*
leaf means.

Per seed and node map it reports

- ``pooled``: the share of the population in kept leaves whose majority cluster holds less than
  ``PURE`` (90 %) of the leaf: such a leaf's mean sits between its clusters;
- ``coverage``: the share of the population in kept leaves;
- ``cost_ratio`` and ``ari`` of the noiseless centers (cost over that of non-private k-means, the
  harness's reference, ``reference_kmeans_cost``), and the number of kept ``leaves``;
- ``truth_cost_ratio``: the cost ratio of the kept leaves grouped by the truth instead of by the
  coreset's k-means: one center per true cluster that is the majority of some kept leaf, the
  pooled mean of those leaves (``lost`` clusters are the majority of no kept leaf and get no
  center). Where it is no lower than ``cost_ratio``, no grouping of these leaves' means does
  better: the leaves themselves, not the clustering of them, set the cost.

Node maps (``--maps``)
    ``origin``       the engine's SimHash: bit i = 1 iff ``<g_i, z> >= 0`` (hyperplanes through the box centre).
    ``offset:S``     offset hyperplanes (:func:`offset_simhash`, not a wire rule): bit i = 1 iff
                     ``<g_i, z> >= b_i``, ``b_i = S r ||g_i|| (2 u_i - 1)`` with ``u_i`` public
                     uniforms in [0, 1) and ``r = sqrt(d / (3 k))`` the spread of ``<g, z>`` (unit
                     ``g``) for a point uniform in the box.
    ``bits:B``       origin SimHash with ``B`` hyperplanes per level instead of the default.
    ``depth:T``      origin SimHash with ``T`` levels (bits per level and node share planned for them).
    ``MAP+rest``     any of these, plus one *rest leaf* per branching depth-``T - 1`` node: the union of
                     its children that were not kept, when it passes the level's threshold; the coreset
                     (kept and rest leaves, true means) is clustered again with the engine's
                     ``coreset_centers``. A noisy rest leaf would sum the vector buckets of up to
                     ``2^b - 1`` children (their noise adds up); here it measures what the lost
                     fragments cost.
    ``grid:K``       the shifted grid over a ``K``-dimensional JL projection (the engine's
                     SHIFTED_GRID node map).

Seeds are the tuning seeds 0-19: nothing here may be chosen on the reporting seeds. ``--reporting`` runs the
reporting seeds 100-109 instead, to explain the campaigns' figures on them seed by seed (a diagnosis only).

What it found (n = 1e6, epsilon = 2, seeds 0-19, paired by seed against ``origin``)
    Pooled leaves decide the bad seeds of today's tree (the log cost ratio correlates 0.64 with
    ``pooled`` over the three data sets). Offsets do not remove them: at ``S`` = 0.25, 0.5, 1 the
    noiseless cost ratio is lower on 10, 8, 8 of 20 mixture (d = 10, k = 8) seeds, 11, 9, 5 of 20
    ``google`` seeds and 8, 9, 11 of 20 mixture (d = 5, k = 6) seeds: which seeds are bad changes
    with the draw, not how many. Three bits per level remove the pooling (``pooled`` lower on 16,
    11 and 17 seeds, higher on at most 1) but lose coverage (0.889 to 0.775 on the mixture), and
    the bad seeds become those that lost a cluster's fragments under the node threshold (the log
    cost ratio then correlates -0.62 with ``coverage``).

What it explains (``--reporting``, mixture d = 10, k = 8, epsilon = 2, seeds 100-109)
    Without any privacy noise the server step's median cost ratio is 2.04 at n = 1e6 and 2.35 at
    1e7, and grouping the kept leaves by the truth is no lower on any seed: the leaves, not their
    clustering, keep nettree above its cost targets (``benchmarks/README.md``, "What bounds
    nettree's two cost targets"). Half the bad seeds lose a cluster in fragments under the
    threshold rather than pool two.

Usage::

    python benchmarks/lsh_leaves.py --n 1000000 --seeds 20 --data mixture:10:8 google:10:8 mixture:5:6 \\
        --maps origin offset:0.25 offset:0.5 offset:1 --out lsh_leaves_offsets.json
    python benchmarks/lsh_leaves.py --n 1000000 --seeds 20 --data mixture:10:8 google:10:8 mixture:5:6 \\
        --maps origin bits:3 depth:5 bits:3+rest origin+rest --out lsh_leaves_bits.json
    python benchmarks/lsh_leaves.py --reporting --n 1000000 --seeds 10 --maps origin   # and --n 10000000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from harness.suites import REPORTING_SEEDS, TUNING_SEEDS
from numpy.typing import NDArray

from ldp_client.encoders.lsh import SimHashEncoder
from ldp_client.encoders.projection import uniform_values
from ldp_collector.campaigns import prepare_campaign
from ldp_collector.cli_args import build_campaign_config
from ldp_collector.estimation.kmeans import assign
from ldp_collector.estimation.net_tree import coreset_centers
from ldp_collector.kinds._lsh import exact_counts, exact_sums, lsh_nodes
from ldp_collector.kinds.nettree import CORESET_RESTARTS, NetTreeEngine, NodeMap, leaf_nodes
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.population import numeric_bounds
from ldp_collector.simulation.scores import adjusted_rand_index, kmeans_cost, reference_kmeans_cost

#: Stream tag of the study's hyperplane offsets (8 ASCII bytes, big-endian, as the SDK's public streams).
OFFSET_PURPOSE = int.from_bytes(b"ldp.offs", "big")
#: Suffix of a node map (``bits:3+rest``): add the rest leaves (:func:`_with_rest_leaves`).
REST = "+rest"
#: A leaf is pure when its majority cluster holds at least this share of it.
PURE = 0.9
SCORES = ("pooled", "coverage", "cost_ratio", "truth_cost_ratio", "lost", "ari", "leaves")
#: Scores where lower is better (the worst seed is the largest).
LOWER = {"pooled", "cost_ratio", "truth_cost_ratio", "lost"}


def engine_for(x: NDArray[np.float64], k: int, seed: int, epsilon: float, node_map: str) -> NetTreeEngine:
    """The nettree engine the collector builds for these points (``simulate``'s config), with ``node_map``."""
    config = config_from_proto(build_campaign_config("nettree", epsilon=epsilon, k=k, bounds=numeric_bounds(x),
                                                     seed=seed, expected_reports=len(x)))
    kind, _, value = node_map.removesuffix(REST).partition(":")
    params = config.parameters
    if kind == "bits":
        params = replace(params, bits_per_level=int(value))
    elif kind == "depth":
        params = replace(params, depth=int(value))
    elif kind == "grid":
        params = replace(params, node_map=NodeMap.SHIFTED_GRID, projection_dimension=int(value))
    elif kind not in ("origin", "offset"):
        raise ValueError(f"unknown node map {node_map!r}")
    engine = prepare_campaign(replace(config, parameters=params)).engine
    assert isinstance(engine, NetTreeEngine)
    return engine


def offset_simhash(leaf: SimHashEncoder, x: NDArray[np.float64], scale: float) -> NDArray[np.uint64]:
    """The leaf SimHash with offset hyperplanes (a study-only hash; ``scale`` 0 is the encoder itself).

    Bit ``i`` is 1 iff ``<g_i, z> >= b_i`` with ``b_i = S r ||g_i|| (2 u_i - 1)``: hyperplane ``i``
    at the signed distance ``S r (2 u_i - 1)`` from the box centre, ``u_i`` the public uniforms of
    the stream ``(seed, "ldp.offs")`` and ``r = sqrt(d / (3 k))`` the spread of ``<g, z>`` (unit
    ``g``) for a point uniform in the box.
    """
    if not scale:
        return lsh_nodes(leaf, x)
    lower = np.asarray(leaf.domain.lower, dtype=np.float64)
    upper = np.asarray(leaf.domain.upper, dtype=np.float64)
    z = 2.0 * np.clip((x - lower) / (upper - lower), 0.0, 1.0) - 1.0
    if leaf.projection is not None:
        z = z @ np.asarray(leaf.projection.matrix, dtype=np.float64).T
    g = np.asarray(leaf.hyperplanes, dtype=np.float64)
    u = np.asarray(uniform_values(leaf.seed, OFFSET_PURPOSE, leaf.bits))
    offsets = scale * np.sqrt(leaf.domain.dimension / (3.0 * g.shape[1])) * np.linalg.norm(g, axis=1) * (2.0 * u - 1.0)
    bits = (z @ g.T >= offsets).astype(np.uint64)
    weights = np.left_shift(np.uint64(1), np.arange(leaf.bits - 1, -1, -1, dtype=np.uint64))
    out: NDArray[np.uint64] = (bits * weights).sum(axis=1, dtype=np.uint64)
    return out


def study_leaves(engine: NetTreeEngine, x: NDArray[np.float64], node_map: str) -> NDArray[np.uint64]:
    """Every point's leaf under the engine's node map, with offset hyperplanes for ``offset:S``."""
    kind, _, value = node_map.removesuffix(REST).partition(":")
    leaf = engine.node_encoders[-1]
    if kind == "offset" and isinstance(leaf, SimHashEncoder):
        return offset_simhash(leaf, x, float(value))
    return leaf_nodes(engine, x)


def leaf_study(engine: NetTreeEngine, x: NDArray[np.float64], labels: NDArray[np.int64], k: int,
               reference_cost: float, node_map: str, seed: int = 0) -> dict[str, float]:
    """The engine's server step on exact counts and sums with the real campaign's thresholds (module docstring)."""
    n = len(x)
    layout = engine.layout
    levels, b = layout.levels, layout.child_bits
    leaves = study_leaves(engine, x, node_map)
    lower = np.asarray(engine.domain.lower, dtype=np.float64)
    upper = np.asarray(engine.domain.upper, dtype=np.float64)
    y = 2.0 * np.clip((x - lower) / (upper - lower), 0.0, 1.0) - 1.0
    # The level's oracle over its n / T reports, scaled to the population as close_round scales it.
    level_reports = n / levels
    zero_se = [float(c.mechanism.count_variance(level_reports)) ** 0.5 * levels  # type: ignore[attr-defined]
               for c in engine.node_components]
    kept: list[NDArray[np.uint64]] = []
    tested: list[NDArray[np.uint64]] = []

    def estimate(level: int, candidates: NDArray[np.uint64]) -> tuple[NDArray[np.float64], float]:
        if level == levels:
            tested.append(candidates)
        return exact_counts(leaves >> np.uint64(b * (levels - level)), candidates), zero_se[level - 1]

    def leaf_sums(nodes: NDArray[np.uint64]) -> NDArray[np.float64]:
        kept.append(nodes)
        return exact_sums(leaves, nodes, y)

    vector = engine.vector.mechanism
    outcome = engine.server_step(n, estimate, leaf_sums,
                                 vector_variance=float(vector.report_second_moment))  # type: ignore[attr-defined]
    out: dict[str, float] = {"leaves": float(kept[0].size) if kept else 0.0}
    if not kept or outcome.result is None or outcome.result.clustering is None:
        return {**out, "pooled": float("nan"), "coverage": 0.0, "cost_ratio": float("inf"), "ari": 0.0}
    nodes = np.sort(kept[0])
    pos = np.clip(np.searchsorted(nodes, leaves), 0, nodes.size - 1)
    group = np.where(nodes[pos] == leaves, pos, -1)
    centers = np.asarray(outcome.result.clustering.centers, dtype=np.float64).reshape(-1, x.shape[1])
    if node_map.endswith(REST) and tested:
        group, centers = _with_rest_leaves(engine, y, leaves, group, nodes.size, np.unique(tested[-1] >> np.uint64(b)),
                                           float(outcome.diagnostics[f"level_{levels}_threshold"]), k, seed)
        out["leaves"] = float(group.max() + 1)
    member = group >= 0
    table = np.zeros((int(group.max()) + 1, int(labels.max()) + 1))
    np.add.at(table, (group[member], labels[member]), 1.0)
    size = table.sum(axis=1)
    impure = table.max(axis=1) < PURE * size
    out.update(pooled=float(size[impure].sum() / n), coverage=float(size.sum() / n),
               cost_ratio=kmeans_cost(x, centers) / reference_cost,
               ari=adjusted_rand_index(labels, assign(x, centers)[0]))
    # The same leaves grouped by their majority true cluster.
    majority = table.argmax(axis=1)
    member_sums = np.column_stack([np.bincount(group[member], weights=y[member, j], minlength=table.shape[0])
                                   for j in range(y.shape[1])])
    found = [c for c in range(table.shape[1]) if np.any((majority == c) & (size > 0))]
    truth = np.array([member_sums[(majority == c) & (size > 0)].sum(axis=0) / size[(majority == c) & (size > 0)].sum()
                      for c in found])
    truth_centers = lower + (np.clip(truth, -1.0, 1.0) + 1.0) / 2.0 * (upper - lower)
    out.update(truth_cost_ratio=kmeans_cost(x, truth_centers) / reference_cost, lost=float(table.shape[1] - len(found)))
    return out


def _with_rest_leaves(engine: NetTreeEngine, y: NDArray[np.float64], leaves: NDArray[np.uint64],
                      group: NDArray[np.int64], kept: int, parents: NDArray[np.uint64], threshold: float, k: int,
                      seed: int) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """``+rest``: each branching depth-``T - 1`` node adds the union of its children that were not kept as one more
    leaf (when that union passes the level's threshold), and the coreset is clustered again on the true means.

    Returns every point's leaf (-1: none) and the centers in the data's units.
    """
    parent = leaves >> np.uint64(engine.layout.child_bits)
    spot = np.clip(np.searchsorted(parents, parent), 0, parents.size - 1)
    group = np.where((group < 0) & (parents[spot] == parent), kept + spot, group)
    member = group >= 0
    counts = np.bincount(group[member], minlength=kept + parents.size)
    # The kept leaves stay; a rest leaf must pass the threshold its level's nodes had to pass.
    keep = (counts > 0) & ((np.arange(counts.size) < kept) | (counts >= threshold))
    renumber = np.where(keep, np.cumsum(keep) - 1, -1)
    group = np.where(member, renumber[np.where(member, group, 0)], -1)
    member = group >= 0
    size = int(keep.sum())
    sums = np.column_stack([np.bincount(group[member], weights=y[member, j], minlength=size) for j in range(y.shape[1])])
    weights = np.bincount(group[member], minlength=size).astype(np.float64)
    fit = coreset_centers(sums, weights, k, np.random.default_rng(seed), n_init=CORESET_RESTARTS)
    lower = np.asarray(engine.domain.lower, dtype=np.float64)
    upper = np.asarray(engine.domain.upper, dtype=np.float64)
    return group, lower + (np.clip(fit.centers, -1.0, 1.0) + 1.0) / 2.0 * (upper - lower)


def rows(data: Sequence[str], maps: Sequence[str], n: int, seeds: Sequence[int],
         epsilon: float) -> Iterator[dict[str, Any]]:
    """One row per (data, seed, node map)."""
    for spec in data:
        name, d, k = spec.split(":")
        for seed in seeds:
            x, labels = make_dataset(name, n, d=int(d), k=int(k), seed=seed)
            assert labels is not None
            reference = reference_kmeans_cost(x, int(k), seed)
            for node_map in maps:
                engine = engine_for(x, int(k), seed, epsilon, node_map)
                row = {"data": spec, "map": node_map, "seed": seed, "n": n, "epsilon": epsilon,
                       "bits_per_level": engine.layout.child_bits, "depth": engine.layout.levels,
                       **leaf_study(engine, x, labels, int(k), reference, node_map, seed)}
                print(json.dumps(row), file=sys.stderr)
                yield row


def summary(all_rows: list[dict[str, Any]]) -> str:
    """Median [worst seed] per (data, node map), and the paired per-seed wins over ``origin``."""
    keys = list(dict.fromkeys((r["data"], r["map"]) for r in all_rows))
    head = ["data", "map", "seeds", *SCORES, "cost ratio below origin's"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for data, node_map in keys:
        rs = [r for r in all_rows if r["data"] == data and r["map"] == node_map]
        cells = [data, node_map, str(len(rs))]
        for score in SCORES:
            values = [float(r[score]) for r in rs]
            worst = max(values) if score in LOWER else min(values)
            cells.append(f"{statistics.median(values):.3g} [{worst:.3g}]")
        base = {r["seed"]: r["cost_ratio"] for r in all_rows if r["data"] == data and r["map"] == "origin"}
        paired = [(r["cost_ratio"], base[r["seed"]]) for r in rs if r["seed"] in base]
        cells.append(f"{sum(a < b for a, b in paired)} of {len(paired)}" if base and node_map != "origin" else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--seeds", type=int, default=20, help="the first N tuning seeds (0-19)")
    parser.add_argument("--reporting", action="store_true",
                        help="run the first N reporting seeds (100-109) instead: a diagnosis beside the campaigns' "
                             "figures on those seeds; nothing may be chosen on them")
    parser.add_argument("--data", nargs="+", default=["mixture:10:8"], help="name:d:k of make_dataset")
    parser.add_argument("--maps", nargs="+", default=["origin", "offset:0.5", "offset:1"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    seeds = REPORTING_SEEDS if args.reporting else TUNING_SEEDS
    if not 1 <= args.seeds <= len(seeds):
        parser.error(f"--seeds must be in [1, {len(seeds)}]")
    all_rows = list(rows(args.data, args.maps, args.n, seeds[:args.seeds], args.epsilon))
    print(summary(all_rows))
    if args.out:
        args.out.write_text(json.dumps(all_rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
