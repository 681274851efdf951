"""Round reports as Parquet: the export (resumable, idempotent) and the landing path."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'ldp-collector[export]')")

from ldp.v1 import campaigns_pb2
from ldp_client.spec import RoundSpec
from ldp_collector import columnar
from ldp_collector.columnar import ParquetLanding, export_round, read_manifest, report_batches
from ldp_collector.core import Collector
from ldp_collector.errors import FailedPreconditionError
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.runner import run_campaign
from ldp_collector.storage import ReportStore, StoredReport, open_store

_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[ReportStore, str]:
    """A finished one-round histogram campaign of 1 200 devices, two groups of reports."""
    config = campaigns_pb2.CampaignConfig(kind=campaigns_pb2.HISTOGRAM, epsilon=2.0, campaign_id="col", seed=1)
    config.domain.categorical_size = 16
    store = open_store(tmp_path_factory.mktemp("store"))
    run = run_campaign(Collector(store), config_from_proto(config), [i % 16 for i in range(1200)], seed=4,
                       mode="direct", quiet=True)
    return store, run.campaign_id


def _stored(store: ReportStore, campaign_id: str) -> list[StoredReport]:
    return [r for batch in store.iter_reports(campaign_id, 1) for r in batch]


def _mtimes(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_mtime_ns for p in directory.rglob("*") if p.is_file()}


def test_export_holds_the_round_in_store_order(finished: tuple[ReportStore, str], tmp_path: Path) -> None:
    store, cid = finished
    manifest = export_round(store, cid, 1, tmp_path / "x", buckets=3, max_rows_per_file=250)
    stored = _stored(store, cid)
    assert manifest.complete and manifest.reports == len(stored) == 1200
    assert sum(f["rows"] for f in manifest.files) == 1200 and all(f["rows"] <= 250 for f in manifest.files)
    assert len({f["path"].split("/")[1] for f in manifest.files}) == 3  # every bucket used
    assert manifest.round_spec == RoundSpec.unpack(store.get_round(cid, 1).spec)
    assert sum(manifest.groups.values()) == 1200
    assert [r for batch in report_batches([tmp_path / "x"], batch_size=77) for r in batch] == stored


def test_export_is_idempotent(finished: tuple[ReportStore, str], tmp_path: Path) -> None:
    store, cid = finished
    first = export_round(store, cid, 1, tmp_path / "x", max_rows_per_file=300)
    before = _mtimes(tmp_path / "x")
    assert export_round(store, cid, 1, tmp_path / "x", max_rows_per_file=300) == first
    assert _mtimes(tmp_path / "x") == before


def test_an_interrupted_export_resumes(finished: tuple[ReportStore, str], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    store, cid = finished
    clean = export_round(store, cid, 1, tmp_path / "clean", buckets=2, max_rows_per_file=100)
    write = columnar._write_atomically
    written: list[Path] = []

    def crash_after_three(path: Path, rows: object) -> None:
        if len(written) == 3:
            raise OSError("disk gone")
        write(path, rows)  # type: ignore[arg-type]
        written.append(path)

    monkeypatch.setattr(columnar, "_write_atomically", crash_after_three)
    with pytest.raises(OSError):
        export_round(store, cid, 1, tmp_path / "x", buckets=2, max_rows_per_file=100)
    partial = read_manifest(tmp_path / "x")
    assert partial is not None and not partial.complete
    with pytest.raises(FailedPreconditionError):
        report_batches([tmp_path / "x"]).__next__()
    kept = {p: p.stat().st_mtime_ns for p in written}
    monkeypatch.setattr(columnar, "_write_atomically", write)
    # the re-run keeps the layout the export started with, whatever it is asked now
    resumed = export_round(store, cid, 1, tmp_path / "x", buckets=5, max_rows_per_file=10)
    assert {p: p.stat().st_mtime_ns for p in written} == kept
    assert resumed.complete and resumed.content_sha256 == clean.content_sha256 and resumed.files == clean.files


def test_export_refuses_open_rounds_and_foreign_directories(tmp_path: Path,
                                                            finished: tuple[ReportStore, str]) -> None:
    store, cid = finished
    config = campaigns_pb2.CampaignConfig(kind=campaigns_pb2.HISTOGRAM, epsilon=2.0, campaign_id="open")
    config.domain.categorical_size = 4
    collector = Collector(open_store(tmp_path / "s"))
    collector.create_campaign(config_from_proto(config))
    with pytest.raises(FailedPreconditionError, match="is open"):
        export_round(collector.store, "open", 1, tmp_path / "y")
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "other").write_text("x")
    with pytest.raises(FailedPreconditionError, match="not empty"):
        export_round(store, cid, 1, tmp_path / "z")


def test_landed_reports_read_back_as_an_export(finished: tuple[ReportStore, str], tmp_path: Path) -> None:
    store, cid = finished
    stored = _stored(store, cid)
    spec = RoundSpec.unpack(store.get_round(cid, 1).spec)
    with ParquetLanding(tmp_path / "land", spec, buckets=2, max_rows_per_file=128) as landing:
        assert landing.add(stored[:700]) == 700
        assert landing.add(stored[650:]) == 500  # a resend of 50 reports is dropped
        assert read_manifest(tmp_path / "land") is None  # not readable before it is closed
    manifest = read_manifest(tmp_path / "land")
    assert manifest is not None and manifest.complete and manifest.source == "landing"
    assert manifest.reports == 1200 and manifest.round_spec == spec
    assert [r for batch in report_batches([tmp_path / "land"]) for r in batch] == stored
    with pytest.raises(FailedPreconditionError, match="not empty"):
        ParquetLanding(tmp_path / "land", spec)


def test_the_base_install_pulls_neither_pyarrow_nor_beam() -> None:
    project = tomllib.loads((_ROOT / "packages/ldp-collector/pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"]).lower()
    assert "pyarrow" not in base and "apache-beam" not in base and "apache_beam" not in base
    assert any(r.startswith("pyarrow") for r in project["optional-dependencies"]["export"])
