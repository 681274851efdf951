"""Bucketized vector sum: one report from which the collector estimates the vector sum of ANY bucket.

A device holding a bucket b in [0, 2^bucket_bits) (its node under a public LSH) and a vector v of
the box [-1, 1]^D (D = ``dimension``; from :class:`~ldp_client.encoders.bucketed.BucketedVectorEncoder`,
v = (2t - 1, 1)) reports ``SignedVector(s, y)``: a fresh public sign seed s and the output y of an
unbiased vector randomizer on sigma v, where sigma = sigma_s(b) is a public pseudo-random sign of
the bucket. The collector's estimate of the sum of v over the devices of a bucket c, chosen after
the fact, is S_c = sum_i sigma_{s_i}(c) z_i, with z_i the unbiased decoding of y_i.

Algorithm
    1. s = a uniform 32-bit seed (``rng.randbits(32)``, the OS CSPRNG on a device).
    2. sigma = 1 - 2 H(s, b, 2) in {-1, +1}, H the local-hashing hash
       (:func:`~ldp_client.mechanisms.local_hashing.hash_value` with g = 2; the collector's numpy
       twin is ``ldp_collector.estimation.olh_hash.hash_values``).
    3. Shape BOX: y = the box randomizer (:class:`~ldp_client.mechanisms.vector_box.VectorBoxParams`,
       dimension D) on sigma v; shape L2_BALL (PRIVUNIT): y = the l2-ball randomizer
       (:class:`~ldp_client.mechanisms.vector_l2_ball.VectorL2BallParams`; PrivUnit,
       :class:`~ldp_client.mechanisms.vector_privunit.VectorPrivUnitParams`), dimension D, on
       sigma v / sqrt(D), which lies in the unit ball since ||v|| <= sqrt(D). PrivUnit is decoded
       as the ball (its own B').
    The decoding in box units is z = B y_signs (box: B the box randomizer's scale, y_signs in
    {-1, +1}^D) or z = sqrt(D) B' w (ball: B' the l2 randomizer's scale, w the reported direction).
Privacy
    epsilon-LDP with the inner randomizer's realized epsilon ln r <= epsilon, tight. The seed is
    drawn independently of the data, so P[(s, y) | b, v] = 2^-32 P[M(sigma_s(b) v) = y], M the
    inner mechanism. For every fixed s, sigma_s(b) v (or sigma_s(b) v / sqrt(D)) is a member of the
    box (ball), which is symmetric under negation, and M is ln r-LDP over the whole box (ball):
    P[M(u) = y] <= r P[M(u') = y] for any two members u, u'. Hence
    P[(s, y) | b, v] <= r P[(s, y) | b', v'] for any two inputs. The bound is attained: for buckets
    b, b' with sigma_s(b) = -sigma_s(b') and v = v' a corner, the inner inputs are u and -u, which
    attain the inner mechanism's ratio r. The sign does not depend on any secret: the bucket is
    protected by the inner randomization exactly as the vector is.
Parameters
    ``bucket_bits`` in [0, 64], ``dimension`` D in [1, 4096], ``epsilon`` in (0, 20] (at least
    about 1.5e-14), ``shape`` L2_BALL, BOX or PRIVUNIT.
Utility
    E[z | s, b, v] = sigma_s(b) v (the inner estimate is unbiased), so
    E[sigma_s(c) z] = E_s[sigma_s(c) sigma_s(b)] v, which is v for b = c and 0 for b != c when the
    signs of two distinct buckets are independent and uniform over the seed (an ideal hash; for
    H the correlation over the 2^32 seeds behaves like that of a random function, about 2^-16).
    So E[S_c] = sum of v_i over the devices in bucket c. Per coordinate j, sigma^2 = 1 gives
    E[(sigma z_j)^2] = E[z_j^2] = M exactly, whatever the input, with
    M = B^2 (box: every z_j is +-B) or M = B'^2 (ball: E[(B' w_j)^2] = B'^2 / D, times D)
    (:attr:`BucketizedVectorParams.report_second_moment`; for PRIVUNIT, M = D times its
    ``variance_bound`` bounds E[z_j^2], whose sum over j is exactly D B'^2). Reports are
    independent, so the exact (PRIVUNIT: bounded) variance of coordinate j of S_c over n reports is
    Var[S_cj] = n M - sum_{i in c} v_ij^2 <= n M (:meth:`BucketizedVectorParams.sum_variance`):
    every report adds noise to every bucket, independently of the bucket's size. M is
    O(D / epsilon^2) for small epsilon for both shapes.
Cost
    32 + D bits (box) or 32 + 32 D bits (ball, PrivUnit). CPU: one 32-bit draw, one hash (two 64-bit mixes)
    and the inner randomizer (about 40 microseconds for D = 10, box). The collector's cost is one
    hash and D multiply-adds per (report, bucket) pair.
Reference
    Bassily and Smith, "Local, private, efficient protocols for succinct histograms" (STOC 2015),
    for public per-report hashing; Duchi, Jordan and Wainwright, "Minimax optimal procedures for
    locally private estimation" (JASA 2018), for the vector randomizers.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

from .._validation import check_epsilon, check_int, check_vector, describe
from ..encoders.base import BUCKET_VECTOR, MAX_DIMENSION
from ..errors import EncodingError, InvalidParameterError, ProtocolError
from ..payload import Floats, SignedVector, unpack_bits
from ..rng import Rng, resolve_rng
from .base import MECHANISMS, MechanismParams
from .local_hashing import SEED_BITS, hash_value
from .vector_box import VectorBoxParams
from .vector_l2_ball import VectorL2BallParams
from .vector_privunit import VectorPrivUnitParams

__all__ = ["MAX_BUCKET_BITS", "BucketizedVectorParams", "VectorShape", "randomize", "sign"]

#: Largest ``bucket_bits``: buckets are hashed as 64-bit words.
MAX_BUCKET_BITS = 64


class VectorShape(enum.IntEnum):
    """The inner vector randomizer; values equal ``ldp.v1.BucketizedVector.Shape``."""

    L2_BALL = 1
    BOX = 2
    PRIVUNIT = 3


def sign(seed: int, bucket: int) -> int:
    """sigma_seed(bucket) = 1 - 2 H(seed, bucket, 2), in {-1, +1}.

    Parameters
    ----------
    seed : int
        In [0, 2^32).
    bucket : int
        In [0, 2^64).
    """
    return 1 - 2 * hash_value(seed, bucket, 2)


@MECHANISMS.register
@dataclass(frozen=True, kw_only=True)
class BucketizedVectorParams(MechanismParams):
    """Parameters of the bucketized vector sum (``ldp.v1.BucketizedVector``).

    See the module docstring for the privacy argument, utility and cost. The value randomized is
    the pair ``(bucket, vector)`` of :class:`~ldp_client.encoders.bucketed.BucketedVectorEncoder`;
    the payload is a :class:`~ldp_client.payload.SignedVector`.
    """

    KIND: ClassVar[str] = "bucketized_vector"
    PAYLOAD_FIELD: ClassVar[str] = "signed_vector"
    INPUT_KIND: ClassVar[str] = BUCKET_VECTOR

    bucket_bits: int
    dimension: int
    epsilon: float
    shape: VectorShape

    def __post_init__(self) -> None:
        check_int("bucket_bits", self.bucket_bits, 0, MAX_BUCKET_BITS)
        check_int("dimension", self.dimension, 1, MAX_DIMENSION)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        shape: Any = self.shape  # may be a plain int (from_dict, callers)
        if isinstance(shape, bool) or not isinstance(shape, int):
            raise TypeError(f"shape must be a VectorShape, got {type(shape).__name__}")
        if shape not in (VectorShape.L2_BALL, VectorShape.BOX, VectorShape.PRIVUNIT):
            raise InvalidParameterError(f"shape must be L2_BALL (1), BOX (2) or PRIVUNIT (3), got {int(shape)}")
        object.__setattr__(self, "shape", VectorShape(shape))
        _ = self.inner  # the inner randomizer's own checks (epsilon large enough for an unbiased estimate)

    @cached_property
    def inner(self) -> VectorBoxParams | VectorL2BallParams | VectorPrivUnitParams:
        """The inner vector randomizer, of dimension ``dimension`` at ``epsilon``."""
        if self.shape == VectorShape.BOX:
            return VectorBoxParams(dimension=self.dimension, epsilon=self.epsilon)
        if self.shape == VectorShape.PRIVUNIT:
            return VectorPrivUnitParams(dimension=self.dimension, epsilon=self.epsilon)
        return VectorL2BallParams(dimension=self.dimension, epsilon=self.epsilon)

    @cached_property
    def decode_scale(self) -> float:
        """The factor from an inner report to z in box units: B (box signs) or sqrt(D) B' (ball floats)."""
        if self.shape == VectorShape.BOX:
            return self.inner.scale
        return math.sqrt(self.dimension) * self.inner.scale

    @cached_property
    def report_second_moment(self) -> float:
        """M = E[z_j^2]: B^2 (box) or B'^2 (ball), exact for every input, in box units; a bound for PrivUnit.

        The variance of one report's contribution sigma(c) z_j to a bucket's sum is M, or
        M - v_j^2 for a report from that bucket. PrivUnit's E[z_j^2] depends on the direction of
        the input; M is its largest value, D times the inner ``variance_bound``.
        """
        if self.shape == VectorShape.BOX:
            return self.inner.variance_bound  # B^2
        return self.inner.variance_bound * self.dimension  # (B'^2 / D) * D for the ball

    @cached_property
    def report_mean_second_moment(self) -> float:
        """E[||z||^2] / D, exact for every input: B^2 (box) or B'^2 (ball, PrivUnit: unit directions).

        What a report adds to a bucket sum's squared error, averaged over the coordinates (a
        center's squared l2 error adds the coordinates up); equal to :attr:`report_second_moment`
        except for PrivUnit, whose noise leans towards the input's direction.
        """
        if self.shape == VectorShape.BOX:
            return self.inner.variance_bound
        return self.decode_scale**2 / self.dimension

    def sum_variance(self, reports: float, bucket_square_sum: float = 0.0) -> float:
        """Exact variance ``n M - sum_{i in c} v_ij^2`` of one coordinate of a bucket's estimated sum.

        Parameters
        ----------
        reports : float
            n, the number of reports summed (all buckets).
        bucket_square_sum : float
            The sum of v_ij^2 over the devices in the bucket (0 gives the bound n M).
        """
        return reports * self.report_second_moment - bucket_square_sum

    @property
    def realized_epsilon(self) -> float:
        return self.inner.realized_epsilon

    @property
    def input_size(self) -> int:
        return self.dimension

    @property
    def payload_bits(self) -> int:
        return SEED_BITS + self.inner.payload_bits

    def randomize(self, value: Any, *, rng: Rng | None = None, seed: int | None = None) -> SignedVector:
        return randomize(value, self, rng=rng, seed=seed)

    def check_payload(self, payload: Any) -> SignedVector:
        if not isinstance(payload, SignedVector):
            raise ProtocolError(f"bucketized_vector payload must be a SignedVector, got {describe(payload)}")
        seed, inner = payload
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**SEED_BITS:
            raise ProtocolError(f"bucketized_vector seed must be in [0, 2^{SEED_BITS}), got {describe(seed)}")
        try:
            self.inner.check_payload(inner)
        except ProtocolError as exc:
            raise ProtocolError(f"bucketized_vector inner payload: {exc}") from None
        return payload

    def decode(self, payload: Any) -> list[float]:
        """z: the unbiased estimate of sigma v in box units, from one report (the sign not applied)."""
        inner = self.check_payload(payload).inner
        scale = self.decode_scale
        if isinstance(inner, Floats):
            return [scale * w for w in inner.values]
        return [scale if bit else -scale for bit in unpack_bits(inner, self.dimension)]

    def estimate(self, payload: Any, bucket: int) -> list[float]:
        """sigma_s(bucket) z: one report's unbiased contribution to the sum of ``bucket``'s vectors."""
        check_int("bucket", bucket, 0, (1 << self.bucket_bits) - 1)
        z = self.decode(payload)
        return z if sign(payload.seed, bucket) > 0 else [-v for v in z]


