"""A malicious collector against a real :class:`Device` on disk (hypothesis stateful test).

The collector is untrusted: it may send any round spec (epsilons and caps above the device's
policy, changed specs for a round already answered, new group weights), any assignment (a report
id it assigned before or that belongs to another campaign, foreign hash seeds, malformed values),
replay requests, and acknowledge ids it never received. The device's process may also be killed
between any two durable writes (a crash is injected just before or just after one of them, and the
device is reopened from its state directory, as a restarted app would).

The test counts, outside the SDK, every report that ever left the device: a report leaves when a
sender could send it (:meth:`Device.pending_reports`). A report's epsilon is the one of the spec
whose :meth:`Device.participate` call returned it; a report no completed call returned (its call was
killed) is charged the largest epsilon any killed call for its round asked of its group. Invariants
after every step:

* every report that left was returned by a participate call or made by one that was killed: a
  call that refused (raised) leaves nothing to send;
* the epsilons of the distinct reports that left stay within the policy's per-campaign and total
  caps, and their number within the per-campaign report cap;
* no (campaign, round) ever released two different reports.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from ldp_client import ledger as ledger_module
from ldp_client.device import Device, DevicePolicy, RoundAssignment
from ldp_client.encoders import CategoricalEncoder
from ldp_client.errors import LdpError
from ldp_client.mechanisms import GRRParams, LocalHashingParams
from ldp_client.report import REPORT_ID_BYTES, Report
from ldp_client.spec import Component, GroupTask, RoundSpec

DOMAIN = 8
POINT = 5
POLICY = DevicePolicy(max_epsilon_per_campaign=1.0, max_epsilon_total=3.0, max_reports_per_campaign=4)
CAMPAIGNS = ("a", "b", "c", "d")
EPSILONS = (0.1, 0.25, 0.2, 0.5, 0.99, 1.5)


class Crash(BaseException):
    """The device's process was killed (raised around a durable write)."""


def _component(mechanism: str, epsilon: float) -> Component:
    encoder = CategoricalEncoder(domain_size=DOMAIN)
    if mechanism == "olh":
        return Component(encoder=encoder, mechanism=LocalHashingParams(domain_size=DOMAIN, epsilon=epsilon))
    return Component(encoder=encoder, mechanism=GRRParams(domain_size=DOMAIN, epsilon=epsilon))


specs = st.fixed_dictionaries({
    "campaign": st.sampled_from(CAMPAIGNS),
    "round": st.integers(0, 4),
    "epsilon": st.sampled_from(EPSILONS),
    "other_epsilon": st.sampled_from(EPSILONS),
    # mostly within the policy's per-campaign cap, which the spec's own cap is checked against first
    "campaign_epsilon": st.sampled_from((1.0, 0.5, 1.0, 4.0, 100.0)),
    "max_reports": st.integers(1, 8),
    "weights": st.sampled_from(((1,), (1, 1), (3, 1), (1, 1, 1))),
    "mechanism": st.sampled_from(("grr", "olh")),
    "components": st.integers(1, 2),
})

assignments = st.one_of(
    st.none(),
    st.tuples(st.just("fresh"), st.binary(min_size=REPORT_ID_BYTES, max_size=REPORT_ID_BYTES)),
    st.tuples(st.just("reuse"), st.integers(0, 3)),  # one of the last ids seen or assigned
    st.tuples(st.just("malformed"), st.sampled_from((0, 1, REPORT_ID_BYTES - 1, REPORT_ID_BYTES + 1, 64)).map(bytes)),
)
seed_lists = st.lists(st.one_of(st.integers(0, 2**32 - 1), st.integers(-3, 2**40)), max_size=3)


def _build_spec(s: dict[str, Any]) -> RoundSpec:
    groups = len(s["weights"])
    tasks = [GroupTask(groups=(0,), components=tuple(_component(s["mechanism"], s["epsilon"])
                                                     for _ in range(s["components"])))]
    if groups > 1:  # group 1 reports something else at another epsilon; group 2 (if any) reports nothing
        tasks.append(GroupTask(groups=(1,), components=(_component("grr", s["other_epsilon"]),)))
    return RoundSpec(campaign_id=s["campaign"], round=s["round"], group_weights=s["weights"], tasks=tuple(tasks),
                     campaign_epsilon=s["campaign_epsilon"], max_reports_per_device=s["max_reports"],
                     kind="histogram")


def _write_modules() -> list[Any]:
    return [m for name, m in list(sys.modules.items())
            if name.startswith("ldp_client") and m is not None and callable(getattr(m, "write_durably", None))]


