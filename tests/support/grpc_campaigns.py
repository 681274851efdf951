"""Shared pieces of the campaign-over-gRPC integration tests: real SDK devices playing a round."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ldp_client import Device, RoundSpec
from ldp_client.grpc import CollectorClient, OutcomeStatus

__all__ = ["Played", "play_round"]


@dataclass
class Played:
    """A played campaign: its id, the round specs the devices saw, the devices and their points."""

    campaign_id: str
    specs: list[RoundSpec]
    devices: list[Device]
    points: list[tuple[float, ...]]


def play_round(client: CollectorClient, spec: RoundSpec, devices: Sequence[Device],
               points: Sequence[tuple[float, ...]], batch: int = 1000) -> int:
    """Every device participates in ``spec``; the reports go in batches; returns the reports accepted."""
    reports = [(device, device.participate(spec, point)) for device, point in zip(devices, points)]
    sent = [(device, report) for device, report in reports if report is not None]
    accepted = 0
    for start in range(0, len(sent), batch):
        chunk = sent[start:start + batch]
        outcomes = client.submit_packed([report for _, report in chunk])
        accepted += sum(o.status is OutcomeStatus.ACCEPTED for o in outcomes)
        for (device, report), _ in zip(chunk, outcomes):
            device.acknowledge([report.report_id])
    return accepted
