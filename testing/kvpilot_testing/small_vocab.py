"""A byte-level BPE tokenizer trained in the test run on a few kilobytes of text, with the
bundled model's special tokens and chat template: tiny models built on it have a vocabulary of
hundreds, not 49,152, so sampling and grammar masks on them cost little. Structured-output tests
run thousands of samples on it; it decodes any byte string, so every grammar stays reachable."""

import json
import shutil
from pathlib import Path

from kvpilot_testing.corpus import CORPUS

VOCAB_SIZE = 512
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# JSON and tool-call text, so that its punctuation gets tokens of its own as in real vocabularies.
_EXTRA = (
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    "<tool_call>\n</tool_call>\n<think>\n</think>\n[TOOL_CALLS] "
    '[{"x": 1, "y": -2.5, "ok": true, "tags": ["a", "b"], "note": null}]\n'
)


def build_small_vocab_tokenizer(target: Path, template_dir: Path) -> Path:
    """Train the tokenizer into target (once), copying template_dir's chat template."""
    if (target / "tokenizer.json").is_file():
        return target
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([CORPUS, _EXTRA * 20], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    fast.save_pretrained(tmp)
    template = (template_dir / "chat_template.jinja").read_text()
    (tmp / "chat_template.jinja").write_text(template)
    config = json.loads((tmp / "tokenizer_config.json").read_text())
    (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    tmp.replace(target)
    return target