class HostileCollector(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="ldp-hostile-"))
        self.patched: list[tuple[Any, Callable[..., Any]]] = []
        self.crash_in: int | None = None  # the durable write (counting from 0) that the kill hits
        self.crash_after = False  # ... just after it completed, else just before it
        for module in _write_modules():
            original = module.write_durably
            self.patched.append((module, original))
            module.write_durably = self._wrap(original)
        # The device's secret is fixed so that hypothesis can replay a failing run; it is still the
        # device's own memoized randomness that every coin comes from.
        if hasattr(ledger_module, "_new_secret"):
            self.patched.append((ledger_module, ledger_module._new_secret))
            ledger_module._new_secret = lambda: b"\x5a" * 32
        self.device = Device(self.dir, POLICY)
        self.specs: dict[tuple[str, int], list[RoundSpec]] = defaultdict(list)
        self.killed: dict[tuple[str, int], list[RoundSpec]] = defaultdict(list)
        self.origin: dict[bytes, float] = {}  # packed report -> epsilon of the call that returned it
        self.released: dict[bytes, tuple[Report, float]] = {}
        self.ids: list[bytes] = []  # every report id seen or assigned, for reuse

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def write_durably(*args: Any, **kwargs: Any) -> Any:
            if self.crash_in is not None:
                if self.crash_in == 0:
                    self.crash_in = None
                    if self.crash_after:
                        original(*args, **kwargs)
                    raise Crash
                self.crash_in -= 1
            return original(*args, **kwargs)
        return write_durably

    def teardown(self) -> None:
        for module, original in reversed(self.patched):
            setattr(module, original.__name__, original)
        self.device.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _restart(self) -> None:
        """A new process opens the state directory (the old one died holding nothing)."""
        self.crash_in = None
        self.device.close()
        self.device = Device(self.dir, POLICY)

    def _guarded(self, call: Callable[[], Any], on_kill: Callable[[], None] = lambda: None) -> Any:
        try:
            return call()
        except Crash:
            on_kill()
            self._restart()
        except LdpError:
            pass  # the device refused: fine, the invariants say whether it refused enough
        return None

    # ------------------------------------------------------------------ the collector's moves

    @initialize(crash=st.none() | st.integers(0, 3), after=st.booleans())
    def start(self, crash: int | None, after: bool) -> None:
        self.crash_in, self.crash_after = crash, after

    @rule(s=specs, assignment=assignments, seeds=seed_lists)
    def ask(self, s: dict[str, Any], assignment: Any, seeds: list[int]) -> None:
        try:
            spec = _build_spec(s)
        except LdpError:
            return  # a spec the SDK refuses to build (a task above the campaign's own epsilon)
        key = (spec.campaign_id, spec.round)
        self.specs[key].append(spec)
        assigned: RoundAssignment | None = None
        if assignment is not None:
            how, value = assignment
            report_id = value if how != "reuse" else (self.ids[-1 - value % len(self.ids)] if self.ids else bytes(16))
            try:
                assigned = RoundAssignment(report_id=report_id, hash_seeds=tuple(seeds))
            except (LdpError, TypeError):
                return  # malformed: the SDK refused to take it
            self.ids.append(report_id)
        answered = self.device.has_reported(*key)  # then the call can only return a stored report
        report = self._guarded(lambda: self.device.participate(spec, POINT, assignment=assigned),
                               on_kill=lambda: self.killed[key].append(spec))
        if report is not None:
            packed = report.pack()
            if packed not in self.origin:
                # Made by this call, or stored by an earlier call that was killed before it returned.
                self.origin[packed] = self._epsilon_of(report, self.killed.get(key, []) if answered else [spec])
            self.ids.append(report.report_id)

    def _epsilon_of(self, report: Report, candidates: list[RoundSpec]) -> float:
        """The largest epsilon any of ``candidates`` (the specs that could have made it) asked of its group."""
        tasks = [t for spec in candidates for t in [spec.task_for(report.group)] if t is not None]
        assert tasks, (f"report {report.report_id.hex()} of campaign {report.campaign_id!r} round {report.round} "
                       f"group {report.group} came from no participate call that was asked for it: a refused "
                       "call left a report to send")
        return max(t.epsilon for t in tasks)

    @rule(ack=st.sampled_from(("all", "none", "first", "unknown")))
    def send(self, ack: str) -> None:
        pending = self._guarded(self.device.pending_reports)
        if pending is None:
            return
        for report in pending:
            self._release(report)
        ids = [r.report_id for r in pending]
        acked = {"all": ids, "none": [], "first": ids[:1], "unknown": [bytes(16), *self.ids[-2:]]}[ack]
        self._guarded(lambda: self.device.acknowledge(acked))

    @rule()
    def restart(self) -> None:
        self._restart()

    @rule(crash=st.integers(0, 3), after=st.booleans())
    def arm_kill(self, crash: int, after: bool) -> None:
        self.crash_in, self.crash_after = crash, after

    # ------------------------------------------------------------------ what left the device

    def _release(self, report: Report) -> None:
        packed = report.pack()
        if packed in self.released:
            return  # a resend of the same bytes releases nothing new
        key = (report.campaign_id, report.round)
        epsilon = self.origin.get(packed)
        if epsilon is None:  # no completed call returned it: it can only come from a killed call
            epsilon = self._epsilon_of(report, self.killed.get(key, []))
        self.released[packed] = (report, epsilon)
        self.ids.append(report.report_id)

    @invariant()
    def within_the_policy(self) -> None:
        per_round: dict[tuple[str, int], set[bytes]] = defaultdict(set)
        spent: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        for packed, (report, epsilon) in self.released.items():
            per_round[(report.campaign_id, report.round)].add(packed)
            spent[report.campaign_id] += epsilon
            count[report.campaign_id] += 1
        for (campaign, round_), reports in per_round.items():
            assert len(reports) == 1, f"campaign {campaign!r} round {round_} released {len(reports)} different reports"
        for campaign, epsilon in spent.items():
            assert epsilon <= POLICY.max_epsilon_per_campaign, \
                f"campaign {campaign!r} released reports worth epsilon {epsilon:g} > {POLICY.max_epsilon_per_campaign:g}"
            assert count[campaign] <= POLICY.max_reports_per_campaign, \
                f"campaign {campaign!r} released {count[campaign]} reports > {POLICY.max_reports_per_campaign}"
        total = sum(spent.values())
        assert total <= POLICY.max_epsilon_total, f"released epsilon {total:g} > {POLICY.max_epsilon_total:g}"


