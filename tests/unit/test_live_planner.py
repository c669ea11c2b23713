"""The live planner's bookkeeping between intervals, with its watches already filled (no API, no Prometheus)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fleetpilot.frontend import metrics as frontend_metrics
from fleetpilot.planner import budget, live, observe, step


def graph(name: str, *, mode: str = "sla", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "resourceVersion": "1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-24T00:00:00Z"
    return {"kind": "DynamoGraph", "metadata": meta,
            "spec": {"planner": {"mode": mode, "budget": "shared", "intervalSeconds": 10}}}


def planner_with(*graphs: dict[str, Any]) -> live.LivePlanner:
    planner = live.LivePlanner(None, None, budgets={"shared": 8},  # type: ignore[arg-type]
                               may_act=lambda: False)  # a standby: bookkeeping only, no planning
    planner._started = True
    for watcher in planner._informers:
        watcher.synced.set()
    for body in graphs:
        planner.graphs.upsert(body)
    return planner


def claim(planner: live.LivePlanner, name: str) -> None:
    planner.ledger.claim("shared", budget.BudgetClaim(graph=f"ns/{name}", priority=0, min_gpus=1, wanted_gpus=4))
    planner.planned[("ns", name)] = live.PlannedGraph()


def test_graphs_that_left_give_their_budget_share_back_and_their_history_goes() -> None:
    planner = planner_with(graph("kept"), graph("off", mode="off"), graph("going", deleting=True))
    for name in ("kept", "off", "going", "deleted"):
        claim(planner, name)
    asyncio.run(planner.tick())
    assert [c.graph for c in planner.ledger.claims("shared")] == ["ns/kept"]
    assert set(planner.planned) == {("ns", "kept")}


def test_the_observer_reads_the_prefill_part_the_mean_itl_and_the_burst() -> None:
    """The PromQL behind TTFT's blame, the profile's calibration and prefill's bursts: each on the graph's
    series only; the burst per frontend is scaled by the frontends serving."""
    from fleetpilot.planner import observe

    found = observe.queries(namespace="ns", graph="g", window_s=60, percentile=90, labels=observe.Labels())
    selector = 'namespace="ns",graph="g"'
    assert found["prefill_s"] == (
        f"histogram_quantile(0.9, sum by (le) (rate(fleetpilot_frontend_prefill_seconds_bucket{{{selector}}}[60s])))")
    assert found["itl_mean_s"].startswith("sum(rate(fleetpilot_frontend_inter_token_latency_seconds_sum{")
    assert "fleetpilot_frontend_arrival_burst_rps_bucket" in found["burst_rate_rps"]
    assert found["burst_rate_rps"].endswith(f"* count(fleetpilot_frontend_requests_started_total{{{selector}}})")


# -- the fast path between intervals ------------------------------------------------------------------------


class Queues:
    """An observer whose engine gauges the test sets."""

    url = "http://prometheus.test"

    def __init__(self, gauges: Any) -> None:
        self.value = gauges

    def gauges(self, *, namespace: str, graph: str) -> Any:
        return self.value


class Recorder:
    """A Kubernetes API that records /scale patches and Events."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.events: list[str] = []

    async def patch(self, kind: str, namespace: str, name: str, body: dict[str, Any], *, subresource: str) -> None:
        assert (kind, subresource) == ("DynamoGraphComponent", "scale")
        self.patches.append((name, body))

    async def event(self, body: dict[str, Any], *, type_: str, reason: str, message: str) -> None:
        self.events.append(f"{reason}: {message}")


