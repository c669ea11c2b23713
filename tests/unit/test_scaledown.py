"""Which replica a scale-down removes (operator/scaledown.py): the least loaded, on purpose.

The operator writes each Ready pod's `controller.kubernetes.io/pod-deletion-cost` from the requests
the frontends have in flight on it; the ReplicaSet controller then removes the cheapest. `removed`
below ranks pods as kube-controller-manager's ReplicaSet controller does for the parts that matter
here (not Ready before Ready, then the lower deletion cost, then the newer pod), so the tests show
which pods Kubernetes would take away.
"""

from __future__ import annotations

from typing import Any

from fleetpilot.api import contract
from fleetpilot.operator import scaledown


def pod(name: str, *, ready: bool = True, created: int = 0, terminating: bool = False,
        cost: int | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": f"2026-01-01T00:00:{created:02d}Z"}
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    if cost is not None:
        meta["annotations"] = {contract.ANNOTATION_DELETION_COST: str(cost)}
    return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def removed(pods: list[dict[str, Any]], costs: dict[str, int], count: int) -> list[str]:
    """The `count` pods a ReplicaSet scaled down by `count` deletes, after the operator wrote `costs`."""

    def rank(p: dict[str, Any]) -> tuple[int, int, str]:
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
        cost = costs.get(p["metadata"]["name"],
                         int(p["metadata"].get("annotations", {}).get(contract.ANNOTATION_DELETION_COST, 0)))
        return (1 if ready else 0, cost, _newer_first(p["metadata"]["creationTimestamp"]))

    active = [p for p in pods if "deletionTimestamp" not in p["metadata"]]
    return [p["metadata"]["name"] for p in sorted(active, key=rank)[:count]]


def _newer_first(stamp: str) -> str:
    return "".join(chr(255 - ord(c)) for c in stamp)


def test_the_least_loaded_replicas_go_not_the_newest() -> None:
    pods = [pod("a", created=1), pod("b", created=2), pod("c", created=3), pod("d", created=4)]
    load = {"a": 9.0, "b": 0.0, "c": 4.0, "d": 7.0}
    assert removed(pods, {}, 2) == ["d", "c"]  # left to itself the ReplicaSet takes the newest
    costs = scaledown.deletion_costs(pods, load)
    assert costs == {"a": 9, "b": 0, "c": 4, "d": 7}
    assert removed(pods, costs, 2) == ["b", "c"]  # the fewest streams wait for a drain


def test_a_worker_no_frontend_knows_is_idle() -> None:
    pods = [pod("busy"), pod("quiet")]
    assert scaledown.deletion_costs(pods, {"busy": 3.0}) == {"busy": 3, "quiet": 0}


def test_pods_not_ready_or_terminating_get_no_cost_and_go_first_anyway() -> None:
    pods = [pod("starting", ready=False, created=1), pod("going", terminating=True), pod("a", created=2),
            pod("b", created=3)]
    costs = scaledown.deletion_costs(pods, {"a": 1.0, "b": 5.0, "starting": 0.0})
    assert costs == {"a": 1, "b": 5}
    assert removed(pods, costs, 2) == ["starting", "a"]


def test_loads_summed_over_frontends_are_rounded_up_and_capped() -> None:
    costs = scaledown.deletion_costs([pod("a"), pod("b")], {"a": 0.5, "b": 1e12})
    assert costs == {"a": 1, "b": scaledown.MAX_COST}


def test_only_costs_that_changed_are_written() -> None:
    pods = [pod("a", cost=3), pod("b", cost=1), pod("c")]
    assert scaledown.stale(pods, {"a": 3, "b": 0, "c": 0}) == {"b": 0, "c": 0}
