"""Prefix-tree heavy hitters: the per-level server step, the Bonferroni threshold, and a Zipf run.

False failures: every randomized assertion below states its own probability of failing falsely;
each is at most 1e-6.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from numpy.typing import NDArray

from ldp_client.errors import InvalidParameterError
from ldp_client.mechanisms import GRRParams, LocalHashingParams
from ldp_collector.estimation import (
    FrequencyEstimate,
    HeavyHitterConfig,
    bonferroni_z,
    first_candidates,
    level_candidates,
    level_params,
    next_candidates,
    prefixes,
)
from ldp_collector.simulation.reports import find_heavy_hitters


def null_estimate(values: NDArray[np.int64], counts: NDArray[np.float64], sigma: float, n: int) -> FrequencyEstimate:
    se = np.full(values.size, sigma)
    return FrequencyEstimate(values=values, counts=counts, std_errors=se, n=n, confidence=0.95,
                             ci_lower=counts - 1.96 * se, ci_upper=counts + 1.96 * se, zero_std_error=sigma)


# -- configuration and tree layout ---------------------------------------------------------------


def test_config_levels_and_prefixes() -> None:
    cfg = HeavyHitterConfig(value_bits=10, bits_per_level=4, epsilon=2.0)
    assert cfg.levels == 3
    assert [cfg.prefix_bits(level) for level in (1, 2, 3)] == [4, 8, 10]
    values = np.array([0b1011001110, 0, 1023])
    assert prefixes(values, cfg, 1).tolist() == [0b1011, 0, 15]
    assert prefixes(values, cfg, 2).tolist() == [0b10110011, 0, 255]
    assert prefixes(values, cfg, 3).tolist() == values.tolist()
    np.testing.assert_array_equal(first_candidates(cfg), np.arange(16))
    children = level_candidates(cfg, 3, np.array([3, 200]))
    assert children.tolist() == [12, 13, 14, 15, 800, 801, 802, 803]
    with pytest.raises(InvalidParameterError, match=r"in \[0, 1024\)"):
        prefixes(np.array([1024]), cfg, 1)
    with pytest.raises(InvalidParameterError, match="needs the survivors"):
        level_candidates(cfg, 2, None)


@pytest.mark.parametrize("kwargs,match", [
    ({"value_bits": 0}, "value_bits"),
    ({"value_bits": 64}, "value_bits"),
    ({"bits_per_level": 17}, "bits_per_level"),
    ({"value_bits": 3, "bits_per_level": 4}, "bits_per_level"),
    ({"epsilon": 0.0}, "epsilon"),
    ({"false_positive_rate": 1.0}, "false_positive_rate"),
    ({"max_candidates": 0}, "max_candidates"),
])
def test_config_validation(kwargs: dict[str, float], match: str) -> None:
    base: dict[str, float] = {"value_bits": 32, "bits_per_level": 4, "epsilon": 1.0}
    with pytest.raises(InvalidParameterError, match=match):
        HeavyHitterConfig(**{**base, **kwargs})  # type: ignore[arg-type]


def test_level_oracles_come_from_the_sdk_chooser() -> None:
    cfg = HeavyHitterConfig(value_bits=32, bits_per_level=4, epsilon=4.0)
    assert isinstance(level_params(cfg, 1), GRRParams)  # 16 values < 3 e^4 + 2
    deep = level_params(cfg, 8)
    assert isinstance(deep, LocalHashingParams) and deep.domain_size == 2**32
    assert all(level_params(cfg, level).payload_bits <= cfg.max_payload_bits for level in range(1, 9))


def test_bonferroni_z() -> None:
    assert bonferroni_z(1, 0.05) == pytest.approx(1.959964, abs=1e-5)
    assert bonferroni_z(1000, 0.05) == pytest.approx(NormalDist().inv_cdf(1 - 0.05 / 2000))


# -- the per-level step --------------------------------------------------------------------------


def test_next_candidates_threshold_cap_order_and_rescaling() -> None:
    cfg = HeavyHitterConfig(value_bits=8, bits_per_level=2, epsilon=1.0, false_positive_rate=0.05, max_candidates=2)
    prev = np.array([1, 3])
    cands = level_candidates(cfg, 2, prev)  # 8 children
    sigma, n, share = 10.0, 1000, 0.25
    counts = np.zeros(8)
    counts[[1, 5, 6]] = [100.0, 300.0, 200.0]
    est = null_estimate(cands, counts, sigma, n)
    out = next_candidates(prev, est, config=cfg, level=2, group_share=share)
    z = NormalDist().inv_cdf(1 - 0.05 / 16)
    assert out.tested == 8 and out.z == pytest.approx(z) and out.threshold == pytest.approx(z * sigma)
    assert out.capped  # three passed, two kept: the largest first
    assert out.survivors.tolist() == [cands[5], cands[6]]
    np.testing.assert_allclose(out.counts, [300 / share, 200 / share])
    np.testing.assert_allclose(out.std_errors, np.sqrt(sigma**2 + np.array([300.0, 200.0]) * (1 - share)) / share)
    assert out.next_candidates.tolist() == level_candidates(cfg, 3, out.survivors).tolist()


def test_next_candidates_at_the_last_level_and_bad_calls() -> None:
    cfg = HeavyHitterConfig(value_bits=4, bits_per_level=2, epsilon=1.0)
    cands = level_candidates(cfg, 2, [2])
    out = next_candidates([2], null_estimate(cands, np.array([0.0, 500.0, 0.0, 0.0]), 10.0, 2000),
                          config=cfg, level=2, group_share=0.5)
    assert out.survivors.tolist() == [9] and out.next_candidates.size == 0
    with pytest.raises(InvalidParameterError, match="exactly the 4 children"):
        next_candidates([1], null_estimate(cands, np.zeros(4), 10.0, 2000), config=cfg, level=2, group_share=0.5)
    with pytest.raises(InvalidParameterError, match="group_share"):
        next_candidates([2], null_estimate(cands, np.zeros(4), 10.0, 2000), config=cfg, level=2, group_share=0.0)


def test_family_wise_false_positive_rate_is_as_stated() -> None:
    """Pure-null levels: the share of levels with any false positive matches Bonferroni's bound.

    With m = 1024 independent normal nulls and alpha = 0.2 the one-sided family-wise rate is
    1 - (1 - alpha / (2m))^m = 0.0952 (<= alpha / 2 = 0.1). Over 3000 levels the observed share has
    standard deviation 0.0054; the band 0.0952 +- 5.33 SD fails falsely with probability 1e-7 and
    would catch an uncorrected threshold (rate ~1) or a doubly conservative one (~0.049).
    """
    cfg = HeavyHitterConfig(value_bits=12, bits_per_level=2, epsilon=1.0, false_positive_rate=0.2,
                            max_candidates=256)
    prev = np.arange(256)
    cands = level_candidates(cfg, 5, prev)
    assert cands.size == 1024
    rng = np.random.default_rng(31)
    trials, sigma = 3000, 40.0
    noise = rng.normal(0.0, sigma, size=(trials, cands.size))
    any_fp = sum(next_candidates(prev, null_estimate(cands, row, sigma, 10_000), config=cfg, level=5,
                                 group_share=1 / 6).survivors.size > 0 for row in noise)
    expected = 1 - (1 - 0.2 / 2048) ** 1024
    sd = math.sqrt(expected * (1 - expected) / trials)
    assert abs(any_fp / trials - expected) <= 5.33 * sd, f"family-wise rate {any_fp / trials:.4f} vs {expected:.4f}"


# -- a Zipf population over 32-bit values --------------------------------------------------------


def test_zipf_heavy_hitters_are_found_without_false_positives() -> None:
    """N = 1e6 devices, 32-bit values, 4 bits per level (8 levels), epsilon 4.

    Budget of false failures (total 1e-6):

    * false positives: alpha = 8e-7, so P(a value nobody holds is reported) <= alpha / 2 = 4e-7;
    * misses (3e-7): a value held by c devices is in level group l about c s times (s = 1/8) and
      survives the level unless its estimate falls below tau_l = z_l sigma_l (z_l for the largest
      number of candidates the level can test); it is *detectable* when
      c s - tau_l >= k SE_l(c s) at every level, with k set so that P(miss) <= 3e-7 over all
      detectable values and levels (every prefix of a value is at least as heavy as the value);
    * counts (3e-7): every candidate of the last level is within z SE of its truth, Bonferroni over
      the largest number tested there.
    """
    rng = np.random.default_rng(2024)
    n_devices, distinct = 1_000_000, 100_000
    ids = rng.choice(2**32, size=distinct, replace=False)
    ranks = rng.zipf(1.1, size=3 * n_devices)
    ranks = ranks[ranks <= distinct][:n_devices]
    values = ids[ranks - 1]
    cfg = HeavyHitterConfig(value_bits=32, bits_per_level=4, epsilon=4.0, false_positive_rate=8e-7,
                            max_candidates=64)
    share = 1 / cfg.levels
    unique, true = np.unique(values, return_counts=True)
    truth = dict(zip(unique.tolist(), true.tolist()))

    def detectable(c: float, k: float) -> bool:
        n_level = n_devices * share * 1.01  # group size, with room for its sampling spread
        for level in range(1, cfg.levels + 1):
            params = level_params(cfg, level)
            most_tested = 16 if level == 1 else cfg.max_candidates * 16
            tau = bonferroni_z(most_tested, cfg.false_positive_rate) * math.sqrt(params.count_variance(n_level, 0.0))
            se = math.sqrt(params.count_variance(n_level, c * share) + c * share * (1 - share))
            if c * share - tau < k * se:
                return False
        return True

    heavy_counts = np.sort(true)[::-1]
    n_checks = cfg.levels * int(np.sum(heavy_counts >= 4000))  # generous bound on detectable values x levels
    k = NormalDist().inv_cdf(1 - 3e-7 / n_checks)
    c_min = next(c for c in range(1000, 200_000, 50) if detectable(c, k))
    expected = {v for v, c in truth.items() if c >= c_min}
    assert 5 <= len(expected) < cfg.max_candidates

    result = find_heavy_hitters(values, cfg, rng)
    found = set(result.values.tolist())
    assert expected <= found, f"missed {sorted(expected - found)} (detectable count {c_min})"
    assert all(truth.get(v, 0) > 0 for v in found), "reported a value nobody holds"
    z_counts = NormalDist().inv_cdf(1 - 3e-7 / (2 * cfg.max_candidates * 16))
    for v, count, se in zip(result.values.tolist(), result.counts, result.std_errors):
        assert abs(count - truth[v]) <= z_counts * se, f"value {v}: {count:.0f} vs {truth[v]} (SE {se:.0f})"
    assert [outcome.level for outcome in result.levels] == list(range(1, cfg.levels + 1))
    assert np.all(np.diff(result.counts) <= 0)  # largest first