def _check_value(value: Any, params: BucketizedVectorParams) -> tuple[int, list[float]]:
    """The validated ``(bucket, vector)`` pair handed to :func:`randomize`."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"bucketized_vector value must be a pair (bucket, vector), got {type(value).__name__}")
    bucket, vector = value
    if isinstance(bucket, bool) or not isinstance(bucket, int):
        raise TypeError(f"bucketized_vector bucket must be an int, got {type(bucket).__name__}")
    if not 0 <= bucket < 1 << params.bucket_bits:
        raise EncodingError(f"bucketized_vector bucket must be in [0, 2^{params.bucket_bits}), got {bucket}")
    x = check_vector("bucketized_vector vector", vector, params.dimension)
    for j, xj in enumerate(x):
        if not -1.0 <= xj <= 1.0:
            raise EncodingError(f"bucketized_vector vector coordinate {j} must be in [-1, 1], got {xj}")
    return bucket, x


def randomize(value: Any, params: BucketizedVectorParams, *, rng: Rng | None = None,
              seed: int | None = None) -> SignedVector:
    """Draw a sign seed and randomize the bucket's signed vector with the inner randomizer.

    Parameters
    ----------
    value : (int, sequence of float)
        ``(bucket, vector)``: the bucket in ``[0, 2^params.bucket_bits)`` and ``params.dimension``
        finite coordinates in [-1, 1].
    params : BucketizedVectorParams
    rng : Rng, optional
        Defaults to the OS CSPRNG. The seed is its first draw (32 bits), the inner randomizer's
        coins follow.
    seed : int, optional
        A sign seed in [0, 2^32) assigned by the collector instead of drawn here (public randomness
        independent of ``value``: privacy is unchanged).

    Returns
    -------
    SignedVector
        The seed and the inner report (packed signs for BOX, float32 directions for L2_BALL).
    """
    bucket, x = _check_value(value, params)
    rng = resolve_rng(rng)
    if seed is None:
        seed = rng.randbits(SEED_BITS)
    else:
        check_int("seed", seed, 0, 2**SEED_BITS - 1)
    sigma = sign(seed, bucket)
    if params.shape == VectorShape.BOX:
        signed = [sigma * xj for xj in x]  # negation is exact: still in the box
    else:
        factor = sigma / math.sqrt(params.dimension)  # ||v|| <= sqrt(D): in the unit ball (+ rounding slack)
        signed = [factor * xj for xj in x]
    return SignedVector(seed, params.inner.randomize(signed, rng=rng))
