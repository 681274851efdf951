"""The Collector end to end in-process (no gRPC), with real SDK devices.

Covers campaign creation and validation, ingestion (accepted / duplicate / rejected, replays,
nothing recorded for rejected batches), closing rounds (manual, automatic by report count and by
deadline, minimum reports, compare-and-set), estimates and results, engine failures, crash
recovery and concurrency (no acknowledged report is ever lost).

Statistical tolerance: estimates are checked against the truth with |estimate - truth| <= z SE,
z = max(5, Bonferroni over the values checked) so a test fails falsely with probability < 1e-6.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from statistics import NormalDist
from typing import Any

import pytest

from ldp.v1 import campaigns_pb2, encoders_pb2
from ldp_client.device import Device, DevicePolicy
from ldp_client.errors import ProtocolError
from ldp_client.payload import HashedValue
from ldp_client.report import Report
from ldp_client.rng import SeededRng
from ldp_client.spec import RoundSpec
from ldp_collector.core import Collector
from ldp_collector.errors import (
    AlreadyExistsError,
    CollectorError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from ldp_collector.kinds import KINDS, RoundOutcome, RoundPlan, RoundReports
from ldp_collector.kinds.histogram import HistogramEngine
from ldp_collector.serde import config_from_proto
from ldp_collector.storage import open_store
from ldp_collector.storage.base import (
    AccumulateFn,
    CampaignRecord,
    Outcome,
    ReportStore,
    RoundRecord,
    StoredReport,
)
from ldp_collector.storage.sqlite import SqliteReportStore

ACCEPTED, DUPLICATE, REJECTED = Outcome.ACCEPTED, Outcome.DUPLICATE, Outcome.REJECTED


# --------------------------------------------------------------------------------------------
# An in-memory ReportStore (test double following the contract of storage/base.py)
# --------------------------------------------------------------------------------------------


class MemoryStore(ReportStore):
    """Thread-safe in-memory store; refuses reports to closed rounds (catches locking bugs)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.campaigns: dict[str, CampaignRecord] = {}
        self.rounds: dict[tuple[str, int], RoundRecord] = {}
        self.reports: dict[tuple[str, int], list[StoredReport]] = {}
        self.report_ids: set[bytes] = set()
        self.requests: dict[str, list[Outcome]] = {}
        self.accumulators: dict[tuple[str, int], dict[str, bytes]] = {}
        self.add_calls = 0

    def create_campaign(self, record: CampaignRecord) -> None:
        with self.lock:
            if record.campaign_id in self.campaigns:
                raise AlreadyExistsError(f"campaign {record.campaign_id} already exists")
            self.campaigns[record.campaign_id] = record

    def get_campaign(self, campaign_id: str) -> CampaignRecord:
        with self.lock:
            try:
                return self.campaigns[campaign_id]
            except KeyError:
                raise NotFoundError(f"campaign {campaign_id} does not exist") from None

    def list_campaigns(self, limit: int, after: str = "") -> list[CampaignRecord]:
        with self.lock:
            return [self.campaigns[k] for k in sorted(self.campaigns) if k > after][:limit]

    def update_campaign(self, campaign_id: str, *, state: str | None = None, current_round: int | None = None,
                        engine_state: bytes | None = None, result: bytes | None = None,
                        error: str | None = None) -> None:
        with self.lock:
            old = self.get_campaign(campaign_id)
            changes: dict[str, Any] = {k: v for k, v in dict(
                state=state, current_round=current_round, engine_state=engine_state, result=result,
                error=error).items() if v is not None}
            self.campaigns[campaign_id] = CampaignRecord(**{**old.__dict__, **changes})

    def open_round(self, campaign_id: str, round: int, spec: bytes, opened_at: float) -> None:
        with self.lock:
            assert (campaign_id, round) not in self.rounds, "round opened twice"
            self.rounds[(campaign_id, round)] = RoundRecord(campaign_id=campaign_id, round=round, spec=spec,
                                                            open=True, opened_at=opened_at)
            self.reports[(campaign_id, round)] = []

    def get_round(self, campaign_id: str, round: int) -> RoundRecord:
        with self.lock:
            try:
                rr = self.rounds[(campaign_id, round)]
            except KeyError:
                raise NotFoundError(f"round {round} of campaign {campaign_id} does not exist") from None
            return RoundRecord(**{**rr.__dict__, "report_count": len(self.reports[(campaign_id, round)])})

    def list_rounds(self, campaign_id: str) -> list[RoundRecord]:
        with self.lock:
            return [self.get_round(c, r) for (c, r) in sorted(self.rounds) if c == campaign_id]

    def close_round(self, campaign_id: str, round: int, closed_at: float) -> bool:
        with self.lock:
            rr = self.rounds[(campaign_id, round)]
            if not rr.open:
                return False
            self.rounds[(campaign_id, round)] = RoundRecord(**{**rr.__dict__, "open": False, "closed_at": closed_at})
            return True

    def set_round_estimates(self, campaign_id: str, round: int, estimates: bytes) -> None:
        with self.lock:
            rr = self.rounds[(campaign_id, round)]
            self.rounds[(campaign_id, round)] = RoundRecord(**{**rr.__dict__, "estimates": estimates})

    def add_reports(self, request_id: str, reports: Sequence[StoredReport],
                    accumulate: AccumulateFn | None = None) -> list[Outcome]:
        with self.lock:
            self.add_calls += 1
            if request_id in self.requests:
                return list(self.requests[request_id])
            outcomes: list[Outcome] = []
            new: dict[tuple[str, int], list[StoredReport]] = {}
            seen: set[bytes] = set()
            for r in reports:
                key = (r.campaign_id, r.round)
                assert self.rounds[key].open, f"report stored into closed round {key}"
                if r.report_id in self.report_ids or r.report_id in seen:
                    outcomes.append(DUPLICATE)
                    continue
                seen.add(r.report_id)
                new.setdefault(key, []).append(r)
                outcomes.append(ACCEPTED)
            for key, rows in new.items():
                if accumulate is not None:
                    blobs = self.accumulators.setdefault(key, {})
                    blobs.update(accumulate(rows, dict(blobs)))
                self.reports[key].extend(rows)
            self.report_ids |= seen
            self.requests[request_id] = outcomes
            return list(outcomes)

    def iter_reports(self, campaign_id: str, round: int, batch_size: int = 65536) -> Iterator[list[StoredReport]]:
        with self.lock:
            rows = list(self.reports.get((campaign_id, round), []))
        for i in range(0, len(rows), batch_size):
            yield rows[i:i + batch_size]

    def count_reports(self, campaign_id: str, round: int) -> int:
        with self.lock:
            return len(self.reports.get((campaign_id, round), []))

    def load_accumulators(self, campaign_id: str, round: int) -> dict[str, bytes]:
        with self.lock:
            return dict(self.accumulators.get((campaign_id, round), {}))

    def replace_accumulators(self, campaign_id: str, round: int, blobs: Mapping[str, bytes]) -> None:
        with self.lock:
            self.accumulators[(campaign_id, round)] = dict(blobs)

    def close(self) -> None:
        pass


