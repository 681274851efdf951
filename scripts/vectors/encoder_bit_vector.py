"""The kCluster bit vector: bit (j, t) = [ |x_j - pivot| <= half_width_j ] on the clamped point,
compared in binary64; and the exact largest Hamming distance (the bitwise RR's sensitivity)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ldp_client.encoders import BitVectorEncoder, NumericDomain
from ldp_client.encoders.base import Encoder

from ._encoding import encode_vector, error_vector, verify_vector

SECTION = "§11.6"


def _extra(encoder: Encoder, points: Sequence[Any]) -> dict[str, Any]:
    """The encoder's largest Hamming distance between two points of the domain."""
    assert isinstance(encoder, BitVectorEncoder)
    return {"max_hamming_distance": encoder.max_hamming_distance}


def _bad(pivots: list[float], counts: list[int], widths: list[float]) -> dict[str, Any]:
    return {"bit_vector": {"domain": {"lower": [0.0], "upper": [1.0]}, "pivots": pivots,
                           "pivots_per_attribute": counts, "half_widths": widths}}


def generate() -> list[dict[str, Any]]:
    two = BitVectorEncoder(domain=NumericDomain(lower=(0.0, -10.0), upper=(1.0, 10.0)),
                           pivots=(0.1, 0.5, 0.9, -5.0, 0.0, 5.0, 12.0),
                           pivots_per_attribute=(3, 4), half_widths=(0.2, 2.5))
    # fl(0.3 - 0.1) = 0.19999999999999998 <= 0.2: on, although 0.3 - 0.1 exceeds 0.2 for the decimals.
    rounding = BitVectorEncoder(domain=NumericDomain(lower=(0.0,), upper=(1.0,)), pivots=(0.1, 0.7),
                                pivots_per_attribute=(2,), half_widths=(0.2,))
    empty_attribute = BitVectorEncoder(domain=NumericDomain(lower=(0.0, 0.0), upper=(1.0, 1.0)),
                                       pivots=(0.25, 0.75), pivots_per_attribute=(0, 2), half_widths=(1.0, 0.25))
    return [
        encode_vector("2-attributes-attribute-major", two,
                      [[0.5, 0.0], [0.3, -2.5], [0.7, 2.5], [0.0, 10.0], [-3.0, 99.0], [1.0, -7.5]], _extra),
        encode_vector("binary64-difference", rounding, [[0.3], [0.9], [0.5], [0.30000000000000004]], _extra),
        encode_vector("attribute-without-pivots", empty_attribute, [[0.9, 0.5], [0.1, 0.0], [0.5, 1.0]], _extra),
        error_vector("counts-do-not-sum", _bad([0.5, 0.6], [1], [0.1]), "pivots_per_attribute must sum to len(pivots)"),
        error_vector("zero-half-width", _bad([0.5], [1], [0.0]), "half_widths must be > 0"),
        error_vector("257-pivots-in-an-attribute", _bad([0.5] * 257, [257], [0.1]),
                     "at most 256 pivots per attribute"),
        error_vector("no-pivots", _bad([], [0], [0.1]), "the vector has 1 to 2^16 bits"),
        error_vector("infinite-pivot", _bad(["Infinity"], [1], [0.1]), "pivots must be finite"),
    ]


def verify(vector: dict[str, Any]) -> None:
    verify_vector(vector, _extra)
