"""`kvpilot plan` as users run it (a subprocess, JSON or text): what fits, split across GPUs,
quantized, a mixture of experts with all its experts resident, an architecture the engine does
not serve, planned for and said so; and the figures docs/commands.md shows, as plan says them."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvpilot_common.catalogue import CONFIGS, KNOWN_MODELS
from kvpilot_server.plan import add_plan_args, run_plan


def _plan(*args: str) -> tuple[int, dict]:
    result = subprocess.run(
        [sys.executable, "-m", "kvpilot_common.cli", "plan", "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.returncode, json.loads(result.stdout)


def test_plan_says_what_fits():
    code, big = _plan("--model", "hf://meta-llama/Llama-3.1-70B-Instruct", "--gpu-type", "L4")
    assert code == 1 and not big["fits"] and big["weights_mib"] > 23034
    code, small = _plan("--model", "hf://Qwen/Qwen2.5-7B-Instruct", "--gpu-type", "L4")
    assert code == 0 and small["fits"]
    _, quantized = _plan(
        "--model", "hf://Qwen/Qwen2.5-7B-Instruct", "--gpu-type", "L4", "--quantization", "int8"
    )
    _, kv8 = _plan(
        "--model", "hf://Qwen/Qwen2.5-7B-Instruct", "--gpu-type", "L4", "--kv-cache-dtype", "int8"
    )
    assert quantized["weights_mib"] < 0.6 * small["weights_mib"]
    assert quantized["kv_cache_tokens"] > small["kv_cache_tokens"]
    # Sequences per GiB roughly double against bfloat16; the int8 scales cost 3% at head_dim 128.
    assert 1.9 < small["kv_bytes_per_token"] / kv8["kv_bytes_per_token"] < 2


def test_plan_splits_a_model_across_gpus():
    seventy = ("--model", "hf://meta-llama/Llama-3.1-70B-Instruct", "--gpu-type", "L4")
    int4 = ("--quantization", "int4", "--max-model-len", "8192")
    code, one = _plan(*seventy, *int4)
    assert code == 1 and not one["fits"]
    code, four = _plan(*seventy, *int4, "--tensor-parallel-size", "4")
    assert code == 0 and four["fits"] and four["tensor_parallel_size"] == 4
    # The decoder splits four ways, the embedding and lm_head (4008 MiB in bfloat16) do not.
    embeddings = 2 * 128256 * 8192 * 2 // (1 << 20)
    assert four["weights_mib"] == pytest.approx(
        (one["weights_mib"] - embeddings) / 4 + embeddings, abs=2
    )
    assert four["kv_bytes_per_token"] * 4 == one["kv_bytes_per_token"]  # 8 KV heads, 2 per GPU
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvpilot_common.cli",
            "plan",
            *seventy,
            "--tensor-parallel-size",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "size 3 does not divide the model's 64 attention heads" in result.stderr


def test_plan_counts_an_int8_lm_head():
    args = ["--model", "builtin://smollm2-135m-instruct", "--dtype", "float32"]
    _, full = _plan(*args, "--quantization", "int4")
    _, head = _plan(*args, "--quantization", "int4", "--lm-head-quantization", "int8")
    # SmolLM2's tied 49,152 x 576 table: 108 MiB in float32, 27 MiB in int8 (plus its scales;
    # each figure is rounded down to whole MiB).
    assert 80 <= full["weights_mib"] - head["weights_mib"] <= 81


def test_plan_reports_a_mixture_of_experts_whole_in_memory_and_its_active_parameters():
    qwen = ("--model", "hf://Qwen/Qwen3-30B-A3B", "--gpu-type", "H100-80GB")
    code, one = _plan(*qwen)
    assert code == 0 and one["fits"] and one["servable"] and "unservable_reason" not in one
    assert one["architecture"] == "Qwen3MoeForCausalLM"
    assert (one["experts"], one["experts_per_token"]) == (128, 8)
    assert one["parameters"] == KNOWN_MODELS["hf://Qwen/Qwen3-30B-A3B"].params
    assert one["active_parameters"] < one["parameters"] / 9
    # Every expert resident: 30.5B parameters in bfloat16, not 3.3B.
    assert one["weights_mib"] > one["parameters"] * 2 / (1 << 20) * 0.99
    _, dense = _plan("--model", "hf://Qwen/Qwen3-8B", "--gpu-type", "H100-80GB")
    assert dense["active_parameters"] == dense["parameters"] and "experts" not in dense


def test_plan_plans_for_an_architecture_the_engine_does_not_serve_and_says_so(tmp_path):
    config = {"architectures": ["GPTNeoXForCausalLM"], "hidden_size": 64, "intermediate_size": 96}
    config |= {"num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, neox = _plan("--model", str(tmp_path), "--gpu-type", "L4")
    assert code == 0 and neox["fits"]  # planned all the same
    assert neox["servable"] is False and neox["architecture"] == "GPTNeoXForCausalLM"
    assert neox["unservable_reason"].startswith(
        "Unsupported model architecture 'GPTNeoXForCausalLM'. kvpilot supports: "
    )
    text = subprocess.run(
        [sys.executable, "-m", "kvpilot_common.cli", "plan", "--model", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    assert "servable                     False" in text
    assert "unservable_reason            Unsupported model architecture 'GPTNeoX" in text


def test_plan_splits_a_mixture_of_experts_across_gpus():
    gpt = ("--model", "hf://openai/gpt-oss-120b", "--gpu-type", "H100-80GB")
    code, one = _plan(*gpt)
    assert code == 1 and not one["fits"]  # 117B parameters in bfloat16 on one GPU
    code, four = _plan(*gpt, "--tensor-parallel-size", "4")
    assert code == 0 and four["fits"] and four["weights_mib"] < one["weights_mib"] / 3.5
    assert four["active_parameters"] == one["active_parameters"] < one["parameters"] / 20


def test_plan_names_a_field_a_local_config_lacks(tmp_path):
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = subprocess.run(
        [sys.executable, "-m", "kvpilot_common.cli", "plan", "--model", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "config.json has no 'num_attention_heads'" in result.stderr


COMMANDS_MD = Path(__file__).parents[2] / "docs" / "commands.md"


def _table_rows(first_column: str) -> list[list[str]]:
    """The cells of docs/commands.md's table rows whose first cell starts so."""
    rows = [line.strip("|").split("|") for line in COMMANDS_MD.read_text().splitlines()]
    return [[c.strip() for c in row] for row in rows if row[0].strip().startswith(first_column)]


