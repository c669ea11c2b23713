"""The planner's fast path: between planning intervals, add the replicas a pool is short of now.

The predictive loop sizes each pool once per interval for the load it forecasts a startup ahead; a
burst nobody forecast breaks the SLA long before the next interval. Every few seconds this loop reads
what the engines say right now (prompt tokens queued for prefill, sequences decoding and waiting for a
decode slot) and blames the pool that is actually short:

- **prefill** is short when a prompt arriving a startup from now would still wait longer than the
  TTFT target allows: the queued prompt tokens, plus what arrives meanwhile beyond what the pool
  drains, per replica at the profile's prompt throughput. A replica added now serves only after a
  startup, so a backlog that the pool drains by itself before then (a minute's spike) asks for
  nothing. What arrives is read at the graph's `risk`: the arrivals' mean rate over the readings
  kept, plus the risk's normal quantile of how a window of one startup varies around it
  (`arrival_quantile`: the readings' own spread, never less than Poisson's). When the pool is
  short it is sized for that rate plus draining the backlog projected a startup ahead within one
  more startup (`prefill_shortage`): the need it projects;
- **decode** is short when prefilled requests wait for a decode slot longer than the TTFT target
  allows (their first token waits on a running sequence finishing), or when the ITL at the sequences
  each decode replica holds exceeds its target.

A decode backlog inflates TTFT without a single prompt queued, so it never adds prefill: the blame
the interval's latency percentiles cannot make (both phases land in one TTFT) comes from the gauges.

Between the interval's forecasts, the **arrivals' trend**: a load that rises steadily (a morning ramp,
traffic returning after an outage) is short of replicas a startup before any queue shows it, and a
replica added when the queue shows needs a startup to serve. Each tick's arrivals are remembered over
`trend_window_s` (at least `TREND_WINDOW_S`, at least a startup and a tick); the rate is fitted
against time by least squares, and only when the slope clears `TREND_Z` standard errors does the fast
path size each pool for the projection's lower bound a startup and a reading ahead (`rate_ahead`), as
the plan sizes (`core.needed_ahead`). A straight line, not the log rate's: on log rates a burst after
near-silence is a jump of several e-folds, so a few seconds of it at the window's end read as growth
and buy replicas the SLA does not need, while the line does as well on steady rises (ADR 0027).

Bounds: it only adds (scale-down stays with the predictive loop, which holds before it removes), never
more than half the pool's active replicas in one step, never past the pool's max, and it counts
replicas still starting as if they served, so one shortage is answered once, not every tick while
the new replicas start (and leaves a pool alone while none of its replicas serves yet). A pool at zero
with nothing waiting for it is asleep (scaled to zero): it asks for nothing, and the wake-up
(planner/zero.py) starts it when a request is held. Its result never goes below the predictive floor.
Pure: plain data in and out.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping

import numpy as np

from fleetpilot.planner import capacity as capacities
from fleetpilot.planner.sizing import Pool

# The arrivals' trend is read over at least this long: long enough that a minute's burst is not a trend.
TREND_WINDOW_S = 300.0
# Standard errors the trend's slope must clear before the fast path acts on it, and that the rate it
# sizes for stays below the projection: one-sided, ~3% of windows of steady Poisson arrivals pass.
TREND_Z = 2.0
# Fewest readings a trend is fitted from (two parameters and their residuals).
TREND_MIN_READINGS = 4

# One step adds at most this share of a pool's active replicas (and at least one): a 4-replica pool
# grows to 6, a 100-replica pool to 150. Proportional, so no fleet size is special.
MAX_STEP_SHARE = 0.5


@dataclasses.dataclass(frozen=True)
class Gauges:
    """What the frontend and the engines report right now about one disaggregated graph."""

    prefill_queued_tokens: float  # prompt tokens not yet prefilled, queued at a worker or unrouted
    decode_running: float  # sequences decoding
    decode_waiting: float  # prefilled requests waiting for a decode slot (KV cache or batch cap full)
    ready: Mapping[Pool, int]  # replicas serving
    active: Mapping[Pool, int]  # replicas asked for: serving or starting


@dataclasses.dataclass(frozen=True)
class Reading:
    """Requests that arrived at a graph's frontends in [start, end) (seconds on any one clock)."""

    start: float
    end: float
    requests: float