def _sqlite_store(path: Any) -> ReportStore:
    return open_store(str(path / "ldp-data"))


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[ReportStore]:
    s = MemoryStore() if request.param == "memory" else _sqlite_store(tmp_path)
    yield s
    s.close()


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# --------------------------------------------------------------------------------------------
# Helpers: configs and simulated devices
# --------------------------------------------------------------------------------------------

TRUTH_WEIGHTS = [40, 25, 15, 8, 5, 4, 2, 1]  # skewed over 8 categories


def histogram_config(campaign_id: str = "hist-1", *, size: int = 8, epsilon: float = 2.0,
                     oracle: int = campaigns_pb2.FREQUENCY_ORACLE_UNSPECIFIED, **fields: Any) -> campaigns_pb2.CampaignConfig:
    config = campaigns_pb2.CampaignConfig(
        campaign_id=campaign_id, kind=campaigns_pb2.HISTOGRAM, epsilon=epsilon,
        domain=campaigns_pb2.Domain(categorical_size=size), **fields)
    config.histogram.oracle = oracle  # type: ignore[assignment]
    return config


def true_values(n: int, weights: Sequence[int] = TRUTH_WEIGHTS) -> list[int]:
    total = sum(weights)
    out: list[int] = []
    for v, w in enumerate(weights):
        out += [v] * (n * w // total)
    out += [0] * (n - len(out))
    return out


def simulated_reports(spec: RoundSpec, values: Sequence[Any], seed: int, *, group: int = 0) -> list[Report]:
    """Reports of fresh devices (one per value), randomized with the SDK's own mechanisms."""
    rng = SeededRng(seed)
    task = spec.task_for(group)
    assert task is not None
    return [Report(report_id=rng.token_bytes(16), campaign_id=spec.campaign_id, round=spec.round, group=group,
                   payloads=tuple(c.mechanism.check_payload(c.run(v, rng=rng)) for c in task.components))
            for v in values]


def submit_all(collector: Collector, reports: Sequence[Report | ProtocolError], batch: int = 500,
               prefix: str = "req") -> list[tuple[Outcome, str]]:
    out: list[tuple[Outcome, str]] = []
    for i in range(0, len(reports), batch):
        out += collector.submit(f"{prefix}-{i}", reports[i:i + batch])
    return out


def z_limit(m: int, alpha: float = 1e-6) -> float:
    return max(5.0, NormalDist().inv_cdf(1 - alpha / (2 * m)))


def spec_of(collector: Collector, campaign_id: str) -> RoundSpec:
    spec, finished = collector.get_round_spec(campaign_id)
    assert spec is not None and not finished
    return spec


# --------------------------------------------------------------------------------------------
# End to end
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("oracle", [campaigns_pb2.FREQUENCY_ORACLE_UNSPECIFIED, campaigns_pb2.OUE, campaigns_pb2.OLH])
def test_histogram_end_to_end_with_sdk_devices(store: ReportStore, oracle: int) -> None:
    clock = Clock()
    collector = Collector(store, clock=clock)
    campaign = collector.create_campaign(config_from_proto(histogram_config(oracle=oracle, min_reports_per_round=100)))
    assert campaign.state == campaigns_pb2.COLLECTING
    assert campaign.config.min_reports_per_round == 100
    assert campaign.config.budget_policy == campaigns_pb2.PARTITION
    assert campaign.config.parameters.oracle != campaigns_pb2.FREQUENCY_ORACLE_UNSPECIFIED
    assert campaign.current_round.round == 1 and campaign.current_round.kind == "histogram"
    spec = spec_of(collector, "hist-1")

    n = 6000
    values = true_values(n)
    # 300 real SDK devices (policy, ledger, outbox) and the rest simulated with the same mechanisms.
    real = values[:300]
    device_reports: list[Report] = []
    for i, v in enumerate(real):
        device = Device.in_memory(DevicePolicy(max_epsilon_per_campaign=4.0), rng=SeededRng(10_000 + i))
        report = device.participate(spec, v)
        assert report is not None
        device_reports.append(report)
    reports = device_reports + simulated_reports(spec, values[300:], seed=1)
    outcomes = submit_all(collector, reports)
    assert Counter(o for o, _ in outcomes) == {ACCEPTED: n}

    watched, current_round_reports = collector.campaign_events("hist-1")
    assert current_round_reports == n
    assert watched.rounds[0].open and watched.rounds[0].reports == n

    campaign = collector.close_round("hist-1", 1)
    assert campaign.state == campaigns_pb2.FINISHED, campaign.error
    assert campaign.current_round is None
    assert [(r.round, r.open, r.reports) for r in campaign.rounds] == [(1, False, n)]
    assert collector.get_round_spec("hist-1") == (None, True)

    estimates = collector.get_estimates("hist-1")
    assert estimates.round == 1 and estimates.reports == n and estimates.campaign_id == "hist-1"
    assert [e.value for e in estimates.estimates] == list(range(8))
    truth = Counter(values)
    z = z_limit(8)
    for e in estimates.estimates:
        assert e.std_error > 0
        assert abs(e.count - truth[e.value]) <= z * e.std_error, (e.value, e.count, truth[e.value], e.std_error)
        assert e.ci_lower < e.count < e.ci_upper

    result = collector.get_result("hist-1")
    assert result.state == campaigns_pb2.FINISHED and result.campaign_id == "hist-1"
    assert result.estimates == estimates
    assert result.diagnostics["reports"] == n
    assert result.diagnostics["epsilon"] == pytest.approx(2.0)
    assert result.finished_at is not None


def test_numeric_histogram_and_consistency(store: ReportStore) -> None:
    collector = Collector(store)
    config = campaigns_pb2.CampaignConfig(
        campaign_id="grid-hist", kind=campaigns_pb2.HISTOGRAM, epsilon=3.0,
        domain=campaigns_pb2.Domain(numeric=encoders_pb2.NumericDomain(lower=[0, 0], upper=[10, 10])))
    config.histogram.cells_per_dimension.append(4)
    config.histogram.consistency = True
    campaign = collector.create_campaign(config_from_proto(config))
    assert list(campaign.config.parameters.cells_per_dimension) == [4, 4]
    spec = spec_of(collector, "grid-hist")
    # Points in two cells: (1, 1) -> cell 0 and (9, 6) -> row 3, column 2 -> cell 14.
    points = [(1.0, 1.0)] * 1500 + [(9.0, 6.0)] * 500
    assert submit_all(collector, simulated_reports(spec, points, seed=3))[-1][0] == ACCEPTED
    collector.close_round("grid-hist", 1)
    estimates = collector.get_estimates("grid-hist")
    assert estimates.consistent
    counts = {e.value: e.count for e in estimates.estimates}
    assert len(counts) == 16
    assert all(c >= 0 for c in counts.values())
    assert sum(counts.values()) == pytest.approx(2000)
    assert counts[0] > 1000 and counts[14] > 250


# --------------------------------------------------------------------------------------------
# Idempotency and rejection
# --------------------------------------------------------------------------------------------


def test_duplicates_and_replays_change_nothing(store: ReportStore) -> None:
    collector = Collector(store)
    collector.create_campaign(config_from_proto(histogram_config(oracle=campaigns_pb2.GRR)))
    spec = spec_of(collector, "hist-1")
    reports = simulated_reports(spec, true_values(200), seed=5)
    first = collector.submit("batch-a", reports[:100])
    assert [o for o, _ in first] == [ACCEPTED] * 100
    accumulators = store.load_accumulators("hist-1", 1)

    # The same request again: the first answer, nothing stored twice.
    assert collector.submit("batch-a", reports[:100]) == first
    # The same reports under a new request id: duplicates; new ones in the batch are accepted.
    mixed = collector.submit("batch-b", reports[50:150])
    assert [o for o, _ in mixed] == [DUPLICATE] * 50 + [ACCEPTED] * 50
    # A report twice in one batch: the second copy is a duplicate.
    twice = collector.submit("batch-c", [reports[150], reports[150]])
    assert [o for o, _ in twice] == [ACCEPTED, DUPLICATE]
    assert store.count_reports("hist-1", 1) == 151
    assert collector.submit("batch-d", reports[:151]) == [(DUPLICATE, "")] * 151
    assert store.count_reports("hist-1", 1) == 151
    assert store.load_accumulators("hist-1", 1) != accumulators  # grew with the accepted ones only


def _bad_reports(spec: RoundSpec) -> dict[str, Report | ProtocolError]:
    rng = SeededRng(99)
    good = simulated_reports(spec, [1], seed=7)[0]

    def variant(**changes: Any) -> Report:
        fields: dict[str, Any] = dict(report_id=rng.token_bytes(16), campaign_id=good.campaign_id,
                                      round=good.round, group=good.group, payloads=good.payloads)
        fields.update(changes)
        return Report(**fields)

    return {
        "wrong round": variant(round=2),
        "wrong group": variant(group=3),
        "payload out of range": variant(payloads=(8,)),
        "payload of the wrong type": variant(payloads=(HashedValue(1, 2),)),
        "too many payloads": variant(payloads=(1, 2)),
        "unknown campaign": variant(campaign_id="no-such-campaign"),
        "malformed": ProtocolError("reports[6]: expected [1, report_id, campaign_id, round, group, payloads]"),
    }


def test_rejected_reports_change_nothing(store: ReportStore) -> None:
    collector = Collector(store)
    collector.create_campaign(config_from_proto(histogram_config(oracle=campaigns_pb2.GRR)))
    spec = spec_of(collector, "hist-1")
    bad = _bad_reports(spec)
    outcomes = collector.submit("all-bad", list(bad.values()))
    assert [o for o, _ in outcomes] == [REJECTED] * len(bad)
    reasons = dict(zip(bad, (r for _, r in outcomes)))
    assert reasons["wrong round"] == "round 2 is not open (the open round is 1)"
    assert "group 3" in reasons["wrong group"]
    assert "payload 0" in reasons["payload out of range"] and "[0, 8)" in reasons["payload out of range"]
    assert "grr" in reasons["payload of the wrong type"]
    assert "1 payload(s)" in reasons["too many payloads"]
    assert reasons["unknown campaign"] == "campaign no-such-campaign does not exist"
    assert reasons["malformed"].startswith("reports[6]")
    assert store.count_reports("hist-1", 1) == 0
    assert store.load_accumulators("hist-1", 1) == {}
    # The all-rejected batch recorded nothing, not even its request id.
    good = simulated_reports(spec, [0, 1], seed=8)
    assert [o for o, _ in collector.submit("all-bad", good)] == [ACCEPTED, ACCEPTED]

    # Mixed batch: outcomes come back in request order.
    more = simulated_reports(spec, [2, 3], seed=9)
    mixed = collector.submit("mixed", [more[0], bad["wrong round"], more[1], bad["malformed"]])
    assert [o for o, _ in mixed] == [ACCEPTED, REJECTED, ACCEPTED, REJECTED]
    assert [r for _, r in mixed][0] == "" and store.count_reports("hist-1", 1) == 4


def test_implausible_unary_report_is_rejected(store: ReportStore) -> None:
    collector = Collector(store)
    collector.create_campaign(config_from_proto(histogram_config(size=1024, oracle=campaigns_pb2.OUE)))
    spec = spec_of(collector, "hist-1")
    honest = simulated_reports(spec, [5] * 50, seed=11)
    all_ones = Report(report_id=b"\x01" * 16, campaign_id="hist-1", round=1, group=0, payloads=(b"\xff" * 128,))
    all_zeros = Report(report_id=b"\x02" * 16, campaign_id="hist-1", round=1, group=0, payloads=(b"\x00" * 128,))
    outcomes = collector.submit("ue", [*honest, all_ones, all_zeros])
    assert [o for o, _ in outcomes] == [ACCEPTED] * 50 + [REJECTED, REJECTED]
    assert "1024 bits set" in outcomes[50][1] and "0 bits set" in outcomes[51][1]


def test_reports_for_finished_campaign_are_rejected(store: ReportStore) -> None:
    collector = Collector(store)
    collector.create_campaign(config_from_proto(histogram_config(oracle=campaigns_pb2.GRR)))
    spec = spec_of(collector, "hist-1")
    reports = simulated_reports(spec, true_values(20), seed=12)
    collector.submit("r1", reports[:10])
    collector.close_round("hist-1", 1)
    outcomes = collector.submit("r2", reports[10:])
    assert outcomes == [(REJECTED, "campaign hist-1 is finished")] * 10
    assert store.count_reports("hist-1", 1) == 10


def test_bad_request_id_and_oversized_batch() -> None:
    collector = Collector(MemoryStore())
    with pytest.raises(InvalidArgumentError, match="request_id"):
        collector.submit("", [])
    with pytest.raises(InvalidArgumentError, match="request_id"):
        collector.submit("x" * 129, [])
    assert collector.submit("empty", []) == []


# --------------------------------------------------------------------------------------------
# Campaign creation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mutate,message", [
    (lambda c: setattr(c, "kind", campaigns_pb2.STEMMER), "a stemmer campaign takes stemmer parameters, got histogram"),
    (lambda c: setattr(c, "kind", campaigns_pb2.CAMPAIGN_KIND_UNSPECIFIED), "kind is required"),
    (lambda c: setattr(c, "kind", 99), "not a known campaign kind"),
    (lambda c: setattr(c, "epsilon", 0.0), r"epsilon must be in \(0, 100\]"),
    (lambda c: setattr(c, "epsilon", 101.0), r"epsilon must be in \(0, 100\]"),
    (lambda c: setattr(c, "epsilon", float("nan")), "epsilon"),
    (lambda c: setattr(c, "epsilon", 25.0), r"\(0, 20\]"),
    (lambda c: c.ClearField("domain"), "domain is required"),
    (lambda c: setattr(c.domain, "categorical_size", 1), "categorical_size"),
    (lambda c: setattr(c.domain, "categorical_size", 2**25), "at most"),
    (lambda c: setattr(c, "campaign_id", "bad id!"), "campaign_id"),
    (lambda c: c.heavy_hitters.SetInParent(), "takes histogram parameters"),
    (lambda c: setattr(c.histogram, "oracle", 42), "not a known frequency oracle"),
    (lambda c: setattr(c.histogram, "max_payload_bits", 2), "max_payload_bits"),
    (lambda c: c.histogram.cells_per_dimension.append(3), "numeric domains only"),
    (lambda c: c.MergeFrom(campaigns_pb2.CampaignConfig(min_reports_per_round=10, close_after_reports=5)),
     "close_after_reports"),
    (lambda c: setattr(c.round_duration, "seconds", -1), "round_duration"),
    (lambda c: setattr(c, "budget_policy", 7), "budget_policy"),
])
def test_create_campaign_validation(mutate: Any, message: str) -> None:
    store = MemoryStore()
    collector = Collector(store)
    config = histogram_config()
    mutate(config)
    with pytest.raises(InvalidArgumentError, match=message):
        collector.create_campaign(config_from_proto(config))
    assert store.campaigns == {}


