"""The profiler's client: timed streaming completions against any OpenAI-compatible endpoint.

Where it sits: below `cli`, above the pure `sweep`. It speaks only the OpenAI API (`/v1/completions`,
streamed, `stream_options.include_usage`) and, where the server has them, vLLM's `/tokenize` (to make
prompts of an exact token count) and `/metrics` (`vllm:cache_config_info` and `vllm:kv_cache_usage_perc`
for the KV capacity). vLLM's own sampling extensions `ignore_eos` and `min_tokens` make every request
produce exactly `max_tokens`; an engine that ignores them and stops early shortens a stream, which the
decode window then sees.

Prompts are random words, a fresh draw per request, so no prompt shares a prefix with another and a
prefix cache cannot shorten a prefill. Words per token are measured once with `/tokenize` (else from
the first response's usage) and prompts are sized by that ratio.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fleetpilot.profiler import sweep

# Short common words: one token each in most tokenizers, so a prompt's length is easy to aim.
_WORDS = ["time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school", "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week", "company", "system", "program", "question", "work", "government", "number", "night", "point", "home", "water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study", "book", "eye", "job", "word", "business", "issue", "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game", "line", "end", "member", "law", "car", "city", "community", "name", "president", "team", "minute", "idea", "kid", "body", "information", "back", "parent", "face", "others", "level", "office", "door", "health", "person", "art", "war", "history", "party", "result", "change", "morning", "reason", "research", "girl", "guy", "moment", "air", "teacher", "force", "education"]


class EndpointError(RuntimeError):
    """The endpoint refused or broke a request: the sweep cannot go on."""


class Client:
    """Timed requests to one endpoint (`base_url` without `/v1`), for one served model."""

    def __init__(self, base_url: str, *, model: str, timeout_s: float = 600.0, seed: int = 0,
                 api_key: str | None = None, metrics_url: str | None = None) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        # Where the engine's Prometheus metrics are: the endpoint itself for one vLLM server; one of its
        # workers when the endpoint is a router that exports only its own.
        self.metrics_url = (metrics_url or self.base_url).rstrip("/") + "/metrics"
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=httpx.Timeout(timeout_s, connect=10.0),
                                       limits=httpx.Limits(max_connections=None, max_keepalive_connections=512),
                                       headers=headers)
        self._random = random.Random(seed)
        self.tokens_per_word = 1.0

    async def aclose(self) -> None:
        await self._http.aclose()

    def prompt(self, tokens: int) -> str:
        """Random words that the server counts as about `tokens` tokens."""
        words = max(1, round(tokens / self.tokens_per_word))
        return " ".join(self._random.choice(_WORDS) for _ in range(words))

    async def calibrate(self) -> None:
        """Measure tokens per word with `/tokenize` (vLLM's; the simulator serves it), else from usage."""
        sample = " ".join(self._random.choice(_WORDS) for _ in range(1000))
        try:
            answer = await self._http.post("/tokenize", json={"model": self.model, "prompt": sample})
            if answer.status_code == 200 and answer.json().get("count"):
                self.tokens_per_word = int(answer.json()["count"]) / 1000
                return
        except (httpx.HTTPError, ValueError):
            pass
        stream = await self.stream(sample, max_tokens=1)
        if stream.prompt_tokens:
            self.tokens_per_word = stream.prompt_tokens / 1000

    async def stream(self, prompt: str, *, max_tokens: int) -> sweep.Stream:
        """One streamed completion: each token's arrival, seconds after sending, and the prompt's tokens."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": 0.0,
                "ignore_eos": True, "min_tokens": max_tokens}
        times: list[float] = []
        prompt_tokens: int | None = None
        started = time.perf_counter()
        async with self._http.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:500]
                raise EndpointError(f"POST {self.base_url}/v1/completions: {response.status_code} {text}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise EndpointError(f"{self.base_url}: {chunk['error']}")
                if chunk.get("usage"):
                    prompt_tokens = chunk["usage"].get("prompt_tokens")
                for choice in chunk.get("choices") or []:
                    if choice.get("text"):
                        times.append(time.perf_counter() - started)
        if not times:
            raise EndpointError(f"{self.base_url}: a completion of {max_tokens} tokens streamed no text")
        return sweep.Stream(tuple(times), prompt_tokens)

    async def burst(self, prompts: Sequence[str], *, max_tokens: int) -> tuple[list[sweep.Stream], list[float]]:
        """Send the prompts together; their streams and when each was sent, relative to the first."""
        origin = time.perf_counter()

        async def one(prompt: str) -> tuple[sweep.Stream, float]:
            sent = time.perf_counter() - origin
            return await self.stream(prompt, max_tokens=max_tokens), sent

        done = await asyncio.gather(*(one(p) for p in prompts))
        return [stream for stream, _ in done], [sent for _, sent in done]

    async def metric(self, name: str) -> list[tuple[dict[str, str], float]]:
        """The samples of one metric from the server's `/metrics` (labels, value); [] when it has none."""
        try:
            answer = await self._http.get(self.metrics_url)
        except httpx.HTTPError:
            return []
        if answer.status_code != 200:
            return []
        try:
            families = list(text_string_to_metric_families(answer.text))
        except ValueError:
            return []
        return [(dict(sample.labels), float(sample.value)) for family in families for sample in family.samples
                if sample.name == name]
