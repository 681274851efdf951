"""Poisoning defences (DESIGN.md §5, §6): device identities, assigned randomness, anomaly flags.

A fake device cannot be told from a real one by its reports alone -- every output of an LDP
mechanism is possible for every input -- so the defences limit what one identity can do and
make the cheap attacks visible:

Enrolment (:class:`EnrolmentAuthority`, :class:`EnrolmentLimiter`)
    ``DeviceService.Enroll`` hands out a device token ``"ldp1." + base64url(device_id ||
    HMAC-SHA256(secret, "ldp.v1 device" || device_id))`` with a fresh 16-byte random
    ``device_id``. Tokens are stateless: every collector process or host holding the shared
    ``enrolment_secret`` verifies them (in constant time) without a lookup. Enrolment is rate
    limited by token buckets, one global and one per peer address (a bounded table), so the
    number of identities an attacker controls grows at most linearly in time.
Assigned randomness (:meth:`EnrolmentAuthority.assignment`, :func:`check_assignment`)
    For an enrolled device, the round spec comes with a :class:`~ldp_client.device.RoundAssignment`
    derived by HMAC from (secret, device id, campaign, round): the report id and one 32-bit hash
    seed per component. It is public randomness fixed before any report of the round and
    independent of the data, so privacy is unchanged (DESIGN §6). At ingestion, a report of an
    enrolled device must carry exactly its assigned id and seeds, so (i) a device sends one report
    per round (a second one has the same id: DUPLICATE, no effect) and (ii) a local-hashing device
    cannot pick a seed under which all its target values share one bucket -- the seed choice that
    makes the maximal-gain attack on OLH so strong.
Plausibility
    Unary-encoding reports whose Hamming weight no honest device would produce are rejected in
    :mod:`ldp_collector.ingest` (:func:`~ldp_collector.ingest.hamming_weight_limits`). A single
    report with few ones is still possible for an honest device, but many of them are not: at the
    close of a round, :func:`weight_excess` compares the number of reports of each Hamming weight
    with its honest distribution and flags the weights that are over-represented beyond chance
    (Bonferroni over the weights) -- the signature of fake reports that all set the same number
    of bits, padded or not.
Anomaly flags (:func:`anomaly_flags`)
    Successive windows of one histogram campaign are compared value by value: a value whose
    estimated frequency moved by more than ``z sqrt(SE1^2 + SE2^2)``, with ``z`` the two-sided
    normal quantile at ``alpha / D`` (Bonferroni over the D values), is flagged. Without a change
    in the population the probability that any value is flagged is at most about ``alpha``
    (normal approximation of the estimates).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from numpy.typing import NDArray

from ldp_client.device import SEEDED_MECHANISMS, RoundAssignment
from ldp_client.errors import ProtocolError
from ldp_client.mechanisms.local_hashing import LocalHashingParams
from ldp_client.payload import HashedValue, SignedVector
from ldp_client.report import REPORT_ID_BYTES, Report
from ldp_client.spec import MAX_COMPONENTS, Component, RoundSpec

from .ratelimit import DEFAULT_MAX_KEYS, RateLimiter

__all__ = [
    "DEFAULT_ANOMALY_ALPHA",
    "DEVICE_ID_BYTES",
    "MIN_SECRET_BYTES",
    "TOKEN_PREFIX",
    "AnomalyFlag",
    "DeviceIdentity",
    "EnrolmentAuthority",
    "EnrolmentLimiter",
    "anomaly_flags",
    "anomaly_threshold",
    "check_assignment",
    "honest_weight_distribution",
    "peer_address",
    "weight_excess",
]

#: Bytes of a device id.
DEVICE_ID_BYTES = 16
#: Shortest accepted enrolment secret (UTF-8 bytes).
MIN_SECRET_BYTES = 16
#: Every enrolled device token starts with this (versioned format).
TOKEN_PREFIX = "ldp1."
#: Family-wise false-flag rate of the round-over-round comparison.
DEFAULT_ANOMALY_ALPHA = 0.01

_MAC_BYTES = 32
_TOKEN_BYTES = DEVICE_ID_BYTES + _MAC_BYTES
_TOKEN_CHARS = len(TOKEN_PREFIX) + math.ceil(_TOKEN_BYTES * 4 / 3)
# Domain separation: the token MAC and the assignment derivations never share an input.
_TOKEN_LABEL = b"ldp.v1 device\x00"
_ASSIGNMENT_LABEL = b"ldp.v1 assignment\x00"
_SEEDS_LABEL = b"ldp.v1 hash seeds\x00"
#: The one key of the enrolment limiter's global table.
_GLOBAL_KEY = "*"


@dataclass(frozen=True)
class DeviceIdentity:
    """An enrolled device, as the collector knows it after verifying its token."""

    device_id: bytes

    @property
    def hex(self) -> str:
        return self.device_id.hex()


class EnrolmentAuthority:
    """Issues and verifies device tokens and derives round assignments from one shared secret.

    Parameters
    ----------
    secret : str or bytes
        At least 16 bytes; every collector process and host serving the same campaigns must hold
        the same secret (tokens and assignments of one are valid at all).

    Raises
    ------
    ValueError
        A secret shorter than 16 bytes.
    """

    def __init__(self, secret: str | bytes) -> None:
        key = secret.encode() if isinstance(secret, str) else bytes(secret)
        if len(key) < MIN_SECRET_BYTES:
            raise ValueError(f"enrolment_secret must be at least {MIN_SECRET_BYTES} bytes, got {len(key)}")
        self._key = key

    def _mac(self, label: bytes, message: bytes) -> bytes:
        return hmac.new(self._key, label + message, hashlib.sha256).digest()

    def issue(self, device_id: bytes | None = None) -> str:
        """A new device token (``device_id`` drawn from the OS CSPRNG unless given, for tests)."""
        if device_id is None:
            device_id = secrets.token_bytes(DEVICE_ID_BYTES)
        if not isinstance(device_id, bytes) or len(device_id) != DEVICE_ID_BYTES:
            raise ValueError(f"device_id must be {DEVICE_ID_BYTES} bytes")
        raw = device_id + self._mac(_TOKEN_LABEL, device_id)
        return TOKEN_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def verify(self, token: str) -> DeviceIdentity | None:
        """The identity of a token this authority issued, else ``None`` (forged, truncated, garbage).

        The MAC comparison takes the same time wherever the first differing byte is
        (:func:`hmac.compare_digest`); malformed tokens are refused before any MAC is computed.
        """
        if not isinstance(token, str) or len(token) != _TOKEN_CHARS or not token.startswith(TOKEN_PREFIX):
            return None
        body = token[len(TOKEN_PREFIX):]
        try:
            raw = base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            return None
        if len(raw) != _TOKEN_BYTES:
            return None
        device_id, mac = raw[:DEVICE_ID_BYTES], raw[DEVICE_ID_BYTES:]
        if not hmac.compare_digest(mac, self._mac(_TOKEN_LABEL, device_id)):
            return None
        return DeviceIdentity(device_id)

    def assignment(self, device_id: bytes, campaign_id: str, round: int) -> RoundAssignment:
        """The report id and hash seeds of ``device_id`` in one round of one campaign.

        Deterministic in (secret, device id, campaign, round), pseudo-random and independent across
        devices, campaigns and rounds; never depends on any report.
        """
        campaign = campaign_id.encode()
        message = (device_id + len(campaign).to_bytes(2, "big") + campaign + round.to_bytes(4, "big"))
        report_id = self._mac(_ASSIGNMENT_LABEL, message)[:REPORT_ID_BYTES]
        seed_bytes = self._mac(_SEEDS_LABEL, message)  # 32 bytes: 8 seeds of 32 bits
        seeds = tuple(int.from_bytes(seed_bytes[4 * i:4 * i + 4], "big") for i in range(MAX_COMPONENTS))
        return RoundAssignment(report_id=report_id, hash_seeds=seeds)


def check_assignment(report: Report, spec: RoundSpec, assignment: RoundAssignment) -> None:
    """Raise ``ProtocolError`` unless ``report`` carries exactly its assigned report id and seeds.

    ``report`` must already be validated against ``spec`` (its group reports, one payload per
    component); the seed of every component whose mechanism draws one (local hashing, bucketized
    vectors) must equal ``assignment.hash_seeds[i]``.
    """
    if not hmac.compare_digest(report.report_id, assignment.report_id):
        raise ProtocolError(f"report_id is not the one assigned to this device for round {report.round} "
                            f"(an enrolled device sends one report per round, with the id of its round spec)")
    task = spec.task_for(report.group)
    if task is None:  # validate_report refuses such reports first
        raise ProtocolError(f"group {report.group} does not report in round {report.round}")
    for i, (component, payload) in enumerate(zip(task.components, report.payloads)):
        if not isinstance(component.mechanism, SEEDED_MECHANISMS):
            continue
        assert isinstance(payload, (HashedValue, SignedVector))  # checked by the mechanism
        if i >= len(assignment.hash_seeds) or payload.seed != _carried_seed(component, assignment.hash_seeds[i]):
            raise ProtocolError(f"payload {i}: hash seed {payload.seed} is not the seed assigned to this device "
                                f"for round {report.round}")


def _carried_seed(component: Component, assigned: int) -> int:
    """The seed a report carries for an assigned one: the pool's seed ``assigned mod S`` in a
    local-hashing round with a seed pool (``docs/protocol.md`` §14.3), else the assigned seed."""
    mechanism = component.mechanism
    return mechanism.assigned_seed(assigned) if isinstance(mechanism, LocalHashingParams) else assigned


class EnrolmentLimiter:
    """Admission of enrolments: one global token bucket and one per peer address (thread-safe).

    Both are :class:`~ldp_collector.ratelimit.RateLimiter` tables (the global one has a single key).

    Parameters
    ----------
    rate, burst : float
        Enrolments per second over all peers, and the largest burst.
    peer_rate, peer_burst : float
        The same for one peer address.
    max_peers : int
        Peer buckets kept (least recently used evicted first): memory stays bounded whatever the
        number of addresses. An evicted peer starts again with a full bucket, which the global
        bucket still bounds.
    clock : callable
        Monotonic seconds (injectable for tests).
    """

    def __init__(self, *, rate: float, burst: float, peer_rate: float, peer_burst: float,
                 max_peers: int = DEFAULT_MAX_KEYS, clock: Callable[[], float] = time.monotonic) -> None:
        for name, value in (("rate", rate), ("peer_rate", peer_rate)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"enrolment {name} must be a positive number, got {value!r}")
        for name, value in (("burst", burst), ("peer_burst", peer_burst)):
            if not (math.isfinite(value) and value >= 1):
                raise ValueError(f"enrolment {name} must be at least 1, got {value!r}")
        if max_peers < 1:
            raise ValueError(f"max_peers must be >= 1, got {max_peers}")
        # One lock over both tables: the two look-ups and the two takes of one admission are atomic.
        self._lock = threading.Lock()
        self._global = RateLimiter("enrolment", rate=rate, capacity=burst, max_keys=1, unit="enrolments",
                                   clock=clock)
        self._peers = RateLimiter("enrolment_peer", rate=peer_rate, capacity=peer_burst, max_keys=max_peers,
                                  unit="enrolments", clock=clock)

    def __len__(self) -> int:
        """Peer buckets currently kept."""
        return len(self._peers)

    def admit(self, peer: str) -> float | None:
        """Take one enrolment for ``peer``: ``None`` when admitted, else the seconds to wait.

        A refused call takes no token from either bucket, so a peer over its own limit does not
        drain the global one.
        """
        with self._lock:
            wait = max(self._peers.wait(peer), self._global.wait(_GLOBAL_KEY))
            if wait > 0:
                return wait
            # Both have room (tokens only grow with time, so the takes below admit too).
            self._peers.try_acquire(peer)
            self._global.try_acquire(_GLOBAL_KEY)
            return None


def peer_address(peer: str) -> str:
    """The address part of a gRPC peer string (``ipv4:127.0.0.1:5000`` -> ``ipv4:127.0.0.1``)."""
    if peer.startswith(("ipv4:", "ipv6:")):
        host, _, port = peer.rpartition(":")
        if port.isdigit() and host not in ("ipv4", "ipv6"):
            return host
    return peer


# -- round-over-round anomaly flags -----------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class AnomalyFlag:
    """A value whose estimated frequency moved more than chance allows between two windows."""

    value: int
    previous: float
    current: float
    #: (current - previous) / sqrt(SE1^2 + SE2^2).
    z: float

    def describe(self) -> str:
        return (f"value {self.value}: frequency moved from {self.previous:.4g} to {self.current:.4g} "
                f"(z = {self.z:+.1f})")


def anomaly_threshold(domain_size: int, alpha: float = DEFAULT_ANOMALY_ALPHA) -> float:
    """The two-sided normal quantile at ``alpha / domain_size`` (Bonferroni over the values)."""
    if domain_size < 1:
        raise ValueError(f"domain_size must be >= 1, got {domain_size}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return NormalDist().inv_cdf(1.0 - alpha / (2.0 * domain_size))


def anomaly_flags(previous: Sequence[float], previous_se: Sequence[float], current: Sequence[float],
                  current_se: Sequence[float], *, alpha: float = DEFAULT_ANOMALY_ALPHA) -> list[AnomalyFlag]:
    """Values whose frequency changed significantly between two windows (module docstring).

    Parameters
    ----------
    previous, previous_se : sequence of float
        Estimated frequencies (counts / reports) of every value in the earlier window, and their
        standard errors.
    current, current_se : sequence of float
        The same for the later window (same values, same order).
    alpha : float
        Family-wise false-flag rate over the whole domain, in (0, 1).

    Returns
    -------
    list of AnomalyFlag
        Sorted by decreasing ``|z|``.
    """
    n = len(previous)
    if not (len(previous_se) == len(current) == len(current_se) == n):
        raise ValueError("anomaly_flags needs four sequences of the same length, got "
                         f"{[len(previous), len(previous_se), len(current), len(current_se)]}")
    if n == 0:
        return []
    threshold = anomaly_threshold(n, alpha)
    flags = []
    for value, (f1, s1, f2, s2) in enumerate(zip(previous, previous_se, current, current_se)):
        scale = math.hypot(s1, s2)
        if not scale > 0:
            continue
        z = (f2 - f1) / scale
        if abs(z) > threshold:
            flags.append(AnomalyFlag(value=value, previous=f1, current=f2, z=z))
    flags.sort(key=lambda f: -abs(f.z))
    return flags


# -- the Hamming weights of a round's unary-encoding reports ---------------------------------------

def honest_weight_distribution(domain_size: int, p: float, q: float) -> NDArray[np.float64]:
    """P[W = w] for w = 0 .. D of an honest unary-encoding report over D values.

    W = B + X with B ~ Bernoulli(p) the true value's bit and X ~ Binomial(D - 1, q) the others
    (computed in log space, exact up to rounding).
    """
    if domain_size < 2 or not 0.0 < q < 1.0 or not 0.0 < p < 1.0:
        raise ValueError(f"need domain_size >= 2 and p, q in (0, 1), got {domain_size}, {p}, {q}")
    n = domain_size - 1
    k = np.arange(n + 1, dtype=np.float64)
    # log C(n, k) by cumulative sums of log((n - j) / (j + 1)).
    steps = np.log(n - k[:-1]) - np.log(k[:-1] + 1.0)
    log_choose = np.concatenate(([0.0], np.cumsum(steps)))
    log_x = log_choose + k * math.log(q) + (n - k) * math.log1p(-q)
    x = np.exp(log_x - log_x.max())
    x /= x.sum()
    w = np.zeros(domain_size + 1)
    w[:-1] += (1.0 - p) * x
    w[1:] += p * x
    return w


def _binomial_upper_limit(trials: int, probability: float, level: float) -> int:
    """Smallest c >= trials * probability with the Chernoff bound exp(-N KL(c/N || pi)) <= level."""
    mean = trials * probability
    log_level = math.log(level)
    lo, hi = math.floor(mean) + 1, trials + 1
    while lo < hi:
        mid = (lo + hi) // 2
        a = mid / trials
        kl = a * math.log(a / probability) if a > 0 else 0.0
        if a < 1.0:
            kl += (1.0 - a) * math.log((1.0 - a) / (1.0 - probability))
        if -trials * kl <= log_level:
            hi = mid
        else:
            lo = mid + 1
    return lo


def weight_excess(weight_counts: Sequence[int], domain_size: int, p: float, q: float, *,
                  alpha: float = DEFAULT_ANOMALY_ALPHA) -> list[tuple[int, int, float]]:
    """Hamming weights with more reports than honest devices produce, beyond chance.

    Parameters
    ----------
    weight_counts : sequence of int
        ``weight_counts[w]``: reports of the round with ``w`` bits set, w = 0 .. D.
    domain_size, p, q : int, float, float
        The unary encoding's D and probabilities.
    alpha : float
        Family-wise false-flag rate: each of the D + 1 weights is tested at ``alpha / (D + 1)``
        with the Chernoff bound of the binomial upper tail, so an honest round raises any flag
        with probability at most alpha (conservative).

    Returns
    -------
    list of (int, int, float)
        ``(weight, observed, expected)`` of every over-represented weight.
    """
    counts = np.asarray(weight_counts, dtype=np.int64)
    if counts.shape != (domain_size + 1,):
        raise ValueError(f"weight_counts must have {domain_size + 1} entries, got {counts.shape}")
    total = int(counts.sum())
    if total == 0:
        return []
    honest = honest_weight_distribution(domain_size, p, q)
    level = alpha / (domain_size + 1)
    out = []
    for w in np.flatnonzero(counts > honest * total).tolist():
        pi = float(honest[w])
        observed = int(counts[w])
        if pi <= 0.0 or (pi < 1.0 and observed >= _binomial_upper_limit(total, pi, level)):
            out.append((w, observed, pi * total))
    return out
