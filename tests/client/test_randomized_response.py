"""GRR: exact privacy (ratio and tightness), negative control, goodness of fit, unbiasedness."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

import pytest

from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import GRRParams
from ldp_client.rng import SeededRng
from support.exact import max_privacy_ratio, output_distribution
from support.stats import assert_chi2_fits, assert_unbiased


@pytest.mark.parametrize("domain_size", [2, 3, 5])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, math.log(9), 3.7])
def test_exact_privacy_ratio_is_tight(domain_size: int, epsilon: float) -> None:
    params = GRRParams(domain_size=domain_size, epsilon=epsilon)
    dists = [output_distribution(lambda rng, x=x: params.randomize(x, rng=rng)) for x in range(domain_size)]
    ratio = max_privacy_ratio(dists)
    assert ratio == params.ratio  # tight: the realized epsilon is exactly ln(ratio)
    assert ratio <= Fraction(math.exp(epsilon))
    assert params.realized_epsilon <= epsilon
    assert epsilon - params.realized_epsilon < 1e-12


def test_ln9_passes_and_ln8_999_fails() -> None:
    """OpenDP-style tightness: a mechanism for ln 9 must not pass as ln 8.999."""
    params = GRRParams(domain_size=3, epsilon=math.log(9))
    dists = [output_distribution(lambda rng, x=x: params.randomize(x, rng=rng)) for x in range(3)]
    ratio = max_privacy_ratio(dists)
    assert math.log(ratio) <= math.log(9)
    assert math.log(ratio) > math.log(8.999)


@dataclass(frozen=True, kw_only=True)
class _OverconfidentGRR(GRRParams):
    """Negative control: keeps the true value with the probability meant for 2 * epsilon."""

    @cached_property
    def p_exact(self) -> Fraction:
        r = self.ratio**2
        return r / (r + self.domain_size - 1)


def test_negative_control_is_caught() -> None:
    params = _OverconfidentGRR(domain_size=4, epsilon=1.0)
    dists = [output_distribution(lambda rng, x=x: params.randomize(x, rng=rng)) for x in range(4)]
    assert max_privacy_ratio(dists) > params.ratio


@pytest.mark.parametrize("domain_size,epsilon", [(4, 1.0), (16, 2.0)])
def test_reports_fit_exact_distribution(domain_size: int, epsilon: float) -> None:
    params = GRRParams(domain_size=domain_size, epsilon=epsilon)
    rng = SeededRng(1234)
    exact = output_distribution(lambda r: params.randomize(1, rng=r))
    samples = [params.randomize(1, rng=rng) for _ in range(20_000)]
    assert_chi2_fits(samples, exact)


def test_reference_estimator_is_unbiased() -> None:
    params = GRRParams(domain_size=8, epsilon=1.5)
    rng = SeededRng(99)
    truth = [0] * 3000 + [3] * 1000 + [5] * 1000
    reports = [params.randomize(v, rng=rng) for v in truth]
    n = len(reports)
    for value, true_count in [(0, 3000), (3, 1000), (7, 0)]:
        c = sum(1 for y in reports if y == value)
        estimate = (c - n * params.q) / (params.p - params.q)
        assert_unbiased(estimate, true_count, math.sqrt(params.count_variance(n, true_count)))


def test_bad_parameters_and_values() -> None:
    with pytest.raises(InvalidParameterError, match="epsilon must be in"):
        GRRParams(domain_size=4, epsilon=0.0)
    with pytest.raises(InvalidParameterError, match="epsilon must be finite"):
        GRRParams(domain_size=4, epsilon=float("nan"))
    with pytest.raises(InvalidParameterError, match="domain_size must be in"):
        GRRParams(domain_size=1, epsilon=1.0)
    with pytest.raises(TypeError, match="domain_size must be an int"):
        GRRParams(domain_size=4.0, epsilon=1.0)  # type: ignore[arg-type]
    params = GRRParams(domain_size=4, epsilon=1.0)
    with pytest.raises(InvalidParameterError, match=r"grr value must be in \[0, 4\), got 4"):
        params.randomize(4)
    with pytest.raises(TypeError):
        params.randomize("1")
    with pytest.raises(ProtocolError):
        params.check_payload(4)
    with pytest.raises(ProtocolError):
        GRRParams.from_dict({"domain_size": "4", "epsilon": 1.0})
