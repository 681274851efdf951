"""Which of stemmer's rounds costs it accuracy: whole campaigns with chosen rounds made exact.

A diagnosis; nothing is chosen on it. For every seed and every ``--exact`` set, one stemmer campaign
runs through the in-process collector exactly as ``center_acceptance.py`` runs it (same data, plan,
simulated devices and scoring), except that the rounds named in the set take their server step's
input computed from every device's true point (:class:`ldp_collector.kinds.stemmer.ExactInputs`, as
``noiseless_outcome`` does for all four) instead of from the round's reports. The letters are the
engine's rounds: ``A`` heavy keys, ``B`` bucket means (the candidates), ``C`` candidate weights, ``D``
the Lloyd step; ``-`` is the campaign as it is. Scores: the ARI of the published centers, the ARI of
round C's centers (before the Lloyd step) and non-private k-means++'s ARI on the same points.

Usage::

    python benchmarks/stemmer_rounds.py --dataset digits10 --n 300000 --epsilon 4 --seeds 10 --exact - A B C D
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from center_acceptance import real_data, run_kind
from harness.suites import REPORTING_SEEDS, TUNING_SEEDS
from numpy.typing import NDArray

from ldp_client.spec import MAX_EPSILON_PER_CAMPAIGN
from ldp_collector.estimation.kmeans import assign
from ldp_collector.kinds.stemmer import ExactInputs, StemmerEngine
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.scores import adjusted_rand_index, reference_kmeans

ROUNDS = "ABCD"
#: Fewest devices a run takes: below it a campaign's subgroups hear from no device.
MIN_DEVICES = 1000


@contextlib.contextmanager
def exact_rounds(rounds: str, points: NDArray[np.float64], seen: dict[str, Any]) -> Iterator[None]:
    """Within the block, every stemmer engine's rounds in ``rounds`` run on exact inputs from ``points``;
    ``seen["centers"]`` records round C's centers (data units) of the last campaign."""
    if set(rounds) - set(ROUNDS):
        raise ValueError(f"rounds are letters of {ROUNDS!r}, got {rounds!r}")
    original = {name: getattr(StemmerEngine, name) for name in ("_close_keys", "_close_means", "_close_weights",
                                                                "_close_lloyd")}
    cache: dict[str, ExactInputs] = {}  # one campaign's public randomness: one set of exact inputs

    def inputs(engine: StemmerEngine) -> ExactInputs:
        if engine.campaign_id not in cache:
            cache.clear()
            cache[engine.campaign_id] = ExactInputs(engine, points)
        return cache[engine.campaign_id]

    def keys(engine: StemmerEngine, spec: Any, reports: Any) -> Any:
        if "A" not in rounds:
            return original["_close_keys"](engine, spec, reports)
        exact = inputs(engine)
        return engine.keys_step(spec.round, exact.n, exact.key_counts)

    def means(engine: StemmerEngine, spec: Any, reports: Any, state: dict[str, Any]) -> Any:
        if "B" not in rounds:
            return original["_close_means"](engine, spec, reports, state)
        return engine.means_step(spec.round, state, inputs(engine).bucket_sums)

    def weights(engine: StemmerEngine, spec: Any, reports: Any, state: dict[str, Any]) -> Any:
        if "C" not in rounds:
            return original["_close_weights"](engine, spec, reports, state)
        exact = inputs(engine)
        return engine.weights_step(spec.round, state, exact.candidate_weights(state), 0.0, exact.n)

    def lloyd(engine: StemmerEngine, spec: Any, reports: Any, state: dict[str, Any]) -> Any:
        seen["centers"] = engine._to_original(np.asarray(state["centers"], dtype=np.float64).reshape(-1, engine.dimension))
        if "D" not in rounds:
            return original["_close_lloyd"](engine, spec, reports, state)
        exact = inputs(engine)
        return engine.lloyd_step(state, exact.center_sums(state), 0.0, exact.n)

    patched = {"_close_keys": keys, "_close_means": means, "_close_weights": weights, "_close_lloyd": lloyd}
    try:
        for name, fn in patched.items():
            setattr(StemmerEngine, name, fn)
        yield
    finally:
        for name, fn in original.items():
            setattr(StemmerEngine, name, fn)


