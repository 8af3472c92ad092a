"""LoRA adapters served beside their base model: read from peft's files (adapter.py), applied
to a step's rows as grouped products (layers.py), kept in a bounded set of slots (slots.py)."""
