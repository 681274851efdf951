"""Helpers the vector areas share: JSON forms of integers and rationals, and a traced keyed stream.

Not an area itself (its name starts with ``_``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from ldp_client.rng import KeyedRng

#: The largest integer a JSON number carries exactly in every language (IEEE double).
_EXACT_JSON = 2**53


def json_int(value: int) -> int | str:
    """An integer as a JSON number, or as a decimal string from 2^53 on (``generate_vectors``' rule)."""
    return str(value) if abs(value) >= _EXACT_JSON else value


def json_fraction(value: Fraction) -> list[str]:
    """A rational in lowest terms as ``[numerator, denominator]``, both decimal strings."""
    return [str(value.numerator), str(value.denominator)]


def vector_key(label: str) -> bytes:
    """A 32-byte stream key for a vector: SHA-256 of a readable label (the key itself is in the input)."""
    return hashlib.sha256(label.encode()).digest()


class TracedRng(KeyedRng):
    """:class:`KeyedRng` that records every draw a mechanism takes, at the level the spec states it.

    Entries: ``["randbits", k, value]``, ``["randbelow", n, value]``, ``["bernoulli", num, den, 0|1]``;
    a draw made inside another (``bernoulli`` calls ``randbelow``, which calls ``randbits``) is not
    recorded again.
    """

    def __init__(self, key: bytes) -> None:
        super().__init__(key)
        self.trace: list[list[Any]] = []
        self._depth = 0

    def _record(self, entry: list[Any], draw: Callable[[], Any]) -> Any:
        self._depth += 1
        try:
            value = draw()
        finally:
            self._depth -= 1
        if self._depth == 0:
            self.trace.append([*entry, json_int(int(value))])
        return value

    def randbits(self, k: int) -> int:
        value: int = self._record(["randbits", k], lambda: super(TracedRng, self).randbits(k))
        return value

    def randbelow(self, n: int) -> int:
        value: int = self._record(["randbelow", json_int(n)], lambda: super(TracedRng, self).randbelow(n))
        return value

    def bernoulli(self, num: int, den: int) -> bool:
        value: bool = self._record(["bernoulli", json_int(num), json_int(den)],
                                   lambda: super(TracedRng, self).bernoulli(num, den))
        return value


def check(name: str, got: Any, want: Any) -> None:
    """Raise ``AssertionError`` naming the vector when ``got`` differs from ``want``."""
    assert got == want, f"{name}: got {got!r}, want {want!r}"


def verify_oracle(vector: dict[str, Any], params_of: Callable[[dict[str, Any]], Any],
                  output_of: Callable[[Any, dict[str, Any]], Any]) -> None:
    """An oracle area's ``verify``: an error vector is the rejection of its payload by the
    parameters ``params_of(input)``; any other vector's output is ``output_of(params, input)``."""
    inp, out = vector["input"], vector["output"]
    params = params_of(inp)
    if "error" in out:
        check(vector["name"], rejection(params, payload_from_json(inp["payload"])), out["error"])
        return
    check(vector["name"], output_of(params, inp), out)


def payload_json(payload: Any) -> dict[str, Any]:
    """A payload in its JSON form, keyed by its ``ldp.v1.Payload`` field: ``{"index": 3}``,
    ``{"bits": "<hex>"}``, ``{"hashed": {"seed": s, "value": v}}``, ``{"integers": [...]}``,
    ``{"floats": [...]}``, ``{"signed_vector": {"seed": s, "bits": "<hex>"}}`` or
    ``{"signed_vector": {"seed": s, "floats": [...]}}``."""
    from ldp_client.payload import Floats, HashedValue, Integers, SignedVector

    if isinstance(payload, bool):
        raise TypeError("a payload is never a boolean")
    if isinstance(payload, int):
        return {"index": json_int(payload)}
    if isinstance(payload, bytes):
        return {"bits": payload.hex()}
    if isinstance(payload, HashedValue):
        return {"hashed": {"seed": json_int(payload.seed), "value": json_int(payload.value)}}
    if isinstance(payload, Integers):
        return {"integers": [json_int(v) for v in payload.values]}
    if isinstance(payload, Floats):
        return {"floats": list(payload.values)}
    if isinstance(payload, SignedVector):
        return {"signed_vector": {"seed": payload.seed, **payload_json(payload.inner)}}
    raise TypeError(f"no JSON form for payload {type(payload).__name__}")


def payload_from_json(data: dict[str, Any]) -> Any:
    """Inverse of :func:`payload_json`."""
    from ldp_client.payload import Floats, HashedValue, Integers, SignedVector

    (field, value), = data.items()
    if field == "index":
        return int(value)
    if field == "bits":
        return bytes.fromhex(value)
    if field == "hashed":
        return HashedValue(int(value["seed"]), int(value["value"]))
    if field == "integers":
        return Integers(tuple(int(v) for v in value))
    if field == "floats":
        return Floats(tuple(float(v) for v in value))
    if field == "signed_vector":
        inner = {k: v for k, v in value.items() if k != "seed"}
        return SignedVector(int(value["seed"]), payload_from_json(inner))
    raise ValueError(f"unknown payload field {field!r}")


def randomized(params: Any, value: Any, key: bytes, **kwargs: Any) -> dict[str, Any]:
    """The output of one mechanism vector: the payload and the draws it took from ``KeyedRng(key)``."""
    rng = TracedRng(key)
    payload = params.randomize(value, rng=rng, **kwargs)
    return {"payload": payload_json(payload), "draws": rng.trace}


def rejection(params: Any, payload: Any) -> str:
    """The reason ``params.check_payload`` rejects ``payload`` (``AssertionError`` if it accepts it)."""
    from ldp_client.errors import ProtocolError

    try:
        params.check_payload(payload)
    except ProtocolError as exc:
        return str(exc)
    raise AssertionError(f"payload {payload!r} was accepted, expected a rejection")
