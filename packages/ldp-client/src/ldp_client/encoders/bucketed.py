"""A point's LSH bucket together with its box vector, for the bucketized vector sum.

:class:`BucketedVectorEncoder` maps a point to ``(b, v)``: ``b`` its node under a public LSH
(a :class:`~ldp_client.encoders.lsh.SimHashEncoder` prefix or a
:class:`~ldp_client.encoders.lsh.ShiftedGridEncoder` cell), or the index of its nearest public
candidate (:class:`~ldp_client.encoders.nearest.NearestCandidateEncoder`, a Lloyd step's
assignment), and ``v = (2 t - 1, 1)`` in
``[-1, 1]^(d+1)``, ``t`` the clamped point normalized to ``[0, 1]^d``
(``NumericDomain.normalize``). :class:`~ldp_client.mechanisms.bucketized_vector.BucketizedVectorParams`
randomizes the pair so that the collector can estimate, for any bucket, the sum of ``v`` over the
devices in it: the per-bucket sums of the centred points and the per-bucket counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import InvalidParameterError
from .base import BUCKET_VECTOR, ENCODERS, MAX_DIMENSION, Encoder, NumericDomain, as_point
from .geometry import _require_domain
from .lsh import ShiftedGridEncoder, SimHashEncoder
from .nearest import NearestCandidateEncoder

__all__ = ["BucketedVectorEncoder"]


@ENCODERS.register
@dataclass(frozen=True, kw_only=True)
class BucketedVectorEncoder(Encoder):
    """LSH bucket and box vector ``(2 t - 1, 1)`` of the point (``ldp.v1.BucketedVectorEncoder``).

    Parameters
    ----------
    domain : NumericDomain
        Public bounds, of dimension ``d`` in ``[1, 4095]``; points outside are clamped.
    simhash : SimHashEncoder or None
        The bucket is the SimHash value (``bits`` bits).
    shifted_grid : ShiftedGridEncoder or None
        The bucket is the shifted-grid Morton index (``level * k`` bits).
    nearest : NearestCandidateEncoder or None
        The bucket is the index of the nearest candidate (``ceil(log2 m)`` bits for ``m`` candidates).

    Exactly one of ``simhash``, ``shifted_grid`` and ``nearest`` is set, and its domain equals ``domain``.

    Notes
    -----
    :meth:`encode` returns ``(bucket, vector)`` with ``bucket`` in ``[0, 2^bucket_bits)`` and
    ``vector`` a tuple of ``d + 1`` floats in ``[-1, 1]`` whose last coordinate is ``1`` (it counts
    the device). Every coordinate is in ``[-1, 1]`` exactly (rounding is monotone). Cost: the LSH's
    plus ``O(d)``.
    """

    KIND: ClassVar[str] = "bucketed_vector"
    VALUE_KIND: ClassVar[str] = BUCKET_VECTOR

    domain: NumericDomain
    simhash: SimHashEncoder | None = None
    shifted_grid: ShiftedGridEncoder | None = None
    nearest: NearestCandidateEncoder | None = None

    def __post_init__(self) -> None:
        _require_domain(self.domain)
        if self.domain.dimension > MAX_DIMENSION - 1:
            raise InvalidParameterError(
                f"bucketed_vector domain dimension must be at most {MAX_DIMENSION - 1} (the vector has d + 1 "
                f"coordinates), got {self.domain.dimension}")
        if self.simhash is not None and not isinstance(self.simhash, SimHashEncoder):
            raise TypeError(f"simhash must be a SimHashEncoder or None, got {type(self.simhash).__name__}")
        if self.shifted_grid is not None and not isinstance(self.shifted_grid, ShiftedGridEncoder):
            raise TypeError(f"shifted_grid must be a ShiftedGridEncoder or None, got {type(self.shifted_grid).__name__}")
        if self.nearest is not None and not isinstance(self.nearest, NearestCandidateEncoder):
            raise TypeError(f"nearest must be a NearestCandidateEncoder or None, got {type(self.nearest).__name__}")
        if sum(e is not None for e in (self.simhash, self.shifted_grid, self.nearest)) != 1:
            raise InvalidParameterError("bucketed_vector needs exactly one of simhash, shifted_grid and nearest")
        if self.lsh.domain != self.domain:
            raise InvalidParameterError(f"bucketed_vector {self.lsh.KIND} domain must equal the encoder's domain")

    @property
    def lsh(self) -> SimHashEncoder | ShiftedGridEncoder | NearestCandidateEncoder:
        """The bucket encoder: ``simhash``, ``shifted_grid`` or ``nearest``, whichever is set."""
        lsh = self.simhash or self.shifted_grid or self.nearest
        assert lsh is not None  # __post_init__
        return lsh

    @property
    def bucket_bits(self) -> int:
        """Bits of a bucket: SimHash ``bits``, ``level * k`` for the shifted grid (at most 64), or
        ``ceil(log2 m)`` (at least 1) for ``m`` nearest candidates."""
        if self.simhash is not None:
            return self.simhash.bits
        if self.nearest is not None:
            return max(1, (self.nearest.output_size - 1).bit_length())
        assert self.shifted_grid is not None  # __post_init__
        return self.shifted_grid.level * self.shifted_grid.space_dimension

    @property
    def output_size(self) -> int:
        """``d + 1``: the dimension of the vector."""
        return self.domain.dimension + 1

    def encode(self, point: Any) -> tuple[int, tuple[float, ...]]:
        """``(bucket, (2 t - 1, 1))`` for the clamped, normalized point ``t``.

        Raises
        ------
        EncodingError
            Wrong dimension or type, NaN or infinite coordinate.
        """
        x = as_point(point, self.domain.dimension)
        bucket = self.lsh.encode(x)
        return bucket, (*(2.0 * t - 1.0 for t in self.domain.normalize(x)), 1.0)
