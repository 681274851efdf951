"""Campaign engines: one module per campaign kind, all behind :class:`CampaignEngine`.

Importing this package registers every engine module in :data:`ENGINES` (``CampaignKind`` value
-> engine class); a kind without an entry is not implemented yet.
"""

from __future__ import annotations

from . import bitvector, grid, heavy_hitters, histogram, laplace, ldp_kmeans, nettree, stemmer
from .base import ENGINES, CampaignEngine, RoundOutcome, RoundPlan, RoundReports, register_engine
from .bitvector import BitVectorEngine
from .grid import GridEngine
from .heavy_hitters import HeavyHitterEngine
from .histogram import HistogramEngine
from .laplace import LaplaceEngine
from .ldp_kmeans import LdpKmeansEngine
from .nettree import NetTreeEngine
from .stemmer import StemmerEngine

__all__ = [
    "ENGINES",
    "BitVectorEngine",
    "CampaignEngine",
    "GridEngine",
    "HeavyHitterEngine",
    "HistogramEngine",
    "LaplaceEngine",
    "LdpKmeansEngine",
    "NetTreeEngine",
    "RoundOutcome",
    "RoundPlan",
    "RoundReports",
    "StemmerEngine",
    "bitvector",
    "grid",
    "heavy_hitters",
    "histogram",
    "laplace",
    "ldp_kmeans",
    "nettree",
    "register_engine",
    "stemmer",
]
