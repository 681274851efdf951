"""Frequency oracles side by side: our SDK + numpy estimators vs the peers pure-ldp and multi-freq-ldpy.

For GRR, OUE and OLH at each domain size and epsilon (default the matrix D in {64, 1024}, epsilon in
{0.5, 1, 2, 4}, n = 1e5), the same true population is randomized once and every implementation's
*server* is timed on the same reports (aggregation of all reports + estimation of all D counts),
then its accuracy is compared with the exact analytic variance of the unbiased estimator
(``params.count_variance`` from the SDK): ``MSE / Var = mean_v (c_hat_v - c_v)^2 / mean_v Var_v``.
With one run over D values that ratio has a sampling standard deviation of about sqrt(2 / D)
(0.044 at D = 1024, 0.18 at D = 64).

Client throughput
    Every implementation's *device* randomizer is timed on the first ``--client-reports`` values
    (one call per report, as a device makes it): ours is the SDK's ``params.randomize`` with its
    default OS CSPRNG and exact rational coins (the production path); the peers draw from numpy's
    global generator (faster, not cryptographically secure, float coins).

Identical reports
    GRR indices and OUE bit vectors are the same arrays for all three libraries (simulated once with
    numpy from the output distribution of the SDK's parameters). OLH reports are hash-specific: ours
    use the SDK's fmix64 hash, the peers share xxhash32(str(v), seed) % g, so the peers get one shared
    set of (bucket, seed) reports and we get ours, both from the same population, seeds and coins.

Peer quirks handled here (DESIGN.md section 8)
    * pure-ldp 1.2.0 imports scikit-learn and statsmodels without declaring them;
    * both peers' OLH need ``xxhash<4``;
    * pure-ldp's default index mapper is ``x - 1`` (item 0 lands in the last cell): an identity
      mapper is passed;
    * multi-freq-ldpy's ``*_Aggregator_MI`` return clipped, renormalized frequencies (biased): they
      are timed as they are and scored both as returned (x n) and as the unbiased counts its own
      count loop gives before clipping ("unclipped").

Install the peers (skipped with a message when missing)::

    pip install pure-ldp multi-freq-ldpy "xxhash<4" scikit-learn statsmodels

Usage::

    PYTHONPATH=packages/ldp-client/src:packages/ldp-proto/src:packages/ldp-collector/src \\
        python benchmarks/estimation_vs_peers.py [--domain 64 1024] [--epsilon 0.5 1 2 4] [--reports 100000]
        [--client-reports 20000] [--peer-olh-reports N] [--summary FILE.md]
    # --peer-olh-reports N: run the peers' O(n D) Python OLH servers on the first N reports only
    # --summary: also write the one-table summary (the README's side-by-side table) to FILE.md
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import math
import os
import platform
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ldp_client.mechanisms import GRRParams, LocalHashingParams, oue
from ldp_client.payload import HashedValue
from ldp_collector.estimation import GRRAggregator, LocalHashingAggregator, UnaryEncodingAggregator
from ldp_collector.estimation.frequency import FrequencyOracleParams
from ldp_collector.estimation.olh_hash import support_counts
from ldp_collector.simulation.reports import add_simulated_reports

INSTALL_HINT = 'pip install pure-ldp multi-freq-ldpy "xxhash<4" scikit-learn statsmodels'


@dataclass
class Row:
    mechanism: str
    implementation: str
    reports: int
    seconds: float
    mse_ratio: float
    note: str = ""

    @property
    def rate(self) -> float:
        return self.reports / self.seconds if self.seconds > 0 else math.inf


def population(domain: int, n: int, rng: np.random.Generator) -> NDArray[np.int64]:
    """A Zipf-like population (weights 1/(v+1)) over the domain."""
    w = 1.0 / np.arange(1, domain + 1)
    return rng.choice(domain, size=n, p=w / w.sum()).astype(np.int64)


def mse_ratio(params: FrequencyOracleParams, estimate: NDArray[np.floating[Any]], truth: NDArray[np.int64]) -> float:
    n = float(truth.sum())
    variance = np.array([params.count_variance(n, float(c)) for c in truth])
    return float(np.mean((estimate - truth) ** 2) / np.mean(variance))


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def try_import(module: str) -> Any | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(module)
    except ImportError as exc:
        print(f"[skip] {module} is not importable ({exc}); install the peers with: {INSTALL_HINT}")
        return None


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


# -- GRR ------------------------------------------------------------------------------------------


def bench_grr(domain: int, epsilon: float, values: NDArray[np.int64], rng: np.random.Generator) -> list[Row]:
    params = GRRParams(domain_size=domain, epsilon=epsilon)
    sim = GRRAggregator(params)
    add_simulated_reports(sim, values, rng)
    shown, counts = sim.counts()
    reports = rng.permutation(np.repeat(shown, counts))  # the report stream, shared by everyone
    truth = np.bincount(values, minlength=domain)
    n = reports.size
    rows = []

    def ours_arrays() -> NDArray[np.float64]:
        agg = GRRAggregator(params)
        agg.add_indices(reports)
        return agg.estimate().counts

    est, sec = timed(ours_arrays)
    rows.append(Row("GRR", "ours (int array)", n, sec, mse_ratio(params, est, truth)))
    payloads = reports.tolist()

    def ours_payloads() -> NDArray[np.float64]:
        agg = GRRAggregator(params)
        agg.add(payloads)
        return agg.estimate().counts

    est, sec = timed(ours_payloads)
    rows.append(Row("GRR", "ours (list of int payloads)", n, sec, mse_ratio(params, est, truth)))

    pure = try_import("pure_ldp.frequency_oracles.direct_encoding")
    if pure is not None:
        def pure_run() -> NDArray[np.float64]:
            server = pure.DEServer(epsilon=epsilon, d=domain, index_mapper=lambda x: x)
            server.aggregate_all(payloads)
            return np.asarray(server.estimate_all(range(domain), suppress_warnings=True), dtype=np.float64)

        est, sec = timed(pure_run)
        rows.append(Row("GRR", "pure-ldp DEServer", n, sec, mse_ratio(params, est, truth)))

    mfl = try_import("multi_freq_ldpy.pure_frequency_oracles.GRR")
    if mfl is not None:
        freq, sec = timed(lambda: mfl.GRR_Aggregator_MI(payloads, domain, epsilon))
        rows.append(Row("GRR", "multi-freq-ldpy GRR_Aggregator_MI", n, sec,
                        mse_ratio(params, np.asarray(freq) * n, truth), "clipped + renormalized (biased)"))
        p = math.exp(epsilon) / (math.exp(epsilon) + domain - 1)
        q = (1 - p) / (domain - 1)
        unclipped = (np.bincount(reports, minlength=domain) - n * q) / (p - q)
        rows.append(Row("GRR", "multi-freq-ldpy (unclipped)", n, sec, mse_ratio(params, unclipped, truth),
                        "its counts before clipping; same time"))
    return rows


# -- OUE ------------------------------------------------------------------------------------------


def bench_oue(domain: int, epsilon: float, values: NDArray[np.int64], rng: np.random.Generator) -> list[Row]:
    params = oue(domain, epsilon)
    truth = np.bincount(values, minlength=domain)
    n = values.size
    # One packed report per row, simulated from the SDK parameters' distribution.
    width = params.payload_bytes
    packed = np.empty((n, width), dtype=np.uint8)
    for r0 in range(0, n, 8192):
        chunk = values[r0:r0 + 8192]
        bits = rng.random((chunk.size, domain)) < params.q
        bits[np.arange(chunk.size), chunk] = rng.random(chunk.size) < params.p
        packed[r0:r0 + chunk.size] = np.packbits(bits, axis=1, bitorder="little")
    rows = []

    def ours_arrays() -> NDArray[np.float64]:
        agg = UnaryEncodingAggregator(params)
        agg.add_packed(packed)
        return agg.estimate().counts

    est, sec = timed(ours_arrays)
    rows.append(Row("OUE", "ours (packed uint8 array)", n, sec, mse_ratio(params, est, truth)))
    payloads = [row.tobytes() for row in packed]

    def ours_payloads() -> NDArray[np.float64]:
        agg = UnaryEncodingAggregator(params)
        agg.add(payloads)
        return agg.estimate().counts

    est, sec = timed(ours_payloads)
    rows.append(Row("OUE", "ours (list of bytes payloads)", n, sec, mse_ratio(params, est, truth)))

    bit_rows = np.unpackbits(packed, axis=1, count=domain, bitorder="little").astype(np.float64)
    vectors = list(bit_rows)  # the peers take one 0/1 vector per report
    pure = try_import("pure_ldp.frequency_oracles.unary_encoding")
    if pure is not None:
        def pure_run() -> NDArray[np.float64]:
            server = pure.UEServer(epsilon=epsilon, d=domain, use_oue=True, index_mapper=lambda x: x)
            server.aggregate_all(vectors)
            return np.asarray(server.estimate_all(range(domain), suppress_warnings=True), dtype=np.float64)

        est, sec = timed(pure_run)
        rows.append(Row("OUE", "pure-ldp UEServer(use_oue)", n, sec, mse_ratio(params, est, truth)))

    mfl = try_import("multi_freq_ldpy.pure_frequency_oracles.UE")
    if mfl is not None:
        freq, sec = timed(lambda: mfl.UE_Aggregator_MI(vectors, epsilon, optimal=True))
        rows.append(Row("OUE", "multi-freq-ldpy UE_Aggregator_MI", n, sec,
                        mse_ratio(params, np.asarray(freq) * n, truth), "clipped + renormalized (biased)"))
        q = 1 / (math.exp(epsilon) + 1)
        unclipped = (bit_rows.sum(axis=0) - n * q) / (0.5 - q)
        rows.append(Row("OUE", "multi-freq-ldpy (unclipped)", n, sec, mse_ratio(params, unclipped, truth),
                        "its counts before clipping; same time"))
    return rows


# -- OLH ------------------------------------------------------------------------------------------


def bench_olh(domain: int, epsilon: float, values: NDArray[np.int64], rng: np.random.Generator,
              peer_reports: int) -> list[Row]:
    params = LocalHashingParams(domain_size=domain, epsilon=epsilon)
    truth = np.bincount(values, minlength=domain)
    n = values.size
    rows = []
    sim = LocalHashingAggregator(params)
    add_simulated_reports(sim, values, rng)
    seeds, buckets = sim.reports()

    def ours_arrays() -> NDArray[np.float64]:
        agg = LocalHashingAggregator(params)
        agg.add_arrays(seeds, buckets)
        return agg.estimate().counts

    est, sec = timed(ours_arrays)
    rows.append(Row("OLH", f"ours (arrays, {os.cpu_count()} threads)", n, sec, mse_ratio(params, est, truth)))
    payloads = [HashedValue(int(s), int(b)) for s, b in zip(seeds, buckets)]

    def ours_payloads() -> NDArray[np.float64]:
        agg = LocalHashingAggregator(params)
        agg.add(payloads)
        return agg.estimate().counts

    est, sec = timed(ours_payloads)
    rows.append(Row("OLH", "ours (list of HashedValue payloads)", n, sec, mse_ratio(params, est, truth)))

    def ours_one_thread() -> NDArray[np.float64]:
        support = support_counts(seeds, buckets, np.arange(domain), params.g, workers=1)
        return np.asarray((support - n * params.q) / (params.p - params.q), dtype=np.float64)

    est, sec = timed(ours_one_thread)
    rows.append(Row("OLH", "ours (arrays, 1 thread)", n, sec, mse_ratio(params, est, truth)))

    xxhash = try_import("xxhash")
    if xxhash is None:
        return rows
    # The peers' report format: (bucket, seed) with bucket = GRR_g(xxh32(str(v), seed) % g).
    m = min(peer_reports, n)
    g = int(round(math.exp(epsilon))) + 1
    if g != params.g:
        print(f"[note] peers use g = {g}, the SDK g = {params.g}")
    peer_values = values[:m]
    peer_seeds = rng.integers(0, 2**32, size=m)
    hashed = np.array([xxhash.xxh32(str(int(v)), seed=int(s)).intdigest() % g
                       for v, s in zip(peer_values, peer_seeds)])
    p_peer = math.exp(epsilon) / (math.exp(epsilon) + g - 1)
    other = rng.integers(0, g - 1, size=m)
    other += other >= hashed
    reported = np.where(rng.random(m) < p_peer, hashed, other)
    peer_truth = np.bincount(peer_values, minlength=domain)
    note = "" if m == n else f"first {m} reports; time x{n / m:.0f} for n = {n}"

    pure = try_import("pure_ldp.frequency_oracles.local_hashing")
    if pure is not None:
        tuples = [(int(y), int(s)) for y, s in zip(reported, peer_seeds)]

        def pure_run() -> NDArray[np.float64]:
            server = pure.LHServer(epsilon=epsilon, d=domain, use_olh=True, index_mapper=lambda x: x)
            server.aggregate_all(tuples)
            return np.asarray(server.estimate_all(range(domain), suppress_warnings=True), dtype=np.float64)

        est, sec = timed(pure_run)
        rows.append(Row("OLH", "pure-ldp LHServer(use_olh)", m, sec, mse_ratio(params, est, peer_truth), note))

    mfl = try_import("multi_freq_ldpy.pure_frequency_oracles.LH")
    if mfl is not None:
        tuples = [(int(y), int(s)) for y, s in zip(reported, peer_seeds)]
        freq, sec = timed(lambda: mfl.LH_Aggregator_MI(tuples, domain, epsilon, optimal=True))
        rows.append(Row("OLH", "multi-freq-ldpy LH_Aggregator_MI", m, sec,
                        mse_ratio(params, np.asarray(freq) * m, peer_truth),
                        "clipped + renormalized (biased)" + (f"; {note}" if note else "")))
        # Its unbiased counts: the same support counts, without the clipping (recomputed, untimed).
        support = _peer_support(xxhash, reported, peer_seeds, domain, g)
        unclipped = (support - m / g) / (p_peer - 1 / g)
        rows.append(Row("OLH", "multi-freq-ldpy (unclipped)", m, sec, mse_ratio(params, unclipped, peer_truth),
                        "its counts before clipping; same time"))
    return rows


def _peer_support(xxhash: Any, reported: NDArray[np.int64], seeds: NDArray[np.int64], domain: int,
                  g: int) -> NDArray[np.float64]:
    """Support counts under the peers' hash, from a per-seed hash table (for scoring only, untimed)."""
    support = np.zeros(domain)
    domain_strings = [str(v) for v in range(domain)]
    for y, s in zip(reported.tolist(), seeds.tolist()):
        support += np.fromiter((xxhash.xxh32(d, seed=s).intdigest() % g for d in domain_strings),
                               dtype=np.int64, count=domain) == y
    return support


