"""Round specifications: what the server asks devices to run in one round.

These are the plain-data twins of ``ldp.v1.RoundSpec`` and its parts. A device validates a spec
on construction (shapes, ranges, encoder/mechanism compatibility) and against its own policy
before it reports.

:class:`Spec` (defined in ``ldp_client._spec``) is the public base of every such plain-data twin:
a frozen ``kw_only`` dataclass with the field names of its ``ldp.v1`` message, which
:mod:`ldp_client.serde` converts generically. Code outside the SDK that mirrors a message the same
way (the collector's campaign parameters) imports it from here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgpack

from ._spec import Spec
from ._validation import check_float, check_int, check_msgpack_complete, describe
from .budget import sum_up
from .capabilities import check_capability_names, required_capabilities
from .encoders.base import ENCODERS, Encoder
from .errors import InvalidParameterError, ProtocolError
from .mechanisms.base import MECHANISMS, MechanismParams

__all__ = ["ERROR_DOMAIN", "ROUND_NOT_OPEN_REASON", "Component", "GroupTask", "RoundNotOpen", "RoundSpec", "Spec", "check_campaign_id"]

MAX_GROUPS = 4096
MAX_COMPONENTS = 8
MAX_EPSILON_PER_CAMPAIGN = 100.0
MAX_SPEC_BYTES = 16 * 1024 * 1024
#: ``google.rpc.ErrorInfo.domain`` of every error a collector sends: a reason means what
#: ``docs/errors.md`` says only within this domain.
ERROR_DOMAIN = "ldp.v1"
#: ``google.rpc.ErrorInfo.reason`` of the collector's "no round is open yet" answer to
#: ``GetRoundSpec`` (UNAVAILABLE with ``RetryInfo``): between two rounds, while the server step runs.
ROUND_NOT_OPEN_REASON = "ROUND_NOT_OPEN"
#: Longest wait a :class:`RoundNotOpen` can ask for (an hour): a collector's larger delay is capped.
MAX_RETRY_AFTER = 3600.0
_CAMPAIGN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_campaign_id(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"campaign_id must be a string, got {describe(value)}")
    if not _CAMPAIGN_ID.match(value):
        raise InvalidParameterError(
            f"campaign_id must be 1-128 characters of [A-Za-z0-9._-] starting alphanumeric, got {describe(value)}")
    return value


@dataclass(frozen=True, kw_only=True)
class Component(Spec):
    """One encode-then-randomize step (``ldp.v1.Component``)."""

    encoder: Encoder
    mechanism: MechanismParams

    def __post_init__(self) -> None:
        if not isinstance(self.encoder, Encoder):
            raise TypeError(f"encoder must be an ldp_client encoder, got {type(self.encoder).__name__}")
        if not isinstance(self.mechanism, MechanismParams):
            raise TypeError(f"mechanism must be mechanism parameters, got {type(self.mechanism).__name__}")
        if self.encoder.VALUE_KIND != self.mechanism.INPUT_KIND:
            raise InvalidParameterError(
                f"encoder {self.encoder.KIND} produces {self.encoder.VALUE_KIND} values but mechanism "
                f"{self.mechanism.KIND} randomizes {self.mechanism.INPUT_KIND} values")
        if self.encoder.output_size != self.mechanism.input_size:
            raise InvalidParameterError(
                f"encoder {self.encoder.KIND} output size {self.encoder.output_size} does not match "
                f"mechanism {self.mechanism.KIND} input size {self.mechanism.input_size}")
        # A bit-vector mechanism is calibrated to a Hamming sensitivity; it must cover the largest
        # distance the encoder can produce, or the stated epsilon would not hold.
        needed = getattr(self.encoder, "max_hamming_distance", None)
        granted = getattr(self.mechanism, "sensitivity", None)
        if needed is not None and granted is not None and granted < max(1, needed):
            raise InvalidParameterError(
                f"mechanism {self.mechanism.KIND} sensitivity {granted} is below the encoder's largest "
                f"Hamming distance {needed}: the stated epsilon would not hold")

    def to_dict(self) -> dict[str, Any]:
        return {"encoder": ENCODERS.dump(self.encoder), "mechanism": MECHANISMS.dump(self.mechanism)}

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "") -> Component:
        where = where or "component"
        if not isinstance(data, dict) or set(data) != {"encoder", "mechanism"}:
            raise ProtocolError(f"{where}: expected a mapping with 'encoder' and 'mechanism'")
        encoder = ENCODERS.load(data["encoder"], where=f"{where}.encoder")
        mechanism = MECHANISMS.load(data["mechanism"], where=f"{where}.mechanism")
        try:
            return cls(encoder=encoder, mechanism=mechanism)  # type: ignore[arg-type]
        except (TypeError, InvalidParameterError) as exc:
            raise ProtocolError(f"{where}: {exc}") from exc

    def run(self, point: Any, *, rng: Any = None) -> Any:
        """Encode ``point`` and randomize it: the payload of this component."""
        return self.mechanism.randomize(self.encoder.encode(point), rng=rng)


@dataclass(frozen=True, kw_only=True)
class GroupTask(Spec):
    """What the devices of ``groups`` run in a round (``ldp.v1.GroupTask``)."""

    groups: tuple[int, ...]
    components: tuple[Component, ...]

    def __post_init__(self) -> None:
        for name in ("groups", "components"):
            if not isinstance(getattr(self, name), (tuple, list)):
                raise TypeError(f"{name} must be a sequence, got {type(getattr(self, name)).__name__}")
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.groups:
            raise InvalidParameterError("a group task needs at least one group")
        for g in self.groups:
            check_int("group", g, 0, MAX_GROUPS - 1)
        if len(set(self.groups)) != len(self.groups):
            raise InvalidParameterError(f"a group task lists a group twice: {self.groups}")
        if not 1 <= len(self.components) <= MAX_COMPONENTS:
            raise InvalidParameterError(
                f"a group task needs 1 to {MAX_COMPONENTS} components, got {len(self.components)}")
        for c in self.components:
            if not isinstance(c, Component):
                raise TypeError(f"components must be Component objects, got {type(c).__name__}")

    @property
    def epsilon(self) -> float:
        """Budget one report charges: the sum over components (sequential composition), rounded up."""
        return sum_up(c.mechanism.epsilon for c in self.components)


@dataclass(frozen=True, kw_only=True)
class RoundSpec(Spec):
    """The server's broadcast for one round (``ldp.v1.RoundSpec``).

    ``deadline`` is Unix seconds (``None``: no deadline).
    """

    campaign_id: str
    round: int
    group_weights: tuple[int, ...]
    tasks: tuple[GroupTask, ...]
    campaign_epsilon: float
    max_reports_per_device: int = 1
    deadline: float | None = None
    kind: str = ""
    #: What a device needs to run the round (``docs/protocol.md`` §10): derived from the tasks when
    #: empty (a spec built in process, or from a collector older than the field); a stated list
    #: that differs from the derived one is refused (the collector is not trusted).
    required_capabilities: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_campaign_id(self.campaign_id)
        check_int("round", self.round, 0, 2**32 - 1)
        for name in ("group_weights", "tasks"):
            if not isinstance(getattr(self, name), (tuple, list)):
                raise TypeError(f"{name} must be a sequence, got {type(getattr(self, name)).__name__}")
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not 1 <= len(self.group_weights) <= MAX_GROUPS:
            raise InvalidParameterError(f"group_weights must have 1 to {MAX_GROUPS} entries, got {len(self.group_weights)}")
        for w in self.group_weights:
            check_int("group weight", w, 0, 2**32 - 1)
        if sum(self.group_weights) == 0:
            raise InvalidParameterError("group_weights must not all be 0")
        object.__setattr__(self, "campaign_epsilon",
                           check_float("campaign_epsilon", self.campaign_epsilon, 0.0,
                                       MAX_EPSILON_PER_CAMPAIGN, low_open=True))
        check_int("max_reports_per_device", self.max_reports_per_device, 1, 1024)
        if self.deadline is not None:
            object.__setattr__(self, "deadline", check_float("deadline", self.deadline, 0.0, 1e11))
        if not isinstance(self.kind, str) or len(self.kind) > 64:
            raise InvalidParameterError(f"kind must be a string of at most 64 characters, got {self.kind!r}")
        seen: set[int] = set()
        for task in self.tasks:
            if not isinstance(task, GroupTask):
                raise TypeError(f"tasks must be GroupTask objects, got {type(task).__name__}")
            for g in task.groups:
                if g >= len(self.group_weights):
                    raise InvalidParameterError(
                        f"task group {g} is outside the campaign's {len(self.group_weights)} groups")
                if g in seen:
                    raise InvalidParameterError(f"group {g} appears in two tasks")
                seen.add(g)
            if task.epsilon > self.campaign_epsilon:  # exactly: no slack
                raise InvalidParameterError(
                    f"a task charges epsilon {task.epsilon:g}, more than the campaign's {self.campaign_epsilon:g}")
        if not isinstance(self.required_capabilities, (tuple, list)):
            raise TypeError(f"required_capabilities must be a sequence, got {type(self.required_capabilities).__name__}")
        stated = check_capability_names(self.required_capabilities, what="required_capabilities")
        derived = required_capabilities(self)
        if stated and stated != frozenset(derived):
            raise InvalidParameterError(
                f"required_capabilities disagree with the round's tasks: they need {', '.join(derived) or 'nothing'}, "
                f"the spec states {', '.join(sorted(stated))}")
        object.__setattr__(self, "required_capabilities", derived)

    def task_for(self, group: int) -> GroupTask | None:
        """The task of ``group`` in this round, or ``None`` when that group does not report."""
        for task in self.tasks:
            if group in task.groups:
                return task
        return None

    def pack(self) -> bytes:
        """Compact msgpack bytes of :meth:`to_dict`."""
        packed: bytes = msgpack.packb(self.to_dict(), use_bin_type=True)
        return packed

    @classmethod
    def unpack(cls, data: bytes) -> RoundSpec:
        """Inverse of :meth:`pack`; malformed bytes raise :class:`ProtocolError`."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"packed round spec must be bytes, got {type(data).__name__}")
        if len(data) > MAX_SPEC_BYTES:
            raise ProtocolError(f"packed round spec is {len(data)} bytes, more than {MAX_SPEC_BYTES}")
        try:
            check_msgpack_complete(bytes(data))
            obj = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise ProtocolError(f"packed round spec is not valid msgpack: {exc}") from exc
        return cls.from_dict(obj, where="round spec")


@dataclass(frozen=True, slots=True)
class RoundNotOpen:
    """The collector has no open round right now: ask again after ``retry_after`` seconds.

    Not an error. A campaign is *between two rounds* while the collector runs the server step
    that turns one round's reports into the next round's spec (or the result), and for a moment
    after a collector restart that resumes such a step. Nothing is wrong with the device or its
    reports; the next round's spec comes with a later ask.

    Parameters
    ----------
    campaign_id : str
        The campaign asked about.
    retry_after : float
        Seconds to wait before asking again, in [0, 3600] (the collector's ``RetryInfo`` delay;
        a larger one is capped at an hour).
    """

    campaign_id: str
    retry_after: float

    def __post_init__(self) -> None:
        check_campaign_id(self.campaign_id)
        object.__setattr__(self, "retry_after", check_float("retry_after", self.retry_after, 0.0, MAX_RETRY_AFTER))
