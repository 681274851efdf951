"""Device.participate: policy, group choice, budget, one report per round, crash safety, corruption."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ldp_client import ledger as ledger_module
from ldp_client.device import Device, DevicePolicy
from ldp_client.encoders import CategoricalEncoder
from ldp_client.errors import (
    AlreadyReportedError,
    BudgetExhaustedError,
    EncodingError,
    InvalidParameterError,
    LedgerCorruptedError,
    OutboxCorruptedError,
    PolicyViolationError,
    ProtocolError,
    StateDirectoryError,
)
from ldp_client.ledger import LEDGER_FILE, MARKER_FILE, Ledger
from ldp_client.mechanisms import GRRParams
from ldp_client.report import Report
from ldp_client.rng import SeededRng
from ldp_client.spec import Component, GroupTask, RoundSpec
from support.stats import assert_chi2_fits

DOMAIN = 8


def component(epsilon: float = 1.0) -> Component:
    return Component(encoder=CategoricalEncoder(domain_size=DOMAIN),
                     mechanism=GRRParams(domain_size=DOMAIN, epsilon=epsilon))


def make_spec(campaign: str = "camp", round: int = 0, *, weights: tuple[int, ...] = (1,),
              groups: tuple[int, ...] | None = None, epsilon: float = 1.0, components: int = 1,
              campaign_epsilon: float = 4.0, max_reports: int = 4, kind: str = "histogram") -> RoundSpec:
    groups = tuple(range(len(weights))) if groups is None else groups
    tasks = (GroupTask(groups=groups, components=tuple(component(epsilon) for _ in range(components))),) \
        if groups else ()
    return RoundSpec(campaign_id=campaign, round=round, group_weights=weights, tasks=tasks,
                     campaign_epsilon=campaign_epsilon, max_reports_per_device=max_reports, kind=kind)


Factory = Callable[..., Device]


@pytest.fixture(params=["file", "memory"])
def new_device(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    """Build devices of one kind; the file kind reopens the same state directory every time."""
    if request.param == "file":
        return lambda policy=None, rng=None: Device(tmp_path / "state", policy, rng=rng or SeededRng(7))
    shared: list[Device] = []

    def memory(policy: DevicePolicy | None = None, rng: Any = None) -> Device:
        if not shared:
            shared.append(Device.in_memory(policy, rng=rng or SeededRng(7)))
        return shared[0]

    return memory


# ---------------------------------------------------------------------------- policy


def test_policy_validation() -> None:
    assert DevicePolicy() == DevicePolicy(max_epsilon_per_campaign=4.0, max_epsilon_total=32.0,
                                          max_reports_per_campaign=16, allowed_kinds=())
    with pytest.raises(InvalidParameterError, match=r"max_epsilon_per_campaign must be in \(0, 100\], got 0"):
        DevicePolicy(max_epsilon_per_campaign=0)
    with pytest.raises(InvalidParameterError, match="max_epsilon_total must be finite"):
        DevicePolicy(max_epsilon_total=float("inf"))
    with pytest.raises(InvalidParameterError, match="max_reports_per_campaign"):
        DevicePolicy(max_reports_per_campaign=0)
    with pytest.raises(TypeError, match="allowed_kinds"):
        DevicePolicy(allowed_kinds="grid")  # type: ignore[arg-type]
    assert DevicePolicy(allowed_kinds=["grid"]).allowed_kinds == ("grid",)  # type: ignore[arg-type]


def test_spec_above_policy_is_refused(new_device: Factory) -> None:
    device = new_device(DevicePolicy(max_epsilon_per_campaign=2.0, max_reports_per_campaign=3,
                                     allowed_kinds=("grid", "histogram")))
    with pytest.raises(PolicyViolationError, match="campaign_epsilon 4, above the device's max_epsilon_per_campaign 2"):
        device.participate(make_spec(campaign_epsilon=4.0), 1)
    with pytest.raises(PolicyViolationError, match="up to 4 reports per device, above .* max_reports_per_campaign 3"):
        device.participate(make_spec(campaign_epsilon=2.0, max_reports=4), 1)
    with pytest.raises(PolicyViolationError, match="kind 'nettree'.*allowed: grid, histogram"):
        device.participate(make_spec(campaign_epsilon=2.0, max_reports=1, kind="nettree"), 1)
    assert device.spent_total() == 0.0 and device.pending_reports() == []
    with pytest.raises(TypeError, match="spec must be a RoundSpec"):
        device.participate(make_spec().pack(), 1)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- one report per round


def test_participate_stores_charges_and_returns_the_same_report(new_device: Factory) -> None:
    device = new_device()
    spec = make_spec(epsilon=0.75, components=2)
    report = device.participate(spec, 3)
    assert isinstance(report, Report) and len(report.payloads) == 2
    assert (report.campaign_id, report.round, report.group) == ("camp", 0, 0)
    assert device.spent("camp") == 1.5 and device.spent_total() == 1.5
    assert device.pending_reports() == [report]
    again = new_device().participate(spec, 5)  # never re-sampled, whatever the point now
    assert again is not None and again.pack() == report.pack()
    assert new_device().spent("camp") == 1.5
    assert new_device().has_reported("camp", 0) and not new_device().has_reported("camp", 1)


def test_acknowledged_round_raises_already_reported(new_device: Factory) -> None:
    device = new_device()
    report = device.participate(make_spec(), 1)
    assert report is not None
    assert device.acknowledge([report.report_id, b"\x00" * 16]) == 1
    assert device.pending_reports() == [] and device.spent("camp") == 1.0
    with pytest.raises(AlreadyReportedError) as info:
        new_device().participate(make_spec(), 1)
    assert (info.value.campaign_id, info.value.round, info.value.report_id) == ("camp", 0, report.report_id)
    assert "already reported in campaign 'camp' round 0" in str(info.value)
    with pytest.raises(TypeError, match="report ids must be bytes"):
        device.acknowledge(["abc"])  # type: ignore[list-item]


def test_encoding_error_stores_and_charges_nothing(new_device: Factory) -> None:
    device = new_device()
    with pytest.raises(EncodingError):
        device.participate(make_spec(), DOMAIN)
    with pytest.raises(EncodingError):
        device.participate(make_spec(), "three")
    assert device.spent_total() == 0.0 and device.pending_reports() == [] and len(device.outbox) == 0
    assert device.participate(make_spec(), 2) is not None


def test_pending_reports_are_in_creation_order(new_device: Factory) -> None:
    device = new_device(DevicePolicy(max_epsilon_total=100.0))
    reports = [device.participate(make_spec(f"c{i}"), i % DOMAIN) for i in (3, 1, 2, 0)]
    assert new_device().pending_reports() == reports


def test_threads_get_one_report(new_device: Factory) -> None:
    device = new_device()
    results: list[Report | None] = []
    threads = [threading.Thread(target=lambda: results.append(device.participate(make_spec(), 1))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.pack() for r in results if r is not None}) == 1 and device.spent("camp") == 1.0


# ---------------------------------------------------------------------------- groups


class ScriptedRng(SeededRng):
    """A SeededRng whose ``randbelow`` answers come from a script (to hit every group boundary)."""

    def __init__(self, answers: list[int]) -> None:
        super().__init__(0)
        self.answers = answers
        self.asked: list[int] = []

    def randbelow(self, n: int) -> int:
        if self.answers:
            self.asked.append(n)
            return self.answers.pop(0)
        return super().randbelow(n)


@pytest.mark.parametrize("u,group", [(0, 0), (1, 2), (2, 2), (3, 2), (4, 3)])
def test_group_choice_is_exact(u: int, group: int) -> None:
    rng = ScriptedRng([u])
    device = Device.in_memory(rng=rng)
    assert device.group_for(make_spec(weights=(1, 0, 3, 1))) == group
    assert rng.asked == [5]  # randbelow(sum of the weights)


def test_group_frequencies_follow_the_weights() -> None:
    rng = SeededRng(2024)
    spec = make_spec(weights=(1, 2, 5))
    groups = [Device.in_memory(rng=rng).group_for(spec) for _ in range(8000)]
    assert_chi2_fits(groups, {0: 1 / 8, 1: 2 / 8, 2: 5 / 8})


def test_group_is_chosen_once_and_kept(new_device: Factory) -> None:
    device = new_device()
    first = make_spec(weights=(1, 1, 1, 1), groups=())  # nobody reports in this round
    assert device.participate(first, 1) is None
    group = device.group_for(first)
    assert device.spent_total() == 0.0
    for r in range(1, 4):
        assert new_device().group_for(make_spec(round=r, weights=(1, 1, 1, 1), groups=())) == group
    report = new_device().participate(make_spec(round=4, weights=(1, 1, 1, 1), groups=(group,)), 1)
    assert report is not None and report.group == group
    other = tuple(g for g in range(4) if g != group)
    assert new_device().participate(make_spec(round=5, weights=(1, 1, 1, 1), groups=other), 1) is None


def test_a_bad_point_is_refused_even_when_the_group_sits_out(new_device: Factory) -> None:
    device = new_device()
    group = device.group_for(make_spec(weights=(1, 1)))
    sitting_out = make_spec(weights=(1, 1), groups=(1 - group,))
    for bad in (DOMAIN, "three", None):
        with pytest.raises((EncodingError, TypeError)):
            device.participate(sitting_out, bad)
    assert device.participate(sitting_out, 2) is None and device.spent_total() == 0.0


def test_group_outside_new_weights_is_a_protocol_error() -> None:
    device = Device.in_memory(rng=ScriptedRng([2]))
    assert device.group_for(make_spec(weights=(1, 1, 1))) == 2
    with pytest.raises(ProtocolError, match="has 2 groups, but the device is in group 2"):
        device.participate(make_spec(round=1, weights=(1, 1)), 1)


# ---------------------------------------------------------------------------- budget


def test_campaign_budget_across_rounds(new_device: Factory) -> None:
    device = new_device()
    for r in range(2):
        assert device.participate(make_spec(round=r, campaign_epsilon=2.0, epsilon=1.0), 1) is not None
    with pytest.raises(BudgetExhaustedError) as info:
        new_device().participate(make_spec(round=2, campaign_epsilon=2.0, epsilon=1.0), 1)
    assert (info.value.scope, info.value.spent, info.value.requested, info.value.cap) == ("campaign", 2.0, 1.0, 2.0)
    assert device.spent("camp") == 2.0 and len(device.pending_reports()) == 2


def test_policy_cap_is_the_smaller_one(new_device: Factory) -> None:
    device = new_device(DevicePolicy(max_epsilon_per_campaign=1.5))
    device.participate(make_spec(round=0, campaign_epsilon=1.5), 1)
    with pytest.raises(BudgetExhaustedError, match="cap 1.5"):
        device.participate(make_spec(round=1, campaign_epsilon=1.5), 1)


def test_total_budget_across_campaigns(new_device: Factory) -> None:
    device = new_device(DevicePolicy(max_epsilon_total=3.0))
    for c in range(3):
        device.participate(make_spec(f"c{c}"), 1)
    with pytest.raises(BudgetExhaustedError) as info:
        device.participate(make_spec("c3"), 1)
    assert (info.value.scope, info.value.spent, info.value.cap) == ("total", 3.0, 3.0)


def test_report_count_cap(new_device: Factory) -> None:
    device = new_device()
    for r in range(2):
        device.participate(make_spec(round=r, epsilon=0.1, max_reports=2), 1)
    with pytest.raises(BudgetExhaustedError) as info:
        device.participate(make_spec(round=2, epsilon=0.1, max_reports=2), 1)
    assert (info.value.scope, info.value.spent, info.value.cap) == ("campaign reports", 2, 2)


# ---------------------------------------------------------------------------- crash safety


def _state(tmp_path: Path) -> Path:
    return tmp_path / "state"


def test_failed_charge_leaves_nothing_to_send(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    device = Device(_state(tmp_path))
    real_charge = Ledger._charge_locked
    monkeypatch.setattr(Ledger, "_charge_locked", lambda self, *args: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        device.participate(make_spec(), 3)
    assert device.outbox.pending() == [] and device.pending_reports() == [] and device.spent_total() == 0.0
    monkeypatch.setattr(Ledger, "_charge_locked", real_charge)
    report = device.participate(make_spec(), 3)
    assert report is not None and device.pending_reports() == [report] and device.spent("camp") == 1.0


def _replace_failing_on(n: int) -> Callable[[Any, Any], None]:
    real = os.replace
    calls = [0]

    def replace(src: Any, dst: Any) -> None:
        calls[0] += 1
        if calls[0] == n:
            raise OSError(f"simulated crash in rename #{n}")
        real(src, dst)

    return replace


def test_crash_while_writing_the_ledger_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    device = Device(_state(tmp_path))
    monkeypatch.setattr(os, "replace", _replace_failing_on(1))  # the ledger's rename (the charge)
    with pytest.raises(StateDirectoryError, match="rename #1"):
        device.participate(make_spec(), 3)
    monkeypatch.undo()
    restarted = Device(_state(tmp_path))
    assert restarted.pending_reports() == [] and restarted.spent_total() == 0.0 and len(restarted.outbox) == 0
    report = restarted.participate(make_spec(), 3)  # nothing was charged, stored or sent
    assert report is not None and restarted.spent("camp") == 1.0 and restarted.pending_reports() == [report]


def test_crash_while_writing_the_outbox_keeps_the_charge_and_sends_nothing(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    device = Device(_state(tmp_path))
    monkeypatch.setattr(os, "replace", _replace_failing_on(2))  # the outbox record's rename
    with pytest.raises(StateDirectoryError, match="rename #2"):
        device.participate(make_spec(), 3)
    monkeypatch.undo()
    restarted = Device(_state(tmp_path))
    assert restarted.pending_reports() == [] and restarted.spent("camp") == 1.0  # over-stated, never under
    with pytest.raises(AlreadyReportedError):
        restarted.participate(make_spec(), 3)


def test_crash_after_the_outbox_write_returns_the_same_report(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    device = Device(_state(tmp_path))
    real = ledger_module.fsync_directory
    calls = [0]

    def fsync_directory(path: Path) -> None:
        calls[0] += 1
        real(path)
        if calls[0] == 2:  # charged, then the report renamed and synced; crash before participate returns
            raise OSError("simulated crash after the outbox write")

    monkeypatch.setattr(ledger_module, "fsync_directory", fsync_directory)
    with pytest.raises(StateDirectoryError, match="after the outbox write"):
        device.participate(make_spec(), 3)
    monkeypatch.undo()
    restarted = Device(_state(tmp_path))
    (pending,) = restarted.pending_reports()
    report = restarted.participate(make_spec(), 3)
    assert report is not None and report.pack() == pending.pack()
    assert len(Ledger(_state(tmp_path)).entries()) == 1 and restarted.spent("camp") == 1.0


def test_stored_report_of_a_round_charged_with_another_id_is_discarded(tmp_path: Path) -> None:
    device = Device(_state(tmp_path))
    charged = device.participate(make_spec(), 3)
    assert charged is not None
    stray = Report(report_id=b"\x07" * 16, campaign_id="camp", round=0, group=0, payloads=(1,))
    device.outbox.put(stray, 1.0)
    (discarded,) = device.recover()
    assert discarded.report_id == stray.report_id and device.pending_reports() == [charged]
    assert device.outbox.get(stray.report_id) is None and device.spent("camp") == 1.0


def test_uncharged_report_is_discarded_never_charged(tmp_path: Path) -> None:
    """A report stored without a charge (an older SDK's crash window, a rolled-back ledger, a file
    put there by hand) is never sent, and the device does not charge it after the fact."""
    Device(_state(tmp_path))
    stray = Report(report_id=b"\x07" * 16, campaign_id="camp", round=0, group=0, payloads=(1,))
    Device(_state(tmp_path)).outbox.put(stray, 1.0)
    device = Device(_state(tmp_path))
    assert device.pending_reports() == [] and device.spent_total() == 0.0 and len(device.outbox) == 0
    assert device.recover() == []


# ---------------------------------------------------------------------------- corrupted state


@pytest.mark.parametrize("corrupt", [
    lambda p: p.write_bytes(p.read_bytes()[:40]),
    lambda p: p.write_bytes(b"garbage"),
    lambda p: p.write_bytes(p.read_bytes().replace(b'"epsilon":1.0', b'"epsilon":0.0')),
    lambda p: p.unlink(),
], ids=["truncated", "garbage", "flipped", "deleted"])
def test_corrupted_ledger_stops_the_device(tmp_path: Path, corrupt: Callable[[Path], None]) -> None:
    device = Device(_state(tmp_path), rng=SeededRng(1))
    device.participate(make_spec(), 3)
    corrupt(_state(tmp_path) / LEDGER_FILE)
    for attempt in (lambda: Device(_state(tmp_path)), lambda: device.participate(make_spec(round=1), 3),
                    device.pending_reports, lambda: device.spent("camp")):
        with pytest.raises(LedgerCorruptedError, match=LEDGER_FILE):
            attempt()


@pytest.mark.parametrize("acknowledged", [False, True], ids=["outbox-holds-reports", "outbox-empty"])
def test_lost_ledger_and_device_file_is_never_a_fresh_start(tmp_path: Path, acknowledged: bool) -> None:
    device = Device(_state(tmp_path))
    report = device.participate(make_spec(), 3)
    assert report is not None
    if acknowledged:
        device.acknowledge([report.report_id])
    (_state(tmp_path) / LEDGER_FILE).unlink()
    (_state(tmp_path) / MARKER_FILE).unlink()
    with pytest.raises(LedgerCorruptedError, match="missing beside the device state outbox"):
        Device(_state(tmp_path))


def test_lost_device_file_beside_a_used_ledger_is_corruption(tmp_path: Path) -> None:
    Device(_state(tmp_path)).participate(make_spec(), 3)
    (_state(tmp_path) / MARKER_FILE).unlink()
    with pytest.raises(LedgerCorruptedError, match=f"{MARKER_FILE} is corrupted: missing beside a ledger that was used"):
        Device(_state(tmp_path))


def test_corrupted_outbox_file_is_reported_then_quarantined(tmp_path: Path) -> None:
    device = Device(_state(tmp_path), rng=SeededRng(1))
    report = device.participate(make_spec(), 3)
    assert report is not None
    (entry,) = device.outbox.entries()
    path = _state(tmp_path) / "outbox" / entry.name
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(OutboxCorruptedError, match=entry.name):
        Device(_state(tmp_path)).pending_reports()
    with pytest.raises(OutboxCorruptedError, match=entry.name):
        device.participate(make_spec(), 3)  # the stored report of this round cannot be read back
    moved = device.quarantine_corrupted_reports()
    assert moved == [_state(tmp_path) / "outbox" / ".quarantine" / entry.name]
    assert device.pending_reports() == [] and device.spent("camp") == 1.0  # the charge stays
    with pytest.raises(AlreadyReportedError):
        device.participate(make_spec(), 3)


def test_unreadable_outbox_file_blocks_sending_until_quarantined(tmp_path: Path) -> None:
    device = Device(_state(tmp_path))
    report = device.participate(make_spec(), 3)
    assert report is not None
    entry = device.outbox.entries()[0]
    (_state(tmp_path) / "outbox" / entry.name).write_bytes(b"LDPR")
    with pytest.raises(OutboxCorruptedError, match=entry.name):
        device.pending_reports()
    device.quarantine_corrupted_reports()
    assert device.pending_reports() == [] and device.participate(make_spec("other"), 3) is not None


# ---------------------------------------------------------------------------- in memory, imports


def test_in_memory_device_has_no_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    device = Device.in_memory(DevicePolicy(max_epsilon_total=2.0), rng=SeededRng(3), device_id="ab" * 16)
    assert device.device_id == "ab" * 16 and device.state_dir is None
    device.participate(make_spec("a"), 1)
    device.participate(make_spec("b"), 1)
    with pytest.raises(BudgetExhaustedError):
        device.participate(make_spec("c"), 1)
    assert os.listdir(tmp_path) == []


def test_device_modules_import_neither_grpc_nor_protobuf_nor_numpy() -> None:
    code = ("import sys, ldp_client.device, ldp_client.ledger, ldp_client.outbox; "
            "bad = [m for m in ('grpc', 'google.protobuf', 'numpy', 'ldp.v1') if sys.modules.get(m) is not None]; "
            "sys.exit(str(bad) if bad else 0)")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


@pytest.mark.parametrize("hidden,module", [("grpc", "ldp_client.grpc"), ("grpc_status", "ldp_client.grpc"),
                                           ("google.protobuf", "ldp_client.serde"), ("ldp.v1", "ldp_client.serde")])
def test_optional_modules_give_the_install_hint(hidden: str, module: str) -> None:
    code = (f"import sys; sys.modules[{hidden!r}] = None\n"
            f"try:\n    import {module}\nexcept ImportError as e:\n    print(e)\nelse:\n    print('imported')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}).stdout
    assert 'pip install "ldp-client[grpc]"' in out, out
