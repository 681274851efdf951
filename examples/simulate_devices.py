"""Simulate devices with the SDK alone: no server, no network.

The story: a fleet of cars wants to know which of 64 map tiles its drivers spend the most time in,
without any car revealing its tile. Each car encodes its tile and randomizes it with optimized
unary encoding (OUE, epsilon = 1), then keeps the report in its outbox until it can be sent.

1. One device with durable state (a temporary directory, the OS CSPRNG as on a real phone):
   participate, ask again (same report, never re-sampled), the budget ledger, a campaign asking for
   more than the device's policy (refused).
2. A population of simulated devices (in-memory ledgers, one seeded generator: reproducible and
   therefore NOT privacy-preserving -- simulation only): a few packed reports and their sizes.
3. The estimate of every tile's count with its standard error: with ``ldp_collector``'s numpy
   estimator when the collector is installed, else with a few lines of pure Python.

Run::

    python examples/simulate_devices.py [--devices 20000] [--seed 7]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Sequence

from ldp_client.device import Device, DevicePolicy
from ldp_client.encoders import CategoricalEncoder
from ldp_client.errors import AlreadyReportedError, PolicyViolationError
from ldp_client.mechanisms import UnaryEncodingParams, oue
from ldp_client.payload import unpack_bits
from ldp_client.report import Report, pack_batch
from ldp_client.rng import SeededRng
from ldp_client.spec import Component, GroupTask, RoundSpec

TILES = 64
EPSILON = 1.0


def tile_spec(campaign_id: str, epsilon: float) -> RoundSpec:
    """The round a collector would publish: everyone reports its tile through OUE."""
    component = Component(encoder=CategoricalEncoder(domain_size=TILES), mechanism=oue(TILES, epsilon))
    return RoundSpec(campaign_id=campaign_id, round=1, group_weights=(1,),
                     tasks=(GroupTask(groups=(0,), components=(component,)),),
                     campaign_epsilon=epsilon, kind="histogram")


def draw_tiles(n: int, rng: SeededRng) -> list[int]:
    """Skewed tile popularity: tile t has weight 1 / (t + 1) (a Zipf law), drawn exactly."""
    weights = [math.lcm(*range(1, TILES + 1)) // (t + 1) for t in range(TILES)]
    total = sum(weights)
    tiles = []
    for _ in range(n):
        u = rng.randbelow(total)
        for tile, weight in enumerate(weights):
            if u < weight:
                tiles.append(tile)
                break
            u -= weight
    return tiles


def one_real_device() -> None:
    spec = tile_spec("tiles-2026", EPSILON)
    with tempfile.TemporaryDirectory(prefix="ldp-device-") as state_dir:
        device = Device(state_dir, DevicePolicy(max_epsilon_per_campaign=2.0, max_epsilon_total=8.0))
        report = device.participate(spec, 17)
        assert report is not None
        again = device.participate(spec, 17)
        assert again is not None
        print("1. one device (durable state, OS randomness)")
        print(f"   report {report.report_id.hex()[:12]}...: {len(report.pack())} bytes packed, "
              f"payload {report.payloads[0]!r:.40}")
        print(f"   asking again returns the stored report (never re-sampled): {again.pack() == report.pack()}")
        for entry in device.ledger.entries():
            print(f"   ledger: campaign {entry.campaign_id} round {entry.round} group {entry.group} "
                  f"epsilon {entry.epsilon:g} report {entry.report_id.hex()[:12]}...")
        print(f"   spent in campaign {device.spent('tiles-2026'):g}, in total {device.spent_total():g} "
              f"(policy caps 2 and 8); outbox holds {len(device.pending_reports())} report(s)")
        device.acknowledge([report.report_id])  # the collector stored it
        try:
            device.participate(spec, 17)
        except AlreadyReportedError as exc:
            print(f"   after the collector's acknowledgement: {type(exc).__name__}: {exc}")
        try:
            device.participate(tile_spec("greedy-campaign", 3.0), 17)
        except PolicyViolationError as exc:
            print(f"   a campaign asking for epsilon 3: {type(exc).__name__}: {exc}")
        device.close()


def simulate_population(n: int, seed: int) -> tuple[list[int], list[Report], RoundSpec]:
    spec = tile_spec("tiles-2026", EPSILON)
    # One seeded generator for the whole population: reproducible, NOT privacy-preserving.
    rng = SeededRng(seed)
    tiles = draw_tiles(n, rng)
    policy = DevicePolicy(max_epsilon_per_campaign=EPSILON)
    started = time.perf_counter()
    reports = []
    for tile in tiles:
        report = Device.in_memory(policy, rng=rng).participate(spec, tile)
        assert report is not None
        reports.append(report)
    elapsed = time.perf_counter() - started
    batch = pack_batch("batch-1", reports[:1000])
    print(f"\n2. {n:,} simulated devices (in-memory state, seeded randomness) in {elapsed:.1f} s "
          f"({elapsed / n * 1e6:.0f} us per device)")
    for report in reports[:3]:
        bits = unpack_bits(report.payloads[0], TILES)  # type: ignore[arg-type]
        print(f"   report {report.report_id.hex()[:12]}...: {len(report.pack())} bytes packed, "
              f"{sum(bits)} of {TILES} bits set")
    print(f"   a SubmitPacked batch of 1000 reports: {len(batch):,} bytes ({len(batch) / 1000:.1f} per report)")
    return tiles, reports, spec


def estimate(reports: Sequence[Report], params: UnaryEncodingParams) -> tuple[list[float], list[float], str]:
    """Unbiased count and standard error of every tile."""
    payloads = [r.payloads[0] for r in reports]
    try:
        from ldp_collector.estimation.frequency import make_aggregator
    except ImportError:
        # c_hat = (C - n q) / (p - q), C = reports with the tile's bit set; Var from the parameters.
        n = len(payloads)
        support = [0] * TILES
        for payload in payloads:
            for tile, bit in enumerate(unpack_bits(payload, TILES)):  # type: ignore[arg-type]
                support[tile] += bit
        counts = [(c - n * params.q) / (params.p - params.q) for c in support]
        errors = [math.sqrt(params.count_variance(n, min(max(c, 0.0), n))) for c in counts]
        return counts, errors, "pure Python"
    aggregator = make_aggregator(params)
    aggregator.add(payloads)
    result = aggregator.estimate(0.95)
    return result.counts.tolist(), result.std_errors.tolist(), "ldp_collector.estimation"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.devices < 1:
        parser.error("--devices must be positive")
    one_real_device()
    tiles, reports, spec = simulate_population(args.devices, args.seed)
    params = spec.tasks[0].components[0].mechanism
    assert isinstance(params, UnaryEncodingParams)
    counts, errors, how = estimate(reports, params)
    truth = [0] * TILES
    for tile in tiles:
        truth[tile] += 1
    print(f"\n3. estimated tile counts ({how}; OUE p = {params.p:.3f}, q = {params.q:.3f}, epsilon = {EPSILON:g})")
    print(f"   {'tile':>4} {'estimate':>9} {'+- SE':>7} {'truth':>7}")
    for tile in sorted(range(TILES), key=lambda t: -counts[t])[:8]:
        print(f"   {tile:>4} {counts[tile]:9.0f} {errors[tile]:7.0f} {truth[tile]:7d}")
    within = sum(abs(c - t) <= 3 * e for c, t, e in zip(counts, truth, errors))
    print(f"   {within} of {TILES} tiles within 3 standard errors of the truth")
    return 0


if __name__ == "__main__":
    sys.exit(main())
