"""Generation-isolated rollouts: how many replicas each generation of the workers runs, step by step.

Where it sits: between render.py (which names a graph's *generation*, the hash of what makes one
worker's KV cache usable by another: engine, image, model, arguments) and the reconciler, which
applies what this module decides. Pure: plain numbers in, plain numbers out; the `rollout_*`
helpers at the end translate the reconciler's cached Deployments and Pods into those numbers and
the plan back into the graph's `status.rollout`, without I/O either.

Why generations: in a disaggregated graph a prefill worker hands its KV cache to a decode worker. A
rolling update of each Deployment on its own would let new prefill workers hand caches to old
decode workers (another engine version, another model revision) and let one side move faster than
the other. So a change to what the workers run starts a new generation (its own Deployment per
component, its pods labelled with it), the frontend pairs prefill and decode of one generation
only, and this module moves capacity from the old generation to the new one:

- the new generation's progress `f` is the smallest share of its final size that is Ready over the
  components (the slower side sets the pace);
- each component of the new generation runs ⌊f·N⌋ + 1 (one starting replica ahead of its Ready
  share, at most N), each old one N − ⌊f·N⌋: so each generation's prefill and decode counts stay
  within one replica of the same share of the planner's sizes (bounded P:D skew, `within_skew`),
  and Ready capacity never falls below N while the old generation is healthy;
- a stalled new generation (crash-looping, unpullable, no progress within the deadline) gets no
  more replicas, and the old one keeps serving;
- old generations at zero whose pods are gone are deleted; reverting the spec makes the old
  generation the target again, which at once has all its replicas Ready, so the new one goes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api
from fleetpilot.operator import owners

Manifest = dict[str, Any]
Phase = Literal["Complete", "Progressing", "Stalled"]
_EPSILON = 1e-9

#: Container states that will not get better by waiting: a new generation showing one has failed.
FAILED_WAITING_REASONS = frozenset({
    "CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
    "CreateContainerError", "RunContainerError",
})
#: A container restarted this often has crash-looped, whatever its state says at this instant.
FAILED_RESTARTS = 3


@dataclass(frozen=True)
class Generation:
    """One generation as it runs: per component, the replicas its Deployment asks for, those Ready,
    and those that still exist (a Deployment's status.replicas)."""

    name: str
    replicas: Mapping[str, int] = field(default_factory=dict)
    ready: Mapping[str, int] = field(default_factory=dict)
    existing: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """Replicas per generation and component, the generations to delete, and how the rollout stands."""

    replicas: dict[str, dict[str, int]]
    delete: list[str]
    phase: Phase
    progress: float
    message: str


def progress(target: Generation | None, totals: Mapping[str, int]) -> float:
    """The smallest Ready share of its final size over the components (1 when nothing is wanted)."""
    shares = [(target.ready.get(c, 0) if target else 0) / n for c, n in totals.items() if n > 0]
    return min(1.0, min(shares, default=1.0))


def within_skew(counts: Mapping[str, int], totals: Mapping[str, int]) -> bool:
    """Whether one generation's prefill and decode counts are a common share of the planner's sizes
    within one replica each: some f in [0, 1] with |count − f·N| ≤ 1 for every component."""
    low, high = 0.0, 1.0
    for component, n in totals.items():
        count = counts.get(component, 0)
        if n == 0:
            if count > 1:
                return False
            continue
        low, high = max(low, (count - 1) / n), min(high, (count + 1) / n)
    return low <= high + _EPSILON


def plan(target: str, totals: Mapping[str, int], generations: Iterable[Generation], *, stalled: str | None = None
         ) -> Plan:
    """The replicas each generation runs now, given the target generation and the planner's sizes
    (`totals`, per component). `stalled`: why the target generation has failed, or None."""
    by_name = {g.name: g for g in generations}
    new = by_name.get(target)
    old = sorted((g for name, g in by_name.items() if name != target),
                 key=lambda g: (-sum(g.ready.values()), g.name))  # the one serving most keeps its replicas first
    f = progress(new, totals)
    replicas: dict[str, dict[str, int]] = {target: {}}
    for g in old:
        replicas[g.name] = {}
    for component, n in totals.items():
        serving = math.floor(f * n + _EPSILON)
        wanted = n if not old else min(n, serving + 1)
        if stalled is not None and new is not None:
            wanted = min(wanted, new.replicas.get(component, 0))  # no more replicas for a failed generation
        replicas[target][component] = wanted
        remaining = n - serving if f < 1 else 0
        for g in old:
            keep = min(remaining, g.replicas.get(component, 0))
            replicas[g.name][component] = keep
            remaining -= keep
        if old and remaining > 0:
            replicas[old[0].name][component] += remaining  # scaled up mid-rollout: the old one carries it
    delete = [g.name for g in old
              if not any(replicas[g.name].values()) and not any(g.existing.get(c, 0) for c in totals)]
    for name in delete:
        del replicas[name]
    remaining_old = [g for g in old if g.name not in delete]
    if not remaining_old:
        phase: Phase = "Complete"
    else:
        phase = "Stalled" if stalled is not None else "Progressing"
    return Plan(replicas=replicas, delete=delete, phase=phase, progress=f,
                message=_message(target, totals, new, remaining_old, phase, stalled))


def _message(target: str, totals: Mapping[str, int], new: Generation | None, old: list[Generation], phase: Phase,
             stalled: str | None) -> str:
    if phase == "Complete":
        return f"generation {target} serves every replica"
    counts = ", ".join(f"{c} {(new.ready.get(c, 0) if new else 0)}/{n}" for c, n in totals.items())
    olds = ", ".join(g.name or "(before generations)" for g in old)
    if phase == "Stalled":
        return (f"rollout to generation {target} stalled ({stalled}); {olds} keeps serving; {counts} ready on "
                f"{target}: fix the spec or revert it")
    return f"rolling out generation {target}: {counts} ready; {olds} draining"


def _waiting_reasons(pod: Manifest) -> Iterable[tuple[str, str]]:
    for status in pod.get("status", {}).get("containerStatuses", []) or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason", "")
        if reason in FAILED_WAITING_REASONS:
            yield reason, str(waiting.get("message") or "")
        elif int(status.get("restartCount", 0)) >= FAILED_RESTARTS and not status.get("ready"):
            yield "CrashLoopBackOff", f"restarted {status['restartCount']} times"


def failure(pods: Iterable[Manifest], deployments: Iterable[Manifest]) -> str | None:
    """Why a generation has failed, from its pods and Deployments, or None while it may still come up:
    a container that cannot start or keeps crashing, or a Deployment past its progress deadline."""
    for pod in pods:
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        for reason, message in _waiting_reasons(pod):
            name = pod.get("metadata", {}).get("name", "")
            return f"{reason} on pod {name}" + (f": {message[:200]}" if message else "")
    for deployment in deployments:
        for condition in deployment.get("status", {}).get("conditions", []) or []:
            if condition.get("type") == "Progressing" and condition.get("reason") == "ProgressDeadlineExceeded":
                return f"Deployment {deployment['metadata']['name']}: {condition.get('message', 'no progress')}"
    return None


# -- from the cache's Deployments and Pods to the plain numbers above, and back to status -------------
# The reconciler reads a graph's workloads from its cache, turns them into `Generation`s with these,
# asks `plan` what each should run, and reports the outcome with `rollout_status`.

def rollout_deployments(children: dict[tuple[str, str], Manifest], owner_uid: str) -> dict[str, Manifest]:
    """A worker component's Deployments (a multinode one's leader StatefulSets) by generation (a
    Deployment made before generations: "")."""
    return {d["metadata"].get("labels", {}).get(contract.LABEL_GENERATION, ""): d
            for (kind, _), d in children.items()
            if kind in ("Deployment", "StatefulSet") and owners.controller_uid(d) == owner_uid}


def rollout_generations(deployments: dict[str, dict[str, Manifest]]) -> list[Generation]:
    """Every generation found in the worker components' workloads (`deployments`: per component, by
    generation, as `rollout_deployments` gives them), in name order, with each component's
    replicas asked for, Ready and still existing."""
    names = sorted({g for by_generation in deployments.values() for g in by_generation})
    out = []
    for generation_name in names:
        mine = {c: by_generation[generation_name] for c, by_generation in deployments.items()
                if generation_name in by_generation}
        out.append(Generation(
            name=generation_name,
            replicas={c: int(d.get("spec", {}).get("replicas", 0)) for c, d in mine.items()},
            ready={c: int(d.get("status", {}).get("readyReplicas", 0)) for c, d in mine.items()},
            existing={c: int(d.get("status", {}).get("replicas", 0)) for c, d in mine.items()},
        ))
    return out


def rollout_stall(target: str, deployments: dict[str, dict[str, Manifest]], pods: list[Manifest],
                  previous: api.RolloutStatus | None, generations: list[Generation]) -> str | None:
    """Why the rollout to `target` has failed, or None. Only a rollout can stall (a graph's first
    generation that does not come up is just not Ready); once stalled it stays so until the target's
    replicas are all Ready or the spec names another generation."""
    if not any(g.name != target for g in generations):
        return None
    mine = [p for p in pods if p["metadata"].get("labels", {}).get(contract.LABEL_GENERATION) == target]
    reason = failure(mine, [by_generation[target] for by_generation in deployments.values()
                            if target in by_generation])
    if reason is not None:
        return reason
    new = next((g for g in generations if g.name == target), None)
    if (previous is not None and previous.phase == "Stalled" and previous.target == target and new is not None
            and any(new.ready.get(c, 0) < n for c, n in new.replicas.items())):
        return previous.reason or "stalled before"
    return None


def rollout_aggregate(deployments: list[Manifest], target: str) -> Manifest | None:
    """One component's Deployments of every generation as one Deployment-shaped summary, for status:
    replicas and readiness summed, `updatedReplicas` those of the target generation only, so the
    component's rollout is complete once the older generations are gone; any generation's
    ReplicaFailure (pods it cannot create: a quota, an admission webhook) carried, for
    `status.replica_failure`."""
    if not deployments:
        return None
    total = {"replicas": 0, "readyReplicas": 0, "availableReplicas": 0}
    observed = True
    updated = 0
    failures: list[Manifest] = []
    for deployment in deployments:
        status_ = deployment.get("status", {})
        for key in total:
            total[key] += int(status_.get(key, 0))
        failures += [c for c in status_.get("conditions", [])
                     if c.get("type") == "ReplicaFailure" and c.get("status") == "True"]
        observed = observed and (status_.get("observedGeneration", 0)
                                 >= deployment.get("metadata", {}).get("generation", 0))
        if deployment["metadata"].get("labels", {}).get(contract.LABEL_GENERATION) == target:
            updated = int(status_.get("updatedReplicas", 0))
    return {"metadata": {"name": deployments[0]["metadata"]["name"], "generation": 1},
            "status": {**total, "updatedReplicas": updated, "observedGeneration": 1 if observed else 0,
                       **({"conditions": failures} if failures else {})}}


def rollout_status(target: str, plan: Plan, generations: list[Generation],
                   workers: Sequence[str], stalled: str | None) -> api.RolloutStatus:
    """The graph's `status.rollout`: the target generation first, then the others the plan keeps,
    each with its replicas per worker component (desired by the plan, Ready now); the stall's
    reason while the rollout is Stalled."""
    by_name = {g.name: g for g in generations}
    shown = []
    for generation_name in [target, *sorted(n for n in plan.replicas if n != target)]:
        g = by_name.get(generation_name, Generation(generation_name))
        shown.append(api.GenerationStatus(name=generation_name or "(before generations)", components={
            c: api.ComponentStatus(desired=plan.replicas[generation_name].get(c, 0), ready=g.ready.get(c, 0),
                                   updated=g.ready.get(c, 0),
                                   summary=f"{g.ready.get(c, 0)}/{plan.replicas[generation_name].get(c, 0)}")
            for c in workers}))
    return api.RolloutStatus(target=target, phase=plan.phase, message=plan.message, generations=shown,
                             reason=stalled if plan.phase == "Stalled" else None)
