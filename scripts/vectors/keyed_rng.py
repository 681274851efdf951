"""The keyed random-byte stream (HMAC-SHA256 in counter mode) and the draws taken from it.

Every mechanism vector names a key; its coins are the draws below from ``KeyedRng(key)``, in the
order the mechanism's section of the protocol states.
"""

from __future__ import annotations

from typing import Any

from ldp_client.rng import KeyedRng

SECTION = "§6"

_KEYS = [bytes(range(16)), bytes(range(32)), b"\xff" * 32]
# (operation, argument) sequences drawn in order from one stream.
_DRAWS: list[list[tuple[str, int]]] = [
    [("randbits", 1), ("randbits", 7), ("randbits", 8), ("randbits", 64), ("randbits", 300)],
    [("randbelow", 1), ("randbelow", 2), ("randbelow", 3), ("randbelow", 10), ("randbelow", 1000),
     ("randbelow", 2**40 + 1)],
    [("token_bytes", 5), ("randbits", 3), ("token_bytes", 40)],
]


def _draw(rng: KeyedRng, op: str, arg: int) -> Any:
    if op == "token_bytes":
        return rng.token_bytes(arg).hex()
    value = getattr(rng, op)(arg)
    return str(value) if value >= 2**53 else value


def _outputs(key: bytes, draws: list[tuple[str, int]]) -> list[Any]:
    rng = KeyedRng(key)
    return [_draw(rng, op, arg) for op, arg in draws]


def generate() -> list[dict[str, Any]]:
    vectors = []
    for k, key in enumerate(_KEYS):
        for d, draws in enumerate(_DRAWS):
            vectors.append({
                "name": f"key{k}-draws{d}",
                "input": {"key": key.hex(), "draws": [[op, arg] for op, arg in draws]},
                "output": {"values": _outputs(key, draws)},
            })
    return vectors


def verify(vector: dict[str, Any]) -> None:
    draws = [(op, int(arg)) for op, arg in vector["input"]["draws"]]
    got = _outputs(bytes.fromhex(vector["input"]["key"]), draws)
    assert got == vector["output"]["values"], f"{vector['name']}: {got} != {vector['output']['values']}"
