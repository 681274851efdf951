"""The dataset registry of ``ldp_collector.simulation.datasets``: shapes, seeds, options, chunked generation,
Google's demo generator, the hard 2-D shapes (spirals, rings, sizes, background), the real data sets
(scikit-learn's bundled copies, airportsdata's airports) and their errors."""

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
    size_shares,
)

REAL = {"iris": (150, 4, 3), "wine": (178, 13, 3), "digits": (1797, 64, 10), "breast_cancer": (569, 30, 2)}
#: Real data sets read otherwise than by a scikit-learn loader of the same name.
OTHER_REAL = {"digits2d", "airports"}
HARD_2D = {"spirals": (2, 8, 3), "rings": (2, 6, 3), "sizes": (2, 8, 4), "background": (1, 8, 3)}


def test_the_registry_holds_the_documented_names() -> None:
    assert set(DATASETS) == {"blobs", "moons", "circles", "aniso", "varied", "mixture", "google", *HARD_2D, *REAL,
                             *OTHER_REAL}
    assert {name for name, ds in DATASETS.items() if ds.streaming} == {"mixture", "google", *REAL, *OTHER_REAL}
    assert all(DATASETS[name].extra == "datasets" for name in {*REAL, *OTHER_REAL})
    assert {name for name, ds in DATASETS.items() if ds.background} == {"background"}
    for name, (low, high, default) in HARD_2D.items():
        ds = DATASETS[name]
        assert (ds.k_range, ds.default_k, ds.default_d, ds.fixed_d, ds.fixed_k) == ((low, high), default, 2, True, False)
        assert "\n" not in ds.description and ds.description


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_dataset_has_its_shape_labels_and_seed(name: str) -> None:
    ds = DATASETS[name]
    data = make_dataset(name, 1001, seed=3)
    x, labels = data
    assert isinstance(data, DatasetArrays) and data.x is x and data.labels is labels
    assert x.dtype == np.float64 and x.shape == (1001, ds.default_d) and np.isfinite(x).all()
    assert labels is not None and labels.dtype == np.int64 and labels.shape == (1001,)
    # Background noise is one class more (label k); a 1001-point subset of the airports can miss
    # the rarest time-zone areas (3 airports in 'Arctic').
    classes = set(range(ds.default_k + ds.background))
    if name == "airports":
        assert set(np.unique(labels).tolist()) <= classes and len(np.unique(labels)) >= 7
    else:
        assert set(np.unique(labels).tolist()) == classes
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
    ("spirals", 10_001, 3_000, {"k": 5}),
    ("background", 5_000, 1_234, {}),
    ("airports", 2 * BLOCK + 5, 50_000, {}),
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


@pytest.mark.parametrize("name", ["google", "mixture", "iris", "breast_cancer", *HARD_2D, *OTHER_REAL])
def test_the_cli_accepts_every_dataset(name: str) -> None:
    args = cli.build_parser().parse_args(["simulate", "--kind", "histogram", "--dataset", name])
    assert args.dataset == name


# -- the hard 2-D shapes -------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "low", "high"), [(name, low, high) for name, (low, high, _) in HARD_2D.items()])
def test_hard_shapes_take_k_in_their_range_only(name: str, low: int, high: int) -> None:
    for k in (low, high):
        data = make_dataset(name, 500, k=k, seed=0)
        assert data.labels is not None and data.meta["k"] == k
        assert set(np.unique(data.labels).tolist()) == set(range(k + DATASETS[name].background))
    for k in (low - 1, high + 1):
        if k < 1:
            continue
        with pytest.raises(InvalidParameterError, match=rf"dataset '{name}' has k in \[{low}, {high}\], got k = {k}"):
            make_dataset(name, 500, k=k)
    with pytest.raises(InvalidParameterError, match=f"dataset '{name}' has d = 2 only"):
        make_dataset(name, 500, d=3)


def _arm(j: int, k: int, t: np.ndarray[Any, np.dtype[np.float64]]) -> np.ndarray[Any, np.dtype[np.float64]]:
    """The noise-free arm j of ``spirals`` at parameters t (r0 = 0.15, 1.5 turns)."""
    radius = 0.15 + 0.85 * t
    angle = 2 * math.pi * j / k + 3 * math.pi * t
    return np.column_stack([radius * np.cos(angle), radius * np.sin(angle)])


