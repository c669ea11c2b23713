"""Render a DynamoGraph into the Kubernetes objects that run it.

The first step of every reconcile, and pure: a parsed graph plus each component's replica count
(read from its DynamoGraphComponent) in, plain manifests out. Nothing here talks to the API, so
golden tests pin the output and the reconciler only has to apply it.

Ownership chain: DynamoGraph → DynamoGraphComponent (one per component) → the component's
Deployment, Service, PodDisruptionBudget and helpers. Deleting a component from the graph deletes
its DynamoGraphComponent and Kubernetes' garbage collector takes the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api

HTTP_PORT = 8000
NIXL_SIDE_CHANNEL_PORT = 5600
SGLANG_BOOTSTRAP_PORT = 8998
TRTLLM_CONFIG_DIR = "/etc/fleetpilot/trtllm"

Manifest = dict[str, Any]


@dataclass(frozen=True)
class RenderSettings:
    """Operator-wide choices that are not part of any graph."""

    fleetpilot_image: str = "fleetpilot/fleetpilot:0.1.0"
    frontend_requests: tuple[tuple[str, str], ...] = (("cpu", "250m"), ("memory", "256Mi"))


@dataclass(frozen=True)
class OwnerRef:
    """Enough of an object to point an ownerReference at it."""

    api_version: str
    kind: str
    name: str
    uid: str

    def as_manifest(self) -> Manifest:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def selector_labels(graph: str, component: str) -> dict[str, str]:
    """The immutable Deployment selector: graph and component only."""
    return {contract.LABEL_GRAPH: graph, contract.LABEL_COMPONENT: component}


def component_labels(graph: api.DynamoGraph, component: str) -> dict[str, str]:
    return {
        contract.LABEL_NAME: "fleetpilot-frontend" if component == "frontend" else f"fleetpilot-{graph.spec.engine.framework}",
        contract.LABEL_INSTANCE: graph.metadata.name,
        contract.LABEL_APP_COMPONENT: component,
        contract.LABEL_PART_OF: contract.PART_OF,
        contract.LABEL_MANAGED_BY: contract.MANAGED_BY,
        contract.LABEL_FRAMEWORK: graph.spec.engine.framework,
        **selector_labels(graph.metadata.name, component),
    }


def graph_owner(graph: api.DynamoGraph) -> OwnerRef:
    return OwnerRef(api.API_VERSION, api.GRAPH_KIND, graph.metadata.name, graph.metadata.uid)


def components_of(graph: api.DynamoGraph) -> list[api.ComponentName]:
    """Every component the graph asks for: the frontend, then its worker pools."""
    return ["frontend", *graph.spec.components.workers()]


def initial_replicas(graph: api.DynamoGraph, component: api.ComponentName) -> int:
    if component == "frontend":
        return graph.spec.components.frontend.replicas
    return graph.spec.components.workers()[component].replicas


# The frontend is what clients reach: a graph whose frontend is scaled to zero serves nothing while its
# workers hold GPUs, so its DynamoGraphComponent refuses fewer than one replica (and the operator runs one).
FRONTEND_MIN_REPLICAS = 1


def scaling_bounds(graph: api.DynamoGraph, component: api.ComponentName) -> tuple[int | None, int | None]:
    if component == "frontend":
        return FRONTEND_MIN_REPLICAS, None
    scaling = graph.spec.components.workers()[component].scaling
    return scaling.min_replicas, scaling.max_replicas


def effective_replicas(graph: api.DynamoGraph, component: api.ComponentName, requested: int) -> int:
    """What actually runs: the component's replicas, clamped to the graph's current bounds."""
    low, high = scaling_bounds(graph, component)
    if low is not None:
        requested = max(requested, low)
    if high is not None:
        requested = min(requested, high)
    return requested


# -- DynamoGraphComponent --------------------------------------------------------------------------

def component_object(graph: api.DynamoGraph, component: api.ComponentName, *, with_replicas: bool) -> Manifest:
    """The scaling child. `with_replicas` only on creation: afterwards others own spec.replicas."""
    low, high = scaling_bounds(graph, component)
    spec: Manifest = {"graph": graph.metadata.name, "component": component}
    if with_replicas:
        spec["replicas"] = initial_replicas(graph, component)
    if low is not None:
        spec["minReplicas"] = low
    if high is not None:
        spec["maxReplicas"] = high
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.COMPONENT_KIND,
        "metadata": {
            "name": contract.child_name(graph.metadata.name, component),
            "namespace": graph.metadata.namespace,
            "labels": component_labels(graph, component),
            "ownerReferences": [graph_owner(graph).as_manifest()],
        },
        "spec": spec,
    }


# -- engine commands -------------------------------------------------------------------------------

def served_model_name(graph: api.DynamoGraph) -> str:
    return graph.spec.model.served_name or graph.spec.model.name


def _role(component: str) -> str:
    return component if component in ("prefill", "decode") else "aggregated"


def engine_command(graph: api.DynamoGraph, component: api.WorkerName) -> tuple[list[str], list[str]]:
    """(command, args) for a worker, following each engine's own CLI and disaggregation flags."""
    spec = graph.spec
    worker = spec.components.workers()[component]
    tp, pp = worker.parallelism.tensor, worker.parallelism.pipeline
    model, served = spec.model.name, served_model_name(graph)
    role = _role(component)
    disaggregated = role != "aggregated"
    framework = spec.engine.framework
    extra = [*spec.engine.args, *worker.args]

    if framework == "vllm":
        args = ["serve", model, "--served-model-name", served, "--host", "0.0.0.0", "--port", str(HTTP_PORT),
                "--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp)]
        if disaggregated:
            # Both sides run NIXL; the frontend's two-hop protocol decides who prefills.
            args += ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})]
        return ["vllm"], args + extra
    if framework == "sglang":
        args = ["-m", "sglang.launch_server", "--model-path", model, "--served-model-name", served,
                "--host", "0.0.0.0", "--port", str(HTTP_PORT), "--tp-size", str(tp), "--pp-size", str(pp)]
        if disaggregated:
            args += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "nixl"]
            if role == "prefill":
                args += ["--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP_PORT)]
        return ["python3"], args + extra
    if framework == "trtllm":
        args = [model, "--host", "0.0.0.0", "--port", str(HTTP_PORT), "--backend", "pytorch",
                "--tp_size", str(tp), "--pp_size", str(pp)]
        if disaggregated:
            args += ["--extra_llm_api_options", f"{TRTLLM_CONFIG_DIR}/extra-llm-api-options.yaml"]
        return ["trtllm-serve"], args + extra
    # The simulator: fleetpilot's own GPU-free engine, timed by the performance model.
    args = ["sim", "worker", "--role", role, "--model", served, "--host", "0.0.0.0", "--port", str(HTTP_PORT),
            "--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp)]
    return ["fleetpilot"], args + extra


def trtllm_extra_options(role: str) -> str:
    """TensorRT-LLM's disaggregated serving needs its KV-cache transceiver switched on."""
    lines = ["cache_transceiver_config:", "  backend: DEFAULT"]
    if role == "prefill":
        lines.append("disable_overlap_scheduler: true")  # context-only servers do not overlap
    return "\n".join(lines) + "\n"


def frontend_command(graph: api.DynamoGraph) -> tuple[list[str], list[str]]:
    mode = "aggregated" if graph.spec.components.aggregated is not None else "disaggregated"
    return ["fleetpilot"], [
        "frontend", "--model", served_model_name(graph), "--graph", graph.metadata.name,
        "--namespace", "$(POD_NAMESPACE)", "--mode", mode, "--engine", graph.spec.engine.framework,
        "--router", graph.spec.components.frontend.router.policy, "--host", "0.0.0.0", "--port", str(HTTP_PORT),
    ]


# -- workload ----------------------------------------------------------------------------------------

def _downward_env() -> list[Manifest]:
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]


def _resources(gpus: int, user: api.ResourceRequirements | None, defaults: dict[str, str]) -> Manifest:
    requests: dict[str, Any] = dict(defaults)
    limits: dict[str, Any] = {}
    if user is not None:
        requests.update(user.requests)
        limits.update(user.limits)
    if gpus:
        # Extended resources must be requested and limited alike.
        requests["nvidia.com/gpu"] = gpus
        limits["nvidia.com/gpu"] = gpus
    out: Manifest = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _probe(path: str, *, period: int, failures: int) -> Manifest:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "failureThreshold": failures,
            "timeoutSeconds": 3}


