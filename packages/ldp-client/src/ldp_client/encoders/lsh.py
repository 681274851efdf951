"""Locality-sensitive hashes of the point: SimHash prefixes and randomly shifted dyadic grids.

Both work on the *centred* normalized point ``y = 2 t - 1`` in ``[-1, 1]^d`` (``t`` the clamped
point normalized to ``[0, 1]^d``), optionally projected to ``z = P y`` in ``R^k`` by a public
:class:`~ldp_client.encoders.projection.RandomProjection`; without a projection ``z = y`` and
``k = d``. Every public random quantity comes from the counter-mode generator of
:mod:`~ldp_client.encoders.projection`, so the collector rebuilds it bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

from .._validation import check_int
from ..errors import InvalidParameterError
from .base import ENCODERS, INDEX, Encoder, NumericDomain, as_point
from .geometry import MAX_INDEX_BITS, _require_domain, morton_encode
from .projection import MASK64, PURPOSE_SHIFT, RandomProjection, dot, gaussian_matrix, uniform_values

__all__ = ["CLAMP_PROBABILITY", "ShiftedGridEncoder", "SimHashEncoder"]

#: Per-point bound on the chance (over the public projection) that a shifted-grid coordinate is clamped.
CLAMP_PROBABILITY = 2.0**-20


def _check_projection(projection: Any, dimension: int) -> None:
    if projection is None:
        return
    if not isinstance(projection, RandomProjection):
        raise TypeError(f"projection must be a RandomProjection or None, got {type(projection).__name__}")
    if projection.input_dimension != dimension:
        raise InvalidParameterError(
            f"projection input_dimension must equal the domain dimension {dimension}, "
            f"got {projection.input_dimension}")


def _centred(domain: NumericDomain, point: Any) -> list[float]:
    return [2.0 * t - 1.0 for t in domain.normalize(as_point(point, domain.dimension))]


@ENCODERS.register
@dataclass(frozen=True, kw_only=True)
class SimHashEncoder(Encoder):
    """SimHash bucket: sign bits of public Gaussian hyperplanes (``ldp.v1.SimHashEncoder``).

    Bit ``i`` is ``1`` iff ``<g_i, z> >= 0``, with ``g_i`` row ``i`` of
    :func:`~ldp_client.encoders.projection.gaussian_matrix` ``(seed, bits, k)`` (stream tag
    ``PURPOSE_HYPERPLANES``). The value is the bit string read with bit 0 as the most
    significant: ``value = sum_i bit_i 2^(bits - 1 - i)``, so the length-``l`` prefix (the node
    of an LSH tree at depth ``l``) is ``value >> (bits - l)`` and ``parent = value >> 1``.

    Parameters
    ----------
    domain : NumericDomain
        Public bounds; points outside are clamped.
    projection : RandomProjection or None
        Optional public JL projection; its ``input_dimension`` must equal ``d``.
    bits : int
        Number of hyperplanes, in ``[1, 64]``; values lie in ``[0, 2^bits)``.
    seed : int
        Public 64-bit seed of the hyperplanes.

    Notes
    -----
    Two points at angle ``theta`` (after centring and projection) agree on each bit with
    probability ``1 - theta / pi`` (Charikar, STOC 2002). Cost: ``bits * k`` (+ ``k d`` with a
    projection) multiply-adds per point; the hyperplanes are generated once per object.
    """

    KIND: ClassVar[str] = "simhash"
    VALUE_KIND: ClassVar[str] = INDEX

    domain: NumericDomain
    projection: RandomProjection | None = None
    bits: int
    seed: int

    def __post_init__(self) -> None:
        _require_domain(self.domain)
        _check_projection(self.projection, self.domain.dimension)
        check_int("bits", self.bits, 1, MAX_INDEX_BITS)
        check_int("seed", self.seed, 0, MASK64)

    @property
    def space_dimension(self) -> int:
        """``k``: the dimension the hyperplanes live in (projected, or the domain's)."""
        return self.domain.dimension if self.projection is None else self.projection.output_dimension

    @cached_property
    def hyperplanes(self) -> tuple[tuple[float, ...], ...]:
        """The ``bits`` Gaussian normals, each of dimension ``k``."""
        return gaussian_matrix(self.seed, self.bits, self.space_dimension)

    @property
    def output_size(self) -> int:
        return 1 << self.bits

    def encode(self, point: Any) -> int:
        """The SimHash value of the clamped point, in ``[0, 2^bits)``.

        Raises
        ------
        EncodingError
            Wrong dimension or type, NaN or infinite coordinate.
        """
        z = _centred(self.domain, point)
        if self.projection is not None:
            z = self.projection.apply(z)
        value = 0
        for normal in self.hyperplanes:
            value = (value << 1) | (dot(normal, z) >= 0.0)
        return value


@ENCODERS.register
@dataclass(frozen=True, kw_only=True)
class ShiftedGridEncoder(Encoder):
    """Morton index of the point's cell in a randomly shifted dyadic grid (``ldp.v1.ShiftedGridEncoder``).

    Construction, for the (projected) centred point ``z`` in ``R^k``:

    1. ``u_r = (z_r + R) / (2 R)`` clamped to ``[0, 1]``, with ``R`` = :attr:`half_width`;
    2. ``v_r = (u_r + s_r) / 2`` with the public shift ``s_r`` = uniform ``r`` of
       :func:`~ldp_client.encoders.projection.uniform_values` ``(seed, PURPOSE_SHIFT, k)``,
       so ``v`` lies in ``[0, 1)``;
    3. the value is the Morton index (:mod:`~ldp_client.encoders.geometry` convention) of the
       level-``level`` dyadic cell of ``v``.

    One seed serves every level: in ``u`` units the level-``l`` cells have side ``2^(1 - l)`` and
    are shifted by ``s_r``, which is uniform modulo every such side, and the levels nest, so
    ``parent = index >> k`` (a randomly shifted quadtree). In ``z`` units the side is
    :meth:`cell_side` ``= 4 R 2^-l``. The shifted box occupies about half of the index range
    per dimension (``v`` spans an interval of length 1/2).

    Bounding box ``[-R, R]^k``
        Without projection ``z = y`` in ``[-1, 1]^d`` and ``R = 1``: nothing is ever clamped.
        With a projection, row ``r`` has ``d`` entries ``+-1/sqrt(k)``, so ``|z_r| <= d / sqrt(k)``
        exactly over the whole domain, but typical ``|z_r|`` is ``O(sqrt(d / k))``. We take
        ``R = min(d / sqrt(k), sqrt(2 d ln(2 k / delta) / k))`` with ``delta`` =
        :data:`CLAMP_PROBABILITY` ``= 2^-20``: by Hoeffding's inequality
        ``P[|z_r| > R] <= 2 exp(-R^2 k / (2 ||y||^2)) <= delta / k`` (``||y||^2 <= d``), so for
        every fixed point the chance over the public matrix that any coordinate is clamped is at
        most ``2^-20``; clamped coordinates land in the boundary cell (clamping is a deterministic
        public map, so it costs no privacy).

    Parameters
    ----------
    domain : NumericDomain
        Public bounds; points outside are clamped.
    projection : RandomProjection or None
        Optional public JL projection; its ``input_dimension`` must equal ``d``.
    level : int
        Grid level ``l`` in ``[0, 64 // k]``; values lie in ``[0, 2^(l k))``.
    seed : int
        Public 64-bit seed of the shift.

    Notes
    -----
    Cost: ``k d`` multiply-adds for the projection plus ``O(k)``.
    """

    KIND: ClassVar[str] = "shifted_grid"
    VALUE_KIND: ClassVar[str] = INDEX

    domain: NumericDomain
    projection: RandomProjection | None = None
    level: int
    seed: int

    def __post_init__(self) -> None:
        _require_domain(self.domain)
        _check_projection(self.projection, self.domain.dimension)
        check_int("level", self.level, 0, MAX_INDEX_BITS // self.space_dimension)
        check_int("seed", self.seed, 0, MASK64)

    @property
    def space_dimension(self) -> int:
        """``k``: the dimension of the shifted grid (projected, or the domain's)."""
        return self.domain.dimension if self.projection is None else self.projection.output_dimension

    @cached_property
    def half_width(self) -> float:
        """``R``: the grid covers ``z`` in ``[-R, R]^k`` (see the class docstring)."""
        if self.projection is None:
            return 1.0
        d, k = self.domain.dimension, self.space_dimension
        tail = math.sqrt(2.0 * d * math.log(2.0 * k / CLAMP_PROBABILITY) / k)
        return min(d / math.sqrt(k), tail)

    @cached_property
    def shift(self) -> tuple[float, ...]:
        """The public shift ``s`` in ``[0, 1)^k``."""
        return tuple(uniform_values(self.seed, PURPOSE_SHIFT, self.space_dimension))

    def cell_side(self, level: int | None = None) -> float:
        """Side of a level cell in the (projected) centred units of ``z``: ``4 R 2^-level``."""
        lvl = self.level if level is None else check_int("level", level, 0, MAX_INDEX_BITS)
        return 4.0 * self.half_width * 2.0**-lvl

    @property
    def output_size(self) -> int:
        return 1 << (self.level * self.space_dimension)

    def encode(self, point: Any) -> int:
        """Morton index of the shifted-grid cell of the clamped (projected) point.

        Raises
        ------
        EncodingError
            Wrong dimension or type, NaN or infinite coordinate.
        """
        z = _centred(self.domain, point)
        if self.projection is not None:
            z = self.projection.apply(z)
        radius = self.half_width
        scale = float(1 << self.level)
        top = (1 << self.level) - 1
        coords = []
        for zr, s in zip(z, self.shift):
            u = (zr + radius) / (2.0 * radius)
            u = 0.0 if u < 0.0 else 1.0 if u > 1.0 else u
            c = int((u + s) * 0.5 * scale)
            coords.append(c if c < top else top)
        return morton_encode(coords)
