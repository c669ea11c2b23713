"""The fast path's fresh reading: a graph's frontends asked directly, not through Prometheus.

Why: Prometheus answers with what it scraped up to a scrape interval ago (15-30 s in most clusters),
and a burst fills a queue in seconds. The frontends know where every request is right now
(`fleetpilot_frontend_requests_in_phase`), whatever the engine; and whether any request waits for a worker
of a pool scaled to zero (`fleetpilot_frontend_held_requests`, planner/zero.py). The live planner watches the frontend
Pods (one label-selected watch per namespace) and, when the fast path runs, reads each Ready one's
/metrics. A reading is all or nothing: one frontend that does not answer in time makes it incomplete,
and the caller falls back to Prometheus.

`gauges_from_expositions` and `demand_from_expositions` are pure (text in, numbers out); `read_gauges` and
`fleetpilot.scrape.read_texts` are the HTTP around them.
"""

from __future__ import annotations

from collections.abc import Iterable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fleetpilot import scrape
from fleetpilot.api import contract
from fleetpilot.planner import zero
from fleetpilot.planner.observe import EngineGauges


def phases(exposition: str) -> dict[str, float] | None:
    """Requests per phase in one frontend's /metrics text (summed over models), or None without the metric."""
    return scrape.sum_by_label([exposition], contract.PHASE_METRIC, "phase") or None


def gauges_from_expositions(expositions: Iterable[str]) -> EngineGauges | None:
    """The fast path's gauges summed over a graph's frontends: requests in the prefill hop, prefilled ones
    waiting for their first token (a decode slot, the KV transfer), streaming ones. None when there is no
    frontend or one of them does not export the phases (an older frontend)."""
    total: dict[str, float] = {}
    seen = 0
    for text in expositions:
        counts = phases(text)
        if counts is None:
            return None
        seen += 1
        for phase, value in counts.items():
            total[phase] = total.get(phase, 0.0) + value
    if not seen:
        return None
    return EngineGauges(prefill_waiting=total.get("prefill", 0.0), decode_running=total.get("decoding", 0.0),
                        decode_waiting=total.get("first_token", 0.0))


def demand_from_expositions(expositions: Iterable[str]) -> zero.Demand | None:
    """Held and in-flight requests summed over a graph's frontends, and the least time since any of
    them received a request; None without a frontend or when one does not export them."""
    held = inflight = 0.0
    idle: float | None = None
    seen = 0
    for text in expositions:
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name in (contract.HELD_METRIC, contract.IDLE_METRIC, contract.INFLIGHT_METRIC):
                values[family.name] = sum(sample.value for sample in family.samples)
        if contract.HELD_METRIC not in values or contract.IDLE_METRIC not in values:
            return None
        seen += 1
        held += values[contract.HELD_METRIC]
        inflight += values.get(contract.INFLIGHT_METRIC, 0.0)
        idle = values[contract.IDLE_METRIC] if idle is None else min(idle, values[contract.IDLE_METRIC])
    if not seen or idle is None:
        return None
    return zero.Demand(held=held, inflight=inflight, idle_s=idle)


async def read_gauges(client: httpx.AsyncClient, urls: list[str]) -> EngineGauges | None:
    """GET every frontend's /metrics at once; None unless there was one and all of them answered."""
    texts = await scrape.read_texts(client, urls)
    return None if texts is None else gauges_from_expositions(texts)
