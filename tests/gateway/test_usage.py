"""What the gateway reserves of a tenant's tokens per minute for a request (usage.py), before
its replica reports what it cost."""

from kvpilot_gateway.target import parse
from kvpilot_gateway.usage import UNCAPPED_TOKENS, estimate


def reserved(body: bytes, path: str, context: int = 0) -> int:
    """What the gateway reserves for `body`, read by the parse routing makes."""
    return estimate(parse(body, None), path, context).reserved


def test_the_gateway_reserves_a_prompt_and_what_the_top_level_max_tokens_allow():
    chat, completion = "/v1/chat/completions", "/v1/completions"
    body = b'{"model": "m", "n": 2, "max_tokens": 50, "messages": []}'
    assert reserved(body, chat) == len(body) // 4 + 2 * 50
    # A nested max_tokens (an extra field the server ignores) is no cap: its own default is.
    decoy = b'{"model": "m", "metadata": {"max_tokens": 1, "n": 1}, "messages": []}'
    assert reserved(decoy, chat) == len(decoy) // 4 + UNCAPPED_TOKENS
    assert reserved(decoy, completion) == len(decoy) // 4 + 16  # OpenAI's default
    both = b'{"model": "m", "max_tokens": 9, "max_completion_tokens": 30, "max_tokens": 40}'
    # The last of a repeated key wins, as in the server's parser.
    assert reserved(both, chat) == len(both) // 4 + 30
    assert reserved(both, completion) == len(both) // 4 + 40
    embedding = b'{"model": "m", "input": "abcdefgh"}'
    assert reserved(embedding, "/v1/embeddings") == len(embedding) // 4


def test_a_chat_without_max_tokens_reserves_the_context_its_replicas_report():
    """Most chat clients send no max_tokens: such a chat may run to the model's context, and
    reserving less would let a tenant's chats at once overdraw its limit many times over."""
    body = b'{"model": "m", "n": 2, "messages": []}'
    assert reserved(body, "/v1/chat/completions", context=8192) == len(body) // 4 + 2 * 8192
    capped = b'{"model": "m", "max_tokens": 7, "messages": []}'
    assert reserved(capped, "/v1/chat/completions", context=8192) == len(capped) // 4 + 7
