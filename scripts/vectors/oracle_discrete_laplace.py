"""Discrete Laplace on the unit-cube grid: the grid point, the exact scale, the coins, the noisy integers.

Input: the ``DiscreteLaplace`` parameters, the point (floats in [0, 1]) and the key of the keyed
stream (§6). Output: the grid coordinates z (nearest of 0..2^grid_bits, ties to even), the scale
d 2^grid_bits / epsilon as ``[numerator, denominator]`` decimal strings in lowest terms, the payload
(z plus noise, one integer a coordinate) and every draw in order. Error vectors: a payload a
collector MUST reject (a wrong number of integers, or one outside the signed 64-bit range).
"""

from __future__ import annotations

from typing import Any

from ldp_client.mechanisms.discrete_laplace import DiscreteLaplaceParams
from ldp_client.payload import Integers

from ._common import json_fraction, payload_json, randomized, rejection, vector_key, verify_oracle

SECTION = "§7.6"

# (dimension, epsilon, grid_bits, point): a tie on the grid (0.375 * 4 = 1.5 rounds to 2; 0.625 * 4
# = 2.5 rounds to 2), the ends, the largest epsilon, grid_bits 0.
_CASES: list[tuple[int, float, int, list[float]]] = [
    (1, 1.0, 0, [0.5]),
    (1, 20.0, 2, [0.375]),
    (2, 2.0, 2, [0.625, 1.0]),
    (2, 1.0, 10, [0.0, 0.3]),
    (3, 0.5, 4, [0.1, 0.2, 0.9]),
]
_KEYS = 3


def _params(inp: dict[str, Any]) -> DiscreteLaplaceParams:
    return DiscreteLaplaceParams(dimension=int(inp["dimension"]), epsilon=float(inp["epsilon"]),
                                 grid_bits=int(inp["grid_bits"]))


def _output(params: DiscreteLaplaceParams, point: list[float], key: bytes) -> dict[str, Any]:
    return {"grid": params.round_to_grid(point), "scale": json_fraction(params.scale),
            **randomized(params, point, key)}


def generate() -> list[dict[str, Any]]:
    vectors = []
    for d, eps, grid_bits, point in _CASES:
        params = DiscreteLaplaceParams(dimension=d, epsilon=eps, grid_bits=grid_bits)
        base = {"dimension": d, "epsilon": eps, "grid_bits": grid_bits}
        label = f"dlap-d{d}-eps{eps}-b{grid_bits}"
        for k in range(_KEYS):
            key = vector_key(f"{label}/{k}")
            vectors.append({"name": f"{label}-key{k}", "input": {**base, "point": point, "key": key.hex()},
                            "output": _output(params, point, key)})
        for what, payload in [("too-few", Integers((0,) * (d - 1))), ("too-many", Integers((0,) * (d + 1))),
                              ("above-int64", Integers((2**63,) + (0,) * (d - 1))),
                              ("below-int64", Integers((0,) * (d - 1) + (-(2**63) - 1,)))]:
            vectors.append({"name": f"{label}-reject-{what}", "input": {**base, "payload": payload_json(payload)},
                            "output": {"error": rejection(params, payload)}})
    return vectors


def verify(vector: dict[str, Any]) -> None:
    verify_oracle(vector, _params, lambda params, inp: _output(
        params, [float(x) for x in inp["point"]], bytes.fromhex(inp["key"])))