@dataclasses.dataclass(frozen=True)
class Trend:
    """A rising arrival rate: fitted now, and the lower bound of its projection `lead_s` ahead."""

    rate_now_rps: float
    rate_ahead_rps: float
    lead_s: float
    rise_rps_per_s: float  # the fitted slope


def trend_window_s(*, startup_s: float, period_s: float) -> float:
    """How long the arrivals' readings are kept: `TREND_WINDOW_S`, or a startup and a tick if longer."""
    return max(TREND_WINDOW_S, startup_s + period_s)


def remember_arrivals(readings: tuple[Reading, ...], reading: Reading, *, keep_s: float) -> tuple[Reading, ...]:
    """The readings of the last `keep_s` seconds with `reading` added (a reading that does not follow
    the last one, e.g. after a restart, starts them afresh)."""
    if readings and reading.start < readings[-1].end - 1e-9:
        readings = ()
    return (*(r for r in readings if r.start >= reading.end - keep_s - 1e-9), reading)


def read_arrivals(readings: tuple[Reading, ...], reading: Reading, *, startup_s: float,
                  period_s: float) -> tuple[tuple[Reading, ...], Trend | None]:
    """`reading` remembered with the last `trend_window_s`, and their trend projected a startup and a
    reading ahead (what is added now serves a startup later; the next reading comes a reading later).
    The live planner and the backtest both read the arrivals through this."""
    kept = remember_arrivals(readings, reading, keep_s=trend_window_s(startup_s=startup_s, period_s=period_s))
    return kept, rate_ahead(kept, lead_s=startup_s + max(period_s, reading.end - reading.start))


def _spans_and_rates(readings: tuple[Reading, ...]) -> tuple[list[Reading], np.ndarray, np.ndarray]:
    """The readings that span time, their spans, and the arrival rate of each (`rate_ahead` and
    `arrival_quantile` weight each rate by its span)."""
    usable = [r for r in readings if r.end > r.start]
    spans = np.array([r.end - r.start for r in usable])
    rates = np.array([max(r.requests, 0.0) for r in usable]) / spans if usable else np.array([])
    return usable, spans, rates


def rate_ahead(readings: tuple[Reading, ...], *, lead_s: float, z: float = TREND_Z) -> Trend | None:
    """The arrival rate `lead_s` after the last reading when the arrivals rise beyond their noise; None
    when they do not (or there are too few readings).

    Least squares of each reading's rate on time, weighted by its span; the residual variance is never
    taken below Poisson's at the mean rate. The slope must clear `z` standard errors; the rate returned
    is the projection's lower bound at `z`.
    """
    usable, spans, rates = _spans_and_rates(readings)
    if len(usable) < TREND_MIN_READINGS:
        return None
    now = usable[-1].end
    t = np.array([(r.start + r.end) / 2.0 - now for r in usable])
    total = float(spans.sum())
    t_mean, rate_mean = float(spans @ t) / total, float(spans @ rates) / total
    spread = float(spans @ (t - t_mean) ** 2)
    if spread <= 0 or rate_mean <= 0:
        return None
    slope = float(spans @ ((t - t_mean) * (rates - rate_mean))) / spread
    residuals = rates - (rate_mean + slope * (t - t_mean))
    # A reading of span s at rate λ has Poisson variance λ/s: weighted by s, the variance per weight is λ.
    variance = max(float(spans @ residuals**2) / (len(usable) - 2), rate_mean)
    if slope <= z * math.sqrt(variance / spread):
        return None
    x = lead_s - t_mean
    error = math.sqrt(variance * (1.0 / total + x * x / spread))
    return Trend(rate_now_rps=rate_mean - slope * t_mean, rate_ahead_rps=max(rate_mean + slope * x - z * error, 0.0),
                 lead_s=lead_s, rise_rps_per_s=slope)


@dataclasses.dataclass(frozen=True)
class Reaction:
    """Replicas per pool after the fast path, and why; `changed` says whether it added any."""

    replicas: Mapping[Pool, int]
    reasons: list[str]
    changed: bool


def decode_wait_s(gauges: Gauges, capacity: capacities.CapacityModel, *, isl: float, osl: float,
                  replicas: int) -> float:
    """How long a request that just joined the decode queue waits for a slot.

    Slots free as running sequences finish: with R sequences per replica, each half-way through its
    `osl` tokens at the ITL of R sequences, one frees every osl·ITL / (2R) seconds, and the request
    queues behind the others waiting on its replica.
    """
    if gauges.decode_waiting <= 0:
        return 0.0
    if replicas <= 0 or gauges.decode_running <= 0:
        return math.inf
    running = gauges.decode_running / replicas
    itl = capacity.itl_s(running, isl + osl / 2.0).value
    return (gauges.decode_waiting / replicas) * osl * itl / (2.0 * running)


