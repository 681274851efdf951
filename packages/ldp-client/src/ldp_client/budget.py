"""Exact privacy-budget arithmetic, shared by the device's ledger, the collector and simulations.

Epsilons are floats, and a float sum rounds: ten charges of 0.1 add up to 0.9999999999999999 in
one order and 1.0000000000000002 exactly. Budget checks therefore compare the exact rational sum
of the charges with the cap -- no relative slack, so a device never spends more than its cap, not
even by a rounding error. Whoever divides a budget among rounds (a collector under the ``SPLIT``
policy) uses :func:`split_epsilon`, whose shares sum to at most the budget exactly, so that every
share fits the cap it was cut from.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from fractions import Fraction

__all__ = ["MAX_MECHANISM_EPSILON", "UNIT", "equal_share", "exact_sum", "fits", "split_epsilon", "sum_up", "units"]

#: Largest epsilon a single mechanism (one report) accepts; beyond it randomization is numerically
#: meaningless. The collector refuses campaigns whose reports would need more.
MAX_MECHANISM_EPSILON = 20.0

#: Every finite double is an integer multiple of 2^-1074 (the smallest subnormal), so budgets are
#: summed exactly as integers in that unit: cheaper than :class:`fractions.Fraction` by an order of
#: magnitude, which matters on a device's hot path.
UNIT = Fraction(1, 1 << 1074)
_UNIT_BITS = 1074


@functools.lru_cache(maxsize=256)  # a device meets few distinct epsilons and caps
def units(epsilon: float) -> int:
    """``epsilon`` (a finite float >= 0) as an exact integer multiple of :data:`UNIT`."""
    numerator, denominator = epsilon.as_integer_ratio()  # denominator = 2^k, k <= 1074
    return numerator << (_UNIT_BITS + 1 - denominator.bit_length())


def exact_sum(epsilons: Iterable[float]) -> Fraction:
    """The exact rational sum of ``epsilons`` (every float is a dyadic rational)."""
    return sum(map(units, epsilons)) * UNIT


def sum_up(epsilons: Iterable[float]) -> float:
    """The smallest float at or above the exact sum of ``epsilons``: what a composition of them costs.

    A correctly rounded sum (``math.fsum``) may round down, under-stating the composed epsilon by
    half an ulp; this never does.
    """
    values = list(epsilons)
    if len(values) == 1:
        return values[0]
    total = math.fsum(values)
    if units(total) < sum(map(units, values)):
        total = math.nextafter(total, math.inf)
    return total


def fits(spent: int, epsilon: float, cap: float) -> bool:
    """Whether a charge of ``epsilon`` on top of ``spent`` (exact, in :data:`UNIT`) stays within ``cap``, exactly."""
    return spent + units(epsilon) <= units(cap)


def split_epsilon(total: float, weights: Sequence[float]) -> tuple[float, ...]:
    """Shares of ``total`` in proportion to ``weights`` whose exact sum is at most ``total``.

    Each share is the float ``total * w / sum(weights)``; while the exact sum of the shares exceeds
    ``total``, the largest share is lowered to the next float below it (at most a few steps: each
    rounding is half an ulp). Every share is positive.

    Parameters
    ----------
    total : float
        The budget, finite and > 0.
    weights : sequence of float
        Positive, finite weights (e.g. ``[1] * R`` for R equal rounds).

    Raises
    ------
    ValueError
        ``total`` or a weight is not finite and positive, or there are no weights.
    """
    if not (math.isfinite(total) and total > 0):
        raise ValueError(f"total must be finite and > 0, got {total!r}")
    if not weights or not all(math.isfinite(w) and w > 0 for w in weights):
        raise ValueError(f"weights must be a non-empty sequence of finite numbers > 0, got {weights!r}")
    scale = math.fsum(weights)
    shares = [total * (w / scale) for w in weights]
    cap = Fraction(total)
    while exact_sum(shares) > cap:
        i = max(range(len(shares)), key=shares.__getitem__)
        shares[i] = math.nextafter(shares[i], 0.0)
    if not all(s > 0 for s in shares):
        raise ValueError(f"{total!r} is too small to split into {len(shares)} positive shares")
    return tuple(shares)


def equal_share(total: float, parts: int) -> float:
    """The largest float ``s`` with ``parts * s <= total`` exactly: one of ``parts`` equal shares.

    Raises
    ------
    ValueError
        ``total`` is not finite and positive, or ``parts < 1``.
    """
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"parts must be an int >= 1, got {parts!r}")
    return min(split_epsilon(total, [1.0] * parts))
