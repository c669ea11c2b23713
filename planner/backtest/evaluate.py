"""Evaluate scaling policies on a trace: build the scenario, sweep every policy's knob, score, plot.

Where it sits: the adapter between files (traces, profiles, PNGs, Markdown) and the pure backtest
(`driver`, `fleetsim`, `fluid`, `policies`). `fleetpilot planner backtest` and
`benchmarks/backtest.py` both call it, so the command a user runs and the published benchmark are
the same code.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import math
import multiprocessing
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from scipy.interpolate import PchipInterpolator

from fleetpilot import perfmodel, plots, traces
from fleetpilot.api import profile as profiles
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity, core, predict
from fleetpilot.planner.backtest import driver, fleetsim, fluid, policies, scores
from fleetpilot.planner.backtest.fleetsim import FleetPool

Fidelity = Literal["request", "fluid"]
PREDICTORS = ("constant", "arima", "kalman", "prophet")

# One aggressiveness knob per policy; each sweep runs from lean to generous.
KNOBS: dict[str, tuple[float, ...]] = {
    "static-peak": (0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0),
    "static-mean": (1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
    "hpa": (0.9, 0.7, 0.5, 0.35, 0.25, 0.15),
    "dynamo": (1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
    "dynamo-v1": (1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
    "fleetpilot": (0.5, 0.7, 0.8, 0.9, 0.95, 0.99),
    # The oracle's top is dense: share 1 sizes for every sampled request, the longest included, and on a
    # long fluid trace costs far more than a policy that reaches a 100% score with a few slow requests in
    # a window (ServeGen m-large: 2,196 GPU-h at share 1, Dynamo 1,797 at load factor 3).
    "oracle": (0.6, 0.75, 0.85, 0.9, 0.95, 0.99, 0.995, 0.999, 1.0),
}
# How a sweep goes one step leaner or one step more generous than its ends, to bracket the target
# (None: no further step makes sense).
_LEANER: dict[str, Callable[[float], float | None]] = {
    "static-peak": lambda k: k / 1.5 if k > 0.1 else None,
    "static-mean": lambda k: k / 1.5 if k > 0.1 else None,
    "hpa": lambda k: k + (1.0 - k) / 2 if k < 0.98 else None,
    "dynamo": lambda k: k / 1.5 if k > 0.1 else None,
    "dynamo-v1": lambda k: k / 1.5 if k > 0.1 else None,
    "fleetpilot": lambda k: max(0.5, 1 - 2 * (1 - k)) if k > 0.5 else None,  # risk lies in [0.5, 0.999] (the API's range)
    "oracle": lambda k: k - 0.2 if k > 0.25 else None,
}
_DEARER: dict[str, Callable[[float], float | None]] = {
    "static-peak": lambda k: k * 1.5 if k < 50 else None,
    "static-mean": lambda k: k * 1.5 if k < 50 else None,
    "hpa": lambda k: k / 1.5 if k > 0.02 else None,
    "dynamo": lambda k: k * 1.5 if k < 50 else None,
    "dynamo-v1": lambda k: k * 1.5 if k < 50 else None,
    "fleetpilot": lambda k: min(0.999, 1 - (1 - k) / 2) if k < 0.999 else None,
    "oracle": lambda k: None,  # 1.0: every servable request of every window
}
# Resolution of the arrivals a fluid run of a request trace sees within each step: prompts queue on
# bursts of a second or less (the Azure trace sends dozens in one second at ×4). Finer costs more numpy
# per step and adds Poisson noise that the M/G/c wait already counts.
FLUID_SUB_STEP_S = 0.5
# The history every policy gets before its score counts: a planner in production warm-starts from
# Prometheus (`live.WARM_START_S`), while a replay starts each causal policy knowing nothing. Without it,
# a trace that opens with a burst after a quiet minute (Azure code ×4: 35 req/s at 180 s) fails its first
# 5-minute window for every causal policy at any setting, which says nothing about any of them. Ten
# minutes: longer than the longest startup replayed (600 s), short beside an hour; a replay shorter than
# three of them gets none (`default_burn_in`).
BURN_IN_S = 600.0
# ... and at least this many planning intervals: ten minutes is one ServeGen interval, and a planner that
# has seen one interval plans from the model's guess alone (m-mid's first window failed for fleetpilot
# at every risk), where the live one warm-starts with a week of rates.
BURN_IN_INTERVALS = 10
MAX_EXTENSIONS = 3  # steps a sweep may take past each end of its knob list

KNOB_NAMES = {"static-peak": "load factor", "static-mean": "load factor", "hpa": "target utilisation",
              "dynamo": "load factor", "dynamo-v1": "load factor", "fleetpilot": "risk",
              "oracle": "share of each window's requests sized for"}
# What a user gets without tuning anything: each policy at the setting it ships with or documents.
# static: the sizing for the peak (or mean) interval as it is; HPA: the 50% utilisation target of
# Kubernetes' own HPA walkthrough (the HPA has no default target); Dynamo: the forecast as it comes
# (its planner has no margin setting); fleetpilot: `spec.planner.risk`'s default. The oracle has none.
DEFAULT_KNOBS: dict[str, float] = {"static-peak": 1.0, "static-mean": 1.0, "hpa": 0.5, "dynamo": 1.0,
                                   "dynamo-v1": 1.0, "fleetpilot": core.DEFAULT_RISK}


def knob_kind(group: str) -> str:
    """The sweep a policy group's knob belongs to (every fleetpilot variant shares the risk knob)."""
    return "fleetpilot" if group.startswith("fleetpilot-") else group


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One trace on one fleet under one SLA, ready to run any policy on."""

    name: str
    fidelity: Fidelity
    description: str
    sla: api.SlaTarget
    setting: policies.Setting
    fleet_config: fleetsim.FleetConfig
    duration_s: float
    rates: np.ndarray  # offered requests/s per planning interval
    loads: tuple[policies.IntervalLoad, ...]
    requests: tuple[traces.Request, ...] = ()  # request fidelity
    counts: np.ndarray | None = None  # fluid fidelity: arrivals per step (or per step × sub-step)
    prompt_mix: np.ndarray | None = None  # fluid, request trace: each step's mean prompt service ÷ the trace's
    length_classes: fluid.LengthClasses | None = None  # fluid: request classes whose mix the readings follow
    step_s: float = 60.0
    isl_sample: tuple[int, ...] = ()
    osl_sample: tuple[int, ...] = ()
    known_needs: Mapping[float, Sequence[Mapping[FleetPool, int]]] = dataclasses.field(default_factory=dict)
    # Replayed but not scored nor costed (`scores`): the history a running planner would have.
    burn_in_s: float = 0.0

    @property
    def horizon(self) -> int:
        return max(1, math.ceil(self.setting.startup_s / self.setting.interval_s))

    def make_fleet(self, initial: Mapping[FleetPool, int]) -> driver.FleetModel:
        if self.fidelity == "request":
            return driver.RequestFleet(self.fleet_config, self.requests, initial)
        assert self.counts is not None
        return fluid.FluidFleet(self.fleet_config, self.counts, step_s=self.step_s, isl_sample=self.isl_sample,
                                osl_sample=self.osl_sample, initial=initial, prompt_mix=self.prompt_mix,
                                length_classes=self.length_classes)

    def needs(self, attainment: float) -> list[dict[FleetPool, int]]:
        """The oracle's per-interval needs for this share of each interval's requests."""
        return self.needs_at((attainment,))[attainment]

    def needs_at(self, attainments: Sequence[float], *, workers: int = 1) -> dict[float, list[dict[FleetPool, int]]]:
        """`needs` at several shares, the per-request simulations shared between them (searched by
        `workers` processes; the fluid's search is cheap and runs in this one)."""
        found = {a: [dict(need) for need in self.known_needs[a]] for a in attainments if a in self.known_needs}
        missing = [a for a in dict.fromkeys(attainments) if a not in found]
        if not missing:
            return found
        if self.fidelity == "request":
            return found | driver.request_needs_at(self.requests, self.fleet_config, self.setting,
                                                   attainments=missing, workers=workers)
        fleet = self.make_fleet({"prefill": 0, "decode": 0})
        assert isinstance(fleet, fluid.FluidFleet)
        return found | {a: fluid.fluid_needs(fleet, interval_s=self.setting.interval_s, sla=self.sla, attainment=a,
                                             bounds=self.setting.bounds) for a in missing}


def load_profile(spec: str) -> profiles.Profile:
    """A Profile from a JSON file, or from a Dynamo CSV pair named by its common prefix
    (`.../h200_llama31_8b_fp8_vllm` for `..._prefill.csv` and `..._decode.csv`)."""
    path = Path(spec)
    if path.suffix == ".json":
        return profiles.Profile.model_validate_json(path.read_text())
    prefill, decode = Path(f"{spec}_prefill.csv"), Path(f"{spec}_decode.csv")
    if not (prefill.exists() and decode.exists()):
        raise FileNotFoundError(f"--profile {spec}: neither a .json profile nor a pair {prefill.name}, {decode.name}")
    return profiles.from_dynamo_csv(prefill, decode, model=path.name, engine="vllm", gpu="h200-sxm")


def interval_loads(arrivals: np.ndarray, isl: np.ndarray, osl: np.ndarray, *, interval_s: float,
                   count: int) -> tuple[np.ndarray, tuple[policies.IntervalLoad, ...]]:
    """Requests/s and mean lengths of each of `count` planning intervals (the last takes any later arrival)."""
    index = np.minimum((arrivals // interval_s).astype(int), count - 1)
    n = np.bincount(index, minlength=count)
    isl_sum = np.bincount(index, weights=isl, minlength=count)
    osl_sum = np.bincount(index, weights=osl, minlength=count)
    safe = np.maximum(n, 1)
    rates = n / interval_s
    loads = tuple(policies.IntervalLoad(float(r), float(i), float(o))
                  for r, i, o in zip(rates, isl_sum / safe, osl_sum / safe, strict=True))
    return rates, loads


def scaled_bounds(capacity_model: capacity.CapacityModel, sla: api.SlaTarget,
                  loads: Sequence[policies.IntervalLoad]) -> dict[FleetPool, tuple[int, int]]:
    """Replica bounds a user with this traffic would set: 1 to 4× what the planner's sizing wants for
    the trace's busiest interval (at least 8), so that no policy is capped by a bound sized for other
    traffic (a fixed ceiling of 512 capped every policy of ServeGen m-mid, the oracle too)."""
    unbounded = policies.Setting(capacity=capacity_model, sla=sla, interval_s=60.0, startup_s=0.0,
                                 bounds={"prefill": (1, UNBOUNDED), "decode": (1, UNBOUNDED)})
    peak = policies.static_replicas(unbounded, loads, level="peak", factor=1.0)
    return {pool: (1, max(8, 4 * peak[pool])) for pool in fleetsim.FLEET_POOLS}


UNBOUNDED = 10**6  # replicas: a bound no trace reaches, for sizing before the bounds are known


def scenario_from_trace(name: str, path: Path, *, profile: profiles.Profile, sla: api.SlaTarget,
                        rate_factor: float = 1.0, duration_s: float | None = None, interval_s: float = 60.0,
                        startup_s: float = 120.0, timing: perfmodel.PerformanceModel | None = None,
                        bounds: Mapping[FleetPool, tuple[int, int]] | None = None, fidelity: Fidelity = "request",
                        fluid_step_s: float = 10.0, seed: int = 0, burn_in_s: float | None = 0.0,
                        workers: int = 1, tenant_shift_s: float | None = None) -> Scenario:
    """A request trace (Azure, Mooncake) replayed at `rate_factor`, per request or as a fluid.

    `seed` drives the rate scaling's random choices: graphs cut from one trace at one rate differ by it.
    `tenant_shift_s`: the copies above rate 1 are other tenants, each shifted up to this (`traces.rate_scale`).
    `burn_in_s`: replayed first, neither scored nor costed (None: `default_burn_in`). `workers`:
    processes for the oracle's search that sets the replica bounds.
    """
    shape = traces.Shape(rate_factor=rate_factor, duration_s=duration_s, seed=seed, tenant_shift_s=tenant_shift_s)
    requests = tuple(traces.load(path, shape=shape))
    if not requests:
        raise ValueError(f"{path}: no requests in the chosen window")
    duration = duration_s or math.ceil(requests[-1].arrival_s / interval_s) * interval_s
    burn_in_s = _checked_burn_in(burn_in_s, duration, interval_s)
    count = max(1, math.ceil(duration / interval_s))
    arrivals = np.array([r.arrival_s for r in requests])
    isl = np.array([r.input_tokens for r in requests], dtype=float)
    osl = np.array([r.output_tokens for r in requests], dtype=float)
    rates, loads = interval_loads(arrivals, isl, osl, interval_s=interval_s, count=count)
    config = fleet_config(timing or default_timing(), startup_s)
    beliefs = capacity.CapacityModel(profile)
    known: dict[float, Sequence[Mapping[FleetPool, int]]] = {}
    if bounds is None and fidelity == "fluid":
        bounds = scaled_bounds(beliefs, sla, loads)
    elif bounds is None:
        bounds, known[1.0] = _bounds_from_needs(requests, config, sla, loads, beliefs, interval_s=interval_s,
                                                startup_s=startup_s, workers=workers)
    # The fluid sees the trace's arrivals per sub-step: its bursts, not only its rate per step.
    per = max(1, round(fluid_step_s / FLUID_SUB_STEP_S))
    cells = max(1, math.ceil(duration / fluid_step_s)) * per
    counts = np.bincount(np.minimum((arrivals // (fluid_step_s / per)).astype(int), cells - 1),
                         minlength=cells).astype(float).reshape(-1, per)
    return Scenario(
        name=name, fidelity=fidelity, sla=sla, duration_s=duration, rates=rates, loads=loads,
        description=(f"{path.name}, rate ×{rate_factor:g}"
                     f"{'' if tenant_shift_s is None or rate_factor <= 1 else f' as tenants (each copy shifted up to {tenant_shift_s:g} s)'}"
                     f": {len(requests):,} requests over {duration / 3600:.2f} h, "
                     f"mean {len(requests) / duration:.2f} req/s, ISL {isl.mean():,.0f}, OSL {osl.mean():,.0f}"),
        setting=policies.Setting(capacity=beliefs, sla=sla, interval_s=interval_s, startup_s=startup_s,
                                 bounds=bounds, gpus_per_replica=config.gpus["decode"],
                                 decode_batch_cap=config.max_num_seqs),
        fleet_config=config, requests=requests, counts=counts, step_s=fluid_step_s,
        prompt_mix=fluid.step_prompt_mix(config.timing, config.max_batched_tokens, arrivals, isl,
                                         step_s=fluid_step_s, steps=len(counts)),
        isl_sample=tuple(int(v) for v in isl), osl_sample=tuple(int(v) for v in osl), known_needs=known,
        burn_in_s=burn_in_s,
    )


def default_burn_in(duration_s: float, *, interval_s: float) -> float:
    """`BURN_IN_S` or `BURN_IN_INTERVALS` planning intervals, whichever is longer, for a replay of three
    of them or more; none for a shorter one, which it would mostly eat."""
    burn_in = max(BURN_IN_S, BURN_IN_INTERVALS * interval_s)
    return burn_in if duration_s >= 3 * burn_in else 0.0


def _checked_burn_in(burn_in_s: float | None, duration_s: float, interval_s: float) -> float:
    if burn_in_s is None:
        return default_burn_in(duration_s, interval_s=interval_s)
    if not 0.0 <= burn_in_s < duration_s:
        raise ValueError(f"burn-in {burn_in_s:g} s must be at least 0 and shorter than the replay "
                         f"({duration_s:g} s): shorten it or replay more of the trace")
    return burn_in_s


def _bounds_from_needs(requests: Sequence[traces.Request], config: fleetsim.FleetConfig, sla: api.SlaTarget,
                       loads: Sequence[policies.IntervalLoad], beliefs: capacity.CapacityModel, *,
                       interval_s: float, startup_s: float, workers: int = 1,
                       ) -> tuple[dict[FleetPool, tuple[int, int]], list[dict[FleetPool, int]]]:
    """Bounds that cap no policy: the planner's scaled bounds, raised to twice what the oracle needs
    anywhere (what the planner believes can be far from what the fleet needs: on Mooncake ×4 it
    sized decode at 3 where the oracle needs 17), and the oracle's needs for every request."""
    believed = scaled_bounds(beliefs, sla, loads)
    wide = {pool: (1, 4 * hi) for pool, (_, hi) in believed.items()}
    setting = policies.Setting(capacity=beliefs, sla=sla, interval_s=interval_s, startup_s=startup_s, bounds=wide)
    needs = driver.request_needs(requests, config, setting, attainment=1.0, workers=workers)
    raised = {pool: (1, max(hi, 2 * max((need[pool] for need in needs), default=1)))
              for pool, (_, hi) in believed.items()}
    return raised, needs


def scenario_from_servegen(name: str, path: Path, *, profile: profiles.Profile, sla: api.SlaTarget,
                           rate_factor: float, model: str = "m-large", interval_s: float = 600.0,
                           step_s: float = 60.0, startup_s: float = 120.0,
                           synthesis: traces.Synthesis | None = None, seed: int = 0,
                           bounds: Mapping[FleetPool, tuple[int, int]] | None = None,
                           timing: perfmodel.PerformanceModel | None = None,
                           burn_in_s: float | None = 0.0, reading: RateReading = "step") -> Scenario:
    """The ServeGen rate series as a fluid: Poisson arrival counts per step at rate × `rate_factor`,
    lengths drawn from `synthesis` (the series has none); `burn_in_s` as in `scenario_from_trace`;
    `reading`: how the rate runs within a window (`read_rates`)."""
    synthesis = synthesis or traces.Synthesis()
    windows = traces.load_rate_series(path, model=model)
    if not windows:
        present = traces.rate_series_models(path)
        raise ValueError(f"{path.name} has no model {model!r}; it has {', '.join(present) or 'none'}")
    length = traces.window_length([w.t_start_s for w in windows])
    per = max(1, round(length / step_s))
    step_rates = read_rates([w.rate_rps * rate_factor for w in windows], per=per, reading=reading)
    counts = fluid.poisson_counts(step_rates, step_s=step_s, seed=seed)
    rng = np.random.default_rng(seed)
    isl = traces.draw_lengths(rng, synthesis.input_length, 4000)
    osl = traces.draw_lengths(rng, synthesis.output_length, 4000)
    duration = len(counts) * step_s
    burn_in_s = _checked_burn_in(burn_in_s, duration, interval_s)
    per_interval = max(1, round(interval_s / step_s))
    rates = counts.reshape(-1, per_interval).sum(axis=1) / interval_s
    loads = tuple(policies.IntervalLoad(float(r), float(isl.mean()), float(osl.mean())) for r in rates)
    beliefs = capacity.CapacityModel(profile)
    config = fleet_config(timing or default_timing(), startup_s)
    return Scenario(
        name=name, fidelity="fluid", sla=sla, duration_s=duration, rates=rates, loads=loads,
        description=(f"{path.name} {model}, rate ×{rate_factor:g}: {len(windows):,} windows of {length:.0f} s "
                     f"read {'as steps' if reading == 'step' else 'smooth (PCHIP through the counts)'} "
                     f"({duration / 86400:.0f} days), Poisson arrivals, mean {counts.sum() / duration:.1f} req/s "
                     f"(peak {step_rates.max():.1f}); lengths lognormal, ISL mean {synthesis.input_length.mean:g}, "
                     f"OSL mean {synthesis.output_length.mean:g}"),
        setting=policies.Setting(capacity=beliefs, sla=sla, interval_s=interval_s, startup_s=startup_s,
                                 bounds=bounds or scaled_bounds(beliefs, sla, loads),
                                 gpus_per_replica=config.gpus["decode"], decode_batch_cap=config.max_num_seqs),
        fleet_config=config, counts=counts,
        step_s=step_s, isl_sample=tuple(int(v) for v in isl), osl_sample=tuple(int(v) for v in osl),
        burn_in_s=burn_in_s,
    )


def scenario_from_counts(name: str, counts: np.ndarray, *, profile: profiles.Profile, sla: api.SlaTarget,
                         step_s: float, isl_sample: Sequence[int], osl_sample: Sequence[int], description: str,
                         interval_s: float = 60.0, startup_s: float = 120.0,
                         interval_lengths: Sequence[tuple[float, float]] | None = None,
                         prompt_mix: np.ndarray | None = None,
                         length_classes: fluid.LengthClasses | None = None,
                         bounds: Mapping[FleetPool, tuple[int, int]] | None = None,
                         timing: perfmodel.PerformanceModel | None = None,
                         burn_in_s: float | None = 0.0) -> Scenario:
    """Arrival counts per fluid step (a generated series: `family`) as a fluid scenario.

    `interval_lengths`: each planning interval's (mean prompt, mean output) length, what the static
    sizings read (None: the sample's means throughout); `prompt_mix`: each step's mean prompt service
    over the sample's, and `length_classes` the classes whose mix each window's readings follow
    (`FluidFleet`); `burn_in_s` as in `scenario_from_trace`. The counts must fill whole planning intervals.
    """
    counts = np.asarray(counts, dtype=float)
    per_interval = round(interval_s / step_s)
    if per_interval < 1 or not math.isclose(per_interval * step_s, interval_s) or len(counts) % per_interval:
        raise ValueError(f"{len(counts)} steps of {step_s:g} s do not fill whole planning intervals of {interval_s:g} s")
    isl, osl = np.asarray(isl_sample, dtype=float), np.asarray(osl_sample, dtype=float)
    duration = len(counts) * step_s
    burn_in_s = _checked_burn_in(burn_in_s, duration, interval_s)
    rates = counts.reshape(-1, per_interval).sum(axis=1) / interval_s
    means = interval_lengths or [(float(isl.mean()), float(osl.mean()))] * len(rates)
    if len(means) != len(rates):
        raise ValueError(f"interval_lengths has {len(means)} entries for {len(rates)} planning intervals")
    loads = tuple(policies.IntervalLoad(float(r), float(i), float(o)) for r, (i, o) in zip(rates, means, strict=True))
    beliefs = capacity.CapacityModel(profile)
    config = fleet_config(timing or default_timing(), startup_s)
    return Scenario(
        name=name, fidelity="fluid", sla=sla, duration_s=duration, rates=rates, loads=loads, description=description,
        setting=policies.Setting(capacity=beliefs, sla=sla, interval_s=interval_s, startup_s=startup_s,
                                 bounds=bounds or scaled_bounds(beliefs, sla, loads),
                                 gpus_per_replica=config.gpus["decode"], decode_batch_cap=config.max_num_seqs),
        fleet_config=config, counts=counts, prompt_mix=prompt_mix, length_classes=length_classes, step_s=step_s,
        isl_sample=tuple(int(v) for v in isl), osl_sample=tuple(int(v) for v in osl), burn_in_s=burn_in_s,
    )


RateReading = Literal["step", "smooth"]
RATE_READINGS: tuple[RateReading, ...] = ("step", "smooth")


def read_rates(window_rates: Sequence[float], *, per: int, reading: RateReading) -> np.ndarray:
    """The rate of each of `per` steps per window of a series of window means (pure).

    A series of means says nothing of the rate within a window. "step": constant within each, so the
    rate jumps at every boundary (within a second, at any size of jump). "smooth": the rate of a
    monotone cubic (PCHIP) through the cumulative count at the windows' boundaries: each window keeps
    its mean exactly, the rate is continuous where the counts allow and never negative.
    """
    rates = np.asarray(window_rates, dtype=float)
    if reading == "step":
        return np.repeat(rates, per)
    if reading != "smooth":
        raise ValueError(f"reading must be one of {', '.join(RATE_READINGS)}, got {reading!r}")
    if len(rates) < 2:
        return np.repeat(rates, per)
    boundaries = np.arange(len(rates) + 1, dtype=float)
    cumulative = PchipInterpolator(boundaries, np.concatenate(([0.0], np.cumsum(rates))))
    counts = np.diff(cumulative(np.arange(len(rates) * per + 1) / per))
    rates_within: np.ndarray = np.maximum(counts, 0.0) * per  # ≥ 0 up to rounding
    return rates_within


def default_timing() -> perfmodel.PerformanceModel:
    """The fleet's truth: the calibrated vLLM H200 model of Llama-3.1-8B (the simulator's default)."""
    return perfmodel.PerformanceModel(perfmodel.MODELS["llama-3.1-8b"], perfmodel.GPUS["h200-sxm"])


def fleet_config(timing: perfmodel.PerformanceModel, startup_s: float) -> fleetsim.FleetConfig:
    """A fleet whose replicas run `timing`: each holds all its GPUs (tensor × pipeline, on every node
    of a multinode group), which is what GPU-hours and budgets count."""
    gpus = timing.tensor_parallel * timing.pipeline_parallel
    return fleetsim.FleetConfig(timing=timing, startup_s=startup_s, gpus=dict.fromkeys(fleetsim.FLEET_POOLS, gpus))


def replica_timing(text: str) -> perfmodel.PerformanceModel:
    """`--replica MODEL[,tp=N][,pp=N][,nodes=N][,gpu=NAME][,engine=NAME]`: the fleet's replicas as the
    performance model runs them, e.g. `llama-3.1-70b,tp=16,nodes=2` for a 70B decode group of two
    8-GPU nodes (TP16 across them)."""
    model, *options = [part.strip() for part in text.split(",")]
    fields = {"tp": "1", "pp": "1", "nodes": "1", "gpu": "h200-sxm", "engine": "vllm"}
    for option in options:
        key, _, value = option.partition("=")
        if key not in fields:
            raise ValueError(f"--replica: unknown option {key!r}; use tp=, pp=, nodes=, gpu= and engine=")
        fields[key] = value
    for name, table in ((model, perfmodel.MODELS), (fields["gpu"], perfmodel.GPUS),
                        (fields["engine"], perfmodel.CALIBRATIONS)):
        if name not in table:
            raise ValueError(f"--replica: unknown {name!r}; choose from {', '.join(sorted(table))}")
    try:
        tp, pp, nodes = int(fields["tp"]), int(fields["pp"]), int(fields["nodes"])
    except ValueError as error:
        raise ValueError(f"--replica {text!r}: tp, pp and nodes are whole numbers") from error
    timing = perfmodel.PerformanceModel(perfmodel.MODELS[model], perfmodel.GPUS[fields["gpu"]], tp, pp, nodes=nodes,
                                        calibration=perfmodel.CALIBRATIONS[fields["engine"]])
    if timing.kv_capacity_tokens() < 1:
        raise ValueError(f"--replica {text!r}: the model does not fit {tp * pp} GPUs' memory")
    return timing


def model_profile(timing: perfmodel.PerformanceModel) -> profiles.Profile:
    """What the planner believes when told `--profile perfmodel`: the performance model of the fleet's
    own replicas, on the grid a measured profile covers."""
    return profiles.from_performance_model(
        timing, isls=[128, 512, 1024, 2048, 4096, 8192, 16384, 32768],
        contexts=[512, 1024, 2048, 4096, 8192, 16384, 32768], concurrencies=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512])


# -- running the sweeps ---------------------------------------------------------------------------------


PREDICTIVE_ONLY = "-predictive"  # a fleetpilot group with this suffix runs without the fast path
MEAN_LENGTHS = "-mean"  # ... and with this one sizes every request at the mean lengths, not their mix


def groups(predictors: Sequence[str], *, predictive_only: Sequence[str] = (),
           mean_lengths: Sequence[str] = ()) -> list[str]:
    """The units of work a sweep splits into (each keeps its own forecast memo); `predictive_only`
    names the predictors also run without the planner's fast path, `mean_lengths` those also run
    sizing at the mean lengths."""
    return ["static-peak", "static-mean", "hpa", "dynamo", "dynamo-v1", *(f"fleetpilot-{p}" for p in predictors),
            *(f"fleetpilot-{p}{PREDICTIVE_ONLY}" for p in predictive_only),
            *(f"fleetpilot-{p}{MEAN_LENGTHS}" for p in mean_lengths), "oracle"]


@dataclasses.dataclass(frozen=True)
class GroupResult:
    name: str
    results: list[driver.RunResult]
    seconds_per_run: float
    mape: float | None = None  # fleetpilot groups: forecast error at the planner's horizon


def _bracket(results: list[driver.RunResult], one: Callable[[float], driver.RunResult], *, target: float,
             leaner: Callable[[float], float | None], dearer: Callable[[float], float | None]) -> list[driver.RunResult]:
    """Settings past the ends of a sweep (`results`, in knob order from lean to generous) until its
    cheapest run misses the SLA and its dearest meets it, so that the cost to meet the SLA is read
    between two runs, not at the end of a range."""
    added: list[driver.RunResult] = []

    def cheapest_meets(runs: list[driver.RunResult]) -> bool:
        return min(runs, key=lambda run: run.gpu_hours).effective >= target

    def dearest_misses(runs: list[driver.RunResult]) -> bool:
        return max(run.effective for run in runs) < target

    for step, wants, end in ((leaner, cheapest_meets, results[0].knob), (dearer, dearest_misses, results[-1].knob)):
        for _ in range(MAX_EXTENSIONS):
            every = results + added
            if not wants(every):
                break
            knob = step(end)
            if knob is None or any(abs(r.knob - knob) < 1e-9 for r in every):
                break
            added.append(one(knob))
            end = knob
    return added


def run_group(scenario: Scenario, group: str, *, knobs: Mapping[str, Sequence[float]] = KNOBS,
              needs: Sequence[Mapping[FleetPool, int]] | None = None, bracket: bool = True) -> GroupResult:
    """Every knob setting of one policy on `scenario`, extended until the sweep brackets the SLA (unless
    `bracket` is off); `needs` are the oracle's for every request (share 1), if known."""
    setting = scenario.setting
    exact_needs = list(needs) if needs is not None else scenario.needs(1.0)
    # Every dynamic policy takes over a fleet that was right for the start of the trace (the oracle's
    # first decision), as if it had been running before: the comparison is about following the load,
    # not about a cold start that every reactive policy would lose the same way.
    start = policies.lookahead_targets(exact_needs[:scenario.horizon + 1], interval_s=setting.interval_s,
                                       startup_s=setting.startup_s)[0]
    memo: policies.MemoPredictor | None = None
    factory: Callable[[float], policies.Policy]
    if group in ("static-peak", "static-mean"):
        level = group.removeprefix("static-")
        def factory(k: float) -> policies.Policy:
            return policies.Static(setting, scenario.loads, level=level, factor=k)
        values = knobs[group]
    elif group == "hpa":
        def factory(k: float) -> policies.Policy:
            return policies.Hpa(setting, target=k, initial=start)
        values = knobs["hpa"]
    elif group == "dynamo":  # its documented default predictor, on its 180 s throughput interval
        arima = policies.MemoPredictor(predict.make_predictor("arima"))
        def factory(k: float) -> policies.Policy:
            return policies.Dynamo(setting, arima, factor=k, initial=start)
        values = knobs["dynamo"]
    elif group == "dynamo-v1":
        arima = policies.MemoPredictor(predict.make_predictor("arima"))
        def factory(k: float) -> policies.Policy:
            return policies.DynamoV1(setting, arima, factor=k, initial=start)
        values = knobs["dynamo-v1"]
    elif group.startswith("fleetpilot-"):
        name = group.removeprefix("fleetpilot-")
        length_mix = not name.endswith(MEAN_LENGTHS)
        name = name.removesuffix(MEAN_LENGTHS)
        fast_path = not name.endswith(PREDICTIVE_ONLY)
        name = name.removesuffix(PREDICTIVE_ONLY)
        memo = policies.MemoPredictor(predict.make_predictor(name))
        chosen = memo
        def factory(k: float) -> policies.Policy:
            return policies.Fleetpilot(setting, chosen, predictor_name=name, risk=k, initial=start,
                                       reactive=fast_path, length_mix=length_mix)
        values = knobs["fleetpilot"]
    elif group == "oracle":
        values = knobs["oracle"]
        shares: dict[float, Sequence[Mapping[FleetPool, int]]] = {1.0: exact_needs}
        shares.update(scenario.needs_at([k for k in values if k not in shares]))  # one pass for the sweep
        def factory(k: float) -> policies.Policy:
            if k not in shares:  # a step past the sweep's ends
                shares[k] = scenario.needs(k)
            return policies.Oracle(setting, shares[k], knob=k)
    else:
        raise ValueError(f"unknown policy group {group!r}")
    def one(knob: float) -> driver.RunResult:
        policy = factory(knob)
        return driver.run(scenario.make_fleet(policy.initial()), policy, duration_s=scenario.duration_s,
                          interval_s=setting.interval_s, sla=scenario.sla, scored_from_s=scenario.burn_in_s)

    began = time.perf_counter()
    results = [one(knob) for knob in values]
    kind = knob_kind(group)
    if bracket:
        results += _bracket(results, one, target=scenario.sla.percentile / 100.0, leaner=_LEANER[kind],
                            dearer=_DEARER[kind])
    seconds = (time.perf_counter() - began) / len(results)
    mape = None
    if memo is not None:
        mape = driver.forecast_mape(list(scenario.rates), memo, horizon=scenario.horizon,
                                      interval_s=setting.interval_s)
    return GroupResult(group, results, seconds, mape)


REPLAY_PERIOD_S = 5.0  # the fast loops' period: a replay applies their changes at the same ticks


def replay(scenario: Scenario, result: driver.RunResult) -> driver.RunResult:
    """`result`'s fleet, change by change, on `scenario`'s fleet model."""
    interval = scenario.setting.interval_s
    changes = result.timeline.changes
    between = any(abs(t / interval - round(t / interval)) > 1e-6 for t, _ in changes)
    policy = policies.Replay(result.policy, result.knob, changes,
                             period_s=REPLAY_PERIOD_S if between else None)
    return driver.run(scenario.make_fleet(policy.initial()), policy, duration_s=scenario.duration_s,
                      interval_s=scenario.setting.interval_s, sla=scenario.sla, scored_from_s=scenario.burn_in_s)


_SHARED: dict[str, Any] = {}


def _run_shared(group: str) -> GroupResult:
    scenario: Scenario = _SHARED["scenario"]
    return run_group(scenario, group, knobs=_SHARED["knobs"], needs=_SHARED["needs"])


def run_all(scenario: Scenario, *, predictors: Sequence[str] = PREDICTORS, workers: int = 1,
            knobs: Mapping[str, Sequence[float]] = KNOBS,
            progress: Callable[[GroupResult], None] | None = None,
            predictive_only: Sequence[str] = (), mean_lengths: Sequence[str] = ()) -> dict[str, GroupResult]:
    """Every policy group on `scenario`, in `workers` processes (forked: the scenario is shared, not sent)."""
    names = groups(predictors, predictive_only=predictive_only, mean_lengths=mean_lengths)
    # Once: every group's starting fleet (sized for every request of the first intervals: a fleet sized
    # for 90% of them leaves a backlog no policy clears before the first 5-minute window ends), and the oracle.
    needs = scenario.needs(1.0)
    if "oracle" in names and workers > 1:
        # The oracle's sweep, searched by every process before the groups start (in one process, at ×16
        # it took longer than all the other groups of the row together).
        scenario = dataclasses.replace(scenario, known_needs={
            **scenario.known_needs, **scenario.needs_at(knobs["oracle"], workers=workers)})
    done: dict[str, GroupResult] = {}
    if workers <= 1:
        for name in names:
            done[name] = run_group(scenario, name, knobs=knobs, needs=needs)
            if progress:
                progress(done[name])
        return done
    _SHARED.update(scenario=scenario, knobs=knobs, needs=needs)
    # The slowest groups first, so the pool ends evenly: the model-based forecasters (the fits).
    def slowest_first(name: str) -> int:
        forecasts = name.startswith(("fleetpilot-", "dynamo")) and not name.startswith("fleetpilot-constant")
        return 0 if forecasts else 1
    order = sorted(names, key=slowest_first)
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {pool.submit(_run_shared, name): name for name in order}
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            done[result.name] = result
            if progress:
                progress(result)
    return {name: done[name] for name in names}


# -- several graphs under one GPU budget ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BudgetGraph:
    """One graph of a shared-budget backtest: its scenario (trace, rate, SLA) and its priority."""

    scenario: Scenario
    priority: int = 0


@dataclasses.dataclass(frozen=True)
class BudgetResult:
    """The graphs under the shared budget, and each alone with no budget: what the budget cost it."""

    graphs: tuple[BudgetGraph, ...]
    shared: driver.SharedRun
    alone: Mapping[str, driver.RunResult]
    predictor: str
    risk: float


def _budget_graph(graph: BudgetGraph, *, predictor: str, risk: float) -> driver.SharedGraph:
    scenario = graph.scenario
    # A fleet that was right for the start of the trace, as the planner sizes (for the peak of the
    # intervals until a new replica is ready): the comparison is about sharing, not a cold start.
    start = policies.static_replicas(scenario.setting, scenario.loads[:scenario.horizon + 1], level="peak",
                                     factor=1.0)
    policy = policies.Fleetpilot(scenario.setting, predict.make_predictor(predictor), predictor_name=predictor,
                                 risk=risk, initial=start)
    return driver.SharedGraph(scenario.name, graph.priority, scenario.make_fleet(policy.initial()), policy)


def run_budget(graphs: Sequence[BudgetGraph], *, budget: int, predictor: str = "constant",
               risk: float = 0.9) -> BudgetResult:
    """fleetpilot's planner on every graph under one shared GPU budget (`driver.run_shared`), and on each
    graph alone with no budget. The graphs share the planning interval; the run lasts the longest trace."""
    intervals = {graph.scenario.setting.interval_s for graph in graphs}
    if len(intervals) != 1:
        raise ValueError(f"graphs sharing a budget must share the planning interval, got {sorted(intervals)}")
    interval_s = intervals.pop()
    duration_s = max(graph.scenario.duration_s for graph in graphs)
    shared = driver.run_shared([_budget_graph(g, predictor=predictor, risk=risk) for g in graphs],
                               budget=budget, duration_s=duration_s, interval_s=interval_s)
    alone = {}
    for graph in graphs:
        solo = _budget_graph(graph, predictor=predictor, risk=risk)
        alone[solo.name] = driver.run(solo.fleet, solo.policy, duration_s=duration_s, interval_s=interval_s,
                                      sla=graph.scenario.sla)
    return BudgetResult(tuple(graphs), shared, alone, predictor, risk)


def budget_markdown(result: BudgetResult, *, png: Mapping[str, str]) -> str:
    """The shared-budget backtest's table: per graph, under the budget against alone."""
    shared = result.shared
    lines = [f"## Shared GPU budget: {shared.budget} GPUs", "",
             (f"fleetpilot-{result.predictor} (risk {result.risk:g}) on every graph; each interval a graph "
              "is granted its share of the budget from every graph's latest claim (minimums first, then by "
              "priority), as the live planner grants it. \"alone\" is the same graph with no budget."), ""]
    lines += [("| graph | priority | trace | attainment (shared / alone) | GPU-hours (shared / alone) "
               "| intervals capped | mean GPUs granted |"), "|---|---:|---|---:|---:|---:|---:|"]
    for graph in result.graphs:
        name = graph.scenario.name
        run, solo = shared.runs[name], result.alone[name]
        lines.append(f"| {name} | {graph.priority} | {graph.scenario.description} | {run.attainment:.1%} / "
                     f"{solo.attainment:.1%} | {run.gpu_hours:.2f} / {solo.gpu_hours:.2f} | "
                     f"{shared.capped_share(name):.0%} | {shared.granted[name].mean():.1f} |")
    lines.append("")
    for title, file in png.items():
        lines += [f"![{title}]({file})", ""]
    return "\n".join(lines)


# -- reading the results --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Summary:
    """One policy's sweep, read against the SLA (see `scores` for what meeting it means)."""

    policy: str
    to_meet: scores.CostToMeet  # GPU-hours to meet the SLA
    at_99: scores.CostToMeet  # GPU-hours to 99% request-level attainment
    best_effective: float
    cheapest_meeting: driver.RunResult | None
    touched_bound: bool  # some run asked for a pool's maximum: the bound, not the policy, may have decided
    monotone: bool  # along the sweep, dearer runs never scored worse (by more than half a point)
    undercuts_oracle: tuple[float, ...] = ()  # knobs of runs that reached a score for less than the oracle
    at_default: driver.RunResult | None = None  # the run at the policy's default setting (`DEFAULT_KNOBS`)

    @property
    def gpu_hours_at_target(self) -> float | None:
        return self.to_meet.gpu_hours


def touched_bound(result: driver.RunResult, bounds: Mapping[FleetPool, tuple[int, int]]) -> bool:
    return any(len(result.timeline.active[pool]) and int(result.timeline.active[pool].max()) >= hi
               for pool, (_, hi) in bounds.items())


def summarise(groups_done: Mapping[str, GroupResult], scenario: Scenario) -> dict[str, Summary]:
    target = scenario.sla.percentile / 100.0
    oracle = groups_done.get("oracle")
    out = {}
    for name, group in groups_done.items():
        results = group.results
        meeting = [r for r in results if r.effective >= target]
        by_cost = sorted(results, key=lambda r: r.gpu_hours)
        undercuts: list[float] = []
        if oracle is not None and name != "oracle":
            for r in results:
                theirs = driver.cost_to_meet(oracle.results, r.effective)
                if theirs.bracketed and theirs.gpu_hours is not None and r.gpu_hours < theirs.gpu_hours - 1e-9:
                    undercuts.append(r.knob)
        out[name] = Summary(
            policy=name, to_meet=driver.cost_to_meet(results, target),
            at_99=driver.cost_to_meet(results, 0.99, score=lambda r: r.request_attainment),
            best_effective=max(r.effective for r in results),
            cheapest_meeting=min(meeting, key=lambda r: r.gpu_hours) if meeting else None,
            touched_bound=any(touched_bound(r, scenario.setting.bounds) for r in results),
            monotone=all(b.effective >= a.effective - 0.005 for a, b in itertools.pairwise(by_cost)),
            undercuts_oracle=tuple(undercuts),
            at_default=next((r for r in results if knob_kind(name) in DEFAULT_KNOBS
                             and math.isclose(r.knob, DEFAULT_KNOBS[knob_kind(name)])), None),
        )
    return out


def default_cell(summary: Mapping[str, Summary], name: str) -> str:
    """A policy at its default setting, for a table: its GPU-hours over the oracle's to meet the SLA, and
    whether it met the SLA there (else its score). "—": the policy has no default, or it was not run."""
    run = summary[name].at_default
    oracle = summary["oracle"].gpu_hours_at_target if "oracle" in summary else None
    if run is None or not oracle:
        return "—"
    ratio = run.gpu_hours / oracle
    target = run.scores.target if run.scores is not None else 0.9
    return f"{ratio:.2f} met" if run.effective >= target - 1e-12 else f"{ratio:.2f} missed ({run.effective:.1%})"


def best_fleetpilot(summary: Mapping[str, Summary]) -> str | None:
    reached = [(s.gpu_hours_at_target, name) for name, s in summary.items()
               if name.startswith("fleetpilot-") and s.gpu_hours_at_target is not None]
    return min(reached)[1] if reached else None


def ratio_to_oracle(summary: Mapping[str, Summary], name: str) -> float | None:
    """A policy's GPU-hours to meet the SLA over the oracle's (None: either never met it)."""
    ours, oracle = summary[name].gpu_hours_at_target, summary["oracle"].gpu_hours_at_target
    return ours / oracle if ours is not None and oracle else None


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "not met" if value is None else format(value, spec)


def flags(s: Summary) -> str:
    """What to keep in mind when reading a policy's row."""
    out = []
    if s.to_meet.gpu_hours is not None and not s.to_meet.bracketed:
        out.append("not bracketed: " + s.to_meet.note)
    if s.touched_bound:
        out.append("touched a replica bound")
    if not s.monotone:
        out.append("non-monotone sweep")
    if s.undercuts_oracle:
        out.append("undercut the oracle at " + ", ".join(f"{k:g}" for k in s.undercuts_oracle))
    return "; ".join(out) or "—"


def markdown_section(scenario: Scenario, groups_done: Mapping[str, GroupResult], *, png: Mapping[str, str]) -> str:
    """One scenario's tables: GPU-hours to meet the SLA, every sweep point, forecast accuracy."""
    summary = summarise(groups_done, scenario)
    target = scenario.sla.percentile / 100.0
    first = next(iter(groups_done.values())).results[0].scores
    excluded = (f"{first.excluded:,} of {first.requests:,} requests ({first.excluded / max(first.requests, 1):.1%}) "
                "could not meet the SLA even alone on an idle replica: excluded from every policy's score."
                if first is not None else "")
    bounds = ", ".join(f"{pool} {lo}–{hi}" for pool, (lo, hi) in scenario.setting.bounds.items())
    lines = [f"## {scenario.name}", "", scenario.description + ".", "",
             (f"SLA: TTFT ≤ {scenario.sla.ttft_ms:g} ms and mean ITL ≤ {scenario.sla.itl_ms:g} ms for "
              f"{target:.0%} of requests, and for {target - scores.WINDOW_SLACK:.0%} in every 5-minute window; "
              f"planning interval {scenario.setting.interval_s:g} s; replica startup {scenario.setting.startup_s:g} s; "
              f"replica bounds {bounds}; fleet model: "
              f"{'per request' if scenario.fidelity == 'request' else 'fluid'}; {burn_in_note(scenario)}. {excluded}"),
             ""]
    lines += ["### GPU-hours to meet the SLA", "",
              ("| policy | GPU-h to meet | ÷ oracle | GPU-h at 99% of requests | best score "
               "| cheapest setting that met it | flags |"), "|---|---:|---:|---:|---:|---|---|"]
    for name, s in summary.items():
        knob = KNOB_NAMES[knob_kind(name)]
        r = s.cheapest_meeting
        where = "—" if r is None else (
            f"{knob} {r.knob:g}: {r.gpu_hours:.2f} GPU-h, {r.request_attainment:.1%} of requests, worst 5 min "
            f"{_worst(r)}, {r.goodput_per_gpu_hour:,.0f} good req/GPU-h, {r.actions} actions")
        ratio = ratio_to_oracle(summary, name)
        lines.append(f"| {name} | {_fmt(s.gpu_hours_at_target)} | {_fmt(ratio)} | {_fmt(s.at_99.gpu_hours)} "
                     f"| {s.best_effective:.1%} | {where} | {flags(s)} |")
    lines += ["", ("Score: request-level attainment, capped at the worst 5-minute window + 5 points; the SLA is "
                   f"met at {target:.0%}. GPU-hours to meet it are interpolated from the dearest sweep setting "
                   "that missed the target to the cheapest that met it."), "",
              "### Every sweep point", "",
              ("| policy | knob | GPU-hours | requests met | worst 5 min | score | intervals met | good req / GPU-h "
               "| actions | failed |"), "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, group in groups_done.items():
        for r in sorted(group.results, key=lambda r: r.gpu_hours):
            lines.append(f"| {name} | {r.knob:g} | {r.gpu_hours:.2f} | {r.request_attainment:.1%} | {_worst(r)} "
                         f"| {r.effective:.1%} | {r.attainment:.1%} | {r.goodput_per_gpu_hour:,.0f} | {r.actions} "
                         f"| {r.failed} |")
    lines += ["", f"### Forecast accuracy at the planner's horizon ({scenario.horizon} interval(s) ahead)", "",
              "| predictor | MAPE | seconds per run |", "|---|---:|---:|"]
    for name, group in groups_done.items():
        if group.mape is not None:
            lines.append(f"| {name.removeprefix('fleetpilot-')} | {group.mape:.1%} | {group.seconds_per_run:.2f} |")
    lines += ["", "Seconds per run, all policies: " + ", ".join(
        f"{name} {group.seconds_per_run:.2f}" for name, group in groups_done.items()) + ".", ""]
    for title, file in png.items():
        lines += [f"![{title}]({file})", ""]
    return "\n".join(lines)


def burn_in_note(scenario: Scenario) -> str:
    if scenario.burn_in_s <= 0:
        return "every request scored from the first second"
    return (f"the first {scenario.burn_in_s / 60:g} minutes replayed as every policy's history, "
            "scored and costed from there")


def _worst(result: driver.RunResult) -> str:
    worst = result.scores.worst_window if result.scores is not None else math.nan
    return "—" if math.isnan(worst) else f"{worst:.1%}"


# -- plots ------------------------------------------------------------------------------------------------


def draw(scenario: Scenario, groups_done: Mapping[str, GroupResult], folder: Path, *, target: float,
         chosen: driver.RunResult, title: str, timeline: tuple[str, str] = ("timeline", "timeline.png"),
         curves: tuple[str, str] = ("cost vs attainment", "curves.png")) -> dict[str, str]:
    """Draw `chosen`'s timeline and every policy's cost curve into `folder`.

    `timeline` and `curves` are (caption, file name). Returns {caption: file name} of what was drawn,
    for `markdown_section`: empty when matplotlib is not installed (the caller says so).
    """
    drawn = {}
    if plot_timeline(chosen, scenario, folder / timeline[1], title=title):
        drawn[timeline[0]] = timeline[1]
    if plot_curves(scenario, groups_done, folder / curves[1], target=target):
        drawn[curves[0]] = curves[1]
    return drawn


def plot_timeline(result: driver.RunResult, scenario: Scenario, path: Path, *, title: str) -> bool:
    """Offered load and forecast, prefill/decode replicas, and TTFT/ITL percentile against target.

    False (and no file) when matplotlib is not installed: see `fleetpilot.plots`.
    """
    plt = plots.pyplot()
    if plt is None:
        return False
    t = result.timeline
    hours = t.time / 3600.0
    fig, axes = plt.subplots(4, 1, figsize=(11, 9), sharex=True)
    axes[0].plot(hours, t.rate, label="offered req/s", lw=1)
    if np.isfinite(t.forecast).any():
        # A forecast made at the end of an interval is for the ones after it: drawn where it applies.
        ahead = hours + scenario.setting.interval_s / 3600.0
        axes[0].plot(ahead, t.forecast, label="planned-for req/s (forecast, drawn where it applies)", lw=1, alpha=0.8)
    axes[0].set_ylabel("req/s")
    for ax, pool in zip(axes[1:3], fleetsim.FLEET_POOLS, strict=True):
        ax.step(hours, t.active[pool], where="post", label=f"{pool} asked for")
        ax.step(hours, t.ready[pool], where="post", label=f"{pool} ready", alpha=0.8)
        ax.set_ylabel("replicas")
    q = scenario.sla.percentile
    axes[3].plot(hours, t.ttft_p / (scenario.sla.ttft_ms / 1e3), label=f"p{q:g} TTFT / target", lw=1)
    axes[3].plot(hours, t.itl_p / (scenario.sla.itl_ms / 1e3), label=f"p{q:g} ITL / target", lw=1)
    axes[3].axhline(1.0, color="k", lw=0.8, ls="--")
    axes[3].set_yscale("log")
    axes[3].set_ylabel("latency / target")
    axes[3].set_xlabel("hours")
    for ax in axes:
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def plot_curves(scenario: Scenario, groups_done: Mapping[str, GroupResult], path: Path, *, target: float) -> bool:
    """Cost–attainment curves: one line per policy, one point per knob setting (False: no matplotlib)."""
    plt = plots.pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for name, group in groups_done.items():
        points = sorted((r.gpu_hours, r.effective) for r in group.results)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", ms=3, lw=1,
                label=name, ls="--" if name in ("oracle",) else "-")
    ax.axhline(target, color="k", lw=0.8, ls=":")
    ax.set_xlabel("GPU-hours")
    ax.set_ylabel("score (requests meeting the SLA, worst 5 min + 5 pts)")
    ax.set_title(f"{scenario.name}: cost vs attainment")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def plot_budget(result: BudgetResult, path: Path) -> bool:
    """GPUs each graph was granted and used per interval, against the budget (False: no matplotlib)."""
    plt = plots.pyplot()
    if plt is None:
        return False
    shared = result.shared
    rows = len(result.graphs) + 1
    fig, axes = plt.subplots(rows, 1, figsize=(11, 2.6 * rows), sharex=True)
    hours = shared.runs[result.graphs[0].scenario.name].timeline.time / 3600.0
    total = np.zeros(len(hours))
    for ax, graph in zip(axes[:-1], result.graphs, strict=True):
        name = graph.scenario.name
        t = shared.runs[name].timeline
        used = sum(t.active[pool] for pool in fleetsim.FLEET_POOLS)
        total = total + used
        wanted = np.where(shared.wanted[name] >= 0, shared.wanted[name], np.nan)
        # A grant and a want hold from their decision on; what was asked for is read over the interval
        # before each decision, so it is drawn over that interval.
        ax.step(hours, shared.granted[name], where="post", label="granted")
        ax.step(hours, wanted, where="post", label="wanted (no budget)", alpha=0.8)
        ax.step(hours, used, where="pre", label="asked for", alpha=0.8)
        ax.set_ylabel("GPUs")
        ax.set_title(f"{name} (priority {graph.priority})", fontsize=9)
    axes[-1].step(hours, total, where="pre", label="all graphs, asked for")
    axes[-1].axhline(shared.budget, color="k", lw=0.8, ls="--", label="budget")
    axes[-1].set_ylabel("GPUs")
    axes[-1].set_xlabel("hours")
    for ax in axes:
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
