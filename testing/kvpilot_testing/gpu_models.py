"""benchmarks/gpu_check.py's checks with a model: the bundled model's chat answer, Hugging Face
equivalence (prefill logprobs, greedy tokens, the prefix cache and chunked prefill), each
quantization, batch-1 decode of a Llama-3-8B-shaped model against the memory-bandwidth bound,
and throughput against Hugging Face `generate`. Models without files of their own are random
checkpoints written from a tokenizer directory (the bundled model's, without its weights)."""

import gc
import json
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch

from kvpilot_server import LLM, SamplingParams
from kvpilot_testing.hf_reference import hf_greedy_of

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)
# Llama-3-8B's shapes (its vocabulary aside: the tokenizer here has the bundled model's).
LLAMA3_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,  # named: the tokenizer's config names its own (64)
    rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    max_position_embeddings=8192,
)
SMALL = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
)


def engine(path: Path, device: torch.device, **settings) -> LLM:
    """An engine with a small KV cache, so a Hugging Face model fits beside it."""
    cuda = device.type == "cuda"
    room = {"kv_cache_memory_fraction": 0.2} if cuda else {"kv_cache_bytes": 256 << 20}
    # Block size and batch limits are the engine's own for the device (kvpilot_common.
    # batch_limits): a 16-bit model gets the pages the flash path reads, so that it and the
    # CUDA graphs on top of it are what the stages measure, as a user's server would run.
    return LLM(str(path), device=str(device), **room, **settings)


def attention_path(llm: LLM) -> str:
    """Which attention the engine serves with (the flash path passed its start-up self-test),
    and whether decode steps replay CUDA graphs (theirs passed too)."""
    runner = llm.engine.runner
    graphs = " + CUDA graphs" if runner.graphs is not None else ""
    return ("flash" if runner.flash else "reference") + graphs


def release(*objects) -> None:
    del objects
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def random_checkpoint(target: Path, tokenizer_dir: Path, shapes: dict, seed: int = 0) -> Path:
    """A Llama checkpoint of these shapes with random weights, saved beside the tokenizer."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    if (target / "config.json").is_file():
        return target  # written by an earlier stage
    base = json.loads((tokenizer_dir / "config.json").read_text())
    config = LlamaConfig(**{**base, **shapes, "tie_word_embeddings": True, "architectures": None})
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(target)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, target / name)
    return target


@contextmanager
def random_weights_on_device(std: float = 0.02):
    """The engine's loader fills weights at random where they are (on the device) instead of
    reading files: a model of billions of parameters in seconds, for speed figures only."""
    from kvpilot_server.engine.models import loader

    def fill(model, tensors, full) -> None:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.fill_(1.0)
                else:
                    param.normal_(0, std)

    with (
        mock.patch.object(loader, "_read_tensors", lambda path: iter(())),
        mock.patch.object(loader, "_fill", fill),
    ):
        yield


def config_only(target: Path, tokenizer_dir: Path, shapes: dict) -> Path:
    """A checkpoint directory with a config and the tokenizer, no weights (random_weights...)."""
    target.mkdir(parents=True, exist_ok=True)
    base = json.loads((tokenizer_dir / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**base, **shapes}))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, target / name)
    return target


def bundled_chat(device: torch.device) -> dict:
    from kvpilot_common.naming import BUNDLED_MODEL
    from kvpilot_server.models.resolve import resolve_model

    try:
        resolve_model(BUNDLED_MODEL)
    except Exception as exc:
        return {"ok": True, "skipped": f"bundled model not here: {exc}"[:300]}
    start = time.perf_counter()
    cuda = device.type == "cuda"
    # The whole 8192-token context needs more cache than the CPU rehearsal gives it.
    llm = engine(BUNDLED_MODEL, device, dtype="bfloat16" if cuda else "auto", max_model_len=2048)
    loaded = time.perf_counter() - start
    question = [{"role": "user", "content": "What is the capital of France?"}]
    start = time.perf_counter()
    out = llm.chat(question, SamplingParams(max_tokens=24, temperature=0.0))[0]
    text = out.outputs[0].text
    figures = {"load_s": round(loaded, 2), "first_request_s": round(time.perf_counter() - start, 3)}
    release(llm)
    return {"ok": "Paris" in text, "text": text, "device": str(device), **figures}


def _prompts(tokenizer, count: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    vocab = min(len(tokenizer), 49152)
    return [torch.randint(100, vocab, (length,), generator=g).tolist() for _ in range(count)]


def hf_equivalence(device: torch.device, path: Path, new_tokens: int) -> dict:
    """Greedy tokens and prefill logprobs against transformers on the same device: float32 must
    be token for token; bfloat16 reports its agreement. Then the same prompts again through the
    prefix cache, and one long prompt through chunked prefill."""
    from transformers import AutoModelForCausalLM

    report: dict = {}
    ok = True
    for dtype in ("float32", "bfloat16"):
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        hf = hf.to(device).eval()
        llm = engine(path, device, dtype=dtype)
        prompts = _prompts(llm.tokenizer, 8, 48, seed=1)
        want = [hf_greedy_of(hf, p, new_tokens) for p in prompts]
        greedy = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        first = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
        again = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]  # cache hits
        scored = llm.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=0))
        with torch.inference_mode():
            logits = hf(torch.tensor(prompts, device=device)).logits.float()
        hf_lp = torch.log_softmax(logits, -1)[:, :-1].gather(
            2, torch.tensor(prompts, device=device)[:, 1:, None]
        )[..., 0]
        ours = torch.tensor([[s.logprob for s in o.prompt_logprobs[1:]] for o in scored])
        long_prompt = _prompts(llm.tokenizer, 1, 700, seed=2)[0]
        attention = attention_path(llm)
        release(llm)
        chunked = engine(path, device, dtype=dtype, max_num_batched_tokens=128)
        long_ours = chunked.generate(long_prompt, greedy)[0].outputs[0].token_ids
        long_want = hf_greedy_of(hf, long_prompt, new_tokens)
        release(chunked, hf)
        same = [a == b for a, b in zip(first, want, strict=True)]
        agreement = sum(_common_prefix(a, b) for a, b in zip(first, want, strict=True))
        report[dtype] = {
            "attention": attention,
            "identical_sequences": f"{sum(same)}/{len(same)}",
            "first_divergence_agreement": round(agreement / (len(want) * new_tokens), 4),
            "prefix_cache_same_as_first": again == first,
            "chunked_prefill_identical": long_ours == long_want,
            "prompt_logprob_max_abs_diff": round(float((ours - hf_lp.cpu()).abs().max()), 5),
        }
        if dtype == "float32":
            ok &= all(same) and again == first and long_ours == long_want
    return {"ok": ok, **report}


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
