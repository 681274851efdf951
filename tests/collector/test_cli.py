"""The ``ldp-collector`` command line: parsing, exit codes, one-line errors, and every command.

``simulate``, ``demo`` and the campaign commands run for real: in-process collectors with a
temporary SQLite directory, or a server on 127.0.0.1 port 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ldp.v1 import campaigns_pb2
from ldp_collector import cli
from ldp_collector.config import CollectorConfig
from ldp_collector.engines import ENGINES
from ldp_collector.service import RunningServer, start_server

TOKEN = "cli-operator-token-0123456789abcdef"
REPO = Path(__file__).resolve().parents[2]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``main(argv)`` with SystemExit (argparse) turned into its code."""
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:
        code = int(exc.code) if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, expected: str) -> None:
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {err!r}"
    assert lines[0].startswith("ldp-collector: error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in err


# -- parsing and usage errors ----------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    [],
    ["simulate", "--dataset", "moons"],                                   # --kind missing
    ["simulate", "--kind", "histogram", "--dataset", "nope"],
    ["simulate", "--kind", "histogram", "--dataset", "moons", "--data", "x.csv"],
    ["simulate", "--kind", "histogram", "--dataset", "moons", "--n", "0"],
    ["simulate", "--kind", "histogram", "--dataset", "moons", "--epsilon", "-1"],
    ["simulate", "--kind", "histogram", "--data", "x.csv", "--label-column", "first"],
    ["campaign", "create", "--epsilon", "1"],                             # no domain
    ["campaign", "create", "--epsilon", "1", "--dims", "1:0"],
    ["campaign", "create", "--epsilon", "1", "--categories", "4", "--dims", "0:1"],
    ["campaign", "create", "--epsilon", "1", "--categories", "4", "--collector", "nohost"],
    ["campaign", "create", "--epsilon", "1", "--categories", "4", "--label", "novalue"],
    ["campaign", "show"],
    ["demo", "--cells", "0"],
    ["serve", "--listen", "localhost"],
])
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert "usage: ldp-collector" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["campaign", "create", "--epsilon", "1", "--categories", "4", "--cells", "4"],
     "--cells applies to numeric domains"),
    (["campaign", "create", "--kind", "grid", "--epsilon", "1", "--dims", "0:1", "--oracle", "oue"],
     "--oracle applies to histogram campaigns, not grid"),
    (["campaign", "create", "--epsilon", "1", "--categories", "4", "--k", "3"],
     "--k applies to bitvector and laplace and ldp_kmeans and nettree and stemmer campaigns, not histogram"),
    (["simulate", "--kind", "histogram", "--dataset", "moons", "--label-column", "last"],
     "--label-column applies to --data files"),
])
def test_flags_that_do_not_fit_together_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                               message: str) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert message in err


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out.startswith("ldp-collector ")
    code, out, _ = run_cli(capsys, "simulate", "--help")
    assert code == 0 and "--dataset" in out and "not privacy-preserving" in out


def test_build_campaign_config() -> None:
    config = cli.build_campaign_config("histogram", epsilon=1.5, bounds=((0.0, -1.0), (1.0, 1.0)), cells=(8, 4),
                                       oracle="olh", close_after=100, round_duration_s=2.5,
                                       labels=[("team", "maps")], campaign_id="maps-1")
    assert config.kind == campaigns_pb2.HISTOGRAM and config.campaign_id == "maps-1"
    assert list(config.domain.numeric.lower) == [0.0, -1.0] and list(config.domain.numeric.upper) == [1.0, 1.0]
    assert list(config.histogram.cells_per_dimension) == [8, 4] and config.histogram.oracle == campaigns_pb2.OLH
    assert config.close_after_reports == 100 and config.round_duration.seconds == 2
    assert config.round_duration.nanos == 500_000_000 and dict(config.labels) == {"team": "maps"}
    config = cli.build_campaign_config("histogram", epsilon=1.0, categories=5)
    assert config.WhichOneof("parameters") == "histogram" and config.domain.categorical_size == 5
    config = cli.build_campaign_config("ldp_kmeans", epsilon=1.0, bounds=((0.0,), (1.0,)), k=4)
    assert config.ldp_kmeans.k == 4 and config.kind == campaigns_pb2.LDP_KMEANS
    config = cli.build_campaign_config("heavy_hitters", epsilon=1.0, categories=1 << 20, value_bits=20)
    assert config.heavy_hitters.value_bits == 20
    with pytest.raises(cli.UsageError, match="exactly one domain"):
        cli.build_campaign_config("histogram", epsilon=1.0)


# -- simulate ------------------------------------------------------------------------------------------

