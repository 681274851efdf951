"""Poisoning defences: device tokens, enrolment limits, assigned report ids and seeds, plausibility
bounds, window-over-window anomaly flags, and enrolment through a real gRPC server.

Statistical tolerances: estimates are checked at |estimate - truth| <= z SE with z = max(5,
Bonferroni over the values at 1e-6), so a test fails falsely with probability below 1e-6. The
anomaly-flag null test counts false alarms over many simulated window pairs and allows the binomial
count of false alarms up to its 1 - 1e-6 quantile.
"""

from __future__ import annotations

import base64
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from statistics import NormalDist
from typing import Any

import grpc
import numpy as np
import pytest
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from ldp.v1 import campaigns_pb2, service_pb2, service_pb2_grpc
from ldp_client.device import Device, DevicePolicy, RoundAssignment
from ldp_client.grpc import CollectorClient, Sender
from ldp_client.mechanisms import oue, sue
from ldp_client.payload import HashedValue
from ldp_client.report import Report
from ldp_client.rng import SeededRng
from ldp_client.spec import MAX_COMPONENTS, RoundSpec
from ldp_collector.config import CollectorConfig, ConfigError
from ldp_collector.core import Collector
from ldp_collector.defences import (
    DEVICE_ID_BYTES,
    TOKEN_PREFIX,
    EnrolmentAuthority,
    EnrolmentLimiter,
    anomaly_flags,
    anomaly_threshold,
    check_assignment,
    honest_weight_distribution,
    peer_address,
    weight_excess,
)
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.ingest import PLAUSIBILITY_DELTA, hamming_weight_limits
from ldp_collector.serde import config_from_proto
from ldp_collector.server.lifecycle import start_server
from ldp_collector.storage import open_store
from ldp_collector.storage.base import Outcome

SECRET = "enrolment-secret-for-tests-0123456789"
OPERATOR = "operator-token-for-tests-0123456789"
AUTH = (("authorization", f"Bearer {OPERATOR}"),)


def z_limit(m: int, alpha: float = 1e-6) -> float:
    return max(5.0, NormalDist().inv_cdf(1 - alpha / (2 * m)))


# -- tokens -------------------------------------------------------------------------------------

def test_token_round_trip() -> None:
    authority = EnrolmentAuthority(SECRET)
    token = authority.issue()
    assert token.startswith(TOKEN_PREFIX) and token.isascii() and " " not in token
    identity = authority.verify(token)
    assert identity is not None and len(identity.device_id) == DEVICE_ID_BYTES
    # Stateless: another process with the same secret verifies it and sees the same identity.
    assert EnrolmentAuthority(SECRET.encode()).verify(token) == identity
    # Fresh identities.
    assert len({authority.verify(authority.issue()) for _ in range(100)}) == 100


def _flip(token: str, index: int) -> str:
    raw = bytearray(base64.urlsafe_b64decode(token[len(TOKEN_PREFIX):] + "=="))
    raw[index] ^= 0x01
    return TOKEN_PREFIX + base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


def test_forged_and_truncated_tokens_are_refused() -> None:
    authority = EnrolmentAuthority(SECRET)
    token = authority.issue(bytes(range(16)))
    assert authority.verify(token) is not None
    assert authority.verify(_flip(token, 0)) is None  # another device id, same MAC
    assert authority.verify(_flip(token, 20)) is None  # tampered MAC
    assert authority.verify(_flip(token, 47)) is None  # last MAC byte
    assert authority.verify(token[:-1]) is None  # truncated
    assert authority.verify(token[:-4]) is None
    assert authority.verify(token + "A") is None
    assert authority.verify("ldp2." + token[len(TOKEN_PREFIX):]) is None
    assert authority.verify("") is None
    assert authority.verify(TOKEN_PREFIX + "!" * (len(token) - len(TOKEN_PREFIX))) is None
    assert authority.verify(None) is None  # type: ignore[arg-type]
    # A token of another secret: right shape, wrong MAC.
    assert EnrolmentAuthority("another-secret-0123456789abcdef").verify(token) is None
    # A forger who knows the device id format but not the secret: a MAC of zeros.
    forged = TOKEN_PREFIX + base64.urlsafe_b64encode(bytes(16) + bytes(32)).decode().rstrip("=")
    assert authority.verify(forged) is None


