"""Collector-assigned report ids and hash seeds on the device side.

An assigned seed replaces the device's own draw; everything else about the mechanism is
unchanged. For a fixed seed, local hashing is GRR over g buckets, so the exact privacy ratio
P[y | x] / P[y | x'] over the outputs is the same ``r <= e^epsilon`` as with a drawn seed (checked
exactly on a small domain), and the report distribution matches it (chi-square, P(false fail) <
1e-6, seeded).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from ldp_client.device import SEEDED_MECHANISMS, Device, RoundAssignment, run_component
from ldp_client.encoders.categorical import CategoricalEncoder
from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import GRRParams, LocalHashingParams
from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams, VectorShape
from ldp_client.mechanisms.local_hashing import hash_value
from ldp_client.payload import HashedValue, SignedVector
from ldp_client.rng import SeededRng
from ldp_client.spec import Component, GroupTask, RoundSpec
from support.stats import assert_chi2_fits


def olh_spec(domain: int = 16, epsilon: float = 2.0) -> RoundSpec:
    component = Component(encoder=CategoricalEncoder(domain_size=domain),
                          mechanism=LocalHashingParams(domain_size=domain, epsilon=epsilon))
    return RoundSpec(campaign_id="c", round=1, group_weights=(1,),
                     tasks=(GroupTask(groups=(0,), components=(component,)),), campaign_epsilon=epsilon)


def test_local_hashing_uses_the_assigned_seed() -> None:
    params = LocalHashingParams(domain_size=16, epsilon=2.0)
    rng = SeededRng(1)
    for seed in (0, 1, 2**31, 2**32 - 1):
        out = params.randomize(5, rng=rng, seed=seed)
        assert isinstance(out, HashedValue) and out.seed == seed
    for bad in (-1, 2**32, 1.5, True):
        with pytest.raises((InvalidParameterError, TypeError)):
            params.randomize(5, rng=rng, seed=bad)  # type: ignore[arg-type]


def test_bucketized_vector_uses_the_assigned_seed() -> None:
    params = BucketizedVectorParams(bucket_bits=3, dimension=2, epsilon=1.0, shape=VectorShape.BOX)
    out = params.randomize((3, [0.5, -0.5]), rng=SeededRng(2), seed=77)
    assert isinstance(out, SignedVector) and out.seed == 77
    with pytest.raises(InvalidParameterError):
        params.randomize((3, [0.5, -0.5]), rng=SeededRng(2), seed=2**32)


def test_fixed_seed_local_hashing_is_exactly_epsilon_ldp() -> None:
    """For a fixed seed the output distribution is GRR over g buckets around H(seed, x): the exact
    ratio over all x, x', y is r = params.ratio <= e^epsilon, attained when two values hash apart."""
    params = LocalHashingParams(domain_size=6, epsilon=1.5)
    g = params.g
    worst = Fraction(0)
    for seed in (0, 12345, 2**32 - 1):
        def dist(x: int, seed: int = seed) -> list[Fraction]:
            h = hash_value(seed, x, g)
            return [params.p_exact if y == h else params.q_other_exact for y in range(g)]

        for x in range(6):
            for x2 in range(6):
                for a, b in zip(dist(x), dist(x2)):
                    worst = max(worst, a / b)
    assert worst == params.ratio
    assert float(worst) <= 2.718281828459045**1.5


def test_fixed_seed_report_distribution_matches() -> None:
    params = LocalHashingParams(domain_size=16, epsilon=2.0)
    seed, value, n = 987654321, 11, 20_000
    rng = SeededRng(3)
    samples = [params.randomize(value, rng=rng, seed=seed).value for _ in range(n)]
    h = hash_value(seed, value, params.g)
    assert_chi2_fits(samples, {y: params.p_exact if y == h else params.q_other_exact for y in range(params.g)})


def test_device_reports_with_the_assignment() -> None:
    spec = olh_spec()
    assignment = RoundAssignment(report_id=bytes(range(16)), hash_seeds=(4242, 1, 2))
    device = Device.in_memory(rng=SeededRng(4))
    report = device.participate(spec, 7, assignment=assignment)
    assert report is not None and report.report_id == assignment.report_id
    payload = report.payloads[0]
    assert isinstance(payload, HashedValue) and payload.seed == 4242
    # Asking again returns the stored report, unchanged.
    assert device.participate(spec, 7, assignment=assignment) == report
    assert device.pending_reports() == [report]
    # Without an assignment the device draws both, as before.
    other = Device.in_memory(rng=SeededRng(4)).participate(spec, 7)
    assert other is not None and other.report_id != assignment.report_id


def test_unseeded_mechanisms_ignore_the_seeds() -> None:
    component = Component(encoder=CategoricalEncoder(domain_size=4), mechanism=GRRParams(domain_size=4, epsilon=1.0))
    spec = RoundSpec(campaign_id="g", round=2, group_weights=(1,),
                     tasks=(GroupTask(groups=(0,), components=(component,)),), campaign_epsilon=1.0)
    assignment = RoundAssignment(report_id=b"\x01" * 16)
    report = Device.in_memory(rng=SeededRng(5)).participate(spec, 2, assignment=assignment)
    assert report is not None and report.report_id == b"\x01" * 16 and isinstance(report.payloads[0], int)
    assert assignment.seed_for(0, component) is None
    assert not isinstance(component.mechanism, SEEDED_MECHANISMS)


def test_missing_seed_is_a_protocol_error_and_charges_nothing() -> None:
    spec = olh_spec()
    device = Device.in_memory(rng=SeededRng(6))
    with pytest.raises(ProtocolError, match="needs an assigned hash seed"):
        device.participate(spec, 1, assignment=RoundAssignment(report_id=bytes(16)))
    assert device.spent("c") == 0 and device.pending_reports() == []


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"report_id": b"short"}, ProtocolError, "16 bytes"),
    ({"report_id": "x" * 16}, TypeError, "bytes"),
    ({"report_id": bytes(16), "hash_seeds": (2**32,)}, ProtocolError, r"hash_seeds\[0\]"),
    ({"report_id": bytes(16), "hash_seeds": (-1,)}, ProtocolError, r"hash_seeds\[0\]"),
    ({"report_id": bytes(16), "hash_seeds": (True,)}, ProtocolError, r"hash_seeds\[0\]"),
    ({"report_id": bytes(16), "hash_seeds": tuple(range(9))}, ProtocolError, "at most 8"),
    ({"report_id": bytes(16), "hash_seeds": 5}, TypeError, "sequence"),
])
def test_assignment_validation(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        RoundAssignment(**kwargs)  # type: ignore[arg-type]


def test_run_component_refuses_a_seed_for_an_unseeded_mechanism() -> None:
    component = Component(encoder=CategoricalEncoder(domain_size=4), mechanism=GRRParams(domain_size=4, epsilon=1.0))
    with pytest.raises(TypeError, match="draws no hash seed"):
        run_component(component, 1, rng=SeededRng(7), seed=3)
