"""Per-request generation settings, validated once at construction (vLLM's field names)."""

import contextlib
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from kvpilot_common.errors import InvalidRequestError

_MIN_TEMPERATURE = 1e-5


@dataclass
class StructuredOutputsParams:
    """What the output must match: exactly one of the constraints (vLLM's field names). `lark`
    is kvpilot's own: a grammar it builds itself (tool calls), never taken from a request."""

    json: dict[str, Any] | str | None = None  # a JSON schema
    json_object: bool = False  # any JSON object
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # Lark or GBNF
    lark: str | None = None
    # Reasoning models: the constraint holds after the thinking, which goes between these
    # tags (start, end) unconstrained; opened: the prompt already wrote the start tag.
    reasoning: tuple[str, str] | None = None
    reasoning_opened: bool = False
    # The request field it came from, for errors (compiling happens later, elsewhere).
    source: str = field(default="structured_outputs", compare=False)
    # The engine's compiled grammar, set once (engine/structured/grammar.py); every choice of a
    # request shares it and starts its own matcher from it.
    compiled: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        given = [k for k in ("json", "regex", "choice", "grammar", "lark") if getattr(self, k)]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise InvalidRequestError(
                "structured outputs take exactly one of json, json_object, regex, choice, "
                f"grammar; got {', '.join(given) or 'none'}",
                "structured_outputs",
            )
        self.kind = given[0]

    @property
    def key(self) -> str:
        """The same constraint, however spelled (key order, whitespace), has the same key."""
        value = getattr(self, self.kind)
        if self.kind == "json" and isinstance(value, str):
            with contextlib.suppress(ValueError):  # compiling reports it
                value = json.loads(value)
        shape = [self.kind, value, self.reasoning, self.reasoning_opened]
        text = json.dumps(shape, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class SamplingParams:
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # None: off; k >= 0: chosen token plus k alternatives
    # None: off; k >= 0: each prompt token's logprob plus k alternatives (turns off prefix
    # caching for the request: a cached token is never run through the model)
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    # Output tokens already generated (by a replica that failed mid-stream): the request
    # continues after them and answers what the uninterrupted run would have (kvpilot's own).
    continue_from: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in self.stop if s]
        if self.top_k == -1:
            self.top_k = 0
        if 0.0 < self.temperature < _MIN_TEMPERATURE:  # logits / 1e-30 overflow: greedy, as vLLM
            self.temperature = 0.0
        self._check()

    def _check(self) -> None:
        checks = [
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be at least 1"),
            (self.min_tokens >= 0, "min_tokens", "must be non-negative"),
            (
                self.max_tokens is None or self.min_tokens <= self.max_tokens,
                "min_tokens",
                "must not exceed max_tokens",
            ),
            (self.temperature >= 0.0, "temperature", "must be non-negative"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (self.top_k >= 0, "top_k", "must be -1 (disabled) or at least 1"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]"),
            (self.repetition_penalty > 0.0, "repetition_penalty", "must be positive"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs", "must be in [0, 20]"),
            (
                self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20,
                "prompt_logprobs",
                "must be in [0, 20]",
            ),
            (self.seed is None or -(2**63) <= self.seed < 2**64, "seed", "must fit in 64 bits"),
        ]
        if self.structured_outputs is not None:
            # An end-of-sequence ban could leave a finished grammar nothing to emit.
            checks.append((self.min_tokens == 0, "min_tokens", "must be 0 with structured outputs"))
        for ok, name, rule in checks:
            if not ok:
                raise InvalidRequestError(f"{name} {rule}, got {getattr(self, name)!r}", name)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def processed(self) -> bool:
        """Logits need more than temperature and filtering: penalties or a bias."""
        return self.penalized or bool(self.logit_bias)

    @property
    def penalized(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )
