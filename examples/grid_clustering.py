"""Grid clustering with feedback: a whole ``grid`` campaign (AGCluster) through a real collector.

The story: a delivery company wants to know where its riders wait between orders -- two
corridors and a curved street, shapes k-means cannot describe -- without any rider revealing
where it is. The collector clusters a grid it refines between rounds from the riders' own
randomized reports, then publishes a cell -> cluster map; every rider labels itself from it,
locally, at no privacy cost.

1. A collector runs (in-process on a free loopback port with a temporary data directory and an
   operator token, or ``--collector HOST:PORT`` with the token in ``$LDP_OPERATOR_TOKEN``).
2. The operator creates the campaign over the public map [0, 10] x [0, 10] km: kind ``GRID``,
   budget policy ``SPLIT`` (every rider reports in every round with epsilon / rounds, so every
   round expects the whole fleet) and ``close_after_reports`` = the fleet size, so each round
   closes by itself -- and the server step runs -- the moment the last rider's report is in.
3. Every round, the riders fetch the round's ``RoundSpec`` over gRPC (the collector computed it
   from the previous round's reports: the calibration picks the grid's granularity, the
   refinement merges and splits cells; while it computes, it answers "not yet, ask again after
   ...", and the riders wait as told), participate (real SDK devices: ``Device.in_memory`` with
   a budget ledger and an outbox each) and send: the first rider drains its own outbox with
   ``Sender``, the rest of the fleet's reports travel in batches of 1000, as an app backend
   relaying many riders would send them.
4. The campaign finishes; a rider downloads the published clustering and labels itself with
   ``CollectorClient.cluster_label`` (public data only: nothing is sent, nothing is spent).
5. The operator's check (simulation only: the true zones are known here): the labels against
   the truth, and every rider's ledger.

Randomness is seeded (``SeededRng``): reproducible and therefore NOT privacy-preserving -- a
simulation. Real devices use the SDK's default, the OS CSPRNG.

Run::

    python examples/grid_clustering.py [--n 20000] [--epsilon 6] [--variant iterative|tree|uniform]
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Sequence

import grpc
import numpy as np

from ldp.v1 import campaigns_pb2, service_pb2, service_pb2_grpc
from ldp_client import Device, DevicePolicy, RoundSpec, SeededRng
from ldp_client.grpc import CollectorClient, OutcomeStatus, RoundNotOpen, Sender
from ldp_collector.config import CollectorConfig
from ldp_collector.serde import result_from_proto
from ldp_collector.server.lifecycle import RunningServer, start_server
from ldp_collector.simulation.evaluation import evaluate_clustering

BOX = (10.0, 10.0)
BATCH = 1000
GRID = campaigns_pb2.GridParameters
VARIANTS = {"uniform": GRID.UNIFORM, "tree": GRID.TREE, "iterative": GRID.ITERATIVE}


def rider_positions(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Riders waiting along two straight corridors and one curved street, in km; and each one's zone."""
    rng = np.random.default_rng(seed)
    zone = rng.integers(0, 3, size=n)
    t = rng.uniform(0.0, 1.0, size=n)
    points = np.empty((n, 2))
    first, second, curve = zone == 0, zone == 1, zone == 2
    points[first] = np.array([1.0, 7.0]) + t[first, None] * np.array([5.0, 2.0])
    points[second] = np.array([7.0, 1.0]) + t[second, None] * np.array([2.0, 4.0])
    angle = np.pi * (1.0 + t[curve])
    points[curve] = np.column_stack([3.5 + 2.0 * np.cos(angle), 4.0 + 2.0 * np.sin(angle)])
    points += rng.normal(scale=0.18, size=(n, 2))
    return np.clip(points, 0.0, BOX[0]), zone


def describe(spec: RoundSpec) -> str:
    """What a round asks: each group task's encoder, its cells and the epsilon of one report."""
    parts = []
    for task in spec.tasks:
        component = task.components[0]
        encoder = component.encoder
        cells = getattr(encoder, "cells", None)
        level = getattr(encoder, "level", None)
        grid = (f"{len(cells)} cells of levels {min(c.level for c in cells)}-{max(c.level for c in cells)}"
                if cells is not None else f"the uniform level-{level} grid ({encoder.output_size} cells)")
        parts.append(f"groups {list(task.groups)}: {type(encoder).__name__}, {grid}, "
                     f"{type(component.mechanism).__name__.removesuffix('Params')} epsilon {task.epsilon:g}")
    return "; ".join(parts)


