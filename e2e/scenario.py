"""What the closed-loop scenarios run: the graph, its capacity profile, the load, and the timeline.

Where it sits: between `harness.py` (the environment) and the tests (`test_closed_loop.py`,
`run.py`). Everything the backtest of the same run needs is here as plain data: `ClosedLoop`
(graph, SLA, engine speed, trace shape, planner timings), `write_trace` (the ServeGen-format rate
series the replay client synthesises requests from) and `scaled_profile` (the capacity profile of
the engine as it runs).

**Why the engine runs slower than real time.** Two cores carry the whole fleet, so the offered load
must stay at a few requests per second, yet the planner must need several replicas at the peak.
The simulator's `--speedup` is the knob: at 0.1 a simulated H200 serves Llama-3.1-8B ten times
slower than a real one (every latency ×10, every throughput ÷10), so about one request per second
fills a prefill replica. The planner's capacity profile (a ConfigMap named by `profileRef`) is the
performance model's profile for that preset, scaled the same way, and the SLA targets are wall-clock
targets against it: the planner plans the fleet that actually runs.

**The load.** A trapezoid — a quiet start, a steep ramp up, a plateau, a gradual ramp down, a quiet
tail — written as a ServeGen-format rate series with one window per planning interval; the replay client draws
Poisson arrivals inside each window and lognormal input/output lengths (means 1,024 and 256 tokens,
σ 0.5), as `fleetpilot replay` does for ServeGen's real series.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import ssl
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from fleetpilot import perfmodel, plots, traces
from fleetpilot.api import profile as profiles
from fleetpilot.api import v1alpha1 as api
from fleetpilot.planner import capacity as capacities
from fleetpilot.planner import sizing

COMPONENTS = ("prefill", "decode")
SAMPLE_S = 2.0  # how often a run samples its components and planner status


@dataclasses.dataclass(frozen=True)
class ClosedLoop:
    """One scenario's parameters: the graph, the engine, the SLA, the load and the planner's timings."""

    namespace: str = "e2e-closed-loop"
    graph: str = "ramp"
    served_model: str = "llama-8b"
    preset: str = "llama-3.1-8b"
    gpu: str = "h200-sxm"
    speedup: float = 0.1
    ttft_ms: int = 1000
    itl_ms: int = 65
    percentile: int = 90
    interval_s: int = 10
    startup_s: int = 10  # planner's forecast horizon: a pod is Ready about 5-10 s after it is asked for
    hold_s: int = 20  # scale-down hold: two intervals, so the way down fits in the run
    bounds: tuple[tuple[str, int, int], ...] = (("prefill", 1, 6), ("decode", 1, 4))
    isl: int = 1024
    osl: int = 256
    length_sigma: float = 0.5
    # (seconds, requests/s): linear between points, one window per interval. The way up is steep, so
    # "when the load reached the level that needs more replicas" hardly depends on the latency
    # corrections that move that level; the way down is gradual, one step at a time.
    shape: tuple[tuple[float, float], ...] = (
        (0, 0.3), (30, 0.3), (40, 2.4), (110, 2.4), (150, 0.3), (210, 0.3),
    )
    seed: int = 7
    risk: float | None = 0.5  # spec.planner.risk; None: left out, the API's default
    fast_path_s: int = 5  # spec.planner.fastPathSeconds; 0: the interval's forecast alone
    window_s: float | None = None  # the trace's and the timeline's step; None: one planning interval
    nodes: int = 1  # pods per worker replica: > 1 runs each as a group, TP over one GPU per pod
    # spec.planner.gpuBudget: above what the bounds allow (6 + 4), so it never binds; it puts the planner's
    # GPU gauges (used, wanted, budget) on the dashboards and under the budget alert with live data.
    gpu_budget: int = 12
    # The engine runs this many times slower than the profile the planner is given says (1: as profiled).
    engine_slowdown: float = 1.0
    auto_correct: bool | None = None  # spec.planner.profile.autoCorrect; None: the API's default

    @property
    def step_s(self) -> float:
        return self.window_s or self.interval_s

    @property
    def sla(self) -> str:
        return f"ttft={self.ttft_ms}ms,itl={self.itl_ms}ms"

    def bound(self, component: str) -> tuple[int, int]:
        return next((low, high) for name, low, high in self.bounds if name == component)

    def rate_at(self, t: float) -> float:
        """The trace's offered rate at `t` seconds (piecewise linear through `shape`)."""
        points = self.shape
        if t <= points[0][0]:
            return points[0][1]
        for (t0, r0), (t1, r1) in itertools.pairwise(points):
            if t0 <= t <= t1:
                return r0 + (r1 - r0) * (t - t0) / (t1 - t0) if t1 > t0 else r1
        return points[-1][1]

    @property
    def duration_s(self) -> float:
        return self.shape[-1][0]

    def windows(self) -> Iterator[tuple[float, float]]:
        """(start, mean rate) of each `step_s`-long window of the trace."""
        start = 0.0
        while start < self.duration_s:
            middle = start + self.step_s / 2
            yield start, self.rate_at(middle)
            start += self.step_s

    # -- objects -------------------------------------------------------------------------------------------

    def graph_manifest(self, *, mode: str = "sla") -> dict[str, Any]:
        worker_args = ["--model-preset", self.preset, "--gpu", self.gpu,
                       "--speedup", f"{self.speedup / self.engine_slowdown:g}"]
        components: dict[str, Any] = {"frontend": {"replicas": 1, "router": {"policy": "least-loaded"}}}
        for name, low, high in self.bounds:
            components[name] = {"replicas": low, "gpus": 1, "scaling": {"min": low, "max": high}}
            if self.nodes > 1:  # a group of one-GPU pods, tensor-parallel across them
                components[name].update(nodes=self.nodes, parallelism={"tensor": self.nodes})
        # A decode pod drains its streams on SIGTERM; give it longer than the longest generation.
        components["decode"]["drainSeconds"] = 110
        return {
            "apiVersion": api.API_VERSION, "kind": api.GRAPH_KIND,
            "metadata": {"name": self.graph, "namespace": self.namespace},
            "spec": {
                "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": self.served_model},
                "engine": {"framework": "simulator", "args": worker_args},
                "components": components,
                # risk 0.5: a 4-minute run is 24 ten-second intervals; after its 8× ramp the calibrated
                # 0.9-quantile stays wide for longer than the run (docs/adr/0016-one-risk-knob.md).
                "planner": {"mode": mode, "predictor": "constant", "intervalSeconds": self.interval_s,
                            "gpuBudget": self.gpu_budget,
                            **({"risk": self.risk} if self.risk is not None else {}),
                            "fastPathSeconds": self.fast_path_s,
                            "sla": {"ttftMs": self.ttft_ms, "itlMs": self.itl_ms, "percentile": self.percentile},
                            "profileRef": {"configMap": f"{self.graph}-profile"},
                            **({"profile": {"autoCorrect": self.auto_correct}} if self.auto_correct is not None else {})},
            },
        }

    def profile(self) -> profiles.Profile:
        return scaled_profile(self.preset, self.gpu, self.speedup, tensor_parallel=self.nodes, nodes=self.nodes)

    def profile_config_map(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"{self.graph}-profile", "namespace": self.namespace},
                "data": {"profile.json": self.profile().model_dump_json()}}

    # -- what the planner should do ------------------------------------------------------------------------

    def needed(self, rate_rps: float) -> dict[str, int]:
        """Replicas the planner's own sizing asks for at a steady `rate_rps` (no latency correction)."""
        model = capacities.CapacityModel(self.profile())
        load = sizing.Load(rate_rps=max(rate_rps, 1e-6), isl=self.isl, osl=self.osl)
        target = api.SlaTarget(ttft_ms=self.ttft_ms, itl_ms=self.itl_ms, percentile=self.percentile)
        desired = sizing.size(load, model, target, sizing.Corrections())
        return {c: desired.replicas[c] for c in COMPONENTS}

    def threshold_rps(self, component: str) -> float:
        """The lowest rate at which sizing wants more than the minimum of `component`."""
        low, high = 0.01, 50.0
        floor = self.bound(component)[0]
        for _ in range(40):
            middle = (low + high) / 2
            if self.needed(middle)[component] > floor:
                high = middle
            else:
                low = middle
        return high

    def last_time_at_or_above(self, rate_rps: float) -> float | None:
        t = self.duration_s
        while t >= 0:
            if self.rate_at(t) >= rate_rps:
                return t
            t -= 0.25
        return None


