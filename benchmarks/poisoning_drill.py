"""Poisoning drill: the maximal-gain attack (MGA) against histogram campaigns, with and without defences.

Genuine devices hold Zipf-distributed values over a categorical domain; fake devices, a share
beta = m / (n + m) of all reports, run the maximal-gain attack of Cao, Jia and Gong ("Data
poisoning attacks to local differential privacy protocols", USENIX Security 2021) to promote
r random target values:

* GRR: a fake reports a uniformly chosen target.
* OUE: a fake sets the bits of all r targets; *padded*, it also sets random other bits up to the
  expected Hamming weight of an honest report, so its weight looks typical.
* OLH with device-chosen seeds: a fake picks a hash seed under which all r targets share one
  bucket (found by search) and reports that bucket, supporting every target at once.
* OLH with collector-assigned seeds (enrolled devices, :mod:`ldp_collector.defences`): the seed is
  not the fake's choice; the adaptive fake reports the bucket shared by the most targets under its
  assigned seed. A non-adaptive fake that keeps its searched seed is rejected at ingestion.

Each campaign has two windows (``HistogramParameters.windows = 2``): window 1 is clean (genuine
devices only), window 2 holds fresh genuine devices plus the fakes, so the window-over-window
anomaly flags (alpha = 0.01, Bonferroni over the domain) compare a clean window with an attacked
one. A ``no attack`` row per oracle measures the flags and errors without fakes.

Every report goes through :class:`~ldp_collector.core.Collector` (validation, plausibility checks,
storage in SQLite, the histogram engine, estimates); genuine reports are randomized by the SDK's
mechanisms. Enrolled devices' reports are checked against their own assignment with
:func:`~ldp_collector.defences.check_assignment` -- the check the service applies to each enrolled
device's call (tested end to end over gRPC in ``tests/collector/test_defences.py``) -- and the
reports that pass are submitted in batches, since per-device calls would cost a durable commit each.

Columns: share of fake reports rejected at ingestion, share of genuine reports rejected,
frequency gain (sum over targets of estimated minus true genuine frequency, window 2), L1 error of
the frequency vector against the genuine distribution (window 1 and window 2), targets among the
anomaly-flagged values and other (non-target) flagged values, and the Hamming weights the round's
weight check flagged in the attacked window (unary encoding only; window 1 in brackets).

    python benchmarks/poisoning_drill.py [--n 50000] [--domain 128] [--epsilon 1] [--targets 5]
        [--shares 0.01 0.05 0.1] [--seed 1] [--out benchmarks/results/poisoning_drill]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ldp.v1 import campaigns_pb2
from ldp_client.device import RoundAssignment, run_component
from ldp_client.errors import ProtocolError
from ldp_client.mechanisms import LocalHashingParams, UnaryEncodingParams
from ldp_client.mechanisms.local_hashing import hash_value
from ldp_client.payload import HashedValue, Payload
from ldp_client.report import Report
from ldp_client.rng import SeededRng
from ldp_client.spec import RoundSpec
from ldp_collector.core import Collector
from ldp_collector.defences import EnrolmentAuthority, check_assignment
from ldp_collector.model import Estimates
from ldp_collector.serde import config_from_proto
from ldp_collector.storage import open_store
from ldp_collector.storage.base import Outcome

_ORACLES = {"grr": campaigns_pb2.GRR, "oue": campaigns_pb2.OUE, "olh": campaigns_pb2.OLH}
_ANOMALY = re.compile(r"^anomaly: value (\d+):")
_IMPLAUSIBLE = re.compile(r"^implausible: \d+ reports have (\d+) bits set")
_BATCH = 5000


@dataclass(frozen=True)
class Scenario:
    oracle: str
    defence: str
    attack: str
    #: Devices are enrolled: report ids and hash seeds are assigned.
    enrolled: bool = False


SCENARIOS = (
    Scenario("grr", "none", "no attack"),
    Scenario("grr", "none", "MGA"),
    Scenario("oue", "plausibility", "no attack"),
    Scenario("oue", "plausibility", "MGA, no padding"),
    Scenario("oue", "plausibility", "MGA, padded"),
    Scenario("olh", "none (device seeds)", "no attack"),
    Scenario("olh", "none (device seeds)", "MGA, chosen seeds"),
    Scenario("olh", "assigned seeds", "MGA, best bucket of assigned seed", enrolled=True),
    Scenario("olh", "assigned seeds", "MGA, chosen seeds (non-adaptive)", enrolled=True),
)


def zipf_probabilities(domain: int, exponent: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, domain + 1) ** exponent
    return weights / weights.sum()


class Attacker:
    """Crafts the fake payloads of one scenario (the attacker knows the public spec and targets)."""

    def __init__(self, scenario: Scenario, spec: RoundSpec, targets: Sequence[int], rng: np.random.Generator) -> None:
        self.scenario = scenario
        self.mechanism = spec.tasks[0].components[0].mechanism
        self.targets = list(targets)
        self.rng = rng
        self._seeds: list[tuple[int, int]] = []
        if isinstance(self.mechanism, LocalHashingParams) and "chosen seeds" in scenario.attack:
            self._seeds = self._colliding_seeds(200)

    def _colliding_seeds(self, count: int) -> list[tuple[int, int]]:
        """Seeds under which every target hashes to one bucket, and that bucket (MGA's seed search)."""
        assert isinstance(self.mechanism, LocalHashingParams)
        g = self.mechanism.g
        found: list[tuple[int, int]] = []
        while len(found) < count:
            seed = int(self.rng.integers(0, 2**32))
            buckets = {hash_value(seed, t, g) for t in self.targets}
            if len(buckets) == 1:
                found.append((seed, buckets.pop()))
        return found

    def payload(self, assignment: RoundAssignment | None) -> Payload:
        m = self.mechanism
        if isinstance(m, UnaryEncodingParams):
            ones = set(self.targets)
            if "padded" in self.scenario.attack:
                expected = round(m.p + (m.domain_size - 1) * m.q)
                others = [v for v in range(m.domain_size) if v not in ones]
                extra = max(0, expected - len(ones))
                ones.update(int(v) for v in self.rng.choice(others, size=extra, replace=False))
            return sum(1 << v for v in ones).to_bytes(m.payload_bytes, "little")
        if isinstance(m, LocalHashingParams):
            if "chosen seeds" in self.scenario.attack:
                seed, bucket = self._seeds[int(self.rng.integers(0, len(self._seeds)))]
                return HashedValue(seed, bucket)
            assert assignment is not None
            seed = assignment.hash_seeds[0]
            counts = np.bincount([hash_value(seed, t, m.g) for t in self.targets], minlength=m.g)
            best = np.flatnonzero(counts == counts.max())
            return HashedValue(seed, int(best[int(self.rng.integers(0, len(best)))]))
        return int(self.targets[int(self.rng.integers(0, len(self.targets)))])  # GRR


@dataclass
class WindowTally:
    genuine: int = 0
    genuine_rejected: int = 0
    fake: int = 0
    fake_rejected: int = 0
    #: Hamming weights of the accepted unary-encoding reports, genuine and fake.
    genuine_weights: Counter[int] = field(default_factory=Counter)
    fake_weights: Counter[int] = field(default_factory=Counter)


def run_window(collector: Collector, spec: RoundSpec, values: Sequence[int], fakes: int, attacker: Attacker | None,
               authority: EnrolmentAuthority | None, rng: SeededRng, tag: str) -> WindowTally:
    """Genuine devices report ``values``, then ``fakes`` fake devices attack; all through the collector."""
    component = spec.tasks[0].components[0]
    tally = WindowTally(genuine=len(values), fake=fakes)
    pending: list[tuple[Report, bool]] = []
    batches = 0

    def flush() -> None:
        nonlocal batches, pending
        if not pending:
            return
        outcomes = collector.submit(f"{tag}-{batches}", [r for r, _ in pending])
        batches += 1
        for (report, fake), (outcome, _reason) in zip(pending, outcomes):
            if outcome == Outcome.REJECTED:
                if fake:
                    tally.fake_rejected += 1
                else:
                    tally.genuine_rejected += 1
            elif outcome != Outcome.ACCEPTED:
                raise RuntimeError(f"unexpected outcome {outcome!r} for a fresh report")
            elif isinstance(report.payloads[0], bytes):
                weights = tally.fake_weights if fake else tally.genuine_weights
                weights[int.from_bytes(report.payloads[0], "little").bit_count()] += 1
        pending = []

    def send(payload_of: Callable[[RoundAssignment | None], Payload], fake: bool) -> None:
        assignment = None
        if authority is not None:
            assignment = authority.assignment(rng.token_bytes(16), spec.campaign_id, spec.round)
        report_id = assignment.report_id if assignment is not None else rng.token_bytes(16)
        report = Report(report_id=report_id, campaign_id=spec.campaign_id, round=spec.round, group=0,
                        payloads=(payload_of(assignment),))
        if assignment is not None:
            try:
                check_assignment(report, spec, assignment)
            except ProtocolError:
                if fake:
                    tally.fake_rejected += 1
                else:
                    tally.genuine_rejected += 1
                return
        pending.append((report, fake))
        if len(pending) >= _BATCH:
            flush()

    for value in values:
        send(lambda a, v=value: run_component(component, v, rng=rng, seed=a.seed_for(0, component) if a else None),
             False)
    if attacker is not None:
        for _ in range(fakes):
            send(attacker.payload, True)
    flush()
    return tally


def frequencies(estimates: Estimates, domain: int) -> np.ndarray:
    out = np.zeros(domain)
    for e in estimates.estimates:
        out[e.value] = e.count
    return out / max(estimates.reports, 1)


def flagged_values(estimates: Estimates) -> set[int]:
    return {int(m.group(1)) for w in estimates.warnings if (m := _ANOMALY.match(w))}


def flagged_weights(estimates: Estimates) -> list[int]:
    return sorted(int(m.group(1)) for w in estimates.warnings if (m := _IMPLAUSIBLE.match(w)))


def run_scenario(collector: Collector, scenario: Scenario, share: float, args: argparse.Namespace,
                 index: int) -> dict[str, Any]:
    seed = args.seed * 1000 + index
    np_rng = np.random.default_rng(seed)
    rng = SeededRng(seed)
    domain = args.domain
    targets = sorted(int(t) for t in np_rng.choice(domain, size=args.targets, replace=False))
    probabilities = zipf_probabilities(domain, args.zipf)
    campaign_id = f"drill-{index}"
    config = campaigns_pb2.CampaignConfig(
        campaign_id=campaign_id, kind=campaigns_pb2.HISTOGRAM, epsilon=args.epsilon,
        domain=campaigns_pb2.Domain(categorical_size=domain),
        histogram=campaigns_pb2.HistogramParameters(oracle=_ORACLES[scenario.oracle], windows=2))
    collector.create_campaign(config_from_proto(config))
    authority = EnrolmentAuthority(f"drill-secret-{args.seed:08d}-0123456789") if scenario.enrolled else None
    attacked = scenario.attack != "no attack"
    fakes = round(share * args.n / (1.0 - share)) if attacked else 0
    truths, tallies, estimates = [], [], []
    for window in (1, 2):
        spec, _ = collector.get_round_spec(campaign_id)
        assert spec is not None and spec.round == window
        values = np_rng.choice(domain, size=args.n, p=probabilities).tolist()
        truths.append(np.bincount(values, minlength=domain) / args.n)
        attacker = Attacker(scenario, spec, targets, np_rng) if attacked and window == 2 else None
        tallies.append(run_window(collector, spec, values, fakes if window == 2 else 0, attacker, authority, rng,
                                  tag=f"{campaign_id}-{window}"))
        collector.close_round(campaign_id, window)
        estimates.append(collector.get_estimates(campaign_id, window))
    f1, f2 = frequencies(estimates[0], domain), frequencies(estimates[1], domain)
    flagged = flagged_values(estimates[1])
    second = tallies[1]
    weights = flagged_weights(estimates[1])
    fakes_in_flagged = sum(second.fake_weights[w] for w in weights)
    genuine_in_flagged = (sum(second.genuine_weights[w] for w in weights)
                          + sum(tallies[0].genuine_weights[w] for w in flagged_weights(estimates[0])))
    genuine_total = tallies[0].genuine + second.genuine
    return {
        "oracle": scenario.oracle, "defence": scenario.defence, "attack": scenario.attack,
        "fake_share": share if attacked else 0.0, "genuine": args.n, "fakes": fakes, "targets": targets,
        "fake_rejected_pct": 100.0 * second.fake_rejected / fakes if fakes else None,
        "fake_in_flagged_weights_pct": 100.0 * fakes_in_flagged / fakes if fakes else None,
        "genuine_in_flagged_weights_pct": 100.0 * genuine_in_flagged / (tallies[0].genuine + second.genuine),
        "genuine_rejected_pct": 100.0 * (tallies[0].genuine_rejected + second.genuine_rejected) / genuine_total,
        "target_gain": float(sum(f2[t] - truths[1][t] for t in targets)),
        "target_gain_clean": float(sum(f1[t] - truths[0][t] for t in targets)),
        "l1_clean": float(np.abs(f1 - truths[0]).sum()),
        "l1_attacked": float(np.abs(f2 - truths[1]).sum()),
        "max_abs_attacked": float(np.abs(f2 - truths[1]).max()),
        "targets_flagged": len(flagged.intersection(targets)),
        "other_values_flagged": len(flagged.difference(targets)),
        "weights_flagged": flagged_weights(estimates[1]) if scenario.oracle == "oue" else None,
        "weights_flagged_clean": flagged_weights(estimates[0]) if scenario.oracle == "oue" else None,
        "reports_window2": int(estimates[1].reports),
    }


def markdown(rows: Sequence[dict[str, Any]], args: argparse.Namespace, seconds: float) -> str:
    lines = [
        "# Poisoning drill: maximal-gain attack on histogram campaigns",
        "",
        f"n = {args.n} genuine devices per window, Zipf({args.zipf:g}) over {args.domain} values, "
        f"epsilon = {args.epsilon:g}, r = {args.targets} random targets, seed {args.seed}; window 1 clean, "
        f"window 2 attacked; anomaly flags at alpha = 0.01 (Bonferroni over {args.domain} values). "
        f"Run time {seconds:.0f} s.",
        "",
        "Gain = sum over targets of (estimated - true genuine frequency) in window 2 (clean-window value in "
        "brackets); L1 = sum over values of |estimated - true frequency|.",
        "",
        "Fakes / genuine flagged: share of reports rejected at ingestion, plus (unary encoding) the share whose "
        "Hamming weight the round's weight check flagged; the flagged weights follow (clean window in brackets).",
        "",
        "| oracle | defence | attack | fake share | fakes rejected | fakes flagged | genuine rejected or flagged "
        "| target gain | L1 clean | L1 attacked | targets flagged | other values flagged | weights flagged |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        rejected = "-" if r["fake_rejected_pct"] is None else f"{r['fake_rejected_pct']:.1f}%"
        weights = "-"
        if r["weights_flagged"] is not None:
            weights = (f"{','.join(map(str, r['weights_flagged'])) or 'none'} "
                       f"({','.join(map(str, r['weights_flagged_clean'])) or 'none'})")
        flagged = "-" if r["fake_in_flagged_weights_pct"] is None or r["weights_flagged"] is None \
            else f"{r['fake_in_flagged_weights_pct']:.1f}%"
        genuine = r["genuine_rejected_pct"] + r["genuine_in_flagged_weights_pct"]
        lines.append(
            f"| {r['oracle']} | {r['defence']} | {r['attack']} | {100 * r['fake_share']:.0f}% | {rejected} "
            f"| {flagged} | {genuine:.2f}% | {r['target_gain']:+.3f} ({r['target_gain_clean']:+.3f}) "
            f"| {r['l1_clean']:.3f} | {r['l1_attacked']:.3f} | {r['targets_flagged']}/{len(r['targets'])} "
            f"| {r['other_values_flagged']} | {weights} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=50_000, help="genuine devices per window")
    parser.add_argument("--domain", type=int, default=128)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--targets", type=int, default=5)
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the genuine values")
    parser.add_argument("--shares", type=float, nargs="+", default=[0.01, 0.05, 0.10])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "poisoning_drill"),
                        help="write <out>.md and <out>.json ('' to skip)")
    args = parser.parse_args(argv)
    if args.n < 100 or not 2 <= args.targets < args.domain or not all(0 < s < 0.5 for s in args.shares):
        parser.error("need --n >= 100, 2 <= --targets < --domain and every share in (0, 0.5)")
    logging.basicConfig(level=logging.ERROR)  # the flags are in the table, not in the log
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ldp-drill-") as tmp:
        store = open_store(Path(tmp) / "data")
        try:
            collector = Collector(store)
            index = 0
            for scenario in SCENARIOS:
                for share in ([0.0] if scenario.attack == "no attack" else args.shares):
                    index += 1
                    row = run_scenario(collector, scenario, share, args, index)
                    rows.append(row)
                    print(f"[{time.perf_counter() - start:6.1f} s] {row['oracle']} / {row['defence']} / "
                          f"{row['attack']} / {100 * share:.0f}%: gain {row['target_gain']:+.3f}, "
                          f"fakes rejected {row['fake_rejected_pct']}, flagged {row['targets_flagged']}",
                          file=sys.stderr, flush=True)
        finally:
            store.close()
    seconds = time.perf_counter() - start
    table = markdown(rows, args, seconds)
    print(table)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text(table)
        settings = {k: v for k, v in vars(args).items() if k != "out"}
        out.with_suffix(".json").write_text(json.dumps({"settings": settings, "seconds": round(seconds, 1),
                                                        "rows": rows}, indent=2) + "\n")
    return 0 if all(math.isfinite(r["target_gain"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
