"""Whether a device reports in a round, and in which group: the decision, apart from the device's state.

:meth:`ldp_client.device.Device.participate` decides in three steps, all here as plain functions of
public values and the device's spending so far, so that whoever must take exactly the same decisions
without a :class:`~ldp_client.device.Device` (a population simulator holding millions of devices as
arrays) calls this code instead of copying it:

1. the group, drawn once per campaign in proportion to the spec's public ``group_weights``
   (:func:`pick_group`: exactly ``randbelow(sum)``, no coin at all when there is one group);
2. the group's task in the round (``None``: the group sits out);
3. the caps (:class:`Caps`: the smaller of the spec's and the policy's) and the exact budget
   comparison (:func:`check_budget`, :mod:`ldp_client.budget`: no slack, not even a rounding error).

The device's ledger runs the same :func:`check_budget` again when it records the charge, under its
lock. Nothing here reads or writes state, and the standard library alone is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .budget import UNIT, fits
from .errors import BudgetExhaustedError, ProtocolError

if TYPE_CHECKING:
    from .rng import Rng
    from .spec import GroupTask, RoundSpec

__all__ = ["Admission", "Caps", "PolicyLimits", "admit", "check_budget", "pick_group"]


class PolicyLimits(Protocol):
    """The limits of a device's policy that admission reads (:class:`ldp_client.device.DevicePolicy`
    has them; this module does not import it, so that ``device`` depends on ``admission`` only)."""

    @property
    def max_epsilon_per_campaign(self) -> float: ...

    @property
    def max_epsilon_total(self) -> float: ...

    @property
    def max_reports_per_campaign(self) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Caps:
    """What one device may still spend in one campaign: the smaller of the spec's and its policy's caps.

    Attributes
    ----------
    campaign_epsilon : float
        ``min(spec.campaign_epsilon, policy.max_epsilon_per_campaign)``.
    total_epsilon : float
        ``policy.max_epsilon_total``, over every campaign.
    reports : int
        ``min(spec.max_reports_per_device, policy.max_reports_per_campaign)``.
    """

    campaign_epsilon: float
    total_epsilon: float
    reports: int

    @classmethod
    def of(cls, spec: RoundSpec, policy: PolicyLimits) -> Caps:
        """The caps binding a device with ``policy`` in ``spec``'s campaign."""
        return cls(campaign_epsilon=min(spec.campaign_epsilon, policy.max_epsilon_per_campaign),
                   total_epsilon=policy.max_epsilon_total,
                   reports=min(spec.max_reports_per_device, policy.max_reports_per_campaign))


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """The outcome of :func:`admit` for one device and one round.

    Attributes
    ----------
    group : int
        The device's group in the campaign (drawn now when ``admit`` was given none).
    task : GroupTask or None
        What the device reports; ``None`` when its group sits out the round (nothing is charged).
    caps : Caps
        The caps the report's charge must be recorded against.
    """

    group: int
    task: GroupTask | None
    caps: Caps


def pick_group(group_weights: Sequence[int], rng: Callable[[], Rng]) -> int:
    """Group ``g`` with probability exactly ``group_weights[g] / sum(group_weights)``.

    ``u = randbelow(sum)``, then the first group whose cumulative weight exceeds ``u``.

    Parameters
    ----------
    group_weights : sequence of int
        The spec's public weights (positive integers).
    rng : callable returning Rng
        Called only when a coin is needed (more than one group), so that a device whose group
        stream is derived from its secret derives it only then.
    """
    if len(group_weights) == 1:
        return 0  # certain: no randomness needed
    u = rng().randbelow(sum(group_weights))
    for group, weight in enumerate(group_weights):
        if u < weight:
            return group
        u -= weight
    raise AssertionError("unreachable: u < sum(group_weights)")


def check_budget(epsilon: float, caps: Caps, *, spent: int, spent_total: int, reports: int) -> None:
    """Raise :class:`~ldp_client.errors.BudgetExhaustedError` unless one more report costing ``epsilon`` fits.

    Parameters
    ----------
    epsilon : float
        What the report would charge.
    caps : Caps
    spent, spent_total : int
        The exact sums of the device's charges in the campaign and over every campaign, in units of
        :data:`ldp_client.budget.UNIT` (:func:`ldp_client.budget.units`).
    reports : int
        The device's reports in the campaign so far.
    """
    if not fits(spent, epsilon, caps.campaign_epsilon):
        raise BudgetExhaustedError("campaign", float(spent * UNIT), epsilon, caps.campaign_epsilon)
    if not fits(spent_total, epsilon, caps.total_epsilon):
        raise BudgetExhaustedError("total", float(spent_total * UNIT), epsilon, caps.total_epsilon)
    if reports >= caps.reports:
        raise BudgetExhaustedError("campaign reports", reports, 1, caps.reports)


def admit(spec: RoundSpec, policy: PolicyLimits, *, group: int | None, spent: int, spent_total: int, reports: int,
          group_rng: Callable[[], Rng]) -> Admission:
    """The device's group and task in ``spec``'s round, once its caps allow one more report.

    The caller has checked ``spec`` against ``policy`` (:meth:`DevicePolicy.check
    <ldp_client.device.DevicePolicy.check>`) and that the device has no charge in this round yet.

    Parameters
    ----------
    spec : RoundSpec
    policy : PolicyLimits
    group : int or None
        The device's recorded group in the campaign; ``None`` draws one (:func:`pick_group`), which
        the caller records when it keeps the outcome (the device does when its group sits out the
        round or when it charges a report, not when the budget refuses).
    spent, spent_total, reports : int
        The device's spending so far (see :func:`check_budget`).
    group_rng : callable returning Rng
        The generator of the group draw, called only when one is drawn.

    Raises
    ------
    ProtocolError
        The recorded group does not exist in ``spec`` (the collector changed the group weights).
    BudgetExhaustedError
        The group reports in this round, but its report would exceed a cap.
    """
    weights = spec.group_weights
    if group is None:
        group = pick_group(weights, group_rng)
    elif group >= len(weights):
        raise ProtocolError(f"campaign {spec.campaign_id!r} round {spec.round} has {len(weights)} groups, "
                            f"but the device is in group {group} (group weights must not change)")
    task = spec.task_for(group)
    caps = Caps.of(spec, policy)
    if task is not None:
        # Everything the collector chose is checked before anything is randomized.
        check_budget(task.epsilon, caps, spent=spent, spent_total=spent_total, reports=reports)
    return Admission(group=group, task=task, caps=caps)
