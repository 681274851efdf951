"""``simulate --data FILE`` on the command line: one located line for each surprise, a hint for a
label column left out, and "n is too small" before any device runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .test_cli import assert_one_line_error, assert_one_line_usage_error, run_cli


def _labelled(path: Path, n: int, *, header: str | None = None) -> Path:
    rng = np.random.default_rng(0)
    rows = [f"{a!r},{b!r},{c}" for (a, b), c in zip(rng.normal(size=(n, 2)).tolist(),
                                                     rng.integers(0, 3, size=n).tolist(), strict=True)]
    path.write_text("\n".join(([header] if header else []) + rows) + "\n")
    return path


def test_a_file_too_small_for_the_campaign_says_so_with_the_minimum(capsys: pytest.CaptureFixture[str],
                                                                      tmp_path: Path) -> None:
    path = _labelled(tmp_path / "four.csv", 4)
    code, _, err = run_cli(capsys, "simulate", "--kind", "grid", "--data", str(path), "--label-column", "last",
                           "--quiet")
    assert_one_line_error(code, err, "n = 4 is too small for a grid campaign: it needs at least 31 devices")
    assert "give more points or --n 31" in err
    code, _, err = run_cli(capsys, "simulate", "--kind", "nettree", "--data", str(path), "--label-column", "last",
                           "--k", "5", "--quiet")
    assert_one_line_error(code, err, "n = 4 is too small for a nettree campaign: it needs at least 5 devices "
                                     "(a clustering into k = 5 clusters needs at least k points)")


def test_a_clustering_of_unlabelled_data_needs_k(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "points.csv"
    path.write_text("1,2\n3,4\n5,6\n")
    code, _, err = run_cli(capsys, "simulate", "--kind", "laplace", "--data", str(path), "--quiet")
    assert_one_line_usage_error(code, err, "a laplace simulation needs --k: the data have no labels "
                                           "(--label-column) to take it from")


def test_a_column_that_looks_like_labels_gets_a_one_line_hint(capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    path = _labelled(tmp_path / "points.csv", 500, header="x,y,label")
    argv = ("simulate", "--kind", "histogram", "--data", str(path), "--cells", "4", "--quiet")
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert err == (f"ldp-collector: hint: column 2 ('label') of {path} looks like labels (its header is 'label'); "
                   "--label-column 2 scores against it instead of taking it as a feature\n")
    assert "d = 3" in out
    code, out, err = run_cli(capsys, *argv, "--label-column", "2")
    assert code == 0 and err == "" and "d = 2" in out


def test_header_options_reach_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _labelled(tmp_path / "points.csv", 300, header="x,0,label")
    argv = ("simulate", "--kind", "histogram", "--data", str(path), "--label-column", "last", "--cells", "4",
            "--quiet", "--json")
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, "row 1, column 1: 'x' is not a number (if this row is a header, say so: "
                                     "--header)")
    code, out, err = run_cli(capsys, *argv, "--header")
    assert code == 0, err
    assert '"file_points": 300' in out
    code, _, err = run_cli(capsys, "simulate", "--kind", "histogram", "--dataset", "moons", "--no-header")
    assert_one_line_usage_error(code, err, "--header and --no-header apply to --data files")


def test_bad_cells_are_one_located_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "points.csv"
    path.write_text("x,y,label\n1,2,a\n3,4,\n")
    code, _, err = run_cli(capsys, "simulate", "--kind", "histogram", "--data", str(path), "--label-column", "last")
    assert_one_line_error(code, err, f"{path}: row 3, label column 3 ('label') is empty; every point needs its label")
    path.write_text("x,y\n1.5,\n")
    code, _, err = run_cli(capsys, "simulate", "--kind", "histogram", "--data", str(path))
    assert_one_line_error(code, err, f"{path}: row 2, column 2 ('y') is empty")


@pytest.mark.parametrize("text,expected", [
    # text labels left in the features
    ("x,y,species\n1.0,2.0,setosa\n3.0,4.0,virginica\n",
     "row 2, column 3 ('species'): 'setosa' is not a number (if column 2 holds labels, say so: --label-column 2)"),
    # pandas' to_csv() header, whose index column has an empty name
    (",x,y\n0,1.5,2\n1,3,4\n",
     "row 1, column 1 is empty; every feature of a data row needs a number (if this row is a header, say so: "
     "--header; pandas: to_csv(index=False))"),
])
def test_a_common_csv_shape_gets_the_flag_that_reads_it(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        text: str, expected: str) -> None:
    path = tmp_path / "points.csv"
    path.write_text(text)
    code, _, err = run_cli(capsys, "simulate", "--kind", "histogram", "--data", str(path), "--cells", "4")
    assert_one_line_error(code, err, expected)


def test_k_taken_from_a_single_class_is_refused_by_name(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "one.csv"
    path.write_text("".join(f"{i * 0.1!r},{i * 0.2!r},0\n" for i in range(200)))
    code, _, err = run_cli(capsys, "simulate", "--kind", "stemmer", "--data", str(path), "--label-column", "last")
    assert_one_line_usage_error(code, err, "the labels hold 1 class, so k taken from them is 1; a clustering needs "
                                           "--k 2 or more")


def test_resampling_a_file_is_said_on_stderr(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = _labelled(tmp_path / "points.csv", 300)
    code, _, err = run_cli(capsys, "simulate", "--kind", "histogram", "--data", str(path), "--label-column", "last",
                           "--cells", "4", "--n", "1000", "--quiet")
    assert code == 0 and err == f"ldp-collector: note: --n 1000 draws with replacement from the 300 points of {path}\n"


def test_a_plot_the_data_cannot_have_is_refused_before_the_run(capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    path = tmp_path / "three.csv"
    path.write_text("".join(f"{i * 0.1!r},{i * 0.2!r},{i * 0.3!r}\n" for i in range(100)))
    for kind in ("grid", "histogram"):
        code, out, err = run_cli(capsys, "simulate", "--kind", kind, "--data", str(path), "--plot",
                                 str(tmp_path / "p.png"), "--cells", "4")
        assert_one_line_usage_error(code, err, "--plot: ")
        assert "cover" in err and "this one has 3 dimensions" in err and out == ""
