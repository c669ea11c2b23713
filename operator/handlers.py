"""kopf wiring: watches in, the reconciler's cache filled and graph keys onto its queue.

Handlers here decide nothing. For every kind the operator reads (cache.WATCHED), kopf lists and
then watches it, and two handlers see each event:

- an **index** handler keeps the object's projection in kopf's in-memory index, keyed by
  (namespace, graph): the cache the reconciler reads instead of the API. kopf runs no other
  handler until every index has finished its first list, so no reconcile ever sees half the world;
- an **event** handler enqueues the graph: a change to the graph at once; a change to a child
  (its DynamoGraphComponent, Deployment, Service, PodDisruptionBudget, ServiceAccount, Role,
  RoleBinding, ConfigMap, NetworkPolicy or Pod) after a short pause, so a burst of them costs one reconcile, except
  what a user asked for — a spec change such as `kubectl scale`, a child deleted or relabelled by
  hand — which goes at once and ahead of status-only events in the queue (`GraphReconciler.priority_of`).

**The API server selects what the operator sees.** Every child kind is watched with a
`labelSelector` (kopf's `settings.watching.label_selectors`, sent on its LIST and WATCH requests),
so other teams' Pods and ConfigMaps never reach the process: its memory and CPU follow what it owns.
A child that loses a selected label stops matching, and the API server then sends DELETED for it
(ADR 0071): its graph's next pass goes at once, finds the child missing, is refused the create,
reads the object, finds its own owner reference and applies it back, labels included.

Only index and event handlers are used, so kopf writes nothing onto user objects: no finalizers,
no annotations, no status fields of its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import kopf

from fleetpilot import kube
from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api
from fleetpilot.operator import cache, reconciler, render, workqueue

CHILD_EVENT_DELAY_SECONDS = float(os.environ.get("FLEETPILOT_CHILD_EVENT_DELAY_SECONDS", "0.3"))
#: What the API server sends of each child kind: what the operator made. Pods are selected on the graph
#: label alone: the Deployment's pod template carries it, and kubectl-made test pods may omit managed-by.
CHILD_SELECTOR = f"{contract.LABEL_GRAPH},{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
POD_SELECTOR = contract.LABEL_GRAPH


def label_selector(kind: str) -> str | None:
    """The labelSelector of a kind's LIST and WATCH; None for the graphs, which are all the operator's to read."""
    return None if kind == api.GRAPH_KIND else POD_SELECTOR if kind == "Pod" else CHILD_SELECTOR


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base: kopf builds one on every event (a deep copy of the object and a walk against the last
    one) for on.create/on.update handlers and daemons, and the operator registers neither. At 1,000 graphs
    that copy and walk was 8% of the operator's cold-start CPU (`benchmarks/diffbase_bench.py`)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return kopf.BodyEssence()  # as built: kopf sees no change, which nothing of ours reads

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass  # nothing written onto user objects (kopf's default keeps it in an annotation)


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf's settings for an operator of index and event handlers only."""
    settings.posting.enabled = False  # our Events come from the reconciler, with our reasons
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.persistence.diffbase_storage = NoDiffBase()
    for kind, resource in cache.WATCHED.items():
        selector = label_selector(kind)
        if selector is not None:
            settings.watching.label_selectors[resource] = selector


@kopf.on.startup()
async def start_reconciler(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    configure(settings)
    # The indexes exist (empty) before startup handlers run, and fill as kopf's watches list.
    indexes = {cache.index_id(kind): kwargs[cache.index_id(kind)] for kind in cache.WATCHED}
    memo.reconciler = reconciler.GraphReconciler(
        kube.KubeApi(),
        cache=cache.GraphCache(indexes),
        settings=render.RenderSettings(
            fleetpilot_image=os.environ.get("FLEETPILOT_IMAGE", render.RenderSettings.fleetpilot_image),
            # `fleetpilot operator run --monitoring-namespace/--control-plane-namespace` (operator/main.py).
            monitoring_namespace=memo.get("monitoring_namespace", render.RenderSettings.monitoring_namespace),
            control_plane_namespace=memo.get("control_plane_namespace", render.RenderSettings.control_plane_namespace),
        ),
        workers=int(memo.get("workers", 8)),
        resync_seconds=float(os.environ.get("FLEETPILOT_RESYNC_SECONDS", "300")),
    )
    await memo.reconciler.start()


@kopf.on.cleanup()
async def stop_reconciler(memo: kopf.Memo, **_: Any) -> None:
    graph_reconciler: reconciler.GraphReconciler | None = memo.get("reconciler")
    if graph_reconciler is not None:
        await graph_reconciler.stop()
        await graph_reconciler.kube.aclose()


def enqueue_delay(kind: str, priority: int) -> float:
    """Seconds a watch event of `kind` waits before its graph's pass: none for the graph itself or for what
    a user asked for (`workqueue.HIGH`), a short pause for the rest, so a burst of them costs one pass."""
    return 0.0 if kind == api.GRAPH_KIND or priority == workqueue.HIGH else CHILD_EVENT_DELAY_SECONDS


def graph_key(kind: str, event_type: str | None, body: Mapping[str, Any]) -> cache.IndexKey | None:
    """The graph a watch event concerns: the graph's own name, or the one a child's label names. A child
    that lost its graph label leaves the watch as DELETED; its controller owner reference still names it."""
    meta = body.get("metadata", {})
    key = cache.index_key(kind, meta.get("namespace") or "", meta.get("name", ""), meta.get("labels") or {})
    if key is None and event_type == "DELETED":
        key = cache.owning_graph(body)
    return key


def _register(kind: str) -> None:
    """An index handler and an event handler for one kind."""
    group, version, plural = cache.WATCHED[kind]

    # async, though it awaits nothing: kopf runs a sync handler in a thread pool, and handing every
    # watch event to a thread and back was a tenth of the operator's cold-start CPU at 300 graphs.
    async def index(body: kopf.Body, name: str, namespace: str | None, labels: Mapping[str, str],
                    **_: Any) -> dict[cache.IndexKey, cache.Manifest] | None:
        key = cache.index_key(kind, namespace or "", name, labels)
        return None if key is None else {key: cache.projection(kind, body)}

    async def changed(event: Mapping[str, Any], body: kopf.Body, memo: Any, **_: Any) -> None:
        key = graph_key(kind, event.get("type"), body)
        if key is None:
            return
        memo.reconciler.cache.observe(kind, body, deleted=event.get("type") == "DELETED")
        # Children change in bursts (a rollout touches pods, ReplicaSets and the Deployment many times):
        # wait a moment so one reconcile sees the whole burst instead of one reconcile per event. What a
        # user asked for (`kubectl scale`, a child deleted by hand) neither waits nor queues behind what
        # only reports (`GraphReconciler.priority_of`).
        priority = memo.reconciler.priority_of(kind, event.get("type"), body)
        memo.reconciler.enqueue(*key, after=enqueue_delay(kind, priority), priority=priority)

    # No client-side `labels=` filter: the API server applies `label_selector(kind)`, and a DELETED event
    # for a child that just lost a label would not pass one.
    kopf.index(group, version, plural, id=cache.index_id(kind))(index)
    kopf.on.event(group, version, plural, id=f"{kind.lower()}_changed")(changed)


for _kind in cache.WATCHED:
    _register(_kind)
