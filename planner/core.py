"""The planner core: one interval of one graph, from an observation to the replicas to run.

Steps 2-4 of observe → predict → size → constrain → actuate, as one pure function of plain data:
the planning step (planner/step.py) calls `plan_interval` each interval, for the live loop
(Prometheus + Kubernetes) and the replay driver (the fleet simulator) alike, so every claim about the
planner can be backtested. The graph's memory (its load
history and scale-down timers) is plain data handed in and returned, never hidden state.

Forecast horizon: a replica asked for now serves only after `startup_s`, so the planner sizes for
the highest load forecast over the intervals until then, not just the next one.

Risk: the planner sizes for the `risk` quantile of each load it forecasts (request rate, input
tokens/s for prefill, output tokens/s for decode), each calibrated online (`conformal`) against what
the load then was: at risk 0.9 it provisions for the load it expects to be exceeded one interval in
ten, whatever the trace. One predictor fit per interval serves all three: the token loads are the
rate forecast times the recent mean length, and their calibration learns how far lengths move too.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping
from typing import Any

from scipy import stats

from fleetpilot.api import contract
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity as capacities
from fleetpilot.planner import conformal, lengths, predict, reactive, sizing
from fleetpilot.planner import drift as drifts

HISTORY_LIMIT = 14 * 24 * 6  # two weeks of 10-minute intervals is all any predictor looks at
# The profile's corrections are the median of the last intervals' estimates: one interval's latencies
# say as much about a transient (a burst, a backlog draining) as about the profile, which the fast
# path answers; a correction learns what persists.
CALIBRATION_INTERVALS = 10
# Prefill busy shares above this say the replicas were saturated (a backlog), not how fast they work.
_SATURATED = 0.9
# Below this modelled utilisation the busy share is too small to measure a speed from.
_TOO_IDLE = 0.05
# The loads the planner forecasts and calibrates: what each is in requests, tokens in or tokens out.
LOADS = ("requests", "input_tokens", "output_tokens")
# The length mix and mean lengths sized for: the last this many planning intervals' requests (`recent_length`,
# `recent_mix`).
MIX_INTERVALS = 6
DEFAULT_RISK = 0.9
# A forecast is scored for calibration only once it was made from this many intervals. Scores are errors
# in units of the model's spread, and a spread estimated from three points is no unit: a burst after a
# few quiet minutes scores many of them, and once the spread has grown to what the series really does, that
# score, still in the window, sizes for several times the peak (ADR 0016). Until then the model's own
# quantile stands (`conformal.quantile`).
SCORED_FROM_INTERVALS = conformal.MIN_SCORES
# A pool above what this quantile of the load needs scales down to it at once, without the hold
# (`sizing.constrain`): the load is exceeded one interval in a hundred.
CAUTIOUS_RISK = 0.99
# ... or, planning at a risk near it or above, a quantile this many times rarer than the risk's own.
# Fitted, not derived: ADR 0024.
CAUTIOUS_RARER = 10.0


def cautious_risk(risk: float) -> float | None:
    """The quantile that lets a scale-down skip the hold: rarer than the planning risk's, or it would be
    the very load the plan sized for, and at risk 0.99 and above every scale-down would skip the hold
    (ADR 0024).

    None where that level is rarer than the scores a calibration keeps can resolve (planning above risk
    0.99): read as the largest score kept, it would claim a safety nothing has shown, and a load beyond
    every kept score then meets the cut fleet (ADR 0024). Every scale-down then waits for the hold.
    """
    level = max(CAUTIOUS_RISK, 1.0 - (1.0 - risk) / CAUTIOUS_RARER)
    return level if conformal.resolvable(level) else None


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
    # TTFT's prefill part at the same percentile: arrival until the prefill worker handed the KV cache
    # over (queueing and compute). A decode backlog delays the first token too; only this part may
    # blame prefill. None (an aggregated graph, or a frontend that does not say): TTFT is blamed whole.
    prefill_s: float | None = None
    # For calibrating the profile: the share of time the serving prefill replicas spent computing, and
    # the mean (not percentile) ITL. None where the metrics do not say.
    prefill_busy: float | None = None
    itl_mean_s: float | None = None
    # The arrival rate the SLA percentile's request saw over the trailing `contract.BURST_WINDOW_S`
    # (request-weighted): how bursty the interval was at the time scale prefill must serve.
    burst_rate_rps: float | None = None
    # Sequences the decode pool was running, and prefilled requests waiting for a decode slot, at the
    # interval's end (graph totals). Waiting while every replica runs its fill says how many sequences
    # the fleet's engines run at most, which the profile may not know. None where not measured.
    decode_running: float | None = None
    decode_waiting: float | None = None
    # The interval's prompt and output lengths as the frontend's histograms have them (None: not
    # measured); the planner sizes for their mix, not only their means.
    isl_histogram: lengths.Histogram | None = None
    osl_histogram: lengths.Histogram | None = None

    @property
    def complete(self) -> bool:
        """Enough to plan from: a rate, and lengths whenever there is traffic."""
        if self.error is not None or self.rate_rps is None:
            return False
        return self.rate_rps == 0 or (self.isl is not None and self.osl is not None)


# Values no fleet produces. A metric beyond them (or negative, or not a number) is a broken exporter or
# query, not load: the planner holds rather than size for it (a rate of 10³⁰⁰ would ask every pool for
# its maximum, or overflow the forecast).
MAX_RATE_RPS = 1e6
MAX_TOKENS = 1e7
MAX_SECONDS = 1e5
_REQUIRED = {"rate_rps": MAX_RATE_RPS, "isl": MAX_TOKENS, "osl": MAX_TOKENS}
_OPTIONAL = {"ttft_s": MAX_SECONDS, "itl_s": MAX_SECONDS, "prefill_s": MAX_SECONDS, "itl_mean_s": MAX_SECONDS,
             "prefill_busy": 1.0, "burst_rate_rps": MAX_RATE_RPS, "decode_running": MAX_RATE_RPS,
             "decode_waiting": MAX_RATE_RPS}


def _sane(value: float | None, most: float) -> bool:
    return value is None or (isinstance(value, int | float) and math.isfinite(value) and 0 <= value <= most)


def plausible(observation: Observation) -> Observation:
    """`observation` with what no fleet produces dropped (pure): an implausible rate or mean length makes it
    an error (the planner holds and says which); an implausible optional reading becomes unknown."""
    wrong = [f"{name}={getattr(observation, name)!r}" for name, most in _REQUIRED.items()
             if not _sane(getattr(observation, name), most)]
    cleared: dict[str, Any] = {name: None for name, most in _OPTIONAL.items()
                               if not _sane(getattr(observation, name), most)}
    if wrong and observation.error is None:
        cleared["error"] = f"implausible metrics ({', '.join(wrong)}): holding"
    return dataclasses.replace(observation, **cleared) if cleared else observation


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
    max_step_down: int | None = None  # None: down to the highest target of the hold, as the HPA does
    risk: float = DEFAULT_RISK  # the forecast quantile to size for (spec.planner.risk)
    reactive_period_s: float | None = 5.0  # how often the fast path runs between intervals; None: never
    # Size for the length mix the frontend's histograms give (False: every request at the mean lengths,
    # as Dynamo's planner does; the backtest compares the two).
    length_mix: bool = True
    # spec.planner.profile: size with the speed factors and latency offsets learned from the fleet (False:
    # from the profile as written; they are still learned, and drift still reported), and how far the
    # fleet may differ from its profile before ProfileDrift says so.
    auto_correct: bool = True
    drift_threshold: float = drifts.DEFAULT_THRESHOLD
    # The decode engine's running-batch cap as the graph's engine flags set it (`decode_batch_cap`):
    # sizing knows the wall from the first interval, not only once an overload has shown it
    # (`learn_max_running`). None: not stated, learned from the fleet alone.
    decode_batch_cap: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.risk < 1:
            raise ValueError(f"risk must lie in (0, 1), got {self.risk}")

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
        gpus_per_replica={pool: worker.gpus_per_replica() for pool, worker in workers.items()},  # every pod's
        gpu_budget=planner.gpu_budget,
        startup_s=startup_s,
        hold_s=hold_s if hold_s is not None else 5 * planner.interval_seconds,
        risk=planner.risk,
        reactive_period_s=float(planner.fast_path_seconds) or None,
        auto_correct=planner.profile.auto_correct if planner.profile else True,
        drift_threshold=planner.profile.drift_threshold if planner.profile else drifts.DEFAULT_THRESHOLD,
        decode_batch_cap=spec.decode_batch_cap(),
    )


@dataclasses.dataclass(frozen=True)
class PendingForecast:
    """A rate forecast made at an earlier interval, kept until its steps have been realised, with the
    lengths that turned it into token loads."""

    rate_mean: tuple[float, ...]
    rate_spread: tuple[float, ...]
    isl: float
    osl: float
    level: float = 0.0  # the rate's recent level (`recent_mean`): what the spread floor is a share of
    scored: bool = True  # made from enough history for its errors to calibrate later ones

    def load(self, name: str, step: int) -> tuple[float, float]:
        """(mean, spread) of load `name` at `step` (0-based)."""
        length = load_length(name, self.isl, self.osl)
        return self.rate_mean[step] * length, self.rate_spread[step] * length

    def floor(self, name: str) -> float:
        return conformal.SPREAD_FLOOR_SHARE * self.level * load_length(name, self.isl, self.osl)


def load_length(name: str, isl: float, osl: float) -> float:
    """What one request counts for in load `name` (one of LOADS): 1, its prompt or its output tokens."""
    return {"requests": 1.0, "input_tokens": isl, "output_tokens": osl}[name]


@dataclasses.dataclass(frozen=True)
class IntervalLengths:
    """One planned interval's requests as the lengths are sized from: when it ended (the planner's
    clock), its rate, its mean prompt and output lengths, and their histograms where measured."""

    time: float
    rate_rps: float
    isl: float
    osl: float
    isl_histogram: lengths.Histogram | None = None
    osl_histogram: lengths.Histogram | None = None


@dataclasses.dataclass(frozen=True)
class GraphMemory:
    """What the planner carries from one interval to the next for one graph."""

    rates: tuple[float, ...] = ()
    # The last MIX_INTERVALS intervals that had traffic, with when they ended: the lengths sized for.
    lengths: tuple[IntervalLengths, ...] = ()
    scale_down: sizing.ScaleDownState = dataclasses.field(default_factory=sizing.ScaleDownState)
    forecast_for_now: float | None = None  # last interval's forecast of this interval's rate
    forecast_state: tuple[float, ...] = ()  # the last rate forecast's fitted parameters: the next fit's start
    calibration: tuple[sizing.Corrections, ...] = ()  # the last intervals' estimates (NaN: not measured)
    bursts: tuple[float, ...] = ()  # the last intervals' `burstiness` (≥ 1)
    decode_max_running: float | None = None  # learned by `learn_max_running`; None: not seen yet
    pending: tuple[PendingForecast, ...] = ()  # the last horizon's forecasts, newest last
    forecast_calibration: Mapping[str, conformal.Calibration] = dataclasses.field(default_factory=dict)  # per load
    drift: tuple[drifts.Sample, ...] = ()  # the last intervals' TTFT and ITL against the profile
    # When the silence the last intervals were held through began (`implausible_lull`; None: none):
    # the next interval with traffic holds part of the outage too, so its mean understates the load.
    silent_since: float | None = None

    def coverage(self) -> dict[str, dict[float, float]]:
        """Per load, per tracked quantile, the recent share of outcomes the calibrated quantile covered."""
        return {name: dict(conformal.coverages(cal)) for name, cal in self.forecast_calibration.items()}


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
    coverage: Mapping[str, Mapping[float, float]] = dataclasses.field(default_factory=dict)  # GraphMemory.coverage
    predictor: str = ""
    wanted_gpus: int | None = None  # what the decision would use with no budget: its claim on a shared one
    binding: Mapping[sizing.Pool, sizing.Binding] = dataclasses.field(default_factory=dict)  # what set each pool
    # What the graph asks that the planner cannot give, as (reason, message): `SLAInfeasible` (a target
    # below the profile's floor), `BudgetBelowMinimum` (a GPU budget under the pools' minimums). None:
    # not known this interval (holding without data: the SLA was not sized).
    warnings: tuple[tuple[str, str], ...] | None = None
    drift: drifts.Verdict | None = None  # how far the fleet is from its profile (None: holding, not judged)
    outage: bool = False  # held through a silence or trickle its history makes implausible (`implausible_lull`)

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


def budget_warning(config: GraphPlanConfig) -> tuple[str, str] | None:
    """`BudgetBelowMinimum` when the graph's GPU budget is less than its pools' minimums need (pure)."""
    need = min_gpus(config)
    if config.gpu_budget is None or need <= config.gpu_budget:
        return None
    return ("BudgetBelowMinimum", (f"GPU budget {config.gpu_budget} is below the {need} GPUs the pools'"
                                   " scaling.min need: the planner keeps the minimums, over budget; raise the budget"
                                   " or lower scaling.min"))


def warnings_of(config: GraphPlanConfig, desired: sizing.Desired | None) -> tuple[tuple[str, str], ...]:
    """What the plan cannot give the graph: an infeasible SLA (from sizing), a budget below the minimums."""
    found = []
    if desired is not None and desired.infeasible:
        found.append(("SLAInfeasible", "; ".join(desired.infeasible.values())))
    budget = budget_warning(config)
    if budget is not None:
        found.append(budget)
    return tuple(found)


def warm_memory(rates: tuple[float, ...], isls: tuple[float, ...], osls: tuple[float, ...], *, now: float,
                interval_s: float) -> GraphMemory:
    """A graph's memory from history kept elsewhere (Prometheus), so that a restarted planner, or one
    that just became leader, forecasts from the load it would have seen had it been running. The
    history is taken as the intervals that ended before `now`, one `interval_s` apart."""
    if not len(rates) == len(isls) == len(osls):
        raise ValueError("rates, isls and osls must be as long as each other")
    kept = [k for k in range(len(rates))
            if _sane(rates[k], MAX_RATE_RPS) and _sane(isls[k], MAX_TOKENS) and _sane(osls[k], MAX_TOKENS)]
    rates, isls, osls = (tuple(series[k] for k in kept) for series in (rates, isls, osls))
    seen: tuple[IntervalLengths, ...] = ()
    for k, (rate, isl, osl) in enumerate(zip(rates, isls, osls, strict=True)):
        seen = with_lengths(seen, IntervalLengths(now - (len(rates) - k) * interval_s, rate, isl, osl))
    return GraphMemory(rates=rates[-HISTORY_LIMIT:], lengths=seen)


# What the planner has learned of a graph's fleet, as `status.planner.learned` carries it across a
# restart or a leader change: the status field and the Corrections field (or the memory's) behind it.
_LEARNED_CORRECTIONS = {"prefillSpeed": "prefill", "decodeSpeed": "decode", "prefillOffsetSeconds": "prefill_offset_s",
                        "decodeOffsetSeconds": "decode_offset_s", "prefillQueueSharing": "prefill_pooling"}


def learned(memory: GraphMemory) -> dict[str, float]:
    """What the planner has learned of the graph's fleet (pure): the calibrated corrections, the burst
    factor and decode's running cap, each only where measured, as plain numbers for the graph's status."""
    values = {key: getattr(calibrated(memory.calibration), field) for key, field in _LEARNED_CORRECTIONS.items()}
    if memory.bursts:
        values["burst"] = _median(memory.bursts, 1.0)
    if memory.decode_max_running is not None:
        values["decodeMaxRunning"] = memory.decode_max_running
    return {key: round(value, 4) for key, value in values.items() if math.isfinite(value)}


def remember(memory: GraphMemory, known: Mapping[str, Any]) -> GraphMemory:
    """`memory` seeded with what an earlier planner learned (`learned`, read back from the graph's
    status): as if its last CALIBRATION_INTERVALS intervals had each measured it, so the first decision
    after a restart is the one the earlier planner would have made, and new intervals move it as they
    would have. Values that are not finite numbers are ignored (a hand edit, an older planner)."""
    def number(key: str) -> float:
        value = known.get(key)
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else math.nan

    estimate = sizing.Corrections(**{field: number(key) for key, field in _LEARNED_CORRECTIONS.items()})
    burst, cap = number("burst"), number("decodeMaxRunning")
    return dataclasses.replace(
        memory,
        calibration=(estimate,) * CALIBRATION_INTERVALS,
        bursts=(burst,) * CALIBRATION_INTERVALS if burst >= 1.0 else memory.bursts,
        decode_max_running=cap if cap > 0 else memory.decode_max_running,
    )


def _append(series: tuple[float, ...], value: float) -> tuple[float, ...]:
    return (*series, value)[-HISTORY_LIMIT:]


def recent_mean(series: tuple[float, ...], k: int = 6) -> float:
    """The mean of the last `k` intervals, leaving out those that had none (the rate's recent level)."""
    tail = [v for v in series[-k:] if v > 0]
    return sum(tail) / len(tail) if tail else 0.0


def with_lengths(seen: tuple[IntervalLengths, ...], interval: IntervalLengths) -> tuple[IntervalLengths, ...]:
    """`seen` with `interval` added if it had traffic (an idle interval's lengths are unknown, not 0)."""
    if interval.rate_rps <= 0 or interval.isl <= 0 or interval.osl <= 0:
        return seen
    return (*seen, interval)[-MIX_INTERVALS:]


def recent_lengths(seen: tuple[IntervalLengths, ...], *, now: float, interval_s: float) -> tuple[IntervalLengths, ...]:
    """The intervals the lengths are sized from: those of `seen` that ended within the last
    MIX_INTERVALS intervals before `now`, or, where none did, all of `seen` (the latest known).

    The window is time, not traffic: after a pause (idle intervals, or a silence held as an outage),
    the first interval of new traffic is the whole window, and lengths from before the pause are
    forgotten at once. Only with no request in the window at all do older lengths stand, however old:
    nothing newer is known.
    """
    fresh = tuple(x for x in seen if x.time > now - MIX_INTERVALS * interval_s - 1e-9)
    return fresh or seen


def recent_length(seen: tuple[IntervalLengths, ...], name: str) -> float:
    """The mean prompt (`name` "isl") or output ("osl") length of the requests of `seen`, each interval
    weighted by its rate, so that it is the mean of their requests, as their pooled histograms are;
    0 when `seen` is empty."""
    weight = sum(x.rate_rps for x in seen)
    return sum(getattr(x, name) * x.rate_rps for x in seen) / weight if weight > 0 else 0.0


def implausible_lull(rate_rps: float, rates: tuple[float, ...], interval_s: float) -> float | None:
    """The arrivals the quietest remembered interval makes one interval expect, where this interval had
    none, or a trickle under LULL_SHARE of that quietest rate, and Poisson arrivals at even that level
    would be silent less than once in a million intervals (pure); None where such quiet is ordinary for
    this graph (no history, or one that has been this quiet).

    Traffic that stops dead and then returns at its former level is an outage upstream or a gap in the
    data, not a trough: a fleet scaled down through it meets the returning load with a fraction of what
    it needs (ADR 0029). Judged against the quietest interval, not the mean: on/off traffic (a few
    requests a minute) has silent minutes, so its history has intervals near zero and its silences are
    planned as ever; so does a decline to zero, which passes through quiet intervals first. Nor is a
    short history evidence: it takes `_SILENCE_HISTORY` intervals without a quiet one (on/off traffic
    can open with a busy interval before its first silent one).

    An outage upstream seldom silences a graph whole: retries, health checks and a region that still
    reaches it leave a trickle. A fall to under LULL_SHARE of the quietest interval remembered, within
    one interval, is the same event: demand that declines passes through its quieter levels first.
    """
    if len(rates) < _SILENCE_HISTORY:
        return None
    quietest = min(rates)
    expected = quietest * interval_s
    return expected if expected > _SILENCE_EXPECTED and rate_rps <= LULL_SHARE * quietest else None


# Expected arrivals above which an empty interval is an outage: P(no Poisson arrival) = e^-13.8 = 1e-6.
_SILENCE_EXPECTED = -math.log(1e-6)
# A rate at or under this share of the quietest interval remembered is held as an outage, as silence is.
# Fitted, not derived: ADR 0029.
LULL_SHARE = 0.1
# Intervals of history before a silence is judged: traffic silent one interval in five (on/off) shows a
# quiet one within 30 but for one time in a thousand.
_SILENCE_HISTORY = 30
# How long a silence is held as an outage: then it is the graph's traffic (a graph nobody calls any more
# gives its replicas back; one that may scale to zero sleeps after spec.planner.idleSeconds anyway).
OUTAGE_HOLD_S = 6 * 3600.0


def recent_mix(seen: tuple[IntervalLengths, ...], name: str, mean: float) -> lengths.LengthMix | None:
    """The length mix of `seen`'s `name` ("isl" or "osl") histograms pooled, scaled to `mean` (the mean
    the load is counted in, so that the mix changes the shape the planner sizes for, not the load);
    None where none of them measured one (sizing then takes every request at the mean)."""
    histograms = (getattr(x, f"{name}_histogram") for x in seen)
    pooled = lengths.pooled(h for h in histograms if h is not None)
    mix = pooled.mix() if pooled is not None else None
    return lengths.scaled_to_mean(mix, mean) if mix is not None and mean > 0 else None


def _nan_unless(value: float | None) -> float:
    return value if value is not None and math.isfinite(value) else math.nan


def interval_corrections(
    config: GraphPlanConfig, capacity: capacities.CapacityModel, observation: Observation,
    serving: Mapping[sizing.Pool, int], *, burst: float = 1.0,
) -> sizing.Corrections:
    """What one interval says about the profile, at the load each serving (ready) replica carried.

    Speed: prefill from the busy share against the utilisation the profile predicts at that load;
    decode from the mean ITL against the profile's at the sequences each replica held (Little's law).
    Offset: what the latency at the SLA percentile still exceeds the profile's, once slowed by the
    speed factor. NaN wherever the interval cannot say (no traffic, a saturated pool, a metric missing).
    """
    unknown = sizing.Corrections(math.nan, math.nan, math.nan, math.nan)
    if not observation.rate_rps or not observation.isl or not observation.osl:
        return unknown
    isl, osl = observation.isl, observation.osl
    prefill_pool: sizing.Pool = "prefill" if config.disaggregated else "aggregated"
    decode_pool: sizing.Pool = "decode" if config.disaggregated else "aggregated"
    prefill_replicas = max(serving.get(prefill_pool, 1), 1)
    decode_rate = observation.rate_rps / max(serving.get(decode_pool, 1), 1)

    isl_mix = observation.isl_histogram.mix() if config.length_mix and observation.isl_histogram else None
    osl_mix = observation.osl_histogram.mix() if config.length_mix and observation.osl_histogram else None
    modelled_busy = observation.rate_rps / prefill_replicas * capacity.prefill_mean_service_s(isl, mix=isl_mix)
    busy = observation.prefill_busy
    measurable = busy is not None and busy < _SATURATED and modelled_busy >= _TOO_IDLE
    prefill_speed = busy / modelled_busy if measurable and busy is not None else math.nan
    slowdown = prefill_speed if math.isfinite(prefill_speed) else 1.0
    slowdown = sizing.clamp_correction(slowdown)
    # The pool as it served, as sizing sees a pool: every time slowed by the speed factor (the profile
    # offered rate × factor), the rate raised by the interval's bursts. Its percentile TTFT first says
    # how far the replicas share one queue; what the queue does not explain is latency the profile
    # does not model (the offset).
    offered = observation.rate_rps * burst * slowdown
    prefill_part = observation.prefill_s if observation.prefill_s is not None else observation.ttft_s
    pooling = (capacity.pooling_observed(prefill_part / slowdown, offered, prefill_replicas, isl=isl,
                                         percentile=config.sla.percentile, mix=isl_mix)
               if prefill_part is not None and config.disaggregated else math.nan)
    expected_ttft = slowdown * capacity.expected_ttft_pool_s(
        offered, prefill_replicas, isl=isl, percentile=config.sla.percentile, mix=isl_mix,
        pooling=pooling if math.isfinite(pooling) else sizing.POOLING_PRIOR)
    prefill_offset = _nan_unless(prefill_part) - expected_ttft if math.isfinite(expected_ttft) else math.nan

    context = capacities.decode_context(isl, osl_mix, osl)
    if observation.itl_mean_s is not None and observation.itl_mean_s > 0:
        sequences = decode_rate * osl * observation.itl_mean_s  # Little's law, per replica
        modelled_itl = capacity.itl_s(max(sequences, 1.0), context).value
        decode_speed = observation.itl_mean_s / modelled_itl
        expected_itl = sizing.clamp_correction(decode_speed) * modelled_itl
    else:
        decode_speed = math.nan
        expected_itl = capacity.expected_itl_s(isl, osl, decode_rate, context_length=context)
    decode_offset = _nan_unless(observation.itl_s) - expected_itl if math.isfinite(expected_itl) else math.nan
    return sizing.Corrections(prefill_speed, decode_speed, prefill_offset, decode_offset, prefill_pooling=pooling)


def interval_drift(config: GraphPlanConfig, capacity: capacities.CapacityModel, observation: Observation,
                   serving: Mapping[sizing.Pool, int], estimate: sizing.Corrections, *, burst: float = 1.0,
                   ) -> drifts.Sample:
    """What one interval says of the profile's TTFT and ITL (`drift`): ITL from the decode speed the
    interval estimated (`interval_corrections`: mean ITL against the profile's at the sequences held),
    TTFT against the profile's band for the serving prefill pool at the interval's rate and prompt mix."""
    if not observation.rate_rps or not observation.isl or not observation.osl:
        return drifts.Sample()
    prefill_pool: sizing.Pool = "prefill" if config.disaggregated else "aggregated"
    part = observation.prefill_s if config.disaggregated and observation.prefill_s is not None else observation.ttft_s
    isl_mix = observation.isl_histogram.mix() if config.length_mix and observation.isl_histogram else None
    ttft_observed, ttft_predicted = drifts.ttft_sample(
        capacity, observed_s=part, rate_rps=observation.rate_rps * burst, replicas=max(serving.get(prefill_pool, 1), 1),
        isl=observation.isl, percentile=config.sla.percentile, mix=isl_mix)
    itl = observation.itl_mean_s
    itl_predicted = itl / estimate.decode if itl and math.isfinite(estimate.decode) and estimate.decode > 0 else math.nan
    return drifts.Sample(ttft_observed, ttft_predicted, _nan_unless(itl), itl_predicted)


def _median(values: tuple[float, ...] | list[float], default: float) -> float:
    """The median of the finite values, or `default` when there are none."""
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else default


def burstiness(burst_rate_rps: float, rate_rps: float, *, percentile: float) -> float:
    """How much faster than Poisson arrivals at `rate_rps` the percentile's request saw them arrive.

    The burst rate is request-weighted over `contract.BURST_WINDOW_S`; Poisson arrivals at the mean
    rate already show their percentile over such windows above the mean, and the capacity model's
    queue prices that, so only the excess over it is a burst (≥ 1).
    """
    window = contract.BURST_WINDOW_S
    poisson = float(stats.poisson.ppf(percentile / 100.0, rate_rps * window)) / window
    return max(1.0, burst_rate_rps / poisson) if poisson > 0 else 1.0


# Prefilled requests waiting for a decode slot beyond this share of those running: the slots are full.
_SLOTS_FULL = 0.05
# Without any cap a prefilled request still waits a few decode steps for its first token (admission at
# the next step, the KV transfer, the step itself), so a reading of the waiting gauge holds the arrivals
# of about that long. Only a count the hand-off alone would reach less than once in `_HANDOFF_QUANTILE`
# readings is a backlog: at 1.5 requests/s and a 90-ms step an instant reading of 2 is hand-off noise.
_HANDOFF_STEPS = 3.0
_HANDOFF_QUANTILE = 0.999


def in_handoff(rate_rps: float | None, itl_s: float | None) -> float:
    """The most prefilled requests that wait for their first token with no cap at all (pure): the
    `_HANDOFF_QUANTILE` of Poisson arrivals over `_HANDOFF_STEPS` decode steps; 0 when not measured."""
    if rate_rps is None or itl_s is None or rate_rps <= 0 or itl_s <= 0:
        return 0.0
    return float(stats.poisson.ppf(_HANDOFF_QUANTILE, rate_rps * itl_s * _HANDOFF_STEPS))


def learn_max_running(known: float | None, observation: Observation, decode_replicas: int) -> float | None:
    """The most sequences one decode replica runs at once, as far as the fleet has shown (pure).

    Requests waiting for a slot while the replicas run R sequences each: the engines run no more than
    R (a batch cap such as vLLM's max_num_seqs, or a KV cache smaller than profiled), so R it is; but
    not the few any hand-off holds (`in_handoff`), or a snapshot of ordinary arrivals teaches a cap of
    whatever the pool ran at that instant, and decode is scaled for an engine limit that is not there. Without
    waiting, a replica seen running more than the known cap raises it (the cap was a transient). An
    engine property, not a load: it is kept, not averaged away, until the fleet shows otherwise.
    """
    running, waiting = observation.decode_running, observation.decode_waiting
    if running is None or waiting is None or decode_replicas < 1 or running <= 0:
        return known
    per_replica = running / decode_replicas
    if waiting >= 1 and waiting > max(_SLOTS_FULL * running, in_handoff(observation.rate_rps, observation.itl_s)):
        return per_replica
    if known is not None and per_replica > known:
        return per_replica
    return known


def calibrated(estimates: tuple[sizing.Corrections, ...]) -> sizing.Corrections:
    """The corrections to size with: per field, the median of the estimates that measured it."""
    def median(field: str, default: float) -> float:
        return _median([getattr(e, field) for e in estimates], default)
    return sizing.Corrections(median("prefill", 1.0), median("decode", 1.0),
                              median("prefill_offset_s", 0.0), median("decode_offset_s", 0.0),
                              prefill_pooling=median("prefill_pooling", math.nan))


def realise(memory: GraphMemory, *, rate: float, isl: float, osl: float, risk: float) -> GraphMemory:
    """Score the pending forecasts against this interval's loads (pure): each pending forecast made k
    intervals ago meets its step k − 1; the calibration of each load takes every outcome in turn."""
    levels = (*conformal.REPORTED_LEVELS, risk)
    # The scores the rarest quantile the plan reads needs: the cautious one's where there is one.
    cautious = cautious_risk(risk)
    rarest = risk if cautious is None else max(risk, cautious)
    keep = max(conformal.score_window(q) for q in (*levels, rarest))
    calibrations = dict(memory.forecast_calibration)
    for index, pending in enumerate(memory.pending):  # oldest first: outcomes in the order they were forecast
        age = len(memory.pending) - 1 - index
        if age >= len(pending.rate_mean) or pending.rate_spread[age] <= 0 or not pending.scored:
            continue  # not due, or a forecast with no opinion of its error (too little history) to score by
        for name in LOADS:
            mean, spread = pending.load(name, age)
            realised = rate * load_length(name, isl or pending.isl, osl or pending.osl)
            calibrations[name] = conformal.update(calibrations.get(name, conformal.Calibration()),
                                                  mean, spread, realised, levels, floor=pending.floor(name),
                                                  keep=keep)
    return dataclasses.replace(memory, forecast_calibration=calibrations)


def rise_floor(forecast: PendingForecast, rates: tuple[float, ...], risk: float) -> float:
    """The least rate (req/s) a plan at a rare `risk` sizes for: the latest rate times the risk quantile of
    the rises over the horizon (`conformal.rise_quantile`); 0 at a risk the day window resolves, where
    the forecast's scores alone carry it. A calm stretch shrinks the spread the scores count in, so a
    jump no larger than ones seen before can score more spreads than any score kept; counted as a
    multiple of the rate, it is no larger than before (ADR 0028).
    """
    if not rates or not conformal.rare(risk):
        return 0.0
    rise = conformal.rise_quantile(rates, len(forecast.rate_mean), risk,
                                   least=conformal.SPREAD_FLOOR_SHARE * forecast.level)
    return 0.0 if rise is None else rates[-1] * rise


def load_at_risk(forecast: PendingForecast, memory: GraphMemory, *, risk: float, burst: float) -> sizing.Load:
    """The load to size for: per load, the highest calibrated `risk` quantile over the horizon, in
    requests/s of the mean prompt (prefill) and of the mean output (decode), and at a rare risk no less
    than `rise_floor`."""
    isl, osl = forecast.isl, forecast.osl
    least = rise_floor(forecast, memory.rates, risk)

    def peak(name: str) -> float:
        calibration = memory.forecast_calibration.get(name, conformal.Calibration())
        quantiles = (conformal.quantile(calibration, *forecast.load(name, step), risk, floor=forecast.floor(name))
                     for step in range(len(forecast.rate_mean)))
        return max(least, max(quantiles) / load_length(name, isl, osl))
    return sizing.Load(rate_rps=peak("input_tokens"), isl=isl, osl=osl, burst=burst,
                       decode_rate_rps=peak("output_tokens"))


def decode_batch_cap(config: GraphPlanConfig, memory: GraphMemory) -> float:
    """The most sequences a decode replica runs: what the engine's flags say binds from the start, what
    the fleet showed where it is lower (a KV cache smaller than profiled); NaN: neither is known."""
    stated = [cap for cap in (memory.decode_max_running, config.decode_batch_cap) if cap is not None]
    return min(stated) if stated else math.nan


def sizing_corrections(config: GraphPlanConfig, memory: GraphMemory) -> sizing.Corrections:
    """What sizing corrects the profile by: the recent intervals' estimates and the batch cap, or, with
    autoCorrect off, the profile as written (what was learned of the fleet's speed stays out)."""
    corrections = dataclasses.replace(calibrated(memory.calibration), decode_max_running=decode_batch_cap(config, memory))
    if not config.auto_correct:
        corrections = dataclasses.replace(corrections, prefill=1.0, decode=1.0, prefill_offset_s=0.0,
                                          decode_offset_s=0.0)
    return corrections


def needed_ahead(config: GraphPlanConfig, memory: GraphMemory, capacity: capacities.CapacityModel,
                 trend: reactive.Trend, *, now: float) -> dict[sizing.Pool, int] | None:
    """The replicas per pool that the trend's rate a startup ahead needs, sized as the plan sizes (its
    corrections, length mixes, burstiness, bounds); None before any interval has measured lengths."""
    seen = recent_lengths(memory.lengths, now=now, interval_s=config.interval_s)
    isl, osl = recent_length(seen, "isl"), recent_length(seen, "osl")
    if not config.disaggregated or isl <= 0 or osl <= 0:
        return None
    load = sizing.Load(rate_rps=trend.rate_ahead_rps, isl=isl, osl=osl, burst=_median(memory.bursts, 1.0))
    if config.length_mix:
        load = dataclasses.replace(load, isl_mix=recent_mix(seen, "isl", isl), osl_mix=recent_mix(seen, "osl", osl))
    most = {pool: bound.max_replicas for pool, bound in config.bounds.items()}
    desired = sizing.size(load, capacity, config.sla, sizing_corrections(config, memory), most=most)
    return {pool: n for pool, n in desired.replicas.items()}


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
    observation = plausible(observation)
    silence = None
    held_for = now - memory.silent_since if memory.silent_since is not None else 0.0
    if observation.complete and observation.rate_rps is not None and held_for < OUTAGE_HOLD_S:
        silence = implausible_lull(observation.rate_rps, memory.rates, config.interval_s)
    if silence is not None:
        seen = ("no request this interval where the quietest one remembered expects" if not observation.rate_rps
                else f"{observation.rate_rps:,.3g} req/s this interval, under {LULL_SHARE:.0%} of the quietest one"
                     " remembered, which expects")
        observation = dataclasses.replace(observation, error=(
            f"{seen} {silence:,.0f}: an outage or a gap in the metrics, not a trough;"
            f" holding (for {OUTAGE_HOLD_S / 3600:g} h at most)"))
    if not observation.complete:
        why = observation.error or "incomplete metrics"
        decision = sizing.constrain(
            sizing.Desired(replicas=dict(current), reason="holding"), current=current, bounds=config.bounds,
            gpus_per_replica=config.gpus_per_replica, gpu_budget=config.gpu_budget, state=memory.scale_down,
            now=now, hold_seconds=config.hold_s, max_step_down=config.max_step_down, data_ok=False, data_note=why,
        )
        # A silence measured the fleet fine: the last judgement of its drift stands (missing metrics: none).
        verdict = drifts.judge(memory.drift, threshold=config.drift_threshold) if silence is not None else None
        plan = Plan(replicas=decision.replicas, reasons=decision.reasons, data_ok=False, observed=observation,
                    binding=decision.binding, drift=verdict, outage=silence is not None)
        since = now if silence is not None and memory.silent_since is None else memory.silent_since
        return plan, dataclasses.replace(memory, scale_down=decision.state, silent_since=since)

    rate = float(observation.rate_rps or 0.0)
    memory = realise(memory, rate=rate, isl=observation.isl or 0.0, osl=observation.osl or 0.0, risk=config.risk)
    memory = dataclasses.replace(
        memory,
        rates=_append(memory.rates, rate),
        lengths=with_lengths(memory.lengths, IntervalLengths(
            now, rate, observation.isl or 0.0, observation.osl or 0.0, observation.isl_histogram,
            observation.osl_histogram)),
    )
    forecast_error = None
    if memory.forecast_for_now is not None and rate > 0:
        forecast_error = abs(memory.forecast_for_now - rate) / rate

    forecaster = predictor if predictor is not None else predict.make_predictor(config.predictor)
    forecast = forecaster.forecast(
        memory.rates, steps=config.horizon_steps, step_seconds=config.interval_s, start=memory.forecast_state)
    recent = recent_lengths(memory.lengths, now=now, interval_s=config.interval_s)
    isl, osl = max(recent_length(recent, "isl"), 1.0), max(recent_length(recent, "osl"), 1.0)
    interval_burst = 1.0
    if observation.burst_rate_rps is not None and rate > 0:
        interval_burst = burstiness(observation.burst_rate_rps, rate, percentile=config.sla.percentile)
        memory = dataclasses.replace(memory, bursts=(*memory.bursts, interval_burst)[-CALIBRATION_INTERVALS:])
    burst = _median(memory.bursts, 1.0)
    pending = PendingForecast(forecast.mean, tuple(forecast.spread(i) for i in range(len(forecast.mean))), isl, osl,
                              level=recent_mean(memory.rates), scored=len(memory.rates) >= SCORED_FROM_INTERVALS)
    load = load_at_risk(pending, memory, risk=config.risk, burst=burst)
    cautious_level = cautious_risk(config.risk)
    cautious = None if cautious_level is None else load_at_risk(pending, memory, risk=cautious_level, burst=burst)
    if config.length_mix:
        isl_mix, osl_mix = recent_mix(recent, "isl", isl), recent_mix(recent, "osl", osl)
        load = dataclasses.replace(load, isl_mix=isl_mix, osl_mix=osl_mix)
        if cautious is not None:
            cautious = dataclasses.replace(cautious, isl_mix=isl_mix, osl_mix=osl_mix)
    memory = dataclasses.replace(memory, pending=(*memory.pending, pending)[-config.horizon_steps:])
    serving = ready if ready is not None else current
    estimate = interval_corrections(config, capacity, observation, serving, burst=interval_burst)
    max_running = memory.decode_max_running
    if config.disaggregated:
        max_running = learn_max_running(max_running, observation, serving.get("decode", 0))
    # Intervals that measured nothing (no traffic) leave the last judgement standing.
    sample = interval_drift(config, capacity, observation, serving, estimate, burst=interval_burst)
    measured = sample.measured
    memory = dataclasses.replace(memory, calibration=(*memory.calibration, estimate)[-CALIBRATION_INTERVALS:],
                                 decode_max_running=max_running,
                                 drift=(*memory.drift, sample)[-CALIBRATION_INTERVALS:] if measured else memory.drift)
    verdict = drifts.judge(memory.drift, threshold=config.drift_threshold)
    corrections = sizing_corrections(config, memory)
    size = sizing.size if config.disaggregated else sizing.size_aggregated
    most = {pool: bound.max_replicas for pool, bound in config.bounds.items()}
    desired = size(load, capacity, config.sla, corrections, most=most)
    if memory.silent_since is not None and rate > 0:
        # Traffic came back during the interval: what it measured is part outage, part load, so its
        # rate understates the load that resumed; it may add replicas but not take any away (ADR 0029).
        desired = dataclasses.replace(desired, replicas={pool: max(n, current.get(pool, 0))
                                                         for pool, n in desired.replicas.items()},
                                      reason=f"{desired.reason}; traffic resumed after an outage this interval:"
                                             " no scale-down until an interval measures it whole")
    # Until the forecast's errors have been scored a few times, its "cautious" quantile is the model's
    # own word (nothing at all on a flat start): no scale-down skips the hold before that.
    scored = min((len(memory.forecast_calibration[name].scores) if name in memory.forecast_calibration else 0)
                 for name in LOADS)
    safe = (size(cautious, capacity, config.sla, corrections, most=most).replicas
            if cautious is not None and scored >= conformal.MIN_SCORES else None)

    def constrained(budget: int | None) -> sizing.Decision:
        return sizing.constrain(
            desired, current=current, bounds=config.bounds, gpus_per_replica=config.gpus_per_replica,
            gpu_budget=budget, state=memory.scale_down, now=now, hold_seconds=config.hold_s,
            max_step_down=config.max_step_down, safe=safe,
        )

    unbudgeted = constrained(None)
    wanted = sum(n * config.gpus_per_replica[pool] for pool, n in unbudgeted.replicas.items())
    decision = unbudgeted if config.gpu_budget is None else constrained(config.gpu_budget)
    used = forecast.predictor + (f" (fell back: {forecast.fallback})" if forecast.fallback else "")
    notes = ["autoCorrect off: sized from the profile as written"] if not config.auto_correct and verdict.drifted else []
    plan = Plan(
        replicas=decision.replicas, reasons=[f"at risk {config.risk:g}, {desired.reason}", *decision.reasons, *notes],
        data_ok=True, observed=observation,
        predicted=load, corrections=corrections, forecast_error=forecast_error, predictor=used, wanted_gpus=wanted,
        binding=decision.binding, coverage=memory.coverage(), warnings=warnings_of(config, desired), drift=verdict,
    )
    next_forecast = forecast.mean[0] if forecast.mean else None
    return plan, dataclasses.replace(memory, scale_down=decision.state, forecast_for_now=next_forecast,
                                     forecast_state=forecast.state, silent_since=None)


def react(
    config: GraphPlanConfig,
    gauges: reactive.Gauges,
    memory: GraphMemory,
    *,
    floor: Mapping[sizing.Pool, int],
    capacity: capacities.CapacityModel,
    now: float,
    isl: float | None = None,
    osl: float | None = None,
    trend: reactive.Trend | None = None,
    ahead: Mapping[sizing.Pool, int] | None = None,
    readings: tuple[reactive.Reading, ...] = (),
) -> reactive.Reaction:
    """The fast path between two intervals (pure): `reactive.react` with the graph's targets and bounds.

    `floor` is the last interval's decision; lengths default to the recent intervals' means. `trend`
    and `ahead`: the arrivals' rise and what it needs (`needed_ahead`, sized once per reading by the
    caller). `readings`: the arrivals remembered, read at the graph's risk over a startup
    (`reactive.arrival_quantile`). An aggregated graph has no prefill/decode split to blame: the fast
    path leaves it alone.
    """
    if not config.disaggregated:
        return reactive.Reaction(dict(floor), ["aggregated graph: no fast path"], False)
    bounds = {pool: (bound.min_replicas, bound.max_replicas) for pool, bound in config.bounds.items()}
    seen = recent_lengths(memory.lengths, now=now, interval_s=config.interval_s)
    isl = isl if isl else recent_length(seen, "isl")
    osl = osl if osl else recent_length(seen, "osl")
    ttft_s, itl_s = config.sla.ttft_ms / 1e3, config.sla.itl_ms / 1e3
    if isl > 0 and osl > 0:
        ttft_s, itl_s = sizing.attainable_targets(capacity, isl=isl, osl=osl, ttft_s=ttft_s, itl_s=itl_s)
    reaction = reactive.react(gauges, capacity, isl=isl, osl=osl, ttft_target_s=ttft_s, itl_target_s=itl_s,
                              floor=floor, bounds=bounds, ahead=ahead, trend=trend, startup_s=config.startup_s,
                              arriving_rps=reactive.arrival_quantile(readings, horizon_s=config.startup_s,
                                                                     risk=config.risk))
    if config.gpu_budget is None or not reaction.changed:
        return reaction
    # Within the GPU budget the last interval was granted: take back the newest additions first.
    replicas = dict(reaction.replicas)
    before = reactive.baseline(gauges, floor=floor, bounds=bounds)

    def gpus() -> int:
        return sum(n * config.gpus_per_replica[pool] for pool, n in replicas.items())

    while gpus() > config.gpu_budget:
        added = [pool for pool in replicas if replicas[pool] > before[pool]]
        if not added:
            break
        replicas[max(added, key=lambda pool: replicas[pool] - before[pool])] -= 1
    if replicas == before:
        return reactive.Reaction(before, [*reaction.reasons, f"GPU budget {config.gpu_budget}: no room to add"], False)
    return reactive.Reaction(replicas, [*reaction.reasons, f"within GPU budget {config.gpu_budget}"], True)
