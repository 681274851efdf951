"""Bitwise randomized response: the exact flip probability, the bit-parallel coins, the reported bits.

Input: the ``BitwiseRandomizedResponse`` parameters, the input bits (a list of 0/1, bit i first) and
the key of the keyed stream (§6). Output: r_b, p_flip and the realized ratio r_b^sensitivity as
``[numerator, denominator]`` decimal strings in lowest terms, the payload (the bits XOR the flips,
packed little-endian within bytes, as hex) and every draw in order. Error vectors: a payload a
collector MUST reject.
"""

from __future__ import annotations

from typing import Any

from ldp_client.mechanisms.bitwise_randomized_response import BitwiseRRParams

from ._common import json_fraction, payload_json, randomized, rejection, vector_key, verify_oracle

SECTION = "§7.5"

# (length, epsilon, sensitivity, bits)
_CASES: list[tuple[int, float, int, list[int]]] = [
    (1, 1.0, 1, [1]),
    (3, 2.0, 1, [1, 0, 1]),
    (8, 4.0, 2, [1, 1, 0, 0, 1, 0, 1, 0]),
    (12, 1.0, 12, [0] * 12),
    (64, 8.0, 4, [(i * 7) % 3 % 2 for i in range(64)]),
    (100, 20.0, 10, [1] * 100),
]
_KEYS = 4


def _params(inp: dict[str, Any]) -> BitwiseRRParams:
    return BitwiseRRParams(length=int(inp["length"]), epsilon=float(inp["epsilon"]),
                           sensitivity=int(inp["sensitivity"]))


def _constants(params: BitwiseRRParams) -> dict[str, Any]:
    return {"r_b": json_fraction(params.r_b), "p_flip": json_fraction(params.p_flip_exact),
            "ratio": json_fraction(params.ratio)}


def generate() -> list[dict[str, Any]]:
    vectors = []
    for length, eps, s, bits in _CASES:
        params = BitwiseRRParams(length=length, epsilon=eps, sensitivity=s)
        base = {"length": length, "epsilon": eps, "sensitivity": s}
        label = f"brr-l{length}-eps{eps}-s{s}"
        for k in range(_KEYS):
            key = vector_key(f"{label}/{k}")
            vectors.append({"name": f"{label}-key{k}", "input": {**base, "bits": bits, "key": key.hex()},
                            "output": {**_constants(params), **randomized(params, bits, key)}})
        n = (length + 7) // 8
        bad = [("short", bytes(n - 1)), ("long", bytes(n + 1))]
        if length % 8:
            bad.append(("padding", bytes(n - 1) + bytes([0x80])))
        for what, payload in bad:
            vectors.append({"name": f"{label}-reject-{what}", "input": {**base, "payload": payload_json(payload)},
                            "output": {"error": rejection(params, payload)}})
    return vectors


def verify(vector: dict[str, Any]) -> None:
    verify_oracle(vector, _params, lambda params, inp: {
        **_constants(params), **randomized(params, [int(b) for b in inp["bits"]], bytes.fromhex(inp["key"]))})
