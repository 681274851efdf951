"""Local randomizers: one module per mechanism, each around one frozen parameter object."""

from __future__ import annotations

from .base import MECHANISMS, MechanismParams
from .randomized_response import GRRParams

__all__ = ["MECHANISMS", "GRRParams", "MechanismParams"]