@settings(max_examples=300, deadline=None)
@given(device_id=st.binary(min_size=16, max_size=16), junk=st.text(max_size=80), raw=st.binary(max_size=60))
def test_only_issued_tokens_verify(device_id: bytes, junk: str, raw: bytes) -> None:
    authority = EnrolmentAuthority(SECRET)
    identity = authority.verify(authority.issue(device_id))
    assert identity is not None and identity.device_id == device_id
    assert authority.verify(junk) is None
    assert authority.verify(TOKEN_PREFIX + junk) is None
    assert authority.verify(TOKEN_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")) is None


def test_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        EnrolmentAuthority("short")
    with pytest.raises(ConfigError, match="enrolment_secret"):
        CollectorConfig(enrolment=True)
    with pytest.raises(ConfigError, match="enrolment_secret"):
        CollectorConfig(enrolment=True, enrolment_secret="too-short")
    assert CollectorConfig(enrolment=True, enrolment_secret=SECRET).enrolment


# -- assignments --------------------------------------------------------------------------------

def test_assignment_is_deterministic_and_distinct() -> None:
    authority = EnrolmentAuthority(SECRET)
    a, b = bytes(16), bytes([1]) + bytes(15)
    first = authority.assignment(a, "c", 1)
    assert first == authority.assignment(a, "c", 1) == EnrolmentAuthority(SECRET).assignment(a, "c", 1)
    assert len(first.report_id) == 16 and len(first.hash_seeds) == MAX_COMPONENTS
    assert all(0 <= s < 2**32 for s in first.hash_seeds)
    others = [authority.assignment(b, "c", 1), authority.assignment(a, "c", 2), authority.assignment(a, "d", 1),
              EnrolmentAuthority(SECRET + "x").assignment(a, "c", 1)]
    for other in others:
        assert other.report_id != first.report_id
        assert other.hash_seeds != first.hash_seeds
    # Length-prefixed campaign ids: ("ab", round) and ("a", ...) cannot collide by concatenation.
    assert authority.assignment(a, "ab", 1) != authority.assignment(a, "a", int.from_bytes(b"b\x00\x00\x00", "big"))


def test_assigned_seeds_look_uniform() -> None:
    """Seeds over 4000 devices: chi-square on the top 4 bits (16 cells), P(false fail) < 1e-6."""
    authority = EnrolmentAuthority(SECRET)
    rng = SeededRng(5)
    top = [authority.assignment(rng.token_bytes(16), "c", 1).hash_seeds[0] >> 28 for _ in range(4000)]
    counts = np.bincount(top, minlength=16)
    chi2 = float(((counts - 250.0) ** 2 / 250.0).sum())
    assert chi2 < stats.chi2.ppf(1 - 1e-6, df=15)


def _olh_collector(tmp_path: Path) -> tuple[Collector, RoundSpec]:
    collector = Collector(open_store(tmp_path / "data"))
    collector.create_campaign(config_from_proto(campaigns_pb2.CampaignConfig(
        campaign_id="olh", kind=campaigns_pb2.HISTOGRAM, epsilon=2.0,
        domain=campaigns_pb2.Domain(categorical_size=16),
        histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.OLH))))
    spec, _ = collector.get_round_spec("olh")
    assert spec is not None
    return collector, spec


def test_wrong_id_or_seed_from_an_enrolled_device_is_rejected(tmp_path: Path) -> None:
    collector, spec = _olh_collector(tmp_path)
    authority = EnrolmentAuthority(SECRET)
    device_id = bytes(range(16))
    assigned = authority.assignment(device_id, spec.campaign_id, spec.round)

    def assign(campaign_id: str, round: int) -> RoundAssignment:
        return authority.assignment(device_id, campaign_id, round)

    device = Device.in_memory(rng=SeededRng(1))
    honest = device.participate(spec, 3, assignment=assigned)
    assert honest is not None and honest.report_id == assigned.report_id
    payload = honest.payloads[0]
    assert isinstance(payload, HashedValue) and payload.seed == assigned.hash_seeds[0]

    wrong_id = Report(report_id=bytes(16), campaign_id="olh", round=spec.round, group=0, payloads=honest.payloads)
    chosen_seed = Report(report_id=assigned.report_id, campaign_id="olh", round=spec.round, group=0,
                         payloads=(HashedValue((payload.seed + 1) % 2**32, payload.value),))
    outcomes = collector.submit("r1", [wrong_id, chosen_seed], assign=assign)
    assert [o for o, _ in outcomes] == [Outcome.REJECTED, Outcome.REJECTED]
    assert "report_id is not the one assigned" in outcomes[0][1]
    assert "hash seed" in outcomes[1][1] and "not the seed assigned" in outcomes[1][1]
    assert collector.store.count_reports("olh", spec.round) == 0  # nothing stored

    # The honest report lands once; a second report of the round (any payload) is a duplicate.
    assert collector.submit("r2", [honest], assign=assign) == [(Outcome.ACCEPTED, "")]
    other = Report(report_id=assigned.report_id, campaign_id="olh", round=spec.round, group=0,
                   payloads=(HashedValue(payload.seed, (payload.value + 1) % 3),))
    assert collector.submit("r3", [other], assign=assign)[0][0] == Outcome.DUPLICATE
    assert collector.store.count_reports("olh", spec.round) == 1
    stored = [r for batch in collector.store.iter_reports("olh", spec.round, 10) for r in batch]
    assert [r.report_id for r in stored] == [honest.report_id]
    # The same report without an enrolled identity is checked as before (and is a duplicate).
    assert collector.submit("r4", [honest])[0][0] == Outcome.DUPLICATE


