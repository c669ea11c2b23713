"""The whole planner pipeline as properties: from what Prometheus answered to the /scale writes.

tests/unit/test_sizing.py and test_budget.py pin the constrain step and the budget split on their own;
these run everything after the observer — plausibility, the forecast, sizing, constrain, the shared
budget ledger and the live planner's writes — on arbitrary metrics (NaN, infinities, negative and
absurdly large numbers, missing values), bounds and budgets, and check what must hold whatever they
are:

- the planner never fails on its input: it plans, or it holds and says why;
- every /scale write lies within the pool's bounds;
- no moment of a rebalance — after any single write, not only after the last — uses more GPUs than the
  budget, shared between graphs or a graph's own (once the minimums fit it);
- the same inputs give the same writes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity, core, live, observe, step

PROPERTY = settings(deadline=None, max_examples=60)
MODEL = capacity.CapacityModel(live.simulator_profile(1))

# What a broken exporter, a bad query or a glitching Prometheus may hand over for one number.
wild = st.one_of(
    st.none(),
    st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, 1e300, 1e12, -1e-9]),
    st.floats(0.0, 50.0),
    st.floats(allow_nan=True, allow_infinity=True),
)
lengths = st.one_of(st.sampled_from([math.nan, -5.0, 0.0, 1e30]), st.floats(16.0, 8000.0), st.none())
latencies = st.one_of(st.none(), st.sampled_from([math.nan, math.inf, -0.1, 0.0, 1e9]), st.floats(0.001, 5.0))


@st.composite
def observations(draw: st.DrawFn) -> core.Observation:
    if draw(st.integers(0, 9)) == 0:
        return core.Observation(time=0.0, error="Prometheus at http://prometheus.test unavailable: HTTP 500")
    return core.Observation(
        time=0.0, rate_rps=draw(wild), isl=draw(lengths), osl=draw(lengths), ttft_s=draw(latencies),
        itl_s=draw(latencies), prefill_s=draw(latencies), itl_mean_s=draw(latencies),
        prefill_busy=draw(st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))),
        burst_rate_rps=draw(wild), decode_running=draw(wild), decode_waiting=draw(wild))


@st.composite
def loads(draw: st.DrawFn) -> core.Observation:
    """Mostly sane intervals whose load moves a lot (so budgets get rebalanced), sometimes garbage."""
    if draw(st.integers(0, 3)) == 0:
        return draw(observations())
    return core.Observation(time=0.0, rate_rps=draw(st.sampled_from([0.0, 0.5, 5.0, 20.0, 60.0])),
                            isl=draw(st.sampled_from([500.0, 2000.0, 6000.0])), osl=200.0)


@st.composite
def worker_specs(draw: st.DrawFn) -> dict[str, Any]:
    low = draw(st.integers(0, 3))
    high = draw(st.integers(max(low, 1), 12))
    gpus = draw(st.sampled_from([1, 2, 4]))
    return {"replicas": draw(st.integers(low, high)), "gpus": gpus, "parallelism": {"tensor": gpus},
            "scaling": {"min": low, "max": high}}


def graph_body(name: str, prefill: dict[str, Any], decode: dict[str, Any], **planner: Any) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND,
            "metadata": {"name": name, "namespace": "ns", "generation": 1, "resourceVersion": "1"},
            "spec": {"model": {"name": "m"}, "engine": {"framework": "simulator"},
                     "components": {"prefill": prefill, "decode": decode},
                     "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "predictor": "constant",
                                 "intervalSeconds": 60, "fastPathSeconds": 0, **planner}},
            "status": {}}


def gpus_of(replicas: dict[str, int], spec: dict[str, Any]) -> int:
    return sum(n * spec["components"][pool].get("gpus", 1) for pool, n in replicas.items())


# -- the pure core: metrics in, replicas out -------------------------------------------------------------


def run_core(spec: dict[str, Any], seen: list[core.Observation]) -> list[core.Plan]:
    config = core.config_from_spec(api.DynamoGraphSpec.model_validate(spec), startup_s=120, hold_s=120)
    current = {pool: spec["components"][pool]["replicas"] for pool in ("prefill", "decode")}
    memory, plans = core.GraphMemory(), []
    for k, observation in enumerate(seen):
        plan, memory = core.plan_interval(config, dataclasses.replace(observation, time=60.0 * k), memory,
                                          current=current, capacity=MODEL, now=60.0 * k)
        plans.append(plan)
        current = dict(plan.replicas)
    return plans


@PROPERTY
@given(prefill=worker_specs(), decode=worker_specs(), budget=st.none() | st.integers(1, 40),
       seen=st.lists(observations(), min_size=1, max_size=6))
def test_any_metrics_give_replicas_within_bounds_and_budget_deterministically(
    prefill: dict[str, Any], decode: dict[str, Any], budget: int | None, seen: list[core.Observation]
) -> None:
    spec = graph_body("g", prefill, decode, **({"gpuBudget": budget} if budget is not None else {}))["spec"]
    plans = run_core(spec, seen)
    minimums = prefill["scaling"]["min"] * prefill["gpus"] + decode["scaling"]["min"] * decode["gpus"]
    current = {"prefill": prefill["replicas"], "decode": decode["replicas"]}
    for observation, plan in zip(seen, plans, strict=True):
        sane = core.plausible(observation)
        if not sane.complete:
            assert not plan.data_ok and dict(plan.replicas) == current  # holds, and says why
            assert plan.reason
        for pool, n in plan.replicas.items():
            low, high = spec["components"][pool]["scaling"]["min"], spec["components"][pool]["scaling"]["max"]
            assert low <= n <= high or n == current[pool], (pool, n, low, high)
        if plan.data_ok and budget is not None:
            assert gpus_of(dict(plan.replicas), spec) <= max(budget, minimums)
            if budget < minimums:
                assert plan.warnings is not None and "BudgetBelowMinimum" in dict(plan.warnings)
        current = dict(plan.replicas)
    again = run_core(spec, seen)
    assert [(dict(p.replicas), p.reasons, p.data_ok) for p in again] == [
        (dict(p.replicas), p.reasons, p.data_ok) for p in plans]


def test_implausible_metrics_hold_and_name_what_was_wrong() -> None:
    plan, _ = core.plan_interval(
        core.config_from_spec(api.DynamoGraphSpec.model_validate(
            graph_body("g", {"replicas": 2, "scaling": {"min": 1, "max": 8}}, {"replicas": 2})["spec"])),
        core.Observation(time=0.0, rate_rps=1e300, isl=2000, osl=-3.0), core.GraphMemory(),
        current={"prefill": 2, "decode": 2}, capacity=MODEL, now=0.0)
    assert not plan.data_ok and dict(plan.replicas) == {"prefill": 2, "decode": 2}
    assert "implausible metrics (rate_rps=1e+300, osl=-3.0)" in plan.reason
    cleaned = core.plausible(core.Observation(time=0.0, rate_rps=2.0, isl=100, osl=100, ttft_s=math.nan,
                                              itl_s=-1.0, decode_running=math.inf))
    assert cleaned.complete and (cleaned.ttft_s, cleaned.itl_s, cleaned.decode_running) == (None, None, None)


def test_a_load_beyond_every_bound_is_sized_at_the_bound_without_searching_past_it() -> None:
    """A plausible but enormous load (a million requests/s of 10k-token prompts) must not make sizing walk
    millions of replica counts: it stops at scaling.max."""
    spec = graph_body("g", {"replicas": 1, "scaling": {"min": 1, "max": 16}}, {"replicas": 1, "scaling": {"max": 16}})
    (plan,) = run_core(spec["spec"], [core.Observation(time=0.0, rate_rps=1e6, isl=10_000, osl=500)])
    assert dict(plan.replicas) == {"prefill": 16, "decode": 16}
    assert "1e+06 req/s at ISL 10000" in plan.reason and "more than 16 replicas needed" in plan.reason


# -- the live planner: writes, in order, under a shared budget --------------------------------------------


class Cluster:
    """The DynamoGraphComponents as the apiserver holds them; the planner's watch sees each write only at the
    next round (a watch event comes after the write), and every /scale write is checked on the spot."""

    def __init__(self, planner: live.LivePlanner, graphs: dict[str, dict[str, Any]], budget: int) -> None:
        self.planner, self.graphs, self.budget = planner, graphs, budget
        self.replicas = {(name, pool): body["spec"]["components"][pool]["replicas"]
                         for name, body in graphs.items() for pool in ("prefill", "decode")}
        self.version = 1
        self.writes: list[tuple[str, str, int]] = []
        self.over: list[str] = []
        self.deliver()

    def in_use(self) -> int:
        return sum(n * self.graphs[name]["spec"]["components"][pool].get("gpus", 1)
                   for (name, pool), n in self.replicas.items())

    def deliver(self) -> None:
        """The watch catches up."""
        for (name, pool), n in self.replicas.items():
            self.planner.components.upsert({
                "kind": api.COMPONENT_KIND,
                "metadata": {"name": f"{name}-{pool}", "namespace": "ns", "resourceVersion": str(self.version)},
                "spec": {"replicas": n}, "status": {"readyReplicas": n}})

    async def patch(self, kind: str, namespace: str, name: str, body: dict[str, Any], *,
                    subresource: str) -> dict[str, Any]:
        graph, pool = name.rsplit("-", 1)
        n = body["spec"]["replicas"]
        bounds = self.graphs[graph]["spec"]["components"][pool]["scaling"]
        assert bounds["min"] <= n <= bounds["max"], (name, n, bounds)
        self.replicas[(graph, pool)] = n
        self.version += 1
        self.writes.append((graph, pool, n))
        if self.in_use() > self.budget:
            self.over.append(f"after {name}={n}: {self.in_use()} GPUs of {self.budget}")
        return {"kind": "Scale", "metadata": {"name": name, "resourceVersion": str(self.version)},
                "spec": {"replicas": n}}

    async def apply(self, manifest: dict[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
        return manifest

    async def event(self, body: dict[str, Any], *, type_: str, reason: str, message: str) -> None:
        pass


class Script:
    """Prometheus as the test scripted it: per round, per graph, one observation."""

    url = "http://prometheus.test"

    def __init__(self, rounds: list[dict[str, core.Observation]]) -> None:
        self.rounds, self.round = rounds, 0

    def observe(self, *, namespace: str, graph: str, **_: Any) -> core.Observation:
        return self.rounds[self.round].get(graph, core.Observation(time=0.0, error="no series"))

    def history(self, **_: Any) -> observe.History:
        return observe.History((), (), ())


def run_live(graphs: dict[str, dict[str, Any]], budget: int, rounds: list[dict[str, core.Observation]]) -> Cluster:
    script = Script(rounds)
    clock = {"now": 0.0}
    planner = live.LivePlanner(None, script, budgets={"team": budget}, hold_s=120,  # type: ignore[arg-type]
                               clock=lambda: clock["now"])
    cluster = Cluster(planner, graphs, budget)
    planner.kube = cluster  # type: ignore[assignment]
    planner._started = True  # the watches, as if listed: the stores are filled by hand
    for watcher in planner._informers:
        watcher.synced.set()
    for body in graphs.values():
        planner.graphs.upsert(body)
    for index in range(len(rounds)):  # one round a minute; each graph is planned when its interval is due
        script.round = index
        asyncio.run(planner.tick())
        clock["now"] += 60.0
        cluster.deliver()
    return cluster


@PROPERTY
@given(specs=st.lists(st.tuples(worker_specs(), worker_specs(), st.integers(-2, 2), st.sampled_from([60, 120, 180])),
                     min_size=2, max_size=3),
       budget=st.integers(4, 40), data=st.data())
def test_no_moment_of_a_shared_budget_rebalance_passes_the_budget(
    specs: list[tuple[dict[str, Any], dict[str, Any], int, int]], budget: int, data: st.DataObject,
) -> None:
    """Graphs of different priorities and planning intervals share a budget; loads move arbitrarily between
    rounds. After every
    single /scale write the graphs together stay within the budget (they start within it, and their
    minimums fit), each write is within its pool's bounds (Cluster.patch), and the same script gives the
    same writes."""
    graphs = {f"g{i}": graph_body(f"g{i}", prefill, decode, budget="team", priority=priority, intervalSeconds=interval)
              for i, (prefill, decode, priority, interval) in enumerate(specs)}
    start = sum(gpus_of({p: body["spec"]["components"][p]["replicas"] for p in ("prefill", "decode")}, body["spec"])
                for body in graphs.values())
    minimums = sum(body["spec"]["components"][p]["scaling"]["min"] * body["spec"]["components"][p]["gpus"]
                   for body in graphs.values() for p in ("prefill", "decode"))
    rounds = data.draw(st.lists(st.fixed_dictionaries({name: loads() for name in graphs}), min_size=2, max_size=8))
    first = run_live(graphs, max(budget, start, minimums), rounds)
    assert not first.over, first.over
    second = run_live(graphs, max(budget, start, minimums), rounds)
    assert second.writes == first.writes


def test_a_rebalance_that_moves_gpus_shrinks_the_giver_before_the_taker_grows() -> None:
    """By hand: budget 8; `training` (priority 0, planned every 3 minutes) runs 6 GPUs, `chat` (priority 5,
    every minute) 2. Then chat's load needs more. The split grants chat most of the budget at its next
    interval, while training, not due yet, still runs 6: chat may grow only into what is free (nothing,
    then what training gave back at its own interval), and the total never passes 8 on the way."""
    training = graph_body("training", {"replicas": 3, "scaling": {"min": 1, "max": 8}},
                          {"replicas": 3, "scaling": {"min": 1, "max": 8}}, budget="team", priority=0,
                          intervalSeconds=180)
    chat = graph_body("chat", {"replicas": 1, "scaling": {"min": 1, "max": 8}},
                      {"replicas": 1, "scaling": {"min": 1, "max": 8}}, budget="team", priority=5)
    light = core.Observation(time=0.0, rate_rps=0.5, isl=2000, osl=200)
    heavy = core.Observation(time=0.0, rate_rps=60.0, isl=6000, osl=200)
    rounds = [{"training": heavy, "chat": light}] * 4 + [{"training": heavy, "chat": heavy}] * 5
    cluster = run_live({"training": training, "chat": chat}, 8, rounds)
    assert not cluster.over, cluster.over
    chat_gpus = sum(n for (name, _), n in cluster.replicas.items() if name == "chat")
    assert chat_gpus > 2, cluster.writes  # chat did get the GPUs training gave back
    last_shrink = max(i for i, (g, _, _) in enumerate(cluster.writes) if g == "training")
    first_grow = min(i for i, (g, _, _) in enumerate(cluster.writes) if g == "chat" and i > 0)
    assert last_shrink < first_grow, cluster.writes


def test_writes_within_a_graph_shrink_before_they_grow() -> None:
    assert step.write_order({"prefill": 4, "decode": 2}, {"prefill": 2, "decode": 4}) == (("prefill", 2), ("decode", 4))
    assert step.write_order({"prefill": 2, "decode": 4}, {"prefill": 4, "decode": 2}) == (("decode", 2), ("prefill", 4))
    assert step.write_order({"prefill": 2, "decode": 2}, {"prefill": 2, "decode": 2}) == ()
