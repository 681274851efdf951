"""LAPLACE campaigns: one round of discrete-Laplace-noised points, clustered on the server (``papers/004``).

Every device reports once, with the campaign's whole epsilon, its point clamped to the public
numeric domain and normalized to the unit cube (:class:`~ldp_client.encoders.vectors.UnitCubeEncoder`),
rounded to a grid of ``2^grid_bits`` steps per coordinate and noised with exact discrete Laplace
noise (:class:`~ldp_client.mechanisms.discrete_laplace.DiscreteLaplaceParams`). The mechanism
spends epsilon over the L1 sensitivity ``d N`` of the whole rounded vector, i.e. ``epsilon / d``
per coordinate (sensitivity N, the coordinate range): the integer noise scale is ``d N / epsilon``,
``b = d / epsilon`` in unit-cube units. The budget policy makes no difference (one round).

At close the server decodes the reports (the integers over N: unbiased for the rounded points)
and clusters the noisy points with ``LaplaceParameters.algorithm`` (DESIGN.md §7.6):

``KMEANS``
    Weighted k-means++ and Lloyd, best of :data:`N_INIT` (:func:`ldp_collector.estimation.kmeans.weighted_kmeans`).
``FCM`` (default, :data:`DEFAULT_ALGORITHM`)
    Plain fuzzy c-means (squared Euclidean distance).
``MNFCM``
    Fuzzy c-means with the continuous mixed-noise loss (:mod:`ldp_collector.estimation.fuzzy`),
    the distance scaled by ``1 / (sqrt(d) sigma_0)`` so that the noise floor ``sigma_0`` becomes
    ``1 / sqrt(d)``. ``sigma_0`` is the Laplace scale of the noise every coordinate carries,
    ``sqrt(Var / 2)`` with ``Var`` the decoded coordinate's exact variance
    (:attr:`~ldp_client.mechanisms.discrete_laplace.DiscreteLaplaceParams.noise_variance`; about
    ``d / epsilon``): Lemma 1's per-point scale ``max(sigma_0, r / sqrt(d))`` then leaves the
    quadratic regime where a point is farther than ``sqrt(d) b`` from a center, about the norm of
    the noise vector itself, and beyond it the loss grows only logarithmically.

The step never holds the round: one pass over the reports per iteration (DESIGN.md §9;
:func:`cluster_source`). A statistics pass (the points' spread), k-means++ seeds drawn from a
sample of :data:`SEED_SAMPLE_SIZE` points (:class:`~ldp_collector.estimation.kmeans.PointSample`
salted by the campaign seed: a function of the decoded points only, the same on every engine and on
a repeated run whose devices sent the same points under other ids), then one pass per
iteration in which the :data:`N_INIT` restarts share the reading of the reports, each with its own
centers and sums (:class:`~ldp_collector.estimation.kmeans.LloydPass`,
:class:`~ldp_collector.estimation.fuzzy.FuzzyPass`), and a last pass at the final centers. Memory:
the sample (at most ``2 SEED_SAMPLE_SIZE x (d + 2)`` numbers, 4 MB at ``d = 2``), one batch, and per pass ``N_INIT k (2 d + 2)`` float64 (``N_INIT k (d + 2)`` for
k-means): about 24 KB at ``k = 256``, ``d = 2``, whatever ``n``. In-process the decoded batches
of the first pass are replayed to the next ones within
:attr:`~ldp_collector.kinds.base.RoundReports.decoded_cache_bytes` (``8 d`` bytes a report).

The true points lie in the unit cube and so do their clusters' means: the fuzzy algorithms keep
their centers in the cube (clipped after every update) and k-means' centers are clipped into it at
the end. The default is the configuration that won most cells of ``benchmarks/laplace_clustering.py``
on its tuning seeds: FCM with the centers kept in the cube (the highest median ARI in 11 of 29
(data set, n, epsilon) cells, against 10 for mnFCM in the cube and at most 4 for each other
configuration). It is a near tie: on the reporting seeds mnFCM and FCM in the cube differ
significantly in 4 cells of 29 (``benchmarks/README.md``, "Laplace path"), and where the noise
dwarfs the clusters FCM's centers shrink further towards the data's mean than mnFCM's.

The published centers are in the domain's original units; the weights are the estimated cluster
shares (mean memberships for the fuzzy algorithms, which lean towards 1/k when the noise dominates;
assignment shares for k-means) -- shares of the *noisy* points, so biased towards uniform at small
epsilon. The server's randomness (k-means++ seeds) is post-processing, seeded
from the campaign id so that a rerun publishes the same result.

Degenerate rounds finish with a warning and no centers (as the grid engine's empty
aggregation): no reports, or fewer reports than clusters.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, replace

import msgpack
import numpy as np
from numpy.typing import NDArray

from ldp_client.encoders.vectors import UnitCubeEncoder
from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms.discrete_laplace import MAX_GRID_BITS, DiscreteLaplaceParams
from ldp_client.payload import Integers
from ldp_client.spec import Component, GroupTask, RoundSpec

from ..errors import InvalidArgumentError
from ..estimation.accumulators import decode_report_payloads
from ..estimation.center_floor import drowned_centers_warning, floor_diagnostics, unit_to_data_variance
from ..estimation.fuzzy import DEFAULT_FUZZIFIER, MAX_FUZZIFIER, Distance, fuzzy_model, fuzzy_passes
from ..estimation.kmeans import (
    InMemory,
    PassSource,
    PointDecoder,
    Points,
    PointSample,
    PointStats,
    kmeans_passes,
    plus_plus_starts,
)
from ..model import CampaignConfig, CampaignState, Clustering, Result
from ..storage.base import StoredReport
from .base import (
    K_PARAM,
    NUMERIC,
    CampaignEngine,
    CliParam,
    Kind,
    KindCli,
    KindParams,
    RoundOutcome,
    RoundPlan,
    RoundReports,
    numeric_domain,
)
from .common import MAX_K, ProtoEnum, campaign_seed, check_report_epsilon

__all__ = [
    "KIND",
    "DEFAULT_ALGORITHM",
    "DEFAULT_GRID_BITS",
    "MAX_ITERATIONS",
    "N_INIT",
    "SEED_SAMPLE_SIZE",
    "LaplaceAlgorithm",
    "LaplaceEngine",
    "LaplaceFit",
    "LaplaceParams",
    "LaplacePoints",
    "cluster_points",
    "cluster_source",
    "decode_points",
]

#: ``grid_bits`` when unset (the mechanism's default; 0 cannot be told from unset in proto3).
DEFAULT_GRID_BITS = 10
#: Restarts of every algorithm (fresh k-means++ seeds; the lowest objective wins).
N_INIT = 3
#: Iterations per restart.
MAX_ITERATIONS = 300
#: Relative tolerance of the center shift (see :func:`ldp_collector.estimation.fuzzy.fuzzy_c_means`).
TOLERANCE = 1e-6
#: Reports of the round's sample the k-means++ seeds are drawn from (every report when fewer).
SEED_SAMPLE_SIZE = 1 << 16
#: The wire tag of an ``Integers`` payload (``ldp_client.payload``).
_INTEGERS_TAG = 4


def decode_points(batches: Iterable[list[StoredReport]], params: DiscreteLaplaceParams) -> NDArray[np.float64]:
    """The reports' noisy points in unit-cube units, ``(n, d)`` (integers over ``N = 2^grid_bits``).

    Each stored report is msgpack of ``[[4, [z_1 .. z_d]]]`` (one ``Integers`` payload, group 0).
    A batch is decoded in one go (msgpack, then a single integer array); a batch that does not fit
    that shape exactly is decoded report by report with the mechanism's own checks, so a bad
    report raises :class:`~ldp_client.errors.ProtocolError` naming it.
    """
    d = params.dimension
    parts: list[NDArray[np.int64]] = []
    for batch in batches:
        if not batch:
            continue
        values: NDArray[np.int64] | None = None
        try:
            wires = [msgpack.unpackb(r.payloads, raw=False) for r in batch]
            if all(r.group == 0 for r in batch) and all(len(w) == 1 and w[0][0] == _INTEGERS_TAG for w in wires):
                arr = np.array([w[0][1] for w in wires])
                if arr.dtype.kind == "i" and arr.shape == (len(batch), d):
                    values = arr.astype(np.int64, copy=False)
        except Exception:  # any surprise: the strict path below names the report
            values = None
        if values is None:
            decoded = decode_report_payloads(batch, {0: (params,)}).get("0:0", [])
            checked = [params.check_payload(p).values for p in decoded if isinstance(p, Integers)]
            if len(checked) != len(decoded):
                raise ProtocolError("discrete_laplace payloads must be Integers")
            values = np.array(checked, dtype=np.int64).reshape(len(checked), d)
        parts.append(values)
    if not parts:
        return np.zeros((0, d))
    out: NDArray[np.float64] = np.concatenate(parts).astype(np.float64) / float(params.grid_size)
    return out


class LaplacePoints(PointDecoder):
    """The decoding of a laplace round's reports into its noisy points (:func:`decode_points`), batch by batch."""

    def __init__(self, params: DiscreteLaplaceParams) -> None:
        self.params = params

    @property
    def key(self) -> Hashable:
        return ("laplace", self.params.dimension, self.params.grid_size)

    def decode(self, reports: Sequence[StoredReport]) -> Points:
        return Points(decode_points([list(reports)], self.params))