def test_check_assignment_ignores_unseeded_mechanisms() -> None:
    from ldp_client.encoders.categorical import CategoricalEncoder
    from ldp_client.mechanisms import GRRParams
    from ldp_client.spec import Component, GroupTask

    component = Component(encoder=CategoricalEncoder(domain_size=4), mechanism=GRRParams(domain_size=4, epsilon=1.0))
    spec = RoundSpec(campaign_id="g", round=1, group_weights=(1,),
                     tasks=(GroupTask(groups=(0,), components=(component,)),), campaign_epsilon=1.0)
    assignment = RoundAssignment(report_id=bytes(16), hash_seeds=(7,))
    check_assignment(Report(report_id=bytes(16), campaign_id="g", round=1, group=0, payloads=(2,)), spec, assignment)
    with pytest.raises(Exception, match="report_id"):
        check_assignment(Report(report_id=bytes(15) + b"\x01", campaign_id="g", round=1, group=0, payloads=(2,)),
                         spec, assignment)


# -- enrolment limits ---------------------------------------------------------------------------

class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_enrolment_limiter_per_peer_and_global() -> None:
    clock = FakeClock()
    limiter = EnrolmentLimiter(rate=10.0, burst=5, peer_rate=0.5, peer_burst=2, max_peers=3, clock=clock)
    assert limiter.admit("a") is None and limiter.admit("a") is None
    wait = limiter.admit("a")
    assert wait == pytest.approx(2.0)  # one token at 0.5/s
    assert limiter.admit("b") is None and limiter.admit("b") is None
    assert limiter.admit("c") is None
    wait = limiter.admit("d")  # the global bucket (5) is empty now
    assert wait == pytest.approx(0.1)
    clock.now += 0.1
    assert limiter.admit("d") is None
    assert len(limiter) <= 3  # bounded table
    clock.now += 2.0
    assert limiter.admit("a") is None  # refilled
    # Refused calls take nothing: a peer hammering its limit does not drain the global bucket.
    clock.now += 100.0
    for _ in range(1000):
        limiter.admit("x")
    assert limiter.admit("y") is None


def test_enrolment_limiter_waits_for_the_slower_bucket() -> None:
    clock = FakeClock()
    limiter = EnrolmentLimiter(rate=1.0, burst=1, peer_rate=0.25, peer_burst=1, clock=clock)
    assert limiter.admit("a") is None
    assert limiter.admit("a") == pytest.approx(4.0)  # the peer's bucket (4 s) outlasts the global one (1 s)
    clock.now += 1.0
    assert limiter.admit("b") is None                 # the refused calls of "a" took nothing
    assert limiter.admit("c") == pytest.approx(1.0)   # only the global bucket is short
    clock.now += 3.0
    assert limiter.admit("a") is None


def test_enrolment_limiter_memory_is_bounded() -> None:
    limiter = EnrolmentLimiter(rate=1e9, burst=1e9, peer_rate=1.0, peer_burst=1, max_peers=100)
    for i in range(10_000):
        limiter.admit(f"ipv4:10.0.{i // 256}.{i % 256}")
    assert len(limiter) == 100


def test_peer_address() -> None:
    assert peer_address("ipv4:127.0.0.1:5000") == "ipv4:127.0.0.1"
    assert peer_address("ipv6:[::1]:5000") == "ipv6:[::1]"
    assert peer_address("unix:/tmp/sock") == "unix:/tmp/sock"


# -- plausibility bounds --------------------------------------------------------------------------

@pytest.mark.parametrize(("domain", "epsilon", "variant"), [
    (8, 1.0, "oue"), (64, 1.0, "oue"), (64, 4.0, "oue"), (128, 0.5, "oue"), (1024, 2.0, "oue"),
    (128, 2.0, "sue"), (4096, 8.0, "oue")])
