"""Every engine cuts a campaign's epsilon into charges whose exact sum fits it.

A device's ledger compares exactly (no relative slack), so a SPLIT campaign whose per-round
epsilons add up to a hair more than the campaign's epsilon -- e.g. three rounds of the float 0.1
under a cap of 0.3 -- would be refused in its last round by every device. The engines therefore cut
budgets with :func:`ldp_client.budget.split_epsilon` / :func:`~ldp_client.budget.equal_share`;
this checks the sums exactly, for epsilons whose naive division rounds up.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from ldp.v1 import campaigns_pb2
from ldp_client.budget import exact_sum, sum_up
from ldp_collector.campaigns import prepare_campaign
from ldp_collector.serde import config_from_proto

#: Campaign epsilons whose naive cuts overshoot in floating point for some engine (and a few that do not).
EPSILONS = (0.3, 0.7, 0.9, 1.1, 2.9, 3.3, 8.0, 13.7, 19.9)
SPLIT, PARTITION = campaigns_pb2.SPLIT, campaigns_pb2.PARTITION


def _config(kind: int, epsilon: float, policy: int) -> campaigns_pb2.CampaignConfig:
    config = campaigns_pb2.CampaignConfig(kind=kind, epsilon=epsilon, budget_policy=policy)  # type: ignore[arg-type]
    config.domain.numeric.lower.extend([0.0, 0.0])
    config.domain.numeric.upper.extend([1.0, 1.0])
    return config


def _fits(charges: list[float], epsilon: float) -> bool:
    return exact_sum(charges) <= Fraction(epsilon)


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("variant,rounds", [(campaigns_pb2.GridParameters.TREE, 3),
                                            (campaigns_pb2.GridParameters.UNIFORM, 2),
                                            (campaigns_pb2.GridParameters.ITERATIVE, 5)])
def test_grid_split(epsilon: float, variant: int, rounds: int) -> None:
    config = _config(campaigns_pb2.GRID, epsilon, SPLIT)
    config.grid.variant = variant  # type: ignore[assignment]
    if variant == campaigns_pb2.GridParameters.ITERATIVE:
        config.grid.max_iterations = 3
    engine = prepare_campaign(config_from_proto(config)).engine
    assert _fits([engine.plan.round_epsilon] * rounds, epsilon)  # type: ignore[attr-defined]


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("windows", [3, 7])
def test_histogram_windows_split(epsilon: float, windows: int) -> None:
    config = campaigns_pb2.CampaignConfig(kind=campaigns_pb2.HISTOGRAM, epsilon=epsilon, budget_policy=SPLIT)
    config.domain.categorical_size = 16
    config.histogram.windows = windows
    engine = prepare_campaign(config_from_proto(config)).engine
    assert _fits([engine.component.mechanism.epsilon] * windows, epsilon)  # type: ignore[attr-defined]


@pytest.mark.parametrize("epsilon", (*EPSILONS, 8.0 - 2**-50, 5.0, 12.0))
@pytest.mark.parametrize("policy", [SPLIT, PARTITION])
def test_ldp_kmeans(epsilon: float, policy: int) -> None:
    config = _config(campaigns_pb2.LDP_KMEANS, epsilon, policy)
    config.ldp_kmeans.k = 3
    config.ldp_kmeans.iterations = 3
    engine = prepare_campaign(config_from_proto(config)).engine
    plan = engine.plan  # type: ignore[attr-defined]
    # A round's label and vector are one task: the ledger charges their sum, rounded up (GroupTask.epsilon).
    label_round = sum_up([plan.label_epsilon, plan.label_vector_epsilon])
    if policy == SPLIT:  # one device: the first vector, then T rounds of a label and a vector
        charges = [plan.init_epsilon] + [label_round] * 3
    else:  # one device reports once: the first vector, or one round's label and vector
        assert plan.init_epsilon <= epsilon
        charges = [label_round]
    assert _fits(charges, epsilon)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_nettree_components(epsilon: float) -> None:
    config = _config(campaigns_pb2.NETTREE, epsilon, PARTITION)
    config.nettree.k = 3
    engine = prepare_campaign(config_from_proto(config)).engine
    assert _fits([engine.node_epsilon, engine.vector_epsilon], epsilon)  # type: ignore[attr-defined]


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_stemmer_split(epsilon: float) -> None:
    config = _config(campaigns_pb2.STEMMER, epsilon, SPLIT)
    config.stemmer.k = 3
    engine = prepare_campaign(config_from_proto(config)).engine
    assert _fits([engine.round_epsilon] * engine.rounds, epsilon)  # type: ignore[attr-defined]
