"""STEMMER campaigns: Stemmer-style LDP k-means in a constant number of rounds (DESIGN.md §7.3).

The survey's Algorithm 4 (``papers/000``, §3.2.1; Stemmer, SODA 2020) turned into a protocol of
three or four rounds. Public randomness: ``R = repetitions`` JL projections (to ``d' =
projection_dimension``) and random shifts, one per repetition; the LSH key of a point at scale
``j`` in repetition ``r`` is its cell in the level-``j`` randomly shifted dyadic grid of
repetition ``r`` (cell side ``4 R_r 2^-j`` in projected units: radii halving with the scale).
Device subgroups ``(r, j)``, ``S = R J`` of them, split the work of rounds A and B.

Rounds
    A. **Heavy keys**: subgroup ``(r, j)`` reports its level-``j`` cell of repetition ``r`` with the
       variance-optimal frequency oracle. The server grows one prefix tree per repetition (the
       level-``j`` cells nest in the level-``j - 1`` cells: ``parent = child >> d'``), keeping the
       cells above ``tau_1 = max(z sigma, n / (4 k))`` (:func:`~ldp_collector.estimation.net_tree.
       grow_tree`); the kept cells at every level are the heavy keys of that scale.
    B. **Bucket means**: subgroup ``(r, j)`` reports the bucketized vector ``(2t - 1, 1)`` of its
       point bucketed by the same key (:mod:`ldp_collector.estimation.vector_sum`). For every heavy
       key the server estimates the bucket's vector sum; the candidate center is the sum divided
       by the key's count (round A's estimate rescaled to the subgroup). A small key's candidate is
       mostly noise (every report adds noise to every bucket: per coordinate ``n_B M / count^2``), so
       each candidate keeps only the positive-part James-Stein share of its offset from the
       candidates' centroid (weighted by round A's shares) that its own noise allows
       (:func:`~ldp_collector.estimation.vector_sum.shrink_toward_centroid`); at epsilon = infinity
       nothing moves.
    C. **Weights**: every device reports the index of its nearest candidate (a
       :class:`~ldp_client.encoders.nearest.NearestCandidateEncoder` over the candidates, the
       variance-optimal oracle over their number). Candidates whose weight does not pass
       ``z sigma_C`` (Bonferroni over the candidates) are dropped (the devices that chose them are
       few: the re-assignment of Algorithm 4 moves their weight to the nearest kept candidate).
       The server then runs D^2-weighted (k-means++) selection with ``RESTARTS`` restarts followed by
       weighted Lloyd on the private coreset (candidates, weights): k centers, each the weighted
       mean of the candidates it owns.
    D. **Lloyd refinement** (``lloyd_refinement``, on unless set to false; at epsilon = infinity it
       takes the cost ratio from 1.01-1.49 to 1.000 on mixtures d = 10, k = 8): every device reports its bucketized vector
       ``(2t - 1, 1)`` bucketed by the index of its nearest center (the round-C centers are public
       in the spec). The bucket sums give every center's sum and count directly, so this Lloyd
       step costs one vector report per device and no label. (LDPKmeans's GRR label plus a fresh
       vector has, per center, about ``q / (p - q)^2`` times the variance at the label's and the
       vector's split epsilons: 9 times more at k = 8, epsilon = 2.) A center moves only when its
       count passes ``LLOYD_MIN_COUNT_Z`` standard errors, toward the mean of its devices (a Lloyd
       step, :func:`~ldp_collector.estimation.vector_sum.lloyd_move`: the coreset's centers are
       only where the assignment comes from), taking the James-Stein share of the step that its
       noise allows: a step within the noise of the mean is mostly not taken.

Budget policies
    ``PARTITION`` (default): the groups of rounds A and B are ``S`` subgroups each, C and D one group
    each; group shares A / B / C / D = 0.25 / 0.25 / 0.15 / 0.35 (0.3 / 0.45 / 0.25 without D).
    Every device reports once with the whole epsilon. ``SPLIT``: ``S`` groups, every device reports
    in every round with ``epsilon / rounds`` (its group is its subgroup in rounds A and B).

Memory of the server steps
    No step holds its round. Round A's subgroups on GRR or unary encoding (the coarse scales) are
    counted at ingestion (``accumulate_fn``: ``2^(j d')`` int64 counts per subgroup); each local-
    hashing subgroup's candidates are counted by a support pass (``SupportCounts``: ``m + 1`` int64
    for the ``m <= 2^d' MAX_KEYS_PER_LEVEL`` children tested at a level), one pass per (repetition,
    scale) grown; all of them share one decoding, so in-process the round is decoded once and later
    passes replay it (``DecodedPass``, within ``RoundReports.decoded_cache_bytes``). Rounds B and D
    sum bucketized vectors per key or center (``(m + 2)(d + 1)`` float64, ``BucketSumAccumulator``),
    round C counts like round A.

A public seed pool
    With ``seed_pool_size`` S > 0, round A's local-hashing scales take their seeds from one public
    pool of S seeds (``docs/protocol.md`` §14; round 1's key,
    :func:`~ldp_collector.kinds.common.seed_pool_key`): their accumulators keep S x g counts at
    ingestion, so round A reads no raw report at close and each level's supports cost S x m hashes
    instead of n_(r, j) x m. The pool adds variance (§14.6): choose S with
    :func:`ldp_client.mechanisms.local_hashing.seed_pool_size_for` for a subgroup's size and the
    concentration of its cells.

Thresholds and the multiple-testing correction
    With ``m`` keys tested at a level and family-wise rate ``alpha = 0.05``, ``z = Phi^-1(1 - alpha /
    (2 m))`` (Bonferroni, per level and repetition); ``threshold_z`` replaces it by a fixed value.
    The mass floor ``n / (4 k)`` keeps the per-level key lists short (at most ``4 k`` keys carry that
    mass) whatever the noise.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ldp_client.budget import MAX_MECHANISM_EPSILON, equal_share
from ldp_client.encoders.bucketed import BucketedVectorEncoder
from ldp_client.encoders.lsh import ShiftedGridEncoder
from ldp_client.encoders.nearest import NearestCandidateEncoder
from ldp_client.encoders.projection import RandomProjection
from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import GRRParams, LocalHashingParams, UnaryEncodingParams, choose_frequency_oracle
from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams
from ldp_client.spec import Component, GroupTask, RoundSpec

from ..errors import InvalidArgumentError
from ..estimation.accumulators import component_params_from_spec, make_accumulate_fn
from ..estimation.center_floor import floor_diagnostics, unit_to_data_variance
from ..estimation.frequency import estimate_from_support
from ..estimation.heavy_hitters import bonferroni_z
from ..estimation.kmeans import assign, weighted_kmeans
from ..estimation.net_tree import NetTreeLayout, grow_tree
from ..estimation.report_accumulator import AccumulatorGroup
from ..estimation.vector_sum import BucketSumAccumulator, lloyd_move, shrink_toward_centroid
from ..model import BudgetPolicy, CampaignConfig, CampaignState, Clustering, Result
from ..storage.base import AccumulateFn
from ._lsh import (
    VECTOR_SHAPE_PARAM,
    VectorShapeParam,
    check_vector_shape,
    exact_counts,
    exact_sums,
    grow_best_effort,
    lsh_nodes,
    vector_shape,
)
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
    load_state,
    numeric_domain,
    pack_state,
)
from .common import (
    DEFAULT_CONFIDENCE,
    MAX_K,
    MAX_PAYLOAD_BITS,
    MIN_K,
    allowed_oracles,
    campaign_seed,
    check_seed_pool_size,
    with_seed_pool,
)
from .histogram import aggregator_for, round_aggregators

__all__ = ["DEFAULT_REPETITIONS", "DEFAULT_SCALES", "ExactInputs", "StemmerEngine", "StemmerParams", "noiseless_outcome"]

DEFAULT_SCALES = 6
DEFAULT_REPETITIONS = 2
MAX_SCALES = 16
MAX_REPETITIONS = 8
DEFAULT_PROJECTION = 4
MAX_PROJECTION = 6
FALSE_POSITIVE_RATE = 0.05
MAX_KEYS_PER_LEVEL = 256
#: Restarts of the D^2 selection (k-means++ seeding + weighted Lloyd) on the coreset.
RESTARTS = 20
#: Group shares of rounds A, B, C, D under PARTITION (with and without the Lloyd round).
SHARES_WITH_LLOYD = (0.25, 0.25, 0.15, 0.35)
SHARES_WITHOUT_LLOYD = (0.30, 0.45, 0.25)
_PHASES = ("keys", "means", "weights", "lloyd")


@dataclass(frozen=True, kw_only=True)
class StemmerParams(KindParams):
    """``ldp.v1.StemmerParameters``; :meth:`resolve` fills every field but ``threshold_z``.

    Attributes
    ----------
    k : int
        Number of clusters, in [2, 256] (required).
    projection_dimension : int
        In [1, min(d, 6)] (0 = ``min(d, 4)``).
    scales : int
        In [1, 16] with ``scales x projection_dimension <= 62`` (0 = 6).
    repetitions : int
        In [1, 8] (0 = 2).
    threshold_z : float
        Significance of the heavy-key test, in (0, 20] (0 = Bonferroni, left as 0).
    lloyd_refinement : bool or None
        Round D (one Lloyd step from bucketized vectors by nearest center); ``None`` (unset) = on.
    vector_shape : VectorShapeParam
        The bucketized vectors' randomizer: L2_BALL, BOX or PRIVUNIT (UNSPECIFIED: the one of least
        error per report, :func:`~ldp_collector.kinds._lsh.vector_shape`, left unspecified by :meth:`resolve`).
    seed_pool_size : int
        The key round's local-hashing scales draw their seeds from a public pool of this many seeds
        (``docs/protocol.md`` §14), at most ``MAX_SEED_POOL``; 0 = per-report seeds.
    """

    k: int = 0
    projection_dimension: int = 0
    scales: int = 0
    repetitions: int = 0
    threshold_z: float = 0.0
    lloyd_refinement: bool | None = None
    vector_shape: VectorShapeParam = VectorShapeParam.SHAPE_UNSPECIFIED
    seed_pool_size: int = 0

    def resolve(self, config: CampaignConfig) -> StemmerParams:
        """The parameters with every default filled in (see :meth:`KindParams.resolve`).

        Raises
        ------
        InvalidArgumentError
            A categorical domain, or a parameter out of range.
        """
        d = numeric_domain(config, "stemmer").dimension
        if not MIN_K <= self.k <= MAX_K:
            raise InvalidArgumentError(f"stemmer.k must be in [{MIN_K}, {MAX_K}], got {self.k}")
        projection_dimension = self.projection_dimension or min(d, DEFAULT_PROJECTION)
        if not 1 <= projection_dimension <= min(d, MAX_PROJECTION):
            raise InvalidArgumentError(f"stemmer.projection_dimension must be in [1, min(d, {MAX_PROJECTION})] = "
                                       f"[1, {min(d, MAX_PROJECTION)}], got {projection_dimension}")
        scales = self.scales or DEFAULT_SCALES
        if not 1 <= scales <= MAX_SCALES or scales * projection_dimension > 62:
            raise InvalidArgumentError(f"stemmer.scales must be in [1, {MAX_SCALES}] with scales x projection_dimension "
                                       f"<= 62, got {scales} x {projection_dimension}")
        repetitions = self.repetitions or DEFAULT_REPETITIONS
        if not 1 <= repetitions <= MAX_REPETITIONS:
            raise InvalidArgumentError(f"stemmer.repetitions must be in [1, {MAX_REPETITIONS}], got {repetitions}")
        z = self.threshold_z
        if z != 0 and not (math.isfinite(z) and 0 < z <= 20):
            raise InvalidArgumentError(f"stemmer.threshold_z must be in (0, 20] (0 = Bonferroni), got {z!r}")
        check_vector_shape(self.vector_shape, "stemmer")
        check_seed_pool_size(self.seed_pool_size, config, "stemmer.seed_pool_size")
        return replace(self, projection_dimension=projection_dimension, scales=scales, repetitions=repetitions,
                       lloyd_refinement=True if self.lloyd_refinement is None else self.lloyd_refinement)


class StemmerEngine(CampaignEngine):
    """Engine of ``STEMMER`` campaigns (module docstring).

    Parameters
    ----------
    campaign_id : str
    config : ldp.v1.CampaignConfig
        Validated by :func:`ldp_collector.campaigns.prepare_campaign`: a numeric domain.
    params : StemmerParams
        Resolved (:meth:`StemmerParams.resolve`): ``projection_dimension`` (``min(d, 4)``),
        ``scales`` (6), ``repetitions`` (2) and ``lloyd_refinement`` (on; round D) filled in.

    Raises
    ------
    InvalidArgumentError
        Epsilon outside (0, 20] per report, or an encoder or mechanism the SDK refuses.
    """

    params: StemmerParams

    def __init__(self, campaign_id: str, config: CampaignConfig, params: StemmerParams) -> None:
        super().__init__(campaign_id, config, params)
        self.domain = numeric_domain(config, "stemmer")
        d = self.dimension = self.domain.dimension
        p = params
        self.lloyd = bool(p.lloyd_refinement)
        self.split = config.budget_policy == BudgetPolicy.SPLIT
        self.rounds = 4 if self.lloyd else 3
        epsilon = config.epsilon
        self.round_epsilon = equal_share(epsilon, self.rounds) if self.split else epsilon
        if not (math.isfinite(epsilon) and 0.0 < self.round_epsilon <= MAX_MECHANISM_EPSILON):
            raise InvalidArgumentError(f"stemmer: each report's epsilon must be in (0, {MAX_MECHANISM_EPSILON:g}], got "
                                       f"{self.round_epsilon:g} (epsilon {epsilon:g})")
        self.subgroups = p.repetitions * p.scales
        seed = self._seed()
        dp = p.projection_dimension
        self.layout = NetTreeLayout(levels=p.scales, child_bits=dp)
        try:
            projections = [None if dp == d else RandomProjection(input_dimension=d, output_dimension=dp,
                                                                    seed=(seed + 7919 * (r + 1)) % 2**64)
                           for r in range(p.repetitions)]
            self.keys = [[ShiftedGridEncoder(domain=self.domain, projection=projections[r], level=j,
                                             seed=(seed + 104729 * (r + 1)) % 2**64)
                          for j in range(1, p.scales + 1)] for r in range(p.repetitions)]
            eps = self.round_epsilon
            self.key_components = [Component(encoder=enc, mechanism=with_seed_pool(choose_frequency_oracle(
                1 << (level * dp), eps, MAX_PAYLOAD_BITS, oracles=allowed_oracles(config)), config, 1,
                p.seed_pool_size, "stemmer"))
                for reps in self.keys for level, enc in enumerate(reps, 1)]
            if p.seed_pool_size and not any(isinstance(c.mechanism, LocalHashingParams) for c in self.key_components):
                raise InvalidArgumentError(
                    "a stemmer seed pool needs local hashing, which no scale of the key round uses (its oracles "
                    f"are {', '.join(sorted({c.mechanism.KIND for c in self.key_components}))}); drop the seed pool")
            shape = vector_shape(d + 1, eps, p.vector_shape)
            self.vector_components = [Component(
                encoder=BucketedVectorEncoder(domain=self.domain, shifted_grid=enc),
                mechanism=BucketizedVectorParams(bucket_bits=level * dp, dimension=d + 1, epsilon=eps, shape=shape))
                for reps in self.keys for level, enc in enumerate(reps, 1)]
            self.vector_shape = shape
            # The floor adds a center's coordinates up: a report's mean second moment over them, which only
            # PrivUnit's worst-coordinate bound (the thresholds' M) overstates.
            inner = self.vector_components[0].mechanism
            assert isinstance(inner, BucketizedVectorParams)
            self._floor_ratio = inner.report_mean_second_moment / inner.report_second_moment
        except InvalidParameterError as exc:
            raise InvalidArgumentError(f"stemmer: {exc}") from None

    # -- layout -------------------------------------------------------------------------------------

    def _seed(self) -> int:
        return campaign_seed(self.config, "stemmer:")

    def _subgroup(self, index: int) -> tuple[int, int]:
        """``(r, j)`` (0-based repetition, 1-based scale) of subgroup ``index``."""
        return index // int(self.params.scales), index % int(self.params.scales) + 1

    def _weights(self) -> tuple[int, ...]:
        s = self.subgroups
        if self.split:
            return (1,) * s
        shares = SHARES_WITH_LLOYD if self.lloyd else SHARES_WITHOUT_LLOYD
        per = [shares[0] / s] * s + [shares[1] / s] * s + list(shares[2:])
        return tuple(max(1, round(w * 1_000_000)) for w in per)

    def _groups(self, phase: str) -> list[int]:
        """Groups reporting in ``phase`` (for A and B: in subgroup order)."""
        s = self.subgroups
        if self.split:
            return list(range(s))
        return {"keys": list(range(s)), "means": list(range(s, 2 * s)), "weights": [2 * s],
                "lloyd": [2 * s + 1]}[phase]

    def _spec(self, round_: int, tasks: Sequence[GroupTask]) -> RoundSpec:
        return RoundSpec(campaign_id=self.campaign_id, round=round_, group_weights=self._weights(), tasks=tuple(tasks),
                         campaign_epsilon=self.config.epsilon,
                         max_reports_per_device=self.rounds if self.split else 1, kind="stemmer")

    def share(self, phase: str) -> float:
        """Expected share of the population reporting in ``phase`` (``keys``, ``means``, ``weights``, ``lloyd``)."""
        if self.split:
            return 1.0
        w = self._weights()
        return sum(w[g] for g in self._groups(phase)) / sum(w)

    def first_round(self) -> RoundPlan:
        """Round A: subgroup (r, j) reports its level-j cell of repetition r."""
        tasks = [GroupTask(groups=(g,), components=(self.key_components[i],))
                 for i, g in enumerate(self._groups("keys"))]
        return RoundPlan(spec=self._spec(1, tasks), engine_state=pack_state("keys"))

    # -- server steps -------------------------------------------------------------------------------

    def close_round(self, spec: RoundSpec, reports: RoundReports, engine_state: bytes) -> RoundOutcome:
        state = load_state(engine_state, "stemmer", _PHASES)
        phase = state["phase"]
        if phase == "keys":
            return self._close_keys(spec, reports)
        if phase == "means":
            return self._close_means(spec, reports, state)
        if phase == "weights":
            return self._close_weights(spec, reports, state)
        return self._close_lloyd(spec, reports, state)

    def accumulate_fn(self, spec: RoundSpec) -> AccumulateFn | None:
        """Count accumulators at ingestion in the rounds of frequency oracles (A and C): GRR, unary-encoding
        and pooled local-hashing counts, per-report local hashing's report count. Rounds B and D sum
        vectors at close (their steps read no count), so they keep none."""
        params = component_params_from_spec(spec)
        if not any(isinstance(m, (GRRParams, UnaryEncodingParams, LocalHashingParams)) for ms in params.values() for m in ms):
            return None
        return make_accumulate_fn(params)

    def _close_keys(self, spec: RoundSpec, reports: RoundReports) -> RoundOutcome:
        p = self.params
        # Count accumulators (GRR, unary encoding, pooled local hashing) or one support pass per
        # (repetition, scale) asked (per-report local hashing): the round is never held in memory.
        found = round_aggregators(spec, reports)
        aggregators = {i: aggregator_for(found, spec, group=g) for i, g in enumerate(self._groups("keys"))}
        n = sum(a.n for a in aggregators.values())

        def estimate(r: int, level: int, candidates: NDArray[np.uint64]) -> tuple[NDArray[np.float64], float] | None:
            agg = aggregators[r * int(p.scales) + level - 1]
            if agg.n == 0:
                return None
            est = agg.estimate(DEFAULT_CONFIDENCE, candidates=candidates.astype(np.int64))
            scale = n / agg.n
            return np.asarray(est.counts, dtype=np.float64) * scale, est.zero_std_error * scale

        return self.keys_step(spec.round, n, estimate)

    def keys_step(self, round_: int, n: int,
                  estimate: Callable[[int, int, NDArray[np.uint64]], tuple[NDArray[np.float64], float] | None]
                  ) -> RoundOutcome:
        """Round A's server step on any source of key counts (``estimate(r, level, candidates)``)."""
        diagnostics: dict[str, float] = {"keys_reports": float(n)}
        warnings: list[str] = []
        heavy = self._heavy_keys(n, estimate, diagnostics, warnings, best_effort=False)
        if not heavy:
            # Nothing passed: the heaviest keys of every scale (at most k each) are still the best guess.
            explanation = "round A found no heavy key: the clusters are not detectable at this n and epsilon"
            heavy = self._heavy_keys(n, estimate, diagnostics, warnings, best_effort=True)
            if not heavy:
                diagnostics["heavy_keys"] = 0.0
                return self._finish_empty(diagnostics, warnings + [f"{explanation}; no centers published"])
            warnings.append(f"{explanation}; best-effort: rounds B and C measure the {len(heavy)} keys with the "
                            "largest estimated counts, which passed no threshold and may be noise")
            diagnostics["best_effort"] = 1.0
        diagnostics["heavy_keys"] = float(len(heavy))
        tasks = []
        for i, g in enumerate(self._groups("means")):
            tasks.append(GroupTask(groups=(g,), components=(self.vector_components[i],)))
        state = pack_state("means", heavy=heavy, diagnostics=diagnostics, warnings=warnings)
        return RoundOutcome(next_round=RoundPlan(spec=self._spec(round_ + 1, tasks), engine_state=state),
                            diagnostics=diagnostics)

    def _heavy_keys(self, n: int, estimate: Callable[[int, int, NDArray[np.uint64]],
                                                     tuple[NDArray[np.float64], float] | None],
                    diagnostics: dict[str, float], warnings: list[str], *, best_effort: bool) -> list[list[Any]]:
        """Round A's keys ``[r, j, node, share of round A's devices]`` over every repetition ``r`` and
        scale ``j``: those that pass the thresholds, or (``best_effort``) the ``k`` heaviest of each scale."""
        p = self.params
        k = int(p.k)
        heavy: list[list[Any]] = []
        for r in range(int(p.repetitions)):
            level_estimate = functools.partial(estimate, r)
            if best_effort:
                growth = grow_best_effort(level_estimate, self.layout, n_hat=float(max(n, 1)), k=k, width=k,
                                          prefix=f"best_effort_rep_{r}_")
            else:
                growth = grow_tree(level_estimate, self.layout, n_hat=float(max(n, 1)), k=k,
                                   alpha=FALSE_POSITIVE_RATE, max_nodes=MAX_KEYS_PER_LEVEL,
                                   z=float(p.threshold_z) or None, prefix=f"rep_{r}_")
                warnings.extend(w for w in growth.warnings if "no reports" in w)
            diagnostics.update(growth.diagnostics)
            for level, (nodes, counts) in growth.kept.items():
                key = f"heavy_keys_scale_{level}"
                diagnostics[key] = diagnostics.get(key, 0.0) + nodes.size
                heavy.extend([r, level, int(node), float(c) / max(n, 1)] for node, c in zip(nodes, counts))
        return heavy

    def _close_means(self, spec: RoundSpec, reports: RoundReports, state: dict[str, Any]) -> RoundOutcome:
        groups = self._groups("means")
        by_group = component_params_from_spec(spec)
        keys = {i: self._subgroup_keys(state["heavy"], i) for i in range(self.subgroups)}
        wanted = [i for i in range(self.subgroups) if keys[i].size]

        def accumulator(i: int) -> BucketSumAccumulator:
            params = self.vector_components[i].mechanism
            assert isinstance(params, BucketizedVectorParams)
            return BucketSumAccumulator(params, keys[i], by_group, (f"{groups[i]}:0",))

        # One pass over the reports into every subgroup's key sums: the round is never held in memory.
        found = dict(zip(wanted, reports.combine(AccumulatorGroup([accumulator(i) for i in wanted])).finalize()))

        def sums_for(i: int, nodes: NDArray[np.uint64]) -> tuple[NDArray[np.float64], float, int] | None:
            assert np.array_equal(nodes, keys[i])
            sums = found[i]
            if not sums.reports:
                return None
            return np.asarray(sums.sums, dtype=np.float64), float(sums.variance_bound), sums.reports

        return self.means_step(spec.round, state, sums_for)

    def _subgroup_keys(self, heavy: Sequence[Sequence[Any]], i: int) -> NDArray[np.uint64]:
        """The heavy keys of subgroup ``i`` (round A's kept cells of its repetition and scale), in order."""
        r, j = self._subgroup(i)
        return np.array([h[2] for h in heavy if h[0] == r and h[1] == j], dtype=np.uint64)

    def means_step(self, round_: int, state: dict[str, Any],
                   sums_for: Callable[[int, NDArray[np.uint64]], tuple[NDArray[np.float64], float, int] | None]
                   ) -> RoundOutcome:
        """Round B's server step on any source of bucket sums (``sums_for(subgroup, keys)``:
        the ``(m, d + 1)`` sums, their per-coordinate variance and the subgroup's reports)."""
        d = self.dimension
        heavy = state["heavy"]
        diagnostics = dict(state["diagnostics"])
        warnings = list(state["warnings"])
        n_b = 0
        candidates: list[list[float]] = []
        candidate_variances: list[float] = []
        candidate_shares: list[float] = []
        for i in range(self.subgroups):
            r, j = self._subgroup(i)
            keys = [h for h in heavy if h[0] == r and h[1] == j]
            got = sums_for(i, self._subgroup_keys(heavy, i)) if keys else None
            if got is None:
                continue
            sums, variance, reporters = got
            n_b += reporters
            for row, h in zip(sums, keys):
                expected = h[3] * reporters  # the key's share of round A times this subgroup's size
                if expected <= 0:
                    continue
                candidates.append((row[:d] / expected).tolist())
                candidate_variances.append(variance / expected**2)
                candidate_shares.append(float(h[3]))
        diagnostics["means_reports"] = float(n_b)
        diagnostics["candidates"] = float(len(candidates))
        if not candidates:
            return self._finish_empty(diagnostics, warnings + ["round B produced no candidate center"])
        # Each candidate is its key's noisy bucket mean; those whose noise rivals their distance from the others
        # are pulled toward the candidates' centroid (weighted by round A's shares), by their own noise.
        cand = np.clip(shrink_toward_centroid(np.asarray(candidates), self._floor_ratio * np.asarray(candidate_variances),
                                              np.asarray(candidate_shares)), -1.0, 1.0)
        if len(cand) < 2:  # nothing to weigh or choose from: publish the one candidate
            return self._finish(cand, np.ones(len(cand)), np.asarray(candidate_variances), diagnostics, warnings + [
                f"round B produced {len(cand)} candidate center for k = {self.params.k}: published as is"])
        encoder = NearestCandidateEncoder(domain=self.domain, dimension=d,
                                          centers=tuple(self._to_original(cand).ravel().tolist()))
        oracle = choose_frequency_oracle(len(cand), self.round_epsilon, MAX_PAYLOAD_BITS,
                                         oracles=allowed_oracles(self.config))
        tasks = [GroupTask(groups=tuple(self._groups("weights")),
                           components=(Component(encoder=encoder, mechanism=oracle),))]
        new_state = pack_state("weights", candidates=cand.ravel().tolist(), candidate_variances=candidate_variances,
                               diagnostics=diagnostics, warnings=warnings)
        return RoundOutcome(next_round=RoundPlan(spec=self._spec(round_ + 1, tasks), engine_state=new_state),
                            diagnostics=diagnostics)

    def _close_weights(self, spec: RoundSpec, reports: RoundReports, state: dict[str, Any]) -> RoundOutcome:
        m = len(state["candidates"]) // self.dimension
        component = spec.tasks[0].components[0]
        # The weight groups' count accumulators (local hashing: a support pass per group), pooled by
        # adding their integer supports: what one aggregator over all their reports would estimate.
        found = round_aggregators(spec, reports)
        parts = [found[key] for g in self._groups("weights") if (key := f"{g}:0") in found]
        n = sum(part.n for part in parts)
        if n == 0:
            return self.weights_step(spec.round, state, np.zeros(m), 0.0, 0)
        values = np.arange(m, dtype=np.int64)
        support = np.zeros(m, dtype=np.int64)
        for part in parts:
            support += part.support(values)
        est = estimate_from_support(component.mechanism, values, support, n, DEFAULT_CONFIDENCE)  # type: ignore[arg-type]
        return self.weights_step(spec.round, state, np.asarray(est.counts, dtype=np.float64)[:m],
                                 float(est.zero_std_error), n)

    def weights_step(self, round_: int, state: dict[str, Any], weights: NDArray[np.float64], zero_se: float,
                     reporters: int) -> RoundOutcome:
        """Round C's server step on any estimate of the candidates' weights (and its zero-count error)."""
        d, k = self.dimension, int(self.params.k)
        cand = np.asarray(state["candidates"], dtype=np.float64).reshape(-1, d)
        m = cand.shape[0]
        diagnostics = dict(state["diagnostics"])
        warnings = list(state["warnings"])
        diagnostics["weights_reports"] = float(reporters)
        if reporters == 0:
            # Best effort: round B's candidates survived; without weights, each counts the same.
            weights, keep = np.ones(m), np.ones(m, dtype=bool)
            warnings.append(f"round C received no reports: best-effort centers from round B's {m} candidates, "
                            "unweighted")
            diagnostics["best_effort"] = 1.0
        else:
            z = float(self.params.threshold_z) or bonferroni_z(max(m, 1), FALSE_POSITIVE_RATE)
            keep = weights > z * zero_se
        if keep.sum() < 1:
            keep = weights > 0
            if not keep.any():
                return self._finish_empty(diagnostics, warnings + [
                    "no candidate has a positive weight in round C: no centers published"])
            warnings.append(f"no candidate has a significant weight in round C: best-effort centers from the "
                            f"{int(keep.sum())} candidates with a positive weight estimate")
            diagnostics["best_effort"] = 1.0
        # Re-assignment (Algorithm 4): the weight of a dropped candidate moves to its nearest kept one.
        kept_idx = np.flatnonzero(keep)
        nearest = kept_idx[np.argmin(((cand[:, None, :] - cand[None, kept_idx, :]) ** 2).sum(axis=2), axis=1)]
        pooled = np.bincount(nearest, weights=np.clip(weights, 0.0, None), minlength=m)[kept_idx]
        coreset, coreset_w = cand[kept_idx], np.maximum(pooled, 1e-9)
        diagnostics.update(candidates_kept=float(kept_idx.size), coreset_weight=float(coreset_w.sum()))
        if reporters:
            diagnostics["coreset_weight_error"] = float(abs(coreset_w.sum() - reporters) / reporters)
        rng = np.random.default_rng(self._seed())
        kk = min(k, kept_idx.size)
        fit = weighted_kmeans(coreset, kk, rng, weights=coreset_w, n_init=RESTARTS)
        labels = fit.labels
        # The centers are the weighted means of their candidates (round-C weights). Pooling the
        # candidates' round-B sums instead weights them by round A's cell counts, and a coarse cell
        # that spans two clusters then drags its center: at epsilon = infinity (exact counts, sums and
        # weights, mixture d = 10, k = 8) pooling gave cost ratios 2.1-6.6, these means 1.01-1.49.
        centers = np.clip(fit.centers, -1.0, 1.0)
        # Each center's noise: the weighted mean of its candidates' round-B means (a state written before the
        # floor was reported has no candidate variances: the floor is then left out, never guessed).
        cand_var = np.asarray(state.get("candidate_variances", [math.inf] * m), dtype=np.float64)[kept_idx]
        owned = np.bincount(labels, weights=coreset_w, minlength=kk)
        center_variances = np.bincount(labels, weights=coreset_w**2 * cand_var, minlength=kk) / np.maximum(owned, 1e-300)**2
        if kk < k:
            warnings.append(f"only {kk} candidates passed the weight threshold for k = {k}: {kk} centers published")
        if not self.lloyd:
            return self._finish(centers, owned.astype(np.float64), center_variances, diagnostics, warnings)
        encoder = BucketedVectorEncoder(domain=self.domain, nearest=NearestCandidateEncoder(
            domain=self.domain, dimension=d, centers=tuple(self._to_original(centers).ravel().tolist())))
        mechanism = BucketizedVectorParams(bucket_bits=encoder.bucket_bits, dimension=d + 1,
                                           epsilon=self.round_epsilon, shape=self.vector_shape)
        tasks = [GroupTask(groups=tuple(self._groups("lloyd")),
                           components=(Component(encoder=encoder, mechanism=mechanism),))]
        new_state = pack_state("lloyd", centers=centers.ravel().tolist(), weights=owned.tolist(),
                               center_variances=center_variances.tolist(), diagnostics=diagnostics, warnings=warnings)
        return RoundOutcome(next_round=RoundPlan(spec=self._spec(round_ + 1, tasks), engine_state=new_state),
                            diagnostics=diagnostics)

    def _close_lloyd(self, spec: RoundSpec, reports: RoundReports, state: dict[str, Any]) -> RoundOutcome:
        kk = len(state["centers"]) // self.dimension
        (component,) = spec.tasks[0].components
        params = component.mechanism
        if not isinstance(params, BucketizedVectorParams):
            raise ProtocolError("the Lloyd round's component must be bucketized_vector")
        keys = tuple(f"{g}:0" for g in self._groups("lloyd"))
        sums = reports.combine(BucketSumAccumulator(params, np.arange(kk, dtype=np.uint64),
                                                    component_params_from_spec(spec), keys)).finalize()
        if not sums.reports:
            return self.lloyd_step(state, None, 0.0, 0)
        return self.lloyd_step(state, np.asarray(sums.sums, dtype=np.float64), float(sums.variance_bound),
                               sums.reports)

    def lloyd_step(self, state: dict[str, Any], sums: NDArray[np.float64] | None, variance: float,
                   reporters: int) -> RoundOutcome:
        """Round D's server step on any estimate of the per-center sums of ``(2t - 1, 1)``."""
        d = self.dimension
        previous = np.asarray(state["centers"], dtype=np.float64).reshape(-1, d)
        diagnostics = dict(state["diagnostics"])
        warnings = list(state["warnings"])
        diagnostics["lloyd_reports"] = float(reporters)
        centers = previous
        center_variances = np.asarray(state.get("center_variances", [math.inf] * len(previous)), dtype=np.float64)
        if sums is not None:
            move = lloyd_move(previous, sums, variance, moment_ratio=self._floor_ratio)
            centers, moved = move.centers, move.moved
            center_variances = np.where(moved, move.variances, center_variances)
            diagnostics.update(lloyd_centers_moved=float(moved.sum()),
                               lloyd_center_se_mean=float(np.sqrt(move.variances[moved]).mean()) if moved.any() else 0.0,
                               lloyd_step_taken_mean=float(move.shrink[moved].mean()) if moved.any() else 0.0)
        return self._finish(np.clip(centers, -1.0, 1.0), np.asarray(state["weights"], dtype=np.float64),
                            center_variances, diagnostics, warnings)

    # -- results ------------------------------------------------------------------------------------

    def _to_original(self, centered: NDArray[np.float64]) -> NDArray[np.float64]:
        lower = np.asarray(self.domain.lower, dtype=np.float64)
        upper = np.asarray(self.domain.upper, dtype=np.float64)
        out: NDArray[np.float64] = lower + np.clip((centered + 1.0) / 2.0, 0.0, 1.0) * (upper - lower)
        return out

    def _finish(self, centers: NDArray[np.float64], weights: NDArray[np.float64], variances: NDArray[np.float64],
                diagnostics: dict[str, float], warnings: list[str]) -> RoundOutcome:
        """Publish ``centers`` (``[-1, 1]`` units) with their weights and their noise floor from ``variances``
        (each center's per-coordinate noise variance, ``[-1, 1]`` units)."""
        w = np.clip(weights, 0.0, None)
        lower, upper = self.domain.lower, self.domain.upper
        diagnostics.update(floor_diagnostics(
            unit_to_data_variance(np.repeat(self._floor_ratio * np.asarray(variances, dtype=np.float64).reshape(-1, 1),
                                            self.dimension,
                                            axis=1), lower, upper, unit_width=2.0), w,
            centers=self._to_original(centers), lower=lower, upper=upper))
        clustering = Clustering(
            k=int(centers.shape[0]), dimension=self.dimension, centers=tuple(self._to_original(centers).ravel().tolist()),
            weights=tuple((w / w.sum() if w.sum() > 0 else np.full(w.size, 1.0 / w.size)).tolist()))
        result = Result(state=CampaignState.FINISHED, clustering=clustering, warnings=tuple(warnings))
        diagnostics["rounds"] = float(self.rounds)
        diagnostics["published_centers"] = float(centers.shape[0])
        return RoundOutcome(result=result, diagnostics=diagnostics)

    def _finish_empty(self, diagnostics: dict[str, float], warnings: list[str]) -> RoundOutcome:
        result = Result(state=CampaignState.FINISHED, clustering=Clustering(dimension=self.dimension),
                        warnings=tuple(warnings))
        return RoundOutcome(result=result, diagnostics=diagnostics)


