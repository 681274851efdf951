"""``decode_report_payloads``: stored rows to decoded payload lists per component, errors naming the report."""

from __future__ import annotations

import msgpack
import pytest

from ldp_client.errors import ProtocolError
from ldp_client.mechanisms import GRRParams
from ldp_client.payload import SignedVector, payload_from_wire, payload_to_wire
from ldp_collector.estimation.accumulators import decode_report_payloads
from ldp_collector.storage.base import StoredReport

GRR = GRRParams(domain_size=8, epsilon=1.0)
PARAMS = {0: (GRR,), 2: (GRR, GRR)}


def row(group: int, wire: object, tag: int = 1) -> StoredReport:
    return StoredReport(report_id=bytes([tag]) * 16, campaign_id="c", round=1, group=group,
                        payloads=msgpack.packb(wire, use_bin_type=True))


def test_every_component_gets_its_payloads_in_report_order() -> None:
    signed = payload_to_wire(SignedVector(7, b"\x01"))
    rows = [row(2, [3, signed]), row(0, [5]), row(2, [4, b"\x02"]), row(0, [6])]
    decoded = decode_report_payloads(rows, PARAMS)
    assert decoded == {"2:0": [3, 4], "2:1": [payload_from_wire(signed), b"\x02"], "0:0": [5, 6]}
    assert list(decoded) == ["2:0", "2:1", "0:0"]
    assert decode_report_payloads([], PARAMS) == {}


@pytest.mark.parametrize(("bad", "message"), [
    (row(2, [3, [99, 1]], tag=9), r"report (09){16} \(group 2\) component 1: malformed payload"),
    (row(1, [3], tag=9), r"report (09){16} \(group 1\): the group does not report in this round"),
    (row(0, [3, 4], tag=9), r"report (09){16} \(group 0\): expected a list of 1 payloads"),
    (StoredReport(report_id=bytes([9]) * 16, campaign_id="c", round=1, group=0, payloads=b"\xc1"),
     r"report (09){16} \(group 0\): payloads are not valid msgpack"),
])
def test_a_bad_row_is_named(bad: StoredReport, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_report_payloads([row(0, [1]), bad], PARAMS)
