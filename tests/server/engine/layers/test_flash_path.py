"""The CUDA flash path (layers/flash_attention.py) where no GPU is: what it feeds varlen_attn is
checked against a stand-in that follows varlen_attn's documented semantics; the start-up self-test
turns it on only when it agrees with the reference path, and a path that fails or disagrees
leaves the server answering on the reference path, exactly as before."""

import pytest
import torch

from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.layers import flash_attention
from kvpilot_server.engine.layers.attention import visible_keys
from kvpilot_server.engine.runtime.flash_check import both_attentions

MiB = 1 << 20


def _varlen_standin(q, cache, batch, window, scale, *, shift: int = 0):
    """varlen_attn's contract, densely: sequence i's queries are rows cu[i]..cu[i+1], its keys
    the first seqused[i] of its pages in block-table order, the causal mask aligned to the end
    of its keys, window_size (w - 1, 0) keeping the w keys up to the query's own. `shift`
    moves every query one key later: a plausible bug the self-test must catch."""
    out = torch.empty_like(q)
    cu, used = batch.cu_seq_q.tolist(), batch.seqused_k.tolist()
    for i, length in enumerate(used):
        rows = slice(cu[i], cu[i + 1])
        pages = batch.block_table[i].long()
        keys = cache.k[pages].flatten(0, 1)[:length]
        values = cache.v[pages].flatten(0, 1)[:length]
        n = cu[i + 1] - cu[i]
        positions = torch.arange(length - n, length) + shift
        mask = visible_keys(positions, length, window)
        group = q.shape[1] // keys.shape[1]
        k = keys.repeat_interleave(group, dim=1).transpose(0, 1)
        v = values.repeat_interleave(group, dim=1).transpose(0, 1)
        logits = q[rows].transpose(0, 1) @ k.transpose(1, 2) * (scale or q.shape[-1] ** -0.5)
        weights = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
        out[rows] = (weights @ v).transpose(0, 1)
    return out


def _llm(path) -> LLM:
    return LLM(str(path), kv_cache_bytes=16 * MiB, dtype="float32", max_num_batched_tokens=64)


def _answers(llm: LLM, corpus_ids) -> list[list[int]]:
    # Decodes of several lengths beside chunked prefills, then the same again through the cache.
    prompts = [corpus_ids[i : i + 20 + 37 * i] for i in range(5)]
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts + prompts[:2], greedy)]


@pytest.mark.parametrize("name", ["llama", "mistral-window"])  # full attention; a window of 24
def test_what_the_flash_path_feeds_varlen_gives_the_reference_paths_tokens(
    tiny_dir, corpus_ids, monkeypatch, name
):
    reference = _answers(_llm(tiny_dir(name)), corpus_ids)
    monkeypatch.setattr(flash_attention, "unusable", lambda *args: "")
    monkeypatch.setattr(flash_attention, "attend", _varlen_standin)
    llm = _llm(tiny_dir(name))
    assert llm.engine.runner.flash  # the self-test agreed
    assert _answers(llm, corpus_ids) == reference


def test_a_flash_path_that_fails_or_disagrees_is_never_served(tiny_dir, corpus_ids, monkeypatch):
    reference = _answers(_llm(tiny_dir("mistral-window")), corpus_ids)
    monkeypatch.setattr(flash_attention, "unusable", lambda *args: "")
    # The real varlen_attn on a CPU: its flash kernels are CUDA's, so the self-test's call raises.
    failing = _llm(tiny_dir("mistral-window"))
    assert not failing.engine.runner.flash
    assert _answers(failing, corpus_ids) == reference
    # A path off by one key: it runs, and disagrees.
    monkeypatch.setattr(flash_attention, "attend", lambda *args: _varlen_standin(*args, shift=1))
    wrong = _llm(tiny_dir("mistral-window"))
    assert not wrong.engine.runner.flash
    assert "disagrees" in flash_attention.self_test(lambda: both_attentions(wrong.engine.runner))
    assert _answers(wrong, corpus_ids) == reference
