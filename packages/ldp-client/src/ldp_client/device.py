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
      assigned hash seed instead of drawing one. Both are public randomness, so the privacy
      guarantee is unchanged; an assigned id the device already used for another report is refused
      (:class:`~ldp_client.errors.ProtocolError`).
    * Budget: the campaign's charges plus this report stay within
      ``min(spec.campaign_epsilon, policy.max_epsilon_per_campaign)``, the device's total within
      ``policy.max_epsilon_total`` (both compared exactly, :mod:`ldp_client.budget`), and the number
      of reports within ``min(spec.max_reports_per_device, policy.max_reports_per_campaign)``;
      otherwise :class:`~ldp_client.errors.BudgetExhaustedError`.
    * Everything the collector chose (the spec's epsilons and caps, the group weights, the assigned
      report id and hash seeds) is checked before anything is randomized.

The collector is untrusted
    A report leaves the device (is returned by :meth:`Device.pending_reports`) only while the
    ledger holds a charge for exactly its campaign, round and report id. The charge is written
    before the report is stored, so a failed charge leaves nothing to send, and a stored report
    without its own charge (a rolled-back ledger, a file put there by hand) is discarded unsent.

Memoized randomness
    With the default ``rng=None``, every coin of a report -- the group choice, the report id, each
    component's randomization -- is drawn from a stream keyed by the device's secret and the
    report's public context (:mod:`ldp_client.memo`). A device whose ledger was rolled back (a backup
    restored) and that is asked the same question again gives the same report, bit for bit: the
    collector sees a duplicate and learns nothing new. An injected ``rng`` (tests and simulations
    only) replaces all of this; each charge records the generator's name in the ledger, and a
    device with a state directory logs a warning once.

Crash safety
    The ledger is charged first, then the report is written to the outbox. A crash in between
    leaves a charged round without a stored report: the report was never sent, and the round is
    not answered again (:class:`~ldp_client.errors.AlreadyReportedError`; the budget stays spent, so
    it is over-stated, never under-stated). A corrupted ledger raises
    :class:`~ldp_client.errors.LedgerCorruptedError` and the device stops reporting; the budget is
    never reset, and a ledger missing beside any other device state is corruption, not a fresh
    start. A state directory that cannot be written raises
    :class:`~ldp_client.errors.StateDirectoryError` naming the path.

Durability is not optional on a real device. Simulations that create many devices use
:meth:`Device.in_memory`, which keeps identical semantics without files.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._validation import check_float, check_int
from .admission import admit, pick_group
from .capabilities import check_capabilities, supported_capabilities
from .errors import (
    AlreadyReportedError,
    PolicyViolationError,
    ProtocolError,
)
from .ledger import Ledger
from .mechanisms.bucketized_vector import BucketizedVectorParams
from .mechanisms.local_hashing import SEED_BITS, LocalHashingParams
from .memo import Memo
from .outbox import Outbox, OutboxEntry
from .payload import Payload
from .report import REPORT_ID_BYTES, Report, new_report_id
from .rng import Rng, is_secure, resolve_rng, rng_name
from .spec import MAX_COMPONENTS, MAX_EPSILON_PER_CAMPAIGN, Component, RoundSpec

__all__ = ["OUTBOX_DIR", "SEEDED_MECHANISMS", "Device", "DevicePolicy", "RoundAssignment", "run_component"]

OUTBOX_DIR = "outbox"
#: Largest total budget a policy may allow over the device's lifetime.
MAX_EPSILON_TOTAL = 1e6

