"""Aggregating Deployments, Pods and Nodes into a DynamoGraph's status and conditions."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from fleetpilot.api import v1alpha1 as api
from fleetpilot.operator import status

GPU = "nvidia.com/gpu"
GENERATION = 5


# -- builders ----------------------------------------------------------------------------------------


def container(
    gpus: int | None = None, *, limits_only: bool = False, as_string: bool = False
) -> dict[str, Any]:
    """A container asking for `gpus` GPUs (in requests and limits, or limits only, as the API allows)."""
    resources: dict[str, Any] = {}
    if gpus is not None:
        value: int | str = str(gpus) if as_string else gpus
        resources = (
            {"limits": {GPU: value}} if limits_only else {"requests": {GPU: value}, "limits": {GPU: value}}
        )
    return {"name": "c", "image": "img", "resources": resources}


def pod(
    *containers: dict[str, Any],
    init: tuple[dict[str, Any], ...] = (),
    node: str | None = None,
    phase: str = "Running",
    unschedulable: bool = False,
    scheduler_message: str = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
    deleting: bool = False,
    name: str = "p",
) -> dict[str, Any]:
    """A Pod; `unschedulable` gives it the PodScheduled=False/Unschedulable condition the scheduler writes."""
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    if node is not None:
        spec["nodeName"] = node
    pod_status: dict[str, Any] = {"phase": "Pending" if unschedulable else phase}
    if unschedulable:
        pod_status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": scheduler_message,
            }
        ]
    metadata: dict[str, Any] = {"name": name, "namespace": "inference"}
    if deleting:
        metadata["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {"metadata": metadata, "spec": spec, "status": pod_status}


def gpu_pod(gpus: int, **kwargs: Any) -> dict[str, Any]:
    return pod(container(gpus), **kwargs)


def node(name: str, gpus: int, *, cordoned: bool = False, as_string: bool = True) -> dict[str, Any]:
    """A Node with `gpus` allocatable (as the API writes it: a string quantity)."""
    return {
        "metadata": {"name": name},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {"allocatable": {GPU: str(gpus) if as_string else gpus, "cpu": "64"}},
    }


def deployment(
    desired: int,
    ready: int | None = None,
    *,
    updated: int | None = None,
    generation: int = 2,
    observed_generation: int | None = None,
) -> dict[str, Any]:
    """A Deployment whose status reports `ready` of `desired` (default: all) and a finished rollout."""
    ready = desired if ready is None else ready
    updated = desired if updated is None else updated
    return {
        "metadata": {"name": "d", "generation": generation},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": generation if observed_generation is None else observed_generation,
            "replicas": desired,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": ready,
        },
    }


def component(
    name: str,
    desired: int,
    ready: int | None = None,
    *,
    clamped_from: int | None = None,
    **deployment_args: Any,
) -> status.ComponentObservation:
    """A component observation whose Deployment reports `ready` of `desired` replicas."""
    return status.ComponentObservation(
        name=name,
        desired=desired,
        deployment=deployment(desired, ready, **deployment_args),
        clamped_from=clamped_from,
    )


def healthy_components() -> list[status.ComponentObservation]:
    return [component("frontend", 1), component("prefill", 2), component("decode", 2)]


def observe(components: list[status.ComponentObservation], **kwargs: Any) -> status.Observation:
    return status.Observation(generation=GENERATION, components=components, **kwargs)


def by_type(conditions: list[api.Condition]) -> dict[str, api.Condition]:
    return {c.type: c for c in conditions}


def cond(type_: str, status_: str, reason: str = "R", time: str | None = None) -> api.Condition:
    return api.Condition(type=type_, status=status_, reason=reason, last_transition_time=time)  # type: ignore[arg-type]


# -- gpu_request -------------------------------------------------------------------------------------


def test_gpu_request_sums_containers() -> None:
    assert status.gpu_request(pod(container(2), container(1), container())) == 3


def test_gpu_request_of_a_pod_without_gpus_is_zero() -> None:
    assert status.gpu_request(pod(container())) == 0
    assert status.gpu_request({"metadata": {"name": "bare"}}) == 0


def test_gpu_request_falls_back_to_limits() -> None:
    """Extended resources given only as limits are requested at the limit (apiserver defaulting)."""
    assert status.gpu_request(pod(container(4, limits_only=True))) == 4


def test_gpu_request_parses_string_quantities() -> None:
    assert status.gpu_request(pod(container(2, as_string=True), container(2))) == 4


@pytest.mark.parametrize(
    ("containers", "init_containers", "expected"),
    [
        ((2,), (4,), 4),  # an init container larger than the app containers sets the request
        ((2, 2), (3,), 4),  # app containers' sum wins when larger
        ((1,), (3, 2), 3),  # init containers run one at a time: their max, not their sum
        ((), (2,), 2),
        ((4,), (), 4),
    ],
)
def test_gpu_request_init_containers_max_rule(
    containers: tuple[int, ...], init_containers: tuple[int, ...], expected: int
) -> None:
    """Effective request = max(sum of containers, max of init containers), as the scheduler computes it."""
    subject = pod(*(container(g) for g in containers), init=tuple(container(g) for g in init_containers))
    assert status.gpu_request(subject) == expected


# -- gpu_capacity ------------------------------------------------------------------------------------


def test_gpu_capacity_subtracts_bound_pods() -> None:
    nodes = [node("a", 8), node("b", 8)]
    pods = [gpu_pod(4, node="a"), gpu_pod(2, node="a"), gpu_pod(1, node="b")]
    assert status.gpu_capacity(nodes, pods) == status.GpuCapacity(free=9, total=16, largest_node=8)


def test_gpu_capacity_excludes_unschedulable_nodes_and_their_pods() -> None:
    """A cordoned node adds no capacity, even when it is the biggest, and its pods use none."""
    nodes = [node("big", 16, cordoned=True), node("a", 8)]
    pods = [gpu_pod(8, node="big"), gpu_pod(2, node="a")]
    assert status.gpu_capacity(nodes, pods) == status.GpuCapacity(free=6, total=8, largest_node=8)


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_gpu_capacity_ignores_finished_pods(phase: str) -> None:
    nodes = [node("a", 8)]
    pods = [gpu_pod(4, node="a", phase=phase), gpu_pod(1, node="a", phase="Running")]
    assert status.gpu_capacity(nodes, pods).free == 7


def test_gpu_capacity_counts_pending_but_bound_pods() -> None:
    """A pod bound to a node holds its GPUs even before it runs."""
    assert status.gpu_capacity([node("a", 8)], [gpu_pod(3, node="a", phase="Pending")]).free == 5


def test_gpu_capacity_ignores_pods_on_unknown_or_no_nodes() -> None:
    nodes = [node("a", 8)]
    pods = [gpu_pod(4, node="gone"), gpu_pod(4), gpu_pod(2, node="a")]
    assert status.gpu_capacity(nodes, pods) == status.GpuCapacity(free=6, total=8, largest_node=8)


def test_gpu_capacity_never_reports_negative_free() -> None:
    assert status.gpu_capacity([node("a", 2)], [gpu_pod(4, node="a")]).free == 0


def test_gpu_capacity_largest_node_and_gpu_less_nodes() -> None:
    nodes = [
        node("cpu", 0),
        node("small", 4, as_string=False),
        node("large", 8),
        {"metadata": {"name": "bare"}},
    ]
    capacity = status.gpu_capacity(nodes, [])
    assert capacity == status.GpuCapacity(free=12, total=12, largest_node=8)


def test_gpu_capacity_of_no_nodes() -> None:
    assert status.gpu_capacity([], [gpu_pod(1, node="a")]) == status.GpuCapacity(
        free=0, total=0, largest_node=0
    )


# -- unschedulable -----------------------------------------------------------------------------------


def test_unschedulable_returns_pods_the_scheduler_rejected() -> None:
    stuck = gpu_pod(8, unschedulable=True, name="stuck")
    waiting = gpu_pod(8, phase="Pending", name="not-yet-tried")
    running = gpu_pod(8, node="a", name="running")
    assert status.unschedulable([stuck, waiting, running]) == [stuck]


def test_unschedulable_skips_pods_being_deleted_and_bound_pods() -> None:
    deleting = gpu_pod(8, unschedulable=True, deleting=True)
    bound_since = gpu_pod(8, unschedulable=True, node="a")  # stale condition, but the pod has a node now
    assert status.unschedulable([deleting, bound_since]) == []


def test_unschedulable_ignores_other_pod_scheduled_reasons() -> None:
    gated = gpu_pod(8)
    gated["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]
    assert status.unschedulable([gated]) == []


# -- conditions --------------------------------------------------------------------------------------


def test_all_components_ready() -> None:
    conditions = by_type(status.conditions(observe(healthy_components())))

    assert list(conditions) == ["Ready", "Progressing", "Degraded"]
    assert (conditions["Ready"].status, conditions["Ready"].reason) == ("True", "AllComponentsReady")
    assert (conditions["Progressing"].status, conditions["Progressing"].reason) == (
        "False",
        "RolloutComplete",
    )
    assert (conditions["Degraded"].status, conditions["Degraded"].reason) == ("False", "AsExpected")
    assert all(c.observed_generation == GENERATION for c in conditions.values())


def test_component_with_fewer_ready_replicas_is_not_ready() -> None:
    components = [component("frontend", 1), component("prefill", 2), component("decode", 2, ready=1)]
    conditions = by_type(status.conditions(observe(components)))

    ready = conditions["Ready"]
    assert (ready.status, ready.reason) == ("False", "ComponentsNotReady")
    assert "decode 1/2 ready" in ready.message
    assert "prefill" not in ready.message
    assert conditions["Progressing"].status == "True"
    assert conditions["Degraded"].status == "False"


def test_missing_deployment_is_not_ready() -> None:
    components = [
        component("frontend", 1),
        status.ComponentObservation(name="decode", desired=2, deployment=None),
    ]
    ready = by_type(status.conditions(observe(components)))["Ready"]
    assert (ready.status, ready.reason) == ("False", "ComponentsNotReady")
    assert "decode 0/2 ready" in ready.message


def test_unobserved_generation_is_still_rolling_out() -> None:
    """All pods ready but the Deployment controller has not seen the newest spec: not Ready yet."""
    components = [component("frontend", 1), component("decode", 2, generation=3, observed_generation=2)]
    conditions = by_type(status.conditions(observe(components)))
    assert conditions["Ready"].status == "False"
    assert conditions["Ready"].message == "rolling out decode"
    assert (conditions["Progressing"].status, conditions["Progressing"].reason) == ("True", "RollingOut")


def stuck_decode_observation() -> status.Observation:
    """Two decode pods needing 8 GPUs each (16) while the cluster has 8 free on 8-GPU nodes."""
    stuck = [gpu_pod(8, unschedulable=True, name=f"decode-{i}") for i in range(2)]
    running = gpu_pod(8, node="a", name="prefill-0")
    capacity = status.gpu_capacity([node("a", 8), node("b", 8)], [running])
    assert capacity == status.GpuCapacity(free=8, total=16, largest_node=8)
    components = [component("frontend", 1), component("prefill", 1), component("decode", 2, ready=0)]
    return observe(components, pods=[running, *stuck], capacity=capacity)


def test_unschedulable_pods_degrade_the_graph_with_gpu_numbers() -> None:
    conditions = by_type(status.conditions(stuck_decode_observation()))

    degraded = conditions["Degraded"]
    assert (degraded.status, degraded.reason) == ("True", "Unschedulable")
    assert degraded.message.startswith("Unschedulable: needs 16 nvidia.com/gpu, 8 free")
    assert "largest node" not in degraded.message  # each pod fits a node; the cluster is just full

    ready = conditions["Ready"]
    assert (ready.status, ready.reason) == ("False", "Unschedulable")
    assert ready.message.startswith(degraded.message)
    assert "decode 0/2 ready" in ready.message


def test_pod_bigger_than_any_node_gets_advice() -> None:
    stuck = gpu_pod(16, unschedulable=True)
    capacity = status.gpu_capacity([node("a", 8), node("b", 8)], [])
    observation = observe([component("decode", 1, ready=0)], pods=[stuck], capacity=capacity)
    message = by_type(status.conditions(observation))["Degraded"].message

    assert message.startswith("Unschedulable: needs 16 nvidia.com/gpu, 16 free")
    assert "one pod needs 16 but the largest node has 8" in message


def test_unschedulable_without_gpus_uses_the_scheduler_message() -> None:
    stuck = pod(
        container(), unschedulable=True, scheduler_message="0/3 nodes are available: 3 Insufficient cpu."
    )
    observation = observe(
        [component("frontend", 1, ready=0)],
        pods=[stuck],
        capacity=status.GpuCapacity(free=8, total=8, largest_node=8),
    )
    degraded = by_type(status.conditions(observation))["Degraded"]
    assert (degraded.status, degraded.reason) == ("True", "Unschedulable")
    assert degraded.message == "Unschedulable: 0/3 nodes are available: 3 Insufficient cpu."


def test_pods_pending_for_another_reason_carry_the_schedulers_own_words() -> None:
    """A GPU pod no node matches (nodeSelector, affinity, taints) is not "short of GPUs": the graph says
    what the scheduler said, without its preemption postscript, and no GPU arithmetic."""
    said = ("0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector. preemption: 0/4 nodes"
            " are available: 4 Preemption is not helpful for scheduling.")
    stuck = gpu_pod(2, unschedulable=True, scheduler_message=said)
    observation = observe([component("decode", 1, ready=0)], pods=[stuck],
                          capacity=status.GpuCapacity(free=22, total=32, largest_node=8))
    conditions = by_type(status.conditions(observation))
    degraded = conditions["Degraded"]
    assert (degraded.status, degraded.reason) == ("True", "Unschedulable")
    assert degraded.message == "Unschedulable: 0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."
    assert "nvidia.com/gpu" not in degraded.message
    assert conditions["Ready"].message.startswith(degraded.message)


def test_gpu_shortage_and_another_reason_are_both_reported() -> None:
    short = gpu_pod(8, unschedulable=True, name="big")
    tainted = gpu_pod(1, unschedulable=True, name="small",
                      scheduler_message="0/2 nodes are available: 2 node(s) had untolerated taint {gpu: broken}.")
    observation = observe([component("decode", 2, ready=0)], pods=[short, tainted],
                          capacity=status.GpuCapacity(free=4, total=16, largest_node=8))
    message = by_type(status.conditions(observation))["Degraded"].message
    assert message.startswith("Unschedulable: needs 8 nvidia.com/gpu, 4 free")  # only the GPU-short pod counts
    assert "and 1 pod(s): 0/2 nodes are available: 2 node(s) had untolerated taint {gpu: broken}." in message


QUOTA_MESSAGE = ('pods "g-decode-7d9f-x2" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1,'
                 ' used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2')


def failing(name: str, desired: int, ready: int, message: str) -> status.ComponentObservation:
    """A component whose Deployment cannot create pods: the ReplicaFailure the deployment controller copies
    from its ReplicaSet."""
    observed = component(name, desired, ready)
    assert observed.deployment is not None
    observed.deployment["status"]["conditions"] = [
        {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": message},
    ]
    return observed


def test_a_quota_that_refuses_pods_names_the_quota_and_what_it_lacks() -> None:
    observation = observe([component("frontend", 1), component("prefill", 1), failing("decode", 2, 1, QUOTA_MESSAGE)])
    conditions = by_type(status.conditions(observation))
    degraded = conditions["Degraded"]
    assert (degraded.status, degraded.reason) == ("True", "QuotaExceeded")
    assert degraded.message == ("decode cannot create pods: ResourceQuota gpus is exhausted; a pod needs"
                                " requests.nvidia.com/gpu 1 more (quota 2, 2 used): raise the quota or lower the"
                                " replicas")
    ready = conditions["Ready"]
    assert (ready.status, ready.reason) == ("False", "QuotaExceeded")
    assert ready.message == f"{degraded.message}; decode 1/2 ready"
    # An Event follows: Degraded changed to True (the reconciler records one per such transition).
    assert [c.type for c in status.transitions([degraded], [cond("Degraded", "False", "AsExpected")])] == ["Degraded"]


def test_other_replica_failures_are_reported_in_the_controllers_words() -> None:
    said = 'pods "g-decode-x" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true'
    degraded = by_type(status.conditions(observe([failing("decode", 1, 0, said)])))["Degraded"]
    assert (degraded.reason, degraded.message) == ("FailedCreate", f"decode cannot create pods: {said}")


def test_a_cleared_replica_failure_degrades_nothing() -> None:
    observed = failing("decode", 2, 2, QUOTA_MESSAGE)
    assert observed.deployment is not None
    observed.deployment["status"]["conditions"][1]["status"] = "False"
    assert by_type(status.conditions(observe([observed])))["Degraded"].status == "False"


def test_clamped_replicas_degrade_the_graph() -> None:
    components = [component("frontend", 1), component("decode", 8, clamped_from=12)]
    degraded = by_type(status.conditions(observe(components)))["Degraded"]
    assert (degraded.status, degraded.reason) == ("True", "ReplicasOutOfBounds")
    assert "asks for 12 replicas" in degraded.message and "running 8" in degraded.message


def test_error_observation_degrades_with_its_reason() -> None:
    observation = observe(
        [], error=("NameConflict", "DynamoGraphComponent llama-decode is not owned by this graph")
    )
    conditions = by_type(status.conditions(observation))

    for type_, expected in (("Ready", "False"), ("Progressing", "False"), ("Degraded", "True")):
        assert conditions[type_].status == expected, type_
        assert conditions[type_].reason == "NameConflict", type_
        assert conditions[type_].message == "DynamoGraphComponent llama-decode is not owned by this graph"


def test_error_wins_over_healthy_components() -> None:
    observation = observe(healthy_components(), error=("InvalidSpec", "spec.engine: field required"))
    conditions = by_type(status.conditions(observation))
    assert (conditions["Degraded"].status, conditions["Degraded"].reason) == ("True", "InvalidSpec")
    assert conditions["Ready"].status == "False"


def test_component_status_summary_and_counts() -> None:
    observed = component("decode", 3, ready=2, updated=3)
    assert status.component_status(observed) == api.ComponentStatus(
        desired=3, ready=2, updated=3, summary="2/3"
    )


# -- transition times --------------------------------------------------------------------------------

NOW = "2025-06-01T12:00:00Z"
EARLIER = "2025-06-01T08:00:00Z"


def test_merge_keeps_time_when_status_is_unchanged() -> None:
    previous = [cond("Ready", "True", "AllComponentsReady", EARLIER)]
    (merged,) = status.merge_transition_times([cond("Ready", "True", "AllComponentsReady")], previous, NOW)
    assert merged.last_transition_time == EARLIER


def test_merge_keeps_time_when_only_the_reason_changes() -> None:
    """lastTransitionTime tracks status changes, not reason or message changes (API conventions)."""
    previous = [cond("Degraded", "True", "Unschedulable", EARLIER)]
    (merged,) = status.merge_transition_times(
        [cond("Degraded", "True", "ReplicasOutOfBounds")], previous, NOW
    )
    assert merged.last_transition_time == EARLIER


def test_merge_uses_now_when_status_changes() -> None:
    previous = [cond("Ready", "False", "ComponentsNotReady", EARLIER)]
    (merged,) = status.merge_transition_times([cond("Ready", "True", "AllComponentsReady")], previous, NOW)
    assert merged.last_transition_time == NOW


def test_merge_uses_now_for_new_conditions_and_missing_times() -> None:
    previous = [cond("Ready", "True", time=None)]
    merged = by_type(
        status.merge_transition_times([cond("Ready", "True"), cond("Degraded", "False")], previous, NOW)
    )
    assert merged["Ready"].last_transition_time == NOW
    assert merged["Degraded"].last_transition_time == NOW


def test_merge_keeps_order_and_does_not_modify_inputs() -> None:
    new = [cond("Ready", "True"), cond("Progressing", "False"), cond("Degraded", "False")]
    previous = [cond("Degraded", "False", time=EARLIER)]
    merged = status.merge_transition_times(new, previous, NOW)
    assert [c.type for c in merged] == ["Ready", "Progressing", "Degraded"]
    assert [c.last_transition_time for c in merged] == [NOW, NOW, EARLIER]
    assert all(c.last_transition_time is None for c in new)


def test_graph_status_carries_times_components_and_endpoint() -> None:
    previous = api.DynamoGraphStatus(conditions=[cond("Ready", "True", "AllComponentsReady", EARLIER)])
    result = status.graph_status(
        observe(healthy_components()), previous=previous, endpoint="http://g-frontend.ns.svc:8000/v1", now=NOW
    )
    conditions = by_type(result.conditions)
    assert result.observed_generation == GENERATION
    assert conditions["Ready"].last_transition_time == EARLIER
    assert conditions["Degraded"].last_transition_time == NOW
    assert result.components["decode"].summary == "2/2"
    assert result.endpoint == "http://g-frontend.ns.svc:8000/v1"


# -- transitions -------------------------------------------------------------------------------------


def test_transitions_returns_only_changed_conditions() -> None:
    previous = [
        cond("Ready", "False", "ComponentsNotReady"),
        cond("Progressing", "True", "RollingOut"),
        cond("Degraded", "False", "AsExpected"),
    ]
    new = [
        cond("Ready", "True", "AllComponentsReady"),
        cond("Progressing", "True", "RollingOut"),
        cond("Degraded", "False", "AsExpected"),
    ]
    assert [c.type for c in status.transitions(new, previous)] == ["Ready"]


def test_transitions_counts_reason_changes_and_new_conditions() -> None:
    previous = [cond("Degraded", "True", "Unschedulable")]
    new = [cond("Degraded", "True", "ReplicasOutOfBounds"), cond("Ready", "False", "ComponentsNotReady")]
    assert [c.type for c in status.transitions(new, previous)] == ["Degraded", "Ready"]


def test_no_transitions_when_nothing_changed() -> None:
    conditions = status.conditions(observe(healthy_components()))
    assert status.transitions(conditions, conditions) == []


# -- is a planner acting? ----------------------------------------------------------------------------

T0 = datetime.datetime(2025, 6, 1, 12, 0, 0, tzinfo=datetime.UTC)


def planned_body(*, mode: str = "sla", interval: int = 60, last: str | None = None, created: str = "2025-06-01T12:00:00Z",
                 active: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "g", "namespace": "serving", "generation": 3, "creationTimestamp": created},
        "spec": {"planner": {"mode": mode, "intervalSeconds": interval}},
        "status": {"conditions": [active] if active else []},
    }
    if last is not None:
        body["status"]["planner"] = {"lastDecisionTime": last}
    return body


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def test_no_planner_condition_only_after_two_intervals_without_a_decision() -> None:
    body = planned_body()
    early = status.planner_watch(body, first_seen=T0, now=at(30))
    assert early.condition is None and early.recheck_after_s == pytest.approx(90)
    late = status.planner_watch(body, first_seen=T0, now=at(121))
    assert late.condition is not None and late.recheck_after_s is None
    assert (late.condition.type, late.condition.status, late.condition.reason) == ("PlannerActive", "Unknown", "NoPlanner")
    assert "none has decided for it yet" in late.condition.message
    assert "watching namespace serving" in late.condition.message and late.condition.observed_generation == 3


def test_a_planner_deciding_keeps_the_operator_silent_and_a_stale_one_is_named() -> None:
    body = planned_body(last="2025-06-01T12:05:00Z", active={"type": "PlannerActive", "status": "True", "reason": "Planning"})
    assert status.planner_watch(body, first_seen=T0, now=at(5 * 60 + 100)).condition is None
    stale = status.planner_watch(body, first_seen=T0, now=at(5 * 60 + 121)).condition
    assert stale is not None and "the last decision was at 2025-06-01T12:05:00Z" in stale.message


def test_the_operator_first_seeing_the_planner_on_starts_the_clock() -> None:
    """A graph created long ago whose planner was just turned on (or an operator just started) waits two
    intervals from when this operator first saw it, not from the graph's creation."""
    body = planned_body(created="2025-01-01T00:00:00Z")
    assert status.planner_watch(body, first_seen=at(0), now=at(60)).condition is None
    assert status.planner_watch(body, first_seen=at(0), now=at(130)).condition is not None


