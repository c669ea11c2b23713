"""Status that tells the truth when things go wrong, on the real control plane.

Each case is one the status got wrong on a running operator: a ResourceQuota that refuses the
graph's pods, pods pending for a reason other than GPUs, a frontend scaled to zero, a graph whose
planner nobody runs. What the apiserver, the controllers and the scheduler say in those cases is
what the operator reads, so these run against the real ones.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from fleetpilot.api import contract
from fleetpilot.devcluster import cluster as devcluster

from .conftest import ChartIdentities, Kubectl, OperatorProcess, condition, render_chart, wait_for
from .test_operator import graph, ready, simulator_graph

pytestmark = pytest.mark.integration


def warning_events(kubectl: Kubectl, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in kubectl.items("events", namespace)
            if e["involvedObject"]["name"] == name and e["reason"] == reason and e["type"] == "Warning"]


def test_a_gpu_quota_that_refuses_pods_is_named_with_what_it_lacks(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    """The graph needs 3 GPUs (1 prefill + 2 decode replicas of 1); the quota allows 2. The ReplicaSet
    controller's create is refused by the apiserver's quota admission, which the Deployment reports as
    ReplicaFailure: the graph must say which quota and what it lacks, at once, with a Warning Event."""
    kubectl.apply({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus"},
                   "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}}, namespace)
    kubectl.apply(simulator_graph("quota"), namespace)

    def quota_exceeded() -> dict[str, Any]:
        found = condition(graph(kubectl, namespace, "quota"), "Degraded")
        return found if found.get("reason") == "QuotaExceeded" else {}

    degraded = wait_for(quota_exceeded, timeout=90, what="Degraded=QuotaExceeded")
    assert degraded["status"] == "True"
    assert "ResourceQuota gpus is exhausted" in degraded["message"]
    assert "requests.nvidia.com/gpu 1 more (quota 2, 2 used)" in degraded["message"]
    ready_condition = condition(graph(kubectl, namespace, "quota"), "Ready")
    assert (ready_condition["status"], ready_condition["reason"]) == ("False", "QuotaExceeded")
    assert wait_for(lambda: warning_events(kubectl, namespace, "quota", "QuotaExceeded"), what="a Warning Event")

    # Raised quota: the Deployment's controller retries, the pod is made, the graph is Ready and says so.
    kubectl.apply({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus"},
                   "spec": {"hard": {"requests.nvidia.com/gpu": "3"}}}, namespace)
    wait_for(lambda: ready(kubectl, namespace, "quota"), timeout=120, what="Ready once the quota allows it")
    assert condition(graph(kubectl, namespace, "quota"), "Degraded")["status"] == "False"


def test_pods_no_node_matches_carry_the_schedulers_reason_not_gpu_numbers(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    manifest = simulator_graph("nowhere")
    manifest["spec"]["podTemplate"] = {"nodeSelector": {"example.com/accelerator": "tpu-v9"}}
    kubectl.apply(manifest, namespace)

    def unschedulable() -> dict[str, Any]:
        found = condition(graph(kubectl, namespace, "nowhere"), "Degraded")
        return found if found.get("reason") == "Unschedulable" else {}

    message = wait_for(unschedulable, timeout=60, what="Degraded=Unschedulable")["message"]
    assert "didn't match Pod's node affinity/selector" in message, message
    assert "free" not in message and "preemption" not in message, message


def test_the_frontend_cannot_be_scaled_to_zero(kubectl: Kubectl, operator: OperatorProcess, namespace: str) -> None:
    kubectl.apply(simulator_graph("served"), namespace)
    wait_for(lambda: ready(kubectl, namespace, "served"), what="Ready")
    assert kubectl.json("get", "dgc", "served-frontend", "-n", namespace)["spec"]["minReplicas"] == 1
    refused = kubectl.run("scale", "dgc/served-frontend", "--replicas=0", "-n", namespace, check=False)
    assert refused.returncode != 0
    assert "replicas must lie within minReplicas and maxReplicas" in refused.stderr
    kubectl.run("scale", "dgc/served-frontend", "--replicas=2", "-n", namespace)  # up is fine
    wait_for(lambda: graph(kubectl, namespace, "served")["status"]["components"]["frontend"]["summary"] == "2/2",
             what="frontend 2/2")


def planner_says(cluster: devcluster.Cluster, namespace: str, name: str, *, decided_at: str) -> None:
    """What the planner applies each interval (its field manager, server-side, forced): PlannerActive and
    status.planner.lastDecisionTime. (kubectl 1.30's `apply` has no --subresource.)"""
    body = {"apiVersion": "fleetpilot.dev/v1alpha1", "kind": "DynamoGraph",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"planner": {"lastDecisionTime": decided_at, "mode": "sla", "reason": "test"},
                       "conditions": [contract.condition("PlannerActive", True, "Planning", "scaling",
                                                         generation=1, now=decided_at)]}}
    with cluster.client() as http:
        http.patch(f"/apis/fleetpilot.dev/v1alpha1/namespaces/{namespace}/dynamographs/{name}/status",
                   params={"fieldManager": contract.PLANNER, "force": "true"}, content=json.dumps(body),
                   headers={"Content-Type": "application/apply-patch+yaml"}).raise_for_status()


