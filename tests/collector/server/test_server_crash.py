"""Kill -9 the collector SERVER many times while devices ingest; nothing acknowledged is lost or doubled.

The acceptance test of crash safety at the service level (DESIGN.md §5: "acknowledge only after the
batch is durably committed"), once per store backend: a real ``ldp-collector serve`` process
(``python -m ldp_collector.cli serve`` on a fixed free port, its store a SQLite data directory or a
PostgreSQL URL, a fresh schema of the test server of ``support.postgres``) serves one HISTOGRAM campaign with a GRR oracle
over 16 categories that never closes by itself. Client threads in the test process build reports
with the SDK on seeded generators and submit them in batches of 1 to 500 reports, over both
``SubmitReports`` and ``SubmitPacked``. A report counts as *acknowledged* only once an RPC carrying
it returned OK with an ACCEPTED or DUPLICATE outcome for it. A failed RPC is retried with the same
request (same ``request_id``) until it is acknowledged, except that now and then a device gives up
on a failed batch (it went offline); some of those reports come back later in new batches.
Acknowledged batches are sometimes replayed under their ``request_id`` (the first answer must come
back) and acknowledged reports are sometimes resent in new batches (they must be DUPLICATE; ACCEPTED
would mean the collector had lost them). Brand-new reports must always be ACCEPTED, also when the
answer comes from a retry after a crash: a request that was committed before the crash is replayed
with its first answer.

Meanwhile the test SIGKILLs the server 0.05 to 0.6 s after it reported SERVING, restarts it on the
same store and waits for SERVING again, ``KILLS`` times (``LDP_TEST_FAULT_KILLS``, default 24; the fault
suite, ``tox -e fault``, runs 200); now and then the restarted server
is killed once more while it is still starting up. At the end, with the server up and the clients
done, the database (read in one snapshot) must hold every acknowledged report exactly once and no
report nobody sent, the round's count and sequence numbers must match the stored reports, and the
stored accumulators must equal both :func:`~ldp_collector.estimation.accumulators.rebuild` over the
raw reports and the counts of the payloads the clients sent. Reports stored but never acknowledged
(committed, then the server died before answering and the device gave up) are allowed and counted.
Finally the round is closed through the operator API, the estimates must cover exactly the stored
reports, and the server must still shut down gracefully.
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest

from ldp.v1 import campaigns_pb2, service_pb2, service_pb2_grpc
from ldp_client import serde
from ldp_client.grpc import CollectorClient
from ldp_client.report import Report, pack_batch
from ldp_client.rng import SeededRng
from ldp_client.spec import RoundSpec
from ldp_collector.estimation.accumulators import (
    FORMAT_VERSION,
    KIND_DENSE,
    accumulator_key,
    component_params_from_spec,
    rebuild,
)
from ldp_collector.storage.base import StoredReport
from ldp_collector.storage.sqlite import DATABASE_FILE
from support.postgres import postgres_server, postgres_url  # noqa: F401  (fixtures)
from support.server_process import AUTH, CHANNEL_OPTIONS, ServerProcess, read_round

pytestmark = pytest.mark.integration

SEED = 20240612
#: SIGKILLs of a serving server during ingestion (start-up kills come on top); the fault suite sets 200.
KILLS = int(os.environ.get("LDP_TEST_FAULT_KILLS", "24"))
#: Every this many kills, the restarted server is also killed while it is still starting up.
STARTUP_KILL_EVERY = 6
CLIENT_THREADS = 6
MAX_BATCH = 500
DOMAIN = 16
EPSILON = 1.5
WEIGHTS = [0.7**v for v in range(DOMAIN)]
#: Probability that an acknowledged batch is replayed under its request_id.
REPLAY_PROBABILITY = 0.15
#: Probability that a batch carries a few reports acknowledged before (under other request ids).
RESEND_PROBABILITY = 0.3
#: Probability that a device gives up on a batch after a failed attempt (it went offline).
ABANDON_PROBABILITY = 0.2
#: Probability that a batch carries reports of abandoned batches (the device came back).
ORPHAN_PROBABILITY = 0.3
RPC_TIMEOUT_S = 10.0
#: After the last restart, how long clients keep retrying before they give up.
GIVE_UP_AFTER_S = 20.0
#: What a client sees when the server dies under a call or is down: retry with the same request.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED})
ACCEPTED = service_pb2.ReportOutcome.ACCEPTED
DUPLICATE = service_pb2.ReportOutcome.DUPLICATE

Request = service_pb2.SubmitReportsRequest | service_pb2.SubmitPackedRequest


@dataclass
class Tally:
    """What the clients did, shared by their threads (``lock`` guards everything)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: dict[bytes, Report] = field(default_factory=dict)  # every report put into a request
    acked: set[bytes] = field(default_factory=set)
    acked_order: list[bytes] = field(default_factory=list)  # for random resends
    orphans: list[Report] = field(default_factory=list)  # reports of abandoned batches, not yet resent
    in_flight: int = 0
    batches: int = 0  # acknowledged batches
    packed_batches: int = 0
    replays: int = 0
    resent_acked: int = 0
    resent_orphans: int = 0
    failed_attempts: int = 0
    acknowledged_after_retry: int = 0
    abandoned: int = 0
    given_up: int = 0
    give_up_at: float = float("inf")
    problems: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        with self.lock:
            if len(self.problems) < 50:
                self.problems.append(text)


