"""Workloads and plans: presets validate, bad files are refused in one line, plans are seeded,
bounded in time and count, and follow their arrival process, shares and length limits."""

import copy

import numpy as np
import pytest
import yaml

from kvpilot_bench import plan as planning
from kvpilot_bench.prompts import Corpus, fit, read_jsonl
from kvpilot_bench.workload import WorkloadError, load, parse, presets

BASE = {
    "name": "t",
    "seed": 3,
    "duration_s": 100,
    "arrival": {"process": "poisson", "rate": 5},
    "classes": [
        {
            "name": "a",
            "share": 3,
            "prompt_tokens": {
                "dist": "lognormal",
                "median": 100,
                "sigma": 1,
                "min": 10,
                "max": 300,
            },
            "output_tokens": {"dist": "uniform", "min": 5, "max": 50},
            "cancel": {"probability": 0.2, "after_ms": {"dist": "fixed", "value": 250}},
        },
        {
            "name": "b",
            "share": 1,
            "stream": False,
            "prompt_tokens": {"dist": "normal", "mean": 50, "std": 20, "min": 1},
            "output_tokens": {"dist": "fixed", "value": 7},
        },
    ],
}


def _spec(**changes):
    spec = copy.deepcopy(BASE)
    spec.update(changes)
    return spec


def test_presets_validate():
    assert presets() == ["chat", "mixed", "structured", "summarize"]
    for name in presets():
        workload = load(name)
        assert workload.name == name and workload.classes
    mixed = load("mixed")
    assert {c.name for c in mixed.classes} == {"chat", "summarize", "batch"}
    assert any(c.service_tier == "flex" for c in mixed.classes)
    assert any(c.cancel for c in mixed.classes) and any(not c.stream for c in mixed.classes)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"arrival": {"process": "poisson"}}, "arrival"),
        ({"arrival": {"process": "teleport", "rate": 1}}, "arrival"),
        ({"duration_s": -1}, "duration_s"),
        ({"classes": []}, "classes"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_bad_workloads_are_refused_in_one_line(change, message):
    with pytest.raises(WorkloadError) as error:
        parse(_spec(**change), "w.yaml")
    text = str(error.value)
    assert text.startswith("w.yaml: ") and message in text and "\n" not in text


def test_semantic_checks():
    spec = _spec()
    spec["classes"][1]["cancel"] = {"probability": 1, "after_tokens": {"dist": "fixed", "value": 2}}
    with pytest.raises(WorkloadError, match="after_tokens needs stream: true"):
        parse(spec)
    spec = _spec()
    spec["classes"][1]["name"] = "a"
    with pytest.raises(WorkloadError, match="names must differ"):
        parse(spec)
    with pytest.raises(WorkloadError, match="no such preset"):
        load("no-such-workload")


def test_a_yaml_file_loads(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(_spec()))
    assert load(str(path)).classes[0].cancel.after_ms.params == {"value": 250.0}


def test_plans_are_seeded_and_follow_shares_lengths_and_cancellations():
    workload = parse(_spec())
    plan = planning.build(workload)
    assert plan == planning.build(workload)  # same seed, same plan
    assert plan != planning.build(workload.with_limits(seed=4))
    n = len(plan)
    assert 400 < n < 600  # Poisson: 500 expected in 100 s at 5/s
    assert all(0 <= p.at < 100 for p in plan) and [p.at for p in plan] == sorted(p.at for p in plan)
    a = [p for p in plan if p.cls.name == "a"]
    assert 0.65 < len(a) / n < 0.85  # share 3:1
    assert all(10 <= p.prompt_tokens <= 300 and 5 <= p.output_tokens <= 50 for p in a)
    cancelled = [p for p in a if p.cancel_after_s is not None]
    assert 0.1 < len(cancelled) / len(a) < 0.3 and {p.cancel_after_s for p in cancelled} == {0.25}
    b = [p for p in plan if p.cls.name == "b"]
    assert all(p.output_tokens == 7 and p.cancel_after_s is None for p in b)


def test_arrival_processes():
    rng = np.random.default_rng(0)

    def times(arrival, end=60.0, limit=100_000):
        return planning.arrival_times(parse(_spec(arrival=arrival)).arrival, end, limit, rng)

    constant = times({"process": "constant", "rate": 2})
    assert len(constant) == 120 and np.allclose(np.diff(constant), 0.5)
    burst = times({"process": "burst", "size": 10, "every_s": 20})
    assert list(burst) == [0.0] * 10 + [20.0] * 10 + [40.0] * 10
    ramp = times({"process": "ramp", "from_rate": 0, "to_rate": 20, "over_s": 60})
    assert 500 < len(ramp) < 700  # 600 expected
    assert (ramp < 30).sum() < (ramp >= 30).sum() / 2  # a quarter before the middle
    step = times(
        {
            "process": "step",
            "steps": [{"rate": 1, "duration_s": 20}, {"rate": 10, "duration_s": 10}],
        }
    )
    assert 5 < (step < 20).sum() < 40 and 60 < (step >= 20).sum() < 140 and step.max() < 30
    assert len(times({"process": "poisson", "rate": 1000}, end=3600, limit=50)) == 50  # bounded


def test_fit_shortens_to_the_context():
    assert fit(100, 50, None, 30) == (100, 50)
    assert fit(100, 50, 256, 30) == (100, 50)
    assert fit(300, 50, 256, 30) == (168, 50)  # 256 - 30 - 8 margin = 218 tokens of room
    assert fit(10, 500, 256, 30) == (109, 109)


def test_corpus_text_has_about_the_asked_length():
    paragraphs = [" ".join(f"w{i}x{j}" for j in range(50)) for i in range(20)]
    corpus = Corpus(paragraphs, [100] * 20)  # two tokens per word
    for tokens in (1, 10, 99, 250, 1000):
        words = len(corpus.text(tokens, seed=tokens).split())
        assert abs(2 * words - tokens) <= 2 + tokens // 50, (tokens, words)
    assert corpus.text(80, seed=1) == corpus.text(80, seed=1) != corpus.text(80, seed=2)


def test_the_default_corpus_is_real_text():
    from kvpilot_common.prose import default_text

    text = default_text()
    assert len(text) > 100_000 and "statement" in text


def test_jsonl_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt": "hi"}\n\n{"messages": [{"role": "user", "content": "yo"}], "max_tokens": 5}\n'
    )
    first, second = read_jsonl(str(path))
    assert first.text == "hi" and second.messages[0]["content"] == "yo" and second.max_tokens == 5
    path.write_text('{"prompt": "ok"}\n{"nothing": 1}\n')
    with pytest.raises(ValueError, match=r"p\.jsonl:2"):
        read_jsonl(str(path))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "nope"], "workload 'nope': no such file and no such preset"),
        (["--sweep"], "--sweep needs an SLO"),
        (["--rate", "0"], "--rate must be positive"),
        (["--sweep", "--slo-e2e-ms", "9", "--compare", "http://x"], "do not go together"),
        ([], "cannot reach http://127.0.0.1:9"),
    ],
)
def test_mistakes_end_in_one_line(capsys, args, message):
    from kvpilot_common.cli import main

    assert main(["bench", "--url", "http://127.0.0.1:9", "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvpilot bench: ") and message in err and err.count("\n") == 1
