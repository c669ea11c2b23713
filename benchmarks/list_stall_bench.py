"""How long one LIST of every pod in a large cluster holds the operator's event loop.

`KubeApi.list` (the answer read whole, then `json.loads`) against `KubeApi.list_items` (parsed as it
arrives, the loop yielded between chunks), on the same synthetic PodList: `--pods` copies of a pod as
kwok runs them (~4.4 KB of JSON each, managedFields included), delivered in 64-KB chunks by an
in-process transport (no network: what is measured is the client's own work). A ticker task records
the longest gap between its turns: the time every other watch and reconcile of the process waited.

Run: `~/.cache/fleetpilot/venv/bin/python benchmarks/list_stall_bench.py [--pods 4000] [--repeat 3]`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from kubernetes import client as k8s_client

from fleetpilot import kube

CHUNK = 65536


def kwok_pod(i: int) -> dict[str, Any]:
    """A pod of a simulator graph as the apiserver returns it on a kwok node (fields abridged only in values)."""
    labels = {"app.kubernetes.io/name": "fleetpilot", "app.kubernetes.io/component": "decode",
              "fleetpilot.dev/graph": f"g{i // 4:04d}", "pod-template-hash": "7d9df85ff7"}
    fields = {f"f:{k}": {} for k in labels}
    return {
        "metadata": {"name": f"g{i // 4:04d}-decode-7d9df85ff7-{i:05d}", "namespace": "scale", "uid": f"uid-{i}",
                     "resourceVersion": str(100000 + i), "labels": labels,
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u",
                                          "controller": True, "blockOwnerDeletion": True}],
                     "managedFields": [{"manager": m, "operation": "Update", "apiVersion": "v1",
                                        "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": fields}}}
                                       for m in ("kube-controller-manager", "kwok", "kube-scheduler")]},
        "spec": {"nodeName": f"kwok-node-{i % 377}", "containers": [{
            "name": "engine", "image": "ghcr.io/fleetpilot/sim:latest", "args": ["--role", "decode"] * 8,
            "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "1"}, "limits": {"nvidia.com/gpu": "1"}},
            "env": [{"name": f"VAR_{k}", "value": "x" * 40} for k in range(12)]}],
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": "2026-11-26T16:00:00Z"}
            for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]},
    }


class Chunks(httpx.AsyncByteStream):
    def __init__(self, body: bytes) -> None:
        self.body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for start in range(0, len(self.body), CHUNK):
            yield self.body[start:start + CHUNK]


async def longest_stall(work: Any) -> tuple[float, float]:
    """(longest gap between a ticker's turns, wall time) while `work` runs."""
    gaps: list[float] = []
    last = time.perf_counter()

    async def ticker() -> None:
        nonlocal last
        while True:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    started = time.perf_counter()
    await work()
    took = time.perf_counter() - started
    await asyncio.sleep(0)  # the ticker's turn after the work: the gap that the work's last step left
    await asyncio.sleep(0)
    task.cancel()
    return max(gaps, default=0.0), took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                       "items": [kwok_pod(i) for i in range(args.pods)]}).encode()
    api = kube.KubeApi(k8s_client.Configuration(host="https://apiserver"), field_manager="bench")
    api._http = httpx.AsyncClient(  # no apiserver: an in-process transport answers
base_url="https://apiserver", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, stream=Chunks(body))))
    print(f"a PodList of {args.pods:,} pods, {len(body) / 1e6:.1f} MB, in {CHUNK // 1024}-KB chunks")

    async def whole() -> None:
        assert len(await api.list("Pod")) == args.pods

    async def streamed() -> None:
        assert len([p async for p in api.list_items("Pod")]) == args.pods

    async def run() -> None:
        for label, work in (("list (whole answer, json.loads)", whole), ("list_items (parsed as it arrives)", streamed)):
            results = [await longest_stall(work) for _ in range(args.repeat)]
            stall = min(r[0] for r in results)
            wall = min(r[1] for r in results)
            print(f"  {label:36s} longest event-loop stall {1000 * stall:7.1f} ms, wall {1000 * wall:7.1f} ms"
                  f" (best of {args.repeat})")

    asyncio.run(run())


if __name__ == "__main__":
    main()
