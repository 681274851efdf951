"""The uniform grid: normalization, the exact floor, clamping, and the row-major cell index."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ldp_client.encoders import NumericDomain, UniformGridEncoder
from ldp_client.encoders.base import Encoder
from ldp_client.encoders.geometry import grid_multi_index

from ._encoding import encode_vector, error_vector, verify_vector

SECTION = "§11.3"


def _extra(encoder: Encoder, points: Sequence[Any]) -> dict[str, Any]:
    """Each point's normalized coordinates t and cell coordinates (c_0, ..., c_{d-1})."""
    assert isinstance(encoder, UniformGridEncoder)
    return {
        "normalized": [encoder.domain.normalize(p) for p in points],
        "coordinates": [grid_multi_index(encoder.encode(p), encoder.cells_per_dimension) for p in points],
    }


def _grid(lower: tuple[float, ...], upper: tuple[float, ...], cells: tuple[int, ...]) -> UniformGridEncoder:
    return UniformGridEncoder(domain=NumericDomain(lower=lower, upper=upper), cells_per_dimension=cells)


_BAD_DOMAIN = {"lower": [0.0], "upper": [1.0]}


def generate() -> list[dict[str, Any]]:
    return [
        # 0.3 is the double 0.29999999999999998889...: exactly below 3/10, so cell 2, although the
        # rounded product fl(0.3 * 10) is 3.0; 0.1 is just above 1/10, so cell 1; 1.0 is in the last cell.
        encode_vector("1d-ten-cells-exact-floor", _grid((0.0,), (1.0,), (10,)),
                      [[0.0], [0.1], [0.3], [0.7], [0.9999999999999999], [1.0], [-5.0], [7.0]], _extra),
        encode_vector("1d-thirds", _grid((0.0,), (1.0,), (3,)),
                      [[1 / 3], [2 / 3], [0.5], [5e-324]], _extra),
        # t = fl(fl(x - lower) / fl(upper - lower)), each operation rounded to nearest even.
        encode_vector("1d-offset-domain-rounding", _grid((0.1,), (0.7,), (3,)),
                      [[0.3], [0.5], [0.30000000000000004], [0.7], [0.1]], _extra),
        encode_vector("2d-row-major-last-fastest", _grid((-2.0, 10.0), (2.0, 30.0), (4, 5)),
                      [[-2.0, 10.0], [-2.0, 14.0], [-1.0, 10.0], [1.999, 29.999], [2.0, 30.0], [0.0, 20.0],
                       [-3.0, 31.0]], _extra),
        encode_vector("3d-one-cell-dimension", _grid((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), (1, 2, 3)),
                      [[0.5, 0.25, 0.9], [0.5, 0.75, 0.0]], _extra),
        encode_vector("largest-cells-per-dimension", _grid((0.0, 0.0), (1.0, 1.0), (2**32 - 1, 2**32 - 1)),
                      [[0.0, 0.0], [0.5, 0.5], [1.0, 1.0], [0.9999999999999999, 1e-300]], _extra),
        encode_vector("2^64-cells", _grid((0.0,) * 4, (1.0,) * 4, (2**16, 2**16, 2**31, 2)),
                      [[1.0, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5]], _extra),
        error_vector("zero-cells", {"uniform_grid": {"domain": _BAD_DOMAIN, "cells_per_dimension": [0]}},
                     "cells_per_dimension entries must be >= 1"),
        error_vector("cells-entry-per-dimension", {"uniform_grid": {"domain": _BAD_DOMAIN, "cells_per_dimension": [2, 2]}},
                     "one cells_per_dimension entry per domain dimension"),
        error_vector("more-than-2^64-cells",
                     {"uniform_grid": {"domain": {"lower": [0.0] * 3, "upper": [1.0] * 3},
                                       "cells_per_dimension": [2**32 - 1, 2**32 - 1, 2]}},
                     "the product of cells_per_dimension must be at most 2^64"),
        error_vector("empty-domain-interval", {"uniform_grid": {"domain": {"lower": [1.0], "upper": [1.0]},
                                                                "cells_per_dimension": [2]}},
                     "every domain dimension needs lower < upper"),
        error_vector("infinite-domain-bound", {"uniform_grid": {"domain": {"lower": [0.0], "upper": ["Infinity"]},
                                                                "cells_per_dimension": [2]}},
                     "domain bounds must be finite"),
        error_vector("domain-extent-overflows", {"uniform_grid": {"domain": {"lower": [-1e308], "upper": [1e308]},
                                                                  "cells_per_dimension": [2]}},
                     "upper - lower must be finite in binary64"),
        error_vector("point-of-wrong-dimension", {"uniform_grid": {"domain": _BAD_DOMAIN, "cells_per_dimension": [2]}},
                     "a point must have the domain's dimension", point=[0.5, 0.5]),
        error_vector("nan-coordinate", {"uniform_grid": {"domain": _BAD_DOMAIN, "cells_per_dimension": [2]}},
                     "a NaN coordinate is rejected, not clamped", point=["NaN"]),
        error_vector("infinite-coordinate", {"uniform_grid": {"domain": _BAD_DOMAIN, "cells_per_dimension": [2]}},
                     "an infinite coordinate is rejected, not clamped", point=["-Infinity"]),
    ]


def verify(vector: dict[str, Any]) -> None:
    verify_vector(vector, _extra)
