"""Generalized randomized response (GRR): exact p and q, the draws in order, the reported index.

Input: the ``GeneralizedRandomizedResponse`` parameters, the encoded value and the 32-byte key of the
keyed stream (§6) the draws come from. Output: r (the exact stand-in for e^epsilon), p and q as
``[numerator, denominator]`` decimal strings in lowest terms, the payload, and every draw in order.
Error vectors: a payload a collector MUST reject (``output.error`` says why).
"""

from __future__ import annotations

from typing import Any

from ldp_client.mechanisms.randomized_response import GRRParams

from ._common import json_fraction, json_int, payload_json, randomized, rejection, vector_key, verify_oracle

SECTION = "§7.2"

# (domain_size, epsilon, values): the smallest domain, small and large epsilon, the largest domain.
_CASES: list[tuple[int, float, list[int]]] = [
    (2, 1.0, [0, 1]),
    (4, 0.5, [3]),
    (10, 2.0, [0, 9]),
    (1000, 0.01, [500]),
    (3, 20.0, [1]),
    (2**63, 3.0, [0, 2**63 - 1]),
]
_KEYS = 6


def _params(inp: dict[str, Any]) -> GRRParams:
    return GRRParams(domain_size=int(inp["domain_size"]), epsilon=float(inp["epsilon"]))


def _constants(params: GRRParams) -> dict[str, Any]:
    return {"ratio": json_fraction(params.ratio), "p": json_fraction(params.p_exact),
            "q": json_fraction(params.q_exact)}


def generate() -> list[dict[str, Any]]:
    vectors = []
    for d, eps, values in _CASES:
        params = GRRParams(domain_size=d, epsilon=eps)
        for v in values:
            for k in range(_KEYS):
                key = vector_key(f"grr/{d}/{eps}/{v}/{k}")
                vectors.append({
                    "name": f"grr-d{d}-eps{eps}-v{v}-key{k}",
                    "input": {"domain_size": json_int(d), "epsilon": eps, "value": json_int(v), "key": key.hex()},
                    "output": {**_constants(params), **randomized(params, v, key)},
                })
        for bad in (d, 2**64 - 1):
            vectors.append({
                "name": f"grr-d{d}-eps{eps}-reject-index{bad}",
                "input": {"domain_size": json_int(d), "epsilon": eps, "payload": payload_json(bad)},
                "output": {"error": rejection(params, bad)},
            })
    return vectors


def verify(vector: dict[str, Any]) -> None:
    verify_oracle(vector, _params, lambda params, inp: {
        **_constants(params), **randomized(params, int(inp["value"]), bytes.fromhex(inp["key"]))})
