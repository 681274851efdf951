"""The registry of campaign kinds: the ONLY list of kinds in the collector.

Every module named in :data:`KIND_MODULES` declares its :class:`~ldp_collector.kinds.base.Kind`
as a module-level ``KIND``; :data:`KINDS` maps each kind's name to it, in that order. Adding a kind
is its module (engine and ``KIND``), its ``ldp.v1`` messages and its tests, plus its name here:
an explicit tuple rather than discovery, so that a helper module of the package (``common``,
``_lsh``) is never mistaken for a kind and the order of the CLI's choices stays stable.
"""

from __future__ import annotations

import importlib

from ..errors import InvalidArgumentError
from .base import Kind

__all__ = ["KINDS", "KIND_MODULES", "kind_for"]

#: The modules of ``ldp_collector.kinds`` that declare a kind, in ``ldp.v1.CampaignKind`` value order.
KIND_MODULES: tuple[str, ...] = (
    "histogram", "grid", "stemmer", "nettree", "bitvector", "laplace", "ldp_kmeans", "heavy_hitters")


def _load() -> dict[str, Kind]:
    kinds: dict[str, Kind] = {}
    for module_name in KIND_MODULES:
        module = importlib.import_module(f"{__package__}.{module_name}")
        kind = getattr(module, "KIND", None)
        if not isinstance(kind, Kind):
            raise RuntimeError(f"{module.__name__} declares no KIND")
        if kind.name in kinds:
            raise RuntimeError(f"two modules declare campaign kind {kind.name}")
        kinds[kind.name] = kind
    return kinds


#: Every campaign kind by name (``"histogram"``), in :data:`KIND_MODULES` order.
KINDS: dict[str, Kind] = _load()


def kind_for(name: str) -> Kind:
    """The kind named ``name`` (``"histogram"``; the wire's numbers are :mod:`ldp_collector.serde`'s business).

    Raises
    ------
    InvalidArgumentError
        A name without a registered kind (``"campaign kind GRID is not implemented yet"``).
    """
    try:
        return KINDS[name]
    except KeyError:
        raise InvalidArgumentError(f"campaign kind {name.upper()} is not implemented yet") from None
