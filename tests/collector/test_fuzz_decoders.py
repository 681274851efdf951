"""Property tests of the collector's decoders of untrusted input, below the gRPC layer.

* Ingestion: hostile ``SubmitPacked`` batches and ``SubmitReports`` messages go through the same
  decoding and validation as the service (column form and batch-wide fast path); validation raises
  nothing, the fast path and the per-report path agree outcome for outcome and byte for byte, and
  every report it accepts passes :func:`~ldp_collector.ingest.validate_report` again.
* The service's request parsing and the SDK's peek at the declared batch size.
* Stored state read back (accumulator blobs, stored payloads, engine state): a corrupted value
  raises ``ProtocolError`` and nothing else; valid values round-trip.

Examples per property: ``LDP_TEST_FUZZ_EXAMPLES`` (small by default; the ``fuzz`` tox environment runs
the full count).
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ldp.v1 import campaigns_pb2, reports_pb2, service_pb2
from ldp_client import serde
from ldp_client.errors import ProtocolError
from ldp_client.mechanisms import GRRParams, LocalHashingParams, MechanismParams, UnaryEncodingParams
from ldp_client.mechanisms.unary_encoding import UnaryVariant
from ldp_client.report import Report, ReportColumns, declared_batch_size, pack_batch, unpack_batch, unpack_batch_columns
from ldp_client.spec import RoundSpec
from ldp_collector.errors import InvalidArgumentError
from ldp_collector.estimation.accumulators import (
    CountAccumulator,
    component_params_from_spec,
    decode_report_payloads,
    rebuild,
)
from ldp_collector.ingest import RoundContext, ValidatedBatch, validate_batch, validate_report
from ldp_collector.kinds.base import load_state, pack_state
from ldp_collector.server.wire import parse_request
from ldp_collector.storage.base import StoredReport
from support.fuzz import SPECS, Mutator, env_count, honest_reports

EXAMPLES = env_count("LDP_TEST_FUZZ_EXAMPLES", 200)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])

CONTEXTS = {s.campaign_id: RoundContext(campaign_id=s.campaign_id, round=s.round, spec=s) for s in SPECS}
FINISHED = "done-campaign"


def lookup(campaign_id: str) -> RoundContext | str:
    if campaign_id == FINISHED:
        return f"campaign {campaign_id} is finished"
    return CONTEXTS.get(campaign_id, f"campaign {campaign_id} does not exist")


REPORTS = honest_reports(seed=11, n=48)
BATCH = pack_batch("batch-1", REPORTS)
SUBMIT = service_pb2.SubmitReportsRequest(request_id="r-1", reports=[serde.report_to_proto(r) for r in REPORTS[:8]])


@st.composite
def packed_batches(draw: st.DrawFn) -> bytes:
    """Valid batches, batches of hand-made hostile reports, and hostile mutations of valid ones."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    reports = rng.sample(REPORTS, rng.randrange(1, 12))
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return pack_batch("valid", reports)
    if kind == 1:  # well-formed reports aimed at the wrong campaign, round, group or payload range
        items = []
        for report in reports:
            wire = report.to_wire()
            field = rng.randrange(2, 6)
            wire[field] = rng.choice({
                2: ["nope", FINISHED, "hist-grr", "grid.2d", "", "x" * 200],
                3: [0, 2, 4, 2**32 - 1, -1, True],
                4: [0, 1, 2, 4095, 4096, -1],
                5: [[0], [5], [2**64 - 1], [b"\xff" * 3], [b"\xff" * 3, 1], [[3, 1, 2]], [[4, [1, 2]]], [[5, b"\0" * 8]],
                    [[6, 1, b"\x01"]], [1, 2, 3, 4, 5, 6, 7, 8, 9], [], [True], [1.5], [None]],
            }[field])
            items.append(wire)
        if rng.random() < 0.3:  # duplicate ids inside the batch
            items.append(list(items[0]))
        return msgpack.packb([1, "hostile", items], use_bin_type=True)  # type: ignore[no-any-return]
    mutator = Mutator(rng)
    data = pack_batch("mutated", reports)
    for _ in range(draw(st.integers(1, 3))):
        data = mutator.msgpack(data)
    return data


def assert_same_validation(fast: ValidatedBatch, slow: ValidatedBatch) -> None:
    assert fast.rejected == slow.rejected
    assert list(fast.positions) == list(slow.positions)
    assert list(fast.valid) == list(slow.valid)


