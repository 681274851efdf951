"""A device's group in a campaign: drawn once, with probability group_weights[g] / sum(group_weights).

Input: the ``RoundSpec.group_weights`` and the key of the keyed stream (§6). Output: the group and
the draw taken (``u = randbelow(sum)``, the first group whose cumulative weight exceeds u; no draw
at all for a single group).
"""

from __future__ import annotations

from typing import Any

from ldp_client.admission import pick_group

from ._common import TracedRng, check, vector_key

SECTION = "§9.2"

_WEIGHTS: list[list[int]] = [[1], [1, 1], [3, 1], [1, 2, 3, 4], [0, 5, 0, 1], [2**31, 2**31 - 1, 7]]
_KEYS = 8


def _output(weights: list[int], key: bytes) -> dict[str, Any]:
    rng = TracedRng(key)
    return {"group": pick_group(weights, lambda: rng), "draws": rng.trace}


def generate() -> list[dict[str, Any]]:
    vectors = []
    for weights in _WEIGHTS:
        label = "-".join(map(str, weights)) if len(weights) < 5 else f"{len(weights)}-groups"
        for k in range(_KEYS):
            key = vector_key(f"group/{weights}/{k}")
            vectors.append({"name": f"weights-{label}-key{k}", "input": {"group_weights": weights, "key": key.hex()},
                            "output": _output(weights, key)})
    return vectors


def verify(vector: dict[str, Any]) -> None:
    inp = vector["input"]
    check(vector["name"], _output([int(w) for w in inp["group_weights"]], bytes.fromhex(inp["key"])), vector["output"])
