"""Scale to zero and back: a graph nobody calls gives its GPUs back, and its next request wakes it.

Where it sits: a pure step of the live planner, beside the interval's plan and the fast path. The
graph's frontends stay up (CPU only) when the workers go; a request that finds no worker is held by
its frontend (bounded queue, timeout) and counted in `fleetpilot_frontend_held_requests`. The
planner reads each frontend's /metrics directly every tick (planner/frontends.py: no Prometheus
scrape in the way) for the graphs that may scale to zero, and decides here:

- **wake**: a request is held and a pool that may be at zero is → one replica for each such pool
  at zero (the interval's plan sizes from there once traffic is measured);
- **sleep**: no request in flight or held, and none received for `spec.planner.idleSeconds` → the
  pools whose `scaling.min` is 0 go to zero, whatever the interval's plan says (it never sizes
  below one replica: `asleep` tells it to stand aside).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Demand:
    """What a graph's frontends see now, summed (idle: the least over them)."""

    held: float  # requests waiting for a worker
    inflight: float  # requests being served (held ones included)
    idle_s: float  # seconds since any frontend received a request


def asleep(demand: Demand, idle_window_s: float) -> bool:
    """No request for the idle window, none in flight and none held: the graph may sleep."""
    return demand.held == 0 and demand.inflight == 0 and demand.idle_s >= idle_window_s


def decide(*, min_replicas: Mapping[str, int], current: Mapping[str, int], demand: Demand,
           idle_window_s: float) -> dict[str, int]:
    """The pools to change now and their replicas: woken to one, or sent to zero; {} for no change."""
    zeroable = [pool for pool, low in min_replicas.items() if low == 0]
    if demand.held > 0:
        return {pool: 1 for pool in zeroable if current.get(pool, 0) == 0}
    if asleep(demand, idle_window_s):
        return {pool: 0 for pool in zeroable if current.get(pool, 0) > 0}
    return {}
