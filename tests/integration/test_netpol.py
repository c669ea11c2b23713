"""A graph's NetworkPolicies against the real apiserver, judged by a NetworkPolicy engine.

The operator (with the chart's RBAC, so the chart must grant what it sends on networkpolicies) renders a
graph: one NetworkPolicy per component, owned by it. Everything the engine is given is read back from the
apiserver: the policies as stored, the pods kwok runs for the graph with the labels their templates gave them,
a pod in a second namespace and one in the monitoring namespace the operator admits (its default,
`monitoring`), and every namespace's labels (`kubernetes.io/metadata.name` is the apiserver's). cyclonus'
matcher (tests/netpol/netpolcheck) then says: another namespace's pod → worker refused, the graph's frontend →
worker allowed, the monitoring namespace → the workers' metrics port allowed, any other pod → it refused. The
local cluster has no CNI that enforces policies: they are evaluated here, not enforced. Last,
`spec.network.policy: none` prunes them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from ..unit import gotools, netpol
from ..unit.netpol import Pod
from .conftest import Kubectl, OperatorProcess, wait_for

pytestmark = pytest.mark.integration

GRAPH = "fenced"
MONITORING = "monitoring"  # the operator's --monitoring-namespace default
HTTP = 8000
SELECTOR = f"fleetpilot.dev/graph={GRAPH}"


def fenced_graph(**network: Any) -> dict[str, Any]:
    return {
        "apiVersion": "fleetpilot.dev/v1alpha1", "kind": "DynamoGraph", "metadata": {"name": GRAPH},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama-8b"},
            "engine": {"framework": "simulator"},
            "components": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
            **({"network": network} if network else {}),
        },
    }


def plain_pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "3600"]}]}}


@pytest.fixture
def elsewhere(kubectl: Kubectl) -> Iterator[tuple[str, str]]:
    """A second namespace (labelled), and the monitoring namespace (made here unless it is already there)."""
    other = f"t-other-{uuid.uuid4().hex[:6]}"
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other, "labels": {"team": "other"}}})
    made_monitoring = kubectl.run("get", "namespace", MONITORING, check=False).returncode != 0
    if made_monitoring:
        kubectl.apply({"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": MONITORING, "labels": {"purpose": "monitoring"}}})
    yield other, MONITORING
    kubectl.run("delete", "namespace", other, "--wait=false")
    if made_monitoring:
        kubectl.run("delete", "namespace", MONITORING, "--wait=false")
    else:
        kubectl.run("delete", "pod", "prometheus-probe", "-n", MONITORING, "--wait=false", check=False)


def live_pod(kubectl: Kubectl, namespace: str, selector: str) -> Pod:
    """One pod, as the apiserver holds it: its namespace and labels."""
    (found, *_) = kubectl.items("pods", namespace, selector)
    return Pod(found["metadata"]["namespace"], found["metadata"].get("labels", {}))


def test_the_operators_policies_refuse_strangers_and_admit_the_frontend_and_monitoring(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, elsewhere: tuple[str, str]
) -> None:
    other, monitoring = elsewhere
    checker = gotools.go_tool("netpolcheck")
    # The API refuses a peer that selects nothing at all (its CEL rule).
    refused = kubectl.run("apply", "-n", namespace, "-f", "-", check=False,
                          stdin=yaml.safe_dump(fenced_graph(frontendFrom=[{}])))
    assert refused.returncode != 0 and "set namespaceSelector, podSelector or both" in refused.stderr, refused.stderr

    kubectl.apply(fenced_graph(), namespace)
    wait_for(lambda: sorted(p["metadata"]["name"] for p in kubectl.items("networkpolicies", namespace, SELECTOR))
             == [f"{GRAPH}-decode", f"{GRAPH}-frontend", f"{GRAPH}-prefill"], timeout=90,
             what="the graph's three NetworkPolicies")
    for component in ("frontend", "prefill", "decode"):
        wait_for(lambda c=component: kubectl.items("pods", namespace, f"{SELECTOR},fleetpilot.dev/component={c}"),
                 timeout=90, what=f"a {component} pod")
    kubectl.apply(plain_pod("intruder", {"app": "curl"}), other)
    kubectl.apply(plain_pod("neighbour", {"app": "batch-job"}), namespace)
    kubectl.apply(plain_pod("prometheus-probe", {"app.kubernetes.io/name": "prometheus"}), monitoring)

    # Everything from the apiserver: the stored policies, the pods' labels, the namespaces' labels.
    policies = kubectl.items("networkpolicies", namespace, SELECTOR)
    for policy in policies:
        owners = [ref for ref in policy["metadata"]["ownerReferences"] if ref.get("controller")]
        assert [(ref["kind"], ref["name"]) for ref in owners] == [
            ("DynamoGraphComponent", f"{GRAPH}-{policy['metadata']['labels']['fleetpilot.dev/component']}")]
    namespaces = [{"name": ns["metadata"]["name"], "labels": ns["metadata"].get("labels", {})}
                  for ns in kubectl.json("get", "namespaces")["items"]]
    frontend = live_pod(kubectl, namespace, f"{SELECTOR},fleetpilot.dev/component=frontend")
    prefill = live_pod(kubectl, namespace, f"{SELECTOR},fleetpilot.dev/component=prefill")
    decode = live_pod(kubectl, namespace, f"{SELECTOR},fleetpilot.dev/component=decode")
    intruder = live_pod(kubectl, other, "app=curl")
    neighbour = live_pod(kubectl, namespace, "app=batch-job")
    prometheus = live_pod(kubectl, monitoring, "app.kubernetes.io/name=prometheus")
    connections = {
        "another namespace's pod -> worker": (intruder, decode, HTTP),
        "the graph's frontend -> worker": (frontend, decode, HTTP),
        "the graph's frontend -> prefill worker": (frontend, prefill, HTTP),
        "monitoring -> worker metrics": (prometheus, prefill, HTTP),
        "monitoring -> frontend metrics": (prometheus, frontend, HTTP),
        "another namespace's pod -> worker metrics": (intruder, prefill, HTTP),
        "a neighbour pod -> worker metrics": (neighbour, decode, HTTP),
        "monitoring -> worker, another port": (prometheus, decode, 9090),
        "another namespace's pod -> frontend (the whole cluster by default)": (intruder, frontend, HTTP),
    }
    assert netpol.allowed(checker, policies, namespaces, connections) == {
        "another namespace's pod -> worker": False,
        "the graph's frontend -> worker": True,
        "the graph's frontend -> prefill worker": True,
        "monitoring -> worker metrics": True,
        "monitoring -> frontend metrics": True,
        "another namespace's pod -> worker metrics": False,
        "a neighbour pod -> worker metrics": False,
        "monitoring -> worker, another port": False,
        "another namespace's pod -> frontend (the whole cluster by default)": True,
    }

    # A frontend that names its clients: the second namespace's pods, by the namespace's label.
    kubectl.apply(fenced_graph(frontendFrom=[{"namespaceSelector": {"matchLabels": {"team": "other"}}}]), namespace)

    def frontend_rule() -> list[dict[str, Any]]:
        found = kubectl.json("get", "networkpolicy", f"{GRAPH}-frontend", "-n", namespace)
        peers: list[dict[str, Any]] = found["spec"]["ingress"][0]["from"]
        return peers

    wait_for(lambda: frontend_rule() == [{"namespaceSelector": {"matchLabels": {"team": "other"}}}], timeout=60,
             what="the frontend's policy to admit frontendFrom")
    policies = kubectl.items("networkpolicies", namespace, SELECTOR)
    assert netpol.allowed(checker, policies, namespaces, {
        "the named namespace -> frontend": (intruder, frontend, HTTP),
        "a neighbour -> frontend": (neighbour, frontend, HTTP),
        "monitoring -> frontend": (prometheus, frontend, HTTP),
    }) == {"the named namespace -> frontend": True, "a neighbour -> frontend": False, "monitoring -> frontend": True}

    # Opting out: the operator deletes the policies it made, and nothing is refused any more.
    kubectl.apply(fenced_graph(policy="none"), namespace)
    wait_for(lambda: not kubectl.items("networkpolicies", namespace, SELECTOR), timeout=60,
             what="the graph's NetworkPolicies pruned")
    assert not kubectl.items("networkpolicies", namespace)
    assert netpol.allowed(checker, kubectl.items("networkpolicies", namespace), namespaces, {
        "another namespace's pod -> worker": (intruder, decode, HTTP)}) == {"another namespace's pod -> worker": True}
    # ... and the graph keeps running: its pods are still there.
    assert kubectl.items("pods", namespace, f"{SELECTOR},fleetpilot.dev/component=decode")
