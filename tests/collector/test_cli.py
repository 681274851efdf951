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
from typing import Any

import numpy as np
import pytest

from ldp.v1 import campaigns_pb2
from ldp_collector import cli
from ldp_collector.cli_args import kind_values
from ldp_collector.config import CollectorConfig
from ldp_collector.demo import DEFAULT_VARIANT as DEMO_VARIANT
from ldp_collector.demo import VARIANTS as DEMO_VARIANTS
from ldp_collector.demo import _matched_colours
from ldp_collector.kinds import KINDS, Kind
from ldp_collector.kinds.base import NUMERIC, CliParam
from ldp_collector.serde import kind_number
from ldp_collector.server.lifecycle import RunningServer, start_server

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


def assert_one_line_usage_error(code: int, err: str, expected: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {err!r}"
    assert lines[0].startswith("ldp-collector") and ": error: " in lines[0] and lines[0].endswith(" --help)")
    assert expected in lines[0], lines[0]


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
    ["simulate", "--kind", "grid", "--dataset", "moons", "--variant", "quadtree"],
    ["simulate", "--kind", "grid", "--dataset", "moons", "--granularity", "fine"],
    ["campaign", "create", "--kind", "grid", "--epsilon", "1", "--dims", "0:1,0:1", "--max-iterations", "0"],
])
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_usage_error(code, err, "")


U32, U64 = 2**32, 2**64


@pytest.mark.parametrize(("argv", "message"), [
    (["campaign", "create", "--epsilon", "1", "--categories", str(U64)],
     f"argument --categories: expected an integer in [1, {U64 - 1}], got {U64}"),
    (["campaign", "create", "--epsilon", "1", "--categories", "4", "--seed", str(U64)],
     f"argument --seed: expected an integer in [0, {U64 - 1}], got {U64}"),
    (["simulate", "--kind", "nettree", "--dataset", "mixture", "--seed", "-1"],
     f"argument --seed: expected an integer in [0, {U64 - 1}], got -1"),
    (["campaign", "create", "--epsilon", "1", "--categories", "4", "--min-reports", str(U64)],
     f"argument --min-reports: expected an integer in [1, {U64 - 1}], got {U64}"),
    (["campaign", "create", "--epsilon", "1", "--categories", "4", "--close-after", str(U64)],
     f"argument --close-after: expected an integer in [1, {U64 - 1}], got {U64}"),
    (["campaign", "create", "--epsilon", "1", "--categories", "4", "--max-payload-bits", str(U32)],
     f"argument --max-payload-bits: expected an integer in [1, {U32 - 1}], got {U32}"),
    (["campaign", "create", "--epsilon", "1", "--categories", "4", "--windows", str(U32)],
     f"argument --windows: expected an integer in [1, {U32 - 1}], got {U32}"),
    (["campaign", "create", "--kind", "stemmer", "--epsilon", "1", "--dims", "0:1", "--k", str(U32)],
     f"argument --k: expected an integer in [1, {U32 - 1}], got {U32}"),
    (["campaign", "create", "--kind", "heavy_hitters", "--epsilon", "1", "--categories", "4", "--value-bits",
      str(U32)], "argument --value-bits: expected an integer in"),
    (["campaign", "create", "--kind", "heavy_hitters", "--epsilon", "1", "--categories", "4", "--bits-per-level",
      str(U32)], "argument --bits-per-level: expected an integer in"),
    (["campaign", "create", "--kind", "heavy_hitters", "--epsilon", "1", "--categories", "4", "--max-candidates",
      str(U32)], "argument --max-candidates: expected an integer in"),
    (["campaign", "create", "--kind", "grid", "--epsilon", "1", "--dims", "0:1", "--granularity-level", str(U32)],
     "argument --granularity-level: expected an integer in"),
    (["campaign", "create", "--kind", "grid", "--epsilon", "1", "--dims", "0:1", "--tree-height", str(U32)],
     "argument --tree-height: expected an integer in"),
    (["campaign", "create", "--kind", "grid", "--epsilon", "1", "--dims", "0:1", "--max-iterations", str(U32)],
     "argument --max-iterations: expected an integer in"),
    (["campaign", "create", "--epsilon", "1", "--dims", "0:1,0:1", "--cells", f"4,{U32}"],
     f"argument --cells: expected M or M1,M2,... with integers in [1, {U32 - 1}], got '4,{U32}'"),
    (["campaign", "create", "--epsilon", "1", "--categories", "4", "--round-duration", "1e300"],
     "argument --round-duration: expected a positive number up to 315576000000, got '1e300'"),
    (["campaign", "create", "--epsilon", "1", "--categories", "4", "--timeout", "1e300"],
     "argument --timeout: expected a positive number up to 86400, got '1e300'"),
    (["campaign", "close", "c1", "--round", str(U32)], "argument --round: expected an integer in"),
    (["campaign", "create", "--epsilon", "1", "--categories", "4", "--id", ""],
     "argument --id: expected a value, got an empty string (leave the flag out for the default)"),
    (["plot", "c1", "--round", str(U32)], "argument --round: expected an integer in"),
    (["simulate", "--kind", "stemmer", "--dataset", "moons", "--k", str(U32)], "argument --k: expected an integer in"),
    (["simulate", "--kind", "histogram", "--dataset", "moons", "--cells", str(U32)],
     "argument --cells: expected M or M1,M2,... with integers in"),
    (["simulate", "--kind", "grid", "--dataset", "moons", "--tree-height", str(U32)],
     "argument --tree-height: expected an integer in"),
    (["demo", "--cells", str(U32)], "argument --cells: expected an integer in"),
])
def test_integers_beyond_the_wire_fields_are_one_line_usage_errors(capsys: pytest.CaptureFixture[str],
                                                                    argv: list[str], message: str) -> None:
    """A value a protobuf field cannot hold is refused while parsing, naming the flag, the range and
    the value, instead of a protobuf ValueError traceback when the request is built."""
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_usage_error(code, err, message)