def test_hamming_weight_limits_exact_binomial_tail(domain: int, epsilon: float, variant: str) -> None:
    """An honest report has W = B + X, B ~ Bernoulli(p), X ~ Binomial(D - 1, q). The exact
    probability of each rejection region is at most delta (the Chernoff guarantee), and the limits
    are not loose."""
    params = oue(domain, epsilon) if variant == "oue" else sue(domain, epsilon)
    low, high = hamming_weight_limits(domain, params.q)
    x = stats.binom(domain - 1, params.q)
    p = params.p

    def pmf_w(w: np.ndarray) -> np.ndarray:
        return (1 - p) * x.pmf(w) + p * x.pmf(w - 1)

    weights = np.arange(domain + 1)
    below, above = weights < low, weights > high
    assert float(pmf_w(weights[below]).sum()) <= PLAUSIBILITY_DELTA
    assert float(pmf_w(weights[above]).sum()) <= PLAUSIBILITY_DELTA
    # Not loose: two ones inside either limit, the exact tail is already above delta / 1000.
    if high < domain:
        assert float(pmf_w(weights[weights >= high - 1]).sum()) > PLAUSIBILITY_DELTA / 1000
    if low > 0:
        assert float(pmf_w(weights[weights <= low + 1]).sum()) > PLAUSIBILITY_DELTA / 1000


def test_implausible_unary_report_is_rejected_and_stores_nothing(tmp_path: Path) -> None:
    collector = Collector(open_store(tmp_path / "data"))
    collector.create_campaign(config_from_proto(campaigns_pb2.CampaignConfig(
        campaign_id="oue", kind=campaigns_pb2.HISTOGRAM, epsilon=0.5,
        domain=campaigns_pb2.Domain(categorical_size=128),
        histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.OUE))))
    spec, _ = collector.get_round_spec("oue")
    assert spec is not None
    params = spec.tasks[0].components[0].mechanism
    low, high = hamming_weight_limits(128, params.q)  # type: ignore[attr-defined]
    assert low > 6  # epsilon 0.5: an unpadded maximal-gain report (5 target bits) is implausible

    def bits(ones: int) -> bytes:
        return ((1 << ones) - 1).to_bytes(16, "little")

    reports = [Report(report_id=bytes([i]) * 16, campaign_id="oue", round=spec.round, group=0, payloads=(bits(k),))
               for i, k in enumerate([5, low - 1, low, high, high + 1, 128])]
    outcomes = collector.submit("r", reports)
    assert [o for o, _ in outcomes] == [Outcome.REJECTED, Outcome.REJECTED, Outcome.ACCEPTED, Outcome.ACCEPTED,
                                        Outcome.REJECTED, Outcome.REJECTED]
    assert "bits set" in outcomes[0][1]
    assert collector.store.count_reports("oue", spec.round) == 2


# -- anomaly flags ------------------------------------------------------------------------------

def test_anomaly_threshold_is_bonferroni() -> None:
    assert anomaly_threshold(1, 0.05) == pytest.approx(1.959964, abs=1e-5)
    assert anomaly_threshold(64, 0.01) == pytest.approx(NormalDist().inv_cdf(1 - 0.01 / 128))
    with pytest.raises(ValueError):
        anomaly_threshold(0)
    with pytest.raises(ValueError):
        anomaly_threshold(4, 1.5)
    with pytest.raises(ValueError, match="same length"):
        anomaly_flags([0.1], [0.1], [0.1, 0.2], [0.1, 0.1])


def test_anomaly_flags_false_alarm_rate_is_bounded() -> None:
    """Null hypothesis: both windows estimate the same frequencies with normal errors. Over 3000
    window pairs the share with any flag is at most alpha = 0.01 (Bonferroni); the count is checked
    against the Binomial(3000, 0.01) quantile at 1 - 1e-6."""
    rng = np.random.default_rng(11)
    domain, trials, alpha = 64, 3000, 0.01
    truth = rng.dirichlet(np.ones(domain))
    se1 = np.full(domain, 0.004)
    se2 = np.full(domain, 0.006)
    alarms = 0
    for _ in range(trials):
        f1 = truth + rng.normal(0, se1)
        f2 = truth + rng.normal(0, se2)
        alarms += bool(anomaly_flags(f1.tolist(), se1.tolist(), f2.tolist(), se2.tolist(), alpha=alpha))
    assert alarms <= stats.binom.ppf(1 - 1e-6, trials, alpha)
    assert alarms > 0  # the test can see false alarms at all (expected about 30)


