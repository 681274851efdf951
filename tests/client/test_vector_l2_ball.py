"""l2-ball vector randomizer: exact privacy ratio (bound and tightness) by enumeration, negative
control, hemisphere fit, unbiasedness of B w, the unit-norm invariant.

The Gaussian magnitudes are continuous, so the enumeration fixes them (``fixed_gauss``); every
other draw of the real code is enumerated: the rounding coin of x~, the fair sign coin of the
direction sampler and the hemisphere coin. The ratio argument needs nothing else: given the pair
{w, -w}, the output distribution is decided by those coins alone.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import cast

import pytest

from ldp_client.errors import EncodingError, InvalidParameterError, ProtocolError
from ldp_client.mechanisms import MECHANISMS, VectorL2BallParams
from ldp_client.payload import Floats, payload_from_wire, payload_to_wire
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


class _FixedGauss:
    """Replays a fixed list of Gaussian values, from the start on every enumerated path."""

    def __init__(self, values: Sequence[float]) -> None:
        self.values = list(values)
        self.i = 0

    def reset(self) -> None:
        self.i = 0

    def __call__(self) -> float:
        v = self.values[self.i % len(self.values)]
        self.i += 1
        return v


def _distribution(params: VectorL2BallParams, x: Sequence[float], gauss: _FixedGauss) -> dict[Hashable, Fraction]:
    def run(rng: EnumeratingRng) -> Hashable:
        gauss.reset()  # x = 0 draws x~ from the same magnitudes: one pair {u, -u} for every input
        return params.randomize(list(x), rng=rng).values

    return output_distribution(run, fixed_gauss=gauss)


# (magnitudes, inputs): each input list has e_1 and -e_1 (tightness), 0, interior points and,
# in dimension 2, a point orthogonal to the direction (an exact float tie, settled by the pair rule).
CASES: list[tuple[tuple[float, ...], list[tuple[float, ...]]]] = [
    ((0.7,), [(1.0,), (-1.0,), (0.0,), (0.3,), (-0.75,)]),
    ((1.0, 1.0), [(1.0, 0.0), (-1.0, 0.0), (0.0, 0.0), (0.5, -0.5), (-0.5, 0.5), (0.3, -0.4), (0.6, 0.8)]),
    ((0.7, -1.3), [(1.0, 0.0), (-1.0, 0.0), (0.0, 0.0), (0.0, 1.0), (0.25, 0.5)]),
    ((0.7, -1.3, 0.2), [(1.0, 0.0, 0.0), (-1.0, 0.0, 0.0), (0.0, 0.0, 0.0), (0.2, -0.3, 0.5), (0.0, 0.6, -0.8)]),
]


@pytest.mark.parametrize("magnitudes,inputs", CASES)
@pytest.mark.parametrize("epsilon", [0.1, 1.0, math.log(9), 5.0])
def test_exact_privacy_ratio_is_tight(magnitudes: tuple[float, ...], inputs: list[tuple[float, ...]],
                                      epsilon: float) -> None:
    params = VectorL2BallParams(dimension=len(magnitudes), epsilon=epsilon)
    gauss = _FixedGauss(magnitudes)
    dists = [_distribution(params, x, gauss) for x in inputs]
    for dist in dists:
        assert len(dist) == 2  # the pair {u, -u}
        u, v = (cast(tuple[float, ...], w) for w in dist)
        assert tuple(-c for c in u) == v  # exactly sign-symmetric outputs
        assert abs(math.hypot(*u) - 1.0) < 1e-6
    ratio = max_privacy_ratio(dists)
    assert ratio == params.ratio  # bound and tightness (e_1 against -e_1)
    assert params.realized_epsilon <= epsilon and epsilon - params.realized_epsilon < 1e-12
    # a unit input always has x~ = x, so the near member comes out with probability exactly pi
    near = dists[0]
    first = max(near, key=lambda w: w[0])  # type: ignore[index]
    assert near[first] == params.near_probability


def test_tie_is_settled_by_the_pair_alone() -> None:
    """x orthogonal to w gives a float dot product of exactly 0; both x and -x then see the same split."""
    params = VectorL2BallParams(dimension=2, epsilon=1.0)
    gauss = _FixedGauss((1.0, 1.0))
    a = _distribution(params, (0.5, -0.5), gauss)
    b = _distribution(params, (-0.5, 0.5), gauss)
    assert a == b
    positive_first = max(a, key=lambda w: w[0])  # type: ignore[index]
    assert a[positive_first] == params.near_probability


@dataclass(frozen=True, kw_only=True)
class _Overconfident(VectorL2BallParams):
    """Negative control: the hemisphere coin is calibrated for 2 * epsilon."""

    @cached_property
    def near_probability(self) -> Fraction:
        r = self.ratio**2
        return r / (r + 1)


def test_negative_control_is_caught() -> None:
    params = _Overconfident(dimension=3, epsilon=1.0)
    magnitudes, inputs = CASES[3]
    gauss = _FixedGauss(magnitudes)
    assert max_privacy_ratio([_distribution(params, x, gauss) for x in inputs]) > params.ratio


def test_scale_closed_forms() -> None:
    one = VectorL2BallParams(dimension=1, epsilon=1.0)
    r = one.ratio
    assert math.isclose(one.scale, float((r + 1) / (r - 1)), rel_tol=1e-14)
    two = VectorL2BallParams(dimension=2, epsilon=1.0)
    assert math.isclose(two.scale, float((r + 1) / (r - 1)) * math.pi / 2, rel_tol=1e-14)
    big = VectorL2BallParams(dimension=4096, epsilon=1.0)
    assert math.isclose(big.scale, float((r + 1) / (r - 1)) * math.sqrt(math.pi * 4096 / 2), rel_tol=1e-3)


@pytest.mark.parametrize("x", [(1.0, 0.0), (0.6, -0.3)])
def test_hemisphere_and_angles_fit(x: tuple[float, float]) -> None:
    """In dimension 2 the reported angle is uniform on each half-circle around +-x~, with the coin's weights."""
    params = VectorL2BallParams(dimension=2, epsilon=1.0)
    pi = params.near_probability
    norm = Fraction(math.hypot(*x))
    toward = (1 + norm) / 2
    near_mass = toward * pi + (1 - toward) * (1 - pi)  # P[<w, x> > 0]
    bins = 8
    exact: dict[Hashable, float] = {k: float((near_mass if k in (2, 3, 4, 5) else 1 - near_mass) / 4) for k in range(bins)}
    base = math.atan2(x[1], x[0])
    rng = SeededRng(21)
    samples = []
    for _ in range(20_000):
        w = params.randomize(list(x), rng=rng).values
        angle = (math.atan2(w[1], w[0]) - base + math.pi) % (2 * math.pi)  # 0 at -x, pi at x
        samples.append(min(bins - 1, int(angle / (2 * math.pi) * bins)))
    assert_chi2_fits(samples, exact)