def test_once_said_no_planner_stays_said_with_the_same_words_until_a_planner_writes() -> None:
    said = {"type": "PlannerActive", "status": "Unknown", "reason": "NoPlanner", "message": "as first said"}
    body = planned_body(active=said)
    watch = status.planner_watch(body, first_seen=at(1000), now=at(1001))  # a restarted operator: no flapping
    assert watch.condition is not None and watch.condition.message == "as first said"


@pytest.mark.parametrize("mode", ["off", None])
def test_no_planner_condition_when_the_planner_is_off(mode: str | None) -> None:
    body = planned_body()
    if mode is None:
        del body["spec"]["planner"]
    else:
        body["spec"]["planner"]["mode"] = mode
    assert status.planner_watch(body, first_seen=None, now=at(10_000)) == status.PlannerWatch()


def test_graph_status_states_the_extra_planner_condition_with_its_time() -> None:
    watch = status.planner_watch(planned_body(), first_seen=T0, now=at(500))
    assert watch.condition is not None
    result = status.graph_status(observe(healthy_components()), previous=api.DynamoGraphStatus(), endpoint=None,
                                 now=NOW, extra=[watch.condition])
    planner = by_type(result.conditions)["PlannerActive"]
    assert (planner.status, planner.last_transition_time) == ("Unknown", NOW)


