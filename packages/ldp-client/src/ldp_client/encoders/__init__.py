"""Encoders: pure public maps from a device's point to the value a mechanism randomizes.

Each encoder is a frozen dataclass mirroring one ``ldp.v1.EncoderSpec`` kind and registered in
:data:`ENCODERS`. The geometry (cell <-> index <-> bounds) and the public counter-mode generator
live in :mod:`.geometry` and :mod:`.projection`, which the collector imports as well.
"""

from __future__ import annotations

from .base import BALL, BITS, BOX, ENCODERS, INDEX, UNIT_CUBE, Encoder, NumericDomain, as_point
from .bitvector import BitVectorEncoder
from .categorical import CategoricalEncoder
from .geometry import CellLocator, TreeCell, cell_adjacency, cells_touch, check_partition, contact_dimension
from .grid import CellListEncoder, GridTreeEncoder, UniformGridEncoder
from .lsh import ShiftedGridEncoder, SimHashEncoder
from .nearest import NearestCandidateEncoder
from .projection import RandomProjection
from .vectors import SymmetricBoxEncoder, UnitBallEncoder, UnitCubeEncoder

__all__ = [
    "BALL",
    "BITS",
    "BOX",
    "ENCODERS",
    "INDEX",
    "UNIT_CUBE",
    "BitVectorEncoder",
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
