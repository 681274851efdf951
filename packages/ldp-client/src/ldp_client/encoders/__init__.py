"""Encoders: pure public maps from a device's point to the value a mechanism randomizes.

Each encoder is a frozen dataclass mirroring one ``ldp.v1.EncoderSpec`` kind and registered in
:data:`ENCODERS`. The geometry (cell <-> index <-> bounds) and the public counter-mode generator
live in :mod:`.geometry` and :mod:`.projection`, which the collector imports as well.
"""

from __future__ import annotations

import importlib

from .base import BALL, BITS, BOX, BUCKET_VECTOR, ENCODERS, INDEX, UNIT_CUBE, Encoder, NumericDomain, as_point

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost on devices)

if TYPE_CHECKING:  # loaded on first use (PEP 562): a device imports only what its rounds use
    from typing import Any

    from .bitvector import BitVectorEncoder
    from .bucketed import BucketedVectorEncoder
    from .categorical import CategoricalEncoder
    from .geometry import CellLocator, TreeCell, cell_adjacency, cells_touch, check_partition, contact_dimension
    from .grid import CellListEncoder, GridTreeEncoder, UniformGridEncoder
    from .lsh import ShiftedGridEncoder, SimHashEncoder
    from .nearest import NearestCandidateEncoder
    from .projection import RandomProjection
    from .vectors import SymmetricBoxEncoder, UnitBallEncoder, UnitCubeEncoder

_LAZY = {
    "BitVectorEncoder": "bitvector",
    "BucketedVectorEncoder": "bucketed",
    "CategoricalEncoder": "categorical",
    "CellLocator": "geometry",
    "TreeCell": "geometry",
    "cell_adjacency": "geometry",
    "cells_touch": "geometry",
    "check_partition": "geometry",
    "contact_dimension": "geometry",
    "CellListEncoder": "grid",
    "GridTreeEncoder": "grid",
    "UniformGridEncoder": "grid",
    "ShiftedGridEncoder": "lsh",
    "SimHashEncoder": "lsh",
    "NearestCandidateEncoder": "nearest",
    "RandomProjection": "projection",
    "SymmetricBoxEncoder": "vectors",
    "UnitBallEncoder": "vectors",
    "UnitCubeEncoder": "vectors",
}

__all__ = [
    "BALL",
    "BITS",
    "BOX",
    "BUCKET_VECTOR",
    "ENCODERS",
    "INDEX",
    "UNIT_CUBE",
    "BitVectorEncoder",
    "BucketedVectorEncoder",
    "CategoricalEncoder",
    "CellListEncoder",
    "CellLocator",
    "Encoder",
    "GridTreeEncoder",
    "NearestCandidateEncoder",
    "NumericDomain",
    "RandomProjection",
    "ShiftedGridEncoder",
    "SimHashEncoder",
    "SymmetricBoxEncoder",
    "TreeCell",
    "UniformGridEncoder",
    "UnitBallEncoder",
    "UnitCubeEncoder",
    "as_point",
    "cell_adjacency",
    "cells_touch",
    "check_partition",
    "contact_dimension",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