def test_anomaly_flags_fire_on_a_known_shift() -> None:
    rng = np.random.default_rng(12)
    domain = 64
    truth = np.full(domain, 1.0 / domain)
    shifted = truth.copy()
    shifted[[5, 40]] += 0.03
    shifted /= shifted.sum()
    se = np.full(domain, 0.003)  # shift / sqrt(2) se ~ 7 > threshold 3.8: missed with P < 1e-6 each
    f1 = truth + rng.normal(0, se)
    f2 = shifted + rng.normal(0, se)
    flags = anomaly_flags(f1.tolist(), se.tolist(), f2.tolist(), se.tolist())
    assert {f.value for f in flags} >= {5, 40}
    assert all(f.z > 0 for f in flags if f.value in (5, 40))
    assert "value 5" in next(f for f in flags if f.value == 5).describe()


def _window_reports(spec: RoundSpec, values: list[int], seed: int) -> list[Report]:
    rng = SeededRng(seed)
    component = spec.tasks[0].components[0]
    return [Report(report_id=rng.token_bytes(16), campaign_id=spec.campaign_id, round=spec.round, group=0,
                   payloads=(component.run(v, rng=rng),)) for v in values]


def _population(n: int, domain: int, boost: int | None = None, share: float = 0.0) -> list[int]:
    values = [v % domain for v in range(n)]  # uniform
    if boost is not None:
        values[: int(share * n)] = [boost] * int(share * n)
    return values


@pytest.mark.parametrize("oracle", [campaigns_pb2.GRR, campaigns_pb2.OUE])
def test_windowed_histogram_flags_a_shift_and_not_a_stable_window(tmp_path: Path, oracle: int) -> None:
    collector = Collector(open_store(tmp_path / "data"))
    config = campaigns_pb2.CampaignConfig(
        campaign_id="w", kind=campaigns_pb2.HISTOGRAM, epsilon=2.0,
        domain=campaigns_pb2.Domain(categorical_size=16),
        # the stable window falsely flags with P <= 1e-6
        histogram=campaigns_pb2.HistogramParameters(oracle=oracle, windows=3, anomaly_alpha=1e-6))  # type: ignore[arg-type]
    collector.create_campaign(config_from_proto(config))
    n = 20_000
    populations = [_population(n, 16), _population(n, 16), _population(n, 16, boost=3, share=0.15)]
    for window, values in enumerate(populations, start=1):
        spec, finished = collector.get_round_spec("w")
        assert spec is not None and not finished and spec.round == window
        assert spec.max_reports_per_device == 1  # PARTITION: one window per device
        for start in range(0, n, 5000):
            outcomes = collector.submit(f"b{window}-{start}", _window_reports(spec, values[start:start + 5000],
                                                                              seed=window * 100 + start))
            assert all(o == Outcome.ACCEPTED for o, _ in outcomes)
        collector.close_round("w", window)
        estimates = collector.get_estimates("w", window)
        anomalies = [w for w in estimates.warnings if w.startswith("anomaly:")]
        if window < 3:
            assert anomalies == []
        else:
            assert any(w.startswith("anomaly: value 3:") for w in anomalies), list(estimates.warnings)
            assert len(anomalies) <= 16
        z = z_limit(16)
        truth = Counter(values)
        for e in estimates.estimates:
            assert abs(e.count - truth[e.value]) <= z * e.std_error
    campaign = collector.get_campaign("w")
    assert campaign.state == campaigns_pb2.FINISHED
    result = collector.get_result("w")
    assert any(w.startswith("anomaly: value 3:") for w in result.warnings)


def test_windowed_histogram_split_budget_and_bad_parameters(tmp_path: Path) -> None:
    collector = Collector(open_store(tmp_path / "data"))
    config = campaigns_pb2.CampaignConfig(
        campaign_id="s", kind=campaigns_pb2.HISTOGRAM, epsilon=2.0, budget_policy=campaigns_pb2.SPLIT,
        domain=campaigns_pb2.Domain(categorical_size=8),
        histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.GRR, windows=4))
    collector.create_campaign(config_from_proto(config))
    spec, _ = collector.get_round_spec("s")
    assert spec is not None
    assert spec.max_reports_per_device == 4
    assert spec.tasks[0].epsilon == pytest.approx(0.5)
    for field, value in [("windows", 65), ("anomaly_alpha", 1.0), ("anomaly_alpha", -0.5),
                         ("anomaly_alpha", math.nan)]:
        bad = campaigns_pb2.CampaignConfig()
        bad.CopyFrom(config)
        bad.campaign_id = "bad"
        setattr(bad.histogram, field, value)
        with pytest.raises(InvalidArgumentError, match=f"histogram.{field}"):
            collector.create_campaign(config_from_proto(bad))
    one = campaigns_pb2.CampaignConfig()
    one.CopyFrom(config)
    one.campaign_id = "one"
    one.histogram.windows = 0  # 0 = one window
    collector.create_campaign(config_from_proto(one))
    assert collector.get_round_spec("one")[0].tasks[0].epsilon == pytest.approx(2.0)  # type: ignore[union-attr]


