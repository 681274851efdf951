"""Heavy hitters over domains too large to enumerate: a prefix tree grown level by level.

Values are integers in [0, 2^value_bits). With b = ``bits_per_level`` the tree has
L = ceil(value_bits / b) levels; level l covers the prefixes of length m_l = min(l b, value_bits)
(the top m_l bits of a value). Devices are partitioned into L groups, one per level (each device
reports once, so it spends epsilon once); group l reports the level-l prefix of its value with
the variance-optimal frequency oracle over 2^(m_l) values that fits ``max_payload_bits``
(:func:`ldp_client.mechanisms.choose_frequency_oracle`: GRR on the small top levels, local
hashing below).

The server works top-down. Level 1's candidates are all 2^(m_1) prefixes; after level l it keeps
the candidates whose estimated count exceeds the threshold and extends each survivor by all
2^(m_(l+1) - m_l) children, which become level l + 1's candidates (estimated candidate-restricted).

Threshold
    The null hypothesis for one candidate is "nobody in the group holds this prefix"; its estimate
    is then approximately normal with mean 0 and the oracle's zero-count standard error sigma_0.
    With m candidates tested at a level and a family-wise false-positive rate alpha,

        tau = z sigma_0,   z = Phi^-1(1 - alpha / (2 m))        (Bonferroni)

    so P(any zero-count candidate passes) <= m * alpha / (2 m) = alpha / 2 <= alpha at every level;
    in particular the final answer contains a value nobody holds with probability at most alpha / 2.
    At most ``max_candidates`` survivors (the largest estimates) are kept per level, which bounds the
    next level's m by ``max_candidates * 2^b`` and the server's cost by n x m hashes.

Detectability
    A value held by c devices sits in group l about c s_l times (s_l the group's share); it survives
    level l with high probability when c s_l - tau >= 5 SE. Heavy hitters much below
    tau / s_l ~ L z sigma_0 are not found; that is the price of local privacy.

Counts
    Survivor counts are rescaled to the whole population: c_hat = c_hat_group / s, with
    Var = (Var_group + c_hat_group (1 - s)) / s^2 (the second term is the group-sampling variance).

The pure functions :func:`first_candidates`, :func:`level_params` and :func:`next_candidates` are
what a campaign engine calls per round; :func:`ldp_collector.simulation.reports.find_heavy_hitters`
runs the whole protocol on simulated reports (tests, benchmarks).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.budget import MAX_MECHANISM_EPSILON
from ldp_client.errors import InvalidParameterError
from ldp_client.mechanisms import GRRParams, LocalHashingParams, UnaryEncodingParams, choose_frequency_oracle
from ldp_client.mechanisms.oracle_choice import FrequencyOracleParams

from .frequency import FrequencyEstimate

__all__ = [
    "HeavyHitterConfig",
    "LevelOutcome",
    "bonferroni_z",
    "first_candidates",
    "level_candidates",
    "level_params",
    "next_candidates",
    "prefixes",
]

MAX_VALUE_BITS = 63
MAX_BITS_PER_LEVEL = 16
MAX_CANDIDATES = 1 << 20


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    """``value`` if it is an int (not bool) in [low, high]; else TypeError / InvalidParameterError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= int(value) <= high:
        raise InvalidParameterError(f"{name} must be in [{low}, {high}], got {int(value)}")
    return int(value)


