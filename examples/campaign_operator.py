"""The operator's side: create a campaign, watch devices report, close the round, read estimates.

The story: a city wants to know where its scooters are parked, on an 8 x 8 grid over the service
area, without any scooter revealing its location. Every scooter randomizes its grid cell with the
collector's variance-optimal frequency oracle (epsilon = 2) and reports once.

1. A collector runs (in-process on a free loopback port with a temporary data directory, or
   ``--collector HOST:PORT`` with the token in ``$LDP_OPERATOR_TOKEN``).
2. ``CreateCampaign``: a histogram over the numeric domain [0, 10] x [0, 10], 8 x 8 cells.
3. ``WatchCampaign`` streams progress while simulated scooters (the SDK, seeded: not
   privacy-preserving) submit their reports in batches from another thread.
4. Once every report is in, ``CloseRound`` runs the server step and the stream ends (FINISHED).
5. ``GetEstimates``: every cell's unbiased count with its standard error and interval.

Run::

    python examples/campaign_operator.py [--scooters 20000]
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

import grpc
import numpy as np

from ldp.v1 import campaigns_pb2, service_pb2, service_pb2_grpc
from ldp_client.grpc import CollectorClient
from ldp_collector.config import CollectorConfig
from ldp_collector.server.lifecycle import RunningServer, start_server
from ldp_collector.simulation.population import Population

CELLS = 8


def scooter_positions(n: int, seed: int) -> np.ndarray:
    """Three parking hot spots plus scooters scattered everywhere, inside [0, 10]^2."""
    rng = np.random.default_rng(seed)
    hot = np.array([[2.0, 2.5], [7.0, 7.5], [7.5, 2.0]])
    spot = rng.integers(0, 4, size=n)
    points = np.where(spot[:, None] < 3, hot[np.minimum(spot, 2)] + rng.normal(scale=0.6, size=(n, 2)),
                      rng.uniform(0.0, 10.0, size=(n, 2)))
    return np.clip(points, 0.0, 10.0)


def report_in_batches(address: str, campaign_id: str, points: np.ndarray, failures: list[BaseException]) -> None:
    """The scooters' side, condensed: fetch the round, participate, send in batches of 1000."""
    try:
        with CollectorClient(address) as client:
            spec = client.get_round_spec(campaign_id)
            assert spec is not None
            population = Population(points, seed=5, mode="direct")
            for start in range(0, len(points), 1000):
                client.submit_packed(population.participate(spec, start, start + 1000))
                time.sleep(0.02)  # devices trickle in
    except BaseException as exc:
        failures.append(exc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collector", metavar="HOST:PORT", help="use a running collector")
    parser.add_argument("--scooters", type=int, default=20_000)
    args = parser.parse_args(argv)
    if args.scooters < 1:
        parser.error("--scooters must be positive")

    with tempfile.TemporaryDirectory(prefix="ldp-operator-") as work:
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
            with grpc.insecure_channel(address) as channel:
                operator = service_pb2_grpc.OperatorServiceStub(channel)
                config = campaigns_pb2.CampaignConfig(kind=campaigns_pb2.HISTOGRAM, epsilon=2.0,
                                                      description="scooter parking, 8 x 8 grid")
                config.domain.numeric.lower.extend([0.0, 0.0])
                config.domain.numeric.upper.extend([10.0, 10.0])
                config.histogram.cells_per_dimension.extend([CELLS, CELLS])
                campaign = operator.CreateCampaign(service_pb2.CreateCampaignRequest(config=config),
                                                   metadata=metadata)
                campaign_id = campaign.config.campaign_id
                oracle = campaigns_pb2.FrequencyOracle.Name(campaign.config.histogram.oracle)
                print(f"2. created campaign {campaign_id}: histogram, epsilon 2, {CELLS} x {CELLS} cells, "
                      f"oracle {oracle} (chosen by the collector)")

                points = scooter_positions(args.scooters, seed=3)
                failures: list[BaseException] = []
                reporter = threading.Thread(target=report_in_batches, args=(address, campaign_id, points, failures))
                reporter.start()
                print("3. watching the campaign while the scooters report")
                closed = False
                events = operator.WatchCampaign(service_pb2.WatchCampaignRequest(campaign_id=campaign_id),
                                                metadata=metadata, timeout=120)
                for event in events:
                    state = campaigns_pb2.CampaignState.Name(event.campaign.state)
                    print(f"   {state:<10} round {event.campaign.current_round.round or '-'}: "
                          f"{event.current_round_reports:,} reports")
                    if not closed and (event.current_round_reports >= args.scooters or failures):
                        reporter.join()
                        if failures:
                            raise failures[0]
                        operator.CloseRound(service_pb2.CloseRoundRequest(campaign_id=campaign_id, round=1),
                                            metadata=metadata)
                        closed = True
                        print("4. all reports in: closed round 1 (the server step ran)")
                reporter.join()

                estimates = operator.GetEstimates(service_pb2.GetEstimatesRequest(campaign_id=campaign_id),
                                                  metadata=metadata)
                print(f"5. estimates of round {estimates.round} from {estimates.reports:,} reports "
                      f"({estimates.confidence:.0%} intervals); the five busiest cells:")
                truth = np.zeros(CELLS * CELLS, dtype=np.int64)
                cell = np.minimum((points / 10.0 * CELLS).astype(np.int64), CELLS - 1)
                np.add.at(truth, cell[:, 0] * CELLS + cell[:, 1], 1)
                print(f"   {'cell (x, y)':>16} {'estimate':>9} {'+- SE':>6} {'interval':>18} {'truth':>6}")
                for e in sorted(estimates.estimates, key=lambda e: -e.count)[:5]:
                    x, y = divmod(e.value, CELLS)
                    area = f"[{x * 10 / CELLS:.2f}, {y * 10 / CELLS:.2f}]"
                    print(f"   {area:>16} {e.count:9.0f} {e.std_error:6.0f} "
                          f"[{e.ci_lower:7.0f}, {e.ci_upper:7.0f}] {truth[e.value]:6d}")
                covered = sum(e.ci_lower <= truth[e.value] <= e.ci_upper for e in estimates.estimates)
                print(f"   {covered} of {len(estimates.estimates)} intervals cover the true count")
                for warning in estimates.warnings:
                    print(f"   warning: {warning}")
        finally:
            if server is not None:
                server.stop(grace=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
