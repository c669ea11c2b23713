"""Two replicas of the operator and of the planner with `--leader-elect`, against the real control plane.

Each replica is a real `fleetpilot ... run` process with its own POD_NAME and metrics port. The
tests read the coordination.k8s.io Lease the way an SRE would (kubectl), and each process's own
metrics to tell which replica did the work: the leader gauge, the operator's reconcile and apply
counters, the planner's planning count. Killing the leader with SIGKILL (a node dying under it)
must hand over to the other replica within 15 s; until then the standby writes nothing.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import Kubectl, OperatorProcess, _free_port, condition, load_sample, wait_for
from .test_operator import ready
from .test_planner import ContractExporter, PrometheusProcess, planned_graph

pytestmark = pytest.mark.integration

HANDOVER_BOUND_S = 15.0  # the acceptance criterion (issue 7)
FLEETPILOT = str(Path(sys.executable).parent / "fleetpilot")


class Replica:
    """One `fleetpilot <command> run --leader-elect` process, named by its POD_NAME."""

    def __init__(self, pod_name: str, args: list[str], *, kubeconfig: Path, log_dir: Path) -> None:
        self.pod_name = pod_name
        self.args = args
        self.kubeconfig = kubeconfig
        self.log_path = log_dir / f"{pod_name}.log"
        self.metrics_port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [FLEETPILOT, *self.args, "--metrics-port", str(self.metrics_port)],
            stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig), "POD_NAME": self.pod_name,
                 "FLEETPILOT_RESYNC_SECONDS": "20"},
        )

    def kill(self) -> None:
        """SIGKILL: no cleanup, no release of the Lease, as when the node dies."""
        if self.alive():
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def terminate(self, timeout: float = 30) -> int:
        assert self.process is not None
        if self.alive():
            os.killpg(self.process.pid, signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples called `name` with these labels; 0 when the process does not export it (yet)."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                   if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))

    def serving(self) -> bool:
        """Whether the process answers on its metrics port (it starts serving before it campaigns)."""
        try:
            httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5)
        except httpx.TransportError:
            return False
        return True

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    """Replicas a test starts; all stopped at the end, and none may have logged a traceback."""
    started: list[Replica] = []
    yield started
    for replica in started:
        if replica.alive():
            replica.terminate()
    for replica in started:
        assert "Traceback" not in replica.log(), replica.log()[-5000:]


def lease(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    found = kubectl.run("get", "lease", name, "-n", namespace, "-o", "json", check=False)
    return {} if found.returncode else dict(kubectl.json("get", "lease", name, "-n", namespace))


def holder(kubectl: Kubectl, namespace: str, name: str) -> str:
    return str(lease(kubectl, namespace, name).get("spec", {}).get("holderIdentity") or "")


def start_pair(replicas: list[Replica], kubectl: Kubectl, log_dir: Path, *, names: tuple[str, str],
               args: list[str]) -> dict[str, Replica]:
    pair = {name: Replica(name, args, kubeconfig=kubectl.kubeconfig, log_dir=log_dir) for name in names}
    for replica in pair.values():
        replica.start()
        replicas.append(replica)
    for replica in pair.values():
        wait_for(replica.serving, timeout=60, what=f"{replica.pod_name} serving metrics")
    return pair


def hand_over_time(kubectl: Kubectl, namespace: str, lease_name: str, *, to: str, since: float) -> float:
    """Seconds from `since` until the Lease names `to` (polled as fast as kubectl answers)."""
    wait_for(lambda: holder(kubectl, namespace, lease_name) == to, timeout=HANDOVER_BOUND_S + 15, interval=0.05,
             what=f"{to} to hold Lease {lease_name}")
    return time.monotonic() - since


def operator_args(namespace: str) -> list[str]:
    return ["operator", "run", "--leader-elect", "--lease-namespace", namespace, "--namespace", namespace]


def test_operator_only_the_leader_reconciles_and_a_sigkill_hands_over_within_15s(
    kubectl: Kubectl, crds: None, namespace: str, replicas: list[Replica], tmp_path: Path
) -> None:
    pair = start_pair(replicas, kubectl, tmp_path, names=("operator-a", "operator-b"), args=operator_args(namespace))
    first = wait_for(lambda: holder(kubectl, namespace, "fleetpilot-operator"), timeout=60, what="a leader")
    leader, standby = pair[first], next(r for r in pair.values() if r.pod_name != first)
    wait_for(lambda: leader.metric("fleetpilot_operator_leader") == 1, what="the leader's gauge at 1")
    assert standby.metric("fleetpilot_operator_leader") == 0
    assert lease(kubectl, namespace, "fleetpilot-operator")["spec"]["leaseDurationSeconds"] == 8

    kubectl.apply(load_sample("simulator.yaml"), namespace)
    wait_for(lambda: ready(kubectl, namespace, "llama-8b-sim"), timeout=90, what="llama-8b-sim Ready")
    # The counter moves once the pass that wrote Ready returns: wait for it, not for luck.
    wait_for(lambda: leader.metric("fleetpilot_operator_reconciles_total", result="ok") > 0,
             what="the leader's reconciles counted")
    # The standby has not even started kopf: no reconcile, no write.
    assert standby.metric("fleetpilot_operator_reconciles_total") == 0
    assert standby.metric("fleetpilot_operator_applies_total") == 0
    assert "became the leader" not in standby.log()

    killed_at = time.monotonic()
    leader.kill()
    took = hand_over_time(kubectl, namespace, "fleetpilot-operator", to=standby.pod_name, since=killed_at)
    print(f"\noperator: Lease handed over {took:.1f}s after SIGKILL of the leader")
    assert took <= HANDOVER_BOUND_S
    assert lease(kubectl, namespace, "fleetpilot-operator")["spec"]["leaseTransitions"] == 1
    wait_for(lambda: standby.metric("fleetpilot_operator_leader") == 1, what="the new leader's gauge at 1")

    # A change made after the kill is reconciled by the new leader: scale a component, and delete a
    # child Deployment (which only an operator recreates).
    generation = kubectl.json("get", "dg", "llama-8b-sim", "-n", namespace)["status"]["rollout"]["target"]
    prefill, decode = (f"llama-8b-sim-{c}-{generation}" for c in ("prefill", "decode"))  # one generation's
    kubectl.run("scale", "dgc/llama-8b-sim-decode", "--replicas=3", "-n", namespace)
    kubectl.run("delete", "deployment", prefill, "-n", namespace, "--wait=false")
    wait_for(lambda: kubectl.json("get", "deployment", decode, "-n", namespace)["spec"]["replicas"] == 3,
             timeout=60, what="the decode Deployment scaled to 3")
    wait_for(lambda: not kubectl.json("get", "deployment", prefill, "-n", namespace)["metadata"].get(
        "deletionTimestamp"), timeout=60, what="the prefill Deployment recreated")
    wait_for(lambda: ready(kubectl, namespace, "llama-8b-sim")
             and len(kubectl.items("pods", namespace, "fleetpilot.dev/component=decode")) == 3,
             timeout=90, what="Ready with 3 decode pods")
    assert standby.metric("fleetpilot_operator_reconciles_total", result="ok") > 0
    assert standby.metric("fleetpilot_operator_applies_total", kind="Deployment") > 0


def test_operator_hands_the_lease_back_on_sigterm_and_exits_when_it_loses_it(
    kubectl: Kubectl, crds: None, namespace: str, replicas: list[Replica], tmp_path: Path
) -> None:
    pair = start_pair(replicas, kubectl, tmp_path, names=("operator-c", "operator-d"), args=operator_args(namespace))
    first = wait_for(lambda: holder(kubectl, namespace, "fleetpilot-operator"), timeout=60, what="a leader")
    leader, standby = pair[first], next(r for r in pair.values() if r.pod_name != first)

    # SIGTERM: the leader stops kopf, then releases the Lease; the standby takes it without waiting for expiry.
    stopped_at = time.monotonic()
    os.killpg(leader.process.pid, signal.SIGTERM)  # type: ignore[union-attr]
    took = hand_over_time(kubectl, namespace, "fleetpilot-operator", to=standby.pod_name, since=stopped_at)
    print(f"\noperator: Lease handed over {took:.1f}s after SIGTERM of the leader")
    assert leader.process is not None
    assert leader.process.wait(timeout=30) == 0  # one SIGTERM, as the kubelet sends: a second would kill at exit
    assert "released Lease" in leader.log()
    assert took < 8, "the standby waited for the Lease to expire: it was not released"

    # Someone else writes the Lease (a split brain, or an admin): the leader must stop at once, not fight.
    def steal() -> bool:  # a conditional PUT, like any candidate's: retried when the leader renewed meanwhile
        current = lease(kubectl, namespace, "fleetpilot-operator")
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        current["spec"].update(holderIdentity="intruder", leaseDurationSeconds=3600, renewTime=now, acquireTime=now)
        return kubectl.run("replace", "-f", "-", stdin=json.dumps(current), check=False).returncode == 0

    wait_for(steal, timeout=20, interval=0.1, what="the Lease overwritten")
    assert standby.process is not None
    code = standby.process.wait(timeout=10)
    assert code == 1, standby.log()[-3000:]
    assert "stopped leading" in standby.log()
    assert holder(kubectl, namespace, "fleetpilot-operator") == "intruder"


def test_planner_only_the_leader_plans_and_the_standby_takes_over_within_15s(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, replicas: list[Replica], tmp_path: Path
) -> None:
    exporter = ContractExporter()
    exporter.rate_rps = 1.0
    prometheus = PrometheusProcess(tmp_path, target=f"127.0.0.1:{exporter.port}", namespace=namespace,
                                   graph="planned")
    prometheus.start()
    try:
        kubectl.apply(planned_graph(10), namespace)
        pair = start_pair(replicas, kubectl, tmp_path, names=("planner-a", "planner-b"), args=[
            "planner", "run", "--prometheus-url", prometheus.url, "--namespace", namespace, "--startup-seconds", "10",
            "--leader-elect", "--lease-namespace", namespace])
        first = wait_for(lambda: holder(kubectl, namespace, "fleetpilot-planner"), timeout=60, what="a leader")
        leader, standby = pair[first], next(r for r in pair.values() if r.pod_name != first)
        def graph() -> dict[str, Any]:
            found: dict[str, Any] = kubectl.json("get", "dg", "planned", "-n", namespace)
            return found

        def dgc(component: str) -> int:
            return int(kubectl.json("get", "dgc", f"planned-{component}", "-n", namespace)["spec"]["replicas"])

        wait_for(lambda: condition(graph(), "PlannerActive").get("status") == "True", timeout=60,
                 what=lambda: f"the planner active; log:\n{leader.log()[-3000:]}")
        wait_for(lambda: leader.metric("fleetpilot_planner_planning_duration_seconds_count") >= 2, timeout=40,
                 what="two planning intervals")
        assert leader.metric("fleetpilot_planner_leader") == 1
        assert standby.metric("fleetpilot_planner_leader") == 0
        # No double actuation: the standby has not planned, so it wrote no /scale, status or Event.
        assert standby.metric("fleetpilot_planner_planning_duration_seconds_count") == 0
        assert "planned:" not in standby.log()

        killed_at = time.monotonic()
        leader.kill()
        took = hand_over_time(kubectl, namespace, "fleetpilot-planner", to=standby.pod_name, since=killed_at)
        print(f"\nplanner: Lease handed over {took:.1f}s after SIGKILL of the leader")
        assert took <= HANDOVER_BOUND_S

        # The new leader acts on what happens after the kill: load rises, it scales up.
        exporter.rate_rps = 120.0
        wait_for(lambda: dgc("prefill") > 1 and dgc("decode") > 1, timeout=60,
                 what=lambda: f"the new leader to scale up; log:\n{standby.log()[-3000:]}")
        assert standby.metric("fleetpilot_planner_leader") == 1
        assert standby.metric("fleetpilot_planner_planning_duration_seconds_count") > 0
    finally:
        prometheus.stop()
        exporter.stop()