def _check_float(name: str, value: Any, low: float, high: float, *, open_low: bool = True,
                open_high: bool = False) -> float:
    """``value`` as a finite float in the interval (low or [low, high] or high)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    below = v <= low if open_low else v < low
    above = v >= high if open_high else v > high
    if not np.isfinite(v) or below or above:
        raise InvalidParameterError(
            f"{name} must be in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}, got {v:g}")
    return v


@dataclass(frozen=True, kw_only=True)
class HeavyHitterConfig:
    """Public parameters of a heavy-hitter campaign (``ldp.v1.HeavyHitterParameters`` + epsilon).

    Parameters
    ----------
    value_bits : int
        Values are in [0, 2^value_bits); 1 to 63.
    bits_per_level : int
        Bits added per level, 1 to 16 (each survivor has 2^bits_per_level children).
    epsilon : float
        Each device's budget (it reports once, at its own level), in (0, 20].
    false_positive_rate : float
        Family-wise false-positive rate alpha of every level's threshold, in (0, 1).
    max_candidates : int
        Most prefixes kept per level, 1 to 2^20.
    max_payload_bits : int
        Largest report the level oracles may use (excludes unary encoding on big levels).
    oracles : frozenset of str, optional
        The frequency oracles the levels may use (names of
        :data:`~ldp_client.mechanisms.oracle_choice.FREQUENCY_ORACLES`); ``None`` for any.
    """

    value_bits: int
    bits_per_level: int
    epsilon: float
    false_positive_rate: float = 0.05
    max_candidates: int = 64
    max_payload_bits: int = 64
    oracles: frozenset[str] | None = None

    def __post_init__(self) -> None:
        _check_int("value_bits", self.value_bits, 1, MAX_VALUE_BITS)
        _check_int("bits_per_level", self.bits_per_level, 1, min(MAX_BITS_PER_LEVEL, self.value_bits))
        object.__setattr__(self, "epsilon", _check_float("epsilon", self.epsilon, 0.0, MAX_MECHANISM_EPSILON))
        object.__setattr__(self, "false_positive_rate",
                           _check_float("false_positive_rate", self.false_positive_rate, 0.0, 1.0, open_high=True))
        _check_int("max_candidates", self.max_candidates, 1, MAX_CANDIDATES)
        _check_int("max_payload_bits", self.max_payload_bits, 1, 2**32)

    @property
    def levels(self) -> int:
        """Number of levels L = ceil(value_bits / bits_per_level)."""
        return -(-self.value_bits // self.bits_per_level)

    def prefix_bits(self, level: int) -> int:
        """Prefix length m_l = min(level * bits_per_level, value_bits) of ``level`` (1-based)."""
        _check_int("level", level, 1, self.levels)
        return min(level * self.bits_per_level, self.value_bits)


def level_params(config: HeavyHitterConfig, level: int) -> FrequencyOracleParams:
    """The oracle level ``level`` reports with: least variance over 2^(m_l) values within the payload cap."""
    params = choose_frequency_oracle(2 ** config.prefix_bits(level), config.epsilon, config.max_payload_bits,
                                     oracles=config.oracles)
    if not isinstance(params, (GRRParams, UnaryEncodingParams, LocalHashingParams)):
        raise InvalidParameterError(f"no frequency aggregator for the chosen oracle {params.KIND}")
    return params


def bonferroni_z(tested: int, false_positive_rate: float) -> float:
    """z = Phi^-1(1 - alpha / (2 m)) for m = ``tested`` candidates and family-wise rate alpha."""
    _check_int("tested", tested, 1, 2**62)
    alpha = _check_float("false_positive_rate", false_positive_rate, 0.0, 1.0, open_high=True)
    return NormalDist().inv_cdf(1.0 - alpha / (2.0 * tested))


def prefixes(values: ArrayLike, config: HeavyHitterConfig, level: int) -> NDArray[np.int64]:
    """The level-``level`` prefixes (top m_l bits) of ``values`` in [0, 2^value_bits)."""
    v = np.asarray(values)
    if v.dtype.kind not in "iu":
        raise TypeError(f"values must be integers, got dtype {v.dtype}")
    v = v.astype(np.int64)
    if v.size and (int(v.min()) < 0 or int(v.max()) >= 2**config.value_bits):
        bad = int(v.min()) if int(v.min()) < 0 else int(v.max())
        raise InvalidParameterError(f"values must be in [0, {2**config.value_bits}), got {bad}")
    return np.asarray(np.right_shift(v, config.value_bits - config.prefix_bits(level)), dtype=np.int64)


def first_candidates(config: HeavyHitterConfig) -> NDArray[np.int64]:
    """Level 1's candidates: every prefix of m_1 bits."""
    return np.arange(2 ** config.prefix_bits(1), dtype=np.int64)