def scaled_profile(preset: str, gpu: str, speedup: float, *, tensor_parallel: int = 1, nodes: int = 1
                   ) -> profiles.Profile:
    """The performance model's profile of (preset, gpu) (a replica of `tensor_parallel` GPUs over
    `nodes` nodes), for an engine running `speedup` × real time.

    The same grid as the planner's built-in simulator profile; every duration is divided by the
    speedup and every throughput multiplied by it, since that is what the wall clock sees.
    """
    model = perfmodel.PerformanceModel(perfmodel.MODELS[preset], perfmodel.GPUS[gpu], tensor_parallel=tensor_parallel,
                                       nodes=nodes)
    base = profiles.from_performance_model(
        model, isls=[128, 512, 1024, 2048, 4096, 8192, 16384], contexts=[512, 1024, 2048, 4096, 8192, 16384],
        concurrencies=[1, 2, 4, 8, 16, 32, 64, 128, 256], engine="simulator")
    document = base.model_dump()
    for point in document["prefill"]:
        point["ttft_ms"] /= speedup
        point["tokens_per_s_per_gpu"] *= speedup
    for point in document["decode"]:
        point["itl_ms"] /= speedup
        point["tokens_per_s_per_gpu"] *= speedup
    document["source"] = f"fleetpilot performance model, {preset} on {gpu}, simulator --speedup {speedup:g}"
    return profiles.Profile.model_validate(document)


