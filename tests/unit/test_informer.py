"""The list+watch helper against a scripted API: resume without listing, list again on 410, no lost deletion."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from fleetpilot import informer as informer_mod
from fleetpilot import kube


def pod(name: str, version: str, *, graph: str = "g", namespace: str = "ns") -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": namespace, "resourceVersion": version,
                                        "labels": {"graph": graph}, "managedFields": [{"manager": "x"}]}}


class ScriptedApi:
    """Answers LISTs from `lists` and WATCHes from `watches`, in order, recording what was asked."""

    def __init__(self, lists: list[dict[str, Any]], watches: list[list[tuple[str, dict[str, Any]]] | Exception]) -> None:
        self.lists = lists
        self.watches = watches
        self.calls: list[tuple[str, str | None]] = []
        self.exhausted = asyncio.Event()

    async def list_object(self, kind: str, namespace: str | None = None, **_: Any) -> dict[str, Any]:
        self.calls.append(("list", None))
        return self.lists.pop(0)

    async def watch(self, kind: str, namespace: str | None, *, resource_version: str,
                    **_: Any) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.calls.append(("watch", resource_version))
        if not self.watches:
            self.exhausted.set()
            await asyncio.Event().wait()  # a quiet watch that never ends
        script = self.watches.pop(0)
        if isinstance(script, Exception):
            raise script
        for event in script:
            yield event


async def run_until_exhausted(api: ScriptedApi, **options: Any) -> tuple[informer_mod.Informer, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    watcher = informer_mod.Informer(api, "Pod", on_event=lambda t, o: seen.append((t, o["metadata"]["name"])),  # type: ignore[arg-type]
                                    max_pause_s=0.01, **options)
    await watcher.start()
    await asyncio.wait_for(api.exhausted.wait(), 5)
    await watcher.stop()
    return watcher, seen


def listing(*items: dict[str, Any], version: str) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": version}, "items": list(items)}


def test_a_watch_that_times_out_resumes_from_the_last_version_without_listing() -> None:
    api = ScriptedApi(
        lists=[listing(pod("a", "1"), version="10")],
        watches=[
            [("ADDED", pod("b", "11")), ("BOOKMARK", {"metadata": {"resourceVersion": "15"}})],
            [("MODIFIED", pod("a", "16"))],
        ],
    )
    watcher, seen = asyncio.run(run_until_exhausted(api))
    assert api.calls == [("list", None), ("watch", "10"), ("watch", "15"), ("watch", "16")]
    assert watcher.lists == 1
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "a")]
    assert watcher.store.get("ns", "a")["metadata"]["resourceVersion"] == "16"  # type: ignore[index]
    assert "managedFields" not in watcher.store.get("ns", "a")["metadata"]  # type: ignore[index]


def test_410_gone_lists_again_and_reports_what_changed_meanwhile_including_deletions() -> None:
    api = ScriptedApi(
        lists=[listing(pod("a", "1"), pod("b", "2"), version="10"),
               listing(pod("a", "1"), pod("c", "30"), version="40")],
        watches=[[("ERROR", {"kind": "Status", "code": 410, "message": "too old resource version"})]],
    )
    watcher, seen = asyncio.run(run_until_exhausted(api))
    assert api.calls == [("list", None), ("watch", "10"), ("list", None), ("watch", "40")]
    # "a" did not change: no event for it; "b" went while we were not watching; "c" came.
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "b"), ("ADDED", "c")]
    assert sorted(p["metadata"]["name"] for p in watcher.store.objects()) == ["a", "c"]


def test_a_dropped_connection_watches_again_from_where_it_was_and_an_api_error_lists_again() -> None:
    api = ScriptedApi(
        lists=[listing(version="10"), listing(version="50")],
        watches=[
            httpx.ReadError("connection reset"),
            [("ADDED", pod("a", "12"))],
            kube.ApiError(500, "etcd is unhappy"),
        ],
    )
    _watcher, seen = asyncio.run(run_until_exhausted(api))
    assert api.calls == [("list", None), ("watch", "10"), ("watch", "10"), ("watch", "12"), ("list", None),
                         ("watch", "50")]
    assert seen == [("ADDED", "a"), ("DELETED", "a")]


def test_a_failing_handler_does_not_stop_the_watch() -> None:
    api = ScriptedApi(lists=[listing(version="1")], watches=[[("ADDED", pod("a", "2")), ("ADDED", pod("b", "3"))]])

    def explode(event_type: str, obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] == "a":
            raise RuntimeError("consumer bug")

    watcher = informer_mod.Informer(api, "Pod", on_event=explode)  # type: ignore[arg-type]

    async def go() -> None:
        await watcher.start()
        await asyncio.wait_for(api.exhausted.wait(), 5)
        await watcher.stop()

    asyncio.run(go())
    assert watcher.store.get("ns", "b") is not None


def test_store_indexes_follow_updates_and_deletions() -> None:
    store = informer_mod.Store(indexers={"graph": lambda o: [o["metadata"]["labels"]["graph"]]})
    store.upsert(pod("a", "1", graph="g1"))
    store.upsert(pod("b", "1", graph="g1"))
    assert [p["metadata"]["name"] for p in store.by_index("graph", "g1")] == ["a", "b"]
    store.upsert(pod("a", "2", graph="g2"))  # relabelled
    assert [p["metadata"]["name"] for p in store.by_index("graph", "g1")] == ["b"]
    assert [p["metadata"]["name"] for p in store.by_index("graph", "g2")] == ["a"]
    store.delete(pod("b", "3"))
    assert store.by_index("graph", "g1") == []
    assert len(store) == 1


@pytest.mark.parametrize("event", ["ADDED", "MODIFIED"])
def test_store_upsert_says_whether_the_object_is_new(event: str) -> None:
    store = informer_mod.Store()
    if event == "MODIFIED":
        store.upsert(pod("a", "1"))
    kind, _ = store.upsert(pod("a", "2"))
    assert kind == event
