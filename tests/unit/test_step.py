"""The one planning step: the interval's plan, the fast path and scale to zero as one pure function of
(config, state, reading, now), with one notion of asleep and the GPU budget's grant inside it."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from prometheus_client import REGISTRY

from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import budget, capacity, core, live, sizing, step, zero

MODEL = capacity.CapacityModel(live.simulator_profile(1))


def config(*, prefill_min: int = 1, idle_s: float | None = None, mode: str = "sla", **planner: object) -> step.StepConfig:
    spec = api.DynamoGraphSpec.model_validate({
        "model": {"name": "m"}, "engine": {"framework": "simulator"},
        "components": {"prefill": {"scaling": {"min": prefill_min, "max": 8}},
                       "decode": {"scaling": {"min": prefill_min, "max": 8}}},
        "planner": {"mode": mode, "sla": {"ttftMs": 500, "itlMs": 50}, "predictor": "constant",
                    "intervalSeconds": 10, **planner},
    })
    return step.StepConfig(plan=core.config_from_spec(spec, startup_s=30, hold_s=20), capacity=MODEL, graph="ns/g",
                           idle_s=idle_s)


def fleet(prefill: int, decode: int, *, rolling_out: bool = False) -> step.Fleet:
    replicas: dict[sizing.Pool, int] = {"prefill": prefill, "decode": decode}
    return step.Fleet(current=replicas, ready=replicas, rolling_out=rolling_out)


def busy(rate: float = 2.0) -> core.Observation:
    return core.Observation(time=0.0, rate_rps=rate, isl=1500, osl=200, ttft_s=0.2, itl_s=0.02)


def test_a_pool_asleep_stays_at_zero_through_ten_intervals_and_fast_path_ticks_and_wakes_on_a_request() -> None:
    """Traffic, then silence past idleSeconds: the demand reading sends both pools to zero; ten intervals
    of planning and twenty fast-path ticks between them (nothing queued) keep them there with no write;
    the next held request wakes them. The fast path's floor follows the sleep."""
    cfg = config(prefill_min=0, idle_s=20)
    state, current = step.GraphState(), fleet(1, 1)
    for k in range(3):
        decision, state = step.step(cfg, state, step.IntervalReading(observation=busy(), fleet=current), now=10.0 * k)
        current = fleet(decision.replicas["prefill"], decision.replicas["decode"])
    quiet = zero.Demand(held=0, inflight=0, idle_s=25)
    decision, state = step.step(cfg, state, step.DemandReading(demand=quiet, fleet=current), now=35.0)
    assert decision.kind == "asleep" and dict(decision.writes) == {"prefill": 0, "decode": 0} and state.asleep
    current = fleet(0, 0)
    writes = []
    for k in range(10):
        now = 40.0 + 10.0 * k
        decision, state = step.step(cfg, state, step.IntervalReading(
            observation=core.Observation(time=now, rate_rps=0.0), fleet=current), now=now)
        assert dict(decision.replicas) == {"prefill": 0, "decode": 0}
        writes += decision.writes
        for tick in (5.0, 7.5):
            decision, state = step.step(cfg, state, step.QueueReading(
                fleet=current, decode_running=0, decode_waiting=0, prefill_waiting=0, started=100.0), now=now + tick)
            assert decision.kind == "none"
            writes += decision.writes
        decision, state = step.step(cfg, state, step.DemandReading(demand=quiet, fleet=current), now=now + 9)
        writes += decision.writes
    assert writes == [] and state.asleep
    held = zero.Demand(held=1, inflight=1, idle_s=0)
    decision, state = step.step(cfg, state, step.DemandReading(demand=held, fleet=current), now=200.0)
    assert decision.kind == "woken" and dict(decision.writes) == {"prefill": 1, "decode": 1} and not state.asleep


def test_the_interval_grants_the_budget_share_within_what_is_free_and_claims_what_it_wants() -> None:
    """16 GPUs, another graph claiming 12 at a higher priority and running 14 now: the graph, which last
    claimed 8, is granted its 4-GPU share, cut to the 2 left free until the other's shrink is written,
    and claims what its decision would use without the budget. A newcomer holding without data claims
    its minimum."""
    cfg = config()
    other = budget.BudgetClaim(graph="ns/other", priority=10, min_gpus=2, wanted_gpus=12)
    own = budget.BudgetClaim(graph="ns/g", priority=0, min_gpus=2, wanted_gpus=8)
    view = budget.BudgetView("shared", 16, (other, own), others_in_use=14)
    decision, state = step.step(cfg, step.GraphState(), step.IntervalReading(
        observation=busy(40.0), fleet=fleet(1, 1), budget=view), now=0.0)
    assert decision.grant is not None and decision.grant.gpus == 2 and state.granted == 2
    assert sum(decision.replicas.values()) == 2 and "2 GPUs free" in decision.reason
    assert decision.plan is not None and decision.claim is not None
    assert decision.claim.wanted_gpus == decision.plan.wanted_gpus > 2  # what it would run without the budget
    newcomer = dataclasses.replace(view, claims=(other,))
    holding, _ = step.step(cfg, step.GraphState(), step.IntervalReading(
        observation=core.Observation(time=0.0, error="no metrics"), fleet=fleet(1, 1), budget=newcomer), now=0.0)
    assert holding.claim == budget.BudgetClaim(graph="ns/g", priority=0, min_gpus=2, wanted_gpus=2)


