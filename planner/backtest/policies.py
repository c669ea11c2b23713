"""The scaling policies a backtest compares, behind one small interface.

Each policy sees what a live controller would (the last interval's `WindowStats`: rate, lengths,
latencies, utilisation, ready replicas) and returns the replicas each pool should run. Each has one
aggressiveness knob, so that a sweep can draw its cost–attainment curve:

| policy | what it is | knob |
|---|---|---|
| `static-peak` / `static-mean` | a fixed fleet sized (by the planner's sizing) for the trace's peak / mean interval | load factor |
| `hpa` | Kubernetes' HPA formula on utilisation (prefill busy share, decode KV usage), 300 s down-stabilisation, 10% tolerance | target utilisation |
| `dynamo` | NVIDIA Dynamo's planner as documented today: a predictive throughput loop every 180 s sets a floor, a load loop every 5 s steps ±1 replica on the engines' queues | load factor on the forecast |
| `dynamo-v1` | Dynamo's earlier throughput-only planner: mean TTFT/ITL corrections (prefill capped at 1), next-interval forecast, no hold | load factor |
| `fleetpilot-<predictor>` | the real planner: its planning step (`step.step`) every interval and every 5 s between (`-predictive`: without it; `-mean`: sizing every request at the mean lengths instead of their mix) | risk (the calibrated forecast quantile sized for) |
| `oracle` | perfect foresight: the fewest replicas per window with which a share of its requests meets the SLA, asked for a startup time ahead | that share |

Pure: no I/O and no clock. The oracle's per-window needs are computed by the caller (it needs the
fleet model) and handed in as plain numbers.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Protocol

from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import budget, core, predict, sizing, step
from fleetpilot.planner import capacity as capacities
from fleetpilot.planner.backtest.fleetsim import FLEET_POOLS, FleetPool, WindowStats

Replicas = dict[FleetPool, int]


@dataclasses.dataclass(frozen=True)
class Setting:
    """What every policy may know about the graph it scales."""

    capacity: capacities.CapacityModel
    sla: api.SlaTarget
    interval_s: float
    startup_s: float
    bounds: Mapping[FleetPool, tuple[int, int]]  # (min, max) per pool
    gpus_per_replica: int = 1  # every GPU one replica holds: all the pods of a multinode group
    # The decode engine's running-batch cap as the graph's engine flags state it (vLLM's --max-num-seqs):
    # what a user's graph says and fleetpilot's planner reads (`DynamoGraphSpec.decode_batch_cap`).
    decode_batch_cap: int | None = None

    def clamp(self, replicas: Mapping[FleetPool, int]) -> Replicas:
        return {pool: min(max(replicas.get(pool, lo), lo), hi) for pool, (lo, hi) in self.bounds.items()}


class Policy(Protocol):
    """A scaling policy: the replicas to start with, then a decision per interval.

    A policy with a fast loop also says how often it runs (`reactive_period_s`); between two
    decisions the driver then calls `react` with the last period's window, and applies what it
    returns (None: no change).
    """

    name: str
    knob: float
    reactive_period_s: float | None

    def initial(self) -> Replicas: ...

    def decide(self, stats: WindowStats, now: float) -> Replicas: ...

    def react(self, stats: WindowStats, now: float) -> Replicas | None: ...

    def forecast(self) -> float | None:
        """The request rate this policy planned the last decision for (None: it does not forecast)."""
        ...


class Base:
    """What a policy without a fast loop and without a forecast says between and about its decisions."""

    reactive_period_s: float | None = None

    def react(self, stats: WindowStats, now: float) -> Replicas | None:
        return None

    def forecast(self) -> float | None:
        return None


# -- a memo shared by every run of a sweep -------------------------------------------------------------


class MemoPredictor:
    """A predictor that remembers its forecasts: in an open-loop backtest the offered rate, hence the
    history a forecast is fitted on, is the same whatever the policy does, so a sweep over a knob fits
    each model once per interval instead of once per run."""

    def __init__(self, inner: predict.Predictor) -> None:
        self.inner = inner
        self._memo: dict[tuple[int, int, float, int], predict.Forecast] = {}

    @property
    def name(self) -> str:
        return self.inner.name

    def forecast(self, history: Sequence[float], *, steps: int, step_seconds: float,
                 start: Sequence[float] = ()) -> predict.Forecast:
        # `start` is not part of the key: every run of the sweep reaches an interval from the same
        # history, hence the same previous state, and a warm start changes the fit only within the
        # optimiser's tolerance.
        key = (len(history), steps, step_seconds, hash(tuple(history)))
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self.inner.forecast(history, steps=steps, step_seconds=step_seconds,
                                                          start=start)
        return found


# -- static --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class IntervalLoad:
    """The offered load of one interval of the trace, as the static sizings read it."""

    rate_rps: float
    isl: float
    osl: float


def static_replicas(setting: Setting, loads: Sequence[IntervalLoad], *, level: str, factor: float) -> Replicas:
    """A fixed fleet for the trace's peak (or mean) interval load × `factor`, sized as the planner sizes."""
    busy = [load for load in loads if load.rate_rps > 0]
    if not busy:
        return setting.clamp({})
    if level == "peak":
        top = max(busy, key=lambda load: load.rate_rps)
        load = sizing.Load(rate_rps=top.rate_rps * factor, isl=top.isl, osl=top.osl)
    else:
        total = sum(load.rate_rps for load in busy)
        load = sizing.Load(
            rate_rps=total / len(loads) * factor,
            isl=sum(load.rate_rps * load.isl for load in busy) / total,
            osl=sum(load.rate_rps * load.osl for load in busy) / total,
        )
    desired = sizing.size(load, setting.capacity, setting.sla)
    return setting.clamp({"prefill": desired.replicas["prefill"], "decode": desired.replicas["decode"]})


