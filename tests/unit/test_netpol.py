"""The NetworkPolicies the operator renders for a graph (`spec.network`), and what they let through.

Two kinds of test. The rendered objects themselves (beside the golden files, which pin each sample's
policies): one per component, owned like every other child, none with `policy: none`, the peers rule of a
disaggregated graph and of a multinode group, a custom `frontendFrom`. And their meaning, judged by a real
NetworkPolicy engine (cyclonus' matcher, through tests/netpol/netpolcheck; `netpol.py`) on pods that carry
the labels the rendered pod templates give them: another namespace's pod is refused by a worker, the graph's
frontend is admitted, the monitoring namespace reaches the metrics port, and nothing else does.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import netpol
import pytest
from gotools import go_tool
from netpol import Pod

from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api
from fleetpilot.operator import render

SETTINGS = render.RenderSettings(monitoring_namespace="monitoring", control_plane_namespace="fleetpilot-system")
NAMESPACE = "serving"
HTTP = render.HTTP_PORT

DISAGG: dict[str, Any] = {
    "apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND,
    "metadata": {"name": "llama", "namespace": NAMESPACE, "uid": "uid-llama"},
    "spec": {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {"framework": "simulator"},
        "components": {"prefill": {}, "decode": {"replicas": 2}},
    },
}


def graph_of(body: dict[str, Any], **spec: Any) -> api.DynamoGraph:
    changed = copy.deepcopy(body)
    changed["spec"].update(spec)
    return api.DynamoGraph.model_validate(changed)


def owner(graph: api.DynamoGraph, component: str) -> render.OwnerRef:
    return render.OwnerRef(api.API_VERSION, api.COMPONENT_KIND, contract.child_name(graph.metadata.name, component),
                           f"uid-{component}")


def policies(graph: api.DynamoGraph, settings: render.RenderSettings = SETTINGS) -> list[dict[str, Any]]:
    """Every NetworkPolicy of the graph, as the reconciler gets them: within each component's workload."""
    return [obj for component in render.components_of(graph)
            for obj in render.workload(graph, component, replicas=1, owner=owner(graph, component), settings=settings)
            if obj["kind"] == "NetworkPolicy"]


def pod_labels(graph: api.DynamoGraph, component: api.ComponentName) -> dict[str, str]:
    """The labels the component's pods carry: those of the pod template its workload renders."""
    (runner,) = [obj for obj in render.workload(graph, component, replicas=1, owner=owner(graph, component),
                                                settings=SETTINGS) if obj["kind"] in ("Deployment", "StatefulSet")]
    labels: dict[str, str] = runner["spec"]["template"]["metadata"]["labels"]
    return labels


def checker() -> Path:
    return go_tool("netpolcheck")


NAMESPACES = [netpol.namespace(NAMESPACE), netpol.namespace("other"), netpol.namespace("monitoring"),
              netpol.namespace("ingress", {"team": "edge"}), netpol.namespace("fleetpilot-system")]


# -- what is rendered --------------------------------------------------------------------------------


def test_one_policy_per_component_selecting_its_pods_owned_by_its_component() -> None:
    graph = graph_of(DISAGG)
    rendered = policies(graph)
    assert [p["metadata"]["name"] for p in rendered] == ["llama-frontend", "llama-prefill", "llama-decode"]
    for policy, component in zip(rendered, render.components_of(graph), strict=True):
        assert policy["apiVersion"] == "networking.k8s.io/v1"
        assert policy["metadata"]["labels"] == render.component_labels(graph, component)
        assert policy["metadata"]["ownerReferences"] == [owner(graph, component).as_manifest()]
        # Selected by the labels every pod of the component carries, whatever its generation.
        selector = policy["spec"]["podSelector"]["matchLabels"]
        assert selector == render.selector_labels("llama", component)
        assert selector.items() <= pod_labels(graph, component).items()
        # Ingress only: egress (model downloads, the frontend's watches) is left open.
        assert policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"]


def test_the_policy_is_applied_before_anything_that_runs_pods() -> None:
    graph = graph_of(DISAGG)
    for component in render.components_of(graph):
        kinds = [o["kind"] for o in render.workload(graph, component, replicas=1, owner=owner(graph, component),
                                                    settings=SETTINGS)]
        assert kinds.index("NetworkPolicy") < kinds.index("Deployment")


def test_policy_none_renders_no_policy_at_all() -> None:
    graph = graph_of(DISAGG, network={"policy": "none", "frontendFrom": [{"namespaceSelector": {}}]})
    assert policies(graph) == []
    assert render.network_policy(graph, "frontend", owner=owner(graph, "frontend"), settings=SETTINGS) == []


