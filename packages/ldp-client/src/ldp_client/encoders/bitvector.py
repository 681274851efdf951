"""kCluster bit-vector encoder: one bit per public pivot, set when the point is near the pivot.

Reference: Sun, Zhao and Ye, "Distributed clustering in the anonymized space with local
differential privacy" (2019): the Hamming distance between two encodings grows with the l1
distance of the points, so clustering can run on the (debiased) bit vectors.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

from .._validation import check_int
from ..errors import InvalidParameterError
from .base import BITS, ENCODERS, Encoder, NumericDomain, as_point
from .geometry import _float_field, _require_domain, _tuple_field, clamp_point

__all__ = ["MAX_BITS", "MAX_PIVOTS_PER_ATTRIBUTE", "BitVectorEncoder"]

#: Largest number of pivots of one attribute (bounds the cost of ``max_hamming_distance``).
MAX_PIVOTS_PER_ATTRIBUTE = 256
#: Largest bit-vector length.
MAX_BITS = 2**16

_SIGN = 0x8000_0000_0000_0000
_MAGNITUDE = 0x7FFF_FFFF_FFFF_FFFF


def _ordinal(x: float) -> int:
    """Position of ``x`` in the ordered set of finite floats (``-0.0`` and ``0.0`` share 0)."""
    (bits,) = struct.unpack("<q", struct.pack("<d", x))
    return int(bits) if bits >= 0 else -(bits & _MAGNITUDE)


def _from_ordinal(o: int) -> float:
    (value,) = struct.unpack("<d", struct.pack("<Q", o if o >= 0 else (-o) | _SIGN))
    return float(value)


def _transition(on: Callable[[float], bool], on_x: float, off_x: float, guess: float) -> float:
    """The float next to the on/off boundary on the ``on`` side, between ``on_x`` and ``off_x``.

    ``on`` must be monotone between the two (all on, then all off, walking from ``on_x``).
    Binary search over float ordinals, first narrowed to a few ulps around ``guess``.
    """
    o_on, o_off = _ordinal(on_x), _ordinal(off_x)
    step = 1 if o_off > o_on else -1
    g = _ordinal(min(max(guess, min(on_x, off_x)), max(on_x, off_x)))
    near_on, near_off = g - 2 * step, g + 2 * step
    if (near_on - o_on) * step > 0 and (o_off - near_on) * step > 0 and on(_from_ordinal(near_on)):
        o_on = near_on
    if (near_off - o_on) * step > 0 and (o_off - near_off) * step > 0 and not on(_from_ordinal(near_off)):
        o_off = near_off
    while abs(o_off - o_on) > 1:
        mid = (o_on + o_off) // 2
        if on(_from_ordinal(mid)):
            o_on = mid
        else:
            o_off = mid
    return _from_ordinal(o_on)


def _attribute_max_hamming(lo: float, hi: float, pivots: tuple[float, ...], width: float) -> int:
    """Largest Hamming distance between the bits of one attribute over floats ``x`` in ``[lo, hi]``.

    Each bit ``|x - p| <= w``, evaluated in floating point exactly as :meth:`BitVectorEncoder.encode`
    does, is on for a contiguous run of floats ``[a, b]`` (``fl(x - p)`` is monotone in ``x``).
    So the vector is constant between consecutive *run starts*: ``lo``, each ``a > lo`` and the
    float after each ``b < hi``. Every achievable vector is the vector at a run start; the
    maximum is taken over all pairs of those (at most ``2 T + 1``) vectors.
    """
    starts = {lo}
    for p in pivots:
        def on(x: float, p: float = p) -> bool:
            return abs(x - p) <= width

        inside = lo if p < lo else hi if p > hi else p
        if not on(inside):
            continue  # this bit is 0 on the whole attribute range
        a = lo if on(lo) else _transition(on, inside, lo, p - width)
        b = hi if on(hi) else _transition(on, inside, hi, p + width)
        if a > lo:
            starts.add(a)
        if b < hi:
            starts.add(math.nextafter(b, math.inf))
    vectors = set()
    for x in starts:
        mask = 0
        for t, p in enumerate(pivots):
            if abs(x - p) <= width:
                mask |= 1 << t
        vectors.add(mask)
    ordered = sorted(vectors)
    best = 0
    for i, u in enumerate(ordered):
        for v in ordered[i + 1:]:
            h = (u ^ v).bit_count()
            if h > best:
                best = h
    return best


@ENCODERS.register
@dataclass(frozen=True, kw_only=True)
class BitVectorEncoder(Encoder):
    """kCluster bit vector (``ldp.v1.BitVectorEncoder``).

    Bit ``(j, t)`` is ``1`` iff ``|x_j - pivot_(j,t)| <= half_width_j`` for the point ``x``
    clamped to the domain, in the domain's original units. Bits are ordered attribute after
    attribute, pivots in their listed order: the same layout as ``pivots``.

    Parameters
    ----------
    domain : NumericDomain
        Public bounds; points outside are clamped.
    pivots : tuple of float
        All pivots ``r_(j,t)``, attribute after attribute; finite (they may lie outside the domain).
    pivots_per_attribute : tuple of int
        ``T_j`` in ``[0, 256]`` per attribute, summing to ``len(pivots)``, in ``[1, 2^16]``.
    half_widths : tuple of float
        ``theta_j > 0`` per attribute, finite.

    Notes
    -----
    :attr:`max_hamming_distance` is the sensitivity the bitwise randomized response must use
    (flip probability ``1 / (1 + e^(epsilon / Delta))``). Cost of :meth:`encode`: one comparison
    per bit. The 0/1 tuple is packed by the mechanism (:func:`ldp_client.payload.pack_bits`).
    """

    KIND: ClassVar[str] = "bit_vector"
    VALUE_KIND: ClassVar[str] = BITS

    domain: NumericDomain
    pivots: tuple[float, ...]
    pivots_per_attribute: tuple[int, ...]
    half_widths: tuple[float, ...]

    def __post_init__(self) -> None:
        _require_domain(self.domain)
        d = self.domain.dimension
        pivots = _float_field("pivots", _tuple_field("pivots", self.pivots))
        counts = _tuple_field("pivots_per_attribute", self.pivots_per_attribute)
        widths = _float_field("half_widths", _tuple_field("half_widths", self.half_widths))
        object.__setattr__(self, "pivots", pivots)
        object.__setattr__(self, "pivots_per_attribute", counts)
        object.__setattr__(self, "half_widths", widths)
        if len(counts) != d:
            raise InvalidParameterError(
                f"pivots_per_attribute must have one entry per dimension ({d}), got {len(counts)}")
        if len(widths) != d:
            raise InvalidParameterError(f"half_widths must have one entry per dimension ({d}), got {len(widths)}")
        for count in counts:
            check_int("pivots_per_attribute entry", count, 0, MAX_PIVOTS_PER_ATTRIBUTE)
        if sum(counts) != len(pivots):
            raise InvalidParameterError(
                f"pivots_per_attribute must sum to len(pivots) = {len(pivots)}, got {sum(counts)}")
        if not 1 <= len(pivots) <= MAX_BITS:
            raise InvalidParameterError(f"the bit vector must have 1 to {MAX_BITS} bits, got {len(pivots)}")
        for j, w in enumerate(widths):
            if not w > 0.0:
                raise InvalidParameterError(f"half_widths[{j}] must be > 0, got {w}")

    @cached_property
    def attribute_pivots(self) -> tuple[tuple[float, ...], ...]:
        """The pivots split per attribute."""
        out = []
        start = 0
        for count in self.pivots_per_attribute:
            out.append(self.pivots[start:start + count])
            start += count
        return tuple(out)

    @property
    def output_size(self) -> int:
        return len(self.pivots)

    @cached_property
    def max_hamming_distance(self) -> int:
        """Exact largest Hamming distance between the encodings of any two points of the domain.

        Attributes are encoded independently and the domain is a box, so the maximum is the sum
        over attributes of each attribute's own maximum. Per attribute the encoding, as a
        function of the (float) coordinate, is piecewise constant with breakpoints where a bit's
        run of ``1``s starts or ends; the run ends are located exactly in floating point (the
        same comparison ``encode`` uses, binary-searched over adjacent floats), the vector is
        evaluated at the start of every constant piece, and the largest pairwise distance among
        those vectors is taken. Cost ``O(T_j^2)`` per attribute, computed once per object.
        """
        total = 0
        for lo, hi, pivots, width in zip(self.domain.lower, self.domain.upper, self.attribute_pivots,
                                         self.half_widths):
            if pivots:
                total += _attribute_max_hamming(float(lo), float(hi), pivots, width)
        return total

    def encode(self, point: Any) -> tuple[int, ...]:
        """The 0/1 tuple of the clamped point, attribute after attribute.

        Raises
        ------
        EncodingError
            Wrong dimension or type, NaN or infinite coordinate.
        """
        x = clamp_point(as_point(point, self.domain.dimension), self.domain)
        out: list[int] = []
        for xj, pivots, width in zip(x, self.attribute_pivots, self.half_widths):
            out.extend([1 if abs(xj - p) <= width else 0 for p in pivots])
        return tuple(out)
