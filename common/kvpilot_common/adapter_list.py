"""The list of LoRA adapters a model pod should serve: the operator writes it into a ConfigMap
the pod mounts, and `kvpilot serve --lora-config FILE` keeps its loaded adapters equal to it.
One format, here, for both sides. JSON: [{"name", "source", "revision", "path"}], `path` where
the pod finds the adapter's files (an hf:// adapter's is where the server downloads it)."""

import json
from dataclasses import asdict, dataclass

FILE_NAME = "adapters.json"


@dataclass(frozen=True)
class Entry:
    name: str
    source: str
    path: str
    revision: str = "main"


def encode(entries: list[Entry]) -> str:
    return json.dumps([asdict(e) for e in entries], indent=1, sort_keys=True) + "\n"


def decode(text: str) -> list[Entry]:
    """ValueError for anything but a list of entries."""
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("an adapter list must be a JSON array")
    entries = []
    for item in data:
        if not isinstance(item, dict) or not {"name", "source", "path"} <= set(item):
            raise ValueError(f"not an adapter entry: {item!r}")
        entries.append(Entry(**{k: str(v) for k, v in item.items() if k in Entry.__annotations__}))
    return entries