def test_a_graph_no_planner_acts_on_says_so_and_a_planner_takes_the_condition_back(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, control_plane: devcluster.Cluster
) -> None:
    """No planner runs in this test. Two 10-s intervals after the graph appears, the operator says
    `PlannerActive=Unknown NoPlanner` (with a Warning). A planner's decision replaces it (the planner's
    field manager takes the condition), and the operator leaves it until two intervals pass without another."""
    manifest = simulator_graph("orphan")
    manifest["spec"]["planner"] = {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "intervalSeconds": 10}
    kubectl.apply(manifest, namespace)
    created = time.monotonic()

    def planner_condition() -> dict[str, Any]:
        return condition(graph(kubectl, namespace, "orphan"), "PlannerActive")

    said = wait_for(lambda: planner_condition().get("reason") == "NoPlanner" and planner_condition(), timeout=90,
                    what="PlannerActive=Unknown NoPlanner")
    assert time.monotonic() - created >= 19  # two intervals, not at once
    assert said["status"] == "Unknown" and "no planner has acted on this graph" in said["message"]
    assert wait_for(lambda: warning_events(kubectl, namespace, "orphan", "NoPlanner"), what="a Warning Event")

    decided = datetime.datetime.now(datetime.UTC)
    planner_says(control_plane, namespace, "orphan", decided_at=contract.rfc3339(decided))
    assert planner_condition()["status"] == "True"
    managers = {entry["manager"]: json.dumps(entry.get("fieldsV1", {}))
                for entry in kubectl.json("get", "dg", "orphan", "-n", namespace, "--show-managed-fields")
                ["metadata"]["managedFields"] if entry.get("subresource") == "status"}
    assert 'k:{\\"type\\":\\"PlannerActive\\"}' in managers[contract.PLANNER], managers

    stale = wait_for(lambda: planner_condition().get("reason") == "NoPlanner" and planner_condition(), timeout=90,
                     what="NoPlanner again once the planner falls silent")
    assert "the last decision was at" in stale["message"]
    assert datetime.datetime.now(datetime.UTC) - decided >= datetime.timedelta(seconds=19)


@pytest.fixture
def bounds_policy(kubectl: Kubectl, chart_identities: ChartIdentities) -> Iterator[None]:
    """The chart's ValidatingAdmissionPolicy and its binding, as `helm install` applies them; removed after."""
    documents = [doc for doc in render_chart(namespace=chart_identities.namespace)
                 if doc["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")]
    assert len(documents) == 2, [doc["kind"] for doc in documents]
    kubectl.run("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(documents))
    yield
    for doc in documents:
        kubectl.run("delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found")


def test_a_components_bounds_are_written_by_the_operator_alone(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, bounds_policy: None
) -> None:
    """With the chart's admission policy, a DGC's minReplicas/maxReplicas patched by anyone but the operator's
    ServiceAccount is refused, naming the field and the graph field to change instead; replicas within the
    bounds stay anyone's to scale, and the graph's bounds, changed where they live, reach the component."""
    kubectl.apply(simulator_graph("bounded", prefill={"replicas": 1}, decode={"replicas": 1, "scaling": {"min": 1, "max": 4}}),
                  namespace)
    wait_for(lambda: ready(kubectl, namespace, "bounded"), what="Ready")

    def patch(field: str, value: int, *flags: str) -> Any:
        return kubectl.run("patch", "dgc/bounded-decode", "-n", namespace, "--type=merge",
                           "-p", json.dumps({"spec": {field: value}}), *flags, check=False)

    # The policy takes a moment to reach the apiserver's admission chain after it is created: probed with
    # server-side dry runs (admission judges them too, and they change nothing).
    wait_for(lambda: patch("maxReplicas", 50, "--dry-run=server").returncode != 0, timeout=30,
             what="the admission policy in force")
    refused = patch("maxReplicas", 50)
    assert refused.returncode != 0
    assert ("spec.maxReplicas: component bounded-decode takes its bounds from DynamoGraph bounded: change "
            "spec.components.decode.scaling.max there") in refused.stderr, refused.stderr
    refused = patch("minReplicas", 0)
    assert refused.returncode != 0 and "spec.components.decode.scaling.min" in refused.stderr, refused.stderr
    dgc = kubectl.json("get", "dgc", "bounded-decode", "-n", namespace)["spec"]
    assert (dgc["minReplicas"], dgc["maxReplicas"]) == (1, 4)
    kubectl.run("scale", "dgc/bounded-decode", "--replicas=3", "-n", namespace)  # within the bounds: anyone's
    kubectl.run("patch", "dynamograph/bounded", "-n", namespace, "--type=merge",
                "-p", json.dumps({"spec": {"components": {"decode": {"scaling": {"max": 6}}}}}))
    wait_for(lambda: kubectl.json("get", "dgc", "bounded-decode", "-n", namespace)["spec"]["maxReplicas"] == 6,
             timeout=30, what="the graph's new max written to the component by the operator")
