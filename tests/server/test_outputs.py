"""The request outputs are plain data: they load, and are built, in a Python without torch."""

import textwrap

from kvpilot_testing.hiding import hidden_imports, hiding_env, run_python


def test_outputs_load_without_torch(tmp_path):
    env = hiding_env(tmp_path, hide={"torch", "transformers"})
    check = textwrap.dedent(
        """
        import sys
        from kvpilot_server.outputs import CompletionOutput, RequestMetrics, RequestOutput, Sample
        sample = Sample(7, -0.5, [(7, -0.5)])
        completion = CompletionOutput(0, "hi", [7], "stop", logprobs=[sample])
        output = RequestOutput("r", "p", [1, 2], [completion], True, RequestMetrics(0.0))
        assert output.usage.total_tokens == 3
        heavy = [m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")]
        assert not heavy, heavy
        """
    )
    result = run_python(env, "-c", check)
    assert result.returncode == 0, result.stderr
    assert not {m.partition(".")[0] for m in hidden_imports(tmp_path)} & {"torch", "transformers"}
