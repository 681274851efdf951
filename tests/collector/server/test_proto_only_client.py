"""A client written only from ``proto/ldp/v1/*.proto`` can run a campaign.

The .proto files are compiled with ``grpc_tools.protoc`` into a temporary directory at test time,
and the client runs in a subprocess started with ``python -I`` (isolated: no PYTHONPATH, no
current directory on ``sys.path``) that checks it cannot import ``ldp_client``, ``ldp_collector``
or the project's ``ldp.v1`` package. It creates a histogram campaign, reads the round spec, runs
k-ary randomized response itself from the spec's public parameters, submits hand-built reports,
closes the round and reads the estimates, which the test checks against the truth.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ldp_collector.config import CollectorConfig
from ldp_collector.server.lifecycle import RunningServer, start_server

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
TOKEN = "proto-only-operator-token-0123"

CLIENT = r'''
import importlib.util
import json
import math
import os
import random
import sys

generated, address, token = sys.argv[1:4]


class _NoProjectCode:
    """Where the packages are installed (tox), make them unimportable: only the .proto may be used."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ldp_client", "ldp_collector"):
            raise ImportError(f"{name} must not be used by a client written only from the .proto")
        return None


sys.meta_path.insert(0, _NoProjectCode())
for name in ("ldp_client", "ldp_collector"):
    try:
        importlib.util.find_spec(name)
    except ImportError:
        pass
    else:
        raise AssertionError(f"{name} must not be importable here")
sys.path.insert(0, generated)

import grpc
from google.protobuf import json_format
from ldp.v1 import campaigns_pb2, reports_pb2, service_pb2, service_pb2_grpc

assert service_pb2.__file__.startswith(generated), service_pb2.__file__

TRUTH = [0.5, 0.3, 0.15, 0.05]
N = 4000
auth = (("authorization", "Bearer " + token),)
out = {}
with grpc.insecure_channel(address) as channel:
    operator = service_pb2_grpc.OperatorServiceStub(channel)
    device = service_pb2_grpc.DeviceServiceStub(channel)

    try:
        operator.ListCampaigns(service_pb2.ListCampaignsRequest())
        raise SystemExit("an operator call without a token succeeded")
    except grpc.RpcError as exc:
        out["no_token"] = exc.code().name

    config = campaigns_pb2.CampaignConfig(
        kind=campaigns_pb2.HISTOGRAM, epsilon=3.0, description="proto-only client",
        domain=campaigns_pb2.Domain(categorical_size=len(TRUTH)),
        histogram=campaigns_pb2.HistogramParameters(oracle=campaigns_pb2.GRR))
    campaign = operator.CreateCampaign(service_pb2.CreateCampaignRequest(config=config), metadata=auth)
    cid = campaign.config.campaign_id

    response = device.GetRoundSpec(service_pb2.GetRoundSpecRequest(campaign_id=cid))
    spec = response.spec
    task = spec.tasks[0]
    group = task.groups[0]
    (component,) = task.components
    assert component.encoder.WhichOneof("encoder") == "categorical"
    grr = component.mechanism.grr
    domain, eps = grr.domain_size, grr.epsilon
    p = math.exp(eps) / (math.exp(eps) + domain - 1)

    rng = random.Random(20240601)
    values = [v for v, share in enumerate(TRUTH) for _ in range(round(share * N))]
    reports = []
    for v in values:
        if rng.random() >= p:
            other = rng.randrange(domain - 1)
            v = other if other < v else other + 1
        reports.append(reports_pb2.Report(
            report_id=os.urandom(16), campaign_id=cid, round=spec.round, group=group,
            payloads=[reports_pb2.Payload(index=v)]))
    accepted = 0
    for start in range(0, len(reports), 1000):
        res = device.SubmitReports(service_pb2.SubmitReportsRequest(
            request_id="proto-only-%d" % start, reports=reports[start:start + 1000]))
        accepted += res.accepted
    bad = device.SubmitReports(service_pb2.SubmitReportsRequest(request_id="bad", reports=[
        reports_pb2.Report(report_id=os.urandom(16), campaign_id=cid, round=spec.round, group=group,
                           payloads=[reports_pb2.Payload(index=domain)])]))
    out["bad"] = [bad.rejected, bad.outcomes[0].reason]
    out["accepted"] = accepted

    closed = operator.CloseRound(service_pb2.CloseRoundRequest(campaign_id=cid, round=spec.round), metadata=auth)
    out["state"] = campaigns_pb2.CampaignState.Name(closed.state)
    estimates = operator.GetEstimates(service_pb2.GetEstimatesRequest(campaign_id=cid), metadata=auth)
    out["estimates"] = json_format.MessageToDict(estimates, preserving_proto_field_name=True)
    out["n"] = N
    out["truth"] = TRUTH
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    config = CollectorConfig(listen="127.0.0.1:0", data_dir=str(tmp_path_factory.mktemp("proto-only")),
                             operator_token=TOKEN)
    srv = start_server(config)
    yield srv
    srv.stop(grace=1.0)


def compile_protos(out: Path) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc")
    import grpc_tools  # type: ignore[import-untyped]

    proto_root = REPO / "proto"
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    files = sorted(str(p.relative_to(proto_root)) for p in (proto_root / "ldp" / "v1").glob("*.proto"))
    assert files, "no .proto files found"
    args = ["grpc_tools.protoc", f"-I{proto_root}", f"-I{well_known}", f"--python_out={out}",
            f"--grpc_python_out={out}", *files]
    assert protoc.main(args) == 0, "protoc failed"


def test_proto_only_client_runs_a_campaign(server: RunningServer, tmp_path: Path) -> None:
    generated = tmp_path / "generated"
    generated.mkdir()
    compile_protos(generated)
    # Regular packages, so that this copy wins over an installed ldp-proto (tox installs one).
    for package in (generated / "ldp", generated / "ldp" / "v1"):
        (package / "__init__.py").touch()
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run([sys.executable, "-I", str(script), str(generated), server.address, TOKEN],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)

    assert out["no_token"] == "UNAUTHENTICATED"
    assert out["accepted"] == out["n"]
    assert out["bad"][0] == 1 and out["bad"][1]
    assert out["state"] == "FINISHED"
    estimates = out["estimates"]
    assert int(estimates["reports"]) == out["n"]
    for e in estimates["estimates"]:
        value = int(e.get("value", 0))
        expected = out["truth"][value] * out["n"]
        assert abs(e["count"] - expected) <= 5 * e["std_error"], (value, e, expected)
