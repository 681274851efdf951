"""Benchmark suites: matrices of protocols x datasets x epsilon x n x seeds, and the checks they carry.

A suite is a list of :class:`Block` (each one full matrix; the union of their runs is executed
once), the paper claims it verifies (:class:`Claim`) and the acceptance bounds it enforces
(:class:`Bound`). ``smoke`` runs in CI (about 2 minutes on 2 cores) and fails on any broken claim
or bound and on any regression beyond ``regressions.json``; ``standard`` is the README's picture;
``full`` adds the large n and high d; ``shapes`` is issue 17's acceptance (arbitrary-shape data, the grid
variants' ARI bounds for the default variant, the variant verdict).

The papers' own kinds of data
    ``papers/001`` (DPQTk-means) evaluates on 2-D location-like data: a random 2-D set, Gowalla
    check-ins, "unbalance" (8 Gaussian clusters of very different sizes) and birch3; here the 2-D
    Gaussian mixture with unequal weights (``mixture``, k = 8) and isotropic 2-D blobs.
    ``papers/003`` uses Iris, Wine, Raisin and the S-sets (5000 2-D points, 15 Gaussian
    clusters of increasing overlap), normalized to [0, 1]; here ``blobs`` with d = 2, k = 15, n =
    5000 ("S-like") and, in the standard suite, iris and wine.
    ``papers/002`` (AGCluster, grid clustering) is about arbitrary-shape clusters: the grid
    protocols (``ugc``, ``agc-tree``, ``agc-iter``) run on moons, circles and anisotropic blobs
    (scikit-learn's shapes), at finite epsilon only (they have no epsilon = inf bypass), and from
    the standard suite on also on the k-means data. They publish labels, not centers: ARI, NMI,
    F-measure ... apply, the cost ratio does not.
The collector's center-publishing campaigns
    ``kcluster`` (BITVECTOR), ``mnfcm`` and ``fcm-laplace`` (LAPLACE, ``papers/004``) and
    ``ldp-kmeans`` (Xia et al. 2020) publish centers, so every metric applies. They
    run from the standard suite on (not in ``smoke``: CI time), beside the floors and the grid
    protocols, at finite epsilon only (their engines refuse epsilon = inf: no bypass). kcluster is
    the slow one (about 10 s per run at n = 20 000 on one core, linear in n).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

__all__ = ["CENTER_CAMPAIGNS", "DEFAULT_GRID_PROTOCOL", "GRID_PROTOCOLS", "SHAPES_DATASETS", "REPORTING_SEEDS", "SUITES", "TUNING_SEEDS", "Block", "Bound", "Claim", "DatasetCase", "Suite", "epsilon_label", "get_suite"]

INF = math.inf


def epsilon_label(epsilon: float | None) -> str:
    """``"-"`` for no budget, ``"inf"``, or the number (``"0.5"``)."""
    if epsilon is None:
        return "-"
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


@dataclass(frozen=True, kw_only=True)
class DatasetCase:
    """A dataset of :func:`ldp_collector.simulation.datasets.make_dataset` with its shape parameters."""

    name: str
    d: int | None = None
    k: int | None = None
    #: Keyword options of ``make_dataset`` (``separation``, ``imbalance``, ``ratio``, ``jitter``).
    options: tuple[tuple[str, float], ...] = ()
    #: Min-max scale every feature to [0, 1] after generation (``papers/003`` normalizes its data so).
    normalize: bool = False
    #: Optional display name (``"S1-like"``).
    alias: str = ""

    @property
    def label(self) -> str:
        """Stable identifier used in results and tables (``"S1-like=mixture(d=2,k=15,separation=2)"``)."""
        pairs = [(key, value) for key, value in (("d", self.d), ("k", self.k)) if value is not None]
        args = ",".join(f"{key}={value:g}" for key, value in [*pairs, *self.options])
        base = f"{self.name}({args})" if args else self.name
        base = f"{base}[0,1]" if self.normalize else base
        return f"{self.alias}={base}" if self.alias else base


@dataclass(frozen=True, kw_only=True)
class Block:
    """One full matrix of runs."""

    protocols: tuple[str, ...]
    datasets: tuple[DatasetCase, ...]
    epsilons: tuple[float, ...]
    ns: tuple[int, ...]
    seeds: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A paper's qualitative claim as a comparison of medians over seeds.

    In every listed cell (dataset, n, and the pair ``(epsilon of better, epsilon of worse)``;
    ``None`` for a method without a budget) the claim holds when the median ``metric`` of
    ``better`` is at least as good as that of ``worse``, give or take ``margin`` (``margin > 0``
    states "close to", ``margin < 0`` "better by at least").
    """

    id: str
    source: str
    statement: str
    better: str
    worse: str
    metric: str
    lower_is_better: bool
    datasets: tuple[str, ...]
    ns: tuple[int, ...]
    epsilon_pairs: tuple[tuple[float | None, float | None], ...]
    margin: float = 0.0
    #: Whether a failure fails the suite (``False``: reported only).
    required: bool = True