def write_trace(scenario: ClosedLoop, path: Path) -> Path:
    """The load as a ServeGen-format rate series (`model,t_start_s,total_rate_rps,active_clients`)."""
    lines = ["model,t_start_s,total_rate_rps,active_clients"]
    lines += [f"e2e-ramp,{start:g},{rate:.4f},1" for start, rate in scenario.windows()]
    path.write_text("\n".join(lines) + "\n")
    return path


# -- the timeline -------------------------------------------------------------------------------------------


def admin_http(server: str, pki: Path) -> httpx.Client:
    """An HTTP client to the apiserver as the cluster's admin (faster than kubectl for sampling)."""
    tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    tls.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return httpx.Client(base_url=server, verify=tls, timeout=5.0)


class Sampler:
    """Samples the graph's components and planner status every `every_s` in a thread (admin identity)."""

    def __init__(self, *, server: str, pki: Path, scenario: ClosedLoop, every_s: float = 2.0) -> None:
        self.http = admin_http(server, pki)
        self.scenario = scenario
        self.every_s = every_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.http.close()

    def sample(self) -> dict[str, Any]:
        s = self.scenario
        base = f"/apis/{api.API_VERSION}/namespaces/{s.namespace}"
        graph = self.http.get(f"{base}/dynamographs/{s.graph}").json()
        row: dict[str, Any] = {"t_unix": time.time()}
        for component in COMPONENTS:
            dgc = self.http.get(f"{base}/dynamographcomponents/{s.graph}-{component}")
            body = dgc.json() if dgc.status_code == 200 else {}
            row[f"{component}_desired"] = body.get("spec", {}).get("replicas")
            row[f"{component}_ready"] = body.get("status", {}).get("readyReplicas")
        pods = self.http.get("/api/v1/pods", params={"labelSelector": f"fleetpilot.dev/graph={s.graph}"}).json()
        row["pods_pending"] = sum(1 for p in pods.get("items", []) if p.get("status", {}).get("phase") == "Pending")
        status = graph.get("status", {})
        planner = status.get("planner", {})
        row["planner_summary"] = planner.get("summary")
        row["planner_observed_rps"] = planner.get("observedRateRps")
        row["planner_decision_time"] = planner.get("lastDecisionTime")
        for condition in status.get("conditions", []):
            if condition["type"] in ("PlannerActive", "Degraded"):
                row[condition["type"]] = {k: condition.get(k) for k in ("status", "reason", "message")}
        return row

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.sample())
            except (httpx.HTTPError, ValueError):
                pass
            self._stop.wait(self.every_s)


