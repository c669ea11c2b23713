"""The level-triggered reconcile loop for DynamoGraphs.

Watch events (from kopf) only say "look at graph ns/name again"; they land in a de-duplicating work
queue, and a few workers each take one graph at a time, read the world, render the desired objects
(render.py), apply them server-side, delete what the graph no longer needs (only objects it owns),
and write status (status.py). A graph is never reconciled by two workers at once; events that
arrive meanwhile fold into one more pass. Errors are retried with exponential backoff, and every
graph is looked at again after `resync_seconds` even if nothing happened.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any

import pydantic

from fleetpilot import kube as kube_mod
from fleetpilot.api import v1alpha1 as api
from fleetpilot.operator import metrics, render, status

logger = logging.getLogger("fleetpilot.operator")

Key = tuple[str, str]  # (namespace, name)
Manifest = dict[str, Any]

# Kinds a component may own, listed each pass to find what to apply, adopt-check and prune.
CHILD_KINDS = ("Deployment", "Service", "PodDisruptionBudget", "ServiceAccount", "Role", "RoleBinding", "ConfigMap")


class NameConflict(Exception):
    """An object we would create already exists and belongs to someone else: we leave it alone."""


def controller_uid(obj: Manifest) -> str | None:
    for ref in obj.get("metadata", {}).get("ownerReferences", []):
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def describe_validation_error(error: pydantic.ValidationError) -> str:
    """'spec.components.prefill.gpus: Input should be ...' for each problem, field first."""
    parts = []
    for problem in error.errors():
        where = ".".join(str(p) for p in problem["loc"])
        parts.append(f"{where}: {problem['msg']}")
    return "; ".join(parts)


class GraphReconciler:
    def __init__(
        self,
        kube: kube_mod.KubeApi,
        *,
        settings: render.RenderSettings | None = None,
        workers: int = 8,
        resync_seconds: float = 300.0,
        max_backoff_seconds: float = 60.0,
    ) -> None:
        self.kube = kube
        self.settings = settings or render.RenderSettings()
        self.workers = workers
        self.resync_seconds = resync_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._active: set[Key] = set()
        self._dirty: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []

    # -- queue -------------------------------------------------------------------------------------------

    def enqueue(self, namespace: str, name: str, *, after: float = 0.0) -> None:
        key = (namespace, name)
        if after > 0:
            timer = self._timers.pop(key, None)
            if timer is not None and timer.when() <= asyncio.get_running_loop().time() + after:
                self._timers[key] = timer  # an earlier wake-up is already planned
                return
            if timer is not None:
                timer.cancel()
            self._timers[key] = asyncio.get_running_loop().call_later(after, self._wake, key)
            return
        if key in self._active:
            self._dirty.add(key)  # fold into one more pass after the running one
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)
            metrics.QUEUE_DEPTH.set(len(self._queued))

    def _wake(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.enqueue(*key)

    def idle(self) -> bool:
        return not self._queued and not self._active and not self._dirty

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(), name=f"reconcile-worker-{i}") for i in range(self.workers)]

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            metrics.QUEUE_DEPTH.set(len(self._queued))
            self._active.add(key)
            try:
                with metrics.RECONCILE_SECONDS.time():
                    await self.reconcile(*key)
                metrics.RECONCILES.labels("ok").inc()
                self._failures.pop(key, None)
                self.enqueue(*key, after=self.resync_seconds)
            except Exception as error:  # noqa: BLE001 - a bad graph or a flaky API must never stop the operator
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                metrics.RECONCILES.labels("error").inc()
                delay = min(0.5 * 2 ** (failures - 1), self.max_backoff_seconds)
                # The API saying no is routine (a namespace terminating, a webhook down): no traceback.
                log = logger.warning if isinstance(error, kube_mod.ApiError) else logger.exception
                log("reconcile %s/%s failed (attempt %d): %s; retrying in %.1fs", *key, failures, error, delay)
                self.enqueue(*key, after=delay)
            finally:
                self._active.discard(key)
                if key in self._dirty:
                    self._dirty.discard(key)
                    self.enqueue(*key)

    # -- one pass ----------------------------------------------------------------------------------------

    async def reconcile(self, namespace: str, name: str) -> None:
        try:
            body = await self.kube.get("DynamoGraph", namespace, name)
        except kube_mod.ApiError as error:
            if error.not_found:
                metrics.forget_graph(namespace, name)
                return  # deleted: the garbage collector removes what we owned
            raise
        if body["metadata"].get("deletionTimestamp"):
            metrics.forget_graph(namespace, name)
            return
        try:
            graph = api.DynamoGraph.model_validate(body)
        except pydantic.ValidationError as error:
            # The CRD schema rejects almost everything; this catches objects stored before it did.
            await self._write_status(body, status.Observation(
                generation=body["metadata"].get("generation", 0), components=[],
                error=("InvalidSpec", describe_validation_error(error)),
            ), endpoint=None)
            return

        try:
            observation = await self._converge(graph)
        except NameConflict as conflict:
            observation = status.Observation(
                generation=graph.metadata.generation, components=[], error=("NameConflict", str(conflict))
            )
        await self._write_status(body, observation, endpoint=render.endpoint(graph))

    async def _converge(self, graph: api.DynamoGraph) -> status.Observation:
        namespace, name, uid = graph.metadata.namespace, graph.metadata.name, graph.metadata.uid
        wanted = render.components_of(graph)
        graph_labels = {render.LABEL_GRAPH: name}

        components = {c["metadata"]["name"]: c for c in await self.kube.list("DynamoGraphComponent", namespace, labels=graph_labels)}
        children: dict[tuple[str, str], Manifest] = {}
        for kind, items in zip(CHILD_KINDS, await asyncio.gather(
            *(self.kube.list(kind, namespace, labels=graph_labels) for kind in CHILD_KINDS)
        )):
            for item in items:
                children[(kind, item["metadata"]["name"])] = item

        observed: list[status.ComponentObservation] = []
        keep: set[tuple[str, str]] = set()
        for component in wanted:
            dgc = await self._ensure_component(graph, component, components.get(render.child_name(name, component)))
            requested = int(dgc["spec"]["replicas"])
            replicas = render.effective_replicas(graph, component, requested)
            owner = render.OwnerRef(api.API_VERSION, api.COMPONENT_KIND, dgc["metadata"]["name"], dgc["metadata"]["uid"])
            deployment: Manifest | None = None
            for manifest in render.workload(graph, component, replicas=replicas, owner=owner, settings=self.settings):
                key = (manifest["kind"], manifest["metadata"]["name"])
                keep.add(key)
                applied = await self._apply_owned(manifest, owner.uid, children.get(key))
                if manifest["kind"] == "Deployment":
                    deployment = applied
            await self._write_component_status(dgc, deployment)
            observed.append(status.ComponentObservation(
                name=component, desired=replicas, deployment=deployment,
                clamped_from=requested if requested != replicas else None,
            ))

        await self._prune(graph, uid, components, children, keep, wanted)

        pods = await self.kube.list("Pod", namespace, labels=graph_labels)
        capacity = None
        if status.unschedulable(pods):
            nodes, bound = await asyncio.gather(
                self.kube.list("Node"),
                self.kube.list("Pod", field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"),
            )
            capacity = status.gpu_capacity(nodes, bound)
        return status.Observation(generation=graph.metadata.generation, components=observed, pods=pods, capacity=capacity)

    async def _ensure_component(
        self, graph: api.DynamoGraph, component: api.ComponentName, existing: Manifest | None
    ) -> Manifest:
        """Create the DynamoGraphComponent once; afterwards only its bounds and labels are ours."""
        if existing is None:
            try:
                created = await self.kube.create(render.component_object(graph, component, with_replicas=True))
                metrics.APPLIES.labels(api.COMPONENT_KIND).inc()
                return created
            except kube_mod.ApiError as error:
                if not error.conflict:
                    raise
                existing = await self.kube.get("DynamoGraphComponent", graph.metadata.namespace,
                                               render.child_name(graph.metadata.name, component))
        if controller_uid(existing) != graph.metadata.uid:
            raise NameConflict(
                f"DynamoGraphComponent {existing['metadata']['name']} exists and is not owned by this graph;"
                " delete or rename it"
            )
        desired = render.component_object(graph, component, with_replicas=False)
        if not _subset(desired["spec"], existing["spec"]) or not _subset(desired["metadata"]["labels"],
                                                                          existing["metadata"].get("labels", {})):
            metrics.APPLIES.labels(api.COMPONENT_KIND).inc()
            return await self.kube.apply(desired)
        return existing

    async def _apply_owned(self, manifest: Manifest, owner_uid: str, existing: Manifest | None) -> Manifest:
        """Apply a child we own; refuse to adopt an object somebody else made with the same name."""
        if existing is None:
            try:
                metrics.APPLIES.labels(manifest["kind"]).inc()
                return await self.kube.create(manifest)
            except kube_mod.ApiError as error:
                if not error.conflict:
                    raise
                existing = await self.kube.get(manifest["kind"], manifest["metadata"]["namespace"],
                                               manifest["metadata"]["name"])
        if controller_uid(existing) != owner_uid:
            raise NameConflict(
                f"{manifest['kind']} {manifest['metadata']['name']} exists and is not owned by this graph;"
                " delete or rename it"
            )
        metrics.APPLIES.labels(manifest["kind"]).inc()
        return await self.kube.apply(manifest)

    async def _prune(
        self,
        graph: api.DynamoGraph,
        graph_uid: str,
        components: dict[str, Manifest],
        children: dict[tuple[str, str], Manifest],
        keep: set[tuple[str, str]],
        wanted: list[api.ComponentName],
    ) -> None:
        """Delete what this graph made and no longer wants, and nothing else."""
        wanted_names = {render.child_name(graph.metadata.name, c) for c in wanted}
        our_components = {c["metadata"]["uid"] for c in components.values() if controller_uid(c) == graph_uid}
        for dgc_name, dgc in components.items():
            if dgc_name not in wanted_names and controller_uid(dgc) == graph_uid:
                logger.info("deleting %s/%s: component removed from the graph", graph.metadata.namespace, dgc_name)
                await self.kube.delete("DynamoGraphComponent", graph.metadata.namespace, dgc_name,
                                       uid=dgc["metadata"]["uid"])
        for (kind, child), obj in children.items():
            owner = controller_uid(obj)
            if (kind, child) not in keep and owner in our_components:
                await self.kube.delete(kind, graph.metadata.namespace, child, uid=obj["metadata"]["uid"])

    # -- status ------------------------------------------------------------------------------------------

    async def _write_component_status(self, dgc: Manifest, deployment: Manifest | None) -> None:
        observed = (deployment or {}).get("status", {})
        spec = dgc["spec"]
        new = {
            "replicas": int(observed.get("replicas", 0)),
            "readyReplicas": int(observed.get("readyReplicas", 0)),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(render.selector_labels(spec["graph"], spec["component"]).items())),
            "observedGeneration": dgc["metadata"].get("generation", 0),
        }
        if dgc.get("status") != new:
            await self.kube.apply({
                "apiVersion": api.API_VERSION, "kind": api.COMPONENT_KIND,
                "metadata": {"name": dgc["metadata"]["name"], "namespace": dgc["metadata"]["namespace"]},
                "status": new,
            }, subresource="status")

    async def _write_status(self, body: Manifest, observation: status.Observation, *, endpoint: str | None) -> None:
        try:
            previous = api.DynamoGraphStatus.model_validate(body.get("status") or {})
        except pydantic.ValidationError:
            previous = api.DynamoGraphStatus()
        new = status.graph_status(observation, previous=previous, endpoint=endpoint, now=now_rfc3339())
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        for condition in new.conditions:
            for value in ("True", "False", "Unknown"):
                metrics.GRAPH_CONDITION.labels(namespace, name, condition.type, value).set(
                    1 if condition.status == value else 0)
        new_doc = new.model_dump(by_alias=True, exclude_none=True)
        old_doc = body.get("status") or {}
        ours = {k: old_doc.get(k) for k in new_doc}
        ours["conditions"] = [c for c in old_doc.get("conditions", []) if c.get("type") in ("Ready", "Progressing", "Degraded")]
        if ours != new_doc:
            await self.kube.apply({
                "apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND,
                "metadata": {"name": body["metadata"]["name"], "namespace": body["metadata"]["namespace"]},
                "status": new_doc,
            }, subresource="status")
        for condition in status.transitions(new.conditions, previous.conditions):
            await self._event_for(body, condition)

    async def _event_for(self, body: Manifest, condition: api.Condition) -> None:
        interesting = (condition.type == "Degraded" and condition.status == "True") or (
            condition.type == "Ready" and condition.status == "True")
        if not interesting:
            return
        warning = condition.type == "Degraded"
        try:
            await self.kube.event(body, type_="Warning" if warning else "Normal", reason=condition.reason,
                                  message=condition.message or condition.reason)
        except kube_mod.ApiError as error:  # an event is best effort; status already says it
            logger.warning("could not record event on %s: %s", body["metadata"]["name"], error)


def _subset(small: Manifest, big: Manifest) -> bool:
    return all(big.get(k) == v for k, v in small.items())
