"""The Beam step equals the in-process step: the same accumulators, next round specs and results.

Every registered kind, and the histogram with each frequency oracle, plays a small campaign on an
in-process collector; every closed round is exported, and ONE Beam pipeline on the DirectRunner in
multi-process mode (two workers) computes all the rounds' accumulators. Then, round by round, the
engine's step runs twice on the same spec and state: on the store's reports and on the Beam
path's (:class:`~ldp_collector.beam.BeamRoundReports`); the outcomes must be the same bytes.

Tolerance: none for the integer accumulators (counts, report counts, local-hashing support counts,
Hamming weights): integer sums do not depend on the order Beam adds and merges them in, so they
are compared exactly, and so are the steps' outcomes. A float sum (per-bucket vector sums,
:class:`~ldp_collector.estimation.vector_sum.BucketSumAccumulator`) depends on the order at the
last bits: summing the same n terms in two orders differs by at most ``2 (n - 1) u sum|x_i|``
(u = 2**-53, the unit roundoff; Higham, "Accuracy and Stability of Numerical Algorithms", §4.2, for
any order of pairwise additions; docs/beam.md). The Beam path's vector sums are checked within that
bound of the in-process ones, and the outcomes of the steps built on them (:data:`FLOAT_SUM_CASES`)
are compared exactly except for their floats, which must agree to :data:`FLOAT_RTOL`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import msgpack
import numpy as np
import pytest
from google.protobuf.json_format import MessageToDict

pytest.importorskip("apache_beam", reason="Apache Beam is not installed (python -m tox -e beam installs it)")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'ldp-collector[export]')")

from ldp.v1 import campaigns_pb2
from ldp_client.mechanisms import BucketizedVectorParams, LocalHashingParams, UnaryEncodingParams
from ldp_client.spec import RoundSpec
from ldp_collector.beam import BeamRoundReports, accumulate_rounds, combine_rounds, pipeline_args
from ldp_collector.campaigns import make_engine
from ldp_collector.columnar import export_round
from ldp_collector.core import Collector
from ldp_collector.estimation.accumulators import SupportCounts, accumulator_key, component_params_from_spec, rebuild
from ldp_collector.estimation.report_accumulator import summation_error_bound
from ldp_collector.estimation.vector_sum import BucketSumAccumulator
from ldp_collector.kinds import KINDS, RoundOutcome, RoundReports
from ldp_collector.kinds.histogram import HammingWeights
from ldp_collector.serde import config_from_bytes, config_from_proto, estimates_to_proto, result_to_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.runner import run_campaign
from ldp_collector.storage import ReportStore, open_store
from support.kind_configs import CATEGORIES, K, small_campaign, small_population

_N = 3000
#: Beam's local runner spread over two processes, as a cluster spreads it over workers.
MULTI_PROCESS = ("--direct_running_mode=multi_processing", "--direct_num_workers=2")
_ORACLES = {"grr": campaigns_pb2.GRR, "sue": campaigns_pb2.SUE, "oue": campaigns_pb2.OUE, "olh": campaigns_pb2.OLH}
CASES = [*KINDS, *(f"histogram-{name}" for name in _ORACLES)]
#: The kinds whose step sums floats over the raw reports in a report accumulator (nettree's leaf
#: and refinement sums, Stemmer's key means and Lloyd sums: per-bucket vector sums; bitvector's EM
#: passes: responsibility-weighted bit sums). Their
#: accumulators differ from the in-process ones by at most the summation bound
#: (``test_vector_sums_on_beam_within_the_summation_bound``), about ``2 n u`` relative for sums of
#: same-magnitude terms (n = 3000 here: 7e-13). The centers and candidates in the next spec, the
#: engine state and the result are ratios of such sums, so they move by a few times that (the
#: differences seen are ~1e-15); FLOAT_RTOL and FLOAT_ATOL leave a wide margin. What could flip
#: under a last-bit difference: a center's "moved" test in ``lloyd_move`` and Stemmer's candidate
#: filters (a count against a threshold in standard errors), and a nearest-center assignment in
#: the weighted k-means over the candidates, each only when a value sits within ~1e-12 relative of
#: its threshold or tie; none does in these data, and every discrete field is compared exactly.
#: Laplace and ldp_kmeans sum floats in every pass of their iterations (Lloyd's and fuzzy c-means'
#: sums, a label round's vector sums and spreads; ``estimation/kmeans.py``, ``fuzzy.py``): each
#: iteration's centers are ratios of such sums, and an iteration stops when the centers' movement is
#: within the tolerance, so a last-bit difference could change the iteration count (and then every
#: later float) only when the movement sits within ~1e-12 relative of that threshold, or flip a
#: nearest-center tie; none does in these data. bitvector: its EM stopping rule (each center's move
#: against a tenth of its standard error), a report's nearest center (the clusters' sizes) and a
#: center's decoded grid point (a least-squares argmin, ties within 1e-9 relative), on the same terms.
FLOAT_SUM_CASES = {"nettree", "stemmer", "laplace", "ldp_kmeans", "bitvector"}
FLOAT_RTOL = 1e-9
#: ... or FLOAT_ATOL apart: a value that cancels to about 0 (a candidate coordinate of 1e-16) has no
#: relative precision; the values are in box units ([-1, 1]) or in the domain's (spans of about 10).
FLOAT_ATOL = 1e-9


@dataclass
class _Played:
    store: ReportStore
    campaign_id: str
    rounds: list[int]
    exports: dict[int, Path]


def play(case: str, directory: Path) -> _Played:
    """A whole campaign of ``case`` on an in-process collector, every closed round exported."""
    x, labels = make_dataset("blobs", _N, d=2, k=K, seed=7)
    name, _, oracle = case.partition("-")
    config = small_campaign(name, x, campaign_id=f"beam-{case}", oracle=_ORACLES[oracle] if oracle else None)
    store = open_store(directory / "ldp-data")
    run = run_campaign(Collector(store), config_from_proto(config), small_population(name, x, labels), seed=3,
                       mode="direct", quiet=True)
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


def _outcome_dict(outcome: RoundOutcome) -> dict[str, object]:
    """Everything a step produced, as plain values (floats compared by :func:`_assert_close`)."""
    return {
        "estimates": None if outcome.estimates is None else MessageToDict(estimates_to_proto(outcome.estimates)),
        # The next spec carries floats (centers, candidates): compared field by field.
        "next_round": None if outcome.next_round is None else msgpack.unpackb(outcome.next_round.spec.pack()),
        "state": None if outcome.next_round is None else _unpacked(outcome.next_round.engine_state),
        "result": None if outcome.result is None else MessageToDict(result_to_proto(outcome.result)),
        "diagnostics": dict(outcome.diagnostics),
    }


def _unpacked(state: bytes) -> object:
    """An engine state's msgpack fields (every kind's state is msgpack; an empty one stays bytes)."""
    try:
        return msgpack.unpackb(state, raw=False, strict_map_key=False) if state else state
    except (ValueError, msgpack.ExtraData):
        return state


def _assert_close(got: object, want: object, where: str = "outcome") -> None:
    """Equal, floats within :data:`FLOAT_RTOL` or :data:`FLOAT_ATOL` (NaN equals NaN); every other value exactly."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            _assert_close(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_close(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and isinstance(got, float):
        assert got == want or (math.isnan(got) and math.isnan(want)) or math.isclose(got, want, rel_tol=FLOAT_RTOL, abs_tol=FLOAT_ATOL), \
            f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


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
        # The steps' own passes over the raw reports (support counts, vector sums) run on Beam too.
        beam = BeamRoundReports([p.exports[r]], beam_blobs[f"{case}/{r}"], pipeline_args(None, MULTI_PROCESS),
                                work_dir=p.exports[r] / "beam")
        assert beam.count == p.store.count_reports(p.campaign_id, r)
        on_beam = engine.close_round(spec, beam, state)
        if _outcome_bytes(on_beam) != _outcome_bytes(in_process):
            # Only a float sum's step may differ, by its summation order's last bits (module docstring).
            assert case in FLOAT_SUM_CASES, f"{case} round {r}: the Beam outcome differs"
            _assert_close(_outcome_dict(on_beam), _outcome_dict(in_process))
        if in_process.next_round is not None:
            state = in_process.next_round.engine_state
        else:
            assert r == p.rounds[-1] and in_process.result is not None


