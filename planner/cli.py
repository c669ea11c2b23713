"""The `fleetpilot planner` command: `run` plans live, `backtest` replays a trace through a simulated fleet.

Where it sits: above both drivers of the planner core, so that neither imports the other — the live
planner (`main`) knows nothing of the backtest (`backtest.cli`), and the backtest nothing of
Prometheus or Kubernetes. Each action's modules are imported only when it runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from fleetpilot.planner import main
from fleetpilot.planner.backtest import cli as backtest_cli


def run(args: argparse.Namespace) -> int:
    if args.action == "backtest":
        return backtest_cli.run(args)
    return main.run(args)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("planner", help="the SLA planner for every graph with spec.planner.mode not off")
    parser.add_argument("action", choices=["run", "backtest"],
                        help="run: plan live from Prometheus; backtest: replay a trace through a simulated fleet")
    main.add_arguments(parser)
    backtest_cli.add_arguments(parser)
    parser.set_defaults(func=run)