def test_create_campaign_defaults_and_ids() -> None:
    store = MemoryStore()
    collector = Collector(store)
    config = histogram_config(campaign_id="")
    original = config.SerializeToString()
    first = collector.create_campaign(config_from_proto(config))
    second = collector.create_campaign(config_from_proto(config))
    assert config.SerializeToString() == original  # the input is not modified
    ids = {first.config.campaign_id, second.config.campaign_id}
    assert len(ids) == 2 and all(i.startswith("c-") and len(i) == 24 for i in ids)
    assert first.config.min_reports_per_round == 1
    with pytest.raises(AlreadyExistsError):
        collector.create_campaign(config_from_proto(histogram_config(campaign_id=first.config.campaign_id)))
    assert collector.get_campaign(first.config.campaign_id).created_at > 0


def test_list_campaigns_pages() -> None:
    collector = Collector(MemoryStore())
    for i in range(7):
        collector.create_campaign(config_from_proto(histogram_config(campaign_id=f"c{i}")))
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page, token = collector.list_campaigns(3, token)
        seen += [c.config.campaign_id for c in page]
        pages += 1
        if not token:
            break
    assert seen == [f"c{i}" for i in range(7)] and pages == 3
    assert len(collector.list_campaigns()[0]) == 7
    with pytest.raises(InvalidArgumentError, match="page_token"):
        collector.list_campaigns(3, "%%%")


