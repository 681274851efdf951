"""The Beam step equals the in-process step: the same accumulators, next round specs and results.

Every registered kind, and the histogram with each frequency oracle, plays a small campaign on an
in-process collector; every closed round is exported, and ONE Beam pipeline on the DirectRunner in
multi-process mode (two workers) computes all the rounds' accumulators. Then, round by round, the
engine's step runs twice on the same spec and state: on the store's reports and on the Beam
path's (:class:`~ldp_collector.beam.BeamRoundReports`); the outcomes must be the same bytes.

Tolerance: none. Every accumulator holds integers (counts, report counts) and integer sums do not
depend on the order Beam adds and merges them in, so the blobs are compared byte for byte. A float
sum would need one: summing the same n terms in another order changes the result by at most
``(n - 1) * u * sum|x_i|`` (u = 2**-53, the unit roundoff; Higham, "Accuracy and Stability of
Numerical Algorithms", §4.2, for any order of pairwise additions), the bound to use for a future
float accumulator (docs/beam.md). The steps that sum floats from the raw reports read them in the
store's order from the files, so their outcomes are compared bit for bit too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("apache_beam", reason="Apache Beam is not installed (python -m tox -e beam installs it)")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'ldp-collector[export]')")

from ldp.v1 import campaigns_pb2
from ldp_client.spec import RoundSpec
from ldp_collector.beam import BeamRoundReports, accumulate_rounds, pipeline_args
from ldp_collector.campaigns import make_engine
from ldp_collector.columnar import export_round
from ldp_collector.core import Collector
from ldp_collector.estimation.accumulators import component_params_from_spec, rebuild
from ldp_collector.kinds import KINDS, RoundOutcome, RoundReports
from ldp_collector.kinds.base import CATEGORICAL, NUMERIC
from ldp_collector.serde import config_from_bytes, config_from_proto, estimates_to_proto, kind_number, result_to_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.runner import run_campaign
from ldp_collector.storage import ReportStore, open_store

_N = 3000
_K = 3
_CATEGORIES = 64
#: Beam's local runner spread over two processes, as a cluster spreads it over workers.
MULTI_PROCESS = ("--direct_running_mode=multi_processing", "--direct_num_workers=2")
_ORACLES = {"grr": campaigns_pb2.GRR, "sue": campaigns_pb2.SUE, "oue": campaigns_pb2.OUE, "olh": campaigns_pb2.OLH}
CASES = [*KINDS, *(f"histogram-{name}" for name in _ORACLES)]


@dataclass
class _Played:
    store: ReportStore
    campaign_id: str
    rounds: list[int]
    exports: dict[int, Path]


def _config(case: str, x: np.ndarray) -> campaigns_pb2.CampaignConfig:
    name, _, oracle = case.partition("-")
    kind = KINDS[name]
    config = campaigns_pb2.CampaignConfig(kind=kind_number(name), epsilon=4.0, campaign_id=f"beam-{case}")
    if NUMERIC in kind.domains:
        config.domain.numeric.lower.extend(x.min(axis=0).tolist())
        config.domain.numeric.upper.extend(x.max(axis=0).tolist())
    else:
        config.domain.categorical_size = _CATEGORIES
    params = getattr(config, name)
    params.SetInParent()
    if "k" in params.DESCRIPTOR.fields_by_name:
        params.k = _K
    if oracle:
        params.oracle = _ORACLES[oracle]
    return config


def play(case: str, directory: Path) -> _Played:
    """A whole campaign of ``case`` on an in-process collector, every closed round exported."""
    x, labels = make_dataset("blobs", _N, d=2, k=_K, seed=7)
    name = case.partition("-")[0]
    points: object = x if NUMERIC in KINDS[name].domains else [(int(v),) for v in np.asarray(labels) * 7 % _CATEGORIES]
    assert NUMERIC in KINDS[name].domains or CATEGORICAL in KINDS[name].domains
    store = open_store(directory / "ldp-data")
    run = run_campaign(Collector(store), config_from_proto(_config(case, x)), points, seed=3, mode="direct",
                       quiet=True)
    assert run.result.state == campaigns_pb2.FINISHED
    rounds = [r.round for r in store.list_rounds(run.campaign_id) if not r.open]
    exports = {r: directory / f"round-{r}" for r in rounds}
    for r, out in exports.items():
        export_round(store, run.campaign_id, r, out, buckets=2, max_rows_per_file=700)
    return _Played(store=store, campaign_id=run.campaign_id, rounds=rounds, exports=exports)


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> dict[str, _Played]:
    return {case: play(case, tmp_path_factory.mktemp(case)) for case in CASES}


@pytest.fixture(scope="module")
def beam_blobs(played: dict[str, _Played], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    rounds = {f"{case}/{r}": [p.exports[r]] for case, p in played.items() for r in p.rounds}
    return accumulate_rounds(rounds, pipeline_args(None, MULTI_PROCESS), work_dir=tmp_path_factory.mktemp("beam"))


class _StoreReports(RoundReports):
    """The in-process step's view of a round (the collector's own reader is private to ``core``)."""

    def __init__(self, store: ReportStore, campaign_id: str, round: int) -> None:
        self.store, self.campaign_id, self.round = store, campaign_id, round

    @property
    def count(self) -> int:
        return self.store.count_reports(self.campaign_id, self.round)

    def batches(self, batch_size: int = 65536):  # type: ignore[no-untyped-def]
        return self.store.iter_reports(self.campaign_id, self.round, batch_size)

    def accumulators(self) -> dict[str, bytes]:
        return self.store.load_accumulators(self.campaign_id, self.round)


def _outcome_bytes(outcome: RoundOutcome) -> tuple[object, ...]:
    """Everything a step produced, as bytes (NaN-safe, unlike comparing floats)."""
    return (
        None if outcome.estimates is None else estimates_to_proto(outcome.estimates).SerializeToString(deterministic=True),
        None if outcome.next_round is None else (outcome.next_round.spec.pack(), outcome.next_round.engine_state),
        None if outcome.result is None else result_to_proto(outcome.result).SerializeToString(deterministic=True),
        sorted((k, np.float64(v).tobytes()) for k, v in outcome.diagnostics.items()),
    )


@pytest.mark.parametrize("case", CASES)
def test_beam_accumulators_equal_the_in_process_ones(case: str, played: dict[str, _Played],
                                                     beam_blobs: dict[str, dict[str, bytes]]) -> None:
    p = played[case]
    record = p.store.get_campaign(p.campaign_id)
    engine = make_engine(config_from_bytes(record.config))
    for r in p.rounds:
        spec = RoundSpec.unpack(p.store.get_round(p.campaign_id, r).spec)
        blobs = beam_blobs[f"{case}/{r}"]
        assert blobs, f"{case} round {r}: Beam computed no accumulator"
        assert blobs == rebuild(p.store.iter_reports(p.campaign_id, r), component_params_from_spec(spec))
        if engine.accumulate_fn(spec) is not None:  # the kind keeps accumulators at ingestion
            assert blobs == p.store.load_accumulators(p.campaign_id, r)


@pytest.mark.parametrize("case", CASES)
def test_beam_step_gives_the_in_process_outcome(case: str, played: dict[str, _Played],
                                                beam_blobs: dict[str, dict[str, bytes]]) -> None:
    """Round by round from the first plan: the same next spec, engine state, estimates and result."""
    p = played[case]
    record = p.store.get_campaign(p.campaign_id)
    engine = make_engine(config_from_bytes(record.config))
    state = engine.first_round().engine_state
    for r in p.rounds:
        spec = RoundSpec.unpack(p.store.get_round(p.campaign_id, r).spec)
        in_process = engine.close_round(spec, _StoreReports(p.store, p.campaign_id, r), state)
        beam = BeamRoundReports([p.exports[r]], beam_blobs[f"{case}/{r}"])
        assert beam.count == p.store.count_reports(p.campaign_id, r)
        on_beam = engine.close_round(spec, beam, state)
        assert _outcome_bytes(on_beam) == _outcome_bytes(in_process)
        if in_process.next_round is not None:
            state = in_process.next_round.engine_state
        else:
            assert r == p.rounds[-1] and in_process.result is not None
