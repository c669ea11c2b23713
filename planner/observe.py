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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from fleetpilot.api import contract
from fleetpilot.planner import lengths
from fleetpilot.planner.core import Observation

T = TypeVar("T")


@dataclass(frozen=True)
class Labels:
    """The series labels Prometheus' relabelling gives the frontend's metrics."""

    graph: str = "graph"
    namespace: str = "namespace"


def queries(*, namespace: str, graph: str, window_s: int, percentile: float, labels: Labels) -> dict[str, str]:
    """The PromQL for each observed quantity of one graph (pure, so tests and dashboards can share it)."""
    return _observed(selector=f'{labels.namespace}="{namespace}",{labels.graph}="{graph}"', window_s=window_s,
                     percentile=percentile, by=())


def grouped_queries(*, selector: str, window_s: int, percentile: float, labels: Labels) -> dict[str, str]:
    """The same quantities for every graph `selector` matches at once, one series per (namespace, graph):
    a planner with a thousand graphs asks Prometheus a dozen queries an interval, not a dozen per graph."""
    return _observed(selector=selector, window_s=window_s, percentile=percentile,
                     by=(labels.namespace, labels.graph))


def _observed(*, selector: str, window_s: int, percentile: float, by: tuple[str, ...]) -> dict[str, str]:
    window = f"{window_s}s"
    q = percentile / 100
    group = f" by ({', '.join(by)})" if by else ""
    buckets = f" by ({', '.join((*by, 'le'))})"

    def mean(metric: str) -> str:
        return (f"sum{group}(rate({metric}_sum{{{selector}}}[{window}]))"
                f" / sum{group}(rate({metric}_count{{{selector}}}[{window}]))")

    def quantile(metric: str) -> str:
        return f"histogram_quantile({q}, sum{buckets} (rate({metric}_bucket{{{selector}}}[{window}])))"

    frontends = (f"count(fleetpilot_frontend_requests_started_total{{{selector}}})" if not by else
                 f"on ({', '.join(by)}) count{group}(fleetpilot_frontend_requests_started_total{{{selector}}})")
    return {
        "rate_rps": f"sum{group}(rate(fleetpilot_frontend_requests_started_total{{{selector}}}[{window}]))",
        "isl": mean("fleetpilot_frontend_input_tokens"),
        "osl": mean("fleetpilot_frontend_output_tokens"),
        "ttft_s": quantile("fleetpilot_frontend_time_to_first_token_seconds"),
        "itl_s": quantile("fleetpilot_frontend_inter_token_latency_seconds"),
        "prefill_s": quantile("fleetpilot_frontend_prefill_seconds"),
        "itl_mean_s": mean("fleetpilot_frontend_inter_token_latency_seconds"),
        # Each frontend sees its share of the arrivals: its burst times the frontends serving, as if the
        # load balancer spread every burst evenly.
        "burst_rate_rps": f"{quantile('fleetpilot_frontend_arrival_burst_rps')} * {frontends}",
    }


def length_queries(*, namespace: str, graph: str, window_s: int, labels: Labels) -> dict[str, str]:
    """The PromQL for the prompt- and output-length histograms (pure): per `le` bucket, cumulative."""
    selector = f'{labels.namespace}="{namespace}",{labels.graph}="{graph}"'
    return _lengths(selector=selector, window_s=window_s, by=())


def _lengths(*, selector: str, window_s: int, by: tuple[str, ...]) -> dict[str, str]:
    buckets = ", ".join((*by, "le"))
    return {name: f"sum by ({buckets}) (rate({metric}_bucket{{{selector}}}[{window_s}s]))"
            for name, metric in (("isl_histogram", "fleetpilot_frontend_input_tokens"),
                                 ("osl_histogram", "fleetpilot_frontend_output_tokens"))}


@dataclass(frozen=True)
class EngineGauges:
    """What the engines say right now, summed over a graph's workers (vLLM's own gauges)."""

    prefill_waiting: float  # requests queued at the prefill workers
    decode_running: float  # sequences decoding
    decode_waiting: float  # requests waiting for a decode slot (KV cache or batch cap full)
    started: float | None = None  # requests the frontends have received, summed (a counter); None: not read