class Static(Base):
    def __init__(self, setting: Setting, loads: Sequence[IntervalLoad], *, level: str, factor: float) -> None:
        self.name = f"static-{level}"
        self.knob = factor
        self.replicas = static_replicas(setting, loads, level=level, factor=factor)

    def initial(self) -> Replicas:
        return dict(self.replicas)

    def decide(self, stats: WindowStats, now: float) -> Replicas:
        return dict(self.replicas)

    def forecast(self) -> float | None:
        return None


# -- HPA -----------------------------------------------------------------------------------------------


class Hpa(Base):
    """Kubernetes' HorizontalPodAutoscaler algorithm, per pool, on a utilisation metric.

    desired = ceil(ready × utilisation / target), unchanged while the ratio is within the 10%
    tolerance; a scale-down takes the highest recommendation of the last 300 s (the default
    stabilisation window), a scale-up applies at once.
    """

    TOLERANCE = 0.1
    DOWN_WINDOW_S = 300.0

    def __init__(self, setting: Setting, *, target: float, initial: Mapping[FleetPool, int]) -> None:
        if not 0 < target <= 1:
            raise ValueError(f"target utilisation must lie in (0, 1], got {target}")
        self.name = "hpa"
        self.knob = target
        self.setting = setting
        self._initial = setting.clamp(initial)
        self._current = dict(self._initial)
        self._recommendations: dict[FleetPool, collections.deque[tuple[float, int]]] = {
            pool: collections.deque() for pool in FLEET_POOLS}

    def initial(self) -> Replicas:
        return dict(self._initial)

    def decide(self, stats: WindowStats, now: float) -> Replicas:
        metrics = {"prefill": stats.prefill_busy, "decode": stats.decode_kv_usage}
        decision: Replicas = {}
        for pool in FLEET_POOLS:
            current = self._current[pool]
            ratio = metrics[pool] / self.knob
            ready = max(stats.ready[pool], 1)
            raw = current if abs(ratio - 1.0) <= self.TOLERANCE else math.ceil(ready * ratio - 1e-9)
            lo, hi = self.setting.bounds[pool]
            raw = min(max(raw, lo), hi)
            window = self._recommendations[pool]
            window.append((now, raw))
            while window and window[0][0] < now - self.DOWN_WINDOW_S:
                window.popleft()
            decision[pool] = raw if raw >= current else max(n for _, n in window)
        self._current = decision
        return dict(decision)

    def forecast(self) -> float | None:
        return None


