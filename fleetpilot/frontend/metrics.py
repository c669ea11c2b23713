"""The metric contract of DESIGN.md: what the frontend exports and the planner and dashboards read.

Graph and namespace are not labels here: Prometheus adds them from the pod's labels at scrape time.
Latency buckets resolve the SLA targets people use, from 1 ms (a fast decode step) to 60 s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fleetpilot.api import contract

LATENCY_BUCKETS = contract.LATENCY_BUCKETS
# Requests/s from 0.2 (one request in a 5 s window) to about 13,000, 20% apart.
RATE_BUCKETS = tuple(round(0.2 * 1.2**i, 3) for i in range(62))
PHASES = contract.PHASES
TOKEN_BUCKETS = contract.TOKEN_BUCKETS


class _WorkerLoad(Collector):
    """Requests in flight per worker pod, read at scrape time: no series outlives its worker."""

    def __init__(self, model: str, source: Callable[[], dict[str, int]]) -> None:
        self.model = model
        self.source = source

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            contract.WORKER_LOAD_METRIC,
            "Requests this frontend has in flight on each worker pod (label worker: the pod's name; idle workers "
            "are left out). Before a scale-down the operator removes the least loaded replica first.",
            labels=["model", "worker"])
        for worker, count in sorted(self.source().items()):
            family.add_metric([self.model, worker], count)
        yield family


class FrontendMetrics:
    """One set per frontend, in its own registry (several frontends may share a test process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("fleetpilot_frontend_requests", "Finished requests by status (ok, error, cancelled).",
                                ["model", "status"], registry=r)
        self.rejected = Counter("fleetpilot_frontend_requests_rejected",
                                "Requests refused before any worker saw them, by the field at fault (param).",
                                ["model", "param"], registry=r)
        self.auth_refusals = Counter(
            "fleetpilot_frontend_auth_refusals",
            "Requests refused by the API-key check before anything else saw them, by reason: missing_key, "
            "invalid_key, no_keys (none in force: 401) or in_flight_limit (429). Never labelled by key; only "
            "exported by a frontend with API keys on.", ["model", "reason"], registry=r)
        self.in_phase = Gauge(
            contract.PHASE_METRIC,
            "Requests in flight by where they are: prefill (the prefill hop: queued or computing), first_token "
            "(prefilled, or aggregated and sent, waiting for the first token: a decode slot and the KV transfer), "
            "decoding (streaming tokens). The planner's fast path reads them: any engine, no engine metrics needed.",
            ["model", "phase"], registry=r)
        self.started = Counter(contract.STARTED_METRIC, "Requests received: the offered load.",
                               ["model"], registry=r)
        self.inflight = Gauge("fleetpilot_frontend_inflight_requests", "Requests being served.", ["model"], registry=r)
        self.ttft = Histogram(
            "fleetpilot_frontend_time_to_first_token_seconds",
            "Time to first token, per request: from its arrival in the frontend's ASGI app to its first chunk "
            "with content written to the client (streaming) or received from the worker (not streaming).",
            ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.prefill = Histogram(
            "fleetpilot_frontend_prefill_seconds",
            "Disaggregated graphs: from request received until the prefill worker handed the KV cache over "
            "(queueing and prompt compute): TTFT's part that prefill answers for; the rest is KV transfer "
            "and waiting for a decode slot.", ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.first_token_wait = Histogram(
            "fleetpilot_frontend_first_token_wait_seconds",
            "Disaggregated graphs: from the prefill worker handing the KV cache over until the first token "
            "(KV transfer and waiting for a decode slot): TTFT's part that decode answers for.",
            ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.decode = Histogram(
            "fleetpilot_frontend_decode_seconds", "From the first token to the last: the generation itself.",
            ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.arrival_burst = Histogram(
            "fleetpilot_frontend_arrival_burst_rps",
            "One observation per request: the requests this frontend received in the trailing "
            "BURST_WINDOW_S seconds (fleetpilot/api/contract.py), per second. Its percentile is the burst "
            "the SLA percentile's request arrived into; the planner sizes prefill for it.",
            ["model"], buckets=RATE_BUCKETS, registry=r)
        self.itl = Histogram("fleetpilot_frontend_inter_token_latency_seconds",
                             "One observation per request: its mean inter-token latency.",
                             ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.duration = Histogram("fleetpilot_frontend_request_duration_seconds",
                                  "End-to-end request duration, from its arrival in the frontend's ASGI app.",
                                  ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.input_tokens = Histogram("fleetpilot_frontend_input_tokens", "Input sequence length (ISL).",
                                      ["model"], buckets=TOKEN_BUCKETS, registry=r)
        self.prefix_query_blocks = Counter(
            "fleetpilot_frontend_prefix_query_blocks", "Prompt blocks routed to where the prompt is prefilled.",
            ["model"], registry=r)
        self.prefix_hit_blocks = Counter(
            "fleetpilot_frontend_prefix_hit_blocks",
            "Of those, blocks the chosen worker had recently seen (an estimate of KV-cache hits).", ["model"], registry=r)
        self.held = Gauge(
            contract.HELD_METRIC,
            "Requests waiting in this frontend for a worker to become ready (none was: a pool scaled to zero and "
            "starting, or a rollout's gap). The planner reads it directly to wake a pool scaled to zero.",
            ["model"], registry=r)
        self.held_outcomes = Counter(
            "fleetpilot_frontend_requests_held",
            "Requests that had to wait for a worker, by how it ended: served, timeout (503 after the hold), "
            "queue_full (503 at once).", ["model", "outcome"], registry=r)
        self.idle = Gauge(
            contract.IDLE_METRIC,
            "Seconds since this frontend last received a request (since it started, before the first): the "
            "planner's idle clock for scale to zero.", ["model"], registry=r)
        self.generation_pairs = Counter(
            "fleetpilot_frontend_generation_pairs",
            "Disaggregated requests by the generation of their prefill worker and of their decode worker: the two "
            "are always equal (a KV cache never crosses engine or model versions).",
            ["model", "prefill_generation", "decode_generation"], registry=r)
        self.output_tokens = Histogram("fleetpilot_frontend_output_tokens", "Output sequence length (OSL).",
                                       ["model"], buckets=TOKEN_BUCKETS, registry=r)

    def track_worker_load(self, model: str, source: Callable[[], dict[str, int]]) -> None:
        """Export `source()` (in flight per worker pod) as the per-worker load gauge."""
        self.registry.register(_WorkerLoad(model, source))
