"""A device app embedding the SDK: participate, survive a collector outage, resume, label itself.

The story: an electric-car app reports its battery-health bucket (0 = worn ... 9 = new) to the
fleet operator's collector under local differential privacy (epsilon = 1), so the operator learns
the fleet's distribution and no car reveals its own bucket.

1. A collector runs (here: in-process on a free loopback port with a temporary data directory;
   ``--collector HOST:PORT`` uses a running one, with ``$LDP_OPERATOR_TOKEN``).
2. The operator creates a histogram campaign (an operator call with the bearer token).
3. The car fetches the round -- between two rounds the collector answers "not yet, ask again after
   ...", and the app waits as told -- and participates (the report is charged to its budget ledger
   and stored durably in its outbox *before* anything is sent) ...
4. ... but the collector is down: sending fails, and the report stays in the outbox.
5. The collector restarts on the same data directory; the car resumes and drains its outbox.
6. Other cars (simulated) report too; the operator closes the round; the car downloads the result
   and reads off its own bucket's estimate -- post-processing, at no privacy cost -- and sees that
   no further round is coming.

Run::

    python examples/edge_app.py
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

from ldp.v1 import campaigns_pb2, service_pb2, service_pb2_grpc
from ldp_client.device import Device, DevicePolicy
from ldp_client.grpc import CollectorClient, RoundNotOpen, RpcFailedError, Sender
from ldp_client.spec import RoundSpec
from ldp_collector.config import CollectorConfig
from ldp_collector.server.lifecycle import RunningServer, start_server
from ldp_collector.simulation.population import simulate_round

BUCKETS = 10
MY_BUCKET = 7
OTHER_CARS = 5000
#: The simulated fleet's buckets, repeated: mostly healthy batteries.
FLEET = (9, 9, 8, 8, 8, 7, 7, 6, 5, 3)


def step(text: str) -> None:
    print(f"\n== {text}")


def create_campaign(address: str, token: str | None) -> str:
    """The operator's call: a histogram over the 10 buckets, epsilon 1 per car."""
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.insecure_channel(address) as channel:
        operator = service_pb2_grpc.OperatorServiceStub(channel)
        config = campaigns_pb2.CampaignConfig(kind=campaigns_pb2.HISTOGRAM, epsilon=1.0,
                                              campaign_id=f"battery-health-{secrets.token_hex(4)}",
                                              description="battery health buckets")
        config.domain.categorical_size = BUCKETS
        campaign = operator.CreateCampaign(service_pb2.CreateCampaignRequest(config=config), metadata=metadata)
    return str(campaign.config.campaign_id)


def close_round(address: str, token: str | None, campaign_id: str, round: int) -> None:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.insecure_channel(address) as channel:
        operator = service_pb2_grpc.OperatorServiceStub(channel)
        operator.CloseRound(service_pb2.CloseRoundRequest(campaign_id=campaign_id, round=round), metadata=metadata)


