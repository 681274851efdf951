"""How close any estimator can come to the one-round point kinds' noise floor: Cramér-Rao and van Trees bounds.

The laplace and bitvector kinds report each center's floor (``ldp_collector.estimation.center_floor``):
its noise as if the server averaged exactly its cluster's reports (laplace: ``Var / c`` per
coordinate, ``Var`` the decoded coordinate's noise variance, ``c`` the cluster's reports; bitvector:
the debiased bits' mean, decoded). The server does not know which report belongs to which cluster,
and at these kinds' noise (laplace: scale ``b = d / epsilon`` unit-cube widths per coordinate, 2.5
at d = 5, epsilon = 2, where the clusters' means lie a few tenths apart; bitvector: every bit
flipped with probability 0.475 at d = 5) that uncertainty can be most of the error. This script
measures how much, for the Gaussian mixtures of ``center_acceptance.py --experiment floor``.

Model
    A device's point ``x`` lies in the campaign's box (the data's, as ``simulate`` sets it); the
    mixtures' clusters are spherical Gaussians, so given its cluster ``k`` a point's coordinates
    are independent, and so are its report's coordinates (:class:`LaplaceReports`: ``z_j = x_j +
    e_j`` with independent Laplace noise, density ``N(mu_kj, s_kj^2) * Laplace(b)``, a convolution
    in closed form, :func:`convolved_logpdf`; :class:`BitVectorReports`: attribute ``j``'s ``T``
    bits, the encoder's bits of the clamped ``x_j`` each flipped with the mechanism's probability,
    a finite mixture over the encoder's constant pieces). ``p(report) = sum_k pi_k prod_j
    p_j(report_j | mu_kj, s_kj)``. The weights ``pi`` and spreads ``s`` are taken as known (the
    bounds only fall by it), the means ``mu`` (k d numbers) are estimated.

Bounds on the means' mean squared error, per report ``I = E[score score^T]`` (the means' Fisher
information, by Monte Carlo over ``--samples`` reports drawn from the model: :func:`mean_information`)
    ``crb``        ``(n I)^-1``: any *unbiased* estimator (Cramér-Rao).
    ``van_trees``  ``(n I + J)^-1`` with ``J`` the information of a prior that spreads every mean over
                   the range the generator draws centers from (``[-10, 10]`` in the data's units, a
                   ``cos^2`` density: ``J = 4 pi^2 / 20^2`` per coordinate). The van Trees inequality
                   bounds the prior-averaged error of *every* estimator, biased ones (shrinkage,
                   clipping into the box) included, by ``(n E[I] + J)^-1``; ``I`` here is the seed's own
                   configuration's, so the figure is that bound for a prior whose configurations are as
                   informative as the seed's, not a proof about one seed. ``--prior-draws`` gives the
                   proper one: ``E[I]`` averaged over configurations drawn like the generator's, with the
                   ``cos^2`` centers.

Figures
    ``cost_ratio``        the k-means cost ratio the bound implies, ``1 + E / OPT``: ``E = sum_k pi_k
                          sum_j v_kj`` the bound's expected excess cost per point, ``OPT`` the
                          clusters' within variance per point (non-private k-means' cost, near enough
                          on these separated mixtures).
    laplace only, against its floor ``v_kj = Var / (pi_k n)`` (unclipped; the kind clips its centers
    into the cube, which only lowers its floor):
    ``excess_over_floor`` ``E`` over the floor's excess.
    ``cost_over_floor``   the bound's cost ratio over the floor's, on the harness's ``cost / floor`` scale.
    ``error_over_floor``  the mean over centers of the bound's root mean squared center error over the
                          floor's (compare ``centre error / floor``).
    ``--floors FILE`` (a ``center_acceptance.py --experiment floor --out`` file on the same seeds and
    ``n``) divides the bound's cost ratio by the run's own floor ratio (its ``floor_cost_ratio``) for
    every kind: ``cost_over_floor`` then comes from the run for both.
    Known-label information gives ``I = pi_k / b^2`` per coordinate for laplace as the spreads
    vanish: half the floor's ``Var / c`` (the sample mean is not efficient under Laplace noise; the
    median is). The tests pin that limit.

Usage::

    python benchmarks/center_bound.py --n 100000 --epsilon 2 --seeds 10 [--kinds laplace bitvector]
        [--prior-draws 20] [--floors FILE] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np
from harness.suites import REPORTING_SEEDS
from numpy.typing import NDArray
from scipy.special import log_ndtr, ndtr  # type: ignore[import-untyped, unused-ignore]

from ldp_client.encoders.bitvector import BitVectorEncoder
from ldp_client.mechanisms.bitwise_randomized_response import BitwiseRRParams
from ldp_client.mechanisms.discrete_laplace import DiscreteLaplaceParams
from ldp_collector.campaigns import prepare_campaign
from ldp_collector.cli_args import build_campaign_config
from ldp_collector.kinds.bitvector import BitVectorEngine
from ldp_collector.kinds.laplace import DEFAULT_GRID_BITS
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.population import numeric_bounds

#: The kinds whose reports the bounds model.
KINDS = ("laplace", "bitvector")
#: The mixtures of ``center_acceptance.py --experiment floor``: (d, k).
MIXTURES = ((5, 6), (10, 8))
#: The generator's range of cluster centers in the data's units (``simulation.datasets.mixture``).
CENTER_RANGE = (-10.0, 10.0)
#: Monte Carlo reports per information matrix.
DEFAULT_SAMPLES = 200_000


def convolved_logpdf(z: NDArray[np.float64], mu: float | NDArray[np.float64], s: NDArray[np.float64],
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


class Reports(Protocol):
    """One kind's reports, coordinate by coordinate, given a spherical-Gaussian cluster (module docstring)."""

    def sample(self, j: int, x: NDArray[np.float64], rng: np.random.Generator) -> NDArray[np.float64]:
        """Coordinate ``j``'s report parts for the points' coordinates ``x`` (m,): (m,) or (m, T)."""

    def log_and_score(self, j: int, reports: NDArray[np.float64], mu: float,
                      s: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``log p_j(report_j | mu, s)`` and its derivative in ``mu``, per report."""


class LaplaceReports:
    """The laplace kind's decoded coordinates, in the data's units: ``x_j`` plus Laplace noise of scale ``scale_j``."""

    def __init__(self, scales: NDArray[np.float64]) -> None:
        self.scales = scales

    def sample(self, j: int, x: NDArray[np.float64], rng: np.random.Generator) -> NDArray[np.float64]:
        out: NDArray[np.float64] = x + rng.laplace(0.0, float(self.scales[j]), size=x.shape)
        return out

    def log_and_score(self, j: int, reports: NDArray[np.float64], mu: float,
                      s: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        return convolved_logpdf(reports, mu, np.full(reports.shape, s), float(self.scales[j]))


class BitVectorReports:
    """The bitvector kind's reports: attribute ``j``'s bits of the clamped coordinate, each flipped with ``p_flip``.

    The encoding of one attribute is constant between the ends of the pivots' windows
    (:class:`~ldp_client.encoders.bitvector.BitVectorEncoder`), so given ``N(mu, s^2)`` a report's
    bits are a finite mixture over those pieces: ``p(r) = sum_t w_t f^h_t (1 - f)^(T - h_t)``, ``w_t``
    the piece's normal mass (the outer pieces reach to infinity: clamping), ``h_t`` the report's
    Hamming distance to the piece's encoding.
    """

    def __init__(self, encoder: BitVectorEncoder, p_flip: float) -> None:
        self.p_flip = p_flip
        self.edges: list[NDArray[np.float64]] = []
        self.codes: list[NDArray[np.float64]] = []
        for lo, hi, pivots, width in zip(encoder.domain.lower, encoder.domain.upper, encoder.attribute_pivots,
                                         encoder.half_widths):
            cuts = sorted({c for p in pivots for c in (p - width, p + width) if lo < c < hi})
            edges = np.array([-math.inf, *cuts, math.inf])
            inner = np.clip(edges, lo, hi)
            # Every piece's encoding, from the encoder's own comparison at a point inside it (its midpoint).
            middle = (inner[:-1] + inner[1:]) / 2.0
            self.edges.append(edges)
            self.codes.append(np.array([[1.0 if abs(m - p) <= width else 0.0 for p in pivots] for m in middle]))

    def sample(self, j: int, x: NDArray[np.float64], rng: np.random.Generator) -> NDArray[np.float64]:
        bits = self.codes[j][np.searchsorted(self.edges[j], x, side="right") - 1]
        out: NDArray[np.float64] = np.where(rng.uniform(size=bits.shape) < self.p_flip, 1.0 - bits, bits)
        return out

    def piece_likelihoods(self, j: int, reports: NDArray[np.float64]) -> NDArray[np.float64]:
        """``P(report bits | piece t)`` for attribute ``j``'s bits ``(m, T)`` and every piece: ``(m, pieces)``."""
        codes, f = self.codes[j], self.p_flip
        width = codes.shape[1]
        hamming = reports @ (1.0 - codes).T + (1.0 - reports) @ codes.T
        out: NDArray[np.float64] = np.exp(hamming * math.log(f) + (width - hamming) * math.log1p(-f))
        return out

    def log_and_score(self, j: int, reports: NDArray[np.float64], mu: float,
                      s: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        likelihood = self.piece_likelihoods(j, reports)
        z = (self.edges[j] - mu) / s
        density = np.where(np.isfinite(z), np.exp(-0.5 * np.where(np.isfinite(z), z, 0.0) ** 2), 0.0) / math.sqrt(
            2.0 * math.pi)
        mass = np.maximum(ndtr(z[1:]) - ndtr(z[:-1]), 0.0)
        slope = (density[:-1] - density[1:]) / s  # d mass / d mu
        p = likelihood @ mass
        out_log: NDArray[np.float64] = np.log(p)
        out_score: NDArray[np.float64] = (likelihood @ slope) / p
        return out_log, out_score


def reports_for(kind: str, k: int, epsilon: float, lower: NDArray[np.float64], upper: NDArray[np.float64],
                seed: int) -> tuple[Reports, float | None]:
    """The kind's report model for a campaign on the box ``[lower, upper]``, planned as ``simulate`` plans it,
    and (laplace) the decoded coordinate's noise variance in unit-cube units."""
    d = lower.size
    if kind == "laplace":
        variance = DiscreteLaplaceParams(dimension=d, epsilon=epsilon, grid_bits=DEFAULT_GRID_BITS).noise_variance
        return LaplaceReports(math.sqrt(variance / 2.0) * (upper - lower)), variance
    config = config_from_proto(build_campaign_config(kind, epsilon=epsilon, k=k, seed=seed,
                                                     bounds=(lower.tolist(), upper.tolist())))
    engine = prepare_campaign(config).engine
    assert isinstance(engine, BitVectorEngine)
    component = engine.component
    assert isinstance(component.encoder, BitVectorEncoder) and isinstance(component.mechanism, BitwiseRRParams)
    return BitVectorReports(component.encoder, component.mechanism.p_flip), None


def mean_information(model: Reports, mu: NDArray[np.float64], s: NDArray[np.float64], pi: NDArray[np.float64],
                     samples: int, rng: np.random.Generator, *, lower: NDArray[np.float64] | None = None,
                     upper: NDArray[np.float64] | None = None, batch: int = 50_000) -> NDArray[np.float64]:
    """The Fisher information of one report about the ``k d`` means (row-major ``(k, d)``), by Monte Carlo.

    ``mu``, ``s``: ``(k, d)`` means and spreads; ``pi``: ``(k,)`` weights; points are clamped to
    ``[lower, upper]`` when given (a campaign's encoder clamps). The score of ``mu_kj`` is ``r_k(report)
    d log p_j / d mu_kj``, ``r_k`` the cluster's posterior probability; the information is the mean of the
    scores' outer products.
    """
    k, d = mu.shape
    info = np.zeros((k * d, k * d))
    done = 0
    while done < samples:
        m = min(batch, samples - done)
        labels = rng.choice(k, size=m, p=pi)
        x = mu[labels] + rng.standard_normal((m, d)) * s[labels]
        if lower is not None and upper is not None:
            x = np.clip(x, lower, upper)
        log_joint = np.tile(np.log(pi), (m, 1))
        scores = np.empty((m, k, d))
        for j in range(d):
            reports = model.sample(j, x[:, j], rng)
            for c in range(k):
                log_p, score = model.log_and_score(j, reports, float(mu[c, j]), float(s[c, j]))
                log_joint[:, c] += log_p
                scores[:, c, j] = score
        post = np.exp(log_joint - log_joint.max(axis=1, keepdims=True))
        post /= post.sum(axis=1, keepdims=True)
        full = (post[:, :, None] * scores).reshape(m, k * d)
        info += full.T @ full
        done += m
    out: NDArray[np.float64] = info / samples
    return out


def bound_figures(info: NDArray[np.float64], prior: NDArray[np.float64] | None, pi: NDArray[np.float64],
                  s: NDArray[np.float64], n: int, floor_variance: NDArray[np.float64] | None = None) -> dict[str, float]:
    """The figures of the module docstring for one information matrix, in the data's units.

    ``prior``: ``J`` per mean (None: the CRB); ``floor_variance``: per coordinate, the floor's variance of
    one report (laplace: ``Var`` times the box width squared), for the floor's figures.
    """
    k, d = s.shape
    total = n * info + (np.diag(prior) if prior is not None else 0.0)
    v = np.diag(np.linalg.inv(total)).reshape(k, d)
    excess = float((pi * v.sum(axis=1)).sum())
    within = float((pi * (s**2).sum(axis=1)).sum())
    out = {"cost_ratio": 1.0 + excess / within}
    if floor_variance is not None:
        floor = floor_variance[None, :] / (pi[:, None] * n)
        floor_excess = float((pi * floor.sum(axis=1)).sum())
        ratio = excess / floor_excess
        out.update(excess_over_floor=ratio,
                   cost_over_floor=(1.0 + ratio * floor_excess / within) / (1.0 + floor_excess / within),
                   error_over_floor=float(np.sqrt(v.sum(axis=1)).mean() / np.sqrt(floor.sum(axis=1)).mean()),
                   floor_cost_ratio=1.0 + floor_excess / within)
    return out


def _prior_information(k: int, d: int) -> NDArray[np.float64]:
    """``J`` of the ``cos^2`` prior over :data:`CENTER_RANGE` per mean, in the data's units, row-major ``(k, d)``."""
    return np.full(k * d, 4.0 * math.pi**2 / (CENTER_RANGE[1] - CENTER_RANGE[0]) ** 2)


def seed_rows(kind: str, d: int, k: int, n: int, epsilon: float, seed: int, samples: int) -> Iterator[dict[str, Any]]:
    """The CRB and the local van Trees bound for one reporting seed's mixture (its true weights, spreads, box)."""
    x, y = make_dataset("mixture", n, d=d, k=k, seed=seed)
    assert y is not None
    lower, upper = (np.asarray(v, dtype=np.float64) for v in numeric_bounds(x))
    pi = np.bincount(y, minlength=k) / y.size
    mu = np.array([x[y == c].mean(axis=0) for c in range(k)])
    s = np.array([x[y == c].std(axis=0) for c in range(k)])
    model, variance = reports_for(kind, k, epsilon, lower, upper, seed)
    info = mean_information(model, mu, s, pi, samples, np.random.default_rng(seed), lower=lower, upper=upper)
    floor = None if variance is None else variance * (upper - lower) ** 2
    base = {"kind": kind, "data": f"mixture d={d} k={k}", "n": n, "epsilon": epsilon, "seed": seed}
    yield {**base, "bound": "crb", **bound_figures(info, None, pi, s, n, floor)}
    yield {**base, "bound": "van_trees_local", **bound_figures(info, _prior_information(k, d), pi, s, n, floor)}


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


def prior_rows(kind: str, d: int, k: int, n: int, epsilon: float, draws: int,
               samples: int) -> Iterator[dict[str, Any]]:
    """The van Trees bound averaged over ``draws`` configurations drawn like the generator's (``cos^2`` centers).

    Every configuration's box is that of its own ``n`` points, as a campaign's; the figures use the
    information averaged over the draws, equal weights and the draws' mean spreads and floor.
    """
    rng = np.random.default_rng(20261130)
    infos, spreads, floors = [], [], []
    for draw in range(draws):
        centers = CENTER_RANGE[0] + (CENTER_RANGE[1] - CENTER_RANGE[0]) * _cos2(rng, (k, d))
        pi = rng.dirichlet(np.full(k, 4.0))
        stds = rng.uniform(0.5, 1.5, size=k)
        labels = rng.choice(k, size=n, p=pi)
        x = centers[labels] + rng.standard_normal((n, d)) * stds[labels, None]
        lower, upper = x.min(axis=0), x.max(axis=0)
        s = np.repeat(stds[:, None], d, axis=1)
        model, variance = reports_for(kind, k, epsilon, lower, upper, draw)
        infos.append(mean_information(model, centers, s, pi, samples, rng, lower=lower, upper=upper))
        spreads.append(s)
        if variance is not None:
            floors.append(variance * (upper - lower) ** 2)
    floor = np.mean(floors, axis=0) if floors else None
    yield {"kind": kind, "data": f"mixture d={d} k={k}", "n": n, "epsilon": epsilon, "seed": -1,
           "bound": f"van_trees_prior ({draws} draws)",
           **bound_figures(np.mean(infos, axis=0), _prior_information(k, d), np.full(k, 1.0 / k),
                           np.mean(spreads, axis=0), n, floor)}


FIGURES = ("cost_ratio", "cost_over_floor", "excess_over_floor", "error_over_floor")


def apply_floors(rows: list[dict[str, Any]], runs: Sequence[dict[str, Any]]) -> None:
    """Each seed's bound over its run's own floor ratio (``floor_cost_ratio``): ``cost_over_floor``.

    The prior-averaged rows take the runs' median floor ratio of their (kind, data).
    """
    floor_ratio = {(r["kind"], r["data"], r["seed"]): float(r["floor_cost_ratio"]) for r in runs
                   if r.get("floor_cost_ratio")}
    for row in rows:
        ratio = floor_ratio.get((row["kind"], row["data"], row["seed"]))
        if row["seed"] < 0:
            same = [v for (kind, data, _), v in floor_ratio.items() if kind == row["kind"] and data == row["data"]]
            ratio = statistics.median(same) if same else None
        if ratio is not None:
            row["cost_over_floor"] = row["cost_ratio"] / ratio
            row["run_floor_cost_ratio"] = ratio


def summary(rows: Sequence[dict[str, Any]]) -> str:
    """Median [lowest bound] per (kind, data, bound) over the seeds."""
    lines = ["| kind | data | bound | seeds | " + " | ".join(FIGURES) + " |",
             "|---|---|---|---|" + "---|" * len(FIGURES)]
    for kind, data, bound in sorted({(r["kind"], r["data"], r["bound"]) for r in rows}):
        group = [r for r in rows if (r["kind"], r["data"], r["bound"]) == (kind, data, bound)]
        cells = [f"{statistics.median(r[f] for r in group):.2f} [{min(r[f] for r in group):.2f}]"
                 if all(f in r for r in group) else "" for f in FIGURES]
        lines.append(f"| {kind} | {data} | {bound} | {len(group)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--seeds", type=int, default=10, help="the first N reporting seeds")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="Monte Carlo reports per information")
    parser.add_argument("--prior-draws", type=int, default=0, help="configurations of the prior-averaged bound")
    parser.add_argument("--floors", default=None, help="a center_acceptance --experiment floor --out file: its floors")
    parser.add_argument("--out", default=None, help="JSON file of every row")
    args = parser.parse_args(argv)
    if args.n < 1000 or not 0.0 < args.epsilon <= 20.0 or not 1 <= args.seeds <= len(REPORTING_SEEDS) \
            or args.samples < 1000 or args.prior_draws < 0:
        print("center_bound: need --n >= 1000, --epsilon in (0, 20], --seeds in [1, "
              f"{len(REPORTING_SEEDS)}], --samples >= 1000 and --prior-draws >= 0", file=sys.stderr)
        return 2
    runs: list[dict[str, Any]] = []
    if args.floors:
        try:
            with open(args.floors, encoding="utf-8") as handle:
                saved = json.load(handle)
            runs = [r for r in saved["rows"] if r.get("n") == args.n and r.get("epsilon") == args.epsilon]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"center_bound: cannot read --floors {args.floors}: {exc}", file=sys.stderr)
            return 2
    rows: list[dict[str, Any]] = []
    for kind in args.kinds:
        for d, k in MIXTURES:
            for seed in REPORTING_SEEDS[: args.seeds]:
                for row in seed_rows(kind, d, k, args.n, args.epsilon, seed, args.samples):
                    print(json.dumps(row), file=sys.stderr)
                    rows.append(row)
            if args.prior_draws:
                for row in prior_rows(kind, d, k, args.n, args.epsilon, args.prior_draws, args.samples):
                    print(json.dumps(row), file=sys.stderr)
                    rows.append(row)
    if runs:
        apply_floors(rows, runs)
    print(summary(rows))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
