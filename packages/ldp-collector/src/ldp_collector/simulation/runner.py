"""Simulated campaigns: a :class:`~.population.Population` plays every round of a campaign on a collector.

:func:`run_campaign` creates a campaign on a collector and plays every round until the campaign
is finished: fetch the round spec, let the population participate, submit the reports in batches
(a vector round's batch as :class:`~ldp_client.report.ReportColumns`, which the in-process collector
validates and stores column by column), close the round. :attr:`SimulationStats.phase_s` says where
the time went. The collector is either in-process (:class:`InProcessCollector` over a
:class:`~ldp_collector.core.Collector`, which validates and stores exactly as the gRPC service
does) or a running server reached over gRPC (:class:`RemoteCollector`: the SDK's
:class:`~ldp_client.grpc.CollectorClient` for the device calls, the operator's
:class:`~ldp_collector.operator.OperatorClient` with the bearer token for the operator calls).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

from ldp_client.device import DevicePolicy
from ldp_client.errors import InvalidParameterError
from ldp_client.report import REPORT_ID_BYTES, Report, ReportColumns
from ldp_client.rng import SeededRng
from ldp_client.spec import RoundNotOpen, RoundSpec

from ..core import Collector
from ..errors import RoundNotOpenError
from ..model import Campaign, CampaignConfig, CampaignState, Result
from ..operator import OperatorClient
from ..serde import campaign_from_proto, config_to_proto, result_from_proto
from ..storage.base import Outcome
from .population import Mode, Population

if TYPE_CHECKING:
    from ldp_client.grpc import CollectorClient

__all__ = [
    "PHASES",
    "CampaignRun",
    "CollectorBackend",
    "InProcessCollector",
    "RemoteCollector",
    "SimulationError",
    "SimulationStats",
    "SubmitCounts",
    "run_campaign",
]


#: The phases of :attr:`SimulationStats.phase_s`, in the order a round runs them.
PHASES = ("devices", "reports", "ingest", "steps", "other")


class SimulationError(RuntimeError):
    """A simulated campaign could not complete (the campaign failed, a round never opened ...)."""


# -- collectors ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SubmitCounts:
    """Outcomes of one submitted batch."""

    accepted: int
    duplicates: int
    rejected: int
    reasons: tuple[str, ...] = ()


class CollectorBackend(Protocol):
    """What :func:`run_campaign` needs from a collector (in-process or over gRPC)."""

    def create_campaign(self, config: CampaignConfig) -> Campaign:
        """Create a campaign and open its first round."""
        ...

    def get_campaign(self, campaign_id: str) -> Campaign:
        """The campaign's state."""
        ...

    def get_round_spec(self, campaign_id: str) -> tuple[RoundSpec | None, bool]:
        """The open round's spec (``None`` between rounds) and whether the campaign is finished."""
        ...

    def submit(self, reports: Sequence[Report]) -> SubmitCounts:
        """Submit one batch of reports."""
        ...

    def close_round(self, campaign_id: str, round: int) -> Campaign:
        """Close the open round ``round`` and run the server step."""
        ...

    def get_result(self, campaign_id: str) -> Result:
        """The campaign's result."""
        ...


def _counts(outcomes: Sequence[tuple[int, str]]) -> SubmitCounts:
    tally = Counter(int(o) for o, _ in outcomes)
    return SubmitCounts(accepted=tally[int(Outcome.ACCEPTED)], duplicates=tally[int(Outcome.DUPLICATE)],
                        rejected=tally[int(Outcome.REJECTED)],
                        reasons=tuple(reason for o, reason in outcomes if int(o) == int(Outcome.REJECTED)))


