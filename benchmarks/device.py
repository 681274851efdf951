#!/usr/bin/env python3
"""Device-side cost of ``Device.participate`` per mechanism: median microseconds and payload bytes.

Two columns of time:

* ``compute`` -- an in-memory device (``Device.in_memory``): encoding, randomization, policy and
  budget checks, report packing, with the device's memoized randomness (every coin drawn from an
  HMAC-SHA256 stream keyed by its secret). This is the SDK's own cost and what the targets bound.
  ``injected`` is the same with a seeded generator injected instead (a simulation's device): the
  difference is what memoization costs.
* ``durable`` -- a device with its ledger and outbox on disk: the same plus two fsync'ed atomic
  file replacements (ledger, then outbox). It is dominated by the storage's fsync latency, which
  differs widely between devices (flash phones, SD-card edge boxes, this machine's disk).

Payload bytes are the msgpack size of the mechanism output alone (``payload_to_wire``); report bytes
add the 16-byte report id, campaign id, round and group.

Usage: ``python benchmarks/device.py [--iterations N] [--durable-iterations N] [--json]``
(needs only ``pip install ./packages/ldp-client``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from ldp_client.device import Device, DevicePolicy
from ldp_client.encoders import (
    BitVectorEncoder,
    CategoricalEncoder,
    NumericDomain,
    SymmetricBoxEncoder,
    UnitBallEncoder,
    UnitCubeEncoder,
)
from ldp_client.mechanisms import (
    BitwiseRRParams,
    DiscreteLaplaceParams,
    GRRParams,
    LocalHashingParams,
    MechanismParams,
    VectorBoxParams,
    VectorL2BallParams,
    oue,
    sue,
)
from ldp_client.payload import payload_to_wire
from ldp_client.rng import SeededRng
from ldp_client.spec import Component, GroupTask, RoundSpec

#: (name, component factory, point factory, target in microseconds or None, payload byte cap or None)
Case = tuple[str, Callable[[], Component], Callable[[int], Any], float | None, int | None]


def _categorical(mechanism: MechanismParams, domain: int) -> Component:
    return Component(encoder=CategoricalEncoder(domain_size=domain), mechanism=mechanism)


def _cases() -> list[Case]:
    d = 10
    box = NumericDomain.unit(d)
    pivots = tuple(p / 8 for p in range(1, 8)) * 2
    bit_encoder = BitVectorEncoder(domain=NumericDomain.unit(2), pivots=pivots,
                                   pivots_per_attribute=(7, 7), half_widths=(0.1, 0.1))

    def point(i: int) -> tuple[float, ...]:
        return tuple(((i * 7919 + j * 104729) % 1000) / 1000.0 for j in range(d))

    return [
        ("GRR D=16 eps=2", lambda: _categorical(GRRParams(domain_size=16, epsilon=2.0), 16),
         lambda i: i % 16, 30.0, 8),
        ("GRR D=1024 eps=4", lambda: _categorical(GRRParams(domain_size=1024, epsilon=4.0), 1024),
         lambda i: i % 1024, 30.0, 8),
        ("OLH D=1024 eps=2", lambda: _categorical(LocalHashingParams(domain_size=1024, epsilon=2.0), 1024),
         lambda i: i % 1024, 30.0, 8),
        ("OLH D=2^20 eps=4", lambda: _categorical(LocalHashingParams(domain_size=2**20, epsilon=4.0), 2**20),
         lambda i: (i * 7919) % 2**20, 30.0, 8),
        ("OUE D=1024 eps=2", lambda: _categorical(oue(1024, 2.0), 1024), lambda i: i % 1024, 1000.0, 130),
        ("SUE D=1024 eps=2", lambda: _categorical(sue(1024, 2.0), 1024), lambda i: i % 1024, None, None),
        ("bitwise RR 14 bits eps=2",
         lambda: Component(encoder=bit_encoder, mechanism=BitwiseRRParams(
             length=14, epsilon=2.0, sensitivity=max(1, bit_encoder.max_hamming_distance))),
         lambda i: (((i * 37) % 100) / 100.0, ((i * 61) % 100) / 100.0), None, None),
        ("discrete Laplace d=10 eps=2",
         lambda: Component(encoder=UnitCubeEncoder(domain=box), mechanism=DiscreteLaplaceParams(dimension=d, epsilon=2.0)),
         point, 1000.0, None),
        ("l2-ball vector d=10 eps=2",
         lambda: Component(encoder=UnitBallEncoder(domain=box), mechanism=VectorL2BallParams(dimension=d, epsilon=2.0)),
         point, None, None),
        ("box vector d=10 eps=2",
         lambda: Component(encoder=SymmetricBoxEncoder(domain=box), mechanism=VectorBoxParams(dimension=d, epsilon=2.0)),
         point, None, None),
    ]


def _spec(component: Component) -> RoundSpec:
    return RoundSpec(campaign_id="bench", round=0, group_weights=(1,),
                     tasks=(GroupTask(groups=(0,), components=(component,)),),
                     campaign_epsilon=component.mechanism.epsilon, kind="histogram")


def _measure(spec: RoundSpec, point: Callable[[int], Any], iterations: int,
             make_device: Callable[[int], Device]) -> tuple[list[float], list[int], list[int]]:
    times, payload_sizes, report_sizes = [], [], []
    for i in range(iterations):
        device = make_device(i)
        value = point(i)
        start = time.perf_counter_ns()
        report = device.participate(spec, value)
        elapsed = time.perf_counter_ns() - start
        assert report is not None
        times.append(elapsed / 1000.0)
        payload_sizes.append(len(msgpack.packb(payload_to_wire(report.payloads[0]), use_bin_type=True)))
        report_sizes.append(len(report.pack()))
        device.close()
    return times, payload_sizes, report_sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000, help="in-memory participations per mechanism")
    parser.add_argument("--durable-iterations", type=int, default=100, help="on-disk participations per mechanism")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a Markdown table")
    ns = parser.parse_args(argv)
    policy = DevicePolicy(max_epsilon_per_campaign=8.0)
    rows = []
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, make_component, point, target_us, byte_cap in _cases():
            spec = _spec(make_component())
            compute, payload_sizes, report_sizes = _measure(
                spec, point, ns.iterations, lambda i: Device.in_memory(policy))
            injected, _, _ = _measure(spec, point, ns.iterations, lambda i: Device.in_memory(policy, rng=SeededRng(i)))
            durable, _, _ = _measure(
                spec, point, ns.durable_iterations,
                lambda i, name=name: Device(Path(tmp) / f"{name}-{i}".replace(" ", "_"), policy))
            row = {
                "mechanism": name,
                "compute_median_us": round(statistics.median(compute), 1),
                "compute_p90_us": round(statistics.quantiles(compute, n=10)[-1], 1),
                "injected_median_us": round(statistics.median(injected), 1),
                "durable_median_us": round(statistics.median(durable), 1),
                "payload_bytes_max": max(payload_sizes),
                "report_bytes_max": max(report_sizes),
                "target_us": target_us,
                "payload_cap": byte_cap,
            }
            if target_us is not None and row["compute_median_us"] > target_us:
                failures.append(f"{name}: {row['compute_median_us']} us > {target_us} us")
            if byte_cap is not None and row["payload_bytes_max"] > byte_cap:
                failures.append(f"{name}: {row['payload_bytes_max']} payload bytes > {byte_cap}")
            rows.append(row)
    if ns.json:
        print(json.dumps({"rows": rows, "failures": failures}, indent=2))
    else:
        print("| mechanism | compute median µs | compute p90 µs | injected median µs | durable median µs | payload bytes "
              "| report bytes | target |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for r in rows:
            target = []
            if r["target_us"] is not None:
                target.append(f"≤ {r['target_us']:g} µs")
            if r["payload_cap"] is not None:
                target.append(f"≤ {r['payload_cap']} B")
            print(f"| {r['mechanism']} | {r['compute_median_us']} | {r['compute_p90_us']} | {r['injected_median_us']} | "
                  f"{r['durable_median_us']} | {r['payload_bytes_max']} | {r['report_bytes_max']} | "
                  f"{', '.join(target) or '—'} |")
        if failures:
            print("\nMISSED TARGETS:\n" + "\n".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
