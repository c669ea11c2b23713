"""The live planner: one process plans every DynamoGraph whose planner is on.

Read → step → write. Each graph is planned once per its `spec.planner.intervalSeconds`: observe it in
Prometheus (in a thread: the client is synchronous), read its DynamoGraphComponents and its shared
budget's claims, take the one pure planning step (`step.step`, which the backtest takes too), then
write what it decided; the fast path between intervals and scale to zero every tick are readings of
the same step. Everything kept of a graph is one `PlannedGraph`, forgotten whole with its metric
series when the graph goes. In
`sla` mode actuation writes the `/scale` of each DynamoGraphComponent — never the graph's spec, so a
graph kept in git never drifts. In `advisory` mode it only records. Either way the decision and its
reasons go to the graph's `status.planner` and a `PlannerActive` condition (applied server-side as
field manager `fleetpilot-planner`, so the operator's fields stay the operator's), Events when
replicas change, and `fleetpilot_planner_*` metrics. With Prometheus down or silent, replicas hold
and the condition says why; planning resumes by itself when data returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import typing
from collections.abc import Callable, Iterable
from typing import Any

import httpx
import pydantic
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.utils import floatToGoString

from fleetpilot import informer, perfmodel, scrape
from fleetpilot import kube as kube_mod
from fleetpilot.api import contract
from fleetpilot.api import profile as profiles
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import budget as budget_mod
from fleetpilot.planner import capacity as capacities
from fleetpilot.planner import core, frontends, sizing, step
from fleetpilot.planner import drift as drifts
from fleetpilot.planner import observe as observe_mod
from fleetpilot.planner.observe import PrometheusObserver

logger = logging.getLogger("fleetpilot.planner")

PREDICTED_RATE = Gauge("fleetpilot_planner_predicted_rate_rps", "Peak request rate forecast over the horizon.",
                       ["namespace", "graph"])
OBSERVED_RATE = Gauge("fleetpilot_planner_observed_rate_rps", "Request rate seen in the last interval.",
                      ["namespace", "graph"])
DESIRED = Gauge("fleetpilot_planner_desired_replicas", "Replicas the planner decided.", ["namespace", "graph", "component"])
CORRECTION = Gauge("fleetpilot_planner_correction_factor",
                   "How much slower than its profile the fleet works (1: as profiled), learned from recent intervals.",
                   ["namespace", "graph", "component"])
LATENCY_OFFSET = Gauge("fleetpilot_planner_latency_offset_seconds",
                       "Latency at the SLA percentile the profile does not model (TTFT for prefill, ITL for decode).",
                       ["namespace", "graph", "component"])
QUEUE_SHARING = Gauge(
    "fleetpilot_planner_prefill_queue_sharing",
    "How far the prefill replicas behave as one shared queue (1: M/G/c) rather than separate ones (0), as the "
    "planner has learned it from the graph's TTFT; sizing uses it.", ["namespace", "graph"])
BURST = Gauge("fleetpilot_planner_burst_factor",
              "How much burstier than Poisson the arrivals are: prefill is sized for the rate times this.",
              ["namespace", "graph"])
FORECAST_COVERAGE = Gauge(
    "fleetpilot_planner_forecast_coverage",
    "Share of recent outcomes at or under the calibrated forecast quantile (q of them when calibrated), per load "
    "(requests, input_tokens, output_tokens) and quantile level.", ["namespace", "graph", "load", "quantile"])
RISK = Gauge("fleetpilot_planner_risk", "The forecast quantile the planner sizes the graph for (spec.planner.risk).",
             ["namespace", "graph"])
FORECAST_ERROR = Gauge("fleetpilot_planner_forecast_error_ratio", "|forecast - observed| / observed, last interval.",
                       ["namespace", "graph"])
HOLDING = Gauge("fleetpilot_planner_holding", "1 while the planner holds replicas for lack of data.",
                ["namespace", "graph"])
TRAFFIC_STOPPED = Gauge(
    "fleetpilot_planner_traffic_stopped",
    "1 while the planner holds a graph through an outage upstream: no traffic, or a trickle under "
    f"{core.LULL_SHARE:.0%} of its quietest interval, where its history makes that implausible "
    "(PlannerActive=False, TrafficStopped).",
    ["namespace", "graph"])
GPUS = Gauge("fleetpilot_planner_gpus", "GPUs the decided replicas use.", ["namespace", "graph"])
WANTED_GPUS = Gauge("fleetpilot_planner_wanted_gpus", "GPUs the decision would use with no budget.",
                    ["namespace", "graph"])
GPU_BUDGET = Gauge("fleetpilot_planner_gpu_budget", "GPU cap applied this interval (own gpuBudget or budget share).",
                   ["namespace", "graph"])
SLA_TARGET = Gauge("fleetpilot_planner_sla_target_seconds",
                   "The graph's SLA targets the planner plans for (metric ttft or itl), with `le` the frontend's "
                   "histogram bucket bound that resolves the target: the alert rules count the requests in it as met.",
                   ["namespace", "graph", "metric", "le"])
SLA_OBJECTIVE = Gauge("fleetpilot_planner_sla_objective_ratio",
                      "The share of requests the SLA asks to meet its targets (spec.planner.sla.percentile / 100).",
                      ["namespace", "graph"])
BINDING = Gauge("fleetpilot_planner_binding",
                "1 for what set each component's replicas at the last decision (forecast, bounds, hold, step-limit, "
                "budget, no-data, fast-path, idle: scaled to zero), 0 for the others.", ["namespace", "graph", "component", "reason"])
BINDINGS: tuple[sizing.Binding, ...] = typing.get_args(sizing.Binding)
FAST_PATH = Counter("fleetpilot_planner_fast_path_scale_ups_total",
                    "Replicas the fast path added between intervals, by component.", ["namespace", "graph", "component"])
SCALE_TO_ZERO = Counter("fleetpilot_planner_scale_to_zero_total",
                        "Scale-to-zero actions: asleep (pools to zero after the idle window) and woken (a held "
                        "request started them again).", ["namespace", "graph", "action"])
FAST_PATH_READS = Counter("fleetpilot_planner_fast_path_reads_total",
                          "Fast-path readings of a graph's queues, by where they came from: the frontends "
                          "asked directly, or Prometheus when a frontend did not answer.", ["source"])
ERRORS = Counter("fleetpilot_planner_errors_total", "Intervals that could not be planned, by reason.", ["reason"])
# Every reason exists from the start at 0: an alert or panel on an error rate then reads a zero, not an
# absent series (which a renamed label would look like too).
for _reason in ("kubernetes", "profile", "no-data"):
    ERRORS.labels(_reason)
for _source in ("frontend", "prometheus"):
    FAST_PATH_READS.labels(_source)
LEADER = Gauge("fleetpilot_planner_leader",
                "1 while this replica acts: it holds the leader Lease (--leader-elect), or runs alone without election.")
PROFILE_DRIFT = Gauge("fleetpilot_planner_profile_drift",
                      "1 while the graph's measured TTFT or ITL differs from its profile's beyond the threshold "
                      "(the ProfileDrift condition), 0 while within it.", ["namespace", "graph"])
PROFILE_DRIFT_RATIO = Gauge("fleetpilot_planner_profile_drift_ratio",
                            "Measured over profile-predicted latency at the observed load (median of the recent "
                            "intervals), per metric (ttft, itl).", ["namespace", "graph", "metric"])
PLANNING_SECONDS = Histogram("fleetpilot_planner_planning_duration_seconds", "Time to plan one graph once.",
                             buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))

# Every metric labelled with a graph: a deleted graph's series go with it (`LivePlanner.forget`).
GRAPH_METRICS: tuple[Gauge | Counter, ...] = (
    PREDICTED_RATE, OBSERVED_RATE, DESIRED, CORRECTION, LATENCY_OFFSET, QUEUE_SHARING, BURST, FORECAST_COVERAGE, RISK,
    FORECAST_ERROR, HOLDING, TRAFFIC_STOPPED, GPUS, WANTED_GPUS, GPU_BUDGET, SLA_TARGET, SLA_OBJECTIVE, BINDING,
    FAST_PATH, SCALE_TO_ZERO, PROFILE_DRIFT, PROFILE_DRIFT_RATIO)

# Graphs without a shared budget planned at once (`LivePlanner.tick`): their apiserver writes overlap.
PLAN_CONCURRENCY = 8

PROFILE_DRIFT_CONDITION = "ProfileDrift"

# How far back a planner that starts (or becomes leader) reads a graph's load from Prometheus: a week,
# within what any predictor looks at (core.HISTORY_LIMIT) and what one range query returns (11,000).
WARM_START_S = 7 * 86400.0
WARM_START_MAX_POINTS = 10_000

# The profile the planner assumes for simulator graphs without a profileRef: what the simulator
# itself runs (its CLI defaults).
SIMULATOR_PRESET = ("llama-3.1-8b", "h200-sxm")


def simulator_profile(tensor_parallel: int, *, pipeline_parallel: int = 1, nodes: int = 1) -> profiles.Profile:
    """What a simulator replica of this parallelism does (a multinode group's: over `nodes` nodes)."""
    model = perfmodel.PerformanceModel(perfmodel.MODELS[SIMULATOR_PRESET[0]], perfmodel.GPUS[SIMULATOR_PRESET[1]],
                                       tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel,
                                       nodes=nodes)
    return profiles.from_performance_model(
        model, isls=[128, 512, 1024, 2048, 4096, 8192, 16384], contexts=[512, 1024, 2048, 4096, 8192, 16384],
        concurrencies=[1, 2, 4, 8, 16, 32, 64, 128, 256], engine="simulator")


@dataclasses.dataclass
class PlannedGraph:
    """What the live planner keeps of one graph: its planning state (the step's), the config its last plan
    was made with (the fast path's, between intervals), and when its next plan and fast-path reading fall
    due. A deleted graph's goes whole (`LivePlanner.forget`)."""

    state: step.GraphState = dataclasses.field(default_factory=step.GraphState)
    config: step.StepConfig | None = None
    next_plan: float = 0.0  # the planner's clock (monotonic seconds)
    next_react: float = 0.0


def _set_binding(namespace: str, name: str, pool: str, why: sizing.Binding) -> None:
    for reason in BINDINGS:
        BINDING.labels(namespace, name, pool, reason).set(1 if reason == why else 0)


def _graph_of(pod: dict[str, Any]) -> list[tuple[str, str]]:
    """The (namespace, graph) a frontend pod serves: the index the fast path looks its frontends up by."""
    meta = pod.get("metadata", {})
    graph = meta.get("labels", {}).get(contract.LABEL_GRAPH)
    return [(meta.get("namespace", ""), graph)] if graph else []


PLANNER_DEGRADED = "PlannerDegraded"


def degraded_condition(warnings: tuple[tuple[str, str], ...] | None, *, previous: list[dict[str, Any]],
                       generation: int) -> dict[str, Any] | None:
    """`PlannerDegraded`: True with the first warning's reason (SLAInfeasible, BudgetBelowMinimum) and every
    warning's words, False `AsExpected` without any; with `warnings` None, the previous one unchanged (None
    if there was none)."""
    if warnings is None:
        before = contract.find_condition(previous, PLANNER_DEGRADED)
        return dict(before) if before is not None else None
    if not warnings:
        return contract.condition(PLANNER_DEGRADED, False, "AsExpected", "", previous=previous, generation=generation)
    return contract.condition(PLANNER_DEGRADED, True, warnings[0][0], "; ".join(m for _, m in warnings),
                              previous=previous, generation=generation)


def _budget_of(graph: dict[str, Any]) -> list[str]:
    """The shared GPU budget a graph with its planner on names (the index `gpus_in_use` looks graphs up by)."""
    planner = (graph.get("spec") or {}).get("planner") or {}
    return [planner["budget"]] if planner.get("budget") and planner.get("mode", "off") != "off" else []


def _caught_up(seen: dict[str, Any], version: str) -> bool:
    """Whether an object the watch delivered is at least as new as resourceVersion `version` (etcd
    revisions compare as integers; an unknown version counts as caught up once anything newer is seen)."""
    try:
        return int(seen["metadata"].get("resourceVersion", "0")) >= int(version)
    except ValueError:
        return True


def _may_sleep(body: dict[str, Any]) -> bool:
    """A graph in sla mode with a worker pool whose scaling.min is 0."""
    spec = body.get("spec", {})
    if spec.get("planner", {}).get("mode") != "sla":
        return False
    pools = [spec.get("components", {}).get(p) for p in api.WORKER_COMPONENTS]
    return any(pool is not None and pool.get("scaling", {}).get("min", 1) == 0 for pool in pools)


def rolling_out(body: dict[str, Any]) -> bool:
    """Whether the operator reports a rollout between generations under way (status.rollout)."""
    return ((body.get("status") or {}).get("rollout") or {}).get("phase") == "Progressing"


class ProfileError(Exception):
    """No usable capacity profile: the planner cannot size this graph."""


class LivePlanner:
    def __init__(self, kube: kube_mod.KubeApi, observer: PrometheusObserver, *, namespaces: list[str] | None = None,
                 startup_s: float = 120.0, hold_s: float | None = None, budgets: dict[str, int] | None = None,
                 may_act: Callable[[], bool] = lambda: True, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # when intervals fall due and holds end (monotonic seconds)
        # With leader election, whether this replica still holds the Lease: checked before planning a
        # graph and again before writing, since observing Prometheus can take a while.
        self.may_act = may_act
        # The shared GPU budgets and each graph's last claim: a graph's share uses the others' latest claims.
        self.ledger = budget_mod.BudgetLedger(budgets or {})
        self.kube = kube
        self.observer = observer
        self.namespaces = namespaces or [None]  # type: ignore[list-item]
        self.startup_s = startup_s
        self.hold_s = hold_s
        # Every graph planned: its planning state, its last plan's config, when it is next due.
        self.planned: dict[tuple[str, str], PlannedGraph] = {}
        self._sla_buckets: dict[tuple[str, str, str], str] = {}  # (namespace, graph, metric) -> le exported
        self._profiles: dict[tuple[str, str, str], capacities.CapacityModel] = {}
        # Graphs and their components, each kept by one watch per namespace instead of a LIST per tick.
        self.graphs = informer.Store(indexers={"budget": _budget_of})
        self.components = informer.Store()
        self._informers = [
            informer.Informer(kube, kind, namespace=namespace, store=store)
            for namespace in self.namespaces
            for kind, store in ((api.GRAPH_KIND, self.graphs), (api.COMPONENT_KIND, self.components))
        ]
        # The frontend pods, which the fast path asks for their queues directly (planner/frontends.py).
        self.frontend_pods = informer.Store(indexers={"graph": _graph_of})
        self._informers += [
            informer.Informer(kube, "Pod", namespace=namespace, labels={contract.LABEL_COMPONENT: "frontend"},
                              store=self.frontend_pods)
            for namespace in self.namespaces
        ]
        self._http: httpx.AsyncClient | None = None
        self._started = False
        # This tick's observations of the graphs due, from batched queries (`_observe_all`).
        self._observed: dict[tuple[str, str], core.Observation] = {}
        # This planner's /scale writes not yet seen by the components' watch: (resourceVersion, replicas).
        self._written: dict[tuple[str, str], tuple[str, int]] = {}

    async def run(self, stop: asyncio.Event, *, tick_s: float = 1.0) -> None:
        logger.info("planning graphs in %s with metrics from %s",
                    ", ".join(n or "all namespaces" for n in self.namespaces), self.observer.url)
        try:
            while not stop.is_set():
                await self.tick()
                try:
                    await asyncio.wait_for(stop.wait(), tick_s)
                except TimeoutError:
                    pass
        finally:
            await self.close()

    async def sync(self) -> None:
        """Start the watches once, and wait until each has listed."""
        if not self._started:
            self._started = True
            for watcher in self._informers:
                await watcher.start()
        await asyncio.gather(*(watcher.synced.wait() for watcher in self._informers))

    async def close(self) -> None:
        for watcher in self._informers:
            await watcher.stop()
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def tick(self) -> None:
        """Plan every graph whose interval is due."""
        await self.sync()
        now = self.clock()
        planned = {informer.object_key(body): body for body in self.graphs.objects()
                   if body.get("spec", {}).get("planner", {}).get("mode", "off") != "off"
                   and not body["metadata"].get("deletionTimestamp")}
        self._forget_all_but(planned.keys())
        for key, body in sorted(planned.items()):
            # Every tick, for graphs that may scale to zero: a held request wakes them within a second.
            if not _may_sleep(body):
                graph_state = self.planned.get(key)
                if graph_state is not None:
                    graph_state.state = dataclasses.replace(graph_state.state, asleep=False)
                continue
            if not self.may_act():
                return
            try:
                await self.wake_or_sleep(body)
            except (kube_mod.ApiError, httpx.HTTPError) as error:
                ERRORS.labels("kubernetes").inc()
                logger.warning("scale to zero for %s/%s failed: %s", *key, error or type(error).__name__)
        due = [(key, body) for key, body in sorted(planned.items())
               if key not in self.planned or self.planned[key].next_plan <= now]
        if due and self.may_act():
            await self._observe_all(due)
        # Graphs on their own are planned PLAN_CONCURRENCY at a time: their writes (status, /scale,
        # Events) are most of an interval's time, and they wait on the apiserver, not the CPU. Graphs
        # sharing a budget go one after the other, each grant resting on the claims before it. Each
        # plan_graph holds a graph that is rolling out or asleep as it would alone.
        alone = [(key, body) for key, body in due if not body["spec"]["planner"].get("budget")]
        slots = asyncio.Semaphore(PLAN_CONCURRENCY)

        async def plan_alone(key: tuple[str, str], body: dict[str, Any]) -> None:
            async with slots:
                await self._plan_due(key, body, now)

        await asyncio.gather(*(plan_alone(key, body) for key, body in alone))
        for key, body in due:
            if body["spec"]["planner"].get("budget"):
                await self._plan_due(key, body, now)
        self._observed.clear()
        for key, body in sorted(planned.items()):
            kept = self.planned.get(key)
            if kept is None or kept.config is None or kept.state.floor is None or kept.next_react > now:
                continue
            period = kept.config.plan.reactive_period_s
            if period is None:
                continue
            if not self.may_act():
                return
            kept.next_react = now + period
            try:
                await self.react_graph(body)
            except (kube_mod.ApiError, httpx.HTTPError) as error:
                ERRORS.labels("kubernetes").inc()
                logger.warning("fast path for %s/%s failed: %s", *key, error)

    async def _plan_due(self, key: tuple[str, str], body: dict[str, Any], now: float) -> None:
        """Plan one due graph (while this replica may act), and schedule its next interval."""
        if not self.may_act():
            return
        self.planned.setdefault(key, PlannedGraph()).next_plan = now + float(
            body["spec"]["planner"].get("intervalSeconds", 60))
        with PLANNING_SECONDS.time():
            try:
                await self.plan_graph(body)
            except (kube_mod.ApiError, httpx.HTTPError) as error:
                # The API said no, or could not be reached (restarting, etcd away): the next interval
                # tries again; the planner itself goes on.
                ERRORS.labels("kubernetes").inc()
                logger.warning("planning %s/%s failed: %s", *key, error or type(error).__name__)
            except (pydantic.ValidationError, ValueError) as error:
                # A graph the API stored before a rule that would refuse it now: said in the log, the
                # others planned.
                ERRORS.labels("invalid").inc()
                logger.warning("cannot plan %s/%s: %s", *key, error)

    async def _observe_all(self, due: list[tuple[tuple[str, str], dict[str, Any]]]) -> None:
        """The due graphs' last intervals, one batch of queries per (interval, percentile) they are planned at
        (`PrometheusObserver.observe_many`), kept for `plan_graph`: a dozen queries per batch instead of a
        dozen per graph. A lone graph, or an observer without batches, is asked graph by graph."""
        observe_many = getattr(self.observer, "observe_many", None)
        if observe_many is None:
            return
        batches: dict[tuple[int, float], list[tuple[str, str]]] = {}
        for key, body in due:
            spec = body["spec"]["planner"]
            window = int(spec.get("intervalSeconds", 60))
            percentile = float((spec.get("sla") or {}).get("percentile", 90))
            batches.setdefault((window, percentile), []).append(key)
        for (window, percentile), keys in batches.items():
            if len(keys) > 1:
                self._observed.update(await asyncio.to_thread(observe_many, keys, window_s=window,
                                                              percentile=percentile))

    def _forget_all_but(self, planned: Iterable[tuple[str, str]]) -> None:
        """Graphs deleted or with the planner turned off: forgotten (`forget`), their budget shares given back."""
        keep = set(planned)
        for key in [k for k in self.planned if k not in keep]:
            self.forget(key)
        names = {f"{namespace}/{name}" for namespace, name in keep}
        for budget in self.ledger.budgets:
            for claim in self.ledger.claims(budget):
                if claim.graph not in names:
                    self.ledger.release(claim.graph)

    def forget(self, key: tuple[str, str]) -> None:
        """Everything the planner holds of graph `key`, in one place: its planning state, its claim on a
        shared budget, the /scale writes it awaits, and every metric series labelled with it."""
        namespace, name = key
        self.planned.pop(key, None)
        self.ledger.release(f"{namespace}/{name}")
        for kept in [k for k in self._sla_buckets if k[:2] == key]:
            del self._sla_buckets[kept]
        for pool in api.WORKER_COMPONENTS:
            self._written.pop((namespace, contract.child_name(name, pool)), None)
        for metric in GRAPH_METRICS:
            for family in metric.collect():
                labelled = {tuple(sample.labels.values()) for sample in family.samples
                            if sample.labels.get("namespace") == namespace and sample.labels.get("graph") == name}
                for values in labelled:
                    try:
                        metric.remove(*values)
                    except KeyError:
                        pass  # a counter's _created sample names the same series as its _total

    async def _capacity(self, graph: api.DynamoGraph) -> capacities.CapacityModel:
        spec = graph.spec
        ref = spec.planner.profile_ref
        workers = spec.components.workers()
        first = next(iter(workers.values()))
        tp, pp, nodes = first.parallelism.tensor, first.parallelism.pipeline, first.nodes
        if ref is None:
            if spec.engine.framework != "simulator":
                raise ProfileError(f"spec.planner.profileRef is required for {spec.engine.framework} graphs:"
                                   " point it at a ConfigMap holding a capacity profile")
            key = ("", "simulator", f"{tp}x{pp}/{nodes}")
            if key not in self._profiles:
                self._profiles[key] = capacities.CapacityModel(
                    simulator_profile(tp, pipeline_parallel=pp, nodes=nodes))
            return self._profiles[key]
        try:
            config_map = await self.kube.get("ConfigMap", graph.metadata.namespace, ref.config_map)
        except kube_mod.ApiError as error:
            raise ProfileError(f"profile ConfigMap {ref.config_map}: {error.message}") from error
        text = config_map.get("data", {}).get(ref.key)
        if text is None:
            raise ProfileError(f"profile ConfigMap {ref.config_map} has no key {ref.key}")
        cache_key = (graph.metadata.namespace, ref.config_map, config_map["metadata"].get("resourceVersion", ""))
        if cache_key not in self._profiles:
            try:
                self._profiles[cache_key] = capacities.CapacityModel(profiles.Profile.model_validate_json(text))
            except pydantic.ValidationError as error:
                raise ProfileError(f"profile in ConfigMap {ref.config_map}/{ref.key} is invalid: {error}") from error
        return self._profiles[cache_key]

    def gpus_in_use(self, budget: str, *, besides: tuple[str, str]) -> int:
        """GPUs the graphs naming `budget`, other than `besides`, run now (their DynamoGraphComponents'
        replicas): the most a graph may grow into is the budget less these, whatever its share, so a
        graph grows only once the others' shrinks are written and no moment of a rebalance passes the
        budget (the split alone let a higher-priority graph grow before a lower one had shrunk)."""
        used = 0
        for body in self.graphs.by_index("budget", budget):
            if informer.object_key(body) == besides or body["metadata"].get("deletionTimestamp"):
                continue
            namespace, name = informer.object_key(body)
            components = (body.get("spec") or {}).get("components") or {}
            for pool in api.WORKER_COMPONENTS:
                worker = components.get(pool)
                if not isinstance(worker, dict):
                    continue
                replicas = self._asked(namespace, contract.child_name(name, pool))
                per_replica = int(worker.get("gpus", 1)) * int(worker.get("nodes", 1))  # every pod of a group
                used += (replicas if replicas is not None else int(worker.get("replicas", 1))) * per_replica
        return used

    def _budget_view(self, budget: str | None, key: tuple[str, str]) -> budget_mod.BudgetView | None:
        """The shared budget `budget` as graph `key` reads it before a step: the ledger's claims and what
        the other graphs naming it run now."""
        if budget is None or budget not in self.ledger:
            return None
        return self.ledger.view(budget, others_in_use=self.gpus_in_use(budget, besides=key))

    def _asked(self, namespace: str, component: str) -> int | None:
        """A DynamoGraphComponent's spec.replicas: this planner's own last /scale write until the watch has
        shown it (a watch event comes a moment after the write; meanwhile the store says the old count, and
        a budget split on it could let another graph grow into GPUs this one just took). None: no such
        component yet."""
        dgc = self.components.get(namespace, component)
        written = self._written.get((namespace, component))
        if written is not None:
            version, replicas = written
            if dgc is None or not _caught_up(dgc, version):
                return replicas
            del self._written[(namespace, component)]
        return int(dgc["spec"]["replicas"]) if dgc is not None else None

    async def _scale(self, namespace: str, component: str, replicas: int) -> None:
        """Write a DynamoGraphComponent's /scale, and remember it until the watch shows it."""
        answer = await self.kube.patch("DynamoGraphComponent", namespace, component, {"spec": {"replicas": replicas}},
                                       subresource="scale")
        version = str(((answer or {}).get("metadata") or {}).get("resourceVersion", ""))
        self._written[(namespace, component)] = (version, replicas)

    async def _replicas(self, graph: api.DynamoGraph) -> tuple[dict[sizing.Pool, int], dict[sizing.Pool, int]]:
        """(asked for, ready) per pool, from the DynamoGraphComponents the operator keeps current."""
        current: dict[sizing.Pool, int] = {}
        ready: dict[sizing.Pool, int] = {}
        for pool, worker in graph.spec.components.workers().items():
            component = contract.child_name(graph.metadata.name, pool)
            dgc = self.components.get(graph.metadata.namespace, component)
            asked = self._asked(graph.metadata.namespace, component)
            if dgc is None or asked is None:
                current[pool] = ready[pool] = asked if asked is not None else worker.replicas  # not made yet
                continue
            current[pool] = asked
            ready[pool] = int(dgc.get("status", {}).get("readyReplicas", current[pool]))
        return current, ready

    def _step_config(self, graph: api.DynamoGraph, capacity: capacities.CapacityModel) -> step.StepConfig:
        spec = graph.spec
        may_sleep = any(worker.scaling.min_replicas == 0 for worker in spec.components.workers().values())
        return step.StepConfig(
            plan=core.config_from_spec(spec, startup_s=self.startup_s, hold_s=self.hold_s), capacity=capacity,
            graph=f"{graph.metadata.namespace}/{graph.metadata.name}", priority=spec.planner.priority,
            idle_s=float(spec.planner.idle_seconds) if may_sleep else None)

    async def _fleet(self, graph: api.DynamoGraph, body: dict[str, Any]) -> step.Fleet:
        current, ready = await self._replicas(graph)
        return step.Fleet(current=current, ready=ready, rolling_out=rolling_out(body))

    async def _write(self, namespace: str, name: str, writes: Iterable[tuple[sizing.Pool, int]]) -> bool:
        """The decision's /scale writes, in order, while this replica may act; False if it stopped."""
        for pool, replicas in writes:
            if not self.may_act():  # the Lease may have gone during the write before: not one more
                return False
            await self._scale(namespace, contract.child_name(name, pool), replicas)
        return True

    async def plan_graph(self, body: dict[str, Any]) -> core.Plan | None:
        """One interval of one graph: read its world, `step.step`, write what the decision says."""
        graph = api.DynamoGraph.model_validate(body)
        namespace, name = graph.metadata.namespace, graph.metadata.name
        key = (namespace, name)
        budget = graph.spec.planner.budget
        if budget is None:
            self.ledger.release(f"{namespace}/{name}")  # it named one before: its share goes back
        elif budget not in self.ledger:
            await self._report(body, plan=None, active=False, reason="UnknownBudget",
                               message=f"spec.planner.budget {budget!r} is not one of the planner's budgets"
                               f" ({', '.join(sorted(self.ledger.budgets)) or 'none'}); start the planner with"
                               f" --gpu-budget {budget}=GPUS")
            return None
        try:
            capacity = await self._capacity(graph)
        except ProfileError as error:
            ERRORS.labels("profile").inc()
            await self._report(body, plan=None, active=False, reason="NoProfile", message=str(error))
            return None
        config = self._step_config(graph, capacity)
        fleet = await self._fleet(graph, body)
        observation = self._observed.pop(key, None)
        if observation is None:
            observation = await asyncio.to_thread(
                self.observer.observe, namespace=namespace, graph=name, window_s=int(config.plan.interval_s),
                percentile=config.plan.sla.percentile)
        kept = self.planned.setdefault(key, PlannedGraph())
        if kept.config is None and not kept.state.memory.rates:
            memory = await self._warm_start(namespace, name, config.plan, body)
            kept.state = dataclasses.replace(kept.state, memory=memory)
        reading = step.IntervalReading(observation=observation, fleet=fleet, budget=self._budget_view(budget, key))
        decision, state = step.step(config, kept.state, reading, now=self.clock())
        plan = decision.plan
        assert plan is not None  # an interval's step always plans
        if not self.may_act():
            return None
        kept.state, kept.config = state, config
        self._export(namespace, name, plan, dataclasses.replace(config.plan, gpu_budget=state.granted))
        logger.info("%s/%s: %s%s", namespace, name, dict(plan.replicas), "" if plan.data_ok else " (holding)")
        if not await self._write(namespace, name, decision.writes):
            return None
        if budget is not None and decision.claim is not None:
            # Claimed once written: a claim that fell before its shrink was written would let another
            # graph's share grow into GPUs still in use.
            self.ledger.claim(budget, decision.claim)
        if decision.writes:
            await self._event(body, "Scaled", ", ".join(f"{p} {fleet.current[p]}→{n}" for p, n in decision.writes)
                              + f": {plan.reason}")
        if plan.outage:  # planned: the hold is the decision, not an error (plan.observed says why)
            await self._report(body, plan=plan, active=False, reason="TrafficStopped",
                               message=f"holding replicas: {plan.observed.error}")
        elif not plan.data_ok:
            ERRORS.labels("no-data").inc()
            await self._report(body, plan=plan, active=False, reason="NoMetrics",
                               message=f"holding replicas: {observation.error or 'incomplete metrics'}")
        else:
            verb = "scaling" if config.acts else "advising (mode advisory: replicas untouched)"
            if decision.rollout_hold:
                verb = "advising until the rollout completes (replicas untouched)"
            await self._report(body, plan=plan, active=True, reason="Planning", message=f"{verb}; {plan.reason}",
                               learned=core.learned(state.memory), profile=capacity.profile.source,
                               warnings=plan.warnings)
        return plan

    async def wake_or_sleep(self, body: dict[str, Any]) -> dict[str, int]:
        """Scale to zero and back (the step's `DemandReading`) from the graph's frontends read now: wake the
        pools at zero when a request is held, send the pools that may sleep to zero after the idle window."""
        graph = api.DynamoGraph.model_validate(body)
        namespace, name = graph.metadata.namespace, graph.metadata.name
        key = (namespace, name)
        kept = self.planned.setdefault(key, PlannedGraph())
        pods = self.frontend_pods.by_index("graph", key)
        urls = [url for pod in pods if (url := contract.pod_http_url(pod)) is not None]
        if self._http is None:
            self._http = httpx.AsyncClient()
        texts = await scrape.read_texts(self._http, urls)
        demand = None if texts is None else frontends.demand_from_expositions(texts)
        if demand is None:
            kept.state = dataclasses.replace(kept.state, asleep=False)  # unknown: never sleep on a guess
            return {}
        try:  # the last plan's profile; before the first plan, the graph's own (cached)
            capacity = kept.config.capacity if kept.config is not None else await self._capacity(graph)
        except ProfileError:
            return {}  # its plan says NoProfile
        config = self._step_config(graph, capacity)
        fleet = await self._fleet(graph, body)
        decision, state = step.step(config, kept.state, step.DemandReading(demand=demand, fleet=fleet),
                                    now=self.clock())
        kept.state = state
        if not decision.writes or not self.may_act():
            return {}
        await self._write(namespace, name, decision.writes)
        for pool, replicas in decision.writes:
            DESIRED.labels(namespace, name, pool).set(replicas)
            _set_binding(namespace, name, pool, "idle")
        moves = ", ".join(f"{p} {fleet.current.get(p, 0)}→{n}" for p, n in decision.writes)
        SCALE_TO_ZERO.labels(namespace, name, decision.kind).inc()
        reason = "WokenUp" if decision.kind == "woken" else "ScaledToZero"
        logger.info("%s/%s: %s: %s", namespace, name, moves, decision.reason)
        await self._event(body, reason, f"{moves}: {decision.reason}")
        return {str(pool): n for pool, n in decision.writes}

    async def _warm_start(self, namespace: str, name: str, config: core.GraphPlanConfig,
                          body: dict[str, Any]) -> core.GraphMemory:
        """A graph's first plan since this planner started (or became leader): its load history from
        Prometheus, as far back as the predictors look, and what the planner before it had learned of the
        fleet (`status.planner.learned`), so the decision is the one it would have made had it been
        running all along."""
        points = max(1, min(core.HISTORY_LIMIT, WARM_START_MAX_POINTS, int(WARM_START_S // config.interval_s)))
        history = await asyncio.to_thread(self.observer.history, namespace=namespace, graph=name,
                                          window_s=int(config.interval_s), points=points)
        logger.info("%s/%s: warm start with %d intervals of history (%.1f h) from Prometheus", namespace, name,
                    len(history.rates), len(history.rates) * config.interval_s / 3600)
        memory = core.warm_memory(history.rates, history.isls, history.osls, now=self.clock(),
                                  interval_s=config.interval_s)
        known = ((body.get("status") or {}).get("planner") or {}).get("learned")
        if isinstance(known, dict) and known:
            logger.info("%s/%s: warm start with what the planner had learned: %s", namespace, name, known)
            memory = core.remember(memory, known)
        return memory

    async def react_graph(self, body: dict[str, Any]) -> step.Decision | None:
        """The fast path for one graph (the step's `QueueReading`): from the engines' queues now, add the
        replicas the pool that is short needs, never below the last plan's decision; None when the queues
        are unknown or the graph has not been planned."""
        graph = api.DynamoGraph.model_validate(body)
        namespace, name = graph.metadata.namespace, graph.metadata.name
        kept = self.planned.get((namespace, name))
        if kept is None or kept.config is None:
            return None
        engines = await self.read_frontends(namespace, name)
        source = "frontend"
        if engines is None:
            engines = await asyncio.to_thread(self.observer.gauges, namespace=namespace, graph=name)
            source = "prometheus"
        if engines is None:
            return None
        FAST_PATH_READS.labels(source).inc()
        fleet = await self._fleet(graph, body)
        reading = step.QueueReading(
            fleet=fleet, decode_running=engines.decode_running, decode_waiting=engines.decode_waiting,
            prefill_waiting=engines.prefill_waiting, started=engines.started,
            budget=self._budget_view(graph.spec.planner.budget, (namespace, name)))
        decision, kept.state = step.step(kept.config, kept.state, reading, now=self.clock())
        if not decision.writes or not self.may_act():
            return decision
        await self._write(namespace, name, decision.writes)
        for pool, replicas in decision.writes:
            FAST_PATH.labels(namespace, name, pool).inc(replicas - fleet.current[pool])
            DESIRED.labels(namespace, name, pool).set(replicas)
            _set_binding(namespace, name, pool, "fast-path")
        logger.info("%s/%s: fast path %s: %s", namespace, name, dict(decision.writes), decision.reason)
        await self._event(body, "FastPath", ", ".join(f"{p} {fleet.current[p]}→{n}" for p, n in decision.writes)
                          + f": {decision.reason}")
        return decision

    async def read_frontends(self, namespace: str, name: str) -> observe_mod.EngineGauges | None:
        """The graph's queues from its Ready frontends' /metrics, or None when any does not answer."""
        pods = self.frontend_pods.by_index("graph", (namespace, name))
        urls = [url for pod in pods if (url := contract.pod_http_url(pod)) is not None]
        if not urls:
            return None
        if self._http is None:
            self._http = httpx.AsyncClient()
        return await frontends.read_gauges(self._http, urls)

    def _export_sla(self, namespace: str, name: str, sla: api.SlaTarget) -> None:
        """The SLA as the alert rules and dashboards join it; a changed target's old bucket series goes."""
        for metric, target_s in (("ttft", sla.ttft_ms / 1e3), ("itl", sla.itl_ms / 1e3)):
            # The `le` text prometheus_client writes for that bound in the frontend's histograms.
            le = floatToGoString(contract.latency_bucket(target_s))  # type: ignore[no-untyped-call]
            before = self._sla_buckets.get((namespace, name, metric))
            if before is not None and before != le:
                SLA_TARGET.remove(namespace, name, metric, before)
            self._sla_buckets[(namespace, name, metric)] = le
            SLA_TARGET.labels(namespace, name, metric, le).set(target_s)
        SLA_OBJECTIVE.labels(namespace, name).set(sla.percentile / 100)

    def _export(self, namespace: str, name: str, plan: core.Plan, config: core.GraphPlanConfig) -> None:
        HOLDING.labels(namespace, name).set(0 if plan.data_ok else 1)
        TRAFFIC_STOPPED.labels(namespace, name).set(1 if plan.outage else 0)
        GPUS.labels(namespace, name).set(sum(n * config.gpus_per_replica[p] for p, n in plan.replicas.items()))
        if plan.wanted_gpus is not None:
            WANTED_GPUS.labels(namespace, name).set(plan.wanted_gpus)
        if config.gpu_budget is not None:
            GPU_BUDGET.labels(namespace, name).set(config.gpu_budget)
        if plan.observed.rate_rps is not None:
            OBSERVED_RATE.labels(namespace, name).set(plan.observed.rate_rps)
        if plan.predicted is not None:
            PREDICTED_RATE.labels(namespace, name).set(plan.predicted.rate_rps)
        if plan.forecast_error is not None:
            FORECAST_ERROR.labels(namespace, name).set(plan.forecast_error)
        for pool, replicas in plan.replicas.items():
            DESIRED.labels(namespace, name, pool).set(replicas)
        self._export_sla(namespace, name, config.sla)
        for pool, why in plan.binding.items():
            _set_binding(namespace, name, pool, why)
        CORRECTION.labels(namespace, name, "prefill").set(plan.corrections.prefill)
        CORRECTION.labels(namespace, name, "decode").set(plan.corrections.decode)
        LATENCY_OFFSET.labels(namespace, name, "prefill").set(plan.corrections.prefill_offset_s)
        LATENCY_OFFSET.labels(namespace, name, "decode").set(plan.corrections.decode_offset_s)
        QUEUE_SHARING.labels(namespace, name).set(plan.corrections.pooling)
        if plan.predicted is not None:
            BURST.labels(namespace, name).set(plan.predicted.burst)
        RISK.labels(namespace, name).set(config.risk)
        for load, by_level in plan.coverage.items():
            for level, share in by_level.items():
                FORECAST_COVERAGE.labels(namespace, name, load, f"{level:g}").set(share)

    async def _report(self, body: dict[str, Any], *, plan: core.Plan | None, active: bool, reason: str,
                      message: str, learned: dict[str, float] | None = None, profile: str | None = None,
                      warnings: tuple[tuple[str, str], ...] | None = None) -> None:
        """Apply status.planner and the planner's conditions: PlannerActive, ProfileDrift from the plan's
        verdict, and PlannerDegraded from `warnings` (what the graph asks that the planner cannot give;
        None: unknown this interval, the last word stands)."""
        conditions = body.get("status", {}).get("conditions", [])
        previous = contract.find_condition(conditions, "PlannerActive") or {}
        generation = body["metadata"].get("generation", 0)
        degraded = degraded_condition(warnings, previous=conditions, generation=generation)
        drifting = self._drift_condition(body, plan.drift if plan is not None else None, generation)
        block: dict[str, Any] = {"lastDecisionTime": contract.now_rfc3339(), "mode": body["spec"]["planner"]["mode"],
                                 "reason": message[:1024]}
        known = (body.get("status") or {}).get("planner") or {}
        if learned:
            block["learned"] = learned
        elif "learned" in known:
            block["learned"] = known["learned"]  # holding: keep what is known
        if profile or known.get("profile"):
            block["profile"] = (profile or known["profile"])[:512]  # which profile the graph is sized from
        if plan is not None:
            block["replicas"] = dict(plan.replicas)
            block["binding"] = dict(plan.binding)
            block["summary"] = ", ".join(f"{p}={n}" for p, n in plan.replicas.items()) + (
                "" if plan.data_ok else " (holding)")
            if plan.observed.rate_rps is not None:
                block["observedRateRps"] = round(plan.observed.rate_rps, 3)
            if plan.predicted is not None:
                block["predicted"] = {"rateRps": round(plan.predicted.rate_rps, 3),
                                      "decodeRateRps": round(plan.predicted.decode_rps, 3),
                                      "isl": round(plan.predicted.isl), "osl": round(plan.predicted.osl),
                                      "predictor": plan.predictor,
                                      "risk": body["spec"]["planner"].get("risk", core.DEFAULT_RISK)}
        await self.kube.apply({
            "apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND,
            "metadata": {"name": body["metadata"]["name"], "namespace": body["metadata"]["namespace"]},
            "status": {
                "planner": block,
                "conditions": [contract.condition("PlannerActive", active, reason, message, previous=conditions,
                                                  generation=generation), *drifting,
                               *([degraded] if degraded is not None else [])],
            },
        }, subresource="status")
        if previous.get("reason") != reason:
            await self._event(body, reason, message, warning=not active)
        was_degraded = contract.find_condition(conditions, PLANNER_DEGRADED) or {}
        if degraded is not None and degraded["status"] == "True" and was_degraded.get("reason") != degraded["reason"]:
            await self._event(body, degraded["reason"], degraded["message"], warning=True)
        was_drifting = contract.find_condition(conditions, PROFILE_DRIFT_CONDITION) or {}
        if drifting and drifting[0]["status"] == "True" and was_drifting.get("status") != "True":
            await self._event(body, PROFILE_DRIFT_CONDITION, drifting[0]["message"], warning=True)

    def _drift_condition(self, body: dict[str, Any], verdict: drifts.Verdict | None,
                         generation: int) -> list[dict[str, Any]]:
        """The ProfileDrift condition for this report: from the verdict, else (holding) the one the graph has,
        which the planner, applying status server-side, must send again to keep."""
        conditions = body.get("status", {}).get("conditions", [])
        if verdict is None:
            kept = contract.find_condition(conditions, PROFILE_DRIFT_CONDITION)
            return [dict(kept)] if kept else []
        meta = body["metadata"]
        PROFILE_DRIFT.labels(meta["namespace"], meta["name"]).set(1 if verdict.drifted else 0)
        for figure in verdict.figures:
            PROFILE_DRIFT_RATIO.labels(meta["namespace"], meta["name"], figure.metric).set(figure.ratio)
        status = "Unknown" if verdict.drifted is None else verdict.drifted
        return [contract.condition(PROFILE_DRIFT_CONDITION, status, verdict.reason, verdict.message,
                                   previous=conditions, generation=generation)]

    async def _event(self, body: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        try:
            await self.kube.event(body, type_="Warning" if warning else "Normal", reason=reason, message=message)
        except kube_mod.ApiError as error:
            logger.warning("could not record event: %s", error)