def check_accepted(valid: ValidatedBatch, reports: list[Report | ProtocolError]) -> None:
    """Every accepted report re-validates to the very row the batch produced."""
    for position, row in zip(valid.positions, valid.valid):
        report = reports[position]
        assert isinstance(report, Report)
        context = lookup(report.campaign_id)
        assert isinstance(context, RoundContext)
        assert validate_report(report, context) == row
    assert set(valid.positions).isdisjoint(valid.rejected)
    assert sorted([*valid.positions, *valid.rejected]) == list(range(len(reports)))


@FUZZ
@given(packed_batches())
def test_packed_ingestion_fast_and_slow_paths_agree(data: bytes) -> None:
    try:
        _, reports = unpack_batch(data)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            unpack_batch_columns(data)
        return
    _, columns = unpack_batch_columns(data)
    slow = validate_batch(reports, lookup)
    fast = validate_batch(columns, lookup)
    assert_same_validation(fast, slow)
    check_accepted(slow, reports)
    # The stored rows decode back to the payloads the devices sent, and rebuild the accumulators.
    for position, row in zip(slow.positions, slow.valid):
        report = reports[position]
        assert isinstance(report, Report)
        params = component_params_from_spec(CONTEXTS[report.campaign_id].spec)
        decoded = decode_report_payloads([row], params)
        assert [decoded[k][0] for k in sorted(decoded)] == list(report.payloads)


@FUZZ
@given(st.integers(0, 2**32 - 1))
def test_submit_reports_ingestion_fast_and_slow_paths_agree(seed: int) -> None:
    """Hostile ``SubmitReportsRequest`` bytes, parsed as the service parses them."""
    mutator = Mutator(random.Random(seed))
    data = SUBMIT.SerializeToString()
    for _ in range(mutator.rng.randrange(1, 4)):
        data = mutator.wire(data)
    try:
        request = parse_request(service_pb2.SubmitReportsRequest, data)
    except InvalidArgumentError:
        return
    columns = serde.report_columns_from_proto(request.reports)
    assert isinstance(columns, ReportColumns) and len(columns) == len(request.reports)
    singles: list[Report | ProtocolError] = []
    for message in request.reports:
        try:
            singles.append(serde.report_from_proto(message))
        except ProtocolError as exc:
            singles.append(exc)
    slow = validate_batch(singles, lookup)
    fast = validate_batch(columns, lookup)
    assert list(fast.positions) == list(slow.positions)
    assert list(fast.valid) == list(slow.valid)
    assert set(fast.rejected) == set(slow.rejected)
    check_accepted(slow, singles)


# -- the service's parsing ----------------------------------------------------------------------

REQUESTS: list[tuple[type[Any], bytes]] = [
    (service_pb2.SubmitReportsRequest, SUBMIT.SerializeToString()),
    (service_pb2.SubmitPackedRequest, service_pb2.SubmitPackedRequest(request_id="p", packed=BATCH).SerializeToString()),
    (service_pb2.GetRoundSpecRequest, service_pb2.GetRoundSpecRequest(campaign_id="hist-grr").SerializeToString()),
    (service_pb2.CreateCampaignRequest, service_pb2.CreateCampaignRequest(config=campaigns_pb2.CampaignConfig(
        campaign_id="c1", kind=campaigns_pb2.HISTOGRAM, epsilon=1.0,
        domain=campaigns_pb2.Domain(categorical_size=5))).SerializeToString()),
    (service_pb2.CloseRoundRequest, service_pb2.CloseRoundRequest(campaign_id="c1", round=1).SerializeToString()),
    (service_pb2.GetEstimatesRequest, service_pb2.GetEstimatesRequest(campaign_id="c1", round=1,
                                                                      confidence=0.95).SerializeToString()),
    (service_pb2.ListCampaignsRequest, service_pb2.ListCampaignsRequest(page_size=5,
                                                                        page_token="abc").SerializeToString()),
]


@FUZZ
@given(st.sampled_from(REQUESTS), st.integers(0, 2**32 - 1), st.binary(max_size=120))
def test_request_parsing_raises_only_invalid_argument(request: tuple[type[Any], bytes], seed: int,
                                                      noise: bytes) -> None:
    request_type, valid = request
    mutator = Mutator(random.Random(seed))
    for data in (mutator.wire(valid), mutator.raw(valid), noise):
        try:
            message = parse_request(request_type, data)
        except InvalidArgumentError:
            continue
        assert isinstance(message, request_type)


@FUZZ
@given(st.binary(max_size=200) | packed_batches())
def test_declared_batch_size_peek_never_raises(data: bytes) -> None:
    declared = declared_batch_size(data)
    if declared is None:
        return
    assert isinstance(declared, int) and declared >= 0
    try:
        _, reports = unpack_batch(data)
    except ProtocolError:
        return
    assert declared == len(reports)  # whenever the batch decodes, the peek saw its real size


