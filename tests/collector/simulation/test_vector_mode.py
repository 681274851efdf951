"""The ``vector`` population mode: the SDK's encodings and decisions on arrays, its reports' distribution.

Encodings and group draws are pinned equal to the SDK's (exact). The randomized reports are
compared with the SDK path's by a two-sample chi-square homogeneity test per mechanism x encoder.

False failures: ``NULL_TESTS`` null tests (4 oracles x 3 cell encoders, then one per pair of
``PAIRS``: the center kinds' mechanisms with their encoders) at ``ALPHA = 1e-6 / NULL_TESTS``
each, so by Bonferroni the family fails falsely with probability at most 1e-6. Each test's power
against a wrong randomizer (the same mechanism at a shifted epsilon: for the oracles p, or q for
OUE, off by 0.05-0.09; for PrivUnit the right epsilon with a cap of the wrong angle) is computed from the non-central chi-square at the design's sample sizes
(``test_the_test_has_power``: at least 0.999; for the vector randomizers from their outcome
distributions estimated on 400 000 reports) and the wrong randomizer is rejected on the seeded
samples. All seeds are fixed; nothing is timed.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from ldp_client.admission import pick_group
from ldp_client.budget import units
from ldp_client.encoders import CategoricalEncoder, NumericDomain, UniformGridEncoder
from ldp_client.encoders.base import Encoder
from ldp_client.encoders.bitvector import BitVectorEncoder
from ldp_client.encoders.bucketed import BucketedVectorEncoder
from ldp_client.encoders.geometry import TreeCell, tree_children
from ldp_client.encoders.grid import CellListEncoder, GridTreeEncoder
from ldp_client.encoders.lsh import ShiftedGridEncoder, SimHashEncoder
from ldp_client.encoders.nearest import NearestCandidateEncoder
from ldp_client.encoders.projection import RandomProjection
from ldp_client.encoders.vectors import SymmetricBoxEncoder, UnitBallEncoder, UnitCubeEncoder
from ldp_client.errors import InvalidParameterError
from ldp_client.mechanisms import GRRParams, oue, sue
from ldp_client.mechanisms.base import MechanismParams
from ldp_client.mechanisms.bitwise_randomized_response import BitwiseRRParams
from ldp_client.mechanisms.bucketized_vector import BucketizedVectorParams, VectorShape, sign
from ldp_client.mechanisms.discrete_laplace import DiscreteLaplaceParams
from ldp_client.mechanisms.local_hashing import LocalHashingParams, hash_value, optimal_hash_range
from ldp_client.mechanisms.vector_box import VectorBoxParams
from ldp_client.mechanisms.vector_l2_ball import VectorL2BallParams
from ldp_client.mechanisms.vector_privunit import VectorPrivUnitParams
from ldp_client.spec import Component, GroupTask, RoundSpec
from ldp_collector.cli_args import build_campaign_config
from ldp_collector.core import Collector
from ldp_collector.estimation.bitvector import public_pivots
from ldp_collector.kinds.bitvector import HALF_WIDTH_FACTOR
from ldp_collector.serde import config_from_proto
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.evaluation import evaluate_clustering
from ldp_collector.simulation.population import Population, VectorFallbackWarning, _Preset, numeric_bounds
from ldp_collector.simulation.runner import run_campaign
from ldp_collector.simulation.vector import encode_cells, encode_points
from ldp_collector.storage import open_store
from support.stats import FALSE_FAILURE_RATE, chi2_sf

DOMAIN = NumericDomain(lower=(-1.0, 0.5), upper=(2.0, 3.0))
SDK_N = 6000
VECTOR_N = 30_000


def _cell_list() -> CellListEncoder:
    """16 cells of levels 1-3: the first quadrant split twice, the second once."""
    root = TreeCell(level=0, morton_index=0)
    quadrants = tree_children(root, 2)
    cells: list[TreeCell] = []
    for q in quadrants[:1]:
        for c in tree_children(q, 2):
            cells.extend(tree_children(c, 2) if c.morton_index % 2 == 0 else (c,))
    cells.extend(tree_children(quadrants[1], 2))
    cells.extend(quadrants[2:])
    return CellListEncoder(domain=DOMAIN, cells=tuple(cells))


ENCODERS: dict[str, Encoder] = {
    "uniform": UniformGridEncoder(domain=DOMAIN, cells_per_dimension=(4, 4)),
    "tree": GridTreeEncoder(domain=DOMAIN, level=2),
    "cell_list": _cell_list(),
}


def _boundary_points(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random points, points on every cell boundary of levels 0-6 / sides 1-12, the bounds and beyond."""
    lo, hi = np.array(DOMAIN.lower), np.array(DOMAIN.upper)
    grid = np.unique(np.concatenate([np.arange(m + 1) / m for m in range(1, 13)] + [np.arange(65) / 64]))
    on_lines = lo + grid[:, None] * (hi - lo)
    pairs = np.array([(a, b) for a in on_lines[:, 0] for b in on_lines[:, 1]])
    random = lo + rng.random((n, 2)) * (hi - lo)
    outside = lo + rng.uniform(-0.5, 1.5, size=(n // 4, 2)) * (hi - lo)
    nudged = np.nextafter(pairs, pairs + rng.choice([-1.0, 1.0], size=pairs.shape))
    special = np.array([DOMAIN.lower, DOMAIN.upper, (DOMAIN.lower[0], DOMAIN.upper[1]), (-0.0, 0.5), (1e300, -1e300)])
    return np.concatenate([random, outside, pairs, nudged, special])


@pytest.mark.parametrize("encoder", [
    UniformGridEncoder(domain=DOMAIN, cells_per_dimension=(7, 12)),
    UniformGridEncoder(domain=DOMAIN, cells_per_dimension=(2048, 3)),
    UniformGridEncoder(domain=NumericDomain(lower=(0.0, 0.0), upper=(1.0, 1.0)), cells_per_dimension=(10, 10)),
    GridTreeEncoder(domain=DOMAIN, level=0),
    GridTreeEncoder(domain=DOMAIN, level=6),
    GridTreeEncoder(domain=DOMAIN, level=31),
    GridTreeEncoder(domain=NumericDomain(lower=(0.0,), upper=(1.0,)), level=62),
    _cell_list(),
], ids=lambda e: f"{e.KIND}")
def test_array_encoding_equals_the_sdk_encoder(encoder: Encoder) -> None:
    rng = np.random.default_rng(17)
    d = encoder.domain.dimension  # type: ignore[attr-defined]
    points = _boundary_points(rng, 3000)
    if d == 1:
        points = np.concatenate([points[:, :1], (np.arange(1025) / 1024)[:, None]])
    expected = [encoder.encode(tuple(p)) for p in points.tolist()]
    assert encode_cells(encoder, points).tolist() == expected


@pytest.mark.parametrize("weights", [(1, 2, 1), (3, 0, 5, 1), (2**32 - 1, 1, 2**31), (0, 7)])
def test_group_draws_equal_pick_group_on_the_same_draws(weights: tuple[int, ...]) -> None:
    population = Population(np.zeros((1, 2)), seed=4, mode="vector")
    groups = population._draw_groups(weights, 20_000)
    u = np.random.default_rng(4).integers(0, sum(weights), size=20_000, dtype=np.int64)
    assert groups.tolist() == [pick_group(weights, lambda v=v: _Preset(below=v)) for v in u.tolist()]


def _grid_spec(component: Component, *, round: int = 1, weights: tuple[int, ...] = (1,),
               groups: tuple[int, ...] = (0,), campaign_epsilon: float = 4.0, max_reports: int = 4,
               campaign_id: str = "vec") -> RoundSpec:
    return RoundSpec(campaign_id=campaign_id, round=round, group_weights=weights,
                     tasks=(GroupTask(groups=groups, components=(component,)),), campaign_epsilon=campaign_epsilon,
                     max_reports_per_device=max_reports, kind="grid")


@pytest.mark.parametrize(("epsilon", "max_reports"), [(1.5, 4), (1.0, 2)], ids=["budget", "report-cap"])
def test_vector_and_direct_modes_take_the_same_decisions(epsilon: float, max_reports: int) -> None:
    """One group: every decision is deterministic, so both modes refuse and charge the same devices."""
    points = np.random.default_rng(1).random((500, 2))
    component = Component(encoder=ENCODERS["tree"], mechanism=GRRParams(domain_size=16, epsilon=epsilon))
    populations = {mode: Population(points, seed=2, mode=mode) for mode in ("direct", "vector")}
    counts: dict[str, list[tuple[int, int]]] = {}
    for mode, population in populations.items():
        counts[mode] = []
        for round_ in (1, 2, 3):
            reports = population.participate(_grid_spec(component, round=round_, campaign_epsilon=3.0,
                                                        max_reports=max_reports))
            again = population.participate(_grid_spec(component, round=round_, campaign_epsilon=3.0,
                                                      max_reports=max_reports))
            assert again == [], "a device reports once per round"
            counts[mode].append((len(reports), population.refused))
    assert counts["vector"] == counts["direct"]
    # Round 3 is refused to every device, twice (the repeated call asks again).
    assert counts["vector"] == [(500, 0), (500, 0), (0, 1000)]
    assert populations["vector"].fallbacks == []
    assert np.array_equal(populations["vector"].epsilon_spent("vec"), populations["direct"].epsilon_spent("vec"))


def test_groups_are_kept_and_a_refused_draw_is_not_recorded() -> None:
    component = Component(encoder=ENCODERS["uniform"], mechanism=GRRParams(domain_size=16, epsilon=1.0))
    population = Population(np.random.default_rng(3).random((4000, 2)), seed=5, mode="vector")
    first = population.participate(_grid_spec(component, weights=(1, 2, 1), groups=(0, 2), campaign_epsilon=1.0))
    assert 1800 < len(first) < 2200 and {r.group for r in first} == {0, 2}
    second = population.participate(_grid_spec(component, round=2, weights=(1, 2, 1), groups=(0, 2),
                                               campaign_epsilon=1.0))
    assert second == [] and population.refused == len(first), "the reporters' budget is spent"
    third = population.participate(_grid_spec(component, round=3, weights=(1, 2, 1), groups=(1,),
                                              campaign_epsilon=1.0))
    assert len(third) == 4000 - len(first), "group 1 sat out round 1 and keeps its group"


def test_a_vector_population_makes_the_points_list_only_for_a_round_that_needs_it() -> None:
    """Every round drawn on the array: no list of point tuples (about 2 GB at n = 1e7); a round that
    falls back to ``direct`` makes it, equal to the array's rows."""
    points = np.random.default_rng(4).random((300, 2))
    population = Population(points, seed=1, mode="vector")
    component = Component(encoder=ENCODERS["uniform"], mechanism=GRRParams(domain_size=16, epsilon=1.0))
    assert len(population.participate(_grid_spec(component))) == 300 and len(population) == 300
    assert population._points is None
    assert population.points == [tuple(row) for row in points.tolist()]
    with pytest.raises(InvalidParameterError, match="1-D or 2-D"):
        Population(np.zeros((2, 2, 2)), seed=1)
    with pytest.raises(InvalidParameterError, match="at least one device"):
        Population(np.zeros((0, 2)), seed=1)


@pytest.mark.parametrize("mode", ["direct", "vector"])
def test_the_per_device_ledgers_are_arrays_the_cyclic_gc_does_not_traverse(mode: str) -> None:
    """A population shares its process with the collector in ``simulate``. A list of n Python ints
    (the exact ledger sums) sits in generation 2, and every full collection walks it: the reports a
    server step reads then trigger O(n) full collections of O(n) each (at n = 3e6 the step's CPU
    doubled). No per-device container of the population may be one the GC traverses, except the
    points as Python values that a ``direct`` round hands the SDK (a vector round never makes them)."""
    n = 300
    population = Population(np.random.default_rng(4).random((n, 2)), seed=1, mode=mode)
    component = Component(encoder=ENCODERS["uniform"], mechanism=GRRParams(domain_size=16, epsilon=1.0))
    assert len(population.participate(_grid_spec(component))) == n
    state = population._campaigns["vec"]
    holders = [vars(population), vars(state), state.charged]
    sized = [(name, value) for holder in holders for name, value in holder.items()
             if name != "_points" and hasattr(value, "__len__") and not isinstance(value, (str, bytes))
             and len(value) >= n]
    assert {name for name, _ in sized} >= {"_total_spent", "spent"}
    assert [name for name, value in sized if gc.is_tracked(value)] == []
    assert state.spent.tolist() == population._total_spent.tolist() == [units(1.0)] * n, "exact ints"


def test_unsupported_rounds_fall_back_to_direct_and_say_so() -> None:
    component = Component(encoder=CategoricalEncoder(domain_size=4), mechanism=GRRParams(domain_size=4, epsilon=1.0))
    spec = RoundSpec(campaign_id="cat", round=1, group_weights=(1,),
                     tasks=(GroupTask(groups=(0,), components=(component,)),), campaign_epsilon=1.0, kind="histogram")
    forced = Population([0, 1, 2, 3] * 10, seed=1, mode="vector")
    with pytest.warns(VectorFallbackWarning, match="round 1: direct mode"):
        assert len(forced.participate(spec)) == 40
    assert len(forced.fallbacks) == 1
    auto = Population([0, 1, 2, 3] * 20_000, seed=1)
    assert auto.mode == "vector"
    assert len(auto.participate(spec, 0, 100)) == 100 and auto.fallbacks


# -- the reports' distribution ----------------------------------------------------------------------

MECHANISMS = {
    "grr": lambda eps: GRRParams(domain_size=16, epsilon=eps),
    "oue": lambda eps: oue(16, eps),
    "sue": lambda eps: sue(16, eps),
    # g fixed at the default of EPSILON, so that the wrong randomizer differs in p only.
    "olh": lambda eps: LocalHashingParams(domain_size=16, epsilon=eps, hash_range=optimal_hash_range(EPSILON)),
}
EPSILON = 1.5
#: The wrong randomizer of the power checks: the same oracle at this epsilon (p, or q for OUE, off by 0.05-0.09;
#: OLH moved from 1.8 to 1.85 when the pairs below made ALPHA smaller and its power fell to 0.9990).
WRONG_EPSILON = {"grr": 1.9, "oue": 2.1, "sue": 2.0, "olh": 1.85}

def _bit_vector() -> BitVectorEncoder:
    """5 pivots on the first attribute and 3 on the second (8 bits), with the bitvector kind's half-widths."""
    first = public_pivots(DOMAIN.lower[:1], DOMAIN.upper[:1], 5, HALF_WIDTH_FACTOR)
    second = public_pivots(DOMAIN.lower[1:], DOMAIN.upper[1:], 3, HALF_WIDTH_FACTOR)
    return BitVectorEncoder(domain=DOMAIN, pivots=first.pivots[0] + second.pivots[0], pivots_per_attribute=(5, 3),
                            half_widths=first.half_widths + second.half_widths)


BIT_VECTOR = _bit_vector()


@dataclass(frozen=True)
class Pair:
    """A mechanism x encoder of the center kinds: its component at an epsilon, and per report an
    outcome whose distribution does not depend on the point (a category, or a row of bits each
    Bernoulli with one probability, ``bits`` of them); ``expected`` gives those probabilities. The
    wrong randomizer of the power checks is the component at ``wrong_epsilon``, or ``wrong_component``."""

    component: Callable[[float], Component]
    outcome: Callable[[list[Any], np.ndarray, Component], np.ndarray]
    expected: Callable[[Component], np.ndarray]
    wrong_epsilon: float
    bits: bool
    wrong_component: Callable[[], Component] | None = None

    def wrong(self) -> Component:
        """The known-bad randomizer the test must reject."""
        return self.component(self.wrong_epsilon) if self.wrong_component is None else self.wrong_component()


def _flips(payloads: list[Any], points: np.ndarray, component: Component) -> np.ndarray:
    """Bitwise RR: the report XOR the point's true bits, i.e. which bits were flipped."""
    length = component.mechanism.length  # type: ignore[attr-defined]
    rows = np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(len(payloads), -1)
    sent = np.unpackbits(rows, axis=1, count=length, bitorder="little")
    return sent ^ encode_points(component.encoder, points)


def _bitwise_rr(epsilon: float) -> Component:
    return Component(encoder=BIT_VECTOR, mechanism=BitwiseRRParams(
        length=BIT_VECTOR.output_size, epsilon=epsilon, sensitivity=BIT_VECTOR.max_hamming_distance))


def _laplace_noise(payloads: list[Any], points: np.ndarray, component: Component) -> np.ndarray:
    """Discrete Laplace: the noise of both coordinates (payload minus the rounded point), each clipped
    to [-LAPLACE_CLIP, LAPLACE_CLIP], as one category."""
    mechanism = component.mechanism
    assert isinstance(mechanism, DiscreteLaplaceParams)
    grid = [mechanism.round_to_grid(component.encoder.encode(tuple(p))) for p in points.tolist()]
    noise = np.clip(np.array([q.values for q in payloads]) - np.array(grid), -LAPLACE_CLIP, LAPLACE_CLIP)
    side = 2 * LAPLACE_CLIP + 1
    return (noise[:, 0] + LAPLACE_CLIP) + side * (noise[:, 1] + LAPLACE_CLIP)


def _laplace_expected(component: Component) -> np.ndarray:
    """P[clipped noise = k] for |k| < clip: (1 - a) / (1 + a) a^|k|; at +-clip the tail a^clip / (1 + a)."""
    a = component.mechanism.noise_decay  # type: ignore[attr-defined]
    k = np.arange(-LAPLACE_CLIP, LAPLACE_CLIP + 1)
    one = np.where(np.abs(k) == LAPLACE_CLIP, a**LAPLACE_CLIP / (1 + a), (1 - a) / (1 + a) * a ** np.abs(k))
    return np.outer(one, one).T.ravel()  # coordinate 0 varies fastest, as in the outcome


LAPLACE_CLIP = 3


def _quadrant(points: np.ndarray) -> np.ndarray:
    """Which quarter of DOMAIN each point lies in (0-3): the reports' categories are joined with it."""
    mid = (np.array(DOMAIN.lower) + np.array(DOMAIN.upper)) / 2
    return (points[:, 0] > mid[0]) + 2 * (points[:, 1] > mid[1])


def _sign_pattern(payloads: list[Any], points: np.ndarray, component: Component) -> np.ndarray:
    """Box signs (packed bytes) or the signs of an l2-ball direction, as an integer, with the point's quadrant."""
    if isinstance(payloads[0], bytes):
        pattern = np.array([p[0] for p in payloads], dtype=np.int64)
    else:
        values = np.array([p.values for p in payloads])
        pattern = ((values > 0) * (1 << np.arange(values.shape[1]))).sum(axis=1)
    return pattern * 4 + _quadrant(points)


def _signed_pattern(payloads: list[Any], points: np.ndarray, component: Component) -> np.ndarray:
    """Bucketized vector: the seed's sign of the device's own bucket, then the inner report's signs
    and the point's quadrant (:func:`_sign_pattern`)."""
    buckets, _ = encode_points(component.encoder, points)
    sigma = [sign(p.seed, int(b)) > 0 for p, b in zip(payloads, buckets.tolist())]
    inner = _sign_pattern([p.inner for p in payloads], points, component)
    return np.array(sigma, dtype=np.int64) + 2 * inner


#: Draws of the Monte Carlo estimate of a pair's outcome distribution (for the power checks): the
#: estimates' relative error is below 2 % on categories of probability 1/64.
POWER_DRAWS = 400_000


def _monte_carlo(pair_name: str) -> Callable[[Component], np.ndarray]:
    """The outcome distribution of a pair's component, estimated from POWER_DRAWS vector-mode reports."""
    def expected(component: Component) -> np.ndarray:
        pair = PAIRS[pair_name]
        points = _points(np.random.default_rng([7, 1]), POWER_DRAWS)
        reports = Population(points, seed=7, mode="vector").participate(_grid_spec(component))
        outcome = pair.outcome([r.payloads[0] for r in reports], points, component)
        counts = np.bincount(outcome, minlength=CATEGORIES[pair_name]).astype(np.float64)
        return counts / counts.sum()
    return expected


def _box(epsilon: float) -> Component:
    return Component(encoder=SymmetricBoxEncoder(domain=DOMAIN), mechanism=VectorBoxParams(dimension=2, epsilon=epsilon))


def _ball(epsilon: float) -> Component:
    return Component(encoder=UnitBallEncoder(domain=DOMAIN), mechanism=VectorL2BallParams(dimension=2, epsilon=epsilon))


def _bucketized(shape: VectorShape, lsh: Encoder, mechanism: type[BucketizedVectorParams] = BucketizedVectorParams,
                ) -> Callable[[float], Component]:
    def component(epsilon: float) -> Component:
        encoder = BucketedVectorEncoder(domain=DOMAIN, **{lsh.KIND: lsh})  # type: ignore[arg-type]
        return Component(encoder=encoder, mechanism=mechanism(
            bucket_bits=encoder.bucket_bits, dimension=3, epsilon=epsilon, shape=shape))
    return component


@dataclass(frozen=True, kw_only=True)
class _WrongCapPrivUnit(VectorPrivUnitParams):
    """Known-bad PrivUnit: a cap two members narrower (a smaller angle around x~), with the cap coin
    p = r j / (r j + m - j) of that narrower j; the same epsilon, a biased estimate."""

    @property
    def cap_size(self) -> int:
        return super().cap_size - 2


@dataclass(frozen=True, kw_only=True)
class _WrongCapBucketized(BucketizedVectorParams):
    """The bucketized vector sum with :class:`_WrongCapPrivUnit` inside."""

    @property
    def inner(self) -> _WrongCapPrivUnit:  # type: ignore[override]
        return _WrongCapPrivUnit(dimension=self.dimension, epsilon=self.epsilon)


def _privunit(epsilon: float, mechanism: type[VectorPrivUnitParams] = VectorPrivUnitParams) -> Component:
    return Component(encoder=UnitBallEncoder(domain=DOMAIN), mechanism=mechanism(dimension=2, epsilon=epsilon))


#: Bins of the alignment <w, u / ||u||> on [-1, 1] in :func:`_alignment`.
ALIGNMENT_BINS = 8


def _alignment(payloads: list[Any], points: np.ndarray, component: Component) -> np.ndarray:
    """A reported direction w's alignment <w, u / ||u||> with the randomizer's input u (the unit-ball
    vector, or the bucketized sum's signed ``sigma(b) v``), in ALIGNMENT_BINS bins: where PrivUnit's
    cap shows. (Joining the signs of w's coordinates, as :func:`_sign_pattern` does, spreads the same
    difference over 4 times the categories and costs the power check its 0.999.)"""
    if isinstance(component.encoder, BucketedVectorEncoder):
        buckets, vectors = encode_points(component.encoder, points)
        sigma = np.array([sign(p.seed, int(b)) for p, b in zip(payloads, buckets.tolist())], dtype=np.float64)
        u, w = sigma[:, None] * vectors, np.array([p.inner.values for p in payloads])
    else:
        u, w = encode_points(component.encoder, points), np.array([p.values for p in payloads])
    dots = (w * u).sum(axis=1) / np.linalg.norm(u, axis=1)
    bins = np.minimum(((dots + 1.0) / 2.0 * ALIGNMENT_BINS).astype(np.int64), ALIGNMENT_BINS - 1)
    return bins


SHIFTED_GRID = ShiftedGridEncoder(domain=DOMAIN, level=2, seed=11)
SIMHASH = SimHashEncoder(domain=DOMAIN, bits=3, seed=12)
#: Categories of the Monte Carlo pairs' outcomes.
CATEGORIES = {"vector_box x symmetric_box": 16, "vector_l2_ball x unit_ball": 16,
              "bucketized_vector box x bucketed shifted_grid": 64, "bucketized_vector ball x bucketed simhash": 64,
              "vector_privunit x unit_ball": ALIGNMENT_BINS,
              "bucketized_vector privunit x bucketed shifted_grid": ALIGNMENT_BINS}

PAIRS: dict[str, Pair] = {
    # grid_bits 1 in 2-D: scale 4 / epsilon, so a = 0.69 at 1.5 and 0.61 at 2.0 (|k| <= 3: 49 categories).
    "discrete_laplace x unit_cube": Pair(
        component=lambda eps: Component(encoder=UnitCubeEncoder(domain=DOMAIN),
                                        mechanism=DiscreteLaplaceParams(dimension=2, epsilon=eps, grid_bits=1)),
        outcome=_laplace_noise, expected=_laplace_expected, wrong_epsilon=2.0, bits=False),
    "vector_box x symmetric_box": Pair(
        component=_box, outcome=_sign_pattern, expected=_monte_carlo("vector_box x symmetric_box"),
        wrong_epsilon=2.5, bits=False),
    "vector_l2_ball x unit_ball": Pair(
        component=_ball, outcome=_sign_pattern, expected=_monte_carlo("vector_l2_ball x unit_ball"),
        wrong_epsilon=4.0, bits=False),
    "bucketized_vector box x bucketed shifted_grid": Pair(
        component=_bucketized(VectorShape.BOX, SHIFTED_GRID), outcome=_signed_pattern,
        expected=_monte_carlo("bucketized_vector box x bucketed shifted_grid"), wrong_epsilon=3.0, bits=False),
    "bucketized_vector ball x bucketed simhash": Pair(
        component=_bucketized(VectorShape.L2_BALL, SIMHASH), outcome=_signed_pattern,
        expected=_monte_carlo("bucketized_vector ball x bucketed simhash"), wrong_epsilon=4.0, bits=False),
    # PrivUnit at 1.5: in 2-D a cap of j = 12 of the 32 members, in 3-D of 11; the wrong one holds two fewer.
    "vector_privunit x unit_ball": Pair(
        component=_privunit, outcome=_alignment, expected=_monte_carlo("vector_privunit x unit_ball"),
        wrong_epsilon=EPSILON, bits=False, wrong_component=lambda: _privunit(EPSILON, _WrongCapPrivUnit)),
    "bucketized_vector privunit x bucketed shifted_grid": Pair(
        component=_bucketized(VectorShape.PRIVUNIT, SHIFTED_GRID), outcome=_alignment,
        expected=_monte_carlo("bucketized_vector privunit x bucketed shifted_grid"), wrong_epsilon=EPSILON,
        bits=False, wrong_component=lambda: _bucketized(VectorShape.PRIVUNIT, SHIFTED_GRID,
                                                        _WrongCapBucketized)(EPSILON)),
    # epsilon 1.5 over sensitivity 8: p_flip 0.453; at 3.0 0.407.
    "bitwise_rr x bitvector": Pair(
        component=_bitwise_rr, outcome=_flips, wrong_epsilon=3.0, bits=True,
        expected=lambda c: np.full(c.mechanism.length, c.mechanism.p_flip)),  # type: ignore[attr-defined]
}
NULL_TESTS = len(MECHANISMS) * len(ENCODERS) + len(PAIRS)
ALPHA = FALSE_FAILURE_RATE / NULL_TESTS


def _points(rng: np.random.Generator, n: int) -> np.ndarray:
    """Half the points in one corner cell, the rest uniform: a skewed cell distribution."""
    lo, hi = np.array(DOMAIN.lower), np.array(DOMAIN.upper)
    t = np.where(rng.random((n, 1)) < 0.5, rng.random((n, 2)) * 0.2, rng.random((n, 2)))
    return lo + t * (hi - lo)


def _outcomes(payloads: list, values: np.ndarray, mechanism: MechanismParams) -> np.ndarray:
    """One category (or 16 bits) per report, with a distribution that does not depend on the point:
    for GRR (y - v) mod D (0 with probability p, the others uniform); for unary encoding the bits
    rotated to start at bit v (bit 0 is 1 with probability p, the others independently with q); for
    local hashing (y - H(seed, v)) mod g jointly with the seed's top 2 bits. So the reports of one
    sample are i.i.d. whatever the points, as the homogeneity test assumes."""
    if isinstance(mechanism, GRRParams):
        return (np.array(payloads, dtype=np.int64) - values.astype(np.int64)) % mechanism.domain_size
    if isinstance(mechanism, LocalHashingParams):
        g = mechanism.g
        return np.array([((p.value - hash_value(p.seed, int(v), g)) % g) * 4 + (p.seed >> 30)
                         for p, v in zip(payloads, values.tolist())], dtype=np.int64)
    rows = np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(len(payloads), -1)
    bits = np.unpackbits(rows, axis=1, bitorder="little")[:, :16]
    rotate = (values.astype(np.int64)[:, None] + np.arange(16)) % 16
    return bits[np.arange(len(bits))[:, None], rotate]


def _statistic(a: np.ndarray, b: np.ndarray, categories: int) -> tuple[float, int]:
    """Chi-square homogeneity of two samples: categorical (1-D) or per bit (2-D: the sum over the 16
    independent rotated bits of the two-proportion chi-squares, chi-square with 16 dof)."""
    if a.ndim == 1:
        table = np.stack([np.bincount(a, minlength=categories), np.bincount(b, minlength=categories)])
        table = table[:, table.sum(axis=0) > 0]
    else:
        ones = np.stack([a.sum(axis=0), b.sum(axis=0)])
        table = np.stack([ones, np.array([[len(a)], [len(b)]]) - ones], axis=1)  # (sample, 1/0, bit)
        stat = sum(stats.chi2_contingency(table[:, :, j], correction=False)[0] for j in range(table.shape[2]))
        return float(stat), table.shape[2]
    stat, _, dof, _ = stats.chi2_contingency(table, correction=False)
    return float(stat), int(dof)


def _sdk_sample(name: str, encoder: Encoder, seed: int) -> tuple[np.ndarray, int]:
    mechanism = MECHANISMS[name](EPSILON)
    points = _points(np.random.default_rng(seed), SDK_N)
    reports = Population(points, seed=seed, mode="direct").participate(
        _grid_spec(Component(encoder=encoder, mechanism=mechanism)))
    values = encode_cells(encoder, points)
    categories = mechanism.g * 4 if isinstance(mechanism, LocalHashingParams) else 16
    return _outcomes([r.payloads[0] for r in reports], values, mechanism), categories


def _vector_sample(mechanism: MechanismParams, encoder: Encoder, seed: int) -> np.ndarray:
    points = _points(np.random.default_rng(seed), VECTOR_N)
    reports = Population(points, seed=seed, mode="vector").participate(
        _grid_spec(Component(encoder=encoder, mechanism=mechanism)))
    assert len(reports) == VECTOR_N
    for report in reports:
        assert mechanism.check_payload(report.payloads[0]) is not None  # the collector's payload check
    return _outcomes([r.payloads[0] for r in reports], encode_cells(encoder, points), mechanism)


@pytest.mark.parametrize("encoder_name", sorted(ENCODERS))
@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_vector_reports_follow_the_sdk_distribution(name: str, encoder_name: str) -> None:
    encoder = ENCODERS[encoder_name]
    sdk, categories = _sdk_sample(name, encoder, 100)
    vector = _vector_sample(MECHANISMS[name](EPSILON), encoder, 200)
    stat, dof = _statistic(sdk, vector, categories)
    p_value = chi2_sf(stat, dof)
    assert p_value >= ALPHA, f"{name} x {encoder_name}: chi-square {stat:.1f} on {dof} dof, p = {p_value:.3g}"
    wrong = _vector_sample(MECHANISMS[name](WRONG_EPSILON[name]), encoder, 300)
    stat_wrong, dof_wrong = _statistic(sdk, wrong, categories)
    assert chi2_sf(stat_wrong, dof_wrong) < ALPHA, f"{name} x {encoder_name}: the wrong randomizer passed"


def _expected(mechanism: MechanismParams) -> np.ndarray:
    """Per-category (GRR, local hashing) or per-bit (unary) probabilities of one report's outcome."""
    if isinstance(mechanism, GRRParams):
        return np.r_[mechanism.p, np.full(mechanism.domain_size - 1, mechanism.q)]
    if isinstance(mechanism, LocalHashingParams):
        g = mechanism.g
        d = np.r_[mechanism.p, np.full(g - 1, (1 - mechanism.p) / (g - 1))]
        return np.repeat(d, 4) / 4
    return np.r_[mechanism.p, np.full(15, mechanism.q)]  # type: ignore[attr-defined]  # the rotated bits


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_the_test_has_power(name: str) -> None:
    """Power against the wrong randomizer at ALPHA: non-central chi-square with
    lambda = n_a n_b / (n_a + n_b) * sum (a - b)^2 / c (c the pooled share; per bit for unary)."""
    a = _expected(MECHANISMS[name](EPSILON))
    b = _expected(MECHANISMS[name](WRONG_EPSILON[name]))
    achieved = power(a, b, bits=name in ("oue", "sue"))
    assert achieved >= 0.999, f"{name}: power {achieved:.4f}"


def power(a: np.ndarray, b: np.ndarray, *, bits: bool) -> float:
    """Power at ALPHA of the homogeneity test of an SDK_N sample from ``a`` against a VECTOR_N one from
    ``b``: per-category probabilities, or per-bit ones (``bits``, one 2 x 2 table per bit)."""
    n_a, n_b = SDK_N, VECTOR_N
    c = (n_a * a + n_b * b) / (n_a + n_b)
    scale = n_a * n_b / (n_a + n_b)
    if bits:
        noncentrality, dof = scale * float(np.sum((a - b) ** 2 / (c * (1 - c)))), a.size
    else:
        noncentrality, dof = scale * float(np.sum((a - b) ** 2 / c)), a.size - 1
    return float(stats.ncx2.sf(stats.chi2.isf(ALPHA, dof), dof, noncentrality))


def _pair_sample(pair: Pair, component: Component, n: int, seed: int, mode: str) -> np.ndarray:
    # The points' stream is not the population's (default_rng(seed)): shared draws would couple the
    # randomization to the points.
    points = _points(np.random.default_rng([seed, 1]), n)
    reports = Population(points, seed=seed, mode=mode).participate(_grid_spec(component))  # type: ignore[arg-type]
    assert len(reports) == n
    if mode == "vector":
        for report in reports:
            assert component.mechanism.check_payload(report.payloads[0]) is not None  # the collector's check
    return pair.outcome([r.payloads[0] for r in reports], points, component)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_center_kinds_vector_reports_follow_the_sdk_distribution(name: str) -> None:
    pair = PAIRS[name]
    sdk = _pair_sample(pair, pair.component(EPSILON), SDK_N, 100, "direct")
    vector = _pair_sample(pair, pair.component(EPSILON), VECTOR_N, 200, "vector")
    categories = 0 if pair.bits else CATEGORIES.get(name, int(max(sdk.max(), vector.max())) + 1)
    stat, dof = _statistic(sdk, vector, categories)
    p_value = chi2_sf(stat, dof)
    assert p_value >= ALPHA, f"{name}: chi-square {stat:.1f} on {dof} dof, p = {p_value:.3g}"
    wrong = _pair_sample(pair, pair.wrong(), VECTOR_N, 300, "vector")
    stat_wrong, dof_wrong = _statistic(sdk, wrong, categories)
    assert chi2_sf(stat_wrong, dof_wrong) < ALPHA, f"{name}: the wrong randomizer passed"


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_the_center_kinds_tests_have_power(name: str) -> None:
    """As :func:`test_the_test_has_power`, for the pairs."""
    pair = PAIRS[name]
    a, b = pair.expected(pair.component(EPSILON)), pair.expected(pair.wrong())
    achieved = power(a, b, bits=pair.bits)
    assert achieved >= 0.999, f"{name}: power {achieved:.4f}"


@pytest.mark.parametrize("encoder", [UnitCubeEncoder(domain=DOMAIN), SymmetricBoxEncoder(domain=DOMAIN),
                                     UnitBallEncoder(domain=DOMAIN),
                                     UnitBallEncoder(domain=NumericDomain(lower=(0.0,) * 5, upper=(1.0,) * 5))],
                         ids=lambda e: f"{e.KIND}-{e.domain.dimension}")
def test_vector_map_encoding_equals_the_sdk_encoder(encoder: Encoder) -> None:
    """Bit for bit, the corners (where the unit ball's norm may round above 1) included."""
    d = encoder.domain.dimension  # type: ignore[attr-defined]
    rng = np.random.default_rng(23)
    points = _boundary_points(rng, 3000)
    if d != 2:
        lo, hi = np.zeros(d), np.ones(d)
        corners = np.array(np.meshgrid(*[[0.0, 1.0]] * d)).reshape(d, -1).T
        points = np.concatenate([lo + rng.uniform(-0.2, 1.2, size=(3000, d)) * (hi - lo), corners,
                                 np.nextafter(corners, 0.5)])
    expected = [list(encoder.encode(tuple(p))) for p in points.tolist()]
    assert encode_points(encoder, points).tolist() == expected


def _lsh_encoders() -> list[Encoder]:
    projection = RandomProjection(input_dimension=2, output_dimension=3, seed=5)
    five = NumericDomain(lower=(-1.0,) * 5, upper=(2.0,) * 5)
    rng = np.random.default_rng(29)
    return [SimHashEncoder(domain=DOMAIN, bits=7, seed=3), SimHashEncoder(domain=DOMAIN, projection=projection, bits=64, seed=4),
            ShiftedGridEncoder(domain=DOMAIN, level=5, seed=6),
            ShiftedGridEncoder(domain=DOMAIN, projection=projection, level=9, seed=8),
            NearestCandidateEncoder(domain=DOMAIN, dimension=2, centers=(0.0, 1.0, 1.5, 2.0, 0.0, 1.0, 3.0, 3.0)),
            NearestCandidateEncoder(domain=five, dimension=5, centers=tuple(rng.uniform(-1.5, 2.5, 40).tolist())),
            BucketedVectorEncoder(domain=DOMAIN, simhash=SimHashEncoder(domain=DOMAIN, projection=projection, bits=9,
                                                                        seed=9)),
            BucketedVectorEncoder(domain=DOMAIN, shifted_grid=ShiftedGridEncoder(domain=DOMAIN, level=4, seed=10))]


@pytest.mark.parametrize("encoder", _lsh_encoders(), ids=lambda e: e.KIND)
def test_lsh_and_nearest_encodings_equal_the_sdk_encoder(encoder: Encoder) -> None:
    """Bit for bit: the projections' and hyperplanes' float sums are the SDK's, left to right."""
    d = encoder.domain.dimension  # type: ignore[attr-defined]
    rng = np.random.default_rng(31)
    points = _boundary_points(rng, 3000) if d == 2 else rng.uniform(-2.0, 3.0, size=(5000, d))
    if isinstance(encoder, NearestCandidateEncoder) and d == 2:
        # Ties: points equidistant from two candidates (the lowest index wins).
        points = np.concatenate([points, [[0.75, 1.5], [1.0, 2.0], [0.75, 1.5000000000000002]]])
    expected = [encoder.encode(tuple(p)) for p in points.tolist()]
    got = encode_points(encoder, points)
    if isinstance(encoder, BucketedVectorEncoder):
        got = [(int(b), tuple(v)) for b, v in zip(got[0].tolist(), got[1].tolist())]
        assert got == expected
    else:
        assert got.tolist() == expected


def test_bit_vector_encoding_equals_the_sdk_encoder() -> None:
    points = _boundary_points(np.random.default_rng(19), 3000)
    pivots = np.array(BIT_VECTOR.pivots)
    widths = np.repeat(BIT_VECTOR.half_widths, BIT_VECTOR.pivots_per_attribute)
    # The floats on either side of every window's edges, and the edges themselves.
    edges = np.concatenate([pivots - widths, pivots + widths])
    near = np.concatenate([edges, np.nextafter(edges, -np.inf), np.nextafter(edges, np.inf)])
    columns = np.repeat(np.arange(2), BIT_VECTOR.pivots_per_attribute)
    edge_points = np.tile(np.array(DOMAIN.lower) + 0.3, (near.size, 1))
    edge_points[np.arange(near.size), np.tile(columns, 6)] = near
    points = np.concatenate([points, edge_points])
    expected = [BIT_VECTOR.encode(tuple(p)) for p in points.tolist()]
    assert encode_points(BIT_VECTOR, points).tolist() == [list(e) for e in expected]


# -- a whole campaign ------------------------------------------------------------------------------

def _grid_ari(tmp_path: Path, mode: str, seed: int) -> float:
    x, labels = make_dataset("moons", 30_000, seed=seed)
    config = config_from_proto(build_campaign_config("grid", epsilon=4.0, bounds=numeric_bounds(x)))
    run = run_campaign(Collector(open_store(str(tmp_path / f"{mode}-{seed}"))), config, x, seed=seed, mode=mode,
                       quiet=True)  # type: ignore[arg-type]
    assert run.stats.mode == mode and run.stats.fallbacks == ()
    assert run.stats.accepted == run.stats.reports_sent == 30_000 and run.stats.rejected == 0
    return evaluate_clustering(run.result, x, labels)["ari"]


def test_the_collector_accepts_vector_reports_and_the_clustering_matches_direct_mode(tmp_path: Path) -> None:
    """Median ARI over 5 seeds of a moons grid campaign (n = 3e4, epsilon 4), vector vs direct mode.

    The modes share the points and differ only in the randomization stream, so their ARI follow
    the same distribution. The tolerance is a coarse margin, not a derived bound: on these seeds
    direct mode alone spreads from 0.83 to 1.0 (the grid's noise decides whether the moons' tips
    join), so five seeds resolve the median to about 0.1; the exact checks are the two-sample
    distribution tests above. A vector mode that biased the reports (a wrong p, cells shifted by
    one) breaks those, and the collector's acceptance of every report is checked here.
    """
    seeds = range(5)
    direct = [_grid_ari(tmp_path, "direct", seed) for seed in seeds]
    vector = [_grid_ari(tmp_path, "vector", seed) for seed in seeds]
    assert abs(float(np.median(vector)) - float(np.median(direct))) <= 0.15, (direct, vector)
    assert float(np.median(vector)) >= 0.9, vector
