"""Clustering scores: the one implementation the simulator, the CLI and the benchmarks use.

numpy only (no scipy or scikit-learn at run time); the tests pin every score against
scikit-learn's and the assignment against ``scipy.optimize.linear_sum_assignment``.

Lower is better
    :func:`kmeans_cost` (sum of weighted squared distances to the nearest center),
    :func:`cost_per_point` (cost / n), :func:`nicv` (squared distances to each cluster's own
    mean, / n: the NICV of Su et al. 2016 and the later DP k-means papers),
    :func:`center_error` (mean distance between optimally matched true and found centers).
Higher is better (1 = perfect)
    :func:`adjusted_rand_index` (Hubert and Arabie; about 0 for chance),
    :func:`normalized_mutual_info` (MI over the arithmetic mean of the entropies, scikit-learn's
    default), :func:`fowlkes_mallows_index` (geometric mean of pair precision and recall),
    :func:`hungarian_accuracy` (share of points right under the best one-to-one matching of
    clusters to classes), :func:`purity` (share of points in their cluster's majority class),
    :func:`f_measure` (per class the best F1 over clusters, weighted by class size).
All at once
    :func:`evaluate_clustering`, by name, plus the cost ratio to a reference cost.
The reference
    :func:`reference_kmeans` and :func:`reference_kmeans_cost`: the non-private (trusted-curator)
    k-means on the raw data, the denominator of the cost ratio (the weighted k-means itself is
    the server's, :mod:`ldp_collector.estimation.kmeans`).

Noise
    A predicted label of ``-1`` marks a point the clustering left unassigned (DBSCAN-style
    noise, a grid cell below the density threshold). The partition metrics (ARI, NMI, FMI, NICV)
    treat the noise points as one more cluster; the matching metrics (Hungarian accuracy,
    purity, F-measure) count every noise point as wrong (the noise cluster is never matched to
    a class). A ``-1`` among the *true* labels is an ordinary class.

Cost
    The partition metrics take labels of any hashable kind (integers in practice); building the
    contingency table is O(n) for small integer labels and O(n log n) otherwise; a large table is
    kept as its non-zero cells, so a clustering into many tiny clusters costs memory O(n) only.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.errors import InvalidParameterError

from ..estimation.kmeans import (
    KMeansResult,
    _centers,
    _check_k,
    _check_positive_int,
    _chunk_rows,
    _generator,
    _points,
    _weights,
    assign,
    squared_distances,
    weighted_kmeans,
)

__all__ = [
    "NOISE",
    "REFERENCE_SAMPLE",
    "adjusted_rand_index",
    "center_error",
    "cost_per_point",
    "evaluate_clustering",
    "f_measure",
    "fowlkes_mallows_index",
    "hungarian_accuracy",
    "kmeans_cost",
    "linear_sum_assignment",
    "nicv",
    "normalized_mutual_info",
    "purity",
    "reference_kmeans",
    "reference_kmeans_cost",
]

#: The predicted label of a point left out of every cluster.
NOISE = -1
#: :func:`reference_kmeans` fits on at most this many points (a uniform sample) and scores on all.
REFERENCE_SAMPLE = 100_000
#: Integer labels spanning at most this many values are factorized with bincount (O(n)).
_DENSE_LABEL_SPAN = 1 << 20
#: Contingency tables with at most this many cells are counted densely.
_DENSE_TABLE_CELLS = 1 << 22


# -- inputs ------------------------------------------------------------------------------------------

def _labels(name: str, labels: ArrayLike) -> NDArray[np.generic]:
    arr = np.asarray(labels)
    if arr.ndim == 0 or (arr.ndim > 1 and arr.size != arr.shape[0]):
        raise InvalidParameterError(f"{name} must be a 1-D array of labels, got shape {arr.shape}")
    return arr.reshape(-1)


def _factorize(arr: NDArray[np.generic]) -> tuple[NDArray[np.int64], NDArray[np.generic]]:
    """Codes ``0 .. m-1`` in sorted order of the distinct values, and the values."""
    if arr.dtype.kind in "iub" and arr.size:
        values = arr.astype(np.int64)
        low = int(values.min())
        span = int(values.max()) - low + 1
        if span <= max(_DENSE_LABEL_SPAN, 2 * arr.size):
            present = np.bincount(values - low, minlength=span) > 0
            codes = np.cumsum(present) - 1
            out: NDArray[np.int64] = codes[values - low].astype(np.int64)
            return out, (np.flatnonzero(present) + low).astype(np.int64)
    uniques, inverse = np.unique(arr, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64), uniques


class _Contingency:
    """Sparse contingency table of two labelings: the non-zero cells and both margins.

    ``rows``/``cols``/``counts`` are the non-zero cells (true class, predicted cluster, points);
    ``noise`` is the column of the predicted label ``-1`` (``None`` when absent).
    """

    def __init__(self, labels_true: ArrayLike, labels_pred: ArrayLike) -> None:
        a = _labels("labels_true", labels_true)
        b = _labels("labels_pred", labels_pred)
        if a.shape != b.shape or a.size == 0:
            raise InvalidParameterError(
                f"labels_true and labels_pred must be non-empty and of equal length, got {a.size} and {b.size}")
        ai, classes = _factorize(a)
        bi, clusters = _factorize(b)
        na, nb = len(classes), len(clusters)
        if na * nb <= _DENSE_TABLE_CELLS:
            table = np.bincount(ai * nb + bi, minlength=na * nb)
            keys = np.flatnonzero(table)
            counts = table[keys]
        else:
            keys, counts = np.unique(ai * nb + bi, return_counts=True)
        self.n = int(a.size)
        self.shape = (na, nb)
        self.rows: NDArray[np.int64] = (keys // nb).astype(np.int64)
        self.cols: NDArray[np.int64] = (keys % nb).astype(np.int64)
        self.counts: NDArray[np.int64] = counts.astype(np.int64)
        self.class_sizes: NDArray[np.int64] = np.bincount(self.rows, weights=self.counts, minlength=na).astype(np.int64)
        self.cluster_sizes: NDArray[np.int64] = np.bincount(self.cols, weights=self.counts, minlength=nb).astype(
            np.int64)
        noise = np.flatnonzero(clusters == NOISE) if clusters.dtype.kind in "iufb" else np.empty(0, dtype=np.int64)
        self.noise: int | None = int(noise[0]) if noise.size else None

    def without_noise(self) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """The non-zero cells outside the noise column."""
        if self.noise is None:
            return self.rows, self.cols, self.counts
        keep = self.cols != self.noise
        return self.rows[keep], self.cols[keep], self.counts[keep]


def _square_sum(values: NDArray[np.int64]) -> int:
    """Sum of squares as a Python integer (at most n^2: exact in int64 for n up to 3e9)."""
    v = values.astype(np.int64)
    return int(np.dot(v, v))


# -- partition metrics --------------------------------------------------------------------------------

def adjusted_rand_index(labels_true: ArrayLike, labels_pred: ArrayLike) -> float:
    """Hubert and Arabie's adjusted Rand index.

    Computed from the pair-confusion counts in exact integer arithmetic, as scikit-learn does.

    Parameters
    ----------
    labels_true, labels_pred : array-like of shape (n,)
        Class and cluster labels; a predicted ``-1`` (noise) is one more cluster.

    Returns
    -------
    float
        1 for identical partitions (also when both put every point in one cluster), about 0 for
        independent ones, negative below chance.
    """
    table = _Contingency(labels_true, labels_pred)
    n = table.n
    sum_squares = _square_sum(table.counts)
    # Ordered pairs: same class and cluster (tp), same cluster only (fp), same class only (fn).
    tp = sum_squares - n
    fp = _square_sum(table.cluster_sizes) - sum_squares
    fn = _square_sum(table.class_sizes) - sum_squares
    tn = n * n - fp - fn - sum_squares
    if fn == 0 and fp == 0:
        return 1.0
    return float(2.0 * (tp * tn - fn * fp) / ((tp + fn) * (fn + tn) + (tp + fp) * (fp + tn)))


def _entropy(sizes: NDArray[np.int64]) -> float:
    p = sizes[sizes > 0].astype(np.float64)
    total = p.sum()
    return float(-np.sum((p / total) * (np.log(p) - math.log(total))))


def normalized_mutual_info(labels_true: ArrayLike, labels_pred: ArrayLike) -> float:
    """Mutual information over the arithmetic mean of the two entropies (natural logarithms).

    scikit-learn's ``normalized_mutual_info_score`` with its default ``average_method="arithmetic"``,
    including its limit cases: 1 when both labelings have a single cluster, 0 when the mutual
    information is 0.

    Parameters
    ----------
    labels_true, labels_pred : array-like of shape (n,)
        A predicted ``-1`` (noise) is one more cluster.

    Returns
    -------
    float in [0, 1]
    """
    table = _Contingency(labels_true, labels_pred)
    na, nb = table.shape
    if na == nb == 1:
        return 1.0
    if na == 1 or nb == 1:
        return 0.0
    n = float(table.n)
    nij = table.counts.astype(np.float64)
    outer = table.class_sizes[table.rows].astype(np.float64) * table.cluster_sizes[table.cols].astype(np.float64)
    share = nij / n
    terms = share * (np.log(nij) - math.log(n)) + share * (2.0 * math.log(n) - np.log(outer))
    terms = np.where(np.abs(terms) < np.finfo(np.float64).eps, 0.0, terms)
    mi = max(float(terms.sum()), 0.0)
    if mi == 0.0:
        return 0.0
    return float(mi / ((_entropy(table.class_sizes) + _entropy(table.cluster_sizes)) / 2.0))


def fowlkes_mallows_index(labels_true: ArrayLike, labels_pred: ArrayLike) -> float:
    """Fowlkes-Mallows index: the geometric mean of pair precision and pair recall.

    Parameters
    ----------
    labels_true, labels_pred : array-like of shape (n,)
        A predicted ``-1`` (noise) is one more cluster.

    Returns
    -------
    float in [0, 1]
        0 when no pair of points shares both a class and a cluster.
    """
    table = _Contingency(labels_true, labels_pred)
    n = table.n
    tk = _square_sum(table.counts) - n
    if tk == 0:
        return 0.0
    pk = _square_sum(table.cluster_sizes) - n
    qk = _square_sum(table.class_sizes) - n
    return float(math.sqrt(tk / pk) * math.sqrt(tk / qk))


# -- matching metrics ----------------------------------------------------------------------------------

def linear_sum_assignment(cost: ArrayLike, *, maximize: bool = False) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Optimal one-to-one assignment of rows to columns (rectangular allowed).

    The shortest augmenting path form of the Hungarian method with Jonker-Volgenant dual
    updates (Crouse, "On implementing 2D rectangular assignment algorithms", IEEE TAES 2016,
    the algorithm behind ``scipy.optimize.linear_sum_assignment``), one row at a time with the
    column scans vectorized: O(r^2 c) for r <= c.

    Parameters
    ----------
    cost : array-like of shape (r, c)
        Finite costs.
    maximize : bool
        Maximize the total instead.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        Row indices (increasing) and their columns; ``min(r, c)`` pairs.
    """
    c = np.asarray(cost, dtype=np.float64)
    if c.ndim != 2:
        raise InvalidParameterError(f"cost must be a 2-D array, got shape {c.shape}")
    if not np.isfinite(c).all():
        raise InvalidParameterError("cost must be finite, got a NaN or infinite value")
    if maximize:
        c = -c
    transposed = c.shape[0] > c.shape[1]
    if transposed:
        c = c.T
    nr, nc = c.shape
    if nr == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty.copy()
    u = np.zeros(nr)
    v = np.zeros(nc)
    col4row = np.full(nr, -1, dtype=np.int64)
    row4col = np.full(nc, -1, dtype=np.int64)
    path = np.full(nc, -1, dtype=np.int64)
    for current in range(nr):
        shortest = np.full(nc, np.inf)
        seen_rows = np.zeros(nr, dtype=bool)
        seen_cols = np.zeros(nc, dtype=bool)
        min_val = 0.0
        i = current
        sink = -1
        while sink < 0:
            seen_rows[i] = True
            reduced = min_val + c[i] - u[i] - v
            better = ~seen_cols & (reduced < shortest)
            path[better] = i
            shortest[better] = reduced[better]
            candidates = np.where(seen_cols, np.inf, shortest)
            min_val = float(candidates.min())
            ties = np.flatnonzero(candidates == min_val)
            free = ties[row4col[ties] < 0]  # prefer a free column: it ends the path now
            j = int(free[0]) if free.size else int(ties[0])
            seen_cols[j] = True
            if row4col[j] < 0:
                sink = j
            else:
                i = int(row4col[j])
        u[current] += min_val
        others = np.flatnonzero(seen_rows)
        others = others[others != current]
        u[others] += min_val - shortest[col4row[others]]
        cols = np.flatnonzero(seen_cols)
        v[cols] -= min_val - shortest[cols]
        j = sink
        while True:
            i = int(path[j])
            row4col[j] = i
            col4row[i], j = j, int(col4row[i])
            if i == current:
                break
    if transposed:
        order = np.argsort(col4row, kind="stable")
        return col4row[order], order.astype(np.int64)
    return np.arange(nr, dtype=np.int64), col4row


