"""What the two LSH-tree kinds (NETTREE, STEMMER) share: the vector randomizer choice and the noiseless oracles.

:func:`lsh_nodes` computes the public node of every point under a SimHash or shifted-grid encoder,
vectorized; :func:`exact_counts` and :func:`exact_sums` are the frequency oracle and the bucketized
sum at epsilon = infinity, with which both kinds' ``noiseless_outcome`` measure the algorithm's own
approximation. :func:`grow_best_effort` grows their trees without significance, for the
best-effort results of a campaign whose clusters are not detectable.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from ldp_client.encoders.lsh import ShiftedGridEncoder, SimHashEncoder
from ldp_client.errors import InvalidParameterError
from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams, VectorShape

from ..errors import InvalidArgumentError
from ..estimation.net_tree import LevelEstimator, NetTreeLayout, TreeGrowth, grow_tree
from .base import CliParam
from .common import ProtoEnum

__all__ = ["VECTOR_SHAPE_PARAM", "VectorShapeParam", "check_vector_shape", "exact_counts", "exact_sums",
           "grow_best_effort", "lsh_nodes", "vector_shape"]

#: The threshold multiplier of :func:`grow_best_effort`: positive, as ``select_nodes`` requires, and
#: small enough that any positive count passes.
_BEST_EFFORT_Z = 1e-300


def grow_best_effort(estimate: LevelEstimator, layout: NetTreeLayout, *, n_hat: float, k: int, width: int,
                     prefix: str) -> TreeGrowth:
    """:func:`~ldp_collector.estimation.net_tree.grow_tree` without significance: best-effort nodes.

    Every level keeps at most ``width`` of the tested nodes with the largest positive estimated
    counts (no noise threshold, no mass floor, no vector floor): where nothing passed the real
    thresholds, the heaviest nodes are still the best guess, and the result says they passed none.
    A caller restricts the nodes a level may keep by giving the others the count ``-inf``.
    """
    # alpha is unused: the fixed z replaces the Bonferroni quantile.
    return grow_tree(estimate, layout, n_hat=n_hat, k=k, alpha=0.5, max_nodes=width, mass_fraction=math.inf,
                     z=_BEST_EFFORT_Z, min_count=0.0, prefix=prefix)


class VectorShapeParam(ProtoEnum):
    """``ldp.v1.BucketizedVector.Shape`` as a kind parameter: the bucketized vector's randomizer."""

    SHAPE_UNSPECIFIED = 0
    L2_BALL = 1
    BOX = 2
    PRIVUNIT = 3


#: ``--vector-shape``: the two kinds' flag for their ``vector_shape`` field.
VECTOR_SHAPE_PARAM = CliParam(
    flag="--vector-shape", field="vector_shape", type="choice",
    choices=(("l2_ball", VectorShapeParam.L2_BALL), ("box", VectorShapeParam.BOX),
             ("privunit", VectorShapeParam.PRIVUNIT)),
    help="the bucketized vector's randomizer (default: the box, the l2 ball or PrivUnit, whichever adds the least error)")


def check_vector_shape(requested: int, kind: str) -> None:
    """Refuse a ``vector_shape`` number that names no shape (a proto3 enum is open)."""
    if requested not in tuple(VectorShapeParam):
        raise InvalidArgumentError(f"{kind}.vector_shape {int(requested)} is not L2_BALL (1), BOX (2) or PRIVUNIT (3)")


#: Relative difference in error below which two vector randomizers tie (rounding, not a gain).
_TIE = 1e-9