def fast_path_planner(gauges: Any, *, floor: dict[str, int], replicas: dict[str, int]) -> tuple[
        live.LivePlanner, Recorder, dict[str, Any]]:
    from fleetpilot.api import v1alpha1 as api
    from fleetpilot.planner import capacity, core

    kube = Recorder()
    planner = live.LivePlanner(kube, Queues(gauges))  # type: ignore[arg-type]
    body = {"apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND, "metadata": {"name": "g", "namespace": "ns"},
            "spec": {"model": {"name": "m"}, "engine": {"framework": "simulator"},
                     "components": {"prefill": {"scaling": {"min": 1, "max": 8}},
                                    "decode": {"scaling": {"min": 1, "max": 8}}},
                     "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}}}}
    for pool, n in replicas.items():
        planner.components.upsert({"kind": api.COMPONENT_KIND, "metadata": {"name": f"g-{pool}", "namespace": "ns",
                                                                             "resourceVersion": "1"},
                                   "spec": {"replicas": n}, "status": {"readyReplicas": n}})
    config = step.StepConfig(plan=core.config_from_spec(api.DynamoGraphSpec.model_validate(body["spec"])),
                             capacity=capacity.CapacityModel(live.simulator_profile(1)), graph="ns/g")
    memory = core.GraphMemory(lengths=(core.IntervalLengths(0.0, 1.0, 2000.0, 200.0),))
    planner.planned[("ns", "g")] = live.PlannedGraph(state=step.GraphState(memory=memory, floor=floor),
                                                     config=config)  # type: ignore[arg-type]
    return planner, kube, body


def arrivals(planner: live.LivePlanner) -> step.Arrivals:
    found = planner.planned[("ns", "g")].state.arrivals
    assert found is not None
    return found


def test_the_live_fast_path_adds_decode_for_a_decode_backlog_and_leaves_prefill() -> None:
    from fleetpilot.planner.observe import EngineGauges

    planner, kube, body = fast_path_planner(EngineGauges(prefill_waiting=0, decode_running=200, decode_waiting=300),
                                            floor={"prefill": 2, "decode": 2}, replicas={"prefill": 2, "decode": 2})
    reaction = asyncio.run(planner.react_graph(body))
    assert reaction is not None and reaction.changed
    assert kube.patches == [("g-decode", {"spec": {"replicas": 3}})]  # +50% of 2, not prefill
    assert kube.events and kube.events[0].startswith("FastPath: decode 2→3")


def test_the_live_fast_path_does_nothing_without_queues_and_never_scales_down() -> None:
    from fleetpilot.planner.observe import EngineGauges

    planner, kube, body = fast_path_planner(None, floor={"prefill": 2, "decode": 2},
                                            replicas={"prefill": 2, "decode": 2})
    assert asyncio.run(planner.react_graph(body)) is None and not kube.patches
    # Idle engines, and a pool above the last decision: the fast path takes nothing away.
    planner, kube, body = fast_path_planner(EngineGauges(0, 0, 0), floor={"prefill": 1, "decode": 1},
                                            replicas={"prefill": 4, "decode": 3})
    reaction = asyncio.run(planner.react_graph(body))
    assert reaction is not None and not reaction.changed and not kube.patches


def test_the_fast_path_reads_the_frontends_phases_and_falls_back_to_the_engines_gauges() -> None:
    from fleetpilot.planner import observe

    found = observe.gauge_queries(namespace="ns", graph="g", labels=observe.Labels())
    assert found["decode_waiting"] == (
        'sum(fleetpilot_frontend_requests_in_phase{namespace="ns",graph="g",phase="first_token"})'
        ' or sum(vllm:num_requests_waiting{namespace="ns",graph="g",component="decode"})')
    assert 'phase="prefill"' in found["prefill_waiting"] and found["prefill_waiting"].endswith('component="prefill"})')
    assert 'phase="decoding"' in found["decode_running"]


def frontend_exposition(started: float = 0.0, **in_phase: float) -> str:
    """What a real frontend's /metrics says with that many requests in each phase, `started` received."""
    import prometheus_client

    from fleetpilot.frontend.metrics import FrontendMetrics

    metrics = FrontendMetrics()
    for phase, count in in_phase.items():
        metrics.in_phase.labels("m", phase).set(count)
    if started:
        metrics.started.labels("m").inc(started)
    return prometheus_client.generate_latest(metrics.registry).decode()


def test_the_frontends_counters_of_requests_received_are_summed_when_every_one_has_it() -> None:
    from fleetpilot.planner import frontends

    both = frontends.gauges_from_expositions([frontend_exposition(120, decoding=3), frontend_exposition(30, decoding=0)])
    assert both is not None and both.started == 150.0 and both.decode_running == 3.0
    seven = frontends.gauges_from_expositions([frontend_exposition(7, decoding=0)])
    assert seven is not None and seven.started == 7.0  # the _total sample, not _created
    older = frontend_exposition(decoding=1).replace("fleetpilot_frontend_requests_started", "something_else")
    one_silent = frontends.gauges_from_expositions([frontend_exposition(10, decoding=0), older])
    assert one_silent is not None and one_silent.started is None


def test_arrivals_rising_add_replicas_before_any_queue_and_a_counter_that_goes_back_starts_afresh() -> None:
    """The frontends' counter grows 20 → 80 req/s over a minute of 5-s ticks with nothing queued: the
    fast path adds replicas for the rate a startup ahead. A counter that falls (a frontend restarted)
    is not read as arrivals: the readings start again."""
    import math

    import httpx

    from fleetpilot.planner.observe import EngineGauges

    planner, kube, body = fast_path_planner(EngineGauges(0, 0, 0), floor={"prefill": 2, "decode": 2},
                                            replicas={"prefill": 2, "decode": 2})
    planner.frontend_pods.upsert(frontend_pod("f-1", "10.0.0.1"))
    clock = [0.0]
    received = [0.0]
    planner.clock = lambda: clock[0]
    planner._http = httpx.AsyncClient(transport=httpx.MockTransport(
        lambda request: httpx.Response(200, text=frontend_exposition(received[0], decoding=4))))
    growth = math.log(4.0) / 60.0
    reactions = []
    for tick in range(13):
        clock[0] = 5.0 * tick
        received[0] = 20.0 / growth * (math.exp(growth * clock[0]) - 1.0)  # the count of a 20·e^(gt) rate
        reactions.append(asyncio.run(planner.react_graph(body)))
    assert reactions[0] is not None and not reactions[0].changed  # the first reading has nothing before it
    added = [r for r in reactions if r is not None and r.changed]
    assert added and any("arrivals rising" in why for why in added[0].reasons)
    assert kube.patches  # replicas asked for with no request queued
    assert len(arrivals(planner).readings) == 12
    received[0] = 5.0  # the frontend restarted: its counter went back
    clock[0] += 5.0
    asyncio.run(planner.react_graph(body))
    assert arrivals(planner).readings == () and arrivals(planner).counted == 5.0


def frontend_pod(name: str, ip: str, *, graph: str = "g", ready: bool = True) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1",
                                        "labels": {"fleetpilot.dev/graph": graph, "fleetpilot.dev/component": "frontend"}},
            "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8000}]}]},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_the_frontends_phases_sum_over_frontends_and_need_every_one() -> None:
    from fleetpilot.planner import frontends

    two = [frontend_exposition(prefill=3, first_token=5, decoding=40), frontend_exposition(first_token=1, decoding=2)]
    gauges = frontends.gauges_from_expositions(two)
    assert gauges is not None and (gauges.prefill_waiting, gauges.decode_waiting, gauges.decode_running) == (3, 6, 42)
    assert frontends.gauges_from_expositions([two[0], "# an engine's metrics, no phases\nup 1\n"]) is None
    assert frontends.gauges_from_expositions([]) is None


def test_the_fast_path_asks_the_frontends_first_and_prometheus_when_one_is_silent() -> None:
    """Prometheus (a scrape ago) says the engines are idle; the frontends say 300 prefilled requests wait
    for a decode slot now. The frontends win while both answer; one silent frontend and Prometheus decides."""
    import httpx
    from prometheus_client import REGISTRY

    from fleetpilot.planner.observe import EngineGauges

    planner, kube, body = fast_path_planner(EngineGauges(0, 0, 0), floor={"prefill": 2, "decode": 2},
                                            replicas={"prefill": 2, "decode": 2})
    for pod in (frontend_pod("f-1", "10.0.0.1"), frontend_pod("f-2", "10.0.0.2"),
                frontend_pod("f-3", "10.0.0.3", ready=False), frontend_pod("other", "10.0.0.4", graph="h")):
        planner.frontend_pods.upsert(pod)
    asked: list[str] = []
    silent: set[str] = set()

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.host)
        if request.url.host in silent:
            return httpx.Response(503)
        return httpx.Response(200, text=frontend_exposition(first_token=150, decoding=100))

    planner._http = httpx.AsyncClient(transport=httpx.MockTransport(answer))

    def reads(source: str) -> float:
        return REGISTRY.get_sample_value("fleetpilot_planner_fast_path_reads_total", {"source": source}) or 0.0

    before = {source: reads(source) for source in ("frontend", "prometheus")}
    asyncio.run(planner.react_graph(body))
    assert sorted(asked) == ["10.0.0.1", "10.0.0.2"]  # Ready frontends of this graph only
    assert kube.patches == [("g-decode", {"spec": {"replicas": 3}})]
    assert reads("frontend") == before["frontend"] + 1

    silent.add("10.0.0.2")
    asyncio.run(planner.react_graph(body))
    assert len(kube.patches) == 1  # Prometheus' idle engines: nothing to add
    assert reads("prometheus") == before["prometheus"] + 1


