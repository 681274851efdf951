"""ldp_client: the on-device SDK for local differential privacy.

Encode a private point into the server-shared representation, randomize it on the device under
epsilon-LDP, charge a durable budget ledger and keep the report in a durable outbox until the
collector acknowledges it. Runtime dependencies: the standard library and ``msgpack``; the gRPC
transport lives in :mod:`ldp_client.grpc` (``pip install "ldp-client[grpc]"``) and is never imported
from here.

Submodules: :mod:`~ldp_client.mechanisms` (one module per randomizer), :mod:`~ldp_client.encoders`
(pure public encoders and the shared cell geometry), :mod:`~ldp_client.spec` (round specs),
:mod:`~ldp_client.report` (reports and their msgpack form), :mod:`~ldp_client.device`,
:mod:`~ldp_client.rng`, :mod:`~ldp_client.memo` (memoized randomness from the device's secret),
:mod:`~ldp_client.budget` (exact budget arithmetic), :mod:`~ldp_client.clusters` (local labels from a
published clustering).
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost on devices)

if TYPE_CHECKING:  # the names below are loaded on first use (PEP 562), keeping `import ldp_client` cheap
    from typing import Any

    from .clusters import CellClusterModel, CenterModel, ClusterModel, cluster_model_from_dict
    from .device import Device, DevicePolicy
    from .errors import (
        AlreadyReportedError,
        BudgetExhaustedError,
        EncodingError,
        InvalidParameterError,
        LdpError,
        LedgerCorruptedError,
        OutboxCorruptedError,
        PolicyViolationError,
        ProtocolError,
        StateCorruptedError,
        StateDirectoryError,
        TransportError,
    )
    from .report import Report, pack_batch, unpack_batch
    from .rng import Rng, SecureRng, SeededRng
    from .spec import Component, GroupTask, RoundNotOpen, RoundSpec

_LAZY = {
    "CellClusterModel": "clusters", "CenterModel": "clusters", "ClusterModel": "clusters",
    "cluster_model_from_dict": "clusters",
    "Device": "device", "DevicePolicy": "device",
    "AlreadyReportedError": "errors", "BudgetExhaustedError": "errors", "EncodingError": "errors",
    "InvalidParameterError": "errors", "LdpError": "errors", "LedgerCorruptedError": "errors",
    "OutboxCorruptedError": "errors", "PolicyViolationError": "errors", "ProtocolError": "errors",
    "StateCorruptedError": "errors", "StateDirectoryError": "errors", "TransportError": "errors",
    "Report": "report", "pack_batch": "report", "unpack_batch": "report",
    "Rng": "rng", "SecureRng": "rng", "SeededRng": "rng",
    "Component": "spec", "GroupTask": "spec", "RoundNotOpen": "spec", "RoundSpec": "spec",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ldp_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__version__ = "0.1.0"

__all__ = [
    "AlreadyReportedError",
    "BudgetExhaustedError",
    "CellClusterModel",
    "CenterModel",
    "ClusterModel",
    "Component",
    "Device",
    "DevicePolicy",
    "EncodingError",
    "GroupTask",
    "InvalidParameterError",
    "LdpError",
    "LedgerCorruptedError",
    "OutboxCorruptedError",
    "PolicyViolationError",
    "ProtocolError",
    "Report",
    "Rng",
    "RoundNotOpen",
    "RoundSpec",
    "SecureRng",
    "SeededRng",
    "StateCorruptedError",
    "StateDirectoryError",
    "TransportError",
    "__version__",
    "cluster_model_from_dict",
    "pack_batch",
    "unpack_batch",
]
