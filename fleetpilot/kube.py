"""A thin async Kubernetes REST adapter: get, list, watch, create, replace, server-side apply, delete, events.

The only door to the API for the operator, the planner, the frontend's worker discovery and the e2e
pod runner. Credentials come from the `kubernetes` package's config loaders (kubeconfig or
in-cluster, with token refresh); requests go through one pooled `httpx.AsyncClient`, so a reconcile
never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import ijson
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

import fleetpilot
from fleetpilot.api import contract

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    """Where a kind lives in the REST API."""

    api_version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [prefix]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name:
            parts.append(name)
        if subresource:
            parts.append(subresource)
        return "/".join(parts)


KINDS: dict[str, Kind] = {
    "DynamoGraph": Kind("fleetpilot.dev/v1alpha1", "dynamographs"),
    "DynamoGraphComponent": Kind("fleetpilot.dev/v1alpha1", "dynamographcomponents"),
    "Deployment": Kind("apps/v1", "deployments"),
    "StatefulSet": Kind("apps/v1", "statefulsets"),
    "Service": Kind("v1", "services"),
    "ServiceAccount": Kind("v1", "serviceaccounts"),
    "ConfigMap": Kind("v1", "configmaps"),
    "Secret": Kind("v1", "secrets"),
    "Pod": Kind("v1", "pods"),
    "Event": Kind("v1", "events"),
    "Node": Kind("v1", "nodes", namespaced=False),
    "PodDisruptionBudget": Kind("policy/v1", "poddisruptionbudgets"),
    "Role": Kind("rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": Kind("rbac.authorization.k8s.io/v1", "rolebindings"),
    "NetworkPolicy": Kind("networking.k8s.io/v1", "networkpolicies"),
    "Lease": Kind("coordination.k8s.io/v1", "leases"),
}


class ApiError(Exception):
    """A non-2xx answer from the apiserver, with its Status message."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


def _selectors(labels: dict[str, str] | None, field_selector: str | None) -> dict[str, str]:
    params: dict[str, str] = {}
    if labels:
        params["labelSelector"] = ",".join(f"{k}={v}" for k, v in labels.items())
    if field_selector:
        params["fieldSelector"] = field_selector
    return params


def _list_params(labels: dict[str, str] | None, field_selector: str | None, cached: bool) -> dict[str, str]:
    """A LIST's query: its selectors, and resourceVersion 0 (any version: the apiserver's watch cache,
    not a quorum read of etcd) when `cached`."""
    return {**_selectors(labels, field_selector), **({"resourceVersion": "0"} if cached else {})}


def load_configuration(kubeconfig: str | None = None) -> k8s_client.Configuration:
    """In-cluster credentials when running in a pod, else the kubeconfig ($KUBECONFIG by default)."""
    configuration = k8s_client.Configuration()
    if kubeconfig is None:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return configuration
        except k8s_config.ConfigException:
            kubeconfig = os.environ.get("KUBECONFIG")  # read now, not when the kubernetes package loaded
    k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    return configuration


