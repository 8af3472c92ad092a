"""The bundled model converts once; an interrupted conversion leaves nothing half-written."""

import pytest

from kvpilot_common.errors import ModelLoadError
from kvpilot_server.models import builtin


def test_interrupted_conversion_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVPILOT_CACHE", str(tmp_path))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", interrupted)
    with pytest.raises(KeyboardInterrupt):
        builtin.builtin_path("smollm2-135m-instruct")
    leftovers = list((tmp_path / "builtin").iterdir())
    assert leftovers == []  # neither the target nor a temporary directory


@pytest.mark.slow  # a whole conversion of SmolLM2 from its GGUF, into a cache of its own
def test_a_conversion_is_readable_by_other_users(tmp_path, monkeypatch):
    """An image converts the model as root and serves it as uid 1000: every file must be
    readable by others (safetensors writes its file 0600; a real kubelet's pod met that)."""
    monkeypatch.setenv("KVPILOT_CACHE", str(tmp_path))
    path = builtin.builtin_path("smollm2-135m-instruct")
    assert path.stat().st_mode & 0o005 == 0o005
    for file in path.iterdir():
        assert file.stat().st_mode & 0o004, file.name


def test_converted_cache_is_reused(smollm2, monkeypatch):
    monkeypatch.setattr(builtin, "_convert", lambda *a: pytest.fail("converted twice"))
    assert builtin.builtin_path("smollm2-135m-instruct") == smollm2
    assert (smollm2 / "model.safetensors").is_file() and (smollm2 / "chat_template.jinja").is_file()


def test_unknown_builtin_model_names_the_available_ones():
    with pytest.raises(ModelLoadError, match="available: smollm2-135m-instruct"):
        builtin.builtin_path("gpt-17")


def test_a_copy_converted_into_the_image_is_used_before_the_cache(tmp_path, monkeypatch, smollm2):
    """The image converts the model at build time into KVPILOT_BUILTIN_DIR; the operator mounts
    an empty cache volume, which must not send every pod through the conversion again."""
    baked = tmp_path / "baked"
    baked.mkdir()
    (baked / "smollm2-135m-instruct").symlink_to(smollm2, target_is_directory=True)
    monkeypatch.setenv("KVPILOT_BUILTIN_DIR", str(baked))
    monkeypatch.setenv("KVPILOT_CACHE", str(tmp_path / "empty-cache"))
    assert builtin.builtin_path("smollm2-135m-instruct") == baked / "smollm2-135m-instruct"
    assert not (tmp_path / "empty-cache").exists()