def test_simulate_histogram_json_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "simulate", "--kind", "histogram", "--dataset", "moons", "--n", "20000",
                             "--epsilon", "2", "--seed", "3", "--json")
    assert code == 0, err
    result = json.loads(out)  # exactly one JSON object
    assert result["parameters"]["kind"] == "histogram" and result["parameters"]["n"] == 20_000
    assert result["parameters"]["cells"] == [16, 16] and result["parameters"]["collector"] == "in-process"
    assert result["reports_sent"] == 20_000 and result["epsilon_per_device"] == 2.0
    assert result["wall_time_s"] > 0 and result["stats"]["accepted"] == 20_000
    errors = result["errors"]
    # 256 cells, OUE at epsilon 2 (frequency SE about 0.006): bounds at 5 SE per cell, and the mean
    # |error|/SE of 256 cells within 4 of its standard deviations (0.04) of 0.80.
    assert errors["max_abs_z"] < 5.0
    assert 0.64 < errors["mean_abs_z"] < 0.96
    assert errors["max_abs_freq_error"] < 0.03 and errors["mean_abs_freq_error"] < 0.01
    assert errors["ci_coverage"] > 0.85


def test_simulate_human_output_with_a_labelled_csv(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = np.column_stack([rng.normal(size=(500, 2)), rng.integers(0, 3, size=500)])
    path = tmp_path / "points.csv"
    np.savetxt(path, data, delimiter=",", header="x,y,label", comments="")
    code, out, err = run_cli(capsys, "simulate", "--kind", "histogram", "--data", str(path), "--label-column", "last",
                             "--n", "3000", "--cells", "4", "--quiet")
    assert code == 0, err
    assert "simulated histogram campaign" in out and "n = 3,000" in out and "mean_abs_z" in out


def test_simulate_heavy_hitters_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "simulate", "--kind", "heavy_hitters", "--dataset", "blobs", "--k", "2",
                             "--n", "20000", "--epsilon", "4", "--cells", "8", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["parameters"]["value_bits"] == 6 and result["reports_sent"] == 20_000
    assert result["errors"]["found"] >= 1


def test_simulate_runtime_errors_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "simulate", "--kind", "histogram", "--data", str(tmp_path / "missing.csv"))
    assert_one_line_error(code, err, "missing.csv")
    code, _, err = run_cli(capsys, "simulate", "--kind", "histogram", "--dataset", "moons", "--d", "3")
    assert_one_line_error(code, err, "dataset 'moons' has d = 2 only, got d = 3")
    code, _, err = run_cli(capsys, "simulate", "--kind", "histogram", "--dataset", "moons", "--n", "100",
                           "--epsilon", "25")
    assert_one_line_error(code, err, "epsilon")


@pytest.mark.parametrize("kind", ["grid", "stemmer", "nettree", "bitvector", "laplace", "ldp_kmeans"])
def test_simulate_clustering_kinds_not_implemented_yet(capsys: pytest.CaptureFixture[str], kind: str) -> None:
    if campaigns_pb2.CampaignKind.Value(kind.upper()) in ENGINES:
        pytest.skip(f"the {kind} engine exists")
    code, _, err = run_cli(capsys, "simulate", "--kind", kind, "--dataset", "moons", "--n", "100")
    assert_one_line_error(code, err, f"kind {kind} is not implemented yet")


# -- the demo ------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_demo_small_writes_the_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "demo.png"
    started = time.perf_counter()
    code, out, err = run_cli(capsys, "demo", "--n", "20000", "--out", str(png), "--quiet")
    elapsed = time.perf_counter() - started
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "20,000 reports over gRPC (SubmitPacked" in out and "top 10 cells by estimate" in out
    assert "mean |error|/SE" in out and f"wrote {png}" in out
    assert elapsed < 30


@pytest.mark.integration
def test_demo_json_without_plot(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "demo", "--n", "5000", "--dataset", "mixture", "--cells", "8", "--no-plot",
                             "--submit", "reports", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["parameters"]["api"] == "SubmitReports" and summary["stats"]["accepted"] == 5000
    assert summary["png"] is None and summary["errors"]["values"] == 64


# -- campaign commands against a running collector -------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(CollectorConfig(listen="127.0.0.1:0", data_dir=str(tmp_path_factory.mktemp("cli") / "data"),
                                       operator_token=TOKEN, log_level="WARNING", grace_period_s=1.0))
    try:
        yield srv
    finally:
        srv.stop(grace=1.0)


