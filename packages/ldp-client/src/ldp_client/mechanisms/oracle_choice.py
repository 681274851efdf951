"""Automatic choice of the frequency oracle for a domain size, a budget and a bandwidth cap.

The candidates are GRR, OUE, SUE (domains up to 2^20) and OLH with the variance-optimal number of
buckets (plus, when that does not fit the cap, OLH with the most buckets that do). Each is scored
by the variance of its unbiased count estimate for one report of a value nobody holds,
``count_variance(1, 0)`` (the term that dominates for rare values, and the one the oracles are
usually compared by); the smallest wins, ties (equal to 12 significant digits) go to the smaller
payload. Roughly: GRR while D < 3 e^epsilon + 2, else OLH or OUE (OLH when bandwidth counts,
since its variance is within a few percent of OUE's at 32 + log2 g bits instead of D).

A campaign may restrict the choice to some oracles (``oracles``, by the names of
:data:`FREQUENCY_ORACLES`, the lower-case ``ldp.v1.FrequencyOracle`` values): a collector never
picks one outside them, so a device that can run only those can take part (``docs/protocol.md`` §10).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Union

from .._validation import check_epsilon, check_int
from ..errors import InvalidParameterError
from .base import MechanismParams
from .local_hashing import SEED_BITS, LocalHashingParams, optimal_hash_range
from .randomized_response import GRRParams
from .unary_encoding import MAX_DOMAIN as MAX_UNARY_DOMAIN
from .unary_encoding import UnaryEncodingParams, UnaryVariant, oue, sue

__all__ = ["FREQUENCY_ORACLES", "FrequencyOracleParams", "choose_frequency_oracle", "frequency_oracle_candidates",
           "oracle_name"]

_MAX_DOMAIN = 2**63
_MAX_PAYLOAD_BITS = 2**32

#: The parameter classes of the frequency oracles (each has ``count_variance`` and ``payload_bits``).
FrequencyOracleParams = Union[GRRParams, UnaryEncodingParams, LocalHashingParams]

#: The frequency oracles by name: the lower-case ``ldp.v1.FrequencyOracle`` value names.
FREQUENCY_ORACLES = ("grr", "sue", "oue", "olh")


def oracle_name(params: MechanismParams) -> str | None:
    """The :data:`FREQUENCY_ORACLES` name of a mechanism, or ``None`` if it is no frequency oracle."""
    if isinstance(params, UnaryEncodingParams):
        return "sue" if params.variant == UnaryVariant.SYMMETRIC else "oue"
    if isinstance(params, GRRParams):
        return "grr"
    if isinstance(params, LocalHashingParams):
        return "olh"
    return None


def _check_oracles(oracles: Collection[str] | None) -> frozenset[str] | None:
    if oracles is None:
        return None
    if isinstance(oracles, str):
        raise TypeError("oracles must be a collection of oracle names, got a single string")
    unknown = sorted(set(oracles) - set(FREQUENCY_ORACLES))
    if unknown or not oracles:
        raise InvalidParameterError(
            f"oracles must be a non-empty subset of {', '.join(FREQUENCY_ORACLES)}, got {sorted(oracles)}")
    return frozenset(oracles)


def frequency_oracle_candidates(domain_size: int, epsilon: float, max_payload_bits: int | None = None, *,
                                oracles: Collection[str] | None = None) -> list[FrequencyOracleParams]:
    """Every candidate oracle for ``domain_size`` and ``epsilon`` whose payload fits the cap.

    Parameters
    ----------
    domain_size : int
        In [2, 2^63].
    epsilon : float
        In (0, 20].
    max_payload_bits : int, optional
        Largest allowed ``payload_bits`` (>= 1); ``None`` for no cap.
    oracles : collection of str, optional
        The allowed oracles (names of :data:`FREQUENCY_ORACLES`); ``None`` for all.
    """
    allowed = _check_oracles(oracles)
    check_int("domain_size", domain_size, 2, _MAX_DOMAIN)
    epsilon = check_epsilon(epsilon)
    if max_payload_bits is not None:
        check_int("max_payload_bits", max_payload_bits, 1, _MAX_PAYLOAD_BITS)
    candidates: list[FrequencyOracleParams] = [GRRParams(domain_size=domain_size, epsilon=epsilon)]
    if domain_size <= MAX_UNARY_DOMAIN:
        candidates += [oue(domain_size, epsilon), sue(domain_size, epsilon)]
    olh = LocalHashingParams(domain_size=domain_size, epsilon=epsilon)
    candidates.append(olh)
    if max_payload_bits is not None and olh.payload_bits > max_payload_bits > SEED_BITS:
        # The optimal g does not fit: fewer buckets (more noise) may still beat GRR.
        g = min(2 ** (max_payload_bits - SEED_BITS), optimal_hash_range(epsilon))
        candidates.append(LocalHashingParams(domain_size=domain_size, epsilon=epsilon, hash_range=g))
    if allowed is not None:
        candidates = [c for c in candidates if oracle_name(c) in allowed]
    if max_payload_bits is None:
        return candidates
    return [c for c in candidates if c.payload_bits <= max_payload_bits]


def _preference_key(params: FrequencyOracleParams) -> tuple[float, int]:
    """Sort key: per-report variance (12 significant digits, so near-ties count as ties), then bits."""
    return float(f"{params.count_variance(1.0, 0.0):.12g}"), params.payload_bits


def choose_frequency_oracle(domain_size: int, epsilon: float, max_payload_bits: int | None = None, *,
                            oracles: Collection[str] | None = None) -> MechanismParams:
    """The frequency oracle with the smallest per-report estimator variance that fits the cap.

    Parameters
    ----------
    domain_size : int
        In [2, 2^63].
    epsilon : float
        In (0, 20].
    max_payload_bits : int, optional
        Largest allowed ``payload_bits`` of one report (>= 1); ``None`` for no cap.
    oracles : collection of str, optional
        The allowed oracles (names of :data:`FREQUENCY_ORACLES`); ``None`` for all.

    Returns
    -------
    MechanismParams
        A ``GRRParams``, ``UnaryEncodingParams`` (OUE or SUE) or ``LocalHashingParams``.

    Raises
    ------
    InvalidParameterError
        If an argument is out of range, or no allowed oracle fits ``max_payload_bits`` (GRR, the
        most compact, needs ceil(log2 domain_size) bits; unary encoding is limited to 2^20 values).
    """
    candidates = frequency_oracle_candidates(domain_size, epsilon, max_payload_bits, oracles=oracles)
    if not candidates and oracles is not None:
        raise InvalidParameterError(
            f"none of the allowed frequency oracles ({', '.join(sorted(oracles))}) can serve domain_size "
            f"{domain_size} at epsilon {epsilon:g}"
            + ("" if max_payload_bits is None else f" within max_payload_bits={max_payload_bits}"))
    if not candidates:
        smallest = GRRParams(domain_size=domain_size, epsilon=epsilon).payload_bits
        raise InvalidParameterError(
            f"no frequency oracle fits max_payload_bits={max_payload_bits} for domain_size {domain_size}: "
            f"the most compact (grr) needs {smallest} bits")
    return min(candidates, key=_preference_key)
