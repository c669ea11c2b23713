"""The frontend's proxy in-process, over real simulator workers: generation pairing, holding requests
while no worker is ready (scale from zero), and the per-worker load a scale-down reads.

The frontend runs on an ASGI transport in the test's event loop, with a discovery the test changes
as pods would come and go; the workers are real simulator servers on loopback (test_sim_server's).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_sim_server import worker

from fleetpilot.api import contract
from fleetpilot.frontend import app as app_mod
from fleetpilot.frontend import routing

MODEL = "llama-8b"


class FakeDiscovery:
    """Workers the test sets, announced to the frontend's listeners as a pod watch would."""

    def __init__(self) -> None:
        self.by_role: dict[str, list[routing.Worker]] = {}
        self.listeners: list[Callable[[], None]] = []

    def workers(self, role: str) -> list[routing.Worker]:
        return list(self.by_role.get(role, []))

    def on_change(self, listener: Callable[[], None]) -> None:
        self.listeners.append(listener)

    def set(self, role: str, workers: list[routing.Worker]) -> None:
        self.by_role[role] = workers
        for listener in self.listeners:
            listener()

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


def frontend(discovery: FakeDiscovery, **kwargs: Any) -> tuple[app_mod.Frontend, httpx.AsyncClient]:
    fe = app_mod.Frontend(model=MODEL, mode="disaggregated", discovery=discovery, policy=routing.RoundRobin(),
                          **kwargs)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=fe.app()), base_url="http://frontend",
                               timeout=30)
    return fe, client


