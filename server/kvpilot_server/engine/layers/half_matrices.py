"""dtype bfloat16 on CPU: the decoder's and lm_head's matrices are stored and multiplied in
bfloat16; everything between them stays float32.

CPUs with AMX (Intel Sapphire Rapids and later) multiply bfloat16 matrices several times faster
than float32 ones (oneDNN, behind torch's linear), from half the bytes; CPUs with AVX-512's
bfloat16 dot products (AMD Zen 4, Intel Cooper Lake) about twice as fast. The rest of a step
(norms, rotary, attention over the KV cache, sampling) gains nothing from bfloat16 on a CPU and
has its compiled kernels in float32, so it stays there, and so does the KV cache: activations
are rounded to bfloat16 only on their way into a product, whose output comes back as float32.
The cost in quality is in `kvpilot eval`. Without either, bfloat16 products are far slower than
float32 ones (model_setup.resolve_dtype warns). dtype auto means this mode on a CPU with AMX and
float32 on one without (precision.resolve_dtype), AVX-512 BF16 included: oneDNN hands each
product back rounded to bfloat16, logits too, and on such a CPU the bundled model's two best
first tokens for README's question rounded into an exact tie that its greedy pick lost
(measured: the same -1.922 logprob for both). Logits kept in float32 would have to come first.
float32 is the dtype whose greedy output equals Hugging Face's.
"""

import logging
import sys

import torch
import torch.nn.functional as F
from torch import nn

from kvpilot_server.engine.kernels.operands import DecodeOperands, ProductKind
from kvpilot_server.engine.layers.direct import Direct
from kvpilot_server.engine.layers.quant import decoder_linears

MATRIX_DTYPE = torch.bfloat16
log = logging.getLogger(__name__)


def applies(dtype: str, device: torch.device) -> bool:
    """Whether the dtype asked for means bfloat16 matrices in a float32 model here."""
    return device.type == "cpu" and dtype == "bfloat16"


def _probe(name: str) -> bool:
    probe = getattr(torch.cpu, name, None)  # private (torch's cpuinfo, as oneDNN's): absent is no
    return bool(probe and probe())


def amx_capable() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in AMX tiles (dtype auto's bfloat16)."""
    return _probe("_is_amx_tile_supported")


def bfloat16_capable() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware: AMX tiles, or AVX-512's bfloat16 dot
    products (vdpbf16ps), the two kinds oneDNN runs bfloat16 products on."""
    return amx_capable() or _probe("_is_avx512_bf16_supported")


def _packed(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight in oneDNN's own blocked layout for this CPU (AMX tiles where it has them),
    made once at load: a plain bfloat16 product reorders its weight on every call, which costs
    more than the product itself at decode batch sizes. None where oneDNN cannot pack it (no
    mkldnn build, a CPU without bfloat16 support): the plain product serves."""
    pack = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
    if pack is None or not torch.backends.mkldnn.is_available():
        return None
    try:
        # The row count is a hint for the layout, not a limit: any batch reads the same one.
        return pack(weight, PACK_ROWS_HINT)
    except RuntimeError:
        return None


PACK_ROWS_HINT = 32  # a decode batch's order of size


class HalfLinear(Direct):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.out_features, self.in_features = linear.weight.shape
        weight = linear.weight.detach().to(MATRIX_DTYPE)
        packed = _packed(weight)
        self.packed = packed is not None
        self.register_buffer("weight", weight if packed is None else packed)
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    def decode_operands(self) -> DecodeOperands | None:
        """The decode stack (kernels/decode_stack.py) runs a packed weight through the same
        oneDNN op as forward(), for any number of rows; a plain one (not packed) it leaves to
        forward()."""
        if not self.packed:
            return None
        b = self._buffers
        return DecodeOperands(
            ProductKind.BFLOAT16, b["weight"], None, None, 0, b["bias"], sys.maxsize
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self._buffers  # nn.Module's attribute lookup costs ~0.5 us a name
        if self.packed:
            out = torch.ops.mkldnn._linear_pointwise(
                x.to(MATRIX_DTYPE), b["weight"], None, "none", [], ""
            ).float()
        else:
            out = F.linear(x.to(MATRIX_DTYPE), b["weight"]).float()
        return out if b["bias"] is None else out.add_(b["bias"])


def convert(model: nn.Module) -> None:
    """Give every decoder linear and the lm_head that are still float (not quantized) bfloat16
    weights, in place. A tied lm_head gets its own bfloat16 copy; the embeddings stay float32."""
    linears = [*decoder_linears(model)]
    if not model.cfg.base_model:  # an embedding checkpoint's head is its embeddings, never used
        linears.append((model, "lm_head"))
    halves = []
    for owner, name in linears:
        module = getattr(owner, name)
        if isinstance(module, nn.Linear) and module.weight.dtype == torch.float32:
            halves.append(HalfLinear(module))
            setattr(owner, name, halves[-1])
    packed = sum(h.packed for h in halves)
    log.info("bfloat16 matrices: %d linear layers, %d packed for this CPU", len(halves), packed)
