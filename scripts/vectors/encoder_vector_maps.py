"""The vector maps: unit cube t, symmetric box 2t - 1, unit ball (2t - 1) / sqrt(d)."""

from __future__ import annotations

from typing import Any

from ldp_client.encoders import NumericDomain, SymmetricBoxEncoder, UnitBallEncoder, UnitCubeEncoder

from ._encoding import encode_vector, error_vector, verify_vector

SECTION = "§11.8"


def generate() -> list[dict[str, Any]]:
    domain = NumericDomain(lower=(-2.0, 10.0, 0.1), upper=(2.0, 30.0, 0.7))
    points = [[-2.0, 10.0, 0.1], [2.0, 30.0, 0.7], [0.5, 17.3, 0.3], [-9.0, 99.0, 0.5]]
    return [
        encode_vector("unit-cube", UnitCubeEncoder(domain=domain), points),
        encode_vector("symmetric-box", SymmetricBoxEncoder(domain=domain), points),
        encode_vector("unit-ball-inside", UnitBallEncoder(domain=domain), points[2:]),
        # Corners lie on the sphere: (2t - 1) / sqrt(d) rounds to a norm <= 1 here, no shrinking.
        encode_vector("unit-ball-corners", UnitBallEncoder(domain=NumericDomain.unit(4)),
                      [[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0]]),
        error_vector("point-of-wrong-dimension", {"unit_ball": {"domain": {"lower": [0.0], "upper": [1.0]}}},
                     "a point must have the domain's dimension", point=[0.5, 0.5]),
    ]


def verify(vector: dict[str, Any]) -> None:
    verify_vector(vector)