def metric(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


@contextlib.contextmanager
def workers(*specs: tuple[str, str]) -> Iterator[list[routing.Worker]]:
    """Simulator workers, one per (role, generation). A prefill worker holds a request's KV for the
    decode worker's pull far longer than any test waits: at the workers' speedup the default hold
    timeout passes in a fraction of a wall-clock second, less than a pull can take on a busy machine."""
    with contextlib.ExitStack() as stack:
        found = []
        for i, (role, generation) in enumerate(specs):
            w = stack.enter_context(worker(role=role, hold_timeout=1e6))  # type: ignore[arg-type]
            found.append(routing.Worker(w.url, role, f"{role}-{generation}-{i}", generation))
        yield found


def complete(client: httpx.AsyncClient, **body: Any) -> Any:
    return client.post("/v1/completions", json={"model": MODEL, "prompt": "a b c d", "max_tokens": 4, **body})


def test_prefill_and_decode_always_share_a_generation() -> None:
    with workers(("prefill", "old"), ("prefill", "new"), ("decode", "old"), ("decode", "new")) as (
            p_old, p_new, d_old, d_new):

        async def go() -> str:
            discovery = FakeDiscovery()
            discovery.set("prefill", [p_old, p_new])
            discovery.set("decode", [d_old])  # mid-rollout: the new generation has no decode worker yet
            _, client = frontend(discovery)
            async with client:
                for _ in range(4):
                    assert (await complete(client)).status_code == 200
                discovery.set("decode", [d_old, d_new])
                for _ in range(8):
                    assert (await complete(client)).status_code == 200
                return (await client.get("/metrics")).text

        text = asyncio.run(go())
    pairs = {(labels["prefill_generation"], labels["decode_generation"]): value
             for labels, value in metric(text, "fleetpilot_frontend_generation_pairs_total")}
    assert set(pairs) == {("old", "old"), ("new", "new")}, pairs
    assert pairs[("old", "old")] >= 4 + 1 and pairs[("new", "new")] >= 1  # both carry traffic once paired
    assert sum(pairs.values()) == 12


def test_a_prefill_whose_generation_loses_its_decode_workers_is_redone_on_one_that_pairs() -> None:
    with workers(("prefill", "old"), ("prefill", "new"), ("decode", "old"), ("decode", "new")) as (
            p_old, p_new, d_old, d_new):
        retired: list[str] = []

        async def retire_old(request: httpx.Request) -> None:
            # The moment the prefill reaches the old generation, a rollout retires that generation.
            if str(request.url) == p_old.url + "/v1/completions" and not retired:
                retired.append(str(request.url))
                discovery.set("prefill", [p_new])
                discovery.set("decode", [d_new])

        discovery = FakeDiscovery()
        discovery.set("prefill", [p_old])
        discovery.set("decode", [d_old, d_new])

        async def go() -> tuple[int, str]:
            fe, client = frontend(discovery)
            fe.client.event_hooks["request"].append(retire_old)
            async with client:
                response = await complete(client)
                return response.status_code, (await client.get("/metrics")).text

        status, text = asyncio.run(go())
    assert retired, "the first prefill went to the old generation"
    assert status == 200
    pairs = {(labels["prefill_generation"], labels["decode_generation"]): value
             for labels, value in metric(text, "fleetpilot_frontend_generation_pairs_total")}
    assert pairs == {("new", "new"): 1}, pairs


def test_a_request_with_no_worker_is_held_until_one_is_ready() -> None:
    with workers(("prefill", "g"), ("decode", "g")) as found:

        async def go() -> tuple[int, str, str]:
            discovery = FakeDiscovery()
            fe, client = frontend(discovery, hold_seconds=30)
            async with client:
                ready = await client.get("/ready")
                assert ready.status_code == 200 and ready.json()["holding"]  # reachable, to be woken
                request = asyncio.create_task(complete(client))
                await wait_until(lambda: fe.held == 1)
                held = (await client.get("/metrics")).text
                discovery.set("prefill", found[:1])
                await asyncio.sleep(0.05)
                assert not request.done()  # a prefill worker alone cannot serve it
                discovery.set("decode", found[1:])
                response = await request
                return response.status_code, held, (await client.get("/metrics")).text

        status, held, after = asyncio.run(go())
    assert status == 200
    assert metric(held, contract.HELD_METRIC)[0][1] == 1
    assert metric(after, contract.HELD_METRIC)[0][1] == 0
    assert metric(after, "fleetpilot_frontend_requests_held_total", outcome="served")[0][1] == 1


def test_a_full_hold_queue_and_a_hold_timeout_are_503_with_retry_after() -> None:
    async def go() -> tuple[httpx.Response, httpx.Response, str]:
        discovery = FakeDiscovery()
        fe, client = frontend(discovery, hold_seconds=0.5, hold_queue=1)
        async with client:
            first = asyncio.create_task(complete(client))
            await wait_until(lambda: fe.held == 1)
            full = await complete(client)
            timed_out = await first
            return full, timed_out, (await client.get("/metrics")).text

    full, timed_out, text = asyncio.run(go())
    for response, code in ((full, "hold_queue_full"), (timed_out, "hold_timeout")):
        assert response.status_code == 503, response.text
        assert int(response.headers["retry-after"]) > 0
        assert response.json()["error"]["code"] == code
    assert metric(text, "fleetpilot_frontend_requests_total", status="error")[0][1] == 2
    assert metric(text, contract.INFLIGHT_METRIC)[0][1] == 0


def test_without_holding_no_worker_is_503_at_once_with_retry_after() -> None:
    async def go() -> httpx.Response:
        _, client = frontend(FakeDiscovery())
        async with client:
            assert (await client.get("/ready")).status_code == 503
            return await complete(client)

    response = asyncio.run(go())
    assert response.status_code == 503 and response.headers["retry-after"]


def test_the_frontend_counts_requests_in_flight_per_worker_pod() -> None:
    with workers(("prefill", "g"), ("decode", "g")) as (prefill, decode):

        async def go() -> tuple[str, str]:
            discovery = FakeDiscovery()
            discovery.set("prefill", [prefill])
            discovery.set("decode", [decode])
            fe, client = frontend(discovery)
            async with client:
                long = asyncio.create_task(complete(client, max_tokens=20_000))
                await wait_until(lambda: fe.load.get(decode.url, 0) > 0)
                during = (await client.get("/metrics")).text
                long.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await long
                await wait_until(lambda: fe.load.get(decode.url, 0) == 0)
                return during, (await client.get("/metrics")).text

        during, after = asyncio.run(go())
    assert metric(during, contract.WORKER_LOAD_METRIC) == [({"model": MODEL, "worker": decode.name}, 1.0)]
    assert metric(after, contract.WORKER_LOAD_METRIC) == []  # idle workers are left out


def test_the_idle_clock_restarts_with_each_request() -> None:
    with workers(("prefill", "g"), ("decode", "g")) as (prefill, decode):

        async def go() -> tuple[float, float]:
            discovery = FakeDiscovery()
            discovery.set("prefill", [prefill])
            discovery.set("decode", [decode])
            _, client = frontend(discovery)
            async with client:
                await asyncio.sleep(0.3)
                before = metric((await client.get("/metrics")).text, contract.IDLE_METRIC)[0][1]
                await complete(client)
                return before, metric((await client.get("/metrics")).text, contract.IDLE_METRIC)[0][1]

        before, after = asyncio.run(go())
    assert before >= 0.3 and after < before


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


@pytest.fixture(autouse=True)
def _quiet_httpx() -> None:
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
