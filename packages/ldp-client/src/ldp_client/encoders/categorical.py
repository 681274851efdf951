"""The identity encoder for categorical data: the point is already a category index."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, ClassVar

from .._validation import check_int
from ..errors import EncodingError
from .base import ENCODERS, INDEX, Encoder

__all__ = ["CategoricalEncoder"]

_MAX_DOMAIN = 2**64 - 1


@ENCODERS.register
@dataclass(frozen=True, kw_only=True)
class CategoricalEncoder(Encoder):
    """A category index in ``[0, domain_size)`` (``ldp.v1.CategoricalEncoder``).

    Parameters
    ----------
    domain_size : int
        Number of categories, in ``[1, 2^64 - 1]``.

    Notes
    -----
    Categories have no natural clamp, so an index outside the domain is an error, not clamped.
    Cost: O(1).
    """

    KIND: ClassVar[str] = "categorical"
    VALUE_KIND: ClassVar[str] = INDEX

    domain_size: int

    def __post_init__(self) -> None:
        check_int("domain_size", self.domain_size, 1, _MAX_DOMAIN)

    @property
    def output_size(self) -> int:
        return self.domain_size

    def encode(self, point: Any) -> int:
        """Return ``point`` as an ``int`` after checking it is an integer category in range.

        Raises
        ------
        EncodingError
            ``point`` is not an integer (``bool`` included) or is outside ``[0, domain_size)``.
        """
        if isinstance(point, bool):
            raise EncodingError(f"category must be an integer, got {type(point).__name__}")
        try:
            value = operator.index(point)  # ints and numpy integers, not floats
        except TypeError:
            raise EncodingError(f"category must be an integer, got {type(point).__name__}") from None
        if not 0 <= value < self.domain_size:
            raise EncodingError(f"category must be in [0, {self.domain_size}), got {value}")
        return value
