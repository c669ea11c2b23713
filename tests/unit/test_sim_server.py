"""The simulator's HTTP server, run in-process by uvicorn on 127.0.0.1 with a fake timing model.

Each test starts its own worker(s) on an ephemeral port in a background thread, talks to them with
httpx, and stops them. Most run at a large speedup, so a 10 ms decode step takes 0.1 ms; the timing
test runs at speedup 1 and only asserts a lower bound and a generous upper bound.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from sim_timing import PREFILL_S_PER_TOKEN, FakeTiming

from fleetpilot.sim import engine, server
from fleetpilot.sim import scheduler as scheduler_mod

MODEL = "llama-8b"


@dataclass
class Worker:
    url: str
    port: int
    uvicorn: server.DrainingServer
    thread: threading.Thread

    def metric(self, sample: str, **labels: str) -> float:
        """One sample's value from /metrics (0 when absent)."""
        text = httpx.get(self.url + "/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                    return float(s.value)
        return 0.0


def wait_for(condition: Callable[[], bool], *, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def worker(
    *, role: server.Role = "aggregated", speedup: float = 100.0, capacity: int = 1_000_000,
    hold_timeout: float = 30.0, shutdown_timeout: int = 10, kv_bandwidth: float = 50e9,
) -> Iterator[Worker]:
    sock = server.bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    scheduler = scheduler_mod.Scheduler(FakeTiming(capacity), scheduler_mod.SchedulerConfig(
        kv_hold_timeout_s=hold_timeout, kv_bandwidth_bytes_per_s=kv_bandwidth))
    config = server.ServerConfig(served_model=MODEL, role=role, advertise_host="127.0.0.1",
                                 advertise_port=port, tensor_parallel_size=2)
    sim = engine.Engine(scheduler, speedup=speedup)
    app = server.create_app(config, sim)
    uv = server.DrainingServer(uvicorn.Config(app, log_level="warning", lifespan="on",
                                              timeout_graceful_shutdown=shutdown_timeout), sim,
                               drain_s=shutdown_timeout)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(url), what="/health")
        yield Worker(url, port, uv, thread)
    finally:
        uv.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "the server did not stop"


def sse_events(lines: Iterator[str], *, limit: int = 100_000) -> Iterator[Any]:
    """The JSON payloads of an SSE stream, then the string "[DONE]"."""
    for _, line in zip(range(limit), lines, strict=False):
        if not line.startswith("data: "):
            assert line == "", line
            continue
        payload = line[len("data: "):]
        yield payload if payload == "[DONE]" else json.loads(payload)


def stream_all(url: str, body: dict[str, Any]) -> list[Any]:
    with httpx.stream("POST", url, json=body, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return list(sse_events(response.iter_lines()))


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


# -- OpenAI shapes ---------------------------------------------------------------------------------


def test_completion_returns_exactly_max_tokens_with_usage() -> None:
    with worker() as w:
        response = httpx.post(w.url + "/v1/completions", timeout=30,
                              json={"model": MODEL, "prompt": words(50), "max_tokens": 12,
                                    "ignore_eos": True})
        assert response.status_code == 200
        body = response.json()
        assert body["object"] == "text_completion" and body["model"] == MODEL
        assert body["id"].startswith("cmpl-")
        (choice,) = body["choices"]
        assert choice["finish_reason"] == "length" and choice["index"] == 0
        assert len(choice["text"].split()) == 12
        assert body["usage"] == {"prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62}
        assert body["kv_transfer_params"] is None

        ids = httpx.post(w.url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2},
                         timeout=30).json()
        assert ids["usage"]["prompt_tokens"] == 3


def test_streaming_completion_sends_one_chunk_per_token_then_usage_and_done() -> None:
    with worker() as w:
        events = stream_all(w.url + "/v1/completions", {
            "model": MODEL, "prompt": words(20), "max_tokens": 7, "stream": True,
            "stream_options": {"include_usage": True},
        })
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 7
    chunks = events[:-2]
    assert len(chunks) == 7
    assert all(c["object"] == "text_completion" and c["choices"][0]["text"].strip() for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 6 + ["length"]
    assert len({c["id"] for c in chunks}) == 1


def test_streaming_without_include_usage_has_no_usage_chunk() -> None:
    with worker() as w:
        events = stream_all(w.url + "/v1/completions",
                            {"prompt": "hi there", "max_tokens": 3, "stream": True})
    assert events[-1] == "[DONE]"
    assert all("usage" not in e for e in events[:-1])
    assert len(events) == 4


def test_chat_completion_non_streaming_and_streaming() -> None:
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "tell me about the sea"}]}]
    with worker() as w:
        body = httpx.post(w.url + "/v1/chat/completions", timeout=30,
                          json={"model": MODEL, "messages": messages, "max_completion_tokens": 9}).json()
        assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
        (choice,) = body["choices"]
        assert choice["message"]["role"] == "assistant"
        assert len(choice["message"]["content"].split()) == 9
        assert choice["finish_reason"] == "length"
        assert body["usage"]["prompt_tokens"] == 7

        events = stream_all(w.url + "/v1/chat/completions", {
            "model": MODEL, "messages": messages, "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True},
        })
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [e for e in events[1:-2]]
    assert all(e["object"] == "chat.completion.chunk" for e in content)
    assert len("".join(e["choices"][0]["delta"]["content"] for e in content).split()) == 5
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["usage"]["total_tokens"] == 7 + 5


