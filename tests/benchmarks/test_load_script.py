"""The load test's machinery (``benchmarks/load.py``): request templates, statistics, process sampling,
and tiny end-to-end runs against real ``ldp-collector serve`` processes on loopback."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import load
import pytest

from ldp.v1 import service_pb2
from ldp_client.report import Report, unpack_batch


def test_template_fill_patches_ids_and_request_id_only() -> None:
    payloads = [i % 64 for i in range(250)]
    templates = load.build_templates("load-test", 3, 0, payloads, batch=100)
    assert [t.n for t in templates] == [100, 100]  # the short last chunk is dropped
    template = templates[1]
    ids = os.urandom(16 * template.n)
    request_id = "abcd1234-007-0000000042"
    data = template.fill(request_id, ids)
    assert len(data) == len(template.data)
    got_id, items = unpack_batch(service_pb2.SubmitPackedRequest.FromString(data).packed)
    reports = [r for r in items if isinstance(r, Report)]
    assert len(reports) == len(items) == template.n
    assert got_id == request_id
    assert [r.report_id for r in reports] == [ids[16 * k:16 * k + 16] for k in range(template.n)]
    assert [r.payloads[0] for r in reports] == payloads[100:200]
    assert {(r.campaign_id, r.round, r.group) for r in reports} == {("load-test", 3, 0)}
    # A second fill starts again from the template, not from the previous request.
    other = os.urandom(16 * template.n)
    first = unpack_batch(service_pb2.SubmitPackedRequest.FromString(template.fill(request_id, other)).packed)[1][0]
    assert isinstance(first, Report) and first.report_id == other[:16]


def test_template_fill_refuses_wrong_sizes() -> None:
    template = load.build_templates("load-test", 1, 0, [1, 2, 3], batch=3)[0]
    with pytest.raises(ValueError, match="request_id must be"):
        template.fill("short", os.urandom(48))
    with pytest.raises(ValueError, match="ids 48 bytes"):
        template.fill("abcd1234-000-0000000000", os.urandom(32))


def test_id_digest_is_order_independent_and_sensitive() -> None:
    ids = [os.urandom(16) for _ in range(50)]
    assert load.id_digest(b"".join(ids)) == load.id_digest(b"".join(reversed(ids)))
    assert load.id_digest(b"".join(ids)) == sum(int.from_bytes(i, "big") for i in ids)
    # One report stored twice and another lost changes the digest.
    assert load.id_digest(b"".join(ids[:-1] + ids[:1])) != load.id_digest(b"".join(ids))


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert load.percentile(values, 0.50) == 50.0
    assert load.percentile(values, 0.99) == 99.0
    assert load.percentile(values, 1.0) == 100.0
    assert load.percentile([7.0], 0.99) == 7.0
    assert load.percentile([], 0.5) != load.percentile([], 0.5)  # nan


def test_window_rates_use_full_windows_only() -> None:
    per_second = {s: 100 for s in range(25)} | {3: 600}
    assert load.window_rates(per_second, 25) == [150.0, 100.0]
    assert load.window_rates(per_second, 9) == []


def _sleep_child(ready: Any) -> None:
    ready.set()
    time.sleep(30)


def test_process_sampling_sees_children() -> None:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=_sleep_child, args=(ready,), daemon=True)
    child.start()
    try:
        assert child.pid is not None
        # Sampled once the child runs Python: just after the spawn its RSS can still be under 1 MiB.
        assert ready.wait(120)
        assert child.pid in load.descendants(os.getpid())
        assert load.rss_bytes(child.pid) > 1024 * 1024
        rss, pss = load.memory_bytes(child.pid)  # one snapshot of both
        assert 1024 * 1024 < rss and 0 < pss <= rss
        assert load.cpu_seconds(os.getpid()) > 0.0
    finally:
        child.terminate()
        child.join()
    assert load.rss_bytes(child.pid) == 0 and load.memory_bytes(child.pid) == (0, 0)  # gone: nothing, no error


def _run(tmp_path: Path, *extra: str, topology: str = "single") -> tuple[int, dict[str, object]]:
    out = tmp_path / "results"
    status = load.main(["--topology", topology, "--clients", "2", "--batch", "100", "--pool", "300",
                        "--out", str(out), "--name", "run", "--workdir", str(tmp_path / "work"), *extra])
    record = json.loads((out / "run.json").read_text())
    assert (out / "load_runs.md").read_text().count("\n| ") >= 2  # header and one row
    return status, record


@pytest.mark.integration
def test_sustained_run_stores_every_acknowledged_report_once(tmp_path: Path) -> None:
    status, record = _run(tmp_path, "--rate", "4000", "--duration", "3")
    summary, loss = record["summary"], record["loss_check"]
    assert isinstance(summary, dict) and isinstance(loss, dict)
    assert status == 0 and record["passed"]
    assert summary["reports_offered"] == 12_000 and summary["accepted"] == 12_000
    assert loss == {**loss, "acknowledged": 12_000, "stored": 12_000, "stored_count_column": 12_000,
                    "api_count": 12_000, "lost": 0, "duplicates": 0, "digest_match": True, "passed": True}
    assert summary["server_rss_mib_max_total"] > 10
    assert 0 < summary["server_pss_mib_max_total"] <= summary["server_rss_mib_max_total"]
    assert 0 < summary["latency_ms"]["p50"] <= summary["latency_ms"]["p99"] <= summary["latency_ms"]["max"]


@pytest.mark.integration
def test_overloaded_server_is_retried_and_still_exact(tmp_path: Path) -> None:
    # One handler thread and one queued call, offered 200 000 reports/s in requests of 100: more than one
    # handler thread ingests on any machine (about 110 000 reports/s on two cores with every thread), so
    # requests must overlap and are shed with UNAVAILABLE + RetryInfo whatever the machine's speed. (At
    # 20 000 reports/s an idle machine served each request before the other client's next one and shed
    # nothing: the two clients' paced sends interleave.) Attempts are not the limit: a request shed
    # 100 times in a row must not fail the run on a slow machine.
    status, record = _run(tmp_path, "--rate", "200000", "--duration", "1", "--max-attempts", "1000",
                          "--server-option", "max_queued_calls=1", "--server-option", "worker_threads=1")
    summary, loss = record["summary"], record["loss_check"]
    assert isinstance(summary, dict) and isinstance(loss, dict)
    assert status == 0, summary
    assert summary["retries"] > 0 and set(summary["errors_by_status"]) == {"UNAVAILABLE"}
    assert loss["stored"] == loss["acknowledged"] == 200_000 and loss["digest_match"] and loss["duplicates"] == 0


@pytest.mark.integration
def test_find_capacity_ramps_the_rate_step_by_step(tmp_path: Path) -> None:
    # The ramp's logic, not the machine's speed: rates a loaded 2-core box sustains and a p99 target
    # no step can miss (at 2000 -> 4000 reports/s with the default target, a busy machine failed the
    # second step and found capacity 2000).
    status, record = _run(tmp_path, "--find-capacity", "--rate", "250", "--step-duration", "2",
                          "--ramp-factor", "2", "--max-steps", "2", "--target-p99-ms", "60000")
    steps = record["steps"]
    assert isinstance(steps, list) and [s["rate"] for s in steps] == [250.0, 500.0]
    assert status == 0 and record["capacity_rate"] == 500.0
    assert all(s["api_count"] == s["summary"]["accepted"] for s in steps)


@pytest.mark.integration
def test_find_capacity_goes_down_when_the_first_step_fails(tmp_path: Path) -> None:
    # No request is answered within a microsecond: every step fails, the rate halves each step.
    status, record = _run(tmp_path, "--find-capacity", "--rate", "4000", "--step-duration", "1",
                          "--ramp-factor", "2", "--max-steps", "2", "--target-p99-ms", "0.001")
    steps = record["steps"]
    assert isinstance(steps, list) and [(s["rate"], s["passed"]) for s in steps] == [(4000.0, False), (2000.0, False)]
    assert status == 1 and record["capacity_rate"] == 0.0 and not record["passed"]


@pytest.mark.integration
@pytest.mark.parametrize("topology", ["workers2", "pg2"])
def test_multi_process_topologies_share_one_store(tmp_path: Path, topology: str) -> None:
    if topology == "pg2":
        from support import postgres

        if not os.environ.get(postgres.URL_ENV) and postgres.find_postgres_bin() is None:
            pytest.skip(f"--topology pg2 needs a PostgreSQL server: {postgres.INSTALL_HINT}")
        pytest.importorskip("psycopg", reason="the PostgreSQL store needs psycopg (the postgres extra)")
    status, record = _run(tmp_path, "--rate", "4000", "--duration", "2", topology=topology)
    summary, loss = record["summary"], record["loss_check"]
    assert isinstance(summary, dict) and isinstance(loss, dict)
    assert status == 0 and loss["passed"] and loss["stored"] == loss["acknowledged"] == 8000
    # workers2: the supervisor and its two workers; pg2: two collectors (PostgreSQL sampled apart).
    assert summary["server_processes"] == (3 if topology == "workers2" else 2)
    if topology == "pg2" and not os.environ.get("LDP_TEST_POSTGRES_URL"):
        assert summary["database_cpu_s"] > 0
