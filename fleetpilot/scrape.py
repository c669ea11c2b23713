"""Reading fleetpilot's frontends' /metrics directly, not through a Prometheus scrape.

Why: Prometheus answers with what it scraped up to a scrape interval ago (15-30 s in most
clusters); the planner's fast path and scale-to-zero (planner/frontends.py) and the operator's
choice of the replica to remove (operator/reconciler.py) need what the frontends see now. Every
frontend is asked at once, with a short timeout; a reading is all or nothing, so a frontend that
does not answer makes it None and the caller falls back to what it would do without one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import httpx
from prometheus_client.parser import text_string_to_metric_families

logger = logging.getLogger("fleetpilot.scrape")

READ_TIMEOUT_S = 1.0  # a frontend slower than this is busy: the caller's fallback will do


async def read_texts(client: httpx.AsyncClient, urls: list[str]) -> list[str] | None:
    """Every URL's /metrics text, asked at once; None without a URL or unless all of them answered."""
    if not urls:
        return None

    async def one(url: str) -> str | None:
        try:
            response = await client.get(url + "/metrics", timeout=READ_TIMEOUT_S)
        except httpx.HTTPError as error:
            logger.debug("%s did not answer /metrics: %r", url, error)
            return None
        return response.text if response.status_code == 200 else None

    texts = await asyncio.gather(*(one(url) for url in urls))
    if any(text is None for text in texts):
        return None
    return [text for text in texts if text is not None]


def sum_by_label(expositions: Iterable[str], metric: str, label: str) -> dict[str, float]:
    """`metric`'s samples summed per value of `label`, over every text (a metric absent: {})."""
    totals: dict[str, float] = {}
    for text in expositions:
        for family in text_string_to_metric_families(text):
            if family.name != metric:
                continue
            for sample in family.samples:
                key = sample.labels.get(label, "")
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals
