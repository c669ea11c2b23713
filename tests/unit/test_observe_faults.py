"""The planner against a Prometheus that answers badly: NaN, empty vectors, stale samples, HTTP 500, a
hang, series without the labels it groups by. Replicas hold, the graph says why, planning resumes when
good answers return; and a thousand graphs cost a dozen queries an interval, not a dozen per graph.

A tiny HTTP server speaking Prometheus' instant-query API plays Prometheus here, because what is under
test is the planner's reaction to the answer itself, and a real Prometheus cannot be made to give these
answers on demand: its samples are stamped with the evaluation time (never stale in an instant query),
it answers 500 only when broken, it does not hang for a chosen time, and its `sum by (namespace, graph)`
never returns a series without those labels. Staleness and outages of a real Prometheus are in
tests/integration (`test_planner.py`, `test_faults.py`).
"""

from __future__ import annotations

import asyncio
import http.server
import json
import math
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import core, live, observe, step


class FakePrometheus:
    """Answers /api/v1/query for the graphs it is told about, in the `mode` the test sets."""

    def __init__(self, graphs: list[tuple[str, str]]) -> None:
        self.graphs = graphs
        self.mode = "ok"
        self.hang_s = 3.0
        self.received: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["query"][0]
                owner.received.append(query)
                status, body = owner.answer(query)
                if owner.mode == "hang":
                    time.sleep(owner.hang_s)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                try:
                    self.wfile.write(json.dumps(body).encode())
                except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting: as it should
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, query: str) -> tuple[int, dict[str, Any]]:
        if self.mode == "500":
            return 500, {"status": "error", "errorType": "internal", "error": "query processing failed"}
        now = time.time()
        stamp = now - 3600 if self.mode == "stale" else now
        value = {"nan": "NaN", "empty": None}.get(self.mode, "5")
        if value is None:
            return 200, {"status": "success", "data": {"resultType": "vector", "result": []}}

        def labels(namespace: str, graph: str) -> dict[str, str]:
            if self.mode == "labels":  # what a relabelling that names them otherwise would give
                return {"kubernetes_namespace": namespace, "app": graph}
            return {"namespace": namespace, "graph": graph}

        result = []
        for namespace, graph in self.graphs:
            if "_tokens_bucket" in query and "le)" in query:  # the length histograms, cumulative per bound
                for i, bound in enumerate(contract.TOKEN_BUCKETS):
                    le = "+Inf" if math.isinf(bound) else f"{bound:g}"
                    result.append({"metric": {**labels(namespace, graph), "le": le}, "value": [stamp, str(i)]})
            else:
                result.append({"metric": labels(namespace, graph), "value": [stamp, value]})
        return 200, {"status": "success", "data": {"resultType": "vector", "result": result}}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    fake = FakePrometheus([("ns", "g")])
    yield fake
    fake.close()


def test_a_thousand_graphs_cost_the_same_dozen_queries_as_three() -> None:
    fake = FakePrometheus([("ns", f"g{i}") for i in range(1000)])
    try:
        observer = observe.PrometheusObserver(fake.url)
        found = observer.observe_many([("ns", f"g{i}") for i in range(1000)], window_s=60, percentile=90)
        many = len(fake.received)
        assert len(found) == 1000 and all(o.complete and o.rate_rps == 5.0 for o in found.values())
        assert found[("ns", "g7")].isl_histogram is not None
        fake.received.clear()
        observer.observe_many([("ns", "g1"), ("ns", "g2"), ("ns", "g3")], window_s=60, percentile=90)
        assert len(fake.received) == many == observer.queries_sent / 2 == 12
        assert all('by (namespace, graph' in q and 'namespace=~"ns"' in q for q in fake.received)
    finally:
        fake.close()


@pytest.mark.parametrize(("mode", "said"), [
    ("nan", "no usable fleetpilot_frontend_requests_started_total for ns/g"),
    ("empty", "no usable fleetpilot_frontend_requests_started_total for ns/g"),
    ("stale", "no usable fleetpilot_frontend_requests_started_total for ns/g"),
    ("labels", "no usable fleetpilot_frontend_requests_started_total for ns/g"),
    ("500", "Prometheus at http://127.0.0.1"),
])
def test_a_bad_answer_is_no_data(prometheus: FakePrometheus, mode: str, said: str) -> None:
    prometheus.mode = mode
    observation = observe.PrometheusObserver(prometheus.url).observe(namespace="ns", graph="g", window_s=60,
                                                                     percentile=90)
    assert not observation.complete
    assert observation.error is not None and said in observation.error


def test_a_hung_prometheus_costs_one_timeout_not_one_per_query_or_retry(prometheus: FakePrometheus) -> None:
    prometheus.mode = "hang"
    observer = observe.PrometheusObserver(prometheus.url, timeout_s=0.5)
    observation = observer.observe(namespace="ns", graph="g", window_s=60, percentile=90)
    assert observation.error is not None and "timed out" in observation.error.lower()
    assert len(prometheus.received) == 1  # the first query gave up; no retry, no second query


class Recorder:
    """A Kubernetes API that records /scale writes and status applies."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, int]] = []
        self.statuses: list[dict[str, Any]] = []

    async def patch(self, kind: str, namespace: str, name: str, body: dict[str, Any], *,
                    subresource: str) -> dict[str, Any]:
        self.patches.append((name, body["spec"]["replicas"]))
        return {}

    async def apply(self, manifest: dict[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
        self.statuses.append(manifest["status"])
        return manifest

    async def event(self, body: dict[str, Any], **_: Any) -> None:
        pass


def test_the_planner_holds_says_why_and_resumes(prometheus: FakePrometheus) -> None:
    """Through the live planner: each bad answer holds the replicas (no /scale write) with
    PlannerActive=False NoMetrics and the reason; good answers again and it plans."""
    kube = Recorder()
    planner = live.LivePlanner(kube, observe.PrometheusObserver(prometheus.url, timeout_s=0.5))  # type: ignore[arg-type]
    body: dict[str, Any] = {
        "apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND,
        "metadata": {"name": "g", "namespace": "ns", "generation": 1},
        "spec": {"model": {"name": "m"}, "engine": {"framework": "simulator"},
                 "components": {"prefill": {"replicas": 2}, "decode": {"replicas": 2}},
                 "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "predictor": "constant"}},
        "status": {}}
    # No warm start (the fake answers instant queries only): a graph already planned before.
    planner.planned[("ns", "g")] = live.PlannedGraph(state=step.GraphState(memory=core.GraphMemory(rates=(1.0,))))
    for mode in ("nan", "empty", "stale", "500", "hang", "labels"):
        prometheus.mode = mode
        plan = asyncio.run(planner.plan_graph(body))
        assert plan is not None and not plan.data_ok, mode
        active = {c["type"]: c for c in kube.statuses[-1]["conditions"]}["PlannerActive"]
        assert (active["status"], active["reason"]) == ("False", "NoMetrics"), mode
        assert active["message"].startswith("holding replicas: "), active
        body["status"] = kube.statuses[-1]
    assert kube.patches == []  # held throughout
    prometheus.mode = "ok"
    plan = asyncio.run(planner.plan_graph(body))
    assert plan is not None and plan.data_ok
    active = {c["type"]: c for c in kube.statuses[-1]["conditions"]}["PlannerActive"]
    assert (active["status"], active["reason"]) == ("True", "Planning")
