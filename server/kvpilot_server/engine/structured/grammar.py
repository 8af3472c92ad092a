"""A request's constraint (JSON schema, regex, choice, grammar) as a compiled llguidance grammar.

Compiled once per distinct constraint: the cache is keyed by the constraint's canonical hash and
bounded, and keeps refusals too, so a client repeating a hostile schema is refused at once. A
Grammar holds a template matcher; each sequence starts from a copy of it, which costs far less
than building the grammar again. Building can take long for a large schema (llguidance drops the
GIL meanwhile): the server runs compile() off the engine thread, under a deadline, and
llguidance's parser limits bound both the build and every later step's mask.

JSON is generated as Python's json.dumps writes it (", " and ": ", no other whitespace): models
read and write that form, and a random or weak model cannot loop on whitespace forever.
"""

import json
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf
from transformers import PreTrainedTokenizerBase

from kvpilot_common.errors import InvalidRequestError
from kvpilot_server.sampling_params import StructuredOutputsParams

# A constraint's text (schema JSON, regex, grammar, choices) is bounded before any work on it:
# docs/limits.md.
MAX_CONSTRAINT_CHARS = 100_000
MAX_CHOICES = 1_000
_CACHE_SIZE = 256
_JSON_STYLE: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
# llguidance's own defaults, except that error texts do not echo parser state to the client.
_LIMITS = llguidance.LLParserLimits(verbose_errors=False)


class UnsatisfiableError(InvalidRequestError):
    """The model's tokens cannot continue the constrained output (a character its vocabulary
    cannot write, say). Known only while generating: the request fails with this 400-class
    error, before its first token as a 400, later as an error in its stream."""

    def __init__(self, detail: str) -> None:
        first_line = detail.strip().splitlines()[0] if detail.strip() else "no token fits"
        super().__init__(
            f"The output constraint cannot be met with this model's vocabulary: {first_line}",
            "structured_outputs",
        )


@dataclass(frozen=True)
class Grammar:
    key: str
    kind: str
    template: llguidance.LLMatcher
    compile_seconds: float

    def matcher(self) -> llguidance.LLMatcher:
        return self.template.deep_copy()


class GrammarCompiler:
    """Thread-safe: the server compiles on worker threads while the engine thread reads."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, eos_token_ids: list[int]
    ) -> None:
        self._hf, self._vocab_size, self._eos = tokenizer, vocab_size, eos_token_ids
        self._tokenizer: llguidance.LLTokenizer | None = None  # built on first use (~0.5 s)
        self._cache: OrderedDict[str, Grammar | InvalidRequestError] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = llguidance.hf.from_tokenizer(
                    self._hf, n_vocab=self._vocab_size, eos_token=self._eos
                )
            return self._tokenizer

    def compile(self, spec: StructuredOutputsParams) -> Grammar:
        """The spec's grammar (also stored on the spec); InvalidRequestError naming the part of
        the request that cannot be compiled."""
        if isinstance(spec.compiled, Grammar):
            return spec.compiled
        key = spec.key
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
        if found is None:
            found = self._build(spec, key)
            with self._lock:
                self._cache[key] = found
                while len(self._cache) > _CACHE_SIZE:
                    self._cache.popitem(last=False)
        if isinstance(found, InvalidRequestError):  # cached: name this request's own field
            raise InvalidRequestError(str(found), spec.source)
        spec.compiled = found
        return found

    def _build(self, spec: StructuredOutputsParams, key: str) -> Grammar | InvalidRequestError:
        start = time.perf_counter()
        try:
            text = grammar_text(spec)
        except InvalidRequestError as exc:
            return exc
        template = llguidance.LLMatcher(self.tokenizer, text, log_level=0, limits=_LIMITS)
        if template.is_error():
            return InvalidRequestError(
                f"The {_NAMES[spec.kind]} cannot be compiled: {template.get_error()}"
            )
        return Grammar(key, spec.kind, template, time.perf_counter() - start)


_NAMES = {
    "json": "JSON schema",
    "json_object": "JSON object constraint",
    "regex": "regex",
    "choice": "choice list",
    "grammar": "grammar",
    "lark": "tool-call grammar",
}


def grammar_text(spec: StructuredOutputsParams) -> str:
    """The llguidance grammar for a spec; InvalidRequestError for one too large or malformed."""
    text = _answer_grammar(spec)
    return text if spec.reasoning is None else _after_reasoning(text, *spec.reasoning, spec)


def _after_reasoning(answer: str, start: str, end: str, spec: StructuredOutputsParams) -> str:
    """The answer's grammar behind free reasoning text: the thinking is the model's own, the
    constraint holds from its end tag on. One lexeme for the whole reasoning block, which ends
    at the first end tag (lazy rules would let it end early at a token boundary)."""
    head = "" if spec.reasoning_opened else _rx(start)
    block = f"{head}(.|\\n)*{_rx(end)}"
    rule = f"/{block}[ \\t\\n]*/ & ~/{block}(.|\\n)*{_rx(end)}(.|\\n)*/"
    optional = "" if spec.reasoning_opened else "?"
    main = f"start: THINK{optional} @answer\nTHINK: {rule}\n"
    entries = json.loads(answer)["grammars"] if answer.lstrip().startswith("{") else None
    if entries is None:
        entries = [{"lark_grammar": answer}]
    entries[0]["name"] = "answer"
    return json.dumps({"grammars": [{"name": "main", "lark_grammar": main}, *entries]})


def _rx(text: str) -> str:
    """text as a literal inside a Lark /regex/."""
    return re.escape(text).replace("/", "\\/")


def _answer_grammar(spec: StructuredOutputsParams) -> str:
    kind = spec.kind
    value = getattr(spec, kind)
    size = len(value) if isinstance(value, str) else len(json.dumps(value))
    if size > MAX_CONSTRAINT_CHARS:
        raise InvalidRequestError(
            f"The {_NAMES[kind]} is {size} characters; at most {MAX_CONSTRAINT_CHARS} are accepted",
            kind,
        )
    try:
        if kind in ("json", "json_object"):
            schema = {"type": "object"} if kind == "json_object" else value
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_STYLE)
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(value)
        if kind == "choice":
            return llguidance.LLMatcher.grammar_from_lark(_choice_lark(value))
        return llguidance.grammar_from("grammar", value)  # Lark or GBNF; also our own Lark
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(f"The {_NAMES[kind]} cannot be compiled: {exc}", kind) from exc


def _choice_lark(choices: list[str]) -> str:
    if not choices or len(choices) > MAX_CHOICES or not all(isinstance(c, str) for c in choices):
        raise InvalidRequestError(f"choice must be a list of 1 to {MAX_CHOICES} strings", "choice")
    return "start: " + " | ".join(json.dumps(c) for c in choices)
