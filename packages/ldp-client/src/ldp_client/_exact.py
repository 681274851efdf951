"""Exact arithmetic for privacy-carrying coins.

Probabilities that carry a privacy ratio are rationals, never floats. ``e^x`` is replaced by the
largest dyadic rational below it, so a mechanism whose ratio is ``e^x`` realizes a ratio that is
exactly that rational and slightly *below* ``e^x`` (the privacy-safe direction); the mechanism
states the epsilon it really realizes as the log of that rational.

The discrete-Laplace sampler follows Canonne, Kamath and Steinke, "The Discrete Gaussian for
Differential Privacy" (NeurIPS 2020), Algorithms 1-2: it uses only exact Bernoulli coins with
rational parameters, so no floating-point inverse CDF is involved (Mironov 2012).
"""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

from .rng import Rng

#: Bits of precision of the rational stand-ins for e^x.
_PRECISION_BITS = 48


def exp_below(x: float) -> Fraction:
    """Return the largest ``m / 2**s`` that is <= e^x, with ``m`` holding about 48 bits.

    ``x`` is a float, hence an exact dyadic rational; e^x is evaluated in 80-digit decimal
    arithmetic (correctly rounded), and one unit is taken off so that rounding can never push the
    result above the true e^x.
    """
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"exp_below needs a finite x >= 0, got {x}")
    shift = max(0, _PRECISION_BITS - int(x / math.log(2)) - 1)
    with decimal.localcontext() as ctx:
        ctx.prec = 80
        value = decimal.Decimal(x).exp() * (decimal.Decimal(2) ** shift)
        numerator = int(value.to_integral_value(rounding=decimal.ROUND_FLOOR)) - 1
    return Fraction(max(numerator, 2**shift), 2**shift)


def log_fraction(r: Fraction) -> float:
    """Natural log of a positive rational, accurate for huge numerators and denominators."""
    return math.log(r.numerator) - math.log(r.denominator)


def bernoulli(p: Fraction, rng: Rng) -> bool:
    """``True`` with probability exactly ``p`` (0 <= p <= 1)."""
    return rng.bernoulli(p.numerator, p.denominator)


def bernoulli_exp(gamma: Fraction, rng: Rng) -> bool:
    """``True`` with probability exactly ``exp(-gamma)``, ``gamma >= 0`` rational (CKS Alg. 1)."""
    if gamma < 0:
        raise ValueError(f"bernoulli_exp needs gamma >= 0, got {gamma}")
    return _bernoulli_exp_ratio(gamma.numerator, gamma.denominator, rng)


# The hot loops below work on integer numerators and denominators: building Fraction objects
# costs more than the coins themselves. Coins whose outcome is certain (``num >= den``) are
# not drawn; that changes no probability.


def _bernoulli_exp_ratio(num: int, den: int, rng: Rng) -> bool:
    """``True`` with probability ``exp(-num / den)``; ``num >= 0``, ``den >= 1``."""
    while num > den:
        # exp(-gamma) = exp(-1)^floor(gamma) * exp(-(gamma - floor(gamma)))
        if not _bernoulli_exp_at_most_one(1, 1, rng):
            return False
        num -= den
    return _bernoulli_exp_at_most_one(num, den, rng)


def _bernoulli_exp_at_most_one(num: int, den: int, rng: Rng) -> bool:
    """``True`` with probability ``exp(-num / den)`` for ``0 <= num <= den``."""
    # Draw A_k ~ Bernoulli(gamma / k) until the first failure; return whether k is odd.
    k = 1
    while num >= den * k or (num and rng.bernoulli(num, den * k)):
        k += 1
    return k % 2 == 1


def discrete_laplace(scale: Fraction, rng: Rng) -> int:
    """Sample Z with P[Z = z] proportional to exp(-|z| / scale), ``scale > 0`` rational (CKS Alg. 2)."""
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    s, t = scale.denominator, scale.numerator  # exp(-|z| * s / t)
    while True:
        u = rng.randbelow(t)
        g = math.gcd(u, t)  # the reduced form of u / t, as Fraction(u, t) would give
        if not _bernoulli_exp_at_most_one(u // g, t // g, rng):
            continue
        v = 0
        while _bernoulli_exp_at_most_one(1, 1, rng):
            v += 1
        y = (u + t * v) // s
        negative = rng.bernoulli(1, 2)
        if negative and y == 0:
            continue
        return -y if negative else y
