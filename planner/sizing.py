"""Steps 3 and 4 of the planner: size the pools for the predicted load, then constrain the answer.

Where it sits: after `predict` has turned the observed metrics into the next interval's `Load`, `size`
(or `size_aggregated`) asks the capacity model how many requests/s one replica takes within the SLA and
returns the replicas each pool needs (`Desired`). `constrain` turns that into what the planner will
actually write to each DynamoGraphComponent's /scale (`Decision`): within the graph's min/max, within
its GPU budget, scaling up at once and down only after a hold period, one bounded step at a time.
Graphs that share a budget get their share from `budget.BudgetLedger` first. Everything here is a pure
function of plain data; the hysteresis memory is a `ScaleDownState` value the caller carries from one
interval to the next (in live mode, in the graph's status), so a restarted planner loses nothing it
cannot re-read. Every result carries the reason the planner writes into the graph's status.

Pools are named as in the API: `prefill` and `decode` for a disaggregated graph, `aggregated` for one
whose workers do both.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Literal

from fleetpilot.api import v1alpha1
from fleetpilot.planner import capacity as capacities
from fleetpilot.planner import lengths

Pool = Literal["prefill", "decode", "aggregated"]
POOLS: tuple[Pool, ...] = ("prefill", "decode", "aggregated")

# Speed factors outside this range say the fleet is in a transient (a backlog draining, replicas still
# warming up) more than that the profile is off by that much: the clamp keeps the loop stable. Below 1
# is allowed (down to half) so that a fleet doing better than its profile (prefix-cache hits, a faster
# engine release) gives GPUs back; Dynamo's documented planner never lets its prefill correction go
# below 1.
CORRECTION_MIN = 0.5
CORRECTION_MAX = 3.0
# A latency offset (latency the profile does not model at all) is credited up to this share of the
# target: past it, sizing would chase a latency no replica count removes.
OFFSET_MAX_SHARE = 0.5

# Where a prefill pool lies between one shared queue (1) and separate queues (0) until its fleet has
# shown it (`capacity.CapacityModel.pooling_observed`): half way, since either end is wrong by a factor
# of the pool size on some traffic.
POOLING_PRIOR = 0.5

# When a latency target is below what the profile can do whatever the replica count (its floor: a
# prompt alone for TTFT, one sequence per replica for ITL), the pool is sized for the floor plus this
# share of it, and the plan says the SLA is infeasible. Sizing for the floor itself approaches it only
# with nearly empty replicas — for decode, one sequence each, which sent a pool to scaling.max — while
# the target is missed anyway.
INFEASIBLE_SLACK = 0.25

# Rounding guard: 12.0 / 4.0 * 1.0000000000000002 must ask for 3 replicas, not 4.
_EPSILON = 1e-9


@dataclasses.dataclass(frozen=True)
class Load:
    """What the pools must serve next interval: request rates and mean input/output lengths.

    `rate_rps` is the rate prefill must take: the quantile of the input-token load the planner sizes
    for, in requests of the mean prompt. `decode_rate_rps` is decode's, from the output-token load
    (None: the same rate); the two differ because prompt and output lengths vary on their own.
    `burst`: how much faster than `rate_rps` requests arrive over a few seconds, as the SLA
    percentile's request sees it (1: as steady as Poisson at that rate). Prefill serves a burst at its
    rate: a prompt queued behind seconds of one waits past any TTFT target. Decode spreads each
    request over its whole generation (seconds to minutes), so a burst reaches it as the mean rate.
    """

    rate_rps: float
    isl: float
    osl: float
    burst: float = 1.0
    decode_rate_rps: float | None = None
    # The prompt- and output-length mixes (means `isl` and `osl`); None: every request at the mean.
    isl_mix: lengths.LengthMix | None = None
    osl_mix: lengths.LengthMix | None = None

    def __post_init__(self) -> None:
        for name in ("rate_rps", "isl", "osl", "decode_rps"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"Load.{name} must be a finite number ≥ 0, got {value}")
        if not (self.burst >= 1.0 and math.isfinite(self.burst)):
            raise ValueError(f"Load.burst must be a finite number ≥ 1, got {self.burst}")

    @property
    def prefill_rate_rps(self) -> float:
        return self.rate_rps * self.burst

    @property
    def decode_rps(self) -> float:
        return self.rate_rps if self.decode_rate_rps is None else self.decode_rate_rps

    @property
    def idle(self) -> bool:
        return self.rate_rps == 0 and self.decode_rps == 0

    def words(self) -> str:
        """'R req/s at ISL I, OSL O', naming decode's rate when it differs."""
        rates = f"{self.rate_rps:.3g} req/s"
        if abs(self.decode_rps - self.rate_rps) > 1e-3 * max(self.rate_rps, 1e-9):
            rates = f"{self.rate_rps:.3g} req/s of prompts, {self.decode_rps:.3g} of outputs"
        mix = " (their length mix)" if self.isl_mix is not None or self.osl_mix is not None else ""
        return f"{rates} at ISL {self.isl:.0f}, OSL {self.osl:.0f}{mix}"


