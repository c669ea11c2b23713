"""The level-triggered reconcile loop for DynamoGraphs.

Watch events (from kopf, handlers.py) only say "look at graph ns/name again"; they land in the work
queue (workqueue.py: deduplicated, one worker per graph at a time, retries with backoff, a resync
after `resync_seconds`). A pass reads the world from the watch-fed cache (cache.py), never from
the API; renders the desired objects (render.py); applies only those that drifted from what it
applied before (drift.py); deletes what the graph no longer needs (only objects it owns); and
writes status (status.py) when it changed. A pass over a graph whose objects are as they should be
sends no request at all, so a thousand Ready graphs cost the API nothing between changes.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import httpx
import pydantic

from fleetpilot import kube as kube_mod
from fleetpilot import scrape
from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api
from fleetpilot.operator import cache as cache_mod
from fleetpilot.operator import drift, groups, metrics, render, rollout, scaledown, status, workqueue
from fleetpilot.operator.owners import controller_ref, controller_uid

logger = logging.getLogger("fleetpilot.operator")

Key = tuple[str, str]  # (namespace, name)
Manifest = dict[str, Any]


class NameConflict(Exception):
    """Objects we would create already exist and belong to someone else: we leave them alone, and
    name every one of them (`objects`: "Kind name"), so one look at the condition says what to free."""

    def __init__(self, objects: list[str]) -> None:
        self.objects = objects
        verb, pronoun = ("exists and is", "it") if len(objects) == 1 else ("exist and are", "them")
        super().__init__(f"{', '.join(objects)} {verb} not owned by this graph; delete or rename {pronoun}")


class Superseded(Exception):
    """A child of a deleted predecessor of ours (same owner name, older uid) is in the way until it is gone."""


def ownership(existing: Manifest, owner: render.OwnerRef) -> Literal["ours", "predecessor", "foreign"]:
    """Whose an existing child is: `owner`'s; a deleted predecessor's (an object of the same kind and
    name that `owner` replaced, whose children the garbage collector is about to remove); or someone else's."""
    ref = controller_ref(existing) or {}
    if ref.get("uid") == owner.uid:
        return "ours"
    if (ref.get("apiVersion"), ref.get("kind"), ref.get("name")) == (owner.api_version, owner.kind, owner.name):
        return "predecessor"
    return "foreign"


SUPERSEDED_RETRY_SECONDS = 0.5
#: How often a graph in NameConflict looks again: the foreign object in the way carries none of our labels,
#: so no watch event says when it goes. Each look is one refused create and one read of that object, and
#: one read of each child the conflict stopped its component from applying.
CONFLICT_RECHECK_SECONDS = 1.0
#: How old the cluster's free-GPU count in an `Unschedulable` message may be (`ClusterGpus`).
CLUSTER_GPUS_TTL_SECONDS = 30.0