class InProcessCollector:
    """:class:`CollectorBackend` over an in-process :class:`~ldp_collector.core.Collector`.

    Parameters
    ----------
    collector : Collector
    seed : int
        Seed of the batches' request ids.
    """

    def __init__(self, collector: Collector, *, seed: int = 0) -> None:
        if not isinstance(collector, Collector):
            raise TypeError(f"collector must be a Collector, got {type(collector).__name__}")
        self.collector = collector
        self._rng = SeededRng(seed ^ 0x5EED)

    def create_campaign(self, config: CampaignConfig) -> Campaign:
        return self.collector.create_campaign(config)

    def get_campaign(self, campaign_id: str) -> Campaign:
        return self.collector.get_campaign(campaign_id)

    def get_round_spec(self, campaign_id: str) -> tuple[RoundSpec | None, bool]:
        try:
            return self.collector.get_round_spec(campaign_id)
        except RoundNotOpenError:
            return None, False

    def submit(self, reports: Sequence[Report]) -> SubmitCounts:
        request_id = self._rng.token_bytes(REPORT_ID_BYTES).hex()
        # Columns (a vector round) go as they are: the collector validates and stores them column by column.
        batch = reports if isinstance(reports, ReportColumns) else list(reports)
        return _counts([(int(o), r) for o, r in self.collector.submit(request_id, batch)])

    def close_round(self, campaign_id: str, round: int) -> Campaign:
        return self.collector.close_round(campaign_id, round)

    def get_result(self, campaign_id: str) -> Result:
        return self.collector.get_result(campaign_id)


class RemoteCollector:
    """:class:`CollectorBackend` over a running collector reached by gRPC.

    Parameters
    ----------
    target : str
        ``host:port``.
    operator_token : str, optional
        Bearer token of the operator calls.
    device_token : str, optional
        Bearer token of the device calls, when the collector requires one.
    packed : bool
        Submit with ``SubmitPacked`` (msgpack batches) rather than ``SubmitReports``.
    timeout : float
        Deadline of each call, in seconds.
    """

    def __init__(self, target: str, *, operator_token: str | None = None, device_token: str | None = None,
                 packed: bool = True, timeout: float = 60.0) -> None:
        from ldp_client.grpc import CollectorClient

        self.operator = OperatorClient(target, token=operator_token, timeout=timeout)
        try:
            self.device: CollectorClient = CollectorClient(target, device_token=device_token, timeout=timeout,
                                                           max_batch=10_000)
        except BaseException:
            self.operator.close()
            raise
        self._packed = packed

    def close(self) -> None:
        """Close both channels."""
        self.operator.close()
        self.device.close()

    def __enter__(self) -> RemoteCollector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def create_campaign(self, config: CampaignConfig) -> Campaign:
        return campaign_from_proto(self.operator.create_campaign(config_to_proto(config)))

    def get_campaign(self, campaign_id: str) -> Campaign:
        return campaign_from_proto(self.operator.get_campaign(campaign_id))

    def get_round_spec(self, campaign_id: str) -> tuple[RoundSpec | None, bool]:
        spec = self.device.poll_round_spec(campaign_id)  # between two rounds: RoundNotOpen, at once
        if isinstance(spec, RoundNotOpen):
            return None, False
        if spec is not None:
            return spec, False
        return None, self.get_campaign(campaign_id).state != CampaignState.COLLECTING

    def submit(self, reports: Sequence[Report]) -> SubmitCounts:
        submit = self.device.submit_packed if self._packed else self.device.submit
        return _counts([(int(o.status), o.reason) for o in submit(reports)])

    def close_round(self, campaign_id: str, round: int) -> Campaign:
        return campaign_from_proto(self.operator.close_round(campaign_id, round))

    def get_result(self, campaign_id: str) -> Result:
        return result_from_proto(self.operator.get_result(campaign_id))