@dataclasses.dataclass(frozen=True)
class Corrections:
    """How the fleet differs from its profile, per phase: a speed factor and a latency offset.

    `prefill` / `decode`: the fleet's time per unit of work over the profile's (above 1: slower); a
    replica then does 1/factor of the profile's work, and its latency is the factor times the
    profile's. `prefill_offset_s` / `decode_offset_s`: latency at the SLA percentile the profile does
    not model at all (HTTP and tokenising, the KV transfer, the long prompts of the length mix), which
    no replica count removes: it comes off the target before the profile is asked. `size` clamps the
    factors to [CORRECTION_MIN, CORRECTION_MAX] and the offsets to [0, OFFSET_MAX_SHARE × target].

    (Not observed ÷ expected latency as a factor on each pool's need: where a constant latency the
    profile does not model dominates, that ratio stays high however many replicas run, and sizing by
    it over-provisions. ADR 0018.)
    """

    prefill: float = 1.0
    decode: float = 1.0
    prefill_offset_s: float = 0.0
    decode_offset_s: float = 0.0
    # The most sequences one decode replica of the fleet runs at once (its engine's batch cap), learned
    # when prefilled requests were seen waiting for a slot; NaN: not seen yet. The profile may have been
    # measured with a larger cap (or assumes the KV cache is the only limit).
    decode_max_running: float = math.nan
    # How far the prefill replicas share one queue (1: M/G/c, 0: separate M/G/1 queues), as the fleet
    # has shown it; NaN: not seen yet (POOLING_PRIOR is used).
    prefill_pooling: float = math.nan

    @property
    def pooling(self) -> float:
        """The queue sharing to size with: the learned one in [0, 1], else POOLING_PRIOR."""
        return min(1.0, max(0.0, self.prefill_pooling)) if math.isfinite(self.prefill_pooling) else POOLING_PRIOR


def correction(observed_s: float | None, expected_s: float | None) -> float:
    """Observed / expected latency, or 1 (no correction) when either is missing, zero or not finite."""
    if observed_s is None or expected_s is None:
        return 1.0
    if not (observed_s > 0 and expected_s > 0 and math.isfinite(observed_s) and math.isfinite(expected_s)):
        return 1.0
    return observed_s / expected_s


def clamp_correction(factor: float) -> float:
    """The factor `size` uses: clamped to [CORRECTION_MIN, CORRECTION_MAX]; NaN counts as 1."""
    if math.isnan(factor):
        return 1.0
    return min(CORRECTION_MAX, max(CORRECTION_MIN, factor))


class _ReplicasByPool:
    """Read a decision's replicas as attributes: `plan.prefill` rather than `plan.replicas["prefill"]`."""

    replicas: Mapping[Pool, int]

    @property
    def prefill(self) -> int:
        return self.replicas.get("prefill", 0)

    @property
    def decode(self) -> int:
        return self.replicas.get("decode", 0)

    @property
    def aggregated(self) -> int:
        return self.replicas.get("aggregated", 0)