_log = logging.getLogger(__name__)
#: State directories whose injected generator was already logged (once per directory and process).
_WARNED: set[tuple[str, str]] = set()


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
        ``None`` (the default, and the only choice for a real device): every coin is memoized
        randomness from the device's secret (see "Memoized randomness" in :mod:`ldp_client.device`).
        An injected generator replaces it, for tests and simulations only: it is recorded with
        each charge and logged once.
    capabilities : iterable of str, optional
        The capabilities the device runs (``docs/protocol.md`` §10): by default everything this
        SDK runs (:data:`~ldp_client.capabilities.SDK_CAPABILITIES`); a restricted device names a
        subset, and :meth:`participate` declines a round that needs anything else.

    Raises
    ------
    LedgerCorruptedError
        The ledger is missing beside other device state, or is unreadable.
    StateDirectoryError
        The state directory cannot be created or written.
    """

    def __init__(self, state_dir: str | os.PathLike[str], policy: DevicePolicy | None = None, *,
                 rng: Rng | None = None, capabilities: Iterable[str] | None = None) -> None:
        path = Path(state_dir)
        self._setup(policy, rng, Ledger(path, rng=resolve_rng(rng)), Outbox(path / OUTBOX_DIR), path, capabilities)
        with self._ledger.locked():
            self._outbox.remove_temporary_files()
        if self._rng_record is not None and (str(path), self._rng_record) not in _WARNED:
            _WARNED.add((str(path), self._rng_record))
            _log.warning("device state %s uses the injected generator %s instead of its memoized randomness: its "
                         "reports are reproducible by whoever knows the generator's seed; tests and simulations "
                         "only", path, self._rng_record)

    @classmethod
    def in_memory(cls, policy: DevicePolicy | None = None, *, rng: Rng | None = None,
                  device_id: str | None = None, capabilities: Iterable[str] | None = None) -> Device:
        """A device with identical semantics whose ledger and outbox live in memory (simulations).

        Parameters
        ----------
        policy : DevicePolicy, optional
        rng : Rng, optional
            As for a device with a state directory (recorded with each charge; not logged: an
            in-memory device is a simulation by construction).
        device_id : str, optional
            32 lowercase hex digits; drawn from ``rng`` by default.
        capabilities : iterable of str, optional
            As for a device with a state directory.
        """
        self = cls.__new__(cls)
        self._setup(policy, rng, Ledger.in_memory(device_id=device_id, rng=rng), Outbox.in_memory(), None,
                    capabilities)
        self._may_hold_strays = False  # a new in-memory outbox is empty ...
        self._seen_generation = self._ledger.generation  # ... and no other process shares it
        return self

    def _setup(self, policy: DevicePolicy | None, rng: Rng | None, ledger: Ledger, outbox: Outbox,
               state_dir: Path | None, capabilities: Iterable[str] | None) -> None:
        self._capabilities = supported_capabilities(capabilities)
        if policy is None:
            policy = DevicePolicy()
        if not isinstance(policy, DevicePolicy):
            raise TypeError(f"policy must be a DevicePolicy, got {type(policy).__name__}")
        self._policy = policy
        self._rng = resolve_rng(rng)
        # The device's own randomness is memoized from its secret; an injected generator is named in
        # every charge it pays for.
        self._memo = Memo(ledger.secret) if is_secure(rng) else None
        self._rng_record = None if is_secure(rng) else rng_name(self._rng)
        self._ledger = ledger
        self._outbox = outbox
        self._state_dir = state_dir
        self._seen_generation = -1
        # Whether the outbox may hold reports without their own charge: at start, and whenever
        # another process changed the ledger (a rollback, a file put there). Saves a scan per call.
        self._may_hold_strays = True

    # ------------------------------------------------------------------ properties

    @property
    def device_id(self) -> str:
        """The device's random id (32 hex digits); it never leaves the device in a report."""
        return self._ledger.device_id

    @property
    def policy(self) -> DevicePolicy:
        return self._policy

    @property
    def capabilities(self) -> frozenset[str]:
        """The capabilities this device runs (``docs/protocol.md`` §10): a round needing another is refused."""
        return self._capabilities

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
        MissingCapabilitiesError
            The round needs a capability the device does not support. Nothing is stored or charged.
        PolicyViolationError
            The spec asks for more than the device's policy allows.
        BudgetExhaustedError
            The report would exceed a budget or report cap.
        AlreadyReportedError
            The device is charged for this round and its report is no longer stored (acknowledged
            by the collector, or lost in a crash between the charge and the outbox write).
        EncodingError
            ``point`` does not fit the round's encoders (checked with the round's first encoder when the
            device's group sits out the round). Nothing is stored or charged.
        LedgerCorruptedError, OutboxCorruptedError
            The device's state cannot be read back; nothing is reset or dropped.
        """
        if not isinstance(spec, RoundSpec):
            raise TypeError(f"spec must be a RoundSpec, got {type(spec).__name__}")
        if assignment is not None and not isinstance(assignment, RoundAssignment):
            raise TypeError(f"assignment must be a RoundAssignment, got {type(assignment).__name__}")
        # Before the policy and the ledger: a round the device cannot run is declined, nothing charged.
        check_capabilities(spec.campaign_id, spec.required_capabilities, self._capabilities)
        policy = self._policy
        policy.check(spec)
        ledger, outbox = self._ledger, self._outbox
        campaign, round_ = spec.campaign_id, spec.round
        with ledger.locked():
            self._discard_strays_locked(rescan=False)
            charged = ledger._charge_for_locked(campaign, round_)
            if charged is not None:
                stored = outbox.get(charged.report_id)
                if stored is None:
                    raise AlreadyReportedError(campaign, round_, charged.report_id)
                return stored.report
            recorded = ledger._group_of_locked(campaign)
            spent, spent_total, reports = ledger._usage_locked(campaign)
            admission = admit(spec, policy, group=recorded, spent=spent, spent_total=spent_total, reports=reports,
                              group_rng=functools.partial(self._group_rng, campaign))
            group, task, caps = admission.group, admission.task, admission.caps
            if task is None:
                # The group sits out; the point is still checked (every task of a campaign encodes the same
                # device point), so that an app learns of a bad point now rather than in a later round.
                if spec.tasks and spec.tasks[0].components:
                    spec.tasks[0].components[0].encoder.encode(point)
                if recorded is None:
                    ledger.set_group(campaign, group)
                return None
            epsilon = task.epsilon
            if assignment is not None:
                seeds = [assignment.seed_for(i, c) for i, c in enumerate(task.components)]
                report_id = assignment.report_id
            else:
                seeds = [None] * len(task.components)
                report_id = (self._memo.report_id(campaign, round_) if self._memo is not None
                             else new_report_id(self._rng))
            used = ledger._by_id.get(report_id)
            if used is not None or report_id in outbox.report_ids():  # the names: no file is read
                where = "a stored report" if used is None else f"campaign {used.campaign_id!r} round {used.round}"
                raise ProtocolError(f"report id {report_id.hex()} for campaign {campaign!r} round {round_} is already "
                                    f"used by {where}: a report id is never reused")
            payloads = tuple(
                c.mechanism.check_payload(run_component(c, point, rng=self._coins(spec, group, i, c, seed), seed=seed))
                for i, (c, seed) in enumerate(zip(task.components, seeds)))
            report = Report(report_id=report_id, campaign_id=campaign, round=round_, group=group, payloads=payloads)
            # First the charge (with the group, one durable write), then the outbox: a report is
            # stored for sending only with its own charge; see "Crash safety". The values come from a
            # validated spec and report, and the lock is held.
            ledger._charge_locked(campaign, round_, group, epsilon, report_id, caps.campaign_epsilon,
                                  caps.total_epsilon, caps.reports, self._rng_record)
            outbox.put(report, epsilon)
            return report

    def _coins(self, spec: RoundSpec, group: int, index: int, component: Component, seed: int | None) -> Rng:
        """The generator of component ``index``'s coins: memoized, or the injected one."""
        if self._memo is None:
            return self._rng
        return self._memo.coins(spec.campaign_id, spec.round, group, index, component, seed)

    def _group_rng(self, campaign_id: str) -> Rng:
        """The generator of the device's group draw in ``campaign_id``: memoized, or the injected one."""
        return self._rng if self._memo is None else self._memo.group_rng(campaign_id)

    def group_for(self, spec: RoundSpec) -> int:
        """The device's group in ``spec``'s campaign, chosen (and durably recorded) on first use."""
        if not isinstance(spec, RoundSpec):
            raise TypeError(f"spec must be a RoundSpec, got {type(spec).__name__}")
        with self._ledger.locked():
            self._discard_strays_locked(rescan=False)
            group = self._ledger.group_of(spec.campaign_id)
            if group is None:
                group = self._ledger.set_group(
                    spec.campaign_id, pick_group(spec.group_weights, functools.partial(self._group_rng, spec.campaign_id)))
            return group

    def has_reported(self, campaign_id: str, round: int) -> bool:
        """Whether the device has a (charged) report for ``campaign_id`` round ``round``."""
        with self._ledger.locked():
            self._discard_strays_locked(rescan=False)
            return self._ledger.has_charge(campaign_id, round)

    # ------------------------------------------------------------------ outbox

    def pending_reports(self) -> list[Report]:
        """Charged reports not yet acknowledged, oldest first: what a sender sends.

        Only a report for whose campaign, round and id the ledger holds a charge is returned.

        Raises
        ------
        OutboxCorruptedError
            A stored report cannot be read back (see :meth:`quarantine_corrupted_reports`).
        """
        with self._ledger.locked():
            self._discard_strays_locked()
            return [s.report for s in self._outbox.pending() if self._has_own_charge(s.report)]

    def _has_own_charge(self, report: Report) -> bool:
        charge = self._ledger._charge_for_locked(report.campaign_id, report.round)
        return charge is not None and charge.report_id == report.report_id

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

    def recover(self) -> list[OutboxEntry]:
        """Discard stored reports without their own charge (also done implicitly); returns their entries.

        Such a report was never sent and never will be: its round has no charge, or a charge for
        another report id. It appears only when the ledger was rolled back (a restored backup),
        after a crash of an SDK older than this rule, or when a file was put in the outbox by hand.
        """
        with self._ledger.locked():
            return self._discard_strays_locked()

    def _discard_strays_locked(self, *, rescan: bool = True) -> list[OutboxEntry]:
        ledger, outbox = self._ledger, self._outbox
        # Other processes sharing the directory change the ledger whenever they store a report, so a
        # full re-listing of the outbox is needed only then (or when asked); otherwise the outbox
        # notices changes from the directory's modification time.
        if rescan or ledger.generation != self._seen_generation:
            outbox.rescan()
            self._seen_generation = ledger.generation
            self._may_hold_strays = True
        if not self._may_hold_strays:
            return []
        strays = []
        for entry in outbox.entries():  # from the file names: nothing is read
            charge = ledger._charge_for_locked(entry.campaign_id, entry.round)
            if charge is None or charge.report_id != entry.report_id:
                outbox.remove(entry.report_id)
                strays.append(entry)
        if strays:
            _log.warning("discarded %d stored report(s) without their own charge in the ledger (never sent): %s",
                         len(strays), ", ".join(e.name for e in strays[:5]))
        self._may_hold_strays = False
        return strays

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

