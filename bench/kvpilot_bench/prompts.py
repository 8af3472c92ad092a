"""Prompt texts: real prose read from the machine at run time, or the user's own JSONL.

The default corpus is the prose of the Python reference documentation that every CPython carries
(`pydoc_data.topics`, what `help("assert")` prints; the same text `kvpilot eval` measures
perplexity on): it is present wherever this code runs, is real English of varied topics, and
nothing is copied into the repository. Each paragraph's length is counted once in tokens (by the
server when it can, tokens.py), so a prompt of N tokens is whole paragraphs plus the share of the
next paragraph's words that makes up the rest, starting at a random word so that prompts do not
share prefixes by accident. A JSONL file instead gives one request per line: {"prompt": "..."}
or {"messages": [...]}, with an optional "max_tokens" (the lines of `kvpilot generate --input`).

A structured request (workload.Variant) puts its instruction before the text, in the same user
message; a JSONL line's own messages are sent as they are. The instruction and the tools' JSON
(which chat templates write into the prompt) take room in the context like the template does.
"""

import json
import random
from dataclasses import dataclass
from pathlib import Path

from kvpilot_bench.plan import Planned
from kvpilot_bench.tokens import Counter
from kvpilot_bench.workload import Variant, Workload
from kvpilot_common.prose import default_text

DEFAULT_CHAT_OVERHEAD = 64  # tokens assumed for a chat template the server cannot count for us
_JOIN_MARGIN = 8  # paragraph joins may tokenize a few tokens longer than their parts
MAX_JSONL_LINES = 100_000


@dataclass(frozen=True)
class Prompt:
    text: str | None = None  # a completion's prompt, or a chat's one user message
    messages: list[dict] | None = None  # a JSONL line's chat
    max_tokens: int | None = None  # a JSONL line's own


@dataclass(frozen=True)
class Job:
    """One planned request with its prompt and the output length it asks for."""

    planned: Planned
    prompt: Prompt
    max_tokens: int
    clamped: bool  # shortened to fit the server's context
    prompt_tokens: int | None  # our count of the prompt (None for a user's JSONL line)


class Corpus:
    def __init__(self, paragraphs: list[str], counts: list[int]):
        self.words = [p.split() for p in paragraphs]
        self.counts = [max(1, c) for c in counts]

    @classmethod
    async def load(cls, counter: Counter) -> "Corpus":
        paragraphs = [p for p in default_text().split("\n\n") if p.strip()]
        return cls(paragraphs, await counter.count(paragraphs))

    def text(self, tokens: int, seed: int) -> str:
        """About `tokens` tokens of consecutive prose, starting at a random word."""
        rng = random.Random(seed)
        i = rng.randrange(len(self.words))
        start = rng.randrange(len(self.words[i]))
        parts: list[str] = []
        left = tokens
        for _ in range(len(self.words) * (tokens // sum(self.counts) + 2)):  # bounded
            words = self.words[i][start:]
            have = max(1, round(self.counts[i] * len(words) / len(self.words[i])))
            if have >= left:
                parts.append(" ".join(words[: max(1, int(len(words) * left / have))]))
                break
            parts.append(" ".join(words))
            left -= have
            i, start = (i + 1) % len(self.words), 0
        return "\n\n".join(parts)


def read_jsonl(path: str) -> list[Prompt]:
    prompts = []
    with Path(path).open() as lines:
        for number, line in enumerate(lines, 1):
            if number > MAX_JSONL_LINES:
                break
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                if isinstance(item.get("prompt"), str):
                    prompt = Prompt(text=item["prompt"], max_tokens=item.get("max_tokens"))
                elif isinstance(item.get("messages"), list) and item["messages"]:
                    prompt = Prompt(messages=item["messages"], max_tokens=item.get("max_tokens"))
                else:
                    raise ValueError('needs "prompt" (a string) or "messages" (a list)')
            except (ValueError, AttributeError) as exc:
                raise ValueError(f"{path}:{number}: {exc}") from None
            prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def fit(prompt: int, output: int, max_len: int | None, overhead: int) -> tuple[int, int]:
    """Prompt and output lengths shortened, if need be, to fit the server's context."""
    if max_len is None:
        return prompt, output
    room = max(2, max_len - overhead - _JOIN_MARGIN)
    if prompt + output <= room:
        return prompt, output
    if output < room:
        return room - output, output
    return max(1, room - room // 2), room // 2


def instruction_text(variant: Variant) -> str:
    """What a structured request adds to the prompt: its instruction (sent before the text)
    and its tools' JSON (only counted: the server's chat template writes them in)."""
    tools = json.dumps(list(variant.tools)) if variant.tools else ""
    return f"{variant.instruction}\n\n{tools}".strip()


async def variant_tokens(workload: Workload, counter: Counter) -> dict[tuple[str, str], int]:
    """(class, variant) -> the tokens a structured request's instruction and tools take."""
    keys = [(c.name, v.name, v) for c in workload.classes for v in c.structured]
    counts = await counter.count([instruction_text(v) for _, _, v in keys]) if keys else []
    return {(c, v): n for (c, v, _), n in zip(keys, counts, strict=True)}


def _with_instruction(prompt: Prompt, variant: Variant | None) -> Prompt:
    if variant is None or prompt.messages is not None:
        return prompt
    return Prompt(text=f"{variant.instruction}\n\n{prompt.text}", max_tokens=prompt.max_tokens)


def jobs(
    plan: list[Planned],
    source: Corpus | list[Prompt],
    counter: Counter,
    extra: dict[tuple[str, str], int] | None = None,
) -> list[Job]:
    """extra: variant_tokens(), the room structured requests' instructions take (default: an
    estimate from their words)."""
    out = []
    for p in plan:
        variant = p.structured
        added = 0
        if variant is not None:
            known = (extra or {}).get((p.cls.name, variant.name))
            added = known if known is not None else _estimate(instruction_text(variant))
        if isinstance(source, Corpus):
            overhead = 0
            if p.cls.api in ("chat", "responses"):  # both through the chat template
                known = counter.chat_overhead
                overhead = DEFAULT_CHAT_OVERHEAD if known is None else known
            tokens, max_tokens = fit(
                p.prompt_tokens, p.output_tokens, counter.max_model_len, overhead + added
            )
            prompt = Prompt(text=source.text(tokens, p.text_seed))
            clamped = (tokens, max_tokens) != (p.prompt_tokens, p.output_tokens)
            count: int | None = tokens + added
        else:
            prompt, count = source[p.text_seed % len(source)], None
            max_tokens, clamped = prompt.max_tokens or p.output_tokens, False
        out.append(Job(p, _with_instruction(prompt, variant), max_tokens, clamped, count))
    return out


def _estimate(text: str) -> int:
    """1.3 tokens per word (tokens.Counter's guess), or a token per 3 characters for JSON."""
    return max(-(-len(text.split()) * 13 // 10), -(-len(text) // 3))
