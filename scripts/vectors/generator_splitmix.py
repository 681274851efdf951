"""The public counter-mode generator (SplitMix64 keyed by seed and purpose) and what is drawn
from it: 64-bit words, uniforms, Rademacher signs, Box-Muller Gaussians, projection matrices,
SimHash hyperplanes and shifted-grid shifts.

Words, uniforms, signs and projection entries are exact. Gaussians (and so hyperplanes) go through
log and cos: an implementation matches them within GAUSSIAN_TOLERANCE (docs/protocol.md §12.4).
"""

from __future__ import annotations

from typing import Any

from ldp_client.encoders.projection import (
    PURPOSE_HYPERPLANES,
    PURPOSE_PROJECTION,
    PURPOSE_SHIFT,
    RandomProjection,
    gaussian_matrix,
    gaussian_values,
    mix64,
    rademacher_signs,
    stream_key,
    stream_words,
    uniform_values,
)

SECTION = "§12"

#: Absolute tolerance on a Gaussian (and a hyperplane entry) of the generator, §12.4.
GAUSSIAN_TOLERANCE = 2.0**-44

_PURPOSES = {"ldp.proj": PURPOSE_PROJECTION, "ldp.hypr": PURPOSE_HYPERPLANES, "ldp.shft": PURPOSE_SHIFT}
_SEEDS = [0, 1, 99, 0x0123456789ABCDEF, 2**64 - 1]


def _stream(seed: int, purpose: str, count: int) -> dict[str, Any]:
    tag = _PURPOSES[purpose]
    return {
        "stream_key": str(stream_key(seed, tag)),
        "words": [str(w) for w in stream_words(seed, tag, count)],
        "uniforms": uniform_values(seed, tag, count),
        # 70 signs: the 64 bits of word 0 (bit 0 first), then the low 6 bits of word 1
        "signs": rademacher_signs(seed, tag, 70),
        "gaussians": gaussian_values(seed, tag, count),
    }


def _matrices(kind: str, seed: int, rows: int, cols: int) -> list[list[float]]:
    if kind == "projection":
        return [list(r) for r in RandomProjection(input_dimension=cols, output_dimension=rows, seed=seed).matrix]
    if kind == "hyperplanes":
        return [list(r) for r in gaussian_matrix(seed, rows, cols)]
    return [uniform_values(seed, PURPOSE_SHIFT, cols)]


def generate() -> list[dict[str, Any]]:
    vectors: list[dict[str, Any]] = []
    for z in (0, 1, PURPOSE_PROJECTION, 2**64 - 1):
        vectors.append({"name": f"mix64-{z:x}", "input": {"mix64": str(z)}, "output": {"value": str(mix64(z))}})
    for seed in _SEEDS:
        for purpose in _PURPOSES:
            vectors.append({"name": f"stream-{seed:x}-{purpose}",
                            "input": {"seed": str(seed), "purpose": purpose,
                                      "purpose_value": str(_PURPOSES[purpose]), "count": 6},
                            "output": _stream(seed, purpose, 6)})
    for kind, seed, rows, cols in [("projection", 99, 2, 3), ("projection", 2**63 + 5, 3, 40),
                                   ("hyperplanes", 5, 4, 2), ("hyperplanes", 0x0123456789ABCDEF, 3, 3),
                                   ("shift", 1234, 1, 3), ("shift", 2**64 - 1, 1, 8)]:
        vectors.append({"name": f"{kind}-{seed:x}-{rows}x{cols}",
                        "input": {"matrix": kind, "seed": str(seed), "rows": rows, "columns": cols},
                        "output": {"entries": _matrices(kind, seed, rows, cols)}})
    return vectors


def _close(got: list[float], want: list[float], name: str) -> None:
    assert len(got) == len(want), f"{name}: {len(got)} values != {len(want)}"
    for g, w in zip(got, want):
        assert abs(g - w) <= GAUSSIAN_TOLERANCE, f"{name}: {g} != {w}"


def verify(vector: dict[str, Any]) -> None:
    name, data, output = vector["name"], vector["input"], vector["output"]
    if "mix64" in data:
        assert {"value": str(mix64(int(data["mix64"])))} == output, name
        return
    if "matrix" in data:
        got = _matrices(data["matrix"], int(data["seed"]), data["rows"], data["columns"])
        assert set(output) == {"entries"} and len(got) == len(output["entries"]), name
        for row, want in zip(got, output["entries"]):
            if data["matrix"] == "hyperplanes":
                _close(row, want, name)
            else:
                assert row == want, f"{name}: {row} != {want}"
        return
    assert str(_PURPOSES[data["purpose"]]) == data["purpose_value"], name
    got_stream = _stream(int(data["seed"]), data["purpose"], data["count"])
    assert set(got_stream) == set(output), name
    for key, value in got_stream.items():
        if key == "gaussians":
            _close(value, output[key], name)
        else:
            assert value == output[key], f"{name}: {key}: {value} != {output[key]}"