def _matching_table(table: _Contingency) -> NDArray[np.float64]:
    """Dense class x cluster counts without the noise column, reduced to the clusters an optimal
    matching can use: with r classes, each class's r largest clusters (any other choice can be
    swapped for one of those at no loss), so many tiny clusters cost no memory."""
    rows, cols, counts = table.without_noise()
    na = table.shape[0]
    if cols.size == 0:
        return np.zeros((na, 0))
    order = np.lexsort((-counts, rows))
    rows, cols, counts = rows[order], cols[order], counts[order]
    starts = np.searchsorted(rows, rows, side="left")
    rank = np.arange(len(rows)) - starts
    keep = rank < na
    used, local = np.unique(cols[keep], return_inverse=True)
    dense = np.zeros((na, len(used)))
    dense[rows[keep], local.reshape(-1)] = counts[keep]
    return dense


def hungarian_accuracy(labels_true: ArrayLike, labels_pred: ArrayLike) -> float:
    """Share of points whose cluster is matched to their class under the best one-to-one matching.

    Parameters
    ----------
    labels_true, labels_pred : array-like of shape (n,)
        Noise points (predicted ``-1``) are never matched, so they count as wrong; with more
        clusters than classes the unmatched clusters' points are wrong too.

    Returns
    -------
    float in [0, 1]
    """
    table = _Contingency(labels_true, labels_pred)
    dense = _matching_table(table)
    if dense.size == 0:
        return 0.0
    rows, cols = linear_sum_assignment(dense, maximize=True)
    return float(dense[rows, cols].sum() / table.n)