def test_spiral_arms_are_equal_uniform_along_their_length_and_noisy_by_0_025() -> None:
    n, k = 12_001, 3
    x, labels = make_dataset("spirals", n, seed=2)
    assert labels is not None
    assert np.bincount(labels).tolist() == [4001, 4000, 4000]
    t = np.linspace(0.0, 1.0, 3001)
    for j in range(k):
        curve = _arm(j, k, t)
        # Arc length of every curve sample, then each point's nearest curve sample and its offset.
        length = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(curve, axis=0), axis=1))])
        points = x[labels == j]
        gaps = np.sqrt(((points[:, None, :] - curve[None, :, :]) ** 2).sum(axis=2))
        nearest = gaps.argmin(axis=1)
        offset = gaps[np.arange(len(points)), nearest]
        # The offset is the noise's normal component: half-normal with scale 0.025 (RMS 0.025), within
        # 5 standard errors of the mean square (its relative SE is sqrt(2 / m)).
        assert abs(np.mean(offset**2) / 0.025**2 - 1) < 5 * math.sqrt(2 / len(points))
        # Uniform along the arm: each tenth of the length holds m / 10 points within 5 binomial SEs (the
        # noise moves a point along the arm by ~0.025, a blur of < 1 % of the ~5.5 length).
        fraction = length[nearest] / length[-1]
        counts = np.bincount(np.minimum((fraction * 10).astype(int), 9), minlength=10)
        m = len(points)
        assert np.all(np.abs(counts - m / 10) < 5 * math.sqrt(m * 0.1 * 0.9) + 0.01 * m), counts
    # The documented gap: along a ray, neighbouring arms cross 0.85 / (1.5 k) apart.
    ray = 0.0
    crossings = sorted(0.15 + 0.85 * ((ray - 2 * math.pi * j / k) % (2 * math.pi) + 2 * math.pi * turn) / (3 * math.pi)
                       for j in range(k) for turn in range(2))
    inside = [r for r in crossings if r <= 1.0]
    assert np.allclose(np.diff(inside), 0.85 / (1.5 * k))


def test_rings_have_their_radii_equal_counts_and_radial_noise() -> None:
    n, k = 30_001, 4
    x, labels = make_dataset("rings", n, k=k, seed=7)
    assert labels is not None
    assert np.bincount(labels).tolist() == [7501, 7500, 7500, 7500]
    radius = np.linalg.norm(x, axis=1)
    for j in range(k):
        r = radius[labels == j]
        assert abs(r.mean() - (j + 1)) < 5 * 0.1 / math.sqrt(len(r)), (j, r.mean())
        assert r.std() == pytest.approx(0.1, rel=5 * math.sqrt(1 / (2 * len(r))))
        # Uniform angle: the mean resultant vector of m uniform angles has |.|^2 ~ Exp(1) / m.
        angle = np.arctan2(x[labels == j, 1], x[labels == j, 0])
        assert np.abs(np.exp(1j * angle).mean()) ** 2 < 10 / len(r)


def test_sizes_fall_geometrically_to_one_percent() -> None:
    for k in range(2, 9):
        shares = size_shares(k)
        assert shares.sum() == pytest.approx(1.0) and shares[-1] == pytest.approx(0.01, abs=1e-12)
        assert np.allclose(shares[1:] / shares[:-1], shares[1] / shares[0]), "geometric"
        assert np.all(np.diff(shares) < 0)
    assert np.round(size_shares(4), 3).tolist() == [0.767, 0.181, 0.042, 0.01]
    n = 100_000
    x, labels = make_dataset("sizes", n, seed=3)
    assert labels is not None
    counts = np.bincount(labels)
    assert counts.sum() == n and np.all(np.abs(counts - n * size_shares(4)) < 1)
    assert counts[-1] == 1000
    means = np.array([x[labels == j].mean(axis=0) for j in range(4)])
    spreads = np.array([x[labels == j].std(axis=0) for j in range(4)])
    assert np.allclose(spreads, 1.0, rtol=0.1)
    distances = [np.linalg.norm(means[a] - means[b]) for a in range(4) for b in range(a + 1, 4)]
    assert min(distances) >= 8.0, "centres at least 8 standard deviations apart"
    assert min(distances) == pytest.approx(10.0, abs=0.5)


def test_background_is_ten_percent_uniform_over_the_widened_box_with_label_k() -> None:
    n, k = 50_003, 3
    data = make_dataset("background", n, seed=4)
    x, labels = data
    assert labels is not None and data.meta["background_label"] == k
    counts = np.bincount(labels)
    assert counts[k] == n // 10 and counts[:k].tolist() == [15_001, 15_001, 15_001]
    means = np.array([x[labels == j].mean(axis=0) for j in range(k)])
    assert np.allclose([x[labels == j].std(axis=0) for j in range(k)], 1.0, rtol=0.05)
    distances = [np.linalg.norm(means[a] - means[b]) for a in range(k) for b in range(a + 1, k)]
    assert min(distances) >= 8.0
    noise = x[labels == k]
    # Uniform over [min c - 6, max c + 6] per axis (c the centres, estimated by the means to 0.03).
    low, high = means.min(axis=0) - 6.0, means.max(axis=0) + 6.0
    assert np.all(noise >= low - 0.05) and np.all(noise <= high + 0.05)
    # The box is filled to its edges: the gap of m uniform points to an edge is ~ width / m.
    assert np.all(np.abs(noise.min(axis=0) - low) < 0.1) and np.all(np.abs(noise.max(axis=0) - high) < 0.1)
    # Each half of the box holds half of the background, within 5 binomial SEs.
    m = len(noise)
    for axis in range(2):
        left = np.sum(noise[:, axis] < (low[axis] + high[axis]) / 2)
        assert abs(left - m / 2) < 5 * math.sqrt(m / 4)