def test_unknown_campaign_is_not_found() -> None:
    collector = Collector(MemoryStore())
    for call in (lambda: collector.get_campaign("nope"), lambda: collector.get_round_spec("nope"),
                 lambda: collector.get_result("nope"), lambda: collector.close_round("nope", 1),
                 lambda: collector.get_estimates("nope"), lambda: collector.campaign_events("nope")):
        with pytest.raises(NotFoundError):
            call()


# --------------------------------------------------------------------------------------------
# Closing rounds
# --------------------------------------------------------------------------------------------


def test_close_round_preconditions(store: ReportStore) -> None:
    collector = Collector(store)
    collector.create_campaign(config_from_proto(histogram_config(oracle=campaigns_pb2.GRR, min_reports_per_round=10)))
    spec = spec_of(collector, "hist-1")
    with pytest.raises(FailedPreconditionError, match="round 2 is not open; the open round of campaign hist-1 is 1"):
        collector.close_round("hist-1", 2)
    collector.submit("r", simulated_reports(spec, [1] * 9, seed=1))
    with pytest.raises(FailedPreconditionError, match="holds 9 reports; min_reports_per_round is 10"):
        collector.close_round("hist-1", 1)
    with pytest.raises(FailedPreconditionError, match="still open"):
        collector.get_estimates("hist-1", 1)
    with pytest.raises(FailedPreconditionError, match="no closed round with estimates"):
        collector.get_estimates("hist-1")
    assert collector.get_result("hist-1").state == campaigns_pb2.COLLECTING
    collector.submit("r2", simulated_reports(spec, [2], seed=2))
    assert collector.close_round("hist-1", 1).state == campaigns_pb2.FINISHED
    with pytest.raises(FailedPreconditionError, match="finished"):
        collector.close_round("hist-1", 1)
    with pytest.raises(NotFoundError):
        collector.get_estimates("hist-1", 5)
    for confidence in (1.5, 1.0, 0.9999999999999999, -0.5, float("nan")):
        with pytest.raises(InvalidArgumentError, match=r"confidence must be in \(0, 1\), at most 1 - 2\^-52, got "):
            collector.get_estimates("hist-1", 1, confidence=confidence)
    assert collector.get_estimates("hist-1", 1, confidence=1 - 2**-52).confidence == 1 - 2**-52


