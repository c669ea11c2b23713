"""Between the trace and the client: the prompt text for one request, built when it is sent.

A trace gives token counts, not text. A prompt here is `input_tokens` words drawn from a fixed
vocabulary of short, common English words, each of which is a single token in the usual BPE
vocabularies (Llama 3, Qwen, GPT), so the engine sees about `input_tokens` prompt tokens.

The text is cut into 512-word blocks, one per Mooncake prefix block. A block with a hash id is a
function of that id alone, so requests whose leading hash ids are equal have equal leading text and
a prefix cache or a prefix-aware router sees exactly the sharing the trace recorded; after the first
different id the texts differ. Blocks without a hash id (the Azure trace, synthesised requests, a
tail beyond the listed ids) are a function of the request's own `salt`, so unrelated requests do
not share a prefix by accident. Pure and deterministic: the same (request, salt, seed) gives the
same text in every process.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from fleetpilot import traces

# Lower-case, common and short: one token each, with the leading space, in the tokenizers we serve.
_WORDS = """
    time year people way day man thing woman life child world school state family student group
    country problem hand part place case week company system program question work government number
    night point home water room mother area money story fact month lot right study book eye job word
    business issue side kind head house service friend father power hour game line end member law car
    city name team minute idea kid body back parent face others level office door health person art war
    history party result change morning reason research girl guy moment air teacher force education
    foot boy age policy music market sense nation plan college interest death experience effect use
    class control care field development role effort rate heart drug show leader light voice wife
    police mind price report decision son view relationship town road arm difference value building
    action model season society tax director position player record paper space ground form event
    official matter center couple site project activity star table need court oil situation cost
    industry figure street image phone data picture practice piece land product doctor wall patient
    worker news test movie north love support technology step baby computer type attention film tree
    source organization hair window evidence population truth song energy period course bank range
    blue green red black white small large long short high low good new old great big little early
    late young open clear simple strong free full hard easy fast slow warm cold bright dark quiet
"""
VOCABULARY: tuple[str, ...] = tuple(_WORDS.split())
_WORD_ARRAY = np.array(VOCABULARY, dtype=object)  # object, not "<U": indexing then hands back the same str
_HASHED, _OWN = 1, 2  # the two kinds of block key, kept apart in the seed


@functools.lru_cache(maxsize=4096)
def _block(seed: int, kind: int, key: int, position: int) -> tuple[str, tuple[str, ...]]:
    """One block's 512 words, joined and as a tuple (to cut a partial last block).

    Cached because shared prefixes recur across a trace: Mooncake's first block is shared by most.
    """
    # SHAKE-128 as a fast, platform-independent stream of little-endian 16-bit picks (the modulo's
    # bias of < 0.4 % toward some words does not matter for filler text)
    stream = hashlib.shake_128(f"{seed}:{kind}:{key}:{position}".encode()).digest(2 * traces.BLOCK_TOKENS)
    words = tuple(_WORD_ARRAY[np.frombuffer(stream, dtype="<u2") % len(VOCABULARY)].tolist())
    return " ".join(words), words


def build_prompt(request: traces.Request, *, salt: int, seed: int = 0) -> str:
    """About `request.input_tokens` tokens of text, block i from hash id i when the request has one.

    `salt` (the request's index in the replay) makes the blocks without a hash id unique to the
    request; `seed` changes every block, for a run that must not hit a cache warmed by the last one.
    """
    words = max(request.input_tokens, 1)
    hash_ids = request.hash_ids or ()
    parts = []
    for index in range((words + traces.BLOCK_TOKENS - 1) // traces.BLOCK_TOKENS):
        if index < len(hash_ids):
            text, block = _block(seed, _HASHED, hash_ids[index], 0)
        else:
            text, block = _block(seed, _OWN, salt, index)
        count = min(traces.BLOCK_TOKENS, words - index * traces.BLOCK_TOKENS)
        parts.append(text if count == traces.BLOCK_TOKENS else " ".join(block[:count]))
    return " ".join(parts)
