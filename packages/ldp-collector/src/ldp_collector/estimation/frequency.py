"""Server half of the frequency oracles: unbiased counts with standard errors and intervals.

One aggregator per oracle, all with the verbs ``zero`` / ``add`` / ``merge`` / ``estimate``:

======================================  ==================================  =======================
aggregator                              state                               ``add`` fast path
======================================  ==================================  =======================
:class:`GRRAggregator`                  count of every reported index       :meth:`~GRRAggregator.add_indices`
:class:`UnaryEncodingAggregator`        count of every set bit              :meth:`~UnaryEncodingAggregator.add_packed`
:class:`LocalHashingAggregator`         the raw (seed, bucket) reports      :meth:`~LocalHashingAggregator.add_arrays`
  with a public seed pool (§14)         count of every (pool seed, bucket)  :meth:`~LocalHashingAggregator.add_arrays`
======================================  ==================================  =======================

Every constant (p, q, g, the variance) comes from the SDK's parameter object; nothing is
re-derived here. With C the number of reports supporting v (GRR: reporting v; unary encoding: with
bit v set; local hashing: with H(seed, v) equal to the reported bucket), the estimate is

    c_hat(v) = (C - n q) / (p - q),

unbiased for the number of the n devices holding v. Its variance is the parameter object's
``count_variance(n, c)``, affine in the true count c (the support is a sum of independent
indicators); the standard error plugs in c_hat clipped to [0, n], and the interval is
c_hat +- z SE with z the two-sided normal quantile of the confidence level. Estimates can be
negative: that is what unbiasedness costs. :func:`make_consistent` projects them onto
non-negative counts summing to n, lowering the error at the price of a bias.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from operator import itemgetter
from statistics import NormalDist
from typing import Any, Literal, TypeVar, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import GRRParams, LocalHashingParams, UnaryEncodingParams
from ldp_client.mechanisms.local_hashing import SEED_BITS
from ldp_client.payload import HashedValue

from .olh_hash import pool_support_counts, support_counts

__all__ = [
    "ConsistencyMethod",
    "FrequencyAggregator",
    "FrequencyEstimate",
    "FrequencyOracleParams",
    "GRRAggregator",
    "MAX_POOL_CELLS",
    "LocalHashingAggregator",
    "UnaryEncodingAggregator",
    "estimate_from_support",
    "make_aggregator",
    "make_consistent",
]

#: Parameter objects of the frequency oracles this module estimates.
FrequencyOracleParams = Union[GRRParams, UnaryEncodingParams, LocalHashingParams]
ConsistencyMethod = Literal["norm_sub", "clip"]

#: Largest domain whose counts are kept as one dense array (128 MiB of int64).
MAX_DENSE_DOMAIN = 2**24
#: Largest seed pool x hash range a local-hashing aggregator counts in (the same 128 MiB bound).
MAX_POOL_CELLS = MAX_DENSE_DOMAIN
#: Below this many reports an estimate carries a low-n warning, whatever the noise.
MIN_REPORTS = 100
#: Warn when the standard error of a zero count exceeds this share of n.
MAX_NOISE_SHARE = 0.1
#: Reports per chunk when unpacking unary-encoding bits (bounds the temporary to ~16 MiB).
_UNPACK_CHUNK_BITS = 1 << 24

_A = TypeVar("_A", bound="FrequencyAggregator")


# --------------------------------------------------------------------------------------------
# Estimates
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, eq=False)
class FrequencyEstimate:
    """Estimated counts of ``values`` among ``n`` reports, with standard errors and intervals.

    Attributes
    ----------
    values : numpy.ndarray of int64, shape (m,)
        The domain values the counts refer to (the whole domain, or the candidates asked for).
    counts : numpy.ndarray of float64, shape (m,)
        Unbiased estimates (may be negative) unless ``consistent``.
    std_errors : numpy.ndarray of float64, shape (m,)
        Analytic standard errors of the unbiased estimates (plug-in count clipped to [0, n]).
    n : int
        Number of reports.
    confidence : float
        Confidence level of the intervals.
    ci_lower, ci_upper : numpy.ndarray of float64, shape (m,)
        ``unbiased estimate -+ z * std_error`` with z = Phi^-1((1 + confidence) / 2).
    zero_std_error : float
        Standard error of the estimate of a value nobody holds (the noise floor: thresholds for
        heavy hitters are multiples of it).
    warnings : list of str
        Low-n and noise warnings, for the operator.
    consistent : bool
        Whether ``counts`` were post-processed by :func:`make_consistent` (then they are biased;
        the standard errors and intervals still describe the unbiased estimates).
    domain_size : int or None
        Size of the oracle's domain, when known (whole-domain checks of :meth:`with_consistency`).
    """

    values: NDArray[np.int64]
    counts: NDArray[np.float64]
    std_errors: NDArray[np.float64]
    n: int
    confidence: float
    ci_lower: NDArray[np.float64]
    ci_upper: NDArray[np.float64]
    zero_std_error: float
    warnings: list[str] = field(default_factory=list)
    consistent: bool = False
    domain_size: int | None = None

    def __len__(self) -> int:
        return int(self.values.shape[0])

    @property
    def z(self) -> float:
        """The normal quantile the intervals use."""
        return _z_for(self.confidence)

    def with_consistency(self, method: ConsistencyMethod = "norm_sub") -> FrequencyEstimate:
        """A copy whose counts are made consistent by :func:`make_consistent`.

        ``"norm_sub"`` is only meaningful for whole-domain estimates (the counts must sum to n);
        use ``"clip"`` for candidate subsets. Standard errors and intervals are unchanged.
        """
        if method == "norm_sub" and self.n and not _is_arange(self.values, self.domain_size):
            raise InvalidParameterError(
                "norm_sub needs an estimate over the whole domain (its counts sum to n); "
                f"this one covers {len(self)} candidate values: use method='clip'")
        return replace(self, counts=make_consistent(self.counts, self.n, method), consistent=True)


def _is_arange(values: NDArray[np.int64], domain_size: int | None) -> bool:
    """Whether ``values`` are 0, 1, ..., m - 1 (and m is the domain size, when known)."""
    if not values.size or (domain_size is not None and values.size != domain_size):
        return False
    return bool(values[0] == 0 and np.all(np.diff(values) == 1))


def _z_for(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def _check_confidence(confidence: Any) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)):
        raise TypeError(f"confidence must be a float, got {type(confidence).__name__}")
    c = float(confidence)
    if not 0.0 < c < 1.0:
        raise InvalidParameterError(f"confidence must be in (0, 1), got {c:g}")
    return c


def estimate_from_support(params: FrequencyOracleParams, values: ArrayLike, support: ArrayLike, n: int,
                          confidence: float = 0.95, *, value_pairs: float = 0.0) -> FrequencyEstimate:
    """Turn support counts into unbiased count estimates with standard errors and intervals.

    Parameters
    ----------
    params : GRRParams, UnaryEncodingParams or LocalHashingParams
        The oracle that produced the reports (source of p, q and the variance).
    values : array_like of int, shape (m,)
        The domain values the supports belong to.
    support : array_like of int, shape (m,)
        Number of reports supporting each value.
    n : int
        Number of reports.
    confidence : float
        Level of the intervals, in (0, 1).
    value_pairs : float
        Local hashing with a seed pool: an estimate of sum_x n_x (n_x - 1) over all values
        (:meth:`LocalHashingAggregator.value_pairs`); the variance of value v then gains
        ``params.seed_pool_extra_variance`` of that sum less v's own c (c - 1) (plug-in c clipped
        to [0, n]). Ignored without a pool.

    Returns
    -------
    FrequencyEstimate
    """
    confidence = _check_confidence(confidence)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise InvalidParameterError(f"n must be an int >= 0, got {n!r}")
    n = int(n)
    vals = np.asarray(values, dtype=np.int64).ravel()
    sup = np.asarray(support, dtype=np.float64).ravel()
    if vals.shape != sup.shape:
        raise InvalidParameterError(f"values and support must have the same length, got {vals.size} and {sup.size}")
    p, q = params.p, params.q
    counts = (sup - n * q) / (p - q)
    # count_variance is affine in the count (a sum of independent indicators): evaluate it at 0
    # and n, then interpolate at the clipped plug-in estimates, vectorized.
    var0 = params.count_variance(float(n), 0.0)
    slope = (params.count_variance(float(n), float(n)) - var0) / n if n else 0.0
    clipped = np.clip(counts, 0.0, float(n))
    variance = var0 + slope * clipped
    if isinstance(params, LocalHashingParams) and params.seed_pool_size:
        # The pool's extra term is linear in the pair sum over the values other than v (§14).
        per_pair = params.seed_pool_extra_variance(1.0)
        variance = variance + per_pair * np.maximum(value_pairs - clipped * (clipped - 1.0), 0.0)
        var0 += per_pair * max(value_pairs, 0.0)
    std_errors = np.sqrt(np.maximum(variance, 0.0))
    z = _z_for(confidence)
    zero_se = float(np.sqrt(max(var0, 0.0)))
    return FrequencyEstimate(
        values=vals, counts=counts, std_errors=std_errors, n=n, confidence=confidence,
        ci_lower=counts - z * std_errors, ci_upper=counts + z * std_errors, zero_std_error=zero_se,
        warnings=_low_n_warnings(n, zero_se), domain_size=params.domain_size)


def _low_n_warnings(n: int, zero_se: float) -> list[str]:
    if n == 0:
        return ["no reports: every estimate is 0 and carries no information"]
    out = []
    if n < MIN_REPORTS:
        out.append(f"only {n} reports (fewer than {MIN_REPORTS}): the normal intervals are unreliable")
    if zero_se > MAX_NOISE_SHARE * n:
        out.append(
            f"noise dominates: the standard error of a zero count is {zero_se:.4g}, more than "
            f"{MAX_NOISE_SHARE:.0%} of the {n} reports; collect more reports or raise epsilon")
    return out


def make_consistent(counts: ArrayLike, n: int, method: ConsistencyMethod = "norm_sub") -> NDArray[np.float64]:
    """Post-process unbiased count estimates into consistent ones.

    Consistency trades unbiasedness for lower error: the projected counts are biased (rare values
    are pushed up to 0, frequent ones down), but their total squared error is never larger than
    the unbiased estimates' (both methods are Euclidean projections onto convex sets that contain
    the true counts, and such projections never move a point away from the set's members), and
    usually much smaller for sparse histograms. Post-processing costs no privacy.

    Parameters
    ----------
    counts : array_like of float, shape (m,)
        Unbiased estimates over the **whole domain** for ``"norm_sub"``, any values for ``"clip"``.
    n : int
        Number of reports (the true counts sum to n).
    method : {"norm_sub", "clip"}
        ``"norm_sub"`` (Wang et al. 2020): set negative counts to 0, then subtract one constant
        delta from every count and clip at 0 again, with delta chosen so the result sums to n
        (the Euclidean projection of the clipped counts onto {x >= 0, sum x = n}; when delta >= 0,
        the usual case, also that of the raw counts). ``"clip"``: clip each count to [0, n] (no
        normalization; usable on candidate subsets).

    Returns
    -------
    numpy.ndarray of float64
        Non-negative counts; for ``"norm_sub"`` they sum to n.

    References
    ----------
    Wang, Lopuhaä-Zwakenberg, Li, Skoric and Li, "Locally differentially private frequency
    estimation with consistency" (NDSS 2020).
    """
    c = np.asarray(counts, dtype=np.float64).ravel()
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise InvalidParameterError(f"n must be an int >= 0, got {n!r}")
    if not np.all(np.isfinite(c)):
        raise InvalidParameterError("counts must be finite")
    if method == "clip":
        return np.clip(c, 0.0, float(n))
    if method != "norm_sub":
        raise InvalidParameterError(f"method must be 'norm_sub' or 'clip', got {method!r}")
    if c.size == 0:
        raise InvalidParameterError("norm_sub needs at least one count")
    x = np.maximum(c, 0.0)
    # Find delta with sum(max(x - delta, 0)) = n: with x sorted descending and k entries kept,
    # delta = (sum of the k largest - n) / k, for the largest k whose k-th value exceeds it.
    desc = np.sort(x)[::-1]
    cumulative = np.cumsum(desc)
    k = np.arange(1, desc.size + 1)
    deltas = (cumulative - n) / k
    kept = np.flatnonzero(desc > deltas)
    delta = deltas[kept[-1]] if kept.size else (cumulative[-1] - n) / desc.size
    return np.asarray(np.maximum(x - delta, 0.0), dtype=np.float64)


# --------------------------------------------------------------------------------------------
# Aggregators
# --------------------------------------------------------------------------------------------


class FrequencyAggregator(abc.ABC):
    """Mergeable server state of one frequency oracle for one round's reports.

    Verbs: :meth:`zero` (a new empty aggregator with the same parameters), :meth:`add` (a batch of
    decoded payloads, as :mod:`ldp_client.payload` returns them), :meth:`merge` (another
    aggregator's state, e.g. from another process) and :meth:`estimate`.
    """

    @property
    @abc.abstractmethod
    def params(self) -> FrequencyOracleParams:
        """The oracle's parameters."""

    @property
    @abc.abstractmethod
    def n(self) -> int:
        """Number of reports added."""

    @abc.abstractmethod
    def zero(self: _A) -> _A:
        """A new, empty aggregator with the same parameters."""

    @abc.abstractmethod
    def add(self, payloads: Sequence[Any]) -> None:
        """Add a batch of decoded payloads; a malformed one raises ``ProtocolError`` and adds nothing."""

    @abc.abstractmethod
    def merge(self: _A, other: _A) -> None:
        """Add ``other``'s reports to this aggregator (same class and parameters)."""

    @abc.abstractmethod
    def support(self, values: NDArray[np.int64]) -> NDArray[np.int64]:
        """Number of reports supporting each of ``values`` (validated domain values)."""

    def default_values(self) -> NDArray[np.int64]:
        """The values :meth:`estimate` covers by default: the whole domain."""
        size = self.params.domain_size
        if size > MAX_DENSE_DOMAIN:
            raise InvalidParameterError(
                f"domain_size {size} is too large to enumerate (more than {MAX_DENSE_DOMAIN}): pass candidates")
        return np.arange(size, dtype=np.int64)

    def estimate(self, confidence: float = 0.95, *, candidates: ArrayLike | None = None) -> FrequencyEstimate:
        """Unbiased counts with standard errors and ``confidence`` intervals.

        Parameters
        ----------
        confidence : float
            Level of the intervals, in (0, 1).
        candidates : array_like of int, optional
            Domain values to estimate (candidate-restricted estimation for huge domains); by
            default the whole domain (or the aggregator's own candidates).

        Returns
        -------
        FrequencyEstimate
        """
        confidence = _check_confidence(confidence)
        values = self.default_values() if candidates is None else _check_values(candidates, self.params.domain_size)
        return estimate_from_support(self.params, values, self.support(values), self.n, confidence)

    def _check_mergeable(self, other: FrequencyAggregator) -> None:
        if type(other) is not type(self):
            raise TypeError(f"cannot merge a {type(other).__name__} into a {type(self).__name__}")
        if other.params != self.params:
            raise InvalidParameterError(f"cannot merge aggregators of different parameters: {other.params} != {self.params}")


def _check_values(values: ArrayLike, domain_size: int, name: str = "candidates") -> NDArray[np.int64]:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise InvalidParameterError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {arr.dtype}")
    if int(arr.min()) < 0 or int(arr.max()) >= domain_size:
        bad = int(arr.min()) if int(arr.min()) < 0 else int(arr.max())
        raise InvalidParameterError(f"{name} must be in [0, {domain_size}), got {bad}")
    return arr.astype(np.int64)


def _check_payload_types(payloads: Sequence[Any], expected: type, kind: str) -> None:
    if isinstance(payloads, (bytes, str)) or not isinstance(payloads, Sequence):
        raise TypeError(f"payloads must be a sequence of {kind} payloads, got {type(payloads).__name__}")
    found = set(map(type, payloads))
    if found - {expected}:
        wrong = sorted(t.__name__ for t in found - {expected})
        first = next(i for i, p in enumerate(payloads) if type(p) is not expected)
        raise ProtocolError(
            f"{kind} payloads must be {expected.__name__}, got {', '.join(wrong)} (first at position {first})")


def _int_array(name: str, values: ArrayLike) -> NDArray[Any]:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise TypeError(f"{name} must be a one-dimensional array, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {arr.dtype}")
    return arr


def _check_range(name: str, arr: NDArray[Any], high: int) -> None:
    """Raise ``ProtocolError`` unless every element is in [0, high)."""
    if not arr.size:
        return
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= high:
        bad = lo if lo < 0 else hi
        position = int(np.flatnonzero(arr == bad)[0])
        raise ProtocolError(f"{name} must be in [0, {high}), got {bad} (position {position})")


class GRRAggregator(FrequencyAggregator):
    """Counts of the reported indices of k-ary randomized response.

    Parameters
    ----------
    params : GRRParams
        The oracle's parameters.

    Notes
    -----
    Domains up to ``MAX_DENSE_DOMAIN`` values keep one dense ``int64`` count per value
    (``np.bincount``); larger ones keep only the reported values and their counts (sorted).
    ``add`` costs O(batch), ``estimate`` O(domain) or O(candidates x log reported).
    """

    def __init__(self, params: GRRParams) -> None:
        if not isinstance(params, GRRParams):
            raise TypeError(f"params must be GRRParams, got {type(params).__name__}")
        self._params = params
        self._n = 0
        self._dense: NDArray[np.int64] | None = (
            np.zeros(params.domain_size, dtype=np.int64) if params.domain_size <= MAX_DENSE_DOMAIN else None)
        self._sparse_values = np.zeros(0, dtype=np.int64)
        self._sparse_counts = np.zeros(0, dtype=np.int64)

    @classmethod
    def from_counts(cls, params: GRRParams, counts: ArrayLike, n: int) -> GRRAggregator:
        """An aggregator holding ``counts`` (one per domain value) of ``n`` reports."""
        agg = cls(params)
        c = np.asarray(counts)
        if c.shape != (params.domain_size,) or (c.size and c.dtype.kind not in "iu"):
            raise InvalidParameterError(f"counts must be {params.domain_size} integers, got shape {c.shape}")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise InvalidParameterError(f"n must be an int >= 0, got {n!r}")
        if int(c.min()) < 0 or int(c.sum()) != n:
            raise InvalidParameterError(f"counts must be non-negative and sum to n = {n}, got sum {int(c.sum())}")
        agg._n = int(n)
        if agg._dense is not None:
            agg._dense += c.astype(np.int64)
        else:
            nz = np.flatnonzero(c)
            agg._sparse_values, agg._sparse_counts = nz.astype(np.int64), c[nz].astype(np.int64)
        return agg

    @classmethod
    def from_sparse(cls, params: GRRParams, values: ArrayLike, counts: ArrayLike, n: int) -> GRRAggregator:
        """An aggregator holding ``counts`` of the strictly increasing domain ``values`` (``n`` reports)."""
        v = _check_values(values, params.domain_size, "values")
        c = np.asarray(counts)
        if c.shape != v.shape or (c.size and c.dtype.kind not in "iu"):
            raise InvalidParameterError(f"counts must be {v.size} integers, got shape {c.shape}")
        if v.size and np.any(np.diff(v) <= 0):
            raise InvalidParameterError("values must be strictly increasing")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise InvalidParameterError(f"n must be an int >= 0, got {n!r}")
        if (c.size and int(c.min()) < 0) or int(c.sum()) != n:
            raise InvalidParameterError(f"counts must be non-negative and sum to n = {n}, got sum {int(c.sum())}")
        agg = cls(params)
        if agg._dense is not None:
            agg._dense[v] = c
        else:
            keep = c > 0
            agg._sparse_values, agg._sparse_counts = v[keep], c[keep].astype(np.int64)
        agg._n = int(n)
        return agg

    @property
    def params(self) -> GRRParams:
        return self._params

    @property
    def n(self) -> int:
        return self._n

    def counts(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """The reported values with a non-zero count and their counts (ascending values)."""
        if self._dense is not None:
            nz = np.flatnonzero(self._dense).astype(np.int64)
            return nz, self._dense[nz].copy()
        return self._sparse_values.copy(), self._sparse_counts.copy()

    def zero(self) -> GRRAggregator:
        return GRRAggregator(self._params)

    def add(self, payloads: Sequence[Any]) -> None:
        """Add GRR payloads (``int`` indices in [0, domain_size))."""
        _check_payload_types(payloads, int, "grr")
        try:
            indices = np.fromiter(payloads, dtype=np.int64, count=len(payloads))
        except OverflowError as exc:
            raise ProtocolError(f"grr index out of range [0, {self._params.domain_size}): {exc}") from exc
        self.add_indices(indices)

    def add_indices(self, indices: ArrayLike) -> None:
        """Fast path: add reported indices from an integer array."""
        idx = _int_array("indices", indices)
        _check_range("grr index", idx, self._params.domain_size)
        if not idx.size:
            return
        idx = idx.astype(np.int64)
        if self._dense is not None:
            self._dense += np.bincount(idx, minlength=self._params.domain_size)
        else:
            values, counts = np.unique(idx, return_counts=True)
            self._merge_sparse(values, counts.astype(np.int64))
        self._n += int(idx.size)

    def _merge_sparse(self, values: NDArray[np.int64], counts: NDArray[np.int64]) -> None:
        all_values = np.concatenate([self._sparse_values, values])
        all_counts = np.concatenate([self._sparse_counts, counts])
        unique, inverse = np.unique(all_values, return_inverse=True)
        summed = np.zeros(unique.size, dtype=np.int64)
        np.add.at(summed, inverse, all_counts)
        self._sparse_values, self._sparse_counts = unique, summed

    def merge(self, other: GRRAggregator) -> None:
        self._check_mergeable(other)
        if self._dense is not None and other._dense is not None:
            self._dense += other._dense
        else:
            self._merge_sparse(other._sparse_values, other._sparse_counts)
        self._n += other._n

    def support(self, values: NDArray[np.int64]) -> NDArray[np.int64]:
        if self._dense is not None:
            return self._dense[values]
        out = np.zeros(values.shape, dtype=np.int64)
        if self._sparse_values.size:
            pos = np.minimum(np.searchsorted(self._sparse_values, values), self._sparse_values.size - 1)
            found = self._sparse_values[pos] == values
            out[found] = self._sparse_counts[pos[found]]
        return out


class UnaryEncodingAggregator(FrequencyAggregator):
    """Per-bit counts of unary-encoding reports (SUE and OUE).

    Parameters
    ----------
    params : UnaryEncodingParams

    Notes
    -----
    Reports are packed little-endian (bit i is ``(data[i // 8] >> (i % 8)) & 1``); a batch is
    unpacked with ``np.unpackbits(..., bitorder="little")`` in chunks of about 16 Mi bits and
    summed per column. O(batch x domain) bit operations, about 1 ns per bit.
    """

    def __init__(self, params: UnaryEncodingParams) -> None:
        if not isinstance(params, UnaryEncodingParams):
            raise TypeError(f"params must be UnaryEncodingParams, got {type(params).__name__}")
        self._params = params
        self._n = 0
        self._counts = np.zeros(params.domain_size, dtype=np.int64)

    @classmethod
    def from_counts(cls, params: UnaryEncodingParams, counts: ArrayLike, n: int) -> UnaryEncodingAggregator:
        """An aggregator holding per-bit ``counts`` of ``n`` reports."""
        agg = cls(params)
        c = np.asarray(counts)
        if c.shape != (params.domain_size,) or (c.size and c.dtype.kind not in "iu"):
            raise InvalidParameterError(f"counts must be {params.domain_size} integers, got shape {c.shape}")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise InvalidParameterError(f"n must be an int >= 0, got {n!r}")
        if int(c.min()) < 0 or int(c.max()) > n:
            raise InvalidParameterError(f"bit counts must be in [0, n = {n}]")
        agg._counts += c.astype(np.int64)
        agg._n = int(n)
        return agg

    @property
    def params(self) -> UnaryEncodingParams:
        return self._params

    @property
    def n(self) -> int:
        return self._n

    def counts(self) -> NDArray[np.int64]:
        """Number of reports with each bit set (a copy)."""
        return self._counts.copy()

    def zero(self) -> UnaryEncodingAggregator:
        return UnaryEncodingAggregator(self._params)

    def add(self, payloads: Sequence[Any]) -> None:
        """Add unary-encoding payloads (``bytes`` of ``params.payload_bytes`` each)."""
        _check_payload_types(payloads, bytes, "unary_encoding")
        width = self._params.payload_bytes
        lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
        wrong = np.flatnonzero(lengths != width)
        if wrong.size:
            raise ProtocolError(
                f"unary_encoding payloads must be {width} bytes, got {int(lengths[wrong[0]])} "
                f"(position {int(wrong[0])})")
        packed = np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(len(payloads), width)
        self.add_packed(packed)

    def add_packed(self, packed: ArrayLike) -> None:
        """Fast path: add reports from a ``uint8`` array of shape (reports, payload_bytes)."""
        arr = np.asarray(packed)
        width = self._params.payload_bytes
        if arr.dtype != np.uint8:
            raise TypeError(f"packed reports must be a uint8 array, got dtype {arr.dtype}")
        if arr.ndim != 2 or arr.shape[1] != width:
            raise ProtocolError(f"packed reports must have shape (reports, {width}), got {arr.shape}")
        size = self._params.domain_size
        if size % 8 and arr.shape[0]:
            beyond = np.flatnonzero(arr[:, -1] >> (size % 8))
            if beyond.size:
                raise ProtocolError(
                    f"unary_encoding payload has bits set beyond domain_size {size} (position {int(beyond[0])})")
        rows = max(1, _UNPACK_CHUNK_BITS // (8 * width))
        for r0 in range(0, arr.shape[0], rows):
            bits = np.unpackbits(arr[r0:r0 + rows], axis=1, count=size, bitorder="little")
            self._counts += np.add.reduce(bits, axis=0, dtype=np.int64)
        self._n += int(arr.shape[0])

    def merge(self, other: UnaryEncodingAggregator) -> None:
        self._check_mergeable(other)
        self._counts += other._counts
        self._n += other._n

    def support(self, values: NDArray[np.int64]) -> NDArray[np.int64]:
        return self._counts[values]


class LocalHashingAggregator(FrequencyAggregator):
    """Local-hashing reports and their candidate support counts.

    Parameters
    ----------
    params : LocalHashingParams
    candidates : array_like of int, optional
        Values :meth:`estimate` covers by default (default: the whole domain, which must then
        have at most ``MAX_DENSE_DOMAIN`` values).

    Notes
    -----
    Without a seed pool there is no count accumulator: a report supports every value hashing to
    its bucket, so the support of v needs every raw (seed, bucket) report, and ``estimate`` costs
    n x candidates hashes, vectorized in :func:`~ldp_collector.estimation.olh_hash.support_counts`
    (about 0.3-0.5 s for 1e5 reports and 1024 candidates on two cores).

    With a public pool of S seeds (``params.seed_pool_size``; ``docs/protocol.md`` §14) the state
    is the S x g integer counts of every (pool seed, bucket), a mergeable accumulator like GRR's
    counts (:meth:`counts`, :meth:`from_counts`); a seed outside the pool is a protocol error, and
    ``estimate`` costs S x candidates hashes (:func:`~ldp_collector.estimation.olh_hash.pool_support_counts`).
    Rows follow the pool's distinct seeds in increasing order (:meth:`pool_rows`): two pool indices
    that happen to derive the same 32-bit seed share a row.
    """

    def __init__(self, params: LocalHashingParams, candidates: ArrayLike | None = None) -> None:
        if not isinstance(params, LocalHashingParams):
            raise TypeError(f"params must be LocalHashingParams, got {type(params).__name__}")
        self._params = params
        self._candidates = None if candidates is None else _check_values(candidates, params.domain_size)
        self._seeds: list[NDArray[np.uint64]] = []
        self._buckets: list[NDArray[np.uint64]] = []
        self._n = 0
        self._pool: NDArray[np.uint64] | None = None
        self._pool_counts: NDArray[np.int64] | None = None
        if params.seed_pool_size:
            self._pool = _pool_rows(params)
            self._pool_counts = np.zeros((self._pool.size, params.g), dtype=np.int64)

    @property
    def params(self) -> LocalHashingParams:
        return self._params

    @property
    def n(self) -> int:
        return self._n

    @property
    def candidates(self) -> NDArray[np.int64] | None:
        return None if self._candidates is None else self._candidates.copy()

    @property
    def pooled(self) -> bool:
        """Whether the reports come from a public seed pool (then the state is counts)."""
        return self._pool is not None

    def pool_rows(self) -> NDArray[np.uint64]:
        """The distinct seeds of the pool in increasing order, the rows of :meth:`counts`."""
        if self._pool is None:
            raise InvalidParameterError("this local-hashing round has no seed pool")
        return self._pool.copy()

    def counts(self) -> NDArray[np.int64]:
        """The (pool seed, bucket) counts, shape (distinct pool seeds, g) (pooled rounds only)."""
        if self._pool_counts is None:
            raise InvalidParameterError("this local-hashing round has no seed pool: it keeps raw reports")
        return self._pool_counts.copy()

    @classmethod
    def from_counts(cls, params: LocalHashingParams, counts: ArrayLike, n: int) -> LocalHashingAggregator:
        """A pooled aggregator from its counts (:meth:`counts`, flattened or not) and n."""
        agg = cls(params)
        if agg._pool_counts is None:
            raise InvalidParameterError("counts need a local-hashing round with a seed pool")
        arr = _int_array("counts", np.asarray(counts).reshape(-1)).astype(np.int64)
        if arr.size != agg._pool_counts.size:
            raise InvalidParameterError(f"counts must hold {agg._pool_counts.size} values, got {arr.size}")
        if arr.size and int(arr.min()) < 0:
            raise InvalidParameterError(f"counts must be >= 0, got {int(arr.min())}")
        if int(arr.sum()) != n:
            raise InvalidParameterError(f"counts must sum to n = {n}, got {int(arr.sum())}")
        agg._pool_counts = arr.reshape(agg._pool_counts.shape)
        agg._n = int(n)
        return agg

    def reports(self) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
        """All reports as (seeds, buckets) arrays (rounds without a seed pool)."""
        if self._pool is not None:
            raise InvalidParameterError("a pooled local-hashing aggregator keeps counts, not reports")
        if len(self._seeds) != 1:
            seeds = np.concatenate(self._seeds) if self._seeds else np.zeros(0, dtype=np.uint64)
            buckets = np.concatenate(self._buckets) if self._buckets else np.zeros(0, dtype=np.uint64)
            self._seeds, self._buckets = [seeds], [buckets]
        return self._seeds[0], self._buckets[0]

    def zero(self) -> LocalHashingAggregator:
        agg = LocalHashingAggregator.__new__(LocalHashingAggregator)
        agg._params, agg._candidates = self._params, self._candidates
        agg._seeds, agg._buckets, agg._n = [], [], 0
        agg._pool = self._pool  # immutable once built: the O(S) derivation is not repeated
        agg._pool_counts = None if self._pool_counts is None else np.zeros_like(self._pool_counts)
        return agg

    def add(self, payloads: Sequence[Any]) -> None:
        """Add local-hashing payloads (:class:`ldp_client.payload.HashedValue`)."""
        _check_payload_types(payloads, HashedValue, "local_hashing")
        seeds = list(map(itemgetter(0), payloads))
        buckets = list(map(itemgetter(1), payloads))
        for name, column in (("seed", seeds), ("bucket", buckets)):
            if set(map(type, column)) - {int}:
                first = next(i for i, v in enumerate(column) if type(v) is not int)
                raise ProtocolError(
                    f"local_hashing {name} must be an int, got {type(column[first]).__name__} (position {first})")
        try:
            seed_arr = np.array(seeds, dtype=np.int64)
            bucket_arr = np.array(buckets, dtype=np.int64)
        except OverflowError as exc:
            raise ProtocolError(f"local_hashing seed or bucket out of range: {exc}") from exc
        self.add_arrays(seed_arr, bucket_arr)

    def add_arrays(self, seeds: ArrayLike, buckets: ArrayLike) -> None:
        """Fast path: add reports from integer arrays of seeds and buckets (equal lengths).

        With a seed pool every seed must be one of the pool's (else ``ProtocolError``, nothing added).
        """
        s = _int_array("seeds", seeds)
        y = _int_array("buckets", buckets)
        if s.shape != y.shape:
            raise ProtocolError(f"seeds and buckets must have the same length, got {s.size} and {y.size}")
        _check_range("local_hashing seed", s, 2**SEED_BITS)
        _check_range("local_hashing bucket", y, self._params.g)
        if not s.size:
            return
        if self._pool is not None and self._pool_counts is not None:
            su = s.astype(np.uint64)
            rows = np.minimum(np.searchsorted(self._pool, su), self._pool.size - 1)
            outside = np.flatnonzero(self._pool[rows] != su)
            if outside.size:
                raise ProtocolError(f"local_hashing seed {int(su[outside[0]])} is not in the round's seed pool "
                                    f"(position {int(outside[0])})")
            cells = rows.astype(np.int64) * self._params.g + y.astype(np.int64)
            self._pool_counts += np.bincount(cells, minlength=self._pool_counts.size).reshape(
                self._pool_counts.shape)
        else:
            self._seeds.append(s.astype(np.uint64))
            self._buckets.append(y.astype(np.uint64))
        self._n += int(s.size)

    def merge(self, other: LocalHashingAggregator) -> None:
        self._check_mergeable(other)
        if self._pool_counts is not None and other._pool_counts is not None:
            self._pool_counts += other._pool_counts
            self._n += other._n
            return
        seeds, buckets = other.reports()
        if seeds.size:
            self._seeds.append(seeds)
            self._buckets.append(buckets)
            self._n += int(seeds.size)

    def default_values(self) -> NDArray[np.int64]:
        return super().default_values() if self._candidates is None else self._candidates

    def value_pairs(self) -> float:
        """Estimate of sum_x n_x (n_x - 1), the ordered pairs of devices holding one value (pooled rounds).

        From the counts alone: of the T pairs of reports with the same seed and the same bucket,
        a pair holding one value agrees with probability a = p^2 + (g - 1) q_other^2 and any other
        pair with probability 1/g (independent uniform buckets), so with P the pairs sharing a
        seed, (T - P/g) / (a - 1/g) estimates the pairs sharing a seed and a value without bias;
        times 2 S it estimates sum_x n_x (n_x - 1) (each such pair shares a seed with
        probability 1/S). 0 without reports or without a pool.
        """
        if self._pool_counts is None or not self._n:
            return 0.0
        counts = self._pool_counts.astype(np.float64)
        per_seed = counts.sum(axis=1)
        same_bucket = float(np.sum(counts * (counts - 1.0))) / 2.0
        same_seed = float(np.sum(per_seed * (per_seed - 1.0))) / 2.0
        p, q_other, g = self._params.p, float(self._params.q_other_exact), self._params.g
        agree = p * p + (g - 1) * q_other * q_other
        pairs = (same_bucket - same_seed / g) / (agree - 1.0 / g)
        return 2.0 * self._params.seed_pool_size * max(pairs, 0.0)

    def estimate(self, confidence: float = 0.95, *, candidates: ArrayLike | None = None) -> FrequencyEstimate:
        """As :meth:`FrequencyAggregator.estimate`; a pooled round's standard errors include the pool's
        extra term, estimated from the counts (:meth:`value_pairs`)."""
        if self._pool_counts is None:
            return super().estimate(confidence, candidates=candidates)
        confidence = _check_confidence(confidence)
        values = self.default_values() if candidates is None else _check_values(candidates, self.params.domain_size)
        return estimate_from_support(self.params, values, self.support(values), self.n, confidence,
                                     value_pairs=self.value_pairs())

    def support(self, values: NDArray[np.int64]) -> NDArray[np.int64]:
        if self._pool is not None and self._pool_counts is not None:
            return pool_support_counts(self._pool, self._pool_counts, values.astype(np.uint64), self._params.g)
        seeds, buckets = self.reports()
        return support_counts(seeds, buckets, values.astype(np.uint64), self._params.g)


@functools.lru_cache(maxsize=16)
def _pool_rows(params: LocalHashingParams) -> NDArray[np.uint64]:
    """The pool's distinct seeds, sorted (checked against :data:`MAX_POOL_CELLS` first).

    Cached per parameters (read-only): ingestion rebuilds a round's accumulator from its blob for
    every batch, and deriving the pool is O(S) in pure Python.
    """
    if params.seed_pool_size * params.g > MAX_POOL_CELLS:
        raise InvalidParameterError(
            f"seed_pool_size x g must be at most {MAX_POOL_CELLS} (the counts the collector keeps), "
            f"got {params.seed_pool_size} x {params.g}")
    rows = np.unique(np.array(params.pool_seeds, dtype=np.uint64))
    rows.flags.writeable = False
    return rows


def make_aggregator(params: FrequencyOracleParams, candidates: ArrayLike | None = None) -> FrequencyAggregator:
    """The aggregator for an oracle's parameters (``candidates``: local hashing only)."""
    if isinstance(params, GRRParams):
        agg: FrequencyAggregator = GRRAggregator(params)
    elif isinstance(params, UnaryEncodingParams):
        agg = UnaryEncodingAggregator(params)
    elif isinstance(params, LocalHashingParams):
        return LocalHashingAggregator(params, candidates)
    else:
        raise TypeError(f"no frequency aggregator for {type(params).__name__}")
    if candidates is not None:
        raise InvalidParameterError(f"candidates apply to local hashing only, not {params.KIND}")
    return agg
