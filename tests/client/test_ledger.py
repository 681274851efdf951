"""The durable budget ledger: persistence, caps, atomic writes, corruption is never a silent reset."""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import threading
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from ldp_client.budget import exact_sum, split_epsilon
from ldp_client.errors import BudgetExhaustedError, InvalidParameterError, LedgerCorruptedError, StateDirectoryError
from ldp_client.ledger import LEDGER_FILE, MARKER_FILE, Ledger, write_durably

CAPS: dict[str, Any] = {"campaign_cap": 4.0, "total_cap": 32.0, "max_reports": 16}


def rid(i: int) -> bytes:
    return i.to_bytes(16, "big")


def charge(ledger: Ledger, campaign: str = "c", round: int = 0, *, group: int = 0, epsilon: float = 1.0,
           i: int | None = None, **caps: Any) -> None:
    ledger.charge(campaign_id=campaign, round=round, group=group, epsilon=epsilon,
                  report_id=rid(hash((campaign, round)) & 0xFFFF if i is None else i), **{**CAPS, **caps})


def rewrite(path: Path, mutate: Any) -> None:
    """Apply ``mutate`` to the parsed ledger and store it with a *valid* checksum."""
    doc = json.loads(path.read_text())
    mutate(doc)
    rest = {k: v for k, v in doc.items() if k != "checksum"}
    canonical = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    doc["checksum"] = "sha256:" + hashlib.sha256(canonical).hexdigest()
    path.write_text(json.dumps(doc))


def test_new_directory_is_initialised_and_reopens(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "state")
    assert (tmp_path / "state" / LEDGER_FILE).is_file()
    marker = json.loads((tmp_path / "state" / MARKER_FILE).read_text())
    assert marker == {"format": "ldp-client-device", "version": 2, "device_id": ledger.device_id,
                      "secret": ledger.secret.hex()}
    assert (tmp_path / "state" / MARKER_FILE).stat().st_mode & 0o077 == 0  # the secret is the user's alone
    assert len(ledger.device_id) == 32 and int(ledger.device_id, 16) >= 0 and len(ledger.secret) == 32
    doc = json.loads((tmp_path / "state" / LEDGER_FILE).read_text())
    assert doc["format"] == "ldp-client-ledger" and doc["version"] == 2 and doc["entries"] == []
    assert doc["checksum"].startswith("sha256:")
    again = Ledger(tmp_path / "state")
    assert again.device_id == ledger.device_id and again.secret == ledger.secret


@pytest.mark.parametrize("make", ["file", "memory"])
def test_charges_and_queries(tmp_path: Path, make: str) -> None:
    ledger = Ledger(tmp_path) if make == "file" else Ledger.in_memory()
    assert ledger.spent("a") == 0.0 and ledger.spent_total() == 0.0 and ledger.group_of("a") is None
    charge(ledger, "a", 0, group=2, epsilon=0.5, i=1)
    charge(ledger, "a", 1, group=2, epsilon=0.25, i=2)
    charge(ledger, "b", 7, group=0, epsilon=1.0, i=3)
    assert ledger.spent("a") == 0.75 and ledger.spent("b") == 1.0 and ledger.spent_total() == 1.75
    assert ledger.group_of("a") == 2 and ledger.group_of("b") == 0
    assert [e.round for e in ledger.reports_in("a")] == [0, 1]
    assert ledger.has_charge("a", 1) and not ledger.has_charge("a", 2)
    entry = ledger.charge_for("b", 7)
    assert entry is not None and entry.report_id == rid(3) and entry.epsilon == 1.0 and entry.time > 0
    assert ledger.is_charged(rid(2)) and not ledger.is_charged(rid(9))
    assert ledger.uncharged([rid(1), rid(9), rid(3)]) == [rid(9)]
    if make == "file":
        again = Ledger(tmp_path)
        assert again.entries() == ledger.entries()
        assert again.group_of("a") == 2 and again.spent_total() == 1.75


