"""The request fields that constrain the output, in every spelling clients send, to one spec.

OpenAI's `response_format` (text, json_object, json_schema), vLLM's `structured_outputs`
object and its older top-level `guided_*` fields all become one StructuredOutputsParams. More
than one constraint in a request is a 400: which should win is not ours to guess. A JSON schema
is closed to keys it does not name under `strict` and vLLM's `disable_additional_properties`
(json_schemas.closed); vLLM's `whitespace_pattern` replaces the engine's fixed JSON spacing.
"""

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvpilot_common.errors import InvalidRequestError
from kvpilot_server.api.json_schemas import Schema, closed, styled
from kvpilot_server.sampling_params import StructuredOutputsParams

# Spellings of vLLM's backend choice: kvpilot has one backend (llguidance) and enforces the
# same constraint whichever is named; an unknown name is a typo worth a 400.
BACKENDS = ("auto", "guidance", "llguidance", "xgrammar", "outlines", "lm-format-enforcer")


class _Strict(BaseModel):
    """Nested objects refuse unknown keys: a misspelt constraint must not pass unenforced."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class JsonSchemaFormat(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    schema_: Annotated[dict[str, Any], Field(alias="schema")] = {}
    # Enforced whatever its value: kvpilot never answers outside a schema it was given.
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsField(_Strict):
    """vLLM's `structured_outputs` object."""

    json_: Annotated[dict[str, Any] | str | None, Field(alias="json")] = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # kvpilot generates JSON without free whitespace already (engine/structured/grammar.py).
    disable_any_whitespace: bool | None = None
    # The whitespace JSON may hold between its tokens, as a regex (outlines' vLLM backend).
    whitespace_pattern: Annotated[str, Field(max_length=256)] | None = None
    disable_additional_properties: bool | None = None
    # kvpilot has one backend and never falls back to another: honoured as it stands.
    disable_fallback: bool | None = None


class StructuredFields(BaseModel):
    """Mixed into the completion requests (protocol.py)."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: Literal[BACKENDS] | None = None  # type: ignore[valid-type]

    def structured_spec(self) -> StructuredOutputsParams | None:
        """The one constraint the request asks for, or None; a 400 for two at once."""
        found: list[tuple[str, StructuredOutputsParams]] = []
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            found.append(("response_format", StructuredOutputsParams(json_object=True)))
        elif rf is not None and rf.type == "json_schema":
            if rf.json_schema is None:
                raise InvalidRequestError(
                    "response_format of type json_schema needs a json_schema object",
                    "response_format.json_schema",
                )
            schema = rf.json_schema.schema_ or {"type": "object"}
            schema = closed(schema) if rf.json_schema.strict else schema
            found.append(("response_format", StructuredOutputsParams(json=schema)))
        so = self.structured_outputs
        if so is not None:
            found.append(("structured_outputs", _spec("structured_outputs", _vllm_fields(so))))
        guided = {
            "json": self.guided_json,
            "regex": self.guided_regex,
            "choice": self.guided_choice,
            "grammar": self.guided_grammar,
        }
        for kind, value in guided.items():
            if value is not None:
                found.append((f"guided_{kind}", _spec(f"guided_{kind}", {kind: value})))
        if len(found) > 1:
            names = ", ".join(name for name, _ in found)
            raise InvalidRequestError(
                f"Only one output constraint may be given; this request has {names}",
                found[1][0],
            )
        if not found:
            return None
        source, spec = found[0]
        spec.source = source
        return spec

    def json_answer(self) -> Schema | None:
        """The constraint as the JSON schema an answer beside tool calls follows (None: no
        constraint); a 400 for one that is not JSON, which a call could not sit beside."""
        spec = StructuredFields.structured_spec(self)
        if spec is None:
            return None
        if spec.kind == "json_object":
            return {"type": "object"}
        if spec.kind == "json":
            return _schema_object(spec.json, spec.source)
        raise InvalidRequestError(
            f"tool calls can be combined with a JSON response format only, not a {spec.kind} "
            f"constraint ({spec.source})",
            spec.source,
        )


def _vllm_fields(so: StructuredOutputsField) -> dict[str, Any]:
    """vLLM's object as the spec's fields, its JSON switches applied to the schema."""
    fields: dict[str, Any] = {
        "json": so.json_,
        "regex": so.regex,
        "choice": so.choice,
        "grammar": so.grammar,
        "json_object": bool(so.json_object),
    }
    switches = so.whitespace_pattern is not None or so.disable_additional_properties
    if not switches:
        return fields
    if so.json_ is None and not so.json_object:
        raise InvalidRequestError(
            "whitespace_pattern and disable_additional_properties shape JSON: they need json "
            "or json_object",
            "structured_outputs",
        )
    schema = _schema_object(so.json_, "structured_outputs") if so.json_ is not None else None
    schema = schema if schema is not None else {"type": "object"}
    if so.disable_additional_properties:
        schema = closed(schema)
    if so.whitespace_pattern is not None:
        if so.disable_any_whitespace:
            raise InvalidRequestError(
                "whitespace_pattern and disable_any_whitespace contradict each other",
                "structured_outputs.whitespace_pattern",
            )
        style = {"whitespace_flexible": True, "whitespace_pattern": so.whitespace_pattern}
        schema = styled(schema, {**style, "item_separator": ",", "key_separator": ":"})
    return {**fields, "json": schema, "json_object": False}


def _schema_object(schema: dict[str, Any] | str, param: str) -> Schema:
    """A JSON schema sent as an object or as JSON text, as an object."""
    if isinstance(schema, dict):
        return schema
    try:
        value = json.loads(schema)
    except ValueError:
        raise InvalidRequestError("The JSON schema is not valid JSON", param) from None
    if not isinstance(value, dict):
        raise InvalidRequestError("The JSON schema must be a JSON object", param)
    return value


def _spec(param: str, fields: dict[str, Any]) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(**fields)
    except InvalidRequestError as exc:
        raise InvalidRequestError(str(exc), param) from exc
