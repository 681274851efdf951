"""Nearest-candidate encoder: the index of the public candidate center closest to the point."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from itertools import repeat
from typing import Any, ClassVar

from .._validation import check_int
from ..errors import InvalidParameterError
from .base import ENCODERS, INDEX, MAX_DIMENSION, Encoder, NumericDomain, as_point
from .geometry import _float_field, _require_domain, _tuple_field, clamp_point

__all__ = ["MAX_CANDIDATE_VALUES", "NearestCandidateEncoder", "nearest_index"]

#: Largest ``len(centers)`` (candidates x dimension).
MAX_CANDIDATE_VALUES = 2**22
#: Relative margin within which :func:`math.dist` results are treated as a possible tie and
#: compared exactly: ``math.dist`` is off by a few ulps (about 2^-52 relative), far below it.
_NEAR_TIE = 2.0**-40


def _exact_squared_distance(x: Sequence[float], center: Sequence[float]) -> Fraction:
    """``sum_j (x_j - c_j)^2`` of the binary64 values, in exact rational arithmetic."""
    return sum(((Fraction(a) - Fraction(b)) ** 2 for a, b in zip(x, center)), Fraction(0))


def nearest_index(x: Sequence[float], centers: Sequence[Sequence[float]]) -> int:
    """Index of the center exactly nearest to ``x``, the lowest index on exact ties (``docs/protocol.md`` §11.7).

    Shared by :class:`NearestCandidateEncoder` and the published-center labelling of
    :class:`ldp_client.clusters.CenterModel` (§15), so both follow one rule.
    """
    distances = list(map(math.dist, repeat(x), centers))
    nearest = min(distances)
    # Any center exactly as near as the true nearest is within the rounding margin of it.
    close = [i for i, dist in enumerate(distances) if dist <= nearest * (1.0 + _NEAR_TIE)]
    if len(close) == 1:
        return close[0]
    exact = [_exact_squared_distance(x, centers[i]) for i in close]
    return close[exact.index(min(exact))]


@ENCODERS.register
@dataclass(frozen=True, kw_only=True)
class NearestCandidateEncoder(Encoder):
    """Index of the nearest candidate center (``ldp.v1.NearestCandidateEncoder``).

    Distances are Euclidean **in the domain's original units** (the units the centers are
    published in), between the point clamped to the domain box and each center, compared
    exactly (as real numbers, not rounded); exact ties go to the lowest index (``docs/protocol.md``
    §11.7). Centers may lie outside the domain (estimated centers often do).

    Parameters
    ----------
    domain : NumericDomain
        Public bounds; points outside are clamped (in original units) before the search.
    dimension : int
        ``d``; must equal the domain's dimension.
    centers : tuple of float
        ``n >= 1`` candidates flattened row-major: center ``i`` is
        ``centers[i * d:(i + 1) * d]``; finite, at most 2^22 values.

    Notes
    -----
    Cost: ``n`` calls of :func:`math.dist` (C), about 10 microseconds for ``n = 100``, ``d = 10``;
    candidates within a relative ``2^-40`` of the nearest (possible ties) are then compared in
    exact rational arithmetic, so the answer never depends on how a platform rounds.
    """

    KIND: ClassVar[str] = "nearest_candidate"
    VALUE_KIND: ClassVar[str] = INDEX

    domain: NumericDomain
    dimension: int
    centers: tuple[float, ...]

    def __post_init__(self) -> None:
        _require_domain(self.domain)
        check_int("dimension", self.dimension, 1, MAX_DIMENSION)
        if self.dimension != self.domain.dimension:
            raise InvalidParameterError(
                f"dimension must equal the domain dimension {self.domain.dimension}, got {self.dimension}")
        centers = _float_field("centers", _tuple_field("centers", self.centers))
        object.__setattr__(self, "centers", centers)
        if not centers or len(centers) % self.dimension:
            raise InvalidParameterError(
                f"centers must hold a positive multiple of dimension {self.dimension} values, got {len(centers)}")
        if len(centers) > MAX_CANDIDATE_VALUES:
            raise InvalidParameterError(f"centers must hold at most {MAX_CANDIDATE_VALUES} values, got {len(centers)}")

    @property
    def candidate_count(self) -> int:
        """Number of candidates ``n``."""
        return len(self.centers) // self.dimension

    @cached_property
    def center_rows(self) -> tuple[tuple[float, ...], ...]:
        """The candidates as ``n`` rows of ``d`` coordinates."""
        d = self.dimension
        return tuple(self.centers[i * d:(i + 1) * d] for i in range(self.candidate_count))

    @property
    def output_size(self) -> int:
        return self.candidate_count

    def encode(self, point: Any) -> int:
        """Index of the candidate exactly nearest to the clamped point (lowest index on ties).

        Raises
        ------
        EncodingError
            Wrong dimension or type, NaN or infinite coordinate.
        """
        return nearest_index(clamp_point(as_point(point, self.dimension), self.domain), self.center_rows)