@pytest.mark.parametrize("dimension,n,seed", [(3, 20_000, 8), (10, 10_000, 9), (3, 4_000, None)])
def test_estimate_is_unbiased(dimension: int, n: int, seed: int | None) -> None:
    params = VectorL2BallParams(dimension=dimension, epsilon=1.0)
    if dimension == 3:
        x = [0.5, -0.5, 0.25]
    else:
        x = [0.3 * (-1) ** j for j in range(dimension)]
    rng = SeededRng(seed) if seed is not None else None  # None: one unseeded run (OS CSPRNG)
    sums = [0.0] * dimension
    squares = [0.0] * dimension
    for _ in range(n):
        for j, v in enumerate(params.estimate(params.randomize(x, rng=rng))):
            sums[j] += v
            squares[j] += v * v
    z = _z_for(2 * dimension)
    b2 = params.scale**2
    for j in range(dimension):
        assert_unbiased(sums[j] / n, x[j], math.sqrt(params.coordinate_variance(x[j]) / n), z=z)
        # E[(B w_j)^2] = B^2 / d exactly; (B w_j)^2 lies in [0, B^2], so its variance is <= B^4 / 4
        assert_unbiased(squares[j] / n, params.variance_bound, math.sqrt(b2 * b2 / 4 / n), z=z)


def test_reports_are_unit_vectors_and_survive_the_wire() -> None:
    for d in (1, 2, 10, 300):
        params = VectorL2BallParams(dimension=d, epsilon=2.0)
        rng = SeededRng(d)
        for k in range(200):
            x = [0.0] * d if k % 3 == 0 else [((-1) ** j) * 0.9 / math.sqrt(d) for j in range(d)]
            payload = params.randomize(x, rng=rng)
            assert abs(math.hypot(*payload.values) - 1.0) < 1e-6
            assert params.check_payload(payload_from_wire(payload_to_wire(payload))) == payload


def test_norm_slack_is_accepted_and_scaled() -> None:
    params = VectorL2BallParams(dimension=2, epsilon=1.0)
    params.randomize([1.0 + 5e-10, 0.0], rng=SeededRng(1))
    with pytest.raises(EncodingError, match="l2 norm <= 1"):
        params.randomize([1.0 + 1e-8, 0.0])


def test_wire_and_registry() -> None:
    params = VectorL2BallParams(dimension=4, epsilon=1.5)
    assert MECHANISMS.load(MECHANISMS.dump(params)) == params
    assert params.payload_bits == 128
    assert params.input_size == 4


def test_bad_parameters_and_values() -> None:
    with pytest.raises(InvalidParameterError, match=r"dimension must be in \[1, 4096\], got 0"):
        VectorL2BallParams(dimension=0, epsilon=1.0)
    with pytest.raises(InvalidParameterError, match="epsilon must be in"):
        VectorL2BallParams(dimension=2, epsilon=21.0)
    with pytest.raises(InvalidParameterError, match="epsilon must be at least"):
        VectorL2BallParams(dimension=2, epsilon=1e-15)
    with pytest.raises(TypeError, match="dimension must be an int"):
        VectorL2BallParams(dimension=2.0, epsilon=1.0)  # type: ignore[arg-type]
    params = VectorL2BallParams(dimension=2, epsilon=1.0)
    with pytest.raises(EncodingError, match="coordinate 1 must be finite, got inf"):
        params.randomize([0.5, float("inf")])
    with pytest.raises(EncodingError, match="must have dimension 2, got 1"):
        params.randomize([0.5])
    with pytest.raises(TypeError, match="must be a list or tuple"):
        params.randomize({0.5, 0.1})
    with pytest.raises(ProtocolError, match="unit vector"):
        params.check_payload(Floats((0.5, 0.5)))
    with pytest.raises(ProtocolError, match="2 floats"):
        params.check_payload(Floats((1.0,)))
    with pytest.raises(ProtocolError):
        params.check_payload(Floats((float("nan"), 1.0)))
    with pytest.raises(ProtocolError):
        params.estimate(b"\x00")
    with pytest.raises(ProtocolError):
        VectorL2BallParams.from_dict({"dimension": -1, "epsilon": 1.0})