@dataclasses.dataclass(frozen=True)
class Desired(_ReplicasByPool):
    """Replicas each pool needs for the load, before any bounds, budget or hysteresis."""

    replicas: Mapping[Pool, int]
    reason: str
    # Pools whose SLA target no replica count meets, each with words naming the target and the floor.
    infeasible: Mapping[Pool, str] = dataclasses.field(default_factory=dict)


# -- step 3: size ----------------------------------------------------------------------------------------


def _replicas_for(need: float) -> int:
    """Whole replicas for a fractional need: the ceiling, at least 1 for any need at all."""
    if need <= 0:
        return 0
    return max(1, math.ceil(need - _EPSILON))


@dataclasses.dataclass(frozen=True)
class _PhaseNeed:
    """One phase's need in replicas (fractional), and the words behind it."""

    replicas: float
    reason: str
    extrapolated: bool = False
    infeasible: str | None = None  # the target no replica count meets, and the floor it lies below

    def words(self, correction_words: str) -> str:
        tail = "; extrapolated beyond the profile" if self.extrapolated else ""
        return f"{self.reason}{correction_words}{tail}"


def _offset_words(name: str, offset: float, target_s: float) -> tuple[float, str]:
    used = min(max(offset, 0.0), OFFSET_MAX_SHARE * target_s) if math.isfinite(offset) else 0.0
    return used, (f", {used * 1e3:.0f} ms of {name} latency the profile does not model" if used > 0 else "")


def _prefill_need(
    load: Load, capacity: capacities.CapacityModel, sla: v1alpha1.SlaTarget, factor: float, offset_s: float,
    pooling: float = POOLING_PRIOR, most: int | None = None,
) -> _PhaseNeed:
    target = sla.ttft_ms / 1e3
    offset, offset_words = _offset_words("TTFT", offset_s, target)
    # The profile at factor × its latency, plus the offset, within the target: every time scales by the
    # factor, so the pool offered factor × the rate meets (target − offset) / factor on the profile.
    rate = load.prefill_rate_rps * factor
    pool = capacity.prefill_pool(rate, (target - offset) / factor, isl=load.isl,
                                 percentile=sla.percentile, mix=load.isl_mix, pooling=pooling, most=most)
    infeasible = None
    if not pool.target_met:
        relaxed, infeasible = _infeasible(
            f"prefill: TTFT target {target * 1e3:.0f} ms at p{sla.percentile:g}", pool.lone_ttft_s, factor, offset,
            f"p{sla.percentile:g} of prompts alone on a replica", digits=0)
        pool = capacity.prefill_pool(rate, relaxed, isl=load.isl, percentile=sla.percentile, mix=load.isl_mix,
                                     pooling=pooling, most=most)
    how = f"{pool.reason}{offset_words}"
    if load.burst > 1.0:
        how += f", for bursts at {load.burst:.2f}× the rate"
    return _PhaseNeed(float(pool.replicas), how, pool.extrapolated, infeasible)


def _infeasible(target_words: str, floor_s: float, factor: float, offset: float, floor_words: str, *,
                digits: int) -> tuple[float, str]:
    """For a target below the profile's floor (`floor_s`, on the profile's clock): the target to size for
    instead (the floor + INFEASIBLE_SLACK, on the profile's clock) and words naming target and floor as the
    fleet sees them (× the speed factor, + the offset)."""
    relaxed = floor_s * (1.0 + INFEASIBLE_SLACK)
    modelled = " with the latency the profile does not model" if offset > 0 else ""
    return relaxed, (f"{target_words} is below the floor of {(floor_s * factor + offset) * 1e3:.{digits}f} ms"
                     f" ({floor_words}{modelled}): no replica count meets it; sized for"
                     f" {(relaxed * factor + offset) * 1e3:.{digits}f} ms (the floor + {INFEASIBLE_SLACK:.0%})")


