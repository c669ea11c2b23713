"""The data plane as processes on 127.0.0.1: frontend → prefill → decode simulator workers.

Everything runs as a user would run it (`fleetpilot sim worker`, `fleetpilot frontend`), with
simulated time 10× faster than wall time so each test takes seconds. Each test gets its own
processes, so a killed worker or a drained frontend never leaks into the next test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import _free_port, wait_for

pytestmark = pytest.mark.integration

FLEETPILOT = str(Path(sys.executable).parent / "fleetpilot")
MODEL = "llama-8b"


class Process:
    """One fleetpilot process on a free loopback port, stopped by its PID."""

    def __init__(self, name: str, args: list[str], log_dir: Path) -> None:
        self.name = name
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{name}.log"
        self.popen = subprocess.Popen(
            [FLEETPILOT, *args, "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )

    def wait_healthy(self) -> None:
        def healthy() -> bool:
            assert self.popen.poll() is None, f"{self.name} exited:\n{self.log_path.read_text()[-3000:]}"
            try:
                return httpx.get(self.url + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, timeout=30, what=f"{self.name} healthy")

    def signal(self, sig: signal.Signals) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    def stop(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=5).text
        values = [float(m[1]) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)]
        return sum(values)


class Fleet:
    def __init__(self, log_dir: Path, *, prefill: int = 2, decode: int = 2, router: str = "round-robin",
                 speedup: int = 10, preset: str = "llama-3.1-8b", worker_args: tuple[str, ...] = ()) -> None:
        worker = ["sim", "worker", "--model", MODEL, "--speedup", str(speedup), "--model-preset", preset, *worker_args]
        self.prefill = [Process(f"prefill-{i}", [*worker, "--role", "prefill"], log_dir) for i in range(prefill)]
        self.decode = [Process(f"decode-{i}", [*worker, "--role", "decode"], log_dir) for i in range(decode)]
        for process in self.workers:
            process.wait_healthy()
        args = ["frontend", "--model", MODEL, "--mode", "disaggregated", "--router", router, "--drain-seconds", "60"]
        args += [a for p in self.prefill for a in ("--prefill-url", p.url)]
        args += [a for p in self.decode for a in ("--decode-url", p.url)]
        self.frontend = Process("frontend", args, log_dir)
        self.frontend.wait_healthy()

    @property
    def workers(self) -> list[Process]:
        return self.prefill + self.decode

    def stop(self) -> None:
        for process in [self.frontend, *self.workers]:
            process.stop()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    running = Fleet(tmp_path)
    yield running
    running.stop()


def completion(max_tokens: int, prompt_words: int = 200, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "prompt": " ".join(f"w{i}" for i in range(prompt_words)), "max_tokens": max_tokens,
            "ignore_eos": True, **extra}


def stream_lines(client: httpx.Client, url: str, body: dict[str, object]) -> Iterator[str]:
    with client.stream("POST", url + "/v1/completions", json=dict(body, stream=True)) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:"):
                yield line[5:].strip()


def test_two_hop_completion_streams_every_token(fleet: Fleet) -> None:
    with httpx.Client(timeout=60) as client:
        payloads = list(stream_lines(client, fleet.frontend.url, completion(32)))
        answer = client.post(fleet.frontend.url + "/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}).json()
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["text"]) == 32
    assert answer["object"] == "chat.completion" and len(answer["choices"][0]["message"]["content"].split()) == 8
    assert answer["usage"]["completion_tokens"] == 8
    # Both hops happened: some prefill worker prefilled, some decode worker decoded.
    assert sum(p.metric("vllm:prompt_tokens_total") for p in fleet.prefill) > 0
    assert sum(p.metric("vllm:generation_tokens_total") for p in fleet.decode) >= 40
    assert fleet.frontend.metric('fleetpilot_frontend_requests_total') == 2


def test_unknown_model_is_refused_with_the_served_name(fleet: Fleet) -> None:
    response = httpx.post(fleet.frontend.url + "/v1/completions", json=dict(completion(4), model="gpt-5"), timeout=30)
    assert response.status_code == 404
    assert "use 'llama-8b'" in response.json()["error"]["message"]


def test_client_disconnect_cancels_the_work_on_the_workers(fleet: Fleet) -> None:
    with httpx.Client(timeout=60) as client:
        lines = stream_lines(client, fleet.frontend.url, completion(100_000))
        for _ in range(5):
            next(lines)
        assert sum(p.metric("vllm:num_requests_running") for p in fleet.decode) == 1
        lines.close()  # the client goes away mid-stream

    wait_for(lambda: sum(p.metric("vllm:num_requests_running") for p in fleet.decode) == 0, timeout=20,
             what="decode workers to drop the cancelled request")
    assert fleet.frontend.metric('fleetpilot_frontend_requests_total{model="llama-8b",status="cancelled"}') == 1


PHASE_SAMPLE = re.compile(r'^fleetpilot_frontend_requests_in_phase\{model="[^"]*",phase="([a-z_]+)"\} (\S+)$',
                          re.MULTILINE)


def phases(process: Process) -> dict[str, float]:
    text = httpx.get(process.url + "/metrics", timeout=5).text
    return {m.group(1): float(m.group(2)) for m in PHASE_SAMPLE.finditer(text)}


def test_the_frontend_knows_where_each_request_is(fleet: Fleet) -> None:
    """The fast path's engine-independent queue signal: a long stream counts as decoding while it
    streams, and every phase is back at 0 once the client has gone."""
    assert phases(fleet.frontend) == {"prefill": 0.0, "first_token": 0.0, "decoding": 0.0}
    with httpx.Client(timeout=60) as client:
        lines = stream_lines(client, fleet.frontend.url, completion(100_000))
        for _ in range(3):
            next(lines)
        assert phases(fleet.frontend) == {"prefill": 0.0, "first_token": 0.0, "decoding": 1.0}
        lines.close()  # type: ignore[attr-defined]
    wait_for(lambda: sum(phases(fleet.frontend).values()) == 0, timeout=20, what="the phases to empty")


def test_killed_decode_worker_fails_only_its_own_stream(fleet: Fleet) -> None:
    with httpx.Client(timeout=60) as client:
        lines = stream_lines(client, fleet.frontend.url, completion(100_000))
        for _ in range(3):
            next(lines)
        busy = next(p for p in fleet.decode if p.metric("vllm:num_requests_running") == 1)
        busy.stop()
        rest = list(lines)
        assert rest[-1] == "[DONE]"
        error = json.loads(rest[-2])["error"]
        # The client learns which request failed and where to look, never where the worker was.
        assert error["type"] == "upstream_error" and "decode worker failed" in error["message"]
        assert "127.0.0.1" not in error["message"]
        assert "broke off the stream" in fleet.frontend.log_path.read_text()

        for _ in range(6):  # later requests avoid the dead worker
            payloads = list(stream_lines(client, fleet.frontend.url, completion(4)))
            assert payloads[-1] == "[DONE]" and not any("error" in json.loads(p) for p in payloads[:-1])
    assert fleet.frontend.metric('fleetpilot_frontend_requests_total{model="llama-8b",status="error"}') == 1
    assert fleet.frontend.metric('fleetpilot_frontend_requests_total{model="llama-8b",status="ok"}') == 6


def test_sigterm_lets_inflight_streams_finish(fleet: Fleet) -> None:
    import concurrent.futures

    # Long enough (seconds of simulated decode) that on a loaded machine no stream ends before the third
    # has started: the test is about streams in flight when SIGTERM comes.
    tokens = 2000

    def one_stream() -> list[str]:
        with httpx.Client(timeout=120) as client:
            return list(stream_lines(client, fleet.frontend.url, completion(tokens)))

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        streams = [pool.submit(one_stream) for _ in range(3)]
        wait_for(lambda: fleet.frontend.metric("fleetpilot_frontend_inflight_requests") == 3, timeout=20,
                 interval=0.02, what="three streams in flight")
        fleet.frontend.signal(signal.SIGTERM)
        results = [s.result(timeout=120) for s in streams]

    for payloads in results:
        assert payloads[-1] == "[DONE]"
        chunks = [json.loads(p) for p in payloads[:-1]]
        assert not any("error" in t for t in chunks)
        assert sum(1 for t in chunks if t["choices"] and t["choices"][0]["text"]) == tokens
    fleet.frontend.popen.wait(timeout=30)  # it exits by itself once drained
    with pytest.raises(httpx.ConnectError):
        httpx.get(fleet.frontend.url + "/health", timeout=2)


def test_no_workers_is_a_clear_503(tmp_path: Path) -> None:
    frontend = Process("frontend", ["frontend", "--model", MODEL, "--mode", "aggregated",
                                    "--worker-url", f"http://127.0.0.1:{_free_port()}"], tmp_path)
    try:
        frontend.wait_healthy()
        response = httpx.post(frontend.url + "/v1/completions", json=completion(4), timeout=30)
        assert response.status_code == 503
        assert "no aggregated worker reachable" in response.json()["error"]["message"]
    finally:
        frontend.stop()


def test_frontend_refuses_disaggregation_it_cannot_do() -> None:
    result = subprocess.run([FLEETPILOT, "frontend", "--model", MODEL, "--engine", "sglang",
                             "--prefill-url", "http://127.0.0.1:1", "--decode-url", "http://127.0.0.1:2"],
                            check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "disaggregated routing for sglang is not implemented yet" in result.stderr


def histogram_quantile(text: str, name: str, quantile: float) -> tuple[float, float]:
    """(quantile, count) from a Prometheus histogram's text exposition, as histogram_quantile() reads it."""
    buckets = sorted(
        (float("inf") if m[1] == "+Inf" else float(m[1]), float(m[2]))
        for m in re.finditer(rf'^{name}_bucket{{[^}}]*le="([^"]+)"[^}}]*}} (\S+)$', text, re.MULTILINE)
    )
    count = buckets[-1][1]
    rank = quantile * count
    lower_bound, lower_count = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (cumulative - lower_count), count
        lower_bound, lower_count = bound, cumulative
    raise AssertionError("empty histogram")


