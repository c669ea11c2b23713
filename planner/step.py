"""The planning step: everything that decides a graph's replicas, as one pure function.

Where it sits: between reading a graph's world and writing to it. The live planner (planner/live.py)
reads the interval's metrics (Prometheus), the frontends' queues, the DynamoGraphComponents and the
shared budget's claims into one reading, calls `step`, and writes what the `Decision` says: /scale,
the ledger's claim, Events, status, metrics. The backtest (planner/backtest/policies.py) builds the
same readings from a simulated fleet and calls the same `step`: no decision exists twice.

One graph's `GraphState` carries everything between steps. Three readings come at three cadences:

- `IntervalReading`, every `spec.planner.intervalSeconds`: the GPU budget's grant (the graph's share
  of a shared budget, within the GPUs the others leave free now), then forecast, size, correct, hold
  and bound (`core.plan_interval`); pools asleep stay at zero; while a rollout is in progress the plan
  is advisory. It sets the floor the fast path never goes below, and the claim on the shared budget.
- `QueueReading`, every `spec.planner.fastPathSeconds` between intervals: the engines' queues and the
  arrivals' trend (`core.react`), adding replicas within the GPUs free now, never below the floor.
- `DemandReading`, every tick for a graph that may scale to zero: wake the pools at zero when a
  request is held, send the pools that may sleep to zero after the idle window (planner/zero.py).

Asleep is one notion for all three: the demand reading sets `GraphState.asleep`, the interval's plan
then keeps the pools that may sleep at zero, and the fast path leaves a pool at zero with nothing
waiting for it alone (`reactive.react`). Pure: plain data in and out, no clock and no I/O.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Literal

from fleetpilot.planner import budget as budget_mod
from fleetpilot.planner import capacity as capacities
from fleetpilot.planner import core, predict, reactive, sizing, zero


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """What the step knows of a graph beyond what `core.GraphPlanConfig` says."""

    plan: core.GraphPlanConfig
    capacity: capacities.CapacityModel
    graph: str = ""  # "namespace/name": the graph's name in a shared budget's claims
    priority: int = 0  # spec.planner.priority: its rank in a shared budget
    idle_s: float | None = None  # spec.planner.idleSeconds for a graph that may scale to zero; None: it may not

    @property
    def acts(self) -> bool:
        """Whether the graph's replicas are the planner's to write (mode sla), not only advised."""
        return self.plan.mode == "sla"


@dataclasses.dataclass(frozen=True)
class Fleet:
    """What each pool runs now: asked for (the DynamoGraphComponents' replicas) and ready."""

    current: Mapping[sizing.Pool, int]
    ready: Mapping[sizing.Pool, int]
    rolling_out: bool = False  # the operator moves capacity between generations (status.rollout)


@dataclasses.dataclass(frozen=True)
class IntervalReading:
    """One planning interval: what the frontends measured, the fleet, and the shared budget if any."""

    observation: core.Observation
    fleet: Fleet
    budget: budget_mod.BudgetView | None = None
    # The frontends' requests-received counter at the interval's end, where the reader has it: the
    # arrivals since the last fast-path reading join the trend (the backtest's ticks stop a step short).
    started: float | None = None
    predictor: predict.Predictor | None = None  # replaces the config's (the backtest's memoised one)


@dataclasses.dataclass(frozen=True)
class QueueReading:
    """The engines' queues now, for the fast path between intervals."""

    fleet: Fleet
    decode_running: float
    decode_waiting: float
    # What waits for prefill: prompt tokens where the reader counts them (the simulated fleet), else
    # requests (the engines' gauges), counted at the recent mean prompt length.
    prefill_queued_tokens: float | None = None
    prefill_waiting: float = 0.0
    started: float | None = None  # the frontends' requests-received counter (None: not read)
    isl: float | None = None  # the reading's own mean lengths, where known; else the recent intervals'
    osl: float | None = None
    budget: budget_mod.BudgetView | None = None


@dataclasses.dataclass(frozen=True)
class DemandReading:
    """What the graph's frontends see now (held, in flight, idle for how long), for scale to zero."""

    demand: zero.Demand
    fleet: Fleet


Reading = IntervalReading | QueueReading | DemandReading


@dataclasses.dataclass(frozen=True)
class Arrivals:
    """The frontends' counter at the last reading, the readings the trend is fitted from, and the
    trend's need a startup ahead (sized once per reading: a fluid step's ticks share it)."""

    counted: float
    at: float
    readings: tuple[reactive.Reading, ...] = ()
    trend: reactive.Trend | None = None
    ahead: Mapping[sizing.Pool, int] | None = None


@dataclasses.dataclass(frozen=True)
class GraphState:
    """Everything the planner carries from one step of a graph to the next."""

    memory: core.GraphMemory = dataclasses.field(default_factory=core.GraphMemory)
    floor: Mapping[sizing.Pool, int] | None = None  # the last plan, while the fast path may add to it
    granted: int | None = None  # the GPUs the last plan was granted (its gpu_budget; None: no budget)
    arrivals: Arrivals | None = None
    asleep: bool = False  # no request for spec.planner.idleSeconds: the pools that may sleep stay at zero


Kind = Literal["plan", "fast-path", "woken", "asleep", "none"]


@dataclasses.dataclass(frozen=True)
class Decision:
    """What one step decided: the replicas per pool, the writes that take the fleet there, and why."""

    kind: Kind
    replicas: Mapping[sizing.Pool, int]
    writes: tuple[tuple[sizing.Pool, int], ...] = ()  # the /scale writes, every shrink before any grow
    plan: core.Plan | None = None  # the interval's plan (kind "plan")
    reasons: tuple[str, ...] = ()
    claim: budget_mod.BudgetClaim | None = None  # the graph's claim on its shared budget, once written
    grant: budget_mod.Grant | None = None  # the GPUs it was granted this interval
    rollout_hold: bool = False  # advisory while a rollout is in progress

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    @property
    def changed(self) -> bool:
        """Whether the decision writes any pool's replicas."""
        return bool(self.writes)


def write_order(current: Mapping[sizing.Pool, int], decided: Mapping[sizing.Pool, int]) -> tuple[tuple[sizing.Pool, int], ...]:
    """The /scale writes that take pools from `current` to `decided`: every shrink before any grow, so no
    moment between two writes uses more GPUs than both ends."""
    changed = [(pool, n) for pool, n in decided.items() if n != current.get(pool)]
    return tuple(sorted(changed, key=lambda change: change[1] > current.get(change[0], 0)))


def step(config: StepConfig, state: GraphState, reading: Reading, *, now: float) -> tuple[Decision, GraphState]:
    """One step of one graph (pure): the decision the reading calls for, and the state after it."""
    if isinstance(reading, IntervalReading):
        return _plan(config, state, reading, now=now)
    if isinstance(reading, QueueReading):
        return _react(config, state, reading, now=now)
    return _wake_or_sleep(config, state, reading)


# -- the GPU budget --------------------------------------------------------------------------------------


def _gpus(config: core.GraphPlanConfig, replicas: Mapping[sizing.Pool, int]) -> int:
    return sum(n * config.gpus_per_replica[pool] for pool, n in replicas.items())


def room(view: budget_mod.BudgetView, config: core.GraphPlanConfig, current: Mapping[sizing.Pool, int]) -> int:
    """The most GPUs the graph may run now under a shared budget: what the others leave free, and never
    less than it runs (shrinking it is its share's business, not the others')."""
    return max(view.gpus - view.others_in_use, _gpus(config, current))


def _granted(config: StepConfig, view: budget_mod.BudgetView,
             current: Mapping[sizing.Pool, int]) -> tuple[budget_mod.Grant, list[str], tuple[str, str] | None]:
    """The graph's GPUs under a shared budget this interval, the note that explains them, and a warning
    when the minimums of every graph naming it exceed it."""
    grant = budget_mod.grant(view, graph=config.graph, priority=config.priority,
                             min_gpus=core.min_gpus(config.plan), own_cap=config.plan.gpu_budget)
    note = grant.reason
    free = room(view, config.plan, current)
    if grant.gpus > free:
        note += f"; {free} GPUs free until the others' shrinks are written: growing to {free} for now"
        grant = dataclasses.replace(grant, gpus=free)
    short = budget_mod.minimums(view, graph=config.graph, min_gpus=core.min_gpus(config.plan)) - view.gpus
    warning = None
    if short > 0:
        warning = ("BudgetBelowMinimum", (
            f"shared GPU budget {view.name} ({view.gpus} GPUs) is {short} short of the minimums of the graphs"
            f" naming it: each keeps its scaling.min, over budget; raise --gpu-budget {view.name} or lower"
            " scaling.min"))
    return grant, [f"budget {view.name}: {note}"], warning


# -- the interval ----------------------------------------------------------------------------------------


def _asleep(plan: core.Plan, config: core.GraphPlanConfig) -> core.Plan:
    """The plan of a graph asleep: its pools that may be at zero stay there until a request is held."""
    pools = [pool for pool, bound in config.bounds.items() if bound.min_replicas == 0]
    return dataclasses.replace(
        plan, replicas={**plan.replicas, **dict.fromkeys(pools, 0)},
        binding={**plan.binding, **dict.fromkeys(pools, "idle")},
        reasons=[*plan.reasons, f"{', '.join(pools)}: asleep (no request for spec.planner.idleSeconds)"])


def _plan(config: StepConfig, state: GraphState, reading: IntervalReading, *,
          now: float) -> tuple[Decision, GraphState]:
    plan_config, current = config.plan, reading.fleet.current
    grant: budget_mod.Grant | None = None
    notes: list[str] = []
    shared_warning: tuple[str, str] | None = None
    if reading.budget is not None:
        grant, notes, shared_warning = _granted(config, reading.budget, current)
        plan_config = dataclasses.replace(plan_config, gpu_budget=grant.gpus)
    plan, memory = core.plan_interval(plan_config, reading.observation, state.memory, current=current,
                                      capacity=config.capacity, now=now, ready=reading.fleet.ready,
                                      predictor=reading.predictor)
    plan = dataclasses.replace(plan, reasons=[*plan.reasons, *notes])
    if shared_warning is not None and plan.warnings is not None:
        plan = dataclasses.replace(plan, warnings=(*plan.warnings, shared_warning))
    if state.asleep:
        plan = _asleep(plan, plan_config)
    rollout_hold = config.acts and reading.fleet.rolling_out
    if rollout_hold:
        # Advisory while generations change: the rollout sizes each generation from the totals the
        # planner set last; a new total now would move the goalposts of a half-done rollout.
        plan = dataclasses.replace(plan, reasons=[*plan.reasons, "holding: a rollout is in progress"])
    # The fast path adds to a plan it may act on: sla mode, disaggregated, sized from data.
    fast = config.acts and plan_config.disaggregated and plan.data_ok and plan_config.reactive_period_s is not None
    claim = None
    if reading.budget is not None:
        wanted = plan.wanted_gpus
        if wanted is None and not any(c.graph == config.graph for c in reading.budget.claims):
            wanted = core.min_gpus(plan_config)  # a newcomer holding without data claims its minimum
        if wanted is not None:
            claim = budget_mod.BudgetClaim(graph=config.graph, priority=config.priority,
                                           min_gpus=core.min_gpus(plan_config), wanted_gpus=wanted)
    arrivals = state.arrivals
    if reading.started is not None:
        arrivals = _read_arrivals(config, state, arrivals, reading.started, now=now, memory=memory)
    acting = config.acts and not rollout_hold
    decision = Decision(kind="plan", replicas=dict(plan.replicas), plan=plan, reasons=tuple(plan.reasons),
                        writes=write_order(current, plan.replicas) if acting else (), claim=claim, grant=grant,
                        rollout_hold=rollout_hold)
    return decision, dataclasses.replace(state, memory=memory, floor=dict(plan.replicas) if fast else None,
                                         granted=plan_config.gpu_budget, arrivals=arrivals)


# -- the fast path ---------------------------------------------------------------------------------------


def _read_arrivals(config: StepConfig, state: GraphState, last: Arrivals | None, counted: float, *, now: float,
                   memory: core.GraphMemory) -> Arrivals | None:
    """The arrivals remembered with the requests counted since the last reading, and their trend's need a
    startup ahead. A counter that went back (a frontend restarted or left) starts the readings afresh:
    its difference is not the arrivals. A second reading at the same moment and count keeps the first's."""
    if last is not None and now <= last.at and counted == last.counted:
        return last
    if last is None or counted < last.counted or now <= last.at:
        return Arrivals(counted, now)
    plan = config.plan
    readings, trend = reactive.read_arrivals(
        last.readings, reactive.Reading(last.at, now, counted - last.counted), startup_s=plan.startup_s,
        period_s=plan.reactive_period_s or plan.interval_s)
    ahead = core.needed_ahead(plan, memory, config.capacity, trend, now=now) if trend is not None else None
    return Arrivals(counted, now, readings, trend if ahead is not None else None, ahead)


def _react(config: StepConfig, state: GraphState, reading: QueueReading, *, now: float) -> tuple[Decision, GraphState]:
    current = reading.fleet.current
    arrivals = state.arrivals
    if reading.started is None:
        arrivals = None
    else:
        arrivals = _read_arrivals(config, state, arrivals, reading.started, now=now, memory=state.memory)
    state = dataclasses.replace(state, arrivals=arrivals)
    unchanged = Decision(kind="none", replicas=dict(current))
    if state.floor is None or reading.fleet.rolling_out:
        # No plan to add to (advisory, aggregated, holding without data), or a rollout moving capacity
        # between generations: the planner holds until it is done.
        return unchanged, state
    plan = dataclasses.replace(config.plan, gpu_budget=state.granted)
    if reading.budget is not None and state.granted is not None:
        # The others may have grown into what this graph's last plan left unused: only what is free now.
        plan = dataclasses.replace(plan, gpu_budget=min(state.granted, room(reading.budget, plan, current)))
    queued = reading.prefill_queued_tokens
    if queued is None:
        seen = core.recent_lengths(state.memory.lengths, now=now, interval_s=plan.interval_s)
        queued = reading.prefill_waiting * core.recent_length(seen, "isl")
    gauges = reactive.Gauges(prefill_queued_tokens=queued, decode_running=reading.decode_running,
                             decode_waiting=reading.decode_waiting, ready=reading.fleet.ready, active=current)
    trend, ahead = (arrivals.trend, arrivals.ahead) if arrivals is not None else (None, None)
    reaction = core.react(plan, gauges, state.memory, floor=state.floor, capacity=config.capacity, now=now,
                          isl=reading.isl, osl=reading.osl, trend=trend, ahead=ahead,
                          readings=arrivals.readings if arrivals is not None else ())
    if not reaction.changed:
        return dataclasses.replace(unchanged, reasons=tuple(reaction.reasons)), state
    added = {pool: n for pool, n in reaction.replicas.items() if n > current.get(pool, 0)}
    return Decision(kind="fast-path", replicas=dict(reaction.replicas), reasons=tuple(reaction.reasons),
                    writes=tuple(added.items())), state


# -- scale to zero ---------------------------------------------------------------------------------------


def _wake_or_sleep(config: StepConfig, state: GraphState, reading: DemandReading) -> tuple[Decision, GraphState]:
    current = reading.fleet.current
    unchanged = Decision(kind="none", replicas=dict(current))
    if config.idle_s is None or not config.acts:
        return unchanged, dataclasses.replace(state, asleep=False)
    if reading.fleet.rolling_out:
        return unchanged, state
    asleep = zero.asleep(reading.demand, config.idle_s)
    state = dataclasses.replace(state, asleep=asleep)
    change = zero.decide(min_replicas={pool: bound.min_replicas for pool, bound in config.plan.bounds.items()},
                         current={str(pool): n for pool, n in current.items()}, demand=reading.demand,
                         idle_window_s=config.idle_s)
    if not change:
        return unchanged, state
    moved = {typing.cast(sizing.Pool, pool): n for pool, n in change.items()}
    replicas = {**current, **moved}
    if reading.demand.held > 0:
        kind: Kind = "woken"
        why = f"{reading.demand.held:g} request(s) held by the frontend for a worker"
    else:
        kind = "asleep"
        why = f"no request for {reading.demand.idle_s:.0f} s (spec.planner.idleSeconds {config.idle_s:g})"
    floor = None if state.floor is None else {**state.floor, **moved}
    return (Decision(kind=kind, replicas=replicas, reasons=(why,), writes=tuple(moved.items())),
            dataclasses.replace(state, floor=floor))