def test_models_health_and_errors() -> None:
    with worker() as w:
        models = httpx.get(w.url + "/v1/models", timeout=5).json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == [MODEL]
        assert httpx.get(w.url + "/health", timeout=5).status_code == 200

        def post(body: dict[str, Any]) -> httpx.Response:
            return httpx.post(w.url + "/v1/completions", json=body, timeout=10)

        missing = post({"model": "other", "prompt": "x"})
        assert missing.status_code == 404 and "other" in missing.json()["error"]["message"]
        assert post({"prompt": "x", "max_tokens": 0}).status_code == 400
        assert post({"prompt": "", "max_tokens": 3}).status_code == 400
        assert post({"prompt": ["a", "b"], "max_tokens": 3}).status_code == 400
        assert post({"prompt": "x", "n": 2}).status_code == 400
        too_long = post({"prompt": "x", "max_tokens": 200_000})
        assert too_long.status_code == 400 and "maximum context length" in too_long.json()["error"]["message"]
        assert httpx.post(w.url + "/v1/completions", content=b"{", timeout=5).status_code == 400


def test_tokenize_counts_a_prompt_or_a_chat_like_generation_does_and_names_the_window() -> None:
    with worker() as w:
        prompt = httpx.post(w.url + "/tokenize", json={"model": MODEL, "prompt": words(7)}, timeout=5).json()
        assert prompt["count"] == 7 and len(prompt["tokens"]) == 7
        assert prompt["max_model_len"] == scheduler_mod.SchedulerConfig().max_model_len
        chat = httpx.post(w.url + "/tokenize", timeout=5, json={
            "messages": [{"role": "system", "content": words(3)}, {"role": "user", "content": words(4)}]}).json()
        answered = httpx.post(w.url + "/v1/chat/completions", timeout=10, json={
            "messages": [{"role": "system", "content": words(3)}, {"role": "user", "content": words(4)}],
            "max_tokens": 1}).json()
        assert chat["count"] == answered["usage"]["prompt_tokens"] == 7
        assert httpx.post(w.url + "/tokenize", json={"prompt": ""}, timeout=5).status_code == 400
        assert w.metric("vllm:prompt_tokens_total") == 7  # counting is not generating: only the chat above


def test_metrics_use_vllm_names_and_count_the_work() -> None:
    with worker() as w:
        for _ in range(3):
            httpx.post(w.url + "/v1/completions", json={"prompt": words(10), "max_tokens": 4}, timeout=30)
        text = httpx.get(w.url + "/metrics", timeout=5).text
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                     "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                     "vllm:request_success_total", "vllm:time_to_first_token_seconds_bucket",
                     "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
                     "vllm:request_queue_time_seconds_bucket"):
            assert name in text, name
        labels = {"model_name": MODEL}
        assert w.metric("vllm:generation_tokens_total", **labels) == 12
        assert w.metric("vllm:prompt_tokens_total", **labels) == 30
        assert w.metric("vllm:request_success_total", finished_reason="length", **labels) == 3
        assert w.metric("vllm:time_to_first_token_seconds_count", **labels) == 3
        assert w.metric("vllm:inter_token_latency_seconds_count", **labels) == 9
        assert w.metric("vllm:num_requests_running", **labels) == 0
        assert w.metric("vllm:kv_cache_usage_perc", **labels) == 0


# -- disaggregation ----------------------------------------------------------------------------------