class Device(threading.Thread):
    """One client thread: build batches with the SDK, submit them, record what was acknowledged."""

    def __init__(self, index: int, address: str, spec: RoundSpec, tally: Tally, stop: threading.Event) -> None:
        super().__init__(name=f"device-{index}", daemon=True)
        self.rng = random.Random(SEED * 100 + index)
        self.sdk_rng = SeededRng(SEED * 100 + index)
        self.index = index
        self.address = address
        self.spec = spec
        self.tally = tally
        self.stop = stop

    def run(self) -> None:
        try:
            with grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS) as channel:
                stub = service_pb2_grpc.DeviceServiceStub(channel)
                serial = 0
                while not self.stop.is_set():
                    serial += 1
                    self.one_batch(stub, f"d{self.index}-{serial}-{self.rng.getrandbits(64):016x}")
        except BaseException:
            self.tally.problem(f"{self.name} crashed:\n{traceback.format_exc()}")

    def fresh_reports(self, n: int) -> list[Report]:
        task = self.spec.tasks[0]
        out = []
        for value in self.rng.choices(range(DOMAIN), weights=WEIGHTS, k=n):
            payloads = tuple(component.run(value, rng=self.sdk_rng) for component in task.components)
            out.append(Report(report_id=self.sdk_rng.token_bytes(16), campaign_id=self.spec.campaign_id,
                              round=self.spec.round, group=task.groups[0], payloads=payloads))
        return out

    def one_batch(self, stub: service_pb2_grpc.DeviceServiceStub, request_id: str) -> None:
        rng, tally = self.rng, self.tally
        batch = self.fresh_reports(rng.randint(1, MAX_BATCH))
        fresh = {r.report_id for r in batch}
        resent: set[bytes] = set()
        with tally.lock:
            extra: list[Report] = []
            if tally.acked_order and rng.random() < RESEND_PROBABILITY:
                ids = rng.sample(tally.acked_order, min(len(tally.acked_order), rng.randint(1, 20)))
                resent = set(ids)
                extra += [tally.sent[rid] for rid in ids]
                tally.resent_acked += len(ids)
            if tally.orphans and rng.random() < ORPHAN_PROBABILITY:
                take = min(len(tally.orphans), rng.randint(1, 50))
                extra += tally.orphans[-take:]
                del tally.orphans[-take:]
                tally.resent_orphans += take
            tally.sent.update((r.report_id, r) for r in batch)
        for report in extra:
            batch.insert(rng.randrange(len(batch) + 1), report)

        packed = rng.random() < 0.5
        request: Request
        if packed:  # the outer request_id is optional for SubmitPacked
            request = service_pb2.SubmitPackedRequest(request_id=request_id if rng.random() < 0.5 else "",
                                                      packed=pack_batch(request_id, batch))
            call: Callable[..., service_pb2.SubmitReportsResponse] = stub.SubmitPacked
        else:
            request = service_pb2.SubmitReportsRequest(request_id=request_id,
                                                       reports=[serde.report_to_proto(r) for r in batch])
            call = stub.SubmitReports

        response = self.call_until_ok(call, request, may_abandon=True)
        if response is None:
            with tally.lock:
                tally.orphans += [r for r in batch if r.report_id not in tally.acked]
            return
        statuses = self.check(request_id, batch, fresh, resent, response)
        with tally.lock:
            for report, status in zip(batch, statuses):
                if status in (ACCEPTED, DUPLICATE) and report.report_id not in tally.acked:
                    tally.acked.add(report.report_id)
                    tally.acked_order.append(report.report_id)
            tally.batches += 1
            tally.packed_batches += packed

        if rng.random() < REPLAY_PROBABILITY:  # the same request again: the first answer comes back
            replay = self.call_until_ok(call, request, may_abandon=False)
            if replay is not None:
                with tally.lock:
                    tally.replays += 1
                again = [o.status for o in replay.outcomes]
                if again != statuses:
                    tally.problem(f"replay of {request_id} answered {Counter(again)}, first answer {Counter(statuses)}")

    def call_until_ok(self, call: Callable[..., service_pb2.SubmitReportsResponse], request: Request, *,
                      may_abandon: bool) -> service_pb2.SubmitReportsResponse | None:
        """``call(request)`` retried with the same request until OK; ``None`` if abandoned or given up."""
        tally = self.tally
        attempts = 0
        while True:
            attempts += 1
            with tally.lock:
                tally.in_flight += 1
            try:
                response = call(request, timeout=RPC_TIMEOUT_S, wait_for_ready=True)
            except grpc.RpcError as exc:
                code = exc.code()
                if code not in RETRYABLE:
                    raise AssertionError(f"{type(request).__name__} failed with {code}: {exc.details()}") from exc
                with tally.lock:
                    tally.failed_attempts += 1
                    if self.stop.is_set() and time.monotonic() > tally.give_up_at:
                        tally.given_up += 1
                        return None
                    if may_abandon and self.rng.random() < ABANDON_PROBABILITY:
                        tally.abandoned += 1
                        return None
                time.sleep(0.01)
                continue
            finally:
                with tally.lock:
                    tally.in_flight -= 1
            if attempts > 1:
                with tally.lock:
                    tally.acknowledged_after_retry += 1
            return response

    def check(self, request_id: str, batch: list[Report], fresh: set[bytes], resent: set[bytes],
              response: service_pb2.SubmitReportsResponse) -> list[int]:
        """The outcome statuses, after checking them against what the collector must answer."""
        if len(response.outcomes) != len(batch):
            self.tally.problem(f"{request_id}: {len(response.outcomes)} outcomes for {len(batch)} reports")
            return []
        statuses: list[int] = []
        for report, outcome in zip(batch, response.outcomes):
            rid = report.report_id
            if outcome.report_id != rid:
                self.tally.problem(f"{request_id}: outcome for {outcome.report_id.hex()} in the place of {rid.hex()}")
            elif outcome.status not in (ACCEPTED, DUPLICATE):
                self.tally.problem(f"{request_id}: report {rid.hex()} rejected: {outcome.reason}")
            elif rid in resent and outcome.status != DUPLICATE:
                self.tally.problem(f"{request_id}: report {rid.hex()}, acknowledged before, was ACCEPTED again "
                                   "(the collector had lost it)")
            elif rid in fresh and outcome.status != ACCEPTED:
                self.tally.problem(f"{request_id}: new report {rid.hex()} answered DUPLICATE (the request's "
                                   "reports were stored but its first answer was not)")
            statuses.append(outcome.status)
        return statuses


