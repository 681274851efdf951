"""BITVECTOR, LAPLACE, LDP_KMEANS, NETTREE and STEMMER campaigns through a real collector over gRPC.

Real SDK devices (``Device.in_memory``) fetch each round's ``RoundSpec`` with
:class:`~ldp_client.grpc.CollectorClient`, participate and submit; nobody calls ``CloseRound``:
``close_after_reports`` closes every round (and runs the server step) once the round's reporters
have all reported. Checked: the campaign finishes with ``k`` centers in the original units, every
device's ledger holds exactly epsilon, a device's ``cluster_label`` is the nearest published center
of its point, the clustering recovers a well-separated 2-D mixture (ARI floor), and for LDP_KMEANS
the ``T + 1`` rounds with the centers fed back from round to round under both budget policies.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from ldp.v1 import campaigns_pb2
from ldp_client import Device, DevicePolicy, RoundSpec, SeededRng
from ldp_client.clusters import CenterModel
from ldp_client.encoders.bucketed import BucketedVectorEncoder
from ldp_client.encoders.nearest import NearestCandidateEncoder
from ldp_client.grpc import CollectorClient
from ldp_collector.config import CollectorConfig
from ldp_collector.operator import OperatorClient
from ldp_collector.serde import result_from_proto
from ldp_collector.server.lifecycle import RunningServer, start_server
from ldp_collector.simulation.datasets import make_dataset
from ldp_collector.simulation.evaluation import evaluate_clustering
from support.grpc_campaigns import Played, play_round

pytestmark = pytest.mark.integration

TOKEN = "clustering-kinds-grpc-operator-token-0123"
N = 3600
K = 3
#: Large enough that 3600 reports place the centers of a well-separated mixture.
EPSILON = 8.0
#: LDP_KMEANS iterations (label rounds).
T = 2
#: A public box, fixed before any data is seen; the mixtures below (centers in [-10, 10]) fit in it.
LOWER, UPPER = (-15.0, -15.0), (15.0, 15.0)
#: Mixture seeds whose closest pair of true means is 7.4 to 10.9 apart (standard deviations 0.5 to 1.5).
SEEDS = {"bitvector": 2, "laplace": 5, "ldp_kmeans": 1, "ldp_kmeans_partition": 2, "nettree": 5, "stemmer": 2}
#: ARI floors. Measured at N = 3600, epsilon 8, T = 2 (three runs: dataset seeds rotated over 2, 5, 1 and other
#: device seeds) and this file's seeds: bitvector 1.000 / 1.000 / 0.997 / 1.000, laplace 0.995 / 0.985 / 1.000 /
#: 0.996, ldp_kmeans SPLIT 0.998 / 1.000 / 0.954 / 0.918, ldp_kmeans PARTITION 1.000 / 0.999 / 0.987 / 1.000. At N = 2400 SPLIT once fell to 0.51
#: (its round-1 vectors get only epsilon 4/3: a poor start that two Lloyd steps did not repair).
#: Those runs drew the engines' public randomness from the fixed campaign ids. Over campaign seeds 0..9 (this
#: file's data and device seeds) the ARIs are: bitvector 1.000 on all ten; laplace 0.996-0.997; ldp_kmeans SPLIT
#: 0.746 on seven seeds, 0.918, 0.944, 0.944 (median 0.746: its k-means++ start on the round-1 vectors usually
#: lands in one poor optimum here, hence its floor 0.70, below the worst seed); ldp_kmeans PARTITION 1.000 on all
#: ten; nettree 0.994-1.000; stemmer 0.999-1.000 on nine, 0.844 on seed 6. The tests run CAMPAIGN_SEED.
ARI_FLOOR = {"bitvector": 0.90, "laplace": 0.90, "ldp_kmeans": 0.70, "ldp_kmeans_partition": 0.90, "nettree": 0.90,
             "stemmer": 0.90}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(CollectorConfig(listen="127.0.0.1:0", data_dir=str(tmp_path_factory.mktemp("kinds") / "data"),
                                       operator_token=TOKEN, log_level="WARNING", grace_period_s=1.0))
    try:
        yield srv
    finally:
        srv.stop(grace=1.0)


@pytest.fixture(scope="module")
def operator(server: RunningServer) -> Iterator[OperatorClient]:
    with OperatorClient(server.address, token=TOKEN) as client:
        yield client


#: The campaigns' seed: their engines' public randomness (ARI_FLOOR's comment has the spread over seeds 0..9).
CAMPAIGN_SEED = 0


def base_config(campaign_id: str, kind: int, *, close_after: int = N,
                policy: int = campaigns_pb2.SPLIT) -> campaigns_pb2.CampaignConfig:
    # A fixed campaign seed: the engines' public randomness (k-means++ starts, projections) is then the same
    # on every run, as the fixed campaign ids made it before campaigns carried a seed.
    config = campaigns_pb2.CampaignConfig(campaign_id=campaign_id, kind=kind, epsilon=EPSILON,  # type: ignore[arg-type]
                                          budget_policy=policy, close_after_reports=close_after,  # type: ignore[arg-type]
                                          seed=CAMPAIGN_SEED)
    config.domain.numeric.lower.extend(LOWER)
    config.domain.numeric.upper.extend(UPPER)
    return config


def play(server: RunningServer, operator: OperatorClient, config: campaigns_pb2.CampaignConfig,
         devices: Sequence[Device], points: Sequence[tuple[float, ...]], kind: str,
         reporters_per_round: Sequence[int], *, max_rounds: int = 8) -> Played:
    """Play the created campaign until it finishes, never closing a round by hand."""
    campaign_id = config.campaign_id
    specs: list[RoundSpec] = []
    with CollectorClient(server.address) as client, CollectorClient(server.address) as other_app:
        for _ in range(max_rounds):
            spec = client.get_round_spec(campaign_id)
            if spec is None:
                break
            assert other_app.get_round_spec(campaign_id) == spec  # every device gets the same public spec
            assert spec.round == len(specs) + 1 and spec.kind == kind
            specs.append(spec)
            expected = reporters_per_round[spec.round - 1]
            assert play_round(client, spec, devices, points) == expected
            campaign = operator.get_campaign(campaign_id)
            assert campaign.error == ""
            status = {r.round: r for r in campaign.rounds}[spec.round]
            assert not status.open and status.reports == expected  # closed by close_after_reports
            assert campaign.state == campaigns_pb2.FINISHED or campaign.current_round.round == spec.round + 1
    return Played(campaign_id=campaign_id, specs=specs, devices=list(devices), points=list(points))


def fleet(n: int, kind: str, seed: int) -> list[Device]:
    rng = SeededRng(seed)  # simulation randomness: reproducible, not private
    policy = DevicePolicy(max_epsilon_per_campaign=EPSILON, allowed_kinds=(kind,))
    return [Device.in_memory(policy, rng=rng) for _ in range(n)]


def centers_of(result: campaigns_pb2.Result) -> np.ndarray:
    c = result.clustering
    assert c.k == K and c.dimension == 2 and len(c.centers) == K * 2
    return np.asarray(c.centers, dtype=np.float64).reshape(K, 2)


def check_finished(server: RunningServer, operator: OperatorClient, played: Played, x: np.ndarray,
                   truth: np.ndarray, *, rounds: int, ari_floor: float,
                   exact: bool = True, center_tolerance: float | None = 3.0) -> tuple[campaigns_pb2.Result, float]:
    """Finished by itself; k centers in original units; ledgers exactly epsilon; labels; ARI.

    ``exact=False``: the charges add up to epsilon in real arithmetic but their float sum may be off
    by an ulp (the ledger's own budget check allows a relative 1e-12).
    """
    total = EPSILON if exact else pytest.approx(EPSILON, rel=1e-12, abs=0.0)
    campaign = operator.get_campaign(played.campaign_id)
    assert campaign.state == campaigns_pb2.FINISHED, campaign.error
    assert len(played.specs) == rounds and len(campaign.rounds) == rounds
    assert not any(r.open for r in campaign.rounds)
    for device in played.devices:
        assert device.spent(played.campaign_id) == total
        assert sum(e.epsilon for e in device.ledger.entries() if e.campaign_id == played.campaign_id) == total
        assert not device.pending_reports()
    with CollectorClient(server.address) as client:
        result = client.get_result(played.campaign_id)
        centers = centers_of(result)
        # Original units: inside the public box, and each true mean has a center within a few units
        # (in the unit cube the whole box is 1 wide, so normalized centers would all sit near the origin).
        assert np.all(centers >= np.asarray(LOWER)) and np.all(centers <= np.asarray(UPPER))
        means = np.array([x[truth == j].mean(axis=0) for j in range(K)])
        error = np.linalg.norm(means[:, None, :] - centers[None, :, :], axis=2).min(axis=1).max()
        assert center_tolerance is None or error < center_tolerance
        model = client.get_cluster_model(played.campaign_id)
        assert isinstance(model, CenterModel)
        nearest = np.linalg.norm(x[:, None, :] - centers[None, :, :], axis=2).argmin(axis=1)
        assert [model.label(p) for p in played.points] == nearest.tolist()
        for i in (0, 1, len(x) // 2, len(x) - 1):  # a few devices ask the collector themselves
            spent = played.devices[i].spent(played.campaign_id)
            assert client.cluster_label(played.campaign_id, played.points[i]) == nearest[i]
            assert played.devices[i].spent(played.campaign_id) == spent  # labelling is free
    scores = evaluate_clustering(result_from_proto(result), x, truth)
    assert scores["clusters"] == K
    assert scores["ari"] >= ari_floor, (scores, error)
    return result, scores["ari"]


def one_round_campaign(server: RunningServer, operator: OperatorClient, name: str,
                       config: campaigns_pb2.CampaignConfig, device_seed: int) -> float:
    x, truth = make_dataset("mixture", N, d=2, k=K, seed=SEEDS[name])
    operator.create_campaign(config)
    devices = fleet(N, name, device_seed)
    played = play(server, operator, config, devices, [tuple(p) for p in x.tolist()], name, [N])
    spec = played.specs[0]
    assert len(spec.tasks) == 1 and spec.tasks[0].epsilon == EPSILON  # one report with the whole epsilon
    for device in played.devices:
        entries = [e for e in device.ledger.entries() if e.campaign_id == played.campaign_id]
        assert [(e.round, e.epsilon) for e in entries] == [(1, EPSILON)]
    _, ari = check_finished(server, operator, played, x, truth, rounds=1, ari_floor=ARI_FLOOR[name])
    return ari


def test_bitvector_over_grpc(server: RunningServer, operator: OperatorClient) -> None:
    config = base_config("kinds-bitvector", campaigns_pb2.BITVECTOR)
    config.bitvector.k = K
    one_round_campaign(server, operator, "bitvector", config, device_seed=21)


def test_laplace_over_grpc(server: RunningServer, operator: OperatorClient) -> None:
    config = base_config("kinds-laplace", campaigns_pb2.LAPLACE)
    config.laplace.k = K
    # mnFCM, not the default FCM: at this n and box FCM's centers shrink towards the data's mean (center
    # error 3.1-3.3 against mnFCM's 1.7-2.3 over six noise draws of this data, same ARI 0.99).
    config.laplace.algorithm = campaigns_pb2.LaplaceParameters.MNFCM
    one_round_campaign(server, operator, "laplace", config, device_seed=22)


def label_centers(spec: RoundSpec) -> np.ndarray:
    """The centers a label round broadcasts (the first component's encoder)."""
    encoder = spec.tasks[0].components[0].encoder
    assert isinstance(encoder, NearestCandidateEncoder)
    return np.asarray(encoder.centers, dtype=np.float64).reshape(K, 2)


def check_feedback(played: Played, result: campaigns_pb2.Result) -> None:
    """Each label round's spec carries the centers the previous round's server step computed."""
    first, *labels = played.specs
    assert len(first.tasks[0].components) == 1  # round 1: the perturbed vector only
    assert not isinstance(first.tasks[0].components[0].encoder, NearestCandidateEncoder)
    for spec in labels:
        assert len(spec.tasks[0].components) == 2  # the GRR label and a fresh vector
        assert spec.tasks[0].components[0].mechanism.domain_size == K
    broadcast = [label_centers(s) for s in labels] + [centers_of(result)]
    diagnostics = result.diagnostics
    for t in range(1, T + 1):
        before, after = broadcast[t - 1], broadcast[t]
        assert not np.array_equal(before, after)  # the data moved the centers
        # The server's own record of how far iteration t moved them matches the two broadcasts.
        shift = np.linalg.norm(after - before, axis=1)
        assert diagnostics[f"iteration_{t}_center_shift_max"] == pytest.approx(shift.max(), rel=1e-9, abs=1e-9)
        assert diagnostics[f"iteration_{t}_center_shift_mean"] == pytest.approx(shift.mean(), rel=1e-9, abs=1e-9)


def test_ldp_kmeans_split_over_grpc(server: RunningServer, operator: OperatorClient) -> None:
    """SPLIT: every device reports in all T + 1 rounds; the charges add up to exactly epsilon."""
    name = "ldp_kmeans"
    x, truth = make_dataset("mixture", N, d=2, k=K, seed=SEEDS[name])
    config = base_config("kinds-ldp-kmeans-split", campaigns_pb2.LDP_KMEANS)
    config.ldp_kmeans.k = K
    config.ldp_kmeans.iterations = T
    operator.create_campaign(config)
    devices = fleet(N, name, 23)
    played = play(server, operator, config, devices, [tuple(p) for p in x.tolist()], name, [N] * (T + 1))
    assert len(played.specs) == T + 1
    share = 0.5  # the default data_share
    vector_eps = share * EPSILON / (T + 1)
    label_eps = (1 - share) * EPSILON / T
    assert played.specs[0].tasks[0].epsilon == pytest.approx(vector_eps)
    for spec in played.specs[1:]:
        assert spec.tasks[0].epsilon == pytest.approx(vector_eps + label_eps)
    for device in devices:
        entries = [e for e in device.ledger.entries() if e.campaign_id == played.campaign_id]
        assert [e.round for e in entries] == list(range(1, T + 2))
    # No center-error bound: SPLIT's centers were 3.7 to 5.2 units off a true mean in measured runs (the
    # labels still separate the clusters); the ARI floor checks the clustering.
    # 4/3 + 10/3 + 10/3: 8 in real arithmetic, 7.999999999999999 in floats (the docstring's "exactly").
    result, _ = check_finished(server, operator, played, x, truth, rounds=T + 1, ari_floor=ARI_FLOOR[name],
                               exact=False, center_tolerance=None)
    check_feedback(played, result)


def test_ldp_kmeans_partition_over_grpc(server: RunningServer, operator: OperatorClient) -> None:
    """PARTITION: T + 1 groups, each reporting in one round only, with the whole epsilon."""
    name = "ldp_kmeans_partition"
    per_round = N // (T + 1)
    config = base_config("kinds-ldp-kmeans-partition", campaigns_pb2.LDP_KMEANS, close_after=per_round,
                         policy=campaigns_pb2.PARTITION)
    config.ldp_kmeans.k = K
    config.ldp_kmeans.iterations = T
    operator.create_campaign(config)
    # The devices pick their groups (randomly, on the device) from round 1's spec; the fleet keeps exactly
    # per_round devices of each group, so that close_after_reports closes every round.
    with CollectorClient(server.address) as client:
        first = client.get_round_spec(config.campaign_id)
    assert first is not None and len(first.group_weights) == T + 1
    pool = fleet(int(N * 1.3), "ldp_kmeans", 24)
    by_group: dict[int, list[Device]] = {}
    for device in pool:
        by_group.setdefault(device.group_for(first), []).append(device)
    assert all(len(by_group.get(g, ())) >= per_round for g in range(T + 1))
    devices = [d for g in range(T + 1) for d in by_group[g][:per_round]]
    x, truth = make_dataset("mixture", len(devices), d=2, k=K, seed=SEEDS[name])
    played = play(server, operator, config, devices, [tuple(p) for p in x.tolist()], "ldp_kmeans",
                  [per_round] * (T + 1))
    assert len(played.specs) == T + 1
    for r, spec in enumerate(played.specs):
        assert spec.tasks[0].groups == (r,) and spec.tasks[0].epsilon == pytest.approx(EPSILON)
    for device in devices:  # one report each, in its group's round, with the whole epsilon
        entries = [e for e in device.ledger.entries() if e.campaign_id == played.campaign_id]
        assert len(entries) == 1 and entries[0].round == entries[0].group + 1 and entries[0].epsilon == EPSILON
    result, _ = check_finished(server, operator, played, x, truth, rounds=T + 1, ari_floor=ARI_FLOOR[name])
    check_feedback(played, result)


def test_nettree_over_grpc(server: RunningServer, operator: OperatorClient) -> None:
    """NETTREE: one message per device (its level's node and its bucketized vector), one round, epsilon once."""
    name = "nettree"
    x, truth = make_dataset("mixture", N, d=2, k=K, seed=SEEDS[name])
    config = base_config("kinds-nettree", campaigns_pb2.NETTREE)
    config.nettree.k = K
    operator.create_campaign(config)
    devices = fleet(N, name, 25)
    played = play(server, operator, config, devices, [tuple(p) for p in x.tolist()], name, [N])
    (spec,) = played.specs
    depth = len(spec.tasks)
    assert depth >= 2 and spec.max_reports_per_device == 1
    for task in spec.tasks:  # every level's group: node report + bucketized vector, in one report
        assert len(task.components) == 2 and task.epsilon == pytest.approx(EPSILON)
        assert task.components[1].mechanism.KIND == "bucketized_vector"
    for device in played.devices:  # one participation each, in round 1, with the whole epsilon
        entries = [e for e in device.ledger.entries() if e.campaign_id == played.campaign_id]
        assert len(entries) == 1 and entries[0].round == 1 and entries[0].epsilon == pytest.approx(EPSILON)
    campaign = operator.get_campaign(played.campaign_id)
    assert [r.reports for r in campaign.rounds] == [N]  # the server stored exactly one report per device
    result, _ = check_finished(server, operator, played, x, truth, rounds=1, ari_floor=ARI_FLOOR[name], exact=False,
                               center_tolerance=None)
    assert result.diagnostics["reports"] == N and result.diagnostics["leaves"] >= K


def test_stemmer_over_grpc(server: RunningServer, operator: OperatorClient) -> None:
    """STEMMER under SPLIT: four rounds (keys, bucket means, weights, Lloyd), each closing by itself, every
    round's spec computed from the previous round's reports; each device spends epsilon / 4 per round."""
    name = "stemmer"
    x, truth = make_dataset("mixture", N, d=2, k=K, seed=SEEDS[name])
    config = base_config("kinds-stemmer", campaigns_pb2.STEMMER)
    config.stemmer.k = K
    operator.create_campaign(config)
    devices = fleet(N, name, 26)
    played = play(server, operator, config, devices, [tuple(p) for p in x.tolist()], name, [N] * 4)
    assert [s.round for s in played.specs] == [1, 2, 3, 4]
    kinds = [s.tasks[0].components[0].mechanism.KIND for s in played.specs]
    assert kinds[1] == "bucketized_vector" and kinds[3] == "bucketized_vector"  # bucket means, Lloyd
    lloyd = played.specs[3].tasks[0].components[0].encoder
    assert isinstance(lloyd, BucketedVectorEncoder) and lloyd.nearest is not None
    for spec in played.specs:
        assert all(t.epsilon == pytest.approx(EPSILON / 4) for t in spec.tasks)
    for device in played.devices:
        entries = [e for e in device.ledger.entries() if e.campaign_id == played.campaign_id]
        assert [e.round for e in entries] == [1, 2, 3, 4]
    result, _ = check_finished(server, operator, played, x, truth, rounds=4, ari_floor=ARI_FLOOR[name], exact=False,
                               center_tolerance=None)
    # The Lloyd round's broadcast centers are the coreset's; the published ones moved from them.
    broadcast = np.asarray(lloyd.nearest.centers, dtype=np.float64).reshape(-1, 2)
    assert broadcast.shape == (K, 2) and not np.array_equal(broadcast, centers_of(result))
