"""Render a DynamoGraph into the Kubernetes objects that run it.

The first step of every reconcile, and pure: a parsed graph plus each component's replica count
(read from its DynamoGraphComponent) in, plain manifests out. Nothing here talks to the API, so
golden tests pin the output and the reconciler only has to apply it.

Ownership chain: DynamoGraph → DynamoGraphComponent (one per component) → the component's
Deployment, Service, PodDisruptionBudget, NetworkPolicy and helpers. Deleting a component from the graph deletes
its DynamoGraphComponent and Kubernetes' garbage collector takes the rest.

Worker components run in *generations* (`generation_of`, rollout.py): one Deployment and one
PodDisruptionBudget per component and generation, `<graph>-<component>-<generation>`, their pods
labelled with it, behind one Service per component. A change to what makes two workers' KV caches
compatible (engine, image, model, arguments) is a new generation, rolled out beside the old one; any
other change (resources, drain time, pod overrides) rolls the current generation's Deployment in
place. The frontend runs no generations: it is one Deployment, `<graph>-frontend`.

A worker component with `nodes > 1` runs *groups*: each replica is a leader pod (rank 0, which
serves) and `nodes − 1` worker pods (the other ranks), built from StatefulSets as LeaderWorkerSet
does: per generation a leader StatefulSet `<graph>-<component>-<generation>` whose replicas are the
groups (`leader_statefulset`), and per leader pod a worker StatefulSet named like it and owned by it
(`group_workers`), so a leader's workers go when it has gone, and a new leader gets new workers.
Every pod learns its rank, the group size and the leader's DNS name through its engine's own
multinode flags.

What differs between engines (their command lines and disaggregation and multinode flags, probes,
drain hook, side channels and config files) is each engine's module (engine.py's `Engine`
protocol; engines.py looks the graph's up by name); everything here is the same for every engine.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api
from fleetpilot.operator import engines
from fleetpilot.operator.engine import Engine, Group, Worker, http_probe

#: The port every pod serves HTTP on (the frontend's API, an engine's API, /health, /metrics).
HTTP_PORT = 8000
#: Where a multinode group's ranks meet the leader: vLLM's --master-port, SGLang's --dist-init-addr
#: port, the simulator's rendezvous.
GROUP_PORT = 29500
GROUP_SIZE_ENV = "FLEETPILOT_GROUP_SIZE"
NODE_RANK_ENV = "FLEETPILOT_NODE_RANK"
LEADER_ADDRESS_ENV = "FLEETPILOT_LEADER_ADDRESS"
#: The kubelet's grace period is the pod's drain time plus this: the engine drains for
#: `drainSeconds`, then has this long to exit before SIGKILL.
EXIT_MARGIN_SECONDS = 10
Manifest = dict[str, Any]


@dataclass(frozen=True)
class RenderSettings:
    """Operator-wide choices that are not part of any graph."""

    fleetpilot_image: str = "fleetpilot/fleetpilot:0.1.0"
    frontend_requests: tuple[tuple[str, str], ...] = (("cpu", "250m"), ("memory", "256Mi"))
    #: The namespace Prometheus scrapes from (the chart's `networkPolicy.monitoringNamespace`): every graph's
    #: NetworkPolicies admit it to the pods' HTTP port, which serves /metrics. Empty: no namespace is.
    monitoring_namespace: str = "monitoring"
    #: The namespace fleetpilot's operator and planner pods run in (the chart's release namespace): the
    #: frontends' NetworkPolicies admit them, since both read a frontend's /metrics directly (a scale-down's
    #: per-worker load, the planner's fast path and wake-up). Empty: the operator runs outside the cluster.
    control_plane_namespace: str = ""


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
    """The component's pods, every generation: the Service's and the /scale selector; the frontend's
    Deployment selector."""
    return {contract.LABEL_GRAPH: graph, contract.LABEL_COMPONENT: component}


def generation_selector(graph: str, component: str, generation: str) -> dict[str, str]:
    """The immutable selector of one generation's Deployment and PodDisruptionBudget."""
    return {**selector_labels(graph, component), contract.LABEL_GENERATION: generation}