def test_caps_refuse_without_recording(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    charge(ledger, "a", 0, epsilon=3.0, i=1)
    with pytest.raises(BudgetExhaustedError) as info:
        charge(ledger, "a", 1, epsilon=1.5, i=2)
    assert (info.value.scope, info.value.spent, info.value.requested, info.value.cap) == ("campaign", 3.0, 1.5, 4.0)
    assert "spent 3 + requested 1.5 > cap 4" in str(info.value)
    with pytest.raises(BudgetExhaustedError) as info:
        charge(ledger, "b", 0, epsilon=2.0, i=3, total_cap=4.0)
    assert info.value.scope == "total"
    with pytest.raises(BudgetExhaustedError) as info:
        charge(ledger, "a", 1, epsilon=0.5, i=4, max_reports=1)
    assert info.value.scope == "campaign reports" and info.value.cap == 1
    assert ledger.spent_total() == 3.0 and len(Ledger(tmp_path).entries()) == 1


def test_budget_is_compared_exactly() -> None:
    """No relative slack: ten charges of the float 0.1 exceed a cap of 1.0 by 5.6e-17 exactly, so
    the tenth is refused; the shares split_epsilon cuts from 1.0 all fit."""
    ledger = Ledger.in_memory()
    for r in range(9):
        charge(ledger, "a", r, epsilon=0.1, i=r, campaign_cap=1.0)
    with pytest.raises(BudgetExhaustedError):
        charge(ledger, "a", 9, epsilon=0.1, i=9, campaign_cap=1.0)
    with pytest.raises(BudgetExhaustedError):  # the total cap too
        charge(ledger, "b", 0, epsilon=0.1 + 2**-55, i=20, total_cap=1.0)
    shares = split_epsilon(1.0, [1] * 10)
    for r, share in enumerate(shares):
        charge(ledger, "c", r, epsilon=share, i=100 + r, campaign_cap=1.0)
    assert exact_sum(shares) <= 1 and ledger.spent("c") == pytest.approx(1.0, abs=1e-15)
    with pytest.raises(BudgetExhaustedError):
        charge(ledger, "c", 10, epsilon=2**-1074, i=110, campaign_cap=1.0, max_reports=100)


@pytest.mark.parametrize("total,weights", [(1.0, [1] * 10), (0.3, [1, 1, 1]), (2.0, [0.4, 0.6]), (5e-324, [1]),
                                           (0.7, [1] * 7), (1e-300, [3, 1, 1]), (19.999, [1] * 17)])
def test_split_epsilon_never_exceeds_the_total(total: float, weights: list[float]) -> None:
    shares = split_epsilon(total, weights)
    assert len(shares) == len(weights) and all(s > 0 for s in shares) and exact_sum(shares) <= Fraction(total)
    assert sum(shares) == pytest.approx(total, rel=1e-12)
    for bad in ((0.0, [1]), (math.inf, [1]), (1.0, []), (1.0, [0]), (5e-324, [1, 1])):
        with pytest.raises(ValueError):
            split_epsilon(*bad)


def test_bad_charges() -> None:
    ledger = Ledger.in_memory()
    charge(ledger, "a", 0, group=1, i=1)
    with pytest.raises(InvalidParameterError, match="round 0 is already charged"):
        charge(ledger, "a", 0, group=1, i=2)
    with pytest.raises(InvalidParameterError, match="is already charged"):
        charge(ledger, "a", 1, group=1, i=1)
    with pytest.raises(InvalidParameterError, match="differs from the device's group 1"):
        charge(ledger, "a", 1, group=0, i=3)
    with pytest.raises(InvalidParameterError, match="epsilon must be in"):
        charge(ledger, "a", 1, group=1, i=3, epsilon=-1.0)
    with pytest.raises(InvalidParameterError, match="report_id must be 16 bytes"):
        ledger.charge(campaign_id="a", round=2, group=1, epsilon=1.0, report_id=b"x", **CAPS)
    with pytest.raises(InvalidParameterError, match="campaign_id"):
        charge(ledger, "bad id!", 0, i=5)
    with pytest.raises(InvalidParameterError, match="device_id"):
        Ledger.in_memory(device_id="xyz")


def test_set_group_persists_and_first_choice_wins(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    assert ledger.set_group("a", 3) == 3
    assert ledger.set_group("a", 5) == 3
    assert Ledger(tmp_path).group_of("a") == 3


def test_write_is_atomic_when_rename_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger(tmp_path)
    charge(ledger, "a", 0, i=1)
    before = (tmp_path / LEDGER_FILE).read_bytes()

    def crash(src: Any, dst: Any) -> None:
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StateDirectoryError, match="simulated"):
        charge(ledger, "a", 1, i=2)
    monkeypatch.undo()
    assert (tmp_path / LEDGER_FILE).read_bytes() == before
    assert not ledger.has_charge("a", 1) and ledger.spent("a") == 1.0  # memory matches the file
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    charge(ledger, "a", 1, i=2)
    assert Ledger(tmp_path).spent("a") == 2.0


def test_write_fsyncs_file_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger(tmp_path)
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    charge(ledger, "a", 0, i=1)
    assert len(synced) == 2  # the temporary file, then the directory after the rename


def test_stale_temporary_file_is_removed(tmp_path: Path) -> None:
    Ledger(tmp_path)
    stale = tmp_path / ".ledger.json.123.456.tmp"
    stale.write_bytes(b"half a ledger")
    Ledger(tmp_path)
    assert not stale.exists()


def test_write_durably_replaces_content(tmp_path: Path) -> None:
    target = tmp_path / "f"
    write_durably(target, b"one")
    write_durably(target, b"two")
    assert target.read_bytes() == b"two" and sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def _corrupt_truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])


