"""Forecast coverage benchmark: does the calibrated q-quantile cover q of the load that came?

For each shared trace and predictor, the series goes through the planner's own forecasting and
calibration, interval by interval, as `core.plan_interval` runs them: the predictor forecasts the
horizon from the history so far, `core.realise` scores every pending forecast against the interval
that came (request rate, input tokens/s, output tokens/s) and updates the calibration. Reported: the
share of outcomes at or under the calibrated q-quantile for q = 0.5, 0.9, 0.99 after the warm-up,
next to the model's own Gaussian quantile (what sizing for a predictor's interval would give), with
the number of outcomes and the binomial standard error at 0.9.

Series: the Azure code and Mooncake conversation traces per 60-s interval (about 57 intervals: the
warm-up is 10 intervals, since an hour of warm-up would leave nothing), and the ServeGen 14-day rate
series per 10-minute window (request rate only: no lengths), forecast from day 7 with one day of
warm-up and three days scored (a fit per window over 7 days would take the slow predictors an hour).

Run: `OPENBLAS_NUM_THREADS=1 ~/.cache/fleetpilot/venv/bin/python benchmarks/forecast_coverage.py`
(about 15 minutes on 2 cores; `--quick` runs the hour traces only, about a minute). Writes
benchmarks/results/forecast_coverage.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fleetpilot import traces
from fleetpilot.planner import conformal, core, predict

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
LEVELS = conformal.REPORTED_LEVELS
PREDICTORS = ("constant", "arima", "kalman", "prophet")


@dataclasses.dataclass(frozen=True)
class Series:
    name: str
    interval_s: float
    rates: tuple[float, ...]
    isls: tuple[float, ...]
    osls: tuple[float, ...]
    start: int  # first interval the planner forecasts from (history before it is given whole)
    warmup: int  # outcomes after `start` not scored
    end: int
    horizon: int

    @property
    def loads(self) -> tuple[str, ...]:
        return core.LOADS if any(v != 1.0 for v in self.isls) else ("requests",)


def request_series(name: str, path: Path, interval_s: float = 60.0, startup_s: float = 120.0) -> Series:
    requests = traces.load(path)
    count = math.ceil(max(r.arrival_s for r in requests) / interval_s)
    rates, isls, osls = np.zeros(count), np.zeros(count), np.zeros(count)
    sums = np.zeros((count, 2))
    for r in requests:
        k = min(int(r.arrival_s // interval_s), count - 1)
        rates[k] += 1
        sums[k] += (r.input_tokens, r.output_tokens)
    busy = rates > 0
    isls[busy], osls[busy] = sums[busy, 0] / rates[busy], sums[busy, 1] / rates[busy]
    return Series(name, interval_s, tuple(rates / interval_s), tuple(isls), tuple(osls), start=1, warmup=10,
                  end=count, horizon=max(1, math.ceil(startup_s / interval_s)))


def rate_series(name: str, model: str, days_before: int = 7, warmup_days: int = 1, scored_days: int = 3) -> Series:
    windows = traces.load_rate_series(SHARED / "servegen_alibaba" / "aggregate_rate_10min.csv", model=model)
    rates = tuple(w.rate_rps for w in windows)
    per_day = 144
    start = days_before * per_day
    return Series(name, 600.0, rates, (1.0,) * len(rates), (1.0,) * len(rates), start=start,
                  warmup=warmup_days * per_day, end=min(len(rates), start + (warmup_days + scored_days) * per_day),
                  horizon=1)


@dataclasses.dataclass(frozen=True)
class Coverage:
    series: str
    predictor: str
    calibrated: dict[str, dict[float, float]]
    gaussian: dict[str, dict[float, float]]
    outcomes: int
    seconds_per_forecast: float
    fallbacks: int


def run(series: Series, name: str) -> Coverage:
    """The planner's forecast-and-calibrate loop over `series` with predictor `name`."""
    predictor = predict.make_predictor(name)
    memory = core.GraphMemory()
    hits: dict[str, dict[float, list[bool]]] = {load: {q: [] for q in LEVELS} for load in series.loads}
    gaussian: dict[str, dict[float, list[bool]]] = {load: {q: [] for q in LEVELS} for load in series.loads}
    z = {q: statistics.NormalDist().inv_cdf(q) for q in LEVELS}
    seconds: list[float] = []
    fallbacks = 0
    measured: tuple[core.IntervalLengths, ...] = ()
    for t in range(series.start, series.end):
        rate, isl, osl = series.rates[t], series.isls[t], series.osls[t]
        scored = t - series.start >= series.warmup
        fresh = 0
        for index, pending in enumerate(memory.pending):
            age = len(memory.pending) - 1 - index
            if age >= len(pending.rate_mean) or not pending.scored or pending.rate_spread[age] <= 0:
                continue  # what `core.realise` does not score
            fresh += 1
            for load in series.loads:
                mean, spread = pending.load(load, age)
                realised = rate * core.load_length(load, isl or pending.isl, osl or pending.osl)
                for q in LEVELS:
                    if scored:
                        gaussian[load][q].append(realised <= max(0.0, mean + z[q] * spread))
        memory = core.realise(memory, rate=rate, isl=isl, osl=osl, risk=0.9)
        if scored and fresh:
            for load in series.loads:
                for q in LEVELS:
                    hits[load][q].extend(memory.forecast_calibration[load].hits[q][-fresh:])
        history = series.rates[:t + 1]
        began = time.perf_counter()
        forecast = predictor.forecast(history, steps=series.horizon, step_seconds=series.interval_s)
        seconds.append(time.perf_counter() - began)
        fallbacks += forecast.fallback is not None
        measured = core.with_lengths(measured, core.IntervalLengths(t * series.interval_s, rate, isl, osl))
        seen = core.recent_lengths(measured, now=t * series.interval_s, interval_s=series.interval_s)
        lengths = (max(core.recent_length(seen, "isl"), 1.0), max(core.recent_length(seen, "osl"), 1.0))
        pending = core.PendingForecast(forecast.mean, tuple(forecast.spread(i) for i in range(len(forecast.mean))),
                                       *lengths, scored=len(history) >= core.SCORED_FROM_INTERVALS)
        memory = dataclasses.replace(memory, pending=(*memory.pending, pending)[-series.horizon:])

    def shares(table: dict[str, dict[float, list[bool]]]) -> dict[str, dict[float, float]]:
        return {load: {q: float(np.mean(v)) if v else math.nan for q, v in by_q.items()} for load, by_q in table.items()}

    outcomes = len(hits[series.loads[0]][LEVELS[0]])
    return Coverage(series.name, name, shares(hits), shares(gaussian), outcomes, float(np.median(seconds)), fallbacks)