HostileCollector.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
test_hostile_collector = HostileCollector.TestCase


def test_same_assigned_id_every_round_releases_one_report(tmp_path: Path) -> None:
    """The reported attack: the collector assigns one report id in every round (a first round of
    campaign z, then 40 rounds of campaign a at epsilon 0.99 under a per-campaign cap of 1), and
    acknowledges each report: only the first report may leave."""
    device = Device(tmp_path / "state", DevicePolicy(max_epsilon_per_campaign=1.0, max_epsilon_total=100.0,
                                                     max_reports_per_campaign=64))
    assignment = RoundAssignment(report_id=b"\x07" * REPORT_ID_BYTES)
    left: dict[tuple[str, int], bytes] = {}
    for round_ in range(41):
        spec = _build_spec({"campaign": "a" if round_ else "z", "round": round_, "epsilon": 0.99, "other_epsilon": 0.99,
                            "campaign_epsilon": 1.0, "max_reports": 64, "weights": (1,), "mechanism": "grr",
                            "components": 1})
        with pytest.raises(LdpError) if round_ else _no_error():
            device.participate(spec, POINT, assignment=assignment)
        for report in device.pending_reports():
            left[(report.campaign_id, report.round)] = report.pack()
        device.acknowledge([assignment.report_id])
    assert list(left) == [("z", 0)]


class _no_error:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


@pytest.mark.parametrize("spec_epsilon,campaign_epsilon", [(2.0, 2.0), (1.5, 1.0), (20.0, 100.0)])
def test_privunit_spec_cannot_release_beyond_the_policy(tmp_path: Path, spec_epsilon: float,
                                                        campaign_epsilon: float) -> None:
    """A PrivUnit component above the policy's cap (or the spec's own) is refused before any coin: nothing charged, nothing to send."""
    from ldp_client.encoders import NumericDomain, UnitBallEncoder
    from ldp_client.mechanisms import VectorPrivUnitParams

    device = Device(tmp_path, POLICY)
    encoder = UnitBallEncoder(domain=NumericDomain(lower=[0.0, 0.0, 0.0], upper=[1.0, 1.0, 1.0]))
    component = Component(encoder=encoder, mechanism=VectorPrivUnitParams(dimension=3, epsilon=spec_epsilon))
    with pytest.raises(LdpError):  # the spec's own check (component above its campaign epsilon) or the policy's
        spec = RoundSpec(campaign_id="a", round=1, group_weights=(1,),
                         tasks=(GroupTask(groups=(0,), components=(component,)),),
                         campaign_epsilon=campaign_epsilon, max_reports_per_device=1, kind="histogram")
        device.participate(spec, (0.2, 0.5, 0.9))
    assert device.pending_reports() == []
    assert device.spent("a") == 0.0
    # within the policy the same component is accepted and charged its epsilon, no more
    allowed = RoundSpec(campaign_id="a", round=1, group_weights=(1,), tasks=(GroupTask(groups=(0,), components=(
        Component(encoder=encoder, mechanism=VectorPrivUnitParams(dimension=3, epsilon=1.0)),)),),
        campaign_epsilon=1.0, max_reports_per_device=1, kind="histogram")
    report = device.participate(allowed, (0.2, 0.5, 0.9))
    assert report is not None and len(device.pending_reports()) == 1
    assert 0.0 < device.spent("a") <= POLICY.max_epsilon_per_campaign