# -- campaign runs ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class SimulationStats:
    """What a simulated campaign cost and sent.

    Attributes
    ----------
    devices, rounds : int
    reports_sent, accepted, duplicates, rejected : int
        Reports submitted and the collector's outcomes.
    refused : int
        Reports the devices refused to produce (budget or report cap).
    epsilon_per_device : float
        Largest epsilon one device spent in the campaign (sequential composition over its reports).
    mean_epsilon_per_device : float
    wall_time_s : float
        From campaign creation to the result.
    mode : str
        The population's mode.
    rejection_reasons : dict of str to int
        The most frequent reasons of rejected reports.
    fallbacks : tuple of str
        ``vector`` mode: the rounds it ran ``direct``, and why (:attr:`Population.fallbacks`).
    phase_s, phase_cpu_s : dict of str to float
        Wall and CPU seconds per phase (:data:`PHASES`; the process's CPU time, every thread: on a
        shared machine the wall time mostly measures the other jobs): ``devices`` (setting up the
        population, before ``wall_time_s`` starts), then where ``wall_time_s`` went: ``reports``
        (the devices' admission and report draws), ``ingest`` (submitting the reports: validation,
        storage, ingest-time accumulation), ``steps`` (closing the rounds: the server steps) and
        ``other`` (creating the campaign, polling for rounds, the result). A caller may add phases
        outside the campaign (the ``simulate`` command adds ``data`` and ``evaluation``).
    """

    devices: int
    rounds: int
    reports_sent: int
    accepted: int
    duplicates: int
    rejected: int
    refused: int
    epsilon_per_device: float
    mean_epsilon_per_device: float
    wall_time_s: float
    mode: str
    rejection_reasons: dict[str, int] = field(default_factory=dict)
    fallbacks: tuple[str, ...] = ()
    phase_s: dict[str, float] = field(default_factory=dict)
    phase_cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def reports_per_second(self) -> float:
        return self.reports_sent / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values."""
        return {
            "devices": self.devices, "rounds": self.rounds, "reports_sent": self.reports_sent,
            "accepted": self.accepted, "duplicates": self.duplicates, "rejected": self.rejected,
            "refused": self.refused, "epsilon_per_device": self.epsilon_per_device,
            "mean_epsilon_per_device": self.mean_epsilon_per_device, "wall_time_s": self.wall_time_s,
            "reports_per_second": self.reports_per_second, "mode": self.mode,
            "rejection_reasons": dict(self.rejection_reasons), "fallbacks": list(self.fallbacks),
            "phase_s": dict(self.phase_s), "phase_cpu_s": dict(self.phase_cpu_s),
        }


@dataclass(frozen=True)
class CampaignRun:
    """The outcome of :func:`run_campaign`.

    Attributes
    ----------
    campaign_id : str
    campaign : Campaign
        The campaign at the end (FINISHED).
    result : Result
        The campaign's published result (:class:`ldp_collector.model.Result`).
    first_spec : RoundSpec
        The spec of the first round (its encoders define the truth for evaluation).
    stats : SimulationStats
    """

    campaign_id: str
    campaign: Campaign
    result: Result
    first_spec: RoundSpec
    stats: SimulationStats


class _Phases:
    """Wall and CPU seconds per phase of :data:`PHASES`, charged from the last mark."""

    def __init__(self) -> None:
        self.wall = dict.fromkeys(PHASES, 0.0)
        self.cpu = dict.fromkeys(PHASES, 0.0)
        self.mark()

    def mark(self) -> None:
        """Start timing a phase now."""
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def charge(self, phase: str) -> None:
        """Add the time since the last mark to ``phase``, and mark again."""
        wall, cpu = time.perf_counter(), time.process_time()
        self.wall[phase] += wall - self._wall
        self.cpu[phase] += cpu - self._cpu
        self._wall, self._cpu = wall, cpu

    def rest(self, phase: str, wall: float, cpu: float) -> None:
        """``phase`` gets what the others (but ``devices``, outside the campaign) left of ``wall`` and ``cpu``."""
        self.wall[phase] = wall - sum(v for k, v in self.wall.items() if k not in (phase, "devices"))
        self.cpu[phase] = cpu - sum(v for k, v in self.cpu.items() if k not in (phase, "devices"))


def _progress_disabled(quiet: bool) -> bool:
    return quiet or not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())


def _wait_for_round(backend: CollectorBackend, campaign_id: str, timeout: float,
                    poll: float = 0.05) -> tuple[RoundSpec | None, bool]:
    deadline = time.monotonic() + timeout
    while True:
        spec, finished = backend.get_round_spec(campaign_id)
        if spec is not None or finished:
            return spec, finished
        if time.monotonic() >= deadline:
            raise SimulationError(f"campaign {campaign_id} opened no round within {timeout:g} s")
        time.sleep(poll)


def _close_if_open(backend: CollectorBackend, campaign_id: str, round: int) -> None:
    """Close ``round`` unless the collector already did (``close_after_reports``, a deadline)."""
    campaign = backend.get_campaign(campaign_id)
    current = campaign.current_round
    if campaign.state != CampaignState.COLLECTING or current is None or current.round != round:
        return
    if any(r.round == round and r.open for r in campaign.rounds):
        backend.close_round(campaign_id, round)


def run_campaign(collector: Collector | CollectorBackend, config: CampaignConfig, points: Any, *,
                 seed: int = 0, policy: DevicePolicy | None = None, mode: Mode = "auto", batch_size: int = 1000,
                 quiet: bool = False, max_rounds: int = 64, round_timeout_s: float = 60.0) -> CampaignRun:
    """Create a campaign, let a simulated population play every round, and return the result.

    Parameters
    ----------
    collector : Collector or CollectorBackend
        An in-process :class:`~ldp_collector.core.Collector` (wrapped in
        :class:`InProcessCollector`), a :class:`RemoteCollector`, or another backend.
    config : CampaignConfig
    points : numpy.ndarray or sequence
        One point per device (see :class:`Population`).
    seed : int
        Seed of the population's mechanisms (simulation only, not privacy-preserving), and the
        campaign seed (the engine's public randomness) when ``config`` sets none, so that a
        simulation repeats whole.
    policy : DevicePolicy, optional
        Default :data:`SIMULATION_POLICY`.
    mode : {"auto", "device", "direct", "vector"}
    batch_size : int
        Reports per submitted batch, in [1, 10000].
    quiet : bool
        No progress bar (there is none anyway when stderr is not a terminal).
    max_rounds : int
        Give up (:class:`SimulationError`) after this many rounds.
    round_timeout_s : float
        How long to wait for the next round to open after a close.

    Returns
    -------
    CampaignRun

    Raises
    ------
    SimulationError
        The campaign failed, never finished within ``max_rounds``, or a round never opened.
    CollectorError, LdpError
        From the collector (bad configuration ...) or the SDK (a spec the devices refuse).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 10_000:
        raise InvalidParameterError(f"batch_size must be an integer in [1, 10000], got {batch_size!r}")
    backend: CollectorBackend = InProcessCollector(collector, seed=seed) if isinstance(collector, Collector) \
        else collector
    phases = _Phases()
    population = Population(points, seed=seed, policy=policy, mode=mode)
    n = len(population)
    phases.charge("devices")
    started, cpu_started = time.perf_counter(), time.process_time()
    campaign = backend.create_campaign(config if config.seed is not None else replace(config, seed=seed))
    campaign_id = campaign.config.campaign_id
    sent = accepted = duplicates = rejected = rounds = 0
    reasons: Counter[str] = Counter()
    first_spec: RoundSpec | None = None
    disable = _progress_disabled(quiet)
    while True:
        spec, finished = _wait_for_round(backend, campaign_id, round_timeout_s)
        if finished or spec is None:
            break
        if rounds >= max_rounds:
            raise SimulationError(f"campaign {campaign_id} did not finish within {max_rounds} rounds")
        rounds += 1
        first_spec = first_spec or spec
        with tqdm(total=n, desc=f"round {spec.round}", unit="dev", disable=disable, leave=False) as bar:
            for start in range(0, n, batch_size):
                stop = min(n, start + batch_size)
                phases.mark()
                reports = population.participate_columns(spec, start, stop)
                phases.charge("reports")
                if reports:
                    counts = backend.submit(reports)
                    sent += len(reports)
                    accepted += counts.accepted
                    duplicates += counts.duplicates
                    rejected += counts.rejected
                    reasons.update(counts.reasons)
                    population.acknowledge(reports)
                    phases.charge("ingest")
                bar.update(stop - start)
        phases.mark()
        _close_if_open(backend, campaign_id, spec.round)
        phases.charge("steps")
    campaign = backend.get_campaign(campaign_id)
    if campaign.state == CampaignState.FAILED:
        raise SimulationError(f"campaign {campaign_id} failed: {campaign.error or 'no reason given'}")
    if first_spec is None:
        raise SimulationError(f"campaign {campaign_id} finished before any round was played")
    result = backend.get_result(campaign_id)
    wall = time.perf_counter() - started
    phases.rest("other", wall, time.process_time() - cpu_started)
    spent = population.epsilon_spent(campaign_id)
    stats = SimulationStats(
        devices=n, rounds=rounds, reports_sent=sent, accepted=accepted, duplicates=duplicates, rejected=rejected,
        refused=population.refused, epsilon_per_device=float(spent.max()), mean_epsilon_per_device=float(spent.mean()),
        wall_time_s=wall, mode=population.mode, rejection_reasons=dict(reasons.most_common(5)),
        fallbacks=tuple(population.fallbacks), phase_s=phases.wall, phase_cpu_s=phases.cpu)
    return CampaignRun(campaign_id=campaign_id, campaign=campaign, result=result, first_spec=first_spec, stats=stats)