# -- clients ----------------------------------------------------------------------------------------


@dataclass
class ClientRow:
    mechanism: str
    implementation: str
    reports: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.reports / self.seconds if self.seconds > 0 else math.inf


def bench_clients(domain: int, epsilon: float, values: NDArray[np.int64]) -> list[ClientRow]:
    """Per-report device randomizers, one call per value (module docstring)."""
    items = [int(v) for v in values]
    m = len(items)
    rows: list[ClientRow] = []
    ours = {"GRR": GRRParams(domain_size=domain, epsilon=epsilon), "OUE": oue(domain, epsilon),
            "OLH": LocalHashingParams(domain_size=domain, epsilon=epsilon)}
    for name, params in ours.items():
        randomize = params.randomize
        _, sec = timed(lambda: [randomize(v) for v in items])  # noqa: B023 - called right here
        rows.append(ClientRow(name, "ours (SDK, OS CSPRNG)", m, sec))
    pure_de = try_import("pure_ldp.frequency_oracles.direct_encoding")
    pure_ue = try_import("pure_ldp.frequency_oracles.unary_encoding")
    pure_lh = try_import("pure_ldp.frequency_oracles.local_hashing")
    if pure_de is not None and pure_ue is not None and pure_lh is not None:
        clients = {"GRR": pure_de.DEClient(epsilon=epsilon, d=domain, index_mapper=lambda x: x),
                   "OUE": pure_ue.UEClient(epsilon=epsilon, d=domain, use_oue=True, index_mapper=lambda x: x),
                   "OLH": pure_lh.LHClient(epsilon=epsilon, d=domain, use_olh=True, index_mapper=lambda x: x)}
        for name, client in clients.items():
            privatise = client.privatise
            _, sec = timed(lambda: [privatise(v) for v in items])  # noqa: B023 - called right here
            rows.append(ClientRow(name, "pure-ldp", m, sec))
    mfl_grr = try_import("multi_freq_ldpy.pure_frequency_oracles.GRR")
    mfl_ue = try_import("multi_freq_ldpy.pure_frequency_oracles.UE")
    mfl_lh = try_import("multi_freq_ldpy.pure_frequency_oracles.LH")
    if mfl_grr is not None and mfl_ue is not None and mfl_lh is not None:
        fns: dict[str, Callable[[int], Any]] = {
            "GRR": lambda v: mfl_grr.GRR_Client(v, domain, epsilon),
            "OUE": lambda v: mfl_ue.UE_Client(v, domain, epsilon, optimal=True),
            "OLH": lambda v: mfl_lh.LH_Client(v, domain, epsilon, optimal=True)}
        for name, fn in fns.items():
            _, sec = timed(lambda: [fn(v) for v in items])  # noqa: B023 - called right here
            rows.append(ClientRow(name, "multi-freq-ldpy", m, sec))
    return rows