def purity(labels_true: ArrayLike, labels_pred: ArrayLike) -> float:
    """Share of points that belong to the majority class of their cluster; noise points count as wrong.

    Returns
    -------
    float in (0, 1]
    """
    table = _Contingency(labels_true, labels_pred)
    _, cols, counts = table.without_noise()
    best = np.zeros(table.shape[1], dtype=np.int64)
    np.maximum.at(best, cols, counts)
    return float(best.sum() / table.n)


def f_measure(labels_true: ArrayLike, labels_pred: ArrayLike) -> float:
    """Clustering F-measure (Larsen and Aone 1999; the measure of the mnFCM paper).

    For class i and cluster j, ``F(i, j) = 2 P R / (P + R)`` with precision ``P = n_ij / n_j`` and
    recall ``R = n_ij / n_i``; the score is ``sum_i (n_i / n) max_j F(i, j)``. The noise cluster
    is never a class's best match, so noise points lower the recall.

    Returns
    -------
    float in [0, 1]
    """
    table = _Contingency(labels_true, labels_pred)
    rows, cols, counts = table.without_noise()
    f1 = 2.0 * counts / (table.class_sizes[rows] + table.cluster_sizes[cols])
    best = np.zeros(table.shape[0])
    np.maximum.at(best, rows, f1)
    return float(np.sum(table.class_sizes / table.n * best))