def _table(results: Sequence[Coverage]) -> list[str]:
    lines = [("| trace | predictor | load | outcomes | q=0.5 | q=0.9 | q=0.99 | model's own 0.5 / 0.9 / 0.99 | "
             "± (1 s.e. at 0.9) | fallbacks |"),
             "|---|---|---|---:|---:|---:|---:|---|---:|---:|"]
    for result in results:
        se = math.sqrt(0.9 * 0.1 / max(result.outcomes, 1))
        for load, by_q in result.calibrated.items():
            own = " / ".join(f"{result.gaussian[load][q]:.1%}" for q in LEVELS)
            lines.append(f"| {result.series} | {result.predictor} | {load} | {result.outcomes} | "
                         + " | ".join(f"{by_q[q]:.1%}" for q in LEVELS)
                         + f" | {own} | {se:.1%} | {result.fallbacks} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the hour-long traces only")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--predictors", default=",".join(PREDICTORS))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "forecast_coverage.md")
    args = parser.parse_args()
    series = [
        request_series("Azure code 2023", SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"),
        request_series("Mooncake conversation", SHARED / "mooncake_fast25" / "conversation_trace.jsonl"),
    ]
    if not args.quick:
        series += [rate_series("ServeGen m-large", "m-large"), rate_series("ServeGen m-mid", "m-mid")]
    jobs = [(s, p) for s in series for p in args.predictors.split(",")]
    began = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(run, *zip(*jobs, strict=True)))
    minutes = (time.perf_counter() - began) / 60
    lines = [
        "# Forecast coverage",
        "",
        (f"Generated by `benchmarks/forecast_coverage.py{' --quick' if args.quick else ''}` ({args.workers} workers, "
        f"{minutes:.1f} min on the 2-core development machine). Each cell: the share of outcomes (every step of "
        "every forecast over the planner's horizon) at or under the calibrated q-quantile "
        "(`planner/conformal.py`, as the planner sizes with it), after the warm-up; next to it, the share under "
        "the predictor's own Gaussian quantile. Hour traces: 60-s intervals, horizon 2, 10 intervals of warm-up. "
        "ServeGen: 10-minute windows, horizon 1, forecasts from day 7, one day of warm-up, three days scored."),
        "",
        *_table(results),
        "",
        "Median seconds per forecast call: "
        + ", ".join(f"{r.series} {r.predictor} {r.seconds_per_forecast * 1e3:.0f} ms" for r in results) + ".",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
