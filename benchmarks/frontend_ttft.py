"""Frontend TTFT agreement: the frontend's TTFT histogram against the TTFT its clients measure.

Simulator workers in real time (`--speedup 1`: prompts take their profiled prefill time, tokens their
ITL) behind `fleetpilot frontend`, each a subprocess on a 127.0.0.1 port. Streaming chat completions
go out from two clients, at each concurrency (1 and 8 by default: that many clients, each sending its
share back to back on one kept-alive connection):

- `openai`: the `openai` SDK, timed from the moment its HTTP client (httpx2) sends the request (the
  client's `request` event hook) to the SDK yielding the first chunk with content, and to the stream's
  end: what an application using the SDK sees.
- `socket`: a bare HTTP/1.1 client on asyncio streams, timed from writing the request to reading the
  bytes of the first chunk with content, and to the stream's last chunk: the wire.

The frontend's `/metrics` is scraped before and after each batch; the histogram's mean over a row is
its sum's growth over its count's, for TTFT and for the request duration. Reported: each mean, and
histogram ÷ client (1.000 is perfect agreement; the goal is within 3%).

Three frontends serve the same workers, taking turns in rounds so that the machine's load, which
drifts, falls on each alike: `arrival` as shipped (the clock starts when uvicorn's protocol has parsed
the request's first bytes, `cli.ArrivalStampingProtocol`); `app entry` (the same code served by
uvicorn's plain protocol, so `app.StampArrival` starts the clock when the app first runs for the
request, after the head is parsed and the app's task has had its first turn on the event loop);
`handler` (neither stamps, so the request handler starts the clock when it runs).

Run: `~/.cache/fleetpilot/venv/bin/python benchmarks/frontend_ttft.py [--requests 96] [--concurrency 1,8]
[--modes aggregated,disaggregated]` (about 10 minutes on 2 busy cores). Writes benchmarks/results/frontend_ttft.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import httpx2
import openai
from frontend_bench import Server  # run as a script: benchmarks/ is on the path
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
FLEETPILOT = str(Path(sys.executable).parent / "fleetpilot")
MODEL = "bench"
TTFT = "fleetpilot_frontend_time_to_first_token_seconds"
DURATION = "fleetpilot_frontend_request_duration_seconds"
REQUEST_TIMEOUT_S = 60.0
CLIENTS = ("openai", "socket")
# The frontend's own command line, run by `python -c` after one of these patches.
_LAUNCH = "import sys, time\nfrom fleetpilot import cli\nfrom fleetpilot.frontend import app\n{patch}" \
          "sys.exit(cli.main(sys.argv[1:]))\n"
PATCHES = {
    "arrival": "",
    # The server's protocol stamps nothing: StampArrival stamps when the app first runs for the request.
    "app entry": ("from fleetpilot.frontend import cli as frontend_cli\n"
                  "frontend_cli.http_protocol = lambda choice: choice\n"),
    # Neither stamps: Frontend.handle starts the clock itself.
    "handler": ("from fleetpilot.frontend import cli as frontend_cli\n"
                "frontend_cli.http_protocol = lambda choice: choice\n"
                "async def passthrough(self, scope, receive, send):\n"
                "    await self.app(scope, receive, send)\n"
                "app.StampArrival.__call__ = passthrough\n"),
}


@dataclasses.dataclass
class Row:
    """One row of the table: what the client timed, and what the frontend's histograms grew by, over its batches."""

    ttft_s: list[float] = dataclasses.field(default_factory=list)
    duration_s: list[float] = dataclasses.field(default_factory=list)
    failed: int = 0
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    duration_sum: float = 0.0
    duration_count: float = 0.0

    def histogram_ms(self, metric: str) -> float:
        total, count = ((self.ttft_sum, self.ttft_count) if metric == TTFT
                        else (self.duration_sum, self.duration_count))
        return total / count * 1e3 if count else float("nan")