def test_a_group_that_cannot_be_placed_whole_degrades_the_graph_by_name() -> None:
    stuck = pod(container(8), unschedulable=True, name="g-0-2")
    message = "decode group g-0: 2 of 3 pods placed; cannot place g-0-2: needs 8 nvidia.com/gpu (...)"
    components = [component("frontend", 1), component("prefill", 1), component("decode", 2, 1)]
    conditions = by_type(status.conditions(observe(components, pods=[stuck], group_problems=[message])))
    assert (conditions["Degraded"].status, conditions["Degraded"].reason) == ("True", "GroupUnschedulable")
    assert conditions["Degraded"].message == message
    assert (conditions["Ready"].status, conditions["Ready"].reason) == ("False", "GroupUnschedulable")
    assert conditions["Ready"].message.startswith(message)


def test_a_multinode_components_summary_counts_groups() -> None:
    observed = status.ComponentObservation(name="decode", desired=2, nodes=4, deployment={
        "metadata": {"generation": 1}, "status": {"readyReplicas": 1, "updatedReplicas": 1}})
    summary = status.component_status(observed)
    assert (summary.summary, summary.nodes) == ("1/2 ×4 nodes", 4)
    assert status.component_status(status.ComponentObservation(name="decode", desired=2, deployment=None)).nodes is None


