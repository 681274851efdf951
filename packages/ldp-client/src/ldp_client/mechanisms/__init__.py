"""Local randomizers: one module per mechanism, each around one frozen parameter object."""

from __future__ import annotations

from .base import MECHANISMS, MechanismParams
from .bitwise_randomized_response import BitwiseRRParams
from .discrete_laplace import DiscreteLaplaceParams
from .local_hashing import LocalHashingParams
from .oracle_choice import choose_frequency_oracle
from .randomized_response import GRRParams
from .unary_encoding import UnaryEncodingParams, UnaryVariant, oue, sue
from .vector_box import VectorBoxParams
from .vector_l2_ball import VectorL2BallParams

__all__ = [
    "MECHANISMS",
    "BitwiseRRParams",
    "DiscreteLaplaceParams",
    "GRRParams",
    "LocalHashingParams",
    "MechanismParams",
    "UnaryEncodingParams",
    "UnaryVariant",
    "VectorBoxParams",
    "VectorL2BallParams",
    "choose_frequency_oracle",
    "oue",
    "sue",
]
