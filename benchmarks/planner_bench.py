"""Planning time per graph per interval, for each predictor, through the real planner core.

Replays the ServeGen m-large rate series (10-minute windows) through `core.plan_interval` with the
simulator's capacity profile: each call forecasts over the horizon, sizes and constrains, exactly as
the live loop does after observing. The `constant` predictor is the same-run baseline. Each interval's
observation carries the frontend's prompt and output length histograms (lognormal lengths, mean 2,048
and 256 tokens, seeded), so the length mix is priced as live; `--no-mix` leaves them out (the means only).

Run: `~/.cache/fleetpilot/venv/bin/python benchmarks/planner_bench.py [--intervals 48]`
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the planner runs (fleetpilot/cli.py); before numpy

import numpy as np

from fleetpilot import traces
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity, core, lengths, live

SERIES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "servegen_alibaba" / "aggregate_rate_10min.csv"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--intervals", type=int, default=48, help="intervals timed, after 7 days of warm-up")
    parser.add_argument("--rate-scale", type=float, default=0.1, help="scale ServeGen's rate to a fleet of ~8 GPUs")
    parser.add_argument("--no-mix", action="store_true", help="observations without length histograms")
    parser.add_argument("--predictors", default="constant,arima,kalman,prophet")
    args = parser.parse_args()
    rng = np.random.default_rng(7)

    rates = [w.rate_rps * args.rate_scale for w in traces.load_rate_series(SERIES, model="m-large")]
    warm = 7 * 24 * 6
    model = capacity.CapacityModel(live.simulator_profile(1))
    print(f"planning time per graph per interval: ServeGen m-large x{args.rate_scale}, {warm} intervals of history,"
          f" {args.intervals} timed, {'means only' if args.no_mix else 'length histograms'}")
    print(f"  {'predictor':10} {'median CPU ms':>10} {'max CPU ms':>10} {'vs constant':>12}")
    baseline = None
    for predictor in args.predictors.split(","):
        spec = api.DynamoGraphSpec.model_validate({
            "model": {"name": "m"}, "engine": {"framework": "simulator"},
            "components": {"prefill": {"scaling": {"max": 64}}, "decode": {"scaling": {"max": 64}}},
            "planner": {"mode": "sla", "sla": {"ttftMs": 500, "itlMs": 50}, "predictor": predictor,
                        "intervalSeconds": 600},
        })
        config = core.config_from_spec(spec, startup_s=600)
        memory = core.warm_memory(tuple(rates[:warm]), (2048.0,) * warm, (256.0,) * warm, now=warm * 600.0, interval_s=600.0)
        current = {"prefill": 1, "decode": 1}
        times = []
        for step in range(warm, warm + args.intervals):
            isl_histogram = osl_histogram = None
            if not args.no_mix:
                isl_histogram = lengths.of_lengths(rng.lognormal(np.log(2048) - 0.5, 1.0, 500).tolist())
                osl_histogram = lengths.of_lengths(rng.lognormal(np.log(256) - 0.5, 1.0, 500).tolist())
            observation = core.Observation(time=step * 600.0, rate_rps=rates[step], isl=2048, osl=256,
                                           ttft_s=0.3, itl_s=0.03, prefill_s=0.25, itl_mean_s=0.025,
                                           isl_histogram=isl_histogram, osl_histogram=osl_histogram)
            started = time.process_time()  # CPU: the figure a busy machine does not distort
            plan, memory = core.plan_interval(config, observation, memory, current=current, capacity=model,
                                              now=step * 600.0)
            times.append(time.process_time() - started)
            current = dict(plan.replicas)
        median, worst = statistics.median(times) * 1e3, max(times) * 1e3
        baseline = baseline or median
        print(f"  {predictor:10} {median:>10.1f} {worst:>10.1f} {median / baseline:>11.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
