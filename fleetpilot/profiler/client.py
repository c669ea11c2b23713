"""The profiler's client: bursts of timed streaming completions against any OpenAI-compatible endpoint.

Where it sits: below `cli`, above the pure `sweep`. A burst is a replay (`fleetpilot.replay.client`) whose
requests all arrive at once: the same streamed `/v1/completions` with `stream_options.include_usage`, the
same timing of every chunk that carries text, the same prompts of random common words
(`fleetpilot.replay.prompts`, a fresh draw per request and burst, so no prompt shares a prefix with
another and a prefix cache cannot shorten a prefill), the same `ignore_eos` and `min_tokens` (vLLM's
sampling extensions) for outputs of exactly `max_tokens`. Beyond the OpenAI API it reads, where the
server has them, vLLM's `/tokenize` (how many tokens a word of those prompts is) and `/metrics`
(`vllm:cache_config_info` and `vllm:kv_cache_usage_perc`, for the KV capacity).
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fleetpilot import traces
from fleetpilot.profiler import sweep
from fleetpilot.replay import client as replay_client
from fleetpilot.replay import prompts


class EndpointError(RuntimeError):
    """The endpoint refused or broke a request: the sweep cannot go on."""


class Client:
    """Timed bursts against one endpoint (`base_url`, with or without `/v1`), for one served model."""

    def __init__(self, base_url: str, *, model: str, timeout_s: float = 600.0, api_key: str | None = None,
                 metrics_url: str | None = None) -> None:
        self.base_url = replay_client.base_url(base_url)
        # Where the engine's Prometheus metrics are: the endpoint itself for one vLLM server; one of its
        # workers when the endpoint is a router that exports only its own.
        self.metrics_url = replay_client.base_url(metrics_url or self.base_url) + "/metrics"
        self.model = model
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), headers=headers,
                                       limits=httpx.Limits(max_connections=None, max_keepalive_connections=512))
        self.tokens_per_word = 1.0
        # vLLM's min_tokens/ignore_eos make every output exactly max_tokens long; a server that refuses
        # unknown fields (Hugging Face's `transformers serve`, strict OpenAI clones) gets neither.
        self.length_extensions = True
        self._bursts = 0

    async def aclose(self) -> None:
        await self._http.aclose()

    async def probe_length_extensions(self) -> bool:
        """Whether the endpoint takes vLLM's `min_tokens`/`ignore_eos`: one short completion with them, and if
        it is refused with a client error, one without. False (and they are dropped from then on) only when
        the second answers where the first was refused; any other failure is the endpoint's, for `burst`."""
        request = traces.Request(0.0, 4, 2)
        prompt = prompts.build_prompt(request, salt=0, seed=0)
        url = self.base_url + "/v1/completions"

        async def refused(extensions: bool) -> bool:
            body = replay_client.request_body(request, model=self.model, prompt=prompt, stream=False,
                                              length_extensions=extensions)
            try:
                answer = await self._http.post(url, json=body)
            except httpx.HTTPError:
                return False
            return 400 <= answer.status_code < 500

        if await refused(True) and not await refused(False):
            self.length_extensions = False
        return self.length_extensions

    async def calibrate(self) -> None:
        """Tokens per prompt word, from vLLM's `/tokenize` (the simulator serves it too); without it, one:
        the prompt words are one token each in the usual BPE vocabularies."""
        sample = prompts.build_prompt(traces.Request(0.0, 1000, 1), salt=0, seed=0)
        try:
            answer = await self._http.post(self.base_url + "/tokenize", json={"model": self.model, "prompt": sample})
            count = answer.json().get("count") if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            count = None
        if isinstance(count, int) and count > 0:
            self.tokens_per_word = count / 1000

    async def burst(self, prompt_tokens: int, count: int, *, max_tokens: int) -> tuple[list[sweep.Stream], list[float]]:
        """`count` requests of about `prompt_tokens` prompt tokens sent together: each one's token times, and
        when each was sent relative to the first. Raises EndpointError when any failed."""
        self._bursts += 1
        words = max(1, round(prompt_tokens / self.tokens_per_word))
        requests = [traces.Request(0.0, words, max_tokens)] * count
        results = await replay_client.replay(requests, url=self.base_url, model=self.model, timeout_s=self.timeout_s,
                                             prompt_seed=self._bursts, client=self._http,
                                             length_extensions=self.length_extensions)
        failed = [r for r in results if r.status != "ok" or not r.token_times_s]
        if failed:
            raise EndpointError(f"{self.base_url}: {len(failed)} of {count} requests failed: "
                                f"{failed[0].error or 'no text streamed'}")
        first = min(r.start_s for r in results)
        return [sweep.Stream(tuple(r.token_times_s)) for r in results], [r.start_s - first for r in results]

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