def test_a_planner_that_starts_loads_each_graphs_history_from_prometheus() -> None:
    """The first plan of a graph since the planner started forecasts from the load Prometheus kept, as
    far back as the predictors look; the next ones from its own memory."""
    from fleetpilot.api import v1alpha1 as api
    from fleetpilot.planner import core
    from fleetpilot.planner.observe import History

    class Kept:
        url = "http://prometheus.test"

        def __init__(self) -> None:
            self.asked: list[tuple[int, int]] = []

        def history(self, *, namespace: str, graph: str, window_s: int, points: int) -> History:
            self.asked.append((window_s, points))
            return History((1.0, 2.0, 3.0), (2000.0,) * 3, (200.0,) * 3)

    observer = Kept()
    planner = live.LivePlanner(None, observer)  # type: ignore[arg-type]
    spec = api.DynamoGraphSpec.model_validate({
        "model": {"name": "m"}, "engine": {"framework": "simulator"},
        "components": {"prefill": {}, "decode": {}},
        "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "intervalSeconds": 60}})
    config = core.config_from_spec(spec)
    memory = asyncio.run(planner._warm_start("ns", "g", config, {"status": {}}))
    assert memory.rates == (1.0, 2.0, 3.0) and [x.isl for x in memory.lengths] == [2000.0] * 3
    assert observer.asked == [(60, core.HISTORY_LIMIT)]  # a week of minutes is more than the predictors use
    assert "decodeMaxRunning" not in core.learned(memory)  # nothing was known before it

    known = {"status": {"planner": {"learned": {"decodeMaxRunning": 48.0, "burst": 1.5}}}}
    memory = asyncio.run(planner._warm_start("ns", "g", config, known))
    assert memory.rates == (1.0, 2.0, 3.0)
    assert core.learned(memory)["decodeMaxRunning"] == 48.0 and core.learned(memory)["burst"] == 1.5


def test_the_planner_exports_its_risk_and_the_coverage_of_each_calibrated_quantile() -> None:
    """After a few intervals the calibration has outcomes: coverage per load and quantile, and the risk
    the graph asked for, are in the planner's metrics."""
    from prometheus_client import REGISTRY

    from fleetpilot.api import v1alpha1 as api
    from fleetpilot.planner import capacity, core

    spec = api.DynamoGraphSpec.model_validate({
        "model": {"name": "m"}, "engine": {"framework": "simulator"},
        "components": {"prefill": {"scaling": {"max": 32}}, "decode": {"scaling": {"max": 32}}},
        "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "predictor": "constant",
                    "intervalSeconds": 60, "risk": 0.95}})
    config = core.config_from_spec(spec)
    model = capacity.CapacityModel(live.simulator_profile(1))
    memory, current = core.GraphMemory(), {"prefill": 1, "decode": 1}
    for k, rate in enumerate((4.0, 6.0, 5.0, 9.0, 5.0, 7.0, 6.0, 4.0, 8.0, 5.0, 6.0, 7.0, 5.0, 6.0)):
        observation = core.Observation(time=60.0 * k, rate_rps=rate, isl=1000, osl=100, ttft_s=0.2, itl_s=0.02)
        plan, memory = core.plan_interval(config, observation, memory, current=current, capacity=model, now=60.0 * k)
        current = dict(plan.replicas)
    live.LivePlanner(None, None)._export("ns", "covered", plan, config)  # type: ignore[arg-type]

    def sample(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"namespace": "ns", "graph": "covered", **labels})

    assert sample("fleetpilot_planner_risk") == 0.95
    for load in core.LOADS:
        for level in ("0.5", "0.9", "0.95", "0.99"):
            share = sample("fleetpilot_planner_forecast_coverage", load=load, quantile=level)
            assert share is not None and 0.0 <= share <= 1.0, (load, level, share)
    # Forecasts are scored once made from SCORED_FROM_INTERVALS (10) intervals: those made at intervals
    # 9 to 12, both steps of the first three and the first step of the last.
    assert core.SCORED_FROM_INTERVALS == 10
    assert len(memory.forecast_calibration["requests"].hits[0.5]) == 7