# -- NVIDIA Dynamo's planners ----------------------------------------------------------------------------


class DynamoV1(Base):
    """Dynamo's earlier throughput-only planner, rebuilt on our capacity model.

    Every interval: corrections from *mean* TTFT and ITL (prefill: observed / lone-request TTFT at the
    observed ISL, used only when it is below 1; decode: observed / expected ITL at the observed load),
    a forecast of the *next* interval only, and replicas = predicted token load / per-replica
    throughput, applied at once (no hold, no step limit). `factor` multiplies the predicted load.
    """

    def __init__(self, setting: Setting, predictor: predict.Predictor, *, factor: float,
                 initial: Mapping[FleetPool, int]) -> None:
        self.name = "dynamo-v1"
        self.knob = factor
        self.setting = setting
        self.predictor = predictor
        self._initial = setting.clamp(initial)
        self._current = dict(self._initial)
        self._rates: list[float] = []
        self._last_forecast: float | None = None

    def initial(self) -> Replicas:
        return dict(self._initial)

    def decide(self, stats: WindowStats, now: float) -> Replicas:
        self._rates.append(stats.rate_rps)
        if not stats.arrivals or stats.isl_mean is None or stats.osl_mean is None:
            return dict(self._current)
        capacity, sla = self.setting.capacity, self.setting.sla
        isl, osl = stats.isl_mean, stats.osl_mean
        forecast = self.predictor.forecast(self._rates, steps=1, step_seconds=self.setting.interval_s)
        rate = max(forecast.mean[0], 0.0) * self.knob
        self._last_forecast = rate
        p_correction = sizing.correction(stats.ttft_mean, capacity.lone_ttft_s(isl).value)
        per_decode = stats.rate_rps / max(stats.ready["decode"], 1)
        expected_itl = capacity.expected_itl_s(isl, osl, per_decode)
        d_correction = sizing.correction(stats.itl_mean, expected_itl if math.isfinite(expected_itl) else None)
        prefill = math.ceil(rate * isl * min(1.0, p_correction) / capacity.prefill_tokens_per_s(isl).value - 1e-9)
        per_replica = capacity.decode_rate_per_replica(isl, osl, sla.itl_ms / 1e3 / max(d_correction, 1e-3))
        most = self.setting.bounds["decode"][1]
        decode = math.ceil(rate / per_replica - 1e-9) if per_replica > 0 else most
        self._current = self.setting.clamp({"prefill": prefill, "decode": decode})
        return dict(self._current)

    def forecast(self) -> float | None:
        return self._last_forecast