def generation_of(graph: api.DynamoGraph, settings: RenderSettings) -> str:
    """The workers' generation: a hash of what decides whether one worker's KV cache is usable by
    another (engine and image, model, every engine argument, each pool's parallelism). Graph-wide, so
    prefill and decode change generation together; resources, drain time and pod overrides are not
    in it (they roll the current generation in place)."""
    spec = graph.spec
    identity = {
        "model": spec.model.model_dump(by_alias=True, exclude_none=True),
        "engine": spec.engine.model_dump(by_alias=True, exclude_none=True),
        "image": spec.engine.image or settings.fleetpilot_image,
        "workers": {name: {"args": worker.args, "gpus": worker.gpus,
                           "parallelism": worker.parallelism.model_dump(by_alias=True),
                           # Only when set, so single-node graphs keep the generation they had.
                           **({"nodes": worker.nodes} if worker.nodes > 1 else {})}
                    for name, worker in spec.components.workers().items()},
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]


def engine_of(graph: api.DynamoGraph) -> Engine:
    """The engine the graph's workers run (engines.py: one module per engine)."""
    return engines.lookup(graph.spec.engine.framework)


def component_labels(graph: api.DynamoGraph, component: str) -> dict[str, str]:
    engine = engine_of(graph).name
    return {
        contract.LABEL_NAME: "fleetpilot-frontend" if component == "frontend" else f"fleetpilot-{engine}",
        contract.LABEL_INSTANCE: graph.metadata.name,
        contract.LABEL_APP_COMPONENT: component,
        contract.LABEL_PART_OF: contract.PART_OF,
        contract.LABEL_MANAGED_BY: contract.MANAGED_BY,
        contract.LABEL_FRAMEWORK: engine,
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
# Above, it refuses what the graph's frontend.replicas may not be (api.FRONTEND_MAX_REPLICAS).
FRONTEND_MIN_REPLICAS = 1


def scaling_bounds(graph: api.DynamoGraph, component: api.ComponentName) -> tuple[int | None, int | None]:
    """The replicas `component`'s DynamoGraphComponent accepts: the frontend's fixed range, a worker
    pool's scaling.min and scaling.max."""
    if component == "frontend":
        return FRONTEND_MIN_REPLICAS, api.FRONTEND_MAX_REPLICAS
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


def nodes_of(graph: api.DynamoGraph, component: str) -> int:
    """Pods per replica of a component: 1, or a multinode component's group size."""
    worker = graph.spec.components.workers().get(component)  # type: ignore[call-overload]
    return 1 if worker is None else int(worker.nodes)


def is_multinode(graph: api.DynamoGraph, component: str) -> bool:
    """Whether the component's replicas are groups of pods on several nodes."""
    return nodes_of(graph, component) > 1


def leader_address(graph: api.DynamoGraph, component: str, leader: str) -> str:
    """The leader pod's DNS name through the component's headless Service (the pod's hostname and
    subdomain, which a StatefulSet sets)."""
    return f"{leader}.{contract.child_name(graph.metadata.name, component)}.{graph.metadata.namespace}.svc"


def worker_of(graph: api.DynamoGraph, component: api.WorkerName, *, leader: bool = True) -> Worker:
    """One of a worker component's pods as its engine sees it: the model, the parallelism, the port,
    the drain time, and for a multinode component the group's rendezvous, rank and leader address
    given as the `$(VAR)`s of the pod's group environment (`_group_env`), which the kubelet expands."""
    spec = graph.spec
    worker = spec.components.workers()[component]
    group = None
    if worker.nodes > 1:
        group = Group(nodes=worker.nodes, rank="0" if leader else f"$({NODE_RANK_ENV})",
                      leader_address=f"$({LEADER_ADDRESS_ENV})", port=GROUP_PORT)
    return Worker(model=spec.model.name, served_name=served_model_name(graph), role=component,
                  tensor=worker.parallelism.tensor, pipeline=worker.parallelism.pipeline, port=HTTP_PORT,
                  drain_seconds=worker.drain_seconds, leader=leader, group=group)


def engine_command(graph: api.DynamoGraph, component: api.WorkerName, *, leader: bool = True
                   ) -> tuple[list[str], list[str]]:
    """(command, args) for a worker: its engine's own command line (with its disaggregation flags,
    and for a multinode component those of the group's leader, rank 0, or of its other ranks), then
    the user's engine-wide arguments, then the component's, so the user's flags come last."""
    worker = graph.spec.components.workers()[component]
    command, args = engine_of(graph).command(worker_of(graph, component, leader=leader))
    return command, [*args, *graph.spec.engine.args, *worker.args]


def frontend_command(graph: api.DynamoGraph) -> tuple[list[str], list[str]]:
    components = graph.spec.components
    mode = "aggregated" if components.aggregated is not None else "disaggregated"
    return ["fleetpilot"], [
        "frontend", "--model", served_model_name(graph), "--graph", graph.metadata.name,
        "--namespace", "$(POD_NAMESPACE)", "--mode", mode, "--engine", engine_of(graph).name,
        "--router", components.frontend.router.policy, "--host", "0.0.0.0", "--port", str(HTTP_PORT),
        "--drain-seconds", str(components.frontend.drain_seconds),
        "--hold-seconds", str(components.hold_seconds()), "--hold-queue", str(components.frontend.hold_queue),
        *frontend_auth_args(graph),
    ]


def frontend_auth_args(graph: api.DynamoGraph) -> list[str]:
    """The frontend's API-key flags: the Secret it watches (in its own namespace, `--namespace`) and the
    per-key in-flight limit; none without `frontend.auth`. The Secret's name is in the pod spec, never
    its content: a rotation edits the Secret, not the Deployment, so it restarts nothing."""
    auth = graph.spec.components.frontend.auth
    if auth is None:
        return []
    args = ["--api-key-secret", auth.api_key_secret_ref.name]
    if auth.max_in_flight_per_key is not None:
        args += ["--max-in-flight-per-key", str(auth.max_in_flight_per_key)]
    return args


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


@dataclass(frozen=True)
class GroupMember:
    """Which pods of a multinode group a pod template is for: the leaders (`leader` None) or the
    workers of the leader pod named `leader`."""

    leader: str | None = None

    @property
    def is_leader(self) -> bool:
        return self.leader is None


def _group_env(graph: api.DynamoGraph, component: str, member: GroupMember) -> list[Manifest]:
    nodes = nodes_of(graph, component)
    service = contract.child_name(graph.metadata.name, component)
    if member.is_leader:
        rank: Manifest = {"name": NODE_RANK_ENV, "value": "0"}
        address = f"$(POD_NAME).{service}.$(POD_NAMESPACE).svc"
    else:
        # A worker's rank is its StatefulSet ordinal (1 … nodes − 1), which the controller labels it with.
        rank = {"name": NODE_RANK_ENV,
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{contract.LABEL_POD_INDEX}']"}}}
        address = leader_address(graph, component, member.leader or "")
    return [{"name": GROUP_SIZE_ENV, "value": str(nodes)}, rank, {"name": LEADER_ADDRESS_ENV, "value": address}]


def _group_affinity(graph: api.DynamoGraph, leader: str) -> Manifest:
    """A group's workers: each on a node of its own (no two members of one group share a node), and,
    with spec.placement.topologyKey, in the leader's topology domain. The user's affinity is kept."""
    affinity: Manifest = copy.deepcopy(graph.spec.pod_template.affinity or {})
    members = {contract.LABEL_GRAPH: graph.metadata.name, contract.LABEL_GROUP: leader}
    affinity.setdefault("podAntiAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
        {"labelSelector": {"matchLabels": members}, "topologyKey": "kubernetes.io/hostname"})
    key = graph.spec.placement.topology_key
    if key:
        the_leader = {contract.LABEL_GRAPH: graph.metadata.name, "statefulset.kubernetes.io/pod-name": leader}
        affinity.setdefault("podAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(
            {"labelSelector": {"matchLabels": the_leader}, "topologyKey": key})
    return affinity


def pod_template(graph: api.DynamoGraph, component: api.ComponentName, settings: RenderSettings,
                 *, generation: str | None = None, member: GroupMember | None = None) -> Manifest:
    """A component's pod template; for a multinode component, that of its group leaders or of one
    leader's workers (`member`)."""
    spec = graph.spec
    overrides = spec.pod_template
    name = contract.child_name(graph.metadata.name, component)
    env = _downward_env()
    # The pod that serves the API and drains: a single-node replica's, or a group's rank 0.
    serving = member is None or member.is_leader
    volumes: list[Manifest] = []
    mounts: list[Manifest] = []
    ports = [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}]

    if component == "frontend":
        command, args = frontend_command(graph)
        image = settings.fleetpilot_image
        resources = _resources(0, spec.components.frontend.resources, dict(settings.frontend_requests))
        grace = spec.components.frontend.drain_seconds + EXIT_MARGIN_SECONDS
        lifecycle = None
        # Ready only while a request has somewhere to go (/ready: a prefill and a decode worker, or an
        # aggregated one); alive while it serves HTTP at all (/health).
        probes = {"readinessProbe": http_probe("/ready", period=5, failures=3),
                  "livenessProbe": http_probe("/health", period=10, failures=6)}
    else:
        worker = spec.components.workers()[component]
        engine = engine_of(graph)
        run = worker_of(graph, component, leader=serving)
        command, args = engine_command(graph, component, leader=serving)
        image = spec.engine.image or settings.fleetpilot_image
        resources = _resources(worker.gpus, worker.resources, {})
        if member is not None:
            env += _group_env(graph, component, member)
        env += [e.model_dump(by_alias=True, exclude_none=True) for e in spec.engine.env]
        # In-flight prefills, KV transfers and streams finish before the engine exits. A group's
        # workers stay until their leader has gone (they are its dependents), then only exit.
        grace = (worker.drain_seconds if serving else 0) + EXIT_MARGIN_SECONDS
        hook = engine.drain_hook(run) if serving else None
        lifecycle = None if hook is None else {"preStop": hook}
        engine_probes = engine.probes(run)
        if engine_probes is None:
            # A pod that answers no HTTP (a group's rank > 0 of most engines): the leader's health
            # covers the group.
            probes, ports = {}, []
        else:
            probes = engine_probes
        if engine.shared_memory:
            volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})  # NCCL needs shared memory
            mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        env += engine.env(run)
        ports += engine.ports(run)
        if member is not None and member.is_leader:
            ports.append({"name": "group", "containerPort": GROUP_PORT, "protocol": "TCP"})
        config = engine.config(component)
        if config is not None:
            volumes.append({"name": f"{config.name}-config", "configMap": {"name": f"{name}-{config.name}"}})
            mounts.append({"name": f"{config.name}-config", "mountPath": config.mount_path, "readOnly": True})

    if component != "frontend":
        mounts += overrides.volume_mounts or []  # model caches and the like are the engine's
    volumes += overrides.volumes or []
    container: Manifest = {
        "name": "frontend" if component == "frontend" else "engine",
        "image": image,
        "command": command,
        "args": args,
        "env": env,
        **({"ports": ports} if ports else {}),
        "resources": resources,
        **probes,
    }
    if mounts:
        container["volumeMounts"] = mounts
    if lifecycle is not None:
        container["lifecycle"] = lifecycle

    pod_spec: Manifest = {
        "containers": [container],
        "terminationGracePeriodSeconds": grace,
        "enableServiceLinks": False,
    }
    if overrides.node_selector:
        pod_spec["nodeSelector"] = dict(overrides.node_selector)
    if overrides.tolerations:
        pod_spec["tolerations"] = overrides.tolerations
    if member is not None and member.leader is not None:
        pod_spec["affinity"] = _group_affinity(graph, member.leader)
    elif overrides.affinity:
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
    if generation is not None:
        labels[contract.LABEL_GENERATION] = generation
    if member is not None:
        labels[contract.LABEL_GROUP_ROLE] = contract.GROUP_LEADER if member.is_leader else contract.GROUP_WORKER
        if member.leader is not None:
            labels[contract.LABEL_GROUP] = member.leader
        else:
            # Held back until the group's workers exist, so the whole group meets the scheduler at once.
            pod_spec["schedulingGates"] = [{"name": contract.GROUP_SCHEDULING_GATE}]
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
    generation: str | None = None,
) -> list[Manifest]:
    """Everything one component runs on, in dependency order: helpers (the frontend's ServiceAccount
    and RBAC, the ConfigMap of files an engine reads, such as TensorRT-LLM's), the NetworkPolicy
    (`network_policy`; none with `network.policy: none`), Service, PDB, then the Deployment. A worker component's Deployment and PDB are those of one generation (the graph's
    current one unless `generation` says otherwise); the frontend's are the component's own."""
    name = contract.child_name(graph.metadata.name, component)
    selector = selector_labels(graph.metadata.name, component)
    deployment_meta = _meta(graph, component, owner)
    workload_selector = selector
    spec_extra: Manifest = {}
    if component != "frontend":
        generation = generation or generation_of(graph, settings)
        generation_name = contract.generation_child_name(graph.metadata.name, component, generation)
        workload_selector = generation_selector(graph.metadata.name, component, generation)
        deployment_meta = _meta(graph, component, owner, name=generation_name)
        deployment_meta["labels"][contract.LABEL_GENERATION] = generation
        # A generation that makes no progress for this long says ProgressDeadlineExceeded: a stall.
        spec_extra["progressDeadlineSeconds"] = graph.spec.rollout.progress_deadline_seconds
    else:
        generation = None
    multinode = is_multinode(graph, component)
    if multinode:
        runner = leader_statefulset(graph, component, replicas=replicas, metadata=deployment_meta,
                                    generation=generation or "", settings=settings)
    else:
        runner = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": deployment_meta,
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": workload_selector},
                # Never drop below the requested capacity during a rollout; a surge pod that finds no
                # free GPU stays Pending and the graph's status says so.
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                "revisionHistoryLimit": 5,
                **spec_extra,
                "template": pod_template(graph, component, settings, generation=generation),
            },
        }
    # In the order they are applied, each before what needs it: the frontend's ServiceAccount and RBAC and
    # an engine's ConfigMap before the pods that mount them (a pod naming a ServiceAccount not yet made is
    # refused: FailedCreate), the Service and PDB, then the workload.
    # The NetworkPolicy first of all: no pod of the component starts before its boundary exists.
    objects: list[Manifest] = [
        *network_policy(graph, component, owner=owner, settings=settings),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(graph, component, owner),
            "spec": {
                "selector": selector,
                "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
                # Workers are addressed one by one by the frontend; only the frontend load-balances.
                **({} if component == "frontend" else {"clusterIP": "None"}),
                # A group's ranks find each other by DNS before any of them is Ready (the leader is
                # Ready only once they have all joined).
                **({"publishNotReadyAddresses": True} if multinode else {}),
            },
        },
        {
            # One per generation: a node drain never takes more than one replica of either at a time.
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": copy.deepcopy(deployment_meta),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": workload_selector}},
        },
    ]
    config = None if component == "frontend" else engine_of(graph).config(component)
    if config is not None:
        objects.insert(0, {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(graph, component, owner, name=f"{name}-{config.name}"),
            "data": dict(config.files),
        })
    if component == "frontend" and not graph.spec.pod_template.service_account_name:
        objects[:0] = frontend_rbac(graph, owner)
    return [*objects, runner]


