"""A population of simulated devices running the real device SDK.

A :class:`Population` is ``n`` simulated devices, each holding one point. For every round it takes
the decisions :meth:`ldp_client.device.Device.participate` takes on a phone -- the spec checked
against the :class:`~ldp_client.device.DevicePolicy`, the group drawn once per campaign in
proportion to the public ``group_weights``, the budget and report caps compared exactly -- through
the same SDK code (:func:`ldp_client.admission.admit`), and runs each component of the group's
task (encode, then randomize) into one :class:`~ldp_client.report.Report`. Three modes; the first
two take the same decisions and, for one seed, send the same reports bit for bit:

``device``
    One :meth:`Device.in_memory <ldp_client.device.Device.in_memory>` per simulated device: the
    SDK's own ledger and outbox (about 85 us and 2.6 kB per device).
``direct``
    No per-device objects: the per-device spending lives in arrays, the decision comes from
    :func:`~ldp_client.admission.admit`, and the components run through
    :func:`ldp_client.device.run_component` and ``check_payload`` as on a device (about 35 us and
    a few bytes per device). For large populations.
``vector``
    The ``direct`` state, and the same admission decisions, but every device's report of a round
    drawn with numpy in bulk, handed over as one :class:`~ldp_client.report.ReportColumns` per batch
    (:meth:`Population.participate_columns`; about 5 CPU us per report of a net-tree round, 5.5 s
    for 1e6 devices on a busy 2-core machine). It applies to a round whose group tasks' components
    all have an array path (:func:`.vector.unsupported`: the cell, SimHash, shifted-grid and
    nearest-candidate encoders with a GRR, unary-encoding or local-hashing oracle; a kCluster bit
    vector with bitwise randomized response; the vector maps with discrete Laplace, the box, the
    l2-ball or PrivUnit randomizer; the bucketed vector with the bucketized vector sum: every round of the
    center kinds), over a finite numeric ``(n, d)`` array of points:

    * groups are drawn with :func:`~ldp_client.admission.pick_group` (once per distinct draw
      ``u`` of ``randbelow(sum(group_weights))``), and :func:`~ldp_client.admission.admit` decides
      once per distinct device state (group, spending, reports): a device the per-device path
      refuses is refused here too, and a group drawn for a refused device is not recorded;
    * points are encoded on arrays (:func:`.vector.encode_points`, equal to the SDK encoder's
      output point for point), randomized from the mechanism's output distribution with a
      ``numpy.random.Generator`` seeded from the population seed (:func:`.vector.draw_payloads`:
      the same payload types and packing the SDK's ``randomize`` returns), and the report ids
      come from :func:`~ldp_client.report.new_report_id`.

    The reports are not the SDK path's bit for bit, but follow the same distribution (the tests
    compare the two with a two-sample test per mechanism and encoder). A round outside that set
    runs ``direct``: :attr:`Population.fallbacks` lists each such round and why, and a population
    created with ``mode="vector"`` also warns (:class:`VectorFallbackWarning`).
``auto`` (default) picks ``device`` up to :data:`AUTO_DEVICE_LIMIT` devices, ``vector`` above
(``direct`` for the rounds ``vector`` does not cover).

Randomness
    The mechanisms, group draws and report ids of a population come from one
    :class:`ldp_client.rng.SeededRng`. **Simulation randomness is reproducible and therefore not
    privacy-preserving**: never use it on real devices (the SDK's default is the OS CSPRNG).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.admission import Admission, admit, pick_group
from ldp_client.budget import UNIT, units
from ldp_client.device import Device, DevicePolicy, run_component
from ldp_client.errors import AlreadyReportedError, BudgetExhaustedError, InvalidParameterError
from ldp_client.report import REPORT_ID_BYTES, Report, ReportColumns, new_report_id
from ldp_client.rng import Rng, SeededRng
from ldp_client.spec import MAX_EPSILON_PER_CAMPAIGN, RoundSpec

from .vector import draw_payloads, encode_points, unsupported

__all__ = [
    "AUTO_DEVICE_LIMIT",
    "SIMULATION_POLICY",
    "Mode",
    "Population",
    "VectorFallbackWarning",
    "as_points",
    "numeric_bounds",
    "simulate_round",
]

Mode = Literal["auto", "device", "direct", "vector"]

#: ``mode="auto"`` simulates up to this many devices with one SDK ``Device`` each, and ``vector`` above.
AUTO_DEVICE_LIMIT = 50_000
#: What a simulated device agrees to: any campaign the collector may run (the spec's own
#: ``campaign_epsilon`` and ``max_reports_per_device`` still bind every device).
SIMULATION_POLICY = DevicePolicy(max_epsilon_per_campaign=MAX_EPSILON_PER_CAMPAIGN, max_epsilon_total=1e6,
                                 max_reports_per_campaign=1024)


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


@dataclass
class _CampaignState:
    """Per-device ledger of one campaign in ``direct`` mode: what a device's ledger records."""

    groups: NDArray[np.int32]  # -1: no group recorded yet
    #: Exact sums (Python ints) in units of ldp_client.budget.UNIT, as a device's ledger keeps them.
    #: An object array, not a list: the cyclic GC does not traverse numpy arrays, and a list of n
    #: ints in gen 2 made every full collection of the process (the collector's too) cost O(n).
    spent: NDArray[np.object_]
    reports: NDArray[np.int32]
    #: Round -> which devices were charged a report in it.
    charged: dict[int, NDArray[np.bool_]]


