"""Measure ``ReportStore.add_reports`` throughput (durable, group-committed) of the SQLite store.

Several threads (as gRPC handler threads would) each submit batches of pre-built reports; the
figure is stored reports per second of wall time, from the first call to the last acknowledgement,
so it includes every commit's ``fsync``. Building the ``StoredReport`` objects is not timed. The
process CPU time per report is printed too: on a shared machine it varies less than wall time.

Usage::

    PYTHONPATH=packages/ldp-client/src:packages/ldp-proto/src:packages/ldp-collector/src \\
        python benchmarks/store_throughput.py --threads 8 --batches 40 --batch-size 1000
"""

from __future__ import annotations

import argparse
import os
import struct
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgpack

from ldp_collector.storage import CampaignRecord, Outcome, SqliteReportStore, StoredReport


def count_per_group(reports: Sequence[StoredReport], blobs: Mapping[str, bytes]) -> Mapping[str, bytes]:
    """A small accumulator like the engines' (a count per group), to price the callback path."""
    counts: dict[int, int] = {}
    for r in reports:
        counts[r.group] = counts.get(r.group, 0) + 1
    out = {}
    for group, n in counts.items():
        key = f"count/{group}"
        previous = struct.unpack("<q", blobs[key])[0] if key in blobs else 0
        out[key] = struct.pack("<q", previous + n)
    return out


def make_batches(threads: int, batches: int, batch_size: int, payload_bytes: int) -> list[list[list[StoredReport]]]:
    payload = msgpack.packb([[2, b"\x5a" * payload_bytes]])
    return [[[StoredReport(report_id=os.urandom(16), campaign_id="bench", round=1, group=i % 16, payloads=payload)
              for i in range(batch_size)] for _ in range(batches)] for _ in range(threads)]


def run(data_dir: Path, *, threads: int, batches: int, batch_size: int, payload_bytes: int,
        accumulate: bool, prefill: int) -> tuple[float, float]:
    store = SqliteReportStore(data_dir)
    try:
        store.create_campaign(CampaignRecord(campaign_id="bench", config=b"", state="collecting", current_round=1,
                                             created_at=time.time()))
        store.open_round("bench", 1, b"", time.time())
        fn = count_per_group if accumulate else None
        for k in range(0, prefill, 10_000):  # grow the id index first, to see the effect of its size
            filler = make_batches(1, 1, min(10_000, prefill - k), payload_bytes)[0][0]
            store.add_reports(f"prefill-{k}", filler, fn)
        work = make_batches(threads, batches, batch_size, payload_bytes)
        start = threading.Barrier(threads + 1)

        def submit(t: int) -> None:
            start.wait()
            for b, batch in enumerate(work[t]):
                outcomes = store.add_reports(f"t{t}-b{b}", batch, fn)
                assert outcomes.count(Outcome.ACCEPTED) == len(batch)

        workers = [threading.Thread(target=submit, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        start.wait()
        began, cpu = time.perf_counter(), time.process_time()
        for w in workers:
            w.join()
        elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
        total = threads * batches * batch_size
        assert store.count_reports("bench", 1) == total + prefill
        return total / elapsed, cpu / total * 1e6
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--batches", type=int, default=40, help="batches per thread")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--payload-bytes", type=int, default=16, help="bytes of the one bit-vector payload")
    parser.add_argument("--prefill", type=int, default=0, help="reports stored before timing")
    parser.add_argument("--accumulate", action="store_true", help="pass a count-per-group accumulate callback")
    parser.add_argument("--repeat", type=int, default=3, help="runs (fresh database each); the best is reported")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the data directories (default: a temp dir)")
    args = parser.parse_args()
    rates = []
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            rate, cpu_us = run(Path(tmp) / f"run{i}", threads=args.threads, batches=args.batches,
                               batch_size=args.batch_size, payload_bytes=args.payload_bytes,
                               accumulate=args.accumulate, prefill=args.prefill)
        rates.append(rate)
        print(f"run {i + 1}: {rate:,.0f} reports/s ({cpu_us:.2f} us of process CPU per report)")
    total = args.threads * args.batches * args.batch_size
    print(f"add_reports: {max(rates):,.0f} reports/s (best of {args.repeat}; median {sorted(rates)[len(rates) // 2]:,.0f}; "
          f"{args.threads} threads x {args.batches} batches x {args.batch_size} reports = {total:,} per run, "
          f"prefill {args.prefill:,}, accumulate={'on' if args.accumulate else 'off'}, durable commits)")


if __name__ == "__main__":
    main()
