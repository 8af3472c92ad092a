"""Ref-counted KV blocks with an LRU free queue and prefix caching by chained block hash.

A full block is keyed by the hash of (parent block's hash, its tokens), so a key names a whole
prefix. Freed blocks keep their key until they are handed out again (lazy eviction), so a later
request with the same prefix can revive them.
"""

from collections import OrderedDict
from dataclasses import dataclass

from kvpilot_server.engine.runtime.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    key: int | None = None  # chained hash, set once the block is full and computed
    tokens: tuple[int, ...] = ()  # kept to rule out hash collisions on a hit


def chain_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    return hash((parent, tokens))


def root(seq: Sequence) -> int | None:
    """The parent of a sequence's first block: its LoRA adapter's, so that the same tokens under
    two adapters (or an adapter and the base) never share a block, their K/V being different."""
    return hash(("lora", seq.adapter)) if seq.adapter else None


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in eviction order: the front is evicted first (least recently freed).
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # chained hash -> block id
        self.num_queries = 0
        self.num_hits = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache -------------------------------------------------------------------------

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks covering a leading run of the sequence's full blocks.

        The last token is never served from the cache: the model must run on it to produce logits.
        """
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return []
        hits: list[int] = []
        parent = root(seq)
        for start in range(0, len(seq) - 1 - self.block_size + 1, self.block_size):
            tokens = tuple(seq.token_ids[start : start + self.block_size])
            parent = chain_hash(parent, tokens)
            block_id = self.cached.get(parent)
            if block_id is None or self.blocks[block_id].tokens != tokens:
                break
            hits.append(block_id)
        return hits

    def count_query(self, seq: Sequence, num_hit_blocks: int) -> None:
        """Prefix-cache statistics, in tokens, counted once per admission."""
        self.num_queries += len(seq)
        self.num_hits += num_hit_blocks * self.block_size

    def commit_full_blocks(self, seq: Sequence) -> None:
        """Key every block of seq that is full and computed, so later requests can share it."""
        if not self.enable_prefix_caching:
            return
        # Runs every step for every sequence: start after the blocks keyed in earlier steps.
        start = seq.num_keyed_blocks
        parent = self.blocks[seq.block_table[start - 1]].key if start else root(seq)
        for i in range(start, seq.num_computed_tokens // self.block_size):
            block = self.blocks[seq.block_table[i]]
            if block.key is None:
                tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
                block.key, block.tokens = chain_hash(parent, tokens), tokens
                self.cached.setdefault(block.key, block.block_id)
            parent = block.key
            seq.num_keyed_blocks = i + 1

    # -- allocation ---------------------------------------------------------------------------

    def can_allocate(self, seq: Sequence, num_new_tokens: int, reused: list[int] = ()) -> bool:
        cached_tokens = len(reused) * self.block_size
        total = self.blocks_needed(seq.num_computed_tokens + cached_tokens + num_new_tokens)
        fresh = total - len(seq.block_table) - len(reused)
        revived = sum(1 for b in reused if self.blocks[b].ref_count == 0)
        return fresh + revived <= self.num_free

    def allocate(self, seq: Sequence, num_new_tokens: int, reused: list[int] = ()) -> None:
        """Give seq the blocks it needs to hold num_new_tokens more tokens.

        `reused` are prefix-cache hits taken first; they count as already computed.
        """
        for block_id in reused:
            self._take(block_id)
            seq.block_table.append(block_id)
        if reused:
            seq.num_computed_tokens += len(reused) * self.block_size
            seq.num_cached_tokens = len(reused) * self.block_size
        needed = self.blocks_needed(seq.num_computed_tokens + num_new_tokens)
        while len(seq.block_table) < needed:
            block_id = next(iter(self.free))
            self._evict(block_id)
            self._take(block_id)
            seq.block_table.append(block_id)

    def free_seq(self, seq: Sequence) -> None:
        """Drop seq's references. Tail blocks queue first, so a shared prefix outlives its tail."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[block_id] = None
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_keyed_blocks = 0

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free[block_id]
        block.ref_count += 1

    def _evict(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.key is not None and self.cached.get(block.key) == block_id:
            del self.cached[block.key]
        block.key, block.tokens = None, ()