def sustained_crossing(send_times: list[float], threshold_rps: float, *, window_s: float,
                       step_s: float = 0.5) -> float | None:
    """When the offered load, as a trailing `window_s` mean of the actual sends, reached `threshold_rps`
    and stayed there for a whole window (what `rate(...[window])` in Prometheus shows, minus its blips)."""
    times = sorted(send_times)
    if not times:
        return None
    end = times[-1]

    def mean(t: float) -> float:
        return sum(1 for x in times if t - window_s < x <= t) / window_s

    t = 0.0
    while t <= end:
        if mean(t) >= threshold_rps and all(mean(t + k * step_s) >= threshold_rps
                                            for k in range(1, int(window_s / step_s) + 1)):
            return t
        t += step_s
    return None


def is_ready(pod: dict[str, Any]) -> bool:
    """Whether a pod serves: Ready and not terminating."""
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, math.ceil(q / 100 * len(ordered)) - 1)
    return ordered[rank]


def timeline(scenario: ClosedLoop, samples: list[dict[str, Any]], load: dict[str, Any], *,
             t0_unix: float) -> list[dict[str, Any]]:
    """One row per step (`step_s`): offered load, replicas at its end, client latency percentiles."""
    requests = load["requests"]
    start = load["started_unix"] - t0_unix
    rows = []
    end = max([s["t_unix"] - t0_unix for s in samples] + [start + scenario.duration_s])
    t = 0.0
    while t < end:
        window = [r for r in requests if r["start_ms"] is not None
                  and t <= start + r["start_ms"] / 1000 < t + scenario.step_s]
        ok = [r for r in window if r["status"] == "ok"]
        inside = [x for x in samples if t <= x["t_unix"] - t0_unix < t + scenario.step_s]
        last = inside[-1] if inside else {}
        row: dict[str, Any] = {
            "t_s": round(t, 1),
            "offered_rps": round(len(window) / scenario.step_s, 3),
            "trace_rps": round(scenario.rate_at(t + scenario.step_s / 2 - start), 3),
            "errors": sum(1 for r in window if r["status"] == "error"),
            "ttft_p50_ms": percentile([r["ttft_ms"] for r in ok if r["ttft_ms"] is not None], 50),
            "ttft_p90_ms": percentile([r["ttft_ms"] for r in ok if r["ttft_ms"] is not None], 90),
            "itl_p50_ms": percentile([r["itl_ms"] for r in ok if r["itl_ms"] is not None], 50),
            "itl_p90_ms": percentile([r["itl_ms"] for r in ok if r["itl_ms"] is not None], 90),
        }
        for component in COMPONENTS:
            row[f"{component}_desired"] = last.get(f"{component}_desired")
            row[f"{component}_ready"] = last.get(f"{component}_ready")
        row["planner_active"] = (last.get("PlannerActive") or {}).get("reason")
        rows.append(row)
        t += scenario.step_s
    return rows


