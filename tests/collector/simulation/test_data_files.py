"""``simulate --data FILE`` without surprises: the header rule, located errors, missing labels,
the label hint, and numpy's fast reader agreeing with the precise one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ldp_client.errors import InvalidParameterError
from ldp_collector.simulation import datasets
from ldp_collector.simulation.datasets import label_column_hint, load_file


def _points(n: int = 3000, seed: int = 0) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 2)), rng.integers(0, 3, size=n)


def _rows(x: np.ndarray[Any, Any], labels: np.ndarray[Any, Any]) -> list[str]:
    return [f"{a!r},{b!r},{c}" for (a, b), c in zip(x.tolist(), labels.tolist(), strict=True)]


# -- the header rule ---------------------------------------------------------------------------------

def test_a_first_row_with_an_empty_cell_is_a_located_error_not_a_header(tmp_path: Path) -> None:
    x, labels = _points()
    rows = _rows(x, labels)
    rows[0] = "1.5,,1"
    path = tmp_path / "points.csv"
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(InvalidParameterError, match=r"points.csv: row 1, column 2 is empty; every feature of a "
                                                    r"data row needs a number$"):
        load_file(path, "last")


def test_a_byte_order_mark_is_stripped_and_the_first_row_kept(tmp_path: Path) -> None:
    x, labels = _points()
    path = tmp_path / "points.csv"
    path.write_text("\n".join(_rows(x, labels)) + "\n", encoding="utf-8-sig")
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    data = load_file(path, "last")
    assert data.meta["n"] == 3000 and "columns" not in data.meta
    np.testing.assert_array_equal(data.x, x)
    named = tmp_path / "named.csv"
    named.write_text("x,y,label\n" + "\n".join(_rows(x[:5], labels[:5])) + "\n", encoding="utf-8-sig")
    data = load_file(named)
    assert data.meta["columns"] == ["x", "y", "label"] and data.meta["n"] == 5


def test_a_header_is_a_row_of_names_only(tmp_path: Path) -> None:
    path = tmp_path / "mixed.csv"
    path.write_text("x,2,label\n1,2,a\n3,4,b\n")
    # Names beside a number: data by the rule, and the message says how to read it as a header.
    with pytest.raises(InvalidParameterError, match=r"row 1, column 1: 'x' is not a number \(if this row is a "
                                                    r"header, say so: --header\)$"):
        load_file(path, "last")
    data = load_file(path, "last", header=True)
    assert data.x.tolist() == [[1.0, 2.0], [3.0, 4.0]] and data.meta["columns"] == ["x", "2"]
    assert data.labels is not None and data.labels.tolist() == [0, 1]
    names = tmp_path / "names.csv"
    names.write_text("x,y\n1,2\n")
    with pytest.raises(InvalidParameterError, match=r"row 1, column 1: 'x' is not a number"):
        load_file(names, header=False)
    numbers = tmp_path / "numbers.csv"
    numbers.write_text("1,2\n3,4\n")
    assert load_file(numbers).meta["n"] == 2
    assert load_file(numbers, header=True).x.tolist() == [[3.0, 4.0]]
    npy = tmp_path / "points.npy"
    np.save(npy, np.ones((2, 2)))
    with pytest.raises(InvalidParameterError, match="header applies to CSV files"):
        load_file(npy, header=False)


# -- located errors ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("content", "label_column", "message"), [
    # Rows are the file's lines as an editor numbers them: blank lines, comments and the header count.
    ("x,y\n\n# a comment\n1,2\n3,abc\n", None, r"row 5, column 2 \('y'\): 'abc' is not a number \(if column 1 holds labels, say so: --label-column 1\)$"),
    ("1;2;3\n4;;6\n", None, r"row 2, column 2 is empty"),
    ("a b\n1 2\n3 x\n", None, r"row 3, column 2 \('b'\): 'x' is not a number \(if column 1 holds labels, say so: --label-column 1\)$"),
    ("x,y,label\n1,2,a\n3,inf,b\n", "last", r"row 3, column 2 \('y'\) is inf; NaN and infinite values are not allowed"),
    ("x,y\n1,2\n3,4,5\n", None, r"row 3 has 3 columns, row 1 \(the header\) has 2$"),
    ("x,y,z\n1,2\n3,4\n", None, r"row 2 has 2 columns, row 1 \(the header\) has 3$"),
    ("\n1,2\n3\n", None, r"row 3 has 1 columns, row 2 has 2$"),
])
def test_every_bad_cell_names_its_file_row_and_column(tmp_path: Path, content: str, label_column: str | None,
                                                      message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(InvalidParameterError, match=f"^{path}: {message}"):
        load_file(path, label_column)


# -- missing labels ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("content", "message"), [
    ("x,y,label\n1,2,0\n3,4,nan\n5,6,1\n", r"row 3, label column 3 \('label'\) is 'nan'"),
    ("x,y,label\n1,2,0\n3,4,NaN\n", r"row 3, label column 3 \('label'\) is 'NaN'"),
    ("1,2,a\n3,4,\n5,6,b\n", r"row 2, label column 3 is empty"),
    ("1,2,a\n3,4,b\n5,6,nan\n", r"row 3, label column 3 is 'nan'"),
])
def test_a_missing_label_is_refused_where_it_is(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "labels.csv"
    path.write_text(content)
    with pytest.raises(InvalidParameterError, match=f"^{path}: {message}; every point needs its label"):
        load_file(path, "last")
    # Without a label column the same cells are features, checked as such.
    with pytest.raises(InvalidParameterError, match="column 3"):
        load_file(path)


def test_a_missing_label_in_an_npy_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "labels.npy"
    np.save(path, np.array([[1.0, 0.0], [2.0, np.nan], [3.0, 1.0], [4.0, np.nan]]))
    with pytest.raises(InvalidParameterError, match=r"row 2, label column 2 is nan \(2 rows in all\)"):
        load_file(path, "last")


# -- the fast path -----------------------------------------------------------------------------------

_READABLE = {
    "plain.csv": "x,y,label\n1.5,2,0\n3,4,1\n-5e-1,6,0\n",
    "text_labels.csv": "x,y,species\n1.5,2,setosa\n3,4,virginica\n5,-6e-1,setosa\n",
    "numeric_text_labels.csv": "a,b\n1,10\n2,2\n3,10\n",
    "quoted.csv": '"x","y","label"\n"1","2","a"\n"3","4","b"\n',
    "semicolons.csv": "1;2;3\n4;5;6\n",
    "tabs.tsv": "x\ty\tlabel\n1\t2\t0\n3\t4\t1\n",
    "spaces.txt": "# made by hand\n1 2 0\n\n  3   4 1\n",
    "padded.csv": "x , y , label\n 1 , 2 , a \n3,4,b\n5,6,a\n",
    "crlf.csv": "x,y,label\r\n1,2,0\r\n3,4,1\r\n",
}


@pytest.mark.parametrize("name", sorted(_READABLE))
def test_the_fast_reader_agrees_with_the_precise_one(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(_READABLE[name].encode())
    for label_column in (None, "last"):
        if label_column is None and name in ("text_labels.csv", "quoted.csv", "padded.csv"):
            continue  # text labels are not features
        layout = datasets._csv_layout(path, None)
        label_at = datasets._label_index(label_column, layout.columns, path)
        fast = datasets._fast_csv(path, layout, label_at)
        assert fast is not None, name
        precise = datasets._precise_csv(path, layout, label_at)
        np.testing.assert_array_equal(fast[0], precise[0])
        if label_column is None:
            assert fast[1] is None and precise[1] is None
        else:
            assert fast[1] is not None and precise[1] is not None
            assert fast[1].tolist() == precise[1].tolist()


def test_numeric_text_labels_sort_as_numbers(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_text("x,label\n1,10\n2,2\n3,10\n")
    data = load_file(path, "last")
    assert data.labels is not None and data.labels.tolist() == [1, 0, 1]


def test_a_clean_file_never_takes_the_slow_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x, labels = _points(200)
    path = tmp_path / "points.csv"
    path.write_text("x,y,label\n" + "\n".join(_rows(x, labels)) + "\n")

    def slow(*args: Any) -> None:
        raise AssertionError("the precise reader ran on a clean file")

    monkeypatch.setattr(datasets, "_precise_csv", slow)
    data = load_file(path, "last")
    np.testing.assert_array_equal(data.x, x)
    assert data.labels is not None and data.labels.tolist() == labels.tolist()


def test_the_slow_path_reads_what_numpy_refuses(tmp_path: Path) -> None:
    # Python's float() takes digit separators; numpy's reader does not: the precise path reads them.
    path = tmp_path / "underscores.csv"
    path.write_text("1_000,2\n3,4\n")
    assert load_file(path).x.tolist() == [[1000.0, 2.0], [3.0, 4.0]]


# -- the label hint ----------------------------------------------------------------------------------

def test_a_column_that_looks_like_labels_is_named(tmp_path: Path) -> None:
    x, labels = _points(300)
    path = tmp_path / "points.csv"
    path.write_text("\n".join(_rows(x, labels)) + "\n")
    assert label_column_hint(load_file(path)) == (2, "it holds 3 distinct integers")
    assert label_column_hint(load_file(path, "last")) is None
    named = tmp_path / "named.csv"
    named.write_text("Class,x,y\n" + "\n".join(f"{c},{a},{b}" for (a, b), c in zip(x, labels, strict=True)) + "\n")
    assert label_column_hint(load_file(named)) == (0, "its header is 'Class'")
    # "y" is a target beside other features, a coordinate beside "x".
    xy = tmp_path / "xy.csv"
    xy.write_text("x,y\n" + "\n".join(f"{a},{b}" for a, b in x) + "\n")
    assert label_column_hint(load_file(xy)) is None
    y = tmp_path / "y.csv"
    y.write_text("a,b,y\n" + "\n".join(f"{a},{b},{b}" for a, b in x) + "\n")
    assert label_column_hint(load_file(y)) == (2, "its header is 'y'")
    features = tmp_path / "features.csv"
    features.write_text("\n".join(f"{a},{b}" for a, b in x) + "\n")
    assert label_column_hint(load_file(features)) is None
    # Integers with many distinct values, or too few rows per value, are not labels.
    counts = tmp_path / "counts.csv"
    counts.write_text("\n".join(f"{a},{i}" for i, a in enumerate(x[:, 0])) + "\n")
    assert label_column_hint(load_file(counts)) is None
    few = tmp_path / "few.csv"
    few.write_text("\n".join(f"{a},{i % 3}" for i, a in enumerate(x[:14, 0])) + "\n")
    assert label_column_hint(load_file(few)) is None
