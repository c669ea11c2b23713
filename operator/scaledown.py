"""Which replica goes on a scale-down: the least loaded, chosen on purpose.

Where it sits: a pure step of the reconcile, before a Deployment's replicas go down. A ReplicaSet
that shrinks removes, among its Ready pods, the one with the lowest
`controller.kubernetes.io/pod-deletion-cost` first (Kubernetes ≥ 1.22; beta, on by default), and
without one whichever its ranking happens to put first (the newest). So before lowering replicas
the operator writes each Ready pod's cost: the requests in flight on it as the graph's frontends
count them (`fleetpilot_frontend_worker_inflight_requests`, read by `loads.py`). The least busy pod
goes, and the fewest streams wait for a drain. Pure: pods and loads in, costs out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from fleetpilot.api import contract

Manifest = dict[str, Any]
#: The annotation is an int32.
MAX_COST = 2**31 - 1


def _ready(pod: Manifest) -> bool:
    conditions = pod.get("status", {}).get("conditions", []) or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def deletion_costs(pods: Iterable[Manifest], load: Mapping[str, float]) -> dict[str, int]:
    """The cost to write on each Ready, not terminating pod: its requests in flight (0 when no frontend
    knows it). Pods not Ready are left alone: the ReplicaSet removes them before any Ready one."""
    costs: dict[str, int] = {}
    for pod in pods:
        meta = pod.get("metadata", {})
        if meta.get("deletionTimestamp") or not _ready(pod):
            continue
        costs[meta["name"]] = min(MAX_COST, math.ceil(max(0.0, load.get(meta["name"], 0.0))))
    return costs


def stale(pods: Iterable[Manifest], costs: Mapping[str, int]) -> dict[str, int]:
    """The costs that differ from what the pods carry now: only those need a write."""
    current = {p["metadata"]["name"]: p["metadata"].get("annotations", {}).get(contract.ANNOTATION_DELETION_COST)
               for p in pods}
    return {name: cost for name, cost in costs.items() if current.get(name) != str(cost)}