def test_two_hop_prefill_then_decode_with_kv_transfer_params() -> None:
    # The hold timeout is far beyond the test, so the prefill side frees its KV only on the pull notice.
    with worker(role="prefill", hold_timeout=1e6) as prefill, worker(role="decode") as decode:
        request = {"model": MODEL, "prompt": words(100), "max_tokens": 20}
        first = httpx.post(prefill.url + "/v1/completions", timeout=30, json={
            **request, "stream": False, "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                   "remote_engine_id": None, "remote_block_ids": None,
                                   "remote_host": None, "remote_port": None},
        }).json()
        params = first["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert params["remote_host"] == "127.0.0.1" and params["remote_port"] == prefill.port
        assert params["tp_size"] == 2 and params["remote_engine_id"]
        assert len(params["remote_block_ids"]) == 7  # ceil(100 / 16)
        assert first["usage"]["completion_tokens"] == 1
        assert prefill.metric("vllm:kv_cache_usage_perc") > 0  # held for the decode side

        events = stream_all(decode.url + "/v1/completions", {
            **request, "stream": True, "kv_transfer_params": params,
            "stream_options": {"include_usage": True},
        })
        texts = [e["choices"][0]["text"] for e in events[:-2]]
        assert len(texts) == 20 and events[-2]["usage"]["completion_tokens"] == 20
        wait_for(lambda: prefill.metric("vllm:kv_cache_usage_perc") == 0,
                 what="the prefill side to free its KV")
        assert decode.metric("vllm:kv_cache_usage_perc") == 0


def test_prefill_role_without_kv_transfer_params_serves_the_whole_request() -> None:
    with worker(role="prefill") as prefill, worker(role="decode") as decode:
        for w in (prefill, decode):
            body = httpx.post(w.url + "/v1/completions", json={"prompt": "a b c", "max_tokens": 6},
                              timeout=30).json()
            assert body["usage"]["completion_tokens"] == 6 and body["kv_transfer_params"] is None


# -- cancellation, timing, shutdown ----------------------------------------------------------------


def test_client_disconnect_mid_stream_cancels_the_request() -> None:
    with worker(speedup=10.0) as w:  # 1 ms per token: 100,000 tokens would take minutes
        with httpx.stream("POST", w.url + "/v1/completions", timeout=30,
                          json={"prompt": words(10), "max_tokens": 100_000, "stream": True}) as response:
            # Keep the iterator referenced: an abandoned httpx line iterator closes the connection.
            events = sse_events(response.iter_lines(), limit=100)
            tokens = [next(events) for _ in range(3)]
            assert all(event["choices"][0]["text"] for event in tokens)
            assert w.metric("vllm:num_requests_running") == 1
        wait_for(lambda: w.metric("vllm:num_requests_running") == 0, what="the running count to drop")
        assert w.metric("vllm:request_success_total", finished_reason="abort") == 1
        assert w.metric("vllm:kv_cache_usage_perc") == 0


def test_client_disconnect_while_waiting_for_a_non_streaming_answer_cancels_it() -> None:
    with worker(speedup=10.0) as w:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(w.url + "/v1/completions", json={"prompt": "x", "max_tokens": 100_000}, timeout=0.5)
        wait_for(lambda: w.metric("vllm:request_success_total", finished_reason="abort") == 1,
                 what="the request to be aborted")
        assert w.metric("vllm:num_requests_running") == 0


def test_time_to_first_token_of_a_lone_request_is_its_prefill_time() -> None:
    prompt = 5000  # 50 ms of prefill at speedup 1
    with worker(speedup=1.0) as w:
        started = time.monotonic()
        with httpx.stream("POST", w.url + "/v1/completions", timeout=30,
                          json={"prompt": words(prompt), "max_tokens": 2, "stream": True}) as response:
            events = sse_events(response.iter_lines())
            first = next(events)
            ttft = time.monotonic() - started
            assert first["choices"][0]["text"]
            assert list(events)[-1] == "[DONE]"
        assert 0.9 * prompt * PREFILL_S_PER_TOKEN <= ttft < 5.0
        observed = w.metric("vllm:time_to_first_token_seconds_sum")
        assert prompt * PREFILL_S_PER_TOKEN <= observed < 1.0


def test_graceful_shutdown_lets_an_in_flight_stream_finish() -> None:
    with worker(speedup=10.0) as w:  # 200 tokens: about 0.2 s
        with httpx.stream("POST", w.url + "/v1/completions", timeout=30,
                          json={"prompt": "x", "max_tokens": 200, "stream": True}) as response:
            lines = response.iter_lines()
            next(lines)
            w.uvicorn.should_exit = True  # what SIGTERM does
            events = list(sse_events(lines))
        assert events[-1] == "[DONE]"
        assert len([e for e in events if isinstance(e, dict)]) == 199
        w.thread.join(timeout=30)
        assert not w.thread.is_alive()


def prefill_only(prefill: Worker, prompt_words: int = 100) -> dict[str, Any]:
    """The frontend's first hop: prefill, and the parameters a decode worker pulls the KV cache with."""
    answer = httpx.post(prefill.url + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": words(prompt_words), "max_tokens": 1, "stream": False,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}).json()
    params: dict[str, Any] = answer["kv_transfer_params"]
    return params


def test_a_decode_worker_cannot_pull_from_a_prefill_worker_that_is_gone() -> None:
    with worker(role="decode") as decode:
        with worker(role="prefill", hold_timeout=1e6) as prefill:
            params = prefill_only(prefill)
        response = httpx.post(decode.url + "/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": words(100), "max_tokens": 5, "kv_transfer_params": params})
        assert response.status_code == 502, response.text
        assert "prefill worker" in response.json()["error"]["message"]
        events = stream_all(decode.url + "/v1/completions", {  # streaming: the error before any token
            "model": MODEL, "prompt": words(100), "max_tokens": 5, "stream": True, "kv_transfer_params": params})
        assert events[0]["error"]["type"] == "KVTransferError" and events[-1] == "[DONE]"
        assert decode.metric("vllm:num_requests_running") == 0  # nothing left behind


def test_on_sigterm_a_prefill_worker_stays_until_its_kv_is_pulled() -> None:
    """Draining: the held KV cache of a finished prefill keeps the worker up (serving, so the decode
    worker can pull it); once pulled and the quiet period over, it stops by itself."""
    with worker(role="decode") as decode, worker(role="prefill", hold_timeout=1e6, shutdown_timeout=20) as prefill:
        params = prefill_only(prefill)
        prefill.uvicorn.handle_exit(signal.SIGTERM, None)
        time.sleep(server.QUIET_S + 0.5)
        assert prefill.thread.is_alive() and prefill.metric("vllm:kv_cache_usage_perc") > 0
        events = stream_all(decode.url + "/v1/completions", {
            "model": MODEL, "prompt": words(100), "max_tokens": 5, "stream": True, "kv_transfer_params": params})
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
        prefill.thread.join(timeout=15)
        assert not prefill.thread.is_alive()


def test_on_sigterm_a_decode_worker_finishes_its_streams_and_keeps_serving_meanwhile() -> None:
    with worker(speedup=10.0, shutdown_timeout=20) as w:  # 400 tokens: about 0.4 s
        with httpx.stream("POST", w.url + "/v1/completions", timeout=30,
                          json={"prompt": "x", "max_tokens": 400, "stream": True}) as response:
            lines = response.iter_lines()
            next(lines)
            w.uvicorn.handle_exit(signal.SIGTERM, None)
            # A request from a frontend that has not yet seen the pod go is still served.
            late = httpx.post(w.url + "/v1/completions", json={"prompt": "y", "max_tokens": 3}, timeout=30)
            assert late.status_code == 200
            events = list(sse_events(lines))
        assert events[-1] == "[DONE]" and len([e for e in events if isinstance(e, dict)]) == 399
        w.thread.join(timeout=15)
        assert not w.thread.is_alive()


# -- stop sequences and seeded sampling --------------------------------------------------------------


def test_a_stop_sequence_ends_the_output_before_it_and_frees_the_engine() -> None:
    """The greedy text is " the fleet sails on a quiet sea ...": stop at "quiet" after 6 tokens, the
    sequence itself not sent, finish_reason "stop", and the engine's request cancelled, not run to 64."""
    with worker() as w:
        body = {"model": MODEL, "prompt": words(20), "max_tokens": 64, "stop": ["quiet", "never"], "temperature": 0}
        answer = httpx.post(w.url + "/v1/completions", json=body, timeout=30).json()
        (choice,) = answer["choices"]
        assert choice["text"] == " the fleet sails on a " and choice["finish_reason"] == "stop"
        assert choice["stop_reason"] == "quiet" and answer["usage"]["completion_tokens"] == 6
        events = stream_all(w.url + "/v1/completions", dict(body, stream=True))
        text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
        assert text == " the fleet sails on a " and events[-2]["choices"][0]["finish_reason"] == "stop"
        wait_for(lambda: w.metric("vllm:num_requests_running") == 0, what="the engine to drop the rest")
        assert w.metric("vllm:generation_tokens_total") < 64  # two requests of 64, each cut at 6


def test_a_seed_gives_the_same_text_and_another_seed_another() -> None:
    def text(w: Worker, **sampling: Any) -> str:
        body = {"model": MODEL, "prompt": words(10), "max_tokens": 24, **sampling}
        return str(httpx.post(w.url + "/v1/completions", json=body, timeout=30).json()["choices"][0]["text"])

    with worker() as w:
        assert text(w, seed=1) == text(w, seed=1) != text(w, seed=2)
        greedy = "".join(server.filler_token(i) for i in range(24))
        assert text(w, seed=1, temperature=0) == text(w, temperature=0) == greedy