def pod_template(graph: api.DynamoGraph, component: api.ComponentName, settings: RenderSettings) -> Manifest:
    spec = graph.spec
    overrides = spec.pod_template
    name = contract.child_name(graph.metadata.name, component)
    env = _downward_env()
    volumes: list[Manifest] = []
    mounts: list[Manifest] = []
    ports = [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}]

    if component == "frontend":
        command, args = frontend_command(graph)
        image = settings.fleetpilot_image
        resources = _resources(0, spec.components.frontend.resources, dict(settings.frontend_requests))
        grace = 30
        # Ready only while a request has somewhere to go (/ready: a prefill and a decode worker, or an
        # aggregated one); alive while it serves HTTP at all (/health).
        probes = {"readinessProbe": _probe("/ready", period=5, failures=3),
                  "livenessProbe": _probe("/health", period=10, failures=6)}
    else:
        worker = spec.components.workers()[component]
        command, args = engine_command(graph, component)
        image = spec.engine.image or settings.fleetpilot_image
        resources = _resources(worker.gpus, worker.resources, {})
        env += [e.model_dump(by_alias=True, exclude_none=True) for e in spec.engine.env]
        grace = 120  # let in-flight generations finish before the engine exits
        # Loading weights takes minutes; the startup probe holds liveness off until /health answers.
        probes = {"startupProbe": _probe("/health", period=5, failures=720),
                  "readinessProbe": _probe("/health", period=5, failures=3),
                  "livenessProbe": _probe("/health", period=10, failures=6)}
        if spec.engine.framework != "simulator":
            volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})  # NCCL needs shared memory
            mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        if spec.engine.framework == "vllm" and component != "aggregated":
            env += [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "$(POD_IP)"},
                    {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)}]
            ports.append({"name": "nixl", "containerPort": NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"})
        if spec.engine.framework == "sglang" and component == "prefill":
            ports.append({"name": "bootstrap", "containerPort": SGLANG_BOOTSTRAP_PORT, "protocol": "TCP"})
        if spec.engine.framework == "trtllm" and component != "aggregated":
            volumes.append({"name": "trtllm-config", "configMap": {"name": f"{name}-trtllm"}})
            mounts.append({"name": "trtllm-config", "mountPath": TRTLLM_CONFIG_DIR, "readOnly": True})

    if component != "frontend":
        mounts += overrides.volume_mounts or []  # model caches and the like are the engine's
    volumes += overrides.volumes or []
    container: Manifest = {
        "name": "frontend" if component == "frontend" else "engine",
        "image": image,
        "command": command,
        "args": args,
        "env": env,
        "ports": ports,
        "resources": resources,
        **probes,
    }
    if mounts:
        container["volumeMounts"] = mounts

    pod_spec: Manifest = {
        "containers": [container],
        "terminationGracePeriodSeconds": grace,
        "enableServiceLinks": False,
    }
    if overrides.node_selector:
        pod_spec["nodeSelector"] = dict(overrides.node_selector)
    if overrides.tolerations:
        pod_spec["tolerations"] = overrides.tolerations
    if overrides.affinity:
        pod_spec["affinity"] = overrides.affinity
    if overrides.priority_class_name:
        pod_spec["priorityClassName"] = overrides.priority_class_name
    if overrides.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in overrides.image_pull_secrets]
    if volumes:
        pod_spec["volumes"] = volumes
    if overrides.service_account_name:
        pod_spec["serviceAccountName"] = overrides.service_account_name
    elif component == "frontend":
        pod_spec["serviceAccountName"] = name  # may watch Pods to discover workers

    # The user's labels come first so they can never replace the selector.
    labels = {**overrides.labels, **component_labels(graph, component)}
    metadata: Manifest = {"labels": labels}
    if overrides.annotations:
        metadata["annotations"] = dict(overrides.annotations)
    return {"metadata": metadata, "spec": pod_spec}


def _meta(graph: api.DynamoGraph, component: str, owner: OwnerRef, name: str | None = None) -> Manifest:
    return {
        "name": name or contract.child_name(graph.metadata.name, component),
        "namespace": graph.metadata.namespace,
        "labels": component_labels(graph, component),
        "ownerReferences": [owner.as_manifest()],
    }


def workload(
    graph: api.DynamoGraph,
    component: api.ComponentName,
    *,
    replicas: int,
    owner: OwnerRef,
    settings: RenderSettings,
) -> list[Manifest]:
    """Everything one component runs on: Deployment, Service, PDB and per-engine helpers."""
    name = contract.child_name(graph.metadata.name, component)
    selector = selector_labels(graph.metadata.name, component)
    objects: list[Manifest] = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(graph, component, owner),
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": selector},
                # Never drop below the requested capacity during a rollout; a surge pod that finds no
                # free GPU stays Pending and the graph's status says so.
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                "revisionHistoryLimit": 5,
                "template": pod_template(graph, component, settings),
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(graph, component, owner),
            "spec": {
                "selector": selector,
                "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
                # Workers are addressed one by one by the frontend; only the frontend load-balances.
                **({} if component == "frontend" else {"clusterIP": "None"}),
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta(graph, component, owner),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
        },
    ]
    framework = graph.spec.engine.framework
    if component == "frontend" and not graph.spec.pod_template.service_account_name:
        objects += frontend_rbac(graph, owner)
    if framework == "trtllm" and component in ("prefill", "decode"):
        objects.append({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(graph, component, owner, name=f"{name}-trtllm"),
            "data": {"extra-llm-api-options.yaml": trtllm_extra_options(component)},
        })
    return objects


def frontend_rbac(graph: api.DynamoGraph, owner: OwnerRef) -> list[Manifest]:
    """The frontend discovers workers by watching Pods of its graph: read-only, one namespace."""
    name = contract.child_name(graph.metadata.name, "frontend")
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(graph, "frontend", owner)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(graph, "frontend", owner),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(graph, "frontend", owner),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": graph.metadata.namespace}],
        },
    ]


def endpoint(graph: api.DynamoGraph) -> str:
    return f"http://{contract.child_name(graph.metadata.name, 'frontend')}.{graph.metadata.namespace}.svc:{HTTP_PORT}/v1"
