"""Validate an OpenAI request before any worker sees it, and say what is wrong the way OpenAI does.

Why here: in a disaggregated graph the prefill worker gets the prompt with `max_tokens: 1` and does
the expensive part before the decode worker reads the rest of the request; a request that decode then
refuses has cost a full prefill and a KV cache. Everything the frontend can check without the model's
tokenizer is checked first: the shapes of `messages`/`prompt`, the numeric ranges of the sampling
parameters, what the frontend cannot do (`n` above 1: one stream per request), and `max_tokens`
against the context window when the workers said how long it is. Token counts against the window
need the tokenizer and stay the engine's check (the decode worker's answer is relayed as it is).

Errors follow OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with status 400 (404
for an unknown model), and name the field (`param`) and what to send instead. Pure: a dict in, an
`ApiError` or None out.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

# Roles the chat template of common engines accepts.
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MAX_STOP_SEQUENCES = 4  # OpenAI's limit


@dataclasses.dataclass(frozen=True)
class ApiError(Exception):
    """An error a client gets as OpenAI's JSON error, before or instead of any token."""

    message: str
    status: int = 400
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __str__(self) -> str:
        return self.message


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bad(param: str, message: str) -> ApiError:
    return ApiError(f"{param}: {message}", param=param, code="invalid_value")


def _check_messages(messages: Any) -> None:
    if messages is None:
        raise ApiError("messages is required for chat completions: send a list of {role, content} objects",
                       param="messages", code="missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list of {role, content} objects")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _bad(where, "must be an object with role and content")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise _bad(f"{where}.role", f"{role!r} is not a role; use one of {', '.join(sorted(CHAT_ROLES))}")
        content = message.get("content")
        if content is None and role == "assistant" and message.get("tool_calls"):
            continue
        if isinstance(content, str):
            continue
        if isinstance(content, list) and all(isinstance(part, dict) and "type" in part for part in content):
            continue
        raise _bad(f"{where}.content", "must be a string or a list of content parts ({type, ...} objects)")


def _check_prompt(prompt: Any) -> None:
    if prompt is None:
        raise ApiError("prompt is required for completions: send a string, a list of strings or token ids",
                       param="prompt", code="missing_required_parameter")
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt) or all(_is_int(p) and p >= 0 for p in prompt):
            return
        if all(isinstance(p, list) and p and all(_is_int(t) and t >= 0 for t in p) for p in prompt):
            return
    raise _bad("prompt", "must be a string, a non-empty list of strings, or (lists of) non-negative token ids")


def _check_range(body: dict[str, Any], param: str, low: float, high: float) -> None:
    value = body.get(param)
    if value is None:
        return
    if not _is_number(value) or not low <= value <= high:
        raise _bad(param, f"must be a number from {low:g} to {high:g}, got {value!r}")


def validate(body: Any, *, chat: bool, model: str, max_model_len: int | None = None) -> None:
    """Raise `ApiError` for the first thing wrong with `body` (a parsed JSON request), else return."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    requested = body.get("model")
    if requested is not None and requested != model:
        raise ApiError(f"the model {requested!r} is not served here; use {model!r}", status=404, param="model",
                       code="model_not_found")
    if chat:
        _check_messages(body.get("messages"))
    else:
        _check_prompt(body.get("prompt"))
    for param in ("max_tokens", "max_completion_tokens"):
        value = body.get(param)
        if value is None:
            continue
        if not _is_int(value) or value < 1:
            raise _bad(param, f"must be an integer of at least 1, got {value!r}")
        if max_model_len is not None and value >= max_model_len:
            raise _bad(param, f"{value} leaves no room for the prompt in the model's context window of "
                              f"{max_model_len} tokens; ask for fewer")
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise ApiError(f"n: only n=1 is supported (one completion per request), got {n!r}; send n requests instead",
                       param="n", code="unsupported_value")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream", f"must be true or false, got {stream!r}")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise _bad("stream_options", "is only allowed with stream: true")
        if not isinstance(options, dict):
            raise _bad("stream_options", "must be an object such as {\"include_usage\": true}")
    _check_range(body, "temperature", 0.0, 2.0)
    _check_range(body, "top_p", 0.0, 1.0)
    _check_range(body, "presence_penalty", -2.0, 2.0)
    _check_range(body, "frequency_penalty", -2.0, 2.0)
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise _bad("seed", f"must be an integer, got {seed!r}")
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _bad("stop", "must be a string or a list of strings")
        if len(stop) > MAX_STOP_SEQUENCES:
            raise _bad("stop", f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(stop)}")
    logprobs = body.get("logprobs")
    if logprobs is not None:
        if chat and not isinstance(logprobs, bool):
            raise _bad("logprobs", "must be true or false for chat completions (top_logprobs says how many)")
        if not chat and (not _is_int(logprobs) or not 0 <= logprobs <= 20):
            raise _bad("logprobs", "must be an integer from 0 to 20 for completions")
