"""Aggregate what the cluster reports into a DynamoGraph's status.

The last step of a reconcile, and pure: the Deployments, Pods and (when something cannot be
scheduled) the Nodes and their pods in, the status block and its conditions out. Conditions follow
the Kubernetes API conventions: Ready, Progressing and Degraded, each with a reason a machine can
match and a message a person can act on. Reconciling and Stalled, derived from those, are the
abnormal-true pair kstatus (Flux, kpt, cli-utils) reads, so GitOps tools judge a graph's health
without knowing the kind (`kstatus_conditions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api

Manifest = dict[str, Any]
GPU = "nvidia.com/gpu"
# Every condition type the operator writes (the planner writes PlannerActive with its own field manager).
OPERATOR_CONDITIONS = ("Ready", "Progressing", "Degraded", "Reconciling", "Stalled")


@dataclass(frozen=True)
class ComponentObservation:
    """What one component looks like right now."""

    name: str
    desired: int
    deployment: Manifest | None
    clamped_from: int | None = None  # the DynamoGraphComponent asked for more/fewer than the bounds allow
    nodes: int = 1  # pods per replica: a multinode component's replicas (and counts) are groups


@dataclass(frozen=True)
class GpuCapacity:
    """Free GPUs on schedulable nodes: allocatable minus what bound, unfinished pods request."""

    free: int
    total: int
    largest_node: int


@dataclass(frozen=True)
class Observation:
    generation: int
    components: list[ComponentObservation]
    pods: list[Manifest] = field(default_factory=list)
    capacity: GpuCapacity | None = None
    error: tuple[str, str] | None = None  # (reason, message) when the reconcile itself failed
    rollout: api.RolloutStatus | None = None  # the workers' generations (operator/rollout.py)
    group_problems: list[str] = field(default_factory=list)  # multinode groups that cannot be placed whole


def gpu_request(pod: Manifest) -> int:
    """GPUs a pod asks for: the larger of its containers' sum and any init container (scheduler rule)."""
    spec = pod.get("spec", {})

    def requested(container: Manifest) -> int:
        resources = container.get("resources", {})
        value = resources.get("requests", {}).get(GPU, resources.get("limits", {}).get(GPU, 0))
        return int(value)

    main = sum(requested(c) for c in spec.get("containers", []))
    init = max((requested(c) for c in spec.get("initContainers", [])), default=0)
    return max(main, init)


def _finished(pod: Manifest) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def gpu_capacity(nodes: list[Manifest], pods: list[Manifest]) -> GpuCapacity:
    schedulable = {
        n["metadata"]["name"]: int(n.get("status", {}).get("allocatable", {}).get(GPU, 0))
        for n in nodes
        if not n.get("spec", {}).get("unschedulable")
    }
    used = sum(
        gpu_request(p) for p in pods if p.get("spec", {}).get("nodeName") in schedulable and not _finished(p)
    )
    total = sum(schedulable.values())
    return GpuCapacity(free=max(total - used, 0), total=total, largest_node=max(schedulable.values(), default=0))


def unschedulable(pods: list[Manifest]) -> list[Manifest]:
    """Pods the scheduler has tried and failed to place."""
    out = []
    for pod in pods:
        if pod.get("metadata", {}).get("deletionTimestamp") or pod.get("spec", {}).get("nodeName"):
            continue
        for condition in pod.get("status", {}).get("conditions", []):
            if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                out.append(pod)
    return out


def component_status(observed: ComponentObservation) -> api.ComponentStatus:
    status = (observed.deployment or {}).get("status", {})
    ready = int(status.get("readyReplicas", 0))
    updated = int(status.get("updatedReplicas", 0))
    message = None
    if observed.clamped_from is not None:
        message = (f"DynamoGraphComponent asks for {observed.clamped_from} replicas, outside the graph's scaling"
                   f" bounds; running {observed.desired}")
    if observed.nodes > 1:  # counts are groups: say so where `kubectl get dg` shows them
        return api.ComponentStatus(desired=observed.desired, ready=ready, updated=updated,
                                   summary=f"{ready}/{observed.desired} ×{observed.nodes} nodes", message=message,
                                   nodes=observed.nodes)
    return api.ComponentStatus(
        desired=observed.desired, ready=ready, updated=updated, summary=f"{ready}/{observed.desired}", message=message
    )


def _rollout_complete(observed: ComponentObservation) -> bool:
    deployment = observed.deployment
    if deployment is None:
        return False
    status = deployment.get("status", {})
    return (
        status.get("observedGeneration", 0) >= deployment.get("metadata", {}).get("generation", 0)
        and int(status.get("updatedReplicas", 0)) == observed.desired
        and int(status.get("replicas", 0)) == observed.desired
        and int(status.get("availableReplicas", 0)) == observed.desired
    )


def _condition(type_: str, ok: bool, reason: str, message: str, generation: int) -> api.Condition:
    return api.Condition(
        type=type_, status="True" if ok else "False", reason=reason, message=message, observed_generation=generation
    )