class Dynamo(Base):
    """Dynamo's planner as its planner guide and design documents describe it, with both loops on
    (`enable_throughput_scaling` and `enable_load_scaling`), rebuilt on our capacity model.

    - **Throughput loop**, every 180 s (`throughput_adjustment_interval`): forecast the next
      interval's request rate, then replicas = rate / what one engine sustains within the target
      (prefill: prompt throughput at the forecast ISL; decode: the highest rate whose ITL stays
      within target). With the load loop on, this only sets each pool's **floor**.
    - **Load loop**, every 5 s (`load_adjustment_interval`), per pool, from the engines' gauges:
      estimate the next request's TTFT from the queued prompt tokens per worker (decode: the ITL at
      the sequences per worker). All workers above target: one more replica. Scale-down by one
      when the survivors, taking the removed worker's share (× N/(N−1)), would still be within
      target × 0.8 (`load_scaling_down_sensitivity` 80; for prefill the margin applies to the
      queueing part of TTFT only). A pool with replicas still starting is only observed.
    - Result: max(load decision, floor), within bounds.

    Dynamo fits its per-engine latency model online; here both loops read the same capacity model
    every policy gets, so the comparison is about the control loops, not the model. The knob
    multiplies the throughput loop's forecast: Dynamo has no such setting, it stands for the margin a
    user buys by overstating the load (the load loop's targets stay the real SLA, as documented).
    """

    THROUGHPUT_INTERVAL_S = 180.0
    LOAD_INTERVAL_S = 5.0
    DOWN_SENSITIVITY = 0.8

    def __init__(self, setting: Setting, predictor: predict.Predictor, *, factor: float,
                 initial: Mapping[FleetPool, int]) -> None:
        if factor <= 0:
            raise ValueError(f"the load factor must be positive, got {factor}")
        self.name = "dynamo"
        self.knob = factor
        self.reactive_period_s = self.LOAD_INTERVAL_S
        self.setting = setting
        self.predictor = predictor
        self.ttft_s = setting.sla.ttft_ms / 1e3
        self.itl_s = setting.sla.itl_ms / 1e3
        self._current = setting.clamp(initial)
        self._initial = dict(self._current)
        # It takes over a running fleet, as every dynamic policy here does: as if its last throughput
        # tick had asked for the fleet it starts with (a cold floor would let the load loop cut it).
        self.floor: Replicas = dict(self._current)
        self._rates: list[float] = []  # one per throughput interval
        self._pending = (0.0, 0, 0.0, 0.0)  # seconds, arrivals, ISL and OSL token sums since the last tick
        self._isl: float | None = None
        self._osl: float | None = None
        self._last_forecast: float | None = None

    def initial(self) -> Replicas:
        return dict(self._initial)

    def forecast(self) -> float | None:
        return self._last_forecast

    def decide(self, stats: WindowStats, now: float) -> Replicas:
        self._observe(stats)
        if self._pending[0] >= self.THROUGHPUT_INTERVAL_S - 1e-6:
            self._throughput_tick()
        reaction = self.react(stats, now)
        return dict(reaction) if reaction is not None else dict(self._current)

    def react(self, stats: WindowStats, now: float) -> Replicas | None:
        if stats.isl_mean is not None and stats.osl_mean is not None:
            self._isl, self._osl = stats.isl_mean, stats.osl_mean
        wanted = dict(self._current)
        if self._isl is not None and self._osl is not None:
            for pool in FLEET_POOLS:
                if stats.active[pool] != stats.ready[pool]:
                    continue  # scaling in progress: observe only
                step = self._prefill_step(stats) if pool == "prefill" else self._decode_step(stats)
                wanted[pool] = stats.ready[pool] + step if step else wanted[pool]
        decision = self.setting.clamp({pool: max(wanted[pool], self.floor[pool]) for pool in FLEET_POOLS})
        if decision == self._current:
            return None
        self._current = decision
        return dict(decision)

    # -- the throughput loop --------------------------------------------------------------------------

    def _observe(self, stats: WindowStats) -> None:
        seconds, arrivals, isl_sum, osl_sum = self._pending
        n = stats.arrivals
        self._pending = (seconds + (stats.end - stats.start), arrivals + n,
                         isl_sum + n * (stats.isl_mean or 0.0), osl_sum + n * (stats.osl_mean or 0.0))

    def _throughput_tick(self) -> None:
        seconds, arrivals, isl_sum, osl_sum = self._pending
        self._pending = (0.0, 0, 0.0, 0.0)
        self._rates.append(arrivals / seconds)
        if arrivals == 0 or self._isl is None:
            return
        isl, osl = isl_sum / arrivals, osl_sum / arrivals
        forecast = self.predictor.forecast(self._rates, steps=1, step_seconds=self.THROUGHPUT_INTERVAL_S)
        rate = max(forecast.mean[0], 0.0) * self.knob
        self._last_forecast = rate
        capacity = self.setting.capacity
        per_prefill = capacity.prefill_tokens_per_s(isl).value / isl
        per_decode = capacity.decode_rate_per_replica(isl, osl, self.itl_s)
        most = {pool: hi for pool, (_, hi) in self.setting.bounds.items()}
        self.floor = self.setting.clamp({
            "prefill": math.ceil(rate / per_prefill - 1e-9) if per_prefill > 0 else most["prefill"],
            "decode": math.ceil(rate / per_decode - 1e-9) if per_decode > 0 else most["decode"],
        })

    # -- the load loop --------------------------------------------------------------------------------

    def _prefill_step(self, stats: WindowStats) -> int:
        """+1, −1 or 0 prefill replicas from the prompt tokens queued per worker."""
        workers = stats.ready["prefill"]
        if workers == 0 or self._isl is None:
            return 0
        capacity = self.setting.capacity
        own = capacity.lone_ttft_s(self._isl).value  # the next prompt's own compute, queue empty
        tokens_per_s = capacity.prefill_tokens_per_s(self._isl).value
        queued = stats.prefill_queued_tokens / workers
        if own + queued / tokens_per_s > self.ttft_s:
            return 1
        budget = (self.ttft_s - own) * self.DOWN_SENSITIVITY
        if workers > 1 and budget > 0 and queued * workers / (workers - 1) / tokens_per_s < budget:
            return -1
        return 0

    def _decode_step(self, stats: WindowStats) -> int:
        """+1, −1 or 0 decode replicas from the sequences per worker (running and waiting)."""
        workers = stats.ready["decode"]
        if workers == 0 or self._isl is None or self._osl is None:
            return 0
        capacity = self.setting.capacity
        context = self._isl + self._osl / 2
        sequences = (stats.decode_running + stats.decode_waiting) / workers
        if capacity.itl_s(sequences, context).value > self.itl_s:
            return 1
        if workers > 1:
            survivors = workers / (workers - 1)
            # The survivors must hold the removed worker's KV too; sequences already waiting mean a full cache.
            fits = stats.decode_waiting == 0 and stats.decode_kv_usage * survivors < 1.0
            if fits and capacity.itl_s(sequences * survivors, context).value < self.itl_s * self.DOWN_SENSITIVITY:
                return -1
        return 0


