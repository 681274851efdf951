"""Constants and checks that several campaign kinds share, defined once.

A kind module takes from here what it shares with others (the range of ``k``, the payload cap of
a round's frequency oracles, the level of the stored intervals, the per-campaign seed of the
server's post-processing, the one-report epsilon check, the numeric-domain check); what only one
kind uses stays in its module. :class:`ProtoEnum` is the base of the kinds' parameter enums. The cap on one mechanism's epsilon is the SDK's
(:data:`ldp_client.budget.MAX_MECHANISM_EPSILON`): the two sides never keep a copy of a constant.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ldp_client.budget import MAX_MECHANISM_EPSILON
from ldp_client.encoders.base import NumericDomain
from ldp_client.encoders.projection import splitmix64, stream_key
from ldp_client.errors import InvalidParameterError
from ldp_client.mechanisms import LocalHashingParams, MechanismParams
from ldp_client.mechanisms.local_hashing import MAX_SEED_POOL, PURPOSE_SEED_POOL
from ldp_client.mechanisms.oracle_choice import FREQUENCY_ORACLES, oracle_name
from ldp_client.spec import RoundSpec

from ..errors import InvalidArgumentError
from ..estimation.frequency import MAX_POOL_CELLS
from ..model import CampaignConfig

__all__ = [
    "DEFAULT_CONFIDENCE",
    "MAX_K",
    "MAX_PAYLOAD_BITS",
    "MIN_K",
    "ProtoEnum",
    "allowed_oracles",
    "campaign_seed",
    "check_allowed_oracles",
    "check_report_epsilon",
    "check_seed_pool_size",
    "seed_pool_key",
    "with_seed_pool",
    "numeric_domain",
]

#: Range of the number of clusters of the clustering kinds (LAPLACE also takes k = 1).
MIN_K, MAX_K = 2, 256
#: Level of the intervals stored with the estimates (``GetEstimates`` can recompute others).
DEFAULT_CONFIDENCE = 0.95
#: Bits per report available to the frequency oracles of the multi-level clustering kinds.
MAX_PAYLOAD_BITS = 1024


class ProtoEnum(enum.IntEnum):
    """Base of the ``enum.IntEnum`` twins of the ``ldp.v1`` enums in the kinds' parameters.

    A proto3 enum is open: a message may carry a number its schema does not name, and the kind's
    ``resolve`` is what refuses it, with a message naming the field and the values it takes
    (``"laplace.algorithm 9 is not a known algorithm ..."``). So an unknown number becomes a
    member that names no value (``int`` and ``str`` give the number) instead of failing the
    conversion with a generic error.
    """

    @classmethod
    def _missing_(cls, value: object) -> Any:
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        member = int.__new__(cls, value)
        member._name_ = f"{cls.__name__}_{value}"
        member._value_ = value
        return member


def allowed_oracles(config: CampaignConfig) -> frozenset[str] | None:
    """The frequency oracles a campaign allows, by their SDK names (``None``: any).

    ``CampaignConfig.oracles`` holds ``ldp.v1.FrequencyOracle`` numbers, validated at creation;
    number ``n`` is :data:`~ldp_client.mechanisms.oracle_choice.FREQUENCY_ORACLES` ``[n - 1]``.
    Every kind passes this to its oracle choice, so its rounds stay within them.
    """
    if not config.oracles:
        return None
    return frozenset(FREQUENCY_ORACLES[int(n) - 1] for n in config.oracles)


def check_allowed_oracles(spec: RoundSpec, config: CampaignConfig) -> None:
    """Raise ``RuntimeError`` if ``spec`` uses a frequency oracle the campaign does not allow.

    The collector's last check before it publishes a round: the kinds already choose within the
    allowed oracles, so a violation is an engine bug, never a spec devices see.
    """
    allowed = allowed_oracles(config)
    if allowed is None:
        return
    used = {oracle_name(c.mechanism) for task in spec.tasks for c in task.components} - {None}
    outside = sorted(str(name) for name in used - allowed)
    if outside:
        raise RuntimeError(
            f"the engine planned round {spec.round} with frequency oracle(s) {', '.join(outside)}, outside the "
            f"campaign's oracles {', '.join(sorted(allowed))}")


def campaign_seed(config: CampaignConfig, salt: str = "") -> int:
    """Seed of a campaign's public randomness (projections, hash seeds, shifts, k-means starts).

    The first 8 bytes, little-endian, of ``sha256(salt + "seed:" + str(config.seed))``: the same
    campaign seed gives the same engine choices, so a run can be repeated. A configuration stored
    before the seed field (``config.seed`` is None) keeps its old stream,
    ``sha256(salt + config.campaign_id)``. Neither needs a secret: everything it seeds is
    post-processing or public geometry. ``salt`` (``"nettree:"``, ...) keeps the kinds' streams apart.
    """
    key = config.campaign_id if config.seed is None else f"seed:{config.seed}"
    return int.from_bytes(hashlib.sha256(f"{salt}{key}".encode()).digest()[:8], "little")


def seed_pool_key(config: CampaignConfig, round: int) -> int:
    """The public ``seed_pool_key`` of a round's local-hashing seed pool (``docs/protocol.md`` §14.2).

    Word ``round`` of the §12 SplitMix64 stream of the campaign seed with the pool's purpose tag:
    fixed before the round's reports exist, different in every round and campaign.
    """
    return splitmix64(stream_key(campaign_seed(config), PURPOSE_SEED_POOL), round)


def check_seed_pool_size(size: int, config: CampaignConfig, field: str) -> None:
    """Refuse a kind's ``seed_pool_size`` (``field`` names it) that no round of the campaign can use.

    Raises
    ------
    InvalidArgumentError
        ``size`` above :data:`~ldp_client.mechanisms.local_hashing.MAX_SEED_POOL`, or a pool in a
        campaign whose oracles leave out local hashing (no round could draw from it: refused at
        creation, with one line saying why, rather than ignored).
    """
    if not size:
        return
    if size > MAX_SEED_POOL:
        raise InvalidArgumentError(f"{field} must be at most {MAX_SEED_POOL}, got {size}")
    allowed = allowed_oracles(config)
    if allowed is not None and "olh" not in allowed:
        raise InvalidArgumentError(
            f"{field}: a seed pool needs local hashing, which the campaign's oracles leave out "
            f"({','.join(sorted(allowed))}); add olh to --oracles or drop the seed pool")


def with_seed_pool(mechanism: MechanismParams, config: CampaignConfig, round: int, size: int,
                   who: str) -> MechanismParams:
    """``mechanism`` drawing its seeds from the campaign's public pool of ``size`` seeds in ``round``.

    Only local hashing takes a pool (``docs/protocol.md`` §14); any other mechanism, or ``size`` 0,
    comes back unchanged. The key is :func:`seed_pool_key`, a fresh pool every round.

    Raises
    ------
    InvalidArgumentError
        ``size x g`` above :data:`~ldp_collector.estimation.frequency.MAX_POOL_CELLS` (the counts
        the collector keeps per component); ``who`` names the kind.
    """
    if not size or not isinstance(mechanism, LocalHashingParams):
        return mechanism
    if size * mechanism.g > MAX_POOL_CELLS:
        raise InvalidArgumentError(
            f"{who} seed pool: seed_pool_size x g must be at most {MAX_POOL_CELLS}, got {size} x {mechanism.g}")
    return replace(mechanism, seed_pool_size=size, seed_pool_key=seed_pool_key(config, round))


def check_report_epsilon(epsilon: float, who: str) -> None:
    """Refuse an epsilon one report cannot spend: ``who`` names the spender (``"a nettree campaign"``).

    Raises
    ------
    InvalidArgumentError
        ``epsilon`` outside ``(0, MAX_MECHANISM_EPSILON]`` (NaN included).
    """
    if not 0.0 < epsilon <= MAX_MECHANISM_EPSILON:  # NaN fails the comparison
        raise InvalidArgumentError(
            f"{who} spends its whole epsilon in one report, so epsilon must be in "
            f"(0, {MAX_MECHANISM_EPSILON:g}], got {epsilon!r}")


def numeric_domain(lower: Sequence[float], upper: Sequence[float]) -> NumericDomain:
    """The SDK's :class:`NumericDomain` of public bounds; ``InvalidArgumentError`` (``domain.numeric: ...``) if refused."""
    try:
        return NumericDomain(lower=tuple(lower), upper=tuple(upper))
    except InvalidParameterError as exc:
        raise InvalidArgumentError(f"domain.numeric: {exc}") from None
