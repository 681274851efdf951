"""The independent Node.js client (``tests/interop``) against a real ``ldp-collector serve``.

The Node client is written from ``docs/protocol.md``, ``docs/errors.md``, ``proto/`` and the test
vectors only. This driver installs its npm packages from the committed lockfile (``npm ci``), runs
its own tests (every vector of ``proto/vectors/v1``) with ``node --test``, starts one real collector
process and lets the Node client create and play whole campaigns on it, then checks the results
against the truth it drew. Without ``node`` and ``npm`` every test is skipped, saying so
(``python -m tox -e interop``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from support.server_process import TOKEN, ServerProcess

HERE = Path(__file__).resolve().parent
NODE_TIMEOUT_S = 600
# campaign.js's exit status for a round it cannot run (an encoder or mechanism it lacks).
UNSUPPORTED_EXIT = 3

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def node() -> str:
    """The node executable, with the client's packages installed from the committed lockfile."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the independent Node.js client (tests/interop): "
                    "its vector and end-to-end checks did not run")
    subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--prefix", str(HERE)], check=True,
                   stdout=subprocess.DEVNULL)
    return node


@pytest.fixture(scope="session")
def collector(tmp_path_factory: pytest.TempPathFactory, node: str) -> Iterator[ServerProcess]:
    """One real collector process on a free loopback port, shared by the campaigns."""
    tmp = tmp_path_factory.mktemp("collector")
    server = ServerProcess(tmp, str(tmp / "data"))
    server.start()
    try:
        server.wait_serving()
        yield server
    finally:
        server.ensure_dead()


def run_campaign(node: str, server: ServerProcess, tmp: Path, config: dict[str, Any], points: list[Any],
                 seed: int, transports: list[str]) -> dict[str, Any]:
    """One campaign created and played by the Node client; its JSON output."""
    plan = {"address": server.address, "operator_token": TOKEN, "config": config, "points": points,
            "seed": seed, "transports": transports}
    plan_file = tmp / f"plan-{seed}.json"
    plan_file.write_text(json.dumps(plan))
    done = subprocess.run([node, str(HERE / "campaign.js"), str(plan_file)], capture_output=True, text=True,
                          timeout=NODE_TIMEOUT_S)
    if done.returncode == UNSUPPORTED_EXIT:
        pytest.skip(f"the Node client does not implement this campaign yet: {done.stderr.strip()}")
    assert done.returncode == 0, f"{done.stderr}\nserver log:\n{server.log_tail()}"
    output: dict[str, Any] = json.loads(done.stdout)
    return output


def test_the_node_client_passes_every_test_vector(node: str) -> None:
    done = subprocess.run([node, "--test", "--test-reporter=spec", str(HERE / "test")], capture_output=True,
                          text=True, timeout=NODE_TIMEOUT_S, cwd=HERE)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr


# -- histograms: estimates within their intervals at the rate the sampling distribution gives ----

HISTOGRAM_K = 32
HISTOGRAM_N = 20_000
HISTOGRAM_EPSILON = 2.0
# P(a false failure) of the whole coverage check.
FALSE_FAIL = 1e-6


def histogram_truth(seed: int) -> np.ndarray:
    """Categories of the devices: a skewed (Zipf-like) histogram over K values, shuffled by seed."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, HISTOGRAM_K + 1)
    return rng.choice(HISTOGRAM_K, size=HISTOGRAM_N, p=weights / weights.sum())


@pytest.mark.parametrize(("oracle", "transports"), [
    ("GRR", ["reports", "packed"]),
    ("OUE", ["packed", "reports"]),
    ("OLH", ["reports", "packed"]),
    ("SUE", ["packed"]),
])
def test_a_histogram_from_the_node_client_is_unbiased(node: str, collector: ServerProcess, tmp_path: Path,
                                                      oracle: str, transports: list[str]) -> None:
    values = histogram_truth(seed=19)
    config = {"kind": "HISTOGRAM", "domain": {"categorical_size": str(HISTOGRAM_K)}, "epsilon": HISTOGRAM_EPSILON,
              "histogram": {"oracle": oracle}, "seed": "19"}
    out = run_campaign(node, collector, tmp_path, config, [int(v) for v in values], seed=19, transports=transports)
    assert out["outcomes"] == {"ACCEPTED": HISTOGRAM_N, "DUPLICATE": 0, "REJECTED": 0}, out["rejections"]
    estimates = out["result"]["estimates"] or out["estimates"]
    truth = np.bincount(values, minlength=HISTOGRAM_K)
    counts = {int(e["value"]): (e["count"], e["std_error"]) for e in estimates["estimates"]}
    assert sorted(counts) == list(range(HISTOGRAM_K))
    z = np.array([(counts[v][0] - truth[v]) / counts[v][1] for v in range(HISTOGRAM_K)])
    # Each estimate is a sum of n independent reports' contributions: normal to within a few
    # 1e-3 in coverage at n = 20 000, so |z| <= 2 holds with probability 0.9545 per cell. The
    # cells' errors are nearly independent (they are negatively correlated through the fixed n,
    # which only narrows the spread of the count), so the count within 2 SE is at least the
    # binomial quantile at FALSE_FAIL.
    within = int(np.sum(np.abs(z) <= 2))
    floor = int(stats.binom.ppf(FALSE_FAIL, HISTOGRAM_K, 2 * stats.norm.cdf(2) - 1))
    assert within >= floor, f"{oracle}: {within}/{HISTOGRAM_K} within 2 SE (floor {floor}); z = {z.round(2)}"
    # A miscalibrated report (a wrong hash, bit order or p) shows as estimates too far from the
    # truth for their SE: sum z^2 is at most chi^2 with K degrees of freedom (less: the count's total
    # is nearly fixed), so its 1 - FALSE_FAIL quantile bounds it.
    chi2 = float(np.sum(z**2))
    assert chi2 <= stats.chi2.ppf(1 - FALSE_FAIL, HISTOGRAM_K), f"{oracle}: sum z^2 = {chi2:.1f}; z = {z.round(2)}"