def test_get_estimates_other_confidence(store: ReportStore) -> None:
    collector = Collector(store)
    collector.create_campaign(config_from_proto(histogram_config(oracle=campaigns_pb2.GRR)))
    spec = spec_of(collector, "hist-1")
    collector.submit("r", simulated_reports(spec, true_values(500), seed=4))
    collector.close_round("hist-1", 1)
    at95 = collector.get_estimates("hist-1", 1)
    at99 = collector.get_estimates("hist-1", 0, confidence=0.99)
    assert at95.confidence == pytest.approx(0.95) and at99.confidence == pytest.approx(0.99)
    z99 = NormalDist().inv_cdf(0.995)
    for a, b in zip(at95.estimates, at99.estimates):
        assert b.count == a.count and b.std_error == a.std_error
        assert b.ci_upper - b.count == pytest.approx(z99 * a.std_error)
        assert b.ci_lower < a.ci_lower


def test_auto_close_after_reports(store: ReportStore) -> None:
    collector = Collector(store)
    collector.create_campaign(config_from_proto(histogram_config(oracle=campaigns_pb2.GRR, close_after_reports=100)))
    spec = spec_of(collector, "hist-1")
    reports = simulated_reports(spec, true_values(150), seed=6)
    collector.submit("a", reports[:99])
    assert collector.get_campaign("hist-1").state == campaigns_pb2.COLLECTING
    outcomes = collector.submit("b", reports[99:120])
    assert all(o == ACCEPTED for o, _ in outcomes)  # acknowledged, then the round closed
    assert collector.get_campaign("hist-1").state == campaigns_pb2.FINISHED
    assert collector.get_estimates("hist-1").reports == 120
    late = collector.submit("c", reports[120:])
    assert all(o == REJECTED for o, _ in late)


