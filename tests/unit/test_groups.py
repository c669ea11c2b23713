"""Multinode groups (operator/groups.py): when a group forms, counts as ready, restarts or is released."""

from __future__ import annotations

from typing import Any

import pytest

from fleetpilot.api import contract
from fleetpilot.operator import groups

NOW = 1_000_000.0
TIMEOUT = 60.0
Manifest = dict[str, Any]


def stamp(epoch: float) -> str:
    import datetime
    return contract.rfc3339(datetime.datetime.fromtimestamp(epoch, datetime.UTC))


def pod(name: str, uid: str, owner: str, *, node: str | None = "n1", ready: bool = True, gated: bool = False,
        restarts: int = 0, deleting: bool = False, unschedulable_since: float | None = None,
        bound_at: float = NOW - 5, members: list[str] | None = None, revision: str = "rev-1") -> Manifest:
    conditions = []
    if node is not None:
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(bound_at)})
    elif unschedulable_since is not None:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                           "lastTransitionTime": stamp(unschedulable_since)})
    conditions.append({"type": "Ready", "status": "True" if ready and node else "False"})
    meta: Manifest = {"name": name, "uid": uid, "labels": {"controller-revision-hash": revision},
                      "ownerReferences": [{"kind": "StatefulSet", "uid": owner, "controller": True}]}
    if deleting:
        meta["deletionTimestamp"] = stamp(NOW)
    if members is not None:
        meta["annotations"] = {contract.ANNOTATION_GROUP_MEMBERS: ",".join(members)}
    spec: Manifest = {"nodeName": node, "containers": [{"resources": {"requests": {"nvidia.com/gpu": 8}}}]}
    if gated:
        spec["schedulingGates"] = [{"name": contract.GROUP_SCHEDULING_GATE}]
    return {"metadata": meta, "spec": spec,
            "status": {"phase": "Running" if node else "Pending", "conditions": conditions,
                       "containerStatuses": [{"restartCount": restarts}]}}


def worker_set(leader: str, leader_uid: str, uid: str = "") -> Manifest:
    return {"kind": "StatefulSet", "metadata": {"name": leader, "uid": uid or f"set-{leader_uid}",
                                                "ownerReferences": [{"kind": "Pod", "uid": leader_uid,
                                                                     "controller": True}]}}


def formed(nodes: int = 3, **worker_changes: Any) -> tuple[Manifest, Manifest, list[Manifest]]:
    """A group formed and Ready: leader g-0 (uid L), its worker set, its workers g-0-1 …"""
    workers = [pod(f"g-0-{r}", f"w{r}", "set-L", node=f"n{r}") for r in range(1, nodes)]
    for index, change in worker_changes.items():
        workers[int(index[1:]) - 1] = change
    leader = pod("g-0", "L", "leaders", node="n0", members=[f"w{r}" for r in range(1, nodes)])
    return leader, worker_set("g-0", "L"), workers


def run(leaders: list[Manifest], sets: list[Manifest], pods: list[Manifest], *, nodes: int = 3,
        released: dict[str, float] | None = None) -> groups.Plan:
    return groups.plan(leaders=leaders, worker_sets=sets, pods=[*leaders, *pods], nodes=nodes,
                       update_revision="rev-1", now=NOW, timeout_s=TIMEOUT, released=released or {})


def kinds(plan: groups.Plan) -> list[str]:
    return [a.kind for a in plan.actions]


def test_a_new_leader_gets_its_workers_then_its_gate_is_lifted() -> None:
    leader = pod("g-0", "L", "leaders", node=None, gated=True)
    plan = run([leader], [], [])
    assert kinds(plan) == ["create-workers", "admit"]
    assert plan.ready == 0 and plan.existing == 1


def test_a_gated_leader_whose_workers_exist_is_admitted() -> None:
    leader = pod("g-0", "L", "leaders", node=None, gated=True)
    assert kinds(run([leader], [worker_set("g-0", "L")], [])) == ["admit"]


def test_members_are_recorded_once_every_worker_exists() -> None:
    leader, workers_set, workers = formed()
    leader["metadata"].pop("annotations")
    plan = run([leader], [workers_set], workers)
    (action,) = plan.actions
    assert action.kind == "record-members" and action.members == ("w1", "w2")
    assert not run([leader], [workers_set], workers[:1]).actions  # not before all are there


def test_a_group_is_ready_only_when_every_member_is() -> None:
    leader, workers_set, workers = formed()
    assert run([leader], [workers_set], workers).ready == 1
    workers[1] = pod("g-0-2", "w2", "set-L", node="n2", ready=False)
    plan = run([leader], [workers_set], workers)
    assert plan.ready == 0 and not plan.actions
    assert run([leader], [workers_set], workers[:1]).ready == 0


