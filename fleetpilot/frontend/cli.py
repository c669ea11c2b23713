"""`fleetpilot frontend`: serve the router with uvicorn, and drain on SIGTERM.

On SIGTERM the frontend reports itself unhealthy (so a load balancer stops sending), stops
accepting connections, and lets in-flight streams finish within `--drain-seconds`. With
`--api-key-secret` (a watched Secret in `--namespace`) or `--api-key-file` it requires an API key
(`auth.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import time
from pathlib import Path
from typing import Any

import uvicorn

from fleetpilot import kube
from fleetpilot.frontend import app as app_mod
from fleetpilot.frontend import auth, discovery, routing


def _stamping_protocol() -> type[asyncio.Protocol] | None:
    """uvicorn's httptools protocol with each request's scope stamped (`app.ARRIVED`) the moment its first
    bytes are parsed, before uvicorn reads the rest of the head and starts the app's task (None without
    httptools). The app's own stamp (`app.StampArrival`) would start the clock only once that task first
    runs, which, with many streams in flight, is after a wait on the event loop the client's clock counts."""
    if importlib.util.find_spec("httptools") is None:
        return None
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class ArrivalStampingProtocol(HttpToolsProtocol):
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope[app_mod.ARRIVED] = time.monotonic()  # type: ignore[literal-required]

    return ArrivalStampingProtocol


def http_protocol(choice: str) -> type[asyncio.Protocol] | str:
    """What uvicorn parses HTTP with for `--http`: the stamping httptools protocol for auto and
    httptools where httptools is installed, else uvicorn's own choice (the app stamps arrivals then)."""
    stamping = _stamping_protocol() if choice in ("auto", "httptools") else None
    return stamping or choice


class DrainingServer(uvicorn.Server):
    """uvicorn's graceful shutdown, with the frontend told first so /health turns 503."""

    def __init__(self, config: uvicorn.Config, frontend: app_mod.Frontend) -> None:
        super().__init__(config)
        self.frontend = frontend

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.frontend.draining = True
        super().handle_exit(sig, frame)


def build(args: argparse.Namespace) -> app_mod.Frontend:
    apis: list[kube.KubeApi] = []  # one Kubernetes client for pod discovery and the key Secret, made when needed

    def api() -> kube.KubeApi:
        if not apis:
            apis.append(kube.KubeApi())
        return apis[0]

    static = {"prefill": args.prefill_url, "decode": args.decode_url, "aggregated": args.worker_url}
    found: discovery.Discovery
    if any(static.values()):
        found = discovery.StaticDiscovery(static)
    else:
        if not (args.graph and args.namespace):
            raise SystemExit("fleetpilot frontend: give --graph and --namespace (pod discovery) or worker URLs")
        found = discovery.PodDiscovery(api(), namespace=args.namespace, graph=args.graph)
    if args.api_key_secret and args.api_key_file:
        raise SystemExit("fleetpilot frontend: give --api-key-secret or --api-key-file, not both")
    keys: auth.Keys | None = None
    if args.api_key_secret:
        if not args.namespace:
            raise SystemExit("fleetpilot frontend: --api-key-secret needs --namespace (the Secret's)")
        keys = auth.SecretKeys(api(), namespace=args.namespace, name=args.api_key_secret)
    elif args.api_key_file:
        keys = auth.FileKeys(Path(args.api_key_file))
    if args.max_in_flight_per_key is not None and keys is None:
        raise SystemExit("fleetpilot frontend: --max-in-flight-per-key needs --api-key-secret or --api-key-file")
    if args.mode == "disaggregated" and args.engine not in ("vllm", "simulator"):
        raise SystemExit(f"fleetpilot frontend: disaggregated routing for {args.engine} is not implemented yet;"
                         " only vLLM's kv_transfer_params protocol (vllm, simulator) is")
    return app_mod.Frontend(model=args.model, mode=args.mode, discovery=found, policy=routing.make_policy(args.router),
                            retries=args.retries, max_model_len=args.max_model_len, hold_seconds=args.hold_seconds,
                            hold_queue=args.hold_queue, api_keys=keys,
                            max_in_flight_per_key=args.max_in_flight_per_key)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every upstream call at INFO: two lines per request, on the hot path, with worker addresses.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    frontend = build(args)
    config = uvicorn.Config(frontend.app(), host=args.host, port=args.port, log_level="warning",
                            timeout_graceful_shutdown=args.drain_seconds, backlog=4096, http=http_protocol(args.http),
                            loop=args.loop)
    DrainingServer(config, frontend).run()
    return 0


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("frontend", help="the OpenAI-compatible router in front of a graph's workers")
    parser.add_argument("--model", required=True, help="served model name")
    parser.add_argument("--mode", choices=["disaggregated", "aggregated"], default="disaggregated")
    parser.add_argument("--engine", choices=["vllm", "sglang", "trtllm", "simulator"], default="simulator")
    parser.add_argument("--router", choices=["round-robin", "least-loaded", "prefix-aware"], default="prefix-aware")
    parser.add_argument("--graph", help="discover the graph's pods (with --namespace)")
    parser.add_argument("--namespace")
    parser.add_argument("--prefill-url", action="append", default=[], help="static prefill worker (repeatable)")
    parser.add_argument("--decode-url", action="append", default=[], help="static decode worker (repeatable)")
    parser.add_argument("--worker-url", action="append", default=[], help="static aggregated worker (repeatable)")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--retries", type=int, default=3, help="workers tried when a connection is refused")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="the model's context window in tokens: max_tokens at or above it is refused before "
                             "any worker sees the request; without it the window is learned from the first prefill "
                             "worker's /tokenize answer, which also counts prompts that may not fit")
    parser.add_argument("--http", choices=("auto", "httptools", "h11"), default="auto",
                        help="uvicorn's HTTP parser (auto: httptools when installed)")
    parser.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                        help="uvicorn's event loop (auto: uvloop when installed)")
    parser.add_argument("--drain-seconds", type=int, default=120, help="how long in-flight streams may finish")
    parser.add_argument("--hold-seconds", type=float, default=0.0,
                        help="how long a request waits for a worker when none is ready (a pool scaled to zero, "
                             "starting); 0: 503 with Retry-After at once")
    parser.add_argument("--hold-queue", type=int, default=256,
                        help="most requests held at once; one more gets 503 with Retry-After at once")
    parser.add_argument("--api-key-secret", metavar="NAME",
                        help="require an API key (Authorization: Bearer): every data value of this Secret in "
                             "--namespace is one, watched so that a rotation takes effect without a restart; "
                             "until it is read, and while it is missing or empty, every request is refused (401)")
    parser.add_argument("--api-key-file", metavar="PATH",
                        help="require an API key from this file, one per line (# comments), re-read when it "
                             "changes: for a frontend outside Kubernetes")
    parser.add_argument("--max-in-flight-per-key", type=positive_int, default=None, metavar="N",
                        help="most requests in flight per API key; one more gets 429 with Retry-After")
    parser.set_defaults(func=run)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value
