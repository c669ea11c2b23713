"""Frontend overhead benchmark: what the router adds to each request and token, against going direct.

One simulator worker (aggregated, `--speedup` so high that its compute takes microseconds: what is
left is HTTP, JSON and the event loop) serves streaming completions, once through `fleetpilot
frontend` and once directly, in the same run and from the same client: C concurrent streams (64, 256,
512 by default), each asking for `--tokens` tokens, for `--seconds` per setting. Reported per setting
and path: requests/s completed, p50/p99 of the time to first token and of the whole request, p50 of
the gap between tokens; and what the frontend added (through − direct). Requests/s through the
frontend at the highest concurrency is its saturation rate here: the client, the worker and the
frontend share the machine's cores, so on 2 cores it is a lower bound of what one frontend core does.

Run: `~/.cache/fleetpilot/venv/bin/python benchmarks/frontend_bench.py [--concurrency 64,256,512]`
(about 2 minutes). Writes benchmarks/results/frontend.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
FLEETPILOT = str(Path(sys.executable).parent / "fleetpilot")
MODEL = "bench"
BASELINE = "frontend asyncio+h11"  # the frontend on uvicorn's pure-Python loop and parser: before uvloop/httptools


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """One process on a loopback port (`command` and then --host/--port), killed by its PID when done."""

    def __init__(self, command: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.popen = subprocess.Popen([*command, "--host", "127.0.0.1", "--port", str(self.port)],
                                      stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise SystemExit(f"a server exited at start: see {log}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise SystemExit(f"a server did not answer /health within 60 s: see {log}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)


@dataclasses.dataclass
class Sample:
    ttft: list[float] = dataclasses.field(default_factory=list)
    total: list[float] = dataclasses.field(default_factory=list)
    gaps: list[float] = dataclasses.field(default_factory=list)
    failed: int = 0


async def drive(url: str, *, concurrency: int, tokens: int, seconds: float) -> tuple[Sample, float]:
    """`concurrency` clients streaming back to back for `seconds`; returns the samples and requests/s."""
    sample = Sample()
    body = {"model": MODEL, "prompt": "w " * 128, "max_tokens": tokens, "stream": True, "ignore_eos": True}
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        stop_at = time.monotonic() + seconds
        done = 0

        async def one_client() -> None:
            nonlocal done
            while time.monotonic() < stop_at:
                started = time.monotonic()
                first = last = None
                try:
                    async with client.stream("POST", url + "/v1/completions", json=body) as response:
                        if response.status_code != 200:
                            sample.failed += 1
                            continue
                        async for line in response.aiter_lines():
                            if not line.startswith("data:") or line.endswith("[DONE]"):
                                continue
                            now = time.monotonic()
                            if first is None:
                                first = now
                            elif last is not None:
                                sample.gaps.append(now - last)
                            last = now
                except httpx.HTTPError:
                    sample.failed += 1
                    continue
                if first is not None:
                    sample.ttft.append(first - started)
                    sample.total.append(time.monotonic() - started)
                    done += 1

        began = time.monotonic()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        return sample, done / (time.monotonic() - began)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="64,256,512")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "frontend.md")
    args = parser.parse_args()
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / "fleetpilot-frontend-bench"
    logs.mkdir(parents=True, exist_ok=True)
    worker = Server([FLEETPILOT, "sim", "worker", "--model", MODEL, "--speedup", "100000", "--max-num-seqs", "1024"],
                    logs / "worker.log")
    route = [FLEETPILOT, "frontend", "--model", MODEL, "--mode", "aggregated", "--router", "least-loaded", "--worker-url", worker.url]
    frontend = Server(route, logs / "frontend.log")  # uvloop and httptools, as deployed
    baseline = Server([*route, "--loop", "asyncio", "--http", "h11"], logs / "frontend-asyncio.log")
    rows = []
    try:
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            measured = {}
            for path, url in (("direct", worker.url), ("frontend", frontend.url), (BASELINE, baseline.url)):
                asyncio.run(drive(url, concurrency=concurrency, tokens=args.tokens, seconds=2.0))  # warm-up
                measured[path] = asyncio.run(drive(url, concurrency=concurrency, tokens=args.tokens,
                                                   seconds=args.seconds))
                sample, rate = measured[path]
                print(f"c={concurrency:4d} {path:8}: {rate:7.1f} req/s, ttft p50 {percentile(sample.ttft, 50) * 1e3:6.1f}"
                      f" ms, request p50 {percentile(sample.total, 50) * 1e3:6.1f} ms, failed {sample.failed}",
                      flush=True)
            rows.append((concurrency, measured))
    finally:
        frontend.stop()
        baseline.stop()
        worker.stop()

    lines = ["# Frontend overhead", "",
             (f"Generated by `benchmarks/frontend_bench.py` on the 2-core development machine: one simulator "
             f"worker at `--speedup 100000` (compute ≈ 0), streaming completions of {args.tokens} tokens, "
             f"{args.seconds:g} s per setting, the same client directly, through the frontend as deployed "
             f"(uvloop, httptools) and through the frontend on asyncio and h11 (`{BASELINE}`, the baseline). "
             "Client, frontend and worker share the two cores, and the Python client alone keeps one of them "
             "busy (about 90% CPU): the figures bound the frontend's cost from above, and the settings "
             "differ by more from run to run than uvloop changes them."), "",
             ("| streams | path | req/s | TTFT p50 ms | TTFT p99 ms | request p50 ms | request p99 ms | "
             "token gap p50 ms | failed |"),
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    added = ["", ("| streams | through | added TTFT p50 ms | added request p50 ms | added request p99 ms | "
                 "added per token p50 ms | throughput through ÷ direct |"), "|---:|---|---:|---:|---:|---:|---:|"]
    for concurrency, measured in rows:
        for path, (sample, rate) in measured.items():
            lines.append(f"| {concurrency} | {path} | {rate:.1f} | {percentile(sample.ttft, 50) * 1e3:.1f} | "
                         f"{percentile(sample.ttft, 99) * 1e3:.1f} | {percentile(sample.total, 50) * 1e3:.1f} | "
                         f"{percentile(sample.total, 99) * 1e3:.1f} | {percentile(sample.gaps, 50) * 1e3:.2f} | "
                         f"{sample.failed} |")
        direct, direct_rate = measured["direct"]
        for path in ("frontend", BASELINE):
            through, through_rate = measured[path]
            added.append(
                f"| {concurrency} | {path} | {(percentile(through.ttft, 50) - percentile(direct.ttft, 50)) * 1e3:.1f} | "
                f"{(percentile(through.total, 50) - percentile(direct.total, 50)) * 1e3:.1f} | "
                f"{(percentile(through.total, 99) - percentile(direct.total, 99)) * 1e3:.1f} | "
                f"{(percentile(through.gaps, 50) - percentile(direct.gaps, 50)) * 1e3:.2f} | "
                f"{through_rate / direct_rate:.2f} |")
    args.out.write_text("\n".join(lines + added) + "\n")
    print("\n".join(lines + added))
    return 0


if __name__ == "__main__":
    sys.exit(main())
