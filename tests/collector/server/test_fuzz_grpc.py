"""Fuzzing the collector through real gRPC: malformed messages to every RPC, then an audit of the store.

A collector runs in its own process (so a crash is seen as a dead process, and its memory is its
own) with an SQLite store, a few real campaigns (histogram GRR, OUE and OLH, a uniform-grid
clustering, one finished, one whose round the fuzz may close) and an operator token. Every RPC of
``DeviceService`` and ``OperatorService`` then receives ``LDP_TEST_FUZZ_MESSAGES`` messages (a CI-sized
default; the ``fuzz`` tox environment sends 100 000+) built from *valid* requests by
``support.fuzz.Mutator``: random bytes, truncations, bit flips, field-tag and wire-type confusion,
length prefixes that lie, msgpack payload mutations (wrong types, huge ints, NaN/inf, deep
nesting, huge declared lengths), reports aimed at the wrong campaign, round or group, duplicate
and replayed report ids, calls without or with a wrong operator token, and messages beyond the
receive limit. Some valid requests are mixed in so that the store keeps changing. The RPCs are
read from the protocol, so a new one is fuzzed too. A second run turns device tokens and
enrolment on (a quarter of the messages): device calls then carry a device token, the operator
token, a wrong one or none, and ``Enroll`` is open.

Checked on every answer: the status code is one the call may get (never UNKNOWN, INTERNAL,
DEADLINE_EXCEEDED ...; see :func:`allowed_codes`), error statuses carry a consistent
``google.rpc.Status``, and a ``SubmitReportsResponse`` has one outcome per report with matching
tallies. Checked while fuzzing: the server process is alive and its RSS stays bounded. Checked at
the end: health is SERVING, and the stored state is exactly the effect of what was acknowledged --
the stored report ids are the ACCEPTED ids, each once; every stored report re-validates against
its round; every accumulator equals a recomputation from the raw reports; the campaigns are the
initial ones plus those whose creation was acknowledged, and rounds closed only where a close was
acknowledged.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import msgpack
import pytest
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ldp.v1 import campaigns_pb2, reports_pb2, service_pb2, service_pb2_grpc
from ldp_client import serde
from ldp_client.payload import payload_from_wire
from ldp_client.report import Report, pack_batch, unpack_batch
from ldp_client.rng import SeededRng
from ldp_client.spec import RoundSpec
from ldp_collector.estimation.accumulators import component_params_from_spec, rebuild
from ldp_collector.ingest import RoundContext, validate_report
from ldp_collector.server.wire import DEVICE_SERVICE, OPERATOR_SERVICE
from ldp_collector.storage import open_store
from ldp_collector.storage.base import ReportStore
from support.fuzz import Mutator, env_count

pytestmark = pytest.mark.integration

MESSAGES = env_count("LDP_TEST_FUZZ_MESSAGES", 3000)
TOKEN = "fuzz-operator-token-0123456789abcdef"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
RECEIVE_LIMIT = 256 * 1024
MAX_BATCH = 64
WINDOW = 48
CALL_TIMEOUT = 120.0
#: Server memory ceiling while fuzzing, and the most it may grow after the warm-up.
MAX_RSS = 512 * 1024 * 1024
MAX_RSS_GROWTH = 96 * 1024 * 1024

Code = grpc.StatusCode
DEVICE_TOKEN = "fuzz-device-token-0123456789abcdef"
DEVICE_AUTH = (("authorization", f"Bearer {DEVICE_TOKEN}"),)
#: Every RPC of both services, read from the protocol (a new RPC is fuzzed without a change here);
#: the operator's GetResult is "OperatorGetResult" to tell it from the device's.
DEVICE_METHODS = tuple(m.name for m in service_pb2.DESCRIPTOR.services_by_name["DeviceService"].methods)
OPERATOR_METHODS = tuple("OperatorGetResult" if m.name == "GetResult" else m.name
                         for m in service_pb2.DESCRIPTOR.services_by_name["OperatorService"].methods)
#: Share of the messages each method receives (ingestion gets most; 2 for a method not listed).
WEIGHTS = {name: 2 for name in (*DEVICE_METHODS, *OPERATOR_METHODS)} | {
    "SubmitReports": 10, "SubmitPacked": 12, "GetRoundSpec": 3, "CreateCampaign": 3, "OperatorGetResult": 1,
    "WatchCampaign": 1}
#: Codes that always signal a bug when they answer a malformed message.
NEVER = {Code.UNKNOWN, Code.INTERNAL, Code.DATA_LOSS, Code.DEADLINE_EXCEEDED, Code.CANCELLED, Code.UNIMPLEMENTED}
#: Codes the service raises itself, which carry a google.rpc.Status with an ErrorInfo.
RICH = {Code.INVALID_ARGUMENT, Code.NOT_FOUND, Code.FAILED_PRECONDITION, Code.ALREADY_EXISTS, Code.UNAUTHENTICATED,
        Code.UNAVAILABLE}

# The collector process: configured from argv, prints its port, serves until stdin closes.
SERVER = """
import json, logging, sys
logging.basicConfig(level=logging.ERROR)  # tracebacks of failed calls; not the refused-token warnings
from ldp_collector.config import CollectorConfig
from ldp_collector.server.lifecycle import start_server
server = start_server(CollectorConfig(**json.loads(sys.argv[1])))
print(server.port, flush=True)
sys.stdin.read()
server.stop(grace=5.0)
"""


class ServerProcess:
    """A collector in a child process (loopback only); ``stop`` closes its stdin and waits."""

    def __init__(self, data_dir: Path, *, device_auth: bool = False) -> None:
        config: dict[str, Any] = {"listen": "127.0.0.1:0", "data_dir": str(data_dir), "operator_token": TOKEN,
                                  "max_receive_bytes": RECEIVE_LIMIT, "max_batch_reports": MAX_BATCH,
                                  "tick_interval_s": 0.2}
        if device_auth:  # device calls need a token; Enroll is open and hands out more
            config |= {"device_tokens": [DEVICE_TOKEN], "enrolment": True,
                       "enrolment_secret": "fuzz-enrolment-secret-0123456789"}
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(config)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=dict(os.environ), text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.proc.kill()
            raise RuntimeError(f"the collector did not start (exit code {self.proc.wait()})")
        self.address = f"127.0.0.1:{int(line)}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss(self) -> int:
        """Resident memory of the server process in bytes."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS line")

    def stop(self) -> int:
        if self.alive():
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