def gauge_queries(*, namespace: str, graph: str, labels: Labels) -> dict[str, str]:
    """The PromQL for the fast path's queue gauges (pure).

    The frontend's own view first (`fleetpilot_frontend_requests_in_phase`: it sees every request's
    phase whatever the engine): requests in the prefill hop, prefilled ones waiting for their first
    token, streaming ones. Where no frontend exports it, vLLM's engine gauges of the prefill and decode
    workers (PromQL `or`: the right side only when the left has no series).
    """
    return _gauges(selector=f'{labels.namespace}="{namespace}",{labels.graph}="{graph}"', by=())


def _gauges(*, selector: str, by: tuple[str, ...]) -> dict[str, str]:
    group = f" by ({', '.join(by)})" if by else ""

    def phase(name: str) -> str:
        return f'sum{group}({contract.PHASE_METRIC}{{{selector},phase="{name}"}})'

    def engine(metric: str, component: str) -> str:
        return f'sum{group}({metric}{{{selector},component="{component}"}})'

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


GraphKey = tuple[str, str]  # (namespace, graph)


class PrometheusObserver:
    """Runs the contract's queries against one Prometheus (synchronous: call it from a thread).

    A query that does not answer within `timeout_s` is no data for this interval: the client gives up
    (one retry on a 502-504, none on a timeout), so a hung Prometheus costs the planner one timeout per
    interval, not the loop."""

    def __init__(self, url: str, *, labels: Labels | None = None, timeout_s: float = 10.0) -> None:
        self.url = url
        self.labels = labels or Labels()
        self.timeout_s = timeout_s
        retry = Retry(total=1, read=0, backoff_factor=0.2, status_forcelist=(502, 503, 504), allowed_methods=None)
        self._prometheus = PrometheusConnect(url=url, disable_ssl=True, timeout=timeout_s, retry=retry)
        self.queries_sent = 0  # queries so far, instant and range (the scale benchmark counts them)

    def observe(self, *, namespace: str, graph: str, window_s: int, percentile: float) -> Observation:
        """One graph's last interval (`observe_many` for one)."""
        selector = f'{self.labels.namespace}="{namespace}",{self.labels.graph}="{graph}"'
        return self.observe_many([(namespace, graph)], window_s=window_s, percentile=percentile,
                                 selector=selector)[(namespace, graph)]

    def observe_many(self, keys: Iterable[GraphKey], *, window_s: int, percentile: float,
                     selector: str | None = None) -> dict[GraphKey, Observation]:
        """The last interval of every graph in `keys` (all planned at this window and percentile), from one
        query per quantity grouped by namespace and graph. `selector`: which series to ask for; by default
        every graph's in the keys' namespaces."""
        wanted = list(dict.fromkeys(keys))
        if selector is None:
            namespaces = "|".join(sorted({namespace for namespace, _ in wanted}))
            selector = f'{self.labels.namespace}=~"{namespaces}",{self.labels.graph}!=""'
        by = (self.labels.namespace, self.labels.graph)
        now = time.time()
        values: dict[str, dict[GraphKey, float]] = {}
        try:
            for name, promql in _observed(selector=selector, window_s=window_s, percentile=percentile,
                                          by=by).items():
                values[name] = self._by_graph(promql, now=now, max_age_s=window_s)
        except Exception as error:  # noqa: BLE001 - any failure to read is "no data", never a crash
            return {key: Observation(time=now, error=f"Prometheus at {self.url} unavailable: {error}") for key in wanted}
        # The decode pool's fill now (the fast path's queries): what teaches the planner the engines' cap;
        # and the length mix. Both optional: planning goes on without them.
        optional: dict[str, dict[GraphKey, float]] = {}
        for name, promql in _gauges(selector=selector, by=by).items():
            if name != "prefill_waiting":
                optional[name] = self._optional(self._by_graph, promql, now=now, max_age_s=window_s)
        mixes: dict[str, dict[GraphKey, dict[float, float]]] = {
            name: self._optional(self._by_graph_and_bound, promql, now=now, max_age_s=window_s)
            for name, promql in _lengths(selector=selector, window_s=window_s, by=by).items()}
        found: dict[GraphKey, Observation] = {}
        for key in wanted:
            got = {name: series.get(key) for name, series in values.items()}
            if got["rate_rps"] is None:
                found[key] = Observation(time=now, error=(
                    f"no usable fleetpilot_frontend_requests_started_total for {key[0]}/{key[1]} in Prometheus"
                    " (no series, NaN or stale)"))
                continue
            histograms = {name: lengths.from_cumulative(by_bound[key], got["isl" if name == "isl_histogram" else "osl"])
                          if key in by_bound else None for name, by_bound in mixes.items()}
            found[key] = Observation(
                time=now, rate_rps=got["rate_rps"], isl=got["isl"], osl=got["osl"], ttft_s=got["ttft_s"],
                itl_s=got["itl_s"], prefill_s=got["prefill_s"], itl_mean_s=got["itl_mean_s"],
                burst_rate_rps=got["burst_rate_rps"], decode_running=optional["decode_running"].get(key),
                decode_waiting=optional["decode_waiting"].get(key), isl_histogram=histograms["isl_histogram"],
                osl_histogram=histograms["osl_histogram"])
        return found

    @staticmethod
    def _optional(read: Callable[..., dict[GraphKey, T]], promql: str, **kwargs: float) -> dict[GraphKey, T]:
        try:
            return read(promql, **kwargs)
        except Exception:  # noqa: BLE001 - optional: planning goes on without it
            return {}

    def _query(self, promql: str) -> list[dict[str, Any]]:
        self.queries_sent += 1
        result: list[dict[str, Any]] = self._prometheus.custom_query(promql, params={"timeout": f"{self.timeout_s:g}s"})
        return result

    def _fresh(self, sample: dict[str, Any], *, now: float, max_age_s: float) -> float | None:
        """A sample's value when it is a finite number no older than `max_age_s`, else None."""
        timestamp, raw = sample["value"]
        value = float(raw)
        return value if math.isfinite(value) and now - float(timestamp) <= max_age_s else None

    def _key(self, sample: dict[str, Any]) -> GraphKey | None:
        metric = sample.get("metric", {})
        namespace, graph = metric.get(self.labels.namespace), metric.get(self.labels.graph)
        return (namespace, graph) if namespace and graph else None  # a series without them is no graph's

    def _by_graph(self, promql: str, *, now: float, max_age_s: float) -> dict[GraphKey, float]:
        """A vector grouped by namespace and graph as {key: value}, fresh finite samples only."""
        found: dict[GraphKey, float] = {}
        for sample in self._query(promql):
            key, value = self._key(sample), self._fresh(sample, now=now, max_age_s=max_age_s)
            if key is not None and value is not None:
                found[key] = value
        return found

    def _by_graph_and_bound(self, promql: str, *, now: float, max_age_s: float) -> dict[GraphKey, dict[float, float]]:
        """A `sum by (namespace, graph, le)` vector as {key: {bound: value}} (+Inf as math.inf)."""
        found: dict[GraphKey, dict[float, float]] = {}
        for sample in self._query(promql):
            key, value = self._key(sample), self._fresh(sample, now=now, max_age_s=max_age_s)
            bound = sample.get("metric", {}).get("le")
            if key is not None and value is not None and bound is not None:
                found.setdefault(key, {})[float(bound)] = value
        return found

    def history(self, *, namespace: str, graph: str, window_s: int, points: int) -> History:
        """The last `points` intervals before the current one: rate, mean ISL and OSL per interval (range
        queries at a step of one interval). Empty when Prometheus cannot say: the planner starts cold."""
        found = queries(namespace=namespace, graph=graph, window_s=window_s, percentile=50, labels=self.labels)
        end = time.time() - window_s  # the current interval is the next observation's
        start = end - (points - 1) * window_s
        series: dict[str, dict[float, float]] = {}
        try:
            for name in ("rate_rps", "isl", "osl"):
                self.queries_sent += 1
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

    def _scalar(self, promql: str, *, now: float, max_age_s: float) -> float | None:
        result = self._query(promql)
        return self._fresh(result[0], now=now, max_age_s=max_age_s) if result else None
