"""Incremental detokenization and stop strings.

Text is decoded over a short sliding window of tokens so each step costs O(1), and a piece that
ends in U+FFFD (an incomplete UTF-8 sequence) is held back until the character completes. Text
that could still be the start of a stop string is also held back, so a stream never shows
characters that later turn out to belong to a stop string.
"""

import functools

from transformers import PreTrainedTokenizerBase

# Prompt tokens decoded in front of the output so that tokenizers which drop a leading space
# on the first token (SentencePiece) still produce the right first piece.
_PROMPT_CONTEXT = 5


class Detokenizer:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_ids: list[int],
        stop: list[str],
        include_stop: bool = False,
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-_PROMPT_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.stop = stop
        self.include_stop = include_stop
        self.skip_special_tokens = skip_special_tokens
        self.text = ""  # completion text so far, held-back tail included
        self.emitted = 0  # characters of self.text already handed out
        self.stop_reason: str | None = None

    def add(self, token_id: int) -> str:
        """Append one token; return the newly releasable text."""
        self.ids.append(token_id)
        piece = self._decode_piece()
        if not piece:
            return ""
        search_from = max(0, len(self.text) - self._longest_stop() + 1)
        self.text += piece
        if self.stop and self._find_stop(search_from):
            return self.flush()
        return self._release(len(self.text) - self._held_back())

    def flush(self) -> str:
        """Release everything (the request is finishing)."""
        return self._release(len(self.text))

    def _decode_piece(self) -> str:
        decode = self.tokenizer.decode
        skip = self.skip_special_tokens
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=skip)
        full = decode(self.ids[self.prefix_offset :], skip_special_tokens=skip)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(prefix) :]

    def _find_stop(self, search_from: int) -> bool:
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, search_from)) >= 0]
        if not hits:
            return False
        index, stop = min(hits)
        self.text = self.text[: index + len(stop) if self.include_stop else index]
        self.stop_reason = stop
        return True

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string:
        one set lookup per candidate length, whatever the number of stop strings."""
        prefixes = _proper_prefixes(tuple(self.stop))
        for n in range(min(len(self.text), self._longest_stop() - 1), 0, -1):
            if self.text[-n:] in prefixes:
                return n
        return 0

    def _longest_stop(self) -> int:
        return max((len(s) for s in self.stop), default=0)

    def _release(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        piece, self.emitted = self.text[self.emitted : upto], upto
        return piece


@functools.lru_cache(maxsize=8)  # the n choices of a request share their stop strings
def _proper_prefixes(stop: tuple[str, ...]) -> frozenset[str]:
    return frozenset(s[:k] for s in stop for k in range(1, len(s)))
