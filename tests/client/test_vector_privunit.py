"""PrivUnit vector randomizer: exact privacy ratio (bound and tightness) by enumeration, negative
control, the scale against an independent quadrature, unbiasedness of B w, the unit-norm invariant.

The Gaussian magnitudes are continuous, so the enumeration fixes them (``_CyclingGauss``); every
other draw of the real code is enumerated: the rounding coin of x~, the fair sign coins of the
direction sampler, the cap coin and the uniform member index. The ratio argument needs nothing
else: given the random set S, the output distribution is decided by those coins alone. The
enumeration runs the real code with two pairs (four members) instead of sixteen, so that the paths
stay few; the argument does not depend on the set's size.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import ClassVar

import pytest

from ldp_client.errors import EncodingError, InvalidParameterError, ProtocolError
from ldp_client.mechanisms import MECHANISMS, VectorL2BallParams, VectorPrivUnitParams
from ldp_client.mechanisms.vector_privunit import PAIRS, cap_sums
from ldp_client.payload import Floats, payload_from_wire, payload_to_wire
from ldp_client.rng import SeededRng
from support.exact import max_privacy_ratio, output_distribution
from support.stats import FALSE_FAILURE_RATE, assert_unbiased


@dataclass(frozen=True, kw_only=True)
class _TwoPairs(VectorPrivUnitParams):
    """The real mechanism with a random set of two antipodal pairs (enumerable)."""

    pairs: ClassVar[int] = 2


@dataclass(frozen=True, kw_only=True)
class _Overconfident(_TwoPairs):
    """Negative control: the cap coin is calibrated for 2 * epsilon."""

    @cached_property
    def cap_probability(self) -> Fraction:
        r, j = self.ratio**2, self.cap_size
        return r * j / (r * j + self.members - j)


class _CyclingGauss:
    """Replays ``pairs * d`` fixed Gaussian values cyclically, from the start on every path.

    Two directions use the whole cycle, so an input x = 0 (whose x~ draws d values first) sees the
    same set S in another order: every input randomizes over the same S.
    """

    def __init__(self, values: Sequence[float]) -> None:
        self.values = list(values)
        self.i = 0

    def reset(self) -> None:
        self.i = 0

    def __call__(self) -> float:
        v = self.values[self.i % len(self.values)]
        self.i += 1
        return v


def _distribution(params: VectorPrivUnitParams, x: Sequence[float], gauss: _CyclingGauss) -> dict[Hashable, Fraction]:
    def run(rng: object) -> Hashable:
        gauss.reset()
        return params.randomize(list(x), rng=rng).values  # type: ignore[arg-type]

    return output_distribution(run, fixed_gauss=gauss)


# (magnitudes of the two directions, inputs): each input list has e_1 and -e_1 (tightness), 0 and
# interior points; the third case makes the two directions' dots with e_2 tie exactly.
CASES: list[tuple[tuple[float, ...], list[tuple[float, ...]]]] = [
    ((0.7, 0.2), [(1.0,), (-1.0,), (0.0,), (0.3,), (-0.75,)]),
    ((1.0, 0.3, -0.4, 1.1), [(1.0, 0.0), (-1.0, 0.0), (0.0, 0.0), (0.5, -0.5), (0.3, -0.4), (0.6, 0.8)]),
    ((0.7, 1.0, -1.3, 1.0), [(1.0, 0.0), (-1.0, 0.0), (0.0, 0.0), (0.0, 1.0), (0.25, 0.5)]),
    ((0.7, -1.3, 0.2, 0.1, 0.9, -0.5), [(1.0, 0.0, 0.0), (-1.0, 0.0, 0.0), (0.0, 0.0, 0.0), (0.2, -0.3, 0.5)]),
]


@pytest.mark.parametrize("magnitudes,inputs", CASES)
@pytest.mark.parametrize("epsilon", [0.1, 1.0, math.log(9), 5.0])
def test_exact_privacy_ratio_is_tight(magnitudes: tuple[float, ...], inputs: list[tuple[float, ...]],
                                      epsilon: float) -> None:
    params = _TwoPairs(dimension=len(magnitudes) // 2, epsilon=epsilon)
    gauss = _CyclingGauss(magnitudes)
    dists = [_distribution(params, x, gauss) for x in inputs]
    support = set(dists[0])
    assert len(support) == (2 if params.dimension == 1 else 4)  # the two pairs {+-V_1, +-V_2} (in 1-D, +-1)
    for dist in dists:
        assert set(dist) == support
        for u in dist:
            assert tuple(-c for c in u) in dist  # type: ignore[attr-defined]
            assert abs(math.hypot(*u) - 1.0) < 1e-6  # type: ignore[misc]
    ratio = max_privacy_ratio(dists)
    assert ratio == params.ratio  # bound and tightness (e_1 against -e_1)
    assert params.realized_epsilon <= epsilon and epsilon - params.realized_epsilon < 1e-12
    if params.dimension == 1:
        return  # the members coincide in 1-D: outputs merge several members
    # a unit input always has x~ = x: its cap members come out with probability exactly p / j each
    first = dists[0]
    top = max(first.values())
    assert top == params.cap_probability / params.cap_size
    assert sum(1 for v in first.values() if v == top) == params.cap_size


def test_negative_control_is_caught() -> None:
    params = _Overconfident(dimension=3, epsilon=1.0)
    magnitudes, inputs = CASES[3]
    gauss = _CyclingGauss(magnitudes)
    assert max_privacy_ratio([_distribution(params, x, gauss) for x in inputs]) > params.ratio


def test_one_pair_is_the_l2_ball_randomizer() -> None:
    """With P = 1 the set is the l2-ball randomizer's pair {w, -w}: the same scale."""

    @dataclass(frozen=True, kw_only=True)
    class _OnePair(VectorPrivUnitParams):
        pairs: ClassVar[int] = 1

    for d in (1, 2, 3, 10, 300):
        for eps in (0.5, 2.0):
            assert math.isclose(_OnePair(dimension=d, epsilon=eps).scale,
                                VectorL2BallParams(dimension=d, epsilon=eps).scale, rel_tol=1e-10)


