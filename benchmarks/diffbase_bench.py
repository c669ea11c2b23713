"""What kopf's diff base costs per watch event, with kopf's default storage and with the operator's.

kopf's processing of every event fetches the object's last-handled essence, builds a new one (a deep
copy of the body less its system fields) and diffs the two, before it looks at which handlers there are
(kopf 1.x `_core/reactor/processing.py::_detect_causes`). Only on.create/on.update handlers and daemons
read that diff; the operator has neither, so it sets `handlers.NoDiffBase`. This replays the same three
calls on `--events` pods as kwok runs them (`list_stall_bench.kwok_pod`) with both storages, in one run.

Run: `~/.cache/fleetpilot/venv/bin/python benchmarks/diffbase_bench.py [--events 20000]`
"""

from __future__ import annotations

import argparse
import time

import kopf
from kopf._cogs.structs import diffs  # the diff kopf computes per event (not re-exported)
from list_stall_bench import kwok_pod

from fleetpilot.operator import handlers


def per_event_us(storage: kopf.DiffBaseStorage, bodies: list[kopf.Body]) -> float:
    began = time.perf_counter()
    for body in bodies:
        old = storage.fetch(body=body)
        new = storage.build(body=body)
        diffs.diff(old, new)
    return (time.perf_counter() - began) / len(bodies) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20000)
    args = parser.parse_args()
    bodies = [kopf.Body(kwok_pod(i)) for i in range(args.events)]
    default = kopf.OperatorSettings().persistence.diffbase_storage
    per_event_us(default, bodies[:200])  # warm up both paths
    kopf_us = per_event_us(default, bodies)
    ours_us = per_event_us(handlers.NoDiffBase(), bodies)
    print(f"{args.events:,} pod events: kopf's default {type(default).__name__} {kopf_us:.1f} µs per event, "
          f"NoDiffBase {ours_us:.2f} µs per event; {(kopf_us - ours_us) * args.events / 1e6:.2f} CPU-s saved")


if __name__ == "__main__":
    main()
