"""Tiny embedding checkpoints: a tiny random decoder (kvpilot_testing.tiny) with the
sentence-transformers files an embedding release ships (modules.json, the Pooling config, a
Normalize module), so kvpilot's `--task auto` reads them as a real one."""

import json
import shutil
from pathlib import Path

_ST = "sentence_transformers.models."
_ST_MODES = {
    "last": "pooling_mode_lasttoken",
    "mean": "pooling_mode_mean_tokens",
    "cls": "pooling_mode_cls_token",
}


def make_embedding_model(
    decoder: Path, target: Path, mode: str, normalize: bool = True, matryoshka: bool = False
) -> Path:
    """A copy of the checkpoint `decoder` at target that pools by `mode` (once)."""
    if (target / "modules.json").is_file():
        return target
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(decoder, tmp)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": _ST + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": _ST + "Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": _ST + "Normalize"})
    (tmp / "modules.json").write_text(json.dumps(modules))
    config = json.loads((tmp / "config.json").read_text())
    (tmp / "1_Pooling").mkdir()
    pooling = {key: key == _ST_MODES[mode] for key in _ST_MODES.values()}
    pooling["word_embedding_dimension"] = config["hidden_size"]
    (tmp / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if matryoshka:
        config["matryoshka_dimensions"] = [16, 32, config["hidden_size"]]
        (tmp / "config.json").write_text(json.dumps(config))
    tmp.replace(target)
    return target