# -- fleetpilot's planner --------------------------------------------------------------------------------


class Fleetpilot(Base):
    """The planner itself: `step.step` every interval and, between intervals, every fast-path tick, the
    step the live planner takes. `reactive=False` runs the predictive loop alone (the comparison the
    report makes); the policy is then named `fleetpilot-<predictor>-predictive`."""

    def __init__(self, setting: Setting, predictor: predict.Predictor, *, predictor_name: str, risk: float,
                 initial: Mapping[FleetPool, int], hold_s: float | None = None, reactive: bool = True,
                 length_mix: bool = True) -> None:
        self.name = (f"fleetpilot-{predictor_name}" + ("" if reactive else "-predictive")
                     + ("" if length_mix else "-mean"))
        self.knob = risk
        self.predictor = predictor
        self.setting = setting
        plan = core.GraphPlanConfig(
            mode="sla", sla=setting.sla, predictor=predictor_name, interval_s=setting.interval_s,
            bounds={pool: api.ScalingBounds.model_validate({"min": lo, "max": hi})
                    for pool, (lo, hi) in setting.bounds.items()},
            gpus_per_replica=dict.fromkeys(FLEET_POOLS, setting.gpus_per_replica),
            startup_s=setting.startup_s, hold_s=hold_s if hold_s is not None else 5 * setting.interval_s,
            risk=risk, length_mix=length_mix, decode_batch_cap=setting.decode_batch_cap,
            reactive_period_s=5.0 if reactive else None,
        )
        self.config = step.StepConfig(plan=plan, capacity=setting.capacity, graph="graph")
        self.reactive_period_s = plan.reactive_period_s
        self._initial = setting.clamp(initial)
        self._current: dict[sizing.Pool, int] = dict(self._initial.items())
        # The fast path's floor is the initial fleet until the first plan; the frontends' counter starts at 0.
        self.state = step.GraphState(floor=dict(self._initial.items()) if reactive else None,
                                     arrivals=step.Arrivals(counted=0.0, at=0.0))
        self.budget: budget.BudgetView | None = None  # the shared budget as the driver reads it, if any
        self.last_decision: step.Decision | None = None
        self.reactions = 0  # fast-path steps that added replicas
        self._counted = 0.0  # the requests the fleet received up to the last reading (the frontends' counter)
        self._counted_at = 0.0
        self._interval_counted = 0.0  # ... up to the last interval's end

    @property
    def memory(self) -> core.GraphMemory:
        return self.state.memory

    @property
    def last_plan(self) -> core.Plan | None:
        return self.last_decision.plan if self.last_decision is not None else None

    def initial(self) -> Replicas:
        return dict(self._initial)

    def _fleet(self, stats: WindowStats) -> step.Fleet:
        return step.Fleet(current=dict(self._current), ready=dict(stats.ready.items()))

    def decide(self, stats: WindowStats, now: float) -> Replicas:
        observation = core.Observation(
            time=now, rate_rps=stats.rate_rps, isl=stats.isl_mean, osl=stats.osl_mean,
            ttft_s=stats.ttft_p, itl_s=stats.itl_p, prefill_s=stats.prefill_p, prefill_busy=stats.prefill_busy,
            itl_mean_s=stats.itl_mean, burst_rate_rps=stats.burst_rate_p,
            decode_running=stats.decode_running, decode_waiting=stats.decode_waiting,
            isl_histogram=stats.isl_histogram, osl_histogram=stats.osl_histogram,
        )
        # The frontends' counter at the interval's end: the interval's arrivals after its last fast-path tick.
        self._interval_counted += stats.arrivals
        self._counted, self._counted_at = self._interval_counted, stats.end
        reading = step.IntervalReading(observation=observation, fleet=self._fleet(stats), budget=self.budget,
                                       started=self._counted, predictor=self.predictor)
        decision, self.state = step.step(self.config, self.state, reading, now=now)
        self.last_decision = decision
        chosen: Replicas = {pool: decision.replicas[pool] for pool in FLEET_POOLS}
        self._current = dict(chosen.items())
        return chosen

    def react(self, stats: WindowStats, now: float) -> Replicas | None:
        if stats.end > self._counted_at + 1e-9:  # a fluid step's ticks share one window: counted once
            self._counted += stats.arrivals
            self._counted_at = stats.end
        reading = step.QueueReading(
            fleet=step.Fleet(current=dict(stats.active.items()), ready=dict(stats.ready.items())),
            decode_running=stats.decode_running, decode_waiting=stats.decode_waiting,
            prefill_queued_tokens=stats.prefill_queued_tokens, started=self._counted, isl=stats.isl_mean,
            osl=stats.osl_mean, budget=self.budget)
        decision, self.state = step.step(self.config, self.state, reading, now=now)
        if decision.kind != "fast-path":
            return None
        self.reactions += 1
        chosen: Replicas = {pool: decision.replicas[pool] for pool in FLEET_POOLS}
        self._current = dict(chosen.items())
        return chosen

    def forecast(self) -> float | None:
        plan = self.last_plan
        return plan.predicted.rate_rps if plan is not None and plan.predicted is not None else None

    # A shared GPU budget (`driver.run_shared`): the driver reads the ledger into a view before each
    # interval, and records the decision's claim after it; the grant is the step's.

    def min_gpus(self) -> int:
        return core.min_gpus(self.config.plan)

    def gpus(self) -> int:
        """The GPUs the pools are asked to run now: what the other graphs see this one use."""
        return sum(self._current.values()) * self.setting.gpus_per_replica

    def claim(self) -> budget.BudgetClaim | None:
        """The last decision's claim on the shared budget (None: no budget, or nothing new to claim)."""
        return self.last_decision.claim if self.last_decision is not None else None

    def granted(self) -> int | None:
        """The GPUs the last plan was granted."""
        return self.state.granted


