"""What one per-request simulation costs as the fleet grows, against the simulator of another revision
in the same run, with equal outcomes asserted.

The oracle's search (`driver.request_needs_at`) and the bounds it derives simulate every interval of a
row on fleets up to 16× the busiest interval's believed need: at rate ×16 hundreds of replicas, where
the per-request simulator's cost per routed request is what decides whether a row runs in minutes.

Run (from benchmarks/): `~/.cache/fleetpilot/venv/bin/python fleetsim_bench.py [--trace "Azure code 2023"]
[--rate 16] [--minutes 5] [--fleets 8,64,256] [--baseline REV]` — `--baseline` (default HEAD: the working
tree's uncommitted change against its commit) is checked out into a temporary git worktree and its
`planner/backtest/fleetsim.py` imported beside this one. `--baseline 5ce0b0e` measures the pick from the
serving replicas against the scan of every replica it replaced (2fc462f).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import backtest as bt
import numpy as np

from fleetpilot.planner.backtest import evaluate, fleetsim

REPO = Path(__file__).resolve().parents[1]


def module_at(revision: str, folder: Path, path: str = "planner/backtest/fleetsim.py") -> ModuleType:
    """The module at `path` as it was at `revision` (checked out as a git worktree in `folder`), imported
    under another name; what it imports comes from this tree."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(folder), revision],
                   check=True)
    spec = importlib.util.spec_from_file_location(f"{Path(path).stem}_baseline", folder / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def _simulate(module: ModuleType, config: fleetsim.FleetConfig, requests: list, replicas: int, *,
              rescale_every_s: float | None = None) -> tuple[float, fleetsim.RequestOutcomes]:
    """One run; `rescale_every_s`: halve prefill and double decode, then back, in turns (replicas start,
    are cancelled and drain, as a policy's run has them)."""
    sim = module.FleetSimulator(config, requests, {"prefill": replicas, "decode": replicas})
    began = time.perf_counter()
    if rescale_every_s is not None:
        end = requests[-1].arrival_s if requests else 0.0
        turns = 0
        while (turns + 1) * rescale_every_s < end:
            turns += 1
            sim.run_until(turns * rescale_every_s)
            odd = turns % 2 == 1
            sim.set_target("prefill", max(1, replicas // 2) if odd else replicas)
            sim.set_target("decode", 2 * replicas if odd else replicas)
    sim.finish()
    return time.perf_counter() - began, sim.outcomes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="Azure code 2023", choices=sorted(bt.REQUEST_TRACES))
    parser.add_argument("--rate", type=float, default=16.0)
    parser.add_argument("--minutes", type=float, default=5.0, help="simulate the trace's first minutes")
    parser.add_argument("--fleets", default="8,64,256", help="prefill = decode replicas, comma-separated")
    parser.add_argument("--baseline", default="HEAD", help="the revision to compare with")
    args = parser.parse_args()
    path, _ = bt.REQUEST_TRACES[args.trace]
    from fleetpilot import traces  # the trace at the row's rate, as the backtest loads it
    requests = [r for r in traces.load(path, shape=traces.Shape(rate_factor=args.rate))
                if r.arrival_s < args.minutes * 60]
    instant = evaluate.fleet_config(evaluate.default_timing(), 0.0)  # the oracle's search: fixed fleets
    starting = evaluate.fleet_config(evaluate.default_timing(), 120.0)  # a policy's run: replicas come and go
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "baseline"
        try:
            baseline = module_at(args.baseline, folder)
            print(f"{args.trace} ×{args.rate:g}, first {args.minutes:g} min: {len(requests):,} requests; "
                  f"baseline {args.baseline}")
            cases = [(n, instant, None) for n in (int(n) for n in args.fleets.split(","))]
            cases.append((cases[-1][0], starting, 90.0))
            for replicas, config, rescale in cases:
                before_s, before = _simulate(baseline, config, requests, replicas, rescale_every_s=rescale)
                after_s, after = _simulate(fleetsim, config, requests, replicas, rescale_every_s=rescale)
                for field in ("ttft", "itl", "failed"):
                    assert np.array_equal(getattr(before, field), getattr(after, field), equal_nan=field != "failed"), \
                        f"{field} differs at {replicas} replicas"
                how = (f"rescaled every {rescale:g} s, startup {config.startup_s:g} s" if rescale
                       else "fixed fleet, instant startup")
                print(f"  {replicas:4d} prefill + {replicas:4d} decode, {how}: baseline {before_s:6.2f} s, "
                      f"this tree {after_s:6.2f} s ({before_s / after_s:.1f}×), equal outcomes")
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(folder)], check=False)


if __name__ == "__main__":
    main()