def _family(implementation: str) -> str:
    for family in ("pure-ldp", "multi-freq-ldpy"):
        if implementation.startswith(family):
            return family
    return "ours"


def summary_table(results: list[tuple[int, float, list[Row], list[ClientRow]]]) -> str:
    """One row per (D, epsilon, oracle): accuracy, server and client throughput of each implementation.

    Server rate of ours is the array path the collector uses at close; multi-freq-ldpy's accuracy is
    given for its unbiased (unclipped) counts, with its clipped+renormalized output in brackets.
    """
    lines = ["| D | ε | oracle | MSE/Var ours | MSE/Var pure-ldp | MSE/Var mfl unclipped [clipped] | "
             "server rep/s ours | server rep/s pure-ldp | server rep/s mfl | client rep/s ours | "
             "client rep/s pure-ldp | client rep/s mfl |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for domain, epsilon, rows, clients in results:
        for mech in ("GRR", "OUE", "OLH"):
            mine = [r for r in rows if r.mechanism == mech]
            if not mine:
                continue
            ours = next(r for r in mine if r.implementation.startswith(("ours (int", "ours (packed", "ours (arrays,")))
            pure = next((r for r in mine if r.implementation.startswith("pure-ldp")), None)
            mfl = next((r for r in mine if r.implementation.startswith("multi-freq-ldpy") and "unclipped" not in
                        r.implementation), None)
            mfl_u = next((r for r in mine if r.implementation == "multi-freq-ldpy (unclipped)"), None)
            crates = {_family(c.implementation): c.rate for c in clients if c.mechanism == mech}

            def num(r: Row | None, attr: str) -> str:
                if r is None:
                    return "-"
                return f"{r.mse_ratio:.3f}" if attr == "mse" else f"{r.rate:,.0f}"

            mfl_acc = "-" if mfl is None else f"{num(mfl_u, 'mse')} [{num(mfl, 'mse')}]"
            lines.append(f"| {domain} | {epsilon:g} | {mech} | {num(ours, 'mse')} | {num(pure, 'mse')} | {mfl_acc} | "
                         f"{num(ours, 'rate')} | {num(pure, 'rate')} | {num(mfl, 'rate')} | "
                         + " | ".join(f"{crates[f]:,.0f}" if f in crates else "-"
                                      for f in ("ours", "pure-ldp", "multi-freq-ldpy")) + " |")
    return "\n".join(lines)


def markdown(rows: list[Row]) -> str:
    ours = {r.mechanism: r.rate for r in rows if r.implementation.startswith("ours (arr")
            or r.implementation.startswith("ours (int") or r.implementation.startswith("ours (packed")}
    lines = ["| oracle | implementation | reports | server time (s) | reports/s | ours is x faster | "
             "MSE / analytic Var | note |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        speedup = ours.get(r.mechanism, math.nan) / r.rate if not r.implementation.startswith("ours") else math.nan
        lines.append(f"| {r.mechanism} | {r.implementation} | {r.reports:,} | {r.seconds:.3f} | {r.rate:,.0f} | "
                     f"{'' if math.isnan(speedup) else f'{speedup:,.0f}'} | {r.mse_ratio:.3f} | {r.note} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--domain", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--reports", type=int, default=100_000)
    parser.add_argument("--epsilon", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--seed", type=int, default=20240611)
    parser.add_argument("--client-reports", type=int, default=20_000,
                        help="reports per client throughput measurement (0: skip the clients)")
    parser.add_argument("--peer-olh-reports", type=int, default=None,
                        help="run the peers' OLH servers on the first N reports only (default: all)")
    parser.add_argument("--only", choices=("grr", "oue", "olh"), action="append")
    parser.add_argument("--summary", default=None, help="also write the summary table to this Markdown file")
    args = parser.parse_args()
    print(f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}; pure-ldp {version('pure-ldp')}, "
          f"multi-freq-ldpy {version('multi-freq-ldpy')}, xxhash {version('xxhash')}\n")
    chosen = args.only or ["grr", "oue", "olh"]
    results: list[tuple[int, float, list[Row], list[ClientRow]]] = []
    started = time.perf_counter()
    for domain in args.domain:
        for epsilon in args.epsilon:
            rng = np.random.default_rng(args.seed)
            values = population(domain, args.reports, rng)
            print(f"# Estimation vs peers: D = {domain}, n = {args.reports:,}, epsilon = {epsilon}", flush=True)
            rows: list[Row] = []
            if "grr" in chosen:
                rows += bench_grr(domain, epsilon, values, rng)
            if "oue" in chosen:
                rows += bench_oue(domain, epsilon, values, rng)
            if "olh" in chosen:
                rows += bench_olh(domain, epsilon, values, rng, args.peer_olh_reports or args.reports)
            clients = bench_clients(domain, epsilon, values[:args.client_reports]) if args.client_reports else []
            print(markdown(rows))
            if clients:
                print("\n| oracle | client | reports | seconds | reports/s |\n|---|---|---:|---:|---:|")
                for c in clients:
                    print(f"| {c.mechanism} | {c.implementation} | {c.reports:,} | {c.seconds:.3f} | {c.rate:,.0f} |")
            print(f"\nServer time = aggregate every report + estimate all {domain} counts. MSE / Var over "
                  f"the {domain} values of one run (sampling SD ~ {math.sqrt(2 / domain):.3f}); "
                  "the analytic variance is the SDK's count_variance at the true counts.\n", flush=True)
            results.append((domain, epsilon, rows, clients))
    table = summary_table(results)
    print(f"# Summary ({time.perf_counter() - started:.0f} s)\n\n{table}")
    if args.summary:
        with open(args.summary, "w", encoding="utf-8") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
