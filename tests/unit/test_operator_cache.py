"""The reconciler's cache: kopf's indexes overlaid with its own writes until the watch shows them."""

from __future__ import annotations

from typing import Any

from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api
from fleetpilot.operator import cache, handlers, workqueue


def obj(kind: str, name: str, version: str, *, uid: str = "u", graph: str = "g", **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": version,
                                       "labels": {contract.LABEL_GRAPH: graph},
                                       "managedFields": [{"manager": "kubectl"}]}, **extra}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def indexes(**by_kind: list[dict[str, Any]]) -> dict[str, dict[cache.IndexKey, list[dict[str, Any]]]]:
    """kopf's indexes as the handlers fill them: {index id: {(namespace, graph): [projections]}}."""
    out: dict[str, dict[cache.IndexKey, list[dict[str, Any]]]] = {}
    for kind, items in by_kind.items():
        index = out.setdefault(cache.index_id(kind), {})
        for item in items:
            meta = item["metadata"]
            key = cache.index_key(kind, meta["namespace"], meta["name"], meta["labels"])
            assert key is not None
            index.setdefault(key, []).append(cache.projection(kind, item))
    return out


def test_our_create_is_visible_before_the_watch_delivers_it_and_then_the_watch_wins() -> None:
    index = indexes(Service=[])
    view = cache.GraphCache(index)
    view.remember(obj("Service", "g-frontend", "10"))
    assert [s["metadata"]["name"] for s in view.children("Service", "ns", "g")] == ["g-frontend"]
    # The watch delivers it, then someone changes it: the watched copy is newer, ours is forgotten.
    index[cache.index_id("Service")][("ns", "g")] = [cache.projection("Service", obj("Service", "g-frontend", "12"))]
    assert view.children("Service", "ns", "g")[0]["metadata"]["resourceVersion"] == "12"


def test_a_stale_watched_copy_does_not_hide_our_newer_write() -> None:
    index = indexes(DynamoGraph=[obj(api.GRAPH_KIND, "g", "5", status={"ready": False})])
    view = cache.GraphCache(index)
    view.remember(obj(api.GRAPH_KIND, "g", "7", status={"ready": True}))
    assert view.graph("ns", "g")["status"] == {"ready": True}  # type: ignore[index]


def test_a_write_is_forgotten_when_the_watch_shows_it_or_its_deletion() -> None:
    view = cache.GraphCache(indexes(Service=[]))
    view.remember(obj("Service", "g-frontend", "10"))
    view.observe("Service", obj("Service", "g-frontend", "10"), deleted=False)
    assert view.children("Service", "ns", "g") == []  # the (empty) index is the truth again
    view.remember(obj("Service", "g-frontend", "11"))
    view.observe("Service", obj("Service", "g-frontend", "11"), deleted=True)
    assert view.children("Service", "ns", "g") == []  # deleted by hand right after we made it: make it again


def test_a_write_expires_after_the_ttl() -> None:
    clock = Clock()
    view = cache.GraphCache(indexes(Service=[]), ttl_s=60, clock=clock)
    view.remember(obj("Service", "g-frontend", "10"))
    clock.now = 61
    assert view.children("Service", "ns", "g") == []


def test_a_recreated_object_is_not_shadowed_by_a_write_to_its_predecessor() -> None:
    index = indexes(Service=[obj("Service", "g-frontend", "3", uid="new")])
    view = cache.GraphCache(index)
    view.remember(obj("Service", "g-frontend", "9", uid="old"))
    assert view.children("Service", "ns", "g")[0]["metadata"]["uid"] == "new"


def test_a_deleted_graph_is_none_and_its_writes_go() -> None:
    view = cache.GraphCache(indexes(DynamoGraph=[]))
    view.remember(obj("Service", "g-frontend", "10"))
    assert view.graph("ns", "g") is None
    assert view.children("Service", "ns", "g") == []


def test_children_are_per_graph_and_kind() -> None:
    view = cache.GraphCache(indexes(Service=[obj("Service", "a-frontend", "1", graph="a"),
                                             obj("Service", "b-frontend", "1", graph="b")],
                                    Deployment=[obj("Deployment", "a-decode", "1", graph="a")]))
    assert [s["metadata"]["name"] for s in view.children("Service", "ns", "a")] == ["a-frontend"]
    assert [d["metadata"]["name"] for d in view.children("Deployment", "ns", "a")] == ["a-decode"]
    assert view.children("Deployment", "ns", "b") == []


