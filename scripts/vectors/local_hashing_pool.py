"""Local hashing with a public seed pool: the pool's seeds, the device's draws and what must be rejected.

Three kinds of vectors:

* ``pool-seed-*``: ``seed_pool_key`` and an index j -> the SplitMix64 stream state
  ``mix64(key XOR "ldp.pool")``, the 64-bit word j of that stream and the seed (its top 32 bits);
* ``report-*``: a ``LocalHashing`` message, the device's value, the key of its keyed random-byte
  stream (§6) and an optional collector-assigned seed -> the pool index, the seed, the true bucket
  H(seed, value) (§7) and the report (seed, bucket), with the draws in the order §14 states;
* ``error-*``: parameters, an assigned seed or a report that an implementation must reject.

Integers beyond 2^53 are decimal strings.
"""

from __future__ import annotations

from typing import Any

from ldp_client.encoders.projection import GOLDEN_GAMMA, MASK64, mix64, stream_key
from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms.local_hashing import (
    MAX_SEED_POOL,
    PURPOSE_SEED_POOL,
    LocalHashingParams,
    hash_value,
    pool_seed,
)
from ldp_client.payload import HashedValue
from ldp_client.rng import KeyedRng

SECTION = "§14"

_KEYS = [0, 1, 0x0123456789ABCDEF, MASK64]
_INDEXES = [0, 1, 2, 1000, MAX_SEED_POOL - 1]

# (domain_size, epsilon, hash_range, seed_pool_size, seed_pool_key, value, assigned seed or None)
_REPORTS: list[tuple[int, float, int, int, int, int, int | None]] = [
    (16, 2.0, 0, 1, 0, 3, None),
    (16, 2.0, 0, 7, 42, 3, None),
    (1000, 1.0, 0, 100, 0x0123456789ABCDEF, 999, None),
    (1000, 1.0, 0, 100, 0x0123456789ABCDEF, 0, None),
    (2**63, 0.5, 0, 4096, MASK64, 2**63 - 1, None),
    (50, 4.0, 3, 16, 7, 49, None),
    (50, 4.0, 3, MAX_SEED_POOL, 7, 10, None),
    (256, 2.0, 0, 10, 99, 17, 0),
    (256, 2.0, 0, 10, 99, 17, 23),
    (256, 2.0, 0, 10, 99, 17, 2**32 - 1),
]
_RNG_KEYS = [bytes(range(32)), b"\xff" * 32, bytes(32)]


def _num(x: int) -> int | str:
    return str(x) if x >= 2**53 else x


def _int(x: int | str) -> int:
    return int(x)


def _params(data: dict[str, Any]) -> LocalHashingParams:
    return LocalHashingParams(domain_size=_int(data["domain_size"]), epsilon=float(data["epsilon"]),
                              hash_range=_int(data["hash_range"]), seed_pool_size=_int(data["seed_pool_size"]),
                              seed_pool_key=_int(data["seed_pool_key"]))


def _pool_seed_output(key: int, index: int) -> dict[str, Any]:
    state = stream_key(key, PURPOSE_SEED_POOL)
    word = mix64((state + (index + 1) * GOLDEN_GAMMA) & MASK64)
    return {"stream_state": _num(state), "word": _num(word), "seed": pool_seed(key, index)}


def _report_output(params: LocalHashingParams, value: int, rng_key: bytes, assigned: int | None) -> dict[str, Any]:
    # The draws of §14, in order, from the keyed stream (§6): the pool index (unless assigned),
    # then the exact coin, then (when it fails) the other bucket.
    rng = KeyedRng(rng_key)
    size = params.seed_pool_size
    index = rng.randbelow(size) if assigned is None else assigned % size
    seed = pool_seed(params.seed_pool_key, index)
    bucket = hash_value(seed, value, params.g)
    report = params.randomize(value, rng=KeyedRng(rng_key), seed=assigned)
    assert report.seed == seed
    return {"g": params.g, "pool_index": index, "seed": seed, "true_bucket": bucket,
            "report": {"seed": report.seed, "value": report.value}}


def _message(domain: int, epsilon: float, hash_range: int, size: int, key: int) -> dict[str, Any]:
    return {"domain_size": _num(domain), "epsilon": epsilon, "hash_range": hash_range,
            "seed_pool_size": size, "seed_pool_key": _num(key)}


def _errors() -> list[dict[str, Any]]:
    good = _message(16, 2.0, 0, 8, 5)
    params = _params(good)
    outsider = next(s for s in range(1000) if s not in set(params.pool_seeds))
    return [
        {"name": "error-pool-too-large", "input": {"local_hashing": _message(16, 2.0, 0, MAX_SEED_POOL + 1, 5)},
         "output": {"error": "seed_pool_size above 2^24"}},
        {"name": "error-key-too-large",
         "input": {"local_hashing": {**good, "seed_pool_key": str(2**64)}},
         "output": {"error": "seed_pool_key not below 2^64"}},
        {"name": "error-key-without-pool", "input": {"local_hashing": _message(16, 2.0, 0, 0, 5)},
         "output": {"error": "seed_pool_key != 0 while seed_pool_size = 0"}},
        {"name": "error-assigned-seed-too-large",
         "input": {"local_hashing": good, "value": 3, "assigned_seed": str(2**32)},
         "output": {"error": "an assigned seed not below 2^32"}},
        {"name": "error-report-seed-outside-pool",
         "input": {"local_hashing": good, "report": {"seed": outsider, "value": 0}},
         "output": {"error": "a report whose seed is not one of the pool's seeds"}},
    ]


def generate() -> list[dict[str, Any]]:
    vectors: list[dict[str, Any]] = []
    for k, key in enumerate(_KEYS):
        for index in _INDEXES:
            vectors.append({"name": f"pool-seed-key{k}-index{index}",
                            "input": {"seed_pool_key": _num(key), "index": index},
                            "output": _pool_seed_output(key, index)})
    for r, (domain, epsilon, hash_range, size, key, value, assigned) in enumerate(_REPORTS):
        message = _message(domain, epsilon, hash_range, size, key)
        params = _params(message)
        for s, rng_key in enumerate(_RNG_KEYS):
            vectors.append({
                "name": f"report-{r}-stream{s}",
                "input": {"local_hashing": message, "value": _num(value), "stream_key": rng_key.hex(),
                          "assigned_seed": assigned},
                "output": _report_output(params, value, rng_key, assigned)})
    vectors.extend(_errors())
    return vectors


def verify(vector: dict[str, Any]) -> None:
    name, data = vector["name"], vector["input"]
    if "error" in vector["output"]:
        try:
            params = _params(data["local_hashing"])
            if "assigned_seed" in data:
                params.randomize(_int(data["value"]), rng=KeyedRng(bytes(32)), seed=_int(data["assigned_seed"]))
            if "report" in data:
                params.check_payload(HashedValue(data["report"]["seed"], data["report"]["value"]))
        except (InvalidParameterError, ProtocolError):
            return
        raise AssertionError(f"{name}: accepted what must be rejected ({vector['output']['error']})")
    if name.startswith("pool-seed-"):
        got = _pool_seed_output(_int(data["seed_pool_key"]), data["index"])
    else:
        assigned = data["assigned_seed"]
        got = _report_output(_params(data["local_hashing"]), _int(data["value"]), bytes.fromhex(data["stream_key"]),
                             None if assigned is None else _int(assigned))
    assert got == vector["output"], f"{name}: {got} != {vector['output']}"
