"""The categorical encoder: a category index in [0, domain_size), checked, never clamped."""

from __future__ import annotations

from typing import Any

from ldp_client.encoders import CategoricalEncoder

from ._encoding import encode_vector, error_vector, verify_vector

SECTION = "§11.1"


def generate() -> list[dict[str, Any]]:
    return [
        encode_vector("one-category", CategoricalEncoder(domain_size=1), [0]),
        encode_vector("ten", CategoricalEncoder(domain_size=10), [0, 1, 9]),
        encode_vector("largest-domain", CategoricalEncoder(domain_size=2**64 - 1), [0, 2**53, 2**64 - 2]),
        error_vector("domain-size-zero", {"categorical": {"domain_size": 0}}, "domain_size must be >= 1"),
        error_vector("domain-size-2^64", {"categorical": {"domain_size": 2**64}}, "domain_size must be < 2^64"),
        error_vector("category-equal-to-size", {"categorical": {"domain_size": 10}},
                     "a category outside [0, domain_size) is rejected, not clamped", point=10),
        error_vector("negative-category", {"categorical": {"domain_size": 10}},
                     "a negative category is rejected", point=-1),
        error_vector("fractional-category", {"categorical": {"domain_size": 10}},
                     "a category must be an integer", point=1.5),
    ]


def verify(vector: dict[str, Any]) -> None:
    verify_vector(vector)