# -- kstatus' abnormal-true conditions -----------------------------------------------------------------


def kstatus_view(observation: status.Observation) -> dict[str, api.Condition]:
    written = status.graph_status(observation, previous=api.DynamoGraphStatus(), endpoint=None, now="t")
    return by_type(written.conditions)


def test_a_ready_graph_is_neither_reconciling_nor_stalled() -> None:
    found = kstatus_view(observe(healthy_components()))
    assert [c.type for c in found.values()] == list(status.OPERATOR_CONDITIONS)
    assert found["Reconciling"].status == "False" and found["Stalled"].status == "False"
    assert {c.observed_generation for c in found.values()} == {GENERATION}


def test_a_rollout_is_reconciling_with_its_message() -> None:
    found = kstatus_view(observe([component("frontend", 1), component("prefill", 4, 2), component("decode", 2)]))
    assert found["Ready"].status == "False"
    assert found["Reconciling"].status == "True" and found["Stalled"].status == "False"
    assert (found["Reconciling"].reason, found["Reconciling"].message) == (
        found["Progressing"].reason, found["Progressing"].message)
    assert "prefill" in found["Reconciling"].message


def test_a_degraded_graph_is_stalled_not_reconciling() -> None:
    """Stuck on GPUs: still rolling out by Progressing, but waiting will not finish it; kstatus reads
    Reconciling before Stalled, so the two are never True together."""
    stuck = pod(container(4), unschedulable=True)
    found = kstatus_view(observe([component("frontend", 1), component("prefill", 2, 1), component("decode", 2)],
                                 pods=[stuck], capacity=status.GpuCapacity(free=2, total=8, largest_node=8)))
    assert found["Progressing"].status == "True" and found["Degraded"].status == "True"
    assert found["Stalled"].status == "True" and found["Reconciling"].status == "False"
    assert (found["Stalled"].reason, found["Stalled"].message) == ("Unschedulable", found["Degraded"].message)


