"""Where the frontend's workers are: a static list, or the graph's Ready pods.

Pod discovery lists and then watches Pods labelled with the graph (as the Gateway API inference
extension's endpoint picker does), keeping those with the Ready condition and a pod IP. It needs no
cluster DNS, kube-proxy or EndpointSlices — which refuse the loopback pod IPs used in tests. The
informer resumes a watch the server ended without listing again; after an error it lists again
after a short, growing pause, and the last known workers stay in use meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from fleetpilot import informer, kube
from fleetpilot.api import contract
from fleetpilot.frontend.routing import Worker

logger = logging.getLogger("fleetpilot.frontend")



class Discovery(Protocol):
    def workers(self, role: str) -> list[Worker]: ...

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` whenever the set of workers changes (a request held for a worker wakes)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class StaticDiscovery:
    """A fixed set of worker URLs, for local runs and tests without Kubernetes."""

    def __init__(self, by_role: dict[str, Iterable[str]]) -> None:
        self._workers = {role: [Worker(url.rstrip("/"), role, url) for url in urls] for role, urls in by_role.items()}

    def workers(self, role: str) -> list[Worker]:
        return list(self._workers.get(role, []))

    def on_change(self, listener: Callable[[], None]) -> None:
        pass  # a fixed set never changes

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


def worker_from_pod(pod: dict[str, Any], *, default_port: int = 8000) -> Worker | None:
    """A Ready worker pod with an IP becomes a worker; anything else is not routable."""
    meta = pod.get("metadata", {})
    labels = meta.get("labels", {})
    role = labels.get(contract.LABEL_COMPONENT)
    url = contract.pod_http_url(pod, default_port=default_port)
    if role not in contract.WORKER_ROLES or url is None or contract.is_group_worker(pod):
        return None  # a multinode replica is reached through its leader only
    return Worker(url, role, meta.get("name", ""), labels.get(contract.LABEL_GENERATION, ""))


class PodDiscovery:
    """Watches the graph's pods in one namespace (fleetpilot.informer: one watch, resumed, at rest)."""

    def __init__(self, api: kube.KubeApi, *, namespace: str, graph: str) -> None:
        self.api = api
        self.namespace = namespace
        self._pods: dict[str, Worker] = {}
        self._listeners: list[Callable[[], None]] = []
        self._informer = informer.Informer(api, "Pod", namespace=namespace, labels=contract.graph_selector(graph),
                                           on_event=self._update)
        self.synced = self._informer.synced

    def workers(self, role: str) -> list[Worker]:
        return [w for w in self._pods.values() if w.role == role]

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        await self._informer.start()

    async def stop(self) -> None:
        await self._informer.stop()

    def _update(self, event_type: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        worker = None if event_type == "DELETED" else worker_from_pod(pod)
        # A pod that is terminating (deletionTimestamp), not Ready or gone gets no new request from
        # the moment its event arrives; what it serves already finishes (it drains).
        if worker is None:
            if self._pods.pop(name, None) is None:
                return
            logger.info("worker %s left", name)
        elif self._pods.get(name) != worker:
            self._pods[name] = worker
            logger.info("worker %s (%s, generation %s) at %s", name, worker.role, worker.generation or "-",
                        worker.url)
        else:
            return
        for listener in self._listeners:
            listener()
