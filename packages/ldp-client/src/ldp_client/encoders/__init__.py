"""Encoders: pure public maps from a device's point to the value a mechanism randomizes."""

from __future__ import annotations

from .base import ENCODERS, Encoder, NumericDomain

__all__ = ["ENCODERS", "Encoder", "NumericDomain"]
