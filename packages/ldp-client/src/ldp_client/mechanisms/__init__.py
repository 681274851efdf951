"""Local randomizers: one module per mechanism, each around one frozen parameter object."""

from __future__ import annotations

import importlib

from .base import MECHANISMS, MechanismParams

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost on devices)

if TYPE_CHECKING:  # loaded on first use (PEP 562): a device imports only what its rounds use
    from typing import Any

    from .bitwise_randomized_response import BitwiseRRParams
    from .bucketized_vector import BucketizedVectorParams, VectorShape
    from .discrete_laplace import DiscreteLaplaceParams
    from .local_hashing import LocalHashingParams
    from .oracle_choice import choose_frequency_oracle
    from .randomized_response import GRRParams
    from .unary_encoding import UnaryEncodingParams, UnaryVariant, oue, sue
    from .vector_box import VectorBoxParams
    from .vector_l2_ball import VectorL2BallParams
    from .vector_privunit import VectorPrivUnitParams

_LAZY = {
    "BitwiseRRParams": "bitwise_randomized_response",
    "BucketizedVectorParams": "bucketized_vector",
    "VectorShape": "bucketized_vector",
    "DiscreteLaplaceParams": "discrete_laplace",
    "LocalHashingParams": "local_hashing",
    "choose_frequency_oracle": "oracle_choice",
    "GRRParams": "randomized_response",
    "UnaryEncodingParams": "unary_encoding",
    "UnaryVariant": "unary_encoding",
    "oue": "unary_encoding",
    "sue": "unary_encoding",
    "VectorBoxParams": "vector_box",
    "VectorL2BallParams": "vector_l2_ball",
    "VectorPrivUnitParams": "vector_privunit",
}

__all__ = [
    "MECHANISMS",
    "BitwiseRRParams",
    "BucketizedVectorParams",
    "DiscreteLaplaceParams",
    "GRRParams",
    "LocalHashingParams",
    "MechanismParams",
    "UnaryEncodingParams",
    "UnaryVariant",
    "VectorBoxParams",
    "VectorL2BallParams",
    "VectorPrivUnitParams",
    "VectorShape",
    "choose_frequency_oracle",
    "oue",
    "sue",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
