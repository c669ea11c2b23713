"""Faults on the real control plane: the operator and the planner must converge, and lose nothing.

Each test breaks one thing the way it breaks in a cluster — the operator SIGKILLed at random points
while graphs are created and changed, hand edits of what it owns, the apiserver restarted while the
planner writes /scale, etcd away for a while, a leader frozen in the middle of an interval, the
frontends' metrics gone stale in a real Prometheus — and asserts convergence: exactly one of each
child, Ready, no orphan, no storm of Events, no lost or doubled /scale write, processes that recover
without a restart. The other faults of the suite live beside what they break: deleted children
(`test_operator.py::test_every_child_deleted_by_hand_comes_back_at_once`), a GPU quota
(`test_status_truth.py`), a Prometheus outage (`test_planner.py`), malformed Prometheus answers
(`tests/unit/test_observe_faults.py`), a SIGKILLed leader (`test_leader.py`).
"""

from __future__ import annotations

import collections
import os
import random
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetpilot.devcluster import cluster as devcluster

from .conftest import Kubectl, OperatorProcess, condition, wait_for
from .test_leader import Replica, holder, start_pair
from .test_operator import graph, ready, simulator_graph, workload_name
from .test_planner import INTERVAL_S, planned, planned_metrics, replicas  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration

KILLS = 20
CHILD_KINDS = {"dgc": 3, "deployment": 3, "service": 3, "pdb": 3, "networkpolicy": 3, "serviceaccount": 1, "role": 1,
               "rolebinding": 1}


def converged(kubectl: Kubectl, namespace: str, names: list[str]) -> bool:
    return all(ready(kubectl, namespace, name) for name in names)


def one_of_each_child(kubectl: Kubectl, namespace: str, names: list[str]) -> dict[str, list[str]]:
    """The children of each graph whose count is not what it needs (empty: exactly what it needs). A
    worker's Deployment and PDB are its generation's: an older one goes after its pods have drained,
    which may be a pass after the graph is Ready again."""
    wrong = {}
    for name in names:
        for kind, expected in CHILD_KINDS.items():
            found = kubectl.items(kind, namespace, f"fleetpilot.dev/graph={name}")
            if len(found) != expected:
                wrong[f"{kind} of {name}"] = [f["metadata"]["name"] for f in found]
    return wrong


def assert_one_of_each_child_and_no_orphan(kubectl: Kubectl, namespace: str, names: list[str]) -> None:
    """Exactly the children each graph needs (once older generations are gone); every object that
    carries a graph's label is owned by something that exists (a graph, or a DynamoGraphComponent, a
    Deployment, a ReplicaSet of one)."""
    wait_for(lambda: not one_of_each_child(kubectl, namespace, names), timeout=60,
             what=lambda: f"one of each child: {one_of_each_child(kubectl, namespace, names)}")
    live_uids: set[str] = set()
    everything: list[dict[str, Any]] = []
    for kind in ("dg", "dgc", "deployment", "replicaset", "service", "pdb", "serviceaccount", "role",
                 "rolebinding", "pods"):
        items = kubectl.items(kind, namespace)
        everything += [item for item in items if not item["metadata"].get("deletionTimestamp")]
        live_uids |= {item["metadata"]["uid"] for item in items}
    orphans = [f"{item['kind']}/{item['metadata']['name']}" for item in everything
               if item["metadata"].get("labels", {}).get("fleetpilot.dev/graph")
               and item["kind"] != "DynamoGraph"
               and not any(ref["uid"] in live_uids for ref in item["metadata"].get("ownerReferences", []))]
    assert not orphans, orphans