def test_replaying_a_minute_of_the_azure_trace_counts_every_request(tmp_path: Path) -> None:
    """Every request of a trace minute is counted by the frontend, whose TTFT agrees with the client's.

    The client always sees a few milliseconds more than the frontend (its own HTTP stack and event
    loop, which the frontend cannot see): 3 ms unloaded, up to 6-16 ms in the trace's bursts on two
    busy cores. That is noise against a 70B model's TTFTs, but 10-30% of an 8B model's 30-50 ms at
    1x-10x, so the fleet simulates Llama-3.1-70B, at 2x.
    """
    import asyncio

    from fleetpilot import traces
    from fleetpilot.replay import client, report

    speedup = 2
    trace = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "azure_llm_2023" / \
        "AzureLLMInferenceTrace_code.csv"
    # 60 s of trace, its arrivals compressed as much as the workers' simulated time.
    requests = traces.load(trace, shape=traces.Shape(start_s=0, duration_s=60, time_factor=float(speedup)))
    fleet = Fleet(tmp_path, speedup=speedup, preset="llama-3.1-70b")
    try:
        results = asyncio.run(client.replay(requests, url=fleet.frontend.url, model=MODEL, timeout_s=120))
        metrics = httpx.get(fleet.frontend.url + "/metrics", timeout=5).text
    finally:
        fleet.stop()
    summary = report.summarise(results, report.parse_sla("ttft=500ms,itl=50ms"))

    assert len(results) == len(requests) > 50
    assert [r.status for r in results].count("ok") == len(requests), [r.error for r in results if r.error][:3]
    frontend_p50, counted = histogram_quantile(metrics, "fleetpilot_frontend_time_to_first_token_seconds", 0.5)
    assert counted == len(requests), f"frontend counted {counted} TTFTs for {len(requests)} requests"
    _, output_counted = histogram_quantile(metrics, "fleetpilot_frontend_output_tokens", 0.5)
    assert output_counted == len(requests)
    # TTFT's prefill part (the first hop), which the planner blames prefill for: every request, and
    # less than the whole TTFT (KV transfer and the first decode step come after it).
    prefill_p50, prefilled = histogram_quantile(metrics, "fleetpilot_frontend_prefill_seconds", 0.5)
    assert prefilled == len(requests)
    assert 0 < prefill_p50 < frontend_p50
    # The rest of TTFT (KV transfer, a decode slot) and the generation: the breakdown a dashboard shows.
    _, waited = histogram_quantile(metrics, "fleetpilot_frontend_first_token_wait_seconds", 0.5)
    _, decoded = histogram_quantile(metrics, "fleetpilot_frontend_decode_seconds", 0.5)
    assert waited == decoded == len(requests)
    # The arrival burst each request saw (the planner sizes prefill for its percentile): one sample per
    # request, and at the 90th percentile above the replay's mean rate (the trace comes in bursts).
    burst_p90, burst_counted = histogram_quantile(metrics, "fleetpilot_frontend_arrival_burst_rps", 0.9)
    assert burst_counted == len(requests)
    assert burst_p90 > len(requests) / (60 / speedup)
    client_p50 = summary.ttft_ms.p50 / 1000
    measured = f"client p50 {client_p50 * 1000:.1f} ms, frontend p50 {frontend_p50 * 1000:.1f} ms"
    print(f"\nAzure code trace, 60 s at {speedup}x: {len(requests)} requests; TTFT {measured}")
    assert abs(client_p50 - frontend_p50) <= 0.10 * client_p50, measured