def histogram_config() -> campaigns_pb2.CampaignConfig:
    return campaigns_pb2.CampaignConfig(
        kind=campaigns_pb2.HISTOGRAM, domain=campaigns_pb2.Domain(categorical_size=DOMAIN), epsilon=EPSILON,
        close_after_reports=0, description="server crash test",
        histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.GRR))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_acknowledged_reports_survive_server_kill_9(backend: str, tmp_path: Path, request: pytest.FixtureRequest
                                                    ) -> None:
    started = time.monotonic()
    rng = random.Random(SEED)
    store = str(tmp_path / "data") if backend == "sqlite" else request.getfixturevalue("postgres_url")
    server = ServerProcess(tmp_path, store)
    tally = Tally()
    stop = threading.Event()
    devices: list[Device] = []
    kills = startup_kills = kills_in_flight = 0
    restart_times: list[float] = []
    try:
        server.start()
        server.wait_serving()
        with grpc.insecure_channel(server.address) as channel:
            operator = service_pb2_grpc.OperatorServiceStub(channel)
            campaign = operator.CreateCampaign(service_pb2.CreateCampaignRequest(config=histogram_config()),
                                               metadata=AUTH, timeout=RPC_TIMEOUT_S)
        cid = campaign.config.campaign_id
        with CollectorClient(server.address, options=CHANNEL_OPTIONS) as client:
            spec = client.get_round_spec(cid)
        assert spec is not None and spec.round == 1

        devices = [Device(i, server.address, spec, tally, stop) for i in range(CLIENT_THREADS)]
        for device in devices:
            device.start()
        for kill in range(KILLS):
            time.sleep(rng.uniform(0.05, 0.6))
            with tally.lock:
                kills_in_flight += tally.in_flight > 0
            server.kill()
            kills += 1
            if kill % STARTUP_KILL_EVERY == STARTUP_KILL_EVERY - 1:
                server.start()  # killed again while importing, opening the store or binding the port
                time.sleep(rng.uniform(0.0, 0.8))
                server.kill()
                startup_kills += 1
            time.sleep(rng.uniform(0.0, 0.1))  # down for a moment: clients see UNAVAILABLE
            server.start()
            restart_times.append(server.wait_serving())
        time.sleep(0.5)  # a last stretch of undisturbed ingestion
        with tally.lock:
            tally.give_up_at = time.monotonic() + GIVE_UP_AFTER_S
    except BaseException:
        with tally.lock:
            tally.give_up_at = time.monotonic()  # failing: the clients give up at once
        server.ensure_dead()
        raise
    finally:
        stop.set()
        for device in devices:
            device.join(GIVE_UP_AFTER_S + RPC_TIMEOUT_S + 10)
    try:
        assert not any(device.is_alive() for device in devices), "a client thread did not finish"
        assert not tally.problems, "\n".join(tally.problems)
        assert tally.given_up == 0, f"{tally.given_up} batches were never acknowledged by the restarted server"
        assert kills == KILLS >= 1 and tally.batches >= 5 * kills, (kills, tally.batches)
        assert len(tally.acked) > 10_000, "the clients acknowledged too little to prove anything"
        assert tally.failed_attempts > 0 and tally.acknowledged_after_retry > 0, "no kill interrupted a call"

        # (a) every acknowledged report stored exactly once; nothing stored that nobody sent.
        rows, report_count, id_count, blobs = read_round(store, cid, spec.round)
        stored = Counter(rid for _, rid, _, _ in rows)
        doubled = [rid.hex() for rid, n in stored.items() if n > 1]
        assert not doubled, f"{len(doubled)} reports stored more than once, e.g. {doubled[:5]}"
        missing = tally.acked - stored.keys()
        assert not missing, f"{len(missing)} acknowledged reports are lost, e.g. {[r.hex() for r in list(missing)[:5]]}"
        unknown = stored.keys() - tally.sent.keys()
        assert not unknown, f"{len(unknown)} stored reports were never sent"
        assert report_count == len(rows) == id_count, (report_count, len(rows), id_count)
        assert [seq for seq, _, _, _ in rows] == list(range(len(rows))), "report sequence numbers have gaps"
        assert all(group == 0 for _, _, group, _ in rows)
        # (b) stored but never acknowledged: committed, then the server died and the device gave up.
        unacknowledged = stored.keys() - tally.acked

        # (c) the accumulators equal a recomputation from the raw reports, and the sent payloads.
        reports = [StoredReport(report_id=rid, campaign_id=cid, round=spec.round, group=group, payloads=payloads)
                   for _, rid, group, payloads in rows]
        assert blobs == rebuild(reports, component_params_from_spec(spec)), "accumulators differ from a rebuild"
        sent_payloads = [tally.sent[rid].payloads[0] for rid in stored]
        assert all(isinstance(p, int) for p in sent_payloads)  # GRR reports a randomized index
        sent_values = np.bincount(np.array(sent_payloads, dtype=np.int64), minlength=DOMAIN)
        words = np.frombuffer(blobs[accumulator_key(0, 0)], dtype="<i8")
        assert list(words[:3]) == [FORMAT_VERSION, KIND_DENSE, len(rows)]
        assert words[3:].tolist() == sent_values.tolist(), "stored counts differ from the payloads sent"

        # (d) closing the round through the operator API estimates exactly the stored reports.
        with grpc.insecure_channel(server.address) as channel:
            operator = service_pb2_grpc.OperatorServiceStub(channel)
            snapshot = operator.GetCampaign(service_pb2.GetCampaignRequest(campaign_id=cid), metadata=AUTH,
                                            timeout=RPC_TIMEOUT_S)
            assert snapshot.rounds[-1].reports == len(rows)
            closed = operator.CloseRound(service_pb2.CloseRoundRequest(campaign_id=cid, round=spec.round),
                                         metadata=AUTH, timeout=60)
            assert closed.state == campaigns_pb2.FINISHED, closed
            estimates = operator.GetEstimates(service_pb2.GetEstimatesRequest(campaign_id=cid), metadata=AUTH,
                                              timeout=RPC_TIMEOUT_S)
        assert estimates.reports == len(rows)
        assert len(estimates.estimates) == DOMAIN
        assert sum(e.count for e in estimates.estimates) == pytest.approx(len(rows), rel=1e-9)

        code = server.terminate()
        assert code == 0, f"graceful shutdown after the crashes exited with {code}:\n{server.log_tail()}"
    finally:
        server.ensure_dead()
    if backend == "sqlite":
        with sqlite3.connect(f"file:{Path(store) / DATABASE_FILE}?mode=ro", uri=True) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    elapsed = time.monotonic() - started
    print(f"\nserver kill -9 test ({backend}): {kills} kills during ingestion ({kills_in_flight} with calls in flight) "
          f"+ {startup_kills} during start-up, {server.incarnations} server starts "
          f"(restart to SERVING {min(restart_times):.2f}-{max(restart_times):.2f} s); "
          f"{tally.batches} batches acknowledged ({tally.packed_batches} packed), {tally.replays} replays, "
          f"{tally.failed_attempts} failed attempts, {tally.acknowledged_after_retry} acknowledged after a retry, "
          f"{tally.abandoned} abandoned; {len(tally.acked)} reports acknowledged, {len(rows)} stored, "
          f"{len(unacknowledged)} stored but never acknowledged, {len(tally.sent) - len(rows)} sent but never stored; "
          f"{tally.resent_acked} acknowledged reports and {tally.resent_orphans} abandoned ones resent; "
          f"{elapsed:.1f} s")
