"""An adapter as vLLM's offline API names one for a request."""

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """The adapter a request runs with: the name it is known by and the directory of its peft
    files (read on first use). lora_int_id is accepted for vLLM's sake and not needed: kvpilot
    gives every load an id of its own."""

    lora_name: str
    lora_int_id: int = 0
    lora_path: str = ""
