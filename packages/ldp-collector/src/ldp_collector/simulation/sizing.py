"""How many simulated devices a campaign needs before it is worth running.

A campaign's first round spec fixes its groups of devices for good (their public weights never
change); each device draws its group once. Under the PARTITION budget policy a group reports in
one round only, and a round closes only with at least ``min_reports_per_round`` reports, so a
population too small for its groups leaves a round empty and the campaign stuck or failed. The
groups that report in the first round are one round together; a group that sits it out reports in
a later round, which is checked on its own (the later rounds' groups are not known before they
open, so a round of several such groups is held to each of them: a conservative minimum).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..campaigns import prepare_campaign
from ..model import BudgetPolicy, CampaignConfig

__all__ = ["FAILURE_RATE", "DeviceMinimum", "minimum_devices"]

#: Largest chance, over the devices' group draws, that some round gets too few reports at the minimum.
FAILURE_RATE = 1e-3


@dataclass(frozen=True, kw_only=True)
class DeviceMinimum:
    """The fewest devices a campaign runs with.

    Attributes
    ----------
    devices : int
        The minimum population.
    reason : str
        Why, in words (``"every round needs at least 1 report, and the smallest of its rounds draws a
        share 0.2 of the devices: 31 fill every round with probability 0.999"``).
    """

    devices: int
    reason: str


def _short_probability(n: int, p: float, m: int) -> float:
    """P(Binomial(n, p) < m): the chance that a round whose devices are a share ``p`` gets too few."""
    if p >= 1.0:
        return 0.0 if n >= m else 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    return min(1.0, sum(math.exp(math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1)
                                 + j * log_p + (n - j) * log_q) for j in range(min(m, n + 1))))


def _smallest(shares: list[float], m: int) -> int:
    """The smallest n at which the union bound over ``shares`` of P(a round gets < m) is at most
    :data:`FAILURE_RATE` (monotone in n: doubling, then bisection)."""

    def enough(n: int) -> bool:
        return sum(_short_probability(n, p, m) for p in shares) <= FAILURE_RATE

    high = max(m, 1)
    while not enough(high):
        high *= 2
    low = high // 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


def minimum_devices(config: CampaignConfig) -> DeviceMinimum:
    """The fewest devices ``config``'s campaign needs, from its first round's groups and its k.

    With at least :attr:`DeviceMinimum.devices` devices, every round gets ``min_reports_per_round``
    reports except with probability at most :data:`FAILURE_RATE` (a union bound over the rounds);
    a clustering with ``k`` clusters needs at least ``k`` points.

    Parameters
    ----------
    config : CampaignConfig
        The campaign as it would be created (its defaults are filled in as the collector does).

    Raises
    ------
    InvalidArgumentError
        The configuration is invalid (as creating the campaign would say).
    """
    prepared = prepare_campaign(config if config.seed is not None else dataclasses.replace(config, seed=0))
    spec = prepared.engine.first_round().spec
    m = prepared.config.min_reports_per_round
    total = sum(spec.group_weights)
    first = {g for task in spec.tasks for g in task.groups}
    if prepared.config.budget_policy == BudgetPolicy.PARTITION:
        shares = [sum(spec.group_weights[g] for g in first) / total]
        shares += [w / total for g, w in enumerate(spec.group_weights) if g not in first and w > 0]
    else:  # every device may report in every round
        shares = [1.0]
    devices = _smallest(shares, m)
    reason = f"every round needs at least {m} report{'s' if m > 1 else ''}"
    if len(shares) > 1:
        reason += (f", and the smallest of its rounds draws a share {min(shares):.3g} of the devices: {devices} fill "
                   f"every round with probability {1 - FAILURE_RATE:g}")
    k = getattr(prepared.config.parameters, "k", 0) or 0
    if k > devices:
        devices, reason = k, f"a clustering into k = {k} clusters needs at least k points"
    return DeviceMinimum(devices=devices, reason=reason)
