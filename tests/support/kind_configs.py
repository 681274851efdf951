"""The small campaign of every kind that the registry-wide tests play (contract, bounded steps, Beam)."""

from __future__ import annotations

import numpy as np

from ldp.v1 import campaigns_pb2
from ldp_collector.kinds import KINDS
from ldp_collector.kinds.base import NUMERIC
from ldp_collector.serde import kind_number

__all__ = ["CATEGORIES", "K", "small_campaign", "small_population"]

#: Clusters of the numeric kinds' blobs and ``k`` of every kind that takes one.
K = 3
#: Categories of the categorical kinds' domain.
CATEGORIES = 64


def small_campaign(name: str, x: np.ndarray, *, campaign_id: str, oracle: int | None = None
                   ) -> campaigns_pb2.CampaignConfig:
    """Kind ``name`` at epsilon 4 over ``x``'s bounding box (numeric) or :data:`CATEGORIES` values, its defaults."""
    config = campaigns_pb2.CampaignConfig(kind=kind_number(name), epsilon=4.0, campaign_id=campaign_id)
    if NUMERIC in KINDS[name].domains:
        config.domain.numeric.lower.extend(x.min(axis=0).tolist())
        config.domain.numeric.upper.extend(x.max(axis=0).tolist())
    else:
        config.domain.categorical_size = CATEGORIES
    params = getattr(config, name)
    params.SetInParent()
    if "k" in params.DESCRIPTOR.fields_by_name:
        params.k = K
    if oracle is not None:
        params.oracle = oracle
    return config


def small_population(name: str, x: np.ndarray, labels: np.ndarray) -> object:
    """The devices' points for kind ``name``: ``x``, or a category per label for the categorical kinds."""
    return x if NUMERIC in KINDS[name].domains else [(int(v),) for v in np.asarray(labels) * 7 % CATEGORIES]