@pytest.mark.integration
def test_campaign_commands(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                           server: RunningServer, tmp_path: Path) -> None:
    monkeypatch.setenv("LDP_OPERATOR_TOKEN", TOKEN)
    remote = ["--collector", server.address]
    code, out, err = run_cli(capsys, "campaign", "create", *remote, "--categories", "8", "--epsilon", "1",
                             "--id", "cli-test", "--description", "from the CLI", "--label", "team=maps", "--json")
    assert code == 0, err
    created = json.loads(out)
    assert created["config"]["campaign_id"] == "cli-test" and created["state"] == "COLLECTING"
    assert created["config"]["labels"] == {"team": "maps"}

    code, out, err = run_cli(capsys, "campaign", "create", *remote, "--dims=-1:1,0:2", "--cells", "4",
                             "--epsilon", "2", "--id", "cli-grid")
    assert code == 0, err
    assert "campaign cli-grid (histogram)  state COLLECTING" in out and "numeric [-1, 1] x [0, 2]" in out
    assert "4 x 4 cells" in out

    code, out, err = run_cli(capsys, "campaign", "list", *remote)
    assert code == 0, err
    assert "cli-test" in out and "cli-grid" in out and "COLLECTING" in out

    # Some devices report to cli-test, then the operator closes the round and reads the result.
    from ldp_client.grpc import CollectorClient
    from ldp_collector.simulate import simulate_round

    with CollectorClient(server.address) as client:
        spec = client.get_round_spec("cli-test")
        assert spec is not None
        client.submit_packed(simulate_round(spec, [i % 8 for i in range(2000)], 1))
    code, out, err = run_cli(capsys, "campaign", "close", *remote, "cli-test")
    assert code == 0, err
    assert "closed round 1" in out and "state FINISHED" in out
    code, out, err = run_cli(capsys, "campaign", "show", *remote, "cli-test", "--top", "3")
    assert code == 0, err
    assert "estimates of round 1 from 2,000 reports (top 3 of 8" in out
    code, out, err = run_cli(capsys, "campaign", "show", *remote, "cli-test", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["result"]["state"] == "FINISHED" and len(shown["result"]["estimates"]["estimates"]) == 8

    code, _, err = run_cli(capsys, "campaign", "close", *remote, "cli-test")
    assert_one_line_error(code, err, "campaign cli-test is FINISHED; it has no open round to close")
    code, _, err = run_cli(capsys, "campaign", "show", *remote, "no-such-campaign")
    assert_one_line_error(code, err, "NOT_FOUND")
    code, _, err = run_cli(capsys, "campaign", "create", *remote, "--categories", "8", "--epsilon", "1",
                           "--id", "cli-test")
    assert_one_line_error(code, err, "ALREADY_EXISTS")

    png = tmp_path / "estimates.png"
    code, out, err = run_cli(capsys, "plot", *remote, "cli-test", "--out", str(png))
    assert code == 0, err
    assert png.read_bytes()[:4] == b"\x89PNG"

    monkeypatch.setenv("LDP_OPERATOR_TOKEN", "wrong-token-0123456789abcdef")
    code, _, err = run_cli(capsys, "campaign", "list", *remote)
    assert_one_line_error(code, err, "UNAUTHENTICATED")
    monkeypatch.delenv("LDP_OPERATOR_TOKEN")
    code, _, err = run_cli(capsys, "campaign", "list", *remote)
    assert_one_line_error(code, err, "UNAUTHENTICATED")


@pytest.mark.integration
def test_simulate_against_a_running_collector(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                              server: RunningServer) -> None:
    monkeypatch.setenv("LDP_OPERATOR_TOKEN", TOKEN)
    code, out, err = run_cli(capsys, "simulate", "--kind", "histogram", "--dataset", "circles", "--n", "4000",
                             "--collector", server.address, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["parameters"]["collector"] == server.address and result["stats"]["accepted"] == 4000


@pytest.mark.integration
def test_unreachable_collector_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "campaign", "list", "--collector", "127.0.0.1:1", "--timeout", "2")
    assert_one_line_error(code, err, "UNAVAILABLE")


# -- serve ---------------------------------------------------------------------------------------------

def _env() -> dict[str, str]:
    paths = [str(REPO / "packages" / p / "src") for p in ("ldp-client", "ldp-proto", "ldp-collector")]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    env.pop("LDP_OPERATOR_TOKEN", None)
    return env


@pytest.mark.integration
def test_serve_starts_and_stops_on_sigterm(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ldp_collector.cli", "serve", "--listen", "127.0.0.1:0", "--data-dir",
         str(tmp_path / "data"), "--log-format", "json"],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 30
        seen = []
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if "collector listening" in line:
                break
        assert any("collector listening" in line for line in seen), "".join(seen)
        # serve() installs its signal handlers right after the start-up log line.
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "data").is_dir()


def test_serve_configuration_errors_are_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    monkeypatch.delenv("LDP_OPERATOR_TOKEN", raising=False)
    code, _, err = run_cli(capsys, "serve", "--config", str(tmp_path / "missing.toml"))
    assert_one_line_error(code, err, "does not exist")
    code, _, err = run_cli(capsys, "serve", "--listen", "0.0.0.0:0", "--data-dir", str(tmp_path))
    assert_one_line_error(code, err, "operator_token is required")