def test_projections_drop_what_nobody_reads() -> None:
    pod = obj("Pod", "p", "1", spec={"nodeName": "n1", "volumes": [{"name": "big"}],
                                     "containers": [{"name": "c", "image": "i", "env": [{"name": "X"}],
                                                     "resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
              status={"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}], "podIP": "1.2.3.4"})
    projected = cache.projection("Pod", pod)
    assert projected["spec"] == {"nodeName": "n1", "initContainers": [],
                                 "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}
    assert projected["status"] == {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                                   "podIP": "1.2.3.4"}  # where a frontend serves its per-worker load
    assert "managedFields" not in projected["metadata"]
    deployment = cache.projection("Deployment", obj("Deployment", "d", "1", spec={"replicas": 2}))
    assert deployment["spec"] == {"replicas": 2} and "managedFields" not in deployment["metadata"]


def test_a_pod_keeps_what_multinode_groups_read() -> None:
    """A group leader's scheduling gate and recorded members; no other annotation."""
    pod = obj("Pod", "g-0", "1", spec={"schedulingGates": [{"name": contract.GROUP_SCHEDULING_GATE}], "containers": []})
    pod["metadata"]["annotations"] = {contract.ANNOTATION_GROUP_MEMBERS: "u1,u2", "other.example/x": "big"}
    projected = cache.projection("Pod", pod)
    assert projected["spec"]["schedulingGates"] == [{"name": contract.GROUP_SCHEDULING_GATE}]
    assert projected["metadata"]["annotations"] == {contract.ANNOTATION_GROUP_MEMBERS: "u1,u2"}


def test_a_users_change_to_a_child_goes_at_once_and_status_events_wait_for_their_burst() -> None:
    assert handlers.enqueue_delay(api.GRAPH_KIND, workqueue.LOW) == 0.0
    assert handlers.enqueue_delay(api.COMPONENT_KIND, workqueue.HIGH) == 0.0  # kubectl scale
    assert handlers.enqueue_delay("Service", workqueue.HIGH) == 0.0  # deleted by hand
    assert handlers.enqueue_delay("Pod", workqueue.LOW) == handlers.CHILD_EVENT_DELAY_SECONDS > 0
    assert handlers.enqueue_delay(api.COMPONENT_KIND, workqueue.LOW) == handlers.CHILD_EVENT_DELAY_SECONDS


def test_kopf_keeps_no_diff_base_and_writes_nothing_of_its_own_onto_objects() -> None:
    import kopf
    from kopf._cogs.structs import diffs

    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    assert settings.posting.enabled is False
    storage = settings.persistence.diffbase_storage
    assert isinstance(storage, handlers.NoDiffBase)
    body = kopf.Body({"metadata": {"name": "g-decode-1", "namespace": "n", "labels": {"a": "b"}},
                      "spec": {"containers": [{"name": "engine", "image": "x"}]}, "status": {"phase": "Running"}})
    new = storage.build(body=body)
    assert new == {}  # no copy of the object is made
    assert not diffs.diff(storage.fetch(body=body), new)  # and kopf sees no change to react to
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=new)
    assert not patch  # no last-handled-configuration annotation


def test_the_api_server_selects_every_child_kind_and_the_graphs_are_listed_whole() -> None:
    """The selectors kopf sends on each kind's LIST and WATCH (`settings.watching.label_selectors`)."""
    import kopf

    settings = kopf.OperatorSettings()
    handlers.configure(settings)

    def sent(kind: str) -> list[str]:
        group, version, plural = cache.WATCHED[kind]
        return list(settings.watching.label_selectors.collect(kopf.Resource(group, version, plural, kind=kind)))

    owned = f"{contract.LABEL_GRAPH},{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
    assert sent(api.GRAPH_KIND) == []
    assert sent("Pod") == [contract.LABEL_GRAPH]
    assert {kind: sent(kind) for kind in cache.WATCHED if kind not in (api.GRAPH_KIND, "Pod")} == {
        kind: [owned] for kind in cache.WATCHED if kind not in (api.GRAPH_KIND, "Pod")}
    # Nothing else kopf lists (namespaces, CRDs) is narrowed by ours.
    assert settings.watching.label_selectors.collect(kopf.Resource("", "v1", "namespaces", kind="Namespace")) == []


def owned_by(kind: str, name: str, *, labels: dict[str, str], controller: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": "g-decode-1", "namespace": "ns", "labels": labels, "ownerReferences": [
        {"apiVersion": api.API_VERSION, "kind": kind, "name": name, "uid": "u", "controller": controller}]}}


def test_a_child_that_lost_its_labels_is_traced_to_its_graph_by_its_owner() -> None:
    """A relabelled child leaves the selected watch as DELETED, in its new state: without the label that
    named its graph, its controller owner reference still does."""
    unlabelled = owned_by(api.COMPONENT_KIND, "my-graph-decode", labels={})
    assert handlers.graph_key("Deployment", "DELETED", unlabelled) == ("ns", "my-graph")
    assert handlers.graph_key(api.COMPONENT_KIND, "DELETED", owned_by(api.GRAPH_KIND, "my-graph", labels={})) == (
        "ns", "my-graph")
    # Still labelled with the graph (only managed-by removed): the label says which.
    labelled = owned_by(api.COMPONENT_KIND, "my-graph-decode", labels={contract.LABEL_GRAPH: "my-graph"})
    assert handlers.graph_key("Deployment", "DELETED", labelled) == ("ns", "my-graph")
    # Not a deletion, not our owner, not the controller: nothing to enqueue.
    assert handlers.graph_key("Deployment", "MODIFIED", unlabelled) is None
    assert handlers.graph_key("Deployment", "DELETED", {"metadata": {"name": "x", "namespace": "ns", "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "my-graph-decode", "controller": True}]}}) is None
    assert handlers.graph_key("Deployment", "DELETED",
                              owned_by(api.COMPONENT_KIND, "my-graph-decode", labels={}, controller=False)) is None
