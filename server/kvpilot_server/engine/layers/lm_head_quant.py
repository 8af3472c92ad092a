"""int8 lm_head (--lm-head-quantization int8): the vocabulary projection stored as int8 per output
row with a float32 scale, quant.quantize_int8's format.

Why its own option: with int8 or int4 decoder weights, the float lm_head (vocab x hidden, read
whole every decode step) becomes the largest single read of a step at batch 1; int8 reads a
quarter of float32's bytes. It is not part of --quantization because it costs quality of its
own (every logit), reported apart by `kvpilot eval`.

Tied embeddings: one int8 table serves both, the embedding lookup gathering int8 rows and their
scales (q[ids] * scale[ids]). Keeping a float copy for the lookup alone would hold more bytes
than the unquantized model did; a lookup reads a few rows a step, so it costs nothing in time
either way. Untied: only lm_head is quantized, the embedding stays exact.

On CPU in float32, decode-sized batches run the int8 AVX2 kernel the decoder's layers use.
Larger batches and other devices (CUDA, 16-bit) expand the weight a chunk of vocabulary rows at a
time into a small buffer and run ordinary matmuls: expanding the whole table would take a
buffer as large as the float lm_head this option removes.
"""

import logging

import torch
from torch import nn

from kvpilot_common import precision
from kvpilot_common.errors import ConfigError
from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_server.engine.layers.direct import Direct
from kvpilot_server.engine.layers.quant import KERNEL_MAX_ROWS, DenseBuffer, quantize_int8

log = logging.getLogger(__name__)
# Vocabulary rows expanded per matmul on the chunked path: the buffer holds a sixth of SmolLM2's
# float table, not all of it. Not smaller: each chunk is two parallel regions (expand, matmul),
# and with the cores shared their synchronisation dominates (measured on a loaded 2-core machine,
# 32 rows: 2,048-row chunks 2.2 s, 8,192-row chunks 0.55 s).
CHUNK_ROWS = 8192


class Int8LmHead(Direct):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        q, scale = quantize_int8(weight)
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale.to(weight.device))
        on_cpu = weight.device.type == "cpu" and weight.dtype == torch.float32
        self.kernel = cpu_kernels.load() if on_cpu else None
        if self.kernel is not None:
            # Against int8 activations (quant.int8_activations) where the inputs come in whole
            # blocks: half the time of widening every weight to float.
            whole = self.in_features % self.kernel.INT8_ACTIVATION_BLOCK == 0
            self.product = self.kernel.int8_int8_linear if whole else self.kernel.int8_linear
        self.buffer = DenseBuffer(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.kernel is not None and rows.shape[0] <= KERNEL_MAX_ROWS:
            out = self.product(rows, self.weight, self.scale, None)
        else:
            out = self._chunked(rows)
        return out.reshape(*x.shape[:-1], self.out_features)

    def _chunked(self, rows: torch.Tensor) -> torch.Tensor:
        # Transposed, so that each chunk's product lands in a contiguous slice of the output.
        out = rows.new_empty(self.out_features, rows.shape[0])
        for start in range(0, self.out_features, CHUNK_ROWS):
            stop = min(start + CHUNK_ROWS, self.out_features)
            dense = self.buffer.view(stop - start, self.in_features)
            self.expand(start, stop, dense)
            torch.mm(dense, rows.t(), out=out[start:stop])
        return out.t().contiguous()

    def expand(self, start: int, stop: int, dense: torch.Tensor) -> None:
        """Vocabulary rows start:stop in the model dtype, into dense."""
        q, scale = self.weight[start:stop], self.scale[start:stop]
        if self.kernel is not None:
            self.kernel.int8_dequantize(q, scale, dense)
        else:  # in place: an out= multiply refuses to round float32 into bfloat16
            dense.copy_(q).mul_(scale[:, None])


class Int8Embedding(nn.Module):
    """The embedding lookup over a tied Int8LmHead's table: the same tensors, no second copy."""

    def __init__(self, head: Int8LmHead) -> None:
        super().__init__()
        self.register_buffer("weight", head.weight)
        self.register_buffer("scale", head.scale)
        self.dtype = head.dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight[ids].to(torch.float32) * self.scale[ids].unsqueeze(-1)
        return rows.to(self.dtype)


def quantize_lm_head(model: nn.Module, method: str, device: torch.device) -> None:
    """Replace lm_head (and the embedding, when tied to it) in place; after quant.quantize, which
    reads the embedding's float weight for the model dtype."""
    if method not in precision.LM_HEAD_QUANTIZATIONS:
        supported = ", ".join(precision.LM_HEAD_QUANTIZATIONS)
        raise ConfigError(f"lm_head quantization {method!r} is not supported ({supported})")
    if method == precision.DEFAULT_LM_HEAD_QUANTIZATION:
        return
    weight = model.lm_head.weight
    if device.type != "cpu" or weight.dtype != torch.float32:
        log.warning(
            "int8 lm_head on %s in %s expands the table a chunk at a time per step: the memory "
            "is saved, the step is not faster in this version (the kernel is CPU float32)",
            device,
            weight.dtype,
        )
    tied = weight is model.embed_tokens.weight
    head = Int8LmHead(weight.detach())
    model.lm_head = head
    if tied:
        model.embed_tokens = Int8Embedding(head)