def test_the_largest_wire_values_still_parse() -> None:
    args = cli.build_parser().parse_args(["campaign", "create", "--epsilon", "1", "--categories", str(U64 - 1),
                                          "--close-after", str(U64 - 1), "--round-duration", "315576000000"])
    config = cli.build_campaign_config("histogram", epsilon=args.epsilon, categories=args.categories,
                                       close_after=args.close_after, round_duration_s=args.round_duration)
    assert config.domain.categorical_size == U64 - 1 and config.close_after_reports == U64 - 1
    assert config.round_duration.seconds == 315_576_000_000


@pytest.mark.parametrize(("argv", "message"), [
    (["campaign", "create", "--epsilon", "1", "--categories", "4", "--cells", "4"],
     "--cells applies to numeric domains"),
    (["campaign", "create", "--kind", "grid", "--epsilon", "1", "--dims", "0:1", "--oracle", "oue"],
     "--oracle applies to histogram campaigns, not grid"),
    (["campaign", "create", "--epsilon", "1", "--categories", "4", "--k", "3"],
     "--k applies to bitvector and laplace and ldp_kmeans and nettree and stemmer campaigns, not histogram"),
    (["simulate", "--kind", "histogram", "--dataset", "moons", "--label-column", "last"],
     "--label-column applies to --data files"),
    (["campaign", "create", "--epsilon", "1", "--categories", "4", "--variant", "tree"],
     "--variant applies to grid campaigns, not histogram"),
    (["simulate", "--kind", "histogram", "--dataset", "moons", "--granularity", "paper"],
     "--granularity applies to grid campaigns, not histogram"),
    (["simulate", "--kind", "heavy_hitters", "--dataset", "moons", "--granularity-level", "3"],
     "--granularity-level applies to grid campaigns, not heavy_hitters"),
    (["campaign", "create", "--kind", "grid", "--epsilon", "1", "--dims", "0:1,0:1", "--max-iterations", "2"],
     "--max-iterations applies to the iterative grid variant (--variant iterative), not density (the default)"),
    (["campaign", "create", "--kind", "grid", "--epsilon", "1", "--dims", "0:1,0:1", "--tree-height", "3"],
     "--tree-height applies to the tree and iterative grid variants, not density (the default)"),
    (["simulate", "--kind", "grid", "--dataset", "moons", "--granularity", "paper"],
     "--granularity applies to the uniform, tree and iterative grid variants, not density (the default)"),
    (["campaign", "create", "--kind", "grid", "--epsilon", "1", "--dims", "0:1,0:1", "--variant", "uniform",
      "--tree-height", "3"], "--tree-height applies to the tree and iterative grid variants, not uniform"),
    (["campaign", "create", "--kind", "grid", "--epsilon", "1", "--dims", "0:1,0:1", "--cells", "4,8"],
     "a grid campaign takes one --cells value"),
    (["simulate", "--kind", "grid", "--dataset", "moons", "--oracle", "oue"],
     "--oracle applies to histogram campaigns, not grid"),
    (["simulate", "--kind", "heavy_hitters", "--dataset", "moons", "--plot", "x.png"],
     "--plot applies to grid and histogram simulations, not heavy_hitters"),
])
def test_flags_that_do_not_fit_together_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                               message: str) -> None:
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_usage_error(code, err, message)


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
    assert config.histogram.windows == 0 and config.histogram.anomaly_alpha == 0.0  # the engine's defaults
    config = cli.build_campaign_config("histogram", epsilon=1.0, categories=5, windows=3, anomaly_alpha=0.001)
    assert config.histogram.windows == 3 and config.histogram.anomaly_alpha == 0.001
    with pytest.raises(cli.UsageError, match="--windows applies to histogram campaigns, not grid"):
        cli.build_campaign_config("grid", epsilon=1.0, bounds=((0.0,), (1.0,)), windows=2)
    config = cli.build_campaign_config("ldp_kmeans", epsilon=1.0, bounds=((0.0,), (1.0,)), k=4)
    assert config.ldp_kmeans.k == 4 and config.kind == campaigns_pb2.LDP_KMEANS
    config = cli.build_campaign_config("heavy_hitters", epsilon=1.0, categories=1 << 20, value_bits=20)
    assert config.heavy_hitters.value_bits == 20
    with pytest.raises(cli.UsageError, match="exactly one domain"):
        cli.build_campaign_config("histogram", epsilon=1.0)


