"""Entry point of `fleetpilot planner run`: one process for every graph with the planner on.

With `--leader-elect`, several replicas may run: each waits for the leader Lease (fleetpilot.leader)
before planning, so only one writes /scale, status and Events. A leader that loses the Lease exits
at once with status 1; on SIGTERM it finishes the graph at hand and hands the Lease back.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

import prometheus_client

from fleetpilot import leader
from fleetpilot.api import contract


async def _main(args: argparse.Namespace) -> None:
    # Imported here: the predictors pull in statsmodels and prophet, which other commands never need.
    from fleetpilot import kube
    from fleetpilot.planner import live
    from fleetpilot.planner.observe import PrometheusObserver

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    api = kube.KubeApi(field_manager=contract.PLANNER)
    budgets = {}
    for item in args.gpu_budget:
        name, _, gpus = item.partition("=")
        if not gpus.isdigit():
            raise SystemExit(f"fleetpilot planner: --gpu-budget takes NAME=GPUS, not {item!r}")
        budgets[name] = int(gpus)
    planner = live.LivePlanner(api, PrometheusObserver(args.prometheus_url), namespaces=args.namespace or None,
                               startup_s=args.startup_seconds, hold_s=args.hold_seconds, budgets=budgets)
    try:
        if not args.leader_elect:
            live.LEADER.set(1)
            await planner.run(stop)
            return
        elector = leader.elector_from_args(api, args, on_change=lambda leading: live.LEADER.set(int(leading)))
        if not await elector.acquire(stop):
            return
        planner.may_act = lambda: elector.leading
        holding = asyncio.create_task(elector.hold(stop), name="leader lease")
        planning = asyncio.create_task(planner.run(stop), name="planner")
        await asyncio.wait({holding, planning}, return_when=asyncio.FIRST_COMPLETED)
        if holding.done() and (holding.cancelled() or holding.exception() is not None):
            leader.exit_now()  # another replica may already plan: not one more write from here
        stop.set()
        await planning  # re-raises if the loop itself failed
        await holding
        await elector.release()
    finally:
        await api.aclose()


def run(args: argparse.Namespace) -> int:
    if not args.prometheus_url:
        raise SystemExit("fleetpilot planner run: --prometheus-url is required, e.g. http://prometheus.monitoring:9090")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "cmdstanpy", "prophet"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.metrics_port:
        prometheus_client.start_http_server(args.metrics_port)
    asyncio.run(_main(args))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `fleetpilot planner run` (`planner.cli` puts them beside the backtest's)."""
    parser.add_argument("--prometheus-url", help="run: e.g. http://prometheus.monitoring:9090")
    parser.add_argument("--namespace", "-n", action="append", default=[], help="plan only these (repeatable)")
    parser.add_argument("--startup-seconds", type=float, default=120.0,
                        help="how long a new replica takes to become ready: the forecast horizon")
    parser.add_argument("--hold-seconds", type=float, default=None,
                        help="how long load must stay low before a scale-down (default: 5 intervals)")
    parser.add_argument("--gpu-budget", action="append", default=[], metavar="NAME=GPUS",
                        help="a GPU budget graphs share by naming it in spec.planner.budget (repeatable)")
    parser.add_argument("--metrics-port", type=int, default=8081, help="Prometheus metrics port (0: off)")
    leader.add_arguments(parser, lease_name=contract.PLANNER)