def test_tick_closes_rounds_after_their_duration(store: ReportStore) -> None:
    clock = Clock()
    collector = Collector(store, clock=clock)
    config = histogram_config(oracle=campaigns_pb2.GRR, min_reports_per_round=5)
    config.round_duration.seconds = 3600
    collector.create_campaign(config_from_proto(config))
    collector.create_campaign(config_from_proto(histogram_config("other", oracle=campaigns_pb2.GRR)))  # no deadline: never auto-closed
    spec = spec_of(collector, "hist-1")
    assert spec.deadline == pytest.approx(clock.now + 3600)
    collector.submit("r", simulated_reports(spec, [1, 2, 3], seed=1))
    assert collector.tick() == 0
    clock.now += 3601
    assert collector.tick() == 0  # due, but below min_reports_per_round: stays open
    assert collector.get_campaign("hist-1").state == campaigns_pb2.COLLECTING
    collector.submit("r2", simulated_reports(spec, [4, 5], seed=2))
    assert collector.tick() == 1
    assert collector.get_campaign("hist-1").state == campaigns_pb2.FINISHED
    assert collector.get_campaign("other").state == campaigns_pb2.COLLECTING
    assert collector.tick() == 0


class _ExplodingEngine(HistogramEngine):
    def close_round(self, spec: RoundSpec, reports: RoundReports, engine_state: bytes) -> RoundOutcome:
        raise ArithmeticError("boom")


def test_engine_failure_marks_campaign_failed_and_keeps_reports(store: ReportStore,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KINDS, "histogram", replace(KINDS["histogram"], engine=_ExplodingEngine))
    collector = Collector(store)
    collector.create_campaign(config_from_proto(histogram_config(oracle=campaigns_pb2.GRR)))
    spec = spec_of(collector, "hist-1")
    collector.submit("r", simulated_reports(spec, [1, 2, 3], seed=1))
    campaign = collector.close_round("hist-1", 1)
    assert campaign.state == campaigns_pb2.FAILED
    assert campaign.error == "round 1: ArithmeticError: boom"
    assert store.count_reports("hist-1", 1) == 3
    result = collector.get_result("hist-1")
    assert result.state == campaigns_pb2.FAILED and list(result.warnings) == [campaign.error]
    assert collector.get_round_spec("hist-1") == (None, True)
    assert [o for o, _ in collector.submit("late", simulated_reports(spec, [1], seed=2))] == [REJECTED]
    with pytest.raises(FailedPreconditionError, match=r"has no closed round with estimates \(it failed: round 1: "
                                                      r"ArithmeticError: boom\)"):
        collector.get_estimates("hist-1")


class _TwoRoundEngine(HistogramEngine):
    """Round 1 estimates and asks for round 2 (same task, new engine state); round 2 finishes."""

    def close_round(self, spec: RoundSpec, reports: RoundReports, engine_state: bytes) -> RoundOutcome:
        outcome = super().close_round(spec, reports, engine_state)
        if spec.round == 1:
            assert engine_state == b""
            return RoundOutcome(estimates=outcome.estimates, next_round=RoundPlan(
                spec=RoundSpec(**{**spec.__dict__, "round": 2}), engine_state=b"after-1"))
        assert engine_state == b"after-1"
        return outcome


def test_multi_round_campaign(store: ReportStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KINDS, "histogram", replace(KINDS["histogram"], engine=_TwoRoundEngine))
    clock = Clock()
    collector = Collector(store, clock=clock)
    config = histogram_config(oracle=campaigns_pb2.GRR)
    config.round_duration.seconds = 60
    collector.create_campaign(config_from_proto(config))
    spec1 = spec_of(collector, "hist-1")
    collector.submit("r1", simulated_reports(spec1, true_values(100), seed=1))
    clock.now += 10
    campaign = collector.close_round("hist-1", 1)
    assert campaign.state == campaigns_pb2.COLLECTING and campaign.current_round.round == 2
    assert [(r.round, r.open) for r in campaign.rounds] == [(1, False), (2, True)]
    spec2 = spec_of(collector, "hist-1")
    assert spec2.round == 2 and spec2.deadline == pytest.approx(clock.now + 60)
    assert collector.get_estimates("hist-1").round == 1
    late = collector.submit("late", simulated_reports(spec1, [1], seed=2))
    assert late[0] == (REJECTED, "round 1 is not open (the open round is 2)")
    collector.submit("r2", simulated_reports(spec2, true_values(50), seed=3))
    clock.now += 61
    assert collector.tick() == 1
    assert collector.get_campaign("hist-1").state == campaigns_pb2.FINISHED
    assert collector.get_estimates("hist-1").round == 2 and collector.get_estimates("hist-1").reports == 50
    assert collector.get_estimates("hist-1", 1).reports == 100
    assert collector.get_result("hist-1").estimates.round == 2