def test_build_campaign_config_grid() -> None:
    grid = campaigns_pb2.GridParameters
    config = cli.build_campaign_config("grid", epsilon=3.0, bounds=((0.0, 0.0), (1.0, 2.0)), cells=(8, 8),
                                       variant="iterative", granularity="paper", tree_height=5, max_iterations=2,
                                       granularity_level=4, budget_policy="split", close_after=1000)
    assert config.kind == campaigns_pb2.GRID and config.WhichOneof("parameters") == "grid"
    assert config.grid.variant == grid.ITERATIVE and config.grid.granularity == grid.PAPER
    assert config.grid.initial_cells_per_dimension == 8 and config.grid.tree_height == 5
    assert config.grid.max_iterations == 2 and config.grid.granularity_level == 4
    assert config.budget_policy == campaigns_pb2.SPLIT and config.close_after_reports == 1000
    # Unset options stay 0: the engine fills in its defaults (density, consistent, ...).
    config = cli.build_campaign_config("grid", epsilon=1.0, bounds=((0.0,), (1.0,)))
    assert config.WhichOneof("parameters") == "grid"
    assert config.grid.variant == grid.VARIANT_UNSPECIFIED and config.grid.granularity == grid.GRANULARITY_UNSPECIFIED
    assert config.grid.initial_cells_per_dimension == 0 and config.grid.max_iterations == 0
    assert cli.build_campaign_config("grid", epsilon=1.0, bounds=((0.0,), (1.0,)), variant="uniform",
                                     granularity="consistent").grid.variant == grid.UNIFORM
    with pytest.raises(cli.UsageError, match="--tree-height applies to grid campaigns, not ldp_kmeans"):
        cli.build_campaign_config("ldp_kmeans", epsilon=1.0, bounds=((0.0,), (1.0,)), tree_height=3)


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
    # The campaign's phases, and the command's own: the dataset's draw and the evaluation.
    phases = {"data", "devices", "reports", "ingest", "steps", "other", "evaluation"}
    assert set(result["stats"]["phase_s"]) == set(result["stats"]["phase_cpu_s"]) == phases
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


def test_simulate_k_sets_the_clusters_of_a_dataset_that_takes_k(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "simulate", "--kind", "histogram", "--dataset", "spirals", "--k", "5",
                             "--n", "3000", "--cells", "4", "--quiet")
    assert code == 0, err
    assert "simulated histogram campaign" in out
    code, _, err = run_cli(capsys, "simulate", "--kind", "histogram", "--dataset", "spirals", "--k", "9")
    assert_one_line_error(code, err, "dataset 'spirals' has k in [2, 8], got k = 9")
    code, _, err = run_cli(capsys, "simulate", "--kind", "histogram", "--dataset", "moons", "--k", "3")
    assert_one_line_usage_error(code, err, "--k sets the clusters of a dataset that takes k (blobs, mixture, google, spirals, rings, sizes, background)")


def test_simulate_runtime_errors_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "simulate", "--kind", "histogram", "--data", str(tmp_path / "missing.csv"))
    assert_one_line_error(code, err, "missing.csv")
    code, _, err = run_cli(capsys, "simulate", "--kind", "histogram", "--dataset", "moons", "--d", "3")
    assert_one_line_error(code, err, "dataset 'moons' has d = 2 only, got d = 3")
    code, _, err = run_cli(capsys, "simulate", "--kind", "histogram", "--dataset", "moons", "--n", "100",
                           "--epsilon", "25")
    assert_one_line_error(code, err, "epsilon")


def test_simulate_grid_json(capsys: pytest.CaptureFixture[str]) -> None:
    """The uniform grid (UGC) separates the moons at epsilon 8 with 3000 devices; every score is reported."""
    code, out, err = run_cli(capsys, "simulate", "--kind", "grid", "--dataset", "moons", "--n", "3000",
                             "--epsilon", "8", "--variant", "uniform", "--seed", "1", "--json")
    assert code == 0, err
    result = json.loads(out)
    p = result["parameters"]
    assert p["kind"] == "grid" and p["variant"] == "uniform" and p["granularity"] == "consistent"
    assert p["budget_policy"] == "partition" and p["rounds"] == 2 and p["final_cells"] >= 4
    assert result["reports_sent"] == 3000 and result["stats"]["accepted"] == 3000
    assert result["epsilon_per_device"] == 8.0  # partition: every device reports once with the whole budget
    scores = result["clustering"]
    assert {"ari", "nmi", "accuracy", "f_measure", "noise_share", "clusters"} <= set(scores)
    assert "cost_ratio" not in scores  # no centers
    assert scores["ari"] > 0.9 and scores["clusters"] >= 2
    diagnostics = result["diagnostics"]
    assert diagnostics["final_cells"] == p["final_cells"] and diagnostics["round_1_reports"] > 0


def test_simulate_grid_iterative_human_output_with_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "grid.png"
    code, out, err = run_cli(capsys, "simulate", "--kind", "grid", "--dataset", "aniso", "--n", "3000",
                             "--epsilon", "8", "--variant", "iterative", "--max-iterations", "2",
                             "--granularity", "paper", "--cells", "8", "--plot", str(png), "--quiet")
    assert code == 0, err
    assert "simulated grid campaign" in out and "n = 3,000" in out
    assert "grid: variant iterative, granularity paper, budget policy partition" in out
    assert "ari" in out and "noise_share" in out and f"wrote {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_grid_split_tree_spends_the_budget_over_the_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "simulate", "--kind", "grid", "--dataset", "circles", "--n", "2000",
                             "--epsilon", "6", "--variant", "tree", "--budget-policy", "split",
                             "--granularity-level", "3", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["parameters"]["budget_policy"] == "split" and result["parameters"]["variant"] == "tree"
    assert result["parameters"]["rounds"] == 3 and result["diagnostics"]["granularity_level"] == 3
    assert result["reports_sent"] == 2000 * 3  # split: every device reports in every round ...
    assert result["epsilon_per_device"] == pytest.approx(6.0)  # ... with epsilon / 3 each
    assert result["diagnostics"]["epsilon_per_report"] == pytest.approx(2.0)