def write_results(name: str, folder: Path, *, scenario: ClosedLoop, rows: list[dict[str, Any]],
                  summary: dict[str, Any], extra: dict[str, Any], marks: dict[str, float] | None = None) -> Path:
    """`<name>.json` and `<name>.png` (the timeline) under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    document = {"scenario": dataclasses.asdict(scenario), "summary": summary, "timeline": rows, **extra}
    (folder / f"{name}.json").write_text(json.dumps(document, indent=1) + "\n")
    if not plot(rows, folder / f"{name}.png", scenario=scenario, title=name, marks=marks or {}):
        print(plots.skipped_note(f"{name}.png"))
    return folder / f"{name}.json"


def plot(rows: list[dict[str, Any]], path: Path, *, scenario: ClosedLoop, title: str,
         marks: dict[str, float], static: dict[str, int] | None = None) -> bool:
    """The timeline PNG; `static`: a fixed fleet (replicas per component) to draw beside the planner's."""
    plt = plots.pyplot()
    if plt is None:
        return False
    t = [r["t_s"] for r in rows]
    figure, (load_ax, replica_ax, ttft_ax, itl_ax) = plt.subplots(4, 1, sharex=True, figsize=(10, 11))
    load_ax.step(t, [r["offered_rps"] for r in rows], where="post", label="offered (client)")
    load_ax.plot(t, [r["trace_rps"] for r in rows], "--", label="trace")
    load_ax.set_ylabel("requests/s")
    for component, colour in zip(COMPONENTS, ("tab:blue", "tab:orange"), strict=True):
        replica_ax.step(t, [r[f"{component}_desired"] or 0 for r in rows], where="post", color=colour,
                        label=f"{component} desired")
        replica_ax.step(t, [r[f"{component}_ready"] or 0 for r in rows], where="post", color=colour,
                        linestyle=":", label=f"{component} ready")
        if static and component in static:
            replica_ax.axhline(static[component], color=colour, linestyle="--", linewidth=0.8,
                               label=f"{component}: static fleet for the peak")
    replica_ax.set_ylabel("replicas")
    for axis, key, target in ((ttft_ax, "ttft", scenario.ttft_ms), (itl_ax, "itl", scenario.itl_ms)):
        axis.plot(t, [r[f"{key}_p50_ms"] for r in rows], label="p50")
        axis.plot(t, [r[f"{key}_p90_ms"] for r in rows], label="p90")
        axis.axhline(target, color="red", linestyle="--", label="target")
        axis.set_ylabel(f"client {key.upper()} ms")
    itl_ax.set_xlabel("seconds")
    for axis in (load_ax, replica_ax, ttft_ax, itl_ax):
        for label, when in marks.items():
            axis.axvline(when, color="grey", linestyle="-.", linewidth=0.8)
            if axis is load_ax:
                axis.annotate(label, (when, 0), rotation=90, fontsize=7, va="bottom")
        axis.legend(fontsize=7, loc="upper right")
        axis.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return True


# -- a replay judged as the backtest judges it ---------------------------------------------------------------


