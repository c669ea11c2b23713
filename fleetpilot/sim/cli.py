"""`fleetpilot sim worker`: one simulated vLLM worker, as the operator renders it for simulator pods.

Where it sits: the entry point above `server` and `engine`. It turns flags into the performance model
(`fleetpilot.perfmodel`, from a model preset, a GPU and the parallelism), the scheduler's limits and
the server's identity, then runs uvicorn (for a multinode replica's ranks > 0, only the rendezvous
with the leader: `run_rank`). On SIGTERM it drains (`server.DrainingServer`): it serves
on until nothing runs, waits or holds KV for a decode worker, for up to `--shutdown-timeout` seconds,
then stops accepting connections and lets what is still open finish.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import uuid
from typing import Any

import uvicorn

from fleetpilot.sim import engine, group, server
from fleetpilot.sim import scheduler as scheduler_mod

logger = logging.getLogger("fleetpilot.sim")

_WILDCARDS = ("", "0.0.0.0", "::")


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("sim", help="the GPU-free simulator engine (vLLM's API, protocol and metrics)")
    actions = parser.add_subparsers(dest="sim_command", required=True)
    worker = actions.add_parser("worker", help="serve one simulated prefill, decode or aggregated worker")
    worker.add_argument("--role", choices=server.ROLES, default="aggregated")
    worker.add_argument("--model", required=True, help="served model name (what clients put in `model`)")
    worker.add_argument("--host", default="0.0.0.0")
    worker.add_argument("--port", type=int, default=8000)
    worker.add_argument("--tensor-parallel-size", type=int, default=1)
    worker.add_argument("--pipeline-parallel-size", type=int, default=1)
    worker.add_argument("--model-preset", default="llama-3.1-8b", help="performance-model preset")
    worker.add_argument("--gpu", default="h200-sxm", help="performance-model GPU")
    worker.add_argument("--speedup", type=float, default=1.0, help="simulated seconds per wall-clock second")
    worker.add_argument("--max-num-seqs", type=int, default=scheduler_mod.SchedulerConfig.max_num_seqs)
    worker.add_argument("--max-num-batched-tokens", type=int, default=8192)
    worker.add_argument("--block-size", type=int, default=16)
    worker.add_argument("--kv-capacity-tokens", type=int, default=None,
                        help="default: the performance model's")
    worker.add_argument("--max-model-len", type=int, default=131_072)
    worker.add_argument("--kv-transfer-bandwidth", type=float, default=50e9, help="P→D bytes/s per rank")
    worker.add_argument("--kv-hold-timeout", type=float, default=30.0,
                        help="seconds a prefill worker keeps KV that no decode worker pulled")
    worker.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="automatic prefix caching, as vLLM's (on by default; --no-enable-prefix-caching)")
    worker.add_argument("--tokens-per-word", type=float, default=1.0,
                        help="prompt tokens per whitespace-separated word")
    worker.add_argument("--engine-id", default=None, help="default: a random UUID")
    worker.add_argument("--advertise-host", default=None,
                        help="host peers use to reach this worker"
                             " (default: $POD_IP, else --host, else this host's address)")
    worker.add_argument("--shutdown-timeout", type=int, default=30,
                        help="seconds to drain on SIGTERM: requests in flight finish and held KV is pulled")
    # A multinode replica (vLLM's own flag names): the leader (rank 0) serves once every rank has
    # joined its TCP rendezvous on --master-port; the other ranks join it and serve only /health.
    worker.add_argument("--nnodes", type=int, default=1, help="pods in this replica's group")
    worker.add_argument("--node-rank", type=int, default=0, help="this pod's rank in its group (0: the leader)")
    worker.add_argument("--master-addr", default=None, help="the leader's address (ranks > 0 connect to it)")
    worker.add_argument("--master-port", type=int, default=29500, help="the leader's rendezvous port")
    worker.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    worker.set_defaults(func=cli)


def timing_model(
    preset: str, gpu: str, *, tensor_parallel: int, pipeline_parallel: int, nodes: int = 1
) -> scheduler_mod.TimingModel:
    from fleetpilot import perfmodel  # the model's constants are only needed by workers

    if preset not in perfmodel.MODELS:
        choices = ", ".join(sorted(perfmodel.MODELS))
        raise ValueError(f"unknown --model-preset {preset!r}; choose from {choices}")
    if gpu not in perfmodel.GPUS:
        raise ValueError(f"unknown --gpu {gpu!r}; choose from {', '.join(sorted(perfmodel.GPUS))}")
    return perfmodel.PerformanceModel(
        perfmodel.MODELS[preset], perfmodel.GPUS[gpu],
        tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel, nodes=nodes,
    )


def advertise_host(flag: str | None, bind_host: str) -> str:
    """The address a decode worker dials back: the pod IP in Kubernetes, a concrete bind host otherwise."""
    if flag:
        return flag
    if os.environ.get("POD_IP"):
        return os.environ["POD_IP"]
    if bind_host not in _WILDCARDS:
        return bind_host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _group_problem(args: argparse.Namespace) -> str | None:
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        return f"--node-rank must lie from 0 to --nnodes − 1 ({args.nnodes - 1}), got {args.node_rank}"
    if args.node_rank > 0 and not args.master_addr:
        return "a rank > 0 needs --master-addr, the group leader's address"
    return None


def run_rank(args: argparse.Namespace) -> int:
    """A multinode replica's rank > 0: join the leader, hold on, exit 1 when the group is over."""
    member = group.GroupMember(group.Identity(args.nnodes, args.model), rank=args.node_rank,
                               leader_host=args.master_addr, leader_port=args.master_port)
    try:
        sock = server.bind_socket(args.host, args.port)
    except OSError as error:
        print(f"fleetpilot sim worker: cannot bind {args.host}:{args.port}: {error}", file=sys.stderr)
        return 1
    over: list[str] = []
    rank_server: uvicorn.Server | None = None

    def end(reason: str) -> None:
        over.append(reason)
        logger.error("rank %d: %s; exiting so the group restarts", args.node_rank, reason)
        if rank_server is not None:
            rank_server.should_exit = True

    app = server.create_rank_app(member, on_over=end)
    rank_server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, lifespan="on"))
    logger.info("rank %d of %d of %s: joining the leader at %s:%d", args.node_rank, args.nnodes, args.model,
                args.master_addr, args.master_port)
    rank_server.run(sockets=[sock])
    return 1 if over else 0


