"""What one fluid run of a 14-day ServeGen row costs, against the fluid model of another revision in the
same run, with equal outcomes asserted.

The ServeGen rows of the backtest run every policy's sweep on the fluid fleet model (`planner/backtest/
fluid.py`) over 20,160 one-minute steps; at m-mid's hundreds of replicas the fleet's own bookkeeping,
not the planner, was most of a run.

Run (from benchmarks/): `~/.cache/fleetpilot/venv/bin/python fluid_bench.py [--model m-mid] [--policy
fleetpilot-constant] [--knob 0.9] [--baseline REV]` — `--baseline` (default HEAD) is checked out into a
temporary git worktree and its `planner/backtest/fluid.py` imported beside this one; both runs use this
tree's planner and driver.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path
from types import ModuleType

import backtest as bt
from fleetsim_bench import REPO, module_at

from fleetpilot.planner.backtest import driver, evaluate, fluid


def _run(module: ModuleType, scenario: evaluate.Scenario, group: str, knob: float) -> tuple[float, driver.RunResult]:
    """One run of `group` at `knob` on `scenario`, its fleet built by `module`'s FluidFleet."""
    original = fluid.FluidFleet
    fluid.FluidFleet = module.FluidFleet  # what Scenario.make_fleet builds
    try:
        began = time.perf_counter()
        result = evaluate.run_group(scenario, group, knobs={**evaluate.KNOBS, evaluate.knob_kind(group): (knob,)},
                                    bracket=False).results[0]
        return time.perf_counter() - began, result
    finally:
        fluid.FluidFleet = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="m-mid", help="the ServeGen model (m-large runs at rate ×0.1)")
    parser.add_argument("--policy", default="fleetpilot-constant")
    parser.add_argument("--knob", type=float, default=0.9)
    parser.add_argument("--baseline", default="HEAD", help="the revision to compare with")
    args = parser.parse_args()
    row = bt.Row("ServeGen", 0.1 if args.model == "m-large" else 1.0, 120.0, args.model)
    scenario = bt.scenario(row, evaluate.load_profile(str(bt.PROFILE)))
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "baseline"
        try:
            baseline = module_at(args.baseline, folder, "planner/backtest/fluid.py")
            before_s, before = _run(baseline, scenario, args.policy, args.knob)
            after_s, after = _run(fluid, scenario, args.policy, args.knob)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(folder)], check=False)
    assert (before.gpu_hours, before.effective, before.actions) == (after.gpu_hours, after.effective, after.actions), \
        "the fluid must run the same fleet to the same scores"
    print(f"{row.label}, {args.policy} at {args.knob:g} ({after.gpu_hours:,.1f} GPU-h, {after.actions} actions): "
          f"baseline {args.baseline} {before_s:.1f} s, this tree {after_s:.1f} s ({before_s / after_s:.1f}×), "
          "equal outcomes")


if __name__ == "__main__":
    main()
