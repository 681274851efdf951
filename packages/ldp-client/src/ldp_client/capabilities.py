"""Capabilities: what a round requires of a device, and what a device can run (``docs/protocol.md`` §10).

A capability is a stable, language-neutral name of one piece of code a device must have to run a
round: ``encoder.<name>`` for an encoder and ``mechanism.<name>`` for a local randomizer, where
``<name>`` is the field name of its member of the ``ldp.v1.EncoderSpec`` or ``ldp.v1.MechanismSpec``
``oneof`` (the SDK's ``KIND``), plus ``encoder.random_projection`` for the public projection some
encoders carry. Nested parts count too: a bucketed vector encoder requires its bucket encoder, a
bucketized vector mechanism its inner vector randomizer. A field added to a mechanism later that
changes what the device computes gets a name of its own, ``mechanism.<name>.<feature>``:
``mechanism.local_hashing.seed_pool`` for a local-hashing round with a public seed pool (§14).

:func:`required_capabilities` derives a round's list from its content; it is the one rule both
sides use (the collector to state the list on the wire, the device to check it). A device states
what it supports; :data:`SDK_CAPABILITIES` is everything this SDK runs, and
:func:`check_capabilities` is the device's refusal, raised before anything is charged or released.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .encoders.base import ENCODERS, Encoder
from .errors import InvalidParameterError, MissingCapabilitiesError
from .mechanisms.base import MECHANISMS, MechanismParams

if TYPE_CHECKING:
    from .spec import RoundSpec

__all__ = [
    "ENCODER_PREFIX",
    "MAX_CAPABILITIES",
    "MECHANISM_PREFIX",
    "MISSING_CAPABILITIES_METADATA",
    "MISSING_CAPABILITIES_REASON",
    "RANDOM_PROJECTION",
    "SEED_POOL",
    "SDK_CAPABILITIES",
    "check_capabilities",
    "check_capability_names",
    "component_capabilities",
    "missing_capabilities",
    "required_capabilities",
    "supported_capabilities",
]

ENCODER_PREFIX = "encoder."
MECHANISM_PREFIX = "mechanism."
#: The public Johnson-Lindenstrauss projection of ``ldp.v1.RandomProjection`` (inside SimHash and
#: shifted-grid encoders): its generator is a piece of code of its own.
RANDOM_PROJECTION = ENCODER_PREFIX + "random_projection"
#: Local hashing from a public seed pool (``LocalHashing.seed_pool_size`` > 0, §14): a device that
#: predates the field would ignore it, draw a fresh seed and have its report rejected, after
#: spending its budget, so the round states it.
SEED_POOL = MECHANISM_PREFIX + "local_hashing.seed_pool"
#: ``google.rpc.ErrorInfo.reason`` of a collector's answer (``FAILED_PRECONDITION``) to a
#: ``GetRoundSpec`` whose stated capabilities do not cover the open round.
MISSING_CAPABILITIES_REASON = "MISSING_CAPABILITIES"
#: ``ErrorInfo.metadata`` key of that answer: the missing names, sorted, joined by commas.
MISSING_CAPABILITIES_METADATA = "missing_capabilities"
#: Most capability names one list may hold on the wire (a bound on what a collector decodes).
MAX_CAPABILITIES = 256
#: A capability name: a lower-case family, a dot, a lower-case identifier (at most 64 characters).
_NAME = re.compile(r"^[a-z][a-z0-9_]*\.[a-z][a-z0-9_.]*$")
_MAX_NAME_CHARS = 64


def _walk_encoder(encoder: Encoder) -> Iterator[str]:
    """The encoder's own name, then those of the encoders and projections it holds, depth first."""
    from .encoders.projection import RandomProjection  # loaded already by any encoder that holds one

    yield ENCODER_PREFIX + encoder.KIND
    for f in dataclasses.fields(encoder):  # type: ignore[arg-type]
        value: Any = getattr(encoder, f.name)
        if isinstance(value, Encoder):
            yield from _walk_encoder(value)
        elif isinstance(value, RandomProjection):
            yield RANDOM_PROJECTION


