"""Epsilons a collector may send that no estimate survives, refused by the mechanisms before anything runs.

Every mechanism takes its privacy ratio from :func:`~ldp_client.mechanisms.base.privacy_ratio`: below
:data:`~ldp_client.mechanisms.base.MIN_RATIO_EPSILON` the exact ratio is 1, a holder and a non-holder
report alike, and the collector's estimates would divide by ``p - q = 0``. The discrete Laplace
mechanism also bounds its noise scale so that its reports fit the wire's 64-bit integers, and a
report that would not fit is refused before the device charges its budget.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ldp_client.device import Device
from ldp_client.encoders import UnitCubeEncoder
from ldp_client.encoders.base import NumericDomain
from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import (
    BitwiseRRParams,
    DiscreteLaplaceParams,
    GRRParams,
    LocalHashingParams,
    UnaryEncodingParams,
    VectorBoxParams,
    VectorL2BallParams,
)
from ldp_client.mechanisms import discrete_laplace as discrete_laplace_module
from ldp_client.mechanisms.base import MIN_RATIO_EPSILON
from ldp_client.mechanisms.discrete_laplace import MAX_SCALE
from ldp_client.payload import MAX_S64, Integers
from ldp_client.rng import SeededRng
from ldp_client.spec import Component, GroupTask, RoundSpec

#: Each mechanism built at an epsilon ``e`` whose share (for bitwise RR and SUE) is exactly ``e`` too.
MECHANISMS: dict[str, Callable[[float], Any]] = {
    "grr": lambda e: GRRParams(domain_size=8, epsilon=e),
    "oue": lambda e: UnaryEncodingParams(domain_size=8, epsilon=e, variant=2),
    "sue": lambda e: UnaryEncodingParams(domain_size=8, epsilon=2 * e, variant=1),
    "olh": lambda e: LocalHashingParams(domain_size=8, epsilon=e),
    "bitwise_rr": lambda e: BitwiseRRParams(length=8, epsilon=4 * e, sensitivity=4),
    "vector_box": lambda e: VectorBoxParams(dimension=3, epsilon=e),
    "vector_l2_ball": lambda e: VectorL2BallParams(dimension=3, epsilon=e),
}


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_the_smallest_epsilon_is_accepted_and_half_of_it_refused(name: str) -> None:
    accepted = MECHANISMS[name](MIN_RATIO_EPSILON)
    ratio = accepted.r_b if name == "bitwise_rr" else accepted.r if name == "sue" else accepted.ratio
    assert ratio > 1
    with pytest.raises(InvalidParameterError, match=r"must be at least 1\.5e-14 for an unbiased estimate") as info:
        MECHANISMS[name](MIN_RATIO_EPSILON / 2)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["grr", "oue", "olh"])
def test_no_count_variance_divides_by_zero_at_the_floor(name: str) -> None:
    mechanism = MECHANISMS[name](MIN_RATIO_EPSILON)
    assert mechanism.p > mechanism.q
    assert 0 < mechanism.count_variance(1000.0) < float("inf")


def test_discrete_laplace_scale_is_bounded() -> None:
    d, bits = 2, 10
    smallest = (d << bits) / MAX_SCALE  # a power of two: the scale is exactly MAX_SCALE
    assert DiscreteLaplaceParams(dimension=d, epsilon=smallest, grid_bits=bits).scale == MAX_SCALE
    with pytest.raises(InvalidParameterError, match=r"epsilon must be at least 2\.84e-14 for dimension 2 and grid_bits 10"):
        DiscreteLaplaceParams(dimension=d, epsilon=smallest * 0.99, grid_bits=bits)


def test_discrete_laplace_payload_must_fit_64_bits() -> None:
    mechanism = DiscreteLaplaceParams(dimension=2, epsilon=1.0)
    assert mechanism.check_payload(Integers((MAX_S64, -MAX_S64 - 1)))
    for value in (MAX_S64 + 1, -MAX_S64 - 2):
        with pytest.raises(ProtocolError, match="does not fit a signed 64-bit integer"):
            mechanism.check_payload(Integers((0, value)))


def test_a_report_the_wire_cannot_carry_charges_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    mechanism = DiscreteLaplaceParams(dimension=2, epsilon=1.0)
    encoder = UnitCubeEncoder(domain=NumericDomain(lower=(0.0, 0.0), upper=(1.0, 1.0)))
    spec = RoundSpec(campaign_id="lap", round=1, group_weights=(1,),
                     tasks=(GroupTask(groups=(0,), components=(Component(encoder=encoder, mechanism=mechanism),)),),
                     campaign_epsilon=1.0, max_reports_per_device=1, kind="laplace")
    device = Device.in_memory(rng=SeededRng(3))
    monkeypatch.setattr(discrete_laplace_module.DiscreteLaplaceParams, "randomize",
                        lambda self, value, rng=None: Integers((MAX_S64 + 1, 0)))
    with pytest.raises(ProtocolError, match="does not fit"):
        device.participate(spec, (0.5, 0.5))
    assert device.spent("lap") == 0.0 and device.pending_reports() == []
    monkeypatch.undo()
    assert device.participate(spec, (0.5, 0.5)) is not None and device.spent("lap") == 1.0
