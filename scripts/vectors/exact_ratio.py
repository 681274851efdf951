"""The exact stand-in r for e^x every mechanism's probabilities use: the largest m / 2^s <= e^x.

Input: ``x`` (a double, also as its exact hexadecimal form ``x_hex``). Output: the shift
s = max(0, 47 - trunc(x / ln2)) (IEEE double division by the double nearest ln 2), m =
floor(e^x 2^s) - 1 (at least 2^s) as a decimal string, and r = m / 2^s in lowest terms as
``[numerator, denominator]`` decimal strings.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from ldp_client._exact import exp_below

from ._common import check, json_fraction

SECTION = "§7.1"

# Epsilons of the other areas, the range's ends, halves (SUE), near a power of two of e^x
# (x / ln 2 close to an integer) and values that are not short decimals.
_XS: list[float] = sorted({
    2.0**-60, 1e-9, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 8.0, 10.0, 20.0,
    math.log(2), math.log(3), 2 * math.log(2), math.nextafter(math.log(2), 0.0), math.nextafter(math.log(2), 1.0),
    19 * math.log(2), 1.0 / 3.0, 2.0 / 3.0, 0.1 + 0.2, 4.0 / 3.0, 1.0 / 8.0, 1.0 / 12.0, 5.0 / 3.0, 1.1, math.log(20.5),
})


def _output(x: float) -> dict[str, Any]:
    r = exp_below(x)
    shift = max(0, 47 - int(x / math.log(2)))
    m = r * 2**shift
    assert m.denominator == 1
    return {"s": shift, "m": str(m.numerator), "r": json_fraction(r)}


def generate() -> list[dict[str, Any]]:
    return [{"name": f"x-{x.hex()}", "input": {"x": x, "x_hex": x.hex()}, "output": _output(x)} for x in _XS]


def verify(vector: dict[str, Any]) -> None:
    x = float(vector["input"]["x"])
    check(vector["name"], float.fromhex(vector["input"]["x_hex"]), x)
    check(vector["name"], _output(x), vector["output"])
    r = Fraction(*map(int, vector["output"]["r"]))
    check(vector["name"], r <= Fraction(math.exp(x)) * (1 + Fraction(1, 2**40)), True)