# -- the campaigns under attack -------------------------------------------------------------------

def histogram(campaign_id: str, oracle: int, size: int) -> campaigns_pb2.CampaignConfig:
    return campaigns_pb2.CampaignConfig(
        campaign_id=campaign_id, kind=campaigns_pb2.HISTOGRAM, epsilon=2.0,
        domain=campaigns_pb2.Domain(categorical_size=size),
        histogram=campaigns_pb2.HistogramParameters(oracle=oracle))  # type: ignore[arg-type]


def grid(campaign_id: str) -> campaigns_pb2.CampaignConfig:
    config = campaigns_pb2.CampaignConfig(campaign_id=campaign_id, kind=campaigns_pb2.GRID, epsilon=2.0,
                                          budget_policy=campaigns_pb2.SPLIT)
    config.domain.numeric.lower.extend([0.0, -1.0])
    config.domain.numeric.upper.extend([1.0, 1.0])
    config.grid.variant = campaigns_pb2.GridParameters.UNIFORM
    return config


CAMPAIGNS = {
    "fz-grr": histogram("fz-grr", campaigns_pb2.GRR, 5),
    "fz-oue": histogram("fz-oue", campaigns_pb2.OUE, 20),
    "fz-olh": histogram("fz-olh", campaigns_pb2.OLH, 300),
    "fz-grid": grid("fz-grid"),
    "fz-close": histogram("fz-close", campaigns_pb2.GRR, 4),
    "fz-finished": histogram("fz-finished", campaigns_pb2.GRR, 3),
}
#: The campaigns whose open rounds receive reports (the others get them as hostile targets).
REPORTING = ("fz-grr", "fz-oue", "fz-olh", "fz-grid", "fz-close")


