"""Kill -9 a process while it ingests, many times over; nothing acknowledged may be lost or doubled.

A child process ingests batches from several threads (so group commit is exercised) and, after each
``add_reports`` returns, appends the report ids it was told were ACCEPTED to an ack log, flushed
and fsynced. It also resubmits ids acknowledged by earlier incarnations, which must come back
DUPLICATE. The parent SIGKILLs it at random moments (some during start-up, i.e. while the schema
is being created), restarts it, and finally checks the database against the log: every
acknowledged report stored exactly once, the id index and the round's count consistent with the
reports, and the accumulators equal to a recomputation from the raw reports.
"""

from __future__ import annotations

import inspect
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from ldp_collector.storage import SqliteReportStore

from .store_contract import all_reports, decoded_counts

pytestmark = pytest.mark.integration

KILLS = 24
DUPLICATE_MISMATCH_EXIT = 3

CHILD = r'''
import os, random, struct, sys, threading, uuid
from collections import Counter

from ldp_collector.errors import AlreadyExistsError
from ldp_collector.storage import CampaignRecord, Outcome, SqliteReportStore, StoredReport

data_dir, ack_path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])


def count_per_group(reports, blobs):
    counts = Counter(r.group for r in reports)
    return {f"g{g}": struct.pack("<q", n + (struct.unpack("<q", blobs[f"g{g}"])[0] if f"g{g}" in blobs else 0))
            for g, n in counts.items()}


def acknowledged():
    if not os.path.exists(ack_path):
        return []
    with open(ack_path, "rb") as f:
        return parse_acks(f.read())


PARSE_ACKS

store = SqliteReportStore(data_dir)
for create in (lambda: store.create_campaign(CampaignRecord(campaign_id="crash", config=b"", state="collecting",
                                                            current_round=1, created_at=0.0)),
               lambda: store.open_round("crash", 1, b"", 0.0)):
    try:
        create()
    except AlreadyExistsError:
        pass
old = acknowledged()
ack = open(ack_path, "ab")
lock = threading.Lock()
print("ready", flush=True)


def ingest(t):
    rng = random.Random(seed * 100 + t)
    while True:
        batch = [StoredReport(report_id=os.urandom(16), campaign_id="crash", round=1, group=rng.randrange(4),
                              payloads=rng.randbytes(rng.randrange(0, 40))) for _ in range(rng.randrange(1, 300))]
        resent = set()
        if old and rng.random() < 0.3:
            resent = {rng.choice(old) for _ in range(rng.randrange(1, 10))}
            for rid in resent:
                batch.insert(rng.randrange(len(batch) + 1), StoredReport(report_id=rid, campaign_id="crash", round=1,
                                                                         group=rng.randrange(4), payloads=b""))
        outcomes = store.add_reports(uuid.uuid4().hex, batch, count_per_group)
        if any(o != Outcome.DUPLICATE for r, o in zip(batch, outcomes) if r.report_id in resent):
            os._exit(DUPLICATE_MISMATCH_EXIT)  # an acknowledged report was not found: lost
        line = b" ".join(r.report_id.hex().encode() for r, o in zip(batch, outcomes) if o == Outcome.ACCEPTED)
        with lock:
            ack.write(b"\n" + line + b"\n")
            ack.flush()
            os.fsync(ack.fileno())


for t in range(4):
    threading.Thread(target=ingest, args=(t,), daemon=True).start()
threading.Event().wait()
'''


def parse_acks(data: bytes) -> list[bytes]:
    """The acknowledged ids in the ack log (also run by the child: its source is pasted there).

    Every id on an ack line was ACCEPTED before the line was written, but a SIGKILL can cut the
    write() of a long line partway (Linux stops copying at a page boundary on a fatal signal). So
    each line starts and ends with a newline (a cut line is closed by the next incarnation's first
    write) and a token shorter than a whole id -- the cut one -- is ignored.
    """
    return [bytes.fromhex(t.decode()) for t in data.split() if len(t) == 32]


CHILD = CHILD.replace("DUPLICATE_MISMATCH_EXIT", str(DUPLICATE_MISMATCH_EXIT)).replace(
    "PARSE_ACKS", inspect.getsource(parse_acks))


def test_acknowledged_reports_survive_kill_9(tmp_path: Path) -> None:
    data_dir, ack_path = tmp_path / "data", tmp_path / "acks.log"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    rng = random.Random(20240611)
    started = time.monotonic()
    for kill in range(KILLS):
        child = subprocess.Popen([sys.executable, str(script), str(data_dir), str(ack_path), str(kill)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            if kill % 8 == 1:  # now and then during start-up: opening, migrating, creating the campaign
                time.sleep(rng.uniform(0.0, 0.15))
            else:
                assert child.stdout is not None
                assert child.stdout.readline() == b"ready\n", child.stderr.read() if child.stderr else b""
                time.sleep(rng.uniform(0.02, 0.4))
            assert child.poll() is None, f"child exited early ({child.returncode}): {child.communicate()[1]!r}"
        finally:
            child.send_signal(signal.SIGKILL)
            child.communicate()
        assert child.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 50

    acked = Counter(parse_acks(ack_path.read_bytes()))
    assert len(acked) > 1000, "the children acknowledged too little to prove anything"
    assert set(acked.values()) == {1}, "a report was acknowledged as ACCEPTED twice"

    store = SqliteReportStore(data_dir)
    try:
        stored = all_reports(store, "crash", 1)
        ids = Counter(r.report_id for r in stored)
        assert set(ids.values()) == {1}, "a report is stored twice"
        assert not set(acked) - set(ids), "an acknowledged report is missing"
        assert store.count_reports("crash", 1) == len(stored)
        assert decoded_counts(store.load_accumulators("crash", 1)) == dict(Counter(r.group for r in stored))
    finally:
        store.close()
    with sqlite3.connect(data_dir / "collector.sqlite3") as conn:
        assert conn.execute("SELECT COUNT(*) FROM report_ids").fetchone()[0] == len(stored)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
