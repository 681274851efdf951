"""Unary encoding (SUE, OUE): exact privacy (ratio and tightness), negative control, exactness of the
bit-parallel Bernoulli sampler, goodness of fit, unbiasedness, payload shape, validation and serde."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from statistics import NormalDist

import pytest

from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import MECHANISMS, UnaryEncodingParams, UnaryVariant, oue, sue
from ldp_client.mechanisms.unary_encoding import bernoulli_mask
from ldp_client.payload import get_bit
from ldp_client.rng import Rng, SeededRng
from support.exact import max_privacy_ratio, output_distribution
from support.stats import FALSE_FAILURE_RATE, Z_UNBIASED, assert_chi2_fits, assert_unbiased


def _z(tests: int) -> float:
    """Bonferroni: ``tests`` simultaneous 2-sided checks with a total false-failure rate <= 1e-6."""
    return max(Z_UNBIASED, NormalDist().inv_cdf(1 - FALSE_FAILURE_RATE / (2 * tests)))


def _dists(params: UnaryEncodingParams) -> list[dict[Hashable, Fraction]]:
    def dist(x: int) -> dict[Hashable, Fraction]:
        return output_distribution(lambda rng: params.randomize(x, rng=rng))

    return [dist(x) for x in range(params.domain_size)]


# --- exact privacy -----------------------------------------------------------------------------

@pytest.mark.parametrize("variant", list(UnaryVariant))
@pytest.mark.parametrize("domain_size,epsilon", [
    (d, e) for d in (2, 3, 4) for e in (0.1, 1.0, math.log(9), 3.7)] + [(5, 1.0), (5, 20.0)])
def test_exact_privacy_ratio_is_tight(variant: UnaryVariant, domain_size: int, epsilon: float) -> None:
    params = UnaryEncodingParams(domain_size=domain_size, epsilon=epsilon, variant=variant)
    ratio = max_privacy_ratio(_dists(params))
    assert ratio == params.ratio  # tight: the realized epsilon is exactly ln(ratio)
    assert ratio == params.p_exact * (1 - params.q_exact) / (params.q_exact * (1 - params.p_exact))
    assert ratio <= Fraction(math.exp(epsilon))
    assert params.realized_epsilon <= epsilon
    assert epsilon - params.realized_epsilon < 1e-12


@pytest.mark.parametrize("make", [sue, oue])
def test_ln9_passes_and_ln8_999_fails(make: Callable[[int, float], UnaryEncodingParams]) -> None:
    params = make(3, math.log(9))
    ratio = max_privacy_ratio(_dists(params))
    assert math.log(ratio) <= math.log(9)
    assert math.log(ratio) > math.log(8.999)


def test_probabilities_are_the_documented_ones() -> None:
    s, o = sue(8, 2.0), oue(8, 2.0)
    assert s.r <= Fraction(math.exp(1.0)) and o.r <= Fraction(math.exp(2.0))
    assert s.p_exact == s.r / (s.r + 1) and s.q_exact == 1 / (s.r + 1) and s.ratio == s.r**2
    assert o.p_exact == Fraction(1, 2) and o.q_exact == 1 / (o.r + 1) and o.ratio == o.r
    assert math.isclose(s.realized_epsilon, 2 * math.log(s.r), rel_tol=1e-12)


@dataclass(frozen=True, kw_only=True)
class _LeakyOUE(UnaryEncodingParams):
    """Negative control: other bits set with the probability meant for 2 * epsilon (too rarely)."""

    @cached_property
    def q_exact(self) -> Fraction:
        return 1 / (self.r**2 + 1)


@dataclass(frozen=True, kw_only=True)
class _LeakySUE(UnaryEncodingParams):
    """Negative control: the true bit kept with the probability meant for the full epsilon."""

    @cached_property
    def p_exact(self) -> Fraction:
        return self.r**2 / (self.r**2 + 1)


@pytest.mark.parametrize("control,variant", [(_LeakyOUE, UnaryVariant.OPTIMIZED),
                                             (_LeakySUE, UnaryVariant.SYMMETRIC)])
def test_negative_control_is_caught(control: type[UnaryEncodingParams], variant: UnaryVariant) -> None:
    epsilon = 1.0
    params = control(domain_size=3, epsilon=epsilon, variant=variant)
    ratio = max_privacy_ratio(_dists(params))
    assert ratio > params.ratio
    assert ratio > Fraction(math.exp(epsilon))


# --- the bit-parallel sampler ------------------------------------------------------------------

_PROBS = [Fraction(0), Fraction(1), Fraction(1, 2), Fraction(1, 3), Fraction(5, 7), oue(4, 1.0).q_exact]


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("prob", _PROBS)
def test_bernoulli_mask_is_exactly_independent_coins(n: int, prob: Fraction) -> None:
    dist = output_distribution(lambda rng: bernoulli_mask(n, prob.numerator, prob.denominator, rng))
    expected = {m: prob ** bin(m).count("1") * (1 - prob) ** (n - bin(m).count("1")) for m in range(2**n)}
    assert dist == {m: p for m, p in expected.items() if p}


def test_bernoulli_mask_is_exact_with_partial_windows() -> None:
    """n = 5 reaches every branch: bit-parallel rounds over a narrowed window, the round cap, single coins."""
    prob = sue(4, 1.0).q_exact
    dist = output_distribution(lambda rng: bernoulli_mask(5, prob.numerator, prob.denominator, rng))
    assert dist == {m: prob ** bin(m).count("1") * (1 - prob) ** (5 - bin(m).count("1")) for m in range(32)}


def test_bernoulli_mask_large_n_marginals_and_adjacent_pairs() -> None:
    n, draws = 1023, 1000
    prob = oue(1024, 1.0).q_exact
    q = float(prob)
    rng = SeededRng(5)
    masks = [bernoulli_mask(n, prob.numerator, prob.denominator, rng) for _ in range(draws)]
    assert all(m >> n == 0 for m in masks)
    ones = sum(bin(m).count("1") for m in masks)
    pairs = sum(bin(m & (m >> 1)).count("1") for m in masks)
    z = _z(2)
    assert_unbiased(ones, draws * n * q, math.sqrt(draws * n * q * (1 - q)), z=z)
    # adjacent pairs overlap: Var = (n-1) q^2 (1-q^2) + 2 (n-2) (q^3 - q^4) per draw
    pair_var = (n - 1) * q**2 * (1 - q**2) + 2 * (n - 2) * (q**3 - q**4)
    assert_unbiased(pairs, draws * (n - 1) * q**2, math.sqrt(draws * pair_var), z=z)


def test_bernoulli_mask_rejects_bad_probability() -> None:
    rng = SeededRng(0)
    with pytest.raises(InvalidParameterError, match="0 <= num <= den"):
        bernoulli_mask(4, 3, 2, rng)
    with pytest.raises(InvalidParameterError, match="0 <= num <= den"):
        bernoulli_mask(4, 0, 0, rng)


# --- statistics --------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", list(UnaryVariant))
def test_reports_fit_exact_distribution(variant: UnaryVariant) -> None:
    params = UnaryEncodingParams(domain_size=4, epsilon=1.0, variant=variant)
    rng = SeededRng(1234)
    exact = output_distribution(lambda r: params.randomize(2, rng=r))
    samples = [params.randomize(2, rng=rng) for _ in range(20_000)]
    assert_chi2_fits(samples, exact)


@pytest.mark.parametrize("variant", list(UnaryVariant))
def test_reference_estimator_is_unbiased(variant: UnaryVariant) -> None:
    params = UnaryEncodingParams(domain_size=16, epsilon=1.5, variant=variant)
    rng = SeededRng(99)
    truth = [0] * 3000 + [3] * 1000 + [5] * 1000
    reports = [params.randomize(v, rng=rng) for v in truth]
    n = len(reports)
    checks = [(0, 3000), (3, 1000), (5, 1000), (15, 0)]
    for value, true_count in checks:
        c = sum(get_bit(y, value) for y in reports)
        estimate = (c - n * params.q) / (params.p - params.q)
        assert_unbiased(estimate, true_count, math.sqrt(params.count_variance(n, true_count)), z=_z(len(checks)))


@pytest.mark.parametrize("seeded", [True, False])
def test_oue_large_domain_bits(seeded: bool) -> None:
    """D = 1024 (the production path); one run uses the OS CSPRNG (unseeded)."""
    params = oue(1024, 2.0)
    rng: Rng | None = SeededRng(17) if seeded else None
    n, value = 2000, 700
    reports = [params.randomize(value, rng=rng) for _ in range(n)]
    assert all(params.check_payload(y) == y for y in reports)
    ints = [int.from_bytes(y, "little") for y in reports]
    holder = sum((x >> value) & 1 for x in ints)
    others = sum(bin(x).count("1") for x in ints) - holder
    p, q = params.p, params.q
    z = _z(3)
    assert_unbiased(holder, n * p, math.sqrt(n * p * (1 - p)), z=z)
    assert_unbiased(others, n * 1023 * q, math.sqrt(n * 1023 * q * (1 - q)), z=z)
    c = sum((x >> 3) & 1 for x in ints)
    assert_unbiased((c - n * q) / (p - q), 0, math.sqrt(params.count_variance(n, 0)), z=z)


def test_count_variance_is_the_exact_variance() -> None:
    params = sue(16, 1.0)
    p, q = params.p, params.q
    n, count = 1000, 100
    direct = (count * p * (1 - p) + (n - count) * q * (1 - q)) / (p - q) ** 2
    assert math.isclose(params.count_variance(n, count), direct, rel_tol=1e-12)
    o = oue(16, 1.0)
    r = float(o.r)
    assert math.isclose(o.count_variance(1, 0), 4 * r / (r - 1) ** 2, rel_tol=1e-12)


# --- payload, validation, serde ----------------------------------------------------------------

def test_payload_shape_and_check() -> None:
    params = oue(13, 1.0)
    rng = SeededRng(3)
    for _ in range(200):
        y = params.randomize(12, rng=rng)
        assert isinstance(y, bytes) and len(y) == 2 and y[1] >> 5 == 0
        assert params.check_payload(y) == y
    assert params.payload_bits == 13 and params.input_size == 13
    with pytest.raises(ProtocolError, match="2 bytes"):
        params.check_payload(b"\x00")
    with pytest.raises(ProtocolError, match="beyond domain_size 13"):
        params.check_payload(b"\x00\x20")
    with pytest.raises(ProtocolError):
        params.check_payload(bytearray(2))
    with pytest.raises(ProtocolError):
        params.check_payload(3)
    assert oue(16, 1.0).check_payload(b"\xff\xff") == b"\xff\xff"


def test_bad_parameters_and_values() -> None:
    with pytest.raises(InvalidParameterError, match="epsilon must be in"):
        oue(4, 0.0)
    with pytest.raises(InvalidParameterError, match="epsilon must be finite"):
        oue(4, float("nan"))
    with pytest.raises(InvalidParameterError, match="epsilon must be finite"):
        sue(4, float("inf"))
    with pytest.raises(InvalidParameterError, match=r"domain_size must be in \[2, 1048576\], got 1"):
        oue(1, 1.0)
    with pytest.raises(InvalidParameterError, match="domain_size must be in"):
        oue(2**20 + 1, 1.0)
    with pytest.raises(TypeError, match="domain_size must be an int"):
        oue(4.0, 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="epsilon must be a real number"):
        oue(4, "1")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match=r"variant must be SYMMETRIC \(1\) or OPTIMIZED \(2\), got 0"):
        UnaryEncodingParams(domain_size=4, epsilon=1.0, variant=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="variant must be a UnaryVariant"):
        UnaryEncodingParams(domain_size=4, epsilon=1.0, variant="OPTIMIZED")  # type: ignore[arg-type]
    plain = UnaryEncodingParams(domain_size=4, epsilon=1.0, variant=2)  # type: ignore[arg-type]
    assert plain.variant is UnaryVariant.OPTIMIZED and plain == oue(4, 1.0)
    params = oue(4, 1.0)
    with pytest.raises(InvalidParameterError, match=r"unary_encoding value must be in \[0, 4\), got 4"):
        params.randomize(4)
    with pytest.raises(InvalidParameterError, match="got -1"):
        params.randomize(-1)
    for bad in ("1", 1.0, True, None):
        with pytest.raises(TypeError, match="unary_encoding value must be an int"):
            params.randomize(bad)


def test_from_dict_round_trip() -> None:
    for params in (sue(10, 0.5), oue(2**20, 20.0)):
        data = params.to_dict()
        assert data == {"domain_size": params.domain_size, "epsilon": params.epsilon, "variant": int(params.variant)}
        assert UnaryEncodingParams.from_dict(data) == params
        assert MECHANISMS.load(MECHANISMS.dump(params)) == params
        assert MECHANISMS.dump(params) == {"unary_encoding": data}
    with pytest.raises(ProtocolError):
        UnaryEncodingParams.from_dict({"domain_size": 4, "epsilon": 1.0, "variant": 3})
    with pytest.raises(ProtocolError):
        UnaryEncodingParams.from_dict({"domain_size": "4", "epsilon": 1.0, "variant": 1})
    with pytest.raises(ProtocolError):
        UnaryEncodingParams.from_dict({"domain_size": 4, "epsilon": 1.0, "variant": 1, "p": 0.5})


def test_matches_the_proto_message() -> None:
    mechanisms_pb2 = pytest.importorskip("ldp.v1.mechanisms_pb2")
    message = mechanisms_pb2.UnaryEncoding
    assert [f.name for f in message.DESCRIPTOR.fields] == ["domain_size", "epsilon", "variant"]
    assert {v.name: int(v) for v in UnaryVariant} == {
        name: number for name, number in message.Variant.items() if number}
    assert UnaryEncodingParams.KIND in mechanisms_pb2.MechanismSpec.DESCRIPTOR.fields_by_name
