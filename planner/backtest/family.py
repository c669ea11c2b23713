"""A seeded family of synthetic traffic for the backtest: one seed, one day's worth of trouble.

Where it sits: beside the trace readers, as a third source of scenarios. `family_scenario(seed)` draws
a traffic's parameters from the seed, realises its arrivals per fluid step and hands them to
`evaluate.scenario_from_counts`; `benchmarks/backtest.py --family N` runs every policy's sweep on
seeds 0..N-1 exactly as on the real traces. The real traces show that a planner works on the traffic
they hold; the family shows whether it generalises to traffic nobody tuned it on. Pure: no I/O and no
clock; every random choice comes from the seed, so a seed is the same scenario on any machine.

The rate at step time t is

    base × diurnal(t) × weekly(t) × ramps(t) × flash crowds(t) × outages(t) × on/off(minute) × noise(minute)

and each step's arrivals are Poisson at that rate. Each component, what it draws per seed and why its
range is what it is (the ranges come from the public traces in `../shared/traces/` — Azure LLM code
2023, Mooncake conversation, ServeGen m-large and m-mid — and are wide enough to hold each of them;
nothing is fitted to any policy's result):

- **Duration** (`duration_h`): 3 to 5 whole hours, one-minute planning intervals and fluid steps
  (Poisson within a step: an M/G/c wait, as on ServeGen). Long enough for a stretch of the day's cycle
  and a few events after the 10-minute burn-in; short enough that one seed's full sweep, every policy
  at every setting, runs in about three minutes on one core (40–55 s per simulated hour, measured on
  the shared 2-core machine), so that 20 seeds take about half an hour on two.
- **Clock** (`clock_start_h`): where in the week (Monday 00:00 = 0) the run starts, uniform over the week:
  it places the run on the diurnal and weekly cycles.
- **Fleet scale** (`fleet_replicas`): log-uniform from one replica to tens. The base rate is the one at
  which the planner's own sizing (`sizing.size`, the profile the policies believe) wants this many
  replicas, prefill and decode together, at the run's mean lengths: a scale in replicas rather than
  requests/s, because the lengths below move a replica's capacity by two orders of magnitude.
- **Diurnal cycle** (`peak_to_trough`, `peak_hour`): 1 + a·cos(2π(hour − peak)/24), a = (r − 1)/(r + 1)
  for a peak-to-trough ratio r. ServeGen's days run from 1.7 to 6.5 (m-large) and 2.9 to 4.3 (m-mid);
  the peak hour is uniform (a service's users may live in any time zone).
- **Weekly cycle** (`weekend_depth`): the rate drops by this share over Saturday and Sunday, with 3-h
  linear transitions around midnight. ServeGen m-large's daily means span 105 to 279 req/s over its
  14 days; 0 to 0.5 covers no weekly swing to halving. Shorter than a day, a run sees it only when it
  crosses a weekend's edge, as a live fleet would.
- **Ramps** (`ramps`: 0 to 2): a lasting change of level, log-linear over 10–120 min, by a factor
  log-uniform in [1/3, 3] (a launch, a migration, a client moved over). ServeGen's 10-minute rate
  changes by ×1.8 at its 99th percentile and ×3.2 at most.
- **Flash crowds** (`flash_crowds`: 0 to 3): for 2–10 minutes the rate is (1 + height) times what it
  was, height in [1, 4], rising and falling over a minute (or a quarter of the crowd, if shorter).
  Azure code's busiest minutes carry 2.1–4.6× the mean of the ten before them.
- **Outages** (`outages`: 0 or 1): 5–120 minutes (log-uniform) in which only a residual share in
  [0, 0.05] of the traffic arrives (an upstream outage, a client's failover away), starting sharply,
  then the traffic coming back linearly over a recovery of 1–30 minutes (log-uniform). ServeGen m-mid
  falls to zero eight times in 14 days, for 1 to 4 hours each (one per 42 h; shorter ones are the
  common case of a restart); its 10-minute windows cannot tell how fast traffic returns, so the
  recovery spans one planning interval (which no policy that waits for a replica's startup can
  follow) to half an hour.
- **On/off service** (`silent_share`, `silent_run_min`): half the seeds are always on (Mooncake and
  ServeGen have no silent minute); the others are silent for a share of minutes in [0.05, 0.3], in
  runs of mean length 1–4 minutes (a two-state Markov chain per minute). Azure code is silent in 21%
  of its minutes, in runs of 1 to 3.
- **Minute noise** (`noise_cv`): each minute's rate is multiplied by a gamma variable of mean 1 and
  coefficient of variation log-uniform in [0.05, 1]; on top of it each step's count is Poisson.
  Around a 10-minute mean, Mooncake's minute counts vary with CV 0.13 beyond Poisson, Azure code's 0.9.
- **Length mix and its shift** (`long`, `short`, `shift`): two request classes, a long-prompt one
  (prompt mean log-uniform 4,096–12,288: Mooncake's is 12,035) and a short-prompt one (256–2,048:
  Azure code's is 2,048), each lognormal with a log-sigma in [0.8, 1.4] (Azure 1.36, Mooncake 1.20)
  and its own output length (mean log-uniform 16–512: Azure 28, Mooncake 343; sigma 0.8–1.4: Azure
  0.85, Mooncake 1.36); prompts capped at 32,768 tokens, outputs at 8,192 (`traces.Synthesis`'s caps).
  The long class's share of the requests moves from one value to another (each uniform in [0, 1]) at
  a time uniform in the middle 60% of the run, linearly over 1–30 minutes: a client with long
  documents arrives or leaves. Mooncake's mean prompt drifts from 14.0k to 11.0k tokens within its
  hour.

What the fluid fleet model makes of the mix: each step's prompts are priced at that step's share of
the two classes (`prompt_mix`, as for a request trace), and the static sizings read each interval's
mean lengths; the lone-prompt part of a TTFT, the servable share and the decode pool see the run's
overall length sample, the fluid's one mix (`fluid.FluidFleet`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fleetpilot import perfmodel, traces
from fleetpilot.api import profile as profiles
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity, sizing
from fleetpilot.planner.backtest import evaluate, fluid

HOUR_S, DAY_S, WEEK_S = 3600.0, 86400.0, 7 * 86400.0
MINUTE_S = 60.0
STEP_S = 60.0  # fluid step, one planning interval: Poisson within it (an M/G/c wait), as on ServeGen
INTERVAL_S = 60.0  # planning interval, as on the request traces
SAMPLE = 4000  # requests in the length sample per class (the fluid keeps 2,000 quantiles of the mix)
ISL_MAX, OSL_MAX = traces.Synthesis().input_length.maximum, traces.Synthesis().output_length.maximum
EDGE_S = 60.0  # a flash crowd's rise and fall
WEEKEND_EDGE_S = 3 * HOUR_S  # the weekly cycle's transitions, centred on Saturday and Monday 00:00
SIZING_REFERENCE_RPS = 1000.0  # the rate the fleet scale is sized at (then scaled down: sizing rounds up)

# Every drawn parameter's range, (low, high); counts are whole numbers in it. The module docstring
# says where each comes from; tests hold every seed's draw to them.
RANGES: dict[str, tuple[float, float]] = {
    "duration_h": (3, 5),
    "clock_start_h": (0, 168),
    "fleet_replicas": (1, 40),
    "peak_to_trough": (1.5, 6.5),
    "peak_hour": (0, 24),
    "weekend_depth": (0, 0.5),
    "ramps": (0, 2),
    "ramp_min": (10, 120),
    "ramp_factor": (1 / 3, 3),
    "flash_crowds": (0, 3),
    "flash_min": (2, 10),
    "flash_height": (1, 4),
    "outages": (0, 1),
    "outage_min": (5, 120),
    "outage_residual": (0, 0.05),
    "recovery_min": (1, 30),
    "silent_share": (0.05, 0.3),  # or 0: half the seeds are always on
    "silent_run_min": (1, 4),
    "noise_cv": (0.05, 1.0),
    "long_isl": (4096, 12288),
    "short_isl": (256, 2048),
    "isl_sigma": (0.8, 1.4),
    "osl": (16, 512),
    "osl_sigma": (0.8, 1.4),
    "long_share": (0, 1),
    "shift_at": (0.2, 0.8),  # share of the run
    "shift_min": (1, 30),
}
ALWAYS_ON = 0.5  # the share of seeds with no silent minute


@dataclasses.dataclass(frozen=True)
class Window:
    """One event of a run: from `start_s` for `duration_s`; `size` is a ramp's factor, a flash crowd's
    height (extra multiples of the rate) or an outage's residual share of the traffic; `recovery_s`:
    how long an outage's traffic takes to come back after it."""

    start_s: float
    duration_s: float
    size: float
    recovery_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class LengthClass:
    """A request class: lognormal prompt and output lengths (means and log-sigmas)."""

    isl_mean: float
    isl_sigma: float
    osl_mean: float
    osl_sigma: float

    def draw(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
        isl = traces.draw_lengths(rng, traces.LengthDistribution(self.isl_mean, sigma=self.isl_sigma,
                                                                 maximum=ISL_MAX), count)
        osl = traces.draw_lengths(rng, traces.LengthDistribution(self.osl_mean, sigma=self.osl_sigma,
                                                                 maximum=OSL_MAX), count)
        return isl, osl


@dataclasses.dataclass(frozen=True)
class MixShift:
    """The long class's share of requests: `before` until `at_s`, then linearly to `after` over `over_s`."""

    at_s: float
    over_s: float
    before: float
    after: float


@dataclasses.dataclass(frozen=True)
class Params:
    """Everything one seed draws (`draw`): the traffic's shape, before any arrival is realised."""

    seed: int
    duration_s: float
    clock_start_s: float
    fleet_replicas: float
    peak_to_trough: float
    peak_hour: float
    weekend_depth: float
    ramps: tuple[Window, ...]
    flash_crowds: tuple[Window, ...]
    outages: tuple[Window, ...]
    silent_share: float
    silent_run_min: float
    noise_cv: float
    long: LengthClass
    short: LengthClass
    shift: MixShift


def _uniform(rng: np.random.Generator, name: str) -> float:
    lo, hi = RANGES[name]
    return float(rng.uniform(lo, hi))


def _log_uniform(rng: np.random.Generator, name: str) -> float:
    lo, hi = RANGES[name]
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _count(rng: np.random.Generator, name: str) -> int:
    lo, hi = RANGES[name]
    return int(rng.integers(int(lo), int(hi) + 1))


def _streams(seed: int) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    """Three independent generators from one seed: the parameters, the arrivals and the length sample,
    so that how one is realised never changes the others (a seed's parameters stay its own)."""
    parameters, arrivals, lengths = np.random.SeedSequence(seed).spawn(3)
    return np.random.default_rng(parameters), np.random.default_rng(arrivals), np.random.default_rng(lengths)


def draw(seed: int, *, duration_s: float | None = None) -> Params:
    """The parameters of seed `seed` (ranges: `RANGES`). `duration_s` replaces the drawn duration (a
    short run for a test); every event is then placed within it."""
    rng = _streams(seed)[0]
    drawn_s = _count(rng, "duration_h") * HOUR_S
    duration = drawn_s if duration_s is None else float(duration_s)

    def windows(count: str, minutes: str, size: str, *, log_minutes: bool = False,
                log_size: bool = False) -> tuple[Window, ...]:
        out = []
        for _ in range(_count(rng, count)):
            span = min((_log_uniform if log_minutes else _uniform)(rng, minutes) * MINUTE_S, duration)
            start = float(rng.uniform(0.0, duration - span))
            out.append(Window(start, span, (_log_uniform if log_size else _uniform)(rng, size)))
        return tuple(out)

    clock = _uniform(rng, "clock_start_h") * HOUR_S
    fleet = _log_uniform(rng, "fleet_replicas")
    ratio, peak = _uniform(rng, "peak_to_trough"), _uniform(rng, "peak_hour")
    weekend = _uniform(rng, "weekend_depth")
    ramps = windows("ramps", "ramp_min", "ramp_factor", log_size=True)
    flashes = windows("flash_crowds", "flash_min", "flash_height")
    outages = tuple(dataclasses.replace(outage, recovery_s=_log_uniform(rng, "recovery_min") * MINUTE_S)
                    for outage in windows("outages", "outage_min", "outage_residual", log_minutes=True))
    always_on = bool(rng.random() < ALWAYS_ON)
    silent, silent_run = _uniform(rng, "silent_share"), _uniform(rng, "silent_run_min")
    noise = _log_uniform(rng, "noise_cv")
    classes = [LengthClass(_log_uniform(rng, isl), _uniform(rng, "isl_sigma"), _log_uniform(rng, "osl"),
                           _uniform(rng, "osl_sigma")) for isl in ("long_isl", "short_isl")]
    before, after = _uniform(rng, "long_share"), _uniform(rng, "long_share")
    shift = MixShift(at_s=_uniform(rng, "shift_at") * duration, over_s=_uniform(rng, "shift_min") * MINUTE_S,
                     before=before, after=after)
    return Params(seed=seed, duration_s=duration, clock_start_s=clock, fleet_replicas=fleet, peak_to_trough=ratio,
                  peak_hour=peak, weekend_depth=weekend, ramps=ramps, flash_crowds=flashes, outages=outages,
                  silent_share=0.0 if always_on else silent, silent_run_min=silent_run, noise_cv=noise,
                  long=classes[0], short=classes[1], shift=shift)


# -- the deterministic shape ---------------------------------------------------------------------------


def _inside(times: np.ndarray, window: Window) -> np.ndarray:
    inside: np.ndarray = (times >= window.start_s) & (times < window.start_s + window.duration_s)
    return inside


def _weekend(times_of_week: np.ndarray) -> np.ndarray:
    """1 over Saturday and Sunday, 0 on weekdays, linear over `WEEKEND_EDGE_S` around each midnight."""
    half = WEEKEND_EDGE_S / 2
    up = np.clip((times_of_week - (5 * DAY_S - half)) / WEEKEND_EDGE_S, 0.0, 1.0)  # Friday night into Saturday
    down = np.clip((times_of_week - (7 * DAY_S - half)) / WEEKEND_EDGE_S, 0.0, 1.0)  # Sunday night into Monday
    wrapped = np.clip((times_of_week + half) / WEEKEND_EDGE_S, 0.0, 1.0)  # Monday's first hours: still leaving Sunday
    weekend: np.ndarray = up - down + (1.0 - wrapped)
    return weekend


def factors(params: Params, times: np.ndarray) -> dict[str, np.ndarray]:
    """Each deterministic component's factor on the base rate at `times` (seconds into the run); their
    product is `shape`. The random ones (on/off minutes, minute noise) are `realise`'s."""
    times = np.asarray(times, dtype=float)
    clock = params.clock_start_s + times
    a = (params.peak_to_trough - 1) / (params.peak_to_trough + 1)
    hours = (clock % DAY_S) / HOUR_S
    diurnal = 1.0 + a * np.cos(2 * math.pi * (hours - params.peak_hour) / 24.0)
    weekly = 1.0 - params.weekend_depth * _weekend(clock % WEEK_S)
    ramps = np.ones_like(times)
    for ramp in params.ramps:
        progress = np.clip((times - ramp.start_s) / max(ramp.duration_s, 1e-9), 0.0, 1.0)
        ramps = ramps * ramp.size ** progress
    flash = np.ones_like(times)
    for crowd in params.flash_crowds:
        edge = min(EDGE_S, crowd.duration_s / 4)
        into, left = times - crowd.start_s, crowd.start_s + crowd.duration_s - times
        rise = np.clip(np.minimum(into, left) / edge, 0.0, 1.0) * _inside(times, crowd)
        flash = flash + crowd.size * rise
    outages = np.ones_like(times)
    for outage in params.outages:
        back = (times - outage.start_s - outage.duration_s) / max(outage.recovery_s, 1e-9)
        level = np.where(_inside(times, outage), outage.size,
                         np.where(back >= 0, outage.size + (1 - outage.size) * np.clip(back, 0.0, 1.0), 1.0))
        outages = np.minimum(outages, level)
    return {"diurnal": diurnal, "weekly": weekly, "ramps": ramps, "flash crowds": flash, "outages": outages}


def shape(params: Params, times: np.ndarray) -> np.ndarray:
    """The deterministic factor on the base rate at `times`: the product of `factors`."""
    product = np.ones(len(np.asarray(times)))
    for factor in factors(params, times).values():
        product = product * factor
    return product


def long_share(params: Params, times: np.ndarray) -> np.ndarray:
    """The long class's share of the requests arriving at `times`."""
    shift = params.shift
    progress = np.clip((np.asarray(times, dtype=float) - shift.at_s) / max(shift.over_s, 1e-9), 0.0, 1.0)
    share: np.ndarray = shift.before + (shift.after - shift.before) * progress
    return share


# -- realising the arrivals -----------------------------------------------------------------------------


def on_minutes(params: Params, minutes: int, rng: np.random.Generator) -> np.ndarray:
    """Which minutes the service is on: a two-state Markov chain with `silent_share` of minutes off, in
    runs of mean `silent_run_min`, started from its stationary state."""
    if params.silent_share <= 0:
        return np.ones(minutes, dtype=bool)
    wake = 1.0 / params.silent_run_min  # off → on, per minute
    sleep = wake * params.silent_share / (1.0 - params.silent_share)  # on → off, so that the share holds
    on = np.empty(minutes, dtype=bool)
    state = bool(rng.random() >= params.silent_share)
    draws = rng.random(minutes)
    for minute in range(minutes):
        on[minute] = state
        state = bool(draws[minute] >= sleep) if state else bool(draws[minute] < wake)
    return on


def minute_noise(params: Params, minutes: int, rng: np.random.Generator) -> np.ndarray:
    """Each minute's multiplicative noise: gamma, mean 1, coefficient of variation `noise_cv`."""
    k = 1.0 / params.noise_cv**2
    noise: np.ndarray = rng.gamma(k, 1.0 / k, minutes)
    return noise


@dataclasses.dataclass(frozen=True)
class Traffic:
    """A realised run: arrivals per step and the length mix it comes in."""

    params: Params
    base_rps: float
    step_s: float
    counts: np.ndarray  # arrivals per step
    expected_rps: np.ndarray  # base × shape per step (before on/off and noise)
    long_share: np.ndarray  # per step


def realise(params: Params, *, base_rps: float, step_s: float = STEP_S) -> Traffic:
    """The arrivals per step of `params` at `base_rps`: Poisson at base × shape × on/off × noise."""
    rng = _streams(params.seed)[1]
    steps = max(1, round(params.duration_s / step_s))
    times = (np.arange(steps) + 0.5) * step_s
    minute = np.minimum((times // MINUTE_S).astype(int), math.ceil(params.duration_s / MINUTE_S) - 1)
    minutes = int(minute[-1]) + 1
    on, noise = on_minutes(params, minutes, rng), minute_noise(params, minutes, rng)
    expected = base_rps * shape(params, times)
    counts = rng.poisson(expected * on[minute] * noise[minute] * step_s).astype(float)
    return Traffic(params=params, base_rps=base_rps, step_s=step_s, counts=counts, expected_rps=expected,
                   long_share=long_share(params, times))


def mean_long_share(params: Params, *, step_s: float = STEP_S) -> float:
    """The long class's share of the run's expected arrivals."""
    times = (np.arange(max(1, round(params.duration_s / step_s))) + 0.5) * step_s
    weights = shape(params, times)
    return float(np.average(long_share(params, times), weights=weights)) if weights.sum() > 0 else 0.5


def base_rate(params: Params, beliefs: capacity.CapacityModel, sla: api.SlaTarget) -> float:
    """The rate at which the planner's sizing wants `params.fleet_replicas` replicas (prefill and decode)
    at the run's mean lengths: sized at a high reference rate, where rounding up one replica is noise,
    and scaled down in proportion."""
    w = mean_long_share(params)
    isl = w * params.long.isl_mean + (1 - w) * params.short.isl_mean
    osl = w * params.long.osl_mean + (1 - w) * params.short.osl_mean
    reference = SIZING_REFERENCE_RPS
    for _ in range(3):  # until the reference fleet is large enough that one replica is under 1%
        desired = sizing.size(sizing.Load(rate_rps=reference, isl=isl, osl=osl), beliefs, sla)
        total = sum(desired.replicas.values())
        if total >= 100:
            break
        reference *= 100 / max(total, 1)
    return reference * params.fleet_replicas / max(total, 1)


def family_scenario(seed: int, *, profile: profiles.Profile, sla: api.SlaTarget, startup_s: float = 120.0,
                    duration_s: float | None = None, step_s: float = STEP_S, interval_s: float = INTERVAL_S,
                    timing: perfmodel.PerformanceModel | None = None,
                    burn_in_s: float | None = None) -> evaluate.Scenario:
    """Seed `seed` of the family as a fluid scenario (`evaluate.scenario_from_counts`).

    `duration_s` replaces the drawn duration (rounded up to whole planning intervals); `burn_in_s` as
    in `evaluate.scenario_from_trace` (None: the default burn-in).
    """
    if duration_s is not None:
        duration_s = max(1, math.ceil(duration_s / interval_s)) * interval_s
    params = draw(seed, duration_s=duration_s)
    beliefs = capacity.CapacityModel(profile)
    traffic = realise(params, base_rps=base_rate(params, beliefs, sla), step_s=step_s)
    timing = timing or evaluate.default_timing()
    # The length sample: each class drawn apart, mixed in the run's proportion.
    rng = _streams(params.seed)[2]
    long_isl, long_osl = params.long.draw(rng, SAMPLE)
    short_isl, short_osl = params.short.draw(rng, SAMPLE)
    counts = traffic.counts
    w = float(np.average(traffic.long_share, weights=counts)) if counts.sum() > 0 else mean_long_share(params)
    n_long = round(SAMPLE * w)
    isl_sample = np.concatenate([long_isl[:n_long], short_isl[:SAMPLE - n_long]])
    osl_sample = np.concatenate([long_osl[:n_long], short_osl[:SAMPLE - n_long]])
    # Each step's prompts priced at its own share of the classes, over the run's mix.
    budget = evaluate.fleet_config(timing, startup_s).max_batched_tokens
    service_long = float(fluid.prompt_service_s(timing, long_isl.astype(float), budget).mean())
    service_short = float(fluid.prompt_service_s(timing, short_isl.astype(float), budget).mean())
    overall = w * service_long + (1 - w) * service_short
    prompt_mix = (traffic.long_share * service_long + (1 - traffic.long_share) * service_short) / overall
    # Each interval's mean lengths, as its arrivals' mix has them.
    per = round(interval_s / step_s)
    arrivals = counts.reshape(-1, per)
    shares = traffic.long_share.reshape(-1, per)
    interval_w = np.where(arrivals.sum(axis=1) > 0,
                          (arrivals * shares).sum(axis=1) / np.maximum(arrivals.sum(axis=1), 1e-12), shares.mean(axis=1))
    means = [(float(v * long_isl.mean() + (1 - v) * short_isl.mean()),
              float(v * long_osl.mean() + (1 - v) * short_osl.mean())) for v in interval_w]
    duration = len(counts) * step_s
    description = (
        f"family seed {seed}: {duration / 3600:g} h from {_clock(params.clock_start_s)}, "
        f"{counts.sum():,.0f} requests, mean {counts.sum() / duration:.2f} req/s (base {traffic.base_rps:.2f}, "
        f"sized for {params.fleet_replicas:.1f} replicas); diurnal peak/trough {params.peak_to_trough:.1f} at "
        f"{params.peak_hour:.0f}h, weekend −{params.weekend_depth:.0%}; {len(params.ramps)} ramp(s), "
        f"{len(params.flash_crowds)} flash crowd(s), {len(params.outages)} outage(s); "
        f"{params.silent_share:.0%} silent minutes; minute noise CV {params.noise_cv:.2f}; long share "
        f"{params.shift.before:.2f} → {params.shift.after:.2f} at {params.shift.at_s / 3600:.1f} h; ISL "
        f"{params.long.isl_mean:,.0f} / {params.short.isl_mean:,.0f}, OSL {params.long.osl_mean:,.0f} / "
        f"{params.short.osl_mean:,.0f} (long / short)")
    return evaluate.scenario_from_counts(
        f"family seed {seed}", counts, profile=profile, sla=sla, step_s=step_s, interval_s=interval_s,
        startup_s=startup_s, isl_sample=[int(v) for v in isl_sample], osl_sample=[int(v) for v in osl_sample],
        interval_lengths=means, prompt_mix=prompt_mix, description=description, timing=timing, burn_in_s=burn_in_s,
        # The planner reads each window's own mix of the classes, as a live planner reads the frontend's.
        length_classes=fluid.LengthClasses(
            of_sample=[0] * n_long + [1] * (SAMPLE - n_long),
            shares=np.column_stack([traffic.long_share, 1 - traffic.long_share])))


def _clock(seconds_of_week: float) -> str:
    day = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")[int(seconds_of_week // DAY_S) % 7]
    hours = (seconds_of_week % DAY_S) / HOUR_S
    return f"{day} {int(hours):02d}:{int(hours % 1 * 60):02d}"