def attainable_targets(capacity: capacities.CapacityModel, *, isl: float, osl: float, ttft_s: float,
                       itl_s: float) -> tuple[float, float]:
    """(TTFT, ITL) targets the fast path can act on: a target below the profile's floor at these lengths is
    raised to the floor + INFEASIBLE_SLACK, as sizing does, so that a queue the fleet can clear still
    counts and a latency no replica count brings down does not add a replica every tick."""
    lone = capacity.lone_ttft_s(isl).value
    if lone > ttft_s:
        ttft_s = lone * (1.0 + INFEASIBLE_SLACK)
    decode = capacity.decode_capacity(isl, osl, itl_s)
    if not decode.target_met and decode.best_effort_rps > 0:
        itl_s = decode.itl_s * (1.0 + INFEASIBLE_SLACK)
    return ttft_s, itl_s


def _decode_need(
    load: Load, capacity: capacities.CapacityModel, sla: v1alpha1.SlaTarget, factor: float, offset_s: float,
    max_running: float = math.nan,
) -> _PhaseNeed:
    target = sla.itl_ms / 1e3
    offset, offset_words = _offset_words("ITL", offset_s, target)
    context = capacities.decode_context(load.isl, load.osl_mix, load.osl)
    running = max_running if math.isfinite(max_running) else None
    cap = capacity.decode_capacity(load.isl, load.osl, (target - offset) / factor, max_running=running,
                                   context_length=context)
    infeasible = None
    if not cap.target_met and cap.best_effort_rps > 0:
        relaxed, infeasible = _infeasible(
            f"decode: ITL target {target * 1e3:.1f} ms", cap.itl_s, factor, offset,
            f"one sequence per replica at context {cap.context_length:.0f}", digits=1)
        infeasible += " rather than one sequence per replica"
        cap = capacity.decode_capacity(load.isl, load.osl, relaxed, max_running=running, context_length=context)
    if cap.target_met:
        per_replica = cap.rate_rps / factor
        how = f"{per_replica:.3g} req/s per replica at concurrency {cap.concurrency:.1f}{offset_words}"
        if cap.limited_by == "engine":
            how += f" (the fleet runs at most {max_running:.0f} sequences per replica)"
    else:
        # Nothing the profile knows serves this context (it does not fit one replica's KV cache):
        # more replicas cannot help, so ask for one and say why.
        return _PhaseNeed(1.0, f"{cap.reason}; no replica count helps",
                          infeasible=f"decode: {cap.reason}; no replica count helps")
    return _PhaseNeed(load.decode_rps / per_replica, how, cap.extrapolated, infeasible)


def _factor_words(name: str, raw: float) -> tuple[float, str]:
    factor = clamp_correction(raw)
    if factor == 1.0:
        return factor, ""
    clamped = f" (clamped from {raw:.2f})" if factor != raw else ""
    return factor, f" × {name} correction {factor:.2f}{clamped}"


def size(
    load: Load,
    capacity: capacities.CapacityModel,
    sla: v1alpha1.SlaTarget,
    corrections: Corrections = Corrections(),
    *,
    decode_capacity: capacities.CapacityModel | None = None,
    most: Mapping[Pool, int] | None = None,
) -> Desired:
    """Replicas of a disaggregated graph's prefill and decode pools for `load`.

    Each pool needs ceil(rate / per-replica rate) replicas, at least 1 when there is any load: prefill from the requests/s one replica sustains within the TTFT target at the SLA
    percentile, decode from the requests/s that keep ITL under target at the mean context, each read
    off the profile as the corrections say the fleet differs from it (at (target − offset) / factor,
    then divided by the factor). There is no headroom: the margin for forecast error is in the load
    (a calibrated quantile, `conformal`) and the margin for bursts in `load.burst`.
    `decode_capacity` is the decode pool's own model when it runs another parallelism than prefill.
    When a target is out of reach whatever the replica count, the pool is sized for its floor plus
    INFEASIBLE_SLACK and `Desired.infeasible` says so. `most`: per pool, a count past which no answer
    matters (scaling.max): sizing stops searching there.
    """
    decode_model = decode_capacity or capacity
    if load.idle:
        return Desired({"prefill": 0, "decode": 0}, "no load predicted: no replicas needed beyond the minimums")
    p_factor, p_words = _factor_words("prefill", corrections.prefill)
    d_factor, d_words = _factor_words("decode", corrections.decode)
    prefill = _prefill_need(load, capacity, sla, p_factor, corrections.prefill_offset_s, corrections.pooling,
                            (most or {}).get("prefill"))
    decode = _decode_need(load, decode_model, sla, d_factor, corrections.decode_offset_s,
                          corrections.decode_max_running)
    p_replicas = _replicas_for(prefill.replicas)
    d_replicas = _replicas_for(decode.replicas)
    reason = (
        f"{load.words()}: "
        f"prefill {p_replicas} ({prefill.words(p_words)}), decode {d_replicas} ({decode.words(d_words)})"
    )
    needs: tuple[tuple[Pool, _PhaseNeed], ...] = (("prefill", prefill), ("decode", decode))
    infeasible = {pool: need.infeasible for pool, need in needs if need.infeasible is not None}
    return Desired({"prefill": p_replicas, "decode": d_replicas}, reason, infeasible)


