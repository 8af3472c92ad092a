"""A generation continued from its first k output tokens (SamplingParams.continue_from: another
replica taking over a broken stream) is the uninterrupted generation: the same tokens and text
at temperature 0 and sampled with a seed (each draw's randomness comes from the seed and the
position, not from a generator's history), with penalties that read the earlier output, with a
stop string found across the cut, and within the same max_tokens budget."""

import dataclasses

import pytest

from kvpilot_common.errors import InvalidRequestError
from kvpilot_server.sampling_params import SamplingParams

SAMPLED = SamplingParams(
    max_tokens=24,
    temperature=0.8,
    top_p=0.95,
    seed=11,
    presence_penalty=0.6,
    repetition_penalty=1.2,
)


def _continued(llm, prompt, params: SamplingParams, k: int, whole):
    ids = whole.outputs[0].token_ids
    again = llm.generate(prompt, dataclasses.replace(params, continue_from=tuple(ids[:k])))[0]
    return again.outputs[0]


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=24, temperature=0.0), SAMPLED])
def test_a_continuation_from_any_point_is_the_uninterrupted_generation(
    tiny_llm, corpus_ids, params
):
    prompt = corpus_ids[:20]
    whole = tiny_llm.generate(prompt, params)[0]
    expected = whole.outputs[0]
    assert len(expected.token_ids) == 24 and expected.finish_reason == "length"
    for k in (1, 9, 23):
        got = _continued(tiny_llm, prompt, params, k, whole)
        assert got.token_ids == expected.token_ids, k
        assert got.text == expected.text and got.finish_reason == "length"
    # Sampled, a second uninterrupted run with the seed is the same too (no hidden state).
    assert tiny_llm.generate(prompt, params)[0].outputs[0].token_ids == expected.token_ids


def test_a_stop_string_across_the_cut_stops_the_continuation_where_it_stopped(tiny_llm, corpus_ids):
    prompt, greedy = corpus_ids[:20], SamplingParams(max_tokens=24, temperature=0.0)
    text = tiny_llm.generate(prompt, greedy)[0].outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    params = dataclasses.replace(greedy, stop=[stop])
    whole = tiny_llm.generate(prompt, params)[0]
    assert whole.outputs[0].finish_reason == "stop" and stop not in whole.outputs[0].text
    cut = len(whole.outputs[0].token_ids) - 1  # the stop string's last token comes after it
    got = _continued(tiny_llm, prompt, params, cut, whole)
    assert (got.text, got.finish_reason, got.stop_reason) == (
        whole.outputs[0].text,
        "stop",
        stop,
    )


def test_a_continuation_past_its_end_or_budget_is_refused(tiny_llm, corpus_ids):
    prompt = corpus_ids[:20]
    params = SamplingParams(max_tokens=6, temperature=0.0)
    whole = tiny_llm.generate(prompt, params)[0]
    with pytest.raises(InvalidRequestError, match="no budget"):
        _continued(tiny_llm, prompt, params, 6, whole)
    with pytest.raises(InvalidRequestError, match="Token ids must be") as refused:
        tiny_llm.generate(prompt, dataclasses.replace(params, continue_from=(10**9,)))
    assert refused.value.param == "continue_from"
    # Nothing was left behind: the engine serves the next request as before.
    assert tiny_llm.generate(prompt, params)[0].outputs[0].token_ids == whole.outputs[0].token_ids
