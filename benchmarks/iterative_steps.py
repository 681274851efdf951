"""The iterative server steps measured: Laplace (k-means, FCM, mnFCM) and ``ldp_kmeans``, quality and CPU.

Each seed draws the public ``mixture`` data set (a Gaussian mixture with unequal weights and
spreads), plays a whole campaign on an in-process collector (SQLite store, ``run_campaign``'s
direct mode: the SDK's randomizers, one report per device), and then closes every round of it
again, on the stored reports, timing only the engine's step (``close_round``: reading the round
from the store, decoding, clustering) in CPU seconds of this process (``time.process_time``; the
machine is shared, so wall time would mostly measure the other jobs). A laplace campaign has one
round whose reports do not depend on the algorithm: it is played once and its step re-run with
each algorithm's engine on the same reports. The scores are those of ``ldp-collector simulate``
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
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ldp_client.spec import RoundSpec
from ldp_collector.campaigns import make_engine
from ldp_collector.cli_args import build_campaign_config
from ldp_collector.core import Collector
from ldp_collector.kinds import RoundReports
from ldp_collector.model import CampaignConfig, Result
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.evaluation import evaluate_clustering
from ldp_collector.simulation.population import numeric_bounds
from ldp_collector.simulation.runner import run_campaign
from ldp_collector.storage import ReportStore, open_store
from ldp_collector.storage.base import StoredReport

#: The laplace algorithms by their wire numbers (``ldp.v1.LaplaceParameters.Algorithm``).
LAPLACE_ALGORITHMS = {"kmeans": 1, "fcm": 2, "mnfcm": 3}


class StoreRound(RoundReports):
    """A closed round of the store, as the collector's step reads it."""

    def __init__(self, store: ReportStore, campaign_id: str, round: int) -> None:
        self.store, self.campaign_id, self.round = store, campaign_id, round

    @property
    def count(self) -> int:
        return self.store.count_reports(self.campaign_id, self.round)

    def batches(self, batch_size: int = 65536) -> Iterator[list[StoredReport]]:
        return iter(self.store.iter_reports(self.campaign_id, self.round, batch_size))

    def accumulators(self) -> dict[str, bytes]:
        return self.store.load_accumulators(self.campaign_id, self.round)


def replay_steps(store: ReportStore, campaign_id: str, config: CampaignConfig) -> tuple[Result, float]:
    """Close every round of a played campaign again with ``config``'s engine: its result and the steps' CPU seconds."""
    engine = make_engine(config)
    state = engine.first_round().engine_state
    rounds = [r.round for r in store.list_rounds(campaign_id) if not r.open]
    cpu = 0.0
    for r in rounds:
        spec = RoundSpec.unpack(store.get_round(campaign_id, r).spec)
        start = time.process_time()
        outcome = engine.close_round(spec, StoreRound(store, campaign_id, r), state)
        cpu += time.process_time() - start
        if outcome.next_round is not None:
            state = outcome.next_round.engine_state
        else:
            assert outcome.result is not None and r == rounds[-1]
            return outcome.result, cpu
    raise AssertionError(f"{campaign_id}: no round finished the campaign")


def _config(kind: str, x: np.ndarray, k: int, epsilon: float, seed: int, algorithm: int | None) -> CampaignConfig:
    proto = build_campaign_config(kind, epsilon=epsilon, bounds=numeric_bounds(x), seed=seed, k=k,
                                  campaign_id=f"{kind}-{seed}")
    if algorithm is not None:
        proto.laplace.algorithm = algorithm  # type: ignore[assignment]
    return config_from_proto(proto)


def run_seed(kind: str, n: int, d: int, epsilon: float, seed: int) -> list[dict[str, Any]]:
    """One seed: the campaign played once, each configuration's step replayed, timed and scored."""
    x, labels = make_dataset("mixture", n, d=d, seed=seed)
    k = int(np.max(labels)) + 1
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "ldp-data")
        configs = ({name: _config(kind, x, k, epsilon, seed, number) for name, number in LAPLACE_ALGORITHMS.items()}
                   if kind == "laplace" else {"ldp_kmeans": _config(kind, x, k, epsilon, seed, None)})
        played = run_campaign(Collector(store), next(iter(configs.values())), x, seed=seed, mode="direct", quiet=True)
        for name, config in configs.items():
            result, cpu = replay_steps(store, played.campaign_id, config)
            scores = evaluate_clustering(result, x, labels, k=k, seed=seed)
            rows.append({"config": name, "seed": seed, "n": n, "d": d, "epsilon": epsilon, "k": k,
                         "ari": scores["ari"], "cost_per_point": scores["cost_per_point"], "step_cpu_s": cpu})
        store.close()
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
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    load = tuple(max(a, b) for a, b in zip(load, os.getloadavg()))
    print("\n".join(summary(rows)))
    print(f"load average (1, 5, 15 min), the larger of start and end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "load": load}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