class LaplaceAlgorithm(ProtoEnum):
    """``ldp.v1.LaplaceParameters.Algorithm``: the clustering run on the noisy points."""

    ALGORITHM_UNSPECIFIED = 0
    KMEANS = 1
    FCM = 2
    MNFCM = 3


#: The algorithm of a campaign that sets none (module docstring: chosen on the benchmark's tuning seeds).
DEFAULT_ALGORITHM = LaplaceAlgorithm.FCM


@dataclass(frozen=True, kw_only=True, eq=False)
class LaplaceFit:
    """The clustering of the decoded points (:func:`cluster_points`), in unit-cube units.

    Attributes
    ----------
    centers : numpy.ndarray of shape (k, d)
    shares : numpy.ndarray of shape (k,)
        Estimated cluster shares of the noisy points: mean memberships (FCM, MNFCM) or assignment
        shares (KMEANS).
    iterations : int
        Center updates of the best restart.
    objective : float
        The algorithm's objective at the centers (the fuzzy ``J`` or the k-means cost).
    converged : bool
        Whether the best restart stopped on the tolerance (always True for KMEANS).
    """

    centers: NDArray[np.float64]
    shares: NDArray[np.float64]
    iterations: int
    objective: float
    converged: bool


def cluster_points(points: NDArray[np.float64], k: int, rng: np.random.Generator, *,
                   algorithm: LaplaceAlgorithm, fuzzifier: float, noise_scale: float,
                   in_cube: bool = True) -> LaplaceFit:
    """The server's clustering (:func:`cluster_source`) of decoded points held in memory (the benchmarks').

    Parameters
    ----------
    points : numpy.ndarray of shape (n, d)
        Decoded reports in unit-cube units (:func:`decode_points`), ``n >= k``; the k-means++ seeds
        are drawn from all of them.
    k, rng, algorithm, fuzzifier, noise_scale, in_cube
        As in :func:`cluster_source`.
    """
    x = np.asarray(points, dtype=np.float64)
    return cluster_source(InMemory(Points(x)), x, k, rng, algorithm=algorithm, fuzzifier=fuzzifier,
                          noise_scale=noise_scale, in_cube=in_cube)


