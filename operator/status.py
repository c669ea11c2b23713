"""Aggregate what the cluster reports into a DynamoGraph's status.

The last step of a reconcile, and pure: the Deployments, Pods and (when something cannot be
scheduled) the Nodes and their pods in, the status block and its conditions out. Conditions follow
the Kubernetes API conventions: Ready, Progressing and Degraded, each with a reason a machine can
match and a message a person can act on. Reconciling and Stalled, derived from those, are the
abnormal-true pair kstatus (Flux, kpt, cli-utils) reads, so GitOps tools judge a graph's health
without knowing the kind (`kstatus_conditions`).
"""

from __future__ import annotations

import datetime
import re
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


def scheduler_message(pod: Manifest) -> str:
    """What the scheduler said about a pod it could not place, without its preemption postscript."""
    for condition in pod.get("status", {}).get("conditions", []):
        if condition.get("type") == "PodScheduled":
            said = str(condition.get("message") or "no node fits")
            return said.split(" preemption:", 1)[0].strip()
    return "no node fits"


def short_of_gpus(pod: Manifest) -> bool:
    """Whether the scheduler turned the pod away (also) for want of GPUs, rather than only for other reasons."""
    return gpu_request(pod) > 0 and f"Insufficient {GPU}" in scheduler_message(pod)


# A Deployment's ReplicaFailure when a ResourceQuota refused a pod (the apiserver's own words):
# 'pods "x" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, used: ..., limited: ...'
_QUOTA = re.compile(r"exceeded quota: (?P<quota>[^,]+), requested: (?P<requested>\S+), used: (?P<used>\S+),"
                    r" limited: (?P<limited>\S+)")