def test_operator_sigkilled_at_random_points_while_graphs_change_converges(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    """20 SIGKILLs, each a random 0-2 s after a fresh start, while graphs are created, edited (image,
    replicas, bounds) and scaled. Afterwards: every graph Ready at its latest generation, exactly one of
    each child, no orphan, and Events only for real transitions (no storm from replayed reconciles)."""
    rng = random.Random(21)
    names = [f"k{i}" for i in range(4)]
    edits = 0
    for kill in range(KILLS):
        action = rng.choice(["image", "replicas", "scale"]) if kill >= len(names) else "create"
        name = names[kill] if action == "create" else rng.choice(names)
        manifest = simulator_graph(name, prefill={"replicas": 1, "scaling": {"min": 1, "max": 4}},
                                   decode={"replicas": rng.choice([1, 2]), "scaling": {"min": 1, "max": 4}})
        if action == "image":
            manifest["spec"]["engine"]["args"] = [f"--seed={kill}"]  # a pod template change: a rollout
        scaled = action == "scale" and kubectl.run(  # the component may not exist yet: a kill came first
            "scale", f"dgc/{name}-decode", f"--replicas={rng.choice([1, 2, 3])}", "-n", namespace,
            check=False).returncode == 0
        if not scaled:
            kubectl.apply(manifest, namespace)
        edits += 1
        time.sleep(rng.uniform(0.0, 2.0))
        operator.kill()
        operator.start()
    wait_for(lambda: converged(kubectl, namespace, names), timeout=180,
             what=lambda: {n: condition(graph(kubectl, namespace, n), "Ready") for n in names})
    assert operator.alive()
    assert_one_of_each_child_and_no_orphan(kubectl, namespace, names)
    # Spec and children agree: each Deployment runs what its DynamoGraphComponent asks.
    for name in names:
        for pool in ("prefill", "decode"):
            asked = kubectl.json("get", "dgc", f"{name}-{pool}", "-n", namespace)["spec"]["replicas"]
            deployment = workload_name(kubectl, namespace, "deployment", name, pool)
            assert kubectl.json("get", "deployment", deployment, "-n", namespace)["spec"]["replicas"] == asked
    events = collections.Counter((e["involvedObject"]["name"], e["reason"]) for e in kubectl.items("events", namespace)
                                 if e["involvedObject"]["kind"] == "DynamoGraph")
    print(f"\n{KILLS} kills, {edits} changes; Events per graph and reason: {dict(events)}")
    # A Ready Event per time a graph became Ready: at most once per change to it, and a restarted
    # operator replays none (it reads the condition back from the graph's status).
    assert all(count <= edits for (_, reason), count in events.items() if reason == "AllComponentsReady"), events
    assert not [key for key in events if key[1] not in ("AllComponentsReady", "Unschedulable")], events


def test_hand_edits_of_child_deployments_are_reverted(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str
) -> None:
    kubectl.apply(simulator_graph("edited"), namespace)
    wait_for(lambda: ready(kubectl, namespace, "edited"), what="Ready")
    decode = workload_name(kubectl, namespace, "deployment", "edited", "decode")  # its generation's name
    took = {}
    for what, args, check in [
        ("replicas", ["scale", f"deployment/{decode}", "--replicas=5"],
         lambda d: d["spec"]["replicas"] == 2),
        ("image", ["set", "image", f"deployment/{decode}", "engine=example.com/not-ours:1"],
         lambda d: d["spec"]["template"]["spec"]["containers"][0]["image"] != "example.com/not-ours:1"),
        ("label", ["label", f"deployment/{decode}", "fleetpilot.dev/component=hijacked", "--overwrite"],
         lambda d: d["metadata"]["labels"]["fleetpilot.dev/component"] == "decode"),
    ]:
        kubectl.run(*args, "-n", namespace)
        started = time.monotonic()
        wait_for(lambda check=check: check(kubectl.json("get", "deployment", decode, "-n", namespace)),
                 timeout=30, interval=0.1, what=f"the hand-edited {what} reverted")
        took[what] = round(time.monotonic() - started, 2)
    print(f"\nhand edits reverted after (s): {took}")
    wait_for(lambda: ready(kubectl, namespace, "edited"), timeout=90, what="Ready again")
    # Ready counts the reverted template's two pods; the hijacked image's pod is the old ReplicaSet's,
    # which the controller-manager scales away in its own time: wait for it to go, as a user would.
    def two_decode_images() -> list[str] | None:
        pods = kubectl.items("pods", namespace, "fleetpilot.dev/component=decode")
        return sorted(pod["spec"]["containers"][0]["image"] for pod in pods) if len(pods) == 2 else None

    images = wait_for(two_decode_images, timeout=60, what="the hijacked image's pod gone, two decode pods left")
    assert "example.com/not-ours:1" not in images


@pytest.fixture
def restartable(control_plane: devcluster.Cluster) -> Iterator[devcluster.Cluster]:
    """The session's control plane, whose etcd and apiserver a test may restart; healthy again afterwards."""
    yield control_plane
    wait_for(control_plane._healthy, timeout=60, what="the apiserver healthy after the test")


def scaled_events(kubectl: Kubectl, namespace: str) -> list[str]:
    events = [e for e in kubectl.items("events", namespace) if e["reason"] == "Scaled"]
    return [e["message"] for e in sorted(events, key=lambda e: (e["firstTimestamp"], e["metadata"]["name"]))]


def assert_a_chain_of_writes(messages: list[str]) -> None:
    """Each Scaled Event says `pool a→b` for what it wrote: per pool, each write starts where the one
    before ended. A write the apiserver lost would be decided again from the old count (a break in the
    chain); a write done twice would show as the same step twice."""
    last: dict[str, int] = {}
    for message in messages:
        for pool, before, after in re.findall(r"(prefill|decode) (\d+)→(\d+)", message.split(":")[0]):
            if pool in last:
                assert int(before) == last[pool], f"{pool}: {before}→{after} after {last[pool]}: {messages}"
            last[pool] = int(after)


def test_apiserver_restarts_and_etcd_outage_while_the_planner_scales(
    kubectl: Kubectl, namespace: str, planned: dict[str, Any], restartable: devcluster.Cluster,  # noqa: F811
    operator: OperatorProcess,
) -> None:
    """The planner (a real process, real Prometheus) scales up while the apiserver is restarted twice,
    then etcd goes away for 10 s. Neither the planner nor the operator is restarted: both reconnect, the
    planner's decision reaches the DynamoGraphComponents and the operator's the Deployments, and the
    chain of /scale writes has no gap and no repeat."""
    exporter = planned["exporter"]
    exporter.rate_rps = 1.0
    get = lambda: graph(kubectl, namespace, "planned")
    wait_for(lambda: condition(get(), "PlannerActive").get("status") == "True", timeout=60, what="planning")
    exporter.rate_rps = 120.0
    away = [restartable.restart("kube-apiserver")]
    time.sleep(INTERVAL_S / 2)
    away.append(restartable.restart("kube-apiserver"))
    wait_for(lambda: (r := replicas(kubectl, namespace))["prefill"] > 1 and r["decode"] > 1, timeout=4 * INTERVAL_S,
             what="the planner to scale up after the apiserver restarts")
    away.append(restartable.restart("etcd", down_s=10.0))
    restarted_at = time.time()
    exporter.rate_rps = 240.0  # more load after the outage: the planner must act on it by itself

    def settled() -> bool:
        status = get()["status"]
        decided = status.get("planner", {}).get("replicas", {})
        return (condition(get(), "PlannerActive").get("status") == "True"
                and status["planner"]["lastDecisionTime"] > time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                          time.gmtime(restarted_at))
                and decided == replicas(kubectl, namespace))

    wait_for(settled, timeout=6 * INTERVAL_S, what=lambda: f"a decision after etcd's return, written; "
             f"planner log:\n{planned['log'].read_text()[-3000:]}")
    for pool in replicas(kubectl, namespace):
        deployment = workload_name(kubectl, namespace, "deployment", "planned", pool)
        wait_for(lambda deployment=deployment, pool=pool: kubectl.json("get", "deployment", deployment, "-n", namespace)
                 ["spec"]["replicas"] == replicas(kubectl, namespace)[pool], timeout=60,
                 what=f"the operator to run the {pool} count the planner wrote")
    assert operator.alive() and planned["alive"]()
    assert_a_chain_of_writes(scaled_events(kubectl, namespace))
    print(f"\ncontrol plane away for {', '.join(f'{s:.1f}' for s in away)} s; writes: {scaled_events(kubectl, namespace)}")