def size_aggregated(
    load: Load,
    capacity: capacities.CapacityModel,
    sla: v1alpha1.SlaTarget,
    corrections: Corrections = Corrections(),
    *,
    most: Mapping[Pool, int] | None = None,
) -> Desired:
    """Replicas of an aggregated pool, whose workers both prefill and decode.

    A replica's time is shared between the two phases, so its needs add up: with the prefill and
    decode needs computed as in `size` (each from the same profile, each with its own correction),
    the pool needs ceil(prefill need + decode need) replicas. Conservative: an
    engine with chunked prefill rides prompts on decode steps and does better than time-sharing,
    which the corrections (down to CORRECTION_MIN) can then win back.
    """
    if load.idle:
        return Desired({"aggregated": 0}, "no load predicted: no replicas needed beyond the minimum")
    p_factor, p_words = _factor_words("prefill", corrections.prefill)
    d_factor, d_words = _factor_words("decode", corrections.decode)
    prefill = _prefill_need(load, capacity, sla, p_factor, corrections.prefill_offset_s, corrections.pooling,
                            (most or {}).get("aggregated"))
    decode = _decode_need(load, capacity, sla, d_factor, corrections.decode_offset_s,
                          corrections.decode_max_running)
    replicas = _replicas_for(prefill.replicas + decode.replicas)
    reason = (
        f"{load.words()}: aggregated {replicas} = "
        f"prefill share {prefill.replicas:.2f} ({prefill.words(p_words)}) + decode share "
        f"{decode.replicas:.2f} ({decode.words(d_words)})"
    )
    words = [need.infeasible for need in (prefill, decode) if need.infeasible is not None]
    return Desired({"aggregated": replicas}, reason, {"aggregated": "; ".join(words)} if words else {})


# -- step 4: constrain -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScaleDownState:
    """What the hysteresis remembers between intervals: per pool, since when a scale-down has waited.

    `waiting_since[pool]` is the time the pool's desired replicas went (and stayed) below its current
    replicas, or the time of its last scale-down step while still below; absent when no scale-down is
    pending. Plain data, so it can live in the graph's status between planner runs.
    """

    waiting_since: Mapping[Pool, float] = dataclasses.field(default_factory=dict)
    # The highest target seen while waiting: where the pool lands when the hold ends (as the HPA's
    # scale-down stabilisation window lands on the highest recommendation within it).
    waiting_peak: Mapping[Pool, int] = dataclasses.field(default_factory=dict)


# What set each pool's replicas, in one word (a status field and a metric label):
Binding = Literal["forecast", "bounds", "hold", "step-limit", "budget", "no-data", "fast-path", "idle"]


@dataclasses.dataclass(frozen=True)
class Decision(_ReplicasByPool):
    """The replicas the planner will run per pool, why, and the state for the next interval.

    `binding[pool]` says what set the pool's count: the sizing for the forecast load, its bounds, the
    scale-down hold, a step limit, the GPU budget, or missing data.
    """

    replicas: Mapping[Pool, int]
    reasons: list[str]
    state: ScaleDownState
    binding: Mapping[Pool, Binding] = dataclasses.field(default_factory=dict)


