"""Reproducible campaigns: the campaign seed fixes every engine's public randomness.

``simulate --seed S`` sets the campaign seed to ``S``, so the same command gives the same published
result for every clustering kind, also where a step seeds from a sample smaller than the round (the
samples are drawn by content, not by the devices' random report ids); a campaign stored before the
seed field keeps the stream its campaign id gave it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import pytest

from ldp_collector import cli, cli_simulate, serde
from ldp_collector.campaigns import make_engine, prepare_campaign
from ldp_collector.kinds import bitvector, laplace, ldp_kmeans
from ldp_collector.kinds.common import campaign_seed, numeric_domain
from ldp_collector.kinds.nettree import NetTreeParams
from ldp_collector.kinds.registry import KINDS
from ldp_collector.model import CampaignConfig, Domain
from ldp_collector.simulation.runner import CampaignRun

CLUSTERING_KINDS = sorted(name for name, kind in KINDS.items() if kind.clustering)


def _simulate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
              *argv: str) -> tuple[dict[str, Any], CampaignRun]:
    """``ldp-collector simulate ... --json``: its JSON and the run behind it (whose result holds the centers)."""
    runs: list[CampaignRun] = []
    run_simulation = cli_simulate._run_simulation

    def recording(*args: Any, **kwargs: Any) -> CampaignRun:
        runs.append(run_simulation(*args, **kwargs))
        return runs[-1]

    monkeypatch.setattr(cli_simulate, "_run_simulation", recording)
    code = cli.main(["simulate", *argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(runs) == 1
    return json.loads(out), runs[0]


#: Where a kind's step seeds from a sample of the round: (module, constant, options). ldp_kmeans's
#: default vectors at d = 2 are the box's four sign patterns, whose start any sample finds; PrivUnit's vary.
SAMPLES = {"laplace": (laplace, "SEED_SAMPLE_SIZE", ()),
           "ldp_kmeans": (ldp_kmeans, "SEED_SAMPLE_SIZE", ("--privunit-vectors",)),
           "bitvector": (bitvector, "KMEANS_SAMPLE", ())}


@pytest.mark.parametrize("kind", CLUSTERING_KINDS)
def test_the_same_simulate_command_gives_the_same_result(kind: str, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    _the_same_command_gives_the_same_result(kind, monkeypatch, capsys)


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_a_round_larger_than_its_sample_repeats_too(kind: str, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """3 000 devices against a sample of 256: which reports are sampled must not depend on their ids."""
    module, name, options = SAMPLES[kind]
    monkeypatch.setattr(module, name, 256)
    _the_same_command_gives_the_same_result(kind, monkeypatch, capsys, *options)


def _the_same_command_gives_the_same_result(kind: str, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str], *options: str) -> None:
    argv = ("--kind", kind, "--dataset", "mixture", "--d", "2", "--k", "3", "--n", "3000", "--epsilon", "4",
            "--seed", "5", *options)
    first, first_run = _simulate(monkeypatch, capsys, *argv)
    second, second_run = _simulate(monkeypatch, capsys, *argv)
    assert first_run.campaign.config.seed == second_run.campaign.config.seed == 5
    assert first_run.campaign_id != second_run.campaign_id  # the ids stay random; the seed is what repeats
    assert first_run.first_spec.tasks == second_run.first_spec.tasks  # projections, hash seeds, shifts
    clustering = first_run.result.clustering
    assert clustering is not None and (clustering.centers or clustering.cell_map is not None)
    assert clustering == second_run.result.clustering  # centers or cell map, cell by cell
    assert first_run.result.warnings == second_run.result.warnings
    assert first_run.result.diagnostics == second_run.result.diagnostics
    assert "clustering" in first
    # Everything published but the id and the timings: the scores (ARI, cost, ...) and the parameters.
    for key in ("parameters", "clustering", "warnings", "diagnostics", "reports_sent", "epsilon_per_device"):
        assert first[key] == second[key], key


def test_two_seeds_give_nettree_different_public_randomness(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("--kind", "nettree", "--dataset", "mixture", "--d", "2", "--k", "3", "--n", "3000", "--epsilon", "4")
    _, one = _simulate(monkeypatch, capsys, *argv, "--seed", "1")
    _, two = _simulate(monkeypatch, capsys, *argv, "--seed", "2")
    assert one.campaign.config.seed == 1 and two.campaign.config.seed == 2
    assert one.first_spec.tasks != two.first_spec.tasks


def _nettree_config(**fields: Any) -> CampaignConfig:
    return CampaignConfig(kind="nettree", epsilon=2.0, parameters=NetTreeParams(k=3),
                          domain=Domain(numeric=numeric_domain((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))), **fields)


def test_the_campaign_seed_not_the_id_fixes_the_engine() -> None:
    """Two campaigns with one seed share their public randomness whatever their ids; two seeds do not."""
    a = prepare_campaign(_nettree_config(campaign_id="seed-a", seed=7))
    b = prepare_campaign(_nettree_config(campaign_id="seed-b", seed=7))
    c = prepare_campaign(_nettree_config(campaign_id="seed-a", seed=8))
    assert a.engine.first_round().spec.tasks == b.engine.first_round().spec.tasks
    assert a.engine.first_round().spec.tasks != c.engine.first_round().spec.tasks
    assert campaign_seed(a.config, "nettree:") != campaign_seed(a.config, "stemmer:")  # the kinds' streams apart


def test_a_campaign_stored_without_a_seed_keeps_the_stream_of_its_id() -> None:
    """A configuration stored before the seed field reads back without one, and its engine draws from
    ``sha256(salt + campaign_id)`` exactly as before: its rounds and results do not change."""
    stored = dataclasses.replace(prepare_campaign(_nettree_config(campaign_id="old-campaign")).config, seed=None)
    blob = serde.config_to_bytes(stored)
    assert b"old-campaign" in blob
    config = serde.config_from_bytes(blob)
    assert config.seed is None
    engine = make_engine(config)
    before = int.from_bytes(hashlib.sha256(b"nettree:old-campaign").digest()[:8], "little")
    assert campaign_seed(config, "nettree:") == before
    assert engine.first_round().spec.tasks == make_engine(config).first_round().spec.tasks
    other = make_engine(dataclasses.replace(config, campaign_id="other-campaign"))
    assert engine.first_round().spec.tasks != other.first_round().spec.tasks


def test_run_campaign_seeds_a_campaign_that_sets_no_seed(tmp_path: Any) -> None:
    """The simulation API repeats whole too: without a campaign seed, run_campaign's seed becomes it."""
    import numpy as np

    from ldp_collector.core import Collector
    from ldp_collector.simulation.runner import run_campaign
    from ldp_collector.storage.sqlite import SqliteReportStore

    x = np.random.default_rng(0).uniform(0.0, 1.0, size=(300, 2))
    config = cli.build_campaign_config("histogram", epsilon=2.0, bounds=([0.0, 0.0], [1.0, 1.0]))
    model = serde.config_from_proto(config)
    assert model.seed is None
    collector = Collector(SqliteReportStore(tmp_path / "s.db"))
    unset = run_campaign(collector, model, x, seed=41, quiet=True)
    chosen = run_campaign(collector, dataclasses.replace(model, seed=7), x, seed=42, quiet=True)
    assert unset.campaign.config.seed == 41 and chosen.campaign.config.seed == 7
