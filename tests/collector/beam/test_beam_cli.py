"""``ldp-collector close-round --engine beam`` drives whole campaigns to the in-process result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("apache_beam", reason="Apache Beam is not installed (python -m tox -e beam installs it)")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'ldp-collector[export]')")

from ldp.v1 import campaigns_pb2
from ldp_collector.cli import main
from ldp_collector.columnar import read_manifest
from ldp_collector.core import Collector
from ldp_collector.model import Campaign
from ldp_collector.serde import config_from_proto, result_to_proto
from ldp_collector.simulation.runner import InProcessCollector, run_campaign
from ldp_collector.storage import open_store

from .test_beam_equality import MULTI_PROCESS


class _BeamClosing(InProcessCollector):
    """Devices report to an in-process collector; each round is closed by the CLI's Beam step."""

    def __init__(self, location: Path, exports: Path) -> None:
        super().__init__(Collector(open_store(location)))
        self.location, self.exports = location, exports

    def close_round(self, campaign_id: str, round: int) -> Campaign:
        assert main(["close-round", campaign_id, "--round", str(round), "--engine", "beam", "--data-dir",
                     str(self.location), "--export-dir", str(self.exports / f"round-{round}"),
                     "--", *MULTI_PROCESS]) == 0
        return self.collector.get_campaign(campaign_id)


def _config() -> campaigns_pb2.CampaignConfig:
    config = campaigns_pb2.CampaignConfig(kind=campaigns_pb2.HISTOGRAM, epsilon=2.0, campaign_id="cli-beam", seed=5)
    config.domain.categorical_size = 32
    config.histogram.oracle = campaigns_pb2.OLH
    return config


def test_close_round_on_beam_gives_the_in_process_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    points = [int(v) for v in np.random.default_rng(1).zipf(1.5, 1500) % 32]
    in_process = run_campaign(Collector(open_store(tmp_path / "a")), config_from_proto(_config()), points, seed=2,
                              mode="direct", quiet=True)
    on_beam = run_campaign(_BeamClosing(tmp_path / "b", tmp_path / "exports"), config_from_proto(_config()), points,
                           seed=2, mode="direct", quiet=True)
    assert on_beam.stats.rounds == in_process.stats.rounds == 1
    assert "closed round 1 (beam)" in capsys.readouterr().out
    for round in (1,):
        manifest = read_manifest(tmp_path / "exports" / f"round-{round}")
        assert manifest is not None and manifest.complete and manifest.round == round
    expected, got = result_to_proto(in_process.result), result_to_proto(on_beam.result)
    expected.ClearField("finished_at")
    got.ClearField("finished_at")
    assert got.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)


def test_pipeline_options_need_the_beam_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["close-round", "c", "--", "--direct_num_workers=2"]) == 2
    assert "need --engine beam" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", "c", "1", "--out", "x", "--", "--direct_num_workers=2"])
