"""Statistical assertions with tolerances derived from the sampling distribution.

Every check is calibrated to a false-failure probability of at most ``FALSE_FAILURE_RATE`` (1e-6)
under the null hypothesis that the code is right.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from fractions import Fraction

__all__ = ["FALSE_FAILURE_RATE", "assert_chi2_fits", "assert_unbiased", "chi2_sf"]

FALSE_FAILURE_RATE = 1e-6
#: |estimate - truth| <= 5 standard errors fails falsely with probability 5.7e-7 (normal approx.).
Z_UNBIASED = 5.0


def assert_unbiased(estimate: float, truth: float, std_error: float, z: float = Z_UNBIASED) -> None:
    assert abs(estimate - truth) <= z * std_error, (
        f"estimate {estimate:.6g} is {abs(estimate - truth) / std_error:.2f} standard errors "
        f"from the truth {truth:.6g} (limit {z})"
    )


def chi2_sf(x: float, dof: int) -> float:
    """Upper tail of the chi-square distribution (regularized upper incomplete gamma), stdlib only."""
    a, xx = dof / 2.0, x / 2.0
    if xx <= 0:
        return 1.0
    if xx < a + 1:  # series for the lower tail
        term = total = 1.0 / a
        k = a
        for _ in range(10_000):
            k += 1
            term *= xx / k
            total += term
            if term < total * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-xx + a * math.log(xx) - math.lgamma(a)))
    # continued fraction for the upper tail (Lentz)
    tiny = 1e-300
    b = xx + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(-xx + a * math.log(xx) - math.lgamma(a)) * h


def assert_chi2_fits(samples: Iterable[Hashable], exact: Mapping[Hashable, Fraction | float],
                     alpha: float = FALSE_FAILURE_RATE, min_expected: float = 5.0) -> None:
    """Pearson chi-square goodness of fit of ``samples`` to the exact distribution ``exact``.

    Outcomes with expected count below ``min_expected`` are pooled into one cell; an observed
    outcome outside the support fails at once.
    """
    counts = Counter(samples)
    n = sum(counts.values())
    outside = set(counts) - set(exact)
    assert not outside, f"sampled outputs outside the exact support: {sorted(map(repr, outside))[:5]}"
    stat = 0.0
    cells = 0
    pooled_obs = 0
    pooled_exp = 0.0
    for y, p in exact.items():
        expected = n * float(p)
        if expected < min_expected:
            pooled_obs += counts.get(y, 0)
            pooled_exp += expected
            continue
        stat += (counts.get(y, 0) - expected) ** 2 / expected
        cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    dof = max(1, cells - 1)
    p_value = chi2_sf(stat, dof)
    assert p_value >= alpha, f"chi-square {stat:.2f} on {dof} dof: p = {p_value:.3g} < {alpha}"