# -- what the planner cannot give: PlannerDegraded ---------------------------------------------------------


class StatusRecorder(Recorder):
    """A Kubernetes API that also records status applies."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses: list[dict[str, Any]] = []
        self.warnings: list[str] = []

    async def apply(self, manifest: dict[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
        assert subresource == "status"
        self.statuses.append(manifest["status"])
        return manifest

    async def event(self, body: dict[str, Any], *, type_: str, reason: str, message: str) -> None:
        await super().event(body, type_=type_, reason=reason, message=message)
        if type_ == "Warning":
            self.warnings.append(reason)


class Fixed:
    """An observer that sees the same interval every time (or an outage)."""

    url = "http://prometheus.test"

    def __init__(self, observation: Any) -> None:
        self.observation = observation

    def observe(self, **_: Any) -> Any:
        return self.observation

    def history(self, **_: Any) -> Any:
        return observe.History((), (), ())


def simulator_graph(*, mode: str, itl_ms: int) -> dict[str, Any]:
    """A disaggregated simulator graph g/ns (1 to 16 replicas a pool) under the planner in `mode`."""
    from fleetpilot.api import v1alpha1 as api

    return {
        "apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND,
        "metadata": {"name": "g", "namespace": "ns", "generation": 1},
        "spec": {"model": {"name": "m"}, "engine": {"framework": "simulator"},
                 "components": {"prefill": {"scaling": {"min": 1, "max": 16}},
                                "decode": {"scaling": {"min": 1, "max": 16}}},
                 "planner": {"mode": mode, "sla": {"ttftMs": 500, "itlMs": itl_ms}, "predictor": "constant"}},
        "status": {}}


def test_traffic_that_stops_dead_is_reported_as_such_held_and_not_counted_as_an_error() -> None:
    """After 30 busy intervals an empty one is an outage upstream: PlannerActive=False TrafficStopped
    with the planner's reason, a Warning, replicas held, no planner error counted, and the
    traffic-stopped gauge set while it lasts."""
    from fleetpilot.planner import core

    kube = StatusRecorder()
    busy = core.Observation(time=0.0, rate_rps=50.0, isl=2000, osl=200, ttft_s=0.2, itl_s=0.02)
    observer = Fixed(busy)
    planner = live.LivePlanner(kube, observer)  # type: ignore[arg-type]
    body = simulator_graph(mode="advisory", itl_ms=50)
    for _ in range(30):
        last = asyncio.run(planner.plan_graph(body))
        body["status"] = kube.statuses[-1]
    errors = live.ERRORS.labels("no-data")._value.get()
    observer.observation = core.Observation(time=0.0, rate_rps=0.0)
    held = asyncio.run(planner.plan_graph(body))
    # advisory: the graph runs one of each whatever was advised, and the hold keeps what it runs
    assert last is not None and sum(last.replicas.values()) > 2
    assert held is not None and held.outage and held.replicas == {"prefill": 1, "decode": 1}
    active = {c["type"]: c for c in kube.statuses[-1]["conditions"]}["PlannerActive"]
    assert (active["status"], active["reason"]) == ("False", "TrafficStopped")
    assert "no request this interval" in active["message"] and "outage" in active["message"]
    assert kube.warnings == ["TrafficStopped"]
    assert live.ERRORS.labels("no-data")._value.get() == errors
    # Its own gauge, for its own alert (FleetpilotTrafficStopped, not the one for missing metrics).
    assert live.TRAFFIC_STOPPED.labels("ns", "g")._value.get() == 1
    observer.observation = busy
    asyncio.run(planner.plan_graph(body))
    assert live.TRAFFIC_STOPPED.labels("ns", "g")._value.get() == 0


def test_an_infeasible_sla_is_a_warning_condition_once_and_holding_keeps_it() -> None:
    from fleetpilot.planner import core

    kube = StatusRecorder()
    observer = Fixed(core.Observation(time=0.0, rate_rps=5.0, isl=2000, osl=200, ttft_s=0.2, itl_s=0.02))
    planner = live.LivePlanner(kube, observer)  # type: ignore[arg-type]
    body = simulator_graph(mode="sla", itl_ms=1)
    plan = asyncio.run(planner.plan_graph(body))
    assert plan is not None and plan.replicas["decode"] < 16
    conditions = {c["type"]: c for c in kube.statuses[-1]["conditions"]}
    assert (conditions["PlannerActive"]["status"], conditions["PlannerActive"]["reason"]) == ("True", "Planning")
    degraded = conditions["PlannerDegraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "SLAInfeasible")
    assert "ITL target 1.0 ms is below the floor" in degraded["message"]
    assert kube.warnings == ["SLAInfeasible"]

    body["status"] = kube.statuses[-1]  # what the apiserver now holds
    asyncio.run(planner.plan_graph(body))
    assert kube.warnings == ["SLAInfeasible"]  # no second Warning for the same finding

    observer.observation = core.Observation(time=0.0, error="Prometheus at x unavailable")
    asyncio.run(planner.plan_graph(body))
    held = {c["type"]: c for c in kube.statuses[-1]["conditions"]}
    assert held["PlannerActive"]["reason"] == "NoMetrics"
    assert held["PlannerDegraded"] == degraded  # not sized while holding: the last word stands

    body["spec"]["planner"]["sla"]["itlMs"] = 50
    observer.observation = core.Observation(time=0.0, rate_rps=5.0, isl=2000, osl=200, ttft_s=0.2, itl_s=0.02)
    asyncio.run(planner.plan_graph(body))
    cleared = {c["type"]: c for c in kube.statuses[-1]["conditions"]}["PlannerDegraded"]
    assert (cleared["status"], cleared["reason"]) == ("False", "AsExpected")


def test_a_shared_budget_short_of_the_minimums_is_a_warning_condition() -> None:
    from fleetpilot.api import v1alpha1 as api
    from fleetpilot.planner import core

    kube = StatusRecorder()
    observer = Fixed(core.Observation(time=0.0, rate_rps=1.0, isl=2000, osl=200, ttft_s=0.2, itl_s=0.02))
    planner = live.LivePlanner(kube, observer, budgets={"team": 3})  # type: ignore[arg-type]

    def graph_named(name: str) -> dict[str, Any]:
        return {"apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND,
                "metadata": {"name": name, "namespace": "ns", "generation": 1},
                "spec": {"model": {"name": "m"}, "engine": {"framework": "simulator"},
                         "components": {"prefill": {}, "decode": {}},
                         "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "predictor": "constant",
                                     "budget": "team"}}, "status": {}}

    asyncio.run(planner.plan_graph(graph_named("a")))  # 2 GPUs of 3: fine
    assert {c["type"]: c for c in kube.statuses[-1]["conditions"]}["PlannerDegraded"]["status"] == "False"
    asyncio.run(planner.plan_graph(graph_named("b")))  # 4 GPUs of minimums for 3
    degraded = {c["type"]: c for c in kube.statuses[-1]["conditions"]}["PlannerDegraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "BudgetBelowMinimum")
    assert "shared GPU budget team (3 GPUs) is 1 short" in degraded["message"]
    assert kube.warnings == ["BudgetBelowMinimum"]


def test_an_apiserver_that_cannot_be_reached_costs_an_interval_not_the_planner() -> None:
    """A restarting apiserver (connection refused) fails this graph's interval; the loop goes on and the
    next due interval plans again."""
    import httpx

    from fleetpilot.api import v1alpha1 as api
    from fleetpilot.planner import core

    class Away(StatusRecorder):
        async def apply(self, manifest: dict[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
            raise httpx.ConnectError("All connection attempts failed")

    clock = {"now": 0.0}
    kube = Away()
    observer = Fixed(core.Observation(time=0.0, rate_rps=1.0, isl=2000, osl=200))
    planner = live.LivePlanner(kube, observer, clock=lambda: clock["now"])  # type: ignore[arg-type]
    planner._started = True
    for watcher in planner._informers:
        watcher.synced.set()
    planner.graphs.upsert({
        "apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND,
        "metadata": {"name": "g", "namespace": "ns", "generation": 1, "resourceVersion": "1"},
        "spec": {"model": {"name": "m"}, "engine": {"framework": "simulator"},
                 "components": {"prefill": {}, "decode": {}},
                 "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "predictor": "constant",
                             "intervalSeconds": 10, "fastPathSeconds": 0}}})
    asyncio.run(planner.tick())  # does not raise
    assert planner.planned[("ns", "g")].next_plan == 10.0
    kube.apply = StatusRecorder.apply.__get__(kube)  # type: ignore[method-assign]  # the apiserver is back
    clock["now"] = 10.0
    asyncio.run(planner.tick())
    assert kube.statuses and {c["type"] for c in kube.statuses[-1]["conditions"]} >= {"PlannerActive"}


ALONE = 12  # graphs without a budget in the concurrency test


def test_graphs_on_their_own_are_planned_side_by_side_and_budgeted_ones_in_turn() -> None:
    """Each interval's writes wait on the apiserver: graphs without a shared budget overlap them (up to
    PLAN_CONCURRENCY at once); graphs sharing a budget are planned one after the other."""
    from fleetpilot.api import v1alpha1 as api
    from fleetpilot.planner import core

    class Slow(StatusRecorder):
        def __init__(self) -> None:
            super().__init__()
            self.inflight: dict[bool, int] = {False: 0, True: 0}
            self.most: dict[bool, int] = {False: 0, True: 0}
            self.entered: set[str] = set()

        async def apply(self, manifest: dict[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
            shared = manifest["metadata"]["name"].startswith("shared")
            self.inflight[shared] += 1
            self.most[shared] = max(self.most[shared], self.inflight[shared])
            if not shared:
                # Hold the write until as many graphs as may run at once are writing, or every graph has
                # come: their observations run in threads, so how soon the others arrive depends on the
                # machine (a 10-ms sleep saw 6 of 8). The bound only keeps a broken planner from hanging.
                self.entered.add(manifest["metadata"]["name"])
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10):
                        while self.inflight[False] < live.PLAN_CONCURRENCY and len(self.entered) < ALONE:
                            await asyncio.sleep(0.001)
            self.inflight[shared] -= 1
            return await super().apply(manifest, subresource=subresource)

    kube = Slow()
    observer = Fixed(core.Observation(time=0.0, rate_rps=1.0, isl=2000, osl=200))
    planner = live.LivePlanner(kube, observer, budgets={"team": 100}, clock=lambda: 0.0)  # type: ignore[arg-type]
    planner._started = True
    for watcher in planner._informers:
        watcher.synced.set()
    for name, shared in [(f"alone-{i}", None) for i in range(ALONE)] + [(f"shared-{i}", "team") for i in range(3)]:
        planner.graphs.upsert({
            "apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND,
            "metadata": {"name": name, "namespace": "ns", "generation": 1, "resourceVersion": "1"},
            "spec": {"model": {"name": "m"}, "engine": {"framework": "simulator"},
                     "components": {"prefill": {}, "decode": {}},
                     "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "predictor": "constant",
                                 "fastPathSeconds": 0, **({"budget": shared} if shared else {})}}})
    asyncio.run(planner.tick())
    assert len(kube.statuses) == 15
    assert kube.most == {False: live.PLAN_CONCURRENCY, True: 1}


def test_planned_side_by_side_a_graph_rolling_out_holds_and_one_asleep_stays_at_zero(monkeypatch: Any) -> None:
    """The concurrent interval holds what the one-by-one one held: a graph whose rollout is under way gets
    no /scale write (advice only), a graph asleep keeps its sleeping pool at zero, the others scale."""
    from fleetpilot import scrape
    from fleetpilot.api import contract
    from fleetpilot.api import v1alpha1 as api
    from fleetpilot.planner import core

    class ByGraph(StatusRecorder):
        def __init__(self) -> None:
            super().__init__()
            self.by_graph: dict[str, dict[str, Any]] = {}

        async def apply(self, manifest: dict[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
            self.by_graph[manifest["metadata"]["name"]] = manifest["status"]["planner"]
            return await super().apply(manifest, subresource=subresource)

    kube = ByGraph()
    busy = core.Observation(time=0.0, rate_rps=30.0, isl=2000, osl=200, ttft_s=0.2, itl_s=0.02)
    planner = live.LivePlanner(kube, Fixed(busy), clock=lambda: 0.0)  # type: ignore[arg-type]
    planner._started = True
    for watcher in planner._informers:
        watcher.synced.set()
    names = ["rolling", "sleepy", *(f"busy-{i}" for i in range(4))]
    for name in names:
        prefill_min = 0 if name == "sleepy" else 1
        planner.graphs.upsert({
            "apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND,
            "metadata": {"name": name, "namespace": "ns", "generation": 1, "resourceVersion": "1"},
            "spec": {"model": {"name": "m"}, "engine": {"framework": "simulator"},
                     "components": {"prefill": {"scaling": {"min": prefill_min, "max": 8}},
                                    "decode": {"scaling": {"min": 1, "max": 8}}},
                     "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "predictor": "constant",
                                 "fastPathSeconds": 0, "idleSeconds": 300}},
            "status": {"rollout": {"target": "abc", "phase": "Progressing"}} if name == "rolling" else {}})
        for pool in ("prefill", "decode"):
            planner.components.upsert({"kind": api.COMPONENT_KIND, "metadata": {
                "name": f"{name}-{pool}", "namespace": "ns", "resourceVersion": "1"}, "spec": {"replicas": 1}})
    planner.frontend_pods.upsert({"kind": "Pod", "metadata": {
        "name": "sleepy-frontend-1", "namespace": "ns", "resourceVersion": "1",
        "labels": {contract.LABEL_GRAPH: "sleepy", contract.LABEL_COMPONENT: "frontend"}},
        "status": {"podIP": "127.9.9.9", "conditions": [{"type": "Ready", "status": "True"}]}})

    async def read_texts(client: Any, urls: list[str]) -> list[str]:
        return [(f'{contract.HELD_METRIC}{{model="m"}} 0\n{contract.IDLE_METRIC}{{model="m"}} 900\n'
                 f'{contract.INFLIGHT_METRIC}{{model="m"}} 0\n')]

    monkeypatch.setattr(scrape, "read_texts", read_texts)
    asyncio.run(planner.tick())

    assert len(kube.statuses) == len(names)  # every graph planned
    assert not [name for name, _ in kube.patches if name.startswith("rolling-")]
    assert planner.planned[("ns", "sleepy")].state.asleep is True
    assert [body["spec"]["replicas"] for name, body in kube.patches if name == "sleepy-prefill"] in ([0], [0, 0])
    assert [name for name, _ in kube.patches if name.startswith("busy-0-")]  # the others scale up
    assert kube.by_graph["rolling"]["reason"].startswith("advising until the rollout completes")
    assert (kube.by_graph["sleepy"]["replicas"]["prefill"], kube.by_graph["sleepy"]["binding"]["prefill"]) == (0, "idle")
    assert kube.by_graph["busy-0"]["reason"].startswith("scaling")


def test_the_planner_exports_each_graphs_sla_with_the_bucket_the_alerts_count_by() -> None:
    """The SLA gauges carry the frontend bucket bound nearest each target (`le`, the frontend's own label
    value), which the alert rules join on; a changed target's old bound goes, so no graph has two."""
    from prometheus_client import REGISTRY

    from fleetpilot.api import v1alpha1 as api

    planner = live.LivePlanner(None, None)  # type: ignore[arg-type]

    def sample(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"namespace": "ns", "graph": "sla", **labels})

    planner._export_sla("ns", "sla", api.SlaTarget(ttft_ms=1000, itl_ms=65, percentile=95))
    assert sample("fleetpilot_planner_sla_target_seconds", metric="ttft", le="0.942311") == 1.0
    assert sample("fleetpilot_planner_sla_target_seconds", metric="itl", le="0.066212") == 0.065
    assert sample("fleetpilot_planner_sla_objective_ratio") == 0.95
    assert {0.942311, 0.066212} <= set(frontend_metrics.LATENCY_BUCKETS)  # the frontend's own bounds

    planner._export_sla("ns", "sla", api.SlaTarget(ttft_ms=500, itl_ms=65, percentile=90))
    assert sample("fleetpilot_planner_sla_target_seconds", metric="ttft", le="0.942311") is None
    assert sample("fleetpilot_planner_sla_target_seconds", metric="ttft", le="0.468495") == 0.5
    assert sample("fleetpilot_planner_sla_target_seconds", metric="itl", le="0.066212") == 0.065


