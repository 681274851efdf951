"""The dataset registry of ``ldp_collector.simulation.datasets``: shapes, seeds, options, chunked generation,
Google's demo generator, the real data sets (scikit-learn's bundled copies) and their errors."""

from __future__ import annotations

import importlib
import math
import pickle
from typing import Any

import numpy as np
import pytest

from ldp_client.errors import InvalidParameterError, LdpError
from ldp_collector import cli
from ldp_collector.simulation.datasets import (
    BLOCK,
    DATASETS,
    DatasetArrays,
    DatasetsExtraMissingError,
    iter_chunks,
    load_file,
    make_dataset,
)

REAL = {"iris": (150, 4, 3), "wine": (178, 13, 3), "digits": (1797, 64, 10), "breast_cancer": (569, 30, 2)}


def test_the_registry_holds_the_documented_names() -> None:
    assert set(DATASETS) == {"blobs", "moons", "circles", "aniso", "varied", "mixture", "google", *REAL}
    assert {name for name, ds in DATASETS.items() if ds.streaming} == {"mixture", "google", *REAL}
    assert all(DATASETS[name].extra == "datasets" for name in REAL)


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_dataset_has_its_shape_labels_and_seed(name: str) -> None:
    ds = DATASETS[name]
    data = make_dataset(name, 1001, seed=3)
    x, labels = data
    assert isinstance(data, DatasetArrays) and data.x is x and data.labels is labels
    assert x.dtype == np.float64 and x.shape == (1001, ds.default_d) and np.isfinite(x).all()
    assert labels is not None and labels.dtype == np.int64 and labels.shape == (1001,)
    assert set(np.unique(labels).tolist()) == set(range(ds.default_k))
    assert data.meta["name"] == name and data.meta["n"] == 1001 and data.meta["seed"] == 3
    assert data.meta["d"] == ds.default_d and data.meta["k"] == ds.default_k
    again = make_dataset(name, 1001, seed=3)
    assert again.labels is not None
    assert np.array_equal(x, again.x) and np.array_equal(labels, again.labels), "a seed must reproduce the data"
    assert not np.array_equal(x, make_dataset(name, 1001, seed=4).x)


@pytest.mark.parametrize(("name", "n", "chunk", "kwargs"), [
    ("mixture", 3 * BLOCK + 17, 50_000, {"d": 3, "k": 5}),
    ("mixture", 2 * BLOCK, BLOCK, {"d": 2, "k": 2, "imbalance": 4.0, "separation": 2.0}),
    ("google", BLOCK + 1, 7_777, {"d": 10, "k": 6, "ratio": 20.0}),
    ("iris", 150_000, 40_000, {"jitter": 0.2}),
    ("wine", 100, 33, {}),
    ("blobs", 10_001, 1_000, {"d": 4, "k": 3}),
    ("moons", 999, 1_000, {}),
])
def test_chunks_concatenate_to_the_in_memory_data(name: str, n: int, chunk: int, kwargs: dict[str, Any]) -> None:
    whole = make_dataset(name, n, seed=11, **kwargs)
    chunks = list(iter_chunks(name, n, chunk, seed=11, **kwargs))
    assert [len(c.x) for c in chunks] == [min(chunk, n - s) for s in range(0, n, chunk)]
    assert [c.meta["offset"] for c in chunks] == list(range(0, n, chunk))
    assert np.array_equal(np.vstack([c.x for c in chunks]), whole.x)
    assert whole.labels is not None
    assert np.array_equal(np.concatenate([c.labels for c in chunks if c.labels is not None]), whole.labels)
    assert {key: v for key, v in chunks[0].meta.items() if key != "offset"} == dict(whole.meta)


def test_iter_chunks_checks_its_arguments_at_once() -> None:
    with pytest.raises(InvalidParameterError, match=r"chunk must be an integer in \[1, "):
        iter_chunks("mixture", 100, 0)
    with pytest.raises(InvalidParameterError, match="unknown dataset 'nope'"):
        iter_chunks("nope", 100)
    with pytest.raises(InvalidParameterError, match="dataset 'mixture' has no option 'ratio'"):
        iter_chunks("mixture", 100, ratio=3.0)


