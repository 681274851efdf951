"""Public randomness expanded from a 64-bit seed: JL projections, Gaussian hyperplanes, grid shifts.

Every public random object of a round (a projection matrix, SimHash hyperplanes, the shift of a
shifted grid) is a pure function of a 64-bit seed published in the round spec. The collector
builds its numpy matrices by calling **these same pure-Python functions** (then ``numpy.array``),
so the device and the server use bit-identical entries by construction, not by two
implementations that happen to agree. (Products of those matrices with points may differ in the
last bits between a Python ``sum`` and a BLAS kernel; only the entries are part of the contract.)

Specification
-------------
All arithmetic is on unsigned 64-bit integers (mod ``2^64``).

``mix64(z)``
    The SplitMix64 finalizer: ``z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27;
    z *= 0x94D049BB133111EB; z ^= z >> 31``.
``splitmix64(state, i)``
    ``mix64(state + (i + 1) * 0x9E3779B97F4A7C15)``: output ``i`` (0-based) of the SplitMix64
    generator of Steele, Lea and Flood (OOPSLA 2014) started from ``state``. Stateless: any word
    of the stream is computed directly from its counter.
``stream_key(seed, purpose)``
    ``mix64(seed ^ purpose)``. The purpose tag separates streams, so the same seed used for a
    projection and for hyperplanes still yields unrelated values. Tags are the 8 ASCII bytes,
    big-endian: :data:`PURPOSE_PROJECTION` = ``b"ldp.proj"``, :data:`PURPOSE_HYPERPLANES` =
    ``b"ldp.hypr"``, :data:`PURPOSE_SHIFT` = ``b"ldp.shft"``.
word ``i`` of ``(seed, purpose)``
    ``splitmix64(stream_key(seed, purpose), i)``.
uniform ``i``
    ``(word_i >> 11) * 2^-53``, one of the ``2^53`` multiples of ``2^-53`` in ``[0, 1)``.
Rademacher sign ``i``
    bit ``i mod 64`` of word ``i div 64``: ``0 -> +1``, ``1 -> -1``.
Gaussian ``i``
    Box-Muller from words ``2i`` and ``2i + 1``: ``u1 = 1 - uniform(word_2i)`` in ``(0, 1]``,
    ``u2 = uniform(word_(2i+1))``, value ``math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)``
    (the cosine branch only). ``math.log``/``math.cos`` come from the platform's C library; the
    collector evaluates them with the same Python functions.
Matrices
    Row-major: entry ``(r, c)`` of a ``rows x cols`` matrix is value ``r * cols + c`` of its stream.
    The JL projection to ``k`` dimensions has entries ``sign / sqrt(k)``.
Products
    :func:`dot` sums the rounded products left to right from ``0.0``, one rounding per step
    (not Python's ``sum``, which compensates its rounding errors from Python 3.12 on).

The normative text is ``docs/protocol.md`` §12.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from .._spec import Spec
from .._validation import check_int
from ..errors import InvalidParameterError
from .base import MAX_DIMENSION

__all__ = [
    "MAX_PROJECTION_ENTRIES",
    "PURPOSE_HYPERPLANES",
    "PURPOSE_PROJECTION",
    "PURPOSE_SHIFT",
    "RandomProjection",
    "dot",
    "gaussian_matrix",
    "gaussian_values",
    "mix64",
    "rademacher_matrix",
    "rademacher_signs",
    "splitmix64",
    "stream_key",
    "stream_words",
    "uniform_values",
]

MASK64 = 2**64 - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_TWO_POW_MINUS_53 = 2.0**-53

#: Stream tags (8 ASCII bytes, big-endian).
PURPOSE_PROJECTION = int.from_bytes(b"ldp.proj", "big")
PURPOSE_HYPERPLANES = int.from_bytes(b"ldp.hypr", "big")
PURPOSE_SHIFT = int.from_bytes(b"ldp.shft", "big")

#: Largest ``input_dimension * output_dimension`` of a projection (memory and per-point cost).
MAX_PROJECTION_ENTRIES = 2**20


def mix64(z: int) -> int:
    """The SplitMix64 finalizer, a bijection of ``[0, 2^64)``."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * _M1) & MASK64
    z = ((z ^ (z >> 27)) * _M2) & MASK64
    return z ^ (z >> 31)


def splitmix64(state: int, counter: int) -> int:
    """Output ``counter`` (0-based) of SplitMix64 started from ``state``."""
    return mix64(state + (counter + 1) * GOLDEN_GAMMA)


def stream_key(seed: int, purpose: int) -> int:
    """The SplitMix64 state of the ``purpose`` stream of ``seed``: ``mix64(seed ^ purpose)``."""
    return mix64((seed ^ purpose) & MASK64)


def stream_words(seed: int, purpose: int, count: int, start: int = 0) -> list[int]:
    """Words ``start, ..., start + count - 1`` of the ``(seed, purpose)`` stream."""
    key = stream_key(seed, purpose)
    out = []
    z = (key + start * GOLDEN_GAMMA) & MASK64
    for _ in range(count):
        z = (z + GOLDEN_GAMMA) & MASK64
        out.append(mix64(z))
    return out


