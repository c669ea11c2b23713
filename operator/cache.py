"""What the reconciler reads instead of the API: the watched objects of each graph, plus its own recent writes.

kopf watches every kind the operator makes (list, then watch with resourceVersion resumption and
bookmarks) and keeps each object in an in-memory index keyed by (namespace, graph), through the
index handlers in handlers.py; kopf holds every handler back until every index has finished its
first list, so the reconciler never sees a half-filled cache. This module is the reconciler's view
of those indexes:

- **projections**: only the fields some reader needs are kept (no managedFields, a Pod's
  scheduling and readiness but not its volumes), so 10,000 pods fit in little memory;
- **read-your-writes**: a watch event arrives a moment after the write that caused it. Until it
  does, the object the API answered to our own create or apply is what `graph` and `children`
  return, so a second reconcile in that moment neither creates twice nor reports a stale status.
  client-go's MutationCache does the same, comparing resourceVersions as integers (etcd's
  revisions) and forgetting a write after a TTL.

Pure: a Mapping of kopf's indexes in, manifests out; no kopf import, no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api

Manifest = dict[str, Any]
IndexKey = tuple[str, str]  # (namespace, graph name)
Indexes = Mapping[str, Mapping[IndexKey, Iterable[Manifest]]]

#: Where each kind the operator reads lives: (group, version, plural). One kopf index per kind.
WATCHED: dict[str, tuple[str, str, str]] = {
    api.GRAPH_KIND: (api.GROUP, api.VERSION, api.GRAPH_PLURAL),
    api.COMPONENT_KIND: (api.GROUP, api.VERSION, api.COMPONENT_PLURAL),
    "Deployment": ("apps", "v1", "deployments"),
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "Service": ("", "v1", "services"),
    "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
    "ServiceAccount": ("", "v1", "serviceaccounts"),
    "Role": ("rbac.authorization.k8s.io", "v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    "ConfigMap": ("", "v1", "configmaps"),
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies"),
    "Pod": ("", "v1", "pods"),
}
#: The kinds a component may own: listed from the cache each pass to apply, adopt-check and prune.
CHILD_KINDS = ("Deployment", "StatefulSet", "Service", "PodDisruptionBudget", "ServiceAccount", "Role", "RoleBinding",
               "ConfigMap", "NetworkPolicy")
WRITE_TTL_S = 60.0
_POD_ANNOTATIONS = (contract.ANNOTATION_DELETION_COST, contract.ANNOTATION_GROUP_MEMBERS)


def index_id(kind: str) -> str:
    """The kopf handler id (and so the keyword) of a kind's index: `deployment_index`."""
    return f"{kind.lower()}_index"


def _metadata(meta: Mapping[str, Any]) -> Manifest:
    dropped = ("managedFields",)
    out = {k: v for k, v in meta.items() if k not in dropped}
    annotations = out.get("annotations")
    if annotations and "kubectl.kubernetes.io/last-applied-configuration" in annotations:
        out["annotations"] = {k: v for k, v in annotations.items()
                              if k != "kubectl.kubernetes.io/last-applied-configuration"}
    return out


def _containers(containers: Iterable[Mapping[str, Any]]) -> list[Manifest]:
    # Ports: where a frontend pod serves /metrics (the per-worker load a scale-down reads).
    return [{"name": c.get("name"), "resources": c.get("resources", {}),
             **({"ports": c["ports"]} if c.get("ports") else {})} for c in containers]


def projection(kind: str, body: Mapping[str, Any]) -> Manifest:
    """The part of an object that the operator reads; a Pod loses all but scheduling and readiness."""
    meta = _metadata(body.get("metadata", {}))
    if kind != "Pod":
        return {**{k: v for k, v in body.items() if k != "metadata"}, "metadata": meta}
    spec, status = body.get("spec", {}), body.get("status", {})
    pod_meta: Manifest = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "labels", "deletionTimestamp",
                                     "ownerReferences") if k in meta}
    # Only ours, not every annotation a pod carries: the deletion cost a scale-down wrote, the members
    # a multinode group formed with.
    ours = {k: v for k, v in (meta.get("annotations") or {}).items() if k in _POD_ANNOTATIONS}
    if ours:
        pod_meta["annotations"] = ours
    pod_spec: Manifest = {"nodeName": spec.get("nodeName"), "containers": _containers(spec.get("containers", [])),
                          "initContainers": _containers(spec.get("initContainers", []))}
    if spec.get("schedulingGates"):
        pod_spec["schedulingGates"] = spec["schedulingGates"]  # a multinode group's leader before admission
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": pod_meta,
        "spec": pod_spec,
        "status": {k: status[k] for k in ("phase", "conditions", "containerStatuses", "podIP") if k in status},
    }


def index_key(kind: str, namespace: str, name: str, labels: Mapping[str, str]) -> IndexKey | None:
    """Graphs are indexed by their own name, everything else by the graph named in its label."""
    if kind == api.GRAPH_KIND:
        return (namespace, name)
    graph = labels.get(contract.LABEL_GRAPH)
    return (namespace, graph) if graph else None


