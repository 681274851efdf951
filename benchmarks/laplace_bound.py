"""How close any estimator can come to the laplace kind's noise floor: Cramér-Rao and van Trees bounds.

The laplace kind's result reports a floor (``ldp_collector.estimation.center_floor``): each center's
noise as if the server averaged exactly its cluster's noisy points, ``Var / c`` per coordinate
(``Var`` the decoded coordinate's noise variance, ``c`` the cluster's reports). The server does not
know which noisy point belongs to which cluster, and at the kind's noise (Laplace scale ``b = d /
epsilon`` unit-cube widths per coordinate: 2.5 at d = 5, epsilon = 2, where the clusters' means lie
a few tenths apart) that uncertainty, not the averaging, is most of the error. This script measures
how much, for the Gaussian mixtures of ``center_acceptance.py --experiment floor``.

Model
    A device's decoded report is ``z = u + e``: ``u`` its point in the campaign's unit cube (the
    data's box, as ``simulate`` sets it), ``e`` independent Laplace noise of scale ``b =
    sqrt(Var / 2)`` per coordinate (the discrete Laplace on the 2^10 grid, within a grid step of
    it). The mixtures' clusters are spherical Gaussians, so given its cluster ``k`` a report's
    coordinates are independent with density ``g(z_j) = N(mu_kj, s_kj^2) * Laplace(b)`` (a
    convolution, closed form: :func:`convolved_logpdf`), and ``p(z) = sum_k pi_k prod_j g``.
    The weights ``pi`` and spreads ``s`` are taken as known (the bounds only fall by it), the
    means ``mu`` (k d numbers) are estimated.

Bounds on the means' mean squared error, per report ``I = E[score score^T]`` (the means' Fisher
information, by Monte Carlo over ``--samples`` reports drawn from the model: :func:`mean_information`)
    ``crb``        ``(n I)^-1``: any *unbiased* estimator (Cramér-Rao).
    ``van_trees``  ``(n I + J)^-1`` with ``J`` the information of a prior that spreads every mean over
                   the range the generator draws centers from (``[-10, 10]`` in the data's units, a
                   ``cos^2`` density: ``J = 4 pi^2 / L^2`` per coordinate, ``L`` the range's width in
                   unit-cube units). The van Trees inequality bounds the prior-averaged error of *every*
                   estimator, biased ones (shrinkage, clipping into the cube) included, by ``(n E[I] +
                   J)^-1``; ``I`` here is the seed's own configuration's, so the figure is that bound
                   for a prior whose configurations are as informative as the seed's, not a proof
                   about one seed. ``--prior-draws`` gives the proper one: ``E[I]`` averaged over
                   configurations drawn like the generator's, with the ``cos^2`` centers.

Figures (data units: unit-cube variances times the box width squared per coordinate)
    ``excess_over_floor``  the bound's expected excess k-means cost per point, ``sum_k pi_k sum_j
                          v_kj``, over the floor's (``v_kj = Var / (pi_k n)``).
    ``cost_over_floor``   the cost ratio the bound implies over the floor's, ``(1 + B F / OPT) / (1 +
                          F / OPT)`` with ``B`` the line above, ``F`` the floor's excess and ``OPT`` the
                          clusters' within variance per point (non-private k-means' cost, near enough on
                          these separated mixtures): directly comparable with the harness's ``cost /
                          floor``. The floor here is unclipped; the kind's clips its centers into the
                          cube, which only lowers its floor.
    ``error_over_floor``  the mean over centers of the bound's root mean squared center error over the
                          floor's (compare ``centre error / floor``).
    Known-label information gives ``I = pi_k / b^2`` per coordinate as the spreads vanish: half the
    floor's ``Var / c`` (the sample mean is not efficient under Laplace noise; the median is). The
    tests pin that limit.

Usage::

    python benchmarks/laplace_bound.py --n 100000 --epsilon 2 --seeds 10 [--prior-draws 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from harness.suites import REPORTING_SEEDS
from numpy.typing import NDArray
from scipy.special import log_ndtr  # type: ignore[import-untyped, unused-ignore]

from ldp_client.mechanisms.discrete_laplace import DiscreteLaplaceParams
from ldp_collector.kinds.laplace import DEFAULT_GRID_BITS
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.population import numeric_bounds

#: The mixtures of ``center_acceptance.py --experiment floor``: (d, k).
MIXTURES = ((5, 6), (10, 8))
#: The generator's range of cluster centers in the data's units (``simulation.datasets.mixture``).
CENTER_RANGE = (-10.0, 10.0)
#: Monte Carlo reports per information matrix.
DEFAULT_SAMPLES = 200_000


def convolved_logpdf(z: NDArray[np.float64], mu: NDArray[np.float64], s: NDArray[np.float64],
                     b: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``log g(z)`` and ``d log g / d mu`` for ``g = N(mu, s^2) * Laplace(0, b)``, elementwise.

    ``g(z) = (1 / 2b) exp(s^2 / 2b^2) [e^(-t/b) Phi(t/s - s/b) + e^(t/b) Phi(-t/s - s/b)]`` with
    ``t = z - mu``; the derivative of each bracketed term's ``Phi`` parts cancels, leaving
    ``d log g / d mu = (A_1 - A_2) / (b (A_1 + A_2))`` with ``A_1, A_2`` the two terms. ``s > 0``.
    """
    t = np.asarray(z, dtype=np.float64) - mu
    s = np.broadcast_to(np.asarray(s, dtype=np.float64), t.shape)
    half = s * s / (2.0 * b * b)
    a1 = half - t / b + log_ndtr(t / s - s / b)
    a2 = half + t / b + log_ndtr(-t / s - s / b)
    top = np.maximum(a1, a2)
    e1, e2 = np.exp(a1 - top), np.exp(a2 - top)
    log_g = top + np.log(e1 + e2) - math.log(2.0 * b)
    return log_g, (e1 - e2) / (b * (e1 + e2))


