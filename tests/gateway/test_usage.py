"""What the gateway reserves of a tenant's tokens per minute for a request (usage.py), before
its replica reports what it cost."""

from kvpilot_gateway.usage import UNCAPPED_TOKENS, estimate


def test_the_gateway_reserves_a_prompt_and_what_the_top_level_max_tokens_allow():
    chat, completion = "/v1/chat/completions", "/v1/completions"
    body = b'{"model": "m", "n": 2, "max_tokens": 50, "messages": []}'
    assert estimate(body, chat).reserved == len(body) // 4 + 2 * 50
    # A nested max_tokens (an extra field the server ignores) is no cap: its own default is.
    decoy = b'{"model": "m", "metadata": {"max_tokens": 1, "n": 1}, "messages": []}'
    assert estimate(decoy, chat).reserved == len(decoy) // 4 + UNCAPPED_TOKENS
    assert estimate(decoy, completion).reserved == len(decoy) // 4 + 16  # OpenAI's default
    both = b'{"max_tokens": 9, "max_completion_tokens": 30, "max_tokens": 40}'  # last one wins
    assert estimate(both, chat).reserved == len(both) // 4 + 30
    assert estimate(both, completion).reserved == len(both) // 4 + 40
    assert estimate(b'{"input": "abcdefgh"}', "/v1/embeddings").reserved == 5


def test_a_chat_without_max_tokens_reserves_the_context_its_replicas_report():
    """Most chat clients send no max_tokens: such a chat may run to the model's context, and
    reserving less would let a tenant's chats at once overdraw its limit many times over."""
    body = b'{"model": "m", "n": 2, "messages": []}'
    assert (
        estimate(body, "/v1/chat/completions", context=8192).reserved == len(body) // 4 + 2 * 8192
    )
    capped = b'{"model": "m", "max_tokens": 7, "messages": []}'
    assert estimate(capped, "/v1/chat/completions", context=8192).reserved == len(capped) // 4 + 7
