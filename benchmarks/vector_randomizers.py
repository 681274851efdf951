"""Per-report error of the SDK's l2-ball vector randomizers: Duchi et al.'s l2 mechanism against PrivUnit.

For a unit input x, every randomizer here reports a unit direction w and estimates B w, so its
per-report mean squared error is E||B w - x||^2 = B^2 - 1 (and B^2 at x = 0; in the bucketized
vector sums of NETTREE and STEMMER every report adds B^2 to every bucket). Computed, not sampled:

* ``l2 ball``: :class:`~ldp_client.mechanisms.vector_l2_ball.VectorL2BallParams` (closed form);
* ``box``: :class:`~ldp_client.mechanisms.vector_box.VectorBoxParams` on the same points in box
  units (its ``variance_bound`` B_box^2 per coordinate is the l2 ball's B^2 per coordinate in the
  kinds' units, ``BucketizedVectorParams.report_second_moment``), the kinds' other choice;
* ``PrivUnit (SDK)``: :class:`~ldp_client.mechanisms.vector_privunit.VectorPrivUnitParams`, the
  exact-coin PrivUnit over 16 random antipodal pairs (its own quadrature);
* ``PrivUnit (cap)``: Bhowmick et al.'s continuous cap, cap measure q and cap probability p
  optimized numerically under ln(p / (1 - p)) + ln((1 - q) / q) = epsilon (needs scipy); the
  reference the SDK's finite set approaches.

Epsilons: what the center kinds give their vector step at a device budget of 2 and 4 (NETTREE:
half of it at dimension d + 1; STEMMER: all of it per report under PARTITION, a quarter under SPLIT;
LDP_KMEANS: half under PARTITION, 1/12 under SPLIT).

Usage: ``python benchmarks/vector_randomizers.py`` (a Markdown table on stdout; a second).
"""

from __future__ import annotations

import math

from ldp_client.mechanisms import VectorBoxParams, VectorL2BallParams, VectorPrivUnitParams

DIMENSIONS = (2, 5, 10, 11, 20, 50)
EPSILONS = (1 / 6, 0.5, 1.0, 2.0, 4.0)


def privunit_cap(dimension: int, epsilon: float) -> float | None:
    """B^2 of the continuous PrivUnit at its best cap (None without scipy)."""
    try:
        from scipy import integrate, optimize, stats
    except ImportError:
        return None
    if dimension == 1:
        return None
    a = (dimension - 1) / 2
    law = stats.beta(a, a, loc=-1, scale=2)  # t = <V, x> for a uniform direction V

    def alignment(q: float) -> float:
        gamma = law.isf(q)
        cap = integrate.quad(lambda t: t * law.pdf(t), gamma, 1)[0]  # E[t; t >= gamma]; E[t] = 0
        p = 1 / (1 + math.exp(-(epsilon + math.log(q / (1 - q)))))
        return float(p * cap / q - (1 - p) * cap / (1 - q))

    best = optimize.minimize_scalar(lambda lq: -alignment(math.exp(lq)), bounds=(math.log(1e-6), math.log(0.5)),
                                    method="bounded")
    return float(1 / alignment(math.exp(best.x)) ** 2)


def main() -> None:
    print("| epsilon | d | l2 ball | box | PrivUnit (SDK) | PrivUnit (cap) | SDK PrivUnit / best current |")
    print("|---|---|---|---|---|---|---|")
    for eps in EPSILONS:
        for d in DIMENSIONS:
            ball = VectorL2BallParams(dimension=d, epsilon=eps).scale ** 2 - 1
            box = VectorBoxParams(dimension=d, epsilon=eps).variance_bound - 1
            sdk = VectorPrivUnitParams(dimension=d, epsilon=eps).scale ** 2 - 1
            cap = privunit_cap(d, eps)
            cap_text = "–" if cap is None else f"{cap - 1:.4g}"
            print(f"| {eps:.3g} | {d} | {ball:.4g} | {box:.4g} | {sdk:.4g} | {cap_text} | {sdk / min(ball, box):.3f} |")


if __name__ == "__main__":
    main()