# -- a real gRPC server with enrolment on ---------------------------------------------------------

def make_config(tmp: Path, **changes: Any) -> CollectorConfig:
    values: dict[str, Any] = dict(
        listen="127.0.0.1:0", data_dir=str(tmp / "data"), operator_token=OPERATOR, tick_interval_s=0.1,
        grace_period_s=1.0, enrolment=True, enrolment_secret=SECRET, enrolment_burst=100_000,
        enrolment_peer_burst=100_000)
    values.update(changes)
    return CollectorConfig(**values)


@pytest.fixture(scope="module")
def enrolled_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    server = start_server(make_config(tmp_path_factory.mktemp("enrolment")))
    yield server
    server.stop(grace=1.0)


def create_olh_campaign(address: str, campaign_id: str, domain: int) -> None:
    with grpc.insecure_channel(address) as channel:
        operator = service_pb2_grpc.OperatorServiceStub(channel)
        operator.CreateCampaign(service_pb2.CreateCampaignRequest(config=campaigns_pb2.CampaignConfig(
            campaign_id=campaign_id, kind=campaigns_pb2.HISTOGRAM, epsilon=2.0,
            domain=campaigns_pb2.Domain(categorical_size=domain),
            histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.OLH))), metadata=AUTH)


def test_grpc_enrolled_devices_report_with_assigned_seeds(enrolled_server: Any) -> None:
    domain, n = 8, 600
    create_olh_campaign(enrolled_server.address, "enrolled", domain)
    values = [v for v in range(domain) for _ in range(n * (domain - v) // 36)]
    values += [0] * (n - len(values))
    seeds: set[int] = set()
    for i, value in enumerate(values):
        device = Device.in_memory(DevicePolicy(), rng=SeededRng(1000 + i))
        with CollectorClient(enrolled_server.address) as client:
            token = client.enroll()
            assert client.device_token == token
            fetched = client.get_round("enrolled")
            assert fetched is not None
            spec, assignment = fetched
            assert assignment is not None
            report = device.participate(spec, value, assignment=assignment)
            assert report is not None and report.report_id == assignment.report_id
            payload = report.payloads[0]
            assert isinstance(payload, HashedValue) and payload.seed == assignment.hash_seeds[0]
            seeds.add(payload.seed)
            outcome = Sender(device, client, packed=i % 2 == 1).drain()  # both submit paths
            assert outcome.accepted == 1, outcome
            if i < 3:  # a second report of the round from the same device has no effect
                again = Report(report_id=report.report_id, campaign_id="enrolled", round=spec.round, group=0,
                               payloads=(HashedValue(payload.seed, (payload.value + 1) % 3),))
                assert [o.status.name for o in client.submit([again])] == ["DUPLICATE"]
                chosen = Report(report_id=report.report_id, campaign_id="enrolled", round=spec.round, group=0,
                                payloads=(HashedValue(12345, 0),))
                rejected = client.submit([chosen])[0]
                assert rejected.status.name == "REJECTED" and "seed" in rejected.reason
                rejected = client.submit_packed([chosen])[0]
                assert rejected.status.name == "REJECTED" and "seed" in rejected.reason
                foreign = Report(report_id=bytes(16), campaign_id="enrolled", round=spec.round, group=0,
                                 payloads=report.payloads)
                rejected = client.submit_packed([foreign])[0]
                assert rejected.status.name == "REJECTED" and "report_id" in rejected.reason
    assert len(seeds) == n  # every device its own seed (collisions among 600 32-bit seeds: P ~ 4e-5)
    with grpc.insecure_channel(enrolled_server.address) as channel:
        operator = service_pb2_grpc.OperatorServiceStub(channel)
        operator.CloseRound(service_pb2.CloseRoundRequest(campaign_id="enrolled", round=1), metadata=AUTH)
        estimates = operator.GetEstimates(service_pb2.GetEstimatesRequest(campaign_id="enrolled"), metadata=AUTH)
    assert estimates.reports == n
    truth = Counter(values)
    z = z_limit(domain)
    for e in estimates.estimates:
        assert abs(e.count - truth[e.value]) <= z * e.std_error, (e.value, e.count, truth[e.value])


def test_grpc_device_calls_need_an_enrolled_token(enrolled_server: Any) -> None:
    create_olh_campaign(enrolled_server.address, "closed-door", 4)
    with grpc.insecure_channel(enrolled_server.address) as channel:
        device = service_pb2_grpc.DeviceServiceStub(channel)
        request = service_pb2.GetRoundSpecRequest(campaign_id="closed-door")
        for metadata in [(), (("authorization", "Bearer not-a-token"),),
                         (("authorization", "Bearer " + _flip(EnrolmentAuthority(SECRET).issue(), 30)),),
                         (("authorization", "Bearer " + EnrolmentAuthority("x" * 32).issue()),)]:
            with pytest.raises(grpc.RpcError) as info:
                device.GetRoundSpec(request, metadata=metadata)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
        token = device.Enroll(service_pb2.EnrollRequest()).device_token
        response = device.GetRoundSpec(request, metadata=(("authorization", f"Bearer {token}"),))
        assert response.HasField("assignment") and len(response.assignment.report_id) == 16
        # The operator token still works, without an assignment (not an enrolled device).
        response = device.GetRoundSpec(request, metadata=AUTH)
        assert response.HasField("spec") and not response.HasField("assignment")


def test_grpc_enrolment_rate_limit_answers_unavailable_with_retry_info(tmp_path: Path) -> None:
    config = make_config(tmp_path, enrolment_peer_burst=3, enrolment_peer_rate=0.01)
    with start_server(config) as server, grpc.insecure_channel(server.address) as channel:
        device = service_pb2_grpc.DeviceServiceStub(channel)
        tokens = [device.Enroll(service_pb2.EnrollRequest()).device_token for _ in range(3)]
        assert len(set(tokens)) == 3
        with pytest.raises(grpc.RpcError) as info:
            device.Enroll(service_pb2.EnrollRequest())
        error: Any = info.value
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        status = rpc_status.from_call(error)
        assert status is not None
        delays = []
        for detail in status.details:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                delays.append(retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9)
        assert len(delays) == 1 and 50.0 <= delays[0] <= 100.0  # one token at 0.01/s
        # The client honours it: a delay beyond its backoff_max stops with retry_after set.
        from ldp_client.grpc import RpcFailedError
        with CollectorClient(server.address, backoff_max=1.0) as client, pytest.raises(RpcFailedError) as failed:
            client.enroll()
        assert failed.value.retry_after is not None and failed.value.retry_after > 1.0


def test_enrol_is_refused_when_enrolment_is_off(tmp_path: Path) -> None:
    config = make_config(tmp_path, enrolment=False)
    with start_server(config) as server, CollectorClient(server.address, max_attempts=1) as client:
        from ldp_client.grpc import RequestRejectedError
        with pytest.raises(RequestRejectedError, match="enrolment is off"):
            client.enroll()


def test_olh_seed_choice_is_what_the_assignment_takes_away() -> None:
    """Why assigned seeds matter: with a free seed, a fake device finds (by search) a seed under
    which all 5 targets share one bucket and supports all of them; with an assigned seed it
    supports on average only 1 + 4/g of them."""
    from ldp_client.mechanisms import LocalHashingParams
    from ldp_client.mechanisms.local_hashing import hash_value

    params = LocalHashingParams(domain_size=64, epsilon=2.0)
    g = params.g
    targets = [3, 17, 29, 41, 60]
    free = next(s for s in range(10**7) if len({hash_value(s, t, g) for t in targets}) == 1)
    assert len({hash_value(free, t, g) for t in targets}) == 1
    authority = EnrolmentAuthority(SECRET)
    rng = SeededRng(3)
    supported = []
    for _ in range(2000):
        seed = authority.assignment(rng.token_bytes(16), "c", 1).hash_seeds[0]
        buckets = Counter(hash_value(seed, t, g) for t in targets)
        supported.append(max(buckets.values()))
    mean = sum(supported) / len(supported)
    assert mean < 5 * 0.6 and math.isfinite(mean)


# -- Hamming weights of a round ---------------------------------------------------------------------

def test_honest_weight_distribution_is_exact() -> None:
    params = oue(64, 1.0)
    dist = honest_weight_distribution(64, params.p, params.q)
    x = stats.binom(63, params.q)
    w = np.arange(65)
    expected = (1 - params.p) * x.pmf(w) + params.p * x.pmf(w - 1)
    assert np.allclose(dist, expected, rtol=1e-9, atol=1e-300)
    assert dist.sum() == pytest.approx(1.0)


def _weights_of(payloads: list[bytes], domain: int) -> list[int]:
    return np.bincount([int.from_bytes(b, "little").bit_count() for b in payloads], minlength=domain + 1).tolist()


@pytest.mark.parametrize(("epsilon", "padded"), [(1.0, False), (1.0, True), (2.0, False), (2.0, True)])
def test_weight_excess_flags_fake_unary_reports_and_not_honest_ones(epsilon: float, padded: bool) -> None:
    domain, n = 128, 20_000
    params = oue(domain, epsilon)
    rng = SeededRng(21)
    honest = [params.randomize(v % domain, rng=rng) for v in range(n)]
    # Null: honest reports only, tested at alpha = 1e-6 (false fail < 1e-6).
    assert weight_excess(_weights_of(honest, domain), domain, params.p, params.q, alpha=1e-6) == []
    # 2% maximal-gain fakes: the 5 target bits, padded to the expected weight or not.
    targets = [3, 30, 60, 90, 120]
    ones = round(params.p + (domain - 1) * params.q) if padded else len(targets)
    picker = np.random.default_rng(22)
    fakes = []
    for _ in range(n // 50):
        bits = set(targets)
        others = [v for v in range(domain) if v not in bits]
        bits.update(int(v) for v in picker.choice(others, size=ones - len(targets), replace=False))
        fakes.append(sum(1 << v for v in bits).to_bytes(16, "little"))
    found = weight_excess(_weights_of(honest + fakes, domain), domain, params.p, params.q)
    assert ones in [w for w, _, _ in found]


def test_unpadded_fakes_show_in_the_round_warnings(tmp_path: Path) -> None:
    collector = Collector(open_store(tmp_path / "data"))
    collector.create_campaign(config_from_proto(campaigns_pb2.CampaignConfig(
        campaign_id="weights", kind=campaigns_pb2.HISTOGRAM, epsilon=1.0,
        domain=campaigns_pb2.Domain(categorical_size=128),
        histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.OUE))))
    spec, _ = collector.get_round_spec("weights")
    assert spec is not None
    reports = _window_reports(spec, [v % 128 for v in range(10_000)], seed=31)
    fake_bits = sum(1 << v for v in (1, 2, 3, 4, 5)).to_bytes(16, "little")
    rng = SeededRng(32)
    reports += [Report(report_id=rng.token_bytes(16), campaign_id="weights", round=spec.round, group=0,
                       payloads=(fake_bits,)) for _ in range(100)]
    # Two batches: a batch holds at most MAX_BATCH_REPORTS (10 000) reports.
    outcomes = collector.submit("honest", reports[:10_000]) + collector.submit("fakes", reports[10_000:])
    assert all(o == Outcome.ACCEPTED for o, _ in outcomes)  # each one is plausible on its own
    collector.close_round("weights", spec.round)
    estimates = collector.get_estimates("weights", spec.round)
    assert any(w.startswith("implausible: 100 reports have 5 bits set") for w in estimates.warnings), \
        list(estimates.warnings)


def test_enrolment_settings_from_the_environment(tmp_path: Path) -> None:
    from ldp_collector.config import load_config

    config = load_config(env={"LDP_ENROLMENT": "true", "LDP_ENROLMENT_SECRET": SECRET, "LDP_ENROLMENT_PEER_RATE": "0.5",
                              "LDP_DATA_DIR": str(tmp_path)})
    assert config.enrolment and config.enrolment_secret == SECRET and config.enrolment_peer_rate == 0.5
    assert SECRET not in repr(config)
    with pytest.raises(ConfigError, match="LDP_ENROLMENT_SECRET"):
        load_config(env={"LDP_ENROLMENT": "1", "LDP_DATA_DIR": str(tmp_path)})


def test_poisoning_drill_runs_end_to_end(tmp_path: Path) -> None:
    """The drill's one command at a tiny size: every scenario runs, files are written, and the
    deterministic parts hold (non-adaptive fakes all rejected, no genuine report rejected)."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "drill"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        str(root / "packages" / p / "src") for p in ("ldp-client", "ldp-proto", "ldp-collector")))
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "poisoning_drill.py"), "--n", "400",
                           "--shares", "0.1", "--out", str(out)], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(out.with_suffix(".json").read_text())
    rows = data["rows"]
    assert len(rows) == 9  # 3 no-attack rows + 6 attacked scenarios x 1 share
    assert "| olh | assigned seeds | MGA, chosen seeds (non-adaptive) | 10% | 100.0% |" in out.with_suffix(".md").read_text()
    for row in rows:
        assert row["genuine_rejected_pct"] == 0.0
        if "non-adaptive" in row["attack"]:
            assert row["fake_rejected_pct"] == 100.0
        elif row["fake_rejected_pct"] is not None:
            assert row["fake_rejected_pct"] == 0.0  # the other fakes send plausible, well-formed reports
        if row["oracle"] == "oue" and row["attack"] == "MGA, no padding":
            assert 5 in row["weights_flagged"]  # 44 fakes with 5 bits set among 400 honest reports