def test_google_generator_follows_the_demo() -> None:
    d, k, ratio = 20, 4, 10.0
    x, labels = make_dataset("google", 200_000, d=d, k=k, seed=5, ratio=ratio)
    assert labels is not None
    norms = np.linalg.norm(x, axis=1)
    assert norms.max() <= 1.0 + 1e-12, "points are clipped to the unit ball"
    sigma = 1.0 / (ratio * math.sqrt(d))
    means = np.array([x[labels == j].mean(axis=0) for j in range(k)])
    assert (np.linalg.norm(means, axis=1) <= 1.0 - 1.0 / ratio + 0.01).all(), "centers inside radius 1 - 1/ratio"
    inside = norms < 0.95  # far from the clip: the per-dimension spread is sigma
    spread = (x[inside] - means[labels[inside]]).std(axis=0)
    assert np.allclose(spread, sigma, rtol=0.05)
    # Uniform cluster choice: every count within 5 standard errors of n / k.
    counts = np.bincount(labels, minlength=k)
    assert np.all(np.abs(counts - 50_000) <= 5 * math.sqrt(200_000 * 0.25 * 0.75))
    meta = make_dataset("google", 10, seed=0).meta
    assert meta["ratio"] == 10.0 and meta["sigma"] == pytest.approx(1.0 / (10.0 * math.sqrt(2)))
    # A small ratio puts much of the mass past the unit sphere: clipped onto it.
    x, _ = make_dataset("google", 5000, d=2, k=3, seed=1, ratio=1.5)
    assert np.linalg.norm(x, axis=1).max() <= 1.0 + 1e-12
    with pytest.raises(InvalidParameterError, match=r"ratio must be a number in \(1, 1e\+06\], got 1.0"):
        make_dataset("google", 10, ratio=1.0)


def test_mixture_separation_and_imbalance() -> None:
    k = 6
    x, labels = make_dataset("mixture", 120_000, d=3, k=k, seed=2, imbalance=8.0, separation=4.0)
    assert labels is not None
    counts = np.bincount(labels, minlength=k)
    weights = 8.0 ** (-np.arange(k) / (k - 1))
    expected = 120_000 * weights / weights.sum()
    assert np.all(np.abs(counts - expected) <= 5 * np.sqrt(expected)), counts
    means = np.array([x[labels == j].mean(axis=0) for j in range(k)])
    stds = np.array([x[labels == j].std(axis=0).mean() for j in range(k)])
    ratios = [np.linalg.norm(means[a] - means[b]) / (stds[a] + stds[b]) for a in range(k) for b in range(a + 1, k)]
    assert min(ratios) == pytest.approx(4.0, rel=0.05)
    # separation moves the centers only: the same components are drawn for the same points.
    _, plain_labels = make_dataset("mixture", 120_000, d=3, k=k, seed=2, imbalance=8.0)
    assert plain_labels is not None and np.array_equal(plain_labels, labels)
    equal = make_dataset("mixture", 60_000, k=3, seed=0, imbalance=1.0).labels
    assert equal is not None and np.all(np.abs(np.bincount(equal) - 20_000) < 5 * math.sqrt(20_000))


