"""Token-bucket rate limits keyed by device, bearer token or peer address, in bounded memory.

The collector's one token-bucket implementation: the per-device and per-token limits of the
service and the enrolment limits of :mod:`ldp_collector.defences` are all :class:`RateLimiter`
tables. A :class:`RateLimiter` holds one bucket per key (a device's token digest, a peer address ...):
``capacity`` tokens refilled at ``rate`` tokens per second. A request costing ``n`` tokens is
admitted when the bucket holds ``min(n, capacity)`` of them; it then takes all ``n``, so the
bucket may go into debt. That way a batch larger than the burst is still admitted from a full
bucket, and the long-run rate stays exactly ``rate`` however the requests are sized. A refused
request learns how long until it would be admitted (:attr:`RateLimitedError.retry_after`), which
the service sends as ``google.rpc.RetryInfo``.

Memory is bounded: at most ``max_keys`` buckets are kept, in least-recently-used order. Forgetting
a full bucket loses nothing (a key without a bucket starts full); forgetting one that is still
refilling lets that key burst once more, which only happens when more than ``max_keys`` keys were
active within one refill time -- counted in :attr:`RateLimiter.evicted_active` so it shows.

Status code: a refusal is ``RESOURCE_EXHAUSTED`` (the gRPC code for an exhausted per-user
quota), unlike ``UNAVAILABLE``, which says the whole collector is overloaded. The SDK client
retries both after the RetryInfo delay.

A clock that steps back (it should not: the default is monotonic) never takes tokens away.

This module has no gRPC dependency; the service applies the limits.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

from .errors import CollectorError, ErrorReason

__all__ = ["DEFAULT_MAX_KEYS", "RateLimitedError", "RateLimiter"]

#: Tokens of rounding slack: a refill computed as 0.999999999... tokens admits a 1-token request
#: (a wait of a few nanoseconds would otherwise be answered, and clients would spin on it).
_SLACK = 1e-9
#: Buckets a table keeps by default (``rate_limit_max_keys``, the enrolment limiter's peers).
DEFAULT_MAX_KEYS = 65_536


class RateLimitedError(CollectorError):
    """A device or token exceeded its rate limit; retry after ``retry_after`` seconds.

    Attributes
    ----------
    limit : str
        Which limit refused the call (``"device"`` or ``"token"``).
    retry_after : float
        Seconds until the call would be admitted.
    """

    code = "RESOURCE_EXHAUSTED"
    reason = ErrorReason.RATE_LIMITED

    def __init__(self, message: str, *, limit: str, retry_after: float) -> None:
        super().__init__(message)
        self.limit = limit
        self.retry_after = retry_after


class RateLimiter:
    """Token buckets per key, at most ``max_keys`` of them (least recently used forgotten first).

    Parameters
    ----------
    name : str
        The limit's name in errors and metrics (``"device"``, ``"token"``).
    rate : float
        Tokens added per second, > 0.
    capacity : float
        Tokens a full bucket holds (the burst), >= 1.
    max_keys : int
        Buckets kept, >= 1.
    unit : str
        What a token stands for in messages (``"reports"``, ``"requests"``).
    clock : callable, optional
        Monotonic seconds (default :func:`time.monotonic`); injectable for tests.

    Notes
    -----
    Cost: O(1) per :meth:`acquire` (one dictionary look-up and move); about 150 bytes per key.
    Thread-safe.
    """

    def __init__(self, name: str, *, rate: float, capacity: float, max_keys: int, unit: str = "requests",
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be a finite number > 0, got {rate!r}")
        if not (isinstance(capacity, (int, float)) and math.isfinite(capacity) and capacity >= 1):
            raise ValueError(f"capacity must be a finite number >= 1, got {capacity!r}")
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise ValueError(f"max_keys must be an integer >= 1, got {max_keys!r}")
        self.name = name
        self.rate = float(rate)
        self.capacity = float(capacity)
        self.max_keys = max_keys
        self.unit = unit
        self._clock = clock
        self._lock = threading.Lock()
        # key -> [tokens, time of that count]
        self._buckets: OrderedDict[Hashable, list[float]] = OrderedDict()
        #: Buckets forgotten while still refilling (their keys could burst again).
        self.evicted_active = 0

    def __len__(self) -> int:
        return len(self._buckets)

    def acquire(self, key: Hashable, cost: float = 1.0) -> None:
        """Take ``cost`` tokens from ``key``'s bucket, or refuse.

        Raises
        ------
        RateLimitedError
            The bucket holds fewer than ``min(cost, capacity)`` tokens; ``retry_after`` is the time
            until it holds enough.
        """
        wait = self.try_acquire(key, cost)
        if wait > 0.0:
            raise RateLimitedError(
                f"{self.name} rate limit exceeded ({self.rate:g} {self.unit}/s, burst {self.capacity:g}); "
                f"retry in {wait:.3f} s", limit=self.name, retry_after=wait)

    def try_acquire(self, key: Hashable, cost: float = 1.0) -> float:
        """Like :meth:`acquire`, returning 0.0 when admitted, else the seconds to wait."""
        now = self._clock()
        with self._lock:
            bucket = self._refilled(key, now)
            wait = self._wait(bucket[0], cost)
            if wait == 0.0:
                bucket[0] -= cost
            return wait

    def wait(self, key: Hashable, cost: float = 1.0) -> float:
        """The seconds until ``key``'s bucket would admit ``cost`` tokens (0.0: now), taking none.

        With :meth:`try_acquire` after it, a caller holding its own lock admits a request only
        when several tables all have room (the enrolment limiter: one peer's bucket and the
        global one), so a request one table refuses takes nothing from the others.
        """
        now = self._clock()
        with self._lock:
            return self._wait(self._refilled(key, now)[0], cost)

    def refund(self, key: Hashable, cost: float = 1.0) -> None:
        """Give back tokens taken for a request that was then not served (e.g. shed by the pool)."""
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is not None:
                bucket[0] = min(self.capacity, bucket[0] + cost)

    def _refilled(self, key: Hashable, now: float) -> list[float]:
        """``key``'s bucket refilled up to ``now`` (a new key gets a full one); holds ``_lock``."""
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._evict(now)
            bucket = [self.capacity, now]
            self._buckets[key] = bucket
        else:
            self._buckets.move_to_end(key)
            if now > bucket[1]:
                bucket[0] = min(self.capacity, bucket[0] + (now - bucket[1]) * self.rate)
                bucket[1] = now
        return bucket

    def _wait(self, tokens: float, cost: float) -> float:
        need = min(float(cost), self.capacity)
        return 0.0 if tokens + _SLACK >= need else (need - tokens) / self.rate

    def _evict(self, now: float) -> None:
        _, (tokens, then) = self._buckets.popitem(last=False)
        if tokens + (now - then) * self.rate < self.capacity:
            self.evicted_active += 1
