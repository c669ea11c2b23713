"""Zero failed requests through every change of the fleet (issue 17), on the real control plane.

Three scenarios, each with replayed load through the frontend and the client checking that every
stream ends with its finish reason (fleetpilot.replay: a stream without one is a failure):

- **drained scale-down**: decode 4 → 2 and prefill 3 → 1 while at least 50 streams are in flight;
  the replicas removed are the least loaded (the pod-deletion-cost the operator wrote), the others
  finish what they serve;
- **generation-isolated rolling update**: an engine argument change on both pools under load, every
  request's prefill and decode on one generation (the frontend's pairing counter), the P:D skew
  bound at every observation; then a bad image stalls (Degraded=RolloutStalled) while the old
  generation serves, and reverting rolls back;
- **scale to zero and back**: the planner scales the workers to zero after the idle window, a burst
  of 20 wakes them and is served, time to first token against the replica start-up measured; a full
  hold queue and a hold timeout are 503 with Retry-After.

Results go to e2e/results/zero_downtime_*.json.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import harness as harness_mod
import httpx
import scenario as scenario_mod
from conftest import Graph, start_load, wait_load
from prometheus_client.parser import text_string_to_metric_families

from fleetpilot import traces
from fleetpilot.api import contract
from fleetpilot.operator import rollout
from fleetpilot.replay import client, report

GENERATION = contract.LABEL_GENERATION
WORKERS = ("prefill", "decode")


# -- helpers ------------------------------------------------------------------------------------------------


class ZeroGraph(Graph):
    """A scenario graph whose manifest the test shapes (replicas, drain, planner) before applying it."""

    def __init__(self, environment: harness_mod.Harness, s: scenario_mod.ClosedLoop,
                 shape: Callable[[dict[str, Any]], None], *, mode: str = "off") -> None:
        super().__init__(environment, s)
        self.manifest = s.graph_manifest(mode=mode)
        shape(self.manifest)

    def create(self) -> None:
        s = self.scenario
        self.kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": s.namespace}})
        self.kubectl.apply([s.profile_config_map(), self.manifest])

    def update(self, change: Callable[[dict[str, Any]], None]) -> None:
        change(self.manifest)
        self.kubectl.apply(self.manifest)


def frontend_metrics(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = httpx.get(url + "/metrics", timeout=5).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def gauge(url: str, name: str) -> float:
    return sum(value for _, value in frontend_metrics(url).get(name, []))


def pods(http: httpx.Client, namespace: str, graph: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = http.get(f"/api/v1/namespaces/{namespace}/pods",
                                           params={"labelSelector": f"{contract.LABEL_GRAPH}={graph}"}).json()["items"]
    return found


def role(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["labels"].get(contract.LABEL_COMPONENT))


def check_every_request(load: dict[str, Any]) -> dict[str, Any]:
    """Every request ok and complete (a finish reason; the client fails a stream without one)."""
    requests = load["requests"]
    failed = [r for r in requests if r["status"] != "ok" or not r.get("finish_reason")]
    summary = {"requests": len(requests), "failed": len(failed),
               "errors": sorted({str(r["error"])[:160] for r in failed})[:10],
               "finish_reasons": sorted({str(r.get("finish_reason")) for r in requests})}
    assert not failed, summary
    return summary


class PodWatch:
    """Samples the graph's pods every `every_s` in a thread: what the test checks at every observation."""

    def __init__(self, http: httpx.Client, namespace: str, graph: str, every_s: float = 0.5) -> None:
        self.http, self.namespace, self.graph, self.every_s = http, namespace, graph, every_s
        self.samples: list[tuple[float, list[dict[str, Any]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.time(), pods(self.http, self.namespace, self.graph)))
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            self._stop.wait(self.every_s)


# -- drained scale-down ---------------------------------------------------------------------------------------


def test_scale_down_under_load_fails_no_stream(harness: harness_mod.Harness, results: Path) -> None:
    s = dataclasses.replace(scenario_mod.ClosedLoop(), namespace="e2e-drain", graph="drain", isl=256, osl=300,
                            length_sigma=0.1, shape=((0, 6.0), (12, 6.0), (12.01, 1.0), (60, 1.0)), window_s=2,
                            bounds=(("prefill", 1, 3), ("decode", 1, 4)))

    def shape(manifest: dict[str, Any]) -> None:
        components = manifest["spec"]["components"]
        components["prefill"].update(replicas=3, drainSeconds=90)
        components["decode"].update(replicas=4, drainSeconds=90)

    graph = ZeroGraph(harness, s, shape)
    graph.create()
    http = scenario_mod.admin_http(harness.config.server, harness.config.folder / "pki")
    out = results / "zero_downtime_drain.load.json"
    try:
        url = graph.wait_ready(timeout=180)
        load = start_load(s, url=url, trace=scenario_mod.write_trace(s, results / "zero_downtime_drain.trace.csv"),
                          out=out)
        try:
            inflight = harness_mod.wait_for(
                lambda: (n := gauge(url, contract.INFLIGHT_METRIC)) >= 50 and n, timeout=90,
                what=lambda: f"50 streams in flight; now {gauge(url, contract.INFLIGHT_METRIC)}")
            before = {p["metadata"]["name"]: p for p in pods(http, s.namespace, s.graph) if scenario_mod.is_ready(p)}
            scaled_at = time.time()
            graph.kubectl.run("scale", f"dgc/{s.graph}-decode", "--replicas=2", "-n", s.namespace)
            graph.kubectl.run("scale", f"dgc/{s.graph}-prefill", "--replicas=1", "-n", s.namespace)

            def terminating() -> dict[str, dict[str, Any]]:
                """Every pod once two decode and two prefill pods terminate (the costs written on all)."""
                found = {p["metadata"]["name"]: p for p in pods(http, s.namespace, s.graph)}
                going = [role(p) for p in found.values() if p["metadata"].get("deletionTimestamp")]
                return found if going.count("decode") == 2 and going.count("prefill") == 2 else {}

            at_scale_down = harness_mod.wait_for(terminating, timeout=30, interval=0.2,
                                                 what="two decode and two prefill pods terminating")
            going = {name: p for name, p in at_scale_down.items() if p["metadata"].get("deletionTimestamp")}
            drained = harness_mod.wait_for(
                lambda: not any(name in going for name in (p["metadata"]["name"] for p in
                                                           pods(http, s.namespace, s.graph))) and time.time(),
                timeout=120, what="the removed pods to drain and go")
            wait_load(load, timeout=s.duration_s + 180)
        finally:
            if load.poll() is None:
                load.kill()
    finally:
        graph.delete()
        http.close()
    report_ = json.loads(out.read_text())
    summary = check_every_request(report_)

    # The replicas removed were the least loaded: the cost the operator wrote on each Ready pod (the
    # requests in flight on it) is no higher on any removed pod than on any kept one, per component.
    choice = {}
    for component in WORKERS:
        costs = {name: int(p["metadata"].get("annotations", {}).get(contract.ANNOTATION_DELETION_COST, -1))
                 for name, p in at_scale_down.items() if role(p) == component and name in before}
        removed = {name: cost for name, cost in costs.items() if name in going}
        kept = {name: cost for name, cost in costs.items() if name not in going}
        choice[component] = {"removed": removed, "kept": kept}
        assert all(cost >= 0 for cost in costs.values()), f"no deletion cost written on {component}: {costs}"
        assert len(kept) == (2 if component == "decode" else 1), choice
        assert max(removed.values()) <= min(kept.values()), f"a busier {component} replica went: {choice}"
    summary |= {"inflight_at_scale_down": inflight, "removed_pods": choice,
                "drained_in_s": round(drained - scaled_at, 1)}
    (results / "zero_downtime_drain.json").write_text(json.dumps(summary, indent=1) + "\n")
    assert inflight >= 50 and summary["requests"] >= 60, summary


# -- generation-isolated rolling update -------------------------------------------------------------------------


def generations_at(sample: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Ready worker pods per generation and component."""
    out: dict[str, dict[str, int]] = {}
    for pod in sample:
        if role(pod) in WORKERS and scenario_mod.is_ready(pod):
            counts = out.setdefault(pod["metadata"]["labels"].get(GENERATION, ""), dict.fromkeys(WORKERS, 0))
            counts[role(pod)] += 1
    return out


def test_rolling_update_under_load_pairs_generations_stalls_and_rolls_back(
    harness: harness_mod.Harness, results: Path
) -> None:
    s = dataclasses.replace(scenario_mod.ClosedLoop(), namespace="e2e-rollout", graph="rollout", isl=512, osl=96,
                            length_sigma=0.3, shape=((0, 1.5), (220, 1.5)), window_s=5,
                            bounds=(("prefill", 1, 4), ("decode", 1, 4)))
    totals = {"prefill": 2, "decode": 2}

    def shape(manifest: dict[str, Any]) -> None:
        for component, replicas in totals.items():
            manifest["spec"]["components"][component].update(replicas=replicas, drainSeconds=60)
        manifest["spec"]["rollout"] = {"progressDeadlineSeconds": 120}

    graph = ZeroGraph(harness, s, shape)
    graph.create()
    http = scenario_mod.admin_http(harness.config.server, harness.config.folder / "pki")
    out = results / "zero_downtime_rollout.load.json"
    marks: dict[str, float] = {}

    def rollout_status() -> dict[str, Any]:
        found: dict[str, Any] = graph.get().get("status", {}).get("rollout") or {}
        return found

    def complete_on(target: str) -> bool:
        status = rollout_status()
        ready = generations_at(pods(http, s.namespace, s.graph))
        return (status.get("target") == target and status.get("phase") == "Complete" and set(ready) == {target}
                and ready[target] == totals)

    try:
        url = graph.wait_ready(timeout=180)
        first = rollout_status()["target"]
        load = start_load(s, url=url, trace=scenario_mod.write_trace(s, results / "zero_downtime_rollout.trace.csv"),
                          out=out)
        t0 = time.time()
        try:
            with PodWatch(http, s.namespace, s.graph) as watch:
                time.sleep(15)
                marks["engine argument change"] = time.time() - t0
                graph.update(lambda m: m["spec"]["engine"]["args"].extend(["--max-num-seqs", "128"]))
                second = harness_mod.wait_for(lambda: (t := rollout_status().get("target")) != first and t,
                                              timeout=30, what="a new generation")
                harness_mod.wait_for(lambda: complete_on(second), timeout=180,
                                     what=lambda: f"the rollout to {second}; status {rollout_status()}")
                marks["rolled out"] = time.time() - t0
                time.sleep(10)

                marks["bad image"] = time.time() - t0
                graph.update(lambda m: m["spec"]["engine"].update(image="fleetpilot/fleetpilot:no-such-tag"))
                stalled = harness_mod.wait_for(
                    lambda: (c := scenario_condition(graph, "Degraded")).get("reason") == "RolloutStalled" and c,
                    timeout=90, what=lambda: f"Degraded=RolloutStalled; status {graph.get().get('status')}")
                marks["stalled"] = time.time() - t0
                bad = rollout_status()["target"]
                time.sleep(15)  # stalled, under load: the old generation keeps serving
                serving = generations_at(pods(http, s.namespace, s.graph))

                marks["revert"] = time.time() - t0
                graph.update(lambda m: m["spec"]["engine"].pop("image"))
                harness_mod.wait_for(lambda: complete_on(second), timeout=120,
                                     what=lambda: f"the rollback to {second}; status {rollout_status()}")
                marks["rolled back"] = time.time() - t0
                wait_load(load, timeout=s.duration_s + 180)
        finally:
            if load.poll() is None:
                load.kill()
        pairs = [(labels["prefill_generation"], labels["decode_generation"], value)
                 for labels, value in frontend_metrics(url).get("fleetpilot_frontend_generation_pairs_total", [])]
        bad_pods = [p for p in pods(http, s.namespace, s.graph) if p["metadata"]["labels"].get(GENERATION) == bad]
        final = graph.get()
    finally:
        graph.delete()
        http.close()

    load_report = json.loads(out.read_text())
    summary = check_every_request(load_report)
    observations = [(t - t0, generations_at(sample)) for t, sample in watch.samples]
    skewed = [(round(t, 1), counts) for t, counts in observations
              if not all(rollout.within_skew(g, totals) for g in counts.values())]
    summary |= {"generations": [first, second, bad], "marks_s": marks, "pairs": pairs,
                "stalled_condition": stalled, "serving_while_stalled": serving, "observations": len(observations),
                "skew_violations": skewed[:10], "final_rollout": final["status"].get("rollout")}
    (results / "zero_downtime_rollout.json").write_text(json.dumps(summary, indent=1) + "\n")

    # Every request's prefill and decode workers shared a generation, and both generations served.
    assert pairs and all(p == d for p, d, _ in pairs), pairs
    assert {p for p, _, n in pairs if n > 0} >= {first, second}, pairs
    # The P:D skew bound held at every observation, for every generation.
    assert len(observations) > 100 and not skewed, skewed[:10]
    # The bad image stalled the rollout and kept the old generation serving all of its replicas.
    assert "ImagePullBackOff" in stalled["message"] or "ImagePullBackOff" in str(summary["final_rollout"]), stalled
    assert serving.get(second) == totals, serving
    # Reverting rolled back: the bad generation is gone, the graph Ready on the good one.
    assert not bad_pods and final["status"]["rollout"]["target"] == second
    assert scenario_condition_of(final, "Ready")["status"] == "True"


def scenario_condition_of(graph: dict[str, Any], type_: str) -> dict[str, Any]:
    return dict(contract.find_condition(graph.get("status", {}).get("conditions", []), type_) or {})


def scenario_condition(graph: Graph, type_: str) -> dict[str, Any]:
    return scenario_condition_of(graph.get(), type_)


# -- scale to zero and back -------------------------------------------------------------------------------------


def burst(url: str, model: str, n: int, *, isl: int = 256, osl: int = 64) -> list[client.Result]:
    requests = [traces.Request(arrival_s=0.0, input_tokens=isl, output_tokens=osl) for _ in range(n)]
    return asyncio.run(client.replay(requests, url=url, model=model, timeout_s=240))


def test_scale_to_zero_then_a_burst_is_served(harness: harness_mod.Harness, results: Path) -> None:
    s = dataclasses.replace(scenario_mod.ClosedLoop(), namespace="e2e-zero", graph="zero",
                            bounds=(("prefill", 0, 2), ("decode", 0, 2)))
    queue = 25

    def shape(manifest: dict[str, Any]) -> None:
        components = manifest["spec"]["components"]
        for component in WORKERS:
            components[component]["replicas"] = 1
        components["frontend"].update(holdSeconds=120, holdQueue=queue)
        manifest["spec"]["planner"]["idleSeconds"] = 10

    graph = ZeroGraph(harness, s, shape, mode="sla")
    graph.create()
    http = scenario_mod.admin_http(harness.config.server, harness.config.folder / "pki")

    def workers_left() -> int:
        return sum(1 for p in pods(http, s.namespace, s.graph) if role(p) in WORKERS)

    def at_zero() -> bool:
        dgcs = [graph.kubectl.json("get", "dgc", f"{s.graph}-{c}", "-n", s.namespace) for c in WORKERS]
        return all(d["spec"]["replicas"] == 0 for d in dgcs) and workers_left() == 0

    try:
        url = graph.wait_ready(timeout=180)
        harness_mod.wait_for(at_zero, timeout=120, what="the workers scaled to zero after the idle window")
        asleep_events = [e for e in graph.kubectl.json("get", "events", "-n", s.namespace)["items"]
                         if e["reason"] == "ScaledToZero"]

        # A burst of 20 into a graph with no worker: held, the planner woken, every request served.
        with PodWatch(http, s.namespace, s.graph, every_s=0.2) as watch:
            sent = time.time()
            served = burst(url, s.served_model, 20)
        created, ready = worker_times(watch.samples)
        first = min(served, key=lambda r: r.start_s)
        summary: dict[str, Any] = {"burst": report.summary_dict(report.summarise(served))}
        assert all(r.status == "ok" and r.finish_reason for r in served), [r.error for r in served if r.error]
        startup = {c: round(ready[c] - created[c], 2) for c in WORKERS}
        ttft = first.ttft_s or 0.0
        all_ready = max(ready.values()) - sent
        summary |= {
            "ttft_first_request_s": round(ttft, 2),
            "wake_to_first_pod_s": round(min(created.values()) - sent, 2),
            "replica_startup_s": startup,
            "workers_ready_after_s": round(all_ready, 2),
            "ttft_beyond_replica_startup_s": round(ttft - max(startup.values()), 2),
            "scaled_to_zero_events": [e["message"] for e in asleep_events][:3],
        }

        # Asleep again, and it stays asleep: ten planning intervals (and their fast-path ticks) at zero, with
        # the burst's lengths remembered, add no replica and record no FastPath event.
        harness_mod.wait_for(at_zero, timeout=120, what="back to zero after the burst")
        slept_at = time.time()
        stayed = []
        while time.time() < slept_at + 10 * s.interval_s:
            stayed.append(at_zero())
            time.sleep(2.0)
        fast_path_events = [e["message"] for e in graph.kubectl.json("get", "events", "-n", s.namespace)["items"]
                            if e["reason"] == "FastPath" and event_time(e) >= slept_at]
        summary["asleep"] = {"intervals": 10, "samples": len(stayed), "at_zero": sum(stayed),
                             "fast_path_events": fast_path_events[:3]}
        assert all(stayed) and not fast_path_events, summary["asleep"]

        # Then more requests than the hold queue takes: the extra ones are refused at once.
        full = asyncio.run(queue_full(url, s.served_model, queue))
        summary["queue_full"] = full

        # With nobody to wake the workers (planner off, once asleep), a held request times out: 503 with
        # Retry-After.
        harness_mod.wait_for(at_zero, timeout=120, what="back to zero after the queue-full burst")
        graph.update(lambda m: (m["spec"]["planner"].update(mode="off"),
                                m["spec"]["components"]["frontend"].update(holdSeconds=3)))
        url = harness_mod.wait_for(lambda: frontend_with_hold(http, s.namespace, s.graph, 3), timeout=120,
                                   what="the frontend rolled with a 3 s hold")
        started = time.monotonic()
        timed_out = httpx.post(url + "/v1/completions", json={"model": s.served_model, "prompt": "a b c",
                                                              "max_tokens": 4}, timeout=30)
        summary["timeout"] = {"status": timed_out.status_code, "retry_after": timed_out.headers.get("retry-after"),
                              "code": timed_out.json()["error"]["code"],
                              "after_s": round(time.monotonic() - started, 2)}
    finally:
        graph.delete()
        http.close()
    (results / "zero_downtime_scale_to_zero.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\nscale from zero:", json.dumps({k: v for k, v in summary.items() if k != "burst"}))

    assert asleep_events, "no ScaledToZero event"
    # Time to first token of the first request: replica start-up plus under 5 s of everything else
    # (the planner's wake-up, scheduling, the hold's release, the first prefill and token).
    assert summary["ttft_beyond_replica_startup_s"] < 5, summary
    assert full["refused"] == 5 and full["served"] == queue and full["retry_after"], full
    assert full["code"] == "hold_queue_full", full
    timeout = summary["timeout"]
    assert timeout["status"] == 503 and timeout["code"] == "hold_timeout" and int(timeout["retry_after"]) > 0
    assert 3 <= timeout["after_s"] < 10, timeout


def event_time(event: dict[str, Any]) -> float:
    """When an Event last happened (seconds since the epoch), from whichever timestamp it carries."""
    stamp = event.get("lastTimestamp") or event.get("eventTime") or event["metadata"]["creationTimestamp"]
    return datetime.datetime.fromisoformat(str(stamp)).timestamp()


def worker_times(samples: list[tuple[float, list[dict[str, Any]]]]) -> tuple[dict[str, float], dict[str, float]]:
    """When the first pod of each worker component was seen, and when the first was Ready."""
    created: dict[str, float] = {}
    ready: dict[str, float] = {}
    for t, sample in samples:
        for pod in sample:
            component = role(pod)
            if component in WORKERS:
                created.setdefault(component, t)
                if scenario_mod.is_ready(pod):
                    ready.setdefault(component, t)
    assert set(ready) == set(WORKERS), f"the workers never became Ready: {created}, {ready}"
    return created, ready


async def queue_full(url: str, model: str, queue: int) -> dict[str, Any]:
    """`queue` + 5 requests at once into a graph at zero: `queue` are held and served, 5 refused at once."""
    body = {"model": model, "prompt": " ".join(["w"] * 64), "max_tokens": 8}
    async with httpx.AsyncClient(timeout=240, limits=httpx.Limits(max_connections=queue + 10)) as http:
        answers = await asyncio.gather(*(http.post(url + "/v1/completions", json=body) for _ in range(queue + 5)))
    refused = [a for a in answers if a.status_code == 503]
    served = [a for a in answers if a.status_code == 200 and a.json()["choices"][0]["finish_reason"]]
    return {"served": len(served), "refused": len(refused),
            "code": refused[0].json()["error"]["code"] if refused else None,
            "retry_after": refused[0].headers.get("retry-after") if refused else None,
            "other": sorted({f"{a.status_code} {a.text[:120]}" for a in answers if a not in refused + served})}


def frontend_with_hold(http: httpx.Client, namespace: str, graph: str, seconds: int) -> str | None:
    """The URL of the graph's Ready frontend pod once it runs with `--hold-seconds seconds`."""
    for pod in pods(http, namespace, graph):
        if role(pod) != "frontend" or not scenario_mod.is_ready(pod):
            continue
        args = pod["spec"]["containers"][0]["args"]
        if args[args.index("--hold-seconds") + 1] == str(seconds):
            return f"http://{pod['status']['podIP']}:8000"
    return None

