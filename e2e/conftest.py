"""Fixtures for the closed-loop scenarios: one environment (harness.Harness) for the whole session.

`pytest e2e` from the repository root (never `python -m pytest`: the root's operator/ folder would
shadow the standard library). e2e/ has no `__init__.py`, so pytest puts e2e/ itself, not the
repository root, on sys.path. FLEETPILOT_E2E_KEEP=1 leaves everything running after the session
(`python e2e/run.py down` stops it). Results go to e2e/results/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness as harness_mod
import pytest
import scenario as scenario_mod

RESULTS = Path(__file__).resolve().parent / "results"


@pytest.fixture(scope="session")
def harness() -> Iterator[harness_mod.Harness]:
    environment = harness_mod.Harness(planner_args=[
        "--startup-seconds", str(scenario_mod.ClosedLoop.startup_s),
        "--hold-seconds", str(scenario_mod.ClosedLoop.hold_s)])
    try:
        environment.up()
        yield environment
        errors = environment.errors_in_logs()
        assert not errors, "the operator or planner logged errors:\n" + "\n".join(errors[:20])
    finally:
        if not os.environ.get("FLEETPILOT_E2E_KEEP"):
            environment.down(quiet=True)


class Graph:
    """One scenario's graph: its namespace, profile and objects, removed (and waited for) afterwards."""

    def __init__(self, environment: harness_mod.Harness, scenario: scenario_mod.ClosedLoop) -> None:
        self.harness = environment
        self.scenario = scenario
        self.kubectl = environment.kubectl

    def create(self) -> None:
        s = self.scenario
        self.kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": s.namespace}})
        self.kubectl.apply([s.profile_config_map(), s.graph_manifest()])

    def get(self) -> dict[str, Any]:
        graph: dict[str, Any] = self.kubectl.json("get", "dg", self.scenario.graph, "-n", self.scenario.namespace)
        return graph

    def wait_ready(self, timeout: float = 120) -> str:
        """Wait until every component is ready; returns the frontend's URL (its pod IP)."""
        s = self.scenario

        def ready() -> bool:
            status = self.get().get("status", {})
            return any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))

        harness_mod.wait_for(ready, timeout=timeout, what=lambda: f"graph {s.graph} Ready; status:"
                             f" {self.get().get('status')}; pod runner log:\n"
                             f"{self.harness.processes['podrunner'].log()}")
        pods = self.kubectl.json("get", "pods", "-n", s.namespace, "-l", "fleetpilot.dev/component=frontend")
        return f"http://{pods['items'][0]['status']['podIP']}:8000"

    def delete(self) -> None:
        s = self.scenario
        self.kubectl.run("delete", "namespace", s.namespace, "--wait=false", check=False)
        harness_mod.wait_for(
            lambda: not self.kubectl.json("get", "pods", "-n", s.namespace)["items"], timeout=180,
            what=f"the pods of {s.namespace} to go")


@pytest.fixture
def results() -> Path:
    RESULTS.mkdir(exist_ok=True)
    return RESULTS


def start_load(scenario: scenario_mod.ClosedLoop, *, url: str, trace: Path, out: Path) -> subprocess.Popen[bytes]:
    """The replay client as a child process (see loadgen.py)."""
    argv = [sys.executable, str(Path(__file__).parent / "loadgen.py"), "--trace", str(trace), "--url", url,
            "--model", scenario.served_model, "--out", str(out), "--trace-model", "e2e-ramp",
            "--isl", str(scenario.isl), "--osl", str(scenario.osl), "--length-sigma", str(scenario.length_sigma),
            "--seed", str(scenario.seed), "--sla", scenario.sla]
    log = out.with_suffix(".log").open("wb")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})


def wait_load(process: subprocess.Popen[bytes], *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(1)
    if process.poll() is None:
        process.kill()
        raise AssertionError(f"the load generator ran past {timeout:.0f}s")


def run_load(graph: Graph, load_trace: Path, report_path: Path, *, during: Any = None,
             before: Any = None) -> dict[str, Any]:
    """Run the load against the graph while sampling; returns samples, the load report and anchors.
    `before()` runs once the graph is Ready, `during(t0, sampler)` once the load has started."""
    s = graph.scenario
    environment = graph.harness
    url = graph.wait_ready()
    if before is not None:
        before()
    sampler = scenario_mod.Sampler(server=environment.config.server, pki=environment.config.folder / "pki",
                                   scenario=s, every_s=scenario_mod.SAMPLE_S)
    t0 = time.time()
    sampler.start()
    load = start_load(s, url=url, trace=load_trace, out=report_path)
    try:
        if during is not None:
            during(t0, sampler)
        wait_load(load, timeout=s.duration_s + 180)
    finally:
        if load.poll() is None:
            load.kill()
        sampler.stop()
    report = json.loads(report_path.read_text())
    return {"samples": sampler.samples, "load": report, "t0": t0, "load_start": report["started_unix"] - t0}
