"""vLLM (`vllm serve`): the OpenAI-compatible server of vLLM, driven through its own CLI.

Disaggregation: both halves of a pair run NIXL (`NixlConnector`, role `kv_both`): the frontend's
two-hop protocol decides which worker prefills, and the decode worker pulls the KV cache over
NIXL's side channel, which each pod advertises at its own IP (`VLLM_NIXL_SIDE_CHANNEL_HOST`).

Multinode: vLLM's native multi-node mode (the multiprocessing executor, no Ray): every rank runs
`vllm serve` with the group's size, its rank and the leader's address; the ranks > 0 run
`--headless` and serve no API, so only the leader answers probes.

Drain: vLLM stops at once on SIGTERM, so the preStop hook waits until its running and waiting
gauges are 0.
"""

from __future__ import annotations

import json

from fleetpilot.operator.engine import (
    Engine,
    Manifest,
    Worker,
    wait_until_idle,
)

NIXL_SIDE_CHANNEL_PORT = 5600
#: Requests vLLM still has: in the running batch, and queued.
BUSY_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


class VLLM(Engine):
    """The `Engine` for `framework: vllm`."""

    name = "vllm"
    shared_memory = True

    def command(self, worker: Worker) -> tuple[list[str], list[str]]:
        args = ["serve", worker.model, "--served-model-name", worker.served_name, "--host", "0.0.0.0",
                "--port", str(worker.port), "--tensor-parallel-size", str(worker.tensor),
                "--pipeline-parallel-size", str(worker.pipeline)]
        if worker.disaggregated:
            nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
            args += ["--kv-transfer-config", json.dumps(nixl)]
        group = worker.group
        if group is not None:
            args += ["--distributed-executor-backend", "mp", "--nnodes", str(group.nodes),
                     "--node-rank", group.rank, "--master-addr", group.leader_address,
                     "--master-port", str(group.port)]
            if not worker.leader:
                args.append("--headless")
        return ["vllm"], args

    def drain_hook(self, worker: Worker) -> Manifest | None:
        return wait_until_idle(worker, BUSY_GAUGES)

    def env(self, worker: Worker) -> list[Manifest]:
        if not worker.disaggregated:
            return []
        return [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "$(POD_IP)"},
                {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)}]

    def ports(self, worker: Worker) -> list[Manifest]:
        if not worker.disaggregated:
            return []
        return [{"name": "nixl", "containerPort": NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"}]


ENGINE = VLLM()