def cli(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    problem = _group_problem(args)
    if problem is not None:
        print(f"fleetpilot sim worker: {problem}", file=sys.stderr)
        return 2
    if args.node_rank > 0:
        return run_rank(args)
    try:
        timing = timing_model(args.model_preset, args.gpu, tensor_parallel=args.tensor_parallel_size,
                              pipeline_parallel=args.pipeline_parallel_size, nodes=args.nnodes)
        scheduler = scheduler_mod.Scheduler(timing, scheduler_mod.SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            block_size=args.block_size,
            kv_capacity_tokens=args.kv_capacity_tokens,
            max_model_len=args.max_model_len,
            kv_bandwidth_bytes_per_s=args.kv_transfer_bandwidth,
            kv_hold_timeout_s=args.kv_hold_timeout,
            enable_prefix_caching=args.enable_prefix_caching,
        ))
        sim = engine.Engine(scheduler, speedup=args.speedup)
        if scheduler.kv.total < 1:
            raise ValueError("the KV cache holds no block: the model does not fit this GPU and parallelism")
    except ValueError as error:
        print(f"fleetpilot sim worker: {error}", file=sys.stderr)
        return 2
    try:
        sock = server.bind_socket(args.host, args.port)
    except OSError as error:
        print(f"fleetpilot sim worker: cannot bind {args.host}:{args.port}: {error}", file=sys.stderr)
        return 1
    config = server.ServerConfig(
        served_model=args.model,
        role=args.role,
        engine_id=args.engine_id or str(uuid.uuid4()),
        advertise_host=advertise_host(args.advertise_host, args.host),
        advertise_port=sock.getsockname()[1],
        tensor_parallel_size=args.tensor_parallel_size,
        tokens_per_word=args.tokens_per_word,
    )
    logger.info(
        "simulated %s worker for %s (%s on %s, TP %d, PP %d): KV %d tokens, prefix caching %s, speedup %g,"
        " advertised as %s:%d",
        args.role, args.model, args.model_preset, args.gpu, args.tensor_parallel_size,
        args.pipeline_parallel_size, scheduler.kv.total * args.block_size,
        "on" if args.enable_prefix_caching else "off", args.speedup,
        config.advertise_host, config.advertise_port,
    )
    leader = None
    if args.nnodes > 1:
        leader = server.leader_group(group.Identity(args.nnodes, args.model), sim, host=args.host,
                                     port=args.master_port)
    app = server.create_app(config, sim, group=leader)
    uvicorn_config = uvicorn.Config(app, log_level=args.log_level, lifespan="on",
                                    timeout_graceful_shutdown=args.shutdown_timeout)
    server.DrainingServer(uvicorn_config, sim, drain_s=args.shutdown_timeout).run(sockets=[sock])
    return 0
