"""PrivUnit on a public set of antipodal directions: an unbiased l2-ball randomizer of lower variance.

A device holding x with ||x||_2 <= 1 reports one unit direction w; the collector's estimate of x
is B w, unbiased, with the public constant B = :attr:`VectorPrivUnitParams.scale`. This is
Bhowmick et al.'s PrivUnit (a spherical cap around x of small measure, reported with a boosted
probability) with the uniform direction of the cap and of its complement replaced by a uniform
member of a finite random set, so that the cap/complement choice is the only privacy-carrying step
and it is an exact coin: the set plays the part of the pair {w, -w} of
:mod:`~ldp_client.mechanisms.vector_l2_ball`, which is the special case of one pair.

Algorithm
    1. x~ = x / ||x|| with probability (1 + ||x||) / 2, else -x / ||x|| (so E[x~] = x); for x = 0,
       x~ is a uniform random direction (as in the l2-ball randomizer).
    2. Draw P = :data:`PAIRS` directions V_1..V_P (sign-symmetric uniform directions, independent
       of x) and form the set S of the m = 2P members +-V_i.
    3. Rank the members of S by their float dot product with x~, ties broken by a fixed rule on S
       alone (member index order); IEEE negation is exact, so -V_i's dot product is exactly minus
       V_i's and the top j (j <= P) members hold at most one of each pair. Call the top j the cap.
    4. An exact coin with P[cap] = p = r j / (r j + m - j), r the largest 48-bit dyadic rational
       <= e^epsilon, picks the cap or its complement; an exact uniform index (``randbelow``) then
       picks one member of the chosen side. j = :attr:`VectorPrivUnitParams.cap_size` is the
       public cap size that minimizes B (below).
    5. The report is rounded to float32 (the wire format) on the device; rounding is a
       post-processing of the chosen member.
Privacy
    epsilon-LDP with realized epsilon ln r <= epsilon, tight. S is drawn independently of x, and
    given S, x (through x~) only decides which j members form the cap. Each member of S is chosen
    with probability p / j (cap) or (1 - p) / (m - j) (complement), exactly, whatever the floats
    of the ranking are: the ranking is a deterministic function of (S, x~), and exactly j members
    are in the cap for every x~. So for every output u,
    P[u | x] = sum over S of P[S] * sum over the members of S equal to u of (p / j or (1 - p) / (m - j)),
    mixed over x~ (step 1), and the ratio of the two per-member probabilities is
    (p / j) / ((1 - p) / (m - j)) = r. Hence P[u | x] <= r P[u | x'] for any x, x'. Equality
    holds for x = e_1, x' = -e_1 (the cap of one is the complement of the other). No float
    comparison carries a probability: the sampler of S need not even be exactly uniform for
    privacy (it only needs to ignore x); it must be rotation invariant for unbiasedness.
Parameters
    ``dimension`` d in [1, 4096], ``epsilon`` in (0, 20] (at least about 1.5e-14, so that r > 1).
Utility
    By rotation invariance E[w | x~] = c x~ with c = p E[mean of the cap's dots] +
    (1 - p) E[mean of the complement's dots]. The m dots sum to 0 (antipodal pairs), so with
    A_j = E[sum of the j largest of |t_1|, ..., |t_P|] (t_i = <V_i, x~>),
    c = A_j (p / j - (1 - p) / (m - j)) = A_j (r - 1) / (r j + m - j), and B = 1 / c.
    A_j = P * integral over a in [0, 1] of a h(a) P[Binomial(P - 1, H(a)) >= P - j] da, with h and H
    the density and distribution of |t|: |t| = cos(theta), theta in [0, pi / 2] of density
    proportional to sin^(d - 2)(theta). :func:`cap_sums` evaluates it by Simpson's rule on 2048
    intervals of theta (the density and its running integral on the same grid, restricted to
    where sin^(d - 2) is above e^-72 of its peak), to about 1e-10 relative (pinned against an
    independent quadrature in the tests); for d = 1, |t| = 1 and A_j = j exactly. The exact r
    replaces e^epsilon so the estimate is unbiased for the coin really used. The output is a unit
    vector, so E[||B w||^2] = B^2 exactly and E[||B w - x||^2] = B^2 - ||x||^2. Unlike the l2-ball
    randomizer's, the output is not spread evenly over the coordinates: with
    s = E[<w, x~>^2] = p Q_j / j + (1 - p) (m / d - Q_j) / (m - j) (Q_j the expected sum of the
    squares of the same j largest |t_i|, from the same quadrature; the m squares sum to m / d),
    E[(B w_j)^2 | x~] = B^2 (s x~_j^2 + (1 - s)(1 - x~_j^2) / (d - 1)), so
    Var[B w_j] <= B^2 max(s, (1 - s) / (d - 1)) - x_j^2
    (:attr:`VectorPrivUnitParams.variance_bound`; s >= 1 / d, so the bound is B^2 s, against the
    l2-ball's B^2 / d: PrivUnit puts its noise along x). With P = 1, j = 1 this is the l2-ball
    randomizer's B; at d = 11, epsilon = 1 it is 11 % below it, at epsilon = 2, 37 % below
    (``benchmarks/vector_randomizers.py``); the gap to PrivUnit's continuous cap is 2-5 % at
    epsilon <= 2.
Cost
    32 d bits (d float32), as the l2-ball randomizer. CPU: P d = 16 d Gaussians (2 CSPRNG draws
    each), P dot products, three exact coins and one ``randbelow``; the set-up of B and j (once per
    (d, epsilon), cached) is a few tens of milliseconds.
Reference
    Bhowmick, Duchi, Freudiger, Kapoor and Rogers, "Protection against reconstruction and its
    applications in private federated learning" (2018), PrivUnit; Asi, Feldman and Talwar,
    "Optimal algorithms for mean estimation under local differential privacy" (ICML 2022), its
    optimality.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property, lru_cache
from typing import Any, ClassVar

from .._validation import check_vector
from ..encoders.projection import dot
from ..payload import Floats
from ..rng import Rng, resolve_rng
from .base import MECHANISMS
from .vector_l2_ball import UnitDirectionParams, ball_target, uniform_direction

__all__ = ["PAIRS", "VectorPrivUnitParams", "cap_sums", "randomize"]

#: P: antipodal pairs in the random set (m = 2P members). 16 keeps the variance within 2.5 % of
#: PrivUnit's continuous cap at d = 11, epsilon <= 2, for 16 d Gaussians per report.
PAIRS = 16
#: Simpson intervals of :func:`cap_sums` (even).
_INTERVALS = 2048
#: sin^n(pi/2 + u) <= exp(-n u^2 / 2): beyond u = 12 / sqrt(n) the density is below e^-72 of its peak.
_TAIL_WIDTHS = 12.0


@lru_cache(maxsize=64)
def cap_sums(dimension: int, pairs: int = PAIRS) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """((A_1, ..., A_P), (Q_1, ..., Q_P)) over P uniform directions V_i and a unit x.

    A_j = E[sum of the j largest |<V_i, x>|] and Q_j = E[sum of their squares]. The module
    docstring gives the integral; cached per ``(dimension, pairs)`` because a simulation builds the
    same parameters for every device.
    """
    if dimension == 1:
        return tuple(float(j) for j in range(1, pairs + 1)), tuple(float(j) for j in range(1, pairs + 1))
    n = dimension - 2
    lower = 0.0 if n == 0 else max(0.0, 0.5 * math.pi - _TAIL_WIDTHS / math.sqrt(n))
    upper = 0.5 * math.pi
    steps = _INTERVALS
    h = (upper - lower) / steps

    def density(theta: float) -> float:  # sin^n(theta) relative to its peak (1 at pi / 2)
        return math.sin(theta) ** n if n else 1.0

    nodes = [lower + i * h for i in range(steps + 1)]
    weights = [density(t) for t in nodes]
    halves = [density(lower + (i + 0.5) * h) for i in range(steps)]
    # Running integral of the density from `lower` (Simpson on each interval with its midpoint).
    running = [0.0]
    for i in range(steps):
        running.append(running[-1] + h / 6.0 * (weights[i] + 4.0 * halves[i] + weights[i + 1]))
    total = running[-1]
    sums = [0.0] * pairs
    squares = [0.0] * pairs
    for i, theta in enumerate(nodes):
        simpson = (1.0 if i in (0, steps) else 4.0 if i % 2 else 2.0) * h / 3.0
        a = math.cos(theta)
        f = weights[i] / total  # density of theta on [lower, pi/2]
        tail = 1.0 - running[i] / total  # H(a) = P[|t| <= a] = P[theta >= theta_i]
        # P[Binomial(P - 1, H) = k] for k = 0..P-1, then upper tails P[>= P - j] for j = 1..P.
        pmf = [math.comb(pairs - 1, k) * tail**k * (1.0 - tail) ** (pairs - 1 - k) for k in range(pairs)]
        upper_tail = 0.0
        base = simpson * a * f * pairs
        for j in range(1, pairs + 1):
            upper_tail += pmf[pairs - j]
            sums[j - 1] += base * upper_tail
            squares[j - 1] += base * a * upper_tail
    return tuple(sums), tuple(squares)


@MECHANISMS.register
@dataclass(frozen=True, kw_only=True)
class VectorPrivUnitParams(UnitDirectionParams):
    """Parameters of the PrivUnit vector randomizer (``ldp.v1.VectorPrivUnit``).

    See the module docstring for the privacy argument, utility and cost.
    """

    KIND: ClassVar[str] = "vector_privunit"
    #: P, the antipodal pairs of the random set (a class constant; the tests' enumeration lowers it).
    pairs: ClassVar[int] = PAIRS

    @property
    def members(self) -> int:
        """m = 2P: the size of the random set."""
        return 2 * self.pairs

    @cached_property
    def _best(self) -> tuple[int, float]:
        """(j, c): the cap size maximizing c = A_j (r - 1) / (r j + m - j), and that c."""
        r, m = self.ratio, self.members
        sums = cap_sums(self.dimension, self.pairs)[0]
        best = max(range(1, self.pairs + 1), key=lambda j: sums[j - 1] * float((r - 1) / (r * j + m - j)))
        return best, sums[best - 1] * float((r - 1) / (r * best + m - best))

    @property
    def cap_size(self) -> int:
        """j: how many of the m members form the cap."""
        return self._best[0]

    @cached_property
    def cap_probability(self) -> Fraction:
        """p = r j / (r j + m - j): probability of reporting a member of the cap."""
        j = self.cap_size
        return self.ratio * j / (self.ratio * j + self.members - j)

    @cached_property
    def scale(self) -> float:
        """B = 1 / c = (r j + m - j) / (A_j (r - 1)): the estimate is B w."""
        return 1.0 / self._best[1]

    @cached_property
    def alignment(self) -> float:
        """s = E[<w, x~>^2]: p Q_j / j + (1 - p) (m / d - Q_j) / (m - j) (the m squares sum to m / d)."""
        if self.dimension == 1:
            return 1.0
        j, m = self.cap_size, self.members
        q = cap_sums(self.dimension, self.pairs)[1][j - 1]
        p = float(self.cap_probability)
        return p * q / j + (1.0 - p) * (m / self.dimension - q) / (m - j)

    def second_moment(self, direction_square: float) -> float:
        """E[(B w_j)^2] = B^2 (s c^2 + (1 - s)(1 - c^2) / (d - 1)) for x~_j^2 = c^2 = ``direction_square``."""
        s, d = self.alignment, self.dimension
        across = 0.0 if d == 1 else (1.0 - s) * (1.0 - direction_square) / (d - 1)
        return self.scale**2 * (s * direction_square + across)

    @cached_property
    def variance_bound(self) -> float:
        """B^2 max(s, (1 - s) / (d - 1)): bounds the variance of every coordinate of one estimate."""
        return max(self.second_moment(0.0), self.second_moment(1.0))

    def coordinate_variance(self, true_value: float = 0.0) -> float:
        """Variance bound ``variance_bound - x_j^2`` of one coordinate whose truth is ``true_value``."""
        return self.variance_bound - true_value * true_value

    def randomize(self, value: Any, *, rng: Rng | None = None) -> Floats:
        return randomize(value, self, rng=rng)


def randomize(value: Any, params: VectorPrivUnitParams, *, rng: Rng | None = None) -> Floats:
    """Report a member of a random antipodal set: from the cap around ``value`` with an exact coin.

    Parameters
    ----------
    value : sequence of float
        ``params.dimension`` finite coordinates with l2 norm <= 1 (+ 1e-9 float slack).
    params : VectorPrivUnitParams
    rng : Rng, optional
        Defaults to the OS CSPRNG.
    """
    d = params.dimension
    x = check_vector("vector_privunit value", value, d)
    rng = resolve_rng(rng)
    target = ball_target("vector_privunit", x, rng)
    directions = [uniform_direction(d, rng) for _ in range(params.pairs)]
    # Members 2i and 2i + 1 are V_i and -V_i; their dots are exact negatives of each other.
    dots = [dot(w, target) for w in directions]  # left to right (docs/protocol.md §12.5)
    keys = [(dots[i // 2] if i % 2 == 0 else -dots[i // 2], -i) for i in range(params.members)]
    # Descending dot, ties to the lower index: a total order that depends on (S, x~) only.
    ranked = sorted(range(params.members), key=lambda i: keys[i], reverse=True)
    j = params.cap_size
    p = params.cap_probability
    side = ranked[:j] if rng.bernoulli(p.numerator, p.denominator) else ranked[j:]
    member = side[rng.randbelow(len(side))]
    w = directions[member // 2]
    if member % 2:
        w = [-v for v in w]
    return Floats(struct.unpack(f"<{d}f", struct.pack(f"<{d}f", *w)))
