"""Generation-isolated rollouts (operator/rollout.py): how capacity moves from one generation to the next.

The properties the issue asks for, checked over whole simulated rollouts: Ready capacity never falls
below what the planner sized while the old generation is healthy, each generation's prefill and decode
counts stay within one replica of a common share of the planner's sizes (bounded P:D skew), a failed
new generation gets no more replicas while the old one keeps serving, and a revert rolls back. The last
tests pin the `rollout_*` helpers that turn the reconciler's cached workloads into generations and a
plan into `status.rollout`.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from fleetpilot.api import contract
from fleetpilot.operator import rollout

TOTALS = {"prefill": 3, "decode": 2}


def step(plan: rollout.Plan, generations: dict[str, rollout.Generation], *, ready_now: dict[str, dict[str, int]]
         ) -> dict[str, rollout.Generation]:
    """The cluster after a plan: replicas as asked, `ready_now` of them Ready, drained ones gone."""
    out = {}
    for name, replicas in plan.replicas.items():
        ready = {c: min(n, ready_now.get(name, {}).get(c, 0)) for c, n in replicas.items()}
        out[name] = rollout.Generation(name, replicas=dict(replicas), ready=ready, existing=dict(replicas))
    return out


def run_rollout(totals: dict[str, int], *, seed: int, start: int = 1) -> list[dict[str, rollout.Generation]]:
    """A rollout from generation "old" (all Ready) to "new", new replicas becoming Ready one at a time in a
    random order, as the controller and kubelet would; every observed state, in order."""
    rng = random.Random(seed)
    generations = {"old": rollout.Generation("old", replicas=dict(totals), ready=dict(totals),
                                             existing=dict(totals))}
    seen = [generations]
    for _ in range(100):
        plan = rollout.plan("new", totals, generations.values())
        ready_now = {name: dict(g.ready) for name, g in generations.items()}
        ready_now["old"] = dict(plan.replicas.get("old", {}))  # old replicas stay Ready until removed
        starting = [(c, n - ready_now.get("new", {}).get(c, 0)) for c, n in plan.replicas["new"].items()]
        candidates = [c for c, pending in starting if pending > 0]
        if candidates:  # one new replica becomes Ready
            component = rng.choice(candidates)
            ready_now.setdefault("new", {})
            ready_now["new"][component] = ready_now["new"].get(component, 0) + 1
        generations = step(plan, generations, ready_now=ready_now)
        seen.append(generations)
        if plan.phase == "Complete" and list(generations) == ["new"]:
            return seen
    raise AssertionError(f"the rollout did not complete: {seen[-1]}")


@pytest.mark.parametrize("totals", [{"prefill": 3, "decode": 2}, {"prefill": 1, "decode": 4},
                                    {"prefill": 8, "decode": 1}, {"prefill": 1, "decode": 1}, {"aggregated": 5}])
@pytest.mark.parametrize("seed", range(5))
def test_a_rollout_keeps_capacity_and_bounded_skew_at_every_step(totals: dict[str, int], seed: int) -> None:
    for generations in run_rollout(totals, seed=seed):
        for component, n in totals.items():
            assert sum(g.ready.get(component, 0) for g in generations.values()) >= n, generations
        for g in generations.values():
            assert rollout.within_skew(g.ready, totals), (g, totals)
            assert rollout.within_skew(g.replicas, totals), (g, totals)
        assert all(g.replicas.get(c, 0) <= n for g in generations.values() for c, n in totals.items())


def test_the_new_generation_starts_one_replica_ahead_of_its_ready_share() -> None:
    old = rollout.Generation("old", replicas=TOTALS, ready=TOTALS, existing=TOTALS)
    plan = rollout.plan("new", TOTALS, [old])
    assert plan.replicas == {"new": {"prefill": 1, "decode": 1}, "old": TOTALS}
    assert plan.phase == "Progressing" and plan.progress == 0
    new = rollout.Generation("new", replicas={"prefill": 1, "decode": 1}, ready={"prefill": 1, "decode": 1})
    plan = rollout.plan("new", TOTALS, [old, new])
    # decode 1/2 Ready is the slower side (½ against prefill's ⅓): both move by that half.
    assert plan.progress == pytest.approx(1 / 3)
    assert plan.replicas["new"] == {"prefill": 2, "decode": 1}
    assert plan.replicas["old"] == {"prefill": 2, "decode": 2}


def test_a_first_generation_runs_every_replica_at_once() -> None:
    plan = rollout.plan("only", TOTALS, [])
    assert plan.replicas == {"only": TOTALS} and plan.phase == "Complete" and not plan.delete


def test_a_stalled_generation_gets_no_more_replicas_and_the_old_keeps_serving() -> None:
    old = rollout.Generation("old", replicas=TOTALS, ready=TOTALS, existing=TOTALS)
    new = rollout.Generation("new", replicas={"prefill": 1, "decode": 1}, ready={"prefill": 1, "decode": 0})
    plan = rollout.plan("new", TOTALS, [old, new], stalled="CrashLoopBackOff on pod x")
    assert plan.phase == "Stalled" and "CrashLoopBackOff" in plan.message
    assert plan.replicas["new"] == {"prefill": 1, "decode": 1}
    assert plan.replicas["old"] == TOTALS


def test_reverting_rolls_back_at_once_and_the_failed_generation_goes_once_its_pods_are_gone() -> None:
    good = rollout.Generation("good", replicas=TOTALS, ready=TOTALS, existing=TOTALS)
    bad = rollout.Generation("bad", replicas={"prefill": 1, "decode": 1}, ready={},
                             existing={"prefill": 1, "decode": 1})
    plan = rollout.plan("good", TOTALS, [good, bad])
    assert plan.replicas == {"good": TOTALS, "bad": {"prefill": 0, "decode": 0}}
    assert plan.phase == "Progressing" and not plan.delete  # its pods still terminate
    gone = rollout.Generation("bad", replicas={"prefill": 0, "decode": 0})
    plan = rollout.plan("good", TOTALS, [good, gone])
    assert plan.delete == ["bad"] and plan.phase == "Complete" and plan.replicas == {"good": TOTALS}


def test_a_change_during_a_rollout_keeps_the_generation_serving_most() -> None:
    a = rollout.Generation("a", replicas={"prefill": 2, "decode": 1}, ready={"prefill": 2, "decode": 1})
    b = rollout.Generation("b", replicas={"prefill": 2, "decode": 2}, ready={"prefill": 1, "decode": 1})
    plan = rollout.plan("c", TOTALS, [a, b])
    assert plan.replicas["c"] == {"prefill": 1, "decode": 1}
    assert plan.replicas["a"] == {"prefill": 2, "decode": 1}  # the most Ready keeps its replicas first
    assert plan.replicas["b"] == {"prefill": 1, "decode": 1}
    assert sum(p[c] for p in (plan.replicas["a"], plan.replicas["b"]) for c in ("decode",)) == TOTALS["decode"]


def test_scaling_up_during_a_rollout_adds_to_the_old_generation() -> None:
    old = rollout.Generation("old", replicas=TOTALS, ready=TOTALS)
    new = rollout.Generation("new", replicas={"prefill": 1, "decode": 1}, ready={"prefill": 1, "decode": 1})
    plan = rollout.plan("new", {"prefill": 6, "decode": 2}, [old, new])
    # prefill 1/6 Ready on the new generation: it asks for one more, the old one carries the other five.
    assert plan.replicas["new"]["prefill"] == 2 and plan.replicas["old"]["prefill"] == 5


def test_scaling_to_zero_during_a_rollout_leaves_nothing_running() -> None:
    old = rollout.Generation("old", replicas=TOTALS, ready=TOTALS, existing=TOTALS)
    plan = rollout.plan("new", {"prefill": 0, "decode": 0}, [old])
    assert plan.replicas == {"new": {"prefill": 0, "decode": 0}, "old": {"prefill": 0, "decode": 0}}


@pytest.mark.parametrize(("counts", "ok"), [
    ({"prefill": 2, "decode": 1}, True),  # f = ½: 1.5 ± 1 and 1 ± 1
    ({"prefill": 3, "decode": 0}, False),  # prefill done while decode has not started
    ({"prefill": 0, "decode": 2}, False),
    ({"prefill": 0, "decode": 0}, True),
    ({"prefill": 3, "decode": 2}, True),
])
def test_within_skew(counts: dict[str, int], ok: bool) -> None:
    assert rollout.within_skew(counts, TOTALS) is ok


def test_failure_names_the_pod_and_the_reason() -> None:
    crash = {"metadata": {"name": "d-1"}, "status": {"containerStatuses": [
        {"ready": False, "restartCount": 1, "state": {"waiting": {"reason": "ImagePullBackOff", "message": "nope"}}}]}}
    assert rollout.failure([crash], []) == "ImagePullBackOff on pod d-1: nope"
    flapping = {"metadata": {"name": "d-2"}, "status": {"containerStatuses": [
        {"ready": False, "restartCount": rollout.FAILED_RESTARTS, "state": {"running": {}}}]}}
    assert rollout.failure([flapping], []) is not None and "restarted" in str(rollout.failure([flapping], []))
    starting = {"metadata": {"name": "d-3"}, "status": {"containerStatuses": [
        {"ready": False, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]}}
    assert rollout.failure([starting], []) is None
    late = {"metadata": {"name": "dep"}, "status": {"conditions": [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "too slow"}]}}
    assert rollout.failure([], [late]) == "Deployment dep: too slow"


# -- from the cache's workloads to generations and back to status (the reconciler's side) --------------


def workload(kind: str, generation: str | None, owner: str, *, replicas: int, ready: int, existing: int,
             updated: int = 0) -> dict[str, Any]:
    labels = {} if generation is None else {contract.LABEL_GENERATION: generation}
    return {"kind": kind,
            "metadata": {"name": f"d-{generation}", "generation": 2, "labels": labels,
                         "ownerReferences": [{"uid": "other"}, {"uid": owner, "controller": True}]},
            "spec": {"replicas": replicas},
            "status": {"replicas": existing, "readyReplicas": ready, "availableReplicas": ready,
                       "updatedReplicas": updated, "observedGeneration": 2}}


def test_a_components_workloads_by_generation_are_those_it_controls() -> None:
    """Deployments and leader StatefulSets the component controls, keyed by generation ("" for one made
    before generations); a workload some other owner controls, or another kind, is not one."""
    old = workload("Deployment", None, "uid-decode", replicas=1, ready=1, existing=1)
    new = workload("StatefulSet", "abc", "uid-decode", replicas=2, ready=0, existing=2)
    foreign = workload("Deployment", "zzz", "uid-prefill", replicas=1, ready=1, existing=1)
    service = workload("Service", "svc", "uid-decode", replicas=0, ready=0, existing=0)
    children = {("Deployment", "d-old"): old, ("StatefulSet", "d-new"): new, ("Deployment", "d-f"): foreign,
                ("Service", "s"): service}
    assert rollout.rollout_deployments(children, "uid-decode") == {"": old, "abc": new}


def test_generations_are_read_per_component_and_summed_for_status() -> None:
    a_decode = workload("Deployment", "a", "o", replicas=2, ready=2, existing=2, updated=2)
    b_decode = workload("Deployment", "b", "o", replicas=1, ready=0, existing=1, updated=1)
    a_prefill = workload("Deployment", "a", "o", replicas=3, ready=3, existing=3)
    by_component = {"decode": {"a": a_decode, "b": b_decode}, "prefill": {"a": a_prefill}}
    generations = rollout.rollout_generations(by_component)
    assert generations == [
        rollout.Generation("a", replicas={"decode": 2, "prefill": 3}, ready={"decode": 2, "prefill": 3},
                           existing={"decode": 2, "prefill": 3}),
        rollout.Generation("b", replicas={"decode": 1}, ready={"decode": 0}, existing={"decode": 1}),
    ]
    summary = rollout.rollout_aggregate([a_decode, b_decode], "b")
    assert summary is not None
    # Summed over generations; updated only the target's, so the rollout is done once "a" has gone.
    assert summary["status"] == {"replicas": 3, "readyReplicas": 2, "availableReplicas": 2,
                                 "updatedReplicas": 1, "observedGeneration": 1}
    assert rollout.rollout_aggregate([], "b") is None


def test_rollout_status_lists_the_target_first_and_carries_a_stalls_reason() -> None:
    old = rollout.Generation("old", replicas=TOTALS, ready=TOTALS, existing=TOTALS)
    new = rollout.Generation("new", replicas={"prefill": 1, "decode": 1}, ready={}, existing={"prefill": 1})
    plan = rollout.plan("new", TOTALS, [old, new], stalled="CrashLoopBackOff on pod p")
    shown = rollout.rollout_status("new", plan, [old, new], ["prefill", "decode"],
                                   "CrashLoopBackOff on pod p")
    assert [g.name for g in shown.generations] == ["new", "old"]
    assert shown.phase == "Stalled" and shown.reason == "CrashLoopBackOff on pod p"
    assert shown.generations[1].components["prefill"].summary == "3/3"