def _gpus(replicas: Mapping[Pool, int], gpus_per_replica: Mapping[Pool, int]) -> int:
    return sum(n * gpus_per_replica[pool] for pool, n in replicas.items())


def _hold_so_far(state: ScaleDownState, pool: Pool, target: int, now: float) -> tuple[float, int]:
    """When `pool` began waiting to scale down (now, if it had not) and the highest target of the wait."""
    if pool not in state.waiting_since:
        return now, target
    return state.waiting_since[pool], max(target, state.waiting_peak.get(pool, target))


def constrain(
    desired: Desired,
    *,
    current: Mapping[Pool, int],
    bounds: Mapping[Pool, v1alpha1.ScalingBounds],
    gpus_per_replica: Mapping[Pool, int],
    gpu_budget: int | None,
    state: ScaleDownState,
    now: float,
    hold_seconds: float,
    max_step_down: int | None = None,
    max_step_up: int | None = None,
    data_ok: bool = True,
    data_note: str = "",
    safe: Mapping[Pool, int] | None = None,
) -> Decision:
    """Turn desired replicas into the replicas to run, one pool at a time, then fit the GPU budget.

    The pools are those in `current` (the graph's scalable components). Rules, in order:

    1. `data_ok=False` (metrics missing or stale): every pool keeps its current replicas exactly, and
       pending scale-downs restart their wait (nobody saw the load stay low meanwhile).
    2. The target is the desired count clamped to the pool's [min, max].
    3. Above current: scale up now, by at most `max_step_up` replicas when set.
    4. Below current: only once the target has stayed below current for `hold_seconds`, and then to the
       highest target seen during that wait (the HPA's stabilisation window), by at most
       `max_step_down` replicas when set; the wait restarts after each step, so a pool takes at most
       one step per hold period.
    5. Bounds are not subject to hysteresis or step limits: a pool outside [min, max] (the bounds
       changed) goes to the nearest bound now.
    6. GPU budget: while the pools need more than `gpu_budget` GPUs, take one replica from the pool
       with the most slack relative to its need (replicas ÷ target, highest first), never below its
       min. When the minimums alone exceed the budget, the minimums are kept and the reason says so.
    """
    pools = tuple(pool for pool in POOLS if pool in current)
    for name, keys in (("desired", desired.replicas.keys()), ("bounds", bounds.keys()), ("gpus_per_replica", gpus_per_replica.keys())):
        missing = [pool for pool in pools if pool not in keys]
        if missing:
            raise ValueError(f"{name} has no entry for pool(s) {missing}")
    if hold_seconds < 0 or any(step is not None and step < 1 for step in (max_step_down, max_step_up)):
        raise ValueError("hold_seconds must be ≥ 0, max_step_down and max_step_up (when set) ≥ 1")

    if not data_ok:
        why = f": {data_note}" if data_note else ""
        held = ", ".join(f"{pool} {current[pool]}" for pool in pools)
        return Decision(
            {pool: current[pool] for pool in pools},
            [f"holding current replicas ({held}): planner input data missing or stale{why}"],
            ScaleDownState({}),
            dict.fromkeys(pools, "no-data"),
        )

    replicas: dict[Pool, int] = {}
    targets: dict[Pool, int] = {}
    waiting: dict[Pool, float] = {}
    peaks: dict[Pool, int] = {}
    binding: dict[Pool, Binding] = {}
    reasons: list[str] = []
    for pool in pools:
        low, high = bounds[pool].min_replicas, bounds[pool].max_replicas
        now_n, want = current[pool], desired.replicas[pool]
        target = min(high, max(low, want))
        targets[pool] = target
        binding[pool] = "forecast" if target == want else "bounds"
        if target != want:
            reasons.append(f"{pool}: desired {want} clamped to {'min' if want < low else 'max'} {target}")
        new = now_n
        if target > now_n:
            new = target if max_step_up is None else min(target, now_n + max_step_up)
            limited = f" (step limit {max_step_up}, target {target})" if new < target else ""
            reasons.append(f"{pool}: scale up {now_n} → {new}{limited}")
            if new < target:
                binding[pool] = "step-limit"
        elif target < now_n and safe is not None and max(target, safe.get(pool, now_n)) < now_n:
            new = max(target, safe[pool])
            if max_step_down is not None:
                new = max(new, now_n - max_step_down)
            reasons.append(f"{pool}: scale down {now_n} → {new} at once: even a cautious forecast needs no more")
            if new > target:  # the rest waits for the hold, as any scale-down does
                waiting[pool], peaks[pool] = _hold_so_far(state, pool, target, now)
                binding[pool] = "hold"
        elif target < now_n:
            since, peak = _hold_so_far(state, pool, target, now)
            waited = now - since
            if waited >= hold_seconds:
                new = peak if max_step_down is None else max(peak, now_n - max_step_down)
                limited = f" (step limit {max_step_down}, target {target})" if new > peak else ""
                highest = f" (highest target of the wait {peak})" if peak > target else ""
                binding[pool] = "step-limit" if limited else "hold" if peak > target else binding[pool]
                reasons.append(f"{pool}: scale down {now_n} → {new} after {waited:.0f} s below{highest}{limited}")
                if new > target:
                    waiting[pool] = now  # the next step waits a full hold period again
                    peaks[pool] = target
            else:
                waiting[pool] = since
                peaks[pool] = peak
                binding[pool] = "hold"
                reasons.append(
                    f"{pool}: target {target} below current {now_n} for {waited:.0f} s of the "
                    f"{hold_seconds:.0f} s hold: keeping {now_n}"
                )
        if not low <= new <= high:
            bound = low if new < low else high
            reasons.append(f"{pool}: {new} lies outside [{low}, {high}]: set to {bound} now (bounds skip hysteresis)")
            new = bound
            waiting.pop(pool, None)
            peaks.pop(pool, None)
            binding[pool] = "bounds"
        replicas[pool] = new

    if gpu_budget is not None:
        before = dict(replicas)
        reasons.extend(_fit_budget(replicas, targets, bounds, gpus_per_replica, gpu_budget))
        binding.update({pool: "budget" for pool in pools if replicas[pool] < before[pool]})

    if not reasons:
        reasons.append("no change: " + ", ".join(f"{pool} {replicas[pool]}" for pool in pools))
    return Decision(replicas, reasons, ScaleDownState(waiting, peaks), binding)