def mean_information(mu: NDArray[np.float64], s: NDArray[np.float64], pi: NDArray[np.float64], b: float,
                     samples: int, rng: np.random.Generator, *, batch: int = 50_000) -> NDArray[np.float64]:
    """The Fisher information of one report about the ``k d`` means (row-major ``(k, d)``), by Monte Carlo.

    ``mu``, ``s``: ``(k, d)`` means and spreads in unit-cube units; ``pi``: ``(k,)`` weights; ``b``: the
    Laplace scale. The score of ``mu_kj`` is ``r_k(z) d log g_kj(z_j) / d mu_kj``, ``r_k`` the cluster's
    posterior probability; the information is the mean of the scores' outer products.
    """
    k, d = mu.shape
    info = np.zeros((k * d, k * d))
    done = 0
    while done < samples:
        m = min(batch, samples - done)
        labels = rng.choice(k, size=m, p=pi)
        z = mu[labels] + rng.standard_normal((m, d)) * s[labels] + rng.laplace(0.0, b, size=(m, d))
        log_joint = np.empty((m, k))
        scores = np.empty((m, k, d))
        for c in range(k):
            log_g, score = convolved_logpdf(z, mu[c], s[c], b)
            log_joint[:, c] = log_g.sum(axis=1) + math.log(pi[c])
            scores[:, c, :] = score
        post = np.exp(log_joint - log_joint.max(axis=1, keepdims=True))
        post /= post.sum(axis=1, keepdims=True)
        full = (post[:, :, None] * scores).reshape(m, k * d)
        info += full.T @ full
        done += m
    out: NDArray[np.float64] = info / samples
    return out


def bound_figures(info: NDArray[np.float64], prior: NDArray[np.float64] | None, pi: NDArray[np.float64],
                  s: NDArray[np.float64], width: NDArray[np.float64], n: int, noise_variance: float) -> dict[str, float]:
    """The figures of the module docstring for one information matrix (``prior``: ``J`` per mean, or None: CRB)."""
    k, d = s.shape
    total = n * info + (np.diag(prior) if prior is not None else 0.0)
    v = np.diag(np.linalg.inv(total)).reshape(k, d) * width**2  # data units
    floor = noise_variance / (pi[:, None] * n) * np.ones((k, d)) * width**2
    excess, floor_excess = float((pi * v.sum(axis=1)).sum()), float((pi * floor.sum(axis=1)).sum())
    within = float((pi * (s**2 * width**2).sum(axis=1)).sum())
    ratio = excess / floor_excess
    return {"excess_over_floor": ratio,
            "cost_over_floor": (1.0 + ratio * floor_excess / within) / (1.0 + floor_excess / within),
            "error_over_floor": float(np.sqrt(v.sum(axis=1)).mean() / np.sqrt(floor.sum(axis=1)).mean()),
            "floor_cost_ratio": 1.0 + floor_excess / within}


def _prior_information(lower: NDArray[np.float64], upper: NDArray[np.float64], k: int) -> NDArray[np.float64]:
    """``J`` of the ``cos^2`` prior over :data:`CENTER_RANGE` per mean, in unit-cube units, row-major ``(k, d)``."""
    length = (CENTER_RANGE[1] - CENTER_RANGE[0]) / (upper - lower)
    return np.tile(4.0 * math.pi**2 / length**2, k)


def seed_rows(d: int, k: int, n: int, epsilon: float, seed: int, samples: int) -> Iterator[dict[str, Any]]:
    """The CRB and the local van Trees bound for one reporting seed's mixture (its true weights, spreads, box)."""
    x, y = make_dataset("mixture", n, d=d, k=k, seed=seed)
    assert y is not None
    lower, upper = (np.asarray(v, dtype=np.float64) for v in numeric_bounds(x))
    width = upper - lower
    u = (x - lower) / width
    pi = np.bincount(y, minlength=k) / y.size
    mu = np.array([u[y == c].mean(axis=0) for c in range(k)])
    s = np.array([u[y == c].std(axis=0) for c in range(k)])
    noise_variance = DiscreteLaplaceParams(dimension=d, epsilon=epsilon, grid_bits=DEFAULT_GRID_BITS).noise_variance
    b = math.sqrt(noise_variance / 2.0)
    info = mean_information(mu, s, pi, b, samples, np.random.default_rng(seed))
    base = {"data": f"mixture d={d} k={k}", "n": n, "epsilon": epsilon, "seed": seed, "laplace_scale": b}
    yield {**base, "bound": "crb", **bound_figures(info, None, pi, s, width, n, noise_variance)}
    yield {**base, "bound": "van_trees_local",
           **bound_figures(info, _prior_information(lower, upper, k), pi, s, width, n, noise_variance)}


