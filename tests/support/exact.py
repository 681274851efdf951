"""Exact output distributions of randomized code, by enumerating every path of its coins.

``output_distribution(fn)`` runs ``fn(rng)`` once per path through its random choices with an
:class:`EnumeratingRng` that replays a prefix of choices, so the distribution it returns is the
one the *real* code realizes (not a formula copied from it), with exact rational probabilities.

Branching per call: ``bernoulli(num, den)`` -> 2 branches with probabilities num/den and
1 - num/den; ``randbelow(n)`` -> n equally likely branches (only small n are enumerable);
``randbits(k)`` -> 2**k branches. Continuous draws (``uniform``, ``gauss``) are not enumerable;
code under test that uses them must be given fixed values via ``fixed_uniform``/``fixed_gauss``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from fractions import Fraction
from typing import Any

from ldp_client.rng import _RngBase

__all__ = ["EnumeratingRng", "max_privacy_ratio", "output_distribution"]


class _PathDone(Exception):
    pass


class EnumeratingRng(_RngBase):
    """Replays ``choices`` and records the branching of every draw (see the module docstring)."""

    def __init__(self, choices: list[int], *, max_branching: int = 4096,
                 fixed_uniform: Callable[[], float] | None = None,
                 fixed_gauss: Callable[[], float] | None = None,
                 max_depth: int = 10_000) -> None:
        self.choices = choices
        self.pos = 0
        self.arity: list[int] = []
        self.prob = Fraction(1)
        self.max_branching = max_branching
        self._uniform = fixed_uniform
        self._gauss = fixed_gauss
        self.max_depth = max_depth

    def _choose(self, arity: int) -> int:
        if arity > self.max_branching:
            raise ValueError(f"draw with {arity} branches is too wide to enumerate")
        if self.pos >= self.max_depth:
            raise _PathDone
        choice = self.choices[self.pos] if self.pos < len(self.choices) else 0
        if self.pos >= len(self.choices):
            self.choices.append(0)
        self.arity.append(arity)
        self.pos += 1
        return choice

    def bernoulli(self, num: int, den: int) -> bool:
        c = self._choose(2)
        p = Fraction(num, den)
        self.prob *= p if c == 0 else 1 - p
        return c == 0

    def randbelow(self, n: int) -> int:
        c = self._choose(n)
        self.prob *= Fraction(1, n)
        return c

    def randbits(self, k: int) -> int:
        return self.randbelow(2**k)

    def token_bytes(self, n: int) -> bytes:
        return bytes(n)  # ids are not part of any output distribution under test

    def uniform(self) -> float:
        if self._uniform is None:
            raise ValueError("code under test drew a continuous uniform; give fixed_uniform")
        return self._uniform()

    def gauss(self) -> float:
        if self._gauss is None:
            raise ValueError("code under test drew a Gaussian; give fixed_gauss")
        return self._gauss()


def output_distribution(fn: Callable[[EnumeratingRng], Hashable], *, max_paths: int = 200_000,
                        **rng_kwargs: Any) -> dict[Hashable, Fraction]:
    """Exact distribution of ``fn(rng)`` over every path of its coins; probabilities sum to 1."""
    dist: dict[Hashable, Fraction] = {}
    choices: list[int] = []
    paths = 0
    while True:
        rng = EnumeratingRng(list(choices), **rng_kwargs)
        out = fn(rng)
        if rng.prob:
            dist[out] = dist.get(out, Fraction(0)) + rng.prob
        paths += 1
        if paths > max_paths:
            raise ValueError(f"more than {max_paths} paths")
        # odometer over the recorded branching: advance the deepest position that has room
        taken = rng.choices[: rng.pos]
        arity = rng.arity
        i = len(taken) - 1
        while i >= 0 and taken[i] + 1 >= arity[i]:
            i -= 1
        if i < 0:
            break
        choices = taken[:i] + [taken[i] + 1]
    total = sum(dist.values())
    if total != 1:
        raise AssertionError(f"path probabilities sum to {total}, not 1")
    return dist


def max_privacy_ratio(dists: list[dict[Hashable, Fraction]]) -> Fraction:
    """max over outputs y and input pairs of P[y | x] / P[y | x'] (inf-free: raises if a support differs)."""
    outputs = set().union(*dists)
    best = Fraction(1)
    for y in outputs:
        probs = [d.get(y, Fraction(0)) for d in dists]
        lo, hi = min(probs), max(probs)
        if lo == 0:
            raise AssertionError(f"output {y!r} is impossible for some input and possible for another")
        best = max(best, hi / lo)
    return best