# -- the oracle ------------------------------------------------------------------------------------------


def lookahead_targets(needs: Sequence[Mapping[FleetPool, int]], *, interval_s: float, startup_s: float,
                      ) -> list[Replicas]:
    """What to ask for at the start of each interval so that window k has `needs[k]` ready in time.

    A replica asked for now serves from `startup_s` on, so each decision covers every window until the
    next decision's replicas can be ready: the highest need over the next ceil(startup / interval)
    windows, this one included.
    """
    ahead = math.ceil(startup_s / interval_s)
    targets: list[Replicas] = []
    for k in range(len(needs)):
        span = needs[k:k + ahead + 1]
        targets.append({pool: max(need[pool] for need in span) for pool in FLEET_POOLS})
    return targets


class Oracle(Base):
    """Perfect foresight: per-window needs (computed from the trace itself), asked for ahead of time.

    Its knob is the share of each window's requests the needs were sized to serve within the SLA
    (`driver.request_needs`): from cheap to safe like everyone else's, and by construction the least
    GPUs for that attainment in every window.
    """

    def __init__(self, setting: Setting, needs: Sequence[Mapping[FleetPool, int]], *, knob: float) -> None:
        self.name = "oracle"
        self.knob = knob
        self.setting = setting
        self.targets = lookahead_targets(needs, interval_s=setting.interval_s, startup_s=setting.startup_s)

    def initial(self) -> Replicas:
        return self._at(0)

    def decide(self, stats: WindowStats, now: float) -> Replicas:
        return self._at(round(now / self.setting.interval_s))

    def _at(self, k: int) -> Replicas:
        if not self.targets:
            return self.setting.clamp({})
        return self.setting.clamp(self.targets[min(k, len(self.targets) - 1)])

    def forecast(self) -> float | None:
        return None


