"""Bitwise randomized response: exact privacy over pairs within the sensitivity (ratio and tightness),
negative control, goodness of fit, unbiased debiasing, payload shape, validation and serde."""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from statistics import NormalDist

import pytest

from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import MECHANISMS, BitwiseRRParams
from ldp_client.payload import pack_bits, unpack_bits
from ldp_client.rng import Rng, SeededRng
from support.exact import max_privacy_ratio, output_distribution
from support.stats import FALSE_FAILURE_RATE, Z_UNBIASED, assert_chi2_fits, assert_unbiased


def _z(tests: int) -> float:
    """Bonferroni: ``tests`` simultaneous 2-sided checks with a total false-failure rate <= 1e-6."""
    return max(Z_UNBIASED, NormalDist().inv_cdf(1 - FALSE_FAILURE_RATE / (2 * tests)))


def _vectors(length: int) -> list[tuple[int, ...]]:
    return list(itertools.product((0, 1), repeat=length))


def _hamming(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return sum(x != y for x, y in zip(a, b))


def _dists(params: BitwiseRRParams) -> dict[tuple[int, ...], dict[Hashable, Fraction]]:
    def dist(x: tuple[int, ...]) -> dict[Hashable, Fraction]:
        return output_distribution(lambda rng: params.randomize(x, rng=rng))

    return {x: dist(x) for x in _vectors(params.length)}


def _max_ratio_within(dists: dict[tuple[int, ...], dict[Hashable, Fraction]], distance: int) -> Fraction:
    """max over pairs x, x' at Hamming distance <= ``distance`` and outputs y of P[y | x] / P[y | x']."""
    return max(max_privacy_ratio([dists[a], dists[b]])
               for a, b in itertools.combinations(dists, 2) if _hamming(a, b) <= distance)


# --- exact privacy -----------------------------------------------------------------------------

@pytest.mark.parametrize("length,sensitivity,epsilon", [
    (4, 2, 1.0), (4, 4, 1.0), (4, 2, 7.5), (3, 1, 0.1), (3, 3, math.log(9)), (2, 2, 20.0)])
def test_exact_privacy_ratio_is_tight(length: int, sensitivity: int, epsilon: float) -> None:
    params = BitwiseRRParams(length=length, epsilon=epsilon, sensitivity=sensitivity)
    dists = _dists(params)
    ratio = _max_ratio_within(dists, sensitivity)
    assert ratio == params.ratio == params.r_b**sensitivity  # tight
    assert ratio <= Fraction(math.exp(epsilon))
    assert params.realized_epsilon <= epsilon
    assert epsilon - params.realized_epsilon < 1e-12
    # Vectors farther apart than the sensitivity are not covered (the encoder must guarantee it).
    if sensitivity < length:
        assert _max_ratio_within(dists, length) == params.r_b**length > params.ratio


def test_ln9_passes_and_ln8_999_fails() -> None:
    params = BitwiseRRParams(length=3, epsilon=math.log(9), sensitivity=2)
    ratio = _max_ratio_within(_dists(params), 2)
    assert math.log(ratio) <= math.log(9)
    assert math.log(ratio) > math.log(8.999)


@dataclass(frozen=True, kw_only=True)
class _UnderFlippingRR(BitwiseRRParams):
    """Negative control: flips calibrated for epsilon / 1 instead of epsilon / sensitivity."""

    @cached_property
    def p_flip_exact(self) -> Fraction:
        return 1 / (1 + self.r_b**self.sensitivity)


@pytest.mark.parametrize("sensitivity", [2, 4])
def test_negative_control_is_caught(sensitivity: int) -> None:
    epsilon = 1.0
    params = _UnderFlippingRR(length=4, epsilon=epsilon, sensitivity=sensitivity)
    ratio = _max_ratio_within(_dists(params), sensitivity)
    assert ratio > params.ratio
    assert ratio > Fraction(math.exp(epsilon))


# --- statistics --------------------------------------------------------------------------------

def test_reports_fit_exact_distribution() -> None:
    params = BitwiseRRParams(length=4, epsilon=2.0, sensitivity=2)
    x = (1, 0, 1, 1)
    exact = output_distribution(lambda r: params.randomize(x, rng=r))
    assert exact == {
        pack_bits(y): params.p_keep_exact ** (4 - _hamming(x, y)) * params.p_flip_exact ** _hamming(x, y)
        for y in _vectors(4)}
    rng = SeededRng(1234)
    assert_chi2_fits([params.randomize(x, rng=rng) for _ in range(20_000)], exact)


@pytest.mark.parametrize("seeded", [True, False])
def test_debiased_bit_counts_are_unbiased(seeded: bool) -> None:
    length = 12
    params = BitwiseRRParams(length=length, epsilon=2.0, sensitivity=4)
    truth_rng = SeededRng(7)
    truth = [tuple(int(truth_rng.bernoulli(1 + i, 16)) for i in range(length)) for _ in range(4000)]
    rng: Rng | None = SeededRng(99) if seeded else None
    reports = [unpack_bits(params.randomize(list(x), rng=rng), length) for x in truth]
    n = len(reports)
    z = _z(length)
    for i in range(length):
        estimate = sum((y[i] - params.debias_offset) * params.debias_scale for y in reports)
        true_count = sum(x[i] for x in truth)
        assert_unbiased(estimate, true_count, math.sqrt(params.count_variance(n, true_count)), z=z)


def test_debiasing_constants() -> None:
    params = BitwiseRRParams(length=8, epsilon=3.0, sensitivity=3)
    assert params.p_keep_exact + params.p_flip_exact == 1
    assert params.p_keep_exact / params.p_flip_exact == params.r_b <= Fraction(math.exp(1.0))
    assert math.isclose(params.debias_scale * (params.p_keep - params.p_flip), 1.0, rel_tol=1e-12)
    assert params.debias_offset == params.p_flip
    pk, pf = params.p_keep, params.p_flip
    assert math.isclose(params.bit_variance, pk * pf / (pk - pf) ** 2, rel_tol=1e-12)
    # one report's debiased bit: E = x, Var the same for x = 0 and x = 1
    for x in (0, 1):
        p1 = pk if x else pf
        mean = ((1 - params.debias_offset) * p1 + (0 - params.debias_offset) * (1 - p1)) * params.debias_scale
        assert math.isclose(mean, x, abs_tol=1e-12)
        assert math.isclose(p1 * (1 - p1) * params.debias_scale**2, params.bit_variance, rel_tol=1e-12)
    assert math.isclose(params.realized_epsilon, 3 * math.log(params.r_b), rel_tol=1e-12)


# --- payload, validation, serde ----------------------------------------------------------------

def test_payload_shape_and_check() -> None:
    params = BitwiseRRParams(length=11, epsilon=1.0, sensitivity=3)
    rng = SeededRng(3)
    for _ in range(200):
        y = params.randomize([1] * 11, rng=rng)
        assert isinstance(y, bytes) and len(y) == 2 and y[1] >> 3 == 0
        assert params.check_payload(y) == y
    assert params.randomize((True, False) * 5 + (True,), rng=rng) is not None
    assert params.payload_bits == 11 and params.input_size == 11
    with pytest.raises(ProtocolError, match="2 bytes"):
        params.check_payload(b"\x00\x00\x00")
    with pytest.raises(ProtocolError, match="beyond length 11"):
        params.check_payload(b"\x00\x08")
    with pytest.raises(ProtocolError):
        params.check_payload([0] * 11)
    long = BitwiseRRParams(length=2000, epsilon=1.0, sensitivity=10)
    assert long.check_payload(long.randomize([0, 1] * 1000, rng=rng)) is not None


def test_bad_parameters_and_values() -> None:
    with pytest.raises(InvalidParameterError, match="epsilon must be in"):
        BitwiseRRParams(length=4, epsilon=0.0, sensitivity=1)
    with pytest.raises(InvalidParameterError, match="epsilon must be finite"):
        BitwiseRRParams(length=4, epsilon=float("nan"), sensitivity=1)
    with pytest.raises(InvalidParameterError, match=r"length must be in \[1, 1048576\], got 0"):
        BitwiseRRParams(length=0, epsilon=1.0, sensitivity=1)
    with pytest.raises(InvalidParameterError, match=r"sensitivity must be in \[1, 4\], got 5"):
        BitwiseRRParams(length=4, epsilon=1.0, sensitivity=5)
    with pytest.raises(InvalidParameterError, match=r"sensitivity must be in \[1, 4\], got 0"):
        BitwiseRRParams(length=4, epsilon=1.0, sensitivity=0)
    with pytest.raises(TypeError, match="sensitivity must be an int"):
        BitwiseRRParams(length=4, epsilon=1.0, sensitivity=2.0)  # type: ignore[arg-type]
    params = BitwiseRRParams(length=4, epsilon=1.0, sensitivity=2)
    with pytest.raises(InvalidParameterError, match="bitwise_rr value must have length 4, got 3"):
        params.randomize([0, 1, 0])
    with pytest.raises(InvalidParameterError, match=r"bits must be in \[0, 1\], got 2 at position 1"):
        params.randomize([0, 2, 0, 1])
    with pytest.raises(TypeError, match="bits must be 0/1 ints, got float at position 3"):
        params.randomize([0, 1, 0, 1.0])
    with pytest.raises(TypeError, match="bits must be 0/1 ints, got str"):
        params.randomize(["0", "1", "0", "1"])
    for bad in ("0101", b"\x05", 5, None, {0, 1}):
        with pytest.raises(TypeError, match="bitwise_rr value must be a sequence"):
            params.randomize(bad)


def test_from_dict_round_trip() -> None:
    params = BitwiseRRParams(length=40, epsilon=2.5, sensitivity=6)
    data = params.to_dict()
    assert data == {"length": 40, "epsilon": 2.5, "sensitivity": 6}
    assert BitwiseRRParams.from_dict(data) == params
    assert MECHANISMS.load(MECHANISMS.dump(params)) == params
    with pytest.raises(ProtocolError):
        BitwiseRRParams.from_dict({"length": 4, "epsilon": 1.0, "sensitivity": 9})
    with pytest.raises(ProtocolError):
        BitwiseRRParams.from_dict({"length": 4, "epsilon": 1.0})


def test_matches_the_proto_message() -> None:
    mechanisms_pb2 = pytest.importorskip("ldp.v1.mechanisms_pb2")
    fields = [f.name for f in mechanisms_pb2.BitwiseRandomizedResponse.DESCRIPTOR.fields]
    assert fields == ["length", "epsilon", "sensitivity"]
    assert BitwiseRRParams.KIND in mechanisms_pb2.MechanismSpec.DESCRIPTOR.fields_by_name
