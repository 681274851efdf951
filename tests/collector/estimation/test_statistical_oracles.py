"""Statistical checks of the frequency oracles' estimators against their analytic variance.

For GRR, SUE, OUE and OLH at n = 1e5 reports, domains D in {16, 1024} and epsilon in
{0.5, 1, 2, 4}, R independent rounds of reports are estimated and two things are checked:

1. **MSE / analytic variance in [0.85, 1.15].** With Z_{r,v} = (c_hat_{r,v} - c_v) / sigma_v, where
   sigma_v^2 = ``params.count_variance(n, c_v)`` at the true count, the statistic is
   rho_hat = (1/T) sum_{r,v} Z_{r,v}^2 over T = R D estimates. Under the null (the variance formula is
   right) E[rho_hat] = 1, and Var(Z^2) = 2 + kappa, with kappa the excess kurtosis of c_hat: c_hat is
   an affine function of a sum of >= 1e5 independent indicators whose mean is >= 93, so
   kappa <= 1/93 ~ 0.01. Within one round the D estimates are correlated (GRR's counts are
   multinomial: rho_uv = -sqrt(pi_u pi_v / ((1 - pi_u)(1 - pi_v))), at most 0.22 here; unary
   encoding's bits are independent; OLH's supports are uncorrelated for an ideal hash), which
   inflates Var(sum_v Z_v^2) = 2 sum_{u,v} rho_uv^2 by a factor lambda = 1 + (1/D) sum_{u!=v} rho_uv^2
   (computed: at most 1.07, GRR at D = 16); lambda = 1.25 covers every configuration here with
   kappa included. So Var(rho_hat) <= 2 lambda / T.

2. **95% intervals cover the truth 93-97% of the time.** The coverage p_hat is a mean of T
   indicators with mean p* and variance <= lambda p*(1 - p*) / T. The intervals' true coverage p*
   is not exactly 0.95: the standard error plugs in the estimate clipped to [0, n], which makes the
   intervals conservative where the noise dwarfs the counts (GRR at D = 1024: p* = 0.958-0.960).
   ``expected_coverage`` computes p* for each configuration by integrating the normal
   approximation with the same plug-in rule (grid quadrature, error < 1e-4); the lattice of the
   integer supports (means >= 93) moves the average over the D values by at most delta = 0.003.
   The test first asserts 0.93 < p* < 0.97, then chooses T so that p_hat stays in [0.93, 0.97].

False failures. The module makes K = 72 randomized assertions (32 configurations x 2, two
unseeded configurations x 2, and 4 in the real-SDK check) and spends alpha = 1e-6 over all of them
(Bonferroni): each may fail falsely with probability alpha / K = 1.4e-8, i.e. beyond
z = Phi^-1(1 - alpha / (2K)) = 5.67 standard deviations (normal approximation of rho_hat and p_hat,
means of thousands of terms). That requires

    ratio:     0.15 >= z sqrt(2 lambda / T)                  ->  T >= 2 * 1.25 * (5.67 / 0.15)^2 = 3579
    coverage:  m - delta >= z sqrt(lambda p*(1 - p*) / T),   m = min(p* - 0.93, 0.97 - p*)
               ->  T >= 1.25 p*(1 - p*) (5.67 / (m - delta))^2

For p* = 0.950 the coverage bound is T >= 6617 (R = 414 rounds at D = 16, 7 at D = 1024); for GRR
at D = 1024 (p* = 0.958-0.960) it is T = 19 000-29 000 (R = 19-29); ``rounds_for`` computes R.

Simulation. GRR and OLH reports are sampled one by one with numpy from the exact output
distribution the SDK's parameters define (``add_simulated_reports``) and go through the
aggregators' fast paths. For SUE and OUE the bits of a report are independent, so the per-bit
counts are exactly C_j = Binomial(c_j, p) + Binomial(n - c_j, q): they are sampled directly and
fed to ``UnaryEncodingAggregator.from_counts`` (the report path of unary encoding is checked by
the real-SDK test and in the fast unit tests). ``test_real_sdk_reports`` pushes 20 000 reports
made by the SDK's own ``randomize`` through the msgpack accumulator path. Negative controls show
that a wrong variance and an overconfident mechanism are caught.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import msgpack
import numpy as np
import pytest
from numpy.typing import NDArray

from ldp_client.mechanisms import GRRParams, LocalHashingParams, UnaryEncodingParams, oue, sue
from ldp_client.payload import payload_to_wire
from ldp_client.rng import SeededRng
from ldp_collector.estimation import (
    FrequencyEstimate,
    UnaryEncodingAggregator,
    aggregate_reports,
    make_aggregator,
    rebuild,
)
from ldp_collector.estimation.frequency import FrequencyOracleParams
from ldp_collector.simulation.reports import add_simulated_reports
from ldp_collector.storage.base import StoredReport
from support.stats import chi2_sf

pytestmark = pytest.mark.statistical

N_REPORTS = 100_000
DOMAINS = (16, 1024)
EPSILONS = (0.5, 1.0, 2.0, 4.0)
MECHANISMS = ("grr", "sue", "oue", "olh")
ALPHA = 1e-6
N_ASSERTIONS = 72
PER_ASSERTION = ALPHA / N_ASSERTIONS
Z = NormalDist().inv_cdf(1 - PER_ASSERTION / 2)
#: Bound on the variance inflation from within-round correlation and kurtosis (module docstring).
LAMBDA = 1.25
RATIO_BOUNDS = (0.85, 1.15)
COVERAGE_BOUNDS = (0.93, 0.97)
#: Largest shift of the average coverage by the lattice of integer supports (module docstring).
LATTICE_DELTA = 0.003


def ratio_estimates() -> int:
    """T needed by the MSE-ratio check."""
    return math.ceil(2 * LAMBDA * (Z / (RATIO_BOUNDS[1] - 1)) ** 2)


def coverage_estimates(p_star: float) -> int:
    """T needed by the coverage check when the intervals' true coverage is ``p_star``."""
    margin = min(p_star - COVERAGE_BOUNDS[0], COVERAGE_BOUNDS[1] - p_star) - LATTICE_DELTA
    assert margin > 0, f"true coverage {p_star:.4f} is too close to the band {COVERAGE_BOUNDS}"
    return math.ceil(LAMBDA * p_star * (1 - p_star) * (Z / margin) ** 2)


