"""Prompts to checked token ids: chat templates, tokenization, id ranges and the context window.

Touches no engine state, so the server runs it on worker threads instead of the event loop or
the engine thread (tokenizing megabytes takes seconds). The fast tokenizer is shared: encoding
and decoding only read it, and its Rust core releases the GIL while it works.
"""

import math
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from kvpilot_common.errors import ContextOverflowError, InvalidRequestError
from kvpilot_server.sampling_params import SamplingParams

Message = dict[str, Any]


class InputProcessor:
    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, max_model_len: int
    ) -> None:
        self.tokenizer, self.vocab_size, self.max_model_len = tokenizer, vocab_size, max_model_len
        # No token stands for more characters than its vocabulary string has (byte-level BPE:
        # one character per byte), so a text of L characters has at least L / this many tokens.
        self.max_token_chars = max(len(t) for t in tokenizer.get_vocab())

    def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        variables: dict[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of a conversation in the model's own chat template, ready to generate
        (tools: OpenAI tool entries, for a template that renders them; variables: more of the
        template's own, such as enable_thinking)."""
        try:
            encoded = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
                **(variables or {}),
            )
        except TemplateError as exc:  # templates raise on what they do not accept (role order)
            raise InvalidRequestError(f"The chat template rejected the messages: {exc}") from exc
        return list(encoded["input_ids"])

    def encode(self, prompt: str | list[int]) -> list[int]:
        """Token ids of a prompt (text, or ids checked against the vocabulary); never empty."""
        if isinstance(prompt, str):
            token_ids = self.tokenizer(prompt).input_ids
        else:
            token_ids = list(prompt)
            self.check_ids(token_ids, "prompt")
        if not token_ids:
            raise InvalidRequestError("The prompt is empty", "prompt")
        return token_ids

    def decode(self, token_ids: list[int]) -> str:
        self.check_ids(token_ids, "tokens")
        return self.tokenizer.decode(token_ids)

    def check_ids(self, token_ids: list[int], param: str) -> None:
        bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"Token ids must be integers in [0, {self.vocab_size}); got {bad[:5]}", param
            )

    def max_tokens(self, prompt_len: int, params: SamplingParams) -> int:
        """Completion tokens the request may produce; a 400 if the context cannot hold them."""
        room = self.max_model_len - prompt_len
        if room < 1 or (params.max_tokens is not None and params.max_tokens > room):
            raise ContextOverflowError(self.max_model_len, prompt_len, params.max_tokens)
        return params.max_tokens or room

    def check_prompt_length(self, prompt_len: int) -> None:
        """An input that is only read (an embedding's) may fill the whole context."""
        if prompt_len > self.max_model_len:
            raise InvalidRequestError(
                f"This model's maximum context length is {self.max_model_len} tokens, but the "
                f"input has {prompt_len} tokens. Please shorten the input.",
                "input",
            )

    def min_tokens(self, chars: int) -> int:
        """A lower bound on the tokens of a text of `chars` characters."""
        return math.ceil(chars / self.max_token_chars)

    def check_length(self, chars: int, max_tokens: int | None) -> None:
        """Refuse, before tokenizing it, a text too long to leave room for even one completion
        token whatever its tokens: the cost of tokenizing a request stays bounded by the
        context, not by the body size. Shorter texts get the exact check after tokenizing."""
        least = self.min_tokens(chars)
        if least + 1 > self.max_model_len:
            raise ContextOverflowError(self.max_model_len, least, max_tokens, at_least=True)
