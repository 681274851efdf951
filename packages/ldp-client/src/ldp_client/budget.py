"""Exact privacy-budget arithmetic, shared by the device's ledger, the collector and simulations.

Epsilons are floats, and a float sum rounds: ten charges of 0.1 add up to 0.9999999999999999 in
one order and 1.0000000000000002 exactly. Budget checks therefore compare the exact rational sum
of the charges with the cap -- no relative slack, so a device never spends more than its cap, not
even by a rounding error. Whoever divides a budget among rounds (a collector under the ``SPLIT``
policy) uses :func:`split_epsilon`, whose shares sum to at most the budget exactly, so that every
share fits the cap it was cut from.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction

__all__ = ["equal_share", "exact_sum", "fits", "split_epsilon", "sum_up"]


def exact_sum(epsilons: Iterable[float]) -> Fraction:
    """The exact rational sum of ``epsilons`` (every float is a dyadic rational)."""
    return sum((Fraction(e) for e in epsilons), Fraction(0))


def sum_up(epsilons: Iterable[float]) -> float:
    """The smallest float at or above the exact sum of ``epsilons``: what a composition of them costs.

    A correctly rounded sum (``math.fsum``) may round down, under-stating the composed epsilon by
    half an ulp; this never does.
    """
    values = list(epsilons)
    total = math.fsum(values)
    if Fraction(total) < exact_sum(values):
        total = math.nextafter(total, math.inf)
    return total


def fits(spent: Fraction, epsilon: float, cap: float) -> bool:
    """Whether a charge of ``epsilon`` on top of the exact ``spent`` stays within ``cap``, exactly."""
    return spent + Fraction(epsilon) <= Fraction(cap)


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