def _walk_mechanism(mechanism: MechanismParams) -> Iterator[str]:
    """The mechanism's own name, its features (:data:`SEED_POOL`), then its inner randomizer's
    (a bucketized vector's shape)."""
    yield MECHANISM_PREFIX + mechanism.KIND
    if getattr(mechanism, "seed_pool_size", 0):
        yield SEED_POOL
    inner = getattr(mechanism, "inner", None)
    if isinstance(inner, MechanismParams):
        yield from _walk_mechanism(inner)


def component_capabilities(encoder: Encoder, mechanism: MechanismParams) -> frozenset[str]:
    """The capabilities one encode-then-randomize step requires."""
    return frozenset(_walk_encoder(encoder)) | frozenset(_walk_mechanism(mechanism))


def required_capabilities(spec: RoundSpec) -> tuple[str, ...]:
    """What a device needs to run ``spec``: the union over every task's components, sorted.

    This is the list ``RoundSpec.required_capabilities`` carries on the wire (ascending byte order,
    each name once). It covers every task, not only the device's own: a collector answers
    ``GetRoundSpec`` before it knows the device's group.
    """
    names: set[str] = set()
    for task in spec.tasks:
        for component in task.components:
            names |= component_capabilities(component.encoder, component.mechanism)
    return tuple(sorted(names))


def _sdk_capabilities() -> frozenset[str]:
    """Every encoder and mechanism this SDK declares, and the projection (no module is imported:
    a device pays the import cost only of the encoders and mechanisms its rounds use)."""
    return frozenset({ENCODER_PREFIX + kind for kind in ENCODERS.declared_kinds()}
                     | {MECHANISM_PREFIX + kind for kind in MECHANISMS.declared_kinds()}
                     | {RANDOM_PROJECTION, SEED_POOL})


#: Everything the Python SDK can run: the default a :class:`~ldp_client.device.Device` and a
#: ``CollectorClient`` state. A restricted device (a build without some encoders) states a subset.
SDK_CAPABILITIES: frozenset[str] = _sdk_capabilities()


def check_capability_names(names: Iterable[str], *, what: str = "capabilities") -> frozenset[str]:
    """``names`` as a set after checking each is a well-formed capability name.

    Raises
    ------
    TypeError
        ``names`` is a single string or holds a non-string.
    InvalidParameterError
        A malformed name, a name listed twice, or more than :data:`MAX_CAPABILITIES` names.
    """
    if isinstance(names, (str, bytes)):
        raise TypeError(f"{what} must be a collection of names, got a single string")
    listed = list(names)
    if len(listed) > MAX_CAPABILITIES:
        raise InvalidParameterError(f"{what} must hold at most {MAX_CAPABILITIES} names, got {len(listed)}")
    for name in listed:
        if not isinstance(name, str):
            raise TypeError(f"{what} must hold strings, got {type(name).__name__}")
        if len(name) > _MAX_NAME_CHARS or not _NAME.match(name):
            raise InvalidParameterError(
                f"{what} must hold names like 'encoder.grid_tree' (lower case, at most {_MAX_NAME_CHARS} "
                f"characters), got {name[:_MAX_NAME_CHARS]!r}")
    out = frozenset(listed)
    if len(out) != len(listed):
        raise InvalidParameterError(f"{what} lists a name twice")
    return out


def missing_capabilities(required: Iterable[str], supported: Iterable[str]) -> tuple[str, ...]:
    """The required names that are not supported, sorted (empty: the device can run the round)."""
    return tuple(sorted(set(required) - set(supported)))


def check_capabilities(campaign_id: str, required: Iterable[str], supported: Iterable[str]) -> None:
    """Raise :class:`~ldp_client.errors.MissingCapabilitiesError` unless ``supported`` covers ``required``."""
    missing = missing_capabilities(required, supported)
    if missing:
        raise MissingCapabilitiesError(campaign_id, missing)


def supported_capabilities(capabilities: Iterable[str] | None = None) -> frozenset[str]:
    """What a device states it supports: :data:`SDK_CAPABILITIES` by default, or a subset of it.

    Raises
    ------
    InvalidParameterError
        A malformed or repeated name, or one this SDK cannot run.
    """
    if capabilities is None:
        return SDK_CAPABILITIES
    stated = check_capability_names(capabilities)
    unknown = sorted(stated - SDK_CAPABILITIES)
    if unknown:
        raise InvalidParameterError(
            f"capabilities must be ones this SDK runs (a subset of SDK_CAPABILITIES), got {', '.join(unknown)}")
    return stated
