"""A burst no forecast saw: the load triples within 30 s, at the default 60-s planning interval.

The same burst runs twice in one session, on two graphs that differ in one field: with the planner's
fast path off (`fastPathSeconds: 0`, the interval's forecast alone) and on (every 5 s it reads the
graph's queues from its frontends' /metrics and adds the replicas a queue says are missing). What a user would
see is measured at the client: when the SLA came back after the burst. The issue's own bounds are
asserted: the fast path acts within 10 s of the burst, and the SLA recovers sooner with it.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from pathlib import Path
from typing import Any

import harness as harness_mod
import httpx
import scenario as scenario_mod
from conftest import Graph, run_load
from prometheus_client.parser import text_string_to_metric_families

# The load starts this long after a planning interval began, so both runs meet the planner at the
# same phase: plans at 40, 100, 160 s into the load.
PLAN_PHASE_S = 20.0
# The ramp begins just after the plan at 100 s, so no plan has seen any of it before the next one at
# 160 s: the forecast alone answers the burst only then (seen when the ramp began at 90 s: the plan at
# 100 s saw ten seconds of it and readied the forecast-only fleet for the ×3, which never broke the SLA).
RAMP_START_S, RAMP_END_S = 105.0, 135.0
# The load ends 40 s after the plan at 160 s: the forecast-only fleet's new replicas are serving by then,
# its backlog still draining, while the fast path's fleet has been back within its SLA since shortly after
# the ×3. Both recoveries are judged within the load, so a longer tail would only dilute the attainment.
LOAD_END_S = 200.0
BURST = dataclasses.replace(
    # risk 0.5: sizing for the forecast's median keeps the base load on one prefill and one decode
    # replica whatever the Poisson noise of its first intervals (at the 0.9-quantile a clump of 0.6
    # req/s sometimes crossed the two-replica level); the fast path, not the risk, is under test.
    scenario_mod.ClosedLoop(), interval_s=60, window_s=5, risk=0.5,
    # 0.6 req/s needs one prefill and one decode replica; 1.8 req/s needs two and two, and overloads
    # one prefill replica (scenario.needed).
    shape=((0, 0.6), (RAMP_START_S, 0.6), (RAMP_END_S, 1.8), (LOAD_END_S, 1.8)),
)
RECOVERY_WINDOW_S = 10.0  # the client's TTFT p90 is judged over trailing windows of this length


def _breaches(points: list[tuple[float, float | None, float | None]], *, after_s: float, ttft_ms: float,
              itl_ms: float) -> list[float]:
    """Each second from `after_s` at which the p90 TTFT or ITL of the points (time, TTFT, ITL) within the
    trailing window was over its target."""
    found = []
    t = after_s
    end = max((at for at, _, _ in points), default=after_s)
    while t <= end:
        window = [(ttft, itl) for at, ttft, itl in points if t - RECOVERY_WINDOW_S < at <= t]
        ttfts = [ttft for ttft, _ in window if ttft is not None]
        itls = [itl for _, itl in window if itl is not None]
        ttft_p = scenario_mod.percentile(ttfts, BURST.percentile) if len(ttfts) >= 3 else None
        itl_p = scenario_mod.percentile(itls, BURST.percentile) if len(itls) >= 3 else None
        if (ttft_p or 0.0) > ttft_ms or (itl_p or 0.0) > itl_ms:
            found.append(t)
        t += 1.0
    return found


def _served(load: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in load["requests"] if r["start_ms"] is not None and r["status"] == "ok"
            and r["ttft_ms"] is not None and r["itl_ms"] is not None]


def breaches(load: dict[str, Any], *, after_s: float, ttft_ms: float, itl_ms: float) -> list[float]:
    """Seconds into the load (by request send time) at which the client's trailing-window p90 TTFT or
    ITL was over its target: what requests sent then went through."""
    points = [(r["start_ms"] / 1000, r["ttft_ms"], r["itl_ms"]) for r in _served(load)]
    return _breaches(points, after_s=after_s, ttft_ms=ttft_ms, itl_ms=itl_ms)


def breaches_seen(load: dict[str, Any], *, after_s: float, ttft_ms: float, itl_ms: float) -> list[float]:
    """Seconds into the load at which a client could see the SLA broken: each request's TTFT counts when
    its first token arrived and its mean ITL when its last token did (by send time, a request sent just
    before a decode backlog formed is counted at its sending, seconds before anyone could know)."""
    points: list[tuple[float, float | None, float | None]] = []
    for r in _served(load):
        start = r["start_ms"]
        points.append(((start + r["ttft_ms"]) / 1000, r["ttft_ms"], None))
        points.append(((start + (r["latency_ms"] or r["ttft_ms"])) / 1000, None, r["itl_ms"]))
    return _breaches(points, after_s=after_s, ttft_ms=ttft_ms, itl_ms=itl_ms)


def _unix(timestamp: str) -> float:
    return datetime.datetime.fromisoformat(timestamp).timestamp()


def fast_path_reads(harness: harness_mod.Harness) -> dict[str, float]:
    """The planner's fast-path readings so far, by source (the frontends directly, or Prometheus)."""
    reads: dict[str, float] = {}
    exposition = harness_mod.wait_for(lambda: httpx.get(harness.planner_metrics_url, timeout=5).text, timeout=60,
                                      what="the planner's /metrics")  # it may still be starting
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "fleetpilot_planner_fast_path_reads_total":
                reads[sample.labels["source"]] = sample.value
    return reads


