"""Which model class serves a checkpoint: one module per family beside llama.py, each sharing
its layers (engine/layers/). The architectures the engine accepts at all are
kvpilot_common.precision.ARCHITECTURES (model_config refuses the others, naming them)."""

from kvpilot_server.engine.models.gemma import GemmaForCausalLM
from kvpilot_server.engine.models.gpt_oss import GptOssForCausalLM
from kvpilot_server.engine.models.llama import LlamaForCausalLM
from kvpilot_server.engine.models.model_config import ModelConfig
from kvpilot_server.engine.models.moe import MoeForCausalLM
from kvpilot_server.engine.models.phi3 import Phi3ForCausalLM

# By config.json's architecture; an architecture not named here is Llama's layout.
FAMILIES: dict[str, type[LlamaForCausalLM]] = {
    "MixtralForCausalLM": MoeForCausalLM,
    "Qwen2MoeForCausalLM": MoeForCausalLM,
    "Qwen3MoeForCausalLM": MoeForCausalLM,
    "Gemma2ForCausalLM": GemmaForCausalLM,
    "Gemma3ForCausalLM": GemmaForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
}


def model_class(cfg: ModelConfig) -> type[LlamaForCausalLM]:
    return FAMILIES.get(cfg.architecture, LlamaForCausalLM)
