"""Simulated reports for the server-side estimators: numpy draws from each oracle's output distribution.

Tests and benchmarks feed an aggregator ``n`` reports without running ``n`` devices:
:func:`add_simulated_reports` draws them with numpy from the distribution the SDK's parameter
object defines, and :func:`find_heavy_hitters` runs the whole prefix-tree heavy-hitter protocol on
such reports. The probabilities are used as floats and the generator is seeded, so nothing here is
privacy-carrying: devices use the SDK's exact-coin ``randomize`` (and :mod:`.population` drives
that real device code).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.errors import InvalidParameterError
from ldp_client.mechanisms.local_hashing import SEED_BITS

from ..estimation.frequency import (
    _UNPACK_CHUNK_BITS,
    FrequencyAggregator,
    GRRAggregator,
    LocalHashingAggregator,
    UnaryEncodingAggregator,
    _check_values,
    make_aggregator,
)
from ..estimation.heavy_hitters import (
    HeavyHitterConfig,
    LevelOutcome,
    first_candidates,
    level_params,
    next_candidates,
    prefixes,
)
from ..estimation.olh_hash import hash_values

__all__ = ["HeavyHitterResult", "add_simulated_reports", "find_heavy_hitters"]


def add_simulated_reports(aggregator: FrequencyAggregator, true_values: ArrayLike, rng: np.random.Generator) -> None:
    """Simulate one report per element of ``true_values`` and add them to ``aggregator``.

    Reports are drawn with numpy from the output distribution the parameter object defines
    (GRR: keep w.p. p, else a uniform other value; unary encoding: the true bit is 1 w.p. p,
    every other bit w.p. q; local hashing: a uniform 32-bit seed, the SDK's hash, then GRR over
    g buckets). The probabilities are used as floats, so this is for simulations only; devices
    use the SDK's exact-coin ``randomize``.

    Parameters
    ----------
    aggregator : FrequencyAggregator
    true_values : array_like of int, shape (n,)
        Encoded values in [0, domain_size).
    rng : numpy.random.Generator
        Seeded generator (simulation randomness, not privacy-carrying).
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    v = _check_values(true_values, aggregator.params.domain_size, "true_values")
    n = v.size
    if isinstance(aggregator, GRRAggregator):
        grr = aggregator.params
        other = rng.integers(0, grr.domain_size - 1, size=n, dtype=np.int64)
        other += other >= v
        aggregator.add_indices(np.where(rng.random(n) < grr.p, v, other))
    elif isinstance(aggregator, UnaryEncodingAggregator):
        ue = aggregator.params
        size = ue.domain_size
        rows = max(1, _UNPACK_CHUNK_BITS // size)
        for r0 in range(0, n, rows):
            chunk = v[r0:r0 + rows]
            bits = rng.random((chunk.size, size)) < ue.q
            bits[np.arange(chunk.size), chunk] = rng.random(chunk.size) < ue.p
            aggregator.add_packed(np.packbits(bits, axis=1, bitorder="little"))
    elif isinstance(aggregator, LocalHashingAggregator):
        lh = aggregator.params
        g = lh.g
        seeds = rng.integers(0, 2**SEED_BITS, size=n, dtype=np.uint64)
        true_bucket = hash_values(seeds, v.astype(np.uint64), g).astype(np.int64)
        other = rng.integers(0, g - 1, size=n, dtype=np.int64)
        other += other >= true_bucket
        aggregator.add_arrays(seeds, np.where(rng.random(n) < lh.p, true_bucket, other))
    else:
        raise TypeError(f"cannot simulate reports for {type(aggregator).__name__}")


@dataclass(frozen=True, kw_only=True, eq=False)
class HeavyHitterResult:
    """Heavy hitters found by :func:`find_heavy_hitters` (largest first) and the per-level trace."""

    values: NDArray[np.int64]
    counts: NDArray[np.float64]
    std_errors: NDArray[np.float64]
    levels: list[LevelOutcome] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def find_heavy_hitters(values: ArrayLike, config: HeavyHitterConfig, rng: np.random.Generator, *,
                       group_weights: ArrayLike | None = None) -> HeavyHitterResult:
    """Run the whole prefix-tree protocol on simulated reports of ``values`` (tests, benchmarks).

    Each device joins level group l with probability w_l / sum(w) (default: equal weights) and
    reports its level-l prefix, simulated from the level oracle's output distribution
    (:func:`add_simulated_reports`); the server then runs
    :func:`~ldp_collector.estimation.heavy_hitters.next_candidates` level by level.

    Parameters
    ----------
    values : array_like of int, shape (N,)
        One private value per device, in [0, 2^value_bits).
    config : HeavyHitterConfig
    rng : numpy.random.Generator
        Seeded simulation randomness.
    group_weights : array_like of float, shape (L,), optional
        Relative group sizes.

    Returns
    -------
    HeavyHitterResult
    """
    v = np.asarray(values)
    levels = config.levels
    weights = np.ones(levels) if group_weights is None else np.asarray(group_weights, dtype=np.float64)
    if weights.shape != (levels,) or np.any(weights <= 0) or not np.all(np.isfinite(weights)):
        raise InvalidParameterError(f"group_weights must be {levels} positive numbers")
    shares = weights / weights.sum()
    groups = rng.choice(levels, size=v.size, p=shares)
    prev: NDArray[np.int64] | None = None
    trace: list[LevelOutcome] = []
    warnings: list[str] = []
    candidates = first_candidates(config)
    outcome: LevelOutcome | None = None
    for level in range(1, levels + 1):
        aggregator = make_aggregator(level_params(config, level))
        add_simulated_reports(aggregator, prefixes(v[groups == level - 1], config, level), rng)
        estimate = aggregator.estimate(candidates=candidates)
        warnings.extend(f"level {level}: {w}" for w in estimate.warnings)
        outcome = next_candidates(prev, estimate, config=config, level=level, group_share=float(shares[level - 1]))
        trace.append(outcome)
        if outcome.capped:
            warnings.append(f"level {level}: more than {config.max_candidates} prefixes passed; kept the largest")
        if not outcome.survivors.size:
            warnings.append(f"level {level}: no prefix passed the threshold {outcome.threshold:.4g}")
            break
        prev, candidates = outcome.survivors, outcome.next_candidates
    empty_f: NDArray[np.float64] = np.zeros(0)
    if outcome is None or outcome.level != levels:
        return HeavyHitterResult(values=np.zeros(0, dtype=np.int64), counts=empty_f, std_errors=empty_f,
                                 levels=trace, warnings=warnings)
    return HeavyHitterResult(values=outcome.survivors, counts=outcome.counts, std_errors=outcome.std_errors,
                             levels=trace, warnings=warnings)
