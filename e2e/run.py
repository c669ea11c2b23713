"""Run the closed-loop scenarios by hand, or bring the environment up and leave it running.

    ~/.cache/fleetpilot/venv/bin/python e2e/run.py            # both scenarios, then stop everything
    ~/.cache/fleetpilot/venv/bin/python e2e/run.py --keep     # both scenarios, and leave it all up
    ~/.cache/fleetpilot/venv/bin/python e2e/run.py up         # only the environment, left up
    ~/.cache/fleetpilot/venv/bin/python e2e/run.py down       # stop what --keep or `up` left

Safe from the repository root: it runs this folder's modules, never the root's operator/ folder.
With the environment up: `export KUBECONFIG=~/.cache/fleetpilot/clusters/e2e/admin.kubeconfig`,
Prometheus at http://127.0.0.1:29490, logs under ~/.cache/fleetpilot/clusters/e2e/e2e/.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import harness as harness_mod
import scenario as scenario_mod

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", nargs="?", choices=["test", "up", "down"], default="test")
    parser.add_argument("--keep", action="store_true", help="leave everything running after the scenarios")
    parser.add_argument("-k", default=None, help="only the scenarios matching this pytest -k expression")
    args = parser.parse_args()
    if args.action == "down":
        harness_mod.Harness().down()
        return 0
    if args.action == "up":
        environment = harness_mod.Harness(planner_args=[
            "--startup-seconds", str(scenario_mod.ClosedLoop.startup_s),
            "--hold-seconds", str(scenario_mod.ClosedLoop.hold_s)])
        environment.up()
        print(f"e2e: up; KUBECONFIG={environment.config.kubeconfig}; Prometheus {environment.prometheus_url};"
              f" logs in {environment.state / 'logs'}; stop with: {sys.executable} {__file__} down")
        return 0
    import pytest

    if args.keep:
        os.environ["FLEETPILOT_E2E_KEEP"] = "1"
    return int(pytest.main([str(HERE), "-p", "no:cacheprovider", "-v", "-s", *(["-k", args.k] if args.k else [])]))


if __name__ == "__main__":
    sys.exit(main())
