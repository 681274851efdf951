"""The clustering evaluation harness (issue 4): baselines, protocol adapters, suites, runner, tables, plots.

Entry point: ``python benchmarks/run.py --suite smoke|standard|full`` (see ``benchmarks/README.md``).
A protocol joins by registering one adapter in :mod:`harness.adapters`.
"""

from .adapters import ADAPTERS, ProtocolAdapter, collector_backend, get_adapter, register_adapter
from .baselines import Clustering
from .suites import SUITES, Block, Bound, Claim, DatasetCase, Suite, get_suite

__all__ = [
    "ADAPTERS",
    "SUITES",
    "Block",
    "Bound",
    "Claim",
    "Clustering",
    "DatasetCase",
    "ProtocolAdapter",
    "Suite",
    "collector_backend",
    "get_adapter",
    "get_suite",
    "register_adapter",
]