def data(name: str, n: int, seed: int) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    if name == "mixture":
        x, y = make_dataset("mixture", n, d=10, k=8, seed=seed)
        assert y is not None
        return x, y
    return real_data(name, n, seed)


def rows(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    seeds = (REPORTING_SEEDS if args.reporting else TUNING_SEEDS)[: args.seeds]
    for seed in seeds:
        x, y = data(args.dataset, args.n, seed)
        k = int(y.max()) + 1
        reference = reference_kmeans(x, k, seed, 3).centers
        kmeans_ari = adjusted_rand_index(y, assign(x, reference)[0])
        for rounds in args.exact:
            seen: dict[str, Any] = {}
            with exact_rounds(rounds.strip("-"), x, seen):
                scores = run_kind("stemmer", x, y, k, args.epsilon, seed, {})
            round_c = adjusted_rand_index(y, assign(x, seen["centers"])[0]) if "centers" in seen else 0.0
            row = {"data": args.dataset, "n": args.n, "epsilon": args.epsilon, "seed": seed, "exact": rounds,
                   "ari": scores["ari"], "round_c_ari": round_c, "kmeans_ari": kmeans_ari}
            print(json.dumps(row), file=sys.stderr)
            yield row


def summary(all_rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| exact rounds | seeds | ARI | round C's ARI | k-means++ ARI |", "|---|---|---|---|---|"]
    for rounds in dict.fromkeys(r["exact"] for r in all_rows):
        rs = [r for r in all_rows if r["exact"] == rounds]

        def cell(score: str, rs: list[dict[str, Any]] = rs) -> str:
            values = [r[score] for r in rs]
            return f"{statistics.median(values):.3f} [{min(values):.3f}]"

        lines.append(f"| {rounds} | {len(rs)} | {cell('ari')} | {cell('round_c_ari')} | {cell('kmeans_ari')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="digits10", choices=("digits10", "cancer10", "wine5", "mixture"))
    parser.add_argument("--n", type=int, default=300_000)
    parser.add_argument("--epsilon", type=float, default=4.0)
    parser.add_argument("--seeds", type=int, default=10, help="the first N tuning (or reporting) seeds")
    parser.add_argument("--reporting", action="store_true", help="the reporting seeds 100-109 instead of 0-19")
    parser.add_argument("--exact", nargs="+", default=["-", "A", "B", "C", "D"],
                        help="sets of rounds made exact, each a string of A, B, C, D ('-': none)")
    parser.add_argument("--out", help="JSON file of every run")
    args = parser.parse_args(argv)
    if args.n < MIN_DEVICES:
        parser.error(f"--n must be at least {MIN_DEVICES} devices, got {args.n}")
    if not (math.isfinite(args.epsilon) and 0 < args.epsilon <= MAX_EPSILON_PER_CAMPAIGN):
        parser.error(f"--epsilon must be in (0, {MAX_EPSILON_PER_CAMPAIGN:g}] (every round exact is --exact ABCD), "
                     f"got {args.epsilon:g}")
    limit = len(REPORTING_SEEDS if args.reporting else TUNING_SEEDS)
    if not 1 <= args.seeds <= limit:
        parser.error(f"--seeds must be in [1, {limit}], got {args.seeds}")
    for rounds in args.exact:
        if not rounds or set(rounds.strip("-")) - set(ROUNDS) or (rounds.strip("-") and "-" in rounds):
            parser.error(f"--exact takes sets of the rounds {ROUNDS} ('-': none), got {rounds!r}")
    all_rows = list(rows(args))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(all_rows, f, indent=1)
    print(summary(all_rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
