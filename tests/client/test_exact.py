"""Exact coins of ``ldp_client._exact``: Bernoulli(exp(-gamma)), discrete Laplace, exp_below.

Deterministic checks enumerate the real code's coin paths (``support.exact``), cut off where a
path's probability falls below a floor: the output probabilities then lie within the cut-off mass
of the truth. Statistical checks are chi-square fits at false-failure rate 1e-6.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable, Hashable
from fractions import Fraction

import pytest

from ldp_client._exact import bernoulli_exp, discrete_laplace, exp_below, log_fraction
from ldp_client.rng import Rng, SeededRng, _RngBase
from support.exact import EnumeratingRng, output_distribution
from support.stats import assert_chi2_fits

_CUT = "cut"


class _Cutoff(Exception):
    pass


class _FloorRng(_RngBase):
    """Forwards to an EnumeratingRng and abandons a path once its probability is below ``floor``."""

    def __init__(self, inner: EnumeratingRng, floor: Fraction) -> None:
        self.inner = inner
        self.floor = floor

    def _check(self) -> None:
        if self.inner.prob < self.floor:
            raise _Cutoff

    def bernoulli(self, num: int, den: int) -> bool:
        out = self.inner.bernoulli(num, den)
        self._check()
        return out

    def randbelow(self, n: int) -> int:
        out = self.inner.randbelow(n)
        self._check()
        return out

    def randbits(self, k: int) -> int:
        return self.randbelow(2**k)

    def token_bytes(self, n: int) -> bytes:
        return bytes(n)


def _truncated(fn: Callable[[Rng], Hashable], floor: Fraction) -> dict[Hashable, Fraction]:
    def run(rng: EnumeratingRng) -> Hashable:
        try:
            return fn(_FloorRng(rng, floor))
        except _Cutoff:
            return _CUT

    return output_distribution(run, max_paths=400_000)


GAMMAS = [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(3, 2), Fraction(7, 2), Fraction(123456789, 10**8)]


@pytest.mark.parametrize("gamma", GAMMAS)
def test_bernoulli_exp_enumerated_probability_is_exp_minus_gamma(gamma: Fraction) -> None:
    dist = _truncated(lambda rng: bernoulli_exp(gamma, rng), Fraction(1, 10**12))
    cut = float(dist.get(_CUT, 0))
    assert cut < 1e-9
    low = float(dist.get(True, 0))  # P[True] lies in [low, low + cut]
    assert low - 1e-15 <= math.exp(-float(gamma)) <= low + cut + 1e-15


@pytest.mark.parametrize("gamma", GAMMAS)
def test_bernoulli_exp_fits_chi_square(gamma: Fraction) -> None:
    rng = SeededRng(int(gamma * 1000) + 7)
    p = math.exp(-float(gamma))
    samples = [bernoulli_exp(gamma, rng) for _ in range(20_000)]
    exact: dict[Hashable, float] = {True: p, False: 1 - p} if 0 < p < 1 else {True: 1.0}
    assert_chi2_fits(samples, exact)


def test_bernoulli_exp_rejects_negative_gamma() -> None:
    with pytest.raises(ValueError, match="gamma >= 0"):
        bernoulli_exp(Fraction(-1, 2), SeededRng(1))


def _laplace_cdf(k: int, a: float) -> float:
    """P[Z <= k] for P[Z = z] = (1 - a) / (1 + a) * a^|z|."""
    if k >= 0:
        return 1.0 - a ** (k + 1) / (1 + a)
    return a ** (-k) / (1 + a)


def _binned_exact(scale: Fraction, edges: list[int]) -> dict[Hashable, float]:
    """Exact probabilities of the bins (-inf, e0], (e0, e1], ..., (e_last, inf) of a discrete Laplace."""
    a = math.exp(-1 / float(scale))
    cdf = [_laplace_cdf(e, a) for e in edges]
    probs: dict[Hashable, float] = {0: cdf[0]}
    for i in range(1, len(edges)):
        probs[i] = cdf[i] - cdf[i - 1]
    probs[len(edges)] = 1.0 - cdf[-1]
    return probs


def _bin(y: int, edges: list[int]) -> int:
    lo, hi = 0, len(edges)
    while lo < hi:  # first edge >= y
        mid = (lo + hi) // 2
        if edges[mid] >= y:
            hi = mid
        else:
            lo = mid + 1
    return lo


SCALES = [Fraction(1, 2), Fraction(3, 2), Fraction(7, 3), Fraction(10), Fraction(10 * 2**10) / Fraction(0.1)]


@pytest.mark.parametrize("scale", SCALES)
def test_discrete_laplace_fits_exact_pmf(scale: Fraction) -> None:
    rng = SeededRng(2024)
    width = max(1, math.ceil(float(scale) / 4))  # about 50 bins over +-6 scales
    edges = [k * width for k in range(-24, 24)]
    samples = [_bin(discrete_laplace(scale, rng), edges) for _ in range(20_000)]
    assert_chi2_fits(samples, _binned_exact(scale, edges))


@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(7, 3), Fraction(5)])
def test_discrete_laplace_is_exactly_symmetric(scale: Fraction) -> None:
    """The sign coin is the last draw, so the enumerated probabilities of y and -y are equal exactly."""
    dist = _truncated(lambda rng: discrete_laplace(scale, rng), Fraction(1, 10**4))
    values = [y for y in dist if y != _CUT]
    assert len(values) > 5
    for y in values:
        assert isinstance(y, int)
        if y != 0:
            assert dist[y] == dist.get(-y), y


def test_discrete_laplace_sign_balance() -> None:
    rng = SeededRng(5)
    samples = [discrete_laplace(Fraction(3, 2), rng) for _ in range(20_000)]
    signs = [y > 0 for y in samples if y != 0]
    assert_chi2_fits(signs, {True: 0.5, False: 0.5})


def test_discrete_laplace_rejects_bad_scale() -> None:
    with pytest.raises(ValueError, match="scale must be > 0"):
        discrete_laplace(Fraction(0), SeededRng(1))


@pytest.mark.parametrize("x", [0.0, 1e-12, 0.1, 1.0, math.log(9), 7.25, 20.0])
def test_exp_below_is_a_tight_lower_bound(x: float) -> None:
    r = exp_below(x)
    assert r.denominator & (r.denominator - 1) == 0  # dyadic
    with decimal.localcontext() as ctx:
        ctx.prec = 80
        exact = decimal.Decimal(x).exp()
        value = decimal.Decimal(r.numerator) / decimal.Decimal(r.denominator)
        assert value <= exact
        assert (exact - value) / exact < decimal.Decimal(2) ** -46
    assert abs(log_fraction(r) - x) < 1e-13


def test_negative_controls_are_caught() -> None:
    """A sampler with the wrong scale fails the fit; a wrong Bernoulli fails the enumeration bound."""
    rng = SeededRng(11)
    edges = list(range(-12, 12))
    samples = [_bin(discrete_laplace(Fraction(2), rng), edges) for _ in range(20_000)]
    with pytest.raises(AssertionError, match="chi-square"):
        assert_chi2_fits(samples, _binned_exact(Fraction(3, 2), edges))

    def off_by_one(rng: Rng) -> bool:  # exp(-gamma) sampled as exp(-gamma - 1/10)
        return bernoulli_exp(Fraction(1, 3) + Fraction(1, 10), rng)

    dist = _truncated(off_by_one, Fraction(1, 10**12))
    low, cut = float(dist.get(True, 0)), float(dist.get(_CUT, 0))
    assert not low - 1e-15 <= math.exp(-1 / 3) <= low + cut + 1e-15
