"""`fleetpilot profile`: measure a serving endpoint into a capacity Profile, a file and a ConfigMap.

Where it sits: the entry point above `client` (timed requests) and `sweep` (the grid and the Profile).
It sweeps prefill (TTFT against input length and batch) and decode (ITL and throughput against
concurrency and context length) with a rich progress bar, reads the KV capacity from vLLM's metrics,
and writes the Profile as JSON, as a ConfigMap manifest (`--configmap`), and with `--apply` into the
cluster (server-side apply as `fleetpilot-profiler`), where a DynamoGraph's `spec.planner.profileRef`
names it. `manifests/samples/profile-job.yaml` runs it in-cluster as a Job.

Against the simulator, `--speedup K` says the engine runs K times faster than the GPU it models (its own
`--speedup`): measured durations are multiplied by K, so the profile is in the modelled GPU's time, and
a slow simulator (K < 1) keeps HTTP's own milliseconds small against the times measured.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fleetpilot import yamlio
from fleetpilot.api import contract
from fleetpilot.api import profile as profiles
from fleetpilot.profiler import client as client_mod
from fleetpilot.profiler import sweep


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: write comma-separated whole numbers, e.g. 1,4,16") from error
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be at least 1")
    return values


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("profile", help="measure an OpenAI-compatible endpoint into a capacity profile",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", required=True, help="base URL of the server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="served model name (what requests put in `model`)")
    parser.add_argument("--engine", default="vllm", help="engine the endpoint runs (recorded in the profile)")
    parser.add_argument("--gpu", default="unknown", help="GPU kind of one replica, e.g. h200-sxm (recorded)")
    parser.add_argument("--tensor-parallel", type=int, default=1, help="tensor-parallel size of one replica")
    parser.add_argument("--gpus-per-replica", type=int, default=None, help="GPUs one replica uses (default: TP)")
    parser.add_argument("--isl", type=_ints, default=sweep.DEFAULT_ISLS, help="prompt lengths of the prefill sweep")
    parser.add_argument("--batch", type=_ints, default=sweep.DEFAULT_BATCHES, help="prompts sent at once (1 first)")
    parser.add_argument("--repeats", type=int, default=3, help="requests per prefill point (the median is kept)")
    parser.add_argument("--context", type=_ints, default=sweep.DEFAULT_CONTEXTS, help="context lengths of the decode sweep")
    parser.add_argument("--concurrency", type=_ints, default=sweep.DEFAULT_CONCURRENCIES,
                        help="sequences decoding at once")
    parser.add_argument("--osl", type=int, default=sweep.DEFAULT_OSL, help="least output tokens per decode request")
    parser.add_argument("--kv-capacity-tokens", type=int, default=None,
                        help="KV tokens one replica holds (default: from vLLM's /metrics)")
    parser.add_argument("--metrics-url", default=None,
                        help="base URL of a worker whose vLLM /metrics to read (default: the endpoint's)")
    parser.add_argument("--speedup", type=float, default=1.0,
                        help="the endpoint runs this many times faster than the modelled GPU (a simulator's "
                             "--speedup): durations are multiplied by it")
    parser.add_argument("--out", type=Path, default=Path("profile.json"), help="where to write the Profile (JSON)")
    parser.add_argument("--configmap", default=None, metavar="NAME",
                        help="also write a ConfigMap NAME holding it (key profile.json) next to --out")
    parser.add_argument("--namespace", default=None, help="the ConfigMap's namespace")
    parser.add_argument("--apply", action="store_true",
                        help="server-side apply the ConfigMap to the cluster (kubeconfig, or in-cluster credentials)")
    parser.add_argument("--api-key", default=None, help="bearer token for the endpoint, if it needs one")
    parser.set_defaults(func=run)


def _lone_ttft(samples: list[sweep.PrefillSample], isl: int) -> float:
    """The measured lone TTFT nearest to `isl` prompt tokens (seconds, endpoint time)."""
    lone = [s for s in samples if s.batch == 1]
    nearest = min(lone, key=lambda s: abs(s.isl - isl))
    return min(nearest.ttfts) * max(isl, 1) / nearest.isl if isl > nearest.isl else min(nearest.ttfts)


async def _kv_usage_while(client: client_mod.Client, task: asyncio.Task[Any], period_s: float) -> list[tuple[float, float]]:
    """(seconds since the burst began, vllm:kv_cache_usage_perc) while `task` runs."""
    loop = asyncio.get_running_loop()
    origin = loop.time()
    readings: list[tuple[float, float]] = []
    while not task.done():
        samples = await client.metric("vllm:kv_cache_usage_perc")
        if samples:
            readings.append((loop.time() - origin, sum(v for _, v in samples) / len(samples)))
        await asyncio.wait({task}, timeout=period_s)
    return readings


def _usage_in_window(readings: list[tuple[float, float]], window: sweep.Window, *, prompt_tokens: int,
                     itl_s: float) -> float | None:
    """KV usage at the reading nearest the window's middle, scaled to the window's mean context."""
    inside = [(t, u) for t, u in readings if window.start <= t <= window.end and u > 0]
    if not inside:
        return None
    middle = (window.start + window.end) / 2
    at, usage = min(inside, key=lambda r: abs(r[0] - middle))
    # Tokens held then: the prompt, plus what each stream had generated by the reading.
    held_then = prompt_tokens + max(0.0, at - window.start) / max(itl_s, 1e-9)
    held_mid = prompt_tokens + (middle - window.start) / max(itl_s, 1e-9)
    return usage * held_mid / held_then


async def measure(args: argparse.Namespace, progress: Progress) -> profiles.Profile:
    client = client_mod.Client(args.endpoint, model=args.model, api_key=args.api_key, metrics_url=args.metrics_url)
    gpus = args.gpus_per_replica or args.tensor_parallel
    try:
        await client.calibrate()
        if not await client.probe_length_extensions():
            progress.console.print("the endpoint refuses vLLM's min_tokens/ignore_eos: outputs may end early at an "
                                   "end-of-sequence token (each stream's measured tokens are what count)")
        await client.burst(16, 1, max_tokens=2)  # warm-up: connections, the engine's first step
        kv_tokens = args.kv_capacity_tokens
        if kv_tokens is None:
            info = await client.metric("vllm:cache_config_info")
            kv_tokens = next((t for labels, _ in info if (t := sweep.cache_config_tokens(labels))), None)
        batches = sorted(set(args.batch) | {1})
        prefill_task = progress.add_task("prefill", total=len(args.isl) * len(batches))
        decode_task = progress.add_task("decode", total=len(args.context) * len(args.concurrency))
        prefill: list[sweep.PrefillSample] = []
        for isl in args.isl:
            for batch in batches:
                ttfts = []
                for _ in range(args.repeats):
                    streams, offsets = await client.burst(isl, batch, max_tokens=1)
                    ttfts.append(max(o + s.ttft for s, o in zip(streams, offsets, strict=True)))
                prefill.append(sweep.PrefillSample(isl, batch, tuple(ttfts)))
                progress.advance(prefill_task)
        decode: list[sweep.DecodeSample] = []
        skipped: list[str] = []
        for context in args.context:
            itl_guess = _lone_ttft(prefill, 1) / 2
            for concurrency in args.concurrency:
                progress.advance(decode_task)
                if kv_tokens is not None and concurrency * context > kv_tokens:
                    skipped.append(f"context {context} × {concurrency}: beyond the KV cache ({kv_tokens} tokens)")
                    continue
                sample, itl_guess, why = await _decode_point(client, prefill, context=context, concurrency=concurrency,
                                                              osl=args.osl, itl_guess=itl_guess)
                if sample is None:
                    skipped.append(f"context {context} × {concurrency}: {why}")
                else:
                    decode.append(sample)
        for line in skipped:
            progress.console.print(f"left out: {line}")
        if kv_tokens is None:
            kv_tokens = sweep.kv_capacity(decode)
        if kv_tokens is None:
            raise ValueError("the endpoint reports no KV usage (vllm:cache_config_info, vllm:kv_cache_usage_perc): "
                             "pass --kv-capacity-tokens")
    finally:
        await client.aclose()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    source = (f"measured by fleetpilot profile against {args.endpoint} ({args.model}) at {when}"
              + (f", durations × {args.speedup:g} (endpoint --speedup)" if args.speedup != 1 else ""))
    return sweep.build(model=args.model, engine=args.engine, gpu=args.gpu, tensor_parallel=args.tensor_parallel,
                       gpus_per_replica=gpus, kv_capacity_tokens=kv_tokens, prefill=prefill, decode=decode,
                       speedup=args.speedup, source=source)


async def _decode_point(client: client_mod.Client, prefill: list[sweep.PrefillSample], *, context: int,
                        concurrency: int, osl: int, itl_guess: float,
                        ) -> tuple[sweep.DecodeSample | None, float, str]:
    """One decode burst (retried once with a longer output when its window is too short): the reading,
    the ITL to guess the next point's output length from, and why it was left out."""
    why = ""
    for attempt in range(2):
        tokens = sweep.decode_osl(osl=osl, concurrency=concurrency, lone_ttft_s=_lone_ttft(prefill, context),
                                  itl_guess_s=itl_guess / (2 ** attempt), context=context)
        prompt_tokens = context - tokens // 2
        if prompt_tokens < 1:
            return None, itl_guess, f"an output of {tokens} tokens leaves no prompt"
        burst = asyncio.create_task(client.burst(prompt_tokens, concurrency, max_tokens=tokens))
        readings = await _kv_usage_while(client, burst, period_s=0.25)
        streams, offsets = burst.result()
        window = sweep.decode_window(streams, offsets=offsets)
        if not sweep.enough(window, concurrency) or window is None:
            why = f"the streams decoded together for too few tokens (output {tokens})"
            continue
        itl = sweep.window_itl(streams, window, offsets=offsets)
        usage = _usage_in_window(readings, window, prompt_tokens=prompt_tokens, itl_s=itl)
        return (sweep.DecodeSample(context, concurrency, itl, window.tokens / window.seconds, usage), itl, "")
    return None, itl_guess, why


