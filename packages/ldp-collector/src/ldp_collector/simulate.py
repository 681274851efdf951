"""In-process population simulator built on the real device SDK, and campaign runs against a collector.

A :class:`Population` is ``n`` simulated devices, each holding one point. For every round it runs
what :meth:`ldp_client.device.Device.participate` runs on a phone: the device checks the spec
against its :class:`~ldp_client.device.DevicePolicy`, picks its group once per campaign in
proportion to the public ``group_weights``, checks its budget and report caps, and runs each
component of its group's task (encode, then randomize) into one :class:`~ldp_client.report.Report`.
Two modes, with the same semantics:

``device``
    One :meth:`Device.in_memory <ldp_client.device.Device.in_memory>` per simulated device: the
    SDK's own ledger and outbox (about 85 us and 2.6 kB per device).
``direct``
    The same steps without per-device objects: the group draw is the SDK's exact
    ``randbelow(sum(group_weights))`` walk, the components run through
    :meth:`ldp_client.spec.Component.run` and ``check_payload`` exactly as ``Device.participate``
    calls them, and the budget checks mirror :meth:`ldp_client.ledger.Ledger.check_budget` on
    per-device arrays (about 35 us and a few bytes per device). For large populations.
``auto`` (default) picks ``device`` up to :data:`AUTO_DEVICE_LIMIT` devices, ``direct`` above.

:func:`run_campaign` creates a campaign on a collector and plays every round until the campaign
is finished: fetch the round spec, let the population participate, submit the reports in batches,
close the round. The collector is either in-process (a :class:`~ldp_collector.core.Collector`,
which validates and stores exactly as the gRPC service does) or a running server reached over
gRPC (:class:`RemoteCollector`: the SDK's :class:`~ldp_client.grpc.CollectorClient` for the
device calls, :class:`OperatorClient` with the bearer token for the operator calls).

Randomness
    The points come from ``numpy.random.default_rng(seed)`` (:mod:`ldp_collector.datasets`); the
    mechanisms, group draws and report ids of a population come from one
    :class:`ldp_client.rng.SeededRng`. **Simulation randomness is reproducible and therefore not
    privacy-preserving**: never use it on real devices (the SDK's default is the OS CSPRNG).

Evaluation
    :func:`histogram_truth` and :func:`evaluate_histogram` compare a histogram's estimates with the
    true counts (computed with the campaign's own encoder, so the cell geometry is the devices');
    :func:`evaluate_clustering` scores a clustering result (ARI, NMI, Hungarian accuracy, cost
    ratio to non-private k-means).
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray
from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

from ldp.v1 import campaigns_pb2, service_pb2
from ldp_client.budget import UNIT, fits, units
from ldp_client.device import Device, DevicePolicy
from ldp_client.encoders.base import NumericDomain
from ldp_client.encoders.geometry import TreeCell
from ldp_client.encoders.grid import CellListEncoder
from ldp_client.errors import AlreadyReportedError, BudgetExhaustedError, InvalidParameterError, LdpError
from ldp_client.report import REPORT_ID_BYTES, Report, new_report_id
from ldp_client.rng import Rng, SeededRng
from ldp_client.spec import MAX_EPSILON_PER_CAMPAIGN, RoundNotOpen, RoundSpec

from .core import Collector
from .errors import RoundNotOpenError
from .evaluation import (
    adjusted_rand_index,
    assign,
    kmeans_cost,
    normalized_mutual_info,
    reference_kmeans,
    reference_kmeans_cost,
)
from .evaluation import evaluate_clustering as evaluate_labels
from .evaluation import hungarian_accuracy as clustering_accuracy
from .kinds import KINDS as REGISTERED_KINDS
from .storage.base import Outcome

if TYPE_CHECKING:
    import grpc

    from ldp.v1 import service_pb2_grpc
    from ldp_client.grpc import CollectorClient

__all__ = [
    "AUTO_DEVICE_LIMIT",
    "CLUSTERING_KINDS",
    "KINDS",
    "SIMULATION_POLICY",
    "CampaignRun",
    "CollectorBackend",
    "InProcessCollector",
    "OperatorClient",
    "Population",
    "RemoteCollector",
    "SimulationError",
    "SimulationStats",
    "SubmitCounts",
    "adjusted_rand_index",
    "clustering_accuracy",
    "evaluate_clustering",
    "evaluate_histogram",
    "histogram_truth",
    "kind_value",
    "kmeans",
    "kmeans_cost",
    "normalized_mutual_info",
    "numeric_bounds",
    "pick_group",
    "run_campaign",
    "simulate_round",
]

Mode = Literal["auto", "device", "direct"]

#: ``mode="auto"`` simulates up to this many devices with one SDK ``Device`` each.
AUTO_DEVICE_LIMIT = 50_000
#: What a simulated device agrees to: any campaign the collector may run (the spec's own
#: ``campaign_epsilon`` and ``max_reports_per_device`` still bind every device).
SIMULATION_POLICY = DevicePolicy(max_epsilon_per_campaign=MAX_EPSILON_PER_CAMPAIGN, max_epsilon_total=1e6,
                                 max_reports_per_campaign=1024)
#: Campaign kinds by CLI name (``ldp.v1.CampaignKind`` names, lower case).
KINDS: tuple[str, ...] = tuple(REGISTERED_KINDS)
#: Kinds whose result is a clustering.
CLUSTERING_KINDS: frozenset[str] = frozenset(name for name, kind in REGISTERED_KINDS.items() if kind.clustering)


class SimulationError(RuntimeError):
    """A simulated campaign could not complete (the campaign failed, a round never opened ...)."""


def kind_value(name: str) -> campaigns_pb2.CampaignKind.ValueType:
    """The ``ldp.v1.CampaignKind`` of a lower-case kind name (``"histogram"``).

    Raises
    ------
    InvalidParameterError
        Unknown name; the message lists the known kinds.
    """
    if name not in KINDS:
        raise InvalidParameterError(f"unknown campaign kind {name!r}; known kinds: {', '.join(KINDS)}")
    return REGISTERED_KINDS[name].value


def numeric_bounds(points: ArrayLike) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-dimension ``(lower, upper)`` covering every point; a flat dimension is widened by 0.5 each way.

    A simulation shortcut: a real campaign publishes bounds fixed before any data is seen.
    """
    x = np.asarray(points, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise InvalidParameterError(f"points must be a non-empty (n, d) array, got shape {x.shape}")
    lower = x.min(axis=0)
    upper = x.max(axis=0)
    flat = upper <= lower
    lower = np.where(flat, lower - 0.5, lower)
    upper = np.where(flat, upper + 0.5, upper)
    return tuple(float(v) for v in lower), tuple(float(v) for v in upper)


# -- the population ---------------------------------------------------------------------------------

def pick_group(group_weights: Sequence[int], rng: Rng) -> int:
    """Group ``g`` with probability exactly ``group_weights[g] / sum(group_weights)``.

    The same draw as ``Device`` makes: ``u = randbelow(sum)``, then the first group whose
    cumulative weight exceeds ``u``.
    """
    u = rng.randbelow(sum(group_weights))
    for group, weight in enumerate(group_weights):
        if u < weight:
            return group
        u -= weight
    raise AssertionError("unreachable: u < sum(group_weights)")


@dataclass
class _CampaignState:
    """Per-device ledger of one campaign in ``direct`` mode."""

    groups: NDArray[np.int32]
    spent: list[int]  # exact sums in units of ldp_client.budget.UNIT, as a device's ledger keeps them
    reports: NDArray[np.int32]
    #: Round -> which devices were charged a report in it.
    charged: dict[int, NDArray[np.bool_]]


def _as_points(points: Any) -> list[Any]:
    """Points as plain Python values (tuples of floats, or ints), the form the SDK encoders take."""
    if isinstance(points, np.ndarray):
        if points.ndim == 1:
            return [int(v) if np.issubdtype(points.dtype, np.integer) else float(v) for v in points.tolist()]
        if points.ndim == 2:
            return [tuple(row) for row in points.tolist()]
        raise InvalidParameterError(f"points must be a 1-D or 2-D array, got shape {points.shape}")
    if isinstance(points, (str, bytes)) or not isinstance(points, Sequence):
        raise TypeError(f"points must be a sequence or numpy array, got {type(points).__name__}")
    return list(points)


class Population:
    """``n`` simulated devices, one point each (module docstring).

    Parameters
    ----------
    points : numpy.ndarray or sequence
        One point per device in the form the campaign's encoders take: rows of an ``(n, d)``
        array (numeric domains), integers (categorical domains), or any sequence of such.
    seed : int
        Seed of the population's :class:`~ldp_client.rng.SeededRng` (simulation only: not
        privacy-preserving randomness).
    policy : DevicePolicy, optional
        Every device's policy; default :data:`SIMULATION_POLICY`.
    mode : {"auto", "device", "direct"}
    """

    def __init__(self, points: Any, *, seed: int, policy: DevicePolicy | None = None, mode: Mode = "auto") -> None:
        self._points = _as_points(points)
        if not self._points:
            raise InvalidParameterError("a population needs at least one device (point)")
        if mode not in ("auto", "device", "direct"):
            raise InvalidParameterError(f"mode must be 'auto', 'device' or 'direct', got {mode!r}")
        self._mode: Literal["device", "direct"] = (
            ("device" if len(self._points) <= AUTO_DEVICE_LIMIT else "direct") if mode == "auto" else mode)
        self._policy = SIMULATION_POLICY if policy is None else policy
        if not isinstance(self._policy, DevicePolicy):
            raise TypeError(f"policy must be a DevicePolicy, got {type(self._policy).__name__}")
        self._rng = SeededRng(seed)
        self._devices: list[Device | None] = [None] * len(self._points) if self._mode == "device" else []
        self._campaigns: dict[str, _CampaignState] = {}
        self._unacknowledged: dict[bytes, int] = {}
        self._total_spent = [0] * (len(self._points) if self._mode == "direct" else 0)
        #: Reports the devices refused to produce (budget or report cap exhausted).
        self.refused = 0

    def __len__(self) -> int:
        return len(self._points)

    @property
    def mode(self) -> Literal["device", "direct"]:
        """The mode in use (``auto`` resolved)."""
        return self._mode

    @property
    def points(self) -> list[Any]:
        """The devices' points, as the encoders take them."""
        return self._points

    def _device(self, i: int) -> Device:
        device = self._devices[i]
        if device is None:
            device = self._devices[i] = Device.in_memory(self._policy, rng=self._rng)
        return device

    def participate(self, spec: RoundSpec, start: int = 0, stop: int | None = None) -> list[Report]:
        """Reports of devices ``start .. stop - 1`` for ``spec`` (devices whose group sits out send none).

        Raises
        ------
        PolicyViolationError
            The spec asks for more than the devices' policy allows.
        EncodingError
            A point does not fit the round's encoders.
        """
        stop = len(self._points) if stop is None else min(stop, len(self._points))
        if self._mode == "device":
            return self._participate_devices(spec, start, stop)
        return self._participate_direct(spec, start, stop)

    def _participate_devices(self, spec: RoundSpec, start: int, stop: int) -> list[Report]:
        out: list[Report] = []
        points = self._points
        for i in range(start, stop):
            try:
                report = self._device(i).participate(spec, points[i])
            except BudgetExhaustedError:
                self.refused += 1
                continue
            except AlreadyReportedError:
                continue  # reported and acknowledged in this round already: nothing new to send
            if report is not None:
                out.append(report)
                self._unacknowledged[report.report_id] = i
        return out

    def _state(self, spec: RoundSpec) -> _CampaignState:
        state = self._campaigns.get(spec.campaign_id)
        if state is None:
            n = len(self._points)
            state = self._campaigns[spec.campaign_id] = _CampaignState(
                groups=np.full(n, -1, dtype=np.int32), spent=[0] * n, reports=np.zeros(n, dtype=np.int32),
                charged={})
        return state

    def _participate_direct(self, spec: RoundSpec, start: int, stop: int) -> list[Report]:
        policy, rng, points = self._policy, self._rng, self._points
        policy.check(spec)
        state = self._state(spec)
        weights = spec.group_weights
        campaign_cap = min(spec.campaign_epsilon, policy.max_epsilon_per_campaign)
        total_cap = policy.max_epsilon_total
        max_reports = min(spec.max_reports_per_device, policy.max_reports_per_campaign)
        tasks = {g: spec.task_for(g) for g in range(len(weights))}
        charged = state.charged.setdefault(spec.round, np.zeros(len(points), dtype=np.bool_))
        out: list[Report] = []
        for i in range(start, stop):
            group = int(state.groups[i])
            if group < 0:
                group = state.groups[i] = pick_group(weights, rng)
            task = tasks[group]
            if task is None or charged[i]:
                continue  # sits out this round, or already reported in it (a resend, not a new report)
            epsilon = task.epsilon
            if (not fits(state.spent[i], epsilon, campaign_cap) or not fits(self._total_spent[i], epsilon, total_cap)
                    or state.reports[i] >= max_reports):
                self.refused += 1
                continue
            payloads = tuple(c.mechanism.check_payload(c.run(points[i], rng=rng)) for c in task.components)
            out.append(Report(report_id=new_report_id(rng), campaign_id=spec.campaign_id,
                              round=spec.round, group=group, payloads=payloads))
            state.spent[i] += units(epsilon)
            self._total_spent[i] += units(epsilon)
            state.reports[i] += 1
            charged[i] = True
        return out

    def acknowledge(self, reports: Sequence[Report]) -> None:
        """Forget reports the collector answered (``device`` mode: removes them from their devices' outboxes)."""
        for report in reports:
            i = self._unacknowledged.pop(report.report_id, None)
            if i is not None:
                device = self._devices[i]
                if device is not None:
                    device.acknowledge((report.report_id,))

    def epsilon_spent(self, campaign_id: str) -> NDArray[np.float64]:
        """Epsilon each device spent in ``campaign_id`` (from the SDK ledgers in ``device`` mode)."""
        if self._mode == "device":
            return np.array([d.spent(campaign_id) if d is not None else 0.0 for d in self._devices])
        state = self._campaigns.get(campaign_id)
        if state is None:
            return np.zeros(len(self._points))
        return np.array([float(s * UNIT) for s in state.spent], dtype=np.float64)


def simulate_round(spec: RoundSpec, points: Any, rng_seed: int, *, policy: DevicePolicy | None = None,
                   mode: Mode = "auto") -> list[Report]:
    """The reports a fresh population holding ``points`` sends for ``spec``.

    Parameters
    ----------
    spec : RoundSpec
    points : numpy.ndarray or sequence
        One point per device (see :class:`Population`).
    rng_seed : int
        Seed of the population's :class:`~ldp_client.rng.SeededRng` (not privacy-preserving).
    policy : DevicePolicy, optional
        Default :data:`SIMULATION_POLICY`.
    mode : {"auto", "device", "direct"}

    Returns
    -------
    list of Report
        One per device whose group reports in this round, in device order.
    """
    if not isinstance(spec, RoundSpec):
        raise TypeError(f"spec must be a RoundSpec, got {type(spec).__name__}")
    return Population(points, seed=rng_seed, policy=policy, mode=mode).participate(spec)


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

    def create_campaign(self, config: campaigns_pb2.CampaignConfig) -> campaigns_pb2.Campaign:
        """Create a campaign and open its first round."""
        ...

    def get_campaign(self, campaign_id: str) -> campaigns_pb2.Campaign:
        """The campaign's state."""
        ...

    def get_round_spec(self, campaign_id: str) -> tuple[RoundSpec | None, bool]:
        """The open round's spec (``None`` between rounds) and whether the campaign is finished."""
        ...

    def submit(self, reports: Sequence[Report]) -> SubmitCounts:
        """Submit one batch of reports."""
        ...

    def close_round(self, campaign_id: str, round: int) -> campaigns_pb2.Campaign:
        """Close the open round ``round`` and run the server step."""
        ...

    def get_result(self, campaign_id: str) -> campaigns_pb2.Result:
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

    def create_campaign(self, config: campaigns_pb2.CampaignConfig) -> campaigns_pb2.Campaign:
        return self.collector.create_campaign(config)

    def get_campaign(self, campaign_id: str) -> campaigns_pb2.Campaign:
        return self.collector.get_campaign(campaign_id)

    def get_round_spec(self, campaign_id: str) -> tuple[RoundSpec | None, bool]:
        try:
            return self.collector.get_round_spec(campaign_id)
        except RoundNotOpenError:
            return None, False

    def submit(self, reports: Sequence[Report]) -> SubmitCounts:
        request_id = self._rng.token_bytes(REPORT_ID_BYTES).hex()
        return _counts([(int(o), r) for o, r in self.collector.submit(request_id, list(reports))])

    def close_round(self, campaign_id: str, round: int) -> campaigns_pb2.Campaign:
        return self.collector.close_round(campaign_id, round)

    def get_result(self, campaign_id: str) -> campaigns_pb2.Result:
        return self.collector.get_result(campaign_id)


class OperatorClient:
    """A client of the collector's ``ldp.v1.OperatorService`` (bearer-token authenticated).

    The collector's *server* modules never import ``grpc`` (only :mod:`ldp_collector.service`
    does); this is a client for the CLI and the simulator, so it imports ``grpc`` when built.
    Failures raise the SDK's errors: :class:`~ldp_client.grpc.RequestRejectedError` for
    INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, ALREADY_EXISTS, OUT_OF_RANGE and
    :class:`~ldp_client.grpc.RpcFailedError` for everything else (UNAUTHENTICATED, UNAVAILABLE ...);
    both are :class:`~ldp_client.errors.LdpError` and carry the status code and message.

    Parameters
    ----------
    target : str
        ``host:port`` of the collector.
    token : str, optional
        The operator token (``authorization: Bearer <token>``).
    credentials : grpc.ChannelCredentials, optional
        TLS credentials; ``None`` opens an insecure channel.
    timeout : float
        Deadline of each unary call, in seconds.
    """

    def __init__(self, target: str, *, token: str | None = None, credentials: grpc.ChannelCredentials | None = None,
                 timeout: float = 30.0) -> None:
        import grpc as grpc_module

        from ldp.v1 import service_pb2_grpc as stubs

        if not isinstance(target, str) or not target:
            raise InvalidParameterError(f"target must be a non-empty 'host:port' string, got {target!r}")
        if token is not None and (not token or any(c in token for c in "\r\n ")):
            raise InvalidParameterError("the operator token must be a non-empty single word")
        self._grpc = grpc_module
        self._timeout = timeout
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel = (grpc_module.insecure_channel(target) if credentials is None
                         else grpc_module.secure_channel(target, credentials))
        self._stub: service_pb2_grpc.OperatorServiceStub = stubs.OperatorServiceStub(self._channel)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> OperatorClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _error(self, method: str, exc: Exception) -> LdpError:
        from ldp_client.grpc import RequestRejectedError, RpcFailedError

        grpc_module = self._grpc
        # The RpcError of a call is also its grpc.Call (code, details).
        code_of = getattr(exc, "code", None)
        details_of = getattr(exc, "details", None)
        code = code_of() if callable(code_of) else grpc_module.StatusCode.UNKNOWN
        details = str((details_of() if callable(details_of) else exc) or "")
        rejected = {grpc_module.StatusCode.INVALID_ARGUMENT, grpc_module.StatusCode.NOT_FOUND,
                    grpc_module.StatusCode.FAILED_PRECONDITION, grpc_module.StatusCode.ALREADY_EXISTS,
                    grpc_module.StatusCode.OUT_OF_RANGE}
        if code in rejected:
            return RequestRejectedError(method, code, details)
        return RpcFailedError(method, code, details, 1)

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self._timeout, metadata=self._metadata)
        except self._grpc.RpcError as exc:
            raise self._error(method, exc) from exc

    def create_campaign(self, config: campaigns_pb2.CampaignConfig) -> campaigns_pb2.Campaign:
        """``CreateCampaign``."""
        response: campaigns_pb2.Campaign = self._call(
            "CreateCampaign", service_pb2.CreateCampaignRequest(config=config))
        return response

    def list_campaigns(self, page_size: int = 0) -> list[campaigns_pb2.Campaign]:
        """Every campaign (``ListCampaigns``, all pages)."""
        out: list[campaigns_pb2.Campaign] = []
        token = ""
        while True:
            page: service_pb2.ListCampaignsResponse = self._call(
                "ListCampaigns", service_pb2.ListCampaignsRequest(page_size=page_size, page_token=token))
            out.extend(page.campaigns)
            token = page.next_page_token
            if not token:
                return out

    def get_campaign(self, campaign_id: str) -> campaigns_pb2.Campaign:
        """``GetCampaign``."""
        response: campaigns_pb2.Campaign = self._call(
            "GetCampaign", service_pb2.GetCampaignRequest(campaign_id=campaign_id))
        return response

    def close_round(self, campaign_id: str, round: int) -> campaigns_pb2.Campaign:
        """``CloseRound``."""
        response: campaigns_pb2.Campaign = self._call(
            "CloseRound", service_pb2.CloseRoundRequest(campaign_id=campaign_id, round=round))
        return response

    def get_estimates(self, campaign_id: str, round: int = 0, confidence: float = 0.0) -> campaigns_pb2.Estimates:
        """``GetEstimates`` (round 0: the latest closed round with estimates)."""
        response: campaigns_pb2.Estimates = self._call(
            "GetEstimates", service_pb2.GetEstimatesRequest(campaign_id=campaign_id, round=round,
                                                            confidence=confidence))
        return response

    def get_result(self, campaign_id: str) -> campaigns_pb2.Result:
        """``GetResult``."""
        response: service_pb2.GetResultResponse = self._call(
            "GetResult", service_pb2.GetResultRequest(campaign_id=campaign_id))
        return response.result

    def watch(self, campaign_id: str, timeout: float | None = None) -> Iterator[service_pb2.CampaignEvent]:
        """``WatchCampaign``: progress events until the campaign finishes or fails (or ``timeout`` s)."""
        stream = self._stub.WatchCampaign(service_pb2.WatchCampaignRequest(campaign_id=campaign_id),
                                          timeout=timeout, metadata=self._metadata)
        try:
            yield from stream
        except self._grpc.RpcError as exc:
            raise self._error("WatchCampaign", exc) from exc
        finally:
            stream.cancel()  # type: ignore[no-untyped-call, unused-ignore]


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

    def create_campaign(self, config: campaigns_pb2.CampaignConfig) -> campaigns_pb2.Campaign:
        return self.operator.create_campaign(config)

    def get_campaign(self, campaign_id: str) -> campaigns_pb2.Campaign:
        return self.operator.get_campaign(campaign_id)

    def get_round_spec(self, campaign_id: str) -> tuple[RoundSpec | None, bool]:
        spec = self.device.poll_round_spec(campaign_id)  # between two rounds: RoundNotOpen, at once
        if isinstance(spec, RoundNotOpen):
            return None, False
        if spec is not None:
            return spec, False
        return None, self.operator.get_campaign(campaign_id).state != campaigns_pb2.COLLECTING

    def submit(self, reports: Sequence[Report]) -> SubmitCounts:
        submit = self.device.submit_packed if self._packed else self.device.submit
        return _counts([(int(o.status), o.reason) for o in submit(reports)])

    def close_round(self, campaign_id: str, round: int) -> campaigns_pb2.Campaign:
        return self.operator.close_round(campaign_id, round)

    def get_result(self, campaign_id: str) -> campaigns_pb2.Result:
        return self.operator.get_result(campaign_id)


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
            "rejection_reasons": dict(self.rejection_reasons),
        }