def test_a_failed_reconcile_is_stalled() -> None:
    found = kstatus_view(observe([], error=("NameConflict", "Deployment x is not ours")))
    assert found["Stalled"].status == "True" and found["Stalled"].message == "Deployment x is not ours"
    assert found["Reconciling"].status == "False"


def test_whenever_ready_is_false_reconciling_or_stalled_is_true() -> None:
    """kstatus never reads Ready: a graph that is not Ready must say why in one of its two conditions."""
    stuck = pod(container(4), unschedulable=True)
    observations = [
        observe(healthy_components()),
        observe([component("frontend", 1), component("prefill", 2, updated=1), component("decode", 2)]),
        observe([component("frontend", 1, 0), component("prefill", 2), component("decode", 2)]),
        observe([component("prefill", 2, 1)], pods=[stuck], capacity=status.GpuCapacity(2, 8, 8)),
        observe([component("prefill", 8, clamped_from=12)]),
        observe([], error=("InvalidSpec", "bad")),
    ]
    for observation in observations:
        found = kstatus_view(observation)
        if found["Ready"].status == "False":
            assert "True" in (found["Reconciling"].status, found["Stalled"].status), found
        else:  # serving; Stalled only if Degraded all the same (a component asked for out-of-bounds replicas)
            assert found["Reconciling"].status == "False", found
            assert found["Stalled"].status == found["Degraded"].status, found
        assert not found["Reconciling"].status == found["Stalled"].status == "True", found