def expected_coverage(params: FrequencyOracleParams, counts: NDArray[np.int64], confidence: float = 0.95) -> float:
    """p*: coverage of the plug-in intervals under the normal approximation, averaged over values.

    c_hat = c + sigma_c Z with sigma_c^2 = count_variance(n, c); the interval uses
    SE^2 = count_variance(n, clip(c_hat, 0, n)) (affine in the count), integrated over Z on a grid.
    """
    n = float(counts.sum())
    var0 = params.count_variance(n, 0.0)
    slope = (params.count_variance(n, n) - var0) / n
    z = np.linspace(-8.0, 8.0, 16001)
    weights = np.exp(-(z**2) / 2)
    weights /= weights.sum()
    c = counts.astype(np.float64)[:, None]
    sigma = np.sqrt(var0 + slope * c)
    c_hat = c + sigma * z[None, :]
    se = np.sqrt(var0 + slope * np.clip(c_hat, 0.0, n))
    quantile = NormalDist().inv_cdf(0.5 + confidence / 2)
    return float(((np.abs(c_hat - c) <= quantile * se) * weights[None, :]).sum(axis=1).mean())


def rounds_for(domain: int, p_star: float) -> int:
    return math.ceil(max(ratio_estimates(), coverage_estimates(p_star)) / domain)


def make_params(mechanism: str, domain: int, epsilon: float) -> FrequencyOracleParams:
    if mechanism == "grr":
        return GRRParams(domain_size=domain, epsilon=epsilon)
    if mechanism == "sue":
        return sue(domain, epsilon)
    if mechanism == "oue":
        return oue(domain, epsilon)
    return LocalHashingParams(domain_size=domain, epsilon=epsilon)