def cluster_source(source: PassSource, sample: NDArray[np.float64], k: int, rng: np.random.Generator, *,
                   algorithm: LaplaceAlgorithm, fuzzifier: float, noise_scale: float, in_cube: bool = True,
                   decoder: PointDecoder | None = None, stats: PointStats | None = None) -> LaplaceFit:
    """The server's clustering of the decoded points (module docstring): one pass over ``source`` per iteration.

    Parameters
    ----------
    source : PassSource
        The decoded points: a round's reports (with their ``decoder``) or
        :class:`~ldp_collector.estimation.kmeans.InMemory` points.
    sample : numpy.ndarray of shape (m, d)
        Decoded points the k-means++ seeds are drawn from, ``m >= k`` (a sample of the round).
    k : int
    rng : numpy.random.Generator
        The k-means++ seeding (post-processing).
    algorithm : LaplaceAlgorithm
        KMEANS, FCM or MNFCM (resolved).
    fuzzifier : float
        ``m`` of the fuzzy algorithms (ignored by KMEANS).
    noise_scale : float
        ``sigma_0``, the Laplace scale of one decoded coordinate's noise (MNFCM's distance).
    in_cube : bool
        Keep the centers in the unit cube (the fuzzy algorithms clip after every update, k-means
        at the end); False: the algorithms as published, centers anywhere.
    decoder : PointDecoder, optional
        How ``source``'s reports decode (:class:`LaplacePoints`; None for points in memory).
    stats : PointStats, optional
        The statistics pass over ``source``, when the caller has made it.
    """
    d = sample.shape[1]
    if stats is None:
        stats = source.combine(PointStats(d, decoder))
    cube = (np.zeros(d), np.ones(d)) if in_cube else None
    starts = plus_plus_starts(sample, k, rng, N_INIT)
    if algorithm == LaplaceAlgorithm.KMEANS:
        km = kmeans_passes(source, starts, stats, decoder=decoder, max_iter=MAX_ITERATIONS, tol=TOLERANCE)
        shares = km.mass / stats.count
        return LaplaceFit(centers=np.clip(km.centers, 0.0, 1.0) if in_cube else km.centers, shares=shares,
                          iterations=km.iterations, objective=float(km.cost), converged=True)
    distance: Distance = "mixed" if algorithm == LaplaceAlgorithm.MNFCM else "euclidean"
    model = fuzzy_model(distance, fuzzifier, stats, noise_scale)
    fit = fuzzy_passes(source, starts, stats, model=model, max_iter=MAX_ITERATIONS, tol=TOLERANCE, bounds=cube,
                       decoder=decoder)
    return LaplaceFit(centers=fit.centers, shares=fit.shares, iterations=fit.iterations,
                      objective=float(fit.objective), converged=fit.converged)


