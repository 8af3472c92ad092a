"""Gemma 2 and Gemma 3's text model (Gemma2ForCausalLM, Gemma3ForCausalLM) on Llama's attention and
MLP (models/llama.py, engine/layers/). What differs from Llama, as transformers computes it:

- every RMSNorm scales by 1 + weight, in float32 whatever the model dtype (GemmaRMSNorm);
- four norms a layer: each sublayer's output is normed before its residual add, as well as its
  input (GemmaDecoderLayer);
- embeddings are multiplied by sqrt(hidden_size), rounded to the model dtype;
- gelu (tanh approximation) gates and a query scale of query_pre_attn_scalar ** -0.5
  (ModelConfig.activation, .attention_scale: layers/mlp.py, layers/attention.py take them);
- Gemma 2 caps attention logits, tanh(x / cap) * cap (layers/attention.py's softcapped path;
  the compiled decode kernel cannot, so the model runner leaves it off), and both cap the final
  logits the same way (a monotone map: greedy tokens are unchanged, probabilities are not);
- Gemma 3 normalizes q and k (Gemma norms too), and its sliding layers have their own rope
  (model_config.rope_tables puts both tables side by side; forward gives each layer its half).

Sliding and full layers alternate (layer_types); each sliding layer's window is what Mistral's
is (layers/attention.visible_keys), which is transformers' rule for Gemma as well. The compiled
decode stack runs Llama's layer only and refuses these models (kernels/decode_stack.py).
"""

import torch

from kvpilot_server.engine.distributed.group import TensorParallel
from kvpilot_server.engine.layers.direct import Direct
from kvpilot_server.engine.models.llama import Attention, LlamaForCausalLM, RMSNorm
from kvpilot_server.engine.models.model_config import ModelConfig


class GemmaRMSNorm(RMSNorm):
    """x * rsqrt(mean(x^2) + eps) * (1 + weight), computed in float32 (transformers'
    Gemma2RMSNorm). The checkpoint stores `weight`; fold() turns it into 1 + weight once loaded,
    so in float32 this is llama's RMSNorm, compiled kernels and fused residual add included
    (1 + w in float32 is exactly what transformers adds on every call). In a half dtype the
    float32 1 + w stays apart (`scale`): rounded to bfloat16 it would lose most of w's bits, and
    transformers multiplies in float32 and rounds the product once."""

    scale: torch.Tensor | None = None  # float32 1 + weight, once folded

    def fold(self) -> None:
        with torch.no_grad():
            self.scale = 1.0 + self.weight.float()
            self.weight.copy_(self.scale)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if x.dtype == torch.float32:
            return super().forward(x, residual)
        if residual is not None:
            residual = residual + x
            return self(residual), residual
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.scale).to(x.dtype)


class GemmaDecoderLayer(Direct):
    def __init__(
        self, cfg: ModelConfig, window: int | None, mlp: torch.nn.Module, tp: TensorParallel
    ) -> None:
        super().__init__()
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.self_attn = Attention(cfg, window, tp, norm=GemmaRMSNorm)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)  # on the attention's output
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)  # on the MLP's output
        self.mlp = mlp

    def forward(self, x, residual, cos, sin, kv_cache, metas, ws):
        """As llama.DecoderLayer's: (this layer's normed MLP output, the residual stream before
        it is added), each residual add fused into the norm that follows it."""
        if residual is None:  # the first layer: the (scaled) embeddings are the residual stream
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm(x, residual)
        h = self.post_attention_layernorm(self.self_attn(h, cos, sin, kv_cache, metas, ws))
        h, residual = self.pre_feedforward_layernorm(h, residual)
        return self.post_feedforward_layernorm(self.mlp(h)), residual


class GemmaForCausalLM(LlamaForCausalLM):
    layer_class = GemmaDecoderLayer
    norm_class = GemmaRMSNorm

    def finish_loading(self) -> None:
        for module in self.modules():
            if isinstance(module, GemmaRMSNorm):
                module.fold()
        weight = self.norm.weight
        # Rounded to float32, then to the model dtype, as transformers' embed_scale buffer is (in
        # bfloat16 sqrt(3072) = 55.43 becomes 55.5, the value the checkpoints were trained with).
        self.normalizer = torch.tensor(self.cfg.hidden_size**0.5).to(weight.device, weight.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,  # [N]
        cos: torch.Tensor,  # [N, 1, head_dim], or [N, 1, 2 * head_dim] with local rope
        sin: torch.Tensor,
        kv_caches,
        metas,
        logits_rows: torch.Tensor | None,
    ) -> torch.Tensor | None:
        x, residual = self.embed_tokens(input_ids) * self.normalizer, None
        ropes = self._ropes(cos, sin)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            layer_cos, layer_sin = ropes[layer.self_attn.window is not None]
            x, residual = layer(x, residual, layer_cos, layer_sin, kv_cache, metas, self.workspace)
        if logits_rows is None:  # a tensor-parallel worker: rank 0 samples, from its own logits
            return None
        h, _ = self.norm(x[logits_rows], residual[logits_rows])
        if self.pools:
            return h.float()
        logits = self.lm_head(h).float()
        cap = self.cfg.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _ropes(self, cos: torch.Tensor, sin: torch.Tensor) -> dict[bool, tuple]:
        """(cos, sin) for full layers (False) and sliding ones (True): Gemma 3's table holds the
        sliding layers' half beside the full layers' (model_config.rope_tables), split once a
        step and made contiguous for the compiled rotation."""
        if self.cfg.local_inv_freq is None:
            return {False: (cos, sin), True: (cos, sin)}
        head_dim = self.cfg.head_dim
        full = cos[..., :head_dim].contiguous(), sin[..., :head_dim].contiguous()
        local = cos[..., head_dim:].contiguous(), sin[..., head_dim:].contiguous()
        return {False: full, True: local}
