"""Randomness sources.

Every randomized function of the SDK takes ``rng=None``, which means the operating system's
CSPRNG (:class:`SecureRng`). :class:`SeededRng` exists for tests and simulations only: it is
reproducible and therefore offers no privacy. :class:`KeyedRng` is the deterministic stream of a
secret key (HMAC-SHA256 in counter mode) that a device's memoized randomness draws its coins from
(:mod:`ldp_client.memo`).

All privacy-relevant coins are exact: :meth:`Rng.bernoulli` draws ``randbelow(den) < num`` with
integers, never ``random() < p`` with a float.
"""

from __future__ import annotations

import abc
import hashlib
import hmac
import math
import os
import random
import secrets
from typing import Protocol, runtime_checkable

__all__ = ["KeyedRng", "Rng", "SecureRng", "SeededRng", "is_secure", "resolve_rng", "rng_name"]

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


class KeyedRng(_RngBase):
    """The deterministic stream of a secret key: HMAC-SHA256 in counter mode.

    The stream is the bit string ``B_0 || B_1 || ...`` with ``B_i = HMAC-SHA256(key, uint64_be(i))``
    (256 bits each, most significant bit first), read from the start; every draw takes its next bits:

    * ``randbits(k)``: the next ``k`` bits as an unsigned integer, most significant first (``k = 0``
      takes nothing and gives 0);
    * ``token_bytes(n)``: ``randbits(8 n)`` as ``n`` big-endian bytes;
    * ``randbelow(n)``: ``0`` for ``n = 1`` (nothing taken); otherwise ``v = randbits(b)`` with
      ``b = bit_length(n - 1)``, repeated until ``v < n`` (rejection sampling: exactly uniform);
    * ``bernoulli``, ``uniform`` and ``gauss`` as for every generator here (``randbelow(den) < num``,
      ``randbits(53) * 2^-53``, Box-Muller on two such uniforms).

    Equal keys give equal streams, so a device that draws every coin of a report from a key derived
    from its secret and the report's public context reproduces the report bit for bit
    (:mod:`ldp_client.memo`). As long as the key is secret and uniformly random, the stream is
    indistinguishable from uniform bits (HMAC-SHA256 is a PRF).

    Parameters
    ----------
    key : bytes
        At least 16 bytes (32 from :mod:`ldp_client.memo`).
    """

    __slots__ = ("_bits", "_counter", "_key", "_left")

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes):
            raise TypeError(f"key must be bytes, got {type(key).__name__}")
        if len(key) < 16:
            raise ValueError(f"key must have at least 16 bytes, got {len(key)}")
        self._key = key
        self._counter = 0  # blocks computed so far
        self._bits = 0  # the unread bits, as an integer of self._left bits
        self._left = 0

    def randbits(self, k: int) -> int:
        if k <= 0:
            return 0
        bits, left = self._bits, self._left
        while left < k:  # append the next block(s)
            block = hmac.digest(self._key, self._counter.to_bytes(8, "big"), hashlib.sha256)
            self._counter += 1
            bits = (bits << 256) | int.from_bytes(block, "big")
            left += 256
        left -= k
        self._bits, self._left = bits & ((1 << left) - 1), left
        return bits >> left

    def randbelow(self, n: int) -> int:
        if n <= 0:
            raise ValueError(f"randbelow needs n >= 1, got {n}")
        if n == 1:
            return 0
        k = (n - 1).bit_length()
        while True:
            v = self.randbits(k)
            if v < n:
                return v

    def token_bytes(self, n: int) -> bytes:
        return self.randbits(8 * n).to_bytes(n, "big") if n > 0 else b""


_SECURE = SecureRng()


def is_secure(rng: Rng | None) -> bool:
    """Whether ``rng`` is the OS CSPRNG (``None`` or a :class:`SecureRng`)."""
    return rng is None or type(rng) is SecureRng


def rng_name(rng: Rng) -> str:
    """The qualified class name of ``rng`` (what a ledger records of an injected generator)."""
    cls = type(rng)
    return f"{cls.__module__}.{cls.__qualname__}"


def resolve_rng(rng: Rng | None) -> Rng:
    """Return ``rng``, or the shared :class:`SecureRng` when it is ``None``."""
    if rng is None:
        return _SECURE
    if isinstance(rng, _RngBase):  # fast path: the protocol check below costs microseconds
        return rng
    if not isinstance(rng, Rng):
        raise TypeError(f"rng must provide the ldp_client.rng.Rng interface, got {type(rng).__name__}")
    return rng