def _fit_budget(
    replicas: dict[Pool, int],
    targets: Mapping[Pool, int],
    bounds: Mapping[Pool, v1alpha1.ScalingBounds],
    gpus_per_replica: Mapping[Pool, int],
    budget: int,
) -> list[str]:
    """Take replicas away (in place) until the pools fit `budget` GPUs or only minimums remain."""
    needed = _gpus(replicas, gpus_per_replica)
    if needed <= budget:
        return []
    before = dict(replicas)

    def slack(pool: Pool) -> tuple[float, int, str]:
        # Replicas per replica needed: a pool held above its target by hysteresis has slack > 1 and
        # goes first; a pool whose target is 0 has infinite slack. Ties: the cut that frees more GPUs.
        ratio = replicas[pool] / targets[pool] if targets[pool] else math.inf
        return ratio, gpus_per_replica[pool], pool

    while _gpus(replicas, gpus_per_replica) > budget:
        cuttable = [pool for pool in replicas if replicas[pool] > bounds[pool].min_replicas]
        if not cuttable:
            break
        replicas[max(cuttable, key=slack)] -= 1
    cuts = ", ".join(f"{pool} {before[pool]} → {replicas[pool]}" for pool in replicas if replicas[pool] != before[pool])
    used = _gpus(replicas, gpus_per_replica)
    if used > budget:
        return [
            f"GPU budget {budget}: the minimums alone need {used} GPUs; keeping the minimums"
            + (f" ({cuts})" if cuts else "")
            + ": raise the budget or lower scaling.min"
        ]
    return [f"GPU budget {budget}: {needed} GPUs wanted, cut {cuts} (most slack relative to need first)"]
