"""Simulated reports for the server-side estimators: numpy draws from each oracle's output distribution.

Tests and benchmarks feed an aggregator ``n`` reports without running ``n`` devices:
:func:`add_simulated_reports` draws them with numpy from the distribution the SDK's parameter
object defines, and :func:`find_heavy_hitters` runs the whole prefix-tree heavy-hitter protocol on
such reports. The probabilities are used as floats and the generator is seeded, so nothing here is
privacy-carrying: devices use the SDK's exact-coin ``randomize`` (and :mod:`.population` drives
that real device code).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.errors import InvalidParameterError
from ldp_client.mechanisms.bitwise_randomized_response import BitwiseRRParams
from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams
from ldp_client.mechanisms.discrete_laplace import DiscreteLaplaceParams
from ldp_client.mechanisms.local_hashing import SEED_BITS, LocalHashingParams
from ldp_client.mechanisms.randomized_response import GRRParams
from ldp_client.mechanisms.unary_encoding import UnaryEncodingParams
from ldp_client.mechanisms.vector_box import VectorBoxParams
from ldp_client.mechanisms.vector_l2_ball import VectorL2BallParams
from ldp_client.mechanisms.vector_privunit import VectorPrivUnitParams

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

__all__ = [
    "HeavyHitterResult",
    "add_simulated_reports",
    "draw_bitwise_rr",
    "draw_bucketized_vector",
    "draw_discrete_laplace",
    "draw_grr",
    "draw_l2_ball",
    "draw_local_hashing",
    "draw_privunit",
    "draw_unary",
    "draw_vector_box",
    "find_heavy_hitters",
]


def draw_grr(params: GRRParams, values: NDArray[np.int64], rng: np.random.Generator) -> NDArray[np.int64]:
    """GRR reports of ``values``: each kept with probability p, otherwise a uniform other value.

    Parameters
    ----------
    params : GRRParams
    values : numpy.ndarray of int64, shape (n,)
        Encoded values in [0, domain_size) (checked by the caller).
    rng : numpy.random.Generator
        Seeded simulation randomness (p as a float: not privacy-carrying).

    Returns
    -------
    numpy.ndarray of int64, shape (n,)
        The reported indices, the SDK's GRR payloads.
    """
    n = values.size
    other = rng.integers(0, params.domain_size - 1, size=n, dtype=np.int64)
    other += other >= values
    return np.where(rng.random(n) < params.p, values, other)


def draw_unary(params: UnaryEncodingParams, values: NDArray[np.int64], rng: np.random.Generator) -> NDArray[np.uint8]:
    """Unary-encoding reports of ``values``: bit v is 1 with probability p, every other bit with q.

    Returns
    -------
    numpy.ndarray of uint8, shape (n, ceil(domain_size / 8))
        Each row packed little-endian within bytes, as the SDK packs the payload
        (:func:`ldp_client.payload.pack_bits`): ``row.tobytes()`` is the payload.
    """
    n = values.size
    bits = rng.random((n, params.domain_size)) < params.q
    bits[np.arange(n), values] = rng.random(n) < params.p
    return np.packbits(bits, axis=1, bitorder="little")


def draw_bitwise_rr(params: BitwiseRRParams, bits: NDArray[np.uint8], rng: np.random.Generator) -> NDArray[np.uint8]:
    """Bitwise randomized-response reports of 0/1 ``bits`` (shape (n, length)): each bit flipped with p_flip.

    Returns
    -------
    numpy.ndarray of uint8, shape (n, ceil(length / 8))
        Packed as :func:`draw_unary` packs its rows: ``row.tobytes()`` is the payload.
    """
    flips = rng.random(bits.shape) < params.p_flip
    return np.packbits(flips ^ bits.astype(np.bool_), axis=1, bitorder="little")


def draw_discrete_laplace(params: DiscreteLaplaceParams, unit: NDArray[np.float64],
                          rng: np.random.Generator) -> NDArray[np.int64]:
    """Discrete-Laplace reports of points of ``[0, 1]^d`` (shape (n, d)): the grid point plus noise.

    The grid point is ``round(x N)`` with ties to even, as the SDK rounds; the noise, with
    ``P[k]`` proportional to ``a^|k|`` (``a`` = :attr:`~DiscreteLaplaceParams.noise_decay`), is the
    difference of two independent geometric counts of failures with success probability ``1 - a``.

    Returns
    -------
    numpy.ndarray of int64, shape (n, d)
        The payloads' integers.
    """
    grid = np.rint(unit * float(params.grid_size)).astype(np.int64)
    success = -math.expm1(-1.0 / float(params.scale))  # 1 - a, accurate for large scales
    return grid + rng.geometric(success, size=grid.shape) - rng.geometric(success, size=grid.shape)


def draw_vector_box(params: VectorBoxParams, x: NDArray[np.float64], rng: np.random.Generator) -> NDArray[np.uint8]:
    """Box-randomizer reports of points of ``[-1, 1]^d`` (shape (n, d)).

    A random corner ``v`` (``v_j = +1`` with probability ``(1 + x_j) / 2``), the upper hemisphere
    ``<z, v> > 0`` with probability ``upper_probability``, else the lower one ``<z, v> <= 0``, and a
    uniform sign vector ``z`` of it (uniform draws, each row redrawn until it lands on its side).

    Returns
    -------
    numpy.ndarray of uint8, shape (n, ceil(d / 8))
        The signs packed little-endian (bit ``j`` set: ``z_j = +1``), as the SDK packs them.
    """
    n, d = x.shape
    corner = rng.random((n, d)) < (1.0 + x) / 2.0
    upper = np.asarray(rng.random(n) < float(params.upper_probability), dtype=np.bool_)
    z = np.empty((n, d), dtype=np.bool_)
    todo: NDArray[np.int64] = np.arange(n, dtype=np.int64)
    while todo.size:
        draw = rng.random((todo.size, d)) < 0.5
        twice_dot = 2 * (draw == corner[todo]).sum(axis=1) - d
        ok = np.asarray(np.where(upper[todo], twice_dot > 0, twice_dot <= 0), dtype=np.bool_)
        z[todo[ok]] = draw[ok]
        todo = todo[~ok]
    return np.packbits(z, axis=1, bitorder="little")


def _directions(rng: np.random.Generator, shape: tuple[int, ...], d: int) -> NDArray[np.float64]:
    """Uniform unit directions of dimension ``d``, shape ``shape + (d,)``: normalized Gaussians."""
    g = rng.standard_normal((*shape, d))
    return np.asarray(g / np.linalg.norm(g, axis=-1, keepdims=True), dtype=np.float64)


def _ball_targets(x: NDArray[np.float64], rng: np.random.Generator) -> NDArray[np.float64]:
    """The ball randomizers' target x~ of every row (``ldp_client.mechanisms.vector_l2_ball.ball_target``):
    ``x / ||x||`` with probability ``(1 + ||x||) / 2``, else its opposite; a uniform direction for ``x = 0``."""
    n, d = x.shape
    norm = np.linalg.norm(x, axis=1)
    keep = rng.random(n) < (1.0 + np.minimum(norm, 1.0)) / 2.0
    target = np.where(keep, 1.0, -1.0)[:, None] * x / np.where(norm > 0.0, norm, 1.0)[:, None]
    zero = np.flatnonzero(norm == 0.0)
    target[zero] = _directions(rng, (zero.size,), d)
    return target


def draw_l2_ball(params: VectorL2BallParams, x: NDArray[np.float64], rng: np.random.Generator) -> NDArray[np.float32]:
    """l2-ball randomizer reports of points of the unit ball (shape (n, d)), as float32 directions.

    ``x~ = +-x / ||x||`` (``+`` with probability ``(1 + ||x||) / 2``; a uniform direction for
    ``x = 0``), a uniform direction ``w`` turned to ``x~``'s side, then kept with probability
    ``near_probability`` and negated otherwise.
    """
    n, d = x.shape
    target = _ball_targets(x, rng)
    w = _directions(rng, (n,), d)
    near = np.where((w * target).sum(axis=1) < 0.0, -1.0, 1.0)
    sides = np.where(rng.random(n) < float(params.near_probability), near, -near)
    return (w * sides[:, None]).astype(np.float32)


#: Rows per block of :func:`draw_privunit`: each row draws P d Gaussians (16 x 11 doubles, 1.4 kB), so a
#: block holds about 46 MB whatever n is.
_PRIVUNIT_BLOCK = 1 << 15


def draw_privunit(params: VectorPrivUnitParams, x: NDArray[np.float64],
                  rng: np.random.Generator) -> NDArray[np.float32]:
    """PrivUnit reports of points of the unit ball (shape (n, d)), as float32 directions.

    ``x~`` as :func:`draw_l2_ball`, then P = ``params.pairs`` uniform directions V_i per row, whose
    m = 2P members +-V_i the SDK ranks by their dot with ``x~``. Member ``+-V_i`` has key
    ``+-<V_i, x~>``, so with j <= P the ranking is: first the P pairs by decreasing
    ``|<V_i, x~>|``, each turned to ``x~``'s side, then the same pairs in reverse, turned away.
    The SDK reports a uniform member of the cap (the first j) with probability
    ``cap_probability``, else of the complement (the other m - j): here a uniform rank in
    ``[0, j)`` or ``[j, m)`` and the member at that rank. Ties of the keys (probability 0 on
    continuous draws) may be ordered differently from the SDK's rule; the distribution is the same.
    """
    n, d = x.shape
    pairs, j = params.pairs, params.cap_size
    members = 2 * pairs
    target = _ball_targets(x, rng)
    cap = rng.random(n) < float(params.cap_probability)
    rank = np.where(cap, rng.integers(0, j, size=n), rng.integers(j, members, size=n))
    out = np.empty((n, d), dtype=np.float32)
    for start in range(0, n, _PRIVUNIT_BLOCK):
        stop = min(n, start + _PRIVUNIT_BLOCK)
        rows = np.arange(stop - start)
        v = _directions(rng, (stop - start, pairs), d)
        h = np.einsum("bpd,bd->bp", v, target[start:stop])
        order = np.argsort(-np.abs(h), axis=1, kind="stable")
        r = rank[start:stop]
        away = r >= pairs
        pair = order[rows, np.where(away, members - 1 - r, r)]
        # A pair's member on x~'s side: +V_i when <V_i, x~> >= 0 (at 0 the SDK's tie goes to +V_i).
        toward = np.where(h[rows, pair] < 0.0, -1.0, 1.0)
        out[start:stop] = v[rows, pair] * np.where(away, -toward, toward)[:, None]
    return out


def draw_bucketized_vector(params: BucketizedVectorParams, buckets: NDArray[np.uint64], vectors: NDArray[np.float64],
                           rng: np.random.Generator) -> tuple[NDArray[np.uint64], NDArray[Any]]:
    """Bucketized vector-sum reports of ``(bucket, vector)`` pairs: a uniform 32-bit sign seed, the
    SDK's sign ``1 - 2 H(seed, bucket, 2)`` applied, then the inner randomizer.

    Returns
    -------
    seeds : numpy.ndarray of uint64, shape (n,)
    inner : numpy.ndarray
        :func:`draw_vector_box`'s packed signs (BOX), :func:`draw_l2_ball`'s (L2_BALL) or
        :func:`draw_privunit`'s (PRIVUNIT) directions.
    """
    seeds = rng.integers(0, 2**SEED_BITS, size=len(buckets), dtype=np.uint64)
    sigma = 1.0 - 2.0 * hash_values(seeds, buckets, 2).astype(np.float64)
    inner = params.inner
    if isinstance(inner, VectorBoxParams):
        return seeds, draw_vector_box(inner, sigma[:, None] * vectors, rng)
    factor = sigma / math.sqrt(params.dimension)
    if isinstance(inner, VectorPrivUnitParams):
        return seeds, draw_privunit(inner, factor[:, None] * vectors, rng)
    return seeds, draw_l2_ball(inner, factor[:, None] * vectors, rng)


def draw_local_hashing(params: LocalHashingParams, values: NDArray[np.int64],
                       rng: np.random.Generator) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """Local-hashing reports of ``values``: a uniform 32-bit seed (with a seed pool: a uniform
    pool seed, ``docs/protocol.md`` §14), the SDK's hash, then GRR over g buckets.

    Returns
    -------
    seeds : numpy.ndarray of uint64, shape (n,)
    buckets : numpy.ndarray of int64, shape (n,)
        The payloads ``HashedValue(seed, bucket)``.
    """
    g = params.g
    n = values.size
    if params.seed_pool_size:
        pool = np.array(params.pool_seeds, dtype=np.uint64)
        seeds = pool[rng.integers(0, pool.size, size=n)]
    else:
        seeds = rng.integers(0, 2**SEED_BITS, size=n, dtype=np.uint64)
    true_bucket = hash_values(seeds, values.astype(np.uint64), g).astype(np.int64)
    other = rng.integers(0, g - 1, size=n, dtype=np.int64)
    other += other >= true_bucket
    return seeds, np.where(rng.random(n) < params.p, true_bucket, other)


def add_simulated_reports(aggregator: FrequencyAggregator, true_values: ArrayLike, rng: np.random.Generator) -> None:
    """Simulate one report per element of ``true_values`` and add them to ``aggregator``.

    Reports are drawn with numpy from the output distribution the parameter object defines
    (:func:`draw_grr`, :func:`draw_unary`, :func:`draw_local_hashing`). The probabilities are
    used as floats, so this is for simulations only; devices use the SDK's exact-coin ``randomize``.

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
    if isinstance(aggregator, GRRAggregator):
        aggregator.add_indices(draw_grr(aggregator.params, v, rng))
    elif isinstance(aggregator, UnaryEncodingAggregator):
        rows = max(1, _UNPACK_CHUNK_BITS // aggregator.params.domain_size)
        for r0 in range(0, v.size, rows):
            aggregator.add_packed(draw_unary(aggregator.params, v[r0:r0 + rows], rng))
    elif isinstance(aggregator, LocalHashingAggregator):
        aggregator.add_arrays(*draw_local_hashing(aggregator.params, v, rng))
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
