"""Memoized randomness: a device answers the same question with the same report, bit for bit.

A device keeps a 32-byte secret, drawn once from the OS CSPRNG when its state directory is
created and never sent anywhere (``device.json``). Every random choice of a report is drawn from a
stream keyed by the secret and the report's public context (RAPPOR's memoization, Erlingsson et
al. 2014, made exact), so a device whose ledger was rolled back -- a backup restored, a file lost
-- and that is asked the same question again reproduces its earlier report instead of releasing a
fresh one: the collector sees a duplicate and learns nothing new about an unchanged point.

Derivation (HMAC-SHA256 everywhere; ``secret`` is the device's 32-byte secret)::

    ctx(label, p_1, ..., p_n) = "ldp-client/memo/v1" || enc(label) || enc(p_1) || ... || enc(p_n)
    enc(x)    = uint32_be(len(b)) || b,  with b = UTF-8 of a string, 8-byte big-endian of an integer
                in [0, 2^64), or the bytes themselves
    group     : KeyedRng(HMAC(secret, ctx("group", campaign_id)))   -> randbelow(sum(weights))
    report id : HMAC(secret, ctx("report-id", campaign_id, round))[:16]
    coins     : KeyedRng(HMAC(secret, ctx("coins", campaign_id, round, group, index,
                                          SHA-256(component), seed)))

where :class:`~ldp_client.rng.KeyedRng` is HMAC-SHA256 in counter mode, ``index`` the component's
position in its task, ``SHA-256(component)`` the digest of the component's msgpack form
(``msgpack.packb(component.to_dict())``: encoder and mechanism with every parameter) and
``seed`` the collector-assigned hash seed as an 8-byte integer, or empty bytes when none was
assigned (a seeded mechanism then draws its seed from the coins).

What this buys, and what it does not:

* The same spec, point and assignment give the same report id and payloads: re-answering costs
  nothing.
* A *different* question for the same round (other parameters, another assigned seed, another
  group after changed weights) gets coins that are independent of the first answer's, so the two
  answers together cost at most the sum of their epsilons (sequential composition) -- never more,
  as reused coins under a different mechanism could (a mechanism that reveals its coins next to one
  that masks the point with them would reveal the point). The device's ledger normally refuses
  such a second answer; only a rolled-back ledger no longer knows of the first.
* The report id depends on campaign and round only, so an honest collector drops any second
  answer for the round as a duplicate.
* A changed point gives a new report (the coins are the same, the input is not); a lost secret
  (the whole state directory wiped) makes a new device.

This derivation is internal to a device: the collector never computes it and cannot check it.
It is pinned by test vectors so that the SDK's answers stay stable across releases (a changed
derivation would turn every re-answer after an upgrade into a fresh report).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from typing import TYPE_CHECKING

import msgpack

from .report import REPORT_ID_BYTES
from .rng import KeyedRng

if TYPE_CHECKING:
    from .spec import Component

__all__ = ["SECRET_BYTES", "Memo", "context"]

#: Length of a device secret.
SECRET_BYTES = 32
_PREFIX = b"ldp-client/memo/v1"


@functools.lru_cache(maxsize=1024, typed=True)  # a device meets few campaigns, rounds and components
def _enc(part: str | int | bytes) -> bytes:
    data: bytes
    if isinstance(part, bytes):
        data = part
    elif isinstance(part, str):
        data = part.encode("utf-8")
    elif type(part) is int and 0 <= part < 2**64:  # not a bool
        data = part.to_bytes(8, "big")
    else:
        raise TypeError(f"a context part must be bytes, str or an int in [0, 2^64), got {part!r:.40}")
    return len(data).to_bytes(4, "big") + data


def context(label: str, *parts: str | int | bytes) -> bytes:
    """The unambiguous byte string of ``label`` and ``parts`` (see the module docstring)."""
    return _PREFIX + _enc(label) + b"".join(_enc(p) for p in parts)


@functools.lru_cache(maxsize=64)  # components are frozen and hashable; a device meets few of them
def component_digest(component: Component) -> bytes:
    """SHA-256 of the component's msgpack form: its encoder and mechanism with every parameter."""
    return hashlib.sha256(msgpack.packb(component.to_dict(), use_bin_type=True)).digest()


class Memo:
    """The memoized randomness of one device.

    Parameters
    ----------
    secret : bytes
        The device's secret (:data:`SECRET_BYTES` bytes).
    """

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
            raise ValueError(f"a device secret must be {SECRET_BYTES} bytes")
        self._secret = secret

    def __repr__(self) -> str:
        return "Memo(<secret>)"  # never print the secret

    def _key(self, label: str, *parts: str | int | bytes) -> bytes:
        return hmac.digest(self._secret, context(label, *parts), hashlib.sha256)

    def group_rng(self, campaign_id: str) -> KeyedRng:
        """The stream the device's group in ``campaign_id`` is drawn from."""
        return KeyedRng(self._key("group", campaign_id))

    def report_id(self, campaign_id: str, round: int) -> bytes:
        """The id of the device's report in ``campaign_id`` round ``round``."""
        return self._key("report-id", campaign_id, round)[:REPORT_ID_BYTES]

    def coins(self, campaign_id: str, round: int, group: int, index: int, component: Component,
              seed: int | None) -> KeyedRng:
        """The stream every coin of component ``index`` of the device's task is drawn from."""
        return KeyedRng(self._key("coins", campaign_id, round, group, index, component_digest(component),
                                  b"" if seed is None else seed))