@pytest.mark.parametrize("kind", ["nettree", "stemmer"])
def test_simulate_lsh_tree_kinds(capsys: pytest.CaptureFixture[str], kind: str) -> None:
    """Every clustering kind has an engine now; the LSH-tree ones run from the CLI on well-separated blobs
    (measured: ARI 1.000 for both at n = 6000, epsilon 8)."""
    code, out, _ = run_cli(capsys, "simulate", "--kind", kind, "--dataset", "blobs", "--n", "6000", "--k", "3",
                           "--epsilon", "8", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["parameters"]["kind"] == kind and result["reports_sent"] >= 6000
    assert result["clustering"]["clusters"] == 3 and result["clustering"]["ari"] > 0.9
    assert result["epsilon_per_device"] == pytest.approx(8.0)


# -- never silent: the status of a result ---------------------------------------------------------------

def test_simulate_nettree_below_its_noise_floor_publishes_best_effort_centers(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A 10-D, 10-cluster mixture at n = 3000, epsilon 2: no tree node passes level 2 (signal-to-noise 1.4).
    The engine still publishes centers, marked best-effort, with its explanation, and the CLI prints both."""
    argv = ("simulate", "--kind", "nettree", "--dataset", "mixture", "--d", "10", "--k", "10", "--n", "3000",
            "--epsilon", "2", "--seed", "0")
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "degraded" and "did not reach depth 4" in result["reason"]
    assert any("best-effort" in w for w in result["warnings"]) and result["diagnostics"]["best_effort"] == 1
    assert result["diagnostics"]["signal_to_noise"] < 2
    assert result["clustering"]["clusters"] >= 1 and "ari" in result["clustering"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert "warning: the tree did not reach depth 4" in out and "status degraded" in out


def _simulated_result(monkeypatch: pytest.MonkeyPatch, result: Any) -> None:
    """Let ``simulate`` run its campaign, then hand the command ``result`` instead of the published one."""
    from dataclasses import replace

    from ldp_collector import cli_simulate

    run_simulation = cli_simulate._run_simulation
    monkeypatch.setattr(cli_simulate, "_run_simulation",
                        lambda *args, **kwargs: replace(run_simulation(*args, **kwargs), result=result))


def test_simulate_that_publishes_nothing_still_prints_its_json_and_fails(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from ldp_collector.model import CampaignState, Clustering, Result

    empty = Result(state=CampaignState.FINISHED, clustering=Clustering(dimension=2),
                   warnings=("the round received no reports: no centers published",), diagnostics={"reports": 0})
    _simulated_result(monkeypatch, empty)
    argv = ("simulate", "--kind", "laplace", "--dataset", "blobs", "--k", "2", "--n", "500")
    code, out, err = run_cli(capsys, *argv, "--json")
    assert_one_line_error(code, err, "published nothing: the round received no reports")
    result = json.loads(out)
    assert result["status"] == "failed" and result["reason"] == "the round received no reports: no centers published"
    assert result["warnings"] == list(empty.warnings) and result["diagnostics"] == {"reports": 0}
    assert "clustering" not in result  # nothing to score
    code, out, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, "published nothing")
    assert "warning: the round received no reports" in out and "status failed" in out


def test_simulate_whose_campaign_fails_answers_json_with_the_reason(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from ldp_collector import cli_simulate
    from ldp_collector.simulation.runner import SimulationError

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise SimulationError("campaign c-1 failed: the engine stopped")

    monkeypatch.setattr(cli_simulate, "_run_simulation", failing)
    code, out, err = run_cli(capsys, "simulate", "--kind", "nettree", "--dataset", "blobs", "--k", "2", "--n", "100",
                             "--json")
    assert_one_line_error(code, err, "campaign c-1 failed: the engine stopped")
    assert json.loads(out) == {"status": "failed", "reason": "campaign c-1 failed: the engine stopped"}


def test_result_status_is_decided_in_one_place() -> None:
    from ldp_client.clusters import CellClusterModel
    from ldp_client.encoders.base import NumericDomain
    from ldp_client.encoders.geometry import TreeCell
    from ldp_collector.cli_output import result_status
    from ldp_collector.model import CampaignState, Clustering, Estimate, Estimates, Result

    finished = CampaignState.FINISHED
    centers = Clustering(k=1, dimension=2, centers=(0.5, 0.5), weights=(1.0,))
    assert result_status(Result(state=finished, clustering=centers)).to_dict() == {"status": "ok", "reason": ""}
    degraded = result_status(Result(state=finished, clustering=centers, warnings=("a", "b")))
    assert (degraded.status, degraded.reason, degraded.failed) == ("degraded", "a; b", False)
    cells = CellClusterModel(domain=NumericDomain(lower=(0.0,), upper=(1.0,)), cells=(TreeCell(level=0, morton_index=0),),
                             labels=(-1,))
    assert result_status(Result(state=finished, clustering=Clustering(dimension=1, cell_map=cells))).status == "ok"
    nothing = result_status(Result(state=finished, clustering=Clustering(dimension=2), warnings=("why",)))
    assert (nothing.status, nothing.reason, nothing.failed) == ("failed", "why", True)
    assert result_status(Result(state=finished)).reason == "the result publishes nothing"
    estimates = Estimates(round=1, reports=10, estimates=(Estimate(value=0, count=10.0),))
    assert result_status(Result(state=finished, estimates=estimates)).status == "ok"
    none_heavy = Result(state=finished, estimates=Estimates(round=1, reports=3), warnings=("no heavy hitter",))
    assert result_status(none_heavy).status == "degraded"  # an answer: no value passed the threshold
    failed = result_status(Result(state=CampaignState.FAILED), error="engine error")
    assert (failed.status, failed.reason) == ("failed", "engine error")
    assert result_status(None, error="no run").to_dict() == {"status": "failed", "reason": "no run"}
    assert result_status(Result(state=CampaignState.COLLECTING)).status == "pending"


# -- the demo ------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_demo_small_writes_the_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "demo.png"
    # No wall-clock bound here: the demo's run time is measured (README), not asserted under load.
    code, out, err = run_cli(capsys, "demo", "--n", "20000", "--out", str(png), "--quiet")
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "20,000 reports over gRPC (SubmitPacked" in out and "top 10 cells by estimate" in out
    assert "mean |error|/SE" in out and f"wrote {png}" in out
    # The clustering part: its variant named, the ARI printed, the second picture written.
    clusters_png = tmp_path / "demo-clusters.png"
    assert f"LDP grid clustering (variant {DEMO_VARIANT})" in out and "20,000 reports over gRPC" in out
    assert "adjusted Rand index against the true labels: " in out and "noise:" in out
    assert f"wrote {clusters_png} (true labels beside the published cluster map)" in out
    assert clusters_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.integration
def test_demo_json_without_plot(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "demo", "--n", "5000", "--dataset", "mixture", "--cells", "8", "--no-plot",
                             "--submit", "reports", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["parameters"]["api"] == "SubmitReports" and summary["stats"]["accepted"] == 5000
    assert summary["png"] is None and summary["errors"]["values"] == 64
    clustering = summary["clustering"]
    assert clustering["parameters"]["variant"] == DEMO_VARIANT and clustering["stats"]["accepted"] == 5000
    assert clustering["png"] is None and clustering["cells"] >= 1
    assert sum(clustering["shares"].values()) == pytest.approx(1.0)


@pytest.mark.integration
def test_demo_finds_the_moons(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The demo's main capability: the grid clustering separates the two moons, over real gRPC.

    60 000 devices at epsilon 4 (above 50 000: the vector simulator, so it stays quick). Measured
    in-process with the demo's data and device seeds (seed, seed + 1) over seeds 0-9, the default
    (uniform) variant found 2 clusters on every seed, ARI median 1.000, worst 0.990 (seed 0, the
    one this test runs: 1.000); the floor of 0.5 sits far under the worst seed.
    """
    png = tmp_path / "demo.png"
    code, out, err = run_cli(capsys, "demo", "--n", "60000", "--epsilon", "4", "--out", str(png), "--json")
    assert code == 0, err
    clustering = json.loads(out)["clustering"]
    assert clustering["parameters"]["variant"] == DEMO_VARIANT and clustering["parameters"]["mode"] == "vector"
    assert clustering["scores"]["clusters"] >= 2
    ari = clustering["scores"]["ari"]
    assert ari is not None and np.isfinite(ari) and ari > 0.5
    clusters = [label for label in clustering["shares"] if label != "noise"]
    assert len(clusters) >= 2 and sum(clustering["shares"].values()) == pytest.approx(1.0)
    assert clustering["png"] == str(tmp_path / "demo-clusters.png")
    assert (tmp_path / "demo-clusters.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_truth_colours_follow_the_matched_clusters() -> None:
    """The picture's truth panel renames each true group after the cluster it overlaps best (one to
    one); a group matched to no cluster gets a name of its own."""
    labels = np.array([0, 0, 1, 1, 2])
    found = np.array([1, 1, 0, -1, -1])
    assert _matched_colours(labels, found).tolist() == [1, 1, 0, 0, 4]
    assert _matched_colours(labels, np.full(5, -1)).tolist() == labels.tolist()  # nothing found: as they are


def test_demo_variant_choices(capsys: pytest.CaptureFixture[str]) -> None:
    """``demo --variant`` offers the grid kind's variants, and only them."""
    assert set(DEMO_VARIANTS) == {"uniform", "tree", "iterative", "density"} and DEMO_VARIANT in DEMO_VARIANTS
    code, _, err = run_cli(capsys, "demo", "--variant", "kmeans")
    assert code == 2 and "argument --variant: invalid choice: 'kmeans'" in err


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
                             "--id", "cli-test", "--description", "from the CLI", "--label", "team=maps",
                             "--seed", str(U64 - 1), "--json")
    assert code == 0, err
    created = json.loads(out)
    assert created["config"]["campaign_id"] == "cli-test" and created["state"] == "COLLECTING"
    assert created["config"]["labels"] == {"team": "maps"}
    assert created["config"]["seed"] == str(U64 - 1)  # JSON writes a uint64 as a string
    code, out, err = run_cli(capsys, "campaign", "create", *remote, "--categories", "8", "--epsilon", "1",
                             "--id", "cli-drawn-seed", "--json")
    assert code == 0, err
    assert int(json.loads(out)["config"]["seed"]) >= 0  # unset: drawn by the collector and stored

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
    from ldp_collector.simulation.population import simulate_round

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
    assert shown["status"] in ("ok", "degraded") and shown["reason"] == "; ".join(shown["result"].get("warnings", []))

    code, _, err = run_cli(capsys, "campaign", "close", *remote, "cli-test")
    assert_one_line_error(code, err, "campaign cli-test is FINISHED; it has no open round to close")
    code, _, err = run_cli(capsys, "campaign", "show", *remote, "no-such-campaign")
    assert_one_line_error(code, err, "NOT_FOUND")
    code, out, err = run_cli(capsys, "campaign", "show", *remote, "no-such-campaign", "--json")
    assert_one_line_error(code, err, "NOT_FOUND")
    assert json.loads(out)["status"] == "failed" and "NOT_FOUND" in json.loads(out)["reason"]
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
def test_grid_campaign_commands(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                server: RunningServer, tmp_path: Path) -> None:
    monkeypatch.setenv("LDP_OPERATOR_TOKEN", TOKEN)
    remote = ["--collector", server.address]
    code, out, err = run_cli(capsys, "campaign", "create", *remote, "--kind", "grid", "--dims=-1:1,0:2",
                             "--epsilon", "3", "--variant", "iterative", "--max-iterations", "2", "--granularity",
                             "paper", "--cells", "8", "--close-after", "500", "--id", "cli-agc")
    assert code == 0, err
    assert "campaign cli-agc (grid)  state COLLECTING" in out and "numeric [-1, 1] x [0, 2]" in out
    assert "variant ITERATIVE" in out and "granularity PAPER" in out and "initial_cells_per_dimension 8" in out
    assert "max_iterations 2" in out
    code, _, err = run_cli(capsys, "plot", *remote, "cli-agc", "--out", str(tmp_path / "early.png"))
    assert_one_line_error(code, err, "campaign cli-agc is COLLECTING; a grid campaign's clustering is published")

    # A whole grid campaign played against the server, then shown and plotted from there. (Its own seed: the
    # simulator draws report ids from it, and the server drops ids it stored in another campaign as duplicates.)
    code, out, err = run_cli(capsys, "simulate", "--kind", "grid", "--dataset", "aniso", "--n", "3000",
                             "--epsilon", "8", "--variant", "tree", "--seed", "17", "--collector", server.address,
                             "--json")
    assert code == 0, err
    simulated = json.loads(out)
    campaign_id = simulated["campaign_id"]
    assert simulated["parameters"]["collector"] == server.address and simulated["stats"]["accepted"] == 3000
    clusters = int(simulated["clustering"]["clusters"])
    code, out, err = run_cli(capsys, "campaign", "show", *remote, campaign_id)
    assert code == 0, err
    assert f"campaign {campaign_id} (grid)  state FINISHED" in out and "variant TREE" in out
    assert f"clustering   {clusters} clusters over {simulated['parameters']['final_cells']:,} cells" in out
    assert "final_cells = " in out
    pytest.importorskip("matplotlib")
    png = tmp_path / "agc.png"
    code, out, err = run_cli(capsys, "plot", *remote, campaign_id, "--out", str(png))
    assert code == 0, err
    assert png.read_bytes()[:4] == b"\x89PNG" and f"wrote {png}" in out
    code, _, err = run_cli(capsys, "plot", *remote, campaign_id, "--round", "1")
    assert code == 2 and "--round applies to histogram campaigns" in err


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


def test_serve_workers_flag_and_setting_are_checked(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LDP_OPERATOR_TOKEN", raising=False)
    code, _, err = run_cli(capsys, "serve", "--workers", "0", "--data-dir", str(tmp_path))
    assert code == 2 and "--workers: expected a positive integer, got 0" in err
    monkeypatch.setenv("LDP_WORKERS", "two")
    code, _, err = run_cli(capsys, "serve", "--data-dir", str(tmp_path))
    assert_one_line_error(code, err, "LDP_WORKERS: workers must be an integer, got 'two'")
    monkeypatch.setenv("LDP_WORKERS", "65")
    code, _, err = run_cli(capsys, "serve", "--data-dir", str(tmp_path))
    assert_one_line_error(code, err, "workers must be an integer in [1, 64], got 65")
    monkeypatch.delenv("LDP_WORKERS")
    code, _, err = run_cli(capsys, "serve", "--workers", "3", "--metrics-port", "65534", "--data-dir", str(tmp_path))
    assert_one_line_error(code, err, "metrics_port + workers - 1 must be at most 65535")
    for workers, metrics in (("1", "47320"), ("2", "47319")):
        code, _, err = run_cli(capsys, "serve", "--listen", "127.0.0.1:47320", "--workers", workers, "--metrics-port",
                               metrics, "--data-dir", str(tmp_path))
        assert_one_line_error(code, err, f"metrics_port {metrics} (worker i serves metrics on metrics_port + i) takes "
                                         "the listen port 47320 of 127.0.0.1:47320")


def test_serve_config_file_that_is_not_utf8_is_one_line(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LDP_OPERATOR_TOKEN", raising=False)
    path = tmp_path / "latin1.toml"
    path.write_bytes('description = "caf\xe9"\n'.encode("latin-1"))
    code, _, err = run_cli(capsys, "serve", "--config", str(path), "--data-dir", str(tmp_path / "data"))
    assert_one_line_error(code, err, "latin1.toml' is not UTF-8 text (TOML is UTF-8): invalid continuation byte")


def _serve_failure(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """``ldp-collector serve ARGS`` in a subprocess that must fail at start-up: its stderr.

    A server that starts instead fails the test at the timeout, rather than serving forever.
    """
    proc = subprocess.run([sys.executable, "-m", "ldp_collector.cli", "serve", *args], env={**_env(), **(env or {})},
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 1, proc.stderr
    return proc.stderr


def assert_one_line(err: str, expected: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {err!r}"
    assert lines[0].startswith("ldp-collector: error: ") and expected in lines[0], lines[0]


@pytest.mark.integration
def test_serve_refuses_an_unknown_ldp_variable_naming_the_nearest_one(tmp_path: Path) -> None:
    # The token the operator meant to set: without the check the server would start without it.
    err = _serve_failure(tmp_path, "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data"),
                         env={"LDP_OPERATOR_TOKN": TOKEN})
    assert_one_line(err, "unknown environment variable LDP_OPERATOR_TOKN (did you mean LDP_OPERATOR_TOKEN?)")
    assert not (tmp_path / "data").exists()  # refused before anything was opened


@pytest.mark.integration
def test_serve_on_a_data_dir_whose_database_is_not_one_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    database = data / "collector.sqlite3"
    database.write_text("not a database, a page of text\n" * 200)
    err = _serve_failure(tmp_path, "--listen", "127.0.0.1:0", "--data-dir", str(data))
    assert_one_line(err, f"cannot open the report store {str(database)!r}: file is not a database")
    assert database.read_text() == "not a database, a page of text\n" * 200  # left as it was


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another socket listens on."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.integration
@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_on_a_port_in_use_says_so_in_one_line(tmp_path: Path, taken_port: int, workers: str) -> None:
    err = _serve_failure(tmp_path, "--listen", f"127.0.0.1:{taken_port}", "--data-dir", str(tmp_path / "data"),
                         "--workers", workers)
    assert_one_line(err, f"cannot listen on 127.0.0.1:{taken_port}: address already in use")


@pytest.mark.integration
def test_serve_with_a_metrics_port_in_use_says_so_in_one_line(tmp_path: Path, taken_port: int) -> None:
    err = _serve_failure(tmp_path, "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data"),
                         "--metrics-port", str(taken_port))
    assert_one_line(err, f"cannot serve metrics on 127.0.0.1:{taken_port}: address already in use")


# -- the kinds' flags, read from the registry ------------------------------------------------------

#: Protobuf field types (``FieldDescriptor.TYPE_*``) each CLI value type may fill.
_FIELD_TYPES = {"uint32": {13}, "uint64": {4}, "positive_float": {1, 2}, "cells": {13}, "switch": {8}, "choice": {14}}


def _param_problems(message: type, param: CliParam) -> list[str]:
    """What is wrong with ``param`` as a flag of the parameters message ``message``."""
    field = message.DESCRIPTOR.fields_by_name.get(param.field)  # type: ignore[attr-defined]
    if field is None:
        return [f"{param.flag}: no field {param.field}"]
    problems = []
    if field.type not in _FIELD_TYPES[param.type]:
        problems.append(f"{param.flag}: {param.type} cannot fill field {param.field} of type {field.type}")
    if field.is_repeated and param.type != "cells":
        problems.append(f"{param.flag}: field {param.field} is repeated")
    for name, number in param.choices:
        value = field.enum_type.values_by_number.get(number) if field.enum_type is not None else None
        if value is None or name not in (value.name.lower(), "auto" if number == 0 else None):
            problems.append(f"{param.flag}: choice {name}={number} is not a value of {param.field}")
    return problems


def _parameters_message(kind: Kind) -> type:
    return type(getattr(campaigns_pb2.CampaignConfig(), kind.name))


@pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))
def test_every_kind_flag_names_a_field_of_its_parameters_message(kind: Kind) -> None:
    message = _parameters_message(kind)
    assert [problem for param in kind.cli.params for problem in _param_problems(message, param)] == []


def test_the_flag_check_catches_a_typo() -> None:
    """Negative control: a misspelt field, a wrong type and a wrong enum number are each seen."""
    message = campaigns_pb2.GridParameters
    assert _param_problems(message, CliParam(flag="--variant", field="varaint", type="uint32", help=""))
    assert _param_problems(message, CliParam(flag="--tree-height", field="tree_height", type="switch", help=""))
    assert _param_problems(message, CliParam(flag="--variant", field="variant", type="choice", help="",
                                             choices=(("tree", message.ITERATIVE),)))


def _sample(param: CliParam) -> tuple[list[str], object]:
    """A command-line value of ``param`` and what its field then holds (2-D numeric domain)."""
    if param.type == "switch":
        return [param.flag], True
    if param.type == "choice":
        name, number = param.choices[-1]
        return [param.flag, name], number
    if param.type == "positive_float":
        return [param.flag, "0.25"], 0.25
    if param.type == "cells":
        return [param.flag, "4,4"], 4  # a repeated field holds 4 twice; a single one, the one value
    return [param.flag, "3"], 3


@pytest.mark.parametrize("kind", [kind for kind in KINDS.values() if kind.cli.params],
                         ids=[name for name, kind in KINDS.items() if kind.cli.params])
def test_campaign_create_writes_every_flag_of_the_kind(kind: Kind) -> None:
    """``campaign create --kind K`` with all of K's flags (the last choice of each) fills their fields."""
    domain = ["--dims", "0:1,0:2"] if NUMERIC in kind.domains else ["--categories", "64"]
    argv = ["campaign", "create", "--kind", kind.name, "--epsilon", "1", *domain]
    expected = {}
    for param in kind.cli.params:
        flag_argv, expected[param.field] = _sample(param)
        argv += flag_argv
    args = cli.build_parser().parse_args(argv)
    config = cli.build_campaign_config(kind.name, epsilon=args.epsilon, categories=args.categories, bounds=args.dims,
                                       **kind_values(args))
    assert config.kind == kind_number(kind.name) and config.WhichOneof("parameters") == kind.name
    params = getattr(config, kind.name)
    for field, value in expected.items():
        held = getattr(params, field)
        assert (list(held) == [value, value] if not isinstance(held, (int, float)) else held == value), field


def test_a_flag_several_kinds_declare_is_one_option_naming_them(capsys: pytest.CaptureFixture[str]) -> None:
    owners = [name for name, kind in KINDS.items() if any(p.flag == "--k" for p in kind.cli.params)]
    assert len(owners) > 1
    code, out, _ = run_cli(capsys, "campaign", "create", "--help")
    text = " ".join(out.split())
    assert code == 0 and f"--k K number of clusters ({', '.join(owners)})" in text


def test_batch_commands_never_create_a_store(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "mistyped"
    for location in (str(missing), f"sqlite:///{missing}"):
        code, _, err = run_cli(capsys, "close-round", "c1", "--data-dir", location)
        assert_one_line_error(code, err, f"no store at '{missing}' (no collector.sqlite3 there)")
    assert not missing.exists()


class _FailingStep(KINDS["histogram"].engine):  # type: ignore[name-defined, misc]
    def close_round(self, spec: Any, reports: Any, engine_state: bytes) -> Any:
        raise ArithmeticError("boom")


@pytest.mark.parametrize("as_json", [False, True])
def test_close_round_that_fails_the_campaign_exits_1(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path, as_json: bool) -> None:
    from dataclasses import replace

    from ldp_client.device import Device
    from ldp_client.rng import SeededRng
    from ldp_collector.core import Collector
    from ldp_collector.serde import config_from_proto
    from ldp_collector.storage import open_store

    store = open_store(tmp_path)
    try:
        collector = Collector(store)
        collector.create_campaign(config_from_proto(campaigns_pb2.CampaignConfig(
            campaign_id="c1", kind=campaigns_pb2.HISTOGRAM, epsilon=1.0, domain=campaigns_pb2.Domain(categorical_size=4))))
        spec, _ = collector.get_round_spec("c1")
        assert spec is not None
        reports = [Device.in_memory(rng=SeededRng(i)).participate(spec, i % 4) for i in range(20)]
        collector.submit("r", [r for r in reports if r is not None])
    finally:
        store.close()
    monkeypatch.setitem(KINDS, "histogram", replace(KINDS["histogram"], engine=_FailingStep))
    code, out, err = run_cli(capsys, "close-round", "c1", "--data-dir", str(tmp_path), *(["--json"] if as_json else []))
    assert_one_line_error(code, err, "campaign c1 failed closing round 1: round 1: ArithmeticError: boom")
    if as_json:
        assert json.loads(out)["state"] == "FAILED"
    else:
        assert "closed round 1 (inprocess)" in out and "FAILED" in out


def test_a_reader_that_stops_early_is_no_error(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def closed_pipe(args: Any) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "_cmd_campaign_list", closed_pipe)  # the parser is built after this
    code, out, err = run_cli(capsys, "campaign", "list")
    assert code == 141 and err == ""


def test_campaign_show_lists_the_centers(capsys: pytest.CaptureFixture[str]) -> None:
    from ldp_collector.model import Clustering, Result

    result = Result(state=campaigns_pb2.FINISHED, clustering=Clustering(
        k=3, dimension=2, centers=(0.5, 1.25, -2.0, 3.0, 7.0, 8.0), weights=(0.5, 0.3, 0.2)))
    cli._print_shown(campaigns_pb2.Campaign(state=campaigns_pb2.FINISHED), result, 2)
    out = capsys.readouterr().out
    assert "3 centers in 2-D" in out
    assert "center 0     weight 0.500  (0.5, 1.25)" in out and "center 1     weight 0.300  (-2, 3)" in out
    assert "center 2" not in out and "... 1 more centers (--top, or --json for all)" in out


def test_a_label_given_twice_with_two_values_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "campaign", "create", "--epsilon", "1", "--categories", "4", "--label", "team=maps",
                           "--label", "team=search", "--collector", "127.0.0.1:9")
    assert_one_line_usage_error(code, err, "--label team is given twice ('maps' and 'search')")
