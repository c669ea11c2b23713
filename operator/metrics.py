"""The operator's own Prometheus metrics (`fleetpilot_operator_*`), served by `--metrics-port`."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from fleetpilot.operator import status

RECONCILES = Counter(
    "fleetpilot_operator_reconciles_total", "Graph reconciles, by result (ok or error).", ["result"]
)
# Both results exist from the start at 0, so the reconcile error ratio reads 0 rather than nothing.
for _result in ("ok", "error"):
    RECONCILES.labels(_result)
RECONCILE_SECONDS = Histogram(
    "fleetpilot_operator_reconcile_duration_seconds", "Time one graph reconcile took.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
APPLIES = Counter("fleetpilot_operator_applies_total", "Objects created or applied server-side, by kind.", ["kind"])
GROUP_ACTIONS = Counter(
    "fleetpilot_operator_group_actions_total",
    "Writes for multinode groups, by action: create-workers, admit, record-members, restart, release, "
    "delete-stale-workers.",
    ["action"],
)
QUEUE_DEPTH = Gauge("fleetpilot_operator_queue_depth", "Graphs waiting to be reconciled.")
GRAPH_CONDITION = Gauge(
    "fleetpilot_operator_graph_condition",
    "1 when the graph's condition has the given status, per condition type.",
    ["namespace", "graph", "type", "status"],
)


def forget_graph(namespace: str, graph: str) -> None:
    """Drop a deleted graph's series so dashboards do not show ghosts."""
    for type_ in status.OPERATOR_CONDITIONS:
        for value in ("True", "False", "Unknown"):
            try:
                GRAPH_CONDITION.remove(namespace, graph, type_, value)
            except KeyError:
                pass
LEADER = Gauge(
    "fleetpilot_operator_leader",
    "1 while this replica acts: it holds the leader Lease (--leader-elect), or runs alone without election.",
)