@dataclass(frozen=True)
class CampaignRun:
    """The outcome of :func:`run_campaign`.

    Attributes
    ----------
    campaign_id : str
    campaign : ldp.v1.Campaign
        The campaign at the end (FINISHED).
    result : ldp.v1.Result
    first_spec : RoundSpec
        The spec of the first round (its encoders define the truth for evaluation).
    stats : SimulationStats
    """

    campaign_id: str
    campaign: campaigns_pb2.Campaign
    result: campaigns_pb2.Result
    first_spec: RoundSpec
    stats: SimulationStats


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
    if campaign.state != campaigns_pb2.COLLECTING or campaign.current_round.round != round:
        return
    if any(r.round == round and r.open for r in campaign.rounds):
        backend.close_round(campaign_id, round)


def run_campaign(collector: Collector | CollectorBackend, config: campaigns_pb2.CampaignConfig, points: Any, *,
                 seed: int = 0, policy: DevicePolicy | None = None, mode: Mode = "auto", batch_size: int = 1000,
                 quiet: bool = False, max_rounds: int = 64, round_timeout_s: float = 60.0) -> CampaignRun:
    """Create a campaign, let a simulated population play every round, and return the result.

    Parameters
    ----------
    collector : Collector or CollectorBackend
        An in-process :class:`~ldp_collector.core.Collector` (wrapped in
        :class:`InProcessCollector`), a :class:`RemoteCollector`, or another backend.
    config : ldp.v1.CampaignConfig
    points : numpy.ndarray or sequence
        One point per device (see :class:`Population`).
    seed : int
        Seed of the population's mechanisms (simulation only, not privacy-preserving).
    policy : DevicePolicy, optional
        Default :data:`SIMULATION_POLICY`.
    mode : {"auto", "device", "direct"}
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
    population = Population(points, seed=seed, policy=policy, mode=mode)
    n = len(population)
    started = time.perf_counter()
    campaign = backend.create_campaign(config)
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
                reports = population.participate(spec, start, stop)
                if reports:
                    counts = backend.submit(reports)
                    sent += len(reports)
                    accepted += counts.accepted
                    duplicates += counts.duplicates
                    rejected += counts.rejected
                    reasons.update(counts.reasons)
                    population.acknowledge(reports)
                bar.update(stop - start)
        _close_if_open(backend, campaign_id, spec.round)
    campaign = backend.get_campaign(campaign_id)
    if campaign.state == campaigns_pb2.FAILED:
        raise SimulationError(f"campaign {campaign_id} failed: {campaign.error or 'no reason given'}")
    if first_spec is None:
        raise SimulationError(f"campaign {campaign_id} finished before any round was played")
    result = backend.get_result(campaign_id)
    wall = time.perf_counter() - started
    spent = population.epsilon_spent(campaign_id)
    stats = SimulationStats(
        devices=n, rounds=rounds, reports_sent=sent, accepted=accepted, duplicates=duplicates, rejected=rejected,
        refused=population.refused, epsilon_per_device=float(spent.max()), mean_epsilon_per_device=float(spent.mean()),
        wall_time_s=wall, mode=population.mode, rejection_reasons=dict(reasons.most_common(5)))
    return CampaignRun(campaign_id=campaign_id, campaign=campaign, result=result, first_spec=first_spec, stats=stats)


# -- evaluation: histograms ------------------------------------------------------------------------

def histogram_truth(spec: RoundSpec, points: Any, group: int = 0, component_index: int = 0) -> NDArray[np.int64]:
    """True count of every value of a histogram round, encoded with the round's own encoder.

    Parameters
    ----------
    spec : RoundSpec
    points : numpy.ndarray or sequence
        Every device's point.
    group, component_index : int
        Whose encoder to use.

    Returns
    -------
    numpy.ndarray of int64, shape (domain_size,)
    """
    task = spec.task_for(group)
    if task is None:
        raise InvalidParameterError(f"group {group} does not report in round {spec.round}")
    encoder = task.components[component_index].encoder
    size = encoder.output_size
    values = np.fromiter((encoder.encode(p) for p in _as_points(points)), dtype=np.int64)
    return np.bincount(values, minlength=size).astype(np.int64)


def evaluate_histogram(estimates: campaigns_pb2.Estimates, truth: ArrayLike) -> dict[str, float]:
    """Error of a histogram's estimates against the true counts.

    Returns
    -------
    dict
        ``reports``; ``max_abs_freq_error`` and ``mean_abs_freq_error`` (|count - truth| / n);
        ``rmse_count``; ``mean_std_error``; ``mean_abs_z`` (mean |count - truth| / SE, about
        sqrt(2/pi) = 0.80 for unbiased, normal estimates with the right SE); ``max_abs_z``;
        ``ci_coverage`` (share of true counts inside the stored intervals, about the confidence
        level).
    """
    true = np.asarray(truth, dtype=np.float64)
    if not estimates.estimates:
        raise InvalidParameterError("the estimates are empty")
    values = np.array([e.value for e in estimates.estimates], dtype=np.int64)
    if values.max() >= len(true):
        raise InvalidParameterError(f"estimate value {int(values.max())} is outside the {len(true)} true counts")
    counts = np.array([e.count for e in estimates.estimates])
    se = np.array([e.std_error for e in estimates.estimates])
    low = np.array([e.ci_lower for e in estimates.estimates])
    high = np.array([e.ci_upper for e in estimates.estimates])
    t = true[values]
    n = max(int(estimates.reports), 1)
    err = counts - t
    positive = se > 0
    z = np.abs(err[positive]) / se[positive]
    return {
        "reports": float(estimates.reports),
        "values": float(len(values)),
        "max_abs_freq_error": float(np.abs(err).max() / n),
        "mean_abs_freq_error": float(np.abs(err).mean() / n),
        "rmse_count": float(np.sqrt(np.mean(err**2))),
        "mean_std_error": float(se.mean()),
        "mean_abs_z": float(z.mean()) if z.size else math.nan,
        "max_abs_z": float(z.max()) if z.size else math.nan,
        "ci_coverage": float(np.mean((t >= low) & (t <= high))),
        "confidence": float(estimates.confidence),
    }


# -- evaluation: clusterings -----------------------------------------------------------------------

def kmeans(points: ArrayLike, k: int, *, seed: int = 0, restarts: int = 3, iterations: int = 100,
           sample: int = 100_000) -> NDArray[np.float64]:
    """Centers of the non-private reference k-means (:func:`ldp_collector.evaluation.reference_kmeans`,
    ``k`` capped at the number of points)."""
    x = np.asarray(points, dtype=np.float64)
    return reference_kmeans(x, max(1, min(int(k), len(x))), seed, restarts, max_iter=iterations,
                            sample=sample).centers


def _cell_labels(cell_map: campaigns_pb2.CellClusterMap, points: NDArray[np.float64]) -> NDArray[np.int64]:
    encoder = CellListEncoder(
        domain=NumericDomain(lower=tuple(cell_map.domain.lower), upper=tuple(cell_map.domain.upper)),
        cells=tuple(TreeCell(level=c.level, morton_index=c.morton_index) for c in cell_map.cells))
    labels = np.asarray(cell_map.labels, dtype=np.int64)
    return labels[np.fromiter((encoder.encode(tuple(p)) for p in points.tolist()), dtype=np.int64)]


def evaluate_clustering(result: campaigns_pb2.Result, points: ArrayLike, labels_true: ArrayLike | None, *,
                        k: int | None = None, seed: int = 0) -> dict[str, float]:
    """Scores of a clustering result on the true points.

    Each point gets the label of its nearest published center (or of its cell in a grid
    clustering's cell map, ``-1`` = noise), scored by :func:`ldp_collector.evaluation.evaluate_clustering`:
    with true labels ``ari``, ``nmi``, ``fmi``, ``accuracy`` (Hungarian), ``purity``, ``f_measure``;
    always ``nicv`` and ``noise_share``; with centers ``cost``, ``cost_per_point``, ``center_error`` and
    ``cost_ratio``, the cost of the published centers over the cost of non-private k-means with the
    same k (:func:`ldp_collector.evaluation.reference_kmeans_cost`; 1 = as good as a trusted
    curator). ``clusters`` counts the published clusters.
    """
    x = np.asarray(points, dtype=np.float64)
    clustering = result.clustering
    centers = np.asarray(clustering.centers, dtype=np.float64)
    if centers.size:
        dim = int(clustering.dimension) or x.shape[1]
        centers = centers.reshape(-1, dim)
        predicted = assign(x, centers)[0]
        reference = reference_kmeans_cost(x, max(1, min(k or len(centers), len(x))), seed)
        out = evaluate_labels(x, labels_true, predicted, centers=centers, reference_cost=reference)
        out["clusters"] = float(len(centers))
        return out
    if clustering.HasField("cell_map") and clustering.cell_map.cells:
        out = evaluate_labels(x, labels_true, _cell_labels(clustering.cell_map, x))
        out["clusters"] = float(len(set(clustering.cell_map.labels) - {-1}))
        return out
    raise InvalidParameterError("the result holds no clustering (neither centers nor a cell map)")