# -- scale to zero and back, and the hold during a rollout ----------------------------------------------------


def zero_planner(monkeypatch: Any, *, held: float, idle_s: float, replicas: int,
                 rollout: str | None = None) -> tuple[live.LivePlanner, Recorder, dict[str, Any]]:
    from fleetpilot import scrape
    from fleetpilot.api import contract
    from fleetpilot.api import v1alpha1 as api

    kube = Recorder()
    planner = live.LivePlanner(kube, Queues(None))  # type: ignore[arg-type]
    body: dict[str, Any] = {
        "apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND, "metadata": {"name": "g", "namespace": "ns"},
        "spec": {"model": {"name": "m"}, "engine": {"framework": "simulator"},
                 "components": {"prefill": {"replicas": 1, "scaling": {"min": 0, "max": 4}},
                                "decode": {"replicas": 1, "scaling": {"min": 1, "max": 4}}},
                 "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "idleSeconds": 300}}}
    if rollout:
        body["status"] = {"rollout": {"target": "abc", "phase": rollout}}
    for pool in ("prefill", "decode"):
        planner.components.upsert({"kind": api.COMPONENT_KIND, "metadata": {
            "name": f"g-{pool}", "namespace": "ns", "resourceVersion": "1"}, "spec": {"replicas": replicas}})
    planner.frontend_pods.upsert({"kind": "Pod", "metadata": {
        "name": "g-frontend-1", "namespace": "ns", "resourceVersion": "1",
        "labels": {contract.LABEL_GRAPH: "g", contract.LABEL_COMPONENT: "frontend"}},
        "status": {"podIP": "127.9.9.9", "conditions": [{"type": "Ready", "status": "True"}]}})
    text = (f'{contract.HELD_METRIC}{{model="m"}} {held}\n{contract.IDLE_METRIC}{{model="m"}} {idle_s}\n'
            f'{contract.INFLIGHT_METRIC}{{model="m"}} {held}\n')

    async def read_texts(client: Any, urls: list[str]) -> list[str]:
        assert urls == ["http://127.9.9.9:8000"]
        return [text]

    monkeypatch.setattr(scrape, "read_texts", read_texts)
    return planner, kube, body


def test_a_held_request_wakes_the_pools_at_zero_at_once(monkeypatch: Any) -> None:
    planner, kube, body = zero_planner(monkeypatch, held=2, idle_s=0, replicas=0)
    assert asyncio.run(planner.wake_or_sleep(body)) == {"prefill": 1}  # decode's min is 1: never at zero
    assert kube.patches == [("g-prefill", {"spec": {"replicas": 1}})]
    assert kube.events[0].startswith("WokenUp: prefill 0→1: 2 request(s) held")
    assert planner.planned[("ns", "g")].state.asleep is False


def test_after_the_idle_window_the_pools_that_may_sleep_go_to_zero(monkeypatch: Any) -> None:
    planner, kube, body = zero_planner(monkeypatch, held=0, idle_s=301, replicas=2)
    assert asyncio.run(planner.wake_or_sleep(body)) == {"prefill": 0}
    assert kube.events[0].startswith("ScaledToZero: prefill 2→0: no request for 301 s")
    assert planner.planned[("ns", "g")].state.asleep is True
    # The interval's plan stands aside while asleep: it never sizes below one replica.
    from fleetpilot.api import v1alpha1 as api
    from fleetpilot.planner import core

    plan = core.Plan(replicas={"prefill": 1, "decode": 1}, reasons=["sized"], data_ok=True,
                     observed=core.Observation(time=0.0))
    asleep = step._asleep(plan, core.config_from_spec(api.DynamoGraph.model_validate(body).spec))
    assert asleep.replicas == {"prefill": 0, "decode": 1} and asleep.binding["prefill"] == "idle"


def test_nothing_scales_to_zero_or_wakes_during_a_rollout(monkeypatch: Any) -> None:
    planner, kube, body = zero_planner(monkeypatch, held=0, idle_s=900, replicas=2, rollout="Progressing")
    assert asyncio.run(planner.wake_or_sleep(body)) == {} and not kube.patches
    assert live.rolling_out(body) and not live.rolling_out({**body, "status": {"rollout": {"phase": "Stalled"}}})


def test_the_profile_drift_condition_is_reported_kept_while_holding_and_announced_once() -> None:
    """The planner applies status server-side: a condition it stops sending is removed. So a report without a
    verdict (holding for lack of metrics) sends the ProfileDrift condition the graph already has; a change to
    True is a Warning Event, an unchanged True is not."""
    from fleetpilot.planner import core, drift

    class Applied(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.applied: list[dict[str, Any]] = []
            self.warnings: list[str] = []

        async def apply(self, manifest: dict[str, Any], *, subresource: str) -> None:
            self.applied.append(manifest)

        async def event(self, body: dict[str, Any], *, type_: str, reason: str, message: str) -> None:
            await super().event(body, type_=type_, reason=reason, message=message)
            if type_ == "Warning":
                self.warnings.append(reason)

    kube = Applied()
    planner = live.LivePlanner(kube, None)  # type: ignore[arg-type]
    body: dict[str, Any] = {"metadata": {"name": "g", "namespace": "ns", "generation": 2},
                            "spec": {"planner": {"mode": "sla"}}, "status": {"conditions": []}}
    slow = drift.judge([drift.Sample(itl_observed_s=0.026, itl_predicted_s=0.02)] * 6)
    plan = core.Plan(replicas={}, reasons=[], data_ok=True, observed=core.Observation(time=0.0), drift=slow)

    def conditions() -> dict[str, dict[str, Any]]:
        return {c["type"]: c for c in kube.applied[-1]["status"]["conditions"]}

    asyncio.run(planner._report(body, plan=plan, active=True, reason="Planning", message="m"))
    drifted = conditions()["ProfileDrift"]
    assert (drifted["status"], drifted["reason"]) == ("True", "Drifted") and "×1.30" in drifted["message"]
    assert kube.warnings == ["ProfileDrift"]

    body["status"]["conditions"] = list(conditions().values())
    asyncio.run(planner._report(body, plan=None, active=False, reason="NoMetrics", message="holding"))
    assert conditions()["ProfileDrift"] == drifted
    asyncio.run(planner._report(body, plan=plan, active=True, reason="Planning", message="m"))
    assert kube.warnings == ["ProfileDrift", "NoMetrics"]  # the drift was not announced again
