"""SimHash and the randomly shifted dyadic grid, with and without a public projection; the
bucketed vector encoder built on them (or on the nearest candidate).

The points are chosen at least 1e-6 away from every hyperplane and every shifted-grid cell
boundary (or exactly on the centre), so the values are the same for any implementation whose
Gaussians and half-width meet the tolerance of docs/protocol.md §12.4.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ldp_client.encoders import (
    BucketedVectorEncoder,
    NearestCandidateEncoder,
    NumericDomain,
    RandomProjection,
    ShiftedGridEncoder,
    SimHashEncoder,
)
from ldp_client.encoders.base import Encoder
from ldp_client.encoders.projection import dot

from ._encoding import encode_vector, error_vector, verify_vector

SECTION = "§12.6"

_MARGIN = 1e-6


def _space(encoder: SimHashEncoder | ShiftedGridEncoder, point: Sequence[float]) -> list[float]:
    z = [2.0 * t - 1.0 for t in encoder.domain.normalize(point)]
    return z if encoder.projection is None else encoder.projection.apply(z)


def _check_margin(encoder: Encoder, points: Sequence[Sequence[float]]) -> None:
    """Fail the generation if a point is too near a boundary for a tolerance-conforming implementation."""
    if isinstance(encoder, BucketedVectorEncoder):
        _check_margin(encoder.lsh, points)
    elif isinstance(encoder, SimHashEncoder):
        for p in points:
            z = _space(encoder, p)
            margins = [abs(dot(g, z)) for g in encoder.hyperplanes]
            assert all(z_r == 0.0 for z_r in z) or min(margins) > _MARGIN, (p, min(margins))
    elif isinstance(encoder, ShiftedGridEncoder):
        radius, scale = encoder.half_width, float(1 << encoder.level)
        for p in points:
            for z_r, s in zip(_space(encoder, p), encoder.shift):
                u = min(max((z_r + radius) / (2.0 * radius), 0.0), 1.0)
                x = (u + s) * 0.5 * scale
                assert abs(x - round(x)) > _MARGIN * scale, (p, x)


def _extra(encoder: Encoder, points: Sequence[Any]) -> dict[str, Any]:
    """Derived public values: the shifted grid's half-width R and shift, a bucketed encoder's bucket bits."""
    if isinstance(encoder, ShiftedGridEncoder):
        return {"half_width": encoder.half_width, "shift": list(encoder.shift)}
    if isinstance(encoder, BucketedVectorEncoder):
        return {"bucket_bits": encoder.bucket_bits}
    return {}


def _vector(name: str, encoder: Encoder, points: list[list[float]]) -> dict[str, Any]:
    _check_margin(encoder, points)
    return encode_vector(name, encoder, points, _extra)


_D3 = NumericDomain(lower=(0.0, 0.0, -1.0), upper=(1.0, 5.0, 1.0))
_D6 = NumericDomain.unit(6)
_POINTS3 = [[0.5, 2.5, 0.0], [0.9, 1.0, 0.3], [0.1, 4.0, -0.3], [0.0, 0.0, -1.0], [1.0, 5.0, 1.0], [3.0, -2.0, 0.7]]
_POINTS6 = [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.9, 0.1, 0.8, 0.2, 0.7, 0.3], [1.0] * 6, [0.0] * 6,
            [0.37, 0.61, 0.05, 0.93, 0.44, 0.72]]


def _bad(kind: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {kind: {"domain": {"lower": [0.0, 0.0], "upper": [1.0, 1.0]}, **fields}}


def generate() -> list[dict[str, Any]]:
    projection = RandomProjection(input_dimension=6, output_dimension=2, seed=2**63 + 5)
    simhash = SimHashEncoder(domain=_D3, bits=16, seed=0x0123456789ABCDEF)
    shifted = ShiftedGridEncoder(domain=_D3, level=4, seed=1234)
    nearest = NearestCandidateEncoder(domain=_D3, dimension=3, centers=(0.2, 1.0, 0.0, 0.8, 4.0, 0.5))
    vectors = [
        # The centre maps to z = 0: every dot product is 0 and every bit is 1.
        _vector("simhash-3d-16-bits", simhash, _POINTS3),
        _vector("simhash-projected-6-to-2", SimHashEncoder(domain=_D6, projection=projection, bits=12, seed=77),
                _POINTS6[:2] + _POINTS6[3:]),
        _vector("shifted-grid-3d-level-4", shifted, _POINTS3[1:]),
        _vector("shifted-grid-level-0", ShiftedGridEncoder(domain=_D3, level=0, seed=5), _POINTS3[1:3]),
        _vector("shifted-grid-projected-6-to-2-level-9",
                ShiftedGridEncoder(domain=_D6, projection=projection, level=9, seed=2**64 - 1), _POINTS6[:2] + _POINTS6[4:]),
        # d = 40 > 2 ln(2 k 2^20): R is the Hoeffding term sqrt(2 d ln(2 k / 2^-20) / k), not d / sqrt(k).
        _vector("shifted-grid-projected-40-to-3-level-6", ShiftedGridEncoder(
            domain=NumericDomain.unit(40), projection=RandomProjection(input_dimension=40, output_dimension=3, seed=8),
            level=6, seed=9), [[(0.37 * i + 0.11 * j) % 1.0 for j in range(40)] for i in range(1, 5)]),
        _vector("bucketed-simhash", BucketedVectorEncoder(domain=_D3, simhash=simhash), _POINTS3[1:4]),
        _vector("bucketed-shifted-grid", BucketedVectorEncoder(domain=_D3, shifted_grid=shifted), _POINTS3[1:4]),
        _vector("bucketed-nearest", BucketedVectorEncoder(domain=_D3, nearest=nearest), _POINTS3[1:4]),
        error_vector("simhash-65-bits", _bad("simhash", {"bits": 65, "seed": 1}), "bits must be in [1, 64]"),
        error_vector("simhash-0-bits", _bad("simhash", {"bits": 0, "seed": 1}), "bits must be in [1, 64]"),
        error_vector("shifted-grid-level-too-deep", _bad("shifted_grid", {"level": 33, "seed": 1}),
                     "level * k must be at most 64"),
        error_vector("projection-of-the-wrong-input-dimension", _bad("simhash", {
            "projection": {"input_dimension": 3, "output_dimension": 2, "seed": 1}, "bits": 4, "seed": 1}),
            "the projection's input_dimension must equal the domain's dimension"),
        error_vector("projection-too-large", {"simhash": {
            "domain": {"lower": [0.0] * 4096, "upper": [1.0] * 4096},
            "projection": {"input_dimension": 4096, "output_dimension": 257, "seed": 1}, "bits": 4, "seed": 1}},
            "input_dimension * output_dimension must be at most 2^20"),
        error_vector("bucketed-two-buckets", {"bucketed_vector": {
            "domain": {"lower": [0.0, 0.0], "upper": [1.0, 1.0]},
            "simhash": _bad("simhash", {"bits": 4, "seed": 1})["simhash"],
            "shifted_grid": _bad("shifted_grid", {"level": 2, "seed": 1})["shifted_grid"]}},
            "exactly one of simhash, shifted_grid and nearest"),
        error_vector("bucketed-other-domain", {"bucketed_vector": {
            "domain": {"lower": [0.0, 0.0], "upper": [1.0, 2.0]},
            "simhash": _bad("simhash", {"bits": 4, "seed": 1})["simhash"]}},
            "the bucket encoder's domain must equal the encoder's domain"),
    ]
    assert math.isfinite(shifted.half_width)
    return vectors


def verify(vector: dict[str, Any]) -> None:
    verify_vector(vector, _extra)