def _round_with(p: _Played, mechanism: type) -> tuple[int, RoundSpec, list[str]]:
    """The first round of ``p`` with a component of ``mechanism``, and those components' keys."""
    for r in p.rounds:
        spec = RoundSpec.unpack(p.store.get_round(p.campaign_id, r).spec)
        keys = [accumulator_key(g, i) for g, ps in component_params_from_spec(spec).items()
                for i, m in enumerate(ps) if isinstance(m, mechanism)]
        if keys:
            return r, spec, sorted(keys)
    raise AssertionError(f"{p.campaign_id}: no round with {mechanism.__name__}")


def test_support_counts_and_weights_on_beam_equal_the_in_process_ones(played: dict[str, _Played],
                                                                       tmp_path: Path) -> None:
    """Integer report accumulators: exactly the in-process state, whatever Beam's order."""
    olh = played["histogram-olh"]
    r, spec, (key,) = _round_with(olh, LocalHashingParams)
    candidates = np.arange(CATEGORIES, dtype=np.int64)
    support = SupportCounts(component_params_from_spec(spec), key, candidates)
    oue = played["histogram-oue"]
    r2, spec2, _ = _round_with(oue, UnaryEncodingParams)
    mechanism = spec2.tasks[0].components[0].mechanism
    assert isinstance(mechanism, UnaryEncodingParams)
    weights = HammingWeights(mechanism)
    on_beam = combine_rounds({"olh": ([olh.exports[r]], support), "oue": ([oue.exports[r2]], weights)},
                             pipeline_args(None, MULTI_PROCESS), work_dir=tmp_path)
    in_process_support = _StoreReports(olh.store, olh.campaign_id, r).combine(support.zero())
    assert isinstance(on_beam["olh"], SupportCounts)
    assert on_beam["olh"].n == in_process_support.n == olh.store.count_reports(olh.campaign_id, r)
    assert on_beam["olh"].finalize().tolist() == in_process_support.finalize().tolist()
    assert in_process_support.finalize().sum() > 0
    in_process_weights = _StoreReports(oue.store, oue.campaign_id, r2).combine(weights.zero()).finalize()
    assert on_beam["oue"].finalize().tolist() == in_process_weights.tolist()
    assert in_process_weights.sum() == oue.store.count_reports(oue.campaign_id, r2)


