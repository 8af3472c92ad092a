"""n choices per request (one prefill for all, by the prefill token counter), and the per-token
inter-token-latency histogram, through the official client against a live server."""

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvpilot_common import metric_names as names

PROMPT = [{"role": "user", "content": "Name a river."}]
SAMPLED = {"temperature": 1.0, "max_tokens": 8, "extra_body": {"ignore_eos": True}}


def test_n_choices_each_sample_with_their_own_seed(client):
    out = client.chat.completions.create(model="tiny", messages=PROMPT, n=3, seed=7, **SAMPLED)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in out.choices)
    assert out.usage.completion_tokens == 3 * 8
    # Choice i is the request with seed + i: reproducible one by one.
    alone = client.chat.completions.create(model="tiny", messages=PROMPT, seed=8, **SAMPLED)
    assert out.choices[1].message.content == alone.choices[0].message.content
    texts = {c.message.content for c in out.choices}
    assert len(texts) > 1, "different seeds should not all sample the same text"


def test_greedy_choices_agree(client):
    out = client.completions.create(
        model="tiny", prompt="The sea", n=2, max_tokens=6, temperature=0
    )
    assert out.choices[0].text == out.choices[1].text
    assert (
        out.usage.prompt_tokens
        == client.completions.create(
            model="tiny", prompt="The sea", max_tokens=1
        ).usage.prompt_tokens
    )  # the prompt counts once, however many choices


def test_streamed_choices_equal_non_streamed(client):
    kwargs = {"model": "tiny", "prompt": "Once upon", "n": 2, "seed": 3, **SAMPLED}
    full = client.completions.create(**kwargs)
    chunks = list(
        client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    texts, reasons = ["", ""], [None, None]
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.text
        if choice.finish_reason:
            assert reasons[choice.index] is None, "one finishing chunk per choice"
            reasons[choice.index] = choice.finish_reason
    assert texts == [c.text for c in full.choices]
    assert reasons == ["length", "length"]
    assert chunks[-1].usage.completion_tokens == 16 and not chunks[-1].choices


def _metric(base: str, name: str) -> float:
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} missing")


def _histogram_count(base: str, name: str) -> float:
    return _metric(base, f"{name}_count")


def test_inter_token_latency_is_observed_per_token(client, tiny_server):
    before = _histogram_count(tiny_server, names.INTER_TOKEN_LATENCY)
    client.completions.create(model="tiny", prompt="A", n=2, **SAMPLED)
    after = _histogram_count(tiny_server, names.INTER_TOKEN_LATENCY)
    assert after - before == 2 * (8 - 1)  # every gap between two tokens of each choice


def test_four_choices_cost_one_prefill(client, tiny_server, corpus_ids, tiny_dir, hf_greedy):
    from transformers import AutoTokenizer

    prompt, block = corpus_ids[311:511], 16  # 200 tokens no earlier test has cached
    before = _metric(tiny_server, names.PREFILL_TOKENS)
    out = client.completions.create(
        model="tiny", prompt=prompt, n=4, max_tokens=8, temperature=0, logprobs=0
    )
    computed = _metric(tiny_server, names.PREFILL_TOKENS) - before
    # One prefill, plus at most the last, partial block for each later choice.
    assert len(prompt) <= computed <= len(prompt) + 3 * (len(prompt) % block)
    path = tiny_dir("llama")
    tokenizer = AutoTokenizer.from_pretrained(path)
    expected = [tokenizer.decode([t]) for t in hf_greedy(path, prompt, 8)]
    assert [c.logprobs.tokens for c in out.choices] == [expected] * 4
