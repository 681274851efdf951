"""The dyadic grid tree: the level-l cell of the normalized point and its Morton index
(bit b of coordinate c_j is bit b d + j of the index: dimension 0 takes the low bit)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ldp_client.encoders import GridTreeEncoder, NumericDomain
from ldp_client.encoders.base import Encoder
from ldp_client.encoders.geometry import tree_coordinates_of

from ._encoding import encode_vector, error_vector, verify_vector

SECTION = "§11.4"


def _extra(encoder: Encoder, points: Sequence[Any]) -> dict[str, Any]:
    """Each point's cell coordinates (c_0, ..., c_{d-1}) at the encoder's level."""
    assert isinstance(encoder, GridTreeEncoder)
    return {"coordinates": [tree_coordinates_of(encoder.domain.normalize(p), encoder.level) for p in points]}


def _tree(d: int, level: int, lower: float = 0.0, upper: float = 1.0) -> GridTreeEncoder:
    return GridTreeEncoder(domain=NumericDomain(lower=(lower,) * d, upper=(upper,) * d), level=level)


def generate() -> list[dict[str, Any]]:
    return [
        # The mirror test: (0.75, 0.25) is in coordinates (1, 0), index 1 (dimension 0 in the low
        # bit); (0.25, 0.75) is in (0, 1), index 2. The opposite guess swaps them.
        encode_vector("2d-level-1-low-bit-is-dimension-0", _tree(2, 1),
                      [[0.25, 0.25], [0.75, 0.25], [0.25, 0.75], [0.75, 0.75]], _extra),
        encode_vector("2d-level-3", _tree(2, 3),
                      [[0.1, 0.8], [0.875, 0.125], [0.5, 0.5], [0.49999999999999994, 1.0], [1.0, 1.0],
                       [0.0, 0.0]], _extra),
        encode_vector("level-0-whole-box", _tree(3, 0, -5.0, 5.0), [[-5.0, 0.0, 5.0], [9.0, -9.0, 1.0]], _extra),
        encode_vector("3d-level-2", _tree(3, 2), [[0.3, 0.6, 0.9], [0.9, 0.3, 0.6], [0.25, 0.5, 0.75]], _extra),
        encode_vector("1d-level-64-full-uint64", _tree(1, 64),
                      [[0.0], [0.5], [1.0], [0.9999999999999999], [5e-324]], _extra),
        encode_vector("2d-level-32", _tree(2, 32), [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.3, 0.7]], _extra),
        encode_vector("64d-level-1", _tree(64, 1), [[0.75] + [0.25] * 62 + [0.75]], _extra),
        encode_vector("clamped-and-scaled-domain", GridTreeEncoder(
            domain=NumericDomain(lower=(-180.0, -90.0), upper=(180.0, 90.0)), level=4),
            [[13.4, 52.5], [-74.0, 40.7], [180.0, 90.0], [-200.0, 100.0]], _extra),
        error_vector("level-too-deep", {"grid_tree": {"domain": {"lower": [0.0, 0.0], "upper": [1.0, 1.0]},
                                                      "level": 33}},
                     "level * dimension must be at most 64"),
        error_vector("65d-level-1", {"grid_tree": {"domain": {"lower": [0.0] * 65, "upper": [1.0] * 65},
                                                   "level": 1}},
                     "level * dimension must be at most 64"),
        error_vector("point-of-wrong-dimension", {"grid_tree": {"domain": {"lower": [0.0, 0.0], "upper": [1.0, 1.0]},
                                                                "level": 2}},
                     "a point must have the domain's dimension", point=[0.5]),
    ]


def verify(vector: dict[str, Any]) -> None:
    verify_vector(vector, _extra)