def test_vector_sums_on_beam_within_the_summation_bound(played: dict[str, _Played], tmp_path: Path) -> None:
    """Float report accumulators: within ``2 (n - 1) u sum|z|`` of the in-process sums, per coordinate."""
    tree = played["nettree"]
    r, spec, keys = _round_with(tree, BucketizedVectorParams)
    by_group = component_params_from_spec(spec)
    group, index = (int(part) for part in keys[0].split(":"))
    params = by_group[group][index]
    assert isinstance(params, BucketizedVectorParams)
    buckets = np.arange(16, dtype=np.uint64)
    prototype = BucketSumAccumulator(params, buckets, by_group, keys)
    on_beam = combine_rounds({"sums": ([tree.exports[r]], prototype)}, pipeline_args(None, MULTI_PROCESS),
                             work_dir=tmp_path)["sums"]
    in_process = _StoreReports(tree.store, tree.campaign_id, r).combine(prototype.zero())
    assert isinstance(on_beam, BucketSumAccumulator)
    got, want = on_beam.finalize(), in_process.finalize()
    assert got.reports == want.reports == in_process.n > 0
    assert got.variance_bound == want.variance_bound
    bound = np.array([summation_error_bound(in_process.n, a) for a in in_process.abs_sums])
    assert bound.max() > 0
    assert (np.abs(got.sums - want.sums) <= bound[None, :]).all()
    # The squares are non-negative: their own sum is their sum of absolute values.
    square_bound = np.array([summation_error_bound(in_process.n, v) for v in want.variances[0]])
    assert (np.abs(got.variances - want.variances) <= square_bound[None, :]).all()
    # The bound is not vacuous: it is far below the sums' own noise (their standard errors).
    assert bound.max() < 1e-6 * np.sqrt(want.variance_bound)