def current_round(client: CollectorClient, campaign_id: str) -> RoundSpec | None:
    """The campaign's open round, or ``None`` once it is finished.

    Between two rounds (the collector is computing the next one) the answer is "not yet, ask again
    after ...": not an error. This app simply waits; an app on a battery would schedule its next
    check instead of sleeping.
    """
    while True:
        answer = client.poll_round_spec(campaign_id)
        if not isinstance(answer, RoundNotOpen):
            return answer
        print(f"   the collector is between two rounds; asking again in {answer.retry_after:g} s")
        time.sleep(answer.retry_after)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collector", metavar="HOST:PORT", help="use a running collector (no outage step)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="ldp-edge-") as work:
        server: RunningServer | None = None
        config: CollectorConfig | None = None
        if args.collector:
            address, token = args.collector, os.environ.get("LDP_OPERATOR_TOKEN")
            step(f"1. using the collector at {address}")
        else:
            token = secrets.token_urlsafe(24)
            config = CollectorConfig(listen="127.0.0.1:0", data_dir=os.path.join(work, "collector"),
                                     operator_token=token, log_level="WARNING")
            server = start_server(config)
            address = server.address
            step(f"1. collector started on {address} (data in {config.data_dir})")

        try:
            campaign_id = create_campaign(address, token)
            step(f"2. operator created campaign {campaign_id}")

            # The app's own state: never shared between devices, kept across restarts of the app.
            device = Device(os.path.join(work, "car-state"), DevicePolicy(max_epsilon_per_campaign=2.0))
            # Short retries so the outage shows quickly; a real app keeps the defaults.
            client = CollectorClient(address, timeout=2.0, max_attempts=3, backoff_base=0.05, backoff_max=0.2)
            spec = current_round(client, campaign_id)
            assert spec is not None
            report = device.participate(spec, MY_BUCKET)
            assert report is not None
            step(f"3. the car fetched round {spec.round} ({spec.kind}, epsilon {spec.campaign_epsilon:g}) and "
                 f"participated: report {report.report_id.hex()[:12]}..., {len(report.pack())} bytes")
            print(f"   charged before sending: spent {device.spent(campaign_id):g}; "
                  f"outbox holds {len(device.pending_reports())} report(s)")

            if server is not None and config is not None:
                port = server.port
                server.stop(grace=1.0)
                step("4. the collector went down; the car tries to send")
                try:
                    Sender(device, client, packed=True).drain()
                    print("   unexpected: the send succeeded")
                    return 1
                except RpcFailedError as exc:
                    print(f"   send failed: {exc}")
                print(f"   the report is still in the outbox: {len(device.pending_reports())} pending, "
                      f"same id {device.pending_reports()[0].report_id == report.report_id}")

                server = start_server(config.replace(listen=f"127.0.0.1:{port}"))
                step(f"5. the collector restarted on {server.address} with the same data directory")
                # The app itself was closed meanwhile; it reopens its state and a fresh connection.
                client.close()
                device.close()
                device = Device(os.path.join(work, "car-state"), DevicePolicy(max_epsilon_per_campaign=2.0))
                client = CollectorClient(address)
                print(f"   the app reopened its state: {len(device.pending_reports())} report(s) pending, "
                      f"spent {device.spent(campaign_id):g}")
            else:
                step("4-5. (outage skipped: the collector is not ours to stop)")

            outcome = Sender(device, client, packed=True).drain()
            print(f"   drained: accepted {outcome.accepted}, duplicates {outcome.duplicates}, "
                  f"rejected {len(outcome.rejected)}; outbox now {len(device.pending_reports())}")

            # Other cars (simulated with seeded, NOT privacy-preserving randomness) report too.
            fleet = [FLEET[i % len(FLEET)] for i in range(OTHER_CARS)]
            others = simulate_round(spec, fleet, rng_seed=11)
            answers = client.submit_packed(others)
            close_round(address, token, campaign_id, spec.round)
            step(f"6. {len(answers):,} other cars reported; the operator closed round {spec.round}")

            result = client.get_result(campaign_id)
            mine = next(e for e in result.estimates.estimates if e.value == MY_BUCKET)
            print(f"   result {campaigns_pb2.CampaignState.Name(result.state)}: {result.estimates.reports:,} reports")
            print(f"   my bucket {MY_BUCKET}: estimated {mine.count:,.0f} cars +- {mine.std_error:,.0f} "
                  f"(95% interval {mine.ci_lower:,.0f} .. {mine.ci_upper:,.0f}; truth {fleet.count(MY_BUCKET) + 1:,}), "
                  "read locally at no privacy cost")
            print(f"   budget spent by this car: {device.spent(campaign_id):g} of its cap 2")
            print(f"   another round to report in: {current_round(client, campaign_id) is not None}")
            client.close()
            device.close()
        finally:
            if server is not None:
                server.stop(grace=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