def _plan_here(capsys, *args: str) -> tuple[int, dict]:
    """`kvpilot plan --json` in this process: the documented rows are many."""
    parser = argparse.ArgumentParser()
    add_plan_args(parser)
    code = run_plan(parser.parse_args(["--json", *args]))
    return code, json.loads(capsys.readouterr().out)


def test_the_documented_plans_are_what_plan_says(capsys):
    figures = [row for row in _table_rows("`hf://") if len(row) == 7]
    assert len(figures) >= 12
    for model, gpus, weights, max_len, weights_mib, tokens, sequences in figures:
        size, _, gpu = gpus.partition(" x ")
        args = ["--model", model.strip("`"), "--gpu-type", gpu, "--tensor-parallel-size", size]
        args += ["--max-model-len", max_len]
        args += [] if weights == "bfloat16" else ["--quantization", weights]
        code, plan = _plan_here(capsys, *args)
        said = (int(weights_mib), int(tokens), sequences)
        fits = str(plan["sequences_at_max_model_len"]) if plan["fits"] else "does not fit"
        assert said == (plan["weights_mib"], plan["kv_cache_tokens"], fits), (model, gpus)
        assert code == (0 if plan["fits"] else 1)


def test_the_documented_catalogue_is_the_catalogue(capsys):
    models = [row for row in _table_rows("`hf://") if len(row) == 5]
    assert {row[0].strip("`") for row in models} == set(CONFIGS)
    for model, architecture, parameters, experts, served in models:
        _, plan = _plan_here(capsys, "--model", model.strip("`"))
        assert architecture == plan["architecture"], model
        assert served == ("yes" if plan["servable"] else "no"), model
        total, _, active = parameters.partition(" (")
        assert total == f"{plan['parameters'] / 1e9:.1f}B", model
        if plan.get("experts"):
            assert experts == f"{plan['experts']} ({plan['experts_per_token']})", model
            assert active.rstrip(")B") in (
                f"{plan['active_parameters'] / 1e9:.2f}",
                f"{plan['active_parameters'] / 1e9:.3g}",
            ), model
        else:
            assert experts == "dense" and not active, model
