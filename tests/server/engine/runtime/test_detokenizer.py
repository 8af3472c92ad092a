"""Incremental detokenization: pieces concatenate to the full decode, characters never split."""

import pytest
from transformers import AutoTokenizer

from kvpilot_server.engine.runtime.detokenizer import Detokenizer

TEXTS = [
    "Plain ASCII, with punctuation: done.",
    "Emoji 🚀🔥 and accents café naïve — dashes…",
    "漢字とかなの混ざった文章です。中文也可以。",
    "Math ∑ x² ≤ ∞, Ελληνικά, русский текст.",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return AutoTokenizer.from_pretrained(smollm2)


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_concatenate_to_full_decode(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False).input_ids
    prompt = tokenizer("Say:").input_ids
    detok = Detokenizer(tokenizer, prompt, stop=[])
    pieces = [detok.add(t) for t in ids] + [detok.flush()]
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)
    assert (
        any(len(tokenizer.decode([t])) == 0 or "\ufffd" in tokenizer.decode([t]) for t in ids)
        or text.isascii()
    )  # the multi-byte texts really do split characters across tokens


def test_text_that_may_start_a_stop_string_is_held_back(tokenizer):
    ids = tokenizer("The answer is 42. END of story", add_special_tokens=False).input_ids
    detok = Detokenizer(tokenizer, [], stop=["END of"])
    shown = ""
    for token in ids:
        shown += detok.add(token)
        assert "END" not in shown
        if detok.stop_reason:
            break
    assert shown + detok.flush() == "The answer is 42. " and detok.stop_reason == "END of"
