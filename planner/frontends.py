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
    return _phases_and_started(exposition)[0]


def _phases_and_started(exposition: str) -> tuple[dict[str, float] | None, float | None]:
    """Both readings of one frontend's /metrics text, parsed once."""
    in_phase: dict[str, float] = {}
    received: float | None = None
    for family in text_string_to_metric_families(exposition):
        if family.name == contract.PHASE_METRIC:
            for sample in family.samples:
                phase = sample.labels.get("phase", "")
                in_phase[phase] = in_phase.get(phase, 0.0) + sample.value
        elif family.name == contract.STARTED_METRIC:
            received = sum(s.value for s in family.samples if s.name == f"{contract.STARTED_METRIC}_total")
    return in_phase or None, received


def gauges_from_expositions(expositions: Iterable[str]) -> EngineGauges | None:
    """The fast path's gauges summed over a graph's frontends: requests in the prefill hop, prefilled ones
    waiting for their first token (a decode slot, the KV transfer), streaming ones, and the requests they
    have received (None unless every frontend says). None when there is no frontend or one of them does
    not export the phases (an older frontend)."""
    total: dict[str, float] = {}
    received: float | None = 0.0
    seen = 0
    for text in expositions:
        counts, count = _phases_and_started(text)
        if counts is None:
            return None
        seen += 1
        for phase, value in counts.items():
            total[phase] = total.get(phase, 0.0) + value
        received = None if count is None or received is None else received + count
    if not seen:
        return None
    return EngineGauges(prefill_waiting=total.get("prefill", 0.0), decode_running=total.get("decoding", 0.0),
                        decode_waiting=total.get("first_token", 0.0), started=received)


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
