"""Step 1 of the planner: observe a graph's load and latency in Prometheus.

Reads only the frontend's metric contract (DESIGN.md): offered request rate, mean ISL and OSL, and
TTFT, ITL and TTFT's prefill part at the SLA percentile through `histogram_quantile` (the prefill part
is absent for an aggregated graph: the planner then blames TTFT whole), the mean ITL, the arrival
burst the percentile's request saw, and the prompt- and output-length histograms (the mix it sizes for). Prometheus adds the graph and
namespace labels from the pods' labels at scrape time. An answer that is empty, NaN or older than
the interval is "no data": the planner then holds, it never decides from nothing.
"""

from __future__ import annotations

import datetime
import math
import time
from dataclasses import dataclass

from prometheus_api_client import PrometheusConnect

from fleetpilot.api import contract
from fleetpilot.planner import lengths
from fleetpilot.planner.core import Observation


@dataclass(frozen=True)
class Labels:
    """The series labels Prometheus' relabelling gives the frontend's metrics."""

    graph: str = "graph"
    namespace: str = "namespace"


def queries(*, namespace: str, graph: str, window_s: int, percentile: float, labels: Labels) -> dict[str, str]:
    """The PromQL for each observed quantity (pure, so tests and dashboards can share it)."""
    selector = f'{labels.namespace}="{namespace}",{labels.graph}="{graph}"'
    window = f"{window_s}s"
    q = percentile / 100

    def mean(metric: str) -> str:
        return (f"sum(rate({metric}_sum{{{selector}}}[{window}]))"
                f" / sum(rate({metric}_count{{{selector}}}[{window}]))")

    def quantile(metric: str) -> str:
        return f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{selector}}}[{window}])))"

    return {
        "rate_rps": f"sum(rate(fleetpilot_frontend_requests_started_total{{{selector}}}[{window}]))",
        "isl": mean("fleetpilot_frontend_input_tokens"),
        "osl": mean("fleetpilot_frontend_output_tokens"),
        "ttft_s": quantile("fleetpilot_frontend_time_to_first_token_seconds"),
        "itl_s": quantile("fleetpilot_frontend_inter_token_latency_seconds"),
        "prefill_s": quantile("fleetpilot_frontend_prefill_seconds"),
        "itl_mean_s": mean("fleetpilot_frontend_inter_token_latency_seconds"),
        # Each frontend sees its share of the arrivals: its burst times the frontends serving, as if the
        # load balancer spread every burst evenly.
        "burst_rate_rps": (f"{quantile('fleetpilot_frontend_arrival_burst_rps')}"
                           f" * count(fleetpilot_frontend_requests_started_total{{{selector}}})"),
    }


def length_queries(*, namespace: str, graph: str, window_s: int, labels: Labels) -> dict[str, str]:
    """The PromQL for the prompt- and output-length histograms (pure): per `le` bucket, cumulative."""
    selector = f'{labels.namespace}="{namespace}",{labels.graph}="{graph}"'
    return {name: f"sum by (le) (rate({metric}_bucket{{{selector}}}[{window_s}s]))"
            for name, metric in (("isl_histogram", "fleetpilot_frontend_input_tokens"),
                                 ("osl_histogram", "fleetpilot_frontend_output_tokens"))}


@dataclass(frozen=True)
class EngineGauges:
    """What the engines say right now, summed over a graph's workers (vLLM's own gauges)."""

    prefill_waiting: float  # requests queued at the prefill workers
    decode_running: float  # sequences decoding
    decode_waiting: float  # requests waiting for a decode slot (KV cache or batch cap full)


def gauge_queries(*, namespace: str, graph: str, labels: Labels) -> dict[str, str]:
    """The PromQL for the fast path's queue gauges (pure).

    The frontend's own view first (`fleetpilot_frontend_requests_in_phase`: it sees every request's
    phase whatever the engine): requests in the prefill hop, prefilled ones waiting for their first
    token, streaming ones. Where no frontend exports it, vLLM's engine gauges of the prefill and decode
    workers (PromQL `or`: the right side only when the left has no series).
    """
    selector = f'{labels.namespace}="{namespace}",{labels.graph}="{graph}"'

    def phase(name: str) -> str:
        return f'sum({contract.PHASE_METRIC}{{{selector},phase="{name}"}})'

    def engine(metric: str, component: str) -> str:
        return f'sum({metric}{{{selector},component="{component}"}})'

    return {
        "prefill_waiting": f'{phase("prefill")} or {engine("vllm:num_requests_waiting", "prefill")}',
        "decode_running": f'{phase("decoding")} or {engine("vllm:num_requests_running", "decode")}',
        "decode_waiting": f'{phase("first_token")} or {engine("vllm:num_requests_waiting", "decode")}',
    }


@dataclass(frozen=True)
class History:
    """A graph's past intervals as Prometheus kept them, oldest first (steps without traffic omitted)."""

    rates: tuple[float, ...]
    isls: tuple[float, ...]
    osls: tuple[float, ...]


