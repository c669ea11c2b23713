"""The SLA planner: observe (Prometheus) → predict → size → constrain → actuate (/scale).

`core` is the pure heart (predict, size and constrain one graph for one interval) with `predict`,
`capacity`, `sizing` and `budget` (the shared GPU budget ledger) beneath it; `observe` and `live` are
the adapters to Prometheus and Kubernetes; `main` is `fleetpilot planner run`. `backtest/` drives the
same core through simulated fleets (the live planner never imports it), and `cli` is the
`fleetpilot planner` command over both.
"""
