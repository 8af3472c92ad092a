"""The engine's runtime: requests in, steps scheduled over the paged KV cache, run on the model,
sampled and detokenized, outputs out (synchronously, or behind an asyncio server)."""
