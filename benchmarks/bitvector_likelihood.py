"""A likelihood step after the bitvector kind's clustering: the lead of ``benchmarks/README.md`` measured.

The bitvector kind clusters the debiased bits in the encoded space and decodes the centers. Its
reports carry much more than that uses (``benchmarks/center_bound.py``: the bounds on its centers lie
below its own floor). This probe asks how much a maximum-likelihood fit on the bits themselves gives
back, started from the kind's published centers:

1. a whole ``bitvector`` campaign through the in-process collector on a Gaussian mixture (devices
   simulated as ``simulate`` does), and its published centers;
2. the round's own reports, read back from the campaign's store, and a uniform sample of
   ``--sample`` of them (the kind's start also works on a sample of 2^16);
3. the mixture of spherical-per-coordinate Gaussians (means, spreads, weights) fitted to the
   sample's bits by L-BFGS on the exact likelihood: given a cluster, attribute ``j``'s bits are a
   finite mixture over the encoder's constant pieces, each bit flipped with the mechanism's
   probability (:class:`center_bound.BitVectorReports`), so ``p(bits) = sum_k pi_k prod_j sum_t
   w_kjt f^h (1 - f)^(T - h)`` with ``w_kjt`` the normal mass of piece ``t``;
4. both sets of centers scored on the true points: the cost ratio against non-private k-means++
   and the ARI of the nearest-center labels.

A probe for choosing (``--tuning``: seeds 0-19), not a figure; nothing in the kind changes.

Usage::

    python benchmarks/bitvector_likelihood.py --d 5 --k 6 --n 100000 --epsilon 2 --seeds 5 --tuning
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from center_bound import BitVectorReports
from harness.suites import REPORTING_SEEDS, TUNING_SEEDS
from numpy.typing import NDArray
from scipy.optimize import minimize  # type: ignore[import-untyped, unused-ignore]
from scipy.special import ndtr  # type: ignore[import-untyped, unused-ignore]

from ldp_client.encoders.bitvector import BitVectorEncoder
from ldp_client.mechanisms.bitwise_randomized_response import BitwiseRRParams
from ldp_collector.cli_args import build_campaign_config
from ldp_collector.core import Collector
from ldp_collector.estimation.accumulators import component_params_from_spec, decode_report_payloads
from ldp_collector.estimation.bitvector import unpack_bit_payloads
from ldp_collector.estimation.kmeans import assign
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.population import numeric_bounds
from ldp_collector.simulation.runner import run_campaign
from ldp_collector.simulation.scores import adjusted_rand_index, reference_kmeans
from ldp_collector.storage import open_store

#: Reports the likelihood is fitted on (the kind's own sample size).
DEFAULT_SAMPLE = 1 << 16
#: L-BFGS iterations at most.
MAX_ITERATIONS = 3000


def piece_likelihoods(bits: NDArray[np.uint8], model: BitVectorReports) -> list[NDArray[np.float64]]:
    """Per attribute, ``P(report bits | piece t)`` for every report and piece, ``(m, pieces_j)``."""
    out, start = [], 0
    for j, codes in enumerate(model.codes):
        width = codes.shape[1]
        out.append(model.piece_likelihoods(j, bits[:, start:start + width].astype(np.float64)))
        start += width
    return out


def _unpack(theta: NDArray[np.float64], k: int, d: int) -> tuple[NDArray[np.float64], NDArray[np.float64],
                                                                     NDArray[np.float64]]:
    mu = theta[: k * d].reshape(k, d)
    s = np.exp(theta[k * d: 2 * k * d].reshape(k, d))
    logits = np.concatenate([[0.0], theta[2 * k * d:]])
    return mu, s, logits - np.logaddexp.reduce(logits)


def negative_log_likelihood(theta: NDArray[np.float64], likelihoods: Sequence[NDArray[np.float64]],
                            edges: Sequence[NDArray[np.float64]], k: int) -> tuple[float, NDArray[np.float64]]:
    """Minus the sample's log-likelihood at ``theta = (means, log spreads, weight logits after the first)``,
    and its gradient."""
    d = len(edges)
    mu, s, log_pi = _unpack(theta, k, d)
    m = likelihoods[0].shape[0]
    log_joint = np.tile(log_pi, (m, 1))
    parts = []
    for j in range(d):
        z = (edges[j][None, :] - mu[:, j, None]) / s[:, j, None]  # (k, pieces + 1)
        finite = np.isfinite(z)
        zz = np.where(finite, z, 0.0)
        density = np.where(finite, np.exp(-0.5 * zz * zz) / math.sqrt(2.0 * math.pi), 0.0)
        mass = np.maximum(ndtr(z[:, 1:]) - ndtr(z[:, :-1]), 1e-300)
        d_mu = (density[:, :-1] - density[:, 1:]) / s[:, j, None]
        d_log_s = zz[:, :-1] * density[:, :-1] - zz[:, 1:] * density[:, 1:]
        p = np.maximum(likelihoods[j] @ mass.T, 1e-300)  # (m, k)
        log_joint += np.log(p)
        parts.append((p, d_mu, d_log_s))
    top = log_joint.max(axis=1, keepdims=True)
    post = np.exp(log_joint - top)
    total = post.sum(axis=1, keepdims=True)
    post /= total
    value = float((np.log(total) + top).sum())
    g_mu, g_log_s = np.zeros((k, d)), np.zeros((k, d))
    for j, (p, d_mu, d_log_s) in enumerate(parts):
        weighted = (post / p).T @ likelihoods[j]  # (k, pieces)
        g_mu[:, j] = (weighted * d_mu).sum(axis=1)
        g_log_s[:, j] = (weighted * d_log_s).sum(axis=1)
    g_logits = (post.sum(axis=0) - m * np.exp(log_pi))[1:]
    return -value, -np.concatenate([g_mu.ravel(), g_log_s.ravel(), g_logits])


def likelihood_fit(bits: NDArray[np.uint8], model: BitVectorReports, centers: NDArray[np.float64],
                   weights: NDArray[np.float64], lower: NDArray[np.float64],
                   upper: NDArray[np.float64]) -> tuple[NDArray[np.float64], float, int]:
    """The maximum-likelihood means from ``centers`` (spreads start at a tenth of the box, weights at ``weights``):
    the means, the final log-likelihood and the L-BFGS iterations."""
    k, d = centers.shape
    start = np.concatenate([np.clip(centers, lower, upper).ravel(),
                            np.log(np.tile((upper - lower) / 10.0, (k, 1))).ravel(),
                            np.log(np.maximum(weights[1:], 1e-9) / max(float(weights[0]), 1e-9))])
    likelihoods = piece_likelihoods(bits, model)
    fit = minimize(negative_log_likelihood, start, args=(likelihoods, model.edges, k), jac=True, method="L-BFGS-B",
                   options={"maxiter": MAX_ITERATIONS})
    return _unpack(fit.x, k, d)[0], -float(fit.fun), int(fit.nit)


def round_bits(store: Any, campaign_id: str, spec: Any) -> NDArray[np.uint8]:
    """Every report of the campaign's one round, as its randomized bits ``(n, B)``."""
    params = component_params_from_spec(spec)
    payloads: list[Any] = []
    for batch in store.iter_reports(campaign_id, 1):
        payloads.extend(decode_report_payloads(batch, params).get("0:0", []))
    mechanism = spec.tasks[0].components[0].mechanism
    return unpack_bit_payloads(payloads, mechanism.length)


