"""The iterative server steps measured: Laplace (k-means, FCM, mnFCM) and ``ldp_kmeans``, quality and CPU.

Each seed draws the public ``mixture`` data set (a Gaussian mixture with unequal weights and
spreads) and plays a whole campaign round by round: the devices answer each round's spec with the
SDK's randomizers (``Population`` in direct mode, as ``ldp-collector simulate`` does), their
reports are validated as ingestion validates them and held in memory (no store: the figures are
the step's own), and the engine's step closes the round (``close_round``: decoding, clustering),
timed in CPU seconds of this process (``time.process_time``; the machine is shared, so wall time
would mostly measure the other jobs). A laplace campaign has one round whose reports do not depend
on the algorithm: it is played once and its step run with each algorithm's engine on the same
reports. The scores are those of ``ldp-collector simulate``
(:func:`ldp_collector.simulation.evaluation.evaluate_clustering`: every true point labelled by its
nearest published center): the adjusted Rand index against the true components and the cost per
point of the published centers on the true points.

Reported (``benchmarks/README.md``'s discipline): median and worst seed over the seeds given (the
reporting seeds are 100-109).

Usage (from the repository root, with the collector installed)::

    python benchmarks/iterative_steps.py [--n 100000] [--d 2] [--epsilon 2] [--seeds 100-109]
        [--kinds laplace ldp_kmeans] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ldp_client.spec import RoundSpec
from ldp_collector.campaigns import make_engine
from ldp_collector.cli_args import build_campaign_config
from ldp_collector.ingest import RoundContext, validate_report
from ldp_collector.kinds import RoundReports
from ldp_collector.model import CampaignConfig, Result
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.evaluation import evaluate_clustering
from ldp_collector.simulation.population import Population, numeric_bounds
from ldp_collector.storage.base import StoredReport

#: The laplace algorithms by their wire numbers (``ldp.v1.LaplaceParameters.Algorithm``).
LAPLACE_ALGORITHMS = {"kmeans": 1, "fcm": 2, "mnfcm": 3}


class HeldRound(RoundReports):
    """A closed round's validated reports, read in the store's batches of 65 536."""

    def __init__(self, rows: list[StoredReport]) -> None:
        self.rows = rows

    @property
    def count(self) -> int:
        return len(self.rows)

    def batches(self, batch_size: int = 65536) -> Iterator[list[StoredReport]]:
        for start in range(0, len(self.rows), batch_size):
            yield self.rows[start:start + batch_size]

    def accumulators(self) -> dict[str, bytes]:
        return {}


def held(spec: RoundSpec, population: Population) -> HeldRound:
    """The population's reports for ``spec``, validated as ingestion validates them."""
    context = RoundContext(campaign_id=spec.campaign_id, round=spec.round, spec=spec)
    return HeldRound([validate_report(r, context) for r in population.participate(spec)])


def play(config: CampaignConfig, population: Population,
         rounds: dict[int, HeldRound] | None = None) -> tuple[Result, float, dict[int, HeldRound]]:
    """A whole campaign: its result, its steps' CPU seconds, and every round's reports (given ones are reused)."""
    engine = make_engine(config)
    plan = engine.first_round()
    spec, state = plan.spec, plan.engine_state
    played: dict[int, HeldRound] = {}
    cpu = 0.0
    while True:
        # A fresh reader for every step (a reader keeps the decoded batches of its round's passes).
        reports = HeldRound(rounds[spec.round].rows) if rounds is not None else held(spec, population)
        played[spec.round] = reports
        start = time.process_time()
        outcome = engine.close_round(spec, reports, state)
        cpu += time.process_time() - start
        if outcome.next_round is None:
            assert outcome.result is not None
            return outcome.result, cpu, played
        spec, state = outcome.next_round.spec, outcome.next_round.engine_state


def _config(kind: str, x: np.ndarray, k: int, epsilon: float, seed: int, algorithm: int | None) -> CampaignConfig:
    proto = build_campaign_config(kind, epsilon=epsilon, bounds=numeric_bounds(x), seed=seed, k=k,
                                  campaign_id=f"{kind}-{seed}")
    if algorithm is not None:
        proto.laplace.algorithm = algorithm  # type: ignore[assignment]
    return config_from_proto(proto)


def run_seed(kind: str, n: int, d: int, epsilon: float, seed: int) -> list[dict[str, Any]]:
    """One seed: the campaign played (once for every laplace algorithm), each step timed, the result scored."""
    x, labels = make_dataset("mixture", n, d=d, seed=seed)
    k = int(np.max(labels)) + 1
    configs = ({name: _config(kind, x, k, epsilon, seed, number) for name, number in LAPLACE_ALGORITHMS.items()}
               if kind == "laplace" else {"ldp_kmeans": _config(kind, x, k, epsilon, seed, None)})
    population = Population(x, seed=seed, mode="direct")
    rows: list[dict[str, Any]] = []
    rounds: dict[int, HeldRound] | None = None
    for name, config in configs.items():
        result, cpu, played = play(config, population, rounds)
        rounds = played if kind == "laplace" else None  # one round, the same reports for every algorithm
        scores = evaluate_clustering(result, x, labels, k=k, seed=seed)
        rows.append({"config": name, "seed": seed, "n": n, "d": d, "epsilon": epsilon, "k": k,
                     "ari": scores["ari"], "cost_per_point": scores["cost_per_point"], "step_cpu_s": cpu})
    return rows


def _seeds(text: str) -> list[int]:
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """Per configuration: ARI and cost per point, median [worst seed]; step CPU seconds, median [max]."""
    lines = ["| configuration | ARI median [worst] | cost per point median [worst] | step CPU s median [max] |",
             "|---|---:|---:|---:|"]
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = [r for r in rows if r["config"] == config]
        ari = [r["ari"] for r in mine]
        cost = [r["cost_per_point"] for r in mine]
        cpu = [r["step_cpu_s"] for r in mine]
        lines.append(f"| {config} | {statistics.median(ari):.3f} [{min(ari):.3f}] | "
                     f"{statistics.median(cost):.4g} [{max(cost):.4g}] | "
                     f"{statistics.median(cpu):.2f} [{max(cpu):.2f}] |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--d", type=int, default=2)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--seeds", default="100-109")
    parser.add_argument("--kinds", nargs="+", choices=("laplace", "ldp_kmeans"), default=["laplace", "ldp_kmeans"])
    parser.add_argument("--json", help="write every row here")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    load = os.getloadavg()
    for kind in args.kinds:
        for seed in _seeds(args.seeds):
            rows.extend(run_seed(kind, args.n, args.d, args.epsilon, seed))
            load = tuple(max(a, b) for a, b in zip(load, os.getloadavg()))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            if args.json:  # after every seed: an interrupted run keeps what it measured
                Path(args.json).write_text(json.dumps({"rows": rows, "load": load}, indent=1) + "\n")
    print("\n".join(summary(rows)))
    print(f"load average (1, 5, 15 min), the largest seen after a seed: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