@dataclasses.dataclass(frozen=True)
class PrefillShortage:
    """A prefill pool still short a startup from now: the backlog then, the wait it means, the need."""

    backlog_ahead_tokens: float
    wait_ahead_s: float  # behind the backlog, per replica counted
    needed: int  # replicas that serve the arrivals and drain that backlog within one more startup


def prefill_shortage(queued_tokens: float, capacity: capacities.CapacityModel, *, isl: float, replicas: int,
                     slack_s: float, arriving_rps: float | None, startup_s: float) -> PrefillShortage | None:
    """Whether the prefill pool (`replicas`, those starting counted as serving) is still short a startup
    from now, when a replica added now would serve; None if not. A pool at zero with prompts queued
    is short: nothing drains them.

    The backlog then is what is queued now plus what arrives meanwhile (`arriving_rps` prompts of
    `isl` tokens; None: as fast as the pool drains) minus what the pool drains. Short: that backlog
    keeps a prompt waiting past the TTFT slack. The need: the arrivals plus the backlog drained over
    one more startup (the plan's own horizon: sooner takes replicas the next plan gives back).
    """
    if startup_s <= 0:
        return None
    tokens_per_s = capacity.prefill_tokens_per_s(isl).value
    draining = max(replicas, 0) * tokens_per_s
    arriving = arriving_rps * isl if arriving_rps is not None else draining
    backlog = max(0.0, queued_tokens + (arriving - draining) * startup_s)
    if backlog <= slack_s * draining:  # the caller's slack is positive: an empty backlog is never short
        return None
    needed = math.ceil((arriving + backlog / startup_s) / tokens_per_s - 1e-9)
    return PrefillShortage(backlog, backlog / draining if draining > 0 else math.inf, needed)


def arrival_quantile(readings: tuple[Reading, ...], *, horizon_s: float, risk: float) -> float | None:
    """The request rate over the next `horizon_s` at quantile `risk`: the readings' mean rate plus the
    risk's normal quantile of a `horizon_s` window's spread around it; None with too few readings.

    The spread is the readings' own: their rates' variance about the mean per second of reading
    (weighted by span, as in `rate_ahead`), never below Poisson's at the mean rate, over a window of
    `horizon_s`. At risk 0.5 it is the mean; bursty arrivals widen it, and a higher risk reads more of it.
    """
    usable, spans, rates = _spans_and_rates(readings)
    if len(usable) < TREND_MIN_READINGS or horizon_s <= 0:
        return None
    total = float(spans.sum())
    mean = float(spans @ rates) / total
    variance = max(float(spans @ (rates - mean) ** 2) / (len(usable) - 1), mean)
    z = statistics.NormalDist().inv_cdf(risk)
    return max(mean + z * math.sqrt(variance / horizon_s), 0.0)


def _step(active: int, needed: int, high: int) -> int:
    """Replicas to run after one bounded step from `active` towards `needed`."""
    most = active + max(1, math.ceil(active * MAX_STEP_SHARE))
    return min(high, most, max(needed, active + 1))


def baseline(gauges: Gauges, *, floor: Mapping[Pool, int], bounds: Mapping[Pool, tuple[int, int]]) -> dict[Pool, int]:
    """What the fast path starts from: the predictive floor or what is active, whichever is more, in bounds."""
    return {pool: min(bounds[pool][1], max(floor[pool], gauges.active.get(pool, 0), bounds[pool][0]))
            for pool in ("prefill", "decode")}


