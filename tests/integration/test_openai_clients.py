"""The frontend as its users call it: the official `openai` SDK, sync and async, streaming and not.

Every case a client can get wrong (or a fleet can fail at) must come back the way OpenAI's own API
answers: the right status (so the SDK raises the right exception before any stream starts), the
error shape with `param` naming the field, no worker address, and no GPU work spent on a request
that was never valid (the prefill workers' prompt-token counters do not move).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from .conftest import _free_port
from .test_dataplane import MODEL, Fleet, Process

pytestmark = pytest.mark.integration

CONTEXT_WINDOW = 4096  # the workers' --max-model-len; the frontend is not told it and learns it


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    running = Fleet(tmp_path_factory.mktemp("openai"), prefill=1, decode=1,
                    worker_args=("--max-model-len", str(CONTEXT_WINDOW)))
    yield running
    running.stop()


@pytest.fixture
def client(fleet: Fleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.frontend.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def prefilled_tokens(fleet: Fleet) -> float:
    return sum(p.metric("vllm:prompt_tokens_total") for p in fleet.prefill)


CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "tell me about disaggregated serving"}]


def test_sync_chat_and_completion_answer_with_usage(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6)
    assert chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens == 6
    text = client.completions.create(model=MODEL, prompt="once upon a time", max_tokens=5)
    assert text.choices[0].text and text.usage is not None and text.usage.completion_tokens == 5
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=CHAT, max_tokens=2,
                                                           extra_headers={"x-request-id": "abc-123"})
    assert raw.headers["x-request-id"] == "abc-123"


def test_async_streaming_chat_streams_every_token_and_usage(fleet: Fleet) -> None:
    async def run() -> tuple[int, int | None]:
        async with openai.AsyncOpenAI(base_url=fleet.frontend.url + "/v1", api_key="unused", max_retries=0) as aclient:
            stream = await aclient.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=12, stream=True,
                stream_options={"include_usage": True})
            pieces, usage = 0, None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces += 1
                if chunk.usage is not None:
                    usage = chunk.usage.completion_tokens
            return pieces, usage

    assert asyncio.run(run()) == (12, 12)


@pytest.mark.parametrize(("stream", "change", "param"), [
    (True, {"n": 2}, "n"),
    (False, {"n": 2}, "n"),
    (True, {"messages": []}, "messages"),
    (True, {"max_tokens": 0}, "max_tokens"),
    (False, {"max_tokens": "many"}, "max_tokens"),
    (True, {"temperature": 3.5}, "temperature"),
    (True, {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    (False, {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
])
def test_an_invalid_request_is_a_400_naming_the_field_before_any_prefill(
        fleet: Fleet, client: openai.OpenAI, stream: bool, change: dict[str, object], param: str) -> None:
    before = prefilled_tokens(fleet)
    body: dict[str, object] = {"model": MODEL, "messages": CHAT, "max_tokens": 4, **change}
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(**body, stream=stream)  # type: ignore[call-overload]
    error = raised.value
    assert error.status_code == 400 and error.param == param, error.body
    assert isinstance(error.body, dict) and error.body["type"] == "invalid_request_error"
    assert param in error.message
    assert prefilled_tokens(fleet) == before  # no GPU time for a request that was never valid
    assert fleet.frontend.metric("fleetpilot_frontend_requests_rejected_total") >= 1


def test_an_unknown_model_is_not_found_naming_the_served_one(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(model="gpt-5", messages=CHAT, stream=True)
    assert raised.value.param == "model" and "llama-8b" in raised.value.message
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-5")
    assert [m.id for m in client.models.list()] == [MODEL]


def test_unknown_routes_answer_json(fleet: Fleet) -> None:
    missing = httpx.get(fleet.frontend.url + "/v1/embeddings", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = httpx.get(fleet.frontend.url + "/v1/chat/completions", timeout=10)
    assert wrong.status_code == 405 and "GET" in wrong.json()["error"]["message"]


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))  # the simulator counts one token per word


@pytest.mark.parametrize(("prompt_words", "max_tokens", "stream", "param"), [
    (1000, CONTEXT_WINDOW - 999, True, "max_tokens"),  # the prompt fits, prompt + output does not
    (1000, CONTEXT_WINDOW - 999, False, "max_tokens"),
    (CONTEXT_WINDOW + 10, 4, True, "prompt"),
])
def test_a_request_that_overflows_the_context_window_is_refused_before_any_prefill(
        fleet: Fleet, client: openai.OpenAI, prompt_words: int, max_tokens: int, stream: bool, param: str) -> None:
    """The prefill worker gets `max_tokens: 1`, so it would prefill such a request and only the decode
    worker would refuse it: the frontend counts the prompt on a prefill worker's /tokenize first."""
    before = prefilled_tokens(fleet)
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=MODEL, prompt=words(prompt_words), max_tokens=max_tokens, stream=stream)
    assert raised.value.param == param and raised.value.code == "context_length_exceeded"
    assert str(CONTEXT_WINDOW) in raised.value.message
    assert prefilled_tokens(fleet) == before


def test_a_request_that_fills_the_context_window_exactly_is_served(client: openai.OpenAI) -> None:
    answer = client.completions.create(model=MODEL, prompt=words(1000), max_tokens=CONTEXT_WINDOW - 1000)
    assert answer.usage is not None and answer.usage.prompt_tokens + answer.usage.completion_tokens == CONTEXT_WINDOW


def test_a_worker_refusal_is_relayed_with_its_status_and_without_its_address(client: openai.OpenAI) -> None:
    """An empty prompt is the engine's to refuse (vLLM does, for models without a BOS token): the
    client gets the engine's 400 and message, not a 502 'upstream error', and no worker address."""
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=MODEL, prompt="", max_tokens=4, stream=True)
    assert "empty" in raised.value.message
    assert "127.0.0.1" not in raised.value.message and "http://" not in raised.value.message


def test_no_worker_is_a_503_before_the_stream_and_health_differs_from_ready(tmp_path: Path) -> None:
    frontend = Process("frontend", ["frontend", "--model", MODEL, "--mode", "aggregated",
                                    "--worker-url", f"http://127.0.0.1:{_free_port()}"], tmp_path)
    try:
        frontend.wait_healthy()  # alive: it serves HTTP
        client = openai.OpenAI(base_url=frontend.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        with pytest.raises(openai.APIStatusError) as raised:
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, stream=True)
        assert raised.value.status_code == 503
        assert "127.0.0.1" not in raised.value.message
        ready = httpx.get(frontend.url + "/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["missing_workers"] == ["aggregated"]
        assert httpx.get(frontend.url + "/health", timeout=5).status_code == 200
    finally:
        frontend.stop()


def test_ready_when_both_roles_have_a_worker(fleet: Fleet) -> None:
    ready = httpx.get(fleet.frontend.url + "/ready", timeout=5)
    assert ready.status_code == 200 and ready.json()["missing_workers"] == []


def test_stop_sequences_and_seeds_reach_the_engine(client: openai.OpenAI) -> None:
    stopped = client.completions.create(model=MODEL, prompt="once upon a time", max_tokens=64, stop=["quiet"],
                                         temperature=0)  # greedy: "quiet" comes within 64 words
    assert stopped.choices[0].finish_reason == "stop" and "quiet" not in stopped.choices[0].text
    assert stopped.usage is not None and stopped.usage.completion_tokens < 64

    def seeded(seed: int) -> str:
        answer = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, seed=seed)
        return answer.choices[0].message.content or ""

    assert seeded(5) == seeded(5) != seeded(6)