def point_for(campaign_id: str, rng: random.Random) -> Any:
    if campaign_id == "fz-grid":
        return (rng.random(), rng.uniform(-1.0, 1.0))
    size = CAMPAIGNS[campaign_id].domain.categorical_size
    return rng.randrange(size)


# -- bookkeeping ----------------------------------------------------------------------------------

@dataclass
class Ledger:
    """Everything the server acknowledged, and every answer's code per method."""

    #: Report ids answered ACCEPTED (a replayed request gets its first answer again, so an id may
    #: be answered ACCEPTED more than once; the audit checks it is stored once).
    accepted: set[bytes] = field(default_factory=set)
    created: set[str] = field(default_factory=set)
    closed: Counter[str] = field(default_factory=Counter)
    codes: dict[str, Counter[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    sent: int = 0

    def problem(self, text: str) -> None:
        if len(self.problems) < 50:
            self.problems.append(text)


@dataclass
class Message:
    """One message: the method, its bytes, its metadata, and how the answer is judged."""

    method: str  # "DeviceService/SubmitPacked" ...
    data: bytes
    metadata: tuple[tuple[str, str], ...] = ()
    unauthenticated: bool = False
    oversized: bool = False

    @property
    def path(self) -> str:
        service, name = self.method.split("/")
        return f"/{DEVICE_SERVICE if service == 'DeviceService' else OPERATOR_SERVICE}/{name}"


def allowed_codes(message: Message) -> set[Code]:
    """The status codes a malformed (or valid) message may get."""
    if message.oversized:
        return {Code.RESOURCE_EXHAUSTED}
    if message.unauthenticated:
        return {Code.UNAUTHENTICATED}
    allowed = {Code.OK, Code.INVALID_ARGUMENT, Code.NOT_FOUND, Code.FAILED_PRECONDITION, Code.UNAVAILABLE}
    if message.method.startswith("OperatorService/"):
        allowed.add(Code.ALREADY_EXISTS)
    return allowed


def rich_status(trailing: Any) -> status_pb2.Status | None:
    for key, value in trailing or ():
        if key == "grpc-status-details-bin":
            return status_pb2.Status.FromString(value)
    return None


def judge(message: Message, code: Code, details: str | None, trailing: Any, response: bytes | None,
          ledger: Ledger) -> None:
    ledger.codes.setdefault(message.method, Counter())[code.name] += 1
    if code not in allowed_codes(message) or code in NEVER:
        ledger.problem(f"{message.method} {message.data[:60]!r}: {code.name} ({details})")
        return
    if code != Code.OK:
        status = rich_status(trailing)
        if code in RICH and status is None:
            ledger.problem(f"{message.method}: {code.name} without google.rpc.Status details")
        elif status is not None and (status.code != code.value[0] or status.message != (details or "")):
            ledger.problem(f"{message.method}: status details disagree with {code.name}: {status}")
        if code == Code.UNAVAILABLE and status is not None and not any(
                d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in status.details):
            ledger.problem(f"{message.method}: UNAVAILABLE without RetryInfo")
        return
    if response is None:
        return
    name = message.method.split("/")[1]
    if name in ("SubmitReports", "SubmitPacked"):
        check_submit(message, response, ledger)
    elif name == "CreateCampaign":
        ledger.created.add(campaigns_pb2.Campaign.FromString(response).config.campaign_id)
    elif name == "CloseRound":
        ledger.closed[campaigns_pb2.Campaign.FromString(response).config.campaign_id] += 1


def check_submit(message: Message, response: bytes, ledger: Ledger) -> None:
    """A well-formed SubmitReportsResponse with one outcome per report the request held."""
    answer = service_pb2.SubmitReportsResponse.FromString(response)
    if message.method.endswith("SubmitReports"):
        expected = len(service_pb2.SubmitReportsRequest.FromString(message.data).reports)
    else:
        expected = len(unpack_batch(service_pb2.SubmitPackedRequest.FromString(message.data).packed)[1])
    statuses = Counter(o.status for o in answer.outcomes)
    outcome = service_pb2.ReportOutcome
    if len(answer.outcomes) != expected or (answer.accepted, answer.duplicates, answer.rejected) != (
            statuses[outcome.ACCEPTED], statuses[outcome.DUPLICATE], statuses[outcome.REJECTED]) \
            or sum(statuses.values()) != expected:
        ledger.problem(f"{message.method}: malformed response {answer} for {expected} reports")
    for o in answer.outcomes:
        if o.status == outcome.ACCEPTED:
            ledger.accepted.add(o.report_id)
        elif o.status == outcome.REJECTED and not o.reason:
            ledger.problem(f"{message.method}: a rejection without a reason")


# -- building hostile messages --------------------------------------------------------------------

class Forge:
    """Builds the messages: valid requests as seeds, then hostile variants of them."""

    def __init__(self, rng: random.Random, specs: dict[str, RoundSpec], finished: RoundSpec, *,
                 device_auth: bool = False) -> None:
        self.rng = rng
        self.device_auth = device_auth
        self.device_rng = SeededRng(rng.getrandbits(64))
        self.mutator = Mutator(rng)
        self.specs = specs
        self.finished = finished
        self.replays: list[Message] = []
        #: Ids of the valid reports built so far (most were accepted): material for duplicates.
        self.issued: list[bytes] = []
        self.created = 0

    # valid seeds
    def report(self, campaign_id: str | None = None) -> Report:
        spec = self.specs[campaign_id or self.rng.choice(REPORTING)]
        task = self.rng.choice(spec.tasks)
        point = point_for(spec.campaign_id, self.rng)
        report_id = self.device_rng.token_bytes(16)
        if len(self.issued) < 5000:
            self.issued.append(report_id)
        return Report(report_id=report_id, campaign_id=spec.campaign_id, round=spec.round,
                      group=self.rng.choice(task.groups),
                      payloads=tuple(c.run(point, rng=self.device_rng) for c in task.components))

    def reports(self) -> list[Report]:
        return [self.report() for _ in range(self.rng.randrange(1, 6))]

    def request_id(self) -> str:
        return f"fz-{self.rng.getrandbits(48):x}"

    def campaign_id(self) -> str:
        return self.rng.choice([*CAMPAIGNS, "fz-nope", self.finished.campaign_id])

    def seed(self, name: str) -> bytes:
        rng = self.rng
        if name == "SubmitReports":
            return service_pb2.SubmitReportsRequest(
                request_id=self.request_id(), reports=[serde.report_to_proto(r) for r in self.reports()]
            ).SerializeToString()
        if name == "SubmitPacked":
            return service_pb2.SubmitPackedRequest(packed=pack_batch(self.request_id(), self.reports())
                                                   ).SerializeToString()
        if name in ("GetRoundSpec", "GetResult", "OperatorGetResult"):
            return service_pb2.GetResultRequest(campaign_id=self.campaign_id()).SerializeToString()
        if name in ("GetCampaign", "WatchCampaign"):
            return service_pb2.GetCampaignRequest(campaign_id=self.campaign_id()).SerializeToString()
        if name == "GetEstimates":
            return service_pb2.GetEstimatesRequest(campaign_id=self.campaign_id(), round=rng.randrange(3),
                                                   confidence=rng.choice([0.0, 0.9, 0.95])).SerializeToString()
        if name == "ListCampaigns":
            return service_pb2.ListCampaignsRequest(page_size=rng.randrange(0, 20),
                                                    page_token=rng.choice(["", "fz-grr", "zzz"])).SerializeToString()
        if name == "CloseRound":
            return service_pb2.CloseRoundRequest(campaign_id="fz-close", round=rng.randrange(0, 4)).SerializeToString()
        if name == "CreateCampaign":
            self.created += 1
            template = CAMPAIGNS[rng.choice(list(CAMPAIGNS))]
            config = campaigns_pb2.CampaignConfig()
            config.CopyFrom(template)
            config.campaign_id = f"fzc-{self.created}"
            return service_pb2.CreateCampaignRequest(config=config).SerializeToString()
        return b""  # another RPC (Enroll ...): its default request, which the mutations fill in

    # hostile variants
    def hostile_report(self) -> reports_pb2.Report:
        """A well-formed report message aimed at the wrong campaign, round or group, or with a bad payload."""
        rng = self.rng
        message = serde.report_to_proto(self.report())
        edit = rng.randrange(8)
        if edit == 0:
            message.campaign_id = rng.choice(["fz-nope", self.finished.campaign_id, "", "bad id", "x" * 200])
        elif edit == 1:
            message.round = rng.choice([0, message.round + 1, 2**32 - 1])
        elif edit == 2:
            message.group = rng.choice([message.group + 1, 7, 4095, 2**32 - 1])
        elif edit == 3:  # a payload of another campaign's mechanism
            other = serde.report_to_proto(self.report(rng.choice([c for c in REPORTING if c != message.campaign_id])))
            del message.payloads[:]
            message.payloads.extend(other.payloads)
        elif edit == 4:  # payload count off by one
            if rng.random() < 0.5:
                message.payloads.append(message.payloads[0])
            else:
                message.payloads.pop()
        elif edit == 5 and self.issued:  # the id of a report sent earlier (a duplicate, maybe in another campaign)
            message.report_id = rng.choice(self.issued)
        elif edit == 6:
            message.report_id = rng.choice([b"", b"\x00" * 15, b"\x00" * 17, rng.randbytes(16)])
        else:
            payload = message.payloads[0]
            which = payload.WhichOneof("value")
            if which == "index":
                payload.index = rng.choice([2**64 - 1, 2**32, 300, 20, 5])
            elif which == "bits":
                payload.bits = rng.choice([b"", b"\xff" * len(payload.bits), payload.bits + b"\x00", b"\xff" * 100])
            elif which == "hashed":
                payload.hashed.value = rng.choice([2**32 - 1, 1000, 3])
        return message

    def hostile_packed(self) -> bytes:
        """A packed batch with msgpack-level damage: tree edits, lying headers, semantic edits."""
        rng = self.rng
        reports = self.reports()
        if rng.random() < 0.3:
            items = [r.to_wire() for r in reports]
            for item in items:
                k = rng.randrange(1, 6)
                item[k] = rng.choice([self.mutator.hostile_value(), "fz-nope", self.finished.campaign_id,
                                      item[k] if k != 3 else item[k] + 1])
            if rng.random() < 0.3:
                items.append(list(items[0]))  # a duplicate id inside the batch
            packed: bytes = msgpack.packb([1, self.request_id(), items], use_bin_type=True)
            return packed
        data = pack_batch(self.request_id(), reports)
        for _ in range(rng.randrange(1, 3)):
            data = self.mutator.msgpack(data)
        return data

    def message(self, name: str) -> Message:
        rng = self.rng
        service = "DeviceService" if name in DEVICE_METHODS else "OperatorService"
        method = f"{service}/{'GetResult' if name == 'OperatorGetResult' else name}"
        metadata: tuple[tuple[str, str], ...] = ()
        unauthenticated = False
        if service == "OperatorService" or (self.device_auth and name != "Enroll"):
            if rng.random() < 0.8:
                metadata = AUTH if service == "OperatorService" else rng.choice([DEVICE_AUTH, DEVICE_AUTH, AUTH])
            else:
                unauthenticated = True
                metadata = rng.choice([(), (("authorization", f"Bearer {rng.randbytes(12).hex()}"),),
                                       (("authorization", TOKEN),), (("authorization", "Basic x"),),
                                       (("authorization", f"Bearer {DEVICE_TOKEN}x"),)])
                if service == "OperatorService" and rng.random() < 0.2:
                    metadata = DEVICE_AUTH  # a device token is not an operator token
        roll = rng.random()
        if roll < 0.05 and self.replays and name in ("SubmitReports", "SubmitPacked"):
            return rng.choice(self.replays)  # the very same call again
        if roll < 0.15:
            data = self.mutator.random_bytes(rng.choice([40, 300]))
        elif roll < 0.25:
            data = self.mutator.raw(self.seed(name))
        elif roll < 0.55:
            data = self.seed(name)
            for _ in range(rng.randrange(1, 4)):
                data = self.mutator.wire(data)
        elif roll < 0.85 and name == "SubmitPacked":
            data = service_pb2.SubmitPackedRequest(packed=self.hostile_packed()).SerializeToString()
        elif roll < 0.85 and name == "SubmitReports":
            data = service_pb2.SubmitReportsRequest(
                request_id=self.request_id(),
                reports=[self.hostile_report() if rng.random() < 0.7 else serde.report_to_proto(self.report())
                         for _ in range(rng.randrange(1, 6))]).SerializeToString()
        else:
            data = self.seed(name)
        message = Message(method, data, metadata, unauthenticated)
        if name in ("SubmitReports", "SubmitPacked") and len(self.replays) < 2000:
            self.replays.append(message)
        return message

    def oversized(self) -> Message:
        packed = self.rng.randbytes(RECEIVE_LIMIT + self.rng.randrange(1, 4096))
        return Message("DeviceService/SubmitPacked",
                       service_pb2.SubmitPackedRequest(request_id="big", packed=packed).SerializeToString(),
                       oversized=True)


def messages(forge: Forge, count: int) -> Iterator[Message]:
    names = list(WEIGHTS)
    weights = list(WEIGHTS.values())
    oversized_every = max(1, count // 20)
    for i in range(count):
        if i % oversized_every == oversized_every - 1:
            yield forge.oversized()
        else:
            yield forge.message(forge.rng.choices(names, weights)[0])


# -- sending --------------------------------------------------------------------------------------

def send_all(channel: grpc.Channel, stream: Iterator[Message], ledger: Ledger, server: ServerProcess,
             on_progress: Callable[[int], None]) -> None:
    pending: list[tuple[Message, Any]] = []
    callables: dict[str, Any] = {}

    def drain() -> None:
        for message, future in pending:
            error = future.exception()
            if error is None:
                judge(message, Code.OK, None, None, future.result(), ledger)
            else:
                judge(message, future.code(), future.details(), future.trailing_metadata(), None, ledger)
        pending.clear()

    for message in stream:
        ledger.sent += 1
        if message.method.endswith("WatchCampaign"):
            call = channel.unary_stream(message.path, request_serializer=None, response_deserializer=None)(
                message.data, metadata=message.metadata, timeout=CALL_TIMEOUT)
            try:
                next(call, None)  # the first event, then hang up: the stream runs until the campaign ends
                call.cancel()
                judge(message, Code.OK, None, None, None, ledger)
            except grpc.RpcError as exc:
                judge(message, exc.code(), exc.details(), exc.trailing_metadata(), None, ledger)
        else:
            unary = callables.get(message.path)
            if unary is None:
                unary = callables[message.path] = channel.unary_unary(
                    message.path, request_serializer=None, response_deserializer=None)
            pending.append((message, unary.future(message.data, metadata=message.metadata, timeout=CALL_TIMEOUT)))
            if len(pending) >= WINDOW:
                drain()
        if ledger.sent % 500 == 0:
            drain()
            if not server.alive():
                raise AssertionError(f"the collector died after {ledger.sent} messages: {ledger.problems[:3]}")
            on_progress(ledger.sent)
    drain()


# -- the audit ------------------------------------------------------------------------------------

def audit(store: ReportStore, ledger: Ledger, closed_before: dict[str, int]) -> dict[str, int]:
    """The stored state against the acknowledgements; returns the stored report count per campaign."""
    campaigns = store.list_campaigns(10_000)
    ids = {c.campaign_id for c in campaigns}
    assert ids == set(CAMPAIGNS) | ledger.created, sorted(ids ^ (set(CAMPAIGNS) | ledger.created))
    stored: Counter[bytes] = Counter()
    per_campaign: dict[str, int] = {}
    for campaign in campaigns:
        rounds = store.list_rounds(campaign.campaign_id)
        if campaign.campaign_id in CAMPAIGNS:
            closed = sum(not r.open for r in rounds)
            assert closed == closed_before[campaign.campaign_id] + ledger.closed[campaign.campaign_id], \
                (campaign.campaign_id, closed, ledger.closed)
        for rnd in rounds:
            spec = RoundSpec.unpack(rnd.spec)
            context = RoundContext(campaign_id=campaign.campaign_id, round=rnd.round, spec=spec)
            params = component_params_from_spec(spec)
            rows = [row for batch in store.iter_reports(campaign.campaign_id, rnd.round) for row in batch]
            for row in rows:
                stored[row.report_id] += 1
                report = Report(report_id=row.report_id, campaign_id=row.campaign_id, round=row.round,
                                group=row.group, payloads=tuple(payload_from_wire(p) for p in msgpack.unpackb(
                                    row.payloads, raw=False)))
                assert validate_report(report, context) == row  # a valid report, stored as validated
            assert rnd.report_count == len(rows), (campaign.campaign_id, rnd.round)
            assert store.load_accumulators(campaign.campaign_id, rnd.round) == rebuild(rows, params), \
                (campaign.campaign_id, rnd.round)
            per_campaign[campaign.campaign_id] = per_campaign.get(campaign.campaign_id, 0) + len(rows)
    assert all(n == 1 for n in stored.values()), "a report is stored twice"
    missing = set(ledger.accepted) - set(stored)
    unacknowledged = set(stored) - set(ledger.accepted)
    assert not missing, f"{len(missing)} acknowledged reports are not stored"
    assert not unacknowledged, f"{len(unacknowledged)} stored reports were never acknowledged"
    return per_campaign


@pytest.mark.parametrize("device_auth", [False, True], ids=["open-devices", "device-tokens"])
def test_fuzzed_grpc_traffic_stores_exactly_what_was_acknowledged(tmp_path: Path, device_auth: bool) -> None:
    """Open device calls get the full count; with device tokens and enrolment on, a quarter."""
    started = time.monotonic()
    count = MESSAGES if not device_auth else max(1000, MESSAGES // 4)
    server = ServerProcess(tmp_path / "data", device_auth=device_auth)
    ledger = Ledger()
    rss_samples: list[int] = []
    try:
        options = [("grpc.max_send_message_length", 4 * RECEIVE_LIMIT)]
        with grpc.insecure_channel(server.address, options=options) as channel:
            operator = service_pb2_grpc.OperatorServiceStub(channel)
            device = service_pb2_grpc.DeviceServiceStub(channel)
            for config in CAMPAIGNS.values():
                operator.CreateCampaign(service_pb2.CreateCampaignRequest(config=config), metadata=AUTH)
            specs = {cid: serde.round_spec_from_proto(device.GetRoundSpec(
                service_pb2.GetRoundSpecRequest(campaign_id=cid), metadata=DEVICE_AUTH).spec) for cid in CAMPAIGNS}
            forge = Forge(random.Random(int(os.environ.get("LDP_TEST_FUZZ_SEED", "20261122"))), specs,
                          specs["fz-finished"], device_auth=device_auth)
            # Finish one campaign (with reports) before the fuzz.
            finished = [forge.report("fz-grr") for _ in range(30)]
            finished = [Report(report_id=r.report_id, campaign_id="fz-finished", round=specs["fz-finished"].round,
                               group=r.group, payloads=(r.payloads[0] % 3,)) for r in finished]
            answer = device.SubmitPacked(service_pb2.SubmitPackedRequest(packed=pack_batch("fin", finished)),
                                         metadata=DEVICE_AUTH)
            assert answer.accepted == len(finished)
            ledger.accepted.update(r.report_id for r in finished)
            operator.CloseRound(service_pb2.CloseRoundRequest(campaign_id="fz-finished", round=1), metadata=AUTH)
            closed_before = {cid: int(cid == "fz-finished") for cid in CAMPAIGNS}

            def progress(sent: int) -> None:
                rss_samples.append(server.rss())

            send_all(channel, messages(forge, count), ledger, server, progress)
            assert server.alive(), "the collector died"
            rss_samples.append(server.rss())
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            # Still fully functional: an honest batch is accepted.
            honest = [forge.report("fz-grr") for _ in range(5)]
            answer = device.SubmitPacked(service_pb2.SubmitPackedRequest(packed=pack_batch("after", honest)),
                                         metadata=DEVICE_AUTH)
            if "fz-grr" in ledger.closed:
                assert answer.rejected == len(honest)
            else:
                assert answer.accepted == len(honest)
                ledger.accepted.update(r.report_id for r in honest)
        assert server.stop() == 0, "the collector did not shut down cleanly"
    finally:
        if server.alive():
            server.proc.kill()

    codes = {method: dict(counter) for method, counter in sorted(ledger.codes.items())}
    warm = rss_samples[len(rss_samples) // 5] if rss_samples else 0
    summary = {"messages": ledger.sent, "accepted_reports": len(ledger.accepted),
               "campaigns_created": len(ledger.created), "rounds_closed": dict(ledger.closed), "codes": codes,
               "rss_mib_after_warmup": round(warm / 2**20, 1), "rss_mib_max": round(max(rss_samples) / 2**20, 1),
               "rss_mib_end": round(rss_samples[-1] / 2**20, 1), "seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(summary, indent=1))
    assert not ledger.problems, f"{len(ledger.problems)} wrong answers, e.g. {ledger.problems[:5]}"
    assert ledger.sent >= count
    assert sum(ledger.codes.get("DeviceService/SubmitPacked", Counter()).values()) > count // 10
    assert {m.split("/")[1] for m in ledger.codes} >= set(DEVICE_METHODS) | {"GetResult"} | (
        set(OPERATOR_METHODS) - {"OperatorGetResult"})  # every RPC was fuzzed
    assert max(rss_samples) < MAX_RSS, summary
    assert rss_samples[-1] - warm < MAX_RSS_GROWTH, summary

    store = open_store(tmp_path / "data")
    try:
        per_campaign = audit(store, ledger, closed_before)
    finally:
        store.close()
    assert sum(per_campaign.values()) == len(ledger.accepted) > 0


def test_a_reused_request_id_never_acknowledges_unstored_reports(tmp_path: Path) -> None:
    """Regression: the store replayed the first answer of a request id for *other* reports, so a
    second batch under the same id was acknowledged ACCEPTED without being stored, and a retry
    whose batch had changed size (a round closed in between) failed with INTERNAL."""
    server = ServerProcess(tmp_path / "data")
    try:
        with grpc.insecure_channel(server.address) as channel:
            operator = service_pb2_grpc.OperatorServiceStub(channel)
            device = service_pb2_grpc.DeviceServiceStub(channel)
            for cid in ("fz-grr", "fz-close"):
                operator.CreateCampaign(service_pb2.CreateCampaignRequest(config=CAMPAIGNS[cid]), metadata=AUTH)
            specs = {cid: serde.round_spec_from_proto(device.GetRoundSpec(
                service_pb2.GetRoundSpecRequest(campaign_id=cid)).spec) for cid in ("fz-grr", "fz-close")}
            forge = Forge(random.Random(5), specs, specs["fz-close"])

            def submit(request_id: str, reports: list[Report]) -> list[int]:
                answer = device.SubmitPacked(service_pb2.SubmitPackedRequest(packed=pack_batch(request_id, reports)))
                return [o.status for o in answer.outcomes]

            accepted, duplicate, rejected = (service_pb2.ReportOutcome.ACCEPTED, service_pb2.ReportOutcome.DUPLICATE,
                                             service_pb2.ReportOutcome.REJECTED)
            first, second = forge.report("fz-grr"), forge.report("fz-grr")
            assert submit("same-id", [first]) == [accepted]
            assert submit("same-id", [first]) == [accepted]  # a true replay: the first answer
            assert submit("same-id", [second]) == [accepted]  # other reports: really stored
            mixed = [forge.report("fz-grr"), forge.report("fz-close")]
            assert submit("retry", mixed) == [accepted, accepted]
            operator.CloseRound(service_pb2.CloseRoundRequest(campaign_id="fz-close", round=1), metadata=AUTH)
            # Only one report of the retry can still be stored: a new request, whose answer tells the truth.
            assert submit("retry", mixed) == [duplicate, rejected]
            assert submit("retry", [*mixed, second]) == [duplicate, rejected, duplicate]
            count = operator.GetCampaign(service_pb2.GetCampaignRequest(campaign_id="fz-grr"), metadata=AUTH)
            assert count.rounds[0].reports == 3
        assert server.stop() == 0
    finally:
        if server.alive():
            server.proc.kill()
