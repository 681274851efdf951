"""Whole-array versions of the SDK steps a ``vector`` population runs: encoders and randomizers.

:class:`~.population.Population` in ``vector`` mode draws every device's report of a round with
numpy instead of running the SDK per device. This module holds the two array steps:

* :func:`encode_points`: ``encoder.encode`` on an ``(n, d)`` array, equal to it point for point:
  the cell encoders (:func:`encode_cells`), the kCluster bit vector
  (:class:`~ldp_client.encoders.bitvector.BitVectorEncoder`: the same clamping and the same float
  comparison ``|x_j - r| <= theta_j``), the vector maps (unit cube, symmetric box, unit ball: the
  rare rows whose norm rounds near 1 take the SDK's own encoder), SimHash and the shifted grid
  (projections and hyperplanes summed left to right as the SDK's ``dot`` does), the nearest
  candidate (near-ties asked of the SDK's ``math.dist``) and the bucketed vector
  (:func:`encode_bucketed`);
* :func:`encode_cells`: the point -> cell index of the SDK's cell encoders
  (:class:`~ldp_client.encoders.grid.UniformGridEncoder`,
  :class:`~ldp_client.encoders.grid.GridTreeEncoder`,
  :class:`~ldp_client.encoders.grid.CellListEncoder`) over an ``(n, d)`` array, equal to
  ``encoder.encode`` point for point: the same float normalization and clamping
  (:meth:`NumericDomain.normalize <ldp_client.encoders.base.NumericDomain.normalize>`), then the
  exact integer floors and the Morton bit convention of :mod:`ldp_client.encoders.geometry`;
* :func:`draw_payloads`: the randomized payloads of the frequency oracles (GRR, unary encoding,
  local hashing), bitwise randomized response, discrete Laplace, the box, l2-ball and PrivUnit
  vector randomizers and the bucketized vector sum (every inner shape), drawn in :mod:`.reports`
  from each mechanism's output distribution, as the Python values the SDK's ``randomize`` returns.

:func:`unsupported` says why a component cannot take this path (the population then runs the
round ``direct``). The probabilities are floats and the generator is seeded: simulation only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ldp_client.encoders.base import Encoder
from ldp_client.encoders.bitvector import BitVectorEncoder
from ldp_client.encoders.bucketed import BucketedVectorEncoder
from ldp_client.encoders.grid import CellListEncoder, GridTreeEncoder, UniformGridEncoder
from ldp_client.encoders.lsh import ShiftedGridEncoder, SimHashEncoder
from ldp_client.encoders.nearest import NearestCandidateEncoder
from ldp_client.encoders.projection import RandomProjection
from ldp_client.encoders.vectors import SymmetricBoxEncoder, UnitBallEncoder, UnitCubeEncoder
from ldp_client.mechanisms.bitwise_randomized_response import BitwiseRRParams
from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams
from ldp_client.mechanisms.discrete_laplace import DiscreteLaplaceParams
from ldp_client.mechanisms.local_hashing import LocalHashingParams
from ldp_client.mechanisms.randomized_response import GRRParams
from ldp_client.mechanisms.unary_encoding import UnaryEncodingParams
from ldp_client.mechanisms.vector_box import VectorBoxParams
from ldp_client.mechanisms.vector_l2_ball import VectorL2BallParams
from ldp_client.mechanisms.vector_privunit import VectorPrivUnitParams
from ldp_client.payload import Floats, HashedValue, Integers, Payload, SignedVector
from ldp_client.spec import Component

from ..kinds.bitvector import layout_of
from .reports import (
    draw_bitwise_rr,
    draw_bucketized_vector,
    draw_discrete_laplace,
    draw_grr,
    draw_l2_ball,
    draw_local_hashing,
    draw_privunit,
    draw_unary,
    draw_vector_box,
)

__all__ = ["array_encodable", "draw_payloads", "encode_bucketed", "encode_cells", "encode_points", "unsupported"]

#: Deepest tree level encoded on arrays: ``t * 2^level`` must fit an int64 (the SDK allows 64 // d).
_MAX_TREE_LEVEL = 62
#: Largest uniform-grid side encoded on arrays: the exact floor multiplies a 53-bit mantissa by it in uint64.
_MAX_UNIFORM_CELLS = 1 << 11
_MANTISSA_BITS = 53


def unsupported(component: Component) -> str | None:
    """Why ``component`` cannot run on arrays, or ``None`` when it can.

    Supported: a cell encoder (:func:`array_encodable`), a SimHash, shifted-grid or
    nearest-candidate encoder with a GRR, unary-encoding or local-hashing oracle; a bit-vector
    encoder with bitwise randomized response; the unit-cube encoder with discrete Laplace, the
    symmetric box with the box randomizer, the unit ball with the l2-ball or PrivUnit randomizer; the
    bucketed vector encoder with the bucketized vector sum.
    """
    mechanism, encoder = component.mechanism, component.encoder
    if isinstance(mechanism, BitwiseRRParams):
        return None if isinstance(encoder, BitVectorEncoder) else f"encoder {encoder.KIND} with bitwise_rr"
    if isinstance(mechanism, DiscreteLaplaceParams):
        return None if isinstance(encoder, UnitCubeEncoder) else f"encoder {encoder.KIND} with discrete_laplace"
    if isinstance(mechanism, VectorBoxParams):
        return None if isinstance(encoder, SymmetricBoxEncoder) else f"encoder {encoder.KIND} with vector_box"
    if isinstance(mechanism, (VectorL2BallParams, VectorPrivUnitParams)):
        return None if isinstance(encoder, UnitBallEncoder) else f"encoder {encoder.KIND} with {mechanism.KIND}"
    if isinstance(mechanism, BucketizedVectorParams):
        return None if isinstance(encoder, BucketedVectorEncoder) else f"encoder {encoder.KIND} with bucketized_vector"
    if not isinstance(mechanism, (GRRParams, UnaryEncodingParams, LocalHashingParams)):
        return f"mechanism {mechanism.KIND} has no array randomizer"
    return _encoder_unsupported(encoder)


def array_encodable(encoder: Encoder) -> bool:
    """Whether :func:`encode_cells` takes ``encoder``: a uniform grid with at most 2^11 cells per
    dimension, or a grid tree or cell list down to level 62."""
    return _encoder_unsupported(encoder) is None


def _encoder_unsupported(encoder: Encoder) -> str | None:
    if isinstance(encoder, UniformGridEncoder):
        if max(encoder.cells_per_dimension) > _MAX_UNIFORM_CELLS:
            return f"uniform grid with more than {_MAX_UNIFORM_CELLS} cells per dimension"
        return None
    if isinstance(encoder, GridTreeEncoder):
        return None if encoder.level <= _MAX_TREE_LEVEL else f"grid tree level above {_MAX_TREE_LEVEL}"
    if isinstance(encoder, CellListEncoder):
        deepest = max(cell.level for cell in encoder.cells)
        return None if deepest <= _MAX_TREE_LEVEL else f"cell list level above {_MAX_TREE_LEVEL}"
    if isinstance(encoder, (SimHashEncoder, ShiftedGridEncoder, NearestCandidateEncoder)):
        return None
    return f"encoder {encoder.KIND} has no array encoding"


def _normalized(domain_lower: tuple[float, ...], domain_upper: tuple[float, ...],
                points: NDArray[np.float64]) -> NDArray[np.float64]:
    """``NumericDomain.normalize`` on every row: ``(x - lo) / (hi - lo)`` clamped to [0, 1] (same float ops)."""
    lower = np.asarray(domain_lower, dtype=np.float64)
    upper = np.asarray(domain_upper, dtype=np.float64)
    t = (points - lower) / (upper - lower)
    return np.clip(t, 0.0, 1.0, out=t)


def _tree_codes(t: NDArray[np.float64], level: int) -> NDArray[np.uint64]:
    """Morton indices of the level-``level`` cells holding normalized points (geometry.tree_index_of)."""
    top = (1 << level) - 1
    # t * 2^level is exact (a power of two) and below 2^63: the cast truncates like int().
    coords = np.minimum((t * float(1 << level)).astype(np.int64), top).astype(np.uint64)
    return _morton(coords, level)


def _morton(coords: NDArray[np.uint64], level: int) -> NDArray[np.uint64]:
    """Interleaved ``level``-bit coordinates: bit ``b`` of ``c_j`` becomes bit ``b d + j`` (geometry.morton_encode)."""
    n, d = coords.shape
    code = np.zeros(n, dtype=np.uint64)
    one = np.uint64(1)
    for b in range(level):
        for j in range(d):
            code |= ((coords[:, j] >> np.uint64(b)) & one) << np.uint64(b * d + j)
    return code


def _uniform_codes(t: NDArray[np.float64], cells: tuple[int, ...]) -> NDArray[np.uint64]:
    """Row-major indices of the uniform-grid cells (``floor(t m)`` computed exactly, as the SDK does).

    ``t = M 2^(e - 53)`` with the integer mantissa ``M < 2^53`` (``numpy.frexp``), so
    ``floor(t m) = (M m) >> (53 - e)``, exact in uint64 while ``m <= 2^11``.
    """
    mantissa, exponent = np.frexp(t)
    big = (mantissa * float(1 << _MANTISSA_BITS)).astype(np.uint64)  # exact: a 53-bit integer
    shift = (_MANTISSA_BITS - exponent).astype(np.int64)  # >= 52, since t <= 1
    index = np.zeros(t.shape[0], dtype=np.uint64)
    for j, m in enumerate(cells):
        m64 = np.uint64(m)
        product = big[:, j] * m64
        s = shift[:, j]
        c = np.where(s < 64, product >> np.minimum(s, 63).astype(np.uint64), np.uint64(0))
        index = index * m64 + np.minimum(c, np.uint64(m - 1))
    return index


def encode_cells(encoder: Encoder, points: NDArray[np.float64]) -> NDArray[np.uint64]:
    """``encoder.encode`` of every row of ``points``, on arrays (:func:`unsupported` must say ``None``).

    Parameters
    ----------
    encoder : UniformGridEncoder, GridTreeEncoder or CellListEncoder
    points : numpy.ndarray of float64, shape (n, d)
        Finite coordinates (the caller checks; the SDK raises ``EncodingError`` on others).

    Returns
    -------
    numpy.ndarray of uint64, shape (n,)
    """
    if isinstance(encoder, UniformGridEncoder):
        return _uniform_codes(_normalized(encoder.domain.lower, encoder.domain.upper, points),
                              encoder.cells_per_dimension)
    if isinstance(encoder, GridTreeEncoder):
        return _tree_codes(_normalized(encoder.domain.lower, encoder.domain.upper, points), encoder.level)
    if isinstance(encoder, CellListEncoder):
        d = encoder.domain.dimension
        levels = np.array([cell.level for cell in encoder.cells], dtype=np.int64)
        indices = np.array([cell.morton_index for cell in encoder.cells], dtype=np.uint64)
        deepest = int(levels.max())
        code = _tree_codes(_normalized(encoder.domain.lower, encoder.domain.upper, points), deepest)
        out = np.full(points.shape[0], -1, dtype=np.int64)
        # The cells partition the box: each point's ancestor is listed at exactly one level.
        for level in np.unique(levels).tolist():
            at = np.flatnonzero(levels == level)
            order = np.argsort(indices[at])
            table, positions = indices[at][order], at[order]
            ancestor = code >> np.uint64((deepest - level) * d)
            k = np.minimum(np.searchsorted(table, ancestor), table.size - 1)
            hit = table[k] == ancestor
            out[hit] = positions[k[hit]]
        if out.size and int(out.min()) < 0:
            raise AssertionError("a validated partition holds every point")  # pragma: no cover
        return out.astype(np.uint64)
    raise TypeError(f"no array encoding for {type(encoder).__name__}")


def encode_points(encoder: Encoder, points: NDArray[np.float64]) -> Any:
    """``encoder.encode`` of every row of ``points``, on arrays (:func:`unsupported` must say ``None``).

    Returns
    -------
    numpy.ndarray
        Cell encoders: the uint64 cell indices, shape (n,) (:func:`encode_cells`). Bit vector: the
        0/1 bits as uint8, shape (n, output_size), attribute after attribute. Vector maps: the
        float64 vectors, shape (n, d). SimHash, shifted grid, nearest candidate: the uint64
        values, shape (n,). Bucketed vector: the pair (:func:`encode_bucketed`).
    """
    if isinstance(encoder, BitVectorEncoder):
        return layout_of(encoder).encode(points)
    if isinstance(encoder, BucketedVectorEncoder):
        return encode_bucketed(encoder, points)
    if isinstance(encoder, (UnitCubeEncoder, SymmetricBoxEncoder, UnitBallEncoder)):
        return _vector_map(encoder, points)
    if isinstance(encoder, SimHashEncoder):
        return _simhash(encoder, points)
    if isinstance(encoder, ShiftedGridEncoder):
        return _shifted_grid(encoder, points)
    if isinstance(encoder, NearestCandidateEncoder):
        return _nearest(encoder, points)
    return encode_cells(encoder, points)


def encode_bucketed(encoder: BucketedVectorEncoder,
                    points: NDArray[np.float64]) -> tuple[NDArray[np.uint64], NDArray[np.float64]]:
    """``encoder.encode`` of every row: the buckets (:func:`encode_points` of its LSH) and the
    vectors ``(2 t - 1, 1)``, shape (n, d + 1)."""
    box = 2.0 * _normalized(encoder.domain.lower, encoder.domain.upper, points) - 1.0
    vectors = np.concatenate([box, np.ones((len(points), 1))], axis=1)
    return encode_points(encoder.lsh, points).astype(np.uint64), vectors


def _dot_rows(matrix: tuple[tuple[float, ...], ...], z: NDArray[np.float64]) -> NDArray[np.float64]:
    """``[dot(row, z_i) for row in matrix]`` for every row ``z_i``: the SDK's left-to-right float sums
    (:func:`ldp_client.encoders.projection.dot`, from 0.0), one column at a time, so every rounding is the same."""
    out = np.empty((z.shape[0], len(matrix)))
    for r, row in enumerate(matrix):
        acc = np.zeros(z.shape[0])
        for j, w in enumerate(row):
            acc = acc + w * z[:, j]
        out[:, r] = acc
    return out


def _space(encoder: SimHashEncoder | ShiftedGridEncoder, points: NDArray[np.float64]) -> NDArray[np.float64]:
    """The LSH's input: the centred point ``2 t - 1``, projected when the encoder has a projection."""
    z = 2.0 * _normalized(encoder.domain.lower, encoder.domain.upper, points) - 1.0
    projection: RandomProjection | None = encoder.projection
    return z if projection is None else _dot_rows(projection.matrix, z)


