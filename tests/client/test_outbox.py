"""The durable outbox: one file per report, creation order, corruption is reported, never dropped."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest

from ldp_client.errors import InvalidParameterError, OutboxCorruptedError, ProtocolError
from ldp_client.outbox import MAGIC, Outbox, decode_record, encode_record
from ldp_client.payload import Floats, HashedValue, Integers
from ldp_client.report import Report


def make_report(i: int, campaign: str = "camp-1.a", round: int = 0) -> Report:
    return Report(report_id=i.to_bytes(16, "big"), campaign_id=campaign, round=round, group=i % 7,
                  payloads=(i, b"\x01\x02", HashedValue(5, 3), Integers((-1, 2)), Floats((0.5,))))


@pytest.fixture(params=["file", "memory"])
def outbox(request: pytest.FixtureRequest, tmp_path: Path) -> Outbox:
    return Outbox(tmp_path / "outbox") if request.param == "file" else Outbox.in_memory()


def test_put_list_get_remove(outbox: Outbox) -> None:
    reports = [make_report(i, round=i) for i in (5, 1, 3)]
    for r in reports:
        outbox.put(r, 0.5)
    assert len(outbox) == 3
    assert [e.report_id for e in outbox.entries()] == [r.report_id for r in reports]  # creation order
    assert [s.report for s in outbox.pending()] == reports
    assert all(s.epsilon == 0.5 for s in outbox.pending())
    stored = outbox.get(reports[1].report_id)
    assert stored is not None and stored.report == reports[1]
    assert [e.report_id for e in outbox.find("camp-1.a", 3)] == [reports[2].report_id]
    assert outbox.remove(reports[0].report_id) and not outbox.remove(reports[0].report_id)
    assert outbox.get(reports[0].report_id) is None
    assert outbox.remove_all([r.report_id for r in reports]) == 2 and outbox.pending() == []


def test_files_are_named_and_reopened_in_order(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    reports = [make_report(i, round=20 - i) for i in range(12)]
    for r in reports:
        box.put(r, 1.0)
    names = sorted(os.listdir(tmp_path))
    assert names[0] == f"000000000000_camp-1.a_20_{reports[0].report_id.hex()}.ldpr"
    reopened = Outbox(tmp_path)
    assert [s.report for s in reopened.pending()] == reports
    box.remove(reports[0].report_id)
    reopened.put(make_report(99), 1.0)  # numbering continues after the highest pending one
    assert reopened.entries()[-1].sequence == 12


def test_record_format_round_trip() -> None:
    report = make_report(7)
    data = encode_record(report, 1.25)
    assert data[:4] == MAGIC and data[4] == 1
    assert struct.unpack(">I", data[5:9])[0] == zlib.crc32(data[9:])
    assert decode_record(data) == (report, 1.25)


def test_bad_put(outbox: Outbox) -> None:
    outbox.put(make_report(1), 1.0)
    with pytest.raises(InvalidParameterError, match="already in the outbox"):
        outbox.put(make_report(1), 1.0)
    with pytest.raises(InvalidParameterError, match="epsilon must be a finite number > 0"):
        outbox.put(make_report(2), 0.0)
    with pytest.raises(TypeError, match="report must be a Report"):
        outbox.put(b"bytes", 1.0)  # type: ignore[arg-type]


def _valid_record_around(body: bytes, epsilon: float = 1.0) -> bytes:
    rest = struct.pack(">d", epsilon) + body
    return struct.pack(">4sBI", MAGIC, 1, zlib.crc32(rest)) + rest


@pytest.mark.parametrize("damage,problem", [
    (lambda d: d[:10], "shorter than"),
    (lambda d: b"", "shorter than"),
    (lambda d: b"NOPE" + d[4:], "bad magic"),
    (lambda d: d[:4] + b"\x09" + d[5:], "version 9"),
    (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "CRC-32 mismatch"),
    (lambda d: d[:20], "CRC-32 mismatch"),
    (lambda d: _valid_record_around(b"\xc1garbage"), "not valid msgpack"),
    (lambda d: _valid_record_around(b"\x90"), "expected [1, report_id"),
    (lambda d: _valid_record_around(d[17:], epsilon=-1.0), "stored epsilon"),
    (lambda d: encode_record(make_report(2), 1.0), "not the one its name says"),
])
def test_corrupted_file_raises_naming_it(tmp_path: Path, damage: object, problem: str) -> None:
    box = Outbox(tmp_path)
    report = make_report(1)
    entry = box.put(report, 1.0)
    path = tmp_path / entry.name
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    for call in (box.pending, lambda: box.get(report.report_id), lambda: Outbox(tmp_path).pending()):
        with pytest.raises(OutboxCorruptedError) as info:
            call()
        assert entry.name in str(info.value) and problem in str(info.value)
    assert path.exists()  # kept for inspection
    assert box.corrupted_files() == [entry.name]
    moved = box.quarantine(entry.name)
    assert moved is not None and moved.exists() and moved.parent.name == ".quarantine"
    assert box.pending() == [] and Outbox(tmp_path).pending() == []


def test_unexpected_file_counts_as_corrupted(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    (tmp_path / "stray.ldpr").write_bytes(b"?")
    box.rescan()
    with pytest.raises(OutboxCorruptedError, match="stray.ldpr"):
        box.pending()
    assert box.unknown_files() == ["stray.ldpr"]
    box.quarantine("stray.ldpr")
    assert box.pending() == []
    with pytest.raises(InvalidParameterError, match="no file named"):
        box.quarantine("nothing")


def test_file_removed_behind_the_listing(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    kept, gone = box.put(make_report(1), 1.0), box.put(make_report(2), 1.0)
    box.entries()
    before = os.stat(tmp_path)
    (tmp_path / gone.name).unlink()  # e.g. acknowledged by another process ...
    os.utime(tmp_path, ns=(before.st_atime_ns, before.st_mtime_ns))  # ... within one tick of a coarse clock
    assert box.get(gone.report_id) is None
    assert [s.entry for s in box.pending()] == [kept]
    with pytest.raises(OutboxCorruptedError, match=f"{gone.name} is corrupted: missing"):
        box.load(gone)


def test_rescan_sees_other_writers(tmp_path: Path) -> None:
    one, two = Outbox(tmp_path), Outbox(tmp_path)
    one.put(make_report(1), 1.0)
    two.rescan()
    assert [s.report for s in two.pending()] == [make_report(1)]
    two.remove(make_report(1).report_id)
    one.rescan()
    assert one.pending() == []


def test_temporary_files_are_ignored_then_removed(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    (tmp_path / ".000000000000_x_0_00.ldpr.1.2.tmp").write_bytes(b"half")
    box.rescan()
    assert box.pending() == [] and box.unknown_files() == []
    box.remove_temporary_files()
    assert os.listdir(tmp_path) == []


def test_decode_record_raises_protocol_error_only() -> None:
    for data in (b"", MAGIC, MAGIC + b"\x01" + b"\x00" * 40):
        with pytest.raises(ProtocolError):
            decode_record(data)


@pytest.mark.parametrize("campaign", ["c-a_b", "c_1_2", "x_0_00000000000000000000000000000000"])
def test_campaign_ids_with_underscores_survive_a_reopen(tmp_path: Path, campaign: str) -> None:
    """Collector-assigned ids may contain '_' (url-safe tokens): file names must still parse."""
    box = Outbox(tmp_path / "outbox")
    report = make_report(7, campaign=campaign, round=3)
    box.put(report, 1.0)
    reopened = Outbox(tmp_path / "outbox")
    assert [s.report for s in reopened.pending()] == [report]
    assert [e.report_id for e in reopened.find(campaign, 3)] == [report.report_id]