def test_workers_admit_their_frontend_their_peers_and_the_monitoring_namespace() -> None:
    (_, prefill, _) = policies(graph_of(DISAGG))
    tcp = [{"protocol": "TCP", "port": HTTP}]
    assert prefill["spec"]["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": {contract.LABEL_GRAPH: "llama", contract.LABEL_COMPONENT: "frontend"}}}],
         "ports": tcp},
        # The simulator's decode worker pulls KV blocks from its prefill worker's HTTP API.
        {"from": [{"podSelector": {"matchLabels": {contract.LABEL_GRAPH: "llama"}, "matchExpressions": [
            {"key": contract.LABEL_COMPONENT, "operator": "In", "values": ["prefill", "decode"]}]}}], "ports": tcp},
        {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}], "ports": tcp},
    ]


def test_an_aggregated_single_node_pool_admits_no_peers() -> None:
    graph = graph_of(DISAGG, components={"aggregated": {}})
    (_, aggregated) = policies(graph)
    assert len(aggregated["spec"]["ingress"]) == 2  # its frontend and the monitoring namespace


def test_a_simulated_group_admits_its_ranks_on_the_rendezvous_port_alone() -> None:
    graph = graph_of(DISAGG, components={"aggregated": {"nodes": 2, "gpus": 1, "parallelism": {"tensor": 2}}})
    (_, aggregated) = policies(graph)
    peers = aggregated["spec"]["ingress"][1]
    assert peers == {"from": [{"podSelector": {"matchLabels": {contract.LABEL_GRAPH: "llama"}, "matchExpressions": [
        {"key": contract.LABEL_COMPONENT, "operator": "In", "values": ["aggregated"]}]}}],
        "ports": [{"protocol": "TCP", "port": render.GROUP_PORT}]}


@pytest.mark.parametrize("framework", ["vllm", "sglang"])
def test_real_engines_peers_are_admitted_on_every_port(framework: str) -> None:
    """NCCL's and NIXL's (UCX's) transports listen on ephemeral ports: a port list would cut them."""
    graph = graph_of(DISAGG, engine={"framework": framework, "image": "engine:1"},
                     components={"prefill": {}, "decode": {"nodes": 2, "gpus": 1, "parallelism": {"tensor": 2}}})
    for policy in policies(graph)[1:]:
        (peers,) = [rule for rule in policy["spec"]["ingress"] if "matchExpressions" in rule["from"][0].get(
            "podSelector", {})]
        assert "ports" not in peers