class KubeApi:
    """Async REST calls with the operator's identity and field manager."""

    def __init__(self, configuration: k8s_client.Configuration | None = None, *,
                 field_manager: str = contract.OPERATOR) -> None:
        self._configuration = configuration or load_configuration()
        # The field manager is also who we are: in the User-Agent, and so in the apiserver's audit log.
        self.field_manager = field_manager
        verify: ssl.SSLContext | bool = False
        if self._configuration.verify_ssl:
            verify = ssl.create_default_context(cafile=self._configuration.ssl_ca_cert)
            if self._configuration.cert_file:
                verify.load_cert_chain(self._configuration.cert_file, self._configuration.key_file)
        self._http = httpx.AsyncClient(
            base_url=self._configuration.host,
            verify=verify,
            timeout=httpx.Timeout(30.0, connect=5.0),
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=16),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json",
                   "User-Agent": f"{self.field_manager}/{fleetpilot.__version__}"}
        # get_api_key_with_prefix runs the refresh hook, so rotated in-cluster tokens are picked up. The
        # kubernetes package keeps a token under "BearerToken" (kubeconfig and in-cluster alike).
        token = self._configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def _request(
        self, method: str, path: str, *, params: dict[str, str] | None = None, body: Any = None,
        content_type: str | None = None,
    ) -> Manifest:
        content = json.dumps(body) if body is not None else None
        response = await self._http.request(
            method, path, params=params, content=content,
            headers=self._headers(content_type or ("application/json" if body is not None else None)),
        )
        if response.status_code >= 400:
            try:
                status = response.json()
                raise ApiError(response.status_code, status.get("message", response.text), status.get("reason", ""))
            except ValueError:
                raise ApiError(response.status_code, response.text) from None
        return response.json() if response.content else {}

    # -- verbs -----------------------------------------------------------------------------------------

    async def get(self, kind: str, namespace: str | None, name: str) -> Manifest:
        return await self._request("GET", KINDS[kind].path(namespace, name))

    async def list(
        self, kind: str, namespace: str | None = None, *, labels: dict[str, str] | None = None,
        field_selector: str | None = None, cached: bool = False,
    ) -> list[Manifest]:
        items: list[Manifest] = (await self.list_object(kind, namespace, labels=labels,
                                                        field_selector=field_selector, cached=cached))["items"]
        return items

    async def list_object(
        self, kind: str, namespace: str | None = None, *, labels: dict[str, str] | None = None,
        field_selector: str | None = None, cached: bool = False,
    ) -> Manifest:
        """The whole List, with metadata.resourceVersion to start a watch from. `cached`: from the
        apiserver's watch cache (resourceVersion 0: any version, cheap), not a quorum read of etcd."""
        return await self._request("GET", KINDS[kind].path(namespace),
                                   params=_list_params(labels, field_selector, cached))

    async def list_items(
        self, kind: str, namespace: str | None = None, *, field_selector: str | None = None, cached: bool = False,
    ) -> AsyncIterator[Manifest]:
        """A List's items one by one as the answer arrives, yielding the event loop between chunks.

        For lists of thousands (every pod in the cluster, ~18 MB at 4,000 pods): `json.loads` of the
        whole answer held the event loop for 1-3 s on a loaded machine, and with it every watch and
        reconcile of the process. Parsed incrementally (ijson), each chunk costs milliseconds."""
        async with self._http.stream("GET", KINDS[kind].path(namespace),
                                     params=_list_params(None, field_selector, cached),
                                     headers=self._headers()) as response:
            if response.status_code >= 400:
                await response.aread()
                raise ApiError(response.status_code, response.text)
            parsed: list[Manifest] = ijson.sendable_list()
            parser = ijson.items_coro(parsed, "items.item", use_float=True)
            async for chunk in response.aiter_bytes():
                parser.send(chunk)
                for item in parsed:
                    yield item
                del parsed[:]
                await asyncio.sleep(0)  # a chunk that was already buffered must not hold the loop either
            parser.close()
            for item in parsed:
                yield item

    async def watch(
        self, kind: str, namespace: str | None, *, resource_version: str, labels: dict[str, str] | None = None,
        field_selector: str | None = None, timeout_seconds: int = 300,
    ) -> AsyncIterator[tuple[str, Manifest]]:
        """(event type, object) pairs until the server ends the watch; the caller re-lists on error."""
        params = {**_selectors(labels, field_selector), "watch": "true", "resourceVersion": resource_version,
                  "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_seconds)}
        async with self._http.stream("GET", KINDS[kind].path(namespace), params=params, headers=self._headers(),
                                     timeout=httpx.Timeout(timeout_seconds + 30, connect=5.0)) as response:
            if response.status_code >= 400:
                await response.aread()
                raise ApiError(response.status_code, response.text)
            async for line in response.aiter_lines():
                if line.strip():
                    event = json.loads(line)
                    yield event["type"], event["object"]

    async def create(self, manifest: Manifest) -> Manifest:
        kind = KINDS[manifest["kind"]]
        namespace = manifest["metadata"].get("namespace")
        return await self._request(
            "POST", kind.path(namespace), params={"fieldManager": self.field_manager}, body=manifest
        )

    async def replace(self, manifest: Manifest) -> Manifest:
        """PUT the whole object; its metadata.resourceVersion makes it conditional (409 when stale)."""
        kind = KINDS[manifest["kind"]]
        meta = manifest["metadata"]
        return await self._request(
            "PUT", kind.path(meta.get("namespace"), meta["name"]), params={"fieldManager": self.field_manager},
            body=manifest,
        )

    async def apply(self, manifest: Manifest, *, subresource: str | None = None) -> Manifest:
        """Server-side apply as the operator's field manager; fields we stop sending are removed."""
        kind = KINDS[manifest["kind"]]
        meta = manifest["metadata"]
        return await self._request(
            "PATCH",
            kind.path(meta.get("namespace"), meta["name"], subresource),
            params={"fieldManager": self.field_manager, "force": "true"},
            body=manifest,
            content_type="application/apply-patch+yaml",
        )

    async def patch(self, kind: str, namespace: str | None, name: str, body: Manifest, *,
                    subresource: str | None = None) -> Manifest:
        """A JSON merge patch: for the one field an actor owns, such as /scale's spec.replicas."""
        return await self._request(
            "PATCH", KINDS[kind].path(namespace, name, subresource), params={"fieldManager": self.field_manager},
            body=body, content_type="application/merge-patch+json",
        )

    async def create_subresource(self, kind: str, namespace: str | None, name: str, subresource: str,
                                 body: Manifest) -> Manifest:
        """POST to an object's subresource, such as a ServiceAccount's `token` (a TokenRequest)."""
        return await self._request("POST", KINDS[kind].path(namespace, name, subresource), body=body)

    async def delete(self, kind: str, namespace: str | None, name: str, *, uid: str | None = None,
                     grace_period_seconds: int | None = None) -> None:
        """Delete in the background; with `uid`, only that very object (never a same-named newcomer).

        `grace_period_seconds=0` removes a pod at once: what a kubelet does once its containers stopped.
        """
        body: Manifest = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        try:
            await self._request("DELETE", KINDS[kind].path(namespace, name), body=body)
        except ApiError as error:
            if not error.not_found:
                raise

    async def event(
        self, regarding: Manifest, *, type_: str, reason: str, message: str, component: str | None = None
    ) -> None:
        """Record a core/v1 Event about an object (what `kubectl describe` shows)."""
        meta = regarding["metadata"]
        now = contract.now_rfc3339()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": regarding["apiVersion"], "kind": regarding["kind"], "name": meta["name"],
                "namespace": meta["namespace"], "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": component or self.field_manager},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self.create(event)
