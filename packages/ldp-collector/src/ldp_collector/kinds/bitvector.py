"""BITVECTOR campaigns: kCluster bit-vector clustering in one round (DESIGN.md section 7.5).

Every device reports once, with the campaign's whole epsilon (the budget policy makes no
difference with a single round): its point encoded against public pivots
(:class:`~ldp_client.encoders.bitvector.BitVectorEncoder`) and randomized bit by bit
(:class:`~ldp_client.mechanisms.bitwise_randomized_response.BitwiseRRParams`) with sensitivity
``Delta`` = the encoder's exact largest Hamming distance, so each bit flips with probability
``1 / (1 + e^(epsilon / Delta))`` and the whole report is epsilon-LDP. Closing the round clusters
the debiased bit vectors in the encoded space (k-means by default, or DBSCAN) and decodes the
centers to the original units (:mod:`ldp_collector.estimation.bitvector`).

Public pivots and half-widths
    Per attribute ``j`` with range ``[lo_j, hi_j]`` and ``T`` = ``pivots_per_attribute``: the
    ``T`` bin centers ``r_(j,t) = lo_j + (t + 1/2) s_j``, ``s_j = (hi_j - lo_j) / T``, and
    ``theta_j = HALF_WIDTH_FACTOR * s_j`` with :data:`HALF_WIDTH_FACTOR` = 63/64. Each pivot's
    window ``[r - theta, r + theta]`` then overlaps each neighbour's by almost half its length:
    a point sets the bits of the one or two pivots nearest to it (two except within ``s / 64``
    of a pivot), so the Hamming distance of two points grows with their distance up to about
    ``2 s``, while an attribute contributes at most 4 to ``Delta`` (``Delta = 4 d``). A factor of
    exactly 1 would let a point sitting on a pivot also set both neighbours, raising ``Delta``
    to 6 per attribute for no gain; larger factors lengthen the linear range but raise
    ``Delta``, and the bit noise variance grows about as ``Delta^2``.
    The pivots depend on the public bounds only.

Parameters (``BitVectorParameters``)
    ``k`` in [2, 256] (required; for DBSCAN, the largest number of clusters published);
    ``pivots_per_attribute`` in [2, 64] with at most :data:`MAX_REPORT_BITS` bits in total
    (default :data:`DEFAULT_PIVOTS_PER_ATTRIBUTE`, chosen by ``benchmarks/bitvector_clustering.py``;
    fewer when the dimension would exceed the bit cap); ``algorithm`` KMEANS (default) or DBSCAN.

Result
    ``clustering``: the centers in the original units (row-major), each cluster's share of the
    reports as ``weights``. Diagnostics: the Hamming sensitivity, the flip probability, bits per
    report, the per-bit noise variance, the encoded-space cost, the sample's size and iterations
    and the passes over the round. Clustering randomness (the report sample, k-means++ seeding)
    is post-processing, derived from the campaign seed (:func:`~.common.campaign_seed`) so a close
    is reproducible.

The step (:mod:`ldp_collector.estimation.bitvector`)
    1. A sample of :data:`~ldp_collector.estimation.bitvector.KMEANS_SAMPLE` reports (``2^16``;
       DBSCAN: :data:`~ldp_collector.estimation.bitvector.DBSCAN_SAMPLE`), drawn by a keyed hash
       of the reports' contents (:class:`~ldp_collector.estimation.report_accumulator.ReportSample`:
       the same sample on every engine and on a repeated run whose devices sent the same bits
       under other ids), its rows in lexicographic order.
    2. k-means on the sample (k-means++, Lloyd, the EM refinement, best of 3 starts), or
       DBSCAN's core centroids.
    3. k-means: EM over the whole round from the sample's mixture, one
       :class:`~ldp_collector.estimation.bitvector.BitVectorPass` per iteration, until every center
       moves by less than :data:`~ldp_collector.estimation.bitvector.REFINE_STOP` (a tenth) of its
       standard error, at most :data:`~ldp_collector.estimation.bitvector.MAX_ROUND_PASSES` passes
       (a warning if that runs out); the last pass also counts each center's nearest reports (the
       weights) and the unbiased cost. DBSCAN: one pass assigns every report to the nearest core
       centroid.

Cost
    Memory, whatever n: the sample (``m`` stored reports and their ``m x B`` bits with float
    copies, about ``13 m B`` bytes: 34 MB at ``m = 2^16``, ``B = 40``), and a pass's state
    (``(2 B + 4) k + 3`` floats: centers and sums). In-process, the decoded bits of a round are
    also kept for the next passes up to ``RoundReports.decoded_cache_bytes`` (``n x B`` bytes;
    beyond, each pass reads the round again). Time: the sample's k-means plus a few passes over
    the round (at n = 1e5, d = 5, epsilon = 2: about 80 iterations on the sample and 10 to 17
    passes).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np

from ldp_client.encoders.bitvector import BitVectorEncoder
from ldp_client.errors import InvalidParameterError
from ldp_client.mechanisms.bitwise_randomized_response import BitwiseRRParams
from ldp_client.spec import Component, GroupTask, RoundSpec

from ..errors import InvalidArgumentError
from ..estimation.accumulators import component_params_from_spec, decode_report_payloads
from ..estimation.bitvector import (
    DBSCAN_SAMPLE,
    KMEANS_SAMPLE,
    REFINE_STOP,
    BitVectorClustering,
    BitVectorLayout,
    BitVectorPass,
    BitVectorPassSums,
    dbscan_cores,
    dbscan_on_round,
    decode_centers,
    decoded_center_variances,
    kmeans_encoded,
    public_pivots,
    refine_on_round,
    unpack_bit_payloads,
)
from ..estimation.center_floor import drowned_centers_warning, floor_diagnostics
from ..estimation.report_accumulator import ReportSample
from ..model import CampaignConfig, CampaignState, Clustering, Result
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
from .common import MAX_K, MIN_K, ProtoEnum, campaign_seed, check_report_epsilon

__all__ = [
    "KIND",
    "DEFAULT_PIVOTS_PER_ATTRIBUTE",
    "HALF_WIDTH_FACTOR",
    "MAX_PIVOTS_PER_ATTRIBUTE",
    "MAX_REPORT_BITS",
    "MIN_PIVOTS_PER_ATTRIBUTE",
    "BitVectorAlgorithm",
    "BitVectorEngine",
    "BitVectorParams",
    "layout_of",
]

log = logging.getLogger(__name__)

#: Pivots per attribute: allowed range and default. Measured with benchmarks/bitvector_clustering.py
#: (mixture, k = 4, n = 1e5, one seed; ARI / cost ratio at epsilon 1, 2, 4), d = 2:
#: T = 4: 0.61/11.4, 0.97/6.4, 1.00/1.8; T = 8: 0.48/25, 1.00/1.3, 1.00/1.1; T = 16: 0.65/30, 0.61/18, 1.00/1.0.
#: d = 10 (Delta = 40) is noise-bound for every T (ARI 0.46-0.92). 8 is the best at epsilon 2 and
#: close to the best at 4; coarser grids only help at epsilon 1, where no setting is good.
MIN_PIVOTS_PER_ATTRIBUTE = 2
MAX_PIVOTS_PER_ATTRIBUTE = 64
DEFAULT_PIVOTS_PER_ATTRIBUTE = 8
#: Largest report (bits = dimension x pivots per attribute): 512 bytes, and n x 4096 bytes at close.
MAX_REPORT_BITS = 4096
#: theta_j / s_j (module docstring).
HALF_WIDTH_FACTOR = 63 / 64
#: The round's one component: group 0's bit vector.
_KEY = "0:0"
#: Salt of the report sample's keyed hash, ahead of the campaign seed's 8 bytes.
_SAMPLE_SALT = b"bitvector-sample:"



def layout_of(encoder: BitVectorEncoder) -> BitVectorLayout:
    """The estimation layout of a published encoder (what the devices really used)."""
    return BitVectorLayout(lower=tuple(float(v) for v in encoder.domain.lower),
                           upper=tuple(float(v) for v in encoder.domain.upper),
                           pivots=encoder.attribute_pivots, half_widths=encoder.half_widths)


class BitVectorAlgorithm(ProtoEnum):
    """``ldp.v1.BitVectorParameters.Algorithm``: the clustering run on the estimated bit vectors."""

    ALGORITHM_UNSPECIFIED = 0
    KMEANS = 1
    DBSCAN = 2


@dataclass(frozen=True, kw_only=True)
class BitVectorParams(KindParams):
    """``ldp.v1.BitVectorParameters``; :meth:`resolve` fills the pivots and the algorithm.

    Attributes
    ----------
    k : int
        Number of clusters, in [2, 256] (required).
    pivots_per_attribute : int
        Pivots per attribute, in [2, 64] with at most 4096 bits in total (0 = ``min(8, 4096 // d)``).
    algorithm : BitVectorAlgorithm
        UNSPECIFIED: KMEANS.
    """

    k: int = 0
    pivots_per_attribute: int = 0
    algorithm: BitVectorAlgorithm = BitVectorAlgorithm.ALGORITHM_UNSPECIFIED

    def resolve(self, config: CampaignConfig) -> BitVectorParams:
        """The parameters with every default filled in (see :meth:`KindParams.resolve`).

        Raises
        ------
        InvalidArgumentError
            A categorical domain, epsilon outside (0, 20], ``k`` outside [2, 256],
            ``pivots_per_attribute`` outside [2, 64] or above 4096 bits in total, an unknown algorithm.
        """
        d = numeric_domain(config, "bitvector").dimension
        check_report_epsilon(config.epsilon, "a bitvector campaign")
        if not MIN_K <= self.k <= MAX_K:
            raise InvalidArgumentError(f"bitvector.k must be in [{MIN_K}, {MAX_K}], got {self.k}")
        cap = MAX_REPORT_BITS // d
        pivots = self.pivots_per_attribute or min(DEFAULT_PIVOTS_PER_ATTRIBUTE, cap)
        high = min(MAX_PIVOTS_PER_ATTRIBUTE, cap)
        if not MIN_PIVOTS_PER_ATTRIBUTE <= pivots <= high:
            raise InvalidArgumentError(
                f"bitvector.pivots_per_attribute must be in [{MIN_PIVOTS_PER_ATTRIBUTE}, {high}] "
                f"(at most {MAX_PIVOTS_PER_ATTRIBUTE}, and at most {MAX_REPORT_BITS} bits in {d} dimensions), "
                f"got {pivots}")
        algorithm = self.algorithm or BitVectorAlgorithm.KMEANS
        if algorithm not in (BitVectorAlgorithm.KMEANS, BitVectorAlgorithm.DBSCAN):
            raise InvalidArgumentError(f"bitvector.algorithm {algorithm} is not KMEANS or DBSCAN")
        return replace(self, pivots_per_attribute=pivots, algorithm=algorithm)


class BitVectorEngine(CampaignEngine):
    """Engine of ``BITVECTOR`` campaigns (module docstring).

    Parameters
    ----------
    campaign_id : str
    config : ldp.v1.CampaignConfig
        Validated by :func:`ldp_collector.campaigns.prepare_campaign`: a numeric domain.
    params : BitVectorParams
        Resolved (:meth:`BitVectorParams.resolve`): pivots per attribute and the algorithm filled in.

    Raises
    ------
    InvalidArgumentError
        A bit vector or mechanism the SDK refuses.
    """

    params: BitVectorParams

    def __init__(self, campaign_id: str, config: CampaignConfig, params: BitVectorParams) -> None:
        super().__init__(campaign_id, config, params)
        domain = numeric_domain(config, "bitvector")
        layout = public_pivots(domain.lower, domain.upper, params.pivots_per_attribute, HALF_WIDTH_FACTOR)
        try:
            encoder = BitVectorEncoder(domain=domain, pivots=tuple(p for ps in layout.pivots for p in ps),
                                       pivots_per_attribute=(params.pivots_per_attribute,) * domain.dimension,
                                       half_widths=layout.half_widths)
            mechanism = BitwiseRRParams(length=encoder.output_size, epsilon=config.epsilon,
                                        sensitivity=max(1, encoder.max_hamming_distance))
            self.component = Component(encoder=encoder, mechanism=mechanism)
        except InvalidParameterError as exc:
            raise InvalidArgumentError(f"bitvector: {exc}") from None

    def first_round(self) -> RoundPlan:
        """Round 1: group 0 (everyone) reports its randomized bit vector with the campaign's epsilon."""
        spec = RoundSpec(
            campaign_id=self.campaign_id, round=1, group_weights=(1,),
            tasks=(GroupTask(groups=(0,), components=(self.component,)),),
            campaign_epsilon=self.config.epsilon, max_reports_per_device=1, kind="bitvector")
        return RoundPlan(spec=spec)

    def _seed(self) -> int:
        return campaign_seed(self.config)

    def close_round(self, spec: RoundSpec, reports: RoundReports, engine_state: bytes) -> RoundOutcome:
        """Cluster the debiased reports in the encoded space, decode the centers, finish the campaign."""
        component = spec.tasks[0].components[0]
        encoder, mechanism = component.encoder, component.mechanism
        if not isinstance(encoder, BitVectorEncoder) or not isinstance(mechanism, BitwiseRRParams):
            raise TypeError(f"round {spec.round} of a bitvector campaign has a {encoder.KIND}/{mechanism.KIND} component")
        params_by_group = component_params_from_spec(spec)
        algorithm = self.params.algorithm
        # The start (k-means++, Lloyd, the first EM iterations) or DBSCAN's cores come from a sample
        # drawn by content, the same on every engine; only the last passes read the whole round.
        size = DBSCAN_SAMPLE if algorithm == BitVectorAlgorithm.DBSCAN else KMEANS_SAMPLE
        sample = reports.combine(ReportSample(_SAMPLE_SALT + self._seed().to_bytes(8, "little"), size)).finalize()
        bits = unpack_bit_payloads(decode_report_payloads(sample, params_by_group).get(_KEY, []), mechanism.length)
        # In a canonical order (rows sorted lexicographically), whatever the ids: the clustering of a
        # round that fits in the sample depends on its reports' bits only, and a repeated campaign
        # (the same reports under other ids) repeats it.
        bits = bits[np.lexsort(bits.T[::-1])]

        def passes(accumulator: BitVectorPass) -> BitVectorPassSums:
            return reports.combine(accumulator).finalize()

        layout = layout_of(encoder)
        k = int(self.params.k)
        warnings: list[str] = []
        clustering = Clustering(dimension=layout.dimension)
        diagnostics = {
            "epsilon": float(mechanism.epsilon),
            "realized_epsilon": float(mechanism.realized_epsilon),
            "hamming_sensitivity": float(mechanism.sensitivity),
            "flip_probability": float(mechanism.p_flip),
            "bits_per_report": float(mechanism.length),
            "bit_variance": float(mechanism.bit_variance),
            "pivots_per_attribute": float(self.params.pivots_per_attribute),
            "half_width_factor": float(HALF_WIDTH_FACTOR),
            "sample_reports": float(len(bits)),
        }
        n = 0
        if len(bits) == 0:
            warnings.append("the round received no reports: no clustering")
        else:
            # The sample holds every report of a round smaller than it, so n < k shows here.
            if len(bits) < k:
                warnings.append(f"only {len(bits)} reports for k = {k} clusters: clustering into {len(bits)}")
            kk = min(k, len(bits))
            fit: BitVectorClustering
            if algorithm == BitVectorAlgorithm.DBSCAN:
                cores = dbscan_cores(bits, kk, p_flip=mechanism.p_flip, p_keep=mechanism.p_keep)
                fit = dbscan_on_round(cores, passes, width=mechanism.length, p_flip=mechanism.p_flip,
                                      p_keep=mechanism.p_keep, component_params_by_group=params_by_group, key=_KEY)
            else:
                start = kmeans_encoded(bits, kk, p_flip=mechanism.p_flip, p_keep=mechanism.p_keep, rng=self._seed())
                assert start.mixture is not None  # refined by default
                diagnostics["sample_iterations"] = float(start.iterations)
                fit, converged = refine_on_round(start.mixture, passes, p_flip=mechanism.p_flip,
                                                 p_keep=mechanism.p_keep, component_params_by_group=params_by_group,
                                                 key=_KEY)
                if not converged:
                    warnings.append(f"the EM refinement over the round stopped after {fit.iterations} passes "
                                    f"with its centers still moving by {REFINE_STOP:g} standard errors or more")
            n = int(fit.sizes.sum())
            keep = fit.sizes > 0
            if int(keep.sum()) < kk:
                reason = ("DBSCAN's core links over noisy reports merge clusters; kmeans is the algorithm for noisy "
                          "bits" if algorithm == BitVectorAlgorithm.DBSCAN else "the others hold no report")
                warnings.append(f"only {int(keep.sum())} clusters found for k = {k}: {reason}")
            centers = decode_centers(fit.centers[keep], layout)
            clustering = replace(clustering, k=len(centers), centers=tuple(centers.ravel().tolist()),
                                 weights=tuple((fit.sizes[keep] / n).tolist()))
            variances = decoded_center_variances(fit.centers[keep], fit.sizes[keep], layout,
                                                 float(mechanism.bit_variance), np.random.default_rng((self._seed(), 1)))
            if (drowned := drowned_centers_warning(variances, layout.lower, layout.upper)) is not None:
                warnings.append(drowned)
            diagnostics.update(floor_diagnostics(variances, fit.sizes[keep], centers=centers, lower=layout.lower,
                                                  upper=layout.upper))
            diagnostics["encoded_cost"] = fit.cost
            diagnostics["encoded_cost_per_report"] = fit.cost / n
            diagnostics["round_passes"] = float(fit.iterations)
            diagnostics["iterations"] = diagnostics.get("sample_iterations", 0.0) + fit.iterations
            diagnostics["clusters"] = float(len(centers))
        diagnostics["reports"] = float(n)
        result = Result(state=CampaignState.FINISHED, clustering=clustering, warnings=tuple(warnings))
        return RoundOutcome(result=result, diagnostics=diagnostics)


#: Command line: ``--k`` (the dataset's number of labels in a simulation when not given).
CLI = KindCli(result="clustering", params=(
    K_PARAM,
    CliParam(flag="--bitvector-algorithm", field="algorithm", type="choice",
             choices=(("kmeans", BitVectorAlgorithm.KMEANS), ("dbscan", BitVectorAlgorithm.DBSCAN)),
             help="the clustering of the estimated bit vectors: kmeans (default) or dbscan (kCluster's density option)"),
    CliParam(flag="--pivots", field="pivots_per_attribute", type="uint32", metavar="T",
             help=f"pivots (bits) per attribute, in [{MIN_PIVOTS_PER_ATTRIBUTE}, {MAX_PIVOTS_PER_ATTRIBUTE}] "
                  f"(default {DEFAULT_PIVOTS_PER_ATTRIBUTE}, fewer when the bits would pass {MAX_REPORT_BITS})")))

#: The BITVECTOR campaign kind (registered by :mod:`ldp_collector.kinds.registry`).
KIND = Kind(name="bitvector", engine=BitVectorEngine,
            params=BitVectorParams,
            domains=frozenset({NUMERIC}), clustering=True,
            cli=CLI)
