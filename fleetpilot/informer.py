"""List once, then watch: a local copy of one kind of object, kept current with almost no API requests.

The one list+watch helper for fleetpilot's processes that are not the operator (the operator's
watches are kopf's: docs/kubernetes-client.md says why): the frontend's worker discovery and its
API-key Secret, the planner's view of the graphs and their components, and the e2e pod runner. It
does what client-go's reflector does:

- LIST once, remember the List's resourceVersion, then WATCH from it;
- when the server ends a watch (every `timeout_s`, or a dropped connection), watch again from the
  last resourceVersion seen — bookmarks keep it fresh while nothing changes — without listing;
- LIST again only when the API says that version is gone (410 Gone), or after an error, with a
  growing pause; the last known objects stay in use meanwhile;
- after a re-list, hand on the difference as events (ADDED, MODIFIED, DELETED), so a consumer
  never misses a deletion that happened while the watch was down.

At rest that is one watch request per `timeout_s` per informer, whatever the number of objects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any

import httpx

from fleetpilot import kube as kube_mod

logger = logging.getLogger("fleetpilot.informer")

Manifest = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)
Handler = Callable[[str, Manifest], Awaitable[None] | None]
Transform = Callable[[Manifest], Manifest]
IndexFunc = Callable[[Manifest], Iterable[Hashable]]


def object_key(obj: Manifest) -> Key:
    meta = obj.get("metadata", {})
    return (meta.get("namespace") or "", meta["name"])


def strip_managed_fields(obj: Manifest) -> Manifest:
    """The default transform: managedFields are often half an object's size and no reader here needs them."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


class Store:
    """Objects by (namespace, name), with secondary indexes; what an informer keeps. No I/O."""

    def __init__(self, *, transform: Transform = strip_managed_fields,
                 indexers: dict[str, IndexFunc] | None = None) -> None:
        self.transform = transform
        self._objects: dict[Key, Manifest] = {}
        self._indexers = dict(indexers or {})
        self._indexes: dict[str, dict[Hashable, set[Key]]] = {name: {} for name in self._indexers}

    def __len__(self) -> int:
        return len(self._objects)

    def get(self, namespace: str | None, name: str) -> Manifest | None:
        return self._objects.get((namespace or "", name))

    def objects(self) -> list[Manifest]:
        return list(self._objects.values())

    def by_index(self, index: str, value: Hashable) -> list[Manifest]:
        return [self._objects[key] for key in sorted(self._indexes[index].get(value, ()))]

    def upsert(self, obj: Manifest) -> tuple[str, Manifest]:
        """Store an object as the API sent it; returns (ADDED or MODIFIED, the stored copy)."""
        key = object_key(obj)
        stored = self.transform(obj)
        old = self._objects.get(key)
        if old is not None:
            self._unindex(key, old)
        self._objects[key] = stored
        for name, index_of in self._indexers.items():
            for value in index_of(stored):
                self._indexes[name].setdefault(value, set()).add(key)
        return ("ADDED" if old is None else "MODIFIED"), stored

    def delete(self, obj: Manifest) -> Manifest | None:
        key = object_key(obj)
        old = self._objects.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        return old

    def replace(self, items: list[Manifest]) -> list[tuple[str, Manifest]]:
        """Make the store hold exactly `items` (a fresh List); returns the changes as events."""
        events: list[tuple[str, Manifest]] = []
        fresh = {object_key(item): item for item in items}
        for key in [k for k in self._objects if k not in fresh]:
            gone = self._objects[key]
            self.delete(gone)
            events.append(("DELETED", gone))
        for key, item in fresh.items():
            old = self._objects.get(key)
            if old is not None and _version(old) == _version(item):
                continue
            events.append(self.upsert(item))
        return events

    def _unindex(self, key: Key, obj: Manifest) -> None:
        for name, index_of in self._indexers.items():
            for value in index_of(obj):
                keys = self._indexes[name].get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._indexes[name][value]


def _version(obj: Manifest) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


class Informer:
    """Keeps a `Store` of one kind (in one namespace or all, optionally label- or field-selected) current.

    A `field_selector` of `metadata.name=<name>` watches one object: RBAC then authorizes the LIST and
    WATCH against a Role rule restricted by `resourceNames` to that name (the frontend's API-key Secret).
    """

    def __init__(self, api: kube_mod.KubeApi, kind: str, *, namespace: str | None = None,
                 labels: dict[str, str] | None = None, field_selector: str | None = None, store: Store | None = None,
                 on_event: Handler | None = None, timeout_s: int = 300, max_pause_s: float = 30.0) -> None:
        self.api = api
        self.kind = kind
        self.namespace = namespace
        self.labels = labels
        self.field_selector = field_selector
        self.store = store if store is not None else Store()
        self.on_event = on_event
        self.timeout_s = timeout_s
        self.max_pause_s = max_pause_s
        self.synced = asyncio.Event()  # set once the first List is in the store
        self.lists = 0  # how many LISTs it needed: one, unless the API forgot our resourceVersion
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        where = self.namespace or "all namespaces"
        selected = "".join(f", {s}" for s in (self.labels, self.field_selector) if s)
        return f"Informer({self.kind} in {where}{selected})"

    async def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=repr(self))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def run(self) -> None:
        pause = 0.5
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self._list()
                version = await self._watch(version)
                pause = 0.5
            except asyncio.CancelledError:
                raise
            except httpx.TransportError as error:
                # The connection, not the API: resume from where we were (a 410 then says if that is too old).
                logger.warning("%r: %s; watching again in %.1fs", self, error or type(error).__name__, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, self.max_pause_s)
            except Exception as error:  # noqa: BLE001 - an informer must outlive API hiccups
                logger.warning("%r: %s; listing again in %.1fs", self, error, pause)
                version = None
                await asyncio.sleep(pause)
                pause = min(pause * 2, self.max_pause_s)

    async def _list(self) -> str:
        listed = await self.api.list_object(self.kind, self.namespace, labels=self.labels,
                                            field_selector=self.field_selector)
        self.lists += 1
        for event_type, obj in self.store.replace(listed["items"]):
            await self._deliver(event_type, obj)
        self.synced.set()
        return str(listed["metadata"]["resourceVersion"])

    async def _watch(self, version: str) -> str | None:
        """Watch from `version` until the server ends it; the version to resume from, None to list again."""
        try:
            async for event_type, obj in self.api.watch(self.kind, self.namespace, labels=self.labels,
                                                        field_selector=self.field_selector,
                                                        resource_version=version, timeout_seconds=self.timeout_s):
                if event_type == "ERROR":
                    # 410 Gone: our version was compacted away. Anything else is as bad: list again.
                    logger.info("%r: watch ended with %s; listing again", self, obj.get("message", obj))
                    return None
                version = _version(obj) or version
                if event_type == "BOOKMARK":
                    continue
                if event_type == "DELETED":
                    stored = self.store.delete(obj) or self.store.transform(obj)
                else:
                    event_type, stored = self.store.upsert(obj)
                await self._deliver(event_type, stored)
        except kube_mod.ApiError as error:
            if error.status == 410:
                return None
            raise
        return version

    async def _deliver(self, event_type: str, obj: Manifest) -> None:
        if self.on_event is None:
            return
        try:
            result = self.on_event(event_type, obj)
            if result is not None:
                await result
        except asyncio.CancelledError:
            raise
        except Exception:  # a consumer's bug must not stop the watch that others rely on
            logger.exception("%r: handler failed on %s %s", self, event_type, object_key(obj))