def test_option_errors_are_clear() -> None:
    with pytest.raises(InvalidParameterError, match="dataset 'moons' has no option 'separation'; it takes none"):
        make_dataset("moons", 10, separation=2.0)
    with pytest.raises(InvalidParameterError, match="dataset 'google' has no option 'imbalance'; it takes ratio"):
        make_dataset("google", 10, imbalance=2.0)
    with pytest.raises(InvalidParameterError, match=r"imbalance must be a number in \[1, 1e\+06\], got 0.5"):
        make_dataset("mixture", 10, imbalance=0.5)
    with pytest.raises(InvalidParameterError, match=r"separation must be a number in \(0, 1000\], got nan"):
        make_dataset("mixture", 10, separation=math.nan)
    with pytest.raises(InvalidParameterError, match=r"jitter must be a number in \[0, 10\], got True"):
        make_dataset("iris", 10, jitter=True)
    with pytest.raises(InvalidParameterError, match="dataset 'iris' has d = 4 only, got d = 2"):
        make_dataset("iris", 10, d=2)
    with pytest.raises(InvalidParameterError, match=r"n must be an integer in \[1, 10000000\], got 10000001"):
        make_dataset("mixture", 10_000_001)
    with pytest.raises(InvalidParameterError, match="seed must be a non-negative integer"):
        make_dataset("google", 10, seed=-1)


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_data_sets_are_scikit_learns(name: str) -> None:
    from sklearn import datasets as skd

    size, d, k = REAL[name]
    real_x, real_y = getattr(skd, f"load_{name}")(return_X_y=True)
    data = make_dataset(name, size, seed=0)
    assert data.labels is not None
    # All of the points (shuffled), with their classes.
    order = np.lexsort(data.x.T[::-1])
    real_order = np.lexsort(real_x.T[::-1])
    assert np.array_equal(data.x[order], real_x[real_order])
    assert np.array_equal(data.labels[order], real_y[real_order])
    assert "upsampled_from" not in data.meta and "subsampled_from" not in data.meta
    assert data.meta["real_size"] == size and data.meta["source"] == f"sklearn.datasets.load_{name}"
    subset = make_dataset(name, size // 2, seed=0)
    assert subset.meta["subsampled_from"] == size and len(np.unique(subset.x, axis=0)) == size // 2


def test_upsampled_real_data_are_labelled_as_such() -> None:
    from sklearn.datasets import load_iris

    real_x, real_y = load_iris(return_X_y=True)
    data = make_dataset("iris", 30_000, seed=1)
    assert data.meta["upsampled_from"] == 150 and data.meta["jitter"] == 0.1
    assert data.x.shape == (30_000, 4) and data.labels is not None
    assert np.bincount(data.labels).min() > 9000  # classes kept (50 each in the real set)
    # Each point is a real point of its class plus jitter of 0.1 feature standard deviations.
    nearest = ((data.x[:2000, None, :] - real_x[None]) ** 2).sum(axis=2).argmin(axis=1)
    assert np.mean(real_y[nearest] == data.labels[:2000]) > 0.95
    assert np.allclose((data.x - real_x.mean(axis=0)).std(axis=0),
                       real_x.std(axis=0) * math.sqrt(1 + 0.01), rtol=0.05)
    exact = make_dataset("iris", 1000, seed=1, jitter=0.0)
    assert {tuple(p) for p in exact.x} <= {tuple(p) for p in real_x}


def test_a_missing_scikit_learn_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from ldp_collector.simulation import datasets

    real_import_module = importlib.import_module

    def no_sklearn(name: str, package: str | None = None) -> Any:
        if name.split(".")[0] == "sklearn":
            raise ImportError(f"No module named {name!r}")
        return real_import_module(name, package)

    datasets._real_data.cache_clear()
    monkeypatch.setattr(importlib, "import_module", no_sklearn)
    try:
        with pytest.raises(DatasetsExtraMissingError, match=r'install it with: pip install "ldp-collector\[datasets\]"'):
            make_dataset("wine", 100)
        assert issubclass(DatasetsExtraMissingError, LdpError) and issubclass(DatasetsExtraMissingError, ImportError)
        assert make_dataset("google", 10).x.shape == (10, 2)  # the generated data need nothing
    finally:
        datasets._real_data.cache_clear()


def test_dataset_arrays_pickle_with_their_meta() -> None:
    data = make_dataset("iris", 500, seed=2)
    back = pickle.loads(pickle.dumps(data))
    assert isinstance(back, DatasetArrays) and dict(back.meta) == dict(data.meta)
    assert np.array_equal(back.x, data.x)
    with pytest.raises(TypeError):
        data.meta["n"] = 3  # type: ignore[index]


def test_load_file_describes_the_file(tmp_path: Any) -> None:
    path = tmp_path / "points.npy"
    np.save(path, np.array([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]))
    data = load_file(path, label_column="last")
    assert data.meta == {"name": "file", "source": str(path), "n": 2, "d": 2, "k": 2}
    x, labels = data
    assert x.shape == (2, 2) and labels is not None


@pytest.mark.parametrize("name", ["google", "mixture", "iris", "breast_cancer"])
def test_the_cli_accepts_every_dataset(name: str) -> None:
    args = cli.build_parser().parse_args(["simulate", "--kind", "histogram", "--dataset", name])
    assert args.dataset == name
