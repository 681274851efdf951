"""The fewest devices a simulated campaign needs (``simulate`` says "n is too small" before running)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ldp_collector.cli_args import build_campaign_config
from ldp_collector.model import CampaignConfig
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.sizing import FAILURE_RATE, _short_probability, minimum_devices


def _config(kind: str, **values: object) -> CampaignConfig:
    return config_from_proto(build_campaign_config(kind, epsilon=2.0, bounds=((0.0, 0.0), (1.0, 1.0)), seed=0,
                                                   **values))


def test_a_grid_campaign_needs_its_calibration_round_filled() -> None:
    # Round 1 draws 2000 of 10000 weight: empty with probability 0.8^n, the later round 0.2^n.
    minimum = minimum_devices(_config("grid"))
    assert minimum.devices == 31
    assert 0.8 ** 31 + 0.2 ** 31 <= FAILURE_RATE < 0.8 ** 30 + 0.2 ** 30
    assert "the smallest of its rounds draws a share 0.2 of the devices: 31 fill every round" in minimum.reason


def test_every_device_in_every_round_needs_min_reports_only() -> None:
    assert minimum_devices(_config("grid", budget_policy="split")).devices == 1
    assert minimum_devices(_config("histogram")).devices == 1


def test_a_clustering_needs_k_points() -> None:
    minimum = minimum_devices(_config("nettree", k=7))
    assert minimum.devices == 7 and minimum.reason == "a clustering into k = 7 clusters needs at least k points"


@pytest.mark.parametrize(("n", "p", "m"), [(10, 0.3, 1), (10, 0.3, 4), (40, 0.05, 3), (5, 1.0, 5), (4, 1.0, 5)])
def test_the_short_probability_is_the_binomial_cdf(n: int, p: float, m: int) -> None:
    exact = sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(min(m, n + 1)))
    assert _short_probability(n, p, m) == pytest.approx(exact, rel=1e-12, abs=1e-300)


def test_more_reports_per_round_need_more_devices() -> None:
    base = minimum_devices(_config("grid")).devices
    raised = minimum_devices(dataclasses.replace(_config("grid"), min_reports_per_round=20))
    assert raised.devices > base and "at least 20 reports" in raised.reason
