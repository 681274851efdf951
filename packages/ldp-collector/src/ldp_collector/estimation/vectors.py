"""Unbiased vector reports: the least-variance SDK vector randomizer for a domain, and decoding.

Shared by every campaign kind whose devices send a perturbed copy of their point (``ldp_kmeans``)
or of ``(x, 1)`` into a hashed bucket (``nettree``, ``stemmer``).

The candidates, for a vector epsilon, are the SDK's l2-ball, box and grid discrete-Laplace
randomizers, each with its encoder; :func:`vector_component` takes the one of least worst-case
per-coordinate variance *in normalized units* (``[0, 1]`` per coordinate), computed from the
SDK's own parameter objects:

* l2 ball (Duchi et al.'s l2 mechanism, on ``(2t - 1) / sqrt(d)``): ``B_2^2 d / 4``;
* box (Duchi et al.'s l-infinity mechanism, on ``2t - 1``): ``B_inf^2 / 4``;
* discrete Laplace on a 2^10 grid (on ``t``): about ``2 d^2 / eps^2``.

Ties go to the smaller payload. The SDK's PrivUnit randomizer (on ``(2t - 1) / sqrt(d)``, decoded
as the l2 ball with its own B) is decoded here too but is not a candidate: its gain is in the sum
of the coordinates' variances, while this choice ranks the worst coordinate, where the two are
within 1 % (``benchmarks/README.md``, "Vector randomizers for the l2 ball").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ldp_client.encoders.base import Encoder, NumericDomain
from ldp_client.encoders.vectors import SymmetricBoxEncoder, UnitBallEncoder, UnitCubeEncoder
from ldp_client.errors import ProtocolError
from ldp_client.mechanisms.discrete_laplace import DiscreteLaplaceParams
from ldp_client.mechanisms.vector_box import VectorBoxParams
from ldp_client.mechanisms.vector_l2_ball import VectorL2BallParams
from ldp_client.mechanisms.vector_privunit import VectorPrivUnitParams
from ldp_client.payload import Floats, Integers
from ldp_client.spec import Component

__all__ = ["normalized_variance", "vector_component", "vector_estimates"]

#: Grid of the discrete-Laplace candidate (its default).
_LAPLACE_GRID_BITS = 10
#: Relative variance difference below which two mechanisms count as tied.
_TIE = 1e-9

_VectorMechanism = VectorL2BallParams | VectorPrivUnitParams | VectorBoxParams | DiscreteLaplaceParams


def normalized_variance(params: _VectorMechanism) -> float:
    """Worst-case variance of one decoded coordinate, in units of the domain side ([0, 1])."""
    if isinstance(params, (VectorL2BallParams, VectorPrivUnitParams)):
        # t = (sqrt(d) x + 1) / 2 with Var[x_j] <= variance_bound (B^2 / d for the l2 ball).
        return params.variance_bound * params.dimension / 4.0
    if isinstance(params, VectorBoxParams):
        return params.variance_bound / 4.0  # t = (x + 1) / 2 with Var[x_j] <= B^2
    rounding = math.ldexp(1.0, -(params.grid_bits + 1))  # decode is unbiased for the rounded point
    return params.noise_variance + rounding * rounding


def vector_component(domain: NumericDomain, epsilon: float, *, privunit: bool = False) -> Component:
    """The encoder and vector randomizer of least per-coordinate variance at ``epsilon`` (or PrivUnit).

    Candidates: the SDK's l2-ball, box and grid discrete-Laplace randomizers, each with its
    encoder (module docstring). Ties go to the smaller payload. With ``privunit``: the SDK's PrivUnit
    on the unit ball, whatever the others' variances.

    Raises
    ------
    InvalidParameterError
        ``epsilon`` outside what the mechanisms accept.
    """
    d = domain.dimension
    if privunit:
        return Component(encoder=UnitBallEncoder(domain=domain), mechanism=VectorPrivUnitParams(dimension=d,
                                                                                                 epsilon=epsilon))
    candidates: list[tuple[_VectorMechanism, Encoder]] = [
        (VectorL2BallParams(dimension=d, epsilon=epsilon), UnitBallEncoder(domain=domain)),
        (VectorBoxParams(dimension=d, epsilon=epsilon), SymmetricBoxEncoder(domain=domain)),
        (DiscreteLaplaceParams(dimension=d, epsilon=epsilon, grid_bits=_LAPLACE_GRID_BITS),
         UnitCubeEncoder(domain=domain)),
    ]
    best_variance = min(normalized_variance(p) for p, _ in candidates)
    tied = [(p, e) for p, e in candidates if normalized_variance(p) <= best_variance * (1 + _TIE)]
    params, encoder = min(tied, key=lambda pe: pe[0].payload_bits)
    return Component(encoder=encoder, mechanism=params)


def vector_estimates(params: Any, payloads: Sequence[Any]) -> NDArray[np.float64]:
    """Unbiased estimates of the reporting devices' points in normalized units (rows of ``[0, 1]^d``).

    Parameters
    ----------
    params : VectorL2BallParams, VectorPrivUnitParams, VectorBoxParams or DiscreteLaplaceParams
    payloads : sequence of payloads
        Decoded payloads of that mechanism (already checked at ingestion; shapes are re-checked).

    Raises
    ------
    ProtocolError
        A payload of the wrong type or shape.
    """
    d = int(params.dimension)
    n = len(payloads)
    if n == 0:
        return np.zeros((0, d))
    if isinstance(params, (VectorL2BallParams, VectorPrivUnitParams)):
        if not all(isinstance(p, Floats) and len(p.values) == d for p in payloads):
            raise ProtocolError(f"{params.KIND} payloads must be Floats of {d} values")
        w = np.array([p.values for p in payloads], dtype=np.float64).reshape(n, d)
        out: NDArray[np.float64] = (params.scale * math.sqrt(d) * w + 1.0) / 2.0
        return out
    if isinstance(params, VectorBoxParams):
        width = (d + 7) // 8
        if not all(isinstance(p, bytes) and len(p) == width for p in payloads):
            raise ProtocolError(f"vector_box payloads must be {width} bytes")
        raw = np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(n, width)
        bits = np.unpackbits(raw, axis=1, bitorder="little")[:, :d].astype(np.float64)
        out = (params.scale * (2.0 * bits - 1.0) + 1.0) / 2.0
        return out
    if isinstance(params, DiscreteLaplaceParams):
        if not all(isinstance(p, Integers) and len(p.values) == d for p in payloads):
            raise ProtocolError(f"discrete_laplace payloads must be Integers of {d} values")
        z = np.array([p.values for p in payloads], dtype=np.float64).reshape(n, d)
        out = z / float(params.grid_size)
        return out
    raise TypeError(f"{type(params).__name__} is not a vector mechanism")
