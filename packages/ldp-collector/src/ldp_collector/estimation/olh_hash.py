"""The local-hashing hash H(seed, v) over numpy arrays, and the server's support counts.

The hash is specified once, in :mod:`ldp_client.mechanisms.local_hashing` (module docstring and
:func:`~ldp_client.mechanisms.local_hashing.hash_value`)::

    fmix64(k):  k ^= k >> 33;  k *= M1;  k ^= k >> 33;  k *= M2;  k ^= k >> 33      (mod 2^64)
    H(seed, v) = fmix64(fmix64(v + OFFSET) XOR seed) mod g

This module computes the same function over ``uint64`` arrays, bit for bit (the tests compare it
with the SDK's pure-Python version), importing the constants from the SDK so the two sides cannot
disagree. numpy's ``uint64`` ``+``, ``*``, ``^`` and ``>>`` wrap modulo 2^64 exactly like the
masked Python integers.

Speed
    The server's cost is one hash per (report, candidate) pair. Three exact rewrites make it cheap:

    * the inner ``fmix64(v + OFFSET)`` depends on the candidate only: computed once per candidate;
    * seeds are below 2^32 < 2^33, so ``(a ^ seed) >> 33 == a >> 33`` and the first xor-shift of the
      outer mix is also folded into the per-candidate word;
    * ``h mod g == y`` is tested as ``(h // g) * g + y == h``: numpy divides ``uint64`` arrays by a
      scalar with a multiply-shift (libdivide), several times faster than ``%``.

    Blocks of about 64 Ki pairs stay in the CPU cache; the report range is split across threads
    (numpy releases the GIL inside ufuncs). About 3-5 ns per pair per core: 1e5 reports x 1024
    candidates take roughly 0.3-0.5 s on two cores.

A public seed pool (fast local hashing, ``docs/protocol.md`` §14)
    When a round's reports take their seeds from a pool of S seeds, the reports are first counted
    per (seed, bucket) (S x g integers, :class:`~ldp_collector.estimation.frequency.LocalHashingAggregator`
    keeps them), and :func:`pool_support_counts` needs one hash per (pool seed, candidate) pair:
    support(v) = sum_s count[s][H(seed_s, v)], O(S x D) instead of O(n x D), with the same blocks.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.mechanisms.local_hashing import HASH_OFFSET, MIX_MULTIPLIER_1, MIX_MULTIPLIER_2, SEED_BITS

__all__ = ["fmix64", "hash_values", "pool_support_counts", "support_counts"]

_SHIFT = np.uint64(33)
_M1 = np.uint64(MIX_MULTIPLIER_1)
_M2 = np.uint64(MIX_MULTIPLIER_2)
_OFFSET = np.uint64(HASH_OFFSET)
_MAX_G = 2**32 - 1
#: Pairs (reports x candidates) per block: 64 Ki uint64 words (512 KiB) fit in L2 with a temporary.
_BLOCK_PAIRS = 1 << 16
#: Below this many pairs a single thread is faster than starting a pool.
_MIN_PARALLEL_PAIRS = 1 << 20


def _as_uint64(name: str, values: ArrayLike) -> NDArray[np.uint64]:
    """``values`` as a ``uint64`` array; integer input only (floats would be truncated silently)."""
    arr = np.asarray(values)
    if arr.dtype == np.uint64:
        return arr
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an array of integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "i" and arr.size and int(arr.min()) < 0:
        raise ValueError(f"{name} must be >= 0, got {int(arr.min())}")
    return arr.astype(np.uint64)


def _check_g(g: int) -> np.uint64:
    if isinstance(g, bool) or not isinstance(g, (int, np.integer)):
        raise TypeError(f"g must be an int, got {type(g).__name__}")
    if not 1 <= int(g) <= _MAX_G:
        raise ValueError(f"g must be in [1, {_MAX_G}], got {int(g)}")
    return np.uint64(int(g))


def _fmix64_inplace(k: NDArray[np.uint64], tmp: NDArray[np.uint64]) -> None:
    np.right_shift(k, _SHIFT, out=tmp)
    k ^= tmp
    k *= _M1
    np.right_shift(k, _SHIFT, out=tmp)
    k ^= tmp
    k *= _M2
    np.right_shift(k, _SHIFT, out=tmp)
    k ^= tmp


def fmix64(k: ArrayLike) -> NDArray[np.uint64]:
    """MurmurHash3's 64-bit finalizer, element-wise (a new array; ``k`` is not modified).

    Parameters
    ----------
    k : array_like of non-negative integers
        Words in [0, 2^64).

    Returns
    -------
    numpy.ndarray of uint64
        Same shape as ``k``; equal to ``ldp_client.mechanisms.local_hashing.fmix64`` element-wise.
    """
    arr = _as_uint64("k", k)
    out = np.array(arr, dtype=np.uint64, ndmin=1, copy=True)
    _fmix64_inplace(out, np.empty_like(out))
    return out.reshape(arr.shape)


def _candidate_words(candidates: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """Per-candidate part of the hash: w = m ^ (m >> 33) with m = fmix64(v + OFFSET).

    For a seed s < 2^33, ``fmix64(m ^ s)`` starts with ``(m ^ s) ^ ((m ^ s) >> 33)``, which equals
    ``w ^ s`` because the seed has no bits at or above position 33.
    """
    m = np.add(candidates, _OFFSET, dtype=np.uint64)  # wraps mod 2^64, like the spec
    _fmix64_inplace(m, np.empty_like(m))
    return np.bitwise_xor(m, np.right_shift(m, _SHIFT), dtype=np.uint64)


def hash_values(seeds: ArrayLike, values: ArrayLike, g: int) -> NDArray[np.uint64]:
    """H(seed, value) in [0, g), element-wise with broadcasting; bit-identical to the SDK.

    Parameters
    ----------
    seeds : array_like of int
        Seeds in [0, 2^64) (the SDK draws them in [0, 2^32)).
    values : array_like of int
        Values in [0, 2^64).
    g : int
        Number of buckets, in [1, 2^32).

    Returns
    -------
    numpy.ndarray of uint64
        The broadcast shape of ``seeds`` and ``values``.
    """
    g64 = _check_g(g)
    s = _as_uint64("seeds", seeds)
    v = _as_uint64("values", values)
    inner = np.add(np.array(v, ndmin=1), _OFFSET, dtype=np.uint64)
    _fmix64_inplace(inner, np.empty_like(inner))
    k = np.bitwise_xor(inner.reshape(v.shape), s, dtype=np.uint64)
    k = np.array(k, dtype=np.uint64, ndmin=1)
    _fmix64_inplace(k, np.empty_like(k))
    return np.remainder(k, g64).reshape(np.broadcast_shapes(s.shape, v.shape))


def _block_shape(n: int, m: int) -> tuple[int, int]:
    """(rows, cols) of a block of about ``_BLOCK_PAIRS`` (seed, candidate) pairs."""
    cols = min(m, _BLOCK_PAIRS)
    return max(1, _BLOCK_PAIRS // cols), cols


def _mix_block(seeds: NDArray[np.uint64], words: NDArray[np.uint64], g: np.uint64,
               kk: NDArray[np.uint64], tt: NDArray[np.uint64]) -> None:
    """``kk`` = the full 64-bit hash of every (seed, candidate word) pair, ``tt`` = its ``// g * g``.

    So that ``kk - tt`` is H(seed, v) = hash mod g and ``tt + y == kk`` tests H(seed, v) == y.
    """
    np.bitwise_xor(seeds[:, None], words[None, :], out=kk)
    kk *= _M1
    np.right_shift(kk, _SHIFT, out=tt)
    kk ^= tt
    kk *= _M2
    np.right_shift(kk, _SHIFT, out=tt)
    kk ^= tt
    # h mod g == y  <=>  (h // g) * g + y == h   (exact; y < g): libdivide's multiply-shift
    np.floor_divide(kk, g, out=tt)
    tt *= g


def _support_range(seeds: NDArray[np.uint64], buckets: NDArray[np.uint64], words: NDArray[np.uint64],
                   g: np.uint64, out: NDArray[np.int64]) -> None:
    """Add to ``out`` the support counts of reports ``seeds``/``buckets`` for candidate ``words``."""
    n, m = seeds.shape[0], words.shape[0]
    rows, cols = _block_shape(n, m)
    k = np.empty((rows, cols), dtype=np.uint64)
    tmp = np.empty((rows, cols), dtype=np.uint64)
    eq = np.empty((rows, cols), dtype=np.bool_)
    for c0 in range(0, m, cols):
        c1 = min(m, c0 + cols)
        w = words[c0:c1]
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            kk, tt, ee = k[: r1 - r0, : c1 - c0], tmp[: r1 - r0, : c1 - c0], eq[: r1 - r0, : c1 - c0]
            _mix_block(seeds[r0:r1], w, g, kk, tt)
            tt += buckets[r0:r1, None]
            np.equal(tt, kk, out=ee)
            out[c0:c1] += np.add.reduce(ee.view(np.uint8), axis=0, dtype=np.int32)


def pool_support_counts(pool_seeds: ArrayLike, counts: ArrayLike, candidates: ArrayLike,
                        g: int) -> NDArray[np.int64]:
    """For each candidate v, sum_s counts[s, H(pool_seeds[s], v)]: the support from per-seed counts.

    Parameters
    ----------
    pool_seeds : array_like of int, shape (S,)
        The pool's seeds, in [0, 2^32).
    counts : array_like of int, shape (S, g)
        ``counts[s, y]``: reports with seed ``pool_seeds[s]`` and bucket y.
    candidates : array_like of int, shape (m,)
        Values to count, in [0, 2^64).
    g : int
        Number of buckets, in [1, 2^32).

    Returns
    -------
    numpy.ndarray of int64, shape (m,)
        Equal to :func:`support_counts` over the reports ``counts`` describes.

    Notes
    -----
    Cost: S x m hash evaluations and gathers, whatever the number of reports.
    """
    g64 = _check_g(g)
    s = _as_uint64("pool_seeds", pool_seeds).ravel()
    c = _as_uint64("candidates", candidates).ravel()
    table = np.asarray(counts)
    if table.dtype.kind not in "iu":
        raise TypeError(f"counts must be an array of integers, got dtype {table.dtype}")
    if table.shape != (s.size, int(g64)):
        raise ValueError(f"counts must have shape ({s.size}, {int(g64)}), got {table.shape}")
    if s.size and int(s.max()) >= 2**SEED_BITS:
        raise ValueError(f"pool_seeds must be in [0, 2^{SEED_BITS}), got {int(s.max())}")
    out = np.zeros(c.shape[0], dtype=np.int64)
    if not s.size or not c.size:
        return out
    flat = np.ascontiguousarray(table, dtype=np.int64).ravel()
    words = _candidate_words(c)
    rows, cols = _block_shape(s.size, c.size)
    k = np.empty((rows, cols), dtype=np.uint64)
    tmp = np.empty((rows, cols), dtype=np.uint64)
    # Row offsets s * g of the flattened table, as uint64 so the index stays in one dtype.
    offsets = np.arange(s.size, dtype=np.uint64) * g64
    for c0 in range(0, c.size, cols):
        c1 = min(c.size, c0 + cols)
        for r0 in range(0, s.size, rows):
            r1 = min(s.size, r0 + rows)
            kk, tt = k[: r1 - r0, : c1 - c0], tmp[: r1 - r0, : c1 - c0]
            _mix_block(s[r0:r1], words[c0:c1], g64, kk, tt)
            kk -= tt                                  # H(seed, v) in [0, g)
            kk += offsets[r0:r1, None]                # its cell of the flattened table
            out[c0:c1] += np.take(flat, kk.view(np.int64)).sum(axis=0)
    return out


def support_counts(seeds: ArrayLike, buckets: ArrayLike, candidates: ArrayLike, g: int, *,
                   workers: int | None = None) -> NDArray[np.int64]:
    """For each candidate v, the number of reports (s, y) with H(s, v) == y.

    Parameters
    ----------
    seeds : array_like of int, shape (n,)
        Report seeds, in [0, 2^32).
    buckets : array_like of int, shape (n,)
        Reported buckets, in [0, g).
    candidates : array_like of int, shape (m,)
        Values to count, in [0, 2^64).
    g : int
        Number of buckets, in [1, 2^32).
    workers : int, optional
        Threads to split the reports over (default: the CPUs available, at most 8).

    Returns
    -------
    numpy.ndarray of int64, shape (m,)

    Notes
    -----
    Cost: n x m hash evaluations, vectorized in cache-sized blocks (see the module docstring).
    """
    g64 = _check_g(g)
    s = _as_uint64("seeds", seeds).ravel()
    y = _as_uint64("buckets", buckets).ravel()
    c = _as_uint64("candidates", candidates).ravel()
    if s.shape != y.shape:
        raise ValueError(f"seeds and buckets must have the same length, got {s.shape[0]} and {y.shape[0]}")
    if s.size and int(s.max()) >= 2**SEED_BITS:
        raise ValueError(f"seeds must be in [0, 2^{SEED_BITS}), got {int(s.max())}")
    if y.size and int(y.max()) >= int(g64):
        raise ValueError(f"buckets must be in [0, {int(g64)}), got {int(y.max())}")
    out = np.zeros(c.shape[0], dtype=np.int64)
    if not s.size or not c.size:
        return out
    words = _candidate_words(c)
    if workers is None:
        workers = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    workers = min(workers, max(1, s.size * c.size // _MIN_PARALLEL_PAIRS), s.size)
    if workers == 1:
        _support_range(s, y, words, g64, out)
        return out
    bounds = np.linspace(0, s.size, workers + 1).astype(np.int64)
    partials = [np.zeros_like(out) for _ in range(workers)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_support_range, s[a:b], y[a:b], words, g64, part)
                   for a, b, part in zip(bounds[:-1], bounds[1:], partials)]
        for f in futures:
            f.result()
    for part in partials:
        out += part
    return out
