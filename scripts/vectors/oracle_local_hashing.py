"""Local hashing (OLH): the bucket count g, exact p, the seed and coins in order, the reported pair.

Input: the ``LocalHashing`` parameters (``hash_range`` 0 asks for the optimal g), the encoded value,
the key of the keyed stream (§6) and, for a collector-assigned seed, ``seed``. Output: g, r and p as
``[numerator, denominator]`` decimal strings in lowest terms, the hashed bucket H(seed, value, g)
before randomization, the payload and every draw in order (the 32-bit seed unless assigned, the coin,
then the other bucket). Error vectors: a payload a collector MUST reject.
"""

from __future__ import annotations

import math
from typing import Any

from ldp_client.mechanisms.local_hashing import LocalHashingParams, hash_value
from ldp_client.payload import HashedValue

from ._common import json_fraction, json_int, payload_json, randomized, rejection, vector_key, verify_oracle

SECTION = "§7.4"

# (domain_size, epsilon, hash_range, values): optimal g at several epsilons, g = 2, a large g and
# the largest domain.
_CASES: list[tuple[int, float, int, list[int]]] = [
    (10, 1.0, 0, [0, 9]),
    (100, 3.0, 0, [42]),
    (1000, 0.1, 0, [999]),
    (16, 2.0, 2, [3]),
    (50, 5.0, 1000, [7]),
    (2**63, 1.0, 0, [2**63 - 1]),
    (64, 20.0, 0, [63]),
    # epsilon = ln(20.5): e^epsilon is just above 20.5, r just below, so g = 21 (a float exp gives 22).
    (30, math.log(20.5), 0, [29]),
]
_KEYS = 5
_ASSIGNED_SEEDS = [0, 2**32 - 1]


def _params(inp: dict[str, Any]) -> LocalHashingParams:
    return LocalHashingParams(domain_size=int(inp["domain_size"]), epsilon=float(inp["epsilon"]),
                              hash_range=int(inp["hash_range"]))


def _output(params: LocalHashingParams, value: int, key: bytes, seed: int | None) -> dict[str, Any]:
    out = randomized(params, value, key, seed=seed)
    reported_seed = int(out["payload"]["hashed"]["seed"])
    return {"g": params.g, "ratio": json_fraction(params.ratio), "p": json_fraction(params.p_exact),
            "hashed_bucket": hash_value(reported_seed, value, params.g), **out}


def generate() -> list[dict[str, Any]]:
    vectors = []
    for d, eps, hash_range, values in _CASES:
        params = LocalHashingParams(domain_size=d, epsilon=eps, hash_range=hash_range)
        base = {"domain_size": json_int(d), "epsilon": eps, "hash_range": hash_range}
        label = f"olh-d{d}-eps{eps}-g{hash_range}"
        for v in values:
            for k in range(_KEYS):
                key = vector_key(f"{label}/{v}/{k}")
                vectors.append({"name": f"{label}-v{v}-key{k}",
                                "input": {**base, "value": json_int(v), "key": key.hex()},
                                "output": _output(params, v, key, None)})
            for seed in _ASSIGNED_SEEDS:
                key = vector_key(f"{label}/{v}/seed{seed}")
                vectors.append({"name": f"{label}-v{v}-assigned-seed{seed}",
                                "input": {**base, "value": json_int(v), "key": key.hex(), "seed": seed},
                                "output": _output(params, v, key, seed)})
        for what, payload in [("seed-2^32", HashedValue(2**32, 0)), ("seed-2^64-1", HashedValue(2**64 - 1, 0)),
                              ("bucket-g", HashedValue(0, params.g))]:
            vectors.append({"name": f"{label}-reject-{what}",
                            "input": {**base, "payload": payload_json(payload)},
                            "output": {"error": rejection(params, payload)}})
    return vectors


def verify(vector: dict[str, Any]) -> None:
    verify_oracle(vector, _params, lambda params, inp: _output(
        params, int(inp["value"]), bytes.fromhex(inp["key"]), int(inp["seed"]) if "seed" in inp else None))