def probe(d: int, k: int, n: int, epsilon: float, seed: int, sample: int) -> dict[str, Any]:
    """One seed: the kind's centers and the likelihood step's, both scored on the true points."""
    x, y = make_dataset("mixture", n, d=d, k=k, seed=seed)
    assert y is not None
    lower, upper = (np.asarray(v, dtype=np.float64) for v in numeric_bounds(x))
    config = config_from_proto(build_campaign_config("bitvector", epsilon=epsilon, k=k, seed=seed,
                                                     bounds=numeric_bounds(x)))
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(tmp)
        try:
            run = run_campaign(Collector(store), config, x, seed=seed, mode="auto", quiet=True)
            bits = round_bits(store, run.campaign_id, run.first_spec)
        finally:
            store.close()
    clustering = run.result.clustering
    assert clustering is not None and clustering.centers
    centers = np.asarray(clustering.centers, dtype=np.float64).reshape(-1, d)
    weights = np.asarray(clustering.weights, dtype=np.float64)
    component = run.first_spec.tasks[0].components[0]
    assert isinstance(component.encoder, BitVectorEncoder) and isinstance(component.mechanism, BitwiseRRParams)
    model = BitVectorReports(component.encoder, component.mechanism.p_flip)
    rows = np.random.default_rng(seed).choice(len(bits), size=min(sample, len(bits)), replace=False)
    started = time.perf_counter()
    refined, log_likelihood, iterations = likelihood_fit(bits[rows], model, centers, weights, lower, upper)
    seconds = time.perf_counter() - started
    reference = reference_kmeans(x, k, seed).cost
    out: dict[str, Any] = {"d": d, "k": k, "n": n, "epsilon": epsilon, "seed": seed, "fit_seconds": seconds,
                           "iterations": iterations, "log_likelihood": log_likelihood}
    for name, c in (("kind", centers), ("likelihood", refined)):
        labels, sq = assign(x, c)
        out[f"{name}_cost_ratio"] = float(sq.sum()) / reference
        out[f"{name}_ari"] = adjusted_rand_index(y, labels)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=5)
    parser.add_argument("--k", type=int, default=6)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--tuning", action="store_true", help="the tuning seeds 0-19 (default: reporting 100-109)")
    parser.add_argument("--sample", type=int, default=DEFAULT_SAMPLE, help="reports the likelihood is fitted on")
    parser.add_argument("--out", default=None, help="JSON file of every row")
    args = parser.parse_args(argv)
    seeds = TUNING_SEEDS if args.tuning else REPORTING_SEEDS
    if not (1 <= args.d <= 64 and 2 <= args.k <= 64 and args.n >= 1000 and 0.0 < args.epsilon <= 20.0
            and 1 <= args.seeds <= len(seeds) and args.sample >= 100):
        print(f"bitvector_likelihood: need --d in [1, 64], --k in [2, 64], --n >= 1000, --epsilon in (0, 20], "
              f"--seeds in [1, {len(seeds)}] and --sample >= 100", file=sys.stderr)
        return 2
    rows = []
    for seed in seeds[: args.seeds]:
        row = probe(args.d, args.k, args.n, args.epsilon, seed, args.sample)
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    better = sum(r["likelihood_cost_ratio"] < r["kind_cost_ratio"] for r in rows)
    print("| centers | cost ratio | ARI |\n|---|---|---|")
    for name in ("kind", "likelihood"):
        costs, aris = [r[f"{name}_cost_ratio"] for r in rows], [r[f"{name}_ari"] for r in rows]
        print(f"| {name} | {statistics.median(costs):.2f} [{max(costs):.2f}] | "
              f"{statistics.median(aris):.3f} [{min(aris):.3f}] |")
    print(f"likelihood step lower cost on {better} of {len(rows)} seeds")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