def _corrupt_garbage(p: Path) -> None:
    p.write_bytes(b"\x00\xffnot json at all")


def _corrupt_flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    i = data.index(b'"epsilon":1.0') + len('"epsilon":')
    data[i] = ord("3")  # epsilon 1.0 -> 3.0: valid JSON, wrong checksum
    p.write_bytes(bytes(data))


def _corrupt_delete(p: Path) -> None:
    p.unlink()


def _corrupt_empty(p: Path) -> None:
    p.write_bytes(b"")


@pytest.mark.parametrize("corrupt,problem", [
    (_corrupt_truncate, "not valid JSON"),
    (_corrupt_garbage, "not valid JSON"),
    (_corrupt_flip, "checksum mismatch"),
    (_corrupt_delete, f"missing beside the device state {MARKER_FILE}"),
    (_corrupt_empty, "not valid JSON"),
    (lambda p: rewrite(p, lambda d: d.update(format="something-else")), "format must be"),
    (lambda p: rewrite(p, lambda d: d.update(version=3)), "version 3 is not supported"),
    (lambda p: rewrite(p, lambda d: d["entries"][0].update(rng=7)), "rng must be null or a generator's name"),
    (lambda p: rewrite(p, lambda d: d["entries"][0].update(epsilon=-1.0)), "epsilon must be a finite number > 0"),
    (lambda p: rewrite(p, lambda d: d["entries"][0].update(report_id="zz")), "report_id must be"),
    (lambda p: rewrite(p, lambda d: d.update(entries=[*d["entries"], dict(d["entries"][0])])), "charged twice"),
    (lambda p: rewrite(p, lambda d: d["groups"].update(c=9)), "differs from the campaign's group"),
    (lambda p: rewrite(p, lambda d: d.update(device_id="0" * 32)), "differs from"),
    (lambda p: rewrite(p, lambda d: d.pop("groups")), "expected keys"),
    (lambda p: p.write_text('{"format": "ldp-client-ledger", "version": 1, "epsilon": NaN}'), "not valid JSON"),
])
def test_corrupted_ledger_is_never_reset(tmp_path: Path, corrupt: Any, problem: str) -> None:
    ledger = Ledger(tmp_path)
    charge(ledger, "c", 0, i=1)
    path = tmp_path / LEDGER_FILE
    corrupt(path)
    damaged = path.read_bytes() if path.exists() else None
    for _ in range(2):  # refuses again and again; nothing is rewritten
        with pytest.raises(LedgerCorruptedError) as info:
            Ledger(tmp_path)
        assert str(path) in str(info.value) and problem in str(info.value)
        assert (path.read_bytes() if path.exists() else None) == damaged
    with pytest.raises(LedgerCorruptedError):  # the open instance notices on its next locked access
        ledger.spent("c")


