"""Encoders: contract (serde, validation, clamping, bad points), exact semantics, public randomness."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ldp_client.encoders import (
    ENCODERS,
    BitVectorEncoder,
    BucketedVectorEncoder,
    CategoricalEncoder,
    CellListEncoder,
    Encoder,
    GridTreeEncoder,
    NearestCandidateEncoder,
    NumericDomain,
    RandomProjection,
    ShiftedGridEncoder,
    SimHashEncoder,
    SymmetricBoxEncoder,
    TreeCell,
    UniformGridEncoder,
    UnitBallEncoder,
    UnitCubeEncoder,
)
from ldp_client.encoders.geometry import morton_decode, morton_encode, tree_children, tree_parent
from ldp_client.encoders.lsh import CLAMP_PROBABILITY
from ldp_client.encoders.projection import (
    PURPOSE_HYPERPLANES,
    PURPOSE_PROJECTION,
    PURPOSE_SHIFT,
    dot,
    gaussian_matrix,
    gaussian_values,
    mix64,
    rademacher_matrix,
    rademacher_signs,
    splitmix64,
    stream_key,
    stream_words,
    uniform_values,
)
from ldp_client.errors import EncodingError, InvalidParameterError, ProtocolError
from ldp_client.mechanisms import GRRParams
from ldp_client.rng import SeededRng
from ldp_client.spec import Component

DOMAIN2 = NumericDomain(lower=(-2.0, 10.0), upper=(2.0, 30.0))
DOMAIN3 = NumericDomain(lower=(0.0, 0.0, -1.0), upper=(1.0, 5.0, 1.0))
PROJ = RandomProjection(input_dimension=3, output_dimension=2, seed=99)


def _quadtree_cells() -> tuple[TreeCell, ...]:
    root = TreeCell(level=0, morton_index=0)
    cells = list(tree_children(root, 2))
    first = cells.pop(0)
    cells += list(tree_children(first, 2))
    return tuple(cells)


NUMERIC_ENCODERS: list[Encoder] = [
    UniformGridEncoder(domain=DOMAIN2, cells_per_dimension=(3, 7)),
    GridTreeEncoder(domain=DOMAIN2, level=5),
    CellListEncoder(domain=DOMAIN2, cells=_quadtree_cells()),
    SimHashEncoder(domain=DOMAIN3, bits=12, seed=7),
    SimHashEncoder(domain=DOMAIN3, projection=PROJ, bits=5, seed=2**64 - 1),
    ShiftedGridEncoder(domain=DOMAIN3, level=4, seed=11),
    ShiftedGridEncoder(domain=DOMAIN3, projection=PROJ, level=9, seed=0),
    NearestCandidateEncoder(domain=DOMAIN2, dimension=2, centers=(0.0, 12.0, 1.5, 29.0, -3.0, 20.0)),
    BitVectorEncoder(domain=DOMAIN2, pivots=(-1.0, 0.0, 1.0, 15.0, 25.0), pivots_per_attribute=(3, 2),
                     half_widths=(0.75, 6.0)),
    UnitCubeEncoder(domain=DOMAIN3),
    SymmetricBoxEncoder(domain=DOMAIN3),
    UnitBallEncoder(domain=DOMAIN3),
]
ALL_ENCODERS: list[Encoder] = [
    CategoricalEncoder(domain_size=17), *NUMERIC_ENCODERS,
    BucketedVectorEncoder(domain=DOMAIN3, shifted_grid=ShiftedGridEncoder(domain=DOMAIN3, level=4, seed=11))]

coordinate = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


def _ids(encoders: list[Encoder]) -> list[str]:
    return [f"{e.KIND}-{i}" for i, e in enumerate(encoders)]


# ------------------------------------------------------------------------------------------------
# The shared contract
# ------------------------------------------------------------------------------------------------


def test_every_kind_is_registered_and_covered() -> None:
    assert set(ENCODERS.kinds()) == {
        "categorical", "uniform_grid", "grid_tree", "cell_list", "simhash", "shifted_grid",
        "nearest_candidate", "bit_vector", "unit_cube", "symmetric_box", "unit_ball", "bucketed_vector"}
    assert {e.KIND for e in ALL_ENCODERS} == set(ENCODERS.kinds())


@pytest.mark.parametrize("encoder", ALL_ENCODERS, ids=_ids(ALL_ENCODERS))
def test_serde_round_trip(encoder: Encoder) -> None:
    dumped = ENCODERS.dump(encoder)
    assert ENCODERS.load(dumped) == encoder
    wire = msgpack.unpackb(msgpack.packb(dumped, use_bin_type=True), raw=False)
    loaded = ENCODERS.load(wire)
    assert loaded == encoder
    assert type(loaded) is type(encoder)
    assert loaded.output_size == encoder.output_size


@pytest.mark.parametrize("encoder", ALL_ENCODERS, ids=_ids(ALL_ENCODERS))
def test_malformed_specs_are_protocol_errors(encoder: Encoder) -> None:
    fields = encoder.to_dict()
    with pytest.raises(ProtocolError, match="unknown field"):
        ENCODERS.load({encoder.KIND: {**fields, "bogus": 1}})
    for name in fields:
        with pytest.raises(ProtocolError):
            ENCODERS.load({encoder.KIND: {**fields, name: "garbage"}})


@pytest.mark.parametrize("encoder", NUMERIC_ENCODERS, ids=_ids(NUMERIC_ENCODERS))
def test_bad_points_raise_encoding_error(encoder: Encoder) -> None:
    d = len(encoder.domain.lower)  # type: ignore[attr-defined]
    good = [0.5] * d
    encoder.encode(good)
    bad: list[Any] = [
        [math.nan] + good[1:],
        good[:-1] + [math.inf],
        [-math.inf] + good[1:],
        good[:-1],
        good + [0.0],
        [],
        "0.5" * d,
        b"ab",
        None,
        0.5,
        ["a"] + good[1:],
        [None] + good[1:],
        [[0.5]] + good[1:],
    ]
    for point in bad:
        with pytest.raises(EncodingError):
            encoder.encode(point)
    assert issubclass(EncodingError, ValueError)


@settings(max_examples=60, deadline=None)
@given(st.lists(coordinate, min_size=3, max_size=3))
def test_out_of_domain_points_are_clamped(raw: list[float]) -> None:
    for encoder in NUMERIC_ENCODERS:
        domain: NumericDomain = encoder.domain  # type: ignore[attr-defined]
        point = raw[:domain.dimension]
        clamped = [min(max(x, lo), hi) for x, lo, hi in zip(point, domain.lower, domain.upper)]
        assert encoder.encode(point) == encoder.encode(clamped)


@settings(max_examples=40, deadline=None)
@given(st.lists(coordinate, min_size=3, max_size=3))
def test_values_are_in_range_for_their_kind(raw: list[float]) -> None:
    for encoder in NUMERIC_ENCODERS:
        value = encoder.encode(raw[:encoder.domain.dimension])  # type: ignore[attr-defined]
        if encoder.VALUE_KIND == "index":
            assert isinstance(value, int) and 0 <= value < encoder.output_size
        elif encoder.VALUE_KIND == "bits":
            assert len(value) == encoder.output_size and set(value) <= {0, 1}
            assert all(type(b) is int for b in value)
        else:
            assert isinstance(value, tuple) and len(value) == encoder.output_size
            assert all(type(x) is float for x in value)


def test_numpy_scalars_are_accepted() -> None:
    np = pytest.importorskip("numpy")
    encoder = UniformGridEncoder(domain=DOMAIN2, cells_per_dimension=(4, 4))
    assert encoder.encode(np.array([0.1, 20.0])) == encoder.encode([0.1, 20.0])
    assert CategoricalEncoder(domain_size=5).encode(np.int64(3)) == 3


def test_component_runs_an_encoder_with_a_mechanism() -> None:
    encoder = UniformGridEncoder(domain=DOMAIN2, cells_per_dimension=(2, 3))
    component = Component(encoder=encoder, mechanism=GRRParams(domain_size=6, epsilon=1.0))
    payload = component.run([0.5, 12.0], rng=SeededRng(1))
    assert 0 <= payload < 6
    with pytest.raises(InvalidParameterError, match="input size"):
        Component(encoder=encoder, mechanism=GRRParams(domain_size=5, epsilon=1.0))


# ------------------------------------------------------------------------------------------------
# Parameter validation
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("build, error", [
    (lambda: CategoricalEncoder(domain_size=0), InvalidParameterError),
    (lambda: CategoricalEncoder(domain_size=2**64), InvalidParameterError),
    (lambda: CategoricalEncoder(domain_size=2.0), TypeError),  # type: ignore[arg-type]
    (lambda: CategoricalEncoder(domain_size=True), TypeError),
    (lambda: UniformGridEncoder(domain=(0, 1), cells_per_dimension=(2,)), TypeError),  # type: ignore[arg-type]
    (lambda: UniformGridEncoder(domain=DOMAIN2, cells_per_dimension=(2,)), InvalidParameterError),
    (lambda: UniformGridEncoder(domain=DOMAIN2, cells_per_dimension=(2, 0)), InvalidParameterError),
    (lambda: UniformGridEncoder(domain=DOMAIN2, cells_per_dimension=(2, 2.0)), TypeError),  # type: ignore[arg-type]
    (lambda: UniformGridEncoder(domain=DOMAIN2, cells_per_dimension=5), TypeError),  # type: ignore[arg-type]
    (lambda: UniformGridEncoder(domain=DOMAIN3, cells_per_dimension=(2**32 - 1,) * 3), InvalidParameterError),
    (lambda: GridTreeEncoder(domain=DOMAIN2, level=33), InvalidParameterError),
    (lambda: GridTreeEncoder(domain=DOMAIN2, level=-1), InvalidParameterError),
    (lambda: CellListEncoder(domain=DOMAIN2, cells=_quadtree_cells()[1:]), InvalidParameterError),
    (lambda: CellListEncoder(domain=DOMAIN2, cells=()), InvalidParameterError),
    (lambda: CellListEncoder(domain=DOMAIN2, cells=((0, 0),)), TypeError),  # type: ignore[arg-type]
    (lambda: SimHashEncoder(domain=DOMAIN3, bits=0, seed=1), InvalidParameterError),
    (lambda: SimHashEncoder(domain=DOMAIN3, bits=65, seed=1), InvalidParameterError),
    (lambda: SimHashEncoder(domain=DOMAIN3, bits=8, seed=-1), InvalidParameterError),
    (lambda: SimHashEncoder(domain=DOMAIN3, bits=8, seed=2**64), InvalidParameterError),
    (lambda: SimHashEncoder(domain=DOMAIN2, projection=PROJ, bits=8, seed=1), InvalidParameterError),
    (lambda: SimHashEncoder(domain=DOMAIN3, projection={"seed": 1}, bits=8, seed=1), TypeError),  # type: ignore[arg-type]
    (lambda: ShiftedGridEncoder(domain=DOMAIN3, projection=PROJ, level=33, seed=1), InvalidParameterError),
    (lambda: ShiftedGridEncoder(domain=DOMAIN3, level=22, seed=1), InvalidParameterError),
    (lambda: RandomProjection(input_dimension=0, output_dimension=2, seed=1), InvalidParameterError),
    (lambda: RandomProjection(input_dimension=4096, output_dimension=4096, seed=1), InvalidParameterError),
    (lambda: NearestCandidateEncoder(domain=DOMAIN2, dimension=3, centers=(0.0,) * 6), InvalidParameterError),
    (lambda: NearestCandidateEncoder(domain=DOMAIN2, dimension=2, centers=(0.0,) * 3), InvalidParameterError),
    (lambda: NearestCandidateEncoder(domain=DOMAIN2, dimension=2, centers=()), InvalidParameterError),
    (lambda: NearestCandidateEncoder(domain=DOMAIN2, dimension=2, centers=(0.0, math.nan)), InvalidParameterError),
    (lambda: NearestCandidateEncoder(domain=DOMAIN2, dimension=2, centers=(0.0, "1")), TypeError),  # type: ignore[arg-type]
    (lambda: BitVectorEncoder(domain=DOMAIN2, pivots=(0.0,), pivots_per_attribute=(1,), half_widths=(1.0, 1.0)),
     InvalidParameterError),
    (lambda: BitVectorEncoder(domain=DOMAIN2, pivots=(0.0,), pivots_per_attribute=(1, 1), half_widths=(1.0, 1.0)),
     InvalidParameterError),
    (lambda: BitVectorEncoder(domain=DOMAIN2, pivots=(), pivots_per_attribute=(0, 0), half_widths=(1.0, 1.0)),
     InvalidParameterError),
    (lambda: BitVectorEncoder(domain=DOMAIN2, pivots=(0.0,), pivots_per_attribute=(1, 0), half_widths=(0.0, 1.0)),
     InvalidParameterError),
    (lambda: BitVectorEncoder(domain=DOMAIN2, pivots=(0.0,), pivots_per_attribute=(1, 0),
                              half_widths=(math.inf, 1.0)), InvalidParameterError),
    (lambda: BitVectorEncoder(domain=DOMAIN2, pivots=(0.0,), pivots_per_attribute=(1.0, 0),  # type: ignore[arg-type]
                              half_widths=(1.0, 1.0)), TypeError),
    (lambda: UnitBallEncoder(domain=None), TypeError),  # type: ignore[arg-type]
])
def test_invalid_parameters_are_rejected_eagerly(build: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        build()


def test_error_messages_name_parameter_range_and_value() -> None:
    with pytest.raises(InvalidParameterError, match=r"level must be in \[0, 32\], got 40"):
        GridTreeEncoder(domain=DOMAIN2, level=40)
    with pytest.raises(InvalidParameterError, match=r"bits must be in \[1, 64\], got 0"):
        SimHashEncoder(domain=DOMAIN3, bits=0, seed=1)


# ------------------------------------------------------------------------------------------------
# Categorical
# ------------------------------------------------------------------------------------------------


def test_categorical() -> None:
    encoder = CategoricalEncoder(domain_size=4)
    assert [encoder.encode(i) for i in range(4)] == [0, 1, 2, 3]
    assert encoder.output_size == 4 and encoder.VALUE_KIND == "index"
    for bad in (4, -1, 1.0, True, "1", None, [1]):
        with pytest.raises(EncodingError):
            encoder.encode(bad)


# ------------------------------------------------------------------------------------------------
# Grids
# ------------------------------------------------------------------------------------------------


@given(st.lists(st.floats(-5, 35, allow_nan=False), min_size=2, max_size=2), st.integers(1, 50),
       st.integers(1, 50))
def test_uniform_grid_cell_holds_the_point(point: list[float], m0: int, m1: int) -> None:
    encoder = UniformGridEncoder(domain=DOMAIN2, cells_per_dimension=(m0, m1))
    index = encoder.encode(point)
    unit = DOMAIN2.normalize(point)
    lower, upper = encoder.cell_bounds(index, normalized=True)
    assert all(lo <= t <= hi for lo, t, hi in zip(lower, unit, upper))
    # exactly: c/m <= t < (c+1)/m
    for t, lo_cell, m in zip(unit, divmod(index, m1), (m0, m1)):
        assert Fraction(lo_cell, m) <= Fraction(t) and (Fraction(t) < Fraction(lo_cell + 1, m) or t == 1.0)
    lower, upper = encoder.cell_bounds(index)
    clamped = [min(max(x, lo), hi) for x, lo, hi in zip(point, DOMAIN2.lower, DOMAIN2.upper)]
    for lo, x, hi, span in zip(lower, clamped, upper, (4.0, 20.0)):
        assert lo - 1e-12 * span <= x <= hi + 1e-12 * span


def test_uniform_grid_hand_values() -> None:
    encoder = UniformGridEncoder(domain=DOMAIN2, cells_per_dimension=(2, 4))
    assert encoder.encode([-2.0, 10.0]) == 0
    assert encoder.encode([-1.0, 29.0]) == 3
    assert encoder.encode([2.0, 10.0]) == 4
    assert encoder.encode([2.0, 30.0]) == 7  # the upper faces belong to the last cells
    assert encoder.encode([100.0, -100.0]) == 4
    assert encoder.cell_bounds(7) == ((0.0, 25.0), (2.0, 30.0))
    assert encoder.output_size == 8


@given(st.lists(st.floats(-3, 33, allow_nan=False), min_size=2, max_size=2), st.integers(1, 32))
def test_grid_tree_levels_nest(point: list[float], level: int) -> None:
    encoder = GridTreeEncoder(domain=DOMAIN2, level=level)
    coarser = GridTreeEncoder(domain=DOMAIN2, level=level - 1)
    index = encoder.encode(point)
    assert index >> 2 == coarser.encode(point)
    assert tree_parent(encoder.cell(index), 2) == coarser.cell(index >> 2)
    lower, upper = encoder.cell_bounds(index, normalized=True)
    assert all(lo <= t <= hi for lo, t, hi in zip(lower, DOMAIN2.normalize(point), upper))


def test_grid_tree_hand_values() -> None:
    encoder = GridTreeEncoder(domain=DOMAIN2, level=1)
    assert encoder.output_size == 4
    assert encoder.encode([-1.0, 11.0]) == 0
    assert encoder.encode([1.0, 11.0]) == 1  # dimension 0 is the low bit
    assert encoder.encode([-1.0, 29.0]) == 2
    assert encoder.encode([1.0, 29.0]) == 3
    assert encoder.cell_bounds(1) == ((0.0, 10.0), (2.0, 20.0))
    assert GridTreeEncoder(domain=DOMAIN2, level=0).encode([0.0, 0.0]) == 0
    assert GridTreeEncoder(domain=NumericDomain.unit(1), level=64).encode([1.0]) == 2**64 - 1


@given(st.lists(st.floats(-3, 33, allow_nan=False), min_size=2, max_size=2))
def test_cell_list_matches_brute_force(point: list[float]) -> None:
    encoder = NUMERIC_ENCODERS[2]
    assert isinstance(encoder, CellListEncoder)
    position = encoder.encode(point)
    unit = DOMAIN2.normalize(point)
    holders = []
    for i, c in enumerate(encoder.cells):
        coords = morton_decode(c.morton_index, 2, c.level)
        side = 2**c.level
        if all(x == min(int(t * side), side - 1) for x, t in zip(coords, unit)):
            holders.append(i)
    assert holders == [position]
    lower, upper = encoder.cell_bounds(position, normalized=True)
    assert all(lo <= t <= hi for lo, t, hi in zip(lower, unit, upper))


def test_cell_list_hand_values() -> None:
    cells = _quadtree_cells()  # three level-1 quarters, then the four level-2 cells of quarter 0
    encoder = CellListEncoder(domain=NumericDomain.unit(2), cells=cells)
    assert encoder.output_size == 7
    assert encoder.encode([0.9, 0.1]) == 0
    assert encoder.encode([0.1, 0.9]) == 1
    assert encoder.encode([0.9, 0.9]) == 2
    assert encoder.encode([0.1, 0.1]) == 3
    assert encoder.encode([0.3, 0.1]) == 4
    assert encoder.encode([0.1, 0.3]) == 5
    assert encoder.encode([0.3, 0.3]) == 6
    assert encoder.encode([0.25, 0.25]) == 6 and encoder.encode([0.5, 0.5]) == 2


# ------------------------------------------------------------------------------------------------
# LSH: SimHash and shifted grids
# ------------------------------------------------------------------------------------------------


def _centred(domain: NumericDomain, point: list[float]) -> list[float]:
    return [2 * t - 1 for t in domain.normalize(point)]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-2, 6, allow_nan=False), min_size=3, max_size=3), st.integers(0, 2**64 - 1))
def test_simhash_definition_and_prefixes(point: list[float], seed: int) -> None:
    long = SimHashEncoder(domain=DOMAIN3, bits=16, seed=seed)
    short = SimHashEncoder(domain=DOMAIN3, bits=5, seed=seed)
    value = long.encode(point)
    assert short.encode(point) == value >> 11  # the hyperplanes of a shorter hash are a prefix
    y = _centred(DOMAIN3, point)
    normals = gaussian_matrix(seed, 16, 3)
    expected = [1 if sum(g * x for g, x in zip(row, y)) >= 0 else 0 for row in normals]
    assert value == int("".join(map(str, expected)), 2)


def test_simhash_with_projection_and_opposite_points() -> None:
    encoder = SimHashEncoder(domain=DOMAIN3, projection=PROJ, bits=20, seed=5)
    y = _centred(DOMAIN3, [0.9, 1.0, 0.3])
    z = [sum(a * b for a, b in zip(row, y)) for row in rademacher_matrix(99, 2, 3)]
    normals = gaussian_matrix(5, 20, 2)
    bits = "".join("1" if sum(g * x for g, x in zip(row, z)) >= 0 else "0" for row in normals)
    assert encoder.encode([0.9, 1.0, 0.3]) == int(bits, 2)
    # antipodal points (about the centre of the box) get complementary hashes (no zero dot products here)
    plain = SimHashEncoder(domain=NumericDomain.unit(2), bits=10, seed=3)
    assert plain.encode([0.2, 0.9]) ^ plain.encode([0.8, 0.1]) == 2**10 - 1
    assert plain.encode([0.5, 0.5]) == 2**10 - 1  # the centre: every dot product is 0 -> bit 1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-2, 6, allow_nan=False), min_size=3, max_size=3), st.integers(1, 21))
def test_shifted_grid_definition_and_nesting(point: list[float], level: int) -> None:
    encoder = ShiftedGridEncoder(domain=DOMAIN3, level=level, seed=1234)
    coarser = ShiftedGridEncoder(domain=DOMAIN3, level=level - 1, seed=1234)
    value = encoder.encode(point)
    assert value >> 3 == coarser.encode(point)
    shift = uniform_values(1234, PURPOSE_SHIFT, 3)
    assert encoder.shift == tuple(shift)
    assert encoder.half_width == 1.0
    coords = []
    for y, s in zip(_centred(DOMAIN3, point), shift):
        v = ((y + 1.0) / 2.0 + s) / 2.0  # the documented construction, in floats
        assert 0.0 <= v <= 1.0
        coords.append(min(math.floor(v * 2**level), 2**level - 1))
    assert morton_decode(value, 3, level) == tuple(coords)


def test_shifted_grid_projected_box() -> None:
    d, k = 100, 16
    domain = NumericDomain.unit(d)
    projection = RandomProjection(input_dimension=d, output_dimension=k, seed=8)
    encoder = ShiftedGridEncoder(domain=domain, projection=projection, level=4, seed=3)
    radius = math.sqrt(2 * d * math.log(2 * k / CLAMP_PROBABILITY) / k)
    assert encoder.half_width == pytest.approx(radius) and radius < d / math.sqrt(k)
    assert encoder.cell_side() == pytest.approx(4 * radius / 16)
    assert encoder.output_size == 2**64
    # small projections use the exact bound d / sqrt(k): nothing can ever be clamped
    small = ShiftedGridEncoder(domain=DOMAIN3, projection=PROJ, level=3, seed=3)
    assert small.half_width == pytest.approx(3 / math.sqrt(2))
    # typical points stay well inside the box
    rng = SeededRng(5)
    for _ in range(200):
        y = [2 * rng.uniform() - 1 for _ in range(d)]
        assert max(abs(z) for z in projection.apply(y)) < radius
    # the corner that maximises row 0 exceeds R and is clamped into the boundary cell, not rejected
    corner = [1.0 if s > 0 else 0.0 for s in projection.matrix[0]]
    assert projection.apply(_centred(domain, corner))[0] > radius
    assert 0 <= encoder.encode(corner) < encoder.output_size


# ------------------------------------------------------------------------------------------------
# Nearest candidate
# ------------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 35, allow_nan=False), min_size=2, max_size=2),
       st.lists(st.integers(-4, 32), min_size=2, max_size=20))
def test_nearest_candidate_matches_brute_force(point: list[float], raw: list[int]) -> None:
    centers = tuple(float(v) for v in raw[:len(raw) // 2 * 2])
    encoder = NearestCandidateEncoder(domain=DOMAIN2, dimension=2, centers=centers)
    x = [min(max(point[0], -2.0), 2.0), min(max(point[1], 10.0), 30.0)]
    rows = [centers[i:i + 2] for i in range(0, len(centers), 2)]
    exact = [sum((Fraction(a) - Fraction(b)) ** 2 for a, b in zip(x, row)) for row in rows]
    # Exactly nearest (docs/protocol.md §11.7): near-ties that doubles cannot separate (e.g. 104 - 4e
    # vs 104 - 20e at e = 1e-38) are compared exactly; only exact ties go to the lowest index.
    assert encoder.encode(point) == exact.index(min(exact))


def test_a_domain_whose_extent_overflows_is_rejected() -> None:
    # upper - lower = 2e308 rounds to infinity: normalization would send every point to 0 or NaN
    with pytest.raises(InvalidParameterError, match=r"upper - lower must be finite in binary64"):
        NumericDomain(lower=(0.0, -1e308), upper=(1.0, 1e308))
    assert NumericDomain(lower=(-8e307,), upper=(8e307,)).dimension == 1


def test_nearest_candidate_is_exact_where_rounded_distances_tie() -> None:
    # From 1, the centers -2^-60 and 2^-60 are 1 + 2^-60 and 1 - 2^-60 away: both round to 1.0 in
    # binary64 (math.dist ties them, which would pick index 0), but center 1 is nearer.
    encoder = NearestCandidateEncoder(domain=NumericDomain(lower=(0.0,), upper=(2.0,)), dimension=1,
                                      centers=(-(2.0**-60), 2.0**-60))
    assert math.dist([1.0], [-(2.0**-60)]) == math.dist([1.0], [2.0**-60])
    assert encoder.encode([1.0]) == 1
    # an exact tie still goes to the lowest index, and coordinates near the float limits do not overflow
    encoder = NearestCandidateEncoder(domain=NumericDomain(lower=(-8e307,), upper=(8e307,)), dimension=1,
                                      centers=(1.7e308, -1.7e308))
    assert encoder.encode([0.0]) == 0
    assert encoder.encode([-8e307]) == 1
    # both distances (2.5e308 and 1.8e308) exceed the largest double
    encoder = NearestCandidateEncoder(domain=NumericDomain(lower=(-8e307,), upper=(8e307,)), dimension=1,
                                      centers=(-1.7e308, -1e308))
    assert encoder.encode([8e307]) == 1


def test_nearest_candidate_ties_and_units() -> None:
    encoder = NearestCandidateEncoder(domain=DOMAIN2, dimension=2, centers=(0.0, 20.0, 0.0, 20.0, 1.0, 20.0))
    assert encoder.encode([0.0, 20.0]) == 0  # duplicate centers: the lowest index
    assert encoder.encode([0.5, 20.0]) == 0  # equidistant from 0 and 2: the lowest index
    assert encoder.encode([0.9, 20.0]) == 2
    # original units: from (-2, 10), center 0 = (2, 10) is 4 away and center 1 = (-2, 16) is 6 away;
    # in normalized units (spans 4 and 20) they would be 1.0 and 0.3 away, the other way round.
    encoder = NearestCandidateEncoder(domain=DOMAIN2, dimension=2, centers=(2.0, 10.0, -2.0, 16.0))
    assert encoder.encode([-2.0, 10.0]) == 0
    assert encoder.candidate_count == 2 and encoder.center_rows == ((2.0, 10.0), (-2.0, 16.0))
    assert encoder.encode([50.0, -50.0]) == 0  # clamped to (2, 10) first


# ------------------------------------------------------------------------------------------------
# Bit vectors
# ------------------------------------------------------------------------------------------------


def test_bit_vector_hand_values() -> None:
    encoder = NUMERIC_ENCODERS[8]
    assert isinstance(encoder, BitVectorEncoder)
    assert encoder.output_size == 5 and encoder.VALUE_KIND == "bits"
    assert encoder.encode([0.0, 20.0]) == (0, 1, 0, 1, 1)
    assert encoder.encode([-0.25, 9.0]) == (1, 1, 0, 1, 0)  # 9 clamps to 10: |10 - 15| <= 6
    assert encoder.encode([0.75, 31.0]) == (0, 1, 1, 0, 1)  # |0.75 - 0| <= 0.75: closed interval
    # attribute 0: pivots -1, 0, 1 with width 0.75 over [-2, 2]: (1,1,0) at -0.5 vs (0,0,1) at 1: 3;
    # attribute 1: pivots 15, 25 with width 6 over [10, 30]: (1,0) at 10 vs (0,1) at 30: 2
    assert encoder.max_hamming_distance == 5
    assert _brute_force_max_hamming(encoder, 80) == 5


def _brute_force_max_hamming(encoder: BitVectorEncoder, steps: int) -> int:
    domain = encoder.domain
    axes = [[lo + (hi - lo) * i / steps for i in range(steps + 1)] for lo, hi in zip(domain.lower, domain.upper)]
    codes = {encoder.encode(list(p)) for p in itertools.product(*axes)}
    return max(sum(a != b for a, b in zip(u, v)) for u in codes for v in codes)


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_max_hamming_distance_equals_brute_force(data: st.DataObject) -> None:
    d = data.draw(st.integers(1, 2))
    counts = tuple(data.draw(st.integers(0, 4)) for _ in range(d))
    if sum(counts) == 0:
        counts = (1,) + counts[1:]
    # dyadic pivots and widths so every run end is on the brute-force grid (step 1/64)
    pivots = tuple(data.draw(st.integers(-4, 12)) / 8 for _ in range(sum(counts)))
    widths = tuple(data.draw(st.integers(1, 8)) / 16 for _ in range(d))
    encoder = BitVectorEncoder(domain=NumericDomain.unit(d), pivots=pivots, pivots_per_attribute=counts,
                               half_widths=widths)
    assert encoder.max_hamming_distance == _brute_force_max_hamming(encoder, 64 if d == 1 else 32)


def test_max_hamming_distance_with_inexact_breakpoints() -> None:
    # pivots and widths that are not binary fractions: the run ends fall between grid points
    encoder = BitVectorEncoder(domain=NumericDomain(lower=(0.1,), upper=(0.7,)), pivots=(0.2, 0.3, 0.45, 0.6),
                               pivots_per_attribute=(4,), half_widths=(0.1,))
    # the (float) run of pivot 0.2 is [0.1, 0.30000000000000004] etc.; brute force on a fine grid
    assert encoder.max_hamming_distance == _brute_force_max_hamming(encoder, 6000)
    far = BitVectorEncoder(domain=NumericDomain.unit(1), pivots=(5.0,), pivots_per_attribute=(1,), half_widths=(1.0,))
    assert far.max_hamming_distance == 0 and far.encode([1.0]) == (0,)
    wide = BitVectorEncoder(domain=NumericDomain.unit(1), pivots=(0.5, 3.0), pivots_per_attribute=(2,),
                            half_widths=(2.25,))
    assert wide.max_hamming_distance == 1  # pivot 0.5 covers everything; pivot 3 only x >= 0.75


# ------------------------------------------------------------------------------------------------
# Vectors
# ------------------------------------------------------------------------------------------------


@given(st.lists(coordinate, min_size=3, max_size=3))
def test_vector_encoders(point: list[float]) -> None:
    t = DOMAIN3.normalize(point)
    assert UnitCubeEncoder(domain=DOMAIN3).encode(point) == tuple(t)
    box = SymmetricBoxEncoder(domain=DOMAIN3).encode(point)
    assert box == tuple(2 * x - 1 for x in t) and all(-1.0 <= x <= 1.0 for x in box)
    ball = UnitBallEncoder(domain=DOMAIN3).encode(point)
    assert math.hypot(*ball) <= 1.0
    assert ball == pytest.approx([(2 * x - 1) / math.sqrt(3) for x in t], abs=1e-15)


@pytest.mark.parametrize("d", list(range(1, 40)) + [100, 1000])
def test_unit_ball_corners_have_norm_at_most_one(d: int) -> None:
    encoder = UnitBallEncoder(domain=NumericDomain.unit(d))
    for corner in ([1.0] * d, [0.0] * d, [float(i % 2) for i in range(d)]):
        v = encoder.encode(corner)
        assert math.hypot(*v) <= 1.0 and math.fsum(x * x for x in v) <= 1.0 and sum(x * x for x in v) <= 1.0
        assert math.hypot(*v) > 1.0 - 1e-12


# ------------------------------------------------------------------------------------------------
# The public counter-mode generator
# ------------------------------------------------------------------------------------------------


def test_generator_pinned_values() -> None:
    # SplitMix64 reference outputs for state 0 (Steele, Lea and Flood; Vigna's splitmix64.c).
    assert [splitmix64(0, i) for i in range(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert mix64(1) == 0x5692161D100B05E5
    assert PURPOSE_PROJECTION == 0x6C64702E70726F6A
    assert PURPOSE_HYPERPLANES == 0x6C64702E68797072
    assert PURPOSE_SHIFT == 0x6C64702E73686674
    assert stream_words(42, PURPOSE_PROJECTION, 3) == [0x7AD44B5ABC66E4B5, 0x599856B1BA2A88BD, 0x975B65A06B025E2E]
    assert stream_words(2**64 - 1, PURPOSE_SHIFT, 2, start=1000) == [0x26B8BAFC26792B08, 0xDC0A415A0E653195]
    assert uniform_values(7, PURPOSE_SHIFT, 3) == [0.3176257150294651, 0.2554743893474556, 0.11939853014994972]
    assert rademacher_signs(42, PURPOSE_PROJECTION, 12) == [-1, 1, -1, 1, -1, -1, 1, -1, 1, 1, -1, 1]
    s = 1 / math.sqrt(2)
    assert rademacher_matrix(42, 2, 3) == ((-s, s, -s), (s, -s, -s))
    # libm may differ in the last ulp across platforms; the value is pinned to 1e-13.
    assert gaussian_values(7, PURPOSE_HYPERPLANES, 3) == pytest.approx(
        [2.091340329220183, -0.22745040484294904, -0.8901070546696623], rel=1e-13)


def test_generator_is_stateless_and_streams_are_separated() -> None:
    words = stream_words(5, PURPOSE_SHIFT, 10)
    assert stream_words(5, PURPOSE_SHIFT, 4, start=6) == words[6:]
    assert words == [splitmix64(stream_key(5, PURPOSE_SHIFT), i) for i in range(10)]
    assert stream_words(5, PURPOSE_PROJECTION, 10) != words
    assert gaussian_matrix(5, 3, 4) != gaussian_matrix(5, 3, 4, PURPOSE_PROJECTION)


def test_numpy_reimplementation_agrees_bit_for_bit() -> None:
    np = pytest.importorskip("numpy")
    mask = np.uint64(2**64 - 1)

    def np_mix64(z: Any) -> Any:
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    def np_words(seed: int, purpose: int, count: int) -> Any:
        key = np_mix64(np.array([(seed ^ purpose) & int(mask)], dtype=np.uint64))[0]
        counters = np.arange(1, count + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            return np_mix64(key + counters * np.uint64(0x9E3779B97F4A7C15))

    with np.errstate(over="ignore"):
        for seed in (0, 1, 42, 2**63 + 12345, 2**64 - 1):
            for purpose in (PURPOSE_PROJECTION, PURPOSE_HYPERPLANES, PURPOSE_SHIFT):
                words = np_words(seed, purpose, 300)
                assert [int(w) for w in words] == stream_words(seed, purpose, 300)
                uniforms = (words >> np.uint64(11)).astype(np.float64) * 2.0**-53
                assert uniforms.tolist() == uniform_values(seed, purpose, 300)
                bits = (words[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
                signs = 1 - 2 * bits.reshape(-1).astype(np.int64)
                assert signs[:1000].tolist() == rademacher_signs(seed, purpose, 1000)
                u1 = 1.0 - uniforms[0::2]
                u2 = uniforms[1::2]
                gauss = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
                assert np.allclose(gauss, gaussian_values(seed, purpose, 150), rtol=1e-13, atol=1e-15)
        # The collector builds its matrices from the shared functions: identical entries.
        matrix = np.array(rademacher_matrix(17, 4, 9))
        bits = (np_words(17, PURPOSE_PROJECTION, 1)[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
        expected = (1 - 2 * bits.reshape(-1)[:36].astype(np.float64)).reshape(4, 9) / math.sqrt(4)
        assert np.array_equal(matrix, expected)


def test_projection_matrix_and_apply() -> None:
    projection = RandomProjection(input_dimension=3, output_dimension=2, seed=99)
    assert projection.matrix == rademacher_matrix(99, 2, 3)
    assert projection.max_abs_output == pytest.approx(3 / math.sqrt(2))
    y = [0.5, -1.0, 0.25]
    assert projection.apply(y) == [sum(a * b for a, b in zip(row, y)) for row in projection.matrix]
    with pytest.raises(InvalidParameterError, match="dimension 3"):
        projection.apply([1.0])
    # JL: the squared norm is preserved on average over seeds
    ratios = []
    for seed in range(200):
        p = RandomProjection(input_dimension=20, output_dimension=8, seed=seed)
        v = [math.sin(i) for i in range(20)]
        ratios.append(sum(z * z for z in p.apply(v)) / sum(x * x for x in v))
    # mean of chi^2_8 / 8 over 200 draws: sd ~ 0.5 / sqrt(200) = 0.035; 6 sd tolerance
    assert abs(sum(ratios) / len(ratios) - 1.0) < 0.21


def test_products_are_summed_left_to_right_with_one_rounding_per_step() -> None:
    # docs/protocol.md §12: fl(fl(1e16 + 1) - 1e16) = 0 (1e16 + 1 ties to the even 1e16); a
    # compensated sum (Python's sum from 3.12, math.fsum) would give 1.
    assert dot([1e16, 1.0, -1e16], [1.0, 1.0, 1.0]) == 0.0
    assert math.fsum([1e16, 1.0, -1e16]) == 1.0
    projection = RandomProjection(input_dimension=3, output_dimension=1, seed=7)
    signs = projection.matrix[0]
    assert projection.apply([1e16 * signs[0], signs[1], -1e16 * signs[2]]) == [0.0]
    encoder = SimHashEncoder(domain=NumericDomain.unit(3), bits=1, seed=11)
    normal = encoder.hyperplanes[0]
    y = [0.5, -0.25, 1.0]
    point = [(v + 1) / 2 for v in y]
    assert encoder.encode(point) == (dot(normal, y) >= 0.0)


def test_morton_helpers_used_by_lsh_round_trip() -> None:
    assert morton_decode(morton_encode((5, 9, 2)), 3, 4) == (5, 9, 2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-0.5, 1.5, allow_nan=False), min_size=1, max_size=5),
       st.floats(1e-3, 0.6, allow_nan=False), st.floats(-3, 3, allow_nan=False), st.floats(0.01, 4, allow_nan=False))
def test_max_hamming_distance_is_exact_in_floating_point(pivots: list[float], width: float, low: float,
                                                         span: float) -> None:
    """Arbitrary floats: compare with the codes at every float within 3 ulps of every run end."""
    domain = NumericDomain(lower=(low,), upper=(low + span,))
    hi = domain.upper[0]
    encoder = BitVectorEncoder(domain=domain, pivots=tuple(pivots), pivots_per_attribute=(len(pivots),),
                               half_widths=(width,))
    candidates = {low, hi, *(low + span * i / 97 for i in range(98))}
    for p in pivots:
        for edge in (p - width, p + width):
            x = edge
            for _ in range(3):
                x = math.nextafter(x, -math.inf)
            for _ in range(7):
                candidates.add(min(max(x, low), hi))
                x = math.nextafter(x, math.inf)
    codes = {encoder.encode([x]) for x in candidates}
    brute = max(sum(a != b for a, b in zip(u, v)) for u in codes for v in codes)
    assert encoder.max_hamming_distance == brute
