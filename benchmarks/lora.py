"""Many adapters on one replica: decode throughput of a batch spread over several LoRA adapters,
beside the same batch on the base model alone and beside serving each adapter's merged model one
after another, in one run on the bundled model. Prints one JSON document.

Adapters are random (peft, every projection targeted, rank --rank) so each costs what a real
one of its rank costs. Every mode runs the same prompts (distinct, so no prefix is shared),
greedy with EOS ignored, and counts generated tokens over wall time, best of --runs:
- base: all --seqs sequences on the base model, one batch;
- lora: the same batch, sequence i on adapter i % --adapters, one batch (--max-loras adapters);
- merged: each adapter merged into the base weights (peft's merge_and_unload), its share of the
  sequences served by its own engine, the engines one after another (load time not counted):
  what serving a fine-tune per deployment costs one replica's worth of hardware.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from kvpilot_server import LLM, LoRARequest, SamplingParams
from kvpilot_server.models.resolve import resolve_model
from kvpilot_testing import results
from kvpilot_testing.corpus import CORPUS
from kvpilot_testing.lora import ALL_TARGETS, AdapterSpec, build_adapter, merged_model

MODEL = "builtin://smollm2-135m-instruct"


def throughput(llm: LLM, prompts, params, requests, runs: int) -> float:
    best = 0.0
    for _ in range(runs):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, lora_request=requests)
        elapsed = time.perf_counter() - start
        best = max(best, sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed)
    return best


def main() -> None:
    run = results.Run.start("lora")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=2)
    results.add_argument(parser)
    args = parser.parse_args()

    base = resolve_model(MODEL)
    engine_args = dict(max_model_len=512, kv_cache_bytes=1 << 30, max_num_seqs=args.seqs)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    with tempfile.TemporaryDirectory() as tmp:
        spec = AdapterSpec(rank=args.rank, targets=ALL_TARGETS)
        paths = [
            build_adapter(
                base, Path(tmp) / f"a{i}", AdapterSpec(**{**spec.__dict__, "seed": i}), 1.0
            )
            for i in range(args.adapters)
        ]
        llm = LLM(
            MODEL, enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank, **engine_args
        )
        ids = llm.tokenizer(CORPUS).input_ids
        ids = ids * (args.seqs * args.prompt_tokens // len(ids) + 1)
        n = args.prompt_tokens
        prompts = [ids[i * n : (i + 1) * n] for i in range(args.seqs)]
        requests = [
            LoRARequest(f"a{i % args.adapters}", 0, str(paths[i % args.adapters]))
            for i in range(args.seqs)
        ]
        llm.generate(prompts[:2], params, lora_request=requests[:2])  # warm-up, adapters read
        llm.generate(prompts, SamplingParams(max_tokens=2), lora_request=requests)
        base_tps = throughput(llm, prompts, params, None, args.runs)
        lora_tps = throughput(llm, prompts, params, requests, args.runs)
        # A decode step reads every weight once, and every used slot's A and B once more: the
        # bound a memory-bound step puts on lora/base.
        model = llm.engine.model
        base_bytes = sum(p.nbytes for p in model.parameters())
        slot_bytes = sum(w.a.nbytes + w.b.nbytes for _, w in model.lora[1])
        del llm
        merged_tokens, merged_seconds = 0, 0.0
        for i, path in enumerate(paths):
            folder = Path(tmp) / f"merged{i}"
            merged_model(base, path).save_pretrained(folder, safe_serialization=True)
            for file in base.iterdir():
                if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
                    (folder / file.name).write_bytes(file.read_bytes())
            one = LLM(str(folder), **engine_args)
            share = prompts[i :: args.adapters]
            one.generate(share[:1], SamplingParams(max_tokens=2))  # warm-up
            start = time.perf_counter()
            outputs = one.generate(share, params)
            merged_seconds += time.perf_counter() - start
            merged_tokens += sum(len(o.outputs[0].token_ids) for o in outputs)
            del one
    merged_tps = merged_tokens / merged_seconds
    result = {
        "model": MODEL,
        "seqs": args.seqs,
        "adapters": args.adapters,
        "rank": args.rank,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "base_tok_s": round(base_tps, 1),
        "lora_tok_s": round(lora_tps, 1),
        "merged_one_after_another_tok_s": round(merged_tps, 1),
        "lora_over_base": round(lora_tps / base_tps, 3),
        "lora_over_merged": round(lora_tps / merged_tps, 3),
        "weight_bytes": base_bytes,
        "adapter_bytes_read_per_step": slot_bytes,
        "bandwidth_bound_lora_over_base": round(base_bytes / (base_bytes + slot_bytes), 3),
    }
    print(json.dumps(result, indent=2))
    if args.record:
        figures = [
            results.figure(
                f"{args.seqs} sequences over {args.adapters} adapters vs the base alone",
                "tok/s",
                result["lora_tok_s"],
                result["base_tok_s"],
            ),
            results.figure(
                f"the same vs {args.adapters} merged models one after another",
                "tok/s",
                result["lora_tok_s"],
                result["merged_one_after_another_tok_s"],
            ),
        ]
        run.record(figures, "the base model alone; merged models served in turn", result)


if __name__ == "__main__":
    main()