@pytest.mark.parametrize(("name", "eps"), [("spirals", 0.05), ("rings", 0.2)])
def test_dbscan_separates_the_true_points(name: str, eps: float) -> None:
    cluster = pytest.importorskip("sklearn.cluster")
    metrics = pytest.importorskip("sklearn.metrics")
    for seed in range(3):
        x, labels = make_dataset(name, 5000, seed=seed)
        predicted = cluster.DBSCAN(eps=eps, min_samples=10).fit_predict(x)
        assert metrics.adjusted_rand_score(labels, predicted) >= 0.95, seed


# -- the 2-D real data sets ----------------------------------------------------------------------------

def test_digits2d_is_the_digits_on_their_first_two_principal_components() -> None:
    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA

    real_x, real_y = load_digits(return_X_y=True)
    pca = PCA(n_components=2).fit(real_x)
    # The module's sign rule: each axis' largest loading positive.
    signs = np.sign(pca.components_[np.arange(2), np.abs(pca.components_).argmax(axis=1)])
    expected = pca.transform(real_x) * signs
    data = make_dataset("digits2d", 1797, seed=0)
    assert data.meta["source"] == "sklearn.datasets.load_digits, 2 principal components"
    assert data.meta["real_size"] == 1797 and "subsampled_from" not in data.meta
    assert data.labels is not None
    # All of the projected points (shuffled), each with its digit.
    order, real_order = np.lexsort(data.x.T[::-1]), np.lexsort(expected.T[::-1])
    assert np.allclose(data.x[order], expected[real_order], atol=1e-8)
    assert np.array_equal(data.labels[order], real_y[real_order])


def test_airports_are_airportsdatas_longitude_and_latitude_by_time_zone_area() -> None:
    airportsdata = pytest.importorskip("airportsdata")
    from ldp_collector.simulation.datasets import AIRPORT_REGIONS

    airports = list(airportsdata.load("ICAO").values())
    size = len(airports)
    data = make_dataset("airports", size, seed=0)
    assert data.meta["source"] == f"airportsdata {airportsdata.__version__}" and data.meta["real_size"] == size
    assert data.labels is not None and data.x.shape == (size, 2)
    assert np.all(np.abs(data.x[:, 0]) <= 180) and np.all(np.abs(data.x[:, 1]) <= 90)
    expected = {(float(a["lon"]), float(a["lat"]), AIRPORT_REGIONS.index(a["tz"].split("/")[0] or "Antarctica"))
                for a in airports}
    assert {(lon, lat, int(label)) for (lon, lat), label in zip(data.x.tolist(), data.labels, strict=True)} == expected
    assert set(data.labels.tolist()) == set(range(len(AIRPORT_REGIONS)))
    # Strongly non-uniform: the top 1 % of the globe's 5 x 5 degree cells hold over a quarter of the
    # airports (38 % in the 2026 release), where a uniform spread over land would put about 3 %.
    cell = np.floor((data.x[:, 0] + 180) / 5).clip(0, 71) * 36 + np.floor((data.x[:, 1] + 90) / 5).clip(0, 35)
    counts = np.sort(np.bincount(cell.astype(np.int64), minlength=72 * 36))[::-1]
    assert counts[:26].sum() > 0.25 * size
    up = make_dataset("airports", 100_000, seed=0)
    assert up.meta["upsampled_from"] == size and up.meta["jitter"] == 0.01


def test_a_missing_airportsdata_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from ldp_collector.simulation import datasets

    real_import_module = importlib.import_module

    def no_airportsdata(name: str, package: str | None = None) -> Any:
        if name.split(".")[0] == "airportsdata":
            raise ImportError(f"No module named {name!r}")
        return real_import_module(name, package)

    datasets._real_data.cache_clear()
    monkeypatch.setattr(importlib, "import_module", no_airportsdata)
    try:
        with pytest.raises(DatasetsExtraMissingError,
                           match=r"'airports' is read from airportsdata's bundled data, and airportsdata is not "
                                 r'installed .*install it with: pip install "ldp-collector\[datasets\]"'):
            make_dataset("airports", 100)
    finally:
        datasets._real_data.cache_clear()
