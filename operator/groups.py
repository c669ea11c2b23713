"""Multinode replicas as groups: when a group is ready, broken, stuck, and what to do about it.

Where it sits: a pure step of the reconcile, after render.py has applied a multinode component's
leader StatefulSet (one leader pod per group) and before status. It reads the group's pods and
worker StatefulSets from the cache and says, per group, what the reconciler must do:

- **form**: a new leader (held back by a scheduling gate) gets its worker StatefulSet, then its
  gate is lifted, so every pod of the group meets the scheduler at once; once every worker pod
  exists, their uids are recorded on the leader (`fleetpilot.dev/group-members`);
- **all-or-nothing readiness**: a group counts as ready only when its leader and all its workers are;
- **heal**: a group whose member died, was evicted, replaced or restarted is torn down whole (the
  leader, its worker StatefulSet, its worker pods) and formed again: a replica missing a rank is a
  hung replica, and the survivors cannot be re-joined by a new rank;
- **release** (the stand-in for gang scheduling, which Kubernetes 1.30 lacks): a group partly placed
  for longer than spec.placement.groupSchedulingTimeoutSeconds holds GPUs without serving; it is torn
  down, reported, and its leader stays gated for about one more timeout (jittered per group, so two
  groups that deadlocked each other do not come back in lock-step), leaving the GPUs to others.

Scale-down and rollouts need nothing here: the StatefulSet removes the highest-index leaders first,
each drains for its grace period, and its workers, owned by it, go only when it has gone.

Pure: manifests and a clock in, a plan out; no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetpilot.api import contract
from fleetpilot.operator import owners

Manifest = dict[str, Any]
ActionKind = Literal["create-workers", "delete-stale-workers", "admit", "record-members", "restart", "release"]


@dataclass(frozen=True)
class Action:
    """One write the reconciler makes for a group. `leader` is the leader pod; `workers` its worker
    StatefulSet (the stale one, for delete-stale-workers); `pods` the worker pods to remove."""

    kind: ActionKind
    group: str
    leader: Manifest
    workers: Manifest | None = None
    pods: tuple[Manifest, ...] = ()
    reason: str = ""
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class Problem:
    """A group some of whose pods cannot be placed: what is missing, and whether it was released."""

    group: str
    placed: int
    total: int
    waiting: tuple[str, ...]  # "pod: needs 8 nvidia.com/gpu (scheduler: 0/4 nodes are available: ...)"
    held_s: float  # how long its placed pods have held their GPUs
    released: bool = False
    retry_in_s: float | None = None


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    ready: int = 0  # groups whose every pod is Ready
    updated_ready: int = 0  # of those, groups whose leader runs the StatefulSet's current revision
    existing: int = 0  # leader pods that exist
    problems: list[Problem] = field(default_factory=list)
    released: dict[str, float] = field(default_factory=dict)  # group → when it was last released (epoch s)
    recheck_in_s: float | None = None  # a timeout or back-off ends then: look again


# -- reading pods -------------------------------------------------------------------------------------

def _ready(pod: Manifest) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions", []) or [])


def _terminating(pod: Manifest) -> bool:
    return bool(pod.get("metadata", {}).get("deletionTimestamp"))


def _gated(pod: Manifest) -> bool:
    return any(g.get("name") == contract.GROUP_SCHEDULING_GATE for g in pod.get("spec", {}).get("schedulingGates") or [])


def _restarts(pod: Manifest) -> int:
    return sum(int(s.get("restartCount", 0)) for s in pod.get("status", {}).get("containerStatuses", []) or [])


def _scheduled(pod: Manifest) -> dict[str, Any]:
    for condition in pod.get("status", {}).get("conditions", []) or []:
        if condition.get("type") == "PodScheduled":
            return dict(condition)
    return {}


def _unschedulable(pod: Manifest) -> bool:
    scheduled = _scheduled(pod)
    return not pod.get("spec", {}).get("nodeName") and scheduled.get("reason") == "Unschedulable"


def _seconds(timestamp: str | None, default: float) -> float:
    if not timestamp:
        return default
    try:
        return contract.parse_rfc3339(timestamp)
    except ValueError:
        return default


def gpus_of(pod: Manifest) -> int:
    return sum(int((c.get("resources", {}).get("requests", {}) or {}).get("nvidia.com/gpu", 0))
               for c in pod.get("spec", {}).get("containers", []) or [])


def backoff_s(group: str, released_at: float, timeout_s: float) -> float:
    """How long a released group stays gated: 0.5–1.5 timeouts, fixed per group and release, so two
    groups released together do not come back together."""
    digest = hashlib.sha256(f"{group}@{released_at:.0f}".encode()).digest()
    return timeout_s * (0.5 + int.from_bytes(digest[:4], "big") / 2**32)


def members(leader: Manifest) -> tuple[str, ...] | None:
    recorded = leader.get("metadata", {}).get("annotations", {}).get(contract.ANNOTATION_GROUP_MEMBERS)
    return None if recorded is None else tuple(sorted(u for u in recorded.split(",") if u))


# -- one group ------------------------------------------------------------------------------------------

def _broken(leader: Manifest, workers: list[Manifest], recorded: tuple[str, ...] | None) -> str | None:
    """Why a formed group can no longer serve, or None."""
    name = leader["metadata"]["name"]
    if _restarts(leader):
        return f"its leader {name} restarted"
    for pod in workers:
        pod_name = pod["metadata"]["name"]
        if _terminating(pod):
            return f"its worker {pod_name} is going away (deleted or evicted)"
        if pod.get("status", {}).get("phase") == "Failed":
            return f"its worker {pod_name} failed"
        if _restarts(pod):
            return f"its worker {pod_name} restarted"
    if recorded is not None:
        current = {p["metadata"].get("uid", "") for p in workers}
        if current - set(recorded):
            replaced = sorted(p["metadata"]["name"] for p in workers if p["metadata"].get("uid") not in recorded)
            return f"its worker {', '.join(replaced)} was replaced"
        gone = set(recorded) - current
        if gone:
            return f"{len(gone)} of its workers went away"
    return None


def _placement(leader: Manifest, workers: list[Manifest], nodes: int, now: float, timeout_s: float
               ) -> tuple[Problem | None, bool]:
    """(what cannot be placed, whether the group has held GPUs past the timeout)."""
    group = [leader, *workers]
    stuck = [p for p in group if _unschedulable(p)]
    if not stuck:
        return None, False
    bound = [p for p in group if p.get("spec", {}).get("nodeName")]
    since = min((_seconds(_scheduled(p).get("lastTransitionTime"), now) for p in bound), default=now)
    waiting = tuple(
        f"{p['metadata']['name']}: needs {gpus_of(p)} nvidia.com/gpu"
        f" ({_scheduled(p).get('message') or 'no node fits'})" for p in stuck)
    held = now - since if bound else 0.0
    problem = Problem(group=leader["metadata"]["name"], placed=len(bound), total=nodes, waiting=waiting, held_s=held)
    return problem, bool(bound) and held >= timeout_s


def plan(*, leaders: Iterable[Manifest], worker_sets: Iterable[Manifest], pods: Iterable[Manifest], nodes: int,
         update_revision: str | None, now: float, timeout_s: float, released: Mapping[str, float]) -> Plan:
    """What to do for every group of one leader StatefulSet (`leaders`: its pods), given the worker
    StatefulSets and pods of the component, the time, the placement timeout and when groups were
    last released."""
    sets_by_name = {s["metadata"]["name"]: s for s in worker_sets}
    pods_by_owner: dict[str, list[Manifest]] = {}
    for pod in pods:
        owner = owners.controller_uid(pod)
        if owner is not None:
            pods_by_owner.setdefault(owner, []).append(pod)
    # A release is remembered until its back-off (at most 1.5 timeouts) is long over.
    out = Plan(released={k: v for k, v in released.items() if now - v < 3 * timeout_s})
    recheck: list[float] = []
    for leader in sorted(leaders, key=lambda p: p["metadata"]["name"]):
        meta = leader["metadata"]
        name, uid = meta["name"], meta.get("uid", "")
        out.existing += 1
        if _terminating(leader):
            continue  # draining (scale-down, rollout) or being restarted: its workers wait for it
        workers_set = sets_by_name.get(name)
        if workers_set is not None and owners.controller_uid(workers_set) != uid:
            # Made for an earlier leader of this name: that group is over.
            if not workers_set["metadata"].get("deletionTimestamp"):
                out.actions.append(Action("delete-stale-workers", name, leader, workers=workers_set))
            continue
        workers = sorted(pods_by_owner.get(workers_set["metadata"].get("uid", ""), []) if workers_set else [],
                         key=lambda p: p["metadata"]["name"])
        if workers_set is None:
            released_at = released.get(name)
            if released_at is not None and _gated(leader):
                wait = released_at + backoff_s(name, released_at, timeout_s) - now
                if wait > 0:
                    recheck.append(wait)
                    continue
            out.actions.append(Action("create-workers", name, leader))
            if _gated(leader):
                out.actions.append(Action("admit", name, leader))
            continue
        if _gated(leader):
            out.actions.append(Action("admit", name, leader))
            continue
        recorded = members(leader)
        reason = _broken(leader, workers, recorded)
        if reason is not None:
            out.actions.append(Action("restart", name, leader, workers=workers_set, pods=tuple(workers), reason=reason))
            continue
        problem, overdue = _placement(leader, workers, nodes, now, timeout_s)
        if overdue and problem is not None:
            out.released[name] = now
            out.problems.append(Problem(**{**problem.__dict__, "released": True,
                                           "retry_in_s": backoff_s(name, now, timeout_s)}))
            out.actions.append(Action("release", name, leader, workers=workers_set, pods=tuple(workers),
                                      reason=f"{problem.placed} of {nodes} pods placed for {problem.held_s:.0f} s"))
            continue
        if problem is not None:
            out.problems.append(problem)
            if problem.placed:
                recheck.append(max(0.0, timeout_s - problem.held_s))
        elif all(p.get("spec", {}).get("nodeName") for p in [leader, *workers]) and len(workers) == nodes - 1:
            out.released.pop(name, None)  # placed whole: its back-off is history
        if recorded is None and len(workers) == nodes - 1:
            out.actions.append(Action("record-members", name, leader,
                                      members=tuple(sorted(p["metadata"].get("uid", "") for p in workers))))
        if _ready(leader) and len([p for p in workers if _ready(p)]) == nodes - 1:
            out.ready += 1
            if update_revision is None or meta.get("labels", {}).get("controller-revision-hash") == update_revision:
                out.updated_ready += 1
    out.recheck_in_s = min(recheck) if recheck else None
    return out


def summary(statefulset: Manifest, group_plan: Plan) -> Manifest:
    """A leader StatefulSet as the reconciler's Deployment-shaped readers expect it: replicas, ready,
    available and updated counted in whole groups."""
    status = statefulset.get("status", {})
    return {
        **statefulset,
        "status": {
            "replicas": group_plan.existing,
            "readyReplicas": group_plan.ready,
            "availableReplicas": group_plan.ready,
            "updatedReplicas": group_plan.updated_ready,
            "observedGeneration": status.get("observedGeneration", 0),
        },
    }


def describe(component: str, problem: Problem, topology_key: str | None) -> str:
    """The status message for a group that cannot be placed whole: what is missing, and what was done."""
    where = f" in the leader's {topology_key} domain" if topology_key and problem.placed else ""
    text = (f"{component} group {problem.group}: {problem.placed} of {problem.total} pods placed; cannot place"
            f"{where} " + "; ".join(problem.waiting))
    if problem.released:
        text += (f"; released after holding GPUs for {problem.held_s:.0f} s so they serve other groups,"
                 f" tried again in {problem.retry_in_s or 0:.0f} s")
    elif problem.placed:
        text += f"; holding GPUs for {problem.held_s:.0f} s"
    return text