def uniform_values(seed: int, purpose: int, count: int) -> list[float]:
    """``count`` uniforms ``(word >> 11) * 2^-53`` in ``[0, 1)``."""
    return [(w >> 11) * _TWO_POW_MINUS_53 for w in stream_words(seed, purpose, count)]


def gaussian_values(seed: int, purpose: int, count: int) -> list[float]:
    """``count`` standard normal values, Box-Muller (cosine branch) on word pairs ``(2i, 2i + 1)``."""
    words = stream_words(seed, purpose, 2 * count)
    out = []
    for i in range(count):
        u1 = 1.0 - (words[2 * i] >> 11) * _TWO_POW_MINUS_53
        u2 = (words[2 * i + 1] >> 11) * _TWO_POW_MINUS_53
        out.append(math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2))
    return out


def rademacher_signs(seed: int, purpose: int, count: int) -> list[int]:
    """``count`` signs in ``{+1, -1}``: bit ``i mod 64`` of word ``i div 64`` (0 -> +1)."""
    words = stream_words(seed, purpose, (count + 63) // 64)
    return [1 - 2 * ((words[i >> 6] >> (i & 63)) & 1) for i in range(count)]


def dot(a: Sequence[float], b: Sequence[float]) -> float:
    """``sum_i a_i b_i`` in binary64: each product rounded, summed left to right from ``0.0``.

    The order and the roundings are part of the protocol (``docs/protocol.md`` §12), so a plain
    loop: Python's ``sum`` of floats is compensated (more exact, but different) from 3.12 on.
    """
    acc = 0.0
    for x, y in zip(a, b):
        acc += x * y
    return acc


def _rows(values: Sequence[float], rows: int, cols: int) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(values[r * cols:(r + 1) * cols]) for r in range(rows))


def rademacher_matrix(seed: int, rows: int, cols: int,
                      purpose: int = PURPOSE_PROJECTION) -> tuple[tuple[float, ...], ...]:
    """The ``rows x cols`` JL matrix with entries ``sign / sqrt(rows)``, row-major from the stream."""
    scale = 1.0 / math.sqrt(rows)
    return _rows([s * scale for s in rademacher_signs(seed, purpose, rows * cols)], rows, cols)


def gaussian_matrix(seed: int, rows: int, cols: int,
                    purpose: int = PURPOSE_HYPERPLANES) -> tuple[tuple[float, ...], ...]:
    """A ``rows x cols`` matrix of standard normal entries, row-major from the stream."""
    return _rows(gaussian_values(seed, purpose, rows * cols), rows, cols)


@dataclass(frozen=True, kw_only=True)
class RandomProjection(Spec):
    """A public Johnson-Lindenstrauss projection (``ldp.v1.RandomProjection``).

    ``z = P y`` with ``P`` the ``output_dimension x input_dimension`` matrix
    :func:`rademacher_matrix` ``(seed, output_dimension, input_dimension)``: entries
    ``+-1/sqrt(k)``, so ``E ||P y||^2 = ||y||^2`` and, for any fixed ``y``,
    ``||P y||^2 / ||y||^2`` concentrates in ``1 +- O(sqrt(log(1/delta) / k))``.

    Parameters
    ----------
    input_dimension : int
        ``d`` in ``[1, 4096]``.
    output_dimension : int
        ``k`` in ``[1, 4096]``, with ``k * d <= 2^20``.
    seed : int
        Public 64-bit seed (stream tag :data:`PURPOSE_PROJECTION`).

    Notes
    -----
    Cost: ``k d`` multiply-adds per point; the matrix is built once per object (``k d / 64``
    generator words).
    """

    input_dimension: int
    output_dimension: int
    seed: int

    def __post_init__(self) -> None:
        check_int("input_dimension", self.input_dimension, 1, MAX_DIMENSION)
        check_int("output_dimension", self.output_dimension, 1, MAX_DIMENSION)
        check_int("seed", self.seed, 0, MASK64)
        if self.input_dimension * self.output_dimension > MAX_PROJECTION_ENTRIES:
            raise InvalidParameterError(
                f"input_dimension * output_dimension must be at most {MAX_PROJECTION_ENTRIES}, got "
                f"{self.input_dimension} * {self.output_dimension}")

    @cached_property
    def matrix(self) -> tuple[tuple[float, ...], ...]:
        """The ``output_dimension`` rows of ``input_dimension`` entries ``+-1/sqrt(k)``."""
        return rademacher_matrix(self.seed, self.output_dimension, self.input_dimension)

    @property
    def max_abs_output(self) -> float:
        """Exact bound of ``|z_r|`` over inputs in ``[-1, 1]^d``: ``d / sqrt(k)`` (each row's l1 norm)."""
        return self.input_dimension / math.sqrt(self.output_dimension)

    def apply(self, vector: Sequence[float]) -> list[float]:
        """``P @ vector``: :func:`dot` of each row with ``vector`` (left to right, column order)."""
        if len(vector) != self.input_dimension:
            raise InvalidParameterError(
                f"projection input must have dimension {self.input_dimension}, got {len(vector)}")
        return [dot(row, vector) for row in self.matrix]