@dataclass(frozen=True, kw_only=True)
class LaplaceParams(KindParams):
    """``ldp.v1.LaplaceParameters``; :meth:`resolve` fills the algorithm, the fuzzifier and ``grid_bits``.

    Attributes
    ----------
    k : int
        Number of clusters, in [1, 256] (required).
    algorithm : LaplaceAlgorithm
        UNSPECIFIED: :data:`DEFAULT_ALGORITHM` (FCM).
    fuzzifier : float
        FCM and MNFCM only, in (1, 100] (0 = 2).
    grid_bits : int
        Bits per coordinate of the noised grid, in [1, 30] (0 = 10).
    """

    k: int = 0
    algorithm: LaplaceAlgorithm = LaplaceAlgorithm.ALGORITHM_UNSPECIFIED
    fuzzifier: float = 0.0
    grid_bits: int = 0

    def resolve(self, config: CampaignConfig) -> LaplaceParams:
        """The parameters with every default filled in (see :meth:`KindParams.resolve`).

        Raises
        ------
        InvalidArgumentError
            A categorical domain, epsilon above 20, ``k`` outside [1, 256], a fuzzifier not in
            (1, 100] (or set for KMEANS), ``grid_bits`` above 30, or an unknown algorithm.
        """
        numeric_domain(config, "laplace")
        check_report_epsilon(config.epsilon, "a laplace campaign")
        if not 1 <= self.k <= MAX_K:
            raise InvalidArgumentError(f"laplace.k must be in [1, {MAX_K}], got {self.k}")
        algorithm = self.algorithm or DEFAULT_ALGORITHM
        if algorithm not in (LaplaceAlgorithm.KMEANS, LaplaceAlgorithm.FCM, LaplaceAlgorithm.MNFCM):
            raise InvalidArgumentError(f"laplace.algorithm {algorithm} is not a known algorithm "
                                       f"(KMEANS, FCM or MNFCM)")
        fuzzifier = self.fuzzifier
        if algorithm == LaplaceAlgorithm.KMEANS:
            if fuzzifier != 0:
                raise InvalidArgumentError(
                    f"laplace.fuzzifier applies to the FCM and MNFCM algorithms only, got {fuzzifier!r} for KMEANS")
        else:
            fuzzifier = fuzzifier or DEFAULT_FUZZIFIER
            if not (math.isfinite(fuzzifier) and 1.0 < fuzzifier <= MAX_FUZZIFIER):
                raise InvalidArgumentError(f"laplace.fuzzifier must be in (1, {MAX_FUZZIFIER:g}], got {fuzzifier!r}")
        grid_bits = self.grid_bits or DEFAULT_GRID_BITS
        if not 1 <= grid_bits <= MAX_GRID_BITS:
            raise InvalidArgumentError(
                f"laplace.grid_bits must be in [1, {MAX_GRID_BITS}] (0 = the default {DEFAULT_GRID_BITS}), "
                f"got {grid_bits}")
        return replace(self, algorithm=algorithm, fuzzifier=fuzzifier, grid_bits=grid_bits)