# -- multinode groups ----------------------------------------------------------------------------------

def leader_selector(graph: str, component: str, generation: str) -> dict[str, str]:
    """One generation's group leaders: its leader StatefulSet's selector."""
    return {**generation_selector(graph, component, generation), contract.LABEL_GROUP_ROLE: contract.GROUP_LEADER}


def scale_selector(graph: api.DynamoGraph, component: str) -> dict[str, str]:
    """What /scale counts: a component's pods, or for a multinode one its group leaders (one per replica)."""
    selector = selector_labels(graph.metadata.name, component)
    if is_multinode(graph, component):
        selector[contract.LABEL_GROUP_ROLE] = contract.GROUP_LEADER
    return selector


def leader_statefulset(graph: api.DynamoGraph, component: api.ComponentName, *, replicas: int, metadata: Manifest,
                       generation: str, settings: RenderSettings) -> Manifest:
    """A multinode component's groups of one generation: a StatefulSet of their leaders, one per group.

    Stable identities (`<name>-<index>`, the Service's DNS names) give the workers an address to find
    their leader by; removing groups removes the highest indices first. Leaders start behind a
    scheduling gate the operator lifts once their workers exist. Pods are created and removed in
    parallel (a group's readiness is the operator's business, not the StatefulSet's ordering), and a
    change to the pod template rolls one group at a time: a new leader pod gets new workers."""
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "serviceName": contract.child_name(graph.metadata.name, component),
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": leader_selector(graph.metadata.name, component, generation)},
            "updateStrategy": {"type": "RollingUpdate"},
            "revisionHistoryLimit": 5,
            "template": pod_template(graph, component, settings, generation=generation, member=GroupMember()),
        },
    }


