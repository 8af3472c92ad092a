"""Counting tokens the way the server under test counts them.

In order of preference: the server's own /tokenize (kvpilot and vLLM: {"prompt"} -> {"count",
"max_model_len"}; llama.cpp: {"content"} -> {"tokens"}; TGI: {"inputs"} -> a list), a local
tokenizer.json (--tokenizer, read with the `tokenizers` library), or an estimate of 1.3 tokens per
word, which the report then names so that nobody mistakes it for a count.
"""

import asyncio
import math
from dataclasses import dataclass

import httpx

_WORD_TOKENS = 1.3
_CONCURRENCY = 8


class Counter:
    name = "estimate"
    max_model_len: int | None = None  # the server's context, when it says
    chat_overhead: int | None = None  # tokens a chat template adds to one user message

    async def count(self, texts: list[str]) -> list[int]:
        return [math.ceil(len(t.split()) * _WORD_TOKENS) for t in texts]


@dataclass
class _Shape:
    body_key: str

    def body(self, model: str | None, text: str) -> dict:
        return (
            {"model": model, "prompt": text} if self.body_key == "prompt" else {self.body_key: text}
        )

    @staticmethod
    def parse(answer: object) -> int:
        if isinstance(answer, list):  # TGI: one object per token
            return len(answer)
        if isinstance(answer, dict) and isinstance(answer.get("count"), int):
            return answer["count"]
        if isinstance(answer, dict) and isinstance(answer.get("tokens"), list):
            return len(answer["tokens"])
        raise ValueError("no token count in the /tokenize answer")


class ServerCounter(Counter):
    name = "server /tokenize"

    def __init__(self, http: httpx.AsyncClient, root: str, model: str | None, shape: _Shape):
        self.http, self.root, self.model, self.shape = http, root, model, shape
        self.limit = asyncio.Semaphore(_CONCURRENCY)

    async def _one(self, text: str) -> int:
        async with self.limit:
            r = await self.http.post(
                f"{self.root}/tokenize", json=self.shape.body(self.model, text)
            )
            r.raise_for_status()
            return self.shape.parse(r.json())

    async def count(self, texts: list[str]) -> list[int]:
        return list(await asyncio.gather(*(self._one(t) for t in texts)))


class TokenizerCounter(Counter):
    def __init__(self, path: str):
        from pathlib import Path

        from tokenizers import Tokenizer

        file = Path(path)
        self.tokenizer = Tokenizer.from_file(
            str(file / "tokenizer.json" if file.is_dir() else file)
        )
        self.name = f"tokenizer {path}"

    async def count(self, texts: list[str]) -> list[int]:
        encoded = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [len(e.ids) for e in encoded]


async def probe(
    http: httpx.AsyncClient, root: str, model: str | None, tokenizer: str | None
) -> Counter:
    """The best counter this server and these options offer."""
    for key in ("prompt", "content", "inputs"):
        shape = _Shape(key)
        try:
            r = await http.post(f"{root}/tokenize", json=shape.body(model, "Hello world"))
            if r.status_code == 404:
                break  # no /tokenize at all
            if r.status_code != 200 or shape.parse(r.json()) < 1:
                continue  # another server's body shape
        except (httpx.HTTPError, ValueError):
            continue
        counter = ServerCounter(http, root, model, shape)
        answer = r.json()
        if isinstance(answer, dict) and isinstance(answer.get("max_model_len"), int):
            counter.max_model_len = answer["max_model_len"]
        if key == "prompt":  # kvpilot and vLLM also count a chat with its template applied
            counter.chat_overhead = await _chat_overhead(http, root, model)
        return counter
    return TokenizerCounter(tokenizer) if tokenizer else Counter()


async def _chat_overhead(http: httpx.AsyncClient, root: str, model: str | None) -> int:
    text = "Hello world"
    chat = {"model": model, "messages": [{"role": "user", "content": text}]}
    try:
        with_template = await http.post(f"{root}/tokenize", json=chat)
        bare = await http.post(f"{root}/tokenize", json={"model": model, "prompt": text})
        if with_template.status_code == 200 and bare.status_code == 200:
            return max(0, with_template.json()["count"] - bare.json()["count"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        pass
    return 0