def _simhash(encoder: SimHashEncoder, points: NDArray[np.float64]) -> NDArray[np.uint64]:
    sides = _dot_rows(encoder.hyperplanes, _space(encoder, points)) >= 0.0
    value = np.zeros(len(points), dtype=np.uint64)
    for b in range(sides.shape[1]):
        value = (value << np.uint64(1)) | sides[:, b].astype(np.uint64)
    return value


def _shifted_grid(encoder: ShiftedGridEncoder, points: NDArray[np.float64]) -> NDArray[np.uint64]:
    z = _space(encoder, points)
    radius = encoder.half_width
    scale = float(1 << encoder.level)
    top = (1 << encoder.level) - 1
    u = np.clip((z + radius) / (2.0 * radius), 0.0, 1.0)
    # (u + s) * scale / 2 < scale: the cast truncates like int() on these non-negative floats.
    coords = ((u + np.asarray(encoder.shift)) * 0.5 * scale).astype(np.int64)
    return _morton(np.minimum(coords, top).astype(np.uint64), encoder.level)


#: Relative gap between the two nearest candidates below which :func:`_nearest` asks the SDK's
#: ``math.dist`` (numpy's distances may differ from it by a few ulps; this is thousands).
_NEAR_TIE = 1e-12


def _nearest(encoder: NearestCandidateEncoder, points: NDArray[np.float64]) -> NDArray[np.uint64]:
    x = np.clip(points, encoder.domain.lower, encoder.domain.upper)
    centers = np.asarray(encoder.center_rows, dtype=np.float64)
    d2 = ((x[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2) if len(x) * len(centers) <= 1 << 22 else \
        np.stack([((x - c) ** 2).sum(axis=1) for c in centers], axis=1)
    dist = np.sqrt(d2)
    best = np.argmin(dist, axis=1)
    if centers.shape[0] > 1:
        two = np.partition(dist, 1, axis=1)[:, :2]
        for i in np.flatnonzero(two[:, 1] - two[:, 0] <= _NEAR_TIE * np.maximum(two[:, 1], 1e-300)).tolist():
            best[i] = encoder.encode(tuple(points[i].tolist()))
    return np.asarray(best, dtype=np.uint64)


def _vector_map(encoder: UnitCubeEncoder | SymmetricBoxEncoder | UnitBallEncoder,
                points: NDArray[np.float64]) -> NDArray[np.float64]:
    """The vector encoders' maps with the SDK's float operations, row by row."""
    t = _normalized(encoder.domain.lower, encoder.domain.upper, points)
    if isinstance(encoder, UnitCubeEncoder):
        return t
    box = 2.0 * t - 1.0
    if isinstance(encoder, SymmetricBoxEncoder):
        return box
    v = box * (1.0 / math.sqrt(encoder.domain.dimension))
    # The SDK shrinks a vector whose norm rounds above 1 (three ways of measuring it); only rows
    # within a whisker of the sphere can need it, and those take the SDK's own encoder.
    close = np.flatnonzero((v * v).sum(axis=1) > 1.0 - 1e-9)
    for i in close.tolist():
        v[i] = encoder.encode(tuple(points[i].tolist()))
    return v


def _rows(packed: NDArray[np.uint8]) -> list[bytes]:
    """The rows of a packed bit array as ``bytes`` (one slice of one buffer each)."""
    data, width = packed.tobytes(), packed.shape[1]
    return [data[i:i + width] for i in range(0, len(data), width)]


def draw_payloads(component: Component, values: Any, rng: np.random.Generator) -> list[Payload]:
    """The component's randomized payloads of encoded ``values`` (:func:`encode_points`), as the SDK's
    ``randomize`` returns them.

    GRR: ``int``; unary encoding, bitwise randomized response and the box randomizer: the packed
    ``bytes``; local hashing: :class:`HashedValue`; discrete Laplace: :class:`Integers`; the l2
    ball and PrivUnit: :class:`Floats`; the bucketized vector sum: :class:`SignedVector`.
    """
    mechanism = component.mechanism
    if isinstance(mechanism, BitwiseRRParams):
        return list(_rows(draw_bitwise_rr(mechanism, values, rng)))
    if isinstance(mechanism, DiscreteLaplaceParams):
        return [Integers(tuple(row)) for row in draw_discrete_laplace(mechanism, values, rng).tolist()]
    if isinstance(mechanism, VectorBoxParams):
        return list(_rows(draw_vector_box(mechanism, values, rng)))
    if isinstance(mechanism, VectorL2BallParams):
        return [Floats(tuple(row)) for row in draw_l2_ball(mechanism, values, rng).tolist()]
    if isinstance(mechanism, VectorPrivUnitParams):
        return [Floats(tuple(row)) for row in draw_privunit(mechanism, values, rng).tolist()]
    if isinstance(mechanism, BucketizedVectorParams):
        buckets, vectors = values
        seeds, inner = draw_bucketized_vector(mechanism, buckets, vectors, rng)
        reports: list[bytes | Floats] = (
            list(_rows(inner)) if inner.dtype == np.uint8 else [Floats(tuple(row)) for row in inner.tolist()])
        return [SignedVector(s, r) for s, r in zip(seeds.tolist(), reports)]
    v = values.astype(np.int64)  # every oracle's domain_size is at most 2^63
    if isinstance(mechanism, GRRParams):
        return list(draw_grr(mechanism, v, rng).tolist())
    if isinstance(mechanism, UnaryEncodingParams):
        return list(_rows(draw_unary(mechanism, v, rng)))
    if isinstance(mechanism, LocalHashingParams):
        seeds, buckets = draw_local_hashing(mechanism, v, rng)
        return [HashedValue(s, b) for s, b in zip(seeds.tolist(), buckets.tolist())]
    raise TypeError(f"no array randomizer for {mechanism.KIND}")
