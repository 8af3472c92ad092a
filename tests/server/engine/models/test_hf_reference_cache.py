"""The Hugging Face oracle's answers kept on disk (kvpilot_testing.hf_cache): a stored answer is
the one Hugging Face gave for the same files, versions and arguments; anything else about an
entry (other files, another key, a damaged file) means computing it again."""

import json
import shutil
from pathlib import Path

import pytest

from kvpilot_testing import hf_cache
from kvpilot_testing.hf_reference import float32_reference, hf_greedy_of


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KVPILOT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "hf-reference"


def _counting(value):
    calls = []

    def compute():
        calls.append(1)
        return value

    return compute, calls


def test_a_miss_runs_hugging_face_and_a_hit_gives_back_its_answer(cache, tiny_dir, corpus_ids):
    path = tiny_dir("llama")
    prompt = corpus_ids[:9]
    reference = float32_reference(path)
    first = reference.greedy(prompt, 6)
    assert first == hf_greedy_of(reference.model(), prompt, 6)  # the same code, run here
    [entry] = cache.glob("*.json")
    stored = json.loads(entry.read_text())
    assert stored["value"] == first and stored["key"]["prompt"] == prompt
    assert stored["key"]["environment"]["torch"] and stored["key"]["max_new_tokens"] == 6
    compute, calls = _counting([0])
    assert hf_cache.cached(reference.greedy_key(prompt, 6), compute) == first
    assert calls == []  # a hit: Hugging Face is not asked again
    assert reference.greedy(prompt, 7)[:6] == first  # another argument: its own entry
    assert len(list(cache.glob("*.json"))) == 2


def test_the_key_is_the_files_not_the_path(cache, tiny_dir, tmp_path):
    path = tiny_dir("qwen3")
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    assert hf_cache.directory_digest(copy) == hf_cache.directory_digest(path)
    config = json.loads((copy / "config.json").read_text())
    config["rms_norm_eps"] = config["rms_norm_eps"] * 10
    (copy / "config.json").write_text(json.dumps(config))  # rewritten in place, same path
    assert hf_cache.directory_digest(copy) != hf_cache.directory_digest(path)


@pytest.mark.parametrize(
    "damage",
    [
        lambda entry: entry.write_text(entry.read_text()[:-9]),  # cut short
        lambda entry: entry.write_bytes(b"\xff\xfe not json"),
        lambda entry: entry.write_text(json.dumps({"key": {"other": 1}, "value": [5]})),
        lambda entry: entry.write_text(json.dumps([1, 2])),
    ],
)
def test_a_damaged_or_foreign_entry_is_computed_again(cache, damage):
    key = {"call": "test", "n": 1}
    compute, calls = _counting([1, 2, 3])
    assert hf_cache.cached(key, compute) == [1, 2, 3]
    [entry] = cache.glob("*.json")
    damage(entry)
    assert hf_cache.cached(key, compute) == [1, 2, 3]
    assert len(calls) == 2
    assert hf_cache.cached(key, compute) == [1, 2, 3] and len(calls) == 2  # rewritten whole
    assert [p.name for p in cache.iterdir()] == [entry.name]  # no temporary file left behind


def test_a_failed_computation_stores_nothing(cache):
    def fails():
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        hf_cache.cached({"call": "test"}, fails)
    assert not cache.exists() or not list(cache.iterdir())
