"""The contract every mechanism's parameter object fulfils."""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar

from .._exact import exp_below, log_fraction
from .._spec import Spec, SpecRegistry
from .._validation import check_epsilon, check_int
from ..encoders.base import MAX_DIMENSION
from ..errors import InvalidParameterError
from ..payload import Payload
from ..rng import Rng

__all__ = ["MECHANISMS", "MechanismParams", "VectorParams"]

#: Registry of the ``ldp.v1.MechanismSpec`` oneof: kind name -> parameter class.
MECHANISMS = SpecRegistry("mechanism", "ldp_client.mechanisms", {
    "grr": "randomized_response",
    "unary_encoding": "unary_encoding",
    "local_hashing": "local_hashing",
    "bitwise_rr": "bitwise_randomized_response",
    "discrete_laplace": "discrete_laplace",
    "vector_l2_ball": "vector_l2_ball",
    "vector_privunit": "vector_privunit",
    "vector_box": "vector_box",
    "bucketized_vector": "bucketized_vector",
})


class MechanismParams(Spec, abc.ABC):
    """Base of every frozen ``<Mechanism>Params`` dataclass.

    Subclasses hold the public parameters (the fields of their proto message), derive every
    constant once as a cached property, and implement :meth:`randomize` (device side) and
    :meth:`check_payload` (both sides: the device before storing, the collector before accepting).
    """

    epsilon: float
    #: Name of the ``ldp.v1.Payload`` field this mechanism's output travels in.
    PAYLOAD_FIELD: ClassVar[str] = ""
    #: Kind of value it randomizes (``ldp_client.encoders.base``: index, bits, unit_cube, box, ball,
    #: bucket_vector).
    INPUT_KIND: ClassVar[str] = ""

    @property
    @abc.abstractmethod
    def input_size(self) -> int:
        """Domain size (index), bit-vector length (bits) or dimension (vectors)."""

    @property
    @abc.abstractmethod
    def realized_epsilon(self) -> float:
        """The epsilon the exact probabilities really realize (<= ``epsilon``)."""

    @property
    @abc.abstractmethod
    def payload_bits(self) -> int:
        """Information bits of one report (for the bandwidth-aware oracle choice)."""

    @abc.abstractmethod
    def randomize(self, value: Any, *, rng: Rng | None = None) -> Payload:
        """Randomize one encoded value (validated) with ``rng`` (default: the OS CSPRNG)."""

    @abc.abstractmethod
    def check_payload(self, payload: Any) -> Payload:
        """Return ``payload`` if it is a possible output of this mechanism, else raise ``ProtocolError``."""


#: Smallest epsilon (or per-bit share of it) whose exact ratio exceeds 1: :func:`~ldp_client._exact.exp_below`
#: keeps about 48 bits and takes one unit off, so below about 1.5e-14 the ratio is 1, a holder and a
#: non-holder report alike and nothing can be estimated (the count estimates divide by p - q = 0).
MIN_RATIO_EPSILON = 1.5e-14


def privacy_ratio(x: float, name: str = "epsilon") -> Fraction:
    """``exp_below(x)``, the exact rational stand-in for e^x, refused with ``InvalidParameterError``
    when it is 1 (``x`` below about :data:`MIN_RATIO_EPSILON`): every mechanism's ratio comes from here."""
    r = exp_below(x)
    if r <= 1:
        raise InvalidParameterError(f"{name} must be at least {MIN_RATIO_EPSILON:g} for an unbiased estimate "
                                    f"(e^({name}) rounds to 1 at the mechanisms' 48-bit precision), got {x:g}")
    return r


def bits_for(n: int) -> int:
    """Bits needed to write an index in ``[0, n)``."""
    return max(1, math.ceil(math.log2(n))) if n > 1 else 1


def count_estimate_variance(p: float, q: float, n: float, count: float) -> float:
    """Variance of the unbiased count estimate ``(C - n q) / (p - q)``.

    ``C`` counts the reports that support a value; a holder supports it with probability ``p``, a
    non-holder with ``q``. Shared by GRR, unary encoding and (for an ideal hash family) local hashing:
    ``n q (1 - q) / (p - q)^2 + count (1 - p - q) / (p - q)``.
    """
    return n * q * (1 - q) / (p - q) ** 2 + count * (1 - p - q) / (p - q)


def check_index_value(kind: str, value: Any, size: int) -> int:
    """Validate an encoded index in ``[0, size)`` handed to an index mechanism's ``randomize``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{kind} value must be an int, got {type(value).__name__}")
    if not 0 <= value < size:
        raise InvalidParameterError(f"{kind} value must be in [0, {size}), got {value}")
    return value


@dataclass(frozen=True, kw_only=True)
class VectorParams(MechanismParams):
    """Shared part of the vector randomizers: ``dimension``, ``epsilon`` and the exact ratio."""

    dimension: int
    epsilon: float

    def __post_init__(self) -> None:
        check_int("dimension", self.dimension, 1, MAX_DIMENSION)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        _ = self.ratio  # refuses an epsilon whose ratio is 1

    @cached_property
    def ratio(self) -> Fraction:
        """r: the exact rational stand-in for e^epsilon (r <= e^epsilon)."""
        return privacy_ratio(self.epsilon)

    @property
    def realized_epsilon(self) -> float:
        """ln r: every vector randomizer's likelihood ratio is at most r, and reaches it."""
        return log_fraction(self.ratio)

    @property
    def input_size(self) -> int:
        return self.dimension
