"""Workloads: request classes, an arrival process and a stopping rule, read from YAML.

A workload is a YAML file or the name of a preset shipped beside this module (presets/*.yaml),
validated against workload.schema.json. Lengths are distributions in tokens; cancellations
happen after a sampled time (after_ms) or after a sampled number of streamed tokens
(after_tokens). A chat class may carry `structured` variants: each request of the class draws
one (by weight) and sends its instruction before the prompt's text, with its `response_format`
or its `tools` and `tool_choice` (OpenAI's fields); validity.py checks the answers.
docs/bench.md describes every field.
"""

import json
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

HERE = Path(__file__).parent
PRESETS = HERE / "presets"
DEFAULT_DURATION_S = 60.0
DEFAULT_MAX_REQUESTS = 100_000  # every run is bounded in count as well as in time
DEFAULT_TIMEOUT_S = 120.0


class WorkloadError(ValueError):
    """A workload that cannot run, said in one line."""


@dataclass(frozen=True)
class Distribution:
    dist: str
    params: dict[str, float]

    @classmethod
    def parse(cls, spec: dict[str, Any]) -> "Distribution":
        return cls(spec["dist"], {k: float(v) for k, v in spec.items() if k != "dist"})


@dataclass(frozen=True)
class Cancel:
    probability: float
    after_ms: Distribution | None = None
    after_tokens: Distribution | None = None


@dataclass(frozen=True)
class Variant:
    """One kind of structured request: an instruction and what the answer must be."""

    name: str
    instruction: str  # sent before the prompt's text
    weight: float = 1.0
    response_format: dict[str, Any] | None = None  # OpenAI's, as sent
    tools: tuple[dict[str, Any], ...] = ()  # OpenAI's function tools, as sent
    tool_choice: str | dict[str, Any] | None = None  # auto, required or a named function

    @property
    def schema(self) -> dict[str, Any] | None:
        """The JSON schema a content answer must meet (json_object: any object)."""
        rf = self.response_format
        if rf is None:
            return None
        if rf["type"] == "json_schema":
            schema: dict[str, Any] = rf["json_schema"]["schema"]
            return schema
        return {"type": "object"}

    def parameters(self) -> dict[str, dict[str, Any]]:
        """Each offered tool's name -> the schema its arguments must meet."""
        return {
            t["function"]["name"]: t["function"].get("parameters", {"type": "object"})
            for t in self.tools
        }

    @property
    def forced_tool(self) -> str | None:
        """The function tool_choice names, if it names one."""
        if isinstance(self.tool_choice, dict):
            name: str = self.tool_choice["function"]["name"]
            return name
        return None


@dataclass(frozen=True)
class RequestClass:
    name: str
    share: float
    prompt_tokens: Distribution
    output_tokens: Distribution
    api: str = "chat"
    stream: bool = True
    ignore_eos: bool = True
    temperature: float = 0.0
    service_tier: str | None = None
    cancel: Cancel | None = None
    structured: tuple[Variant, ...] = ()  # one drawn per request, by weight


@dataclass(frozen=True)
class Arrival:
    process: str
    params: dict[str, Any]


@dataclass(frozen=True)
class Workload:
    name: str
    arrival: Arrival
    classes: tuple[RequestClass, ...]
    seed: int = 0
    duration_s: float = DEFAULT_DURATION_S
    max_requests: int = DEFAULT_MAX_REQUESTS
    timeout_s: float = DEFAULT_TIMEOUT_S
    prompts_source: str = "python-docs"
    prompts_path: str | None = None
    description: str = ""
    spec: dict[str, Any] = field(default_factory=dict, compare=False)  # as read, for the report

    def with_rate(self, rate: float) -> "Workload":
        """The same classes under Poisson arrivals at `rate` requests/s (sweep steps, --rate)."""
        arrival = Arrival("poisson", {"rate": rate})
        spec = {**self.spec, "arrival": {"process": "poisson", "rate": rate}}
        return replace(self, arrival=arrival, spec=spec)

    def with_limits(
        self,
        duration_s: float | None = None,
        max_requests: int | None = None,
        seed: int | None = None,
    ) -> "Workload":
        changes: dict[str, Any] = {}
        if duration_s is not None:
            changes["duration_s"] = duration_s
        if max_requests is not None:
            changes["max_requests"] = max_requests
        if seed is not None:
            changes["seed"] = seed
        return replace(self, **changes, spec={**self.spec, **changes})


@cache
def schema() -> dict[str, Any]:
    return json.loads((HERE / "workload.schema.json").read_text())


def presets() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def load(name_or_path: str) -> Workload:
    """A preset's name or a YAML file's path -> a validated Workload."""
    path = Path(name_or_path)
    if not path.is_file():
        if name_or_path not in presets():
            raise WorkloadError(
                f"workload {name_or_path!r}: no such file and no such preset "
                f"(presets: {', '.join(presets())})"
            )
        path = PRESETS / f"{name_or_path}.yaml"
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise WorkloadError(f"workload {path}: not YAML: {exc}") from None
    return parse(spec, str(path))