def burst_run(harness: harness_mod.Harness, results: Path, *, fast_path_s: int) -> dict[str, Any]:
    name = "burst-fast-path" if fast_path_s else "burst-forecast-only"
    s = dataclasses.replace(BURST, namespace=f"e2e-{name}", graph=name, fast_path_s=fast_path_s)
    graph = Graph(harness, s)
    graph.create()
    reads_before = fast_path_reads(harness)

    def in_phase_with_the_planner() -> None:
        """Wait until PLAN_PHASE_S after a planning interval began (the first plan is at the graph's creation)."""
        first = harness_mod.wait_for(lambda: graph.get().get("status", {}).get("planner", {}).get("lastDecisionTime"),
                                     timeout=90, what="the planner's first decision")
        since = time.time() - _unix(first)
        time.sleep((PLAN_PHASE_S - since) % s.interval_s)

    try:
        run = run_load(graph, scenario_mod.write_trace(s, results / f"{name}.trace.csv"),
                       results / f"{name}.load.json", before=in_phase_with_the_planner)
        events = graph.kubectl.json("get", "events", "-n", s.namespace, "--field-selector", "reason=FastPath")
        reads = {source: n - reads_before.get(source, 0.0) for source, n in fast_path_reads(harness).items()}
    finally:
        graph.delete()
    samples, load, t0, load_start = run["samples"], run["load"], run["t0"], run["load_start"]
    started_unix = load["started_unix"]
    first_up = next((x["t_unix"] - started_unix for x in samples
                     if (x["prefill_desired"] or 0) + (x["decode_desired"] or 0) > 2
                     and x["t_unix"] - started_unix > RAMP_START_S), None)
    fast_path_at = sorted(_unix(e["firstTimestamp"]) - started_unix for e in events.get("items", []))
    statuses = [r["status"] for r in load["requests"]]
    broke = breaches(load, after_s=RAMP_START_S, ttft_ms=s.ttft_ms, itl_ms=s.itl_ms)
    seen = breaches_seen(load, after_s=RAMP_START_S, ttft_ms=s.ttft_ms, itl_ms=s.itl_ms)
    summary = {
        "fast_path_seconds": fast_path_s, "requests": len(statuses), "errors": statuses.count("error"),
        "client_sla_attainment": load["summary"]["goodput_fraction"],
        "first_scale_up_after_ramp_start_s": first_up,
        # When the SLA first broke after the ramp began, by send time and as a client could first see it
        # (None: never), and when it was back for good (by send time).
        "sla_first_breach_at_s": broke[0] if broke else None,
        "sla_first_seen_at_s": seen[0] if seen else None,
        "sla_recovered_at_s": broke[-1] if broke else RAMP_START_S,
        "fast_path_events": [e.get("message") for e in events.get("items", [])],
        "fast_path_at_s": fast_path_at,
        "fast_path_reads": reads,
        "peak_desired": {c: max(x[f"{c}_desired"] or 0 for x in samples) for c in scenario_mod.COMPONENTS},
    }
    rows = scenario_mod.timeline(s, samples, load, t0_unix=t0)
    scenario_mod.write_results(name, results, scenario=s, rows=rows, summary=summary, extra={"samples": samples},
                               marks={"ramp": load_start + RAMP_START_S, "x3": load_start + RAMP_END_S})
    return summary


def test_the_fast_path_answers_a_burst_before_the_next_interval(harness: harness_mod.Harness,
                                                                 results: Path) -> None:
    forecast_only = burst_run(harness, results, fast_path_s=0)
    fast = burst_run(harness, results, fast_path_s=5)
    both = {"forecast only": forecast_only, "fast path": fast}

    assert not forecast_only["fast_path_events"], both  # the switch is honoured
    assert not any(forecast_only["fast_path_reads"].values()), both
    # The fast path read the frontends themselves, not Prometheus' last scrape.
    assert fast["fast_path_reads"].get("frontend", 0) > 0 and not fast["fast_path_reads"].get("prometheus"), both
    # The scenario tests something only if the burst broke the SLA of the fleet the forecast alone ran.
    assert forecast_only["sla_first_breach_at_s"] is not None, f"the burst never broke the forecast-only SLA: {both}"
    assert fast["fast_path_events"], f"the fast path never acted: {both}"
    # It acts within 10 s of the burst breaking the SLA as a client could first see it (Events carry whole
    # seconds) ... or had added the capacity before, so that the SLA never broke (seen: a fast-path step
    # on a clump of the base load's arrivals readied the fleet for the burst). By send time the breach
    # would be counted up to a generation early: a request sent at 130 s reports the ITL of the decode
    # backlog it met at 140 s.
    breach = fast["sla_first_seen_at_s"]
    if breach is None:
        assert fast["fast_path_at_s"], both
    else:
        assert any(RAMP_START_S <= t <= breach + 10 + 1 for t in fast["fast_path_at_s"]), both
    # ... and the client sees the SLA back sooner than with the forecast alone: the burst's breach is over
    # sooner, or there was none (a breach that begins after the forecast-only fleet had already recovered
    # is not the burst's: seen once, a predictive scale-down of decode on the plateau, at risk 0.5).
    burst_breach = breach is not None and fast["sla_first_breach_at_s"] < forecast_only["sla_recovered_at_s"]
    if burst_breach:
        assert fast["sla_recovered_at_s"] < forecast_only["sla_recovered_at_s"], both
    assert fast["client_sla_attainment"] > forecast_only["client_sla_attainment"], both
    assert fast["errors"] == 0 and forecast_only["errors"] == 0, both