def true_counts(domain: int, n: int = N_REPORTS) -> NDArray[np.int64]:
    """A skewed histogram (weights 1/(v+1)) in which every value is held."""
    w = 1.0 / np.arange(1, domain + 1)
    counts = np.floor(w / w.sum() * n).astype(np.int64)
    counts[0] += n - counts.sum()
    return np.asarray(counts, dtype=np.int64)


def simulate_estimates(params: FrequencyOracleParams, counts: NDArray[np.int64], rounds: int,
                       rng: np.random.Generator) -> list[FrequencyEstimate]:
    n = int(counts.sum())
    if isinstance(params, UnaryEncodingParams):
        bits = rng.binomial(counts[None, :], params.p, size=(rounds, counts.size)) \
            + rng.binomial(n - counts[None, :], params.q, size=(rounds, counts.size))
        return [UnaryEncodingAggregator.from_counts(params, row, n).estimate(0.95) for row in bits]
    values = np.repeat(np.arange(counts.size), counts)
    out = []
    for _ in range(rounds):
        agg = make_aggregator(params)
        add_simulated_reports(agg, values, rng)
        out.append(agg.estimate(0.95))
    return out


def ratio_and_coverage(params: FrequencyOracleParams, counts: NDArray[np.int64],
                       estimates: list[FrequencyEstimate], variance_scale: float = 1.0) -> tuple[float, float]:
    n = int(counts.sum())
    variance = np.array([params.count_variance(float(n), float(c)) for c in counts]) * variance_scale
    est = np.stack([e.counts for e in estimates])
    z2 = (est - counts[None, :]) ** 2 / variance[None, :]
    lower = np.stack([e.ci_lower for e in estimates])
    upper = np.stack([e.ci_upper for e in estimates])
    covered = (lower <= counts[None, :]) & (counts[None, :] <= upper)
    return float(z2.mean()), float(covered.mean())


def check(mechanism: str, domain: int, epsilon: float, rng: np.random.Generator) -> None:
    params = make_params(mechanism, domain, epsilon)
    counts = true_counts(domain)
    p_star = expected_coverage(params, counts)
    assert COVERAGE_BOUNDS[0] < p_star < COVERAGE_BOUNDS[1]  # deterministic
    estimates = simulate_estimates(params, counts, rounds_for(domain, p_star), rng)
    ratio, coverage = ratio_and_coverage(params, counts, estimates)
    assert RATIO_BOUNDS[0] <= ratio <= RATIO_BOUNDS[1], f"MSE / analytic variance = {ratio:.4f}"
    assert COVERAGE_BOUNDS[0] <= coverage <= COVERAGE_BOUNDS[1], f"95% interval coverage = {coverage:.4f}"


def test_the_number_of_rounds_follows_the_derivation() -> None:
    assert Z == pytest.approx(5.67, abs=0.01)
    assert ratio_estimates() == 3579
    assert coverage_estimates(0.95) == 6617
    assert rounds_for(16, 0.95) == 414 and rounds_for(1024, 0.95) == 7
    grr = make_params("grr", 1024, 1.0)
    p_star = expected_coverage(grr, true_counts(1024))
    assert 0.958 < p_star < 0.961  # conservative: the clipped plug-in inflates the standard error
    assert expected_coverage(make_params("oue", 16, 1.0), true_counts(16)) == pytest.approx(0.95, abs=2e-4)


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("domain", DOMAINS)
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_mse_matches_variance_and_intervals_cover(mechanism: str, domain: int, epsilon: float) -> None:
    seed = 1_000_003 * MECHANISMS.index(mechanism) + 1009 * domain + int(epsilon * 10)
    check(mechanism, domain, epsilon, np.random.default_rng(seed))


@pytest.mark.parametrize("mechanism,domain", [("grr", 16), ("oue", 1024)])
def test_unseeded_run(mechanism: str, domain: int) -> None:
    check(mechanism, domain, 1.0, np.random.default_rng())


