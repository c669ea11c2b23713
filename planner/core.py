"""The planner core: one interval of one graph, from an observation to the replicas to run.

Steps 2-4 of observe → predict → size → constrain → actuate, as one pure function of plain data:
the live loop (Prometheus + Kubernetes) and the replay driver (the fleet simulator) both call
`plan_interval`, so every claim about the planner can be backtested. The graph's memory (its load
history and scale-down timers) is plain data handed in and returned, never hidden state.

Forecast horizon: a replica asked for now serves only after `startup_s`, so the planner sizes for
the highest load forecast over the intervals until then, not just the next one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity as capacities
from fleetpilot.planner import predict, sizing

HISTORY_LIMIT = 14 * 24 * 6  # two weeks of 10-minute intervals is all any predictor looks at


@dataclasses.dataclass(frozen=True)
class Observation:
    """One interval of one graph, as the frontend measured it."""

    time: float
    rate_rps: float | None = None
    isl: float | None = None
    osl: float | None = None
    ttft_s: float | None = None
    itl_s: float | None = None
    error: str | None = None

    @property
    def complete(self) -> bool:
        """Enough to plan from: a rate, and lengths whenever there is traffic."""
        if self.error is not None or self.rate_rps is None:
            return False
        return self.rate_rps == 0 or (self.isl is not None and self.osl is not None)


@dataclasses.dataclass(frozen=True)
class GraphPlanConfig:
    """What the planner needs to know about a graph, read from its spec."""

    mode: str
    sla: api.SlaTarget
    predictor: str
    interval_s: float
    bounds: Mapping[sizing.Pool, api.ScalingBounds]
    gpus_per_replica: Mapping[sizing.Pool, int]
    gpu_budget: int | None = None
    startup_s: float = 120.0
    hold_s: float = 300.0
    max_step_down: int = 1
    headroom: float = 0.1

    @property
    def disaggregated(self) -> bool:
        return "aggregated" not in self.bounds

    @property
    def horizon_steps(self) -> int:
        return max(1, math.ceil(self.startup_s / self.interval_s))


def config_from_spec(spec: api.DynamoGraphSpec, *, startup_s: float = 120.0, hold_s: float | None = None,
                     ) -> GraphPlanConfig:
    planner = spec.planner
    if planner.sla is None:
        raise ValueError("spec.planner.sla is required when the planner is on")
    workers = spec.components.workers()
    return GraphPlanConfig(
        mode=planner.mode,
        sla=planner.sla,
        predictor=planner.predictor,
        interval_s=float(planner.interval_seconds),
        bounds={pool: worker.scaling for pool, worker in workers.items()},
        gpus_per_replica={pool: worker.gpus for pool, worker in workers.items()},
        gpu_budget=planner.gpu_budget,
        startup_s=startup_s,
        hold_s=hold_s if hold_s is not None else 5 * planner.interval_seconds,
    )


@dataclasses.dataclass(frozen=True)
class GraphMemory:
    """What the planner carries from one interval to the next for one graph."""

    rates: tuple[float, ...] = ()
    isls: tuple[float, ...] = ()
    osls: tuple[float, ...] = ()
    scale_down: sizing.ScaleDownState = dataclasses.field(default_factory=sizing.ScaleDownState)
    forecast_for_now: float | None = None  # last interval's forecast of this interval's rate


@dataclasses.dataclass(frozen=True)
class Plan:
    """The decision for one interval and everything that explains it."""

    replicas: Mapping[sizing.Pool, int]
    reasons: list[str]
    data_ok: bool
    observed: Observation
    predicted: sizing.Load | None = None
    corrections: sizing.Corrections = dataclasses.field(default_factory=sizing.Corrections)
    forecast_error: float | None = None  # |forecast - observed| / observed, for the previous forecast
    predictor: str = ""
    wanted_gpus: int | None = None  # what the decision would use with no budget: its claim on a shared one

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


def _append(series: tuple[float, ...], value: float) -> tuple[float, ...]:
    return (*series, value)[-HISTORY_LIMIT:]


def _recent_mean(series: tuple[float, ...], k: int = 6) -> float:
    tail = [v for v in series[-k:] if v > 0]
    return sum(tail) / len(tail) if tail else 0.0


def _corrections(
    config: GraphPlanConfig, capacity: capacities.CapacityModel, observation: Observation,
    serving: Mapping[sizing.Pool, int],
) -> sizing.Corrections:
    """Observed over expected latency at the load each serving (ready) replica actually carried."""
    if not observation.rate_rps or observation.isl is None or observation.osl is None:
        return sizing.Corrections()
    prefill_pool: sizing.Pool = "prefill" if config.disaggregated else "aggregated"
    decode_pool: sizing.Pool = "decode" if config.disaggregated else "aggregated"
    prefill_rate = observation.rate_rps / max(serving.get(prefill_pool, 1), 1)
    decode_rate = observation.rate_rps / max(serving.get(decode_pool, 1), 1)
    expected_ttft = capacity.expected_ttft_s(observation.isl, prefill_rate, percentile=config.sla.percentile)
    expected_itl = capacity.expected_itl_s(observation.isl, observation.osl, decode_rate)
    return sizing.Corrections(
        prefill=sizing.correction(observation.ttft_s, expected_ttft if math.isfinite(expected_ttft) else None),
        decode=sizing.correction(observation.itl_s, expected_itl if math.isfinite(expected_itl) else None),
    )


def min_gpus(config: GraphPlanConfig) -> int:
    return sum(bound.min_replicas * config.gpus_per_replica[pool] for pool, bound in config.bounds.items())


def plan_interval(
    config: GraphPlanConfig,
    observation: Observation,
    memory: GraphMemory,
    *,
    current: Mapping[sizing.Pool, int],
    capacity: capacities.CapacityModel,
    now: float,
    ready: Mapping[sizing.Pool, int] | None = None,
    predictor: predict.Predictor | None = None,
) -> tuple[Plan, GraphMemory]:
    """Predict, size and constrain one graph for one interval (pure).

    `current` is what each pool is asked to run (the DynamoGraphComponents' replicas); `ready`, when
    known, what actually served the observed interval, which is what the latency corrections compare.
    `predictor` replaces the one the config names (the backtest passes one that remembers forecasts
    it has already made for the same history, so a sweep fits each model once).
    """
    if not observation.complete:
        why = observation.error or "incomplete metrics"
        decision = sizing.constrain(
            sizing.Desired(replicas=dict(current), reason="holding"), current=current, bounds=config.bounds,
            gpus_per_replica=config.gpus_per_replica, gpu_budget=config.gpu_budget, state=memory.scale_down,
            now=now, hold_seconds=config.hold_s, max_step_down=config.max_step_down, data_ok=False, data_note=why,
        )
        plan = Plan(replicas=decision.replicas, reasons=decision.reasons, data_ok=False, observed=observation)
        return plan, dataclasses.replace(memory, scale_down=decision.state)

    rate = float(observation.rate_rps or 0.0)
    memory = dataclasses.replace(
        memory,
        rates=_append(memory.rates, rate),
        isls=_append(memory.isls, observation.isl or 0.0),
        osls=_append(memory.osls, observation.osl or 0.0),
    )
    forecast_error = None
    if memory.forecast_for_now is not None and rate > 0:
        forecast_error = abs(memory.forecast_for_now - rate) / rate

    forecaster = predictor if predictor is not None else predict.make_predictor(config.predictor)
    forecast = forecaster.forecast(
        memory.rates, steps=config.horizon_steps, step_seconds=config.interval_s)
    peak_rate = max(max(forecast.mean), 0.0)
    isl, osl = _recent_mean(memory.isls), _recent_mean(memory.osls)
    load = sizing.Load(rate_rps=peak_rate, isl=max(isl, 1.0), osl=max(osl, 1.0))
    corrections = _corrections(config, capacity, observation, ready if ready is not None else current)
    if config.disaggregated:
        desired = sizing.size(load, capacity, config.sla, corrections, headroom=config.headroom)
    else:
        desired = sizing.size_aggregated(load, capacity, config.sla, corrections, headroom=config.headroom)
    def constrained(budget: int | None) -> sizing.Decision:
        return sizing.constrain(
            desired, current=current, bounds=config.bounds, gpus_per_replica=config.gpus_per_replica,
            gpu_budget=budget, state=memory.scale_down, now=now, hold_seconds=config.hold_s,
            max_step_down=config.max_step_down,
        )

    unbudgeted = constrained(None)
    wanted = sum(n * config.gpus_per_replica[pool] for pool, n in unbudgeted.replicas.items())
    decision = unbudgeted if config.gpu_budget is None else constrained(config.gpu_budget)
    used = forecast.predictor + (f" (fell back: {forecast.fallback})" if forecast.fallback else "")
    plan = Plan(
        replicas=decision.replicas, reasons=[desired.reason, *decision.reasons], data_ok=True, observed=observation,
        predicted=load, corrections=corrections, forecast_error=forecast_error, predictor=used, wanted_gpus=wanted,
    )
    next_forecast = forecast.mean[0] if forecast.mean else None
    return plan, dataclasses.replace(memory, scale_down=decision.state, forecast_for_now=next_forecast)