def group_workers(graph: api.DynamoGraph, component: api.ComponentName, *, leader: Manifest, generation: str,
                  settings: RenderSettings) -> Manifest:
    """The workers of one group: a StatefulSet named like its leader pod and owned by it, with pods
    `<leader>-1` … `<leader>-<nodes − 1>` (their rank is their ordinal). Owned by the leader, they go
    when it has gone, after its drain; a leader replaced (a restart, a rollout) gets a new set."""
    meta = leader["metadata"]
    nodes = nodes_of(graph, component)
    selector = {**generation_selector(graph.metadata.name, component, generation),
                contract.LABEL_GROUP: meta["name"], contract.LABEL_GROUP_ROLE: contract.GROUP_WORKER}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": meta["name"],
            "namespace": graph.metadata.namespace,
            "labels": {**component_labels(graph, component), **selector},
            # Not blockOwnerDeletion: a pod owner would need pods/finalizers rights, and nothing here
            # deletes the leader in the foreground.
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
                                 "controller": True, "blockOwnerDeletion": False}],
        },
        "spec": {
            "replicas": nodes - 1,
            "ordinals": {"start": 1},
            "serviceName": contract.child_name(graph.metadata.name, component),
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector},
            # Never rolled: the set lives as long as its leader, and a new leader gets a new set.
            "updateStrategy": {"type": "OnDelete"},
            "template": pod_template(graph, component, settings, generation=generation,
                                     member=GroupMember(leader=meta["name"])),
        },
    }