class _ReweightingEngine(HistogramEngine):
    """Round 1 plans round 2 with the group weights of ``WEIGHTS`` (as a release that changed a constant
    while the campaign was in flight would); round 2 finishes."""

    WEIGHTS: tuple[int, ...] = (7,)

    def close_round(self, spec: RoundSpec, reports: RoundReports, engine_state: bytes) -> RoundOutcome:
        outcome = super().close_round(spec, reports, engine_state)
        if spec.round == 1:
            return RoundOutcome(estimates=outcome.estimates, next_round=RoundPlan(
                spec=RoundSpec(**{**spec.__dict__, "round": 2, "group_weights": self.WEIGHTS})))
        return outcome


def test_later_rounds_keep_the_campaigns_group_weights(store: ReportStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KINDS, "histogram", replace(KINDS["histogram"], engine=_ReweightingEngine))
    collector = Collector(store)
    collector.create_campaign(config_from_proto(histogram_config(oracle=campaigns_pb2.GRR)))
    spec1 = spec_of(collector, "hist-1")
    collector.submit("r1", simulated_reports(spec1, true_values(20), seed=1))
    assert collector.close_round("hist-1", 1).current_round.round == 2
    assert spec1.group_weights == (1,) and spec_of(collector, "hist-1").group_weights == (1,)