@pytest.fixture
def planner_replicas() -> Iterator[list[Replica]]:
    """Planner replicas a test starts; stopped afterwards (a frozen one is thawed first)."""
    started: list[Replica] = []
    yield started
    for replica in started:
        if replica.alive():
            assert replica.process is not None
            os.killpg(replica.process.pid, signal.SIGCONT)
            replica.terminate()


def test_a_frozen_planner_leader_never_acts_after_the_standby_took_over(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, planner_replicas: list[Replica], tmp_path: Path,
    planned_metrics: dict[str, Any],  # noqa: F811
) -> None:
    """The leader is frozen (SIGSTOP: a long GC pause, a stalled node) as the load rises, in the middle of
    its interval. The standby takes the Lease and scales; the old leader, thawed, must not plan or write
    once more — it sees its renew deadline long past and exits — so no decision is actuated twice."""
    exporter, url = planned_metrics["exporter"], planned_metrics["prometheus"].url
    exporter.rate_rps = 1.0
    pair = start_pair(planner_replicas, kubectl, tmp_path, names=("planner-x", "planner-y"), args=[
        "planner", "run", "--prometheus-url", url, "--namespace", namespace, "--startup-seconds", "10",
        "--leader-elect", "--lease-namespace", namespace])
    first = wait_for(lambda: holder(kubectl, namespace, "fleetpilot-planner"), timeout=60, what="a leader")
    leader, standby = pair[first], next(r for r in pair.values() if r.pod_name != first)
    wait_for(lambda: condition(graph(kubectl, namespace, "planned"), "PlannerActive").get("status") == "True",
             timeout=60, what="the leader planning")
    assert leader.process is not None
    exporter.rate_rps = 120.0
    time.sleep(INTERVAL_S / 2)  # mid-interval
    plans_before = leader.log().count("planned: {")
    os.killpg(leader.process.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    wait_for(lambda: holder(kubectl, namespace, "fleetpilot-planner") == standby.pod_name, timeout=30, interval=0.1,
             what="the standby to take the Lease")
    took = time.monotonic() - frozen_at
    wait_for(lambda: (r := replicas(kubectl, namespace))["prefill"] > 1 and r["decode"] > 1, timeout=60,
             what="the new leader to scale up")
    os.killpg(leader.process.pid, signal.SIGCONT)
    assert leader.process.wait(timeout=30) == 1, leader.log()[-3000:]
    print(f"\nplanner: Lease handed over {took:.1f}s after the leader froze")
    assert leader.log().count("planned: {") == plans_before, leader.log()[-3000:]
    assert "stopped leading" in leader.log()
    assert_a_chain_of_writes(scaled_events(kubectl, namespace))


def test_stale_metrics_in_a_real_prometheus_hold_and_recover(
    kubectl: Kubectl, namespace: str, planned: dict[str, Any]  # noqa: F811
) -> None:
    """The frontends stop being scraped (their target is down) while Prometheus runs: its series go stale,
    the planner's queries come back empty, replicas hold with the reason, and planning resumes with data."""
    exporter = planned["exporter"]
    exporter.rate_rps = 60.0
    get = lambda: graph(kubectl, namespace, "planned")
    wait_for(lambda: replicas(kubectl, namespace)["prefill"] > 1, timeout=6 * INTERVAL_S, what="scaled up")
    wait_for(lambda: condition(get(), "PlannerActive").get("status") == "True", timeout=60, what="planning")
    exporter.pause()
    held = wait_for(lambda: condition(get(), "PlannerActive").get("reason") == "NoMetrics"
                    and condition(get(), "PlannerActive"), timeout=8 * INTERVAL_S, what="NoMetrics on stale series")
    assert "no usable fleetpilot_frontend_requests_started_total" in held["message"], held
    before = replicas(kubectl, namespace)
    wait_for(lambda: get()["status"]["planner"]["lastDecisionTime"] > held["lastTransitionTime"], timeout=3 * INTERVAL_S,
             what="another interval held")
    assert replicas(kubectl, namespace) == before
    exporter.resume()
    wait_for(lambda: condition(get(), "PlannerActive").get("status") == "True", timeout=6 * INTERVAL_S,
             what="planning again once the series are back")
