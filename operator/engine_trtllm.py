"""TensorRT-LLM (`trtllm-serve`, PyTorch backend), driven through its own CLI.

Disaggregation: a prefill or decode worker needs its KV-cache transceiver switched on, which
`trtllm-serve` takes only from an options file (`--extra_llm_api_options`): the file comes from a
ConfigMap per component, mounted at `CONFIG_DIR`. Context-only (prefill) servers also switch off
the overlap scheduler, which they cannot use.

Multinode: not rendered. TensorRT-LLM launches a multinode replica with mpirun over SSH between
the group's pods; the API refuses `nodes > 1` with this engine (a CEL rule), and `command`
refuses a group too.

Drain: no preStop hook (the gauges to wait on are not known here); the kubelet's grace period
still covers the drain time.
"""

from __future__ import annotations

from fleetpilot.operator.engine import ConfigFiles, Engine, Role, Worker

CONFIG_DIR = "/etc/fleetpilot/trtllm"
OPTIONS_FILE = "extra-llm-api-options.yaml"


def extra_options(role: Role) -> str:
    """The options file of a disaggregated worker: the KV-cache transceiver on, and for a prefill
    worker no overlap scheduling."""
    lines = ["cache_transceiver_config:", "  backend: DEFAULT"]
    if role == "prefill":
        lines.append("disable_overlap_scheduler: true")  # context-only servers do not overlap
    return "\n".join(lines) + "\n"


class TensorRTLLM(Engine):
    """The `Engine` for `framework: trtllm`."""

    name = "trtllm"
    shared_memory = True

    def command(self, worker: Worker) -> tuple[list[str], list[str]]:
        if worker.group is not None:  # refused by the API (CEL): TensorRT-LLM needs mpirun over SSH
            raise ValueError("trtllm has no multinode flags here")
        args = [worker.model, "--host", "0.0.0.0", "--port", str(worker.port), "--backend", "pytorch",
                "--tp_size", str(worker.tensor), "--pp_size", str(worker.pipeline)]
        if worker.disaggregated:
            args += ["--extra_llm_api_options", f"{CONFIG_DIR}/{OPTIONS_FILE}"]
        return ["trtllm-serve"], args

    def config(self, role: Role) -> ConfigFiles | None:
        if role == "aggregated":
            return None
        return ConfigFiles(name="trtllm", mount_path=CONFIG_DIR, files={OPTIONS_FILE: extra_options(role)})


ENGINE = TensorRTLLM()
