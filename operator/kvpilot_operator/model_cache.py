"""The model cache volume's size limit (an emptyDir's sizeLimit: the kubelet evicts the pod that
writes more, rather than a runaway download filling the node's disk and evicting others).

Derived from the model, not one default, because a 135M and a 70B model differ 500-fold. On disk
a checkpoint takes at most 4 bytes per parameter: float32 (the builtin model is converted to
it), or 16 bits shipped twice (Llama's original/, Mistral's consolidated.safetensors; `hf
download` fetches the whole repository). A quarter more and 2 GiB cover tokenizers, metadata
and the HF cache. resources.modelCacheGiB overrides it, e.g. for a large uncatalogued model."""

import math

from kvpilot_common.catalogue import KNOWN_MODELS
from kvpilot_common.memory_model import GiB
from kvpilot_operator.spec import Spec

CHECKPOINT_BYTES_PER_PARAM = 4
CACHE_SLACK = 1.25
CACHE_BASE_BYTES = 2 * GiB  # also all a pvc:// pod's cache holds: its weights stay on the claim
UNKNOWN_MODEL_CACHE_GIB = 100  # an hf:// model the memory model does not know (~20B parameters)
# Room for hf:// adapters downloaded into the same volume (a rank-64 adapter of every
# projection of a 70B model in float32 is about 1.6 GiB; most are tens of MiB). One amount for
# any list: a limit that followed the list would change the pod template, and so restart the
# pods, on every edit of spec.adapters.
ADAPTER_CACHE_GIB = 16


def model_cache_gib(spec: Spec) -> int:
    """The model cache volume's size limit in GiB."""
    source = spec.model.source
    if spec.resources.model_cache_gib:
        return spec.resources.model_cache_gib
    adapters = ADAPTER_CACHE_GIB if spec.adapters else 0
    if source.startswith("pvc://"):
        return CACHE_BASE_BYTES // GiB + adapters
    shape = KNOWN_MODELS.get(source)
    if shape is None:
        return UNKNOWN_MODEL_CACHE_GIB + adapters
    checkpoint = shape.params * CHECKPOINT_BYTES_PER_PARAM * CACHE_SLACK
    return math.ceil((checkpoint + CACHE_BASE_BYTES) / GiB) + adapters