@dataclass(frozen=True, kw_only=True)
class Bound:
    """An acceptance bound on every run (``over="run"``) or on the median over seeds (``over="median"``)
    of a protocol in the listed cells (``ns`` empty: at every n)."""

    id: str
    statement: str
    protocols: tuple[str, ...]
    datasets: tuple[str, ...]
    epsilon: float | None
    metric: str
    maximum: float | None = None
    minimum: float | None = None
    ns: tuple[int, ...] = ()
    over: str = "run"

    def __post_init__(self) -> None:
        if self.over not in ("run", "median"):
            raise ValueError(f"bound {self.id}: over must be 'run' or 'median', got {self.over!r}")


@dataclass(frozen=True, kw_only=True)
class Suite:
    name: str
    description: str
    blocks: tuple[Block, ...]
    claims: tuple[Claim, ...] = ()
    bounds: tuple[Bound, ...] = ()
    #: The epsilon of the cluster drawings and of the metric-vs-n plots.
    plot_epsilon: float = 1.0
    #: Metrics drawn against epsilon and n.
    plot_metrics: tuple[str, ...] = ("cost_ratio", "ari")
    #: Metrics in the Markdown table.
    #: (``cost_over_floor`` and ``center_error_over_floor``: measured over the result's own noise floor, for the
    #: kinds that report one -- ``ldp_collector.estimation.center_floor``.)
    table_metrics: tuple[str, ...] = ("cost_ratio", "ari", "f_measure", "cost_per_point", "cost_over_floor",
                                      "center_error_over_floor")
    #: Metrics recorded in ``regressions.json``.
    regression_metrics: tuple[str, ...] = ("cost_ratio", "ari")
    #: Seeds that defaults, thresholds and the recorded regressions may be chosen on (``--tuning`` runs them;
    #: ``--record-regressions`` writes this suite's entries over all of them). A recorded tolerance is the
    #: distance from the median to the worst seed (:func:`harness.runner.record_regressions`): the more
    #: seeds, the less likely a new random stream (same distribution) fails a check -- ``benchmarks/README.md``
    #: has the probability.
    tuning_seeds: tuple[int, ...]
    #: Seeds the suite reports on: every block's seeds are among them, and none is a tuning seed, so no
    #: reported figure comes from data its defaults or tolerances were fitted to (:func:`harness.runner.plan_seeds`).
    reporting_seeds: tuple[int, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Protocols whose densest-region check (:func:`harness.runner.densest_region_clustered`) fails the
    #: suite; every other protocol's is reported only.
    densest_required: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        shared = sorted(set(self.tuning_seeds) & set(self.reporting_seeds))
        if shared:
            raise ValueError(f"suite {self.name}: seeds {shared} are both tuning and reporting seeds")
        if not self.tuning_seeds or not self.reporting_seeds:
            raise ValueError(f"suite {self.name}: declare at least one tuning and one reporting seed")

    def with_seeds(self, seeds: tuple[int, ...]) -> Suite:
        """This suite with every block run over ``seeds``."""
        if not seeds:
            raise ValueError("a suite needs at least one seed")
        return replace(self, blocks=tuple(replace(b, seeds=tuple(seeds)) for b in self.blocks))

    def with_ns(self, ns: tuple[int, ...]) -> Suite:
        """This suite cut to the population sizes ``ns``: blocks and bounds of other sizes left out."""
        wanted = set(ns)
        blocks = tuple(replace(b, ns=tuple(n for n in b.ns if n in wanted)) for b in self.blocks if wanted & set(b.ns))
        if not blocks:
            raise ValueError(f"the {self.name} suite runs no block at n = {', '.join(map(str, sorted(wanted)))}; "
                             f"its sizes are {', '.join(map(str, sorted({n for b in self.blocks for n in b.ns})))}")
        return replace(self, blocks=blocks, bounds=tuple(b for b in self.bounds if not b.ns or wanted & set(b.ns)))


#: The seeds defaults and tolerances are tuned on, and the disjoint seeds the suites report on.
TUNING_SEEDS = tuple(range(20))
REPORTING_SEEDS = tuple(range(100, 110))


def _reporting(count: int) -> tuple[int, ...]:
    """The first ``count`` reporting seeds."""
    return REPORTING_SEEDS[:count]


ALL_CENTRAL = ("dplloyd", "dpqt-kmeans", "improved-dp-kmeans")
FLOORS = ("ldp-laplace-points", "ldp-oue-grid")
NONPRIVATE = ("kmeans++", "kmeans-random", "density-am-kmeans", "dbscan")
EVERYTHING = NONPRIVATE + ALL_CENTRAL + FLOORS
#: The collector's grid clustering campaigns: papers/002's uniform grid, grid tree and iterative merge/split,
#: and the non-paper noise-derived density modes.
GRID_PROTOCOLS = ("ugc", "agc-tree", "agc-iter", "grid-density")
#: The grid variant the ``shapes`` suite's acceptance bounds apply to: the engine's ``DEFAULT_VARIANT``
#: (``kinds/grid.py``; a test keeps the two the same).
DEFAULT_GRID_PROTOCOL = "grid-density"
#: The collector's center-publishing campaigns: kCluster bit vectors, Laplace points with mnFCM and plain
#: FCM, interactive LDP k-means, one-round net-tree k-means, Stemmer-style k-means. Not in smoke (CI time);
#: no epsilon = inf bypass in the harness (benchmarks/lsh_clustering.py has the noiseless limits).
CENTER_CAMPAIGNS = ("kcluster", "mnfcm", "fcm-laplace", "ldp-kmeans", "nettree", "stemmer")

BLOBS_2D = DatasetCase(name="blobs", d=2, k=4)
#: Like Franti's "unbalance" (papers/001): 8 well-separated 2-D clusters, sizes 20:1 from largest to smallest.
MIXTURE_2D = DatasetCase(name="mixture", d=2, k=8, options=(("imbalance", 20.0), ("separation", 3.0)),
                         alias="unbalance-like")
#: Like Franti's S-sets (papers/003): 15 equal 2-D Gaussian clusters of one spread (Google's generator:
#: ratio 10 = S1/S2-like separation, ratio 5 = S3/S4-like overlap).
S_LIKE = DatasetCase(name="google", d=2, k=15, options=(("ratio", 10.0),), alias="S-like")
S3_LIKE = DatasetCase(name="google", d=2, k=15, options=(("ratio", 5.0),), alias="S3-like")
MOONS = DatasetCase(name="moons")
CIRCLES = DatasetCase(name="circles")
#: Three anisotropic (sheared) Gaussian blobs, scikit-learn's example.
ANISO = DatasetCase(name="aniso")
#: Arbitrary-shape 2-D clusters, the grid protocols' kind of data (papers/002).
SHAPES_2D = (MOONS, CIRCLES, ANISO)
GOOGLE_10D = DatasetCase(name="google", d=10, k=8)
#: papers/003's real data sets, normalized to [0, 1] per feature as in the paper.
IRIS = DatasetCase(name="iris", normalize=True)
WINE = DatasetCase(name="wine", normalize=True)


def _paper_001_claims(datasets: tuple[str, ...], ns: tuple[int, ...], epsilons: tuple[float, ...],
                      f_required: bool = True) -> tuple[Claim, ...]:
    pairs = tuple((e, e) for e in epsilons)
    return (
        Claim(id="001-nicv", source="papers/001 Fig. 2-5",
              statement="DPQTk-means has a lower NICV (cost per point of the released centroids) than "
                        "DPLloyd on 2-D data at epsilon <= 0.5",
              better="dpqt-kmeans", worse="dplloyd", metric="cost_per_point", lower_is_better=True,
              datasets=datasets, ns=ns, epsilon_pairs=pairs),
        Claim(id="001-f", source="papers/001 Fig. 4b, 5b",
              statement="DPQTk-means has a higher F-measure than DPLloyd on labelled 2-D data at epsilon <= 0.5",
              better="dpqt-kmeans", worse="dplloyd", metric="f_measure", lower_is_better=False,
              datasets=datasets, ns=ns, epsilon_pairs=pairs, required=f_required),
    )


def _paper_003_claims(datasets: tuple[str, ...], ns: tuple[int, ...], required: bool = True) -> tuple[Claim, ...]:
    # The paper states no epsilon; the claims are checked at 1 and 4 and the README says which hold.
    return (
        Claim(id="003-dis", source="papers/003 Table 2",
              statement="density/AM-initialised k-means (Alg. 2) reaches a lower within-cluster sum of squares "
                        "(Dis) than standard random-start k-means (Alg. 1)",
              better="density-am-kmeans", worse="kmeans-random", metric="cost_per_point", lower_is_better=True,
              datasets=datasets, ns=ns, epsilon_pairs=((None, None),), required=required),
        Claim(id="003-f", source="papers/003 Table 3",
              statement="density/AM-initialised k-means (Alg. 2) has a higher F-measure than standard k-means",
              better="density-am-kmeans", worse="kmeans-random", metric="f_measure", lower_is_better=False,
              datasets=datasets, ns=ns, epsilon_pairs=((None, None),), required=required),
        Claim(id="003-f-close", source="papers/003 Table 3",
              statement="the DP version (Alg. 3) keeps the F-measure of Alg. 2 within 0.05 (epsilon = 4)",
              better="improved-dp-kmeans", worse="density-am-kmeans", metric="f_measure", lower_is_better=False,
              datasets=datasets, ns=ns, epsilon_pairs=((4.0, None),), margin=0.05, required=required),
        Claim(id="003-f-close-eps1", source="papers/003 Table 3",
              statement="the DP version (Alg. 3) keeps the F-measure of Alg. 2 within 0.05 at epsilon = 1",
              better="improved-dp-kmeans", worse="density-am-kmeans", metric="f_measure", lower_is_better=False,
              datasets=datasets, ns=ns, epsilon_pairs=((1.0, None),), margin=0.05, required=False),
        Claim(id="003-f-standard", source="papers/003 Table 3",
              statement="the DP version (Alg. 3) has an F-measure at least that of standard random-start k-means",
              better="improved-dp-kmeans", worse="kmeans-random", metric="f_measure", lower_is_better=False,
              datasets=datasets, ns=ns, epsilon_pairs=((1.0, None), (4.0, None)), required=False),
    )


def _floor_bound(datasets: tuple[str, ...]) -> Bound:
    # "matched": over non-private k-means (Lloyd on the true points) from the floor's own centers, so the
    # bound measures what the floor's pipeline loses, not which local optimum a restart found (runner).
    # "resolved": a floor clusters its points snapped to its own grid, and no pipeline can do better than
    # that grid allows: the denominator adds the snapping's cost on the true points, derived in
    # harness.runner.resolution_cost (no constant fitted to data; on a fine grid it is the matched ratio).
    return Bound(id="floors-inf", statement="with epsilon = inf (no-noise bypass) each LDP floor's centers are "
                                            "non-private k-means centers of the true points within 2% cost, "
                                            "up to what the floor's grid resolution costs, every run",
                 protocols=FLOORS, datasets=datasets, epsilon=INF, metric="cost_ratio_resolved", maximum=1.02)


_SMOKE_2D = (BLOBS_2D, MIXTURE_2D)
_SMOKE_LABELS = tuple(d.label for d in _SMOKE_2D)

SMOKE = Suite(
    name="smoke",
    description="CI: every baseline on small 2-D data; paper claims, the epsilon = inf floor bound and "
                "the recorded regressions are enforced",
    blocks=(
        Block(protocols=EVERYTHING, datasets=_SMOKE_2D, epsilons=(0.1, 0.5, 2.0, INF), ns=(4000,), seeds=REPORTING_SEEDS),
        Block(protocols=("kmeans-random", "density-am-kmeans", "improved-dp-kmeans"), datasets=(S_LIKE,),
              epsilons=(1.0, 4.0), ns=(5000,), seeds=REPORTING_SEEDS),
        # The grid protocols on the shapes at n = 4000, epsilon 8 (at 4 the moons and circles are still
        # mostly noise at this n): one epsilon keeps CI fast, the epsilon sweep is in the standard suite.
        Block(protocols=GRID_PROTOCOLS, datasets=SHAPES_2D, epsilons=(8.0,), ns=(4000,), seeds=REPORTING_SEEDS),
    ),
    claims=_paper_001_claims(_SMOKE_LABELS, (4000,), (0.1, 0.5))
    + _paper_003_claims((S_LIKE.label,), (5000,)),
    bounds=(_floor_bound(_SMOKE_LABELS),),
    plot_epsilon=2.0,
    # All 10 reporting seeds (about 2 minutes on 2 cores with the grid mixture search): over 3, the seeds' data sets are shared by every
    # protocol, so one hard data set (seeds 100-102: k-means++ itself at ARI 0.74-0.96 on blobs) moved
    # many correlated 3-seed medians below their recorded worst seed at once.
    tuning_seeds=TUNING_SEEDS,
    reporting_seeds=REPORTING_SEEDS,
)

_STANDARD_2D = (BLOBS_2D, MIXTURE_2D, MOONS)
_STANDARD_EPS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, INF)
_GRID_EPS = (0.5, 1.0, 2.0, 4.0, 8.0)

