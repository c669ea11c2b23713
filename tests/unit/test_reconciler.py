"""The reconcile pass against an in-memory API and a watch-fed cache: what it sends, and when it sends nothing.

The real apiserver tests (tests/integration/test_operator.py) show the objects come out right; these
show the request pattern: a pass over an unchanged graph sends no request at all, a hand edit is
applied away with one request, and a child of a deleted predecessor is removed, not reported as a
name conflict.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from fleetpilot import kube
from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api
from fleetpilot.operator import cache, reconciler, render

Manifest = dict[str, Any]


def merge(into: Manifest, patch: Manifest) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


class FakeApi:
    """Just enough of an apiserver: uids, resourceVersions, 409 on create, uid preconditions; counts every call."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Manifest] = {}
        self.calls: list[tuple[str, str, str]] = []
        self._versions = itertools.count(1)

    def _stamp(self, obj: Manifest) -> Manifest:
        obj["metadata"]["resourceVersion"] = str(next(self._versions))
        return copy.deepcopy(obj)

    def put(self, obj: Manifest) -> Manifest:
        """Create as somebody else would (a user, or an earlier operator): no call counted."""
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta.setdefault("uid", f"uid-{next(self._versions)}")
        meta.setdefault("generation", 1)
        self.objects[(obj["kind"], meta.get("namespace", ""), meta["name"])] = obj
        return self._stamp(obj)

    async def create(self, manifest: Manifest) -> Manifest:
        meta = manifest["metadata"]
        self.calls.append(("create", manifest["kind"], meta["name"]))
        if (manifest["kind"], meta["namespace"], meta["name"]) in self.objects:
            raise kube.ApiError(409, "already exists", "AlreadyExists")
        return self.put(manifest)

    async def apply(self, manifest: Manifest, *, subresource: str | None = None) -> Manifest:
        meta = manifest["metadata"]
        self.calls.append(("apply" + (f"/{subresource}" if subresource else ""), manifest["kind"], meta["name"]))
        existing = self.objects[(manifest["kind"], meta["namespace"], meta["name"])]
        merge(existing, {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind")})
        return self._stamp(existing)

    async def patch(self, kind: str, namespace: str | None, name: str, body: Manifest, *,
                    subresource: str | None = None) -> Manifest:
        self.calls.append(("patch" + (f"/{subresource}" if subresource else ""), kind, name))
        existing = self.objects[(kind, namespace or "", name)]
        merge(existing, body)
        return self._stamp(existing)

    async def get(self, kind: str, namespace: str | None, name: str) -> Manifest:
        self.calls.append(("get", kind, name))
        try:
            return copy.deepcopy(self.objects[(kind, namespace or "", name)])
        except KeyError:
            raise kube.ApiError(404, "not found", "NotFound") from None

    async def delete(self, kind: str, namespace: str | None, name: str, *, uid: str | None = None) -> None:
        self.calls.append(("delete", kind, name))
        found = self.objects.get((kind, namespace or "", name))
        if found is not None and (uid is None or found["metadata"]["uid"] == uid):
            del self.objects[(kind, namespace or "", name)]

    async def list(self, kind: str, namespace: str | None = None, **_: Any) -> list[Manifest]:
        self.calls.append(("list", kind, ""))
        return []

    async def event(self, regarding: Manifest, **_: Any) -> None:
        self.calls.append(("event", regarding["kind"], regarding["metadata"]["name"]))

    def writes(self) -> list[tuple[str, str, str]]:
        return [call for call in self.calls if call[0] != "event"]


class WatchedIndexes(Mapping[str, Mapping[cache.IndexKey, list[Manifest]]]):
    """kopf's indexes over the fake API, as a watch that is always up to date would keep them."""

    def __init__(self, fake: FakeApi) -> None:
        self.fake = fake

    def __getitem__(self, index_id: str) -> Mapping[cache.IndexKey, list[Manifest]]:
        kind = next(k for k in cache.WATCHED if cache.index_id(k) == index_id)
        out: dict[cache.IndexKey, list[Manifest]] = {}
        for (obj_kind, namespace, name), obj in self.fake.objects.items():
            key = cache.index_key(kind, namespace, name, obj["metadata"].get("labels", {}))
            if obj_kind == kind and key is not None:
                out.setdefault(key, []).append(cache.projection(kind, copy.deepcopy(obj)))
        return out

    def __iter__(self) -> Iterator[str]:
        return iter(cache.index_id(kind) for kind in cache.WATCHED)

    def __len__(self) -> int:
        return len(cache.WATCHED)


def watch_delivers(graphs: reconciler.GraphReconciler, fake: FakeApi, *,
                   deleted: tuple[Manifest, ...] = ()) -> None:
    """What kopf's event handlers tell the cache as the watch shows the API's current objects."""
    for (kind, _, _), obj in fake.objects.items():
        graphs.cache.observe(kind, obj, deleted=False)
    for obj in deleted:
        graphs.cache.observe(obj["kind"], obj, deleted=True)


def delete_by_hand(graphs: reconciler.GraphReconciler, fake: FakeApi, kind: str, name: str) -> None:
    gone = fake.objects.pop((kind, "ns", name))
    watch_delivers(graphs, fake, deleted=(gone,))


def graph_manifest() -> Manifest:
    return {
        "apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND,
        "metadata": {"name": "g", "namespace": "ns"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "engine": {"framework": "simulator"},
                 "components": {"prefill": {"replicas": 1}, "decode": {"replicas": 2}}},
    }


def generation(spec_change: Manifest | None = None) -> str:
    manifest = graph_manifest()
    merge(manifest["spec"], spec_change or {})
    return render.generation_of(api.DynamoGraph.model_validate(manifest), render.RenderSettings())


def deployment(component: str, spec_change: Manifest | None = None) -> str:
    """The name of a worker component's Deployment (and PDB) of the graph's generation."""
    return contract.generation_child_name("g", component, generation(spec_change))


def setup() -> tuple[FakeApi, reconciler.GraphReconciler]:
    fake = FakeApi()
    fake.put(graph_manifest())
    return fake, reconciler.GraphReconciler(fake, cache=cache.GraphCache(WatchedIndexes(fake)))  # type: ignore[arg-type]


def test_a_second_pass_over_an_unchanged_graph_sends_nothing() -> None:
    fake, graphs = setup()
    asyncio.run(graphs.reconcile("ns", "g"))
    first = fake.writes()
    assert ("create", "Deployment", deployment("decode")) in first
    assert ("apply/status", api.GRAPH_KIND, "g") in first
    fake.calls.clear()
    asyncio.run(graphs.reconcile("ns", "g"))
    assert fake.calls == []


def test_a_hand_edit_is_applied_away_with_one_request() -> None:
    fake, graphs = setup()
    asyncio.run(graphs.reconcile("ns", "g"))
    fake.objects[("Deployment", "ns", deployment("decode"))]["spec"]["replicas"] = 7
    fake.calls.clear()
    asyncio.run(graphs.reconcile("ns", "g"))
    assert fake.writes() == [("apply", "Deployment", deployment("decode"))]
    assert fake.objects[("Deployment", "ns", deployment("decode"))]["spec"]["replicas"] == 2


def test_a_child_deleted_by_hand_is_created_again() -> None:
    fake, graphs = setup()
    asyncio.run(graphs.reconcile("ns", "g"))
    watch_delivers(graphs, fake)
    delete_by_hand(graphs, fake, "PodDisruptionBudget", deployment("prefill"))
    fake.calls.clear()
    asyncio.run(graphs.reconcile("ns", "g"))
    assert fake.writes() == [("create", "PodDisruptionBudget", deployment("prefill"))]


def test_bounds_tightened_in_the_graph_resize_the_component_once_and_leave_it_healthy() -> None:
    fake, graphs = setup()
    asyncio.run(graphs.reconcile("ns", "g"))
    watch_delivers(graphs, fake)
    fake.objects[(api.COMPONENT_KIND, "ns", "g-decode")]["spec"]["replicas"] = 5  # the planner, say
    watch_delivers(graphs, fake)
    asyncio.run(graphs.reconcile("ns", "g"))
    # git tightens decode's bounds below what its component asks for.
    fake.objects[(api.GRAPH_KIND, "ns", "g")]["spec"]["components"]["decode"]["scaling"] = {"min": 1, "max": 3}
    watch_delivers(graphs, fake)
    fake.calls.clear()
    asyncio.run(graphs.reconcile("ns", "g"))
    assert ("patch", api.COMPONENT_KIND, "g-decode") in fake.calls
    assert ("event", api.COMPONENT_KIND, "g-decode") in fake.calls
    assert fake.objects[(api.COMPONENT_KIND, "ns", "g-decode")]["spec"]["replicas"] == 3
    assert fake.objects[("Deployment", "ns", deployment("decode"))]["spec"]["replicas"] == 3
    degraded = next(c for c in fake.objects[(api.GRAPH_KIND, "ns", "g")]["status"]["conditions"]
                    if c["type"] == "Degraded")
    assert degraded["status"] == "False", degraded
    # Once within its bounds, the next pass leaves the component alone.
    watch_delivers(graphs, fake)
    fake.calls.clear()
    asyncio.run(graphs.reconcile("ns", "g"))
    assert not [c for c in fake.calls if c[1] == api.COMPONENT_KIND]


def test_a_spec_change_applies_only_what_it_changes() -> None:
    fake, graphs = setup()
    asyncio.run(graphs.reconcile("ns", "g"))
    stored = fake.objects[(api.GRAPH_KIND, "ns", "g")]
    stored["spec"]["components"]["decode"]["drainSeconds"] = 300  # not an engine change: same generation
    stored["metadata"]["generation"] = 2
    fake.calls.clear()
    asyncio.run(graphs.reconcile("ns", "g"))
    applied = {name for verb, kind, name in fake.writes() if verb == "apply" and kind == "Deployment"}
    assert applied == {deployment("decode")}  # rolled in place; prefill and the frontend are untouched


def ready(fake: FakeApi, name: str, replicas: int | None = None) -> None:
    """The Deployment controller's report: every replica asked for is Ready (`replicas` still exist)."""
    obj = fake.objects[("Deployment", "ns", name)]
    wanted = obj["spec"]["replicas"]
    obj["status"] = {"replicas": wanted if replicas is None else replicas, "readyReplicas": wanted,
                     "availableReplicas": wanted, "updatedReplicas": wanted, "observedGeneration": 1}


def rollout_status(fake: FakeApi) -> Manifest:
    status: Manifest = fake.objects[(api.GRAPH_KIND, "ns", "g")]["status"]
    return status


def change_engine(fake: FakeApi) -> dict[str, Any]:
    change = {"engine": {"args": ["--max-num-seqs", "64"]}}
    stored = fake.objects[(api.GRAPH_KIND, "ns", "g")]
    merge(stored["spec"], change)
    stored["metadata"]["generation"] = 2
    return change


def engine_changed() -> tuple[FakeApi, reconciler.GraphReconciler, dict[str, Any]]:
    """A graph all Ready on its first generation, then an engine change reconciled once."""
    fake, graphs = setup()
    asyncio.run(graphs.reconcile("ns", "g"))
    for component in ("prefill", "decode"):
        ready(fake, deployment(component))
    change = change_engine(fake)
    fake.calls.clear()
    asyncio.run(graphs.reconcile("ns", "g"))
    return fake, graphs, change


def test_an_engine_change_starts_a_new_generation_beside_the_old() -> None:
    fake, _, change = engine_changed()
    # One surge replica per component on the new generation; the old keeps all of its replicas.
    created = {name for verb, kind, name in fake.writes() if verb == "create"}
    assert created == {f"{deployment(c, change)}" for c in ("prefill", "decode")}, fake.writes()
    assert not [call for call in fake.writes() if call[0] == "delete"]
    for component, total in (("prefill", 1), ("decode", 2)):
        assert fake.objects[("Deployment", "ns", deployment(component, change))]["spec"]["replicas"] == 1
        assert fake.objects[("Deployment", "ns", deployment(component))]["spec"]["replicas"] == total
    new = fake.objects[("Deployment", "ns", deployment("decode", change))]
    assert new["spec"]["template"]["metadata"]["labels"][contract.LABEL_GENERATION] == generation(change)
    rollout = rollout_status(fake)["rollout"]
    assert rollout["phase"] == "Progressing" and rollout["target"] == generation(change)
    assert [g["name"] for g in rollout["generations"]] == [generation(change), generation()]


def test_the_old_generation_drains_as_the_new_one_becomes_ready_then_goes() -> None:
    fake, graphs, change = engine_changed()
    for component in ("prefill", "decode"):
        ready(fake, deployment(component, change))
    asyncio.run(graphs.reconcile("ns", "g"))
    # prefill: 1/1 Ready on the new one; decode 1/2: the slower side sets the pace for both.
    assert fake.objects[("Deployment", "ns", deployment("decode", change))]["spec"]["replicas"] == 2
    assert fake.objects[("Deployment", "ns", deployment("decode"))]["spec"]["replicas"] == 1
    assert fake.objects[("Deployment", "ns", deployment("prefill"))]["spec"]["replicas"] == 1
    for component in ("prefill", "decode"):
        ready(fake, deployment(component, change))
    asyncio.run(graphs.reconcile("ns", "g"))
    for component in ("prefill", "decode"):
        assert fake.objects[("Deployment", "ns", deployment(component))]["spec"]["replicas"] == 0
        ready(fake, deployment(component), replicas=1)  # draining: a pod still terminating
    asyncio.run(graphs.reconcile("ns", "g"))
    assert ("Deployment", "ns", deployment("decode")) in fake.objects  # not before its pods are gone
    for component in ("prefill", "decode"):
        ready(fake, deployment(component), replicas=0)
    fake.calls.clear()
    asyncio.run(graphs.reconcile("ns", "g"))
    deleted = {(kind, name) for verb, kind, name in fake.writes() if verb == "delete"}
    assert deleted == {(kind, deployment(c)) for c in ("prefill", "decode")
                       for kind in ("Deployment", "PodDisruptionBudget")}
    assert rollout_status(fake)["rollout"]["phase"] == "Complete"


def test_a_crash_looping_new_generation_stalls_and_the_old_keeps_serving() -> None:
    fake, graphs, change = engine_changed()
    fake.put({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{deployment('decode', change)}-abc", "namespace": "ns",
        "labels": {contract.LABEL_GRAPH: "g", contract.LABEL_COMPONENT: "decode",
                   contract.LABEL_GENERATION: generation(change)}},
        "status": {"containerStatuses": [{"name": "engine", "ready": False, "restartCount": 1,
                                          "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}})
    ready(fake, deployment("prefill", change))  # prefill of the new generation came up; decode cannot
    asyncio.run(graphs.reconcile("ns", "g"))
    status = rollout_status(fake)
    degraded = contract.find_condition(status["conditions"], "Degraded")
    assert degraded is not None and degraded["reason"] == "RolloutStalled", degraded
    assert "CrashLoopBackOff" in status["rollout"]["reason"]
    assert fake.objects[("Deployment", "ns", deployment("decode"))]["spec"]["replicas"] == 2
    assert fake.objects[("Deployment", "ns", deployment("decode", change))]["spec"]["replicas"] == 1
    # Reverting the spec makes the old generation the target: it is all Ready, so the new one goes.
    stored = fake.objects[(api.GRAPH_KIND, "ns", "g")]
    stored["spec"]["engine"]["args"] = []
    asyncio.run(graphs.reconcile("ns", "g"))
    for component in ("prefill", "decode"):
        assert fake.objects[("Deployment", "ns", deployment(component, change))]["spec"]["replicas"] == 0
    assert contract.find_condition(rollout_status(fake)["conditions"], "Degraded")["reason"] != "RolloutStalled"


def test_a_generations_replica_failure_reaches_the_graphs_status() -> None:
    """The status reads each component through one summary of its generations' Deployments: a quota that
    refuses a generation's pods (ReplicaFailure) must survive that summary and name the quota."""
    fake, graphs = setup()
    asyncio.run(graphs.reconcile("ns", "g"))
    ready(fake, deployment("prefill"))
    refused = fake.objects[("Deployment", "ns", deployment("decode"))]
    refused["status"] = {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 1,
                         "observedGeneration": 1, "conditions": [{
                             "type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                             "message": ('pods "x" is forbidden: exceeded quota: gpus, requested: '
                                         "requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=2, "
                                         "limited: requests.nvidia.com/gpu=2")}]}
    asyncio.run(graphs.reconcile("ns", "g"))
    degraded = contract.find_condition(rollout_status(fake)["conditions"], "Degraded")
    assert degraded is not None and degraded["reason"] == "QuotaExceeded", degraded
    assert "ResourceQuota gpus is exhausted" in degraded["message"]


def test_a_stale_cache_neither_creates_twice_nor_repeats_events() -> None:
    """Right after our writes the watch has not caught up: the cache serves what the API answered us."""
    fake = FakeApi()
    fake.put(graph_manifest())
    frozen: dict[str, Mapping[cache.IndexKey, list[Manifest]]] = {
        index_id: dict(index) for index_id, index in WatchedIndexes(fake).items()}  # the world before any write
    graphs = reconciler.GraphReconciler(fake, cache=cache.GraphCache(frozen))  # type: ignore[arg-type]
    asyncio.run(graphs.reconcile("ns", "g"))
    events = [call for call in fake.calls if call[0] == "event"]
    fake.calls.clear()
    asyncio.run(graphs.reconcile("ns", "g"))
    assert not [call for call in fake.calls if call[0] in ("create", "event")]
    assert not [call for call in fake.calls if call[0] == "apply/status" and call[1] == api.GRAPH_KIND]
    assert len(events) <= 1


def test_a_deleted_predecessors_child_is_removed_not_reported_as_a_conflict() -> None:
    fake, graphs = setup()
    asyncio.run(graphs.reconcile("ns", "g"))
    watch_delivers(graphs, fake)
    # The decode DynamoGraphComponent is deleted and at once recreated; its old children are not yet collected.
    delete_by_hand(graphs, fake, api.COMPONENT_KIND, "g-decode")
    fake.calls.clear()
    with pytest.raises(reconciler.Superseded):
        asyncio.run(graphs.reconcile("ns", "g"))
    # The first stale child in apply order (the NetworkPolicy: dependencies before the workload) is deleted.
    assert ("delete", "NetworkPolicy", "g-decode") in fake.calls
    watch_delivers(graphs, fake)
    for kind, name in (("Service", "g-decode"), ("PodDisruptionBudget", deployment("decode")),
                       ("Deployment", deployment("decode"))):
        fake.objects.pop((kind, "ns", name))  # what the garbage collector does meanwhile
    asyncio.run(graphs.reconcile("ns", "g"))  # the next pass creates them under the new owner
    owner = fake.objects[(api.COMPONENT_KIND, "ns", "g-decode")]["metadata"]["uid"]
    assert reconciler.controller_uid(fake.objects[("Deployment", "ns", deployment("decode"))]) == owner


def test_a_foreign_object_is_a_name_conflict_and_is_left_alone() -> None:
    fake, graphs = setup()
    fake.put({"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "g-frontend", "namespace": "ns", "labels": {contract.LABEL_GRAPH: "g"}}})
    asyncio.run(graphs.reconcile("ns", "g"))
    assert ("delete", "Service", "g-frontend") not in fake.calls
    status = fake.objects[(api.GRAPH_KIND, "ns", "g")]["status"]
    degraded = contract.find_condition(status["conditions"], "Degraded")
    assert degraded is not None and degraded["reason"] == "NameConflict"
    assert "components" not in status  # never an empty map: the API would store it as null and refuse it


def test_every_foreign_object_in_the_way_is_named_and_nothing_is_made_after_one() -> None:
    fake, graphs = setup()
    for kind, name in (("Service", "g-frontend"), ("ServiceAccount", "g-frontend"), ("Service", "g-decode")):
        fake.put({"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "ns"}})
    asyncio.run(graphs.reconcile("ns", "g"))
    degraded = contract.find_condition(fake.objects[(api.GRAPH_KIND, "ns", "g")]["status"]["conditions"], "Degraded")
    assert degraded is not None and degraded["reason"] == "NameConflict"
    for what in ("ServiceAccount g-frontend", "Service g-frontend", "Service g-decode"):
        assert what in degraded["message"], degraded["message"]
    assert degraded["message"].endswith("are not owned by this graph; delete or rename them")
    # No workload of a component with a child in the way: nothing runs under a ServiceAccount not ours.
    made = {(kind, name) for (verb, kind, name) in fake.calls if verb == "create"}
    assert ("Deployment", "g-frontend") not in made and ("Deployment", deployment("decode")) not in made, made
    assert ("Deployment", deployment("prefill")) in made  # a component with nothing in the way is made
    assert not any(verb == "delete" for (verb, _, _) in fake.calls)


def test_a_name_conflict_clears_by_itself_once_the_foreign_object_goes() -> None:
    """The foreign object carries none of our labels, so no watch event says it went: the graph in
    NameConflict looks again by itself, and takes the name within seconds."""
    fake, graphs = setup()
    foreign = ("Service", "ns", "g-frontend")
    fake.put({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "g-frontend", "namespace": "ns"}})

    def degraded_reason() -> str | None:
        found = contract.find_condition(fake.objects[(api.GRAPH_KIND, "ns", "g")].get("status", {}).get(
            "conditions", []), "Degraded")
        return None if found is None else str(found["reason"])

    async def scenario() -> float:
        await graphs.start()
        try:
            graphs.enqueue("ns", "g")
            while degraded_reason() != "NameConflict":
                await asyncio.sleep(0.05)
            del fake.objects[foreign]
            gone = time.monotonic()
            while ("create", "Service", "g-frontend") not in fake.calls or degraded_reason() == "NameConflict":
                assert time.monotonic() - gone < 10, fake.calls[-5:]
                await asyncio.sleep(0.05)
            return time.monotonic() - gone
        finally:
            await graphs.stop()

    asyncio.run(scenario())
    assert fake.objects[foreign]["metadata"]["labels"][contract.LABEL_GRAPH] == "g"


def test_what_a_user_asked_for_goes_ahead_of_what_only_reports() -> None:
    """Watch events' queue priority: a new or re-specified graph or component, and a deleted object of
    ours, HIGH; the initial list, status-only updates (same generation) and every pod or Deployment
    change, LOW."""
    from fleetpilot.operator import workqueue

    _, graphs = setup()

    def body(generation: int, name: str = "g") -> Manifest:
        return {"metadata": {"name": name, "namespace": "ns", "generation": generation}}

    high, low = workqueue.HIGH, workqueue.LOW
    assert graphs.priority_of(api.GRAPH_KIND, None, body(1)) == low  # listed at start-up
    assert graphs.priority_of(api.GRAPH_KIND, "MODIFIED", body(1)) == low  # our status write came back
    assert graphs.priority_of(api.GRAPH_KIND, "MODIFIED", body(2)) == high  # the user edited the spec
    assert graphs.priority_of(api.GRAPH_KIND, "MODIFIED", body(2)) == low
    assert graphs.priority_of(api.GRAPH_KIND, "ADDED", body(1, "new")) == high  # a graph created now
    component = "g-decode"
    assert graphs.priority_of(api.COMPONENT_KIND, "ADDED", body(1, component)) == high
    assert graphs.priority_of(api.COMPONENT_KIND, "MODIFIED", body(1, component)) == low  # status
    assert graphs.priority_of(api.COMPONENT_KIND, "MODIFIED", body(2, component)) == high  # kubectl scale
    assert graphs.priority_of("Deployment", "MODIFIED", body(7, "g-decode-abc")) == low
    assert graphs.priority_of("Deployment", "DELETED", body(7, "g-decode-abc")) == high  # deleted by hand
    assert graphs.priority_of("Pod", "MODIFIED", body(1, "g-decode-abc-x")) == low
    assert graphs.priority_of("Pod", "DELETED", body(1, "g-decode-abc-x")) == low  # pods come and go
    # A graph deleted and created again under the same name is new again.
    assert graphs.priority_of(api.GRAPH_KIND, "DELETED", body(2)) == high
    assert graphs.priority_of(api.GRAPH_KIND, "ADDED", body(1)) == high


# -- the cluster's free GPUs, shared by every graph ------------------------------------------------------

class CountingLists:
    """An API whose LISTs of Nodes and (streamed) bound Pods answer one 8-GPU node holding a 3-GPU pod, after
    `gate` opens; counts them and records whether each asked the watch cache."""

    def __init__(self) -> None:
        self.lists: list[tuple[str, bool]] = []
        self.gate = asyncio.Event()
        self.fail = False

    async def list(self, kind: str, namespace: str | None = None, *, cached: bool = False,
                   **_: Any) -> list[Manifest]:
        self.lists.append((kind, cached))
        await self.gate.wait()
        if self.fail:
            raise kube.ApiError(503, "etcd away", "ServiceUnavailable")
        return [{"metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}]

    async def list_items(self, kind: str, namespace: str | None = None, *, cached: bool = False,
                         **_: Any) -> Any:
        self.lists.append((kind, cached))
        await self.gate.wait()
        if self.fail:
            raise kube.ApiError(503, "etcd away", "ServiceUnavailable")
        yield {"metadata": {"name": "p"}, "spec": {"nodeName": "n", "containers": [
            {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "3"}}}]}, "status": {"phase": "Running"}}


def test_graphs_short_of_gpus_at_once_share_one_read_of_the_cluster() -> None:
    api_ = CountingLists()
    now = [0.0]
    gpus = reconciler.ClusterGpus(api_, ttl_s=30, clock=lambda: now[0])  # type: ignore[arg-type]

    async def scenario() -> list[Any]:
        readers = [asyncio.create_task(gpus.free()) for _ in range(50)]
        await asyncio.sleep(0)
        api_.gate.set()
        return await asyncio.gather(*readers)

    answers = asyncio.run(scenario())
    assert {(a.free, a.total) for a in answers} == {(5, 8)}
    assert sorted(api_.lists) == [("Node", True), ("Pod", True)], "one pair of LISTs, from the watch cache"

    now[0] = 29.0
    asyncio.run(gpus.free())
    assert len(api_.lists) == 2, "within the TTL the answer is reused"
    now[0] = 31.0
    asyncio.run(gpus.free())
    assert len(api_.lists) == 4, "after it, read again"


def test_a_failed_read_of_the_cluster_is_not_remembered() -> None:
    api_ = CountingLists()
    api_.gate.set()
    api_.fail = True
    gpus = reconciler.ClusterGpus(api_, ttl_s=30, clock=lambda: 0.0)  # type: ignore[arg-type]
    with pytest.raises(kube.ApiError):
        asyncio.run(gpus.free())
    api_.fail = False
    assert asyncio.run(gpus.free()).free == 5
    assert len(api_.lists) == 4
