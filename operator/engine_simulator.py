"""The simulator (`fleetpilot sim worker`): fleetpilot's own GPU-free engine, timed by the
performance model, which speaks vLLM's API and metrics (fleetpilot/sim).

Disaggregation: `--role prefill|decode|aggregated`; KV transfers are simulated, so no side channel: a
decode worker asks its prefill worker's HTTP API for the blocks, so its graph's other workers reach it
on the HTTP port and, in a group, the rendezvous port alone (`peer_ports`).

Multinode: every rank runs `fleetpilot sim worker` with the group's size, its rank and the
leader's address; the leader serves once every rank has joined its TCP rendezvous. Every rank
answers /health, so the group's other ranks are probed too.

Drain: the simulator drains on SIGTERM by itself (in-flight streams finish and held KV is pulled,
for `--shutdown-timeout`, the worker's drain time), so it needs no preStop hook. It needs no
shared memory either.
"""

from __future__ import annotations

from fleetpilot.operator.engine import Engine, Manifest, Worker, health_probes


class Simulator(Engine):
    """The `Engine` for `framework: simulator`."""

    name = "simulator"

    def command(self, worker: Worker) -> tuple[list[str], list[str]]:
        args = ["sim", "worker", "--role", worker.role, "--model", worker.served_name, "--host", "0.0.0.0",
                "--port", str(worker.port), "--tensor-parallel-size", str(worker.tensor),
                "--pipeline-parallel-size", str(worker.pipeline),
                "--shutdown-timeout", str(worker.drain_seconds)]
        group = worker.group
        if group is not None:
            args += ["--nnodes", str(group.nodes), "--node-rank", group.rank,
                     "--master-addr", group.leader_address, "--master-port", str(group.port)]
        return ["fleetpilot"], args

    def probes(self, worker: Worker) -> Manifest | None:
        return health_probes()  # every rank of a simulated group serves /health, the leader's ranks too

    def peer_ports(self, worker: Worker) -> list[int] | None:
        # A decode worker pulls the simulated KV blocks from its prefill worker's HTTP API; a group's ranks
        # meet the leader on the rendezvous port, and nothing else crosses between them.
        ports = [worker.port] if worker.disaggregated else []
        if worker.group is not None:
            ports.append(worker.group.port)
        return ports


ENGINE = Simulator()
