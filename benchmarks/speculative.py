"""Speculative decoding by prompt lookup: output tok/s with `--speculative ngram` and without,
at batch 1 and batch 32, on copy-heavy chat requests, in one run on the bundled model. Prints
one JSON document.

Workload: four chat requests that copy much of their prompt, as edits and summaries do: a text
with spelling mistakes to correct, a function to rename in a piece of code, a text to summarize
by quoting it, the code to annotate with type hints. Greedy, at most --max-tokens tokens each;
the outputs with and without drafts must be the same tokens (checked). Batch 1 runs them one at
a time, plain and drafted in turn for each; batch 32 submits eight of each at once, three ways:
plain, drafted with the default settings (no drafts while more than
speculative_disable_by_batch_size sequences run), and drafted at any batch size (what that
default avoids). Prefix caching stays on and every engine sees the same prompts first in a
warm-up, so no mode is served by another's cache. Two runs by default, the modes' order
reversed in the second, so that a drift in the machine's load hits every mode alike.
"""

import argparse
import json
import statistics
import time

from kvpilot_server import LLM, SamplingParams
from kvpilot_testing import results
from kvpilot_testing.corpus import CORPUS

MODEL = "builtin://smollm2-135m-instruct"
CODE = """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def cheapest(items):
    best = None
    for item in items:
        if best is None or item.price < best.price:
            best = item
    return best
"""
TEXT = CORPUS[:900]
TASKS = [
    "Fix the spelling mistakes in this text and write it out in full:\n\n"
    + TEXT.replace("the", "teh"),
    "Rename the function total_price to order_total in this code and show the whole code:\n\n"
    + CODE,
    "Summarize this text, quoting its key sentences:\n\n" + TEXT,
    "Add type hints to this Python code and show the whole result:\n\n" + CODE,
]
MODES = {
    "plain": {},
    "ngram": {"speculative": "ngram"},
    "ngram_any_batch": {"speculative": "ngram", "speculative_disable_by_batch_size": 1 << 20},
}


def run(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> dict:
    before = llm.engine.stats().speculation
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    after = llm.engine.stats().speculation
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {
        "outputs": [o.outputs[0].token_ids for o in outputs],
        "tokens": tokens,
        "elapsed_s": elapsed,
        "draft_tokens": after.draft_tokens - before.draft_tokens,
        "accepted_tokens": after.accepted_tokens - before.accepted_tokens,
    }


def merged(requests: list[dict]) -> dict:
    """Requests run one after another, as one run."""
    total = {key: sum(r[key] for r in requests) for key in requests[0] if key != "outputs"}
    return {"outputs": [t for r in requests for t in r["outputs"]], **total}


def summary(runs: list[dict]) -> dict:
    tok_s = statistics.median(r["tokens"] / r["elapsed_s"] for r in runs)
    drafts = sum(r["draft_tokens"] for r in runs)
    accepted = sum(r["accepted_tokens"] for r in runs)
    return {
        "output_tok_s": round(tok_s, 1),
        "tokens": runs[0]["tokens"],
        "draft_tokens": drafts,
        "acceptance_rate": round(accepted / drafts, 3) if drafts else None,
    }


def main() -> None:
    record = results.Run.start("speculative")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--runs", type=int, default=2)
    results.add_argument(parser)
    args = parser.parse_args()

    engines = {
        mode: LLM(MODEL, max_model_len=2048, kv_cache_bytes=1 << 30, **settings)
        for mode, settings in MODES.items()
    }
    plain = engines["plain"]
    prompts = [plain.engine.apply_chat_template([{"role": "user", "content": t}]) for t in TASKS]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    for llm in engines.values():  # warm-up: kernels, and every prompt in the prefix cache
        llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0))
    batch = [prompts[i % len(prompts)] for i in range(args.batch)]
    ones: dict[str, list[dict]] = {"plain": [], "ngram": []}
    many: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for i in range(args.runs):
        order = list(MODES) if i % 2 == 0 else list(reversed(MODES))
        alone: dict[str, list[dict]] = {"plain": [], "ngram": []}
        for prompt in prompts:
            for mode in (m for m in order if m in alone):
                alone[mode].append(run(engines[mode], [prompt], params))
        for mode, requests in alone.items():  # one run: the requests one after another
            ones[mode].append(merged(requests))
        for mode in order:
            many[mode].append(run(engines[mode], batch, params))
    # Drafts never change greedy output.
    for table in (ones, many):
        for mode, runs in table.items():
            for got, want in zip(runs, table["plain"], strict=True):
                assert got["outputs"] == want["outputs"], mode
    batch1 = {mode: summary(runs) for mode, runs in ones.items()}
    batchn = {mode: summary(runs) for mode, runs in many.items()}
    result = {
        "max_tokens": args.max_tokens,
        "batch": args.batch,
        "num_speculative_tokens": engines["ngram"].engine.config.num_speculative_tokens,
        "batch_1": batch1,
        f"batch_{args.batch}": batchn,
        "speedup_batch_1": round(
            batch1["ngram"]["output_tok_s"] / batch1["plain"]["output_tok_s"], 2
        ),
        f"speedup_batch_{args.batch}": round(
            batchn["ngram"]["output_tok_s"] / batchn["plain"]["output_tok_s"], 2
        ),
        f"speedup_batch_{args.batch}_any_batch": round(
            batchn["ngram_any_batch"]["output_tok_s"] / batchn["plain"]["output_tok_s"], 2
        ),
    }
    print(json.dumps(result, indent=2))
    if args.record:
        figures = [
            results.figure(
                "output tok/s at batch 1",
                "tok/s",
                batch1["ngram"]["output_tok_s"],
                batch1["plain"]["output_tok_s"],
            ),
            results.figure(
                f"output tok/s at batch {args.batch}",
                "tok/s",
                batchn["ngram"]["output_tok_s"],
                batchn["plain"]["output_tok_s"],
            ),
            results.figure(
                f"output tok/s at batch {args.batch}, drafts at any batch size",
                "tok/s",
                batchn["ngram_any_batch"]["output_tok_s"],
                batchn["plain"]["output_tok_s"],
            ),
            results.figure(
                "draft tokens accepted at batch 1", "ratio", batch1["ngram"]["acceptance_rate"]
            ),
        ]
        record.record(figures, "the same engine without --speculative", result)


if __name__ == "__main__":
    main()
