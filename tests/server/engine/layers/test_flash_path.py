"""The CUDA flash path (layers/flash_attention.py) where no GPU is: what it feeds varlen_attn is
checked against a stand-in that follows varlen_attn's documented semantics; the start-up self-test
turns it on only when it agrees with the reference path, and a path that fails or disagrees
leaves the server answering on the reference path, exactly as before."""

import pytest

from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.layers import flash_attention
from kvpilot_server.engine.runtime.flash_check import both_attentions
from kvpilot_testing.varlen_standin import varlen_standin

MiB = 1 << 20


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
    monkeypatch.setattr(flash_attention, "attend", varlen_standin)
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
    monkeypatch.setattr(flash_attention, "attend", lambda *args: varlen_standin(*args, shift=1))
    wrong = _llm(tiny_dir("mistral-window"))
    assert not wrong.engine.runner.flash
    assert "disagrees" in flash_attention.self_test(lambda: both_attentions(wrong.engine.runner))
    assert _answers(wrong, corpus_ids) == reference