def _cos2(rng: np.random.Generator, size: tuple[int, ...]) -> NDArray[np.float64]:
    """Draws of the density ``2 cos^2(pi (t - 1/2))`` on [0, 1] (rejection from the uniform)."""
    out = np.empty(int(np.prod(size)))
    filled = 0
    while filled < out.size:
        t = rng.uniform(size=2 * (out.size - filled) + 8)
        keep = t[rng.uniform(size=t.size) < np.cos(math.pi * (t - 0.5)) ** 2]
        take = min(keep.size, out.size - filled)
        out[filled:filled + take] = keep[:take]
        filled += take
    return out.reshape(size)


def prior_rows(d: int, k: int, n: int, epsilon: float, draws: int, samples: int) -> Iterator[dict[str, Any]]:
    """The van Trees bound averaged over ``draws`` configurations drawn like the generator's (``cos^2`` centers).

    Every configuration's box is that of its own ``n`` points, as a campaign's; the bound's figures use
    the information and the floor averaged over the draws.
    """
    rng = np.random.default_rng(20261130)
    noise_variance = DiscreteLaplaceParams(dimension=d, epsilon=epsilon, grid_bits=DEFAULT_GRID_BITS).noise_variance
    b = math.sqrt(noise_variance / 2.0)
    infos, priors, pis, spreads, widths = [], [], [], [], []
    for _ in range(draws):
        centers = CENTER_RANGE[0] + (CENTER_RANGE[1] - CENTER_RANGE[0]) * _cos2(rng, (k, d))
        pi = rng.dirichlet(np.full(k, 4.0))
        stds = rng.uniform(0.5, 1.5, size=k)
        labels = rng.choice(k, size=n, p=pi)
        x = centers[labels] + rng.standard_normal((n, d)) * stds[labels, None]
        lower, upper = x.min(axis=0), x.max(axis=0)
        width = upper - lower
        s = stds[:, None] / width[None, :]
        infos.append(mean_information((centers - lower) / width, s, pi, b, samples, rng))
        priors.append(_prior_information(lower, upper, k))
        pis.append(pi)
        spreads.append(s)
        widths.append(width)
    # Equal weights and the mean box in the figures: the loss of the average configuration.
    info, prior = np.mean(infos, axis=0), np.mean(priors, axis=0)
    pi, s, width = np.full(k, 1.0 / k), np.mean(spreads, axis=0), np.mean(widths, axis=0)
    yield {"data": f"mixture d={d} k={k}", "n": n, "epsilon": epsilon, "seed": -1, "laplace_scale": b,
           "bound": f"van_trees_prior ({draws} draws)", **bound_figures(info, prior, pi, s, width, n, noise_variance)}


FIGURES = ("excess_over_floor", "cost_over_floor", "error_over_floor")


def summary(rows: Sequence[dict[str, Any]]) -> str:
    """Median [worst = lowest bound] per (data, bound) over the seeds."""
    lines = ["| data | bound | seeds | " + " | ".join(FIGURES) + " |", "|---|---|---|" + "---|" * len(FIGURES)]
    for data, bound in sorted({(r["data"], r["bound"]) for r in rows}):
        group = [r for r in rows if r["data"] == data and r["bound"] == bound]
        cells = [f"{statistics.median(r[f] for r in group):.2f} [{min(r[f] for r in group):.2f}]" for f in FIGURES]
        lines.append(f"| {data} | {bound} | {len(group)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--seeds", type=int, default=10, help="the first N reporting seeds")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="Monte Carlo reports per information")
    parser.add_argument("--prior-draws", type=int, default=0, help="configurations of the prior-averaged bound")
    parser.add_argument("--out", default=None, help="JSON file of every row")
    args = parser.parse_args(argv)
    if args.n < 1000 or not 0.0 < args.epsilon <= 20.0 or not 1 <= args.seeds <= len(REPORTING_SEEDS) \
            or args.samples < 1000 or args.prior_draws < 0:
        print("laplace_bound: need --n >= 1000, --epsilon in (0, 20], --seeds in [1, "
              f"{len(REPORTING_SEEDS)}], --samples >= 1000 and --prior-draws >= 0", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    for d, k in MIXTURES:
        for seed in REPORTING_SEEDS[: args.seeds]:
            for row in seed_rows(d, k, args.n, args.epsilon, seed, args.samples):
                print(json.dumps(row), file=sys.stderr)
                rows.append(row)
        if args.prior_draws:
            for row in prior_rows(d, k, args.n, args.epsilon, args.prior_draws, args.samples):
                print(json.dumps(row), file=sys.stderr)
                rows.append(row)
    print(summary(rows))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
