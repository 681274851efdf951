"""The noise floor of a center result: what the privacy noise alone costs the published centers.

Every center kind estimates each center ``c`` from reports whose randomization has a known
variance, so each published center carries a per-coordinate noise variance ``s_cj^2`` (in the
data's units) that the server can compute without seeing a raw point: the mechanism's variance,
the number of reports pooled and the debiasing the kind applies. This module turns those
variances into the two figures every center result reports beside its centers
(:func:`floor_diagnostics`), so that a user can tell "the clusters were found and the centers sit
where the noise puts them" from "the algorithm went wrong":

``floor_center_error``
    The expected distance between a published center and the mean it estimates, averaged over the
    centers: ``mean_c E||delta_c||`` with ``delta_c ~ N(0, diag(s_c^2))``. For equal variances
    ``s^2`` in ``d`` coordinates this is the chi mean ``s sqrt(2) Gamma((d + 1) / 2) / Gamma(d / 2)``;
    for unequal ones :func:`expected_norm` uses the same factor on ``sqrt(sum_j s_cj^2)`` (within a
    few percent for the ratios of coordinate spreads a box domain gives). It is comparable
    directly with the harness's ``center_error`` (mean distance between matched true and published
    centers).
``floor_excess_cost``
    The k-means cost per point the noise adds: a center off by ``delta_c`` adds ``||delta_c||^2``
    to the cost of each of its points, so the expected excess per point is
    ``sum_c w_c sum_j s_cj^2 / sum_c w_c`` (``w_c`` = the devices the center stands for).
    The predicted cost ratio against non-private k-means is ``1 + floor_excess_cost / OPT`` with
    ``OPT`` the optimal cost per point, which only the evaluation knows (:func:`floor_cost_ratio`).

A kind that clips its centers into the domain box passes them with the box: each variance is then
the clipped estimate's mean squared error (:func:`clipped_mse`), which is what the noise costs a
center that cannot leave the box.

What the floor leaves out, by design: errors of the algorithm itself (a cluster that was not found,
two clusters merged, points assigned to the wrong center, the bias of hard assignment on noisy
reports). A measured figure far above its floor therefore points at the algorithm, not at the
privacy budget; a figure at its floor can only be improved by more reports, more epsilon for the
vector step, or a lower-variance randomizer.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.errors import InvalidParameterError

__all__ = [
    "FLOOR_CENTER_ERROR",
    "FLOOR_EXCESS_COST",
    "GUESS_ERROR",
    "clipped_mse",
    "drowned_centers_warning",
    "expected_norm",
    "floor_cost_ratio",
    "floor_diagnostics",
    "unit_to_data_variance",
]

#: Diagnostic keys of every center result (module docstring).
FLOOR_CENTER_ERROR = "floor_center_error"
FLOOR_EXCESS_COST = "floor_excess_cost"


def expected_norm(variances: ArrayLike) -> NDArray[np.float64]:
    """``E||delta||`` per row for ``delta ~ N(0, diag(row))``: the chi mean on ``sqrt(sum row)``.

    Exact when a row's variances are equal; otherwise the chi-mean factor of ``d`` degrees of
    freedom applied to the root of the total variance (module docstring).
    """
    v = np.atleast_2d(np.asarray(variances, dtype=np.float64))
    d = v.shape[1]
    factor = math.sqrt(2.0 / d) * math.exp(math.lgamma((d + 1) / 2.0) - math.lgamma(d / 2.0))
    out: NDArray[np.float64] = factor * np.sqrt(np.clip(v, 0.0, None).sum(axis=1))
    return out


def unit_to_data_variance(variances: ArrayLike, lower: ArrayLike, upper: ArrayLike, *,
                          unit_width: float) -> NDArray[np.float64]:
    """Per-coordinate variances on a normalized box (side ``unit_width``: 2 for ``[-1, 1]``, 1 for
    ``[0, 1]``) scaled to the domain ``[lower, upper]``: times ``((upper - lower) / unit_width)^2``.

    ``variances`` is ``(c,)`` (the same variance in every normalized coordinate) or ``(c, d)``.
    """
    lo = np.asarray(lower, dtype=np.float64).reshape(-1)
    hi = np.asarray(upper, dtype=np.float64).reshape(-1)
    v = np.asarray(variances, dtype=np.float64)
    if v.ndim == 1:
        v = v[:, None]
    scale = ((hi - lo) / unit_width) ** 2
    out: NDArray[np.float64] = v * scale[None, :]
    return out


def clipped_mse(centers: ArrayLike, variances: ArrayLike, lower: ArrayLike, upper: ArrayLike) -> NDArray[np.float64]:
    """``E[(clip(mu + s Z, a, b) - mu)^2]`` per coordinate, ``Z ~ N(0, 1)``, ``mu`` = the published center.

    The kinds clip their centers into the domain box, which caps the error of a noisy center near a
    face (and of every center when the noise is as wide as the box). With ``a' = (a - mu) / s`` and
    ``b' = (b - mu) / s``: ``s^2 (Phi(b') - Phi(a') - b' phi(b') + a' phi(a')) + (a - mu)^2 Phi(a')
    + (b - mu)^2 (1 - Phi(b'))``. ``mu`` stands in for the unknown true mean (the figure is a plug-in).
    """
    mu = np.atleast_2d(np.asarray(centers, dtype=np.float64))
    v = np.broadcast_to(np.asarray(variances, dtype=np.float64), mu.shape)
    a = np.broadcast_to(np.asarray(lower, dtype=np.float64), mu.shape)
    b = np.broadcast_to(np.asarray(upper, dtype=np.float64), mu.shape)
    out = np.array(v, dtype=np.float64, copy=True)
    live = np.isfinite(v) & (v > 0)
    if not live.any():
        return out
    s = np.sqrt(v[live])
    lo, hi, m = a[live], b[live], np.clip(mu[live], a[live], b[live])
    al, be = (lo - m) / s, (hi - m) / s
    cdf = np.frompyfunc(lambda t: 0.5 * math.erfc(-t / math.sqrt(2.0)), 1, 1)
    pdf_a = np.exp(-0.5 * al**2) / math.sqrt(2.0 * math.pi)
    pdf_b = np.exp(-0.5 * be**2) / math.sqrt(2.0 * math.pi)
    ca, cb = cdf(al).astype(np.float64), cdf(be).astype(np.float64)
    out[live] = s**2 * (cb - ca - be * pdf_b + al * pdf_a) + (lo - m) ** 2 * ca + (hi - m) ** 2 * (1.0 - cb)
    return out


def floor_diagnostics(variances: ArrayLike, weights: ArrayLike, *, centers: ArrayLike | None = None,
                      lower: ArrayLike | None = None, upper: ArrayLike | None = None) -> dict[str, float]:
    """The two floor figures of a center result (module docstring).

    Parameters
    ----------
    variances : array_like, shape (c, d)
        Each published center's per-coordinate noise variance, in the data's units (``inf`` for a
        center with no significant support: it is left out of both figures).
    weights : array_like, shape (c,)
        The devices (or shares) each center stands for; only their ratios matter.
    centers, lower, upper : array_like, optional
        The published centers (c, d) and the box the kind clips them into (data units): the
        variances become the clipped estimate's mean squared error (:func:`clipped_mse`).

    Returns
    -------
    dict
        ``{FLOOR_CENTER_ERROR: ..., FLOOR_EXCESS_COST: ...}``; empty when no center has a finite
        variance and a positive weight.
    """
    v = np.atleast_2d(np.asarray(variances, dtype=np.float64))
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if v.shape[0] != w.size:
        raise InvalidParameterError(f"need one weight per center, got {v.shape[0]} centers and {w.size} weights")
    if np.any(v < 0) or np.any(np.isnan(v)):
        raise InvalidParameterError("center variances must be >= 0")
    if centers is not None:
        if lower is None or upper is None:
            raise InvalidParameterError("clipped centers need the box's lower and upper corners")
        v = clipped_mse(centers, v, lower, upper)
    ok = np.isfinite(v).all(axis=1) & (w > 0)
    if not ok.any():
        return {}
    v, w = v[ok], w[ok]
    return {
        FLOOR_CENTER_ERROR: float(expected_norm(v).mean()),
        FLOOR_EXCESS_COST: float((w * v.sum(axis=1)).sum() / w.sum()),
    }


#: Per-coordinate error, in box widths, of guessing the box's middle for a point uniform in it: 1 / sqrt(12).
GUESS_ERROR = 1.0 / math.sqrt(12.0)


def drowned_centers_warning(variances: ArrayLike, lower: ArrayLike, upper: ArrayLike) -> str | None:
    """The "noise dominates" warning when even the best-determined center carries no information.

    ``variances`` (c, d) are the centers' per-coordinate noise variances in the data's units. A
    center's standard error in box widths is ``sqrt(mean_j s_cj^2 / (upper_j - lower_j)^2)``; when
    the smallest over the centers reaches :data:`GUESS_ERROR`, no center says more about where its
    cluster lies than a guess of the box's middle, and the result is noise. ``None`` otherwise.
    """
    v = np.atleast_2d(np.asarray(variances, dtype=np.float64))
    width = np.asarray(upper, dtype=np.float64) - np.asarray(lower, dtype=np.float64)
    if v.size == 0:
        return None
    best = float(np.sqrt((v / width**2).mean(axis=1)).min())
    if not best >= GUESS_ERROR:
        return None
    return (f"noise dominates: the best-determined center has a standard error of {best:.3g} box widths per "
            f"coordinate, more than the {GUESS_ERROR:.3f} of guessing the box's middle; collect more reports or "
            "raise epsilon")


def floor_cost_ratio(excess_cost: float, optimal_cost_per_point: float) -> float:
    """The cost ratio the floor predicts: ``1 + excess / OPT`` (``inf`` when ``OPT`` is 0 and the excess is not)."""
    if excess_cost < 0 or optimal_cost_per_point < 0:
        raise InvalidParameterError("costs must be >= 0")
    if optimal_cost_per_point == 0:
        return 1.0 if excess_cost == 0 else math.inf
    return 1.0 + excess_cost / optimal_cost_per_point
