"""The nearest candidate: the candidate at the exactly smallest Euclidean distance from the
clamped point, in the domain's units; exact ties go to the lowest index."""

from __future__ import annotations

from typing import Any

from ldp_client.encoders import NearestCandidateEncoder, NumericDomain

from ._encoding import encode_vector, error_vector, verify_vector

SECTION = "§11.7"


def generate() -> list[dict[str, Any]]:
    domain = NumericDomain(lower=(-2.0, 10.0), upper=(2.0, 30.0))
    return [
        encode_vector("original-units-and-clamping", NearestCandidateEncoder(
            domain=domain, dimension=2, centers=(2.0, 10.0, -2.0, 16.0, 0.0, 40.0)),
            [[-2.0, 10.0], [0.0, 13.0], [50.0, -50.0], [0.0, 30.0], [0.0, 35.0]]),
        encode_vector("ties-go-to-the-lowest-index", NearestCandidateEncoder(
            domain=domain, dimension=2, centers=(0.0, 20.0, 0.0, 20.0, 1.0, 20.0)),
            [[0.0, 20.0], [0.5, 20.0], [0.9, 20.0]]),
        # From 1 the centers -2^-60 and 2^-60 are 1 + 2^-60 and 1 - 2^-60 away: equal once rounded
        # to binary64, but the second is nearer.
        encode_vector("exact-where-rounded-distances-tie", NearestCandidateEncoder(
            domain=NumericDomain(lower=(0.0,), upper=(2.0,)), dimension=1, centers=(-(2.0**-60), 2.0**-60)),
            [[1.0], [0.0], [2.0]]),
        encode_vector("distances-beyond-the-largest-double", NearestCandidateEncoder(
            domain=NumericDomain(lower=(-8e307,), upper=(8e307,)), dimension=1, centers=(-1.7e308, -1e308)),
            [[8e307], [-8e307]]),
        encode_vector("one-candidate", NearestCandidateEncoder(domain=domain, dimension=2, centers=(7.0, 7.0)),
                      [[0.0, 20.0]]),
        error_vector("dimension-differs-from-domain", {"nearest_candidate": {
            "domain": {"lower": [0.0], "upper": [1.0]}, "dimension": 2, "centers": [0.0, 0.0]}},
            "dimension must equal the domain's dimension"),
        error_vector("ragged-centers", {"nearest_candidate": {
            "domain": {"lower": [0.0, 0.0], "upper": [1.0, 1.0]}, "dimension": 2, "centers": [0.0, 0.0, 1.0]}},
            "centers must hold a positive multiple of dimension values"),
        error_vector("no-centers", {"nearest_candidate": {
            "domain": {"lower": [0.0], "upper": [1.0]}, "dimension": 1, "centers": []}},
            "at least one candidate"),
    ]


def verify(vector: dict[str, Any]) -> None:
    verify_vector(vector)