class LaplaceEngine(CampaignEngine):
    """Engine of ``LAPLACE`` campaigns (module docstring).

    Parameters
    ----------
    campaign_id : str
    config : ldp.v1.CampaignConfig
        Validated by :func:`ldp_collector.campaigns.prepare_campaign`: a numeric domain.
    params : LaplaceParams
        Resolved (:meth:`LaplaceParams.resolve`): algorithm FCM, fuzzifier 2 for the fuzzy
        algorithms and grid_bits 10 unless set.

    Raises
    ------
    InvalidArgumentError
        A mechanism the SDK refuses.
    """

    params: LaplaceParams

    def __init__(self, campaign_id: str, config: CampaignConfig, params: LaplaceParams) -> None:
        super().__init__(campaign_id, config, params)
        self.domain = numeric_domain(config, "laplace")
        self.dimension = self.domain.dimension
        try:
            mechanism = DiscreteLaplaceParams(dimension=self.dimension, epsilon=config.epsilon,
                                              grid_bits=params.grid_bits)
            self.component = Component(encoder=UnitCubeEncoder(domain=self.domain), mechanism=mechanism)
        except InvalidParameterError as exc:
            raise InvalidArgumentError(f"laplace: {exc}") from None
        self.mechanism = mechanism

    @property
    def noise_scale(self) -> float:
        """``sigma_0``: the Laplace scale of one decoded coordinate's noise, in unit-cube units."""
        return math.sqrt(self.mechanism.noise_variance / 2.0)

    def first_round(self) -> RoundPlan:
        """Round 1 (the only one): everyone reports its noised, normalized point with the whole epsilon."""
        spec = RoundSpec(
            campaign_id=self.campaign_id, round=1, group_weights=(1,),
            tasks=(GroupTask(groups=(0,), components=(self.component,)),),
            campaign_epsilon=self.config.epsilon, max_reports_per_device=1, kind="laplace")
        return RoundPlan(spec=spec)

    def _seed(self) -> int:
        return campaign_seed(self.config, "laplace:")

    def _sample_salt(self) -> bytes:
        """Salt of the round's seeding sample: from the campaign seed, so a rerun draws the same sample."""
        return campaign_seed(self.config, "laplace:sample:").to_bytes(8, "little")

    def _to_original(self, unit: NDArray[np.float64]) -> NDArray[np.float64]:
        """Points of the unit cube in the domain's units."""
        lower = np.asarray(self.domain.lower, dtype=np.float64)
        upper = np.asarray(self.domain.upper, dtype=np.float64)
        out: NDArray[np.float64] = lower + unit * (upper - lower)
        return out

    def close_round(self, spec: RoundSpec, reports: RoundReports, engine_state: bytes) -> RoundOutcome:
        """Cluster the noisy points, one pass over the reports per iteration, and finish the campaign."""
        component = spec.tasks[0].components[0]
        mechanism = component.mechanism
        if not isinstance(mechanism, DiscreteLaplaceParams):
            raise ProtocolError(f"a laplace round must use discrete_laplace, got {mechanism.KIND}")
        decoder, salt = LaplacePoints(mechanism), self._sample_salt()
        d = mechanism.dimension
        stats = reports.combine(PointStats(d, decoder))
        n = stats.count
        p = self.params
        k = int(p.k)
        fuzzy = p.algorithm != LaplaceAlgorithm.KMEANS
        sigma0 = math.sqrt(mechanism.noise_variance / 2.0)
        warnings: list[str] = []
        diagnostics: dict[str, float] = {
            "reports": float(n), "epsilon": float(mechanism.epsilon),
            "epsilon_per_coordinate": float(mechanism.epsilon) / d, "noise_scale": sigma0,
            "noise_std": math.sqrt(mechanism.noise_variance), "grid_bits": float(mechanism.grid_bits),
            "algorithm": float(p.algorithm), "k": float(k),
        }
        if n == 0:
            warnings.append("the round received no reports: no centers published")
            result = Result(state=CampaignState.FINISHED, clustering=Clustering(dimension=d), warnings=tuple(warnings))
            return RoundOutcome(result=result, diagnostics=diagnostics)
        if n < k:
            # Best effort: with fewer reports than clusters, each decoded report is its own cluster's estimate,
            # in lexicographic order (an order every engine agrees on; the sample's is by keyed hash).
            points = reports.combine(PointSample(k, d, decoder, salt=salt)).finalize()
            points = points[np.lexsort(points.T[::-1])]
            warnings.append(f"the round received {n} reports, fewer than the k = {k} clusters: best-effort centers, "
                            f"the {n} decoded reports themselves")
            diagnostics["best_effort"] = 1.0
            clustering = Clustering(k=n, dimension=d, centers=tuple(self._to_original(np.clip(points, 0.0, 1.0))
                                                                   .reshape(-1).tolist()),
                                    weights=(1.0 / n,) * n)
            return RoundOutcome(result=Result(state=CampaignState.FINISHED, clustering=clustering,
                                              warnings=tuple(warnings)), diagnostics=diagnostics)
        if n < 10 * k:
            warnings.append(f"only {n} reports for k = {k} clusters: the centers are unreliable")
        sample = reports.combine(PointSample(SEED_SAMPLE_SIZE, d, decoder, salt=salt)).finalize()
        fit = cluster_source(reports, sample, k, np.random.default_rng(self._seed()), algorithm=p.algorithm,
                             fuzzifier=float(p.fuzzifier), noise_scale=sigma0, decoder=decoder, stats=stats)
        # Published in lexicographic order: restarts that reach the same centers in another order
        # tie in the objective up to the last bits, and which one wins must not reorder the result.
        order = np.lexsort(fit.centers.T[::-1])
        centers, shares = fit.centers[order], np.asarray(fit.shares)[order]
        diagnostics.update(iterations=float(fit.iterations), objective=fit.objective)
        if fuzzy:
            diagnostics.update(converged=float(fit.converged))
            if not fit.converged:
                warnings.append(f"{p.algorithm.name} stopped after {MAX_ITERATIONS} iterations "
                                f"without converging")
        fuzzifier = float(p.fuzzifier) if fuzzy else 0.0
        lower = np.asarray(self.domain.lower, dtype=np.float64)
        upper = np.asarray(self.domain.upper, dtype=np.float64)
        original = self._to_original(centers)
        # A center is (about) the mean of its share of the decoded points: the noise adds the mechanism's
        # variance divided by the points it pools (for FCM, its fuzzy share of n).
        counts = np.asarray(shares, dtype=np.float64) * n
        noise = np.divide(mechanism.noise_variance, counts, out=np.full_like(counts, np.inf), where=counts > 0)
        data_noise = unit_to_data_variance(noise, lower, upper, unit_width=1.0)
        if (drowned := drowned_centers_warning(data_noise, lower, upper)) is not None:
            warnings.append(drowned)
        diagnostics.update(floor_diagnostics(data_noise, counts, centers=original, lower=lower, upper=upper))
        clustering = Clustering(k=k, dimension=d, centers=tuple(original.reshape(-1).tolist()),
                                weights=tuple(shares.tolist()), fuzzifier=fuzzifier)
        result = Result(state=CampaignState.FINISHED, clustering=clustering, warnings=tuple(warnings))
        return RoundOutcome(result=result, diagnostics=diagnostics)


