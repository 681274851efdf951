"""Generalized (k-ary) randomized response, GRR.

Privacy
    epsilon-LDP: the true value is reported with probability p = r / (r + D - 1) and every other
    value with q = 1 / (r + D - 1), where r is the largest 48-bit dyadic rational <= e^epsilon, so
    P[y | x] / P[y | x'] <= p / q = r <= e^epsilon, with equality for y = x: the realized epsilon
    ``ln r`` is tight.
Parameters
    ``domain_size`` D in [2, 2^63], ``epsilon`` in (0, 20].
Utility
    The unbiased count estimate (C - n q) / (p - q) has variance
    n q (1 - q) / (p - q)^2 + c (1 - p - q) / (p - q); best among the oracles while
    D < 3 e^epsilon + 2.
Cost
    ceil(log2 D) bits; two CSPRNG draws.
Reference
    Warner (1965); Kairouz, Bonawitz and Ramage, "Discrete distribution estimation under local
    privacy" (ICML 2016); Wang et al., "Locally differentially private protocols for frequency
    estimation" (USENIX Security 2017).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar

from .._exact import log_fraction
from .._validation import check_epsilon, check_int, describe
from ..errors import ProtocolError
from ..payload import Payload
from ..rng import Rng, resolve_rng
from .base import MECHANISMS, MechanismParams, bits_for, check_index_value, count_estimate_variance, privacy_ratio

__all__ = ["GRRParams", "randomize"]

_MAX_DOMAIN = 2**63


@MECHANISMS.register
@dataclass(frozen=True, kw_only=True)
class GRRParams(MechanismParams):
    """Parameters of k-ary randomized response (``ldp.v1.GeneralizedRandomizedResponse``)."""

    KIND: ClassVar[str] = "grr"
    PAYLOAD_FIELD: ClassVar[str] = "index"
    INPUT_KIND: ClassVar[str] = "index"

    domain_size: int
    epsilon: float

    def __post_init__(self) -> None:
        check_int("domain_size", self.domain_size, 2, _MAX_DOMAIN)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        _ = self.ratio  # refuses an epsilon whose ratio is 1

    @cached_property
    def ratio(self) -> Fraction:
        """r: the exact rational stand-in for e^epsilon (r <= e^epsilon)."""
        return privacy_ratio(self.epsilon)

    @cached_property
    def p_exact(self) -> Fraction:
        """Probability of reporting the true value."""
        return self.ratio / (self.ratio + self.domain_size - 1)

    @cached_property
    def q_exact(self) -> Fraction:
        """Probability of reporting one given other value."""
        return 1 / (self.ratio + self.domain_size - 1)

    @cached_property
    def p(self) -> float:
        return float(self.p_exact)

    @cached_property
    def q(self) -> float:
        return float(self.q_exact)

    @property
    def realized_epsilon(self) -> float:
        return log_fraction(self.ratio)

    @property
    def input_size(self) -> int:
        return self.domain_size

    @property
    def payload_bits(self) -> int:
        return bits_for(self.domain_size)

    def count_variance(self, n: float, count: float = 0.0) -> float:
        """Variance of the unbiased estimate of a count ``count`` among ``n`` reports."""
        return count_estimate_variance(self.p, self.q, n, count)

    def randomize(self, value: Any, *, rng: Rng | None = None) -> Payload:
        return randomize(value, self, rng=rng)

    def check_payload(self, payload: Any) -> Payload:
        if isinstance(payload, bool) or not isinstance(payload, int) or not 0 <= payload < self.domain_size:
            raise ProtocolError(f"grr payload must be an index in [0, {self.domain_size}), got {describe(payload)}")
        return payload


def randomize(value: Any, params: GRRParams, *, rng: Rng | None = None) -> int:
    """Report ``value`` with probability p, otherwise a uniformly chosen other value.

    Parameters
    ----------
    value : int
        The encoded value, in ``[0, params.domain_size)``.
    params : GRRParams
    rng : Rng, optional
        Defaults to the OS CSPRNG.
    """
    index = check_index_value("grr", value, params.domain_size)
    rng = resolve_rng(rng)
    p = params.p_exact
    if rng.bernoulli(p.numerator, p.denominator):
        return index
    other = rng.randbelow(params.domain_size - 1)
    return other if other < index else other + 1
