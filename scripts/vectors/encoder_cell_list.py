"""The cell list: the position, in the listed order, of the listed dyadic cell that holds the point."""

from __future__ import annotations

from typing import Any

from ldp_client.encoders import CellListEncoder, NumericDomain, TreeCell

from ._encoding import encode_vector, error_vector, verify_vector

SECTION = "§11.5"

_UNIT2 = NumericDomain(lower=(0.0, 0.0), upper=(1.0, 1.0))


def _cells(*pairs: tuple[int, int]) -> tuple[TreeCell, ...]:
    return tuple(TreeCell(level=level, morton_index=index) for level, index in pairs)


def _bad(*pairs: tuple[int, int]) -> dict[str, Any]:
    return {"cell_list": {"domain": {"lower": [0.0, 0.0], "upper": [1.0, 1.0]},
                          "cells": [{"level": level, "morton_index": index} for level, index in pairs]}}


def generate() -> list[dict[str, Any]]:
    # Three level-1 quadrants and the four level-2 children (12..15) of quadrant 3, listed out of order.
    mixed = _cells((2, 15), (1, 0), (2, 12), (1, 2), (2, 13), (1, 1), (2, 14))
    return [
        encode_vector("2d-mixed-levels", CellListEncoder(domain=_UNIT2, cells=mixed),
                      [[0.1, 0.1], [0.6, 0.1], [0.1, 0.6], [0.6, 0.6], [0.9, 0.6], [0.6, 0.9], [0.9, 0.9],
                       [0.5, 0.5], [1.0, 1.0], [0.75, 0.75], [0.49999999999999994, 0.5], [2.0, -1.0]]),
        encode_vector("one-cell", CellListEncoder(domain=_UNIT2, cells=_cells((0, 0))), [[0.3, 0.3]]),
        encode_vector("1d-uneven", CellListEncoder(domain=NumericDomain(lower=(10.0,), upper=(20.0,)),
                                                   cells=_cells((1, 0), (3, 4), (3, 5), (2, 3))),
                      [[10.0], [14.99], [15.0], [16.25], [17.5], [20.0]]),
        error_vector("overlapping-cells", _bad((0, 0), (1, 1)), "cells must not overlap (a cell contains another)"),
        error_vector("repeated-cell", _bad((1, 0), (1, 1), (1, 2), (1, 3), (1, 3)), "a cell must not repeat"),
        error_vector("gap", _bad((1, 0), (1, 1), (1, 2)), "the cells must cover the normalized box"),
        error_vector("index-beyond-level", _bad((1, 0), (1, 1), (1, 2), (1, 4)),
                     "a level-l cell's morton_index must be below 2^(l d)"),
        error_vector("no-cells", _bad(), "a cell list holds 1 to 2^20 cells"),
    ]


def verify(vector: dict[str, Any]) -> None:
    verify_vector(vector)