STANDARD = Suite(
    name="standard",
    description="the README's picture: epsilon sweep at n = 20 000, n sweep at epsilon = 1, the papers' data",
    blocks=(
        Block(protocols=EVERYTHING + CENTER_CAMPAIGNS, datasets=_STANDARD_2D + (GOOGLE_10D,), epsilons=_STANDARD_EPS,
              ns=(20_000,), seeds=_reporting(3)),
        Block(protocols=EVERYTHING + CENTER_CAMPAIGNS, datasets=(BLOBS_2D, MIXTURE_2D), epsilons=(1.0,),
              ns=(2_000, 100_000), seeds=_reporting(3)),
        Block(protocols=("kmeans-random", "density-am-kmeans", "improved-dp-kmeans", "dplloyd", "dpqt-kmeans"),
              datasets=(S_LIKE, S3_LIKE), epsilons=(1.0, 4.0), ns=(5000,), seeds=_reporting(10)),
        # The real data sets at their own size, as in the paper (no upsampling).
        Block(protocols=("kmeans-random", "density-am-kmeans", "improved-dp-kmeans", "dplloyd"),
              datasets=(IRIS,), epsilons=(1.0, 4.0), ns=(150,), seeds=_reporting(10)),
        Block(protocols=("kmeans-random", "density-am-kmeans", "improved-dp-kmeans", "dplloyd"),
              datasets=(WINE,), epsilons=(1.0, 4.0), ns=(178,), seeds=_reporting(10)),
        # Grid clustering: the epsilon sweep on the shapes beside the non-private references (k-means
        # cannot separate them, DBSCAN can), two epsilons on the k-means data, then n = 100 000.
        # The center campaigns beside them: centers cut the shapes with straight lines, like k-means.
        Block(protocols=GRID_PROTOCOLS + ("kmeans++", "dbscan") + CENTER_CAMPAIGNS, datasets=SHAPES_2D,
              epsilons=_GRID_EPS, ns=(20_000,), seeds=_reporting(3)),
        Block(protocols=GRID_PROTOCOLS, datasets=(BLOBS_2D, MIXTURE_2D), epsilons=(1.0, 4.0), ns=(20_000,),
              seeds=_reporting(3)),
        Block(protocols=GRID_PROTOCOLS, datasets=SHAPES_2D, epsilons=(1.0, 4.0), ns=(100_000,), seeds=_reporting(3)),
    ),
    # 001-f holds in 5 of its 6 standard cells (not on unbalance-like at epsilon = 0.5): reported, not enforced.
    claims=_paper_001_claims(tuple(d.label for d in (BLOBS_2D, MIXTURE_2D)), (20_000,), (0.1, 0.25, 0.5),
                             f_required=False)
    + _paper_003_claims((S_LIKE.label,), (5000,))
    + _paper_003_claims((S3_LIKE.label,), (5000,), required=False)
    + _paper_003_claims((IRIS.label,), (150,), required=False)
    + _paper_003_claims((WINE.label,), (178,), required=False),
    bounds=(_floor_bound(tuple(d.label for d in _STANDARD_2D)),),
    plot_epsilon=1.0,
    tuning_seeds=TUNING_SEEDS,
    reporting_seeds=REPORTING_SEEDS,
)