# -- a recorded fleet, replayed --------------------------------------------------------------------------


class Replay(Base):
    """The fleet another run had, change by change: the same decisions (and fast-loop reactions) on
    another fleet model, so that two models are compared on one fleet (the fluid model against the
    per-request simulator). `changes` are (time, targets) in time order, the first at 0; a run whose
    changes fall between intervals is replayed with a fast loop of `period_s`."""

    def __init__(self, name: str, knob: float, changes: Sequence[tuple[float, Mapping[FleetPool, int]]], *,
                 period_s: float | None = None) -> None:
        if not changes:
            raise ValueError("a replay needs the run's initial targets at least")
        self.name, self.knob, self.reactive_period_s = name, knob, period_s
        self.times = [t for t, _ in changes]
        self.targets = [dict(targets) for _, targets in changes]
        self._current = self._at(0.0)

    def initial(self) -> Replicas:
        return self._at(0.0)

    def decide(self, stats: WindowStats, now: float) -> Replicas:
        self._current = self._at(now)
        return dict(self._current)

    def react(self, stats: WindowStats, now: float) -> Replicas | None:
        targets = self._at(now)
        if targets == self._current:
            return None
        self._current = targets
        return dict(targets)

    def _at(self, now: float) -> Replicas:
        k = bisect.bisect_right(self.times, now + 1e-9) - 1
        return {pool: int(self.targets[max(k, 0)][pool]) for pool in FLEET_POOLS}
