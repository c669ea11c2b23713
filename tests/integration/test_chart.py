"""The Helm chart and the kustomize manifests against the real apiserver.

Everything the chart and kustomize render is applied with `--dry-run=server` (admission, schema and
RBAC validation included) into a namespace that enforces Pod Security `restricted`, and the pods of
their Deployments must be admitted there. Then the chart's RBAC is used for real: the `operator`
fixture runs the operator with a token of the chart's operator ServiceAccount (conftest.py), and the
planner's ServiceAccount drives the live planner against a graph: it may scale components and write
a graph's status, and is refused when it tries to change a graph's spec.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from fleetpilot import kube
from fleetpilot.api import contract
from fleetpilot.planner import core, observe
from fleetpilot.planner import live as planner_live

from .conftest import (
    CHART_NAMESPACE,
    REPO,
    ChartIdentities,
    Kubectl,
    OperatorProcess,
    condition,
    load_sample,
    render_chart,
    wait_for,
)

pytestmark = pytest.mark.integration

MONITORING = "monitoring.coreos.com/v1"
MONITORING_KINDS = {"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors", "PrometheusRule": "prometheusrules"}


@pytest.fixture(scope="module")
def monitoring_crds(kubectl: Kubectl) -> Iterator[None]:
    """Schema-less stand-ins for the Prometheus Operator's CRDs, so its objects can be dry-run applied."""
    names = []
    for kind, plural in MONITORING_KINDS.items():
        names.append(f"{plural}.monitoring.coreos.com")
        kubectl.apply({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": names[-1]},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
        })
    kubectl.run("wait", "--for", "condition=Established", "--timeout=60s", *(f"crd/{n}" for n in names))
    yield
    kubectl.run("delete", "crd", *names, "--wait=false")


@pytest.fixture
def restricted_namespace(kubectl: Kubectl, namespace: str) -> str:
    kubectl.run("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted",
                "pod-security.kubernetes.io/warn=restricted")
    return namespace


