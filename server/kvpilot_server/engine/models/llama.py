"""Compact Llama-family model (Llama, Mistral, Qwen2, Qwen3) over a paged KV cache; the
mixtures of experts (models/moe.py) are this model with another MLP.

Input is one flattened step: every scheduled token of every sequence in a single row-major batch.
q/k/v and gate/up projections are fused into one matmul each (fewer, larger GEMMs). Under tensor
parallelism `cfg` is one rank's share (engine/distributed/sharding.py) and o_proj and down_proj
each end in one all-reduce.
"""

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kvpilot_server.engine.distributed.group import SINGLE, TensorParallel
from kvpilot_server.engine.kernels import decode_stack
from kvpilot_server.engine.layers.attention import AttentionMetadata, Workspace, paged_attention
from kvpilot_server.engine.layers.direct import Direct
from kvpilot_server.engine.layers.kv_cache import LayerCache
from kvpilot_server.engine.layers.mlp import MLP, Linear, layer_ops
from kvpilot_server.engine.models.model_config import ModelConfig


class RMSNorm(Direct):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """The norm of x; with a residual, (norm(residual + x), residual + x): a layer's
        residual add and the next norm in one call (the sum is written into `residual`)."""
        ops = layer_ops(x)
        if residual is not None:
            if ops is not None:  # x may be a transposed product (linear.py's split path)
                return ops.add_rms_norm(x.contiguous(), residual, self.weight, self.eps), residual
            residual = residual + x
            return self(residual), residual
        if ops is not None and x.dim() == 2 and x.is_contiguous():
            return ops.rms_norm(x, self.weight, self.eps)
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Mirrors transformers for half types: normalise in float32, scale in the model dtype.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    ops = layer_ops(x)
    if ops is not None and cos.is_contiguous() and sin.is_contiguous():
        return ops.rotate(x, cos, sin)  # the same arithmetic in one call
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(Direct):
    def __init__(
        self,
        cfg: ModelConfig,
        window: int | None,
        tp: TensorParallel,
        norm: type[RMSNorm] = RMSNorm,  # q/k norms' kind (models/gemma.py has its own)
    ) -> None:
        super().__init__()
        self.tp = tp
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.window = window
        self.scale, self.softcap = cfg.attention_scale, cfg.attn_logit_softcapping
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=cfg.qkv_bias)
        # Row-parallel: the bias is added once, on rank 0 (engine/distributed/sharding.py).
        self.o_proj = Linear(q_size, cfg.hidden_size, bias=cfg.o_bias and tp.rank == 0)
        self.q_norm = norm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = norm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        # gpt-oss: a learned logit per (this rank's) head in its softmax (layers/attention.py).
        self.sinks = nn.Parameter(torch.empty(self.heads)) if cfg.attention_sinks else None

    def forward(
        self, x, cos, sin, kv_cache: LayerCache, metas: dict[int | None, AttentionMetadata], ws
    ):
        # split_with_sizes: Tensor.split's Python wrapper costs several times the split.
        qkv = self.qkv_proj(x).view(-1, self.heads + 2 * self.kv_heads, self.head_dim)
        qk, v = qkv.split_with_sizes((self.heads + self.kv_heads, self.kv_heads), dim=1)
        if self.q_norm is not None:
            q, k = qk.split_with_sizes((self.heads, self.kv_heads), dim=1)
            qk = torch.cat((self.q_norm(q), self.k_norm(k)), dim=1)
        # One rotation for queries and keys together: half the ops of rotating each.
        q, k = rotate(qk, cos, sin).split_with_sizes((self.heads, self.kv_heads), dim=1)
        meta = metas[self.window]
        out = paged_attention(q, k, v, kv_cache, meta, ws, self.scale, self.softcap, self.sinks)
        return self.tp.all_reduce(self.o_proj(out.flatten(1)))


