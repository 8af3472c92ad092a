"""Structured outputs: grammars compiled from requests, and the per-step token masks."""