def test_negative_control_wrong_variance_is_caught() -> None:
    """An estimator claiming 1.4x its real variance gives a ratio ~0.71: 8 SD outside the band."""
    params = make_params("grr", 16, 1.0)
    counts = true_counts(16)
    estimates = simulate_estimates(params, counts, rounds_for(16, 0.95), np.random.default_rng(5))
    ratio, _ = ratio_and_coverage(params, counts, estimates, variance_scale=1.4)
    assert ratio < RATIO_BOUNDS[0]


def test_negative_control_overconfident_mechanism_is_caught() -> None:
    """Reports made at epsilon 1.2 but estimated with epsilon 1's p and q are biased: caught."""
    made = make_params("oue", 1024, 1.2)
    claimed = make_params("oue", 1024, 1.0)
    counts = true_counts(1024)
    estimates = simulate_estimates(made, counts, rounds_for(1024, 0.95), np.random.default_rng(6))
    assert isinstance(claimed, UnaryEncodingParams)
    n = int(counts.sum())
    relabelled = [UnaryEncodingAggregator.from_counts(
        claimed, np.rint(e.counts * (made.p - made.q) + n * made.q).astype(np.int64), n).estimate()
        for e in estimates]
    ratio, coverage = ratio_and_coverage(claimed, counts, relabelled)
    assert not (RATIO_BOUNDS[0] <= ratio <= RATIO_BOUNDS[1] and COVERAGE_BOUNDS[0] <= coverage <= COVERAGE_BOUNDS[1])


def test_real_sdk_reports() -> None:
    """20 000 reports per oracle from the SDK's own exact-coin ``randomize``, through msgpack and the
    accumulator path (GRR, SUE, OUE) or the raw-report path (OLH).

    Checks (4 of the module's 72 assertions): every estimate within z SE of the truth, Bonferroni over
    the 4 x 16 values; and for the three oracles whose per-value estimates are independent (SUE, OUE,
    OLH), sum_v Z_v^2 at the true variance fits chi-square with 16 degrees of freedom (upper and lower
    tails, each at PER_ASSERTION / 2).
    """
    domain, epsilon, n = 16, 1.0, 20_000
    counts = true_counts(domain, n)
    values = np.random.default_rng(7).permutation(np.repeat(np.arange(domain), counts))
    all_params = [make_params(m, domain, epsilon) for m in MECHANISMS]
    by_group: dict[int, tuple[FrequencyOracleParams, ...]] = {0: tuple(all_params)}
    rng = SeededRng(2024)
    reports = [StoredReport(report_id=i.to_bytes(16, "big"), campaign_id="stat", round=0, group=0,
                            payloads=msgpack.packb([payload_to_wire(p.randomize(int(v), rng=rng)) for p in all_params],
                                                   use_bin_type=True))
               for i, v in enumerate(values)]
    blobs = rebuild(reports, by_group)
    direct = aggregate_reports(reports, by_group)
    z_values = NormalDist().inv_cdf(1 - PER_ASSERTION / (2 * 4 * domain))
    worst = 0.0
    for index, params in enumerate(all_params):
        key = f"0:{index}"
        est = direct[key].estimate()
        assert direct[key].n == n and len(blobs[key]) > 0
        worst = max(worst, float(np.max(np.abs(est.counts - counts) / est.std_errors)))
        if params.KIND != "grr":
            variance = np.array([params.count_variance(float(n), float(c)) for c in counts])
            stat = float(np.sum((est.counts - counts) ** 2 / variance))
            upper_tail = chi2_sf(stat, domain)
            assert PER_ASSERTION / 2 <= upper_tail <= 1 - PER_ASSERTION / 2, (
                f"{params.KIND}: sum of squared standardized errors {stat:.1f} on {domain} dof")
    assert worst <= z_values, f"an estimate is {worst:.2f} SE from the truth (limit {z_values:.2f})"
