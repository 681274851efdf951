"""A round's accumulators as an Apache Beam ``CombineFn`` (DESIGN §9).

:class:`ComponentCombineFn` runs the collector's own mergeable accumulator,
:class:`~ldp_collector.estimation.accumulators.CountAccumulator`, on Beam: its verbs map one to one,

=====================  ===========================================================
Beam                   accumulator
=====================  ===========================================================
``create_accumulator`` ``zero`` (no component yet: the element names it, see below)
``add_input``          ``add`` of a batch of decoded payloads
``merge_accumulators`` ``merge``
``extract_output``     the blob (``to_bytes``) that the store keeps and the engine's
                       step reads through ``RoundReports.accumulators()``
=====================  ===========================================================

so the blobs are byte for byte those the ingestion path keeps (and ``rebuild`` recomputes): every
accumulator holds integer counts (GRR and unary-encoding counts, the report count of the other
mechanisms), whose sums do not depend on the order Beam adds and merges them in.

Elements are ``(key, (key, payloads))``: Beam's ``CombinePerKey`` hands ``add_input`` the value
only, and the value's own key tells the combiner which component's mechanism a fresh accumulator
takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apache_beam as beam

from ldp_client.errors import ProtocolError
from ldp_client.mechanisms import MechanismParams

from ..estimation.accumulators import ComponentParams, CountAccumulator

__all__ = ["ComponentCombineFn", "KeyedPayloads"]

#: ``(accumulator key, decoded payloads of that component)``: one batch of one component.
KeyedPayloads = tuple[str, Sequence[Any]]
#: A combiner's state: nothing yet, or the component's key and accumulator.
_State = tuple[str, CountAccumulator] | None


class ComponentCombineFn(beam.CombineFn):  # type: ignore[misc]  # beam.CombineFn is Any to mypy
    """Per-component :class:`CountAccumulator` of one round as a ``CombineFn`` (for ``CombinePerKey``).

    Parameters
    ----------
    component_params_by_group : Mapping[int, Sequence[MechanismParams]]
        The mechanism of every component of every reporting group
        (:func:`~ldp_collector.estimation.accumulators.component_params_from_spec`).
    """

    def __init__(self, component_params_by_group: ComponentParams) -> None:
        super().__init__()
        self._params = {int(g): tuple(p) for g, p in component_params_by_group.items()}

    def _mechanism(self, key: str) -> MechanismParams:
        group, index = (int(part) for part in key.split(":"))
        try:
            return self._params[group][index]
        except (KeyError, IndexError):
            raise ProtocolError(f"accumulator {key}: no such component in this round") from None

    def create_accumulator(self) -> _State:
        return None

    def add_input(self, state: _State, element: KeyedPayloads) -> _State:
        key, payloads = element
        if state is None:
            state = (key, CountAccumulator(self._mechanism(key)))
        state[1].add(payloads)
        return state

    def merge_accumulators(self, states: Any) -> _State:
        merged: _State = None
        for state in states:
            if state is None:
                continue
            if merged is None:
                merged = (state[0], state[1].zero())
            merged[1].merge(state[1])
        return merged

    def extract_output(self, state: _State) -> bytes | None:
        return state[1].to_bytes() if state is not None else None


