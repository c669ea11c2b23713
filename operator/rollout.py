"""Generation-isolated rollouts: how many replicas each generation of the workers runs, step by step.

Where it sits: between render.py (which names a graph's *generation*, the hash of what makes one
worker's KV cache usable by another: engine, image, model, arguments) and the reconciler, which
applies what this module decides. Pure: plain numbers in, plain numbers out.

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

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
