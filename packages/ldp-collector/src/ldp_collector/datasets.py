"""Datasets for simulations, demos and benchmarks: generated in code or loaded from a local file.

Every generator returns ``(X, labels)``: ``X`` a float64 array of shape ``(n, d)``, ``labels`` an
int64 array of shape ``(n,)`` with the generating cluster of each point (``None`` for unlabelled
data). The 2-D shapes follow scikit-learn's generators and its clustering comparison gallery
(``make_moons``, ``make_circles``, ``make_blobs``, and the anisotropic and varied-variance blobs),
reimplemented in numpy so the collector needs no scikit-learn:

==========  ===========================================================  ==========
name        what                                                         d, k
==========  ===========================================================  ==========
blobs       isotropic Gaussian blobs, centers uniform in [-10, 10]^d    any, any
moons       two interleaving half circles, noise 0.05                    2, 2
circles     a small circle inside a large one (factor 0.5), noise 0.05  2, 2
aniso       three blobs sheared by [[0.6, -0.6], [-0.4, 0.8]]            2, 3
varied      three blobs with standard deviations 1.0, 2.5 and 0.5       2, 3
mixture     Gaussian mixture with unequal weights and spreads           any, any
==========  ===========================================================  ==========

Randomness comes from ``numpy.random.default_rng(seed)``: the data are reproducible and say
nothing about privacy (the devices' randomization is the SDK's business).

:func:`load_file` reads a CSV or ``.npy`` file, optionally splitting off a label column.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from ldp_client.errors import InvalidParameterError

__all__ = [
    "DATASETS",
    "MAX_POINTS",
    "Dataset",
    "DatasetArrays",
    "load_file",
    "make_dataset",
]

#: Largest number of points a generator makes (about 800 MB of float64 at d = 100).
MAX_POINTS = 10_000_000
#: Largest dimension of the generators that take ``d``.
MAX_DIMENSION = 1024
#: Largest number of clusters of the generators that take ``k``.
MAX_CLUSTERS = 4096

DatasetArrays = tuple[NDArray[np.float64], "NDArray[np.int64] | None"]
Generator = Callable[[int, int, int, np.random.Generator], tuple[NDArray[np.float64], NDArray[np.int64]]]


@dataclass(frozen=True, kw_only=True)
class Dataset:
    """One registered generator.

    Attributes
    ----------
    name : str
    description : str
        One line, for ``--help`` and listings.
    generate : callable
        ``generate(n, d, k, rng) -> (X, labels)``.
    default_d, default_k : int
        Dimension and number of clusters used when the caller gives none.
    fixed_d, fixed_k : bool
        Whether the shape only exists with its defaults (moons is 2-D with 2 clusters).
    """

    name: str
    description: str
    generate: Generator
    default_d: int = 2
    default_k: int = 3
    fixed_d: bool = False
    fixed_k: bool = False

    def __call__(self, n: int, *, d: int | None = None, k: int | None = None, seed: int = 0) -> DatasetArrays:
        """Generate ``n`` points; see :func:`make_dataset`."""
        n = _check_count("n", n, 1, MAX_POINTS)
        d = self._resolve("d", d, self.default_d, self.fixed_d, MAX_DIMENSION)
        k = self._resolve("k", k, self.default_k, self.fixed_k, MAX_CLUSTERS)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise InvalidParameterError(f"seed must be a non-negative integer, got {seed!r}")
        x, labels = self.generate(n, d, k, np.random.default_rng(int(seed)))
        return np.ascontiguousarray(x, dtype=np.float64), labels.astype(np.int64, copy=False)

    def _resolve(self, name: str, value: int | None, default: int, fixed: bool, high: int) -> int:
        if value is None:
            return default
        value = _check_count(name, value, 1, high)
        if fixed and value != default:
            raise InvalidParameterError(
                f"dataset {self.name!r} has {name} = {default} only, got {name} = {value}")
        return value


def _check_count(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise InvalidParameterError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def _shuffle(x: NDArray[np.float64], labels: NDArray[np.int64],
             rng: np.random.Generator) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    order = rng.permutation(len(labels))
    return x[order], labels[order]


def _split_sizes(n: int, weights: NDArray[np.float64]) -> NDArray[np.int64]:
    """``n`` split in proportion to ``weights``, every share rounded down and the rest handed out
    to the largest remainders (sizes sum to ``n`` exactly)."""
    exact = n * weights / weights.sum()
    sizes: NDArray[np.int64] = np.floor(exact).astype(np.int64)
    rest = n - int(sizes.sum())
    if rest:
        sizes[np.argsort(-(exact - sizes), kind="stable")[:rest]] += 1
    return sizes


def _gaussian_blobs(sizes: NDArray[np.int64], centers: NDArray[np.float64], stds: NDArray[np.float64],
                    rng: np.random.Generator) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """``sizes[j]`` points from N(centers[j], stds[j]^2 I), labelled j (unshuffled)."""
    d = centers.shape[1]
    labels = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    x = rng.normal(size=(int(sizes.sum()), d)) * stds[labels, None] + centers[labels]
    return x, labels


def blobs(n: int, d: int, k: int, rng: np.random.Generator) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Like ``sklearn.datasets.make_blobs(n, n_features=d, centers=k, cluster_std=1.0)``.

    Centers uniform in ``[-10, 10]^d``; the first ``n % k`` blobs get one point more.
    """
    centers = rng.uniform(-10.0, 10.0, size=(k, d))
    sizes = np.full(k, n // k, dtype=np.int64)
    sizes[: n % k] += 1
    x, labels = _gaussian_blobs(sizes, centers, np.ones(k), rng)
    return _shuffle(x, labels, rng)


def moons(n: int, d: int, k: int, rng: np.random.Generator) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Like ``sklearn.datasets.make_moons(n, noise=0.05)``: two interleaving half circles."""
    n_out = n // 2
    n_in = n - n_out
    t_out = np.linspace(0.0, math.pi, n_out)
    t_in = np.linspace(0.0, math.pi, n_in)
    x = np.vstack([
        np.column_stack([np.cos(t_out), np.sin(t_out)]),
        np.column_stack([1.0 - np.cos(t_in), 1.0 - np.sin(t_in) - 0.5]),
    ])
    labels = np.concatenate([np.zeros(n_out, dtype=np.int64), np.ones(n_in, dtype=np.int64)])
    x, labels = _shuffle(x, labels, rng)
    return x + rng.normal(scale=0.05, size=x.shape), labels


def circles(n: int, d: int, k: int, rng: np.random.Generator) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Like ``sklearn.datasets.make_circles(n, noise=0.05, factor=0.5)``: label 0 outside, 1 inside."""
    n_out = n // 2
    n_in = n - n_out
    t_out = np.linspace(0.0, 2.0 * math.pi, n_out, endpoint=False)
    t_in = np.linspace(0.0, 2.0 * math.pi, n_in, endpoint=False)
    x = np.vstack([
        np.column_stack([np.cos(t_out), np.sin(t_out)]),
        0.5 * np.column_stack([np.cos(t_in), np.sin(t_in)]),
    ])
    labels = np.concatenate([np.zeros(n_out, dtype=np.int64), np.ones(n_in, dtype=np.int64)])
    x, labels = _shuffle(x, labels, rng)
    return x + rng.normal(scale=0.05, size=x.shape), labels


def aniso(n: int, d: int, k: int, rng: np.random.Generator) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Three blobs sheared by ``[[0.6, -0.6], [-0.4, 0.8]]`` (scikit-learn's clustering gallery)."""
    x, labels = blobs(n, 2, 3, rng)
    return x @ np.array([[0.6, -0.6], [-0.4, 0.8]]), labels


def varied(n: int, d: int, k: int, rng: np.random.Generator) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Three blobs with standard deviations 1.0, 2.5 and 0.5 (scikit-learn's clustering gallery)."""
    centers = rng.uniform(-10.0, 10.0, size=(3, 2))
    sizes = np.full(3, n // 3, dtype=np.int64)
    sizes[: n % 3] += 1
    x, labels = _gaussian_blobs(sizes, centers, np.array([1.0, 2.5, 0.5]), rng)
    return _shuffle(x, labels, rng)


def mixture(n: int, d: int, k: int, rng: np.random.Generator) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """A Gaussian mixture: centers uniform in ``[-10, 10]^d``, weights from a Dirichlet(4) draw
    (unequal but none negligible), standard deviations uniform in ``[0.5, 1.5]``."""
    centers = rng.uniform(-10.0, 10.0, size=(k, d))
    weights = rng.dirichlet(np.full(k, 4.0))
    stds = rng.uniform(0.5, 1.5, size=k)
    x, labels = _gaussian_blobs(_split_sizes(n, weights), centers, stds, rng)
    return _shuffle(x, labels, rng)


#: The generators by name.
DATASETS: dict[str, Dataset] = {
    ds.name: ds
    for ds in (
        Dataset(name="blobs", description="isotropic Gaussian blobs (d, k)", generate=blobs),
        Dataset(name="moons", description="two interleaving half circles (2-D, 2 clusters)", generate=moons,
                default_k=2, fixed_d=True, fixed_k=True),
        Dataset(name="circles", description="a circle inside a circle (2-D, 2 clusters)", generate=circles,
                default_k=2, fixed_d=True, fixed_k=True),
        Dataset(name="aniso", description="three sheared blobs (2-D, 3 clusters)", generate=aniso,
                fixed_d=True, fixed_k=True),
        Dataset(name="varied", description="three blobs of different spreads (2-D, 3 clusters)", generate=varied,
                fixed_d=True, fixed_k=True),
        Dataset(name="mixture", description="Gaussian mixture with unequal weights and spreads (d, k)",
                generate=mixture, default_k=4),
    )
}


def make_dataset(name: str, n: int, *, d: int | None = None, k: int | None = None, seed: int = 0) -> DatasetArrays:
    """Generate ``n`` points of the registered dataset ``name``.

    Parameters
    ----------
    name : str
        A key of :data:`DATASETS`.
    n : int
        Number of points, in ``[1, MAX_POINTS]``.
    d, k : int, optional
        Dimension and number of clusters; only ``blobs`` and ``mixture`` accept values other than
        their defaults.
    seed : int
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        Points ``(n, d)`` float64 and their cluster labels ``(n,)`` int64.

    Raises
    ------
    InvalidParameterError
        Unknown name (the message lists the known ones) or a parameter out of range.
    """
    try:
        dataset = DATASETS[name]
    except (KeyError, TypeError):
        raise InvalidParameterError(
            f"unknown dataset {name!r}; known datasets: {', '.join(sorted(DATASETS))}") from None
    return dataset(n, d=d, k=k, seed=seed)


# -- files ------------------------------------------------------------------------------------------

def _label_index(label_column: int | str | None, columns: int, path: Path) -> int | None:
    if label_column is None:
        return None
    if label_column == "last":
        index = columns - 1
    elif isinstance(label_column, (int, np.integer)) and not isinstance(label_column, bool):
        index = int(label_column) + columns if label_column < 0 else int(label_column)
    else:
        raise InvalidParameterError(f"label_column must be None, an integer or 'last', got {label_column!r}")
    if not 0 <= index < columns:
        raise InvalidParameterError(
            f"{path}: label_column {label_column!r} is outside the file's {columns} columns")
    if columns < 2:
        raise InvalidParameterError(f"{path}: a label column needs at least one more column for the features")
    return index


def _factorize(values: NDArray[np.generic] | list[str]) -> NDArray[np.int64]:
    """Labels as 0 .. m-1 in sorted order of the distinct values (integers keep their order)."""
    _, inverse = np.unique(np.asarray(values), return_inverse=True)
    out: NDArray[np.int64] = inverse.reshape(-1).astype(np.int64)
    return out


def _read_csv(path: Path) -> list[list[str]]:
    """Rows of non-blank lines; the delimiter is the first of ``,`` ``;`` tab found in the first
    line, else runs of whitespace."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            lines = [line for line in f.read().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    except UnicodeDecodeError as exc:
        raise InvalidParameterError(f"{path} is not a UTF-8 text file: {exc}") from None
    if not lines:
        raise InvalidParameterError(f"{path} holds no data rows")
    delimiter = next((c for c in (",", ";", "\t") if c in lines[0]), None)
    if delimiter is None:
        return [line.split() for line in lines]
    return [[cell.strip() for cell in row] for row in csv.reader(lines, delimiter=delimiter)]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _load_csv(path: Path, label_column: int | str | None) -> DatasetArrays:
    rows = _read_csv(path)
    columns = len(rows[0])
    label_at = _label_index(label_column, columns, path)
    # A first row whose features are not all numbers is a header (text labels are data).
    if not all(_is_number(c) for j, c in enumerate(rows[0]) if j != label_at):
        rows = rows[1:]
        if not rows:
            raise InvalidParameterError(f"{path} holds a header but no data rows")
    for i, row in enumerate(rows):
        if len(row) != columns:
            raise InvalidParameterError(
                f"{path}: data row {i + 1} has {len(row)} columns, the first row has {columns}")
    feature_columns = [j for j in range(columns) if j != label_at]
    try:
        x = np.array([[float(row[j]) for j in feature_columns] for row in rows], dtype=np.float64)
    except ValueError as exc:
        raise InvalidParameterError(f"{path}: a feature value is not a number ({exc})") from None
    labels = None
    if label_at is not None:
        raw = [row[label_at] for row in rows]
        labels = _factorize(_numeric_labels(raw) if all(_is_number(v) for v in raw) else raw)
    return x, labels


def _numeric_labels(raw: list[str]) -> NDArray[np.float64]:
    return np.array([float(v) for v in raw], dtype=np.float64)


def _load_npy(path: Path, label_column: int | str | None) -> DatasetArrays:
    try:
        data = np.load(path, allow_pickle=False)
    except ValueError as exc:  # object arrays, or not an .npy file at all
        raise InvalidParameterError(f"{path} is not a numeric .npy array: {exc}") from None
    if not isinstance(data, np.ndarray):
        raise InvalidParameterError(f"{path} is not a single .npy array")
    if data.ndim == 1 and label_column is None:
        data = data[:, None]
    if data.ndim != 2 or data.shape[0] == 0:
        raise InvalidParameterError(f"{path}: expected a non-empty 2-D array (points x columns), got shape {data.shape}")
    if not (np.issubdtype(data.dtype, np.number) or data.dtype == np.bool_):
        raise InvalidParameterError(f"{path}: expected a numeric array, got dtype {data.dtype}")
    label_at = _label_index(label_column, data.shape[1], path)
    labels = None
    if label_at is not None:
        labels = _factorize(data[:, label_at])
        data = np.delete(data, label_at, axis=1)
    return data.astype(np.float64), labels


def load_file(path: str | os.PathLike[str], label_column: int | str | None = None) -> DatasetArrays:
    """Read points (and optionally labels) from a CSV or ``.npy`` file.

    Parameters
    ----------
    path : path-like
        ``.csv`` (comma, semicolon, tab or space separated; a non-numeric first row is a header) or
        ``.npy`` (a 2-D numeric array; a 1-D array is one feature).
    label_column : None, int or "last"
        Column holding the labels (negative indices count from the end); ``None`` when the file
        holds features only. Labels may be any values (text in CSV); they are mapped to
        ``0 .. m-1`` in sorted order.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray or None)
        Points ``(n, d)`` float64 and labels ``(n,)`` int64 (``None`` without a label column).

    Raises
    ------
    InvalidParameterError
        The file is missing or unreadable, of another format, ragged, empty, holds a non-numeric,
        NaN or infinite feature, or ``label_column`` is outside its columns. The message names the
        file.
    """
    p = Path(path)
    if not p.is_file():
        raise InvalidParameterError(f"data file {str(p)!r} does not exist or is not a file")
    suffix = p.suffix.lower()
    try:
        if suffix == ".npy":
            x, labels = _load_npy(p, label_column)
        elif suffix in (".csv", ".tsv", ".txt"):
            x, labels = _load_csv(p, label_column)
        else:
            raise InvalidParameterError(f"data file {str(p)!r}: unsupported format {suffix or '(none)'!r}; "
                                        "use .csv (or .tsv/.txt) or .npy")
    except OSError as exc:
        raise InvalidParameterError(f"cannot read data file {str(p)!r}: {exc.strerror or exc}") from None
    if x.shape[1] == 0:
        raise InvalidParameterError(f"{p}: no feature columns")
    bad = ~np.isfinite(x)
    if bad.any():
        row, col = (int(v) for v in np.argwhere(bad)[0])
        raise InvalidParameterError(f"{p}: feature value at row {row + 1}, column {col + 1} is {float(x[row, col])}; "
                                    "NaN and infinite values are not allowed")
    return np.ascontiguousarray(x), labels