def parse(spec: Any, where: str = "workload") -> Workload:
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(schema()).iter_errors(spec)
    )
    if error is not None:
        at = "/".join(str(p) for p in error.absolute_path) or "(top)"
        raise WorkloadError(f"{where}: {at}: {error.message}")
    classes = tuple(_request_class(c, where) for c in spec["classes"])
    if len({c.name for c in classes}) != len(classes):
        raise WorkloadError(f"{where}: class names must differ")
    arrival = spec["arrival"]
    prompts = spec.get("prompts", {"source": "python-docs"})
    if prompts["source"] == "jsonl" and not prompts.get("path"):
        raise WorkloadError(f"{where}: prompts: source jsonl needs a path")
    return Workload(
        name=spec["name"],
        description=spec.get("description", ""),
        arrival=Arrival(arrival["process"], {k: v for k, v in arrival.items() if k != "process"}),
        classes=classes,
        seed=spec.get("seed", 0),
        duration_s=float(spec.get("duration_s", DEFAULT_DURATION_S)),
        max_requests=spec.get("max_requests", DEFAULT_MAX_REQUESTS),
        timeout_s=float(spec.get("timeout_s", DEFAULT_TIMEOUT_S)),
        prompts_source=prompts["source"],
        prompts_path=prompts.get("path"),
        spec=spec,
    )


def _request_class(spec: dict[str, Any], where: str) -> RequestClass:
    cancel = None
    if "cancel" in spec:
        c = spec["cancel"]
        if "after_tokens" in c and not spec.get("stream", True):
            raise WorkloadError(
                f"{where}: class {spec['name']}: cancel.after_tokens needs stream: true "
                "(a non-streaming client sees no tokens before the end)"
            )
        cancel = Cancel(
            c["probability"],
            Distribution.parse(c["after_ms"]) if "after_ms" in c else None,
            Distribution.parse(c["after_tokens"]) if "after_tokens" in c else None,
        )
    for key in ("prompt_tokens", "output_tokens"):
        d = spec[key]
        if d.get("min", 0) > d.get("max", float("inf")):
            raise WorkloadError(f"{where}: class {spec['name']}: {key}: min above max")
    structured = tuple(
        _variant(v, f"{where}: class {spec['name']}") for v in spec.get("structured", ())
    )
    if structured:
        if spec.get("api", "chat") != "chat":
            raise WorkloadError(f"{where}: class {spec['name']}: structured needs api: chat")
        if spec.get("ignore_eos") is True:
            raise WorkloadError(
                f"{where}: class {spec['name']}: structured answers end where their JSON ends: "
                "ignore_eos must be false"
            )
        if len({v.name for v in structured}) != len(structured):
            raise WorkloadError(f"{where}: class {spec['name']}: structured names must differ")
    return RequestClass(
        name=spec["name"],
        share=float(spec["share"]),
        prompt_tokens=Distribution.parse(spec["prompt_tokens"]),
        output_tokens=Distribution.parse(spec["output_tokens"]),
        api=spec.get("api", "chat"),
        stream=spec.get("stream", True),
        ignore_eos=spec.get("ignore_eos", not structured),
        temperature=float(spec.get("temperature", 0.0)),
        service_tier=spec.get("service_tier"),
        cancel=cancel,
        structured=structured,
    )


def _variant(spec: dict[str, Any], where: str) -> Variant:
    where = f"{where}: structured {spec['name']}"
    rf = spec.get("response_format")
    schemas = []
    if rf is not None and rf["type"] == "json_schema":
        schemas.append(("response_format", rf["json_schema"]["schema"]))
    tools = tuple(spec.get("tools", ()))
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise WorkloadError(f"{where}: tool names must differ")
    for t in tools:
        if "parameters" in t["function"]:
            schemas.append((f"tool {t['function']['name']}", t["function"]["parameters"]))
    choice = spec.get("tool_choice")
    if isinstance(choice, dict) and choice["function"]["name"] not in names:
        raise WorkloadError(
            f"{where}: tool_choice names {choice['function']['name']!r}, which is not in tools"
        )
    for what, schema_ in schemas:
        try:
            jsonschema.validators.validator_for(
                schema_, default=jsonschema.Draft202012Validator
            ).check_schema(schema_)
        except jsonschema.exceptions.SchemaError as exc:
            raise WorkloadError(f"{where}: {what}: not a JSON schema: {exc.message}") from None
    return Variant(
        name=spec["name"],
        instruction=spec["instruction"],
        weight=float(spec.get("weight", 1.0)),
        response_format=rf,
        tools=tools,
        tool_choice=choice,
    )