class VectorFallbackWarning(UserWarning):
    """A ``mode="vector"`` population ran a round ``direct`` (the message says which and why)."""


class _Preset:
    """An :class:`~ldp_client.rng.Rng` that hands out values drawn beforehand with numpy.

    It lets the vector mode call the SDK's own functions (:func:`~ldp_client.admission.pick_group`,
    :func:`~ldp_client.report.new_report_id`) on draws made in bulk: ``randbelow`` returns
    ``below`` and ``token_bytes`` the next bytes of ``data``. Any other call is a bug.
    """

    def __init__(self, below: int = 0, data: bytes = b"") -> None:
        self._below = below
        self._data = data
        self._offset = 0

    def randbelow(self, n: int) -> int:
        return self._below

    def token_bytes(self, n: int) -> bytes:
        out = self._data[self._offset:self._offset + n]
        self._offset += n
        return out

    def randbits(self, k: int) -> int:
        raise AssertionError("not drawn in bulk")  # pragma: no cover

    def bernoulli(self, num: int, den: int) -> bool:
        raise AssertionError("not drawn in bulk")  # pragma: no cover

    def uniform(self) -> float:
        raise AssertionError("not drawn in bulk")  # pragma: no cover

    def gauss(self) -> float:
        raise AssertionError("not drawn in bulk")  # pragma: no cover