@pytest.mark.parametrize("dimension", [2, 3, 11, 50, 4096])
def test_cap_sums_match_an_independent_quadrature(dimension: int) -> None:
    """A_j against scipy's adaptive quadrature on the Beta law of |t| (to 1e-9 relative)."""
    stats = pytest.importorskip("scipy.stats")
    integrate = pytest.importorskip("scipy.integrate")
    a = (dimension - 1) / 2
    law = stats.beta(a, a, loc=-1, scale=2)
    sums, squares = cap_sums(dimension)
    scale = math.sqrt(1.0 / dimension)  # |t| concentrates at ~ 1 / sqrt(d)
    for j in (1, 4, 8, PAIRS):
        def f(s: float, j: int = j) -> float:
            return float(s * 2 * law.pdf(s) * PAIRS * stats.binom.sf(PAIRS - j - 1, PAIRS - 1, 2 * law.cdf(s) - 1))
        expected = integrate.quad(f, 0, 1, points=[scale, 3 * scale] if dimension > 50 else None,
                                  limit=400, epsabs=0, epsrel=1e-12)[0]
        assert math.isclose(sums[j - 1], expected, rel_tol=1e-9), (j, sums[j - 1], expected)
        expected_squares = integrate.quad(lambda s, f=f: s * f(s), 0, 1, limit=400, epsabs=0, epsrel=1e-12,
                                          points=[scale, 3 * scale] if dimension > 50 else None)[0]
        assert math.isclose(squares[j - 1], expected_squares, rel_tol=1e-9), (j, squares[j - 1], expected_squares)


def test_variance_is_below_the_l2_ball() -> None:
    for d in (2, 5, 11, 50):
        for eps in (1.0, 2.0, 4.0):
            assert VectorPrivUnitParams(dimension=d, epsilon=eps).scale < VectorL2BallParams(dimension=d, epsilon=eps).scale


def _z_for(checks: int) -> float:
    """Smallest z >= 5 with checks * P[|N(0,1)| > z] <= 1e-6 (Bonferroni over ``checks`` assertions)."""
    z = 5.0
    while checks * math.erfc(z / math.sqrt(2)) > FALSE_FAILURE_RATE:
        z += 0.01
    return z


