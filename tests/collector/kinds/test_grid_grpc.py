"""A whole grid clustering campaign (kind ``GRID``) through a real collector over gRPC.

Real SDK devices (``Device.in_memory``: a budget ledger and an outbox each) fetch every round's
``RoundSpec`` with :class:`~ldp_client.grpc.CollectorClient`, participate and submit; nobody calls
``CloseRound``: ``close_after_reports`` closes every round (and runs the server step) the moment
the whole fleet has reported (budget policy ``SPLIT``: every device reports in every round). Then
a device labels itself from the published result. Checked: the rounds' feedback (round 2's spec
is computed from round 1's reports, so it differs from round 1's and depends on the data), the
TREE and ITERATIVE variants, the labels, and every device's ledger (exactly epsilon).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from ldp.v1 import campaigns_pb2
from ldp_client import Device, DevicePolicy, RoundSpec, SeededRng
from ldp_client.clusters import CellClusterModel
from ldp_client.encoders.grid import CellListEncoder, GridTreeEncoder
from ldp_client.errors import ProtocolError
from ldp_client.grpc import CollectorClient
from ldp_collector.config import CollectorConfig
from ldp_collector.model import Result
from ldp_collector.operator import OperatorClient
from ldp_collector.serde import result_from_proto
from ldp_collector.server.lifecycle import RunningServer, start_server
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.evaluation import cell_labels, evaluate_clustering
from support.grpc_campaigns import Played, play_round

pytestmark = pytest.mark.integration

TOKEN = "grid-grpc-operator-token-0123456789"
N = 3000
#: Split over 3 rounds: 2 per report, exactly representable, so every ledger sums to exactly 6.
EPSILON = 6.0
GRID = campaigns_pb2.GridParameters
#: The box every campaign publishes (fixed before any data is seen).
LOWER, UPPER = (-6.0, -11.0), (8.0, 9.0)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(CollectorConfig(listen="127.0.0.1:0", data_dir=str(tmp_path_factory.mktemp("grid") / "data"),
                                       operator_token=TOKEN, log_level="WARNING", grace_period_s=1.0))
    try:
        yield srv
    finally:
        srv.stop(grace=1.0)


@pytest.fixture(scope="module")
def operator(server: RunningServer) -> Iterator[OperatorClient]:
    with OperatorClient(server.address, token=TOKEN) as client:
        yield client


def grid_config(campaign_id: str, variant: int, **grid: int) -> campaigns_pb2.CampaignConfig:
    config = campaigns_pb2.CampaignConfig(campaign_id=campaign_id, kind=campaigns_pb2.GRID, epsilon=EPSILON,
                                          budget_policy=campaigns_pb2.SPLIT, close_after_reports=N)
    config.domain.numeric.lower.extend(LOWER)
    config.domain.numeric.upper.extend(UPPER)
    config.grid.variant = variant  # type: ignore[assignment]
    for key, value in grid.items():
        setattr(config.grid, key, value)
    return config


def play(server: RunningServer, operator: OperatorClient, config: campaigns_pb2.CampaignConfig,
         x: np.ndarray, *, seed: int, max_rounds: int = 8) -> Played:
    """Create the campaign and play rounds until it finishes (or after ``max_rounds``), never closing one."""
    campaign_id = operator.create_campaign(config).config.campaign_id
    rng = SeededRng(seed)  # simulation randomness: reproducible, not private
    policy = DevicePolicy(max_epsilon_per_campaign=EPSILON, allowed_kinds=("grid",))
    devices = [Device.in_memory(policy, rng=rng) for _ in range(len(x))]
    points = [tuple(p) for p in x.tolist()]
    specs: list[RoundSpec] = []
    with CollectorClient(server.address) as client, CollectorClient(server.address) as other_app:
        for _ in range(max_rounds):
            spec = client.get_round_spec(campaign_id)
            if spec is None:
                break
            assert other_app.get_round_spec(campaign_id) == spec  # every device gets the same public spec
            assert spec.round == len(specs) + 1 and spec.kind == "grid"
            specs.append(spec)
            assert play_round(client, spec, devices, points) == len(x)
            # The last batch reached close_after_reports: the round is closed and the server step has run.
            campaign = operator.get_campaign(campaign_id)
            status = {r.round: r for r in campaign.rounds}[spec.round]
            assert not status.open and status.reports == len(x)
            assert campaign.state == campaigns_pb2.FINISHED or campaign.current_round.round == spec.round + 1
    return Played(campaign_id=campaign_id, specs=specs, devices=devices, points=points)


def encoders(spec: RoundSpec) -> list[GridTreeEncoder | CellListEncoder]:
    out = []
    for task in spec.tasks:
        encoder = task.components[0].encoder
        assert isinstance(encoder, (GridTreeEncoder, CellListEncoder))
        out.append(encoder)
    return out


def check_finished(server: RunningServer, operator: OperatorClient, played: Played, x: np.ndarray,
                   truth: np.ndarray) -> Result:
    """The campaign finished by itself, every ledger holds exactly epsilon, and the devices label themselves."""
    campaign = operator.get_campaign(played.campaign_id)
    assert campaign.state == campaigns_pb2.FINISHED
    assert len(campaign.rounds) == len(played.specs) and not any(r.open for r in campaign.rounds)
    for device in played.devices:
        assert device.spent(played.campaign_id) == EPSILON
        entries = [e for e in device.ledger.entries() if e.campaign_id == played.campaign_id]
        assert [e.round for e in entries] == list(range(1, len(played.specs) + 1))
        assert all(e.epsilon == EPSILON / len(played.specs) for e in entries)
        assert not device.pending_reports()
    with CollectorClient(server.address) as client:
        result = result_from_proto(client.get_result(played.campaign_id))
        assert result.clustering is not None and result.clustering.cell_map is not None
        model = client.get_cluster_model(played.campaign_id)
        assert isinstance(model, CellClusterModel)
        # What evaluate_clustering gives every point (simulation.evaluation.cell_labels): the label of its cell in the map.
        expected = cell_labels(result.clustering.cell_map, x)
        assert [model.label(p) for p in played.points] == expected.tolist()
        for i in (0, 1, len(x) // 2, len(x) - 1):  # a few devices ask the collector themselves
            spent = played.devices[i].spent(played.campaign_id)
            assert client.cluster_label(played.campaign_id, played.points[i]) == expected[i]
            assert played.devices[i].spent(played.campaign_id) == spent  # labelling is free
    # The published map is the aggregation round's grid.
    last = encoders(played.specs[-1])
    assert len(last) == 1 and isinstance(last[0], CellListEncoder)
    assert [(c.level, c.morton_index) for c in result.clustering.cell_map.cells] == \
        [(c.level, c.morton_index) for c in last[0].cells]
    scores = evaluate_clustering(result, x, truth)
    assert scores["clusters"] >= 1 and result.clustering.k == scores["clusters"]
    return result


def test_tree_variant_over_grpc(server: RunningServer, operator: OperatorClient) -> None:
    x, truth = make_dataset("aniso", N, seed=4)
    played = play(server, operator, grid_config("agc-tree", GRID.TREE), x, seed=11)
    assert len(played.specs) == 3  # calibrate, the tree's levels, aggregate
    first, second, third = (encoders(s) for s in played.specs)
    # Round 1: the calibration grid, 16 x 16 by default, for everyone.
    assert len(first) == 1 and isinstance(first[0], GridTreeEncoder) and first[0].level == 4
    # Round 2: one subgroup per tree level, levels from round 1's estimate (the feedback).
    assert played.specs[1] != played.specs[0]
    assert all(isinstance(e, GridTreeEncoder) for e in second) and len(second) == 3
    levels = [e.level for e in second if isinstance(e, GridTreeEncoder)]
    assert levels == sorted(levels) and levels[-1] > levels[0]
    # Round 3: the irregular grid the tree kept, cells of several sizes.
    assert len(third) == 1 and isinstance(third[0], CellListEncoder)
    assert len({c.level for c in third[0].cells}) >= 2
    result = check_finished(server, operator, played, x, truth)
    assert result.diagnostics["tree_height"] == levels[-1]


def test_iterative_variant_over_grpc(server: RunningServer, operator: OperatorClient) -> None:
    x, truth = make_dataset("aniso", N, seed=5)
    played = play(server, operator, grid_config("agc-iter", GRID.ITERATIVE, max_iterations=1), x, seed=12)
    assert len(played.specs) == 3  # calibrate, one merge/split round, aggregate
    first, second, third = (encoders(s) for s in played.specs)
    assert isinstance(first[0], GridTreeEncoder) and first[0].level == 4
    # Round 2: the uniform grid at the level round 1 chose; round 3: that grid merged and split.
    assert isinstance(second[0], CellListEncoder) and len({c.level for c in second[0].cells}) == 1
    assert isinstance(third[0], CellListEncoder) and third[0].cells != second[0].cells
    result = check_finished(server, operator, played, x, truth)
    level0 = second[0].cells[0].level
    assert result.diagnostics["granularity_level"] == level0 and result.diagnostics["iterations"] == 1
    assert result.diagnostics["iteration_1_merged"] + result.diagnostics["iteration_1_split"] > 0


def test_round_two_depends_on_the_data(server: RunningServer, operator: OperatorClient) -> None:
    """The same campaign on wider and on more concentrated data: round 1 is identical, round 2 is not."""
    rng = np.random.default_rng(0)
    # 16 of the 256 calibration cells (about 190 devices each, 4 standard errors), against one small blob.
    spread = np.column_stack([rng.uniform(-6.0, -2.5, N), rng.uniform(-11.0, -6.0, N)])
    concentrated = np.column_stack([rng.normal(1.0, 0.2, N), rng.normal(-1.0, 0.2, N)])
    seconds = []
    firsts = []
    for seed, (name, x) in enumerate((("spread", spread), ("concentrated", concentrated)), start=13):
        # A seed per campaign: the seeded devices draw their report ids from it, and the collector drops an id
        # it already stored (in any campaign) as a duplicate.
        played = play(server, operator, grid_config(f"feedback-{name}", GRID.ITERATIVE, max_iterations=1), x,
                      seed=seed, max_rounds=1)
        with CollectorClient(server.address) as client:
            second = client.get_round_spec(played.campaign_id)  # computed from round 1's reports
        assert second is not None and second.round == 2
        firsts.append(encoders(played.specs[0])[0])
        seconds.append(encoders(second)[0])
    assert firsts[0] == firsts[1]
    spread_cells, concentrated_cells = (e.cells for e in seconds if isinstance(e, CellListEncoder))
    # Data on a smaller share of the box: the calibration finds fewer dense cells and picks a finer grid.
    assert concentrated_cells[0].level > spread_cells[0].level


def test_a_device_cannot_label_itself_before_the_campaign_finishes(server: RunningServer,
                                                                   operator: OperatorClient) -> None:
    operator.create_campaign(grid_config("unfinished", GRID.UNIFORM))
    with CollectorClient(server.address) as client, pytest.raises(ProtocolError, match="not FINISHED"):
        client.cluster_label("unfinished", (0.0, 0.0))
