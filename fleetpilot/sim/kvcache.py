"""The simulator's paged KV cache, with automatic prefix caching as vLLM's V1 engine does it.

Where it sits: below `scheduler.Scheduler`, which asks it for blocks when it admits a request or a
decode crosses a block boundary, and gives them back when a request finishes, is preempted or is
cancelled. Pure: no clock, no I/O.

Prefix caching (vLLM's `KVCacheManager` and `BlockPool` semantics, not its code):

- A request's prompt is cut into blocks of `block_size` tokens; only *full* blocks have a hash. A
  block's hash chains its parent's (the block before it; `ROOT_HASH` for the first) with the block's
  token ids (`block_hashes`), so a hash names the whole prefix up to the end of its block: the same
  sixteen tokens after a different prefix are a different block.
- Once a full block of a prompt has been scheduled for computing, the scheduler registers it under its
  hash (`cache`); another request whose prompt starts with the same blocks finds them
  (`longest_hit`: the longest run of leading hashes that are cached) and takes a reference to them
  (`touch`) instead of computing them again. The scheduler computes at least the prompt's last token,
  so a prompt that hits in full still recomputes its last block (vLLM does the same: its hit length is
  capped at the prompt length − 1 and rounded down to whole blocks).
- A block is referenced by every running request that uses it. When its last reference goes
  (`release`), it joins the *end* of the free queue but keeps its hash: it is free, counts as free
  for admission and in `vllm:kv_cache_usage_perc`, and can still be hit. `allocate` takes blocks from
  the *front* of the queue, least recently freed first, and only then forgets their hash (an
  eviction). A request's blocks are released last block first, so the private end of a prompt is
  evicted before the shared head. A referenced block is never in the queue, so it is never evicted.
- One block per hash: when a block is registered under a hash that another block already holds (two
  requests computed the same prefix side by side), the second stays unnamed and is simply reused once
  freed (vLLM keeps both; the difference only shows as an earlier eviction of the duplicate).

With caching off (`caching=False`) nothing is registered and nothing hits: plain paging.
"""

from __future__ import annotations

import array
import collections
import hashlib
from collections.abc import Iterable, Sequence

#: A block's hash: a digest of its parent's hash and its token ids.
BlockHash = bytes
#: The parent of a prompt's first block (vLLM's NONE_HASH; a constant here, so hashes are the same in
#: every process).
ROOT_HASH: BlockHash = bytes(16)


def _blocks_as_bytes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Each full block's token ids as bytes: 8 per id, or as text for ids beyond 64 bits (a client's
    token-id prompt may hold anything)."""
    full = len(token_ids) - len(token_ids) % block_size
    try:
        packed = array.array("q", token_ids[:full]).tobytes()
    except OverflowError:
        return [",".join(map(str, token_ids[i:i + block_size])).encode() for i in range(0, full, block_size)]
    width = 8 * block_size
    return [packed[i:i + width] for i in range(0, len(packed), width)]


def block_hashes(token_ids: Sequence[int], block_size: int) -> tuple[BlockHash, ...]:
    """The chained hashes of the full blocks of `token_ids`; a partial last block has none."""
    hashes: list[BlockHash] = []
    parent = ROOT_HASH
    for block in _blocks_as_bytes(token_ids, block_size):
        parent = hashlib.blake2b(parent + block, digest_size=16).digest()
        hashes.append(parent)
    return tuple(hashes)


class BlockPool:
    """Numbered KV blocks with reference counts, a least-recently-freed queue and a hash → block map.

    `free` counts every unreferenced block, cached or not: what an admission can have. A caller holds
    a list of block ids per request and hands it to `release`, which empties it.
    """

    def __init__(self, num_blocks: int, *, caching: bool = True) -> None:
        self.total = num_blocks
        self.caching = caching
        self.evictions = 0  # cached blocks whose hash was dropped to reuse the block
        self._refs = [0] * num_blocks
        # Unreferenced blocks, least recently freed first; values unused (an ordered set).
        self._free: collections.OrderedDict[int, None] = collections.OrderedDict.fromkeys(range(num_blocks))
        self._hash_of: dict[int, BlockHash] = {}
        self._block_of: dict[BlockHash, int] = {}

    @property
    def free(self) -> int:
        """Blocks no request references: empty ones and cached ones that may be evicted."""
        return len(self._free)

    @property
    def cached(self) -> int:
        """Blocks that hold a hash (referenced or not)."""
        return len(self._hash_of)

    def allocate(self, n: int) -> list[int] | None:
        """`n` blocks, least recently freed first (evicting their hashes), or None when fewer are free."""
        if n > len(self._free):
            return None
        blocks = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            cached = self._hash_of.pop(block, None)
            if cached is not None:
                del self._block_of[cached]
                self.evictions += 1
            self._refs[block] = 1
            blocks.append(block)
        return blocks

    def release(self, blocks: list[int]) -> None:
        """Drop one reference to each block, the last block first; a block nobody references any more
        joins the end of the free queue, keeping its hash. Empties `blocks`."""
        for block in reversed(blocks):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free[block] = None
        blocks.clear()

    def longest_hit(self, hashes: Iterable[BlockHash]) -> list[int]:
        """The cached blocks of the longest run of leading `hashes` (none when caching is off); they
        are not referenced yet: `touch` them to use them."""
        hit: list[int] = []
        if not self.caching:
            return hit
        for block_hash in hashes:
            block = self._block_of.get(block_hash)
            if block is None:
                break
            hit.append(block)
        return hit

    def evictable(self, blocks: Iterable[int]) -> int:
        """How many of `blocks` are unreferenced: touching them takes that many from `free`."""
        return sum(1 for block in blocks if self._refs[block] == 0)

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference to each of `blocks` (a prefix hit); an unreferenced one leaves the free queue."""
        for block in blocks:
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1

    def cache(self, block: int, block_hash: BlockHash) -> None:
        """Name a full, computed block by its hash, so later prompts can hit it (no-op with caching
        off, or when another block already holds the hash)."""
        if not self.caching or block_hash in self._block_of or block in self._hash_of:
            return
        self._hash_of[block] = block_hash
        self._block_of[block_hash] = block