class PrometheusObserver:
    """Runs the contract's queries against one Prometheus (synchronous: call it from a thread)."""

    def __init__(self, url: str, *, labels: Labels | None = None, timeout_s: float = 10.0) -> None:
        self.url = url
        self.labels = labels or Labels()
        self.timeout_s = timeout_s
        self._prometheus = PrometheusConnect(url=url, disable_ssl=True)

    def observe(self, *, namespace: str, graph: str, window_s: int, percentile: float) -> Observation:
        now = time.time()
        values: dict[str, float | None] = {}
        try:
            for name, promql in queries(namespace=namespace, graph=graph, window_s=window_s, percentile=percentile,
                                        labels=self.labels).items():
                values[name] = self._scalar(promql, now=now, max_age_s=window_s)
        except Exception as error:  # noqa: BLE001 - any failure to read is "no data", never a crash
            return Observation(time=now, error=f"Prometheus at {self.url} unavailable: {error}")
        if values["rate_rps"] is None:
            return Observation(time=now, error=f"no fleetpilot_frontend_* series for {namespace}/{graph} in Prometheus")
        # The decode pool's fill now (the fast path's queries): what teaches the planner the engines' cap.
        decode: dict[str, float | None] = {}
        fill = gauge_queries(namespace=namespace, graph=graph, labels=self.labels)
        for name in ("decode_running", "decode_waiting"):
            try:
                decode[name] = self._scalar(fill[name], now=now, max_age_s=window_s)
            except Exception:  # noqa: BLE001 - optional: planning goes on without it
                decode[name] = None
        # The length mix (optional as well: sizing falls back to the means without it).
        mixes: dict[str, lengths.Histogram | None] = {}
        for name, promql in length_queries(namespace=namespace, graph=graph, window_s=window_s,
                                           labels=self.labels).items():
            mean = values["isl" if name == "isl_histogram" else "osl"]
            try:
                mixes[name] = lengths.from_cumulative(self._by_bound(promql, now=now, max_age_s=window_s), mean)
            except Exception:  # noqa: BLE001 - optional: planning goes on without it
                mixes[name] = None
        return Observation(time=now, rate_rps=values["rate_rps"], isl=values["isl"], osl=values["osl"],
                           ttft_s=values["ttft_s"], itl_s=values["itl_s"], prefill_s=values["prefill_s"],
                           itl_mean_s=values["itl_mean_s"], burst_rate_rps=values["burst_rate_rps"],
                           decode_running=decode["decode_running"], decode_waiting=decode["decode_waiting"],
                           isl_histogram=mixes["isl_histogram"], osl_histogram=mixes["osl_histogram"])

    def history(self, *, namespace: str, graph: str, window_s: int, points: int) -> History:
        """The last `points` intervals before the current one: rate, mean ISL and OSL per interval (range
        queries at a step of one interval). Empty when Prometheus cannot say: the planner starts cold."""
        found = queries(namespace=namespace, graph=graph, window_s=window_s, percentile=50, labels=self.labels)
        end = time.time() - window_s  # the current interval is the next observation's
        start = end - (points - 1) * window_s
        series: dict[str, dict[float, float]] = {}
        try:
            for name in ("rate_rps", "isl", "osl"):
                result = self._prometheus.custom_query_range(
                    found[name], start_time=datetime.datetime.fromtimestamp(start, tz=datetime.UTC),
                    end_time=datetime.datetime.fromtimestamp(end, tz=datetime.UTC), step=f"{window_s}s")
                values = result[0]["values"] if result else []
                series[name] = {float(t): float(v) for t, v in values if math.isfinite(float(v))}
        except Exception:  # noqa: BLE001 - no history is a cold start, never a crash
            return History((), (), ())
        steps = sorted(series["rate_rps"])
        rates = tuple(series["rate_rps"][t] for t in steps)
        isls = tuple(series["isl"].get(t, 0.0) for t in steps)
        osls = tuple(series["osl"].get(t, 0.0) for t in steps)
        return History(rates, isls, osls)

    def gauges(self, *, namespace: str, graph: str, max_age_s: float = 30.0) -> EngineGauges | None:
        """The engines' queue gauges for the fast path; None when Prometheus cannot say (it then does nothing)."""
        now = time.time()
        values: dict[str, float] = {}
        try:
            for name, promql in gauge_queries(namespace=namespace, graph=graph, labels=self.labels).items():
                value = self._scalar(promql, now=now, max_age_s=max_age_s)
                if value is None:
                    return None
                values[name] = value
        except Exception:  # noqa: BLE001 - any failure to read is "no data": the fast path waits
            return None
        return EngineGauges(**values)

    def _by_bound(self, promql: str, *, now: float, max_age_s: float) -> dict[float, float]:
        """A `sum by (le)` vector as {bound: value} (+Inf as math.inf), fresh samples only."""
        found: dict[float, float] = {}
        for sample in self._prometheus.custom_query(promql, params={"timeout": f"{self.timeout_s:g}s"}):
            timestamp, raw = sample["value"]
            value = float(raw)
            if math.isfinite(value) and now - float(timestamp) <= max_age_s:
                found[float(sample["metric"]["le"])] = value
        return found

    def _scalar(self, promql: str, *, now: float, max_age_s: float) -> float | None:
        result = self._prometheus.custom_query(promql, params={"timeout": f"{self.timeout_s:g}s"})
        if not result:
            return None
        timestamp, raw = result[0]["value"]
        value = float(raw)
        if math.isnan(value) or math.isinf(value) or now - float(timestamp) > max_age_s:
            return None
        return value
