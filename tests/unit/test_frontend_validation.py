"""Request validation before any worker sees a request (fleetpilot/frontend/validation.py)."""

from __future__ import annotations

from typing import Any

import pytest

from fleetpilot.frontend.validation import (
    ApiError,
    check_context,
    completion_budget,
    prompt_token_bound,
    validate,
)

CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
COMPLETION: dict[str, Any] = {"model": "m", "prompt": "hi", "max_tokens": 8}


def refusal(body: Any, *, chat: bool = True, **options: Any) -> ApiError:
    with pytest.raises(ApiError) as raised:
        validate(body, chat=chat, model="m", **options)
    return raised.value


def test_valid_requests_pass() -> None:
    validate(CHAT, chat=True, model="m")
    validate(dict(CHAT, stream=True, stream_options={"include_usage": True}, temperature=0.7, top_p=0.9, seed=3,
                  stop=["\n"], logprobs=True), chat=True, model="m")
    validate(dict(COMPLETION, prompt=[1, 2, 3], logprobs=2), chat=False, model="m")
    validate(dict(COMPLETION, prompt=["a", "b"]), chat=False, model="m")
    validate({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]},
                           {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, chat=True, model="m")


@pytest.mark.parametrize(("body", "chat", "param", "words"), [
    ({"prompt": "x"}, True, "messages", "required"),
    (dict(CHAT, messages="hi"), True, "messages", "non-empty list"),
    (dict(CHAT, messages=[{"role": "user", "content": 5}]), True, "messages[0].content", "string"),
    ({"max_tokens": 3}, False, "prompt", "required"),
    (dict(COMPLETION, prompt=[]), False, "prompt", "non-empty"),
    (dict(COMPLETION, prompt=[-1]), False, "prompt", "non-negative"),
    (dict(CHAT, max_tokens=True), True, "max_tokens", "integer"),
    (dict(CHAT, max_completion_tokens=-2), True, "max_completion_tokens", "at least 1"),
    (dict(CHAT, n=3), True, "n", "only n=1"),
    (dict(CHAT, stream="yes"), True, "stream", "true or false"),
    (dict(CHAT, stream_options={"include_usage": True}), True, "stream_options", "stream: true"),
    (dict(CHAT, top_p=1.5), True, "top_p", "0 to 1"),
    (dict(CHAT, temperature=float("nan")), True, "temperature", "0 to 2"),
    (dict(CHAT, seed=1.5), True, "seed", "integer"),
    (dict(CHAT, stop=[1]), True, "stop", "list of strings"),
    (dict(CHAT, logprobs=3), True, "logprobs", "true or false"),
    (dict(COMPLETION, logprobs=True), False, "logprobs", "integer"),
])
def test_each_bad_field_is_named_with_the_fix(body: dict[str, Any], chat: bool, param: str, words: str) -> None:
    error = refusal(body, chat=chat)
    assert error.status == 400 and error.param == param and words in error.message
    assert error.body()["error"]["param"] == param and error.body()["error"]["type"] == "invalid_request_error"


def test_an_unknown_model_is_a_404_naming_the_served_one() -> None:
    error = refusal(dict(CHAT, model="gpt-5"))
    assert (error.status, error.param, error.code) == (404, "model", "model_not_found") and "'m'" in error.message


def test_max_tokens_must_leave_room_in_the_context_window_when_it_is_known() -> None:
    validate(dict(CHAT, max_tokens=4000), chat=True, model="m", max_model_len=4096)
    error = refusal(dict(CHAT, max_tokens=4096), max_model_len=4096)
    assert error.param == "max_tokens" and "4096" in error.message


def test_a_body_that_is_not_an_object_is_refused() -> None:
    assert refusal([1, 2]).status == 400


def test_the_prompt_bound_is_never_below_a_byte_level_count_and_counts_token_ids_exactly() -> None:
    text = "héllo wörld, ünïcode costs more bytes"
    assert prompt_token_bound({"prompt": text}, chat=False) >= len(text.encode())
    assert prompt_token_bound({"prompt": [5, 6, 7]}, chat=False) == 3
    two = {"messages": [{"role": "system", "content": "be brief"},
                        {"role": "user", "content": [{"type": "text", "text": "hi there"}]}]}
    assert prompt_token_bound(two, chat=True) >= len("be brief") + len("hi there") + 2 * 5  # Llama 3's headers


def test_the_completion_budget_names_the_field_that_asked() -> None:
    assert completion_budget({"max_tokens": 9}, chat=False) == ("max_tokens", 9)
    assert completion_budget({"max_completion_tokens": 7, "max_tokens": 9}, chat=True) == ("max_completion_tokens", 7)
    assert completion_budget({"max_completion_tokens": 7}, chat=False) is None
    assert completion_budget({}, chat=True) is None


def test_the_context_check_blames_the_output_unless_the_prompt_alone_is_too_long() -> None:
    check_context(1000, 3096, 4096, chat=True)  # exactly full is allowed, as vLLM allows it
    with pytest.raises(ApiError) as output:
        check_context(1000, 3097, 4096, chat=True)
    assert (output.value.param, output.value.code) == ("max_tokens", "context_length_exceeded")
    assert "at most 3096" in output.value.message
    with pytest.raises(ApiError) as prompt:
        check_context(5000, 1, 4096, chat=False)
    assert prompt.value.param == "prompt" and "shorten" in prompt.value.message
    with pytest.raises(ApiError) as renamed:
        check_context(4000, 200, 4096, chat=True, budget_param="max_completion_tokens")
    assert renamed.value.param == "max_completion_tokens"
