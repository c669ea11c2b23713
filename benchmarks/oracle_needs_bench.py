"""What the oracle's sweep costs on a per-request backtest row: its needs share by share, as the backtest
once computed them, against one pass for every share (`driver.request_needs_at`), in one process and
split between `--workers` processes, with equal results asserted.

The oracle sizes each interval for a share of its requests by simulating that interval on candidate
fleets; the same fleet's simulation serves every share, so one pass shares them; the intervals are
searched in fixed segments (`driver.NEEDS_SEGMENT`), so processes can share the segments.

Run: `~/.cache/fleetpilot/venv/bin/python benchmarks/oracle_needs_bench.py [--trace Mooncake] [--rate 1]
[--workers 2] [--no-share-by-share]` (share by share takes ~5× one pass: skip it at ×16).
"""

from __future__ import annotations

import argparse
import time

import backtest as bt

from fleetpilot.planner.backtest import driver, evaluate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="Mooncake conversation", choices=sorted(bt.REQUEST_TRACES))
    parser.add_argument("--rate", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-share-by-share", dest="share_by_share", action="store_false")
    args = parser.parse_args()
    row = bt.Row(args.trace, args.rate, 120.0)
    began = time.perf_counter()
    scenario = bt.scenario(row, evaluate.load_profile(str(bt.PROFILE)), workers=args.workers)
    bounds_s = time.perf_counter() - began
    print(f"{row.label}: {len(scenario.requests):,} requests; the bounds' search (share 1, {args.workers} "
          f"processes) {bounds_s:.1f} s", flush=True)
    shares = [k for k in evaluate.KNOBS["oracle"] if k != 1.0]  # 1.0 is known from the bounds
    timings: dict[str, float] = {}
    found: dict[str, dict[float, list[dict[str, int]]]] = {}
    if args.share_by_share:
        began = time.perf_counter()
        found["share by share"] = {
            k: driver.request_needs(scenario.requests, scenario.fleet_config, scenario.setting, attainment=k)
            for k in shares}
        timings["share by share"] = time.perf_counter() - began
    for label, workers in (("one pass, 1 process", 1), (f"one pass, {args.workers} processes", args.workers)):
        began = time.perf_counter()
        found[label] = driver.request_needs_at(scenario.requests, scenario.fleet_config, scenario.setting,
                                               attainments=shares, workers=workers)
        timings[label] = time.perf_counter() - began
    reference = found["one pass, 1 process"]
    assert all(needs == reference for needs in found.values()), "every way must size every interval alike"
    slowest = max(timings.values())
    print(f"oracle needs at {len(shares)} shares, {len(reference[shares[0]])} intervals: " + ", ".join(
        f"{label} {seconds:.1f} s ({slowest / seconds:.1f}×)" for label, seconds in timings.items()) + "; equal")


if __name__ == "__main__":
    main()