def owning_graph(body: Mapping[str, Any]) -> IndexKey | None:
    """The graph an object belongs to by its controller owner reference: the graph itself, or the
    DynamoGraphComponent `<graph>-<component>` (contract.child_name) of one of its components."""
    meta = body.get("metadata", {})
    for ref in meta.get("ownerReferences") or ():
        if not ref.get("controller") or not str(ref.get("apiVersion", "")).startswith(f"{api.GROUP}/"):
            continue
        if ref.get("kind") == api.GRAPH_KIND:
            return (meta.get("namespace") or "", ref["name"])
        if ref.get("kind") == api.COMPONENT_KIND:
            for component in api.ALL_COMPONENTS:
                if ref["name"].endswith(f"-{component}"):
                    return (meta.get("namespace") or "", ref["name"][: -len(component) - 1])
    return None


def _newer(candidate: str, than: str) -> bool:
    """Whether resourceVersion `candidate` is later than `than` (etcd revisions; unknown: not newer)."""
    try:
        return int(candidate) > int(than)
    except ValueError:
        return False


@dataclass
class _Write:
    obj: Manifest
    at: float


class GraphCache:
    """The reconciler's reads: kopf's indexes, overlaid with the operator's own writes until they show up."""

    def __init__(self, indexes: Indexes | None = None, *, ttl_s: float = WRITE_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._indexes: Indexes = indexes or {}
        self._writes: dict[tuple[str, str, str], _Write] = {}
        self.ttl_s = ttl_s
        self._clock = clock

    def bind(self, indexes: Indexes) -> None:
        """kopf creates the indexes before the startup handlers run; they fill as the watches list."""
        self._indexes = indexes

    def remember(self, obj: Manifest) -> None:
        """An object as the API answered our create or apply: read it back until the watch has it too."""
        meta = obj["metadata"]
        self._writes[(obj["kind"], meta["namespace"], meta["name"])] = _Write(projection(obj["kind"], obj), self._clock())

    def observe(self, kind: str, body: Mapping[str, Any], *, deleted: bool) -> None:
        """A watch event: once the watch has shown our write (or the object's deletion), forget the write."""
        meta = body.get("metadata", {})
        key = (kind, meta.get("namespace", ""), meta.get("name", ""))
        write = self._writes.get(key)
        if write is None or write.obj["metadata"].get("uid") not in (None, meta.get("uid")):
            return
        if deleted or not _newer(write.obj["metadata"].get("resourceVersion", ""), meta.get("resourceVersion", "")):
            del self._writes[key]

    def forget_graph(self, namespace: str, graph: str) -> None:
        for key in [k for k, w in self._writes.items()
                    if k[1] == namespace and (w.obj["metadata"].get("labels", {}).get(contract.LABEL_GRAPH) == graph
                                              or (k[0] == api.GRAPH_KIND and k[2] == graph))]:
            del self._writes[key]

    def graph(self, namespace: str, name: str) -> Manifest | None:
        """The graph, or None once it is gone."""
        watched = list(self._watched(api.GRAPH_KIND, (namespace, name)))
        if not watched:
            self.forget_graph(namespace, name)
            return None
        return self._fresher(api.GRAPH_KIND, watched[0])

    def children(self, kind: str, namespace: str, graph: str) -> list[Manifest]:
        """Objects of `kind` labelled with the graph, each the fresher of the watched and the written copy."""
        found = {obj["metadata"]["name"]: self._fresher(kind, obj) for obj in self._watched(kind, (namespace, graph))}
        for (written_kind, written_ns, name), write in list(self._writes.items()):
            if (written_kind == kind and written_ns == namespace and name not in found
                    and write.obj["metadata"].get("labels", {}).get(contract.LABEL_GRAPH) == graph
                    and self._alive(written_kind, written_ns, name, write)):
                found[name] = write.obj
        return [found[name] for name in sorted(found)]

    def _watched(self, kind: str, key: IndexKey) -> Iterable[Manifest]:
        index = self._indexes.get(index_id(kind))
        if index is None:
            return ()
        return index.get(key, ())

    def _fresher(self, kind: str, watched: Manifest) -> Manifest:
        meta = watched["metadata"]
        key = (kind, meta.get("namespace", ""), meta["name"])
        write = self._writes.get(key)
        if write is None or not self._alive(*key, write):
            return watched
        if write.obj["metadata"].get("uid") != meta.get("uid") or not _newer(
                write.obj["metadata"].get("resourceVersion", ""), meta.get("resourceVersion", "")):
            del self._writes[key]  # the watch caught up (or the object was replaced): it is the truth again
            return watched
        return write.obj

    def _alive(self, kind: str, namespace: str, name: str, write: _Write) -> bool:
        if self._clock() - write.at > self.ttl_s:
            del self._writes[(kind, namespace, name)]
            return False
        return True
