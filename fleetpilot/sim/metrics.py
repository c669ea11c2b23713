"""The simulator's Prometheus metrics, under vLLM's names, so one dashboard serves both engines.

Where it sits: `server` builds one `SimMetrics` per engine, each with its own CollectorRegistry (so
several simulated workers can share a process, as in tests and the fleet demo). Gauges and counters
are read from the engine's `Snapshot` at scrape time, so they can never drift from the scheduler's
own state; the latency histograms are fed by the engine's finish listener.

All durations are simulated seconds: at `--speedup 10` the histograms show the latencies the modelled
GPU would give, not the ten-times-shorter wall-clock ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetpilot.sim import scheduler

# From a few milliseconds (one decode step) to minutes (a long queue), dense where SLAs sit.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
    0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
ITL_BUCKETS = (
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)


class _EngineCollector(Collector):
    """Gauges and counters straight from the scheduler's state and totals."""

    def __init__(self, model_name: str, snapshot: Callable[[], scheduler.Snapshot], block_size: int) -> None:
        self._model_name = model_name
        self._snapshot = snapshot
        self._block_size = block_size

    def collect(self) -> Iterable[Metric]:
        snap = self._snapshot()
        labels = [self._model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(labels, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(labels, value)
            return family

        yield gauge("vllm:num_requests_running", "Requests in the running batch.", snap.running)
        yield gauge("vllm:num_requests_waiting", "Requests queued, preempted or receiving KV.", snap.waiting)
        yield gauge("vllm:kv_cache_usage_perc", "Share of KV-cache blocks in use (1 = full).", snap.kv_usage)
        yield counter("vllm:num_preemptions", "Requests preempted for lack of KV cache.", snap.preemptions)
        yield counter("vllm:prompt_tokens", "Prompt tokens of requests that got a token.", snap.prompt_tokens)
        yield counter("vllm:generation_tokens", "Generated tokens.", snap.generation_tokens)
        # vLLM's prefix-cache counters, in tokens: prompt tokens looked up at admission and those found.
        yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                      snap.prefix_cache_queries)
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                      snap.prefix_cache_hits)
        success = CounterMetricFamily("vllm:request_success", "Finished requests by finish reason.",
                                      labels=["model_name", "finished_reason"])
        for reason in sorted({scheduler.FINISH_LENGTH, *snap.finished}):
            success.add_metric([self._model_name, reason], snap.finished.get(reason, 0))
        yield success
        # vLLM's info metric of its cache configuration (value 1, the facts in labels): what
        # `fleetpilot profile` reads the KV capacity from.
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the KV cache configuration.",
                                 labels=["block_size", "num_gpu_blocks", "enable_prefix_caching"])
        info.add_metric([str(self._block_size), str(snap.kv_blocks_total), str(snap.prefix_caching)], 1.0)
        yield info


class SimMetrics:
    """One engine's metrics in their own registry; `observe` is the engine's finish listener."""

    def __init__(
        self,
        *,
        model_name: str,
        snapshot: Callable[[], scheduler.Snapshot],
        registry: CollectorRegistry | None = None,
        block_size: int = 16,
    ) -> None:
        self.model_name = model_name
        self.registry = registry if registry is not None else CollectorRegistry()
        self.registry.register(_EngineCollector(model_name, snapshot, block_size))

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ["model_name"], buckets=buckets, registry=self.registry)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token.", LATENCY_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between output tokens.", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to last token.", LATENCY_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds", "Arrival to admission.", LATENCY_BUCKETS)

    def observe(self, record: scheduler.RequestRecord) -> None:
        label = self.model_name
        if record.first_token is not None:
            self.ttft.labels(label).observe(record.first_token - record.arrival)
        itl = self.itl.labels(label)
        for gap in record.inter_token_latencies:
            itl.observe(gap)
        self.e2e.labels(label).observe(record.finished - record.arrival)
        if record.scheduled is not None:
            self.queue.labels(label).observe(record.scheduled - record.arrival)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