# -- stored state read back ---------------------------------------------------------------------

MECHANISMS: list[MechanismParams] = [
    GRRParams(domain_size=5, epsilon=1.0),
    GRRParams(domain_size=2**24 + 1, epsilon=1.0),  # the sparse blob
    UnaryEncodingParams(domain_size=20, epsilon=1.0, variant=UnaryVariant.OPTIMIZED),
    LocalHashingParams(domain_size=300, epsilon=2.0),
]


@st.composite
def accumulator_blobs(draw: st.DrawFn) -> tuple[MechanismParams, bytes]:
    """Blobs of real accumulations, their hostile edits, and arbitrary int64 words."""
    params = draw(st.sampled_from(MECHANISMS))
    acc = CountAccumulator(params)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(0, 50))
    if isinstance(params, GRRParams):
        acc.add([int(v) for v in rng.integers(0, min(params.domain_size, 1000), n)])
    elif isinstance(params, UnaryEncodingParams):
        acc.add([params.randomize(int(v), rng=None) for v in rng.integers(0, params.domain_size, n)])
    else:
        acc._n = n  # the report-count blob
    blob = acc.to_bytes()
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return params, blob
    words = np.frombuffer(blob, dtype="<i8").copy()
    if kind == 1 and words.size:
        i = draw(st.integers(0, words.size - 1))
        words[i] = draw(st.sampled_from([-1, 0, 1, 2, 3, 2**62, -(2**63), 2**63 - 1, int(words[i]) + 1]))
        return params, words.tobytes()
    if kind == 2:
        return params, blob[: draw(st.integers(0, len(blob)))] + draw(st.binary(max_size=9))
    return params, draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=12).map(
        lambda w: np.array(w, dtype="<i8").tobytes()))


@FUZZ
@given(accumulator_blobs())
def test_accumulator_blob_decoder_raises_only_protocol_error(case: tuple[MechanismParams, bytes]) -> None:
    params, blob = case
    try:
        acc = CountAccumulator.from_bytes(params, blob)
    except ProtocolError:
        return
    assert acc.n >= 0
    assert acc.to_bytes() == blob  # a blob that decodes is the canonical form of its state


@FUZZ
@given(st.integers(0, 2**32 - 1), st.sampled_from(SPECS))
def test_stored_payload_decoder_raises_only_protocol_error(seed: int, spec: RoundSpec) -> None:
    rng = random.Random(seed)
    mutator = Mutator(rng)
    reports = [r for r in REPORTS if r.campaign_id == spec.campaign_id]
    params = component_params_from_spec(spec)
    rows = []
    for report in rng.sample(reports, rng.randrange(1, 4)):
        row = validate_report(report, CONTEXTS[spec.campaign_id])
        payloads = mutator.msgpack(row.payloads) if rng.random() < 0.7 else row.payloads
        rows.append(StoredReport(report_id=row.report_id, campaign_id=row.campaign_id, round=row.round,
                                 group=rng.choice([row.group, row.group, 7, 4095]), payloads=payloads))
    try:
        decoded = decode_report_payloads(rows, params)
    except ProtocolError:
        with pytest.raises(ProtocolError):
            rebuild(rows, params)
        return
    assert sum(map(len, decoded.values())) == sum(len(params[r.group]) for r in rows)


@FUZZ
@given(st.integers(0, 2**32 - 1), st.sampled_from(["centers", "grid", "heavy"]))
def test_engine_state_decoder_raises_only_protocol_error(seed: int, phase: str) -> None:
    blob = pack_state(phase, round=3, centers=[[0.1, 0.2]], cells=[1, 2, 3], seed=b"\x01" * 8)
    assert load_state(blob, "test", {phase}) == msgpack.unpackb(blob, raw=False, strict_map_key=False)
    mutator = Mutator(random.Random(seed))
    try:
        state = load_state(mutator.msgpack(blob), "test", {phase})
    except ProtocolError:
        return
    assert isinstance(state, dict) and state["phase"] == phase


def test_valid_messages_decode() -> None:
    """The starting points of the properties are valid (so the mutations start from real messages)."""
    assert unpack_batch(BATCH) == ("batch-1", REPORTS)
    batch = validate_batch(unpack_batch_columns(BATCH)[1], lookup)
    assert not batch.rejected and len(batch.valid) == len(REPORTS)
    for request_type, data in REQUESTS:
        assert parse_request(request_type, data).SerializeToString() == data
    assert declared_batch_size(BATCH) == len(REPORTS)
    assert reports_pb2.Report.FromString(SUBMIT.reports[0].SerializeToString()) == SUBMIT.reports[0]