def as_points(points: Any) -> list[Any]:
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
    mode : {"auto", "device", "direct", "vector"}

    Attributes
    ----------
    refused : int
        Reports the devices refused to produce (budget or report cap exhausted).
    fallbacks : list of str
        ``vector`` mode: one line per round it ran ``direct``, saying why.
    """

    def __init__(self, points: Any, *, seed: int, policy: DevicePolicy | None = None, mode: Mode = "auto") -> None:
        # The points as Python values (what the SDK encoders take) are made when a round first needs
        # them: a vector-mode population whose every round is drawn on the array never does (at
        # n = 1e7 the list of tuples alone would hold about 2 GB).
        self._points: list[Any] | None = None
        self._source: Any = points
        if isinstance(points, np.ndarray):
            if points.ndim not in (1, 2):
                raise InvalidParameterError(f"points must be a 1-D or 2-D array, got shape {points.shape}")
            self._n = len(points)
        else:
            self._points = as_points(points)
            self._n = len(self._points)
        if not self._n:
            raise InvalidParameterError("a population needs at least one device (point)")
        if mode not in ("auto", "device", "direct", "vector"):
            raise InvalidParameterError(f"mode must be 'auto', 'device', 'direct' or 'vector', got {mode!r}")
        self._mode: Literal["device", "direct", "vector"] = (
            ("device" if self._n <= AUTO_DEVICE_LIMIT else "vector") if mode == "auto" else mode)
        self._warn_fallback = mode == "vector"
        self._policy = SIMULATION_POLICY if policy is None else policy
        if not isinstance(self._policy, DevicePolicy):
            raise TypeError(f"policy must be a DevicePolicy, got {type(self._policy).__name__}")
        self._rng = SeededRng(seed)
        self._devices: list[Device | None] = [None] * self._n if self._mode == "device" else []
        self._campaigns: dict[str, _CampaignState] = {}
        self._unacknowledged: dict[bytes, int] = {}
        arrays = self._n if self._mode != "device" else 0
        self._total_spent: NDArray[np.object_] = np.zeros(arrays, dtype=np.object_)  # as _CampaignState.spent
        self._started = np.zeros(arrays, dtype=np.bool_)
        self.refused = 0
        self.fallbacks: list[str] = []
        # vector mode: the points as one array (None: not a finite numeric (n, d) array), the
        # generator of every bulk draw, and per round why it runs direct (None: it does not).
        self._array: NDArray[np.float64] | None = None
        if self._mode == "vector":
            self._array = _finite_matrix(points)
        self._generator = np.random.default_rng(seed)
        self._round_fallback: dict[tuple[str, int], str | None] = {}

    def __len__(self) -> int:
        return self._n

    @property
    def mode(self) -> Literal["device", "direct", "vector"]:
        """The mode in use (``auto`` resolved)."""
        return self._mode

    @property
    def points(self) -> list[Any]:
        """The devices' points, as the encoders take them."""
        if self._points is None:
            self._points = as_points(self._source)
        return self._points

    def _device(self, i: int) -> Device:
        device = self._devices[i]
        if device is None:
            device = self._devices[i] = Device.in_memory(self._policy, rng=self._rng, device_id=self._new_device_id())
        return device

    def _new_device_id(self) -> str:
        """A simulated device's id, drawn when it first takes part.

        Both modes draw it at the same moment, so that one seed gives the same stream in both: the
        device's id, then per round its group, its report id and its components' coins.
        """
        return self._rng.token_bytes(REPORT_ID_BYTES).hex()

    def participate(self, spec: RoundSpec, start: int = 0, stop: int | None = None) -> list[Report]:
        """Reports of devices ``start .. stop - 1`` for ``spec`` (devices whose group sits out send none).

        Raises
        ------
        PolicyViolationError
            The spec asks for more than the devices' policy allows.
        EncodingError
            A point does not fit the round's encoders.
        """
        return list(self.participate_columns(spec, start, stop))

    def participate_columns(self, spec: RoundSpec, start: int = 0, stop: int | None = None) -> Sequence[Report]:
        """:meth:`participate`, with a round drawn in bulk returned as one
        :class:`~ldp_client.report.ReportColumns`.

        The same reports, in the form a collector validates and stores column by column
        (:meth:`ldp_collector.core.Collector.submit`) without building a :class:`Report` per device
        (at 1e6 devices that object alone cost about 5 s); indexing it builds them. Other rounds
        return the list of :meth:`participate`.
        """
        stop = self._n if stop is None else min(stop, self._n)
        if self._mode == "device":
            return self._participate_devices(spec, start, stop)
        if self._mode == "vector" and self._vector_round(spec):
            return self._participate_vector(spec, start, stop)
        return self._participate_direct(spec, start, stop)

    def _vector_round(self, spec: RoundSpec) -> bool:
        """Whether ``vector`` mode draws ``spec``'s round in bulk (else it runs ``direct``, said once)."""
        key = (spec.campaign_id, spec.round)
        if key not in self._round_fallback:
            reason = self._vector_unsupported(spec)
            self._round_fallback[key] = reason
            if reason is not None:
                message = f"campaign {spec.campaign_id} round {spec.round}: direct mode ({reason})"
                self.fallbacks.append(message)
                if self._warn_fallback:
                    warnings.warn(f"vector mode falls back: {message}", VectorFallbackWarning, stacklevel=3)
        return self._round_fallback[key] is None

    def _vector_unsupported(self, spec: RoundSpec) -> str | None:
        if self._array is None:
            return "the points are not a finite numeric (n, d) array"
        for task in spec.tasks:
            for component in task.components:
                reason = unsupported(component)
                if reason is not None:
                    return reason
                domain = getattr(component.encoder, "domain", None)
                if domain is None or domain.dimension != self._array.shape[1]:
                    return "the points do not have the encoder's dimension"
        return None

    def _participate_devices(self, spec: RoundSpec, start: int, stop: int) -> list[Report]:
        out: list[Report] = []
        points = self.points
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
            n = self._n
            state = self._campaigns[spec.campaign_id] = _CampaignState(
                groups=np.full(n, -1, dtype=np.int32), spent=np.zeros(n, dtype=np.object_), reports=np.zeros(n, dtype=np.int32),
                charged={})
        return state

    def _participate_direct(self, spec: RoundSpec, start: int, stop: int) -> list[Report]:
        policy, rng, points = self._policy, self._rng, self.points
        policy.check(spec)
        state = self._state(spec)
        charged = state.charged.setdefault(spec.round, np.zeros(len(points), dtype=np.bool_))

        def group_rng() -> Rng:
            return rng

        out: list[Report] = []
        for i in range(start, stop):
            if not self._started[i]:
                self._new_device_id()  # only the draw matters: a direct-mode device keeps no id
                self._started[i] = True
            if charged[i]:
                continue  # already reported in this round (a resend, not a new report)
            recorded = int(state.groups[i])
            try:
                admission = admit(spec, policy, group=None if recorded < 0 else recorded, spent=state.spent[i],
                                  spent_total=self._total_spent[i], reports=int(state.reports[i]), group_rng=group_rng)
            except BudgetExhaustedError:
                self.refused += 1  # and, as on a device, a group drawn just now is not recorded
                continue
            group, task = admission.group, admission.task
            state.groups[i] = group  # recorded when the group sits out, or with the charge below
            if task is None:
                continue
            report_id = new_report_id(rng)
            payloads = tuple(c.mechanism.check_payload(run_component(c, points[i], rng=rng)) for c in task.components)
            out.append(Report(report_id=report_id, campaign_id=spec.campaign_id, round=spec.round, group=group,
                              payloads=payloads))
            cost = units(task.epsilon)
            state.spent[i] += cost
            self._total_spent[i] += cost
            state.reports[i] += 1
            charged[i] = True
        return out

    def _draw_groups(self, weights: tuple[int, ...], count: int) -> NDArray[np.int64]:
        """``count`` group draws: ``u = randbelow(sum(weights))`` in bulk, then the SDK's pick_group per distinct ``u``."""
        if len(weights) == 1:
            return np.zeros(count, dtype=np.int64)  # pick_group draws no coin either
        u = self._generator.integers(0, sum(weights), size=count, dtype=np.int64)
        distinct = np.unique(u)

        def group_of(position: int) -> int:
            return pick_group(weights, lambda: _Preset(below=int(distinct[position])))

        # pick_group is non-decreasing in u: bisect the sorted distinct draws for the first draw
        # of each later group (O(groups log n) calls) instead of calling it on every draw.
        firsts = []
        for group in range(1, len(weights)):
            low, high = 0, distinct.size
            while low < high:
                mid = (low + high) // 2
                if group_of(mid) < group:
                    low = mid + 1
                else:
                    high = mid
            firsts.append(int(distinct[low]) if low < distinct.size else int(sum(weights)))
        return np.searchsorted(np.array(firsts, dtype=np.int64), u, side="right").astype(np.int64)

    def _participate_vector(self, spec: RoundSpec, start: int, stop: int) -> Sequence[Report]:
        policy = self._policy
        policy.check(spec)
        state = self._state(spec)
        charged = state.charged.setdefault(spec.round, np.zeros(self._n, dtype=np.bool_))
        self._started[start:stop] = True  # a vector-mode device draws no id (as in direct mode, none is kept)
        devices = start + np.flatnonzero(~charged[start:stop])
        if not devices.size:
            return []
        groups = state.groups[devices].astype(np.int64)
        fresh = groups < 0
        if fresh.any():
            groups[fresh] = self._draw_groups(spec.group_weights, int(fresh.sum()))
        # admit() once per distinct device state: the same inputs give the same decision.
        keys = zip(groups.tolist(), state.spent[devices].tolist(), self._total_spent[devices].tolist(),
                   state.reports[devices].tolist())
        table: dict[tuple[int, int, int, int], int] = {}
        codes = np.fromiter((table.setdefault(k, len(table)) for k in keys), dtype=np.int64, count=devices.size)
        outcomes: list[Admission | None] = []
        for group, spent, spent_total, reports in table:
            try:
                outcomes.append(admit(spec, policy, group=group, spent=spent, spent_total=spent_total, reports=reports,
                                      group_rng=lambda: _Preset()))
            except BudgetExhaustedError:
                outcomes.append(None)
        refused = np.array([o is None for o in outcomes], dtype=np.bool_)[codes]
        self.refused += int(refused.sum())
        kept = ~refused
        state.groups[devices[kept]] = groups[kept]  # recorded when the group sits out, or with the charge
        reporting = kept & np.array([o is not None and o.task is not None for o in outcomes], dtype=np.bool_)[codes]
        order = np.flatnonzero(reporting)
        if not order.size:
            return []
        payloads: list[Any] = [None] * order.size
        points = self._array
        assert points is not None  # checked by _vector_round
        for task in spec.tasks:
            mine = np.flatnonzero(np.isin(groups[order], task.groups))
            if not mine.size:
                continue
            rows = points[devices[order[mine]]]
            drawn = [draw_payloads(c, encode_points(c.encoder, rows), self._generator) for c in task.components]
            for at, payload in zip(mine.tolist(), zip(*drawn)):
                payloads[at] = payload
            cost = units(task.epsilon)
            state.spent[devices[order[mine]]] += cost
            self._total_spent[devices[order[mine]]] += cost
        reporters = devices[order]
        state.reports[reporters] += 1
        charged[reporters] = True
        ids = _Preset(data=self._generator.bytes(REPORT_ID_BYTES * order.size))
        batch = ReportColumns(report_ids=[new_report_id(ids) for _ in range(order.size)],
                              campaign_ids=[spec.campaign_id] * order.size, rounds=[spec.round] * order.size,
                              groups=groups[order].tolist(), payloads=payloads)
        # Every position is a Report: the columns hold no undecodable entries (``errors`` is empty).
        return cast(Sequence[Report], batch)

    def acknowledge(self, reports: Sequence[Report]) -> None:
        """Forget reports the collector answered (``device`` mode: removes them from their devices' outboxes)."""
        if not self._unacknowledged:
            return  # only device mode keeps reports to forget (and a vector round's columns build none)
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
            return np.zeros(self._n)
        as_float: dict[int, float] = {}  # few distinct sums: convert each once (exact, then rounded)
        return np.array([as_float[s] if s in as_float else as_float.setdefault(s, float(s * UNIT))
                         for s in state.spent.tolist()], dtype=np.float64)


def _finite_matrix(points: Any) -> NDArray[np.float64] | None:
    """``points`` as a finite float64 ``(n, d)`` array, or ``None`` when they are not one."""
    try:
        x = np.asarray(points, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if x.ndim != 2 or not np.isfinite(x).all():
        return None
    return x


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
    mode : {"auto", "device", "direct", "vector"}

    Returns
    -------
    list of Report
        One per device whose group reports in this round, in device order.
    """
    if not isinstance(spec, RoundSpec):
        raise TypeError(f"spec must be a RoundSpec, got {type(spec).__name__}")
    return Population(points, seed=rng_seed, policy=policy, mode=mode).participate(spec)
