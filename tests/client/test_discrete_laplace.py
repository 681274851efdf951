"""Grid discrete Laplace: exact privacy exponent (bound and tightness), negative control, fit, unbiasedness.

The noise probabilities involve exp, so the ratio is checked through the exact pmf structure:
P[y | z] is proportional to exp(-|y - z| / scale) with a normalizer that does not depend on z, so
ln(P[y | z] / P[y | z']) = sum_j (|y_j - z'_j| - |y_j - z_j|) / scale, computed in Fractions from
the real code's grid points and scale. That the sampler realizes this pmf is checked by a
chi-square fit here and, for the sampler itself, in ``test_exact.py``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

import pytest

from ldp_client._exact import discrete_laplace
from ldp_client.errors import EncodingError, InvalidParameterError, ProtocolError
from ldp_client.mechanisms import MECHANISMS, DiscreteLaplaceParams
from ldp_client.payload import Integers, payload_from_wire, payload_to_wire
from ldp_client.rng import SeededRng
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


def _grid_points(params: DiscreteLaplaceParams) -> set[int]:
    """Every grid coordinate the real rounding produces, from a fine sweep of [0, 1] incl. the ties."""
    n = params.grid_size
    xs = {k / (8 * n) for k in range(8 * n + 1)} | {0.0, 1.0, math.nextafter(1.0, 0.0), 5e-324}
    return {z for x in xs for z in params.round_to_grid([x] * params.dimension)}


def _max_exponent(params: DiscreteLaplaceParams) -> Fraction:
    """max over grid points z, z' and outputs y of (|y - z'| - |y - z|) / scale, one coordinate."""
    grid = sorted(_grid_points(params))
    n = params.grid_size
    window = range(-3 * n - 2, 4 * n + 3)
    scale = params.scale
    return max(Fraction(abs(y - zp) - abs(y - z)) / scale for z in grid for zp in grid for y in window)


@pytest.mark.parametrize("dimension", [1, 2, 3])
@pytest.mark.parametrize("grid_bits", [0, 1, 3])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, math.log(9), 7.5])
def test_exact_privacy_exponent_is_tight(dimension: int, grid_bits: int, epsilon: float) -> None:
    params = DiscreteLaplaceParams(dimension=dimension, epsilon=epsilon, grid_bits=grid_bits)
    grid = _grid_points(params)
    assert grid == set(range(params.grid_size + 1))  # rounding after clamping stays on {0..N}
    per_coordinate = _max_exponent(params)
    assert per_coordinate == Fraction(epsilon) / dimension  # bound and tightness, exactly
    assert params.realized_epsilon == epsilon


@pytest.mark.parametrize("dimension,grid_bits", [(2, 1), (3, 0)])
def test_vector_exponent_is_epsilon(dimension: int, grid_bits: int) -> None:
    """The whole vector: max over z, z', y of the summed exponent is exactly epsilon."""
    epsilon = 0.75
    params = DiscreteLaplaceParams(dimension=dimension, epsilon=epsilon, grid_bits=grid_bits)
    n = params.grid_size
    coords = range(n + 1)
    window = range(-2, n + 3)
    best = max(
        sum(Fraction(abs(yj - zpj) - abs(yj - zj)) for yj, zj, zpj in zip(y, z, zp)) / params.scale
        for z in itertools.product(coords, repeat=dimension)
        for zp in itertools.product(coords, repeat=dimension)
        for y in itertools.product(window, repeat=dimension)
    )
    assert best == Fraction(epsilon)


@dataclass(frozen=True, kw_only=True)
class _HalfSensitivity(DiscreteLaplaceParams):
    """Negative control: calibrates the noise to 2^(grid_bits - 1), half the real range."""

    @cached_property
    def scale(self) -> Fraction:
        return Fraction(self.dimension * self.grid_size, 2) / Fraction(self.epsilon)


def test_negative_control_is_caught() -> None:
    params = _HalfSensitivity(dimension=2, epsilon=1.0, grid_bits=3)
    assert _max_exponent(params) > Fraction(params.epsilon) / params.dimension


def test_randomize_is_grid_point_plus_exact_noise() -> None:
    """The real randomize adds discrete_laplace(params.scale) to round_to_grid(x), draw for draw."""
    params = DiscreteLaplaceParams(dimension=4, epsilon=2.0, grid_bits=5)
    x = [0.0, 0.3, 0.515625, 1.0]
    grid = params.round_to_grid(x)
    assert grid == [0, 10, 16, 32]  # 0.3 * 32 = 9.6 -> 10; 16.5 -> 16 (ties to even)
    for seed in range(20):
        noisy = params.randomize(x, rng=SeededRng(seed))
        rng = SeededRng(seed)
        assert list(noisy.values) == [z + discrete_laplace(params.scale, rng) for z in grid]


