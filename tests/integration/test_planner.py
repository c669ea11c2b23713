"""The live planner with a real Prometheus and the real control plane.

A stand-in frontend exports the metric contract with values the test controls; upstream Prometheus (scripts/install-prometheus.sh)
scrapes it every second, labelling the series with the graph and namespace as the e2e relabelling
will; the planner runs as `fleetpilot planner run` against both. The test raises and lowers the
offered rate and stops Prometheus, and reads what the planner wrote to the DynamoGraphComponents'
/scale and to the graph's status.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from fleetpilot.devcluster import cluster as devcluster
from fleetpilot.frontend.metrics import LATENCY_BUCKETS, TOKEN_BUCKETS

from .conftest import Kubectl, OperatorProcess, _free_port, condition, wait_for

pytestmark = pytest.mark.integration

INTERVAL_S = 10
MODEL = "llama-8b"


class ContractExporter:
    """Exports the frontend's metric contract at a rate the test sets (a stand-in frontend)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.rate_rps = 0.0
        self.port = _free_port()
        self.started = Counter("fleetpilot_frontend_requests_started", "", ["model"], registry=self.registry)
        self.done = Counter("fleetpilot_frontend_requests", "", ["model", "status"], registry=self.registry)
        self.ttft = Histogram("fleetpilot_frontend_time_to_first_token_seconds", "", ["model"],
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram("fleetpilot_frontend_inter_token_latency_seconds", "", ["model"],
                             buckets=LATENCY_BUCKETS, registry=self.registry)
        self.isl = Histogram("fleetpilot_frontend_input_tokens", "", ["model"], buckets=TOKEN_BUCKETS,
                             registry=self.registry)
        self.osl = Histogram("fleetpilot_frontend_output_tokens", "", ["model"], buckets=TOKEN_BUCKETS,
                             registry=self.registry)
        self._stop = threading.Event()
        self._owed = 0.0
        self.resume()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def pause(self) -> None:
        """Stop answering scrapes (the target goes down; Prometheus marks its series stale)."""
        self._server.shutdown()
        self._server.server_close()

    def resume(self) -> None:
        self._server, _ = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._owed += self.rate_rps * 0.1
            whole = int(self._owed)
            self._owed -= whole
            for _ in range(whole):
                self.started.labels(MODEL).inc()
                self.done.labels(MODEL, "ok").inc()
                self.ttft.labels(MODEL).observe(0.15)
                self.itl.labels(MODEL).observe(0.02)
                self.isl.labels(MODEL).observe(2000)
                self.osl.labels(MODEL).observe(200)

    def stop(self) -> None:
        self._stop.set()


class PrometheusProcess:
    """Prometheus (upstream, built by scripts/install-prometheus.sh) on a loopback port, scraping the
    exporter every second."""

    def __init__(self, folder: Path, *, target: str, namespace: str, graph: str) -> None:
        self.folder = folder
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{
                "job_name": "frontend",
                "static_configs": [{"targets": [target], "labels": {"graph": graph, "namespace": namespace}}],
            }],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = devcluster.prometheus_bin()
        self.process = subprocess.Popen(
            [str(binary), f"--config.file={self.folder / 'prometheus.yml'}", f"--storage.tsdb.path={self.folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            stdout=(self.folder / "prometheus.log").open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        wait_for(lambda: _ok(self.url + "/-/ready"), timeout=30, what="prometheus ready")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def planned_graph(interval_s: int) -> dict[str, Any]:
    """A simulator graph called `planned` with the planner in sla mode, one replica per pool to start."""
    return {
        "apiVersion": "fleetpilot.dev/v1alpha1", "kind": "DynamoGraph", "metadata": {"name": "planned"},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": MODEL},
            "engine": {"framework": "simulator"},
            "components": {"prefill": {"replicas": 1, "scaling": {"min": 1, "max": 8}},
                           "decode": {"replicas": 1, "scaling": {"min": 1, "max": 8}}},
            "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50, "percentile": 90},
                        "predictor": "constant", "intervalSeconds": interval_s},
        },
    }