def static_fleet(requests: Sequence[traces.Request], s: ClosedLoop, *, scored_from_s: float) -> dict[str, int]:
    """The fixed fleet the backtest's `static-peak` would run for the scored part: sized, as the planner
    sizes, for its busiest planning interval, within the graph's replica bounds."""
    from fleetpilot.planner.backtest import evaluate, policies

    scored = [r for r in requests if r.arrival_s >= scored_from_s]
    since = np.array([r.arrival_s - scored_from_s for r in scored])
    _, loads = evaluate.interval_loads(since, np.array([r.input_tokens for r in scored], dtype=float),
                                       np.array([r.output_tokens for r in scored], dtype=float),
                                       interval_s=s.interval_s, count=int(since.max() // s.interval_s) + 1)
    setting = policies.Setting(
        capacity=capacities.CapacityModel(s.profile()),
        sla=api.SlaTarget(ttft_ms=s.ttft_ms, itl_ms=s.itl_ms, percentile=s.percentile),
        interval_s=s.interval_s, startup_s=s.startup_s,
        bounds={"prefill": s.bound("prefill"), "decode": s.bound("decode")})
    return policies.static_replicas(setting, loads, level="peak", factor=1.0)


def servable(requests: Sequence[traces.Request], s: ClosedLoop) -> list[bool]:
    """Whether each request can meet the SLA at all: its TTFT and mean ITL alone on idle replicas of the
    demo's engine (the performance model, on the engine's slowed clock) within the targets.

    The backtest leaves the others out of every policy's score, and so does the demo: a prompt that
    takes longer than the TTFT target to prefill on an idle replica misses it at any fleet size."""
    from fleetpilot.planner.backtest import driver, fleetsim

    timing = perfmodel.PerformanceModel(perfmodel.MODELS[s.preset], perfmodel.GPUS[s.gpu])
    # The modelled GPU's seconds: the engine runs at `speed` of it, so its targets are `speed` times as long there.
    speed = s.speedup / s.engine_slowdown
    modelled = api.SlaTarget(ttft_ms=s.ttft_ms * speed, itl_ms=s.itl_ms * speed, percentile=s.percentile)
    return driver.servable(requests, fleetsim.FleetConfig(timing=timing, startup_s=0.0), modelled)


def attainment(records: Sequence[dict[str, Any]], s: ClosedLoop) -> float:
    """The share of `records` (the load report's) served with TTFT and mean ITL within the targets."""
    met = [r for r in records if r["status"] == "ok" and r["ttft_ms"] is not None and r["ttft_ms"] <= s.ttft_ms
           and (r["itl_ms"] is None or r["itl_ms"] <= s.itl_ms)]
    return len(met) / len(records) if records else 0.0


# -- what the backtest predicts for the same run --------------------------------------------------------------


def within_targets(load: dict[str, Any], *, ttft_ms: float, itl_ms: float) -> dict[str, float]:
    """The shares of the load report's requests whose TTFT, and whose mean ITL, met its target (a failed
    request meets neither)."""
    requests = load["requests"]
    if not requests:
        return {"ttft": 0.0, "itl": 0.0}

    def share(key: str, target: float) -> float:
        met = [r for r in requests if r["status"] == "ok" and r[key] is not None and r[key] <= target]
        return len(met) / len(requests)

    return {"ttft": share("ttft_ms", ttft_ms), "itl": share("itl_ms", itl_ms)}


def backtest_goodput(scenario: ClosedLoop, trace: Path) -> float:
    """The share of requests within the SLA that the backtest predicts for this run.

    The same requests (the load generator's synthesis of `trace`) through the per-request fleet
    simulator with the planner core in the loop, in the engine's simulated time: the engine runs at
    `speedup` × real time, so arrivals, SLA targets, interval, startup and hold are all multiplied by
    it, and the planner sizes from the unscaled performance-model profile.
    """
    import loadgen  # e2e/ is on sys.path, as for every module here

    from fleetpilot.planner import core, predict
    from fleetpilot.planner.backtest import driver, fleetsim, policies

    requests = loadgen.load_requests(trace, model="e2e-ramp", isl=scenario.isl, osl=scenario.osl,
                                     sigma=scenario.length_sigma, seed=scenario.seed)
    k = scenario.speedup
    simulated = traces.time_scale(requests, 1 / k)  # arrival × speedup
    sla = api.SlaTarget(ttft_ms=scenario.ttft_ms * k, itl_ms=scenario.itl_ms * k, percentile=scenario.percentile)
    model = perfmodel.PerformanceModel(perfmodel.MODELS[scenario.preset], perfmodel.GPUS[scenario.gpu])
    unscaled = scaled_profile(scenario.preset, scenario.gpu, 1.0)
    bounds = {name: (low, high) for name, low, high in scenario.bounds}
    setting = policies.Setting(capacity=capacities.CapacityModel(unscaled), sla=sla,
                               interval_s=scenario.interval_s * k, startup_s=scenario.startup_s * k,
                               bounds={"prefill": bounds["prefill"], "decode": bounds["decode"]})
    start = {"prefill": bounds["prefill"][0], "decode": bounds["decode"][0]}
    # The planner as it runs live: the predictive loop and its fast path.
    policy = policies.Fleetpilot(setting, predict.make_predictor("constant"), predictor_name="constant",
                                 risk=core.DEFAULT_RISK if scenario.risk is None else scenario.risk, initial=start, hold_s=scenario.hold_s * k)
    fleet = driver.RequestFleet(fleetsim.FleetConfig(timing=model, startup_s=scenario.startup_s * k),
                                simulated, start)
    result = driver.run(fleet, policy, duration_s=scenario.duration_s * k, interval_s=scenario.interval_s * k,
                        sla=sla)
    return result.good / max(result.requests, 1)