@pytest.mark.parametrize("dimension,epsilon,grid_bits,x", [(1, 4.0, 1, 0.5), (2, 2.0, 2, 0.75)])
def test_reports_fit_exact_distribution(dimension: int, epsilon: float, grid_bits: int, x: float) -> None:
    params = DiscreteLaplaceParams(dimension=dimension, epsilon=epsilon, grid_bits=grid_bits)
    z = params.round_to_grid([x] * dimension)[0]
    a = math.exp(-1 / float(params.scale))
    exact: dict[Hashable, float] = {y: (1 - a) / (1 + a) * a ** abs(y - z) for y in range(z - 200, z + 201)}
    rng = SeededRng(77)
    samples = [params.randomize([x] * dimension, rng=rng).values[0] for _ in range(20_000)]
    assert_chi2_fits(samples, exact)


def test_noise_variance_matches_the_pmf() -> None:
    params = DiscreteLaplaceParams(dimension=3, epsilon=1.0, grid_bits=4)
    a = params.noise_decay
    k_max = int(60 * float(params.scale))
    direct = math.fsum(2 * k * k * (1 - a) / (1 + a) * a**k for k in range(1, k_max))
    assert math.isclose(params.noise_variance, direct / params.grid_size**2, rel_tol=1e-9)
    assert math.isclose(params.noise_variance, 2 * 3**2 / 1.0**2, rel_tol=1e-2)  # ~ 2 d^2 / eps^2


@pytest.mark.parametrize("seed,n", [(3, 20_000), (None, 5_000)])  # None: one unseeded run (OS CSPRNG)
def test_decode_is_unbiased(seed: int | None, n: int) -> None:
    params = DiscreteLaplaceParams(dimension=3, epsilon=1.0, grid_bits=4)
    x = [0.0, 0.40625, 1.0]  # on the grid: z / N = x
    rng = SeededRng(seed) if seed is not None else None
    sums = [0.0] * 3
    sq = [0.0] * 3
    for _ in range(n):
        est = params.decode(params.randomize(x, rng=rng))
        for j, v in enumerate(est):
            sums[j] += v
            sq[j] += v * v
    z = _z_for(6)
    var = params.noise_variance
    for j in range(3):
        mean = sums[j] / n
        assert_unbiased(mean, x[j], math.sqrt(var / n), z=z)
        # sample variance: Var[s^2] ~ (mu4 - var^2) / n = 5 var^2 / n for Laplace-like noise
        sample_var = sq[j] / n - mean * mean
        assert_unbiased(sample_var, var, math.sqrt(5 * var * var / n), z=z)


def test_wire_round_trip_and_registry() -> None:
    params = DiscreteLaplaceParams(dimension=3, epsilon=1.0)
    assert params.grid_bits == 10
    payload = params.randomize([0.1, 0.2, 0.3], rng=SeededRng(1))
    again = params.check_payload(payload_from_wire(payload_to_wire(payload)))
    assert again == payload
    assert MECHANISMS.load(MECHANISMS.dump(params)) == params
    assert params.payload_bits > 3 * 10


def test_bad_parameters_and_values() -> None:
    with pytest.raises(InvalidParameterError, match=r"grid_bits must be in \[0, 30\], got 31"):
        DiscreteLaplaceParams(dimension=2, epsilon=1.0, grid_bits=31)
    with pytest.raises(InvalidParameterError, match=r"dimension must be in \[1, 4096\], got 0"):
        DiscreteLaplaceParams(dimension=0, epsilon=1.0)
    with pytest.raises(InvalidParameterError, match="epsilon must be in"):
        DiscreteLaplaceParams(dimension=2, epsilon=-1.0)
    with pytest.raises(TypeError, match="grid_bits must be an int"):
        DiscreteLaplaceParams(dimension=2, epsilon=1.0, grid_bits=2.0)  # type: ignore[arg-type]
    params = DiscreteLaplaceParams(dimension=2, epsilon=1.0)
    with pytest.raises(EncodingError, match=r"coordinate 1 must be in \[0, 1\], got 1.5"):
        params.randomize([0.5, 1.5])
    with pytest.raises(EncodingError, match="coordinate 0 must be finite, got nan"):
        params.randomize([float("nan"), 0.5])
    with pytest.raises(EncodingError, match="must have dimension 2, got 3"):
        params.randomize([0.5, 0.5, 0.5])
    with pytest.raises(TypeError, match="coordinate 0 must be a real number"):
        params.randomize(["0.5", 0.5])
    with pytest.raises(TypeError, match="must be a list or tuple"):
        params.randomize(0.5)
    with pytest.raises(ProtocolError):
        params.check_payload(Integers((1, 2, 3)))
    with pytest.raises(ProtocolError):
        params.check_payload((1, 2))
    with pytest.raises(ProtocolError):
        params.decode([1, True])
    with pytest.raises(ProtocolError):
        DiscreteLaplaceParams.from_dict({"dimension": 2, "epsilon": 1.0, "grid_bits": 99})