@pytest.fixture
def planned_metrics(kubectl: Kubectl, operator: OperatorProcess, namespace: str,
                    tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The graph `planned` and its metric contract in a real Prometheus; no planner (`planned` adds one)."""
    exporter = ContractExporter()
    prometheus = PrometheusProcess(tmp_path, target=f"127.0.0.1:{exporter.port}", namespace=namespace,
                                   graph="planned")
    prometheus.start()
    kubectl.apply(planned_graph(INTERVAL_S), namespace)
    try:
        yield {"exporter": exporter, "prometheus": prometheus}
    finally:
        prometheus.stop()
        exporter.stop()


@pytest.fixture
def planned(planned_metrics: dict[str, Any], kubectl: Kubectl, namespace: str,
            tmp_path: Path) -> Iterator[dict[str, Any]]:
    prometheus: PrometheusProcess = planned_metrics["prometheus"]
    log = (tmp_path / "planner.log").open("ab")

    def start_planner() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "fleetpilot"), "planner", "run", "--prometheus-url", prometheus.url,
             "--namespace", namespace, "--startup-seconds", "10", "--hold-seconds", "20", "--metrics-port", "0"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "KUBECONFIG": str(kubectl.kubeconfig)},
        )

    running = {"planner": start_planner()}

    def restart() -> None:
        """Stop the planner and start a new one: it knows nothing but what Prometheus kept."""
        os.killpg(running["planner"].pid, signal.SIGTERM)
        running["planner"].wait(timeout=30)
        running["planner"] = start_planner()

    try:
        yield {**planned_metrics, "restart": restart, "log": tmp_path / "planner.log",
               "alive": lambda: running["planner"].poll() is None}
    finally:
        os.killpg(running["planner"].pid, signal.SIGTERM)
        running["planner"].wait(timeout=30)
        assert "Traceback" not in (tmp_path / "planner.log").read_text(), (tmp_path / "planner.log").read_text()[-4000:]


def replicas(kubectl: Kubectl, namespace: str) -> dict[str, int]:
    return {c: int(kubectl.json("get", "dgc", f"planned-{c}", "-n", namespace)["spec"]["replicas"])
            for c in ("prefill", "decode")}


def test_planner_scales_up_with_load_down_after_the_hold_and_holds_without_metrics(
    kubectl: Kubectl, namespace: str, planned: dict[str, Any]
) -> None:
    exporter: ContractExporter = planned["exporter"]
    exporter.rate_rps = 1.0
    graph = lambda: kubectl.json("get", "dg", "planned", "-n", namespace)
    wait_for(lambda: condition(graph(), "PlannerActive").get("status") == "True", timeout=60,
             what=lambda: f"the planner active; status: {graph().get('status')}; log:\n"
                          f"{planned['log'].read_text()[-3000:]}")
    low = replicas(kubectl, namespace)
    assert low == {"prefill": 1, "decode": 1}, graph()["status"].get("planner")

    raised_at = time.monotonic()
    exporter.rate_rps = 120.0
    high = wait_for(lambda: (r := replicas(kubectl, namespace))["prefill"] > 1 and r["decode"] > 1 and r,
                    timeout=2 * INTERVAL_S + 15, what="prefill and decode to scale up")
    print(f"\nscaled up to {high} {time.monotonic() - raised_at:.1f}s after the rate rose")
    status = graph()["status"]
    assert status["planner"]["predicted"]["rateRps"] > 50
    # The length histograms reached sizing through Prometheus: prefill is sized over the prompt mix.
    assert "prompt-length mix (mean 2000 tokens" in status["planner"]["reason"], status["planner"]["reason"]
    assert "prefill" in status["planner"]["replicas"]
    table = kubectl.run("get", "dg", "planned", "-n", namespace).stdout
    assert "prefill=" in table, table  # kubectl get dg shows the planner's last decision
    # The graph's own spec is never touched by the planner.
    assert graph()["spec"]["components"]["decode"]["replicas"] == 1

    lowered_at = time.monotonic()
    exporter.rate_rps = 1.0
    # The way up may take more than one step (the calibrated quantile widens once the jump is scored):
    # the peak is the highest count seen, and a scale-down is a count below it.
    peak = dict(high)

    def dropped() -> dict[str, int] | None:
        now = replicas(kubectl, namespace)
        for c, most in peak.items():
            peak[c] = max(most, now[c])
        return now if any(now[c] < peak[c] for c in peak) else None

    first_drop = wait_for(dropped, timeout=90, what="a scale-down after the hold")
    waited = time.monotonic() - lowered_at
    print(f"first scale-down to {first_drop} {waited:.1f}s after the rate fell (peak {peak})")
    assert waited >= 20 - 1, "scaled down before the 20 s hold"
    # Down to the highest target of the hold (the HPA's stabilisation window), never below what ran before
    # the rise: each component's hold ends on its own, so the first change may move only one of them.
    assert all(low[c] <= first_drop[c] <= peak[c] for c in peak), (peak, first_drop)

    planned["prometheus"].stop()
    before = replicas(kubectl, namespace)
    wait_for(lambda: condition(graph(), "PlannerActive").get("reason") == "NoMetrics", timeout=3 * INTERVAL_S,
             what="PlannerActive=False/NoMetrics")
    held = condition(graph(), "PlannerActive")
    assert held["status"] == "False" and "Prometheus" in held["message"]
    time.sleep(INTERVAL_S + 2)
    assert replicas(kubectl, namespace) == before

    planned["prometheus"].start()
    wait_for(lambda: condition(graph(), "PlannerActive").get("status") == "True", timeout=4 * INTERVAL_S,
             what="planning to resume once Prometheus is back")

    # A restarted planner (or a new leader) starts from the load history Prometheus kept, not cold, and
    # from what the one before it had learned of the fleet (kept in the graph's status).
    learned = graph()["status"]["planner"]["learned"]
    assert {"prefillSpeed", "decodeSpeed", "prefillOffsetSeconds"} <= set(learned), learned
    planned["restart"]()
    loaded = re.compile(r"planned: warm start with (\d+) intervals of history")
    counts = wait_for(lambda: [int(n) for n in loaded.findall(planned["log"].read_text())][1:], timeout=60,
                      what="the restarted planner's warm start")
    assert counts[0] >= 3, f"the restarted planner loaded only {counts[0]} intervals of history"
    assert "planned: warm start with what the planner had learned" in planned["log"].read_text()
