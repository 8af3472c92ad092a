"""LoRA on the decoder's projections, many adapters in one step.

Each fused projection (qkv, o, gate/up, down) is wrapped once, at start, in a LoraLinear that
holds every slot's A and B stacked: A as [slots, parts * max_rank, in], B as [slots, parts *
max_rank, out], a smaller adapter's unused ranks left zero, each part's B rows at that part's
columns of the fused output. A step with adapter rows adds, after the base product,

    (x @ A_used^T) * mask @ B_used

where A_used and B_used stack the slots the step uses and the mask keeps, in each row, only the
columns of that row's own slot (nothing, for a row of the base model). That is two products a
projection however many adapters the step mixes, not one pass per adapter, and the base
product stays whatever it is (quantized, bfloat16, the compiled kernels): the adapter stays
in the model's float dtype beside it. A step with no adapter rows adds nothing.
"""

import torch
from torch import nn

from kvpilot_server.engine.layers.direct import Direct
from kvpilot_server.engine.layers.mlp import MLP
from kvpilot_server.engine.lora.adapter import LoraAdapter


class LoraBatch:
    """One step's use of the slots: the slot each token row reads (-1: the base alone)."""

    def __init__(self, row_slots: list[int], device: torch.device) -> None:
        used = sorted({slot for slot in row_slots if slot >= 0})
        first = used[0]
        # Slots fill from 0, so the used ones are often a run: a view, not a copy.
        self.run = (
            slice(first, first + len(used))
            if used == list(range(first, first + len(used)))
            else None
        )
        self.used = torch.tensor(used, device=device)
        place = {slot: i for i, slot in enumerate(used)}
        index = torch.tensor([place.get(slot, -1) for slot in row_slots], device=device)
        self.onehot = index[:, None] == torch.arange(len(used), device=device)[None, :]
        self.uniform = len(used) == 1 and min(row_slots) == used[0]  # every row, one adapter
        self.masks: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def _mask(self, rank: int, dtype: torch.dtype) -> torch.Tensor:
        mask = self.masks.get((rank, dtype))
        if mask is None:
            mask = self.masks[rank, dtype] = self.onehot.to(dtype).repeat_interleave(rank, dim=1)
        return mask

    def _stack(self, t: torch.Tensor) -> torch.Tensor:
        used = t[self.run] if self.run is not None else t.index_select(0, self.used)
        return used.reshape(-1, t.shape[2])

    def add(self, out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor):
        h = x.to(a.dtype) @ self._stack(a).t()
        if not self.uniform:
            h = h * self._mask(a.shape[1], h.dtype)
        return torch.addmm(out, h.to(out.dtype), self._stack(b).to(out.dtype))


class LoraState:
    """What the wrapped projections read in a step; the model runner is its one writer."""

    def __init__(self) -> None:
        self.batch: LoraBatch | None = None


class LoraLinear(Direct):
    def __init__(
        self,
        base: nn.Module,
        parts: dict[str, tuple[int, int]],  # part -> (first output row, output rows)
        in_features: int,
        slots: int,
        max_rank: int,
        state: LoraState,
        like: torch.Tensor,  # the adapters' dtype and device
    ) -> None:
        super().__init__()
        self.base, self.parts, self.state, self.max_rank = base, parts, state, max_rank
        out_features = sum(size for _, size in parts.values())
        ranks = len(parts) * max_rank
        self.a = torch.zeros(slots, ranks, in_features, dtype=like.dtype, device=like.device)
        self.b = torch.zeros(slots, ranks, out_features, dtype=like.dtype, device=like.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        batch = self.state.batch
        return out if batch is None else batch.add(out, x, self.a, self.b)

    def install(self, slot: int, pieces: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put one adapter's pieces of this projection (part -> (A, B)) into `slot`."""
        self.a[slot].zero_()
        self.b[slot].zero_()
        for column, (part, (start, size)) in enumerate(self.parts.items()):
            if part in pieces:
                a, b = pieces[part]
                first = column * self.max_rank
                self.a[slot, first : first + len(a)] = a
                self.b[slot, first : first + len(a), start : start + size] = b.t()


Wrapped = list[tuple[int, LoraLinear]]  # (layer, projection)


def attach(model: nn.Module, slots: int, max_rank: int) -> tuple[LoraState, Wrapped]:
    """Wrap every decoder projection of `model` (this rank's share) for `slots` adapters of rank
    up to `max_rank`; a sparse MLP's experts are left alone. Returns the state the runner sets
    each step and the wrapped projections with their layers."""
    cfg, state = model.cfg, LoraState()
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    like = model.norm.weight
    wrapped: Wrapped = []
    for index, layer in enumerate(model.layers):
        targets = [
            (
                layer.self_attn,
                "qkv_proj",
                {"q_proj": (0, q), "k_proj": (q, kv), "v_proj": (q + kv, kv)},
                cfg.hidden_size,
            ),
            (layer.self_attn, "o_proj", {"o_proj": (0, cfg.hidden_size)}, q),
        ]
        if isinstance(layer.mlp, MLP):
            width = layer.mlp.intermediate
            targets += [
                (
                    layer.mlp,
                    "gate_up_proj",
                    {"gate_proj": (0, width), "up_proj": (width, width)},
                    cfg.hidden_size,
                ),
                (layer.mlp, "down_proj", {"down_proj": (0, cfg.hidden_size)}, width),
            ]
        for owner, name, parts, in_features in targets:
            wrapper = LoraLinear(
                getattr(owner, name), parts, in_features, slots, max_rank, state, like
            )
            setattr(owner, name, wrapper)
            wrapped.append((index, wrapper))
    return state, wrapped


def install(wrapped: Wrapped, slot: int, adapter: LoraAdapter | None) -> None:
    """Put `adapter` (None: nothing) into `slot` of every wrapped projection."""
    pieces = {} if adapter is None else adapter.pieces
    for layer, wrapper in wrapped:
        wrapper.install(slot, {p: pieces[layer, p] for p in wrapper.parts if (layer, p) in pieces})
