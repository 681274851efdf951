"""Campaign kinds: one module per kind, each declaring its :class:`Kind` (engine, domains, ...).

:data:`KINDS` (from :mod:`.registry`) is the only list of kinds; every other layer reads it. The
engines implement :class:`CampaignEngine` (``first_round``, ``close_round``); :mod:`.common` holds
what several kinds share.
"""

from __future__ import annotations

from .base import CampaignEngine, Kind, RoundOutcome, RoundPlan, RoundReports
from .registry import KINDS, kind_for

__all__ = ["KINDS", "CampaignEngine", "Kind", "RoundOutcome", "RoundPlan", "RoundReports", "kind_for"]
