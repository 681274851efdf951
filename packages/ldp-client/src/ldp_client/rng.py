"""Randomness sources.

Every randomized function of the SDK takes ``rng=None``, which means the operating system's
CSPRNG (:class:`SecureRng`). :class:`SeededRng` exists for tests and simulations only: it is
reproducible and therefore offers no privacy.

All privacy-relevant coins are exact: :meth:`Rng.bernoulli` draws ``randbelow(den) < num`` with
integers, never ``random() < p`` with a float.
"""

from __future__ import annotations

import abc
import math
import os
import random
import secrets
from typing import Protocol, runtime_checkable

__all__ = ["Rng", "SecureRng", "SeededRng", "resolve_rng"]

_TWO_POW_53 = 2.0**-53


@runtime_checkable
class Rng(Protocol):
    """The randomness interface every mechanism and encoder uses."""

    def randbelow(self, n: int) -> int:
        """Uniform integer in ``[0, n)``; ``n >= 1``."""
        ...

    def randbits(self, k: int) -> int:
        """Uniform integer in ``[0, 2**k)``."""
        ...

    def bernoulli(self, num: int, den: int) -> bool:
        """``True`` with probability exactly ``num / den`` (``0 <= num <= den``, ``den >= 1``)."""
        ...

    def uniform(self) -> float:
        """A float uniform on the 2**53 multiples of 2**-53 in ``[0, 1)``."""
        ...

    def gauss(self) -> float:
        """A standard normal variate (not privacy-carrying: used for directions only)."""
        ...

    def token_bytes(self, n: int) -> bytes:
        """``n`` uniform random bytes."""
        ...


class _RngBase(abc.ABC):
    """Derived draws on top of ``randbelow``, ``randbits`` and ``token_bytes``."""

    @abc.abstractmethod
    def randbelow(self, n: int) -> int:
        """Uniform integer in ``[0, n)``."""

    @abc.abstractmethod
    def randbits(self, k: int) -> int:
        """Uniform integer in ``[0, 2**k)``."""

    @abc.abstractmethod
    def token_bytes(self, n: int) -> bytes:
        """``n`` uniform random bytes."""

    def bernoulli(self, num: int, den: int) -> bool:
        return self.randbelow(den) < num

    def uniform(self) -> float:
        return self.randbits(53) * _TWO_POW_53

    def gauss(self) -> float:
        # Box-Muller on 53-bit uniforms; 1 - u lies in (0, 1], so the log is finite.
        u1 = 1.0 - self.uniform()
        u2 = self.uniform()
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


class SecureRng(_RngBase):
    """The operating system's CSPRNG (``secrets`` / ``os.urandom``): the default everywhere."""

    __slots__ = ()

    def randbelow(self, n: int) -> int:
        return secrets.randbelow(n)

    def randbits(self, k: int) -> int:
        return secrets.randbits(k)

    def token_bytes(self, n: int) -> bytes:
        return os.urandom(n)


class SeededRng(_RngBase):
    """A reproducible generator for tests and simulations. Never use it on a real device.

    Parameters
    ----------
    seed : int
        Any integer; equal seeds give equal streams.
    """

    __slots__ = ("_gen",)

    def __init__(self, seed: int) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self._gen = random.Random(seed)

    def randbelow(self, n: int) -> int:
        return self._gen.randrange(n)

    def randbits(self, k: int) -> int:
        return self._gen.getrandbits(k) if k > 0 else 0

    def token_bytes(self, n: int) -> bytes:
        return self._gen.getrandbits(8 * n).to_bytes(n, "little") if n > 0 else b""


_SECURE = SecureRng()


def resolve_rng(rng: Rng | None) -> Rng:
    """Return ``rng``, or the shared :class:`SecureRng` when it is ``None``."""
    if rng is None:
        return _SECURE
    if isinstance(rng, _RngBase):  # fast path: the protocol check below costs microseconds
        return rng
    if not isinstance(rng, Rng):
        raise TypeError(f"rng must provide the ldp_client.rng.Rng interface, got {type(rng).__name__}")
    return rng
