"""LoRA adapters in the engine against their oracle: Hugging Face's model with peft's
merge_and_unload() of the same adapter, greedy, in float32; several adapters and the base mixed
in one batch equal to each alone; the prefix cache never shared across adapters."""

import functools
from pathlib import Path

import pytest
import torch

from kvpilot_common.errors import AdapterError
from kvpilot_server import LLM, LoRARequest, SamplingParams
from kvpilot_testing.hf_reference import merged_reference
from kvpilot_testing.lora import ALL_TARGETS, AdapterSpec, build_adapter

MiB = 1 << 20
PROMPT = [1, 504, 3029, 314, 4649, 30, 253, 1345, 282]
TOKENS = 12
# Different ranks and targets: attention only, MLP only, everything, a fused checkpoint's.
SPECS = {
    "attn-r4": AdapterSpec(rank=4, targets=("q_proj", "v_proj"), seed=1),
    "mlp-r8": AdapterSpec(rank=8, targets=("gate_proj", "down_proj"), seed=2, rslora=True),
    "all-r2": AdapterSpec(rank=2, targets=ALL_TARGETS, seed=3, alpha_pattern={"o_proj": 4}),
}
GREEDY = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, tiny_dir) -> "functools.partial[Path]":
    root = tmp_path_factory.mktemp("adapters")

    def make(model: str, name: str) -> Path:
        return build_adapter(tiny_dir(model), root / model / name, SPECS[name])

    return functools.partial(make)


@functools.cache
def _merged_greedy(base: Path, adapter: Path) -> tuple[int, ...]:
    return tuple(merged_reference(base, adapter).greedy(PROMPT, TOKENS))


def _tokens(output) -> list[int]:
    assert output.error is None, output.error
    return output.outputs[0].token_ids


def _lora_llm(path, **settings) -> LLM:
    """The tiny model with LoRA slots of rank 8, in float32: the adapters are held to Hugging
    Face's model with them merged."""
    base = {"kv_cache_bytes": 16 * MiB, "enable_lora": True, "max_lora_rank": 8}
    return LLM(str(path), **base, dtype="float32", **settings)


@pytest.mark.parametrize("model", ["llama", "qwen3", "phi3"])
def test_each_adapter_equals_hugging_face_with_it_merged(model, tiny_dir, adapters, hf_greedy):
    base = tiny_dir(model)
    llm = _lora_llm(base)
    base_tokens = _tokens(llm.generate([PROMPT], GREEDY)[0])
    assert base_tokens == hf_greedy(base, PROMPT, TOKENS)
    for name in SPECS:
        path = adapters(model, name)
        got = _tokens(
            llm.generate([PROMPT], GREEDY, lora_request=LoRARequest(name, 0, str(path)))[0]
        )
        assert got == list(_merged_greedy(base, path)), name
        assert got != base_tokens, f"{name} changed nothing: the test could not tell"


def test_a_batch_mixing_the_base_and_three_adapters_equals_each_alone(tiny_dir, adapters):
    base = tiny_dir("llama")
    requests = [None] + [LoRARequest(n, 0, str(adapters("llama", n))) for n in SPECS]
    alone = []
    for request in requests:
        llm = _lora_llm(base)
        alone.append(_tokens(llm.generate([PROMPT], GREEDY, lora_request=request)[0]))
    assert len({tuple(t) for t in alone}) == len(alone), "the adapters must differ to tell"
    mixed = _lora_llm(base)
    # Two of each, in an interleaved order, one step for all of them.
    order = requests * 2
    outputs = mixed.generate([PROMPT] * len(order), GREEDY, lora_request=order)
    assert [_tokens(o) for o in outputs] == alone * 2


def test_more_adapters_than_slots_take_turns_and_stay_exact(tiny_dir, adapters):
    """Three adapters, one slot: each waits for the slot and is installed over the last."""
    base = tiny_dir("llama")
    requests = [LoRARequest(n, 0, str(adapters("llama", n))) for n in SPECS]
    llm = _lora_llm(base, max_loras=1)
    outputs = llm.generate([PROMPT] * 3, GREEDY, lora_request=requests)
    for request, output in zip(requests, outputs, strict=True):
        assert _tokens(output) == list(_merged_greedy(base, Path(request.lora_path)))
    assert llm.engine.lora.pins == [0]


def test_the_prefix_cache_never_serves_one_adapters_blocks_to_another(tiny_dir, adapters):
    base = tiny_dir("llama")
    llm = _lora_llm(base)
    prompt = PROMPT * 8  # several full blocks
    one = LoRARequest("attn-r4", 0, str(adapters("llama", "attn-r4")))
    two = LoRARequest("mlp-r8", 0, str(adapters("llama", "mlp-r8")))
    first = llm.generate([prompt], GREEDY, lora_request=one)[0]
    assert first.num_cached_tokens == 0
    again = llm.generate([prompt], GREEDY, lora_request=one)[0]
    assert again.num_cached_tokens > 0  # the same adapter does share its own blocks
    other = llm.generate([prompt], GREEDY, lora_request=two)[0]
    plain = llm.generate([prompt], GREEDY)[0]
    assert other.num_cached_tokens == 0 and plain.num_cached_tokens == 0
    fresh = _lora_llm(base)
    assert _tokens(other) == _tokens(fresh.generate([prompt], GREEDY, lora_request=two)[0])


