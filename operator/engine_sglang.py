"""SGLang (`python3 -m sglang.launch_server`), driven through its own CLI.

Disaggregation: each worker runs in `--disaggregation-mode prefill` or `decode` with NIXL as the
transfer backend; a prefill worker also runs the bootstrap server decode workers first contact to
set up a transfer (`--disaggregation-bootstrap-port`, a container port of its own).

Multinode: every rank runs the server with the group's size, its rank and the leader's address
(`--dist-init-addr`); only rank 0 serves the API, so only the leader answers probes.

Drain: SGLang stops at once on SIGTERM, so the preStop hook waits until its running and queued
gauges are 0.
"""

from __future__ import annotations

from fleetpilot.operator.engine import (
    Engine,
    Manifest,
    Worker,
    wait_until_idle,
)

BOOTSTRAP_PORT = 8998
#: Requests SGLang still has: in the running batch, and queued.
BUSY_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs")


class SGLang(Engine):
    """The `Engine` for `framework: sglang`."""

    name = "sglang"
    shared_memory = True

    def command(self, worker: Worker) -> tuple[list[str], list[str]]:
        args = ["-m", "sglang.launch_server", "--model-path", worker.model,
                "--served-model-name", worker.served_name, "--host", "0.0.0.0", "--port", str(worker.port),
                "--tp-size", str(worker.tensor), "--pp-size", str(worker.pipeline)]
        if worker.disaggregated:
            args += ["--disaggregation-mode", worker.role, "--disaggregation-transfer-backend", "nixl"]
            if worker.role == "prefill":
                args += ["--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT)]
        group = worker.group
        if group is not None:
            args += ["--nnodes", str(group.nodes), "--node-rank", group.rank,
                     "--dist-init-addr", f"{group.leader_address}:{group.port}"]
        return ["python3"], args

    def drain_hook(self, worker: Worker) -> Manifest | None:
        return wait_until_idle(worker, BUSY_GAUGES)

    def ports(self, worker: Worker) -> list[Manifest]:
        # The bootstrap server runs where the API does: on a prefill worker's leader.
        if worker.role != "prefill" or not worker.leader:
            return []
        return [{"name": "bootstrap", "containerPort": BOOTSTRAP_PORT, "protocol": "TCP"}]


ENGINE = SGLang()