def test_corrupted_marker(tmp_path: Path) -> None:
    Ledger(tmp_path)
    (tmp_path / MARKER_FILE).write_text("{}")
    with pytest.raises(LedgerCorruptedError, match=MARKER_FILE):
        Ledger(tmp_path)


def test_missing_device_file_beside_an_empty_ledger_is_recreated(tmp_path: Path) -> None:
    """The first start was interrupted between the ledger and the device file: nothing was ever
    drawn from a secret, so a new one is safe."""
    ledger = Ledger(tmp_path)
    (tmp_path / MARKER_FILE).unlink()
    again = Ledger(tmp_path)
    assert again.device_id == ledger.device_id and len(again.secret) == 32
    assert json.loads((tmp_path / MARKER_FILE).read_text())["secret"] == again.secret.hex()


@pytest.mark.parametrize("use", [lambda ledger: charge(ledger, "c", 0, i=1), lambda ledger: ledger.set_group("c", 1)],
                         ids=["charged", "group-chosen"])
def test_missing_device_file_beside_a_used_ledger_is_corruption(tmp_path: Path, use: Any) -> None:
    use(Ledger(tmp_path))
    (tmp_path / MARKER_FILE).unlink()
    for _ in range(2):
        with pytest.raises(LedgerCorruptedError, match="missing beside a ledger that was used"):
            Ledger(tmp_path)


def test_version_1_files_are_upgraded_in_place(tmp_path: Path) -> None:
    """An older SDK's ledger (entries without rng) and device file (no secret) are read, and
    rewritten as version 2 with the same charges and a new secret."""
    ledger = Ledger(tmp_path)
    charge(ledger, "c", 0, i=1, epsilon=0.5)
    ledger.close()

    def downgrade(d: dict[str, Any]) -> None:
        d["version"] = 1
        for e in d["entries"]:
            del e["rng"]

    rewrite(tmp_path / LEDGER_FILE, downgrade)
    (tmp_path / MARKER_FILE).write_text(json.dumps({"format": "ldp-client-device", "version": 1,
                                                    "device_id": ledger.device_id}))
    upgraded = Ledger(tmp_path)
    assert upgraded.spent("c") == 0.5 and upgraded.entries()[0].rng is None and len(upgraded.secret) == 32
    assert json.loads((tmp_path / LEDGER_FILE).read_text())["version"] == 2
    marker = json.loads((tmp_path / MARKER_FILE).read_text())
    assert marker["version"] == 2 and marker["secret"] == upgraded.secret.hex()
    assert Ledger(tmp_path).secret == upgraded.secret


def test_two_instances_see_each_others_charges(tmp_path: Path) -> None:
    one, two = Ledger(tmp_path), Ledger(tmp_path)
    charge(one, "c", 0, i=1)
    assert two.spent("c") == 1.0
    with pytest.raises(InvalidParameterError, match="already charged"):
        charge(two, "c", 0, i=2)
    charge(two, "c", 1, i=3)
    assert one.spent("c") == 2.0


def test_threads_never_exceed_the_cap(tmp_path: Path) -> None:
    ledgers = [Ledger(tmp_path) for _ in range(4)]
    refused = []

    def work(k: int) -> None:
        for r in range(10):
            try:
                charge(ledgers[k], "c", 10 * k + r, i=100 * k + r, campaign_cap=5.0, max_reports=100)
            except BudgetExhaustedError:
                refused.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Ledger(tmp_path).spent("c") == 5.0 and len(refused) == 35


def _charge_in_process(state_dir: str, k: int) -> int:
    ledger = Ledger(state_dir)
    done = 0
    for r in range(10):
        try:
            charge(ledger, "c", 10 * k + r, i=100 * k + r, campaign_cap=7.0, max_reports=100)
            done += 1
        except BudgetExhaustedError:
            pass
    return done


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_processes_never_exceed_the_cap(tmp_path: Path) -> None:
    Ledger(tmp_path)
    with multiprocessing.get_context("fork").Pool(4) as pool:
        done = pool.starmap(_charge_in_process, [(str(tmp_path), k) for k in range(4)])
    assert sum(done) == 7 and Ledger(tmp_path).spent("c") == 7.0