def _quantities(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


def replica_failure(observed: ComponentObservation) -> tuple[str, str] | None:
    """(reason, message) when the component's Deployment cannot create its pods (ReplicaFailure=True).

    A ResourceQuota that refuses them is named with what the pod asks for and what the quota has
    left (`QuotaExceeded`); anything else (an admission webhook, a LimitRange, Pod Security) is
    reported in the controller's words (`FailedCreate`).
    """
    for condition in (observed.deployment or {}).get("status", {}).get("conditions", []):
        if condition.get("type") != "ReplicaFailure" or condition.get("status") != "True":
            continue
        said = str(condition.get("message") or condition.get("reason") or "ReplicaFailure")
        quota = _QUOTA.search(said)
        if quota is None:
            return "FailedCreate", f"{observed.name} cannot create pods: {said}"
        requested, used, limited = (_quantities(quota[k]) for k in ("requested", "used", "limited"))
        short = ", ".join(f"{resource} {amount} more (quota {limited.get(resource, '?')}, {used.get(resource, '?')} used)"
                          for resource, amount in requested.items())
        return "QuotaExceeded", (f"{observed.name} cannot create pods: ResourceQuota {quota['quota']} is exhausted;"
                                 f" a pod needs {short}: raise the quota or lower the replicas")
    return None


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

    # What keeps replicas from running, most specific first: each (reason, message).
    problems: list[tuple[str, str]] = []
    if observation.group_problems:
        # A group partly placed holds GPUs without serving: say which pods cannot be placed, and why
        # (its pending pods are named there, not again as Unschedulable).
        problems.append(("GroupUnschedulable", "; ".join(observation.group_problems)))
    elif stuck:
        problems.append(("Unschedulable", _unschedulable_message(stuck, observation.capacity)))
    problems += [failure for c in observation.components if (failure := replica_failure(c)) is not None]
    clamped = [c.name for c in observation.components if c.clamped_from is not None]
    if clamped:
        problems.append(("ReplicasOutOfBounds", "; ".join(statuses[n].message or "" for n in clamped)))
    if observation.rollout is not None and observation.rollout.phase == "Stalled":
        problems.append(("RolloutStalled", observation.rollout.message))
    if problems:
        degraded = _condition("Degraded", True, problems[0][0], "; ".join(m for _, m in problems), generation)
    else:
        degraded = _condition("Degraded", False, "AsExpected", "", generation)
    # Problems that explain why replicas are missing (not a clamp, which runs what it can, nor a stalled
    # rollout, whose old generation keeps serving and which Progressing states).
    blocking = [p for p in problems if p[0] not in ("ReplicasOutOfBounds", "RolloutStalled")]

    if not not_ready and not rolling:
        ready = _condition("Ready", True, "AllComponentsReady", "every component has all replicas ready", generation)
        progressing = _condition("Progressing", False, "RolloutComplete", "", generation)
    else:
        reason = blocking[0][0] if blocking else "ComponentsNotReady"
        message = ", ".join(not_ready) or "rolling out " + ", ".join(rolling)
        if blocking:
            message = "; ".join([*(m for _, m in blocking), message])
        ready = _condition("Ready", False, reason, message, generation)
        progressing = _condition("Progressing", True, "RollingOut", "rolling out " + ", ".join(rolling)
                                 if rolling else message, generation)
        if observation.rollout is not None and observation.rollout.phase != "Complete":
            stalled = observation.rollout.phase == "Stalled"
            progressing = _condition("Progressing", not stalled, "RolloutStalled" if stalled else "RollingOut",
                                     observation.rollout.message, generation)
    return [ready, progressing, degraded]


def _unschedulable_message(stuck: list[Manifest], capacity: GpuCapacity | None) -> str:
    """GPU numbers when the scheduler lacked GPUs for a pod; otherwise, and for the other pods, its own words."""
    short = [p for p in stuck if short_of_gpus(p)]
    other = [scheduler_message(p) for p in stuck if not short_of_gpus(p)]
    parts = []
    if short:
        needed = sum(gpu_request(p) for p in short)
        capacity = capacity or GpuCapacity(free=0, total=0, largest_node=0)
        parts.append(f"needs {needed} {GPU}, {capacity.free} free")
        biggest_pod = max(gpu_request(p) for p in short)
        if biggest_pod > capacity.largest_node:
            parts.append(f"one pod needs {biggest_pod} but the largest node has {capacity.largest_node}:"
                         " use more replicas with fewer GPUs each")
    if other:
        parts.append(other[0] if not short else f"and {len(other)} pod(s): {other[0]}")
    return "Unschedulable: " + "; ".join(parts)


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


# -- is a planner acting on the graph? -----------------------------------------------------------------

#: A graph whose planner is on and that no planner has decided for in this many of its intervals is
#: reported as `PlannerActive=Unknown NoPlanner` (by the operator: without a planner nobody else can).
NO_PLANNER_INTERVALS = 2
NO_PLANNER = "NoPlanner"


@dataclass(frozen=True)
class PlannerWatch:
    """The operator's word on the planner: the condition to apply (None: leave PlannerActive to the
    planner) and, while a planner is expected, how long until it would be overdue."""

    condition: api.Condition | None = None
    recheck_after_s: float | None = None


def _time(value: Any) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(str(value)) if value else None
    except ValueError:
        return None


def planner_watch(body: Manifest, *, first_seen: datetime.datetime | None, now: datetime.datetime) -> PlannerWatch:
    """Whether a planner has acted on a graph whose `spec.planner.mode` is advisory or sla (pure).

    The planner stamps `status.planner.lastDecisionTime` every interval it plans the graph, holding or
    not. When none did for NO_PLANNER_INTERVALS intervals since the later of that stamp, the graph's
    creation and `first_seen` (when this operator first saw the planner on), the graph says so. Once
    said, it stays until a planner writes its own PlannerActive (which replaces this one).
    """
    planner = (body.get("spec") or {}).get("planner") or {}
    if planner.get("mode", "off") == "off":
        return PlannerWatch()
    interval = float(planner.get("intervalSeconds") or 60)
    patience = NO_PLANNER_INTERVALS * interval
    stat = body.get("status") or {}
    generation = int(body.get("metadata", {}).get("generation", 0))
    current = contract.find_condition(stat.get("conditions", []), "PlannerActive") or {}
    last = _time((stat.get("planner") or {}).get("lastDecisionTime"))
    since = max((t for t in (last, _time(body.get("metadata", {}).get("creationTimestamp")), first_seen)
                 if t is not None), default=now)
    overdue = (now - since).total_seconds() - patience
    if current.get("reason") != NO_PLANNER and overdue < 0:
        return PlannerWatch(recheck_after_s=-overdue)
    what = f"the last decision was at {contract.rfc3339(last)}" if last else "none has decided for it yet"
    message = (f"no planner has acted on this graph for {NO_PLANNER_INTERVALS} planning intervals"
               f" ({patience:.0f} s; {what}): is `fleetpilot planner run` running, leading, and watching"
               f" namespace {body.get('metadata', {}).get('namespace', '')}?")
    if current.get("reason") == NO_PLANNER and current.get("message"):
        message = str(current["message"])  # as first said: the time it names does not move
    return PlannerWatch(condition=api.Condition(type="PlannerActive", status="Unknown", reason=NO_PLANNER,
                                                message=message, observed_generation=generation))


def merge_transition_times(
    new: list[api.Condition], previous: list[api.Condition], now: str
) -> list[api.Condition]:
    """Keep lastTransitionTime when a condition's status did not change (API conventions)."""
    before = {c.type: c.model_dump(by_alias=True) for c in previous}
    return [condition.model_copy(update={
        "last_transition_time": contract.transition_time(before.get(condition.type), condition.status, now)})
        for condition in new]


def graph_status(
    observation: Observation, *, previous: api.DynamoGraphStatus, endpoint: str | None, now: str,
    extra: list[api.Condition] | None = None,
) -> api.DynamoGraphStatus:
    """The operator's part of the status; `extra`: conditions of other types it also states (PlannerActive)."""
    current = conditions(observation)
    current += kstatus_conditions(current, observation.generation)
    return api.DynamoGraphStatus(
        observed_generation=observation.generation,
        conditions=merge_transition_times([*current, *(extra or [])], previous.conditions, now),
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