def conditions(observation: Observation) -> list[api.Condition]:
    """Ready, Progressing and Degraded, newest facts first in each message."""
    generation = observation.generation
    if observation.error is not None:
        reason, message = observation.error
        return [
            _condition("Ready", False, reason, message, generation),
            _condition("Progressing", False, reason, message, generation),
            _condition("Degraded", True, reason, message, generation),
        ]

    statuses = {c.name: component_status(c) for c in observation.components}
    not_ready = [f"{name} {s.ready}/{s.desired} ready" for name, s in statuses.items() if s.ready < s.desired]
    rolling = [c.name for c in observation.components if not _rollout_complete(c)]
    stuck = unschedulable(observation.pods)

    if observation.group_problems:
        # A group partly placed holds GPUs without serving: say which pods cannot be placed, and why.
        degraded = _condition("Degraded", True, "GroupUnschedulable", "; ".join(observation.group_problems),
                              generation)
    elif stuck:
        needed = sum(gpu_request(p) for p in stuck)
        capacity = observation.capacity or GpuCapacity(free=0, total=0, largest_node=0)
        message = f"Unschedulable: needs {needed} {GPU}, {capacity.free} free"
        biggest_pod = max(gpu_request(p) for p in stuck)
        if biggest_pod > capacity.largest_node:
            message += (f"; one pod needs {biggest_pod} but the largest node has {capacity.largest_node}:"
                        " use more replicas with fewer GPUs each")
        if needed == 0:  # not GPUs: repeat what the scheduler said
            scheduled = [c for c in stuck[0]["status"]["conditions"] if c.get("type") == "PodScheduled"]
            message = "Unschedulable: " + scheduled[0].get("message", "no node fits")
        degraded = _condition("Degraded", True, "Unschedulable", message, generation)
    else:
        clamped = [c.name for c in observation.components if c.clamped_from is not None]
        if clamped:
            degraded = _condition("Degraded", True, "ReplicasOutOfBounds",
                                  "; ".join(statuses[n].message or "" for n in clamped), generation)
        elif observation.rollout is not None and observation.rollout.phase == "Stalled":
            degraded = _condition("Degraded", True, "RolloutStalled", observation.rollout.message, generation)
        else:
            degraded = _condition("Degraded", False, "AsExpected", "", generation)

    if not not_ready and not rolling:
        ready = _condition("Ready", True, "AllComponentsReady", "every component has all replicas ready", generation)
        progressing = _condition("Progressing", False, "RolloutComplete", "", generation)
    else:
        reason = degraded.reason if stuck else "ComponentsNotReady"
        message = ", ".join(not_ready) or "rolling out " + ", ".join(rolling)
        if stuck:
            message = f"{degraded.message}; {message}"
        ready = _condition("Ready", False, reason, message, generation)
        progressing = _condition("Progressing", True, "RollingOut", "rolling out " + ", ".join(rolling)
                                 if rolling else message, generation)
        if observation.rollout is not None and observation.rollout.phase != "Complete":
            stalled = observation.rollout.phase == "Stalled"
            progressing = _condition("Progressing", not stalled, "RolloutStalled" if stalled else "RollingOut",
                                     observation.rollout.message, generation)
    return [ready, progressing, degraded]


def kstatus_conditions(current: list[api.Condition], generation: int) -> list[api.Condition]:
    """Reconciling and Stalled from Progressing and Degraded: kstatus' abnormal-true conditions.

    kstatus (sigs.k8s.io/cli-utils) reads a custom resource, once `observedGeneration` caught up, as
    InProgress while `Reconciling` is True and Failed while `Stalled` is True; only failing both does
    it fall back to Ready, where False is InProgress: it cannot tell stuck from rolling out. So
    Stalled is True while the graph is Degraded (waiting will not fix it: no GPUs, a name conflict,
    bounds, a failing reconcile), else Reconciling while it rolls out; never both. They carry the
    reason and message of the condition they mirror.
    """
    by_type = {c.type: c for c in current}
    degraded, progressing = by_type.get("Degraded"), by_type.get("Progressing")
    stalled = degraded is not None and degraded.status == "True"
    reconciling = not stalled and progressing is not None and progressing.status == "True"

    def mirror(type_: str, on: bool, source: api.Condition | None, quiet_reason: str) -> api.Condition:
        if on and source is not None:
            return _condition(type_, True, source.reason, source.message, generation)
        return _condition(type_, False, quiet_reason, "", generation)

    return [mirror("Reconciling", reconciling, progressing, "Reconciled"),
            mirror("Stalled", stalled, degraded, "AsExpected")]


def merge_transition_times(
    new: list[api.Condition], previous: list[api.Condition], now: str
) -> list[api.Condition]:
    """Keep lastTransitionTime when a condition's status did not change (API conventions)."""
    before = {c.type: c.model_dump(by_alias=True) for c in previous}
    return [condition.model_copy(update={
        "last_transition_time": contract.transition_time(before.get(condition.type), condition.status, now)})
        for condition in new]


def graph_status(
    observation: Observation, *, previous: api.DynamoGraphStatus, endpoint: str | None, now: str
) -> api.DynamoGraphStatus:
    current = conditions(observation)
    current += kstatus_conditions(current, observation.generation)
    return api.DynamoGraphStatus(
        observed_generation=observation.generation,
        conditions=merge_transition_times(current, previous.conditions, now),
        components={c.name: component_status(c) for c in observation.components},
        endpoint=endpoint,
        rollout=observation.rollout,
        # No planner block: status is applied server-side per field manager, so the planner's own
        # fields and conditions stay the planner's.
    )


def transitions(new: list[api.Condition], previous: list[api.Condition]) -> list[api.Condition]:
    """Conditions whose status or reason changed: each one is worth an Event."""
    before = {c.type: (c.status, c.reason) for c in previous}
    return [c for c in new if before.get(c.type) != (c.status, c.reason)]
