"""How busy each worker pod is, as the graph's frontends count it: the input of scaledown.py.

Where it sits: an adapter of the reconciler, used only when a Deployment is about to shrink. It asks
every Ready frontend pod of the graph for its /metrics (1-s timeout) and sums
`fleetpilot_frontend_worker_inflight_requests{worker=<pod>}` over them. A frontend that does not
answer makes the reading incomplete: None, and the ReplicaSet chooses as it would without us.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fleetpilot.api import contract

logger = logging.getLogger("fleetpilot.operator")

READ_TIMEOUT_S = 1.0


def worker_loads(expositions: Iterable[str]) -> dict[str, float]:
    """Requests in flight per worker pod, summed over the frontends' /metrics texts."""
    loads: dict[str, float] = {}
    for text in expositions:
        for family in text_string_to_metric_families(text):
            if family.name != contract.WORKER_LOAD_METRIC:
                continue
            for sample in family.samples:
                worker = sample.labels.get("worker", "")
                loads[worker] = loads.get(worker, 0.0) + sample.value
    return loads


async def read(client: httpx.AsyncClient, urls: list[str]) -> dict[str, float] | None:
    """GET every frontend's /metrics at once; None unless there was one and every one answered."""
    if not urls:
        return None

    async def one(url: str) -> str | None:
        try:
            response = await client.get(url + "/metrics", timeout=READ_TIMEOUT_S)
        except httpx.HTTPError as error:
            logger.info("frontend %s did not answer /metrics (%r): the ReplicaSet picks the replica to remove",
                        url, error)
            return None
        return response.text if response.status_code == 200 else None

    texts = await asyncio.gather(*(one(url) for url in urls))
    if any(text is None for text in texts):
        return None
    return worker_loads(text for text in texts if text is not None)
