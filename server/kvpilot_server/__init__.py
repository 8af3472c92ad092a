"""kvpilot's engine and server. Exports are lazy so that light users (the operator, the CLI's
argument parsing) never import torch through this package."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvpilot_server.llm import LLM
    from kvpilot_server.lora_request import LoRARequest
    from kvpilot_server.sampling_params import SamplingParams

__all__ = ["LLM", "LoRARequest", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from kvpilot_server.llm import LLM

        return LLM
    if name == "LoRARequest":
        from kvpilot_server.lora_request import LoRARequest

        return LoRARequest
    if name == "SamplingParams":
        from kvpilot_server.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
