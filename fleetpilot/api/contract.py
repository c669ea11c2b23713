"""The names every part of fleetpilot agrees on: labels, child names, field managers, conditions, the clock.

The operator writes these names, the frontend's discovery, the planner, the chart's PodMonitor and
the e2e pod runner read them; each is defined here once so that none of them can drift. Pure: no
I/O, and nothing here knows a Kubernetes client.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping, Sequence
from typing import Any

# -- labels ----------------------------------------------------------------------------------------

#: Every object the operator makes for a graph carries the graph's name here; watches select on it.
LABEL_GRAPH = "fleetpilot.dev/graph"
#: frontend, prefill, decode or aggregated.
LABEL_COMPONENT = "fleetpilot.dev/component"
#: The serving engine (vllm, sglang, trtllm, simulator): the e2e pod runner takes the simulator's pods.
LABEL_FRAMEWORK = "fleetpilot.dev/framework"
#: Set on the dev cluster's kwok nodes.
LABEL_SIMULATED_NODE = "fleetpilot.dev/simulated-node"
#: The generation of a worker pod: a short hash of what makes its KV cache compatible with another's
#: (engine, image, model, arguments). The frontend pairs a prefill and a decode of one generation only.
LABEL_GENERATION = "fleetpilot.dev/generation"
#: A multinode replica's pods: `leader` (serves HTTP, rank 0) or `worker` (the other ranks, never routed to).
LABEL_GROUP_ROLE = "fleetpilot.dev/group-role"
GROUP_LEADER = "leader"
GROUP_WORKER = "worker"
#: The group a multinode replica's pod belongs to: its leader pod's name (on the leader once it is admitted).
LABEL_GROUP = "fleetpilot.dev/group"
#: Set by the StatefulSet controller (Kubernetes ≥ 1.28) on each pod: its ordinal, a worker's rank.
LABEL_POD_INDEX = "apps.kubernetes.io/pod-index"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_APP_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
PART_OF = "fleetpilot"

# -- metrics -----------------------------------------------------------------------------------------

#: The frontend measures each request's arrival burst as the requests that arrived in the trailing
#: window this long, per second; the planner sizes prefill for its SLA percentile. Seconds: longer
#: than any TTFT target people set (0.2-2 s), so a burst this long cannot be queued through, and
#: short enough to see the bursts of a minute's traffic.
BURST_WINDOW_S = 5.0
#: Bucket bounds (tokens) of the frontend's input- and output-length histograms, the last one +Inf as
#: Prometheus has it: the planner sizes from the length mix they give (`planner/lengths.py`), and the
#: backtest histograms a trace's requests with the same bounds.
TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, math.inf)
#: Bucket bounds (seconds) of the frontend's latency histograms: 15% apart from 1 ms to 60 s, so a
#: percentile read from them lands within about 7% of the exact one, finer than any SLA people set.
LATENCY_BUCKETS = tuple(round(0.001 * 1.15**i, 6) for i in range(79)) + (60.0,)


def latency_bucket(target_s: float) -> float:
    """The latency bucket bound nearest (by ratio) to an SLA target: the requests in its bucket met the
    target, as far as the histogram can tell (the alert rules' burn rates count them so)."""
    return min(LATENCY_BUCKETS, key=lambda bound: abs(math.log(bound / target_s)))

#: Requests a frontend holds because no worker could take them yet (a pool at zero, starting): the
#: demand the planner wakes a pool scaled to zero for, read from the frontends directly.
HELD_METRIC = "fleetpilot_frontend_held_requests"
#: Seconds since a frontend last received a request (since it started, before the first): the
#: planner's idle clock for scale to zero.
IDLE_METRIC = "fleetpilot_frontend_seconds_since_last_request"
#: Requests in flight per worker pod as a frontend counts them (label `worker`: the pod's name): the
#: operator removes the least loaded replica first on a scale-down.
WORKER_LOAD_METRIC = "fleetpilot_frontend_worker_inflight_requests"
INFLIGHT_METRIC = "fleetpilot_frontend_inflight_requests"

# -- annotations -----------------------------------------------------------------------------------

#: A digest of the manifest the operator last applied to a child: a child whose digest and fields
#: still match what the graph asks for needs no write.
ANNOTATION_APPLIED = "fleetpilot.dev/applied-digest"
#: Kubernetes' own: of a ReplicaSet's Ready pods, the one with the lowest cost is removed first on a
#: scale-down. The operator sets it from the frontends' per-worker load before lowering replicas.
ANNOTATION_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
#: On a multinode group's leader pod: the uids of the worker pods the group formed with. A worker
#: that is not among them (replaced) or one of them gone means the group lost a member: it restarts.
ANNOTATION_GROUP_MEMBERS = "fleetpilot.dev/group-members"
#: The scheduling gate a multinode group's leader pod is created with; the operator lifts it once the
#: group's workers exist, so that the whole group goes to the scheduler at once.
GROUP_SCHEDULING_GATE = "fleetpilot.dev/group-admission"

# -- identities: field managers, Lease names, Event sources ----------------------------------------

OPERATOR = "fleetpilot-operator"
PLANNER = "fleetpilot-planner"
#: `fleetpilot profile --apply` writes the profile's ConfigMap as this field manager.
PROFILER = "fleetpilot-profiler"
#: The operator's children say they are managed by it (`app.kubernetes.io/managed-by`).
MANAGED_BY = OPERATOR

WORKER_ROLES = ("prefill", "decode", "aggregated")

#: The frontend's gauge of requests in flight by phase, which the planner's fast path reads (from the
#: frontends directly, or through Prometheus): in the prefill hop, prefilled and waiting for the first
#: token (a decode slot, the KV transfer), streaming.
PHASE_METRIC = "fleetpilot_frontend_requests_in_phase"
PHASES = ("prefill", "first_token", "decoding")
#: The frontend's counter of requests received (the offered load): the fast path reads its rise between
#: ticks as the arrivals' trend.
STARTED_METRIC = "fleetpilot_frontend_requests_started"


def child_name(graph: str, component: str) -> str:
    """`<graph>-<component>`: the DynamoGraphComponent and every object it owns."""
    return f"{graph}-{component}"


def graph_selector(graph: str) -> dict[str, str]:
    return {LABEL_GRAPH: graph}


def generation_child_name(graph: str, component: str, generation: str) -> str:
    """`<graph>-<component>-<generation>`: a worker component's Deployment and PDB of one generation."""
    return f"{graph}-{component}-{generation}"


def is_group_worker(pod: dict[str, Any]) -> bool:
    """A non-leader pod of a multinode replica: it holds ranks of the leader's engine and serves nobody."""
    return bool(pod.get("metadata", {}).get("labels", {}).get(LABEL_GROUP_ROLE) == GROUP_WORKER)


def pod_http_url(pod: dict[str, Any], *, default_port: int = 8000) -> str | None:
    """`http://<pod IP>:<its "http" port>` for a Ready pod that is not going away, else None: where a
    frontend sends requests to a worker, and where the planner reads a frontend's /metrics."""
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    ip = status.get("podIP")
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
    if not ip or not ready or meta.get("deletionTimestamp"):
        return None
    port = default_port
    for container in pod.get("spec", {}).get("containers", []):
        for declared in container.get("ports", []):
            if declared.get("name") == "http":
                port = int(declared["containerPort"])
    return f"http://{ip}:{port}"


# -- time ------------------------------------------------------------------------------------------

def rfc3339(moment: datetime.datetime) -> str:
    """Kubernetes' metav1.Time: UTC, whole seconds."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float:
    """metav1.Time (whole seconds or fractions, `Z` or an offset) as seconds since the epoch."""
    return datetime.datetime.fromisoformat(text).timestamp()  # Python 3.11 reads "Z"


def now_rfc3339() -> str:
    return rfc3339(datetime.datetime.now(datetime.UTC))


# -- conditions ------------------------------------------------------------------------------------

def transition_time(previous: Mapping[str, Any] | None, status: str, now: str) -> str:
    """lastTransitionTime of a condition now `status`: kept while the status stays, `now` when it changes."""
    if previous is not None and previous.get("status") == status and previous.get("lastTransitionTime"):
        return str(previous["lastTransitionTime"])
    return now


def find_condition(conditions: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    for condition in conditions:
        if condition.get("type") == type_:
            return condition
    return None


def condition(type_: str, status: bool | str, reason: str, message: str, *, generation: int,
              previous: Sequence[Mapping[str, Any]] = (), now: str | None = None) -> dict[str, Any]:
    """One condition as the API stores it, keeping lastTransitionTime from `previous` when unchanged."""
    value = status if isinstance(status, str) else ("True" if status else "False")
    return {
        "type": type_, "status": value, "reason": reason, "message": message[:1024],
        "lastTransitionTime": transition_time(find_condition(previous, type_), value, now or now_rfc3339()),
        "observedGeneration": generation,
    }