def frontend_rbac(graph: api.DynamoGraph, owner: OwnerRef) -> list[Manifest]:
    """The frontend discovers workers by watching Pods of its graph: read-only, one namespace. With API
    keys it also lists and watches its key Secret, that one by name (`resourceNames`: RBAC authorizes a
    LIST or WATCH selected by `metadata.name`, what the frontend sends), and no other Secret."""
    name = contract.child_name(graph.metadata.name, "frontend")
    rules: list[Manifest] = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    auth = graph.spec.components.frontend.auth
    if auth is not None:
        rules.append({"apiGroups": [""], "resources": ["secrets"], "resourceNames": [auth.api_key_secret_ref.name],
                      "verbs": ["list", "watch"]})
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(graph, "frontend", owner)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(graph, "frontend", owner),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(graph, "frontend", owner),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": graph.metadata.namespace}],
        },
    ]


# -- network boundaries ---------------------------------------------------------------------------------

#: The label the apiserver gives every namespace, its own name: how a NetworkPolicy selects one namespace.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
#: The `app.kubernetes.io/component` of the chart's operator and planner pods.
CONTROL_PLANE_COMPONENTS = ("operator", "planner")


def _namespace_peer(namespace: str) -> Manifest:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}}}


def _tcp(*ports: int) -> list[Manifest]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def network_policy(graph: api.DynamoGraph, component: api.ComponentName, *, owner: OwnerRef,
                   settings: RenderSettings) -> list[Manifest]:
    """The component's ingress NetworkPolicy, `<graph>-<component>`, or none with `network.policy: none`.

    It selects the component's pods of every generation (and every rank of a multinode group) by the
    labels their templates carry, and lists what may reach them; a pod a NetworkPolicy selects refuses
    every other connection. Ingress only: egress stays open, for model downloads, the frontend's API
    watches and the engines' hubs.

    - Workers: the graph's frontend pods (same namespace, `fleetpilot.dev/component: frontend`) on the
      HTTP port; in a disaggregated graph or a multinode component, the graph's worker pods on the ports
      the engine names (`Engine.peer_ports`: every port for real engines, whose NCCL and NIXL transports
      use ephemeral ones; the simulator's HTTP and rendezvous ports).
    - Frontend: `network.frontendFrom` (empty: every pod of every namespace, `namespaceSelector: {}`),
      and the operator's and planner's pods in `settings.control_plane_namespace`, on the HTTP port.
    - Both: the monitoring namespace on the HTTP port. /metrics is served on the API's own port, and a
      NetworkPolicy is L3/L4: it cannot admit a scrape of /metrics and refuse a completion on one port.
    """
    network = graph.spec.network
    if network.policy == "none":
        return []
    name = graph.metadata.name
    rules: list[Manifest] = []
    if component == "frontend":
        admitted = [peer.model_dump(by_alias=True, exclude_defaults=True) for peer in network.frontend_from]
        rules.append({"from": admitted or [{"namespaceSelector": {}}], "ports": _tcp(HTTP_PORT)})
        if settings.control_plane_namespace:
            control_plane = {**_namespace_peer(settings.control_plane_namespace), "podSelector": {"matchExpressions": [
                {"key": contract.LABEL_APP_COMPONENT, "operator": "In", "values": list(CONTROL_PLANE_COMPONENTS)}]}}
            rules.append({"from": [control_plane], "ports": _tcp(HTTP_PORT)})
    else:
        rules.append({"from": [{"podSelector": {"matchLabels": selector_labels(name, "frontend")}}],
                      "ports": _tcp(HTTP_PORT)})
        workers: list[str] = list(graph.spec.components.workers())
        if graph.spec.components.aggregated is None or is_multinode(graph, component):
            ports = engine_of(graph).peer_ports(worker_of(graph, component))
            if ports is None or ports:
                peers: Manifest = {"from": [{"podSelector": {
                    "matchLabels": {contract.LABEL_GRAPH: name},
                    "matchExpressions": [{"key": contract.LABEL_COMPONENT, "operator": "In", "values": workers}]}}]}
                if ports:
                    peers["ports"] = _tcp(*ports)
                rules.append(peers)
    if settings.monitoring_namespace:
        rules.append({"from": [_namespace_peer(settings.monitoring_namespace)], "ports": _tcp(HTTP_PORT)})
    return [{
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(graph, component, owner),
        "spec": {"podSelector": {"matchLabels": selector_labels(name, component)}, "policyTypes": ["Ingress"],
                 "ingress": rules},
    }]


def endpoint(graph: api.DynamoGraph) -> str:
    return f"http://{contract.child_name(graph.metadata.name, 'frontend')}.{graph.metadata.namespace}.svc:{HTTP_PORT}/v1"
