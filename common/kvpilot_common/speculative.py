"""Speculative decoding's settings as data: the methods in both spellings and the defaults.

The one source: the engine's configuration (kvpilot_server/config.py) and the operator
(spec.engine.speculativeDecoding, engine_flags.py) import them, and tests hold the CRD's enum
and defaults equal to them. Standard library only: the operator imports it without torch.
"""

from types import MappingProxyType

# The engine's and CLI's spelling -> the CRD's (Kubernetes enums are CamelCase).
METHODS = MappingProxyType({"none": "None", "ngram": "Ngram"})
DEFAULT_METHOD = "none"
# 3: a lone sequence's drafted step is 4 rows, which the CPU kernels serve as they serve one
# (the compiled silu up to 4 rows), so quantized output is the same with drafts as without.
DEFAULT_NUM_TOKENS = 3
DEFAULT_LOOKUP_MAX = 4  # the longest run of last tokens looked up
DEFAULT_LOOKUP_MIN = 2  # one token matches too often to be worth a draft
# Above it a CPU step is no longer bound by reading the weights, and draft positions cost
# about what they save (benchmarks/speculative.py measures both sides of it).
DEFAULT_DISABLE_BY_BATCH_SIZE = 16
