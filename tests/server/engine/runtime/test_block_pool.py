"""BlockPool: ref counts, LRU reuse order, prefix hits by chained hash."""

from kvpilot_server.engine.runtime.block_pool import BlockPool
from kvpilot_server.engine.runtime.sequence import Sequence
from kvpilot_server.sampling_params import SamplingParams


def _seq(tokens: list[int]) -> Sequence:
    return Sequence("r", list(tokens), SamplingParams(), max_tokens=8)


def _run_prefill(pool: BlockPool, seq: Sequence) -> None:
    hits = pool.match_prefix(seq)
    n = len(seq) - len(hits) * pool.block_size
    assert pool.can_allocate(seq, n, hits)
    pool.allocate(seq, n, hits)
    seq.num_computed_tokens += n
    pool.commit_full_blocks(seq)


def test_allocate_and_free_return_every_block():
    pool = BlockPool(num_blocks=8, block_size=4)
    seq = _seq(range(10))
    _run_prefill(pool, seq)
    assert len(seq.block_table) == 3 and pool.num_free == 5
    assert all(pool.blocks[b].ref_count == 1 for b in seq.block_table)
    pool.free_seq(seq)
    assert pool.num_free == 8 and all(b.ref_count == 0 for b in pool.blocks)


def test_shared_prefix_is_reused_with_ref_counts():
    pool = BlockPool(num_blocks=8, block_size=4)
    first, second = _seq([*range(8), 50, 51]), _seq([*range(8), 60])
    _run_prefill(pool, first)
    _run_prefill(pool, second)
    assert second.block_table[:2] == first.block_table[:2]
    assert second.num_cached_tokens == 8
    assert [pool.blocks[b].ref_count for b in first.block_table[:2]] == [2, 2]
    pool.free_seq(first)
    pool.free_seq(second)
    assert pool.num_free == 8


def test_freed_prefix_is_revived_until_evicted():
    pool = BlockPool(num_blocks=4, block_size=4)
    first = _seq([*range(8), 99])
    _run_prefill(pool, first)
    pool.free_seq(first)
    again = _seq([*range(8), 98])
    assert len(pool.match_prefix(again)) == 2
    # Fill the whole pool with other tokens: the cached prefix must be evicted.
    other = _seq(range(100, 116))
    _run_prefill(pool, other)
    pool.free_seq(other)
    assert pool.match_prefix(again) == []


def test_last_token_is_never_served_from_cache():
    pool = BlockPool(num_blocks=8, block_size=4)
    first = _seq(range(8))
    _run_prefill(pool, first)
    assert len(pool.match_prefix(_seq(range(8)))) == 1  # the last full block must be recomputed


def test_tail_blocks_are_evicted_before_the_shared_head():
    pool = BlockPool(num_blocks=3, block_size=2)
    seq = _seq(range(6))
    _run_prefill(pool, seq)
    head, tail = seq.block_table[0], seq.block_table[-1]
    pool.free_seq(seq)
    newcomer = _seq([70, 71, 72])
    pool.allocate(newcomer, 1)
    assert newcomer.block_table == [tail] and head in pool.free


def test_prefix_caching_off_never_hits():
    pool = BlockPool(num_blocks=8, block_size=4, enable_prefix_caching=False)
    first = _seq([*range(8), 1])
    _run_prefill(pool, first)
    assert pool.match_prefix(_seq([*range(8), 2])) == [] and not pool.cached