def histograms(text: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of the TTFT and duration histograms in a /metrics page."""
    found = {TTFT: [0.0, 0.0], DURATION: [0.0, 0.0]}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for name, pair in found.items():
                if sample.labels.get("model") != MODEL:
                    continue
                if sample.name == name + "_sum":
                    pair[0] = sample.value
                elif sample.name == name + "_count":
                    pair[1] = sample.value
    return {name: (pair[0], pair[1]) for name, pair in found.items()}


Timed = tuple[float, float] | None  # (TTFT, duration) of one request, None when it failed
Client = Callable[[int], Awaitable[list[Timed]]]  # sends `count` requests back to back


def openai_client(url: str, prompt: str, max_tokens: int) -> Client:
    async def run(count: int) -> list[Timed]:
        sent: dict[str, float] = {}

        async def stamp(request: httpx2.Request) -> None:  # as the SDK's HTTP client sends the request
            sent[request.headers["x-bench-id"]] = time.monotonic()

        timed: list[Timed] = []
        async with httpx2.AsyncClient(timeout=REQUEST_TIMEOUT_S, event_hooks={"request": [stamp]}) as http:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, http_client=http)
            for _ in range(count):
                bench_id = uuid.uuid4().hex
                first = None
                try:
                    stream = await client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                        stream=True, extra_headers={"x-bench-id": bench_id})
                    async for chunk in stream:
                        if first is None and chunk.choices and chunk.choices[0].delta.content:
                            first = time.monotonic()
                except openai.OpenAIError:
                    timed.append(None)
                    continue
                done = time.monotonic()
                timed.append(None if first is None else (first - sent[bench_id], done - sent[bench_id]))
        return timed

    return run


def has_content(event: bytes) -> bool:
    """Whether one SSE event is a chunk carrying text."""
    for line in event.split(b"\n"):
        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
            chunk = json.loads(line[5:])
            if any((choice.get("delta") or {}).get("content") for choice in chunk.get("choices") or []):
                return True
    return False


def socket_client(port: int, prompt: str, max_tokens: int) -> Client:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "stream": True}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Timed:
        sent = time.monotonic()
        writer.write(request)
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        if not head.startswith("http/1.1 200") or "transfer-encoding: chunked" not in head:
            raise ConnectionError(f"unexpected answer: {head.splitlines()[0]}")
        first, pending = None, b""
        while True:  # chunked transfer coding: a hex size line, the bytes, CRLF; size 0 ends it
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            now = time.monotonic()
            if size == 0:
                return None if first is None else (first - sent, now - sent)
            if first is None:
                pending += data[:-2]
                *events, pending = pending.split(b"\n\n")
                if any(has_content(event) for event in events):
                    first = now

    async def run(count: int) -> list[Timed]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        timed: list[Timed] = []
        try:
            for index in range(count):
                try:
                    async with asyncio.timeout(REQUEST_TIMEOUT_S):
                        timed.append(await one(reader, writer))
                except (OSError, ValueError, asyncio.IncompleteReadError, TimeoutError):
                    timed.extend([None] * (count - index))  # the connection's state is unknown: give up on it
                    break
        finally:
            writer.close()
        return timed

    return run


async def batch(url: str, client: Client, *, requests: int, concurrency: int, row: Row | None) -> None:
    """`requests` requests from `concurrency` clients; their timings and the histograms' growth go to `row`."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as scraper:
        before = histograms((await scraper.get("/metrics")).text)
        shares = [requests // concurrency + (i < requests % concurrency) for i in range(concurrency)]
        timed = [t for share in await asyncio.gather(*(client(n) for n in shares if n)) for t in share]
        done = [t for t in timed if t is not None]
        # The frontend observes a request as its stream ends: wait until it has counted them all.
        for _ in range(50):
            after = histograms((await scraper.get("/metrics")).text)
            if after[TTFT][1] >= before[TTFT][1] + len(done):
                break
            await asyncio.sleep(0.1)
    if row is None:
        return
    row.ttft_s += [t[0] for t in done]
    row.duration_s += [t[1] for t in done]
    row.failed += len(timed) - len(done)
    row.ttft_sum += after[TTFT][0] - before[TTFT][0]
    row.ttft_count += after[TTFT][1] - before[TTFT][1]
    row.duration_sum += after[DURATION][0] - before[DURATION][0]
    row.duration_count += after[DURATION][1] - before[DURATION][1]


def mean_ms(values: list[float]) -> float:
    return statistics.fmean(values) * 1e3 if values else float("nan")


def machine_state() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=96, help="requests per row (at most 1000)")
    parser.add_argument("--rounds", type=int, default=4, help="turns each frontend takes per row")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--modes", default="aggregated,disaggregated")
    parser.add_argument("--prompt-words", type=int, default=1024, help="prompt length (the simulator: a token a word)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "frontend_ttft.md")
    args = parser.parse_args()
    requests = max(1, min(args.requests, 1000))
    rounds = max(1, min(args.rounds, requests))
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    modes = args.modes.split(",")
    prompt = " ".join(f"w{i % 97}" for i in range(args.prompt_words))
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / "fleetpilot-frontend-ttft"
    logs.mkdir(parents=True, exist_ok=True)
    state_before = machine_state()
    began = datetime.datetime.now(datetime.UTC)
    rows: dict[tuple[str, int, str, str], Row] = {}
    for mode in modes:
        worker = [FLEETPILOT, "sim", "worker", "--model", MODEL, "--speedup", "1"]
        servers: list[Server] = []
        try:
            if mode == "aggregated":
                servers.append(Server(worker, logs / f"{mode}-worker.log"))
                route = ["--worker-url", servers[0].url]
            else:
                servers.append(Server([*worker, "--role", "prefill"], logs / f"{mode}-prefill.log"))
                servers.append(Server([*worker, "--role", "decode"], logs / f"{mode}-decode.log"))
                route = ["--prefill-url", servers[0].url, "--decode-url", servers[1].url]
            command = ["frontend", "--model", MODEL, "--mode", mode, "--router", "least-loaded", "--http", "httptools",
                       *route]
            frontends = {}
            for name, patch in PATCHES.items():
                frontends[name] = Server([sys.executable, "-c", _LAUNCH.format(patch=patch), *command],
                                         logs / f"{mode}-frontend-{name.replace(' ', '-')}.log")
                servers.append(frontends[name])
            for concurrency in concurrencies:
                for kind in CLIENTS:
                    clients = {name: (openai_client(f.url, prompt, args.max_tokens) if kind == "openai"
                                      else socket_client(f.port, prompt, args.max_tokens))
                               for name, f in frontends.items()}
                    for name, frontend in frontends.items():  # warm-up: connections, the workers' first steps
                        asyncio.run(batch(frontend.url, clients[name], requests=concurrency, concurrency=concurrency,
                                          row=None))
                    for turn in range(rounds):
                        share = requests // rounds + (turn < requests % rounds)
                        for name, frontend in frontends.items():
                            row = rows.setdefault((mode, concurrency, kind, name), Row())
                            asyncio.run(batch(frontend.url, clients[name], requests=share, concurrency=concurrency,
                                              row=row))
                    for name in frontends:
                        row = rows[(mode, concurrency, kind, name)]
                        print(f"{mode} c={concurrency} {kind} {name}: client TTFT {mean_ms(row.ttft_s):.1f} ms, "
                              f"histogram {row.histogram_ms(TTFT):.1f} ms, failed {row.failed}", flush=True)
        finally:
            for server in servers:
                server.stop()
    state_after = machine_state()

    command_line = " ".join(["~/.cache/fleetpilot/venv/bin/python benchmarks/frontend_ttft.py", *sys.argv[1:]])
    lines = [
        "# Frontend TTFT: the histogram against what clients measure", "",
        (f"Generated by `{command_line}` on {began:%Y-%m-%d %H:%M} UTC, on {platform.node() or 'this machine'} "
         f"(Python {platform.python_version()}): {requests} streaming chat completions per row in {rounds} "
         f"rounds (prompt {args.prompt_words} tokens, {args.max_tokens} tokens out), simulator workers at "
         "`--speedup 1` (llama-3.1-8b on H200 timings), the frontends on uvloop and httptools, everything on "
         f"127.0.0.1. Machine before the run: {state_before}; after: {state_after}. The clients, the "
         "frontends and the workers share these cores with whatever else runs on them."), "",
        ("Client `openai`: the SDK, from its HTTP client sending the request to the SDK yielding the first chunk "
         "with content (request: to the stream's end); `socket`: a bare HTTP/1.1 client, from writing the "
         "request to reading the first chunk with content (request: to the last chunk). Histogram: the "
         "frontend's `_sum` / `_count` growth over the row. Frontend clock `arrival`: as shipped (the "
         "server's protocol stamps the request when its first bytes are parsed); `app entry`: stamped when "
         "the ASGI app first runs for it; `handler`: started by the request handler."), "",
        ("| mode | concurrency | client | frontend clock | requests | failed | client TTFT ms | histogram TTFT ms "
         "| TTFT histogram ÷ client | client request ms | histogram request ms | request histogram ÷ client |"),
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (mode, concurrency, kind, name), row in rows.items():
        client_ttft, client_duration = mean_ms(row.ttft_s), mean_ms(row.duration_s)
        hist_ttft, hist_duration = row.histogram_ms(TTFT), row.histogram_ms(DURATION)
        lines.append(
            f"| {mode} | {concurrency} | {kind} | {name} | {len(row.ttft_s)} | {row.failed} | {client_ttft:.1f} | "
            f"{hist_ttft:.1f} | {hist_ttft / client_ttft:.3f} | {client_duration:.1f} | {hist_duration:.1f} | "
            f"{hist_duration / client_duration:.3f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
