"""A sparse mixture-of-experts block (Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss): a router picks
each token's top-k experts, each a gated MLP (layers/mlp.py), and the block returns their outputs
weighted by the router's probabilities, plus, where the family has one, a shared expert scaled by
its own sigmoid gate.

Routing is the families' own: softmax over every expert in float32, top-k, then (where the
config says `norm_topk_prob`, always for Mixtral) the chosen probabilities renormalized to sum
to one; gpt-oss takes the top-k logits first, then a softmax over those (kvpilot_common.experts
names the two orders). gpt-oss's router and experts have biases and its experts a clamped
SwiGLU (layers/mlp.py); an expert's down bias is part of its output and weighted with it, as
transformers adds it. Tokens are grouped by expert so that each expert chosen in a step runs
once, on all its tokens; an expert no token chose is never read. A decode step therefore reads
only its tokens' experts' weights, through the same int8/int4 kernels as a dense layer
(quantization replaces the experts' linears like any other), so at batch 1 its cost follows the
active parameters. Experts are added in ascending order, as transformers adds them, so the
float32 sums round alike.

Under tensor parallelism every rank holds a slice of every expert's intermediate columns (as
vLLM shards them): each rank does the same routing and the same grouping, no token moves
between ranks, and the block ends in the one all-reduce a dense MLP has. Whole experts per rank
would balance only as well as the router does: at batch 1 one rank would do all the work.
The router (its bias too) and the shared expert's gate stay unquantized and replicated (one row
per expert); an expert's gate and up biases are sliced with their columns, its down bias added
on rank 0 alone, as a dense MLP's (layers/mlp.py).
"""

import torch
from torch import nn

from kvpilot_common.experts import TOPK_SOFTMAX, Experts
from kvpilot_server.engine.distributed.group import TensorParallel
from kvpilot_server.engine.layers.direct import Direct
from kvpilot_server.engine.layers.mlp import MLP, Linear


class SparseMoe(Direct):
    def __init__(
        self,
        hidden: int,
        experts: Experts,
        tp: TensorParallel,
        bias: bool = False,  # on the router and every expert's projections (gpt-oss)
        swiglu: tuple[float, float] | None = None,  # the experts' clamped SwiGLU (gpt-oss)
    ) -> None:
        super().__init__()
        self.tp = tp
        self.top_k, self.normalize = experts.top_k, experts.normalize_top_k
        self.topk_first = experts.route == TOPK_SOFTMAX
        self.gate = Linear(hidden, experts.count, bias=bias)  # the router
        self.experts = nn.ModuleList(
            MLP(hidden, experts.width, bias, tp, swiglu=swiglu) for _ in range(experts.count)
        )
        self.shared_expert = self.shared_expert_gate = None
        if experts.shared_width:
            self.shared_expert = MLP(hidden, experts.shared_width, False, tp)
            self.shared_expert_gate = Linear(hidden, 1, bias=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, expert ids), each [tokens, top_k]."""
        logits = self.gate(x).float()
        if self.topk_first:
            top, ids = torch.topk(logits, self.top_k, dim=-1)
            return torch.softmax(top, dim=-1).to(x.dtype), ids
        probs = torch.softmax(logits, dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)  # token slots grouped by expert
        tokens = order // self.top_k
        scales = weights.flatten()[order, None]
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        out = torch.zeros_like(x)
        start = 0
        for expert, count in zip(self.experts, counts, strict=True):
            if count:
                rows = tokens[start : start + count]
                out.index_add_(0, rows, expert.partial(x[rows]) * scales[start : start + count])
                start += count
        if self.shared_expert is not None:
            shared = self.shared_expert.partial(x)
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * shared
        return self.tp.all_reduce(out)

    def linears(self) -> list[tuple[nn.Module, str]]:
        """The experts' linear layers (and the shared expert's): what quantization replaces."""
        owners = [*self.experts, *([self.shared_expert] if self.shared_expert else [])]
        return [pair for owner in owners for pair in owner.linears()]