def react(
    gauges: Gauges,
    capacity: capacities.CapacityModel,
    *,
    isl: float,
    osl: float,
    ttft_target_s: float,
    itl_target_s: float,
    floor: Mapping[Pool, int],
    bounds: Mapping[Pool, tuple[int, int]],
    ahead: Mapping[Pool, int] | None = None,
    trend: Trend | None = None,
    arriving_rps: float | None = None,
    startup_s: float,
) -> Reaction:
    """One tick of the fast path for a disaggregated graph (see the module docstring).

    `floor` is what the predictive loop last decided; `bounds` each pool's (min, max). `ahead`: the
    replicas the arrivals' `trend` needs a startup ahead (`core.needed_ahead`), when it rises.
    `arriving_rps`: the request rate the next `startup_s` brings at the graph's risk
    (`arrival_quantile`); None where the arrivals are not read, and the pool is taken to drain as
    fast as prompts arrive. The result is at least the floor and at least what is active, within
    the max.
    """
    replicas = baseline(gauges, floor=floor, bounds=bounds)
    reasons: list[str] = []
    changed = False
    if isl <= 0 or osl <= 0:
        return Reaction(replicas, ["no request lengths observed yet: nothing to react to"], False)

    # A pool at zero with nothing waiting for it is asleep: no request is waiting, and the first that comes is
    # held by the frontend, which wakes the pool (planner/zero.py). Adding a replica here would undo each
    # scale to zero a fast-path tick later.
    asleep = {"prefill": replicas["prefill"] == 0 and gauges.prefill_queued_tokens <= 0,
              "decode": replicas["decode"] == 0 and gauges.decode_waiting <= 0}
    counted = replicas["prefill"]  # starting replicas count as serving: one shortage, one answer
    own = capacity.lone_ttft_s(isl).value
    slack = ttft_target_s - own
    # A pool with replicas asked for and none serving yet is already answered: its queue says nothing
    # about how many more it needs (at a scale-up from zero it would only grow, tick after tick).
    starting_only = {pool: gauges.ready.get(pool, 0) == 0 and replicas[pool] > 0 for pool in replicas}
    if slack > 0 and not starting_only["prefill"] and not asleep["prefill"]:
        shortage = prefill_shortage(gauges.prefill_queued_tokens, capacity, isl=isl, replicas=counted,
                                    slack_s=slack, arriving_rps=arriving_rps, startup_s=startup_s)
        if shortage is not None:
            new = _step(counted, shortage.needed, bounds["prefill"][1])
            if new > counted:
                reasons.append(
                    f"prefill: a prompt arriving {startup_s:.0f} s from now would wait {own + shortage.wait_ahead_s:.2f} s "
                    f"for its first token (target {ttft_target_s:.2f} s) behind {shortage.backlog_ahead_tokens:.0f} "
                    f"tokens ({gauges.prefill_queued_tokens:.0f} queued now): {counted} → {new}")
                replicas["prefill"], changed = new, True

    counted = replicas["decode"]
    serving = max(gauges.ready.get("decode", 0), 1)
    slot_wait = decode_wait_s(gauges, capacity, isl=isl, osl=osl, replicas=serving)
    sequences = (gauges.decode_running + gauges.decode_waiting) / serving
    itl = capacity.itl_s(sequences, isl + osl / 2.0).value
    short_of_slots = slot_wait > ttft_target_s - own
    # Replicas that would hold every sequence, running and waiting, as full as the serving ones are.
    needed = math.ceil(serving * (gauges.decode_running + gauges.decode_waiting)
                       / max(gauges.decode_running, 1.0) - 1e-9)
    if ((short_of_slots or itl > itl_target_s) and max(needed, serving + 1) > counted and not starting_only["decode"]
            and not asleep["decode"]):
        new = _step(counted, needed, bounds["decode"][1])
        if new > counted:
            why = (f"{gauges.decode_waiting:.0f} prefilled requests wait {slot_wait:.2f} s for a decode slot"
                   if short_of_slots else
                   f"{sequences:.1f} sequences per replica decode at ITL {itl * 1e3:.1f} ms "
                   f"(target {itl_target_s * 1e3:.1f} ms)")
            reasons.append(f"decode: {why}: {counted} → {new}")
            replicas["decode"], changed = new, True
    if ahead is not None and trend is not None:
        for pool in ("prefill", "decode"):
            counted = replicas[pool]
            if ahead.get(pool, 0) <= counted or asleep[pool]:  # an absolute need: replicas starting count, no runaway
                continue
            new = _step(counted, ahead[pool], bounds[pool][1])
            if new > counted:
                reasons.append(
                    f"{pool}: arrivals rising ({trend.rise_rps_per_s * 60:+.3g} req/s a minute), at least "
                    f"{trend.rate_ahead_rps:.3g} req/s {trend.lead_s:.0f} s ahead (now {trend.rate_now_rps:.3g}): "
                    f"{counted} → {new}")
                replicas[pool], changed = new, True
    return Reaction(replicas, reasons or ["no pool short"], changed)
