"""Automatic frequency-oracle choice: variance ranking, the GRR / unary / hashing regimes, bandwidth caps."""

from __future__ import annotations

import math

import pytest

from ldp_client.errors import InvalidParameterError
from ldp_client.mechanisms import (
    MECHANISMS,
    GRRParams,
    LocalHashingParams,
    UnaryEncodingParams,
    UnaryVariant,
    choose_frequency_oracle,
    oue,
    sue,
)
from ldp_client.mechanisms.oracle_choice import _preference_key, frequency_oracle_candidates


@pytest.mark.parametrize("domain_size,epsilon", [(2, 0.5), (4, 1.0), (8, 1.0), (8, 4.0), (64, 4.0), (16, 2.0)])
def test_small_domains_or_large_epsilon_pick_grr(domain_size: int, epsilon: float) -> None:
    assert domain_size < 3 * math.exp(epsilon) + 2
    assert choose_frequency_oracle(domain_size, epsilon) == GRRParams(domain_size=domain_size, epsilon=epsilon)


@pytest.mark.parametrize("domain_size,epsilon", [(40, 2.0), (1024, 1.0), (1024, 4.0), (2**20, 0.5)])
def test_large_domains_pick_oue(domain_size: int, epsilon: float) -> None:
    assert domain_size > 3 * math.exp(epsilon) + 2
    assert choose_frequency_oracle(domain_size, epsilon) == oue(domain_size, epsilon)


@pytest.mark.parametrize("domain_size,epsilon", [(2**20 + 1, 1.0), (2**40, 2.0), (2**63, 8.0)])
def test_domains_too_large_for_unary_pick_olh(domain_size: int, epsilon: float) -> None:
    assert choose_frequency_oracle(domain_size, epsilon) == LocalHashingParams(domain_size=domain_size, epsilon=epsilon)


@pytest.mark.parametrize("domain_size", [2, 3, 10, 100, 1024, 5000, 2**20, 2**30])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0, 8.0])
@pytest.mark.parametrize("cap", [None, 1, 8, 12, 33, 34, 40, 64, 1024])
def test_choice_is_the_minimum_variance_among_what_fits(domain_size: int, epsilon: float, cap: int | None) -> None:
    candidates = frequency_oracle_candidates(domain_size, epsilon, cap)
    if not candidates:
        with pytest.raises(InvalidParameterError, match="no frequency oracle fits"):
            choose_frequency_oracle(domain_size, epsilon, cap)
        return
    chosen = choose_frequency_oracle(domain_size, epsilon, cap)
    assert cap is None or chosen.payload_bits <= cap
    best = min(c.count_variance(1, 0) for c in candidates)
    assert chosen.count_variance(1, 0) <= best * (1 + 1e-11)  # type: ignore[attr-defined]
    assert MECHANISMS.load(MECHANISMS.dump(chosen)) == chosen


def test_caps_are_respected() -> None:
    # D = 1024, eps = 4: OUE (1024 bits) unless capped; OLH with g = 56 takes 38 bits; GRR 10 bits.
    assert choose_frequency_oracle(1024, 4.0, max_payload_bits=1024) == oue(1024, 4.0)
    olh = choose_frequency_oracle(1024, 4.0, max_payload_bits=1023)
    assert olh == LocalHashingParams(domain_size=1024, epsilon=4.0) and olh.payload_bits == 38
    assert choose_frequency_oracle(1024, 4.0, max_payload_bits=38) == olh
    # 37 bits: OLH with g = 32 buckets still beats GRR; 33 bits (g = 2) does not.
    assert choose_frequency_oracle(1024, 4.0, max_payload_bits=37) == LocalHashingParams(
        domain_size=1024, epsilon=4.0, hash_range=32)
    assert choose_frequency_oracle(1024, 4.0, max_payload_bits=33) == GRRParams(domain_size=1024, epsilon=4.0)
    assert choose_frequency_oracle(1024, 4.0, max_payload_bits=10) == GRRParams(domain_size=1024, epsilon=4.0)
    with pytest.raises(InvalidParameterError,
                       match=r"no frequency oracle fits max_payload_bits=9 for domain_size 1024: .* needs 10 bits"):
        choose_frequency_oracle(1024, 4.0, max_payload_bits=9)


def test_olh_with_fewer_buckets_when_the_optimal_g_does_not_fit() -> None:
    # D = 2^40: GRR is hopeless; with 34 bits OLH can still afford g = 4 (optimal would be 56).
    chosen = choose_frequency_oracle(2**40, 4.0, max_payload_bits=34)
    assert chosen == LocalHashingParams(domain_size=2**40, epsilon=4.0, hash_range=4)
    assert chosen.payload_bits == 34


def test_ties_prefer_the_smaller_payload() -> None:
    small, large = oue(8, 1.0), oue(64, 1.0)  # OUE's variance does not depend on the domain size
    assert small.count_variance(1, 0) == large.count_variance(1, 0)
    assert min([large, small], key=_preference_key) is small
    assert min([small, large], key=_preference_key) is small
    # equal to 12 significant digits counts as a tie
    assert _preference_key(small)[0] == _preference_key(large)[0]


def test_candidates() -> None:
    kinds = {(type(c), getattr(c, "variant", None)) for c in frequency_oracle_candidates(100, 1.0)}
    assert kinds == {(GRRParams, None), (UnaryEncodingParams, UnaryVariant.OPTIMIZED),
                     (UnaryEncodingParams, UnaryVariant.SYMMETRIC), (LocalHashingParams, None)}
    assert all(not isinstance(c, UnaryEncodingParams) for c in frequency_oracle_candidates(2**21, 1.0))
    assert sue(100, 1.0).count_variance(1, 0) > oue(100, 1.0).count_variance(1, 0)


def test_bad_arguments() -> None:
    with pytest.raises(InvalidParameterError, match="domain_size must be in"):
        choose_frequency_oracle(1, 1.0)
    with pytest.raises(InvalidParameterError, match="epsilon must be in"):
        choose_frequency_oracle(10, 0.0)
    with pytest.raises(InvalidParameterError, match="epsilon must be finite"):
        choose_frequency_oracle(10, float("nan"))
    with pytest.raises(InvalidParameterError, match="max_payload_bits must be in"):
        choose_frequency_oracle(10, 1.0, max_payload_bits=0)
    with pytest.raises(TypeError, match="max_payload_bits must be an int"):
        choose_frequency_oracle(10, 1.0, max_payload_bits=8.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="domain_size must be an int"):
        choose_frequency_oracle(10.0, 1.0)  # type: ignore[arg-type]
