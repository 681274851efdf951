"""The local hash H(seed, value, g) = fmix64(fmix64(value + 0x9E3779B97F4A7C15) XOR seed) mod g.

Input: ``seed`` in [0, 2^32), ``value`` in [0, 2^64), ``g`` in [1, 2^32) (integers from 2^53 on as
decimal strings). Output: ``inner`` = fmix64(value + 0x9E3779B97F4A7C15 mod 2^64), ``outer`` =
fmix64(inner XOR seed) (both as 16 hex digits) and ``bucket`` = outer mod g. The fmix64 vectors pin
MurmurHash3's 64-bit finalizer alone.
"""

from __future__ import annotations

from typing import Any

from ldp_client.mechanisms.local_hashing import HASH_OFFSET, fmix64, hash_value

from ._common import check, json_int

SECTION = "§7.4"

_MASK64 = 2**64 - 1
_SEEDS = [0, 1, 0x12345678, 2**31, 2**32 - 1]
_VALUES = [0, 1, 2, 255, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - HASH_OFFSET, 2**64 - 1]
_GS = [1, 2, 3, 21, 1000, 2**31 + 11, 2**32 - 1]
_FMIX = [0, 1, 2**33, HASH_OFFSET, 2**63, 2**64 - 1]


def _hash(seed: int, value: int, g: int) -> dict[str, Any]:
    inner = fmix64((value + HASH_OFFSET) & _MASK64)
    outer = fmix64(inner ^ seed)
    assert outer % g == hash_value(seed, value, g)
    return {"inner": f"{inner:016x}", "outer": f"{outer:016x}", "bucket": json_int(hash_value(seed, value, g))}


def generate() -> list[dict[str, Any]]:
    vectors: list[dict[str, Any]] = [
        {"name": f"fmix64-{k:x}", "input": {"fmix64": f"{k:016x}"}, "output": {"fmix64": f"{fmix64(k):016x}"}}
        for k in _FMIX]
    for i, seed in enumerate(_SEEDS):
        for j, value in enumerate(_VALUES):
            g = _GS[(i + j) % len(_GS)]
            vectors.append({"name": f"H-seed{seed}-value{value}-g{g}",
                            "input": {"seed": seed, "value": json_int(value), "g": g},
                            "output": _hash(seed, value, g)})
    return vectors


def verify(vector: dict[str, Any]) -> None:
    inp, out = vector["input"], vector["output"]
    if "fmix64" in inp:
        check(vector["name"], {"fmix64": f"{fmix64(int(inp['fmix64'], 16)):016x}"}, out)
        return
    check(vector["name"], _hash(int(inp["seed"]), int(inp["value"]), int(inp["g"])), out)
