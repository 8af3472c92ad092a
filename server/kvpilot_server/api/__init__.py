"""The OpenAI-compatible HTTP API (Starlette) in front of the async engine."""
