"""LDP_KMEANS campaigns: the interactive LDPKmeans baseline (Xia et al. 2020; DESIGN.md §7.7).

Devices send a perturbed copy of their point once; then, for ``T = iterations`` rounds, the
server broadcasts its current ``k`` centers (a :class:`~ldp_client.encoders.nearest.
NearestCandidateEncoder`) and every device answers with the index of the center nearest to its
*true* point, randomized with GRR. The server debiases and moves the centers: Lloyd's algorithm
in which the assignment step runs on the devices.

Rounds
    1. **Initialize**: every reporting device sends one unbiased perturbed vector of its point.
       The server runs k-means++ (on a sample of the round) and Lloyd (:func:`ldp_collector.
       estimation.kmeans.kmeans_passes`, one pass over the reports per iteration) on the decoded vectors, which are already unbiased estimates of the
       points, so no further debiasing applies, and clips the centers to the domain box.
    2. .. T + 1. **Label round t**: the spec carries the centers of the previous round. A report
       holds two components: the GRR label of the nearest center (``k`` values) and a *fresh*
       perturbed vector of the same point. The server moves center ``j`` to the debiased mean of
       the vectors of the devices whose true label is ``j`` (below), or re-seeds it when too few
       devices chose it. The last round's centers are the result.

Why each label report carries a fresh vector
    Xia et al.'s server moves a center to the mean of the round-1 vectors of the users that
    reported its label, which needs a link from each label to the vector *of the same device*.
    Here nothing links reports: ``report_id`` is its creation second and 12 fresh random bytes per
    report (:func:`ldp_client.report.new_report_id`), and neither
    :class:`ldp_client.report.Report` nor the store (:class:`~ldp_collector.storage.base.
    StoredReport`) holds a device id or pseudonym; the group a device keeps is shared by
    thousands of devices. Three designs were weighed:

    (a) each label report also carries a fresh perturbed vector, so label and vector are
        linked *inside one report* (one :class:`~ldp_client.spec.GroupTask` with two
        components). Implementable with today's ``Report``. It is Xia et al.'s own extended
        mechanism, which perturbs the data and the intermediate cluster index in every
        iteration; it costs budget, paid by spreading the data budget over ``T + 1`` vectors.
    (b) a per-campaign device pseudonym linking one device's reports across rounds. Sound for
        privacy (every report is epsilon-LDP by itself and sequential composition already
        charges the sum), but it needs a new ``Report`` field, device-side pseudonym storage
        and a store column: a wire and SDK change, not available.
    (c) the unlinked round-1 vectors with debiased label counts only: the counts give each
        cluster's size but not its sum, so there is no unbiased center update.

    This engine implements (a). The update of label round t, with ``n`` reports, GRR
    probabilities ``p`` (truth) and ``q`` (each other value), reported labels ``y_i``, decoded
    vectors ``v_i`` (unbiased for the point ``x_i``, independent of ``y_i`` given ``x_i``), and
    true labels ``l_i``::

        E[sum_i ([y_i = j] - q) v_i] = (p - q) * sum_{i: l_i = j} x_i
        N_j = (C_j - n q) / (p - q)           (the GRR count estimate, C_j = #{y_i = j})
        S_j = (sum_{i: y_i = j} v_i - q * sum_i v_i) / (p - q)
        c_j = S_j / N_j                        (ratio of two unbiased estimates: consistent)

    A center whose estimated count is not significantly positive (``N_j <=``
    :data:`MIN_COUNT_Z` standard errors) has no usable mean. Before the last label round it is
    *re-seeded* (:func:`reseed_centers`): it splits the cell with the largest estimated count,
    starting :data:`SPLIT_FRACTION` times the gap to the nearest other significant center away
    from that cell's center, in a direction drawn from the engine's seeded generator; the next
    round's labels divide the cell between the two, and each moves to the debiased mean of its
    part (Linde, Buzo and Gray's splitting, with the assignment step on the devices). Only the
    published centers and the estimated counts are used. In the last label round such a center
    keeps its previous position (the result warns): a center re-seeded there would be published
    without a round of labels to validate it.

    Why: an insignificant center is rarely one of a small cluster; mostly nobody is nearest to
    it. Round 1 clusters decoded vectors, and a Duchi vector is a vertex of a box many times the
    domain's size (the box mechanism has ``2^d`` of them: four distinct vectors at ``d = 2``), so
    after clipping the round-1 centers sit on the domain's corners or coincide (ties go to the
    lower index). Such a center receives no labels, so without re-seeding it never moved and
    wasted one of the ``k`` clusters for the whole campaign: at ``n = 1e5``, ``k = 8`` (Gaussian
    ``mixture``, ``d`` = 2 and 10, epsilon 1, 2, 4, three seeds each, PARTITION) 2 to 6 of the 8
    centers were still frozen in the last round. With re-seeding, 0 to 5 are (0 to 2 at epsilon
    4); at epsilon 4 the median ARI went from 0.63 to 0.74 (``d = 2``) and from 0.43 to 0.91
    (``d = 10``), the median cost ratio from 3.2 to 1.9 and from 11.7 to 7.5. At epsilon 1 and
    2, where the noise of the debiased means dominates, the cost ratio fell in 9 of the 12 runs
    but rose in the three at ``d = 10``, epsilon 2 (whose median ARI still rose, 0.21 to 0.66).
    Measured on the same grid and not better: D^2 (k-means++) sampling among the round's decoded
    vectors (a sampled vertex, clipped, is a corner of the domain again; no gain), more round-1
    restarts (10; no gain: k-means cannot find mass among vertices), every center started near
    the estimated mean, splitting a cell drawn in proportion to its count or to count times gap
    squared, and a split fraction of 0.25. No denoised criterion on the vectors can locate the
    mass either: a box vector's coordinate takes two values whose law depends on the point only
    through ``x_j`` (``E[v_j^2] = B_inf^2 / 4 - 1 / 4 + x_j``), so the reports estimate no spread
    or cost; only the devices' labels tell where the mass is, which is what a split asks them.

    Every center is clipped to the domain box. The clipping is a projection onto a convex set
    containing every true cluster mean (points are clamped to the box on the device), so it never
    moves a center away from its cluster's true mean.

Budget policies
    ``SPLIT`` (Xia et al.'s setting): one group, every device reports in all ``T + 1`` rounds.
    ``epsilon_data = data_share * epsilon`` pays for the device's ``T + 1`` perturbed vectors,
    ``epsilon_data / (T + 1)`` each; ``epsilon_label = (1 - data_share) * epsilon / T`` is each
    GRR label's. A device spends, exactly (sequential composition)::

        epsilon_device = epsilon_data + T * epsilon_label
                       = (T + 1) * epsilon_data / (T + 1) + T * (1 - data_share) * epsilon / T = epsilon

    (in real numbers; the per-round charges are floats cut by :func:`ldp_client.budget.split_epsilon`,
    so that their exact sum is at most epsilon -- the device's ledger compares exactly -- and falls
    short of it by a few ulps at most).

    ``PARTITION`` (the collector's default policy): ``T + 1`` equally weighted groups; group 0
    reports only in round 1 (its vector with the whole epsilon), group ``t`` only in label round
    ``t + 1`` (its GRR label with ``(1 - data_share) * epsilon`` and its fresh vector with
    ``data_share * epsilon``). Every device reports once and spends exactly epsilon. Each round
    then hears from ``n / (T + 1)`` devices with ``T + 1`` to ``2 T`` times the epsilon per
    component of ``SPLIT``; because a center update uses only its own round's reports, this is
    usually the more accurate policy. In both policies ``data_share`` is the share of a
    label-reporting device's budget spent on perturbed vectors.

The vector mechanism
    For each vector epsilon, the engine takes the SDK vector randomizer with the smallest
    per-coordinate variance *on the domain box, in normalized units* (:func:`vector_component`),
    computed from the SDK's own parameter objects (no constant is re-derived here):

    * l2 ball (Duchi et al.'s l2 mechanism, :class:`~ldp_client.mechanisms.vector_l2_ball.
      VectorL2BallParams`, on ``(2t - 1) / sqrt(d)``): ``B_2^2 / 4 - (t_j - 1/2)^2``;
    * box (Duchi et al.'s l-infinity mechanism, :class:`~ldp_client.mechanisms.vector_box.
      VectorBoxParams`, on ``2t - 1``): ``B_inf^2 / 4 - (t_j - 1/2)^2``;
    * discrete Laplace on a 2^10 grid (:class:`~ldp_client.mechanisms.discrete_laplace.
      DiscreteLaplaceParams`, on ``t``): about ``2 d^2 / eps^2``, whatever the point.

    The two Duchi mechanisms subtract the same term, so comparing ``B^2`` decides between them
    for every point. Their variances, ``O(d / eps^2)``, are equal for odd ``d``; for even ``d``
    the box pays for the cube's equator, so the l2 ball wins at small epsilon (ratio box/ball
    1.54 at ``d = 2``, 1.08 at ``d = 10``, ``eps = 0.1``) and the box at moderate epsilon (0.96 at
    ``d = 2``, 0.87 at ``d = 10``, ``eps = 1``; 0.64 at ``d = 10``, ``eps = 4``). Discrete
    Laplace is quadratic in ``d`` but has no ``Theta(1)`` floor, so it wins only at large
    epsilon (``d = 2``, ``eps >= 8``). Ties go to the smaller payload (the box's ``d`` bits).

Cost
    A label report is ``ceil(log2 k)`` bits plus the vector (``d`` bits for the box, ``32 d``
    for the l2 ball, a few bytes per coordinate for discrete Laplace).
    Server: round 1 runs k-means on the ``n`` decoded vectors, one pass over the reports per
    Lloyd iteration (:func:`ldp_collector.estimation.kmeans.kmeans_passes`: a statistics pass,
    k-means++ seeds from a sample of :data:`SEED_SAMPLE_SIZE` decoded vectors salted by the campaign
    seed (:class:`~ldp_collector.estimation.kmeans.PointSample`, a function of the vectors only), the :data:`INIT_RESTARTS`
    restarts sharing every pass). A label round makes two passes, ``O(n k d)``: the label counts
    and label-wise vector sums (:class:`LabelSums`), then, given the centers they give, the
    spread of the vectors about them that the centers' variances need (:class:`LabelSpread`).
    Neither holds the round: memory is the sample (at most ``2 SEED_SAMPLE_SIZE x (d + 2)``
    numbers, round 1 only), one batch, and per pass ``3 k (d + 2)``
    float64 (round 1) or ``k (2 d + 1) + d`` (a label round), whatever ``n``.

Reference
    Xia, Hua, Tong and Zhong, "Distributed K-Means clustering guaranteeing local differential
    privacy", Computers & Security 90 (2020) 101699.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgpack
import numpy as np
from numpy.typing import NDArray

from ldp_client.budget import MAX_MECHANISM_EPSILON, split_epsilon
from ldp_client.encoders.nearest import NearestCandidateEncoder
from ldp_client.errors import InvalidParameterError, ProtocolError
from ldp_client.mechanisms import GRRParams
from ldp_client.spec import Component, GroupTask, RoundSpec

from ..errors import InvalidArgumentError
from ..estimation.accumulators import component_params_from_spec, decode_report_payloads, make_accumulate_fn
from ..estimation.center_floor import floor_diagnostics
from ..estimation.frequency import GRRAggregator
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
from ..estimation.report_accumulator import DecodedPass
from ..estimation.vectors import vector_component, vector_estimates
from ..model import BudgetPolicy, CampaignConfig, CampaignState, Clustering, Estimates, Result
from ..storage.base import AccumulateFn, StoredReport
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
from .common import DEFAULT_CONFIDENCE, MAX_K, MIN_K, allowed_oracles, campaign_seed
from .histogram import frequency_estimates

__all__ = [
    "KIND",
    "DEFAULT_DATA_SHARE",
    "DEFAULT_ITERATIONS",
    "MAX_ITERATIONS",
    "MIN_COUNT_Z",
    "SEED_SAMPLE_SIZE",
    "SPLIT_FRACTION",
    "LabelSpread",
    "LabelSums",
    "LabeledVectors",
    "LdpKmeansEngine",
    "LdpKmeansParams",
    "LdpKmeansPlan",
    "label_update",
    "label_update_passes",
    "reseed_centers",
    "vector_component",
    "vector_estimates",
]

DEFAULT_ITERATIONS = 5
DEFAULT_DATA_SHARE = 0.5
MAX_ITERATIONS = 20
#: A center moves only when its estimated count exceeds this many standard errors.
MIN_COUNT_Z = 2.0
#: Restarts of the round-1 k-means on the noisy vectors.
INIT_RESTARTS = 3
#: Reports of round 1's sample the k-means++ seeds are drawn from (every report when fewer).
SEED_SAMPLE_SIZE = 1 << 16
#: A re-seeded center starts this fraction of the gap to the nearest other significant center away
#: from the center whose cell it splits (:func:`reseed_centers`).
SPLIT_FRACTION = 0.1
#: Least split radius, in normalized units (two significant centers never coincide in practice).
_MIN_SPLIT_RADIUS = 1e-3
_PHASE_INIT = "init"
_PHASE_LABEL = "label"


@dataclass(frozen=True, kw_only=True)
class LabelUpdate:
    """One label round's server step (:func:`label_update`)."""

    #: New centers (k, d), in normalized units, clipped to [0, 1].
    centers: NDArray[np.float64]
    #: Unbiased count estimate of each label and its standard error.
    counts: NDArray[np.float64]
    count_std_errors: NDArray[np.float64]
    #: Whether each center moved to its debiased mean (its count was significant).
    updated: NDArray[np.bool_]
    #: Whether each center was re-seeded instead (not significant, and not the last round).
    reseeded: NDArray[np.bool_]
    #: Per-coordinate noise variance (k, d) of each updated center, normalized units (``inf`` where not
    #: updated): the ratio estimator's linearization ``sum_i a_i^2 (v_i - c)^2 / ((p - q) N_c)^2``
    #: with ``a_i = [l_i = c] - q``, which counts the label's and the vector's randomization together.
    variances: NDArray[np.float64]
    #: The reported label counts ``C_j`` (int64) and the round's label reports ``n``.
    label_counts: NDArray[np.int64]
    reports: int