def test_frontend_admits_frontend_from_the_control_plane_and_the_monitoring_namespace() -> None:
    tcp = [{"protocol": "TCP", "port": HTTP}]
    control_plane = {"from": [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "fleetpilot-system"}},
        "podSelector": {"matchExpressions": [
            {"key": "app.kubernetes.io/component", "operator": "In", "values": ["operator", "planner"]}]}}],
        "ports": tcp}
    monitoring = {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                  "ports": tcp}
    # By default the whole cluster, as before policies existed, made explicit.
    (frontend, *_) = policies(graph_of(DISAGG))
    assert frontend["spec"]["ingress"] == [{"from": [{"namespaceSelector": {}}], "ports": tcp}, control_plane, monitoring]
    chosen = [{"namespaceSelector": {"matchLabels": {"team": "edge"}},
               "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["gateway"]}]}},
              {"podSelector": {"matchLabels": {"role": "client"}}}]
    (frontend, *_) = policies(graph_of(DISAGG, network={"frontendFrom": chosen}))
    assert frontend["spec"]["ingress"] == [{"from": chosen, "ports": tcp}, control_plane, monitoring]
    # Outside a cluster (the operator run by hand) no control-plane rule; no monitoring namespace, no scrapes.
    (frontend, *_) = policies(graph_of(DISAGG), render.RenderSettings(monitoring_namespace=""))
    assert frontend["spec"]["ingress"] == [{"from": [{"namespaceSelector": {}}], "ports": tcp}]


# -- what gets through, as a NetworkPolicy engine judges it ------------------------------------------


def test_the_engine_refuses_other_namespaces_and_admits_the_frontend_and_the_monitoring_namespace() -> None:
    graph = graph_of(DISAGG)
    frontend = Pod(NAMESPACE, pod_labels(graph, "frontend"))
    prefill = Pod(NAMESPACE, pod_labels(graph, "prefill"))
    decode = Pod(NAMESPACE, pod_labels(graph, "decode"))
    intruder = Pod("other", {"app": "curl"})
    prometheus = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
    neighbour = Pod(NAMESPACE, {"app": "batch-job"})
    # Another graph's frontend in the same namespace: the graph label tells them apart.
    stranger = Pod(NAMESPACE, {**pod_labels(graph, "frontend"), contract.LABEL_GRAPH: "other-graph"})
    verdicts = netpol.allowed(checker(), policies(graph), NAMESPACES, {
        "another namespace's pod -> worker": (intruder, decode, HTTP),
        "another graph's frontend -> worker": (stranger, decode, HTTP),
        "a neighbour pod -> worker": (neighbour, prefill, HTTP),
        "the graph's frontend -> worker": (frontend, decode, HTTP),
        "the graph's frontend -> worker, another port": (frontend, decode, 5600),
        "decode -> prefill (KV pull)": (decode, prefill, HTTP),
        "monitoring -> worker metrics": (prometheus, decode, HTTP),
        "monitoring -> frontend metrics": (prometheus, frontend, HTTP),
        "monitoring -> worker, another port": (prometheus, decode, 9090),
        "another namespace's pod -> worker metrics": (intruder, prefill, HTTP),
        "another namespace's pod -> frontend (default: whole cluster)": (intruder, frontend, HTTP),
        "another namespace's pod -> frontend, another port": (intruder, frontend, 9000),
        "the frontend <- the operator": (Pod("fleetpilot-system", {"app.kubernetes.io/component": "operator"}),
                                         frontend, HTTP),
    })
    assert verdicts == {
        "another namespace's pod -> worker": False,
        "another graph's frontend -> worker": False,
        "a neighbour pod -> worker": False,
        "the graph's frontend -> worker": True,
        "the graph's frontend -> worker, another port": False,
        "decode -> prefill (KV pull)": True,
        "monitoring -> worker metrics": True,
        "monitoring -> frontend metrics": True,
        "monitoring -> worker, another port": False,
        "another namespace's pod -> worker metrics": False,
        "another namespace's pod -> frontend (default: whole cluster)": True,
        "another namespace's pod -> frontend, another port": False,
        "the frontend <- the operator": True,
    }


def test_the_engine_admits_only_frontend_from_to_a_frontend_that_names_it() -> None:
    graph = graph_of(DISAGG, network={"frontendFrom": [
        {"namespaceSelector": {"matchLabels": {"team": "edge"}}, "podSelector": {"matchLabels": {"app": "gateway"}}}]})
    frontend = Pod(NAMESPACE, pod_labels(graph, "frontend"))
    verdicts = netpol.allowed(checker(), policies(graph), NAMESPACES, {
        "the gateway": (Pod("ingress", {"app": "gateway"}), frontend, HTTP),
        "another pod of the gateway's namespace": (Pod("ingress", {"app": "debug"}), frontend, HTTP),
        "a gateway-labelled pod elsewhere": (Pod("other", {"app": "gateway"}), frontend, HTTP),
        "a pod of the graph's own namespace": (Pod(NAMESPACE, {"app": "gateway"}), frontend, HTTP),
        "the monitoring namespace": (Pod("monitoring", {}), frontend, HTTP),
        "the planner": (Pod("fleetpilot-system", {"app.kubernetes.io/component": "planner"}), frontend, HTTP),
        "another pod of the planner's namespace": (Pod("fleetpilot-system", {"app": "x"}), frontend, HTTP),
    })
    assert verdicts == {
        "the gateway": True,
        "another pod of the gateway's namespace": False,
        "a gateway-labelled pod elsewhere": False,
        "a pod of the graph's own namespace": False,
        "the monitoring namespace": True,
        "the planner": True,
        "another pod of the planner's namespace": False,
    }


def test_the_engine_admits_a_groups_ranks_to_the_rendezvous_and_no_one_else() -> None:
    graph = graph_of(DISAGG, components={"aggregated": {"nodes": 2, "gpus": 1, "parallelism": {"tensor": 2}}})
    leader = Pod(NAMESPACE, pod_labels(graph, "aggregated"))
    generation = render.generation_of(graph, SETTINGS)
    leader_pod = {"metadata": {"name": f"llama-aggregated-{generation}-0", "uid": "u",
                               "labels": {contract.LABEL_GENERATION: generation}}}
    workers = render.group_workers(graph, "aggregated", leader=leader_pod, generation=generation, settings=SETTINGS)
    rank = Pod(NAMESPACE, workers["spec"]["template"]["metadata"]["labels"])
    verdicts = netpol.allowed(checker(), policies(graph), NAMESPACES, {
        "rank 1 -> leader, rendezvous": (rank, leader, render.GROUP_PORT),
        "rank 1 -> leader, another port": (rank, leader, 5600),
        "another namespace -> leader, rendezvous": (Pod("other", dict(rank.labels)), leader, render.GROUP_PORT),
        "a neighbour -> leader, rendezvous": (Pod(NAMESPACE, {"app": "x"}), leader, render.GROUP_PORT),
    })
    assert verdicts == {"rank 1 -> leader, rendezvous": True, "rank 1 -> leader, another port": False,
                        "another namespace -> leader, rendezvous": False, "a neighbour -> leader, rendezvous": False}


def test_without_policies_the_engine_admits_everything() -> None:
    """The engine's baseline, and `policy: none`: no policy selects a pod, so every connection is allowed."""
    graph = graph_of(DISAGG, network={"policy": "none"})
    decode = Pod(NAMESPACE, pod_labels(graph, "decode"))
    assert netpol.allowed(checker(), policies(graph), NAMESPACES, {
        "intruder": (Pod("other", {}), decode, HTTP), "any port": (Pod("other", {}), decode, 1234)}) == {
        "intruder": True, "any port": True}