def wait_for_next(client: CollectorClient, operator: service_pb2_grpc.OperatorServiceStub,
                  metadata: tuple[tuple[str, str], ...], campaign_id: str, after: int) -> RoundSpec | None:
    """The next open round's spec, or ``None`` once the campaign is finished.

    Between two rounds the collector answers "not yet, ask again after ..." (the SDK's
    ``RoundNotOpen``): the rider waits as told, it is not an error.
    """
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        answer = client.poll_round_spec(campaign_id)
        if isinstance(answer, RoundNotOpen):
            time.sleep(answer.retry_after)
            continue
        if answer is not None and answer.round > after:
            return answer
        if answer is None:  # finished, or failed: the operator API says which
            campaign = operator.GetCampaign(service_pb2.GetCampaignRequest(campaign_id=campaign_id),
                                            metadata=metadata)
            if campaign.state == campaigns_pb2.FAILED:
                raise RuntimeError(f"campaign {campaign_id} failed: {campaign.error}")
            return None
        time.sleep(0.05)
    raise TimeoutError(f"campaign {campaign_id}: no round after {after} opened within 60 s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collector", metavar="HOST:PORT", help="use a running collector")
    parser.add_argument("--n", type=int, default=20_000, help="riders (default 20000)")
    parser.add_argument("--epsilon", type=float, default=6.0, help="each rider's budget for the campaign (default 6)")
    parser.add_argument("--variant", choices=tuple(VARIANTS), default="iterative")
    parser.add_argument("--max-iterations", type=int, default=1,
                        help="merge/split rounds of the iterative variant (default 1)")
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    if args.n < 100:
        parser.error("--n must be at least 100")
    if not 0.0 < args.epsilon <= 20.0:
        parser.error("--epsilon must be in (0, 20]")

    points, zones = rider_positions(args.n, args.seed)
    with tempfile.TemporaryDirectory(prefix="ldp-grid-") as work:
        server: RunningServer | None = None
        if args.collector:
            address, token = args.collector, os.environ.get("LDP_OPERATOR_TOKEN")
        else:
            token = secrets.token_urlsafe(24)
            server = start_server(CollectorConfig(listen="127.0.0.1:0", data_dir=work, operator_token=token,
                                                  log_level="WARNING"))
            address = server.address
        print(f"1. collector at {address}")
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        try:
            with grpc.insecure_channel(address) as channel, CollectorClient(address) as client:
                operator = service_pb2_grpc.OperatorServiceStub(channel)
                config = campaigns_pb2.CampaignConfig(
                    kind=campaigns_pb2.GRID, epsilon=args.epsilon, budget_policy=campaigns_pb2.SPLIT,
                    close_after_reports=args.n, description="where riders wait: grid clustering")
                config.domain.numeric.lower.extend([0.0, 0.0])
                config.domain.numeric.upper.extend(BOX)
                config.grid.variant = VARIANTS[args.variant]
                if args.variant == "iterative":
                    config.grid.max_iterations = args.max_iterations
                campaign = operator.CreateCampaign(service_pb2.CreateCampaignRequest(config=config),
                                                   metadata=metadata)
                campaign_id = campaign.config.campaign_id
                print(f"2. created campaign {campaign_id}: grid ({args.variant}), epsilon {args.epsilon:g} per rider "
                      f"split over the rounds, closes each round at {args.n:,} reports")

                # Simulation randomness (seeded, NOT private); a rider agrees to at most this campaign's budget.
                rng = SeededRng(args.seed)
                policy = DevicePolicy(max_epsilon_per_campaign=args.epsilon, allowed_kinds=("grid",))
                riders = [Device.in_memory(policy, rng=rng) for _ in range(args.n)]
                positions = [tuple(p) for p in points.tolist()]
                print("3. the rounds, each computed by the collector from the previous one's reports:")
                spec = wait_for_next(client, operator, metadata, campaign_id, after=0)
                while spec is not None:
                    started = time.perf_counter()
                    print(f"   round {spec.round}: {describe(spec)}")
                    reports = [rider.participate(spec, position) for rider, position in zip(riders, positions)]
                    own = Sender(riders[0], client, packed=True).drain()  # one rider sends its own report
                    accepted, rejected = own.accepted, len(own.rejected)
                    relayed = [(i, r) for i, r in enumerate(reports) if i > 0 and r is not None]
                    for start in range(0, len(relayed), BATCH):
                        batch = relayed[start:start + BATCH]
                        outcomes = client.submit_packed([r for _, r in batch])
                        accepted += sum(o.status is OutcomeStatus.ACCEPTED for o in outcomes)
                        rejected += sum(o.status is OutcomeStatus.REJECTED for o in outcomes)
                        for (i, report), _ in zip(batch, outcomes):
                            riders[i].acknowledge([report.report_id])  # the collector has it: forget it
                    print(f"      {accepted:,} reports accepted, {rejected} rejected "
                          f"({time.perf_counter() - started:.1f} s); the round closed itself")
                    spec = wait_for_next(client, operator, metadata, campaign_id, after=spec.round)

                result = client.get_result(campaign_id)
                clustering = result.clustering
                noise = sum(1 for label in clustering.cell_map.labels if label < 0)
                print(f"   campaign FINISHED: {clustering.k} clusters over {len(clustering.cell_map.cells):,} cells "
                      f"({noise:,} noise cells)")
                for warning in result.warnings:
                    print(f"   warning: {warning}")

                rider = riders[0]
                spent = rider.spent(campaign_id)
                label = client.cluster_label(campaign_id, positions[0])
                model = client.get_cluster_model(campaign_id)  # keep it to label again offline
                x, y = positions[0]
                print(f"4. rider 0, waiting at ({x:.2f}, {y:.2f}) km, labels itself from the published clustering: "
                      f"cluster {label} (-1 would be noise); same from the kept model: "
                      f"{model.label(positions[0]) == label}; epsilon spent before {spent:g}, after "
                      f"{rider.spent(campaign_id):g}")

                scores = evaluate_clustering(result_from_proto(result), points, zones)
                ledgers = np.array([r.spent(campaign_id) for r in riders])
                print(f"5. against the true zones (cluster numbers are arbitrary; ARI compares the partitions): "
                      f"ARI {scores['ari']:.3f}, NMI {scores['nmi']:.3f}, noise share {scores['noise_share']:.3f}")
                print(f"   every rider's ledger: epsilon spent in [{ledgers.min():g}, {ledgers.max():g}] "
                      f"(budget {args.epsilon:g}); reports still in outboxes: "
                      f"{sum(len(r.pending_reports()) for r in riders)}")
        finally:
            if server is not None:
                server.stop(grace=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
