"""Availability of the collector under hostile requests, on loopback, in bounded time.

One command::

    PYTHONPATH=packages/ldp-client/src:packages/ldp-proto/src:packages/ldp-collector/src \\
        python benchmarks/hostile_requests.py [--seconds 60] [--copies 3]

What it does:

1. Starts ``ldp-collector serve`` with its default limits (a separate process, 127.0.0.1 only, a
   fresh SQLite data directory) and creates a histogram campaign (GRR over 16 values).
2. Runs two phases of ``--seconds`` each. In both, ``--copies`` client processes per attack send
   their hostile request again and again (one in flight each, a 30 s deadline), while one honest
   client process submits valid ``SubmitPacked`` batches of ``--honest-batch`` new reports with a
   5 s deadline, one after the other (``--honest-pause`` s apart), and one health checker process
   calls ``grpc.health.v1.Health/Check`` every ``--health-period`` s with a 5 s deadline.

   * ``as issued``: the three attacks at the sizes of issue 15 --
     ``deep``: a 10 MB ``SubmitPacked`` batch declaring 9 999 reports, each nested 1 000 arrays deep;
     ``empty``: a 30 MB ``SubmitReports`` of 15 million empty reports;
     ``payload-lists``: 10 MB of reports carrying 2 000-entry payload lists, sent with
     ``SubmitPacked`` and ``SubmitReports`` in turn.
     With the default receive limit (:data:`ldp_client.report.MAX_BATCH_BYTES`) the transport
     refuses all three before the collector reads them.
   * ``at the limit``: the same three shapes cut to just below the receive limit, so that the
     collector's own bounds answer them (the declared count, the container budget, the payload
     count, the report count read from the wire before parsing).

3. Samples the resident memory (``VmRSS``) of the server every 0.5 s, and once more 5 s after the
   attacks stop (memory held afterwards).
4. Stops the server with SIGTERM and counts its log lines (and tracebacks among them).

Recorded in ``--out`` (``hostile_requests.json``, relative paths only): per phase the server's peak
RSS, the health check's p50/p99/max latency and failures, the honest calls' outcomes (codes, p99
latency, calls past their deadline) and each attack's answers by status code; the RSS after the
attacks; the server's log lines. The exit status is 0 when, in every phase, the peak RSS is below
``--max-rss-mib``, the health p99 below ``--max-health-p99-ms``, and no honest call failed or passed
its deadline.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shlex
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
from overload import RssSampler, create_campaign, report_id, start_server, stop_server, tree_rss, wait_serving

from ldp_client.report import MAX_BATCH_BYTES

#: Sizes of issue 15's attacks.
DEEP_REPORTS, DEEP_NESTING = 9_999, 1_000
EMPTY_REPORTS = 15_000_000
PAYLOAD_LIST_BYTES, PAYLOAD_LIST_ENTRIES = 10_000_000, 2_000
#: Room left below the receive limit for the request envelope in the "at the limit" phase.
_ENVELOPE = 1024
_ATTACK_DEADLINE_S = 30.0
_HONEST_DEADLINE_S = 5.0
_HEALTH_DEADLINE_S = 5.0
_MESSAGE_OPTIONS = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
_PHASES = ("as issued", "at the limit")
_ATTACKS = ("deep", "empty", "payload-lists")
_METHODS = {"packed": "/ldp.v1.DeviceService/SubmitPacked", "reports": "/ldp.v1.DeviceService/SubmitReports"}


# -- the hostile messages ---------------------------------------------------------------------------

def _packed_request(packed: bytes) -> bytes:
    from ldp.v1 import service_pb2

    return service_pb2.SubmitPackedRequest(packed=packed).SerializeToString()


def _packed_header(request_id: str, reports: int) -> bytes:
    """``[1, request_id, [`` with an array header declaring ``reports`` items."""
    head: bytes = msgpack.packb([1, request_id], use_bin_type=True)
    count = b"\xdc" + reports.to_bytes(2, "big") if reports < 1 << 16 else b"\xdd" + reports.to_bytes(4, "big")
    return b"\x93" + head[1:] + count


def deep_request(max_bytes: int | None = None) -> bytes:
    """``SubmitPacked`` of 9 999 reports (10 MB), or as many as ``max_bytes`` holds, each nested 1 000
    arrays deep."""
    item = b"\x91" * DEEP_NESTING + b"\x00"
    reports = DEEP_REPORTS if max_bytes is None else min(DEEP_REPORTS, (max_bytes - _ENVELOPE) // len(item))
    return _packed_request(_packed_header("deep", reports) + item * reports)


def empty_reports_request(max_bytes: int) -> bytes:
    """``SubmitReports`` of up to 15 million empty reports (``reports`` entries of 0 bytes)."""
    from ldp.v1 import service_pb2

    head = service_pb2.SubmitReportsRequest(request_id="empty").SerializeToString()
    return head + b"\x12\x00" * min(EMPTY_REPORTS, (max_bytes - len(head)) // 2)


def payload_list_requests(max_bytes: int, campaign_id: str) -> tuple[bytes, bytes]:
    """``SubmitPacked`` and ``SubmitReports`` of reports with 2 000-entry payload lists, each at most
    ``max_bytes``."""
    from ldp.v1 import reports_pb2, service_pb2

    rng = os.urandom
    item: bytes = msgpack.packb([1, rng(16), campaign_id, 1, 0, [1] * PAYLOAD_LIST_ENTRIES], use_bin_type=True)
    n = (max_bytes - _ENVELOPE) // len(item)
    packed = _packed_request(_packed_header("lists", n) + b"".join(
        msgpack.packb([1, rng(16), campaign_id, 1, 0, [1] * PAYLOAD_LIST_ENTRIES], use_bin_type=True)
        for _ in range(n)))
    report = reports_pb2.Report(report_id=rng(16), campaign_id=campaign_id, round=1, group=0,
                                payloads=[reports_pb2.Payload(index=1)] * PAYLOAD_LIST_ENTRIES)
    n = (max_bytes - _ENVELOPE) // (report.ByteSize() + 4)
    reports = service_pb2.SubmitReportsRequest(request_id="lists", reports=[report] * n).SerializeToString()
    return packed, reports


def attack_messages(phase: str, campaign_id: str) -> dict[str, list[tuple[str, bytes]]]:
    """Each attack's requests as ``(method, serialized request)``, sent in turn."""
    as_issued = phase == _PHASES[0]
    packed_lists, reports_lists = payload_list_requests(PAYLOAD_LIST_BYTES if as_issued else MAX_BATCH_BYTES,
                                                        campaign_id)
    return {
        "deep": [("packed", deep_request(None if as_issued else MAX_BATCH_BYTES))],
        "empty": [("reports", empty_reports_request(10**9 if as_issued else MAX_BATCH_BYTES))],
        "payload-lists": [("packed", packed_lists), ("reports", reports_lists)],
    }


# -- client processes -------------------------------------------------------------------------------

def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def attacker_main(spec: dict[str, Any], out: Any) -> None:
    """Send the attack's requests in turn, one in flight, until the phase ends."""
    import grpc

    messages = attack_messages(spec["phase"], spec["campaign_id"])[spec["attack"]]
    codes: Counter[str] = Counter()
    latencies: list[float] = []
    with grpc.insecure_channel(spec["address"], options=_MESSAGE_OPTIONS) as channel:
        calls = {kind: channel.unary_unary(path, request_serializer=None, response_deserializer=None)
                 for kind, path in _METHODS.items()}
        end = time.monotonic() + spec["seconds"]
        i = 0
        while time.monotonic() < end:
            kind, data = messages[i % len(messages)]
            i += 1
            start = time.monotonic()
            try:
                calls[kind](data, timeout=_ATTACK_DEADLINE_S)
                codes["OK"] += 1
            except grpc.RpcError as exc:
                codes[exc.code().name] += 1
            latencies.append(time.monotonic() - start)
    out.put({"role": "attack", "attack": spec["attack"], "codes": dict(codes), "latencies": latencies,
             "request_bytes": sorted({len(m) for _, m in messages})})


def honest_main(spec: dict[str, Any], out: Any) -> None:
    """Submit valid batches of new reports, one after the other, each with a 5 s deadline."""
    import grpc

    from ldp.v1 import service_pb2, service_pb2_grpc

    template: list[Any] = spec["template"]
    codes: Counter[str] = Counter()
    latencies: list[float] = []
    accepted = late = 0
    with grpc.insecure_channel(spec["address"]) as channel:
        stub = service_pb2_grpc.DeviceServiceStub(channel)
        end = time.monotonic() + spec["seconds"]
        batch = 0
        while time.monotonic() < end:
            wires = []
            for i in range(spec["batch"]):
                wire = list(template)
                wire[1] = report_id(spec["phase_no"], 0, batch, i)
                wires.append(wire)
            request_id = f"honest-{spec['phase_no']}-{batch}"
            packed = msgpack.packb([1, request_id, wires], use_bin_type=True)
            batch += 1
            start = time.monotonic()
            try:
                response = stub.SubmitPacked(service_pb2.SubmitPackedRequest(packed=packed),
                                             timeout=_HONEST_DEADLINE_S)
                codes["OK"] += 1
                accepted += response.accepted
            except grpc.RpcError as exc:
                codes[exc.code().name] += 1
            elapsed = time.monotonic() - start
            late += elapsed > _HONEST_DEADLINE_S
            latencies.append(elapsed)
            time.sleep(spec["pause"])
    out.put({"role": "honest", "codes": dict(codes), "latencies": latencies, "accepted": accepted,
             "reports_sent": batch * spec["batch"], "late": late})


def health_main(spec: dict[str, Any], out: Any) -> None:
    """Poll the health check; a failed check counts with its full time."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    codes: Counter[str] = Counter()
    latencies: list[float] = []
    with grpc.insecure_channel(spec["address"]) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        end = time.monotonic() + spec["seconds"]
        while time.monotonic() < end:
            start = time.monotonic()
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=_HEALTH_DEADLINE_S).status
                codes["SERVING" if status == health_pb2.HealthCheckResponse.SERVING else "NOT_SERVING"] += 1
            except grpc.RpcError as exc:
                codes[exc.code().name] += 1
            latencies.append(time.monotonic() - start)
            time.sleep(spec["period"])
    out.put({"role": "health", "codes": dict(codes), "latencies": latencies})


def run_phase(ctx: Any, phase_no: int, address: str, campaign_id: str, template: list[Any],
              args: argparse.Namespace) -> list[dict[str, Any]]:
    queue = ctx.Queue()
    common = {"address": address, "seconds": args.seconds, "phase": _PHASES[phase_no - 1], "phase_no": phase_no,
              "campaign_id": campaign_id}
    jobs: list[tuple[Any, dict[str, Any]]] = [
        (honest_main, {**common, "template": template, "batch": args.honest_batch, "pause": args.honest_pause}),
        (health_main, {**common, "period": args.health_period})]
    for attack in args.attacks:
        jobs += [(attacker_main, {**common, "attack": attack})] * args.copies
    procs = [ctx.Process(target=target, args=(spec, queue), daemon=True) for target, spec in jobs]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=args.seconds + _ATTACK_DEADLINE_S + 120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.terminate()
    return results


def summarize(results: list[dict[str, Any]], rss: list[int]) -> dict[str, Any]:
    def ms(values: list[float], q: float) -> float | None:
        value = _percentile(values, q)
        return None if value is None else round(1e3 * value, 1)

    health = next(r for r in results if r["role"] == "health")
    honest = next(r for r in results if r["role"] == "honest")
    attacks: dict[str, dict[str, Any]] = {}
    for r in results:
        if r["role"] == "attack":
            entry = attacks.setdefault(r["attack"], {"calls": 0, "codes": Counter(), "latencies": [],
                                                     "request_bytes": r["request_bytes"]})
            entry["calls"] += sum(r["codes"].values())
            entry["codes"].update(r["codes"])
            entry["latencies"] += r["latencies"]
    return {
        "rss_peak_mib": round(max(rss) / 2**20, 1) if rss else None,
        "health": {"checks": sum(health["codes"].values()), "codes": health["codes"],
                   "p50_ms": ms(health["latencies"], 0.50), "p99_ms": ms(health["latencies"], 0.99),
                   "max_ms": ms(health["latencies"], 1.0)},
        "honest": {"calls": sum(honest["codes"].values()), "codes": honest["codes"],
                   "past_deadline": honest["late"], "reports_sent": honest["reports_sent"],
                   "accepted": honest["accepted"], "p50_ms": ms(honest["latencies"], 0.50),
                   "p99_ms": ms(honest["latencies"], 0.99), "max_ms": ms(honest["latencies"], 1.0)},
        "attacks": {name: {"calls": a["calls"], "codes": dict(a["codes"]), "request_bytes": a["request_bytes"],
                           "p50_ms": ms(a["latencies"], 0.50), "max_ms": ms(a["latencies"], 1.0)}
                    for name, a in attacks.items()},
    }


# -- the run ------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each phase (default 60 s)")
    parser.add_argument("--copies", type=int, default=3, help="client processes per attack (default 3)")
    parser.add_argument("--honest-batch", type=int, default=200, help="reports per honest batch (default 200)")
    parser.add_argument("--honest-pause", type=float, default=0.05, help="seconds between honest calls")
    parser.add_argument("--health-period", type=float, default=0.05, help="seconds between health checks")
    parser.add_argument("--max-rss-mib", type=float, default=300.0, help="bound on the server's peak RSS")
    parser.add_argument("--max-health-p99-ms", type=float, default=100.0, help="bound on the health p99")
    parser.add_argument("--phase", choices=("both", *_PHASES), default="both", help="run one phase only")
    parser.add_argument("--attacks", nargs="+", choices=_ATTACKS, default=list(_ATTACKS), help="attacks to run")
    parser.add_argument("--out", default="benchmarks/results", help="directory of hostile_requests.json")
    args = parser.parse_args(argv)
    if not 1 <= args.copies <= 8 or not 1.0 <= args.seconds <= 600.0:
        parser.error("--copies must be in [1, 8] and --seconds in [1, 600]")

    ctx = mp.get_context("spawn")  # the parent holds gRPC channels: never fork it
    phases: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ldp-hostile-") as tmp:
        log_path = Path(tmp) / "server.log"
        with log_path.open("wb") as log_file:
            server, address = start_server(Path(tmp) / "data", argparse.Namespace(workers=1, max_queued=None),
                                           stderr=log_file)
            sampler = RssSampler(server.pid)
            try:
                wait_serving(address)
                campaign_id, template = create_campaign(address)
                sampler.start()
                for phase_no, phase in enumerate(_PHASES, 1):
                    if args.phase not in ("both", phase):
                        continue
                    sampler.phase = phase
                    started = len(sampler.samples)
                    results = run_phase(ctx, phase_no, address, campaign_id, template, args)
                    phases[phase] = summarize(results, [rss for _, rss, _ in sampler.samples[started:]])
                sampler.phase = "after"
                time.sleep(5.0)
                rss_after = tree_rss(server.pid)
            finally:
                if sampler.is_alive():
                    sampler.stop()
                exit_code = stop_server(server)
        log_lines = log_path.read_text(errors="replace").splitlines()

    checks = {phase: {"rss_below_bound": p["rss_peak_mib"] < args.max_rss_mib,
                      "health_p99_below_bound": p["health"]["p99_ms"] is not None
                      and p["health"]["p99_ms"] < args.max_health_p99_ms
                      and set(p["health"]["codes"]) == {"SERVING"},
                      "no_honest_call_failed_or_late": p["honest"]["past_deadline"] == 0
                      and set(p["honest"]["codes"]) == {"OK"}}
              for phase, p in phases.items()}
    result = {
        "command": shlex.join(["python", "benchmarks/hostile_requests.py",
                               *(argv if argv is not None else sys.argv[1:])]),
        "receive_limit_bytes": MAX_BATCH_BYTES, "seconds_per_phase": args.seconds, "copies": args.copies,
        "honest_batch": args.honest_batch, "cpus": os.cpu_count(), "load_average_end": os.getloadavg(),
        "phases": phases, "rss_after_attacks_mib": round(rss_after / 2**20, 1),
        "server_log_lines": len(log_lines), "server_tracebacks": sum("Traceback" in line for line in log_lines),
        "server_exit_code": exit_code, "checks": checks,
        "passed": exit_code == 0 and all(all(c.values()) for c in checks.values()),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hostile_requests.json").write_text(json.dumps(result, indent=2) + "\n")
    print_summary(result)
    return 0 if result["passed"] else 1


def print_summary(r: dict[str, Any]) -> None:
    print(f"hostile requests against one collector (receive limit {r['receive_limit_bytes']:,} bytes), "
          f"{r['copies']} clients per attack, {r['seconds_per_phase']:g} s per phase, loopback")
    for phase, p in r["phases"].items():
        h, o = p["health"], p["honest"]
        print(f"[{phase}] server RSS peak {p['rss_peak_mib']} MiB; health p50 {h['p50_ms']} ms, p99 {h['p99_ms']} ms, "
              f"max {h['max_ms']} ms over {h['checks']} checks {h['codes']}; honest calls {o['calls']} {o['codes']}, "
              f"p99 {o['p99_ms']} ms, past the 5 s deadline {o['past_deadline']}, "
              f"{o['accepted']:,} of {o['reports_sent']:,} reports accepted")
        for name, a in p["attacks"].items():
            print(f"    {name:<14} {a['calls']:>6} calls of {'/'.join(f'{b:,}' for b in a['request_bytes'])} bytes: "
                  f"{a['codes']} (p50 {a['p50_ms']} ms, max {a['max_ms']} ms)")
    print(f"RSS 5 s after the attacks: {r['rss_after_attacks_mib']} MiB; server log: {r['server_log_lines']} lines, "
          f"{r['server_tracebacks']} tracebacks; exit code {r['server_exit_code']}; "
          f"{'PASSED' if r['passed'] else 'FAILED'} {r['checks']}")


if __name__ == "__main__":
    sys.exit(main())