def test_a_ready_group_on_an_old_revision_is_not_updated() -> None:
    leader, workers_set, workers = formed()
    leader["metadata"]["labels"]["controller-revision-hash"] = "rev-0"
    plan = run([leader], [workers_set], workers)
    assert (plan.ready, plan.updated_ready) == (1, 0)
    assert groups.summary({"status": {"observedGeneration": 4}}, plan)["status"] == {
        "replicas": 1, "readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 0, "observedGeneration": 4}


@pytest.mark.parametrize(("broken", "why"), [
    (pod("g-0-2", "w2", "set-L", node="n2", deleting=True), "is going away"),
    (pod("g-0-2", "w2", "set-L", node="n2", restarts=1), "restarted"),
    (pod("g-0-2", "w9", "set-L", node="n2"), "was replaced"),
])
def test_a_group_that_lost_a_member_restarts_whole(broken: Manifest, why: str) -> None:
    leader, workers_set, workers = formed(w2=broken)
    (action,) = run([leader], [workers_set], workers).actions
    assert action.kind == "restart" and why in action.reason
    assert action.leader is leader and action.workers is workers_set
    assert [p["metadata"]["name"] for p in action.pods] == ["g-0-1", "g-0-2"]


def test_a_missing_worker_restarts_the_group_and_a_restarted_leader_too() -> None:
    leader, workers_set, workers = formed()
    (action,) = run([leader], [workers_set], workers[:1]).actions
    assert action.kind == "restart" and "1 of its workers went away" in action.reason
    restarted = pod("g-0", "L", "leaders", node="n0", restarts=2, members=["w1", "w2"])
    (action,) = run([restarted], [workers_set], workers).actions
    assert action.kind == "restart" and "leader g-0 restarted" in action.reason


def test_a_draining_leader_and_its_workers_are_left_alone() -> None:
    leader, workers_set, workers = formed(w2=pod("g-0-2", "w2", "set-L", node="n2", restarts=4))
    leader["metadata"]["deletionTimestamp"] = stamp(NOW)
    assert not run([leader], [workers_set], workers).actions


def test_a_worker_set_of_an_earlier_leader_is_removed_first() -> None:
    leader = pod("g-0", "L2", "leaders", node=None, gated=True)
    stale = worker_set("g-0", "L")
    (action,) = run([leader], [stale], []).actions
    assert action.kind == "delete-stale-workers" and action.workers is stale


def test_a_partly_placed_group_is_reported_then_released_after_the_timeout() -> None:
    leader, workers_set, workers = formed(w2=pod("g-0-2", "w2", "set-L", node=None, unschedulable_since=NOW - 30))
    early = run([leader], [workers_set], workers)
    (problem,) = early.problems
    assert (problem.placed, problem.total, problem.released) == (2, 3, False)
    assert problem.waiting == ("g-0-2: needs 8 nvidia.com/gpu (0/4 nodes are available: 4 Insufficient nvidia.com/gpu.)",)
    assert early.recheck_in_s == pytest.approx(TIMEOUT - 5)  # bound 5 s ago
    assert "holding GPUs for 5 s" in groups.describe("decode", problem, "example.com/rack")

    late_leader = pod("g-0", "L", "leaders", node="n0", bound_at=NOW - TIMEOUT - 1)
    late_workers = [pod("g-0-1", "w1", "set-L", node="n1", bound_at=NOW - TIMEOUT - 1), workers[1]]
    late = run([late_leader], [workers_set], late_workers)
    (action,) = late.actions
    assert action.kind == "release" and "2 of 3 pods placed for 61 s" in action.reason
    assert late.released == {"g-0": NOW}
    (problem,) = late.problems
    assert problem.released and problem.retry_in_s is not None and 0.5 * TIMEOUT <= problem.retry_in_s < 1.5 * TIMEOUT
    message = groups.describe("decode", problem, "example.com/rack")
    assert "in the leader's example.com/rack domain" in message and "released after holding GPUs" in message


def test_a_group_nothing_of_which_is_placed_holds_nothing_and_is_not_released() -> None:
    leader = pod("g-0", "L", "leaders", node=None, unschedulable_since=NOW - 10 * TIMEOUT, members=["w1"])
    workers = [pod("g-0-1", "w1", "set-L", node=None, unschedulable_since=NOW - 10 * TIMEOUT)]
    plan = run([leader], [worker_set("g-0", "L")], workers, nodes=2)
    assert not plan.actions and plan.problems[0].placed == 0 and plan.recheck_in_s is None


def test_a_released_group_waits_gated_for_its_back_off_then_forms_again() -> None:
    leader = pod("g-0", "L2", "leaders", node=None, gated=True)
    released_at = NOW - 10
    wait = groups.backoff_s("g-0", released_at, TIMEOUT) - 10
    held = run([leader], [], [], released={"g-0": released_at})
    assert not held.actions and held.recheck_in_s == pytest.approx(wait)
    later = groups.plan(leaders=[leader], worker_sets=[], pods=[leader], nodes=3, update_revision=None,
                        now=NOW + wait + 1, timeout_s=TIMEOUT, released={"g-0": released_at})
    assert kinds(later) == ["create-workers", "admit"]


def test_release_back_off_differs_between_groups_and_is_forgotten_once_placed_whole() -> None:
    backoffs = {groups.backoff_s(f"g-{i}", NOW, TIMEOUT) for i in range(20)}
    assert len(backoffs) == 20 and all(0.5 * TIMEOUT <= b < 1.5 * TIMEOUT for b in backoffs)
    leader, workers_set, workers = formed()
    assert run([leader], [workers_set], workers, released={"g-0": NOW - 100}).released == {}
    assert run([], [], [], released={"g-9": NOW - 3 * TIMEOUT}).released == {}  # long over
