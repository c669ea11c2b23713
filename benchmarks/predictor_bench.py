"""Load-predictor benchmark: fit time and accuracy per predictor on a real trace, beside `constant`.

Rolling origin over the last two days of the ServeGen m-large request rate (10-minute windows):
at each origin every predictor gets the 7 days before it and forecasts the next hour (6 steps),
as the planner would. Reported per predictor: median and max seconds per `forecast` call (fit
included, one warm-up call first so imports do not count), MAPE at 1, 3 and 6 steps (windows with
an actual rate of 0 are left out of the MAPE: m-mid has outages), how often the 80% interval held
the actual value, and how many calls fell back to `constant`.

`--warm` measures instead what the planner does every interval: forecast consecutive windows, each
fit once from the model's own start (cold, the baseline) and once from the last fit's parameters
(warm, as `core.plan_interval` runs it), printing CPU seconds per call and how far the two forecasts
differ.

Run: `~/.cache/fleetpilot/venv/bin/python benchmarks/predictor_bench.py [--warm]` (about half a minute;
`--warm` about two minutes).
Timings depend on BLAS threading: OpenBLAS's default threads made these small fits 1.5-5x slower on
a 2-core machine; `OPENBLAS_NUM_THREADS=1` is printed with the table when set.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from fleetpilot import traces
from fleetpilot.planner import predict

REPO = Path(__file__).resolve().parents[1]
SERVEGEN = REPO.parent / "shared" / "traces" / "servegen_alibaba" / "aggregate_rate_10min.csv"
STEP_S = 600.0
HISTORY = 7 * 144  # 7 days of 10-minute windows
EVALUATED = 2 * 144  # origins fall in the last 2 days
NAMES = ("constant", "arima", "kalman", "prophet")


def load_rates(path: Path, model: str) -> list[float]:
    """The `total_rate_rps` column of one model, in time order."""
    return [window.rate_rps for window in traces.load_rate_series(path, model=model)]


def origins(length: int, *, count: int, steps: int) -> list[int]:
    """`count` origins evenly spread over the last `EVALUATED` windows, each leaving `steps` to score.

    The spacing is kept coprime with 6 so that the origins do not all sit at the same minute of the
    hour (the trace has hourly bursts, and same-phase origins measure only one phase of them).
    """
    first = length - EVALUATED
    last = length - steps
    spacing = max(1, (last - first) // max(count - 1, 1))
    while math.gcd(spacing, 6) != 1:
        spacing -= 1
    return [last - spacing * k for k in reversed(range(count))]


def evaluate(name: str, series: Sequence[float], at: Sequence[int], *, steps: int) -> dict[str, float]:
    predictor = predict.make_predictor(name)
    predictor.forecast(series[at[0] - HISTORY:at[0]], steps=steps, step_seconds=STEP_S)  # warm-up
    seconds: list[float] = []
    errors: dict[int, list[float]] = {h: [] for h in sorted({1, min(3, steps), steps})}
    covered = total = fallbacks = 0
    for origin in at:
        history = series[origin - HISTORY:origin]
        started = time.perf_counter()
        forecast = predictor.forecast(history, steps=steps, step_seconds=STEP_S)
        seconds.append(time.perf_counter() - started)
        fallbacks += forecast.fallback is not None
        actual = series[origin:origin + steps]
        for horizon, misses in errors.items():
            if actual[horizon - 1] > 0:
                misses.append(abs(forecast.mean[horizon - 1] - actual[horizon - 1]) / actual[horizon - 1])
        for low, high, value in zip(forecast.lower, forecast.upper, actual, strict=True):
            covered += low <= value <= high
            total += 1
    row = {"median_s": statistics.median(seconds), "max_s": max(seconds), "coverage": covered / total,
           "fallbacks": fallbacks}
    row.update({f"mape_{h}": 100 * statistics.fmean(misses) for h, misses in errors.items()})
    return row


def warm_against_cold(name: str, series: Sequence[float], *, first: int, count: int, steps: int
                      ) -> dict[str, float]:
    """`count` consecutive forecasts from window `first` on (7 days of history each), cold and warm."""
    predictor = predict.make_predictor(name)
    state: tuple[float, ...] = ()
    cold_s: list[float] = []
    warm_s: list[float] = []
    worst = 0.0
    for origin in range(first, first + count):
        history = series[origin - HISTORY:origin]
        started = time.process_time()
        cold = predictor.forecast(history, steps=steps, step_seconds=STEP_S)
        cold_s.append(time.process_time() - started)
        started = time.process_time()
        warm = predictor.forecast(history, steps=steps, step_seconds=STEP_S, start=state)
        warm_s.append(time.process_time() - started)
        state = warm.state
        for a, b in zip(cold.mean, warm.mean, strict=True):
            worst = max(worst, abs(a - b) / max(abs(a), 1e-9))
    return {"cold_s": statistics.fmean(cold_s), "warm_s": statistics.fmean(warm_s), "worst_relative": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="m-large", help="ServeGen model (m-large or m-mid)")
    parser.add_argument("--origins", type=int, default=20)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warm", action="store_true", help="cold against warm-started fits, consecutive windows")
    args = parser.parse_args()

    series = load_rates(SERVEGEN, args.model)
    if args.warm:
        count = 72  # half a day of consecutive 10-minute windows, after the first 7 days
        print(f"ServeGen {args.model}: {count} consecutive forecasts from day 7, {HISTORY} windows of history, "
              f"{args.steps}-step horizon; CPU seconds per call; "
              f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
        print(f"{'predictor':<10} {'cold s':>8} {'warm s':>8} {'speed-up':>9} {'largest relative difference':>28}")
        for name in ("arima", "kalman"):
            row = warm_against_cold(name, series, first=HISTORY, count=count, steps=args.steps)
            print(f"{name:<10} {row['cold_s']:>8.3f} {row['warm_s']:>8.3f} {row['cold_s'] / row['warm_s']:>8.1f}×"
                  f" {row['worst_relative']:>28.1e}")
        return
    at = origins(len(series), count=args.origins, steps=args.steps)
    print(f"ServeGen {args.model}: {len(at)} origins every {at[1] - at[0]} windows over the last 2 days, "
          f"{HISTORY} windows (7 days) of history, {args.steps}-step horizon; "
          f"{os.cpu_count()} CPUs, OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    horizons = sorted({1, min(3, args.steps), args.steps})
    header = (f"{'predictor':<10} {'median s':>9} {'max s':>7}"
              + "".join(f"{f'MAPE {h} step' + 's' * (h > 1):>14}" for h in horizons)
              + f" {'80% PI cover':>13} {'fallbacks':>10}")
    print(header)
    print("-" * len(header))
    for name in NAMES:
        row = evaluate(name, series, at, steps=args.steps)
        print(f"{name:<10} {row['median_s']:>9.3f} {row['max_s']:>7.3f}"
              + "".join(f"{row[f'mape_{h}']:>13.1f}%" for h in horizons)
              + f" {row['coverage']:>13.2f} {int(row['fallbacks']):>10d}")


if __name__ == "__main__":
    main()