FULL = Suite(
    name="full",
    description="standard plus large n (up to 1e6), higher dimension and more seeds",
    blocks=STANDARD.blocks + (
        Block(protocols=EVERYTHING, datasets=(BLOBS_2D, MIXTURE_2D), epsilons=(0.5, 1.0, 2.0, INF),
              ns=(1_000_000,), seeds=_reporting(3)),
        Block(protocols=("kmeans++", "kmeans-random", "density-am-kmeans", "dplloyd", "improved-dp-kmeans")
              + FLOORS + CENTER_CAMPAIGNS, datasets=(DatasetCase(name="google", d=50, k=16), DatasetCase(name="mixture", d=20, k=16),
                                  DatasetCase(name="digits"), DatasetCase(name="breast_cancer")),
              epsilons=(1.0, 4.0, INF), ns=(50_000,), seeds=_reporting(3)),
        Block(protocols=EVERYTHING + CENTER_CAMPAIGNS, datasets=_STANDARD_2D, epsilons=_STANDARD_EPS, ns=(20_000,),
              seeds=REPORTING_SEEDS[3:8]),
        # About 3 minutes per grid run at n = 1e6: epsilon 1 only (it extends the standard suite's n sweep).
        Block(protocols=GRID_PROTOCOLS, datasets=SHAPES_2D, epsilons=(1.0,), ns=(1_000_000,), seeds=_reporting(3)),
        # kcluster takes some 8 minutes a run at n = 1e6: the center campaigns at epsilon 1 only there too.
        Block(protocols=CENTER_CAMPAIGNS, datasets=(BLOBS_2D, MIXTURE_2D), epsilons=(1.0,), ns=(1_000_000,),
              seeds=_reporting(3)),
    ),
    claims=STANDARD.claims,
    bounds=STANDARD.bounds,
    plot_epsilon=1.0,
    tuning_seeds=TUNING_SEEDS,
    reporting_seeds=REPORTING_SEEDS,
)

