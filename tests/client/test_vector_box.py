"""Box vector randomizer: exact output distribution, privacy ratio (bound and tightness) and exact
unbiasedness by enumerating every coin of the real code; the textbook coin as a negative control
(it over-spends for even d); statistical unbiasedness of B z.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

import pytest

from ldp_client.errors import EncodingError, InvalidParameterError, ProtocolError
from ldp_client.mechanisms import MECHANISMS, VectorBoxParams
from ldp_client.payload import pack_bits, payload_from_wire, payload_to_wire, unpack_bits
from ldp_client.rng import SeededRng
from support.exact import EnumeratingRng, max_privacy_ratio, output_distribution
from support.stats import FALSE_FAILURE_RATE, assert_chi2_fits, assert_unbiased


def _z_for(checks: int) -> float:
    """Smallest z >= 5 with checks * P[|N(0,1)| > z] <= 1e-6 (Bonferroni over ``checks`` assertions)."""
    lo, hi = 5.0, 10.0
    if checks * math.erfc(lo / math.sqrt(2)) <= FALSE_FAILURE_RATE:
        return lo
    for _ in range(60):
        mid = (lo + hi) / 2
        if checks * math.erfc(mid / math.sqrt(2)) <= FALSE_FAILURE_RATE:
            hi = mid
        else:
            lo = mid
    return hi


_CACHE: dict[tuple[type, int, float, tuple[float, ...]], dict[Hashable, Fraction]] = {}


def _distribution(params: VectorBoxParams, x: Sequence[float]) -> dict[Hashable, Fraction]:
    """Exact output distribution of the real ``randomize`` (cached: the enumeration is the slow part)."""
    key = (type(params), params.dimension, params.epsilon, tuple(x))
    if key not in _CACHE:

        def run(rng: EnumeratingRng) -> Hashable:
            return params.randomize(list(x), rng=rng)

        _CACHE[key] = output_distribution(run)
    return _CACHE[key]


def _corners(d: int) -> list[tuple[float, ...]]:
    return list(itertools.product((-1.0, 1.0), repeat=d))


def _signs(payload: bytes, d: int) -> list[int]:
    return [1 if bit else -1 for bit in unpack_bits(payload, d)]


_INTERIOR = [0.5, -0.25, 0.3, 0.0]


def _inputs(d: int) -> list[tuple[float, ...]]:
    return _corners(d) + [tuple(_INTERIOR[:d]), (0.0,) * d]


@pytest.mark.parametrize("dimension", [1, 2, 3, 4])
@pytest.mark.parametrize("epsilon", [1.0, math.log(9)])
def test_corner_distribution_is_exact(dimension: int, epsilon: float) -> None:
    """From a corner v every z of S+ has probability r c and every z of S- has c: uniform on each side."""
    params = VectorBoxParams(dimension=dimension, epsilon=epsilon)
    r = params.ratio
    c = 1 / (r * params.upper_size + params.lower_size)
    for v in _corners(dimension):
        dist = _distribution(params, v)
        assert len(dist) == 2**dimension
        for z_bits, p in dist.items():
            assert isinstance(z_bits, bytes)
            dot = sum(a * b for a, b in zip(_signs(z_bits, dimension), v))
            assert p == (r * c if dot > 0 else c)


@pytest.mark.parametrize("dimension", [1, 2, 3, 4])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 6.0])
def test_exact_privacy_ratio_is_tight(dimension: int, epsilon: float) -> None:
    params = VectorBoxParams(dimension=dimension, epsilon=epsilon)
    dists = [_distribution(params, x) for x in _inputs(dimension)]
    assert max_privacy_ratio(dists) == params.ratio
    assert params.realized_epsilon <= epsilon and epsilon - params.realized_epsilon < 1e-12


@pytest.mark.parametrize("dimension", [1, 2, 3, 4])
def test_estimate_is_exactly_unbiased(dimension: int) -> None:
    """sum_z P[z | x] B z == x in exact rationals, for corners and interior points."""
    params = VectorBoxParams(dimension=dimension, epsilon=1.0)
    for x in _inputs(dimension):
        dist = _distribution(params, x)
        mean = [Fraction(0)] * dimension
        for z_bits, p in dist.items():
            assert isinstance(z_bits, bytes)
            for j, s in enumerate(_signs(z_bits, dimension)):
                mean[j] += p * s * params.scale_exact
        assert mean == [Fraction(v) for v in x]


@dataclass(frozen=True, kw_only=True)
class _Textbook(VectorBoxParams):
    """Negative control: the textbook hemisphere coin pi = e^eps / (e^eps + 1) for every d."""

    @cached_property
    def upper_probability(self) -> Fraction:
        return self.ratio / (self.ratio + 1)


@pytest.mark.parametrize("dimension", [1, 2, 3, 4])
def test_textbook_coin_overspends_for_even_dimension(dimension: int) -> None:
    params = _Textbook(dimension=dimension, epsilon=1.0)
    ratio = max_privacy_ratio([_distribution(params, x) for x in _inputs(dimension)])
    if dimension % 2:
        assert ratio == params.ratio  # odd d: |S+| = |S-|, the textbook coin is right
    else:
        assert ratio > params.ratio  # even d: caught
        assert ratio == params.ratio * params.lower_size / params.upper_size  # 3 r for d = 2


@pytest.mark.parametrize("dimension", range(1, 11))
def test_closed_forms_match_brute_force(dimension: int) -> None:
    params = VectorBoxParams(dimension=dimension, epsilon=0.7)
    dots = [sum(z) for z in itertools.product((-1, 1), repeat=dimension)]  # <z, v> for v = (1, ..., 1)
    upper = sum(1 for s in dots if s > 0)
    assert (params.upper_size, params.lower_size) == (upper, 2**dimension - upper)
    assert params.equator_size == sum(1 for s in dots if s == 0)
    assert params.agreement_sum == Fraction(sum(s for s in dots if s > 0), dimension)
    pi = params.upper_probability
    c_plus = params.agreement_sum / params.upper_size
    c_minus = params.agreement_sum / params.lower_size
    assert params.scale_exact == 1 / (pi * c_plus - (1 - pi) * c_minus)
    assert pi / params.upper_size == params.ratio * (1 - pi) / params.lower_size


@pytest.mark.parametrize("dimension,n,seed", [(2, 20_000, 4), (5, 20_000, 5), (5, 4_000, None)])
def test_estimate_mean_is_unbiased(dimension: int, n: int, seed: int | None) -> None:
    params = VectorBoxParams(dimension=dimension, epsilon=1.0)
    x = [0.9, -0.35, 0.0, 1.0, -1.0][:dimension]
    rng = SeededRng(seed) if seed is not None else None  # None: one unseeded run (OS CSPRNG)
    sums = [0.0] * dimension
    for _ in range(n):
        for j, v in enumerate(params.estimate(params.randomize(x, rng=rng))):
            sums[j] += v
    z = _z_for(dimension)
    for j in range(dimension):
        assert_unbiased(sums[j] / n, x[j], math.sqrt(params.coordinate_variance(x[j]) / n), z=z)


def test_reports_fit_exact_distribution() -> None:
    params = VectorBoxParams(dimension=4, epsilon=1.0)
    x = [0.5, -0.25, 0.3, 0.0]
    exact = _distribution(params, x)
    rng = SeededRng(31)
    assert_chi2_fits([params.randomize(x, rng=rng) for _ in range(20_000)], exact)


def test_payload_bits_and_wire() -> None:
    params = VectorBoxParams(dimension=10, epsilon=1.0)
    payload = params.randomize([0.1] * 10, rng=SeededRng(3))
    assert len(payload) == 2
    signs = _signs(payload, 10)
    assert pack_bits([1 if s > 0 else 0 for s in signs]) == payload
    assert params.estimate(payload) == [params.scale * s for s in signs]
    assert params.check_payload(payload_from_wire(payload_to_wire(payload))) == payload
    assert MECHANISMS.load(MECHANISMS.dump(params)) == params
    assert params.payload_bits == 10


def test_bad_parameters_and_values() -> None:
    with pytest.raises(InvalidParameterError, match=r"dimension must be in \[1, 4096\], got 4097"):
        VectorBoxParams(dimension=4097, epsilon=1.0)
    with pytest.raises(InvalidParameterError, match="epsilon must be in"):
        VectorBoxParams(dimension=2, epsilon=0.0)
    with pytest.raises(InvalidParameterError, match="epsilon must be at least"):
        VectorBoxParams(dimension=2, epsilon=1e-15)
    params = VectorBoxParams(dimension=3, epsilon=1.0)
    with pytest.raises(EncodingError, match=r"coordinate 2 must be in \[-1, 1\], got -1.5"):
        params.randomize([0.0, 0.0, -1.5])
    with pytest.raises(EncodingError, match="must be finite"):
        params.randomize([0.0, float("nan"), 0.0])
    with pytest.raises(EncodingError, match="must have dimension 3, got 2"):
        params.randomize([0.0, 0.0])
    with pytest.raises(TypeError, match="coordinate 0 must be a real number, got bool"):
        params.randomize([True, 0.0, 0.0])
    with pytest.raises(ProtocolError, match="bits set beyond"):
        params.check_payload(b"\x08")
    with pytest.raises(ProtocolError, match="1 bytes"):
        params.check_payload(b"\x00\x00")
    with pytest.raises(ProtocolError):
        params.estimate(3)
    with pytest.raises(ProtocolError):
        VectorBoxParams.from_dict({"dimension": 3})