def reseed_centers(centers: NDArray[np.float64], counts: NDArray[np.float64], significant: NDArray[np.bool_],
                   rng: np.random.Generator) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Move every non-significant center next to a significant one, splitting the heaviest cells (module docstring).

    Each non-significant center in turn goes to the cell with the largest remaining estimated
    count: it starts :data:`SPLIT_FRACTION` times the gap from that cell's center to the nearest
    other significant center away from it, in a random direction, and the two then share the
    cell's count for the next choice. Only the published centers and the estimated counts are
    used.

    Parameters
    ----------
    centers : numpy.ndarray, shape (k, d)
        The round's updated centers (normalized units, in ``[0, 1]``).
    counts : numpy.ndarray, shape (k,)
        The estimated count of each center's cell.
    significant : numpy.ndarray of bool, shape (k,)
        The centers to keep; every other one is re-seeded.
    rng : numpy.random.Generator
        Source of the split directions (the engine's seeded generator: reproducible).

    Returns
    -------
    centers : numpy.ndarray, shape (k, d)
        Clipped to ``[0, 1]``.
    reseeded : numpy.ndarray of bool, shape (k,)
        Which centers moved. None does when no center, or every center, is significant.
    """
    k, d = centers.shape
    out = centers.copy()
    reseeded = np.zeros(k, dtype=np.bool_)
    active = np.flatnonzero(significant)
    if active.size == 0 or active.size == k:
        return out, reseeded
    if active.size > 1:
        gaps = np.linalg.norm(out[active, None, :] - out[None, active, :], axis=2)
        np.fill_diagonal(gaps, np.inf)
        nearest = gaps.min(axis=1)
    else:  # half the box's diagonal stands in for the gap
        nearest = np.full(1, math.sqrt(d) / 2.0)
    radius = np.maximum(SPLIT_FRACTION * nearest, _MIN_SPLIT_RADIUS)
    # One entry per cell: the index of its center, its share of the estimated count, its split radius.
    owners = [int(j) for j in active]
    mass = [float(c) for c in counts[active]]
    radii = [float(r) for r in radius]
    for j in np.flatnonzero(~significant):
        a = int(np.argmax(mass))
        direction = rng.standard_normal(int(d))
        direction /= np.linalg.norm(direction)
        origin = out[owners[a]]
        moved = np.clip(origin + radii[a] * direction, 0.0, 1.0)
        if np.linalg.norm(moved - origin) < radii[a] / 2.0:  # mostly clipped away at the box's boundary
            moved = np.clip(origin - radii[a] * direction, 0.0, 1.0)
        out[j] = moved
        reseeded[j] = True
        mass[a] /= 2.0
        owners.append(int(j))
        mass.append(mass[a])
        radii.append(radii[a])
    return out, reseeded


@dataclass(frozen=True, eq=False)
class LabeledVectors:
    """A label round's batch decoded: each report's reported label and its vector (normalized units)."""

    labels: NDArray[np.int64]
    vectors: NDArray[np.float64]

    @property
    def nbytes(self) -> int:
        return int(self.labels.nbytes + self.vectors.nbytes)


class _TaskPayloads:
    """A round's task decoded batch by batch: each component's payloads over the task's groups, in report order."""

    def __init__(self, spec: RoundSpec) -> None:
        self.round = spec.round
        self.task = spec.tasks[0]
        self.params = component_params_from_spec(spec)

    def columns(self, reports: Sequence[StoredReport]) -> list[list[Any]]:
        by_key = decode_report_payloads(reports, self.params)
        return [[p for group in self.task.groups for p in by_key.get(f"{group}:{index}", ())]
                for index in range(len(self.task.components))]


class VectorPoints(_TaskPayloads, PointDecoder):
    """Round 1's reports decoded into their unbiased vectors (:func:`vector_estimates`)."""

    def __init__(self, spec: RoundSpec) -> None:
        super().__init__(spec)
        if len(self.task.groups) != 1:
            raise ProtocolError(f"round {spec.round} of ldp_kmeans has {len(self.task.groups)} groups reporting, not 1")

    @property
    def key(self) -> Hashable:
        return ("ldp_kmeans:vectors", self.round)

    def decode(self, reports: Sequence[StoredReport]) -> Points:
        (payloads,) = self.columns(reports)
        return Points(vector_estimates(self.task.components[0].mechanism, payloads))


class LabelVectors(_TaskPayloads):
    """A label round's reports decoded into :class:`LabeledVectors` (labels checked against ``k``)."""

    def __init__(self, spec: RoundSpec, k: int) -> None:
        super().__init__(spec)
        self.k = int(k)

    @property
    def key(self) -> Hashable:
        return ("ldp_kmeans:labels", self.round, self.k)

    def decode(self, reports: Sequence[StoredReport]) -> LabeledVectors:
        labels_raw, vector_payloads = self.columns(reports)
        if not all(isinstance(v, int) and 0 <= v < self.k for v in labels_raw):
            raise ProtocolError(f"label payloads must be indexes in [0, {self.k})")
        vectors = vector_estimates(self.task.components[1].mechanism, vector_payloads)
        if len(vectors) != len(labels_raw):
            raise ProtocolError("every label report must carry one vector")
        return LabeledVectors(np.asarray(labels_raw, dtype=np.int64).reshape(-1), vectors)


class _LabelPass(DecodedPass[Any]):
    """A pass over a label round's :class:`LabeledVectors` (``decoder`` None: arrays only, :class:`InMemory`)."""

    def __init__(self, decoder: LabelVectors | None) -> None:
        self.decoder = decoder

    @property
    def decoding(self) -> Hashable:
        return None if self.decoder is None else self.decoder.key

    def decode(self, reports: Sequence[StoredReport]) -> LabeledVectors:
        if self.decoder is None:
            raise TypeError(f"{type(self).__name__} has no decoder: it adds arrays only")
        return self.decoder.decode(reports)


class LabelSums(_LabelPass):
    """A label round's first pass: the reported label counts ``C_j``, the label-wise vector sums and their total.

    State: ``k (d + 1) + d + 1`` numbers (the counts are int64, exact on every engine).
    """

    def __init__(self, k: int, dimension: int, decoder: LabelVectors | None = None) -> None:
        super().__init__(decoder)
        self.k, self.dimension = int(k), int(dimension)
        self.n = 0
        self.counts = np.zeros(self.k, dtype=np.int64)
        #: ``sum_{i: y_i = j} v_i`` (k, d).
        self.reported = np.zeros((self.k, self.dimension))
        #: ``sum_i v_i`` (d,).
        self.total = np.zeros(self.dimension)

    def zero(self) -> LabelSums:
        return LabelSums(self.k, self.dimension, self.decoder)

    def add_decoded(self, decoded: LabeledVectors) -> None:
        labels, vectors = decoded.labels, decoded.vectors
        if labels.size and (labels.min() < 0 or labels.max() >= self.k):
            raise ProtocolError(f"label payloads must be indexes in [0, {self.k})")
        if len(vectors) != len(labels):
            raise ProtocolError("every label report must carry one vector")
        if not len(labels):
            return
        self.n += len(labels)
        self.counts += np.bincount(labels, minlength=self.k)
        for j in range(self.dimension):
            self.reported[:, j] += np.bincount(labels, weights=vectors[:, j], minlength=self.k)
        self.total += vectors.sum(axis=0)

    def merge(self, other: LabelSums) -> None:
        self.n += other.n
        self.counts += other.counts
        self.reported += other.reported
        self.total += other.total

    def finalize(self) -> LabelSums:
        return self

    @property
    def nbytes(self) -> int:
        return int(self.counts.nbytes + self.reported.nbytes + self.total.nbytes + 8)


class LabelSpread(_LabelPass):
    """A label round's second pass: ``sum_i a_i^2 (v_i - c)^2`` per center ``c`` it is given, ``a_i = [y_i = c] - q``.

    The numerator of the centers' variances (:class:`LabelUpdate`), which need the centers the
    first pass gives. ``which`` picks the centers (the others stay 0). State: ``2 k d`` float64.
    """

    def __init__(self, centers: NDArray[np.float64], q: float, which: NDArray[np.bool_],
                 decoder: LabelVectors | None = None) -> None:
        super().__init__(decoder)
        self.centers = np.asarray(centers, dtype=np.float64)
        self.q = float(q)
        self.which = np.asarray(which, dtype=np.bool_)
        self.spread = np.zeros_like(self.centers)

    def zero(self) -> LabelSpread:
        return LabelSpread(self.centers, self.q, self.which, self.decoder)

    def add_decoded(self, decoded: LabeledVectors) -> None:
        labels, vectors = decoded.labels, decoded.vectors
        for c in np.flatnonzero(self.which):
            a2 = ((labels == c) - self.q) ** 2
            self.spread[c] += (a2[:, None] * (vectors - self.centers[c]) ** 2).sum(axis=0)

    def merge(self, other: LabelSpread) -> None:
        self.spread += other.spread

    def finalize(self) -> NDArray[np.float64]:
        return self.spread

    @property
    def nbytes(self) -> int:
        return int(self.centers.nbytes + self.spread.nbytes)


def label_update(labels: NDArray[np.int64], vectors: NDArray[np.float64], grr: GRRParams,
                 previous: NDArray[np.float64], *, rng: np.random.Generator | None = None) -> LabelUpdate:
    """Debiased Lloyd step from GRR labels and same-report unbiased vectors held in memory (:func:`label_update_passes`).

    Parameters
    ----------
    labels : numpy.ndarray of int64, shape (n,)
        Reported (randomized) labels in ``[0, k)``.
    vectors : numpy.ndarray, shape (n, d)
        Unbiased estimates of the same devices' points (normalized units).
    grr, previous, rng
        As in :func:`label_update_passes`.
    """
    batch = LabeledVectors(np.asarray(labels, dtype=np.int64).reshape(-1),
                           np.asarray(vectors, dtype=np.float64).reshape(-1, previous.shape[1]))
    return label_update_passes(InMemory(batch), grr, previous, rng=rng)


def label_update_passes(source: PassSource, grr: GRRParams, previous: NDArray[np.float64], *,
                        rng: np.random.Generator | None = None, decoder: LabelVectors | None = None) -> LabelUpdate:
    """Debiased Lloyd step (module docstring) in two passes over a label round: sums, then the centers' spread.

    Parameters
    ----------
    source : PassSource
        The round's reports (with their ``decoder``) or :class:`LabeledVectors` in memory
        (:class:`~ldp_collector.estimation.kmeans.InMemory`).
    grr : GRRParams
        The labels' mechanism (``domain_size = k``).
    previous : numpy.ndarray, shape (k, d)
        The centers the labels refer to (normalized units).
    rng : numpy.random.Generator, optional
        Given, the centers that are not significant are re-seeded (:func:`reseed_centers`);
        without it (the last round) they keep their previous position.
    decoder : LabelVectors, optional
        How ``source``'s reports decode (None for batches in memory).
    """
    k = grr.domain_size
    d = previous.shape[1]
    sums = source.combine(LabelSums(k, d, decoder))
    n = sums.n
    aggregator = GRRAggregator.from_counts(grr, sums.counts, n)
    estimate = aggregator.estimate(DEFAULT_CONFIDENCE)
    counts = np.asarray(estimate.counts, dtype=np.float64)
    se = np.asarray(estimate.std_errors, dtype=np.float64)
    p, q = grr.p, grr.q
    centered = (sums.reported - q * sums.total[None, :]) / (p - q)
    updated = (counts > MIN_COUNT_Z * se) & (counts > 0)
    centers = previous.copy()
    centers[updated] = centered[updated] / counts[updated, None]
    variances = np.full((k, d), np.inf)
    if updated.any():
        spread = source.combine(LabelSpread(centers, q, updated, decoder)).finalize()
        variances[updated] = spread[updated] / (((p - q) * counts[updated]) ** 2)[:, None]
    centers = np.clip(centers, 0.0, 1.0)
    reseeded = np.zeros(k, dtype=np.bool_)
    if rng is not None:
        centers, reseeded = reseed_centers(centers, counts, updated, rng)
    return LabelUpdate(centers=centers, counts=counts, count_std_errors=se, updated=updated, reseeded=reseeded,
                       variances=variances, label_counts=sums.counts, reports=n)


@dataclass(frozen=True)
class LdpKmeansPlan:
    """The campaign's fixed layout: group weights, who reports when, and each component's epsilon."""

    weights: tuple[int, ...]
    #: Groups reporting in round r + 1 (entry 0: the vector round).
    round_groups: tuple[tuple[int, ...], ...]
    init_epsilon: float
    label_epsilon: float
    label_vector_epsilon: float
    max_reports_per_device: int


@dataclass(frozen=True, kw_only=True)
class LdpKmeansParams(KindParams):
    """``ldp.v1.LdpKmeansParameters``; :meth:`resolve` fills ``iterations`` and ``data_share``.

    Attributes
    ----------
    k : int
        Number of clusters, in [2, 256] (required).
    iterations : int
        Label rounds, in [1, 20] (0 = 5).
    data_share : float
        Share of epsilon spent on the perturbed vector, in (0, 1) (0 = 0.5).
    privunit_vectors : bool
        Perturb the vectors with the SDK's PrivUnit instead of :func:`vector_component`'s choice.
    """

    k: int = 0
    iterations: int = 0
    data_share: float = 0.0
    privunit_vectors: bool = False

    def resolve(self, config: CampaignConfig) -> LdpKmeansParams:
        """The parameters with every default filled in (see :meth:`KindParams.resolve`).

        Raises
        ------
        InvalidArgumentError
            A categorical domain, or ``k``, ``iterations`` or ``data_share`` out of range.
        """
        numeric_domain(config, "ldp_kmeans")
        if not MIN_K <= self.k <= MAX_K:
            raise InvalidArgumentError(f"ldp_kmeans.k must be in [{MIN_K}, {MAX_K}], got {self.k}")
        iterations = self.iterations or DEFAULT_ITERATIONS
        if not 1 <= iterations <= MAX_ITERATIONS:
            raise InvalidArgumentError(f"ldp_kmeans.iterations must be in [1, {MAX_ITERATIONS}], got {iterations}")
        data_share = self.data_share or DEFAULT_DATA_SHARE
        if not (math.isfinite(data_share) and 0.0 < data_share < 1.0):
            raise InvalidArgumentError(f"ldp_kmeans.data_share must be in (0, 1), got {data_share!r}")
        return replace(self, iterations=iterations, data_share=data_share)


class LdpKmeansEngine(CampaignEngine):
    """Engine of ``LDP_KMEANS`` campaigns (module docstring).

    Parameters
    ----------
    campaign_id : str
    config : ldp.v1.CampaignConfig
        Validated by :func:`ldp_collector.campaigns.prepare_campaign`: a numeric domain.
    params : LdpKmeansParams
        Resolved (:meth:`LdpKmeansParams.resolve`): ``iterations`` (default 5) and ``data_share``
        (default 0.5) filled in.

    Raises
    ------
    InvalidArgumentError
        A component epsilon outside what the mechanisms accept (above 20 under PARTITION).
    """

    params: LdpKmeansParams

    def __init__(self, campaign_id: str, config: CampaignConfig, params: LdpKmeansParams) -> None:
        super().__init__(campaign_id, config, params)
        self.domain = numeric_domain(config, "ldp_kmeans")
        self.k = params.k
        self.iterations = params.iterations
        self.dimension = self.domain.dimension
        self.plan = self._plan(config)
        try:
            privunit = bool(params.privunit_vectors)
            self.init_component = vector_component(self.domain, self.plan.init_epsilon, privunit=privunit)
            self.label_vector_component = vector_component(self.domain, self.plan.label_vector_epsilon,
                                                           privunit=privunit)
            self.label_mechanism = GRRParams(domain_size=self.k, epsilon=self.plan.label_epsilon)
        except InvalidParameterError as exc:
            raise InvalidArgumentError(f"ldp_kmeans: {exc}") from None
        allowed = allowed_oracles(config)
        if allowed is not None and "grr" not in allowed:
            # The label rounds' estimator is GRR's (label_update): no other oracle can stand in.
            raise InvalidArgumentError(
                f"oracles must include GRR for an ldp_kmeans campaign (its label rounds report with GRR), "
                f"got {', '.join(sorted(allowed)).upper()}")
        self._lower = np.asarray(self.domain.lower, dtype=np.float64)
        self._width = np.asarray(self.domain.upper, dtype=np.float64) - self._lower

    def _plan(self, config: CampaignConfig) -> LdpKmeansPlan:
        epsilon, share, t = config.epsilon, self.params.data_share, self.iterations
        if config.budget_policy == BudgetPolicy.SPLIT:
            # What each round charges first (the ledger charges a round's label and vector together,
            # their sum rounded up), then each label round's charge cut into its label and its vector.
            vector_weight, label_weight = share / (t + 1), (1.0 - share) / t
            charges = split_epsilon(epsilon, [vector_weight] + [vector_weight + label_weight] * t)
            label_epsilon, vector_epsilon = split_epsilon(min(charges[1:]), [label_weight, vector_weight])
            plan = LdpKmeansPlan(weights=(1,), round_groups=((0,),) * (t + 1), init_epsilon=charges[0],
                                 label_epsilon=label_epsilon, label_vector_epsilon=vector_epsilon,
                                 max_reports_per_device=t + 1)
        else:
            label_epsilon, vector_epsilon = split_epsilon(epsilon, [1.0 - share, share])
            plan = LdpKmeansPlan(weights=(1,) * (t + 1), round_groups=tuple((g,) for g in range(t + 1)),
                                 init_epsilon=epsilon, label_epsilon=label_epsilon,
                                 label_vector_epsilon=vector_epsilon, max_reports_per_device=1)
        for name in ("init_epsilon", "label_epsilon", "label_vector_epsilon"):
            value = getattr(plan, name)
            if not 0.0 < value <= MAX_MECHANISM_EPSILON:
                raise InvalidArgumentError(
                    f"ldp_kmeans: the {name.replace('_', ' ')} is {value:g} under this budget policy; every "
                    f"component's epsilon must be in (0, {MAX_MECHANISM_EPSILON:g}]")
        return plan

    # -- units and state ---------------------------------------------------------------------------

    def _to_original(self, normalized: NDArray[np.float64]) -> NDArray[np.float64]:
        out: NDArray[np.float64] = self._lower + normalized * self._width
        return out

    def _to_normalized(self, original: NDArray[np.float64]) -> NDArray[np.float64]:
        out: NDArray[np.float64] = (original - self._lower) / self._width
        return out

    @staticmethod
    def _state(phase: str, **fields: Any) -> bytes:
        return pack_state(phase, **fields)

    @staticmethod
    def _load_state(blob: bytes) -> dict[str, Any]:
        return load_state(blob, "ldp_kmeans", (_PHASE_INIT, _PHASE_LABEL))

    def _seed(self) -> int:
        """Seed of the server's k-means and re-seeding (post-processing: reproducible, needs no secret)."""
        return campaign_seed(self.config)

    def _sample_salt(self) -> bytes:
        """Salt of round 1's seeding sample: from the campaign seed, so a rerun draws the same sample."""
        return campaign_seed(self.config, "ldp_kmeans:sample:").to_bytes(8, "little")

    # -- rounds -----------------------------------------------------------------------------------

    def _spec(self, round_: int, components: tuple[Component, ...]) -> RoundSpec:
        groups = self.plan.round_groups[round_ - 1]
        return RoundSpec(campaign_id=self.campaign_id, round=round_, group_weights=self.plan.weights,
                         tasks=(GroupTask(groups=groups, components=components),),
                         campaign_epsilon=self.config.epsilon,
                         max_reports_per_device=self.plan.max_reports_per_device, kind="ldp_kmeans")

    def _label_spec(self, round_: int, centers: NDArray[np.float64]) -> RoundSpec:
        encoder = NearestCandidateEncoder(domain=self.domain, dimension=self.dimension,
                                          centers=tuple(self._to_original(centers).ravel().tolist()))
        label = Component(encoder=encoder, mechanism=self.label_mechanism)
        return self._spec(round_, (label, self.label_vector_component))

    def first_round(self) -> RoundPlan:
        """Round 1: the first group (everyone under SPLIT) sends one perturbed vector."""
        return RoundPlan(spec=self._spec(1, (self.init_component,)), engine_state=self._state(_PHASE_INIT))

    def accumulate_fn(self, spec: RoundSpec) -> AccumulateFn | None:
        """GRR label counts and report counts (the centers need the raw vectors at close)."""
        return make_accumulate_fn(component_params_from_spec(spec))

    def close_round(self, spec: RoundSpec, reports: RoundReports, engine_state: bytes) -> RoundOutcome:
        """Initialize the centers (round 1) or run one debiased Lloyd step (label rounds)."""
        state = self._load_state(engine_state)
        try:
            if state["phase"] == _PHASE_INIT:
                outcome = self._close_init(spec, reports)
            else:
                outcome = self._close_label(spec, reports, state)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"unreadable ldp_kmeans engine state: {exc!r}") from None
        # Every round's diagnostics ride along in the engine state and end up in the result.
        carried = {str(k): float(v) for k, v in dict(state.get("diag", {})).items()}
        carried.update(outcome.diagnostics)
        carried[f"round_{spec.round}_reports"] = float(reports.count)
        if outcome.next_round is not None:
            next_state = self._load_state(outcome.next_round.engine_state)
            next_state["diag"] = carried
            next_state["warnings"] = list(state.get("warnings", [])) + list(next_state.get("warnings", []))
            plan = RoundPlan(spec=outcome.next_round.spec, engine_state=msgpack.packb(next_state, use_bin_type=True))
            return replace(outcome, next_round=plan)
        if outcome.result is not None:  # the collector copies the diagnostics into the result
            result = replace(outcome.result, warnings=(*(str(w) for w in state.get("warnings", [])),
                                                       *outcome.result.warnings))
            outcome = replace(outcome, result=result)
        return replace(outcome, diagnostics=carried)

    def _close_init(self, spec: RoundSpec, reports: RoundReports) -> RoundOutcome:
        component = spec.tasks[0].components[0]
        decoder = VectorPoints(spec)
        stats = reports.combine(PointStats(self.dimension, decoder))
        n, k = stats.count, self.k
        warnings: list[str] = []
        if n >= k:
            sample = reports.combine(PointSample(SEED_SAMPLE_SIZE, self.dimension, decoder, salt=self._sample_salt())).finalize()
            starts = plus_plus_starts(sample, k, self._seed(), INIT_RESTARTS)
            fit = kmeans_passes(reports, starts, stats, decoder=decoder)
            centers = np.clip(fit.centers, 0.0, 1.0)
        else:
            # Too few reports to seed k centers: a data-independent start on the box diagonal.
            warnings.append(f"round 1 received {n} reports, fewer than k = {k}: the centers start on the "
                            f"diagonal of the domain")
            centers = np.repeat(((np.arange(k) + 0.5) / k)[:, None], self.dimension, axis=1)
        diagnostics = {
            "init_reports": float(n), "init_epsilon": float(component.mechanism.epsilon),
            "label_epsilon": float(self.label_mechanism.epsilon),
            "label_vector_epsilon": float(self.label_vector_component.mechanism.epsilon),
            "iterations": float(self.iterations),
        }
        next_spec = self._label_spec(spec.round + 1, centers)
        state = self._state(_PHASE_LABEL, iteration=1, centers=centers.ravel().tolist(), warnings=warnings)
        return RoundOutcome(next_round=RoundPlan(spec=next_spec, engine_state=state), diagnostics=diagnostics)

    def _close_label(self, spec: RoundSpec, reports: RoundReports, state: dict[str, Any]) -> RoundOutcome:
        iteration = int(state["iteration"])
        k, d = self.k, self.dimension
        previous = np.asarray([float(v) for v in state["centers"]], dtype=np.float64).reshape(k, d)
        label_component, _ = spec.tasks[0].components  # a label and its vector
        grr = label_component.mechanism
        if not isinstance(grr, GRRParams):
            raise ProtocolError(f"label round {spec.round} has no GRR label component")
        final = iteration >= self.iterations
        # A center re-seeded in the last round would be published without a round to validate it.
        rng = None if final else np.random.default_rng((self._seed(), spec.round))
        update = label_update_passes(reports, grr, previous, rng=rng, decoder=LabelVectors(spec, k))
        reseeded = int(state.get("reseeded", 0)) + int(update.reseeded.sum())
        shift = np.linalg.norm(self._to_original(update.centers) - self._to_original(previous), axis=1)
        diagnostics: dict[str, float] = {
            f"iteration_{iteration}_reports": float(update.reports),
            f"iteration_{iteration}_center_shift_max": float(shift.max()),
            f"iteration_{iteration}_center_shift_mean": float(shift.mean()),
            f"iteration_{iteration}_centers_kept": float(int((~update.updated & ~update.reseeded).sum())),
            f"iteration_{iteration}_centers_reseeded": float(int(update.reseeded.sum())),
        }
        for j in range(k):
            diagnostics[f"iteration_{iteration}_label_{j}_count"] = float(update.counts[j])
            diagnostics[f"iteration_{iteration}_label_{j}_std_error"] = float(update.count_std_errors[j])
        aggregator = GRRAggregator.from_counts(grr, update.label_counts, update.reports)
        estimates = frequency_estimates(aggregator.estimate(DEFAULT_CONFIDENCE), label_component)
        if not final:
            next_spec = self._label_spec(spec.round + 1, update.centers)
            next_state = self._state(_PHASE_LABEL, iteration=iteration + 1, centers=update.centers.ravel().tolist(),
                                     reseeded=reseeded)
            return RoundOutcome(estimates=estimates, next_round=RoundPlan(spec=next_spec, engine_state=next_state),
                                diagnostics=diagnostics)
        diagnostics["centers_reseeded"] = float(reseeded)
        return RoundOutcome(estimates=estimates, result=self._result(update, estimates), diagnostics=diagnostics)

    def _result(self, update: LabelUpdate, estimates: Estimates) -> Result:
        warnings: list[str] = []
        kept = int((~update.updated).sum())
        if kept:
            warnings.append(f"{kept} of {self.k} centers kept their previous position in the last iteration: "
                            f"their estimated counts were not significantly positive")
        positive = np.maximum(update.counts, 0.0)
        weights = positive / positive.sum() if positive.sum() > 0 else np.full(self.k, 1.0 / self.k)
        clustering = Clustering(k=self.k, dimension=self.dimension,
                                centers=tuple(self._to_original(update.centers).ravel().tolist()),
                                weights=tuple(weights.tolist()))
        floor = floor_diagnostics(update.variances * self._width[None, :] ** 2, weights,
                                  centers=self._to_original(update.centers), lower=self._lower,
                                  upper=self._lower + self._width)
        return Result(state=CampaignState.FINISHED, estimates=estimates, clustering=clustering,
                      warnings=tuple(warnings), diagnostics=floor)


#: Command line: ``--k`` (the dataset's number of labels in a simulation when not given).
CLI = KindCli(result="clustering", params=(K_PARAM, CliParam(
    flag="--privunit-vectors", field="privunit_vectors", type="switch",
    help="perturb the vectors with PrivUnit (default: the l2 ball, the box or discrete Laplace, least variance)")))

#: The LDP_KMEANS campaign kind (registered by :mod:`ldp_collector.kinds.registry`).
KIND = Kind(name="ldp_kmeans", engine=LdpKmeansEngine,
            params=LdpKmeansParams,
            domains=frozenset({NUMERIC}), clustering=True,
            cli=CLI)
