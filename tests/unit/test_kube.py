"""The REST adapter's requests, against a recording transport: who we are, and what a verb sends."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleetpilot import kube


def token_kubeconfig(folder: Path, token: str) -> Path:
    """A ServiceAccount's kubeconfig as `kubectl create token` users (and the e2e harness) write it."""
    path = folder / "sa.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        # No CA to read: the transport below answers instead of a server.
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
    }))
    return path


def recording_api(kubeconfig: Path) -> tuple[kube.KubeApi, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"kind": "Status", "status": {"token": "minted"}, "items": [],
                                         "metadata": {"resourceVersion": "1"}})

    api = kube.KubeApi(kube.load_configuration(str(kubeconfig)), field_manager="test")
    api._http = httpx.AsyncClient(base_url="https://127.0.0.1:6443", transport=httpx.MockTransport(answer))
    return api, seen


def test_a_service_account_token_from_a_kubeconfig_is_sent_as_a_bearer_token(tmp_path: Path) -> None:
    # kubernetes 37's loaders keep the token under api_key["BearerToken"], already prefixed; a client
    # reading api_key["authorization"] alone would send none and be system:anonymous.
    api, seen = recording_api(token_kubeconfig(tmp_path, "abc.def"))

    async def go() -> None:
        await api.list("Pod", "ns")
        await api.aclose()

    asyncio.run(go())
    assert seen[0].headers["Authorization"] == "Bearer abc.def"
    assert seen[0].url.path == "/api/v1/namespaces/ns/pods"


def test_token_request_and_an_immediate_pod_removal(tmp_path: Path) -> None:
    api, seen = recording_api(token_kubeconfig(tmp_path, "t"))
    request: dict[str, Any] = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}

    async def go() -> dict[str, Any]:
        answer = await api.create_subresource("ServiceAccount", "ns", "worker", "token", request)
        await api.delete("Pod", "ns", "p", uid="u-1", grace_period_seconds=0)
        await api.delete("Pod", "ns", "q")
        await api.aclose()
        return answer

    answer = asyncio.run(go())
    assert answer["status"]["token"] == "minted"
    post, delete_now, delete = seen
    assert (post.method, post.url.path) == ("POST", "/api/v1/namespaces/ns/serviceaccounts/worker/token")
    assert json.loads(post.content) == request
    assert (delete_now.method, delete_now.url.path) == ("DELETE", "/api/v1/namespaces/ns/pods/p")
    assert json.loads(delete_now.content) == {"kind": "DeleteOptions", "apiVersion": "v1",
                                              "propagationPolicy": "Background", "preconditions": {"uid": "u-1"},
                                              "gracePeriodSeconds": 0}
    assert "gracePeriodSeconds" not in json.loads(delete.content)


class Chunked(httpx.AsyncByteStream):
    """An answer that arrives in small pieces, as a large List does."""

    def __init__(self, body: bytes, size: int) -> None:
        self.pieces = [body[i:i + size] for i in range(0, len(body), size)]

    async def __aiter__(self) -> Any:
        for piece in self.pieces:
            yield piece


def test_a_long_list_is_parsed_as_it_arrives_and_lets_the_event_loop_run(tmp_path: Path) -> None:
    pods = [{"metadata": {"name": f"p{i}", "labels": {"n": str(i)}}, "spec": {"nodeName": "a", "x": 1.5}}
            for i in range(300)]
    body = json.dumps({"kind": "PodList", "metadata": {"resourceVersion": "9"}, "items": pods}).encode()
    seen: list[httpx.Request] = []

    async def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, stream=Chunked(body, 1024))

    api = kube.KubeApi(kube.load_configuration(str(token_kubeconfig(tmp_path, "t"))), field_manager="test")
    api._http = httpx.AsyncClient(base_url="https://127.0.0.1:6443", transport=httpx.MockTransport(answer))
    ticks = 0

    async def other_work() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async def go() -> tuple[list[dict[str, Any]], int]:
        other = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        before = ticks
        items = [item async for item in api.list_items("Pod", cached=True, field_selector="spec.nodeName!=")]
        during = ticks - before
        other.cancel()
        await api.aclose()
        return items, during

    items, during = asyncio.run(go())
    assert items == pods
    assert during >= len(body) // 1024 - 1, "the loop ran between the chunks"
    assert seen[0].url.params["resourceVersion"] == "0" and seen[0].url.params["fieldSelector"] == "spec.nodeName!="


def test_a_refused_streamed_list_is_an_api_error(tmp_path: Path) -> None:
    api = kube.KubeApi(kube.load_configuration(str(token_kubeconfig(tmp_path, "t"))), field_manager="test")
    api._http = httpx.AsyncClient(base_url="https://127.0.0.1:6443", transport=httpx.MockTransport(
        lambda request: httpx.Response(403, text="pods is forbidden")))

    async def go() -> None:
        [item async for item in api.list_items("Pod")]

    try:
        asyncio.run(go())
    except kube.ApiError as error:
        assert error.status == 403 and "forbidden" in error.message
    else:
        raise AssertionError("a 403 must raise")