@pytest.mark.parametrize("dimension,epsilon,n,seed", [(3, 1.0, 20_000, 8), (10, 2.0, 10_000, 9), (3, 4.0, 4_000, None)])
def test_estimate_is_unbiased(dimension: int, epsilon: float, n: int, seed: int | None) -> None:
    params = VectorPrivUnitParams(dimension=dimension, epsilon=epsilon)
    x = [0.5, -0.5, 0.25] if dimension == 3 else [0.3 * (-1) ** j for j in range(dimension)]
    rng = SeededRng(seed) if seed is not None else None  # None: one unseeded run (OS CSPRNG)
    sums = [0.0] * dimension
    squares = [0.0] * dimension
    for _ in range(n):
        for j, v in enumerate(params.estimate(params.randomize(x, rng=rng))):
            sums[j] += v
            squares[j] += v * v
    z = _z_for(2 * dimension)
    b2 = params.scale**2
    norm2 = sum(v * v for v in x)
    for j in range(dimension):
        assert_unbiased(sums[j] / n, x[j], math.sqrt(params.coordinate_variance(x[j]) / n), z=z)
        # E[(B w_j)^2] from the alignment s (x~_j^2 = x_j^2 / ||x||^2); (B w_j)^2 lies in [0, B^2]:
        # its variance is <= B^4 / 4
        assert_unbiased(squares[j] / n, params.second_moment(x[j] * x[j] / norm2), math.sqrt(b2 * b2 / 4 / n), z=z)
        assert params.second_moment(x[j] * x[j] / norm2) <= params.variance_bound


def test_reports_are_unit_vectors_and_survive_the_wire() -> None:
    for d in (1, 2, 10, 300):
        params = VectorPrivUnitParams(dimension=d, epsilon=2.0)
        rng = SeededRng(d)
        for k in range(50):
            x = [0.0] * d if k % 3 == 0 else [((-1) ** j) * 0.9 / math.sqrt(d) for j in range(d)]
            payload = params.randomize(x, rng=rng)
            assert abs(math.hypot(*payload.values) - 1.0) < 1e-6
            assert params.check_payload(payload_from_wire(payload_to_wire(payload))) == payload


def test_norm_slack_is_accepted_and_scaled() -> None:
    params = VectorPrivUnitParams(dimension=2, epsilon=1.0)
    params.randomize([1.0 + 5e-10, 0.0], rng=SeededRng(1))
    with pytest.raises(EncodingError, match="l2 norm <= 1"):
        params.randomize([1.0 + 1e-8, 0.0])


def test_wire_and_registry() -> None:
    params = VectorPrivUnitParams(dimension=4, epsilon=1.5)
    assert MECHANISMS.load(MECHANISMS.dump(params)) == params
    assert params.payload_bits == 128
    assert params.input_size == 4


def test_bad_parameters_and_values() -> None:
    with pytest.raises(InvalidParameterError, match=r"dimension must be in \[1, 4096\], got 0"):
        VectorPrivUnitParams(dimension=0, epsilon=1.0)
    with pytest.raises(InvalidParameterError, match="epsilon must be in"):
        VectorPrivUnitParams(dimension=2, epsilon=21.0)
    with pytest.raises(InvalidParameterError, match="epsilon must be at least"):
        VectorPrivUnitParams(dimension=2, epsilon=1e-15)
    params = VectorPrivUnitParams(dimension=2, epsilon=1.0)
    with pytest.raises(EncodingError, match="coordinate 1 must be finite, got inf"):
        params.randomize([0.5, float("inf")])
    with pytest.raises(ProtocolError, match="unit vector"):
        params.check_payload(Floats((0.5, 0.5)))
    with pytest.raises(ProtocolError, match="2 floats"):
        params.check_payload(Floats((1.0,)))
    with pytest.raises(ProtocolError):
        params.check_payload(Floats((float("nan"), 1.0)))
    with pytest.raises(ProtocolError):
        params.estimate(b"\x00")


#: (d, epsilon) -> (cap size j, scale B): the derived constants docs/protocol.md §5 requires of every
#: implementation (B to 1e-9 relative, the quadrature's accuracy).
VECTORS = [
    (1, 1.0, 16, 2.1639534137386653),
    (2, 0.5, 15, 6.372762825902583),
    (3, 1.0, 12, 4.131708956642131),
    (11, 1.0, 12, 8.287694527393159),
    (11, 2.0, 8, 4.276910822148552),
    (50, 4.0, 2, 4.9493579283866005),
    (4096, 1.0, 11, 162.947018860578),
]


@pytest.mark.parametrize("dimension,epsilon,cap,scale", VECTORS)
def test_derived_constants_match_the_pinned_vectors(dimension: int, epsilon: float, cap: int, scale: float) -> None:
    params = VectorPrivUnitParams(dimension=dimension, epsilon=epsilon)
    assert params.cap_size == cap
    assert math.isclose(params.scale, scale, rel_tol=1e-9)
    r, m = params.ratio, params.members
    assert params.cap_probability == r * cap / (r * cap + m - cap)