def test_an_adapter_on_int4_weights_stays_float_and_applies(tiny_dir, adapters):
    """The base quantized, the adapter not. int4's numerics depend on a step's row count (up to
    16 rows its kernels multiply int8 activations, above it a float matmul), so each run here
    has the same shape: two sequences."""
    base = tiny_dir("llama")
    request = LoRARequest("all-r2", 0, str(adapters("llama", "all-r2")))
    llm = _lora_llm(base, quantization="int4")
    plain = [_tokens(o) for o in llm.generate([PROMPT] * 2, GREEDY)]
    with_adapter = [_tokens(o) for o in llm.generate([PROMPT] * 2, GREEDY, lora_request=request)]
    assert plain[0] == plain[1] and with_adapter[0] == with_adapter[1]
    assert with_adapter[0] != plain[0]
    wrapper = llm.engine.model.layers[0].self_attn.qkv_proj
    assert wrapper.a.dtype == torch.float32 and type(wrapper.base).__name__ == "Int4Linear"
    # Mixed, each row gets what it got beside its own kind (the decode stack serves the
    # base-only steps, the modules the steps with adapter rows: the same arithmetic).
    mixed = llm.generate([PROMPT] * 2, GREEDY, lora_request=[None, request])
    assert [_tokens(o) for o in mixed] == [plain[0], with_adapter[0]]


@pytest.mark.parametrize(
    ("config", "files", "message"),
    [
        ({"peft_type": "LORA", "use_dora": True, "r": 2}, True, "use_dora"),
        ({"peft_type": "LORA", "modules_to_save": ["lm_head"]}, True, "modules_to_save"),
        ({"peft_type": "PREFIX_TUNING"}, True, "peft_type"),
        (None, True, "adapter_config.json"),
        ({"peft_type": "LORA"}, False, "adapter_model.safetensors"),
    ],
)
def test_an_adapter_the_engine_cannot_apply_is_refused_by_name(
    tiny_dir, adapters, tmp_path, config, files, message
):
    import json
    import shutil

    source = adapters("llama", "attn-r4")
    if files:
        shutil.copy(source / "adapter_model.safetensors", tmp_path)
    if config is not None:
        (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    llm = LLM(str(tiny_dir("llama")), kv_cache_bytes=16 * MiB, enable_lora=True, dtype="float32")
    with pytest.raises(AdapterError, match=message):
        llm.generate([PROMPT], GREEDY, lora_request=LoRARequest("bad", 0, str(tmp_path)))
    assert llm.engine.lora.known() == [] and not llm.engine.requests


def test_an_adapter_above_the_rank_limit_or_for_another_model_is_refused(tiny_dir, adapters):
    llm = LLM(
        str(tiny_dir("llama")),
        kv_cache_bytes=16 * MiB,
        enable_lora=True,
        max_lora_rank=4,
        dtype="float32",
    )
    with pytest.raises(AdapterError, match="rank 8, above"):
        llm.engine.read_adapter("big", str(adapters("llama", "mlp-r8")))
    other = LLM(str(tiny_dir("qwen3")), kv_cache_bytes=16 * MiB, enable_lora=True, dtype="float32")
    with pytest.raises(AdapterError, match=r"another base model|inputs"):
        other.engine.read_adapter("llama's", str(adapters("llama", "attn-r4")))


def test_unloading_lets_running_requests_finish_and_refuses_new_ones(tiny_dir, adapters):
    llm = _lora_llm(tiny_dir("llama"))
    engine = llm.engine
    engine.add_adapter(engine.read_adapter("attn-r4", str(adapters("llama", "attn-r4"))))
    engine.add_request("a", PROMPT, GREEDY, lora="attn-r4")
    engine.step()
    engine.remove_adapter("attn-r4")
    with pytest.raises(AdapterError, match="no LoRA adapter named"):
        engine.add_request("b", PROMPT, GREEDY, lora="attn-r4")
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in outputs] == ["a"] and outputs[0].error is None
    assert engine.lora.adapters == {} and engine.lora.holder == [None] * 4
    assert engine.pool.num_free == engine.pool.num_blocks


@pytest.mark.parametrize("model", ["llama", "phi3"])
def test_two_ranks_serve_adapters_as_hugging_face_merges_them(model, tiny_dir, adapters):
    """Each rank keeps its slice of every adapter as of the base weights (B's rows for q/k/v
    and gate/up, A's columns for o and down); the worker installs from the plan. phi3: adapters
    on fused projections, cut into parts, then sharded."""
    base = tiny_dir(model)
    requests = [None] + [LoRARequest(n, 0, str(adapters(model, n))) for n in SPECS]
    # Three adapters, two slots: the worker installs over an earlier one.
    llm = _lora_llm(base, tensor_parallel_size=2, max_loras=2)
    try:
        outputs = llm.generate([PROMPT] * 4, GREEDY, lora_request=requests)
    finally:
        llm.engine.close()
    for request, output in zip(requests[1:], outputs[1:], strict=True):
        assert _tokens(output) == list(_merged_greedy(base, Path(request.lora_path)))


def test_the_memory_model_counts_the_slots_the_engine_allocates(tiny_dir):
    """The operator's fit check reserves lora_slot_bytes for a replica with adapters: it must be
    what the engine's slots take."""
    import json

    from kvpilot_common.memory_model import lora_slot_bytes, shape_from_config

    base = tiny_dir("llama")
    llm = _lora_llm(base, max_loras=3)
    _, wrapped = llm.engine.model.lora
    allocated = sum(w.a.nbytes + w.b.nbytes for _, w in wrapped)
    shape = shape_from_config(json.loads((base / "config.json").read_text()))
    assert lora_slot_bytes(shape, 3, 8, "float32") == allocated