# -- geometric metrics ----------------------------------------------------------------------------------

def kmeans_cost(X: ArrayLike, centers: ArrayLike, weights: ArrayLike | None = None) -> float:
    """Sum over points of the (weighted) squared distance to the nearest center.

    Parameters
    ----------
    X : array-like of shape (n, d)
    centers : array-like of shape (k, d)
    weights : array-like of shape (n,), optional
        Point weights (a coreset's); signed weights give a signed sum.

    Returns
    -------
    float

    Notes
    -----
    Chunked: the scratch memory is about 32 MB whatever n and k.
    """
    x = _points("X", X)
    c = _centers(x, centers)
    w = _weights(weights, len(x))
    rows = _chunk_rows(len(c))
    total = 0.0
    for start in range(0, len(x), rows):
        nearest = squared_distances(x[start:start + rows], c).min(axis=1)
        total += float(nearest.sum() if w is None else np.dot(w[start:start + rows], nearest))
    return total


def cost_per_point(X: ArrayLike, centers: ArrayLike) -> float:
    """k-means cost divided by the number of points (the mean squared distance to the nearest center)."""
    x = _points("X", X)
    return kmeans_cost(x, centers) / len(x)


def nicv(X: ArrayLike, labels: ArrayLike) -> float:
    """Normalized intra-cluster variance: squared distances to each cluster's mean, summed, over n.

    The NICV of Su et al. (2016) and the later DP k-means papers; with ``labels`` the nearest
    center of each point it is the k-means cost per point of the partition's own means.

    Parameters
    ----------
    X : array-like of shape (n, d)
    labels : array-like of shape (n,)
        Any labels; ``-1`` (noise) is one more cluster.

    Returns
    -------
    float
    """
    x = _points("X", X)
    lab = _labels("labels", labels)
    if lab.shape != (len(x),):
        raise InvalidParameterError(f"labels must hold one label per point ({len(x)}), got {lab.size}")
    codes, means = _group_means(x, lab)
    total = 0.0
    rows = _chunk_rows(x.shape[1])
    for start in range(0, len(x), rows):
        diff = x[start:start + rows] - means[codes[start:start + rows]]
        total += float(np.einsum("ij,ij->", diff, diff))
    return total / len(x)