def _in_namespace(docs: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """kustomize's objects moved from fleetpilot-system into the test's namespace (the Namespace itself dropped)."""
    moved = []
    for doc in docs:
        if doc["kind"] == "Namespace":
            continue
        if doc["metadata"].get("namespace") == CHART_NAMESPACE:
            doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
        moved.append(doc)
    return moved


def _dry_run_in_restricted_namespace(kubectl: Kubectl, docs: list[dict[str, Any]], namespace: str) -> None:
    # Cluster-scoped names are made unique so the dry run never meets the fixtures' real objects.
    for doc in docs:
        if "namespace" not in doc["metadata"] and doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            doc["metadata"]["name"] = f"{namespace}-{doc['metadata']['name']}"
            if doc["kind"] == "ClusterRoleBinding":
                doc["roleRef"]["name"] = f"{namespace}-{doc['roleRef']['name']}"
    result = kubectl.run("apply", "--server-side", "--force-conflicts", "--dry-run=server",
                         "--field-manager=chart-test", "-f", "-", stdin=yaml.safe_dump_all(docs), check=False)
    assert result.returncode == 0, result.stderr
    assert "PodSecurity" not in result.stderr, result.stderr  # warn=restricted would say "would violate"
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert len(deployments) == 2
    # The pods name their ServiceAccounts, which admission looks up: those are created for real.
    kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump_all([d for d in docs if d["kind"] == "ServiceAccount"]))
    for deployment in deployments:  # Pod Security is enforced on pods: admit each Deployment's pod
        template = deployment["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
               "metadata": {"name": deployment["metadata"]["name"], "namespace": namespace,
                            "labels": template["metadata"]["labels"]}}
        result = kubectl.run("create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod), check=False)
        assert result.returncode == 0, result.stderr


def test_chart_and_kustomize_pass_pod_security_restricted(
    kubectl: Kubectl, crds: None, monitoring_crds: None, restricted_namespace: str
) -> None:
    namespace = restricted_namespace
    # The namespace does enforce: a pod that may run as root is refused.
    loose = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "loose", "namespace": namespace},
             "spec": {"containers": [{"name": "c", "image": "fleetpilot/fleetpilot:0.1.0"}]}}
    refused = kubectl.run("create", "--dry-run=server", "-f", "-", stdin=json.dumps(loose), check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr

    chart = render_chart("--include-crds", "--api-versions", MONITORING, namespace=namespace)
    assert {d["kind"] for d in chart} >= {"CustomResourceDefinition", "PrometheusRule", "PodMonitor", "ServiceMonitor"}
    _dry_run_in_restricted_namespace(kubectl, chart, namespace)

    for folder in ("base", "overlays/dev", "overlays/production"):
        out = kubectl.run("kustomize", str(REPO / "manifests" / folder)).stdout
        docs = _in_namespace([d for d in yaml.safe_load_all(out) if d], namespace)
        _dry_run_in_restricted_namespace(kubectl, docs, namespace)


def test_operator_reconciles_with_the_chart_service_account(
    kubectl: Kubectl, operator: OperatorProcess, chart_identities: ChartIdentities, namespace: str
) -> None:
    assert operator.kubeconfig == chart_identities.kubeconfigs["operator"]
    graph = load_sample("simulator.yaml")
    kubectl.apply(graph, namespace)
    name = graph["metadata"]["name"]
    wait_for(lambda: condition(kubectl.json("get", "dg", name, "-n", namespace), "Ready").get("status") == "True",
             timeout=120, what=lambda: f"{name} Ready; operator log:\n{operator.log()[-3000:]}")
    children = {(kind, item["metadata"]["name"]) for kind in ("dgc", "deployment", "service", "pdb", "serviceaccount",
                                                              "role", "rolebinding")
                for item in kubectl.items(kind, namespace, f"fleetpilot.dev/graph={name}")}
    generation = kubectl.json("get", "dg", name, "-n", namespace)["status"]["rollout"]["target"]
    for component in ("frontend", "prefill", "decode"):
        workload = f"{name}-{component}" if component == "frontend" else f"{name}-{component}-{generation}"
        assert {("dgc", f"{name}-{component}"), ("deployment", workload),
                ("service", f"{name}-{component}"), ("pdb", workload)} <= children
    # The frontend's Role and RoleBinding: the operator may grant only what it holds.
    assert {("serviceaccount", f"{name}-frontend"), ("role", f"{name}-frontend"),
            ("rolebinding", f"{name}-frontend")} <= children
    # No RBAC refusal in the whole session's log (other 403s, such as "namespace is being terminated",
    # are not about permissions), and no kopf warning about missing permissions.
    log = operator.log()
    assert "forbidden: User" not in log and "Not enough permissions" not in log, log[-3000:]

    user = chart_identities.user("operator")

    def can(*args: str) -> bool:
        result = kubectl.run("auth", "can-i", *args, "-n", namespace, "--as", user, check=False)
        return result.stdout.strip() == "yes"

    assert can("patch", "dynamographs", "--subresource=status")
    assert not can("patch", "dynamographs") and not can("delete", "dynamographs") and not can("update", "dynamographs")
    assert not can("get", "secrets") and not can("create", "pods")


class _Observer:
    """Prometheus stand-in for the live planner: a steady, heavy load with latencies over target."""

    url = "test://observer"

    def observe(self, *, namespace: str, graph: str, window_s: int, percentile: float) -> core.Observation:
        return core.Observation(time=time.time(), rate_rps=40.0, isl=2000.0, osl=300.0, ttft_s=2.0, itl_s=0.2)

    def history(self, *, namespace: str, graph: str, window_s: int, points: int) -> observe.History:
        return observe.History((), (), ())  # a cold start

    def gauges(self, *, namespace: str, graph: str) -> None:
        return None  # no engine gauges: the fast path does nothing


def test_planner_service_account_scales_components_but_never_edits_a_graph(
    kubectl: Kubectl, operator: OperatorProcess, chart_identities: ChartIdentities, namespace: str
) -> None:
    graph = load_sample("simulator.yaml")
    graph["spec"]["planner"]["mode"] = "sla"
    name = graph["metadata"]["name"]
    kubectl.apply(graph, namespace)
    wait_for(lambda: kubectl.json("get", "dgc", f"{name}-decode", "-n", namespace), timeout=60, what="decode dgc")
    user = chart_identities.user("planner")

    def can(*args: str) -> bool:
        result = kubectl.run("auth", "can-i", *args, "-n", namespace, "--as", user, check=False)
        return result.stdout.strip() == "yes"

    assert can("patch", "dynamographcomponents", "--subresource=scale")
    assert can("patch", "dynamographs", "--subresource=status")
    assert can("list", "dynamographs")
    for verb in ("patch", "update", "create", "delete"):
        assert not can(verb, "dynamographs"), verb
    assert not can("patch", "dynamographcomponents")  # the spec beyond replicas belongs to the operator
    assert not can("update", "dynamographcomponents", "--subresource=scale")  # planner only patches

    # Real requests with the planner's token, the very ones the planner sends (kubectl would GET first,
    # which the planner never does): a graph's spec is refused, a component's /scale is not.
    async def attempt() -> None:
        api = kube.KubeApi(kube.load_configuration(str(chart_identities.kubeconfigs["planner"])),
                           field_manager=contract.PLANNER)
        try:
            with pytest.raises(kube.ApiError) as refused:
                await api.patch("DynamoGraph", namespace, name, {"spec": {"components": {"decode": {"replicas": 3}}}})
            assert refused.value.status == 403, refused.value
            with pytest.raises(kube.ApiError) as refused:
                await api.apply({"apiVersion": "fleetpilot.dev/v1alpha1", "kind": "DynamoGraph",
                                 "metadata": {"name": name, "namespace": namespace},
                                 "spec": {"components": {"decode": {"replicas": 3}}}})
            assert refused.value.status == 403, refused.value
            scaled = await api.patch("DynamoGraphComponent", namespace, f"{name}-decode", {"spec": {"replicas": 3}},
                                     subresource="scale")
            assert scaled["spec"]["replicas"] == 3
        finally:
            await api.aclose()

    asyncio.run(attempt())
    assert kubectl.json("get", "dg", name, "-n", namespace)["spec"]["components"]["decode"]["replicas"] == 2
    assert kubectl.json("get", "dgc", f"{name}-decode", "-n", namespace)["spec"]["replicas"] == 3

    # And the live planner itself, as that ServiceAccount: list, read, scale, status, events.
    async def plan_once() -> None:
        api = kube.KubeApi(kube.load_configuration(str(chart_identities.kubeconfigs["planner"])),
                           field_manager=contract.PLANNER)
        try:
            live = planner_live.LivePlanner(api, _Observer(), namespaces=[namespace])  # type: ignore[arg-type]
            await live.tick()
        finally:
            await api.aclose()

    asyncio.run(plan_once())
    body = kubectl.json("get", "dg", name, "-n", namespace)
    active = condition(body, "PlannerActive")
    assert active.get("status") == "True", body.get("status")
    decided = body["status"]["planner"]["replicas"]
    for component in ("prefill", "decode"):
        assert kubectl.json("get", "dgc", f"{name}-{component}", "-n", namespace)["spec"]["replicas"] == decided[component]
    assert decided["prefill"] > 2 or decided["decode"] > 3  # the load needs more than the graph started with
    assert body["spec"]["components"]["decode"]["replicas"] == 2  # the graph in git never changes
    events = [e for e in kubectl.items("events", namespace) if e.get("source", {}).get("component") == "fleetpilot-planner"]
    assert events, "the planner recorded no Event"


def test_a_release_watching_some_namespaces_reaches_only_those(kubectl: Kubectl, crds: None, namespace: str) -> None:
    """watchNamespaces binds the ClusterRoles per namespace: elsewhere the ServiceAccounts are refused."""
    release = f"fp-{uuid.uuid4().hex[:6]}"
    docs = [d for d in render_chart("--set", f"watchNamespaces={{{namespace}}}", namespace=namespace, release=release)
            if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    kubectl.run("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(docs))
    cluster_scoped = [f"{d['kind'].lower()}/{d['metadata']['name']}" for d in docs if "namespace" not in d["metadata"]]
    try:
        for component in ("operator", "planner"):
            user = f"system:serviceaccount:{namespace}:{release}-fleetpilot-{component}"

            def can(verb: str, resource: str, where: str, user: str = user) -> bool:
                result = kubectl.run("auth", "can-i", verb, resource, "-n", where, "--as", user, check=False)
                return result.stdout.strip() == "yes"

            assert can("list", "dynamographs", namespace)
            assert not can("list", "dynamographs", "default")
            assert can("get", f"leases/fleetpilot-{component}", namespace)  # its own Lease, in its namespace only
            assert not can("get", f"leases/fleetpilot-{component}", "default")
        # Nodes (free GPUs) stay readable cluster-wide for the operator.
        result = kubectl.run("auth", "can-i", "list", "nodes", "--as",
                             f"system:serviceaccount:{namespace}:{release}-fleetpilot-operator", check=False)
        assert result.stdout.strip() == "yes"
    finally:
        kubectl.run("delete", *cluster_scoped, "--wait=false", check=False)
