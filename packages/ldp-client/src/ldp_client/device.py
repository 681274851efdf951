"""One device taking part in LDP campaigns: its policy, budget ledger and outbox.

Usage, with the gRPC extra (``pip install "ldp-client[grpc]"``)::

    import grpc
    from ldp_client.device import Device, DevicePolicy
    from ldp_client.grpc import CollectorClient, Sender

    device = Device("/data/app/ldp", DevicePolicy(max_epsilon_per_campaign=2.0))
    with CollectorClient("collector.example.org:443", credentials=grpc.ssl_channel_credentials(),
                         device_token=token) as client:
        spec = client.get_round_spec("traffic-2026")          # None once the campaign is finished
        if spec is not None and not device.has_reported(spec.campaign_id, spec.round):
            device.participate(spec, (latitude, longitude))    # charged and stored, not sent yet
        outcome = Sender(device, client).drain()               # send; forget what the collector took
        for rejected in outcome.rejected:
            log.warning("report %s rejected: %s", rejected.report.report_id.hex(), rejected.reason)

Without grpcio, ship the packed reports any way you like and acknowledge them afterwards::

    from ldp_client.report import pack_batch

    reports = device.pending_reports()
    body = pack_batch(request_id, reports)  # keep request_id: resend the same bytes on failure
    ...                                     # the collector's answer arrived
    device.acknowledge(r.report_id for r in reports)

What :meth:`Device.participate` guarantees
    * The spec is checked against the device's own :class:`DevicePolicy` (kinds, epsilon and report
      caps): a spec asking for more raises :class:`~ldp_client.errors.PolicyViolationError`.
    * The device picks its group once per campaign with its own randomness, in proportion to the
      public ``group_weights`` (exactly: ``randbelow(sum)``), and keeps it.
    * One report per round, never re-sampled: asking again returns the stored report (same bytes);
      once the collector acknowledged it, :class:`~ldp_client.errors.AlreadyReportedError` is raised
      (the report is no longer stored, and a second report would spend the budget twice).
    * With a :class:`RoundAssignment` from the collector (enrolled devices), the report carries the
      assigned report id and every seeded component (local hashing, bucketized vectors) uses the
      assigned hash seed instead of drawing one. Both are public randomness derived from the
      device identity, campaign and round only, so the privacy guarantee is unchanged.
    * Budget: the campaign's charges plus this report stay within
      ``min(spec.campaign_epsilon, policy.max_epsilon_per_campaign)``, the device's total within
      ``policy.max_epsilon_total``, and the number of reports within
      ``min(spec.max_reports_per_device, policy.max_reports_per_campaign)``; otherwise
      :class:`~ldp_client.errors.BudgetExhaustedError`.

Crash safety
    The report is written to the outbox first, then the ledger is charged; only charged reports are
    handed to a sender. A crash in between leaves an uncharged report in the outbox: the next
    locked operation (``participate``, ``pending_reports``, :meth:`Device.recover`) charges it and
    it is returned, never re-sampled. It is discarded instead, unsent, only when charging it is no
    longer allowed (the round was meanwhile charged with another report, or the policy was lowered
    below what it costs). A corrupted ledger raises :class:`~ldp_client.errors.LedgerCorruptedError`
    and the device stops reporting; the budget is never reset.

Durability is not optional on a real device. Simulations that create many devices use
:meth:`Device.in_memory`, which keeps identical semantics without files.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._validation import check_float, check_int
from .errors import (
    AlreadyReportedError,
    BudgetExhaustedError,
    LedgerCorruptedError,
    PolicyViolationError,
    ProtocolError,
)
from .ledger import LEDGER_FILE, MARKER_FILE, Ledger
from .mechanisms.bucketized_vector import BucketizedVectorParams
from .mechanisms.local_hashing import SEED_BITS, LocalHashingParams
from .outbox import Outbox
from .payload import Payload
from .report import REPORT_ID_BYTES, Report, new_report_id
from .rng import Rng, resolve_rng
from .spec import MAX_COMPONENTS, MAX_EPSILON_PER_CAMPAIGN, Component, RoundSpec

__all__ = ["OUTBOX_DIR", "SEEDED_MECHANISMS", "Device", "DevicePolicy", "RoundAssignment", "run_component"]

OUTBOX_DIR = "outbox"
#: Largest total budget a policy may allow over the device's lifetime.
MAX_EPSILON_TOTAL = 1e6


#: Mechanisms whose payload carries a hash seed drawn by the device (or assigned by the collector).
SEEDED_MECHANISMS: tuple[type[LocalHashingParams] | type[BucketizedVectorParams], ...] = (
    LocalHashingParams, BucketizedVectorParams)


@dataclass(frozen=True, kw_only=True)
class RoundAssignment:
    """Public randomness the collector assigns an enrolled device for one round (``ldp.v1.RoundAssignment``).

    Parameters
    ----------
    report_id : bytes
        The id the device's report of the round must carry (16 bytes): one report per round.
    hash_seeds : tuple of int
        ``hash_seeds[i]`` in [0, 2^32) is the seed of component ``i`` of the device's task when its
        mechanism draws one (:data:`SEEDED_MECHANISMS`); at most 8 entries.
    """

    report_id: bytes
    hash_seeds: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.report_id, bytes):
            raise TypeError(f"report_id must be bytes, got {type(self.report_id).__name__}")
        if len(self.report_id) != REPORT_ID_BYTES:
            raise ProtocolError(f"assigned report_id must be {REPORT_ID_BYTES} bytes, got {len(self.report_id)}")
        if not isinstance(self.hash_seeds, (tuple, list)):
            raise TypeError(f"hash_seeds must be a sequence of ints, got {type(self.hash_seeds).__name__}")
        object.__setattr__(self, "hash_seeds", tuple(self.hash_seeds))
        if len(self.hash_seeds) > MAX_COMPONENTS:
            raise ProtocolError(f"an assignment holds at most {MAX_COMPONENTS} hash seeds, got {len(self.hash_seeds)}")
        for i, seed in enumerate(self.hash_seeds):
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**SEED_BITS:
                raise ProtocolError(f"hash_seeds[{i}] must be in [0, 2^{SEED_BITS}), got {seed!r:.40}")

    def seed_for(self, index: int, component: Component) -> int | None:
        """The assigned seed of component ``index``, or None when its mechanism draws no seed.

        Raises
        ------
        ProtocolError
            The mechanism draws a seed but the assignment has none for this component.
        """
        if not isinstance(component.mechanism, SEEDED_MECHANISMS):
            return None
        if index >= len(self.hash_seeds):
            raise ProtocolError(f"component {index} ({component.mechanism.KIND}) needs an assigned hash seed, "
                                f"but the assignment has {len(self.hash_seeds)}")
        return self.hash_seeds[index]


def run_component(component: Component, point: Any, *, rng: Rng, seed: int | None = None) -> Payload:
    """Encode ``point`` and randomize it with ``component``; a seeded mechanism uses ``seed`` when given."""
    if seed is None:
        return component.run(point, rng=rng)  # type: ignore[no-any-return]  # a Payload, unannotated
    mechanism = component.mechanism
    if not isinstance(mechanism, (LocalHashingParams, BucketizedVectorParams)):
        raise TypeError(f"mechanism {mechanism.KIND} draws no hash seed; it cannot use an assigned one")
    return mechanism.randomize(component.encoder.encode(point), rng=rng, seed=seed)


@dataclass(frozen=True, kw_only=True)
class DevicePolicy:
    """What a device agrees to, whatever a collector asks.

    Parameters
    ----------
    max_epsilon_per_campaign : float
        Largest budget one campaign may spend, in (0, 100]; default 4.
    max_epsilon_total : float
        Largest budget all campaigns together may spend over the device's lifetime; default 32.
    max_reports_per_campaign : int
        Largest number of reports (rounds) per campaign, in [1, 1024]; default 16.
    allowed_kinds : tuple of str
        Campaign kinds the device takes part in (``"histogram"``, ``"grid"`` ...); empty means any.
    """

    max_epsilon_per_campaign: float = 4.0
    max_epsilon_total: float = 32.0
    max_reports_per_campaign: int = 16
    allowed_kinds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_epsilon_per_campaign", check_float(
            "max_epsilon_per_campaign", self.max_epsilon_per_campaign, 0.0, MAX_EPSILON_PER_CAMPAIGN, low_open=True))
        object.__setattr__(self, "max_epsilon_total", check_float(
            "max_epsilon_total", self.max_epsilon_total, 0.0, MAX_EPSILON_TOTAL, low_open=True))
        check_int("max_reports_per_campaign", self.max_reports_per_campaign, 1, 1024)
        if not isinstance(self.allowed_kinds, (tuple, list)):
            raise TypeError(f"allowed_kinds must be a sequence of strings, got {type(self.allowed_kinds).__name__}")
        object.__setattr__(self, "allowed_kinds", tuple(self.allowed_kinds))
        for kind in self.allowed_kinds:
            if not isinstance(kind, str) or not kind:
                raise TypeError(f"allowed_kinds must hold non-empty strings, got {kind!r}")

    def check(self, spec: RoundSpec) -> None:
        """Raise :class:`PolicyViolationError` if ``spec`` asks for more than this policy allows."""
        if self.allowed_kinds and spec.kind not in self.allowed_kinds:
            raise PolicyViolationError(
                f"campaign {spec.campaign_id!r} has kind {spec.kind!r}, which the device's policy does not allow "
                f"(allowed: {', '.join(self.allowed_kinds)})")
        if spec.campaign_epsilon > self.max_epsilon_per_campaign:
            raise PolicyViolationError(
                f"campaign {spec.campaign_id!r} asks for campaign_epsilon {spec.campaign_epsilon:g}, above the device's "
                f"max_epsilon_per_campaign {self.max_epsilon_per_campaign:g}")
        if spec.max_reports_per_device > self.max_reports_per_campaign:
            raise PolicyViolationError(
                f"campaign {spec.campaign_id!r} asks for up to {spec.max_reports_per_device} reports per device, above the device's "
                f"max_reports_per_campaign {self.max_reports_per_campaign}")


class Device:
    """A device's durable participation state in ``state_dir``.

    Parameters
    ----------
    state_dir : str or os.PathLike
        Directory of the ledger (``ledger.json``, ``device.json``) and the outbox (``outbox/``);
        created if missing. Keep it on persistent storage and never share it between devices.
    policy : DevicePolicy, optional
    rng : Rng, optional
        Randomness of the group choice, the mechanisms and the report ids; defaults to the OS
        CSPRNG. Inject a seeded one for tests and simulations only.

    Raises
    ------
    LedgerCorruptedError
        The ledger is missing from an initialised directory, or is unreadable.
    """

    def __init__(self, state_dir: str | os.PathLike[str], policy: DevicePolicy | None = None, *,
                 rng: Rng | None = None) -> None:
        path = Path(state_dir)
        outbox_dir = path / OUTBOX_DIR
        if (not (path / MARKER_FILE).exists() and not (path / LEDGER_FILE).exists()
                and outbox_dir.is_dir() and any(not n.startswith(".") for n in os.listdir(outbox_dir))):
            raise LedgerCorruptedError(
                f"state directory {path} holds outbox reports but neither {LEDGER_FILE} nor {MARKER_FILE}: "
                "the ledger was lost; the device refuses to report rather than reset its privacy budget")
        self._setup(policy, rng, Ledger(path, rng=resolve_rng(rng)), Outbox(outbox_dir), path)
        with self._ledger.locked():
            self._outbox.remove_temporary_files()

    @classmethod
    def in_memory(cls, policy: DevicePolicy | None = None, *, rng: Rng | None = None,
                  device_id: str | None = None) -> Device:
        """A device with identical semantics whose ledger and outbox live in memory (simulations).

        Parameters
        ----------
        policy : DevicePolicy, optional
        rng : Rng, optional
            Defaults to the OS CSPRNG.
        device_id : str, optional
            32 lowercase hex digits; drawn from ``rng`` by default.
        """
        self = cls.__new__(cls)
        self._setup(policy, rng, Ledger.in_memory(device_id=device_id, rng=rng), Outbox.in_memory(), None)
        self._may_hold_orphans = False  # a new in-memory outbox is empty ...
        self._seen_generation = self._ledger.generation  # ... and no other process shares it
        return self

    def _setup(self, policy: DevicePolicy | None, rng: Rng | None, ledger: Ledger, outbox: Outbox,
               state_dir: Path | None) -> None:
        if policy is None:
            policy = DevicePolicy()
        if not isinstance(policy, DevicePolicy):
            raise TypeError(f"policy must be a DevicePolicy, got {type(policy).__name__}")
        self._policy = policy
        self._rng = resolve_rng(rng)
        self._ledger = ledger
        self._outbox = outbox
        self._state_dir = state_dir
        self._seen_generation = -1
        # Whether the outbox may hold uncharged reports: at start, after a failed charge, and
        # whenever another process changed the ledger. Saves a scan on every participate.
        self._may_hold_orphans = True

    # ------------------------------------------------------------------ properties

    @property
    def device_id(self) -> str:
        """The device's random id (32 hex digits); it never leaves the device in a report."""
        return self._ledger.device_id

    @property
    def policy(self) -> DevicePolicy:
        return self._policy

    @property
    def state_dir(self) -> Path | None:
        """The state directory, or ``None`` for an in-memory device."""
        return self._state_dir

    @property
    def ledger(self) -> Ledger:
        """The budget ledger (read it; charge only through :meth:`participate`)."""
        return self._ledger

    @property
    def outbox(self) -> Outbox:
        """The outbox of reports waiting for the collector."""
        return self._outbox

    def close(self) -> None:
        """Release the ledger's lock file (the device is unusable afterwards)."""
        self._ledger.close()

    # ------------------------------------------------------------------ participation

    def participate(self, spec: RoundSpec, point: Any, *, assignment: RoundAssignment | None = None) -> Report | None:
        """Produce (or return the stored) report of this device for the round ``spec``.

        Parameters
        ----------
        spec : RoundSpec
            The round, as published by the collector.
        point : Any
            The device's private point, in the form the round's encoders take (a category index,
            or a sequence of coordinates).
        assignment : RoundAssignment, optional
            The collector's assignment for this round (enrolled devices): the report id and hash
            seeds to use instead of drawing them.

        Returns
        -------
        Report or None
            The report, durably stored in the outbox and charged to the ledger; the same report
            (same bytes) on every call for the round until the collector acknowledges it. ``None``
            when the device's group does not report in this round.

        Raises
        ------
        TypeError
            ``spec`` is not a :class:`RoundSpec`.
        PolicyViolationError
            The spec asks for more than the device's policy allows.
        BudgetExhaustedError
            The report would exceed a budget or report cap.
        AlreadyReportedError
            The device's report of this round was already acknowledged by the collector.
        EncodingError
            ``point`` does not fit the round's encoders. Nothing is stored or charged.
        LedgerCorruptedError, OutboxCorruptedError
            The device's state cannot be read back; nothing is reset or dropped.
        """
        if not isinstance(spec, RoundSpec):
            raise TypeError(f"spec must be a RoundSpec, got {type(spec).__name__}")
        if assignment is not None and not isinstance(assignment, RoundAssignment):
            raise TypeError(f"assignment must be a RoundAssignment, got {type(assignment).__name__}")
        policy = self._policy
        policy.check(spec)
        ledger, outbox, rng = self._ledger, self._outbox, self._rng
        campaign = spec.campaign_id
        with ledger.locked():
            self._recover_locked(rescan=False)
            charged = ledger._charge_for_locked(campaign, spec.round)
            if charged is not None:
                stored = outbox.get(charged.report_id)
                if stored is None:
                    raise AlreadyReportedError(campaign, spec.round, charged.report_id)
                return stored.report
            group = ledger._group_of_locked(campaign)
            is_new_group = group is None
            if group is None:
                group = self._pick_group(spec)
            elif group >= len(spec.group_weights):
                raise ProtocolError(f"campaign {campaign!r} round {spec.round} has {len(spec.group_weights)} groups, "
                                    f"but the device is in group {group} (group weights must not change)")
            task = spec.task_for(group)
            if task is None:
                if is_new_group:
                    ledger.set_group(campaign, group)
                return None
            # With a task, the group is recorded together with the charge (one durable write fewer).
            epsilon = task.epsilon
            campaign_cap = min(spec.campaign_epsilon, policy.max_epsilon_per_campaign)
            max_reports = min(spec.max_reports_per_device, policy.max_reports_per_campaign)
            ledger._check_budget(campaign, epsilon, campaign_cap, policy.max_epsilon_total, max_reports)
            seeds = ([assignment.seed_for(i, c) for i, c in enumerate(task.components)] if assignment is not None
                     else [None] * len(task.components))
            payloads = tuple(c.mechanism.check_payload(run_component(c, point, rng=rng, seed=seed))
                             for c, seed in zip(task.components, seeds))
            report_id = assignment.report_id if assignment is not None else new_report_id(rng)
            report = Report(report_id=report_id, campaign_id=campaign, round=spec.round,
                            group=group, payloads=payloads)
            outbox.put(report, epsilon)  # first the outbox, then the charge: see "Crash safety"
            try:
                # The values come from a validated spec and report, and the lock is held.
                ledger._charge_locked(campaign, spec.round, group, epsilon, report.report_id, campaign_cap,
                                      policy.max_epsilon_total, max_reports)
            except BaseException:
                self._may_hold_orphans = True  # recovered (charged, never re-sampled) on the next call
                raise
            return report

    def _pick_group(self, spec: RoundSpec) -> int:
        """Group g with probability exactly ``group_weights[g] / sum(group_weights)``."""
        weights = spec.group_weights
        if len(weights) == 1:
            return 0  # certain: no randomness needed
        u = self._rng.randbelow(sum(weights))
        for group, weight in enumerate(weights):
            if u < weight:
                return group
            u -= weight
        raise AssertionError("unreachable: u < sum(group_weights)")

    def group_for(self, spec: RoundSpec) -> int:
        """The device's group in ``spec``'s campaign, chosen (and durably recorded) on first use."""
        if not isinstance(spec, RoundSpec):
            raise TypeError(f"spec must be a RoundSpec, got {type(spec).__name__}")
        with self._ledger.locked():
            self._recover_locked(rescan=False)
            group = self._ledger.group_of(spec.campaign_id)
            if group is None:
                group = self._ledger.set_group(spec.campaign_id, self._pick_group(spec))
            return group

    def has_reported(self, campaign_id: str, round: int) -> bool:
        """Whether the device has a (charged) report for ``campaign_id`` round ``round``."""
        with self._ledger.locked():
            self._recover_locked(rescan=False)
            return self._ledger.has_charge(campaign_id, round)

    # ------------------------------------------------------------------ outbox

    def pending_reports(self) -> list[Report]:
        """Charged reports not yet acknowledged, oldest first: what a sender sends.

        Raises
        ------
        OutboxCorruptedError
            A stored report cannot be read back (see :meth:`quarantine_corrupted_reports`).
        """
        with self._ledger.locked():
            self._recover_locked()
            pending = self._outbox.pending()
            uncharged = set(self._ledger.uncharged(s.report.report_id for s in pending))
            return [s.report for s in pending if s.report.report_id not in uncharged]

    def acknowledge(self, report_ids: Iterable[bytes]) -> int:
        """Forget reports the collector stored (or rejected for good); returns how many were pending.

        The charges stay in the ledger.
        """
        ids = list(report_ids)
        for rid in ids:
            if not isinstance(rid, bytes):
                raise TypeError(f"report ids must be bytes, got {type(rid).__name__}")
        with self._ledger.locked():
            self._outbox.rescan()
            return self._outbox.remove_all(ids)

    def recover(self) -> list[Report]:
        """Charge reports a crash left in the outbox uncharged; returns them (also done implicitly).

        An uncharged report whose round has meanwhile been charged with another report, or whose
        charge the policy no longer allows, was never sent: it is discarded.
        """
        with self._ledger.locked():
            return self._recover_locked()

    def _recover_locked(self, *, rescan: bool = True) -> list[Report]:
        ledger, outbox, policy = self._ledger, self._outbox, self._policy
        # Other processes sharing the directory change the ledger whenever they store a report, so a
        # full re-listing of the outbox is needed only then (or when asked); otherwise the outbox
        # notices changes from the directory's modification time.
        if rescan or ledger.generation != self._seen_generation:
            outbox.rescan()
            self._seen_generation = ledger.generation
            self._may_hold_orphans = True
        if not self._may_hold_orphans:
            return []
        uncharged = set(ledger.uncharged(outbox.report_ids()))
        if not uncharged:
            self._may_hold_orphans = False
            return []
        recovered: list[Report] = []
        for entry in outbox.entries():
            if entry.report_id not in uncharged:
                continue
            stored = outbox.load(entry)
            report = stored.report
            known_group = ledger.group_of(report.campaign_id)
            if ledger.has_charge(report.campaign_id, report.round) or (
                    known_group is not None and known_group != report.group):
                outbox.remove(report.report_id)
                continue
            try:
                ledger.charge(campaign_id=report.campaign_id, round=report.round, group=report.group,
                              epsilon=stored.epsilon, report_id=report.report_id,
                              campaign_cap=policy.max_epsilon_per_campaign, total_cap=policy.max_epsilon_total,
                              max_reports=policy.max_reports_per_campaign)
            except BudgetExhaustedError:
                outbox.remove(report.report_id)
                continue
            recovered.append(report)
        self._may_hold_orphans = False
        return recovered

    def quarantine_corrupted_reports(self) -> list[Path | str]:
        """Move outbox files that cannot be read back out of the way (an operator's decision).

        Returns
        -------
        list
            Where each file went (``<state_dir>/outbox/.quarantine/...``; the name for an in-memory
            device). Their charges stay in the ledger.
        """
        moved: list[Path | str] = []
        with self._ledger.locked():
            self._outbox.rescan()
            for name in self._outbox.corrupted_files():
                target = self._outbox.quarantine(name)
                moved.append(name if target is None else target)
        return moved

    # ------------------------------------------------------------------ budget

    def spent(self, campaign_id: str) -> float:
        """Epsilon this device has spent in ``campaign_id``."""
        return self._ledger.spent(campaign_id)

    def spent_total(self) -> float:
        """Epsilon this device has spent over all campaigns."""
        return self._ledger.spent_total()

