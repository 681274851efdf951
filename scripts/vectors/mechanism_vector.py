"""The vector randomizers (box, l2 ball, PrivUnit, bucketized vector sum) for a given random-byte
stream: each vector names a key, and every coin is drawn from KeyedRng(key) (docs/protocol.md §6)
in the order of §13.

Box reports (and the bucketized vector of shape BOX) are exact: packed sign bytes as hex. Reports
that are directions go through Box-Muller Gaussians: their float32 coordinates match within
DIRECTION_TOLERANCE, and the inputs are chosen so that a Gaussian off by the tolerance of §12.4
changes no side, ranking or rounding decision beyond it. Derived constants are given too:
rationals as "numerator/denominator" strings, the collector's scale B as a double.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from ldp_client.mechanisms import MECHANISMS
from ldp_client.mechanisms.base import MechanismParams
from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams, VectorShape
from ldp_client.mechanisms.vector_box import VectorBoxParams
from ldp_client.mechanisms.vector_l2_ball import VectorL2BallParams
from ldp_client.mechanisms.vector_privunit import VectorPrivUnitParams
from ldp_client.payload import Floats, SignedVector
from ldp_client.rng import KeyedRng

from ._encoding import from_json, to_json

SECTION = "§13"

#: Absolute tolerance on a reported direction's coordinate (a few float32 ulps).
DIRECTION_TOLERANCE = 2.0**-21
#: Relative tolerance on the collector's scale B where it goes through lgamma or quadrature.
SCALE_TOLERANCE = 1e-9

_KEYS = [bytes(range(32)), bytes(range(1, 33)), b"\x5a" * 32]


class _Jittered(KeyedRng):
    """The keyed stream with every Gaussian moved by +-2^-40: a Gaussian off by more than §12.4 allows."""

    __slots__ = ("_n",)

    def __init__(self, key: bytes) -> None:
        super().__init__(key)
        self._n = 0

    def gauss(self) -> float:
        self._n += 1
        return super().gauss() + (2.0**-40 if self._n % 2 else -(2.0**-40))


def _fraction(f: Fraction) -> str:
    return f"{f.numerator}/{f.denominator}"


def _constants(params: MechanismParams) -> dict[str, Any]:
    inner = params.inner if isinstance(params, BucketizedVectorParams) else params
    out: dict[str, Any] = {"r": _fraction(inner.ratio), "scale": inner.scale}
    if isinstance(inner, VectorBoxParams):
        out.update(upper_size=inner.upper_size, lower_size=inner.lower_size,
                   upper_probability=_fraction(inner.upper_probability), scale_exact=_fraction(inner.scale_exact))
    elif isinstance(inner, VectorPrivUnitParams):
        out.update(members=inner.members, cap_size=inner.cap_size,
                   cap_probability=_fraction(inner.cap_probability))
    else:
        assert isinstance(inner, VectorL2BallParams)
        out.update(near_probability=_fraction(inner.near_probability))
    return out


def _report(params: MechanismParams, value: Any, rng: KeyedRng) -> dict[str, Any]:
    payload = params.randomize(value, rng=rng)
    if isinstance(payload, SignedVector):
        inner = _payload(payload.inner)
        return {"seed": payload.seed, **inner}
    return _payload(payload)


def _payload(payload: Any) -> dict[str, Any]:
    if isinstance(payload, Floats):
        return {"floats": list(payload.values)}
    assert isinstance(payload, bytes)
    return {"bits_hex": payload.hex()}


def _close(got: dict[str, Any], want: dict[str, Any], name: str) -> None:
    assert set(got) == set(want), f"{name}: {sorted(got)} != {sorted(want)}"
    for key, value in got.items():
        if key == "floats":
            assert len(value) == len(want[key]), name
            assert all(abs(a - b) <= DIRECTION_TOLERANCE for a, b in zip(value, want[key])), f"{name}: {value} != {want[key]}"
        else:
            assert value == want[key], f"{name}: {key}: {value} != {want[key]}"


_CASES: list[tuple[str, MechanismParams, list[Any]]] = [
    ("box-d1", VectorBoxParams(dimension=1, epsilon=1.0), [[0.0], [1.0], [-0.25]]),
    ("box-d2-even-equator", VectorBoxParams(dimension=2, epsilon=1.0), [[0.5, -0.5], [1.0, 1.0]]),
    ("box-d5", VectorBoxParams(dimension=5, epsilon=2.0), [[0.1, -0.2, 0.3, -0.4, 1.0]]),
    ("box-d10", VectorBoxParams(dimension=10, epsilon=0.5), [[0.0] * 10, [0.75, -1.0] * 5]),
    ("l2-ball-d2", VectorL2BallParams(dimension=2, epsilon=1.0), [[0.375, 0.5], [0.0, 0.0], [0.0, -1.0]]),
    ("l2-ball-d5", VectorL2BallParams(dimension=5, epsilon=3.0), [[0.5, -0.5, 0.0, 0.25, 0.0]]),
    ("privunit-d3", VectorPrivUnitParams(dimension=3, epsilon=2.0), [[0.375, 0.5, 0.0], [0.0, 0.0, 0.0]]),
    ("privunit-d1", VectorPrivUnitParams(dimension=1, epsilon=1.0), [[0.5]]),
    ("bucketized-box", BucketizedVectorParams(bucket_bits=4, dimension=3, epsilon=1.0, shape=VectorShape.BOX),
     [[5, [0.5, -1.0, 1.0]], [0, [0.0, 0.0, 1.0]]]),
    ("bucketized-l2-ball", BucketizedVectorParams(bucket_bits=8, dimension=2, epsilon=2.0,
                                                  shape=VectorShape.L2_BALL), [[200, [0.5, 1.0]]]),
    ("bucketized-privunit", BucketizedVectorParams(bucket_bits=64, dimension=3, epsilon=2.0,
                                                   shape=VectorShape.PRIVUNIT), [[2**64 - 1, [0.25, -0.5, 1.0]]]),
]


def generate() -> list[dict[str, Any]]:
    vectors = []
    for name, params, values in _CASES:
        for k, key in enumerate(_KEYS):
            for i, value in enumerate(values):
                report = _report(params, value, KeyedRng(key))
                _close(_report(params, value, _Jittered(key)), report, f"{name}: not robust to the Gaussian tolerance")
                vectors.append({
                    "name": f"{name}-value{i}-key{k}",
                    "input": {"mechanism": to_json(MECHANISMS.dump(params)), "value": to_json(value), "key": key.hex()},
                    "output": {"report": to_json(report), "constants": to_json(_constants(params))},
                })
    vectors.append({"name": "box-value-outside-the-box",
                    "input": {"mechanism": {"vector_box": {"dimension": 2, "epsilon": 1.0}}, "value": [1.5, 0.0],
                              "key": _KEYS[0].hex()},
                    "output": {"error": "a box value must lie in [-1, 1]^d"}})
    vectors.append({"name": "l2-ball-value-outside-the-ball",
                    "input": {"mechanism": {"vector_l2_ball": {"dimension": 2, "epsilon": 1.0}}, "value": [0.8, 0.8],
                              "key": _KEYS[0].hex()},
                    "output": {"error": "an l2-ball value must have norm <= 1 (+ 1e-9)"}})
    vectors.append({"name": "bucketized-bucket-too-large",
                    "input": {"mechanism": {"bucketized_vector": {"bucket_bits": 2, "dimension": 1, "epsilon": 1.0,
                                                                  "shape": 2}},
                              "value": [4, [0.0]], "key": _KEYS[0].hex()},
                    "output": {"error": "the bucket must be below 2^bucket_bits"}})
    return vectors


def verify(vector: dict[str, Any]) -> None:
    name, data, output = vector["name"], vector["input"], vector["output"]
    params = MECHANISMS.load(from_json(data["mechanism"]))
    assert isinstance(params, MechanismParams)
    rng = KeyedRng(bytes.fromhex(data["key"]))
    value = from_json(data["value"])
    if "error" in output:
        try:
            params.randomize(value, rng=rng)
        except (ValueError, TypeError):
            return
        raise AssertionError(f"{name}: accepted, but must be rejected: {output['error']}")
    _close(to_json(_report(params, value, rng)), output["report"], name)
    want = output["constants"]
    got = to_json(_constants(params))
    assert set(got) == set(want), name
    for key, value in got.items():
        if key == "scale":
            assert math.isclose(value, want[key], rel_tol=SCALE_TOLERANCE), f"{name}: scale {value} != {want[key]}"
        else:
            assert value == want[key], f"{name}: {key}: {value} != {want[key]}"
