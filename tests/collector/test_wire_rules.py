"""The rules of docs/protocol.md §8 that the messages alone do not state, on a real collector core.

Report ids are deduplicated across campaigns; a request id reused for other reports is a new batch;
a local-hashing seed of 2^32 or more is rejected (``INVALID_PAYLOAD``) in both encodings although the
``HashedValue.seed`` field is a uint64; a set padding bit is rejected. The packed batch's layout and
its refusals are pinned by the test vectors (``proto/vectors/v1/packed.json``).
"""

from __future__ import annotations

from pathlib import Path

import msgpack

from ldp.v1 import campaigns_pb2, reports_pb2
from ldp_client import serde
from ldp_client.payload import HashedValue
from ldp_client.report import Report, unpack_batch
from ldp_client.rng import SeededRng
from ldp_client.spec import RoundSpec
from ldp_collector.core import Collector
from ldp_collector.ingest import Rejection, RejectionCode
from ldp_collector.serde import config_from_proto
from ldp_collector.storage import open_store
from ldp_collector.storage.base import Outcome


def _collector(tmp_path: Path) -> Collector:
    return Collector(open_store(str(tmp_path / "ldp-data")))


def _histogram(collector: Collector, campaign_id: str, oracle: int, size: int = 8) -> RoundSpec:
    config = campaigns_pb2.CampaignConfig(campaign_id=campaign_id, kind=campaigns_pb2.HISTOGRAM, epsilon=2.0,
                                          domain=campaigns_pb2.Domain(categorical_size=size))
    config.histogram.oracle = oracle  # type: ignore[assignment]
    collector.create_campaign(config_from_proto(config))
    spec, _ = collector.get_round_spec(campaign_id)
    assert spec is not None
    return spec


def _reports(spec: RoundSpec, n: int, seed: int) -> list[Report]:
    rng = SeededRng(seed)
    task = spec.task_for(0)
    assert task is not None
    return [Report(report_id=rng.token_bytes(16), campaign_id=spec.campaign_id, round=spec.round, group=0,
                   payloads=tuple(c.run(i % 8, rng=rng) for c in task.components)) for i in range(n)]


def test_report_ids_are_deduplicated_across_campaigns(tmp_path: Path) -> None:
    collector = _collector(tmp_path)
    first = _reports(_histogram(collector, "first", campaigns_pb2.GRR), 1, seed=1)[0]
    second_spec = _histogram(collector, "second", campaigns_pb2.GRR)
    again = Report(report_id=first.report_id, campaign_id="second", round=second_spec.round, group=0,
                   payloads=first.payloads)
    assert collector.submit("a", [first]) == [(Outcome.ACCEPTED, "")]
    assert collector.submit("b", [again]) == [(Outcome.DUPLICATE, "")]


def test_a_request_id_reused_for_other_reports_is_a_new_batch(tmp_path: Path) -> None:
    collector = _collector(tmp_path)
    reports = _reports(_histogram(collector, "hist", campaigns_pb2.GRR), 4, seed=2)
    assert [o for o, _ in collector.submit("same", reports[:2])] == [Outcome.ACCEPTED] * 2
    # Not the first answer replayed: the other reports are stored, and the first batch's retry is
    # still answered as at first.
    assert [o for o, _ in collector.submit("same", reports[2:])] == [Outcome.ACCEPTED] * 2
    assert [o for o, _ in collector.submit("same", reports[:2])] == [Outcome.ACCEPTED] * 2
    assert [o for o, _ in collector.submit("other", reports)] == [Outcome.DUPLICATE] * 4


def _rejection(outcomes: list[tuple[Outcome, str]]) -> RejectionCode:
    (outcome, reason), = outcomes
    assert outcome == Outcome.REJECTED and isinstance(reason, Rejection)
    return reason.code


def test_a_hash_seed_of_2_to_the_32_is_rejected_in_both_encodings(tmp_path: Path) -> None:
    collector = _collector(tmp_path)
    spec = _histogram(collector, "olh", campaigns_pb2.OLH)
    good = _reports(spec, 1, seed=3)[0]
    assert isinstance(good.payloads[0], HashedValue)
    for k, seed in enumerate((2**32, 2**64 - 1)):
        # The protobuf form: the uint64 field carries the seed; the mechanism's range refuses it.
        message = serde.report_to_proto(good)
        message.report_id = bytes([k]) * 16
        message.payloads[0].hashed.seed = seed
        decoded = serde.report_from_proto(reports_pb2.Report.FromString(message.SerializeToString()))
        assert decoded.payloads == (HashedValue(seed, good.payloads[0].value),)
        assert _rejection(collector.submit(f"proto-{k}", [decoded])) == RejectionCode.INVALID_PAYLOAD
        # The packed form: [3, seed, bucket] decodes the same way and is rejected the same way.
        wire = [1, bytes([k + 10]) * 16, "olh", spec.round, 0, [[3, seed, good.payloads[0].value]]]
        _, items = unpack_batch(msgpack.packb([1, "r", [wire]], use_bin_type=True))
        assert _rejection(collector.submit(f"packed-{k}", items)) == RejectionCode.INVALID_PAYLOAD
    assert [o for o, _ in collector.submit("good", [good])] == [Outcome.ACCEPTED]


def test_a_set_padding_bit_is_rejected(tmp_path: Path) -> None:
    collector = _collector(tmp_path)
    spec = _histogram(collector, "oue", campaigns_pb2.OUE, size=12)
    good = _reports(spec, 1, seed=4)[0]
    bits = good.payloads[0]
    assert isinstance(bits, bytes) and len(bits) == 2
    padded = Report(report_id=b"\x07" * 16, campaign_id="oue", round=spec.round, group=0,
                    payloads=(bits[:1] + bytes([bits[1] | 0x10]),))
    assert _rejection(collector.submit("pad", [padded])) == RejectionCode.INVALID_PAYLOAD
    assert [o for o, _ in collector.submit("good", [good])] == [Outcome.ACCEPTED]