class ExactInputs:
    """Every round's server-step input computed exactly from every device's point: what a round's
    reports estimate, without their noise (the steps' ``estimate``, ``sums_for``, weights and sums).

    Used by :func:`noiseless_outcome` for all four rounds, and by diagnoses that make some rounds exact
    and leave the others to the campaign's reports.
    """

    def __init__(self, engine: StemmerEngine, points: ArrayLike) -> None:
        x = np.asarray(points, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != engine.dimension:
            raise ValueError(f"points must be (n, {engine.dimension}), got {x.shape}")
        self.engine, self.points, self.n = engine, x, x.shape[0]
        lower = np.asarray(engine.domain.lower, dtype=np.float64)
        upper = np.asarray(engine.domain.upper, dtype=np.float64)
        self.rows = np.column_stack([2.0 * np.clip((x - lower) / (upper - lower), 0.0, 1.0) - 1.0, np.ones(self.n)])
        self._deep = [lsh_nodes(reps[-1], x) for reps in engine.keys]

    def _at(self, r: int, level: int) -> NDArray[np.uint64]:
        layout = self.engine.layout
        out: NDArray[np.uint64] = self._deep[r] >> np.uint64(layout.child_bits * (layout.levels - level))
        return out

    def key_counts(self, r: int, level: int, candidates: NDArray[np.uint64]) -> tuple[NDArray[np.float64], float]:
        """Round A's ``estimate``: the exact counts of ``candidates`` and a zero standard error."""
        return exact_counts(self._at(r, level), candidates), 0.0

    def bucket_sums(self, subgroup: int, keys: NDArray[np.uint64]) -> tuple[NDArray[np.float64], float, int]:
        """Round B's ``sums_for``: every device's ``(2t - 1, 1)`` summed by its key, no variance."""
        return exact_sums(self._at(*self.engine._subgroup(subgroup)), keys, self.rows), 0.0, self.n

    def candidate_weights(self, state: dict[str, Any]) -> NDArray[np.float64]:
        """Round C's weights: the devices nearest each of the state's candidates."""
        cand = self.engine._to_original(np.asarray(state["candidates"], dtype=np.float64).reshape(-1, self.engine.dimension))
        nearest, _ = assign(self.points, cand)
        return np.bincount(nearest, minlength=cand.shape[0]).astype(np.float64)

    def center_sums(self, state: dict[str, Any]) -> NDArray[np.float64]:
        """Round D's sums: every device's ``(2t - 1, 1)`` summed by its nearest center of the state."""
        d = self.engine.dimension
        centers = self.engine._to_original(np.asarray(state["centers"], dtype=np.float64).reshape(-1, d))
        nearest, _ = assign(self.points, centers)
        return np.column_stack([np.bincount(nearest, weights=self.rows[:, j], minlength=centers.shape[0])
                                for j in range(d + 1)]).astype(np.float64)


def noiseless_outcome(engine: StemmerEngine, points: ArrayLike) -> RoundOutcome:
    """Every round's server step on exact counts, sums and weights: the protocol at epsilon = infinity.

    Each round sees every device (as under ``SPLIT``, without noise); what remains is the
    algorithm's own approximation (heavy keys, candidates, the coreset, one Lloyd step).
    """
    exact = ExactInputs(engine, points)
    n = exact.n
    outcome = engine.keys_step(1, n, exact.key_counts)
    for round_ in (2, 3, 4):
        if outcome.next_round is None:
            return outcome
        state = load_state(outcome.next_round.engine_state, "stemmer", _PHASES)
        if state["phase"] == "means":
            outcome = engine.means_step(round_, state, exact.bucket_sums)
        elif state["phase"] == "weights":
            outcome = engine.weights_step(round_, state, exact.candidate_weights(state), 0.0, n)
        else:
            outcome = engine.lloyd_step(state, exact.center_sums(state), 0.0, n)
    return outcome


#: Command line: ``--k`` (the dataset's number of labels in a simulation when not given), the vectors'
#: shape and the key round's seed pool.
CLI = KindCli(result="clustering", params=(
    K_PARAM, VECTOR_SHAPE_PARAM,
    CliParam(flag="--seed-pool", field="seed_pool_size", type="uint32", metavar="S",
             help="the key round's local-hashing scales from a public pool of S seeds (docs/protocol.md §14; "
                  "0: per-report seeds)")))

#: The STEMMER campaign kind (registered by :mod:`ldp_collector.kinds.registry`).
KIND = Kind(name="stemmer", engine=StemmerEngine,
            params=StemmerParams,
            domains=frozenset({NUMERIC}), clustering=True,
            cli=CLI)