#: Issue 17's arbitrary-shape data (registered by ldp_collector.simulation.datasets): interleaved spirals,
#: nested rings of unequal density, moons, circles, sheared blobs, blobs of different spreads -- the
#: acceptance -- and, reported beside them, clusters of very different size and uniform background noise.
SPIRALS = DatasetCase(name="spirals")
RINGS = DatasetCase(name="rings")
VARIED = DatasetCase(name="varied")
SIZES = DatasetCase(name="sizes")
BACKGROUND = DatasetCase(name="background")
_SHAPES_ACCEPTANCE = (SPIRALS, RINGS, MOONS, CIRCLES, ANISO, VARIED)
SHAPES_DATASETS = _SHAPES_ACCEPTANCE + (SIZES, BACKGROUND)
#: (n, epsilon, median ARI at least, worst seed's ARI at least): the issue's acceptance cells. With 10
#: seeds the 10th-percentile seed is the worst one, so the second figure bounds every run.
_SHAPES_CELLS = ((1_000_000, 2.0, 0.9, 0.7), (100_000, 4.0, 0.85, 0.6))


def _shapes_bounds(protocol: str) -> tuple[Bound, ...]:
    labels = tuple(d.label for d in _SHAPES_ACCEPTANCE)
    out = []
    for n, epsilon, median, worst in _SHAPES_CELLS:
        where = f"n = {n:g}, epsilon = {epsilon:g}"
        out += [Bound(id=f"shapes-median-{n:g}-{epsilon:g}", over="median", ns=(n,), protocols=(protocol,),
                      datasets=labels, epsilon=epsilon, metric="ari", minimum=median,
                      statement=f"the default grid variant's median ARI over the seeds is >= {median:g} on every "
                                f"arbitrary-shape data set at {where}, no per-data-set parameter"),
                Bound(id=f"shapes-worst-{n:g}-{epsilon:g}", ns=(n,), protocols=(protocol,), datasets=labels,
                      epsilon=epsilon, metric="ari", minimum=worst,
                      statement=f"the default grid variant's worst seed has ARI >= {worst:g} on every "
                                f"arbitrary-shape data set at {where}")]
    return tuple(out)


