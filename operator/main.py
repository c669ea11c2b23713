"""Entry point of `fleetpilot operator run`: start kopf with our handlers and settings."""

from __future__ import annotations

import asyncio
import logging

import kopf
import prometheus_client


def run(*, namespaces: list[str], workers: int, liveness: str | None, metrics_port: int) -> int:
    from fleetpilot.operator import handlers  # noqa: F401  (registers the handlers)

    if metrics_port:
        prometheus_client.start_http_server(metrics_port)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    memo = kopf.Memo(workers=workers)
    asyncio.run(kopf.operator(
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        memo=memo,
        liveness_endpoint=liveness,
    ))
    return 0
