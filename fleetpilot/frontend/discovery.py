"""Where the frontend's workers are: a static list, or the graph's Ready pods.

Pod discovery lists and then watches Pods labelled with the graph (as the Gateway API inference
extension's endpoint picker does), keeping those with the Ready condition and a pod IP. It needs no
cluster DNS, kube-proxy or EndpointSlices — which refuse the loopback pod IPs used in tests. A
broken watch re-lists after a short, growing pause; the last known workers stay in use meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Protocol

from fleetpilot import kube
from fleetpilot.frontend.routing import Worker

logger = logging.getLogger("fleetpilot.frontend")

LABEL_GRAPH = "fleetpilot.dev/graph"
LABEL_COMPONENT = "fleetpilot.dev/component"
ROLES = ("prefill", "decode", "aggregated")


class Discovery(Protocol):
    def workers(self, role: str) -> list[Worker]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class StaticDiscovery:
    """A fixed set of worker URLs, for local runs and tests without Kubernetes."""

    def __init__(self, by_role: dict[str, Iterable[str]]) -> None:
        self._workers = {role: [Worker(url.rstrip("/"), role, url) for url in urls] for role, urls in by_role.items()}

    def workers(self, role: str) -> list[Worker]:
        return list(self._workers.get(role, []))

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


def worker_from_pod(pod: dict[str, Any], *, default_port: int = 8000) -> Worker | None:
    """A Ready pod with an IP becomes a worker; anything else is not routable."""
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    role = meta.get("labels", {}).get(LABEL_COMPONENT)
    ip = status.get("podIP")
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
    if role not in ROLES or not ip or not ready or meta.get("deletionTimestamp"):
        return None
    port = default_port
    for container in pod.get("spec", {}).get("containers", []):
        for declared in container.get("ports", []):
            if declared.get("name") == "http":
                port = int(declared["containerPort"])
    return Worker(f"http://{ip}:{port}", role, meta.get("name", ""))


class PodDiscovery:
    """Watches the graph's pods in one namespace."""

    def __init__(self, api: kube.KubeApi, *, namespace: str, graph: str) -> None:
        self.api = api
        self.namespace = namespace
        self.labels = {LABEL_GRAPH: graph}
        self._pods: dict[str, Worker] = {}
        self._task: asyncio.Task[None] | None = None
        self.synced = asyncio.Event()

    def workers(self, role: str) -> list[Worker]:
        return [w for w in self._pods.values() if w.role == role]

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="pod-discovery")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _update(self, event_type: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        worker = None if event_type == "DELETED" else worker_from_pod(pod)
        if worker is None:
            if self._pods.pop(name, None) is not None:
                logger.info("worker %s left", name)
        elif self._pods.get(name) != worker:
            self._pods[name] = worker
            logger.info("worker %s (%s) at %s", name, worker.role, worker.url)

    async def _run(self) -> None:
        pause = 0.5
        while True:
            try:
                listed = await self.api.list_object("Pod", self.namespace, labels=self.labels)
                current = {p["metadata"]["name"] for p in listed["items"]}
                for gone in set(self._pods) - current:
                    self._pods.pop(gone)
                for pod in listed["items"]:
                    self._update("ADDED", pod)
                self.synced.set()
                version = listed["metadata"]["resourceVersion"]
                async for event_type, obj in self.api.watch("Pod", self.namespace, labels=self.labels,
                                                            resource_version=version):
                    if event_type == "BOOKMARK":
                        continue
                    if event_type == "ERROR":
                        break  # typically 410 Gone: re-list
                    self._update(event_type, obj)
                pause = 0.5
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - discovery must outlive API hiccups
                logger.warning("pod watch failed: %s; re-listing in %.1fs", error, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 30.0)
