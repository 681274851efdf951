"""Memoized randomness, rolled-back and wiped device state, injected generators, unwritable state.

A device's coins come from HMAC-SHA256 streams keyed by its secret and the report's public context
(:mod:`ldp_client.memo`). The derivation is pinned by test vectors computed from the documented
formula with the standard library, and the coins are checked to be distributed as the mechanism
says (chi-square against the exact GRR distribution over many secrets, P(false fail) < 1e-6).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import logging
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from ldp_client import ledger as ledger_module
from ldp_client.device import Device, DevicePolicy, RoundAssignment
from ldp_client.encoders import CategoricalEncoder
from ldp_client.errors import LedgerCorruptedError, ProtocolError, StateDirectoryError
from ldp_client.ledger import LEDGER_FILE, MARKER_FILE
from ldp_client.mechanisms import GRRParams, LocalHashingParams
from ldp_client.memo import Memo, component_digest, context
from ldp_client.rng import KeyedRng, SeededRng
from ldp_client.spec import Component, GroupTask, RoundSpec
from support.stats import assert_chi2_fits

DOMAIN = 8


def grr(epsilon: float = 1.0) -> Component:
    return Component(encoder=CategoricalEncoder(domain_size=DOMAIN), mechanism=GRRParams(domain_size=DOMAIN,
                                                                                          epsilon=epsilon))


def olh(epsilon: float = 1.0) -> Component:
    return Component(encoder=CategoricalEncoder(domain_size=DOMAIN),
                     mechanism=LocalHashingParams(domain_size=DOMAIN, epsilon=epsilon))


def spec(round: int = 0, components: tuple[Component, ...] | None = None, weights: tuple[int, ...] = (1, 1),
         campaign: str = "camp") -> RoundSpec:
    components = components or (grr(), olh())
    return RoundSpec(campaign_id=campaign, round=round, group_weights=weights,
                     tasks=tuple(GroupTask(groups=(g,), components=components) for g in range(len(weights))),
                     campaign_epsilon=4.0, max_reports_per_device=4, kind="histogram")


# ---------------------------------------------------------------------------- test vectors


def test_keyed_stream_vectors() -> None:
    key = bytes(range(32))
    blocks = b"".join(hmac.digest(key, i.to_bytes(8, "big"), hashlib.sha256) for i in range(2))
    assert KeyedRng(key).token_bytes(40) == blocks[:40]
    assert blocks[:8].hex() == "9f0cd9b94097fe49"
    r = KeyedRng(key)
    stream = int.from_bytes(blocks, "big")  # 512 bits, most significant first
    # randbits(12): the stream's first 12 bits; randbelow(10): the next 4-bit draws until one is < 10
    assert r.randbits(12) == stream >> 500 == 2544
    assert [(stream >> shift) & 0xF for shift in (496, 492, 488)] == [12, 13, 9]  # two rejected, then 9
    assert r.randbelow(10) == 9
    assert [r.randbelow(1000003), r.randbits(0), r.randbelow(1)] == [758793, 0, 0]
    with pytest.raises(ValueError):
        KeyedRng(b"short")


def test_memo_derivation_vectors() -> None:
    secret = b"\x01" * 32
    memo = Memo(secret)
    ctx = context("report-id", "c", 7)
    assert ctx == (b"ldp-client/memo/v1" + b"\0\0\0\x09report-id" + b"\0\0\0\x01c" + b"\0\0\0\x08" + (7).to_bytes(8, "big"))
    assert memo.report_id("c", 7) == hmac.digest(secret, ctx, hashlib.sha256)[:16]
    assert memo.report_id("c", 7).hex() == "29e244cab08c47564b8cf9ae8dbae75f"
    assert memo.group_rng("c").randbelow(1000) == 927
    digest = component_digest(grr())
    assert digest.hex() == "eb307078b8c909cce55ffb0d6d899e42f4038a4c5410c151d058dec1d243e774"
    coins_key = hmac.digest(secret, context("coins", "c", 7, 0, 0, digest, b""), hashlib.sha256)
    assert memo.coins("c", 7, 0, 0, grr(), None).token_bytes(16) == KeyedRng(coins_key).token_bytes(16)
    assert memo.coins("c", 7, 0, 0, grr(), None).token_bytes(16).hex() == "d068521bf4a52d092b68e04bc55619c2"
    assert memo.coins("c", 7, 0, 0, grr(), 5).token_bytes(16).hex() == "c8aacd16a8364dd2dadadd4140ea4817"
    assert "01" * 4 not in repr(memo)


def test_memoized_grr_coins_follow_the_exact_distribution() -> None:
    """Over 20 000 device secrets, the memoized GRR report of value 3 has the exact GRR law."""
    params = GRRParams(domain_size=DOMAIN, epsilon=1.0)
    component = grr()
    samples = [params.randomize(3, rng=Memo(hashlib.sha256(i.to_bytes(4, "big")).digest())
                                .coins("c", 0, 0, 0, component, None)) for i in range(20_000)]
    exact = {y: params.p_exact if y == 3 else params.q_exact for y in range(DOMAIN)}
    assert_chi2_fits(samples, exact)


# ---------------------------------------------------------------------------- rolled back, wiped


def _device(tmp_path: Path, policy: DevicePolicy | None = None) -> Device:
    return Device(tmp_path / "state", policy)


@pytest.mark.parametrize("acknowledged", [True, False], ids=["acknowledged", "still-in-the-outbox"])
def test_rolled_back_ledger_repeats_the_same_report(tmp_path: Path, acknowledged: bool) -> None:
    state = tmp_path / "state"
    device = _device(tmp_path)
    backup = (state / LEDGER_FILE).read_bytes()  # a backup taken before the device reported
    first = device.participate(spec(), 5)
    assert first is not None
    if acknowledged:
        device.acknowledge([first.report_id])
    device.close()
    (state / LEDGER_FILE).write_bytes(backup)  # the backup is restored: the charge is forgotten
    again = _device(tmp_path)
    assert again.spent("camp") == 0.0
    second = again.participate(spec(), 5)
    assert second is not None and second.pack() == first.pack()  # bit for bit: the collector sees a duplicate
    assert again.pending_reports() == [second] and again.spent("camp") == 2.0


def test_rolled_back_device_asked_something_else_draws_independent_coins(tmp_path: Path) -> None:
    """Another question for the same round (other parameters) gets other coins: reusing the first
    answer's coins under another mechanism could reveal the point. The report id stays the same, so
    an honest collector drops the second answer as a duplicate."""
    state = tmp_path / "state"
    device = _device(tmp_path)
    backup = (state / LEDGER_FILE).read_bytes()
    first = device.participate(spec(components=(olh(1.0),)), 5)
    device.close()
    (state / LEDGER_FILE).write_bytes(backup)
    second = _device(tmp_path).participate(spec(components=(olh(1.5),)), 5)
    assert first is not None and second is not None
    assert first.report_id == second.report_id and first.group == second.group
    assert first.payloads[0].seed != second.payloads[0].seed  # type: ignore[union-attr]  # 2^-32 to fail by chance


def test_changed_point_after_a_rollback_is_a_new_report(tmp_path: Path) -> None:
    state = tmp_path / "state"
    device = _device(tmp_path)
    backup = (state / LEDGER_FILE).read_bytes()
    reports = []
    for point in (5, 5, 2):
        reports.append(device.participate(spec(components=(olh(),)), point))
        device.close()
        (state / LEDGER_FILE).write_bytes(backup)
        device = _device(tmp_path)
    assert reports[0] == reports[1] and reports[2] is not None
    # the same coins on the new value: exactly what the memoized stream gives for 2
    coins = Memo(device.ledger.secret).coins("camp", 0, reports[2].group, 0, olh(), None)
    assert reports[2].payloads[0] == olh().mechanism.randomize(2, rng=coins)


def test_two_devices_have_different_secrets(tmp_path: Path) -> None:
    a = _device(tmp_path).participate(spec(round=3), 1)
    b = Device(tmp_path / "other").participate(spec(round=3), 1)
    assert a is not None and b is not None and a.report_id != b.report_id  # another device, another secret


def test_wiped_ledger_and_device_file_beside_an_empty_outbox_is_corruption(tmp_path: Path) -> None:
    state = tmp_path / "state"
    device = _device(tmp_path)
    report = device.participate(spec(), 5)
    assert report is not None
    device.acknowledge([report.report_id])
    device.close()
    (state / LEDGER_FILE).unlink()
    (state / MARKER_FILE).unlink()
    assert os.listdir(state / "outbox") == []
    with pytest.raises(LedgerCorruptedError, match="never a fresh start"):
        _device(tmp_path)


def test_assigned_report_id_used_before_is_refused_before_randomizing(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    device = _device(tmp_path)
    first = device.participate(spec(), 5, assignment=RoundAssignment(report_id=b"\x09" * 16, hash_seeds=(1, 2)))
    assert first is not None
    device.acknowledge([first.report_id])
    drawn: list[Any] = []
    monkeypatch.setattr(Memo, "coins", lambda *args: drawn.append(args))
    with pytest.raises(ProtocolError, match="already used by campaign 'camp' round 0"):
        device.participate(spec(round=1), 5, assignment=RoundAssignment(report_id=b"\x09" * 16, hash_seeds=(1, 2)))
    with pytest.raises(ProtocolError, match="needs an assigned hash seed"):
        device.participate(spec(round=1), 5, assignment=RoundAssignment(report_id=b"\x0a" * 16, hash_seeds=(1,)))
    assert drawn == [] and device.pending_reports() == [] and device.spent("camp") == 2.0


# ---------------------------------------------------------------------------- injected generators


def test_injected_generator_is_recorded_and_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ldp_client")
    device = Device(tmp_path / "sim", rng=SeededRng(4))
    Device(tmp_path / "sim", rng=SeededRng(5))
    warnings = [r for r in caplog.records if "injected generator" in r.getMessage()]
    assert len(warnings) == 1 and "ldp_client.rng.SeededRng" in warnings[0].getMessage()
    device.participate(spec(), 1)
    (entry,) = device.ledger.entries()
    assert entry.rng == "ldp_client.rng.SeededRng"
    assert json.loads((tmp_path / "sim" / LEDGER_FILE).read_text())["entries"][0]["rng"] == "ldp_client.rng.SeededRng"
    real = Device(tmp_path / "real")
    real.participate(spec(), 1)
    assert real.ledger.entries()[0].rng is None
    assert len([r for r in caplog.records if "injected generator" in r.getMessage()]) == 1
    assert Device.in_memory(rng=SeededRng(1)).participate(spec(), 1) is not None  # a simulation: recorded, not logged
    assert len([r for r in caplog.records if "injected generator" in r.getMessage()]) == 1


# ---------------------------------------------------------------------------- unwritable state


def _failing(name: str, err: int, real: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise OSError(err, os.strerror(err))
    return call


def test_full_state_directory_is_a_clear_error_and_sends_nothing(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    device = _device(tmp_path)
    monkeypatch.setattr(os, "fsync", _failing("fsync", errno.ENOSPC, os.fsync))
    with pytest.raises(StateDirectoryError, match=r"cannot write the device state .*ledger\.json: No space left") as info:
        device.participate(spec(), 5)
    assert Path(str(info.value.path)).name == LEDGER_FILE
    monkeypatch.undo()
    assert device.pending_reports() == [] and device.spent_total() == 0.0


def test_read_only_state_directory_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "open", _failing("open", errno.EROFS, os.open))
    with pytest.raises(StateDirectoryError, match=r"cannot write the device state .*state: Read-only file system"):
        _device(tmp_path)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes to read-only directories")
def test_read_only_state_directory_for_real(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    os.chmod(tmp_path / "state", 0o500)
    try:
        with pytest.raises(StateDirectoryError, match="Permission denied"):
            _device(tmp_path)
    finally:
        os.chmod(tmp_path / "state", 0o700)


def test_secret_is_never_in_a_report_or_the_ledger(tmp_path: Path) -> None:
    device = _device(tmp_path)
    report = device.participate(spec(), 5)
    assert report is not None
    secret = device.ledger.secret
    assert secret not in report.pack() and secret.hex() not in (tmp_path / "state" / LEDGER_FILE).read_text()
    assert Fraction(device.spent("camp")) == Fraction(2.0)
    assert ledger_module.SECRET_BYTES == len(secret)
