"""`kvpilot bench`: a capacity test for any OpenAI-compatible server (docs/bench.md).

workload (YAML and presets) -> plan (when, which class, how long) -> prompts (real text) ->
runner + client (open-loop load, timed requests) -> stats -> report (JSON, tables) and plot;
sweep and compare run the same pieces several times. Only cli.py is imported by `kvpilot`'s
parser, and it imports nothing beyond the standard library.
"""
