"""Evaluation of clusterings: the shared metrics and the server-side weighted k-means.

:mod:`~ldp_collector.evaluation.metrics`
    Cost, cost ratio, NICV, ARI, NMI, FMI, Hungarian accuracy, purity, F-measure, center error,
    and :func:`evaluate_clustering` returning all of them: the one implementation the simulator,
    the CLI and the benchmarks use.
:mod:`~ldp_collector.evaluation.kmeans`
    Weighted k-means++ and Lloyd (signed coreset weights allowed), and the non-private
    reference k-means of the cost ratio.

numpy only; nothing here sees a device or a report, so it may be imported anywhere.
"""

from __future__ import annotations

from .kmeans import (
    REFERENCE_SAMPLE,
    KMeansResult,
    assign,
    kmeans_plus_plus,
    lloyd,
    reference_kmeans,
    reference_kmeans_cost,
    weighted_kmeans,
)
from .metrics import (
    NOISE,
    adjusted_rand_index,
    center_error,
    cost_per_point,
    evaluate_clustering,
    f_measure,
    fowlkes_mallows_index,
    hungarian_accuracy,
    kmeans_cost,
    linear_sum_assignment,
    nicv,
    normalized_mutual_info,
    purity,
)

__all__ = [
    "NOISE",
    "REFERENCE_SAMPLE",
    "KMeansResult",
    "adjusted_rand_index",
    "assign",
    "center_error",
    "cost_per_point",
    "evaluate_clustering",
    "f_measure",
    "fowlkes_mallows_index",
    "hungarian_accuracy",
    "kmeans_cost",
    "kmeans_plus_plus",
    "linear_sum_assignment",
    "lloyd",
    "nicv",
    "normalized_mutual_info",
    "purity",
    "reference_kmeans",
    "reference_kmeans_cost",
    "weighted_kmeans",
]
