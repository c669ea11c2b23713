"""What the oracle's sweep costs on a per-request backtest row: its needs share by share, as the backtest
computed them, against one pass for every share (`driver.request_needs_at`), with equal results.

The oracle sizes each interval for a share of its requests by simulating that interval on candidate
fleets; the same fleet's simulation serves every share, so one pass shares them.

Run: `~/.cache/fleetpilot/venv/bin/python benchmarks/oracle_needs_bench.py [--trace Mooncake] [--rate 1]`
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
    args = parser.parse_args()
    row = bt.Row(args.trace, args.rate, 120.0)
    scenario = bt.scenario(row, evaluate.load_profile(str(bt.PROFILE)))
    shares = [k for k in evaluate.KNOBS["oracle"] if k != 1.0]  # 1.0 is known from the bounds
    began = time.perf_counter()
    one_by_one = {k: driver.request_needs(scenario.requests, scenario.fleet_config, scenario.setting, attainment=k)
                  for k in shares}
    separate_s = time.perf_counter() - began
    began = time.perf_counter()
    together = driver.request_needs_at(scenario.requests, scenario.fleet_config, scenario.setting, attainments=shares)
    joint_s = time.perf_counter() - began
    assert together == one_by_one, "one pass must size every interval as the share-by-share search does"
    print(f"{row.label}: oracle needs at {len(shares)} shares, {len(one_by_one[shares[0]])} intervals: "
          f"share by share {separate_s:.1f} s, one pass {joint_s:.1f} s ({separate_s / joint_s:.1f}×), equal")


if __name__ == "__main__":
    main()