def test_prefix_hit_rate_through_the_frontend_on_mooncake(tmp_path: Path) -> None:
    """One Mooncake slice through live frontends: prefix-aware finds far more prompt blocks cached.

    The first 500 requests of the trace reuse prefixes less than later ones (offline, over 3 prefill
    workers: 16% of blocks for prefix-aware against 8% for round-robin), so the bar is relative.
    """
    import asyncio

    from fleetpilot import traces
    from fleetpilot.replay import client

    trace = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "mooncake_fast25" / \
        "conversation_trace.jsonl"
    requests = traces.load(trace, shape=traces.Shape(max_requests=500, time_factor=5.0))
    requests = [dataclasses.replace(r, output_tokens=min(r.output_tokens, 8)) for r in requests]
    rates = {}
    for router in ("prefix-aware", "round-robin"):
        fleet = Fleet(tmp_path, prefill=3, decode=1, router=router)
        try:
            results = asyncio.run(client.replay(requests, url=fleet.frontend.url, model=MODEL, timeout_s=120))
            assert all(r.status == "ok" for r in results), [r.error for r in results if r.error][:3]
            hits = fleet.frontend.metric("fleetpilot_frontend_prefix_hit_blocks_total")
            rates[router] = hits / fleet.frontend.metric("fleetpilot_frontend_prefix_query_blocks_total")
        finally:
            fleet.stop()
    print(f"\nMooncake, 500 requests, 3 prefill workers: prompt blocks found cached: "
          f"prefix-aware {rates['prefix-aware']:.1%}, round-robin {rates['round-robin']:.1%}")
    assert rates["prefix-aware"] > 1.5 * rates["round-robin"]
