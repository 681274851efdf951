"""The device's admission decision (:mod:`ldp_client.admission`): group draw, caps, exact budget checks.

:meth:`Device.participate <ldp_client.device.Device.participate>` and the collector's population
simulator both decide through these functions; the device-level behaviour is pinned in
``test_device.py`` and ``test_hostile_collector.py``, the simulator's agreement with the device in
``tests/collector/simulation/test_simulate.py``.
"""

from __future__ import annotations

import pytest

from ldp_client.admission import Caps, admit, check_budget, pick_group
from ldp_client.budget import units
from ldp_client.device import Device, DevicePolicy
from ldp_client.encoders import CategoricalEncoder
from ldp_client.errors import BudgetExhaustedError, ProtocolError
from ldp_client.mechanisms import GRRParams
from ldp_client.rng import Rng, SeededRng
from ldp_client.spec import Component, GroupTask, RoundSpec


class _CountingRng:
    """Returns 0, 1, 2, ... from randbelow: enumerates every outcome of one draw exactly."""

    def __init__(self) -> None:
        self.next = 0

    def randbelow(self, n: int) -> int:
        value = self.next % n
        self.next += 1
        return value


def _spec(weights: tuple[int, ...] = (1, 2, 1), campaign_epsilon: float = 2.0, epsilon: float = 1.0) -> RoundSpec:
    component = Component(encoder=CategoricalEncoder(domain_size=4), mechanism=GRRParams(domain_size=4, epsilon=epsilon))
    return RoundSpec(campaign_id="admission", round=1, group_weights=weights,
                     tasks=(GroupTask(groups=(0,), components=(component,)),),
                     campaign_epsilon=campaign_epsilon, max_reports_per_device=2, kind="histogram")


def test_pick_group_is_exactly_proportional_to_the_weights() -> None:
    weights = (3, 0, 5, 1)
    rng = _CountingRng()
    picks = [pick_group(weights, lambda: rng) for _ in range(sum(weights))]  # type: ignore[arg-type, return-value]
    assert [picks.count(g) for g in range(len(weights))] == list(weights)


def test_one_group_draws_no_coin() -> None:
    def no_rng() -> Rng:
        raise AssertionError("a single group needs no randomness")

    assert pick_group((7,), no_rng) == 0


def test_check_budget_compares_exactly() -> None:
    caps = Caps(campaign_epsilon=1.0, total_epsilon=1.0, reports=100)
    nine_tenths = sum(units(0.1) for _ in range(9))
    # Ten charges of 0.1 exceed 1.0 exactly (their float sum rounds either way): the tenth is refused.
    with pytest.raises(BudgetExhaustedError, match="campaign privacy budget exhausted"):
        check_budget(0.1, caps, spent=nine_tenths, spent_total=nine_tenths, reports=9)
    check_budget(0.5, caps, spent=units(0.5), spent_total=units(0.5), reports=1)  # 0.5 + 0.5 = 1.0 fits
    with pytest.raises(BudgetExhaustedError, match="total privacy budget exhausted"):
        check_budget(0.5, Caps(campaign_epsilon=2.0, total_epsilon=0.75, reports=100), spent=0,
                     spent_total=units(0.5), reports=0)
    with pytest.raises(BudgetExhaustedError, match="campaign reports"):
        check_budget(0.1, caps, spent=0, spent_total=0, reports=100)


def test_caps_are_the_smaller_of_the_spec_and_the_policy() -> None:
    policy = DevicePolicy(max_epsilon_per_campaign=3.0, max_epsilon_total=5.0, max_reports_per_campaign=1)
    assert Caps.of(_spec(campaign_epsilon=2.0), policy) == Caps(campaign_epsilon=2.0, total_epsilon=5.0, reports=1)


def test_admit_keeps_a_recorded_group_and_refuses_one_the_spec_lacks() -> None:
    policy = DevicePolicy()
    sits_out = admit(_spec(), policy, group=1, spent=0, spent_total=0, reports=0, group_rng=lambda: SeededRng(0))
    assert sits_out.group == 1 and sits_out.task is None
    with pytest.raises(ProtocolError, match="group weights must not change"):
        admit(_spec(), policy, group=3, spent=0, spent_total=0, reports=0, group_rng=lambda: SeededRng(0))
    # A group that sits out is never refused, whatever the budget.
    admit(_spec(), policy, group=1, spent=units(2.0), spent_total=0, reports=2, group_rng=lambda: SeededRng(0))
    with pytest.raises(BudgetExhaustedError):
        admit(_spec(), policy, group=0, spent=units(2.0), spent_total=0, reports=0, group_rng=lambda: SeededRng(0))


@pytest.mark.parametrize("weights", [(1,), (1, 2, 1), (5, 3)])
def test_the_device_draws_its_group_through_admit(weights: tuple[int, ...]) -> None:
    spec = _spec(weights)
    for seed in range(20):
        device = Device.in_memory(DevicePolicy(), rng=SeededRng(seed), device_id="0" * 32)
        expected = admit(spec, DevicePolicy(), group=None, spent=0, spent_total=0, reports=0,
                         group_rng=lambda seed=seed: SeededRng(seed))  # type: ignore[misc]
        report = device.participate(spec, 1)
        assert device.group_for(spec) == expected.group
        assert (report is None) == (expected.task is None)
