"""Each engine module on its own (operator/engine_*.py, behind engine.Engine), and the registry that
picks one by `spec.engine.framework`.

test_render.py's golden files pin each engine's complete output inside a graph; these pin what each
module decides for a pod of each role and rank, without rendering a graph: its flags, probes, drain
hook, side channels and files.
"""

from __future__ import annotations

import json
from typing import get_args

import pytest

from fleetpilot.api import v1alpha1 as api
from fleetpilot.operator import engine_sglang, engine_simulator, engine_trtllm, engine_vllm, engines
from fleetpilot.operator.engine import Engine, Group, Role, Worker, health_probes


def worker(role: Role = "aggregated", *, leader: bool = True, nodes: int = 1, drain_seconds: int = 30
           ) -> Worker:
    """A pod of a two-way tensor-parallel component on port 8123; `nodes > 1`: of a group, as rank 0
    (`leader`) or another rank."""
    group = None
    if nodes > 1:
        group = Group(nodes=nodes, rank="0" if leader else "$(RANK)", leader_address="$(LEADER)", port=29500)
    return Worker(model="org/model", served_name="model", role=role, tensor=2, pipeline=1, port=8123,
                  drain_seconds=drain_seconds, leader=leader, group=group)


def flag_value(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


def contains(args: list[str], flags: list[str]) -> bool:
    return any(args[i:i + len(flags)] == flags for i in range(len(args)))


# -- the registry --------------------------------------------------------------------------------------


def test_the_registry_has_one_engine_per_framework_the_api_allows() -> None:
    """Adding a framework to the API without an engine module (or the reverse) fails here."""
    assert list(engines.ENGINES) == list(get_args(api.Framework))
    for name, engine in engines.ENGINES.items():
        assert engine.name == name
        assert engines.lookup(name) is engine


def test_an_unknown_framework_names_the_field_and_the_allowed_values() -> None:
    with pytest.raises(engines.UnknownEngine) as raised:
        engines.lookup("tgi")
    message = str(raised.value)
    assert "spec.engine.framework" in message
    assert "'tgi'" in message
    assert "allowed values: vllm, sglang, trtllm, simulator" in message


@pytest.mark.parametrize("engine", list(engines.ENGINES.values()), ids=list(engines.ENGINES))
def test_every_engine_serves_on_the_port_it_is_given(engine: Engine) -> None:
    """Ports, like every other name the pod is wired with, come from render.py through `Worker`."""
    _, args = engine.command(worker())
    assert flag_value(args, "--port") == "8123"
    assert flag_value(args, "--host") == "0.0.0.0"


# -- vLLM ----------------------------------------------------------------------------------------------


def test_vllm_serves_the_model_with_its_parallelism() -> None:
    command, args = engine_vllm.ENGINE.command(worker())
    assert command == ["vllm"]
    assert args[:2] == ["serve", "org/model"]
    assert flag_value(args, "--served-model-name") == "model"
    assert flag_value(args, "--tensor-parallel-size") == "2"
    assert flag_value(args, "--pipeline-parallel-size") == "1"
    assert "--kv-transfer-config" not in args


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_vllm_disaggregated_runs_nixl_on_both_sides_with_its_side_channel(role: Role) -> None:
    engine, pod = engine_vllm.ENGINE, worker(role)
    config = json.loads(flag_value(engine.command(pod)[1], "--kv-transfer-config"))
    assert config == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert engine.env(pod) == [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "$(POD_IP)"},
                               {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "5600"}]
    assert engine.ports(pod) == [{"name": "nixl", "containerPort": 5600, "protocol": "TCP"}]
    assert engine.env(worker()) == engine.ports(worker()) == []


def test_vllm_ranks_after_the_leader_are_headless_and_unprobed() -> None:
    engine = engine_vllm.ENGINE
    leader, rank = worker(nodes=2), worker(nodes=2, leader=False)
    flags = ["--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank"]
    rendezvous = ["--master-addr", "$(LEADER)", "--master-port", "29500"]
    assert contains(engine.command(leader)[1], [*flags, "0", *rendezvous])
    assert engine.command(leader)[1][-1] != "--headless"
    assert contains(engine.command(rank)[1], [*flags, "$(RANK)"])
    assert engine.command(rank)[1][-1] == "--headless"
    assert engine.probes(leader) == health_probes()
    assert engine.probes(rank) is None


def test_vllm_drains_on_its_request_gauges_for_the_drain_time() -> None:
    hook = engine_vllm.ENGINE.drain_hook(worker(drain_seconds=45))
    assert hook is not None
    command = hook["exec"]["command"]
    assert command[:2] == ["python3", "-c"]
    assert command[3:] == ["8123", "45", "vllm:num_requests_running", "vllm:num_requests_waiting"]
    assert engine_vllm.ENGINE.drain_hook(worker(drain_seconds=0)) is None  # nothing to wait for
    assert engine_vllm.ENGINE.shared_memory and engine_vllm.ENGINE.config("decode") is None