def _group_means(x: NDArray[np.float64], labels: NDArray[np.generic]) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Each point's group code and every group's mean."""
    codes, values = _factorize(labels)
    m = len(values)
    sizes = np.bincount(codes, minlength=m).astype(np.float64)
    sums = np.column_stack([np.bincount(codes, weights=x[:, j], minlength=m) for j in range(x.shape[1])])
    return codes, sums / sizes[:, None]


def center_error(true_centers: ArrayLike, centers: ArrayLike) -> float:
    """Mean Euclidean distance between true and found centers after the optimal one-to-one matching.

    With unequal counts only ``min(k_true, k)`` pairs are matched and averaged; the others are
    left out (the count difference shows in the other metrics).
    """
    t = _points("true_centers", true_centers)
    c = _centers(t, centers)
    distances = np.sqrt(squared_distances(t, c))
    rows, cols = linear_sum_assignment(distances)
    return float(distances[rows, cols].mean())


def evaluate_clustering(X: ArrayLike, labels_true: ArrayLike | None, labels_pred: ArrayLike,
                        centers: ArrayLike | None = None, reference_cost: float | None = None) -> dict[str, float]:
    """Every metric of one clustering, by name.

    Parameters
    ----------
    X : array-like of shape (n, d)
        The true (not noised) points.
    labels_true : array-like of shape (n,) or None
        Generating classes; ``None`` for unlabelled data (then only the geometric scores).
    labels_pred : array-like of shape (n,)
        Each point's cluster (for a center-based result, its nearest center); ``-1`` = noise.
    centers : array-like of shape (k, d), optional
        The published centers.
    reference_cost : float, optional
        k-means cost (total, not per point) of the non-private reference on the same ``X``
        (:func:`reference_kmeans_cost`); needs ``centers``.

    Returns
    -------
    dict of str to float
        Always ``clusters`` (non-noise clusters among the predictions), ``noise_share``, ``nicv``.
        With ``labels_true``: ``ari``, ``nmi``, ``fmi``, ``accuracy`` (Hungarian), ``purity``,
        ``f_measure``. With ``centers``: ``cost`` and ``cost_per_point``, and with
        ``labels_true`` also ``center_error`` (against the classes' means in ``X``). With
        ``reference_cost``: ``cost_ratio`` = cost / reference_cost (1 = as good as a trusted
        curator's k-means; NaN when the reference cost is 0).
    """
    x = _points("X", X)
    pred = _labels("labels_pred", labels_pred)
    if pred.shape != (len(x),):
        raise InvalidParameterError(f"labels_pred must hold one label per point ({len(x)}), got {pred.size}")
    if reference_cost is not None and centers is None:
        raise InvalidParameterError("reference_cost needs the centers whose cost it is compared with")
    noise = pred == NOISE if pred.dtype.kind in "iufb" else np.zeros(len(pred), dtype=bool)
    out: dict[str, float] = {
        "clusters": float(len(np.unique(pred[~noise]))),
        "noise_share": float(noise.mean()),
        "nicv": nicv(x, pred),
    }
    if labels_true is not None:
        true = _labels("labels_true", labels_true)
        out.update({
            "ari": adjusted_rand_index(true, pred),
            "nmi": normalized_mutual_info(true, pred),
            "fmi": fowlkes_mallows_index(true, pred),
            "accuracy": hungarian_accuracy(true, pred),
            "purity": purity(true, pred),
            "f_measure": f_measure(true, pred),
        })
    if centers is not None:
        c = _centers(x, centers)
        cost = kmeans_cost(x, c)
        out["cost"] = cost
        out["cost_per_point"] = cost / len(x)
        if labels_true is not None:
            out["center_error"] = center_error(_group_means(x, _labels("labels_true", labels_true))[1], c)
        if reference_cost is not None:
            ref = float(reference_cost)
            if not math.isfinite(ref) or ref < 0:
                raise InvalidParameterError(f"reference_cost must be a finite number >= 0, got {reference_cost!r}")
            out["cost_ratio"] = cost / ref if ref > 0 else math.nan
    return out


# -- the non-private reference ---------------------------------------------------------------------

def reference_kmeans(X: ArrayLike, k: int, seed: int, n_init: int = 10, *, weights: ArrayLike | None = None,
                     sample: int | None = REFERENCE_SAMPLE, max_iter: int = 100, tol: float = 1e-6) -> KMeansResult:
    """The non-private (trusted-curator) reference: best of ``n_init`` k-means++ and Lloyd runs.

    Fitted on a uniform sample of at most ``sample`` points (``None``: all of them), which moves
    the cost by a relative O(k d / sample) only, and then scored on every point.

    Parameters
    ----------
    X : array-like of shape (n, d)
    k : int
        In ``[1, n]``.
    seed : int
        Seed of the sample and of the restarts.
    n_init : int
    weights : array-like of shape (n,), optional
    sample : int or None
    max_iter, tol
        As in :func:`lloyd`.

    Returns
    -------
    KMeansResult
        ``labels`` and ``cost`` over all of ``X``.
    """
    x = _points("X", X)
    k = _check_k(k, len(x))
    w = _weights(weights, len(x))
    gen = _generator(seed)
    fit_x, fit_w = x, w
    if sample is not None:
        sample = _check_positive_int("sample", sample, 1 << 40)
        if len(x) > max(sample, k):
            index = np.sort(gen.choice(len(x), size=max(sample, k), replace=False))
            fit_x, fit_w = x[index], (w[index] if w is not None else None)
    fit = weighted_kmeans(fit_x, k, gen, fit_w, n_init, max_iter=max_iter, tol=tol)
    if fit_x is x:
        return fit
    labels, sq = assign(x, fit.centers)
    cost = float(sq.sum() if w is None else np.dot(w, sq))
    return KMeansResult(centers=fit.centers, labels=labels, cost=cost, iterations=fit.iterations)


def reference_kmeans_cost(X: ArrayLike, k: int, seed: int, n_init: int = 10, *, weights: ArrayLike | None = None,
                          sample: int | None = REFERENCE_SAMPLE) -> float:
    """Cost of :func:`reference_kmeans` on all of ``X``: the denominator of the cost ratio."""
    return reference_kmeans(X, k, seed, n_init, weights=weights, sample=sample).cost