class ClusterGpus:
    """The cluster's free GPUs for `Unschedulable` messages: one pair of LISTs (every Node, every bound
    Pod) shared by all graphs, at most every `ttl_s`, one in flight at a time.

    Only graphs with a pod the scheduler turned away ask, but in a cluster short of GPUs that is many
    graphs at once, each passed again on every event of its pods. One LIST of every pod per pass took
    4-10 s at 1,000 graphs (4,000 pods), held the workers and delayed a `kubectl scale` on another graph
    by up to 10 s (`benchmarks/scale_bench.py`). The LISTs are served from the apiserver's watch cache
    (resourceVersion 0), not a quorum read of etcd: a message may be a few seconds plus `ttl_s` old;
    the pods are parsed as they arrive (`KubeApi.list_items`), so the read never stalls the event loop.
    """

    def __init__(self, kube: kube_mod.KubeApi, *, ttl_s: float = CLUSTER_GPUS_TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._kube = kube
        self.ttl_s = ttl_s
        self._clock = clock
        self._read: tuple[float, status.GpuCapacity] | None = None
        self._pending: asyncio.Future[status.GpuCapacity] | None = None

    async def free(self) -> status.GpuCapacity:
        if self._read is not None and self._clock() - self._read[0] < self.ttl_s:
            return self._read[1]
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._list())
            self._pending.add_done_callback(self._settle)
        # shield: a reader cancelled mid-read (operator stopping) does not cancel the others' read.
        return await asyncio.shield(self._pending)

    async def _list(self) -> status.GpuCapacity:
        async def bound_pods() -> list[Manifest]:
            # Streamed and projected as they arrive: 4,000 whole pods are ~18 MB of JSON.
            return [cache_mod.projection("Pod", pod) async for pod in self._kube.list_items(
                "Pod", cached=True, field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed")]

        nodes, bound = await asyncio.gather(self._kube.list("Node", cached=True), bound_pods())
        return status.gpu_capacity(nodes, bound)

    def _settle(self, done: asyncio.Future[status.GpuCapacity]) -> None:
        self._pending = None
        if not done.cancelled() and done.exception() is None:  # a failed read: the next reader tries again
            self._read = (self._clock(), done.result())


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
        cache: cache_mod.GraphCache | None = None,
        settings: render.RenderSettings | None = None,
        workers: int = 8,
        resync_seconds: float = 300.0,
        max_backoff_seconds: float = 60.0,
    ) -> None:
        self.kube = kube
        self.cache = cache or cache_mod.GraphCache()
        self.settings = settings or render.RenderSettings()
        self.workers = workers
        self.resync_seconds = resync_seconds
        self.queue: workqueue.WorkQueue[Key] = workqueue.WorkQueue(
            max_delay_s=max_backoff_seconds, on_depth=metrics.QUEUE_DEPTH.set)
        self._tasks: list[asyncio.Task[None]] = []
        # When this process first saw each graph with its planner on (status.planner_watch's clock).
        self._planner_seen: dict[Key, datetime.datetime] = {}
        self._http: httpx.AsyncClient | None = None  # reads the frontends' per-worker load before a scale-down
        self._generations: dict[tuple[str, str, str], Any] = {}  # per graph/component: the generation last seen
        self.cluster_gpus = ClusterGpus(kube)

    # -- queue -------------------------------------------------------------------------------------------

    def enqueue(self, namespace: str, name: str, *, after: float = 0.0, priority: int = workqueue.LOW) -> None:
        self.queue.add_after((namespace, name), after, priority=priority)

    def priority_of(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> int:
        """How urgent a watch event makes its graph's next pass (`workqueue.HIGH` or `LOW`).

        HIGH: what a user asked for. A graph or component whose `metadata.generation` moved (a spec
        edit, `kubectl scale` through /scale) or that is new to the watch, and any of our objects
        deleted (by hand, or the graph itself). LOW: everything that only reports, which is most events
        — pods and Deployments changing status, our own status writes coming back, the initial list
        (event type None) at start-up.
        """
        meta = body.get("metadata", {})
        ident = (kind, meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self._generations.pop(ident, None)
            return workqueue.LOW if kind == "Pod" else workqueue.HIGH
        if kind not in (api.GRAPH_KIND, api.COMPONENT_KIND):
            return workqueue.LOW
        generation = meta.get("generation")
        seen = self._generations.get(ident)
        self._generations[ident] = generation
        return workqueue.LOW if event_type is None or seen == generation else workqueue.HIGH

    def idle(self) -> bool:
        return self.queue.idle()

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(), name=f"reconcile-worker-{i}") for i in range(self.workers)]

    async def stop(self) -> None:
        self.queue.shutdown()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                with metrics.RECONCILE_SECONDS.time():
                    await self.reconcile(*key)
                metrics.RECONCILES.labels("ok").inc()
                self.queue.forget(key)
                self.queue.add_after(key, self.resync_seconds)
            except Superseded as waiting:
                # Routine after a component or graph is deleted and at once recreated: not an error.
                logger.info("reconcile %s/%s waits: %s", *key, waiting)
                self.queue.add_after(key, SUPERSEDED_RETRY_SECONDS)
            except Exception as error:  # noqa: BLE001 - a bad graph or a flaky API must never stop the operator
                metrics.RECONCILES.labels("error").inc()
                delay = self.queue.retry(key)
                # The API saying no is routine (a namespace terminating, a webhook down), and so is not
                # reaching it (an apiserver restarting, etcd away): no traceback.
                log = logger.warning if isinstance(error, kube_mod.ApiError | httpx.TransportError) else logger.exception
                log("reconcile %s/%s failed (attempt %d): %s; retrying in %.1fs", *key, self.queue.failures(key),
                    error, delay)
            finally:
                self.queue.done(key)

    # -- one pass ----------------------------------------------------------------------------------------

    async def reconcile(self, namespace: str, name: str) -> None:
        body = self.cache.graph(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            metrics.forget_graph(namespace, name)
            self._planner_seen.pop((namespace, name), None)
            self.queue.cancel((namespace, name))
            return  # deleted: the garbage collector removes what we owned
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
            self.queue.add_after((namespace, name), CONFLICT_RECHECK_SECONDS)
        await self._write_status(body, observation, endpoint=render.endpoint(graph))

    async def _converge(self, graph: api.DynamoGraph) -> status.Observation:
        namespace, name, uid = graph.metadata.namespace, graph.metadata.name, graph.metadata.uid
        wanted = render.components_of(graph)
        components = {c["metadata"]["name"]: c for c in self.cache.children(api.COMPONENT_KIND, namespace, name)}
        children: dict[tuple[str, str], Manifest] = {
            (kind, item["metadata"]["name"]): item
            for kind in cache_mod.CHILD_KINDS for item in self.cache.children(kind, namespace, name)
        }
        pods = self.cache.children("Pod", namespace, name)

        dgcs: dict[api.ComponentName, Manifest] = {}
        requested: dict[api.ComponentName, int] = {}
        replicas: dict[api.ComponentName, int] = {}
        conflicts: list[str] = []  # every object in the way, named together
        for component in wanted:
            try:
                dgcs[component] = await self._ensure_component(
                    graph, component, components.get(contract.child_name(name, component)))
            except NameConflict as conflict:
                conflicts.extend(conflict.objects)
                continue
            requested[component] = int(dgcs[component]["spec"]["replicas"])
            replicas[component] = render.effective_replicas(graph, component, requested[component])
            if replicas[component] != requested[component]:
                dgcs[component] = await self._clamp_component(graph, component, dgcs[component], replicas[component])
                requested[component] = int(dgcs[component]["spec"]["replicas"])
        if conflicts:  # without its component a workload has no owner: nothing more is made
            raise NameConflict(conflicts)
        owners = {c: render.OwnerRef(api.API_VERSION, api.COMPONENT_KIND, dgc["metadata"]["name"],
                                     dgc["metadata"]["uid"]) for c, dgc in dgcs.items()}

        # The workers' generations: every Deployment a worker component owns is one of them.
        workers = [c for c in wanted if c != "frontend"]
        target = render.generation_of(graph, self.settings)
        deployments: dict[str, dict[str, Manifest]] = {c: rollout.rollout_deployments(children, owners[c].uid)
                                                        for c in workers}
        # Multinode components: form, heal and release their groups, and count them whole (groups.py).
        group_plans: dict[str, groups.Plan] = {}  # by leader StatefulSet name
        released: dict[str, dict[str, float]] = {}
        group_problems: list[str] = []
        for component in workers:
            if render.is_multinode(graph, component):
                released[component] = await self._tend_groups(
                    graph, component, deployments[component], dgcs[component], children, pods, group_plans,
                    group_problems)
                deployments[component] = {g: groups.summary(d, group_plans[d["metadata"]["name"]])
                                          for g, d in deployments[component].items()}
        generations = rollout.rollout_generations(deployments)
        stalled = rollout.rollout_stall(target, deployments, pods, graph.status.rollout, generations)
        plan = rollout.plan(target, {c: replicas[c] for c in workers}, generations, stalled=stalled)

        observed: list[status.ComponentObservation] = []
        keep: set[tuple[str, str]] = set()
        for component in wanted:
            owner = owners[component]
            size = plan.replicas[target][component] if component != "frontend" else replicas[component]
            deployment: Manifest | None = None
            blocked = False  # a child in the way: what comes after it in dependency order is only checked
            for manifest in render.workload(graph, component, replicas=size, owner=owner, settings=self.settings,
                                            generation=target if component != "frontend" else None):
                key = (manifest["kind"], manifest["metadata"]["name"])
                keep.add(key)
                if blocked:
                    conflicts.extend(await self._foreign(manifest, owner, children.get(key)))
                    continue
                if manifest["kind"] == "Deployment" and component != "frontend":
                    await self._before_scale_down(graph, children.get(key), size, pods)
                try:
                    applied = await self._apply_owned(manifest, owner, children.get(key))
                except NameConflict as conflict:
                    conflicts.extend(conflict.objects)
                    blocked = True  # e.g. no workload runs under a ServiceAccount that is not ours
                    continue
                if manifest["kind"] == "Deployment":
                    deployment = applied
                elif manifest["kind"] == "StatefulSet":  # a multinode component's leaders: counted in groups
                    deployment = groups.summary(applied, group_plans.get(applied["metadata"]["name"], groups.Plan()))
            if component != "frontend":
                # Older generations: only their replicas change (their pod template is the spec they
                # were made from, which the graph no longer holds); gone once drained.
                current = [deployment] if deployment is not None else []
                for generation_name, old in deployments[component].items():
                    if generation_name == target or generation_name in plan.delete:
                        continue
                    keep.update({(old["kind"], old["metadata"]["name"]),
                                 ("PodDisruptionBudget", old["metadata"]["name"])})
                    current.append(await self._scale_old(graph, old, plan.replicas[generation_name][component], pods))
                deployment = rollout.rollout_aggregate(current, target)
            await self._write_component_status(
                dgcs[component], deployment, selector=render.scale_selector(graph, component),
                nodes=render.nodes_of(graph, component) if component in released else None,
                released=released.get(component))
            observed.append(status.ComponentObservation(
                name=component, desired=replicas[component], deployment=deployment,
                clamped_from=requested[component] if requested[component] != replicas[component] else None,
                nodes=render.nodes_of(graph, component),
            ))

        if conflicts:
            raise NameConflict(conflicts)
        await self._prune(graph, uid, components, children, keep, wanted)

        # Which nodes could take the pods the scheduler turned away, and what is already on them.
        capacity = await self.cluster_gpus.free() if status.unschedulable(pods) else None
        return status.Observation(generation=graph.metadata.generation, components=observed, pods=pods,
                                  capacity=capacity, group_problems=group_problems,
                                  rollout=(rollout.rollout_status(target, plan, generations, workers, stalled)
                                           if workers else None))

    async def _scale_old(self, graph: api.DynamoGraph, deployment: Manifest, replicas: int,
                         pods: list[Manifest]) -> Manifest:
        """An older generation's Deployment to `replicas` (a merge patch of that one field)."""
        if int(deployment.get("spec", {}).get("replicas", 0)) == replicas:
            return deployment
        kind = deployment.get("kind", "Deployment")
        if kind == "Deployment":
            await self._before_scale_down(graph, deployment, replicas, pods)
        meta = deployment["metadata"]
        metrics.APPLIES.labels(kind).inc()
        patched = await self.kube.patch(kind, meta["namespace"], meta["name"], {"spec": {"replicas": replicas}})
        self.cache.remember(patched)
        if kind == "StatefulSet":  # counted in groups, as the summary it replaces
            return {**patched, "status": deployment.get("status", {})}
        return patched

    async def _tend_groups(self, graph: api.DynamoGraph, component: api.ComponentName,
                           leader_sets: dict[str, Manifest], dgc: Manifest, children: dict[tuple[str, str], Manifest],
                           pods: list[Manifest], plans: dict[str, groups.Plan], problems: list[str]
                           ) -> dict[str, float]:
        """Form, heal and release the groups of every generation of a multinode component (groups.py);
        fills `plans` (by leader StatefulSet) and `problems`; returns when groups were last released."""
        now = time.time()
        timeout = float(graph.spec.placement.group_scheduling_timeout_seconds)
        released: dict[str, float] = {}
        for name, at in ((dgc.get("status") or {}).get("releasedGroups") or {}).items():
            try:
                released[name] = contract.parse_rfc3339(at)
            except ValueError:
                continue
        worker_sets = [obj for (kind, _), obj in children.items()
                       if kind == "StatefulSet" and (controller_ref(obj) or {}).get("kind") == "Pod"]
        out: dict[str, float] = {}
        for leader_set in leader_sets.values():
            set_name, set_uid = leader_set["metadata"]["name"], leader_set["metadata"].get("uid")
            leaders = [p for p in pods if controller_uid(p) == set_uid]
            plan = groups.plan(
                leaders=leaders, worker_sets=worker_sets, pods=pods,
                nodes=render.nodes_of(graph, component),
                update_revision=leader_set.get("status", {}).get("updateRevision"), now=now, timeout_s=timeout,
                released={k: v for k, v in released.items() if k.startswith(f"{set_name}-")})
            plans[set_name] = plan
            out.update(plan.released)
            problems += [groups.describe(component, p, graph.spec.placement.topology_key) for p in plan.problems]
            for action in plan.actions:
                await self._group_action(graph, component, action)
            if plan.recheck_in_s is not None:
                self.enqueue(graph.metadata.namespace, graph.metadata.name, after=plan.recheck_in_s + 0.5)
        return out

    async def _group_action(self, graph: api.DynamoGraph, component: api.ComponentName, action: groups.Action) -> None:
        namespace, leader = graph.metadata.namespace, action.leader["metadata"]
        metrics.GROUP_ACTIONS.labels(action.kind).inc()
        try:
            if action.kind == "create-workers":
                generation = leader.get("labels", {}).get(contract.LABEL_GENERATION, "")
                manifest = render.group_workers(graph, component, leader=action.leader, generation=generation,
                                                settings=self.settings)
                try:
                    self.cache.remember(await self.kube.create(drift.with_digest(manifest)))
                except kube_mod.ApiError as error:
                    if not error.conflict:
                        raise  # an earlier leader's set still in the way: the next pass removes it
            elif action.kind == "delete-stale-workers" and action.workers is not None:
                await self.kube.delete("StatefulSet", namespace, action.group, uid=action.workers["metadata"]["uid"])
            elif action.kind == "admit":
                # The group's workers exist: lift the leader's gate, so all its pods are scheduled now.
                self.cache.remember(await self.kube.patch("Pod", namespace, action.group, {
                    "metadata": {"labels": {contract.LABEL_GROUP: action.group}},
                    "spec": {"schedulingGates": None}}))
            elif action.kind == "record-members":
                self.cache.remember(await self.kube.patch("Pod", namespace, action.group, {
                    "metadata": {"annotations": {contract.ANNOTATION_GROUP_MEMBERS: ",".join(action.members)}}}))
            else:  # restart or release: the whole group goes, and is formed again
                await self._tear_down_group(graph, component, action)
        except kube_mod.ApiError as error:
            if not error.not_found:
                raise  # a pod or set that went meanwhile needs nothing more

    async def _tear_down_group(self, graph: api.DynamoGraph, component: api.ComponentName,
                               action: groups.Action) -> None:
        """Remove a group's worker StatefulSet, its leader and its worker pods at once (a broken or
        unplaceable group has nothing to drain); the leader StatefulSet makes a new leader, gated."""
        namespace = graph.metadata.namespace
        if action.workers is not None:
            await self.kube.delete("StatefulSet", namespace, action.group, uid=action.workers["metadata"]["uid"])
        for pod in (action.leader, *action.pods):
            await self.kube.delete("Pod", namespace, pod["metadata"]["name"], uid=pod["metadata"].get("uid"),
                                   grace_period_seconds=render.EXIT_MARGIN_SECONDS)
        if action.kind == "restart":
            reason, message = "GroupRestarted", f"{component} group {action.group} restarts whole: {action.reason}"
        else:
            reason = "GroupReleased"
            message = (f"{component} group {action.group} could not be placed whole ({action.reason}): its pods"
                       " are released so their GPUs can serve other groups; it will be tried again")
        logger.info("%s/%s: %s", namespace, graph.metadata.name, message)
        regarding = {"apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND,
                     "metadata": {"name": graph.metadata.name, "namespace": namespace, "uid": graph.metadata.uid}}
        await self._record_event(regarding, type_="Warning", reason=reason, message=message)

    async def _before_scale_down(self, graph: api.DynamoGraph, deployment: Manifest | None, replicas: int,
                                 pods: list[Manifest]) -> None:
        """Before a Deployment shrinks: mark its least loaded Ready pods as the cheapest to delete
        (scaledown.py), from the requests in flight every Ready frontend counts per worker, read from
        their /metrics now (fleetpilot.scrape); a frontend that does not answer leaves the choice to
        the ReplicaSet."""
        if deployment is None or int(deployment.get("spec", {}).get("replicas", 0)) <= replicas:
            return
        selector = deployment.get("spec", {}).get("selector", {}).get("matchLabels", {})
        mine = [p for p in pods if all(p["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())]
        frontends = [url for p in pods
                     if p["metadata"].get("labels", {}).get(contract.LABEL_COMPONENT) == "frontend"
                     and (url := contract.pod_http_url(p)) is not None]
        if self._http is None:
            self._http = httpx.AsyncClient()
        texts = await scrape.read_texts(self._http, frontends)
        if texts is None:
            logger.info("%s/%s: a frontend did not answer; the ReplicaSet picks the replica of %s to remove",
                        graph.metadata.namespace, graph.metadata.name, deployment["metadata"]["name"])
            return
        costs = scaledown.deletion_costs(mine, scrape.sum_by_label(texts, contract.WORKER_LOAD_METRIC, "worker"))
        for pod_name, cost in scaledown.stale(mine, costs).items():
            try:
                patched = await self.kube.patch("Pod", graph.metadata.namespace, pod_name, {
                    "metadata": {"annotations": {contract.ANNOTATION_DELETION_COST: str(cost)}}})
            except kube_mod.ApiError as error:
                if error.not_found:
                    continue
                raise
            self.cache.remember(patched)
        logger.info("%s/%s: scaling %s down to %d; in flight per Ready pod: %s", graph.metadata.namespace,
                    graph.metadata.name, deployment["metadata"]["name"], replicas, costs)

    async def _ensure_component(
        self, graph: api.DynamoGraph, component: api.ComponentName, existing: Manifest | None
    ) -> Manifest:
        """Create the DynamoGraphComponent once; afterwards only its bounds and labels are ours."""
        if existing is None:
            try:
                created = await self.kube.create(render.component_object(graph, component, with_replicas=True))
                metrics.APPLIES.labels(api.COMPONENT_KIND).inc()
                self.cache.remember(created)
                return created
            except kube_mod.ApiError as error:
                if not error.conflict:
                    raise
                existing = await self.kube.get("DynamoGraphComponent", graph.metadata.namespace,
                                               contract.child_name(graph.metadata.name, component))
        await self._check_owner(existing, api.COMPONENT_KIND, render.graph_owner(graph))
        desired = render.component_object(graph, component, with_replicas=False)
        if not _subset(desired["spec"], existing["spec"]) or not _subset(desired["metadata"]["labels"],
                                                                          existing["metadata"].get("labels", {})):
            metrics.APPLIES.labels(api.COMPONENT_KIND).inc()
            applied = await self.kube.apply(desired)
            self.cache.remember(applied)
            return applied
        return existing

    async def _clamp_component(self, graph: api.DynamoGraph, component: api.ComponentName, dgc: Manifest,
                               allowed: int) -> Manifest:
        """The graph's bounds are the source of truth: a component whose replicas lie outside them (its
        scaling.min or max changed in git) is set to the nearest bound, with an Event, so that the graph
        converges without a hand-run `kubectl scale`. If the write fails, the component keeps its replicas
        and the graph's Degraded condition says ReplicasOutOfBounds."""
        meta = dgc["metadata"]
        asked = int(dgc["spec"]["replicas"])
        low, high = render.scaling_bounds(graph, component)
        try:
            metrics.APPLIES.labels(api.COMPONENT_KIND).inc()
            clamped = await self.kube.patch(api.COMPONENT_KIND, meta["namespace"], meta["name"],
                                            {"spec": {"replicas": allowed}})
        except kube_mod.ApiError as error:
            logger.warning("could not set %s to %d replicas within its bounds: %s", meta["name"], allowed, error)
            return dgc
        self.cache.remember(clamped)
        bounds = f"scaling.min {low if low is not None else 0}, scaling.max {high if high is not None else 'none'}"
        await self._record_event(clamped, type_="Normal", reason="ReplicasClamped",
                                 message=f"{component}: {asked} replicas lie outside the graph's bounds ({bounds}):"
                                         f" set to {allowed}")
        return clamped

    async def _apply_owned(self, manifest: Manifest, owner: render.OwnerRef, existing: Manifest | None) -> Manifest:
        """Apply a child we own, unless it is as we applied it; never adopt what somebody else made."""
        applied_digest = drift.digest(manifest)
        if existing is None:
            try:
                metrics.APPLIES.labels(manifest["kind"]).inc()
                created = await self.kube.create(drift.with_digest(manifest, applied_digest))
                self.cache.remember(created)
                return created
            except kube_mod.ApiError as error:
                if not error.conflict:
                    raise
                existing = await self.kube.get(manifest["kind"], manifest["metadata"]["namespace"],
                                               manifest["metadata"]["name"])
        await self._check_owner(existing, manifest["kind"], owner)
        if drift.up_to_date(existing, manifest, applied_digest):
            return existing
        metrics.APPLIES.labels(manifest["kind"]).inc()
        applied = await self.kube.apply(drift.with_digest(manifest, applied_digest))
        self.cache.remember(applied)
        return applied

    async def _check_owner(self, existing: Manifest, kind: str, owner: render.OwnerRef) -> None:
        """Ours: go on. A deleted predecessor's: delete it (it is ours too) and come back. Anyone else's: refuse."""
        whose = ownership(existing, owner)
        if whose == "ours":
            return
        meta = existing["metadata"]
        what = f"{kind} {meta['name']}"
        if whose == "predecessor":
            # Made by us for an earlier object of the same name; the garbage collector will remove it,
            # deleting it ourselves only makes that sooner. The uid precondition spares any newcomer.
            await self.kube.delete(kind, meta["namespace"], meta["name"], uid=meta["uid"])
            raise Superseded(f"{what} belongs to a deleted {owner.kind} {owner.name}; removing it first")
        raise NameConflict([what])

    async def _foreign(self, manifest: Manifest, owner: render.OwnerRef, existing: Manifest | None) -> list[str]:
        """The child named `manifest`, if it exists and is not `owner`'s ("Kind name"), without making
        or changing anything: what is checked after a conflict has stopped a component's applies."""
        if existing is None:
            try:
                existing = await self.kube.get(manifest["kind"], manifest["metadata"]["namespace"],
                                               manifest["metadata"]["name"])
            except kube_mod.ApiError as error:
                if error.not_found:
                    return []
                raise
        if ownership(existing, owner) != "foreign":
            return []  # a predecessor's is removed by `_check_owner` once the component's applies go on
        return [f"{manifest['kind']} {manifest['metadata']['name']}"]

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
        wanted_names = {contract.child_name(graph.metadata.name, c) for c in wanted}
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

    async def _write_component_status(self, dgc: Manifest, deployment: Manifest | None, *, selector: dict[str, str],
                                      nodes: int | None = None, released: dict[str, float] | None = None) -> None:
        """/scale's view: replicas and ready replicas (groups, for a multinode component) and the
        selector of the pods that count (a multinode component's leaders: one per replica)."""
        observed = (deployment or {}).get("status", {})
        new: Manifest = {
            "replicas": int(observed.get("replicas", 0)),
            "readyReplicas": int(observed.get("readyReplicas", 0)),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(selector.items())),
            "observedGeneration": dgc["metadata"].get("generation", 0),
        }
        if nodes is not None:
            new["nodes"] = nodes
        if released:
            new["releasedGroups"] = {name: contract.rfc3339(_utc(at)) for name, at in sorted(released.items())}
        if dgc.get("status") != new:
            self.cache.remember(await self.kube.apply({
                "apiVersion": api.API_VERSION, "kind": api.COMPONENT_KIND,
                "metadata": {"name": dgc["metadata"]["name"], "namespace": dgc["metadata"]["namespace"]},
                "status": new,
            }, subresource="status"))

    async def _write_status(self, body: Manifest, observation: status.Observation, *, endpoint: str | None) -> None:
        try:
            previous = api.DynamoGraphStatus.model_validate(body.get("status") or {})
        except pydantic.ValidationError:
            previous = api.DynamoGraphStatus()
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        watch = self._watch_planner(body)
        new = status.graph_status(observation, previous=previous, endpoint=endpoint, now=contract.now_rfc3339(),
                                  extra=[watch.condition] if watch.condition is not None else None)
        for condition in new.conditions:
            for value in ("True", "False", "Unknown"):
                metrics.GRAPH_CONDITION.labels(namespace, name, condition.type, value).set(
                    1 if condition.status == value else 0)
        new_doc = new.model_dump(by_alias=True, exclude_none=True)
        if not new_doc.get("components"):
            # An empty map we once filled would be applied as null, which the schema refuses (422):
            # leave the field out instead, and server-side apply removes our old entries.
            new_doc.pop("components", None)
        old_doc = body.get("status") or {}
        ours = {k: old_doc.get(k) for k in new_doc}
        ours["conditions"] = [c for c in old_doc.get("conditions", []) if c.get("type") in status.OPERATOR_CONDITIONS
                              or c.get("reason") == status.NO_PLANNER]
        if ours != new_doc:
            self.cache.remember(await self.kube.apply({
                "apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND,
                "metadata": {"name": body["metadata"]["name"], "namespace": body["metadata"]["namespace"]},
                "status": new_doc,
            }, subresource="status"))
        for condition in status.transitions(new.conditions, previous.conditions):
            await self._event_for(body, condition)

    def _watch_planner(self, body: Manifest) -> status.PlannerWatch:
        """PlannerActive=Unknown NoPlanner when no planner acts on a graph that wants one; a wake-up for when it would."""
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        now = datetime.datetime.now(datetime.UTC)
        if ((body.get("spec") or {}).get("planner") or {}).get("mode", "off") == "off":
            self._planner_seen.pop(key, None)
        else:
            self._planner_seen.setdefault(key, now)
        watch = status.planner_watch(body, first_seen=self._planner_seen.get(key), now=now)
        if watch.recheck_after_s is not None:
            self.queue.add_after(key, watch.recheck_after_s + 1.0)
        return watch

    async def _event_for(self, body: Manifest, condition: api.Condition) -> None:
        no_planner = condition.type == "PlannerActive" and condition.reason == status.NO_PLANNER
        interesting = (condition.type == "Degraded" and condition.status == "True") or (
            condition.type == "Ready" and condition.status == "True") or no_planner
        if not interesting:
            return
        warning = condition.type == "Degraded" or no_planner
        await self._record_event(body, type_="Warning" if warning else "Normal", reason=condition.reason,
                                 message=condition.message or condition.reason)

    async def _record_event(self, regarding: Manifest, *, type_: str, reason: str, message: str) -> None:
        """An Event about `regarding`, best effort: what it says is in the object's status or spec too."""
        try:
            await self.kube.event(regarding, type_=type_, reason=reason, message=message)
        except kube_mod.ApiError as error:
            logger.warning("could not record event on %s: %s", regarding["metadata"]["name"], error)


def _utc(epoch_s: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(epoch_s, datetime.UTC)


def _subset(small: Manifest, big: Manifest) -> bool:
    return all(big.get(k) == v for k, v in small.items())