def config_map(profile: profiles.Profile, *, name: str, namespace: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {contract.LABEL_PART_OF: contract.PART_OF}}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
            "data": {"profile.json": profile.model_dump_json(indent=1)}}


async def _apply(manifest: dict[str, Any]) -> None:
    from fleetpilot import kube  # the cluster client only when asked to write there

    api = kube.KubeApi(field_manager=contract.PROFILER)
    try:
        await api.apply(manifest)
    finally:
        await api.aclose()


def run(args: argparse.Namespace) -> int:
    columns = (TextColumn("{task.description:>8}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns) as progress:
            profile = asyncio.run(measure(args, progress))
    except (client_mod.EndpointError, ValueError) as error:
        print(f"fleetpilot profile: {error}", file=sys.stderr)
        return 1
    args.out.write_text(profile.model_dump_json(indent=1) + "\n")
    print(f"wrote {args.out}: {len(profile.prefill)} prefill points, {len(profile.decode)} decode points, "
          f"KV {profile.kv_capacity_tokens} tokens")
    if args.configmap:
        # In a pod the Job passes its own namespace (the downward API's POD_NAMESPACE).
        namespace = args.namespace or os.environ.get("POD_NAMESPACE") or ("default" if args.apply else None)
        manifest = config_map(profile, name=args.configmap, namespace=namespace)
        path = args.out.with_suffix(".configmap.yaml")
        path.write_text(yamlio.dump(manifest))
        print(f"wrote {path}")
        if args.apply:
            try:
                asyncio.run(_apply(manifest))
            except Exception as error:  # noqa: BLE001 - any failure to write is reported, the file stays
                print(f"fleetpilot profile: could not apply ConfigMap {args.configmap}: {error}", file=sys.stderr)
                return 1
            print(f"applied ConfigMap {args.configmap}")
    return 0
