"""Scoring a simulated campaign's result against the truth the simulation knows.

:func:`histogram_truth` and :func:`evaluate_histogram` compare a histogram's estimates with the
true counts (computed with the campaign's own encoder, so the cell geometry is the devices');
:func:`evaluate_heavy_hitters` compares the heavy hitters found with the true counts of the values;
:func:`evaluate_clustering` scores a clustering result (ARI, NMI, Hungarian accuracy, cost ratio
to non-private k-means) with the shared scores of :mod:`.scores`. :func:`evaluate_run` picks the one a kind's simulated result
(:attr:`ldp_collector.kinds.base.KindCli.result`) calls for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.clusters import CellClusterModel
from ldp_client.errors import InvalidParameterError
from ldp_client.spec import RoundSpec

from ..estimation.center_floor import FLOOR_CENTER_ERROR, FLOOR_EXCESS_COST, floor_cost_ratio
from ..estimation.kmeans import assign
from ..kinds import KINDS, Kind
from ..model import Estimates, Result
from .population import as_points
from .runner import CampaignRun
from .scores import evaluate_clustering as evaluate_labels
from .scores import reference_kmeans, reference_kmeans_cost
from .vector import array_encodable, encode_cells

__all__ = [
    "CLUSTERING_KINDS",
    "cell_labels",
    "evaluate_clustering",
    "evaluate_heavy_hitters",
    "evaluate_histogram",
    "evaluate_run",
    "floor_scores",
    "histogram_truth",
    "kmeans",
]

#: Kinds whose result is a clustering.
CLUSTERING_KINDS: frozenset[str] = frozenset(name for name, kind in KINDS.items() if kind.clustering)


# -- histograms ------------------------------------------------------------------------

def histogram_truth(spec: RoundSpec, points: Any, group: int = 0, component_index: int = 0) -> NDArray[np.int64]:
    """True count of every value of a histogram round, encoded with the round's own encoder.

    Parameters
    ----------
    spec : RoundSpec
    points : numpy.ndarray or sequence
        Every device's point.
    group, component_index : int
        Whose encoder to use.

    Returns
    -------
    numpy.ndarray of int64, shape (domain_size,)
    """
    task = spec.task_for(group)
    if task is None:
        raise InvalidParameterError(f"group {group} does not report in round {spec.round}")
    encoder = task.components[component_index].encoder
    size = encoder.output_size
    values = np.fromiter((encoder.encode(p) for p in as_points(points)), dtype=np.int64)
    return np.bincount(values, minlength=size).astype(np.int64)


def evaluate_histogram(estimates: Estimates, truth: ArrayLike) -> dict[str, float]:
    """Error of a histogram's estimates against the true counts.

    Returns
    -------
    dict
        ``reports``; ``max_abs_freq_error`` and ``mean_abs_freq_error`` (|count - truth| / n);
        ``rmse_count``; ``mean_std_error``; ``mean_abs_z`` (mean |count - truth| / SE, about
        sqrt(2/pi) = 0.80 for unbiased, normal estimates with the right SE); ``max_abs_z``;
        ``ci_coverage`` (share of true counts inside the stored intervals, about the confidence
        level).
    """
    true = np.asarray(truth, dtype=np.float64)
    if not estimates.estimates:
        raise InvalidParameterError("the estimates are empty")
    values = np.array([e.value for e in estimates.estimates], dtype=np.int64)
    if values.max() >= len(true):
        raise InvalidParameterError(f"estimate value {int(values.max())} is outside the {len(true)} true counts")
    counts = np.array([e.count for e in estimates.estimates])
    se = np.array([e.std_error for e in estimates.estimates])
    low = np.array([e.ci_lower for e in estimates.estimates])
    high = np.array([e.ci_upper for e in estimates.estimates])
    t = true[values]
    n = max(int(estimates.reports), 1)
    err = counts - t
    positive = se > 0
    z = np.abs(err[positive]) / se[positive]
    return {
        "reports": float(estimates.reports),
        "values": float(len(values)),
        "max_abs_freq_error": float(np.abs(err).max() / n),
        "mean_abs_freq_error": float(np.abs(err).mean() / n),
        "rmse_count": float(np.sqrt(np.mean(err**2))),
        "mean_std_error": float(se.mean()),
        "mean_abs_z": float(z.mean()) if z.size else math.nan,
        "max_abs_z": float(z.max()) if z.size else math.nan,
        "ci_coverage": float(np.mean((t >= low) & (t <= high))),
        "confidence": float(estimates.confidence),
    }


# -- heavy hitters ---------------------------------------------------------------------

def evaluate_heavy_hitters(result: Result, values: ArrayLike) -> dict[str, float]:
    """The heavy hitters found against the true counts of ``values``, every device's value (a domain of up
    to 2^53 values is never laid out: only the values held are counted).

    Returns
    -------
    dict
        ``found``; with at least one found, ``max_abs_freq_error`` and ``mean_abs_freq_error``
        (|count - truth| / n), ``mean_abs_z`` (NaN without a positive standard error),
        ``recall_of_true_top`` (share of the found that are among as many true top values) and
        ``smallest_found_true_freq``.
    """
    held, held_counts = np.unique(np.asarray(values, dtype=np.int64).ravel(), return_counts=True)
    n = max(int(held_counts.sum()), 1)
    found = list(result.heavy_hitters)
    out: dict[str, float] = {"found": len(found)}
    if not found:
        return out
    found_values = np.array([h.value for h in found], dtype=np.int64)
    counts = np.array([h.count for h in found])
    se = np.array([h.std_error for h in found])
    at = np.minimum(np.searchsorted(held, found_values), max(held.size - 1, 0))
    true = np.where((held.size > 0) & (held[at] == found_values), held_counts[at], 0).astype(np.float64)
    err = np.abs(counts - true)
    top = set(held[np.argsort(-held_counts, kind="stable")[: len(found)]].tolist())  # ties: the smaller value
    out.update({
        "max_abs_freq_error": float(err.max() / n), "mean_abs_freq_error": float(err.mean() / n),
        "mean_abs_z": float(np.mean(err[se > 0] / se[se > 0])) if np.any(se > 0) else math.nan,
        "recall_of_true_top": len(top & set(found_values.tolist())) / len(found),
        "smallest_found_true_freq": float(true.min() / n),
    })
    return out


# -- clusterings -----------------------------------------------------------------------

def kmeans(points: ArrayLike, k: int, *, seed: int = 0, restarts: int = 3, iterations: int = 100,
           sample: int = 100_000) -> NDArray[np.float64]:
    """Centers of the non-private reference k-means (:func:`ldp_collector.simulation.scores.reference_kmeans`,
    ``k`` capped at the number of points)."""
    x = np.asarray(points, dtype=np.float64)
    return reference_kmeans(x, max(1, min(int(k), len(x))), seed, restarts, max_iter=iterations,
                            sample=sample).centers


def cell_labels(cell_map: CellClusterModel, points: NDArray[np.float64]) -> NDArray[np.int64]:
    """Each point's cluster label in a grid clustering's cell map (``-1`` = noise)."""
    labels = np.asarray(cell_map.labels, dtype=np.int64)
    x = np.asarray(points, dtype=np.float64)
    if x.ndim == 2 and np.isfinite(x).all() and array_encodable(cell_map.encoder):
        return labels[encode_cells(cell_map.encoder, x).astype(np.int64)]  # equal to cell_position, on arrays
    return labels[np.fromiter((cell_map.cell_position(tuple(p)) for p in points.tolist()), dtype=np.int64)]


def evaluate_clustering(result: Result, points: ArrayLike, labels_true: ArrayLike | None, *,
                        k: int | None = None, seed: int = 0) -> dict[str, float]:
    """Scores of a clustering result on the true points.

    Each point gets the label of its nearest published center (or of its cell in a grid
    clustering's cell map, ``-1`` = noise), scored by :func:`ldp_collector.simulation.scores.evaluate_clustering`:
    with true labels ``ari``, ``nmi``, ``fmi``, ``accuracy`` (Hungarian), ``purity``, ``f_measure``;
    always ``nicv`` and ``noise_share``; with centers ``cost``, ``cost_per_point``, ``center_error`` and
    ``cost_ratio``, the cost of the published centers over the cost of non-private k-means with the
    same k (:func:`ldp_collector.simulation.scores.reference_kmeans_cost`; 1 = as good as a trusted
    curator). ``clusters`` counts the published clusters.
    """
    x = np.asarray(points, dtype=np.float64)
    clustering = result.clustering
    if clustering is None:
        raise InvalidParameterError("the result holds no clustering (neither centers nor a cell map)")
    centers = np.asarray(clustering.centers, dtype=np.float64)
    if centers.size:
        dim = int(clustering.dimension) or x.shape[1]
        centers = centers.reshape(-1, dim)
        predicted = assign(x, centers)[0]
        reference = reference_kmeans_cost(x, max(1, min(k or len(centers), len(x))), seed)
        out = evaluate_labels(x, labels_true, predicted, centers=centers, reference_cost=reference)
        out["clusters"] = float(len(centers))
        out.update(floor_scores(result.diagnostics, out, reference / len(x)))
        return out
    if clustering.cell_map is not None and clustering.cell_map.cells:
        out = evaluate_labels(x, labels_true, cell_labels(clustering.cell_map, x))
        out["clusters"] = float(len(set(clustering.cell_map.labels) - {-1}))
        return out
    raise InvalidParameterError("the result holds no clustering (neither centers nor a cell map)")


def floor_scores(diagnostics: Mapping[str, float], scores: Mapping[str, float],
                 optimal_cost_per_point: float) -> dict[str, float]:
    """The measured figures beside the result's own noise floor (:mod:`ldp_collector.estimation.center_floor`).

    ``floor_cost_ratio`` (``1 + floor excess / OPT``) and ``cost_over_floor`` (measured cost ratio over it);
    ``floor_center_error`` and ``center_error_over_floor`` (with true labels). Empty when the result
    reports no floor.
    """
    out: dict[str, float] = {}
    if FLOOR_EXCESS_COST in diagnostics and "cost_ratio" in scores:
        predicted = floor_cost_ratio(float(diagnostics[FLOOR_EXCESS_COST]), optimal_cost_per_point)
        out["floor_cost_ratio"] = predicted
        out["cost_over_floor"] = float(scores["cost_ratio"]) / predicted
    if FLOOR_CENTER_ERROR in diagnostics and "center_error" in scores:
        floor = float(diagnostics[FLOOR_CENTER_ERROR])
        out["floor_center_error"] = floor
        out["center_error_over_floor"] = float(scores["center_error"]) / floor if floor > 0 else math.inf
    return out


# -- by kind ---------------------------------------------------------------------------

def evaluate_run(kind: Kind, run: CampaignRun, points: Any, x: NDArray[np.float64], labels: ArrayLike | None, *,
                 k: int | None = None, seed: int = 0) -> dict[str, dict[str, float]]:
    """A simulated campaign's result scored as its kind's :attr:`~ldp_collector.kinds.base.KindCli.result` says.

    Parameters
    ----------
    kind : Kind
    run : CampaignRun
    points : numpy.ndarray or sequence
        What the devices held (points, or categorical values).
    x : numpy.ndarray
        The dataset's numeric points (a clustering labels them).
    labels : array_like or None
        The dataset's true labels.
    k, seed : int
        The clustering's reference k-means.

    Returns
    -------
    dict
        ``{"errors": ...}`` of :func:`evaluate_histogram` or :func:`evaluate_heavy_hitters`, or
        ``{"clustering": ...}`` of :func:`evaluate_clustering`.
    """
    if kind.cli.result == "histogram":
        if run.result.estimates is None:
            raise InvalidParameterError("the result holds no estimates")
        return {"errors": evaluate_histogram(run.result.estimates, histogram_truth(run.first_spec, points))}
    if kind.cli.result == "heavy_hitters":
        values = np.array([p[0] for p in as_points(points)], dtype=np.int64)
        return {"errors": evaluate_heavy_hitters(run.result, values)}
    return {"clustering": evaluate_clustering(run.result, x, labels, k=k, seed=seed)}
