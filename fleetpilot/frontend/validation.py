"""Validate an OpenAI request before any worker sees it, and say what is wrong the way OpenAI does.

Why here: in a disaggregated graph the prefill worker gets the prompt with `max_tokens: 1` and does
the expensive part before the decode worker reads the rest of the request; a request that decode then
refuses has cost a full prefill and a KV cache. Everything the frontend can check without the model's
tokenizer is checked first: the shapes of `messages`/`prompt`, the numeric ranges of the sampling
parameters, what the frontend cannot do (`n` above 1: one stream per request), and `max_tokens`
against the context window when the workers said how long it is. Prompt + `max_tokens` against the
window needs the model's tokenizer: `prompt_token_bound` says, without one, when a request surely
fits, and only the others are counted by a worker's `/tokenize` (the frontend's part) and judged
by `check_context`.

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
# What a chat template adds around the text: role headers and separators per message, BOS and the
# generation prompt once. Generous for the templates of common models (Llama 3: 5 per message).
TEMPLATE_TOKENS_PER_MESSAGE = 8
TEMPLATE_TOKENS_FIXED = 16


@dataclasses.dataclass(frozen=True)
class ApiError(Exception):
    """An error a client gets as OpenAI's JSON error, before or instead of any token."""

    message: str
    status: int = 400
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    retry_after_s: int | None = None  # a 503 worth retrying: the Retry-After header, in seconds

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


def message_text(content: Any) -> str:
    """A chat message's text: the string, or its text parts joined (images and other parts carry none)."""
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def completion_budget(body: dict[str, Any], *, chat: bool) -> tuple[str, int] | None:
    """The output length a (validated) request asks for and the field that asks it, or None when it
    leaves it to the engine (whose default fits the window by construction)."""
    for param in ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",):
        value = body.get(param)
        if isinstance(value, int) and not isinstance(value, bool):
            return param, value
    return None


def prompt_token_bound(body: dict[str, Any], *, chat: bool) -> int:
    """An upper bound of the prompt's tokens without the tokenizer: byte-level BPE and SentencePiece
    with byte fallback never make more tokens than the text has UTF-8 bytes, and a chat template adds
    a few per message. Token-id prompts are counted exactly."""
    if chat:
        messages = body.get("messages") or []
        text_bytes = 0
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            text_bytes += len(message_text(content).encode())
        return text_bytes + TEMPLATE_TOKENS_PER_MESSAGE * len(messages) + TEMPLATE_TOKENS_FIXED
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(len(p) if isinstance(p, list) else len(str(p).encode()) for p in prompt) + TEMPLATE_TOKENS_FIXED
    return len(str(prompt or "").encode()) + TEMPLATE_TOKENS_FIXED


def check_context(prompt_tokens: int, max_tokens: int, window: int, *, chat: bool,
                  budget_param: str = "max_tokens") -> None:
    """Raise OpenAI's `context_length_exceeded` when the prompt and the output it asks for do not fit
    the model's context window; `param` names what to change (the prompt when it alone is too long)."""
    if prompt_tokens + max_tokens <= window:
        return
    prompt_param = "messages" if chat else "prompt"
    if prompt_tokens >= window:
        raise ApiError(f"{prompt_param}: this model's context window is {window} tokens and the prompt alone "
                       f"takes {prompt_tokens}; shorten it", param=prompt_param, code="context_length_exceeded")
    raise ApiError(f"{budget_param}: this model's context window is {window} tokens; the prompt takes "
                   f"{prompt_tokens}, so at most {window - prompt_tokens} are left for the output, and "
                   f"{max_tokens} were asked for; ask for fewer or shorten the prompt", param=budget_param,
                   code="context_length_exceeded")