#: Command line: ``--k`` (the dataset's number of labels in a simulation when not given).
CLI = KindCli(result="clustering", params=(
    K_PARAM,
    CliParam(flag="--laplace-algorithm", field="algorithm", type="choice",
             choices=(("fcm", LaplaceAlgorithm.FCM), ("mnfcm", LaplaceAlgorithm.MNFCM), ("kmeans", LaplaceAlgorithm.KMEANS)),
             help="the server's clustering of the noisy points: fcm (default), mnfcm (papers/004) or kmeans"),
    CliParam(flag="--fuzzifier", field="fuzzifier", type="positive_float", metavar="M",
             help=f"the fuzzifier of fcm and mnfcm, in (1, {MAX_FUZZIFIER:g}] (default {DEFAULT_FUZZIFIER:g})"),
    CliParam(flag="--grid-bits", field="grid_bits", type="uint32", metavar="B",
             help=f"bits per coordinate of the noised grid, at most {MAX_GRID_BITS} (default {DEFAULT_GRID_BITS})")))

#: The LAPLACE campaign kind (registered by :mod:`ldp_collector.kinds.registry`).
KIND = Kind(name="laplace", engine=LaplaceEngine,
            params=LaplaceParams,
            domains=frozenset({NUMERIC}), clustering=True,
            cli=CLI)