def level_candidates(config: HeavyHitterConfig, level: int, prev: ArrayLike | None) -> NDArray[np.int64]:
    """Candidates of ``level``: all prefixes at level 1, else every child of the survivors ``prev``."""
    if level == 1:
        if prev is not None and np.asarray(prev).size:
            raise InvalidParameterError("level 1 has no previous survivors")
        return first_candidates(config)
    if prev is None:
        raise InvalidParameterError(f"level {level} needs the survivors of level {level - 1}")
    parents = np.unique(np.asarray(prev, dtype=np.int64))
    if parents.size and (parents[0] < 0 or parents[-1] >= 2 ** config.prefix_bits(level - 1)):
        raise InvalidParameterError(f"survivors of level {level - 1} must be in [0, 2^{config.prefix_bits(level - 1)})")
    added = config.prefix_bits(level) - config.prefix_bits(level - 1)
    children = (parents[:, None] << added) | np.arange(2**added, dtype=np.int64)[None, :]
    return np.asarray(children.ravel(), dtype=np.int64)


@dataclass(frozen=True, kw_only=True, eq=False)
class LevelOutcome:
    """The server step of one level.

    Attributes
    ----------
    level : int
    tested : int
        Candidates tested (m).
    z : float
        Bonferroni-corrected quantile.
    threshold : float
        tau = z * sigma_0 on the group's count scale.
    survivors : numpy.ndarray of int64
        Prefixes above the threshold (at most ``max_candidates``, largest first).
    counts, std_errors : numpy.ndarray of float64
        The survivors' counts rescaled to the whole population, and their standard errors.
    capped : bool
        Whether more candidates passed than ``max_candidates`` allowed.
    next_candidates : numpy.ndarray of int64
        Children of the survivors (empty after the last level or with no survivors).
    """

    level: int
    tested: int
    z: float
    threshold: float
    survivors: NDArray[np.int64]
    counts: NDArray[np.float64]
    std_errors: NDArray[np.float64]
    capped: bool
    next_candidates: NDArray[np.int64]


def next_candidates(prev: ArrayLike | None, level_estimate: FrequencyEstimate, *, config: HeavyHitterConfig,
                    level: int, group_share: float) -> LevelOutcome:
    """Select the survivors of ``level`` and the candidates of the next level.

    Parameters
    ----------
    prev : array_like of int or None
        Survivors of the previous level (``None`` at level 1); the estimate must cover exactly
        their children (``level_candidates(config, level, prev)``).
    level_estimate : FrequencyEstimate
        Candidate-restricted estimate of the level group's reports.
    config : HeavyHitterConfig
    level : int
        1-based level.
    group_share : float
        Expected share of the population in this level's group (for the rescaled counts), in (0, 1].

    Returns
    -------
    LevelOutcome
    """
    share = _check_float("group_share", group_share, 0.0, 1.0)
    expected = level_candidates(config, level, prev)
    values = level_estimate.values
    if values.size != expected.size or not np.array_equal(np.sort(values), np.sort(expected)):
        raise InvalidParameterError(
            f"the level-{level} estimate must cover exactly the {expected.size} children of the previous "
            f"survivors, got {values.size} values")
    tested = max(1, values.size)
    z = bonferroni_z(tested, config.false_positive_rate)
    threshold = z * level_estimate.zero_std_error
    passed = np.flatnonzero(level_estimate.counts > threshold) if level_estimate.n else np.zeros(0, dtype=np.int64)
    order = passed[np.argsort(-level_estimate.counts[passed], kind="stable")]
    capped = order.size > config.max_candidates
    keep = order[: config.max_candidates]
    group_counts = level_estimate.counts[keep]
    group_se = level_estimate.std_errors[keep]
    plug_in = np.clip(group_counts, 0.0, float(level_estimate.n))
    survivors = values[keep]
    following = (level_candidates(config, level + 1, survivors) if level < config.levels and survivors.size
                 else np.zeros(0, dtype=np.int64))
    return LevelOutcome(
        level=level, tested=tested, z=z, threshold=threshold, survivors=survivors,
        counts=group_counts / share, std_errors=np.sqrt(group_se**2 + plug_in * (1.0 - share)) / share,
        capped=bool(capped), next_candidates=following)