# -- SGLang --------------------------------------------------------------------------------------------


def test_sglang_prefill_runs_the_bootstrap_server_on_its_leader_only() -> None:
    engine = engine_sglang.ENGINE
    command, args = engine.command(worker("prefill"))
    assert command == ["python3"] and args[:2] == ["-m", "sglang.launch_server"]
    assert flag_value(args, "--disaggregation-mode") == "prefill"
    assert flag_value(args, "--disaggregation-transfer-backend") == "nixl"
    assert flag_value(args, "--disaggregation-bootstrap-port") == str(engine_sglang.BOOTSTRAP_PORT)
    bootstrap = {"name": "bootstrap", "containerPort": engine_sglang.BOOTSTRAP_PORT, "protocol": "TCP"}
    assert engine.ports(worker("prefill")) == [bootstrap]
    assert engine.ports(worker("prefill", nodes=2, leader=False)) == []
    assert engine.ports(worker("decode")) == engine.ports(worker()) == []


def test_sglang_decode_and_aggregated_flags() -> None:
    decode = engine_sglang.ENGINE.command(worker("decode"))[1]
    assert flag_value(decode, "--disaggregation-mode") == "decode"
    assert "--disaggregation-bootstrap-port" not in decode
    aggregated = engine_sglang.ENGINE.command(worker())[1]
    assert not any(arg.startswith("--disaggregation") for arg in aggregated)
    assert flag_value(aggregated, "--tp-size") == "2" and flag_value(aggregated, "--pp-size") == "1"


def test_sglang_groups_meet_at_the_leaders_address() -> None:
    engine = engine_sglang.ENGINE
    args = engine.command(worker(nodes=3, leader=False))[1]
    assert contains(args, ["--nnodes", "3", "--node-rank", "$(RANK)", "--dist-init-addr", "$(LEADER):29500"])
    assert engine.probes(worker(nodes=3, leader=False)) is None
    hook = engine.drain_hook(worker())
    assert hook is not None
    assert hook["exec"]["command"][5:] == ["sglang:num_running_reqs", "sglang:num_queue_reqs"]


# -- TensorRT-LLM --------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_trtllm_disaggregated_reads_its_options_from_the_files_it_ships(role: Role) -> None:
    engine = engine_trtllm.ENGINE
    command, args = engine.command(worker(role))
    assert command == ["trtllm-serve"] and args[0] == "org/model"
    assert flag_value(args, "--backend") == "pytorch"
    config = engine.config(role)
    assert config is not None
    (file_name,) = config.files
    assert flag_value(args, "--extra_llm_api_options") == f"{config.mount_path}/{file_name}"
    assert "cache_transceiver_config:" in config.files[file_name]
    assert ("disable_overlap_scheduler: true" in config.files[file_name]) == (role == "prefill")


def test_trtllm_aggregated_needs_no_files_and_groups_are_refused() -> None:
    engine = engine_trtllm.ENGINE
    assert engine.config("aggregated") is None
    assert "--extra_llm_api_options" not in engine.command(worker())[1]
    assert flag_value(engine.command(worker())[1], "--tp_size") == "2"
    with pytest.raises(ValueError, match="multinode"):
        engine.command(worker(nodes=2))
    assert engine.drain_hook(worker()) is None  # its gauges are not known: the grace period only
    assert engine.probes(worker()) == health_probes()


# -- the simulator -------------------------------------------------------------------------------------


def test_the_simulator_drains_on_sigterm_for_the_drain_time() -> None:
    engine = engine_simulator.ENGINE
    command, args = engine.command(worker("decode", drain_seconds=45))
    assert command == ["fleetpilot"] and args[:2] == ["sim", "worker"]
    assert flag_value(args, "--role") == "decode"
    assert flag_value(args, "--model") == "model"  # the served name: it loads no weights
    assert flag_value(args, "--shutdown-timeout") == "45"
    assert engine.drain_hook(worker(drain_seconds=45)) is None
    assert not engine.shared_memory
    assert engine.env(worker("decode")) == engine.ports(worker("decode")) == []
    assert engine.config("decode") is None


def test_every_simulator_rank_joins_the_rendezvous_and_answers_probes() -> None:
    engine = engine_simulator.ENGINE
    rank = worker(nodes=2, leader=False)
    assert contains(engine.command(rank)[1], ["--nnodes", "2", "--node-rank", "$(RANK)",
                                              "--master-addr", "$(LEADER)", "--master-port", "29500"])
    assert engine.probes(rank) == health_probes()