def test_an_engine_that_changes_the_number_of_groups_fails_the_campaign(store: ReportStore,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    engine = type("_Regrouping", (_ReweightingEngine,), {"WEIGHTS": (1, 1)})
    monkeypatch.setitem(KINDS, "histogram", replace(KINDS["histogram"], engine=engine))
    collector = Collector(store)
    collector.create_campaign(config_from_proto(histogram_config(oracle=campaigns_pb2.GRR)))
    collector.submit("r1", simulated_reports(spec_of(collector, "hist-1"), true_values(20), seed=1))
    campaign = collector.close_round("hist-1", 1)
    assert campaign.state == campaigns_pb2.FAILED
    assert campaign.error == ("round 1: RuntimeError: engine planned round 2 with 2 groups, but the campaign has 1: "
                              "group weights never change within a campaign")
    assert store.count_reports("hist-1", 1) == 20


def windowed_campaign(collector: Collector, clock: Clock, store: ReportStore, windows: int = 3) -> RoundSpec:
    """A histogram with ``windows`` rounds; round 1 holds 50 reports and was closed by "another
    process" that died in the server step (it won the close, then no process holds the step lock)."""
    config = histogram_config(oracle=campaigns_pb2.GRR)
    config.histogram.windows = windows
    collector.create_campaign(config_from_proto(config))
    spec = spec_of(collector, "hist-1")
    collector.submit("r", simulated_reports(spec, true_values(50), seed=1))
    assert store.close_round("hist-1", 1, clock.now)
    return spec


def test_between_rounds_the_spec_answer_says_ask_again(store: ReportStore) -> None:
    clock = Clock()
    collector = Collector(store, clock=clock)
    spec = windowed_campaign(collector, clock, store)
    with pytest.raises(CollectorError) as between:
        collector.get_round_spec("hist-1")
    # UNAVAILABLE with a RetryInfo delay, not an empty answer the SDK cannot tell from a bug.
    assert between.value.code == "UNAVAILABLE" and getattr(between.value, "retry_after", 0) > 0
    assert "no open round yet" in str(between.value)
    # A report now is for the round that closed, whatever the step does: a final, clear answer.
    late = collector.submit("late", simulated_reports(spec, [1], seed=2))
    assert late == [(REJECTED, "round 1 of campaign hist-1 closed before the report arrived "
                               "(the next round is being prepared)")]


def test_tick_resumes_an_interrupted_step_at_once(store: ReportStore) -> None:
    clock = Clock()
    collector = Collector(store, clock=clock)
    windowed_campaign(collector, clock, store)
    # No live process holds the step lock, so the step was interrupted: no grace period, no clock
    # advance -- the next tick (a restarted collector's first) resumes it.
    assert collector.tick() == 0
    assert spec_of(collector, "hist-1").round == 2
    assert collector.get_estimates("hist-1", 1).reports == 50


def test_operator_close_resumes_an_interrupted_step(store: ReportStore) -> None:
    clock = Clock()
    collector = Collector(store, clock=clock)
    windowed_campaign(collector, clock, store)
    campaign = collector.close_round("hist-1", 1)  # resumed, not "OK" over a campaign stuck between rounds
    assert campaign.state == campaigns_pb2.COLLECTING and campaign.current_round.round == 2
    assert [(r.round, r.open) for r in campaign.rounds] == [(1, False), (2, True)]
    assert collector.get_estimates("hist-1", 1).reports == 50
    with pytest.raises(FailedPreconditionError, match="round 1 is not open"):
        collector.close_round("hist-1", 1)


def test_interrupted_creation_is_repaired_by_tick() -> None:
    store = MemoryStore()
    clock = Clock()
    collector = Collector(store, clock=clock)
    collector.create_campaign(config_from_proto(histogram_config(oracle=campaigns_pb2.GRR)))
    # Simulate a crash between create_campaign and open_round.
    del store.rounds[("hist-1", 1)]
    with pytest.raises(CollectorError) as between:
        Collector(store, clock=clock).get_round_spec("hist-1")
    assert between.value.code == "UNAVAILABLE"
    fresh = Collector(store, clock=clock)  # a restarted collector, at once
    fresh.tick()
    spec, finished = fresh.get_round_spec("hist-1")
    assert spec is not None and spec.round == 1 and not finished


def test_create_campaign_holds_the_cross_process_step_lock(tmp_path: Any) -> None:
    """Another process's tick must never see a campaign between its creation and its first round as
    an interrupted creation (it would open a first round of its own)."""
    other = _sqlite_store(tmp_path)  # the storage as another collector process sees it
    held_while_opening: list[bool] = []

    class Watching(SqliteReportStore):
        def open_round(self, campaign_id: str, round: int, spec: bytes, opened_at: float) -> None:
            with other.step_lock(campaign_id) as free:
                held_while_opening.append(not free)
            super().open_round(campaign_id, round, spec, opened_at)

    store = Watching(tmp_path / "ldp-data")
    try:
        Collector(store).create_campaign(config_from_proto(histogram_config(oracle=campaigns_pb2.GRR)))
        assert held_while_opening == [True]
        with other.step_lock("hist-1") as free:
            assert free  # released once the first round is open
    finally:
        store.close()
        other.close()


# --------------------------------------------------------------------------------------------
# Concurrency
# --------------------------------------------------------------------------------------------


def test_concurrent_submits_and_close_lose_no_acknowledged_report(store: ReportStore) -> None:
    collector = Collector(store)
    collector.create_campaign(config_from_proto(histogram_config(oracle=campaigns_pb2.GRR)))
    spec = spec_of(collector, "hist-1")
    per_thread = [simulated_reports(spec, true_values(400), seed=100 + t) for t in range(4)]
    accepted = Counter[int]()
    start = threading.Barrier(5)

    def worker(t: int) -> None:
        start.wait()
        for i in range(0, 400, 20):
            for outcome, _ in collector.submit(f"t{t}-{i}", per_thread[t][i:i + 20]):
                accepted[outcome] += 1

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    start.wait()
    while store.count_reports("hist-1", 1) < 200:
        threading.Event().wait(0.001)
    collector.close_round("hist-1", 1)
    for th in threads:
        th.join()
    estimates = collector.get_estimates("hist-1")
    # Every acknowledged report is in the estimate; every other one was rejected.
    assert estimates.reports == accepted[ACCEPTED] == store.count_reports("hist-1", 1)
    assert accepted[ACCEPTED] + accepted[REJECTED] == 1600 and accepted[DUPLICATE] == 0


# --------------------------------------------------------------------------------------------
# Heavy hitters through the collector
# --------------------------------------------------------------------------------------------


def test_heavy_hitters_end_to_end(store: ReportStore) -> None:
    collector = Collector(store)
    config = campaigns_pb2.CampaignConfig(
        campaign_id="hh-1", kind=campaigns_pb2.HEAVY_HITTERS, epsilon=4.0,
        domain=campaigns_pb2.Domain(categorical_size=2**12))
    campaign = collector.create_campaign(config_from_proto(config))
    params = campaign.config.parameters
    assert (params.value_bits, params.bits_per_level, params.max_candidates) == (12, 4, 64)
    assert params.false_positive_rate == pytest.approx(0.05)
    spec = spec_of(collector, "hh-1")
    assert len(spec.group_weights) == 3 and len(spec.tasks) == 3
    heavy = {3001: 0.4, 77: 0.25}
    n = 12000
    rng = SeededRng(21)
    values = [3001] * int(n * 0.4) + [77] * int(n * 0.25)
    values += [rng.randbelow(2**12) for _ in range(n - len(values))]
    reports: list[Report] = []
    for group in range(3):  # equal groups, as the devices' own draws would give on average
        reports += simulated_reports(spec, [(v,) for v in values[group::3]], seed=30 + group, group=group)
    # Real SDK devices take part too, with the point (v,); they pick their own group.
    for i in range(30):
        report = Device.in_memory(rng=SeededRng(500 + i)).participate(spec, (3001,))
        assert report is not None
        reports.append(report)
        values.append(3001)
    assert all(o == ACCEPTED for o, _ in submit_all(collector, reports, batch=2000))
    campaign = collector.close_round("hh-1", 1)
    assert campaign.state == campaigns_pb2.FINISHED, campaign.error
    result = collector.get_result("hh-1")
    found = {h.value: h for h in result.heavy_hitters}
    assert set(heavy) <= set(found)
    for value in heavy:
        truth = values.count(value)
        assert abs(found[value].count - truth) <= 5 * found[value].std_error, (value, found[value], truth)
    assert result.diagnostics["levels"] == 3 and result.diagnostics["reports"] == n + 30
    assert [e.value for e in result.estimates.estimates] == [h.value for h in result.heavy_hitters]