def vector_shape(dimension: int, epsilon: float, requested: int = VectorShapeParam.SHAPE_UNSPECIFIED) -> VectorShape:
    """The ``requested`` randomizer, or else the one of least error: the box, the l2 ball or PrivUnit.

    Least error is the smallest per-report mean second moment in box units
    (:attr:`~ldp_client.mechanisms.bucketized_vector.BucketizedVectorParams.report_mean_second_moment`,
    ``E||z||^2 / D``): what every report adds to a center's squared l2 error, summed over its
    coordinates. Computed from the mechanisms, not fitted. Ties go to the cheaper report, in the
    order box (``D`` bits), l2 ball, PrivUnit (``32 D`` bits each; PrivUnit draws ``16 D`` Gaussians):
    PrivUnit equals the l2 ball at small epsilon and wins at ``D >= 3`` from about epsilon 1 (``D = 11``:
    68.7 against 77.3 at epsilon 1, 18.3 against 28.5 at 2); the box wins at ``D = 2`` and at even ``D``
    with small epsilon.
    """
    if requested:
        return VectorShape(int(requested))
    errors: dict[VectorShape, float] = {}
    for shape in (VectorShape.BOX, VectorShape.L2_BALL, VectorShape.PRIVUNIT):
        try:
            params = BucketizedVectorParams(bucket_bits=0, dimension=dimension, epsilon=epsilon, shape=shape)
            errors[shape] = params.report_mean_second_moment
        except InvalidParameterError:  # an epsilon too small for this randomizer's unbiased estimate
            continue
    if not errors:
        raise InvalidArgumentError(f"no vector randomizer has an unbiased estimate at dimension {dimension} and "
                                   f"epsilon {epsilon:g}")
    best = next(iter(errors))
    for shape, error in errors.items():
        # A costlier randomizer must be better by more than rounding: PrivUnit's cap is the l2 ball's
        # hemisphere at small epsilon, equal to 1e-12 through its quadrature.
        if error < errors[best] * (1.0 - _TIE):
            best = shape
    return best


def lsh_nodes(encoder: SimHashEncoder | ShiftedGridEncoder, points: NDArray[np.float64]) -> NDArray[np.uint64]:
    """Every point's value under a public SimHash or shifted-grid encoder, vectorized.

    Bit-identical to the devices' encoders except, at worst, for points lying exactly on a
    hyperplane or cell boundary (numpy's dot products may round differently from the SDK's sums).
    """
    domain = encoder.domain
    lower = np.asarray(domain.lower, dtype=np.float64)
    upper = np.asarray(domain.upper, dtype=np.float64)
    z = 2.0 * np.clip((points - lower) / (upper - lower), 0.0, 1.0) - 1.0
    if encoder.projection is not None:
        z = z @ np.asarray(encoder.projection.matrix, dtype=np.float64).T
    if isinstance(encoder, SimHashEncoder):
        bits = (z @ np.asarray(encoder.hyperplanes, dtype=np.float64).T >= 0.0).astype(np.uint64)
        weights = np.left_shift(np.uint64(1), np.arange(encoder.bits - 1, -1, -1, dtype=np.uint64))
        out: NDArray[np.uint64] = (bits * weights).sum(axis=1, dtype=np.uint64)
        return out
    radius = encoder.half_width
    u = np.clip((z + radius) / (2.0 * radius), 0.0, 1.0)
    top = (1 << encoder.level) - 1
    coords = np.minimum(((u + np.asarray(encoder.shift)) * 0.5 * float(1 << encoder.level)).astype(np.int64), top)
    k = coords.shape[1]
    index = np.zeros(len(points), dtype=np.uint64)
    for bit in range(encoder.level):
        for r in range(k):
            index |= ((coords[:, r] >> bit) & 1).astype(np.uint64) << np.uint64(bit * k + r)
    return index


def exact_counts(values: NDArray[np.uint64], candidates: NDArray[np.uint64]) -> NDArray[np.float64]:
    """How many of ``values`` equal each candidate (the noiseless frequency oracle)."""
    nodes, counts = np.unique(values, return_counts=True)
    pos = np.clip(np.searchsorted(nodes, candidates), 0, max(nodes.size - 1, 0))
    found = nodes[pos] == candidates if nodes.size else np.zeros(candidates.shape, dtype=bool)
    out: NDArray[np.float64] = np.where(found, counts[pos] if nodes.size else 0, 0).astype(np.float64)
    return out


def exact_sums(values: NDArray[np.uint64], keys: NDArray[np.uint64], rows: NDArray[np.float64]) -> NDArray[np.float64]:
    """Sum of ``rows`` over the points whose value is each key (the noiseless bucketized sum)."""
    if keys.size == 0:
        return np.zeros((0, rows.shape[1]))
    order = np.argsort(keys)
    pos = np.clip(np.searchsorted(keys[order], values), 0, keys.size - 1)
    member = keys[order][pos] == values
    index = order[pos[member]]
    out: NDArray[np.float64] = np.column_stack(
        [np.bincount(index, weights=rows[member, j], minlength=keys.size) for j in range(rows.shape[1])])
    return out
