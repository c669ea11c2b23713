"""kopf wiring: watch events in, graph keys onto the reconciler's queue.

Handlers here decide nothing. Any change to a DynamoGraph, or to a child carrying its
`fleetpilot.dev/graph` label (DynamoGraphComponent, Deployment, Pod), enqueues that graph; the
reconciler does the rest. Only event handlers are used, so kopf writes nothing onto user
objects: no finalizers, no annotations, no status fields of its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import kopf

from fleetpilot import kube
from fleetpilot.api import v1alpha1 as api
from fleetpilot.operator import reconciler, render

CHILD_EVENT_DELAY_SECONDS = float(os.environ.get("FLEETPILOT_CHILD_EVENT_DELAY_SECONDS", "0.3"))
CHILD_SELECTOR: dict[str, Any] = {
    render.LABEL_GRAPH: kopf.PRESENT,
    "app.kubernetes.io/managed-by": render.MANAGED_BY,
}


@kopf.on.startup()
async def start_reconciler(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.enabled = False  # our Events come from the reconciler, with our reasons
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    memo.reconciler = reconciler.GraphReconciler(
        kube.KubeApi(),
        settings=render.RenderSettings(
            fleetpilot_image=os.environ.get("FLEETPILOT_IMAGE", render.RenderSettings.fleetpilot_image)
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


@kopf.on.event(api.GROUP, api.VERSION, api.GRAPH_PLURAL)
async def graph_changed(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    if namespace:
        memo.reconciler.enqueue(namespace, name)


@kopf.on.event(api.GROUP, api.VERSION, api.COMPONENT_PLURAL, labels=CHILD_SELECTOR)
@kopf.on.event("apps", "v1", "deployments", labels=CHILD_SELECTOR)
@kopf.on.event("", "v1", "pods", labels={render.LABEL_GRAPH: kopf.PRESENT})
async def child_changed(labels: Mapping[str, str], namespace: str | None, memo: Any, **_: Any) -> None:
    # Children change in bursts (a rollout touches pods, ReplicaSets and the Deployment many times):
    # wait a moment so one reconcile sees the whole burst instead of one reconcile per event.
    if namespace:
        memo.reconciler.enqueue(namespace, labels[render.LABEL_GRAPH], after=CHILD_EVENT_DELAY_SECONDS)
