"""Embeddings: which task a checkpoint serves, how its hidden states pool into one vector, and
each request's pooling as its prompt is computed chunk by chunk.

A model serves one task. `--task auto` reads the checkpoint: a sentence-transformers layout
(modules.json with a Pooling module, as Qwen3-Embedding and the E5/GTE decoder models ship) or a
base-model architecture (`Qwen3Model`, `LlamaModel`: no language-model head) means embed;
anything else generates. The pooling is the sentence-transformers config's (last token, mean or
CLS; normalized when a Normalize module follows); a decoder served for embeddings without that
config pools its last token and normalizes, as vLLM does.

The vector is the final norm's output (transformers' `last_hidden_state`). Mean pooling adds
each chunk's rows as it is computed, so a prompt prefilled in chunks pools what one pass would;
a preempted request recomputes its prompt and its rows are not added twice. The prefix cache
stays off for embedding models: a cached block's hidden states are never computed, and mean
and CLS pooling need them.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from kvpilot_common.errors import ConfigError, InvalidRequestError
from kvpilot_server.pooling_params import PoolingParams

MODES = ("last", "mean", "cls")
_ST_POOLING = "sentence_transformers.models.Pooling"
_ST_NORMALIZE = "sentence_transformers.models.Normalize"
# sentence-transformers' Pooling config keys, by our mode.
_ST_MODES = {
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
}


@dataclass(frozen=True)
class PoolingConfig:
    mode: str
    normalize: bool
    hidden_size: int
    matryoshka: tuple[int, ...] | None = None  # dimensions allowed; () any; None: no truncation

    def check(self, params: PoolingParams) -> None:
        """Refuse, in words, what this model cannot give (before the request queues)."""
        wanted = params.dimensions
        if wanted is None:
            return
        if self.matryoshka is None:
            raise InvalidRequestError(
                "dimensions: this model was not trained for shortened embeddings "
                f"(it returns {self.hidden_size}); leave dimensions out",
                "dimensions",
            )
        allowed = self.matryoshka or range(1, self.hidden_size + 1)
        if wanted not in allowed:
            shown = ", ".join(map(str, self.matryoshka)) or f"1 to {self.hidden_size}"
            raise InvalidRequestError(f"dimensions must be one of {shown}", "dimensions")


def resolve(path: Path, task: str, hf: dict) -> tuple[str, PoolingConfig | None]:
    """(task, its PoolingConfig or None for generate) for the checkpoint at path, whose
    config.json is `hf`."""
    architecture = (hf.get("architectures") or [""])[0]
    modules = _read_json(path / "modules.json") or []
    pooling_dir = next((m.get("path") for m in modules if m.get("type") == _ST_POOLING), None)
    if task == "auto":
        base_model = not architecture.endswith("ForCausalLM")
        task = "embed" if pooling_dir is not None or base_model else "generate"
    if task == "generate":
        return task, None
    mode, normalize = "last", True
    if pooling_dir is not None:
        st = _read_json(path / pooling_dir / "config.json") or {}
        modes = [ours for key, ours in _ST_MODES.items() if st.get(key)]
        if len(modes) != 1:
            raise ConfigError(
                f"{pooling_dir}/config.json asks for pooling {modes or 'none'}; kvpilot pools "
                "by exactly one of last token, mean or CLS"
            )
        mode = modes[0]
        normalize = any(m.get("type") == _ST_NORMALIZE for m in modules)
    dims = hf.get("matryoshka_dimensions")
    matryoshka = tuple(dims) if dims else (() if hf.get("is_matryoshka") else None)
    return task, PoolingConfig(mode, normalize, hf["hidden_size"], matryoshka)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"Cannot read {path}: {exc}") from exc


class Pooler:
    """One request's pooled vector so far (engine thread only)."""

    def __init__(self, config: PoolingConfig, params: PoolingParams) -> None:
        self.config, self.params = config, params
        self.total: torch.Tensor | None = None
        self.upto = 0  # prompt positions pooled so far

    def add(self, hidden: torch.Tensor, first: int) -> None:
        """Take the final hidden states of positions first .. first + len(hidden) - 1."""
        skip = self.upto - first  # recomputed after a preemption: already pooled
        if skip >= len(hidden):
            return
        rows = hidden[max(0, skip) :].float()
        start = max(first, self.upto)
        mode = self.config.mode
        if mode == "mean":
            part = rows.sum(dim=0)
            self.total = part if self.total is None else self.total + part
        elif mode == "last":
            self.total = rows[-1].clone()
        elif start == 0:  # cls: the first position's
            self.total = rows[0].clone()
        self.upto = start + len(rows)

    def result(self) -> list[float]:
        assert self.total is not None
        vector = self.total / self.upto if self.config.mode == "mean" else self.total
        if self.params.dimensions is not None:
            vector = vector[: self.params.dimensions]
        if self.config.normalize:
            vector = torch.nn.functional.normalize(vector, dim=-1)
        return vector.tolist()
