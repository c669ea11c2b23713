"""The operator against a real apiserver, controller-manager and scheduler with simulated GPU nodes.

Each test applies DynamoGraphs the way a user does (kubectl) and checks what Kubernetes itself
then holds: children and their owner references, pods bound to GPU nodes, status conditions,
garbage collection, and what survives an operator crash.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import pytest

from fleetpilot.api import v1alpha1 as api

from .conftest import Kubectl, OperatorProcess, condition, load_sample, wait_for

pytestmark = pytest.mark.integration

SAMPLES = {
    "simulator.yaml": ["frontend", "prefill", "decode"],
    "disaggregated-vllm.yaml": ["frontend", "prefill", "decode"],
    "aggregated-sglang.yaml": ["frontend", "aggregated"],
    "disaggregated-trtllm.yaml": ["frontend", "prefill", "decode"],
}
WORKLOAD_KINDS = ["deployment", "service", "poddisruptionbudget"]


def graph(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = kubectl.json("get", "dynamograph", name, "-n", namespace)
    return result


def ready(kubectl: Kubectl, namespace: str, name: str) -> bool:
    current = graph(kubectl, namespace, name)
    return (
        condition(current, "Ready").get("status") == "True"
        and current["status"].get("observedGeneration") == current["metadata"]["generation"]
    )


def simulator_graph(name: str, **components: Any) -> dict[str, Any]:
    return {
        "apiVersion": "fleetpilot.dev/v1alpha1",
        "kind": "DynamoGraph",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama-8b"},
            "engine": {"framework": "simulator"},
            "components": components or {"prefill": {"replicas": 1}, "decode": {"replicas": 2}},
        },
    }


def owner_uids(obj: dict[str, Any]) -> list[str]:
    return [ref["uid"] for ref in obj["metadata"].get("ownerReferences", []) if ref.get("controller")]


def workload_name(kubectl: Kubectl, namespace: str, kind: str, graph_name: str, component: str) -> str:
    """The one `kind` (deployment, poddisruptionbudget) of a component: a worker's is named for its
    generation, `<graph>-<component>-<generation>`."""
    (found,) = kubectl.items(kind, namespace, f"fleetpilot.dev/graph={graph_name},fleetpilot.dev/component={component}")
    name: str = found["metadata"]["name"]
    return name


def test_samples_create_owned_children_on_gpu_nodes(kubectl: Kubectl, operator: OperatorProcess, namespace: str) -> None:
    for sample in SAMPLES:
        kubectl.apply(load_sample(sample), namespace)
    for sample, components in SAMPLES.items():
        name = load_sample(sample)["metadata"]["name"]
        wait_for(lambda name=name: ready(kubectl, namespace, name), what=f"{name} Ready")
        owner = graph(kubectl, namespace, name)
        for component in components:
            dgc = kubectl.json("get", "dgc", f"{name}-{component}", "-n", namespace)
            assert owner_uids(dgc) == [owner["metadata"]["uid"]]
            for kind in WORKLOAD_KINDS:
                child_name = f"{name}-{component}"
                if kind != "service" and component != "frontend":
                    child_name = workload_name(kubectl, namespace, kind, name, component)
                    generation = graph(kubectl, namespace, name)["status"]["rollout"]["target"]
                    assert child_name == f"{name}-{component}-{generation}"
                child = kubectl.json("get", kind, child_name, "-n", namespace)
                assert owner_uids(child) == [dgc["metadata"]["uid"]], f"{kind} {child_name}"
        assert owner["status"]["endpoint"] == f"http://{name}-frontend.{namespace}.svc:8000/v1"

    pods = kubectl.items("pods", namespace)
    assert pods and all(p["status"]["phase"] == "Running" for p in pods)
    assert all(p["spec"]["nodeName"].startswith("gpu-node-") for p in pods)
    assert all(p["status"]["podIP"].startswith("127.") for p in pods)
    gpu_pods = [p for p in pods if p["metadata"]["labels"]["fleetpilot.dev/component"] != "frontend"]
    assert all(int(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) >= 1 for p in gpu_pods)

    table = kubectl.run("get", "dg", "-n", namespace).stdout
    assert re.search(r"llama-8b-sim\s+True\s+1/1\s+2/2\s+2/2", table), table
    # Children are created in dependency order: no pod was refused for a ServiceAccount (or a ConfigMap)
    # that did not exist yet.
    refused = [e["message"] for e in kubectl.items("events", namespace) if e["reason"] == "FailedCreate"]
    assert not refused, refused


def test_graph_needing_more_gpus_than_exist_reports_unschedulable(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    kubectl.apply(simulator_graph("too-big", aggregated={"replicas": 5, "gpus": 8, "parallelism": {"tensor": 8}}),
                  namespace)

    def degraded() -> dict[str, Any]:
        found = condition(graph(kubectl, namespace, "too-big"), "Degraded")
        return found if found.get("reason") == "Unschedulable" else {}

    message = wait_for(degraded, what="Degraded=Unschedulable")["message"]
    match = re.match(r"Unschedulable: needs (\d+) nvidia.com/gpu, (\d+) free", message)
    assert match, message
    needed, free = int(match[1]), int(match[2])
    assert needed % 8 == 0 and needed >= 8 and free < 8
    assert condition(graph(kubectl, namespace, "too-big"), "Ready")["status"] == "False"
    events = kubectl.items("events", namespace)
    assert any(e["reason"] == "Unschedulable" and e["involvedObject"]["name"] == "too-big" for e in events)

    # Fewer replicas fit: the condition clears by itself.
    kubectl.run("scale", "dgc/too-big-aggregated", "--replicas=1", "-n", namespace)
    wait_for(lambda: ready(kubectl, namespace, "too-big"), what="Ready after scaling down")
    assert condition(graph(kubectl, namespace, "too-big"), "Degraded")["status"] == "False"


def test_kubectl_scale_dgc_changes_pods_and_respects_bounds(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    kubectl.apply(simulator_graph("scaled"), namespace)
    wait_for(lambda: ready(kubectl, namespace, "scaled"), what="Ready")

    kubectl.run("scale", "dgc/scaled-decode", "--replicas=4", "-n", namespace)
    wait_for(lambda: len(kubectl.items("pods", namespace, "fleetpilot.dev/component=decode")) == 4, what="4 decode pods")
    wait_for(lambda: graph(kubectl, namespace, "scaled")["status"]["components"]["decode"]["summary"] == "4/4",
             what="status decode 4/4")
    # The user's graph is untouched: its replicas stay the initial value.
    assert graph(kubectl, namespace, "scaled")["spec"]["components"]["decode"]["replicas"] == 2

    refused = kubectl.run("scale", "dgc/scaled-decode", "--replicas=9", "-n", namespace, check=False)
    assert refused.returncode != 0
    assert "replicas must lie within minReplicas and maxReplicas" in refused.stderr
    # The frontend's component is bounded too: by the most replicas a graph's frontend may have.
    too_many = kubectl.run("scale", "dgc/scaled-frontend", f"--replicas={api.FRONTEND_MAX_REPLICAS + 1}",
                           "-n", namespace, check=False)
    assert too_many.returncode != 0 and "replicas must lie within" in too_many.stderr, too_many.stderr
    assert len(kubectl.items("pods", namespace, "fleetpilot.dev/component=frontend")) == 1


def test_scale_subresource_reports_selector_and_replicas(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    kubectl.apply(simulator_graph("hpa-ready"), namespace)
    wait_for(lambda: ready(kubectl, namespace, "hpa-ready"), what="Ready")
    path = f"/apis/fleetpilot.dev/v1alpha1/namespaces/{namespace}/dynamographcomponents/hpa-ready-decode/scale"
    scale = json.loads(kubectl.run("get", "--raw", path).stdout)
    assert scale["spec"]["replicas"] == 2
    assert scale["status"]["replicas"] == 2
    assert scale["status"]["selector"] == "fleetpilot.dev/component=decode,fleetpilot.dev/graph=hpa-ready"


def test_editing_engine_image_rolls_out_a_new_generation(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    sample = load_sample("disaggregated-vllm.yaml")
    kubectl.apply(sample, namespace)
    wait_for(lambda: ready(kubectl, namespace, "llama-8b"), what="Ready")
    old = graph(kubectl, namespace, "llama-8b")["status"]["rollout"]["target"]
    before = {p["metadata"]["name"] for p in kubectl.items("pods", namespace, "fleetpilot.dev/component=decode")}

    sample["spec"]["engine"]["image"] = "vllm/vllm-openai:v0.11.1"
    kubectl.apply(sample, namespace)
    new = wait_for(lambda: (t := graph(kubectl, namespace, "llama-8b")["status"]["rollout"]["target"]) != old and t,
                   what="a new target generation")

    def rolled() -> bool:
        pods = kubectl.items("pods", namespace, "fleetpilot.dev/graph=llama-8b")
        workers = [p for p in pods if p["metadata"]["labels"]["fleetpilot.dev/component"] != "frontend"]
        images = {p["spec"]["containers"][0]["image"] for p in workers}
        generations = {p["metadata"]["labels"]["fleetpilot.dev/generation"] for p in workers}
        return (images == {"vllm/vllm-openai:v0.11.1"} and generations == {new}
                and graph(kubectl, namespace, "llama-8b")["status"]["rollout"]["phase"] == "Complete"
                and ready(kubectl, namespace, "llama-8b"))

    wait_for(rolled, timeout=90, what="prefill and decode pods on the new generation, the old one gone")
    after = {p["metadata"]["name"] for p in kubectl.items("pods", namespace, "fleetpilot.dev/component=decode")}
    assert not before & after, "every decode pod should have been replaced"
    for component in ("prefill", "decode"):  # the old generation's Deployment and PDB went with its pods
        assert workload_name(kubectl, namespace, "deployment", "llama-8b", component) == f"llama-8b-{component}-{new}"
        assert workload_name(kubectl, namespace, "pdb", "llama-8b", component) == f"llama-8b-{component}-{new}"
    # Both pools moved, though only the image changed: a KV cache never crosses generations.
    assert graph(kubectl, namespace, "llama-8b")["status"]["observedGeneration"] == 2


def test_deleting_the_graph_garbage_collects_every_child(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    kubectl.apply(load_sample("disaggregated-trtllm.yaml"), namespace)
    wait_for(lambda: ready(kubectl, namespace, "llama-70b"), what="Ready")
    kinds = ["dgc", "deployment", "service", "pdb", "configmap", "serviceaccount", "role", "rolebinding", "pods"]
    selector = "fleetpilot.dev/graph=llama-70b"
    assert all(kubectl.items(kind, namespace, selector) for kind in kinds)

    kubectl.run("delete", "dg", "llama-70b", "-n", namespace, "--wait=false")
    wait_for(lambda: not any(kubectl.items(kind, namespace, selector) for kind in kinds), timeout=90,
             what="garbage collection of every child")


def test_removing_a_component_prunes_it_and_nothing_else(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    kubectl.apply(simulator_graph("switch", aggregated={"replicas": 1}), namespace)
    wait_for(lambda: ready(kubectl, namespace, "switch"), what="Ready")
    # Something of the user's that merely carries our labels must survive.
    kubectl.apply({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "switch-notes", "labels": {"fleetpilot.dev/graph": "switch",
                                                        "app.kubernetes.io/managed-by": "fleetpilot-operator"}},
        "data": {"owner": "a human"},
    }, namespace)

    kubectl.apply(simulator_graph("switch", prefill={"replicas": 1}, decode={"replicas": 1}), namespace)
    wait_for(lambda: ready(kubectl, namespace, "switch"), what="Ready as disaggregated")
    wait_for(lambda: not kubectl.items("deployment", namespace, "fleetpilot.dev/component=aggregated"),
             what="aggregated deployment pruned")
    names = {d["metadata"]["name"] for d in kubectl.items("dgc", namespace)}
    assert names == {"switch-frontend", "switch-prefill", "switch-decode"}
    assert kubectl.json("get", "configmap", "switch-notes", "-n", namespace)["data"] == {"owner": "a human"}


def test_name_conflict_with_a_foreign_object_is_reported_not_taken_over(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    kubectl.apply({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "clash-frontend"},
        "spec": {"ports": [{"port": 80}], "selector": {"app": "mine"}},
    }, namespace)
    kubectl.apply(simulator_graph("clash"), namespace)

    def conflict() -> dict[str, Any]:
        found = condition(graph(kubectl, namespace, "clash"), "Degraded")
        return found if found.get("reason") == "NameConflict" else {}

    assert "Service clash-frontend exists and is not owned by this graph" in wait_for(conflict, what="NameConflict")["message"]
    service = kubectl.json("get", "service", "clash-frontend", "-n", namespace)
    assert not service["metadata"].get("ownerReferences")
    assert service["spec"]["selector"] == {"app": "mine"}

    kubectl.run("delete", "service", "clash-frontend", "-n", namespace)
    wait_for(lambda: ready(kubectl, namespace, "clash"), what="Ready once the name is free")


def test_tightened_bounds_resize_the_component_and_the_graph_converges(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    """Bounds are the graph's: a scaling.max tightened in git below what the component runs resizes the
    component (an Event says so) and the graph comes back Ready and not Degraded with no hand step."""
    manifest = simulator_graph("bounded", prefill={"replicas": 1}, decode={"replicas": 3})
    kubectl.apply(manifest, namespace)
    wait_for(lambda: ready(kubectl, namespace, "bounded"), what="Ready")

    manifest["spec"]["components"]["decode"] = {"replicas": 2, "scaling": {"min": 1, "max": 2}}
    kubectl.apply(manifest, namespace)
    decode = workload_name(kubectl, namespace, "deployment", "bounded", "decode")
    wait_for(lambda: kubectl.json("get", "dgc", "bounded-decode", "-n", namespace)["spec"]["replicas"] == 2,
             what="the decode component set to its new max")
    wait_for(lambda: kubectl.json("get", "deployment", decode, "-n", namespace)["spec"]["replicas"] == 2,
             what="decode running 2")

    def converged() -> bool:
        g = graph(kubectl, namespace, "bounded")
        return condition(g, "Degraded").get("status") == "False" and condition(g, "Ready").get("status") == "True"

    wait_for(converged, what=lambda: f"Ready and not Degraded: {graph(kubectl, namespace, 'bounded')['status']}")
    events = kubectl.json("get", "events", "-n", namespace, "--field-selector", "reason=ReplicasClamped")["items"]
    assert [e["involvedObject"]["name"] for e in events] == ["bounded-decode"], events
    assert "decode: 3 replicas lie outside the graph's bounds (scaling.min 1, scaling.max 2): set to 2" in \
        events[0]["message"]


def test_restarting_the_operator_midway_leaves_exactly_one_of_each_child(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    names = [f"crash-{i}" for i in range(4)]
    for name in names:
        kubectl.apply(simulator_graph(name), namespace)
    wait_for(lambda: kubectl.items("dgc", namespace), interval=0.05, what="the first child")
    operator.kill()
    operator.start()
    for name in names:
        wait_for(lambda name=name: ready(kubectl, namespace, name), timeout=90, what=f"{name} Ready after restart")

    for name in names:
        selector = f"fleetpilot.dev/graph={name}"
        for kind, expected in [("dgc", 3), ("deployment", 3), ("service", 3), ("pdb", 3), ("replicaset", 3),
                               ("serviceaccount", 1), ("role", 1), ("rolebinding", 1)]:
            found = kubectl.items(kind, namespace, selector)
            assert len(found) == expected, f"{kind} of {name}: {[f['metadata']['name'] for f in found]}"
        assert len(kubectl.items("pods", namespace, selector)) == 4  # 1 frontend + 1 prefill + 2 decode
    assert operator.alive()


def test_every_child_deleted_by_hand_comes_back_at_once(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    """Deletions reach the operator through its watches, not at the next resync (20 s in these tests)."""
    sample = load_sample("disaggregated-trtllm.yaml")  # the one sample with a ConfigMap child
    name = sample["metadata"]["name"]
    kubectl.apply(sample, namespace)
    wait_for(lambda: ready(kubectl, namespace, name), timeout=90, what="Ready")
    children = {"dgc": f"{name}-decode", "deployment": workload_name(kubectl, namespace, "deployment", name, "prefill"),
                "service": f"{name}-frontend", "pdb": workload_name(kubectl, namespace, "pdb", name, "decode"),
                "serviceaccount": f"{name}-frontend", "role": f"{name}-frontend",
                "rolebinding": f"{name}-frontend", "configmap": f"{name}-decode-trtllm"}
    took = {}
    for kind, child in children.items():
        before = kubectl.json("get", kind, child, "-n", namespace)["metadata"]["uid"]
        kubectl.run("delete", kind, child, "-n", namespace, "--wait=false")
        started = time.monotonic()

        def recreated(kind: str = kind, child: str = child, before: str = before) -> bool:
            found = kubectl.run("get", kind, child, "-n", namespace, "-o", "json", check=False)
            return found.returncode == 0 and json.loads(found.stdout)["metadata"]["uid"] != before

        wait_for(recreated, timeout=60, interval=0.05, what=f"{kind}/{child} recreated")
        took[kind] = time.monotonic() - started
    print("recreated after deletion by hand (s):", {k: round(v, 2) for k, v in took.items()})
    slow = {kind: seconds for kind, seconds in took.items() if seconds >= 10}  # half the resync
    assert not slow, f"came back only by resync, not through a watch: {slow}"
    wait_for(lambda: ready(kubectl, namespace, name), timeout=90, what="Ready again")


def test_a_child_relabelled_by_hand_is_restored_through_its_watch(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    """The operator's watches select its children by label on the API server, so a child whose label is
    removed leaves the watch (a DELETED event) and its graph's next pass applies the label back: through
    the watch, not at the next resync (20 s in these tests)."""
    kubectl.apply(simulator_graph("relabel"), namespace)
    wait_for(lambda: ready(kubectl, namespace, "relabel"), timeout=90, what="Ready")
    children = {"deployment": workload_name(kubectl, namespace, "deployment", "relabel", "decode"),
                "service": "relabel-frontend", "serviceaccount": "relabel-frontend", "role": "relabel-frontend"}
    took = {}
    for kind, child in children.items():
        kubectl.run("label", kind, child, "-n", namespace, "app.kubernetes.io/managed-by-")
        started = time.monotonic()

        def relabelled(kind: str = kind, child: str = child) -> bool:
            labels = kubectl.json("get", kind, child, "-n", namespace)["metadata"].get("labels", {})
            return labels.get("app.kubernetes.io/managed-by") == "fleetpilot-operator"

        wait_for(relabelled, timeout=60, interval=0.05, what=f"{kind}/{child} labelled again")
        took[kind] = time.monotonic() - started
    print("label restored after removal by hand (s):", {k: round(v, 2) for k, v in took.items()})
    slow = {kind: seconds for kind, seconds in took.items() if seconds >= 10}  # half the resync
    assert not slow, f"restored only by resync, not through a watch: {slow}"

    # Back in the watch: a hand edit of the relabelled Deployment is reverted as any other's.
    kubectl.run("scale", "deployment", children["deployment"], "-n", namespace, "--replicas=5")
    wait_for(lambda: kubectl.json("get", "deployment", children["deployment"], "-n", namespace)["spec"]["replicas"] == 2,
             timeout=60, interval=0.05, what="the hand edit reverted")


def test_operator_exports_its_metrics(kubectl: Kubectl, operator: OperatorProcess, namespace: str) -> None:
    kubectl.apply(simulator_graph("observed"), namespace)
    wait_for(lambda: ready(kubectl, namespace, "observed"), what="Ready")

    def scrape() -> str:
        return httpx.get(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).text

    text = wait_for(lambda: 'graph="observed"' in scrape() and scrape(), what="graph series")
    ok = re.search(r'^fleetpilot_operator_reconciles_total\{result="ok"\} (\S+)$', text, re.MULTILINE)
    assert ok and float(ok[1]) >= 1
    assert re.search(rf'fleetpilot_operator_graph_condition\{{graph="observed",namespace="{namespace}",'
                     r'status="True",type="Ready"\} 1\.0', text), text[-2000:]
    assert 'fleetpilot_operator_applies_total{kind="Deployment"}' in text


def test_frontend_discovers_the_graphs_ready_pods(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pod discovery against the real apiserver: Ready pods with loopback IPs, by role, kept current."""
    import asyncio

    from fleetpilot import kube
    from fleetpilot.frontend.discovery import PodDiscovery

    kubectl.apply(simulator_graph("found"), namespace)
    wait_for(lambda: ready(kubectl, namespace, "found"), what="Ready")
    monkeypatch.setenv("KUBECONFIG", str(kubectl.kubeconfig))

    def pod_urls(role: str) -> set[str]:
        return {f"http://{p['status']['podIP']}:8000"
                for p in kubectl.items("pods", namespace, f"fleetpilot.dev/component={role}")
                if not p["metadata"].get("deletionTimestamp")}

    async def discover() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
        api = kube.KubeApi()
        discovery = PodDiscovery(api, namespace=namespace, graph="found")
        await discovery.start()
        try:
            await asyncio.wait_for(discovery.synced.wait(), 30)
            first = {role: {w.url for w in discovery.workers(role)} for role in ("prefill", "decode")}
            kubectl.run("scale", "dgc/found-decode", "--replicas=3", "-n", namespace)
            for _ in range(200):  # the watch brings the new pod in: bounded wait
                if len(discovery.workers("decode")) == 3:
                    break
                await asyncio.sleep(0.1)
            second = {role: {w.url for w in discovery.workers(role)} for role in ("prefill", "decode")}
            return first, second
        finally:
            await discovery.stop()
            await api.aclose()

    first, second = asyncio.run(discover())
    assert first["prefill"] == pod_urls("prefill") and len(first["prefill"]) == 1
    assert len(first["decode"]) == 2 and first["decode"] < pod_urls("decode")
    assert all(url.startswith("http://127.") for url in first["decode"])
    assert second["decode"] == pod_urls("decode") and len(second["decode"]) == 3
