"""Turn a model source (builtin://, hf://, a local directory) into a local checkpoint directory."""

from pathlib import Path

from kvpilot_common.errors import ModelLoadError
from kvpilot_server.models.builtin import builtin_path


def resolve_model(source: str, revision: str | None = None) -> Path:
    if source.startswith("builtin://"):
        return builtin_path(source.removeprefix("builtin://"))
    if source.startswith("hf://"):
        return _hub_snapshot(source.removeprefix("hf://"), revision)
    path = Path(source.removeprefix("file://")).expanduser()
    if not path.is_dir():
        raise ModelLoadError(f"Model path {str(path)!r} does not exist or is not a directory")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"Model directory {str(path)!r} has no config.json")
    return path


def _hub_snapshot(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, revision=revision))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise ModelLoadError(f"Cannot fetch hf://{repo_id}: {exc}") from exc