def test_a_rollout_and_advisory_mode_decide_but_write_nothing_and_the_fast_path_waits() -> None:
    for cfg, current in ((config(), fleet(1, 1, rolling_out=True)), (config(mode="advisory"), fleet(1, 1))):
        decision, state = step.step(cfg, step.GraphState(), step.IntervalReading(
            observation=busy(40.0), fleet=current), now=0.0)
        assert decision.plan is not None and decision.replicas["prefill"] > 1 and decision.writes == ()
        backlog = step.QueueReading(fleet=current, decode_running=400, decode_waiting=400, prefill_waiting=50)
        reacted, _ = step.step(cfg, state, backlog, now=5.0)
        assert reacted.kind == "none" and reacted.writes == ()


def test_the_fast_path_adds_within_the_last_grant_and_what_is_free_now() -> None:
    cfg = config()
    state = step.GraphState(memory=core.GraphMemory(lengths=(core.IntervalLengths(0.0, 1.0, 1500.0, 200.0),)),
                            floor={"prefill": 1, "decode": 1}, granted=3)
    backlog = step.QueueReading(fleet=fleet(1, 1), decode_running=200, decode_waiting=300, prefill_waiting=0)
    decision, _ = step.step(cfg, state, backlog, now=5.0)
    assert decision.kind == "fast-path" and dict(decision.writes) == {"decode": 2}
    crowded = dataclasses.replace(backlog, budget=budget.BudgetView("shared", 4, (), others_in_use=2))
    decision, _ = step.step(cfg, state, crowded, now=5.0)  # 2 GPUs free: the pools already use them
    assert decision.kind == "none"


def test_a_deleted_graph_leaves_no_state_and_no_metric_series() -> None:
    """A graph planned once exports a dozen series; once it is deleted the planner holds nothing of it:
    no planning state, no budget claim, and not one series labelled with it."""
    planner = live.LivePlanner(None, None, budgets={"shared": 8})  # type: ignore[arg-type]
    plan = core.Plan(replicas={"prefill": 2, "decode": 1}, reasons=["sized"], data_ok=True,
                     observed=core.Observation(time=0.0, rate_rps=3.0),
                     coverage={"requests": {0.9: 0.88}}, binding={"prefill": "forecast", "decode": "bounds"})
    plan_config = config().plan
    planner._export("ns", "gone", plan, plan_config)
    planner._export("ns", "kept", plan, plan_config)
    live.FAST_PATH.labels("ns", "gone", "prefill").inc()
    planner.planned[("ns", "gone")] = live.PlannedGraph()
    planner.ledger.claim("shared", budget.BudgetClaim("ns/gone", priority=0, min_gpus=2, wanted_gpus=4))

    def series(graph: str) -> list[str]:
        return [sample.name for family in REGISTRY.collect() for sample in family.samples
                if sample.labels.get("namespace") == "ns" and sample.labels.get("graph") == graph]

    assert len(series("gone")) > 20
    planner._started = True
    for watcher in planner._informers:
        watcher.synced.set()
    planner.may_act = lambda: False
    asyncio.run(planner.tick())  # "gone" is in no store any more: the tick forgets it
    assert series("gone") == [] and ("ns", "gone") not in planner.planned
    assert planner.ledger.claims("shared") == []
    assert len(series("kept")) > 20  # another graph's series stay
    planner.forget(("ns", "kept"))
    assert series("kept") == []


@pytest.mark.parametrize("held", [0.0, 2.0])
def test_a_graph_that_may_not_sleep_is_never_asleep(held: float) -> None:
    decision, state = step.step(config(), step.GraphState(asleep=True), step.DemandReading(
        demand=zero.Demand(held=held, inflight=held, idle_s=900), fleet=fleet(1, 1)), now=0.0)
    assert decision.kind == "none" and not state.asleep


def test_the_fast_path_reads_the_arrivals_at_the_graphs_risk() -> None:
    """The same bursty arrivals and the same prompt backlog: a graph at risk 0.5 sizes for their mean
    rate, which its two prefill replicas serve with room to drain the backlog within a startup, and adds
    nothing; at risk 0.99 it reads the bursts, finds the backlog still there a startup ahead, and adds.
    (The fleet is not changed between readings: each is judged against the same two replicas.)"""
    from fleetpilot.planner import reactive

    isl = 1500.0
    per_s = MODEL.prefill_tokens_per_s(isl).value
    capacity_rps = 2 * per_s / isl
    decisions = {}
    for risk in (0.5, 0.99):
        cfg = config(risk=risk)
        current = fleet(2, 2)
        decision, state = step.step(cfg, step.GraphState(), step.IntervalReading(observation=busy(), fleet=current),
                                    now=0.0)
        counted = 0.0
        for k in range(1, 61):  # five minutes of 5-s readings at 90% of the pool's rate, every twelfth a burst
            counted += 5.0 * 0.9 * capacity_rps * (3.2 if k % 12 == 0 else 0.8)
            quiet = step.QueueReading(fleet=current, decode_running=0, decode_waiting=0, prefill_queued_tokens=0.0,
                                      started=counted, isl=isl, osl=200)
            decision, state = step.step(cfg, state, quiet, now=5.0 * k)
            assert decision.kind == "none" or risk == 0.99  # at 0.99 the bursts alone may be a shortage ahead
        assert state.arrivals is not None
        mean = reactive.arrival_quantile(state.arrivals.readings, horizon_s=cfg.plan.startup_s, risk=0.5)
        assert mean is not None and mean < capacity_rps
        backlog = 0.5 * (capacity_rps - mean) * isl * cfg.plan.startup_s  # the mean rate drains it in half a startup
        reading = step.QueueReading(fleet=current, decode_running=0, decode_waiting=0, prefill_queued_tokens=backlog,
                                    started=counted, isl=isl, osl=200)
        decisions[risk], _ = step.step(cfg, state, reading, now=305.0)
    assert decisions[0.5].kind == "none"
    assert decisions[0.99].kind == "fast-path" and decisions[0.99].replicas["prefill"] > 2
