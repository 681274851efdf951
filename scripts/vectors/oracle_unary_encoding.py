"""Unary encoding (SUE and OUE): exact p and q, the bit-parallel coins in order, the reported bits.

Input: the ``UnaryEncoding`` parameters (variant 1 = SYMMETRIC, 2 = OPTIMIZED), the encoded value and
the key of the keyed stream (§6). Output: r, p and q as ``[numerator, denominator]`` decimal strings
in lowest terms, the payload (bits packed little-endian within bytes, as hex) and every draw in order
(the D - 1 other bits' coins first, then the true bit's coin). Error vectors: a payload a collector
MUST reject (wrong length, padding bits set).
"""

from __future__ import annotations

from typing import Any

from ldp_client.mechanisms.unary_encoding import UnaryEncodingParams

from ._common import json_fraction, payload_json, randomized, rejection, vector_key, verify_oracle

SECTION = "§7.3"

# (domain_size, epsilon, variant, values): domains below, at and just above a byte boundary, one
# with a long bit-parallel phase, small and large epsilon.
_CASES: list[tuple[int, float, int, list[int]]] = [
    (2, 1.0, 2, [0, 1]),
    (5, 2.0, 1, [4]),
    (8, 1.0, 2, [7]),
    (9, 0.5, 1, [0, 8]),
    (16, 4.0, 2, [5]),
    (100, 1.5, 2, [37]),
    (100, 1.5, 1, [99]),
    (1000, 20.0, 2, [0]),
]
_KEYS = 4


def _params(inp: dict[str, Any]) -> UnaryEncodingParams:
    return UnaryEncodingParams(domain_size=int(inp["domain_size"]), epsilon=float(inp["epsilon"]),
                               variant=int(inp["variant"]))


def _constants(params: UnaryEncodingParams) -> dict[str, Any]:
    return {"r": json_fraction(params.r), "p": json_fraction(params.p_exact), "q": json_fraction(params.q_exact)}


def _bad_payloads(d: int) -> list[tuple[str, bytes]]:
    n = (d + 7) // 8
    bad = [("short", bytes(n - 1)), ("long", bytes(n + 1))]
    if d % 8:  # the first padding bit of the last byte set
        bad.append(("padding", bytes(n - 1) + bytes([1 << (d % 8)])))
    return bad


def generate() -> list[dict[str, Any]]:
    vectors = []
    for d, eps, variant, values in _CASES:
        params = UnaryEncodingParams(domain_size=d, epsilon=eps, variant=variant)
        base = {"domain_size": d, "epsilon": eps, "variant": variant}
        label = f"ue{variant}-d{d}-eps{eps}"
        for v in values:
            for k in range(_KEYS):
                key = vector_key(f"{label}/{v}/{k}")
                vectors.append({"name": f"{label}-v{v}-key{k}",
                                "input": {**base, "value": v, "key": key.hex()},
                                "output": {**_constants(params), **randomized(params, v, key)}})
        for what, payload in _bad_payloads(d):
            vectors.append({"name": f"{label}-reject-{what}",
                            "input": {**base, "payload": payload_json(payload)},
                            "output": {"error": rejection(params, payload)}})
    return vectors


def verify(vector: dict[str, Any]) -> None:
    verify_oracle(vector, _params, lambda params, inp: {
        **_constants(params), **randomized(params, int(inp["value"]), bytes.fromhex(inp["key"]))})