class DecoderLayer(Direct):
    def __init__(
        self, cfg: ModelConfig, window: int | None, mlp: nn.Module, tp: TensorParallel
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, window, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp

    def forward(self, x, residual, cos, sin, kv_cache, metas, ws):
        """(this layer's MLP output, the residual stream before it is added): each residual add
        happens in the norm that follows it."""
        if residual is None:  # the first layer: the embeddings are the residual stream
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, cos, sin, kv_cache, metas, ws)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class LlamaForCausalLM(nn.Module):
    # A family with its own decoder layer or norm (models/gemma.py) names it here.
    layer_class: type[nn.Module] = DecoderLayer
    norm_class: type[RMSNorm] = RMSNorm

    def __init__(self, cfg: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.cfg = cfg
        self.tp = tp
        # Its own storage, so nn.Embedding skips its random init: the checkpoint overwrites it,
        # and normal_ on a meta tensor imports torch._dynamo, nothing else at start-up needs.
        weight = torch.empty(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(
            self.layer_class(cfg, window, self.build_mlp(cfg, index, tp), tp)
            for index, window in enumerate(cfg.layer_windows)
        )
        self.norm = self.norm_class(cfg.hidden_size, cfg.rms_norm_eps)
        self.workspace = Workspace()
        self.pools = False  # an embedding model: forward returns the final hidden states
        # LoRA (engine/lora/layers.py): the state a step's adapter rows are set in, and the
        # wrapped projections; None unless the engine serves adapters.
        self.lora: tuple[Any, list] | None = None
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def build_mlp(self, cfg: ModelConfig, index: int, tp: TensorParallel) -> nn.Module:
        """Layer `index`'s MLP: a family with another kind (models/moe.py) overrides this."""
        return MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, tp, cfg.activation)

    @staticmethod
    def checkpoint_name(name: str) -> str:
        """A checkpoint tensor's name as this model spells it (the same, for Llama)."""
        return name

    @staticmethod
    def checkpoint_parts(
        name: str, tensor: torch.Tensor, full: ModelConfig
    ) -> list[tuple[str, torch.Tensor]]:
        """The checkpoint tensor `name` (this model's spelling) as the Llama-named tensors the
        loader places: a family whose checkpoint stores projections fused (models/phi3.py) cuts
        them here, by the whole model's config `full` (itself, for Llama)."""
        return [(name, tensor)]

    def finish_loading(self) -> None:
        """Called once every checkpoint tensor is in place: a family whose checkpoint stores a
        weight in another form than its forward uses converts it here (nothing, for Llama)."""

    @functools.cached_property
    def stack(self):
        """The compiled decode stack (engine/kernels/decode_stack.py), built at the first step,
        when the weights are final; None where it does not serve this model (set None to turn it
        off)."""
        return decode_stack.build(self)

    def forward(
        self,
        input_ids: torch.Tensor,  # [N]
        cos: torch.Tensor,  # [N, 1, head_dim], already indexed by position
        sin: torch.Tensor,
        kv_caches: list[LayerCache],
        metas: dict[int | None, AttentionMetadata],
        logits_rows: torch.Tensor | None,  # rows whose next-token logits are needed
    ) -> torch.Tensor | None:
        x, residual = self.embed_tokens(input_ids), None
        group = None
        # The stack runs the base weights alone: a step with adapter rows takes the modules.
        if self.stack is not None and (self.lora is None or self.lora[0].batch is None):
            group = decode_stack.decode_group(metas, len(x), kv_caches, self.stack.max_rows)
        if group is not None:
            tables = group.block_ids.view(len(x), group.blocks)
            keys, values = [c.k for c in kv_caches], [c.v for c in kv_caches]
            slots = next(iter(metas.values())).slot_mapping
            x, residual = self.stack.forward(
                x, cos, sin, keys, values, slots, tables, group.context_lens
            )
        else:
            for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
                x, residual = layer(x, residual, cos, sin, kv_cache, metas, self.workspace)
        if logits_rows is None:  # a tensor-parallel worker: rank 0 samples, from its own logits
            return None
        # Only the last token of each sampling sequence needs the (large) vocabulary projection.
        h, _ = self.norm(x[logits_rows], residual[logits_rows])
        return h.float() if self.pools else self.lm_head(h).float()
