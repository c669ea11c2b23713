"""Entry point of `fleetpilot operator run`: start kopf with our handlers and settings.

With `--leader-elect`, the replica first waits for the leader Lease (fleetpilot.leader) and only
then starts kopf, so a standby neither watches nor reconciles. kopf's own peering stays off
(standalone): the Lease is the one arbiter. A leader that loses the Lease exits at once with
status 1, and Kubernetes restarts it as a standby; on SIGTERM it stops kopf, then hands the Lease
back so the standby takes over without waiting for it to expire.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import kopf
import prometheus_client

from fleetpilot import kube, leader
from fleetpilot.operator import metrics

logger = logging.getLogger("fleetpilot.operator")


def run(*, namespaces: list[str], workers: int, liveness: str | None, metrics_port: int,
        election: argparse.Namespace | None = None, monitoring_namespace: str = "monitoring",
        control_plane_namespace: str = "") -> int:
    """Run until SIGTERM; `election` holds the --leader-elect flags (`leader.add_arguments`). The two
    namespaces reach every graph's NetworkPolicies through kopf's memo (render.RenderSettings)."""
    from fleetpilot.operator import handlers  # noqa: F401  (registers the handlers)

    if metrics_port:
        prometheus_client.start_http_server(metrics_port)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    options: dict[str, Any] = {
        "standalone": True,
        "clusterwide": not namespaces,
        "namespaces": namespaces,
        "memo": kopf.Memo(workers=workers, monitoring_namespace=monitoring_namespace,
                          control_plane_namespace=control_plane_namespace),
        "liveness_endpoint": liveness,
    }
    if election is None or not election.leader_elect:
        metrics.LEADER.set(1)
        asyncio.run(kopf.operator(**options))
        return 0
    return asyncio.run(_run_elected(election, options))


async def _run_elected(election: argparse.Namespace, options: dict[str, Any]) -> int:
    api = kube.KubeApi()
    elector = leader.elector_from_args(api, election, on_change=lambda leading: metrics.LEADER.set(int(leading)))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # kopf installs its own handlers once it starts
        loop.add_signal_handler(sig, stop.set)
    try:
        async with _standby_liveness(options["liveness_endpoint"]):
            if not await elector.acquire(stop):
                return 0
        holding = asyncio.create_task(elector.hold(stop), name="leader lease")

        async def hand_back(**_: Any) -> None:
            # kopf runs cleanup handlers in the order they were registered, after its watchers have
            # stopped and after handlers.stop_reconciler: nothing of ours writes any more, so the
            # standby may start now rather than after kopf's own shutdown (5 s more, for hung tasks).
            stop.set()
            await asyncio.wait({holding})
            await elector.release()

        kopf.on.cleanup(id="release-leader-lease")(hand_back)
        operating = asyncio.create_task(kopf.operator(**options, stop_flag=stop), name="kopf")
        await asyncio.wait({holding, operating}, return_when=asyncio.FIRST_COMPLETED)
        if holding.done() and (holding.cancelled() or holding.exception() is not None):
            leader.exit_now()  # another replica may already act: not one more write from here
        stop.set()
        await holding
        await elector.release()  # unless hand_back did already
        await operating  # re-raises if kopf itself failed
        return 0
    finally:
        await api.aclose()


@contextlib.asynccontextmanager
async def _standby_liveness(endpoint: str | None) -> AsyncIterator[None]:
    """Answer the liveness probe while waiting for the Lease (kopf serves it once it runs): a standby is alive."""
    if not endpoint:
        yield
        return
    parts = urllib.parse.urlsplit(endpoint)

    async def alive(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response({"standby": True})

    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.get(parts.path or "/", alive)])
    runner = aiohttp.web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, parts.hostname or "127.0.0.1", parts.port or 80).start()
    try:
        yield
    finally:
        await runner.cleanup()  # free the port for kopf's own endpoint
