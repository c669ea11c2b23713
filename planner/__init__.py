"""The SLA planner: observe (Prometheus) → predict → size → constrain → actuate (/scale).

`core` is the pure heart (predict, size and constrain one graph for one interval) with `predict`,
`capacity` and `sizing` beneath it; `observe` and `live` are the adapters to Prometheus and
Kubernetes; `main` is `fleetpilot planner run`.
"""