SHAPES = Suite(
    name="shapes",
    description="issue 17's acceptance: the grid variants on arbitrary-shape data at (n = 1e6, epsilon = 2) and "
                "(n = 1e5, epsilon = 4) over the 10 reporting seeds, beside non-private k-means++ and DBSCAN; "
                f"the ARI bounds and the densest-region check apply to the default variant ({DEFAULT_GRID_PROTOCOL})",
    blocks=tuple(Block(protocols=GRID_PROTOCOLS + ("kmeans++", "dbscan"), datasets=SHAPES_DATASETS,
                       epsilons=(epsilon,), ns=(n,), seeds=REPORTING_SEEDS) for n, epsilon, _, _ in _SHAPES_CELLS),
    bounds=_shapes_bounds(DEFAULT_GRID_PROTOCOL),
    plot_epsilon=4.0,
    plot_metrics=("ari",),
    table_metrics=("ari", "nmi", "f_measure"),
    regression_metrics=("ari",),
    tuning_seeds=TUNING_SEEDS,
    reporting_seeds=REPORTING_SEEDS,
    densest_required=(DEFAULT_GRID_PROTOCOL,),
)

SUITES: dict[str, Suite] = {s.name: s for s in (SMOKE, STANDARD, FULL, SHAPES)}


def get_suite(name: str) -> Suite:
    """The suite ``name``; the error lists the known ones."""
    try:
        return SUITES[name]
    except KeyError:
        raise ValueError(f"unknown suite {name!r}; known suites: {', '.join(SUITES)}") from None
